/* Walking a plan: regions enumerated on demand from (target split, source
 * class) pairs, lowered to byte runs and coalesced. Nothing here allocates
 * per region, so a plan with tens of millions of regions streams in
 * constant memory. */
#include <string.h>

#include "reshard/reshard_int.h"

enum { MODE_NONE, MODE_REGIONS, MODE_RUNS };

struct ferry_plan_iter {
    const ferry_plan *p;
    ferry_plan_filter f;
    int mode;
    size_t pair, pair_end;
    bool in_pair, in_cell;
    /* pair */
    const fr_group *tg, *sg;
    const fr_class *cls;
    uint32_t ndim, itemsize, k;
    uint64_t lo[FR_MAXD], hi[FR_MAXD];      /* target split box ∩ class box */
    uint64_t s_off[FR_MAXD], s_chunk[FR_MAXD], s_end[FR_MAXD], s_parts[FR_MAXD];   /* class geometry */
    uint64_t jlo[FR_MAXD], jhi[FR_MAXD], j[FR_MAXD];
    /* target piece */
    uint32_t dst_rank;
    uint64_t dst_frag;
    uint64_t toff[FR_MAXD], tshape[FR_MAXD];
    uint64_t dst_st[FR_MAXD], dst_base;     /* target piece: element strides, storage offset */
    uint64_t a[FR_MAXD], b[FR_MAXD];        /* target piece ∩ class box */
    uint64_t ilo[FR_MAXD], ihi[FR_MAXD], i[FR_MAXD];
    /* runs: buf[cur] is held back, open (it may still be continued) or
     * ready (to hand out next); the other slot receives the next run */
    enum { HELD_NONE, HELD_OPEN, HELD_READY } held;
    int cur;
    ferry_run buf[2];
};

int ferry_plan_iter_open(const ferry_plan *p, const ferry_plan_filter *filter, ferry_plan_iter **out)
{
    if (!p || !out)
        return FERRY_EINVAL;
    ferry_plan_iter *it = fr_calloc(1, sizeof *it);
    if (!it)
        return FERRY_ENOMEM;
    it->p = p;
    it->f = filter ? *filter : (ferry_plan_filter){-1, -1, -1};
    it->pair_end = p->npairs;
    if (it->f.tensor >= 0) {
        if ((uint64_t)it->f.tensor >= p->dst->ntensors) {
            it->pair_end = 0;
        } else {
            it->pair = p->tensors[it->f.tensor].first_pair;
            it->pair_end = it->pair + p->tensors[it->f.tensor].npairs;
        }
    }
    *out = it;
    return 0;
}

void ferry_plan_iter_close(ferry_plan_iter *it)
{
    fr_free(it);
}

/* Set up pair it->pair; false when the filters rule all of it out. */
static bool setup_pair(ferry_plan_iter *it)
{
    const ferry_plan *p = it->p;
    const fr_pair *pr = &p->pairs[it->pair];
    it->tg = &p->dst->groups[pr->tgroup];
    it->cls = &p->classes[pr->sclass];
    it->sg = &p->src->groups[it->cls->rep];
    if (it->f.dst_rank >= 0 &&
        ((uint64_t)it->f.dst_rank < it->tg->rank || (uint64_t)it->f.dst_rank > fr_group_max_rank(p->dst, it->tg)))
        return false;
    if (it->f.src_rank >= 0 &&
        ((uint64_t)it->f.src_rank < it->cls->min_rank || (uint64_t)it->f.src_rank > it->cls->max_rank))
        return false;
    const ferry_manifest *tm = p->dst, *sm = p->src;
    it->ndim = it->tg->ndim;
    it->itemsize = tm->tensors[it->tg->tensor].itemsize;
    for (uint32_t d = 0; d < it->ndim; d++) {
        uint64_t to = G_OFF(tm, it->tg)[d], te = to + G_EXT(tm, it->tg)[d], tc = G_CHUNK(tm, it->tg)[d];
        uint64_t so = G_OFF(sm, it->sg)[d], se = so + G_EXT(sm, it->sg)[d];
        it->s_off[d] = so;
        it->s_end[d] = se;
        it->s_chunk[d] = G_CHUNK(sm, it->sg)[d];
        it->s_parts[d] = G_PARTS(sm, it->sg)[d];
        it->lo[d] = to > so ? to : so;
        it->hi[d] = te < se ? te : se;
        it->jlo[d] = (it->lo[d] - to) / tc;
        it->jhi[d] = (it->hi[d] - 1 - to) / tc + 1;
        it->j[d] = it->jlo[d];
    }
    it->k = 0;
    return true;
}

