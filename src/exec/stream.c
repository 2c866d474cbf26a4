/* Push streams (exec.h, "push streams"): the executors' batch lifecycle
 * for callers that submit batches one by one as their bytes become ready
 * and need each batch's outcome at a point of their own (the rollout
 * group's pipelined pushes, compatibility mode's WRITEs) — and the batch
 * loop of ferry_executor_run.
 *
 *   open:   acquire every guard (on a failure release what was acquired,
 *           each release tried, failures quarantined: ABORTED);
 *   submit: one engine batch; its ticket is kept by the stream;
 *   wait:   one batch's terminal state, tallied (COMPLETED bytes, the first
 *           error, whether I/O began, UNKNOWN with its pending id);
 *   close:  wait for every batch still in flight (nothing stays in flight
 *           past it), release the guards — all quarantined when a batch is
 *           UNKNOWN, its memory may still be touched — and report.
 * A batch's id is its slot + 1; slots are reused once a batch was waited
 * for, so an id is valid from its submit to its terminal wait. The first
 * error keeps the engine's sentence (the refused op, or the failed
 * ticket's), for the executor's message (fr_exec_stream_why). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "exec/exec_int.h"


typedef struct slot {
    ferry_ticket *t;      /* NULL: free */
    uint64_t bytes;       /* what its READs and WRITEs move */
} slot;

struct ferry_exec_stream {
    ferry_stream_config cfg;
    ferry_guard *guards;
    slot *v;
    size_t n, cap;        /* slots in use or freed: [0, n) */
    size_t *free_ids;     /* freed slots, reused first */
    size_t nfree;
    size_t inflight;
    uint64_t bytes, ops, batches, bytes_done;
    uint64_t *pending;    /* ticket ids of UNKNOWN batches */
    size_t npending;
    bool io, unknown;
    int first_err;
    ferry_error why;      /* the first error's sentence (why.code 0: none) */
};

static int push_id(uint64_t **v, size_t *n, uint64_t id)
{
    uint64_t *nv = realloc(*v, (*n + 1) * sizeof **v);
    if (!nv)
        return FERRY_ENOMEM;
    nv[(*n)++] = id;
    *v = nv;
    return 0;
}

/* Release guards [0, n): every one is tried; a failure quarantines it. */
static void release_guards(const ferry_guard *g, size_t n, uint64_t **q, size_t *nq)
{
    for (size_t i = 0; i < n; i++) {
        int rc = g[i].release ? g[i].release(g[i].ctx, g[i].id) : 0;
        if (rc < 0 && push_id(q, nq, g[i].id) < 0)
            break;   /* out of memory: the caller still has the guard list */
    }
}

static void stream_free(ferry_exec_stream *s)
{
    free(s->guards);
    free(s->v);
    free(s->free_ids);
    free(s->pending);
    free(s);
}

int ferry_exec_stream_open(const ferry_stream_config *cfg, ferry_exec_stream **out,
                           ferry_exec_result *res, ferry_error *err)
{
    if (res)
        memset(res, 0, sizeof *res);
    if (!cfg || !out || !cfg->engine)
        return fr_fail(err, FERRY_EINVAL, "stream: a config with an engine is required");
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "stream: the config's reserved fields must be "
                       "zero (start from ferry_stream_config_init)");
    *out = NULL;
    if (cfg->nguards && !cfg->guards)
        return fr_fail(err, FERRY_EINVAL, "stream: %zu guards but no array", cfg->nguards);
    ferry_exec_stream *s = calloc(1, sizeof *s);
    if (!s)
        return fr_fail(err, FERRY_ENOMEM, "stream: out of memory");
    s->cfg = *cfg;
    if (cfg->nguards) {
        s->guards = malloc(cfg->nguards * sizeof *s->guards);
        if (!s->guards) {
            stream_free(s);
            return fr_fail(err, FERRY_ENOMEM, "stream: out of memory");
        }
        memcpy(s->guards, cfg->guards, cfg->nguards * sizeof *s->guards);
    }
    s->cfg.guards = s->guards;
    fr_stream_config_resolve(&s->cfg);
    for (size_t i = 0; i < cfg->nguards; i++) {
        const ferry_guard *g = &s->guards[i];
        int rc = g->acquire ? g->acquire(g->ctx, g->id) : 0;
        if (rc < 0) {   /* nothing moved: roll back completely */
            fr_fail(err, rc, "stream: guard %" PRIu64 " could not be acquired: %s", g->id,
                    ferry_strerror(rc));
            if (res) {
                res->state = FERRY_TICKET_ABORTED;
                res->error = rc;
                release_guards(s->guards, i, &res->quarantined, &res->nquarantined);
            } else {
                uint64_t *q = NULL;
                size_t nq = 0;
                release_guards(s->guards, i, &q, &nq);
                free(q);
            }
            stream_free(s);
            return rc;
        }
    }
    *out = s;
    return 0;
}

static uint64_t ops_bytes(const ferry_op *ops, size_t n)
{
    uint64_t b = 0;
    for (size_t i = 0; i < n; i++)
        if (ops[i].opcode != FERRY_OP_NOTIFY)
            b += ops[i].count > 1 ? ops[i].count * ops[i].len : ops[i].len;
    return b;
}

