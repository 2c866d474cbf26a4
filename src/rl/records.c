/* Rollout/update records as JSON (samples.h): RolloutSession,
 * UpdateSession, PolicyVersion. Encoding is canonical (sorted keys,
 * compact); decoding checks every field's presence, type and length. */
#include <jansson.h>
#include <stddef.h>
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

/* ---- the three records' fields ------------------------------------------------------- */

/* A record is a list of fields at offsets in its struct; one encoder and one
 * decoder walk the list. Decoding goes in list order, so the first bad
 * field named in an error is the first in this order. Every record ends
 * with its optional "metadata" object. */
enum fkind { F_STR, F_U64, F_LIST };
typedef struct field {
    const char *k;
    enum fkind kind;
    size_t off;    /* the member */
    size_t aux;    /* F_STR: the array's size; F_LIST: the count member's offset */
} field;

#define STR(T, m, k) { k, F_STR, offsetof(T, m), sizeof(((T *)0)->m) }
#define U64(T, m, k) { k, F_U64, offsetof(T, m), 0 }
#define LIST(T, m, n, k) { k, F_LIST, offsetof(T, m), offsetof(T, n) }

static const field rollout_fields[] = {
    STR(ferry_rollout_session, session_id, "session_id"),
    STR(ferry_rollout_session, episode_id, "episode_id"),
    STR(ferry_rollout_session, request_id, "request_id"),
    STR(ferry_rollout_session, prompt_ref, "prompt_ref"),
    STR(ferry_rollout_session, output_ref, "output_ref"),
    STR(ferry_rollout_session, logprob_ref, "logprob_ref"),
    STR(ferry_rollout_session, reward_ref, "reward_ref"),
    STR(ferry_rollout_session, kv_ref, "kv_ref"),
    STR(ferry_rollout_session, status, "status"),
    U64(ferry_rollout_session, policy_version, "policy_version"),
};
static const field update_fields[] = {
    STR(ferry_update_session, update_id, "update_id"),
    STR(ferry_update_session, status, "status"),
    U64(ferry_update_session, input_version, "input_policy_version"),
    U64(ferry_update_session, output_version, "output_policy_version"),
    LIST(ferry_update_session, trajectory_refs, ntrajectory, "trajectory_refs"),
    LIST(ferry_update_session, reward_refs, nreward, "reward_refs"),
    LIST(ferry_update_session, logprob_refs, nlogprob, "logprob_refs"),
};
static const field policy_fields[] = {
    STR(ferry_policy_version, model, "model"),
    U64(ferry_policy_version, version, "version_id"),
    U64(ferry_policy_version, parent, "parent_version_id"),
    U64(ferry_policy_version, created_at_step, "created_at_step"),
    U64(ferry_policy_version, weight_generation, "weight_generation"),
};
#define NF(a) (sizeof(a) / sizeof((a)[0]))

#define AT(rec, off, T) ((T *)(void *)((char *)(rec) + (off)))

static int encode(const void *rec, const field *f, size_t nf, const char *meta, char **json)
{
    if (!rec || !json)
        return FERRY_EINVAL;
    json_t *o = json_object();
    if (!o)
        return FERRY_ENOMEM;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < nf; i++) {
        const void *m = (const char *)rec + f[i].off;
        if (f[i].kind == F_STR)
            rc = set_str(o, f[i].k, m);
        else if (f[i].kind == F_U64)
            rc = set_u64(o, f[i].k, *(const uint64_t *)m);
        else
            rc = set_list(o, f[i].k, *(char *const *const *)m,
                          *(const size_t *)(const void *)((const char *)rec + f[i].aux));
    }
    if (rc == 0)
        rc = set_meta(o, meta);
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
    return encode(r, rollout_fields, NF(rollout_fields), r ? r->metadata : NULL, json);
}

int ferry_update_session_to_json(const ferry_update_session *r, char **json)
{
    return encode(r, update_fields, NF(update_fields), r ? r->metadata : NULL, json);
}

int ferry_policy_version_to_json(const ferry_policy_version *r, char **json)
{
    return encode(r, policy_fields, NF(policy_fields), r ? r->metadata : NULL, json);
}

/* ---- decoding ------------------------------------------------------------------------- */

