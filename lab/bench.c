/* `ferry-lab bench engine`: WRITE and READ throughput between two processes,
 * with the baseline measured in the same run: for shm a single-threaded
 * memcpy between two pre-touched buffers; for tcp a plain blocking
 * send/recv loop over the same number of loopback connections. With
 * --rows: a strided transfer (rows of --row bytes, --stride apart at the
 * target, packed here) as one strided op against its baseline, the same
 * rows as one plain op each. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lab.h"
#include "cli_opts.h"

typedef struct bench_opts {
    const char *transport;
    uint64_t blocks[8];
    int nblocks;
    uint64_t total;
    unsigned streams, threads, reps;
    uint64_t rows, row, stride;   /* rows > 0: the strided comparison only */
    bool json;
} bench_opts;

typedef struct bench_ctx {
    bench_opts o;
    ferry_engine *e;
    cli_target tgt;
    ferry_remote_region rr;
    uint8_t *buf, *buf2;
    ferry_region *lr;
} bench_ctx;

int cli_engine_blocks(uint64_t *blocks, int *nblocks, uint64_t total)
{
    if (*nblocks == 0) {
        blocks[0] = 64 << 10;
        blocks[1] = 1 << 20;
        blocks[2] = 4 << 20;
        *nblocks = 3;
    }
    for (int i = 0; i < *nblocks; i++)
        if (blocks[i] > total) {
            fprintf(stderr, "ferry-lab bench engine: a --block is larger than --total\n");
            return -1;
        }
    return 0;
}

double cli_engine_pass(ferry_engine *e, enum ferry_opcode op, uint8_t *buf,
                       const ferry_remote_region *rr, uint64_t block, uint64_t total)
{
    return cli_engine_pass_at(e, op, buf, rr, block, total, false);
}

/* One timed pass: total bytes as block-sized ops, many tickets in flight. */
double cli_engine_pass_at(ferry_engine *e, enum ferry_opcode op, uint8_t *buf,
                          const ferry_remote_region *rr, uint64_t block, uint64_t total, bool same_block)
{
    uint64_t nops = total / block;
    uint64_t per = 64ull << 20;            /* bytes per ticket */
    uint64_t batch = per / block ? per / block : 1;
    if (batch > 1024)
        batch = 1024;
    ferry_op *ops = calloc(batch, sizeof *ops);
    uint64_t ntickets = (nops + batch - 1) / batch;
    ferry_ticket **t = calloc(ntickets, sizeof *t);
    double t0 = cli_now();
    for (uint64_t k = 0; k < ntickets; k++) {
        uint64_t first = k * batch, n = nops - first < batch ? nops - first : batch;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t off = same_block ? 0 : (first + i) * block;
            ops[i] = (ferry_op){.opcode = op, .local = buf + off, .len = block, .peer = rr->peer,
                                .remote_addr = rr->addr + off, .key = rr->key};
        }
        if (ferry_submit(e, ops, n, 0, &t[k], NULL) < 0) {
            ntickets = k;
            break;
        }
    }
    bool ok = true;
    for (uint64_t k = 0; k < ntickets; k++) {
        ok &= ferry_ticket_wait(t[k], -1) == FERRY_TICKET_COMPLETED;
        ferry_ticket_free(t[k]);
    }
    double dt = cli_now() - t0;
    free(ops);
    free(t);
    return ok ? (double)(nops * block) / dt / 1e9 : 0;
}

static double engine_pass(bench_ctx *c, enum ferry_opcode op, uint64_t block, uint64_t total)
{
    return cli_engine_pass(c->e, op, c->buf, &c->rr, block, total);
}

static double memcpy_pass(bench_ctx *c, uint64_t block, uint64_t total)
{
    double t0 = cli_now();
    for (uint64_t off = 0; off + block <= total; off += block)
        memcpy(c->buf2 + off, c->buf + off, block);
    double dt = cli_now() - t0;
    /* keep the copy observable so it cannot be elided */
    volatile uint8_t sink = c->buf2[total / 2];
    (void)sink;
    return (double)(total / block * block) / dt / 1e9;
}

typedef struct send_job {
    unsigned port;
    const uint8_t *buf;
    uint64_t bytes, block;
    bool ok;
    pthread_t th;
} send_job;

