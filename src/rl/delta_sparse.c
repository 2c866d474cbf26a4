/* A sparse generation of a delta publish (delta_publish.c; docs/sparse.md
 * "Deltas from a trainer", "A sparse generation"), once every rank took
 * the decision: each rank hands the changed elements of tensors it does
 * not own to their owners (one part object per other rank, on its own
 * segment: ferry/w/M/G/dpart.R.O, always put, empty or not); barrier
 * delta/parts; each owner reads the parts addressed to it and puts one
 * sparse object per changed tensor it owns (scatter_set, global
 * coordinates); its word "stored" ("ok <n>" then "<segment> TAB <key>"
 * lines, or "failed ..."); barrier delta/stored; rank 0 announces every
 * rank's keys (fr_sgen_announce, the probe from the owners' segments)
 * and writes the decision (ferry/wk/M/G/delta/decision: "ok" or "failed
 * <code> <why>"); barrier delta/decided; every rank reads it. */
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

#define PART_MAGIC 0x31504446u   /* "FDP1" */

/* The part this rank hands to owner o: "FDP1", sections; each section
 * u32 tensor, u32 0, u64 nnz, then the indices and the values. */
static int part_make(fr_drun *r, uint32_t o, uint8_t **out, size_t *len, ferry_error *err)
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

static int parts_put(fr_drun *r, ferry_error *err)
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

void fr_delta_parts_remove(fr_drun *r)
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

static int parts_get(fr_drun *r, ferry_error *err)
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

/* The entries of owned tensor t: its own and the parts', concatenated
 * (the put sorts them). *idx, *val: malloc'd, NULL when nothing changed. */
static int gather(const fr_drun *r, uint32_t t, uint8_t **idx, uint8_t **val, uint64_t *nnz,
                  ferry_error *err)
{
    const fr_dlayout *l = &r->cur;
    const fr_dtensor *x = &l->t[t];
    size_t isz = x->i64 ? 8 : 4, osz = ferry_dtype_size(x->out), row = x->ndim * isz;
    *idx = *val = NULL;
    *nnz = fr_delta_count(l, t);
    for (uint32_t q = 0; q < r->c->world; q++) {
        uint64_t c = 0;
        const uint8_t *pi, *pv;
        if (r->parts[q] && part_find(l, r->parts[q], r->part_len[q], t, &c, &pi, &pv))
            *nnz += c;
    }
    if (!*nnz)
        return 0;
    *idx = malloc(*nnz * row);
    *val = malloc(*nnz * osz);
    if (!*idx || !*val) {
        free(*idx);
        free(*val);
        *idx = *val = NULL;
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory for %" PRIu64 " entries of %s",
                       *nnz, x->name);
    }
    uint64_t n = fr_delta_entries(l, t, *idx, *val);
    for (uint32_t q = 0; q < r->c->world; q++) {
        uint64_t c = 0;
        const uint8_t *pi, *pv;
        if (!r->parts[q] || !part_find(l, r->parts[q], r->part_len[q], t, &c, &pi, &pv))
            continue;
        memcpy(*idx + n * row, pi, c * row);
        memcpy(*val + n * osz, pv, c * osz);
        n += c;
    }
    return 0;
}

/* The batch of an owner's objects (objects_put). */
typedef struct put_batch {
    size_t n;
    uint32_t *t;
    ferry_sparse_desc *d, *got;
    const void **idx, **val;
    char *keys;                  /* n keys of KEYCAP bytes */
    int *rc;
    ferry_error *err;
    ferry_object_desc *od;
    const char **kp;
} put_batch;

#define KEYCAP (FERRY_STORE_KEY_MAX + 1)

static void batch_free(put_batch *b)
{
    for (size_t i = 0; b->idx && i < b->n; i++) {
        free((void *)b->idx[i]);
        free((void *)b->val[i]);
    }
    free(b->t), free(b->d), free(b->got), free(b->idx), free(b->val), free(b->keys);
    free(b->rc), free(b->err), free(b->od), free(b->kp);
}

/* Object i's failure in the encoder's words. */
static int put_failed(const fr_drun *r, const put_batch *b, size_t i, ferry_error *err)
{
    const char *name = r->cur.t[b->t[i]].name;
    *err = b->err[i];
    if (b->rc[i] == FERRY_EEXIST)
        return fr_fail(err, b->rc[i], "putting the delta of %s: %s (sparse keys carry no model: "
                       "two models on one store need distinct tensor names)", name,
                       fr_why(err, b->rc[i]));
    return fr_fail(err, b->rc[i], "putting the delta of %s: %s", name, fr_why(err, b->rc[i]));
}

