/* `ferry-lab worker target`: the passive side of `ferry-lab demo` and `ferry-lab bench`.
 * Opens an engine, registers one memfd region, listens with a plain TCP
 * sink for socket baselines, prints "READY <region desc hex> <sink port>",
 * and answers commands on stdin until "quit" or EOF. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lab.h"
#include "cli_opts.h"

typedef struct sink_job {
    int lfd;
    uint8_t *mem;              /* this connection's slice of the region */
    uint64_t memlen, bytes, block;
    pthread_t th;
} sink_job;

/* One plain blocking connection: receive `bytes` in `block` recv calls,
 * then answer one byte so the sender can stop its clock. */
static void *sink_main(void *arg)
{
    sink_job *j = arg;
    int fd = accept(j->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t got = 0, off = 0;
    while (got < j->bytes) {
        uint64_t want = j->bytes - got < j->block ? j->bytes - got : j->block;
        if (off + want > j->memlen)
            off = 0;
        ssize_t r = recv(fd, j->mem + off, want, MSG_WAITALL);
        if (r <= 0)
            break;
        got += (uint64_t)r;
        off += (uint64_t)r;
    }
    char ack = 1;
    if (write(fd, &ack, 1) != 1)
        got = 0;
    close(fd);
    return NULL;
}

static int open_sink(unsigned *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) < 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

typedef struct target_opts {
    uint64_t size;
    char listen[64];
} target_opts;

static const cli_opt target_table[] = {
    CLI_SIZE(target_opts, size, "size", "SIZE", 1, 1ull << 40, "the region's bytes (default 64M)"),
    CLI_STR(target_opts, listen, "listen", "HOST:PORT", "the engine's address (default 127.0.0.1:0)"),
};

static const cli_cmd target_cmd = {
    .name = "worker target",
    .about = "The passive side of `ferry-lab demo engine` and `ferry-lab bench engine`, started by them:\n"
             "an engine with one registered region and a plain TCP sink, driven over stdin.",
    .opts = target_table,
    .nopts = sizeof target_table / sizeof target_table[0],
};

int cli_target_main(int argc, char **argv)
{
    target_opts o = { .size = 64ull << 20, .listen = "127.0.0.1:0" };
    int pr = cli_parse(&target_cmd, argc, argv, &o, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &target_cmd);
    uint64_t size = o.size;
    const char *listen = o.listen;
    ferry_engine_config cfg;
    int rc = ferry_engine_config_init(&cfg);
    snprintf(cfg.listen_addr, sizeof cfg.listen_addr, "%s", listen);
    ferry_engine *e = NULL;
    ferry_error err = {0};
    if (rc == 0)
        rc = ferry_engine_open(&cfg, &e, &err);
    void *mem = NULL;
    ferry_region *r = NULL;
    if (rc == 0)
        rc = ferry_mem_alloc(e, size, &mem, &err);
    if (rc == 0)
        rc = ferry_region_register(e, mem, size, FERRY_REMOTE_RW, FERRY_MEM_HOST, &r, &err);
    unsigned port = 0;
    int lfd = rc == 0 ? open_sink(&port) : -1;
    uint8_t d[FERRY_DESC_MAX];
    int dn = rc == 0 ? ferry_region_export(r, d, sizeof d) : rc;
    if (rc < 0 || lfd < 0 || dn < 0) {
        printf("FAIL %s\n", err.code ? err.msg : ferry_strerror(rc < 0 ? rc : dn < 0 ? dn : FERRY_EIO));
        fflush(stdout);
        ferry_engine_close(e);
        return 1;
    }
    char hex[2 * FERRY_DESC_MAX + 1];
    cli_hex(d, (size_t)dn, hex);
    printf("READY %s %u\n", hex, port);
    fflush(stdout);

    sink_job jobs[64];
    unsigned njobs = 0;
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long n, bytes, block, tag, count;
        if (!strncmp(line, "quit", 4))
            break;
        if (sscanf(line, "sink %llu %llu %llu", &n, &bytes, &block) == 3 && n > 0 && n <= 64) {
            /* Connection i lands in its own slice of the region, as the
             * engine's chunks do: the same bytes, the same memory. */
            uint64_t slice = size / n;
            for (njobs = 0; njobs < n; njobs++) {
                jobs[njobs] = (sink_job){.lfd = lfd, .mem = (uint8_t *)mem + njobs * slice,
                                         .memlen = njobs == n - 1 ? size - njobs * slice : slice,
                                         .bytes = bytes / n + (njobs == n - 1 ? bytes % n : 0), .block = block};
                pthread_create(&jobs[njobs].th, NULL, sink_main, &jobs[njobs]);
            }
            printf("OK\n");
        } else if (!strncmp(line, "sinkjoin", 8)) {
            for (unsigned i = 0; i < njobs; i++)
                pthread_join(jobs[i].th, NULL);
            njobs = 0;
            printf("OK\n");
        } else if (sscanf(line, "waitnotify %llu %llu", &tag, &count) == 2) {
            int w = ferry_wait_notify(e, tag, (uint32_t)count, FERRY_DEFAULT_TIMEOUT_MS, NULL, NULL);
            printf(w == 0 ? "OK\n" : "ERR %s\n", ferry_strerror(w));
        } else {
            printf("ERR unknown command\n");
        }
        fflush(stdout);
    }
    for (unsigned i = 0; i < njobs; i++)
        pthread_join(jobs[i].th, NULL);
    close(lfd);
    ferry_engine_close(e);
    return 0;
}

