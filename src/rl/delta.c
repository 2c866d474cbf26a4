/* The delta encoder (weights.h, docs/sparse.md "Deltas from a trainer"):
 * the handle, the layout of a publish (the placement's tensors, their
 * owners, this rank's copy-0 pieces), the snapshot of what this rank last
 * published in the rollout dtype, and the comparison with it. The publish
 * across the ranks is delta_publish.c. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/delta_int.h"
#include "rl/rl_int.h"

/* ---- the config and the handle ------------------------------------------------------------ */

int ferry_delta_config_init(ferry_delta_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->crossover = FERRY_DELTA_CROSSOVER;
    cfg->max_chain = FERRY_DELTA_CHAIN;
    return 0;
}

int ferry_delta_encoder_open(const ferry_publisher_config *pc, const ferry_delta_config *dc,
                             ferry_delta_encoder **out, ferry_error *err)
{
    if (out)
        *out = NULL;
    if (!pc || !out || pc->world == 0 || pc->rank >= pc->world || !pc->model[0] ||
        strchr(pc->model, '/') || !memchr(pc->model, '\0', sizeof pc->model) ||
        !FR_RESERVED_OK(pc))
        return fr_fail(err, FERRY_EINVAL, "delta encoder: bad publisher config (model, rank, "
                       "world, reserved words)");
    if (pc->quant)   /* deltas compare in the rollout dtype; FP8 blocks are not one */
        return fr_fail(err, FERRY_EINVAL, "delta encoder: a delta encoder does not quantize "
                       "(the publisher config's quant must be NULL)");
    ferry_delta_config d;
    (void)ferry_delta_config_init(&d);
    if (dc) {
        if (!FR_RESERVED_OK(dc))
            return fr_fail(err, FERRY_EINVAL, "delta encoder: the config's reserved fields must "
                           "be zero (start from ferry_delta_config_init)");
        if (isnan(dc->crossover) || dc->crossover < 0)
            return fr_fail(err, FERRY_EINVAL, "delta encoder: crossover %g is not a fraction "
                           ">= 0", dc->crossover);
        if (dc->max_chain > FERRY_DELTA_CHAIN_MAX)
            return fr_fail(err, FERRY_EINVAL, "delta encoder: max_chain %u is above %u",
                           dc->max_chain, FERRY_DELTA_CHAIN_MAX);
        if (dc->crossover > 0)
            d.crossover = dc->crossover;
        if (dc->max_chain)
            d.max_chain = dc->max_chain;
    }
    ferry_delta_encoder *e = calloc(1, sizeof *e);
    if (!e)
        return fr_fail(err, FERRY_ENOMEM, "delta encoder: out of memory");
    e->pc = *pc;
    fr_rl_publisher_resolve(&e->pc);
    e->dc = d;
    if (pc->rank_node) {
        if (!(e->rank_node = malloc(pc->world * sizeof *e->rank_node))) {
            free(e);
            return fr_fail(err, FERRY_ENOMEM, "delta encoder: out of memory");
        }
        memcpy(e->rank_node, pc->rank_node, pc->world * sizeof *e->rank_node);
    }
    e->pc.rank_node = e->rank_node;
    *out = e;
    return 0;
}

void ferry_delta_encoder_reset(ferry_delta_encoder *e)
{
    if (!e)
        return;
    fr_delta_layout_free(&e->lay, true);
    e->have = false;
    e->last = 0;
    e->chain = 0;
    e->bytes = 0;
}

uint64_t ferry_delta_encoder_bytes(const ferry_delta_encoder *e)
{
    return e ? e->bytes : 0;
}

void ferry_delta_encoder_close(ferry_delta_encoder *e)
{
    if (!e)
        return;
    ferry_delta_encoder_reset(e);
    free(e->rank_node);
    free(e);
}

/* ---- the layout ------------------------------------------------------------------------------ */

