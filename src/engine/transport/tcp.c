/* tcp transport: one-sided READ/WRITE/NOTIFY over authenticated TCP streams.
 * This file is the initiator side and the ops table; the serving side is in
 * tcp_server.c, addresses in tcp_addr.c.
 *
 * Initiator side: a connection to a peer is cfg.tcp_streams TCP streams. Each
 * stream has a send queue drained by a sender thread and an in-flight FIFO
 * matched by a receiver thread; the server answers in order, so a reply
 * always belongs to the head of the in-flight FIFO.
 *
 * Chunk ownership (why every chunk completes exactly once): a chunk is in
 * exactly one of a stream's queue, its in-flight FIFO, its held list, or the
 * hands of the one thread that unlinked it under the stream lock, and only
 * that holder completes it. A reply can arrive before the writev that
 * carried its request has returned (the peer has every byte once the kernel
 * has copied them); such a chunk is held and the sender completes it after
 * its writev, so no chunk is completed while a gather list still points at
 * it. When a connection fails it is marked dead, every socket is shut down
 * and the threads exit; the last thread of a stream to exit fails what is
 * left on that stream. */
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

/* ======================================================================
 * client side
 * ==================================================================== */

typedef struct tcp_conn tcp_conn;

/* A chunk whose reply came in while its writev was still running. */
typedef struct tcp_held {
    fr_chunk *ch;
    int status;
    bool touched;
} tcp_held;

typedef struct tcp_stream {
    tcp_conn *conn;
    int fd;
    unsigned idx;
    pthread_mutex_t lock;
    pthread_cond_t cond;             /* sender: queue not empty, or conn dead */
    fr_chunk *qhead, *qtail;         /* posted, not sent */
    fr_chunk *ihead, *itail;         /* being sent or sent, awaiting the reply, in order */
    uint64_t next_req;               /* last request id taken for sending (lock) */
    uint64_t sent_req;               /* last request id whose writev returned (lock) */
    tcp_held held[SEND_BATCH];       /* replied, not yet sent-complete (lock) */
    unsigned nheld;
    unsigned live;                   /* threads running; the last one out fails the rest */
    _Atomic uint64_t load;           /* weight of chunks not completed: stream choice */
    pthread_t sender, receiver;
    bool has_sender, has_receiver;
    /* Sender-only scratch: encoded headers and the gather list. */
    uint8_t hdr[SEND_BATCH][HDR_CAP];
    struct iovec iov[SEND_IOV];
} tcp_stream;

struct tcp_conn {
    ferry_engine *e;
    char peer[PEER_NAME];
    atomic_bool dead;
    atomic_uint rr;                  /* rotates ties in stream choice */
    unsigned nstreams, ninit;        /* streams; streams whose lock/cond exist */
    tcp_stream s[];
};

/* Mark the connection dead and wake every thread of it. The first failure
 * is logged: as a warning when it breaks transfers or the peer misbehaved,
 * as info when an idle peer just went away (why == NULL: an orderly
 * disconnect, nothing to report). */
