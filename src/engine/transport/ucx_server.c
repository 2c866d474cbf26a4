/* ucx transport, the engine's side: the UCP context and worker, the
 * progress thread, memory mapping, and the control listener.
 *
 * The control listener is a tcp socket next to the engine's own, behind
 * the same authenticated handshake (wire/hsgate.h, role FR_ROLE_UCX_CTRL).
 * Only a client that proved the cluster token is sent this worker's UCX
 * address; after that the connection carries NOTIFY frames (answered by
 * ACK, like the tcp transport's) and tells each side when the other is
 * gone. Puts and gets never touch it: they are one-sided UCX operations on
 * the memory mapped here. */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <stdarg.h>
#include <unistd.h>

#include <ucs/debug/log_def.h>

#include "engine/transport/ucx_int.h"

typedef struct ucx_srv_conn {
    ucx_state *st;
    int fd;                    /* -1 once closed (st->lock) */
    bool finished;
    pthread_t th;
    uint64_t peer_instance;
    char peer[FR_HSGATE_PEER];
    struct ucx_srv_conn *next;
} ucx_srv_conn;

int fr_ucx_code(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return 0;
    case UCS_ERR_CANCELED:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
        return FERRY_ECONNRESET;
    case UCS_ERR_NO_MEMORY: return FERRY_ENOMEM;
    case UCS_ERR_TIMED_OUT: return FERRY_ETIMEDOUT;
    default: return FERRY_EIO;
    }
}

void fr_ucx_wake(ucx_state *st)
{
    uint64_t one = 1;
    ssize_t r = write(st->wake_fd, &one, sizeof one);
    (void)r;   /* a full counter still wakes the reader */
}

void fr_ucx_batch_finished(ucx_batch *b)
{
    ucx_state *st = b->st;
    pthread_mutex_lock(&st->lock);
    b->next = st->done;
    st->done = b;
    pthread_mutex_unlock(&st->lock);
    fr_ucx_wake(st);
}

void fr_ucx_abandoned_add(ucx_state *st, ucx_batch *b)
{
    pthread_mutex_lock(&st->lock);
    b->live_prev = NULL;
    b->live_next = st->abandoned;
    if (st->abandoned)
        st->abandoned->live_prev = b;
    st->abandoned = b;
    pthread_mutex_unlock(&st->lock);
}

void fr_ucx_abandoned_del(ucx_state *st, ucx_batch *b)
{
    pthread_mutex_lock(&st->lock);
    if (b->live_prev)
        b->live_prev->live_next = b->live_next;
    else
        st->abandoned = b->live_next;
    if (b->live_next)
        b->live_next->live_prev = b->live_prev;
    pthread_mutex_unlock(&st->lock);
}

/* ---- progress thread ------------------------------------------------------ */

static void complete_done(ucx_state *st)
{
    pthread_mutex_lock(&st->lock);
    ucx_batch *b = st->done;
    st->done = NULL;
    pthread_mutex_unlock(&st->lock);
    while (b) {
        ucx_batch *next = b->next;
        fr_ucx_batch_complete(b);
        b = next;
    }
}

/* Per connection: fail what must fail, send what is queued, and let go of
 * one that is closing once nothing of it is outstanding. Only this thread
 * removes connections, so a snapshot of the list stays valid. Locks: never
 * st->lock and a connection's lock at once. */