void fr_delta_layout_free(fr_dlayout *l, bool snaps)
{
    for (uint32_t i = 0; i < l->nt; i++)
        free(l->t[i].name);
    for (size_t i = 0; i < l->np; i++) {
        if (snaps)
            free(l->p[i].snap);
        free(l->p[i].chg);
        free(l->p[i].val);
    }
    free(l->t);
    free(l->p);
    memset(l, 0, sizeof *l);
}

static bool value_dtype(const char *d)
{
    return !strcmp(d, "f32") || !strcmp(d, "bf16") || !strcmp(d, "f16");
}

/* Owners: a tensor whose copy-0 pieces one rank holds is that rank's;
 * the others are spread by bytes (ferry_weights_assign over the ranks'
 * nodes), the same answer on every rank. holder[t]: the one holder, or
 * UINT32_MAX for several. */
static int owners(const ferry_delta_encoder *e, fr_dlayout *l, const uint32_t *holder,
                  ferry_error *err)
{
    uint64_t *bytes = malloc((l->nt ? l->nt : 1) * sizeof *bytes);
    uint32_t *idx = malloc((l->nt ? l->nt : 1) * sizeof *idx), *pub = NULL;
    uint32_t *nodes = calloc(e->pc.world, sizeof *nodes);
    size_t m = 0;
    int rc = bytes && idx && nodes ? 0 : fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    for (uint32_t t = 0; rc == 0 && t < l->nt; t++) {
        l->t[t].owner = holder[t];
        if (holder[t] != UINT32_MAX)
            continue;
        uint64_t b = ferry_dtype_size(l->t[t].out);
        for (uint32_t d = 0; d < l->t[t].ndim; d++)
            b *= l->t[t].shape[d];
        bytes[m] = b;
        idx[m++] = t;
    }
    if (rc == 0 && m) {
        if (e->rank_node)
            memcpy(nodes, e->rank_node, e->pc.world * sizeof *nodes);
        if (!(pub = malloc(m * sizeof *pub)))
            rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
        else
            rc = ferry_weights_assign(bytes, m, nodes, e->pc.world, pub, err);
        for (size_t k = 0; rc == 0 && k < m; k++)
            l->t[idx[k]].owner = pub[k];
    }
    free(bytes);
    free(idx);
    free(nodes);
    free(pub);
    return rc < 0 ? rc : 0;
}

