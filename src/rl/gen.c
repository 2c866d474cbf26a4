/* A weight generation as it is stored, read back (gen_int.h), and the
 * active key that names the announced one (fr_rl_active_read, rl_int.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/rl_int.h"

int fr_rl_active_read(ferry_store *s, const char *model, uint64_t *generation,
                      uint8_t digest[16], ferry_error *err)
{
    if (!s || !model || !generation)
        return fr_fail(err, FERRY_EINVAL, "reading the active generation: no store, model or result");
    char k[FR_KEY_MAX];
    fr_key_wk(k, sizeof k, model, 0, "active");
    ferry_kv_value v = {0};
    *generation = 0;
    int rc = ferry_kv_get(s, k, &v, err);
    if (rc < 0)
        return rc;
    char hex[33] = "";
    unsigned long long g = 0;
    if (sscanf(v.val, "%llu %32s", &g, hex) != 2 || strlen(hex) != 32)
        rc = fr_fail(err, FERRY_EPROTO, "%s does not hold a generation and its digest", k);
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

void fr_gen_free(fr_gen *g)
{
    if (!g)
        return;
    for (uint32_t r = 0; g->ranks && r < g->nranks; r++) {
        free(g->ranks[r].sums);
        for (uint32_t k = 0; g->ranks[r].keys && k < g->ranks[r].nobjects; k++)
            free(g->ranks[r].keys[k]);
        free(g->ranks[r].keys);
    }
    free(g->ranks);
    free(g->ordinal);
    ferry_pack_free(g->pack);
    ferry_plan_free(g->whole);
    ferry_manifest_close(g->whole_m);
    ferry_manifest_close(g->m);
    free(g);
}

static int hex16(const char *s, uint8_t out[16])
{
    if (strlen(s) != 32)
        return FERRY_EPROTO;
    for (int i = 0; i < 16; i++) {
        unsigned x;
        if (sscanf(s + 2 * i, "%2x", &x) != 1)
            return FERRY_EPROTO;
        out[i] = (uint8_t)x;
    }
    return 0;
}

/* The generation text: the manifest's size and hash, one line per rank. */
static int parse_text(fr_gen *g, char *text, uint64_t *mbytes, uint8_t mhash[16])
{
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, "ferry-gen 2") != 0)
        return FERRY_EPROTO;
    line = strtok_r(NULL, "\n", &save);
    char hx[40];
    unsigned long long mb;
    if (!line || sscanf(line, "manifest %llu %39s", &mb, hx) != 2 || hex16(hx, mhash) < 0)
        return FERRY_EPROTO;
    *mbytes = mb;
    uint32_t n = 0, cap = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        unsigned r, no;
        unsigned long long seg, sh;
        if (sscanf(line, "rank %u %llu %u %llx", &r, &seg, &no, &sh) != 4 || r != n)
            return FERRY_EPROTO;
        if (n + 1 > cap) {
            fr_gen_rank *nr = realloc(g->ranks, (n + 16) * sizeof *nr);
            if (!nr)
                return FERRY_ENOMEM;
            g->ranks = nr;
            cap = n + 16;
        }
        g->ranks[n++] = (fr_gen_rank){ .segment = seg, .nobjects = no, .sums_hash = sh };
    }
    g->nranks = n;
    return n ? 0 : FERRY_EPROTO;
}

