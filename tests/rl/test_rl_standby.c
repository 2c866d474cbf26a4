/* Standby copies (ferry_subscriber_open_standby): two rollout processes in
 * DP2 (each holds every tensor; each reads half from the store and gets
 * the other half pushed by the other member) update with a standby copy of
 * every shard while two reader threads in each process read the active
 * copy throughout:
 *  - a free reader pins the active copy, checks every element against the
 *    generation the view names, and unpins, over and over, through flips;
 *  - a holding reader pins the active copy before each update starts and
 *    keeps checking it until the update has returned (then once more):
 *    the copy it holds stayed whole for the entire update.
 * Every read must see one whole generation. After each update the new
 * active copy holds the new generation and the other copy still holds the
 * previous one (nothing of the update touched it).
 * Then the failures: a reader that holds the standby copy too long (the
 * update fails before writing, the group with it), a member whose engine
 * fails mid-update (FERRY_EREBUILD), a member killed (the barrier times
 * out): no flip, the active copy keeps its generation, every element.
 * Overlapped updates (ferry_subscriber_update_next): started before the
 * publish or after it, they take the generation overlapped, whole, read
 * throughout; a group's first update falls back to a plain one; a failed
 * attempt of the generation meanwhile still ends with its retry's bytes;
 * a generation never announced is never flipped to. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/ftgroup.h"
#include "ferry/weights.h"
#include "rl/rl_int.h"

#define NT 5
static const uint64_t shapes[NT][2] = {
    {512, 256}, {256, 512}, {333, 77}, {1024, 64}, {2, 2},
};

static const ftg_model model = { .name = "standby", .prefix = "model", .nt = NT, .shapes = shapes,
                                  .bits = ftg_bits };

/* ---- a rollout process ------------------------------------------------------------------ */

typedef struct worker {
    const char *addr, *group;
    uint32_t rank, world;
    uint64_t timeout_ms;
    ferry_store *s;
    ferry_subscriber *sub;
    char names[NT][32];
    ferry_param_shard sh[NT];
    void *copy[2][NT];
    uint64_t gen;
    /* the readers */
    pthread_t free_th, hold_th;
    bool threads;
    atomic_bool stop;
    atomic_uint_fast64_t reads, mixed;          /* free reader: reads, of them not whole */
    atomic_int hold, held;                      /* holding reader: asked to hold; holding */
    atomic_uint_fast64_t passes, hold_bad;      /* holding reader: checks of its pin; bad */
    /* on_flip */
    atomic_uint_fast64_t flips, cb_gen, cb_wrong;
    atomic_uint cb_copy;
} worker;

static uint64_t bytes_of(size_t k) { return shapes[k][0] * shapes[k][1] * 2; }

/* Elements of a copy that do not hold generation gen (0: zeros). */
static uint64_t check_copy(void *const *bufs, uint64_t gen)
{
    uint64_t bad = 0;
    for (size_t k = 0; k < NT; k++) {
        const uint16_t *p = bufs[k];
        for (uint64_t i = 0; i < shapes[k][0] * shapes[k][1]; i++)
            bad += p[i] != (gen ? ftg_bits(gen, k, i) : 0);
    }
    return bad;
}

static void nap_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

static void *free_reader(void *arg)
{
    worker *w = arg;
    while (!atomic_load(&w->stop)) {
        ferry_standby_view v;
        if (ferry_subscriber_read_begin(w->sub, &v) < 0) {
            atomic_fetch_add(&w->mixed, 1);
            return NULL;
        }
        uint64_t bad = check_copy(v.bufs, v.generation);
        ferry_subscriber_read_end(w->sub, &v);
        atomic_fetch_add(&w->reads, 1);
        if (bad)
            atomic_fetch_add(&w->mixed, 1);
        nap_us(200);   /* pacing: the updates share two cores with it */
    }
    return NULL;
}

