/* A client given a list of masters (FERRY_MASTER="A,B"; a cluster's
 * masters, of which only the leader accepts): it connects to the first
 * that answers, and when that one goes it reconnects to the next one that
 * answers, in turn. Two independent masters stand in for a cluster's. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/base.h"
#include "util/ftstore.h"

/* The list written into the config (its master field holds 127 bytes). */
static void set_master(ferry_store_config *cfg, const char *a, const char *b, const char *c)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%s%s%s%s%s", a, b ? "," : "", b ? b : "", c ? "," : "",
                     c ? c : "");
    assert_true(n > 0 && (size_t)n < sizeof cfg->master);
    memcpy(cfg->master, buf, (size_t)n + 1);
}

typedef struct two { ft_cluster a, b; } two;

/* Two masters, stopped and their dirs removed by the teardown (also after
 * a failed assertion). */
static int setup(void **state)
{
    two *t = calloc(1, sizeof *t);
    *state = t;
    if (!t || ft_master_start(&t->a, NULL, NULL) != 0 || ft_master_start(&t->b, NULL, NULL) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    two *t = *state;
    if (t) {
        ft_cluster_stop(&t->a);
        ft_cluster_stop(&t->b);
        free(t);
    }
    return 0;
}

static void test_list_of_masters(void **state)
{
    two *t = *state;
    ft_cluster a = t->a, b = t->b;   /* copies: their addresses and dirs */
    ferry_store_config cfg;
    ft_store_config(&a, &cfg);
    /* nothing listens on port 9: the next entry answers */
    set_master(&cfg, "127.0.0.1:9", a.addr, b.addr);
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    assert_int_equal(ferry_kv_put(s, "where", "a", 1, NULL, &err), 0);
    /* A goes: the client reconnects to B (the next that answers) */
    ft_proc_kill(&t->a.master, SIGKILL);
    uint64_t deadline = fr_deadline_ns(30000);
    int rc = -1;
    while (fr_ms_left(deadline) > 0 && (rc = ferry_kv_put(s, "where", "b", 1, NULL, NULL)) != 0) {
        struct timespec ts = { 0, 50 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
    }
    assert_int_equal(rc, 0);
    ferry_kv_value v;
    assert_int_equal(ferry_kv_get(s, "where", &v, &err), 0);
    assert_int_equal(v.len, 1);
    assert_memory_equal(v.val, "b", 1);
    ferry_store_free(v.val);
    ferry_store_close(s);
    /* a malformed list is refused at open */
    set_master(&cfg, b.addr, "", b.addr);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_store_open(&cfg, &s, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "has no port", NULL, NULL);
    set_master(&cfg, b.addr, "127.0.0.1", NULL);
    assert_int_equal(ferry_store_open(&cfg, &s, &err), FERRY_EINVAL);
    /* none answers */
    set_master(&cfg, "127.0.0.1:9", "127.0.0.1:11", NULL);
    cfg.timeout_ms = 2000;
    memset(&err, 0, sizeof err);
    assert_true(ferry_store_open(&cfg, &s, &err) < 0);
    fprintf(stderr, "no master answers: %s\n", err.msg);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_list_of_masters, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
