/* Publishing a weight generation from every trainer rank (weights.h): each
 * rank's side of an attempt. KV layout of a model M (generation G as 20
 * digits):
 *
 *   ferry/wk/M/active       "G <digest hex>[ <policy record JSON>]": the announced generation
 *   ferry/wk/M/history      announced generations still stored, ascending
 *   ferry/wk/M/sparse       the last sparse announcement's value, written just before it
 *                           (gen_sparse.c, ferry_sparse_active)
 *   ferry/wk/M/G/part/R     rank R's part of its current attempt: "ok 2" then "<digest of
 *                           its stored placement> <objects> <segment> <checksums hash>", or
 *                           "failed <code> <why>"; removed once a failed attempt is decided
 *                           (before its objects), kept after a successful one until
 *                           retention (overlapped updates read it: pull_early.c)
 *   ferry/wk/M/G/parts      the barrier every rank of an attempt meets at; the number of
 *                           its release numbers the attempt (A)
 *   ferry/wk/M/G/status     attempt A's decision: "A deciding", "A ok", "A failed <code> <why>"
 *                           (publish_decide.c)
 *   ferry/wk/M/G/manifest   the generation text (gen_int.h; the digest is over it)
 *   ferry/wk/M/G/probe      "segment TAB key" of one object per store segment it landed on
 *
 * What the trainers hold is a placement (a reshard manifest); its stored
 * form is packed into each rank's objects (gen_int.h, publish_mine.c). A
 * publish of whole tensors is the placement "rank r holds the pieces it is
 * assigned": tensors larger than a tenth of a rank's share (and 1 MiB)
 * are cut into dim-0 pieces first, so no rank stores much more than its
 * share.
 *
 * Cleanup (docs/weights.md, "Failures and cleanup"): a rank removes only
 * what it stored itself in the current attempt, when the attempt fails;
 * leftovers of ranks that died are replaced by a retry of the generation
 * (put_mine) or removed once a newer generation is announced
 * (publish_keep.c). Nobody removes another rank's objects during an
 * attempt, so a fast retry can never lose objects to a slow failed one. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/policy_int.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

/* ---- one attempt ------------------------------------------------------------------------ */

/* Every rank's side: prepare and store (unless `why`, this rank's own
 * failure, is given, or the placement is missing), leave a part, meet at
 * the barrier, then decide (rank 0) or wait for the decision. */
/* A streamed rank's pieces (sx) as the prepared attempt's: the same
 * packing, its checksums, its counters. */
static int adopt(fr_pub_mine *m, const ferry_publisher_config *c, const fr_pub_streamed *sx,
                 ferry_publish_stats *st, ferry_error *err)
{
    if (m->npieces != sx->npieces || m->nobjects != sx->nobjects)
        return fr_fail(err, FERRY_EPROTO, "rank %u streamed %zu pieces in %u objects; the "
                       "placement packs %zu in %u", c->rank, sx->npieces, sx->nobjects,
                       m->npieces, m->nobjects);
    for (size_t i = 0; i < m->npieces; i++) {
        const ferry_packed *a = &m->pieces[i].at, *b = &sx->at[i];
        if (a->object != b->object || a->offset != b->offset || a->bytes != b->bytes)
            return fr_fail(err, FERRY_EPROTO, "rank %u streamed piece %zu to object %u at %"
                           PRIu64 " (%" PRIu64 " bytes); the placement packs it to object %u "
                           "at %" PRIu64 " (%" PRIu64 ")", c->rank, i, b->object, b->offset,
                           b->bytes, a->object, a->offset, a->bytes);
    }
    m->sums = malloc((m->npieces ? m->npieces : 1) * sizeof *m->sums);
    if (!m->sums)
        return fr_fail(err, FERRY_ENOMEM, "publish: out of memory");
    memcpy(m->sums, sx->sums, m->npieces * sizeof *m->sums);
    m->segment = sx->segment;
    m->streamed = true;
    st->tensors = sx->tensors;
    st->bytes = sx->bytes;
    st->cross_node_bytes = sx->cross_node_bytes;
    st->local_bytes = sx->local_bytes;
    st->convert_s = sx->convert_s;
    st->store_s = sx->store_s;
    return 0;
}

