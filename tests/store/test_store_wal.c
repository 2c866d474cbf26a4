/* store: the write-ahead log — replay, torn tails, kill -9, snapshots,
 * corruption, group commit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/store_int.h"
#include "store/workload.h"

/* ---- helpers --------------------------------------------------------------- */

static char *tmpdir(void)
{
    char *d = strdup("/tmp/ferry-wal-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void rmtree(char *d)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

static const fr_wal_opts fast = { .no_sync = true };

static int open_store(const char *dir, const fr_wal_opts *o, fr_meta **m, fr_wal **w,
                      fr_wal_recovery *rep)
{
    assert_int_equal(fr_meta_new(NULL, m), 0);
    int rc = fr_wal_open(dir, o, *m, w, rep);
    if (rc < 0) {
        fr_meta_destroy(*m);
        *m = NULL;
    }
    return rc;
}

static void close_store(fr_meta *m, fr_wal *w)
{
    fr_wal_close(w, m);
    fr_meta_destroy(m);
}

static fr_hash128_t digest(fr_meta *m)
{
    fr_hash128_t h;
    assert_int_equal(fr_meta_digest(m, &h), 0);
    return h;
}

static void assert_digest(fr_meta *m, fr_hash128_t want)
{
    fr_hash128_t got = digest(m);
    assert_memory_equal(&got, &want, sizeof(want));
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(*len + 1);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

static void spit(const char *path, const uint8_t *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* Files named prefix* in dir: how many, and the last name in sort order. */
static int count_files(const char *dir, const char *prefix, char *last, size_t cap)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    assert_non_null(d);
    if (last != NULL)
        last[0] = '\0';
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        n++;
        if (last != NULL && strcmp(e->d_name, last) > 0 && strlen(e->d_name) < cap)
            memcpy(last, e->d_name, strlen(e->d_name) + 1);
    }
    closedir(d);
    return n;
}

static void mount_and_run(fr_meta *m, int ops, uint64_t seed, uint64_t *now)
{
    fr_meta_mount(m, 100, 9, 1 << 20, 0);
    rng_state = seed;
    workload(m, ops, now);
}

/* ---- replay ---------------------------------------------------------------- */

static void test_replay_equals_state(void **state)
{
    (void)state;
    char *dir = tmpdir();
    fr_meta *m;
    fr_wal *w;
    fr_wal_recovery rep;
    uint64_t now = 0;
    assert_int_equal(open_store(dir, NULL, &m, &w, &rep), 0);
    assert_int_equal(rep.last_lsn, 0);
    mount_and_run(m, 3000, 7, &now);
    uint64_t nrec = fr_meta_records(m);
    assert_int_equal(fr_wal_commit(w), 0);
    assert_int_equal(fr_wal_durable_lsn(w), nrec);
    fr_hash128_t d1 = digest(m);
    close_store(m, w);

    assert_int_equal(open_store(dir, NULL, &m, &w, &rep), 0);
    assert_digest(m, d1);
    assert_int_equal(rep.replayed, nrec);
    assert_int_equal(rep.last_lsn, nrec);
    assert_int_equal(rep.snapshot_lsn, 0);
    /* Snapshot, go on, snapshot again, go on: one snapshot and one log
     * remain, and they rebuild the state. */
    workload(m, 1000, &now);
    assert_int_equal(fr_wal_checkpoint(w, m), 0);
    workload(m, 1000, &now);
    assert_int_equal(fr_wal_checkpoint(w, m), 0);
    uint64_t snap_lsn = fr_wal_last_lsn(w);
    workload(m, 1000, &now);
    assert_int_equal(fr_wal_commit(w), 0);
    fr_hash128_t d2 = digest(m);
    uint64_t last = fr_wal_last_lsn(w);
    fr_wal_stats st;
    fr_wal_stats_get(w, &st);
    assert_int_equal(st.snapshots, 2);
    close_store(m, w);
    assert_int_equal(count_files(dir, "snap-", NULL, 0), 1);
    assert_int_equal(count_files(dir, "wal-", NULL, 0), 1);

    assert_int_equal(open_store(dir, NULL, &m, &w, &rep), 0);
    assert_digest(m, d2);
    assert_int_equal(rep.snapshot_lsn, snap_lsn);
    assert_int_equal(rep.replayed, last - snap_lsn);
    assert_int_equal(rep.last_lsn, last);
    close_store(m, w);
    rmtree(dir);
}

/* ---- torn tail ------------------------------------------------------------- */

typedef struct { const uint8_t *base; size_t last_off; fr_meta *prefix; uint64_t n, upto; } frame_walk;

static int note_frame(void *ctx, uint64_t lsn, const uint8_t *rec, size_t len)
{
    frame_walk *fw = ctx;
    fw->last_off = (size_t)(rec - fw->base) - FR_WAL_FRAME_HEAD;
    fw->n = lsn;
    if (fw->prefix != NULL && lsn <= fw->upto)
        assert_int_equal(fr_meta_replay(fw->prefix, rec, len), 0);
    return 0;
}

/* Cutting the log anywhere inside its last record recovers exactly the
 * records before it; the full log recovers all of them. */
static void test_torn_tail_every_byte(void **state)
{
    (void)state;
    char *dir = tmpdir(), path[600], last[64];
    fr_meta *m;
    fr_wal *w;
    fr_wal_recovery rep;
    uint64_t now = 0, rev;
    char val[200];
    assert_int_equal(open_store(dir, &fast, &m, &w, NULL), 0);
    mount_and_run(m, 300, 11, &now);
    memset(val, 'v', sizeof(val));
    assert_int_equal(fr_meta_kv_put(m, "the-last-record", val, sizeof(val), &rev), 0);
    assert_int_equal(fr_wal_commit(w), 0);
    fr_hash128_t full = digest(m);
    close_store(m, w);

    assert_int_equal(count_files(dir, "wal-", last, sizeof(last)), 1);
    snprintf(path, sizeof(path), "%s/%s", dir, last);
    size_t len;
    uint8_t *log = slurp(path, &len);
    fr_wal_scan_result res;
    frame_walk fw = { .base = log + FR_WAL_FILE_HDR };
    assert_int_equal(fr_meta_new(NULL, &fw.prefix), 0);
    assert_int_equal(fr_wal_scan(log + FR_WAL_FILE_HDR, len - FR_WAL_FILE_HDR, 1, note_frame, &fw, &res), 0);
    assert_false(res.torn);
    fw.upto = fw.n - 1;   /* second pass: build the state without the last record */
    assert_int_equal(fr_wal_scan(log + FR_WAL_FILE_HDR, len - FR_WAL_FILE_HDR, 1, note_frame, &fw, &res), 0);
    fr_hash128_t prefix = digest(fw.prefix);
    size_t cut0 = FR_WAL_FILE_HDR + fw.last_off;
    assert_true(len - cut0 > 200);

    ferry_log_set_level(FERRY_LOG_ERROR);   /* one "torn tail" warning per cut */
    for (size_t cut = cut0; cut <= len; cut++) {
        char *d2 = tmpdir(), p2[600];
        snprintf(p2, sizeof(p2), "%s/%s", d2, last);
        spit(p2, log, cut);
        assert_int_equal(open_store(d2, &fast, &m, &w, &rep), 0);
        assert_digest(m, cut == len ? full : prefix);
        assert_int_equal(rep.last_lsn, cut == len ? fw.n : fw.n - 1);
        assert_int_equal(rep.torn_bytes, cut == len ? 0 : cut - cut0);
        if (cut == cut0 + 100) {
            /* The torn bytes are gone for good: what follows is readable. */
            assert_int_equal(fr_meta_kv_put(m, "after", "x", 1, &rev), 0);
            assert_int_equal(fr_wal_commit(w), 0);
            fr_hash128_t d = digest(m);
            close_store(m, w);
            assert_int_equal(open_store(d2, &fast, &m, &w, &rep), 0);
            assert_digest(m, d);
            assert_int_equal(rep.torn_bytes, 0);
        }
        close_store(m, w);
        rmtree(d2);
    }
    ferry_log_set_level(FERRY_LOG_WARN);
    fr_meta_destroy(fw.prefix);
    free(log);
    rmtree(dir);
}

/* ---- kill -9 ------------------------------------------------------------------ */

/* The child puts, commits, reports; never returns. "S i": obj/i and pend/i
 * were put_start'ed durably; "E i": obj/i is complete, kv/i and queue
 * record i exist, durably. pend/i is never completed. */
static void child_loop(const char *dir, int wfd)
{
    fr_meta *m;
    fr_wal *w;
    char key[64], val[64];
    uint64_t rev, id;
    if (fr_meta_new(NULL, &m) < 0 || fr_wal_open(dir, NULL, m, &w, NULL) < 0 ||
        fr_meta_mount(m, 1, 1, 1ull << 30, 0) < 0 || fr_wal_commit(w) < 0)
        _exit(2);
    for (int i = 0; i < 1000000; i++) {
        snprintf(key, sizeof(key), "obj/%d", i);
        if (fr_meta_put_start(m, key, 100, NULL, (uint64_t)i, NULL) < 0)
            _exit(3);
        snprintf(key, sizeof(key), "pend/%d", i);
        if (fr_meta_put_start(m, key, 100, NULL, (uint64_t)i, NULL) < 0 || fr_wal_commit(w) < 0)
            _exit(4);
        dprintf(wfd, "S %d\n", i);
        snprintf(key, sizeof(key), "obj/%d", i);
        if (fr_meta_put_end(m, key, (uint64_t)i) < 0)
            _exit(5);
        snprintf(key, sizeof(key), "kv/%d", i);
        snprintf(val, sizeof(val), "val%d", i);
        if (fr_meta_kv_put(m, key, val, strlen(val), &rev) < 0)
            _exit(6);
        snprintf(val, sizeof(val), "%d", i);
        if (fr_meta_queue_push(m, "q", val, strlen(val), &id) < 0 || fr_wal_commit(w) < 0)
            _exit(7);
        dprintf(wfd, "E %d\n", i);
    }
    _exit(0);
}

typedef struct { int max_s, max_e, ne; char buf[1 << 16]; size_t len; } acks;

/* Parse whole lines in a->buf. */
static void parse_acks(acks *a)
{
    char *p = a->buf, *nl;
    while ((nl = memchr(p, '\n', a->len - (size_t)(p - a->buf))) != NULL) {
        int i;
        if (sscanf(p, "S %d", &i) == 1) {
            assert_int_equal(i, a->max_s + 1);
            a->max_s = i;
        } else {
            assert_int_equal(sscanf(p, "E %d", &i), 1);
            assert_int_equal(i, a->max_e + 1);
            a->max_e = i;
            a->ne++;
        }
        p = nl + 1;
    }
    a->len -= (size_t)(p - a->buf);
    memmove(a->buf, p, a->len);
}

/* Read from fd until want E lines arrived (0: until EOF), by a deadline. */
static void read_acks(int fd, acks *a, int want)
{
    uint64_t deadline = fr_now_ms() + 60000;
    while (want == 0 || a->ne < want) {
        int left = (int)(deadline - fr_now_ms());
        assert_true(left > 0);
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int r = poll(&pfd, 1, left);
        if (r < 0 && errno == EINTR)
            continue;
        assert_true(r > 0);
        ssize_t k = read(fd, a->buf + a->len, sizeof(a->buf) - a->len - 1);
        assert_true(k >= 0);
        if (k == 0)
            return;
        a->len += (size_t)k;
        parse_acks(a);
    }
}

static void test_kill9(void **state)
{
    (void)state;
    char *dir = tmpdir(), key[64];
    int p[2];
    acks a = { .max_s = -1, .max_e = -1 };
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        child_loop(dir, p[1]);
    }
    close(p[1]);
    read_acks(p[0], &a, 300);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    read_acks(p[0], &a, 0);   /* what it said before dying */
    close(p[0]);
    print_message("kill -9 after %d acknowledged puts (%d started)\n", a.max_e + 1, a.max_s + 1);

    fr_meta *m;
    fr_wal *w;
    fr_wal_recovery rep;
    fr_obj_desc d;
    fr_kv_view v;
    assert_int_equal(open_store(dir, NULL, &m, &w, &rep), 0);
    for (int i = 0; i <= a.max_s + 3; i++) {
        snprintf(key, sizeof(key), "obj/%d", i);
        int ex = fr_meta_exist(m, key);
        if (i <= a.max_e)
            assert_int_equal(ex, 1);            /* acknowledged: complete */
        else if (i > a.max_e + 1)
            assert_int_equal(ex, 0);            /* never acknowledged, never requested */
        int ds = fr_meta_describe(m, key, &d);
        if (i <= a.max_s)
            assert_int_equal(ds, 0);
        if (i > a.max_s + 1)
            assert_int_equal(ds, FERRY_ENOENT);
        snprintf(key, sizeof(key), "pend/%d", i);
        assert_int_equal(fr_meta_exist(m, key), 0);   /* never completed, never complete */
        snprintf(key, sizeof(key), "kv/%d", i);
        int kv = fr_meta_kv_get(m, key, &v);
        if (i <= a.max_e) {
            char want[32];
            assert_int_equal(kv, 0);
            snprintf(want, sizeof(want), "val%d", i);
            assert_int_equal(v.len, strlen(want));
            assert_memory_equal(v.val, want, v.len);
        } else if (i > a.max_e + 1) {
            assert_int_equal(kv, FERRY_ENOENT);
        }
    }
    /* Every acknowledged queue record is there, once, in order. */
    fr_qrec_view qv[FR_POP_MAX];
    size_t n;
    int next = 0;
    do {
        assert_int_equal(fr_meta_queue_pop(m, "q", FR_POP_MAX, 1000, 1, qv, &n), 0);
        for (size_t k = 0; k < n; k++) {
            char want[16];
            snprintf(want, sizeof(want), "%d", next++);
            assert_int_equal(qv[k].len, strlen(want));
            assert_memory_equal(qv[k].data, want, qv[k].len);
        }
    } while (n > 0);
    assert_true(next == a.max_e + 1 || next == a.max_e + 2);
    close_store(m, w);
    rmtree(dir);
}

/* ---- snapshots and crash points ------------------------------------------------ */

static void test_checkpoint_crash_points(void **state)
{
    (void)state;
    char *dir = tmpdir(), path[600], oldlog[64], newlog[64], name[64];
    fr_meta *m;
    fr_wal *w;
    fr_wal_recovery rep;
    uint64_t now = 0;
    size_t len;
    assert_int_equal(open_store(dir, &fast, &m, &w, NULL), 0);
    mount_and_run(m, 500, 3, &now);
    assert_int_equal(fr_wal_commit(w), 0);
    count_files(dir, "wal-", oldlog, sizeof(oldlog));
    snprintf(path, sizeof(path), "%s/%s", dir, oldlog);
    uint8_t *old = slurp(path, &len);
    uint64_t lsn = fr_wal_last_lsn(w);
    fr_hash128_t at_snap = digest(m);
    assert_int_equal(fr_wal_checkpoint(w, m), 0);
    workload(m, 300, &now);
    assert_int_equal(fr_wal_commit(w), 0);
    fr_hash128_t d = digest(m);
    close_store(m, w);
    count_files(dir, "wal-", newlog, sizeof(newlog));

    /* Crash after the snapshot, before the old log was deleted. */
    spit(path, old, len);
    snprintf(path, sizeof(path), "%s/snap-%016llx.tmp", dir, (unsigned long long)lsn + 7);
    spit(path, (const uint8_t *)"half a snapshot", 15);   /* and a stray temporary */
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), 0);
    assert_digest(m, d);
    assert_int_equal(rep.snapshot_lsn, lsn);
    assert_int_equal(rep.logs, 2);
    assert_int_equal(count_files(dir, "snap-", NULL, 0), 1);   /* the .tmp is gone */
    close_store(m, w);

    /* Crash after the new log was created, before the snapshot existed:
     * the old log and an empty new one. */
    char *d2 = tmpdir();
    snprintf(path, sizeof(path), "%s/%s", d2, oldlog);
    spit(path, old, len);
    uint8_t hdr[FR_WAL_FILE_HDR];
    fr_wal_hdr_encode(hdr, FR_WAL_LOG, lsn + 1);
    snprintf(name, sizeof(name), "wal-%016llx.flog", (unsigned long long)lsn + 1);
    snprintf(path, sizeof(path), "%s/%s", d2, name);
    spit(path, hdr, sizeof(hdr));
    assert_int_equal(open_store(d2, &fast, &m, &w, &rep), 0);
    assert_digest(m, at_snap);
    close_store(m, w);
    /* ... or while its header was being written: dropped. */
    spit(path, hdr, 10);
    assert_int_equal(open_store(d2, &fast, &m, &w, &rep), 0);
    assert_digest(m, at_snap);
    assert_int_equal(count_files(d2, "wal-", NULL, 0), 1);   /* the old log goes on */
    close_store(m, w);
    rmtree(d2);
    free(old);
    rmtree(dir);
}

