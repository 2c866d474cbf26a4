/* The rl layer's store keys (src/rl/keys.c): each builder writes the
 * documented layout (docs/weights.md, "Keys"), byte for byte what earlier
 * builds wrote, and refuses what would not fit or has no name: an empty
 * key and a negative code, never a truncated key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ferry/ferry.h"
#include "rl/keys.h"

/* n is the builder's return, k what it wrote: the layout and its length. */
#define KEY_IS(n, k, want)                                \
    do {                                                  \
        int n_ = (n);                                     \
        assert_string_equal((k), (want));                 \
        assert_int_equal(n_, (int)strlen(want));          \
    } while (0)

static void test_layout(void **state)
{
    (void)state;
    char k[FR_KEY_MAX];
    KEY_IS(fr_key_wk(k, sizeof k, "m", 0, "active"), k, "ferry/wk/m/active");
    KEY_IS(fr_key_wk(k, sizeof k, "m", 7, "manifest"), k,
           "ferry/wk/m/00000000000000000007/manifest");
    KEY_IS(fr_key_wk_part(k, sizeof k, "m", 7, 3), k, "ferry/wk/m/00000000000000000007/part/3");
    KEY_IS(fr_key_wk_part(k, sizeof k, "m", 7, -1), k, "ferry/wk/m/00000000000000000007/part/");
    KEY_IS(fr_key_wk_delta(k, sizeof k, "m", 7, "count", 3), k,
           "ferry/wk/m/00000000000000000007/delta/count/3");
    KEY_IS(fr_key_wk_delta(k, sizeof k, "m", 7, "decision", -1), k,
           "ferry/wk/m/00000000000000000007/delta/decision");
    KEY_IS(fr_key_delta_part(k, sizeof k, "m", 7, 2, 0), k, "ferry/w/m/00000000000000000007/dpart.2.0");
    KEY_IS(fr_key_gen_file(k, sizeof k, "m", 7, "manifest.json"), k,
           "ferry/w/m/00000000000000000007/manifest.json");
    KEY_IS(fr_key_gen_object(k, sizeof k, "m", 7, 2, 5), k, "ferry/w/m/00000000000000000007/r2.5");
    KEY_IS(fr_key_gen_prefix(k, sizeof k, "m", 7), k, "ferry/w/m/00000000000000000007/");
    KEY_IS(fr_key_gens(k, sizeof k, "m"), k, "ferry/w/m/");
    KEY_IS(fr_key_gen_past(k, sizeof k, "m", 7), k, "ferry/w/m/000000000000000000070");
    KEY_IS(fr_key_policy_history(k, sizeof k, "m"), k, "ferry/pv/m/history");
    KEY_IS(fr_key_sub_demand(k, sizeof k, "m", "g/compat1", 9, 4), k,
           "ferry/wk/m/sub/g/compat1/00000000000000000009/4");
    KEY_IS(fr_key_sub_barrier(k, sizeof k, "m", "g", 9, "demand"), k,
           "ferry/wb/m/sub/g/00000000000000000009/demand");
    KEY_IS(fr_key_agree_barrier(k, sizeof k, "m", "g", "agreed"), k, "ferry/wb/m/sub/g/agreed");
    KEY_IS(fr_key_agree(k, sizeof k, "m", "g", 2, 1), k,
           "ferry/wk/m/sub/g/agree/00000000000000000002/1");
    KEY_IS(fr_key_early(k, sizeof k, "m", "g", "verdict"), k, "ferry/wk/m/sub/g/early/verdict");
    KEY_IS(fr_key_member(k, sizeof k, "m", "g", "m/", "00000000000000ab"), k,
           "ferry/wg/m/g/m/00000000000000ab");
    KEY_IS(fr_key_member(k, sizeof k, "m", "g", "list", NULL), k, "ferry/wg/m/g/list");
    KEY_IS(fr_key_member(k, sizeof k, "m", "g", "", NULL), k, "ferry/wg/m/g/");
    KEY_IS(fr_key_member_live(k, sizeof k, "m", "g", "00000000000000ab"), k,
           "ferry/wl/m/g/00000000000000ab");
    KEY_IS(fr_key_compat_rec(k, sizeof k, "m", "g", 3), k, "ferry/wc/m/g/rec/3");
    KEY_IS(fr_key_compat_run(k, sizeof k, "m", "g", 0xabcULL, "abort"), k,
           "ferry/wc/m/g/0000000000000abc/abort");
    KEY_IS(fr_key_compat(k, sizeof k, "m", "g", "prepared"), k, "ferry/wc/m/g/prepared");
    KEY_IS(fr_key_sample(k, sizeof k, "q", 5, 0xbeefULL), k,
           "ferry/rl/q/00000000000000000005/000000000000beef");
    KEY_IS(fr_key_samples(k, sizeof k, "q"), k, "ferry/rl/q/");
    KEY_IS(fr_key_claim(k, sizeof k, "q", 0xbeefULL), k, "ferry/rl/q/claim/000000000000beef");
    KEY_IS(fr_key_claims(k, sizeof k, "q"), k, "ferry/rl/q/claim/");
    KEY_IS(fr_key_claims_mark(k, sizeof k, "q"), k, "ferry/rl/q/claim/end");
    KEY_IS(fr_key_kvcache(k, sizeof k, "ns", 3), k, "ferry/kv/ns/00000000000000000003/");
    uint64_t v = 0;
    assert_int_equal(fr_key_kvcache_version("ferry/kv/ns/00000000000000000003/x", &v), 0);
    assert_int_equal(v, 3);
    assert_int_equal(fr_key_kvcache_version("ferry/kv/ns/0000000000000000003/x", &v), FERRY_EINVAL);
    assert_int_equal(fr_key_kvcache_version("ferry/rl/ns/00000000000000000003/x", &v), FERRY_EINVAL);
    /* the public builder agrees with the internal one */
    char p[FR_KEY_MAX];
    int np = ferry_weights_key("m", 7, "r2.5", p, sizeof p);
    int nk = fr_key_gen_object(k, sizeof k, "m", 7, 2, 5);
    assert_string_equal(p, k);
    assert_int_equal(np, nk);
}

