/* The plain-socket baselines of `ferry-lab bench cluster` (docs/lab.md):
 * what users write without ferry, run by the same trainer and rollout
 * processes as the ferry strategies, over the same links.
 *   p2p:   each trainer rank connects to every rollout worker and sends it
 *          exactly the rows of its own FSDP shards that the worker's TP
 *          shards hold (no store, no rank-0 funnel);
 *   bcast: trainer rank 0 gathers every rank's shards, then sends every
 *          rollout worker its TP shards.
 * A stream is a sequence of items: a header (tensor, first row, rows; three
 * little-endian u64) and the rows' bytes. Senders write to all their
 * connections at once (non-blocking, poll), so the links, not the order
 * of the sends, decide; receivers take the bytes straight into the
 * destination buffers. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lab.h"
#include "demo.h"

#define XFER_HDR 24
#define XFER_WRITE (1u << 20)      /* at most this much per write call */
#define XFER_DEADLINE_S 600.0      /* a stream that has not finished by then failed */

int demo_xfer_listen(const char *addr, unsigned *port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    socklen_t sl = sizeof sa;
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return -1;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 64) < 0 ||
        getsockname(l, (struct sockaddr *)&sa, &sl) < 0) {
        if (l >= 0)
            close(l);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return l;
}

static int connect_to(const char *hostport)
{
    char host[64];
    unsigned port = 0;
    if (sscanf(hostport, "%63[^:]:%u", host, &port) != 2)
        return -1;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -1;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(s);
        return -1;
    }
    return s;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

typedef struct out_conn {
    int fd;
    const demo_xfer_item *items;
    size_t n, at;                  /* the item being sent */
    uint8_t hdr[XFER_HDR];
    uint64_t sent;                 /* of the item: header, then data */
} out_conn;

int demo_xfer_send(const char *const *peers, const demo_xfer_item *const *items,
                   const size_t *nitems, size_t npeers, uint64_t *bytes)
{
    out_conn *c = calloc(npeers ? npeers : 1, sizeof *c);
    struct pollfd *pf = calloc(npeers ? npeers : 1, sizeof *pf);
    int rc = c && pf ? 0 : -1;
    size_t open_n = 0;
    *bytes = 0;
    for (size_t i = 0; rc == 0 && i < npeers; i++) {
        c[i] = (out_conn){ .fd = connect_to(peers[i]), .items = items[i], .n = nitems[i] };
        if (c[i].fd < 0 || fcntl(c[i].fd, F_SETFL, O_NONBLOCK) < 0) {
            rc = -1;
        } else if (c[i].n == 0) {   /* nothing for this peer: an empty stream says so */
            close(c[i].fd);
            c[i].fd = -1;
        } else {
            open_n++;
        }
    }
    double end = cli_now() + XFER_DEADLINE_S;
    while (rc == 0 && open_n > 0) {
        size_t np = 0;
        for (size_t i = 0; i < npeers; i++)
            if (c[i].fd >= 0)
                pf[np++] = (struct pollfd){ .fd = c[i].fd, .events = POLLOUT };
        int pr = poll(pf, np, 1000);
        if (pr < 0 && errno != EINTR)
            rc = -1;
        if (cli_now() > end)
            rc = -1;
        for (size_t k = 0, i = 0; rc == 0 && k < np; k++) {
            while (c[i].fd != pf[k].fd)
                i++;
            out_conn *o = &c[i];
            if (!(pf[k].revents & (POLLOUT | POLLERR | POLLHUP)))
                continue;
            const demo_xfer_item *it = &o->items[o->at];
            if (o->sent == 0) {
                put64(o->hdr, it->tensor);
                put64(o->hdr + 8, it->row0);
                put64(o->hdr + 16, it->rows);
            }
            ssize_t w;
            if (o->sent < XFER_HDR) {
                w = write(o->fd, o->hdr + o->sent, XFER_HDR - o->sent);
            } else {
                uint64_t left = it->bytes - (o->sent - XFER_HDR);
                w = write(o->fd, it->src + (o->sent - XFER_HDR), left < XFER_WRITE ? left : XFER_WRITE);
            }
            if (w < 0) {
                if (errno != EAGAIN && errno != EINTR)
                    rc = -1;
                continue;
            }
            o->sent += (uint64_t)w;
            *bytes += (uint64_t)w;
            if (o->sent == XFER_HDR + it->bytes) {
                o->sent = 0;
                if (++o->at == o->n) {
                    close(o->fd);
                    o->fd = -1;
                    open_n--;
                }
            }
        }
    }
    for (size_t i = 0; c && i < npeers; i++)
        if (c[i].fd >= 0)
            close(c[i].fd);
    free(c);
    free(pf);
    return rc;
}

