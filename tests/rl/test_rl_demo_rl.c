/* `ferry demo rl` end to end through the built binary: separate rollout
 * and update processes on the demo's own master and node; every produced
 * sample must end trained once, dropped or sent back for recompute (lost 0,
 * duplicated 0), the rollouts must load every version's weights correctly,
 * and the JSON must carry the keys scripts read. */
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
    int st = ft_run(out, sizeof out, "%s demo rl %s --json", ft_ferry_bin(), args);
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

static void test_bad_bound_refused(void **state)
{
    (void)state;
    int st = ft_run(out, sizeof out, "%s demo rl --batch 32 --updaters 2 --bound 64 2>&1", ft_ferry_bin());
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "must exceed batch x updaters"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_drop_two_updaters),
        cmocka_unit_test(test_bad_bound_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
