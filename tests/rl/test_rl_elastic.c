/* Elastic rollout groups (world 0: the membership lives in the store).
 * Real rollout processes, each a TP shard (of two) of every tensor, take
 * generations together and every parameter byte is checked:
 *  - a group of 4 loses one member to SIGKILL: the next update completes
 *    with the 3 survivors, the store still read once per byte;
 *  - a fifth joins: the next update includes it;
 *  - a member restarted (killed, started again) between two updates
 *    catches up in the second;
 *  - a fresh member joining a group already at the generation updates
 *    alone, then with the others at the next one;
 *  - a member that arrives while an update is in flight waits for it and,
 *    when it does not end within its timeout, says what it waited for;
 *    the group then updates with everyone;
 *  - a member whose layout conflicts with the group's is refused at
 *    prepare (the error names it and the tensor) and the others update
 *    without it, in the same call and the next. */
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

#include "util/ftgroup.h"
#include "ferry/weights.h"
#include "rl/rl_int.h"   /* fr_subscriber_plan_reused */

#define NT 4
static const uint64_t shapes[NT][2] = { {512, 256}, {333, 77}, {1024, 64}, {2, 2} };
static const ftg_model model = { .name = "elastic", .prefix = "model", .nt = NT, .shapes = shapes,
                                  .bits = ftg_bits };

/* ---- a rollout process -------------------------------------------------------------------- */

typedef struct member {
    ferry_store *s;
    ferry_subscriber *sub;
    char names[NT][32];
    ferry_param_shard sh[NT];
    uint64_t gen;
} member;

/* The reply to "update GEN": OK, this worker's store reads, the group's,
 * the elements not holding GEN, the epoch's size, this worker's position,
 * the epoch, whether the plan was reused; or ERR, the code and the message. */
static void member_update(void *ctx, uint64_t want)
{
    member *w = ctx;
    ferry_update_stats st;
    ferry_error err = {0};
    int rc = ferry_subscriber_update(w->sub, &w->gen, &st, &err);
    uint64_t bad = 0;
    for (size_t k = 0; rc == 0 && k < NT; k++) {
        const uint16_t *p = w->sh[k].dst;
        uint64_t cols = shapes[k][1], first = w->sh[k].offset[0] * cols;
        for (uint64_t i = 0; i < w->sh[k].shape[0] * cols; i++)
            bad += p[i] != ftg_bits(want, k, first + i);
    }
    if (rc == 0 && w->gen == want)
        printf("OK %llu %llu %llu %u %u %llu %d\n", (unsigned long long)st.bytes_read,
               (unsigned long long)st.group_bytes_read, (unsigned long long)bad, st.members,
               st.position, (unsigned long long)st.epoch, fr_subscriber_plan_reused(w->sub));
    else
        printf("ERR %d %s\n", rc, err.msg);
}

/* TP shard tp of 2 of every tensor; wide: its shard of tensor 1 has one
 * column more than the tensor (a layout that conflicts with the group's). */
static int member_main(const char *addr, uint32_t tp, const char *name, uint64_t timeout_ms,
                       int wide, uint64_t held)
{
    member w = { .gen = held };   /* the generation it says it holds at its first update */
    if (ftg_worker_store(addr, &w.s) < 0)
        return 1;
    ftg_names(&model, w.names);
    for (size_t k = 0; k < NT; k++) {
        uint64_t part = (shapes[k][0] + 1) / 2, r0 = tp * part;
        uint64_t rows = r0 + part <= shapes[k][0] ? part : shapes[k][0] - r0;
        uint64_t cols = shapes[k][1] + (wide && k == 1);
        w.sh[k] = (ferry_param_shard){ .tensor = w.names[k], .ndim = 2, .offset = { r0, 0 },
                                       .shape = { rows, cols }, .dst = calloc(rows * cols + 1, 2),
                                       .dst_bytes = (rows * cols + 1) * 2 };
    }
    ferry_subscriber_config sc = { .model = "elastic", .group = "rollout", .world = 0,
                                   .timeout_ms = timeout_ms, .batch_bytes = 64u << 10 };
    snprintf(sc.member, sizeof sc.member, "%s", name);
    ferry_error err = {0};
    if (ferry_subscriber_open(w.s, &sc, w.sh, NT, &w.sub, &err) < 0) {
        printf("ERR open %s\n", err.msg);
        return 1;
    }
    ftg_worker_serve(member_update, &w);
    ferry_subscriber_close(w.sub);
    for (size_t k = 0; k < NT; k++)
        free(w.sh[k].dst);
    ferry_store_close(w.s);
    return 0;
}

