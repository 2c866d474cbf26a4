/* Updating a rollout worker from the active generation by reading its own
 * demand from the store (weights.h): parameter-direct and compatibility. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/rl_int.h"

#define FLUSH_RANGES 8192


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
    const char **keys = malloc((m->n ? m->n : 1) * sizeof *keys);
    void **bufs = calloc(m->n ? m->n : 1, sizeof *bufs);
    size_t *caps = calloc(m->n ? m->n : 1, sizeof *caps);
    int64_t *res = calloc(m->n ? m->n : 1, sizeof *res);
    if (!keys || !bufs || !caps || !res) {
        rc = fr_rl_fail(err, FERRY_ENOMEM, "update: out of memory");
    } else {
        for (size_t i = 0; i < m->n; i++)
            keys[i] = m->entries[i].key;
        rc = ferry_store_batch_get_into(s, keys, bufs, caps, m->n, res);
        for (size_t i = 0; rc < 0 && i < m->n; i++)
            if (res[i] < 0) {
                /* the store's last error may be about another key of the batch */
                rc = fr_rl_fail(err, (int)res[i], "generation %" PRIu64 " of %s is not whole: tensor "
                          "%s (%s): %s", active, model, m->entries[i].name, m->entries[i].key,
                          ferry_strerror((int)res[i]));
                break;
            }
        if (rc < 0 && err && !err->msg[0])
            fr_rl_fail(err, rc, "update: %s", ferry_store_last_error());
    }
    free(keys), free(bufs), free(caps), free(res);
    if (rc < 0)
        ferry_weight_manifest_free(m);
    return rc;
}

/* ---- parameter-direct ----------------------------------------------------------------- */

typedef struct reader {
    ferry_store *s;
    ferry_range *r;
    size_t *who;           /* manifest entry of each range */
    size_t n;
    ferry_update_stats *st;
    const ferry_weight_manifest *m;
} reader;

static int flush(reader *rd, ferry_error *err)
{
    if (rd->n == 0)
        return 0;
    int64_t *res = calloc(rd->n, sizeof *res);
    if (!res)
        return fr_rl_fail(err, FERRY_ENOMEM, "update: out of memory");
    int rc = ferry_store_get_into_ranges(rd->s, rd->r, rd->n, res);
    for (size_t i = 0; i < rd->n; i++) {
        if (res[i] == (int64_t)rd->r[i].len) {
            rd->st->bytes_read += rd->r[i].len;
            continue;
        }
        const ferry_weight_entry *e = &rd->m->entries[rd->who[i]];
        rc = fr_rl_fail(err, FERRY_EREBUILD, "tensor %s: a read of %" PRIu64 " bytes at %" PRIu64
                  " returned %" PRId64 " (%s); the parameters must be rebuilt", e->name,
                  rd->r[i].len, rd->r[i].src_offset, res[i],
                  res[i] < 0 ? ferry_store_last_error() : "short");
        break;
    }
    rd->st->ranges += rd->n;
    rd->n = 0;
    free(res);
    return rc < 0 ? rc : 0;
}

static int add_range(void *ctx, size_t entry, uint64_t off, void *dst, uint64_t len,
                     ferry_error *err)
{
    reader *rd = ctx;
    rd->r[rd->n] = (ferry_range){ .key = rd->m->entries[entry].key, .src_offset = off,
                                  .dst = dst, .len = len };
    rd->who[rd->n++] = entry;
    return rd->n == FLUSH_RANGES ? flush(rd, err) : 0;
}

