/* ucx transport, initiator side, and its ops table.
 *
 * connect: an authenticated control connection to the peer's ucx control
 * port (the handshake comes first: only then does the peer send its worker
 * address), then a UCP endpoint to that address in peer error-handling
 * mode. post: every READ/WRITE chunk is checked against the region the
 * peer exported (key, access, the whole op's span: a one-sided put has no
 * target-side check), then posted as ucp_put_nbx/ucp_get_nbx (one per row
 * of a strided chunk), and the post ends with ucp_ep_flush_nbx: a chunk
 * completes when the flush does, so COMPLETED means the bytes are at the
 * target, not just gone from here. NOTIFY goes over the control connection
 * and completes on the target's ACK; the engine sends it only after the
 * writes before it completed, i.e. were flushed. A control connection that
 * ends (the peer died or closed) fails the endpoint at once (forced
 * close): everything outstanding fails with FERRY_ECONNRESET, and a chunk
 * whose op had been posted counts as touched. */
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/transport/ucx_int.h"

/* ---- completing ------------------------------------------------------------ */

static void batch_put(ucx_batch *b)
{
    if (atomic_fetch_sub(&b->pending, 1) == 1)
        fr_ucx_batch_finished(b);
}

static void op_cb(void *req, ucs_status_t s, void *user)
{
    ucx_slot *sl = user;
    if (s != UCS_OK && sl->status == 0)
        sl->status = fr_ucx_code(s);
    ucp_request_free(req);
    batch_put(sl->b);
}

static void flush_cb(void *req, ucs_status_t s, void *user)
{
    ucx_batch *b = user;
    if (s != UCS_OK)
        b->flush_status = fr_ucx_code(s);
    ucp_request_free(req);
    batch_put(b);
}

static void batch_unlink(ucx_conn *c, ucx_batch *b)
{
    if (b->live_prev)
        b->live_prev->live_next = b->live_next;
    else
        c->live = b->live_next;
    if (b->live_next)
        b->live_next->live_prev = b->live_prev;
    c->batches--;
}

/* Complete every chunk of b; code overrides what succeeded (0: keep). */
static void batch_chunks_done(ucx_batch *b, int code)
{
    for (size_t i = 0; i < b->n; i++) {
        const ucx_slot *sl = &b->slots[i];
        int rc = sl->status;
        if (rc == 0 && sl->issued)
            rc = b->flush_status;
        if (rc == 0 && code)
            rc = code;
        fr_chunk_done(b->chunks[i], rc, sl->issued);
    }
}

static void batch_free(ucx_batch *b)
{
    fr_free(b->chunks);
    fr_free(b->slots);
    fr_free(b);
}

void fr_ucx_batch_complete(ucx_batch *b)
{
    if (atomic_exchange(&b->claimed, true)) {   /* abandoned: its chunks are done */
        fr_ucx_abandoned_del(b->st, b);
        batch_free(b);
        return;
    }
    ucx_conn *c = b->c;
    pthread_mutex_lock(&c->lock);
    batch_unlink(c, b);
    pthread_mutex_unlock(&c->lock);
    batch_chunks_done(b, 0);
    batch_free(b);
}

/* After the endpoint's forced close: batches UCX still holds requests of
 * fail now, touched where an op was posted. UCX may call back later (or,
 * for a closed endpoint, never); the batch memory waits for that. */
static void abandon_batches(ucx_conn *c)
{
    for (;;) {
        pthread_mutex_lock(&c->lock);
        ucx_batch *b = c->live;
        while (b && (atomic_load(&b->claimed) || atomic_load(&b->pending) == 0))
            b = b->live_next;   /* pending 0: finished, on its way through the done list */
        if (b)
            batch_unlink(c, b);
        pthread_mutex_unlock(&c->lock);
        if (!b)
            return;
        /* On the state's list before the claim: a late last callback that
         * sees the claim takes it off again. */
        fr_ucx_abandoned_add(c->st, b);
        if (atomic_exchange(&b->claimed, true)) {
            fr_ucx_abandoned_del(c->st, b);
            continue;   /* its last callback got there first (and completes it) */
        }
        batch_chunks_done(b, FERRY_ECONNRESET);
    }
}

