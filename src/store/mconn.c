/* The connection to the master (mconn.h). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "store/mconn.h"
#include "wire/sockio.h"

#define TAG "mconn"
#define IO_TIMEOUT_MS 30000
/* A list of masters (a replicated cluster): what we sent (a request, a
 * heartbeat: one a second at least) unacknowledged by the master's kernel
 * this long means its host is gone or cut off: the connection is dropped
 * and the next master of the list tried. The kernel acknowledges, not the
 * master's loop; but a master holding our input back (its back-pressure)
 * for longer also drops us (the kernel counts a closed window too), so a
 * single master, with nowhere else to go, keeps the kernel's default. */
#define USER_TIMEOUT_MS 2000
#define BACKOFF_MIN_MS 20
#define BACKOFF_MAX_MS 1000
#define LIST_CONNECT_MS 500    /* a TCP connect to one master of a list */

typedef struct waiter {
    struct waiter *next;
    uint64_t id;
    bool done;
    int status;
    uint8_t *buf;
    fr_smsg m;
} waiter;

struct fr_mconn {
    fr_mconn_config cfg;
    char addr[128];            /* "HOST:PORT", or several comma-separated (masters of a cluster) */
    char cur[128];             /* the one connected to last (logs) */
    size_t next;               /* the entry that answered last */
    bool after_loss;           /* its connection was lost: try it last, not first */
    uint8_t key[32];
    uint64_t instance;
    pthread_mutex_t lock;      /* fd state, waiters, epoch */
    pthread_cond_t cond;
    pthread_mutex_t wlock;     /* one writer at a time; close(fd) under it */
    int fd;                    /* -1 while disconnected */
    uint64_t epoch;            /* connections made so far (a new one: +1) */
    uint32_t caps;             /* FR_AUTH_CAP_* the connection's handshake agreed on */
    uint64_t leader;           /* the newest leadership epoch heard (FR_AUTH_CAP_EPOCH) */
    int last_err;
    bool closing;
    uint64_t next_id;
    uint64_t last_send_ns;
    waiter *waiters;
    int wake[2];
    pthread_t thr;
    bool started;
};

/* One address of the list (entry i mod their count) into out. */
static size_t list_entry(const char *list, size_t i, char *out, size_t cap)
{
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    i %= n;
    const char *p = list;
    for (size_t k = 0; k < i; k++)
        p = strchr(p, ',') + 1;
    size_t len = strcspn(p, ",");
    snprintf(out, cap, "%.*s", (int)(len < cap ? len : cap - 1), p);
    return n;
}

/* Connect to the master: the one address, or each of the list in turn
 * from the one that answered last (a cluster's masters: only the leader
 * accepts) — after its connection was lost, from the one after it, until
 * a connection is made: a leader whose host went silent answers nothing,
 * and trying it first held every reconnect for its connect timeout while
 * the standby that took over was next in the list. The last refusal is
 * returned. */
static int connect_one(fr_mconn *c, const char *addr, int timeout_ms, int *out, uint32_t *caps);

static int connect_once(fr_mconn *c, int timeout_ms, int *out, uint32_t *caps)
{
    char one[128];
    size_t n = list_entry(c->addr, c->next, one, sizeof one);
    pthread_mutex_lock(&c->lock);
    size_t first = c->next + (c->after_loss && n > 1);
    pthread_mutex_unlock(&c->lock);
    int rc = FERRY_ECONNREFUSED;
    for (size_t k = 0; k < n; k++) {
        size_t i = (first + k) % n;
        list_entry(c->addr, i, one, sizeof one);
        rc = connect_one(c, one, timeout_ms, out, caps);
        if (rc == 0 || rc == FERRY_EAUTH) {   /* a refused token is said, not hidden by the next */
            if (rc == 0) {
                pthread_mutex_lock(&c->lock);
                c->next = i;
                c->after_loss = false;
                pthread_mutex_unlock(&c->lock);
                snprintf(c->cur, sizeof c->cur, "%s", one);
            }
            return rc;
        }
    }
    return rc;
}

