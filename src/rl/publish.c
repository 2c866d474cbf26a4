/* Publishing a weight generation from every trainer rank (weights.h): each
 * rank's side of an attempt. KV layout of a model M (generation G as 20
 * digits):
 *
 *   ferry/wk/M/active       "G <digest hex>[ <policy record JSON>]": the announced generation
 *   ferry/wk/M/history      announced generations still stored, ascending
 *   ferry/wk/M/G/part/R     rank R's part of its current attempt: "ok" then its lines, or
 *                           "failed <code> <why>"; removed once the attempt is decided
 *   ferry/wk/M/G/parts      the barrier every rank of an attempt meets at; the number of
 *                           its release numbers the attempt (A)
 *   ferry/wk/M/G/status     attempt A's decision: "A deciding", "A ok", "A failed <code> <why>"
 *                           (publish_decide.c)
 *   ferry/wk/M/G/manifest   every line, in tensor order (the digest is over this text)
 *   ferry/wk/M/G/probe      "segment TAB key" of one object per store segment it landed on
 *
 * A line: name TAB dtype TAB shape (d0,d1,..) TAB bytes TAB checksum (hex)
 * TAB publisher TAB segment TAB store key TAB tensor index. Objects live
 * under ferry_weights_key(M, G, name).
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
#include "rl/policy_int.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

/* A growing text buffer. */
typedef struct sbuf { char *p; size_t n, cap; bool oom; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

static uint64_t tensor_bytes(const ferry_weight_tensor *t, const char *dtype)
{
    uint64_t b = ferry_dtype_size(dtype);
    for (uint32_t d = 0; d < t->ndim; d++)
        if (fr_mul_u64(b, t->shape[d], &b) < 0)
            return 0;
    return b;
}

static const char *out_dtype(const ferry_publisher_config *c, const ferry_weight_tensor *t)
{
    return c->out_dtype[0] ? c->out_dtype : t->dtype;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const ferry_weight_tensor *const *)a)->name,
                  (*(const ferry_weight_tensor *const *)b)->name);
}

/* Two tensors of one name would share a key (and the second would replace
 * the first: put_one replaces leftovers). */
static int check_names_unique(const ferry_weight_tensor *t, size_t n, ferry_error *err)
{
    const ferry_weight_tensor **by = malloc((n ? n : 1) * sizeof *by);
    if (!by)
        return fr_rl_fail(err, FERRY_ENOMEM, "out of memory checking the tensor names");
    for (size_t i = 0; i < n; i++)
        by[i] = &t[i];
    qsort(by, n, sizeof *by, by_name);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (!strcmp(by[i - 1]->name, by[i]->name))
            rc = fr_rl_fail(err, FERRY_EINVAL, "tensor %s is named twice", by[i]->name);
    free(by);
    return rc;
}

static int check_tensors(const ferry_weight_tensor *t, size_t n, const ferry_publisher_config *c,
                         ferry_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (!t[i].name || !*t[i].name || strpbrk(t[i].name, "\t\n") ||
            strlen(t[i].name) >= sizeof ((ferry_weight_entry *)0)->name)
            return fr_rl_fail(err, FERRY_EINVAL, "tensor %zu has no usable name", i);
        if (!t[i].dtype || !ferry_dtype_size(t[i].dtype) || t[i].ndim > FERRY_MAX_DIMS ||
            !ferry_dtype_size(out_dtype(c, &t[i])))
            return fr_rl_fail(err, FERRY_EINVAL, "tensor %s: unknown dtype or too many dims",
                        t[i].name);
        if (strcmp(t[i].dtype, out_dtype(c, &t[i])) != 0 &&
            ferry_convert(NULL, t[i].dtype, NULL, out_dtype(c, &t[i]), 0) < 0)
            return fr_rl_fail(err, FERRY_EINVAL, "tensor %s: cannot convert %s to %s",
                        t[i].name, t[i].dtype, out_dtype(c, &t[i]));
    }
    return check_names_unique(t, n, err);
}

/* What this rank stored in the current attempt (tensor indices). */
typedef struct mine { size_t *idx; size_t n; } mine;

/* Put one object; an object already under the key is the leftover of an
 * earlier attempt at this generation (never announced: the caller checked
 * that the generation is newer than the active one) and is replaced. */
static int put_one(ferry_store *s, const char *key, const void *data, uint64_t nb,
                   const ferry_replicate_config *repl, ferry_object_desc *d)
{
    int rc = ferry_store_put_from(s, key, data, nb, repl, d);
    if (rc != FERRY_EEXIST)
        return rc;
    rc = ferry_store_remove(s, key);
    if (rc < 0 && rc != FERRY_ENOENT)
        return rc;
    return ferry_store_put_from(s, key, data, nb, repl, d);
}