/* ---- the parent's side -------------------------------------------------- */

int cli_target_start(cli_target *t, const char *self, uint64_t size, const char *listen)
{
    memset(t, 0, sizeof *t);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return FERRY_EIO;
    char sz[32];
    snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
    pid_t pid = fork();
    if (pid < 0)
        return FERRY_EIO;
    if (pid == 0) {
        /* a demo's parent blocks these for its signal thread; exec keeps the mask */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        (void)self;
        const char *args[] = { "ferry-lab", "worker", "target", "--size", sz, "--listen",
                               listen ? listen : "127.0.0.1:0", NULL };
        lab_exec_self(args);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    t->pid = pid;
    t->in = fdopen(in[1], "w");
    t->out = fdopen(out[0], "r");
    char line[1024];
    if (!fgets(line, sizeof line, t->out) || strncmp(line, "READY ", 6) != 0) {
        fprintf(stderr, "ferry-lab: target process failed to start%s%s", line[0] ? ": " : "\n", line);
        cli_target_stop(t);
        return FERRY_EIO;
    }
    char *sp = strchr(line + 6, ' ');
    t->desc_len = cli_unhex(line + 6, t->desc, sizeof t->desc);
    t->sink_port = sp ? (unsigned)strtoul(sp + 1, NULL, 10) : 0;
    return 0;
}

int cli_target_cmd(cli_target *t, char *reply, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->in, fmt, ap);
    va_end(ap);
    fputc('\n', t->in);
    fflush(t->in);
    char tmp[256];
    if (!reply) {
        reply = tmp;
        cap = sizeof tmp;
    }
    if (!fgets(reply, (int)cap, t->out))
        return -1;
    reply[strcspn(reply, "\n")] = 0;
    return strncmp(reply, "OK", 2) == 0 ? 0 : -1;
}

void cli_target_stop(cli_target *t)
{
    if (t->in) {
        fputs("quit\n", t->in);
        fclose(t->in);
    }
    if (t->out)
        fclose(t->out);
    if (t->pid > 0) {
        int st;
        /* The child exits on "quit" or on EOF of its stdin; reap it. */
        waitpid(t->pid, &st, 0);
    }
    memset(t, 0, sizeof *t);
}
