/* The master's connections: input buffering and framing, output queueing
 * and non-blocking writes, reply encoding (master_int.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/master_int.h"

fr_master_conn *fr_master_conn_new(fr_master *m, int fd, uint16_t role, const char *peer)
{
    fr_master_conn *c = fr_calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->m = m;
    c->fd = fd;
    c->serial = ++m->serial;
    c->role = role;
    snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "?");
    c->last_seen = m->live;
    fr_dlist_init(&c->watches);
    fr_dlist_init(&c->waits);
    fr_dlist_push_back(&m->conns, &c->link);
    m->nconns++;
    return c;
}

void fr_master_conn_free(fr_master_conn *c)
{
    if (c == NULL)
        return;
    fr_master *m = c->m;
    fr_master_conn_gone(c);
    while (!fr_dlist_empty(&c->waits))
        fr_master_wait_free(fr_container_of(c->waits.next, fr_master_wait, clink), true);
    while (!fr_dlist_empty(&c->watches))
        fr_master_watch_free(fr_container_of(c->watches.next, fr_master_watch, clink));
    fr_dlist_remove(&c->link);
    m->nconns--;
    if (c->fd >= 0) {
        epoll_ctl(m->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    m->out_total -= fr_master_conn_pending_out(c);
    fr_free(c->in.p);
    fr_free(c->out.p);
    fr_free(c);
}

size_t fr_master_conn_pending_out(const fr_master_conn *c)
{
    return c->out.len - c->out.off;
}

bool fr_master_conn_backed_up(const fr_master_conn *c)
{
    size_t out = fr_master_conn_pending_out(c);
    return out >= FR_MASTER_OUT_HIGH ||
           (c->m->out_total >= FR_MASTER_OUT_TOTAL && out >= FR_MASTER_OUT_LOW);
}

/* Room for `need` more bytes after len, compacting first. */
static int buf_reserve(fr_master_buf *b, size_t need)
{
    if (b->off > 0 && (b->off == b->len || b->off >= b->cap / 2)) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    if (b->cap - b->len >= need)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < need) {
        if (cap > SIZE_MAX / 2)
            return FERRY_ENOMEM;
        cap *= 2;
    }
    uint8_t *p = fr_realloc(b->p, cap);
    if (p == NULL)
        return FERRY_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

static void conn_drop(fr_master_conn *c, const char *why)
{
    if (!c->dead)
        FR_WARN("master", "closing connection %s (#%llu): %s", c->peer,
                (unsigned long long)c->serial, why);
    c->dead = true;
}

/* ---- replies ------------------------------------------------------------ */

static int put_frame(fr_master_conn *c, uint64_t req_id, const fr_smsg *r)
{
    size_t body;
    int rc = fr_smsg_body_len(r, &body);
    if (rc < 0)
        return rc;
    bool ep = c->caps & FR_AUTH_CAP_EPOCH;
    size_t need = FR_WIRE_HDR_LEN + body + (ep ? FR_SMSG_EPOCH_LEN : 0);
    if ((rc = buf_reserve(&c->out, need)) < 0)
        return rc;
    uint8_t *at = c->out.p + c->out.len;
    size_t room = c->out.cap - c->out.len;
    rc = ep ? fr_smsg_encode_epoch(r, req_id, (uint64_t)c->m->epoch, at, room)
            : fr_smsg_encode(r, req_id, at, room);
    if (rc < 0)
        return rc;
    c->out.len += (size_t)rc;
    c->m->out_total += (size_t)rc;
    return 0;
}

void fr_master_reply(fr_master_conn *c, uint64_t req_id, const fr_smsg *r)
{
    int rc = put_frame(c, req_id, r);
    if (rc == 0)
        return;
    if (rc == FERRY_ENOMEM) {
        conn_drop(c, "out of memory for a reply");
        return;
    }
    fr_master_reply_err(c, req_id, rc, 0, "cannot encode the %s reply: %s",
                        fr_smsg_type_name(r->type) ? fr_smsg_type_name(r->type) : "?",
                        ferry_strerror(rc));
}

