/* Updating a rollout worker from the active generation by reading its own
 * demand from the store (weights.h): parameter-direct and compatibility. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "rl/rl_int.h"



static double now_s(void)
{
    return (double)fr_now_ns() / 1e9;
}

static int prepare_once(ferry_store *s, const char *model, uint64_t *generation,
                        ferry_weight_manifest *m, bool *current, ferry_error *err);

/* The active generation and its manifest, unless *generation is current. */
int fr_rl_prepare(ferry_store *s, const char *model, uint64_t *generation,
                  ferry_weight_manifest *m, bool *current, ferry_update_stats *st,
                  ferry_error *err)
{
    double t0 = now_s();
    int rc = prepare_once(s, model, generation, m, current, err);
    st->generation = *generation;
    st->prepare_s = now_s() - t0;
    return rc;
}

static int prepare_once(ferry_store *s, const char *model, uint64_t *generation,
                        ferry_weight_manifest *m, bool *current, ferry_error *err)
{
    uint64_t active = 0;
    *current = false;
    int rc = fr_rl_active_read(s, model, &active, NULL, NULL);
    if (rc < 0)
        return fr_fail(err, rc, "no generation of %s is active (%s)", model, ferry_strerror(rc));
    if (active == *generation) {
        *current = true;
        return 0;
    }
    return fr_rl_prepare_at(s, model, active, m, err);
}

int fr_rl_prepare_at(ferry_store *s, const char *model, uint64_t generation,
                     ferry_weight_manifest *m, ferry_error *err)
{
    int rc = ferry_weights_manifest(s, model, generation, m, err);
    if (rc < 0)
        return rc;
    /* Every object must be there (and leased) before a parameter is touched. */
    rc = fr_gen_lease_all(s, fr_gen_of(m), err);
    if (rc < 0)
        ferry_weight_manifest_free(m);
    return rc;
}

/* ---- explicit dequantization ------------------------------------------------------------ */

/* A shard asking q * s of an FP8 tensor (ferry_param_shard.dequantize) is
 * read as two staged shards — its box's FP8 bytes and the scales of the
 * blocks it meets — and dequantized into its buffer after the reads. */
typedef struct deq_item {
    size_t shard;               /* the caller's */
    uint8_t *fp8;
    float *scales;
    uint64_t b0[2], nb[2];
    uint32_t block[2];
    char fp8_dtype[16];
} deq_item;

typedef struct deq {
    ferry_param_shard *shards;  /* what is read: the caller's, staged ones in place */
    size_t n;
    deq_item *items;
    size_t nitems;
} deq;

static void deq_free(deq *q)
{
    for (size_t i = 0; i < q->nitems; i++) {
        free(q->items[i].fp8);
        free(q->items[i].scales);
    }
    free(q->items);
    free(q->shards);
}

static int deq_check(const fr_gen *g, const ferry_param_shard *p, int ti, ferry_tensor_quant *tq,
                     ferry_error *err)
{
    ferry_tensor_desc d;
    (void)ferry_manifest_tensor(g->m, (uint32_t)ti, &d);
    (void)ferry_manifest_tensor_quant(g->m, (uint32_t)ti, tq);
    if (tq->role != FERRY_QUANT_WEIGHT)
        return fr_fail(err, FERRY_EINVAL, "tensor %s is published as %s, not as FP8 in blocks: "
                       "there is nothing to dequantize (asked %s)", d.name, d.dtype, p->dequantize);
    uint32_t esz = ferry_dtype_size(p->dequantize);
    if (ferry_convert(NULL, "f32", NULL, p->dequantize, 0) < 0)
        return fr_fail(err, FERRY_EINVAL, "tensor %s: dequantize to %s: f32, bf16 or f16", d.name,
                       p->dequantize);
    if (p->ndim != 2 || (p->shape[1] > 1 && p->strides[1] > 1) ||
        (p->strides[0] && (uint64_t)p->strides[0] < p->shape[1]))
        return fr_fail(err, FERRY_EINVAL, "tensor %s: a shard dequantized is 2-D with its rows "
                       "contiguous", d.name);
    if (p->elem_bytes && p->elem_bytes != esz)
        return fr_fail(err, FERRY_EINVAL, "tensor %s: the shard's buffer holds %" PRIu64 "-byte "
                       "elements; %s has %u-byte ones", d.name, p->elem_bytes, p->dequantize, esz);
    uint64_t rs = p->strides[0] ? (uint64_t)p->strides[0] : p->shape[1];
    uint64_t span = p->shape[0] && p->shape[1] ? ((p->shape[0] - 1) * rs + p->shape[1]) * esz : 0;
    if (p->dst_bytes && span > p->dst_bytes)
        return fr_fail(err, FERRY_EINVAL, "tensor %s: the shard dequantized to %s spans %" PRIu64
                       " bytes of its buffer, which holds %" PRIu64, d.name, p->dequantize, span,
                       p->dst_bytes);
    return 0;
}