/* ---- corruption ------------------------------------------------------------------ */

static void flip_byte(const char *path, size_t off)
{
    size_t len;
    uint8_t *b = slurp(path, &len);
    assert_true(off < len);
    b[off] ^= 0x40;
    spit(path, b, len);
    free(b);
}

static char *store_with_log(int ops, char *logname, size_t cap, fr_hash128_t *d)
{
    char *dir = tmpdir();
    fr_meta *m;
    fr_wal *w;
    uint64_t now = 0;
    assert_int_equal(open_store(dir, &fast, &m, &w, NULL), 0);
    mount_and_run(m, ops, 5, &now);
    assert_int_equal(fr_wal_commit(w), 0);
    if (d != NULL)
        *d = digest(m);
    close_store(m, w);
    count_files(dir, "wal-", logname, cap);
    return dir;
}

static void test_corruption_rejected(void **state)
{
    (void)state;
    char logname[64], path[600];
    fr_meta *m;
    fr_wal *w;
    fr_wal_recovery rep;

    /* A damaged record in the middle: refuse, do not truncate. */
    char *dir = store_with_log(400, logname, sizeof(logname), NULL);
    snprintf(path, sizeof(path), "%s/%s", dir, logname);
    flip_byte(path, FR_WAL_FILE_HDR + 200);
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), FERRY_ECORRUPT);
    /* Still refused on a second try: nothing was cut meanwhile. */
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), FERRY_ECORRUPT);
    rmtree(dir);

    /* A damaged header. */
    dir = store_with_log(50, logname, sizeof(logname), NULL);
    snprintf(path, sizeof(path), "%s/%s", dir, logname);
    flip_byte(path, 3);
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), FERRY_ECORRUPT);
    rmtree(dir);

    /* A damaged snapshot. */
    dir = store_with_log(300, logname, sizeof(logname), NULL);
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), 0);
    assert_int_equal(fr_wal_checkpoint(w, m), 0);
    close_store(m, w);
    char snap[64];
    count_files(dir, "snap-", snap, sizeof(snap));
    snprintf(path, sizeof(path), "%s/%s", dir, snap);
    flip_byte(path, FR_WAL_FILE_HDR + 40);
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), FERRY_ECORRUPT);
    /* ... or one cut short. */
    size_t len;
    uint8_t *b = slurp(path, &len);
    b[FR_WAL_FILE_HDR + 40] ^= 0x40;
    spit(path, b, len - 1);
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), FERRY_ECORRUPT);
    spit(path, b, len);
    assert_int_equal(open_store(dir, &fast, &m, &w, &rep), 0);
    close_store(m, w);
    free(b);
    rmtree(dir);

    /* A frame that checks out but holds a malformed record, or one that
     * does not apply to the state: refused, never half-applied. */
    static const uint8_t garbage[] = { 0x63, 0x00, 1, 2, 3 };
    uint8_t rec[64];
    fr_rec bad = { .type = FR_REC_PUT_END, .key = { "no-such-object", 14 } };
    int rl = fr_rec_encode(&bad, rec, sizeof(rec));
    for (int k = 0; k < 2; k++) {
        dir = store_with_log(100, logname, sizeof(logname), NULL);
        assert_int_equal(open_store(dir, &fast, &m, &w, &rep), 0);
        if (k == 0)
            assert_int_equal(fr_wal_append(w, garbage, sizeof(garbage), NULL), 0);
        else
            assert_int_equal(fr_wal_append(w, rec, (size_t)rl, NULL), 0);
        close_store(m, w);
        assert_int_equal(open_store(dir, &fast, &m, &w, &rep), FERRY_ECORRUPT);
        rmtree(dir);
    }
}

