/* A delta publish across the trainer ranks (ferry_delta_publish, weights.h;
 * docs/sparse.md "Deltas from a trainer"). Every rank:
 *
 *   1. compares a sample of its copy-0 pieces with its snapshot (delta.c),
 *      or finds it has none, and writes its word "count" (KV
 *      ferry/wk/M/G/delta/count/R: "ok <have> <elements> <sampled>
 *      <changed in the sample> <chain>" or "failed <code> <why>"); barrier
 *      delta/count; every rank reads every word and takes the same
 *      decision: refuse (a rank failed: nothing stored anywhere), dense
 *      (ferry_publish_shards: no snapshot somewhere, the chain is full, the
 *      sample far above the crossover), or a look at everything: every
 *      rank compares all, writes "exact" ("ok <changed>"), barrier
 *      delta/exact, and the exact counts decide dense or sparse;
 *   2. sparse: hands the changed elements of tensors it does not own to
 *      their owners, one object per other rank on its own segment
 *      (ferry/w/M/G/dpart.R.O, always put, empty or not); barrier
 *      delta/parts; each owner reads the parts addressed to it, removes
 *      leftovers of deltas on the base that were never announced
 *      (ferry_sparse_remove_base) and puts one sparse object per changed
 *      tensor it owns; its word "stored" ("ok <n>" then the keys, or
 *      "failed ..."); barrier delta/stored;
 *   3. rank 0 reads every "stored" word and announces the keys
 *      (ferry_sparse_announce) or not, and writes the decision
 *      (ferry/wk/M/G/delta/decision: "ok" or "failed <code> <why>");
 *      barrier delta/decided; every rank reads it. On a failure every live
 *      rank removes the objects it put; what a dead rank left is removed
 *      by the next publish's owners (the base's leftovers) or, for its
 *      parts (ferry/w/M/G/...), by the sweep of unannounced generations.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "rl/delta_int.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

#define PART_MAGIC 0x31504446u   /* "FDP1" */

typedef struct run {
    ferry_store *s;
    ferry_delta_encoder *e;
    const ferry_publisher_config *c;
    uint64_t gen, base;
    fr_dlayout cur;
    ferry_delta_stats *st;
    char **keys;                 /* the sparse objects this rank put */
    uint64_t *segs;              /* where each landed */
    size_t nkeys;
    bool sweep;                  /* remove leftovers on the base first (an attempt on it failed,
                                  * or this rank knows nothing of the last ones) */
    int pre_rc;                  /* this rank failed before the sparse stages (pre_err) */
    ferry_error pre_err;
    uint8_t **parts;             /* parts read (owner), per rank */
    size_t *part_len;
} run;

static double now_s(void)
{
    return (double)fr_now_ns() / 1e9;
}

/* A word: "failed <code> <why>" on one line. */
static void failed_word(char *buf, size_t cap, int rc, const ferry_error *me)
{
    snprintf(buf, cap, "failed %d %s", rc, me->msg[0] ? me->msg : ferry_strerror(rc));
    for (char *q = buf; *q; q++)
        if (*q == '\n')
            *q = ' ';
}

/* Write this rank's word at stage, meet every rank there. */
static int meet(run *r, const char *stage, const char *word, ferry_error *err)
{
    char k[FR_KEY_MAX], member[32];
    if (word) {
        (void)fr_key_wk_delta(k, sizeof k, r->c->model, r->gen, stage, r->c->rank);
        int rc = ferry_kv_put(r->s, k, word, strlen(word), NULL, err);
        if (rc < 0)
            return fr_fail(err, rc, "rank %u cannot record its %s: %s", r->c->rank, stage,
                           fr_why(err, rc));
    }
    (void)fr_key_wk_delta(k, sizeof k, r->c->model, r->gen, stage, -1);
    snprintf(member, sizeof member, "rank %u", r->c->rank);
    int rc = ferry_barrier(r->s, k, member, r->c->world, r->c->timeout_ms, NULL, err);
    if (rc == FERRY_ETIMEDOUT)
        return fr_fail(err, rc, "not every trainer rank arrived at the %s stage within %" PRIu64
                       " ms", stage, r->c->timeout_ms);
    if (rc < 0)
        return fr_fail(err, rc, "rank %u cannot meet the other ranks: %s", r->c->rank,
                       fr_why(err, rc));
    return 0;
}

