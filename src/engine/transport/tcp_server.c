/* tcp transport, serving side: an accept thread hands every connection to
 * its own thread, which authenticates the peer and then serves requests
 * strictly in order, receiving WRITE payloads straight into the target region
 * and sending READ data straight from it. A strided request (WRITE_ROWS,
 * READ_ROWS) is checked whole, first row to last, before a byte moves; its
 * rows travel packed and are scattered or gathered with iovecs. */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "engine/transport/tcp_int.h"

typedef struct tcp_server tcp_server;

typedef struct srv_conn {
    tcp_server *srv;
    int fd;                    /* -1 once closed (srv->lock) */
    bool finished;             /* thread is done; join it (srv->lock) */
    pthread_t th;
    char peer[PEER_NAME];
    struct srv_conn *next;
} srv_conn;

struct tcp_server {
    ferry_engine *e;
    int lfd;
    pthread_t acceptor;
    pthread_mutex_t lock;
    pthread_cond_t cond;       /* cuts the acceptor's error back-off short at stop */
    bool stopping;
    srv_conn *conns;           /* every connection thread not yet joined */
};

static int srv_reply_ack(int fd, uint64_t req_id, int32_t status, uint64_t value)
{
    fr_msg m = { .type = FR_MSG_ACK };
    m.u.ack.status = status;
    m.u.ack.value = value;
    return fr_send_msg(fd, &m, req_id);
}

static int srv_write(ferry_engine *e, int fd, uint64_t req_id, const fr_msg_rw *rw)
{
    ferry_region *reg;
    uint8_t *ptr;

    int rc = fr_region_acquire(e, rw, FERRY_REMOTE_WRITE, &reg, &ptr);
    if (rc < 0) {
        /* Refused: swallow the payload so the stream stays in sync; the
         * target memory is never touched. */
        int drc = fr_drain(fd, rw->len);
        return drc < 0 ? drc : srv_reply_ack(fd, req_id, rc, 0);
    }
    rc = fr_read_full(fd, ptr, rw->len);
    fr_region_release(reg);
    return rc < 0 ? rc : srv_reply_ack(fd, req_id, 0, rw->len);
}

static int srv_read(ferry_engine *e, int fd, uint64_t req_id, const fr_msg_rw *rw)
{
    fr_msg m = { .type = FR_MSG_READ_RESP };
    ferry_region *reg;
    uint8_t *ptr;
    uint8_t hdr[HDR_CAP];

    int rc = fr_region_acquire(e, rw, FERRY_REMOTE_READ, &reg, &ptr);
    if (rc < 0) {
        m.u.read_resp.status = rc;
        return fr_send_msg(fd, &m, req_id);
    }
    m.u.read_resp.len = rw->len;
    int n = fr_wire_encode(&m, req_id, rw->len, hdr, sizeof hdr);
    if (n >= 0) {
        struct iovec iov[2] = { { hdr, (size_t)n }, { ptr, (size_t)rw->len } };
        rc = fr_writev_full(fd, iov, 2);
    } else {
        rc = n;
    }
    fr_region_release(reg);
    return rc;
}

/* The access a strided request makes, as a READ/WRITE of its extent: the
 * first row's start to the last row's end, inside the op's span (the
 * decoder checked that it neither wraps nor leaves the span). Checking it
 * before any byte moves refuses the whole request when any row is out. */
static fr_msg_rw rows_extent(const fr_msg_rows *r)
{
    return (fr_msg_rw){ .key = r->key, .addr = r->addr,
                        .len = ((uint64_t)r->rows - 1) * r->stride + r->len,
                        .span_addr = r->span_addr, .span_len = r->span_len };
}

static int srv_write_rows(ferry_engine *e, int fd, uint64_t req_id, const fr_msg_rows *r)
{
    const fr_msg_rw ext = rows_extent(r);
    const uint64_t bytes = fr_msg_rows_bytes(r);
    ferry_region *reg;
    uint8_t *ptr;

    int rc = fr_region_acquire(e, &ext, FERRY_REMOTE_WRITE, &reg, &ptr);
    if (rc < 0) {
        int drc = fr_drain(fd, bytes);
        return drc < 0 ? drc : srv_reply_ack(fd, req_id, rc, 0);
    }
    rc = fr_read_rows(fd, ptr, r->rows, r->len, r->stride);
    fr_region_release(reg);
    return rc < 0 ? rc : srv_reply_ack(fd, req_id, 0, bytes);
}

static int srv_read_rows(ferry_engine *e, int fd, uint64_t req_id, const fr_msg_rows *r)
{
    const fr_msg_rw ext = rows_extent(r);
    fr_msg m = { .type = FR_MSG_READ_RESP };
    ferry_region *reg;
    uint8_t *ptr;
    uint8_t hdr[HDR_CAP];

    int rc = fr_region_acquire(e, &ext, FERRY_REMOTE_READ, &reg, &ptr);
    if (rc < 0) {
        m.u.read_resp.status = rc;
        return fr_send_msg(fd, &m, req_id);
    }
    m.u.read_resp.len = fr_msg_rows_bytes(r);
    int n = fr_wire_encode(&m, req_id, m.u.read_resp.len, hdr, sizeof hdr);
    rc = n < 0 ? n : fr_write_rows(fd, hdr, (size_t)n, ptr, r->rows, r->len, r->stride);
    fr_region_release(reg);
    return rc;
}