static void *send_main(void *arg)
{
    send_job *j = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)j->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    j->ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    for (uint64_t sent = 0; j->ok && sent < j->bytes;) {
        uint64_t n = j->bytes - sent < j->block ? j->bytes - sent : j->block;
        ssize_t w = send(fd, j->buf + sent, n, MSG_NOSIGNAL);
        j->ok = w > 0;
        sent += w > 0 ? (uint64_t)w : 0;
    }
    char ack;
    j->ok = j->ok && read(fd, &ack, 1) == 1;
    close(fd);
    return NULL;
}

static double socket_pass(bench_ctx *c, uint64_t block, uint64_t total)
{
    unsigned n = c->o.streams;
    if (cli_target_cmd(&c->tgt, NULL, 0, "sink %u %llu %llu", n, (unsigned long long)total,
                       (unsigned long long)block) < 0)
        return 0;
    send_job j[64];
    double t0 = cli_now();
    for (unsigned i = 0; i < n; i++) {
        /* stream i sends its own slice of the buffer: the bytes the engine moves */
        j[i] = (send_job){.port = c->tgt.sink_port, .buf = c->buf + i * (total / n), .block = block,
                          .bytes = total / n + (i == n - 1 ? total % n : 0)};
        pthread_create(&j[i].th, NULL, send_main, &j[i]);
    }
    bool ok = true;
    for (unsigned i = 0; i < n; i++) {
        pthread_join(j[i].th, NULL);
        ok &= j[i].ok;
    }
    double dt = cli_now() - t0;
    cli_target_cmd(&c->tgt, NULL, 0, "sinkjoin");
    return ok ? (double)total / dt / 1e9 : 0;
}

static double best(double (*f)(bench_ctx *, uint64_t, uint64_t), bench_ctx *c, uint64_t block, uint64_t total)
{
    double b = 0;
    for (unsigned r = 0; r < c->o.reps; r++) {
        double v = f(c, block, total);
        b = v > b ? v : b;
    }
    return b;
}

static double best_engine(bench_ctx *c, enum ferry_opcode op, uint64_t block, uint64_t total)
{
    double b = 0;
    for (unsigned r = 0; r < c->o.reps; r++) {
        double v = engine_pass(c, op, block, total);
        b = v > b ? v : b;
    }
    return b;
}

/* 4 KiB writes per second, with the in-flight window kept full. */
static double small_ops(bench_ctx *c)
{
    enum { BATCH = 64, NT = 64 };
    uint64_t total_ops = 0, span = c->o.total / 4096;
    ferry_ticket *ring[NT] = {0};
    ferry_op ops[BATCH];
    double t0 = cli_now();
    uint64_t k = 0;
    while (cli_now() - t0 < 1.0) {
        ferry_ticket **slot = &ring[k % NT];
        if (*slot) {
            ferry_ticket_wait(*slot, -1);
            ferry_ticket_free(*slot);
            *slot = NULL;
        }
        for (int i = 0; i < BATCH; i++) {
            uint64_t off = ((k * BATCH + (uint64_t)i) % span) * 4096;
            ops[i] = (ferry_op){.opcode = FERRY_OP_WRITE, .local = c->buf + off, .len = 4096,
                                .peer = c->rr.peer, .remote_addr = c->rr.addr + off, .key = c->rr.key};
        }
        if (ferry_submit(c->e, ops, BATCH, 0, slot, NULL) < 0)
            break;
        total_ops += BATCH;
        k++;
    }
    for (int i = 0; i < NT; i++) {
        if (ring[i]) {
            ferry_ticket_wait(ring[i], -1);
            ferry_ticket_free(ring[i]);
        }
    }
    return (double)total_ops / (cli_now() - t0);
}

/* One timed pass of the rows, as one strided op or as one plain op per row
 * (what a strided op cost a transport that took no rows), in one batch.
 * Seconds, or 0 when the batch failed. */
