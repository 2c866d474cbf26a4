/* The planner: (source manifest, target manifest) -> overlaps.
 *
 * Both sides are groups (regular grids of pieces over a box, copies at rank
 * offsets). Source groups with identical geometry are copies of the same
 * boxes and form a class; classes of one tensor must be disjoint. For each
 * target group the classes it overlaps are found by a sweep along the dim
 * where source boxes differ most (sorted starts + prefix-max ends), so a
 * tensor with thousands of fragments per side is not an all-pairs scan.
 * A (target group, source class) pair is all the plan stores: its regions
 * are the product over dims of 1-D overlaps of two regular partitions,
 * counted here in O(parts) and enumerated on demand by plan_iter.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "reshard/reshard_int.h"

void fr_plan_options_resolve(const ferry_plan_options *in, ferry_plan_options *out)
{
    ferry_plan_options o = {0};
    if (in)
        o = *in;
    if (!o.max_fragments)
        o.max_fragments = 1ull << 36;
    if (!o.max_regions)
        o.max_regions = 1ull << 40;
    if (!o.max_overlaps)
        o.max_overlaps = 1ull << 24;
    *out = o;
}

int fr_plan_check_limits(const ferry_plan *p, const ferry_plan_options *opt, ferry_error *err)
{
    ferry_plan_options o;
    fr_plan_options_resolve(opt, &o);
    const ferry_plan_stats *s = &p->stats;
    if (s->src_fragments > o.max_fragments)
        return fr_fail(err, FERRY_EMSGSIZE, "source manifest has %llu fragments, above the limit of %llu (max_fragments)",
                       (unsigned long long)s->src_fragments, (unsigned long long)o.max_fragments);
    if (s->dst_fragments > o.max_fragments)
        return fr_fail(err, FERRY_EMSGSIZE, "target manifest has %llu fragments, above the limit of %llu (max_fragments)",
                       (unsigned long long)s->dst_fragments, (unsigned long long)o.max_fragments);
    if (s->regions > o.max_regions)
        return fr_fail(err, FERRY_EMSGSIZE, "plan has %llu regions, above the limit of %llu (max_regions)",
                       (unsigned long long)s->regions, (unsigned long long)o.max_regions);
    if (p->npairs > o.max_overlaps)
        return fr_fail(err, FERRY_EMSGSIZE, "plan has %zu split overlaps, above the limit of %llu (max_overlaps)",
                       p->npairs, (unsigned long long)o.max_overlaps);
    return 0;
}

void fr_plan_ref(ferry_plan *p)
{
    atomic_fetch_add(&p->refs, 1);
}

void ferry_plan_free(ferry_plan *p)
{
    if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    ferry_manifest_close(p->src);
    ferry_manifest_close(p->dst);
    fr_free(p->tensors);
    fr_free(p->pairs);
    fr_free(p->classes);
    fr_free(p->members);
    fr_free(p);
}

int ferry_plan_stats_get(const ferry_plan *p, ferry_plan_stats *out)
{
    if (!p || !out)
        return FERRY_EINVAL;
    *out = p->stats;
    return 0;
}

ferry_manifest *ferry_plan_src(const ferry_plan *p)
{
    return p ? p->src : NULL;
}

ferry_manifest *ferry_plan_dst(const ferry_plan *p)
{
    return p ? p->dst : NULL;
}

/* ---- per-tensor planning state ------------------------------------------ */

typedef struct planner {
    ferry_plan *p;
    ferry_plan_options o;
    ferry_error *err;
    const ferry_manifest *s, *t;
    uint32_t sweep_dim;
    uint64_t *pmax;           /* prefix max of class ends on sweep_dim */
    size_t pmax_cap;
    uint32_t *active;
    size_t active_cap;
    uint32_t *order;
    size_t order_cap;
} planner;

static int geom_cmp(const ferry_manifest *m, const fr_group *a, const fr_group *b)
{
    for (uint32_t d = 0; d < a->ndim; d++) {
        const uint64_t x[3] = {G_OFF(m, a)[d], G_EXT(m, a)[d], G_CHUNK(m, a)[d]};
        const uint64_t y[3] = {G_OFF(m, b)[d], G_EXT(m, b)[d], G_CHUNK(m, b)[d]};
        for (int i = 0; i < 3; i++)
            if (x[i] != y[i])
                return x[i] < y[i] ? -1 : 1;
    }
    return 0;
}

