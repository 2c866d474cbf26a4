/* `ferry demo rl`: rollout/update disaggregation end to end. Separate
 * rollout and update processes on a local cluster (unless FERRY_MASTER is
 * set). Rollouts watch the policy registry, load each new version's
 * weights (checksum-verified and value-checked), and produce synthetic
 * samples (token ids, logprobs, rewards) at a set rate into a bounded
 * sample queue; they also recompute samples the update side sent back.
 * Update processes pop batches under a lease with the staleness rule,
 * "train" for a set time, ack, and publish the next policy version through
 * the weights backend (one collective publish by every update process).
 *
 * Accounting: every rollout writes the session ids it produced, every
 * update process the ids it trained and each admitted sample's push → pop
 * latency. produced = trained + dropped + sent to recompute + lost;
 * duplicated = ids trained more than once. */
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "demo_int.h"

typedef struct rl_opts {
    unsigned rollouts, updaters, steps, batch, tokens, lag;
    double rate;              /* samples/s per rollout (0: as fast as it can) */
    double train_ms;
    uint64_t weight_bytes, bound;
    bool recompute, json;
} rl_opts;

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

/* The policy weights of version v: NT f32 tensors, value(i) = v * 1000 + i % 997. */
#define NT 4
static float weight_value(uint64_t v, uint64_t i) { return (float)(v * 1000 + i % 997); }

static ferry_store *open_store(const char *addr)
{
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.lease_ms = 1;
    ferry_store *s = NULL;
    if (ferry_store_open(&cfg, &s) < 0) {
        printf("ERR cannot reach the master at %s: %s\n", addr, ferry_store_last_error());
        fflush(stdout);
        return NULL;
    }
    return s;
}

