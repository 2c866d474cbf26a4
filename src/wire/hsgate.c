/* The accept side of a listener: one thread, every handshake in flight on
 * one epoll set, a deadline from accept, caps in flight and per source
 * (hsgate.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/base.h"
#include "wire/hsgate.h"

#define SRC_KEY 17          /* family byte + up to 16 address bytes */
#define ACCEPT_BURST 64     /* accepts per wake-up, so handshakes in flight keep moving */
#define PAUSE_MS 100        /* no accepting for this long after running out of descriptors */
#define EVENTS 128
/* epoll tokens below TOK_CONN are the gate's own descriptors; a
 * connection's token is TOK_CONN + its slot, with the slot's generation in
 * the high half so that an event for a slot reused in the same batch is
 * recognised as stale. */
enum { TOK_LISTEN = 0, TOK_WAKE = 1, TOK_STOP = 2, TOK_CONN = 3 };

enum { LOG_TIMEOUT, LOG_SOURCE, LOG_FULL, LOG_REFUSED, LOG_ACCEPT, LOG_KINDS };
static const char *const log_kind[LOG_KINDS] = {
    "handshakes dropped at the deadline", "handshakes displaced by newer ones from the same address",
    "handshakes displaced while the listener was full", "refused connections", "accept failures",
};

typedef struct gsrc gsrc;
typedef struct gconn gconn;

struct gconn {
    int fd;
    uint32_t gen;
    uint32_t events;              /* epoll interest now */
    uint64_t deadline;            /* ns, CLOCK_MONOTONIC */
    gsrc *src;
    gconn *prev, *next;           /* every handshake in flight, oldest first */
    gconn *sprev, *snext;         /* the same source's, oldest first */
    fr_hs_server hs;
    char peer[FR_HSGATE_PEER];
};

struct gsrc {
    uint8_t key[SRC_KEY];
    uint32_t n;                   /* handshakes in flight; 0: slot free */
    gconn *head, *tail;
    gsrc *hnext;                  /* hash chain, or the free list */
};

typedef struct ratelog { uint64_t until; uint64_t quiet; } ratelog;

struct fr_hsgate {
    fr_hsgate_config cfg;
    uint8_t key[32];
    char tag[16];
    int lfd, epfd, wakefd;
    uint64_t deadline_ns;
    uint32_t max_inflight, max_per_source;
    /* Slots are taken from the free lists, else the next never-used one:
     * pages of the arrays are touched only as far as the peak in flight. */
    gconn *slots, *free_conn;
    gsrc *srcs, *free_src, **buckets;
    uint32_t slots_used, srcs_used;
    uint32_t nbuckets;            /* a power of two */
    gconn *head, *tail;
    uint32_t n;
    uint64_t paused_until;        /* ns; 0: accepting */
    ratelog logs[LOG_KINDS];
    _Atomic uint64_t st_accepted, st_auth, st_refused, st_timeout, st_displaced, st_accept_err;
    _Atomic uint32_t st_inflight, st_peak;
};

/* ---- logging, rate-limited per kind --------------------------------------------- */

static void gate_log(fr_hsgate *g, int kind, uint64_t now, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void gate_log(fr_hsgate *g, int kind, uint64_t now, const char *fmt, ...)
{
    ratelog *r = &g->logs[kind];
    if (now < r->until) {
        r->quiet++;
        return;
    }
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->quiet)
        FR_WARN(g->tag, "%s (and %llu more %s in the last %u s, not logged)", msg,
                (unsigned long long)r->quiet, log_kind[kind], FR_HSGATE_LOG_WINDOW_MS / 1000);
    else
        FR_WARN(g->tag, "%s", msg);
    r->quiet = 0;
    r->until = now + (uint64_t)FR_HSGATE_LOG_WINDOW_MS * 1000000u;
}

/* Say how many went unlogged once a window ends with no new event. */
static void gate_log_flush(fr_hsgate *g, uint64_t now)
{
    for (int k = 0; k < LOG_KINDS; k++) {
        ratelog *r = &g->logs[k];
        if (r->quiet && now >= r->until) {
            FR_WARN(g->tag, "%llu more %s in the last %u s, not logged", (unsigned long long)r->quiet,
                    log_kind[k], FR_HSGATE_LOG_WINDOW_MS / 1000);
            r->quiet = 0;
            r->until = now + (uint64_t)FR_HSGATE_LOG_WINDOW_MS * 1000000u;
        }
    }
}

