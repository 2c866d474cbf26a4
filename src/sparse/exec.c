/* The sparse executor (sparse.h, docs/sparse.md "Execution", "Apply"):
 * compact indexes through a reader's cache (sparse_reader.c) or none (the
 * one-shot read), the batch plan, one ranged read per unique (source,
 * node, range) covering rows of both indices and values, fan-out to every
 * pair that needs the range, boundary filtering, rebasing to target-local
 * coordinates, optional publication; and the scatter apply with its
 * base-generation fence. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "sparse/sparse_int.h"

/* ---- one call's state ------------------------------------------------------------------ */

typedef struct sp_src {
    fr_sp_entry c;
    bool have;
} sp_src;

typedef struct sp_buf {
    void *indices, *values;    /* rows [start, end) of the read */
    uint64_t uses;
} sp_buf;

typedef struct sp_rkey {
    uint32_t source, node;
    uint64_t start;
    size_t read;
} sp_rkey;

typedef struct sp_call {
    ferry_store *s;
    ferry_sparse_reader *r;    /* whose cache serves the indexes; NULL: none */
    sp_src *src;
    size_t nsrc;
    ferry_sparse_index **ixs;
    ferry_sparse_plan plan;
    sp_buf *bufs;
    sp_rkey *order;            /* reads sorted by (source, node, start) */
    ferry_sparse_stats st;
} sp_call;

/* Bytes of an object's meta member: its canonical JSON, which the
 * decoded descriptor re-encodes to exactly. */
static uint64_t meta_bytes(const ferry_sparse_desc *d)
{
    char *text = NULL;
    size_t len = 0;
    if (fr_sparse_meta_encode(d, &text, &len) < 0)
        return 0;
    free(text);
    return len;
}

/* The text of key's failure: the one-key calls again (an error path only),
 * which say what went wrong in their own words. */
static int source_error(sp_call *c, const char *key, int rc, bool checked, ferry_error *err)
{
    ferry_object_desc od;
    int again = checked ? 0 : ferry_store_get_replica_desc(c->s, key, &od, err);
    if (again < 0)
        return fr_fail(err, again, "read_sparse_objects %s: %s", key, fr_why(err, again));
    if (checked) {
        fr_sp_entry e;
        again = fr_sparse_index_load(c->s, key, &e.ix, NULL, NULL, err);
        if (again < 0)
            return again;
        ferry_sparse_index_free(&e.ix);
    }
    return fr_fail(err, rc, "read_sparse_objects %s: %s", key, ferry_strerror(rc));
}

/* Every source checked against the store and its index taken from the
 * cache or read, all sources together: one batch of metadata checks, one
 * of member tables and one of index ranges for those the cache lacks (a
 * generation of a model is one object per changed tensor, hundreds; one
 * after another their round trips added up). */