/* One handshake asking for want: the connected socket, or -1 (*out). */
static int handshake(fr_mconn *c, const char *addr, int timeout_ms, uint32_t want, int *out,
                     uint32_t *caps)
{
    int fd = -1;
    *out = -1;
    /* A master of a list whose host is gone answers no SYN: the next one
     * is tried after LIST_CONNECT_MS, not after the call's timeout (the
     * handshake that follows, answered by the master's loop, keeps it). */
    int cms = strchr(c->addr, ',') && timeout_ms > LIST_CONNECT_MS ? LIST_CONNECT_MS : timeout_ms;
    int rc = fr_sock_connect(addr, cms, &fd);
    if (rc < 0)
        return rc;
    rc = fr_sock_timeouts(fd, timeout_ms);
    if (rc == 0)
        rc = fr_handshake_client_caps(fd, c->key, c->instance, 0, c->cfg.role, 0, want, caps,
                                      NULL, NULL);
    if (rc < 0)
        close(fd);
    else
        *out = fd;
    return rc;
}

/* Every frame with the epoch when the master speaks it; a master older
 * than the epoch refuses the AUTH that asks (FERRY_EPROTO): then again
 * without. */
static int connect_one(fr_mconn *c, const char *addr, int timeout_ms, int *out, uint32_t *caps)
{
    int fd = -1;
    *caps = 0;
    int rc = handshake(c, addr, timeout_ms, FR_AUTH_CAP_EPOCH, &fd, caps);
    if (rc == FERRY_EPROTO)
        rc = handshake(c, addr, timeout_ms, 0, &fd, caps);
    if (rc == 0)
        rc = fr_sock_timeouts(fd, IO_TIMEOUT_MS);
    int ut = USER_TIMEOUT_MS;
    if (rc == 0 && strchr(c->addr, ',') &&
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut) != 0)
        rc = FERRY_EIO;
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

/* Fail every waiter still waiting (the connection it was sent on is gone). */
static void fail_waiters(fr_mconn *c, int status)
{
    for (waiter *w = c->waiters; w; w = w->next)
        if (!w->done) {
            w->done = true;
            w->status = status;
        }
    pthread_cond_broadcast(&c->cond);
}

/* stale: the req_id whose answer was refused (0: none), failed with
 * FERRY_ESTATE in the same step as the connection goes, so that its caller's
 * next call waits for the next connection. */
static void conn_lost(fr_mconn *c, int why, uint64_t stale)
{
    pthread_mutex_lock(&c->lock);
    int fd = c->fd;
    bool closing = c->closing;
    c->fd = -1;
    c->last_err = FERRY_ECONNRESET;
    c->after_loss = true;
    for (waiter *w = c->waiters; stale && w; w = w->next)
        if (w->id == stale && !w->done) {
            w->done = true;
            w->status = FERRY_ESTATE;
        }
    fail_waiters(c, FERRY_ECONNRESET);
    pthread_mutex_unlock(&c->lock);
    if (fd >= 0) {
        shutdown(fd, SHUT_RDWR);
        pthread_mutex_lock(&c->wlock);
        close(fd);
        pthread_mutex_unlock(&c->wlock);
    }
    if (!closing) {
        FR_WARN(TAG, "connection to the master at %s lost (%s); reconnecting", c->cur,
                ferry_strerror(why));
        if (c->cfg.hooks.lost)
            c->cfg.hooks.lost(c->cfg.hooks.ctx);
    }
}

/* The frames were encoded for connection number gen (with its
 * capabilities): on another one they are not sent (FERRY_ECONNRESET). */