/* Log why a served connection ends: corrupt input is a warning and counted;
 * a peer going away is routine. */
static void srv_drop(ferry_engine *e, const srv_conn *sc, int rc)
{
    if (rc == FERRY_EPROTO || rc == FERRY_EMSGSIZE) {
        FR_WARN(TAG, "dropping connection from %s: %s (%s)", sc->peer,
                rc == FERRY_EPROTO ? "corrupt frame" : "oversized frame", ferry_strerror(rc));
        FR_STAT_ADD(e, frames_rejected, 1);
    } else {
        FR_DEBUG(TAG, "connection from %s closed: %s", sc->peer, ferry_strerror(rc));
    }
}

static void srv_serve(ferry_engine *e, srv_conn *sc, uint64_t peer_instance)
{
    const int fd = sc->fd;

    for (;;) {
        fr_frame_hdr hdr;
        fr_msg m;
        int rc = fr_recv_msg(fd, &hdr, &m);
        if (rc < 0) {
            srv_drop(e, sc, rc);
            return;
        }
        switch (hdr.type) {
        case FR_MSG_WRITE:
            rc = srv_write(e, fd, hdr.req_id, &m.u.rw);
            break;
        case FR_MSG_READ:
            rc = srv_read(e, fd, hdr.req_id, &m.u.rw);
            break;
        case FR_MSG_WRITE_ROWS:
            rc = srv_write_rows(e, fd, hdr.req_id, &m.u.rows);
            break;
        case FR_MSG_READ_ROWS:
            rc = srv_read_rows(e, fd, hdr.req_id, &m.u.rows);
            break;
        case FR_MSG_NOTIFY:
            fr_notify_deliver(e, peer_instance, m.u.notify.tag, m.u.notify.value);
            rc = srv_reply_ack(fd, hdr.req_id, 0, 0);
            break;
        default:
            /* A well-formed frame that a client must never send here. */
            FR_WARN(TAG, "dropping connection from %s: unexpected message type %u", sc->peer,
                    (unsigned)hdr.type);
            FR_STAT_ADD(e, frames_rejected, 1);
            return;
        }
        if (rc < 0) {
            srv_drop(e, sc, rc);
            return;
        }
    }
}

static void *srv_conn_main(void *arg)
{
    srv_conn *sc = arg;
    tcp_server *srv = sc->srv;
    ferry_engine *e = srv->e;
    fr_msg_auth auth;

    fr_tcp_set_nodelay(sc->fd);
    fr_sock_peername(sc->fd, sc->peer, sizeof sc->peer);
    /* A client that connects and then says nothing must not hold a thread
     * forever: the handshake runs under the connect timeout. */
    int rc = fr_sock_timeouts(sc->fd, e->cfg.connect_timeout_ms);
    if (rc == 0)
        rc = fr_auth_server(e, sc->fd, FR_ROLE_TCP_STREAM, &auth);
    if (rc == 0)
        rc = fr_sock_timeouts(sc->fd, 0);
    if (rc == 0) {
        FR_DEBUG(TAG, "serving stream %u from %s", (unsigned)auth.stream, sc->peer);
        srv_serve(e, sc, auth.client_instance);
    }
    /* Close under the lock so stop never shuts down a recycled fd. */
    pthread_mutex_lock(&srv->lock);
    close(sc->fd);
    sc->fd = -1;
    sc->finished = true;
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

/* Join connection threads that have ended, so a long-lived server does not
 * accumulate them. Called by the acceptor only. */
static void srv_reap(tcp_server *srv)
{
    srv_conn *done = NULL;

    pthread_mutex_lock(&srv->lock);
    for (srv_conn **pp = &srv->conns; *pp;) {
        srv_conn *sc = *pp;
        if (!sc->finished) {
            pp = &sc->next;
            continue;
        }
        *pp = sc->next;
        sc->next = done;
        done = sc;
    }
    pthread_mutex_unlock(&srv->lock);
    while (done) {
        srv_conn *next = done->next;
        pthread_join(done->th, NULL);
        fr_free(done);
        done = next;
    }
}

static void srv_spawn(tcp_server *srv, int fd)
{
    srv_conn *sc = fr_calloc(1, sizeof *sc);
    if (!sc) {
        close(fd);
        return;
    }
    sc->srv = srv;
    sc->fd = fd;
    pthread_mutex_lock(&srv->lock);
    int rc = pthread_create(&sc->th, NULL, srv_conn_main, sc);
    if (rc == 0) {
        sc->next = srv->conns;
        srv->conns = sc;
    }
    pthread_mutex_unlock(&srv->lock);
    if (rc != 0) {
        FR_WARN(TAG, "cannot start a connection thread: %s", strerror(rc));
        close(fd);
        fr_free(sc);
    }
}

/* true: stop accepting. Out of descriptors or memory, back off briefly
 * (woken early by stop) rather than spin on a connection we cannot take. */
static bool acceptor_error(tcp_server *srv, int err)
{
    bool stop;

    pthread_mutex_lock(&srv->lock);
    stop = srv->stopping;
    if (!stop && (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM)) {
        FR_WARN(TAG, "accept: %s; backing off", strerror(err));
        struct timespec ts = fr_timespec_at(fr_deadline_ns(100));
        pthread_cond_timedwait(&srv->cond, &srv->lock, &ts);
        stop = srv->stopping;
    } else if (!stop && err != EINTR && err != ECONNABORTED && err != EPROTO &&
               err != EPERM && err != ENETDOWN && err != ENONET && err != EHOSTUNREACH &&
               err != ENETUNREACH && err != EHOSTDOWN && err != ENOPROTOOPT && err != EOPNOTSUPP) {
        FR_ERROR(TAG, "accept failed: %s; no longer accepting", strerror(err));
        stop = true;
    }
    pthread_mutex_unlock(&srv->lock);
    return stop;
}

static void *acceptor_main(void *arg)
{
    tcp_server *srv = arg;

    for (;;) {
        int fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (acceptor_error(srv, errno))
                break;
            continue;
        }
        srv_reap(srv);
        srv_spawn(srv, fd);
    }
    return NULL;
}

