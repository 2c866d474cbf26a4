/* Single-pull update of a rollout group (weights.h, ferry_subscriber_*).
 *
 * Every update: each worker describes its parameter shards (pull_plan.c:
 * tensor, box, strides, memory), publishes that as a KV record, and after a
 * barrier reads every member's record. All members then compute the same
 * group plan (pull_int.h): identical boxes form replica sets; a shared set
 * is cut into pieces of whole rows, each piece read from the store once,
 * by one of its holders chosen to balance the members' nodes' NIC loads,
 * through the reshard planner's strided runs straight into that worker's
 * parameters, and WRITTEN (strided) into the other holders' parameters —
 * to another node once, to one holder there that forwards it to the
 * others of its node. A worker reads its pieces in batches and pushes
 * each batch while it reads the next; NOTIFYs tell each consumer how many
 * of its WRITEs have landed (or that no more will come), so a worker that
 * forwards for its node forwards what has landed while the rest is still
 * being read, and every worker knows when all its bytes are there
 * ("apply" below). Then the group meets at a post-apply barrier. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/keys.h"
#include "rl/members_int.h"
#include "rl/pull_int.h"

#define WATERMARK 2          /* batches in flight: the pushes of one while the next is read */

struct ferry_subscriber {
    ferry_store *s;
    ferry_subscriber_config cfg;
    ferry_param_shard *shards;
    size_t n;
    char (*names)[256];
    fr_rl_spans spans;        /* the shards' memory, registered; reused while it stays */
    uint64_t generation;
    /* The last plan, reused while every member's record (but its
     * generation) and the stored placement stay the same: a new generation
     * of the same model and layout costs no planning. */
    fr_sub_cache pc;
    /* This update's place in the group: cfg.rank and cfg.world, or an
     * elastic group's epoch (pull_elastic.c); scope names its records and
     * barriers (the group, or the group and the update's number). */
    uint32_t me, world;
    uint64_t want;                 /* elastic: the epoch's generation (0: the active one) */
    char scope[96];
    fr_sub_round *round;           /* elastic: what the last exchange saw */
    fr_members *mem;               /* elastic: this member's registration */
    fr_standby *sb;           /* standby copies (pull_standby.c); NULL: none */
    fr_sub_hooks hooks;       /* compatibility mode's (compat.c); zero: none */
    bool derived;             /* the last round failed because a worker feeding me did */
    /* Standby subscribers of fixed groups: the manifest of the generation
     * the last update took, kept for overlapped updates (pull_early.c),
     * which plan the next generation from its layout. */
    ferry_weight_manifest held;
    fr_early *early;          /* an overlapped round in progress (NULL: none) */
};

void fr_subscriber_set_hooks(ferry_subscriber *sub, const fr_sub_hooks *h) { sub->hooks = *h; }
void fr_subscriber_set_whole(ferry_subscriber *sub) { sub->pc.whole = true; }
void fr_subscriber_seed(ferry_subscriber *sub, const fr_work *w)
{
    sub->pc.seed = (fr_rd_seed){ .load = w->loads, .wread = w->wread, .wfwd = w->wfwd };
    /* the plan depends on the seed: it is part of the plan's key */
    uint64_t h = fr_hash64(w->loads, w->nnodes * sizeof *w->loads, 0x73656564);
    h = fr_hash64(w->wread, sub->world * sizeof *w->wread, h);
    sub->pc.epoch = fr_hash64(w->wfwd, sub->world * sizeof *w->wfwd, h);
}
const fr_work *fr_subscriber_work(const ferry_subscriber *sub)
{
    return sub->pc.valid ? &sub->pc.plan : NULL;
}
void fr_subscriber_set_scope(ferry_subscriber *sub, const char *scope)
{
    snprintf(sub->scope, sizeof sub->scope, "%s", scope);
}

bool fr_subscriber_plan_reused(const ferry_subscriber *sub) { return sub && sub->pc.reused; }
fr_standby *fr_subscriber_standby(const ferry_subscriber *sub) { return sub->sb; }
void fr_subscriber_set_standby(ferry_subscriber *sub, fr_standby *sb) { sub->sb = sb; }

int ferry_subscriber_nodes(const ferry_subscriber *sub, ferry_update_node *out, size_t cap)
{
    if (!sub || (cap && !out))
        return FERRY_EINVAL;
    const fr_work *w = &sub->pc.plan;
    if (!sub->pc.valid)
        return 0;
    for (uint32_t n = 0; n < w->nnodes && n < cap; n++) {
        const fr_rd_load *l = &w->loads[n];
        out[n] = (ferry_update_node){ .node = w->node_id[n], .workers = w->node_workers[n],
                                      .store_read = w->node_read[n], .pushed_in = l->push_in,
                                      .pushed_out = l->push_out, .pushed_intra = l->intra,
                                      .nic_in = l->read_in + l->push_in,
                                      .nic_out = l->push_out + l->serve_out };
    }
    return (int)w->nnodes;
}

/* The group's figures of the plan into the stats. */
static void plan_stats(const fr_work *w, ferry_update_stats *st)
{
    st->group_pushed_cross = w->sum.pushed_cross;
    st->group_pushed_intra = w->sum.pushed_intra;
    st->nodes = w->nnodes;
    st->nic_max_in = w->sum.max_in;
    st->nic_max_out = w->sum.max_out;
    st->nic_mean_in = w->sum.mean_in;
    st->nic_mean_out = w->sum.mean_out;
}

/* Register the shards' memory remote-writable (shards that touch share a
 * region: spans.c), reusing what is unchanged. */
