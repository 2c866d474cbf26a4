/* A delta publish across the trainer ranks (ferry_delta_publish, weights.h;
 * docs/sparse.md "Deltas from a trainer"). Every rank:
 *
 *   1. compares a sample of its copy-0 pieces with its snapshot (delta.c),
 *      or finds it has none, and writes its word "count" (KV
 *      ferry/wk/M/G/delta/count/R: "ok <have> <elements> <sampled>
 *      <changed in the sample> <chain>" or "failed <code> <why>"); barrier
 *      delta/count; every rank reads every word and takes the same
 *      decision: refuse (a rank failed: nothing stored anywhere), dense
 *      (ferry_publish_shards: no snapshot somewhere, the chain is full, the
 *      sample far above the crossover), or a look at everything: every
 *      rank compares all, writes "exact" ("ok <changed>"), barrier
 *      delta/exact, and the exact counts decide dense or sparse;
 *   2. sparse (delta_sparse.c): hands the changed elements of tensors it does not own to
 *      their owners, one object per other rank on its own segment
 *      (ferry/w/M/G/dpart.R.O, always put, empty or not); barrier
 *      delta/parts; each owner reads the parts addressed to it, removes
 *      leftovers of deltas on the base that were never announced
 *      (ferry_sparse_remove_base) and puts one sparse object per changed
 *      tensor it owns; its word "stored" ("ok <n>" then the keys, or
 *      "failed ..."); barrier delta/stored;
 *   3. rank 0 reads every "stored" word and announces the keys
 *      (ferry_sparse_announce) or not, and writes the decision
 *      (ferry/wk/M/G/delta/decision: "ok" or "failed <code> <why>");
 *      barrier delta/decided; every rank reads it. On a failure every live
 *      rank removes the objects it put; what a dead rank left is removed
 *      by the next publish's owners (the base's leftovers) or, for its
 *      parts (ferry/w/M/G/...), by the sweep of unannounced generations.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "rl/delta_int.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

double fr_delta_now(void)
{
    return (double)fr_now_ns() / 1e9;
}

/* A word: "failed <code> <why>" on one line. */
void fr_delta_failed_word(char *buf, size_t cap, int rc, const ferry_error *me)
{
    snprintf(buf, cap, "failed %d %s", rc, me->msg[0] ? me->msg : ferry_strerror(rc));
    for (char *q = buf; *q; q++)
        if (*q == '\n')
            *q = ' ';
}

/* Write this rank's word at stage, meet every rank there. */
int fr_delta_meet(fr_drun *r, const char *stage, const char *word, ferry_error *err)
{
    char k[FR_KEY_MAX], member[32];
    if (word) {
        (void)fr_key_wk_delta(k, sizeof k, r->c->model, r->gen, stage, r->c->rank);
        int rc = ferry_kv_put(r->s, k, word, strlen(word), NULL, err);
        if (rc < 0)
            return fr_fail(err, rc, "rank %u cannot record its %s: %s", r->c->rank, stage,
                           fr_why(err, rc));
    }
    (void)fr_key_wk_delta(k, sizeof k, r->c->model, r->gen, stage, -1);
    snprintf(member, sizeof member, "rank %u", r->c->rank);
    int rc = ferry_barrier(r->s, k, member, r->c->world, r->c->timeout_ms, NULL, err);
    if (rc == FERRY_ETIMEDOUT)
        return fr_fail(err, rc, "not every trainer rank arrived at the %s stage within %" PRIu64
                       " ms", stage, r->c->timeout_ms);
    if (rc < 0)
        return fr_fail(err, rc, "rank %u cannot meet the other ranks: %s", r->c->rank,
                       fr_why(err, rc));
    return 0;
}

