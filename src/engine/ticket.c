/* Batches, tickets, the in-flight window, notification ordering, fences and
 * the pending-transfer manager.
 *
 * A batch becomes chunks (ops split at the transport's chunk size). A ticket
 * counts its chunks down; the last completion decides the terminal state
 * from what happened: no error -> COMPLETED; an error and no destination
 * byte possibly touched -> ABORTED; an error after I/O began ->
 * FAILED_DRAINED. Because the decision is taken only when every chunk has
 * completed, "drained" is true by construction.
 *
 * The first chunk that fails is remembered (a pointer into the ticket's own
 * chunks, which carry their op's index, opcode, peer, span and key), so
 * ferry_ticket_error can name the op and the cause later at no cost to the
 * path of a chunk that succeeds. */
#include <string.h>

#include "engine/engine_int.h"

/* Per peer of a ticket: notify k may go out once every WRITE chunk to that
 * peer submitted before it (epochs 0..k) has completed successfully. */
typedef struct fr_tpeer {
    ferry_peer_id peer;
    uint32_t nnotify;
    uint32_t next_notify;      /* next notify to post */
    uint32_t *epoch_left;      /* [nnotify + 1] WRITE chunks outstanding per epoch */
    fr_chunk **notifies;       /* [nnotify] */
    bool write_failed;
    bool posting;              /* a thread is posting this peer's notifies */
    bool fenced;               /* this ticket holds a fence on the peer */
    uint64_t fence_gen;        /* peer reset generation the fence belongs to */
} fr_tpeer;

struct ferry_ticket {
    ferry_engine *e;
    uint64_t id;
    struct ferry_ticket *prev, *next;
    fr_chunk *chunks;
    uint32_t nchunks, left;
    uint64_t bytes_total, bytes_done, charged_bytes;
    int error;
    const fr_chunk *failed;    /* the chunk that set error (one of chunks) */
    bool touched;
    int state;
    bool unknown, orphan;
    uint32_t posters;          /* threads posting notifies: keep the ticket alive */
    ferry_region **pins;
    size_t npins;
    fr_tpeer *tp;
    size_t ntp;
    uint64_t started_ns;
};

const char *ferry_ticket_state_name(enum ferry_ticket_state s)
{
    switch (s) {
    case FERRY_TICKET_PENDING: return "PENDING";
    case FERRY_TICKET_COMPLETED: return "COMPLETED";
    case FERRY_TICKET_ABORTED: return "ABORTED";
    case FERRY_TICKET_FAILED_DRAINED: return "FAILED_DRAINED";
    case FERRY_TICKET_UNKNOWN: return "UNKNOWN";
    }
    return "?";
}

static void ticket_destroy(struct ferry_ticket *t)
{
    for (size_t i = 0; i < t->ntp; i++) {
        fr_free(t->tp[i].epoch_left);
        fr_free(t->tp[i].notifies);
    }
    fr_free(t->tp);
    fr_free(t->pins);
    fr_free(t->chunks);
    fr_free(t);
}

static void unlink_locked(ferry_engine *e, struct ferry_ticket *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else
        e->tickets = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->prev = t->next = NULL;
}

static fr_tpeer *tpeer_of(struct ferry_ticket *t, ferry_peer_id peer)
{
    for (size_t i = 0; i < t->ntp; i++)
        if (t->tp[i].peer == peer)
            return &t->tp[i];
    return NULL;
}

/* Fence every peer of t (a wait timed out or the caller let go early). */
static void fence_locked(ferry_engine *e, struct ferry_ticket *t)
{
    if (t->unknown)
        return;
    t->unknown = true;
    FR_STAT_ADD(e, tickets_unknown, 1);
    for (size_t i = 0; i < t->ntp; i++) {
        fr_peer *p = e->peers[t->tp[i].peer];
        p->fenced++;
        t->tp[i].fenced = true;
        t->tp[i].fence_gen = p->reset_gen;
    }
    FR_WARN("engine", "ticket %llu outcome unknown: its peers are fenced until it drains",
            (unsigned long long)t->id);
}

static void unfence_locked(ferry_engine *e, struct ferry_ticket *t)
{
    for (size_t i = 0; i < t->ntp; i++) {
        fr_peer *p = e->peers[t->tp[i].peer];
        if (t->tp[i].fenced && t->tp[i].fence_gen == p->reset_gen && p->fenced > 0)
            p->fenced--;
        t->tp[i].fenced = false;
    }
}