static int get_str(const json_t *o, const char *k, char *dst, size_t cap, ferry_error *err)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_string(v))
        return fr_fail(err, FERRY_EPROTO, "record: field '%s' is %s", k,
                       v ? "not a string" : "missing");
    size_t n = json_string_length(v);
    const char *p = json_string_value(v);
    if (n >= cap || strlen(p) != n || !clean(p))
        return fr_fail(err, FERRY_EPROTO,
                       "record: field '%s' is longer than %zu bytes or holds a control "
                       "character", k, cap - 1);
    memcpy(dst, p, n + 1);
    return 0;
}

static int get_u64(const json_t *o, const char *k, uint64_t *out, ferry_error *err)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return fr_fail(err, FERRY_EPROTO, "record: field '%s' is %s", k,
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
        return fr_fail(err, FERRY_EPROTO, "record: 'metadata' is not an object");
    *out = fr_json_dump_canonical(v);
    return *out ? 0 : fr_fail(err, FERRY_ENOMEM, "record: out of memory");
}

static int get_list(const json_t *o, const char *k, char ***out, size_t *n, ferry_error *err)
{
    const json_t *a = json_object_get(o, k);
    *out = NULL;
    *n = 0;
    if (!json_is_array(a))
        return fr_fail(err, FERRY_EPROTO, "record: field '%s' is %s", k,
                       a ? "not an array" : "missing");
    size_t m = json_array_size(a);
    if (m == 0)
        return 0;
    char **v = calloc(m, sizeof *v);
    if (!v)
        return fr_fail(err, FERRY_ENOMEM, "record: out of memory");
    *out = v;
    for (size_t i = 0; i < m; i++) {
        const json_t *e = json_array_get(a, i);
        const char *p = json_string_value(e);
        if (!p || strlen(p) != json_string_length(e) || !clean(p) ||
            strlen(p) > FERRY_RECORD_REF_MAX)
            return fr_fail(err, FERRY_EPROTO, "record: %s[%zu] is not a reference", k, i);
        if (!(v[i] = strdup(p)))
            return fr_fail(err, FERRY_ENOMEM, "record: out of memory");
        *n = i + 1;
    }
    return 0;
}

static int parse(const char *json, size_t len, json_t **o, ferry_error *err)
{
    char why[256];
    if (!json)
        return fr_fail(err, FERRY_EINVAL, "record: no text");
    if (fr_json_parse(json, len, o, why, sizeof why) < 0)
        return fr_fail(err, FERRY_EPROTO, "record: %s", why);
    if (!json_is_object(*o)) {
        json_decref(*o);
        *o = NULL;
        return fr_fail(err, FERRY_EPROTO, "record: not a JSON object");
    }
    return 0;
}

/* Decode the fields of f and the metadata into rec (zeroed first); on an
 * error the caller clears rec. */
static int decode(const char *json, size_t len, void *rec, size_t size, const field *f,
                  size_t nf, char **meta, ferry_error *err)
{
    memset(rec, 0, size);
    json_t *o = NULL;
    int rc = parse(json, len, &o, err);
    for (size_t i = 0; rc == 0 && i < nf; i++) {
        if (f[i].kind == F_STR)
            rc = get_str(o, f[i].k, AT(rec, f[i].off, char), f[i].aux, err);
        else if (f[i].kind == F_U64)
            rc = get_u64(o, f[i].k, AT(rec, f[i].off, uint64_t), err);
        else
            rc = get_list(o, f[i].k, AT(rec, f[i].off, char **), AT(rec, f[i].aux, size_t),
                          err);
    }
    if (rc == 0)
        rc = get_meta(o, meta, err);
    json_decref(o);
    return rc;
}

int ferry_rollout_session_from_json(const char *json, size_t len, ferry_rollout_session *out,
                                    ferry_error *err)
{
    if (!out)
        return FERRY_EINVAL;
    int rc = decode(json, len, out, sizeof *out, rollout_fields, NF(rollout_fields),
                    &out->metadata, err);
    if (rc < 0)
        ferry_rollout_session_clear(out);
    return rc;
}

int ferry_update_session_from_json(const char *json, size_t len, ferry_update_session *out,
                                   ferry_error *err)
{
    if (!out)
        return FERRY_EINVAL;
    int rc = decode(json, len, out, sizeof *out, update_fields, NF(update_fields),
                    &out->metadata, err);
    if (rc < 0)
        ferry_update_session_clear(out);
    return rc;
}

int ferry_policy_version_from_json(const char *json, size_t len, ferry_policy_version *out,
                                   ferry_error *err)
{
    if (!out)
        return FERRY_EINVAL;
    int rc = decode(json, len, out, sizeof *out, policy_fields, NF(policy_fields),
                    &out->metadata, err);
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