static int register_shards(ferry_subscriber *sub, const fr_gen *g, ferry_error *err)
{
    uint8_t **addr = malloc((sub->n ? sub->n : 1) * sizeof *addr);
    uint64_t *len = malloc((sub->n ? sub->n : 1) * sizeof *len);
    int rc = addr && len ? 0 : fr_fail(err, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < sub->n && rc == 0; i++) {
        const ferry_param_shard *p = &sub->shards[i];
        int ti = ferry_manifest_find_tensor(g->m, p->tensor);
        if (ti < 0) {
            rc = fr_fail(err, FERRY_ENOENT, "tensor %s is not in generation %" PRIu64,
                         p->tensor, g->generation);
            break;
        }
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(g->m, (uint32_t)ti, &d);
        addr[i] = p->dst;
        if (p->dequantize) {
            rc = fr_fail(err, FERRY_ENOTSUP, "tensor %s: the subscriber does not dequantize "
                         "(asked %s): bind its FP8 bytes and scales, or update it with "
                         "ferry_weights_update_direct", d.name, p->dequantize);
            break;
        }
        rc = fr_rl_shard_quant_check(g, (uint32_t)ti, p, err);   /* FP8: bytes, blocks */
        if (rc == 0)
            rc = fr_rl_shard_check(p, &d, &len[i], err);   /* a buffer too small: refused */
    }
    if (rc == 0 && sub->hooks.region)   /* inside memory the caller registered */
        rc = fr_rl_spans_borrow(sub->hooks.region, sub->n, &sub->spans, err);
    else if (rc == 0)
        rc = fr_rl_spans_register(ferry_store_engine(sub->s), addr, len, sub->n, &sub->spans, err);
    free(addr);
    free(len);
    return rc;
}

/* My read pieces [from, to) through exec (its store reads into my
 * parameters, every byte count checked). */
static int do_reads(ferry_subscriber *sub, const fr_gen *g, const fr_work *w,
                    const ferry_attested_plan *att, const ferry_binding *b,
                    const ferry_error *bind_err, size_t from, size_t to, ferry_error *err)
{
    if (from >= to)
        return 0;
    if (!att)
        return fr_fail(err, FERRY_EREBUILD, "subscriber: binding my reads: %s", bind_err->msg);
    size_t a = w->reads[from].first, e = w->reads[to - 1].first + w->reads[to - 1].n;
    ferry_error why = {0};
    ferry_exec_result res;
    ferry_store_exec_config xc = { .store = sub->s, .locate = fr_rl_locate,
                                   .locate_ctx = (void *)(uintptr_t)g };
    int rc = ferry_exec_store_run(&xc, att, b, &w->io, a, e, &res, &why);
    ferry_exec_result_free(&res);
    if (rc < 0 && sub->hooks.verify)   /* whole tensors: say which */
        return fr_fail(err, FERRY_EREBUILD, "subscriber: reading %zu tensors from %s on: %s",
                       to - from, sub->shards[w->reads[from].shard].tensor, why.msg);
    return rc < 0 ? fr_fail(err, FERRY_EREBUILD, "subscriber: %s", why.msg) : 0;
}

static ferry_peer_id peer_of(const fr_member *mb)
{
    return mb->peer;
}

/* A push to myself (a worker holding a box twice): the copy, rows too. */
static void local_copy(const ferry_op *op)
{
    uint64_t rows = op->count > 1 ? op->count : 1;
    for (uint64_t r = 0; r < rows; r++)
        memcpy((uint8_t *)(uintptr_t)op->remote_addr + r * op->remote_stride,
               (const uint8_t *)op->local + r * op->local_stride, op->len);
}

/* How a receiver learns what landed. On each hop a sender S sends a target
 * T its WRITEs in plan order; once some have completed, a NOTIFY (tag of
 * the hop) carries S << NV_SHIFT | how many of them have landed, or
 * S << NV_SHIFT | NV_FAILED when S will send T nothing more (its reads, a
 * push to T, or what it was to forward failed). A NOTIFY is submitted
 * only after the WRITEs it counts have completed, so it never overtakes
 * them. T knows from the plan how many WRITEs each S has for it: it is
 * done with S when the count reaches that number or S failed. On hop 1 a
 * reader tells the workers that forward its bytes after every batch, so
 * that they forward batch k while batch k+1 is read (the scatter stage of
 * the pipeline); the others, and hop 2, hear once, at the end. */
#define NV_SHIFT 40
#define NV_FAILED (1ull << 39)
#define NV_VIEW (1ull << 38)     /* with a count: nothing was written, take it from my memory */
#define NV_COUNT (NV_VIEW - 1)

typedef struct apply {
    ferry_subscriber *sub;
    ferry_engine *e;
    fr_work *w;
    const fr_member *mbs;
    const fr_gen *g;
    const ferry_attested_plan *ratt;   /* my reads, attested for this generation */
    const ferry_binding *rb;
    ferry_error rbind;                 /* why they could not be (ratt NULL) */
    uint64_t tag[2];
    int rc;                        /* the first failure of my sends (EREBUILD for me) */
    ferry_error *err;
    ferry_exec_stream *xs;         /* my pushes and notifications (exec's push stream) */
    uint64_t *t[2];                /* per hop, WATERMARK slots x world WRITE batches (0: none) */
    uint64_t *at[2];               /* per hop and slot: what each target's count reaches */
    uint64_t *nt;                  /* NOTIFY batches in flight, reaped before the next ones */
    uint32_t *nto;                 /* their targets */
    size_t nnt, cap_nt, cap_nto;
    ferry_op *ops;                 /* scratch for one target's WRITEs */
    size_t fnext;                  /* hop 2: WRITEs [0, fnext) are submitted */
    uint64_t fround;
    bool fstop;                    /* a worker feeding my forwards failed or went quiet */
    bool *checked;                 /* hooks.verify: per shard, checked already */
    uint64_t heard;                /* fr_now_ns of the last notification taken */
} apply;

/* The first failure of the apply is its error: the stream's sentence
 * (which op, which peer, why) when the stream failed with this code.
 * fmt names worker `to` and where it runs ("worker %u%s"), then why. */
static int fail_once(apply *ap, int code, const char *fmt, uint32_t to)
{
    if (ap->rc == 0) {
        ferry_error se = {0};
        const char *why = ferry_strerror(code);
        if (ap->xs && ferry_exec_stream_error(ap->xs, &se) == code && se.msg[0])
            why = se.msg;
        ap->rc = fr_fail(ap->err, FERRY_EREBUILD, fmt, to, ap->mbs[to].where, why);
    }
    return ap->rc;
}