/* The last chunk completed: decide the terminal state and release. */
static void finalize_locked(ferry_engine *e, struct ferry_ticket *t)
{
    if (t->error == 0) {
        t->state = FERRY_TICKET_COMPLETED;
        FR_STAT_ADD(e, tickets_completed, 1);
    } else if (t->touched) {
        t->state = FERRY_TICKET_FAILED_DRAINED;
        FR_STAT_ADD(e, tickets_failed, 1);
    } else {
        t->state = FERRY_TICKET_ABORTED;
        FR_STAT_ADD(e, tickets_aborted, 1);
    }
    for (size_t i = 0; i < t->npins; i++)
        t->pins[i]->pins--;
    unfence_locked(e, t);
    pthread_cond_broadcast(&e->cond);
}

/* Notifies of tp that became ready: a contiguous run of tp->notifies,
 * starting at *from; returns how many. */
static size_t ready_notifies_locked(fr_tpeer *tp, size_t *from, bool *failed)
{
    *from = tp->next_notify;
    while (tp->next_notify < tp->nnotify) {
        uint32_t k = tp->next_notify;
        bool ready = true;
        for (uint32_t j = 0; j <= k && ready; j++)
            ready = tp->epoch_left[j] == 0;
        if (!ready)
            break;
        tp->next_notify++;
    }
    *failed = tp->write_failed;
    return tp->next_notify - *from;
}

static void post_or_fail(ferry_engine *e, ferry_peer_id peer, fr_chunk **c, size_t n, bool fail,
                         bool from_completion)
{
    if (n == 0)
        return;
    /* A notify after a failed WRITE is never sent: it would tell the
     * receiver that bytes landed which did not. */
    int rc = fail ? FERRY_ECANCELED : fr_peer_post(e, peer, c, n, from_completion);
    if (rc < 0)
        for (size_t i = 0; i < n; i++)
            fr_chunk_done(c[i], rc, false);
}

/* An orphaned ticket is freed by whoever sees it terminal with no poster
 * left (engine lock held); returns true when the caller must destroy it. */
static bool release_locked(ferry_engine *e, struct ferry_ticket *t)
{
    if (!t->orphan || t->state == FERRY_TICKET_PENDING || t->posters > 0)
        return false;
    unlink_locked(e, t);
    return true;
}

/* Post tp's ready notifies, in order. Only one thread posts for a tpeer at
 * a time (tp->posting); a completion that finds a poster at work leaves the
 * newly ready notifies to it, so they can never be posted out of order.
 * Called with the engine lock held and tp->posting claimed; returns with the
 * lock released. */
static void post_notifies(ferry_engine *e, struct ferry_ticket *t, fr_tpeer *tp, bool from_completion)
{
    for (;;) {
        size_t from;
        bool failed;
        size_t n = ready_notifies_locked(tp, &from, &failed);
        if (n == 0)
            break;
        pthread_mutex_unlock(&e->lock);
        post_or_fail(e, tp->peer, tp->notifies + from, n, failed, from_completion);
        pthread_mutex_lock(&e->lock);
    }
    tp->posting = false;
    t->posters--;
    bool destroy = release_locked(e, t);
    pthread_mutex_unlock(&e->lock);
    if (destroy)
        ticket_destroy(t);
}

/* Claim tp for posting (engine lock held). */
static bool claim_poster_locked(struct ferry_ticket *t, fr_tpeer *tp)
{
    if (tp->posting || tp->next_notify >= tp->nnotify)
        return false;
    tp->posting = true;
    t->posters++;
    return true;
}

