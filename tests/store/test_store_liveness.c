/* store: liveness without data loss, with real `ferry master` and `ferry
 * node` processes and a client process of this binary.
 *
 *  - a node stopped (SIGSTOP) for 3x the heartbeat timeout is suspect:
 *    reads of its objects fail fast with FERRY_EUNREACH, new puts go
 *    elsewhere; continued (SIGCONT), every object reads back with its
 *    bytes and none is lost; killed (SIGKILL), its objects are lost once
 *    the grace period has passed;
 *  - the master itself stopped for 3x the heartbeat timeout holds none of
 *    that time against its peers;
 *  - a client stopped while it holds queue leases and a pending put keeps
 *    them; killed, they are returned and revoked after the grace period,
 *    long before the leases would have lapsed. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/client_int.h"
#include "util/ftstore.h"

#define MB (1u << 20)
#define HB_MS 1000              /* the master's heartbeat timeout in these tests */
#define NOBJ 8
#define LONG_LEASE_MS 600000    /* the client's queue leases: ten minutes */

static const char *const g_master_args[] = { "--heartbeat-timeout", "1000", "--grace", "1500",
                                             "--pending-timeout", "600000", NULL };

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void nap(int ms)   /* the step of a deadline poll */
{
    poll(NULL, 0, ms);
}

/* ---- the client process: holds leases and a pending put ----------------------- */

static int lease_client(const char *master)
{
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", master);
    cfg.heartbeat_ms = 100;
    ferry_store *s;
    if (ferry_store_open(&cfg, &s, NULL) != 0) {
        printf("FAIL open\n");
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    ferry_qrecord rec[16];
    size_t n = 0;
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        char key[128];
        if (!strncmp(line, "pop", 3)) {
            ferry_qrecords_free(rec, n);
            n = 0;
            int rc = ferry_queue_pop(s, "q", 3, LONG_LEASE_MS, rec, &n, NULL);
            printf("%s %d %zu", rc == 0 ? "OK" : "FAIL", rc, n);
            for (size_t i = 0; i < n; i++)
                printf(" %llu", (unsigned long long)rec[i].id);
            printf("\n");
        } else if (sscanf(line, "start %127s", key) == 1) {   /* a put that never ends */
            fr_smsg q = { .type = FR_SMSG_PUT_START, .key = fr_client_str(key), .size = 4096 }, r;
            uint8_t *buf = NULL;
            int rc = fr_client_rpc(s, &q, FR_SMSG_PLACEMENT, &r, &buf, NULL);
            fr_free(buf);
            printf("%s %d\n", rc == 0 ? "OK" : "FAIL", rc);
        } else if (!strncmp(line, "ack", 3)) {
            int bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += ferry_queue_ack(s, rec[i].id, rec[i].token, NULL) != 0;
            printf("%s %d\n", bad == 0 ? "OK" : "FAIL", bad);
        } else if (!strncmp(line, "quit", 4)) {
            break;
        } else {
            printf("FAIL unknown\n");
        }
        fflush(stdout);
    }
    ferry_qrecords_free(rec, n);
    ferry_store_close(s);
    return 0;
}

/* ---- fixture ---------------------------------------------------------------------- */

typedef struct fx {
    ft_cluster c;
    ferry_store *s;
} fx;

static int setup_nodes(void **state, int nodes)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL || ft_master_start(&f->c, NULL, g_master_args) != 0)
        goto fail;
    for (int i = 0; i < nodes; i++)
        if (ft_node_start(&f->c, i, 64 * MB, NULL, NULL) != 0)
            goto fail;
    ferry_store_config cfg;
    ft_store_config(&f->c, &cfg);
    cfg.lease_ms = 1;
    if (ferry_store_open(&cfg, &f->s, NULL) != 0)
        goto fail;
    *state = f;
    return 0;
fail:
    if (f)
        ft_cluster_stop(&f->c);
    free(f);
    return -1;
}