static bool stdin_says(const char *word, int timeout_ms)
{
    struct pollfd p = { .fd = 0, .events = POLLIN };
    if (poll(&p, 1, timeout_ms) <= 0)
        return false;
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return true;   /* EOF: the parent is gone */
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

/* argv: _demo_rl_rollout MASTER RANK MODEL QUEUE DIR RATE TOKENS BOUND */
int demo_rl_rollout_main(int argc, char **argv)
{
    if (argc != 9)
        return 2;
    const char *addr = argv[1], *model = argv[3], *queue = argv[4], *dir = argv[5];
    unsigned rank = (unsigned)atoi(argv[2]);
    double rate = atof(argv[6]);
    uint64_t ntok = strtoull(argv[7], NULL, 10), bound = strtoull(argv[8], NULL, 10);
    ferry_store *s = open_store(addr);
    if (!s)
        return 1;
    /* a short wait for room, so a full queue never keeps it from hearing "stop" */
    ferry_sample_queue_config qc = { .bound = bound, .push_timeout_ms = 500, .lease_ms = 30000 };
    snprintf(qc.queue, sizeof qc.queue, "%s", queue);
    ferry_sample_queue *q = NULL;
    ferry_policy_watch *w = NULL;
    ferry_error err = {0};
    if (ferry_sample_queue_open(s, &qc, &q, &err) < 0 || ferry_policy_watch_open(s, model, &w) < 0) {
        printf("ERR rollout %u: %s\n", rank, err.msg[0] ? err.msg : "cannot watch the policy");
        return 1;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/produced-%u", dir, rank);
    FILE *ids = fopen(path, "w");
    snprintf(path, sizeof path, "%s/load-%u", dir, rank);
    FILE *loads = fopen(path, "w");
    if (!ids || !loads) {
        printf("ERR rollout %u: cannot write in %s\n", rank, dir);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);

    int32_t *tok = malloc(ntok * sizeof *tok);
    float *lp = malloc(ntok * sizeof *lp);
    uint64_t version = 0, produced = 0, recomputed = 0, bad = 0, seq = 0;
    uint64_t rng = mix(rank + 1);
    double next = cli_now();
    int rc = 0;
    for (;;) {
        if (stdin_says("stop", 0))
            break;
        ferry_policy_version pv;
        int wr = ferry_policy_watch_next(w, version ? 0 : 100, &pv, &err);
        if (wr == 0) {
            /* a new policy: load its weights before producing with it */
            double t0 = cli_now();
            uint64_t g = 0;
            load_ctx lc = { .v = pv.version };
            ferry_update_stats ust;
            int lr = ferry_weights_update_compat(s, model, &g, check_tensor, &lc, &ust, &err);
            if (lr == 0 && g == pv.version) {
                fprintf(loads, "%.6f %" PRIu64 "\n", cli_now() - t0, g);
                version = g;
                bad += lc.bad;
            } else if (lr < 0) {
                fprintf(stderr, "rollout %u: loading version %" PRIu64 ": %s\n", rank,
                        pv.version, err.msg);
            } else {
                version = g;   /* a newer one landed meanwhile: take it */
            }
            ferry_policy_version_clear(&pv);
        } else if (wr != FERRY_ETIMEDOUT) {
            printf("ERR rollout %u: watching the policy: %s\n", rank, ferry_strerror(wr));
            rc = 1;
            break;
        }
        if (!version)
            continue;
        /* samples the update side sent back: redo them under this version */
        ferry_sample back[8];
        size_t nb = 0;
        if (ferry_sample_pop_recompute(q, 8, back, &nb, &err) == 0) {
            for (size_t i = 0; i < nb; i++) {
                ferry_rollout_session rs = { .policy_version = version };
                snprintf(rs.session_id, sizeof rs.session_id, "%.100s+", back[i].session.session_id);
                snprintf(rs.episode_id, sizeof rs.episode_id, "%s", back[i].session.episode_id);
                for (uint64_t k = 0; k < ntok; k++) {
                    tok[k] = (int32_t)(mix(rng++) % 151936);
                    lp[k] = -(float)(mix(rng++) % 1000) / 250.0f;
                }
                float reward = (float)(mix(rng++) % 2);
                ferry_sample_data d = { .tokens = tok, .ntokens = ntok, .logprobs = lp,
                                        .rewards = &reward, .nrewards = 1 };
                if (ferry_sample_push(q, &rs, &d, NULL, &err) == 0) {
                    fprintf(ids, "%s\n", rs.session_id);
                    produced++;
                    recomputed++;
                    (void)ferry_sample_ack(q, &back[i], 1, NULL, NULL);
                } else {
                    (void)ferry_sample_release(q, &back[i], 1);
                }
                ferry_rollout_session_clear(&rs);
                ferry_sample_clear(&back[i]);
            }
        }
        /* one new sample */
        ferry_rollout_session rs = { .policy_version = version };
        snprintf(rs.session_id, sizeof rs.session_id, "r%u-%06" PRIu64, rank, seq);
        snprintf(rs.episode_id, sizeof rs.episode_id, "ep%u-%" PRIu64, rank, seq / 8);
        snprintf(rs.request_id, sizeof rs.request_id, "req%" PRIu64, seq);
        seq++;
        for (uint64_t k = 0; k < ntok; k++) {
            tok[k] = (int32_t)(mix(rng++) % 151936);
            lp[k] = -(float)(mix(rng++) % 1000) / 250.0f;
        }
        float reward = (float)(mix(rng++) % 2);
        ferry_sample_data d = { .tokens = tok, .ntokens = ntok, .logprobs = lp,
                                .rewards = &reward, .nrewards = 1 };
        int pr = ferry_sample_push(q, &rs, &d, NULL, &err);
        ferry_rollout_session_clear(&rs);
        if (pr == 0) {
            fprintf(ids, "%s\n", rs.session_id);
            produced++;
        } else if (pr != FERRY_ETIMEDOUT) {
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
    fclose(ids);
    fclose(loads);
    ferry_sample_stats st;
    ferry_sample_queue_stats(q, &st);
    if (rc == 0)
        printf("OK %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", produced, recomputed,
               st.push_waits, bad);
    fflush(stdout);
    free(tok);
    free(lp);
    ferry_policy_watch_close(w);
    ferry_sample_queue_close(q);
    ferry_store_close(s);
    return rc;
}

/* ---- update process ------------------------------------------------------------------- */

static int publish_version(ferry_store *s, const char *model, unsigned rank, unsigned world,
                           uint64_t v, uint64_t bytes, float *buf, double *secs, ferry_error *err)
{
    uint32_t rank_node[64] = { 0 };
    ferry_publisher_config pc = { .rank = rank, .world = world, .rank_node = rank_node,
                                  .timeout_ms = 60000 };
    snprintf(pc.model, sizeof pc.model, "%s", model);
    uint64_t per = bytes / NT / 4;
    char names[NT][32];
    ferry_weight_tensor t[NT];
    for (int k = 0; k < NT; k++) {
        snprintf(names[k], sizeof names[k], "layers.%d.weight", k);
        for (uint64_t i = 0; i < per; i++)
            buf[(uint64_t)k * per + i] = weight_value(v, i);
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = "f32", .ndim = 1,
                                      .shape = { per }, .data = buf + (uint64_t)k * per };
    }
    char meta[96];
    snprintf(meta, sizeof meta, "{\"algorithm\":\"grpo\",\"demo\":\"ferry demo rl\"}");
    ferry_policy_version pv = { .version = v, .parent = v - 1, .created_at_step = v - 1,
                                .metadata = meta };
    double t0 = cli_now();
    int rc = ferry_policy_publish(s, &pc, &pv, t, NT, NULL, err);
    *secs = cli_now() - t0;
    return rc;
}

/* Pop until `want` samples are admitted (or, draining, until the queue
 * stays empty for a while); "train" on them; ack. Returns trained count. */
static int64_t train_batch(ferry_sample_queue *q, unsigned want, bool drain, double train_ms,
                           uint64_t ntok, FILE *trained, FILE *lat, ferry_error *err)
{
    ferry_sample *b = calloc(want, sizeof *b);
    int32_t *tok = malloc(ntok * sizeof *tok);
    float *lp = malloc(ntok * sizeof *lp);
    size_t got = 0;
    double idle_since = cli_now(), deadline = cli_now() + 120;
    while (got < want && cli_now() < deadline) {
        size_t n = 0;
        int rc = ferry_sample_pop(q, want - (unsigned)got, b + got, &n, err);
        if (rc < 0 && rc != FERRY_ECONNRESET) {
            got = 0;
            break;
        }
        for (size_t i = got; i < got + n; i++) {
            fprintf(lat, "%" PRIu64 "\n", b[i].popped_at_ms - b[i].pushed_at_ms);
            float rw = 0;
            if (ferry_sample_read(q, &b[i], NULL, tok, lp, &rw, err) < 0)
                fprintf(stderr, "update: %s\n", err->msg);
        }
        got += n;
        if (n)
            idle_since = cli_now();
        else if (drain && cli_now() - idle_since > 0.5)
            break;
        else
            sleep_s(0.002);
    }
    /* GRPO: advantage = reward - mean reward of the batch; the step itself is simulated */
    sleep_s(train_ms / 1000.0);
    bool *ok = calloc(want ? want : 1, sizeof *ok);
    (void)ferry_sample_ack(q, b, got, ok, err);
    int64_t n_ok = 0;
    for (size_t i = 0; i < got; i++) {
        if (ok[i]) {
            fprintf(trained, "%s\n", b[i].session.session_id);
            n_ok++;
        }
        ferry_sample_clear(&b[i]);
    }
    free(ok);
    free(b);
    free(tok);
    free(lp);
    return n_ok;
}

/* argv: _demo_rl_update MASTER RANK WORLD MODEL QUEUE DIR STEPS BATCH TRAIN_MS LAG RECOMPUTE
 * TOKENS WEIGHT_BYTES */
int demo_rl_update_main(int argc, char **argv)
{
    if (argc != 14)
        return 2;
    const char *addr = argv[1], *model = argv[4], *queue = argv[5], *dir = argv[6];
    unsigned rank = (unsigned)atoi(argv[2]), world = (unsigned)atoi(argv[3]);
    unsigned steps = (unsigned)atoi(argv[7]), batch = (unsigned)atoi(argv[8]);
    double train_ms = atof(argv[9]);
    uint32_t lag = (uint32_t)atoi(argv[10]);
    bool recompute = atoi(argv[11]) != 0;
    uint64_t ntok = strtoull(argv[12], NULL, 10), wbytes = strtoull(argv[13], NULL, 10);
    ferry_store *s = open_store(addr);
    if (!s)
        return 1;
    ferry_sample_queue_config qc = { .input_version = 1, .max_policy_lag = lag,
                                     .stale_policy = recompute ? FERRY_STALE_RECOMPUTE
                                                               : FERRY_STALE_DROP,
                                     .lease_ms = 30000 };
    snprintf(qc.queue, sizeof qc.queue, "%s", queue);
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    if (ferry_sample_queue_open(s, &qc, &q, &err) < 0) {
        printf("ERR update %u: %s\n", rank, err.msg);
        return 1;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/trained-%u", dir, rank);
    FILE *trained = fopen(path, "w");
    snprintf(path, sizeof path, "%s/latency-%u", dir, rank);
    FILE *lat = fopen(path, "w");
    snprintf(path, sizeof path, "%s/publish-%u", dir, rank);
    FILE *pubs = fopen(path, "w");
    float *wbuf = malloc(wbytes + 64);
    if (!trained || !lat || !pubs || !wbuf) {
        printf("ERR update %u: cannot write in %s\n", rank, dir);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    /* the initial policy (version 1), then one version per step */
    double secs = 0;
    int rc = stdin_says("go", -1) ? 0 : -1;
    if (rc == 0 && (rc = publish_version(s, model, rank, world, 1, wbytes, wbuf, &secs, &err)) == 0)
        fprintf(pubs, "%.6f\n", secs);
    uint64_t total = 0;
    for (unsigned k = 1; rc == 0 && k <= steps; k++) {
        int64_t n = train_batch(q, batch, false, train_ms, ntok, trained, lat, &err);
        if (n < 0) {
            rc = -1;
            break;
        }
        total += (uint64_t)n;
        rc = publish_version(s, model, rank, world, k + 1, wbytes, wbuf, &secs, &err);
        if (rc == 0) {
            fprintf(pubs, "%.6f\n", secs);
            ferry_sample_queue_set_version(q, k + 1);
            if (rank == 0)
                cli_progress_text("step %u/%u: version %u published, %" PRIu64 " samples trained",
                                  k, steps, k + 1, total);
        }
    }
    if (rc < 0) {
        printf("ERR update %u: %s\n", rank, err.msg[0] ? err.msg : "stopped");
        fflush(stdout);
        return 1;
    }
    printf("OK %" PRIu64 " trained in the steps\n", total);
    fflush(stdout);
    /* the rollouts stop; what is left is trained at the last version (or
     * handled as stale) */
    if (stdin_says("drain", 120000))
        for (;;) {
            int64_t n = train_batch(q, 256, true, 0, ntok, trained, lat, &err);
            if (n <= 0)
                break;
            total += (uint64_t)n;
        }
    fclose(trained);
    fclose(lat);
    fclose(pubs);
    ferry_sample_stats st;
    ferry_sample_queue_stats(q, &st);
    printf("OK %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
           "\n", total, st.popped, st.stale, st.dropped, st.recompute, st.duplicates, st.admitted);
    fflush(stdout);
    free(wbuf);
    ferry_sample_queue_close(q);
    ferry_store_close(s);
    return 0;
}

/* ---- the parent -------------------------------------------------------------------------- */

static void usage_rl(FILE *f)
{
    fprintf(f,
            "usage: ferry demo rl [--rollouts N (3)] [--updaters N (1)] [--steps N (6)] [--batch N (64)]\n"
            "                     [--rate SAMPLES_PER_S (60)] [--train-ms MS (100)] [--max-policy-lag K (0)]\n"
            "                     [--stale drop|recompute (recompute)] [--tokens N (256)]\n"
            "                     [--bound N (2 x batch x updaters)] [--weights SIZE (8M)] [--json]\n"
            "\n"
            "Rollout and update processes exchange samples through a sample queue and policy\n"
            "versions through the weights registry; every sample is accounted for.\n");
}

static int parse_rl(int argc, char **argv, rl_opts *o)
{
    *o = (rl_opts){ .rollouts = 3, .updaters = 1, .steps = 6, .batch = 64, .tokens = 256,
                    .lag = 0, .rate = 60, .train_ms = 100, .weight_bytes = 8u << 20,
                    .bound = 0, .recompute = true };
    cli_getopt g;
    cli_getopt_init(&g, "demo rl", argc, argv,
                    "rollouts=,updaters=,steps=,batch=,tokens=,bound=,max-policy-lag=,rate=,"
                    "train-ms=,stale=,weights=,json");
    while (cli_getopt_next(&g)) {
        const char *a = g.opt, *v = g.val;
        int rc = 0;
        if (!strcmp(a, "--json"))
            o->json = true;
        else if (!strcmp(a, "--rollouts"))
            rc = cli_opt_unsigned(a, v, 1, 64, &o->rollouts);
        else if (!strcmp(a, "--updaters"))
            rc = cli_opt_unsigned(a, v, 1, 64, &o->updaters);
        else if (!strcmp(a, "--steps"))
            rc = cli_opt_unsigned(a, v, 1, 100000, &o->steps);
        else if (!strcmp(a, "--batch"))
            rc = cli_opt_unsigned(a, v, 1, 65536, &o->batch);
        else if (!strcmp(a, "--tokens"))
            rc = cli_opt_unsigned(a, v, 1, 1u << 20, &o->tokens);
        else if (!strcmp(a, "--bound"))   /* 0: 2 x batch x updaters */
            rc = cli_opt_uint(a, v, 0, 1000000000, &o->bound);
        else if (!strcmp(a, "--max-policy-lag"))
            rc = cli_opt_unsigned(a, v, 0, 1000000, &o->lag);
        else if (!strcmp(a, "--rate"))   /* 0: as fast as it can */
            rc = cli_opt_double(a, v, 0, 1e6, &o->rate);
        else if (!strcmp(a, "--train-ms"))
            rc = cli_opt_double(a, v, 0, 3600e3, &o->train_ms);
        else if (!strcmp(a, "--stale")) {
            if (strcmp(v, "drop") && strcmp(v, "recompute")) {
                fprintf(stderr, "ferry: --stale wants drop or recompute, not '%s'\n", v);
                return -1;
            }
            o->recompute = !strcmp(v, "recompute");
        } else if (!strcmp(a, "--weights"))
            rc = cli_opt_size(a, v, 4096 * NT, 1ull << 40, &o->weight_bytes);
        else
            return cli_getopt_unhandled(&g);
        if (rc < 0)
            return -1;
    }
    int pr = cli_getopt_end(&g, 0);
    if (pr != 0)
        return pr;
    /* The bound counts leased records too: below the batches every update
     * process holds at once, producers and consumers would wait on each
     * other until leases lapse. */
    uint64_t inflight = (uint64_t)o->batch * o->updaters;
    if (o->bound == 0)
        o->bound = 2 * inflight;
    if (o->bound <= inflight) {
        fprintf(stderr, "ferry demo rl: --bound %" PRIu64 " must exceed batch x updaters = %" PRIu64
                " (leased samples count against it)\n", o->bound, inflight);
        return -1;
    }
    return o->rollouts >= 1 && o->rollouts <= 64 && o->updaters >= 1 && o->updaters <= 64 &&
                   o->steps >= 1 && o->batch >= 1 && o->tokens >= 1 && o->tokens <= (1u << 20) &&
                   o->weight_bytes >= 4096 * NT && o->rate >= 0 && o->train_ms >= 0
               ? 0 : -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct vec { void *p; size_t n, cap, sz; } vec;
static void *vec_push(vec *v)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 1024;
        void *np = realloc(v->p, nc * v->sz);
        if (!np)
            return NULL;
        v->p = np;
        v->cap = nc;
    }
    return (char *)v->p + v->n++ * v->sz;
}

/* Every line of dir/prefix-0..n-1 as strings (ids) or numbers. */
static void read_lines(const char *dir, const char *prefix, unsigned n, vec *strs, vec *nums)
{
    for (unsigned r = 0; r < n; r++) {
        char path[256], line[256];
        snprintf(path, sizeof path, "%s/%s-%u", dir, prefix, r);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (strs) {
                char **slot = vec_push(strs);
                if (slot)
                    *slot = strdup(line);
            } else {
                double *slot = vec_push(nums);
                if (slot)
                    *slot = atof(line);
            }
        }
        fclose(f);
    }
}

static double pct_d(vec *v, double p)
{
    if (!v->n)
        return 0;
    double *d = v->p;
    uint64_t *tmp = malloc(v->n * sizeof *tmp);
    for (size_t i = 0; i < v->n; i++)
        tmp[i] = (uint64_t)(d[i] * 1e6);
    qsort(tmp, v->n, sizeof *tmp, cmp_u64);
    size_t k = (size_t)ceil(p * (double)v->n) - 1;
    double r = (double)tmp[k < v->n ? k : v->n - 1] / 1e6;
    free(tmp);
    return r;
}

int cmd_demo_rl(int argc, char **argv)
{
    rl_opts o;
    int pr = parse_rl(argc, argv, &o);
    if (pr != 0)
        return cli_usage_exit(pr, usage_rl);
    demo_group g;
    child ro[64], up[64];
    memset(ro, 0, sizeof ro);
    memset(up, 0, sizeof up);
    int rc = 1;
    char model[64], queue[64], line[512] = "";
    snprintf(model, sizeof model, "demorl%d", (int)getpid());
    snprintf(queue, sizeof queue, "demorl%d", (int)getpid());
    if (demo_cluster_start(&g, o.weight_bytes * 3 + (256ull << 20), "ferry demo rl") < 0)
        goto out;
    if (!o.json)
        printf("ferry demo rl: %u rollout and %u update processes on the master at %s\n"
               "  %u steps of %u samples per update process, %u tokens per sample, %.0f "
               "samples/s per rollout,\n  training %.0f ms per step, max_policy_lag %u, stale "
               "samples %s, queue bound %" PRIu64 ", weights %s\n",
               o.rollouts, o.updaters, g.addr, o.steps, o.batch, o.tokens, o.rate, o.train_ms,
               o.lag, o.recompute ? "recomputed" : "dropped", o.bound,
               cli_fmt_size(o.weight_bytes, line, sizeof line));
    char a[12][32];
    for (unsigned u = 0; u < o.updaters; u++) {
        snprintf(a[0], 32, "%u", u);
        snprintf(a[1], 32, "%u", o.updaters);
        snprintf(a[2], 32, "%u", o.steps);
        snprintf(a[3], 32, "%u", o.batch);
        snprintf(a[4], 32, "%g", o.train_ms);
        snprintf(a[5], 32, "%u", o.lag);
        snprintf(a[6], 32, "%d", o.recompute);
        snprintf(a[7], 32, "%u", o.tokens);
        snprintf(a[8], 32, "%" PRIu64, o.weight_bytes);
        const char *args[] = { "ferry", "_demo_rl_update", g.addr, a[0], a[1], model, queue,
                               g.dir, a[2], a[3], a[4], a[5], a[6], a[7], a[8], NULL };
        if (demo_child_start(&up[u], args) < 0 || demo_child_line(&up[u], line, sizeof line) < 0) {
            fprintf(stderr, "ferry demo rl: an update process did not start: %s\n", line);
            goto out;
        }
    }
    for (unsigned r = 0; r < o.rollouts; r++) {
        snprintf(a[0], 32, "%u", r);
        snprintf(a[1], 32, "%g", o.rate);
        snprintf(a[2], 32, "%u", o.tokens);
        snprintf(a[3], 32, "%" PRIu64, o.bound);
        const char *args[] = { "ferry", "_demo_rl_rollout", g.addr, a[0], model, queue, g.dir,
                               a[1], a[2], a[3], NULL };
        if (demo_child_start(&ro[r], args) < 0 || demo_child_line(&ro[r], line, sizeof line) < 0) {
            fprintf(stderr, "ferry demo rl: a rollout process did not start: %s\n", line);
            goto out;
        }
    }
    double t0 = cli_now();
    for (unsigned u = 0; u < o.updaters; u++) {
        fprintf(up[u].in, "go\n");
        fflush(up[u].in);
    }
    bool ok = true;
    uint64_t trained_steps = 0;
    for (unsigned u = 0; u < o.updaters; u++) {
        unsigned long long n = 0;
        if (demo_child_line(&up[u], line, sizeof line) < 0 || sscanf(line, "OK %llu", &n) != 1) {
            fprintf(stderr, "%sferry demo rl: update process %u: %s\n", isatty(2) ? "\n" : "", u,
                    line);
            ok = false;
        }
        trained_steps += n;
    }
    double run_s = cli_now() - t0;
    /* stop the rollouts, then let the update side drain what is left */
    uint64_t produced = 0, recomputed = 0, waits = 0, bad = 0;
    for (unsigned r = 0; r < o.rollouts; r++) {
        fprintf(ro[r].in, "stop\n");
        fflush(ro[r].in);
    }
    for (unsigned r = 0; r < o.rollouts; r++) {
        unsigned long long p = 0, c = 0, w = 0, b = 0;
        if (demo_child_line(&ro[r], line, sizeof line) < 0 ||
            sscanf(line, "OK %llu %llu %llu %llu", &p, &c, &w, &b) != 4) {
            fprintf(stderr, "\nferry demo rl: rollout %u: %s\n", r, line);
            ok = false;
        }
        produced += p, recomputed += c, waits += w, bad += b;
    }
    for (unsigned u = 0; u < o.updaters; u++) {
        fprintf(up[u].in, "drain\n");
        fflush(up[u].in);
    }
    uint64_t trained = 0, popped = 0, stale = 0, dropped = 0, sent_back = 0, dups = 0;
    for (unsigned u = 0; u < o.updaters; u++) {
        unsigned long long v[7] = { 0 };
        if (demo_child_line(&up[u], line, sizeof line) < 0 ||
            sscanf(line, "OK %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6]) != 7) {
            fprintf(stderr, "%sferry demo rl: update process %u: %s\n", isatty(2) ? "\n" : "", u,
                    line);
            ok = false;
        }
        trained += v[0], popped += v[1], stale += v[2], dropped += v[3], sent_back += v[4],
            dups += v[5];
    }
    double total_s = cli_now() - t0;
    if (!o.json && isatty(2))
        fprintf(stderr, "\n");   /* ends the updater's progress line */

    /* accounting over the ids */
    vec pid = { .sz = sizeof(char *) }, tid = { .sz = sizeof(char *) };
    vec lat = { .sz = sizeof(double) }, loads = { .sz = sizeof(double) },
        pubs = { .sz = sizeof(double) };
    read_lines(g.dir, "produced", o.rollouts, &pid, NULL);
    read_lines(g.dir, "trained", o.updaters, &tid, NULL);
    read_lines(g.dir, "latency", o.updaters, NULL, &lat);
    read_lines(g.dir, "load", o.rollouts, NULL, &loads);
    read_lines(g.dir, "publish", o.updaters, NULL, &pubs);
    qsort(tid.p, tid.n, sizeof(char *), cmp_str);
    qsort(pid.p, pid.n, sizeof(char *), cmp_str);
    char **T = tid.p, **P = pid.p;
    uint64_t duplicated = 0, trained_unique = 0, unknown = 0;
    for (size_t i = 0; i < tid.n; i++) {
        if (i && !strcmp(T[i], T[i - 1]))
            duplicated++;
        else {
            trained_unique++;
            if (!bsearch(&T[i], P, pid.n, sizeof(char *), cmp_str))
                unknown++;
        }
    }
    int64_t lost = (int64_t)pid.n - (int64_t)trained_unique - (int64_t)dropped -
                   (int64_t)sent_back;
    for (size_t i = 0; i < tid.n; i++)
        free(T[i]);
    for (size_t i = 0; i < pid.n; i++)
        free(P[i]);
    free(tid.p);
    free(pid.p);
    double samples_s = run_s > 0 ? (double)trained_steps / run_s : 0;
    double stale_rate = popped ? (double)stale / (double)popped : 0;
    double recompute_rate = popped ? (double)sent_back / (double)popped : 0;
    /* latency in ms: the files hold ms */
    double l50 = pct_d(&lat, 0.50), l99 = pct_d(&lat, 0.99);
    double u50 = pct_d(&loads, 0.50), p50 = pct_d(&pubs, 0.50);
    ok = ok && bad == 0 && lost == 0 && duplicated == 0 && unknown == 0 &&
         produced == pid.n && trained_unique > 0;
    if (o.json) {
        printf("{\"samples_per_s\": %.1f, \"stale_rate\": %.4f, \"recompute_rate\": %.4f, "
               "\"update_s_p50\": %.4f, \"publish_s_p50\": %.4f, \"latency_ms_p50\": %.1f, "
               "\"latency_ms_p99\": %.1f, \"acked\": %" PRIu64 ", \"produced\": %" PRIu64
               ", \"lost\": %" PRId64 ", \"duplicated\": %" PRIu64 ", \"dropped\": %" PRIu64
               ", \"recomputed\": %" PRIu64 ", \"stale\": %" PRIu64 ", \"popped\": %" PRIu64
               ", \"push_waits\": %" PRIu64 ", \"versions\": %u, \"weight_errors\": %" PRIu64
               ", \"seconds\": %.2f, \"ok\": %s}\n",
               samples_s, stale_rate, recompute_rate, u50, p50, l50, l99, trained, produced, lost,
               duplicated, dropped, recomputed, stale, popped, waits, o.steps + 1, bad, total_s,
               ok ? "true" : "false");
    } else {
        printf("\n");
        printf("  %-34s %12.1f\n", "samples trained per second", samples_s);
        printf("  %-34s %12" PRIu64 "\n", "samples produced", produced);
        printf("  %-34s %12" PRIu64 "\n", "samples trained (acked)", trained);
        printf("  %-34s %12" PRIu64 "  (%.1f%% of popped)\n", "stale, rejected", stale,
               100 * stale_rate);
        printf("  %-34s %12" PRIu64 "\n", "  dropped", dropped);
        printf("  %-34s %12" PRIu64 "  (%.1f%% of popped; %" PRIu64 " redone)\n",
               "  sent back for recompute", sent_back, 100 * recompute_rate, recomputed);
        printf("  %-34s %12" PRIu64 "\n", "duplicates caught", dups);
        printf("  %-34s %12" PRIu64 "\n", "producer waits (queue full)", waits);
        printf("  %-34s %12u\n", "policy versions published", o.steps + 1);
        printf("  %-34s %12.1f ms\n", "publish time p50", p50 * 1e3);
        printf("  %-34s %12.1f ms\n", "rollout weight load p50", u50 * 1e3);
        printf("  %-34s %12.1f ms\n", "sample latency p50 (push->pop)", l50);
        printf("  %-34s %12.1f ms\n", "sample latency p99", l99);
        printf("  %-34s %12" PRId64 "\n", "lost", lost);
        printf("  %-34s %12" PRIu64 "\n", "duplicated (trained twice)", duplicated);
        printf("  %-34s %12" PRIu64 "\n", "weight values wrong", bad);
        printf("\n%s (%.1f s)\n", ok ? "demo rl ok" : "demo rl FAILED", total_s);
    }
    free(lat.p);
    free(loads.p);
    free(pubs.p);
    rc = ok ? 0 : 1;
out:
    for (unsigned r = 0; r < 64; r++)
        demo_child_stop(&ro[r]);
    for (unsigned u = 0; u < 64; u++)
        demo_child_stop(&up[u]);
    demo_group_stop(&g);
    return rc;
}