static uint64_t gate_log_next(const fr_hsgate *g)
{
    uint64_t t = UINT64_MAX;
    for (int k = 0; k < LOG_KINDS; k++)
        if (g->logs[k].quiet && g->logs[k].until < t)
            t = g->logs[k].until;
    return t;
}

/* ---- sources ------------------------------------------------------------------- */

/* The source of an accepted socket and its name for log lines. */
static void source_of(int fd, const struct sockaddr_storage *ss, uint8_t key[SRC_KEY], char *peer)
{
    char host[INET6_ADDRSTRLEN];
    memset(key, 0, SRC_KEY);
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {   /* one source, whichever way it came */
            key[0] = AF_INET;
            memcpy(key + 1, a->sin6_addr.s6_addr + 12, 4);
            inet_ntop(AF_INET, a->sin6_addr.s6_addr + 12, host, sizeof host);
            snprintf(peer, FR_HSGATE_PEER, "%s:%u", host, (unsigned)ntohs(a->sin6_port));
        } else {
            key[0] = AF_INET6;
            memcpy(key + 1, &a->sin6_addr, 16);
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            snprintf(peer, FR_HSGATE_PEER, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
        }
    } else if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        key[0] = AF_INET;
        memcpy(key + 1, &a->sin_addr, 4);
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(peer, FR_HSGATE_PEER, "%s:%u", host, (unsigned)ntohs(a->sin_port));
    } else {
        /* A unix socket has no address: its peer's user is the source. */
        struct ucred uc = { .pid = 0, .uid = (uid_t)-1 };
        socklen_t len = sizeof uc;
        (void)getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len);
        key[0] = AF_UNIX;
        memcpy(key + 1, &uc.uid, sizeof uc.uid);
        snprintf(peer, FR_HSGATE_PEER, "uid %u pid %d", (unsigned)uc.uid, (int)uc.pid);
    }
}

static gsrc **src_bucket(fr_hsgate *g, const uint8_t key[SRC_KEY])
{
    return &g->buckets[fr_hash64(key, SRC_KEY, 0) & (g->nbuckets - 1)];
}

static gsrc *src_find(fr_hsgate *g, const uint8_t key[SRC_KEY])
{
    for (gsrc *s = *src_bucket(g, key); s; s = s->hnext)
        if (memcmp(s->key, key, SRC_KEY) == 0)
            return s;
    return NULL;
}

/* The source with the most handshakes in flight; of those, the one whose
 * oldest is oldest. Only when the gate is full, so a scan will do. */
static gsrc *src_heaviest(fr_hsgate *g)
{
    gsrc *best = NULL;
    for (uint32_t i = 0; i < g->srcs_used; i++) {
        gsrc *s = &g->srcs[i];
        if (s->n > 0 && (!best || s->n > best->n ||
                         (s->n == best->n && s->head->deadline < best->head->deadline)))
            best = s;
    }
    return best;
}

/* ---- handshakes in flight --------------------------------------------------------- */

