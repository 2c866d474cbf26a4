/* `ferry-lab demo rl`'s options: the pool phases (--pools), the kills and the
 * rest. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "lab.h"
#include "demo_rl.h"
#include "cli_opts.h"

/* What the table stores: rl_opts itself, and the options check_rl reads
 * whole (--pools, --stale). --rollouts and --updaters are 0 unless given
 * (their minimum is 1): --pools refuses them. */
typedef struct rl_args {
    rl_opts o;
    const char *pools, *stale;
} rl_args;

static int seed_each(void *opts, const char *flag, const char *v)
{
    rl_opts *o = &((rl_args *)opts)->o;
    o->seeded = true;
    return cli_opt_uint(flag, v, 0, UINT64_MAX, &o->seed);
}

static const cli_opt rl_table[] = {
    CLI_UINT(rl_args, o.phase[0].rollouts, "rollouts", "N", 1, RL_POOL_MAX,
             "rollout processes (default 3)"),
    CLI_UINT(rl_args, o.phase[0].updaters, "updaters", "N", 1, RL_POOL_MAX,
             "update processes (default 1)"),
    CLI_UINT(rl_args, o.steps, "steps", "N", 1, 100000, "update steps (default 6)"),
    CLI_UINT(rl_args, o.batch, "batch", "N", 1, 65536,
             "samples per update process and step (default 64)"),
    CLI_ARG(rl_args, pools, "pools", "R:U[xSTEPS],...",
            "phases: 4:2x3,6:2x3 is 4 rollouts and 2 update\n"
            "processes for 3 steps, then 6 and 2 for 3 more (a\n"
            "phase without xSTEPS runs --steps steps; default: one\n"
            "phase of --rollouts and --updaters)"),
    CLI_UINT(rl_args, o.kills, "kill", "N", 0, 1000,
             "N times, at a random point of a random step (never\n"
             "the last), SIGKILL a random rollout and a random\n"
             "update process and start them again (default 0)"),
    CLI_EACH("seed", "N", seed_each, "the kills' random seed (default: the time and pid)"),
    CLI_DOUBLE(rl_args, o.rate, "rate", "SAMPLES_PER_S", 0, 1e6,
               "samples/s per rollout, 0: as fast as it can\n(default 60)"),
    CLI_DOUBLE(rl_args, o.train_ms, "train-ms", "MS", 0, 3600e3,
               "time one update step trains (default 100)"),
    CLI_UINT(rl_args, o.lag, "max-policy-lag", "K", 0, 1000000,
             "the sample queue's max_policy_lag (default 0)"),
    CLI_CHOICE(rl_args, stale, "stale", "drop|recompute",
               "what becomes of a sample past --max-policy-lag\n(default recompute)"),
    CLI_UINT(rl_args, o.tokens, "tokens", "N", 1, 1u << 20, "tokens per sample (default 256)"),
    CLI_UINT(rl_args, o.bound, "bound", "N", 0, 1000000000,
             "the sample queue's bound (default 2 x batch x most\nupdaters)"),
    CLI_UINT(rl_args, o.lease_ms, "lease-ms", "MS", 100, 600000,
             "how long a popped sample stays leased: a killed\n"
             "member's samples come back after it (keep it above\n"
             "one step's time; default 5000)"),
    CLI_SIZE(rl_args, o.weight_bytes, "weights", "SIZE", 4096 * RL_NT, 1ull << 40,
             "the policy weights (default 8M)"),
    CLI_FLAG(rl_args, o.json, "json", "one JSON object on stdout (default: text)"),
};

static const cli_cmd rl_cmd = {
    .name = "demo rl",
    .about = "Rollout and update processes exchange samples through a sample queue and policy\n"
             "versions through the weights registry; every sample is accounted for.",
    .opts = rl_table,
    .nopts = sizeof rl_table / sizeof rl_table[0],
};

void demo_rl_usage(FILE *f)
{
    cli_cmd_usage(f, &rl_cmd);
}

