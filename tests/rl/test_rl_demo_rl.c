/* `ferry-lab demo rl` end to end through the built binary: separate rollout
 * and update processes on the demo's own master and node; every produced
 * sample must end trained once, dropped or sent back for recompute (lost 0,
 * duplicated 0), the rollouts must load every version's weights correctly,
 * and the JSON must carry the keys scripts read. With --pools and --kill:
 * pools resized between phases and members SIGKILLed mid-step and started
 * again, the accounting (ledgers against the queue's claim log) still
 * closes and the restarted members work again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/ftstore.h"

static char out[1 << 16];

static void run(const char *args)
{
    int st = ft_run(out, sizeof out, "%s demo rl %s --json", ft_lab_bin(), args);
    fprintf(stderr, "%s: %s", args, out);
    assert_int_equal(st, 0);
}

static double num(const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(out, k);
    assert_non_null(p);
    return atof(p + strlen(k));
}

static void test_recompute(void **state)
{
    (void)state;
    run("--rollouts 2 --steps 3 --batch 32 --train-ms 20 --tokens 64 --weights 1M");
    assert_non_null(strstr(out, "\"ok\": true"));
    assert_int_equal((int)num("lost"), 0);
    assert_int_equal((int)num("duplicated"), 0);
    assert_int_equal((int)num("weight_errors"), 0);
    assert_true(num("acked") >= 3 * 32);
    assert_int_equal((int)num("dropped"), 0);   /* stale samples went back, none dropped */
    assert_true(num("produced") >= num("acked"));
    const char *keys[] = { "samples_per_s", "stale_rate", "recompute_rate", "update_s_p50",
                           "latency_ms_p50", "latency_ms_p99" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_true(num(keys[i]) >= 0);
}

static void test_drop_two_updaters(void **state)
{
    (void)state;
    run("--rollouts 2 --updaters 2 --steps 2 --batch 16 --train-ms 20 --tokens 64 "
        "--weights 1M --stale drop");
    assert_non_null(strstr(out, "\"ok\": true"));
    assert_int_equal((int)num("lost"), 0);
    assert_int_equal((int)num("duplicated"), 0);
    assert_int_equal((int)num("recomputed"), 0);
    assert_int_equal((int)num("dropped"), (int)num("stale"));
    assert_true(num("acked") >= 2 * 2 * 16);
}

/* The JSON array after "key": [ as text, up to its ']'. */
static const char *arr(const char *key, char *buf, size_t cap)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\": [", key);
    const char *p = strstr(out, k);
    assert_non_null(p);
    p += strlen(k);
    size_t n = strcspn(p, "]");
    snprintf(buf, cap, "%.*s", (int)n, p);
    return buf;
}

/* Two phases (2 rollouts and 1 update process, then 3 and 2) and two kills.
 * Seed 9 puts the kills in steps 1 and 3 (one per phase), so each restarted
 * member has later steps to work in; where in its step a kill lands
 * depends on the machine's speed, which only moves counts between the
 * kill columns, never the verdicts asserted. */
static void test_pools_and_kills(void **state)
{
    (void)state;
    run("--pools 2:1x2,3:2x3 --kill 2 --seed 9 --batch 16 --train-ms 20 --tokens 64 "
        "--weights 1M --lease-ms 2000");
    assert_non_null(strstr(out, "\"ok\": true"));
    char buf[256];
    assert_string_equal(arr("phases", buf, sizeof buf),
                        "{\"rollouts\": 2, \"updaters\": 1, \"steps\": 2}, "
                        "{\"rollouts\": 3, \"updaters\": 2, \"steps\": 3}");
    assert_int_equal((int)num("kills"), 2);
    assert_string_equal(arr("kill_steps", buf, sizeof buf), "1, 3");
    assert_int_equal((int)num("lost"), 0);
    assert_int_equal((int)num("duplicated"), 0);
    assert_int_equal((int)num("inconsistent"), 0);
    assert_int_equal((int)num("weight_errors"), 0);
    /* every step trains a batch on every update process of its phase */
    assert_true(num("trained_in_steps") >= 2 * 1 * 16 + 3 * 2 * 16);
    /* the restarted incarnations produced and trained again */
    assert_true(num("restarted_produced") > 0);
    assert_true(num("restarted_trained") > 0);
    /* the accounting closes: each produced sample trained once, or rejected */
    assert_int_equal((int)num("produced"), (int)(num("acked") + num("stale")));
    assert_int_equal((int)num("stale"), (int)(num("sent_back") + num("recompute_lost")));
    assert_true(num("recompute_lost") <= num("kills"));   /* the queue's window, once a kill */
    /* what a kill leaves in flight is bounded by the kills */
    assert_true(num("pushes_cut_by_kill") <= 2);
    assert_true(num("landed_unrecorded") + num("orphaned_payloads") <= num("pushes_cut_by_kill"));
    assert_true(num("acks_cut_by_kill") <= 2 * 16);
    const char *keys[] = { "samples_per_s", "stale_rejection_rate", "recompute_rate",
                           "leased_by_killed", "redelivered_trained" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_true(num(keys[i]) >= 0);
}

/* The same with stale samples dropped: what is rejected is dropped, none sent back. */
static void test_kills_drop(void **state)
{
    (void)state;
    run("--pools 3:2x3 --kill 2 --seed 4 --batch 16 --train-ms 20 --tokens 64 --weights 1M "
        "--lease-ms 2000 --stale drop");
    assert_non_null(strstr(out, "\"ok\": true"));
    assert_int_equal((int)num("kills"), 2);
    assert_int_equal((int)num("lost"), 0);
    assert_int_equal((int)num("duplicated"), 0);
    assert_int_equal((int)num("inconsistent"), 0);
    assert_int_equal((int)num("sent_back"), 0);
    assert_int_equal((int)num("recomputed"), 0);
    assert_int_equal((int)num("dropped"), (int)num("stale"));
    assert_int_equal((int)num("produced"), (int)(num("acked") + num("stale")));
    assert_true(num("restarted_trained") > 0);
}

static void test_bad_pools_refused(void **state)
{
    (void)state;
    const struct { const char *args, *says; } bad[] = {
        { "--pools 4:2,0:2", "--pools phase 2 ('0:2'): rollouts must be from 1 to 64" },
        { "--pools 4-2", "--pools wants ROLLOUTS:UPDATERS[xSTEPS]" },
        { "--pools 4:2x", "not '4:2x'" },
        { "--pools 4:2x3,", "not ''" },
        { "--pools 4:2 --updaters 2", "leave out --rollouts and --updaters" },
        { "--pools 4:2x2,6:2x1 --kill 3", "--kill 3 needs more steps" },
        { "--steps 1 --kill 1", "(1 steps allow 0)" },
        { "--lease-ms 5", "--lease-ms wants a whole number from 100" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = ft_run(out, sizeof out, "%s demo rl %s 2>&1", ft_lab_bin(), bad[i].args);
        fprintf(stderr, "%s: %s", bad[i].args, out);
        assert_int_equal(st, 2);
        assert_non_null(strstr(out, bad[i].says));
        assert_non_null(strstr(out, "usage: ferry-lab demo rl"));
    }
}

static void test_bad_bound_refused(void **state)
{
    (void)state;
    int st = ft_run(out, sizeof out, "%s demo rl --batch 32 --updaters 2 --bound 64 2>&1", ft_lab_bin());
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "must exceed batch x updaters"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_drop_two_updaters),
        cmocka_unit_test(test_pools_and_kills),
        cmocka_unit_test(test_kills_drop),
        cmocka_unit_test(test_bad_pools_refused),
        cmocka_unit_test(test_bad_bound_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
