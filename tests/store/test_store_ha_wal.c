/* A replicated write-ahead log (fr_wal_replicate): every group commit of
 * the leader's WAL lands in the cluster's log in etcd, in order, cut into
 * entries under etcd's request limit, before it counts as durable; a
 * deposed leader's commit fails and every later one too, and etcd holds
 * nothing of it. Against a real etcd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "base/base.h"
#include "store/etcd_int.h"
#include "store/ha_log.h"
#include "store/store_int.h"
#include "store/workload.h"
#include "util/ftetcd.h"

#define WAIT_MS 30000

typedef struct env {
    ft_etcd e;
    char dir[64];
} env;

static int setup(void **state)
{
    env *v = calloc(1, sizeof *v);
    if (!v || ft_etcd_start(&v->e) != 0) {
        if (v)
            ft_etcd_stop(&v->e);
        free(v);
        return -1;
    }
    snprintf(v->dir, sizeof v->dir, "/tmp/ferry-hawal-XXXXXX");
    if (!mkdtemp(v->dir))
        return -1;
    *state = v;
    return 0;
}

static int teardown(void **state)
{
    env *v = *state;
    ft_etcd_stop(&v->e);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", v->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", v->dir);
    free(v);
    return 0;
}

/* A lease of 10 s: these tests do not measure failover, and a 2-core
 * machine under the whole suite can starve a 2 s lease's renewals (then
 * the leadership lapses and every fenced append is refused, by design). */
static fr_ha_elect *candidate(const env *v, const char *id)
{
    return ft_ha_candidate(&v->e, "wal", id, 10);
}

/* The records of every log entry from 1 on, in order: their count, and
 * each checked against rec_of(lsn). */
typedef struct seen { uint64_t frames; size_t len_max; bool bad; } seen;

static size_t rec_len(uint64_t lsn) { return 40 + (lsn * 977) % 12000; }

static void rec_of(uint64_t lsn, uint8_t *out)
{
    for (size_t i = 0; i < rec_len(lsn); i++)
        out[i] = (uint8_t)(lsn * 31 + i);
}

static int check_frame(void *ctx, uint64_t lsn, const uint8_t *rec, size_t len)
{
    seen *s = ctx;
    static uint8_t want[16384];
    rec_of(lsn, want);
    if (len != rec_len(lsn) || memcmp(rec, want, len) != 0)
        s->bad = true;
    s->frames++;
    return 0;
}

static seen read_log(fr_ha_elect *h)
{
    seen s = {0};
    uint64_t next = 1, lsn = 1;
    for (;;) {
        fr_ha_entry *v = NULL;
        size_t n = 0;
        ferry_error err = {0};
        if (fr_ha_log_read(h, next, 16, &v, &n, &err) < 0)
            fail_msg("read: %s", err.msg);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(v[i].seq, next);
            s.len_max = v[i].len > s.len_max ? v[i].len : s.len_max;
            fr_wal_scan_result res;
            assert_int_equal(fr_wal_scan(v[i].data, v[i].len, lsn, check_frame, &s, &res), 0);
            assert_int_equal(res.valid_len, v[i].len);   /* whole frames only */
            lsn = res.next_lsn;
            next++;
        }
        fr_ha_entries_free(v, n);
        if (n < 16)
            return s;
    }
}

