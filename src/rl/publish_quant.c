/* Quantizing once, before the network (docs/weights.md, "FP8 rollouts"):
 * a publisher whose config carries quantization rules stores the tensors
 * they pick as FP8 in blocks, each block quantized by the ranks that hold
 * it, and the blocks' scales beside them.
 *
 * The generation's placement is the trainers' stored layout quantized as a
 * source (ferry_manifest_quantize_source): each block's scale is held by
 * the rank holding the block's first element, so the scale fragments tile
 * the scale tensor once. A block whole on one rank is quantized there from
 * its values (ferry_quantize_fp8_blocks over the piece). A block that a
 * shard boundary cuts needs the largest |x| of all of its parts: every
 * rank holding a part takes its part's maximum (the first pass over its
 * data), stores its partial maxima as one small object (r<R>.amax: records
 * of tensor, block row, block column, f32 bits), meets the other ranks at
 * the generation's "amax" barrier and reads the partial maxima of the
 * ranks whose pieces meet its cut blocks. The maximum of f32s is exact and
 * does not depend on the order, so every rank holding a part of a block
 * computes the same bits and, with the block formula, the same scale: no
 * dense byte moves between trainers. Each rank then quantizes its own rows
 * with the agreed scales (fr_fp8_region_quant), the same bytes a
 * whole-tensor quantization gives. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

/* A partial maximum as stored (r<R>.amax). */
typedef struct amax_rec {
    uint32_t tensor, brow, bcol, amax;
} amax_rec;

void fr_pub_quant_free(fr_pub_mine *p)
{
    for (size_t i = 0; p->q && i < p->npieces; i++) {
        free(p->q[i].amax);
        free(p->q[i].scale);
    }
    free(p->q);
    free(p->qhead);
    p->q = NULL;
    p->qhead = NULL;
}

/* The blocks of dim d that [off, end) meets; whether it holds each whole. */
static void blocks_met(uint64_t off, uint64_t len, uint32_t b, uint64_t *b0, uint64_t *nb)
{
    *b0 = off / b;
    *nb = len ? (off + len - 1) / b - *b0 + 1 : 0;
}

static bool block_whole(const fr_pub_q *q, const ferry_fragment *f, const uint64_t *shape,
                        uint64_t bi, uint64_t bj)
{
    uint64_t blk[2] = { bi, bj };
    for (uint32_t d = 0; d < 2; d++) {
        uint64_t lo = blk[d] * q->block[d], hi = lo + q->block[d];
        hi = hi < shape[d] ? hi : shape[d];
        if (lo < f->offset[d] || hi > f->offset[d] + f->shape[d])
            return false;
    }
    return true;
}

/* The piece of weight tensor `tensor` on this rank whose blocks hold the
 * scale box [off, off + shape), or npieces. */
static size_t weight_of(const fr_pub_mine *p, uint32_t tensor, const uint64_t *off,
                        const uint64_t *shape)
{
    for (size_t j = p->qhead[tensor]; j != SIZE_MAX; j = p->q[j].next) {
        const fr_pub_q *w = &p->q[j];
        bool in = true;
        for (uint32_t d = 0; d < 2 && in; d++)
            in = off[d] >= w->b0[d] && off[d] + shape[d] <= w->b0[d] + w->nb[d];
        if (in)
            return j;
    }
    return p->npieces;
}

/* Piece i's quantization: its blocks (a weight: the first pass over a
 * cut piece), or the weight piece whose blocks a scale piece holds (the
 * weight pieces come first: their ids are lower). */
