/* ferry's etcd client (src/store/etcd.c) against a real etcd: keys and
 * binary values, leases, the compare-and-put that elects a leader and
 * fences a deposed one, several endpoints, and the errors: bad endpoints,
 * an etcd that is gone, what etcd refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>

#include <cmocka.h>

#include "base/base.h"
#include "store/etcd_int.h"
#include "util/ftetcd.h"

static void test_keys(void **state)
{
    ft_etcd *e = *state;
    fr_etcd *c = NULL;
    ferry_error err = {0};
    assert_int_equal(fr_etcd_open(e->url, 5000, &c, &err), 0);
    const unsigned char val[] = { 'a', 0, 0xff, '\n', 'z' };   /* binary, NULs included */
    int64_t r1 = 0, r2 = 0, deleted = 0;
    assert_int_equal(fr_etcd_put(c, "t/k", val, sizeof val, 0, &r1, &err), 0);
    assert_int_equal(fr_etcd_put(c, "t/k", "v2", 2, 0, &r2, &err), 0);
    assert_true(r2 > r1 && r1 > 0);
    fr_etcd_kv kv;
    assert_int_equal(fr_etcd_get(c, "t/k", &kv, &err), 0);
    assert_int_equal(kv.len, 2);
    assert_memory_equal(kv.val, "v2", 2);
    assert_int_equal(kv.create_rev, r1);
    assert_int_equal(kv.mod_rev, r2);
    assert_int_equal(kv.version, 2);
    fr_etcd_kv_clear(&kv);
    assert_int_equal(fr_etcd_put(c, "t/bin", val, sizeof val, 0, NULL, &err), 0);
    assert_int_equal(fr_etcd_get(c, "t/bin", &kv, &err), 0);
    assert_int_equal(kv.len, sizeof val);
    assert_memory_equal(kv.val, val, sizeof val);
    fr_etcd_kv_clear(&kv);
    assert_int_equal(fr_etcd_put(c, "t/empty", "", 0, 0, NULL, &err), 0);
    assert_int_equal(fr_etcd_get(c, "t/empty", &kv, &err), 0);
    assert_int_equal(kv.len, 0);
    assert_true(kv.create_rev > 0);
    fr_etcd_kv_clear(&kv);
    assert_int_equal(fr_etcd_delete(c, "t/k", &deleted, &err), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(fr_etcd_delete(c, "t/k", &deleted, &err), 0);
    assert_int_equal(deleted, 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_get(c, "t/k", &kv, &err), FERRY_ENOENT);
    ft_assert_says(&err, FERRY_ENOENT, "no key t/k", NULL, NULL);
    assert_null(kv.val);
    fr_etcd_close(c);
}

/* Two masters campaign for one key with their leases; the winner's writes
 * are fenced by the create revision it won with; once its lease is gone
 * the other wins, and the first one's fenced write fails in etcd. */