/* Rank q's word at stage (*val: ferry_store_free). A "failed" word gives
 * its code and sentence in err. */
static int word_of(run *r, const char *stage, int64_t q, ferry_kv_value *val, ferry_error *err)
{
    char k[FR_KEY_MAX];
    (void)fr_key_wk_delta(k, sizeof k, r->c->model, r->gen, stage, q);
    int rc = ferry_kv_get(r->s, k, val, err);
    if (rc < 0)
        return fr_fail(err, rc == FERRY_ENOENT ? FERRY_EPROTO : rc, "rank %" PRId64 " left no "
                       "%s word", q, stage);
    if (val->len >= 7 && !memcmp(val->val, "failed ", 7)) {
        char *why = NULL;
        int code = (int)strtol((char *)val->val + 7, &why, 10);
        int n = (int)(val->len - (size_t)(why - (char *)val->val));
        rc = fr_fail(err, code < 0 ? code : FERRY_EPROTO, "%.*s", n > 0 ? n - 1 : 0,
                     n > 0 ? why + 1 : "");
        ferry_store_free(val->val);
        val->val = NULL;
        return rc;
    }
    return 0;
}

/* This rank's words of generation gen go. Not at the end of the call that
 * wrote them: another rank may still be reading them (a failed first
 * stage has no later barrier), so at the start of this rank's next
 * publish of another generation. */
static void drop_words(ferry_store *s, const ferry_publisher_config *c, uint64_t gen)
{
    static const char *const stage[] = { "count", "exact", "stored" };
    for (size_t i = 0; i < sizeof stage / sizeof *stage; i++) {
        char k[FR_KEY_MAX];
        (void)fr_key_wk_delta(k, sizeof k, c->model, gen, stage[i], c->rank);
        (void)ferry_kv_delete(s, k, 0, NULL, NULL);
    }
}

/* ---- stage 1: the counts and the decision ------------------------------------------------- */

typedef struct counts {
    bool have;
    uint64_t elements, sampled, sample_changed, changed;
    uint32_t chain;
} counts;

/* Every rank's word at stage ("count": "ok <have> <elements> <sampled>
 * <changed in the sample> <chain>"; "exact": "ok <changed>"): 0 with the
 * sums, or the first failed rank's error. */
static int decide(run *r, const char *stage, counts *sum, ferry_error *err)
{
    bool count = !strcmp(stage, "count");
    if (count) {
        memset(sum, 0, sizeof *sum);
        sum->have = true;
    }
    for (uint32_t q = 0; q < r->c->world; q++) {
        ferry_kv_value v = {0};
        ferry_error we = {0};
        int rc = word_of(r, stage, q, &v, &we);
        if (rc < 0)
            return fr_fail(err, rc, "rank %u: %s", q, we.msg);
        unsigned have = 0, chain = 0;
        unsigned long long el = 0, sn = 0, sc = 0, ch = 0;
        char *t = strndup(v.val, v.len);
        int got = !t ? 0 : count ? sscanf(t, "ok %u %llu %llu %llu %u", &have, &el, &sn, &sc, &chain)
                                 : sscanf(t, "ok %llu", &ch);
        free(t);
        ferry_store_free(v.val);
        if (got != (count ? 5 : 1))
            return fr_fail(err, FERRY_EPROTO, "rank %u: its %s word is malformed", q, stage);
        if (count) {
            sum->have &= have != 0;
            sum->elements += el;
            sum->sampled += sn;
            sum->sample_changed += sc;
            if (chain > sum->chain)
                sum->chain = chain;
        } else {
            sum->changed += ch;
        }
    }
    return 0;
}

/* ---- stage 2: parts and objects ---------------------------------------------------------- */

/* The part this rank hands to owner o: "FDP1", sections; each section
 * u32 tensor, u32 0, u64 nnz, then the indices and the values. */
