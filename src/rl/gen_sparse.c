/* Sparse generations in the weights registry (weights.h, docs/sparse.md
 * "Sparse generations"): the generation text (gen_int.h), the
 * announcement (one compare-and-swap of the active key, as a dense
 * publish makes), the chain from the active generation back to its dense
 * one, and retention of sparse objects. The update that follows a chain
 * is gen_sparse_update.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

/* ---- the chain ---------------------------------------------------------------------------- */

void ferry_sparse_chain_free(ferry_sparse_chain *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nlinks; i++) {
        for (size_t k = 0; k < c->links[i].nkeys; k++)
            free(c->links[i].keys[k]);
        free(c->links[i].keys);
    }
    free(c->links);
    memset(c, 0, sizeof *c);
}

/* The chain from generation top (its text must hash to digest) down to
 * its dense generation: out->links newest first, out->dense. */
static int walk(ferry_store *s, const char *model, uint64_t top, const uint8_t digest[16],
                ferry_sparse_chain *out, ferry_error *err)
{
    uint64_t g = top;
    uint8_t want[16];
    memcpy(want, digest, 16);
    size_t cap = 0;
    for (int depth = 0;; depth++) {
        char *text = NULL;
        size_t len = 0;
        uint8_t got[16];
        int rc = fr_sgen_text(s, model, g, &text, &len, got, err);
        if (rc == FERRY_ENOENT)
            return fr_fail(err, FERRY_ELOST, "generation %" PRIu64 " of %s, a link of the chain "
                           "to the active generation %" PRIu64 ", is gone (retired or never "
                           "written); publish a dense generation", g, model, top);
        if (rc < 0)
            return fr_fail(err, rc, "cannot read generation %" PRIu64 " of %s: %s", g, model,
                           fr_why(err, rc));
        if (memcmp(got, want, 16) != 0) {
            free(text);
            return fr_fail(err, FERRY_ECORRUPT, "generation %" PRIu64 " of %s does not match "
                           "the digest %s names it by", g, model,
                           g == top ? "the announcement" : "the next link");
        }
        if (!fr_sgen_is(text, len)) {   /* the dense root */
            free(text);
            out->dense = g;
            return 0;
        }
        fr_sgen sg;
        rc = fr_sgen_parse(text, len, g, &sg);
        free(text);
        if (rc < 0)
            return fr_fail(err, rc, "generation %" PRIu64 " of %s is a malformed sparse "
                           "generation", g, model);
        if (depth + 1 >= FR_SGEN_CHAIN_MAX ||
            fr_grow((void **)&out->links, &cap, out->nlinks + 1, sizeof *out->links) < 0) {
            fr_sgen_free(&sg);
            return fr_fail(err, depth + 1 >= FR_SGEN_CHAIN_MAX ? FERRY_EPROTO : FERRY_ENOMEM,
                           "the chain of %s from generation %" PRIu64 " is too long", model,
                           top);
        }
        out->links[out->nlinks++] = (ferry_sparse_link){ .generation = g, .base = sg.base,
                                                         .keys = sg.keys, .nkeys = sg.nkeys };
        sg.keys = NULL;
        sg.nkeys = 0;
        g = sg.base;
        memcpy(want, sg.base_digest, 16);
    }
}

int ferry_sparse_active(ferry_store *s, const char *model, uint64_t *generation, bool *sparse,
                        ferry_error *err)
{
    if (!s || !model || !*model || strchr(model, '/') || !generation || !sparse)
        return fr_fail(err, FERRY_EINVAL, "sparse active: bad arguments (store, model, out)");
    *generation = 0;
    *sparse = false;
    char keys[2][FR_KEY_MAX];
    fr_key_wk(keys[0], sizeof keys[0], model, 0, "active");
    fr_key_wk(keys[1], sizeof keys[1], model, 0, "sparse");
    const char *kp[2] = { keys[0], keys[1] };
    ferry_kv_value v[2] = {{0}};
    int res[2] = {0};
    (void)ferry_kv_batch_get(s, kp, 2, v, res, NULL);
    int rc = res[0];
    unsigned long long g = 0;
    char hex[33] = "";   /* the mark is the sparse announcement's value: generation and digest */
    if (rc == FERRY_ENOENT)
        fr_fail(err, rc, "no generation of %s was announced", model);
    else if (rc < 0)
        fr_fail(err, rc, "cannot read the active generation of %s: %s", model, ferry_strerror(rc));
    else if (sscanf(v[0].val, "%llu %32s", &g, hex) != 2 || strlen(hex) != 32)
        rc = fr_fail(err, FERRY_EPROTO, "%s does not hold a generation and its digest", keys[0]);
    else {
        *generation = g;
        *sparse = res[1] == 0 && v[1].len == v[0].len && memcmp(v[0].val, v[1].val, v[0].len) == 0;
    }
    ferry_store_free(v[0].val);
    ferry_store_free(v[1].val);
    return rc;
}