static int get_sources(sp_call *c, const char *const *keys, size_t nkeys, ferry_error *err)
{
    size_t cap = nkeys ? nkeys : 1;
    c->src = fr_calloc(cap, sizeof *c->src);
    c->ixs = fr_calloc(cap, sizeof *c->ixs);
    const char **dk = fr_calloc(cap, sizeof *dk), **mk = fr_calloc(cap, sizeof *mk);
    ferry_object_desc *od = fr_calloc(cap, sizeof *od);
    int *chk = fr_calloc(cap, sizeof *chk), *lrc = fr_calloc(cap, sizeof *lrc);
    size_t *ms = fr_calloc(cap, sizeof *ms);
    ferry_sparse_index *mix = fr_calloc(cap, sizeof *mix);
    ferry_member *mi = fr_calloc(cap, sizeof *mi), *mv = fr_calloc(cap, sizeof *mv);
    int *mrc = fr_calloc(cap, sizeof *mrc);
    size_t n = 0, nm = 0;
    int rc = 0;
    if (!c->src || !c->ixs || !dk || !mk || !od || !chk || !lrc || !ms || !mix || !mi ||
        !mv || !mrc)
        rc = fr_fail(err, FERRY_ENOMEM, "read_sparse_objects: out of memory");
    for (size_t i = 0; rc == 0 && i < nkeys; i++) {   /* keys listed twice are read once */
        if (!keys[i]) {
            rc = fr_fail(err, FERRY_EINVAL, "read_sparse_objects: key %zu is NULL", i);
            break;
        }
        bool dup = false;
        for (size_t j = 0; j < n && !dup; j++)
            dup = strcmp(dk[j], keys[i]) == 0;
        if (!dup)
            dk[n++] = keys[i];
    }
    uint64_t t0 = fr_now_ns();
    if (rc == 0 && n) {
        c->nsrc = n;   /* call_end gives back every slot that took an entry */
        ferry_error e1;
        ferry_store_batch_get_replica_desc(c->s, dk, n, od, chk, &e1);   /* per key in chk */
        c->st.index_checks += n;
        for (size_t i = 0; i < n; i++) {
            if (chk[i] < 0)
                continue;
            if (fr_sp_cache_take(c->r, dk[i], &od[i], &c->src[i].c)) {
                c->src[i].have = true;
                c->st.index_cache_hits++;
                continue;
            }
            mk[nm] = dk[i];
            ms[nm++] = i;
        }
        rc = fr_sparse_index_load_many(c->s, mk, nm, mix, mi, mv, mrc);
        if (rc < 0)
            fr_fail(err, rc, "read_sparse_objects: out of memory");
        for (size_t q = 0; q < nm && rc == 0; q++) {
            size_t i = ms[q];
            if ((lrc[i] = mrc[q]) < 0)
                continue;
            fr_sp_entry *e = &c->src[i].c;
            e->ix = mix[q];
            e->mi = mi[q];
            e->mv = mv[q];
            e->size = od[i].size;
            e->segment = od[i].nreplicas ? od[i].replicas[0].segment : 0;
            e->offset = od[i].nreplicas ? od[i].replicas[0].offset : 0;
            e->bytes = e->ix.desc.ntiles * (e->ix.desc.ndim + 1) * 8 + sizeof *e;
            c->src[i].have = true;
            c->st.index_gets++;
            c->st.index_bytes_read += meta_bytes(&e->ix.desc) + e->ix.desc.ntiles * (e->ix.desc.ndim + 1) * 8 + 8;
        }
    }
    c->st.index_s += (double)(fr_now_ns() - t0) / 1e9;
    for (size_t i = 0; rc == 0 && i < n; i++) {   /* the first failure in key order */
        if (chk[i] < 0 || lrc[i] < 0) {
            rc = source_error(c, dk[i], chk[i] < 0 ? chk[i] : lrc[i], chk[i] == 0, err);
            break;
        }
        sp_src *e = &c->src[i];
        c->ixs[i] = &e->c.ix;
        c->st.source_objects++;
        c->st.non_ep_source_object_count += e->c.ix.desc.placement.kind == FERRY_SPARSE_REPLICATE;
    }
    fr_free(dk);
    fr_free(mk);
    fr_free(od);
    fr_free(chk);
    fr_free(lrc);
    fr_free(ms);
    fr_free(mix);
    fr_free(mi);
    fr_free(mv);
    fr_free(mrc);
    return rc;
}