void fr_chunk_done(fr_chunk *c, int status, bool touched)
{
    if (c->intercept) {
        void (*hook)(fr_chunk *, int, bool) = c->intercept;
        c->intercept = NULL;   /* the wrapper completes it for real, once */
        hook(c, status, touched);
        return;
    }
    struct ferry_ticket *t = c->t;
    ferry_engine *e = t->e;
    fr_tpeer *poster = NULL;

    const uint64_t bytes = c->opcode == FERRY_OP_NOTIFY ? 0 : fr_chunk_bytes(c);
    pthread_mutex_lock(&e->lock);
    if (status == 0 && c->opcode != FERRY_OP_NOTIFY) {
        t->bytes_done += bytes;
        touched = true;
        if (c->opcode == FERRY_OP_WRITE)
            FR_STAT_ADD(e, bytes_written, bytes);
        else
            FR_STAT_ADD(e, bytes_read, bytes);
    }
    if (status == 0) {
        FR_STAT_ADD(e, ops_completed, 1);
    } else {
        FR_STAT_ADD(e, ops_failed, 1);
        if (t->error == 0) {
            t->error = status;
            t->failed = c;
        }
    }
    if (touched)
        t->touched = true;
    e->inflight_bytes -= bytes < e->inflight_bytes ? bytes : e->inflight_bytes;
    if (e->inflight_ops > 0)
        e->inflight_ops--;

    if (c->opcode == FERRY_OP_WRITE) {
        fr_tpeer *tp = tpeer_of(t, c->peer_id);
        if (tp && tp->nnotify > 0) {
            tp->epoch_left[c->epoch]--;
            if (status < 0)
                tp->write_failed = true;
            if (claim_poster_locked(t, tp))
                poster = tp;
        }
    }
    /* Waiters care about a ticket ending (finalize wakes them) or, for a
     * submitter blocked on the window, about room: waking every waiter on
     * each chunk would cost a context switch per small op. */
    if (--t->left == 0)
        finalize_locked(e, t);
    else if (e->admit_waiters)
        pthread_cond_broadcast(&e->cond);
    if (poster) {
        post_notifies(e, t, poster, true);   /* releases the lock, may free t */
        return;
    }
    bool destroy = release_locked(e, t);
    pthread_mutex_unlock(&e->lock);
    if (destroy)
        ticket_destroy(t);
}

/* ---- submit ------------------------------------------------------------- */

typedef struct {
    size_t nchunks;
    uint64_t bytes;
    size_t npeers;
    ferry_peer_id *peers;
} batch_shape;

/* A wrapper transport (fault injection) chunks like what it wraps. */
static const fr_transport *real_transport(ferry_engine *e, ferry_peer_id peer)
{
    const fr_peer *p = e->peers[peer];
    return p->inner_tp ? p->inner_tp : p->tp;
}

static uint64_t chunk_size(ferry_engine *e, ferry_peer_id peer)
{
    const fr_transport *tp = real_transport(e, peer);
    uint64_t cs = tp && tp->max_chunk ? tp->max_chunk : e->cfg.tcp_chunk;
    if (cs == 0 || cs > FR_WIRE_MAX_DATA)
        cs = FR_WIRE_MAX_DATA;
    return cs;
}

/* The most rows of op o that its peer's transport takes in one chunk: 0
 * when it takes none (each row goes alone), UINT64_MAX when only the chunk
 * size limits it. */
static uint64_t row_limit(ferry_engine *e, const ferry_op *o)
{
    const fr_transport *tp = real_transport(e, o->peer);
    if (!tp || !tp->strided || (tp->disjoint_rows && o->remote_stride < o->len))
        return 0;
    return tp->max_rows ? tp->max_rows : UINT64_MAX;
}

static uint64_t op_rows(const ferry_op *o)
{
    return o->count > 1 ? o->count : 1;
}

/* What a READ/WRITE covers: its local extent, its remote span and the
 * bytes it moves. FERRY_EINVAL when any of them, or an end address,
 * overflows 64 bits. */
static int op_extent(const ferry_op *o, uint64_t *lext, uint64_t *rext, uint64_t *bytes)
{
    const uint64_t rows = op_rows(o);
    uint64_t t, end;
    if (fr_mul_u64(rows, o->len, bytes) < 0 ||
        fr_mul_u64(rows - 1, o->local_stride, &t) < 0 || fr_add_u64(t, o->len, lext) < 0 ||
        fr_mul_u64(rows - 1, o->remote_stride, &t) < 0 || fr_add_u64(t, o->len, rext) < 0 ||
        fr_add_u64((uint64_t)(uintptr_t)o->local, *lext, &end) < 0 ||
        fr_add_u64(o->remote_addr, *rext, &end) < 0)
        return FERRY_EINVAL;
    return 0;
}