static void test_commits_replicated_and_fenced(void **state)
{
    env *v = *state;
    fr_ha_elect *a = candidate(v, "A"), *b = candidate(v, "B");
    ferry_error err = {0};
    int64_t ea = 0, eb = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    fr_meta *m = NULL;
    fr_wal *w = NULL;
    fr_wal_opts o = { .no_sync = true };
    assert_int_equal(fr_meta_new(NULL, &m), 0);
    assert_int_equal(fr_wal_open(v->dir, &o, m, &w, NULL), 0);
    fr_wal_replicate(w, a, ea, 1);
    static uint8_t rec[16384];
    uint64_t lsn = 0;
    /* small commits, then one of ~2.4 MB (cut into entries of <= 1 MiB) */
    for (uint64_t i = 1; i <= 50; i++) {
        rec_of(i, rec);
        assert_int_equal(fr_wal_append(w, rec, rec_len(i), &lsn), 0);
        assert_int_equal(lsn, i);
        if (i % 5 == 0)
            assert_int_equal(fr_wal_commit(w), 0);
    }
    for (uint64_t i = 51; i <= 450; i++) {
        rec_of(i, rec);
        assert_int_equal(fr_wal_append(w, rec, rec_len(i), NULL), 0);
    }
    assert_int_equal(fr_wal_commit(w), 0);
    assert_int_equal(fr_wal_durable_lsn(w), 450);
    seen s = read_log(b);
    fprintf(stderr, "replicated: %llu records in %llu entries, the largest %zu bytes\n",
            (unsigned long long)s.frames, (unsigned long long)fr_wal_next_seq(w) - 1, s.len_max);
    assert_false(s.bad);
    assert_int_equal(s.frames, 450);
    assert_true(fr_wal_next_seq(w) - 1 >= 10 + 3);   /* 10 small commits, the big one in >= 3 */
    assert_true(s.len_max <= FR_HA_LOG_ENTRY_MAX);
    /* A's leadership ends (its key gone: its lease lapsed) and B wins: A's
     * next commit is refused, and every one after it */
    fr_etcd *raw = NULL;
    assert_int_equal(fr_etcd_open(v->e.url, 5000, &raw, &err), 0);
    assert_int_equal(fr_etcd_delete(raw, fr_ha_key(a), NULL, &err), 0);
    fr_etcd_close(raw);
    assert_int_equal(fr_ha_campaign(b, WAIT_MS, &eb, &err), 0);
    rec_of(451, rec);
    assert_int_equal(fr_wal_append(w, rec, rec_len(451), NULL), 0);
    assert_int_equal(fr_wal_commit(w), FERRY_ESTATE);
    assert_int_equal(fr_wal_durable_lsn(w), 450);
    rec_of(452, rec);
    assert_int_equal(fr_wal_commit(w), FERRY_ESTATE);
    s = read_log(b);
    assert_int_equal(s.frames, 450);                 /* nothing of the refused commit */
    fr_wal_close(w, m);
    fr_meta_destroy(m);
    fr_ha_close(a);
    fr_ha_close(b);
}

/* Bytes of the regular files in dir. */
static uint64_t dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    uint64_t n = 0;
    char p[512];
    struct stat st;
    while (d && (e = readdir(d)) != NULL) {
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
            n += (uint64_t)st.st_size;
    }
    if (d)
        closedir(d);
    return n;
}

static fr_hash128_t digest_of(fr_meta *m)
{
    fr_hash128_t d;
    assert_int_equal(fr_meta_digest(m, &d), 0);
    return d;
}

/* The hot standby: a second meta follows the leader's log in etcd while
 * the leader runs a mix of every metadata command, and holds the leader's
 * state (the same digest) after every step; after a snapshot in etcd a
 * new standby starts from it and catches up to the same state, and a
 * follower that needs the truncated entries is told so. */
static void test_standby_follows(void **state)
{
    env *v = *state;
    fr_ha_elect *a = candidate(v, "A"), *b = candidate(v, "B");
    ferry_error err = {0};
    int64_t ea = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    fr_meta *m = NULL, *sb = NULL;
    fr_wal *w = NULL;
    fr_wal_opts o = { .no_sync = true };
    assert_int_equal(fr_meta_new(NULL, &m), 0);
    assert_int_equal(fr_wal_open(v->dir, &o, m, &w, NULL), 0);
    fr_wal_replicate(w, a, ea, 1);
    assert_int_equal(fr_meta_new(NULL, &sb), 0);
    uint64_t now = 0, seq = 1, lsn = 1, total = 0;
    fr_meta_mount(m, 100, 9, 1 << 20, 0);
    rng_state = 11;
    for (int step = 0; step < 6; step++) {
        workload(m, 700, &now);
        assert_int_equal(fr_wal_commit(w), 0);
        uint64_t got = 0;
        assert_int_equal(fr_ha_follow(b, sb, 0, &seq, &lsn, &got, &err), 0);
        total += got;
        fr_hash128_t dl = digest_of(m), ds = digest_of(sb);
        assert_memory_equal(dl.b, ds.b, sizeof dl.b);
    }
    assert_int_equal(total, fr_meta_records(m));
    assert_int_equal(lsn - 1, fr_wal_durable_lsn(w));
    fprintf(stderr, "standby followed %llu records in %llu entries; digests equal after every step\n",
            (unsigned long long)total, (unsigned long long)seq - 1);
    /* a snapshot in etcd: the log below it goes; a new standby starts
     * from the snapshot and follows on; one that starts from entry 1 is
     * told the entries are gone */
    fr_meta *late = NULL, *fresh = NULL;
    uint64_t snap_seq = fr_wal_next_seq(w), snap_lsn = fr_wal_durable_lsn(w) + 1, fs = 0, fl = 0;
    assert_int_equal(fr_ha_snapshot_put(a, ea, m, snap_seq, snap_lsn, &err), 0);
    workload(m, 700, &now);
    assert_int_equal(fr_wal_commit(w), 0);
    assert_int_equal(fr_meta_new(NULL, &fresh), 0);
    assert_int_equal(fr_ha_snapshot_load(b, fresh, &fs, &fl, &err), 0);
    assert_int_equal(fs, snap_seq);
    assert_int_equal(fl, snap_lsn);
    assert_int_equal(fr_ha_follow(b, fresh, 0, &fs, &fl, NULL, &err), 0);
    fr_hash128_t dl = digest_of(m), df = digest_of(fresh);
    assert_memory_equal(dl.b, df.b, sizeof dl.b);
    assert_int_equal(fl - 1, fr_wal_durable_lsn(w));
    fr_meta_destroy(fresh);
    assert_int_equal(fr_meta_new(NULL, &late), 0);
    uint64_t s1 = 1, l1 = 1;
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_ha_follow(b, late, 0, &s1, &l1, NULL, &err), FERRY_ECORRUPT);
    ft_assert_says(&err, FERRY_ECORRUPT, "entries missing", NULL, NULL);
    assert_int_equal(s1, 1);
    fr_meta_destroy(late);
    fr_wal_close(w, m);
    fr_meta_destroy(m);
    fr_meta_destroy(sb);
    fr_ha_close(a);
    fr_ha_close(b);
}

