/* Rollout/update disaggregation against a real master and node: record
 * round trips and malformed records; the lag rule; the policy registry
 * (the announcing CAS carries the record, watch delivers new versions,
 * history); stale rejection by drop and by recompute, admission within
 * max_policy_lag, samples ahead of the consumer handed back; payload round
 * trip and removal on ack; a bounded queue failing with FERRY_EAGAIN or
 * making the producer wait; redelivery after an update worker is killed
 * with SIGKILL; a master killed with SIGKILL and restarted mid-flow with
 * no sample lost and none trained twice; the KV-reuse gate. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/ftstore.h"
#include "ferry/samples.h"

/* ---- records and rules (no cluster) ------------------------------------------------ */

static void test_records_roundtrip(void **state)
{
    (void)state;
    ferry_rollout_session r = { .policy_version = 17 };
    snprintf(r.session_id, sizeof r.session_id, "rollout-session-1");
    snprintf(r.episode_id, sizeof r.episode_id, "episode-123");
    snprintf(r.request_id, sizeof r.request_id, "request-456");
    snprintf(r.output_ref, sizeof r.output_ref, "store://outputs/episode-123#tokens");
    snprintf(r.kv_ref, sizeof r.kv_ref, "store://ferry/kv/w/00000000000000000017/e123");
    snprintf(r.status, sizeof r.status, "ready_for_update");
    r.metadata = strdup("{\"algorithm\":\"grpo\",\"created_at_step\":17}");
    char *j = NULL;
    assert_int_equal(ferry_rollout_session_to_json(&r, &j), 0);
    ferry_rollout_session back;
    ferry_error err = {0};
    assert_int_equal(ferry_rollout_session_from_json(j, strlen(j), &back, &err), 0);
    assert_string_equal(back.session_id, r.session_id);
    assert_string_equal(back.output_ref, r.output_ref);
    assert_string_equal(back.kv_ref, r.kv_ref);
    assert_string_equal(back.prompt_ref, "");
    assert_int_equal(back.policy_version, 17);
    assert_string_equal(back.metadata, "{\"algorithm\":\"grpo\",\"created_at_step\":17}");
    char *j2 = NULL;
    assert_int_equal(ferry_rollout_session_to_json(&back, &j2), 0);
    assert_string_equal(j, j2);   /* canonical */
    free(j2);
    ferry_rollout_session_clear(&back);

    /* malformed: every way a field can be wrong */
    const char *bad[] = {
        "", "[]", "{", "{\"session_id\":1}",
        "{\"session_id\":\"a\",\"episode_id\":\"b\",\"request_id\":\"c\",\"prompt_ref\":\"\","
        "\"output_ref\":\"\",\"logprob_ref\":\"\",\"reward_ref\":\"\",\"kv_ref\":\"\","
        "\"status\":\"x\",\"policy_version\":-1}",
        "{\"session_id\":\"a\",\"episode_id\":\"b\",\"request_id\":\"c\",\"prompt_ref\":\"\","
        "\"output_ref\":\"\",\"logprob_ref\":\"\",\"reward_ref\":\"\",\"kv_ref\":\"\","
        "\"status\":\"x\",\"policy_version\":1,\"metadata\":[1]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(ferry_rollout_session_from_json(bad[i], strlen(bad[i]), &back, &err),
                         FERRY_EPROTO);
        assert_true(err.msg[0] != 0);
    }
    /* an over-long id is refused, not truncated */
    char big[400];
    memset(big, 'x', 300);
    big[300] = 0;
    char *longj = NULL;
    free(r.metadata);
    r.metadata = NULL;
    assert_int_equal(ferry_rollout_session_to_json(&r, &longj), 0);
    char *p = strstr(longj, "rollout-session-1");
    assert_non_null(p);
    size_t need = strlen(longj) + 400;
    char *mod = malloc(need);
    snprintf(mod, need, "%.*s%s%s", (int)(p - longj), longj, big, p + strlen("rollout-session-1"));
    assert_int_equal(ferry_rollout_session_from_json(mod, strlen(mod), &back, &err), FERRY_EPROTO);
    assert_non_null(strstr(err.msg, "session_id"));
    free(mod);
    free(longj);
    free(j);
    r.metadata = strdup("[1,2]");   /* metadata must be an object */
    assert_int_equal(ferry_rollout_session_to_json(&r, &j), FERRY_EINVAL);
    ferry_rollout_session_clear(&r);

    /* UpdateSession with ref lists */
    char *traj[] = { "store://a#tokens", "store://b#tokens" }, *rew[] = { "store://a#rewards" };
    ferry_update_session u = { .input_version = 4, .output_version = 5, .trajectory_refs = traj,
                               .ntrajectory = 2, .reward_refs = rew, .nreward = 1 };
    snprintf(u.update_id, sizeof u.update_id, "update-4");
    snprintf(u.status, sizeof u.status, "done");
    assert_int_equal(ferry_update_session_to_json(&u, &j), 0);
    ferry_update_session ub;
    assert_int_equal(ferry_update_session_from_json(j, strlen(j), &ub, &err), 0);
    assert_int_equal(ub.ntrajectory, 2);
    assert_string_equal(ub.trajectory_refs[1], "store://b#tokens");
    assert_int_equal(ub.nreward, 1);
    assert_int_equal(ub.nlogprob, 0);
    assert_int_equal(ub.input_version, 4);
    assert_int_equal(ub.output_version, 5);
    ferry_update_session_clear(&ub);
    free(j);

    ferry_policy_version pv = { .version = 9, .parent = 8, .created_at_step = 90,
                                .weight_generation = 9 };
    snprintf(pv.model, sizeof pv.model, "tiny");
    assert_int_equal(ferry_policy_version_to_json(&pv, &j), 0);
    ferry_policy_version pb;
    assert_int_equal(ferry_policy_version_from_json(j, strlen(j), &pb, &err), 0);
    assert_int_equal(pb.version, 9);
    assert_int_equal(pb.parent, 8);
    assert_int_equal(pb.created_at_step, 90);
    assert_string_equal(pb.model, "tiny");
    assert_string_equal(pb.metadata, "{}");
    ferry_policy_version_clear(&pb);
    free(j);
}