static void *hold_reader(void *arg)
{
    worker *w = arg;
    while (!atomic_load(&w->stop)) {
        if (!atomic_load(&w->hold)) {
            nap_us(500);
            continue;
        }
        ferry_standby_view v;
        if (ferry_subscriber_read_begin(w->sub, &v) < 0) {
            atomic_fetch_add(&w->hold_bad, 1);
            atomic_store(&w->held, 1);
            return NULL;
        }
        atomic_store(&w->held, 1);
        uint64_t bad = 0, n = 0;
        while (atomic_load(&w->hold) && !atomic_load(&w->stop)) {
            bad += check_copy(v.bufs, v.generation);
            n++;
            nap_us(500);
        }
        bad += check_copy(v.bufs, v.generation);   /* once more, after the update */
        n++;
        ferry_subscriber_read_end(w->sub, &v);
        atomic_fetch_add(&w->passes, n);
        atomic_fetch_add(&w->hold_bad, bad);
        atomic_store(&w->held, 0);
    }
    return NULL;
}

static void on_flip(void *ctx, const ferry_standby_view *v)
{
    worker *w = ctx;
    atomic_fetch_add(&w->flips, 1);
    atomic_store(&w->cb_gen, v->generation);
    atomic_store(&w->cb_copy, v->copy);
    for (size_t k = 0; k < NT; k++)
        if (v->n != NT || v->bufs[k] != w->copy[v->copy][k])
            atomic_fetch_add(&w->cb_wrong, 1);
}

/* Until flag == want, at most 20 s. */
static bool wait_flag(atomic_int *flag, int want)
{
    for (int i = 0; i < 40000 && atomic_load(flag) != want; i++)
        nap_us(500);
    return atomic_load(flag) == want;
}

static int worker_open(worker *w)
{
    if (ftg_worker_store(w->addr, &w->s) < 0)
        return -1;
    ferry_subscriber_config sc = { .model = "standby", .rank = w->rank, .world = w->world,
                                   .timeout_ms = w->timeout_ms, .batch_bytes = 64u << 10 };
    snprintf(sc.group, sizeof sc.group, "%s", w->group);
    for (size_t k = 0; k < NT; k++) {
        memset(w->copy[0][k], 0, bytes_of(k));
        memset(w->copy[1][k], 0, bytes_of(k));
        w->sh[k] = (ferry_param_shard){ .tensor = w->names[k], .ndim = 2,
                                        .shape = { shapes[k][0], shapes[k][1] },
                                        .dst = w->copy[0][k], .dst_bytes = bytes_of(k) };
    }
    ferry_error err = {0};
    int rc = ferry_subscriber_open_standby(w->s, &sc, w->sh, w->copy[1], NT, on_flip, w, &w->sub,
                                           &err);
    if (rc < 0) {
        printf("ERR open %s\n", err.msg);
        return -1;
    }
    w->gen = 0;
    atomic_store(&w->stop, false);
    atomic_store(&w->flips, 0);
    w->threads = pthread_create(&w->free_th, NULL, free_reader, w) == 0;
    if (w->threads && pthread_create(&w->hold_th, NULL, hold_reader, w) != 0) {
        atomic_store(&w->stop, true);
        pthread_join(w->free_th, NULL);
        w->threads = false;
    }
    if (!w->threads) {
        printf("ERR no reader threads\n");
        return -1;
    }
    /* the free reader has read once before any update: its count is real */
    for (int i = 0; i < 40000 && atomic_load(&w->reads) == 0; i++)
        nap_us(500);
    return 0;
}

static void worker_close(worker *w)
{
    atomic_store(&w->stop, true);
    if (w->threads) {
        pthread_join(w->free_th, NULL);
        pthread_join(w->hold_th, NULL);
        w->threads = false;
    }
    ferry_subscriber_close(w->sub);
    w->sub = NULL;
    ferry_store_close(w->s);
    w->s = NULL;
}

/* "update G": the holding reader pins the active copy first (unless a
 * "hold" already did), then the update, then the checks. */