int ferry_exec_stream_submit(ferry_exec_stream *s, const ferry_op *ops, size_t n, uint64_t *id)
{
    if (!s || !ops || !n || !id)
        return FERRY_EINVAL;
    *id = 0;
    size_t k;
    if (s->nfree)
        k = s->free_ids[s->nfree - 1];
    else {
        if (s->n == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 16;
            slot *nv = realloc(s->v, cap * sizeof *nv);
            size_t *nf = realloc(s->free_ids, cap * sizeof *nf);
            if (nv)
                s->v = nv;
            if (nf)
                s->free_ids = nf;
            if (!nv || !nf)
                return FERRY_ENOMEM;
            s->cap = cap;
        }
        k = s->n;
    }
    ferry_ticket *t = NULL;
    int rc = ferry_submit(s->cfg.engine, ops, n, 0, &t, s->first_err ? NULL : &s->why);
    if (rc < 0) {   /* nothing of this batch was submitted: a failure of the stream's work */
        if (!s->first_err)
            s->first_err = rc;
        return rc;
    }
    if (s->nfree)
        s->nfree--;
    else
        s->n++;
    s->v[k] = (slot){ .t = t, .bytes = ops_bytes(ops, n) };
    s->inflight++;
    s->batches++;
    s->ops += n;
    s->bytes += s->v[k].bytes;
    *id = k + 1;
    return 0;
}

/* The terminal state st of slot k, tallied; the slot is freed. */
static void settle(ferry_exec_stream *s, size_t k, int st, int *error)
{
    slot *sl = &s->v[k];
    ferry_error why = {0};
    int e = ferry_ticket_error(sl->t, s->first_err ? NULL : &why);
    switch (st) {
    case FERRY_TICKET_COMPLETED:
        s->io = true;
        s->bytes_done += sl->bytes;
        e = 0;
        break;
    case FERRY_TICKET_FAILED_DRAINED:
        s->io = true;
        e = e < 0 ? e : FERRY_EIO;
        break;
    case FERRY_TICKET_UNKNOWN:
        s->unknown = true;
        (void)push_id(&s->pending, &s->npending, ferry_ticket_id(sl->t));
        e = FERRY_ETIMEDOUT;
        fr_fail(&why, e, "a batch (ticket %" PRIu64 ") was still in flight after %d ms: its outcome is "
                "unknown and its peers are fenced until it drains", ferry_ticket_id(sl->t), s->cfg.timeout_ms);
        break;
    default:   /* ABORTED: nothing of this batch touched */
        e = e < 0 ? e : FERRY_EIO;
        break;
    }
    if (e && !s->first_err) {
        s->first_err = e;
        if (why.code == e)
            s->why = why;
    }
    if (error)
        *error = e;
    ferry_ticket_free(sl->t);   /* an UNKNOWN ticket goes to the engine's pending manager */
    sl->t = NULL;
    s->free_ids[s->nfree++] = k;
    s->inflight--;
}

int ferry_exec_stream_wait(ferry_exec_stream *s, uint64_t id, bool block, int *error)
{
    if (error)
        *error = 0;
    if (!s || id == 0 || id > s->n || !s->v[id - 1].t)
        return FERRY_EINVAL;
    size_t k = id - 1;
    int st = block ? ferry_ticket_wait(s->v[k].t, s->cfg.timeout_ms) : ferry_ticket_test(s->v[k].t);
    if (st == FERRY_TICKET_PENDING || (!block && st == FERRY_TICKET_UNKNOWN))
        return FERRY_TICKET_PENDING;   /* a test never settles a batch still in flight */
    settle(s, k, st, error);
    return st;
}

size_t ferry_exec_stream_inflight(const ferry_exec_stream *s)
{
    return s ? s->inflight : 0;
}

int ferry_exec_stream_error(const ferry_exec_stream *s, ferry_error *err)
{
    if (!s)
        return fr_fail(err, FERRY_EINVAL, "exec stream: none");
    if (s->first_err && err) {
        if (s->why.code == s->first_err && s->why.msg[0])
            *err = s->why;
        else
            fr_fail(err, s->first_err, "%s", ferry_strerror(s->first_err));
    }
    return s->first_err;
}

void ferry_exec_stream_fail(ferry_exec_stream *s, int code)
{
    if (s && code < 0 && !s->first_err)
        s->first_err = code;
}

int ferry_exec_stream_close(ferry_exec_stream *s, ferry_exec_result *res)
{
    ferry_exec_result local = {0};
    if (!res)
        res = &local;
    memset(res, 0, sizeof *res);
    if (!s) {
        res->state = FERRY_TICKET_ABORTED;
        return res->error = FERRY_EINVAL;
    }
    for (size_t k = 0; k < s->n; k++)   /* every batch still in flight */
        if (s->v[k].t)
            settle(s, k, ferry_ticket_wait(s->v[k].t, s->cfg.timeout_ms), NULL);
    res->bytes = s->bytes;
    res->ops = s->ops;
    res->batches = s->batches;
    res->bytes_done = s->bytes_done;
    res->error = s->first_err;
    if (s->unknown)
        res->state = FERRY_TICKET_UNKNOWN;
    else if (!s->first_err)
        res->state = FERRY_TICKET_COMPLETED;
    else
        res->state = s->io ? FERRY_TICKET_FAILED_DRAINED : FERRY_TICKET_ABORTED;
    res->pending = s->pending;
    res->npending = s->npending;
    s->pending = NULL;
    /* An UNKNOWN batch may still touch memory: its guards stay held. */
    if (s->unknown) {
        for (size_t i = 0; i < s->cfg.nguards; i++)
            if (push_id(&res->quarantined, &res->nquarantined, s->guards[i].id) < 0)
                break;
    } else
        release_guards(s->guards, s->cfg.nguards, &res->quarantined, &res->nquarantined);
    stream_free(s);
    int rc = res->state == FERRY_TICKET_COMPLETED ? 0 : res->error;
    if (res == &local)
        ferry_exec_result_free(&local);
    return rc;
}