static int attempt(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                   const char *record, ferry_manifest *placement, const ferry_shard_data *data,
                   size_t n, const char *why, const fr_pub_streamed *sx, ferry_publish_stats *st,
                   ferry_error *err)
{
    ferry_publisher_config resolved = *c;
    fr_rl_publisher_resolve(&resolved);
    c = &resolved;
    /* Generations only move forward: refuse before storing (or replacing)
     * anything under an existing generation's keys. */
    uint64_t active = 0;
    int rc = fr_rl_active_read(s, c->model, &active, NULL, err);
    if (rc < 0 && rc != FERRY_ENOENT)
        return fr_fail(err, rc, "publish: cannot read the active generation of %s: %s", c->model,
                    fr_why(err, rc));
    if (active >= gen)
        return fr_fail(err, FERRY_EINVAL, "publish: generation %" PRIu64 " of %s is not newer "
                    "than the active %" PRIu64, gen, c->model, active);
    double t0 = (double)fr_now_ns() / 1e9;
    fr_pub_mine mine = {0};
    ferry_error me = {0};
    int my_rc = why ? fr_fail(&me, FERRY_EINVAL, "%s", why)
                    : fr_pub_mine_prepare(&mine, c, placement, data, n, &me);
    if (my_rc == 0 && sx)
        my_rc = adopt(&mine, c, sx, st, &me);
    /* FP8 blocks: the ranks agree on the scales of blocks their shards cut.
     * Every rank meets the others whenever rules are given, one that failed
     * here too: it cannot know whether the others need it. */
    if (c->quant) {
        ferry_error qe = {0};
        int qrc = fr_pub_quant_agree(s, c, gen, &mine, my_rc < 0, &qe);
        if (my_rc == 0 && qrc < 0) {
            my_rc = qrc;
            me = qe;
        }
    }
    if (my_rc == 0) {
        st->total_tensors = ferry_manifest_tensor_count(mine.stored);
        for (uint64_t id = 0; id < ferry_manifest_fragment_count(mine.stored); id++) {
            ferry_packed pk;
            (void)ferry_pack_fragment(mine.pack, id, &pk);
            st->total_bytes += pk.bytes;
        }
        my_rc = fr_pub_mine_store(s, c, gen, placement, &mine, st, &me);
    }
    st->put_s = (double)fr_now_ns() / 1e9 - t0;

    /* Every rank leaves its part, good or bad, and meets the others. */
    char pv[900], dh[33];
    if (my_rc < 0) {
        snprintf(pv, sizeof pv, "failed %d %s\n", my_rc, me.msg[0] ? me.msg : ferry_strerror(my_rc));
        for (char *q = pv + 7; *q && q[1]; q++)
            if (*q == '\n')
                *q = ' ';
    } else {
        ferry_digest_hex(mine.digest, dh);
        snprintf(pv, sizeof pv, "ok 2\n%s %u %" PRIu64 " %016" PRIx64 "\n", dh, mine.nobjects,
                 mine.segment, mine.sums_hash);
    }
    char pk[FR_KEY_MAX], bk[FR_KEY_MAX], member[32];
    (void)fr_key_wk_part(pk, sizeof pk, c->model, gen, c->rank);
    uint64_t tmo = c->timeout_ms;
    rc = ferry_kv_put(s, pk, pv, strlen(pv), NULL, err);
    fr_pub_decision d = {0};
    if (rc < 0) {
        /* Without a part of this attempt it must not arrive (the
         * coordinator would read an earlier attempt's). */
        fr_pub_mine_remove(s, c, gen, &mine);
        fr_pub_mine_free(&mine);
        return fr_fail(err, rc, "publish of %s generation %" PRIu64 " failed: rank %u cannot "
                       "record its part: %s", c->model, gen, c->rank, fr_why(err, rc));
    }
    fr_key_wk(bk, sizeof bk, c->model, gen, "parts");
    snprintf(member, sizeof member, "rank %u", c->rank);
    uint64_t a = 0;
    int brc = ferry_barrier(s, bk, member, c->world, tmo, &a, err);
    double t1 = (double)fr_now_ns() / 1e9;
    st->barrier_s = t1 - t0 - st->put_s;   /* recording the part, then the barrier */
    if (brc == FERRY_ETIMEDOUT) {
        d.rc = brc;
        snprintf(d.why, sizeof d.why, "not every trainer rank arrived within %" PRIu64 " ms", tmo);
    } else if (brc < 0) {
        d.rc = brc;
        snprintf(d.why, sizeof d.why, "rank %u cannot meet the other ranks: %s", c->rank,
                 fr_why(err, brc));
    } else if (c->rank == 0) {
        fr_rl_decide(s, c, gen, a, my_rc == 0 ? &mine : NULL, record, st, &d);
    } else {
        fr_rl_await(s, c, gen, a, &d);
    }
    st->commit_s = (double)fr_now_ns() / 1e9 - t1;
    /* A failed attempt's part goes before its objects: an overlapped
     * update that read them sees it gone (pull_early.c). A successful
     * one's stays, for the same check, until retention drops the
     * generation's keys. */
    if (d.rc < 0)
        (void)ferry_kv_delete(s, pk, 0, NULL, NULL);
    if (d.rc < 0 && !d.keep)
        fr_pub_mine_remove(s, c, gen, &mine);
    fr_pub_mine_free(&mine);
    if (d.rc < 0)
        return fr_fail(err, d.rc, "publish of %s generation %" PRIu64 " failed: %s", c->model,
                       gen, d.why);
    return 0;
}