static void cmd_update(worker *w, uint64_t want)
{
    bool self_hold = !atomic_load(&w->hold);
    uint64_t passes0 = atomic_load(&w->passes), prev = w->gen;
    if (self_hold) {
        atomic_store(&w->hold, 1);
        if (!wait_flag(&w->held, 1)) {
            printf("ERR the holding reader never pinned\n");
            return;
        }
    }
    ferry_update_stats st;
    ferry_error err = {0};
    int rc = ferry_subscriber_update(w->sub, &w->gen, &st, &err);
    if (self_hold) {
        atomic_store(&w->hold, 0);
        if (!wait_flag(&w->held, 0)) {
            printf("ERR the holding reader never let go\n");
            return;
        }
    }
    ferry_standby_view v;
    (void)ferry_subscriber_active_view(w->sub, &v);
    uint64_t bad_active = check_copy(v.bufs, v.generation), bad_other = 0;
    if (rc == 0)   /* the copy that was active before holds what it held */
        bad_other = check_copy(w->copy[1 - v.copy], prev);
    printf("%s rc=%d g=%llu want=%llu copy=%u vgen=%llu flips=%llu cbgen=%llu cbcopy=%u "
           "cbwrong=%llu bad_active=%llu bad_other=%llu reads=%llu mixed=%llu passes=%llu "
           "hold_bad=%llu recv=%llu reused=%d msg=%s\n",
           rc == 0 && w->gen == want ? "OK" : "ERR", rc, (unsigned long long)w->gen,
           (unsigned long long)want, v.copy, (unsigned long long)v.generation,
           (unsigned long long)atomic_load(&w->flips), (unsigned long long)atomic_load(&w->cb_gen),
           atomic_load(&w->cb_copy), (unsigned long long)atomic_load(&w->cb_wrong),
           (unsigned long long)bad_active, (unsigned long long)bad_other,
           (unsigned long long)atomic_load(&w->reads), (unsigned long long)atomic_load(&w->mixed),
           (unsigned long long)(atomic_load(&w->passes) - passes0),
           (unsigned long long)atomic_load(&w->hold_bad),
           (unsigned long long)(rc == 0 ? st.bytes_received : 0),
           rc == 0 && fr_subscriber_plan_reused(w->sub), rc ? err.msg : "");
}

/* "next G": ferry_subscriber_update_next, then the checks of "update". */
static void cmd_next(worker *w, uint64_t want)
{
    uint64_t prev = w->gen;
    ferry_update_stats st;
    ferry_error err = {0};
    bool ov = false;
    int rc = ferry_subscriber_update_next(w->sub, want, &w->gen, &ov, &st, &err);
    ferry_standby_view v;
    (void)ferry_subscriber_active_view(w->sub, &v);
    uint64_t bad_active = check_copy(v.bufs, v.generation), bad_other = 0;
    if (rc == 0)
        bad_other = check_copy(w->copy[1 - v.copy], prev);
    printf("%s rc=%d g=%llu want=%llu ov=%d copy=%u vgen=%llu flips=%llu cbgen=%llu cbcopy=%u "
           "cbwrong=%llu bad_active=%llu bad_other=%llu reads=%llu mixed=%llu passes=0 "
           "hold_bad=%llu recv=%llu msg=%s\n",
           rc == 0 && w->gen == want ? "OK" : "ERR", rc, (unsigned long long)w->gen,
           (unsigned long long)want, ov, v.copy, (unsigned long long)v.generation,
           (unsigned long long)atomic_load(&w->flips), (unsigned long long)atomic_load(&w->cb_gen),
           atomic_load(&w->cb_copy), (unsigned long long)atomic_load(&w->cb_wrong),
           (unsigned long long)bad_active, (unsigned long long)bad_other,
           (unsigned long long)atomic_load(&w->reads), (unsigned long long)atomic_load(&w->mixed),
           (unsigned long long)atomic_load(&w->hold_bad),
           (unsigned long long)(rc == 0 ? st.bytes_received : 0), rc ? err.msg : "");
}