/* ---- frames ------------------------------------------------------------------------ */

static void test_frames(void **state)
{
    (void)state;
    uint8_t hdr[FR_WAL_FILE_HDR], buf[256];
    uint32_t kind;
    uint64_t lsn;
    fr_wal_hdr_encode(hdr, FR_WAL_SNAP, 77);
    assert_int_equal(fr_wal_hdr_decode(hdr, sizeof(hdr), &kind, &lsn), 0);
    assert_int_equal(kind, FR_WAL_SNAP);
    assert_int_equal(lsn, 77);
    assert_int_equal(fr_wal_hdr_decode(hdr, sizeof(hdr) - 1, &kind, &lsn), FERRY_EPROTO);
    hdr[0] = 'X';
    assert_int_equal(fr_wal_hdr_decode(hdr, sizeof(hdr), &kind, &lsn), FERRY_EPROTO);

    size_t n = fr_wal_frame_encode(buf, 5, (const uint8_t *)"abc", 3);
    n += fr_wal_frame_encode(buf + n, 6, (const uint8_t *)"defg", 4);
    fr_wal_scan_result res;
    assert_int_equal(fr_wal_scan(buf, n, 5, NULL, NULL, &res), 0);
    assert_int_equal(res.frames, 2);
    assert_int_equal(res.next_lsn, 7);
    assert_false(res.torn);
    /* Frames that check out but carry the wrong LSN are corruption. */
    assert_int_equal(fr_wal_scan(buf, n, 4, NULL, NULL, &res), FERRY_ECORRUPT);
    /* A tail of zeros (a file extended but never written) is a torn tail. */
    memset(buf + n, 0, 40);
    assert_int_equal(fr_wal_scan(buf, n + 40, 5, NULL, NULL, &res), 0);
    assert_true(res.torn);
    assert_int_equal(res.valid_len, n);
}