static int part_make(run *r, uint32_t o, uint8_t **out, size_t *len, ferry_error *err)
{
    const fr_dlayout *l = &r->cur;
    size_t n = 8;
    uint32_t nsec = 0;
    for (uint32_t t = 0; t < l->nt; t++) {
        uint64_t c = l->t[t].owner == o ? fr_delta_count(l, t) : 0;
        if (!c)
            continue;
        nsec++;
        n += 16 + c * (l->t[t].ndim * (l->t[t].i64 ? 8u : 4u) + ferry_dtype_size(l->t[t].out));
    }
    uint8_t *b = malloc(n);
    if (!b)
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory for a part of %zu bytes", n);
    uint32_t hdr[2] = { PART_MAGIC, nsec };
    memcpy(b, hdr, 8);
    size_t k = 8;
    for (uint32_t t = 0; t < l->nt; t++) {
        uint64_t c = l->t[t].owner == o ? fr_delta_count(l, t) : 0;
        if (!c)
            continue;
        uint32_t h[2] = { t, 0 };
        memcpy(b + k, h, 8);
        memcpy(b + k + 8, &c, 8);
        k += 16;
        size_t ib = c * l->t[t].ndim * (l->t[t].i64 ? 8u : 4u);
        (void)fr_delta_entries(l, t, b + k, b + k + ib);
        k += ib + c * ferry_dtype_size(l->t[t].out);
    }
    *out = b;
    *len = n;
    return 0;
}