int fr_rl_cmp_entry_name(const void *a, const void *b)
{
    const ferry_weight_entry *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Runs of one shard: along the innermost dims that are whole in the tensor
 * and contiguous in dst, folded as far out as they stay so. */
int fr_rl_shard_runs(const ferry_weight_manifest *m, size_t ei, const ferry_param_shard *p,
                     fr_rl_emit_fn emit, void *ctx, ferry_error *err)
{
    const ferry_weight_entry *e = &m->entries[ei];
    uint32_t nd = e->ndim;
    uint64_t isz = ferry_dtype_size(e->dtype);
    if (p->ndim != nd)
        return fr_rl_fail(err, FERRY_EINVAL, "shard of %s has %u dims, the tensor %u", e->name,
                    p->ndim, nd);
    int64_t ds[FERRY_MAX_DIMS];
    uint64_t ts[FERRY_MAX_DIMS], inner = 1, dinner = 1;
    bool strided = false;
    for (uint32_t d = nd; d-- > 0;) {
        if (p->offset[d] > e->shape[d] || p->shape[d] > e->shape[d] - p->offset[d])
            return fr_rl_fail(err, FERRY_ERANGE, "shard of %s: dim %u [%" PRIu64 ", +%" PRIu64
                        ") outside %" PRIu64, e->name, d, p->offset[d], p->shape[d],
                        e->shape[d]);
        if (p->strides[d])
            strided = true;
        ts[d] = inner;
        inner *= e->shape[d];
        ds[d] = (int64_t)dinner;
        dinner *= p->shape[d];
    }
    if (strided)
        for (uint32_t d = 0; d < nd; d++)
            ds[d] = p->strides[d];
    for (uint32_t d = 0; d < nd; d++)
        if (p->shape[d] == 0)
            return 0;
    /* Fold: dims f..nd-1 form one run when every dim after f is whole and
     * dst is contiguous over them. */
    uint32_t f = nd ? nd - 1 : 0;
    uint64_t run = nd ? p->shape[nd - 1] : 1;
    if (nd && ds[nd - 1] != 1) {
        run = 1;                      /* element by element: a slow but exact path */
        f = nd;
    } else {
        while (f > 0 && p->shape[f] == e->shape[f] && ds[f - 1] == (int64_t)(p->shape[f] * (uint64_t)ds[f])) {
            f--;
            run *= p->shape[f];
        }
    }
    uint64_t idx[FERRY_MAX_DIMS] = {0};
    for (;;) {
        uint64_t src = 0, dst = 0;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t i = d < f ? idx[d] : 0;
            src += (p->offset[d] + i) * ts[d];
            dst += i * (uint64_t)ds[d];
        }
        int rc = emit(ctx, ei, src * isz, (uint8_t *)p->dst + dst * isz, run * isz, err);
        if (rc < 0)
            return rc;
        uint32_t d = f;
        while (d > 0) {
            d--;
            if (++idx[d] < p->shape[d])
                break;
            idx[d] = 0;
            if (d == 0)
                return 0;
        }
        if (f == 0)
            return 0;
    }
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
    const ferry_weight_entry **byname = malloc((m.n ? m.n : 1) * sizeof *byname);
    reader rd = { .s = s, .r = malloc(FLUSH_RANGES * sizeof *rd.r),
                  .who = malloc(FLUSH_RANGES * sizeof *rd.who), .st = st, .m = &m };
    if (!byname || !rd.r || !rd.who)
        rc = fr_rl_fail(err, FERRY_ENOMEM, "update: out of memory");
    for (size_t i = 0; rc == 0 && i < m.n; i++)
        byname[i] = &m.entries[i];
    if (rc == 0)
        qsort(byname, m.n, sizeof *byname, fr_rl_cmp_entry_name);
    double t1 = now_s();
    for (size_t i = 0; rc == 0 && i < n; i++) {
        ferry_weight_entry probe;
        snprintf(probe.name, sizeof probe.name, "%s", shards[i].tensor ? shards[i].tensor : "");
        const ferry_weight_entry *pp = &probe;
        const ferry_weight_entry **hit = bsearch(&pp, byname, m.n, sizeof *byname, fr_rl_cmp_entry_name);
        if (!hit) {
            rc = fr_rl_fail(err, FERRY_ENOENT, "tensor %s is not in generation %" PRIu64 " of %s",
                      probe.name, m.generation, model);
            break;
        }
        rc = fr_rl_shard_runs(&m, (size_t)(*hit - m.entries), &shards[i], add_range, &rd, err);
        st->tensors++;
    }
    if (rc == 0)
        rc = flush(&rd, err);
    st->read_s = now_s() - t1;
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
    }
    free(byname), free(rd.r), free(rd.who);
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
