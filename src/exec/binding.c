/* Runtime binding manifests: entries validated against a placement, a
 * sorted index by fragment id, and the canonical digest. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "exec/exec_int.h"
#include "reshard/reshard_int.h"

int ferry_binding_create(ferry_manifest *placement, uint64_t instance_id, uint64_t generation,
                         uint64_t lease_id, ferry_binding **out, ferry_error *err)
{
    if (placement == NULL || out == NULL)
        return fr_fail(err, FERRY_EINVAL, "binding: no placement manifest");
    ferry_binding *b = fr_calloc(1, sizeof(*b));
    if (b == NULL)
        return fr_fail(err, FERRY_ENOMEM, "binding: out of memory");
    int rc = ferry_manifest_digest(placement, b->placement_digest);
    if (rc < 0) {
        fr_free(b);
        return fr_fail(err, rc, "binding: cannot digest the placement: %s", ferry_strerror(rc));
    }
    fr_manifest_ref(placement);
    b->placement = placement;
    b->instance = instance_id;
    b->generation = generation;
    b->lease = lease_id;
    *out = b;
    return 0;
}

void ferry_binding_free(ferry_binding *b)
{
    if (b == NULL)
        return;
    ferry_manifest_close(b->placement);
    fr_free(b->v);
    fr_free(b->order);
    fr_free(b);
}

/* Position in b->order where `fragment` is or would be inserted. */
static size_t lower_bound(const ferry_binding *b, uint64_t fragment)
{
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->v[b->order[mid]].fragment < fragment)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Checks of one entry against its fragment; fills err naming the fragment. */
static int check_entry(const ferry_binding *b, const ferry_binding_entry *e, ferry_error *err)
{
    const uint64_t id = e->fragment;
    ferry_fragment f;
    ferry_tensor_desc t;

    if (id >= ferry_manifest_fragment_count(b->placement))
        return fr_fail(err, FERRY_ENOENT, "binding fragment %" PRIu64
                       ": no such fragment in the placement (%" PRIu64 " fragments)",
                       id, ferry_manifest_fragment_count(b->placement));
    int rc = ferry_manifest_fragment(b->placement, id, &f);
    if (rc == 0)
        rc = ferry_manifest_tensor(b->placement, f.tensor, &t);
    if (rc < 0)
        return fr_fail(err, rc, "binding fragment %" PRIu64 ": %s", id, ferry_strerror(rc));
    if (e->kind != FERRY_MEM_HOST && e->kind != FERRY_MEM_DEVICE)
        return fr_fail(err, FERRY_EINVAL, "binding fragment %" PRIu64 " of %s: unknown device kind %d",
                       id, t.name, (int)e->kind);
    if (e->itemsize != t.itemsize)
        return fr_fail(err, FERRY_EINVAL, "binding fragment %" PRIu64 " of %s: itemsize %u, the tensor has %u",
                       id, t.name, e->itemsize, t.itemsize);
    if (e->ndim != t.ndim)
        return fr_fail(err, FERRY_EINVAL, "binding fragment %" PRIu64 " of %s: %u dims, the tensor has %u",
                       id, t.name, e->ndim, t.ndim);
    if (e->desc_len > FERRY_DESC_MAX)
        return fr_fail(err, FERRY_EMSGSIZE, "binding fragment %" PRIu64 " of %s: descriptor of %u bytes (max %d)",
                       id, t.name, e->desc_len, FERRY_DESC_MAX);
    /* Highest element index: storage_offset + sum((shape-1) * stride). */
    uint64_t last = e->storage_offset, term, end, top;
    for (uint32_t d = 0; d < e->ndim; d++) {
        if (e->shape[d] != f.shape[d])
            return fr_fail(err, FERRY_EINVAL, "binding fragment %" PRIu64 " of %s: dim %u has %" PRIu64
                           " elements, the fragment has %" PRIu64, id, t.name, d, e->shape[d], f.shape[d]);
        if (e->strides[d] == 0 && e->shape[d] > 1)
            return fr_fail(err, FERRY_EINVAL, "binding fragment %" PRIu64 " of %s: stride 0 on dim %u aliases elements",
                           id, t.name, d);
        if (fr_mul_u64(e->shape[d] - 1, e->strides[d], &term) < 0 || fr_add_u64(last, term, &last) < 0)
            return fr_fail(err, FERRY_ERANGE, "binding fragment %" PRIu64 " of %s: strides overflow 64 bits",
                           id, t.name);
    }
    if (fr_add_u64(last, 1, &end) < 0 || fr_mul_u64(end, e->itemsize, &end) < 0)
        return fr_fail(err, FERRY_ERANGE, "binding fragment %" PRIu64 " of %s: storage span overflows 64 bits",
                       id, t.name);
    if (end > e->nbytes)
        return fr_fail(err, FERRY_ERANGE, "binding fragment %" PRIu64 " of %s: elements reach byte %" PRIu64
                       ", past the %" PRIu64 " bytes of the buffer", id, t.name, end, e->nbytes);
    if (fr_add_u64(e->addr, e->nbytes, &top) < 0)
        return fr_fail(err, FERRY_ERANGE, "binding fragment %" PRIu64 " of %s: addr + nbytes overflows 64 bits",
                       id, t.name);
    return 0;
}