static int write_frames(fr_mconn *c, const uint8_t *buf, size_t len, uint64_t gen)
{
    pthread_mutex_lock(&c->wlock);
    pthread_mutex_lock(&c->lock);
    int fd = c->epoch == gen ? c->fd : -1;
    pthread_mutex_unlock(&c->lock);
    int rc = fd < 0 ? FERRY_ECONNRESET : fr_write_full(fd, buf, len);
    if (rc < 0 && fd >= 0)
        shutdown(fd, SHUT_RDWR);   /* the receiver notices and reconnects */
    __atomic_store_n(&c->last_send_ns, fr_now_ns(), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->wlock);
    return rc;
}

/* The frames' bytes without epochs, or the request's encoding error. */
static int frames_len(const fr_smsg *reqs, size_t n, size_t *total)
{
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        int rc = fr_smsg_body_len(&reqs[i], &bl);
        if (rc < 0)
            return rc;
        *total += FR_WIRE_HDR_LEN + bl;
    }
    return 0;
}

/* The frames for a connection with caps: with the newest epoch heard after
 * each body when it speaks FR_AUTH_CAP_EPOCH. */
static int encode_all(const fr_smsg *reqs, size_t n, const uint64_t *ids, uint32_t caps,
                      uint64_t epoch, uint8_t **out, size_t *outlen)
{
    size_t total = 0;
    int rc = frames_len(reqs, n, &total);
    if (rc < 0)
        return rc;
    bool ep = caps & FR_AUTH_CAP_EPOCH;
    total += ep ? n * FR_SMSG_EPOCH_LEN : 0;
    uint8_t *buf = fr_malloc(total ? total : 1);
    if (!buf)
        return FERRY_ENOMEM;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        int k = ep ? fr_smsg_encode_epoch(&reqs[i], ids[i], epoch, buf + off, total - off)
                   : fr_smsg_encode(&reqs[i], ids[i], buf + off, total - off);
        if (k < 0) {
            fr_free(buf);
            return k;
        }
        off += (size_t)k;
    }
    *out = buf;
    *outlen = off;
    return 0;
}

uint64_t fr_mconn_reserve_id(fr_mconn *c)
{
    pthread_mutex_lock(&c->lock);
    uint64_t id = c->next_id++;
    pthread_mutex_unlock(&c->lock);
    return id;
}

uint64_t fr_mconn_epoch(fr_mconn *c)
{
    pthread_mutex_lock(&c->lock);
    uint64_t e = c->epoch;
    pthread_mutex_unlock(&c->lock);
    return e;
}

/* Wait (lock held) until connected or the deadline. */
static int wait_connected(fr_mconn *c, uint64_t deadline)
{
    while (c->fd < 0) {
        if (c->closing)
            return FERRY_ECANCELED;
        if (deadline == UINT64_MAX) {
            pthread_cond_wait(&c->cond, &c->lock);
            continue;
        }
        struct timespec ts = fr_timespec_at(deadline);
        if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) == ETIMEDOUT && c->fd < 0)
            return c->last_err ? c->last_err : FERRY_ETIMEDOUT;
    }
    return 0;
}

static void unlink_waiters(fr_mconn *c, waiter *ws, size_t n)
{
    waiter **pp = &c->waiters;
    while (*pp) {
        waiter *w = *pp;
        if (w >= ws && w < ws + n)
            *pp = w->next;
        else
            pp = &w->next;
    }
}

