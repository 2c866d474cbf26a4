/* Reader and sink executors (exec.h, "executors").
 *
 * A run is a fixed sequence, each step undone by the ones after it on
 * failure:
 *   1. check the bindings against the attestation, refuse duplicate guard
 *      ids, lower the selected workers' ops (all pure: nothing to undo);
 *   2. acquire every guard — on a failure release what was acquired, each
 *      release tried even when an earlier one failed, failures quarantined;
 *   3. register the initiating workers' local memory (local-only regions);
 *   4. keep `window` batches in flight until every batch is terminal; after
 *      the first failure submit nothing new and drain what is in flight;
 *   5. sink: NOTIFY each target peer once every WRITE landed;
 *   6. release the guards (all quarantined when a batch is UNKNOWN: its
 *      memory may still be written), unregister the local memory with
 *      checkpointed bookkeeping.
 * The state follows the engine contract (docs/design.md): once any byte moved, a failure is
 * FAILED_DRAINED, never ABORTED; a batch whose wait expired makes the run
 * UNKNOWN and its pending id is reported. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "exec/exec_int.h"


struct ferry_executor {
    ferry_exec_config cfg;
    uint32_t *workers;
    ferry_peer_map *peers;
    ferry_guard *guards;
    ferry_region **regs;          /* local regions of the last run; NULL once released */
    size_t nregs;
    bool restart_required;
};

static void *dup_array(const void *p, size_t n, size_t size)
{
    if (n == 0)
        return NULL;
    void *q = malloc(n * size);
    if (q)
        memcpy(q, p, n * size);
    return q;
}

int ferry_executor_create(const ferry_exec_config *cfg, ferry_executor **out, ferry_error *err)
{
    if (!cfg || !out || !cfg->engine)
        return fr_fail(err, FERRY_EINVAL, "executor: a config with an engine is required");
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "executor: the config's reserved fields must be "
                       "zero (start from ferry_exec_config_init)");
    if (cfg->mode != FERRY_EXEC_READER && cfg->mode != FERRY_EXEC_SINK)
        return fr_fail(err, FERRY_EINVAL, "executor: mode must be reader or sink");
    if (cfg->nguards && !cfg->guards)
        return fr_fail(err, FERRY_EINVAL, "executor: %zu guards but no array", cfg->nguards);
    ferry_executor *x = calloc(1, sizeof *x);
    if (!x)
        return FERRY_ENOMEM;
    x->cfg = *cfg;
    x->workers = dup_array(cfg->workers, cfg->nworkers, sizeof *x->workers);
    x->peers = dup_array(cfg->peers, cfg->npeers, sizeof *x->peers);
    x->guards = dup_array(cfg->guards, cfg->nguards, sizeof *x->guards);
    if ((cfg->nworkers && !x->workers) || (cfg->npeers && !x->peers) ||
        (cfg->nguards && !x->guards)) {
        ferry_executor_free(x);
        return FERRY_ENOMEM;
    }
    x->cfg.workers = x->workers;
    x->cfg.peers = x->peers;
    x->cfg.guards = x->guards;
    fr_exec_config_resolve(&x->cfg);
    *out = x;
    return 0;
}

/* ---- guards ------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int check_guard_ids(const ferry_executor *x, ferry_error *err)
{
    size_t n = x->cfg.nguards;
    if (n < 2)
        return 0;
    uint64_t *ids = malloc(n * sizeof *ids);
    if (!ids)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < n; i++)
        ids[i] = x->guards[i].id;
    qsort(ids, n, sizeof *ids, cmp_u64);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (ids[i] == ids[i - 1])
            rc = fr_fail(err, FERRY_EEXIST, "executor: guard id %" PRIu64 " given twice",
                         ids[i]);
    free(ids);
    return rc;
}

/* ---- local memory ----------------------------------------------------------------- */

static bool selected(const ferry_executor *x, uint32_t w)
{
    for (size_t i = 0; i < x->cfg.nworkers; i++)
        if (x->workers[i] == w)
            return true;
    return false;
}

static int register_local(ferry_executor *x, const ferry_binding *init, ferry_error *err)
{
    size_t n = ferry_binding_count(init);
    x->regs = calloc(n ? n : 1, sizeof *x->regs);
    if (!x->regs)
        return FERRY_ENOMEM;
    x->nregs = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_binding_entry *e = ferry_binding_entry_at(init, i);
        if (!selected(x, e->worker) || e->nbytes == 0)
            continue;
        int rc = ferry_region_register(x->cfg.engine, (void *)(uintptr_t)e->addr, e->nbytes, 0,
                                       e->kind, &x->regs[x->nregs], err);
        if (rc < 0)
            return fr_fail(err, rc, "executor: cannot register fragment %" PRIu64
                           " of worker %u: %s", e->fragment, e->worker, err ? err->msg : "");
        x->nregs++;
    }
    return 0;
}