/* How an op is cut for its peer's transport. A strided op to a transport
 * that takes rows (limit > 0, see row_limit) goes as chunks of up to *per
 * rows (as many as fit a chunk, at most limit); otherwise each row goes
 * alone, in pieces of at most cs bytes (*per = 0). Returns the number of
 * chunks (at most the op's bytes, so it cannot overflow). */
static uint64_t op_chunks(const ferry_op *o, uint64_t cs, uint64_t limit, uint64_t *per)
{
    const uint64_t rows = op_rows(o);
    if (rows > 1 && limit > 0 && o->len <= cs) {
        *per = cs / o->len < limit ? cs / o->len : limit;
        return rows / *per + (rows % *per != 0);
    }
    *per = 0;
    return rows * (o->len / cs + (o->len % cs != 0));
}

/* The id of an UNKNOWN ticket that fences peer (engine lock held), 0 when
 * none is found (its fence was taken by a ticket freed since). */
static uint64_t fencing_ticket_locked(ferry_engine *e, ferry_peer_id peer)
{
    for (const struct ferry_ticket *t = e->tickets; t; t = t->next)
        for (size_t i = 0; t->unknown && i < t->ntp; i++)
            if (t->tp[i].peer == peer && t->tp[i].fenced)
                return t->id;
    return 0;
}

static const char *opcode_name(enum ferry_opcode op)
{
    switch (op) {
    case FERRY_OP_READ: return "READ";
    case FERRY_OP_WRITE: return "WRITE";
    case FERRY_OP_NOTIFY: return "NOTIFY";
    }
    return "?";
}

/* Validate every op (engine lock held) and pin the local regions. A refusal
 * names the op in err; the caller decides whether it is worth a log line. */
static int validate_locked(ferry_engine *e, const ferry_op *ops, size_t n, ferry_region **pins, ferry_error *err)
{
    for (size_t i = 0; i < n; i++) {
        const ferry_op *o = &ops[i];
        if (o->peer >= e->npeers || !e->peers[o->peer])
            return fr_fail(err, FERRY_ENOENT, "op %zu: no peer %u (add it with ferry_peer_add or "
                           "ferry_region_import)", i, o->peer);
        if (e->peers[o->peer]->fenced) {
            const uint64_t id = fencing_ticket_locked(e, o->peer);
            return fr_fail(err, FERRY_EFENCED, "op %zu: peer %u is fenced: a transfer to it (ticket %llu) has an "
                           "unknown outcome; it lifts when that ticket drains or the peer is reset "
                           "(ferry_peer_reset)", i, o->peer, (unsigned long long)id);
        }
        pins[i] = NULL;
        if (o->opcode == FERRY_OP_NOTIFY)
            continue;
        if (o->opcode != FERRY_OP_READ && o->opcode != FERRY_OP_WRITE)
            return fr_fail(err, FERRY_EINVAL, "op %zu: opcode %d is none of READ, WRITE, NOTIFY", i, (int)o->opcode);
        if (o->len == 0 || !o->local)
            return fr_fail(err, FERRY_EINVAL, "op %zu: a %s with %s", i, opcode_name(o->opcode),
                           o->len == 0 ? "len 0" : "no local buffer");
        uint64_t lext, rext, bytes;
        if (op_extent(o, &lext, &rext, &bytes) < 0)
            return fr_fail(err, FERRY_EINVAL, "op %zu: its extent overflows 64 bits (%llu rows of %llu bytes, "
                           "local at %p stride %llu, remote at 0x%llx stride %llu)", i,
                           (unsigned long long)op_rows(o), (unsigned long long)o->len, o->local,
                           (unsigned long long)o->local_stride, (unsigned long long)o->remote_addr,
                           (unsigned long long)o->remote_stride);
        pins[i] = fr_region_find_local(e, o->local, lext);
        if (!pins[i])
            return fr_fail(err, FERRY_EFAULT, "op %zu: local buffer %p+%llu is not inside a registered region "
                           "(ferry_region_register)", i, o->local, (unsigned long long)lext);
    }
    return 0;
}

static int add_peer(struct ferry_ticket *t, ferry_peer_id peer)
{
    if (tpeer_of(t, peer))
        return 0;
    fr_tpeer *np = fr_reallocarray(t->tp, t->ntp + 1, sizeof *t->tp);
    if (!np)
        return FERRY_ENOMEM;
    t->tp = np;
    memset(&t->tp[t->ntp], 0, sizeof *t->tp);
    t->tp[t->ntp++].peer = peer;
    return 0;
}

