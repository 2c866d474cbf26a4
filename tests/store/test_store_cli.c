/* `ferry up --detach`, `ferry status`, `ferry down` through the built
 * binary (FERRY_BIN), on a private state directory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/ftstore.h"

static void test_up_status_down(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-up-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char out[8192];
    const char *bin = ft_ferry_bin();
    int up = ft_run(out, sizeof out, "FERRY_TOKEN= FERRY_TOKEN_FILE= %s up --dir %s --size 32M --detach",
                 bin, dir);
    char *exp = strstr(out, "export FERRY_MASTER=");
    char master[64] = "";
    if (exp)
        sscanf(exp, "export FERRY_MASTER=%63s", master);
    int st = up == 0 ? ft_run(out, sizeof out, "%s status --dir %s --json", bin, dir) : -1;
    bool has_seg = strstr(out, "\"segments\"") && strstr(out, "33554432");
    int st2 = up == 0 ? ft_run(out, sizeof out, "%s status --dir %s", bin, dir) : -1;
    bool table = strstr(out, "32 MiB") != NULL;
    /* The token file written by up authenticates a client; none refuses it. */
    char tok[300];
    snprintf(tok, sizeof tok, "%s/token", dir);
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", master);
    ferry_store *s = NULL;
    int open_rc = ferry_engine_config_token_file(&cfg.engine, tok);
    if (open_rc == 0)
        open_rc = ferry_store_open(&cfg, &s);
    int put_rc = s ? ferry_store_put(s, "hello", "world", 5, NULL, NULL) : -1;
    ferry_store_close(s);
    int down = ft_run(out, sizeof out, "%s down --dir %s", bin, dir);
    int again = ft_run(out, sizeof out, "%s down --dir %s 2>&1", bin, dir);
    int gone = ft_run(out, sizeof out, "%s status --dir %s 2>&1", bin, dir);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(up, 0);
    assert_non_null(exp);
    assert_int_equal(st, 0);
    assert_true(has_seg);
    assert_int_equal(st2, 0);
    assert_true(table);
    assert_int_equal(open_rc, 0);
    assert_int_equal(put_rc, 0);
    assert_int_equal(down, 0);
    assert_int_not_equal(again, 0);
    assert_int_not_equal(gone, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_up_status_down),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