static int setup1(void **state) { return setup_nodes(state, 1); }
static int setup2(void **state) { return setup_nodes(state, 2); }

static int teardown(void **state)
{
    fx *f = *state;
    if (f) {
        ferry_store_close(f->s);
        ft_cluster_stop(&f->c);
        free(f);
    }
    return 0;
}

/* The master's STATUS: liveness counter, or a node's state, or a field. */
static json_t *status(fx *f)
{
    char *text = NULL;
    assert_int_equal(ferry_store_status_json(f->s, &text, NULL), 0);
    json_t *j = json_loads(text, 0, NULL);
    ferry_store_free(text);
    assert_non_null(j);
    return j;
}

static int64_t live_stat(fx *f, const char *name)
{
    json_t *j = status(f);
    int64_t v = json_integer_value(json_object_get(json_object_get(j, "liveness"), name));
    json_decref(j);
    return v;
}

static int64_t top_stat(fx *f, const char *name)
{
    json_t *j = status(f);
    int64_t v = json_integer_value(json_object_get(j, name));
    json_decref(j);
    return v;
}

static bool node_state_is(fx *f, uint64_t seg, const char *want)
{
    json_t *j = status(f);
    uint64_t node = 0;
    json_t *v;
    size_t i;
    json_array_foreach(json_object_get(j, "segments"), i, v)
        if ((uint64_t)json_integer_value(json_object_get(v, "id")) == seg)
            node = (uint64_t)json_integer_value(json_object_get(v, "node"));
    bool same = false;
    json_array_foreach(json_object_get(j, "nodes"), i, v)
        if ((uint64_t)json_integer_value(json_object_get(v, "id")) == node)
            same = strcmp(json_string_value(json_object_get(v, "state")), want) == 0;
    json_decref(j);
    return same;
}

static void put_objects(fx *f, uint64_t seg, uint8_t **src)
{
    for (int i = 0; i < NOBJ; i++) {
        char key[32];
        snprintf(key, sizeof key, "obj/%d", i);
        src[i] = malloc(MB);
        assert_non_null(src[i]);
        ft_pattern(src[i], MB, (uint64_t)i + 1, 0);
        ferry_replicate_config rc = { .preferred_segments = &seg, .npreferred = 1 };
        ferry_object_desc d;
        assert_int_equal(ferry_store_put(f->s, key, src[i], MB, &rc, &d, NULL), 0);
        assert_int_equal(d.replicas[0].segment, seg);
    }
}

/* Every object reads back with its bytes. */
static void check_objects(fx *f, uint8_t **src)
{
    uint8_t *got = malloc(MB);
    assert_non_null(got);
    for (int i = 0; i < NOBJ; i++) {
        char key[32];
        snprintf(key, sizeof key, "obj/%d", i);
        size_t n = 0;
        assert_int_equal(ferry_store_get_into(f->s, key, got, MB, &n, NULL), 0);
        assert_int_equal(n, MB);
        assert_memory_equal(got, src[i], MB);
    }
    free(got);
}

static int read_obj_why(fx *f, int i, ferry_error *err)
{
    char key[32];
    snprintf(key, sizeof key, "obj/%d", i);
    static uint8_t buf[MB];
    size_t n = 0;
    return ferry_store_get_into(f->s, key, buf, sizeof buf, &n, err);
}