/* Every owned tensor's object, all in one batch of puts
 * (ferry_put_sparse_objects: a few master round trips for all of them,
 * however many tensors the rank owns): r->keys and r->segs get the
 * objects put (also when another failed: the caller removes them); the
 * first failure, in tensor order, is returned with its sentence in err. */
static int objects_put(fr_drun *r, ferry_error *err)
{
    size_t n = 0;
    for (uint32_t t = 0; t < r->cur.nt; t++)
        n += r->cur.t[t].owner == r->c->rank;
    size_t cap = n ? n : 1;
    put_batch b = { .t = calloc(cap, sizeof *b.t), .d = calloc(cap, sizeof *b.d),
                    .got = calloc(cap, sizeof *b.got), .idx = calloc(cap, sizeof *b.idx),
                    .val = calloc(cap, sizeof *b.val), .keys = calloc(cap, KEYCAP),
                    .rc = calloc(cap, sizeof *b.rc), .err = calloc(cap, sizeof *b.err),
                    .od = calloc(cap, sizeof *b.od), .kp = calloc(cap, sizeof *b.kp) };
    r->keys = calloc(cap, sizeof *r->keys);
    r->segs = calloc(cap, sizeof *r->segs);
    int rc = 0;
    if (!b.t || !b.d || !b.got || !b.idx || !b.val || !b.keys || !b.rc || !b.err || !b.od ||
        !b.kp || !r->keys || !r->segs) {
        batch_free(&b);
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    }
    for (uint32_t t = 0; rc == 0 && t < r->cur.nt; t++) {
        const fr_dtensor *x = &r->cur.t[t];
        if (x->owner != r->c->rank)
            continue;
        if (r->sweep && (rc = ferry_sparse_remove_base(r->s, x->name, r->base, NULL, err)) < 0) {
            fr_fail(err, rc, "removing leftovers of %s on generation %" PRIu64 ": %s", x->name,
                    r->base, fr_why(err, rc));
            break;
        }
        uint8_t *idx, *val;
        uint64_t nnz;
        if ((rc = gather(r, t, &idx, &val, &nnz, err)) < 0 || !nnz)
            continue;
        size_t i = b.n++;
        b.t[i] = t, b.idx[i] = idx, b.val[i] = val;
        ferry_sparse_desc *d = &b.d[i];
        *d = (ferry_sparse_desc){ .ndim = x->ndim, .base_generation = r->base,
                                  .delta_generation = r->gen, .apply = FERRY_SPARSE_SCATTER_SET,
                                  .nnz = nnz, .placement = { .kind = FERRY_SPARSE_REPLICATE } };
        snprintf(d->tensor_id, sizeof d->tensor_id, "%s", x->name);
        memcpy(d->shape, x->shape, sizeof d->shape);
        snprintf(d->index_dtype, sizeof d->index_dtype, "%s", x->i64 ? "i64" : "i32");
        snprintf(d->value_dtype, sizeof d->value_dtype, "%.7s", x->out);
    }
    if (rc == 0 && b.n) {
        ferry_error be = {0};
        (void)ferry_put_sparse_objects(r->s, b.d, b.idx, b.val, b.n, b.got, b.keys, KEYCAP, b.rc,
                                       &be);
        for (size_t i = 0, first = 1; i < b.n; i++) {
            if (b.rc[i] < 0 && first) {   /* the batch's sentence is its first failure's */
                b.err[i] = be;
                first = 0;
            } else if (b.rc[i] < 0) {
                fr_fail(&b.err[i], b.rc[i], "%s", ferry_strerror(b.rc[i]));
            }
            if (b.rc[i] == FERRY_EEXIST && r->sweep) {   /* a leftover of a failed attempt: replaced */
                if (b.keys[i * KEYCAP])
                    (void)ferry_sparse_remove(r->s, b.keys + i * KEYCAP, NULL);
                b.rc[i] = ferry_put_sparse_object(r->s, &b.d[i], b.idx[i], b.val[i], &b.got[i],
                                                  b.keys + i * KEYCAP, KEYCAP, &b.err[i]);
            }
        }
    }
    size_t nk = 0;
    for (size_t i = 0; i < b.n; i++) {
        if (b.rc[i] < 0) {
            if (rc == 0)
                rc = put_failed(r, &b, i, err);
            continue;
        }
        if (!(r->keys[r->nkeys] = strdup(b.keys + i * KEYCAP))) {
            (void)ferry_sparse_remove(r->s, b.keys + i * KEYCAP, NULL);
            if (rc == 0)
                rc = fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
            continue;
        }
        const fr_dtensor *x = &r->cur.t[b.t[i]];
        size_t row = x->ndim * (x->i64 ? 8u : 4u), osz = ferry_dtype_size(x->out);
        b.kp[nk++] = r->keys[r->nkeys++];
        r->st->objects++;
        r->st->nnz += b.got[i].nnz;
        r->st->stored_bytes += b.got[i].nnz * (row + osz);
    }
    /* where each landed (the announcement's probe): one round trip for all */
    int *dr = calloc(nk ? nk : 1, sizeof *dr);
    if (dr && nk)
        (void)ferry_store_batch_get_replica_desc(r->s, b.kp, nk, b.od, dr, NULL);
    for (size_t i = 0; i < nk; i++)
        r->segs[i] = dr && dr[i] == 0 && b.od[i].nreplicas ? b.od[i].replicas[0].segment : 0;
    free(dr);
    batch_free(&b);
    return rc;
}