static int rollout_main(worker *w)
{
    ftg_names(&model, w->names);
    for (size_t k = 0; k < NT; k++)
        for (int c = 0; c < 2; c++)
            if (!(w->copy[c][k] = malloc(bytes_of(k)))) {
                printf("ERR out of memory\n");
                return 1;
            }
    if (worker_open(w) < 0)
        return 1;
    printf("READY\n");
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long g;
        char spec[128];
        if (sscanf(line, "update %llu", &g) == 1) {
            cmd_update(w, g);
        } else if (sscanf(line, "next %llu", &g) == 1) {
            cmd_next(w, g);
        } else if (!strncmp(line, "hold", 4)) {
            atomic_store(&w->hold, 1);
            printf(wait_flag(&w->held, 1) ? "OK held\n" : "ERR not held\n");
        } else if (!strncmp(line, "release", 7)) {
            uint64_t p0 = atomic_load(&w->passes);
            atomic_store(&w->hold, 0);
            bool ok = wait_flag(&w->held, 0);
            printf("%s passes=%llu hold_bad=%llu\n", ok ? "OK" : "ERR",
                   (unsigned long long)(atomic_load(&w->passes) - p0),
                   (unsigned long long)atomic_load(&w->hold_bad));
        } else if (sscanf(line, "reopen %127s", spec) == 1) {
            /* a fresh engine (FERRY_FAULT=spec, "none": no fault), zeroed copies */
            worker_close(w);
            if (strcmp(spec, "none"))
                setenv("FERRY_FAULT", spec, 1);
            else
                unsetenv("FERRY_FAULT");
            if (worker_open(w) < 0)
                break;
            printf("OK reopened\n");
        } else {
            break;
        }
        fflush(stdout);
    }
    worker_close(w);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------------ */

typedef struct rollout_opts { const char *addr, *world, *group, *timeout_ms; } rollout_opts;