static int cmp_members(const void *pa, const void *pb, void *ctx)
{
    const ferry_manifest *m = ctx;
    const fr_group *a = &m->groups[*(const uint32_t *)pa], *b = &m->groups[*(const uint32_t *)pb];
    int c = geom_cmp(m, a, b);
    if (c)
        return c;
    if (a->replica != b->replica)
        return a->replica < b->replica ? -1 : 1;
    return *(const uint32_t *)pa < *(const uint32_t *)pb ? -1 : 1;
}

typedef struct sort_ctx { const ferry_plan *p; const ferry_manifest *m; uint32_t dim; } sort_ctx;

static int cmp_class_start(const void *pa, const void *pb, void *ctx)
{
    const sort_ctx *c = ctx;
    const fr_class *a = pa, *b = pb;
    const fr_group *ga = &c->m->groups[a->rep], *gb = &c->m->groups[b->rep];
    uint64_t x = G_OFF(c->m, ga)[c->dim], y = G_OFF(c->m, gb)[c->dim];
    if (x != y)
        return x < y ? -1 : 1;
    return geom_cmp(c->m, ga, gb);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool boxes_overlap(const ferry_manifest *ma, const fr_group *a, const ferry_manifest *mb,
                          const fr_group *b)
{
    for (uint32_t d = 0; d < a->ndim; d++) {
        uint64_t ao = G_OFF(ma, a)[d], ae = ao + G_EXT(ma, a)[d];
        uint64_t bo = G_OFF(mb, b)[d], be = bo + G_EXT(mb, b)[d];
        if (ao >= be || bo >= ae)
            return false;
    }
    return true;
}

/* Linear index of the piece of g holding point c. */
static uint64_t piece_at(const ferry_manifest *m, const fr_group *g, const uint64_t *c)
{
    uint64_t lin = 0;
    for (uint32_t d = 0; d < g->ndim; d++)
        lin = lin * G_PARTS(m, g)[d] + (c[d] - G_OFF(m, g)[d]) / G_CHUNK(m, g)[d];
    return lin;
}

/* Group the source tensor's groups into classes (appended to p->classes,
 * sorted by start on the sweep dim), check declared replicas and that
 * classes are disjoint. *full: the classes tile the whole tensor. */
static int build_classes(planner *pl, uint32_t st, size_t *first, size_t *n, bool *full)
{
    ferry_plan *p = pl->p;
    const ferry_manifest *m = pl->s;
    const fr_tensor *t = &m->tensors[st];
    uint32_t g0 = m->tg_start[st], ng = m->tg_start[st + 1] - g0;
    char da[400], db[400];
    *first = p->nclasses;
    *n = 0;
    *full = false;
    if (!ng)
        return 0;
    if (fr_grow((void **)&pl->order, &pl->order_cap, ng, sizeof *pl->order) < 0 ||
        fr_grow((void **)&p->members, &p->mcap, p->nmembers + ng, sizeof *p->members) < 0)
        return fr_fail(pl->err, FERRY_ENOMEM, "out of memory");
    memcpy(pl->order, m->tg_list + g0, ng * sizeof *pl->order);
    if (ng > 1)
        qsort_r(pl->order, ng, sizeof *pl->order, cmp_members, (void *)m);
    for (uint32_t i = 0; i < ng; i++) {
        const fr_group *g = &m->groups[pl->order[i]];
        bool same = i > 0 && geom_cmp(m, &m->groups[pl->order[i - 1]], g) == 0;
        if (same) {
            const fr_group *prev = &m->groups[pl->order[i - 1]];
            if ((uint64_t)prev->replica + prev->replicas > g->replica) {
                uint32_t r = g->replica;
                return fr_fail(pl->err, FERRY_EINVAL,
                               "tensor '%s': source %s and %s hold the same box with the same replica number %u; "
                               "copies must carry distinct replica numbers",
                               t->name, fr_frag_desc(m, prev, r - prev->replica, 0, da, sizeof da),
                               fr_frag_desc(m, g, 0, 0, db, sizeof db), r);
            }
        } else {
            if (fr_grow((void **)&p->classes, &p->ccap, p->nclasses + 1, sizeof *p->classes) < 0)
                return fr_fail(pl->err, FERRY_ENOMEM, "out of memory");
            p->classes[p->nclasses++] = (fr_class){.rep = pl->order[i], .first_member = (uint32_t)p->nmembers,
                                                   .min_rank = UINT32_MAX};
            (*n)++;
        }
        fr_class *c = &p->classes[p->nclasses - 1];
        p->members[p->nmembers++] = pl->order[i];
        c->nmembers++;
        c->copies += g->replicas;
        if (g->rank < c->min_rank)
            c->min_rank = g->rank;
        uint32_t mr = fr_group_max_rank(m, g);
        if (mr > c->max_rank)
            c->max_rank = mr;
    }
    fr_class *cls = p->classes + *first;
    size_t nc = *n;
    uint32_t ndim = t->ndim;

    /* The sweep dim: where class starts take the most distinct values. */
    pl->sweep_dim = 0;
    if (nc > 1 && ndim > 1) {
        uint64_t *tmp = fr_calloc(nc, sizeof *tmp);
        if (!tmp)
            return fr_fail(pl->err, FERRY_ENOMEM, "out of memory");
        size_t best = 0;
        for (uint32_t d = 0; d < ndim; d++) {
            for (size_t i = 0; i < nc; i++)
                tmp[i] = G_OFF(m, &m->groups[cls[i].rep])[d];
            qsort(tmp, nc, sizeof *tmp, cmp_u64);
            size_t distinct = 1;
            for (size_t i = 1; i < nc; i++)
                distinct += tmp[i] != tmp[i - 1];
            if (distinct > best) {
                best = distinct;
                pl->sweep_dim = d;
            }
        }
        fr_free(tmp);
    }
    uint32_t sd = pl->sweep_dim;
    if (nc > 1 && ndim > 0) {
        sort_ctx sc = {p, m, sd};
        qsort_r(cls, nc, sizeof *cls, cmp_class_start, &sc);
    }

    /* Disjointness: sweep by start, keeping the classes still open. */
    uint64_t vol = 0;
    size_t nact = 0;
    if (fr_grow((void **)&pl->active, &pl->active_cap, nc, sizeof *pl->active) < 0 ||
        fr_grow((void **)&pl->pmax, &pl->pmax_cap, nc, sizeof *pl->pmax) < 0)
        return fr_fail(pl->err, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < nc; i++) {
        const fr_group *g = &m->groups[cls[i].rep];
        uint64_t v = 1;
        for (uint32_t d = 0; d < ndim; d++)
            v *= G_EXT(m, g)[d];
        vol += v;   /* disjoint boxes inside the tensor: no overflow */
        uint64_t start = ndim ? G_OFF(m, g)[sd] : 0;
        uint64_t end = ndim ? start + G_EXT(m, g)[sd] : 1;
        pl->pmax[i] = i && pl->pmax[i - 1] > end ? pl->pmax[i - 1] : end;
        size_t k = 0;
        for (size_t a = 0; a < nact; a++) {
            const fr_group *h = &m->groups[cls[pl->active[a]].rep];
            uint64_t hend = ndim ? G_OFF(m, h)[sd] + G_EXT(m, h)[sd] : 1;
            if (hend <= start)
                continue;
            if (boxes_overlap(m, h, m, g)) {
                uint64_t c[FR_MAXD];
                for (uint32_t d = 0; d < ndim; d++) {
                    uint64_t x = G_OFF(m, h)[d], y = G_OFF(m, g)[d];
                    c[d] = x > y ? x : y;
                }
                const fr_group *gh = &m->groups[p->members[cls[pl->active[a]].first_member]];
                const fr_group *gg = &m->groups[p->members[cls[i].first_member]];
                return fr_fail(pl->err, FERRY_EINVAL,
                               "tensor '%s': source %s and %s overlap; overlapping source fragments must be "
                               "declared replicas (identical boxes, distinct replica numbers)",
                               t->name, fr_frag_desc(m, gh, 0, piece_at(m, gh, c), da, sizeof da),
                               fr_frag_desc(m, gg, 0, piece_at(m, gg, c), db, sizeof db));
            }
            pl->active[k++] = pl->active[a];
        }
        nact = k;
        pl->active[nact++] = (uint32_t)i;
    }
    *full = vol == t->elems;
    return 0;
}

/* Regions of target group tg (all copies) against source class c. */
static int count_regions(const ferry_manifest *tm, const fr_group *tg, const ferry_manifest *sm,
                         const fr_group *sg, uint64_t *out)
{
    uint64_t n = tg->replicas;
    for (uint32_t d = 0; d < tg->ndim; d++) {
        uint64_t to = G_OFF(tm, tg)[d], te = to + G_EXT(tm, tg)[d], tc = G_CHUNK(tm, tg)[d];
        uint64_t so = G_OFF(sm, sg)[d], se = so + G_EXT(sm, sg)[d], sc = G_CHUNK(sm, sg)[d];
        uint64_t lo = to > so ? to : so, hi = te < se ? te : se;
        uint64_t jlo = (lo - to) / tc, jhi = (hi - 1 - to) / tc + 1, sum = 0;
        for (uint64_t j = jlo; j < jhi; j++) {
            uint64_t a = to + j * tc, b = a + tc;
            if (a < lo)
                a = lo;
            if (b > hi)
                b = hi;
            sum += (b - 1 - so) / sc - (a - so) / sc + 1;
        }
        if (fr_mul_u64(n, sum, &n) < 0)
            return FERRY_ERANGE;
    }
    *out = n;
    return 0;
}

/* Elements of box [o, o+e) covered by group g's box. */
static uint64_t overlap_volume(const uint64_t *o, const uint64_t *e, const ferry_manifest *m, const fr_group *g)
{
    uint64_t v = 1;
    for (uint32_t d = 0; d < g->ndim; d++) {
        uint64_t a = o[d], b = o[d] + e[d], go = G_OFF(m, g)[d], ge = go + G_EXT(m, g)[d];
        if (go > a)
            a = go;
        if (ge < b)
            b = ge;
        if (a >= b)
            return 0;
        v *= b - a;
    }
    return v;
}

/* Every piece of tg must be covered by the classes it was paired with. */
static int check_coverage(planner *pl, const fr_tensor *t, const fr_group *tg, size_t first_pair)
{
    const ferry_plan *p = pl->p;
    uint64_t off[FR_MAXD], shape[FR_MAXD];
    for (uint64_t lin = 0; lin < tg->ncells; lin++) {
        fr_group_piece(pl->t, tg, lin, NULL, off, shape);
        uint64_t want = 1, have = 0;
        for (uint32_t d = 0; d < tg->ndim; d++)
            want *= shape[d];
        for (size_t i = first_pair; i < p->npairs; i++)
            have += overlap_volume(off, shape, pl->s, &pl->s->groups[p->classes[p->pairs[i].sclass].rep]);
        if (have != want) {
            char d[400];
            return fr_fail(pl->err, FERRY_EINVAL,
                           "tensor '%s': target %s is not fully covered by source fragments (%llu of %llu elements)",
                           t->name, fr_frag_desc(pl->t, tg, 0, lin, d, sizeof d), (unsigned long long)have,
                           (unsigned long long)want);
        }
    }
    return 0;
}

static int match_tensor(planner *pl, uint32_t ti, int64_t *si)
{
    const fr_tensor *t = &pl->t->tensors[ti];
    *si = ferry_manifest_find_tensor(pl->s, t->name);
    if (*si < 0)
        return pl->t->tg_start[ti + 1] == pl->t->tg_start[ti] ? 0 :
               fr_fail(pl->err, FERRY_ENOENT, "tensor '%s': the target holds it but the source manifest has no such tensor",
                       t->name);
    const fr_tensor *s = &pl->s->tensors[*si];
    char b1[200], b2[200];
    if (fr_quant_agree(s, t, pl->err) < 0)
        return FERRY_EINVAL;
    if (strcmp(s->dtype, t->dtype) || s->itemsize != t->itemsize)
        return fr_fail(pl->err, FERRY_EINVAL, "tensor '%s': dtype %s (itemsize %u) in the source, %s (itemsize %u) in the target",
                       t->name, s->dtype, s->itemsize, t->dtype, t->itemsize);
    if (s->ndim != t->ndim || memcmp(s->shape, t->shape, t->ndim * sizeof(uint64_t)))
        return fr_fail(pl->err, FERRY_EINVAL, "tensor '%s': shape %s in the source, %s in the target", t->name,
                       fr_fmt_dims(b1, sizeof b1, s->shape, s->ndim), fr_fmt_dims(b2, sizeof b2, t->shape, t->ndim));
    return 0;
}

static int plan_tensor(planner *pl, uint32_t ti)
{
    ferry_plan *p = pl->p;
    const ferry_manifest *sm = pl->s, *tm = pl->t;
    const fr_tensor *t = &tm->tensors[ti];
    int64_t si;
    int rc = match_tensor(pl, ti, &si);
    if (rc < 0 || si < 0)
        return rc;
    p->tensors[ti].src_tensor = (uint32_t)si;
    p->tensors[ti].first_pair = p->npairs;
    uint32_t tg0 = tm->tg_start[ti], ntg = tm->tg_start[ti + 1] - tg0;
    if (!ntg)
        return 0;
    size_t cfirst, nc;
    bool full;
    rc = build_classes(pl, (uint32_t)si, &cfirst, &nc, &full);
    if (rc < 0)
        return rc;
    uint32_t sd = pl->sweep_dim;
    for (uint32_t k = 0; k < ntg; k++) {
        uint32_t tgi = tm->tg_list[tg0 + k];
        const fr_group *tg = &tm->groups[tgi];
        size_t fp = p->npairs;
        uint64_t ts = t->ndim ? G_OFF(tm, tg)[sd] : 0, te = t->ndim ? ts + G_EXT(tm, tg)[sd] : 1;
        size_t lo = 0, hi = nc;   /* first class whose prefix-max end passes ts */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (pl->pmax[mid] > ts)
                hi = mid;
            else
                lo = mid + 1;
        }
        for (size_t i = lo; i < nc; i++) {
            const fr_class *c = &p->classes[cfirst + i];
            const fr_group *sg = &sm->groups[c->rep];
            if (t->ndim && G_OFF(sm, sg)[sd] >= te)
                break;
            if (!boxes_overlap(tm, tg, sm, sg))
                continue;
            if (p->npairs >= pl->o.max_overlaps)
                return fr_fail(pl->err, FERRY_EMSGSIZE,
                               "tensor '%s': more than %llu split overlaps (max_overlaps)", t->name,
                               (unsigned long long)pl->o.max_overlaps);
            if (fr_grow((void **)&p->pairs, &p->pcap, p->npairs + 1, sizeof *p->pairs) < 0)
                return fr_fail(pl->err, FERRY_ENOMEM, "out of memory");
            uint64_t nr;
            if (count_regions(tm, tg, sm, sg, &nr) < 0 || fr_add_u64(p->stats.regions, nr, &p->stats.regions) < 0)
                return fr_fail(pl->err, FERRY_ERANGE, "tensor '%s': region count overflows", t->name);
            if (p->stats.regions > pl->o.max_regions)
                return fr_fail(pl->err, FERRY_EMSGSIZE,
                               "tensor '%s': the plan passes %llu regions (max_regions)", t->name,
                               (unsigned long long)pl->o.max_regions);
            p->pairs[p->npairs++] = (fr_pair){.tgroup = tgi, .sclass = (uint32_t)(cfirst + i), .nregions = nr};
        }
        if (!full) {
            rc = check_coverage(pl, t, tg, fp);
            if (rc < 0)
                return rc;
        }
    }
    p->tensors[ti].npairs = p->npairs - p->tensors[ti].first_pair;
    return 0;
}