static bool config_ok(ferry_store *s, const ferry_publisher_config *c, uint64_t gen)
{
    return s && c && gen != 0 && c->world != 0 && c->rank < c->world && c->model[0] &&
           !strchr(c->model, '/') && memchr(c->model, '\0', sizeof c->model) &&
           FR_RESERVED_OK(c);
}

int ferry_publish_shards(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                         ferry_manifest *placement, const ferry_shard_data *mine, size_t n,
                         ferry_publish_stats *st, ferry_error *err)
{
    ferry_publish_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!config_ok(s, c, gen) || !placement || (n && !mine))
        return fr_fail(err, FERRY_EINVAL, "publish: bad arguments (model, rank, world, "
                       "generation, placement)");
    uint64_t f0 = fr_minor_faults(), t0 = fr_now_ns();
    int rc = attempt(s, c, gen, NULL, placement, mine, n, NULL, NULL, st, err);
    st->faults = fr_minor_faults() - f0;
    st->total_s = (double)(fr_now_ns() - t0) / 1e9;
    return rc;
}

int ferry_publish_warm(ferry_store *s, const ferry_publisher_config *c, ferry_manifest *placement,
                       uint64_t *bytes, ferry_error *err)
{
    uint64_t none = 0, most = 0, seg = 0;
    if (!bytes)
        bytes = &none;
    *bytes = 0;
    if (!config_ok(s, c, 1) || !placement)
        return fr_fail(err, FERRY_EINVAL, "publish warm-up: bad arguments (model, rank, "
                       "world, placement)");
    int rc = fr_pub_mine_most(c, placement, &most, err);
    if (rc < 0)
        return rc;
    void *stage = NULL;
    if (most && (rc = ferry_store_staging_take(s, (size_t)most, &stage, err)) < 0)
        return fr_fail(err, rc, "publish warm-up: %s", fr_why(err, rc));
    if (stage) {
        memset(stage, 0, (size_t)most);   /* the pages a publish packs into */
        ferry_store_staging_give(s, false);
        *bytes += most;
    }
    rc = ferry_store_warm(s, true, &seg, err);
    *bytes += seg;
    if (rc < 0)
        return fr_fail(err, rc, "publish warm-up: %s", fr_why(err, rc));
    return 0;
}

/* ---- whole tensors: the placement of their assigned pieces -------------------------------- */

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const ferry_weight_tensor *const *)a)->name,
                  (*(const ferry_weight_tensor *const *)b)->name);
}

static int check_names_unique(const ferry_weight_tensor *t, size_t n, ferry_error *err)
{
    const ferry_weight_tensor **by = malloc((n ? n : 1) * sizeof *by);
    if (!by)
        return fr_fail(err, FERRY_ENOMEM, "out of memory checking the tensor names");
    for (size_t i = 0; i < n; i++)
        by[i] = &t[i];
    qsort(by, n, sizeof *by, by_name);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (!strcmp(by[i - 1]->name, by[i]->name))
            rc = fr_fail(err, FERRY_EINVAL, "tensor %s is named twice", by[i]->name);
    free(by);
    return rc;
}