int fr_mconn_call(fr_mconn *c, const fr_smsg *reqs, size_t n, uint64_t *ids, fr_smsg *reps,
                  uint8_t **bufs, int timeout_ms)
{
    if (n == 0)
        return 0;
    uint64_t deadline = fr_deadline_ns(timeout_ms);
    waiter *ws = fr_calloc(n, sizeof *ws);
    uint64_t *use = fr_calloc(n, sizeof *use);
    if (!ws || !use) {
        fr_free(ws);
        fr_free(use);
        return FERRY_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        bufs[i] = NULL;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < n; i++)
        use[i] = ids && ids[i] ? ids[i] : c->next_id++;
    pthread_mutex_unlock(&c->lock);
    if (ids)
        memcpy(ids, use, n * sizeof *use);

    uint8_t *frames = NULL;
    size_t flen = 0;
    int rc = frames_len(reqs, n, &flen);   /* a bad request is said before any waiting */
    if (rc < 0) {
        fr_free(use);
        fr_free(ws);
        return rc;
    }

    pthread_mutex_lock(&c->lock);
    rc = wait_connected(c, deadline);
    uint64_t gen = c->epoch, epoch = c->leader;
    uint32_t caps = c->caps;
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) {
            ws[i].id = use[i];
            ws[i].next = c->waiters;
            c->waiters = &ws[i];
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (rc == 0)
        rc = encode_all(reqs, n, use, caps, epoch, &frames, &flen);
    fr_free(use);
    if (rc == 0)
        rc = write_frames(c, frames, flen, gen);
    fr_free(frames);

    pthread_mutex_lock(&c->lock);
    if (rc == 0) {
        for (size_t i = 0; i < n && rc == 0; i++) {
            while (!ws[i].done && rc == 0) {
                struct timespec ts = fr_timespec_at(deadline);
                if (deadline == UINT64_MAX)
                    pthread_cond_wait(&c->cond, &c->lock);
                else if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) == ETIMEDOUT &&
                         !ws[i].done)
                    rc = FERRY_ETIMEDOUT;
            }
            if (rc == 0 && ws[i].status < 0)
                rc = ws[i].status;
        }
    }
    unlink_waiters(c, ws, n);
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < n; i++) {
        bufs[i] = ws[i].buf;
        if (rc == 0)
            reps[i] = ws[i].m;
    }
    fr_free(ws);
    return rc;
}

int fr_mconn_send(fr_mconn *c, const fr_smsg *req, uint64_t req_id, int timeout_ms)
{
    uint8_t *frames = NULL;
    size_t flen = 0;
    int rc = frames_len(req, 1, &flen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&c->lock);
    rc = wait_connected(c, fr_deadline_ns(timeout_ms));
    uint64_t gen = c->epoch, epoch = c->leader;
    uint32_t caps = c->caps;
    pthread_mutex_unlock(&c->lock);
    if (rc == 0)
        rc = encode_all(req, 1, &req_id, caps, epoch, &frames, &flen);
    if (rc == 0)
        rc = write_frames(c, frames, flen, gen);
    fr_free(frames);
    return rc;
}

/* ---- the receiver thread ---------------------------------------------------- */

/* One frame; on a connection with FR_AUTH_CAP_EPOCH, *epoch from its
 * trailer (else 0). */
static int read_frame(int fd, uint32_t caps, fr_frame_hdr *h, uint8_t **body, fr_smsg *m,
                      uint64_t *epoch)
{
    *epoch = 0;
    uint8_t raw[FR_WIRE_HDR_LEN];
    int rc = fr_read_full(fd, raw, sizeof raw);
    if (rc < 0)
        return rc;
    rc = fr_wire_hdr_decode(raw, sizeof raw, h);
    if (rc < 0)
        return rc;
    if (h->type < FR_MSG_STORE_FIRST || h->type > FR_MSG_STORE_LAST ||
        h->len > FR_WIRE_STORE_MAX_LEN)
        return FERRY_EPROTO;
    uint8_t *b = fr_malloc(h->len ? h->len : 1);
    if (!b)
        return FERRY_ENOMEM;
    rc = fr_read_full(fd, b, h->len);
    if (rc == 0)
        rc = caps & FR_AUTH_CAP_EPOCH ? fr_smsg_decode_epoch(h, b, h->len, m, epoch)
                                      : fr_smsg_decode(h, b, h->len, m);
    if (rc < 0) {
        fr_free(b);
        return rc;
    }
    *body = b;
    return 0;
}