static void notify(apply *ap, int h, uint32_t to, uint64_t value)
{
    uint64_t v = (uint64_t)ap->sub->me << NV_SHIFT | value;
    ferry_op op = { .opcode = FERRY_OP_NOTIFY, .peer = peer_of(&ap->mbs[to]), .tag = ap->tag[h],
                    .value = v };
    if (fr_grow((void **)&ap->nt, &ap->cap_nt, ap->nnt + 1, sizeof *ap->nt) < 0 ||
        fr_grow((void **)&ap->nto, &ap->cap_nto, ap->nnt + 1, sizeof *ap->nto) < 0) {
        fail_once(ap, FERRY_ENOMEM, "subscriber: notifying worker %u%s: %s", to);
        return;
    }
    int s = ferry_exec_stream_submit(ap->xs, &op, 1, &ap->nt[ap->nnt]);
    if (s < 0)
        fail_once(ap, s, "subscriber: notifying worker %u%s: %s", to);
    else
        ap->nto[ap->nnt++] = to;
}

static void reap_notifies(apply *ap)
{
    for (size_t i = 0; i < ap->nnt; i++) {
        int te = 0;
        int st = ferry_exec_stream_wait(ap->xs, ap->nt[i], true, &te);
        if (st != FERRY_TICKET_COMPLETED)
            fail_once(ap, te ? te : FERRY_EIO, "subscriber: notifying worker %u%s failed: %s",
                      ap->nto[i]);
    }
    ap->nnt = 0;
}

/* WRITEs [a, b) of hop h: local copies now, one ticket per other target
 * into slot (not waited for). */
static void send_ops(apply *ap, int h, size_t slot, size_t a, size_t b)
{
    const fr_pushes *ps = &ap->w->hop[h];
    uint32_t world = ap->sub->world, me = ap->sub->me;
    uint64_t *t = ap->t[h] + slot * world;
    uint64_t *at = ap->at[h] + slot * world;
    for (size_t i = a; i < b; i++)   /* a worker holding a box twice */
        if (ps->to[i] == me)
            local_copy(&ps->ops[i]);
    const bool *view = ap->sub->hooks.view;
    for (uint32_t to = 0; to < world; to++) {
        size_t n = 0;
        uint64_t bytes = 0;
        for (size_t i = a; to != me && !ps->out_failed[to] && i < b; i++)
            if (ps->to[i] == to) {
                ap->ops[n++] = ps->ops[i];
                bytes += ps->ops[i].len * (ps->ops[i].count > 1 ? ps->ops[i].count : 1);
            }
        if (n == 0)
            continue;
        if (view && view[to]) {   /* its bytes are in my memory now: nothing to write */
            ps->sent[to] += n;
            ps->done[to] = ps->sent[to];
            notify(ap, h, to, NV_VIEW | ps->done[to]);
            continue;
        }
        if (ap->mbs[to].node == ap->mbs[me].node)
            ap->w->wrote_intra += bytes;
        else
            ap->w->wrote_cross += bytes;
        int s = ferry_exec_stream_submit(ap->xs, ap->ops, n, &t[to]);
        if (s < 0) {
            t[to] = 0;
            ap->w->hop[h].out_failed[to] = true;
            notify(ap, h, to, NV_FAILED);
            fail_once(ap, s, "subscriber: pushing to worker %u%s: %s", to);
            continue;
        }
        ap->w->hop[h].sent[to] += n;
        at[to] = ap->w->hop[h].sent[to];
    }
}

/* Wait for the tickets of a slot; tell each target what landed (early
 * only where it forwards my bytes; always once all of it did), or that it
 * gets nothing more. The notifications before have landed first, so that
 * a target hears its counts in order and nothing after its last one. */
static void settle(apply *ap, int h, size_t slot)
{
    reap_notifies(ap);
    fr_pushes *ps = &ap->w->hop[h];
    uint32_t world = ap->sub->world;
    uint64_t *t = ap->t[h] + slot * world;
    const uint64_t *at = ap->at[h] + slot * world;
    for (uint32_t to = 0; to < world; to++) {
        if (!t[to])
            continue;
        int te = 0;
        int st = ferry_exec_stream_wait(ap->xs, t[to], true, &te);
        t[to] = 0;
        if (ps->out_failed[to])
            continue;
        if (st != FERRY_TICKET_COMPLETED) {
            ps->out_failed[to] = true;
            notify(ap, h, to, NV_FAILED);
            fail_once(ap, te ? te : FERRY_EIO, "subscriber: pushing to worker %u%s failed: %s", to);
            continue;
        }
        if (at[to] <= ps->done[to])
            continue;
        ps->done[to] = at[to];
        if (ps->done[to] == ps->total[to] || ps->progress[to] || ap->sub->hooks.verify)
            notify(ap, h, to, ps->done[to]);
    }
}

/* After the last settle: every target still short gets FAILED. */
static void finish(apply *ap, int h)
{
    fr_pushes *ps = &ap->w->hop[h];
    reap_notifies(ap);
    for (uint32_t to = 0; to < ap->sub->world; to++)
        if (ps->total[to] && !ps->out_failed[to] && ps->done[to] < ps->total[to]) {
            ps->out_failed[to] = true;
            notify(ap, h, to, NV_FAILED);
        }
}

static bool fed(const fr_pushes *ps, uint32_t world, bool *ok)
{
    bool all = true;
    for (uint32_t k = 0; k < world; k++) {
        if (ps->failed[k])
            *ok = false;
        else if (ps->got[k] < ps->expect[k])
            all = false;
    }
    return all;
}

/* Take one notification of hop h, waiting up to timeout_ms. */
static int take(apply *ap, int h, int timeout_ms)
{
    uint64_t v = 0;
    int rc = ferry_wait_notify(ap->e, ap->tag[h], 1, timeout_ms, &v, NULL);   /* polled: a timeout is no failure */
    if (rc < 0)
        return rc;
    fr_pushes *ps = &ap->w->hop[h];
    uint64_t from = v >> NV_SHIFT;
    ap->heard = fr_now_ns();
    if (from >= ap->sub->world)
        return 0;
    if (v & NV_FAILED)
        ps->failed[from] = true;
    else if ((v & NV_COUNT) > ps->got[from])
        ps->got[from] = v & NV_COUNT;
    if (v & NV_VIEW)
        ps->viewed[from] = true;
    return 0;
}

/* hooks.verify on my shard s, once; false (and my failure recorded) when
 * its bytes are not what was published. */
static bool checked_ok(apply *ap, uint32_t s)
{
    if (!ap->sub->hooks.verify || !ap->checked || ap->checked[s])
        return true;
    ap->checked[s] = true;
    ferry_error why = {0};
    int rc = ap->sub->hooks.verify(ap->sub->hooks.ctx, s, &why);
    if (rc < 0 && ap->rc == 0)
        ap->rc = fr_fail(ap->err, FERRY_EREBUILD, "%s", why.msg);
    return rc == 0;
}

