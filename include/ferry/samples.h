/* ferry rollout/update disaggregation (docs/samples.md): versioned records,
 * the policy registry, leased sample queues with staleness control, and the
 * KV-reuse gate.
 *
 * Every artifact carries the policy version that produced it. A policy
 * version is a weight generation: announcing version v is the one
 * compare-and-swap that announces generation v of the model's weights
 * (ferry_policy_publish). Nothing crosses a version boundary unless the
 * caller says how far (max_policy_lag), and every such decision is counted. */
#ifndef FERRY_SAMPLES_H
#define FERRY_SAMPLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"
#include "ferry/store.h"
#include "ferry/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_RECORD_ID_MAX 127     /* bytes of an id */
#define FERRY_RECORD_REF_MAX 383    /* bytes of a reference */

/* ---- records ---------------------------------------------------------------------- */

/* A rollout-side unit of generation. References are "store://KEY#MEMBER"
 * (a member of a structured object) or "" (none). metadata is the text of a
 * JSON object or NULL; it is owned by the record (ferry_record_clear frees
 * it). */
typedef struct ferry_rollout_session {
    char session_id[FERRY_RECORD_ID_MAX + 1];
    char episode_id[FERRY_RECORD_ID_MAX + 1];
    char request_id[FERRY_RECORD_ID_MAX + 1];
    uint64_t policy_version;
    char prompt_ref[FERRY_RECORD_REF_MAX + 1];
    char output_ref[FERRY_RECORD_REF_MAX + 1];     /* output token ids */
    char logprob_ref[FERRY_RECORD_REF_MAX + 1];
    char reward_ref[FERRY_RECORD_REF_MAX + 1];
    char kv_ref[FERRY_RECORD_REF_MAX + 1];         /* optional KV cache */
    char status[32];   /* "generating", "ready_for_update", "trained", "dropped", "recompute" */
    char *metadata;
} ferry_rollout_session;

/* An update-side training step. Ref lists are owned arrays of owned
 * strings. output_version 0: not produced yet. */
typedef struct ferry_update_session {
    char update_id[FERRY_RECORD_ID_MAX + 1];
    uint64_t input_version, output_version;
    char **trajectory_refs; size_t ntrajectory;
    char **reward_refs; size_t nreward;
    char **logprob_refs; size_t nlogprob;
    char status[32];   /* "running", "done", "failed" */
    char *metadata;
} ferry_update_session;

/* A policy version: version == the weight generation that carries it. */
typedef struct ferry_policy_version {
    uint64_t version;
    uint64_t parent;               /* 0: none */
    uint64_t created_at_step;
    uint64_t weight_generation;    /* == version once announced */
    char model[128];
    char *metadata;
} ferry_policy_version;

/* JSON text of a record (free()); FERRY_EINVAL for metadata that is not a
 * JSON object, an id holding a control character, FERRY_ENOMEM. */
FERRY_API int ferry_rollout_session_to_json(const ferry_rollout_session *r, char **json);
FERRY_API int ferry_update_session_to_json(const ferry_update_session *r, char **json);
FERRY_API int ferry_policy_version_to_json(const ferry_policy_version *r, char **json);
/* Parse; FERRY_EPROTO with a sentence in err for malformed text, a missing
 * or mistyped field, an over-long id or reference. out is cleared first. */
FERRY_API int ferry_rollout_session_from_json(const char *json, size_t len, ferry_rollout_session *out,
                                              ferry_error *err);
FERRY_API int ferry_update_session_from_json(const char *json, size_t len, ferry_update_session *out,
                                             ferry_error *err);
FERRY_API int ferry_policy_version_from_json(const char *json, size_t len, ferry_policy_version *out,
                                             ferry_error *err);
FERRY_API void ferry_rollout_session_clear(ferry_rollout_session *r);
FERRY_API void ferry_update_session_clear(ferry_update_session *r);
FERRY_API void ferry_policy_version_clear(ferry_policy_version *r);

/* ---- version rules -------------------------------------------------------------------- */