int fr_delta_layout(const ferry_delta_encoder *e, ferry_manifest *pl, const ferry_shard_data *mine,
                    size_t n, fr_dlayout *l, ferry_error *err)
{
    memset(l, 0, sizeof *l);
    uint32_t nt = ferry_manifest_tensor_count(pl);
    uint64_t nf = ferry_manifest_fragment_count(pl);
    uint32_t *holder = malloc((nt ? nt : 1) * sizeof *holder);
    l->t = calloc(nt ? nt : 1, sizeof *l->t);
    size_t pcap = 0;
    int rc = holder && l->t ? 0 : fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    for (uint32_t i = 0; rc == 0 && i < nt; i++) {
        ferry_tensor_desc td;
        (void)ferry_manifest_tensor(pl, i, &td);
        fr_dtensor *t = &l->t[i];
        l->nt = i + 1;
        const char *out = e->pc.out_dtype[0] ? e->pc.out_dtype : td.dtype;
        if (!(t->name = strdup(td.name)))
            rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
        else if (td.ndim == 0)
            rc = fr_fail(err, FERRY_EINVAL, "tensor %s has no dimension: a delta's coordinates "
                         "need one (publish it as shape [1])", td.name);
        else if (!value_dtype(td.dtype) || !value_dtype(out))
            rc = fr_fail(err, FERRY_EINVAL, "tensor %s is %s, published as %s: a delta holds "
                         "f32, bf16 or f16 values", td.name, td.dtype, out);
        snprintf(t->dtype, sizeof t->dtype, "%s", td.dtype);
        snprintf(t->out, sizeof t->out, "%s", out);
        t->ndim = td.ndim;
        memcpy(t->shape, td.shape, sizeof t->shape);
        for (uint32_t d = 0; d < td.ndim; d++)
            t->i64 |= td.shape[d] > INT32_MAX;
        holder[i] = UINT32_MAX - 1;   /* none yet */
    }
    for (uint64_t id = 0; rc == 0 && id < nf; id++) {
        ferry_fragment f;
        (void)ferry_manifest_fragment(pl, id, &f);
        if (f.replica != 0 || f.tensor >= nt)
            continue;
        holder[f.tensor] = holder[f.tensor] == UINT32_MAX - 1 || holder[f.tensor] == f.rank
                               ? f.rank : UINT32_MAX;
        if (f.rank != e->pc.rank)
            continue;
        const ferry_shard_data *sd = NULL;
        for (size_t k = 0; k < n && !sd; k++)
            if (mine[k].fragment == id)
                sd = &mine[k];
        if (!sd || !sd->data) {
            rc = fr_fail(err, FERRY_EINVAL, "piece %" PRIu64 " of tensor %s is this rank's to "
                         "store and was given no data", id, l->t[f.tensor].name);
            break;
        }
        if (fr_grow((void **)&l->p, &pcap, l->np + 1, sizeof *l->p) < 0) {
            rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
            break;
        }
        fr_dpiece *p = &l->p[l->np++];
        memset(p, 0, sizeof *p);
        p->fragment = id;
        p->tensor = f.tensor;
        p->elems = 1;
        for (uint32_t d = 0; d < l->t[f.tensor].ndim; d++) {
            p->offset[d] = f.offset[d];
            p->shape[d] = f.shape[d];
            p->elems *= f.shape[d];
        }
        p->data = sd->data;
        p->has_strides = f.has_strides;
        memcpy(p->strides, f.strides, sizeof p->strides);
        p->storage_offset = f.storage_offset;
        if (p->has_strides) {   /* row-major strides are contiguous: compared in place */
            uint64_t want = 1;
            bool dense = true;
            for (uint32_t d = l->t[f.tensor].ndim; d-- > 0 && dense;) {
                dense = p->shape[d] == 1 || (uint64_t)p->strides[d] == want;
                want *= p->shape[d];
            }
            p->has_strides = !dense;
        }
    }
    for (uint32_t i = 0; rc == 0 && i < nt; i++)
        if (holder[i] == UINT32_MAX - 1)
            holder[i] = 0;   /* no copy 0: the placement check refuses it (dense publish) */
    if (rc == 0)
        rc = owners(e, l, holder, err);
    free(holder);
    if (rc < 0)
        fr_delta_layout_free(l, false);
    return rc;
}

static void box_text(char *b, size_t cap, const uint64_t *o, const uint64_t *s, uint32_t nd)
{
    size_t k = (size_t)snprintf(b, cap, "[");
    for (uint32_t d = 0; d < nd && k < cap; d++)
        k += (size_t)snprintf(b + k, cap - k, "%s%" PRIu64 ":%" PRIu64, d ? ", " : "", o[d],
                              o[d] + s[d]);
    if (k < cap)
        snprintf(b + k, cap - k, "]");
}

static void shape_text(char *b, size_t cap, const uint64_t *s, uint32_t nd)
{
    size_t k = (size_t)snprintf(b, cap, "(");
    for (uint32_t d = 0; d < nd && k < cap; d++)
        k += (size_t)snprintf(b + k, cap - k, "%s%" PRIu64, d ? ", " : "", s[d]);
    if (k < cap)
        snprintf(b + k, cap - k, ")");
}