/* Build the ticket and its chunks (no lock held; the engine only grows peers). */
static int build(ferry_engine *e, const ferry_op *ops, size_t n, struct ferry_ticket *t, ferry_error *err)
{
    size_t nchunks = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = add_peer(t, ops[i].peer);
        if (rc < 0)
            return fr_fail(err, rc, "submit: out of memory");
        fr_tpeer *tp = tpeer_of(t, ops[i].peer);
        if (ops[i].opcode == FERRY_OP_NOTIFY) {
            tp->nnotify++;
            nchunks++;
        } else {
            uint64_t per, lext = 0, rext = 0, bytes = 0;
            (void)op_extent(&ops[i], &lext, &rext, &bytes);   /* validated */
            uint64_t k = op_chunks(&ops[i], chunk_size(e, ops[i].peer), row_limit(e, &ops[i]), &per);
            if (k > UINT32_MAX || fr_add_u64(t->bytes_total, bytes, &t->bytes_total) < 0)
                return fr_fail(err, FERRY_ERANGE, "op %zu: the batch's bytes or pieces overflow (at most %u "
                               "pieces a batch)", i, (unsigned)UINT32_MAX);
            nchunks += k;
        }
        if (nchunks > UINT32_MAX)
            return fr_fail(err, FERRY_ERANGE, "op %zu: the batch is cut into more than %u pieces: submit it in "
                           "parts", i, (unsigned)UINT32_MAX);
    }
    for (size_t i = 0; i < t->ntp; i++) {
        fr_tpeer *tp = &t->tp[i];
        tp->epoch_left = fr_calloc(tp->nnotify + 1, sizeof *tp->epoch_left);
        tp->notifies = fr_calloc(tp->nnotify + 1, sizeof *tp->notifies);
        if (!tp->epoch_left || !tp->notifies)
            return fr_fail(err, FERRY_ENOMEM, "submit: out of memory");
        tp->nnotify = 0;     /* recounted while chunking */
    }
    t->chunks = fr_calloc(nchunks, sizeof *t->chunks);
    if (!t->chunks)
        return fr_fail(err, FERRY_ENOMEM, "submit: out of memory for %zu pieces", nchunks);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_op *o = &ops[i];
        fr_tpeer *tp = tpeer_of(t, o->peer);
        if (o->opcode == FERRY_OP_NOTIFY) {
            fr_chunk *c = &t->chunks[k++];
            *c = (fr_chunk){.t = t, .opcode = o->opcode, .op = (uint32_t)i, .peer_id = o->peer,
                            .tag = o->tag, .value = o->value, .epoch = tp->nnotify};
            tp->notifies[tp->nnotify++] = c;
            continue;
        }
        const uint64_t cs = chunk_size(e, o->peer), rows = op_rows(o);
        uint64_t per, lext = 0, rext = 0, bytes = 0;
        (void)op_extent(o, &lext, &rext, &bytes);   /* validated */
        (void)op_chunks(o, cs, row_limit(e, o), &per);
        /* Every chunk carries the whole op's span: the target refuses all
         * of a partly-outside op. Row addresses stay inside the validated
         * extents, so they cannot overflow. */
        const fr_chunk proto = {.t = t, .opcode = o->opcode, .op = (uint32_t)i, .peer_id = o->peer,
                                .key = o->key, .epoch = tp->nnotify, .span_addr = o->remote_addr,
                                .span_len = rext};
        for (uint64_t r = 0; r < rows; r += per ? per : 1) {
            uint8_t *local = (uint8_t *)o->local + r * o->local_stride;
            uint64_t remote = o->remote_addr + r * o->remote_stride;
            if (per) {   /* rows [r, r + n) in one chunk */
                fr_chunk *c = &t->chunks[k++];
                *c = proto;
                c->local = local;
                c->remote_addr = remote;
                c->len = o->len;
                c->rows = rows - r < per ? rows - r : per;
                c->lstride = o->local_stride;
                c->rstride = o->remote_stride;
                if (o->opcode == FERRY_OP_WRITE)
                    tp->epoch_left[tp->nnotify]++;
                continue;
            }
            for (uint64_t off = 0; off < o->len; off += cs) {
                fr_chunk *c = &t->chunks[k++];
                *c = proto;
                c->local = local + off;
                c->remote_addr = remote + off;
                c->len = o->len - off < cs ? o->len - off : cs;
                if (o->opcode == FERRY_OP_WRITE)
                    tp->epoch_left[tp->nnotify]++;
            }
        }
    }
    t->nchunks = t->left = (uint32_t)nchunks;
    return 0;
}