/* Hop 2: submit the forwards whose bytes have landed, in plan order. */
static void forward(apply *ap)
{
    const fr_pushes *p2 = &ap->w->hop[1], *p1 = &ap->w->hop[0];
    size_t b = ap->fnext;
    for (; b < p2->n && !ap->fstop; b++) {
        uint32_t v = p2->via[b];
        if (v == UINT32_MAX)
            continue;
        if (p1->failed[v])
            ap->fstop = true;
        if (p1->failed[v] || p1->got[v] < p2->dep[b])
            break;
    }
    if (b == ap->fnext)
        return;
    /* what I forward is checked first (hooks: where it came to my node) */
    for (size_t i = ap->fnext; i < b && !ap->fstop; i++)
        if (p2->via[i] != UINT32_MAX && p2->last[i] && !checked_ok(ap, p2->shard[i]))
            ap->fstop = true;
    if (ap->fstop)
        return;
    size_t slot = (size_t)(ap->fround++ % WATERMARK);
    settle(ap, 1, slot);
    send_ops(ap, 1, slot, ap->fnext, b);
    ap->fnext = b;
}

/* The pipeline of one worker: my reads in batches of about batch_bytes;
 * the WRITEs of a batch leave (one ticket per target, not waited for) as
 * soon as its reads are in, and the next batch is read while they are in
 * flight; at most WATERMARK batches are in flight (before reading batch k
 * the WRITEs of batch k - WATERMARK must have landed). Between batches and
 * then until every worker feeding me has told me everything, what landed
 * for my node is forwarded (hop 2). The reads land in my parameters,
 * which are the WRITEs' source: no staging copy. */
/* The first worker I still wait for on a hop. */
static uint32_t quiet_one(const fr_pushes *ps, uint32_t world)
{
    for (uint32_t k = 0; k < world; k++)
        if (!ps->failed[k] && ps->got[k] < ps->expect[k])
            return k;
    return UINT32_MAX;
}

static int run_apply(apply *ap, bool *reads_ok, bool *fed_ok, int *quiet, uint32_t *silent,
                     ferry_update_stats *st)
{
    ferry_subscriber *sub = ap->sub;
    fr_work *w = ap->w;
    const fr_pushes *p1 = &w->hop[0];
    uint32_t world = sub->world;
    int tmo = (int)sub->cfg.timeout_ms;
    uint64_t budget = sub->cfg.batch_bytes;
    *reads_ok = true;
    size_t ra = 0, pa = 0;
    for (uint64_t b = 0; ra < w->nreads; b++) {
        size_t slot = (size_t)(b % WATERMARK);
        settle(ap, 0, slot);   /* batch b - WATERMARK */
        size_t rb = ra;
        for (uint64_t bytes = 0; rb < w->nreads && (rb == ra || bytes < budget); rb++)
            bytes += w->reads[rb].bytes;
        double t0 = (double)fr_now_ns() / 1e9;
        int rr = do_reads(sub, ap->g, w, ap->ratt, ap->rb, &ap->rbind, ra, rb, ap->err);
        st->read_s += (double)fr_now_ns() / 1e9 - t0;
        st->batches++;
        for (size_t i = ra; rr == 0 && i < rb; i++)   /* hooks: checked before they leave */
            if (w->reads[i].last && !checked_ok(ap, w->reads[i].shard))
                rr = ap->rc;
        if (rr < 0) {
            *reads_ok = false;
            if (ap->rc == 0)
                ap->rc = rr;
            break;
        }
        size_t pb = pa;
        while (pb < p1->n && p1->dep[pb] < rb)
            pb++;
        send_ops(ap, 0, slot, pa, pb);
        ra = rb;
        pa = pb;
        while (take(ap, 0, 0) == 0)
            ;
        forward(ap);
    }
    for (size_t k = 0; k < WATERMARK; k++)   /* the older batch first */
        settle(ap, 0, (size_t)((st->batches + k) % WATERMARK));
    finish(ap, 0);
    double t1 = (double)fr_now_ns() / 1e9;
    /* What reaches me, forwarded as it lands. The deadline is one of
     * liveness: it runs out only after tmo in which no notification came. */
    bool ok = true;
    ap->heard = fr_now_ns();
    while (!fed(&w->hop[0], world, &ok)) {
        uint64_t now = fr_now_ns(), deadline = ap->heard + (uint64_t)tmo * 1000000u;
        int left = now < deadline ? (int)((deadline - now) / 1000000u) : 0;
        int r = take(ap, 0, left);
        if (r < 0) {
            *quiet = r;
            *silent = quiet_one(&w->hop[0], world);
            ap->fstop = true;
            break;
        }
        forward(ap);
    }
    forward(ap);
    for (size_t k = 0; k < WATERMARK; k++)
        settle(ap, 1, (size_t)((ap->fround + k) % WATERMARK));
    finish(ap, 1);
    reap_notifies(ap);
    ap->heard = fr_now_ns();
    while (!fed(&w->hop[1], world, &ok)) {
        uint64_t now = fr_now_ns(), deadline = ap->heard + (uint64_t)tmo * 1000000u;
        int left = now < deadline ? (int)((deadline - now) / 1000000u) : 0;
        int r = take(ap, 1, left);
        if (r < 0) {
            *quiet = r;
            if (*silent == UINT32_MAX)
                *silent = quiet_one(&w->hop[1], world);
            ok = false;
            break;
        }
    }
    (void)fed(&w->hop[0], world, &ok);
    *fed_ok = ok && *quiet == 0;
    st->forward_s = (double)fr_now_ns() / 1e9 - t1;
    return ap->rc;
}

/* Every member's demand: mine out, then all of them in (after the barrier). */
/* The record of a worker that could not take part: its error, so the
 * others fail at once with it instead of waiting for it. */
#define FAIL_MAGIC "FRYDFAIL"