static int prepare_piece(fr_pub_mine *p, const ferry_publisher_config *c,
                         ferry_manifest *placement, size_t i, ferry_error *err)
{
    fr_pub_piece *pc = &p->pieces[i];
    fr_pub_q *q = &p->q[i];
    ferry_tensor_quant tq;
    ferry_tensor_desc d;
    (void)ferry_manifest_tensor_quant(p->stored, pc->src.tensor, &tq);
    (void)ferry_manifest_tensor(p->stored, pc->src.tensor, &d);
    if (tq.role == FERRY_QUANT_NONE)
        return 0;
    *q = (fr_pub_q){ .role = tq.role, .block = { tq.fp8.block_rows, tq.fp8.block_cols },
                     .format = tq.fp8.scale_format, .next = SIZE_MAX };
    snprintf(q->dtype, sizeof q->dtype, "%s", tq.fp8_dtype);
    if (tq.role == FERRY_QUANT_SCALE) {
        q->weight = weight_of(p, tq.partner, pc->src.offset, pc->src.shape);
        if (q->weight == p->npieces)
            return fr_fail(err, FERRY_EPROTO, "rank %u: the scales of tensor %s it holds "
                           "belong to no piece of it", c->rank, d.name);
        return 0;
    }
    ferry_tensor_desc src;
    (void)ferry_manifest_tensor(placement, pc->src.tensor, &src);
    if (pc->src.has_strides && pc->src.shape[0] > 0 && pc->src.shape[1] > 1 &&
        pc->src.strides[1] != 1)
        return fr_fail(err, FERRY_EINVAL, "tensor %s: rank %u's fragment has strides "
                       "[%" PRIu64 ",%" PRIu64 "]: a tensor quantized in FP8 blocks is read "
                       "row by row (the last stride 1)", d.name, c->rank,
                       pc->src.strides[0], pc->src.strides[1]);
    for (uint32_t k = 0; k < 2; k++) {
        blocks_met(pc->src.offset[k], pc->src.shape[k], q->block[k], &q->b0[k], &q->nb[k]);
        uint64_t end = pc->src.offset[k] + pc->src.shape[k];
        q->cut |= pc->src.offset[k] % q->block[k] || (end % q->block[k] && end != d.shape[k]);
    }
    size_t nb = (size_t)(q->nb[0] * q->nb[1]);
    q->scale = calloc(nb ? nb : 1, sizeof *q->scale);
    if (q->cut)
        q->amax = calloc(nb ? nb : 1, sizeof *q->amax);
    if (!q->scale || (q->cut && !q->amax))
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    if (q->cut) {   /* the first pass: every block's maximum, whole or partial */
        size_t stride = pc->src.has_strides ? pc->src.strides[0] : pc->src.shape[1];
        fr_fp8_region_amax((const uint8_t *)pc->data + pc->src.storage_offset * src.itemsize,
                           fr_ftype_of(src.dtype), stride, pc->src.shape[0], pc->src.shape[1],
                           pc->src.offset[0], pc->src.offset[1], q->block, q->amax, q->nb[1]);
    }
    return 0;
}

int fr_pub_quant_prepare(fr_pub_mine *p, const ferry_publisher_config *c,
                         ferry_manifest *placement, ferry_error *err)
{
    uint32_t nt = ferry_manifest_tensor_count(p->stored);
    p->q = calloc(p->npieces ? p->npieces : 1, sizeof *p->q);
    p->qhead = malloc((nt ? nt : 1) * sizeof *p->qhead);
    if (!p->q || !p->qhead)
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    for (uint32_t t = 0; t < nt; t++)
        p->qhead[t] = SIZE_MAX;
    size_t *tail = calloc(nt ? nt : 1, sizeof *tail);   /* last weight piece per tensor */
    if (!tail)
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    int rc = 0;
    for (size_t i = 0; i < p->npieces && rc == 0; i++) {
        rc = prepare_piece(p, c, placement, i, err);
        if (rc == 0 && p->q[i].role == FERRY_QUANT_WEIGHT) {   /* on its tensor's list */
            uint32_t t = p->pieces[i].src.tensor;
            p->q[i].next = SIZE_MAX;
            if (p->qhead[t] == SIZE_MAX)
                p->qhead[t] = i;
            else
                p->q[tail[t]].next = i;
            tail[t] = i;
        }
    }
    free(tail);
    return rc;
}

static int by_block(const void *a, const void *b)
{
    const amax_rec *x = a, *y = b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    if (x->brow != y->brow)
        return x->brow < y->brow ? -1 : 1;
    return x->bcol < y->bcol ? -1 : x->bcol > y->bcol;
}