enum ferry_version_verdict {
    FERRY_VERSION_ADMIT = 0,   /* input - max_lag <= sample <= input */
    FERRY_VERSION_STALE = 1,   /* older than input - max_lag */
    FERRY_VERSION_AHEAD = 2,   /* newer than the consumer's input version */
};
/* The lag rule: max_policy_lag 0 admits only sample_version == input_version. */
FERRY_API enum ferry_version_verdict ferry_policy_admit(uint64_t sample_version, uint64_t input_version,
                                                        uint32_t max_policy_lag);

/* ---- policy registry ---------------------------------------------------------------- */

/* Publish pv->version as weight generation pv->version (every trainer rank
 * calls it, as ferry_publish): the announcing compare-and-swap carries the
 * policy record, so the version and its weights become current together,
 * or neither does. The record then joins the model's history. */
FERRY_API int ferry_policy_publish(ferry_store *s, const ferry_publisher_config *cfg,
                                   const ferry_policy_version *pv, const ferry_weight_tensor *tensors,
                                   size_t n, ferry_publish_stats *st, ferry_error *err);
/* The current version of a model (FERRY_ENOENT when none was announced).
 * A generation announced by plain ferry_publish reads as a version without
 * parent or metadata. */
FERRY_API int ferry_policy_current(ferry_store *s, const char *model, ferry_policy_version *out,
                                   ferry_error *err);
/* Announced versions, oldest first (up to the last 1024), into out (cap
 * records; *n = count stored). Clear each record. */
FERRY_API int ferry_policy_history(ferry_store *s, const char *model, ferry_policy_version *out,
                                   size_t cap, size_t *n, ferry_error *err);

/* Learn of new versions through a watch on the announcing key (no polling).
 * next: the next version newer than any returned so far (the current one
 * first, if any); FERRY_ETIMEDOUT after timeout_ms (< 0: forever). Versions
 * announced in between are skipped: a rollout worker wants the newest. */
typedef struct ferry_policy_watch ferry_policy_watch;
FERRY_API int ferry_policy_watch_open(ferry_store *s, const char *model, ferry_policy_watch **out,
                                      ferry_error *err);
FERRY_API int ferry_policy_watch_next(ferry_policy_watch *w, int timeout_ms, ferry_policy_version *out,
                                      ferry_error *err);
FERRY_API void ferry_policy_watch_close(ferry_policy_watch *w);

/* ---- sample queues -------------------------------------------------------------------- */

/* What a rejected (stale) sample becomes. */
enum ferry_stale_policy {
    FERRY_STALE_DROP = 0,        /* acked and its payload removed, counted "dropped" */
    FERRY_STALE_RECOMPUTE = 1,   /* handed back to the rollout side ("<queue>.recompute") */
};

