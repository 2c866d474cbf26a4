/* `ferry-lab demo rl`'s child processes: rollout/update disaggregation end to
 * end. Rollouts watch the policy registry, load each new version's weights
 * (checksum-verified and value-checked), and produce synthetic samples
 * (token ids, logprobs, rewards) at a set rate into a bounded sample queue;
 * they also recompute samples the update side sent back. Update processes,
 * on the parent's word, pop a batch under a lease with the staleness rule,
 * "train" for a set time, ack, and publish the next policy version through
 * the weights backend (one collective publish by every update process).
 *
 * Every member writes a ledger (one file per process incarnation, one line
 * per write, so a SIGKILL from the parent loses nothing written before it):
 * what it is about to push and what it pushed, the deliveries it holds and
 * the acks that held. The parent accounts over the ledgers and the queue's
 * claim log (demo_rl_tally.c). */
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lab.h"
#include "demo.h"
#include "demo_rl.h"

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = { (time_t)s, (long)((s - floor(s)) * 1e9) };
    nanosleep(&ts, NULL);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static float weight_value(uint64_t v, uint64_t i) { return (float)(v * 1000 + i % 997); }

ferry_store *demo_rl_open_store(const char *addr)
{
    ferry_error fe = {0};
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.lease_ms = 1;
    ferry_store *s = NULL;
    if (ferry_store_open(&cfg, &s, &fe) < 0) {
        printf("ERR cannot reach the master at %s: %s\n", addr, fe.msg);
        fflush(stdout);
        return NULL;
    }
    return s;
}

FILE *demo_rl_ledger(const char *dir, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f)
        setvbuf(f, NULL, _IOLBF, 0);   /* each line one write: a kill cuts at most the last */
    return f;
}

/* A line on stdin starting with word within timeout_ms; EOF (the parent is
 * gone) counts as one. */
static bool stdin_says(const char *word, int timeout_ms)
{
    struct pollfd p = { .fd = 0, .events = POLLIN };
    if (poll(&p, 1, timeout_ms) <= 0)
        return false;
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return true;
    return strncmp(line, word, strlen(word)) == 0;
}

/* ---- rollout process ------------------------------------------------------------------- */

typedef struct load_ctx { uint64_t v; uint64_t bad; } load_ctx;

static int check_tensor(void *ctx, const ferry_weight_entry *e, const void *data)
{
    load_ctx *c = ctx;
    const float *f = data;
    for (uint64_t i = 0; i < e->bytes / 4; i += 1 + i / 64)
        if (f[i] != weight_value(c->v, i))
            c->bad++;
    return 0;
}

typedef struct rollout {
    ferry_store *s;
    ferry_sample_queue *q;
    FILE *led;
    int32_t *tok;
    float *lp;
    uint64_t ntok, rng, version, produced, recomputed;
} rollout;

/* The sample's uid, from the payload key in its refs
 * ("store://ferry/rl/Q/<version>/<uid>#tokens"). */
static const char *ref_uid(const char *ref, char *out)
{
    const char *hash = strrchr(ref, '#'), *p = hash;
    while (p && p > ref && p[-1] != '/')
        p--;
    size_t n = p && hash > p ? (size_t)(hash - p) : 0;
    snprintf(out, 17, "%.*s", (int)(n < 16 ? n : 16), p ? p : "");
    return out;
}

/* Push one sample of session sid under the current version: "A" before,
 * "P sid uid version" after it landed, "F" when it did not. */
static int push_one(rollout *r, const char *sid, const char *episode, uint64_t seq,
                    ferry_error *err)
{
    ferry_rollout_session rs = { .policy_version = r->version };
    snprintf(rs.session_id, sizeof rs.session_id, "%s", sid);
    snprintf(rs.episode_id, sizeof rs.episode_id, "%s", episode);
    snprintf(rs.request_id, sizeof rs.request_id, "req%" PRIu64, seq);
    for (uint64_t k = 0; k < r->ntok; k++) {
        r->tok[k] = (int32_t)(mix(r->rng++) % 151936);
        r->lp[k] = -(float)(mix(r->rng++) % 1000) / 250.0f;
    }
    float reward = (float)(mix(r->rng++) % 2);
    ferry_sample_data d = { .tokens = r->tok, .ntokens = r->ntok, .logprobs = r->lp,
                            .rewards = &reward, .nrewards = 1 };
    fprintf(r->led, "A %s\n", sid);
    int rc = ferry_sample_push(r->q, &rs, &d, NULL, err);
    char uid[17];
    if (rc == 0) {
        fprintf(r->led, "P %s %s %" PRIu64 "\n", sid, ref_uid(rs.output_ref, uid), r->version);
        r->produced++;
    } else {
        fprintf(r->led, "F %s\n", sid);
    }
    ferry_rollout_session_clear(&rs);
    return rc;
}