static int fail_record(uint64_t gen, uint32_t rank, int code, const char *msg, uint8_t **out,
                       size_t *len)
{
    size_t n = strlen(msg);
    uint8_t *b = malloc(24 + n);
    if (!b)
        return FERRY_ENOMEM;
    memcpy(b, FAIL_MAGIC, 8);
    for (int i = 0; i < 8; i++)
        b[8 + i] = (uint8_t)(gen >> (8 * i));
    for (int i = 0; i < 4; i++) {
        b[16 + i] = (uint8_t)(rank >> (8 * i));
        b[20 + i] = (uint8_t)((uint32_t)code >> (8 * i));
    }
    memcpy(b + 24, msg, n);
    *out = b;
    *len = 24 + n;
    return 0;
}

/* Every member's demand: mine out (or why I cannot take part: g NULL,
 * why set), then all of them in (after the barrier). */
static int exchange(ferry_subscriber *sub, const fr_gen *g, uint64_t gen, const ferry_error *why,
                    char *bar, size_t barcap, ferry_kv_value *recs, int *brc_out,
                    uint64_t *release_out, ferry_error *err)
{
    uint32_t world = sub->world, me = sub->me;
    uint8_t *rec = NULL;
    size_t reclen = 0;
    char key[FR_KEY_MAX];
    int rc = 0;
    if (g) {
        ferry_region **regs = malloc((sub->n ? sub->n : 1) * sizeof *regs);
        rc = regs ? register_shards(sub, g, err) : fr_fail(err, FERRY_ENOMEM, "out of memory");
        for (size_t i = 0; rc == 0 && i < sub->n; i++)
            regs[i] = fr_rl_spans_region(&sub->spans, i);
        ferry_subscriber_config at = sub->cfg;   /* my place in this update */
        at.rank = me;
        if (rc == 0)
            rc = fr_sub_encode(&at, g, sub->shards, sub->n, regs, ferry_store_engine(sub->s),
                               &rec, &reclen, err);
        free(regs);
    }
    if (!g || rc < 0) {   /* tell the others why, so they do not wait for me */
        const ferry_error *w = g ? err : why;
        char said[sizeof w->msg + 96];   /* an elastic member names itself */
        snprintf(said, sizeof said, "%s%s%s", sub->mem ? "member " : "",
                 sub->mem ? fr_members_name(sub->mem) : "", sub->mem ? ": " : "");
        snprintf(said + strlen(said), sizeof said - strlen(said), "%s", w ? w->msg : "");
        if (sub->round && g && fr_layout_conflict(rc)) {
            /* prepared, but my shards do not fit it: out of the group
             * before the others hear of it, so that the epoch they make
             * next, right after the barrier below, goes without me */
            sub->round->self_layout = true;
            (void)fr_members_withdraw(sub->mem);
        }
        if (fail_record(gen, me, w && w->code ? w->code : FERRY_EIO, said, &rec, &reclen) < 0)
            reclen = 0;
        rc = w && w->code ? w->code : FERRY_EIO;
    }
    (void)fr_key_sub_demand(key, sizeof key, sub->cfg.model, sub->scope, gen, me);
    int prc = reclen ? ferry_kv_put(sub->s, key, rec, reclen, NULL, err) : FERRY_ENOMEM;
    if (rc == 0 && prc < 0)
        rc = fr_fail(err, prc, "subscriber: cannot publish the demand: %s",
                     fr_why(err, prc));
    free(rec);
    /* Everyone meets here even after a local failure, so nobody waits for
     * a demand that never comes. */
    (void)fr_key_sub_barrier(bar, barcap, sub->cfg.model, sub->scope, gen, "demand");
    char member_name[32];
    snprintf(member_name, sizeof member_name, "worker %u", me);
    uint64_t tmo = sub->cfg.timeout_ms;
    uint64_t release = 0;
    int brc = ferry_barrier(sub->s, bar, member_name, world, tmo, &release, NULL);
    *brc_out = brc;
    *release_out = release;
    if (sub->early && brc == 0)
        fr_early_round_id(sub->early, release);   /* names this round's outcomes and verdict */
    if (rc == 0 && brc < 0)
        rc = fr_fail(err, brc, "subscriber: not every worker of group %s arrived: %s",
                     sub->cfg.group, ferry_strerror(brc));
    /* every demand in one round trip */
    char (*keys)[FR_KEY_MAX] = rc == 0 ? malloc((size_t)world * sizeof *keys) : NULL;
    int *res = rc == 0 ? calloc(world, sizeof *res) : NULL;
    if (rc == 0 && (!keys || !res))
        rc = fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    if (rc == 0) {
        for (uint32_t k = 0; k < world; k++)
            (void)fr_key_sub_demand(keys[k], sizeof keys[k], sub->cfg.model, sub->scope, gen, k);
        (void)fr_rl_kv_get_all(sub->s, keys, world, recs, res);
    }
    for (uint32_t k = 0; k < world && rc == 0; k++) {
        rc = res[k];
        if (rc < 0)
            fr_fail(err, rc, "subscriber: worker %u left no demand", k);
        else if (recs[k].len >= 24 && memcmp(recs[k].val, FAIL_MAGIC, 8) == 0) {
            const uint8_t *b = recs[k].val;
            int32_t code = (int32_t)(b[20] | b[21] << 8 | b[22] << 16 | (uint32_t)b[23] << 24);
            if (sub->round)
                sub->round->others_code = code < 0 ? code : FERRY_EIO;
            sub->derived = true;   /* another member's failure: it knows the cause */
            rc = fr_fail(err, code < 0 ? code : FERRY_EIO, "subscriber: worker %u of group %s "
                         "cannot take generation %" PRIu64 " (nothing was written): %.*s", k,
                         sub->cfg.group, gen, (int)(recs[k].len - 24),
                         (const char *)b + 24);
        }
    }
    free(keys);
    free(res);
    return rc;
}

/* A ticket of an earlier, failed update whose wait ran out with bytes in
 * flight (a partition) fences its peer until it drains: over a link that
 * came back that is TCP's retransmission backoff, up to minutes, and every
 * update meanwhile fails at the fence. That update's writes are not wanted
 * any more (its members rebuild), so each such peer is reset (an abortive
 * close: nothing of them lands later) and this update reconnects. */
#define UNFENCE_MAX 64
void fr_sub_unfence(ferry_subscriber *sub)
{
    ferry_engine *e = ferry_store_engine(sub->s);
    ferry_pending_info p[UNFENCE_MAX];
    for (int pass = 0; pass < 2; pass++) {   /* a ticket fences each of its peers */
        int n = ferry_engine_pending(e, p, UNFENCE_MAX);
        for (int i = 0; i < n && i < UNFENCE_MAX; i++)
            (void)ferry_peer_reset(e, p[i].peer);
    }
}