/* ---- control connection (progress thread) --------------------------------- */

static fr_chunk *await_pop(ucx_conn *c)
{
    fr_chunk *ch = c->await_head;
    if (ch) {
        c->await_head = ch->next;
        if (!c->await_head)
            c->await_tail = NULL;
    }
    return ch;
}

static void set_out_events(ucx_conn *c, bool want)
{
    if (c->want_out == want)
        return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(c->st->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->want_out = want;
}

void fr_ucx_conn_flush_out(ucx_conn *c)
{
    pthread_mutex_lock(&c->lock);
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_out_events(c, true);
            pthread_mutex_unlock(&c->lock);
            return;
        }
        c->failed = true;   /* service_conns fails it */
        break;
    }
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    set_out_events(c, false);
    bool failed = c->failed;
    pthread_mutex_unlock(&c->lock);
    if (failed)
        fr_ucx_wake(c->st);
}

static int post_rw(ucx_conn *c, fr_chunk **chunks, size_t n);
static int post_known(ucx_conn *c, fr_chunk **chunks, size_t n);

/* The answer to a key lookup: record the region and post what waited on
 * it, or refuse what waited (progress thread, no lock held). */
static void keyreq_answered(ucx_conn *c, struct ucx_keyreq *q, int status, const uint8_t *d, size_t n)
{
    fr_region_desc rd = {.key = q->key, .ep = c->p->ep};
    if (status == 0) {
        status = FERRY_EPROTO;
        if (n >= 20 && n - 20 <= FR_DESC_RKEY_MAX && n > 20 && fr_ucx_rkey_ok(d + 20, n - 20)) {
            for (int i = 7; i >= 0; i--) {
                rd.base = rd.base << 8 | d[i];
                rd.len = rd.len << 8 | d[8 + i];
            }
            for (int i = 3; i >= 0; i--)
                rd.flags = rd.flags << 8 | d[16 + i];
            rd.rkey_len = (uint16_t)(n - 20);
            memcpy(rd.rkey, d + 20, n - 20);
            status = fr_peer_import_add(c->p, &rd);
        }
    }
    size_t k = 0;
    for (fr_chunk *ch = q->parked; ch; ch = ch->next)
        k++;
    fr_chunk **list = fr_calloc(k ? k : 1, sizeof *list);
    k = 0;
    for (fr_chunk *ch = q->parked, *next; ch; ch = next) {
        next = ch->next;
        if (status == 0 && list)
            list[k++] = ch;
        else
            fr_chunk_done(ch, status == 0 ? FERRY_ENOMEM : FERRY_EACCES, false);
    }
    if (status < 0)   /* the ticket names the op: debug only */
        FR_DEBUG(UCX_TAG, "%s has no remote-accessible region with key %016llx", c->peer,
                 (unsigned long long)q->key);
    if (k > 0 && post_rw(c, list, k) < 0)
        for (size_t i = 0; i < k; i++)
            fr_chunk_done(list[i], FERRY_ENOMEM, false);
    fr_free(list);
    fr_free(q);
}

/* Complete the ACKs (of notifies) and READ_RESPs (of key lookups) found in
 * the input buffer; FERRY_EPROTO on anything else. */
