/* The replicated log in etcd (src/store/ha_log.c) against a real etcd:
 * appends in order and read back by a standby in pages, the size limit,
 * a deposed leader's append refused, truncation below a sequence, and
 * etcd's database bounded by truncation and compaction over thousands of
 * appends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "store/etcd_int.h"
#include "store/ha_log.h"
#include "util/ftetcd.h"

#define WAIT_MS 30000

/* A lease of 10 s: these tests do not measure failover, and a 2-core
 * machine under the whole suite can starve a 2 s lease's renewals (then
 * the leadership lapses and every fenced append is refused, by design). */
static fr_ha_elect *candidate(const ft_etcd *e, const char *id)
{
    return ft_ha_candidate(e, "log", id, 10);
}

static void fill(uint8_t *b, size_t n, uint64_t seq)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seq * 131 + i * 7);
}

static void test_append_read_fence_truncate(void **state)
{
    ft_etcd *e = *state;
    fr_ha_elect *a = candidate(e, "A"), *b = candidate(e, "B");
    ferry_error err = {0};
    int64_t ea = 0, eb = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    uint8_t buf[300];
    for (uint64_t s = 1; s <= 200; s++) {
        fill(buf, s % 300, s);
        assert_int_equal(fr_ha_log_append(a, ea, s, buf, s % 300, &err), 0);
    }
    uint8_t *big = malloc(FR_HA_LOG_ENTRY_MAX + 1);
    assert_non_null(big);
    fill(big, FR_HA_LOG_ENTRY_MAX, 201);
    assert_int_equal(fr_ha_log_append(a, ea, 201, big, FR_HA_LOG_ENTRY_MAX, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_log_append(a, ea, 202, big, FR_HA_LOG_ENTRY_MAX + 1, &err), FERRY_EMSGSIZE);
    /* a standby reads it all, in pages of 64 */
    uint64_t next = 1;
    for (;;) {
        fr_ha_entry *v = NULL;
        size_t n = 0;
        assert_int_equal(fr_ha_log_read(b, next, 64, &v, &n, &err), 0);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(v[i].seq, next);
            size_t want = next == 201 ? FR_HA_LOG_ENTRY_MAX : next % 300;
            assert_int_equal(v[i].len, want);
            uint8_t *exp = malloc(want ? want : 1);
            fill(exp, want, next);
            assert_memory_equal(v[i].data, exp, want);
            free(exp);
            next++;
        }
        fr_ha_entries_free(v, n);
        if (n < 64)
            break;
    }
    assert_int_equal(next, 202);
    free(big);
    /* the leader resigns; the standby leads; the old epoch appends nothing */
    fr_ha_close(a);
    a = candidate(e, "A");
    assert_int_equal(fr_ha_campaign(b, WAIT_MS, &eb, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_log_append(a, ea, 202, "late", 4, &err), FERRY_ESTATE);
    ft_assert_says(&err, FERRY_ESTATE, "no longer leads", "not appended", NULL);
    assert_int_equal(fr_ha_log_append(b, eb, 202, "new", 3, &err), 0);
    fr_ha_entry *v = NULL;
    size_t n = 0;
    assert_int_equal(fr_ha_log_read(a, 202, 8, &v, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].len, 3);
    assert_memory_equal(v[0].data, "new", 3);
    fr_ha_entries_free(v, n);
    /* truncation below 150: fenced too */
    int64_t deleted = 0;
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_log_truncate(a, ea, 150, &deleted, &err), FERRY_ESTATE);
    assert_int_equal(fr_ha_log_truncate(b, eb, 150, &deleted, &err), 0);
    assert_int_equal(deleted, 149);
    assert_int_equal(fr_ha_log_read(a, 1, 4, &v, &n, &err), 0);
    assert_int_equal(n, 4);
    assert_int_equal(v[0].seq, 150);
    fr_ha_entries_free(v, n);
    fr_ha_close(a);
    fr_ha_close(b);
}

/* Thousands of 8 KiB appends, truncated every 500 to the last 500: etcd's
 * database stays within a bound far below what the appends wrote. */
static void test_bounded(void **state)
{
    ft_etcd *e = *state;
    fr_ha_elect *a = candidate(e, "A");
    ferry_error err = {0};
    int64_t ea = 0, db0 = 0, db = 0, dbmax = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    assert_int_equal(fr_etcd_status(fr_ha_etcd(a), &db0, NULL, &err), 0);
    enum { N = 4000, EVERY = 500, SZ = 8192 };
    static uint8_t buf[SZ];
    for (uint64_t s = 1; s <= N; s++) {
        fill(buf, SZ, s);
        assert_int_equal(fr_ha_log_append(a, ea, s, buf, SZ, &err), 0);
        if (s % EVERY == 0) {
            assert_int_equal(fr_ha_log_truncate(a, ea, s - EVERY + 1, NULL, &err), 0);
            assert_int_equal(fr_etcd_status(fr_ha_etcd(a), &db, NULL, &err), 0);
            dbmax = db > dbmax ? db : dbmax;
        }
    }
    double wrote = (double)N * SZ / (1 << 20);
    fprintf(stderr, "etcd database: %.1f MiB at the start, at most %.1f MiB over %d appends of "
            "%d KiB (%.1f MiB written, 500 entries kept)\n", (double)db0 / (1 << 20),
            (double)dbmax / (1 << 20), N, SZ / 1024, wrote);
    assert_true(dbmax < (int64_t)(wrote * (1 << 20) / 2));   /* well under what was written */
    fr_ha_close(a);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_append_read_fence_truncate, ft_etcd_setup, ft_etcd_teardown),
        cmocka_unit_test_setup_teardown(test_bounded, ft_etcd_setup, ft_etcd_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