/* Next target piece (row-major), then next copy. */
static void advance_target(ferry_plan_iter *it)
{
    for (int d = (int)it->ndim - 1; d >= 0; d--) {
        if (++it->j[d] < it->jhi[d])
            return;
        it->j[d] = it->jlo[d];
    }
    it->k++;
}

static bool advance_source(ferry_plan_iter *it)
{
    for (int d = (int)it->ndim - 1; d >= 0; d--) {
        if (++it->i[d] < it->ihi[d])
            return true;
        it->i[d] = it->ilo[d];
    }
    return false;
}

/* Element strides of a piece of shape `shape` in its local buffer; returns
 * the storage offset (elements) of its first element. */
static uint64_t local_strides(const ferry_manifest *m, const fr_group *g, const uint64_t *shape, uint32_t n,
                              uint64_t *st)
{
    if (g->has_strides) {
        memcpy(st, G_STRIDES(m, g), n * sizeof *st);
        return g->storage_offset;
    }
    uint64_t s = 1;
    for (int d = (int)n - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
    return g->storage_offset;
}

/* Set up target piece (it->j, it->k); false when the dst filter skips it. */
static bool setup_cell(ferry_plan_iter *it)
{
    const ferry_manifest *tm = it->p->dst;
    const fr_group *tg = it->tg;
    it->dst_rank = fr_group_rank(tm, tg, it->j, it->k);
    if (it->f.dst_rank >= 0 && (uint64_t)it->f.dst_rank != it->dst_rank)
        return false;
    uint64_t lin = 0;
    for (uint32_t d = 0; d < it->ndim; d++) {
        uint64_t to = G_OFF(tm, tg)[d], tc = G_CHUNK(tm, tg)[d], te = to + G_EXT(tm, tg)[d];
        uint64_t so = it->s_off[d], sc = it->s_chunk[d];
        lin = lin * G_PARTS(tm, tg)[d] + it->j[d];
        it->toff[d] = to + it->j[d] * tc;
        uint64_t end = it->toff[d] + tc < te ? it->toff[d] + tc : te;
        it->tshape[d] = end - it->toff[d];
        it->a[d] = it->toff[d] > it->lo[d] ? it->toff[d] : it->lo[d];
        it->b[d] = end < it->hi[d] ? end : it->hi[d];
        it->ilo[d] = (it->a[d] - so) / sc;
        it->ihi[d] = (it->b[d] - 1 - so) / sc + 1;
        it->i[d] = it->ilo[d];
    }
    it->dst_frag = tg->first_id + (uint64_t)it->k * tg->ncells + lin;
    it->dst_base = local_strides(tm, tg, it->tshape, it->ndim, it->dst_st);
    return true;
}

/* Pick the copy of source piece `idx` (linear `lin`) that serves dst_rank:
 * one on the target's node when there is one, else spread by rank. */
static void choose_source(const ferry_plan_iter *it, const uint64_t *idx, uint64_t lin,
                          const fr_group **g_out, uint32_t *k_out, uint32_t *rank_out)
{
    const ferry_plan *p = it->p;
    const ferry_manifest *sm = p->src;
    const fr_class *c = it->cls;
    const uint32_t *mem = p->members + c->first_member;
    if (c->copies > 1) {
        uint32_t node = fr_node_of(p->dst, it->dst_rank);
        uint64_t same = 0;
        for (uint32_t m = 0; m < c->nmembers; m++) {
            const fr_group *g = &sm->groups[mem[m]];
            for (uint32_t k = 0; k < g->replicas; k++)
                same += fr_node_of(sm, fr_group_rank(sm, g, idx, k)) == node;
        }
        uint64_t want = same ? it->dst_rank % same : (it->dst_rank + lin) % c->copies;
        for (uint32_t m = 0; m < c->nmembers; m++) {
            const fr_group *g = &sm->groups[mem[m]];
            for (uint32_t k = 0; k < g->replicas; k++) {
                uint32_t r = fr_group_rank(sm, g, idx, k);
                if (same && fr_node_of(sm, r) != node)
                    continue;
                if (want-- == 0) {
                    *g_out = g;
                    *k_out = k;
                    *rank_out = r;
                    return;
                }
            }
        }
    }
    *g_out = &sm->groups[mem[0]];
    *k_out = 0;
    *rank_out = fr_group_rank(sm, *g_out, idx, 0);
}

/* The region at the current (pair, copy, target piece, source piece);
 * also the source group/copy it reads from. */
static void make_region(const ferry_plan_iter *it, ferry_region *r, const fr_group **sg, uint64_t *spoff)
{
    uint64_t lin = 0, bytes = it->itemsize;
    memset(r->offset, 0, sizeof r->offset);   /* fixed sizes: inlined stores */
    memset(r->shape, 0, sizeof r->shape);
    for (uint32_t d = 0; d < it->ndim; d++) {
        uint64_t sc = it->s_chunk[d], se = it->s_end[d];
        uint64_t po = it->s_off[d] + it->i[d] * sc, pe = po + sc < se ? po + sc : se;
        uint64_t a = it->a[d] > po ? it->a[d] : po, b = it->b[d] < pe ? it->b[d] : pe;
        r->offset[d] = a;
        r->shape[d] = b - a;
        bytes *= b - a;
        spoff[d] = po;
        lin = lin * it->s_parts[d] + it->i[d];
    }
    uint32_t k;
    choose_source(it, it->i, lin, sg, &k, &r->src_rank);
    r->tensor = it->tg->tensor;
    r->src_tensor = (*sg)->tensor;
    r->ndim = it->ndim;
    r->src_fragment = (*sg)->first_id + (uint64_t)k * (*sg)->ncells + lin;
    r->dst_fragment = it->dst_frag;
    r->dst_rank = it->dst_rank;
    r->bytes = bytes;
}

/* Core walk: the next region passing the filters, with its source group
 * and source piece offset (for lowering). */
static int next_region(ferry_plan_iter *it, ferry_region *r, const fr_group **sg, uint64_t *spoff)
{
    for (;;) {
        if (!it->in_pair) {
            if (it->pair >= it->pair_end)
                return 0;
            if (!setup_pair(it)) {
                it->pair++;
                continue;
            }
            it->in_pair = true;
            it->in_cell = false;
        }
        if (!it->in_cell) {
            if (it->k >= it->tg->replicas) {
                it->in_pair = false;
                it->pair++;
                continue;
            }
            if (!setup_cell(it)) {
                advance_target(it);
                continue;
            }
            it->in_cell = true;
        }
        make_region(it, r, sg, spoff);
        if (!advance_source(it)) {
            it->in_cell = false;
            advance_target(it);
        }
        if (it->f.src_rank >= 0 && (uint64_t)it->f.src_rank != r->src_rank)
            continue;
        return 1;
    }
}

int ferry_plan_iter_next_region(ferry_plan_iter *it, ferry_region *out)
{
    if (!it || !out)
        return FERRY_EINVAL;
    if (it->mode == MODE_RUNS)
        return FERRY_ESTATE;
    it->mode = MODE_REGIONS;
    const fr_group *sg;
    uint64_t spoff[FR_MAXD];
    return next_region(it, out, &sg, spoff);
}

/* ---- lowering ----------------------------------------------------------- */


static void lower(const ferry_plan_iter *it, const ferry_region *r, const fr_group *sg,
                  const uint64_t *spoff, ferry_run *run)
{
    const ferry_manifest *sm = it->p->src;
    uint32_t n = it->ndim, isz = it->itemsize;
    uint64_t sshape[FR_MAXD] = {0}, sst[FR_MAXD];
    for (uint32_t d = 0; d < n; d++) {
        uint64_t sc = G_CHUNK(sm, sg)[d], se = G_OFF(sm, sg)[d] + G_EXT(sm, sg)[d];
        sshape[d] = spoff[d] + sc < se ? sc : se - spoff[d];
    }
    const uint64_t *dst_ = it->dst_st;
    uint64_t so = local_strides(sm, sg, sshape, n, sst);
    uint64_t dof = it->dst_base;
    for (uint32_t d = 0; d < n; d++) {
        so += (r->offset[d] - spoff[d]) * sst[d];
        dof += (r->offset[d] - it->toff[d]) * dst_[d];
    }
    run->tensor = r->tensor;
    run->src_fragment = r->src_fragment;
    run->dst_fragment = r->dst_fragment;
    run->src_rank = r->src_rank;
    run->dst_rank = r->dst_rank;
    run->src_offset = so * isz;
    run->dst_offset = dof * isz;
    run->src_object = NULL;
    if (sg->object >= 0) {
        run->src_object = sm->objects[sg->object];
        run->src_offset += sg->object_offset;
    }
    ferry_box_lower(n, r->shape, isz, sst, dst_, run);
    run->bytes = r->bytes;
}

static bool can_merge(const ferry_run *a, const ferry_run *b)
{
    return a->nouter == 0 && b->nouter == 0 && a->tensor == b->tensor && a->dst_fragment == b->dst_fragment &&
           a->src_rank == b->src_rank && a->src_object == b->src_object &&
           (a->src_object || a->src_fragment == b->src_fragment) && a->src_offset + a->len == b->src_offset &&
           a->dst_offset + a->len == b->dst_offset;
}

/* Only a flat run out of a store object can be continued by the next. */
static bool may_continue(const ferry_run *r)
{
    return r->src_object && r->nouter == 0;
}

int ferry_plan_iter_next_run(ferry_plan_iter *it, ferry_run *out)
{
    if (!it || !out)
        return FERRY_EINVAL;
    if (it->mode == MODE_REGIONS)
        return FERRY_ESTATE;
    it->mode = MODE_RUNS;
    for (;;) {
        ferry_run *held = &it->buf[it->cur], *next = &it->buf[it->cur ^ 1];
        if (it->held == HELD_READY) {
            *out = *held;
            it->held = HELD_NONE;
            return 1;
        }
        ferry_region r;
        const fr_group *sg;
        uint64_t spoff[FR_MAXD];
        int rc = next_region(it, &r, &sg, spoff);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            if (it->held == HELD_NONE)
                return 0;
            *out = *held;
            it->held = HELD_NONE;
            return 1;
        }
        if (it->held == HELD_NONE) {   /* most runs: straight to the caller */
            lower(it, &r, sg, spoff, out);
            if (!may_continue(out))
                return 1;
            *held = *out;
            it->held = HELD_OPEN;
            continue;
        }
        lower(it, &r, sg, spoff, next);
        if (can_merge(held, next)) {
            held->len += next->len;
            held->bytes += next->bytes;
            continue;
        }
        *out = *held;
        it->cur ^= 1;
        it->held = may_continue(next) ? HELD_OPEN : HELD_READY;
        return 1;
    }
}

