/* Sample queues (samples.h): rollout workers push samples (payload: one
 * structured object; record: the RolloutSession plus an envelope, on a
 * leased store queue); update workers pop under a lease, apply the version
 * rule, and ack after their optimizer step.
 *
 * Keys of queue Q:
 *   ferry/rl/Q/<version, 20 digits>/<uid, 16 hex>   the payload object
 *   ferry/rl/Q/claim/<uid>                          KV: the delivery training it
 *   queue "Q" (samples), queue "Q.recompute" (sent back to the rollout side)
 *
 * Exactly-once training: a push interrupted by a master restart is retried,
 * so one sample (uid) may sit in the queue as two records. The first record
 * popped claims the uid with a compare-and-swap; a later record of the same
 * uid finds the claim held by another record id and is acked away as a
 * duplicate, while a redelivery of the same record (a lapsed lease) takes
 * the claim over. An ack commits in the claim first, then removes the
 * payload, then acks the record (sampleq_claim.c). */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "ferry/samples.h"
#include "rl/keys.h"
#include "rl/rl_int.h"
#include "rl/sampleq_int.h"


int ferry_sample_queue_open(ferry_store *s, const ferry_sample_queue_config *cfg,
                            ferry_sample_queue **out, ferry_error *err)
{
    if (!s || !cfg || !out || !cfg->queue[0] || strchr(cfg->queue, '/') ||
        strlen(cfg->queue) >= sizeof cfg->queue)
        return fr_fail(err, FERRY_EINVAL, "sample queue: bad arguments (queue name without '/')");
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "sample queue: the config's reserved fields must be "
                       "zero (start from ferry_sample_queue_config_init)");
    ferry_sample_queue *q = calloc(1, sizeof *q);
    if (!q)
        return fr_fail(err, FERRY_ENOMEM, "sample queue: out of memory");
    q->s = s;
    q->cfg = *cfg;
    fr_rl_sample_queue_resolve(&q->cfg);
    if (!q->cfg.consumer[0]) {
        char host[40] = "";
        gethostname(host, sizeof host - 1);
        snprintf(q->cfg.consumer, sizeof q->cfg.consumer, "%s:%d", host, (int)getpid());
    }
    snprintf(q->recompute, sizeof q->recompute, "%s.recompute", cfg->queue);
    if (cfg->bound) {
        int rc = ferry_queue_config(s, cfg->queue, cfg->bound, err);
        if (rc < 0) {
            free(q);
            return fr_fail(err, rc, "sample queue %s: cannot set its bound: %s", cfg->queue,
                           fr_why(err, rc));
        }
    }
    *out = q;
    return 0;
}

void ferry_sample_queue_close(ferry_sample_queue *q)
{
    if (!q)
        return;
    /* A record whose payload is still leased by a reader stays leased; it is
     * delivered again once its lease lapses and finished by whoever pops it. */
    fr_sq_retry_deferred(q, true);
    free(q->claims);
    free(q->def);
    free(q);
}

void ferry_sample_queue_stats(const ferry_sample_queue *q, ferry_sample_stats *out)
{
    if (q && out)
        *out = q->st;
}

void ferry_sample_clear(ferry_sample *smp)
{
    if (smp)
        ferry_rollout_session_clear(&smp->session);
}

/* ---- push ------------------------------------------------------------------------------ */

static int envelope(const ferry_rollout_session *rs, uint64_t uid, uint64_t pushed,
                    const ferry_sample_data *d, const char *payload, char **out)
{
    char *sj = NULL;
    int rc = ferry_rollout_session_to_json(rs, &sj);
    if (rc < 0)
        return rc;
    json_t *o = json_object(), *sess = json_loads(sj, 0, NULL);
    free(sj);
    char uh[17];
    snprintf(uh, sizeof uh, "%016" PRIx64, uid);
    if (!o || !sess || json_object_set_new(o, "session", sess) ||
        json_object_set_new(o, "uid", json_string(uh)) ||
        json_object_set_new(o, "pushed_at_ms", json_integer((json_int_t)pushed)) ||
        json_object_set_new(o, "prompt_len", json_integer((json_int_t)(d ? d->prompt_len : 0))) ||
        json_object_set_new(o, "ntokens", json_integer((json_int_t)(d ? d->ntokens : 0))) ||
        json_object_set_new(o, "nrewards", json_integer((json_int_t)(d ? d->nrewards : 0))) ||
        json_object_set_new(o, "payload", json_string(payload))) {
        json_decref(o);
        return FERRY_ENOMEM;
    }
    *out = fr_json_dump_canonical(o);
    json_decref(o);
    return *out ? 0 : FERRY_ENOMEM;
}