/* ---- the test side ---------------------------------------------------------------------------- */

/* Start member `slot` (tp shard slot % 2 unless wide, which takes 0),
 * saying it holds generation held (a string) at its first update. */
static void start_held(ftg_env *e, int slot, const char *name, const char *timeout_ms, int wide,
                       const char *held)
{
    char tp[8];
    snprintf(tp, sizeof tp, "%d", wide ? 0 : slot % 2);
    const char *argv[] = { "--member", e->c.addr, tp, name, timeout_ms, wide ? "1" : "0", held,
                           NULL };
    assert_int_equal(ft_spawn(&e->w[slot], NULL, argv), 0);
    if (slot >= e->n)
        e->n = slot + 1;
    char line[256] = "";
    assert_int_equal(ft_read_line(&e->w[slot], line, sizeof line, 20000), 0);
    assert_string_equal(line, "READY");
}

static void start(ftg_env *e, int slot, const char *name, const char *timeout_ms, int wide)
{
    start_held(e, slot, name, timeout_ms, wide, "0");
}

typedef struct reply {
    int ok;
    unsigned long long read, group_read, bad, epoch;
    unsigned members, position;
    int reused;
    char line[FTG_LINE];
} reply;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "update gen" to the members in slots[0..n), then their replies (the
 * time the group took is printed, never asserted). */
static void update(ftg_env *e, const int *slots, int n, uint64_t gen, reply *out)
{
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        assert_int_equal(ft_peer_send(&e->w[slots[i]], "update %llu", (unsigned long long)gen), 0);
    for (int i = 0; i < n; i++) {
        reply *r = &out[i];
        memset(r, 0, sizeof *r);
        (void)ft_peer_reply(&e->w[slots[i]], r->line, sizeof r->line, 120000);
        r->ok = sscanf(r->line, "OK %llu %llu %llu %u %u %llu %d", &r->read, &r->group_read,
                       &r->bad, &r->members, &r->position, &r->epoch, &r->reused) == 7;
        fprintf(stderr, "generation %llu, slot %d: %s\n", (unsigned long long)gen, slots[i],
                r->line);
    }
    fprintf(stderr, "generation %llu: %d members answered in %.2f s\n", (unsigned long long)gen, n,
            now_s() - t0);
}

/* Every member of the update OK with every byte, the epoch of n members,
 * each at its own position, the store read once per published byte. */
static void check_group(const reply *r, int n, uint64_t published)
{
    unsigned long long read = 0;
    unsigned seen = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].ok)
            fail_msg("member %d: %s", i, r[i].line);
        assert_int_equal(r[i].bad, 0);
        assert_int_equal(r[i].members, (unsigned)n);
        assert_int_equal(r[i].group_read, published);
        assert_int_equal(r[i].epoch, r[0].epoch);
        assert_true(r[i].position < (unsigned)n);
        assert_false(seen & 1u << r[i].position);
        seen |= 1u << r[i].position;
        read += r[i].read;
    }
    assert_int_equal(read, published);
}

