/* Rollout/update records as JSON (samples.h): RolloutSession,
 * UpdateSession, PolicyVersion. Encoding is canonical (sorted keys,
 * compact); decoding checks every field's presence, type and length. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/samples.h"
#include "rl/rl_int.h"

/* ---- encoding ------------------------------------------------------------------------- */

static bool clean(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20)
            return false;
    return true;
}

static int set_str(json_t *o, const char *k, const char *v)
{
    if (!clean(v))
        return FERRY_EINVAL;
    json_t *s = json_string(v);   /* NULL for invalid UTF-8 */
    if (!s)
        return FERRY_EINVAL;
    return json_object_set_new(o, k, s) == 0 ? 0 : FERRY_ENOMEM;
}

static int set_u64(json_t *o, const char *k, uint64_t v)
{
    if (v > (uint64_t)INT64_MAX)
        return FERRY_EINVAL;
    return json_object_set_new(o, k, json_integer((json_int_t)v)) == 0 ? 0 : FERRY_ENOMEM;
}

static int set_meta(json_t *o, const char *meta)
{
    json_t *m;
    if (!meta || !*meta) {
        m = json_object();
    } else {
        m = json_loads(meta, JSON_REJECT_DUPLICATES, NULL);
        if (m && !json_is_object(m)) {
            json_decref(m);
            m = NULL;
        }
        if (!m)
            return FERRY_EINVAL;
    }
    return json_object_set_new(o, "metadata", m) == 0 ? 0 : FERRY_ENOMEM;
}

static int set_list(json_t *o, const char *k, char *const *v, size_t n)
{
    json_t *a = json_array();
    if (!a)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!v || !v[i] || !clean(v[i]) || strlen(v[i]) > FERRY_RECORD_REF_MAX) {
            json_decref(a);
            return FERRY_EINVAL;
        }
        json_t *s = json_string(v[i]);
        if (!s || json_array_append_new(a, s) != 0) {
            json_decref(a);
            return s ? FERRY_ENOMEM : FERRY_EINVAL;
        }
    }
    return json_object_set_new(o, k, a) == 0 ? 0 : FERRY_ENOMEM;
}

static int finish(json_t *o, int rc, char **json)
{
    if (rc == 0) {
        *json = fr_json_dump_canonical(o);
        if (!*json)
            rc = FERRY_ENOMEM;
    }
    json_decref(o);
    return rc;
}

int ferry_rollout_session_to_json(const ferry_rollout_session *r, char **json)
{
    if (!r || !json)
        return FERRY_EINVAL;
    json_t *o = json_object();
    if (!o)
        return FERRY_ENOMEM;
    int rc = 0;
    const struct { const char *k, *v; } s[] = {
        { "session_id", r->session_id }, { "episode_id", r->episode_id },
        { "request_id", r->request_id }, { "prompt_ref", r->prompt_ref },
        { "output_ref", r->output_ref }, { "logprob_ref", r->logprob_ref },
        { "reward_ref", r->reward_ref }, { "kv_ref", r->kv_ref }, { "status", r->status },
    };
    for (size_t i = 0; rc == 0 && i < sizeof s / sizeof s[0]; i++)
        rc = set_str(o, s[i].k, s[i].v);
    if (rc == 0)
        rc = set_u64(o, "policy_version", r->policy_version);
    if (rc == 0)
        rc = set_meta(o, r->metadata);
    return finish(o, rc, json);
}

int ferry_update_session_to_json(const ferry_update_session *r, char **json)
{
    if (!r || !json)
        return FERRY_EINVAL;
    json_t *o = json_object();
    if (!o)
        return FERRY_ENOMEM;
    int rc = set_str(o, "update_id", r->update_id);
    if (rc == 0)
        rc = set_str(o, "status", r->status);
    if (rc == 0)
        rc = set_u64(o, "input_policy_version", r->input_version);
    if (rc == 0)
        rc = set_u64(o, "output_policy_version", r->output_version);
    if (rc == 0)
        rc = set_list(o, "trajectory_refs", r->trajectory_refs, r->ntrajectory);
    if (rc == 0)
        rc = set_list(o, "reward_refs", r->reward_refs, r->nreward);
    if (rc == 0)
        rc = set_list(o, "logprob_refs", r->logprob_refs, r->nlogprob);
    if (rc == 0)
        rc = set_meta(o, r->metadata);
    return finish(o, rc, json);
}