static void conn_interest(fr_hsgate *g, gconn *c, uint32_t events)
{
    if (c->events == events)
        return;
    struct epoll_event ev = { .events = events,
                              .data.u64 = ((uint64_t)c->gen << 32) | (uint64_t)(TOK_CONN + (c - g->slots)) };
    (void)epoll_ctl(g->epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->events = events;
}

/* Unlink c from every list and free its slot; the caller owns c->fd. */
static int conn_release(fr_hsgate *g, gconn *c)
{
    (void)epoll_ctl(g->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    *(c->prev ? &c->prev->next : &g->head) = c->next;
    *(c->next ? &c->next->prev : &g->tail) = c->prev;
    gsrc *s = c->src;
    *(c->sprev ? &c->sprev->snext : &s->head) = c->snext;
    *(c->snext ? &c->snext->sprev : &s->tail) = c->sprev;
    if (--s->n == 0) {
        gsrc **pp = src_bucket(g, s->key);
        while (*pp != s)
            pp = &(*pp)->hnext;
        *pp = s->hnext;
        s->hnext = g->free_src;
        g->free_src = s;
    }
    g->n--;
    atomic_store(&g->st_inflight, g->n);
    int fd = c->fd;
    c->fd = -1;
    c->gen++;
    c->next = g->free_conn;
    g->free_conn = c;
    return fd;
}

/* Drop a handshake that did not finish: log (rate-limited), count, close. */
static void conn_drop(fr_hsgate *g, gconn *c, int kind, int code, uint64_t now)
{
    if (kind == LOG_TIMEOUT)
        gate_log(g, kind, now, "dropped connection from %s: no AUTH within %llu ms of accept", c->peer,
                 (unsigned long long)(g->deadline_ns / 1000000u));
    else if (kind == LOG_SOURCE)
        gate_log(g, kind, now,
                 "dropped connection from %s: a newer one came from the same address, which had "
                 "%u handshakes in flight (the most one address may have)", c->peer, c->src->n);
    else if (kind == LOG_FULL)
        gate_log(g, kind, now,
                 "dropped connection from %s: %u handshakes were in flight (the most this listener "
                 "takes), and its address had the most of them (%u)", c->peer, g->n, c->src->n);
    else
        gate_log(g, kind, now, "refused connection from %s: %s", c->peer,
                 c->hs.why ? c->hs.why : ferry_strerror(code));
    if (kind == LOG_TIMEOUT || kind == LOG_SOURCE || kind == LOG_FULL)
        fr_hs_server_abort(&c->hs, c->fd, code);
    atomic_fetch_add(kind == LOG_TIMEOUT ? &g->st_timeout
                     : kind == LOG_REFUSED ? &g->st_refused : &g->st_displaced, 1);
    if (g->cfg.failed)
        g->cfg.failed(g->cfg.arg, code);
    close(conn_release(g, c));
}

/* The handshake on c can move: step it, then hand it over, drop it, or
 * wait for the socket again. */
static void conn_step(fr_hsgate *g, gconn *c, uint64_t now)
{
    int rc = fr_hs_server_step(&c->hs, c->fd, g->key, g->cfg.instance, g->cfg.role);
    if (rc == FR_HS_WANT_READ || rc == FR_HS_WANT_WRITE) {
        conn_interest(g, c, rc == FR_HS_WANT_READ ? EPOLLIN : EPOLLOUT);
        return;
    }
    if (rc < 0) {
        conn_drop(g, c, LOG_REFUSED, rc, now);
        return;
    }
    char peer[FR_HSGATE_PEER];
    memcpy(peer, c->peer, sizeof peer);
    fr_msg_auth auth = c->hs.auth;
    int fd = conn_release(g, c);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        gate_log(g, LOG_REFUSED, now, "refused connection from %s: cannot set up the socket", peer);
        close(fd);
        return;
    }
    atomic_fetch_add(&g->st_auth, 1);
    g->cfg.ready(g->cfg.arg, fd, &auth, peer);
}

/* Make room for one more handshake from key: displace that source's oldest
 * when it is at its cap, else the heaviest source's oldest when full. */
static void make_room(fr_hsgate *g, const uint8_t key[SRC_KEY], uint64_t now)
{
    gsrc *s = src_find(g, key);
    if (s && s->n >= g->max_per_source)
        conn_drop(g, s->head, LOG_SOURCE, FERRY_EAGAIN, now);
    else if (g->n >= g->max_inflight)
        conn_drop(g, src_heaviest(g)->head, LOG_FULL, FERRY_EAGAIN, now);
}

static void conn_admit(fr_hsgate *g, int fd, const struct sockaddr_storage *ss, uint64_t now)
{
    uint8_t key[SRC_KEY];
    char peer[FR_HSGATE_PEER];
    source_of(fd, ss, key, peer);
    make_room(g, key, now);
    gsrc *s = src_find(g, key);
    if (!s) {   /* sources never outnumber handshakes, so there is a free one */
        s = g->free_src ? g->free_src : &g->srcs[g->srcs_used++];
        if (s == g->free_src)
            g->free_src = s->hnext;
        memcpy(s->key, key, SRC_KEY);
        s->head = s->tail = NULL;
        gsrc **b = src_bucket(g, key);
        s->hnext = *b;
        *b = s;
    }
    gconn *c = g->free_conn ? g->free_conn : &g->slots[g->slots_used++];
    if (c == g->free_conn)
        g->free_conn = c->next;
    c->fd = fd;
    c->deadline = now + g->deadline_ns;
    c->src = s;
    c->events = 0;
    memcpy(c->peer, peer, sizeof peer);
    c->prev = g->tail;
    c->next = NULL;
    *(g->tail ? &g->tail->next : &g->head) = c;
    g->tail = c;
    c->sprev = s->tail;
    c->snext = NULL;
    *(s->tail ? &s->tail->snext : &s->head) = c;
    s->tail = c;
    s->n++;
    g->n++;
    atomic_store(&g->st_inflight, g->n);
    if (g->n > atomic_load(&g->st_peak))
        atomic_store(&g->st_peak, g->n);
    if (ss->ss_family != AF_UNIX) {
        const int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    fr_hs_server_init(&c->hs, g->cfg.instance);
    struct epoll_event ev = { .events = 0,
                              .data.u64 = ((uint64_t)c->gen << 32) | (uint64_t)(TOK_CONN + (c - g->slots)) };
    if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        c->hs.why = "cannot watch the socket";
        conn_drop(g, c, LOG_REFUSED, FERRY_EIO, now);
        return;
    }
    conn_step(g, c, now);   /* the challenge goes out at once */
}

/* ---- accepting --------------------------------------------------------------------- */

static void listen_interest(fr_hsgate *g, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.u64 = TOK_LISTEN };
    (void)epoll_ctl(g->epfd, EPOLL_CTL_MOD, g->lfd, &ev);
}