/* What the store answered for rank q's word at stage (rc, *val). */
static int word_of(int64_t q, const char *stage, int rc, ferry_kv_value *val, ferry_error *err)
{
    if (rc < 0)
        return fr_fail(err, rc == FERRY_ENOENT ? FERRY_EPROTO : rc, "rank %" PRId64 " left no "
                       "%s word", q, stage);
    if (val->len >= 7 && !memcmp(val->val, "failed ", 7)) {
        char *why = NULL;
        int code = (int)strtol((char *)val->val + 7, &why, 10);
        int n = (int)(val->len - (size_t)(why - (char *)val->val));
        rc = fr_fail(err, code < 0 ? code : FERRY_EPROTO, "%.*s", n > 0 ? n - 1 : 0,
                     n > 0 ? why + 1 : "");
        ferry_store_free(val->val);
        val->val = NULL;
        return rc;
    }
    return 0;
}

/* Rank q's word at stage (*val: ferry_store_free). A "failed" word gives
 * its code and sentence in err. */
int fr_delta_word(fr_drun *r, const char *stage, int64_t q, ferry_kv_value *val, ferry_error *err)
{
    char k[FR_KEY_MAX];
    (void)fr_key_wk_delta(k, sizeof k, r->c->model, r->gen, stage, q);
    int rc = ferry_kv_get(r->s, k, val, err);
    return word_of(q, stage, rc, val, err);
}

int fr_delta_words(fr_drun *r, const char *stage, ferry_kv_value *vals, ferry_error *err)
{
    uint32_t w = r->c->world;
    char (*k)[FR_KEY_MAX] = calloc(w, sizeof *k);
    const char **kp = calloc(w, sizeof *kp);
    int *rcs = calloc(w, sizeof *rcs);
    int rc = k && kp && rcs ? 0 : fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    for (uint32_t q = 0; rc == 0 && q < w; q++) {
        (void)fr_key_wk_delta(k[q], sizeof k[q], r->c->model, r->gen, stage, q);
        kp[q] = k[q];
    }
    if (rc == 0)
        (void)ferry_kv_batch_get(r->s, kp, w, vals, rcs, NULL);   /* per rank below */
    for (uint32_t q = 0; rc == 0 && q < w; q++) {
        ferry_error we = {0};
        int one = word_of(q, stage, rcs[q], &vals[q], &we);
        if (one < 0)
            rc = fr_fail(err, one, "rank %u: %s", q, we.msg);
    }
    for (uint32_t q = 0; rc < 0 && k && q < w; q++) {
        ferry_store_free(vals[q].val);
        vals[q].val = NULL;
    }
    free(k);
    free(kp);
    free(rcs);
    return rc;
}

/* This rank's words of generation gen go. Not at the end of the call that
 * wrote them: another rank may still be reading them (a failed first
 * stage has no later barrier), so at the start of this rank's next
 * publish of another generation. */
static void drop_words(ferry_store *s, const ferry_publisher_config *c, uint64_t gen)
{
    static const char *const stage[] = { "count", "exact", "stored" };
    for (size_t i = 0; i < sizeof stage / sizeof *stage; i++) {
        char k[FR_KEY_MAX];
        (void)fr_key_wk_delta(k, sizeof k, c->model, gen, stage[i], c->rank);
        (void)ferry_kv_delete(s, k, 0, NULL, NULL);
    }
}


/* ---- stage 1: the counts and the decision ------------------------------------------------- */

typedef struct counts {
    bool have;
    uint64_t elements, sampled, sample_changed, changed;
    uint32_t chain;
    double crossover;            /* rank 0's encoder's (every rank's must be the same) */
    uint32_t max_chain;
} counts;

/* Every rank's word at stage ("count": "ok <have> <elements> <sampled>
 * <changed in the sample> <chain> <crossover, %a> <max_chain>"; "exact":
 * "ok <changed>"): 0 with the sums, or the first failed rank's error.
 * Every rank must decide alike: an encoder configured otherwise than
 * rank 0's fails the generation (nothing stored). */