static void test_version_rules(void **state)
{
    (void)state;
    assert_int_equal(ferry_policy_admit(5, 5, 0), FERRY_VERSION_ADMIT);
    assert_int_equal(ferry_policy_admit(4, 5, 0), FERRY_VERSION_STALE);
    assert_int_equal(ferry_policy_admit(6, 5, 0), FERRY_VERSION_AHEAD);
    assert_int_equal(ferry_policy_admit(4, 5, 1), FERRY_VERSION_ADMIT);
    assert_int_equal(ferry_policy_admit(3, 5, 1), FERRY_VERSION_STALE);
    assert_int_equal(ferry_policy_admit(0, 5, 5), FERRY_VERSION_ADMIT);
    assert_int_equal(ferry_policy_admit(0, UINT64_MAX, UINT32_MAX), FERRY_VERSION_STALE);
    assert_int_equal(ferry_policy_admit(UINT64_MAX, UINT64_MAX, 0), FERRY_VERSION_ADMIT);
    uint64_t v = 0;
    assert_int_equal(ferry_kvcache_ref_version("store://ferry/kv/w/00000000000000000042/x", &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(ferry_kvcache_ref_version("store://ferry/kv/w/42/x", &v), FERRY_EINVAL);
    assert_int_equal(ferry_kvcache_ref_version("ferry/kv/w/00000000000000000042/x", &v),
                     FERRY_EINVAL);
}

/* ---- cluster fixture ------------------------------------------------------------------- */

typedef ft_solo fixture;

static int setup(void **state) { return ft_solo_setup(state, 64u << 20, 10000); }
static int teardown(void **state) { return ft_solo_teardown(state); }

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static ferry_sample_queue *open_q(fixture *f, const char *name, uint64_t input, uint32_t lag,
                                  enum ferry_stale_policy pol)
{
    ferry_sample_queue_config qc = { .input_version = input, .max_policy_lag = lag,
                                     .stale_policy = pol, .lease_ms = 30000 };
    snprintf(qc.queue, sizeof qc.queue, "%s", name);
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_sample_queue_open(f->s, &qc, &q, &err), 0);
    return q;
}

static int push_one(ferry_sample_queue *q, const char *sid, uint64_t version, int seed)
{
    int32_t tokens[16];
    float lp[16], reward = (float)seed;
    for (int i = 0; i < 16; i++) {
        tokens[i] = seed * 100 + i;
        lp[i] = -(float)i / 8.0f;
    }
    ferry_rollout_session rs = { .policy_version = version };
    snprintf(rs.session_id, sizeof rs.session_id, "%s", sid);
    snprintf(rs.episode_id, sizeof rs.episode_id, "ep-%s", sid);
    ferry_sample_data d = { .tokens = tokens, .ntokens = 16, .logprobs = lp, .rewards = &reward,
                            .nrewards = 1 };
    ferry_error err = {0};
    int rc = ferry_sample_push(q, &rs, &d, NULL, &err);
    ferry_rollout_session_clear(&rs);
    return rc;
}

/* Pop until `want` samples came out or the deadline passed. */
static size_t pop_n(ferry_sample_queue *q, ferry_sample *out, size_t want, int timeout_ms)
{
    size_t got = 0;
    for (int waited = 0; got < want && waited <= timeout_ms; waited += 10) {
        size_t n = 0;
        ferry_error err = {0};
        if (ferry_sample_pop(q, (uint32_t)(want - got), out + got, &n, &err) == 0)
            got += n;
        if (got < want)
            sleep_ms(10);
    }
    return got;
}

/* ---- policy registry ---------------------------------------------------------------------- */

static void publish_version(fixture *f, uint64_t v, uint64_t parent, bool plain)
{
    static const uint32_t rank_node[1] = { 0 };
    ferry_publisher_config pc = { .rank = 0, .world = 1, .rank_node = rank_node,
                                  .timeout_ms = 20000 };
    snprintf(pc.model, sizeof pc.model, "pol");
    float w[64];
    for (int i = 0; i < 64; i++)
        w[i] = (float)(v * 100 + (uint64_t)i);
    ferry_weight_tensor t = { .name = "w", .dtype = "f32", .ndim = 1, .shape = { 64 }, .data = w };
    ferry_error err = {0};
    if (plain) {
        assert_int_equal(ferry_publish(f->s, &pc, v, &t, 1, NULL, &err), 0);
        return;
    }
    ferry_policy_version pv = { .version = v, .parent = parent, .created_at_step = v * 10 };
    char meta[64];
    snprintf(meta, sizeof meta, "{\"step\":%llu}", (unsigned long long)(v * 10));
    pv.metadata = meta;
    int rc = ferry_policy_publish(f->s, &pc, &pv, &t, 1, NULL, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
}

static void test_policy_registry(void **state)
{
    fixture *f = *state;
    ferry_policy_version cur;
    ferry_error err = {0};
    assert_int_equal(ferry_policy_current(f->s, "pol", &cur, &err), FERRY_ENOENT);
    ferry_policy_watch *w = NULL;
    assert_int_equal(ferry_policy_watch_open(f->s, "pol", &w, NULL), 0);
    assert_int_equal(ferry_policy_watch_next(w, 50, &cur, &err), FERRY_ETIMEDOUT);

    publish_version(f, 1, 0, false);
    assert_int_equal(ferry_policy_watch_next(w, 10000, &cur, &err), 0);
    assert_int_equal(cur.version, 1);
    assert_int_equal(cur.weight_generation, 1);
    ferry_policy_version_clear(&cur);

    publish_version(f, 2, 1, false);
    assert_int_equal(ferry_policy_current(f->s, "pol", &cur, &err), 0);
    assert_int_equal(cur.version, 2);
    assert_int_equal(cur.parent, 1);
    assert_int_equal(cur.created_at_step, 20);
    assert_string_equal(cur.metadata, "{\"step\":20}");
    ferry_policy_version_clear(&cur);
    /* the version and its weights are current together */
    uint64_t gen = 0;
    assert_int_equal(ferry_weights_active(f->s, "pol", &gen, NULL, NULL), 0);
    assert_int_equal(gen, 2);
    assert_int_equal(ferry_policy_watch_next(w, 10000, &cur, &err), 0);
    assert_int_equal(cur.version, 2);
    assert_string_equal(cur.metadata, "{\"step\":20}");
    ferry_policy_version_clear(&cur);

    /* a parent that is not older is refused before anything is stored */
    static const uint32_t rank_node[1] = { 0 };
    ferry_publisher_config pc = { .rank = 0, .world = 1, .rank_node = rank_node };
    snprintf(pc.model, sizeof pc.model, "pol");
    ferry_policy_version bad = { .version = 3, .parent = 3 };
    assert_int_equal(ferry_policy_publish(f->s, &pc, &bad, NULL, 0, NULL, &err), FERRY_EINVAL);

    /* a plain weight publish reads as a version without a record */
    publish_version(f, 3, 2, true);
    assert_int_equal(ferry_policy_current(f->s, "pol", &cur, &err), 0);
    assert_int_equal(cur.version, 3);
    assert_null(cur.metadata);
    ferry_policy_version_clear(&cur);
    assert_int_equal(ferry_policy_watch_next(w, 10000, &cur, &err), 0);
    assert_int_equal(cur.version, 3);
    ferry_policy_version_clear(&cur);

    /* a watcher opened now gets the current version first */
    ferry_policy_watch *w2 = NULL;
    assert_int_equal(ferry_policy_watch_open(f->s, "pol", &w2, NULL), 0);
    assert_int_equal(ferry_policy_watch_next(w2, 1000, &cur, &err), 0);
    assert_int_equal(cur.version, 3);
    ferry_policy_version_clear(&cur);
    ferry_policy_watch_close(w2);
    ferry_policy_watch_close(w);

    ferry_policy_version h[8];
    size_t n = 0;
    assert_int_equal(ferry_policy_history(f->s, "pol", h, 8, &n, &err), 0);
    assert_int_equal(n, 2);   /* versions 1 and 2 carried records */
    assert_int_equal(h[0].version, 1);
    assert_int_equal(h[1].version, 2);
    assert_int_equal(h[1].parent, 1);
    for (size_t i = 0; i < n; i++)
        ferry_policy_version_clear(&h[i]);
}

/* ---- staleness ------------------------------------------------------------------------------ */

static void test_stale_rules(void **state)
{
    fixture *f = *state;
    ferry_sample_queue *q = open_q(f, "st", 3, 0, FERRY_STALE_DROP);
    assert_int_equal(push_one(q, "s1", 1, 1), 0);
    assert_int_equal(push_one(q, "s2", 2, 2), 0);
    assert_int_equal(push_one(q, "s3", 3, 3), 0);
    ferry_sample out[8];
    size_t n = pop_n(q, out, 1, 5000);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].session.session_id, "s3");
    ferry_sample_stats st;
    ferry_sample_queue_stats(q, &st);
    assert_int_equal(st.popped, 3);
    assert_int_equal(st.stale, 2);
    assert_int_equal(st.dropped, 2);
    assert_int_equal(st.admitted, 1);
    assert_int_equal(ferry_sample_ack(q, out, 1, NULL, NULL), 0);
    ferry_sample_clear(&out[0]);
    /* dropped payloads are gone (reads leased them for 1 ms at most) */
    char **keys = NULL;
    size_t nk = 1;
    for (int i = 0; i < 500 && nk; i++) {
        ferry_store_free(keys);
        keys = NULL;
        assert_int_equal(ferry_store_list(f->s, "ferry/rl/st/", NULL, 100, &keys, &nk, NULL, NULL), 0);
        if (nk)
            sleep_ms(10);
    }
    ferry_store_free(keys);
    assert_int_equal(nk, 0);
    ferry_sample_queue_close(q);

    /* lag 1 with recompute: v2 and v3 admitted, v1 goes back to the rollout side */
    q = open_q(f, "rc", 3, 1, FERRY_STALE_RECOMPUTE);
    assert_int_equal(push_one(q, "r1", 1, 1), 0);
    assert_int_equal(push_one(q, "r2", 2, 2), 0);
    assert_int_equal(push_one(q, "r3", 3, 3), 0);
    n = pop_n(q, out, 2, 5000);
    assert_int_equal(n, 2);
    assert_string_equal(out[0].session.session_id, "r2");
    assert_string_equal(out[1].session.session_id, "r3");
    assert_int_equal(ferry_sample_ack(q, out, 2, NULL, NULL), 0);
    ferry_sample_clear(&out[0]);
    ferry_sample_clear(&out[1]);
    ferry_sample_queue_stats(q, &st);
    assert_int_equal(st.recompute, 1);
    assert_int_equal(st.stale, 1);
    assert_int_equal(st.acked, 2);
    ferry_sample rcm[4];
    ferry_error err = {0};
    assert_int_equal(ferry_sample_pop_recompute(q, 4, rcm, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(rcm[0].session.session_id, "r1");
    assert_string_equal(rcm[0].session.status, "recompute");
    assert_int_equal(rcm[0].session.policy_version, 1);
    assert_int_equal(ferry_sample_ack(q, rcm, 1, NULL, NULL), 0);
    ferry_sample_clear(&rcm[0]);

    /* a sample ahead of the consumer is handed back, not trained */
    ferry_sample_queue_set_version(q, 1);
    assert_int_equal(push_one(q, "a4", 4, 4), 0);
    assert_int_equal(ferry_sample_pop(q, 4, out, &n, &err), 0);
    assert_int_equal(n, 0);
    ferry_sample_queue_stats(q, &st);
    assert_int_equal(st.ahead, 1);
    ferry_sample_queue_set_version(q, 4);
    n = pop_n(q, out, 1, 5000);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].session.session_id, "a4");
    assert_int_equal(ferry_sample_ack(q, out, 1, NULL, NULL), 0);
    ferry_sample_clear(&out[0]);
    ferry_sample_queue_close(q);
}

