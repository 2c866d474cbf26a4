/* Publishing a weight generation from every trainer rank, and reading it
 * back (weights.h). KV layout of a model M (generation G as 20 digits):
 *
 *   ferry/wk/M/active          "G <digest hex>[ <policy record JSON>]": the announced generation
 *   ferry/wk/M/history         announced generations still stored, ascending
 *   ferry/wk/M/G/part/R        rank R's part: "ok" or "failed <why>", then its lines
 *   ferry/wk/M/G/manifest      every line, in tensor order (the digest is over this text)
 *   ferry/wk/M/G/status        the coordinator's decision: "ok" or "failed <why>"
 *
 * A line: name TAB dtype TAB shape (d0,d1,..) TAB bytes TAB checksum (hex)
 * TAB publisher TAB segment TAB store key TAB tensor index. Objects live
 * under ferry_weights_key(M, G, name). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/policy_int.h"
#include "rl/rl_int.h"

#define TAG "weights"


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

static void kv_key(char *out, size_t cap, const char *model, uint64_t gen, const char *what)
{
    if (gen)
        snprintf(out, cap, "ferry/wk/%s/%020" PRIu64 "/%s", model, gen, what);
    else
        snprintf(out, cap, "ferry/wk/%s/%s", model, what);
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

static int check_tensors(const ferry_weight_tensor *t, size_t n, const ferry_publisher_config *c,
                         ferry_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (!t[i].name || !*t[i].name || strpbrk(t[i].name, "\t\n") ||
            strlen(t[i].name) >= sizeof ((ferry_weight_entry *)0)->name)
            return fr_rl_fail(err, FERRY_EINVAL, "publish: tensor %zu has no usable name", i);
        if (!t[i].dtype || !ferry_dtype_size(t[i].dtype) || t[i].ndim > FERRY_MAX_DIMS ||
            !ferry_dtype_size(out_dtype(c, &t[i])))
            return fr_rl_fail(err, FERRY_EINVAL, "publish: tensor %s: unknown dtype or too many dims",
                        t[i].name);
        if (strcmp(t[i].dtype, out_dtype(c, &t[i])) != 0 &&
            ferry_convert(NULL, t[i].dtype, NULL, out_dtype(c, &t[i]), 0) < 0)
            return fr_rl_fail(err, FERRY_EINVAL, "publish: tensor %s: cannot convert %s to %s",
                        t[i].name, t[i].dtype, out_dtype(c, &t[i]));
    }
    return 0;
}

/* Store this rank's tensors; append their lines to part. Returns 0 or the
 * first failure (the rest of the rank's tensors are not stored). */
static int put_mine(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                    const ferry_weight_tensor *t, size_t n, const uint32_t *pub, sbuf *part,
                    ferry_publish_stats *st, ferry_error *err)
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
            return fr_rl_fail(err, FERRY_EINVAL, "publish: tensor %s: key too long", t[i].name);
        const void *data = t[i].data;
        void *conv = NULL;
        uint64_t c0 = fr_now_ns();
        if (strcmp(od, t[i].dtype) != 0) {
            conv = malloc(nb ? nb : 1);
            if (!conv)
                return fr_rl_fail(err, FERRY_ENOMEM, "publish: tensor %s: no memory to convert",
                            t[i].name);
            (void)ferry_convert(t[i].data, t[i].dtype, conv, od, elems);
            data = conv;
        }
        uint64_t sum = fr_hash64(data, nb, 0);
        uint64_t c1 = fr_now_ns();
        ferry_object_desc d = {0};
        int rc = ferry_store_put_from(s, key, data, nb, &repl, &d);
        st->convert_s += (double)(c1 - c0) / 1e9;
        st->store_s += (double)(fr_now_ns() - c1) / 1e9;
        free(conv);
        if (rc < 0)
            return fr_rl_fail(err, rc, "publish: rank %u could not store %s (%" PRIu64 " bytes): %s",
                        c->rank, t[i].name, nb, ferry_store_last_error());
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

/* ---- the coordinator --------------------------------------------------------------- */

typedef struct line { size_t idx; const char *p; size_t n; } line;