static void conn_fail(tcp_conn *c, int rc, const char *why)
{
    if (atomic_exchange(&c->dead, true))
        return;
    bool busy = false;
    for (unsigned i = 0; i < c->ninit; i++)
        busy |= atomic_load_explicit(&c->s[i].load, memory_order_relaxed) != 0;
    if (why && (busy || rc != FERRY_ECONNRESET))
        FR_WARN(TAG, "dropping connection to %s: %s (%s)", c->peer, why, ferry_strerror(rc));
    else if (why)
        FR_INFO(TAG, "connection to %s closed by the peer", c->peer);
    for (unsigned i = 0; i < c->ninit; i++) {
        tcp_stream *s = &c->s[i];
        if (s->fd >= 0)
            shutdown(s->fd, SHUT_RDWR);
        pthread_mutex_lock(&s->lock);
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
}

static uint64_t chunk_cost(const fr_chunk *ch)
{
    return fr_chunk_bytes(ch) + CHUNK_COST;
}

static void chunk_finish(tcp_stream *s, fr_chunk *ch, int status, bool touched)
{
    atomic_fetch_sub_explicit(&s->load, chunk_cost(ch), memory_order_relaxed);
    fr_chunk_done(ch, status, touched);
}

/* Fail a detached list. sent: the chunks had been handed to the socket, so a
 * WRITE may have reached the target. A READ whose data had started landing
 * is never on such a list: the receiver holds it and completes it itself. */
static void fail_list(tcp_stream *s, fr_chunk *ch, bool sent)
{
    while (ch) {
        fr_chunk *next = ch->next;
        ch->next = NULL;
        chunk_finish(s, ch, FERRY_ECONNRESET, sent && ch->opcode == FERRY_OP_WRITE);
        ch = next;
    }
}

/* Complete held chunks with the outcome their reply carried. */
static void finish_held(tcp_stream *s, const tcp_held *h, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        chunk_finish(s, h[i].ch, h[i].status, h[i].touched);
}

static void stream_fail_all(tcp_stream *s)
{
    tcp_held held[SEND_BATCH];

    pthread_mutex_lock(&s->lock);
    fr_chunk *inflight = s->ihead, *queued = s->qhead;
    s->ihead = s->itail = s->qhead = s->qtail = NULL;
    unsigned nheld = s->nheld;
    memcpy(held, s->held, nheld * sizeof *held);
    s->nheld = 0;
    pthread_mutex_unlock(&s->lock);
    finish_held(s, held, nheld);
    fail_list(s, inflight, true);
    fail_list(s, queued, false);
}

/* Called by each stream thread as it ends; the connection is dead by then,
 * so nothing new can be queued on the stream after the last one drains it. */
static void stream_exit(tcp_stream *s)
{
    pthread_mutex_lock(&s->lock);
    bool last = --s->live == 0;
    pthread_mutex_unlock(&s->lock);
    if (last)
        stream_fail_all(s);
}

/* ---- sender ------------------------------------------------------------ */

static int encode_request(const fr_chunk *ch, uint8_t *out)
{
    fr_msg m = { 0 };
    uint64_t data = 0;

    if (ch->rows > 1) {
        /* Rows of a strided op: one request, the rows packed on the wire.
         * The engine cuts at ROWS_MAX rows and sends rows that overlap at
         * the target one by one (.disjoint_rows), which the codec checks. */
        if (ch->rows > ROWS_MAX ||
            (ch->opcode != FERRY_OP_WRITE && ch->opcode != FERRY_OP_READ))
            return FERRY_EINVAL;
        m.type = ch->opcode == FERRY_OP_WRITE ? FR_MSG_WRITE_ROWS : FR_MSG_READ_ROWS;
        m.u.rows = (fr_msg_rows){ .key = ch->key, .addr = ch->remote_addr, .len = ch->len,
                                  .stride = ch->rstride, .span_addr = ch->span_addr,
                                  .span_len = ch->span_len, .rows = (uint32_t)ch->rows };
        data = ch->opcode == FERRY_OP_WRITE ? fr_chunk_bytes(ch) : 0;
        return fr_wire_encode(&m, ch->req_id, data, out, HDR_CAP);
    }
    switch (ch->opcode) {
    case FERRY_OP_WRITE:
        m.type = FR_MSG_WRITE;
        data = ch->len;
        /* fallthrough */
    case FERRY_OP_READ:
        if (ch->opcode == FERRY_OP_READ)
            m.type = FR_MSG_READ;
        m.u.rw.key = ch->key;
        m.u.rw.addr = ch->remote_addr;
        m.u.rw.len = ch->len;
        m.u.rw.span_addr = ch->span_addr;
        m.u.rw.span_len = ch->span_len;
        break;
    case FERRY_OP_NOTIFY:
        m.type = FR_MSG_NOTIFY;
        m.u.notify.tag = ch->tag;
        m.u.notify.value = ch->value;
        break;
    default:
        return FERRY_EINVAL;
    }
    return fr_wire_encode(&m, ch->req_id, data, out, HDR_CAP);
}

/* Gather entries a chunk's payload takes: a WRITE's local rows, one each
 * unless they touch (local stride == len); nothing for READ and NOTIFY. */
static uint64_t payload_iovs(const fr_chunk *ch)
{
    if (ch->opcode != FERRY_OP_WRITE)
        return 0;
    return ch->rows > 1 && ch->lstride != ch->len ? ch->rows : 1;
}

/* Append a WRITE's payload to the gather list at iov[n]; returns the new
 * count (n + payload_iovs(ch)). */
static int gather_payload(struct iovec *iov, int n, const fr_chunk *ch)
{
    if (ch->rows <= 1 || ch->lstride == ch->len) {
        iov[n++] = (struct iovec){ ch->local, (size_t)fr_chunk_bytes(ch) };
        return n;
    }
    for (uint64_t i = 0; i < ch->rows; i++)
        iov[n++] = (struct iovec){ ch->local + i * ch->lstride, (size_t)ch->len };
    return n;
}

/* Wait for work, then move up to SEND_BATCH chunks from the queue to the
 * in-flight FIFO and build their gather list (at most SEND_IOV entries: a
 * chunk that would not fit waits for the next batch, and any one chunk the
 * codec takes fits an empty list). Everything read from a chunk is read
 * here, under the lock, before it can be completed by the receiver.
 * Chunks the codec refuses go to *bad (never sent). Returns the iov count,
 * or -1 once the connection is dead. */
static int sender_take(tcp_stream *s, fr_chunk **bad)
{
    tcp_conn *c = s->conn;
    int niov = 0, nhdr = 0;

    pthread_mutex_lock(&s->lock);
    while (!s->qhead && !atomic_load(&c->dead))
        pthread_cond_wait(&s->cond, &s->lock);
    if (atomic_load(&c->dead)) {
        pthread_mutex_unlock(&s->lock);
        return -1;
    }
    uint64_t bytes = 0;
    while (s->qhead && nhdr < SEND_BATCH && bytes < BATCH_BYTES) {
        fr_chunk *ch = s->qhead;
        if (niov > 0 && (uint64_t)niov + 1 + payload_iovs(ch) > SEND_IOV)
            break;
        s->qhead = ch->next;
        if (!s->qhead)
            s->qtail = NULL;
        ch->next = NULL;
        ch->req_id = s->next_req + 1;
        int n = encode_request(ch, s->hdr[nhdr]);
        if (n < 0) {
            ch->next = *bad;
            *bad = ch;
            continue;
        }
        s->next_req++;
        s->iov[niov++] = (struct iovec){ s->hdr[nhdr++], (size_t)n };
        if (ch->opcode == FERRY_OP_WRITE) {
            niov = gather_payload(s->iov, niov, ch);
            bytes += fr_chunk_bytes(ch);
        }
        if (s->itail)
            s->itail->next = ch;
        else
            s->ihead = ch;
        s->itail = ch;
    }
    pthread_mutex_unlock(&s->lock);
    return niov;
}

/* The writev is over: nothing points into the chunks taken so far, so the
 * ones whose replies already came in can complete now. */
static void sender_release(tcp_stream *s)
{
    tcp_held held[SEND_BATCH];

    pthread_mutex_lock(&s->lock);
    s->sent_req = s->next_req;
    unsigned n = s->nheld;
    memcpy(held, s->held, n * sizeof *held);
    s->nheld = 0;
    pthread_mutex_unlock(&s->lock);
    finish_held(s, held, n);
}

static void *sender_main(void *arg)
{
    tcp_stream *s = arg;
    tcp_conn *c = s->conn;

    for (;;) {
        fr_chunk *bad = NULL;
        int niov = sender_take(s, &bad);
        while (bad) {
            fr_chunk *next = bad->next;
            FR_WARN(TAG, "refusing a chunk the wire cannot carry (%llu rows of %llu bytes)",
                    (unsigned long long)(bad->rows > 1 ? bad->rows : 1), (unsigned long long)bad->len);
            bad->next = NULL;
            chunk_finish(s, bad, FERRY_EINVAL, false);
            bad = next;
        }
        if (niov < 0)
            break;
        int rc = niov > 0 ? fr_writev_full(s->fd, s->iov, niov) : 0;
        sender_release(s);
        if (rc < 0) {
            conn_fail(c, rc, "send failed");
            break;
        }
    }
    stream_exit(s);
    return NULL;
}

/* ---- receiver ------------------------------------------------------------ */

#define REPLY_META 16   /* ACK and READ_RESP; any other size fails as a corrupt reply */

static bool reply_fits(const fr_chunk *ch, const fr_frame_hdr *hdr, const fr_msg *m)
{
    if (ch->req_id != hdr->req_id)
        return false;
    switch (ch->opcode) {
    case FERRY_OP_READ:
        return hdr->type == FR_MSG_READ_RESP &&
               (m->u.read_resp.status != 0 || m->u.read_resp.len == fr_chunk_bytes(ch));
    case FERRY_OP_WRITE:
        return hdr->type == FR_MSG_ACK &&
               (m->u.ack.status != 0 || m->u.ack.value == fr_chunk_bytes(ch));
    case FERRY_OP_NOTIFY:
        return hdr->type == FR_MSG_ACK;
    default:
        return false;
    }
}

/* Unlink the in-flight head if the reply belongs to it. A reply that does
 * not leaves the head in place: it fails with the connection. */
static fr_chunk *pop_reply(tcp_stream *s, const fr_frame_hdr *hdr, const fr_msg *m)
{
    pthread_mutex_lock(&s->lock);
    fr_chunk *ch = s->ihead;
    if (ch && reply_fits(ch, hdr, m)) {
        s->ihead = ch->next;
        if (!s->ihead)
            s->itail = NULL;
        ch->next = NULL;
    } else {
        ch = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    return ch;
}

/* Complete a replied chunk, or hold it for the sender while the writev that
 * carried it is still running. At most one batch can be held. */
static void reply_done(tcp_stream *s, fr_chunk *ch, int status, bool touched)
{
    pthread_mutex_lock(&s->lock);
    bool hold = ch->req_id > s->sent_req;
    assert(!hold || s->nheld < SEND_BATCH);   /* only the running batch can be held */
    if (hold)
        s->held[s->nheld++] = (tcp_held){ ch, status, touched };
    pthread_mutex_unlock(&s->lock);
    if (!hold)
        chunk_finish(s, ch, status, touched);
}

static int handle_reply(tcp_stream *s, const fr_frame_hdr *hdr, const fr_msg *m)
{
    fr_chunk *ch = pop_reply(s, hdr, m);
    if (!ch)
        return FERRY_EPROTO;

    if (hdr->type == FR_MSG_READ_RESP) {
        int status = m->u.read_resp.status;
        if (status != 0) {
            reply_done(s, ch, status, false);
            return 0;
        }
        /* A strided READ's rows arrive packed; scatter them to the local rows. */
        int rc = ch->rows > 1 ? fr_read_rows(s->fd, ch->local, ch->rows, ch->len, ch->lstride)
                              : fr_read_full(s->fd, ch->local, ch->len);
        reply_done(s, ch, rc < 0 ? FERRY_ECONNRESET : 0, true);
        return rc;
    }
    int status = m->u.ack.status;
    /* A refused WRITE was drained by the target: nothing was touched. */
    reply_done(s, ch, status, ch->opcode == FERRY_OP_WRITE && status == 0);
    return 0;
}

static void *receiver_main(void *arg)
{
    tcp_stream *s = arg;
    tcp_conn *c = s->conn;

    for (;;) {
        fr_frame_hdr hdr;
        fr_msg m;
        /* Replies are ACK or READ_RESP, both with a 16-byte meta. */
        int rc = fr_recv_msg_sized(s->fd, REPLY_META, &hdr, &m);
        if (rc == 0) {
            rc = handle_reply(s, &hdr, &m);
            if (rc == FERRY_EPROTO) {
                FR_STAT_ADD(c->e, frames_rejected, 1);
                conn_fail(c, rc, "reply does not match the oldest request");
                break;
            }
        } else if (rc == FERRY_EPROTO || rc == FERRY_EMSGSIZE) {
            FR_STAT_ADD(c->e, frames_rejected, 1);
            conn_fail(c, rc, "corrupt reply");
            break;
        }
        if (rc < 0) {
            conn_fail(c, rc, "receive failed");
            break;
        }
    }
    stream_exit(s);
    return NULL;
}

/* ---- connect / post / disconnect ------------------------------------------ */

static int stream_open(tcp_conn *c, tcp_stream *s, const fr_peer *p,
                       const struct sockaddr_storage *ss, socklen_t sl, uint64_t deadline, ferry_error *err)
{
    uint32_t pid = 0;

    s->fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->fd < 0)
        return fr_fail(err, FERRY_EIO, "socket: %s", strerror(errno));
    int rc = fr_sock_connect_deadline(s->fd, ss, sl, deadline);
    if (rc < 0)
        return fr_fail(err, rc, "%s", ferry_strerror(rc));
    fr_tcp_set_nodelay(s->fd);
    int ms = fr_ms_left(deadline);
    if (ms == 0)
        return fr_fail(err, FERRY_ETIMEDOUT, "no time left for the handshake (connect_timeout_ms %d)",
                       c->e->cfg.connect_timeout_ms);
    rc = fr_sock_timeouts(s->fd, ms < 0 ? 0 : ms);
    if (rc < 0)
        return fr_fail(err, rc, "%s", ferry_strerror(rc));
    /* Its code is passed on unchanged: FERRY_ESTALE must reach the caller. */
    rc = fr_auth_client(c->e, s->fd, p, FR_ROLE_TCP_STREAM, (uint16_t)s->idx, &pid, err);
    if (rc < 0)
        return rc;
    rc = fr_sock_timeouts(s->fd, 0);
    return rc < 0 ? fr_fail(err, rc, "%s", ferry_strerror(rc)) : 0;
}

static int stream_start(tcp_stream *s)
{
    pthread_mutex_lock(&s->lock);
    s->live = 2;
    pthread_mutex_unlock(&s->lock);
    s->has_sender = pthread_create(&s->sender, NULL, sender_main, s) == 0;
    if (s->has_sender)
        s->has_receiver = pthread_create(&s->receiver, NULL, receiver_main, s) == 0;
    if (s->has_sender && s->has_receiver)
        return 0;
    pthread_mutex_lock(&s->lock);
    s->live = s->has_sender ? 1 : 0;
    pthread_mutex_unlock(&s->lock);
    return FERRY_ENOMEM;
}

/* Tear down whatever exists: stop and join every thread (the last one of
 * each stream fails its leftovers), then close and free. */
/* Close with a reset: payload still queued in our send buffer is dropped
 * instead of being delivered into the target after its chunks were already
 * reported failed. */
static void close_abortive(int fd)
{
    const struct linger lg = { .l_onoff = 1, .l_linger = 0 };
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

static void conn_free(tcp_conn *c)
{
    conn_fail(c, 0, NULL);
    for (unsigned i = 0; i < c->ninit; i++) {
        tcp_stream *s = &c->s[i];
        if (s->has_sender)
            pthread_join(s->sender, NULL);
        if (s->has_receiver)
            pthread_join(s->receiver, NULL);
        stream_fail_all(s);   /* empty unless the threads never ran */
        if (s->fd >= 0)
            close_abortive(s->fd);
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
    }
    fr_free(c);
}

static tcp_conn *conn_alloc(ferry_engine *e, unsigned ns)
{
    tcp_conn *c = fr_calloc(1, sizeof *c + ns * sizeof(tcp_stream));
    if (!c)
        return NULL;
    c->e = e;
    c->nstreams = ns;
    atomic_init(&c->dead, false);
    atomic_init(&c->rr, 0);
    for (unsigned i = 0; i < ns; i++) {
        tcp_stream *s = &c->s[i];
        s->conn = c;
        s->fd = -1;
        s->idx = i;
        atomic_init(&s->load, 0);
        if (pthread_mutex_init(&s->lock, NULL) != 0)
            break;
        if (pthread_cond_init(&s->cond, NULL) != 0) {
            pthread_mutex_destroy(&s->lock);
            break;
        }
        c->ninit++;
    }
    if (c->ninit < ns) {
        conn_free(c);
        return NULL;
    }
    return c;
}

static int tcp_connect(ferry_engine *e, fr_peer *p, void **out, ferry_error *err)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    unsigned ns = e->cfg.tcp_streams;
    ns = ns < 1 ? 1 : ns > MAX_STREAMS ? MAX_STREAMS : ns;

    if (!(p->ep.transports & FR_TRANSPORT_TCP))
        return fr_fail(err, FERRY_ENOTSUP, "the peer does not serve tcp");
    tcp_conn *c = conn_alloc(e, ns);
    if (!c)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    int rc = fr_tcp_endpoint_sockaddr(&p->ep, &ss, &sl, c->peer, sizeof c->peer);
    if (rc < 0)
        fr_fail(err, rc, "its descriptor has no usable tcp address");
    const int tmo = e->cfg.connect_timeout_ms;
    const uint64_t deadline = fr_deadline_ns(tmo > 0 ? tmo : -1);
    for (unsigned i = 0; rc == 0 && i < ns; i++) {
        rc = stream_open(c, &c->s[i], p, &ss, sl, deadline, err);
        if (rc < 0 && err)   /* where, before what stream_open said */
            fr_fail(err, rc, "%s (stream %u of %u): %s", c->peer, i, ns, err->msg);
    }
    for (unsigned i = 0; rc == 0 && i < ns; i++) {
        rc = stream_start(&c->s[i]);
        if (rc < 0)
            fr_fail(err, rc, "%s: cannot start the threads of stream %u", c->peer, i);
    }
    if (rc < 0) {
        conn_free(c);
        return rc;
    }
    FR_DEBUG(TAG, "connected to %s with %u streams", c->peer, ns);
    *out = c;
    return 0;
}

/* The stream with the least outstanding weight; ties rotate. */
static unsigned pick_stream(tcp_conn *c, const uint64_t *added)
{
    unsigned n = c->nstreams;
    unsigned start = atomic_fetch_add_explicit(&c->rr, 1, memory_order_relaxed) % n;
    unsigned best = start;
    uint64_t best_w = UINT64_MAX;

    for (unsigned k = 0; k < n; k++) {
        unsigned i = (start + k) % n;
        uint64_t w = atomic_load_explicit(&c->s[i].load, memory_order_relaxed) + added[i];
        if (w < best_w) {
            best_w = w;
            best = i;
        }
    }
    return best;
}

static int tcp_post(void *conn, fr_chunk **chunks, size_t n)
{
    tcp_conn *c = conn;
    fr_chunk *head[MAX_STREAMS] = { 0 }, *tail[MAX_STREAMS] = { 0 };
    uint64_t added[MAX_STREAMS] = { 0 };
    uint64_t used = 0;

    if (atomic_load(&c->dead))
        return FERRY_ECONNRESET;
    if (n == 0)
        return 0;
    /* Sort the chunks into per-stream lists first, then take every stream
     * lock involved (in index order) so the batch is taken whole or not at
     * all. */
    for (size_t i = 0; i < n; i++) {
        fr_chunk *ch = chunks[i];
        /* Notifications all ride stream 0 so that they arrive in the order
         * they were posted; data goes wherever the least is queued. */
        unsigned k = ch->opcode == FERRY_OP_NOTIFY ? 0 : pick_stream(c, added);
        ch->next = NULL;
        if (tail[k])
            tail[k]->next = ch;
        else
            head[k] = ch;
        tail[k] = ch;
        added[k] += chunk_cost(ch);
        used |= 1ull << k;
    }
    for (unsigned k = 0; k < c->nstreams; k++)
        if (used & (1ull << k))
            pthread_mutex_lock(&c->s[k].lock);
    /* Checked under the locks: a stream's last thread drains it under its
     * lock only after the connection was marked dead. */
    bool dead = atomic_load(&c->dead);
    for (unsigned k = 0; k < c->nstreams; k++) {
        if (!(used & (1ull << k)))
            continue;
        tcp_stream *s = &c->s[k];
        if (!dead) {
            if (s->qtail)
                s->qtail->next = head[k];
            else
                s->qhead = head[k];
            s->qtail = tail[k];
            atomic_fetch_add_explicit(&s->load, added[k], memory_order_relaxed);
            pthread_cond_signal(&s->cond);
        }
        pthread_mutex_unlock(&s->lock);
    }
    return dead ? FERRY_ECONNRESET : 0;
}

static void tcp_disconnect(void *conn)
{
    if (conn)
        conn_free(conn);
}

static bool tcp_alive(void *conn)
{
    const tcp_conn *c = conn;
    return c && !atomic_load(&c->dead);
}

const fr_transport fr_transport_tcp = {
    .name = "tcp",
    .bit = FR_TRANSPORT_TCP,
    .max_chunk = 0,   /* 0: the engine splits at cfg.tcp_chunk */
    /* A strided op goes as chunks of up to ROWS_MAX rows (and at most a
     * chunk's bytes), one WRITE_ROWS/READ_ROWS request each. */
    .strided = true,
    .disjoint_rows = true,
    .max_rows = ROWS_MAX,
    .start = fr_tcp_start,
    .stop = fr_tcp_stop,
    .connect = tcp_connect,
    .post = tcp_post,
    .disconnect = tcp_disconnect,
    .alive = tcp_alive,
};