static int rkey_cmp(const void *a, const void *b)
{
    const sp_rkey *x = a, *y = b;
    if (x->source != y->source)
        return x->source < y->source ? -1 : 1;
    if (x->node != y->node)
        return x->node < y->node ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* The read holding [start, end) of source on node, or SIZE_MAX. */
static size_t find_read(const sp_call *c, uint32_t source, uint32_t node, uint64_t start,
                        uint64_t end)
{
    size_t lo = 0, hi = c->plan.nreads;
    while (lo < hi) {   /* first read after (source, node, start) */
        size_t mid = lo + (hi - lo) / 2;
        const sp_rkey *r = &c->order[mid];
        bool le = r->source < source || (r->source == source && (r->node < node ||
                  (r->node == node && r->start <= start)));
        if (le)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return SIZE_MAX;
    size_t i = c->order[lo - 1].read;
    const ferry_sparse_read *r = &c->plan.reads[i];
    return r->source == source && r->node == node && r->start <= start && end <= r->end
               ? i : SIZE_MAX;
}

/* Rows of indices and values of every unique read: one batch of ranged
 * reads (two ranges a read), one master round trip for all. */
static int do_reads(sp_call *c, ferry_error *err)
{
    size_t n = c->plan.nreads;
    c->bufs = fr_calloc(n ? n : 1, sizeof *c->bufs);
    c->order = fr_calloc(n ? n : 1, sizeof *c->order);
    ferry_range *r = fr_calloc(2 * n + 1, sizeof *r);
    int64_t *res = fr_calloc(2 * n + 1, sizeof *res);
    int rc = 0;
    if (!c->bufs || !c->order || !r || !res) {
        rc = fr_fail(err, FERRY_ENOMEM, "read_sparse_objects: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const ferry_sparse_read *rd = &c->plan.reads[i];
        if (rd->source >= c->nsrc) {
            rc = fr_fail(err, FERRY_EPROTO, "read_sparse_objects: plan read %zu names source "
                         "%" PRIu32 " of %zu", i, rd->source, c->nsrc);
            goto out;
        }
        const fr_sp_entry *e = &c->src[rd->source].c;
        const ferry_sparse_desc *d = &e->ix.desc;
        if (rd->start >= rd->end || rd->end > d->nnz) {
            rc = fr_fail(err, FERRY_EPROTO, "read_sparse_objects %s: plan read [%" PRIu64
                         ", %" PRIu64 ") outside 0..%" PRIu64, e->ix.key, rd->start, rd->end,
                         d->nnz);
            goto out;
        }
        uint64_t rows = rd->end - rd->start;
        uint64_t irow = e->mi.nbytes / d->nnz, vrow = e->mv.nbytes / d->nnz;
        c->bufs[i].indices = fr_warm_alloc(rows * irow);
        c->bufs[i].values = fr_warm_alloc(rows * vrow);
        if (!c->bufs[i].indices || !c->bufs[i].values) {
            rc = fr_fail(err, FERRY_ENOMEM, "read_sparse_objects: out of memory for %" PRIu64
                         " entries", rows);
            goto out;
        }
        /* indices ranges first, values ranges after: two batches */
        r[i] = (ferry_range){e->ix.key, e->mi.offset + rd->start * irow, c->bufs[i].indices,
                             rows * irow};
        r[n + i] = (ferry_range){e->ix.key, e->mv.offset + rd->start * vrow, c->bufs[i].values,
                                 rows * vrow};
        c->st.index_range_gets++;
        c->st.index_range_bytes += rows * irow;
        c->st.value_range_bytes += rows * vrow;
        c->order[i] = (sp_rkey){rd->source, rd->node, rd->start, i};
        c->st.unique_range_gets++;
        c->st.full_indices_values_get_count += rd->start == 0 && rd->end == d->nnz;
        c->st.bytes_read += rows * (irow + vrow);
        c->st.entries_read += rows;
    }
    /* The coordinates and the values in two batches (one master round trip
     * each), so that each is timed on its own. */
    for (int part = 0; part < 2 && n; part++) {
        uint64_t t0 = fr_now_ns();
        rc = ferry_store_get_into_ranges(c->s, r + part * n, n, res + part * n, err);
        double dt = (double)(fr_now_ns() - t0) / 1e9;
        *(part ? &c->st.value_range_s : &c->st.index_range_s) = dt;
        c->st.read_s += dt;
        if (rc < 0) {
            fr_fail(err, rc, "read_sparse_objects: ranged read of the %s: %s",
                    part ? "values" : "indices", fr_why(err, rc));
            goto out;
        }
    }
    for (size_t i = 0; i < 2 * n; i++)
        if ((uint64_t)res[i] != r[i].len) {
            rc = fr_fail(err, FERRY_EPROTO, "read_sparse_objects %s: short ranged read",
                         r[i].key);
            goto out;
        }
    qsort(c->order, n, sizeof *c->order, rkey_cmp);
out:
    fr_free(r);
    fr_free(res);
    return rc;
}

/* Rows [r0, r1) of a read: the entries inside the box (lo, ext) kept,
 * rebased to it and appended at dst/vdst; returns how many. Branch-free
 * (each entry is written, then counted only when kept: dst has room for
 * every row) and inlined with constant index, value and rank sizes, so the
 * common layouts compile to straight loads and compares: a column-sharded
 * target filters every entry of every row it meets. */
static inline __attribute__((always_inline)) uint64_t
filter_rows_k(const uint8_t *ix, size_t isz, const uint8_t *vals, size_t vsz, uint32_t ndim,
              uint64_t r0, uint64_t r1, const uint64_t *lo, const uint64_t *ext, int64_t *dst,
              uint8_t *vdst)
{
    uint64_t o = 0;
    for (uint64_t row = r0; row < r1; row++) {
        bool keep = true;
        for (uint32_t k = 0; k < ndim; k++) {
            uint64_t x = (uint64_t)fr_sp_coord(ix, isz, row, ndim, k) - lo[k];
            keep &= x < ext[k];   /* below lo wraps around: out too */
            dst[o * ndim + k] = (int64_t)x;
        }
        memcpy(vdst + o * vsz, vals + row * vsz, vsz);
        o += keep;
    }
    return o;
}

static uint64_t filter_rows(const void *ix, size_t isz, const void *vals, size_t vsz,
                            uint32_t ndim, uint64_t r0, uint64_t r1, const uint64_t *lo,
                            const uint64_t *ext, int64_t *dst, uint8_t *vdst)
{
#define FR_FILTER(I, V, N) \
    if (isz == (I) && vsz == (V) && ndim == (N)) \
        return filter_rows_k(ix, I, vals, V, N, r0, r1, lo, ext, dst, vdst)
    FR_FILTER(8, 2, 2);
    FR_FILTER(8, 4, 2);
    FR_FILTER(4, 2, 2);
    FR_FILTER(4, 4, 2);
    FR_FILTER(8, 2, 1);
    FR_FILTER(8, 4, 1);
#undef FR_FILTER
    return filter_rows_k(ix, isz, vals, vsz, ndim, r0, r1, lo, ext, dst, vdst);
}

/* One (source, target) pair: its ranges out of the reads, filtered and
 * rebased. */
static int make_result(sp_call *c, const ferry_sparse_pair *p, const ferry_sparse_target *t,
                       ferry_sparse_result *res, ferry_error *err)
{
    const fr_sp_entry *e = &c->src[p->source].c;
    const ferry_sparse_desc *d = &e->ix.desc;
    size_t isz = fr_sp_index_size(d->index_dtype), vsz = fr_sp_value_size(d->value_dtype);
    res->target = p->target;
    snprintf(res->tensor_id, sizeof res->tensor_id, "%s", d->tensor_id);
    res->ndim = d->ndim;
    memcpy(res->shape, t->shape, sizeof res->shape);
    res->base_generation = d->base_generation;
    res->delta_generation = d->delta_generation;
    res->apply = d->apply;
    snprintf(res->value_dtype, sizeof res->value_dtype, "%s", d->value_dtype);
    uint64_t cap = 0;
    for (size_t j = 0; j < p->n; j++) {
        const ferry_sparse_range *g = &c->plan.ranges[p->first + j];
        cap += g->end - g->start;
    }
    if (cap == 0)
        return 0;
    res->indices = fr_warm_alloc(cap * d->ndim * sizeof(int64_t));   /* ferry_sparse_results_free */
    res->values = fr_warm_alloc(cap * vsz);
    if (!res->indices || !res->values)
        return fr_fail(err, FERRY_ENOMEM, "read_sparse_objects: out of memory");
    uint64_t lo[FERRY_SPARSE_NDIM_MAX], ext[FERRY_SPARSE_NDIM_MAX], o = 0;
    for (uint32_t k = 0; k < d->ndim; k++) {
        lo[k] = t->offset[k];
        ext[k] = t->shape[k];
    }
    for (size_t j = 0; j < p->n; j++) {
        const ferry_sparse_range *g = &c->plan.ranges[p->first + j];
        size_t ri = find_read(c, p->source, t->node, g->start, g->end);
        if (ri == SIZE_MAX)
            return fr_fail(err, FERRY_EPROTO, "read_sparse_objects %s: the plan has no read "
                           "for range [%" PRIu64 ", %" PRIu64 ") of target %" PRIu32,
                           e->ix.key, g->start, g->end, p->target);
        sp_buf *b = &c->bufs[ri];
        c->st.dedup_hits += b->uses++ > 0;
        uint64_t base = c->plan.reads[ri].start;
        if (!g->boundary) {   /* every entry kept: rebased in a tight loop, values in one copy */
            uint64_t r0 = g->start - base, cnt = g->end - g->start;
            int64_t *dst = res->indices + o * d->ndim;
            if (isz == 4)
                for (uint64_t i = 0; i < cnt; i++)
                    for (uint32_t k = 0; k < d->ndim; k++)
                        dst[i * d->ndim + k] = fr_sp_coord(b->indices, 4, r0 + i, d->ndim, k) -
                                               (int64_t)lo[k];
            else
                for (uint64_t i = 0; i < cnt; i++)
                    for (uint32_t k = 0; k < d->ndim; k++)
                        dst[i * d->ndim + k] = fr_sp_coord(b->indices, 8, r0 + i, d->ndim, k) -
                                               (int64_t)lo[k];
            memcpy((uint8_t *)res->values + o * vsz, (const uint8_t *)b->values + r0 * vsz,
                   cnt * vsz);
            o += cnt;
            continue;
        }
        uint64_t kept = filter_rows(b->indices, isz, b->values, vsz, d->ndim, g->start - base,
                                    g->end - base, lo, ext, res->indices + o * d->ndim,
                                    (uint8_t *)res->values + o * vsz);
        c->st.boundary_filtered += (g->end - g->start) - kept;
        o += kept;
    }
    res->nnz = o;
    c->st.entries_kept += o;
    return 0;
}

static int publish(ferry_store *s, const char *prefix, const ferry_sparse_result *r,
                   ferry_error *err)
{
    char key[FERRY_STORE_KEY_MAX + 1];
    int n = snprintf(key, sizeof key, "%s/%" PRIu32 "/%s", prefix, r->target, r->tensor_id);
    if (n < 0 || (size_t)n >= sizeof key)
        return fr_fail(err, FERRY_EINVAL, "read_sparse_objects: publish key too long");
    json_t *shape = json_array();
    for (uint32_t k = 0; k < r->ndim; k++)
        json_array_append_new(shape, json_integer((json_int_t)r->shape[k]));
    json_t *j = json_pack("{s:s, s:i, s:s, s:s, s:I, s:o, s:I, s:I, s:s, s:s, s:I}",
                          "schema", "ferry.sparse_local", "version", 1, "tensor_id", r->tensor_id,
                          "coordinate_space", "local", "target", (json_int_t)r->target,
                          "shape", shape, "base_generation", (json_int_t)r->base_generation,
                          "delta_generation", (json_int_t)r->delta_generation,
                          "apply", r->apply == FERRY_SPARSE_SCATTER_SET ? "scatter_set"
                                                                        : "scatter_add",
                          "value_dtype", r->value_dtype, "nnz", (json_int_t)r->nnz);
    char *meta = j ? fr_json_dump_canonical(j) : NULL;
    json_decref(j);
    if (!meta)
        return fr_fail(err, FERRY_ENOMEM, "read_sparse_objects: out of memory");
    ferry_member m[3];
    memset(m, 0, sizeof m);
    snprintf(m[0].name, sizeof m[0].name, "meta");
    snprintf(m[0].dtype, sizeof m[0].dtype, "u8");
    m[0].ndim = 1;
    m[0].shape[0] = strlen(meta);
    snprintf(m[1].name, sizeof m[1].name, "indices");
    snprintf(m[1].dtype, sizeof m[1].dtype, "i64");
    m[1].ndim = 2;
    m[1].shape[0] = r->nnz;
    m[1].shape[1] = r->ndim;
    snprintf(m[2].name, sizeof m[2].name, "values");
    snprintf(m[2].dtype, sizeof m[2].dtype, "%s", r->value_dtype);
    m[2].ndim = 1;
    m[2].shape[0] = r->nnz;
    const void *data[3] = {meta, r->indices, r->values};
    ferry_replicate_config rc = {.replica_num = 1, .hard_pin = true};
    int st = ferry_store_put_struct(s, key, m, data, 3, &rc, err);
    free(meta);
    if (st < 0)
        return fr_fail(err, st, "read_sparse_objects: publish %s: %s", key,
                       fr_why(err, st));
    return 0;
}

static void call_end(sp_call *c)
{
    for (size_t i = 0; i < c->plan.nreads && c->bufs; i++) {
        fr_warm_free(c->bufs[i].indices);
        fr_warm_free(c->bufs[i].values);
    }
    fr_free(c->bufs);
    fr_free(c->order);
    ferry_sparse_plan_free(&c->plan);
    for (size_t i = 0; i < c->nsrc; i++)
        if (c->src[i].have)
            fr_sp_cache_put(c->r, &c->src[i].c);
    fr_free(c->src);
    fr_free(c->ixs);
}

/* One read, through r's cache (NULL: no cache). */
static int read_objects(ferry_store *s, ferry_sparse_reader *r, const char *const *keys,
                        size_t nkeys, const ferry_sparse_target *targets, size_t ntargets,
                        const char *publish_prefix, ferry_sparse_result **out, size_t *nout,
                        ferry_sparse_stats *st, ferry_error *err)
{
    if (!s || (nkeys && !keys) || (ntargets && !targets) || !out || !nout)
        return fr_fail(err, FERRY_EINVAL, "read_sparse_objects: %s, keys, targets and out "
                       "are required", r ? "reader" : "store");
    *out = NULL;
    *nout = 0;
    sp_call c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.r = r;
    ferry_sparse_result *res = NULL;
    size_t nres = 0;
    int rc = get_sources(&c, keys, nkeys, err);
    if (rc == 0)
        rc = ferry_sparse_plan_batch(c.ixs, c.nsrc, targets, ntargets, &c.plan, err);
    if (rc < 0)
        goto fail;
    c.st.plan_s = c.plan.stats.plan_s;
    if ((rc = do_reads(&c, err)) < 0)
        goto fail;
    uint64_t t0 = fr_now_ns();
    res = fr_calloc(c.plan.npairs ? c.plan.npairs : 1, sizeof *res);
    if (!res) {
        rc = fr_fail(err, FERRY_ENOMEM, "read_sparse_objects: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < c.plan.npairs; i++) {
        const ferry_sparse_pair *p = &c.plan.pairs[i];
        if (p->source >= c.nsrc || p->target >= ntargets ||
            p->first + p->n > c.plan.nranges) {
            rc = fr_fail(err, FERRY_EPROTO, "read_sparse_objects: plan pair %zu is malformed",
                         i);
            goto fail;
        }
        nres++;
        if ((rc = make_result(&c, p, &targets[p->target], &res[i], err)) < 0)
            goto fail;
    }
    c.st.filter_s = (double)(fr_now_ns() - t0) / 1e9;
    for (size_t i = 0; i < nres && publish_prefix; i++)
        if ((rc = publish(s, publish_prefix, &res[i], err)) < 0)
            goto fail;
    if (st)
        *st = c.st;
    call_end(&c);
    *out = res;
    *nout = nres;
    return 0;
fail:
    if (st)
        *st = c.st;
    ferry_sparse_results_free(res, nres);
    call_end(&c);
    return rc;
}

int ferry_sparse_reader_read(ferry_sparse_reader *r, const char *const *keys, size_t nkeys,
                             const ferry_sparse_target *targets, size_t ntargets,
                             const char *publish_prefix, ferry_sparse_result **out, size_t *nout,
                             ferry_sparse_stats *st, ferry_error *err)
{
    if (!r)
        return fr_fail(err, FERRY_EINVAL, "read_sparse_objects: reader, keys, targets and out "
                       "are required");
    return read_objects(fr_sp_reader_store(r), r, keys, nkeys, targets, ntargets, publish_prefix,
                        out, nout, st, err);
}

int ferry_read_sparse_objects(ferry_store *s, const char *const *keys, size_t nkeys,
                              const ferry_sparse_target *targets, size_t ntargets,
                              const char *publish_prefix, ferry_sparse_result **out,
                              size_t *nout, ferry_sparse_stats *st, ferry_error *err)
{
    return read_objects(s, NULL, keys, nkeys, targets, ntargets, publish_prefix, out, nout, st,
                        err);
}

void ferry_sparse_results_free(ferry_sparse_result *r, size_t n)
{
    if (!r)
        return;
    for (size_t i = 0; i < n; i++) {
        fr_warm_free(r[i].indices);
        fr_warm_free(r[i].values);
    }
    fr_free(r);
}

void ferry_sparse_stats_add(ferry_sparse_stats *sum, const ferry_sparse_stats *x)
{
    if (!sum || !x)
        return;
    sum->source_objects += x->source_objects;
    sum->non_ep_source_object_count += x->non_ep_source_object_count;
    sum->index_gets += x->index_gets;
    sum->index_cache_hits += x->index_cache_hits;
    sum->unique_range_gets += x->unique_range_gets;
    sum->full_indices_values_get_count += x->full_indices_values_get_count;
    sum->dedup_hits += x->dedup_hits;
    sum->bytes_read += x->bytes_read;
    sum->entries_read += x->entries_read;
    sum->entries_kept += x->entries_kept;
    sum->boundary_filtered += x->boundary_filtered;
    sum->plan_s += x->plan_s;
    sum->read_s += x->read_s;
    sum->filter_s += x->filter_s;
    sum->index_checks += x->index_checks;
    sum->index_bytes_read += x->index_bytes_read;
    sum->index_s += x->index_s;
    sum->index_range_gets += x->index_range_gets;
    sum->index_range_bytes += x->index_range_bytes;
    sum->value_range_bytes += x->value_range_bytes;
    sum->index_range_s += x->index_range_s;
    sum->value_range_s += x->value_range_s;
}
