/* Store reads (exec.h, "store reads"): a plan whose source is a stored
 * generation, executed by the target as strided store reads straight into
 * its bound memory. Lowering is pure and done once per plan (a rollout
 * group reuses it across generations); a run resolves object keys through
 * the caller, checks the target binding against the attestation, reads in
 * bounded store calls and reports the engine contract's states. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "exec/exec_int.h"


void ferry_store_reads_free(ferry_store_reads *r)
{
    if (!r)
        return;
    free(r->v);
    memset(r, 0, sizeof *r);
}

static bool selected(const uint32_t *w, size_t n, uint32_t worker)
{
    for (size_t i = 0; i < n; i++)
        if (w[i] == worker)
            return true;
    return false;
}

/* The planner computes a run's target offset from the placement
 * fragment's layout; the binding must lay the box out the same way. */
static int same_layout(const ferry_fragment *f, const ferry_binding_entry *e, uint32_t ndim,
                       ferry_error *err)
{
    uint64_t dense = 1;
    for (uint32_t k = ndim; k-- > 0;) {
        uint64_t want = f->has_strides ? f->strides[k] : dense;
        if (f->shape[k] > 1 && e->strides[k] != want)
            return fr_fail(err, FERRY_EINVAL, "store lower: target fragment %" PRIu64
                           ": the binding's stride on dim %u is %" PRIu64 ", the placement's %"
                           PRIu64, e->fragment, k, e->strides[k], want);
        dense *= f->shape[k];
    }
    if (e->storage_offset != f->storage_offset)
        return fr_fail(err, FERRY_EINVAL, "store lower: target fragment %" PRIu64
                       ": the binding's storage offset is %" PRIu64 ", the placement's %"
                       PRIu64, e->fragment, e->storage_offset, f->storage_offset);
    return 0;
}

/* Append the reads of one run: its innermost loop in the rows, the outer
 * ones unrolled. */
static int add_run(ferry_store_reads *o, const ferry_run *run, uint64_t base)
{
    uint32_t outer = run->nouter ? run->nouter - 1 : 0;
    uint64_t reps = 1, ctr[FERRY_MAX_DIMS] = {0};
    for (uint32_t i = 0; i < outer; i++)
        reps *= run->count[i];
    if (fr_grow((void **)&o->v, &o->cap, o->n + reps, sizeof *o->v) < 0)
        return FERRY_ENOMEM;
    for (uint64_t r = 0; r < reps; r++) {
        uint64_t so = run->src_offset, dof = run->dst_offset;
        for (uint32_t i = 0; i < outer; i++) {
            so += ctr[i] * run->src_stride[i];
            dof += ctr[i] * run->dst_stride[i];
        }
        ferry_store_read *x = &o->v[o->n++];
        *x = (ferry_store_read){ .src_fragment = run->src_fragment,
                                 .dst_fragment = run->dst_fragment, .key = run->src_object,
                                 .src_offset = so, .dst = (void *)(uintptr_t)(base + dof),
                                 .len = run->len, .count = 1 };
        if (run->nouter) {
            x->count = run->count[outer];
            x->src_stride = run->src_stride[outer];
            x->dst_stride = run->dst_stride[outer];
        }
        o->bytes += x->len * x->count;
        for (int i = (int)outer - 1; i >= 0 && ++ctr[i] == run->count[i]; i--)
            ctr[i] = 0;
    }
    return 0;
}

int ferry_exec_store_lower(const ferry_attested_plan *a, const ferry_binding *dst,
                           const uint32_t *workers, size_t nworkers,
                           const ferry_plan_filter *filter, ferry_store_reads *out,
                           ferry_error *err)
{
    if (!a || !dst || !out || (nworkers && !workers))
        return fr_fail(err, FERRY_EINVAL, "store lower: plan, binding and output are required");
    if (nworkers == 0)
        return fr_fail(err, FERRY_EINVAL, "store lower: the worker selector is empty");
    int rc = ferry_attested_check(a, NULL, dst, err);
    if (rc < 0)
        return rc;
    const ferry_plan *p = ferry_attested_plan_get(a);
    const ferry_manifest *tm = ferry_plan_dst(p);
    size_t n0 = out->n;
    uint64_t b0 = out->bytes;
    ferry_plan_iter *it = NULL;
    rc = ferry_plan_iter_open(p, filter, &it);
    if (rc < 0)
        return fr_fail(err, rc, "store lower: %s", ferry_strerror(rc));
    ferry_run run;
    uint64_t last = UINT64_MAX, base = 0;
    bool take = false;
    while ((rc = ferry_plan_iter_next_run(it, &run)) == 1) {
        if (run.dst_fragment != last) {   /* runs come target fragment by target fragment */
            last = run.dst_fragment;
            const ferry_binding_entry *e = ferry_binding_find(dst, last);
            take = e && selected(workers, nworkers, e->worker);
            if (!take)
                continue;   /* another worker's fragment */
            ferry_fragment f;
            ferry_tensor_desc d;
            rc = ferry_manifest_fragment(tm, last, &f);
            if (rc == 0)
                rc = ferry_manifest_tensor(tm, f.tensor, &d);
            if (rc < 0) {
                fr_fail(err, rc, "store lower: fragment %" PRIu64 ": %s", last,
                        ferry_strerror(rc));
                break;
            }
            if ((rc = same_layout(&f, e, d.ndim, err)) < 0)
                break;
            base = e->addr;
        }
        if (take && (rc = add_run(out, &run, base)) < 0) {
            fr_fail(err, rc, "store lower: out of memory");
            break;
        }
    }
    ferry_plan_iter_close(it);
    if (rc == 0)
        fr_binding_layout_digest(dst, out->layout);
    if (rc < 0) {
        if (err && !err->msg[0])
            fr_fail(err, rc, "store lower: %s", ferry_strerror(rc));
        out->n = n0;
        out->bytes = b0;
        return rc;
    }
    return 0;
}