int ferry_executor_cleanup(ferry_executor *x)
{
    if (!x)
        return FERRY_EINVAL;
    /* unregister_all sets each entry to NULL as it succeeds: a retry never
     * touches an address twice. */
    int rc = ferry_region_unregister_all(x->regs, x->nregs, NULL);
    if (rc < 0) {
        x->restart_required = true;
        return rc;
    }
    free(x->regs);
    x->regs = NULL;
    x->nregs = 0;
    x->restart_required = false;
    return 0;
}

bool ferry_executor_restart_required(const ferry_executor *x)
{
    return x && x->restart_required;
}

size_t ferry_executor_registered(const ferry_executor *x)
{
    size_t n = 0;
    for (size_t i = 0; x && i < x->nregs; i++)
        n += x->regs[i] != NULL;
    return n;
}

/* ---- the batches ---------------------------------------------------------------------- */

/* Keep `window` batches in flight through the stream until every batch is
 * terminal; after the first failure submit nothing new and drain what is
 * in flight (the stream keeps the tally). */
static void run_batches(ferry_executor *x, ferry_exec_stream *s, const ferry_batch_list *bl)
{
    uint32_t w = x->cfg.window;
    uint64_t *fl = calloc(w, sizeof *fl);
    if (!fl) {
        ferry_exec_stream_fail(s, FERRY_ENOMEM);
        return;
    }
    size_t next = 0, head = 0, inflight = 0;
    while (next < bl->nbatches || inflight > 0) {
        if (next < bl->nbatches && inflight < w && !ferry_exec_stream_error(s, NULL)) {
            size_t b = next++;
            uint64_t id = 0;
            if (ferry_exec_stream_submit(s, bl->ops + bl->batch_start[b],
                                         bl->batch_start[b + 1] - bl->batch_start[b], &id) < 0)
                continue;   /* nothing of this batch was submitted; the stream has the error */
            fl[(head + inflight) % w] = id;
            inflight++;
            continue;
        }
        if (inflight == 0)
            break;   /* a failure stopped submission and everything drained */
        (void)ferry_exec_stream_wait(s, fl[head], true, NULL);
        head = (head + 1) % w;
        inflight--;
    }
    free(fl);
}

/* Sink: one NOTIFY(tag, generation) to every target peer of the ops. */
static void notify_targets(ferry_executor *x, ferry_exec_stream *s, const ferry_batch_list *bl,
                           uint64_t generation)
{
    ferry_op *ops = calloc(x->cfg.npeers ? x->cfg.npeers : 1, sizeof *ops);
    if (!ops) {
        ferry_exec_stream_fail(s, FERRY_ENOMEM);
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < bl->nops; i++) {
        size_t k = 0;
        while (k < n && ops[k].peer != bl->ops[i].peer)
            k++;
        if (k == n && n < x->cfg.npeers)
            ops[n++] = (ferry_op){ .opcode = FERRY_OP_NOTIFY, .peer = bl->ops[i].peer,
                                   .tag = x->cfg.notify_tag, .value = generation };
    }
    uint64_t id = 0;
    if (n && ferry_exec_stream_submit(s, ops, n, &id) == 0)
        (void)ferry_exec_stream_wait(s, id, true, NULL);   /* a failure: the bytes landed but
                                                            * the targets were not told */
    free(ops);
}

