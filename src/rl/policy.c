/* The policy registry (samples.h): a policy version is a weight
 * generation. Its record rides on the compare-and-swap that announces the
 * generation ("ferry/wk/M/active" = "G <digest> <record JSON>"), so the two
 * become current together. History: "ferry/pv/M/history", one record per
 * line, appended by the coordinator after the announcement (the last 1024).
 * Rollout workers learn of new versions by a watch on the active key. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/samples.h"
#include "rl/keys.h"
#include "rl/policy_int.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

#define HISTORY_MAX 1024

static int model_ok(const char *model)
{
    return model && model[0] && !strchr(model, '/') && strlen(model) < 128;
}

static void active_key(char *k, size_t cap, const char *model)
{
    (void)fr_key_wk(k, cap, model, 0, "active");
}

/* Parse an active value into a version record. */
static int parse_active(const char *model, const char *val, size_t len, ferry_policy_version *out,
                        ferry_error *err)
{
    memset(out, 0, sizeof *out);
    char *text = malloc(len + 1);
    if (!text)
        return fr_fail(err, FERRY_ENOMEM, "policy: out of memory");
    memcpy(text, val, len);
    text[len] = '\0';
    char *e = NULL, *p = text;
    uint64_t g = strtoull(p, &e, 10);
    int rc = 0;
    if (e == p || *e != ' ' || g == 0) {
        rc = fr_fail(err, FERRY_EPROTO, "policy: the active key of %s holds no generation",
                     model);
    } else {
        p = e + 1;
        while (*p && *p != ' ')
            p++;   /* the digest */
        if (*p == ' ') {
            rc = ferry_policy_version_from_json(p + 1, strlen(p + 1), out, err);
            if (rc == 0 && out->version != g)
                rc = fr_fail(err, FERRY_EPROTO, "policy: %s generation %" PRIu64
                             " announced a record of version %" PRIu64, model, g, out->version);
        } else {
            out->version = out->weight_generation = g;
            snprintf(out->model, sizeof out->model, "%s", model);
        }
    }
    free(text);
    if (rc < 0)
        ferry_policy_version_clear(out);
    return rc;
}

static void history_append(ferry_store *s, const char *model, const char *record)
{
    char k[FR_KEY_MAX];
    (void)fr_key_policy_history(k, sizeof k, model);
    for (int attempt = 0; attempt < 16; attempt++) {
        ferry_kv_value v = {0};
        uint64_t expected = 0;
        int rc = ferry_kv_get(s, k, &v, NULL);
        if (rc < 0 && rc != FERRY_ENOENT)
            return;
        const char *old = rc == 0 ? v.val : "";
        size_t oldn = rc == 0 ? v.len : 0;
        if (rc == 0)
            expected = v.mod_rev;
        /* drop the oldest lines beyond HISTORY_MAX - 1 */
        size_t lines = 0;
        for (size_t i = 0; i < oldn; i++)
            lines += old[i] == '\n';
        size_t skip = 0;
        while (lines >= HISTORY_MAX && skip < oldn) {
            const char *nl = memchr(old + skip, '\n', oldn - skip);
            if (!nl)
                break;
            skip = (size_t)(nl - old) + 1;
            lines--;
        }
        size_t rn = strlen(record), n = oldn - skip + rn + 1;
        char *nv = malloc(n);
        if (!nv) {
            ferry_store_free(v.val);
            return;
        }
        memcpy(nv, old + skip, oldn - skip);
        memcpy(nv + oldn - skip, record, rn);
        nv[n - 1] = '\n';
        ferry_store_free(v.val);
        rc = ferry_kv_cas(s, k, expected, nv, n, NULL, NULL);
        free(nv);
        if (rc != FERRY_ESTATE)
            return;
    }
}

int ferry_policy_publish(ferry_store *s, const ferry_publisher_config *cfg,
                         const ferry_policy_version *pv, const ferry_weight_tensor *tensors,
                         size_t n, ferry_publish_stats *st, ferry_error *err)
{
    if (!s || !cfg || !pv || pv->version == 0 || !model_ok(cfg->model))
        return fr_fail(err, FERRY_EINVAL, "policy_publish: bad arguments");
    if (pv->parent >= pv->version)
        return fr_fail(err, FERRY_EINVAL, "policy_publish: parent version %" PRIu64
                       " is not older than version %" PRIu64, pv->parent, pv->version);
    ferry_policy_version r = *pv;
    r.weight_generation = pv->version;
    snprintf(r.model, sizeof r.model, "%s", cfg->model);
    char *json = NULL;
    int rc = ferry_policy_version_to_json(&r, &json);
    if (rc < 0)
        return fr_fail(err, rc, "policy_publish: the record of version %" PRIu64
                       " cannot be encoded (metadata must be a JSON object)", pv->version);
    rc = fr_rl_publish(s, cfg, pv->version, json, tensors, n, st, err);
    if (rc == 0 && cfg->rank == 0)
        history_append(s, cfg->model, json);
    free(json);
    return rc;
}

int ferry_policy_current(ferry_store *s, const char *model, ferry_policy_version *out,
                         ferry_error *err)
{
    if (!s || !model_ok(model) || !out)
        return fr_fail(err, FERRY_EINVAL, "policy_current: bad arguments");
    memset(out, 0, sizeof *out);
    char k[FR_KEY_MAX];
    active_key(k, sizeof k, model);
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v, err);
    if (rc == FERRY_ENOENT)
        return fr_fail(err, rc, "policy: no version of %s was announced", model);
    if (rc < 0)
        return fr_fail(err, rc, "policy: cannot read the current version of %s: %s", model,
                       fr_why(err, rc));
    rc = parse_active(model, v.val, v.len, out, err);
    ferry_store_free(v.val);
    if (rc < 0)
        return rc;
    /* Not current when its weights are gone (a node restarted or died). */
    ferry_weights_status ws = { .generation = out->version };
    rc = fr_rl_check_whole(s, model, &ws, err);
    if (rc < 0)
        ferry_policy_version_clear(out);
    return rc;
}

