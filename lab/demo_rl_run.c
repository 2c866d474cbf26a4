/* `ferry-lab demo rl`'s parent: pools of rollout and update processes sized per
 * phase (--pools), members SIGKILLed and started again (--kill), the final
 * drain, and the report.
 *
 * The parent drives the update side step by step: "train" to every update
 * process, then "publish V WORLD" to all of them (one collective publish of
 * the current pool). Between steps a new phase grows a pool (new ranks) or
 * shrinks it (the highest ranks stop cleanly). A kill lands at a random
 * moment of a step's training (pop, read, train or ack, or the wait after
 * it), never inside a publish; the member is started again at once as a new
 * incarnation of the same rank, and an update process that had not finished
 * its batch trains one. Rollouts run freely and are killed the same way. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lab.h"
#include "demo.h"
#include "demo_rl.h"

typedef struct member { child c; unsigned inc; bool trained; } member;

typedef struct rl_run {
    const rl_opts *o;
    demo_group g;
    char model[64], queue[64], line[512];
    member ro[RL_POOL_MAX], up[RL_POOL_MAX];
    unsigned nro, nup, inc_ro[RL_POOL_MAX], inc_up[RL_POOL_MAX];
    uint64_t version, rng, push_waits, trained;   /* trained: as the replies said (progress) */
    unsigned kills, kill_step[1000];   /* the step of each kill */
    double last_kill, last_train_s;   /* last_train_s: the previous step's training, 0 before */
} rl_run;

static uint64_t rnd(rl_run *r)
{
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 7;
    r->rng ^= r->rng << 17;
    return r->rng;
}

static double rnd01(rl_run *r) { return (double)(rnd(r) >> 11) / 9007199254740992.0; }

static void sleep_until(double t)
{
    double d = t - cli_now();
    if (d > 0) {
        struct timespec ts = { (time_t)d, (long)((d - floor(d)) * 1e9) };
        nanosleep(&ts, NULL);
    }
}

static int start_rollout(rl_run *r, unsigned rank)
{
    const rl_opts *o = r->o;
    char a[6][32];
    snprintf(a[0], 32, "%u", rank);
    snprintf(a[1], 32, "%u", r->inc_ro[rank]);
    snprintf(a[2], 32, "%g", o->rate);
    snprintf(a[3], 32, "%u", o->tokens);
    snprintf(a[4], 32, "%" PRIu64, o->bound);
    snprintf(a[5], 32, "%" PRIu64, o->lease_ms);
    const char *args[] = { "ferry-lab", "worker", "rl-rollout", r->g.addr, a[0], a[1], r->model, r->queue,
                           r->g.dir, a[2], a[3], a[4], a[5], NULL };
    member *m = &r->ro[rank];
    m->inc = r->inc_ro[rank]++;
    if (demo_child_start(&m->c, args) < 0 || demo_child_line(&m->c, r->line, sizeof r->line) < 0) {
        fprintf(stderr, "ferry-lab demo rl: rollout %u did not start: %s\n", rank, r->line);
        return -1;
    }
    return 0;
}

static int start_updater(rl_run *r, unsigned rank)
{
    const rl_opts *o = r->o;
    char a[11][32];
    snprintf(a[0], 32, "%u", rank);
    snprintf(a[1], 32, "%u", r->inc_up[rank]);
    snprintf(a[2], 32, "%u", o->batch);
    snprintf(a[3], 32, "%g", o->train_ms);
    snprintf(a[4], 32, "%u", o->lag);
    snprintf(a[5], 32, "%d", o->recompute);
    snprintf(a[6], 32, "%u", o->tokens);
    snprintf(a[7], 32, "%" PRIu64, o->weight_bytes);
    snprintf(a[8], 32, "%" PRIu64, o->lease_ms);
    snprintf(a[9], 32, "%" PRIu64, r->version ? r->version : 1);
    const char *args[] = { "ferry-lab", "worker", "rl-update", r->g.addr, a[0], a[1], r->model, r->queue,
                           r->g.dir, a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], NULL };
    member *m = &r->up[rank];
    m->inc = r->inc_up[rank]++;
    m->trained = false;
    if (demo_child_start(&m->c, args) < 0 || demo_child_line(&m->c, r->line, sizeof r->line) < 0) {
        fprintf(stderr, "ferry-lab demo rl: update process %u did not start: %s\n", rank, r->line);
        return -1;
    }
    return 0;
}