/* A new policy: load its weights before producing with it. */
static void load_version(rollout *r, const char *model, unsigned rank, uint64_t want,
                         ferry_error *err)
{
    double t0 = cli_now();
    uint64_t g = 0;
    load_ctx lc = { .v = want };
    ferry_update_stats ust;
    int lr = ferry_weights_update_compat(r->s, model, &g, check_tensor, &lc, &ust, err);
    if (lr == 0 && g == want) {
        fprintf(r->led, "W %" PRIu64 " %.6f %" PRIu64 "\n", g, cli_now() - t0, lc.bad);
        r->version = g;
    } else if (lr < 0) {
        fprintf(stderr, "rollout %u: loading version %" PRIu64 ": %s\n", rank, want, err->msg);
    } else {
        r->version = g;   /* a newer one landed meanwhile: take it */
    }
}

/* Samples the update side sent back: each request is acked first, then
 * redone once under this version, so a kill in between loses the redo
 * (the sample stays accounted as sent back) and never makes two. *stop:
 * the parent said stop while a push waited for room. */
static void recompute_some(rollout *r, bool *stop, ferry_error *err)
{
    ferry_sample back[8];
    size_t nb = 0;
    if (ferry_sample_pop_recompute(r->q, 8, back, &nb, err) < 0)
        return;
    for (size_t i = 0; i < nb; i++) {
        if (*stop) {   /* handed back now, not when the lease lapses: the drain reads them */
            (void)ferry_sample_release(r->q, &back[i], 1, NULL);
            ferry_sample_clear(&back[i]);
            continue;
        }
        char sid[FERRY_RECORD_ID_MAX + 1];
        snprintf(sid, sizeof sid, "%.100s+", back[i].session.session_id);
        fprintf(r->led, "B %s\n", back[i].session.session_id);
        bool acked = ferry_sample_ack(r->q, &back[i], 1, NULL, NULL) == 0;
        while (acked && !*stop) {
            int rc = push_one(r, sid, back[i].session.episode_id, 0, err);
            if (rc == 0) {
                r->recomputed++;
                break;
            }
            if (rc != FERRY_ETIMEDOUT || stdin_says("stop", 0))
                *stop = true;
        }
        ferry_sample_clear(&back[i]);
    }
}