static int parse_in(ucx_conn *c)
{
    size_t off = 0;
    int rc = 0;
    while (rc == 0 && c->in_len - off >= FR_WIRE_HDR_LEN) {
        fr_frame_hdr h;
        fr_msg m;
        rc = fr_wire_hdr_decode(c->in + off, FR_WIRE_HDR_LEN, &h);
        if (rc == 0 && h.type != FR_MSG_ACK && h.type != FR_MSG_READ_RESP)
            rc = FERRY_EPROTO;
        if (rc == 0 && h.len > sizeof c->in - FR_WIRE_HDR_LEN)
            rc = FERRY_EPROTO;
        if (rc < 0 || c->in_len - off < FR_WIRE_HDR_LEN + (size_t)h.len)
            break;
        const size_t meta = fr_wire_meta_len(h.type);
        const uint8_t *body = c->in + off + FR_WIRE_HDR_LEN;
        rc = fr_wire_decode(&h, body, meta, &m);
        if (rc < 0)
            break;
        off += FR_WIRE_HDR_LEN + h.len;
        pthread_mutex_lock(&c->lock);
        void *who = NULL;
        if (h.type == FR_MSG_ACK && c->await_head && c->await_head->req_id == h.req_id) {
            who = await_pop(c);
        } else if (h.type == FR_MSG_READ_RESP && c->kq_head && c->kq_head->req_id == h.req_id) {
            who = c->kq_head;
            c->kq_head = c->kq_head->next;
            if (!c->kq_head)
                c->kq_tail = NULL;
        }
        pthread_mutex_unlock(&c->lock);
        if (!who) {
            rc = FERRY_EPROTO;
            break;
        }
        if (h.type == FR_MSG_ACK)
            fr_chunk_done(who, m.u.ack.status, false);
        else
            keyreq_answered(c, who, m.u.read_resp.status, body + meta, h.len - meta);
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    return rc;
}

void fr_ucx_conn_io(ucx_conn *c, uint32_t events)
{
    int rc = 0;
    if (events & EPOLLIN) {
        for (;;) {
            ssize_t r = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, MSG_DONTWAIT);
            if (r > 0) {
                c->in_len += (size_t)r;
                rc = parse_in(c);
                if (rc < 0)
                    break;
                continue;
            }
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            rc = FERRY_ECONNRESET;   /* EOF or a socket error: the peer is gone */
            break;
        }
    } else if (events & (EPOLLHUP | EPOLLERR)) {
        rc = FERRY_ECONNRESET;
    }
    if (rc == FERRY_EPROTO)
        FR_WARN(UCX_TAG, "control connection to %s sent a malformed reply; failing it", c->peer);
    if (rc < 0) {
        pthread_mutex_lock(&c->lock);
        c->failed = true;
        pthread_mutex_unlock(&c->lock);
        fr_ucx_conn_fail(c, FERRY_ECONNRESET);
        return;
    }
    if (events & EPOLLOUT)
        fr_ucx_conn_flush_out(c);
}

void fr_ucx_conn_fail(ucx_conn *c, int code)
{
    pthread_mutex_lock(&c->lock);
    c->failed = true;
    bool close_ep = !c->ep_closed;
    c->ep_closed = true;
    fr_chunk *aw = c->await_head;
    c->await_head = c->await_tail = NULL;
    struct ucx_keyreq *kq = c->kq_head;
    c->kq_head = c->kq_tail = NULL;
    c->out_len = c->out_off = 0;
    pthread_mutex_unlock(&c->lock);
    /* Its socket is at EOF for good: out of the epoll set, or the progress
     * thread would wake for it forever until someone disconnects. */
    (void)epoll_ctl(c->st->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    if (close_ep && c->ep) {
        /* Forced: every request still outstanding on it is completed with
         * an error (their callbacks only count), then it is gone. */
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *req = ucp_ep_close_nbx(c->ep, &prm);
        if (UCS_PTR_IS_PTR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS)
                ucp_worker_progress(c->st->worker);
            ucp_request_free(req);
        }
        c->ep = NULL;
        /* Batches whose last callback ran meanwhile complete normally. */
        while (ucp_worker_progress(c->st->worker) != 0)
            ;
        for (size_t i = 0; i < c->nrkeys; i++)
            ucp_rkey_destroy(c->rkeys[i].rk);
        c->nrkeys = 0;
        FR_DEBUG(UCX_TAG, "endpoint to %s closed", c->peer);
    }
    abandon_batches(c);
    while (aw) {
        fr_chunk *next = aw->next;
        fr_chunk_done(aw, code, false);
        aw = next;
    }
    while (kq) {   /* nothing of theirs was posted */
        struct ucx_keyreq *next = kq->next;
        for (fr_chunk *ch = kq->parked, *n2; ch; ch = n2) {
            n2 = ch->next;
            fr_chunk_done(ch, code, false);
        }
        fr_free(kq);
        kq = next;
    }
}