static int check_tensors(const ferry_weight_tensor *t, size_t n, ferry_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (!t[i].name || !*t[i].name)
            return fr_fail(err, FERRY_EINVAL, "tensor %zu has no usable name", i);
        if (!t[i].dtype || !ferry_dtype_size(t[i].dtype) || t[i].ndim > FERRY_MAX_DIMS)
            return fr_fail(err, FERRY_EINVAL, "tensor %s: unknown dtype or too many dims",
                           t[i].name);
        for (uint32_t d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] == 0)
                return fr_fail(err, FERRY_EINVAL, "tensor %s: dimension %u is 0", t[i].name, d);
        if (!t[i].data)
            return fr_fail(err, FERRY_EINVAL, "tensor %s: no data", t[i].name);
    }
    return check_names_unique(t, n, err);
}

/* The placement of whole tensors: each cut along dim 0 into pieces of at
 * most a tenth of a rank's share or 1 MiB (whole rows), the pieces assigned by
 * ferry_weights_assign, so no rank stores more than about 1.1x its share.
 * *data gets this rank's pieces (pointers into the tensors). */
int fr_rl_whole_placement(const ferry_publisher_config *c, const ferry_weight_tensor *t, size_t n,
                          ferry_manifest **out, ferry_shard_data **data, size_t *ndata,
                          ferry_error *err)
{
    const char *od = c->out_dtype;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = ferry_dtype_size(od[0] ? od : t[i].dtype);
        for (uint32_t d = 0; d < t[i].ndim; d++)
            b *= t[i].shape[d];
        total += b;
    }
    /* Pieces of a tenth of a rank's share keep every rank within about
     * 1.1x of it; below 1 MiB a cut is not worth a piece. One rank stores
     * everything anyway: no cut. */
    uint64_t cap = c->world > 1 ? total / c->world / 10 : UINT64_MAX;
    if (cap < (1u << 20))
        cap = 1u << 20;
    typedef struct { size_t t; uint64_t row0, rows, bytes; } cut;
    cut *cuts = NULL;
    size_t ncuts = 0, ccap = 0;
    int rc = ferry_manifest_create(c->world, NULL, 1, out);
    for (size_t i = 0; i < n && rc >= 0; i++) {
        ferry_tensor_desc d = { .name = t[i].name, .dtype = t[i].dtype,
                                .itemsize = ferry_dtype_size(t[i].dtype), .ndim = t[i].ndim };
        memcpy(d.shape, t[i].shape, sizeof d.shape);
        rc = ferry_manifest_add_tensor(*out, &d, err);
        uint64_t rows = t[i].ndim ? t[i].shape[0] : 1, row = ferry_dtype_size(od[0] ? od : t[i].dtype);
        for (uint32_t k = 1; k < t[i].ndim; k++)
            row *= t[i].shape[k];
        uint64_t per = cap / row ? cap / row : 1;   /* rows per piece */
        for (uint64_t r0 = 0; r0 < rows && rc >= 0; r0 += per) {
            if (fr_grow((void **)&cuts, &ccap, ncuts + 1, sizeof *cuts) < 0)
                rc = FERRY_ENOMEM;
            else
                cuts[ncuts++] = (cut){ i, r0, rows - r0 < per ? rows - r0 : per,
                                       (rows - r0 < per ? rows - r0 : per) * row };
        }
    }
    uint64_t *sizes = malloc((ncuts ? ncuts : 1) * sizeof *sizes);
    uint32_t *pub = malloc((ncuts ? ncuts : 1) * sizeof *pub);
    if (rc >= 0 && (!sizes || !pub))
        rc = FERRY_ENOMEM;
    for (size_t k = 0; k < ncuts && rc >= 0; k++)
        sizes[k] = cuts[k].bytes;
    if (rc >= 0)
        rc = ferry_weights_assign(sizes, ncuts, c->rank_node, c->world, pub, err);
    size_t dcap = 0;
    for (size_t k = 0; k < ncuts && rc >= 0; k++) {
        const ferry_weight_tensor *x = &t[cuts[k].t];
        ferry_fragment f = { .tensor = (uint32_t)cuts[k].t, .rank = pub[k] };
        for (uint32_t d = 0; d < x->ndim; d++)
            f.shape[d] = x->shape[d];
        if (x->ndim) {
            f.offset[0] = cuts[k].row0;
            f.shape[0] = cuts[k].rows;
        }
        uint64_t id = ferry_manifest_fragment_count(*out);
        rc = ferry_manifest_add_fragment(*out, &f, err);
        if (rc >= 0 && pub[k] == c->rank) {
            uint64_t inrow = ferry_dtype_size(x->dtype);
            for (uint32_t d = 1; d < x->ndim; d++)
                inrow *= x->shape[d];
            if (fr_grow((void **)data, &dcap, *ndata + 1, sizeof **data) < 0)
                rc = FERRY_ENOMEM;
            else
                (*data)[(*ndata)++] = (ferry_shard_data){
                    .fragment = id, .data = (const uint8_t *)x->data + cuts[k].row0 * inrow };
        }
    }
    free(cuts);
    free(sizes);
    free(pub);
    if (rc < 0 && !(err && err->msg[0]))
        fr_fail(err, rc, "publish: %s", ferry_strerror(rc));
    return rc < 0 ? rc : 0;
}