/* ---- group commit ------------------------------------------------------------------ */

typedef struct { fr_wal *w; int id, n; int rc; } writer;

static void *writer_main(void *arg)
{
    writer *wr = arg;
    for (int i = 0; i < wr->n && wr->rc == 0; i++) {
        char key[32];
        uint8_t rec[128];
        uint64_t lsn;
        snprintf(key, sizeof(key), "t%d/%d", wr->id, i);
        fr_rec r = { .type = FR_REC_KV_PUT, .key = { key, (uint32_t)strlen(key) }, .val = { "v", 1 } };
        int len = fr_rec_encode(&r, rec, sizeof(rec));
        wr->rc = fr_wal_append(wr->w, rec, (size_t)len, &lsn);
        if (wr->rc == 0)
            wr->rc = fr_wal_sync(wr->w, lsn, fr_deadline_ns(30000));
        if (wr->rc == 0 && fr_wal_durable_lsn(wr->w) < lsn)
            wr->rc = -1;
    }
    return NULL;
}

static void test_group_commit(void **state)
{
    (void)state;
    char *dir = tmpdir();
    fr_meta *m;
    fr_wal *w;
    fr_wal_recovery rep;
    enum { T = 4, N = 400 };
    writer wr[T];
    pthread_t th[T];
    assert_int_equal(open_store(dir, NULL, &m, &w, NULL), 0);
    for (int t = 0; t < T; t++) {
        wr[t] = (writer){ w, t, N, 0 };
        assert_int_equal(pthread_create(&th[t], NULL, writer_main, &wr[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(wr[t].rc, 0);
    }
    fr_wal_stats st;
    fr_wal_stats_get(w, &st);
    assert_int_equal(st.appends, T * N);
    assert_true(st.fsyncs <= T * N);
    print_message("group commit: %d appends from %d threads, %llu fsyncs\n", T * N, T,
                  (unsigned long long)st.fsyncs);
    assert_int_equal(fr_wal_durable_lsn(w), T * N);
    assert_int_equal(fr_wal_sync(w, T * N + 1, UINT64_MAX), FERRY_EINVAL);   /* never appended */
    close_store(m, w);
    assert_int_equal(open_store(dir, NULL, &m, &w, &rep), 0);
    assert_int_equal(rep.replayed, T * N);
    assert_int_equal(fr_meta_kv_revision(m), T * N);
    /* The directory has one owner at a time. */
    fr_meta *m2;
    fr_wal *w2;
    assert_int_equal(open_store(dir, NULL, &m2, &w2, NULL), FERRY_EBUSY);
    close_store(m, w);
    rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frames),
        cmocka_unit_test(test_replay_equals_state),
        cmocka_unit_test(test_torn_tail_every_byte),
        cmocka_unit_test(test_kill9),
        cmocka_unit_test(test_checkpoint_crash_points),
        cmocka_unit_test(test_corruption_rejected),
        cmocka_unit_test(test_group_commit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
