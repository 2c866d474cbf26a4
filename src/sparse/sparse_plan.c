/* The sparse planner (docs/sparse.md, "Planner"): pure — it reads only the
 * descriptor and the compact tile index (tile_coords, tile_ptr) of each
 * source, never indices or values, and touches no store.
 *
 * For 2-D sources it builds, on first use, two secondary indexes in
 * ix->aux: row groups (one per distinct tile row, its tiles sorted by tile
 * column) and column groups (one per distinct tile column, sorted by tile
 * row). A box becomes tile bounds; the direction with fewer candidate
 * groups is walked, binary-searching the other coordinate inside each
 * group: O(log R + groups x log C + K) for K tiles hit, independent of nnz.
 * Other ranks (1-D, 3-D and up) take a bounded N-D path: a binary search of
 * the first tile coordinate, then a scan of that slab, every scanned tile
 * counted in nd_fallback_tiles.
 *
 * Per-node dedup rule: each unique range is read once per node. The reads of
 * one (source, node) are the union of the ranges every pair on that node
 * needs, where ranges that share an entry are merged and ranges that only
 * touch are not — so every range of a pair lies inside exactly one read of
 * its (source, node), and the reads of one (source, node) are disjoint. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "sparse/sparse_int.h"

/* ---- secondary indexes ---------------------------------------------------------------- */

typedef struct sp_item {
    int64_t other;               /* the tile coordinate on the other axis */
    uint64_t pos;                /* tile position in tile_coords / tile_ptr */
} sp_item;

typedef struct sp_groups {
    size_t n;                    /* groups: distinct tile coordinates on this axis */
    int64_t *key;                /* n, ascending */
    size_t *first;               /* n + 1: items[first[g], first[g + 1]) */
    sp_item *items;              /* ntiles; each group's sorted by other, then pos */
} sp_groups;

typedef struct sp_aux {
    uint64_t ntiles;             /* of the index it was built for */
    uint32_t ndim;
    sp_groups rows, cols;        /* 2-D only */
} sp_aux;

static void groups_free(sp_groups *g)
{
    fr_free(g->key);
    fr_free(g->first);
    fr_free(g->items);
    memset(g, 0, sizeof *g);
}

void fr_sparse_aux_free(void *aux)
{
    sp_aux *a = aux;
    if (!a)
        return;
    groups_free(&a->rows);
    groups_free(&a->cols);
    fr_free(a);
}

/* Tiles along dimension d: ceil(shape / tile). */
static uint64_t tiles_along(const ferry_sparse_desc *d, uint32_t k)
{
    return d->shape[k] / d->tile[k] + (d->shape[k] % d->tile[k] != 0);
}

/* The index must be what sparse.h promises before the planner trusts it:
 * O(ntiles x ndim), once per index (the result is cached with the aux). */
static int check_index(const ferry_sparse_index *ix, ferry_error *err)
{
    const ferry_sparse_desc *d = &ix->desc;
    if (d->ndim < 1 || d->ndim > FERRY_SPARSE_NDIM_MAX)
        return fr_fail(err, FERRY_EPROTO, "sparse source '%s': ndim %u is not 1..%d", d->tensor_id,
                       d->ndim, FERRY_SPARSE_NDIM_MAX);
    for (uint32_t k = 0; k < d->ndim; k++)
        if (d->shape[k] == 0 || d->tile[k] == 0)
            return fr_fail(err, FERRY_EPROTO, "sparse source '%s': shape or tile %u is 0", d->tensor_id, k);
    if (d->ntiles > 0 && (!ix->tile_coords || !ix->tile_ptr))
        return fr_fail(err, FERRY_EPROTO, "sparse source '%s': no tile index", d->tensor_id);
    if (d->ntiles > d->nnz || (d->ntiles == 0) != (d->nnz == 0) || (ix->tile_ptr && (ix->tile_ptr[0] != 0 || (uint64_t)ix->tile_ptr[d->ntiles] != d->nnz)))
        return fr_fail(err, FERRY_EPROTO, "sparse source '%s': tile_ptr does not span nnz %llu",
                       d->tensor_id, (unsigned long long)d->nnz);
    for (uint64_t i = 0; i < d->ntiles; i++) {
        const int64_t *c = ix->tile_coords + i * d->ndim;
        if (ix->tile_ptr[i + 1] < ix->tile_ptr[i])
            return fr_fail(err, FERRY_EPROTO, "sparse source '%s': tile_ptr descends at tile %llu",
                           d->tensor_id, (unsigned long long)i);
        for (uint32_t k = 0; k < d->ndim; k++)
            if (c[k] < 0 || (uint64_t)c[k] >= tiles_along(d, k))
                return fr_fail(err, FERRY_EPROTO, "sparse source '%s': tile %llu lies outside the shape",
                               d->tensor_id, (unsigned long long)i);
        if (i > 0) {
            const int64_t *p = c - d->ndim;
            uint32_t k = 0;
            while (k < d->ndim && p[k] == c[k])
                k++;
            if (k == d->ndim || p[k] > c[k])
                return fr_fail(err, FERRY_EPROTO, "sparse source '%s': tile_coords not strictly ascending at %llu",
                               d->tensor_id, (unsigned long long)i);
        }
    }
    return 0;
}

