/* `ferry _target`: the passive side of `ferry demo` and `ferry bench`.
 * Opens an engine, registers one memfd region, listens with a plain TCP
 * sink for socket baselines, prints "READY <region desc hex> <sink port>",
 * and answers commands on stdin until "quit" or EOF. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"

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

static void usage_target(FILE *f)
{
    fprintf(f, "usage: ferry _target [--size SIZE] [--listen HOST:PORT]\n"
               "\n"
               "The passive side of `ferry demo engine` and `ferry bench engine`, started by them:\n"
               "an engine with one registered region and a plain TCP sink, driven over stdin.\n"
               "\n"
               "  --size SIZE         the region's bytes (default 64M)\n"
               "  --listen HOST:PORT  the engine's address (default 127.0.0.1:0)\n");
}

int cli_target_main(int argc, char **argv)
{
    uint64_t size = 64ull << 20;
    const char *listen = "127.0.0.1:0";
    cli_getopt g;
    cli_getopt_init(&g, "_target", argc, argv, "size=,listen=");
    int pr = 0;
    while (pr == 0 && cli_getopt_next(&g)) {
        if (cli_getopt_is(&g, "--size"))
            pr = cli_opt_size(g.opt, g.val, 1, 1ull << 40, &size);
        else if (cli_getopt_is(&g, "--listen"))
            listen = g.val;
        else
            pr = cli_getopt_unhandled(&g);
    }
    if (pr == 0)
        pr = cli_getopt_end(&g, 0);
    if (pr != 0)
        return cli_usage_exit(pr, usage_target);
    ferry_engine_config cfg;
    int rc = ferry_engine_config_init(&cfg);
    snprintf(cfg.listen_addr, sizeof cfg.listen_addr, "%s", listen);
    ferry_engine *e = NULL;
    if (rc == 0)
        rc = ferry_engine_open(&cfg, &e);
    void *mem = NULL;
    ferry_region *r = NULL;
    if (rc == 0)
        rc = ferry_mem_alloc(e, size, &mem);
    if (rc == 0)
        rc = ferry_region_register(e, mem, size, FERRY_REMOTE_RW, FERRY_MEM_HOST, &r);
    unsigned port = 0;
    int lfd = rc == 0 ? open_sink(&port) : -1;
    uint8_t d[FERRY_DESC_MAX];
    int dn = rc == 0 ? ferry_region_export(r, d, sizeof d) : rc;
    if (rc < 0 || lfd < 0 || dn < 0) {
        printf("FAIL %s\n", ferry_strerror(rc < 0 ? rc : dn < 0 ? dn : FERRY_EIO));
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
            int w = ferry_wait_notify(e, tag, (uint32_t)count, 60000, NULL);
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
