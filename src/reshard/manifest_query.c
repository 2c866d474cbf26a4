/* Reading manifests: pieces of splits, fragments by id, bytes per rank,
 * and the whole-manifest steps planning needs (freeze, validate). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard/reshard_int.h"

/* ---- pieces ------------------------------------------------------------- */

void fr_group_piece(const ferry_manifest *m, const fr_group *g, uint64_t lin, uint64_t *idx,
                    uint64_t *off, uint64_t *shape)
{
    const uint64_t *o = G_OFF(m, g), *e = G_EXT(m, g), *c = G_CHUNK(m, g), *p = G_PARTS(m, g);
    for (int d = g->ndim - 1; d >= 0; d--) {
        uint64_t i = lin % p[d];
        lin /= p[d];
        if (idx)
            idx[d] = i;
        uint64_t a = i * c[d], b = a + c[d] < e[d] ? a + c[d] : e[d];
        if (off)
            off[d] = o[d] + a;
        if (shape)
            shape[d] = b - a;
    }
}

uint32_t fr_group_rank(const ferry_manifest *m, const fr_group *g, const uint64_t *idx, uint32_t k)
{
    const uint64_t *rs = G_RSTRIDE(m, g);
    uint64_t r = g->rank + (uint64_t)k * g->replica_stride;
    for (uint32_t d = 0; d < g->ndim; d++)
        r += idx[d] * rs[d];
    return (uint32_t)r;
}

uint32_t fr_group_max_rank(const ferry_manifest *m, const fr_group *g)
{
    uint64_t idx[FR_MAXD];
    for (uint32_t d = 0; d < g->ndim; d++)
        idx[d] = G_PARTS(m, g)[d] - 1;
    return fr_group_rank(m, g, idx, g->replicas - 1);
}

const char *fr_frag_desc(const ferry_manifest *m, const fr_group *g, uint32_t k, uint64_t lin,
                         char *buf, size_t cap)
{
    uint64_t idx[FR_MAXD], off[FR_MAXD], shape[FR_MAXD];
    char b1[200], b2[200];
    fr_group_piece(m, g, lin, idx, off, shape);
    snprintf(buf, cap, "fragment %llu (rank %u, replica %u, offset %s, shape %s)",
             (unsigned long long)(g->first_id + (uint64_t)k * g->ncells + lin), fr_group_rank(m, g, idx, k),
             g->replica + k, fr_fmt_dims(b1, sizeof b1, off, g->ndim), fr_fmt_dims(b2, sizeof b2, shape, g->ndim));
    return buf;
}

size_t fr_manifest_group_of(const ferry_manifest *m, uint64_t id)
{
    size_t lo = 0, hi = m->ngroups;   /* last group with first_id <= id */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->groups[mid].first_id <= id)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int ferry_manifest_fragment(const ferry_manifest *m, uint64_t id, ferry_fragment *out)
{
    if (!m || !out || id >= m->nfrags)
        return FERRY_EINVAL;
    const fr_group *g = &m->groups[fr_manifest_group_of(m, id)];
    uint64_t rel = id - g->first_id, idx[FR_MAXD];
    uint32_t k = (uint32_t)(rel / g->ncells);
    memset(out, 0, sizeof *out);
    fr_group_piece(m, g, rel % g->ncells, idx, out->offset, out->shape);
    out->tensor = g->tensor;
    out->rank = fr_group_rank(m, g, idx, k);
    out->node = m->nodes[out->rank];
    out->replica = g->replica + k;
    out->has_strides = g->has_strides;
    if (g->has_strides)
        memcpy(out->strides, G_STRIDES(m, g), g->ndim * sizeof(uint64_t));
    out->storage_offset = g->storage_offset;
    out->object = g->object >= 0 ? m->objects[g->object] : NULL;
    out->object_offset = g->object_offset;
    return 0;
}

int ferry_manifest_rank_bytes(const ferry_manifest *m, uint32_t rank, uint64_t *out)
{
    if (!m || !out || rank >= m->nranks)
        return FERRY_EINVAL;
    uint64_t sum = 0, idx[FR_MAXD], shape[FR_MAXD];
    for (size_t gi = 0; gi < m->ngroups; gi++) {
        const fr_group *g = &m->groups[gi];
        if (rank < g->rank || rank > fr_group_max_rank(m, g))
            continue;
        uint32_t isz = m->tensors[g->tensor].itemsize;
        for (uint64_t lin = 0; lin < g->ncells; lin++) {
            fr_group_piece(m, g, lin, idx, NULL, shape);
            uint64_t v = isz;
            for (uint32_t d = 0; d < g->ndim; d++)
                v *= shape[d];
            for (uint32_t k = 0; k < g->replicas; k++)
                if (fr_group_rank(m, g, idx, k) == rank && fr_add_u64(sum, v, &sum) < 0)
                    return FERRY_ERANGE;
        }
    }
    *out = sum;
    return 0;
}

