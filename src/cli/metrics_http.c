/* The /metrics endpoint over libmicrohttpd (metrics_http.h).
 *
 * One internal thread (epoll) serves every connection, so a scraper that
 * reads slowly or never sends the rest of its request holds a descriptor,
 * not a thread; connections are capped, idle ones closed after a timeout,
 * and a request's headers bounded by a memory limit. Only GET and HEAD of
 * /metrics are answered with the page; anything else gets 404 or 405, and
 * whatever arrives never reaches the master: the page is a copy of the
 * master's published snapshot.
 *
 * ferry does not link libmicrohttpd (nor, through it, gnutls): the first
 * cli_metrics_start loads it, so that every other command starts without
 * paying for either. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"
#include "metrics_http.h"

#define CONN_LIMIT 64          /* connections at once */
#define CONN_TIMEOUT_S 10      /* an idle or slow connection is closed after this */
#define CONN_MEMORY (64 << 10) /* bytes of request (headers) per connection */

#define MHD_LIBRARY "libmicrohttpd.so.12"

/* The functions of libmicrohttpd used here, resolved by load_mhd. */
#define MHD_FUNCS(X) \
    X(MHD_add_response_header) X(MHD_create_response_from_buffer) X(MHD_destroy_response) \
    X(MHD_queue_response) X(MHD_start_daemon) X(MHD_stop_daemon)

static struct {
#define MHD_SLOT(f) __typeof__(f) *f;
    MHD_FUNCS(MHD_SLOT)
#undef MHD_SLOT
} mhd;
static bool mhd_ok;            /* loaded */
static char mhd_error[256];    /* else why not */

static void load_mhd(void)
{
    void *h = dlopen(MHD_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(mhd_error, sizeof mhd_error, "cannot load %s (install libmicrohttpd12): %s", MHD_LIBRARY,
                 dlerror());
        return;
    }
#define MHD_RESOLVE(f)                                                                     \
    {                                                                                      \
        void *sym = dlsym(h, #f);                                                          \
        if (sym == NULL) {                                                                 \
            snprintf(mhd_error, sizeof mhd_error, "%s has no %s", MHD_LIBRARY, #f);        \
            return;                                                                        \
        }                                                                                  \
        memcpy(&mhd.f, &sym, sizeof sym); /* ISO C has no cast from void * to a function */ \
    }
    MHD_FUNCS(MHD_RESOLVE)
#undef MHD_RESOLVE
    mhd_ok = true;
}

/* 0 once libmicrohttpd is loaded (once per process), or -1 after a line on
 * stderr naming cmd and the library. */
static int mhd_loaded(const char *cmd)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, load_mhd);
    if (mhd_ok)
        return 0;
    fprintf(stderr, "ferry %s: --metrics: %s\n", cmd, mhd_error);
    return -1;
}

struct cli_metrics {
    struct MHD_Daemon *d;
    int fd;
    cli_metrics_fn fn;
    void *arg;
    char addr[64];
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type,
                             const char *body, size_t len, bool allow)
{
    struct MHD_Response *r = mhd.MHD_create_response_from_buffer(len, (void *)body,
                                                                 MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    mhd.MHD_add_response_header(r, "Content-Type", type);
    if (allow)
        mhd.MHD_add_response_header(r, "Allow", "GET, HEAD");
    enum MHD_Result rc = mhd.MHD_queue_response(c, code, r);
    mhd.MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **state)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)state;
    cli_metrics *h = cls;
    static const char text[] = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static const char msg[] = "only GET and HEAD\n";
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, msg, sizeof msg - 1, true);
    }
    if (strcmp(url, "/metrics") != 0) {
        static const char msg[] = "not found: the metrics are at /metrics\n";
        return reply(c, MHD_HTTP_NOT_FOUND, text, msg, sizeof msg - 1, false);
    }
    char *page = NULL;
    int rc = h->fn(h->arg, &page);
    if (rc < 0) {
        char msg[160];
        int n = snprintf(msg, sizeof msg, "metrics not available now: %s\n", ferry_strerror(rc));
        return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, text, msg, (size_t)n, false);
    }
    enum MHD_Result r = reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", page,
                              strlen(page), false);
    ferry_store_free(page);
    return r;
}

static int parse_addr(const char *s, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= sizeof host)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    uint64_t port;
    if (cli_parse_uint(colon + 1, &port) < 0 || port > 65535)
        return -1;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (host[0] == 0 || !strcmp(host, "*"))
        sa->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (!strcmp(host, "localhost"))
        sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return -1;
    return 0;
}

int cli_metrics_start(const char *cmd, const char *addr, cli_metrics_fn fn, void *arg,
                      cli_metrics **out)
{
    *out = NULL;
    struct sockaddr_in sa;
    if (parse_addr(addr, &sa) < 0) {
        fprintf(stderr, "ferry %s: --metrics wants HOST:PORT (IPv4, port 0: any free one), "
                "not '%s'\n", cmd, addr);
        return -1;
    }
    if (mhd_loaded(cmd) < 0)
        return -1;
    cli_metrics *h = calloc(1, sizeof *h);
    if (h == NULL)
        return -1;
    h->fn = fn;
    h->arg = arg;
    h->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (h->fd >= 0)
        setsockopt(h->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (h->fd < 0 || bind(h->fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        listen(h->fd, 64) < 0) {
        fprintf(stderr, "ferry %s: cannot serve metrics on %s: %s\n", cmd, addr, strerror(errno));
        if (h->fd >= 0)
            close(h->fd);
        free(h);
        return -1;
    }
    socklen_t sl = sizeof sa;
    getsockname(h->fd, (struct sockaddr *)&sa, &sl);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(h->addr, sizeof h->addr, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
    h->d = mhd.MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD, 0, NULL, NULL, on_request, h,
                                MHD_OPTION_LISTEN_SOCKET, h->fd,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_LIMIT,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S,
                                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY,
                                MHD_OPTION_END);
    if (h->d == NULL) {
        /* Whether MHD closed the socket it was given is not documented:
         * leave it rather than risk closing a descriptor twice. */
        fprintf(stderr, "ferry %s: cannot start the metrics server on %s\n", cmd, h->addr);
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

const char *cli_metrics_address(const cli_metrics *h)
{
    return h->addr;
}

void cli_metrics_stop(cli_metrics *h)
{
    if (h == NULL)
        return;
    mhd.MHD_stop_daemon(h->d);   /* joins its thread and closes the listening socket */
    free(h);
}

int cli_metrics_write_file(const cli_metrics *h, const char *path)
{
    char text[96];
    snprintf(text, sizeof text, "http://%s/metrics\n", h->addr);
    return cli_write_file_atomic(path, text);
}