static int parts_put(run *r, ferry_error *err)
{
    ferry_replicate_config repl = { .replica_num = 1, .preferred_segments = &r->c->segment,
                                    .npreferred = r->c->segment ? 1 : 0 };
    for (uint32_t o = 0; o < r->c->world; o++) {
        if (o == r->c->rank)
            continue;
        uint8_t *b = NULL;
        size_t len = 0;
        char k[FR_KEY_MAX];
        int rc = part_make(r, o, &b, &len, err);
        if (rc == 0) {
            (void)fr_key_delta_part(k, sizeof k, r->c->model, r->gen, r->c->rank, o);
            rc = fr_pub_put(r->s, k, b, len, &repl, NULL, err);
            if (rc < 0)
                fr_fail(err, rc, "rank %u cannot put its part for rank %u: %s", r->c->rank, o,
                        fr_why(err, rc));
            r->st->part_bytes += len - 8;
        }
        free(b);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void parts_remove(run *r)
{
    for (uint32_t o = 0; o < r->c->world; o++) {
        char k[FR_KEY_MAX];
        if (o == r->c->rank)
            continue;
        (void)fr_key_delta_part(k, sizeof k, r->c->model, r->gen, r->c->rank, o);
        (void)ferry_store_remove(r->s, k, NULL);   /* a lease keeps it: the sweep's then */
    }
}

/* Section of tensor t in part b (len bytes): *nnz and pointers, or false. */
static bool part_find(const fr_dlayout *l, const uint8_t *b, size_t len, uint32_t t,
                      uint64_t *nnz, const uint8_t **idx, const uint8_t **val)
{
    uint32_t hdr[2];
    if (len < 8)
        return false;
    memcpy(hdr, b, 8);
    size_t k = 8;
    for (uint32_t i = 0; i < hdr[1] && k + 16 <= len; i++) {
        uint32_t h[2];
        uint64_t c;
        memcpy(h, b + k, 8);
        memcpy(&c, b + k + 8, 8);
        if (h[0] >= l->nt)
            return false;
        size_t ib = c * l->t[h[0]].ndim * (l->t[h[0]].i64 ? 8u : 4u);
        size_t vb = c * ferry_dtype_size(l->t[h[0]].out);
        if (k + 16 + ib + vb > len)
            return false;
        if (h[0] == t) {
            *nnz = c;
            *idx = b + k + 16;
            *val = b + k + 16 + ib;
            return true;
        }
        k += 16 + ib + vb;
    }
    return false;
}

static int parts_get(run *r, ferry_error *err)
{
    uint32_t w = r->c->world;
    r->parts = calloc(w, sizeof *r->parts);
    r->part_len = calloc(w, sizeof *r->part_len);
    if (!r->parts || !r->part_len)
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    for (uint32_t q = 0; q < w; q++) {
        char k[FR_KEY_MAX];
        if (q == r->c->rank)
            continue;
        (void)fr_key_delta_part(k, sizeof k, r->c->model, r->gen, q, r->c->rank);
        void *b = NULL;
        int rc = ferry_store_get(r->s, k, &b, &r->part_len[q], err);
        if (rc < 0)
            return fr_fail(err, rc, "the changed elements rank %u hands to rank %u cannot be "
                           "read: %s", q, r->c->rank, fr_why(err, rc));
        r->parts[q] = b;
        uint32_t hdr[2] = {0};
        if (r->part_len[q] >= 8)
            memcpy(hdr, b, 8);
        if (hdr[0] != PART_MAGIC)
            return fr_fail(err, FERRY_EPROTO, "the part rank %u hands to rank %u is malformed",
                           q, r->c->rank);
    }
    return 0;
}

/* One sparse object for tensor t (this rank owns it): its own entries and
 * the parts', concatenated (the put sorts them). */
static int object_put(run *r, uint32_t t, ferry_error *err)
{
    const fr_dlayout *l = &r->cur;
    const fr_dtensor *x = &l->t[t];
    size_t isz = x->i64 ? 8 : 4, osz = ferry_dtype_size(x->out), row = x->ndim * isz;
    uint64_t nnz = fr_delta_count(l, t);
    for (uint32_t q = 0; q < r->c->world; q++) {
        uint64_t c = 0;
        const uint8_t *pi, *pv;
        if (r->parts[q] && part_find(l, r->parts[q], r->part_len[q], t, &c, &pi, &pv))
            nnz += c;
    }
    int rc = r->sweep ? ferry_sparse_remove_base(r->s, x->name, r->base, NULL, err) : 0;
    if (rc < 0)
        return fr_fail(err, rc, "removing leftovers of %s on generation %" PRIu64 ": %s",
                       x->name, r->base, fr_why(err, rc));
    if (!nnz)
        return 0;
    uint8_t *idx = malloc(nnz * row), *val = malloc(nnz * osz);
    if (!idx || !val) {
        free(idx);
        free(val);
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory for %" PRIu64 " entries of %s",
                       nnz, x->name);
    }
    uint64_t n = fr_delta_entries(l, t, idx, val);
    for (uint32_t q = 0; q < r->c->world; q++) {
        uint64_t c = 0;
        const uint8_t *pi, *pv;
        if (!r->parts[q] || !part_find(l, r->parts[q], r->part_len[q], t, &c, &pi, &pv))
            continue;
        memcpy(idx + n * row, pi, c * row);
        memcpy(val + n * osz, pv, c * osz);
        n += c;
    }
    ferry_sparse_desc d = { .ndim = x->ndim, .base_generation = r->base,
                            .delta_generation = r->gen, .apply = FERRY_SPARSE_SCATTER_SET,
                            .nnz = nnz, .placement = { .kind = FERRY_SPARSE_REPLICATE } };
    snprintf(d.tensor_id, sizeof d.tensor_id, "%s", x->name);
    memcpy(d.shape, x->shape, sizeof d.shape);
    snprintf(d.index_dtype, sizeof d.index_dtype, "%s", x->i64 ? "i64" : "i32");
    snprintf(d.value_dtype, sizeof d.value_dtype, "%.7s", x->out);
    char key[FERRY_STORE_KEY_MAX + 1];
    ferry_sparse_desc got;
    rc = ferry_put_sparse_object(r->s, &d, idx, val, &got, key, sizeof key, err);
    if (rc == FERRY_EEXIST && r->sweep) {   /* a leftover of a failed attempt: replaced */
        (void)ferry_sparse_remove(r->s, key, NULL);
        rc = ferry_put_sparse_object(r->s, &d, idx, val, &got, key, sizeof key, err);
    }
    free(idx);
    free(val);
    if (rc == FERRY_EEXIST)
        return fr_fail(err, rc, "putting the delta of %s: %s (sparse keys carry no model: "
                       "two models on one store need distinct tensor names)", x->name,
                       fr_why(err, rc));
    if (rc < 0)
        return fr_fail(err, rc, "putting the delta of %s: %s", x->name, fr_why(err, rc));
    ferry_object_desc od;
    uint64_t seg = ferry_store_get_replica_desc(r->s, key, &od, NULL) == 0 && od.nreplicas
                       ? od.replicas[0].segment : 0;
    char *k = strdup(key);
    char **nk = k ? realloc(r->keys, (r->nkeys + 1) * sizeof *nk) : NULL;
    if (nk)
        r->keys = nk;
    uint64_t *ns = nk ? realloc(r->segs, (r->nkeys + 1) * sizeof *ns) : NULL;
    if (!ns) {
        free(k);
        (void)ferry_sparse_remove(r->s, key, NULL);
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    }
    r->segs = ns;
    r->segs[r->nkeys] = seg;
    r->keys[r->nkeys++] = k;
    r->st->objects++;
    r->st->nnz += got.nnz;
    r->st->stored_bytes += got.nnz * (row + osz);
    return 0;
}

/* The "stored" word: "ok <n>\n" then "<segment> TAB <key>" a line. */
static char *stored_word(const run *r)
{
    size_t n = 32;
    for (size_t i = 0; i < r->nkeys; i++)
        n += strlen(r->keys[i]) + 24;
    char *w = malloc(n);
    if (!w)
        return NULL;
    size_t k = (size_t)snprintf(w, n, "ok %zu\n", r->nkeys);
    for (size_t i = 0; i < r->nkeys; i++)
        k += (size_t)snprintf(w + k, n - k, "%" PRIu64 "\t%s\n", r->segs[i], r->keys[i]);
    return w;
}

/* Rank 0: every rank's keys, announced. */
static int announce(run *r, ferry_error *err)
{
    char **all = NULL, *probe = NULL;
    uint64_t *segs = NULL;
    size_t n = 0, cap = 0, scap = 0, pcap = 0, plen = 0;
    int rc = 0;
    char **kept = NULL;
    size_t nkept = 0;
    for (uint32_t q = 0; rc == 0 && q < r->c->world; q++) {
        ferry_kv_value v = {0};
        ferry_error we = {0};
        if ((rc = word_of(r, "stored", q, &v, &we)) < 0) {
            rc = fr_fail(err, rc, "rank %u: %s", q, we.msg);
            break;
        }
        char *t = strndup(v.val, v.len);
        ferry_store_free(v.val);
        char **nk = t ? realloc(kept, (nkept + 1) * sizeof *nk) : NULL;
        if (!nk) {
            free(t);
            rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
            break;
        }
        kept = nk;
        kept[nkept++] = t;
        char *save = NULL, *line = strtok_r(t, "\n", &save);   /* "ok <n>" */
        while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
            char *tab = strchr(line, '\t');
            if (!tab) {
                rc = fr_fail(err, FERRY_EPROTO, "rank %u: its stored word is malformed", q);
                break;
            }
            uint64_t seg = strtoull(line, NULL, 10);
            bool seen = false;   /* the probe: one object per segment */
            for (size_t i = 0; i < n && !seen; i++)
                seen = segs[i] == seg;
            if (fr_grow((void **)&all, &cap, n + 1, sizeof *all) < 0 ||
                fr_grow((void **)&segs, &scap, n + 1, sizeof *segs) < 0 ||
                (!seen && seg && fr_grow((void **)&probe, &pcap, plen + strlen(line) + 2, 1) < 0)) {
                rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
                break;
            }
            if (!seen && seg) {
                memcpy(probe + plen, line, strlen(line));
                plen += strlen(line);
                probe[plen++] = '\n';
                probe[plen] = '\0';
            }
            segs[n] = seg;
            all[n++] = tab + 1;
        }
    }
    if (rc == 0) {
        ferry_sparse_announce_stats ast;
        ferry_error ae = {0};
        rc = fr_sgen_announce(r->s, r->c->model, r->base, r->gen, (const char *const *)all, n,
                              r->c->keep, probe ? probe : "", &ast, &ae);
        if (rc < 0)
            fr_fail(err, rc, "%s", ae.msg);
    }
    free(probe);
    free(segs);
    for (size_t i = 0; i < nkept; i++)
        free(kept[i]);
    free(kept);
    free(all);
    return rc;
}