static void dispatch(fr_mconn *c, const fr_frame_hdr *h, uint8_t *body, const fr_smsg *m)
{
    pthread_mutex_lock(&c->lock);
    for (waiter *w = c->waiters; w; w = w->next) {
        if (w->id == h->req_id && !w->done) {
            w->done = true;
            w->status = 0;
            w->buf = body;
            w->m = *m;
            pthread_cond_broadcast(&c->cond);
            pthread_mutex_unlock(&c->lock);
            return;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (c->cfg.hooks.push)
        c->cfg.hooks.push(c->cfg.hooks.ctx, h->req_id, m);
    fr_free(body);
}

/* A heartbeat never waits on the data path: not behind a request another
 * thread is writing (the master counts those bytes as our sign of life),
 * not on a socket whose buffer is full (then the master is not reading us,
 * and it does not hold its own back-pressure against us). Skipped, it is
 * tried again a quarter period later. */
static void heartbeat(fr_mconn *c)
{
    uint64_t now = fr_now_ns();
    if (pthread_mutex_trylock(&c->wlock) != 0) {
        __atomic_store_n(&c->last_send_ns, now - (uint64_t)c->cfg.heartbeat_ms * 750000u,
                         __ATOMIC_RELAXED);
        return;
    }
    pthread_mutex_lock(&c->lock);
    int fd = c->fd;
    uint64_t id = c->next_id++, epoch = c->leader;
    uint32_t caps = c->caps;
    pthread_mutex_unlock(&c->lock);
    fr_smsg hb = {.type = FR_SMSG_HEARTBEAT, .node = c->cfg.node};
    uint8_t frame[64];
    int n = caps & FR_AUTH_CAP_EPOCH ? fr_smsg_encode_epoch(&hb, id, epoch, frame, sizeof frame)
                                     : fr_smsg_encode(&hb, id, frame, sizeof frame);
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    bool room = fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & POLLOUT);
    if (n > 0 && room && fr_write_full(fd, frame, (size_t)n) < 0)
        shutdown(fd, SHUT_RDWR);   /* the receiver notices and reconnects */
    uint64_t next = room ? now : now - (uint64_t)c->cfg.heartbeat_ms * 750000u;
    __atomic_store_n(&c->last_send_ns, next, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->wlock);
}

/* Sleep up to ms unless woken for close. */
static void nap(fr_mconn *c, unsigned ms)
{
    struct pollfd p = { .fd = c->wake[0], .events = POLLIN };
    (void)poll(&p, 1, (int)ms);
}

/* A frame from a master with epoch: the newest heard so far is kept; one
 * older than that comes from a deposed leader (the cluster has moved on):
 * its answer is refused (FERRY_ESTATE to the request it answers, by
 * conn_lost) and the connection dropped, so that the next one finds the
 * leader. */
static bool heard_epoch(fr_mconn *c, uint64_t epoch)
{
    pthread_mutex_lock(&c->lock);
    uint64_t known = c->leader;
    bool ok = epoch >= known;
    if (ok)
        c->leader = epoch;
    pthread_mutex_unlock(&c->lock);
    if (!ok)
        FR_WARN(TAG, "the master at %s answered with epoch %llu, older than epoch %llu heard "
                "before: a deposed leader; its answer refused", c->cur,
                (unsigned long long)epoch, (unsigned long long)known);
    return ok;
}

static void *receiver(void *arg)
{
    fr_mconn *c = arg;
    unsigned backoff = BACKOFF_MIN_MS;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        bool closing = c->closing;
        int fd = c->fd;
        uint32_t fcaps = c->caps;
        pthread_mutex_unlock(&c->lock);
        if (closing)
            break;
        if (fd < 0) {
            int nfd = -1;
            uint32_t caps = 0;
            int rc = connect_once(c, 5000, &nfd, &caps);
            pthread_mutex_lock(&c->lock);
            if (rc == 0 && !c->closing) {
                c->fd = nfd;
                c->caps = caps;
                c->epoch++;
                c->last_err = 0;
                c->last_send_ns = fr_now_ns();
                FR_INFO(TAG, "connected to the master at %s", c->cur);
            } else {
                c->last_err = rc < 0 ? rc : FERRY_ECANCELED;
                if (rc == 0)
                    close(nfd);
            }
            pthread_cond_broadcast(&c->cond);
            pthread_mutex_unlock(&c->lock);
            if (rc < 0) {
                nap(c, backoff);
                backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
            } else {
                backoff = BACKOFF_MIN_MS;
            }
            continue;
        }
        uint64_t hb_ns = (uint64_t)c->cfg.heartbeat_ms * 1000000u;
        uint64_t since = fr_now_ns() - __atomic_load_n(&c->last_send_ns, __ATOMIC_RELAXED);
        if (since >= hb_ns) {
            heartbeat(c);
            continue;
        }
        struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = c->wake[0], .events = POLLIN } };
        int ms = (int)((hb_ns - since) / 1000000u) + 1;
        int n = poll(p, 2, ms);
        if (n <= 0 || (p[1].revents & POLLIN))
            continue;
        fr_frame_hdr h;
        uint8_t *body = NULL;
        fr_smsg m;
        uint64_t epoch = 0;
        int rc = read_frame(fd, fcaps, &h, &body, &m, &epoch);
        if (rc == 0 && (fcaps & FR_AUTH_CAP_EPOCH) && !heard_epoch(c, epoch)) {
            fr_free(body);
            conn_lost(c, FERRY_ESTATE, h.req_id);
            continue;
        }
        if (rc < 0) {
            conn_lost(c, rc, 0);
            continue;
        }
        dispatch(c, &h, body, &m);
    }
    return NULL;
}

