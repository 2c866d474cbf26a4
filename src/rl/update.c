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
    int rc = fr_rl_active_read(s, model, &active, NULL, NULL);
    if (rc < 0)
        return fr_fail(err, rc, "no generation of %s is active (%s)", model, ferry_strerror(rc));
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
        return fr_fail(err, FERRY_EINVAL, "update: bad arguments");
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
        rc = fr_fail(err, FERRY_ENOMEM, "update: out of memory");
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
        fr_fail(err, rc, "update: planning: %s", ferry_strerror(rc));
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
            fr_fail(err, rc, "%s", e.msg);
        else if (rc < 0)   /* the parameters may be partly written */
            rc = fr_fail(err, FERRY_EREBUILD, "%s; the parameters must be rebuilt", e.msg);
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
        return fr_fail(err, FERRY_EINVAL, "update: bad arguments");
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
                rc = fr_fail(err, FERRY_ENOMEM, "tensor %s: cannot allocate %" PRIu64 " bytes",
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
                fr_fail(err, rc, "the loader stopped at tensor %s (%d)", e->name, rc);
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