typedef struct sp_key3 { int64_t key, other; uint64_t pos; } sp_key3;

static int key3_cmp(const void *a, const void *b)
{
    const sp_key3 *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->other != y->other)
        return x->other < y->other ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Groups along axis `axis` (0 rows, 1 columns) of a 2-D index. Rows come
 * sorted already (tile_coords is row-major); columns are sorted once. */
static int groups_build(const ferry_sparse_index *ix, int axis, sp_groups *g)
{
    size_t T = (size_t)ix->desc.ntiles;
    sp_key3 *k3 = fr_calloc(T ? T : 1, sizeof *k3);
    g->items = fr_calloc(T ? T : 1, sizeof *g->items);
    g->key = fr_calloc(T ? T : 1, sizeof *g->key);
    g->first = fr_calloc(T + 1, sizeof *g->first);
    if (!k3 || !g->items || !g->key || !g->first) {
        fr_free(k3);
        groups_free(g);
        return FERRY_ENOMEM;
    }
    for (size_t i = 0; i < T; i++)
        k3[i] = (sp_key3){ix->tile_coords[2 * i + axis], ix->tile_coords[2 * i + 1 - axis], i};
    if (axis == 1)
        qsort(k3, T, sizeof *k3, key3_cmp);
    g->n = 0;
    for (size_t i = 0; i < T; i++) {
        if (i == 0 || k3[i].key != k3[i - 1].key) {
            g->key[g->n] = k3[i].key;
            g->first[g->n++] = i;
        }
        g->items[i] = (sp_item){k3[i].other, k3[i].pos};
    }
    g->first[g->n] = T;
    fr_free(k3);
    return 0;
}

static int aux_get(ferry_sparse_index *ix, sp_aux **out, ferry_error *err)
{
    sp_aux *a = ix->aux;
    if (a && a->ntiles == ix->desc.ntiles && a->ndim == ix->desc.ndim) {
        *out = a;
        return 0;
    }
    int rc = check_index(ix, err);
    if (rc < 0)
        return rc;
    a = fr_calloc(1, sizeof *a);
    if (!a)
        return fr_fail(err, FERRY_ENOMEM, "sparse planner: out of memory");
    a->ntiles = ix->desc.ntiles;
    a->ndim = ix->desc.ndim;
    if (a->ndim == 2 && ((rc = groups_build(ix, 0, &a->rows)) < 0 || (rc = groups_build(ix, 1, &a->cols)) < 0)) {
        fr_sparse_aux_free(a);
        return fr_fail(err, rc, "sparse planner: out of memory building the secondary indexes");
    }
    fr_sparse_aux_free(ix->aux);
    ix->aux = a;
    *out = a;
    return 0;
}

/* ---- selection ------------------------------------------------------------------------ */

typedef struct sp_hit { uint64_t pos; bool boundary; } sp_hit;

typedef struct sp_query {
    const ferry_sparse_index *ix;
    uint64_t lo[FERRY_SPARSE_NDIM_MAX], hi[FERRY_SPARSE_NDIM_MAX];     /* element box, hi exclusive */
    int64_t tlo[FERRY_SPARSE_NDIM_MAX], thi[FERRY_SPARSE_NDIM_MAX];    /* tile box, inclusive */
    sp_hit *hits, *tmp;          /* tmp: merge scratch */
    size_t nhits, cap, tmpcap;
    size_t *runs;                /* starts of the ascending runs hits arrived in */
    size_t nruns, runcap;
    ferry_sparse_plan_stats *st;
} sp_query;

/* Whether the tile at pos lies wholly inside the box (its last tile along a
 * dimension ends at the shape, not at a tile multiple). */
