/* Updating a rollout worker from the active generation by reading its own
 * demand from the store (weights.h): parameter-direct and compatibility. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "rl/rl_int.h"



static double now_s(void)
{
    return (double)fr_now_ns() / 1e9;
}

static int prepare_once(ferry_store *s, const char *model, uint64_t *generation,
                        ferry_weight_manifest *m, bool *current, ferry_error *err);

/* The active generation and its manifest, unless *generation is current. */
int fr_rl_prepare(ferry_store *s, const char *model, uint64_t *generation,
                  ferry_weight_manifest *m, bool *current, ferry_update_stats *st,
                  ferry_error *err)
{
    double t0 = now_s();
    int rc = prepare_once(s, model, generation, m, current, err);
    st->generation = *generation;
    st->prepare_s = now_s() - t0;
    return rc;
}

static int prepare_once(ferry_store *s, const char *model, uint64_t *generation,
                        ferry_weight_manifest *m, bool *current, ferry_error *err)
{
    uint64_t active = 0;
    *current = false;
    int rc = fr_rl_active_read(s, model, &active, NULL);
    if (rc < 0)
        return fr_rl_fail(err, rc, "no generation of %s is active (%s)", model, ferry_strerror(rc));
    if (active == *generation) {
        *current = true;
        return 0;
    }
    rc = ferry_weights_manifest(s, model, active, m, err);
    if (rc < 0)
        return rc;
    /* Every object must be there (and leased) before a parameter is touched. */
    rc = fr_gen_lease_all(s, fr_gen_of(m), err);
    if (rc < 0)
        ferry_weight_manifest_free(m);
    return rc;
}

/* ---- parameter-direct ----------------------------------------------------------------- */

int fr_rl_target(const fr_gen *g, const ferry_param_shard *shards, size_t n, uint32_t ranks,
                 const uint32_t *rank_of, ferry_manifest **out, size_t **shard_of,
                 ferry_error *err)
{
    *out = NULL;
    *shard_of = malloc((n ? n : 1) * sizeof **shard_of);
    if (!*shard_of)
        return fr_rl_fail(err, FERRY_ENOMEM, "out of memory");
    size_t nf = 0;
    ferry_manifest *t = NULL;
    int rc = ferry_manifest_create(ranks ? ranks : 1, NULL, 1, &t);
    uint32_t nt = ferry_manifest_tensor_count(g->m);
    for (uint32_t i = 0; i < nt && rc >= 0; i++) {
        ferry_tensor_desc d;
        rc = ferry_manifest_tensor(g->m, i, &d);
        if (rc == 0)
            rc = ferry_manifest_add_tensor(t, &d, err);
    }
    for (size_t i = 0; i < n && rc >= 0; i++) {
        const ferry_param_shard *p = &shards[i];
        int ti = ferry_manifest_find_tensor(g->m, p->tensor ? p->tensor : "");
        if (ti < 0) {
            rc = fr_rl_fail(err, FERRY_ENOENT, "tensor %s is not in generation %" PRIu64 " of %s",
                            p->tensor ? p->tensor : "(null)", g->generation, g->model);
            break;
        }
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(g->m, (uint32_t)ti, &d);
        if (p->ndim != d.ndim) {
            rc = fr_rl_fail(err, FERRY_EINVAL, "shard of %s has %u dims, the tensor %u", d.name,
                            p->ndim, d.ndim);
            break;
        }
        if ((rc = fr_rl_shard_check(p, &d, NULL, err)) < 0)   /* a buffer too small */
            break;
        ferry_fragment f = { .tensor = (uint32_t)ti, .rank = rank_of ? rank_of[i] : 0 };
        bool strided = false, empty = false;
        for (uint32_t k = 0; k < d.ndim; k++) {
            if (p->offset[k] > d.shape[k] || p->shape[k] > d.shape[k] - p->offset[k]) {
                rc = fr_rl_fail(err, FERRY_ERANGE, "shard of %s: dim %u [%" PRIu64 ", +%" PRIu64
                                ") outside %" PRIu64, d.name, k, p->offset[k], p->shape[k],
                                d.shape[k]);
                break;
            }
            if (p->strides[k] < 0) {
                rc = fr_rl_fail(err, FERRY_EINVAL, "shard of %s: negative stride", d.name);
                break;
            }
            f.offset[k] = p->offset[k];
            f.shape[k] = p->shape[k];
            f.strides[k] = (uint64_t)p->strides[k];
            strided |= p->strides[k] != 0;
            empty |= p->shape[k] == 0;
        }
        if (rc < 0)
            break;
        if (empty)   /* nothing of the tensor: an empty box is no fragment */
            continue;
        f.has_strides = strided;
        for (uint32_t k = 0; strided && k < d.ndim; k++)
            if (f.strides[k] == 0)
                f.strides[k] = p->shape[k] == 1 ? 1 : 0;   /* extent 1: any stride */
        rc = ferry_manifest_add_fragment(t, &f, err);
        if (rc < 0 && err)
            fr_rl_fail(err, rc, "shard %zu of %s: %s", i, d.name, err->msg);
        else
            (*shard_of)[nf++] = i;
    }
    if (rc < 0) {
        ferry_manifest_close(t);
        free(*shard_of);
        *shard_of = NULL;
        return rc;
    }
    *out = t;
    return 0;
}