static int load_manifest(ferry_store *s, fr_gen *g, uint64_t bytes, const uint8_t hash[16],
                         ferry_error *err)
{
    char key[FR_KEY_MAX];
    if (fr_key_gen_file(key, sizeof key, g->model, g->generation, "manifest.json") < 0)
        return fr_fail(err, FERRY_EINVAL, "model name too long");
    char *text = malloc(bytes + 1);
    if (!text)
        return fr_fail(err, FERRY_ENOMEM, "out of memory for the manifest of %s", g->model);
    size_t got = 0;
    int rc = ferry_store_get_into(s, key, text, bytes, &got, err);
    if (rc < 0) {
        free(text);
        return fr_fail(err, rc, "generation %" PRIu64 " of %s is not whole: its placement "
                       "cannot be read: %s", g->generation, g->model, fr_why(err, rc));
    }
    fr_hash128_t h = fr_hash128(text, got, 0);
    if (got != bytes || memcmp(h.b, hash, 16) != 0) {
        free(text);
        return fr_fail(err, FERRY_ECORRUPT, "the placement of %s generation %" PRIu64
                       " does not match its digest", g->model, g->generation);
    }
    memcpy(g->placement, hash, 16);
    rc = ferry_manifest_from_json(text, got, &g->m, err);
    free(text);
    if (rc < 0)
        return rc;
    if (ferry_manifest_rank_count(g->m) != g->nranks)
        return fr_fail(err, FERRY_EPROTO, "generation %" PRIu64 " of %s: %u ranks listed, its "
                       "placement has %u", g->generation, g->model, g->nranks,
                       ferry_manifest_rank_count(g->m));
    rc = ferry_manifest_pack(g->m, FR_GEN_ALIGN, FR_GEN_OBJECT_MAX, &g->pack, err);
    for (uint32_t r = 0; r < g->nranks && rc == 0; r++) {
        fr_gen_rank *gr = &g->ranks[r];
        if (ferry_pack_objects(g->pack, r) != gr->nobjects)
            return fr_fail(err, FERRY_EPROTO, "generation %" PRIu64 " of %s: rank %u stored %u "
                           "objects, its placement packs into %u", g->generation, g->model, r,
                           gr->nobjects, ferry_pack_objects(g->pack, r));
        gr->keys = calloc(gr->nobjects ? gr->nobjects : 1, sizeof *gr->keys);
        for (uint32_t k = 0; gr->keys && k < gr->nobjects; k++) {
            char key[FR_KEY_MAX];
            (void)fr_key_gen_object(key, sizeof key, g->model, g->generation, r, k);
            if (!(gr->keys[k] = strdup(key)))
                break;
        }
        if (!gr->keys || (gr->nobjects && !gr->keys[gr->nobjects - 1]))
            return fr_fail(err, FERRY_ENOMEM, "out of memory");
    }
    return rc;
}

