/* Store client: objects — put, get, ranged reads, remove, list (store.h).
 *
 * A put is three steps: PUT_START (the master places every replica), the
 * bytes written by the engine straight into the nodes' segments (a same-host
 * node's segment is mapped, so that is one memcpy), PUT_END. A transfer
 * that fails is followed by PUT_REVOKE, so no reader ever sees a partial
 * object. Batches pipeline every step: one round trip to place n objects,
 * one engine ticket per object, one round trip to complete them. */
#include <string.h>
#include <time.h>

#include "store/client_int.h"

/* Engine waits: the call timeout plus time for the bytes at 100 MB/s. */
static int xfer_timeout(const ferry_store *s, uint64_t bytes)
{
    uint64_t ms = (uint64_t)s->cfg.timeout_ms + bytes / 100000u;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

typedef struct xfer {
    ferry_op *ops;
    size_t nops, cap;
    ferry_region **tmp;       /* temporary local registrations */
    size_t ntmp, cap_tmp;
} xfer;

static void xfer_free(xfer *x)
{
    for (size_t i = 0; i < x->ntmp; i++)
        (void)ferry_region_unregister(x->tmp[i], NULL);
    fr_free(x->tmp);
    fr_free(x->ops);
    memset(x, 0, sizeof *x);
}

static int xfer_local(ferry_store *s, xfer *x, const void *p, size_t len, ferry_error *err)
{
    ferry_region *t = NULL;
    int rc = fr_client_local(s, p, len, &t, err);
    if (rc < 0 || !t)
        return rc;
    rc = fr_grow((void **)&x->tmp, &x->cap_tmp, x->ntmp + 1, sizeof *x->tmp);
    if (rc < 0) {
        (void)ferry_region_unregister(t, NULL);
        return rc;
    }
    x->tmp[x->ntmp++] = t;
    return 0;
}

static int xfer_op(xfer *x, enum ferry_opcode op, void *local, uint64_t len,
                   const fr_segref *seg, uint64_t off)
{
    int rc = fr_grow((void **)&x->ops, &x->cap, x->nops + 1, sizeof *x->ops);
    if (rc < 0)
        return rc;
    x->ops[x->nops++] = (ferry_op){ .opcode = op, .local = local, .len = len,
                                    .peer = seg->rr.peer, .remote_addr = seg->rr.addr + off,
                                    .key = seg->rr.key };
    return 0;
}

/* Submit x's ops as one ticket (or nothing when empty). */
static int xfer_submit(ferry_store *s, xfer *x, ferry_ticket **t, ferry_error *err)
{
    *t = NULL;
    if (x->nops == 0)
        return 0;
    int rc = ferry_submit(s->eng, x->ops, x->nops, 0, t, err);
    if (rc < 0)
        return fr_fail(err, rc, "the engine refused the transfer: %s", fr_why(err, rc));
    return 0;
}

/* Wait for a ticket and free it: 0 or an error. */
static int xfer_wait(ferry_store *s, ferry_ticket *t, uint64_t bytes, ferry_error *err)
{
    if (!t)
        return 0;
    int st = ferry_ticket_wait(t, xfer_timeout(s, bytes));
    int why = ferry_ticket_error(t, err);   /* the first failed op's sentence, when one failed */
    ferry_ticket_free(t);
    if (st == FERRY_TICKET_COMPLETED)
        return 0;
    if (st == FERRY_TICKET_UNKNOWN)
        return fr_fail(err, FERRY_ETIMEDOUT, "the transfer of %llu bytes did not end within %d ms",
                       (unsigned long long)bytes, xfer_timeout(s, bytes));
    if (why >= 0)
        return fr_fail(err, FERRY_EIO, "the transfer failed: %s", ferry_strerror(FERRY_EIO));
    return why;
}

int ferry_replicate_config_init(ferry_replicate_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->replica_num = 1;
    return 0;
}

/* The put's placement request: a NULL or zeroed config is the defaults
 * (ferry_replicate_config_init), resolved here, once, for every put. */
static void rc_to_msg(const ferry_replicate_config *rc, fr_smsg *q)
{
    ferry_replicate_config d;
    (void)ferry_replicate_config_init(&d);
    if (!rc)
        rc = &d;
    q->replica_num = rc->replica_num ? rc->replica_num : d.replica_num;
    q->flag = rc->hard_pin;
    q->npreferred = rc->npreferred;
    q->preferred = rc->preferred_segments;
    q->slot = rc->slot;
}

static void placed_from(const fr_smsg *rep, ferry_object_desc *d)
{
    memset(d, 0, sizeof *d);
    d->size = rep->size;
    d->nreplicas = rep->nrep;
    for (uint32_t i = 0; i < rep->nrep && i < FERRY_STORE_REPLICAS_MAX; i++)
        d->replicas[i] = (ferry_replica_info){ .segment = rep->rep[i].segment,
                                               .node = rep->rep[i].node,
                                               .offset = rep->rep[i].offset,
                                               .preferred = rep->rep[i].preferred };
}

/* Write object i's bytes to every replica of its placement and submit. */
static int put_bytes(ferry_store *s, const fr_smsg *pl, const void *buf, size_t len, xfer *x,
                     ferry_ticket **t, ferry_error *err)
{
    int rc = len ? xfer_local(s, x, buf, len, err) : 0;
    for (uint32_t r = 0; r < pl->nrep && rc == 0 && len; r++) {
        fr_segref seg;
        rc = fr_client_segment(s, pl->rep[r].segment, &seg, err);
        if (rc == 0)
            rc = xfer_op(x, FERRY_OP_WRITE, (void *)(uintptr_t)buf, len, &seg,
                         pl->rep[r].offset);
    }
    if (rc == 0)
        rc = xfer_submit(s, x, t, err);
    return rc;
}

/* PUT_START for every request. The ones refused because too few segments
 * are reachable just now (a node reconnecting, the master just restarted)
 * are asked again, with back-off, until the call's timeout. */
static int place(ferry_store *s, fr_smsg *q, size_t n, fr_smsg *rep, uint8_t **rb, int *results, ferry_error *err)
{
    uint64_t deadline = fr_now_ms() + (uint64_t)s->cfg.timeout_ms;
    int ret = fr_client_rpc_many(s, q, n, FR_SMSG_PLACEMENT, rep, rb, results, err);
    for (unsigned wait = 20; ret == 0; wait = wait < 160 ? wait * 2 : 200) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += results[i] == FERRY_EUNREACH;
        if (k == 0 || fr_now_ms() + wait >= deadline)
            break;
        struct timespec ts = { 0, (long)wait * 1000000L };
        nanosleep(&ts, NULL);
        size_t *idx = fr_calloc(k, sizeof *idx);
        fr_smsg *q2 = fr_calloc(k, sizeof *q2), *rep2 = fr_calloc(k, sizeof *rep2);
        uint8_t **rb2 = fr_calloc(k, sizeof *rb2);
        int *res2 = fr_calloc(k, sizeof *res2);
        if (idx && q2 && rep2 && rb2 && res2) {
            k = 0;
            for (size_t i = 0; i < n; i++)
                if (results[i] == FERRY_EUNREACH) {
                    fr_free(rb[i]);
                    rb[i] = NULL;
                    idx[k] = i;
                    q2[k++] = q[i];
                }
            ret = fr_client_rpc_many(s, q2, k, FR_SMSG_PLACEMENT, rep2, rb2, res2, err);
            for (size_t j = 0; j < k; j++) {
                rep[idx[j]] = rep2[j];
                rb[idx[j]] = rb2[j];
                results[idx[j]] = ret < 0 ? ret : res2[j];
            }
        } else {
            ret = FERRY_ENOMEM;
        }
        fr_free(idx);
        fr_free(q2);
        fr_free(rep2);
        fr_free(rb2);
        fr_free(res2);
    }
    return ret;
}