/* Stage 2 and 3: 0 when announced, else the error every rank returns. */
static int sparse(run *r, ferry_error *err)
{
    double t0 = now_s();
    ferry_error me = r->pre_err;
    int my = r->pre_rc < 0 ? r->pre_rc : parts_put(r, &me);
    int rc = meet(r, "parts", NULL, err);
    if (rc < 0)
        return rc;
    if (my == 0)
        my = parts_get(r, &me);
    for (uint32_t t = 0; my == 0 && t < r->cur.nt; t++)
        if (r->cur.t[t].owner == r->c->rank)
            my = object_put(r, t, &me);
    if (my == 0 && r->e->fail_at == FR_DELTA_DIE_STORED)
        _exit(3);   /* a rank that dies with its objects stored (tests) */
    if (my == 0 && r->e->fail_at == FR_DELTA_FAIL_STORED)
        my = fr_fail(&me, FERRY_EIO, "rank %u failed after storing its objects (injected)",
                     r->c->rank);
    r->st->store_s = now_s() - t0;
    double t1 = now_s();
    char *word = NULL, fw[900];
    if (my == 0 && !(word = stored_word(r)))
        my = fr_fail(&me, FERRY_ENOMEM, "delta: out of memory");
    if (my < 0)
        failed_word(fw, sizeof fw, my, &me);
    rc = meet(r, "stored", my == 0 ? word : fw, err);
    free(word);
    if (rc < 0)
        return rc;
    char dk[FR_KEY_MAX];
    (void)fr_key_wk_delta(dk, sizeof dk, r->c->model, r->gen, "decision", -1);
    if (r->c->rank == 0) {
        ferry_error ae = {0};
        int arc = announce(r, &ae);
        char dw[900] = "ok";
        if (arc < 0)
            failed_word(dw, sizeof dw, arc, &ae);
        rc = ferry_kv_put(r->s, dk, dw, strlen(dw), NULL, err);
        if (rc < 0)
            fr_fail(err, rc, "rank 0 cannot record the decision: %s", fr_why(err, rc));
    }
    int mrc = meet(r, "decided", NULL, err);
    if (rc == 0 && mrc < 0)
        rc = mrc;
    if (rc == 0) {
        ferry_kv_value v = {0};
        ferry_error we = {0};
        rc = ferry_kv_get(r->s, dk, &v, &we);
        if (rc == 0 && !(v.len == 2 && !memcmp(v.val, "ok", 2))) {
            char *why = NULL, *t = strndup(v.val, v.len);
            int code = t && !strncmp(t, "failed ", 7) ? (int)strtol(t + 7, &why, 10) : 0;
            rc = fr_fail(err, code < 0 ? code : FERRY_EPROTO, "%s",
                         why && *why ? why + 1 : "the decision is malformed");
            free(t);
        } else if (rc < 0) {
            fr_fail(err, rc, "the decision cannot be read: %s", we.msg);
        }
        if (v.val)
            ferry_store_free(v.val);
    }
    r->st->commit_s = now_s() - t1;
    return rc;
}