static int decide(fr_drun *r, const char *stage, counts *sum, ferry_error *err)
{
    bool count = !strcmp(stage, "count");
    if (count) {
        memset(sum, 0, sizeof *sum);
        sum->have = true;
    }
    ferry_kv_value *vals = calloc(r->c->world, sizeof *vals);
    if (!vals)
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    int rc = fr_delta_words(r, stage, vals, err);   /* every rank's, one round trip */
    for (uint32_t q = 0; rc == 0 && q < r->c->world; q++) {
        ferry_kv_value v = vals[q];
        vals[q].val = NULL;
        unsigned have = 0, chain = 0, kmax = 0;
        unsigned long long el = 0, sn = 0, sc = 0, ch = 0;
        double cross = 0;
        char *t = strndup(v.val, v.len);
        int got = !t ? 0 : count ? sscanf(t, "ok %u %llu %llu %llu %u %la %u", &have, &el, &sn, &sc,
                                          &chain, &cross, &kmax)
                                 : sscanf(t, "ok %llu", &ch);
        free(t);
        ferry_store_free(v.val);
        if (got != (count ? 7 : 1)) {
            rc = fr_fail(err, FERRY_EPROTO, "rank %u: its %s word is malformed", q, stage);
            break;
        }
        if (count && q == 0) {
            sum->crossover = cross;
            sum->max_chain = kmax;
        } else if (count && (cross != sum->crossover || kmax != sum->max_chain)) {
            rc = fr_fail(err, FERRY_EINVAL, "rank %u: its encoder has crossover %g and max_chain "
                         "%u, rank 0's %g and %u: every rank must decide alike", q, cross, kmax,
                         sum->crossover, sum->max_chain);
            break;
        }
        if (count) {
            sum->have &= have != 0;
            sum->elements += el;
            sum->sampled += sn;
            sum->sample_changed += sc;
            if (chain > sum->chain)
                sum->chain = chain;
        } else {
            sum->changed += ch;
        }
    }
    for (uint32_t q = 0; q < r->c->world; q++)
        ferry_store_free(vals[q].val);
    free(vals);
    return rc;
}

void fr_delta_fail_at(ferry_delta_encoder *e, int what)
{
    if (e)
        e->fail_at = what;
}

void fr_delta_sample_min(ferry_delta_encoder *e, uint64_t n)
{
    if (e)
        e->sample_min = n;
}


/* ---- the call ---------------------------------------------------------------------------- */

static void run_free(fr_drun *r)
{
    for (size_t i = 0; i < r->nkeys; i++)
        free(r->keys[i]);
    free(r->keys);
    free(r->segs);
    for (uint32_t q = 0; r->parts && q < r->c->world; q++)
        ferry_store_free(r->parts[q]);
    free(r->parts);
    free(r->part_len);
    fr_delta_layout_free(&r->cur, false);
}

/* Move the change buffers of a's pieces to b's (same layout): a publish
 * records its changes into the buffers the last one grew, whose pages are
 * touched already. */
static void lend(fr_dlayout *a, fr_dlayout *b)
{
    for (size_t i = 0; i < a->np && i < b->np; i++) {
        fr_dpiece *x = &a->p[i], *y = &b->p[i];
        free(y->chg);
        free(y->val);
        y->chg = x->chg, y->chg_cap = x->chg_cap;
        y->val = x->val, y->val_cap = x->val_cap;
        y->nchg = 0;
        x->chg = NULL, x->val = NULL, x->chg_cap = x->val_cap = 0, x->nchg = 0;
    }
}

/* The dense generation: leftovers of deltas on the base removed by their
 * owners, ferry_publish_shards, the snapshot refilled. */