static double rows_pass(bench_ctx *c, enum ferry_opcode op, bool strided)
{
    const uint64_t n = strided ? 1 : c->o.rows;
    ferry_op *ops = calloc(n, sizeof *ops);
    ferry_ticket *t;
    if (!ops)
        return 0;
    for (uint64_t i = 0; i < n; i++)
        ops[i] = (ferry_op){.opcode = op, .local = c->buf + i * c->o.row, .len = c->o.row, .peer = c->rr.peer,
                            .remote_addr = c->rr.addr + i * c->o.stride, .key = c->rr.key};
    if (strided) {
        ops[0].count = c->o.rows;
        ops[0].local_stride = c->o.row;
        ops[0].remote_stride = c->o.stride;
    }
    double t0 = cli_now();
    bool ok = ferry_submit(c->e, ops, n, 0, &t, NULL) == 0;
    if (ok) {
        ok = ferry_ticket_wait(t, -1) == FERRY_TICKET_COMPLETED;
        ferry_ticket_free(t);
    }
    double dt = cli_now() - t0;
    free(ops);
    return ok ? dt : 0;
}

/* Fastest of --reps passes; 0 if any failed. */
static double best_rows(bench_ctx *c, enum ferry_opcode op, bool strided)
{
    double b = 0;
    for (unsigned r = 0; r < c->o.reps; r++) {
        double v = rows_pass(c, op, strided);
        if (v == 0)
            return 0;
        b = b == 0 || v < b ? v : b;
    }
    return b;
}

static void bench_rows(bench_ctx *c)
{
    char sz[32], st[32];
    if (c->o.json)
        printf("{\"transport\":\"%s\",\"rows\":%llu,\"row_bytes\":%llu,\"stride\":%llu,\"results\":[",
               c->o.transport, (unsigned long long)c->o.rows, (unsigned long long)c->o.row,
               (unsigned long long)c->o.stride);
    else
        printf("ferry-lab bench engine: transport %s, %llu rows of %s, remote stride %s, best of %u\n"
               "%-6s %14s %14s %8s\n", c->o.transport, (unsigned long long)c->o.rows,
               cli_fmt_size(c->o.row, sz, sizeof sz), cli_fmt_size(c->o.stride, st, sizeof st), c->o.reps,
               "op", "per-row ms", "strided ms", "ratio");
    for (int w = 0; w < 2; w++) {
        enum ferry_opcode op = w == 0 ? FERRY_OP_WRITE : FERRY_OP_READ;
        double rowwise = best_rows(c, op, false), strided = best_rows(c, op, true);
        double ratio = strided > 0 ? rowwise / strided : 0;
        if (c->o.json)
            printf("%s{\"op\":\"%s\",\"per_row_ms\":%.3f,\"strided_ms\":%.3f,\"ratio\":%.2f}", w ? "," : "",
                   w ? "read" : "write", rowwise * 1e3, strided * 1e3, ratio);
        else
            printf("%-6s %14.2f %14.2f %8.2f\n", w ? "read" : "write", rowwise * 1e3, strided * 1e3, ratio);
    }
    if (c->o.json)
        printf("]}\n");
    else
        printf("per-row: the same rows as one plain op each, in one batch; ratio = per-row / strided time\n");
}

int cli_engine_block_add(uint64_t *blocks, int *nblocks, const char *flag, const char *v)
{
    if (*nblocks == 8) {
        fprintf(stderr, "ferry-lab bench engine: at most 8 %s sizes\n", flag);
        return -1;
    }
    return cli_opt_size(flag, v, 1, UINT64_MAX, &blocks[(*nblocks)++]);
}

static int block_each(void *opts, const char *flag, const char *v)
{
    bench_opts *o = opts;
    return cli_engine_block_add(o->blocks, &o->nblocks, flag, v);
}

static const cli_opt engine_table[] = {
    CLI_CHOICE(bench_opts, transport, "transport", "shm|tcp|ucx",
               "the engine's transport (default shm); ucx has its own\n"
               "options: ferry-lab bench engine --transport ucx --help"),
    CLI_LIST("block", "SIZE", block_each, "an op's size, up to 8 of them (default 64K 1M 4M)"),
    CLI_SIZE(bench_opts, total, "total", "SIZE", 1, UINT64_MAX, "bytes per pass (default 1G)"),
    CLI_UINT(bench_opts, streams, "streams", "N", 1, 64, "streams (default 4)"),
    CLI_UINT(bench_opts, threads, "threads", "N", 1, 64, "threads (default 2)"),
    CLI_UINT(bench_opts, reps, "reps", "N", 1, 100000, "passes, the best one reported (default 3)"),
    CLI_UINT(bench_opts, rows, "rows", "N", 1, 1u << 24,
             "the strided comparison only: N rows of --row bytes,\n"
             "--stride apart (default: the block sizes instead)"),
    CLI_SIZE(bench_opts, row, "row", "SIZE", 1, UINT64_MAX, "with --rows: a row's bytes (default 4K)"),
    CLI_SIZE(bench_opts, stride, "stride", "SIZE", 1, UINT64_MAX,
             "with --rows: from one row to the next (default 16K)"),
    CLI_FLAG(bench_opts, json, "json", "one JSON object on stdout (default: a table)"),
};

