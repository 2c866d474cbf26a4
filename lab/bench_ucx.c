/* `ferry-lab bench engine --transport ucx [--tls tcp|shm]`: ferry's WRITE and
 * READ throughput over its ucx transport against `ucx_perftest -t
 * ucp_put_bw` run in the same invocation (server and client on loopback,
 * the same UCX_TLS and block sizes): the baseline is UCX itself moving
 * the same blocks, so the ratio is what ferry's engine costs on top of it.
 * --tls tcp is UCX_TLS=tcp; --tls shm is UCX_TLS=posix,cma,self. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lab.h"
#include "cli_opts.h"

extern char **environ;

typedef struct ucx_opts {
    const char *tls, *ucx_tls;
    uint64_t blocks[8];
    int nblocks;
    uint64_t total;
    unsigned reps;
    bool json;
} ucx_opts;

static int block_each(void *opts, const char *flag, const char *v)
{
    ucx_opts *o = opts;
    return cli_engine_block_add(o->blocks, &o->nblocks, flag, v);
}

static const cli_opt ucx_table[] = {
    CLI_CHOICE(ucx_opts, tls, "tls", "tcp|shm", "UCX_TLS=tcp, or shm: UCX_TLS=posix,cma,self (default tcp)"),
    CLI_LIST("block", "SIZE", block_each, "an op's size, up to 8 of them (default 64K 1M 4M)"),
    CLI_SIZE(ucx_opts, total, "total", "SIZE", 1, UINT64_MAX, "the buffer (default 256M)"),
    CLI_UINT(ucx_opts, reps, "reps", "N", 1, 100000, "passes, the best one reported (default 3)"),
    CLI_FLAG(ucx_opts, json, "json", "one JSON object on stdout (default: a table)"),
};

static const cli_cmd ucx_cmd = {
    .name = "bench engine --transport ucx",
    .about = "Throughput over the ucx transport against ucx_perftest -t ucp_put_bw (loopback,\n"
             "the same UCX_TLS and block sizes) run in the same invocation.",
    .opts = ucx_table,
    .nopts = sizeof ucx_table / sizeof ucx_table[0],
};

static int parse_ucx(int argc, char **argv, ucx_opts *o)
{
    *o = (ucx_opts){.tls = "tcp", .total = 256ull << 20, .reps = 3};
    /* argv[0] is "bench", argv[1] "engine"; --transport ucx (the form's
     * own words, in the usage's name) taken out, any other --transport
     * refused */
    char **args = malloc(((size_t)argc + 1) * sizeof *args);
    if (!args)
        return -1;
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (i > 1 && !strcmp(argv[i], "--transport=ucx"))
            continue;
        if (i > 1 && i + 1 < argc && !strcmp(argv[i], "--transport") && !strcmp(argv[i + 1], "ucx")) {
            i++;
            continue;
        }
        if (i > 1 && (!strcmp(argv[i], "--transport") || !strncmp(argv[i], "--transport=", 12))) {
            if (argv[i][11] != '=' && i + 1 == argc)
                fprintf(stderr, "ferry-lab bench engine: --transport needs a value\n");
            else
                fprintf(stderr, "ferry-lab bench engine: --transport ucx was given, then '%s'\n",
                        argv[i][11] == '=' ? argv[i] + 12 : argv[i + 1]);
            free(args);
            return -1;
        }
        args[n++] = argv[i];
    }
    args[n] = NULL;
    int pr = cli_parse(&ucx_cmd, n, args, o, NULL, NULL);
    free(args);
    if (pr != 0)
        return pr;
    if (cli_engine_blocks(o->blocks, &o->nblocks, o->total) < 0)
        return -1;
    o->ucx_tls = !strcmp(o->tls, "tcp") ? "tcp" : "posix,cma,self";
    return 0;
}

/* A loopback port nobody listens on now (ucx_perftest's own rendezvous). */
static unsigned free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof a;
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &sl) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* One ucx_perftest put bandwidth run; GB/s (10^9 bytes) from its "Final:"
 * line's overall bandwidth (MB/s there is 2^20 bytes), 0 on failure. */