int ferry_sparse_chain_resolve(ferry_store *s, const char *model, uint64_t held,
                               ferry_sparse_chain *out, ferry_error *err)
{
    if (!s || !model || !*model || strchr(model, '/') || !out)
        return fr_fail(err, FERRY_EINVAL, "sparse chain: bad arguments (store, model, out)");
    memset(out, 0, sizeof *out);
    uint8_t dg[16];
    int rc = fr_rl_active_read(s, model, &out->active, dg, err);
    if (rc == FERRY_ENOENT)
        return fr_fail(err, rc, "no generation of %s was announced", model);
    if (rc < 0)
        return fr_fail(err, rc, "cannot read the active generation of %s: %s", model,
                       fr_why(err, rc));
    if (held > out->active)
        return fr_fail(err, FERRY_ESTATE, "the worker holds generation %" PRIu64 " of %s, newer "
                       "than the active generation %" PRIu64, held, model, out->active);
    if (held == out->active)
        return 0;
    if ((rc = walk(s, model, out->active, dg, out, err)) < 0) {
        ferry_sparse_chain_free(out);
        return rc;
    }
    /* links newest first; links[i].base == held: held is on the chain and
     * needs links[i] .. links[0]. Off the chain: the dense one, then all. */
    size_t keep = out->nlinks;
    bool on = false;
    for (size_t i = 0; i < out->nlinks && !on; i++)
        if (out->links[i].base == held) {
            keep = i + 1;
            on = true;
        }
    out->load_dense = !on;
    for (size_t i = keep; i < out->nlinks; i++) {
        for (size_t k = 0; k < out->links[i].nkeys; k++)
            free(out->links[i].keys[k]);
        free(out->links[i].keys);
    }
    out->nlinks = keep;
    for (size_t i = 0; i < keep / 2; i++) {
        ferry_sparse_link t = out->links[i];
        out->links[i] = out->links[keep - 1 - i];
        out->links[keep - 1 - i] = t;
    }
    return 0;
}

/* ---- announcing ------------------------------------------------------------------------------ */

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every key a sparse object of (base, gen) whose tensor the dense
 * generation holds in the same shape; counts into st; the distinct
 * segments' probe lines appended to *probe. */
static int check_objects(ferry_store *s, const char *model, uint64_t base, uint64_t gen,
                         const fr_gen *dense, const char *const *keys, size_t n,
                         ferry_sparse_announce_stats *st, char **probe, ferry_error *err)
{
    const char **sorted = malloc((n ? n : 1) * sizeof *sorted);
    uint64_t *segs = malloc((n ? n : 1) * sizeof *segs);
    size_t nseg = 0, plen = 0, pcap = 0;
    int rc = sorted && segs ? 0 : fr_fail(err, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!(sorted[i] = keys[i]))
            rc = fr_fail(err, FERRY_EINVAL, "sparse announce of %s generation %" PRIu64 ": key %zu "
                         "is NULL; nothing announced", model, gen, i);
    if (rc == 0)
        qsort(sorted, n, sizeof *sorted, key_cmp);
    for (size_t i = 1; rc == 0 && i < n; i++)
        if (!strcmp(sorted[i - 1], sorted[i]))
            rc = fr_fail(err, FERRY_EINVAL, "sparse announce of %s generation %" PRIu64 ": %s is "
                         "named twice; nothing announced", model, gen, sorted[i]);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        ferry_sparse_index ix;
        ferry_error e = {0};
        rc = ferry_sparse_index_read(s, keys[i], &ix, &e);
        if (rc < 0) {
            rc = fr_fail(err, rc == FERRY_EPROTO ? FERRY_EINVAL : rc, "sparse announce of %s "
                         "generation %" PRIu64 ": %s; nothing announced", model, gen, e.msg);
            break;
        }
        const ferry_sparse_desc *d = &ix.desc;
        int t = ferry_manifest_find_tensor(dense->m, d->tensor_id);
        ferry_tensor_desc td = {0};
        bool same = t >= 0 && ferry_manifest_tensor(dense->m, (uint32_t)t, &td) == 0 &&
                    td.ndim == d->ndim;
        for (uint32_t k = 0; same && k < d->ndim; k++)
            same = td.shape[k] == d->shape[k];
        if (d->base_generation != base || d->delta_generation != gen)
            rc = fr_fail(err, FERRY_EINVAL, "sparse announce of %s generation %" PRIu64 ": %s is "
                         "the delta %" PRIu64 " -> %" PRIu64 ", not %" PRIu64 " -> %" PRIu64
                         "; nothing announced", model, gen, keys[i], d->base_generation,
                         d->delta_generation, base, gen);
        else if (t < 0)
            rc = fr_fail(err, FERRY_EINVAL, "sparse announce of %s generation %" PRIu64 ": tensor "
                         "%s of %s is not in dense generation %" PRIu64 "; nothing announced",
                         model, gen, d->tensor_id, keys[i], dense->generation);
        else if (!same)
            rc = fr_fail(err, FERRY_EINVAL, "sparse announce of %s generation %" PRIu64 ": tensor "
                         "%s of %s has another shape than in dense generation %" PRIu64
                         "; nothing announced", model, gen, d->tensor_id, keys[i],
                         dense->generation);
        st->objects++;
        st->nnz += d->nnz;
        ferry_sparse_index_free(&ix);
        ferry_object_desc od;
        if (rc == 0 && ferry_store_get_replica_desc(s, keys[i], &od, NULL) == 0 && od.nreplicas) {
            bool seen = false;
            for (size_t k = 0; k < nseg && !seen; k++)
                seen = segs[k] == od.replicas[0].segment;
            size_t need = plen + strlen(keys[i]) + 32;
            if (!seen && fr_grow((void **)probe, &pcap, need, 1) < 0) {
                rc = fr_fail(err, FERRY_ENOMEM, "out of memory");
            } else if (!seen) {
                segs[nseg++] = od.replicas[0].segment;
                plen += (size_t)snprintf(*probe + plen, pcap - plen, "%" PRIu64 "\t%s\n",
                                         od.replicas[0].segment, keys[i]);
            }
        }
    }
    free(sorted);
    free(segs);
    return rc;
}