/* Store this rank's tensors; append their lines to part. Returns 0 or the
 * first failure (the rest of the rank's tensors are not stored). */
static int put_mine(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                    const ferry_weight_tensor *t, size_t n, const uint32_t *pub, sbuf *part,
                    mine *m, ferry_publish_stats *st, ferry_error *err)
{
    ferry_replicate_config repl = { .replica_num = 1, .hard_pin = true,
                                  .preferred_segments = &c->segment,
                                  .npreferred = c->segment ? 1 : 0 };
    for (size_t i = 0; i < n; i++) {
        if (pub[i] != c->rank)
            continue;
        const char *od = out_dtype(c, &t[i]);
        uint64_t nb = tensor_bytes(&t[i], od), elems = nb / ferry_dtype_size(od);
        char key[1100];
        int rc2 = ferry_weights_key(c->model, gen, t[i].name, key, sizeof key);
        if (rc2 < 0 || rc2 > FERRY_STORE_KEY_MAX)
            return fr_rl_fail(err, FERRY_EINVAL, "tensor %s: key too long", t[i].name);
        const void *data = t[i].data;
        void *conv = NULL;
        uint64_t c0 = fr_now_ns();
        if (strcmp(od, t[i].dtype) != 0) {
            conv = malloc(nb ? nb : 1);
            if (!conv)
                return fr_rl_fail(err, FERRY_ENOMEM, "tensor %s: no memory to convert it",
                            t[i].name);
            (void)ferry_convert(t[i].data, t[i].dtype, conv, od, elems);
            data = conv;
        }
        uint64_t sum = fr_hash64(data, nb, 0);
        uint64_t c1 = fr_now_ns();
        ferry_object_desc d = {0};
        int rc = put_one(s, key, data, nb, &repl, &d);
        st->convert_s += (double)(c1 - c0) / 1e9;
        st->store_s += (double)(fr_now_ns() - c1) / 1e9;
        free(conv);
        if (rc < 0)
            return fr_rl_fail(err, rc, "could not store %s (%" PRIu64 " bytes): %s", t[i].name, nb,
                        ferry_store_last_error());
        m->idx[m->n++] = i;
        uint64_t seg = d.nreplicas ? d.replicas[0].segment : 0;
        st->tensors++;
        st->bytes += nb;
        if (c->segment && seg != c->segment)
            st->cross_node_bytes += nb;
        else if (c->segment)
            st->local_bytes += nb;
        sb_printf(part, "%s\t%s\t", t[i].name, od);
        for (uint32_t k = 0; k < t[i].ndim; k++)
            sb_printf(part, "%s%" PRIu64, k ? "," : "", t[i].shape[k]);
        sb_printf(part, "\t%" PRIu64 "\t%016" PRIx64 "\t%u\t%" PRIu64 "\t%s\t%zu\n", nb, sum,
                  c->rank, seg, key, i);
    }
    return 0;
}

/* The attempt failed: remove what this rank stored in it. */
static void remove_mine(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                        const ferry_weight_tensor *t, const mine *m)
{
    for (size_t j = 0; j < m->n; j++) {
        char key[1100];
        if (ferry_weights_key(c->model, gen, t[m->idx[j]].name, key, sizeof key) > 0)
            (void)ferry_store_remove(s, key);
    }
}

/* ---- one attempt ------------------------------------------------------------------------ */

/* Every rank's side: store (unless `why`, this rank's own failure, is
 * given), leave a part, meet at the barrier, then decide (rank 0) or wait
 * for the decision. */