/* Accept what is waiting (a burst at most). false: the listener is broken. */
static bool accept_some(fr_hsgate *g, uint64_t now)
{
    for (int i = 0; i < ACCEPT_BURST; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(g->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            atomic_fetch_add(&g->st_accepted, 1);
            if (sl == 0 || sl > sizeof ss)
                ss.ss_family = AF_UNIX;
            conn_admit(g, fd, &ss, fr_now_ns());   /* its deadline counts from now */
            continue;
        }
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK)
            return true;
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
            /* The connection stays in the backlog and the listener stays
             * readable: stop watching it for a moment instead of spinning. */
            atomic_fetch_add(&g->st_accept_err, 1);
            gate_log(g, LOG_ACCEPT, now, "cannot accept: %s; pausing %d ms (%u handshakes in flight)",
                     strerror(e), PAUSE_MS, g->n);
            listen_interest(g, 0);
            g->paused_until = now + (uint64_t)PAUSE_MS * 1000000u;
            return true;
        }
        if (e == EINVAL || e == EBADF || e == ENOTSOCK || e == EFAULT) {
            FR_ERROR(g->tag, "accept failed: %s; no longer accepting", strerror(e));
            return false;
        }
        /* ECONNABORTED, EINTR, EPERM, and the network errors accept(2) says
         * to treat like EAGAIN (EPROTO, EOPNOTSUPP, ENETDOWN, ...): that one
         * connection only. */
    }
    return true;
}

/* ---- the loop ------------------------------------------------------------------------ */

static int wait_ms(const fr_hsgate *g, uint64_t now)
{
    uint64_t t = UINT64_MAX;
    if (g->head)
        t = g->head->deadline;
    if (g->paused_until && g->paused_until < t)
        t = g->paused_until;
    uint64_t l = gate_log_next(g);
    if (l < t)
        t = l;
    if (t == UINT64_MAX)
        return -1;
    if (t <= now)
        return 0;
    uint64_t ms = (t - now + 999999) / 1000000;
    /* asleep at most one default timeout: nothing depends on waking sooner */
    return ms > FERRY_DEFAULT_TIMEOUT_MS ? FERRY_DEFAULT_TIMEOUT_MS : (int)ms;
}

static void timers(fr_hsgate *g, uint64_t now)
{
    while (g->head && g->head->deadline <= now)   /* one deadline for all: oldest first */
        conn_drop(g, g->head, LOG_TIMEOUT, FERRY_ETIMEDOUT, now);
    if (g->paused_until && now >= g->paused_until) {
        g->paused_until = 0;
        listen_interest(g, EPOLLIN);
    }
    gate_log_flush(g, now);
}

int fr_hsgate_run(fr_hsgate *g)
{
    struct epoll_event evs[EVENTS];
    int rc = 0;
    bool stop = false;
    while (!stop) {
        int n = epoll_wait(g->epfd, evs, EVENTS, wait_ms(g, fr_now_ns()));
        if (n < 0 && errno != EINTR) {
            FR_ERROR(g->tag, "epoll_wait failed: %s; no longer accepting", strerror(errno));
            rc = FERRY_EIO;
            break;
        }
        uint64_t now = fr_now_ns();
        bool accept = false;
        for (int i = 0; i < n; i++) {
            uint64_t tok = evs[i].data.u64;
            uint32_t slot = (uint32_t)tok;
            if (slot == TOK_LISTEN) {
                accept = true;
            } else if (slot == TOK_WAKE || slot == TOK_STOP) {
                stop = true;
            } else {
                gconn *c = &g->slots[slot - TOK_CONN];
                if (c->fd >= 0 && c->gen == (uint32_t)(tok >> 32))
                    conn_step(g, c, now);
            }
        }
        if (stop)
            break;
        timers(g, now);
        /* Last, so that the connections it displaces had their turn. */
        if (accept && !accept_some(g, now)) {
            rc = FERRY_EIO;
            break;
        }
    }
    while (g->head)
        close(conn_release(g, g->head));
    return rc;
}