void fr_delta_fail_at(ferry_delta_encoder *e, int what)
{
    if (e)
        e->fail_at = what;
}

void fr_delta_sample_min(ferry_delta_encoder *e, uint64_t n)
{
    if (e)
        e->sample_min = n;
}

/* ---- the call ---------------------------------------------------------------------------- */

static void run_free(run *r)
{
    for (size_t i = 0; i < r->nkeys; i++)
        free(r->keys[i]);
    free(r->keys);
    free(r->segs);
    for (uint32_t q = 0; r->parts && q < r->c->world; q++)
        ferry_store_free(r->parts[q]);
    free(r->parts);
    free(r->part_len);
    fr_delta_layout_free(&r->cur, false);
}

/* Move the change buffers of a's pieces to b's (same layout): a publish
 * records its changes into the buffers the last one grew, whose pages are
 * touched already. */
static void lend(fr_dlayout *a, fr_dlayout *b)
{
    for (size_t i = 0; i < a->np && i < b->np; i++) {
        fr_dpiece *x = &a->p[i], *y = &b->p[i];
        free(y->chg);
        free(y->val);
        y->chg = x->chg, y->chg_cap = x->chg_cap;
        y->val = x->val, y->val_cap = x->val_cap;
        y->nchg = 0;
        x->chg = NULL, x->val = NULL, x->chg_cap = x->val_cap = 0, x->nchg = 0;
    }
}

/* The dense generation: leftovers of deltas on the base removed by their
 * owners, ferry_publish_shards, the snapshot refilled. */
static int dense(run *r, ferry_manifest *placement, const ferry_shard_data *mine, size_t n,
                 ferry_error *err)
{
    for (uint32_t t = 0; r->sweep && r->base && t < r->cur.nt; t++)
        if (r->cur.t[t].owner == r->c->rank)
            (void)ferry_sparse_remove_base(r->s, r->cur.t[t].name, r->base, NULL, NULL);
    int rc = ferry_publish_shards(r->s, r->c, r->gen, placement, mine, n, &r->st->dense, err);
    r->st->store_s = r->st->dense.put_s;
    r->st->commit_s = r->st->dense.barrier_s + r->st->dense.commit_s;
    r->st->stored_bytes = r->st->dense.bytes;
    return rc;
}