static int by_idx(const void *a, const void *b)
{
    const line *x = a, *y = b;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Gather every part; on success *manifest is the text in tensor order. */
static int gather(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, size_t n,
                  sbuf *manifest, char *why, size_t whycap)
{
    ferry_kv_value *parts = calloc(c->world, sizeof *parts);
    line *lines = calloc(n ? n : 1, sizeof *lines);
    size_t nl = 0;
    int rc = parts && lines ? 0 : FERRY_ENOMEM;
    for (uint32_t r = 0; r < c->world && rc == 0; r++) {
        char k[300], what[32];
        snprintf(what, sizeof what, "part/%u", r);
        kv_key(k, sizeof k, c->model, gen, what);
        rc = ferry_kv_get(s, k, &parts[r]);
        if (rc < 0) {
            snprintf(why, whycap, "rank %u left no part (%s)", r, ferry_strerror(rc));
            break;
        }
        const char *p = parts[r].val, *end = p + parts[r].len;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (strncmp(p, "ok", 2) != 0) {
            snprintf(why, whycap, "rank %u: %.*s", r, (int)((eol ? eol : end) - p), p);
            rc = FERRY_ECANCELED;
            break;
        }
        for (p = eol ? eol + 1 : end; p < end && rc == 0;) {
            const char *e = memchr(p, '\n', (size_t)(end - p));
            const char *tab = e ? e : end;
            while (tab > p && tab[-1] != '\t')
                tab--;
            size_t idx = (size_t)strtoull(tab, NULL, 10);
            if (!e || nl >= n || idx >= n) {
                snprintf(why, whycap, "rank %u: malformed part", r);
                rc = FERRY_EPROTO;
                break;
            }
            lines[nl++] = (line){ .idx = idx, .p = p, .n = (size_t)(e - p) + 1 };
            p = e + 1;
        }
    }
    if (rc == 0 && nl != n) {
        snprintf(why, whycap, "the parts hold %zu of %zu tensors", nl, n);
        rc = FERRY_EPROTO;
    }
    if (rc == 0) {
        qsort(lines, nl, sizeof *lines, by_idx);
        for (size_t i = 0; i < nl; i++)
            sb_printf(manifest, "%.*s", (int)lines[i].n, lines[i].p);
        if (manifest->oom)
            rc = FERRY_ENOMEM;
    }
    for (uint32_t r = 0; parts && r < c->world; r++)
        ferry_store_free(parts[r].val);
    free(parts);
    free(lines);
    return rc;
}

/* Announce gen with one CAS of the active key; then retention. */
static int announce(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                    const char *record, const sbuf *manifest, ferry_publish_stats *st,
                    char *why, size_t whycap)
{
    char k[300];
    kv_key(k, sizeof k, c->model, gen, "manifest");
    int rc = ferry_kv_put(s, k, manifest->p ? manifest->p : "", manifest->n, NULL);
    if (rc < 0) {
        snprintf(why, whycap, "cannot store the manifest: %s", ferry_store_last_error());
        return rc;
    }
    fr_hash128_t d = fr_hash128(manifest->p ? manifest->p : "", manifest->n, 0);
    char hex[33];
    fr_hash128_hex(d, hex);
    /* "G digest[ record]": the policy record rides on the same CAS. */
    sbuf val = {0};
    sb_printf(&val, "%" PRIu64 " %s%s%s", gen, hex, record ? " " : "", record ? record : "");
    if (val.oom) {
        free(val.p);
        snprintf(why, whycap, "out of memory");
        return FERRY_ENOMEM;
    }
    kv_key(k, sizeof k, c->model, 0, "active");
    ferry_kv_value cur = {0};
    uint64_t expected = 0, active = 0;
    rc = ferry_kv_get(s, k, &cur);
    if (rc == 0) {
        expected = cur.mod_rev;
        active = strtoull(cur.val, NULL, 10);
        ferry_store_free(cur.val);
    } else if (rc != FERRY_ENOENT) {
        snprintf(why, whycap, "cannot read the active generation: %s", ferry_store_last_error());
        free(val.p);
        return rc;
    }
    if (active >= gen) {
        snprintf(why, whycap, "generation %" PRIu64 " is not newer than the active %" PRIu64,
                 gen, active);
        free(val.p);
        return FERRY_EINVAL;
    }
    rc = ferry_kv_cas(s, k, expected, val.p, val.n, NULL);
    free(val.p);
    if (rc < 0) {
        snprintf(why, whycap, "announcing lost a race: %s", ferry_store_last_error());
        return rc;
    }
    /* Retention: keep the last `keep` announced generations. */
    char hk[300];
    kv_key(hk, sizeof hk, c->model, 0, "history");
    ferry_kv_value h = {0};
    uint64_t hrev = 0, gens[64];
    size_t ng = 0;
    if (ferry_kv_get(s, hk, &h) == 0) {
        hrev = h.mod_rev;
        for (char *p = h.val; *p && ng < 63;) {
            char *e;
            uint64_t g = strtoull(p, &e, 10);
            if (e == p)
                break;
            gens[ng++] = g;
            p = e;
        }
        ferry_store_free(h.val);
    }
    gens[ng++] = gen;
    uint32_t keep = c->keep ? c->keep : 2;
    sbuf nh = {0};
    for (size_t i = 0; i < ng; i++) {
        bool old = i + keep < ng;
        if (old) {
            char prefix[300];
            int kl = ferry_weights_key(c->model, gens[i], "x", prefix, sizeof prefix);
            uint64_t removed = 0;
            if (kl > 0) {
                prefix[kl - 1] = '\0';   /* "ferry/w/M/G/" */
                (void)ferry_store_remove_prefix(s, prefix, &removed);
            }
            /* Leased objects stay: keep the generation listed until a later
             * publish removes the rest. */
            char rk[300];
            kv_key(rk, sizeof rk, c->model, gens[i], "manifest");
            char **ks = NULL;
            size_t nk = 0;
            if (ferry_store_list(s, prefix, NULL, 1, &ks, &nk, NULL) == 0 && nk == 0) {
                (void)ferry_kv_delete(s, rk, 0, NULL);
                st->removed_generations++;
                ferry_store_free(ks);
                continue;
            }
            ferry_store_free(ks);
        }
        sb_printf(&nh, "%s%" PRIu64, nh.n ? " " : "", gens[i]);
    }
    (void)ferry_kv_cas(s, hk, hrev, nh.p ? nh.p : "", nh.n, NULL);
    free(nh.p);
    return 0;
}

/* Remove whatever this generation stored. */
static void cleanup(ferry_store *s, const ferry_publisher_config *c, uint64_t gen)
{
    char prefix[300];
    int kl = ferry_weights_key(c->model, gen, "x", prefix, sizeof prefix);
    if (kl > 0) {
        prefix[kl - 1] = '\0';
        (void)ferry_store_remove_prefix(s, prefix, NULL);
    }
}

/* Wait for the coordinator's decision. */
static int wait_status(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, char *why,
                       size_t whycap)
{
    char k[300];
    kv_key(k, sizeof k, c->model, gen, "status");
    ferry_watch *w = NULL;
    int rc = ferry_kv_watch(s, k, 0, &w);   /* from now on; then read what is there */
    ferry_kv_value v = {0};
    int g = rc == 0 ? ferry_kv_get(s, k, &v) : rc;
    if (g == FERRY_ENOENT) {
        ferry_kv_event ev;
        int tmo = c->timeout_ms ? (int)c->timeout_ms : 60000;
        g = ferry_watch_next(w, tmo, &ev);
        if (g == 0)
            g = ferry_kv_get(s, k, &v);
    }
    ferry_watch_close(w);
    if (g < 0) {
        snprintf(why, whycap, "no decision from the coordinator (rank 0): %s", ferry_strerror(g));
        return g;
    }
    rc = v.len >= 2 && !strncmp(v.val, "ok", 2) ? 0 : FERRY_ECANCELED;
    if (rc < 0)
        snprintf(why, whycap, "%.*s", (int)v.len, (const char *)v.val);
    ferry_store_free(v.val);
    return rc;
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
    if (!s || !c || gen == 0 || c->world == 0 || c->rank >= c->world || !c->rank_node ||
        (n && !t) || !c->model[0] || strchr(c->model, '/'))
        return fr_rl_fail(err, FERRY_EINVAL, "publish: bad arguments (model, rank, world, generation)");
    int rc = check_tensors(t, n, c, err);
    if (rc < 0)
        return rc;
    /* Generations only move forward: refuse before storing (or cleaning up)
     * anything under an existing generation's keys. */
    uint64_t active = 0;
    rc = ferry_weights_active(s, c->model, &active, NULL);
    if (rc < 0 && rc != FERRY_ENOENT)
        return fr_rl_fail(err, rc, "publish: cannot read the active generation of %s: %s", c->model,
                    ferry_store_last_error());
    if (active >= gen)
        return fr_rl_fail(err, FERRY_EINVAL, "publish: generation %" PRIu64 " of %s is not newer "
                    "than the active %" PRIu64, gen, c->model, active);
    uint32_t *pub = malloc((n ? n : 1) * sizeof *pub);
    uint64_t *sizes = malloc((n ? n : 1) * sizeof *sizes);
    if (!pub || !sizes) {
        free(pub), free(sizes);
        return fr_rl_fail(err, FERRY_ENOMEM, "publish: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        sizes[i] = tensor_bytes(&t[i], out_dtype(c, &t[i]));
        st->total_tensors++;
        st->total_bytes += sizes[i];
    }
    rc = ferry_weights_assign(sizes, n, c->rank_node, c->world, pub, err);
    free(sizes);
    double t0 = (double)fr_now_ns() / 1e9;
    sbuf part = {0};
    ferry_error mine = {0};
    int my_rc = rc < 0 ? rc : put_mine(s, c, gen, t, n, pub, &part, st, &mine);
    free(pub);
    st->put_s = (double)fr_now_ns() / 1e9 - t0;

    /* Every rank leaves its part, good or bad, and meets the others. */
    sbuf pv = {0};
    if (my_rc < 0)
        sb_printf(&pv, "failed %s\n", mine.msg[0] ? mine.msg : ferry_strerror(my_rc));
    else
        sb_printf(&pv, "ok\n%.*s", (int)part.n, part.p ? part.p : "");
    free(part.p);
    char k[300], what[32], member[32], why[512] = "";
    snprintf(what, sizeof what, "part/%u", c->rank);
    kv_key(k, sizeof k, c->model, gen, what);
    int prc = pv.oom ? FERRY_ENOMEM : ferry_kv_put(s, k, pv.p, pv.n, NULL);
    free(pv.p);
    if (prc < 0 && my_rc == 0) {
        my_rc = prc;
        snprintf(mine.msg, sizeof mine.msg, "rank %u cannot record its part: %s", c->rank,
                 ferry_store_last_error());
    }
    kv_key(k, sizeof k, c->model, gen, "parts");
    snprintf(member, sizeof member, "rank %u", c->rank);
    uint64_t tmo = c->timeout_ms ? c->timeout_ms : 60000;
    int brc = ferry_barrier(s, k, member, c->world, tmo, NULL);

    double t1 = (double)fr_now_ns() / 1e9;
    st->barrier_s = t1 - t0 - st->put_s;   /* recording the part, then the barrier */
    int decision;
    if (c->rank == 0) {
        sbuf man = {0};
        if (brc < 0) {
            snprintf(why, sizeof why, "not every trainer rank arrived within %" PRIu64 " ms (%s)",
                     tmo, ferry_strerror(brc));
            decision = brc;
        } else {
            decision = gather(s, c, gen, n, &man, why, sizeof why);
        }
        if (decision == 0)
            decision = announce(s, c, gen, record, &man, st, why, sizeof why);
        free(man.p);
        if (decision < 0)
            cleanup(s, c, gen);
        char sv[600];
        snprintf(sv, sizeof sv, decision == 0 ? "ok" : "failed %s", why);
        kv_key(k, sizeof k, c->model, gen, "status");
        (void)ferry_kv_put(s, k, sv, strlen(sv), NULL);
    } else {
        decision = wait_status(s, c, gen, why, sizeof why);
    }
    st->commit_s = (double)fr_now_ns() / 1e9 - t1;
    if (my_rc < 0)
        return fr_rl_fail(err, my_rc, "%s", mine.msg);
    if (decision < 0)
        return fr_rl_fail(err, decision, "publish of %s generation %" PRIu64 " failed: %s", c->model,
                    gen, why);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------ */

int ferry_weights_active(ferry_store *s, const char *model, uint64_t *generation,
                         uint8_t digest[16])
{
    if (!s || !model || !generation)
        return FERRY_EINVAL;
    char k[300];
    kv_key(k, sizeof k, model, 0, "active");
    ferry_kv_value v = {0};
    *generation = 0;
    int rc = ferry_kv_get(s, k, &v);
    if (rc < 0)
        return rc;
    char hex[33] = "";
    unsigned long long g = 0;
    if (sscanf(v.val, "%llu %32s", &g, hex) != 2 || strlen(hex) != 32)
        rc = FERRY_EPROTO;
    ferry_store_free(v.val);
    if (rc < 0)
        return rc;
    *generation = g;
    for (int i = 0; digest && i < 16; i++) {
        unsigned x;
        sscanf(hex + 2 * i, "%2x", &x);
        digest[i] = (uint8_t)x;
    }
    return 0;
}

static int parse_line(char *p, ferry_weight_entry *e)
{
    char *f[9];
    for (int i = 0; i < 9; i++) {
        f[i] = strsep(&p, "\t");
        if (!f[i])
            return FERRY_EPROTO;
    }
    memset(e, 0, sizeof *e);
    if (strlen(f[0]) >= sizeof e->name || strlen(f[1]) >= sizeof e->dtype ||
        strlen(f[7]) >= sizeof e->key)
        return FERRY_EPROTO;
    strcpy(e->name, f[0]);
    strcpy(e->dtype, f[1]);
    for (char *q = f[2]; *q && e->ndim < FERRY_MAX_DIMS;) {
        char *end;
        e->shape[e->ndim++] = strtoull(q, &end, 10);
        q = *end == ',' ? end + 1 : end;
        if (end == q && *q)
            return FERRY_EPROTO;
    }
    e->bytes = strtoull(f[3], NULL, 10);
    e->checksum = strtoull(f[4], NULL, 16);
    e->publisher = (uint32_t)strtoul(f[5], NULL, 10);
    e->segment = strtoull(f[6], NULL, 10);
    strcpy(e->key, f[7]);
    return 0;
}

int ferry_weights_manifest(ferry_store *s, const char *model, uint64_t generation,
                           ferry_weight_manifest *out, ferry_error *err)
{
    if (!s || !model || !out)
        return fr_rl_fail(err, FERRY_EINVAL, "manifest: bad arguments");
    memset(out, 0, sizeof *out);
    char k[300];
    kv_key(k, sizeof k, model, generation, "manifest");
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v);
    if (rc < 0)
        return fr_rl_fail(err, rc, "manifest of %s generation %" PRIu64 ": %s", model, generation,
                    ferry_store_last_error());
    fr_hash128_t d = fr_hash128(v.val, v.len, 0);
    memcpy(out->digest, d.b, 16);
    uint64_t active = 0;
    uint8_t want[16];
    if (ferry_weights_active(s, model, &active, want) == 0 && active == generation &&
        memcmp(want, out->digest, 16) != 0) {
        ferry_store_free(v.val);
        return fr_rl_fail(err, FERRY_ECORRUPT, "manifest of %s generation %" PRIu64
                    " does not match the announced digest", model, generation);
    }
    size_t lines = 0;
    for (size_t i = 0; i < v.len; i++)
        lines += ((char *)v.val)[i] == '\n';
    out->entries = calloc(lines ? lines : 1, sizeof *out->entries);
    if (!out->entries) {
        ferry_store_free(v.val);
        return fr_rl_fail(err, FERRY_ENOMEM, "manifest: out of memory");
    }
    char *p = v.val;
    for (size_t i = 0; i < lines && rc == 0; i++) {
        char *e = strchr(p, '\n');
        *e = '\0';
        rc = parse_line(p, &out->entries[i]);
        out->bytes += out->entries[i].bytes;
        p = e + 1;
    }
    ferry_store_free(v.val);
    if (rc < 0) {
        ferry_weight_manifest_free(out);
        return fr_rl_fail(err, rc, "manifest of %s generation %" PRIu64 " is malformed", model,
                    generation);
    }
    out->n = lines;
    out->generation = generation;
    return 0;
}

void ferry_weight_manifest_free(ferry_weight_manifest *m)
{
    if (!m)
        return;
    free(m->entries);
    m->entries = NULL;
    m->n = 0;
}

int ferry_weights_read(ferry_store *s, const ferry_weight_entry *e, void *dst, size_t cap,
                       ferry_error *err)
{
    if (!s || !e || (cap && !dst))
        return fr_rl_fail(err, FERRY_EINVAL, "read: bad arguments");
    size_t len = 0;
    int rc = ferry_store_get_into(s, e->key, dst, cap, &len);
    if (rc < 0)
        return fr_rl_fail(err, rc, "tensor %s: %s", e->name, ferry_store_last_error());
    if (len != e->bytes || fr_hash64(dst, len, 0) != e->checksum)
        return fr_rl_fail(err, FERRY_ECORRUPT, "tensor %s: %zu bytes read fail the checksum of the "
                    "published %" PRIu64 " bytes", e->name, len, e->bytes);
    return 0;
}
