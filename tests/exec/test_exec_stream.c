/* Push streams through real engines (two in this process stand for a
 * pushing worker and its target): batches waited for in any order and
 * tested without blocking, NOTIFYs after WRITEs, close waiting for what is
 * still in flight, a refused submit, I/O then a failure (FAILED_DRAINED),
 * an expired wait (UNKNOWN: pending id reported, guards quarantined),
 * guard rollback at open, and ids that are not in flight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ferry/ferry.h"
#include "util/ftguard.h"
#include "util/testutil.h"

#define BYTES (1u << 20)
#define PIECES 8
#define TAG 77

typedef struct pair {
    ferry_engine *es, *et;
    uint8_t *sbuf, *tbuf;
    ferry_region *sreg, *treg;
    ferry_remote_region rr;    /* the target's region, seen from the source */
} pair;

static void pair_open(pair *p, const char *fault_src)
{
    memset(p, 0, sizeof *p);
    ferry_engine_config c;
    ft_config(&c, "");
    snprintf(c.fault, sizeof c.fault, "%s", fault_src ? fault_src : "");
    assert_int_equal(ferry_engine_open(&c, &p->es, NULL), 0);
    ft_config(&c, "");
    assert_int_equal(ferry_engine_open(&c, &p->et, NULL), 0);
    void *m;
    assert_int_equal(ferry_mem_alloc(p->es, BYTES, &m, NULL), 0);
    p->sbuf = m;
    assert_int_equal(ferry_mem_alloc(p->et, BYTES, &m, NULL), 0);
    p->tbuf = m;
    for (size_t i = 0; i < BYTES; i++)
        p->sbuf[i] = (uint8_t)(i * 7 + 1);
    memset(p->tbuf, 0, BYTES);
    assert_int_equal(ferry_region_register(p->es, p->sbuf, BYTES, 0, FERRY_MEM_HOST, &p->sreg, NULL), 0);
    assert_int_equal(ferry_region_register(p->et, p->tbuf, BYTES, FERRY_REMOTE_RW, FERRY_MEM_HOST,
                                           &p->treg, NULL), 0);
    uint8_t desc[FERRY_DESC_MAX];
    int n = ferry_region_export(p->treg, desc, sizeof desc);
    assert_true(n > 0);
    assert_int_equal(ferry_region_import(p->es, desc, (size_t)n, &p->rr, NULL), 0);
}

static void pair_close(pair *p)
{
    /* an UNKNOWN batch keeps its region pinned until it drains */
    int rc = FERRY_EBUSY;
    struct timespec ts = {0, 20 * 1000 * 1000};
    for (int i = 0; i < 500 && rc == FERRY_EBUSY; i++)
        if ((rc = ferry_region_unregister(p->sreg, NULL)) == FERRY_EBUSY)
            nanosleep(&ts, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(ferry_region_unregister(p->treg, NULL), 0);
    ferry_mem_free(p->es, p->sbuf, NULL);
    ferry_mem_free(p->et, p->tbuf, NULL);
    ferry_engine_close(p->es);
    ferry_engine_close(p->et);
}

/* Piece k of the buffer as a WRITE, and a NOTIFY(TAG, k) after it. */
static void piece_ops(const pair *p, uint32_t k, ferry_op ops[2])
{
    uint64_t at = (uint64_t)k * (BYTES / PIECES);
    ops[0] = (ferry_op){ .opcode = FERRY_OP_WRITE, .local = p->sbuf + at, .len = BYTES / PIECES,
                         .peer = p->rr.peer, .remote_addr = p->rr.addr + at, .key = p->rr.key };
    ops[1] = (ferry_op){ .opcode = FERRY_OP_NOTIFY, .peer = p->rr.peer, .tag = TAG, .value = k };
}

/* A pair (fault on the source engine) and a stream on its source with n
 * guards (ids 1..n) over gs. */
static ferry_exec_stream *stream_on(pair *p, const char *fault, ft_guards *gs, ferry_guard *g,
                                    size_t n, int timeout_ms)
{
    pair_open(p, fault);
    *gs = (ft_guards){ .fail_acquire = -1, .fail_release = -1 };
    ft_guards_make(gs, g, n);
    ferry_stream_config sc = { .engine = p->es, .timeout_ms = timeout_ms, .guards = g,
                               .nguards = n };
    ferry_exec_stream *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_exec_stream_open(&sc, &s, NULL, &err), 0);
    assert_non_null(s);
    return s;
}