/* ---- checks before posting ------------------------------------------------- */

/* The rkey for key, unpacked once per connection (c->lock held). */
static int rkey_of(ucx_conn *c, uint64_t key, size_t *at)
{
    for (size_t i = 0; i < c->nrkeys; i++)
        if (c->rkeys[i].key == key) {
            *at = i;
            return 0;
        }
    fr_import imp;
    if (!fr_peer_import_find(c->p, key, &imp))
        return FERRY_ENOENT;
    if (imp.rkey_len == 0)
        return FERRY_EACCES;   /* exported as not remote-accessible */
    /* UCX's unpacker takes no length: it gets the checked bytes and zeroes. */
    uint8_t buf[FR_DESC_RKEY_MAX + UCX_UNPACK_PAD] = {0};
    memcpy(buf, imp.rkey, imp.rkey_len);
    ucp_rkey_h rk;
    ucs_status_t s = ucp_ep_rkey_unpack(c->ep, buf, &rk);
    if (s != UCS_OK) {
        FR_WARN(UCX_TAG, "the remote key of a region of %s does not unpack: %s", c->peer, ucs_status_string(s));
        return FERRY_EACCES;
    }
    int rc = fr_grow((void **)&c->rkeys, &c->cap_rkeys, c->nrkeys + 1, sizeof *c->rkeys);
    if (rc < 0) {
        ucp_rkey_destroy(rk);
        return rc;
    }
    c->rkeys[c->nrkeys].key = key;
    c->rkeys[c->nrkeys].base = imp.base;
    c->rkeys[c->nrkeys].len = imp.len;
    c->rkeys[c->nrkeys].flags = imp.flags;
    c->rkeys[c->nrkeys].rk = rk;
    *at = c->nrkeys++;
    return 0;
}

static bool inside(uint64_t a, uint64_t n, uint64_t base, uint64_t len)
{
    return a >= base && a - base <= len && n <= len - (a - base);
}

/* What the target would check, from its descriptor: key, access, and the
 * whole op's span inside the region (c->lock held). */
static int check_chunk(ucx_conn *c, const fr_chunk *ch, ucp_rkey_h *rk)
{
    size_t i;
    int rc = rkey_of(c, ch->key, &i);
    const char *why = rc == FERRY_ENOENT ? "its key is not that of a region imported from this peer's descriptors"
                                         : "access not allowed";
    if (rc == FERRY_ENOENT)
        rc = FERRY_EACCES;
    unsigned need = ch->opcode == FERRY_OP_WRITE ? FERRY_REMOTE_WRITE : FERRY_REMOTE_READ;
    if (rc == 0 && !(c->rkeys[i].flags & need))
        rc = FERRY_EACCES;
    if (rc == 0) {
        uint64_t ext = ch->rows > 1 ? (ch->rows - 1) * ch->rstride + ch->len : ch->len;
        uint64_t sa = ch->span_len ? ch->span_addr : ch->remote_addr;
        uint64_t sn = ch->span_len ? ch->span_len : ext;
        if (!inside(sa, sn, c->rkeys[i].base, c->rkeys[i].len) || !inside(ch->remote_addr, ext, sa, sn))
            rc = FERRY_EFAULT;
    }
    if (rc < 0 && (ch->span_len == 0 || ch->remote_addr == ch->span_addr))   /* the ticket names the op */
        FR_DEBUG(UCX_TAG, "refused %s of %llu bytes at 0x%llx on %s: %s",
                ch->opcode == FERRY_OP_WRITE ? "write" : "read",
                (unsigned long long)(ch->span_len ? ch->span_len : fr_chunk_bytes(ch)),
                (unsigned long long)ch->remote_addr, c->peer,
                rc == FERRY_EFAULT ? "outside the region" : why);
    if (rc == 0)
        *rk = c->rkeys[i].rk;
    return rc;
}

/* ---- posting ---------------------------------------------------------------- */

