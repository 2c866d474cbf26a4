/* Lowering an attested plan's regions to engine batches: one op per
 * contiguous run of both local storages, split and batched under the
 * caller's limits, for the workers a process selects; runs of equal length
 * at constant strides on both sides become one strided op (ferry_op.count),
 * so a region cut across rows on one side and columns on the other costs
 * one engine op, not one per row. Pure: no engine. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "exec/exec_int.h"

typedef struct lower_ctx {
    const ferry_lower_args *args;
    ferry_batch_list *out;
    size_t ops_cap, starts_cap;
    uint64_t batch_ops, batch_bytes;   /* of the open batch */
    /* Local binding entry of the region being lowered, and of the last op:
     * the executor registers each entry as its own region, and an op's
     * local extent must lie inside one. */
    const ferry_binding_entry *cur_local, *last_local;
    ferry_error *err;
} lower_ctx;

static bool selected(const ferry_lower_args *a, uint32_t worker)
{
    for (size_t i = 0; i < a->nworkers; i++)
        if (a->workers[i] == worker)
            return true;
    return false;
}

static const ferry_peer_map *peer_of(const ferry_lower_args *a, uint32_t worker)
{
    for (size_t i = 0; i < a->npeers; i++)
        if (a->peers[i].worker == worker)
            return &a->peers[i];
    return NULL;
}

/* Whether op (one run) is the next row of last: equal length, and on both
 * sides one stride further. A contiguous last op takes the strides from
 * op; rows never overlap (strides >= len), so the rows of a strided op
 * land exactly as the separate ops would have. */
static bool next_row(ferry_op *last, const ferry_op *op)
{
    const uint64_t la = (uint64_t)(uintptr_t)last->local, lb = (uint64_t)(uintptr_t)op->local;
    if (last->len != op->len)
        return false;
    if (last->count <= 1) {
        if (lb < la || lb - la < op->len || op->remote_addr < last->remote_addr ||
            op->remote_addr - last->remote_addr < op->len)
            return false;
        last->local_stride = lb - la;
        last->remote_stride = op->remote_addr - last->remote_addr;
        last->count = 2;
        return true;
    }
    uint64_t t, lnext, rnext;
    if (fr_mul_u64(last->count, last->local_stride, &t) < 0 || fr_add_u64(la, t, &lnext) < 0 ||
        fr_mul_u64(last->count, last->remote_stride, &t) < 0 ||
        fr_add_u64(last->remote_addr, t, &rnext) < 0 || lnext != lb || rnext != op->remote_addr)
        return false;
    last->count++;
    return true;
}

/* Append one op (a single run), merging it into the previous op of the
 * open batch when both sides continue it contiguously or it is that op's
 * next row, else opening a new batch when a limit is hit. */
static int emit(lower_ctx *c, const ferry_op *op)
{
    ferry_batch_list *b = c->out;
    const ferry_exec_limits *l = &c->args->limits;

    if (c->batch_ops > 0 && c->batch_bytes + op->len <= l->max_bytes && c->last_local == c->cur_local) {
        ferry_op *last = &b->ops[b->nops - 1];
        if (last->opcode == op->opcode && last->peer == op->peer && last->key == op->key) {
            bool merged = false;
            if (last->count <= 1 && (char *)last->local + last->len == (char *)op->local &&
                last->remote_addr + last->len == op->remote_addr) {
                last->len += op->len;
                merged = true;
            } else {
                merged = next_row(last, op);
            }
            if (merged) {
                c->batch_bytes += op->len;
                b->bytes += op->len;
                return 0;
            }
        }
    }
    if (c->batch_ops == 0 || c->batch_ops >= l->max_ops || c->batch_bytes + op->len > l->max_bytes) {
        if (fr_grow((void **)&b->batch_start, &c->starts_cap, b->nbatches + 2, sizeof(size_t)) < 0)
            return fr_fail(c->err, FERRY_ENOMEM, "lower: out of memory");
        b->batch_start[b->nbatches++] = b->nops;
        c->batch_ops = c->batch_bytes = 0;
    }
    if (fr_grow((void **)&b->ops, &c->ops_cap, b->nops + 1, sizeof(ferry_op)) < 0)
        return fr_fail(c->err, FERRY_ENOMEM, "lower: out of memory");
    b->ops[b->nops++] = *op;
    c->last_local = c->cur_local;
    c->batch_ops++;
    c->batch_bytes += op->len;
    b->bytes += op->len;
    return 0;
}

/* Element index of the region's first element in a fragment's storage. */
static int base_index(const ferry_region *r, const ferry_fragment *f, const ferry_binding_entry *e,
                      uint64_t *out)
{
    uint64_t idx = e->storage_offset, t;
    for (uint32_t d = 0; d < r->ndim; d++)
        if (fr_mul_u64(r->offset[d] - f->offset[d], e->strides[d], &t) < 0 || fr_add_u64(idx, t, &idx) < 0)
            return FERRY_ERANGE;
    *out = idx;
    return 0;
}