/* A call whose answer was lost with the connection: the master died or
 * lost its leadership (FERRY_ECONNRESET), or the answer came from a
 * deposed leader and was refused (FERRY_ESTATE from the call itself, not
 * a reply). Whether it was applied is unknown. */
#define FR_PUT_SETTLE_TRIES 2

static bool outcome_unknown(int call_rc)
{
    return call_rc == FERRY_ECONNRESET || call_rc == FERRY_ESTATE;
}

static int one_call(ferry_store *s, uint16_t type, const char *key)
{
    fr_smsg q = { .type = type, .key = fr_client_str(key) }, er;
    uint8_t *eb = NULL;
    int st = 0;
    int rc = fr_client_rpc_many(s, &q, 1, FR_SMSG_OK, &er, &eb, &st, NULL);
    fr_client_free_bufs(&eb, 1);
    return rc < 0 ? rc : st;
}

/* Settle a put whose PUT_START or completion had an unknown outcome
 * (outcome_unknown): an object left pending would refuse every later put
 * of its key until the master's pending timeout (a publish retried after
 * a failover failed at once, again and again). On the next connection (a
 * new leader, or the master restarted on its log): with the bytes
 * written, PUT_END again — 0: complete; else a PUT_REVOKE, which a
 * complete object refuses (FERRY_ESTATE: the lost PUT_END had landed, 0);
 * without them, a PUT_REVOKE. Anything else: the put failed, nothing of it
 * left (or the master is still unreachable, and the pending timeout
 * revokes it). */
static int put_settle(ferry_store *s, const char *key, bool written)
{
    int rc = FERRY_ECONNRESET;
    /* a second try when the first finds no master yet (a takeover takes
     * the lease TTL; each try waits the call timeout for a connection) */
    for (int i = 0; i < FR_PUT_SETTLE_TRIES && outcome_unknown(rc); i++) {
        rc = written ? one_call(s, FR_SMSG_PUT_END, key) : 0;
        if (written && rc == 0)
            return 0;
        if (!outcome_unknown(rc))
            rc = one_call(s, FR_SMSG_PUT_REVOKE, key);
    }
    return written && rc == FERRY_ESTATE ? 0 : -1;
}