/* This rank's partial maxima of its cut blocks, sorted, one per block. */
static int my_records(const fr_pub_mine *p, amax_rec **out, size_t *n, ferry_error *err)
{
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    for (size_t i = 0; i < p->npieces; i++) {
        const fr_pub_q *q = &p->q[i];
        if (q->role != FERRY_QUANT_WEIGHT || !q->cut)
            continue;
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(p->stored, p->pieces[i].src.tensor, &d);
        for (uint64_t a = 0; a < q->nb[0]; a++)
            for (uint64_t b = 0; b < q->nb[1]; b++) {
                if (block_whole(q, &p->pieces[i].src, d.shape, q->b0[0] + a, q->b0[1] + b))
                    continue;
                if (fr_grow((void **)out, &cap, *n + 1, sizeof **out) < 0)
                    return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
                (*out)[(*n)++] = (amax_rec){ p->pieces[i].src.tensor, (uint32_t)(q->b0[0] + a),
                                             (uint32_t)(q->b0[1] + b), q->amax[a * q->nb[1] + b] };
            }
    }
    if (*n)
        qsort(*out, *n, sizeof **out, by_block);
    size_t u = 0;   /* two pieces of this rank in one block: one record, their maximum */
    for (size_t i = 0; i < *n; i++) {
        if (u && !by_block(&(*out)[u - 1], &(*out)[i])) {
            if ((*out)[i].amax > (*out)[u - 1].amax)
                (*out)[u - 1].amax = (*out)[i].amax;
        } else {
            (*out)[u++] = (*out)[i];
        }
    }
    *n = u;
    return 0;
}

/* The ranks other than this one holding a piece that meets one of this
 * rank's cut blocks: a weight fragment of the same tensor that meets the
 * blocks a cut piece meets (it then holds part of one of them). */
static int neighbours(const fr_pub_mine *p, uint32_t me, uint32_t world, bool *nb)
{
    uint64_t nf = ferry_manifest_fragment_count(p->stored);
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        ferry_tensor_quant tq;
        if (ferry_manifest_fragment(p->stored, id, &f) < 0 || f.rank == me || f.rank >= world ||
            nb[f.rank])
            continue;
        if (p->qhead[f.tensor] == SIZE_MAX)
            continue;   /* no piece of its tensor here (a weight or not) */
        (void)ferry_manifest_tensor_quant(p->stored, f.tensor, &tq);
        if (tq.role != FERRY_QUANT_WEIGHT)
            continue;
        for (size_t i = p->qhead[f.tensor]; i != SIZE_MAX && !nb[f.rank]; i = p->q[i].next) {
            const fr_pub_q *q = &p->q[i];
            if (!q->cut)
                continue;
            bool meets = true;
            for (uint32_t d = 0; d < 2 && meets; d++) {
                uint64_t lo = q->b0[d] * q->block[d], hi = (q->b0[d] + q->nb[d]) * q->block[d];
                meets = f.offset[d] < hi && f.offset[d] + f.shape[d] > lo;
            }
            nb[f.rank] = meets;
        }
    }
    return 0;
}

/* Fold rank r's partial maxima into mine. */
static int read_partials(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                         uint32_t r, amax_rec *mine, size_t n, ferry_error *err)
{
    char key[FR_KEY_MAX], what[32];
    snprintf(what, sizeof what, "r%u.amax", r);
    (void)fr_key_gen_file(key, sizeof key, c->model, gen, what);
    void *buf = NULL;
    size_t len = 0;
    int rc = ferry_store_get(s, key, &buf, &len, err);
    if (rc == FERRY_ENOENT)   /* canceled: the coordinator reports rank r's own reason */
        return fr_fail(err, FERRY_ECANCELED, "rank %u stored no partial maxima of the blocks "
                       "it shares with rank %u (it failed before the ranks agreed on their "
                       "scales)", r, c->rank);
    if (rc < 0)
        return fr_fail(err, rc, "reading rank %u's partial maxima: %s", r, fr_why(err, rc));
    const amax_rec *v = buf;
    for (size_t i = 0; i < len / sizeof *v; i++) {
        amax_rec *hit = bsearch(&v[i], mine, n, sizeof *mine, by_block);
        if (hit && v[i].amax > hit->amax)
            hit->amax = v[i].amax;   /* finite |x| bits: their order is the values' */
    }
    ferry_store_free(buf);
    return 0;
}

/* The agreed maxima back into the pieces; every cut piece's scales. */
static void set_scales(fr_pub_mine *p, const amax_rec *rec, size_t n)
{
    for (size_t i = 0; i < p->npieces; i++) {
        fr_pub_q *q = &p->q[i];
        if (q->role != FERRY_QUANT_WEIGHT || !q->cut)
            continue;
        const fr_fp8_fmt *f = fr_fp8_fmt_of(q->dtype);
        for (uint64_t a = 0; a < q->nb[0]; a++)
            for (uint64_t b = 0; b < q->nb[1]; b++) {
                amax_rec key = { p->pieces[i].src.tensor, (uint32_t)(q->b0[0] + a),
                                 (uint32_t)(q->b0[1] + b), 0 };
                const amax_rec *hit = bsearch(&key, rec, n, sizeof *rec, by_block);
                uint32_t *m = &q->amax[a * q->nb[1] + b];
                if (hit)
                    *m = hit->amax;
                q->scale[a * q->nb[1] + b] = fr_fp8_block_scale(*m, f, (int)q->format);
            }
    }
}

