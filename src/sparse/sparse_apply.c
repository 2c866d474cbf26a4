/* Scatter apply of a target-local result (sparse.h, docs/sparse.md
 * "Apply"): into a view of the target box — a contiguous buffer of the
 * box, or any strided view (a slice of a larger parameter, one part of a
 * fused one, a transposed layout) — behind the base-generation fence.
 * Everything is checked before the first write, so a refusal leaves the
 * memory untouched. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "sparse/sparse_int.h"

static int dim_cmp(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;   /* (stride, extent) pairs, by stride */
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Element strides of v (all 0: row-major of its shape) into st, and the
 * checks that need them: no negative stride, no two elements of the box
 * on one address, the last element inside v->bytes. *span = bytes from
 * v->data to the end of the last element. */
static int view_strides(const ferry_sparse_result *r, const ferry_sparse_view *v, size_t dsz,
                        uint64_t st[FERRY_SPARSE_NDIM_MAX], uint64_t *span, ferry_error *err)
{
    bool given = false;
    for (uint32_t k = 0; k < v->ndim; k++)
        given |= v->strides[k] != 0;
    uint64_t s = 1, last = 0;
    for (int k = (int)v->ndim - 1; k >= 0; k--) {
        if (v->strides[k] < 0)
            return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: stride %" PRId64 " of dimension "
                           "%d is negative; nothing changed", r->tensor_id, v->strides[k], k);
        st[k] = given ? (uint64_t)v->strides[k] : s;
        uint64_t reach;
        if (fr_mul_u64(st[k], v->shape[k] ? v->shape[k] - 1 : 0, &reach) < 0 || last + reach < last)
            return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: the view's strides overflow; "
                           "nothing changed", r->tensor_id);
        last += reach;
        if (fr_mul_u64(s, v->shape[k], &s) < 0)
            return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: shape overflows; nothing "
                           "changed", r->tensor_id);
    }
    /* One address per element: sorted by stride, each stride must clear
     * what the smaller ones reach (extent 1 dimensions take no room). */
    uint64_t ds[FERRY_SPARSE_NDIM_MAX][2];
    uint32_t n = 0;
    for (uint32_t k = 0; k < v->ndim; k++)
        if (v->shape[k] > 1) {
            ds[n][0] = st[k];
            ds[n++][1] = v->shape[k];
        }
    qsort(ds, n, sizeof ds[0], dim_cmp);
    uint64_t reach = 0;   /* elements the smaller dimensions span, minus one */
    for (uint32_t i = 0; i < n; i++) {
        if (ds[i][0] <= reach)
            return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: the view's strides put two "
                           "elements of the box on one address (stride %" PRIu64 " within the %"
                           PRIu64 " elements the smaller strides span); nothing changed",
                           r->tensor_id, ds[i][0], reach + 1);
        reach += ds[i][0] * (ds[i][1] - 1);
    }
    if (fr_mul_u64(last + 1, dsz, span) < 0)
        return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: the view's span overflows; "
                       "nothing changed", r->tensor_id);
    if (v->bytes && *span > v->bytes)
        return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: the view spans %" PRIu64 " bytes, "
                       "its memory holds %" PRIu64 "; nothing changed", r->tensor_id, *span,
                       v->bytes);
    return 0;
}