static void say(member *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(member *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(m->c.in, fmt, ap);
    va_end(ap);
    fflush(m->c.in);
}

/* "stop", its last reply, and reap it. */
static int stop_member(rl_run *r, member *m, const char *what, unsigned rank)
{
    say(m, "stop\n");
    int rc = demo_child_line(&m->c, r->line, sizeof r->line);
    unsigned long long p = 0, c = 0, w = 0;
    if (rc == 0 && sscanf(r->line, "OK %llu %llu %llu", &p, &c, &w) == 3)
        r->push_waits += w;
    if (rc < 0)
        fprintf(stderr, "%sferry-lab demo rl: %s %u: %s\n", isatty(2) ? "\n" : "", what, rank, r->line);
    demo_child_stop(&m->c);
    return rc;
}

/* SIGKILL; whether it had replied "trained" before it died. */
static bool kill_member(member *m)
{
    kill(m->c.pid, SIGKILL);
    bool trained = m->trained;
    char line[256];
    while (m->c.out && fgets(line, sizeof line, m->c.out))
        if (!strncmp(line, "OK trained", 10))
            trained = true;
    demo_child_stop(&m->c);
    return trained;
}

/* Grow or shrink both pools to phase p's sizes. */
static int resize(rl_run *r, const rl_phase *p)
{
    while (r->nup > p->updaters)
        if (stop_member(r, &r->up[r->nup - 1], "update process", r->nup - 1) < 0)
            return -1;
        else
            r->nup--;
    while (r->nup < p->updaters)
        if (start_updater(r, r->nup) < 0)
            return -1;
        else
            r->nup++;
    while (r->nro > p->rollouts)
        if (stop_member(r, &r->ro[r->nro - 1], "rollout", r->nro - 1) < 0)
            return -1;
        else
            r->nro--;
    while (r->nro < p->rollouts)
        if (start_rollout(r, r->nro) < 0)
            return -1;
        else
            r->nro++;
    return 0;
}

/* One kill of a random rollout and a random update process, each at a
 * random moment within `span` seconds after t0, each started again. */
static int kill_pair(rl_run *r, double t0, double span)
{
    double tr = t0 + rnd01(r) * span, tu = t0 + rnd01(r) * span;
    for (int k = 0; k < 2; k++) {
        bool roll = (k == 0) == (tr <= tu);
        sleep_until(roll ? tr : tu);
        if (roll) {
            unsigned v = (unsigned)(rnd(r) % r->nro);
            (void)kill_member(&r->ro[v]);
            if (start_rollout(r, v) < 0)
                return -1;
        } else {
            unsigned v = (unsigned)(rnd(r) % r->nup);
            bool trained = kill_member(&r->up[v]);
            if (start_updater(r, v) < 0)
                return -1;
            r->up[v].trained = trained;
            if (!trained)
                say(&r->up[v], "train\n");   /* its batch is redone by the new incarnation */
        }
    }
    r->last_kill = cli_now();
    r->kills++;
    return 0;
}

static int train_step(rl_run *r, unsigned step, bool kill_here)
{
    const rl_opts *o = r->o;
    for (unsigned u = 0; u < r->nup; u++) {
        r->up[u].trained = false;
        say(&r->up[u], "train\n");
    }
    double t0 = cli_now();
    if (kill_here) {
        /* the kill lands anywhere in a step's training: as long as the last
         * one took (kill and restart included), or (first step) the batches
         * at the producers' rate */
        double span = r->last_train_s > 0 ? r->last_train_s
                      : o->train_ms / 1000.0 +
                            (o->rate > 0 ? (double)o->batch * r->nup / (o->rate * r->nro) : 0.05);
        if (r->kills < 1000)
            r->kill_step[r->kills] = step;
        if (kill_pair(r, t0, span) < 0)
            return -1;
    }
    for (unsigned u = 0; u < r->nup; u++) {
        if (r->up[u].trained)
            continue;
        if (demo_child_line(&r->up[u].c, r->line, sizeof r->line) < 0) {
            fprintf(stderr, "%sferry-lab demo rl: update process %u: %s\n", isatty(2) ? "\n" : "", u,
                    r->line);
            return -1;
        }
        r->up[u].trained = true;
        unsigned long long n = 0;
        if (sscanf(r->line, "OK trained %llu", &n) == 1)
            r->trained += n;
    }
    r->last_train_s = cli_now() - t0;
    return 0;
}

static int publish_step(rl_run *r, uint64_t v)
{
    for (unsigned u = 0; u < r->nup; u++)
        say(&r->up[u], "publish %" PRIu64 " %u\n", v, r->nup);
    int rc = 0;
    for (unsigned u = 0; u < r->nup; u++)
        if (demo_child_line(&r->up[u].c, r->line, sizeof r->line) < 0) {
            fprintf(stderr, "%sferry-lab demo rl: update process %u: publishing version %" PRIu64
                    ": %s\n", isatty(2) ? "\n" : "", u, v, r->line);
            rc = -1;
        }
    if (rc == 0)
        r->version = v;
    return rc;
}

/* Which steps get a kill: o->kills distinct ones among 1..steps-1. */
static void pick_kill_steps(rl_run *r, bool *at)
{
    unsigned n = r->o->steps - 1, want = r->o->kills;
    for (unsigned i = 0; i < want; i++) {
        unsigned k = 1 + (unsigned)(rnd(r) % n);
        while (at[k])
            k = k % n + 1;
        at[k] = true;
    }
}

/* What the update side left: popped and trained (or rejected) by the
 * parent at the last version, recompute requests read and acked, until a
 * pop finds nothing once every lease a killed member held has lapsed. */
static int drain(rl_run *r, ferry_store *s, uint64_t *trained)
{
    const rl_opts *o = r->o;
    ferry_sample_queue_config qc = { .input_version = r->version, .max_policy_lag = o->lag,
                                     .stale_policy = o->recompute ? FERRY_STALE_RECOMPUTE
                                                                  : FERRY_STALE_DROP,
                                     .lease_ms = o->lease_ms };
    snprintf(qc.queue, sizeof qc.queue, "%s", r->queue);
    ferry_sample_queue *q = NULL;
    ferry_error err = {0};
    FILE *led = demo_rl_ledger(r->g.dir, "upd-drain-0");
    if (!led || ferry_sample_queue_open(s, &qc, &q, &err) < 0) {
        fprintf(stderr, "ferry-lab demo rl: the drain: %s\n", led ? err.msg : "cannot write its ledger");
        if (led)
            fclose(led);
        return -1;
    }
    double horizon = r->last_kill + (double)o->lease_ms / 1000.0 + 0.25;
    double deadline = cli_now() + 120 + (double)o->lease_ms / 1000.0;
    int rc = 0;
    for (;;) {
        uint64_t popped = 0;
        int64_t n = demo_rl_train(q, 64, true, 0, o->tokens, led, &popped, &err);
        if (n < 0) {
            fprintf(stderr, "ferry-lab demo rl: the drain: %s\n", err.msg);
            rc = -1;
            break;
        }
        *trained += (uint64_t)n;
        ferry_sample back[64];
        size_t nb = 0;
        if (ferry_sample_pop_recompute(q, 64, back, &nb, &err) == 0)
            for (size_t i = 0; i < nb; i++) {
                fprintf(led, "B %s\n", back[i].session.session_id);
                (void)ferry_sample_ack(q, &back[i], 1, NULL, NULL);
                ferry_sample_clear(&back[i]);
            }
        double now = cli_now();
        if (popped == 0 && nb == 0 && now >= horizon)
            break;
        if (now > deadline) {
            fprintf(stderr, "ferry-lab demo rl: the queue still held samples %.0f s into the drain\n",
                    now - deadline + 120 + (double)o->lease_ms / 1000.0);
            rc = -1;
            break;
        }
        if (popped == 0 && nb == 0)
            sleep_until(now + 0.02);
    }
    fprintf(led, "E\n");
    fclose(led);
    ferry_sample_queue_close(q);
    return rc;
}

static void print_json(const rl_run *r, const rl_tally *t, double run_s, double total_s, bool ok)
{
    const rl_opts *o = r->o;
    double steps_trained = (double)(t->trained - t->trained_by_drain);
    double done = (double)(t->trained + t->stale);
    double samples_s = run_s > 0 ? steps_trained / run_s : 0;
    double stale_rate = done > 0 ? (double)t->stale / done : 0;
    double recompute_rate = done > 0 ? (double)t->sent_back / done : 0;
    printf("{\"samples_per_s\": %.1f, \"stale_rejection_rate\": %.4f, \"stale_rate\": %.4f, "
           "\"recompute_rate\": %.4f, \"update_s_p50\": %.4f, \"publish_s_p50\": %.4f, "
           "\"latency_ms_p50\": %.1f, \"latency_ms_p99\": %.1f, \"produced\": %" PRIu64
           ", \"acked\": %" PRIu64 ", \"trained_in_steps\": %.0f, \"stale\": %" PRIu64
           ", \"sent_back\": %" PRIu64 ", \"dropped\": %" PRIu64 ", \"recompute_lost\": %" PRIu64
           ", \"recomputed\": %" PRIu64 ", \"lost\": %" PRIu64 ", \"duplicated\": %" PRIu64
           ", \"inconsistent\": %" PRIu64 ", \"kills\": %u, \"kills_requested\": %u"
           ", \"acks_cut_by_kill\": %" PRIu64 ", \"leased_by_killed\": %" PRIu64
           ", \"redelivered_trained\": %" PRIu64 ", \"pushes_cut_by_kill\": %" PRIu64
           ", \"landed_unrecorded\": %" PRIu64 ", \"orphaned_payloads\": %" PRIu64
           ", \"restarted_produced\": %" PRIu64 ", \"restarted_trained\": %" PRIu64
           ", \"claim_events\": %" PRIu64 ", \"push_waits\": %" PRIu64 ", \"phases\": [",
           samples_s, stale_rate, stale_rate, recompute_rate, t->load_s_p50, t->publish_s_p50,
           t->latency_ms_p50, t->latency_ms_p99, t->produced, t->trained, steps_trained,
           t->stale, t->sent_back, t->dropped, t->recompute_lost, t->recomputed, t->lost,
           t->duplicated, t->inconsistent, r->kills, o->kills, t->acks_cut_by_kill,
           t->leased_by_killed, t->redelivered_trained, t->dangling_pushes, t->landed_unrecorded,
           t->orphaned_payloads, t->restarted_produced, t->restarted_trained, t->claim_events,
           r->push_waits);
    for (unsigned i = 0; i < o->nphase; i++)
        printf("%s{\"rollouts\": %u, \"updaters\": %u, \"steps\": %u}", i ? ", " : "",
               o->phase[i].rollouts, o->phase[i].updaters, o->phase[i].steps);
    printf("], \"kill_steps\": [");
    for (unsigned i = 0; i < r->kills && i < 1000; i++)
        printf("%s%u", i ? ", " : "", r->kill_step[i]);
    printf("], \"versions\": %u, \"weight_errors\": %" PRIu64 ", \"seed\": %" PRIu64
           ", \"run_s\": %.2f, \"seconds\": %.2f, \"ok\": %s}\n",
           o->steps + 1, t->weight_errors, o->seed, run_s, total_s, ok ? "true" : "false");
}

static void print_table(const rl_run *r, const rl_tally *t, double run_s, double total_s, bool ok)
{
    const rl_opts *o = r->o;
    double done = (double)(t->trained + t->stale);
    double steps_trained = (double)(t->trained - t->trained_by_drain);
    printf("\n");
    printf("  %-38s %12.1f\n", "samples trained per second", run_s > 0 ? steps_trained / run_s : 0);
    printf("  %-38s %12" PRIu64 "\n", "samples produced", t->produced);
    printf("  %-38s %12" PRIu64 "  (%" PRIu64 " in the final drain)\n", "samples trained (acked)",
           t->trained, t->trained_by_drain);
    printf("  %-38s %12" PRIu64 "  (%.1f%% of those ended)\n", "stale, rejected", t->stale,
           done > 0 ? 100 * (double)t->stale / done : 0);
    printf("  %-38s %12" PRIu64 "  (%.1f%%; %" PRIu64 " redone)\n", "  sent back for recompute",
           t->sent_back, done > 0 ? 100 * (double)t->sent_back / done : 0, t->recomputed);
    printf("  %-38s %12" PRIu64 "\n", "  dropped", t->dropped);
    printf("  %-38s %12" PRIu64 "\n", "  recompute request lost to a kill", t->recompute_lost);
    printf("  %-38s %12u of %u\n", "kills (a rollout and an updater each)", r->kills, o->kills);
    printf("  %-38s %12" PRIu64 "\n", "  acks a killed updater had committed", t->acks_cut_by_kill);
    printf("  %-38s %12" PRIu64 "  (%" PRIu64 " trained again later)\n",
           "  samples a killed updater held", t->leased_by_killed, t->redelivered_trained);
    printf("  %-38s %12" PRIu64 "  (%" PRIu64 " landed, %" PRIu64 " payloads orphaned)\n",
           "  pushes a kill cut short", t->dangling_pushes, t->landed_unrecorded,
           t->orphaned_payloads);
    printf("  %-38s %12" PRIu64 " / %" PRIu64 "\n", "  restarted members: produced / trained",
           t->restarted_produced, t->restarted_trained);
    printf("  %-38s %12" PRIu64 "\n", "producer waits (queue full)", r->push_waits);
    printf("  %-38s %12u\n", "policy versions published", o->steps + 1);
    printf("  %-38s %12.1f ms\n", "publish time p50", t->publish_s_p50 * 1e3);
    printf("  %-38s %12.1f ms\n", "rollout weight load p50", t->load_s_p50 * 1e3);
    printf("  %-38s %12.1f ms\n", "sample latency p50 (push->pop)", t->latency_ms_p50);
    printf("  %-38s %12.1f ms\n", "sample latency p99", t->latency_ms_p99);
    printf("  %-38s %12" PRIu64 "\n", "lost", t->lost);
    printf("  %-38s %12" PRIu64 "\n", "duplicated (trained twice)", t->duplicated);
    printf("  %-38s %12" PRIu64 "\n", "inconsistent with the claim log", t->inconsistent);
    printf("  %-38s %12" PRIu64 "\n", "weight values wrong", t->weight_errors);
    printf("\n%s (%.1f s)\n", ok ? "demo rl ok" : "demo rl FAILED", total_s);
}

static void print_intro(const rl_run *r)
{
    const rl_opts *o = r->o;
    char sz[32], pools[256] = "";
    size_t k = 0;
    for (unsigned i = 0; i < o->nphase && k < sizeof pools - 40; i++)
        k += (size_t)snprintf(pools + k, sizeof pools - k, "%s%u:%u for %u step%s", i ? ", then " : "",
                              o->phase[i].rollouts, o->phase[i].updaters, o->phase[i].steps,
                              o->phase[i].steps == 1 ? "" : "s");
    printf("ferry-lab demo rl: rollout:update processes %s, on the master at %s\n"
           "  %u samples per update process and step, %u tokens per sample, %.0f samples/s per "
           "rollout,\n  training %.0f ms per step, max_policy_lag %u, stale samples %s, queue bound %"
           PRIu64 ", lease %" PRIu64 " ms, weights %s, %u kill%s (seed %" PRIu64 ")\n",
           pools, r->g.addr, o->batch, o->tokens, o->rate, o->train_ms, o->lag,
           o->recompute ? "recomputed" : "dropped", o->bound, o->lease_ms,
           cli_fmt_size(o->weight_bytes, sz, sizeof sz), o->kills, o->kills == 1 ? "" : "s",
           o->seed);
}

/* The steps, phase by phase; run_s: from the first step to the last publish. */
static int run_steps(rl_run *r, double *run_s)
{
    const rl_opts *o = r->o;
    bool *kill_at = calloc(o->steps + 1, sizeof *kill_at);
    if (!kill_at)
        return -1;
    if (o->kills)
        pick_kill_steps(r, kill_at);
    int rc = resize(r, &(rl_phase){ 0, o->phase[0].updaters, 0 }) < 0 || publish_step(r, 1) < 0 ||
                     resize(r, &o->phase[0]) < 0 ? -1 : 0;
    double t0 = cli_now();
    unsigned k = 0;
    for (unsigned p = 0; rc == 0 && p < o->nphase; p++) {
        if (p && resize(r, &o->phase[p]) < 0)
            rc = -1;
        for (unsigned i = 0; rc == 0 && i < o->phase[p].steps; i++) {
            k++;
            if (train_step(r, k, kill_at[k]) < 0 || publish_step(r, k + 1) < 0)
                rc = -1;
            else
                cli_progress_text("step %u/%u: version %u published, %" PRIu64 " samples trained",
                                  k, o->steps, k + 1, r->trained);
        }
    }
    free(kill_at);
    *run_s = cli_now() - t0;
    return rc;
}

int cmd_demo_rl(int argc, char **argv)
{
    static rl_opts o;
    int pr = demo_rl_parse(argc, argv, &o);
    if (pr != 0)
        return cli_usage_exit(pr, demo_rl_usage);
    if (!o.seeded)
        o.seed = (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid();
    static rl_run r;
    memset(&r, 0, sizeof r);
    r.o = &o;
    r.rng = o.seed * 2654435761u + 0x9e3779b97f4a7c15ULL;
    snprintf(r.model, sizeof r.model, "demorl%d", (int)getpid());
    snprintf(r.queue, sizeof r.queue, "demorl%d", (int)getpid());
    int rc = 1;
    ferry_store *s = NULL;
    ferry_sample_claims *claims = NULL;
    char why[256] = "";
    ferry_error e = {0};
    if (demo_cluster_start(&r.g, o.weight_bytes * 3 + (256ull << 20), "ferry-lab demo rl") < 0)
        goto out;
    /* the claim log: every claim the queue writes, from before the first sample */
    if (!(s = demo_rl_open_store(r.g.addr)))
        goto out;   /* it said why */
    if (ferry_sample_claims_open(s, r.queue, &claims, &e) < 0) {
        fprintf(stderr, "ferry-lab demo rl: cannot watch the queue's claims: %s\n", e.msg);
        goto out;
    }
    if (!o.json)
        print_intro(&r);
    double t0 = cli_now(), run_s = 0;
    bool ok = run_steps(&r, &run_s) == 0;
    /* stop the rollouts, then the update side; the parent drains what is left */
    while (ok && r.nro)
        ok = stop_member(&r, &r.ro[r.nro - 1], "rollout", r.nro - 1) == 0 && r.nro--;
    while (ok && r.nup)
        ok = stop_member(&r, &r.up[r.nup - 1], "update process", r.nup - 1) == 0 && r.nup--;
    uint64_t drained = 0;
    ok = ok && drain(&r, s, &drained) == 0;
    if (!o.json && isatty(2))
        fprintf(stderr, "\n");   /* ends the progress line */
    if (!ok)
        goto out;
    rl_tally t;
    if (ferry_sample_claims_mark(claims, &e) < 0 ||
        demo_rl_tally(s, r.queue, r.g.dir, claims, o.recompute, &t, why, sizeof why) < 0) {
        fprintf(stderr, "ferry-lab demo rl: accounting: %s\n", why[0] ? why : e.msg);
        goto out;
    }
    double total_s = cli_now() - t0;
    /* a recompute request lost is the queue's one window (an update process
     * killed between a stale sample's commit and its request): one per kill at most */
    ok = t.weight_errors == 0 && t.lost == 0 && t.duplicated == 0 && t.inconsistent == 0 &&
         t.trained > 0 && r.kills == o.kills && t.recompute_lost <= r.kills;
    if (o.json)
        print_json(&r, &t, run_s, total_s, ok);
    else
        print_table(&r, &t, run_s, total_s, ok);
    rc = ok ? 0 : 1;
out:
    for (unsigned i = 0; i < RL_POOL_MAX; i++) {
        demo_child_stop(&r.ro[i].c);
        demo_child_stop(&r.up[i].c);
    }
    ferry_sample_claims_close(claims);
    if (s)
        ferry_store_close(s);
    demo_group_stop(&r.g);
    return rc;
}
