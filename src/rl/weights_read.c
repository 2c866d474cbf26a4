/* Reading published generations back (weights.h): the active generation
 * and whether its objects are still there, manifests and tensors. The KV
 * layout is described at the top of publish.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
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
    /* One object per store segment: the first object of the first rank
     * whose objects landed there ("rank R SEGMENT OBJECTS ..." lines). */
    size_t cap = 4096, n = 0, nseg = 0, segcap = 16;
    char *out = malloc(cap), *text = malloc(len + 1);
    uint64_t *segs = malloc(segcap * sizeof *segs);
    int rc = out && segs && text ? 0 : FERRY_ENOMEM;
    if (text) {
        memcpy(text, manifest, len);
        text[len] = '\0';
    }
    char *save = NULL;
    for (char *l = rc == 0 ? strtok_r(text, "\n", &save) : NULL; l && rc == 0;
         l = strtok_r(NULL, "\n", &save)) {
        unsigned r, no;
        unsigned long long seg;
        if (sscanf(l, "rank %u %llu %u", &r, &seg, &no) != 3 || no == 0)
            continue;
        bool seen = false;
        for (size_t i = 0; i < nseg && !seen; i++)
            seen = segs[i] == seg;
        if (seen)
            continue;
        char key[FR_GEN_KEY];
        if (fr_gen_object_key(model, gen, r, 0, key, sizeof key) < 0)
            continue;
        if (nseg == segcap) {
            uint64_t *ns = realloc(segs, 2 * segcap * sizeof *segs);
            if (!ns) {
                rc = FERRY_ENOMEM;
                break;
            }
            segs = ns;
            segcap *= 2;
        }
        if (n + strlen(key) + 32 > cap) {
            char *no2 = realloc(out, 2 * cap + strlen(key) + 32);
            if (!no2) {
                rc = FERRY_ENOMEM;
                break;
            }
            out = no2;
            cap = 2 * cap + strlen(key) + 32;
        }
        segs[nseg++] = seg;
        n += (size_t)snprintf(out + n, cap - n, "%llu\t%s\n", seg, key);
    }
    if (rc == 0) {
        char k[300];
        fr_wk_key(k, sizeof k, model, gen, "probe");
        rc = ferry_kv_put(s, k, out, n, NULL);
    }
    free(out);
    free(segs);
    free(text);
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

int ferry_weights_manifest(ferry_store *s, const char *model, uint64_t generation,
                           ferry_weight_manifest *out, ferry_error *err)
{
    if (!s || !model || !out)
        return fr_rl_fail(err, FERRY_EINVAL, "manifest: bad arguments");
    memset(out, 0, sizeof *out);
    fr_gen *g = NULL;
    int rc = fr_gen_load(s, model, generation, &g, err);
    if (rc == 0)
        rc = fr_gen_to_manifest(g, out, err);
    if (rc < 0)
        fr_gen_free(g);
    return rc;
}

void ferry_weight_manifest_free(ferry_weight_manifest *m)
{
    if (!m)
        return;
    free(m->entries);
    fr_gen_free(m->internal);
    memset(m, 0, sizeof *m);
}

int ferry_weights_read(ferry_store *s, const ferry_weight_entry *e, void *dst, size_t cap,
                       ferry_error *err)
{
    if (!s || !e || (cap && !dst) || !e->internal)
        return fr_rl_fail(err, FERRY_EINVAL, "read: bad arguments (an entry of a manifest from "
                          "ferry_weights_manifest)");
    return fr_gen_read_tensor(s, e->internal, e->index, dst, cap, NULL, err);
}