/* A million metadata commands through a replicated WAL, a snapshot in
 * etcd every 100,000: etcd's database stays within a bound however many
 * commands ran, and a standby started at the end rebuilds the state. */
static void test_million_bounded(void **state)
{
    env *v = *state;
    fr_ha_elect *a = candidate(v, "A"), *b = candidate(v, "B");
    ferry_error err = {0};
    int64_t ea = 0, db = 0, dbmax = 0;
    uint64_t diskmax = 0;
    assert_int_equal(fr_ha_campaign(a, WAIT_MS, &ea, &err), 0);
    fr_meta *m = NULL, *sb = NULL;
    fr_wal *w = NULL;
    fr_wal_opts o = { .no_sync = true };
    assert_int_equal(fr_meta_new(NULL, &m), 0);
    assert_int_equal(fr_wal_open(v->dir, &o, m, &w, NULL), 0);
    fr_wal_replicate(w, a, ea, 1);
    uint64_t now = 0;
    fr_meta_mount(m, 100, 9, 1 << 20, 0);
    rng_state = 5;
    enum { OPS = 1000000, COMMIT = 10000, SNAP = 100000 };
    uint64_t t0 = fr_now_ns();
    for (int done = 0; done < OPS; done += COMMIT) {
        workload(m, COMMIT, &now);
        assert_int_equal(fr_wal_commit(w), 0);
        if ((done + COMMIT) % SNAP == 0) {
            assert_int_equal(fr_ha_snapshot_put(a, ea, m, fr_wal_next_seq(w),
                                                fr_wal_durable_lsn(w) + 1, &err), 0);
            assert_int_equal(fr_etcd_status(fr_ha_etcd(a), &db, NULL, &err), 0);
            dbmax = db > dbmax ? db : dbmax;
            assert_int_equal(fr_wal_checkpoint(w, m), 0);   /* the local log's own bound */
            uint64_t d = dir_bytes(v->dir);
            diskmax = d > diskmax ? d : diskmax;
        }
    }
    double took = (double)(fr_now_ns() - t0) / 1e9;
    fprintf(stderr, "%d commands (%llu records, %llu log entries) in %.1f s; etcd's database at "
            "most %.1f MiB, the master's log directory at most %.1f MiB\n", OPS,
            (unsigned long long)fr_meta_records(m), (unsigned long long)fr_wal_next_seq(w) - 1,
            took, (double)dbmax / (1 << 20), (double)diskmax / (1 << 20));
    assert_true(dbmax <= 64ll << 20);     /* the documented bounds (docs/store.md) */
    assert_true(diskmax <= 64ull << 20);
    uint64_t seq = 0, lsn = 0;
    assert_int_equal(fr_meta_new(NULL, &sb), 0);
    assert_int_equal(fr_ha_snapshot_load(b, sb, &seq, &lsn, &err), 0);
    assert_int_equal(fr_ha_follow(b, sb, 0, &seq, &lsn, NULL, &err), 0);
    fr_hash128_t dl = digest_of(m), ds = digest_of(sb);
    assert_memory_equal(dl.b, ds.b, sizeof dl.b);
    fr_wal_close(w, m);
    fr_meta_destroy(m);
    fr_meta_destroy(sb);
    fr_ha_close(a);
    fr_ha_close(b);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commits_replicated_and_fenced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_standby_follows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_million_bounded, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