/* Bytes per target rank and in total. */
static int rank_bytes(planner *pl)
{
    const ferry_manifest *m = pl->t;
    ferry_plan_stats *s = &pl->p->stats;
    uint64_t *per = fr_calloc(m->nranks, sizeof *per);
    if (!per)
        return fr_fail(pl->err, FERRY_ENOMEM, "out of memory");
    uint64_t idx[FR_MAXD], shape[FR_MAXD];
    for (size_t gi = 0; gi < m->ngroups; gi++) {
        const fr_group *g = &m->groups[gi];
        uint32_t isz = m->tensors[g->tensor].itemsize;
        for (uint64_t lin = 0; lin < g->ncells; lin++) {
            fr_group_piece(m, g, lin, idx, NULL, shape);
            uint64_t v = isz;
            for (uint32_t d = 0; d < g->ndim; d++)
                v *= shape[d];
            for (uint32_t k = 0; k < g->replicas; k++) {
                uint32_t r = fr_group_rank(m, g, idx, k);
                if (fr_add_u64(per[r], v, &per[r]) < 0 || fr_add_u64(s->bytes, v, &s->bytes) < 0) {
                    fr_free(per);
                    return fr_fail(pl->err, FERRY_ERANGE, "target byte count overflows");
                }
            }
        }
    }
    for (uint32_t r = 0; r < m->nranks; r++)
        if (per[r] > s->max_rank_bytes)
            s->max_rank_bytes = per[r];
    s->dst_ranks = m->nranks;
    s->mean_rank_bytes = (double)s->bytes / m->nranks;
    fr_free(per);
    return 0;
}