/* The part of a round after prepare: the exchange (telling the group
 * why not, g NULL), the plan, apply and (not given) the post-apply
 * barrier. t0: when the round began. */
static int round_body(ferry_subscriber *sub, const fr_gen *g, uint64_t active,
                      const ferry_error *perr, int prc, bool given, double t0,
                      ferry_update_stats *st, ferry_error *err)
{
    int rc;
    sub->derived = false;
    uint32_t world = sub->world, me = sub->me;
    ferry_kv_value *recs = calloc(world, sizeof *recs);
    char bar[FR_KEY_MAX], key[FR_KEY_MAX];
    int brc = -1;
    uint64_t release = 0;   /* the demand barrier's use: numbers this attempt */
    double tx = (double)fr_now_ns() / 1e9;
    rc = recs ? exchange(sub, g, active, perr, bar, sizeof bar, recs, &brc, &release, err)
                     : fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    if (prc < 0 && err)
        *err = *perr;   /* my own failure, not the group's echo of it */
    double t1 = (double)fr_now_ns() / 1e9;
    st->prepare_s = t1 - t0;
    st->exchange_s = t1 - tx;
    if (rc == 0)
        rc = fr_sub_plan_records(&sub->pc, g, recs, world, me, ferry_store_engine(sub->s), err);
    double t2 = (double)fr_now_ns() / 1e9;
    st->plan_s = t2 - t1;
    if (rc == 0 && sub->early) {   /* overlapped: until every trainer rank stored its part */
        rc = fr_early_wait(sub->early, err);
        st->exchange_s += (double)fr_now_ns() / 1e9 - t2;
        t2 = (double)fr_now_ns() / 1e9;
    }
    fr_work *w = &sub->pc.plan;
    if (rc == 0) {
        plan_stats(w, st);
        /* reads, pushes and forwards as one pipeline (run_apply) */
        apply ap = { .sub = sub, .e = ferry_store_engine(sub->s), .w = w, .mbs = sub->pc.mbs, .g = g,
                     .err = err,
                     /* per attempt, not per generation: a NOTIFY of a failed
                      * attempt that lands late (a link back up) is never taken
                      * for one of the retry's */
                     .tag = { fr_hash64(bar, strlen(bar), 2 * release) | 1,
                              fr_hash64(bar, strlen(bar), 2 * release + 1) | 1 } };
        size_t nmax = w->hop[0].n > w->hop[1].n ? w->hop[0].n : w->hop[1].n;
        for (int h = 0; h < 2; h++) {
            ap.t[h] = calloc((size_t)world * WATERMARK, sizeof *ap.t[h]);
            ap.at[h] = calloc((size_t)world * WATERMARK, sizeof *ap.at[h]);
        }
        ap.ops = malloc((nmax ? nmax : 1) * sizeof *ap.ops);
        bool reads_ok = false, fed_ok = false;
        int quiet = 0;
        uint32_t silent = UINT32_MAX;
        if (sub->hooks.verify)
            ap.checked = calloc(sub->n ? sub->n : 1, 1);
        ferry_binding *rb = NULL;
        ferry_attested_plan *ratt = NULL;
        /* The pushes go through exec's push stream: every batch's outcome
         * tallied, and nothing left in flight once it is closed (a batch
         * whose wait expired stays with the engine's pending manager,
         * its peer fenced). */
        ferry_stream_config sc = { .engine = ap.e, .timeout_ms = (int)sub->cfg.timeout_ms };
        if (!ap.t[0] || !ap.t[1] || !ap.at[0] || !ap.at[1] || !ap.ops ||
            (sub->hooks.verify && !ap.checked) ||
            ferry_exec_stream_open(&sc, &ap.xs, NULL, NULL) < 0)
            rc = fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
        else {
            /* A binding that cannot be made fails my first read, so that
             * the workers I feed are told (FAILED), not left waiting. */
            if (w->nreads)
                (void)fr_sub_read_binding(w, g, &rb, &ratt, &ap.rbind);
            ap.ratt = ratt;
            ap.rb = rb;
            rc = run_apply(&ap, &reads_ok, &fed_ok, &quiet, &silent, st);
            (void)ferry_exec_stream_close(ap.xs, NULL);   /* every batch was settled above */
        }
        ferry_attested_free(ratt);
        ferry_binding_free(rb);
        for (int h = 0; h < 2; h++)
            free(ap.t[h]), free(ap.at[h]);
        free(ap.ops);
        free(ap.nt);
        free(ap.nto);
        free(ap.checked);
        st->apply_s = (double)fr_now_ns() / 1e9 - t2;
        /* the part of apply after the time spent reading */
        st->push_s = st->apply_s - st->read_s > 0 ? st->apply_s - st->read_s : 0;
        if (rc == 0 && !fed_ok && quiet < 0 && silent != UINT32_MAX)
            rc = fr_fail(err, FERRY_EREBUILD, "subscriber: nothing came from worker %u%s for %"
                         PRIu64 " ms (it died, hung or cannot reach this worker); the "
                         "parameters must be rebuilt", silent, sub->pc.mbs[silent].where,
                         sub->cfg.timeout_ms);
        else if (rc == 0 && !fed_ok)
            rc = fr_fail(err, FERRY_EREBUILD, "subscriber: %s from a worker that feeds this one; "
                      "the parameters must be rebuilt", quiet < 0 ? "no notification" : "a failed read");
        sub->derived = rc < 0 && ap.rc == 0 && !fed_ok && quiet == 0;
    }
    /* The group meets again only if it met the first time. When that
     * barrier timed out nobody passed it (an arrival that times out is
     * withdrawn, so it could not release without me); when my reply was
     * lost, I did not apply and the others fail without me. Waiting here
     * for members that will not come would take the timeout a second time. */
    char member_name[32];
    snprintf(member_name, sizeof member_name, "worker %u", me);
    if (sub->early)
        fr_early_outcome(sub->early, rc);   /* before the barrier: the verdict counts on it */
    if (brc == 0 && !given) {
        uint64_t tmo = sub->cfg.timeout_ms;
        (void)fr_key_sub_barrier(bar, sizeof bar, sub->cfg.model, sub->scope, active, "applied");
        double t6 = (double)fr_now_ns() / 1e9;
        brc = ferry_barrier(sub->s, bar, member_name, world, tmo, NULL, NULL);
        st->barrier_s = (double)fr_now_ns() / 1e9 - t6;
        if (rc == 0 && brc < 0)
            rc = fr_fail(err, FERRY_EREBUILD, "subscriber: the group did not finish together: %s",
                      ferry_strerror(brc));
    }
    /* Every member has read every demand: mine can go. (An elastic
     * update's records are named by it alone: after a barrier that timed
     * out, which nobody passed, nobody reads them either.) */
    (void)fr_key_sub_demand(key, sizeof key, sub->cfg.model, sub->scope, active, me);
    if (!given && (brc == 0 || (sub->mem && brc == FERRY_ETIMEDOUT)))
        (void)ferry_kv_delete(sub->s, key, 0, NULL, NULL);
    if (sub->pc.valid) {
        st->bytes_read = w->my_read;
        st->group_bytes_read = w->group_read;
        st->bytes_pushed = w->pushed;
        st->bytes_received = w->received;
        st->ranges = w->nreads;   /* pieces read (each one or more strided runs) */
        st->batches = st->batches ? st->batches : 0;
    }
    st->tensors = sub->n;
    st->members = world;
    st->position = me;
    for (uint32_t k = 0; recs && k < world; k++)
        ferry_store_free(recs[k].val);
    free(recs);
    return rc;
}

