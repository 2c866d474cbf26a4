/* Reading published generations back (weights.h): the active generation
 * and whether its objects are still there, manifests and tensors. The KV
 * layout is described at the top of publish.c, its keys built in keys.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

/* ---- probes: one object per store segment ------------------------------------------ */

int fr_rl_probe_put(ferry_store *s, const char *model, uint64_t gen, const char *manifest,
                    size_t len, ferry_error *err)
{
    /* One object per store segment: the first object of the first rank
     * whose objects landed there ("rank R SEGMENT OBJECTS ..." lines). */
    size_t cap = 4096, n = 0, nseg = 0, segcap = 16;
    char *out = malloc(cap), *text = malloc(len + 1);
    uint64_t *segs = malloc(segcap * sizeof *segs);
    int rc = out && segs && text ? 0 : fr_fail(err, FERRY_ENOMEM, "out of memory");
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
        char key[FR_KEY_MAX];
        if (fr_key_gen_object(key, sizeof key, model, gen, r, 0) < 0)
            continue;
        if (nseg == segcap) {
            uint64_t *ns = realloc(segs, 2 * segcap * sizeof *segs);
            if (!ns) {
                rc = fr_fail(err, FERRY_ENOMEM, "out of memory");
                break;
            }
            segs = ns;
            segcap *= 2;
        }
        if (n + strlen(key) + 32 > cap) {
            char *no2 = realloc(out, 2 * cap + strlen(key) + 32);
            if (!no2) {
                rc = fr_fail(err, FERRY_ENOMEM, "out of memory");
                break;
            }
            out = no2;
            cap = 2 * cap + strlen(key) + 32;
        }
        segs[nseg++] = seg;
        n += (size_t)snprintf(out + n, cap - n, "%llu\t%s\n", seg, key);
    }
    if (rc == 0) {
        char k[FR_KEY_MAX];
        fr_key_wk(k, sizeof k, model, gen, "probe");
        rc = ferry_kv_put(s, k, out, n, NULL, err);
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
    char k[FR_KEY_MAX];
    fr_key_wk(k, sizeof k, model, out->generation, "probe");
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v, err);
    if (rc == FERRY_ENOENT)
        return 0;   /* published before probes were recorded: not checked */
    if (rc < 0)
        return fr_fail(err, rc, "cannot check generation %" PRIu64 " of %s: %s",
                       out->generation, model, fr_why(err, rc));
    char *p = v.val, *end = p + v.len;
    while (rc == 0 && p < end) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        char *tab = memchr(p, '\t', (size_t)((eol ? eol : end) - p));
        if (!eol || !tab)
            break;
        *eol = '\0';
        int ex = ferry_store_exist(s, tab + 1, err);
        out->segments++;
        if (ex == 0 || ex == FERRY_ELOST)
            out->lost_segments++;
        else if (ex < 0)
            rc = fr_fail(err, ex, "cannot check generation %" PRIu64 " of %s: %s",
                         out->generation, model, fr_why(err, ex));
        p = eol + 1;
    }
    ferry_store_free(v.val);
    if (rc < 0)
        return rc;
    out->lost = out->lost_segments > 0;
    if (out->lost)
        return fr_fail(err, FERRY_ELOST, "generation %" PRIu64 " of %s is lost: its objects on "
                       "%u of %u store segments are gone (a node holding them restarted or "
                       "died); publish generation %" PRIu64 " or later", out->generation, model,
                       out->lost_segments, out->segments, out->generation + 1);
    return 0;
}

int ferry_weights_active_status(ferry_store *s, const char *model, ferry_weights_status *out,
                                ferry_error *err)
{
    if (!s || !model || !out)
        return fr_fail(err, FERRY_EINVAL, "active status: bad arguments");
    memset(out, 0, sizeof *out);
    int rc = fr_rl_active_read(s, model, &out->generation, out->digest, err);
    if (rc == FERRY_ENOENT)
        return fr_fail(err, rc, "no generation of %s was announced", model);
    if (rc == FERRY_EPROTO)
        return fr_fail(err, rc, "the active key of %s holds no generation", model);
    if (rc < 0)
        return fr_fail(err, rc, "cannot read the active generation of %s: %s", model,
                       fr_why(err, rc));
    return fr_rl_check_whole(s, model, out, err);
}