int ferry_policy_version_to_json(const ferry_policy_version *r, char **json)
{
    if (!r || !json)
        return FERRY_EINVAL;
    json_t *o = json_object();
    if (!o)
        return FERRY_ENOMEM;
    int rc = set_str(o, "model", r->model);
    if (rc == 0)
        rc = set_u64(o, "version_id", r->version);
    if (rc == 0)
        rc = set_u64(o, "parent_version_id", r->parent);
    if (rc == 0)
        rc = set_u64(o, "created_at_step", r->created_at_step);
    if (rc == 0)
        rc = set_u64(o, "weight_generation", r->weight_generation);
    if (rc == 0)
        rc = set_meta(o, r->metadata);
    return finish(o, rc, json);
}

/* ---- decoding ------------------------------------------------------------------------- */

static int get_str(const json_t *o, const char *k, char *dst, size_t cap, ferry_error *err)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_string(v))
        return fr_rl_fail(err, FERRY_EPROTO, "record: field '%s' is %s", k,
                          v ? "not a string" : "missing");
    size_t n = json_string_length(v);
    const char *p = json_string_value(v);
    if (n >= cap || strlen(p) != n || !clean(p))
        return fr_rl_fail(err, FERRY_EPROTO,
                          "record: field '%s' is longer than %zu bytes or holds a control "
                          "character", k, cap - 1);
    memcpy(dst, p, n + 1);
    return 0;
}

static int get_u64(const json_t *o, const char *k, uint64_t *out, ferry_error *err)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return fr_rl_fail(err, FERRY_EPROTO, "record: field '%s' is %s", k,
                          v ? "not a non-negative integer" : "missing");
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int get_meta(const json_t *o, char **out, ferry_error *err)
{
    const json_t *v = json_object_get(o, "metadata");
    *out = NULL;
    if (!v)
        return 0;
    if (!json_is_object(v))
        return fr_rl_fail(err, FERRY_EPROTO, "record: 'metadata' is not an object");
    *out = fr_json_dump_canonical(v);
    return *out ? 0 : fr_rl_fail(err, FERRY_ENOMEM, "record: out of memory");
}

static int get_list(const json_t *o, const char *k, char ***out, size_t *n, ferry_error *err)
{
    const json_t *a = json_object_get(o, k);
    *out = NULL;
    *n = 0;
    if (!json_is_array(a))
        return fr_rl_fail(err, FERRY_EPROTO, "record: field '%s' is %s", k,
                          a ? "not an array" : "missing");
    size_t m = json_array_size(a);
    if (m == 0)
        return 0;
    char **v = calloc(m, sizeof *v);
    if (!v)
        return fr_rl_fail(err, FERRY_ENOMEM, "record: out of memory");
    *out = v;
    for (size_t i = 0; i < m; i++) {
        const json_t *e = json_array_get(a, i);
        const char *p = json_string_value(e);
        if (!p || strlen(p) != json_string_length(e) || !clean(p) ||
            strlen(p) > FERRY_RECORD_REF_MAX)
            return fr_rl_fail(err, FERRY_EPROTO, "record: %s[%zu] is not a reference", k, i);
        if (!(v[i] = strdup(p)))
            return fr_rl_fail(err, FERRY_ENOMEM, "record: out of memory");
        *n = i + 1;
    }
    return 0;
}

static int parse(const char *json, size_t len, json_t **o, ferry_error *err)
{
    char why[256];
    if (!json)
        return fr_rl_fail(err, FERRY_EINVAL, "record: no text");
    if (fr_json_parse(json, len, o, why, sizeof why) < 0)
        return fr_rl_fail(err, FERRY_EPROTO, "record: %s", why);
    if (!json_is_object(*o)) {
        json_decref(*o);
        *o = NULL;
        return fr_rl_fail(err, FERRY_EPROTO, "record: not a JSON object");
    }
    return 0;
}