static bool tile_inside(const sp_query *q, uint64_t pos)
{
    const ferry_sparse_desc *d = &q->ix->desc;
    const int64_t *c = q->ix->tile_coords + pos * d->ndim;
    for (uint32_t k = 0; k < d->ndim; k++) {
        uint64_t b = (uint64_t)c[k] * d->tile[k];
        uint64_t e = d->shape[k] - b > d->tile[k] ? b + d->tile[k] : d->shape[k];
        if (b < q->lo[k] || e > q->hi[k])
            return false;
    }
    return true;
}

static int emit(sp_query *q, uint64_t pos)
{
    if (q->ix->tile_ptr[pos + 1] == q->ix->tile_ptr[pos])
        return 0;
    if (fr_grow((void **)&q->hits, &q->cap, q->nhits + 1, sizeof *q->hits) < 0)
        return FERRY_ENOMEM;
    q->hits[q->nhits++] = (sp_hit){pos, !tile_inside(q, pos)};
    q->st->tiles_hit++;
    return 0;
}

static int push_run(sp_query *q)
{
    if (fr_grow((void **)&q->runs, &q->runcap, q->nruns + 1, sizeof *q->runs) < 0)
        return FERRY_ENOMEM;
    q->runs[q->nruns++] = q->nhits;
    return 0;
}

/* Hits into ascending position by merging the runs pairwise: O(K log G)
 * for K hits in G runs (the column path; the row and N-D paths make one). */
static int merge_runs(sp_query *q)
{
    if (q->nruns <= 1 || q->nhits <= 1)
        return 0;
    if (fr_grow((void **)&q->tmp, &q->tmpcap, q->nhits, sizeof *q->tmp) < 0)
        return FERRY_ENOMEM;
    while (q->nruns > 1) {
        size_t w = 0;
        for (size_t i = 0; i < q->nruns; i += 2) {
            size_t a = q->runs[i], m = i + 1 < q->nruns ? q->runs[i + 1] : q->nhits;
            size_t e = i + 2 < q->nruns ? q->runs[i + 2] : q->nhits, x = a, y = m, k = a;
            while (x < m && y < e)
                q->tmp[k++] = q->hits[x].pos <= q->hits[y].pos ? q->hits[x++] : q->hits[y++];
            while (x < m)
                q->tmp[k++] = q->hits[x++];
            while (y < e)
                q->tmp[k++] = q->hits[y++];
            q->runs[w++] = a;
        }
        q->nruns = w;
        sp_hit *h = q->hits;
        size_t c = q->cap;
        q->hits = q->tmp;
        q->cap = q->tmpcap;
        q->tmp = h;
        q->tmpcap = c;
    }
    return 0;
}