static void rollout_args(const void *ctx, int rank, ftg_args *a)
{
    const rollout_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { "--rollout", o->addr, a->buf[0], o->world, o->group, o->timeout_ms, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* The number after " key=" in a reply line (fails the test when missing). */
static unsigned long long field(const char *line, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    if (!p)
        fail_msg("no %s in: %s", key, line);
    return strtoull(p + strlen(pat), NULL, 10);
}

/* The update's return code in a reply line. */
static int rc_of(const char *line)
{
    const char *p = strstr(line, " rc=");
    if (!p)
        fail_msg("no rc in: %s", line);
    return atoi(p + 4);
}

/* Command cmd to worker k; its reply (OK) in r. */
static void peer_cmd(ftg_env *e, int k, char *r, const char *cmd)
{
    r[0] = 0;   /* a worker that died says nothing */
    if (ft_peer_cmd(&e->w[k], r, FTG_LINE, 60000, "%s", cmd) != 0)
        fail_msg("worker %d, %s: %s", k, cmd, r);
}

/* A successful update of worker k to g (flip number flips, into copy g % 2
 * since copy 0 starts active): whole copies, no mixed read. */
static void assert_flipped(const ftg_env *e, int k, uint64_t g, uint64_t flips)
{
    const char *l = e->line[k];
    if (e->rc[k] != 0)
        fail_msg("worker %d: %s", k, l);
    assert_int_equal(field(l, "g"), g);
    assert_int_equal(field(l, "vgen"), g);
    assert_int_equal(field(l, "copy"), flips % 2);
    assert_int_equal(field(l, "flips"), flips);
    assert_int_equal(field(l, "cbgen"), g);          /* the callback saw the new copy */
    assert_int_equal(field(l, "cbcopy"), flips % 2);
    assert_int_equal(field(l, "cbwrong"), 0);
    assert_int_equal(field(l, "bad_active"), 0);
    assert_int_equal(field(l, "bad_other"), 0);      /* the old copy untouched */
    assert_int_equal(field(l, "mixed"), 0);
    assert_int_equal(field(l, "hold_bad"), 0);
    assert_true(field(l, "reads") > 0);
    assert_true(field(l, "recv") > 0);               /* pushes from the other landed in it */
}

/* A failed update of worker k: no flip, the active copy whole at held. */
static void assert_kept(const ftg_env *e, int k, uint64_t held, uint64_t flips)
{
    const char *l = e->line[k];
    assert_int_not_equal(e->rc[k], 0);
    assert_int_not_equal(rc_of(l), 0);
    assert_int_equal(field(l, "g"), held);
    assert_int_equal(field(l, "vgen"), held);
    assert_int_equal(field(l, "flips"), flips);
    assert_int_equal(field(l, "bad_active"), 0);
    assert_int_equal(field(l, "mixed"), 0);
    assert_int_equal(field(l, "hold_bad"), 0);
    char want[64];
    snprintf(want, sizeof want, "still holds generation %llu", (unsigned long long)held);
    assert_non_null(strstr(l, want));
}

static void test_standby(void **state)
{
    ftg_env *e = *state;
    const rollout_opts o = { e->c.addr, "2", "sb", "8000" };
    assert_int_equal(ftg_start(e, 2, rollout_args, &o, -1, NULL), 0);
    uint64_t flips = 0;
    /* several updates, each read throughout by both readers */
    for (uint64_t g = 1; g <= 4; g++) {
        assert_int_equal(ftg_publish(e->s, &model, g, NULL), 0);
        assert_int_equal(ftg_send(e, "update %llu", (unsigned long long)g), 0);
        ftg_collect(e, 60000, -1);
        flips++;
        for (int k = 0; k < 2; k++) {
            fprintf(stderr, "generation %llu, worker %d: %s\n", (unsigned long long)g, k,
                    e->line[k]);
            assert_flipped(e, k, g, flips);
            assert_true(field(e->line[k], "passes") >= 2);   /* pinned across the update */
            /* each copy keeps its plan: the members alternate in step */
            assert_int_equal(field(e->line[k], "reused"), g > 2);
        }
    }

    /* A reader keeps the copy that becomes the standby copy: the update
     * after next cannot write it, fails before writing anything (half the
     * 8 s timeout), and the other member hears why at once. */
    char r[FTG_LINE];
    peer_cmd(e, 0, r, "hold");
    assert_int_equal(ftg_publish(e->s, &model, 5, NULL), 0);
    assert_int_equal(ftg_send(e, "update 5"), 0);
    ftg_collect(e, 60000, -1);
    flips++;
    for (int k = 0; k < 2; k++)
        assert_flipped(e, k, 5, flips);
    assert_int_equal(ftg_publish(e->s, &model, 6, NULL), 0);
    assert_int_equal(ftg_send(e, "update 6"), 0);
    ftg_collect(e, 60000, -1);
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "held reader, worker %d: %s\n", k, e->line[k]);
        assert_kept(e, k, 5, flips);
    }
    assert_int_equal(rc_of(e->line[0]), FERRY_ETIMEDOUT);
    assert_non_null(strstr(e->line[0], "still hold the standby copy"));
    assert_non_null(strstr(e->line[1], "worker 0"));
    assert_non_null(strstr(e->line[1], "nothing was written"));
    peer_cmd(e, 0, r, "release");
    fprintf(stderr, "released: %s\n", r);
    assert_int_equal(field(r, "hold_bad"), 0);   /* the held copy stayed generation 4 */
    assert_true(field(r, "passes") >= 1);
    assert_int_equal(ftg_send(e, "update 6"), 0);   /* the retry goes through */
    ftg_collect(e, 60000, -1);
    flips++;
    for (int k = 0; k < 2; k++)
        assert_flipped(e, k, 6, flips);

    /* Worker 1's engine fails mid-update (no read, push or notification):
     * worker 0 wrote part of its standby copy, flips nothing and keeps
     * generation 6 whole; the next update rewrites the standby copy whole. */
    peer_cmd(e, 1, r, "reopen post_fail_after=1");
    assert_int_equal(ftg_publish(e->s, &model, 7, NULL), 0);
    assert_int_equal(ftg_send(e, "update 7"), 0);
    ftg_collect(e, 60000, -1);
    fprintf(stderr, "failing member, worker 0: %s\n", e->line[0]);
    assert_kept(e, 0, 6, flips);
    assert_int_equal(rc_of(e->line[0]), FERRY_EREBUILD);
    assert_int_not_equal(e->rc[1], 0);
    peer_cmd(e, 1, r, "reopen none");
    assert_int_equal(ftg_send(e, "update 7"), 0);
    ftg_collect(e, 60000, -1);
    flips++;
    assert_flipped(e, 0, 7, flips);
    assert_flipped(e, 1, 7, 1);   /* reopened: its first flip */

    /* Worker 1 is killed: worker 0's update times out at the barrier,
     * flips nothing and keeps generation 7. */
    ft_peer_signal(&e->w[1], SIGKILL);
    assert_int_equal(ft_peer_wait_exit(&e->w[1], 20000), 0);
    assert_int_equal(ftg_publish(e->s, &model, 8, NULL), 0);
    assert_int_equal(ft_peer_send(&e->w[0], "update 8"), 0);
    assert_int_not_equal(ft_peer_reply(&e->w[0], e->line[0], sizeof e->line[0], 60000), 0);
    e->rc[0] = -1;
    fprintf(stderr, "killed member, worker 0: %s\n", e->line[0]);
    assert_kept(e, 0, 7, flips);
    assert_int_equal(rc_of(e->line[0]), FERRY_ETIMEDOUT);
}