static void test_writes_in_any_order(void **state)
{
    (void)state;
    pair p;
    ft_guards gs;
    ferry_guard g[2];
    ferry_exec_stream *s = stream_on(&p, NULL, &gs, g, 2, 0);
    assert_int_equal(gs.acquired[1] + gs.acquired[2], 2);
    uint64_t id[PIECES];
    for (uint32_t k = 0; k < PIECES; k++) {
        ferry_op ops[2];
        piece_ops(&p, k, ops);
        assert_int_equal(ferry_exec_stream_submit(s, ops, 2, &id[k]), 0);
        assert_true(id[k] >= 1);
    }
    assert_int_equal(ferry_exec_stream_inflight(s), PIECES);
    int e = -1;
    /* the last first, blocking; then the first by testing until it is done */
    assert_int_equal(ferry_exec_stream_wait(s, id[PIECES - 1], true, &e), FERRY_TICKET_COMPLETED);
    assert_int_equal(e, 0);
    int st;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((st = ferry_exec_stream_wait(s, id[0], false, &e)) == FERRY_TICKET_PENDING) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        assert_true(now.tv_sec - t0.tv_sec < 60);   /* a deadline, not a pace */
    }
    assert_int_equal(st, FERRY_TICKET_COMPLETED);
    /* a settled id is not in flight any more */
    assert_int_equal(ferry_exec_stream_wait(s, id[0], true, &e), FERRY_EINVAL);
    assert_int_equal(ferry_exec_stream_wait(s, 0, true, &e), FERRY_EINVAL);
    assert_int_equal(ferry_exec_stream_wait(s, 1000, false, &e), FERRY_EINVAL);
    assert_int_equal(ferry_exec_stream_inflight(s), PIECES - 2);
    /* a new batch reuses a freed id */
    ferry_op ops[2];
    piece_ops(&p, 3, ops);
    uint64_t again = 0;
    assert_int_equal(ferry_exec_stream_submit(s, ops, 2, &again), 0);
    assert_true(again == id[0] || again == id[PIECES - 1]);
    /* close waits for the other six and the new one */
    ferry_exec_result res;
    assert_int_equal(ferry_exec_stream_close(s, &res), 0);
    assert_int_equal(res.state, FERRY_TICKET_COMPLETED);
    assert_int_equal(res.error, 0);
    assert_int_equal(res.batches, PIECES + 1);
    assert_int_equal(res.ops, 2 * (PIECES + 1));
    assert_int_equal(res.bytes, BYTES + BYTES / PIECES);
    assert_int_equal(res.bytes_done, res.bytes);
    assert_int_equal(res.npending, 0);
    assert_int_equal(res.nquarantined, 0);
    assert_int_equal(gs.released[1] + gs.released[2], 2);
    ferry_exec_result_free(&res);
    /* every byte landed, and every piece's NOTIFY after it */
    assert_memory_equal(p.tbuf, p.sbuf, BYTES);
    uint64_t v[PIECES + 1];
    assert_int_equal(ferry_wait_notify(p.et, TAG, PIECES + 1, 10000, v, NULL), 0);
    pair_close(&p);
}

static void test_close_waits_for_inflight(void **state)
{
    (void)state;
    pair p;
    ft_guards gs;
    ferry_guard g[1];
    ferry_exec_stream *s = stream_on(&p, "delay_ms=200", &gs, g, 0, 0);
    for (uint32_t k = 0; k < PIECES; k++) {
        ferry_op ops[2];
        piece_ops(&p, k, ops);
        uint64_t id;
        assert_int_equal(ferry_exec_stream_submit(s, ops, 2, &id), 0);
    }
    ferry_exec_result res;
    assert_int_equal(ferry_exec_stream_close(s, &res), 0);   /* none was waited for */
    assert_int_equal(res.state, FERRY_TICKET_COMPLETED);
    assert_int_equal(res.bytes_done, BYTES);
    ferry_exec_result_free(&res);
    assert_memory_equal(p.tbuf, p.sbuf, BYTES);
    pair_close(&p);
}

static void test_refused_submit(void **state)
{
    (void)state;
    pair p;
    ft_guards gs;
    ferry_guard g[1];
    ferry_exec_stream *s = stream_on(&p, NULL, &gs, g, 1, 0);
    uint8_t stray[64] = {0};   /* not registered: the engine refuses the batch */
    ferry_op op = { .opcode = FERRY_OP_WRITE, .local = stray, .len = sizeof stray,
                    .peer = p.rr.peer, .remote_addr = p.rr.addr, .key = p.rr.key };
    uint64_t id = 99;
    int rc = ferry_exec_stream_submit(s, &op, 1, &id);
    assert_true(rc < 0);
    assert_int_equal(id, 0);
    assert_int_equal(ferry_exec_stream_inflight(s), 0);
    assert_int_equal(ferry_exec_stream_error(s, NULL), rc);
    ferry_exec_result res;
    assert_int_equal(ferry_exec_stream_close(s, &res), rc);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);   /* no byte moved */
    assert_int_equal(res.batches, 0);
    assert_int_equal(gs.released[1], 1);                 /* nothing in flight: released */
    assert_int_equal(res.nquarantined, 0);
    ferry_exec_result_free(&res);
    for (size_t i = 0; i < BYTES; i++)
        if (p.tbuf[i])
            fail_msg("byte %zu of the target was written", i);
    pair_close(&p);
}