static const cli_cmd engine_cmd = {
    .name = "bench engine",
    .about = "Engine throughput against a baseline measured in the same run (memcpy for shm,\n"
             "a plain socket loop for tcp).",
    .opts = engine_table,
    .nopts = sizeof engine_table / sizeof engine_table[0],
};

static int parse(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.transport = "shm", .total = 1ull << 30, .streams = 4, .threads = 2, .reps = 3,
                      .row = 4 << 10, .stride = 16 << 10};
    /* argv[0] is "bench", argv[1] "engine" */
    int pr = cli_parse(&engine_cmd, argc - 1, argv + 1, o, NULL, NULL);
    if (pr != 0)
        return pr;
    /* the rows must fit the buffers: packed here, stride apart there */
    uint64_t ext;
    if (o->rows && (__builtin_mul_overflow(o->rows - 1, o->stride, &ext) || o->row > o->total ||
                    ext > o->total - o->row || o->rows * o->row > o->total)) {
        fprintf(stderr, "ferry-lab bench engine: --rows of --row bytes, --stride apart, do not fit in --total\n");
        return -1;
    }
    return cli_engine_blocks(o->blocks, &o->nblocks, o->total);
}

static int setup(bench_ctx *c, const char *self)
{
    if (!getenv("FERRY_TOKEN") && !getenv("FERRY_TOKEN_FILE")) {
        char tok[65];
        ferry_token_generate(tok);   /* a private cluster for this run */
        setenv("FERRY_TOKEN", tok, 1);
    }
    ferry_engine_config cfg;
    int rc = ferry_engine_config_init(&cfg);
    if (rc < 0)
        return rc;
    snprintf(cfg.transport, sizeof cfg.transport, "%s", c->o.transport);
    cfg.tcp_streams = c->o.streams;
    cfg.shm_threads = c->o.threads;
    if ((rc = ferry_engine_open(&cfg, &c->e, NULL)) < 0)
        return rc;
    void *m1, *m2;
    if ((rc = ferry_mem_alloc(c->e, c->o.total, &m1, NULL)) < 0 || (rc = ferry_mem_alloc(c->e, c->o.total, &m2, NULL)) < 0)
        return rc;
    c->buf = m1;
    c->buf2 = m2;
    memset(c->buf, 0x5A, c->o.total);
    if ((rc = ferry_region_register(c->e, c->buf, c->o.total, 0, FERRY_MEM_HOST, &c->lr, NULL)) < 0)
        return rc;
    if ((rc = cli_target_start(&c->tgt, self, c->o.total, NULL)) < 0)
        return rc;
    return ferry_region_import(c->e, c->tgt.desc, c->tgt.desc_len, &c->rr, NULL);
}