static int put_batch(ferry_store *s, const char *const *keys, const void *const *bufs,
                     const size_t *lens, size_t n, const ferry_replicate_config *rc,
                     int *results, ferry_object_desc *placed, ferry_error *err)
{
    if (!s || (n && (!keys || !bufs || !lens || !results)))
        return fr_fail(err, FERRY_EINVAL, "put: bad arguments");
    if (rc && rc->replica_num > FERRY_STORE_REPLICAS_MAX)
        return fr_fail(err, FERRY_EINVAL, "put: replica_num above %d", FERRY_STORE_REPLICAS_MAX);
    if (rc && !FR_RESERVED_OK(rc))
        return fr_fail(err, FERRY_EINVAL, "put: the placement config's reserved fields must be "
                             "zero (start from ferry_replicate_config_init)");
    fr_smsg *q = fr_calloc(n ? n : 1, sizeof *q);
    fr_smsg *rep = fr_calloc(n ? n : 1, sizeof *rep);
    uint8_t **rb = fr_calloc(n ? n : 1, sizeof *rb);
    xfer *xs = fr_calloc(n ? n : 1, sizeof *xs);
    ferry_ticket **ts = fr_calloc(n ? n : 1, sizeof *ts);
    int *st = fr_calloc(n ? n : 1, sizeof *st);
    int ret = 0;
    if (!q || !rep || !rb || !xs || !ts || !st) {
        ret = FERRY_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ret = fr_client_key(keys[i], err);
        if (ret < 0) {
            for (size_t k = 0; k < n; k++)
                results[k] = k == i ? ret : FERRY_ECANCELED;
            goto out;
        }
        q[i] = (fr_smsg){ .type = FR_SMSG_PUT_START, .key = fr_client_str(keys[i]),
                          .size = lens[i] };
        rc_to_msg(rc, &q[i]);
    }
    ret = place(s, q, n, rep, rb, results, err);
    if (ret < 0) {
        for (size_t i = 0; i < n && outcome_unknown(ret); i++)
            (void)put_settle(s, keys[i], false);
        goto out;
    }
    /* Every transfer starts before any is waited for: they run in parallel. */
    for (size_t i = 0; i < n; i++) {
        if (results[i] < 0)
            continue;
        results[i] = put_bytes(s, &rep[i], bufs[i], lens[i], &xs[i], &ts[i], err);
        if (placed && n == 1)
            placed_from(&rep[i], placed);
    }
    for (size_t i = 0; i < n; i++) {
        if (rb[i] && results[i] == 0) {
            results[i] = xfer_wait(s, ts[i], lens[i], err);
            if (results[i] < 0)
                fr_fail(err, results[i], "put %s: writing the bytes failed: %s", keys[i], fr_why(err, results[i]));
        } else if (ts[i]) {
            (void)xfer_wait(s, ts[i], lens[i], NULL);
        }
        xfer_free(&xs[i]);
    }
    /* Complete what arrived, revoke what was placed but failed. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (rep[i].type != FR_SMSG_PLACEMENT)
            continue;
        q[m++] = (fr_smsg){ .type = results[i] == 0 ? FR_SMSG_PUT_END : FR_SMSG_PUT_REVOKE,
                            .key = fr_client_str(keys[i]) };
    }
    uint8_t **eb = fr_calloc(m ? m : 1, sizeof *eb);
    fr_smsg *er = fr_calloc(m ? m : 1, sizeof *er);
    if (!eb || !er) {
        fr_free(eb);
        fr_free(er);
        ret = FERRY_ENOMEM;
        goto out;
    }
    ret = fr_client_rpc_many(s, q, m, FR_SMSG_OK, er, eb, st, err);
    fr_client_free_bufs(eb, m);
    fr_free(eb);
    fr_free(er);
    bool unknown = outcome_unknown(ret);
    m = 0;
    for (size_t i = 0; i < n; i++) {
        if (rep[i].type != FR_SMSG_PLACEMENT)
            continue;
        if (unknown && put_settle(s, keys[i], results[i] == 0) == 0 && results[i] == 0)
            st[m] = 0;   /* settled: complete */
        if (results[i] == 0)
            results[i] = st[m];
        m++;
    }
    if (unknown) {   /* the call's error stands only for the puts it left failed */
        ret = 0;
        for (size_t i = 0; i < n && ret == 0; i++)
            ret = results[i] < 0 ? results[i] : 0;
    }
    if (ret == 0)
        for (size_t i = 0; i < n && ret == 0; i++)
            ret = results[i] < 0 ? results[i] : 0;
out:
    if (rb)
        fr_client_free_bufs(rb, n);
    fr_free(q);
    fr_free(rep);
    fr_free(rb);
    fr_free(xs);
    fr_free(ts);
    fr_free(st);
    return ret;
}

int ferry_store_put(ferry_store *s, const char *key, const void *buf, size_t len,
                    const ferry_replicate_config *rc, ferry_object_desc *placed, ferry_error *err)
{
    int r = 0;
    if (len && !buf)
        return fr_fail(err, FERRY_EINVAL, "put %s: no buffer", key ? key : "");
    return put_batch(s, &key, &buf, &len, 1, rc, &r, placed, err);
}

int ferry_store_put_from(ferry_store *s, const char *key, const void *buf, size_t len,
                         const ferry_replicate_config *rc, ferry_object_desc *placed, ferry_error *err)
{
    return ferry_store_put(s, key, buf, len, rc, placed, err);
}

int ferry_store_batch_put_from(ferry_store *s, const char *const *keys, const void *const *bufs,
                               const size_t *lens, size_t n, const ferry_replicate_config *rc,
                               int *results, ferry_error *err)
{
    return put_batch(s, keys, bufs, lens, n, rc, results, NULL, err);
}