static void test_elect_and_fence(void **state)
{
    ft_etcd *e = *state;
    fr_etcd *a = NULL, *b = NULL;
    ferry_error err = {0};
    assert_int_equal(fr_etcd_open(e->url, 5000, &a, &err), 0);
    assert_int_equal(fr_etcd_open(e->url, 5000, &b, &err), 0);
    int64_t la = 0, lb = 0, ttl = 0, won_a = 0, won_b = 0, cur = -1, rev = 0;
    assert_int_equal(fr_etcd_lease_grant(a, 10, &la, &err), 0);
    assert_int_equal(fr_etcd_lease_grant(b, 10, &lb, &err), 0);
    assert_true(la != 0 && lb != 0 && la != lb);
    assert_int_equal(fr_etcd_put_if(a, "ha/leader", 0, "ha/leader", "A", 1, la, &won_a, NULL, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_put_if(b, "ha/leader", 0, "ha/leader", "B", 1, lb, NULL, &cur, &err),
                     FERRY_ESTATE);
    ft_assert_says(&err, FERRY_ESTATE, "ha/leader", "not written", NULL);
    assert_int_equal(cur, won_a);                     /* it is A's, created when A won */
    fr_etcd_kv kv;
    assert_int_equal(fr_etcd_get(b, "ha/leader", &kv, &err), 0);
    assert_memory_equal(kv.val, "A", 1);
    assert_int_equal(kv.lease, la);
    assert_int_equal(kv.create_rev, won_a);
    fr_etcd_kv_clear(&kv);
    /* the leader's writes, fenced */
    assert_int_equal(fr_etcd_put_if(a, "ha/leader", won_a, "ha/log/1", "x", 1, 0, &rev, NULL, &err), 0);
    assert_true(rev > won_a);
    assert_int_equal(fr_etcd_lease_keepalive(a, la, &ttl, &err), 0);
    assert_true(ttl > 0 && ttl <= 10);
    /* A's lease ends (its machine gone: nobody renews it; revoked here so
     * that the test does not wait out a TTL): its key goes with it */
    assert_int_equal(fr_etcd_lease_revoke(b, la, &err), 0);
    assert_int_equal(fr_etcd_get(b, "ha/leader", &kv, &err), FERRY_ENOENT);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_lease_keepalive(a, la, &ttl, &err), FERRY_ENOENT);
    ft_assert_says(&err, FERRY_ENOENT, "expired or was revoked", NULL, NULL);
    assert_int_equal(fr_etcd_put_if(b, "ha/leader", 0, "ha/leader", "B", 1, lb, &won_b, NULL, &err), 0);
    assert_true(won_b > won_a);
    /* the deposed leader cannot write, whatever it believes */
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_put_if(a, "ha/leader", won_a, "ha/log/2", "y", 1, 0, NULL, &cur, &err),
                     FERRY_ESTATE);
    assert_int_equal(cur, won_b);
    assert_int_equal(fr_etcd_get(a, "ha/log/2", &kv, &err), FERRY_ENOENT);
    assert_int_equal(fr_etcd_put_if(b, "ha/leader", won_b, "ha/log/2", "z", 1, 0, NULL, NULL, &err), 0);
    assert_int_equal(fr_etcd_get(a, "ha/log/2", &kv, &err), 0);
    assert_memory_equal(kv.val, "z", 1);
    fr_etcd_kv_clear(&kv);
    /* what etcd itself refuses: a key on a lease that does not exist */
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_put(a, "ha/x", "1", 1, la, NULL, &err), FERRY_EIO);
    ft_assert_says(&err, FERRY_EIO, "lease not found", NULL, NULL);
    fprintf(stderr, "put on a revoked lease: %s\n", err.msg);
    assert_int_equal(fr_etcd_lease_revoke(b, lb, &err), 0);
    fr_etcd_close(a);
    fr_etcd_close(b);
}

static void test_endpoints(void **state)
{
    ft_etcd *e = *state;
    fr_etcd *c = NULL;
    ferry_error err = {0};
    assert_int_equal(fr_etcd_open("ftp://127.0.0.1:1", 1000, &c, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "not an http:// or https:// URL", NULL, NULL);
    assert_null(c);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_open("", 1000, &c, &err), FERRY_EINVAL);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_open(e->url, 0, &c, &err), FERRY_EINVAL);
    /* a dead endpoint first: the next one answers */
    char two[200];
    snprintf(two, sizeof two, "http://127.0.0.1:9/,%s", e->url);
    assert_int_equal(fr_etcd_open(two, 2000, &c, &err), 0);
    assert_int_equal(fr_etcd_put(c, "t/two", "2", 1, 0, NULL, &err), 0);
    fr_etcd_kv kv;
    assert_int_equal(fr_etcd_get(c, "t/two", &kv, &err), 0);
    fr_etcd_kv_clear(&kv);
    fr_etcd_close(c);
    /* nothing listening */
    assert_int_equal(fr_etcd_open("http://127.0.0.1:9", 2000, &c, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_etcd_get(c, "t/two", &kv, &err), FERRY_ECONNREFUSED);
    ft_assert_says(&err, FERRY_ECONNREFUSED, "127.0.0.1:9", NULL, NULL);
    fprintf(stderr, "no etcd: %s\n", err.msg);
    fr_etcd_close(c);
    /* etcd gone (its machine lost): the next call fails, nothing hangs */
    assert_int_equal(fr_etcd_open(e->url, 2000, &c, &err), 0);
    ft_etcd_kill(e, SIGKILL);
    memset(&err, 0, sizeof err);
    int rc = fr_etcd_put(c, "t/after", "1", 1, 0, NULL, &err);
    assert_true(rc == FERRY_ECONNREFUSED || rc == FERRY_ETIMEDOUT);
    fprintf(stderr, "etcd killed: %s\n", err.msg);
    fr_etcd_close(c);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_keys, ft_etcd_setup, ft_etcd_teardown),
        cmocka_unit_test_setup_teardown(test_elect_and_fence, ft_etcd_setup, ft_etcd_teardown),
        cmocka_unit_test_setup_teardown(test_endpoints, ft_etcd_setup, ft_etcd_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