int fr_mconn_open(const fr_mconn_config *cfg, fr_mconn **out)
{
    if (!cfg || !cfg->addr || !cfg->key || strlen(cfg->addr) >= sizeof ((fr_mconn *)0)->addr)
        return FERRY_EINVAL;
    fr_mconn *c = fr_calloc(1, sizeof *c);
    if (!c)
        return FERRY_ENOMEM;
    c->cfg = *cfg;
    if (!c->cfg.heartbeat_ms)
        c->cfg.heartbeat_ms = FR_STORE_HEARTBEAT_MS;
    if (!c->cfg.timeout_ms)
        c->cfg.timeout_ms = FR_STORE_TIMEOUT_MS;
    snprintf(c->addr, sizeof c->addr, "%s", cfg->addr);
    memcpy(c->key, cfg->key, 32);
    c->cfg.addr = c->addr;
    c->cfg.key = c->key;
    c->instance = fr_random_u64();
    c->fd = -1;
    c->next_id = 1;
    c->wake[0] = c->wake[1] = -1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->wlock, NULL);
    fr_cond_init_monotonic(&c->cond);
    int rc = pipe2(c->wake, O_CLOEXEC | O_NONBLOCK) < 0 ? FERRY_EIO : 0;
    if (rc == 0)
        rc = connect_once(c, c->cfg.timeout_ms, &c->fd, &c->caps);
    if (rc == 0) {
        c->epoch = 1;
        c->last_send_ns = fr_now_ns();
        rc = pthread_create(&c->thr, NULL, receiver, c) ? FERRY_ENOMEM : 0;
        c->started = rc == 0;
    }
    if (rc < 0) {
        fr_mconn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void fr_mconn_close(fr_mconn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->closing = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (c->wake[1] >= 0)
        (void)!write(c->wake[1], "x", 1);
    if (c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
    if (c->started)
        pthread_join(c->thr, NULL);
    if (c->fd >= 0)
        close(c->fd);
    for (int i = 0; i < 2; i++)
        if (c->wake[i] >= 0)
            close(c->wake[i]);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->wlock);
    pthread_cond_destroy(&c->cond);
    fr_free(c);
}