int ferry_executor_run(ferry_executor *x, const ferry_attested_plan *a, const ferry_binding *src,
                       const ferry_binding *dst, ferry_exec_result *res, ferry_error *err)
{
    if (!x || !res)
        return fr_fail(err, FERRY_EINVAL, "executor: executor and result are required");
    memset(res, 0, sizeof *res);
    res->state = FERRY_TICKET_ABORTED;
    if (x->restart_required || ferry_executor_registered(x))
        return res->error = fr_fail(err, FERRY_ESTATE, "executor: restart required: %zu "
                                    "local regions of an earlier run are still pinned "
                                    "(ferry_executor_cleanup)", ferry_executor_registered(x));
    int rc = check_guard_ids(x, err);
    ferry_batch_list bl = {0};
    ferry_lower_args la = { .mode = x->cfg.mode, .workers = x->workers,
                            .nworkers = x->cfg.nworkers, .peers = x->peers,
                            .npeers = x->cfg.npeers, .limits = x->cfg.limits };
    if (rc == 0)
        rc = ferry_exec_lower(a, src, dst, &la, &bl, err);   /* checks the attestation first */
    if (rc < 0)
        return res->error = rc;

    /* The stream acquires the guards (rolled back on a failure) and, at
     * close, releases them — or quarantines them all when a batch is
     * UNKNOWN: its memory may still be written. */
    ferry_stream_config sc = { .engine = x->cfg.engine, .timeout_ms = x->cfg.timeout_ms,
                               .guards = x->guards, .nguards = x->cfg.nguards };
    ferry_exec_stream *s = NULL;
    rc = ferry_exec_stream_open(&sc, &s, res, err);
    if (rc == 0 && (rc = register_local(x, x->cfg.mode == FERRY_EXEC_READER ? dst : src,
                                        err)) < 0)
        (void)ferry_exec_stream_close(s, res);   /* nothing moved: roll back completely */
    if (rc < 0) {
        res->state = FERRY_TICKET_ABORTED;
        res->error = rc;
        res->ops = bl.nops, res->batches = bl.nbatches, res->bytes = bl.bytes;
        (void)ferry_executor_cleanup(x);
        ferry_batch_list_free(&bl);
        return rc;
    }

    run_batches(x, s, &bl);
    if (!ferry_exec_stream_error(s, NULL) && x->cfg.mode == FERRY_EXEC_SINK && x->cfg.notify_tag)
        notify_targets(x, s, &bl, ferry_attested_generation(a));
    ferry_error why = {0};   /* the stream's sentence goes with it at close */
    (void)ferry_exec_stream_error(s, &why);
    (void)ferry_exec_stream_close(s, res);
    res->ops = bl.nops;   /* planned for this process */
    res->batches = bl.nbatches;
    res->bytes = bl.bytes;
    if (res->error)
        fr_fail(err, res->error, "executor: %s after %" PRIu64 " of %" PRIu64 " bytes: %s",
                ferry_ticket_state_name(res->state), res->bytes_done, res->bytes,
                why.msg[0] ? why.msg : ferry_strerror(res->error));
    (void)ferry_executor_cleanup(x);
    ferry_batch_list_free(&bl);
    return res->state == FERRY_TICKET_COMPLETED ? 0 : res->error;
}

void ferry_exec_result_free(ferry_exec_result *r)
{
    if (!r)
        return;
    free(r->pending);
    free(r->quarantined);
    r->pending = r->quarantined = NULL;
    r->npending = r->nquarantined = 0;
}

void ferry_executor_free(ferry_executor *x)
{
    if (!x)
        return;
    (void)ferry_executor_cleanup(x);
    free(x->regs);   /* what stays pinned is the engine's to unregister at close */
    free(x->workers);
    free(x->peers);
    free(x->guards);
    free(x);
}

/* ---- counterparts ----------------------------------------------------------------------- */

int ferry_exec_counterparts(const ferry_attested_plan *a, const ferry_binding *src,
                            const ferry_binding *dst, bool of_target, const uint32_t *workers,
                            size_t nworkers, uint32_t *out, size_t cap, size_t *n,
                            ferry_error *err)
{
    if (!a || !src || !dst || !n || (nworkers && !workers) || (cap && !out))
        return fr_fail(err, FERRY_EINVAL, "counterparts: bad arguments");
    int rc = ferry_attested_check(a, src, dst, err);
    if (rc < 0)
        return rc;
    const ferry_binding *mine = of_target ? dst : src, *other = of_target ? src : dst;
    ferry_plan_iter *it = NULL;
    rc = ferry_plan_iter_open(ferry_attested_plan_get(a), NULL, &it);
    if (rc < 0)
        return fr_fail(err, rc, "counterparts: %s", ferry_strerror(rc));
    uint32_t *found = NULL;
    size_t nf = 0;
    ferry_region r;
    while ((rc = ferry_plan_iter_next_region(it, &r)) == 1) {
        const ferry_binding_entry *me = ferry_binding_find(mine, of_target ? r.dst_fragment
                                                                           : r.src_fragment);
        bool sel = false;
        for (size_t i = 0; me && i < nworkers && !sel; i++)
            sel = workers[i] == me->worker;
        if (!sel)
            continue;
        uint64_t ofrag = of_target ? r.src_fragment : r.dst_fragment;
        const ferry_binding_entry *oe = ferry_binding_find(other, ofrag);
        if (!oe) {
            rc = fr_fail(err, FERRY_ENOENT, "counterparts: fragment %" PRIu64
                         " has no binding entry", ofrag);
            break;
        }
        size_t k = 0;
        while (k < nf && found[k] != oe->worker)
            k++;
        if (k == nf) {
            uint32_t *nv = realloc(found, (nf + 1) * sizeof *nv);
            if (!nv) {
                rc = FERRY_ENOMEM;
                break;
            }
            found = nv;
            found[nf++] = oe->worker;
        }
    }
    ferry_plan_iter_close(it);
    if (rc < 0) {
        free(found);
        return rc;
    }
    for (size_t i = 1; i < nf; i++)   /* ascending (insertion sort: counts are small) */
        for (size_t j = i; j > 0 && found[j - 1] > found[j]; j--) {
            uint32_t tmp = found[j];
            found[j] = found[j - 1];
            found[j - 1] = tmp;
        }
    for (size_t i = 0; i < nf && i < cap; i++)
        out[i] = found[i];
    *n = nf;
    free(found);
    return 0;
}