static int plan_all(planner *pl)
{
    ferry_plan *p = pl->p;
    ferry_plan_stats *s = &p->stats;
    s->src_fragments = pl->s->nfrags;
    s->dst_fragments = pl->t->nfrags;
    int rc = fr_plan_check_limits(p, &pl->o, pl->err);
    if (rc < 0)
        return rc;
    p->tensors = fr_calloc(pl->t->ntensors ? pl->t->ntensors : 1, sizeof *p->tensors);
    if (!p->tensors)
        return fr_fail(pl->err, FERRY_ENOMEM, "out of memory");
    for (uint32_t ti = 0; ti < pl->t->ntensors; ti++) {
        rc = plan_tensor(pl, ti);
        if (rc < 0)
            return rc;
        if (p->tensors[ti].npairs)
            s->tensors++;
    }
    /* Runs of two regions can only continue each other inside one store
     * object; when no object holds two fragments, runs = regions. */
    size_t bound = 0;
    for (size_t g = 0; g < pl->s->ngroups; g++)
        bound += pl->s->groups[g].object >= 0;
    bool shared = bound > pl->s->nobjects;
    rc = rank_bytes(pl);
    if (rc < 0)
        return rc;
    s->runs = s->regions;
    if (shared) {
        rc = fr_plan_count_runs(p, &s->runs);
        if (rc < 0)
            return fr_fail(pl->err, rc, "counting runs: %s", ferry_strerror(rc));
    }
    rc = ferry_manifest_digest(p->src, s->src_digest);
    if (rc == 0)
        rc = ferry_manifest_digest(p->dst, s->dst_digest);
    if (rc == 0)
        rc = fr_topology_pair_digest(p->src, p->dst, s->topology_digest);
    if (rc < 0)
        return fr_fail(pl->err, rc, "digest: %s", ferry_strerror(rc));
    return 0;
}