/* ---- reads ------------------------------------------------------------------------------ */

/* ---- puts written in place (ferry_store_put_begin) ------------------------------------ */

struct ferry_put_slot {
    ferry_store *s;
    char *key;
    fr_smsg rep;                 /* the placement (its replicas point into rb) */
    uint8_t *rb;
    void *at;
    size_t len;
    ferry_remote_access *acc;    /* in place: the segment's bytes themselves */
    bool staged;                 /* the client's staging buffer */
    void *own;                   /* or a buffer of the put's own */
};

static void slot_free(ferry_put_slot *p)
{
    fr_client_free_bufs(&p->rb, 1);
    fr_free(p->key);
    fr_free(p);
}

int ferry_store_put_begin(ferry_store *s, const char *key, size_t len,
                          const ferry_replicate_config *rc, void **at, ferry_put_slot **out, ferry_error *err)
{
    if (at)
        *at = NULL;
    if (out)
        *out = NULL;
    if (!s || !at || !out || len == 0)
        return fr_fail(err, FERRY_EINVAL, "put_begin %s: no store, destination or length",
                             key ? key : "");
    int ret = fr_client_key(key, err);
    if (ret < 0)
        return ret;
    if (rc && rc->replica_num > FERRY_STORE_REPLICAS_MAX)
        return fr_fail(err, FERRY_EINVAL, "put: replica_num above %d", FERRY_STORE_REPLICAS_MAX);
    if (rc && !FR_RESERVED_OK(rc))
        return fr_fail(err, FERRY_EINVAL, "put: the placement config's reserved fields must be "
                             "zero (start from ferry_replicate_config_init)");
    ferry_put_slot *p = fr_calloc(1, sizeof *p);
    size_t kl = strlen(key);
    if (p)
        p->key = fr_malloc(kl + 1);
    if (!p || !p->key) {
        if (p)
            slot_free(p);
        return fr_fail(err, FERRY_ENOMEM, "put_begin %s: out of memory", key);
    }
    memcpy(p->key, key, kl + 1);
    p->s = s;
    p->len = len;
    fr_smsg q = { .type = FR_SMSG_PUT_START, .key = fr_client_str(key), .size = len };
    rc_to_msg(rc, &q);
    int res = 0;
    ret = place(s, &q, 1, &p->rep, &p->rb, &res, err);
    if (outcome_unknown(ret))
        (void)put_settle(s, key, false);
    if (ret == 0 && res < 0)
        ret = res;
    if (ret < 0) {
        slot_free(p);
        return ret;
    }
    fr_segref seg;
    if (p->rep.nrep == 1 && fr_client_segment(s, p->rep.rep[0].segment, &seg, err) == 0 &&
        ferry_remote_access_begin(s->eng, &seg.rr, seg.rr.addr + p->rep.rep[0].offset, len,
                                  FERRY_REMOTE_WRITE, &p->at, &p->acc, NULL) == 0) {
        *at = p->at;
        *out = p;
        return 0;
    }
    ret = ferry_store_staging_take(s, len, &p->at, err);
    p->staged = ret == 0;
    if (ret == FERRY_EBUSY)
        ret = (p->at = p->own = fr_malloc(len)) ? 0 : FERRY_ENOMEM;
    if (ret < 0) {
        (void)ferry_store_put_end(p, false, NULL, NULL);
        return fr_fail(err, ret, "put_begin %s: no buffer for %zu bytes", key, len);
    }
    *at = p->at;
    *out = p;
    return 0;
}

bool ferry_store_put_in_place(const ferry_put_slot *p)
{
    return p && p->acc;
}

int ferry_store_put_end(ferry_put_slot *p, bool commit, ferry_object_desc *placed, ferry_error *err)
{
    if (!p)
        return fr_fail(err, FERRY_EINVAL, "put_end: no put");
    ferry_store *s = p->s;
    int rc = 0;
    if (p->acc) {
        ferry_remote_access_end(p->acc);   /* every byte is in the segment */
    } else if (commit && p->at) {
        xfer x = {0};
        ferry_ticket *t = NULL;
        rc = put_bytes(s, &p->rep, p->at, p->len, &x, &t, err);
        int w = xfer_wait(s, t, p->len, rc < 0 ? NULL : err);
        rc = rc < 0 ? rc : w;
        xfer_free(&x);
        if (rc < 0)
            fr_fail(err, rc, "put %s: writing the bytes failed: %s", p->key, fr_why(err, rc));
    }
    /* A copy that timed out may still be read by the engine: its source
     * is left allocated (staging: abandoned, never reused). */
    if (p->staged)
        ferry_store_staging_give(s, rc == FERRY_ETIMEDOUT);
    else if (rc != FERRY_ETIMEDOUT)
        fr_free(p->own);
    fr_smsg q = { .type = commit && rc == 0 ? FR_SMSG_PUT_END : FR_SMSG_PUT_REVOKE,
                  .key = fr_client_str(p->key) };
    fr_smsg er;
    uint8_t *eb = NULL;
    int st = 0;
    int ret = fr_client_rpc_many(s, &q, 1, FR_SMSG_OK, &er, &eb, &st, err);
    fr_client_free_bufs(&eb, 1);
    if (outcome_unknown(ret) && put_settle(s, p->key, commit && rc == 0) == 0)
        ret = st = 0;   /* settled: complete */
    if (placed)
        placed_from(&p->rep, placed);
    slot_free(p);
    if (rc < 0)
        return rc;
    if (ret < 0)
        return ret;
    if (!commit)
        return 0;
    return st < 0 ? st : 0;
}