void fr_master_reply_ok(fr_master_conn *c, uint64_t req_id)
{
    fr_smsg r = { .type = FR_SMSG_OK };
    fr_master_reply(c, req_id, &r);
}

static void reply_text(fr_master_conn *c, uint64_t req_id, int code, uint64_t detail,
                       const char *text)
{
    /* The text field is at most FR_SMSG_TEXT_MAX bytes with no NUL. */
    size_t n = strnlen(text, FR_SMSG_TEXT_MAX);
    fr_smsg r = { .type = FR_SMSG_ERROR, .status = code < 0 ? code : FERRY_EIO, .rev = detail };
    r.val.p = (const uint8_t *)text;
    r.val.n = (uint32_t)n;
    fr_master_mx_error(c->m);
    if (put_frame(c, req_id, &r) < 0)
        conn_drop(c, "cannot queue an error reply");
}

void fr_master_reply_err(fr_master_conn *c, uint64_t req_id, int code, uint64_t detail,
                         const char *fmt, ...)
{
    char text[FR_SMSG_TEXT_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    reply_text(c, req_id, code, detail, text);
}

void fr_master_reply_meta_err(fr_master_conn *c, uint64_t req_id, int code, uint64_t detail)
{
    if (code == FERRY_EIO)
        fr_master_note_fatal(c->m, code);
    const char *msg = fr_meta_errmsg(c->m->meta);
    reply_text(c, req_id, code, detail, msg[0] ? msg : ferry_strerror(code));
}

/* ---- input ---------------------------------------------------------------- */

/* One complete frame: header h, body at b. */
static void conn_frame(fr_master_conn *c, const fr_frame_hdr *h, const uint8_t *b)
{
    c->frames++;
    fr_master_mx_request(c->m, h->type);
    const char *name = fr_smsg_type_name(h->type);
    if (!fr_smsg_is_request(h->type)) {
        if (name)
            fr_master_reply_err(c, h->req_id, FERRY_EPROTO, 0,
                                "%s is a reply, not a request", name);
        else
            fr_master_reply_err(c, h->req_id, FERRY_EPROTO, 0,
                                "message type %u is not a store request", h->type);
        FR_WARN("master", "connection %s sent message type %u as a request", c->peer, h->type);
        c->closing = true;
        return;
    }
    fr_smsg r;
    uint64_t epoch = 0;
    int rc = c->caps & FR_AUTH_CAP_EPOCH ? fr_smsg_decode_epoch(h, b, h->len, &r, &epoch)
                                         : fr_smsg_decode(h, b, h->len, &r);
    if (rc == 0 && c->m->ha && epoch > (uint64_t)c->m->epoch) {
        /* the client heard from a newer leadership: this master is deposed,
         * whatever its own view says; it answers nothing more */
        fr_master_reply_err(c, h->req_id, FERRY_ESTATE, epoch, "the master at %s leads epoch "
                            "%lld, older than epoch %llu this client has seen: it was deposed",
                            c->m->address, (long long)c->m->epoch, (unsigned long long)epoch);
        FR_ERROR("master", "a client has seen epoch %llu, newer than this leadership's (%lld): "
                 "stopping", (unsigned long long)epoch, (long long)c->m->epoch);
        fr_master_note_fatal(c->m, FERRY_ESTATE);
        return;
    }
    if (rc < 0) {
        fr_master_reply_err(c, h->req_id, FERRY_EPROTO, 0, "malformed %s request: %s", name,
                            ferry_strerror(rc));
        FR_WARN("master", "connection %s sent a malformed %s (%u bytes): %s", c->peer, name,
                h->len, ferry_strerror(rc));
        c->closing = true;
        return;
    }
    fr_master_dispatch(c, h, &r);
}

void fr_master_conn_parse(fr_master_conn *c)
{
    fr_master_buf *b = &c->in;
    while (!c->dead && !c->closing && c->m->fatal == 0) {
        /* Back-pressure: replies the peer has not taken yet stop us from
         * answering more; what it sent waits in c->in, and we stop reading
         * (fr_master_conn_interest) until the output drains. */
        if (fr_master_conn_backed_up(c)) {
            if (!c->held)
                c->m->lstats.holds++;
            c->held = true;
            break;
        }
        size_t avail = b->len - b->off;
        if (avail < FR_WIRE_HDR_LEN)
            break;
        fr_frame_hdr h;
        int rc = fr_wire_hdr_decode(b->p + b->off, FR_WIRE_HDR_LEN, &h);
        if (rc < 0) {
            conn_drop(c, rc == FERRY_EMSGSIZE ? "frame longer than the limit"
                                              : "a frame header that does not decode");
            return;
        }
        if (h.type < FR_MSG_STORE_FIRST || h.type > FR_MSG_STORE_LAST) {
            conn_drop(c, "a frame that is not a store message");
            return;
        }
        if (h.len > FR_WIRE_STORE_MAX_LEN) {
            conn_drop(c, "frame longer than the limit");
            return;
        }
        size_t whole = FR_WIRE_HDR_LEN + (size_t)h.len;
        if (avail < whole) {
            if (buf_reserve(b, whole - avail) < 0)
                conn_drop(c, "out of memory for a frame");
            return;
        }
        conn_frame(c, &h, b->p + b->off + FR_WIRE_HDR_LEN);
        b->off += whole;
    }
    if (b->off == b->len)
        b->off = b->len = 0;
}

/* A shut connection: read and drop until EOF. */
static void conn_discard(fr_master_conn *c)
{
    uint8_t sink[16384];
    for (;;) {
        ssize_t n = read(c->fd, sink, sizeof sink);
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            c->dead = true;
        return;
    }
}

void fr_master_conn_shut(fr_master_conn *c)
{
    if (c->fd < 0 || shutdown(c->fd, SHUT_WR) < 0) {
        c->dead = true;
        return;
    }
    c->shut = true;
    c->linger_until = c->m->now_mono + FR_MASTER_LINGER_MS;
}

void fr_master_conn_read(fr_master_conn *c)
{
    size_t got = 0;
    if (c->shut) {
        conn_discard(c);
        return;
    }
    while (!c->dead && !c->closing && !c->held && got < FR_MASTER_READ_BURST) {
        if (buf_reserve(&c->in, 64 * 1024) < 0) {
            conn_drop(c, "out of memory for input");
            return;
        }
        ssize_t n = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
        if (n > 0) {
            c->in.len += (size_t)n;
            got += (size_t)n;
            c->last_seen = c->m->live;   /* any byte is a sign of life, not only a frame */
            fr_master_conn_parse(c);
            continue;
        }
        if (n == 0) {
            c->dead = true;   /* an orderly close needs no warning */
            FR_INFO("master", "connection %s (#%llu) closed by the peer", c->peer,
                    (unsigned long long)c->serial);
            return;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            conn_drop(c, strerror(errno));
        return;
    }
}

/* ---- output ----------------------------------------------------------------- */

bool fr_master_conn_flush(fr_master_conn *c)
{
    fr_master_buf *b = &c->out;
    if (c->fd < 0) {   /* in-memory: output is discarded */
        c->m->out_total -= b->len - b->off;
        b->off = b->len = 0;
        return true;
    }
    while (b->off < b->len) {
        ssize_t n = write(c->fd, b->p + b->off, b->len - b->off);
        if (n > 0) {
            b->off += (size_t)n;
            c->m->out_total -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        conn_drop(c, n < 0 ? strerror(errno) : "short write");
        return false;
    }
    if (b->off == b->len)
        b->off = b->len = 0;
    return true;
}

void fr_master_conn_interest(fr_master_conn *c)
{
    if (c->fd < 0 || c->dead)
        return;
    bool rd = c->shut || (!c->closing && !c->held && !fr_master_conn_backed_up(c));
    bool wr = fr_master_conn_pending_out(c) > 0;
    if (rd == c->reading && wr == c->writing)
        return;
    struct epoll_event ev = { .events = (rd ? EPOLLIN : 0) | (wr ? EPOLLOUT : 0) };
    ev.data.ptr = c;
    if (epoll_ctl(c->m->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0) {
        conn_drop(c, "epoll_ctl failed");
        return;
    }
    c->reading = rd;
    c->writing = wr;
}