/* The throughput table against the baseline, then small ops. */
static void bench_blocks(bench_ctx *c, bool tcp)
{
    if (!c->o.json)
        printf("ferry-lab bench engine: transport %s, %u %s, total %.0f MiB per pass, best of %u\n",
               c->o.transport, tcp ? c->o.streams : c->o.threads, tcp ? "streams" : "copy threads",
               (double)c->o.total / (1 << 20), c->o.reps);
    char js[4096];
    int jn = snprintf(js, sizeof js, "{\"transport\":\"%s\",\"total_bytes\":%llu,\"streams\":%u,\"threads\":%u,\"results\":[",
                      c->o.transport, (unsigned long long)c->o.total, c->o.streams, c->o.threads);
    if (!c->o.json)
        printf("%-6s %10s %12s %14s %8s\n", "op", "block", "ferry GB/s", "baseline GB/s", "ratio");
    for (int b = 0; b < c->o.nblocks; b++) {
        uint64_t blk = c->o.blocks[b];
        double base = tcp ? best(socket_pass, c, blk, c->o.total) : best(memcpy_pass, c, blk, c->o.total);
        for (int w = 0; w < 2; w++) {
            enum ferry_opcode op = w == 0 ? FERRY_OP_WRITE : FERRY_OP_READ;
            double g = best_engine(c, op, blk, c->o.total);
            double ratio = base > 0 ? g / base : 0;
            char sz[32];
            if (!c->o.json)
                printf("%-6s %10s %12.2f %14.2f %8.2f\n", w ? "read" : "write", cli_fmt_size(blk, sz, sizeof sz), g, base, ratio);
            jn += snprintf(js + jn, sizeof js - (size_t)jn,
                           "%s{\"op\":\"%s\",\"block_bytes\":%llu,\"gbps\":%.3f,\"baseline_gbps\":%.3f,\"ratio\":%.3f}",
                           b || w ? "," : "", w ? "read" : "write", (unsigned long long)blk, g, base, ratio);
        }
    }
    double sops = small_ops(c);
    ferry_engine_stats st;
    ferry_engine_get_stats(c->e, &st);
    if (c->o.json)
        printf("%s],\"small_ops_per_s\":%.0f,\"tickets_failed\":%llu}\n", js, sops,
               (unsigned long long)(st.tickets_failed + st.tickets_aborted));
    else
        printf("small ops: %.0f 4 KiB writes/s (window %u ops)\nbaseline: %s\n", sops, 4096,
               tcp ? "plain blocking send/recv loop over the same number of loopback connections"
                   : "single-threaded memcpy between two pre-touched buffers");
}

int cmd_bench_engine_ucx(int argc, char **argv, const char *self);   /* bench_ucx.c */

static int bench_engine(int argc, char **argv, const char *self)
{
    for (int i = 2; i < argc; i++)   /* its own options and baseline */
        if ((i + 1 < argc && !strcmp(argv[i], "--transport") && !strcmp(argv[i + 1], "ucx")) ||
            !strcmp(argv[i], "--transport=ucx"))
            return cmd_bench_engine_ucx(argc, argv, self);
    bench_ctx c = {0};
    int pr = parse(argc, argv, &c.o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &engine_cmd);
    int rc = setup(&c, self);
    if (rc < 0) {
        fprintf(stderr, "ferry-lab bench: setup failed: %s\n", ferry_strerror(rc));
        cli_target_stop(&c.tgt);
        ferry_engine_close(c.e);
        return 1;
    }
    engine_pass(&c, FERRY_OP_WRITE, 1 << 20, c.o.total);   /* warm-up: connections, mappings */
    if (c.o.rows)
        bench_rows(&c);
    else
        bench_blocks(&c, !strcmp(c.o.transport, "tcp"));
    ferry_engine_stats st;
    ferry_engine_get_stats(c.e, &st);
    cli_target_stop(&c.tgt);
    ferry_engine_close(c.e);
    return st.tickets_failed + st.tickets_aborted ? 1 : 0;
}

static void usage_bench(FILE *f)
{
    fprintf(f, "usage: ferry-lab bench engine|plan|store|exec|weights|sparse|cluster [options]\n"
               "       (ferry-lab bench WHAT --help for each one's options)\n");
}

int cmd_bench(int argc, char **argv, const char *self)
{
    if (argc >= 2 && !strcmp(argv[1], "engine"))
        return bench_engine(argc, argv, self);
    if (argc >= 2 && !strcmp(argv[1], "plan"))
        return cmd_bench_plan(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "exec"))
        return cmd_bench_exec(argc - 1, argv + 1, self);
    if (argc >= 2 && !strcmp(argv[1], "store"))
        return cmd_bench_store(argc - 1, argv + 1, self);
    if (argc >= 2 && !strcmp(argv[1], "weights"))
        return cmd_bench_weights(argc - 1, argv + 1, self);
    if (argc >= 2 && !strcmp(argv[1], "sparse"))
        return cmd_bench_sparse(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "cluster"))
        return cmd_bench_cluster(argc - 1, argv + 1, self);
    if (argc < 2)
        fprintf(stderr, "ferry-lab bench: which benchmark?\n");
    else if (!cli_is_help(argv[1]))
        fprintf(stderr, "ferry-lab bench: unknown benchmark '%s'\n", argv[1]);
    return cli_usage_exit(argc >= 2 && cli_is_help(argv[1]) ? CLI_HELP : -1, usage_bench);
}