static int srv_listen(ferry_engine *e, tcp_server *srv)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    const int one = 1;

    int rc = fr_sock_parse_hostport(e->cfg.listen_addr, &ss, &sl);
    if (rc < 0) {
        FR_ERROR(TAG, "bad listen address \"%s\" (want HOST:PORT or [V6]:PORT)", e->cfg.listen_addr);
        return rc;
    }
    srv->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (srv->lfd < 0) {
        FR_ERROR(TAG, "socket: %s", strerror(errno));
        return FERRY_EIO;
    }
    (void)setsockopt(srv->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(srv->lfd, (struct sockaddr *)&ss, sl) < 0 || listen(srv->lfd, SOMAXCONN) < 0) {
        FR_ERROR(TAG, "cannot listen on %s: %s", e->cfg.listen_addr, strerror(errno));
        return FERRY_EIO;
    }
    sl = sizeof ss;
    if (getsockname(srv->lfd, (struct sockaddr *)&ss, &sl) < 0)
        return FERRY_EIO;
    fr_tcp_publish_endpoint(e, &ss);
    return 0;
}

int fr_tcp_start(ferry_engine *e, void **state)
{
    tcp_server *srv = fr_calloc(1, sizeof *srv);
    if (!srv)
        return FERRY_ENOMEM;
    srv->e = e;
    srv->lfd = -1;
    pthread_mutex_init(&srv->lock, NULL);
    int rc = fr_cond_init_monotonic(&srv->cond);
    if (rc < 0) {
        pthread_mutex_destroy(&srv->lock);
        fr_free(srv);
        return rc;
    }
    rc = srv_listen(e, srv);
    if (rc == 0 && pthread_create(&srv->acceptor, NULL, acceptor_main, srv) != 0)
        rc = FERRY_ENOMEM;
    if (rc < 0) {
        if (srv->lfd >= 0)
            close(srv->lfd);
        pthread_cond_destroy(&srv->cond);
        pthread_mutex_destroy(&srv->lock);
        fr_free(srv);
        return rc;
    }
    FR_DEBUG(TAG, "listening on %s", e->address);
    *state = srv;
    return 0;
}

void fr_tcp_stop(void *state)
{
    tcp_server *srv = state;
    if (!srv)
        return;

    pthread_mutex_lock(&srv->lock);
    srv->stopping = true;
    pthread_cond_broadcast(&srv->cond);
    pthread_mutex_unlock(&srv->lock);
    /* On Linux, shutting a listener down makes a blocked accept() return. */
    shutdown(srv->lfd, SHUT_RDWR);
    pthread_join(srv->acceptor, NULL);

    /* The acceptor is gone, so the list only loses fds from here on. */
    pthread_mutex_lock(&srv->lock);
    for (srv_conn *sc = srv->conns; sc; sc = sc->next)
        if (sc->fd >= 0)
            shutdown(sc->fd, SHUT_RDWR);
    pthread_mutex_unlock(&srv->lock);
    while (srv->conns) {
        srv_conn *sc = srv->conns;
        srv->conns = sc->next;
        pthread_join(sc->th, NULL);
        fr_free(sc);
    }
    close(srv->lfd);
    pthread_cond_destroy(&srv->cond);
    pthread_mutex_destroy(&srv->lock);
    fr_free(srv);
}