int ferry_delta_publish(ferry_store *s, ferry_delta_encoder *e, uint64_t gen,
                        ferry_manifest *placement, const ferry_shard_data *mine, size_t n,
                        ferry_delta_stats *st, ferry_error *err)
{
    ferry_delta_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!s || !e || !placement || gen == 0 || (n && !mine))
        return fr_fail(err, FERRY_EINVAL, "delta publish: bad arguments (store, encoder, "
                       "generation, placement)");
    const ferry_publisher_config *c = &e->pc;
    double t0 = now_s();
    uint64_t active = 0;
    int rc = fr_rl_active_read(s, c->model, &active, NULL, err);
    if (rc < 0 && rc != FERRY_ENOENT)
        return fr_fail(err, rc, "delta publish: cannot read the active generation of %s: %s",
                       c->model, fr_why(err, rc));
    if (active >= gen)
        return fr_fail(err, FERRY_EINVAL, "delta publish: generation %" PRIu64 " of %s is not "
                       "newer than the active %" PRIu64 "; nothing stored", gen, c->model, active);
    if (e->words && e->words != gen)
        drop_words(s, c, e->words);
    e->words = 0;
    run r = { .s = s, .e = e, .c = c, .gen = gen, .base = active, .st = st,
              .sweep = !e->have || e->last != active || e->failed_base == active };
    /* Stage 1: this rank's layout and comparison, then every rank's. */
    ferry_error me = {0};
    int my = fr_delta_layout(e, placement, mine, n, &r.cur, &me);
    bool have = my == 0 && e->have && e->last == active && active != 0;
    if (have)
        my = fr_delta_layout_same(&e->lay, &r.cur, &me);
    if (my == 0 && have)
        lend(&e->lay, &r.cur);   /* the last publish's change buffers, warm */
    uint64_t elements = 0;
    for (size_t i = 0; my == 0 && i < r.cur.np; i++)
        elements += r.cur.p[i].elems;
    /* First a sample (every FR_DELTA_SAMPLE_STRIDE-th chunk of every
     * piece): a generation far above the crossover goes dense without the
     * whole comparison. */
    uint64_t sampled = 0, sample_changed = 0;
    bool sampling = e->dc.crossover < 1;
    if (my == 0 && have && sampling) {
        double c0 = now_s();
        my = fr_delta_sample(&e->lay, &r.cur, FR_DELTA_SAMPLE_STRIDE, &sampled, &sample_changed,
                             &st->compared_bytes, &me);
        st->encode_s = now_s() - c0;
    }
    st->elements = elements;
    st->sampled = sampled;
    char word[900];
    if (my < 0)
        failed_word(word, sizeof word, my, &me);
    else
        snprintf(word, sizeof word, "ok %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %u", have ? 1u : 0u,
                 elements, sampled, sample_changed, have ? e->chain : 0u);
    double x0 = now_s();
    counts sum;
    rc = meet(&r, "count", word, err);
    if (rc == 0)
        rc = decide(&r, "count", &sum, err);
    st->exchange_s = now_s() - x0;
    if (rc < 0) {
        fr_fail(err, rc, "delta publish of %s generation %" PRIu64 " failed: %s; nothing stored",
                c->model, gen, fr_why(err, rc));
        goto out;
    }
    st->total_elements = sum.elements;
    double est = sum.sampled ? (double)sum.sample_changed / (double)sum.sampled : 0;
    if (!sum.have)
        st->kind = FERRY_DELTA_DENSE_FIRST;
    else if (sum.chain >= e->dc.max_chain)
        st->kind = FERRY_DELTA_DENSE_CHAIN;
    else if (sampling && sum.sampled >= (e->sample_min ? e->sample_min : FR_DELTA_SAMPLE_MIN) &&
             est > FR_DELTA_SAMPLE_MARGIN * e->dc.crossover)
        st->kind = FERRY_DELTA_DENSE_FRACTION;
    else
        st->kind = FERRY_DELTA_SPARSE;   /* for now: the exact counts decide */
    if (st->kind != FERRY_DELTA_SPARSE) {
        /* every element counts as changed (no snapshot), or the sample's share */
        st->changed = !sum.have ? elements
                      : sampled ? (uint64_t)((double)sample_changed / (double)sampled *
                                             (double)elements) : 0;
        st->total_changed = !sum.have ? sum.elements : (uint64_t)(est * (double)sum.elements);
    } else {
        /* The whole comparison. Recording every change of a generation
         * that will go dense costs 10 bytes and more a change: past the
         * crossover (of this rank's own elements) changes are only
         * counted. */
        bool partial = false;
        uint64_t record_max = e->dc.crossover >= 1 ? UINT64_MAX
                              : (uint64_t)(e->dc.crossover * (double)elements) + 1;
        double c0 = now_s();
        uint64_t cbytes = 0;
        my = my < 0 ? my : fr_delta_compare(&e->lay, &r.cur, record_max, &st->changed, &cbytes,
                                            &partial, &me);
        st->encode_s += now_s() - c0;
        st->compared_bytes += cbytes;
        if (my < 0)
            failed_word(word, sizeof word, my, &me);
        else
            snprintf(word, sizeof word, "ok %" PRIu64, st->changed);
        x0 = now_s();
        rc = meet(&r, "exact", word, err);
        if (rc == 0)
            rc = decide(&r, "exact", &sum, err);
        st->exchange_s += now_s() - x0;
        if (rc < 0) {
            fr_fail(err, rc, "delta publish of %s generation %" PRIu64 " failed: %s; nothing "
                    "stored", c->model, gen, fr_why(err, rc));
            goto out;
        }
        st->total_changed = sum.changed;
        if ((double)sum.changed > e->dc.crossover * (double)sum.elements) {
            st->kind = FERRY_DELTA_DENSE_FRACTION;
        } else if (partial) {   /* other ranks changed less: record every change after all */
            uint64_t changed = 0, bytes = 0;
            c0 = now_s();
            fr_delta_forget(&r.cur);
            /* a failure here still takes part in the stages (as a failed word) */
            r.pre_rc = fr_delta_compare(&e->lay, &r.cur, UINT64_MAX, &changed, &bytes, &partial,
                                        &r.pre_err);
            st->encode_s += now_s() - c0;
            st->compared_bytes += bytes;
        }
    }
    if (st->kind != FERRY_DELTA_SPARSE) {
        if ((rc = dense(&r, placement, mine, n, err)) < 0)
            goto out;
        double s0 = now_s();
        uint64_t bytes = 0;
        ferry_error fe = {0};
        if (fr_delta_fill(&r.cur, &bytes, &fe) < 0) {
            /* announced, but no snapshot: the next publish is dense */
            fr_delta_layout_free(&r.cur, true);
            ferry_delta_encoder_reset(e);
            FR_WARN("rl", "delta encoder of %s rank %u: %s; its next publish is "
                   "dense", c->model, c->rank, fe.msg);
        } else {
            fr_delta_layout_free(&e->lay, true);
            e->lay = r.cur;
            memset(&r.cur, 0, sizeof r.cur);
            e->have = true;
            e->last = gen;
            e->chain = 0;
            e->bytes = bytes;
        }
        st->snapshot_s = now_s() - s0;
        goto out;
    }
    rc = sparse(&r, err);
    if (rc < 0) {
        for (size_t i = 0; i < r.nkeys; i++)
            (void)ferry_sparse_remove(s, r.keys[i], NULL);
        parts_remove(&r);
        fr_fail(err, rc, "delta publish of %s generation %" PRIu64 " failed: %s", c->model, gen,
                fr_why(err, rc));
        goto out;
    }
    parts_remove(&r);
    double s0 = now_s();
    fr_delta_apply(&e->lay, &r.cur);
    e->last = gen;
    e->chain++;
    st->chain = e->chain;
    st->snapshot_s = now_s() - s0;
out:
    e->failed_base = rc < 0 ? active : 0;
    if (e->have && e->lay.np == r.cur.np && e->lay.p != r.cur.p)
        lend(&r.cur, &e->lay);   /* kept for the next publish */
    st->encode_gbps = st->encode_s > 0 ? (double)st->compared_bytes / st->encode_s / 1e9 : 0;
    e->words = gen;
    run_free(&r);
    st->total_s = now_s() - t0;
    return rc;
}