typedef struct ferry_sample_queue_config {
    char queue[128];             /* payloads live under "ferry/rl/<queue>/" */
    uint64_t bound;              /* > 0: set the queue's bound (records outstanding) */
    bool fail_when_full;         /* push: FERRY_EAGAIN at once instead of waiting for room */
    uint64_t push_timeout_ms;    /* waiting for room or for the master (default FERRY_DEFAULT_TIMEOUT_MS) */
    /* consumer side */
    uint64_t input_version;      /* the policy version being trained */
    uint32_t max_policy_lag;     /* 0: exact version only */
    enum ferry_stale_policy stale_policy;
    uint64_t lease_ms;           /* a popped sample's lease (default 30000) */
    char consumer[64];           /* names the consumer in claims ("" : host:pid) */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_sample_queue_config;

/* Every field of *cfg to its default (push_timeout_ms
 * FERRY_DEFAULT_TIMEOUT_MS, lease_ms 30000, the rest empty or 0). A zeroed
 * config is taken the same way: a 0 push_timeout_ms or lease_ms is its
 * default. */
FERRY_API int ferry_sample_queue_config_init(ferry_sample_queue_config *cfg);

/* The payload of one sample, stored as one structured object with members
 * "prompt" (i32[prompt_len], omitted when 0), "tokens" (i32[ntokens]),
 * "logprobs" (f32[ntokens]) and "rewards" (f32[nrewards]). */
typedef struct ferry_sample_data {
    const int32_t *prompt; uint64_t prompt_len;
    const int32_t *tokens; uint64_t ntokens;
    const float *logprobs;
    const float *rewards; uint64_t nrewards;
} ferry_sample_data;

/* A popped sample. */
typedef struct ferry_sample {
    uint64_t id; uint32_t token;          /* the queue record and its delivery */
    ferry_rollout_session session;
    uint64_t uid;                         /* the sample's identity across retried pushes */
    uint64_t pushed_at_ms;                /* producer's wall clock at push */
    uint64_t popped_at_ms;
    uint64_t prompt_len, ntokens, nrewards;
    char payload[FERRY_RECORD_REF_MAX + 1];   /* the structured object's key ("" for recompute) */
} ferry_sample;

typedef struct ferry_sample_stats {
    /* producer */
    uint64_t pushed, push_waits, push_full, push_retries;
    /* consumer */
    uint64_t popped, admitted, stale, dropped, recompute, ahead, redelivered, duplicates;
    uint64_t acked, ack_stale;
    /* rollout side of recompute */
    uint64_t recompute_popped;
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_sample_stats;

typedef struct ferry_sample_queue ferry_sample_queue;
FERRY_API int ferry_sample_queue_open(ferry_store *s, const ferry_sample_queue_config *cfg,
                                      ferry_sample_queue **out, ferry_error *err);
FERRY_API void ferry_sample_queue_close(ferry_sample_queue *q);
/* Change the consumer's input version (after an optimizer step). */
FERRY_API void ferry_sample_queue_set_version(ferry_sample_queue *q, uint64_t input_version);
/* A queue handle is for one thread at a time; stats read from another
 * thread while it works are a snapshot that may be a step behind. */
FERRY_API void ferry_sample_queue_stats(const ferry_sample_queue *q, ferry_sample_stats *out);

/* Store the payload and push the record (rs's refs are filled in and its
 * status set to "ready_for_update"). A full bounded queue makes the call
 * wait for room up to push_timeout_ms (FERRY_ETIMEDOUT), or return
 * FERRY_EAGAIN at once with fail_when_full; either way nothing is left
 * behind. A master restart in the middle is retried; a retried push that
 * had landed is caught by the consumers (the sample's uid), so a sample is
 * trained at most once. */
FERRY_API int ferry_sample_push(ferry_sample_queue *q, ferry_rollout_session *rs,
                                const ferry_sample_data *d, uint64_t *id, ferry_error *err);
/* Lease up to max records and apply the version rule: admitted samples go
 * to out (*n of them, possibly 0); stale ones are dropped or sent for
 * recompute by policy, ahead ones are handed back, duplicates of a sample
 * already claimed by another record are acked away; each counted. Clear
 * every returned sample with ferry_sample_clear. */
FERRY_API int ferry_sample_pop(ferry_sample_queue *q, uint32_t max, ferry_sample *out, size_t *n,
                               ferry_error *err);
/* Read a popped sample's payload members (any pointer may be NULL; sizes
 * are the sample's counts). FERRY_ECORRUPT if the object disagrees. */
FERRY_API int ferry_sample_read(ferry_sample_queue *q, const ferry_sample *smp, int32_t *prompt,
                                int32_t *tokens, float *logprobs, float *rewards, ferry_error *err);
/* After the optimizer step: ack each sample (it is now trained, exactly
 * once) and remove its payload. ok[i] (may be NULL) tells which acks held;
 * a sample whose lease lapsed and was delivered again is not acked
 * (counted ack_stale) and FERRY_ESTALE is returned after the rest. */
FERRY_API int ferry_sample_ack(ferry_sample_queue *q, const ferry_sample *smp, size_t n, bool *ok,
                               ferry_error *err);
/* Give samples back for someone else now (nack). */
FERRY_API int ferry_sample_release(ferry_sample_queue *q, const ferry_sample *smp, size_t n,
                                   ferry_error *err);
/* Rollout side: lease up to max samples the consumers sent back for
 * recompute (sessions only; payload ""). After pushing the recomputed
 * sample, ack these with ferry_sample_ack. */
FERRY_API int ferry_sample_pop_recompute(ferry_sample_queue *q, uint32_t max, ferry_sample *out,
                                         size_t *n, ferry_error *err);
FERRY_API void ferry_sample_clear(ferry_sample *smp);

/* ---- auditing a queue: its claim log and payloads --------------------------------------
 * For tools that check exactly-once training from outside the consumers
 * (ferry demo rl; docs/samples.md, "Auditing a queue"), without knowing
 * how the queue lays out its keys. */

/* One claim write of the log: the consumer's view of a sample, as in
 * "Ending a record". */
typedef struct ferry_sample_claim {
    uint64_t uid;        /* the sample */
    uint64_t id;         /* the queue record whose delivery holds it */
    uint32_t token;      /* that delivery */
    bool done;           /* the commit of an ack (or of a stale sample's rejection) */
    bool deleted;        /* the claim was dropped (uid only) */
    bool mark;           /* no claim: the mark of ferry_sample_claims_mark (nothing else set) */
} ferry_sample_claim;

typedef struct ferry_sample_claims ferry_sample_claims;
/* Watch queue's claim log: every claim written from now on, in the order
 * the master applied them. Close with ferry_sample_claims_close (NULL ok). */
FERRY_API int ferry_sample_claims_open(ferry_store *s, const char *queue, ferry_sample_claims **out,
                                       ferry_error *err);
/* The next claim written, waiting up to timeout_ms (<0: forever): 0,
 * FERRY_ETIMEDOUT, FERRY_EPROTO for a write that is no claim this
 * version of ferry knows (out->uid set when it is one; the log goes on),
 * or the store's error. */
FERRY_API int ferry_sample_claims_next(ferry_sample_claims *c, int timeout_ms, ferry_sample_claim *out,
                                       ferry_error *err);
/* Put a mark into the log: a reader of c meets it (out->mark) after every
 * claim written before this call. */
FERRY_API int ferry_sample_claims_mark(ferry_sample_claims *c, ferry_error *err);
FERRY_API void ferry_sample_claims_close(ferry_sample_claims *c);
/* The store keys of queue's payload objects, at most max, ascending: an
 * acked sample's is gone, so what a drained queue still lists was left by
 * a push cut short. *keys is one allocation (free with ferry_store_free);
 * *more (may be NULL): there are further keys. */
FERRY_API int ferry_sample_payloads(ferry_store *s, const char *queue, size_t max, char ***keys, size_t *n,
                                    bool *more, ferry_error *err);

/* ---- the KV-reuse gate -------------------------------------------------------------- */

typedef struct ferry_kvcache_stats {
    uint64_t stored, hits, refused, retired;
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_kvcache_stats;

/* KV cache objects live under their policy version:
 * "ferry/kv/<ns>/<version, 20 digits>/<name>". put stores one (ref gets
 * "store://<key>"); get reads it only when the reference's version equals
 * active_version — otherwise FERRY_ESTALE, nothing read, counted refused;
 * retire removes every KV object of a version by prefix (objects of other
 * versions and every other key stay); *removed counts them. stats may be
 * NULL. */
FERRY_API int ferry_kvcache_put(ferry_store *s, const char *ns, uint64_t version, const char *name,
                                const void *data, size_t len, char *ref, size_t refcap,
                                ferry_kvcache_stats *st, ferry_error *err);
FERRY_API int ferry_kvcache_get(ferry_store *s, const char *ref, uint64_t active_version, void *dst,
                                size_t cap, size_t *len, ferry_kvcache_stats *st, ferry_error *err);
FERRY_API int ferry_kvcache_retire(ferry_store *s, const char *ns, uint64_t version, uint64_t *removed,
                                   ferry_kvcache_stats *st, ferry_error *err);
/* The version a KV reference was made under (FERRY_EINVAL if not one). */
FERRY_API int ferry_kvcache_ref_version(const char *ref, uint64_t *version);

#ifdef __cplusplus
}
#endif
#endif