static void service_conns(ucx_state *st)
{
    ucx_conn **snap = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&st->lock);
    for (ucx_conn *c = st->conns; c; c = c->next) {
        if (fr_grow((void **)&snap, &cap, n + 1, sizeof *snap) < 0)
            break;   /* out of memory: the rest wait for the next round */
        snap[n++] = c;
    }
    bool more = n > 0 && snap[n - 1]->next;
    pthread_mutex_unlock(&st->lock);
    for (size_t i = 0; i < n; i++) {
        ucx_conn *c = snap[i];
        pthread_mutex_lock(&c->lock);
        if (atomic_load(&c->ep_err))
            c->failed = true;
        bool fail = (c->failed || c->closing) && !c->ep_closed;
        bool out = c->out_len > c->out_off && !c->failed;
        pthread_mutex_unlock(&c->lock);
        if (fail)
            fr_ucx_conn_fail(c, FERRY_ECONNRESET);
        else if (out)
            fr_ucx_conn_flush_out(c);
        complete_done(st);
        pthread_mutex_lock(&c->lock);
        bool release = c->closing && c->ep_closed && c->batches == 0;
        pthread_mutex_unlock(&c->lock);
        if (!release)
            continue;
        (void)epoll_ctl(st->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        pthread_mutex_lock(&st->lock);
        for (ucx_conn **pp = &st->conns; *pp; pp = &(*pp)->next)
            if (*pp == c) {
                *pp = c->next;
                break;
            }
        pthread_mutex_unlock(&st->lock);
        pthread_mutex_lock(&c->lock);
        c->released = true;    /* disconnect() frees it from here on */
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
    }
    fr_free(snap);
    if (more)
        fr_ucx_wake(st);
}

static void *progress_main(void *arg)
{
    ucx_state *st = arg;
    struct epoll_event ev[16];
    for (;;) {
        unsigned moved = 0, k;
        while ((k = ucp_worker_progress(st->worker)) != 0)
            moved += k;
        complete_done(st);
        service_conns(st);
        pthread_mutex_lock(&st->lock);
        bool stop = st->stopping && !st->conns;
        pthread_mutex_unlock(&st->lock);
        if (stop)
            break;
        ucs_status_t s = ucp_worker_arm(st->worker);
        if (s == UCS_ERR_BUSY && moved)
            continue;   /* events arrived meanwhile: progress again before sleeping */
        /* Busy without progress: UCX has sends waiting for room at a peer
         * that does not drain (a stopped process over shared memory, which
         * has no event for "room again"). Poll every millisecond rather
         * than spin a core. */
        int n = epoll_wait(st->epfd, ev, 16, s == UCS_OK ? -1 : 1);
        for (int i = 0; i < n; i++) {
            void *who = ev[i].data.ptr;
            if (who == &st->wake_fd) {
                uint64_t v;
                ssize_t r = read(st->wake_fd, &v, sizeof v);
                (void)r;
            } else if (who != &st->worker_fd) {
                fr_ucx_conn_io(who, ev[i].events);
            }
        }
    }
    complete_done(st);
    return NULL;
}

int fr_ucx_attach(ucx_state *st, ucx_conn *c)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    pthread_mutex_lock(&st->lock);
    int rc = st->stopping ? FERRY_ECANCELED : 0;
    if (rc == 0 && epoll_ctl(st->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0)
        rc = FERRY_EIO;
    if (rc == 0) {
        c->next = st->conns;
        st->conns = c;
    }
    pthread_mutex_unlock(&st->lock);
    fr_ucx_wake(st);
    return rc;
}

/* ---- memory -------------------------------------------------------------- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23   /* Linux 5.14 */
#endif

/* Pre-fault memory UCX allocated, by madvise alone: its shared-memory file
 * may sit on a tmpfs smaller than len (a container's /dev/shm), where
 * touching a page past the limit is SIGBUS; populating fails instead
 * (false), and so does a kernel without MADV_POPULATE_WRITE. */
static bool populate(uint8_t *p, size_t len)
{
    const size_t slice = 16u << 20;
    for (size_t off = 0; off < len; off += slice)
        if (madvise(p + off, len - off < slice ? len - off : slice, MADV_POPULATE_WRITE) != 0)
            return false;
    return true;
}

/* An engine on ucx talks to every peer through UCX: memory UCX allocated
 * itself (ucp_mem_map with UCP_MEM_MAP_ALLOCATE, the way ucx_perftest
 * allocates) is what its shared-memory transports let a peer map and copy
 * into directly; user memory goes through cma or a bounce copy at the
 * target. */