/* Admit the ticket into the window (engine lock held). */
static int admit_locked(ferry_engine *e, struct ferry_ticket *t, unsigned flags, ferry_error *err)
{
    for (;;) {
        if (e->closing)
            return fr_fail(err, FERRY_ECANCELED, "submit: the engine is closing");
        bool empty = e->inflight_bytes == 0 && e->inflight_ops == 0;
        bool fits = e->inflight_bytes + t->bytes_total <= e->cfg.window_bytes &&
                    (uint64_t)e->inflight_ops + t->nchunks <= e->cfg.window_ops;
        if (empty || fits)
            break;
        if (flags & FERRY_SUBMIT_NONBLOCK)
            return fr_fail(err, FERRY_EAGAIN, "submit: the in-flight window is full (%llu of %llu bytes and %u of "
                           "%u pieces in flight; this batch needs %llu bytes in %u pieces)",
                           (unsigned long long)e->inflight_bytes, (unsigned long long)e->cfg.window_bytes,
                           e->inflight_ops, e->cfg.window_ops, (unsigned long long)t->bytes_total, t->nchunks);
        e->admit_waiters++;
        pthread_cond_wait(&e->cond, &e->lock);
        e->admit_waiters--;
    }
    e->inflight_bytes += t->bytes_total;
    e->inflight_ops += t->nchunks;
    return 0;
}

static int post_all(ferry_engine *e, struct ferry_ticket *t)
{
    fr_chunk **list = fr_calloc(t->nchunks ? t->nchunks : 1, sizeof *list);
    if (!list)
        return FERRY_ENOMEM;
    for (size_t p = 0; p < t->ntp; p++) {
        fr_tpeer *tp = &t->tp[p];
        /* Notifies with no WRITE before them are ready at once. */
        pthread_mutex_lock(&e->lock);
        if (claim_poster_locked(t, tp))
            post_notifies(e, t, tp, false);
        else
            pthread_mutex_unlock(&e->lock);
        size_t n = 0;
        for (uint32_t i = 0; i < t->nchunks; i++) {
            fr_chunk *c = &t->chunks[i];
            if (c->peer_id == tp->peer && c->opcode != FERRY_OP_NOTIFY)
                list[n++] = c;
        }
        post_or_fail(e, tp->peer, list, n, false, false);
    }
    fr_free(list);
    return 0;
}

int ferry_submit(ferry_engine *e, const ferry_op *ops, size_t n, unsigned flags, ferry_ticket **out,
                 ferry_error *err)
{
    if (!e || !ops || n == 0 || !out)
        return fr_fail(err, FERRY_EINVAL, "submit: no engine, ops or out, or no op");
    struct ferry_ticket *t = fr_calloc(1, sizeof *t);
    ferry_region **pins = fr_calloc(n, sizeof *pins);
    int rc = FERRY_ENOMEM;
    if (!t || !pins) {
        fr_fail(err, rc, "submit: out of memory for a ticket of %zu ops", n);
        goto fail;
    }
    t->e = e;
    t->state = FERRY_TICKET_PENDING;
    t->started_ns = fr_now_ns();

    /* Connect every peer first: a refused connect fails the submit with
     * nothing moved. */
    for (size_t i = 0; i < n; i++) {
        rc = fr_peer_connect(e, ops[i].peer, err);
        if (rc < 0) {
            if (err)
                fr_fail(err, rc, "op %zu: %s", i, err->msg);
            goto fail;
        }
    }
    pthread_mutex_lock(&e->lock);
    rc = validate_locked(e, ops, n, pins, err);
    pthread_mutex_unlock(&e->lock);
    if (rc < 0)
        goto fail;
    rc = build(e, ops, n, t, err);
    if (rc < 0)
        goto fail;

    pthread_mutex_lock(&e->lock);
    rc = admit_locked(e, t, flags, err);
    if (rc == 0)
        rc = validate_locked(e, ops, n, pins, err);   /* regions or fences may have changed while waiting */
    if (rc < 0) {
        if (rc != FERRY_EAGAIN && rc != FERRY_ECANCELED) {
            e->inflight_bytes -= t->bytes_total;
            e->inflight_ops -= t->nchunks;
        }
        pthread_mutex_unlock(&e->lock);
        goto fail;
    }
    /* Pin each distinct region once. */
    t->pins = pins;
    for (size_t i = 0; i < n; i++) {
        if (!pins[i])
            continue;
        bool dup = false;
        for (size_t j = 0; j < t->npins && !dup; j++)
            dup = t->pins[j] == pins[i];
        if (!dup) {
            t->pins[t->npins++] = pins[i];
            pins[i]->pins++;
        }
    }
    pins = NULL;
    t->id = ++e->next_ticket_id;
    t->next = e->tickets;
    if (e->tickets)
        e->tickets->prev = t;
    e->tickets = t;
    pthread_mutex_unlock(&e->lock);

    *out = t;
    post_all(e, t);
    return 0;
fail:
    fr_free(pins);
    if (t)
        ticket_destroy(t);
    return rc;
}