/* argv: worker rl-rollout MASTER RANK INC MODEL QUEUE DIR RATE TOKENS BOUND LEASE_MS */
int demo_rl_rollout_main(int argc, char **argv)
{
    if (argc != 11)
        return 2;
    const char *addr = argv[1], *model = argv[4], *queue = argv[5], *dir = argv[6];
    unsigned rank = (unsigned)atoi(argv[2]), inc = (unsigned)atoi(argv[3]);
    double rate = atof(argv[7]);
    rollout r = { .ntok = strtoull(argv[8], NULL, 10), .rng = mix(rank * 1000003u + inc + 1) };
    uint64_t bound = strtoull(argv[9], NULL, 10), lease = strtoull(argv[10], NULL, 10);
    if (!(r.s = demo_rl_open_store(addr)))
        return 1;
    /* a short wait for room, so a full queue never keeps it from hearing "stop" */
    ferry_sample_queue_config qc = { .bound = bound, .push_timeout_ms = 500, .lease_ms = lease };
    snprintf(qc.queue, sizeof qc.queue, "%s", queue);
    ferry_policy_watch *w = NULL;
    ferry_error err = {0};
    if (ferry_sample_queue_open(r.s, &qc, &r.q, &err) < 0 ||
        ferry_policy_watch_open(r.s, model, &w, &err) < 0) {
        printf("ERR rollout %u: %s\n", rank, err.msg);
        return 1;
    }
    char name[64];
    snprintf(name, sizeof name, "roll-%u-%u", rank, inc);
    r.led = demo_rl_ledger(dir, name);
    r.tok = malloc(r.ntok * sizeof *r.tok);
    r.lp = malloc(r.ntok * sizeof *r.lp);
    if (!r.led || !r.tok || !r.lp) {
        printf("ERR rollout %u: cannot write in %s\n", rank, dir);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    uint64_t seq = 0;
    double next = cli_now();
    int rc = 0;
    bool stop = false;
    while (!stop && !stdin_says("stop", 0)) {
        ferry_policy_version pv;
        int wr = ferry_policy_watch_next(w, r.version ? 0 : 100, &pv, &err);
        if (wr == 0) {
            load_version(&r, model, rank, pv.version, &err);
            ferry_policy_version_clear(&pv);
        } else if (wr != FERRY_ETIMEDOUT) {
            printf("ERR rollout %u: watching the policy: %s\n", rank, ferry_strerror(wr));
            rc = 1;
            break;
        }
        if (!r.version)
            continue;
        recompute_some(&r, &stop, &err);
        /* one new sample; the incarnation in its id keeps a restarted member's ids new */
        char sid[64], ep[64];
        snprintf(sid, sizeof sid, "r%u.%u-%06" PRIu64, rank, inc, seq);
        snprintf(ep, sizeof ep, "ep%u.%u-%" PRIu64, rank, inc, seq / 8);
        int pr = push_one(&r, sid, ep, seq, &err);
        seq++;
        if (pr != 0 && pr != FERRY_ETIMEDOUT) {
            printf("ERR rollout %u: push: %s\n", rank, err.msg);
            rc = 1;
            break;
        }
        if (rate > 0) {
            next += 1.0 / rate;
            double now = cli_now();
            if (next > now)
                sleep_s(next - now);
            else if (now - next > 1.0)
                next = now;   /* fell behind: do not burst */
        }
    }
    fprintf(r.led, "E\n");
    fclose(r.led);
    ferry_sample_stats st;
    ferry_sample_queue_stats(r.q, &st);
    if (rc == 0)
        printf("OK %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", r.produced, r.recomputed, st.push_waits);
    fflush(stdout);
    free(r.tok);
    free(r.lp);
    ferry_policy_watch_close(w);
    ferry_sample_queue_close(r.q);
    ferry_store_close(r.s);
    return rc;
}

/* ---- update process ------------------------------------------------------------------- */

static int publish_version(ferry_store *s, const char *model, unsigned rank, unsigned world,
                           uint64_t v, uint64_t bytes, float *buf, double *secs, ferry_error *err)
{
    uint32_t rank_node[RL_POOL_MAX] = { 0 };
    ferry_publisher_config pc = { .rank = rank, .world = world, .rank_node = rank_node,
                                  .timeout_ms = FERRY_DEFAULT_TIMEOUT_MS };
    snprintf(pc.model, sizeof pc.model, "%s", model);
    uint64_t per = bytes / RL_NT / 4;
    char names[RL_NT][32];
    ferry_weight_tensor t[RL_NT];
    for (int k = 0; k < RL_NT; k++) {
        snprintf(names[k], sizeof names[k], "layers.%d.weight", k);
        for (uint64_t i = 0; i < per; i++)
            buf[(uint64_t)k * per + i] = weight_value(v, i);
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = "f32", .ndim = 1,
                                      .shape = { per }, .data = buf + (uint64_t)k * per };
    }
    char meta[96];
    snprintf(meta, sizeof meta, "{\"algorithm\":\"grpo\",\"demo\":\"ferry-lab demo rl\"}");
    ferry_policy_version pv = { .version = v, .parent = v - 1, .created_at_step = v - 1,
                                .metadata = meta };
    double t0 = cli_now();
    int rc = ferry_policy_publish(s, &pc, &pv, t, RL_NT, NULL, err);
    *secs = cli_now() - t0;
    return rc;
}

int64_t demo_rl_train(ferry_sample_queue *q, unsigned want, bool drain, double train_ms,
                      uint64_t ntok, FILE *led, uint64_t *popped, ferry_error *err)
{
    ferry_sample *b = calloc(want, sizeof *b);
    int32_t *tok = malloc(ntok * sizeof *tok);
    float *lp = malloc(ntok * sizeof *lp);
    bool *ok = calloc(want, sizeof *ok);
    if (!b || !tok || !lp || !ok) {
        free(b), free(tok), free(lp), free(ok);
        return -1;
    }
    size_t got = 0;
    int64_t res = 0;
    double deadline = cli_now() + 120;
    while (got < want && cli_now() < deadline) {
        ferry_sample_stats s0, s1;
        ferry_sample_queue_stats(q, &s0);
        size_t n = 0;
        int rc = ferry_sample_pop(q, want - (unsigned)got, b + got, &n, err);
        if (rc < 0 && rc != FERRY_ECONNRESET) {
            res = -1;
            break;
        }
        ferry_sample_queue_stats(q, &s1);
        if (popped)
            *popped += s1.popped - s0.popped;
        for (size_t i = got; i < got + n; i++)   /* held from here on */
            fprintf(led, "L %016" PRIx64 " %" PRIu64 " %" PRIu32 " %" PRIu64 " %s\n", b[i].uid,
                    b[i].id, b[i].token, b[i].popped_at_ms - b[i].pushed_at_ms,
                    b[i].session.session_id);
        for (size_t i = got; i < got + n; i++) {
            float rw = 0;
            if (ferry_sample_read(q, &b[i], NULL, tok, lp, &rw, err) < 0)
                fprintf(stderr, "update: %s\n", err->msg);
        }
        got += n;
        if (drain && s1.popped == s0.popped)
            break;   /* the queue had nothing ready */
        if (!n)
            sleep_s(0.002);
    }
    if (res == 0) {
        /* GRPO: advantage = reward - mean reward of the batch; the step itself is simulated */
        sleep_s(train_ms / 1000.0);
        (void)ferry_sample_ack(q, b, got, ok, err);
        for (size_t i = 0; i < got; i++)
            if (ok[i]) {
                fprintf(led, "T %016" PRIx64 " %" PRIu64 " %" PRIu32 "\n", b[i].uid, b[i].id,
                        b[i].token);
                res++;
            }
    } else {
        (void)ferry_sample_release(q, b, got, NULL);
    }
    for (size_t i = 0; i < got; i++)
        ferry_sample_clear(&b[i]);
    free(ok);
    free(b);
    free(tok);
    free(lp);
    return res;
}