int fr_ucx_mem_alloc(void *state, size_t len, void **addr, void **handle)
{
    ucx_state *st = state;
    /* UCX puts such memory in a file of its posix directory: where that
     * tmpfs cannot hold it (a container's 64 MiB /dev/shm), UCX would log
     * an error on stdout — where ferry's processes print their protocol
     * lines — and hand back memory no peer can map; memfd memory then. */
    const char *dir = getenv("UCX_POSIX_DIR");
    struct statvfs fs;
    if (statvfs(dir && *dir ? dir : "/dev/shm", &fs) != 0 ||
        (uint64_t)fs.f_bavail * fs.f_frsize < (uint64_t)len + ((uint64_t)len >> 4))
        return FERRY_ENOTSUP;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL, .length = len, .flags = UCP_MEM_MAP_ALLOCATE,
    };
    ucp_mem_h mh;
    ucs_status_t s = ucp_mem_map(st->ctx, &mp, &mh);
    if (s != UCS_OK) {
        FR_ERROR(UCX_TAG, "cannot allocate %zu bytes: %s", len, ucs_status_string(s));
        return FERRY_ENOMEM;
    }
    ucp_mem_attr_t at = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    s = ucp_mem_query(mh, &at);
    if (s != UCS_OK || !at.address || at.length < len) {
        FR_ERROR(UCX_TAG, "UCX allocated %zu bytes it cannot describe: %s", len, ucs_status_string(s));
        (void)ucp_mem_unmap(st->ctx, mh);
        return FERRY_EIO;
    }
    if (!populate(at.address, len)) {
        FR_DEBUG(UCX_TAG, "UCX's allocation of %zu bytes cannot be populated (%s): memfd memory instead", len,
                 strerror(errno));
        (void)ucp_mem_unmap(st->ctx, mh);
        return FERRY_ENOMEM;
    }
    *addr = at.address;
    *handle = mh;
    return 0;
}

void fr_ucx_mem_free(void *state, void *handle)
{
    ucx_state *st = state;
    (void)ucp_mem_unmap(st->ctx, handle);
}

int fr_ucx_region_map(void *state, ferry_region *r, void *alloc_handle, ferry_error *err)
{
    ucx_state *st = state;
    ucp_mem_h mh = alloc_handle;
    ucs_status_t s = UCS_OK;
    if (!mh) {
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            .address = r->addr, .length = r->len,
        };
        s = ucp_mem_map(st->ctx, &mp, &mh);
    }
    if (s != UCS_OK)
        return fr_fail(err, fr_ucx_code(s) == FERRY_ENOMEM ? FERRY_ENOMEM : FERRY_EIO,
                       "cannot map %llu bytes at %p for remote access: %s", (unsigned long long)r->len,
                       (void *)r->addr, ucs_status_string(s));
    void *rk;
    size_t rkl;
    s = ucp_rkey_pack(st->ctx, mh, &rk, &rkl);
    int rc = 0;
    if (s != UCS_OK) {
        rc = fr_fail(err, FERRY_EIO, "cannot pack the remote key of a region: %s", ucs_status_string(s));
    } else if (rkl > FR_DESC_RKEY_MAX || !fr_ucx_rkey_ok(rk, rkl)) {
        rc = fr_fail(err, FERRY_ENOSPC, "UCX packed a %zu-byte remote key; a descriptor carries at most %u bytes "
                     "of UCX's layout (restrict UCX_TLS to fewer transports)", rkl, FR_DESC_RKEY_MAX);
    } else {
        memcpy(r->rkey, rk, rkl);
        r->rkey_len = (uint16_t)rkl;
        r->tp_handle = alloc_handle ? NULL : mh;   /* an allocation's mapping is the allocation's */
    }
    if (s == UCS_OK)
        ucp_rkey_buffer_release(rk);
    if (rc < 0 && !alloc_handle)
        (void)ucp_mem_unmap(st->ctx, mh);
    return rc;
}