static double perftest_pass(uint64_t block, uint64_t iters)
{
    char s[32], n[32], p[16];
    unsigned port = free_port();
    snprintf(s, sizeof s, "%llu", (unsigned long long)block);
    snprintf(n, sizeof n, "%llu", (unsigned long long)iters);
    snprintf(p, sizeof p, "%u", port);
    char *srv_argv[] = {"ucx_perftest", "-t", "ucp_put_bw", "-s", s, "-n", n, "-p", p, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", 1, 0);
    pid_t srv;
    int rc = posix_spawnp(&srv, "ucx_perftest", &fa, NULL, srv_argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "ferry-lab bench: cannot run ucx_perftest (apt-get install ucx-utils)\n");
        return 0;
    }
    /* The client until it reaches the server (which takes its first
     * connection as the client: no probing), by a deadline. Each client
     * run is bounded too (coreutils' timeout): a client whose server died
     * mid-run would otherwise wait for it forever. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "timeout 120 ucx_perftest 127.0.0.1 -t ucp_put_bw -s %s -n %s -p %s 2>&1", s, n, p);
    double mbps = 0, t0 = cli_now();
    int st;
    while (mbps == 0 && cli_now() - t0 < 30 && waitpid(srv, &st, WNOHANG) == 0) {
        FILE *f = popen(cmd, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            double it, l1, l2, l3, bw_avg, bw_all;
            if (sscanf(line, "Final: %lf %lf %lf %lf %lf %lf", &it, &l1, &l2, &l3, &bw_avg, &bw_all) == 6)
                mbps = bw_all;
        }
        if (f)
            pclose(f);
        if (mbps == 0)
            usleep(50000);
    }
    t0 = cli_now();
    while (waitpid(srv, &st, WNOHANG) == 0) {
        if (cli_now() - t0 > 30) {
            kill(srv, SIGKILL);
            waitpid(srv, &st, 0);
            break;
        }
        usleep(10000);
    }
    return mbps * (1 << 20) / 1e9;
}

static double best_of(unsigned reps, double (*f)(void *, uint64_t), void *arg, uint64_t blk)
{
    double b = 0;
    for (unsigned r = 0; r < reps; r++) {
        double v = f(arg, blk);
        b = v > b ? v : b;
    }
    return b;
}

typedef struct ucx_ctx {
    ucx_opts o;
    ferry_engine *e;
    cli_target tgt;
    ferry_remote_region rr;
    uint8_t *buf;
    ferry_region *lr;
    enum ferry_opcode op;
    bool same;   /* the baseline's pattern: one block, again and again */
} ucx_ctx;

static double perf_fn(void *arg, uint64_t blk)
{
    ucx_ctx *c = arg;
    uint64_t iters = c->o.total / blk;
    return perftest_pass(blk, iters < 32 ? 32 : iters);
}

static double engine_fn(void *arg, uint64_t blk)
{
    ucx_ctx *c = arg;
    return cli_engine_pass_at(c->e, c->op, c->buf, &c->rr, blk, c->o.total, c->same);
}

static int setup_ucx(ucx_ctx *c, const char *self)
{
    if (!getenv("FERRY_TOKEN") && !getenv("FERRY_TOKEN_FILE")) {
        char tok[65];
        ferry_token_generate(tok);
        setenv("FERRY_TOKEN", tok, 1);
    }
    /* the target process and ucx_perftest inherit both */
    setenv("UCX_TLS", c->o.ucx_tls, 1);
    setenv("FERRY_TRANSPORT", "ucx", 1);
    ferry_engine_config cfg;
    int rc = ferry_engine_config_init(&cfg);
    if (rc < 0 || (rc = ferry_engine_open(&cfg, &c->e, NULL)) < 0)
        return rc;
    void *m;
    if ((rc = ferry_mem_alloc(c->e, c->o.total, &m, NULL)) < 0)
        return rc;
    c->buf = m;
    memset(c->buf, 0x5A, c->o.total);
    if ((rc = ferry_region_register(c->e, c->buf, c->o.total, 0, FERRY_MEM_HOST, &c->lr, NULL)) < 0)
        return rc;
    if ((rc = cli_target_start(&c->tgt, self, c->o.total, NULL)) < 0)
        return rc;
    return ferry_region_import(c->e, c->tgt.desc, c->tgt.desc_len, &c->rr, NULL);
}

