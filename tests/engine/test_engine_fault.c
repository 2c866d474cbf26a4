/* The fault-injecting transport: each injected fault must surface as the
 * right terminal state, with the engine's fences, pins and reconnects doing
 * what they do for real failures. Runs over shm and tcp, or, with
 * FERRY_TEST_TRANSPORT=ucx, over ucx (with the environment's UCX_TLS). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/testutil.h"

#define MiB (1024ull * 1024)

static const char *g_tp;

typedef struct fx {
    ferry_engine *e;
    ft_peer peer;
    ferry_remote_region rr;
    uint8_t *buf;
    ferry_region *lr;   /* over buf */
} fx;

static fx F;

static void setup_fault(const char *spec)
{
    memset(&F, 0, sizeof F);
    F.peer.pid = -1;
    ferry_engine_config c;
    ft_config(&c, g_tp);
    snprintf(c.fault, sizeof c.fault, "%s", spec);
    assert_int_equal(ferry_engine_open(&c, &F.e, NULL), 0);
    assert_int_equal(ft_peer_start(&F.peer, &(ft_peer_opts){.size = 16 * MiB}), 0);
    assert_int_equal(ferry_region_import(F.e, F.peer.desc, F.peer.desc_len, &F.rr, NULL), 0);
    assert_string_equal(ferry_peer_transport(F.e, F.rr.peer), g_tp);   /* the real one underneath */
    void *m;
    assert_int_equal(ferry_mem_alloc(F.e, 16 * MiB, &m, NULL), 0);
    assert_int_equal(ferry_region_register(F.e, m, 16 * MiB, 0, FERRY_MEM_HOST, &F.lr, NULL), 0);
    F.buf = m;
    ft_pattern(F.buf, 16 * MiB, 3, 0);
}

static int teardown(void **s)
{
    (void)s;
    ft_peer_stop(&F.peer);
    ferry_engine_close(F.e);
    memset(&F, 0, sizeof F);
    return 0;
}

static int run_write(uint64_t off, uint64_t len, int nops, int timeout_ms, ferry_ticket **keep)
{
    ferry_op ops[16];
    uint64_t per = len / (uint64_t)nops;
    for (int i = 0; i < nops; i++)
        ops[i] = (ferry_op){.opcode = FERRY_OP_WRITE, .local = F.buf + off + (uint64_t)i * per, .len = per,
                            .peer = F.rr.peer, .remote_addr = F.rr.addr + off + (uint64_t)i * per, .key = F.rr.key};
    ferry_ticket *t;
    int rc = ferry_submit(F.e, ops, (size_t)nops, 0, &t, NULL);
    if (rc < 0)
        return rc;
    int st = ferry_ticket_wait(t, timeout_ms);
    if (keep)
        *keep = t;
    else
        ferry_ticket_free(t);
    return st;
}

static void test_post_fails(void **s)
{
    (void)s;
    setup_fault("post_fail_after=1");
    assert_int_equal(run_write(0, 64 * 1024, 1, 30000, NULL), FERRY_TICKET_COMPLETED);
    uint64_t before = ft_peer_hash(&F.peer, MiB, MiB);
    ferry_ticket *t;
    assert_int_equal(run_write(MiB, MiB, 4, 30000, &t), FERRY_TICKET_ABORTED);   /* never left */
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_EIO);
    ferry_error err = {0};
    char peer[32];
    snprintf(peer, sizeof peer, "bytes to peer %u at 0x", F.rr.peer);
    assert_int_equal(ferry_ticket_error(t, &err), FERRY_EIO);
    ft_assert_says(&err, FERRY_EIO, "(WRITE of 262144 ", peer, "ended ABORTED: no destination byte touched");
    ferry_ticket_free(t);
    assert_true(ft_peer_hash(&F.peer, MiB, MiB) == before);
}

static void test_completion_turned_into_failure(void **s)
{
    (void)s;
    setup_fault("complete_fail_after=2");
    ferry_ticket *t;
    /* four ops: two complete, the next two moved their bytes but report failure */
    assert_int_equal(run_write(0, 4 * MiB, 4, 30000, &t), FERRY_TICKET_FAILED_DRAINED);
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_EIO);
    ferry_error err = {0};
    assert_int_equal(ferry_ticket_error(t, &err), FERRY_EIO);
    ft_assert_says(&err, FERRY_EIO, "(WRITE of 1048576 bytes", "input/output error", "ended FAILED_DRAINED");
    assert_int_equal(ferry_ticket_bytes(t), 2 * MiB);   /* only confirmed bytes count */
    ferry_ticket_free(t);
}