int ferry_publish(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                  const ferry_weight_tensor *t, size_t n, ferry_publish_stats *st,
                  ferry_error *err)
{
    return fr_rl_publish(s, c, gen, NULL, t, n, st, err);
}

int fr_rl_publish(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                  const char *record, const ferry_weight_tensor *t, size_t n,
                  ferry_publish_stats *st, ferry_error *err)
{
    ferry_publish_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!config_ok(s, c, gen) || !c->rank_node || (n && !t))
        return fr_fail(err, FERRY_EINVAL, "publish: bad arguments (model, rank, world, generation, "
                       "rank_node)");
    uint64_t f0 = fr_minor_faults(), t0 = fr_now_ns();
    ferry_manifest *pl = NULL;
    ferry_shard_data *data = NULL;
    size_t nd = 0;
    ferry_error me = {0};
    int my_rc = check_tensors(t, n, &me);
    if (my_rc == 0)
        my_rc = fr_rl_whole_placement(c, t, n, &pl, &data, &nd, &me);
    int rc = attempt(s, c, gen, record, pl, data, nd, my_rc < 0 ? me.msg : NULL, NULL, st, err);
    if (my_rc < 0 && rc < 0 && err)
        err->code = rc;
    free(data);
    ferry_manifest_close(pl);
    st->faults = fr_minor_faults() - f0;
    st->total_s = (double)(fr_now_ns() - t0) / 1e9;
    return rc;
}

int fr_rl_publish_streamed(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                           ferry_manifest *placement, const fr_pub_streamed *sx, const char *why,
                           ferry_publish_stats *st, ferry_error *err)
{
    uint64_t f0 = fr_minor_faults(), t0 = fr_now_ns();
    /* this rank's fragments (copy 0): stored already, so no data is read */
    uint64_t nf = placement ? ferry_manifest_fragment_count(placement) : 0;
    ferry_shard_data *data = calloc(nf ? nf : 1, sizeof *data);
    size_t n = 0;
    for (uint64_t id = 0; data && id < nf; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(placement, id, &f) == 0 && f.rank == c->rank && f.replica == 0)
            data[n++] = (ferry_shard_data){ .fragment = id, .data = sx };
    }
    int rc = !data ? fr_fail(err, FERRY_ENOMEM, "publish: out of memory")
                   : attempt(s, c, gen, NULL, placement, data, n, why, why ? NULL : sx, st, err);
    free(data);
    st->put_s += sx ? sx->convert_s + sx->store_s : 0;
    st->faults += fr_minor_faults() - f0;
    st->total_s += (double)(fr_now_ns() - t0) / 1e9;
    return rc;
}

int ferry_publish_abort(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                        const char *why, ferry_error *err)
{
    if (!config_ok(s, c, gen))
        return fr_fail(err, FERRY_EINVAL, "publish: bad arguments (model, rank, world, generation, "
                       "rank_node)");
    ferry_publish_stats st = {0};
    char w[512];
    snprintf(w, sizeof w, "%s", why && *why ? why : "it gave up");
    for (char *p = w; *p; p++)
        if (*p == '\n' || *p == '\t')
            *p = ' ';   /* one line in the part and the status */
    int rc = attempt(s, c, gen, NULL, NULL, NULL, 0, w, NULL, &st, err);
    return rc < 0 ? rc : fr_fail(err, FERRY_EPROTO, "publish of %s generation %" PRIu64
                                 " was announced without rank %u", c->model, gen, c->rank);
}