/* One update of the group as sub->me, world, scope and want say. */
static int update_round(ferry_subscriber *sub, uint64_t *generation, ferry_update_stats *st,
                        ferry_error *err)
{
    double t0 = (double)fr_now_ns() / 1e9;
    ferry_weight_manifest m = {0};
    bool current = false;
    uint64_t active = 0, gen = *generation;
    st->generation = *generation;
    ferry_error perr = {0};
    int prc;
    if (!sub->want) {
        /* A fixed group: every member agrees on the generation first
         * (pull_agree.c), then every member takes that one, or none. */
        bool need = false;
        int rc = fr_sub_agree(sub->s, sub->cfg.model, sub->scope, sub->me, sub->world, *generation,
                              sub->cfg.timeout_ms, &active, &need, err);
        if (rc == 0 && active == 0)
            rc = fr_fail(err, FERRY_ENOENT, "no generation of %s is active (%s)",
                         sub->cfg.model, ferry_strerror(FERRY_ENOENT));
        if (rc < 0) {
            if (sub->sb)
                fr_standby_failed(sub->sb, err);   /* says which generation the active copy keeps */
            return rc;
        }
        if (!need)
            return 0;   /* the whole group holds the newest generation announced */
        /* A failure to prepare (the generation retired or lost meanwhile,
         * this worker's engine failing) is still told to the group, so
         * nobody waits for this one. */
        double tp = (double)fr_now_ns() / 1e9;
        prc = fr_rl_prepare_at(sub->s, sub->cfg.model, active, &m, &perr);
        st->prepare_s = (double)fr_now_ns() / 1e9 - tp;
    } else {
        int rc = fr_rl_active_read(sub->s, sub->cfg.model, &active, NULL, NULL);
        if (rc < 0)
            return fr_fail(err, rc, "no generation of %s is active (%s)", sub->cfg.model,
                           ferry_strerror(rc));
        /* An elastic group's update is for the generation of its epoch: the
         * keys and barriers name that one, and a member that finds another
         * active fails (telling the others) instead of waiting elsewhere. */
        active = sub->want;
        prc = fr_rl_prepare(sub->s, sub->cfg.model, &gen, &m, &current, st, &perr);
        if (prc == 0 && !current && m.generation != active)
            prc = fr_fail(&perr, FERRY_ESTATE, "the active generation of %s moved on while "
                          "this worker prepared; retry", sub->cfg.model);
    }
    const fr_gen *g = prc == 0 && !current ? fr_gen_of(&m) : NULL;
    if (prc == 0 && current)
        prc = fr_fail(&perr, FERRY_ESTATE, "generation %" PRIu64 " became current meanwhile",
                      active);
    if (g && sub->sb && (prc = fr_standby_begin(sub->sb, g, sub->shards, &sub->spans, &sub->pc,
                                                sub->cfg.timeout_ms, &perr)) < 0)
        g = NULL;   /* the standby copy is the target; told to the group when it cannot be */
    int rc = round_body(sub, g, active, &perr, prc, false, t0, st, err);
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
        sub->generation = m.generation;
        if (sub->sb)
            fr_standby_flip(sub->sb, m.generation);
    } else if (sub->sb) {
        fr_standby_failed(sub->sb, err);
    }
    if (rc == 0 && g && sub->sb && !sub->mem && !sub->hooks.verify) {
        ferry_weight_manifest_free(&sub->held);   /* the layout the next overlapped round plans on */
        sub->held = m;
    } else {
        ferry_weight_manifest_free(&m);
    }
    return rc;
}

fr_gen *fr_sub_held(ferry_subscriber *sub)
{
    return sub->held.internal && sub->held.generation == sub->generation ? fr_gen_of(&sub->held)
                                                                         : NULL;
}

bool fr_sub_can_overlap(const ferry_subscriber *sub)
{
    return sub->sb && !sub->mem && !sub->hooks.verify;
}

int fr_sub_early_round(ferry_subscriber *sub, fr_early *ea, const fr_gen *gs, uint64_t next,
                       const ferry_error *why, ferry_update_stats *st, ferry_error *err)
{
    double t0 = (double)fr_now_ns() / 1e9;
    char keep[sizeof sub->scope];
    memcpy(keep, sub->scope, sizeof keep);
    snprintf(sub->scope, sizeof sub->scope, "%s/early", sub->cfg.group);
    ferry_error perr = why ? *why : (ferry_error){0};
    int prc = gs ? 0 : (perr.code ? perr.code : FERRY_ESTATE);
    if (gs && (prc = fr_standby_begin(sub->sb, gs, sub->shards, &sub->spans, &sub->pc,
                                      sub->cfg.timeout_ms, &perr)) < 0)
        gs = NULL;
    sub->early = ea;
    int rc = round_body(sub, gs, next, &perr, prc, false, t0, st, err);
    sub->early = NULL;
    memcpy(sub->scope, keep, sizeof keep);
    return rc;
}