/* The generation text of (base -> gen) over keys. */
static char *text_make(uint64_t base, const uint8_t base_digest[16], uint64_t dense,
                       const char *const *keys, size_t n, size_t *len)
{
    size_t cap = 200;
    for (size_t i = 0; i < n; i++)
        cap += strlen(keys[i]) + 8;
    char *t = malloc(cap), hex[33];
    if (!t)
        return NULL;
    ferry_digest_hex(base_digest, hex);
    size_t k = (size_t)snprintf(t, cap, "%sbase %" PRIu64 " %s\ndense %" PRIu64 "\n", FR_SGEN_MAGIC,
                                base, hex, dense);
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(t + k, cap - k, "object %s\n", keys[i]);
    *len = k;
    return t;
}

int ferry_sparse_announce(ferry_store *s, const char *model, uint64_t base, uint64_t gen,
                          const char *const *keys, size_t nkeys, uint32_t keep,
                          ferry_sparse_announce_stats *st, ferry_error *err)
{
    return fr_sgen_announce(s, model, base, gen, keys, nkeys, keep, NULL, st, err);
}

int fr_sgen_announce(ferry_store *s, const char *model, uint64_t base, uint64_t gen,
                     const char *const *keys, size_t nkeys, uint32_t keep, const char *probe_given,
                     ferry_sparse_announce_stats *st, ferry_error *err)
{
    ferry_sparse_announce_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    uint64_t t0 = fr_now_ns();
    if (!s || !model || !*model || strchr(model, '/') || strlen(model) >= 128 || (nkeys && !keys))
        return fr_fail(err, FERRY_EINVAL, "sparse announce: bad arguments (store, model, keys)");
    if (gen <= base || base == 0)
        return fr_fail(err, FERRY_EINVAL, "sparse announce of %s: generation %" PRIu64 " must be "
                       "newer than its base %" PRIu64 " (>= 1); nothing announced", model, gen,
                       base);
    char ak[FR_KEY_MAX];
    fr_key_wk(ak, sizeof ak, model, 0, "active");
    ferry_kv_value cur = {0};
    int rc = ferry_kv_get(s, ak, &cur, err);
    if (rc == FERRY_ENOENT)
        return fr_fail(err, FERRY_ESTATE, "sparse announce of %s generation %" PRIu64 ": no "
                       "generation is active, so base %" PRIu64 " is not; publish it dense "
                       "first; nothing announced", model, gen, base);
    if (rc < 0)
        return fr_fail(err, rc, "sparse announce of %s: cannot read the active generation: %s",
                       model, fr_why(err, rc));
    uint64_t expected = cur.mod_rev, active = strtoull(cur.val, NULL, 10);
    ferry_store_free(cur.val);
    if (active != base)
        return fr_fail(err, FERRY_ESTATE, "sparse announce of %s generation %" PRIu64 ": its "
                       "base is %" PRIu64 " but the active generation is %" PRIu64 "; a delta "
                       "is announced only on the active generation; nothing announced", model,
                       gen, base, active);
    ferry_sparse_chain ch;
    if ((rc = ferry_sparse_chain_resolve(s, model, 0, &ch, err)) < 0)
        return rc;
    /* ch: the active chain as a fresh worker sees it (every link) */
    if (ch.active != base) {
        ferry_sparse_chain_free(&ch);
        return fr_fail(err, FERRY_ESTATE, "sparse announce of %s generation %" PRIu64 ": the "
                       "active generation moved on while announcing; nothing announced", model,
                       gen);
    }
    st->dense_generation = ch.dense;
    st->chain = (uint32_t)ch.nlinks + 2;
    ferry_sparse_chain_free(&ch);
    if (st->chain > FR_SGEN_CHAIN_MAX)
        return fr_fail(err, FERRY_EINVAL, "sparse announce of %s generation %" PRIu64 ": the "
                       "chain from dense generation %" PRIu64 " would hold %u generations, more "
                       "than %d; publish a dense generation; nothing announced", model, gen,
                       st->dense_generation, st->chain, FR_SGEN_CHAIN_MAX);
    fr_gen *dense = NULL;
    char *probe = NULL, *text = NULL, *btext = NULL;
    size_t blen = 0, tlen = 0;
    uint8_t bdg[16];
    if (probe_given) {   /* the library's own objects: checked where they were made */
        st->objects = nkeys;
        if (!(probe = strdup(probe_given)))
            rc = fr_fail(err, FERRY_ENOMEM, "out of memory");
    } else if ((rc = fr_gen_load(s, model, st->dense_generation, &dense, err)) == 0) {
        rc = check_objects(s, model, base, gen, dense, keys, nkeys, st, &probe, err);
    }
    fr_gen_free(dense);
    if (rc == 0 && (rc = fr_sgen_text(s, model, base, &btext, &blen, bdg, err)) < 0)
        fr_fail(err, rc, "sparse announce of %s: cannot read generation %" PRIu64 ": %s", model,
                base, ferry_strerror(rc));
    free(btext);
    if (rc == 0 && !(text = text_make(base, bdg, st->dense_generation, keys, nkeys, &tlen)))
        rc = fr_fail(err, FERRY_ENOMEM, "out of memory");
    char k[FR_KEY_MAX];
    if (rc == 0) {
        fr_key_wk(k, sizeof k, model, gen, "manifest");
        if ((rc = ferry_kv_put(s, k, text, tlen, NULL, err)) < 0)
            fr_fail(err, rc, "sparse announce of %s: cannot store the generation text: %s",
                    model, fr_why(err, rc));
    }
    if (rc == 0) {
        fr_key_wk(k, sizeof k, model, gen, "probe");
        if ((rc = ferry_kv_put(s, k, probe ? probe : "", probe ? strlen(probe) : 0, NULL, err)) < 0)
            fr_fail(err, rc, "sparse announce of %s: cannot store the probes: %s", model,
                    fr_why(err, rc));
    }
    if (rc == 0) {
        fr_hash128_t dg = fr_hash128(text, tlen, 0);
        char hex[33], val[64];
        fr_hash128_hex(dg, hex);
        int vn = snprintf(val, sizeof val, "%" PRIu64 " %s", gen, hex);
        /* the sparse mark — this announcement's own value, under its own
         * key — before the announcement it marks (ferry_sparse_active) */
        fr_key_wk(k, sizeof k, model, 0, "sparse");
        uint64_t now = 0;
        int mrc = ferry_kv_put(s, k, val, (size_t)vn, NULL, err);
        rc = mrc < 0 ? mrc : ferry_kv_cas(s, ak, expected, val, (size_t)vn, NULL, err);
        if (mrc < 0)
            fr_fail(err, rc, "sparse announce of %s: cannot store the sparse mark: %s; nothing "
                    "announced", model, fr_why(err, rc));
        else if (rc == FERRY_ESTATE)
            fr_fail(err, rc, "sparse announce of %s generation %" PRIu64 ": another publish "
                    "announced a generation meanwhile; nothing announced", model, gen);
        else if (rc < 0 && fr_rl_active_read(s, model, &now, NULL, NULL) == 0 && now == gen)
            rc = 0;   /* the CAS landed before its reply was lost */
        else if (rc < 0)
            fr_fail(err, rc, "sparse announce of %s: cannot announce: %s", model,
                    fr_why(err, rc));
    }
    free(text);
    free(probe);
    if (rc < 0)
        return rc;
    /* Retention: the rule of a dense publish, but never the chain that
     * leads to the active generation (it is the tail of the history). */
    ferry_publisher_config pc = { .world = 0, .keep = keep ? keep : 2 };
    snprintf(pc.model, sizeof pc.model, "%s", model);
    if (pc.keep < st->chain)
        pc.keep = st->chain;
    ferry_publish_stats ps = {0};
    fr_rl_keep(s, &pc, gen, base, &ps);
    st->removed_generations = ps.removed_generations;
    st->announce_s = (double)(fr_now_ns() - t0) / 1e9;
    return 0;
}

/* ---- retention ------------------------------------------------------------------------------- */