static void test_payload_and_ack(void **state)
{
    fixture *f = *state;
    ferry_sample_queue *q = open_q(f, "pl", 7, 0, FERRY_STALE_DROP);
    int32_t prompt[3] = { 7, 8, 9 }, tokens[5] = { 1, 2, 3, 4, 5 };
    float lp[5] = { -0.5f, -1.0f, -1.5f, -2.0f, -2.5f }, rw[2] = { 1.0f, 0.25f };
    ferry_rollout_session rs = { .policy_version = 7 };
    snprintf(rs.session_id, sizeof rs.session_id, "p1");
    ferry_sample_data d = { .prompt = prompt, .prompt_len = 3, .tokens = tokens, .ntokens = 5,
                            .logprobs = lp, .rewards = rw, .nrewards = 2 };
    ferry_error err = {0};
    uint64_t id = 0;
    assert_int_equal(ferry_sample_push(q, &rs, &d, &id, &err), 0);
    assert_non_null(strstr(rs.output_ref, "#tokens"));
    assert_string_equal(rs.status, "ready_for_update");
    ferry_sample s;
    assert_int_equal(pop_n(q, &s, 1, 5000), 1);
    assert_int_equal(s.id, id);
    assert_int_equal(s.ntokens, 5);
    assert_int_equal(s.prompt_len, 3);
    assert_int_equal(s.nrewards, 2);
    assert_string_equal(s.session.output_ref, rs.output_ref);
    int32_t p2[3], t2[5];
    float l2[5], r2[2];
    assert_int_equal(ferry_sample_read(q, &s, p2, t2, l2, r2, &err), 0);
    assert_memory_equal(p2, prompt, sizeof prompt);
    assert_memory_equal(t2, tokens, sizeof tokens);
    assert_memory_equal(l2, lp, sizeof lp);
    assert_memory_equal(r2, rw, sizeof rw);
    /* ack removes the payload; a second ack of the same delivery is stale */
    bool ok = false;
    assert_int_equal(ferry_sample_ack(q, &s, 1, &ok, &err), 0);
    assert_true(ok);
    assert_int_equal(ferry_sample_ack(q, &s, 1, &ok, &err), FERRY_ESTALE);
    assert_false(ok);
    int ex = 1;
    for (int i = 0; i < 500 && ex == 1; i++) {
        size_t n = 0;
        ferry_sample none;
        /* a pop retries a removal the read's lease deferred */
        assert_int_equal(ferry_sample_pop(q, 1, &none, &n, &err), 0);
        assert_int_equal(n, 0);
        ex = ferry_store_exist(f->s, s.payload, NULL);
        if (ex == 1)
            sleep_ms(10);
    }
    assert_int_equal(ex, 0);
    ferry_sample_clear(&s);
    ferry_sample_queue_stats(q, NULL);
    ferry_sample_queue_close(q);
    ferry_rollout_session_clear(&rs);
}