void fr_ucx_region_unmap(void *state, ferry_region *r)
{
    ucx_state *st = state;
    if (r->tp_handle)
        (void)ucp_mem_unmap(st->ctx, r->tp_handle);
    r->tp_handle = NULL;
    r->rkey_len = 0;
}

/* ---- control listener ------------------------------------------------------ */

static int srv_ack(int fd, uint64_t req_id)
{
    fr_msg m = {.type = FR_MSG_ACK};
    return fr_send_msg(fd, &m, req_id);
}

/* A region by key for a peer that has its key but not its descriptor:
 * READ_RESP carrying base u64, length u64, flags u32 and the rkey, or
 * FERRY_EACCES and nothing when there is no such remote-accessible region. */
static int srv_describe(ucx_srv_conn *sc, uint64_t req_id, uint64_t key)
{
    fr_import imp;
    fr_msg m = {.type = FR_MSG_READ_RESP};
    uint8_t out[FR_WIRE_HDR_LEN + 64 + 20 + FR_DESC_RKEY_MAX];
    int rc = fr_region_rkey_info(sc->st->e, key, &imp);
    if (rc < 0) {
        m.u.read_resp.status = rc;
        return fr_send_msg(sc->fd, &m, req_id);
    }
    m.u.read_resp.len = 20 + (uint64_t)imp.rkey_len;
    int k = fr_wire_encode(&m, req_id, m.u.read_resp.len, out, sizeof out - 20 - FR_DESC_RKEY_MAX);
    if (k < 0)
        return k;
    uint8_t *d = out + k;
    for (int i = 0; i < 8; i++) {
        d[i] = (uint8_t)(imp.base >> (8 * i));
        d[8 + i] = (uint8_t)(imp.len >> (8 * i));
    }
    for (int i = 0; i < 4; i++)
        d[16 + i] = (uint8_t)(imp.flags >> (8 * i));
    memcpy(d + 20, imp.rkey, imp.rkey_len);
    return fr_write_full(sc->fd, out, (size_t)k + 20 + imp.rkey_len);
}

/* After the handshake: this worker's address (u32 length, bytes), then
 * NOTIFY frames until the client goes away. */
static void srv_serve(ucx_srv_conn *sc)
{
    ucx_state *st = sc->st;
    ferry_engine *e = st->e;
    uint8_t len[4];
    for (int i = 0; i < 4; i++)
        len[i] = (uint8_t)(st->addr_len >> (8 * i));
    if (fr_write_full(sc->fd, len, 4) < 0 || fr_write_full(sc->fd, st->addr, st->addr_len) < 0)
        return;
    atomic_fetch_add(&st->addrs_sent, 1);
    for (;;) {
        fr_frame_hdr hdr;
        fr_msg m;
        int rc = fr_recv_msg(sc->fd, &hdr, &m);
        if (rc == FERRY_EPROTO || rc == FERRY_EMSGSIZE) {
            FR_WARN(UCX_TAG, "dropping control connection from %s: %s", sc->peer, ferry_strerror(rc));
            FR_STAT_ADD(e, frames_rejected, 1);
            return;
        }
        if (rc < 0)
            return;   /* the peer went away */
        if (hdr.type == FR_MSG_MAP) {   /* here: describe a region by key (ucx.c, key lookups) */
            if (srv_describe(sc, hdr.req_id, m.u.map.key) < 0)
                return;
            continue;
        }
        if (hdr.type != FR_MSG_NOTIFY) {
            FR_WARN(UCX_TAG, "dropping control connection from %s: unexpected message type %u", sc->peer,
                    (unsigned)hdr.type);
            FR_STAT_ADD(e, frames_rejected, 1);
            return;
        }
        fr_notify_deliver(e, sc->peer_instance, m.u.notify.tag, m.u.notify.value);
        if (srv_ack(sc->fd, hdr.req_id) < 0)
            return;
    }
}

