/* Reading published generations back (weights.h): the active generation
 * and whether its objects are still there, manifests and tensors. The KV
 * layout is described at the top of publish.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

void fr_wk_key(char *out, size_t cap, const char *model, uint64_t gen, const char *what)
{
    if (gen)
        snprintf(out, cap, "ferry/wk/%s/%020" PRIu64 "/%s", model, gen, what);
    else
        snprintf(out, cap, "ferry/wk/%s/%s", model, what);
}

int fr_rl_active_read(ferry_store *s, const char *model, uint64_t *generation,
                      uint8_t digest[16])
{
    if (!s || !model || !generation)
        return FERRY_EINVAL;
    char k[300];
    fr_wk_key(k, sizeof k, model, 0, "active");
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

/* ---- probes: one object per store segment ------------------------------------------ */

int fr_rl_probe_put(ferry_store *s, const char *model, uint64_t gen, const char *manifest,
                    size_t len)
{
    /* Fields 7 and 8 of a manifest line (1-based) are the segment and the key. */
    size_t cap = 4096, n = 0, nseg = 0, segcap = 16;
    char *out = malloc(cap);
    uint64_t *segs = malloc(segcap * sizeof *segs);
    int rc = out && segs ? 0 : FERRY_ENOMEM;
    for (const char *p = manifest, *end = manifest + len; rc == 0 && p < end;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        const char *f[9] = { p };
        int nf = 1;
        for (const char *q = p; q < eol && nf < 9; q++)
            if (*q == '\t')
                f[nf++] = q + 1;
        p = eol + 1;
        if (nf < 9)
            continue;
        uint64_t seg = strtoull(f[6], NULL, 10);
        bool seen = false;
        for (size_t i = 0; i < nseg && !seen; i++)
            seen = segs[i] == seg;
        if (seen)
            continue;
        size_t klen = (size_t)(f[8] - 1 - f[7]);
        if (nseg == segcap) {
            uint64_t *ns = realloc(segs, 2 * segcap * sizeof *segs);
            if (!ns) {
                rc = FERRY_ENOMEM;
                break;
            }
            segs = ns;
            segcap *= 2;
        }
        if (n + klen + 32 > cap) {
            char *no = realloc(out, 2 * cap + klen + 32);
            if (!no) {
                rc = FERRY_ENOMEM;
                break;
            }
            out = no;
            cap = 2 * cap + klen + 32;
        }
        segs[nseg++] = seg;
        n += (size_t)snprintf(out + n, cap - n, "%" PRIu64 "\t%.*s\n", seg, (int)klen, f[7]);
    }
    if (rc == 0) {
        char k[300];
        fr_wk_key(k, sizeof k, model, gen, "probe");
        rc = ferry_kv_put(s, k, out, n, NULL);
    }
    free(out);
    free(segs);
    return rc;
}

int fr_rl_check_whole(ferry_store *s, const char *model, ferry_weights_status *out,
                      ferry_error *err)
{
    out->segments = out->lost_segments = 0;
    out->lost = false;
    char k[300];
    fr_wk_key(k, sizeof k, model, out->generation, "probe");
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v);
    if (rc == FERRY_ENOENT)
        return 0;   /* published before probes were recorded: not checked */
    if (rc < 0)
        return fr_rl_fail(err, rc, "cannot check generation %" PRIu64 " of %s: %s",
                          out->generation, model, ferry_store_last_error());
    char *p = v.val, *end = p + v.len;
    while (rc == 0 && p < end) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        char *tab = memchr(p, '\t', (size_t)((eol ? eol : end) - p));
        if (!eol || !tab)
            break;
        *eol = '\0';
        int ex = ferry_store_exist(s, tab + 1);
        out->segments++;
        if (ex == 0 || ex == FERRY_ELOST)
            out->lost_segments++;
        else if (ex < 0)
            rc = fr_rl_fail(err, ex, "cannot check generation %" PRIu64 " of %s: %s",
                            out->generation, model, ferry_store_last_error());
        p = eol + 1;
    }
    ferry_store_free(v.val);
    if (rc < 0)
        return rc;
    out->lost = out->lost_segments > 0;
    if (out->lost)
        return fr_rl_fail(err, FERRY_ELOST, "generation %" PRIu64 " of %s is lost: its objects on "
                          "%u of %u store segments are gone (a node holding them restarted or "
                          "died); publish generation %" PRIu64 " or later", out->generation, model,
                          out->lost_segments, out->segments, out->generation + 1);
    return 0;
}

int ferry_weights_active_status(ferry_store *s, const char *model, ferry_weights_status *out,
                                ferry_error *err)
{
    if (!s || !model || !out)
        return fr_rl_fail(err, FERRY_EINVAL, "active status: bad arguments");
    memset(out, 0, sizeof *out);
    int rc = fr_rl_active_read(s, model, &out->generation, out->digest);
    if (rc == FERRY_ENOENT)
        return fr_rl_fail(err, rc, "no generation of %s was announced", model);
    if (rc == FERRY_EPROTO)
        return fr_rl_fail(err, rc, "the active key of %s holds no generation", model);
    if (rc < 0)
        return fr_rl_fail(err, rc, "cannot read the active generation of %s: %s", model,
                          ferry_store_last_error());
    return fr_rl_check_whole(s, model, out, err);
}

int ferry_weights_active(ferry_store *s, const char *model, uint64_t *generation,
                         uint8_t digest[16])
{
    if (!s || !model || !generation)
        return FERRY_EINVAL;
    ferry_weights_status ws;
    int rc = ferry_weights_active_status(s, model, &ws, NULL);
    *generation = ws.generation;
    if (digest)
        memcpy(digest, ws.digest, 16);
    return rc;
}

/* ---- manifests and tensors ------------------------------------------------------------- */

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
    fr_wk_key(k, sizeof k, model, generation, "manifest");
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v);
    if (rc < 0)
        return fr_rl_fail(err, rc, "manifest of %s generation %" PRIu64 ": %s", model, generation,
                    ferry_store_last_error());
    fr_hash128_t d = fr_hash128(v.val, v.len, 0);
    memcpy(out->digest, d.b, 16);
    uint64_t active = 0;
    uint8_t want[16];
    if (fr_rl_active_read(s, model, &active, want) == 0 && active == generation &&
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