int fr_delta_layout_same(const fr_dlayout *a, const fr_dlayout *b, ferry_error *err)
{
    static const char *const tail = " (reset the encoder and publish dense)";
    if (a->nt != b->nt)
        return fr_fail(err, FERRY_EINVAL, "the placement holds %u tensors, the last generation "
                       "%u%s", b->nt, a->nt, tail);
    for (uint32_t i = 0; i < a->nt; i++) {
        const fr_dtensor *x = &a->t[i], *y = &b->t[i];
        if (strcmp(x->name, y->name))
            return fr_fail(err, FERRY_EINVAL, "tensor %u is %s, in the last generation %s%s", i,
                           y->name, x->name, tail);
        if (strcmp(x->dtype, y->dtype) || strcmp(x->out, y->out))
            return fr_fail(err, FERRY_EINVAL, "tensor %s is %s (published as %s), in the last "
                           "generation %s (as %s)%s", y->name, y->dtype, y->out, x->dtype, x->out,
                           tail);
        bool same = x->ndim == y->ndim;
        for (uint32_t d = 0; same && d < x->ndim; d++)
            same = x->shape[d] == y->shape[d];
        if (!same) {
            char s1[160], s2[160];
            shape_text(s1, sizeof s1, y->shape, y->ndim);
            shape_text(s2, sizeof s2, x->shape, x->ndim);
            return fr_fail(err, FERRY_EINVAL, "tensor %s has the shape %s, in the last "
                           "generation %s%s", y->name, s1, s2, tail);
        }
    }
    for (size_t i = 0; i < a->np || i < b->np; i++) {
        const fr_dpiece *x = i < a->np ? &a->p[i] : NULL, *y = i < b->np ? &b->p[i] : NULL;
        bool same = x && y && x->tensor == y->tensor;
        for (uint32_t d = 0; same && d < FERRY_MAX_DIMS; d++)
            same = x->offset[d] == y->offset[d] && x->shape[d] == y->shape[d];
        if (same)
            continue;
        char s1[160] = "nothing", s2[160] = "nothing";
        if (y)
            box_text(s1, sizeof s1, y->offset, y->shape, b->t[y->tensor].ndim);
        if (x)
            box_text(s2, sizeof s2, x->offset, x->shape, a->t[x->tensor].ndim);
        return fr_fail(err, FERRY_EINVAL, "its piece %zu is %s %s, in the last generation %s %s%s",
                       i, y ? b->t[y->tensor].name : "-", s1, x ? a->t[x->tensor].name : "-", s2,
                       tail);
    }
    return 0;
}

/* ---- comparing ------------------------------------------------------------------------------- */

/* cnt elements of p from element `start` (row-major in its box) in the
 * held dtype: a pointer into its data when contiguous, else gathered into
 * tmp. */
static const uint8_t *held(const fr_dpiece *p, uint32_t ndim, size_t isz, uint64_t start,
                           size_t cnt, uint8_t *tmp)
{
    const uint8_t *base = (const uint8_t *)p->data + p->storage_offset * isz;
    if (!p->has_strides)
        return base + start * isz;
    uint64_t ix[FERRY_MAX_DIMS], r = start;
    for (uint32_t d = ndim; d-- > 0;) {
        ix[d] = r % p->shape[d];
        r /= p->shape[d];
    }
    for (size_t k = 0; k < cnt; k++) {
        uint64_t off = 0;
        for (uint32_t d = 0; d < ndim; d++)
            off += ix[d] * p->strides[d];
        memcpy(tmp + k * isz, base + off * isz, isz);
        for (uint32_t d = ndim; d-- > 0;) {
            if (++ix[d] < p->shape[d])
                break;
            ix[d] = 0;
        }
    }
    return tmp;
}

typedef struct bufs {
    uint8_t *tmp, *conv;
    uint32_t *idx;
} bufs;

static int bufs_open(bufs *b, ferry_error *err)
{
    b->tmp = malloc(FR_DELTA_CHUNK * 4);
    b->conv = malloc(FR_DELTA_CHUNK * 4);
    b->idx = malloc(FR_DELTA_CHUNK * sizeof *b->idx);
    return b->tmp && b->conv && b->idx ? 0 : fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
}