static int decode_envelope(const void *data, size_t len, ferry_sample *out, ferry_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *o = NULL;
    char why[200];
    if (fr_json_parse(data, len, &o, why, sizeof why) < 0)
        return fr_fail(err, FERRY_EPROTO, "sample record: %s", why);
    int rc = 0;
    const json_t *sess = json_object_get(o, "session");
    const char *uh = json_string_value(json_object_get(o, "uid"));
    const char *pl = json_string_value(json_object_get(o, "payload"));
    char *sj = sess ? json_dumps(sess, JSON_COMPACT) : NULL;
    uint64_t v[4];
    const char *nk[4] = { "pushed_at_ms", "prompt_len", "ntokens", "nrewards" };
    for (int i = 0; i < 4 && rc == 0; i++) {
        const json_t *x = json_object_get(o, nk[i]);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            rc = fr_fail(err, FERRY_EPROTO, "sample record: '%s' missing or not a count", nk[i]);
        else
            v[i] = (uint64_t)json_integer_value(x);
    }
    char *e = NULL;
    if (rc == 0 && (!sj || !uh || strlen(uh) != 16 || !pl || strlen(pl) > FERRY_RECORD_REF_MAX))
        rc = fr_fail(err, FERRY_EPROTO, "sample record: session, uid or payload missing");
    if (rc == 0) {
        out->uid = strtoull(uh, &e, 16);
        if (*e)
            rc = fr_fail(err, FERRY_EPROTO, "sample record: bad uid");
    }
    if (rc == 0)
        rc = ferry_rollout_session_from_json(sj, strlen(sj), &out->session, err);
    if (rc == 0) {
        out->pushed_at_ms = v[0];
        out->prompt_len = v[1];
        out->ntokens = v[2];
        out->nrewards = v[3];
        snprintf(out->payload, sizeof out->payload, "%s", pl);
    }
    free(sj);
    json_decref(o);
    return rc;
}

/* Push one record, waiting for room or the master as configured. */
static int push_record(ferry_sample_queue *q, const char *queue, const char *rec, uint64_t *id,
                       ferry_error *err)
{
    uint64_t dl = fr_deadline_ns((int64_t)q->cfg.push_timeout_ms);
    unsigned wait = 2;
    bool waited = false;
    for (;;) {
        int rc = ferry_queue_push(q->s, queue, rec, strlen(rec), id, err);
        if (rc == 0)
            return 0;
        if (rc == FERRY_EAGAIN && q->cfg.fail_when_full) {
            q->st.push_full++;
            return fr_fail(err, rc, "sample queue %s is full (bound %" PRIu64 ")", queue,
                           q->cfg.bound);
        }
        if (rc != FERRY_EAGAIN && !fr_sq_retryable(rc))
            return fr_fail(err, rc, "sample queue %s: push failed: %s", queue,
                           fr_why(err, rc));
        if (rc == FERRY_EAGAIN && !waited) {
            q->st.push_waits++;
            waited = true;
        }
        if (rc != FERRY_EAGAIN)
            q->st.push_retries++;
        if (fr_now_ns() >= dl)
            return fr_fail(err, FERRY_ETIMEDOUT, "sample queue %s: %s for %" PRIu64 " ms",
                           queue, rc == FERRY_EAGAIN ? "no room" : "master unreachable",
                           q->cfg.push_timeout_ms);
        fr_sq_backoff(&wait);
    }
}