/* ---- waiting, freeing, pending ------------------------------------------ */

int ferry_ticket_wait(ferry_ticket *t, int timeout_ms)
{
    if (!t)
        return FERRY_EINVAL;
    ferry_engine *e = t->e;
    uint64_t deadline = fr_deadline_ns(timeout_ms);
    struct timespec ts = fr_timespec_at(deadline);
    pthread_mutex_lock(&e->lock);
    while (t->state == FERRY_TICKET_PENDING) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&e->cond, &e->lock);
            continue;
        }
        if (pthread_cond_timedwait(&e->cond, &e->lock, &ts) != 0 && fr_now_ns() >= deadline &&
            t->state == FERRY_TICKET_PENDING) {
            fence_locked(e, t);
            pthread_mutex_unlock(&e->lock);
            return FERRY_TICKET_UNKNOWN;
        }
    }
    int s = t->state;
    pthread_mutex_unlock(&e->lock);
    return s;
}

int ferry_ticket_test(const ferry_ticket *t)
{
    if (!t)
        return FERRY_EINVAL;
    pthread_mutex_lock(&t->e->lock);
    int s = t->state == FERRY_TICKET_PENDING && t->unknown ? FERRY_TICKET_UNKNOWN : t->state;
    pthread_mutex_unlock(&t->e->lock);
    return s;
}

/* What the code of a failed chunk says happened. */
static const char *failure_cause(int code)
{
    switch (code) {
    case FERRY_EACCES: return "refused by the peer: access refused: wrong remote key or access not allowed";
    case FERRY_EFAULT: return "refused by the peer: the range lies outside its region";
    case FERRY_ECONNRESET: return "the connection to the peer was lost";
    case FERRY_ECANCELED: return "cancelled: the engine is closing, the peer was reset, or a WRITE before this "
                                 "NOTIFY failed";
    default: return NULL;
    }
}

/* The sentence of t's first failure (engine lock held): the op it belongs
 * to, the cause and where the ticket stands. */
static int describe_failure_locked(const struct ferry_ticket *t, ferry_error *err)
{
    const fr_chunk *c = t->failed;
    const char *cause = failure_cause(t->error);
    const char *outcome = "; other ops of the ticket are still in flight";
    if (t->state == FERRY_TICKET_ABORTED)
        outcome = "; the ticket ended ABORTED: no destination byte touched";
    else if (t->state == FERRY_TICKET_FAILED_DRAINED)
        outcome = "; the ticket ended FAILED_DRAINED: the destination may be modified, nothing is in flight";
    char what[200];
    if (!c) {   /* cannot happen: every error comes with its chunk */
        snprintf(what, sizeof what, "ticket %llu", (unsigned long long)t->id);
    } else if (c->opcode == FERRY_OP_NOTIFY) {
        snprintf(what, sizeof what, "op %u (NOTIFY tag %llu value %llu to peer %u)", c->op,
                 (unsigned long long)c->tag, (unsigned long long)c->value, c->peer_id);
    } else {
        uint64_t bytes = 0;   /* the op's chunks lie together in t->chunks */
        for (uint32_t i = 0; i < t->nchunks; i++)
            if (t->chunks[i].op == c->op)
                bytes += fr_chunk_bytes(&t->chunks[i]);
        char span[48] = "";
        if (bytes != c->span_len)
            snprintf(span, sizeof span, ", strided over %llu bytes", (unsigned long long)c->span_len);
        snprintf(what, sizeof what, "op %u (%s of %llu bytes%s %s peer %u at 0x%llx, key %016llx)", c->op,
                 opcode_name(c->opcode), (unsigned long long)bytes, span,
                 c->opcode == FERRY_OP_READ ? "from" : "to", c->peer_id, (unsigned long long)c->span_addr,
                 (unsigned long long)c->key);
    }
    return fr_fail(err, t->error, "%s failed: %s%s", what, cause ? cause : ferry_strerror(t->error), outcome);
}