static void test_kill_join_restart(void **state)
{
    ftg_env *e = *state;
    reply r[8];
    uint64_t published = 0;
    const char *names[] = { "m0", "m1", "m2", "m3", "m4" };
    for (int k = 0; k < 4; k++)
        start(e, k, names[k], "30000", 0);
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    update(e, (const int[]){ 0, 1, 2, 3 }, 4, 1, r);
    check_group(r, 4, published);
    uint64_t epoch4 = r[0].epoch;

    /* one of the four dies: the next update goes with the three others */
    ft_proc_kill(&e->w[3], SIGKILL);
    assert_int_equal(ftg_publish(e->s, &model, 2, NULL), 0);
    update(e, (const int[]){ 0, 1, 2 }, 3, 2, r);
    check_group(r, 3, published);
    assert_true(r[0].epoch != epoch4);   /* the membership changed: planned anew */
    assert_false(r[0].reused || r[1].reused || r[2].reused);

    /* a fifth joins: the next update includes it */
    start(e, 4, names[4], "30000", 0);
    assert_int_equal(ftg_publish(e->s, &model, 3, NULL), 0);
    update(e, (const int[]){ 0, 1, 2, 4 }, 4, 3, r);
    check_group(r, 4, published);

    /* a member restarted between two updates catches up in the second
     * (it holds nothing when it comes back) */
    ft_proc_kill(&e->w[2], SIGKILL);
    start(e, 2, "m2-again", "30000", 0);
    assert_int_equal(ftg_publish(e->s, &model, 4, NULL), 0);
    update(e, (const int[]){ 0, 1, 2, 4 }, 4, 4, r);
    check_group(r, 4, published);
}

/* Wait (a deadline of 60 s, on the master's push) until the group's epoch
 * record names an update to generation gen. */
static bool epoch_for(ferry_watch *w, uint64_t gen)
{
    ferry_kv_event ev;
    while (ferry_watch_next(w, 60000, &ev, NULL) == 0) {
        char buf[64];
        size_t n = ev.len < sizeof buf - 1 ? ev.len : sizeof buf - 1;
        memcpy(buf, ev.val, n);
        buf[n] = 0;
        unsigned long long epoch, seq, g;
        if (!ev.deleted && strcmp(ev.key, "ferry/wg/elastic/rollout/epoch") == 0 &&
            sscanf(buf, "%llu %llu %llu", &epoch, &seq, &g) == 3 && g == gen)
            return true;
    }
    return false;
}

static void test_arrive_in_flight(void **state)
{
    ftg_env *e = *state;
    reply r[4];
    uint64_t published = 0;
    start(e, 0, "first", "4000", 0);
    start(e, 1, "idle", "30000", 0);
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    /* "first" takes generation 1 with "idle", which does not come yet */
    ferry_watch *w = NULL;
    assert_int_equal(ferry_kv_watch(e->s, "ferry/wg/elastic/rollout/", 0, &w, NULL), 0);
    assert_int_equal(ft_peer_send(&e->w[0], "update 1"), 0);
    bool made = epoch_for(w, 1);
    ferry_watch_close(w);
    assert_true(made);
    /* a third member arrives while that update is in flight: it waits for
     * it, and says what it waited for when its timeout ends first */
    start(e, 2, "late", "4000", 0);
    update(e, (const int[]){ 2 }, 1, 1, r);
    assert_false(r[0].ok);
    assert_non_null(strstr(r[0].line, "late waited for the update of its group to generation 1"));
    char want[32];
    snprintf(want, sizeof want, "ERR %d ", FERRY_ETIMEDOUT);
    assert_true(strncmp(r[0].line, want, strlen(want)) == 0);
    char first[FTG_LINE] = "";
    (void)ft_peer_reply(&e->w[0], first, sizeof first, 120000);
    fprintf(stderr, "first (its partner never came): %s\n", first);
    assert_true(strncmp(first, "ERR ", 4) == 0);
    /* then everyone updates together */
    update(e, (const int[]){ 1, 0, 2 }, 3, 1, r);
    check_group(r, 3, published);
}

/* A fresh member joining a group that is already at the active
 * generation updates alone (the others hold it: they are not part of that
 * update), then with everyone at the next one. */
