/* The sparse planner, pure: indexes built in memory from random COO entries
 * (sorted and tiled the way sparse.h describes), planned, and checked
 * against a brute-force oracle over every entry; the 2-D direction choice,
 * the N-D path, placement filtering, per-node dedup (the RFC's EP2xTP2
 * acceptance case) and work counters that do not grow with nnz. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/reshard.h"
#include "ferry/sparse.h"
#include "sparse/sparse_int.h"

/* ---- an in-memory index ----------------------------------------------------------------- */

typedef struct entry {
    uint64_t tc[FERRY_SPARSE_NDIM_MAX], ec[FERRY_SPARSE_NDIM_MAX];
} entry;

typedef struct tix {
    ferry_sparse_index ix;
    entry *e;                    /* nnz, in object order */
} tix;

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static uint64_t rnd_in(uint64_t lo, uint64_t hi) /* inclusive */
{
    return lo + rnd() % (hi - lo + 1);
}

static int entry_cmp(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    for (int k = 0; k < FERRY_SPARSE_NDIM_MAX; k++)
        if (x->tc[k] != y->tc[k])
            return x->tc[k] < y->tc[k] ? -1 : 1;
    for (int k = 0; k < FERRY_SPARSE_NDIM_MAX; k++)
        if (x->ec[k] != y->ec[k])
            return x->ec[k] < y->ec[k] ? -1 : 1;
    return 0;
}

/* Entries are given (coords, nnz x ndim) or drawn at random (coords NULL):
 * sorted by (tile coordinate, element coordinate), duplicates dropped, then
 * tile_coords / tile_ptr built. */
static void tix_build(tix *t, const char *id, uint32_t ndim, const uint64_t *shape, const uint64_t *tile,
                      uint64_t nnz, const uint64_t *coords)
{
    memset(t, 0, sizeof *t);
    ferry_sparse_desc *d = &t->ix.desc;
    snprintf(d->tensor_id, sizeof d->tensor_id, "%s", id);
    d->ndim = ndim;
    d->base_generation = 1;
    d->delta_generation = 2;
    snprintf(d->index_dtype, sizeof d->index_dtype, "i32");
    snprintf(d->value_dtype, sizeof d->value_dtype, "f32");
    for (uint32_t k = 0; k < ndim; k++) {
        d->shape[k] = shape[k];
        d->tile[k] = tile[k];
    }
    t->e = calloc(nnz ? nnz : 1, sizeof *t->e);
    assert_non_null(t->e);
    for (uint64_t i = 0; i < nnz; i++)
        for (uint32_t k = 0; k < ndim; k++) {
            uint64_t c = coords ? coords[i * ndim + k] : rnd() % shape[k];
            t->e[i].ec[k] = c;
            t->e[i].tc[k] = c / tile[k];
        }
    qsort(t->e, nnz, sizeof *t->e, entry_cmp);
    uint64_t n = 0;
    for (uint64_t i = 0; i < nnz; i++)
        if (n == 0 || entry_cmp(&t->e[n - 1], &t->e[i]) != 0)
            t->e[n++] = t->e[i];
    d->nnz = n;
    t->ix.tile_coords = calloc(n * ndim + 1, sizeof(int64_t));
    t->ix.tile_ptr = calloc(n + 2, sizeof(int64_t));
    assert_non_null(t->ix.tile_coords);
    assert_non_null(t->ix.tile_ptr);
    uint64_t T = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i == 0 || memcmp(t->e[i].tc, t->e[i - 1].tc, sizeof t->e[i].tc) != 0) {
            for (uint32_t k = 0; k < ndim; k++)
                t->ix.tile_coords[T * ndim + k] = (int64_t)t->e[i].tc[k];
            t->ix.tile_ptr[T++] = (int64_t)i;
        }
    }
    t->ix.tile_ptr[T] = (int64_t)n;
    d->ntiles = T;
}

/* Dense entries: every coordinate of the shape. */
static void tix_dense(tix *t, const char *id, uint32_t ndim, const uint64_t *shape, const uint64_t *tile)
{
    uint64_t numel = 1;
    for (uint32_t k = 0; k < ndim; k++)
        numel *= shape[k];
    uint64_t *c = calloc(numel * ndim, sizeof *c);
    assert_non_null(c);
    for (uint64_t i = 0; i < numel; i++) {
        uint64_t r = i;
        for (uint32_t k = ndim; k-- > 0;) {
            c[i * ndim + k] = r % shape[k];
            r /= shape[k];
        }
    }
    tix_build(t, id, ndim, shape, tile, numel, c);
    free(c);
}