/* One store call over reads v[0..k): keys resolved, every count checked. */
static int one_call(const ferry_store_exec_config *cfg, const ferry_store_read *v, size_t k,
                    ferry_strided_range *r, int64_t *res, bool *called, ferry_error *err)
{
    for (size_t i = 0; i < k; i++) {
        const ferry_store_read *x = &v[i];
        const char *key = x->key;
        uint64_t off = 0;
        if (!key && (!cfg->locate || cfg->locate(cfg->locate_ctx, x->src_fragment, &key, &off) < 0 ||
                     !key))
            return fr_fail(err, FERRY_EPROTO, "store read: source fragment %" PRIu64
                           " is not stored in this generation", x->src_fragment);
        r[i] = (ferry_strided_range){ .key = key, .src_offset = off + x->src_offset, .dst = x->dst,
                                      .len = x->len, .count = x->count,
                                      .src_stride = x->src_stride, .dst_stride = x->dst_stride };
    }
    *called = true;
    (void)ferry_store_get_into_strided(cfg->store, r, k, res, err);
    for (size_t i = 0; i < k; i++) {
        uint64_t want = r[i].len * (r[i].count ? r[i].count : 1);
        if (res[i] == (int64_t)want)
            continue;
        return fr_fail(err, res[i] < 0 ? (int)res[i] : FERRY_EIO,
                       "reading %s at %" PRIu64 " failed: %s", r[i].key, r[i].src_offset,
                       res[i] < 0 ? fr_why(err, (int)res[i]) : "short read");
    }
    return 0;
}

int ferry_exec_store_run(const ferry_store_exec_config *cfg, const ferry_attested_plan *a,
                         const ferry_binding *dst, const ferry_store_reads *r, size_t from,
                         size_t to, ferry_exec_result *res, ferry_error *err)
{
    if (!res)
        return fr_fail(err, FERRY_EINVAL, "store read: a result is required");
    memset(res, 0, sizeof *res);
    res->state = FERRY_TICKET_ABORTED;
    if (!cfg || !cfg->store || !a || !dst || !r || from > to || to > r->n)
        return res->error = fr_fail(err, FERRY_EINVAL, "store read: bad arguments");
    if (!FR_RESERVED_OK(cfg))
        return res->error = fr_fail(err, FERRY_EINVAL, "store read: the config's reserved "
                                    "fields must be zero (start from "
                                    "ferry_store_exec_config_init)");
    int rc = ferry_attested_check(a, NULL, dst, err);
    if (rc < 0)
        return res->error = rc;
    uint8_t lay[16];
    fr_binding_layout_digest(dst, lay);
    if (memcmp(lay, r->layout, 16) != 0)
        return res->error = fr_fail(err, FERRY_ESTALE, "store read: the reads were lowered "
                                    "for other binding entries than the target's");
    for (size_t i = from; i < to; i++)
        res->bytes += r->v[i].len * r->v[i].count;
    res->ops = to - from;
    ferry_store_exec_config conf = *cfg;
    fr_store_exec_config_resolve(&conf);
    size_t batch = conf.max_reads;
    if (batch > to - from)
        batch = to - from;
    ferry_strided_range *rg = malloc((batch ? batch : 1) * sizeof *rg);
    int64_t *out = malloc((batch ? batch : 1) * sizeof *out);
    if (!rg || !out) {
        free(rg), free(out);
        return res->error = fr_fail(err, FERRY_ENOMEM, "store read: out of memory");
    }
    bool called = false;
    for (size_t at = from; at < to && rc == 0; at += batch) {
        size_t k = to - at < batch ? to - at : batch;
        bool c = false;
        rc = one_call(cfg, r->v + at, k, rg, out, &c, err);
        called |= c;
        res->batches++;
        if (rc == 0)
            for (size_t i = 0; i < k; i++)
                res->bytes_done += (uint64_t)out[i];
    }
    free(rg);
    free(out);
    res->error = rc;
    if (rc == 0)
        res->state = FERRY_TICKET_COMPLETED;
    else if (rc == FERRY_ETIMEDOUT && called)
        res->state = FERRY_TICKET_UNKNOWN;   /* a read may still land */
    else if (called)
        res->state = FERRY_TICKET_FAILED_DRAINED;
    return rc;
}