/* "R:U" or "R:UxS", each a whole number; -1 and a line on stderr otherwise. */
static int parse_phase(const char *item, size_t len, unsigned idx, unsigned dsteps, rl_phase *p)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        goto bad;
    memcpy(buf, item, len);
    buf[len] = '\0';
    char *colon = strchr(buf, ':'), *x = strchr(buf, 'x');
    if (!colon || (x && x < colon))
        goto bad;
    *colon = '\0';
    if (x)
        *x = '\0';
    uint64_t r, u, s = dsteps;
    if (cli_parse_uint(buf, &r) < 0 || cli_parse_uint(colon + 1, &u) < 0 ||
        (x && cli_parse_uint(x + 1, &s) < 0))
        goto bad;
    const char *what = r < 1 || r > RL_POOL_MAX ? "rollouts"
                       : u < 1 || u > RL_POOL_MAX ? "update processes"
                       : s < 1 || s > 100000 ? "steps" : NULL;
    if (what) {
        fprintf(stderr, "ferry-lab demo rl: --pools phase %u ('%.*s'): %s must be from 1 to %u\n",
                idx + 1, (int)len, item, what, strcmp(what, "steps") ? RL_POOL_MAX : 100000);
        return -1;
    }
    *p = (rl_phase){ (unsigned)r, (unsigned)u, (unsigned)s };
    return 0;
bad:
    fprintf(stderr, "ferry-lab demo rl: --pools wants ROLLOUTS:UPDATERS[xSTEPS] phases separated by "
            "commas (e.g. 4:2x3,6:2x3), not '%.*s'\n", (int)len, item);
    return -1;
}

static int parse_pools(const char *v, unsigned dsteps, rl_opts *o)
{
    o->nphase = 0;
    for (const char *p = v;;) {
        size_t len = strcspn(p, ",");
        if (o->nphase == RL_PHASES_MAX) {
            fprintf(stderr, "ferry-lab demo rl: --pools takes at most %d phases\n", RL_PHASES_MAX);
            return -1;
        }
        if (parse_phase(p, len, o->nphase, dsteps, &o->phase[o->nphase]) < 0)
            return -1;
        o->nphase++;
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

/* What the options together must satisfy (after the loop). */
static int check_rl(rl_opts *o, const char *pools, bool sized)
{
    if (pools && sized) {
        fprintf(stderr, "ferry-lab demo rl: --pools sets the pool sizes; leave out --rollouts and "
                "--updaters\n");
        return -1;
    }
    if (pools && parse_pools(pools, o->steps, o) < 0)
        return -1;
    o->steps = 0;
    o->max_rollouts = o->max_updaters = 0;
    for (unsigned i = 0; i < o->nphase; i++) {
        o->steps += o->phase[i].steps;
        if (o->phase[i].rollouts > o->max_rollouts)
            o->max_rollouts = o->phase[i].rollouts;
        if (o->phase[i].updaters > o->max_updaters)
            o->max_updaters = o->phase[i].updaters;
    }
    if (o->kills > 0 && o->kills >= o->steps) {
        fprintf(stderr, "ferry-lab demo rl: --kill %u needs more steps: one kill per step at most and "
                "none in the last (%u steps allow %u)\n", o->kills, o->steps, o->steps - 1);
        return -1;
    }
    /* The bound counts leased records too: below the batches every update
     * process holds at once, producers and consumers would wait on each
     * other until leases lapse. */
    uint64_t inflight = (uint64_t)o->batch * o->max_updaters;
    if (o->bound == 0)
        o->bound = 2 * inflight;
    if (o->bound <= inflight) {
        fprintf(stderr, "ferry-lab demo rl: --bound %" PRIu64 " must exceed batch x updaters = %" PRIu64
                " (leased samples count against it)\n", o->bound, inflight);
        return -1;
    }
    return 0;
}

int demo_rl_parse(int argc, char **argv, rl_opts *o)
{
    rl_args a = { .o = { .steps = 6, .batch = 64, .tokens = 256, .lag = 0, .rate = 60,
                         .train_ms = 100, .weight_bytes = 8u << 20, .bound = 0,
                         .lease_ms = 5000, .nphase = 1 } };
    int pr = cli_parse(&rl_cmd, argc, argv, &a, NULL, NULL);
    if (pr != 0)
        return pr;
    *o = a.o;
    bool sized = o->phase[0].rollouts || o->phase[0].updaters;
    if (!o->phase[0].rollouts)
        o->phase[0].rollouts = 3;
    if (!o->phase[0].updaters)
        o->phase[0].updaters = 1;
    o->recompute = !a.stale || !strcmp(a.stale, "recompute");
    o->phase[0].steps = o->steps;
    return check_rl(o, a.pools, sized);
}