int ferry_rollout_session_from_json(const char *json, size_t len, ferry_rollout_session *out,
                                    ferry_error *err)
{
    if (!out)
        return FERRY_EINVAL;
    memset(out, 0, sizeof *out);
    json_t *o = NULL;
    int rc = parse(json, len, &o, err);
    const struct { const char *k; char *dst; size_t cap; } s[] = {
        { "session_id", out->session_id, sizeof out->session_id },
        { "episode_id", out->episode_id, sizeof out->episode_id },
        { "request_id", out->request_id, sizeof out->request_id },
        { "prompt_ref", out->prompt_ref, sizeof out->prompt_ref },
        { "output_ref", out->output_ref, sizeof out->output_ref },
        { "logprob_ref", out->logprob_ref, sizeof out->logprob_ref },
        { "reward_ref", out->reward_ref, sizeof out->reward_ref },
        { "kv_ref", out->kv_ref, sizeof out->kv_ref },
        { "status", out->status, sizeof out->status },
    };
    for (size_t i = 0; rc == 0 && i < sizeof s / sizeof s[0]; i++)
        rc = get_str(o, s[i].k, s[i].dst, s[i].cap, err);
    if (rc == 0)
        rc = get_u64(o, "policy_version", &out->policy_version, err);
    if (rc == 0)
        rc = get_meta(o, &out->metadata, err);
    json_decref(o);
    if (rc < 0)
        ferry_rollout_session_clear(out);
    return rc;
}

int ferry_update_session_from_json(const char *json, size_t len, ferry_update_session *out,
                                   ferry_error *err)
{
    if (!out)
        return FERRY_EINVAL;
    memset(out, 0, sizeof *out);
    json_t *o = NULL;
    int rc = parse(json, len, &o, err);
    if (rc == 0)
        rc = get_str(o, "update_id", out->update_id, sizeof out->update_id, err);
    if (rc == 0)
        rc = get_str(o, "status", out->status, sizeof out->status, err);
    if (rc == 0)
        rc = get_u64(o, "input_policy_version", &out->input_version, err);
    if (rc == 0)
        rc = get_u64(o, "output_policy_version", &out->output_version, err);
    if (rc == 0)
        rc = get_list(o, "trajectory_refs", &out->trajectory_refs, &out->ntrajectory, err);
    if (rc == 0)
        rc = get_list(o, "reward_refs", &out->reward_refs, &out->nreward, err);
    if (rc == 0)
        rc = get_list(o, "logprob_refs", &out->logprob_refs, &out->nlogprob, err);
    if (rc == 0)
        rc = get_meta(o, &out->metadata, err);
    json_decref(o);
    if (rc < 0)
        ferry_update_session_clear(out);
    return rc;
}

int ferry_policy_version_from_json(const char *json, size_t len, ferry_policy_version *out,
                                   ferry_error *err)
{
    if (!out)
        return FERRY_EINVAL;
    memset(out, 0, sizeof *out);
    json_t *o = NULL;
    int rc = parse(json, len, &o, err);
    if (rc == 0)
        rc = get_str(o, "model", out->model, sizeof out->model, err);
    if (rc == 0)
        rc = get_u64(o, "version_id", &out->version, err);
    if (rc == 0)
        rc = get_u64(o, "parent_version_id", &out->parent, err);
    if (rc == 0)
        rc = get_u64(o, "created_at_step", &out->created_at_step, err);
    if (rc == 0)
        rc = get_u64(o, "weight_generation", &out->weight_generation, err);
    if (rc == 0)
        rc = get_meta(o, &out->metadata, err);
    json_decref(o);
    if (rc < 0)
        ferry_policy_version_clear(out);
    return rc;
}

/* ---- clearing ------------------------------------------------------------------------- */

static void free_list(char ***v, size_t *n)
{
    for (size_t i = 0; *v && i < *n; i++)
        free((*v)[i]);
    free(*v);
    *v = NULL;
    *n = 0;
}

void ferry_rollout_session_clear(ferry_rollout_session *r)
{
    if (!r)
        return;
    free(r->metadata);
    r->metadata = NULL;
}

void ferry_update_session_clear(ferry_update_session *r)
{
    if (!r)
        return;
    free_list(&r->trajectory_refs, &r->ntrajectory);
    free_list(&r->reward_refs, &r->nreward);
    free_list(&r->logprob_refs, &r->nlogprob);
    free(r->metadata);
    r->metadata = NULL;
}

void ferry_policy_version_clear(ferry_policy_version *r)
{
    if (!r)
        return;
    free(r->metadata);
    r->metadata = NULL;
}

enum ferry_version_verdict ferry_policy_admit(uint64_t sample_version, uint64_t input_version,
                                              uint32_t max_policy_lag)
{
    if (sample_version > input_version)
        return FERRY_VERSION_AHEAD;
    return input_version - sample_version <= max_policy_lag ? FERRY_VERSION_ADMIT
                                                            : FERRY_VERSION_STALE;
}