static void tix_free(tix *t)
{
    fr_sparse_aux_free(t->ix.aux);
    free(t->ix.tile_coords);
    free(t->ix.tile_ptr);
    free(t->e);
    memset(t, 0, sizeof *t);
}

static ferry_sparse_target target(const char *id, uint32_t node, uint32_t axis, uint32_t ndim, const uint64_t *off,
                                  const uint64_t *shape)
{
    ferry_sparse_target t = {.node = node, .axis_index = axis, .ndim = ndim};
    snprintf(t.tensor_id, sizeof t.tensor_id, "%s", id);
    for (uint32_t k = 0; k < ndim; k++) {
        t.offset[k] = off[k];
        t.shape[k] = shape[k];
    }
    return t;
}

static void random_box(const ferry_sparse_desc *d, uint64_t *off, uint64_t *shape)
{
    for (uint32_t k = 0; k < d->ndim; k++) {
        uint64_t a = rnd() % d->shape[k], b = rnd() % d->shape[k];
        if (rnd() % 4 == 0) { /* often a whole dimension, like a TP split of the other one */
            a = 0;
            b = d->shape[k] - 1;
        }
        off[k] = a < b ? a : b;
        shape[k] = (a < b ? b - a : a - b) + 1;
    }
}

static ferry_sparse_plan plan(tix **src, size_t ns, const ferry_sparse_target *t, size_t nt)
{
    ferry_sparse_index *ix[16];
    assert_true(ns <= 16);
    for (size_t i = 0; i < ns; i++)
        ix[i] = &src[i]->ix;
    ferry_sparse_plan p;
    ferry_error err = {0};
    if (ferry_sparse_plan_batch(ix, ns, t, nt, &p, &err) < 0)
        fail_msg("plan: %s", err.msg);
    return p;
}

/* ---- the oracle ---------------------------------------------------------------------- */

static bool inside(const entry *e, const ferry_sparse_target *t)
{
    for (uint32_t k = 0; k < t->ndim; k++)
        if (e->ec[k] < t->offset[k] || e->ec[k] >= t->offset[k] + t->shape[k])
            return false;
    return true;
}

/* The entries a pair's ranges keep (every entry of a non-boundary range, the
 * entries inside the box of a boundary one) are exactly the entries inside
 * the box; ranges are ascending and coalesced; each lies inside exactly one
 * read of its (source, node). */
static void check_pair(const tix *s, const ferry_sparse_target *t, const ferry_sparse_plan *p,
                       const ferry_sparse_pair *pr)
{
    uint64_t nnz = s->ix.desc.nnz;
    uint8_t *kept = calloc(nnz ? nnz : 1, 1);
    assert_non_null(kept);
    for (size_t j = 0; j < pr->n; j++) {
        const ferry_sparse_range *r = &p->ranges[pr->first + j];
        assert_true(r->start < r->end && r->end <= nnz);
        if (j > 0)
            assert_true(p->ranges[pr->first + j - 1].end < r->start);
        for (uint64_t e = r->start; e < r->end; e++) {
            bool in = inside(&s->e[e], t);
            if (!r->boundary)
                assert_true(in);
            if (in)
                kept[e] = 1;
        }
        size_t found = 0;
        for (size_t k = 0; k < p->nreads; k++) {
            const ferry_sparse_read *rd = &p->reads[k];
            if (rd->source == pr->source && rd->node == t->node && rd->start <= r->start && r->end <= rd->end)
                found++;
        }
        assert_int_equal(found, 1);
    }
    for (uint64_t e = 0; e < nnz; e++)
        assert_int_equal(kept[e], inside(&s->e[e], t));
    free(kept);
}