static int dense(fr_drun *r, ferry_manifest *placement, const ferry_shard_data *mine, size_t n,
                 ferry_error *err)
{
    for (uint32_t t = 0; r->sweep && r->base && t < r->cur.nt; t++)
        if (r->cur.t[t].owner == r->c->rank)
            (void)ferry_sparse_remove_base(r->s, r->cur.t[t].name, r->base, NULL, NULL);
    int rc = ferry_publish_shards(r->s, r->c, r->gen, placement, mine, n, &r->st->dense, err);
    r->st->store_s = r->st->dense.put_s;
    r->st->commit_s = r->st->dense.barrier_s + r->st->dense.commit_s;
    r->st->stored_bytes = r->st->dense.bytes;
    return rc;
}

/* What a publish learnt in its looks. */
typedef struct look {
    bool have;                   /* this rank's snapshot holds the base */
    bool sampling;               /* the crossover can make a generation dense */
    bool partial;                /* the whole comparison stopped recording changes */
    uint64_t elements, sampled, sample_changed;
    int my;                      /* this rank's own failure (me), told to every rank */
    ferry_error me;
    counts sum;
} look;

/* Every rank's part of a look at stage: this rank's word (or its
 * failure), the barrier, every rank's words summed. */
static int exchange(fr_drun *r, const char *stage, const char *word, look *L, ferry_error *err)
{
    char fw[900];
    if (L->my < 0)
        fr_delta_failed_word(fw, sizeof fw, L->my, &L->me);
    double x0 = fr_delta_now();
    int rc = fr_delta_meet(r, stage, L->my < 0 ? fw : word, err);
    if (rc == 0)
        rc = decide(r, stage, &L->sum, err);
    r->st->exchange_s += fr_delta_now() - x0;
    if (rc < 0)
        fr_fail(err, rc, "delta publish of %s generation %" PRIu64 " failed: %s; nothing stored",
                r->c->model, r->gen, fr_why(err, rc));
    return rc;
}

/* The first look: this rank's layout (checked against its snapshot's), a
 * sample (every FR_DELTA_SAMPLE_STRIDE-th chunk of every piece), every
 * rank's counts; st->kind: dense for a rank without a snapshot, a full
 * chain, or a sample far above the crossover; else SPARSE until the
 * exact counts say. */
static int look_first(fr_drun *r, ferry_manifest *pl, const ferry_shard_data *mine, size_t n,
                      look *L, ferry_error *err)
{
    ferry_delta_encoder *e = r->e;
    ferry_delta_stats *st = r->st;
    L->my = fr_delta_layout(e, pl, mine, n, &r->cur, &L->me);
    L->have = L->my == 0 && e->have && e->last == r->base && r->base != 0;
    if (L->have)
        L->my = fr_delta_layout_same(&e->lay, &r->cur, &L->me);
    if (L->my == 0 && L->have)
        lend(&e->lay, &r->cur);   /* the last publish's change buffers, warm */
    for (size_t i = 0; L->my == 0 && i < r->cur.np; i++)
        L->elements += r->cur.p[i].elems;
    L->sampling = e->dc.crossover < 1;
    if (L->my == 0 && L->have && L->sampling) {
        double c0 = fr_delta_now();
        L->my = fr_delta_sample(&e->lay, &r->cur, FR_DELTA_SAMPLE_STRIDE, &L->sampled,
                                &L->sample_changed, &st->compared_bytes, &L->me);
        st->encode_s = fr_delta_now() - c0;
    }
    st->elements = L->elements;
    st->sampled = L->sampled;
    char word[160];
    snprintf(word, sizeof word, "ok %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %a %u",
             L->have ? 1u : 0u, L->elements, L->sampled, L->sample_changed,
             L->have ? e->chain : 0u, e->dc.crossover, e->dc.max_chain);
    int rc = exchange(r, "count", word, L, err);
    if (rc < 0)
        return rc;
    const counts *sum = &L->sum;
    st->total_elements = sum->elements;
    double est = sum->sampled ? (double)sum->sample_changed / (double)sum->sampled : 0;
    uint64_t least = e->sample_min ? e->sample_min : FR_DELTA_SAMPLE_MIN;
    if (!sum->have)
        st->kind = FERRY_DELTA_DENSE_FIRST;
    else if (sum->chain >= e->dc.max_chain)
        st->kind = FERRY_DELTA_DENSE_CHAIN;
    else if (L->sampling && sum->sampled >= least && est > FR_DELTA_SAMPLE_MARGIN * e->dc.crossover)
        st->kind = FERRY_DELTA_DENSE_FRACTION;
    else
        st->kind = FERRY_DELTA_SPARSE;
    if (st->kind != FERRY_DELTA_SPARSE) {
        /* every element counts as changed (no snapshot), or the sample's share */
        st->changed = !sum->have ? L->elements
                      : L->sampled ? (uint64_t)((double)L->sample_changed / (double)L->sampled *
                                                (double)L->elements) : 0;
        st->total_changed = !sum->have ? sum->elements : (uint64_t)(est * (double)sum->elements);
    }
    return 0;
}