int ferry_ticket_error(const ferry_ticket *t, ferry_error *err)
{
    if (!t)
        return fr_fail(err, FERRY_EINVAL, "ticket error: no ticket");
    pthread_mutex_lock(&t->e->lock);
    int code = t->error;
    if (code < 0 && err)
        describe_failure_locked(t, err);
    pthread_mutex_unlock(&t->e->lock);
    return code;
}

uint64_t fr_ticket_pinning_locked(ferry_engine *e, const ferry_region *r, bool *unknown)
{
    for (const struct ferry_ticket *t = e->tickets; t; t = t->next) {
        if (t->state != FERRY_TICKET_PENDING)
            continue;
        for (size_t i = 0; i < t->npins; i++)
            if (t->pins[i] == r) {
                *unknown = t->unknown;
                return t->id;
            }
    }
    *unknown = false;
    return 0;
}

uint64_t ferry_ticket_bytes(const ferry_ticket *t)
{
    if (!t)
        return 0;
    pthread_mutex_lock(&t->e->lock);
    uint64_t b = t->bytes_done;
    pthread_mutex_unlock(&t->e->lock);
    return b;
}

void ferry_ticket_free(ferry_ticket *t)
{
    if (!t)
        return;
    ferry_engine *e = t->e;
    pthread_mutex_lock(&e->lock);
    t->orphan = true;
    if (t->state == FERRY_TICKET_PENDING)
        fence_locked(e, t);   /* still in flight: the pending-transfer manager keeps it */
    bool destroy = release_locked(e, t);
    pthread_mutex_unlock(&e->lock);
    if (destroy)
        ticket_destroy(t);
}

uint64_t ferry_ticket_id(const ferry_ticket *t)
{
    return t ? t->id : 0;
}

int ferry_engine_pending(ferry_engine *e, ferry_pending_info *out, size_t cap)
{
    if (!e)
        return FERRY_EINVAL;
    int n = 0;
    uint64_t now = fr_now_ns();
    pthread_mutex_lock(&e->lock);
    for (struct ferry_ticket *t = e->tickets; t; t = t->next) {
        if (t->state != FERRY_TICKET_PENDING || !t->unknown)
            continue;
        if (out && (size_t)n < cap)
            out[n] = (ferry_pending_info){.id = t->id, .peer = t->ntp ? t->tp[0].peer : 0,
                                          .bytes_total = t->bytes_total,
                                          .age_ms = (now - t->started_ns) / 1000000};
        n++;
    }
    pthread_mutex_unlock(&e->lock);
    return n;
}

/* Engine close: free every ticket left (all drained by then). */
void fr_tickets_destroy_all(ferry_engine *e)
{
    pthread_mutex_lock(&e->lock);
    struct ferry_ticket *t = e->tickets;
    e->tickets = NULL;
    pthread_mutex_unlock(&e->lock);
    while (t) {
        struct ferry_ticket *next = t->next;
        ticket_destroy(t);
        t = next;
    }
}

/* Wait until no ticket is in flight (engine close, after peers are gone). */
void fr_tickets_wait_drained(ferry_engine *e)
{
    pthread_mutex_lock(&e->lock);
    for (;;) {
        bool busy = false;
        for (struct ferry_ticket *t = e->tickets; t && !busy; t = t->next)
            busy = t->state == FERRY_TICKET_PENDING;
        if (!busy)
            break;
        pthread_cond_wait(&e->cond, &e->lock);
    }
    pthread_mutex_unlock(&e->lock);
}