/* Reads of one (source, node) are disjoint and sorted; every read is used. */
static void check_reads(const ferry_sparse_plan *p)
{
    for (size_t k = 1; k < p->nreads; k++) {
        const ferry_sparse_read *a = &p->reads[k - 1], *b = &p->reads[k];
        assert_true(a->source < b->source || (a->source == b->source && a->node < b->node) ||
                    (a->source == b->source && a->node == b->node && a->end <= b->start));
    }
    assert_int_equal(p->stats.unique_reads, p->nreads);
    assert_int_equal(p->stats.ranges, p->nranges);
    assert_int_equal(p->stats.pairs, p->npairs);
    assert_int_equal(p->stats.dedup_hits, p->nranges - p->nreads);
}

/* Candidate groups of a 2-D box, by brute force: distinct tile rows (or
 * columns) in the box's tile bounds among the tiles present. */
static uint64_t candidate_groups(const tix *s, const ferry_sparse_target *t, int axis)
{
    const ferry_sparse_desc *d = &s->ix.desc;
    uint64_t lo = t->offset[axis] / d->tile[axis], hi = (t->offset[axis] + t->shape[axis] - 1) / d->tile[axis];
    uint8_t *seen = calloc(d->shape[axis] / d->tile[axis] + 2, 1);
    uint64_t n = 0;
    for (uint64_t i = 0; i < d->ntiles; i++) {
        uint64_t c = (uint64_t)s->ix.tile_coords[i * 2 + axis];
        if (c >= lo && c <= hi && !seen[c]) {
            seen[c] = 1;
            n++;
        }
    }
    free(seen);
    return n;
}

/* ---- tests --------------------------------------------------------------------------- */

static void random_case(uint32_t ndim, bool check_direction)
{
    uint64_t shape[FERRY_SPARSE_NDIM_MAX], tile[FERRY_SPARSE_NDIM_MAX], numel = 1;
    for (uint32_t k = 0; k < ndim; k++) {
        shape[k] = rnd_in(1, ndim <= 2 ? 300 : 40);
        tile[k] = rnd_in(1, ndim <= 2 ? 64 : 12);
        numel *= shape[k];
    }
    static const double dens[] = {0.001, 0.01, 0.1, 0.5};
    uint64_t nnz = (uint64_t)(dens[rnd() % 4] * (double)numel) + 1;
    tix s;
    tix_build(&s, "w", ndim, shape, tile, nnz, NULL);
    ferry_sparse_target t[6];
    size_t nt = 1 + rnd() % 6;
    for (size_t i = 0; i < nt; i++) {
        uint64_t off[FERRY_SPARSE_NDIM_MAX], bs[FERRY_SPARSE_NDIM_MAX];
        random_box(&s.ix.desc, off, bs);
        t[i] = target("w", (uint32_t)(rnd() % 3), (uint32_t)i, ndim, off, bs);
    }
    tix *src[] = {&s};
    ferry_sparse_plan p = plan(src, 1, t, nt);
    assert_int_equal(p.npairs, nt);
    for (size_t i = 0; i < p.npairs; i++) {
        assert_int_equal(p.pairs[i].target, i);
        check_pair(&s, &t[p.pairs[i].target], &p, &p.pairs[i]);
    }
    check_reads(&p);
    if (ndim == 2) {
        assert_int_equal(p.stats.nd_fallback_tiles, 0);
    } else {
        assert_int_equal(p.stats.groups_visited, 0);
        assert_true(p.stats.nd_fallback_tiles <= s.ix.desc.ntiles * nt);
        assert_true(p.stats.nd_fallback_tiles >= p.stats.tiles_hit);
    }
    assert_int_equal(p.stats.ranges_coalesced_from, p.stats.tiles_hit);
    ferry_sparse_plan_free(&p);
    if (check_direction) {
        /* One box alone: the planner walks the direction with fewer groups. */
        p = plan(src, 1, t, 1);
        uint64_t r = candidate_groups(&s, &t[0], 0), c = candidate_groups(&s, &t[0], 1);
        assert_int_equal(p.stats.groups_visited, r < c ? r : c);
        ferry_sparse_plan_free(&p);
    }
    tix_free(&s);
}

static void test_random_2d(void **state)
{
    (void)state;
    for (int i = 0; i < 300; i++)
        random_case(2, true);
}

static void test_random_nd(void **state)
{
    (void)state;
    for (int i = 0; i < 100; i++)
        random_case(1, false);
    for (int i = 0; i < 100; i++)
        random_case(3, false);
    for (int i = 0; i < 30; i++)
        random_case(4, false);
}