/* Overlapped updates of a group of two (see the top). */
static void test_update_next(void **state)
{
    ftg_env *e = *state;
    const rollout_opts o = { e->c.addr, "2", "ov", "8000" };
    assert_int_equal(ftg_start(e, 2, rollout_args, &o, -1, NULL), 0);
    /* the first update holds nothing to plan on: a plain one */
    assert_int_equal(ftg_publish(e->s, &model, 1, NULL), 0);
    assert_int_equal(ftg_send(e, "next 1"), 0);
    ftg_collect(e, 60000, -1);
    uint64_t flips = 1;
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "first, worker %d: %s\n", k, e->line[k]);
        assert_flipped(e, k, 1, flips);
        assert_int_equal(field(e->line[k], "ov"), 0);
    }
    /* started before the publish, and after it: overlapped, whole */
    for (uint64_t g = 2; g <= 5; g++) {
        bool before = g % 2 == 0;
        if (!before)
            assert_int_equal(ftg_publish(e->s, &model, g, NULL), 0);
        assert_int_equal(ftg_send(e, "next %llu", (unsigned long long)g), 0);
        if (before)
            assert_int_equal(ftg_publish(e->s, &model, g, NULL), 0);
        ftg_collect(e, 60000, -1);
        flips++;
        for (int k = 0; k < 2; k++) {
            fprintf(stderr, "next %llu (%s the publish), worker %d: %s\n", (unsigned long long)g,
                    before ? "before" : "after", k, e->line[k]);
            assert_flipped(e, k, g, flips);
            assert_int_equal(field(e->line[k], "ov"), 1);
        }
    }
    /* an attempt of generation 6 fails (its part said so, then removed),
     * the retry stores it: the update ends with the retry's bytes */
    assert_int_equal(ftg_send(e, "next 6"), 0);
    uint32_t node0 = 0;
    ferry_publisher_config pc = { .model = "standby", .rank = 0, .world = 1, .rank_node = &node0,
                                  .keep = 2, .timeout_ms = 10000 };
    ferry_error err = {0};
    assert_int_equal(ferry_publish_abort(e->s, &pc, 6, "a trainer failed", &err), FERRY_EINVAL);
    assert_int_equal(ftg_publish(e->s, &model, 6, NULL), 0);
    ftg_collect(e, 60000, -1);
    flips++;
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "after a failed attempt, worker %d: %s\n", k, e->line[k]);
        assert_flipped(e, k, 6, flips);
    }
    /* generation 7 is never announced: nothing flips, 6 stays whole */
    assert_int_equal(ftg_send(e, "next 7"), 0);
    ftg_collect(e, 60000, -1);
    for (int k = 0; k < 2; k++) {
        const char *l = e->line[k];
        fprintf(stderr, "never announced, worker %d: %s\n", k, l);
        assert_int_not_equal(e->rc[k], 0);
        assert_int_equal(rc_of(l), FERRY_ETIMEDOUT);
        assert_int_equal(field(l, "g"), 6);
        assert_int_equal(field(l, "vgen"), 6);
        assert_int_equal(field(l, "flips"), flips);
        assert_int_equal(field(l, "bad_active"), 0);
        assert_int_equal(field(l, "mixed"), 0);
        assert_non_null(strstr(l, "generation 7"));
    }
    /* and the group goes on */
    assert_int_equal(ftg_publish(e->s, &model, 7, NULL), 0);
    assert_int_equal(ftg_send(e, "next 7"), 0);
    ftg_collect(e, 60000, -1);
    flips++;
    for (int k = 0; k < 2; k++)
        assert_flipped(e, k, 7, flips);
}

