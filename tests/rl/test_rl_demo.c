/* `ferry-lab demo` end to end at a small size through the built binary: it
 * starts its own master and node, trainers and rollouts, and must verify
 * every byte of every generation in both update forms, with the direct
 * and the compatibility (group) forms reading exactly the published bytes
 * once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/ftstore.h"

static void test_demo_small(void **state)
{
    (void)state;
    static char out[1 << 16];
    int st = ft_run(out, sizeof out, "%s demo --bytes 48M --trainers 3 --rollouts 2 --generations 2 --fp8 "
                    "--json", ft_lab_bin());
    fprintf(stderr, "%s", out);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "\"ok\":true"));
    assert_non_null(strstr(out, "\"generation\":2"));
    assert_non_null(strstr(out, "\"direct_read_ratio\":1.000"));
    assert_non_null(strstr(out, "\"compat_read_ratio\":1.000"));
    /* the FP8 group beside them (--fp8): each stored byte read once, about half the bf16 bytes (the
     * embedding and norms of qwen3-8b's first 48M stay bf16), every FP8 byte and scale checked */
    assert_non_null(strstr(out, "\"fp8_stored_bytes\":21593088,\"fp8_store_bytes\":21593088,"));
    assert_non_null(strstr(out, "\"fp8_bytes_ratio\":0.507"));
    assert_null(strstr(out, "\"ok\":false"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