/* First index in v[0, n) (stride s) whose value is >= x, or > x when upper. */
static size_t bound64(const int64_t *v, size_t n, size_t s, int64_t x, bool upper)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid * s] < x || (upper && v[mid * s] == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static size_t bound_items(const sp_item *v, size_t n, int64_t x, bool upper)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid].other < x || (upper && v[mid].other == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int select_2d(sp_query *q, const sp_aux *a)
{
    size_t rlo = bound64(a->rows.key, a->rows.n, 1, q->tlo[0], false);
    size_t rhi = bound64(a->rows.key, a->rows.n, 1, q->thi[0], true);
    size_t clo = bound64(a->cols.key, a->cols.n, 1, q->tlo[1], false);
    size_t chi = bound64(a->cols.key, a->cols.n, 1, q->thi[1], true);
    /* Ties go to rows: their positions ascend, so no sort is needed after. */
    bool by_rows = rhi - rlo <= chi - clo;
    const sp_groups *g = by_rows ? &a->rows : &a->cols;
    size_t glo = by_rows ? rlo : clo, ghi = by_rows ? rhi : chi;
    int o = by_rows ? 1 : 0;
    for (size_t i = glo; i < ghi; i++) {
        /* A column group's tiles ascend in position: one run each. */
        if ((!by_rows || i == glo) && push_run(q) < 0)
            return FERRY_ENOMEM;
        const sp_item *it = g->items + g->first[i];
        size_t n = g->first[i + 1] - g->first[i];
        size_t lo = bound_items(it, n, q->tlo[o], false), hi = bound_items(it, n, q->thi[o], true);
        q->st->groups_visited++;
        for (size_t j = lo; j < hi; j++)
            if (emit(q, it[j].pos) < 0)
                return FERRY_ENOMEM;
    }
    return 0;
}

/* Tiles are in lexicographic order, so the first coordinate bounds a slab;
 * the slab is scanned and counted. */
static int select_nd(sp_query *q)
{
    const ferry_sparse_desc *d = &q->ix->desc;
    const int64_t *c = q->ix->tile_coords;
    size_t T = (size_t)d->ntiles;
    size_t lo = bound64(c, T, d->ndim, q->tlo[0], false), hi = bound64(c, T, d->ndim, q->thi[0], true);
    if (push_run(q) < 0)
        return FERRY_ENOMEM;
    for (size_t i = lo; i < hi; i++) {
        const int64_t *t = c + i * d->ndim;
        uint32_t k = 1;
        while (k < d->ndim && t[k] >= q->tlo[k] && t[k] <= q->thi[k])
            k++;
        q->st->nd_fallback_tiles++;
        if (k == d->ndim && emit(q, i) < 0)
            return FERRY_ENOMEM;
    }
    return 0;
}

/* ---- the batch ------------------------------------------------------------------------ */

typedef struct sp_out {
    ferry_sparse_plan *p;
    size_t pcap, rcap;
} sp_out;

/* Hits become ranges of the plan: ascending, adjacent tiles coalesced (a
 * coalesced range is boundary if any of its tiles is). */
static int add_ranges(sp_out *o, sp_query *q, size_t *n)
{
    if (merge_runs(q) < 0)
        return FERRY_ENOMEM;
    const int64_t *ptr = q->ix->tile_ptr;
    ferry_sparse_plan *p = o->p;
    size_t first = p->nranges;
    for (size_t i = 0; i < q->nhits; i++) {
        uint64_t s = (uint64_t)ptr[q->hits[i].pos], e = (uint64_t)ptr[q->hits[i].pos + 1];
        if (p->nranges > first && p->ranges[p->nranges - 1].end == s) {
            p->ranges[p->nranges - 1].end = e;
            p->ranges[p->nranges - 1].boundary |= q->hits[i].boundary;
            continue;
        }
        if (fr_grow((void **)&p->ranges, &o->rcap, p->nranges + 1, sizeof *p->ranges) < 0)
            return FERRY_ENOMEM;
        p->ranges[p->nranges++] = (ferry_sparse_range){s, e, q->hits[i].boundary};
    }
    p->stats.ranges_coalesced_from += q->nhits;
    *n = p->nranges - first;
    return 0;
}

static int check_target(const ferry_sparse_index *ix, const ferry_sparse_target *t, size_t ti, ferry_error *err)
{
    const ferry_sparse_desc *d = &ix->desc;
    if (t->ndim != d->ndim)
        return fr_fail(err, FERRY_EINVAL, "sparse target %zu of '%s': ndim %u, the tensor has %u", ti,
                       d->tensor_id, t->ndim, d->ndim);
    for (uint32_t k = 0; k < d->ndim; k++)
        if (t->shape[k] == 0 || t->offset[k] > d->shape[k] || t->shape[k] > d->shape[k] - t->offset[k])
            return fr_fail(err, FERRY_EINVAL,
                           "sparse target %zu of '%s': box dim %u [%llu, +%llu) is empty or outside the tensor (%llu)",
                           ti, d->tensor_id, k, (unsigned long long)t->offset[k],
                           (unsigned long long)t->shape[k], (unsigned long long)d->shape[k]);
    return 0;
}

static int plan_pair(sp_out *o, sp_query *q, ferry_sparse_index *ix, uint32_t si, const ferry_sparse_target *t,
                     uint32_t ti, ferry_error *err)
{
    sp_aux *a = NULL;
    int rc = aux_get(ix, &a, err);
    if (rc < 0)
        return rc;
    const ferry_sparse_desc *d = &ix->desc;
    q->ix = ix;
    q->nhits = 0;
    q->nruns = 0;
    /* The source box is the whole tensor and the target box lies inside it,
     * so the overlap is the target box. */
    for (uint32_t k = 0; k < d->ndim; k++) {
        q->lo[k] = t->offset[k];
        q->hi[k] = t->offset[k] + t->shape[k];
        q->tlo[k] = (int64_t)(q->lo[k] / d->tile[k]);
        q->thi[k] = (int64_t)((q->hi[k] - 1) / d->tile[k]);
    }
    rc = d->ntiles == 0 ? 0 : d->ndim == 2 ? select_2d(q, a) : select_nd(q);
    ferry_sparse_plan *p = o->p;
    size_t first = p->nranges, n = 0;
    if (rc == 0)
        rc = add_ranges(o, q, &n);
    if (rc == 0)
        rc = fr_grow((void **)&p->pairs, &o->pcap, p->npairs + 1, sizeof *p->pairs);
    if (rc < 0)
        return fr_fail(err, rc, "sparse planner: out of memory");
    p->pairs[p->npairs++] = (ferry_sparse_pair){si, ti, first, n};
    return 0;
}

typedef struct sp_req { uint32_t source, node; uint64_t start, end; } sp_req;

static int req_cmp(const void *a, const void *b)
{
    const sp_req *x = a, *y = b;
    if (x->source != y->source)
        return x->source < y->source ? -1 : 1;
    if (x->node != y->node)
        return x->node < y->node ? -1 : 1;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Reads: per (source, node), the union of the ranges its pairs need, merging
 * ranges that share an entry (not ones that only touch). */
static int dedup(ferry_sparse_plan *p, const ferry_sparse_target *targets)
{
    if (p->nranges == 0)
        return 0;
    sp_req *r = fr_calloc(p->nranges, sizeof *r);
    p->reads = fr_calloc(p->nranges, sizeof *p->reads);
    if (!r || !p->reads) {
        fr_free(r);
        return FERRY_ENOMEM;
    }
    size_t m = 0;
    for (size_t i = 0; i < p->npairs; i++)
        for (size_t j = 0; j < p->pairs[i].n; j++) {
            const ferry_sparse_range *g = &p->ranges[p->pairs[i].first + j];
            r[m++] = (sp_req){p->pairs[i].source, targets[p->pairs[i].target].node, g->start, g->end};
        }
    qsort(r, m, sizeof *r, req_cmp);
    for (size_t i = 0; i < m; i++) {
        ferry_sparse_read *last = p->nreads ? &p->reads[p->nreads - 1] : NULL;
        if (last && last->source == r[i].source && last->node == r[i].node && r[i].start < last->end) {
            last->end = r[i].end > last->end ? r[i].end : last->end;
            continue;
        }
        p->reads[p->nreads++] = (ferry_sparse_read){r[i].source, r[i].node, r[i].start, r[i].end};
    }
    fr_free(r);
    p->stats.unique_reads = p->nreads;
    p->stats.dedup_hits = m - p->nreads;
    return 0;
}

int ferry_sparse_plan_batch(ferry_sparse_index *const *sources, size_t nsources,
                            const ferry_sparse_target *targets, size_t ntargets,
                            ferry_sparse_plan *out, ferry_error *err)
{
    if (!out || (nsources && !sources) || (ntargets && !targets))
        return fr_fail(err, FERRY_EINVAL, "sparse planner: NULL sources, targets or out");
    if (nsources > UINT32_MAX || ntargets > UINT32_MAX)
        return fr_fail(err, FERRY_EINVAL, "sparse planner: more than 2^32 sources or targets");
    memset(out, 0, sizeof *out);
    uint64_t t0 = fr_now_ns();
    sp_out o = {.p = out};
    sp_query q = {.st = &out->stats};
    int rc = 0;
    for (size_t s = 0; s < nsources; s++)
        if (!sources[s]) {
            rc = fr_fail(err, FERRY_EINVAL, "sparse planner: source %zu is NULL", s);
            goto fail;
        }
    for (size_t ti = 0; ti < ntargets; ti++) {
        const ferry_sparse_target *t = &targets[ti];
        for (size_t si = 0; si < nsources; si++) {
            ferry_sparse_index *ix = sources[si];
            if (strncmp(ix->desc.tensor_id, t->tensor_id, sizeof t->tensor_id) != 0)
                continue;
            if ((rc = check_target(ix, t, ti, err)) < 0)
                goto fail;
            if (ix->desc.placement.kind == FERRY_SPARSE_OWNER && t->axis_index != ix->desc.placement.owner) {
                out->stats.filtered_out++;
                continue;
            }
            if ((rc = plan_pair(&o, &q, ix, (uint32_t)si, t, (uint32_t)ti, err)) < 0)
                goto fail;
        }
    }
    if ((rc = dedup(out, targets)) < 0) {
        fr_fail(err, rc, "sparse planner: out of memory");
        goto fail;
    }
    fr_free(q.hits);
    fr_free(q.tmp);
    fr_free(q.runs);
    out->stats.pairs = out->npairs;
    out->stats.ranges = out->nranges;
    out->stats.plan_s = (double)(fr_now_ns() - t0) / 1e9;
    return 0;
fail:
    fr_free(q.hits);
    fr_free(q.tmp);
    fr_free(q.runs);
    ferry_sparse_plan_free(out);
    return rc;
}

void ferry_sparse_plan_free(ferry_sparse_plan *p)
{
    if (!p)
        return;
    fr_free(p->pairs);
    fr_free(p->ranges);
    fr_free(p->reads);
    memset(p, 0, sizeof *p);
}