static int attempt(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                   const char *record, const ferry_weight_tensor *t, size_t n, const char *why,
                   ferry_publish_stats *st, ferry_error *err)
{
    /* Generations only move forward: refuse before storing (or replacing)
     * anything under an existing generation's keys. */
    uint64_t active = 0;
    int rc = fr_rl_active_read(s, c->model, &active, NULL);
    if (rc < 0 && rc != FERRY_ENOENT)
        return fr_rl_fail(err, rc, "publish: cannot read the active generation of %s: %s", c->model,
                    ferry_store_last_error());
    if (active >= gen)
        return fr_rl_fail(err, FERRY_EINVAL, "publish: generation %" PRIu64 " of %s is not newer "
                    "than the active %" PRIu64, gen, c->model, active);
    mine m = { .idx = malloc((n ? n : 1) * sizeof *m.idx) };
    uint32_t *pub = malloc((n ? n : 1) * sizeof *pub);
    uint64_t *sizes = malloc((n ? n : 1) * sizeof *sizes);
    if (!m.idx || !pub || !sizes) {
        free(m.idx), free(pub), free(sizes);
        return fr_rl_fail(err, FERRY_ENOMEM, "publish: out of memory");
    }
    double t0 = (double)fr_now_ns() / 1e9;
    sbuf part = {0};
    ferry_error me = {0};
    int my_rc = why ? fr_rl_fail(&me, FERRY_EINVAL, "%s", why) : check_tensors(t, n, c, &me);
    if (my_rc == 0) {
        for (size_t i = 0; i < n; i++) {
            sizes[i] = tensor_bytes(&t[i], out_dtype(c, &t[i]));
            st->total_tensors++;
            st->total_bytes += sizes[i];
        }
        my_rc = ferry_weights_assign(sizes, n, c->rank_node, c->world, pub, &me);
    }
    if (my_rc == 0)
        my_rc = put_mine(s, c, gen, t, n, pub, &part, &m, st, &me);
    free(pub);
    free(sizes);
    st->put_s = (double)fr_now_ns() / 1e9 - t0;

    /* Every rank leaves its part, good or bad, and meets the others. */
    sbuf pv = {0};
    if (my_rc < 0)
        sb_printf(&pv, "failed %d %s\n", my_rc, me.msg[0] ? me.msg : ferry_strerror(my_rc));
    else
        sb_printf(&pv, "ok\n%.*s", (int)part.n, part.p ? part.p : "");
    free(part.p);
    char pk[300], bk[300], what[32], member[32];
    snprintf(what, sizeof what, "part/%u", c->rank);
    fr_wk_key(pk, sizeof pk, c->model, gen, what);
    uint64_t tmo = c->timeout_ms ? c->timeout_ms : 60000;
    rc = pv.oom ? FERRY_ENOMEM : ferry_kv_put(s, pk, pv.p, pv.n, NULL);
    free(pv.p);
    fr_pub_decision d = {0};
    if (rc < 0) {
        /* Without a part of this attempt it must not arrive (the
         * coordinator would read an earlier attempt's). */
        remove_mine(s, c, gen, t, &m);
        free(m.idx);
        return fr_rl_fail(err, rc, "publish of %s generation %" PRIu64 " failed: rank %u cannot "
                          "record its part: %s", c->model, gen, c->rank, ferry_store_last_error());
    }
    fr_wk_key(bk, sizeof bk, c->model, gen, "parts");
    snprintf(member, sizeof member, "rank %u", c->rank);
    uint64_t a = 0;
    int brc = ferry_barrier(s, bk, member, c->world, tmo, &a);
    double t1 = (double)fr_now_ns() / 1e9;
    st->barrier_s = t1 - t0 - st->put_s;   /* recording the part, then the barrier */
    if (brc == FERRY_ETIMEDOUT) {
        d.rc = brc;
        snprintf(d.why, sizeof d.why, "not every trainer rank arrived within %" PRIu64 " ms", tmo);
    } else if (brc < 0) {
        d.rc = brc;
        snprintf(d.why, sizeof d.why, "rank %u cannot meet the other ranks: %s", c->rank,
                 ferry_store_last_error());
    } else if (c->rank == 0) {
        fr_rl_decide(s, c, gen, a, n, record, st, &d);
    } else {
        fr_rl_await(s, c, gen, a, &d);
    }
    st->commit_s = (double)fr_now_ns() / 1e9 - t1;
    (void)ferry_kv_delete(s, pk, 0, NULL);   /* decided: nobody reads it again */
    if (d.rc < 0 && !d.keep)
        remove_mine(s, c, gen, t, &m);
    free(m.idx);
    if (d.rc < 0)
        return fr_rl_fail(err, d.rc, "publish of %s generation %" PRIu64 " failed: %s", c->model,
                          gen, d.why);
    return 0;
}

static bool config_ok(ferry_store *s, const ferry_publisher_config *c, uint64_t gen)
{
    return s && c && gen != 0 && c->world != 0 && c->rank < c->world && c->model[0] &&
           !strchr(c->model, '/') && memchr(c->model, '\0', sizeof c->model);
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
        return fr_rl_fail(err, FERRY_EINVAL, "publish: bad arguments (model, rank, world, generation)");
    return attempt(s, c, gen, record, t, n, NULL, st, err);
}

int ferry_publish_abort(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                        const char *why, ferry_error *err)
{
    if (!config_ok(s, c, gen))
        return fr_rl_fail(err, FERRY_EINVAL, "publish: bad arguments (model, rank, world, generation)");
    ferry_publish_stats st = {0};
    char w[512];
    snprintf(w, sizeof w, "%s", why && *why ? why : "it gave up");
    for (char *p = w; *p; p++)
        if (*p == '\n' || *p == '\t')
            *p = ' ';   /* one line in the part and the status */
    int rc = attempt(s, c, gen, NULL, NULL, 0, w, &st, err);
    return rc < 0 ? rc : fr_rl_fail(err, FERRY_EPROTO, "publish of %s generation %" PRIu64
                                    " was announced without rank %u", c->model, gen, c->rank);
}