int fr_gen_load(ferry_store *s, const char *model, uint64_t gen, fr_gen **out, ferry_error *err)
{
    *out = NULL;
    fr_gen *g = calloc(1, sizeof *g);
    if (!g)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    snprintf(g->model, sizeof g->model, "%s", model);
    g->generation = gen;
    char k[FR_KEY_MAX];
    fr_key_wk(k, sizeof k, model, gen, "manifest");
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v, err);
    if (rc < 0) {
        fr_gen_free(g);
        return fr_fail(err, rc, "generation %" PRIu64 " of %s: %s", gen, model,
                       rc == FERRY_ENOENT ? "not published" : fr_why(err, rc));
    }
    fr_hash128_t d = fr_hash128(v.val, v.len, 0);
    memcpy(g->digest, d.b, 16);
    uint64_t active = 0;
    uint8_t want[16];
    if (fr_rl_active_read(s, model, &active, want, NULL) == 0 && active == gen &&
        memcmp(want, g->digest, 16) != 0)
        rc = fr_fail(err, FERRY_ECORRUPT, "the manifest of %s generation %" PRIu64
                     " does not match the announced digest", model, gen);
    uint64_t mbytes = 0;
    uint8_t mhash[16];
    fr_sgen sg = {0};
    if (rc == 0 && fr_sgen_is(v.val, v.len)) {
        /* A delta is not a whole generation: say what can load it. */
        bool ok = fr_sgen_parse(v.val, v.len, gen, &sg) == 0;
        rc = ok ? fr_fail(err, FERRY_ESTATE, "generation %" PRIu64 " of %s is a sparse delta "
                          "on generation %" PRIu64 " (its chain starts at dense generation %"
                          PRIu64 "): a dense update cannot load it; update with "
                          "ferry_sparse_update, which applies the chain (loading generation %"
                          PRIu64 " first when needed)", gen, model, sg.base, sg.dense, sg.dense)
                : fr_fail(err, FERRY_EPROTO, "the manifest of %s generation %" PRIu64 " is a "
                          "malformed sparse generation", model, gen);
        fr_sgen_free(&sg);
    }
    if (rc == 0 && (rc = parse_text(g, v.val, &mbytes, mhash)) < 0)
        fr_fail(err, rc, "the manifest of %s generation %" PRIu64 " is malformed (or of an "
                "older ferry)", model, gen);
    ferry_store_free(v.val);
    if (rc == 0)
        rc = load_manifest(s, g, mbytes, mhash, err);
    if (rc < 0) {
        fr_gen_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int fr_gen_where(const fr_gen *g, uint64_t frag, const char **key, uint64_t *offset,
                 uint64_t *bytes)
{
    ferry_packed p;
    int rc = ferry_pack_fragment(g->pack, frag, &p);
    if (rc < 0 || p.rank >= g->nranks || p.object >= g->ranks[p.rank].nobjects)
        return rc < 0 ? rc : FERRY_EPROTO;
    if (key)
        *key = g->ranks[p.rank].keys[p.object];
    if (offset)
        *offset = p.offset;
    if (bytes)
        *bytes = p.bytes;
    return 0;
}

/* ---- rollout bindings ------------------------------------------------------------------- */

static void dims_text(char *buf, size_t cap, const uint64_t *v, uint32_t n)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRIu64, i ? "," : "", v[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

int fr_rl_shard_quant_check(const fr_gen *g, uint32_t ti, const ferry_param_shard *p,
                            ferry_error *err)
{
    ferry_tensor_quant q;
    ferry_tensor_desc d, sd;
    if (ferry_manifest_tensor_quant(g->m, ti, &q) < 0 || q.role != FERRY_QUANT_WEIGHT ||
        p->dequantize)   /* staged by the direct update, which checked it */
        return 0;
    (void)ferry_manifest_tensor(g->m, ti, &d);
    (void)ferry_manifest_tensor(g->m, q.partner, &sd);
    if (p->elem_bytes && p->elem_bytes != 1)
        return fr_fail(err, FERRY_EINVAL, "tensor %s is published as %s in %u x %u blocks (its "
                       "scales in tensor %s): the shard's buffer holds %" PRIu64 "-byte "
                       "elements, an FP8 buffer one-byte ones (a shard's dequantize asks "
                       "q * s in another dtype)",
                       d.name, q.fp8_dtype, q.fp8.block_rows, q.fp8.block_cols, sd.name,
                       p->elem_bytes);
    static const char *const dim_name[2] = { "row", "column" };
    uint32_t b[2] = { q.fp8.block_rows, q.fp8.block_cols };
    for (uint32_t k = 0; k < 2 && p->ndim == 2; k++) {
        uint64_t off = p->offset[k], end = off + p->shape[k];
        if (!p->shape[0] || !p->shape[1] || (off % b[k] == 0 && (end % b[k] == 0 || end == d.shape[k])))
            continue;
        uint64_t at = off % b[k] ? off : end;
        return fr_fail(err, FERRY_EINVAL, "tensor %s (%s in %u x %u blocks): the shard at "
                       "offset [%" PRIu64 ",%" PRIu64 "], shape [%" PRIu64 ",%" PRIu64 "] %s at "
                       "%s %" PRIu64 ", inside block %s %" PRIu64 ": a rollout shard must hold "
                       "whole blocks", d.name, q.fp8_dtype, b[0], b[1], p->offset[0],
                       p->offset[1], p->shape[0], p->shape[1], off % b[k] ? "starts" : "ends",
                       dim_name[k], at, dim_name[k], at / b[k]);
    }
    return 0;
}

int fr_rl_shard_check(const ferry_param_shard *p, const ferry_tensor_desc *d, uint64_t *span,
                      ferry_error *err)
{
    bool strided = false, empty = false;
    uint64_t n = 1, last = 0;
    uint32_t nd = p->ndim < d->ndim ? p->ndim : d->ndim;
    if (p->elem_bytes && p->elem_bytes != d->itemsize)
        return fr_fail(err, FERRY_EINVAL, "tensor %s: the shard's buffer holds %" PRIu64 "-byte "
                       "elements; the published dtype %s has %u-byte ones", d->name,
                       p->elem_bytes, d->dtype, d->itemsize);
    for (uint32_t k = 0; k < nd; k++) {
        strided |= p->strides[k] != 0;
        empty |= p->shape[k] == 0;
        n *= p->shape[k];
    }
    for (uint32_t k = 0; strided && k < nd; k++)
        last += (p->shape[k] ? p->shape[k] - 1 : 0) * (uint64_t)(p->strides[k] > 0 ? p->strides[k] : 0);
    uint64_t bytes = empty ? 0 : (strided ? last + 1 : n) * d->itemsize;
    if (span)
        *span = bytes;
    if (!bytes || (p->dst && (!p->dst_bytes || bytes <= p->dst_bytes)))
        return 0;
    char off[200], shp[200];
    dims_text(off, sizeof off, p->offset, nd);
    dims_text(shp, sizeof shp, p->shape, nd);
    if (!p->dst)
        return fr_fail(err, FERRY_EINVAL, "tensor %s: the shard at offset %s, shape %s has no "
                       "buffer", d->name, off, shp);
    return fr_fail(err, FERRY_EINVAL, "tensor %s: the shard at offset %s, shape %s spans %"
                   PRIu64 " bytes of its buffer, which holds %" PRIu64, d->name, off, shp,
                   bytes, p->dst_bytes);
}

/* ---- checksums ------------------------------------------------------------------------ */

uint64_t fr_gen_bytes_hash(const void *data, size_t len)
{
    fr_hasher *h = fr_hasher_new(0);
    if (!h)
        return 0;
    fr_hasher_update(h, data, len);
    fr_hash128_t d = fr_hasher_digest(h);
    fr_hasher_free(h);
    uint64_t v;
    memcpy(&v, d.b, 8);
    return v;
}

uint64_t fr_gen_box_hash(const uint8_t *base, uint32_t ndim, const uint64_t *shape,
                         const uint64_t *strides, uint32_t itemsize)
{
    uint64_t packed[FERRY_MAX_DIMS], s = 1;
    for (int d = (int)ndim - 1; d >= 0; d--) {
        packed[d] = s;
        s *= shape[d];
    }
    ferry_run run;
    ferry_box_lower(ndim, shape, itemsize, strides, packed, &run);
    fr_hasher *h = fr_hasher_new(0);
    if (!h)
        return 0;
    uint64_t rows = 1, ctr[FERRY_MAX_DIMS] = {0};
    for (uint32_t i = 0; i < run.nouter; i++)
        rows *= run.count[i];
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t off = 0;
        for (uint32_t i = 0; i < run.nouter; i++)
            off += ctr[i] * run.src_stride[i];
        fr_hasher_update(h, base + off, run.len);
        for (int i = (int)run.nouter - 1; i >= 0 && ++ctr[i] == run.count[i]; i--)
            ctr[i] = 0;
    }
    fr_hash128_t d = fr_hasher_digest(h);
    fr_hasher_free(h);
    uint64_t v;
    memcpy(&v, d.b, 8);
    return v;
}

static int load_sums(ferry_store *s, fr_gen *g, uint32_t rank, ferry_error *err)
{
    if (!g->ordinal) {   /* every fragment's place among its rank's, once */
        uint64_t n = ferry_manifest_fragment_count(g->m);
        uint32_t *count = calloc(g->nranks, sizeof *count);
        g->ordinal = malloc((n ? n : 1) * sizeof *g->ordinal);
        if (!count || !g->ordinal) {
            free(count);
            free(g->ordinal);
            g->ordinal = NULL;
            return fr_fail(err, FERRY_ENOMEM, "out of memory");
        }
        for (uint64_t id = 0; id < n; id++) {
            ferry_packed p;
            (void)ferry_pack_fragment(g->pack, id, &p);
            g->ordinal[id] = count[p.rank]++;
        }
        free(count);
    }
    char key[FR_KEY_MAX], what[32];
    snprintf(what, sizeof what, "r%u.sums", rank);
    if (fr_key_gen_file(key, sizeof key, g->model, g->generation, what) < 0)
        return fr_fail(err, FERRY_EINVAL, "model name %s too long for a key", g->model);
    void *buf = NULL;
    size_t len = 0;
    int rc = ferry_store_get(s, key, &buf, &len, err);
    if (rc < 0)
        return fr_fail(err, rc, "the checksums of rank %u of %s generation %" PRIu64
                       " cannot be read: %s", rank, g->model, g->generation,
                       fr_why(err, rc));
    if (fr_hash64(buf, len, 0) != g->ranks[rank].sums_hash || len % 8) {
        ferry_store_free(buf);
        return fr_fail(err, FERRY_ECORRUPT, "the checksums of rank %u of %s generation %"
                       PRIu64 " do not match the manifest", rank, g->model, g->generation);
    }
    g->ranks[rank].sums = malloc(len ? len : 8);
    if (g->ranks[rank].sums)
        memcpy(g->ranks[rank].sums, buf, len);
    g->ranks[rank].nsums = len / 8;
    ferry_store_free(buf);
    return g->ranks[rank].sums ? 0 : fr_fail(err, FERRY_ENOMEM, "out of memory");
}

int fr_gen_checksum(ferry_store *s, fr_gen *g, uint64_t frag, uint64_t *out, ferry_error *err)
{
    ferry_packed p;
    int rc = ferry_pack_fragment(g->pack, frag, &p);
    if (rc < 0 || p.rank >= g->nranks)
        return fr_fail(err, FERRY_EINVAL, "no fragment %" PRIu64, frag);
    if (!g->ranks[p.rank].sums && (rc = load_sums(s, g, p.rank, err)) < 0)
        return rc;
    uint32_t o = g->ordinal[frag];
    if (o >= g->ranks[p.rank].nsums)
        return fr_fail(err, FERRY_EPROTO, "rank %u of %s generation %" PRIu64 " has no "
                       "checksum for fragment %" PRIu64, p.rank, g->model, g->generation, frag);
    *out = g->ranks[p.rank].sums[o];
    return 0;
}

int fr_gen_lease_all(ferry_store *s, const fr_gen *g, ferry_error *err)
{
    size_t n = 0;
    for (uint32_t r = 0; r < g->nranks; r++)
        n += g->ranks[r].nobjects;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    void **bufs = calloc(n ? n : 1, sizeof *bufs);
    size_t *caps = calloc(n ? n : 1, sizeof *caps);
    int64_t *res = calloc(n ? n : 1, sizeof *res);
    int rc = keys && bufs && caps && res ? 0 : fr_fail(err, FERRY_ENOMEM, "out of memory");
    size_t k = 0;
    for (uint32_t r = 0; rc == 0 && r < g->nranks; r++)
        for (uint32_t o = 0; o < g->ranks[r].nobjects; o++)
            keys[k++] = g->ranks[r].keys[o];
    if (rc == 0 && n)
        rc = ferry_store_batch_get_into(s, keys, bufs, caps, n, res, NULL);
    for (size_t i = 0; rc < 0 && i < n; i++)
        if (res[i] < 0 && res[i] != FERRY_EMSGSIZE) {
            rc = fr_fail(err, (int)res[i], "generation %" PRIu64 " of %s is not whole: %s: %s",
                         g->generation, g->model, keys[i], ferry_strerror((int)res[i]));
            break;
        }
    if (rc == FERRY_EMSGSIZE)
        rc = 0;   /* every object is there: none fits a buffer of 0 bytes */
    free(keys), free(bufs), free(caps), free(res);
    return rc;
}

int fr_rl_kv_get_all(ferry_store *s, char (*keys)[FR_KEY_MAX], size_t n, ferry_kv_value *out,
                      int *results)
{
    const char **kp = malloc((n ? n : 1) * sizeof *kp);
    if (!kp) {
        for (size_t k = 0; k < n; k++) {
            out[k] = (ferry_kv_value){0};
            results[k] = FERRY_ENOMEM;
        }
        return FERRY_ENOMEM;
    }
    for (size_t k = 0; k < n; k++)
        kp[k] = keys[k];
    int rc = ferry_kv_batch_get(s, kp, n, out, results, NULL);
    free(kp);
    return rc;
}