int ferry_weights_active(ferry_store *s, const char *model, uint64_t *generation,
                         uint8_t digest[16], ferry_error *err)
{
    if (!s || !model || !generation)
        return fr_fail(err, FERRY_EINVAL, "active generation: no store, model or result");
    ferry_weights_status ws;
    int rc = ferry_weights_active_status(s, model, &ws, err);
    *generation = ws.generation;
    if (digest)
        memcpy(digest, ws.digest, 16);
    return rc;
}

int ferry_weights_wait_active(ferry_store *s, const char *model, uint64_t at_least, int timeout_ms,
                              uint64_t *generation, ferry_error *err)
{
    if (!s || !model || !generation || at_least == 0)
        return fr_fail(err, FERRY_EINVAL, "wait_active: bad arguments");
    *generation = 0;
    char k[FR_KEY_MAX];
    fr_key_wk(k, sizeof k, model, 0, "active");
    /* the watch first, then the read: an announcement between them is an
     * event of the watch, never missed */
    ferry_watch *w = NULL;
    int rc = ferry_kv_watch(s, k, 0, &w, err);
    if (rc < 0)
        return fr_fail(err, rc, "cannot watch the announcements of %s: %s", model,
                       fr_why(err, rc));
    uint64_t deadline = fr_deadline_ns(timeout_ms);
    for (;;) {
        rc = ferry_weights_active(s, model, generation, NULL, NULL);
        if ((rc == 0 || rc == FERRY_ELOST) && *generation >= at_least)
            break;   /* reached (a lost one is said so) */
        if (rc < 0 && rc != FERRY_ENOENT && rc != FERRY_ELOST)
            break;   /* an older one lost, or none yet: the one awaited may still come */
        int left = fr_ms_left(deadline);
        ferry_kv_event ev;
        rc = left == 0 ? FERRY_ETIMEDOUT : ferry_watch_next(w, left, &ev, NULL);
        if (rc < 0)
            break;
    }
    ferry_watch_close(w);
    if (rc == FERRY_ETIMEDOUT)
        return fr_fail(err, rc, "generation %" PRIu64 " of %s was not announced within %d ms "
                       "(the active one is %" PRIu64 ")", at_least, model, timeout_ms,
                       *generation);
    if (rc == FERRY_ELOST)
        return fr_fail(err, rc, "generation %" PRIu64 " of %s is lost: its objects are gone; "
                       "publish generation %" PRIu64 " or later", *generation, model,
                       *generation + 1);
    if (rc < 0)
        return fr_fail(err, rc, "waiting for generation %" PRIu64 " of %s: %s", at_least,
                       model, ferry_strerror(rc));
    return 0;
}

/* ---- manifests and tensors ------------------------------------------------------------- */

int ferry_weights_manifest(ferry_store *s, const char *model, uint64_t generation,
                           ferry_weight_manifest *out, ferry_error *err)
{
    if (!s || !model || !out)
        return fr_fail(err, FERRY_EINVAL, "manifest: bad arguments");
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
        return fr_fail(err, FERRY_EINVAL, "read: bad arguments (an entry of a manifest from "
                       "ferry_weights_manifest)");
    fr_gen *g = e->internal;
    int rc = fr_rl_read_whole(s, g, e->index, dst, cap, err);
    return rc < 0 ? rc : fr_gen_verify_tensor(s, g, e->index, dst, err);
}