/* Row boxes walk row groups, column boxes column groups: one group each on
 * a 32 x 32 tile grid, and both correct. */
static void test_direction(void **state)
{
    (void)state;
    uint64_t shape[] = {1024, 1024}, tile[] = {32, 32};
    tix s;
    tix_build(&s, "w", 2, shape, tile, 200000, NULL);
    assert_int_equal(s.ix.desc.ntiles, 1024);
    tix *src[] = {&s};
    ferry_sparse_target row = target("w", 0, 0, 2, (uint64_t[]){64, 0}, (uint64_t[]){32, 1024});
    ferry_sparse_target col = target("w", 0, 0, 2, (uint64_t[]){0, 96}, (uint64_t[]){1024, 32});
    ferry_sparse_plan p = plan(src, 1, &row, 1);
    assert_int_equal(p.stats.groups_visited, 1);
    assert_int_equal(p.stats.tiles_hit, 32);
    assert_int_equal(p.nranges, 1); /* one tile row is one contiguous range */
    assert_false(p.ranges[0].boundary);
    check_pair(&s, &row, &p, &p.pairs[0]);
    ferry_sparse_plan_free(&p);
    p = plan(src, 1, &col, 1);
    assert_int_equal(p.stats.groups_visited, 1);
    assert_int_equal(p.stats.tiles_hit, 32);
    assert_int_equal(p.nranges, 32); /* one tile per tile row, none adjacent */
    check_pair(&s, &col, &p, &p.pairs[0]);
    ferry_sparse_plan_free(&p);
    /* A box off the tile grid: boundary ranges, still exact. */
    ferry_sparse_target odd = target("w", 0, 0, 2, (uint64_t[]){70, 100}, (uint64_t[]){50, 900});
    p = plan(src, 1, &odd, 1);
    assert_int_equal(p.stats.groups_visited, 2);
    check_pair(&s, &odd, &p, &p.pairs[0]);
    ferry_sparse_plan_free(&p);
    tix_free(&s);
}

/* The work counters depend on the tiles hit, not on nnz. */
static void test_work_not_nnz(void **state)
{
    (void)state;
    uint64_t shape[] = {2048, 7168}, tile[] = {128, 128};
    uint64_t tiles = 0, groups = 0;
    for (int i = 0; i < 3; i++) {
        tix s;
        tix_build(&s, "w", 2, shape, tile, (uint64_t[]){20000, 100000, 400000}[i], NULL);
        assert_int_equal(s.ix.desc.ntiles, 16 * 56);
        tix *src[] = {&s};
        ferry_sparse_target t = target("w", 0, 0, 2, (uint64_t[]){0, 896}, (uint64_t[]){2048, 896});
        ferry_sparse_plan p = plan(src, 1, &t, 1);
        if (i == 0) {
            tiles = p.stats.tiles_hit;
            groups = p.stats.groups_visited;
        }
        assert_int_equal(p.stats.tiles_hit, tiles);
        assert_int_equal(p.stats.groups_visited, groups);
        assert_int_equal(p.stats.nd_fallback_tiles, 0);
        ferry_sparse_plan_free(&p);
        tix_free(&s);
    }
    assert_int_equal(tiles, 16 * 7);
    assert_int_equal(groups, 7);
}