/* The shards to read: each dequantized one as its FP8 box and its scales. */
static int deq_stage(const fr_gen *g, const ferry_param_shard *shards, size_t n, deq *q,
                     ferry_error *err)
{
    size_t k = 0, cap = 0, icap = 0;
    for (size_t i = 0; i < n; i++)
        k += shards[i].dequantize != NULL;
    if (!k)
        return 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_param_shard *p = &shards[i];
        int ti = p->dequantize ? ferry_manifest_find_tensor(g->m, p->tensor ? p->tensor : "") : -1;
        bool empty = p->ndim == 2 && (!p->shape[0] || !p->shape[1]);
        if (fr_grow((void **)&q->shards, &cap, q->n + 2, sizeof *q->shards) < 0)
            return fr_fail(err, FERRY_ENOMEM, "update: out of memory");
        if (ti < 0 || empty) {   /* not in the generation: fr_rl_target says so */
            q->shards[q->n++] = *p;
            continue;
        }
        ferry_tensor_quant tq;
        int rc = deq_check(g, p, ti, &tq, err);
        if (rc < 0)
            return rc;
        if (fr_grow((void **)&q->items, &icap, q->nitems + 1, sizeof *q->items) < 0)
            return fr_fail(err, FERRY_ENOMEM, "update: out of memory");
        deq_item *it = &q->items[q->nitems++];
        *it = (deq_item){ .shard = i, .block = { tq.fp8.block_rows, tq.fp8.block_cols } };
        snprintf(it->fp8_dtype, sizeof it->fp8_dtype, "%s", tq.fp8_dtype);
        for (int d = 0; d < 2; d++) {
            it->b0[d] = p->offset[d] / it->block[d];
            it->nb[d] = (p->offset[d] + p->shape[d] - 1) / it->block[d] - it->b0[d] + 1;
        }
        it->fp8 = malloc(p->shape[0] * p->shape[1]);
        it->scales = malloc(it->nb[0] * it->nb[1] * sizeof *it->scales);
        if (!it->fp8 || !it->scales)
            return fr_fail(err, FERRY_ENOMEM, "update: out of memory");
        ferry_tensor_desc sd;
        (void)ferry_manifest_tensor(g->m, tq.partner, &sd);
        q->shards[q->n++] = (ferry_param_shard){ .tensor = p->tensor, .ndim = 2,
            .offset = { p->offset[0], p->offset[1] }, .shape = { p->shape[0], p->shape[1] },
            .dst = it->fp8, .dst_bytes = p->shape[0] * p->shape[1],
            .dequantize = p->dequantize };   /* staged: its blocks need not be whole */
        q->shards[q->n++] = (ferry_param_shard){ .tensor = sd.name, .ndim = 2,
            .offset = { it->b0[0], it->b0[1] }, .shape = { it->nb[0], it->nb[1] },
            .dst = it->scales, .dst_bytes = it->nb[0] * it->nb[1] * sizeof *it->scales };
    }
    return 0;
}

/* After the reads: every dequantized shard's buffer from its staging. */
static int deq_finish(const deq *q, const ferry_param_shard *shards, ferry_error *err)
{
    for (size_t i = 0; i < q->nitems; i++) {
        const deq_item *it = &q->items[i];
        const ferry_param_shard *p = &shards[it->shard];
        uint64_t rs = p->strides[0] ? (uint64_t)p->strides[0] : p->shape[1];
        uint32_t esz = ferry_dtype_size(p->dequantize);
        for (uint64_t r = 0; r < p->shape[0]; r++) {
            uint64_t gr = p->offset[0] + r;
            const float *srow = it->scales + (gr / it->block[0] - it->b0[0]) * it->nb[1];
            for (uint64_t c = 0; c < p->shape[1];) {
                uint64_t gc = p->offset[1] + c, len = it->block[1] - gc % it->block[1];
                len = len < p->shape[1] - c ? len : p->shape[1] - c;
                int rc = ferry_dequantize_fp8(it->fp8 + r * p->shape[1] + c, it->fp8_dtype,
                                              (uint8_t *)p->dst + (r * rs + c) * esz,
                                              p->dequantize, (size_t)len,
                                              srow[gc / it->block[1] - it->b0[1]], err);
                if (rc < 0)   /* a scale that is not finite and > 0: written in part */
                    return fr_fail(err, FERRY_EREBUILD, "tensor %s: %s; the parameters must be "
                                   "rebuilt", p->tensor, fr_why(err, rc));
                c += len;
            }
        }
    }
    return 0;
}

/* ---- parameter-direct ----------------------------------------------------------------- */

/* Parameter-direct: the shards are the target placement (one rank), bound
 * where they live; the planner maps the stored placement onto it and exec
 * reads it. Nothing is read before the whole plan is made and lowered. */
