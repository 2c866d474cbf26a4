/* tcp transport, serving side: an accept thread runs every handshake in
 * flight (wire/hsgate.h: a deadline from accept, caps in flight and per
 * source address) and hands each authenticated connection to its own
 * thread, which serves requests strictly in order, receiving WRITE payloads
 * straight into the target region and sending READ data straight from it.
 * A strided request (WRITE_ROWS, READ_ROWS) is checked whole, first row to
 * last, before a byte moves; its rows travel packed and are scattered or
 * gathered with iovecs. */
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
#include "wire/hsgate.h"

typedef struct tcp_server tcp_server;

typedef struct srv_conn {
    tcp_server *srv;
    int fd;                    /* -1 once closed (srv->lock) */
    bool finished;             /* thread is done; join it (srv->lock) */
    pthread_t th;
    char peer[PEER_NAME];
    uint64_t peer_instance;    /* the client engine's instance, from its AUTH */
    struct srv_conn *next;
} srv_conn;

struct tcp_server {
    ferry_engine *e;
    int lfd;
    fr_hsgate *gate;           /* accepting and handshakes, on the acceptor */
    pthread_t acceptor;
    pthread_mutex_t lock;
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
    if (rc >= 0)
        FR_STAT_ADD(e, served_write_bytes, rw->len);
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
    if (rc >= 0)
        FR_STAT_ADD(e, served_read_bytes, rw->len);
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
    if (rc >= 0)
        FR_STAT_ADD(e, served_write_bytes, bytes);
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
    if (rc >= 0)
        FR_STAT_ADD(e, served_read_bytes, m.u.read_resp.len);
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
    srv_serve(sc->srv->e, sc, sc->peer_instance);
    /* Close under the lock so stop never shuts down a recycled fd. */
    pthread_mutex_lock(&sc->srv->lock);
    close(sc->fd);
    sc->fd = -1;
    sc->finished = true;
    pthread_mutex_unlock(&sc->srv->lock);
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

/* The gate's callback (on the acceptor): an authenticated stream gets its
 * own thread. Authenticated connections are not capped: they proved the
 * cluster token (docs/engine.md, "Listeners"). */
static void srv_ready(void *arg, int fd, const fr_msg_auth *auth, const char *peer)
{
    tcp_server *srv = arg;
    srv_reap(srv);
    srv_conn *sc = fr_calloc(1, sizeof *sc);
    if (!sc) {
        close(fd);
        return;
    }
    sc->srv = srv;
    sc->fd = fd;
    sc->peer_instance = auth->client_instance;
    snprintf(sc->peer, sizeof sc->peer, "%s", peer);
    FR_DEBUG(TAG, "serving stream %u from %s", (unsigned)auth->stream, peer);
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

static void srv_failed(void *arg, int code)
{
    tcp_server *srv = arg;
    FR_STAT_ADD(srv->e, auth_refused, 1);
    if (code == FERRY_EPROTO)
        FR_STAT_ADD(srv->e, frames_rejected, 1);
}

static void *acceptor_main(void *arg)
{
    tcp_server *srv = arg;
    (void)fr_hsgate_run(srv->gate);   /* a failure is logged */
    return NULL;
}

static int srv_listen(ferry_engine *e, tcp_server *srv, ferry_error *err)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    const int one = 1;

    int rc = fr_sock_parse_hostport(e->cfg.listen_addr, &ss, &sl);
    if (rc < 0)
        return fr_fail(err, rc, "bad listen address \"%s\" (want HOST:PORT or [V6]:PORT)", e->cfg.listen_addr);
    srv->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (srv->lfd < 0)
        return fr_fail(err, FERRY_EIO, "socket: %s", strerror(errno));
    (void)setsockopt(srv->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(srv->lfd, (struct sockaddr *)&ss, sl) < 0 || listen(srv->lfd, SOMAXCONN) < 0)
        return fr_fail(err, FERRY_EIO, "cannot listen on %s: %s", e->cfg.listen_addr, strerror(errno));
    sl = sizeof ss;
    if (getsockname(srv->lfd, (struct sockaddr *)&ss, &sl) < 0)
        return fr_fail(err, FERRY_EIO, "getsockname: %s", strerror(errno));
    fr_tcp_publish_endpoint(e, &ss);
    return 0;
}

int fr_tcp_start(ferry_engine *e, void **state, ferry_error *err)
{
    tcp_server *srv = fr_calloc(1, sizeof *srv);
    if (!srv)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    srv->e = e;
    srv->lfd = -1;
    pthread_mutex_init(&srv->lock, NULL);
    int rc = srv_listen(e, srv, err);
    if (rc == 0) {
        const fr_hsgate_config gc = {
            .tag = TAG, .key = e->auth_key, .instance = e->ep.instance,
            .role = FR_ROLE_TCP_STREAM,
            .deadline_ms = e->cfg.connect_timeout_ms > 0 ? (unsigned)e->cfg.connect_timeout_ms : 0,
            .stop_fd = -1, .ready = srv_ready, .failed = srv_failed, .arg = srv,
        };
        rc = fr_hsgate_open(&gc, srv->lfd, &srv->gate);
        if (rc < 0)
            fr_fail(err, rc, "cannot open the handshake gate: %s", ferry_strerror(rc));
    }
    if (rc == 0 && pthread_create(&srv->acceptor, NULL, acceptor_main, srv) != 0)
        rc = fr_fail(err, FERRY_ENOMEM, "cannot start the acceptor thread");
    if (rc < 0) {
        fr_hsgate_close(srv->gate);
        if (srv->lfd >= 0)
            close(srv->lfd);
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

    fr_hsgate_stop(srv->gate);
    pthread_join(srv->acceptor, NULL);   /* it closed the handshakes in flight */
    fr_hsgate_close(srv->gate);

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
    pthread_mutex_destroy(&srv->lock);
    fr_free(srv);
}