/* argv: worker rl-update MASTER RANK INC MODEL QUEUE DIR BATCH TRAIN_MS LAG RECOMPUTE TOKENS
 * WEIGHT_BYTES LEASE_MS VERSION. Commands on stdin: "train" (one batch; "OK trained N"),
 * "publish V WORLD" (collectively, as rank RANK of WORLD; "OK published SECONDS"), "stop". */
int demo_rl_update_main(int argc, char **argv)
{
    if (argc != 15)
        return 2;
    const char *addr = argv[1], *model = argv[4], *queue = argv[5], *dir = argv[6];
    unsigned rank = (unsigned)atoi(argv[2]), inc = (unsigned)atoi(argv[3]);
    unsigned batch = (unsigned)atoi(argv[7]);
    double train_ms = atof(argv[8]);
    uint32_t lag = (uint32_t)atoi(argv[9]);
    bool recompute = atoi(argv[10]) != 0;
    uint64_t ntok = strtoull(argv[11], NULL, 10), wbytes = strtoull(argv[12], NULL, 10);
    uint64_t lease = strtoull(argv[13], NULL, 10), version = strtoull(argv[14], NULL, 10);
    ferry_store *s = demo_rl_open_store(addr);
    if (!s)
        return 1;
    ferry_sample_queue_config qc = { .input_version = version, .max_policy_lag = lag,
                                     .stale_policy = recompute ? FERRY_STALE_RECOMPUTE
                                                               : FERRY_STALE_DROP,
                                     .lease_ms = lease };
    snprintf(qc.queue, sizeof qc.queue, "%s", queue);
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    if (ferry_sample_queue_open(s, &qc, &q, &err) < 0) {
        printf("ERR update %u: %s\n", rank, err.msg);
        return 1;
    }
    char name[64];
    snprintf(name, sizeof name, "upd-%u-%u", rank, inc);
    FILE *led = demo_rl_ledger(dir, name);
    float *wbuf = malloc(wbytes + 64);
    if (!led || !wbuf) {
        printf("ERR update %u: cannot write in %s\n", rank, dir);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    char line[128];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, stdin)) {
        unsigned long long v = 0;
        unsigned world = 0;
        if (!strncmp(line, "train", 5)) {
            int64_t n = demo_rl_train(q, batch, false, train_ms, ntok, led, NULL, &err);
            if (n < 0)
                rc = -1;
            else
                printf("OK trained %" PRId64 "\n", n);
        } else if (sscanf(line, "publish %llu %u", &v, &world) == 2) {
            double secs = 0;
            rc = publish_version(s, model, rank, world, v, wbytes, wbuf, &secs, &err);
            if (rc == 0) {
                fprintf(led, "U %.6f\n", secs);
                ferry_sample_queue_set_version(q, v);
                printf("OK published %.6f\n", secs);
            }
        } else {
            break;   /* "stop" */
        }
        fflush(stdout);
    }
    if (rc < 0)
        printf("ERR update %u: %s\n", rank, err.msg[0] ? err.msg : "stopped");
    else
        printf("OK stopped\n");
    fflush(stdout);
    fprintf(led, "E\n");
    fclose(led);
    free(wbuf);
    ferry_sample_queue_close(q);
    ferry_store_close(s);
    return rc < 0 ? 1 : 0;
}