int ferry_sample_push(ferry_sample_queue *q, ferry_rollout_session *rs,
                      const ferry_sample_data *d, uint64_t *id, ferry_error *err)
{
    if (!q || !rs || !d || (d->ntokens && (!d->tokens || !d->logprobs)) ||
        (d->prompt_len && !d->prompt) || (d->nrewards && !d->rewards))
        return fr_fail(err, FERRY_EINVAL, "sample_push: bad arguments");
    uint64_t dl = fr_deadline_ns((int64_t)q->cfg.push_timeout_ms);
    unsigned wait = 2;
    ferry_replicate_config rc1 = { .replica_num = 1 };
    uint64_t uid;
    char key[FR_KEY_SAMPLE_MAX];
    ferry_member m[4];
    const void *data[4];
    size_t nm;
    int rc;
    /* The payload first, so a popped record always finds it. A try cut
     * short by the master going away is redone under a fresh key: the
     * half-done one is revoked by the master (or orphaned, if it landed). */
    for (;;) {
        uid = fr_random_u64();
        (void)fr_key_sample(key, sizeof key, q->cfg.queue, rs->policy_version, uid);
        nm = 0;
        const struct { const char *name, *dtype; uint64_t n; const void *p; char *ref; } mem[4] = {
            { "prompt", "i32", d->prompt_len, d->prompt, rs->prompt_ref },
            { "tokens", "i32", d->ntokens, d->tokens, rs->output_ref },
            { "logprobs", "f32", d->ntokens, d->logprobs, rs->logprob_ref },
            { "rewards", "f32", d->nrewards, d->rewards, rs->reward_ref },
        };
        for (int i = 0; i < 4; i++) {
            if (i == 0 && d->prompt_len == 0)
                continue;
            memset(&m[nm], 0, sizeof m[nm]);
            snprintf(m[nm].name, sizeof m[nm].name, "%s", mem[i].name);
            snprintf(m[nm].dtype, sizeof m[nm].dtype, "%s", mem[i].dtype);
            m[nm].ndim = 1;
            m[nm].shape[0] = mem[i].n;
            data[nm++] = mem[i].p;
            snprintf(mem[i].ref, FERRY_RECORD_REF_MAX + 1, "store://%s#%s", key, mem[i].name);
        }
        rc = ferry_store_put_struct(q->s, key, m, data, nm, &rc1, err);
        if (rc == 0)
            break;
        if (!fr_sq_retryable(rc) || fr_now_ns() >= dl)
            return fr_fail(err, rc, "sample_push: storing the payload of '%s': %s",
                           rs->session_id, fr_why(err, rc));
        q->st.push_retries++;
        fr_sq_backoff(&wait);
    }
    snprintf(rs->status, sizeof rs->status, "ready_for_update");
    char *rec = NULL;
    rc = envelope(rs, uid, fr_sq_wall_ms(), d, key, &rec);
    if (rc < 0) {
        (void)ferry_store_remove(q->s, key, NULL);
        return fr_fail(err, rc, "sample_push: the record of session '%s' cannot be encoded",
                       rs->session_id);
    }
    rc = push_record(q, q->cfg.queue, rec, id, err);
    free(rec);
    if (rc < 0) {
        (void)ferry_store_remove(q->s, key, NULL);   /* nothing left behind */
        rs->prompt_ref[0] = rs->output_ref[0] = rs->logprob_ref[0] = rs->reward_ref[0] = '\0';
        return rc;
    }
    q->st.pushed++;
    return 0;
}

/* ---- pop ---------------------------------------------------------------------------------- */

/* Stale sample, its claim already taken as done (fr_sq_take: a
 * compare-and-swap, so if a lapsed lease let the record go to a second
 * consumer only one of the two acts, and there are never two recompute
 * requests): drop it, or hand it back to the rollout side, then finish the
 * record. A recompute request that cannot be pushed is counted dropped,
 * with a warning. */