static void issue(ucx_conn *c, const fr_chunk *ch, ucp_rkey_h rk, ucx_slot *sl)
{
    const uint64_t rows = ch->rows > 1 ? ch->rows : 1;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = op_cb, .user_data = sl};
    for (uint64_t r = 0; r < rows; r++) {
        uint8_t *local = ch->local + r * ch->lstride;
        uint64_t remote = ch->remote_addr + r * ch->rstride;
        atomic_fetch_add(&sl->b->pending, 1);   /* before: the callback may run at once */
        void *req = ch->opcode == FERRY_OP_WRITE ? ucp_put_nbx(c->ep, local, ch->len, remote, rk, &prm)
                                                 : ucp_get_nbx(c->ep, local, ch->len, remote, rk, &prm);
        sl->issued = true;
        if (UCS_PTR_IS_PTR(req))
            continue;
        atomic_fetch_sub(&sl->b->pending, 1);   /* done already, no callback */
        if (UCS_PTR_IS_ERR(req)) {
            sl->status = fr_ucx_code(UCS_PTR_STATUS(req));
            break;
        }
    }
}

/* Queue a frame for the progress thread to send (c->lock held). */
static int queue_frame(ucx_conn *c, const fr_msg *m, uint64_t req_id)
{
    uint8_t frame[FR_WIRE_HDR_LEN + 64];
    int k = fr_wire_encode(m, req_id, 0, frame, sizeof frame);
    int rc = k < 0 ? k : fr_grow((void **)&c->out, &c->out_cap, c->out_len + (size_t)k, 1);
    if (rc < 0)
        return rc;
    memcpy(c->out + c->out_len, frame, (size_t)k);
    c->out_len += (size_t)k;
    return 0;
}

/* A chunk whose key this connection has never seen (it came without its
 * descriptor: an endpoint from ferry_peer_add and a key from the
 * application's own messages) waits for the peer to describe the region
 * over the authenticated control connection (c->lock held). true: parked. */
static bool park_unknown(ucx_conn *c, fr_chunk *ch)
{
    for (size_t i = 0; i < c->nrkeys; i++)
        if (c->rkeys[i].key == ch->key)
            return false;
    fr_import imp;
    if (fr_peer_import_find(c->p, ch->key, &imp))
        return false;
    struct ucx_keyreq *q = c->kq_head;
    while (q && q->key != ch->key)
        q = q->next;
    if (!q) {
        q = fr_calloc(1, sizeof *q);
        fr_msg m = {.type = FR_MSG_MAP};
        m.u.map.key = ch->key;
        if (!q)
            return false;   /* refused below as an unknown key */
        q->key = ch->key;
        q->req_id = ++c->next_req;
        if (queue_frame(c, &m, q->req_id) < 0) {
            fr_free(q);
            return false;
        }
        if (c->kq_tail)
            c->kq_tail->next = q;
        else
            c->kq_head = q;
        c->kq_tail = q;
    }
    ch->next = q->parked;
    q->parked = ch;
    return true;
}

static int post_rw(ucx_conn *c, fr_chunk **chunks, size_t n)
{
    /* Chunks with unknown keys park first; the rest go now. */
    fr_chunk **go = fr_calloc(n, sizeof *go);
    if (!go)
        return FERRY_ENOMEM;
    size_t ng = 0;
    bool parked = false;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < n; i++) {
        if (!c->failed && park_unknown(c, chunks[i]))
            parked = true;
        else
            go[ng++] = chunks[i];
    }
    pthread_mutex_unlock(&c->lock);
    if (parked)
        fr_ucx_wake(c->st);
    int rc = ng ? post_known(c, go, ng) : 0;
    if (rc < 0)   /* the parked ones were taken: complete these here */
        for (size_t i = 0; i < ng; i++)
            fr_chunk_done(go[i], rc, false);
    fr_free(go);
    return 0;
}