void fr_sub_early_took(ferry_subscriber *sub, uint64_t next)
{
    sub->generation = next;
    sub->held.generation = next;
    fr_standby_flip(sub->sb, next);
}

int fr_sub_update_round(ferry_subscriber *sub, uint64_t *generation, ferry_update_stats *st,
                        ferry_error *err)
{
    return update_round(sub, generation, st, err);
}

int fr_sub_round_given(ferry_subscriber *sub, const ferry_weight_manifest *m, uint64_t gen,
                       const ferry_error *why, ferry_update_stats *st, bool *derived,
                       ferry_error *err)
{
    memset(st, 0, sizeof *st);
    st->generation = gen;
    ferry_error none = {0};
    int rc = round_body(sub, m ? fr_gen_of((ferry_weight_manifest *)m) : NULL, gen,
                        why ? why : &none, m ? 0 : (why && why->code ? why->code : FERRY_EIO),
                        true, (double)fr_now_ns() / 1e9, st, err);
    *derived = sub->derived;
    return rc;
}

void fr_subscriber_forget(ferry_subscriber *sub, uint64_t gen)
{
    char key[FR_KEY_MAX];
    (void)fr_key_sub_demand(key, sizeof key, sub->cfg.model, sub->scope, gen, sub->me);
    (void)ferry_kv_delete(sub->s, key, 0, NULL, NULL);
}

int ferry_subscriber_update(ferry_subscriber *sub, uint64_t *generation, ferry_update_stats *st,
                            ferry_error *err)
{
    ferry_update_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!sub || !generation)
        return fr_fail(err, FERRY_EINVAL, "subscriber: bad arguments");
    uint64_t f0 = fr_minor_faults(), t0 = fr_now_ns();
    fr_sub_unfence(sub);   /* before prepare, whose reads would meet the fence first */
    int rc = sub->mem ? fr_sub_elastic_update(sub, sub->mem, generation, st, err)
                      : update_round(sub, generation, st, err);
    st->faults = fr_minor_faults() - f0;
    st->total_s = (double)(fr_now_ns() - t0) / 1e9;
    return rc;
}

int fr_sub_round_run(ferry_subscriber *sub, fr_sub_round *r, uint64_t *generation,
                     ferry_update_stats *st, ferry_error *err)
{
    sub->me = r->me;
    sub->world = r->world;
    sub->want = r->gen;
    sub->round = r;
    sub->pc.epoch = r->epoch;
    snprintf(sub->scope, sizeof sub->scope, "%s/u%" PRIu64, sub->cfg.group, r->seq);
    memset(st, 0, sizeof *st);
    int rc = update_round(sub, generation, st, err);
    st->epoch = r->epoch;
    sub->round = NULL;
    return rc;
}

const ferry_subscriber_config *fr_sub_config(const ferry_subscriber *sub) { return &sub->cfg; }
ferry_store *fr_sub_store(const ferry_subscriber *sub) { return sub->s; }

/* ---- open / close --------------------------------------------------------------------------- */

/* Set-up, off the critical path: the buffers whose size the caller gave
 * (dst_bytes) are advised for huge pages now, so that the collapse of
 * what is resident is not paid by the first update (spans.c). */
void fr_sub_advise(const ferry_param_shard *shards, void *const *bufs, size_t n)
{
    uint8_t **addr = malloc((n ? n : 1) * sizeof *addr);
    uint64_t *len = malloc((n ? n : 1) * sizeof *len);
    if (addr && len) {
        for (size_t i = 0; i < n; i++) {
            addr[i] = bufs ? bufs[i] : shards[i].dst;
            len[i] = shards[i].dst_bytes;
        }
        fr_rl_spans_advise(addr, len, n);
    }
    free(addr);
    free(len);
}

int ferry_subscriber_open(ferry_store *s, const ferry_subscriber_config *cfg,
                          const ferry_param_shard *shards, size_t n, ferry_subscriber **out,
                          ferry_error *err)
{
    if (!s || !cfg || !out || (n && !shards) || (cfg->world && cfg->rank >= cfg->world) ||
        !cfg->model[0] || !cfg->group[0] || strchr(cfg->group, '/') ||
        !memchr(cfg->member, 0, sizeof cfg->member))
        return fr_fail(err, FERRY_EINVAL, "subscriber: bad arguments (model, group, rank, world)");
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "subscriber: the config's reserved fields must be "
                       "zero (start from ferry_subscriber_config_init)");
    ferry_subscriber *sub = calloc(1, sizeof *sub);
    if (!sub)
        return FERRY_ENOMEM;
    sub->s = s;
    sub->cfg = *cfg;
    fr_rl_subscriber_resolve(&sub->cfg);
    sub->n = n;
    sub->shards = calloc(n ? n : 1, sizeof *sub->shards);
    sub->names = calloc(n ? n : 1, sizeof *sub->names);
    if (!sub->shards || !sub->names) {
        ferry_subscriber_close(sub);
        return FERRY_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        sub->shards[i] = shards[i];
        snprintf(sub->names[i], sizeof sub->names[i], "%s", shards[i].tensor ? shards[i].tensor : "");
        sub->shards[i].tensor = sub->names[i];
    }
    fr_sub_advise(shards, NULL, n);
    sub->me = cfg->rank;
    sub->world = cfg->world;
    snprintf(sub->scope, sizeof sub->scope, "%s", cfg->group);
    if (cfg->world == 0) {   /* elastic: a member registered in the store */
        uint64_t tmo = sub->cfg.timeout_ms;
        int rc = fr_members_join(s, cfg->model, cfg->group, cfg->member,
                                 tmo / 4 < 2000 ? tmo / 4 : 2000, &sub->mem, err);
        if (rc < 0) {
            ferry_subscriber_close(sub);
            return rc;
        }
    }
    *out = sub;
    return 0;
}

void ferry_subscriber_close(ferry_subscriber *sub)
{
    if (!sub)
        return;
    fr_members_leave(sub->mem);   /* first: the others stop counting on me */
    ferry_weight_manifest_free(&sub->held);
    fr_rl_spans_free(&sub->spans);
    fr_sub_cache_free(&sub->pc);
    fr_standby_free(sub->sb);
    free(sub->names);
    free(sub->shards);
    free(sub);
}