static void reject(ferry_sample_queue *q, ferry_sample *smp)
{
    q->st.stale++;
    if (q->cfg.stale_policy == FERRY_STALE_RECOMPUTE) {
        snprintf(smp->session.status, sizeof smp->session.status, "recompute");
        smp->session.prompt_ref[0] = smp->session.output_ref[0] = '\0';
        smp->session.logprob_ref[0] = smp->session.reward_ref[0] = '\0';
        char *rec = NULL;
        ferry_error e2 = {0};
        int rc = envelope(&smp->session, smp->uid, smp->pushed_at_ms, NULL, "", &rec);
        if (rc == 0)
            rc = push_record(q, q->recompute, rec, NULL, &e2);
        free(rec);
        if (rc == 0) {
            q->st.recompute++;
        } else {
            FR_WARN("rl", "queue %s: sample '%s' is stale and could not be sent back for "
                    "recompute (%s): dropped", q->cfg.queue, smp->session.session_id,
                    e2.msg[0] ? e2.msg : ferry_strerror(rc));
            q->st.dropped++;
        }
    } else {
        q->st.dropped++;
    }
    fr_sq_finish(q, smp->payload, smp->uid, smp->id, smp->token);
}

static int pop_from(ferry_sample_queue *q, const char *queue, bool samples, uint32_t max,
                    ferry_sample *out, size_t *n, ferry_error *err)
{
    if (!q || !out || !n || max == 0)
        return fr_fail(err, FERRY_EINVAL, "sample_pop: bad arguments");
    *n = 0;
    fr_sq_retry_deferred(q, false);
    if (max > 4096)
        max = 4096;
    ferry_qrecord *recs = calloc(max, sizeof *recs);
    if (!recs)
        return fr_fail(err, FERRY_ENOMEM, "sample_pop: out of memory");
    size_t got = 0;
    int rc = ferry_queue_pop(q->s, queue, max, q->cfg.lease_ms, recs, &got, err);
    if (rc < 0) {
        free(recs);
        return fr_fail(err, rc, "sample queue %s: pop failed: %s", queue,
                       fr_why(err, rc));
    }
    uint64_t now = fr_sq_wall_ms();
    size_t k = 0, i;
    for (i = 0; i < got; i++) {
        ferry_sample *smp = &out[k];
        ferry_error e2 = {0};
        if (decode_envelope(recs[i].data, recs[i].len, smp, &e2) < 0) {
            /* A record that is not a sample: ack it away rather than loop on it. */
            FR_WARN("rl", "queue %s: record %" PRIu64 " is not a sample (%s); removed", queue,
                    recs[i].id, e2.msg);
            (void)ferry_queue_ack(q->s, recs[i].id, recs[i].token, NULL);
            continue;
        }
        smp->id = recs[i].id;
        smp->token = recs[i].token;
        smp->popped_at_ms = now;
        if (!samples) {
            q->st.recompute_popped++;
            k++;
            continue;
        }
        q->st.popped++;
        if (recs[i].token > 1)
            q->st.redelivered++;
        enum ferry_version_verdict vd = ferry_policy_admit(
            smp->session.policy_version, q->cfg.input_version, q->cfg.max_policy_lag);
        if (vd == FERRY_VERSION_AHEAD) {   /* back, unclaimed, until the consumer catches up */
            q->st.ahead++;
            (void)ferry_queue_nack(q->s, smp->id, smp->token, NULL);
            ferry_sample_clear(smp);
            continue;
        }
        int t = fr_sq_take(q, smp, vd == FERRY_VERSION_STALE);
        if (t < 0) {
            (void)ferry_queue_nack(q->s, smp->id, smp->token, NULL);
            ferry_sample_clear(smp);
            rc = fr_fail(err, t, "sample queue %s: claiming a sample: %s", queue,
                         fr_why(err, t));
            break;
        }
        if (t != FR_SQ_TAKEN) {
            if (t == FR_SQ_DUPLICATE) {   /* the payload belongs to the claimer */
                q->st.duplicates++;
                (void)fr_sq_ack_retry(q, smp->id, smp->token, NULL);
            } else if (t == FR_SQ_DONE) {   /* acked by a consumer that died before the end */
                q->st.duplicates++;
                fr_sq_finish(q, smp->payload, smp->uid, smp->id, smp->token);
            }
            ferry_sample_clear(smp);
            continue;
        }
        if (vd == FERRY_VERSION_STALE) {
            reject(q, smp);
            ferry_sample_clear(smp);
            continue;
        }
        q->st.admitted++;
        k++;
    }
    if (rc < 0) {
        /* hand back whatever was not looked at yet, and the admitted ones */
        for (size_t j = i + 1; j < got; j++)
            (void)ferry_queue_nack(q->s, recs[j].id, recs[j].token, NULL);
        for (size_t j = 0; j < k; j++) {
            (void)ferry_queue_nack(q->s, out[j].id, out[j].token, NULL);
            ferry_sample_clear(&out[j]);
        }
        k = 0;
    }
    ferry_qrecords_free(recs, got);
    free(recs);
    *n = k;
    return rc;
}

