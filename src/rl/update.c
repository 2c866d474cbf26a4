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
    return fr_rl_prepare_at(s, model, active, m, err);
}

int fr_rl_prepare_at(ferry_store *s, const char *model, uint64_t generation,
                     ferry_weight_manifest *m, ferry_error *err)
{
    int rc = ferry_weights_manifest(s, model, generation, m, err);
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

int fr_rl_locate(void *g, uint64_t fragment, const char **key, uint64_t *offset)
{
    return fr_gen_where(g, fragment, key, offset, NULL);
}

int fr_rl_attest_reads(const fr_gen *g, ferry_plan *plan, const ferry_binding *dst,
                       ferry_attested_plan **out, ferry_error *err)
{
    ferry_binding *src = NULL;
    int rc = ferry_binding_create(g->m, 0, g->generation, 0, &src, err);
    if (rc == 0)
        rc = ferry_attest(plan, src, dst, g->generation, out, err);
    ferry_binding_free(src);
    return rc;
}

int fr_rl_bind(ferry_manifest *t, uint64_t generation, uint32_t worker, const uint64_t *frags,
               size_t n, const uint64_t *addr, const uint64_t *nbytes, ferry_binding **out,
               ferry_error *err)
{
    ferry_binding *b = NULL;
    int rc = ferry_binding_create(t, 0, generation, 0, &b, err);
    uint64_t nf = frags ? n : ferry_manifest_fragment_count(t);
    for (uint64_t i = 0; i < nf && rc == 0; i++) {
        ferry_fragment f;
        ferry_tensor_desc d;
        uint64_t j = frags ? frags[i] : i;
        rc = ferry_manifest_fragment(t, j, &f);
        if (rc == 0)
            rc = ferry_manifest_tensor(t, f.tensor, &d);
        if (rc < 0)
            break;
        ferry_binding_entry e = { .fragment = j, .addr = addr[i], .worker = worker,
                                  .kind = FERRY_MEM_HOST, .itemsize = d.itemsize,
                                  .ndim = d.ndim, .storage_offset = f.storage_offset };
        uint64_t dense = 1, last = f.storage_offset;
        for (uint32_t k = d.ndim; k-- > 0;) {
            e.shape[k] = f.shape[k];
            e.strides[k] = f.has_strides ? f.strides[k] : dense;
            if (e.strides[k] == 0)   /* an extent-1 dim: any stride */
                e.strides[k] = 1;
            dense *= f.shape[k];
            last += (f.shape[k] - 1) * e.strides[k];
        }
        e.nbytes = nbytes && nbytes[i] ? nbytes[i] : (last + 1) * d.itemsize;
        rc = ferry_binding_add(b, &e, err);
    }
    if (rc < 0) {
        ferry_binding_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

/* Parameter-direct: the shards are the target placement (one rank), bound
 * where they live; the planner maps the stored placement onto it and exec
 * reads it. Nothing is read before the whole plan is made and lowered. */
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
    ferry_binding *dst = NULL;
    ferry_attested_plan *att = NULL;
    ferry_store_reads reads = {0};
    size_t *shard_of = NULL;
    uint64_t *addr = NULL, *nbytes = NULL;
    rc = fr_rl_target(g, shards, n, 1, NULL, &tgt, &shard_of, err);
    uint64_t nf = tgt ? ferry_manifest_fragment_count(tgt) : 0;
    if (rc == 0 && (!(addr = malloc((nf ? nf : 1) * sizeof *addr)) ||
                    !(nbytes = malloc((nf ? nf : 1) * sizeof *nbytes))))
        rc = fr_rl_fail(err, FERRY_ENOMEM, "update: out of memory");
    for (uint64_t j = 0; rc == 0 && j < nf; j++) {
        addr[j] = (uint64_t)(uintptr_t)shards[shard_of[j]].dst;
        nbytes[j] = shards[shard_of[j]].dst_bytes;
    }
    if (rc == 0)
        rc = ferry_plan_create(g->m, tgt, NULL, &plan, err);
    if (rc == 0)
        rc = fr_rl_bind(tgt, g->generation, 0, NULL, 0, addr, nbytes, &dst, err);
    if (rc == 0)
        rc = fr_rl_attest_reads(g, plan, dst, &att, err);
    if (rc == 0 && nf)
        rc = ferry_exec_store_lower(att, dst, (const uint32_t[]){ 0 }, 1, NULL, &reads, err);
    if (rc < 0 && err && !err->msg[0])
        fr_rl_fail(err, rc, "update: planning: %s", ferry_strerror(rc));
    st->tensors = n;
    double t1 = now_s();
    if (rc == 0 && reads.n) {
        ferry_error e = {0};
        ferry_exec_result res;
        ferry_store_exec_config xc = { .store = s, .locate = fr_rl_locate, .locate_ctx = g };
        rc = ferry_exec_store_run(&xc, att, dst, &reads, 0, reads.n, &res, &e);
        st->bytes_read = res.bytes_done;
        st->ranges = reads.n;
        if (rc < 0 && res.state == FERRY_TICKET_ABORTED)   /* nothing was written */
            fr_rl_fail(err, rc, "%s", e.msg);
        else if (rc < 0)   /* the parameters may be partly written */
            rc = fr_rl_fail(err, FERRY_EREBUILD, "%s; the parameters must be rebuilt", e.msg);
        ferry_exec_result_free(&res);
    }
    st->read_s = now_s() - t1;
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
    }
    ferry_store_reads_free(&reads);
    ferry_attested_free(att);
    ferry_binding_free(dst);
    free(addr);
    free(nbytes);
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