/* Names of FR_KEY_NAME_MAX bytes fit FR_KEY_MAX, the longest key included;
 * one byte less room is refused, never truncated. */
static void test_sizes(void **state)
{
    (void)state;
    char name[FR_KEY_NAME_MAX + 1], k[FR_KEY_MAX];
    memset(name, 'n', FR_KEY_NAME_MAX);
    name[FR_KEY_NAME_MAX] = '\0';
    int n = fr_key_agree(k, sizeof k, name, name, UINT64_MAX, UINT32_MAX);
    assert_true(n > 0 && n < FR_KEY_MAX);
    assert_int_equal(fr_key_agree(k, (size_t)n, name, name, UINT64_MAX, UINT32_MAX),
                     FERRY_EMSGSIZE);
    assert_string_equal(k, "");
    assert_int_equal(fr_key_agree(k, (size_t)n + 1, name, name, UINT64_MAX, UINT32_MAX), n);
    int m = fr_key_sample(k, FR_KEY_SAMPLE_MAX, name, UINT64_MAX, UINT64_MAX);
    assert_int_equal(m, FR_KEY_SAMPLE_MAX - 1);
    /* a name longer than a config holds does not fit the sample key's size */
    char longer[FR_KEY_NAME_MAX + 2];
    memset(longer, 'n', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    assert_int_equal(fr_key_sample(k, FR_KEY_SAMPLE_MAX, longer, 1, 1), FERRY_EMSGSIZE);
    assert_string_equal(k, "");
    struct { const char *what; int n; } all[] = {
        { "wk", fr_key_wk(k, sizeof k, name, UINT64_MAX, "manifest") },
        { "sub_demand", fr_key_sub_demand(k, sizeof k, name, name, UINT64_MAX, UINT32_MAX) },
        { "sub_barrier", fr_key_sub_barrier(k, sizeof k, name, name, UINT64_MAX, "applied") },
        { "early", fr_key_early(k, sizeof k, name, name, "verdict") },
        { "member", fr_key_member(k, sizeof k, name, name, "m/", "0123456789abcdef") },
        { "compat_run", fr_key_compat_run(k, sizeof k, name, name, UINT64_MAX, "abort") },
        { "claim", fr_key_claim(k, sizeof k, name, UINT64_MAX) },
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (all[i].n <= 0 || all[i].n >= FR_KEY_MAX)
            fail_msg("%s: %d with names of FR_KEY_NAME_MAX bytes", all[i].what, all[i].n);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    char k[FR_KEY_MAX];
    strcpy(k, "old");
    assert_int_equal(fr_key_wk(k, sizeof k, NULL, 1, "manifest"), FERRY_EINVAL);
    assert_string_equal(k, "");
    strcpy(k, "old");
    assert_int_equal(fr_key_claim(k, sizeof k, NULL, 1), FERRY_EINVAL);
    assert_string_equal(k, "");
    strcpy(k, "old");   /* the names ferry_weights_key refuses */
    assert_int_equal(fr_key_gen_object(k, sizeof k, "a/b", 1, 0, 0), FERRY_EINVAL);
    assert_string_equal(k, "");
    assert_int_equal(fr_key_gen_prefix(k, sizeof k, "", 1), FERRY_EINVAL);
    assert_int_equal(fr_key_kvcache(k, sizeof k, "a/b", 1), FERRY_EINVAL);
    assert_int_equal(fr_key_kvcache(k, sizeof k, "", 1), FERRY_EINVAL);
    /* too small: refused whole */
    strcpy(k, "old");
    assert_int_equal(fr_key_wk(k, 10, "model", 0, "active"), FERRY_EMSGSIZE);
    assert_string_equal(k, "");
    assert_int_equal(ferry_weights_key("m", 1, "x", k, 10), FERRY_EMSGSIZE);
    assert_string_equal(k, "");
    assert_int_equal(fr_key_wk(NULL, 0, "m", 0, "active"), FERRY_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