int ferry_sample_pop(ferry_sample_queue *q, uint32_t max, ferry_sample *out, size_t *n,
                     ferry_error *err)
{
    return pop_from(q, q ? q->cfg.queue : NULL, true, max, out, n, err);
}

int ferry_sample_pop_recompute(ferry_sample_queue *q, uint32_t max, ferry_sample *out,
                               size_t *n, ferry_error *err)
{
    return pop_from(q, q ? q->recompute : NULL, false, max, out, n, err);
}

int ferry_sample_read(ferry_sample_queue *q, const ferry_sample *smp, int32_t *prompt,
                      int32_t *tokens, float *logprobs, float *rewards, ferry_error *err)
{
    if (!q || !smp || !smp->payload[0])
        return fr_fail(err, FERRY_EINVAL, "sample_read: no payload");
    const struct { const char *name; void *dst; uint64_t n; } want[4] = {
        { "prompt", prompt, smp->prompt_len }, { "tokens", tokens, smp->ntokens },
        { "logprobs", logprobs, smp->ntokens }, { "rewards", rewards, smp->nrewards },
    };
    for (int i = 0; i < 4; i++) {
        if (!want[i].dst || want[i].n == 0)
            continue;
        size_t cap = (size_t)want[i].n * 4, len = 0;
        int rc = ferry_store_read_member(q->s, smp->payload, want[i].name, 0, want[i].n,
                                         want[i].dst, cap, &len, err);
        if (rc == 0 && len != cap)
            rc = FERRY_ECORRUPT;
        if (rc < 0)
            return fr_fail(err, rc == FERRY_ERANGE ? FERRY_ECORRUPT : rc,
                           "sample '%s': reading %s of %s: %s", smp->session.session_id,
                           want[i].name, smp->payload,
                           rc == FERRY_ECORRUPT || rc == FERRY_ERANGE
                                  ? "the object disagrees with the record"
                                  : fr_why(err, rc));
    }
    return 0;
}

int ferry_sample_ack(ferry_sample_queue *q, const ferry_sample *smp, size_t n, bool *ok,
                     ferry_error *err)
{
    if (!q || (n && !smp))
        return fr_fail(err, FERRY_EINVAL, "sample_ack: bad arguments");
    int first = 0;
    size_t nstale = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_sample *x = &smp[i];
        ferry_error se = {0};
        int rc;
        if (!x->payload[0]) {   /* a recompute request: a record and nothing else */
            rc = fr_sq_ack_retry(q, x->id, x->token, &se);
        } else {
            rc = fr_sq_mark_done(q, x, &se);
            if (rc == 0)
                fr_sq_finish(q, x->payload, x->uid, x->id, x->token);
        }
        if (ok)
            ok[i] = rc == 0;
        if (rc == 0) {
            q->st.acked++;
        } else if (rc == FERRY_ESTALE || rc == FERRY_ENOENT) {
            q->st.ack_stale++;
            nstale++;
            if (!first)
                first = FERRY_ESTALE;
        } else if (!first || first == FERRY_ESTALE) {
            first = fr_fail(err, rc, "sample_ack: sample '%s': %s", x->session.session_id,
                            se.msg);
        }
    }
    if (first == FERRY_ESTALE)
        fr_fail(err, first, "sample_ack: %zu of %zu samples were delivered again after their "
                "lease lapsed; not acked", nstale, n);
    return first;
}