static void *srv_main(void *arg)
{
    ucx_srv_conn *sc = arg;
    srv_serve(sc);
    pthread_mutex_lock(&sc->st->lock);
    close(sc->fd);
    sc->fd = -1;
    sc->finished = true;
    pthread_mutex_unlock(&sc->st->lock);
    return NULL;
}

static void srv_reap(ucx_state *st, bool all)
{
    ucx_srv_conn *done = NULL;
    pthread_mutex_lock(&st->lock);
    for (ucx_srv_conn **pp = &st->srv_conns; *pp;) {
        ucx_srv_conn *sc = *pp;
        if (!all && !sc->finished) {
            pp = &sc->next;
            continue;
        }
        if (sc->fd >= 0)
            shutdown(sc->fd, SHUT_RDWR);
        *pp = sc->next;
        sc->next = done;
        done = sc;
    }
    pthread_mutex_unlock(&st->lock);
    while (done) {
        ucx_srv_conn *next = done->next;
        pthread_join(done->th, NULL);
        fr_free(done);
        done = next;
    }
}

static void srv_ready(void *arg, int fd, const fr_msg_auth *auth, const char *peer)
{
    ucx_state *st = arg;
    srv_reap(st, false);
    ucx_srv_conn *sc = fr_calloc(1, sizeof *sc);
    if (!sc) {
        close(fd);
        return;
    }
    sc->st = st;
    sc->fd = fd;
    sc->peer_instance = auth->client_instance;
    snprintf(sc->peer, sizeof sc->peer, "%s", peer);
    pthread_mutex_lock(&st->lock);
    int rc = pthread_create(&sc->th, NULL, srv_main, sc);
    if (rc == 0) {
        sc->next = st->srv_conns;
        st->srv_conns = sc;
    }
    pthread_mutex_unlock(&st->lock);
    if (rc != 0) {
        FR_WARN(UCX_TAG, "cannot start a control connection thread: %s", strerror(rc));
        close(fd);
        fr_free(sc);
    }
}

static void srv_failed(void *arg, int code)
{
    ucx_state *st = arg;
    FR_STAT_ADD(st->e, auth_refused, 1);
    if (code == FERRY_EPROTO)
        FR_STAT_ADD(st->e, frames_rejected, 1);
}

static void *acceptor_main(void *arg)
{
    ucx_state *st = arg;
    (void)fr_hsgate_run(st->gate);
    return NULL;
}

/* Listen on the engine's listen host, any port; publish it. */
static int listen_ctrl(ucx_state *st, ferry_error *err)
{
    ferry_engine *e = st->e;
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = fr_sock_parse_hostport(e->cfg.listen_addr, &ss, &sl);
    if (rc < 0)
        return fr_fail(err, rc, "bad listen address \"%s\" (want HOST:PORT or [V6]:PORT)", e->cfg.listen_addr);
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    st->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (st->lfd < 0)
        return fr_fail(err, FERRY_EIO, "socket: %s", strerror(errno));
    if (bind(st->lfd, (struct sockaddr *)&ss, sl) < 0 || listen(st->lfd, SOMAXCONN) < 0)
        return fr_fail(err, FERRY_EIO, "cannot listen for ucx control connections: %s", strerror(errno));
    sl = sizeof ss;
    if (getsockname(st->lfd, (struct sockaddr *)&ss, &sl) < 0)
        return fr_fail(err, FERRY_EIO, "getsockname: %s", strerror(errno));
    e->ep.ucx_port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                   : ((struct sockaddr_in6 *)&ss)->sin6_port);
    const fr_hsgate_config gc = {
        .tag = UCX_TAG, .key = e->auth_key, .instance = e->ep.instance, .role = FR_ROLE_UCX_CTRL,
        .deadline_ms = e->cfg.connect_timeout_ms > 0 ? (unsigned)e->cfg.connect_timeout_ms : 0,
        .stop_fd = -1, .ready = srv_ready, .failed = srv_failed, .arg = st,
    };
    rc = fr_hsgate_open(&gc, st->lfd, &st->gate);
    if (rc < 0)
        return fr_fail(err, rc, "cannot open the handshake gate: %s", ferry_strerror(rc));
    if (pthread_create(&st->acceptor, NULL, acceptor_main, st) != 0)
        return fr_fail(err, FERRY_ENOMEM, "cannot start the acceptor thread");
    st->has_acceptor = true;
    return 0;
}