int fr_client_locate(ferry_store *s, const char *const *keys, size_t n, fr_objloc *locs,
                     int *status, ferry_error *err)
{
    fr_smsg *q = fr_calloc(n ? n : 1, sizeof *q);
    fr_smsg *rep = fr_calloc(n ? n : 1, sizeof *rep);
    uint8_t **rb = fr_calloc(n ? n : 1, sizeof *rb);
    int rc = q && rep && rb ? 0 : FERRY_ENOMEM;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = fr_client_key(keys[i], err);
        q[i] = (fr_smsg){ .type = FR_SMSG_GET_REPLICAS, .key = fr_client_str(keys[i]),
                          .lease_ms = s->cfg.lease_ms };
    }
    if (rc == 0)
        rc = fr_client_rpc_many(s, q, n, FR_SMSG_REPLICAS, rep, rb, status, err);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (status[i] < 0)
            continue;
        locs[i].size = rep[i].size;
        locs[i].nrep = rep[i].nrep;
        memcpy(locs[i].rep, rep[i].rep, sizeof locs[i].rep);
        if (rep[i].nrep == 0)
            status[i] = fr_fail(err, FERRY_ELOST, "%s has no replica", keys[i]);
    }
    if (rb)
        fr_client_free_bufs(rb, n);
    fr_free(q);
    fr_free(rep);
    fr_free(rb);
    return rc;
}

/* Read [off, off+len) of a located object into dst, trying each replica in
 * turn until one answers. */
static int read_one(ferry_store *s, const char *key, const fr_objloc *loc, uint64_t off,
                    void *dst, uint64_t len, ferry_error *err)
{
    if (len == 0)
        return 0;
    int rc = FERRY_ELOST;
    for (uint32_t r = 0; r < loc->nrep; r++) {
        fr_segref seg;
        xfer x = {0};
        ferry_ticket *t = NULL;
        rc = fr_client_segment(s, loc->rep[r].segment, &seg, err);
        if (rc == 0)
            rc = xfer_local(s, &x, dst, len, err);
        if (rc == 0)
            rc = xfer_op(&x, FERRY_OP_READ, dst, len, &seg, loc->rep[r].offset + off);
        if (rc == 0)
            rc = xfer_submit(s, &x, &t, err);
        if (rc == 0)
            rc = xfer_wait(s, t, len, err);
        xfer_free(&x);
        if (rc == 0)
            return 0;
        fr_fail(err, rc, "reading %s from node %016llx (segment %016llx) failed: %s", key,
                (unsigned long long)loc->rep[r].node, (unsigned long long)loc->rep[r].segment,
                fr_why(err, rc));
        if (rc == FERRY_ECONNREFUSED || rc == FERRY_ECONNRESET || rc == FERRY_ESTALE)
            fr_client_forget_segment(s, loc->rep[r].segment);
    }
    return rc;
}

int ferry_store_get_into(ferry_store *s, const char *key, void *buf, size_t cap, size_t *len, ferry_error *err)
{
    if (!s || (cap && !buf))
        return fr_fail(err, FERRY_EINVAL, "get_into: bad arguments");
    fr_objloc loc;
    int st = 0;
    int rc = fr_client_locate(s, &key, 1, &loc, &st, err);
    if (rc == 0)
        rc = st;
    if (rc < 0)
        return rc;
    if (len)
        *len = loc.size;
    if (loc.size > cap)
        return fr_fail(err, FERRY_EMSGSIZE, "get_into %s: the object has %llu bytes, the "
                             "buffer %zu", key, (unsigned long long)loc.size, cap);
    return read_one(s, key, &loc, 0, buf, loc.size, err);
}

int ferry_store_get(ferry_store *s, const char *key, void **buf, size_t *len, ferry_error *err)
{
    if (!s || !buf || !len)
        return fr_fail(err, FERRY_EINVAL, "get: bad arguments");
    fr_objloc loc;
    int st = 0;
    int rc = fr_client_locate(s, &key, 1, &loc, &st, err);
    if (rc == 0)
        rc = st;
    if (rc < 0)
        return rc;
    uint8_t *b = fr_malloc(loc.size ? loc.size : 1);
    if (!b)
        return fr_fail(err, FERRY_ENOMEM, "get %s: cannot allocate %llu bytes", key,
                             (unsigned long long)loc.size);
    rc = read_one(s, key, &loc, 0, b, loc.size, err);
    if (rc < 0) {
        fr_free(b);
        return rc;
    }
    *buf = b;
    *len = loc.size;
    return 0;
}

/* Ranges: one locate round trip for the distinct keys, then one engine
 * ticket per node so that a failing node fails only its own ranges. */
typedef struct peer_batch {
    ferry_peer_id peer;
    uint64_t node;
    xfer x;
    ferry_ticket *t;
    uint64_t bytes;
    int rc;
} peer_batch;