int ferry_plan_create(ferry_manifest *src, ferry_manifest *dst, const ferry_plan_options *opt,
                      ferry_plan **out, ferry_error *err)
{
    if (!src || !dst || !out)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    if (opt && !FR_RESERVED_OK(opt))
        return fr_fail(err, FERRY_EINVAL, "plan options: the reserved fields must be zero");
    uint64_t t0 = fr_now_ns();
    int rc = ferry_manifest_validate(src, err);
    if (rc == 0)
        rc = ferry_manifest_validate(dst, err);
    if (rc < 0)
        return rc;
    bool src_was = src->frozen, dst_was = dst->frozen;
    if (fr_manifest_freeze(src) < 0 || fr_manifest_freeze(dst) < 0) {
        if (!src_was)
            fr_manifest_thaw(src);
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    }
    ferry_plan *p = fr_calloc(1, sizeof *p);
    if (!p)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    atomic_init(&p->refs, 1);
    fr_manifest_ref(src);
    fr_manifest_ref(dst);
    p->src = src;
    p->dst = dst;
    planner pl = {.p = p, .err = err, .s = src, .t = dst};
    fr_plan_options_resolve(opt, &pl.o);
    rc = plan_all(&pl);
    fr_free(pl.pmax);
    fr_free(pl.active);
    fr_free(pl.order);
    if (rc < 0) {
        ferry_plan_free(p);
        /* A failed plan leaves the manifests as they were: the caller may
         * add what was missing and plan again. */
        if (!src_was)
            fr_manifest_thaw(src);
        if (!dst_was && dst != src)
            fr_manifest_thaw(dst);
        return rc;
    }
    p->stats.plan_s = (double)(fr_now_ns() - t0) * 1e-9;
    *out = p;
    return 0;
}