static void bufs_close(bufs *b)
{
    free(b->tmp);
    free(b->conv);
    free(b->idx);
}

/* cnt elements from start in the rollout dtype, written to dst when given
 * (else into b->conv or, same dtype and contiguous, the data itself). */
static const uint8_t *rollout(const fr_dlayout *l, const fr_dpiece *p, uint64_t start, size_t cnt,
                              bufs *b, uint8_t *dst)
{
    const fr_dtensor *t = &l->t[p->tensor];
    size_t isz = ferry_dtype_size(t->dtype);
    const uint8_t *src = held(p, t->ndim, isz, start, cnt, b->tmp);
    if (!strcmp(t->dtype, t->out)) {
        if (!dst)
            return src;
        memcpy(dst, src, cnt * isz);
        return dst;
    }
    uint8_t *out = dst ? dst : b->conv;
    (void)ferry_convert(src, t->dtype, out, t->out, cnt);
    return out;
}

void fr_delta_forget(fr_dlayout *cur)
{
    for (size_t i = 0; i < cur->np; i++)
        cur->p[i].nchg = 0;
}

int fr_delta_compare(const fr_dlayout *snap, fr_dlayout *cur, uint64_t record_max, uint64_t *changed,
                     uint64_t *bytes, bool *partial, ferry_error *err)
{
    bufs b;
    int rc = bufs_open(&b, err);
    uint64_t recorded = 0, counted = 0;
    *changed = *bytes = 0;
    *partial = false;
    for (size_t i = 0; rc == 0 && i < cur->np; i++) {
        fr_dpiece *p = &cur->p[i];
        const fr_dtensor *t = &cur->t[p->tensor];
        size_t osz = ferry_dtype_size(t->out);
        const uint8_t *old = snap->p[i].snap;
        for (uint64_t start = 0; rc == 0 && start < p->elems; start += FR_DELTA_CHUNK) {
            size_t cnt = p->elems - start < FR_DELTA_CHUNK ? (size_t)(p->elems - start)
                                                            : FR_DELTA_CHUNK;
            const uint8_t *now = rollout(cur, p, start, cnt, &b, NULL);
            size_t k = fr_diff_path(FR_CONV_AUTO, now, old + start * osz, osz, cnt, b.idx);
            if (!k)
                continue;
            if (*partial || recorded + k > record_max) {   /* count only from here */
                *partial = true;
                counted += k;
                continue;
            }
            recorded += k;
            if (fr_grow((void **)&p->chg, &p->chg_cap, p->nchg + k, sizeof *p->chg) < 0 ||
                fr_grow((void **)&p->val, &p->val_cap, (p->nchg + k) * osz, 1) < 0) {
                rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory for the changed elements");
                break;
            }
            uint8_t *val = p->val + p->nchg * osz;
            for (size_t j = 0; j < k; j++)
                p->chg[p->nchg + j] = start + b.idx[j];
            if (osz == 2)   /* a constant size: a load and a store, not a call per change */
                for (size_t j = 0; j < k; j++)
                    memcpy(val + j * 2, now + (size_t)b.idx[j] * 2, 2);
            else
                for (size_t j = 0; j < k; j++)
                    memcpy(val + j * osz, now + (size_t)b.idx[j] * osz, osz);
            p->nchg += k;
        }
        *bytes += p->elems * ferry_dtype_size(t->dtype);
    }
    *changed = recorded + counted;
    bufs_close(&b);
    return rc;
}