/* Byte address of element `idx` of an entry's storage. */
static int byte_addr(const ferry_binding_entry *e, uint64_t idx, uint64_t *out)
{
    uint64_t off;
    if (fr_mul_u64(idx, e->itemsize, &off) < 0 || fr_add_u64(e->addr, off, out) < 0)
        return FERRY_ERANGE;
    return 0;
}

static int lower_region(lower_ctx *c, const ferry_region *r, const ferry_fragment *fs,
                        const ferry_binding_entry *es, const ferry_fragment *fd,
                        const ferry_binding_entry *ed, const ferry_peer_map *pm)
{
    const bool reader = c->args->mode == FERRY_EXEC_READER;
    const uint32_t n = r->ndim;
    uint64_t sbase, dbase, run = 1, run_bytes, cnt[FERRY_MAX_DIMS] = {0};
    uint32_t outer = n;   /* dims [0, outer) are looped, [outer, n) form the run */

    if (base_index(r, fs, es, &sbase) < 0 || base_index(r, fd, ed, &dbase) < 0)
        goto overflow;
    c->cur_local = reader ? ed : es;
    /* Merge dims innermost first while both storages stay contiguous. */
    while (outer > 0) {
        uint32_t d = outer - 1;
        if (r->shape[d] != 1 && (es->strides[d] != run || ed->strides[d] != run))
            break;
        if (fr_mul_u64(run, r->shape[d], &run) < 0)
            goto overflow;
        outer--;
    }
    if (fr_mul_u64(run, ed->itemsize, &run_bytes) < 0)
        goto overflow;
    for (;;) {
        uint64_t si = sbase, di = dbase, t, sa, da;
        for (uint32_t d = 0; d < outer; d++) {
            if (fr_mul_u64(cnt[d], es->strides[d], &t) < 0 || fr_add_u64(si, t, &si) < 0 ||
                fr_mul_u64(cnt[d], ed->strides[d], &t) < 0 || fr_add_u64(di, t, &di) < 0)
                goto overflow;
        }
        if (byte_addr(es, si, &sa) < 0 || byte_addr(ed, di, &da) < 0)
            goto overflow;
        for (uint64_t done = 0; done < run_bytes;) {
            uint64_t len = run_bytes - done;
            if (len > c->args->limits.max_bytes)
                len = c->args->limits.max_bytes;
            ferry_op op = {
                .opcode = reader ? FERRY_OP_READ : FERRY_OP_WRITE,
                .local = (void *)(uintptr_t)((reader ? da : sa) + done),
                .len = len,
                .peer = pm->peer,
                .remote_addr = (reader ? sa : da) + done,
                .key = pm->key,
            };
            int rc = emit(c, &op);
            if (rc < 0)
                return rc;
            done += len;
        }
        /* Odometer over the looped dims, last fastest. */
        uint32_t d = outer;
        while (d > 0 && ++cnt[d - 1] == r->shape[d - 1])
            cnt[--d] = 0;
        if (d == 0)
            break;
    }
    return 0;
overflow:
    return fr_fail(c->err, FERRY_ERANGE, "lower: region of source fragment %" PRIu64
                   " -> target fragment %" PRIu64 " overflows 64-bit addresses",
                   r->src_fragment, r->dst_fragment);
}

static int check_args(const ferry_binding *init, const ferry_lower_args *a, ferry_error *err)
{
    if (a->mode != FERRY_EXEC_READER && a->mode != FERRY_EXEC_SINK)
        return fr_fail(err, FERRY_EINVAL, "lower: mode must be reader or sink");
    if (!FR_RESERVED_OK(a))
        return fr_fail(err, FERRY_EINVAL, "lower: the arguments' reserved fields must be zero");
    if (a->limits.max_ops == 0 || a->limits.max_bytes == 0)
        return fr_fail(err, FERRY_EINVAL, "lower: max ops and max bytes per batch must be >= 1");
    if (a->workers == NULL || a->nworkers == 0)
        return fr_fail(err, FERRY_EINVAL, "lower: the worker selector is empty");
    for (size_t i = 0; i < a->nworkers; i++) {
        bool found = false;
        for (size_t k = 0; k < init->n && !found; k++)
            found = init->v[k].worker == a->workers[i];
        if (!found)
            return fr_fail(err, FERRY_ENOENT, "lower: selected worker %u holds no fragment of the %s binding",
                           a->workers[i], a->mode == FERRY_EXEC_READER ? "target" : "source");
    }
    return 0;
}