/* The whole comparison and every rank's exact counts: dense above the
 * crossover, else sparse. Recording every change of a generation that
 * will go dense costs 10 bytes and more a change: past the crossover of
 * its own elements a rank only counts them, and records them in a second
 * pass when the generation stays sparse after all. */
static int look_exact(fr_drun *r, look *L, ferry_error *err)
{
    ferry_delta_encoder *e = r->e;
    ferry_delta_stats *st = r->st;
    uint64_t record_max = e->dc.crossover >= 1 ? UINT64_MAX
                          : (uint64_t)(e->dc.crossover * (double)L->elements) + 1;
    double c0 = fr_delta_now();
    uint64_t bytes = 0;
    if (L->my == 0)
        L->my = fr_delta_compare(&e->lay, &r->cur, record_max, &st->changed, &bytes, &L->partial,
                                 &L->me);
    st->encode_s += fr_delta_now() - c0;
    st->compared_bytes += bytes;
    char word[64];
    snprintf(word, sizeof word, "ok %" PRIu64, st->changed);
    int rc = exchange(r, "exact", word, L, err);
    if (rc < 0)
        return rc;
    st->total_changed = L->sum.changed;
    if ((double)L->sum.changed > e->dc.crossover * (double)L->sum.elements) {
        st->kind = FERRY_DELTA_DENSE_FRACTION;
    } else if (L->partial) {
        uint64_t changed = 0;
        bool partial = false;
        c0 = fr_delta_now();
        bytes = 0;
        fr_delta_forget(&r->cur);
        /* a failure here still takes part in the stages (as a failed word) */
        r->pre_rc = fr_delta_compare(&e->lay, &r->cur, UINT64_MAX, &changed, &bytes, &partial,
                                     &r->pre_err);
        st->encode_s += fr_delta_now() - c0;
        st->compared_bytes += bytes;
    }
    return 0;
}

/* A dense generation published: the snapshot refilled from it. */
static int finish_dense(fr_drun *r, ferry_manifest *pl, const ferry_shard_data *mine, size_t n,
                        ferry_error *err)
{
    ferry_delta_encoder *e = r->e;
    int rc = dense(r, pl, mine, n, err);
    if (rc < 0)
        return rc;
    double s0 = fr_delta_now();
    uint64_t bytes = 0;
    ferry_error fe = {0};
    /* The last snapshot's buffers where a piece keeps its size: refilled
     * in place, with no fresh pages to fault in (83 MB a rank in the
     * benchmark, at the first-touch rate, beside the rollouts' reads). */
    for (size_t i = 0; i < r->cur.np && i < e->lay.np; i++) {
        fr_dpiece *a = &e->lay.p[i], *b = &r->cur.p[i];
        if (a->snap && !b->snap && a->elems == b->elems &&
            ferry_dtype_size(e->lay.t[a->tensor].out) == ferry_dtype_size(r->cur.t[b->tensor].out)) {
            b->snap = a->snap;
            a->snap = NULL;
        }
    }
    if (fr_delta_fill(&r->cur, &bytes, &fe) < 0) {
        /* announced, but no snapshot: the next publish is dense */
        fr_delta_layout_free(&r->cur, true);
        ferry_delta_encoder_reset(e);
        FR_WARN("rl", "delta encoder of %s rank %u: %s; its next publish is dense", r->c->model,
                r->c->rank, fe.msg);
    } else {
        fr_delta_layout_free(&e->lay, true);
        e->lay = r->cur;
        memset(&r->cur, 0, sizeof r->cur);
        e->have = true;
        e->last = r->gen;
        e->chain = 0;
        e->bytes = bytes;
    }
    r->st->snapshot_s = fr_delta_now() - s0;
    return 0;
}