int fr_pub_quant_agree(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                       fr_pub_mine *p, bool failed, ferry_error *err)
{
    amax_rec *rec = NULL;
    size_t n = 0;
    int rc = failed || !p->q || !p->exchange ? 0 : my_records(p, &rec, &n, err);
    char key[FR_KEY_MAX], what[32];
    snprintf(what, sizeof what, "r%u.amax", c->rank);
    (void)fr_key_gen_file(key, sizeof key, c->model, gen, what);
    if (rc == 0 && !failed && n) {
        ferry_replicate_config repl = { .replica_num = 1, .hard_pin = true,
                                        .preferred_segments = &c->segment,
                                        .npreferred = c->segment ? 1 : 0,
                                        .slot = fr_pub_slot(c->model, c->rank, what) };
        rc = fr_pub_put(s, key, rec, n * sizeof *rec, &repl, NULL, err);
        if (rc < 0)
            fr_fail(err, rc, "could not store rank %u's partial maxima: %s", c->rank,
                    fr_why(err, rc));
        p->amax_put = rc == 0;
    } else if (failed || rc < 0) {
        (void)ferry_store_remove(s, key, NULL);   /* a leftover of an earlier attempt */
    }
    /* Every rank meets the others, also one that failed: they would wait
     * for it otherwise. */
    char bk[FR_KEY_MAX], member[32];
    fr_key_wk(bk, sizeof bk, c->model, gen, "amax");
    snprintf(member, sizeof member, "rank %u", c->rank);
    uint64_t a = 0;
    ferry_error be = {0};
    int brc = ferry_barrier(s, bk, member, c->world, c->timeout_ms, &a, &be);
    if (rc == 0 && brc < 0)
        rc = fr_fail(err, brc, "rank %u: the ranks did not meet to agree on the scales of "
                     "blocks their shards cut: %s", c->rank, fr_why(&be, brc));
    bool *nb = NULL;
    if (rc == 0 && !failed && n && !(nb = calloc(c->world, sizeof *nb)))
        rc = fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    if (rc == 0 && nb)
        rc = neighbours(p, c->rank, c->world, nb);
    for (uint32_t r = 0; rc == 0 && nb && r < c->world; r++)
        if (nb[r])
            rc = read_partials(s, c, gen, r, rec, n, err);
    if (rc == 0 && !failed && p->q)
        set_scales(p, rec, n);
    free(nb);
    free(rec);
    return rc;
}

void fr_pub_quant_pack(fr_pub_mine *p, size_t i, const ferry_tensor_desc *src, uint8_t *out)
{
    fr_pub_piece *pc = &p->pieces[i];
    fr_pub_q *q = &p->q[i];
    const ferry_fragment *f = &pc->src;
    if (q->role == FERRY_QUANT_SCALE) {   /* the scale rows it holds, from its weight's blocks */
        const fr_pub_q *w = &p->q[q->weight];
        for (uint64_t r = 0; r < f->shape[0]; r++)
            memcpy(out + r * f->shape[1] * sizeof(float),
                   w->scale + (f->offset[0] + r - w->b0[0]) * w->nb[1] + (f->offset[1] - w->b0[1]),
                   f->shape[1] * sizeof(float));
        return;
    }
    size_t stride = f->has_strides ? f->strides[0] : f->shape[1];
    const uint8_t *in = (const uint8_t *)pc->data + f->storage_offset * src->itemsize;
    if (q->cut) {
        fr_fp8_region_quant(in, fr_ftype_of(src->dtype), stride, out, f->shape[1], f->shape[0],
                            f->shape[1], f->offset[0], f->offset[1], q->block, q->scale,
                            q->nb[1], fr_fp8_fmt_of(q->dtype));
        return;
    }
    /* whole blocks: the block driver, whose scales are this piece's blocks' */
    ferry_fp8_options o = { .block_rows = q->block[0], .block_cols = q->block[1],
                            .scale_format = q->format };
    (void)ferry_quantize_fp8_blocks(in, src->dtype, stride, out, q->dtype, f->shape[1],
                                    f->shape[0], f->shape[1], q->scale, &o, NULL);
}