int ferry_sample_release(ferry_sample_queue *q, const ferry_sample *smp, size_t n, ferry_error *err)
{
    if (!q || (n && !smp))
        return fr_fail(err, FERRY_EINVAL, "sample_release: bad arguments");
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_error se;
        int rc = ferry_queue_nack(q->s, smp[i].id, smp[i].token, first ? NULL : &se);
        if (rc < 0 && !first)
            first = fr_fail(err, rc, "sample_release: sample '%s': %s", smp[i].session.session_id,
                            se.msg);
    }
    return first;
}

void ferry_sample_queue_set_version(ferry_sample_queue *q, uint64_t input_version)
{
    if (!q)
        return;
    q->cfg.input_version = input_version;
    fr_sq_drop_claims(q, input_version);
}

/* ---- the KV-reuse gate ------------------------------------------------------------------ */

int ferry_kvcache_ref_version(const char *ref, uint64_t *version)
{
    if (!ref || !version || strncmp(ref, "store://", 8) != 0)
        return FERRY_EINVAL;
    return fr_key_kvcache_version(ref + 8, version);
}

int ferry_kvcache_put(ferry_store *s, const char *ns, uint64_t version, const char *name,
                      const void *data, size_t len, char *ref, size_t refcap,
                      ferry_kvcache_stats *st, ferry_error *err)
{
    char key[FERRY_RECORD_REF_MAX + 1];
    int k = fr_key_kvcache(key, sizeof key, ns, version);
    if (k < 0)
        return fr_fail(err, k, "kvcache put: the namespace is too long for a reference");
    if (!s || !name || !name[0] || !ref)
        return fr_fail(err, FERRY_EINVAL, "kvcache put: no store, name or reference buffer");
    if (snprintf(key + k, sizeof key - (size_t)k, "%s", name) >= (int)(sizeof key - (size_t)k) ||
        (size_t)snprintf(ref, refcap, "store://%s", key) >= refcap)
        return fr_fail(err, FERRY_EMSGSIZE, "kvcache put: the key is longer than a reference allows");
    ferry_replicate_config rc1 = { .replica_num = 1 };
    int rc = ferry_store_put(s, key, data, len, &rc1, NULL, err);
    if (rc == 0 && st)
        st->stored++;
    return rc;
}

int ferry_kvcache_get(ferry_store *s, const char *ref, uint64_t active_version, void *dst,
                      size_t cap, size_t *len, ferry_kvcache_stats *st, ferry_error *err)
{
    uint64_t v = 0;
    int rc = ferry_kvcache_ref_version(ref, &v);
    if (rc < 0)
        return fr_fail(err, rc, "kvcache get: not a KV cache reference");
    if (!s)
        return fr_fail(err, FERRY_EINVAL, "kvcache get: no store");
    if (v != active_version) {
        if (st)
            st->refused++;
        return fr_fail(err, FERRY_ESTALE, "kvcache get: %s was produced under policy version %"
                       PRIu64 ", not the active %" PRIu64 ": recompute it", ref, v, active_version);
    }
    rc = ferry_store_get_into(s, ref + 8, dst, cap, len, err);
    if (rc == 0 && st)
        st->hits++;
    return rc;
}

int ferry_kvcache_retire(ferry_store *s, const char *ns, uint64_t version, uint64_t *removed,
                         ferry_kvcache_stats *st, ferry_error *err)
{
    char prefix[FERRY_RECORD_REF_MAX + 1];
    int k = fr_key_kvcache(prefix, sizeof prefix, ns, version);
    if (k < 0)
        return fr_fail(err, k, "kvcache retire: the namespace is too long for a reference");
    if (!s)
        return fr_fail(err, FERRY_EINVAL, "kvcache retire: no store");
    uint64_t r = 0;
    int rc = ferry_store_remove_prefix(s, prefix, &r, err);
    if (rc == 0 && st)
        st->retired += r;
    if (removed)
        *removed = r;
    return rc;
}