typedef struct loop { uint64_t count, ss, ds; } loop;

void ferry_box_lower(uint32_t ndim, const uint64_t *shape, uint32_t itemsize,
                     const uint64_t *src_strides, const uint64_t *dst_strides, ferry_run *run)
{
    /* Loops over dims with more than one element, outermost first; then
     * fold contiguous inner dims into len and contiguous neighbours into
     * one loop. */
    loop l[FR_MAXD];
    uint32_t nl = 0;
    for (uint32_t d = 0; d < ndim && d < FR_MAXD; d++)
        if (shape[d] > 1)
            l[nl++] = (loop){shape[d], src_strides[d] * itemsize, dst_strides[d] * itemsize};
    uint64_t len = itemsize;
    while (nl && l[nl - 1].ss == len && l[nl - 1].ds == len)
        len *= l[--nl].count;
    uint32_t m = 0;
    for (uint32_t i = 0; i < nl; i++) {
        if (m && l[m - 1].ss == l[i].ss * l[i].count && l[m - 1].ds == l[i].ds * l[i].count) {
            l[m - 1].count *= l[i].count;
            l[m - 1].ss = l[i].ss;
            l[m - 1].ds = l[i].ds;
            continue;
        }
        l[m++] = l[i];
    }
    run->len = len;
    run->nouter = m;
    memset(run->count, 0, sizeof run->count);
    memset(run->src_stride, 0, sizeof run->src_stride);
    memset(run->dst_stride, 0, sizeof run->dst_stride);
    uint64_t bytes = len;
    for (uint32_t i = 0; i < m; i++) {
        run->count[i] = l[i].count;
        run->src_stride[i] = l[i].ss;
        run->dst_stride[i] = l[i].ds;
        bytes *= l[i].count;
    }
    run->bytes = bytes;
}

int fr_plan_count_runs(const ferry_plan *p, uint64_t *out)
{
    ferry_plan_iter *it;
    int rc = ferry_plan_iter_open(p, NULL, &it);
    if (rc < 0)
        return rc;
    uint64_t n = 0;
    ferry_run run;
    while ((rc = ferry_plan_iter_next_run(it, &run)) == 1)
        n++;
    ferry_plan_iter_close(it);
    *out = n;
    return rc < 0 ? rc : 0;
}
