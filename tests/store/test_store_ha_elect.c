/* Leader election of replicated masters on a real etcd (src/store/
 * ha_elect.c): one leader at a time, standbys told who leads, failover
 * after a silent leader's lease runs out, at once after a resignation, a
 * deposed epoch's writes refused by etcd, and a leader cut off from etcd
 * that stops counting itself leader within the TTL. */
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
#include "store/etcd_int.h"
#include "store/ha_elect.h"
#include "util/ftetcd.h"

/* 4 s, not the default 2: the suite runs these beside other tests on 2
 * cores, where a 2 s lease's renewals can starve (test_store_ha_master
 * measures failover at the default) */
#define TTL_S 4
#define WAIT_MS 30000   /* a bound on waits for the TTL to pass, not a measure */

static fr_ha_elect *candidate(const ft_etcd *e, const char *id)
{
    return ft_ha_candidate(e, "t", id, TTL_S);
}

static void test_one_leader_and_fencing(void **state)
{
    ft_etcd *e = *state;
    fr_ha_elect *a = candidate(e, "127.0.0.1:7001"), *b = candidate(e, "127.0.0.1:7002");
    ferry_error err = {0};
    int64_t ea = 0, eb = 0, ep = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    assert_true(ea > 0);
    assert_true(fr_ha_leading(a, ea));
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_campaign(b, 300, &eb, &err), FERRY_ETIMEDOUT);
    ft_assert_says(&err, FERRY_ETIMEDOUT, "127.0.0.1:7001 leads", "127.0.0.1:7002 is a standby", NULL);
    assert_false(fr_ha_leading(b, ea));
    char who[64];
    assert_int_equal(fr_ha_leader(b, who, sizeof who, &ep, &err), 0);
    assert_string_equal(who, "127.0.0.1:7001");
    assert_int_equal(ep, ea);
    assert_int_equal(fr_ha_fenced_put(a, ea, "t/log/1", "x", 1, &err), 0);
    /* the leader resigns: the standby wins at once, with a newer epoch */
    fr_ha_close(a);
    assert_int_equal(fr_ha_campaign(b, WAIT_MS, &eb, &err), 0);
    assert_true(eb > ea);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_fenced_put(b, ea, "t/log/2", "y", 1, &err), FERRY_ESTATE);
    ft_assert_says(&err, FERRY_ESTATE, "no longer leads", "not written", NULL);
    assert_int_equal(fr_ha_fenced_put(b, eb, "t/log/2", "z", 1, &err), 0);
    fr_ha_close(b);
    /* bad configs */
    fr_ha_config bad = { .endpoints = e->url, .cluster = "a/b", .id = "x" };
    fr_ha_elect *h = NULL;
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_open(&bad, &h, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "cluster name", NULL, NULL);
    bad.cluster = "ok";
    bad.id = "";
    assert_int_equal(fr_ha_open(&bad, &h, &err), FERRY_EINVAL);
    assert_null(h);
}

/* The leader's machine goes silent (nothing renews its lease): the standby
 * campaigning wins once etcd lets the lease lapse, about the TTL later, and
 * the silent leader's epoch writes nothing any more. */
static void test_failover_after_silence(void **state)
{
    ft_etcd *e = *state;
    fr_ha_elect *a = candidate(e, "A"), *b = candidate(e, "B"), *c = candidate(e, "C");
    ferry_error err = {0};
    int64_t ea = 0, eb = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    fr_ha_abandon(a);
    uint64_t t0 = fr_now_ns();
    assert_int_equal(fr_ha_campaign(b, WAIT_MS, &eb, &err), 0);
    double took = (double)(fr_now_ns() - t0) / 1e9;
    fprintf(stderr, "failover after a silent leader: %.2f s (TTL %d s)\n", took, TTL_S);
    assert_true(eb > ea);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_fenced_put(c, ea, "t/late", "1", 1, &err), FERRY_ESTATE);
    fr_etcd *kv = NULL;
    assert_int_equal(fr_etcd_open(e->url, 5000, &kv, &err), 0);
    fr_etcd_kv v;
    assert_int_equal(fr_etcd_get(kv, "t/late", &v, NULL), FERRY_ENOENT);
    fr_etcd_close(kv);
    int64_t ec = 0;
    assert_int_equal(fr_ha_campaign(c, 200, &ec, &err), FERRY_ETIMEDOUT);   /* B leads */
    fr_ha_close(b);
    fr_ha_close(c);
}

/* A leader cut off from etcd (etcd stopped: no renewal answers) stops
 * counting itself leader within the TTL, before etcd could let another
 * win; once etcd answers again it campaigns anew. */
static void test_cut_off_leader_steps_down(void **state)
{
    ft_etcd *e = *state;
    fr_ha_elect *a = candidate(e, "A");
    ferry_error err = {0};
    int64_t ea = 0, ea2 = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    ft_peer_signal(&e->p, SIGSTOP);
    uint64_t t0 = fr_now_ns(), deadline = fr_deadline_ns(WAIT_MS);
    while (fr_ha_leading(a, ea) && fr_ms_left(deadline) > 0) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };   /* polling a condition with a deadline */
        nanosleep(&ts, NULL);
    }
    double took = (double)(fr_now_ns() - t0) / 1e9;
    ft_peer_signal(&e->p, SIGCONT);
    fprintf(stderr, "leader cut off from etcd stepped down after %.2f s (TTL %d s)\n", took, TTL_S);
    assert_false(fr_ha_leading(a, ea));
    /* etcd back: the lease may or may not have survived; either way a
     * campaign ends with a leadership it holds */
    int rc = fr_ha_campaign(a, WAIT_MS, &ea2, &err);
    if (rc == 0)
        assert_true(fr_ha_leading(a, ea2));
    else
        fail_msg("campaign after etcd came back: %s", err.msg);
    fr_ha_close(a);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_leader_and_fencing, ft_etcd_setup, ft_etcd_teardown),
        cmocka_unit_test_setup_teardown(test_failover_after_silence, ft_etcd_setup, ft_etcd_teardown),
        cmocka_unit_test_setup_teardown(test_cut_off_leader_steps_down, ft_etcd_setup, ft_etcd_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