static int check(const ferry_sparse_result *r, const ferry_sparse_view *v,
                 uint64_t current_generation, size_t *dsz, ferry_error *err)
{
    if (!r || !v || (r->nnz && (!v->data || !r->indices || !r->values)))
        return fr_fail(err, FERRY_EINVAL, "sparse_apply: result, buffer, indices and values "
                       "are required");
    *dsz = fr_sp_value_size(v->dtype);
    size_t vsz = fr_sp_value_size(r->value_dtype);
    if (!*dsz || !vsz)
        return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: dtypes must be f32, bf16 or f16 "
                       "(buffer '%.7s', values '%.7s')", r->tensor_id, v->dtype,
                       r->value_dtype);
    if (r->ndim < 1 || r->ndim > FERRY_SPARSE_NDIM_MAX)
        return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: ndim %" PRIu32 " outside 1..%d",
                       r->tensor_id, r->ndim, FERRY_SPARSE_NDIM_MAX);
    if (r->apply == FERRY_SPARSE_SCATTER_ADD && current_generation != r->base_generation)
        return fr_fail(err, FERRY_ESTATE, "sparse_apply %s: the delta %" PRIu64 " -> %" PRIu64
                       " applies to base generation %" PRIu64 " but the buffer holds "
                       "generation %" PRIu64 "; nothing changed", r->tensor_id,
                       r->base_generation, r->delta_generation, r->base_generation,
                       current_generation);
    if (r->apply != FERRY_SPARSE_SCATTER_ADD && r->apply != FERRY_SPARSE_SCATTER_SET)
        return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: unknown apply mode %d",
                       r->tensor_id, (int)r->apply);
    if (v->ndim != r->ndim)
        return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: the view has %" PRIu32 " dimensions,"
                       " the target %" PRIu32 "; nothing changed", r->tensor_id, v->ndim,
                       r->ndim);
    for (uint32_t k = 0; k < r->ndim; k++)
        if (v->shape[k] != r->shape[k])
            return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: dimension %" PRIu32 " of the "
                           "view is %" PRIu64 ", of the target's local shape %" PRIu64
                           "; nothing changed", r->tensor_id, k, v->shape[k], r->shape[k]);
    /* Every index first: a bad one must leave the buffer untouched. */
    for (uint64_t i = 0; i < r->nnz; i++)
        for (uint32_t k = 0; k < r->ndim; k++) {
            int64_t x = r->indices[i * r->ndim + k];
            if (x < 0 || (uint64_t)x >= r->shape[k])
                return fr_fail(err, FERRY_EINVAL, "sparse_apply %s: entry %" PRIu64 " has "
                               "coordinate %" PRId64 " in dimension %" PRIu32 ", outside 0..%"
                               PRIu64 "; nothing changed", r->tensor_id, i, x, k,
                               r->shape[k]);
        }
    return 0;
}

int ferry_sparse_apply_view(const ferry_sparse_result *r, const ferry_sparse_view *v,
                            uint64_t current_generation, uint64_t *new_generation,
                            ferry_error *err)
{
    size_t dsz = 0;
    uint64_t st[FERRY_SPARSE_NDIM_MAX], span = 0;
    int rc = check(r, v, current_generation, &dsz, err);
    if (rc == 0)
        rc = view_strides(r, v, dsz, st, &span, err);
    if (rc < 0)
        return rc;
    /* values widen to f32 a chunk at a time (the base layer's bulk
     * conversion); the scattered buffer elements one by one (its inline
     * per-element one, the same rounding) */
    enum { CH = 1024 };
    float vf[CH];
    uint8_t *d = v->data;
    size_t vsz = fr_sp_value_size(r->value_dtype);
    bool set = r->apply == FERRY_SPARSE_SCATTER_SET;
    fr_ftype dft = fr_ftype_of(v->dtype), vft = fr_ftype_of(r->value_dtype);
    if (set && dft == vft && dsz == vsz) {   /* the value's bytes are the element's: copied */
        const uint8_t *src = r->values;
        for (uint64_t i = 0; i < r->nnz; i++) {
            const int64_t *x = r->indices + i * r->ndim;
            uint64_t at = 0;
            for (uint32_t k = 0; k < r->ndim; k++)
                at += (uint64_t)x[k] * st[k];
            memcpy(d + at * dsz, src + i * vsz, dsz == 2 ? 2 : 4);
        }
        if (new_generation)
            *new_generation = r->delta_generation;
        return 0;
    }
    for (uint64_t i0 = 0; i0 < r->nnz; i0 += CH) {
        size_t n = r->nnz - i0 < CH ? (size_t)(r->nnz - i0) : CH;
        fr_convert((const uint8_t *)r->values + i0 * vsz, vft, vf, FR_FT_F32, n);
        for (size_t q = 0; q < n; q++) {
            const int64_t *x = r->indices + (i0 + q) * r->ndim;
            uint64_t at = 0;
            for (uint32_t k = 0; k < r->ndim; k++)
                at += (uint64_t)x[k] * st[k];
            uint8_t *p = d + at * dsz;
            float val = vf[q];
            if (!set)
                val += fr_elem_load_f32(p, dft);
            fr_elem_store_f32(p, dft, val);
        }
    }
    if (new_generation)
        *new_generation = r->delta_generation;
    return 0;
}

int ferry_sparse_apply(const ferry_sparse_result *r, void *dst, const char *dst_dtype,
                       uint64_t current_generation, uint64_t *new_generation, ferry_error *err)
{
    if (!r)
        return fr_fail(err, FERRY_EINVAL, "sparse_apply: result, buffer, indices and values "
                       "are required");
    ferry_sparse_view v = {.data = dst, .ndim = r->ndim};
    snprintf(v.dtype, sizeof v.dtype, "%s", dst_dtype ? dst_dtype : "");
    if (r->ndim <= FERRY_SPARSE_NDIM_MAX)
        memcpy(v.shape, r->shape, sizeof v.shape);
    return ferry_sparse_apply_view(r, &v, current_generation, new_generation, err);
}