typedef struct in_conn {
    int fd;
    uint8_t hdr[XFER_HDR];
    uint64_t got, len;             /* of the item: header, then data */
    uint8_t *dst;
} in_conn;

int demo_xfer_recv(int listen_fd, unsigned nsenders, demo_xfer_place place, void *ctx,
                   uint64_t *bytes)
{
    in_conn *c = calloc(nsenders ? nsenders : 1, sizeof *c);
    struct pollfd *pf = calloc(nsenders + 1, sizeof *pf);
    int rc = c && pf ? 0 : -1;
    unsigned accepted = 0, done = 0;
    *bytes = 0;
    double end = cli_now() + XFER_DEADLINE_S;
    while (rc == 0 && done < nsenders) {
        size_t np = 0;
        if (accepted < nsenders)
            pf[np++] = (struct pollfd){ .fd = listen_fd, .events = POLLIN };
        for (unsigned i = 0; i < accepted; i++)
            if (c[i].fd >= 0)
                pf[np++] = (struct pollfd){ .fd = c[i].fd, .events = POLLIN };
        int pr = poll(pf, np, 1000);
        if ((pr < 0 && errno != EINTR) || cli_now() > end)
            rc = -1;
        for (size_t k = 0; rc == 0 && pr > 0 && k < np; k++) {
            if (!pf[k].revents)
                continue;
            if (pf[k].fd == listen_fd) {
                int s = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
                if (s < 0)
                    rc = -1;
                else
                    c[accepted++] = (in_conn){ .fd = s };
                continue;
            }
            unsigned i = 0;
            while (c[i].fd != pf[k].fd)
                i++;
            in_conn *x = &c[i];
            ssize_t r;
            if (x->got < XFER_HDR)
                r = read(x->fd, x->hdr + x->got, XFER_HDR - x->got);
            else
                r = read(x->fd, x->dst + (x->got - XFER_HDR), x->len - (x->got - XFER_HDR));
            if (r < 0) {
                if (errno != EINTR && errno != EAGAIN)
                    rc = -1;
                continue;
            }
            if (r == 0) {   /* the sender is done: never in the middle of an item */
                rc = x->got == 0 ? 0 : -1;
                close(x->fd);
                x->fd = -1;
                done++;
                continue;
            }
            x->got += (uint64_t)r;
            *bytes += (uint64_t)r;
            if (x->got == XFER_HDR) {
                x->dst = place(ctx, (uint32_t)get64(x->hdr), get64(x->hdr + 8), get64(x->hdr + 16),
                               &x->len);
                if (!x->dst)
                    rc = -1;
            }
            if (x->got >= XFER_HDR && x->got == XFER_HDR + x->len)
                x->got = 0;
        }
    }
    for (unsigned i = 0; c && i < accepted; i++)
        if (c[i].fd >= 0)
            close(c[i].fd);
    free(c);
    free(pf);
    return rc;
}

/* ---- the roles' commands ------------------------------------------------------------ */

static int do_listen(demo_xfer *x)
{
    if (x->listen_fd <= 0) {
        const char *a = getenv("FERRY_LAB_ADDR");
        x->listen_fd = demo_xfer_listen(a && *a ? a : "127.0.0.1", &x->port);
    }
    if (x->listen_fd < 0)
        printf("ERR cannot listen\n");
    else
        printf("OK 0 %u\n", x->port);
    fflush(stdout);
    return 1;
}

static int parse_peers(demo_xfer *x, const char *line)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", line);
    char *save = NULL, *tok = strtok_r(buf, " \n", &save);   /* "peers" */
    tok = strtok_r(NULL, " \n", &save);
    x->rworld = tok ? (uint32_t)atoi(tok) : 0;
    tok = strtok_r(NULL, " \n", &save);
    x->rdp = tok ? (uint32_t)atoi(tok) : 0;
    tok = strtok_r(NULL, " \n", &save);
    snprintf(x->gather, sizeof x->gather, "%s", tok ? tok : "");
    free(x->peers);
    x->peers = calloc(x->rworld ? x->rworld : 1, sizeof *x->peers);
    uint32_t n = 0;
    while (x->peers && n < x->rworld && (tok = strtok_r(NULL, " \n", &save)))
        snprintf(x->peers[n++], sizeof x->peers[0], "%s", tok);
    bool ok = x->peers && n == x->rworld && x->rdp && x->rworld % x->rdp == 0 && x->gather[0];
    printf(ok ? "OK 0\n" : "ERR bad peers line\n");
    fflush(stdout);
    return 1;
}

