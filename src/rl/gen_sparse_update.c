/* Following the active chain (weights.h ferry_sparse_update, docs/sparse.md
 * "Sparse generations"): resolve what the worker needs, read every link's
 * entries for its boxes and check every fence and every view before the
 * first write, then load the dense generation (when the rule says so)
 * and apply the deltas in order into the shards' views. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/gen_int.h"
#include "rl/rl_int.h"

typedef struct upd {
    ferry_store *s;
    ferry_sparse_reader *rd;         /* the chain's reads: each link's objects are new keys,
                                      * so a cache kept past the call would serve only a
                                      * worker that reads a chain again */
    const ferry_sparse_update_config *cfg;
    const ferry_param_shard *shards;
    size_t n;
    fr_gen *dense;
    ferry_sparse_chain ch;
    ferry_sparse_view *views;        /* per shard */
    ferry_sparse_target *targets;    /* per non-empty shard */
    size_t *shard_of, ntargets;
    ferry_sparse_result **res;       /* per link */
    size_t *nres;
} upd;

static void upd_free(upd *u)
{
    for (size_t i = 0; u->res && i < u->ch.nlinks; i++)
        ferry_sparse_results_free(u->res[i], u->nres[i]);
    free(u->res);
    free(u->nres);
    free(u->views);
    free(u->targets);
    free(u->shard_of);
    ferry_sparse_chain_free(&u->ch);
    fr_gen_free(u->dense);
    ferry_sparse_reader_close(u->rd);
}

/* Each shard against the dense generation's tensors: its view and target. */
static int shards_check(upd *u, ferry_error *err)
{
    const fr_gen *g = u->dense;
    u->views = calloc(u->n ? u->n : 1, sizeof *u->views);
    u->targets = calloc(u->n ? u->n : 1, sizeof *u->targets);
    u->shard_of = calloc(u->n ? u->n : 1, sizeof *u->shard_of);
    if (!u->views || !u->targets || !u->shard_of)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < u->n; i++) {
        const ferry_param_shard *p = &u->shards[i];
        int ti = ferry_manifest_find_tensor(g->m, p->tensor ? p->tensor : "");
        if (ti < 0)
            return fr_fail(err, FERRY_ENOENT, "tensor %s is not in generation %" PRIu64 " of %s; "
                           "nothing applied", p->tensor ? p->tensor : "(null)", g->generation,
                           g->model);
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(g->m, (uint32_t)ti, &d);
        if (p->dequantize)   /* explicit dequantization is the direct update's */
            return fr_fail(err, FERRY_ENOTSUP, "shard %zu of %s asks dequantization to %s: a "
                           "sparse update does not dequantize; nothing applied", i, d.name,
                           p->dequantize);
        if (p->ndim != d.ndim || p->ndim > FERRY_SPARSE_NDIM_MAX)
            return fr_fail(err, FERRY_EINVAL, "shard %zu of %s has %u dims, the tensor %u; "
                           "nothing applied", i, d.name, p->ndim, d.ndim);
        bool empty = false;
        for (uint32_t k = 0; k < d.ndim; k++) {
            if (p->offset[k] > d.shape[k] || p->shape[k] > d.shape[k] - p->offset[k])
                return fr_fail(err, FERRY_ERANGE, "shard %zu of %s: dim %u [%" PRIu64 ", +%"
                               PRIu64 ") outside %" PRIu64 "; nothing applied", i, d.name, k,
                               p->offset[k], p->shape[k], d.shape[k]);
            empty |= p->shape[k] == 0;
        }
        int rc = fr_rl_shard_check(p, &d, NULL, err);
        if (rc < 0)
            return rc;
        ferry_sparse_view *v = &u->views[i];
        *v = (ferry_sparse_view){ .data = p->dst, .ndim = p->ndim, .bytes = p->dst_bytes };
        snprintf(v->dtype, sizeof v->dtype, "%s", d.dtype);
        memcpy(v->shape, p->shape, sizeof v->shape);
        memcpy(v->strides, p->strides, sizeof v->strides);
        if (empty)
            continue;
        ferry_sparse_target *t = &u->targets[u->ntargets];
        snprintf(t->tensor_id, sizeof t->tensor_id, "%s", d.name);
        t->axis_index = u->cfg->axis_index;
        t->ndim = d.ndim;
        memcpy(t->offset, p->offset, sizeof t->offset);
        memcpy(t->shape, p->shape, sizeof t->shape);
        u->shard_of[u->ntargets++] = i;
    }
    return 0;
}

/* Every link's results for the targets; then every fence and every view
 * they will be applied to, with no write: a view is checked by applying
 * an empty result of its shape. */