/* The "stored" word: "ok <n>\n" then "<segment> TAB <key>" a line. */
static char *stored_word(const fr_drun *r)
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
static int announce(fr_drun *r, ferry_error *err)
{
    char **all = NULL, *probe = NULL;
    uint64_t *segs = NULL;
    size_t n = 0, cap = 0, scap = 0, pcap = 0, plen = 0;
    int rc = 0;
    char **kept = NULL;
    size_t nkept = 0;
    ferry_kv_value *vals = calloc(r->c->world, sizeof *vals);
    if (!vals)
        return fr_fail(err, FERRY_ENOMEM, "delta: out of memory");
    rc = fr_delta_words(r, "stored", vals, err);   /* every rank's, one round trip */
    for (uint32_t q = 0; rc == 0 && q < r->c->world; q++) {
        char *t = strndup(vals[q].val, vals[q].len);
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
    for (uint32_t q = 0; q < r->c->world; q++)
        ferry_store_free(vals[q].val);
    free(vals);
    free(probe);
    free(segs);
    for (size_t i = 0; i < nkept; i++)
        free(kept[i]);
    free(kept);
    free(all);
    return rc;
}

/* Stage 2 and 3: 0 when announced, else the error every rank returns. */
int fr_delta_sparse(fr_drun *r, ferry_error *err)
{
    double t0 = fr_delta_now();
    ferry_error me = r->pre_err;
    int my = r->pre_rc < 0 ? r->pre_rc : parts_put(r, &me);
    int rc = fr_delta_meet(r, "parts", NULL, err);
    if (rc < 0)
        return rc;
    if (my == 0)
        my = parts_get(r, &me);
    if (my == 0)
        my = objects_put(r, &me);
    if (my == 0 && r->e->fail_at == FR_DELTA_DIE_STORED)
        _exit(3);   /* a rank that dies with its objects stored (tests) */
    if (my == 0 && r->e->fail_at == FR_DELTA_FAIL_STORED)
        my = fr_fail(&me, FERRY_EIO, "rank %u failed after storing its objects (injected)",
                     r->c->rank);
    r->st->store_s = fr_delta_now() - t0;
    double t1 = fr_delta_now();
    char *word = NULL, fw[900];
    if (my == 0 && !(word = stored_word(r)))
        my = fr_fail(&me, FERRY_ENOMEM, "delta: out of memory");
    if (my < 0)
        fr_delta_failed_word(fw, sizeof fw, my, &me);
    rc = fr_delta_meet(r, "stored", my == 0 ? word : fw, err);
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
            fr_delta_failed_word(dw, sizeof dw, arc, &ae);
        rc = ferry_kv_put(r->s, dk, dw, strlen(dw), NULL, err);
        if (rc < 0)
            fr_fail(err, rc, "rank 0 cannot record the decision: %s", fr_why(err, rc));
    }
    int mrc = fr_delta_meet(r, "decided", NULL, err);
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
    r->st->commit_s = fr_delta_now() - t1;
    return rc;
}