static void run_blocks(ucx_ctx *c)
{
    char js[4096];
    int jn = snprintf(js, sizeof js, "{\"transport\":\"ucx\",\"tls\":\"%s\",\"ucx_tls\":\"%s\",\"total_bytes\":%llu,"
                      "\"baseline\":\"ucx_perftest -t ucp_put_bw\",\"results\":[",
                      c->o.tls, c->o.ucx_tls, (unsigned long long)c->o.total);
    if (!c->o.json)
        printf("ferry-lab bench engine: transport ucx, UCX_TLS=%s, %.0f MiB per pass, best of %u\n"
               "%-6s %10s %12s %14s %8s %14s\n", c->o.ucx_tls, (double)c->o.total / (1 << 20), c->o.reps,
               "op", "block", "ferry GB/s", "baseline GB/s", "ratio", "spread GB/s");
    for (int b = 0; b < c->o.nblocks; b++) {
        uint64_t blk = c->o.blocks[b];
        double base = best_of(c->o.reps, perf_fn, c, blk);
        for (int w = 0; w < 2; w++) {
            c->op = w == 0 ? FERRY_OP_WRITE : FERRY_OP_READ;
            c->same = true;   /* the ratio: ucx_perftest's pattern */
            double g = best_of(c->o.reps, engine_fn, c, blk);
            c->same = false;  /* and across the whole buffer, as a transfer moves */
            double spread = best_of(c->o.reps, engine_fn, c, blk);
            double ratio = base > 0 ? g / base : 0;
            char sz[32];
            if (!c->o.json)
                printf("%-6s %10s %12.2f %14.2f %8.2f %14.2f\n", w ? "read" : "write",
                       cli_fmt_size(blk, sz, sizeof sz), g, base, ratio, spread);
            jn += snprintf(js + jn, sizeof js - (size_t)jn,
                           "%s{\"op\":\"%s\",\"block_bytes\":%llu,\"gbps\":%.3f,\"baseline_gbps\":%.3f,"
                           "\"ratio\":%.3f,\"spread_gbps\":%.3f}",
                           b || w ? "," : "", w ? "read" : "write", (unsigned long long)blk, g, base, ratio,
                           spread);
        }
    }
    ferry_engine_stats st;
    ferry_engine_get_stats(c->e, &st);
    if (c->o.json)
        printf("%s],\"tickets_failed\":%llu}\n", js, (unsigned long long)(st.tickets_failed + st.tickets_aborted));
    else
        printf("baseline: ucx_perftest -t ucp_put_bw, server and client on loopback, same UCX_TLS and block;\n"
               "ferry GB/s in its pattern (one block put to one remote block, again and again), spread GB/s\n"
               "with each op at the next block of the %.0f MiB buffer\n", (double)c->o.total / (1 << 20));
}

int cmd_bench_engine_ucx(int argc, char **argv, const char *self)
{
    ucx_ctx c = {0};
    int pr = parse_ucx(argc, argv, &c.o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &ucx_cmd);
    int rc = setup_ucx(&c, self);
    if (rc < 0) {
        fprintf(stderr, "ferry-lab bench: setup failed: %s\n", ferry_strerror(rc));
        cli_target_stop(&c.tgt);
        ferry_engine_close(c.e);
        return 1;
    }
    cli_engine_pass(c.e, FERRY_OP_WRITE, c.buf, &c.rr, 1 << 20, c.o.total);   /* warm-up */
    run_blocks(&c);
    ferry_engine_stats st;
    ferry_engine_get_stats(c.e, &st);
    cli_target_stop(&c.tgt);
    ferry_engine_close(c.e);
    return st.tickets_failed + st.tickets_aborted ? 1 : 0;
}