/* The reads of whole tensors tensors[0..n) of g into dst[i] (cap[i] bytes
 * each): each checked (in g, fits, has its whole fragment), the whole
 * fragments bound at dst, g->whole attested and lowered tensor by tensor
 * into *r. On success the caller owns *b, *att and *r. */
static int plan_wholes(fr_gen *g, const uint32_t *tensors, void *const *dst, const size_t *cap,
                       size_t n, ferry_binding **b, ferry_attested_plan **att,
                       ferry_store_reads *r, ferry_error *err)
{
    *b = NULL;
    *att = NULL;
    memset(r, 0, sizeof *r);
    if (!g->whole || !n)
        return fr_fail(err, FERRY_EINVAL, "no tensor %u in generation %" PRIu64,
                       n ? tensors[0] : 0, g->generation);
    uint64_t *frag = calloc(n, sizeof *frag), *at = calloc(n, sizeof *at);
    int rc = frag && at ? 0 : fr_fail(err, FERRY_ENOMEM, "reading %zu tensors: out of memory", n);
    for (size_t i = 0; i < n && rc == 0; i++) {
        ferry_tensor_desc d;
        ferry_fragment f;
        if (ferry_manifest_tensor(g->m, tensors[i], &d) < 0) {
            rc = fr_fail(err, FERRY_EINVAL, "no tensor %u in generation %" PRIu64, tensors[i],
                         g->generation);
            break;
        }
        uint64_t bytes = d.itemsize;
        for (uint32_t k = 0; k < d.ndim; k++)
            bytes *= d.shape[k];
        if (cap[i] < bytes) {
            rc = fr_fail(err, FERRY_EMSGSIZE, "tensor %s: %" PRIu64 " bytes, the buffer holds "
                         "%zu", d.name, bytes, cap[i]);
            break;
        }
        /* whole_m holds one whole fragment per tensor, in tensor order */
        if (ferry_manifest_fragment(g->whole_m, tensors[i], &f) < 0 || f.tensor != tensors[i]) {
            rc = fr_fail(err, FERRY_EPROTO, "tensor %s: no whole fragment of it", d.name);
            break;
        }
        frag[i] = tensors[i];
        at[i] = (uint64_t)(uintptr_t)dst[i];
    }
    if (rc == 0)
        rc = fr_rl_bind(g->whole_m, g->generation, 0, frag, n, at, NULL, b, err);
    if (rc == 0)
        rc = fr_rl_attest_reads(g, g->whole, *b, att, err);
    for (size_t i = 0; i < n && rc == 0; i++) {   /* lowering appends to r */
        ferry_plan_filter flt = { .tensor = tensors[i], .src_rank = -1, .dst_rank = -1 };
        rc = ferry_exec_store_lower(*att, *b, (const uint32_t[]){ 0 }, 1, &flt, r, err);
    }
    if (rc < 0 && !(err && err->msg[0]))
        fr_fail(err, rc, "planning the reads of %zu tensors: %s", n, ferry_strerror(rc));
    free(frag);
    free(at);
    if (rc < 0) {
        ferry_store_reads_free(r);
        ferry_attested_free(*att);
        ferry_binding_free(*b);
        *b = NULL;
        *att = NULL;
    }
    return rc;
}

int fr_rl_read_whole(ferry_store *s, fr_gen *g, uint32_t tensor, void *dst, size_t cap,
                     ferry_error *err)
{
    ferry_binding *b;
    ferry_attested_plan *att;
    ferry_store_reads r;
    int rc = plan_wholes(g, &tensor, &dst, &cap, 1, &b, &att, &r, err);
    if (rc < 0)
        return rc;
    ferry_store_exec_config xc = { .store = s, .locate = fr_rl_locate, .locate_ctx = g };
    ferry_exec_result res;
    rc = ferry_exec_store_run(&xc, att, b, &r, 0, r.n, &res, err);
    ferry_exec_result_free(&res);
    ferry_store_reads_free(&r);
    ferry_attested_free(att);
    ferry_binding_free(b);
    return rc;
}