/* Bad input: a standby copy that overlaps the first copy is refused at
 * the first update (nothing written, the group told); a NULL one at open. */
static void test_overlap_refused(void **state)
{
    ftg_env *e = *state;
    assert_int_equal(ftg_publish(e->s, &model, 1, NULL), 0);
    char names[NT][32];
    ftg_names(&model, names);
    uint8_t *buf = calloc(1, 2 * bytes_of(0));
    assert_non_null(buf);
    ferry_param_shard sh = { .tensor = names[0], .ndim = 2, .shape = { shapes[0][0], shapes[0][1] },
                             .dst = buf, .dst_bytes = bytes_of(0) };
    void *standby = buf + 64;   /* shares all but 64 bytes */
    ferry_subscriber_config sc = { .model = "standby", .group = "overlap", .rank = 0, .world = 1,
                                   .timeout_ms = 8000 };
    ferry_subscriber *sub = NULL;
    ferry_error err = {0};
    void *none[1] = { NULL };
    assert_int_equal(ferry_subscriber_open_standby(e->s, &sc, &sh, none, 1, NULL, NULL, &sub, &err),
                     FERRY_EINVAL);
    assert_null(sub);
    assert_int_equal(ferry_subscriber_open_standby(e->s, &sc, &sh, &standby, 1, NULL, NULL, &sub,
                                                   &err), 0);
    uint64_t gen = 0;
    int rc = ferry_subscriber_update(sub, &gen, NULL, &err);
    fprintf(stderr, "overlapping copies: %d %s\n", rc, err.msg);
    assert_int_equal(rc, FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "overlaps"));
    assert_non_null(strstr(err.msg, names[0]));
    assert_int_equal(gen, 0);
    for (uint64_t i = 0; i < 2 * bytes_of(0); i++)
        if (buf[i])
            fail_msg("byte %llu written", (unsigned long long)i);
    ferry_standby_view v;
    assert_int_equal(ferry_subscriber_active_view(sub, &v), 0);
    assert_int_equal(v.copy, 0);
    ferry_subscriber_close(sub);
    /* without standby copies there is nothing to pin */
    assert_int_equal(ferry_subscriber_open(e->s, &sc, &sh, 1, &sub, &err), 0);
    assert_int_equal(ferry_subscriber_read_begin(sub, &v), FERRY_EINVAL);
    ferry_subscriber_close(sub);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--rollout")) {
        static worker w;
        w.addr = argv[2];
        w.rank = (uint32_t)atoi(argv[3]);
        w.world = (uint32_t)atoi(argv[4]);
        w.group = argv[5];
        w.timeout_ms = strtoull(argv[6], NULL, 10);
        return rollout_main(&w);
    }
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_standby, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_overlap_refused, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_update_next, ftg_setup, ftg_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