static void test_placement(void **state)
{
    (void)state;
    uint64_t shape[] = {64, 64}, tile[] = {16, 16};
    tix e0, e1, rep;
    tix_build(&e0, "x", 2, shape, tile, 500, NULL);
    tix_build(&e1, "x", 2, shape, tile, 500, NULL);
    tix_build(&rep, "r", 2, shape, tile, 500, NULL);
    e0.ix.desc.placement = (ferry_sparse_placement){FERRY_SPARSE_OWNER, "ep", 0};
    e1.ix.desc.placement = (ferry_sparse_placement){FERRY_SPARSE_OWNER, "ep", 1};
    rep.ix.desc.placement = (ferry_sparse_placement){FERRY_SPARSE_REPLICATE, "ep", 0};
    ferry_sparse_target t[8];
    for (uint32_t i = 0; i < 4; i++) {
        t[i] = target("x", 0, i, 2, (uint64_t[]){0, 0}, shape);
        t[4 + i] = target("r", 0, i, 2, (uint64_t[]){0, 0}, shape);
    }
    tix *src[] = {&e0, &e1, &rep};
    ferry_sparse_plan p = plan(src, 3, t, 8);
    /* x: ep0 <- source 0, ep1 <- source 1, the other six pairs filtered; r: all four */
    assert_int_equal(p.npairs, 6);
    assert_int_equal(p.stats.filtered_out, 6);
    assert_int_equal(p.pairs[0].source, 0);
    assert_int_equal(p.pairs[0].target, 0);
    assert_int_equal(p.pairs[1].source, 1);
    assert_int_equal(p.pairs[1].target, 1);
    for (size_t i = 2; i < 6; i++) {
        assert_int_equal(p.pairs[i].source, 2);
        assert_int_equal(p.pairs[i].target, 4 + i - 2);
    }
    check_pair(&e0, &t[0], &p, &p.pairs[0]);
    check_pair(&e1, &t[1], &p, &p.pairs[1]);
    /* r: four targets on one node read the whole object once */
    assert_int_equal(p.nreads, 3);
    check_reads(&p);
    ferry_sparse_plan_free(&p);
    tix_free(&e0);
    tix_free(&e1);
    tix_free(&rep);
}

/* RFC acceptance: a non-EP weight, targets EP2 x TP2 on one node: two
 * unique reads (the TP ranges), four pairs, two ranges served by a read
 * another target needed. On two nodes (one per EP): four reads, no dedup. */
static void test_acceptance_ep2tp2(void **state)
{
    (void)state;
    uint64_t shape[] = {512, 256}, tile[] = {64, 64};
    tix s;
    tix_build(&s, "shared", 2, shape, tile, 8000, NULL);
    s.ix.desc.placement = (ferry_sparse_placement){FERRY_SPARSE_REPLICATE, "ep", 0};
    tix *src[] = {&s};
    for (uint32_t nodes = 1; nodes <= 2; nodes++) {
        ferry_sparse_target t[4];
        for (uint32_t ep = 0; ep < 2; ep++)
            for (uint32_t tp = 0; tp < 2; tp++)
                t[ep * 2 + tp] = target("shared", nodes == 1 ? 0 : ep, ep, 2, (uint64_t[]){tp * 256, 0},
                                        (uint64_t[]){256, 256});
        ferry_sparse_plan p = plan(src, 1, t, 4);
        assert_int_equal(p.npairs, 4);
        assert_int_equal(p.nranges, 4);
        assert_int_equal(p.stats.filtered_out, 0);
        assert_int_equal(p.stats.unique_reads, nodes == 1 ? 2 : 4);
        assert_int_equal(p.stats.dedup_hits, nodes == 1 ? 2 : 0);
        for (size_t i = 0; i < 4; i++)
            check_pair(&s, &t[p.pairs[i].target], &p, &p.pairs[i]);
        check_reads(&p);
        ferry_sparse_plan_free(&p);
    }
    tix_free(&s);
}

/* Partial overlaps on one node: ranges sharing entries become one read,
 * ranges that only touch stay apart. */
static void test_partial_overlap(void **state)
{
    (void)state;
    uint64_t shape[] = {1000}, tile[] = {10};
    tix s;
    tix_dense(&s, "v", 1, shape, tile);
    tix *src[] = {&s};
    ferry_sparse_target t[3] = {
        target("v", 0, 0, 1, (uint64_t[]){0}, (uint64_t[]){500}),
        target("v", 0, 0, 1, (uint64_t[]){500}, (uint64_t[]){500}),
        target("v", 0, 0, 1, (uint64_t[]){250}, (uint64_t[]){500}),
    };
    ferry_sparse_plan p = plan(src, 1, t, 2);
    assert_int_equal(p.nreads, 2);  /* [0,500) and [500,1000) touch */
    assert_int_equal(p.stats.dedup_hits, 0);
    ferry_sparse_plan_free(&p);
    p = plan(src, 1, t, 3);
    assert_int_equal(p.nreads, 1);  /* [250,750) bridges them */
    assert_int_equal(p.reads[0].start, 0);
    assert_int_equal(p.reads[0].end, 1000);
    assert_int_equal(p.stats.dedup_hits, 2);
    for (size_t i = 0; i < 3; i++)
        check_pair(&s, &t[i], &p, &p.pairs[i]);
    ferry_sparse_plan_free(&p);
    /* Off the tile grid: the shared boundary tile joins the two reads. */
    t[0].shape[0] = 505;
    p = plan(src, 1, t, 2);
    assert_int_equal(p.nreads, 1);
    assert_true(p.ranges[0].boundary);
    assert_int_equal(p.ranges[0].end, 510);
    check_pair(&s, &t[0], &p, &p.pairs[0]);
    check_pair(&s, &t[1], &p, &p.pairs[1]);
    ferry_sparse_plan_free(&p);
    tix_free(&s);
}

