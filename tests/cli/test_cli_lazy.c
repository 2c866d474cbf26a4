/* The ferry command costs nothing it does not use: `ferry --version` and
 * `ferry plan --help` load neither UCX (the ucx transport loads it when an
 * engine starts it) nor libmicrohttpd and gnutls (loaded when metrics are
 * served), as the dynamic loader reports them (LD_DEBUG=libs). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "util/ftstore.h"
#include "util/testutil.h"

static char out[1 << 18];

static void loads_nothing_unused(const char *args)
{
    /* the loader's lines on stderr, the command's output thrown away */
    int st = ft_run(out, sizeof out, "LD_DEBUG=libs %s %s 2>&1 >/dev/null", ft_ferry_bin(), args);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "libsodium"));   /* the loader did report what it loaded */
    const char *unused[] = {"libucp", "libucs", "libuct", "libmicrohttpd", "libgnutls"};
    for (size_t i = 0; i < sizeof unused / sizeof *unused; i++) {
        const char *hit = strstr(out, unused[i]);
        if (hit)
            fprintf(stderr, "ferry %s loaded %s: %.*s\n", args, unused[i], (int)strcspn(hit, "\n"), hit);
        assert_null(hit);
    }
}

static void test_version(void **s)
{
    (void)s;
    loads_nothing_unused("--version");
}

static void test_plan_help(void **s)
{
    (void)s;
    loads_nothing_unused("plan --help");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_plan_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