/* The claim log and the payload listing (samples.h, "auditing a queue"):
 * a claim per delivery popped, the commit of the ack, then the mark; the
 * payloads listed are the popped samples', the acked one's gone. */
static void test_claim_log(void **state)
{
    fixture *f = *state;
    ferry_sample_claims *log = NULL;
    assert_int_equal(ferry_sample_claims_open(f->s, "cl", &log, NULL), 0);
    ferry_sample_queue *q = open_q(f, "cl", 3, 0, FERRY_STALE_DROP);
    assert_int_equal(push_one(q, "c1", 3, 1), 0);
    assert_int_equal(push_one(q, "c2", 3, 2), 0);
    ferry_sample s[2];
    assert_int_equal(pop_n(q, s, 2, 5000), 2);
    char **keys = NULL;
    size_t n = 0;
    bool more = true;
    assert_int_equal(ferry_sample_payloads(f->s, "cl", 16, &keys, &n, &more, NULL), 0);
    assert_int_equal(n, 2);
    assert_false(more);
    for (size_t i = 0; i < 2; i++)
        assert_true(!strcmp(keys[i], s[0].payload) || !strcmp(keys[i], s[1].payload));
    ferry_store_free(keys);
    bool ok = false;
    ferry_error err = {0};
    assert_int_equal(ferry_sample_ack(q, &s[0], 1, &ok, &err), 0);
    assert_true(ok);
    assert_int_equal(ferry_sample_claims_mark(log, NULL), 0);
    ferry_sample_claim c;
    unsigned taken = 0, done = 0;
    for (;;) {
        assert_int_equal(ferry_sample_claims_next(log, 5000, &c, NULL), 0);
        if (c.mark)
            break;
        const ferry_sample *m = c.uid == s[0].uid ? &s[0] : &s[1];
        assert_int_equal(c.uid, m->uid);
        assert_int_equal(c.id, m->id);
        assert_int_equal(c.token, m->token);
        assert_false(c.deleted);
        taken += !c.done;
        done += c.done;
        assert_true(!c.done || c.uid == s[0].uid);
    }
    assert_int_equal(taken, 2);
    assert_int_equal(done, 1);
    ferry_error ce = {0};
    assert_int_equal(ferry_sample_claims_next(log, 50, &c, &ce), FERRY_ETIMEDOUT);
    assert_non_null(strstr(ce.msg, "no claim written within 50 ms"));
    assert_int_equal(ferry_sample_payloads(f->s, "cl", 16, &keys, &n, NULL, NULL), 0);
    assert_int_equal(n, 1);
    assert_string_equal(keys[0], s[1].payload);
    ferry_store_free(keys);
    assert_int_equal(ferry_sample_payloads(f->s, "", 16, &keys, &n, NULL, &ce), FERRY_EINVAL);
    assert_non_null(strstr(ce.msg, "no store, queue or result"));
    ferry_sample_claims *none = NULL;
    assert_int_equal(ferry_sample_claims_open(f->s, NULL, &none, NULL), FERRY_EINVAL);
    assert_null(none);
    ferry_sample_claims_close(log);
    ferry_sample_claims_close(NULL);
    for (size_t i = 0; i < 2; i++)
        ferry_sample_clear(&s[i]);
    ferry_sample_queue_close(q);
}