/* Items of worker w's TP rows out of the shards (rows [r0, r0+rows) of
 * tensor, at data), appended to *it. */
static int items_for(const demo_model *m, const demo_shard *sh, size_t n, uint32_t w, uint32_t W,
                     uint32_t dp, demo_xfer_item **it, size_t *nit)
{
    *it = calloc(n ? n : 1, sizeof **it);
    *nit = 0;
    if (!*it)
        return -1;
    for (size_t k = 0; k < n; k++) {
        const demo_tensor *t = &m->t[sh[k].tensor];
        uint64_t r0, rows;
        const char *ep = getenv("FERRY_DEMO_EP");
        demo_rollout_rows(t, w, W, dp, ep && *ep && strcmp(ep, "0"), &r0, &rows);
        uint64_t a = r0 > sh[k].r0 ? r0 : sh[k].r0;
        uint64_t b = r0 + rows < sh[k].r0 + sh[k].rows ? r0 + rows : sh[k].r0 + sh[k].rows;
        if (a >= b)
            continue;
        uint64_t rb = demo_row_elems(t) * 2;
        (*it)[(*nit)++] = (demo_xfer_item){ .tensor = (uint32_t)sh[k].tensor, .row0 = a,
                                            .rows = b - a, .bytes = (b - a) * rb,
                                            .src = sh[k].data + (a - sh[k].r0) * rb };
    }
    return 0;
}

/* Send every rollout worker its rows out of shards sh[0..n). */
static int scatter(demo_xfer *x, const demo_model *m, const demo_shard *sh, size_t n, uint64_t *bytes)
{
    uint32_t W = x->rworld;
    demo_xfer_item **its = calloc(W, sizeof *its);
    size_t *nits = calloc(W, sizeof *nits);
    const char **peers = calloc(W, sizeof *peers);
    int rc = its && nits && peers ? 0 : -1;
    for (uint32_t w = 0; rc == 0 && w < W; w++) {
        rc = items_for(m, sh, n, w, W, x->rdp, &its[w], &nits[w]);
        peers[w] = x->peers[w];
    }
    if (rc == 0)
        rc = demo_xfer_send(peers, (const demo_xfer_item *const *)its, nits, W, bytes);
    for (uint32_t w = 0; its && w < W; w++)
        free(its[w]);
    free(its);
    free(nits);
    free(peers);
    return rc;
}

static uint8_t *place_full(void *ctx, uint32_t tensor, uint64_t row0, uint64_t rows, uint64_t *len)
{
    void **c = ctx;
    demo_xfer *x = c[0];
    const demo_model *m = c[1];
    if (tensor >= m->n || row0 + rows > (m->t[tensor].ndim ? m->t[tensor].shape[0] : 1))
        return NULL;
    uint64_t rb = demo_row_elems(&m->t[tensor]) * 2;
    *len = rows * rb;
    return x->full + x->toff[tensor] + row0 * rb;
}

/* Rank 0: every other rank's shards into full; then full as one shard per
 * tensor to every rollout. Other ranks: their shards to rank 0. */
static int bcast(demo_xfer *x, const demo_model *m, uint32_t rank, uint32_t world,
                 const demo_shard *mine, size_t n, uint64_t *bytes)
{
    if (rank != 0) {
        demo_xfer_item *it = calloc(n ? n : 1, sizeof *it);
        if (!it)
            return -1;
        for (size_t k = 0; k < n; k++)
            it[k] = (demo_xfer_item){ .tensor = (uint32_t)mine[k].tensor, .row0 = mine[k].r0,
                                      .rows = mine[k].rows,
                                      .bytes = mine[k].rows * demo_row_elems(&m->t[mine[k].tensor]) * 2,
                                      .src = mine[k].data };
        const char *peer = x->gather;
        const demo_xfer_item *its = it;
        int rc = demo_xfer_send(&peer, &its, &n, 1, bytes);
        free(it);
        return rc;
    }
    if (!x->full) {
        x->toff = calloc(m->n + 1, sizeof *x->toff);
        for (size_t t = 0; x->toff && t < m->n; t++)
            x->toff[t + 1] = x->toff[t] + m->t[t].bytes;
        x->full = x->toff ? malloc(x->toff[m->n] ? x->toff[m->n] : 1) : NULL;
        if (!x->full)
            return -1;
        memset(x->full, 0, x->toff[m->n]);
    }
    uint64_t got = 0;
    void *ctx[2] = { x, (void *)m };
    if (world > 1 && demo_xfer_recv(x->listen_fd, world - 1, place_full, ctx, &got) < 0)
        return -1;
    for (size_t k = 0; k < n; k++) {
        uint64_t rb = demo_row_elems(&m->t[mine[k].tensor]) * 2;
        memcpy(x->full + x->toff[mine[k].tensor] + mine[k].r0 * rb, mine[k].data, mine[k].rows * rb);
    }
    demo_shard *all = calloc(m->n ? m->n : 1, sizeof *all);
    if (!all)
        return -1;
    for (size_t t = 0; t < m->n; t++)
        all[t] = (demo_shard){ .tensor = t, .r0 = 0, .rows = m->t[t].ndim ? m->t[t].shape[0] : 1,
                               .data = x->full + x->toff[t] };
    int rc = scatter(x, m, all, m->n, bytes);
    free(all);
    return rc;
}

