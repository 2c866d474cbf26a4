/* `ferry-lab demo rl`'s options: the pool phases (--pools), the kills and the
 * rest. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "lab.h"
#include "demo_rl.h"

void demo_rl_usage(FILE *f)
{
    fprintf(f,
            "usage: ferry-lab demo rl [--rollouts N (3)] [--updaters N (1)] [--steps N (6)] [--batch N (64)]\n"
            "                     [--pools R:U[xSTEPS],R:U[xSTEPS],...] [--kill N (0)] [--seed N]\n"
            "                     [--rate SAMPLES_PER_S (60)] [--train-ms MS (100)] [--max-policy-lag K (0)]\n"
            "                     [--stale drop|recompute (recompute)] [--tokens N (256)]\n"
            "                     [--bound N (2 x batch x most updaters)] [--lease-ms MS (5000)]\n"
            "                     [--weights SIZE (8M)] [--json]\n"
            "\n"
            "Rollout and update processes exchange samples through a sample queue and policy\n"
            "versions through the weights registry; every sample is accounted for.\n"
            "  --pools 4:2x3,6:2x3  4 rollouts and 2 update processes for 3 steps, then 6 and 2\n"
            "                       for 3 more (a phase without xSTEPS runs --steps steps)\n"
            "  --kill N             N times (up to 1000), at a random point of a random step\n"
            "                       (never the last), SIGKILL a random rollout and a random\n"
            "                       update process and start them again\n"
            "  --lease-ms MS        how long a popped sample stays leased: a killed member's\n"
            "                       samples come back after it (keep it above one step's time)\n");
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
    *o = (rl_opts){ .steps = 6, .batch = 64, .tokens = 256, .lag = 0, .rate = 60,
                    .train_ms = 100, .weight_bytes = 8u << 20, .bound = 0, .recompute = true,
                    .lease_ms = 5000, .nphase = 1 };
    o->phase[0] = (rl_phase){ 3, 1, 0 };
    const char *pools = NULL;
    bool sized = false;
    cli_getopt g;
    cli_getopt_init(&g, "demo rl", argc, argv,
                    "rollouts=,updaters=,steps=,batch=,tokens=,bound=,max-policy-lag=,rate=,"
                    "train-ms=,stale=,weights=,pools=,kill=,seed=,lease-ms=,json");
    while (cli_getopt_next(&g)) {
        const char *a = g.opt, *v = g.val;
        int rc = 0;
        if (!strcmp(a, "--json"))
            o->json = true;
        else if (!strcmp(a, "--rollouts"))
            rc = cli_opt_unsigned(a, v, 1, RL_POOL_MAX, &o->phase[0].rollouts), sized = true;
        else if (!strcmp(a, "--updaters"))
            rc = cli_opt_unsigned(a, v, 1, RL_POOL_MAX, &o->phase[0].updaters), sized = true;
        else if (!strcmp(a, "--steps"))
            rc = cli_opt_unsigned(a, v, 1, 100000, &o->steps);
        else if (!strcmp(a, "--pools"))
            pools = v;
        else if (!strcmp(a, "--kill"))
            rc = cli_opt_unsigned(a, v, 0, 1000, &o->kills);
        else if (!strcmp(a, "--seed"))
            rc = cli_opt_uint(a, v, 0, UINT64_MAX, &o->seed), o->seeded = true;
        else if (!strcmp(a, "--lease-ms"))
            rc = cli_opt_uint(a, v, 100, 600000, &o->lease_ms);
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
                fprintf(stderr, "ferry-lab: --stale wants drop or recompute, not '%s'\n", v);
                return -1;
            }
            o->recompute = !strcmp(v, "recompute");
        } else if (!strcmp(a, "--weights"))
            rc = cli_opt_size(a, v, 4096 * RL_NT, 1ull << 40, &o->weight_bytes);
        else
            return cli_getopt_unhandled(&g);
        if (rc < 0)
            return -1;
    }
    int pr = cli_getopt_end(&g, 0);
    if (pr != 0)
        return pr;
    o->phase[0].steps = o->steps;
    return check_rl(o, pools, sized);
}