/* One read: rows of len bytes, row i at src + i * sstride in the object and
 * at dst + i * dstride in memory (count 1: one contiguous range). clip:
 * a range that runs past the object's end reads what is there (ranged
 * gets); otherwise the whole extent must be inside (strided gets). */
typedef struct rread {
    const char *key;
    uint64_t src, len, count, sstride, dstride;
    void *dst;
} rread;

/* Distinct keys of the reads into keys[], kidx[i] the key of read i. */
static int distinct_keys(const rread *r, size_t n, const char **keys, size_t *kidx, size_t *nk)
{
    fr_smap m;
    fr_smap_init(&m);
    int rc = fr_smap_reserve(&m, n);
    *nk = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *k = r[i].key ? r[i].key : "";
        uint64_t h = fr_smap_hash(k);
        void *hit = fr_smap_get(&m, k, h);
        if (hit) {
            kidx[i] = (size_t)(uintptr_t)hit - 1;
            continue;
        }
        kidx[i] = *nk;
        keys[(*nk)++] = k;
        rc = fr_smap_put(&m, k, h, (void *)(uintptr_t)*nk);
    }
    fr_smap_fini(&m);
    return rc;
}

static int read_all(ferry_store *s, const rread *rr, size_t n, bool clip, int64_t *results, ferry_error *err)
{
    const char **keys = fr_calloc(n, sizeof *keys);
    size_t *kidx = fr_calloc(n, sizeof *kidx);
    fr_objloc *locs = fr_calloc(n, sizeof *locs);
    int *st = fr_calloc(n, sizeof *st);
    size_t *pb_of = fr_calloc(n, sizeof *pb_of);
    peer_batch *pb = fr_calloc(n, sizeof *pb);
    size_t nk = 0, npb = 0;
    int ret = keys && kidx && locs && st && pb_of && pb ? 0 : FERRY_ENOMEM;
    if (ret == 0)
        ret = distinct_keys(rr, n, keys, kidx, &nk);
    if (ret == 0)
        ret = fr_client_locate(s, keys, nk, locs, st, err);
    for (size_t i = 0; i < n && ret < 0; i++)
        results[i] = ret;   /* every range fails with the call */
    for (size_t i = 0; i < n && ret == 0; i++) {
        const rread *r = &rr[i];
        const fr_objloc *loc = &locs[kidx[i]];
        pb_of[i] = SIZE_MAX;
        results[i] = st[kidx[i]];
        if (results[i] < 0)
            continue;
        uint64_t rows = r->count ? r->count : 1, len = r->len, end = 0;
        bool bad = r->src > loc->size || (len && !r->dst);
        if (!bad && rows > 1)
            bad = fr_mul_u64(rows - 1, r->sstride, &end) < 0 || fr_add_u64(end, r->src, &end) < 0 ||
                  fr_add_u64(end, len, &end) < 0 || end > loc->size;
        else if (!bad && !clip)
            bad = fr_add_u64(r->src, len, &end) < 0 || end > loc->size;
        if (bad) {
            results[i] = fr_fail(err, FERRY_ERANGE, "reading %s at %llu (%llu rows of %llu "
                                       "bytes): the object has %llu bytes", keys[kidx[i]],
                                       (unsigned long long)r->src, (unsigned long long)rows,
                                       (unsigned long long)len, (unsigned long long)loc->size);
            continue;
        }
        if (rows == 1 && loc->size - r->src < len)
            len = loc->size - r->src;   /* clip: the object ends first */
        results[i] = (int64_t)(len * rows);
        if (len == 0)
            continue;
        fr_segref seg;
        int rc = fr_client_segment(s, loc->rep[0].segment, &seg, err);
        for (uint32_t k = 1; rc < 0 && k < loc->nrep; k++)
            rc = fr_client_segment(s, loc->rep[k].segment, &seg, err);
        uint64_t base = 0;
        for (uint32_t k = 0; k < loc->nrep; k++)
            if (loc->rep[k].segment == seg.id)
                base = loc->rep[k].offset;
        size_t b = 0;
        while (rc == 0 && b < npb && pb[b].peer != seg.rr.peer)
            b++;
        if (rc == 0 && b == npb) {
            pb[npb].node = seg.node;
            pb[npb++].peer = seg.rr.peer;
        }
        uint64_t extent = (rows - 1) * r->dstride + len;
        if (rc == 0)
            rc = xfer_local(s, &pb[b].x, r->dst, extent, err);
        if (rc == 0)
            rc = xfer_op(&pb[b].x, FERRY_OP_READ, r->dst, len, &seg, base + r->src);
        if (rc == 0 && rows > 1) {
            ferry_op *op = &pb[b].x.ops[pb[b].x.nops - 1];
            op->count = rows;
            op->local_stride = r->dstride;
            op->remote_stride = r->sstride;
        }
        if (rc < 0) {
            results[i] = rc;
            continue;
        }
        pb[b].bytes += len * rows;
        pb_of[i] = b;
    }
    for (size_t b = 0; b < npb && ret == 0; b++)
        pb[b].rc = xfer_submit(s, &pb[b].x, &pb[b].t, err);
    for (size_t b = 0; b < npb; b++) {
        if (pb[b].rc == 0)
            pb[b].rc = xfer_wait(s, pb[b].t, pb[b].bytes, err);
        xfer_free(&pb[b].x);
    }
    for (size_t i = 0; i < n && ret == 0; i++) {
        if (pb_of[i] != SIZE_MAX && pb[pb_of[i]].rc < 0)
            results[i] = fr_fail(err, pb[pb_of[i]].rc, "reading %s from node %016llx failed: %s",
                                       keys[kidx[i]], (unsigned long long)pb[pb_of[i]].node,
                                       ferry_strerror(pb[pb_of[i]].rc));
    }
    for (size_t i = 0; i < n && ret == 0; i++)
        if (results[i] < 0)
            ret = (int)results[i];
    fr_free(keys);
    fr_free(kidx);
    fr_free(locs);
    fr_free(st);
    fr_free(pb_of);
    fr_free(pb);
    return ret;
}