int demo_xfer_trainer(demo_xfer *x, const char *line, const demo_model *m, uint32_t rank,
                      uint32_t world, const demo_shard *mine, size_t n)
{
    unsigned long long g;
    if (!strncmp(line, "listen", 6))
        return do_listen(x);
    if (!strncmp(line, "peers ", 6))
        return parse_peers(x, line);
    bool p2p = sscanf(line, "p2p %llu", &g) == 1;
    if (!p2p && sscanf(line, "bcast %llu", &g) != 1)
        return 0;
    double t0 = cli_now();
    uint64_t bytes = 0;
    int rc = !x->peers ? -1 : p2p ? scatter(x, m, mine, n, &bytes)
                                  : bcast(x, m, rank, world, mine, n, &bytes);
    if (rc == 0)
        printf("OK %.4f %llu 0 0\n", cli_now() - t0, (unsigned long long)bytes);
    else
        printf("ERR the %s send failed\n", p2p ? "p2p" : "bcast");
    fflush(stdout);
    return 1;
}

typedef struct rctx {
    const demo_model *m;
    ferry_param_shard *sh;
    const uint64_t *first;
    size_t ns;
} rctx;

static uint8_t *place_shard(void *ctx, uint32_t tensor, uint64_t row0, uint64_t rows, uint64_t *len)
{
    const rctx *c = ctx;
    for (size_t k = 0; k < c->ns; k++) {
        if (c->first[k] != tensor)
            continue;
        const ferry_param_shard *p = &c->sh[k];
        uint64_t off0 = p->ndim ? p->offset[0] : 0, rows0 = p->ndim ? p->shape[0] : 1;
        if (row0 < off0 || row0 + rows > off0 + rows0)
            return NULL;
        uint64_t rb = demo_row_elems(&c->m->t[tensor]) * 2;
        *len = rows * rb;
        return (uint8_t *)p->dst + (row0 - off0) * rb;
    }
    return NULL;
}

int demo_xfer_rollout(demo_xfer *x, const char *line, const demo_model *m, ferry_param_shard *sh,
                      const uint64_t *first, size_t ns, double *secs, uint64_t *bytes, uint64_t *g)
{
    unsigned long long gg;
    unsigned senders = 1;
    if (!strncmp(line, "listen", 6))
        return do_listen(x) + 1;
    bool p2p = sscanf(line, "p2p %llu %u", &gg, &senders) == 2;
    if (!p2p && sscanf(line, "bcast %llu", &gg) != 1)
        return 0;
    *g = gg;
    for (size_t k = 0; k < ns; k++)   /* so that the check afterwards means something */
        memset(sh[k].dst, 0, sh[k].dst_bytes);
    rctx c = { m, sh, first, ns };
    double t0 = cli_now();
    int rc = x->listen_fd > 0 ? demo_xfer_recv(x->listen_fd, p2p ? senders : 1, place_shard, &c, bytes)
                              : -1;
    *secs = cli_now() - t0;
    if (rc < 0) {
        printf("ERR the %s receive failed\n", p2p ? "p2p" : "bcast");
        fflush(stdout);
        return -1;
    }
    return 1;
}

void demo_xfer_close(demo_xfer *x)
{
    if (x->listen_fd > 0)
        close(x->listen_fd);
    free(x->peers);
    free(x->full);
    free(x->toff);
    memset(x, 0, sizeof *x);
}