/* The secondary indexes are built once and kept in aux. */
static void test_aux_reused(void **state)
{
    (void)state;
    uint64_t shape[] = {256, 256}, tile[] = {32, 32};
    tix s;
    tix_build(&s, "w", 2, shape, tile, 3000, NULL);
    tix *src[] = {&s};
    ferry_sparse_target t = target("w", 0, 0, 2, (uint64_t[]){10, 20}, (uint64_t[]){100, 200});
    ferry_sparse_plan p = plan(src, 1, &t, 1);
    void *aux = s.ix.aux;
    assert_non_null(aux);
    ferry_sparse_plan_free(&p);
    p = plan(src, 1, &t, 1);
    assert_ptr_equal(s.ix.aux, aux);
    check_pair(&s, &t, &p, &p.pairs[0]);
    ferry_sparse_plan_free(&p);
    ferry_sparse_plan_free(NULL);
    fr_sparse_aux_free(NULL);
    tix_free(&s);
}

static void test_bad_input(void **state)
{
    (void)state;
    uint64_t shape[] = {64, 64}, tile[] = {16, 16};
    tix s;
    tix_build(&s, "w", 2, shape, tile, 300, NULL);
    ferry_sparse_index *ix[] = {&s.ix};
    ferry_sparse_plan p;
    ferry_error err = {0};
    ferry_sparse_target t = target("w", 0, 0, 2, (uint64_t[]){32, 0}, (uint64_t[]){33, 64});
    assert_int_equal(ferry_sparse_plan_batch(ix, 1, &t, 1, &p, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "outside"));
    assert_null(p.pairs);
    t = target("w", 0, 0, 2, (uint64_t[]){0, 0}, (uint64_t[]){0, 64});
    assert_int_equal(ferry_sparse_plan_batch(ix, 1, &t, 1, &p, &err), FERRY_EINVAL);
    t = target("w", 0, 0, 1, (uint64_t[]){0}, (uint64_t[]){64});
    assert_int_equal(ferry_sparse_plan_batch(ix, 1, &t, 1, &p, &err), FERRY_EINVAL);
    t = target("w", 0, 0, 2, (uint64_t[]){UINT64_MAX, 0}, (uint64_t[]){2, 64});
    assert_int_equal(ferry_sparse_plan_batch(ix, 1, &t, 1, &p, &err), FERRY_EINVAL);
    assert_int_equal(ferry_sparse_plan_batch(NULL, 1, &t, 1, &p, &err), FERRY_EINVAL);
    /* A target of another tensor pairs with nothing. */
    t = target("other", 0, 0, 2, (uint64_t[]){0, 0}, (uint64_t[]){64, 64});
    assert_int_equal(ferry_sparse_plan_batch(ix, 1, &t, 1, &p, &err), 0);
    assert_int_equal(p.npairs, 0);
    assert_int_equal(p.nreads, 0);
    ferry_sparse_plan_free(&p);
    /* A corrupt index: tile coordinates out of order. */
    if (s.ix.desc.ntiles >= 2) {
        int64_t c0 = s.ix.tile_coords[0];
        s.ix.tile_coords[0] = s.ix.tile_coords[2] + 1;
        t = target("w", 0, 0, 2, (uint64_t[]){0, 0}, (uint64_t[]){64, 64});
        assert_int_equal(ferry_sparse_plan_batch(ix, 1, &t, 1, &p, &err), FERRY_EPROTO);
        s.ix.tile_coords[0] = c0;
    }
    tix_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_2d),
        cmocka_unit_test(test_random_nd),
        cmocka_unit_test(test_direction),
        cmocka_unit_test(test_work_not_nnz),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_acceptance_ep2tp2),
        cmocka_unit_test(test_partial_overlap),
        cmocka_unit_test(test_aux_reused),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