static void test_fresh_member_alone(void **state)
{
    ftg_env *e = *state;
    reply r[4];
    uint64_t published = 0;
    start(e, 0, "a", "30000", 0);
    start(e, 1, "b", "30000", 0);
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    update(e, (const int[]){ 0, 1 }, 2, 1, r);
    check_group(r, 2, published);
    start(e, 2, "fresh", "30000", 0);
    update(e, (const int[]){ 2 }, 1, 1, r);
    assert_true(r[0].ok);   /* alone: it read its whole shard itself */
    assert_int_equal(r[0].bad, 0);
    assert_int_equal(r[0].members, 1);
    assert_int_equal(r[0].position, 0);
    assert_int_equal(r[0].read, r[0].group_read);
    assert_true(r[0].read > 0 && r[0].read < published);
    assert_int_equal(ftg_publish(e->s, &model, 2, NULL), 0);
    update(e, (const int[]){ 0, 1, 2 }, 3, 2, r);
    check_group(r, 3, published);
}

/* A member that says it holds the active generation (it loaded it
 * elsewhere) while an update to it that names it runs takes part in it
 * (the others wait for it there) and gets every byte again. */
static void test_member_opened_holding(void **state)
{
    ftg_env *e = *state;
    reply r[4];
    uint64_t published = 0;
    start(e, 0, "a", "30000", 0);
    start(e, 1, "b", "30000", 0);
    start_held(e, 2, "loaded", "30000", 0, "1");
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    ferry_watch *w = NULL;
    assert_int_equal(ferry_kv_watch(e->s, "ferry/wg/elastic/rollout/", 0, &w, NULL), 0);
    assert_int_equal(ft_peer_send(&e->w[0], "update 1"), 0);
    bool made = epoch_for(w, 1);   /* made by "a": it names all three */
    ferry_watch_close(w);
    assert_true(made);
    for (int k = 1; k < 3; k++)
        assert_int_equal(ft_peer_send(&e->w[k], "update 1"), 0);
    for (int k = 0; k < 3; k++) {
        memset(&r[k], 0, sizeof r[k]);
        (void)ft_peer_reply(&e->w[k], r[k].line, sizeof r[k].line, 120000);
        r[k].ok = sscanf(r[k].line, "OK %llu %llu %llu %u %u %llu %d", &r[k].read,
                         &r[k].group_read, &r[k].bad, &r[k].members, &r[k].position, &r[k].epoch,
                         &r[k].reused) == 7;
        fprintf(stderr, "generation 1, slot %d: %s\n", k, r[k].line);
    }
    check_group(r, 3, published);
}

static void test_layout_conflict(void **state)
{
    ftg_env *e = *state;
    reply r[4];
    uint64_t published = 0;
    start(e, 0, "a", "30000", 0);
    start(e, 1, "b", "30000", 0);
    start(e, 2, "wide", "30000", 1);
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    update(e, (const int[]){ 0, 1, 2 }, 3, 1, r);
    /* refused, naming the member and the tensor; nothing written */
    assert_false(r[2].ok);
    char want[32];
    snprintf(want, sizeof want, "ERR %d ", FERRY_ERANGE);
    assert_true(strncmp(r[2].line, want, strlen(want)) == 0);
    assert_non_null(strstr(r[2].line, "member wide of group rollout refused"));
    assert_non_null(strstr(r[2].line, "model.1.weight"));
    /* the others went on without it, in the same call */
    check_group(r, 2, published);
    /* it left the group: the next update does not wait for it; the
     * membership is the same, so is the epoch, and the plan is reused */
    unsigned long long epoch = r[0].epoch;
    assert_int_equal(ftg_publish(e->s, &model, 2, NULL), 0);
    update(e, (const int[]){ 0, 1 }, 2, 2, r);
    check_group(r, 2, published);
    assert_int_equal(r[0].epoch, epoch);
    assert_true(r[0].reused && r[1].reused);
}

int main(int argc, char **argv)
{
    if (argc == 8 && !strcmp(argv[1], "--member"))
        return member_main(argv[2], (uint32_t)atoi(argv[3]), argv[4], strtoull(argv[5], NULL, 10),
                           atoi(argv[6]), strtoull(argv[7], NULL, 10));
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill_join_restart, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_arrive_in_flight, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_fresh_member_alone, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_member_opened_holding, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_layout_conflict, ftg_setup, ftg_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