/* ---- backpressure ---------------------------------------------------------------------------- */

typedef struct pusher { ferry_sample_queue *q; volatile int rc; volatile bool done; } pusher;

static void *push_thread(void *p)
{
    pusher *u = p;
    u->rc = push_one(u->q, "late", 1, 99);
    u->done = true;
    return NULL;
}

static void test_backpressure(void **state)
{
    fixture *f = *state;
    ferry_sample_queue_config qc = { .input_version = 1, .bound = 4, .fail_when_full = true };
    snprintf(qc.queue, sizeof qc.queue, "bp");
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_sample_queue_open(f->s, &qc, &q, &err), 0);
    for (int i = 0; i < 4; i++) {
        char sid[16];
        snprintf(sid, sizeof sid, "b%d", i);
        assert_int_equal(push_one(q, sid, 1, i), 0);
    }
    assert_int_equal(push_one(q, "b4", 1, 4), FERRY_EAGAIN);
    ferry_sample_stats st;
    ferry_sample_queue_stats(q, &st);
    assert_int_equal(st.push_full, 1);
    assert_int_equal(st.pushed, 4);
    /* nothing left behind by the refused push */
    char **keys = NULL;
    size_t nk = 0;
    assert_int_equal(ferry_store_list(f->s, "ferry/rl/bp/", NULL, 100, &keys, &nk, NULL, NULL), 0);
    assert_int_equal(nk, 4);
    ferry_store_free(keys);
    ferry_sample_queue_close(q);

    /* a waiting producer gets in once a consumer acks */
    qc.fail_when_full = false;
    qc.push_timeout_ms = 30000;
    assert_int_equal(ferry_sample_queue_open(f->s, &qc, &q, &err), 0);
    pusher u = { .q = q };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, push_thread, &u), 0);
    ferry_sample_queue *cq = open_q(f, "bp", 1, 0, FERRY_STALE_DROP);
    /* the producer is waiting: the queue stays at its bound */
    for (int i = 0; i < 2000; i++) {
        ferry_sample_stats ps;
        ferry_sample_queue_stats(q, &ps);
        if (ps.push_waits)
            break;
        sleep_ms(5);
    }
    assert_false(u.done);
    ferry_sample s;
    assert_int_equal(pop_n(cq, &s, 1, 5000), 1);
    assert_false(u.done);   /* leased still counts against the bound */
    assert_int_equal(ferry_sample_ack(cq, &s, 1, NULL, &err), 0);
    ferry_sample_clear(&s);
    pthread_join(t, NULL);
    assert_int_equal(u.rc, 0);
    ferry_sample_queue_stats(q, &st);
    assert_int_equal(st.push_waits, 1);
    assert_int_equal(st.pushed, 1);
    ferry_sample_queue_close(cq);
    ferry_sample_queue_close(q);
}

/* ---- an update worker killed with SIGKILL ---------------------------------------------------- */