int ferry_weights_update_direct(ferry_store *s, const char *model, uint64_t *generation,
                                const ferry_param_shard *shards, size_t n,
                                ferry_update_stats *st, ferry_error *err)
{
    ferry_update_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!s || !model || !generation || (n && !shards))
        return fr_fail(err, FERRY_EINVAL, "update: bad arguments");
    ferry_weight_manifest m = {0};
    bool current = false;
    int rc = fr_rl_prepare(s, model, generation, &m, &current, st, err);
    if (rc < 0 || current)
        return rc;
    fr_gen *g = fr_gen_of(&m);
    ferry_manifest *tgt = NULL;
    ferry_plan *plan = NULL;
    ferry_binding *dst = NULL;
    ferry_attested_plan *att = NULL;
    ferry_store_reads reads = {0};
    size_t *shard_of = NULL;
    uint64_t *addr = NULL, *nbytes = NULL;
    deq dq = {0};
    const ferry_param_shard *caller = shards;
    size_t ncaller = n;
    rc = deq_stage(g, shards, n, &dq, err);
    if (dq.shards)
        shards = dq.shards, n = dq.n;
    if (rc == 0)
        rc = fr_rl_target(g, shards, n, 1, NULL, &tgt, &shard_of, err);
    uint64_t nf = tgt ? ferry_manifest_fragment_count(tgt) : 0;
    if (rc == 0 && (!(addr = malloc((nf ? nf : 1) * sizeof *addr)) ||
                    !(nbytes = malloc((nf ? nf : 1) * sizeof *nbytes))))
        rc = fr_fail(err, FERRY_ENOMEM, "update: out of memory");
    for (uint64_t j = 0; rc == 0 && j < nf; j++) {
        addr[j] = (uint64_t)(uintptr_t)shards[shard_of[j]].dst;
        nbytes[j] = shards[shard_of[j]].dst_bytes;
    }
    if (rc == 0)
        rc = ferry_plan_create(g->m, tgt, NULL, &plan, err);
    if (rc == 0)
        rc = fr_rl_bind(tgt, g->generation, 0, NULL, 0, addr, nbytes, &dst, err);
    if (rc == 0)
        rc = fr_rl_attest_reads(g, plan, dst, &att, err);
    if (rc == 0 && nf)
        rc = ferry_exec_store_lower(att, dst, (const uint32_t[]){ 0 }, 1, NULL, &reads, err);
    if (rc < 0 && err && !err->msg[0])
        fr_fail(err, rc, "update: planning: %s", ferry_strerror(rc));
    st->tensors = ncaller;
    double t1 = now_s();
    if (rc == 0 && reads.n) {
        ferry_error e = {0};
        ferry_exec_result res;
        ferry_store_exec_config xc = { .store = s, .locate = fr_rl_locate, .locate_ctx = g };
        rc = ferry_exec_store_run(&xc, att, dst, &reads, 0, reads.n, &res, &e);
        st->bytes_read = res.bytes_done;
        st->ranges = reads.n;
        if (rc < 0 && res.state == FERRY_TICKET_ABORTED)   /* nothing was written */
            fr_fail(err, rc, "%s", e.msg);
        else if (rc < 0)   /* the parameters may be partly written */
            rc = fr_fail(err, FERRY_EREBUILD, "%s; the parameters must be rebuilt", e.msg);
        ferry_exec_result_free(&res);
    }
    if (rc == 0)
        rc = deq_finish(&dq, caller, err);
    st->read_s = now_s() - t1;
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
    }
    deq_free(&dq);
    ferry_store_reads_free(&reads);
    ferry_attested_free(att);
    ferry_binding_free(dst);
    free(addr);
    free(nbytes);
    free(shard_of);
    ferry_plan_free(plan);
    ferry_manifest_close(tgt);
    ferry_weight_manifest_free(&m);
    return rc;
}

/* ---- compatibility --------------------------------------------------------------------- */

int ferry_weights_update_compat(ferry_store *s, const char *model, uint64_t *generation,
                                ferry_weights_tensor_fn fn, void *ctx, ferry_update_stats *st,
                                ferry_error *err)
{
    ferry_update_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!s || !model || !generation || !fn)
        return fr_fail(err, FERRY_EINVAL, "update: bad arguments");
    ferry_weight_manifest m = {0};
    bool current = false;
    int rc = fr_rl_prepare(s, model, generation, &m, &current, st, err);
    if (rc < 0 || current)
        return rc;
    double t1 = now_s();
    void *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; rc == 0 && i < m.n; i++) {
        const ferry_weight_entry *e = &m.entries[i];
        if (e->bytes > cap) {
            void *nb = realloc(buf, e->bytes);
            if (!nb) {
                rc = fr_fail(err, FERRY_ENOMEM, "tensor %s: cannot allocate %" PRIu64 " bytes",
                          e->name, e->bytes);
                break;
            }
            buf = nb;
            cap = e->bytes;
        }
        rc = ferry_weights_read(s, e, buf, cap, err);
        if (rc == 0) {
            st->bytes_read += e->bytes;
            st->ranges++;
            st->tensors++;
            rc = fn(ctx, e, buf);
            if (rc != 0)
                fr_fail(err, rc, "the loader stopped at tensor %s (%d)", e->name, rc);
        }
    }
    free(buf);
    st->read_s = now_s() - t1;
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
    }
    ferry_weight_manifest_free(&m);
    return rc;
}