/* ---- start / stop ------------------------------------------------------------ */

static int open_worker(ucx_state *st, ferry_error *err)
{
    ucp_config_t *cfg;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);   /* UCX_TLS, UCX_NET_DEVICES, ... */
    if (s != UCS_OK)
        return fr_fail(err, FERRY_EINVAL, "cannot read the UCX configuration: %s", ucs_status_string(s));
    /* UCX's own keepalive off unless UCX_KEEPALIVE_INTERVAL says otherwise:
     * ferry's control connection and ticket deadlines already notice a dead
     * or stalled peer, and over UCX 1.13's tcp transport the keepalive's
     * EP_CHECK message makes the receiver open a new connection back to its
     * sender to answer; when the sender has just closed its endpoint or is
     * exiting, that connect is refused and UCX aborts the process now and
     * then (an assertion in tcp_ep.c, seen in CI after a peer reset). */
    if (!getenv("UCX_KEEPALIVE_INTERVAL")) {
        s = ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "inf");
        if (s != UCS_OK)
            FR_DEBUG(UCX_TAG, "cannot turn UCX's keepalive off: %s", ucs_status_string(s));
    }
    ucp_params_t pp = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 1,
    };
    s = ucp_init(&pp, cfg, &st->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        st->ctx = NULL;
        return fr_fail(err, FERRY_EIO, "cannot initialise UCX: %s (check UCX_TLS / UCX_NET_DEVICES)",
                       ucs_status_string(s));
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_MULTI};
    s = ucp_worker_create(st->ctx, &wp, &st->worker);
    if (s != UCS_OK) {
        st->worker = NULL;
        return fr_fail(err, FERRY_EIO, "cannot create a UCX worker: %s", ucs_status_string(s));
    }
    s = ucp_worker_get_address(st->worker, &st->addr, &st->addr_len);
    if (s == UCS_OK && st->addr_len > UCX_ADDR_MAX)
        s = UCS_ERR_EXCEEDS_LIMIT;
    if (s == UCS_OK)
        s = ucp_worker_get_efd(st->worker, &st->worker_fd);
    if (s != UCS_OK)
        return fr_fail(err, FERRY_EIO, "cannot set up the UCX worker: %s", ucs_status_string(s));
    return 0;
}

static int open_events(ucx_state *st, ferry_error *err)
{
    st->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    st->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (st->wake_fd < 0 || st->epfd < 0)
        return fr_fail(err, FERRY_EIO, "cannot create the progress thread's events: %s", strerror(errno));
    struct epoll_event w = {.events = EPOLLIN, .data.ptr = &st->wake_fd};
    struct epoll_event u = {.events = EPOLLIN, .data.ptr = &st->worker_fd};
    if (epoll_ctl(st->epfd, EPOLL_CTL_ADD, st->wake_fd, &w) < 0 ||
        epoll_ctl(st->epfd, EPOLL_CTL_ADD, st->worker_fd, &u) < 0)
        return fr_fail(err, FERRY_EIO, "epoll_ctl: %s", strerror(errno));
    if (pthread_create(&st->progress, NULL, progress_main, st) != 0)
        return fr_fail(err, FERRY_ENOMEM, "cannot start the progress thread");
    st->has_progress = true;
    return 0;
}