static int read_links(upd *u, uint64_t start, ferry_sparse_update_stats *st, ferry_error *err)
{
    u->res = calloc(u->ch.nlinks ? u->ch.nlinks : 1, sizeof *u->res);
    u->nres = calloc(u->ch.nlinks ? u->ch.nlinks : 1, sizeof *u->nres);
    if (!u->res || !u->nres)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    uint64_t at = start;
    for (size_t l = 0; l < u->ch.nlinks; l++) {
        const ferry_sparse_link *k = &u->ch.links[l];
        ferry_sparse_stats rs = {0};
        int rc = ferry_sparse_reader_read(u->rd, (const char *const *)k->keys, k->nkeys, u->targets,
                                          u->ntargets, NULL, &u->res[l], &u->nres[l], &rs, err);
        ferry_sparse_stats_add(&st->read, &rs);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < u->nres[l]; i++) {
            const ferry_sparse_result *r = &u->res[l][i];
            if (r->delta_generation != k->generation ||
                (r->apply == FERRY_SPARSE_SCATTER_ADD && r->base_generation != at))
                return fr_fail(err, FERRY_ESTATE, "the delta of %s in generation %" PRIu64 " of %s "
                               "is %" PRIu64 " -> %" PRIu64 ", but it would apply to generation %"
                               PRIu64 "; nothing applied", r->tensor_id, k->generation,
                               u->cfg->model, r->base_generation, r->delta_generation, at);
            ferry_sparse_result dry = *r;
            dry.nnz = 0;
            dry.apply = FERRY_SPARSE_SCATTER_SET;
            rc = ferry_sparse_apply_view(&dry, &u->views[u->shard_of[r->target]], 0, NULL, err);
            if (rc < 0)
                return rc;
        }
        at = k->generation;
    }
    return 0;
}

static int apply_links(upd *u, uint64_t start, ferry_sparse_update_stats *st, ferry_error *err)
{
    uint64_t at = start;
    for (size_t l = 0; l < u->ch.nlinks; l++) {
        for (size_t i = 0; i < u->nres[l]; i++) {
            const ferry_sparse_result *r = &u->res[l][i];
            ferry_error e = {0};
            int rc = ferry_sparse_apply_view(r, &u->views[u->shard_of[r->target]], at, NULL, &e);
            if (rc < 0)   /* checked before: earlier deltas are in */
                return fr_fail(err, FERRY_EREBUILD, "%s; the parameters must be rebuilt",
                               e.msg);
            st->entries_applied += r->nnz;
        }
        at = u->ch.links[l].generation;
        st->deltas++;
    }
    return 0;
}

int ferry_sparse_update(ferry_store *s, const ferry_sparse_update_config *cfg,
                        const ferry_param_shard *shards, size_t n, uint64_t *generation,
                        ferry_sparse_update_stats *st, ferry_error *err)
{
    ferry_sparse_update_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (cfg && !FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "sparse update: the config's reserved fields must "
                       "be zero (start from ferry_sparse_update_config_init)");
    if (!s || !cfg || !generation || (n && !shards))
        return fr_fail(err, FERRY_EINVAL, "sparse update: bad arguments (store, config, "
                       "generation, shards)");
    st->generation = *generation;
    upd u = { .s = s, .cfg = cfg, .shards = shards, .n = n };
    uint64_t t0 = fr_now_ns();
    int rc = ferry_sparse_chain_resolve(s, cfg->model, *generation, &u.ch, err);
    st->resolve_s = (double)(fr_now_ns() - t0) / 1e9;
    if (rc < 0 || u.ch.active == *generation) {
        upd_free(&u);
        return rc;
    }
    if (u.ch.load_dense && cfg->no_dense) {
        rc = fr_fail(err, FERRY_ESTATE, "the worker holds generation %" PRIu64 " of %s, which is "
                     "not on the active chain (dense generation %" PRIu64 " to %" PRIu64 "): "
                     "no delta applies to it and loading generation %" PRIu64 " was not "
                     "allowed; nothing applied", *generation, cfg->model, u.ch.dense,
                     u.ch.active, u.ch.dense);
        upd_free(&u);
        return rc;
    }
    uint64_t start = u.ch.load_dense ? u.ch.dense : *generation;
    uint64_t t1 = fr_now_ns();
    rc = fr_gen_load(s, cfg->model, u.ch.dense, &u.dense, err);
    if (rc == 0)
        rc = shards_check(&u, err);
    ferry_sparse_reader_config rcfg;
    if (rc == 0 && (rc = ferry_sparse_reader_config_init(&rcfg)) == 0)
        rc = ferry_sparse_reader_open(s, &rcfg, &u.rd, err);
    if (rc == 0)
        rc = read_links(&u, start, st, err);
    st->read_s = (double)(fr_now_ns() - t1) / 1e9;
    uint64_t t2 = fr_now_ns();
    if (rc == 0 && u.ch.load_dense) {
        rc = fr_gen_lease_all(s, u.dense, err);
        if (rc == 0)
            rc = fr_gen_read_shards(s, u.dense, shards, n, &st->dense_bytes, &st->dense_ranges,
                                    err);
        if (rc == 0)
            st->dense_generation = u.ch.dense;
    }
    uint64_t t3 = fr_now_ns();
    st->dense_s = (double)(t3 - t2) / 1e9;
    if (rc == 0)
        rc = apply_links(&u, start, st, err);
    st->apply_s = (double)(fr_now_ns() - t3) / 1e9;
    if (rc == 0)
        *generation = st->generation = u.ch.active;
    upd_free(&u);
    return rc;
}