int ferry_store_get_into_ranges(ferry_store *s, const ferry_range *ranges, size_t n,
                                int64_t *results, ferry_error *err)
{
    if (!s || (n && (!ranges || !results)))
        return fr_fail(err, FERRY_EINVAL, "get_into_ranges: bad arguments");
    if (n == 0)
        return 0;
    rread *rr = fr_calloc(n, sizeof *rr);
    if (!rr)
        return fr_fail(err, FERRY_ENOMEM, "get_into_ranges: out of memory");
    for (size_t i = 0; i < n; i++)
        rr[i] = (rread){ .key = ranges[i].key, .src = ranges[i].src_offset, .len = ranges[i].len,
                         .count = 1, .dst = ranges[i].dst };
    int rc = read_all(s, rr, n, true, results, err);
    fr_free(rr);
    return rc;
}

int ferry_store_get_into_strided(ferry_store *s, const ferry_strided_range *ranges, size_t n,
                                 int64_t *results, ferry_error *err)
{
    if (!s || (n && (!ranges || !results)))
        return fr_fail(err, FERRY_EINVAL, "strided get: bad arguments");
    if (n == 0)
        return 0;
    rread *rr = fr_calloc(n, sizeof *rr);
    if (!rr)
        return fr_fail(err, FERRY_ENOMEM, "strided get: out of memory");
    for (size_t i = 0; i < n; i++)
        rr[i] = (rread){ .key = ranges[i].key, .src = ranges[i].src_offset, .len = ranges[i].len,
                         .count = ranges[i].count ? ranges[i].count : 1,
                         .sstride = ranges[i].src_stride, .dstride = ranges[i].dst_stride,
                         .dst = ranges[i].dst };
    int rc = read_all(s, rr, n, false, results, err);
    fr_free(rr);
    return rc;
}

int ferry_store_batch_get_into(ferry_store *s, const char *const *keys, void *const *bufs,
                               const size_t *caps, size_t n, int64_t *results, ferry_error *err)
{
    if (!s || (n && (!keys || !bufs || !caps || !results)))
        return fr_fail(err, FERRY_EINVAL, "batch_get_into: bad arguments");
    ferry_range *r = fr_calloc(n ? n : 1, sizeof *r);
    if (!r)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < n; i++)
        r[i] = (ferry_range){ .key = keys[i], .src_offset = 0, .dst = bufs[i], .len = caps[i] };
    int rc = ferry_store_get_into_ranges(s, r, n, results, err);
    fr_free(r);
    return rc;
}

/* ---- metadata-only calls ---------------------------------------------------------------- */

/* One request that names a key: the key checked, one round trip. */
static int key_rpc(ferry_store *s, const char *key, uint16_t type, uint16_t want, fr_smsg *rep, ferry_error *err)
{
    int rc = fr_client_key(key, err);
    if (rc < 0 || !s)
        return s ? rc : FERRY_EINVAL;
    fr_smsg q = {.type = type, .key = fr_client_str(key)};
    uint8_t *b = NULL;
    rc = fr_client_rpc(s, &q, want, rep, &b, err);
    fr_free(b);   /* callers use only fixed fields of the reply */
    return rc;
}

int ferry_store_exist(ferry_store *s, const char *key, ferry_error *err)
{
    fr_smsg rep;
    int rc = key_rpc(s, key, FR_SMSG_EXIST, FR_SMSG_EXISTS, &rep, err);
    return rc < 0 ? rc : rep.flag ? 1 : 0;
}

int ferry_store_remove(ferry_store *s, const char *key, ferry_error *err)
{
    fr_smsg rep;
    return key_rpc(s, key, FR_SMSG_REMOVE, FR_SMSG_OK, &rep, err);
}

int ferry_store_remove_prefix(ferry_store *s, const char *prefix, uint64_t *removed, ferry_error *err)
{
    if (!s || (prefix && strlen(prefix) > FERRY_STORE_KEY_MAX))
        return fr_fail(err, FERRY_EINVAL, "remove_prefix: bad prefix");
    fr_smsg q = {.type = FR_SMSG_REMOVE_PREFIX, .key = fr_client_str(prefix)}, rep;
    uint8_t *b = NULL;
    int rc = fr_client_rpc(s, &q, FR_SMSG_REMOVED, &rep, &b, err);
    if (rc == 0 && removed)
        *removed = rep.count;
    fr_free(b);
    return rc;
}