/* UCX's own log lines through ferry's log (stderr or the embedding
 * program's callback, with time, level and the "ucx" subsystem). UCX
 * prints to stdout by default, where ferry's processes print their
 * protocol lines (READY, results, JSON): one UCX warning there broke the
 * reading of a demo worker's result line. */
static ucs_log_func_rc_t ucx_log(const char *file, unsigned line, const char *function,
                                 ucs_log_level_t level, const ucs_log_component_config_t *comp,
                                 const char *fmt, va_list ap)
{
    (void)function;
    (void)comp;
    enum ferry_log_level l = level <= UCS_LOG_LEVEL_ERROR ? FERRY_LOG_ERROR
                             : level == UCS_LOG_LEVEL_WARN ? FERRY_LOG_WARN
                             : level <= UCS_LOG_LEVEL_INFO ? FERRY_LOG_INFO : FERRY_LOG_DEBUG;
    if (!fr_log_on(l))
        return UCS_LOG_FUNC_RC_STOP;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const char *base = strrchr(file, '/');
    fr_log(l, UCX_TAG, "UCX %s:%u: %s", base ? base + 1 : file, line, msg);
    return UCS_LOG_FUNC_RC_STOP;
}

static void ucx_log_install(void) { ucs_log_push_handler(ucx_log); }

int fr_ucx_start(ferry_engine *e, void **state, ferry_error *err)
{
    int rc = fr_ucx_load(err);   /* the first ucx engine of the process loads UCX */
    if (rc < 0)
        return rc;
    static pthread_once_t log_once = PTHREAD_ONCE_INIT;
    pthread_once(&log_once, ucx_log_install);
    ucx_state *st = fr_calloc(1, sizeof *st);
    if (!st)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    st->e = e;
    st->lfd = st->wake_fd = st->epfd = -1;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cond, NULL);
    rc = open_worker(st, err);
    if (rc == 0)
        rc = open_events(st, err);
    if (rc == 0)
        rc = listen_ctrl(st, err);
    *state = st;   /* stop() undoes whatever part succeeded */
    if (rc < 0)
        return rc;
    e->ep.transports |= FR_TRANSPORT_UCX;
    FR_DEBUG(UCX_TAG, "worker up, %zu-byte address, control port %u", st->addr_len, (unsigned)e->ep.ucx_port);
    return 0;
}

void fr_ucx_stop(void *state)
{
    ucx_state *st = state;
    if (!st)
        return;
    ferry_engine *e = st->e;
    if (st->has_acceptor) {
        fr_hsgate_stop(st->gate);
        pthread_join(st->acceptor, NULL);
    }
    fr_hsgate_close(st->gate);
    srv_reap(st, true);
    if (st->lfd >= 0)
        close(st->lfd);
    if (st->has_progress) {
        pthread_mutex_lock(&st->lock);
        st->stopping = true;
        pthread_mutex_unlock(&st->lock);
        fr_ucx_wake(st);
        pthread_join(st->progress, NULL);
    }
    /* Regions still registered give their UCX mappings back before the
     * context goes, and so do the allocations UCX made (ferry_mem_alloc);
     * the engine frees the regions and allocations themselves later. */
    fr_mem_transport_stopping(e, FR_TP_UCX);
    e->tp_state[FR_TP_UCX] = NULL;
    if (st->addr)
        ucp_worker_release_address(st->worker, st->addr);
    if (st->worker)
        ucp_worker_destroy(st->worker);
    /* No callback can come any more: what UCX never finished is ours. */
    while (st->abandoned) {
        ucx_batch *b = st->abandoned;
        st->abandoned = b->live_next;
        fr_free(b->chunks);
        fr_free(b->slots);
        fr_free(b);
    }
    if (st->ctx)
        ucp_cleanup(st->ctx);
    if (st->epfd >= 0)
        close(st->epfd);
    if (st->wake_fd >= 0)
        close(st->wake_fd);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cond);
    e->ep.transports &= ~FR_TRANSPORT_UCX;
    fr_free(st);
}