int ferry_weights_update_direct(ferry_store *s, const char *model, uint64_t *generation,
                                const ferry_param_shard *shards, size_t n,
                                ferry_update_stats *st, ferry_error *err)
{
    ferry_update_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!s || !model || !generation || (n && !shards))
        return fr_rl_fail(err, FERRY_EINVAL, "update: bad arguments");
    ferry_weight_manifest m = {0};
    bool current = false;
    int rc = fr_rl_prepare(s, model, generation, &m, &current, st, err);
    if (rc < 0 || current)
        return rc;
    fr_gen *g = fr_gen_of(&m);
    ferry_manifest *tgt = NULL;
    ferry_plan *plan = NULL;
    ferry_plan_iter *it = NULL;
    fr_gread *v = NULL;
    size_t nv = 0, cap = 0, *shard_of = NULL;
    rc = fr_rl_target(g, shards, n, 1, NULL, &tgt, &shard_of, err);
    if (rc == 0)
        rc = ferry_plan_create(g->m, tgt, NULL, &plan, err);
    if (rc == 0)
        rc = ferry_plan_iter_open(plan, NULL, &it);
    ferry_run run;
    while (rc == 0 && (rc = ferry_plan_iter_next_run(it, &run)) == 1)
        rc = fr_gread_add(&v, &nv, &cap, &run, shards[shard_of[run.dst_fragment]].dst);
    ferry_plan_iter_close(it);
    if (rc < 0 && err && !err->msg[0])
        fr_rl_fail(err, rc, "update: planning: %s", ferry_strerror(rc));
    st->tensors = n;
    double t1 = now_s();
    if (rc == 0) {
        ferry_error e = {0};
        rc = fr_gread_run(s, g, v, nv, &st->bytes_read, &e);
        st->ranges = nv;
        if (rc < 0)   /* the parameters may be partly written */
            rc = fr_rl_fail(err, FERRY_EREBUILD, "%s; the parameters must be rebuilt", e.msg);
    }
    st->read_s = now_s() - t1;
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
    }
    free(v);
    free(shard_of);
    ferry_plan_free(plan);
    ferry_manifest_close(tgt);
    ferry_weight_manifest_free(&m);
    return rc;
}

/* ---- compatibility --------------------------------------------------------------------- */

int ferry_weights_update_compat(ferry_store *s, const char *model, uint64_t *generation,
                                ferry_weights_tensor_fn fn, void *ctx, ferry_update_stats *st,
                                ferry_error *err)
{
    ferry_update_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!s || !model || !generation || !fn)
        return fr_rl_fail(err, FERRY_EINVAL, "update: bad arguments");
    ferry_weight_manifest m = {0};
    bool current = false;
    int rc = fr_rl_prepare(s, model, generation, &m, &current, st, err);
    if (rc < 0 || current)
        return rc;
    double t1 = now_s();
    void *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; rc == 0 && i < m.n; i++) {
        const ferry_weight_entry *e = &m.entries[i];
        if (e->bytes > cap) {
            void *nb = realloc(buf, e->bytes);
            if (!nb) {
                rc = fr_rl_fail(err, FERRY_ENOMEM, "tensor %s: cannot allocate %" PRIu64 " bytes",
                          e->name, e->bytes);
                break;
            }
            buf = nb;
            cap = e->bytes;
        }
        rc = ferry_weights_read(s, e, buf, cap, err);
        if (rc == 0) {
            st->bytes_read += e->bytes;
            st->ranges++;
            st->tensors++;
            rc = fn(ctx, e, buf);
            if (rc != 0)
                fr_rl_fail(err, rc, "the loader stopped at tensor %s (%d)", e->name, rc);
        }
    }
    free(buf);
    st->read_s = now_s() - t1;
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
    }
    ferry_weight_manifest_free(&m);
    return rc;
}