/* ---- whole-manifest checks ---------------------------------------------- */

int fr_manifest_freeze(ferry_manifest *m)
{
    if (m->frozen)
        return 0;
    uint32_t *start = fr_calloc(m->ntensors + 1, sizeof *start);
    uint32_t *list = fr_calloc(m->ngroups ? m->ngroups : 1, sizeof *list);
    if (!start || !list) {
        fr_free(start);
        fr_free(list);
        return FERRY_ENOMEM;
    }
    for (size_t g = 0; g < m->ngroups; g++)
        start[m->groups[g].tensor + 1]++;
    for (size_t t = 0; t < m->ntensors; t++)
        start[t + 1] += start[t];
    uint32_t *fill = fr_calloc(m->ntensors + 1, sizeof *fill);
    if (!fill) {
        fr_free(start);
        fr_free(list);
        return FERRY_ENOMEM;
    }
    for (size_t g = 0; g < m->ngroups; g++) {
        uint32_t t = m->groups[g].tensor;
        list[start[t] + fill[t]++] = (uint32_t)g;
    }
    fr_free(fill);
    m->tg_start = start;
    m->tg_list = list;
    m->frozen = true;
    return 0;
}

void fr_manifest_thaw(ferry_manifest *m)
{
    fr_free(m->tg_start);
    fr_free(m->tg_list);
    m->tg_start = NULL;
    m->tg_list = NULL;
    m->frozen = false;
}

typedef struct bound_span { int32_t object; uint64_t start, end; uint32_t group; } bound_span;

static int cmp_span(const void *a, const void *b)
{
    const bound_span *x = a, *y = b;
    if (x->object != y->object)
        return x->object < y->object ? -1 : 1;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return x->group < y->group ? -1 : x->group > y->group;
}

int ferry_manifest_validate(ferry_manifest *m, ferry_error *err)
{
    if (!m)
        return fr_fail(err, FERRY_EINVAL, "null manifest");
    size_t n = 0;
    for (size_t g = 0; g < m->ngroups; g++)
        n += m->groups[g].object >= 0;
    if (!n)
        return 0;
    bound_span *v = fr_calloc(n, sizeof *v);
    if (!v)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    n = 0;
    for (size_t gi = 0; gi < m->ngroups; gi++) {
        const fr_group *g = &m->groups[gi];
        if (g->object < 0)
            continue;
        const fr_tensor *t = &m->tensors[g->tensor];
        const uint64_t *e = G_EXT(m, g);
        /* elements from storage_offset to the last one (checked at add) */
        uint64_t span = 1;
        for (uint32_t d = 0; d < g->ndim; d++)
            span = g->has_strides ? span + (e[d] - 1) * G_STRIDES(m, g)[d] : span * e[d];
        v[n++] = (bound_span){g->object, g->object_offset + g->storage_offset * t->itemsize,
                              g->object_offset + (g->storage_offset + span) * t->itemsize, (uint32_t)gi};
    }
    qsort(v, n, sizeof *v, cmp_span);
    int rc = 0;
    for (size_t i = 1; i < n; i++) {
        if (v[i].object != v[i - 1].object)
            continue;
        const fr_group *a = &m->groups[v[i - 1].group], *b = &m->groups[v[i].group];
        char da[400], db[400];
        if (a->rank != b->rank) {
            rc = fr_fail(err, FERRY_EINVAL, "tensor '%s': %s and tensor '%s': %s are both in object '%s' "
                         "but on different ranks; an object has one home",
                         m->tensors[a->tensor].name, fr_frag_desc(m, a, 0, 0, da, sizeof da),
                         m->tensors[b->tensor].name, fr_frag_desc(m, b, 0, 0, db, sizeof db), m->objects[v[i].object]);
            break;
        }
        if (v[i].start >= v[i - 1].end)
            continue;
        rc = fr_fail(err, FERRY_EINVAL,
                     "tensor '%s': %s and tensor '%s': %s overlap in bytes [%llu, %llu) of object '%s'",
                     m->tensors[a->tensor].name, fr_frag_desc(m, a, 0, 0, da, sizeof da),
                     m->tensors[b->tensor].name, fr_frag_desc(m, b, 0, 0, db, sizeof db),
                     (unsigned long long)v[i].start,
                     (unsigned long long)(v[i].end < v[i - 1].end ? v[i].end : v[i - 1].end),
                     m->objects[v[i].object]);
        break;
    }
    fr_free(v);
    return rc;
}