static void test_io_then_failure_is_drained(void **state)
{
    (void)state;
    pair p;
    ft_guards gs;
    ferry_guard g[1];
    /* the first post goes, later ones fail */
    ferry_exec_stream *s = stream_on(&p, "post_fail_after=1", &gs, g, 0, 0);
    ferry_op op = { .opcode = FERRY_OP_WRITE, .local = p.sbuf, .len = 4096, .peer = p.rr.peer,
                    .remote_addr = p.rr.addr, .key = p.rr.key };
    uint64_t id = 0;
    int e = -1;
    assert_int_equal(ferry_exec_stream_submit(s, &op, 1, &id), 0);
    assert_int_equal(ferry_exec_stream_wait(s, id, true, &e), FERRY_TICKET_COMPLETED);
    assert_int_equal(e, 0);
    op.local = p.sbuf + 4096;
    op.remote_addr = p.rr.addr + 4096;
    int rc = ferry_exec_stream_submit(s, &op, 1, &id);
    if (rc == 0) {   /* the engine took the batch and failed it untouched */
        assert_int_equal(ferry_exec_stream_wait(s, id, true, &e), FERRY_TICKET_ABORTED);
        assert_true(e < 0);
    }
    ferry_error se = {0};
    assert_true(ferry_exec_stream_error(s, &se) < 0);
    assert_non_null(strstr(se.msg, "op 0"));   /* the failed op named, not only a code */
    ferry_exec_result res;
    assert_true(ferry_exec_stream_close(s, &res) < 0);
    assert_int_equal(res.state, FERRY_TICKET_FAILED_DRAINED);   /* I/O began: never ABORTED */
    assert_int_equal(res.bytes_done, 4096);
    ferry_exec_result_free(&res);
    assert_memory_equal(p.tbuf, p.sbuf, 4096);
    pair_close(&p);
}

static void test_expired_wait_is_unknown(void **state)
{
    (void)state;
    pair p;
    ft_guards gs;
    ferry_guard g[2];
    /* no completion before 1.5 s: the 100 ms wait expires */
    ferry_exec_stream *s = stream_on(&p, "delay_ms=1500", &gs, g, 2, 100);
    ferry_op ops[2];
    piece_ops(&p, 0, ops);
    uint64_t id;
    assert_int_equal(ferry_exec_stream_submit(s, ops, 2, &id), 0);
    int e = 0;
    assert_int_equal(ferry_exec_stream_wait(s, id, false, &e), FERRY_TICKET_PENDING);
    assert_int_equal(ferry_exec_stream_wait(s, id, true, &e), FERRY_TICKET_UNKNOWN);
    assert_int_equal(e, FERRY_ETIMEDOUT);
    ferry_exec_result res;
    assert_int_equal(ferry_exec_stream_close(s, &res), FERRY_ETIMEDOUT);
    assert_int_equal(res.state, FERRY_TICKET_UNKNOWN);
    assert_int_equal(res.npending, 1);
    ferry_pending_info pi[4];
    assert_int_equal(ferry_engine_pending(p.es, pi, 4), 1);
    assert_int_equal(pi[0].id, res.pending[0]);
    /* its memory may still be read: no guard is released */
    assert_int_equal(gs.released[1] + gs.released[2], 0);
    assert_int_equal(res.nquarantined, 2);
    ferry_exec_result_free(&res);
    pair_close(&p);   /* waits for it to drain */
}

static void test_guard_rollback(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, NULL);
    ft_guards gs = {.fail_acquire = 3, .fail_release = 2};
    ferry_guard g[4];
    ft_guards_make(&gs, g, 4);
    ferry_stream_config sc = { .engine = p.es, .guards = g, .nguards = 4 };
    ferry_exec_stream *s = (ferry_exec_stream *)&gs;   /* overwritten: NULL on failure */
    ferry_exec_result res;
    ferry_error err = {0};
    assert_int_equal(ferry_exec_stream_open(&sc, &s, &res, &err), FERRY_EBUSY);
    assert_null(s);
    assert_non_null(strstr(err.msg, "guard 3"));
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    /* 1 and 2 were acquired and released (2's release failed: quarantined);
     * 3 failed, 4 was never tried */
    assert_int_equal(gs.released[1], 1);
    assert_int_equal(gs.released[2], 1);
    assert_int_equal(gs.acquired[4] + gs.released[3] + gs.released[4], 0);
    assert_int_equal(res.nquarantined, 1);
    assert_int_equal(res.quarantined[0], 2);
    ferry_exec_result_free(&res);
    /* bad arguments */
    assert_int_equal(ferry_exec_stream_open(NULL, &s, NULL, NULL), FERRY_EINVAL);
    assert_int_equal(ferry_exec_stream_close(NULL, &res), FERRY_EINVAL);
    ferry_exec_result_free(&res);
    pair_close(&p);
}

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writes_in_any_order),
        cmocka_unit_test(test_close_waits_for_inflight),
        cmocka_unit_test(test_refused_submit),
        cmocka_unit_test(test_io_then_failure_is_drained),
        cmocka_unit_test(test_expired_wait_is_unknown),
        cmocka_unit_test(test_guard_rollback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