static int post_known(ucx_conn *c, fr_chunk **chunks, size_t n)
{
    ucx_batch *b = fr_calloc(1, sizeof *b);
    if (b) {
        b->chunks = fr_calloc(n, sizeof *b->chunks);
        b->slots = fr_calloc(n, sizeof *b->slots);
    }
    if (!b || !b->chunks || !b->slots) {
        if (b) {
            fr_free(b->chunks);
            fr_free(b->slots);
        }
        fr_free(b);
        return FERRY_ENOMEM;
    }
    b->c = c;
    b->st = c->st;
    b->n = n;
    atomic_init(&b->pending, 1);   /* the poster's */
    memcpy(b->chunks, chunks, n * sizeof *chunks);
    bool any = false;
    pthread_mutex_lock(&c->lock);
    c->batches++;
    b->live_next = c->live;
    if (c->live)
        c->live->live_prev = b;
    c->live = b;
    for (size_t i = 0; i < n; i++) {
        ucx_slot *sl = &b->slots[i];
        sl->b = b;
        ucp_rkey_h rk = NULL;
        sl->status = c->failed ? FERRY_ECONNRESET : check_chunk(c, chunks[i], &rk);
        if (sl->status == 0) {
            issue(c, chunks[i], rk, sl);
            any = true;
        }
    }
    if (any && !c->failed) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                   .cb.send = flush_cb, .user_data = b};
        atomic_fetch_add(&b->pending, 1);
        void *req = ucp_ep_flush_nbx(c->ep, &prm);
        if (!UCS_PTR_IS_PTR(req)) {
            atomic_fetch_sub(&b->pending, 1);
            if (UCS_PTR_IS_ERR(req))
                b->flush_status = fr_ucx_code(UCS_PTR_STATUS(req));
        }
    }
    pthread_mutex_unlock(&c->lock);
    batch_put(b);
    fr_ucx_wake(c->st);   /* the progress thread drives what was posted */
    return 0;
}

/* Queue NOTIFY frames for the progress thread to send. */
static int post_notify(ucx_conn *c, fr_chunk **chunks, size_t n)
{
    pthread_mutex_lock(&c->lock);
    int rc = c->failed ? FERRY_ECONNRESET : 0;   /* then nothing was taken */
    for (size_t i = 0; i < n && rc == 0; i++) {
        fr_msg m = {.type = FR_MSG_NOTIFY};
        m.u.notify.tag = chunks[i]->tag;
        m.u.notify.value = chunks[i]->value;
        uint8_t frame[FR_WIRE_HDR_LEN + 64];
        chunks[i]->req_id = ++c->next_req;
        int k = fr_wire_encode(&m, chunks[i]->req_id, 0, frame, sizeof frame);
        if (k < 0)
            rc = k;
        if (rc == 0)
            rc = fr_grow((void **)&c->out, &c->out_cap, c->out_len + (size_t)k, 1);
        if (rc < 0)
            break;
        memcpy(c->out + c->out_len, frame, (size_t)k);
        c->out_len += (size_t)k;
        chunks[i]->next = NULL;
        if (c->await_tail)
            c->await_tail->next = chunks[i];
        else
            c->await_head = chunks[i];
        c->await_tail = chunks[i];
    }
    pthread_mutex_unlock(&c->lock);
    fr_ucx_wake(c->st);
    return rc;
}

static bool ucx_alive(void *conn);

static int ucx_post(void *conn, fr_chunk **chunks, size_t n)
{
    ucx_conn *c = conn;
    if (!ucx_alive(c))
        return FERRY_ECONNRESET;
    /* The engine posts a batch's notifies and its reads/writes separately. */
    size_t k = 0;
    while (k < n && chunks[k]->opcode == FERRY_OP_NOTIFY)
        k++;
    int rc = k > 0 ? post_notify(c, chunks, k) : 0;
    if (rc == 0 && k < n)
        rc = post_rw(c, chunks + k, n - k);
    return rc;
}

/* ---- connect / disconnect ------------------------------------------------------ */