int ferry_policy_history(ferry_store *s, const char *model, ferry_policy_version *out,
                         size_t cap, size_t *n, ferry_error *err)
{
    if (!s || !model_ok(model) || !n || (cap && !out))
        return fr_fail(err, FERRY_EINVAL, "policy_history: bad arguments");
    *n = 0;
    char k[FR_KEY_MAX];
    (void)fr_key_policy_history(k, sizeof k, model);
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, k, &v, err);
    if (rc == FERRY_ENOENT)
        return 0;
    if (rc < 0)
        return fr_fail(err, rc, "policy: cannot read the history of %s: %s", model,
                       fr_why(err, rc));
    const char *p = v.val, *end = p + v.len;
    while (rc == 0 && p < end && *n < cap) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        rc = ferry_policy_version_from_json(p, len, &out[*n], err);
        if (rc == 0)
            (*n)++;
        p += len + 1;
    }
    ferry_store_free(v.val);
    if (rc < 0) {
        for (size_t i = 0; i < *n; i++)
            ferry_policy_version_clear(&out[i]);
        *n = 0;
    }
    return rc;
}

/* ---- watch ------------------------------------------------------------------------------ */

struct ferry_policy_watch {
    ferry_store *s;
    ferry_watch *w;
    char model[128];
    char key[FR_KEY_MAX];
    uint64_t last;              /* newest version returned */
    ferry_policy_version first; /* the current version at open, returned first */
    bool have_first;
};

int ferry_policy_watch_open(ferry_store *s, const char *model, ferry_policy_watch **out,
                            ferry_error *err)
{
    if (!s || !model_ok(model) || !out)
        return fr_fail(err, FERRY_EINVAL, "policy watch: no store or result, or the model name is "
                       "empty, too long or holds '/'");
    ferry_policy_watch *w = calloc(1, sizeof *w);
    if (!w)
        return fr_fail(err, FERRY_ENOMEM, "policy watch: out of memory");
    w->s = s;
    snprintf(w->model, sizeof w->model, "%s", model);
    active_key(w->key, sizeof w->key, model);
    ferry_kv_value v = {0};
    uint64_t from = 0;
    int rc = ferry_kv_get(s, w->key, &v, err);
    if (rc == 0) {
        from = v.mod_rev + 1;
        if (parse_active(model, v.val, v.len, &w->first, NULL) == 0)
            w->have_first = true;
        ferry_store_free(v.val);
        /* A version whose weights are gone is not current: not returned
         * first (the next announcement is). */
        ferry_weights_status ws = { .generation = w->first.version };
        if (w->have_first && fr_rl_check_whole(s, model, &ws, NULL) == FERRY_ELOST) {
            ferry_policy_version_clear(&w->first);
            w->have_first = false;
        }
    } else if (rc != FERRY_ENOENT) {
        free(w);
        return fr_fail(err, rc, "policy watch of %s: %s", model, fr_why(err, rc));
    }
    /* from 0 when absent: every change from now on */
    rc = ferry_kv_watch(s, w->key, from, &w->w, err);
    if (rc < 0) {
        ferry_policy_version_clear(&w->first);
        free(w);
        return fr_fail(err, rc, "policy watch of %s: %s", model, fr_why(err, rc));
    }
    if (from == 0 && ferry_kv_get(s, w->key, &v, NULL) == 0) {
        /* announced between the read and the watch: take it now (the
         * watch's copy of it is skipped as not newer) */
        if (parse_active(model, v.val, v.len, &w->first, NULL) == 0)
            w->have_first = true;
        ferry_store_free(v.val);
    }
    *out = w;
    return 0;
}

int ferry_policy_watch_next(ferry_policy_watch *w, int timeout_ms, ferry_policy_version *out,
                            ferry_error *err)
{
    if (!w || !out)
        return FERRY_EINVAL;
    memset(out, 0, sizeof *out);
    if (w->have_first) {
        w->have_first = false;
        *out = w->first;
        memset(&w->first, 0, sizeof w->first);
        w->last = out->version;
        return 0;
    }
    uint64_t dl = fr_deadline_ns(timeout_ms);
    for (;;) {
        uint64_t now = fr_now_ns();
        int left = timeout_ms < 0 ? -1 : now >= dl ? 0 : (int)((dl - now) / 1000000u);
        ferry_kv_event ev;
        int rc = ferry_watch_next(w->w, left, &ev, NULL);
        if (rc < 0)
            return rc == FERRY_ETIMEDOUT ? rc
                                         : fr_fail(err, rc, "policy watch of %s: %s", w->model,
                                                   ferry_strerror(rc));
        if (ev.deleted || strcmp(ev.key, w->key) != 0)
            continue;
        ferry_policy_version pv;
        if (parse_active(w->model, ev.val, ev.len, &pv, err) < 0)
            continue;   /* not a record: ignore, keep watching */
        if (pv.version <= w->last) {
            ferry_policy_version_clear(&pv);
            continue;
        }
        w->last = pv.version;
        *out = pv;
        return 0;
    }
}

void ferry_policy_watch_close(ferry_policy_watch *w)
{
    if (!w)
        return;
    ferry_watch_close(w->w);
    ferry_policy_version_clear(&w->first);
    free(w);
}