static int read_obj(fx *f, int i)
{
    return read_obj_why(f, i, NULL);
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_node_stopped_then_killed(void **state)
{
    fx *f = *state;
    uint8_t *src[NOBJ];
    put_objects(f, f->c.seg[0], src);
    check_objects(f, src);   /* the client has mapped the node's segment */

    ft_peer_signal(&f->c.node[0], SIGSTOP);
    uint64_t t0 = now_ms();
    int rc = 0;
    ferry_error fe = {0};
    while (now_ms() - t0 < 60000 && (rc = read_obj_why(f, 0, &fe)) == 0)
        nap(20);
    assert_int_equal(rc, FERRY_EUNREACH);
    const char *why = fe.msg;
    assert_non_null(strstr(why, "unreachable"));
    assert_non_null(strstr(why, "kept"));
    assert_true(node_state_is(f, f->c.seg[0], "suspect"));
    /* Held stopped for 3x the heartbeat timeout: reads keep failing fast,
     * nothing is lost, and new puts go to the other node. */
    int reads = 0;
    while (now_ms() - t0 < 3 * HB_MS) {
        assert_int_equal(read_obj(f, reads % NOBJ), FERRY_EUNREACH);
        reads++;
        nap(50);
    }
    uint8_t small[64] = { 1 };
    ferry_replicate_config pref0 = { .preferred_segments = &f->c.seg[0], .npreferred = 1 };
    ferry_object_desc d;
    assert_int_equal(ferry_store_put(f->s, "new", small, sizeof small, &pref0, &d, NULL), 0);
    assert_int_equal(d.replicas[0].segment, f->c.seg[1]);
    assert_int_equal(live_stat(f, "nodes_declared_dead"), 0);
    printf("stopped %llu ms (%d reads refused with FERRY_EUNREACH meanwhile)\n",
           (unsigned long long)(now_ms() - t0), reads);

    ft_peer_signal(&f->c.node[0], SIGCONT);
    uint64_t t1 = now_ms();
    while (now_ms() - t1 < 60000 && (rc = read_obj(f, 0)) != 0)
        nap(20);
    assert_int_equal(rc, 0);
    check_objects(f, src);
    assert_true(node_state_is(f, f->c.seg[0], "live"));
    assert_int_equal(live_stat(f, "nodes_declared_dead"), 0);
    printf("continued: %d of %d objects read back with their bytes, 0 lost\n", NOBJ, NOBJ);

    /* Killed: its connection closes; lost once the grace period passes. */
    ft_proc_kill(&f->c.node[0], SIGKILL);
    uint64_t t2 = now_ms();
    while (now_ms() - t2 < 60000 && (rc = ferry_store_exist(f->s, "obj/0", NULL)) == 1)
        nap(20);
    assert_int_equal(rc, FERRY_ELOST);
    for (int i = 0; i < NOBJ; i++) {
        char key[32];
        snprintf(key, sizeof key, "obj/%d", i);
        assert_int_equal(ferry_store_exist(f->s, key, NULL), FERRY_ELOST);
    }
    assert_int_equal(ferry_store_exist(f->s, "new", NULL), 1);
    assert_int_equal(live_stat(f, "nodes_declared_dead"), 1);
    printf("killed: %d objects lost %llu ms later (grace 1500 ms)\n", NOBJ,
           (unsigned long long)(now_ms() - t2));
    for (int i = 0; i < NOBJ; i++)
        free(src[i]);
}

static void test_master_stopped(void **state)
{
    fx *f = *state;
    uint8_t *src[NOBJ];
    put_objects(f, f->c.seg[0], src);
    ft_peer_signal(&f->c.master, SIGSTOP);
    uint64_t t0 = now_ms();
    while (now_ms() - t0 < 3 * HB_MS)
        nap(50);   /* the scenario itself: the master does not run for this long */
    ft_peer_signal(&f->c.master, SIGCONT);
    check_objects(f, src);
    assert_int_equal(live_stat(f, "nodes_suspected"), 0);
    assert_int_equal(live_stat(f, "nodes_declared_dead"), 0);
    assert_int_equal(top_stat(f, "clients_suspect"), 0);
    assert_true(live_stat(f, "master_stalls") >= 1);
    assert_true(node_state_is(f, f->c.seg[0], "live"));
    printf("master stopped %llu ms: no peer suspected, every object intact\n",
           (unsigned long long)(now_ms() - t0));
    for (int i = 0; i < NOBJ; i++)
        free(src[i]);
}

static int start_client(fx *f, ft_peer *p)
{
    const char *args[] = { "--lease-client", f->c.addr, NULL };
    char line[128];
    if (ft_spawn(p, NULL, args) != 0 || ft_read_line(p, line, sizeof line, 30000) != 0 ||
        strcmp(line, "READY") != 0)
        return -1;
    return 0;
}

static size_t pop_all(fx *f, ferry_qrecord *rec, size_t cap)
{
    size_t n = 0;
    assert_int_equal(ferry_queue_pop(f->s, "q", (uint32_t)cap, 60000, rec, &n, NULL), 0);
    return n;
}

static void test_client_stopped_then_killed(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 6; i++)
        assert_int_equal(ferry_queue_push(f->s, "q", "rec", 3, NULL, NULL), 0);
    ft_peer cl = { .pid = -1 };
    assert_int_equal(start_client(f, &cl), 0);
    char reply[256];
    assert_int_equal(ft_peer_cmd(&cl, reply, sizeof reply, 30000, "pop"), 0);
    assert_non_null(strstr(reply, " 3 "));
    assert_int_equal(ft_peer_cmd(&cl, reply, sizeof reply, 30000, "start half"), 0);

    ft_peer_signal(&cl, SIGSTOP);
    uint64_t t0 = now_ms();
    while (now_ms() - t0 < 60000 && top_stat(f, "clients_suspect") == 0)
        nap(20);
    assert_int_equal(top_stat(f, "clients_suspect"), 1);
    while (now_ms() - t0 < 3 * HB_MS)
        nap(50);
    /* What it holds is kept: its 3 records stay leased, its put pending. */
    ferry_qrecord rec[16];
    size_t n = pop_all(f, rec, 16);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ferry_queue_nack(f->s, rec[i].id, rec[i].token, NULL), 0);
    ferry_qrecords_free(rec, n);
    uint8_t b[16] = { 0 };
    assert_int_equal(ferry_store_put(f->s, "half", b, sizeof b, NULL, NULL, NULL), FERRY_EEXIST);
    assert_int_equal(live_stat(f, "clients_released"), 0);

    ft_peer_signal(&cl, SIGCONT);
    assert_int_equal(ft_peer_cmd(&cl, reply, sizeof reply, 30000, "ack"), 0);   /* no ESTALE */
    uint64_t t1 = now_ms();
    while (now_ms() - t1 < 60000 && top_stat(f, "clients_suspect") != 0)
        nap(20);
    assert_int_equal(top_stat(f, "clients_suspect"), 0);
    printf("client stopped %llu ms: its leases and pending put kept, acks accepted\n",
           (unsigned long long)(t1 - t0));

    /* Killed while holding the other 3 records and another pending put:
     * returned and revoked after the grace period, not in ten minutes. */
    assert_int_equal(ft_peer_cmd(&cl, reply, sizeof reply, 30000, "pop"), 0);
    assert_non_null(strstr(reply, " 3 "));
    assert_int_equal(ft_peer_cmd(&cl, reply, sizeof reply, 30000, "start half2"), 0);
    ft_proc_kill(&cl, SIGKILL);
    uint64_t t2 = now_ms();
    n = 0;
    while (now_ms() - t2 < 60000 && (n = pop_all(f, rec, 16)) == 0)
        nap(20);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(rec[i].token, 3);   /* pushed, popped, nacked, popped: delivery 3 */
    ferry_qrecords_free(rec, n);
    int rc = ferry_store_put(f->s, "half2", b, sizeof b, NULL, NULL, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(live_stat(f, "clients_released"), 1);
    printf("client killed: 3 records delivered again and its put revoked after %llu ms "
           "(leases were for %d ms)\n", (unsigned long long)(now_ms() - t2), LONG_LEASE_MS);
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "--lease-client") == 0)
        return lease_client(argv[2]);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_node_stopped_then_killed, setup2, teardown),
        cmocka_unit_test_setup_teardown(test_master_stopped, setup1, teardown),
        cmocka_unit_test_setup_teardown(test_client_stopped_then_killed, setup1, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