static int ctrl_sockaddr(const fr_endpoint *ep, struct sockaddr_storage *ss, socklen_t *sl, char *name, size_t nl)
{
    memset(ss, 0, sizeof *ss);
    if (ep->family == 4) {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons(ep->ucx_port);
        memcpy(&a->sin_addr, ep->addr, 4);
        *sl = sizeof *a;
        snprintf(name, nl, "%u.%u.%u.%u:%u", ep->addr[0], ep->addr[1], ep->addr[2], ep->addr[3],
                 (unsigned)ep->ucx_port);
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(ep->ucx_port);
        memcpy(&a->sin6_addr, ep->addr, 16);
        *sl = sizeof *a;
        snprintf(name, nl, "[v6]:%u", (unsigned)ep->ucx_port);
    }
    return 0;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t s)
{
    ucx_conn *c = arg;
    (void)ep;
    FR_WARN(UCX_TAG, "UCX endpoint to %s failed: %s", c->peer, ucs_status_string(s));
    atomic_store(&c->ep_err, true);   /* service_conns closes it, outside this callback */
    fr_ucx_wake(c->st);
}

/* The control handshake, then the worker address the peer sends. */
static int ctrl_open(ferry_engine *e, ucx_conn *c, uint8_t **addr, ferry_error *err)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    ctrl_sockaddr(&c->p->ep, &ss, &sl, c->peer, sizeof c->peer);
    const int tmo = e->cfg.connect_timeout_ms;
    c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0)
        return fr_fail(err, FERRY_EIO, "socket: %s", strerror(errno));
    int rc = fr_sock_connect_deadline(c->fd, &ss, sl, fr_deadline_ns(tmo > 0 ? tmo : -1));
    if (rc == 0)
        rc = fr_sock_timeouts(c->fd, tmo > 0 ? tmo : 0);
    if (rc < 0)
        return fr_fail(err, rc, "control connection to %s: %s", c->peer, ferry_strerror(rc));
    uint32_t pid = 0;
    /* its code is passed on unchanged: FERRY_ESTALE must reach the caller */
    rc = fr_auth_client(e, c->fd, c->p, FR_ROLE_UCX_CTRL, 0, &pid, err);
    if (rc < 0)
        return err ? fr_fail(err, rc, "control connection to %s: %s", c->peer, err->msg) : rc;
    uint8_t lb[4] = {0};
    rc = fr_read_full(c->fd, lb, 4);
    uint32_t n = (uint32_t)lb[0] | (uint32_t)lb[1] << 8 | (uint32_t)lb[2] << 16 | (uint32_t)lb[3] << 24;
    if (rc == 0 && (n == 0 || n > UCX_ADDR_MAX))
        return fr_fail(err, FERRY_EPROTO, "%s sent a %u-byte worker address (at most %u)", c->peer, n,
                       UCX_ADDR_MAX);
    if (rc == 0) {
        *addr = fr_calloc(1, n + UCX_UNPACK_PAD);   /* zeroes after it: UCX takes no length */
        rc = *addr ? fr_read_full(c->fd, *addr, n) : FERRY_ENOMEM;
    }
    if (rc == 0)
        rc = fr_sock_timeouts(c->fd, 0);
    return rc < 0 ? fr_fail(err, rc, "no worker address from %s: %s", c->peer, ferry_strerror(rc)) : 0;
}

/* Peer error handling where the transports have it (tcp, verbs): UCX then
 * fails what is outstanding when the peer goes. UCX's shared-memory
 * transports have no peer failure handler (UCX 1.13), so there the
 * endpoint is made without; either way the control connection's end is
 * what fails the endpoint (forced close), so a peer that dies is noticed
 * the same way. */