int ferry_binding_add(ferry_binding *b, const ferry_binding_entry *e, ferry_error *err)
{
    if (b == NULL || e == NULL)
        return fr_fail(err, FERRY_EINVAL, "binding: no entry");
    int rc = check_entry(b, e, err);
    if (rc < 0)
        return rc;
    size_t pos = lower_bound(b, e->fragment);
    if (pos < b->n && b->v[b->order[pos]].fragment == e->fragment)
        return fr_fail(err, FERRY_EEXIST, "binding fragment %" PRIu64 ": bound twice", e->fragment);
    if (b->n == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 16;
        ferry_binding_entry *nv = fr_reallocarray(b->v, nc, sizeof(*nv));
        if (nv == NULL)
            return fr_fail(err, FERRY_ENOMEM, "binding: out of memory");
        b->v = nv;
        size_t *no = fr_reallocarray(b->order, nc, sizeof(*no));
        if (no == NULL)
            return fr_fail(err, FERRY_ENOMEM, "binding: out of memory");
        b->order = no;
        b->cap = nc;
    }
    b->v[b->n] = *e;
    memset(b->v[b->n].desc + e->desc_len, 0, FERRY_DESC_MAX - e->desc_len);
    for (uint32_t d = e->ndim; d < FERRY_MAX_DIMS; d++)
        b->v[b->n].shape[d] = b->v[b->n].strides[d] = 0;
    memmove(b->order + pos + 1, b->order + pos, (b->n - pos) * sizeof(*b->order));
    b->order[pos] = b->n;
    b->n++;
    return 0;
}

uint64_t ferry_binding_instance(const ferry_binding *b) { return b->instance; }
uint64_t ferry_binding_generation(const ferry_binding *b) { return b->generation; }
uint64_t ferry_binding_lease(const ferry_binding *b) { return b->lease; }
size_t ferry_binding_count(const ferry_binding *b) { return b->n; }

const ferry_binding_entry *ferry_binding_entry_at(const ferry_binding *b, size_t i)
{
    return i < b->n ? &b->v[i] : NULL;
}

const ferry_binding_entry *ferry_binding_find(const ferry_binding *b, uint64_t fragment)
{
    size_t pos = lower_bound(b, fragment);
    if (pos < b->n && b->v[b->order[pos]].fragment == fragment)
        return &b->v[b->order[pos]];
    return NULL;
}

void ferry_binding_placement_digest(const ferry_binding *b, uint8_t out[16])
{
    memcpy(out, b->placement_digest, 16);
}

static void put_u64(fr_hasher *h, uint64_t x)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(x >> (8 * i));
    fr_hasher_update(h, le, sizeof(le));
}

/* Canonical encoding: every integer as 8 little-endian bytes, entries in
 * fragment order, dims up to ndim only, the descriptor length-prefixed. */
static void digest_as(const ferry_binding *b, uint64_t instance, uint64_t generation,
                      uint64_t lease, uint8_t out[16]);

void ferry_binding_digest(const ferry_binding *b, uint8_t out[16])
{
    digest_as(b, b->instance, b->generation, b->lease, out);
}

void fr_binding_layout_digest(const ferry_binding *b, uint8_t out[16])
{
    digest_as(b, 0, 0, 0, out);
}

static void digest_as(const ferry_binding *b, uint64_t instance, uint64_t generation,
                      uint64_t lease, uint8_t out[16])
{
    fr_hasher *h = fr_hasher_new(0);
    if (h == NULL) {   /* cannot happen short of OOM; an all-zero digest matches nothing */
        memset(out, 0, 16);
        return;
    }
    fr_hasher_update(h, "ferry-binding-v1", 16);
    fr_hasher_update(h, b->placement_digest, 16);
    put_u64(h, instance);
    put_u64(h, generation);
    put_u64(h, lease);
    put_u64(h, b->n);
    for (size_t i = 0; i < b->n; i++) {
        const ferry_binding_entry *e = &b->v[b->order[i]];
        put_u64(h, e->fragment);
        put_u64(h, e->addr);
        put_u64(h, e->nbytes);
        put_u64(h, e->worker);
        put_u64(h, (uint64_t)e->kind);
        put_u64(h, e->itemsize);
        put_u64(h, e->ndim);
        for (uint32_t d = 0; d < e->ndim; d++) {
            put_u64(h, e->shape[d]);
            put_u64(h, e->strides[d]);
        }
        put_u64(h, e->storage_offset);
        put_u64(h, e->desc_len);
        fr_hasher_update(h, e->desc, e->desc_len);
    }
    fr_hash128_t d = fr_hasher_digest(h);
    fr_hasher_free(h);
    memcpy(out, d.b, 16);
}