static void test_delay_gives_unknown_then_completes(void **s)
{
    (void)s;
    setup_fault("delay_ms=400");
    ferry_ticket *t;
    assert_int_equal(run_write(0, MiB, 1, 50, &t), FERRY_TICKET_UNKNOWN);
    assert_int_equal(ferry_engine_pending(F.e, NULL, 0), 1);
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = F.buf, .len = 64, .peer = F.rr.peer,
                  .remote_addr = F.rr.addr, .key = F.rr.key};
    ferry_ticket *t2 = NULL;
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t2, NULL), FERRY_EFENCED);
    /* what fences the peer and pins the buffer, by the ticket's id */
    ferry_error err = {0};
    char peer[32], ticket[40];
    snprintf(peer, sizeof peer, "op 0: peer %u is fenced", F.rr.peer);
    snprintf(ticket, sizeof ticket, "(ticket %llu)", (unsigned long long)ferry_ticket_id(t));
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t2, &err), FERRY_EFENCED);
    ft_assert_says(&err, FERRY_EFENCED, peer, ticket, "ferry_peer_reset");
    snprintf(ticket, sizeof ticket, "ticket %llu has an unknown outcome", (unsigned long long)ferry_ticket_id(t));
    assert_int_equal(ferry_region_unregister(F.lr, &err), FERRY_EBUSY);
    ft_assert_says(&err, FERRY_EBUSY, "are pinned: 1 ticket of this engine uses it", ticket, NULL);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);   /* drained: the fence lifts */
    ferry_ticket_free(t);
    assert_int_equal(ferry_engine_pending(F.e, NULL, 0), 0);
    assert_int_equal(run_write(0, 64 * 1024, 1, 30000, NULL), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&F.peer, 0, MiB) == ft_hash(F.buf, MiB));
}

static void test_dropped_connection(void **s)
{
    (void)s;
    setup_fault("drop_after=2");
    assert_int_equal(run_write(0, 2 * MiB, 2, 30000, NULL), FERRY_TICKET_COMPLETED);
    ferry_ticket *t;
    /* the third chunk posted drops the connection: what was in flight fails */
    int st = run_write(2 * MiB, 4 * MiB, 4, 30000, &t);
    assert_true(st == FERRY_TICKET_FAILED_DRAINED || st == FERRY_TICKET_ABORTED);
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_ECONNRESET);
    ferry_ticket_free(t);
    /* the next submit reconnects (the drop is one-shot) */
    assert_int_equal(run_write(8 * MiB, 2 * MiB, 2, 30000, NULL), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&F.peer, 8 * MiB, 2 * MiB) == ft_hash(F.buf + 8 * MiB, 2 * MiB));
}

/* Faults count chunks: a strided op is one chunk per group of rows, up to
 * the 2 MiB chunk size over shm and up to 512 rows (their row limit) over
 * tcp and ucx. */
static ferry_op strided_write(uint64_t off, uint64_t rows, uint64_t len, uint64_t rstride)
{
    return (ferry_op){.opcode = FERRY_OP_WRITE, .local = F.buf, .len = len, .peer = F.rr.peer,
                      .remote_addr = F.rr.addr + off, .key = F.rr.key, .count = rows,
                      .local_stride = len, .remote_stride = rstride};
}

static void test_strided_faults(void **s)
{
    (void)s;
    setup_fault("post_fail_after=1");
    ferry_op w = strided_write(0, 256, 1024, 2048);
    ferry_ticket *t;
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t);
    uint64_t before = ft_peer_hash(&F.peer, MiB, 2 * MiB);
    w = strided_write(MiB, 512, 1024, 2048);
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_ABORTED);   /* no row left */
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_EIO);
    assert_int_equal(ferry_ticket_bytes(t), 0);
    ferry_ticket_free(t);
    assert_true(ft_peer_hash(&F.peer, MiB, 2 * MiB) == before);
    teardown(NULL);

    setup_fault("complete_fail_after=1");
    w = strided_write(0, 4096, 1024, 2048);   /* 4 MiB of rows in 8 MiB */
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_FAILED_DRAINED);
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_EIO);
    /* only the first chunk's rows are confirmed: 2048 rows over shm, 512 over tcp */
    assert_int_equal(ferry_ticket_bytes(t), strcmp(g_tp, "shm") == 0 ? 2 * MiB : 512 * 1024);
    ferry_ticket_free(t);
}

static void test_bad_spec(void **s)
{
    (void)s;
    ferry_engine_config c;
    ft_config(&c, g_tp);
    ferry_engine *e = NULL;
    snprintf(c.fault, sizeof c.fault, "explode=1");
    assert_int_equal(ferry_engine_open(&c, &e, NULL), FERRY_EINVAL);
    snprintf(c.fault, sizeof c.fault, "delay_ms=");
    assert_int_equal(ferry_engine_open(&c, &e, NULL), FERRY_EINVAL);
    assert_null(e);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_teardown(test_post_fails, teardown),
    cmocka_unit_test_teardown(test_completion_turned_into_failure, teardown),
    cmocka_unit_test_teardown(test_delay_gives_unknown_then_completes, teardown),
    cmocka_unit_test_teardown(test_dropped_connection, teardown),
    cmocka_unit_test_teardown(test_strided_faults, teardown),
    cmocka_unit_test_teardown(test_bad_spec, teardown),
};

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    signal(SIGPIPE, SIG_IGN);
    int fails = 0;
    const char *only = getenv("FERRY_TEST_TRANSPORT");
    if (only && !strcmp(only, "ucx")) {
        g_tp = "ucx";
        setenv("FERRY_TRANSPORT", "ucx", 1);   /* the peers start their ucx transport too */
        return _cmocka_run_group_tests("fault/ucx", tests, sizeof tests / sizeof *tests, NULL, NULL);
    }
    g_tp = "shm";
    fails += _cmocka_run_group_tests("fault/shm", tests, sizeof tests / sizeof *tests, NULL, NULL);
    g_tp = "tcp";
    fails += _cmocka_run_group_tests("fault/tcp", tests, sizeof tests / sizeof *tests, NULL, NULL);
    return fails;
}