void fr_hsgate_stop(fr_hsgate *g)
{
    if (g) {
        uint64_t one = 1;
        (void)!write(g->wakefd, &one, sizeof one);
    }
}

void fr_hsgate_get_stats(fr_hsgate *g, fr_hsgate_stats *o)
{
    memset(o, 0, sizeof *o);
    o->accepted = atomic_load(&g->st_accepted);
    o->authenticated = atomic_load(&g->st_auth);
    o->refused = atomic_load(&g->st_refused);
    o->timed_out = atomic_load(&g->st_timeout);
    o->displaced = atomic_load(&g->st_displaced);
    o->accept_errors = atomic_load(&g->st_accept_err);
    o->inflight = atomic_load(&g->st_inflight);
    o->inflight_peak = atomic_load(&g->st_peak);
    o->max_inflight = g->max_inflight;
}

/* ---- open / close ---------------------------------------------------------------------- */

/* A quarter of the descriptor limit: the process keeps the rest for the
 * connections that did authenticate, its files and other listeners. */
static uint32_t fd_share(uint32_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
        return want;
    rlim_t q = rl.rlim_cur / 4;
    if (q < 1)
        q = 1;
    return q < want ? (uint32_t)q : want;
}

static int watch(int epfd, int fd, uint64_t tok)
{
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = tok };
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? FERRY_EIO : 0;
}

int fr_hsgate_open(const fr_hsgate_config *c, int lfd, fr_hsgate **out)
{
    *out = NULL;
    if (!c || !c->key || !c->ready || lfd < 0)
        return FERRY_EINVAL;
    fr_hsgate *g = fr_calloc(1, sizeof *g);
    if (!g)
        return FERRY_ENOMEM;
    g->cfg = *c;
    memcpy(g->key, c->key, sizeof g->key);
    snprintf(g->tag, sizeof g->tag, "%s", c->tag ? c->tag : "listen");
    g->lfd = lfd;
    g->epfd = g->wakefd = -1;
    g->deadline_ns = (uint64_t)(c->deadline_ms ? c->deadline_ms : FR_HSGATE_DEADLINE_MS) * 1000000u;
    uint32_t want = c->max_inflight ? c->max_inflight : FR_HSGATE_INFLIGHT;
    g->max_inflight = fd_share(want);
    if (g->max_inflight < want)
        FR_INFO(g->tag, "at most %u handshakes in flight (a quarter of the descriptor limit), not %u",
                g->max_inflight, want);
    g->max_per_source = c->max_per_source ? c->max_per_source : FR_HSGATE_PER_SOURCE;
    g->nbuckets = 1;
    while (g->nbuckets < g->max_inflight)
        g->nbuckets <<= 1;
    g->slots = fr_calloc(g->max_inflight, sizeof *g->slots);
    g->srcs = fr_calloc(g->max_inflight, sizeof *g->srcs);
    g->buckets = fr_calloc(g->nbuckets, sizeof *g->buckets);
    int rc = FERRY_ENOMEM;
    if (!g->slots || !g->srcs || !g->buckets)
        goto fail;
    rc = FERRY_EIO;
    int fl = fcntl(lfd, F_GETFL);
    if (fl < 0 || fcntl(lfd, F_SETFL, fl | O_NONBLOCK) < 0)
        goto fail;
    g->epfd = epoll_create1(EPOLL_CLOEXEC);
    g->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g->epfd < 0 || g->wakefd < 0 || watch(g->epfd, lfd, TOK_LISTEN) < 0 ||
        watch(g->epfd, g->wakefd, TOK_WAKE) < 0 ||
        (c->stop_fd >= 0 && watch(g->epfd, c->stop_fd, TOK_STOP) < 0))
        goto fail;
    *out = g;
    return 0;
fail:
    fr_hsgate_close(g);
    return rc;
}

void fr_hsgate_close(fr_hsgate *g)
{
    if (!g)
        return;
    while (g->head)   /* only when run was cut short by a fatal error */
        close(conn_release(g, g->head));
    if (g->epfd >= 0)
        close(g->epfd);
    if (g->wakefd >= 0)
        close(g->wakefd);
    fr_free(g->slots);
    fr_free(g->srcs);
    fr_free(g->buckets);
    fr_free(g);
}
