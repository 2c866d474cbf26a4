/* Manifests of stored generations: the stored form of a placement (one
 * copy of every box, contiguous local storage, one dtype) and its packing
 * into store objects (reshard.h, "stored manifests and packing").
 *
 * The packing is a pure function of the manifest: every rank's fragments
 * in fragment-id order, each at an offset aligned to `align` bytes, a new
 * object begun when the next fragment would take the current one past
 * `max_bytes` (a larger fragment gets an object of its own). So a reader
 * that knows the manifest knows where every byte is without a table of
 * bindings, which at a trillion parameters in FSDP256 would be 18 million
 * entries. */
#include <stdlib.h>
#include <string.h>

#include "reshard/reshard_int.h"

static int copy_tensors(const ferry_manifest *m, const char *dtype, ferry_manifest *out,
                        ferry_error *err)
{
    for (size_t i = 0; i < m->ntensors; i++) {
        const fr_tensor *t = &m->tensors[i];
        ferry_tensor_desc d = { .name = t->name, .dtype = dtype ? dtype : t->dtype,
                                .itemsize = dtype ? ferry_dtype_size(dtype) : t->itemsize,
                                .ndim = t->ndim };
        memcpy(d.shape, t->shape, sizeof d.shape);
        int rc = ferry_manifest_add_tensor(out, &d, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Copy 0 of group g, if its replica number is 0, as a group of out. */
static int copy_group(const ferry_manifest *m, const fr_group *g, ferry_manifest *out,
                      ferry_error *err)
{
    if (g->replica != 0)
        return 0;   /* another copy of boxes stored once, by their copy 0 */
    if (g->is_split) {
        ferry_split s = { .tensor = g->tensor, .rank = g->rank, .replicas = 1 };
        for (uint32_t d = 0; d < g->ndim; d++) {
            s.offset[d] = G_OFF(m, g)[d];
            s.shape[d] = G_EXT(m, g)[d];
            s.parts[d] = (uint32_t)G_PARTS(m, g)[d];
            s.rank_stride[d] = (uint32_t)G_RSTRIDE(m, g)[d];
        }
        return ferry_manifest_add_split(out, &s, err);
    }
    ferry_fragment f = { .tensor = g->tensor, .rank = g->rank };
    for (uint32_t d = 0; d < g->ndim; d++) {
        f.offset[d] = G_OFF(m, g)[d];
        f.shape[d] = G_EXT(m, g)[d];
    }
    return ferry_manifest_add_fragment(out, &f, err);
}

int ferry_manifest_stored(const ferry_manifest *m, const char *dtype, ferry_manifest **out,
                          ferry_error *err)
{
    if (!m || !out)
        return fr_fail(err, FERRY_EINVAL, "stored manifest: null argument");
    *out = NULL;
    if (dtype && !ferry_dtype_size(dtype))
        return fr_fail(err, FERRY_EINVAL, "stored manifest: unknown dtype '%s'", dtype);
    ferry_manifest *s;
    int rc = ferry_manifest_create(m->nranks, m->gpus_per_node ? NULL : m->nodes,
                                   m->gpus_per_node, &s);
    if (rc < 0)
        return fr_fail(err, rc, "stored manifest: %s", ferry_strerror(rc));
    rc = copy_tensors(m, dtype, s, err);
    for (size_t i = 0; i < m->ngroups && rc == 0; i++)
        rc = copy_group(m, &m->groups[i], s, err);
    if (rc < 0) {
        ferry_manifest_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* ---- packing ------------------------------------------------------------------------ */

#define OFF_BITS 40            /* offset in an object: objects are at most 1 TiB */

struct ferry_pack {
    ferry_manifest *m;         /* referenced: fragments' ranks and sizes */
    uint64_t nfrags;
    uint32_t nranks;
    uint64_t *loc;             /* per fragment: object << OFF_BITS | offset */
    uint32_t *nobjects;        /* per rank */
    uint64_t **object_bytes;   /* per rank, per object */
    uint32_t *cap;
};

void ferry_pack_free(ferry_pack *p)
{
    if (!p)
        return;
    for (uint32_t r = 0; p->object_bytes && r < p->nranks; r++)
        free(p->object_bytes[r]);
    free(p->object_bytes), free(p->loc), free(p->nobjects), free(p->cap);
    ferry_manifest_close(p->m);
    free(p);
}

/* Place `bytes` on rank r: where it goes (object << OFF_BITS | offset). */
static int place(ferry_pack *p, uint32_t r, uint64_t bytes, uint64_t align, uint64_t max,
                 uint64_t *loc)
{
    uint32_t k = p->nobjects[r];
    uint64_t at = k ? (p->object_bytes[r][k - 1] + align - 1) / align * align : 0;
    if (k == 0 || (at + bytes > max && p->object_bytes[r][k - 1] > 0)) {
        if (k == p->cap[r]) {
            uint32_t nc = p->cap[r] ? 2 * p->cap[r] : 4;
            uint64_t *nb = realloc(p->object_bytes[r], nc * sizeof *nb);
            if (!nb)
                return FERRY_ENOMEM;
            p->object_bytes[r] = nb;
            p->cap[r] = nc;
        }
        p->object_bytes[r][k] = 0;
        p->nobjects[r] = ++k;
        at = 0;
    }
    if (k - 1 >= (1u << (64 - OFF_BITS)) || at + bytes >= (1ull << OFF_BITS))
        return FERRY_ERANGE;
    *loc = (uint64_t)(k - 1) << OFF_BITS | at;
    p->object_bytes[r][k - 1] = at + bytes;
    return 0;
}

int ferry_manifest_pack(const ferry_manifest *m, uint64_t align, uint64_t max_bytes,
                        ferry_pack **out, ferry_error *err)
{
    if (!m || !out || align == 0 || (align & (align - 1)) || max_bytes == 0)
        return fr_fail(err, FERRY_EINVAL, "pack: bad arguments (align a power of two)");
    *out = NULL;
    int frc = fr_manifest_freeze((ferry_manifest *)m);   /* the pack describes it as it is */
    if (frc < 0)
        return fr_fail(err, frc, "pack: %s", ferry_strerror(frc));
    ferry_pack *p = calloc(1, sizeof *p);
    uint64_t n = m->nfrags;
    if (p) {
        p->nfrags = n;
        p->nranks = m->nranks;
        p->loc = malloc((n ? n : 1) * sizeof *p->loc);
        p->nobjects = calloc(m->nranks ? m->nranks : 1, sizeof *p->nobjects);
        p->cap = calloc(m->nranks ? m->nranks : 1, sizeof *p->cap);
        p->object_bytes = calloc(m->nranks ? m->nranks : 1, sizeof *p->object_bytes);
    }
    if (!p || !p->loc || !p->nobjects || !p->cap || !p->object_bytes) {
        ferry_pack_free(p);
        return fr_fail(err, FERRY_ENOMEM, "pack: out of memory for %llu fragments",
                       (unsigned long long)n);
    }
    /* Groups hold consecutive fragment ids, copies then pieces: walking
     * groups in order walks ids in order, and so every rank's own. */
    for (size_t gi = 0; gi < m->ngroups; gi++) {
        const fr_group *g = &m->groups[gi];
        const fr_tensor *t = &m->tensors[g->tensor];
        for (uint32_t k = 0; k < g->replicas; k++) {
            for (uint64_t lin = 0; lin < g->ncells; lin++) {
                uint64_t idx[FR_MAXD], shape[FR_MAXD], elems = 1;
                fr_group_piece(m, g, lin, idx, NULL, shape);
                for (uint32_t d = 0; d < g->ndim; d++)
                    elems *= shape[d];
                uint64_t id = g->first_id + (uint64_t)k * g->ncells + lin;
                int rc = place(p, fr_group_rank(m, g, idx, k), elems * t->itemsize, align,
                               max_bytes, &p->loc[id]);
                if (rc < 0) {
                    ferry_pack_free(p);
                    return fr_fail(err, rc, "pack: %s", rc == FERRY_ERANGE
                                   ? "an object past 1 TiB or too many objects" : "out of memory");
                }
            }
        }
    }
    fr_manifest_ref((ferry_manifest *)m);
    p->m = (ferry_manifest *)m;
    *out = p;
    return 0;
}

int ferry_pack_fragment(const ferry_pack *p, uint64_t id, ferry_packed *out)
{
    if (!p || !out || id >= p->nfrags)
        return FERRY_EINVAL;
    const ferry_manifest *m = p->m;
    const fr_group *g = &m->groups[fr_manifest_group_of(m, id)];
    uint64_t rel = id - g->first_id, lin = rel % g->ncells, idx[FR_MAXD], shape[FR_MAXD];
    uint32_t k = (uint32_t)(rel / g->ncells);
    fr_group_piece(m, g, lin, idx, NULL, shape);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < g->ndim; d++)
        elems *= shape[d];
    *out = (ferry_packed){ .rank = fr_group_rank(m, g, idx, k),
                           .object = (uint32_t)(p->loc[id] >> OFF_BITS),
                           .offset = p->loc[id] & ((1ull << OFF_BITS) - 1),
                           .bytes = elems * m->tensors[g->tensor].itemsize };
    return 0;
}

uint32_t ferry_pack_objects(const ferry_pack *p, uint32_t rank)
{
    return p && rank < p->nranks ? p->nobjects[rank] : 0;
}

uint64_t ferry_pack_object_bytes(const ferry_pack *p, uint32_t rank, uint32_t object)
{
    return p && rank < p->nranks && object < p->nobjects[rank] ? p->object_bytes[rank][object] : 0;
}