int ferry_store_get_replica_desc(ferry_store *s, const char *key, ferry_object_desc *out, ferry_error *err)
{
    int rc = fr_client_key(key, err);
    if (rc < 0 || !s || !out)
        return rc < 0 ? rc : FERRY_EINVAL;
    fr_smsg q = {.type = FR_SMSG_GET_REPLICAS, .key = fr_client_str(key), .lease_ms = 0}, rep;
    uint8_t *b = NULL;
    rc = fr_client_rpc(s, &q, FR_SMSG_REPLICAS, &rep, &b, err);
    if (rc == 0)
        placed_from(&rep, out);
    fr_free(b);
    return rc;
}

/* n requests naming one key each (type, reply want), one round trip:
 * results[i] per key; every entry set. Returns 0 or the first failure. */
int fr_client_key_rpcs(ferry_store *s, const char *const *keys, size_t n, uint16_t type,
                       uint16_t want, fr_client_reply_fn each, void *ctx, int *results,
                       ferry_error *err)
{
    if (!s || (n && (!keys || !results)))
        return fr_fail(err, FERRY_EINVAL, "batch call: bad arguments");
    if (n == 0)
        return 0;
    fr_smsg *q = fr_calloc(n, sizeof *q), *rep = fr_calloc(n, sizeof *rep);
    uint8_t **rb = fr_calloc(n, sizeof *rb);
    int rc = q && rep && rb ? 0 : fr_fail(err, FERRY_ENOMEM, "batch call: out of memory");
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = fr_client_key(keys[i], err);
        q[i] = (fr_smsg){ .type = type, .key = fr_client_str(keys[i]) };
    }
    if (rc == 0)
        rc = fr_client_rpc_many(s, q, n, want, rep, rb, results, err);
    int first = rc;
    for (size_t i = 0; i < n; i++) {
        if (rc < 0)
            results[i] = rc;
        else if (results[i] == 0 && each)
            results[i] = each(ctx, i, &rep[i], err);
        if (results[i] < 0 && first == 0)
            first = results[i];
    }
    if (rb)
        fr_client_free_bufs(rb, n);
    fr_free(q);
    fr_free(rep);
    fr_free(rb);
    return first;
}

int ferry_store_batch_remove(ferry_store *s, const char *const *keys, size_t n, int *results,
                             ferry_error *err)
{
    return fr_client_key_rpcs(s, keys, n, FR_SMSG_REMOVE, FR_SMSG_OK, NULL, NULL, results, err);
}

static int replica_desc_of(void *ctx, size_t i, const fr_smsg *rep, ferry_error *err)
{
    (void)err;
    placed_from(rep, &((ferry_object_desc *)ctx)[i]);
    return 0;
}

int ferry_store_batch_get_replica_desc(ferry_store *s, const char *const *keys, size_t n,
                                       ferry_object_desc *out, int *results, ferry_error *err)
{
    if (!s || (n && (!keys || !out || !results)))
        return fr_fail(err, FERRY_EINVAL, "batch_get_replica_desc: bad arguments");
    for (size_t i = 0; i < n; i++)
        memset(&out[i], 0, sizeof out[i]);
    return fr_client_key_rpcs(s, keys, n, FR_SMSG_GET_REPLICAS, FR_SMSG_REPLICAS, replica_desc_of,
                              out, results, err);
}

int ferry_store_list(ferry_store *s, const char *prefix, const char *after, size_t max,
                     char ***keys, size_t *n, bool *more, ferry_error *err)
{
    if (!s || !keys || !n || max == 0 || (prefix && strlen(prefix) > FERRY_STORE_KEY_MAX) ||
        (after && strlen(after) > FERRY_STORE_KEY_MAX))
        return fr_fail(err, FERRY_EINVAL, "list: bad arguments");
    fr_smsg q = {.type = FR_SMSG_LIST, .key = fr_client_str(prefix),
                 .key2 = fr_client_str(after),
                 .limit = max > FR_SMSG_LIST_MAX ? FR_SMSG_LIST_MAX : (uint32_t)max}, rep;
    uint8_t *b = NULL;
    int rc = fr_client_rpc(s, &q, FR_SMSG_KEYS, &rep, &b, err);
    if (rc < 0) {
        fr_free(b);
        return rc;
    }
    size_t cnt = 0, bytes = 0, pos = 0;
    fr_smsg_item it;
    while (fr_smsg_item_next(&rep, &pos, &it)) {
        cnt++;
        bytes += it.key.n + 1;
    }
    char **arr = fr_malloc((cnt + 1) * sizeof *arr + bytes);
    if (!arr) {
        fr_free(b);
        return FERRY_ENOMEM;
    }
    char *p = (char *)(arr + cnt + 1);
    pos = 0;
    for (size_t i = 0; fr_smsg_item_next(&rep, &pos, &it); i++) {
        arr[i] = p;
        memcpy(p, it.key.p, it.key.n);
        p[it.key.n] = '\0';
        p += it.key.n + 1;
    }
    arr[cnt] = NULL;
    *keys = arr;
    *n = cnt;
    if (more)
        *more = rep.flag;
    fr_free(b);
    return 0;
}
