/* Segment allocator: free extents in two AVL trees, by offset (to find
 * neighbours when coalescing) and by (length, offset) (best fit). */
#include <assert.h>

#include "store/store_int.h"

typedef struct extent {
    fr_avl_node by_off, by_size;
    uint64_t off, len;
    struct extent *next;      /* spare pool link */
} extent;

struct fr_segalloc {
    uint64_t size, granule, used, nalloc;
    fr_avl by_off, by_size;
    extent *pool;             /* spare nodes, so release never allocates */
    size_t npool;
};

/* Keep this many spare nodes beyond the guaranteed minimum before trimming. */
#define POOL_SLACK 32
/* Best-fit candidates examined before falling back to a size that is
 * certain to fit any alignment. */
#define FIT_TRIES 8

static int cmp_off(const fr_avl_node *a, const fr_avl_node *b)
{
    const extent *x = fr_container_of(a, extent, by_off), *y = fr_container_of(b, extent, by_off);
    return x->off < y->off ? -1 : x->off > y->off;
}

static int cmp_size(const fr_avl_node *a, const fr_avl_node *b)
{
    const extent *x = fr_container_of(a, extent, by_size), *y = fr_container_of(b, extent, by_size);
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static bool pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

static extent *node_get(fr_segalloc *a)
{
    extent *e = a->pool;
    if (e != NULL) {
        a->pool = e->next;
        a->npool--;
        return e;
    }
    return fr_malloc(sizeof(*e));
}

static void node_put(fr_segalloc *a, extent *e)
{
    e->next = a->pool;
    a->pool = e;
    a->npool++;
}

static void pool_trim(fr_segalloc *a)
{
    while (a->npool > 0 && a->by_off.n + a->npool > a->nalloc + 1 + POOL_SLACK) {
        extent *e = a->pool;
        a->pool = e->next;
        a->npool--;
        fr_free(e);
    }
}

int fr_segalloc_new(uint64_t size, uint64_t granule, fr_segalloc **out)
{
    if (out == NULL || !pow2(granule) || size < granule)
        return FERRY_EINVAL;
    fr_segalloc *a = fr_calloc(1, sizeof(*a));
    extent *e = fr_malloc(sizeof(*e));
    if (a == NULL || e == NULL) {
        fr_free(a);
        fr_free(e);
        return FERRY_ENOMEM;
    }
    a->granule = granule;
    a->size = size & ~(granule - 1);
    fr_avl_init(&a->by_off, cmp_off);
    fr_avl_init(&a->by_size, cmp_size);
    e->off = 0;
    e->len = a->size;
    fr_avl_insert(&a->by_off, &e->by_off);
    fr_avl_insert(&a->by_size, &e->by_size);
    *out = a;
    return 0;
}

static void free_tree(fr_avl_node *n)
{
    if (n == NULL)
        return;
    free_tree(n->l);
    free_tree(n->r);
    fr_free(fr_container_of(n, extent, by_off));
}

void fr_segalloc_destroy(fr_segalloc *a)
{
    if (a == NULL)
        return;
    free_tree(a->by_off.root);
    while (a->pool != NULL) {
        extent *e = a->pool;
        a->pool = e->next;
        fr_free(e);
    }
    fr_free(a);
}

uint64_t fr_segalloc_round(const fr_segalloc *a, uint64_t len)
{
    if (len == 0)
        len = 1;
    if (len > UINT64_MAX - (a->granule - 1))
        return 0;
    return (len + a->granule - 1) & ~(a->granule - 1);
}

/* Offset at which e can hold need bytes aligned to al, or UINT64_MAX. */
static uint64_t fit(const extent *e, uint64_t need, uint64_t al)
{
    uint64_t start = (e->off + al - 1) & ~(al - 1);
    if (start < e->off || start - e->off > e->len || e->len - (start - e->off) < need)
        return UINT64_MAX;
    return start;
}

int fr_segalloc_find(const fr_segalloc *a, uint64_t len, uint64_t align, uint64_t *off)
{
    if (a == NULL || off == NULL || (align != 0 && !pow2(align)))
        return FERRY_EINVAL;
    uint64_t al = align > a->granule ? align : a->granule;
    uint64_t need = fr_segalloc_round(a, len);
    if (need == 0 || need > a->size || al > a->size)
        return FERRY_ENOSPC;

    extent probe = { .off = 0, .len = need };
    fr_avl_node *n = fr_avl_ceil(&a->by_size, &probe.by_size);
    for (int k = 0; n != NULL && k < FIT_TRIES; k++) {
        uint64_t at = fit(fr_container_of(n, extent, by_size), need, al);
        if (at != UINT64_MAX) {
            *off = at;
            return 0;
        }
        n = fr_avl_higher(&a->by_size, n);
    }
    /* Any extent this long fits: its start is granule-aligned, so aligning
     * it up skips at most al - granule bytes. */
    if (n == NULL || al <= a->granule || need > UINT64_MAX - (al - a->granule))
        return FERRY_ENOSPC;
    probe.len = need + al - a->granule;
    fr_avl_node *g = fr_avl_ceil(&a->by_size, &probe.by_size);
    if (g != NULL) {
        *off = fit(fr_container_of(g, extent, by_size), need, al);
        assert(*off != UINT64_MAX);
        return 0;
    }
    /* Only extents shorter than that are left; whether one fits depends on
     * where it starts, so look at each (the one linear case, and only when
     * the answer is close to "no room"). */
    for (; n != NULL; n = fr_avl_higher(&a->by_size, n)) {
        uint64_t at = fit(fr_container_of(n, extent, by_size), need, al);
        if (at != UINT64_MAX) {
            *off = at;
            return 0;
        }
    }
    return FERRY_ENOSPC;
}

int fr_segalloc_alloc(fr_segalloc *a, uint64_t len, uint64_t align, uint64_t *off)
{
    uint64_t at;
    int rc = fr_segalloc_find(a, len, align, &at);
    if (rc < 0)
        return rc;
    rc = fr_segalloc_reserve(a, at, len);
    if (rc < 0)
        return rc;
    *off = at;
    return 0;
}

static bool range_ok(const fr_segalloc *a, uint64_t off, uint64_t len)
{
    return len != 0 && (off & (a->granule - 1)) == 0 && off <= a->size && len <= a->size - off;
}

int fr_segalloc_reserve(fr_segalloc *a, uint64_t off, uint64_t len)
{
    if (a == NULL)
        return FERRY_EINVAL;
    len = fr_segalloc_round(a, len);
    if (!range_ok(a, off, len))
        return FERRY_EINVAL;
    extent probe = { .off = off };
    fr_avl_node *n = fr_avl_floor(&a->by_off, &probe.by_off);
    if (n == NULL)
        return FERRY_EINVAL;
    extent *e = fr_container_of(n, extent, by_off);
    uint64_t end = e->off + e->len;
    if (off + len > end)
        return FERRY_EINVAL;
    /* One spare node per outstanding allocation (plus one) is what a
     * release may need later: take it now, while failing is harmless. */
    if (a->by_off.n + a->npool < a->nalloc + 2) {
        extent *spare = fr_malloc(sizeof(*spare));
        if (spare == NULL)
            return FERRY_ENOMEM;
        node_put(a, spare);
    }
    uint64_t left = off - e->off, right = end - (off + len);
    fr_avl_remove(&a->by_size, &e->by_size);
    if (left == 0 && right == 0) {
        fr_avl_remove(&a->by_off, &e->by_off);
        node_put(a, e);
    } else if (left == 0) {
        e->off = off + len;   /* stays between the same neighbours */
        e->len = right;
        fr_avl_insert(&a->by_size, &e->by_size);
    } else {
        e->len = left;
        fr_avl_insert(&a->by_size, &e->by_size);
        if (right != 0) {
            extent *r = node_get(a);
            assert(r != NULL);   /* the pool holds at least one */
            r->off = off + len;
            r->len = right;
            fr_avl_insert(&a->by_off, &r->by_off);
            fr_avl_insert(&a->by_size, &r->by_size);
        }
    }
    a->used += len;
    a->nalloc++;
    return 0;
}

bool fr_segalloc_is_free(const fr_segalloc *a, uint64_t off, uint64_t len)
{
    if (a == NULL)
        return false;
    len = fr_segalloc_round(a, len);
    if (!range_ok(a, off, len))
        return false;
    extent probe = { .off = off };
    fr_avl_node *n = fr_avl_floor(&a->by_off, &probe.by_off);
    const extent *e = n ? fr_container_of(n, extent, by_off) : NULL;
    return e != NULL && off + len <= e->off + e->len;
}

int fr_segalloc_release(fr_segalloc *a, uint64_t off, uint64_t len)
{
    if (a == NULL)
        return FERRY_EINVAL;
    len = fr_segalloc_round(a, len);
    if (!range_ok(a, off, len) || len > a->used)
        return FERRY_EINVAL;
    extent probe = { .off = off };
    fr_avl_node *pn = fr_avl_floor(&a->by_off, &probe.by_off);
    fr_avl_node *sn = fr_avl_higher(&a->by_off, &probe.by_off);
    extent *p = pn ? fr_container_of(pn, extent, by_off) : NULL;
    extent *s = sn ? fr_container_of(sn, extent, by_off) : NULL;
    if ((p != NULL && p->off + p->len > off) || (s != NULL && s->off < off + len))
        return FERRY_EINVAL;   /* overlaps free space: a double or wrong free */
    bool ml = p != NULL && p->off + p->len == off;
    bool mr = s != NULL && s->off == off + len;
    if (ml && mr) {
        fr_avl_remove(&a->by_size, &p->by_size);
        fr_avl_remove(&a->by_size, &s->by_size);
        fr_avl_remove(&a->by_off, &s->by_off);
        p->len += len + s->len;
        node_put(a, s);
        fr_avl_insert(&a->by_size, &p->by_size);
    } else if (ml) {
        fr_avl_remove(&a->by_size, &p->by_size);
        p->len += len;
        fr_avl_insert(&a->by_size, &p->by_size);
    } else if (mr) {
        fr_avl_remove(&a->by_size, &s->by_size);
        s->off = off;          /* stays between the same neighbours */
        s->len += len;
        fr_avl_insert(&a->by_size, &s->by_size);
    } else {
        /* Only a release of part of an allocation can find the pool empty. */
        extent *e = node_get(a);
        if (e == NULL)
            return FERRY_ENOMEM;
        e->off = off;
        e->len = len;
        fr_avl_insert(&a->by_off, &e->by_off);
        fr_avl_insert(&a->by_size, &e->by_size);
    }
    a->used -= len;
    if (a->nalloc > 0)
        a->nalloc--;
    pool_trim(a);
    return 0;
}

void fr_segalloc_get_stats(const fr_segalloc *a, fr_segalloc_stats *st)
{
    fr_avl_node *big = fr_avl_last(&a->by_size);
    st->size = a->size;
    st->used = a->used;
    st->free = a->size - a->used;
    st->largest_free = big ? fr_container_of(big, extent, by_size)->len : 0;
    st->free_extents = a->by_off.n;
    st->allocations = a->nalloc;
}

uint64_t fr_segalloc_used(const fr_segalloc *a)
{
    return a->used;
}

static int walk(const fr_avl_node *n, fr_segalloc_visit_fn fn, void *ctx)
{
    if (n == NULL)
        return 0;
    int rc = walk(n->l, fn, ctx);
    if (rc != 0)
        return rc;
    const extent *e = fr_container_of(n, extent, by_off);
    rc = fn(ctx, e->off, e->len);
    if (rc != 0)
        return rc;
    return walk(n->r, fn, ctx);
}

int fr_segalloc_walk_free(const fr_segalloc *a, fr_segalloc_visit_fn fn, void *ctx)
{
    return walk(a->by_off.root, fn, ctx);
}