int ferry_exec_lower(const ferry_attested_plan *a, const ferry_binding *src,
                     const ferry_binding *dst, const ferry_lower_args *args,
                     ferry_batch_list *out, ferry_error *err)
{
    ferry_plan_iter *it = NULL;
    ferry_region r;
    int rc;

    if (out == NULL || args == NULL || src == NULL || dst == NULL)
        return fr_fail(err, FERRY_EINVAL, "lower: bindings, arguments and output are required");
    memset(out, 0, sizeof(*out));
    rc = ferry_attested_check(a, src, dst, err);
    if (rc < 0)
        return rc;
    const bool reader = args->mode == FERRY_EXEC_READER;
    const ferry_binding *init = reader ? dst : src, *remote = reader ? src : dst;
    rc = check_args(init, args, err);
    if (rc < 0)
        return rc;
    lower_ctx c = {.args = args, .out = out, .err = err};
    const ferry_plan *p = ferry_attested_plan_get(a);
    rc = ferry_plan_iter_open(p, NULL, &it);
    if (rc < 0) {
        fr_fail(err, rc, "lower: %s", ferry_strerror(rc));
        goto fail;
    }
    while ((rc = ferry_plan_iter_next_region(it, &r)) == 1) {
        const uint64_t lid = reader ? r.dst_fragment : r.src_fragment;
        const uint64_t rid = reader ? r.src_fragment : r.dst_fragment;
        const ferry_binding_entry *le = ferry_binding_find(init, lid);
        if (le == NULL || !selected(args, le->worker))
            continue;   /* another process's or another worker's operation */
        const ferry_binding_entry *re = ferry_binding_find(remote, rid);
        if (re == NULL) {
            rc = fr_fail(err, FERRY_ENOENT, "lower: %s fragment %" PRIu64 " (needed by %s fragment %" PRIu64
                         ") has no binding entry", reader ? "source" : "target", rid,
                         reader ? "target" : "source", lid);
            goto fail;
        }
        const ferry_peer_map *pm = peer_of(args, re->worker);
        if (pm == NULL) {
            rc = fr_fail(err, FERRY_ENOENT, "lower: worker %u holding %s fragment %" PRIu64
                         " has no peer mapping", re->worker, reader ? "source" : "target", rid);
            goto fail;
        }
        const ferry_binding_entry *es = reader ? re : le, *ed = reader ? le : re;
        if (es->itemsize != ed->itemsize) {
            rc = fr_fail(err, FERRY_EINVAL, "lower: source fragment %" PRIu64 " and target fragment %" PRIu64
                         " differ in itemsize", r.src_fragment, r.dst_fragment);
            goto fail;
        }
        ferry_fragment fs, fd;
        rc = ferry_manifest_fragment(ferry_plan_src(p), r.src_fragment, &fs);
        if (rc == 0)
            rc = ferry_manifest_fragment(ferry_plan_dst(p), r.dst_fragment, &fd);
        if (rc < 0) {
            fr_fail(err, rc, "lower: fragment lookup: %s", ferry_strerror(rc));
            goto fail;
        }
        rc = lower_region(&c, &r, &fs, es, &fd, ed, pm);
        if (rc < 0)
            goto fail;
    }
    if (rc < 0) {
        fr_fail(err, rc, "lower: plan iteration: %s", ferry_strerror(rc));
        goto fail;
    }
    ferry_plan_iter_close(it);
    it = NULL;
    if (out->nops == 0) {
        rc = fr_fail(err, FERRY_ENOENT, "lower: the selected workers have no planned operation");
        goto fail;
    }
    out->batch_start[out->nbatches] = out->nops;
    return 0;
fail:
    ferry_plan_iter_close(it);
    ferry_batch_list_free(out);
    return rc;
}

void ferry_batch_list_free(ferry_batch_list *b)
{
    if (b == NULL)
        return;
    fr_free(b->ops);
    fr_free(b->batch_start);
    memset(b, 0, sizeof(*b));
}

int ferry_exec_run_ops(const ferry_run *run, enum ferry_opcode opcode, uint64_t src_base,
                       uint64_t dst_base, ferry_peer_id peer, uint64_t key, ferry_op **ops,
                       size_t *n, size_t *cap)
{
    if (!run || !ops || !n || !cap || (opcode != FERRY_OP_WRITE && opcode != FERRY_OP_READ))
        return FERRY_EINVAL;
    uint32_t outer = run->nouter ? run->nouter - 1 : 0;
    uint64_t reps = 1, ctr[FERRY_MAX_DIMS] = {0};
    for (uint32_t i = 0; i < outer; i++)
        reps *= run->count[i];
    if (fr_grow((void **)ops, cap, *n + reps, sizeof **ops) < 0)
        return FERRY_ENOMEM;
    const bool write = opcode == FERRY_OP_WRITE;
    for (uint64_t k = 0; k < reps; k++) {
        uint64_t so = run->src_offset, dof = run->dst_offset;
        for (uint32_t i = 0; i < outer; i++) {
            so += ctr[i] * run->src_stride[i];
            dof += ctr[i] * run->dst_stride[i];
        }
        ferry_op op = { .opcode = opcode,
                        .local = (void *)(uintptr_t)(write ? src_base + so : dst_base + dof),
                        .len = run->len, .peer = peer,
                        .remote_addr = write ? dst_base + dof : src_base + so, .key = key };
        if (run->nouter) {
            op.count = run->count[outer];
            op.local_stride = write ? run->src_stride[outer] : run->dst_stride[outer];
            op.remote_stride = write ? run->dst_stride[outer] : run->src_stride[outer];
        }
        (*ops)[(*n)++] = op;
        for (int i = (int)outer - 1; i >= 0 && ++ctr[i] == run->count[i]; i--)
            ctr[i] = 0;
    }
    return 0;
}