static int make_ep(ucx_conn *c, const uint8_t *addr, ferry_error *err)
{
    ucs_status_t s = UCS_ERR_UNREACHABLE;
    /* Once refused, not tried again: UCX logs an error line for each try. */
    int first = atomic_load(&c->st->no_peer_mode) ? 0 : 1;
    for (int peer_mode = first; peer_mode >= 0 && s != UCS_OK; peer_mode--) {
        ucp_ep_params_t ep = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
            .address = (const ucp_address_t *)addr,
            .err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
        };
        if (peer_mode) {
            ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep.err_handler = (ucp_err_handler_t){.cb = ep_err_cb, .arg = c};
        }
        s = ucp_ep_create(c->st->worker, &ep, &c->ep);
        if (s != UCS_OK && peer_mode)
            atomic_store(&c->st->no_peer_mode, true);
        if (s == UCS_OK && !peer_mode)
            FR_DEBUG(UCX_TAG, "endpoint to %s without UCX peer error handling (the transports lack it)", c->peer);
    }
    if (s != UCS_OK) {
        c->ep = NULL;
        return fr_fail(err, s == UCS_ERR_UNREACHABLE ? FERRY_ENOTSUP : FERRY_ECONNREFUSED,
                       "cannot reach the UCX worker of %s: %s (do both sides share a transport in UCX_TLS?)",
                       c->peer, ucs_status_string(s));
    }
    atomic_fetch_add(&c->st->eps_created, 1);
    return 0;
}

static void conn_free(ucx_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    fr_free(c->out);
    fr_free(c->rkeys);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    fr_free(c);
}

static int ucx_connect(ferry_engine *e, fr_peer *p, void **out, ferry_error *err)
{
    ucx_state *st = e->tp_state[FR_TP_UCX];
    if (!st || !(p->ep.transports & FR_TRANSPORT_UCX))
        return fr_fail(err, FERRY_ENOTSUP, st ? "the peer does not serve ucx" : "this engine does not run ucx");
    ucx_conn *c = fr_calloc(1, sizeof *c);
    if (!c)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    c->st = st;
    c->p = p;
    c->fd = -1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    uint8_t *addr = NULL;
    int rc = ctrl_open(e, c, &addr, err);
    if (rc == 0)
        rc = make_ep(c, addr, err);
    fr_free(addr);
    if (rc == 0 && (rc = fr_ucx_attach(st, c)) < 0)
        fr_fail(err, rc, "cannot hand the connection to %s to the progress thread: %s", c->peer, ferry_strerror(rc));
    if (rc < 0) {
        if (c->ep) {
            ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
            void *req = ucp_ep_close_nbx(c->ep, &prm);
            if (UCS_PTR_IS_PTR(req)) {
                while (ucp_request_check_status(req) == UCS_INPROGRESS)
                    ucp_worker_progress(st->worker);
                ucp_request_free(req);
            }
        }
        conn_free(c);
        return rc;
    }
    FR_DEBUG(UCX_TAG, "connected to %s", c->peer);
    *out = c;
    return 0;
}

/* The progress thread fails what is outstanding and lets go; then free. */
static void ucx_disconnect(void *conn)
{
    ucx_conn *c = conn;
    pthread_mutex_lock(&c->lock);
    c->closing = true;
    pthread_mutex_unlock(&c->lock);
    fr_ucx_wake(c->st);
    pthread_mutex_lock(&c->lock);
    while (!c->released)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
    conn_free(c);
}

static bool ucx_alive(void *conn)
{
    ucx_conn *c = conn;
    pthread_mutex_lock(&c->lock);
    bool ok = !c->failed && !atomic_load(&c->ep_err);
    pthread_mutex_unlock(&c->lock);
    return ok;
}

const fr_transport fr_transport_ucx = {
    .name = "ucx",
    .bit = FR_TRANSPORT_UCX,
    .max_chunk = 0,            /* tcp_chunk (4 MiB): a flush per post covers it all anyway */
    .strided = true,           /* a put or get per row, all under one check */
    .disjoint_rows = false,
    .max_rows = 512,           /* as tcp: a fault or a completion covers at most 512 rows */
    /* Only in an engine that names it: its start loads UCX and its worker
     * opens UCX's own listeners, which nothing else should pay for. */
    .on_demand = true,
    .start = fr_ucx_start,
    .stop = fr_ucx_stop,
    .connect = ucx_connect,
    .post = ucx_post,
    .disconnect = ucx_disconnect,
    .alive = ucx_alive,
    .mem_alloc = fr_ucx_mem_alloc,
    .mem_free = fr_ucx_mem_free,
    .reg = fr_ucx_region_map,
    .dereg = fr_ucx_region_unmap,
};