int fr_delta_sample(const fr_dlayout *snap, const fr_dlayout *cur, uint64_t stride,
                    uint64_t *sampled, uint64_t *changed, uint64_t *bytes, ferry_error *err)
{
    bufs b;
    int rc = bufs_open(&b, err);
    *sampled = *changed = *bytes = 0;
    for (size_t i = 0; rc == 0 && i < cur->np; i++) {
        const fr_dpiece *p = &cur->p[i];
        const fr_dtensor *t = &cur->t[p->tensor];
        size_t osz = ferry_dtype_size(t->out), isz = ferry_dtype_size(t->dtype);
        for (uint64_t start = 0; start < p->elems; start += stride * FR_DELTA_CHUNK) {
            size_t cnt = p->elems - start < FR_DELTA_CHUNK ? (size_t)(p->elems - start)
                                                            : FR_DELTA_CHUNK;
            const uint8_t *now = rollout(cur, p, start, cnt, &b, NULL);
            *changed += fr_diff_path(FR_CONV_AUTO, now, snap->p[i].snap + start * osz, osz, cnt,
                                     b.idx);
            *sampled += cnt;
            *bytes += cnt * isz;
        }
    }
    bufs_close(&b);
    return rc;
}

int fr_delta_fill(fr_dlayout *cur, uint64_t *bytes, ferry_error *err)
{
    bufs b;
    int rc = bufs_open(&b, err);
    *bytes = 0;
    for (size_t i = 0; rc == 0 && i < cur->np; i++) {
        fr_dpiece *p = &cur->p[i];
        size_t osz = ferry_dtype_size(cur->t[p->tensor].out);
        if (!p->snap && !(p->snap = malloc(p->elems * osz + 1))) {
            rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory for the snapshot (%" PRIu64
                         " bytes)", p->elems * osz);
            break;
        }
        for (uint64_t start = 0; start < p->elems; start += FR_DELTA_CHUNK) {
            size_t cnt = p->elems - start < FR_DELTA_CHUNK ? (size_t)(p->elems - start)
                                                            : FR_DELTA_CHUNK;
            (void)rollout(cur, p, start, cnt, &b, p->snap + start * osz);
        }
        *bytes += p->elems * osz;
    }
    bufs_close(&b);
    return rc;
}

void fr_delta_apply(fr_dlayout *snap, const fr_dlayout *cur)
{
    for (size_t i = 0; i < cur->np; i++) {
        const fr_dpiece *p = &cur->p[i];
        size_t osz = ferry_dtype_size(cur->t[p->tensor].out);
        for (uint64_t j = 0; j < p->nchg; j++)
            memcpy(snap->p[i].snap + p->chg[j] * osz, p->val + j * osz, osz);
    }
}

uint64_t fr_delta_count(const fr_dlayout *cur, uint32_t t)
{
    uint64_t n = 0;
    for (size_t i = 0; i < cur->np; i++)
        if (cur->p[i].tensor == t)
            n += cur->p[i].nchg;
    return n;
}

uint64_t fr_delta_entries(const fr_dlayout *cur, uint32_t t, uint8_t *idx, uint8_t *val)
{
    const fr_dtensor *x = &cur->t[t];
    size_t osz = ferry_dtype_size(x->out), isz = x->i64 ? 8 : 4;
    uint64_t n = 0;
    for (size_t i = 0; i < cur->np; i++) {
        const fr_dpiece *p = &cur->p[i];
        if (p->tensor != t || !p->nchg)
            continue;
        memcpy(val + n * osz, p->val, p->nchg * osz);
        for (uint64_t j = 0; j < p->nchg; j++, n++) {
            uint64_t r = p->chg[j];
            uint8_t *c = idx + n * x->ndim * isz;
            for (uint32_t d = x->ndim; d-- > 0;) {
                uint64_t g = p->offset[d] + r % p->shape[d];
                r /= p->shape[d];
                if (isz == 4) {
                    int32_t v = (int32_t)g;
                    memcpy(c + d * 4, &v, 4);
                } else {
                    int64_t v = (int64_t)g;
                    memcpy(c + d * 8, &v, 8);
                }
            }
        }
    }
    return n;
}