/* A sparse generation: stored and announced (or everything this rank put
 * removed), the snapshot brought forward. */
static int finish_sparse(fr_drun *r, ferry_error *err)
{
    ferry_delta_encoder *e = r->e;
    int rc = fr_delta_sparse(r, err);
    if (rc < 0)
        for (size_t i = 0; i < r->nkeys; i++)
            (void)ferry_sparse_remove(r->s, r->keys[i], NULL);
    fr_delta_parts_remove(r);
    if (rc < 0)
        return fr_fail(err, rc, "delta publish of %s generation %" PRIu64 " failed: %s",
                       r->c->model, r->gen, fr_why(err, rc));
    double s0 = fr_delta_now();
    fr_delta_apply(&e->lay, &r->cur);
    e->last = r->gen;
    e->chain++;
    r->st->chain = e->chain;
    r->st->snapshot_s = fr_delta_now() - s0;
    return 0;
}

int ferry_delta_publish(ferry_store *s, ferry_delta_encoder *e, uint64_t gen,
                        ferry_manifest *placement, const ferry_shard_data *mine, size_t n,
                        ferry_delta_stats *st, ferry_error *err)
{
    ferry_delta_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!s || !e || !placement || gen == 0 || (n && !mine))
        return fr_fail(err, FERRY_EINVAL, "delta publish: bad arguments (store, encoder, "
                       "generation, placement)");
    const ferry_publisher_config *c = &e->pc;
    double t0 = fr_delta_now();
    uint64_t active = 0;
    int rc = fr_rl_active_read(s, c->model, &active, NULL, err);
    if (rc < 0 && rc != FERRY_ENOENT)
        return fr_fail(err, rc, "delta publish: cannot read the active generation of %s: %s",
                       c->model, fr_why(err, rc));
    if (active >= gen)
        return fr_fail(err, FERRY_EINVAL, "delta publish: generation %" PRIu64 " of %s is not "
                       "newer than the active %" PRIu64 "; nothing stored", gen, c->model, active);
    if (e->words && e->words != gen)
        drop_words(s, c, e->words);
    fr_drun r = { .s = s, .e = e, .c = c, .gen = gen, .base = active, .st = st,
                  .sweep = !e->have || e->last != active || e->failed_base == active };
    look L = {0};
    rc = look_first(&r, placement, mine, n, &L, err);
    if (rc == 0 && st->kind == FERRY_DELTA_SPARSE)
        rc = look_exact(&r, &L, err);
    if (rc == 0)
        rc = st->kind == FERRY_DELTA_SPARSE ? finish_sparse(&r, err)
                                            : finish_dense(&r, placement, mine, n, err);
    e->failed_base = rc < 0 ? active : 0;
    if (e->have && e->lay.np == r.cur.np && e->lay.p != r.cur.p)
        lend(&r.cur, &e->lay);   /* kept for the next publish */
    st->encode_gbps = st->encode_s > 0 ? (double)st->compared_bytes / st->encode_s / 1e9 : 0;
    e->words = gen;   /* this rank's words of gen go at its next publish of another */
    run_free(&r);
    st->total_s = fr_delta_now() - t0;
    return rc;
}