static int consumer_main(char **argv)
{
    ferry_error fe = {0};
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", argv[0]);
    ferry_store *s = NULL;
    if (ferry_store_open(&cfg, &s, &fe) < 0) {
        printf("ERR open %s\n", fe.msg);
        return 1;
    }
    ferry_sample_queue_config qc = { .input_version = 1, .lease_ms = 400 };
    snprintf(qc.queue, sizeof qc.queue, "kq");
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    if (ferry_sample_queue_open(s, &qc, &q, &err) < 0) {
        printf("ERR %s\n", err.msg);
        return 1;
    }
    ferry_sample out[5];
    size_t got = 0;
    for (int i = 0; i < 1000 && got < 5; i++) {
        size_t n = 0;
        if (ferry_sample_pop(q, (uint32_t)(5 - got), out + got, &n, &err) == 0)
            got += n;
        if (got < 5)
            sleep_ms(5);
    }
    printf("POPPED %zu\n", got);
    fflush(stdout);
    for (;;)
        pause();   /* "training": killed here */
}

static void test_redelivery_after_kill9(void **state)
{
    fixture *f = *state;
    ferry_sample_queue *q = open_q(f, "kq", 1, 0, FERRY_STALE_DROP);
    for (int i = 0; i < 5; i++) {
        char sid[16];
        snprintf(sid, sizeof sid, "k%d", i);
        assert_int_equal(push_one(q, sid, 1, i), 0);
    }
    ft_peer p;
    const char *args[] = { "--consumer", f->c.addr, NULL };
    assert_int_equal(ft_spawn(&p, NULL, args), 0);
    char line[256] = "";
    assert_int_equal(ft_read_line(&p, line, sizeof line, 20000), 0);
    assert_string_equal(line, "POPPED 5");
    ft_proc_kill(&p, SIGKILL);
    /* nothing is ready until the dead worker's leases lapse; then all five */
    ferry_sample out[5];
    size_t n = pop_n(q, out, 5, 10000);
    assert_int_equal(n, 5);
    ferry_sample_stats st;
    ferry_sample_queue_stats(q, &st);
    assert_int_equal(st.redelivered, 5);
    assert_int_equal(ferry_sample_ack(q, out, 5, NULL, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(out[i].token, 2);
        ferry_sample_clear(&out[i]);
    }
    ferry_sample_queue_close(q);
}

/* ---- consumers killed inside ack ------------------------------------------------------------ */

/* The child: pop up to 4 samples, read each payload (its reads lease the
 * object for the store's default 5 s, so the ack's removal is often
 * refused and deferred), say "ACK n" and ack them; again and again until
 * killed. Its samples' leases last 500 ms, so a dead child's records come
 * back soon. */
static int acker_main(char **argv)
{
    ferry_error fe = {0};
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", argv[0]);
    ferry_store *s = NULL;
    if (ferry_store_open(&cfg, &s, &fe) < 0) {
        printf("ERR open %s\n", fe.msg);
        return 1;
    }
    ferry_sample_queue_config qc = { .input_version = 1, .lease_ms = 500 };
    snprintf(qc.queue, sizeof qc.queue, "ak");
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    if (ferry_sample_queue_open(s, &qc, &q, &err) < 0) {
        printf("ERR %s\n", err.msg);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    for (;;) {
        ferry_sample b[4];
        size_t n = 0;
        if (ferry_sample_pop(q, 4, b, &n, &err) < 0 || n == 0) {
            sleep_ms(2);
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            int32_t tok[16];
            float lp[16], rw[1];
            if (ferry_sample_read(q, &b[i], NULL, tok, lp, rw, &err) < 0)
                printf("ERR read %s\n", err.msg);
        }
        printf("ACK %zu\n", n);
        fflush(stdout);
        (void)ferry_sample_ack(q, b, n, NULL, &err);
        for (size_t i = 0; i < n; i++)
            ferry_sample_clear(&b[i]);
    }
}

/* Whether queue "ak" holds no record, ready or leased: with a bound of 1 a
 * push is refused exactly when one is outstanding. A probe that got in is
 * taken out again. */
static bool ak_empty(ferry_store *s)
{
    assert_int_equal(ferry_queue_config(s, "ak", 1, NULL), 0);
    uint64_t id = 0;
    int rc = ferry_queue_push(s, "ak", "probe", 5, &id, NULL);
    if (rc == 0) {
        ferry_qrecord r[1];
        size_t n = 0;
        assert_int_equal(ferry_queue_pop(s, "ak", 1, 60000, r, &n, NULL), 0);
        assert_int_equal(n, 1);
        assert_int_equal(r[0].id, id);
        assert_int_equal(ferry_queue_ack(s, r[0].id, r[0].token, NULL), 0);
        ferry_qrecords_free(r, n);
    } else {
        assert_int_equal(rc, FERRY_EAGAIN);
    }
    assert_int_equal(ferry_queue_config(s, "ak", 0, NULL), 0);
    return rc == 0;
}

/* Consumers SIGKILLed at varied points of ferry_sample_ack (and around it):
 * afterwards every record still in the queue is delivered again with its
 * payload there, and once the queue is empty no payload object is left. */
static void test_ack_killed_no_orphan(void **state)
{
    fixture *f = *state;
    enum { SAMPLES = 400, KILLS = 40 };
    ferry_sample_queue *q = open_q(f, "ak", 1, 0, FERRY_STALE_DROP);
    for (int i = 0; i < SAMPLES; i++) {
        char sid[16];
        snprintf(sid, sizeof sid, "a%03d", i);
        assert_int_equal(push_one(q, sid, 1, i), 0);
    }
    static const long delay_us[] = { 0, 50, 150, 300, 600, 1000, 1600, 2500 };
    int kills = 0, read_errors = 0;
    for (int k = 0; k < KILLS; k++) {
        ft_peer p;
        const char *args[] = { "--acker", f->c.addr, NULL };
        assert_int_equal(ft_spawn(&p, NULL, args), 0);
        char line[512] = "";
        bool acking = false;
        while (!acking && ft_read_line(&p, line, sizeof line, 30000) == 0) {
            acking = !strncmp(line, "ACK ", 4);
            read_errors += !strncmp(line, "ERR read", 8);
        }
        if (acking) {   /* kill it inside this ack, at a point that varies */
            struct timespec ts = { 0, delay_us[k % 8] * 1000L };
            nanosleep(&ts, NULL);
            kills++;
        }
        ft_proc_kill(&p, SIGKILL);
        if (!acking)
            break;   /* nothing left to pop */
    }
    /* Drain: every record comes back once the dead children's leases lapse
     * and must still have its payload; then the queue is empty. */
    int drained = 0, missing = 0;
    bool empty = false;
    for (int w = 0; w < 6000 && !empty; w++) {
        ferry_sample b[64];
        size_t n = 0;
        ferry_error err = {0};
        assert_int_equal(ferry_sample_pop(q, 64, b, &n, &err), 0);
        for (size_t i = 0; i < n; i++) {
            int32_t tok[16];
            float lp[16], rw[1];
            missing += ferry_sample_read(q, &b[i], NULL, tok, lp, rw, &err) < 0;
        }
        if (n)
            assert_int_equal(ferry_sample_ack(q, b, n, NULL, &err), 0);
        for (size_t i = 0; i < n; i++)
            ferry_sample_clear(&b[i]);
        drained += (int)n;
        if (n == 0 && !(empty = ak_empty(f->s)))
            sleep_ms(10);
    }
    ferry_sample_queue_close(q);   /* its last deferred removals */
    char **keys = NULL;
    size_t orphans = 0;
    assert_int_equal(ferry_store_list(f->s, "ferry/rl/ak/", NULL, 1000, &keys, &orphans, NULL, NULL), 0);
    for (size_t i = 0; i < orphans && i < 5; i++)
        print_message("orphan payload: %s\n", keys[i]);
    ferry_store_free(keys);
    print_message("%d consumers killed inside ack; the drain then popped %d samples, %d of them "
                  "without a payload; queue empty: %s; payload objects left: %zu\n", kills,
                  drained, missing, empty ? "yes" : "no", orphans);
    assert_true(kills >= 30);
    assert_int_equal(read_errors, 0);
    assert_true(empty);
    assert_int_equal(missing, 0);
    assert_int_equal(orphans, 0);
}

/* ---- the master killed mid-flow ------------------------------------------------------------- */

enum { FLOW_N = 240 };
typedef struct flow {
    fixture *f;
    ferry_store *ps, *cs;        /* producer's and consumer's own connections */
    volatile int produced_n;
    int pushed_rc[FLOW_N];
    int trained[FLOW_N];
    volatile bool producer_done, consumer_done, stop;
    volatile bool killed;
    volatile int restarted;
    int consumer_err;
} flow;

static void *flow_producer(void *p)
{
    flow *fl = p;
    ferry_sample_queue_config qc = { .input_version = 1, .push_timeout_ms = 30000 };
    snprintf(qc.queue, sizeof qc.queue, "flow");
    ferry_sample_queue *q = NULL;
    if (ferry_sample_queue_open(fl->ps, &qc, &q, NULL) < 0) {
        fl->producer_done = true;
        return NULL;
    }
    for (int i = 0; i < FLOW_N; i++) {
        char sid[16];
        snprintf(sid, sizeof sid, "f%03d", i);
        fl->pushed_rc[i] = push_one(q, sid, 1, i);
        fl->produced_n = i + 1;
    }
    ferry_sample_queue_close(q);
    fl->producer_done = true;
    return NULL;
}

static void *flow_consumer(void *p)
{
    flow *fl = p;
    ferry_sample_queue_config qc = { .input_version = 1, .lease_ms = 3000 };
    snprintf(qc.queue, sizeof qc.queue, "flow");
    ferry_sample_queue *q = NULL;
    if (ferry_sample_queue_open(fl->cs, &qc, &q, NULL) < 0) {
        fl->consumer_err = 1;
        fl->consumer_done = true;
        return NULL;
    }
    ferry_sample b[16];
    while (!fl->stop) {
        size_t n = 0;
        if (ferry_sample_pop(q, 16, b, &n, NULL) < 0 || n == 0) {
            sleep_ms(2);
            continue;
        }
        bool ok[16];
        (void)ferry_sample_ack(q, b, n, ok, NULL);
        for (size_t i = 0; i < n; i++) {
            int idx = atoi(b[i].session.session_id + 1);
            if (ok[i] && idx >= 0 && idx < FLOW_N)
                fl->trained[idx]++;
            ferry_sample_clear(&b[i]);
        }
    }
    ferry_sample_queue_close(q);
    fl->consumer_done = true;
    return NULL;
}

static void *flow_killer(void *p)
{
    flow *fl = p;
    while (fl->produced_n < FLOW_N / 3)
        sleep_ms(1);
    ft_proc_kill(&fl->f->c.master, SIGKILL);
    fl->killed = true;
    static const char *const extra[] = { "--heartbeat-timeout", "10000", NULL };
    fl->restarted = ft_master_restart(&fl->f->c, extra) == 0 ? 1 : -1;
    while (!fl->stop)   /* the master dies with the thread that started it */
        sleep_ms(5);
    return NULL;
}

static void test_master_kill9_flow(void **state)
{
    fixture *f = *state;
    static flow fl;
    memset(&fl, 0, sizeof fl);
    fl.f = f;
    ferry_store_config cfg;
    ft_store_config(&f->c, &cfg);
    cfg.lease_ms = 1;
    assert_int_equal(ferry_store_open(&cfg, &fl.ps, NULL), 0);
    assert_int_equal(ferry_store_open(&cfg, &fl.cs, NULL), 0);
    pthread_t tp, tc, tk;
    assert_int_equal(pthread_create(&tk, NULL, flow_killer, &fl), 0);
    assert_int_equal(pthread_create(&tc, NULL, flow_consumer, &fl), 0);
    assert_int_equal(pthread_create(&tp, NULL, flow_producer, &fl), 0);
    pthread_join(tp, NULL);
    /* drain: wait until every pushed sample was trained (deadline 60 s) */
    int produced = 0, trained = 0;
    for (int w = 0; w < 6000; w++) {
        produced = trained = 0;
        for (int i = 0; i < FLOW_N; i++) {
            produced += fl.pushed_rc[i] == 0;
            trained += fl.pushed_rc[i] == 0 && fl.trained[i] >= 1;
        }
        if (fl.restarted && trained == produced)
            break;
        sleep_ms(10);
    }
    fl.stop = true;
    pthread_join(tc, NULL);
    pthread_join(tk, NULL);
    assert_true(fl.killed);
    assert_int_equal(fl.restarted, 1);
    assert_int_equal(fl.consumer_err, 0);
    int lost = 0, dup = 0, failed = 0;
    for (int i = 0; i < FLOW_N; i++) {
        if (fl.pushed_rc[i] != 0) {
            failed++;
            continue;
        }
        lost += fl.trained[i] == 0;
        dup += fl.trained[i] > 1;
    }
    print_message("master kill -9 mid-flow: %d produced, %d trained, %d push calls failed, "
                  "lost %d, duplicated %d\n", produced, trained, failed, lost, dup);
    assert_int_equal(failed, 0);   /* pushes ride out the restart */
    assert_int_equal(lost, 0);
    assert_int_equal(dup, 0);
    ferry_store_close(fl.ps);
    ferry_store_close(fl.cs);
}

/* ---- the KV-reuse gate ----------------------------------------------------------------------- */

static void test_kv_gate(void **state)
{
    fixture *f = *state;
    ferry_kvcache_stats st = {0};
    char ref1[512], ref1b[512], ref2[512];
    uint8_t kv[4096], got[4096];
    ft_pattern(kv, sizeof kv, 5, 0);
    assert_int_equal(ferry_kvcache_put(f->s, "llm", 1, "ep1", kv, sizeof kv, ref1, sizeof ref1, &st, NULL), 0);
    assert_int_equal(ferry_kvcache_put(f->s, "llm", 1, "ep2", kv, 100, ref1b, sizeof ref1b, &st, NULL), 0);
    assert_int_equal(ferry_kvcache_put(f->s, "llm", 2, "ep1", kv, 200, ref2, sizeof ref2, &st, NULL), 0);
    assert_int_equal(ferry_store_put(f->s, "user/obj", kv, 10, NULL, NULL, NULL), 0);
    uint64_t v = 0;
    assert_int_equal(ferry_kvcache_ref_version(ref1, &v), 0);
    assert_int_equal(v, 1);
    size_t len = 0;
    assert_int_equal(ferry_kvcache_get(f->s, ref1, 1, got, sizeof got, &len, &st, NULL), 0);
    assert_int_equal(len, sizeof kv);
    assert_memory_equal(got, kv, sizeof kv);
    memset(got, 0, sizeof got);
    assert_int_equal(ferry_kvcache_get(f->s, ref1, 2, got, sizeof got, &len, &st, NULL), FERRY_ESTALE);
    assert_int_equal(got[0], 0);   /* nothing read */
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.refused, 1);
    assert_int_equal(st.stored, 3);
    uint64_t removed = 0;
    int rc = FERRY_EBUSY;
    for (int i = 0; i < 500; i++) {   /* the read's lease is 1 ms */
        rc = ferry_kvcache_retire(f->s, "llm", 1, &removed, &st, NULL);
        if (rc == 0 && ferry_store_exist(f->s, ref1 + 8, NULL) == 0)
            break;
        sleep_ms(5);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(st.retired, 2);
    assert_int_equal(ferry_store_exist(f->s, ref1 + 8, NULL), 0);
    assert_int_equal(ferry_store_exist(f->s, ref1b + 8, NULL), 0);
    assert_int_equal(ferry_store_exist(f->s, ref2 + 8, NULL), 1);   /* other versions stay */
    assert_int_equal(ferry_store_exist(f->s, "user/obj", NULL), 1); /* and every other key */
    assert_int_equal(ferry_kvcache_get(f->s, ref2, 2, got, sizeof got, &len, &st, NULL), 0);
    assert_int_equal(len, 200);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--consumer"))
        return consumer_main(argv + 2);
    if (argc == 3 && !strcmp(argv[1], "--acker"))
        return acker_main(argv + 2);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_roundtrip),
        cmocka_unit_test(test_version_rules),
        cmocka_unit_test_setup_teardown(test_policy_registry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_and_ack, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backpressure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redelivery_after_kill9, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ack_killed_no_orphan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_kill9_flow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kv_gate, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
