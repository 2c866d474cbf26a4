/* Executors through real engines: sink and reader runs checked element by
 * element, and every review point of the reference PR on top of the
 * fault-injecting transport — guard rollback with a failing release,
 * duplicate guard ids, an interruption after one successful unregister,
 * I/O completed then a failure (FAILED_DRAINED), a source writing to a
 * subset of targets with an unrelated target's binding and guard absent,
 * one participant with two worker groups running one, invalid selectors,
 * stale bindings. Two engines in this process stand for the source and
 * target processes. */
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

#define ROWS 256
#define COLS 64
#define DST_PARTS_MAX 4

typedef struct world {
    ferry_engine *es, *et;             /* source side, target side */
    float *sbuf, *tbuf;                /* ferry_mem_alloc'd: whole tensor each */
    ferry_region *sreg, *treg;
    ferry_manifest *sm, *dm;
    ferry_plan *p;
    ferry_binding *bs, *bd;
    ferry_attested_plan *a;
    ferry_peer_map to_targets[DST_PARTS_MAX], to_sources[2];
    uint32_t dparts;
    bool by_rows;                      /* target split along rows (else columns) */
} world;

static float value(uint64_t r, uint64_t c)
{
    return (float)(r * 1000 + c + 1);   /* never 0: the targets start zeroed */
}

/* Source: 2 ranks of ROWS/2 rows. Target: dparts ranks, split by rows or
 * by columns. Each fragment is stored contiguously in its side's buffer. */
static void world_open(world *w, uint32_t dparts, bool by_rows, const char *fault_src,
                       const char *fault_dst)
{
    memset(w, 0, sizeof *w);
    w->dparts = dparts;
    w->by_rows = by_rows;
    ferry_engine_config c;
    ft_config(&c, "");
    snprintf(c.fault, sizeof c.fault, "%s", fault_src ? fault_src : "");
    assert_int_equal(ferry_engine_open(&c, &w->es, NULL), 0);
    ft_config(&c, "");
    snprintf(c.fault, sizeof c.fault, "%s", fault_dst ? fault_dst : "");
    assert_int_equal(ferry_engine_open(&c, &w->et, NULL), 0);
    size_t bytes = ROWS * COLS * sizeof(float);
    void *m;
    assert_int_equal(ferry_mem_alloc(w->es, bytes, &m, NULL), 0);
    w->sbuf = m;
    assert_int_equal(ferry_mem_alloc(w->et, bytes, &m, NULL), 0);
    w->tbuf = m;
    memset(w->tbuf, 0, bytes);
    assert_int_equal(ferry_region_register(w->es, w->sbuf, bytes, FERRY_REMOTE_RW, FERRY_MEM_HOST,
                                           &w->sreg, NULL), 0);
    assert_int_equal(ferry_region_register(w->et, w->tbuf, bytes, FERRY_REMOTE_RW, FERRY_MEM_HOST,
                                           &w->treg, NULL), 0);
    for (uint64_t r = 0; r < ROWS / 2; r++)      /* fragment k holds rows k*128.. */
        for (uint64_t k = 0; k < 2; k++)
            for (uint64_t cc = 0; cc < COLS; cc++)
                w->sbuf[k * (ROWS / 2) * COLS + r * COLS + cc] = value(k * (ROWS / 2) + r, cc);

    ferry_tensor_desc t = {.name = "w", .dtype = "f32", .itemsize = 4, .ndim = 2,
                           .shape = {ROWS, COLS}};
    assert_int_equal(ferry_manifest_create(2, NULL, 8, &w->sm), 0);
    assert_int_equal(ferry_manifest_create(dparts, NULL, 8, &w->dm), 0);
    assert_int_equal(ferry_manifest_add_tensor(w->sm, &t, NULL), 0);
    assert_int_equal(ferry_manifest_add_tensor(w->dm, &t, NULL), 0);
    ferry_split s = {.tensor = 0, .whole = true, .parts = {2, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(w->sm, &s, NULL), 0);
    ferry_split d = {.tensor = 0, .whole = true};
    if (by_rows) {
        d.parts[0] = dparts; d.parts[1] = 1; d.rank_stride[0] = 1;
    } else {
        d.parts[0] = 1; d.parts[1] = dparts; d.rank_stride[1] = 1;
    }
    assert_int_equal(ferry_manifest_add_split(w->dm, &d, NULL), 0);
    assert_int_equal(ferry_plan_create(w->sm, w->dm, NULL, &w->p, NULL), 0);

    /* Peer maps both ways: each side imports the other's region. */
    uint8_t desc[FERRY_DESC_MAX];
    ferry_remote_region rr;
    int n = ferry_region_export(w->treg, desc, sizeof desc);
    assert_true(n > 0);
    assert_int_equal(ferry_region_import(w->es, desc, (size_t)n, &rr, NULL), 0);
    for (uint32_t k = 0; k < dparts; k++)
        w->to_targets[k] = (ferry_peer_map){.worker = 10 + k, .peer = rr.peer, .key = rr.key};
    n = ferry_region_export(w->sreg, desc, sizeof desc);
    assert_int_equal(ferry_region_import(w->et, desc, (size_t)n, &rr, NULL), 0);
    for (uint32_t k = 0; k < 2; k++)
        w->to_sources[k] = (ferry_peer_map){.worker = k, .peer = rr.peer, .key = rr.key};
}

static ferry_binding *bind(world *w, bool src, uint64_t gen, const uint64_t *frags, size_t n)
{
    ferry_binding *b = NULL;
    assert_int_equal(ferry_binding_create(src ? w->sm : w->dm, 7, gen, 1, &b, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        uint64_t f = frags[i];
        ferry_binding_entry e = {.fragment = f, .itemsize = 4, .ndim = 2, .kind = FERRY_MEM_HOST};
        if (src) {
            e.shape[0] = ROWS / 2; e.shape[1] = COLS;
            e.worker = (uint32_t)f;
        } else {
            e.shape[0] = w->by_rows ? ROWS / w->dparts : ROWS;
            e.shape[1] = w->by_rows ? COLS : COLS / w->dparts;
            e.worker = 10 + (uint32_t)f;
        }
        e.strides[0] = e.shape[1];
        e.strides[1] = 1;
        e.nbytes = e.shape[0] * e.shape[1] * 4;
        e.addr = (uint64_t)(uintptr_t)((src ? w->sbuf : w->tbuf) + f * e.shape[0] * e.shape[1]);
        assert_int_equal(ferry_binding_add(b, &e, NULL), 0);
    }
    return b;
}

static void world_bind(world *w, uint64_t gen, size_t ndst)
{
    const uint64_t sf[] = {0, 1}, df[] = {0, 1, 2, 3};
    w->bs = bind(w, true, gen, sf, 2);
    w->bd = bind(w, false, gen, df, ndst);
    assert_int_equal(ferry_attest(w->p, w->bs, w->bd, gen, &w->a, NULL), 0);
}

static void world_close(world *w)
{
    ferry_attested_free(w->a);
    ferry_binding_free(w->bs);
    ferry_binding_free(w->bd);
    ferry_plan_free(w->p);
    ferry_manifest_close(w->sm);
    ferry_manifest_close(w->dm);
    ferry_engine_close(w->es);
    ferry_engine_close(w->et);
}

/* Target fragment k, element (r, c) in fragment coordinates, against the
 * global value. Returns the number of elements that are right. */
static uint64_t check_target(const world *w, uint32_t k)
{
    uint64_t fr = w->by_rows ? ROWS / w->dparts : ROWS, fc = w->by_rows ? COLS : COLS / w->dparts;
    const float *base = w->tbuf + k * fr * fc;
    uint64_t ok = 0;
    for (uint64_t r = 0; r < fr; r++)
        for (uint64_t c = 0; c < fc; c++) {
            uint64_t gr = w->by_rows ? k * fr + r : r, gc = w->by_rows ? c : k * fc + c;
            ok += base[r * fc + c] == value(gr, gc);
        }
    return ok;
}

static ferry_exec_config sink_cfg(world *w, const uint32_t *workers, size_t n)
{
    return (ferry_exec_config){.mode = FERRY_EXEC_SINK, .engine = w->es, .workers = workers,
                               .nworkers = n, .peers = w->to_targets, .npeers = w->dparts,
                               .window = 4, .timeout_ms = 20000};
}

/* ---- plain runs ---------------------------------------------------------------------- */

static void test_sink_and_reader(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        world w;
        world_open(&w, 2, false, NULL, NULL);
        world_bind(&w, 3, 2);
        const uint32_t sw[] = {0, 1}, tw[] = {10, 11};
        ferry_exec_config c = sink_cfg(&w, sw, 2);
        c.notify_tag = 77;
        if (mode == 1) {
            c = (ferry_exec_config){.mode = FERRY_EXEC_READER, .engine = w.et, .workers = tw,
                                    .nworkers = 2, .peers = w.to_sources, .npeers = 2,
                                    .window = 4, .timeout_ms = 20000};
        }
        /* many batches, several in flight: the target cuts columns, so
         * each (source, target) region is one strided op of 128 rows of
         * 128 bytes, split into batches of 16 rows */
        c.limits.max_ops = 16;
        c.limits.max_bytes = 2048;
        ferry_executor *x;
        ferry_exec_result res;
        ferry_error err = {0};
        assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
        assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), 0);
        assert_int_equal(res.state, FERRY_TICKET_COMPLETED);
        assert_int_equal(res.bytes, ROWS * COLS * 4);
        assert_int_equal(res.bytes_done, res.bytes);
        assert_true(res.batches > 4);
        assert_true(res.ops < ROWS);   /* rows merged into strided ops, not one op per row */
        assert_int_equal(ferry_executor_registered(x), 0);
        for (uint32_t k = 0; k < 2; k++)
            assert_int_equal(check_target(&w, k), ROWS * COLS / 2);
        if (mode == 0) {
            /* The passive target learns from the plan who will notify it. */
            uint32_t cp[4];
            size_t ncp = 0;
            assert_int_equal(ferry_exec_counterparts(w.a, w.bs, w.bd, true, tw, 2, cp, 4, &ncp,
                                                     NULL), 0);
            assert_int_equal(ncp, 2);
            assert_int_equal(cp[0], 0);
            assert_int_equal(cp[1], 1);
            uint64_t v = 0;
            /* one engine on the source side: one notification */
            assert_int_equal(ferry_wait_notify(w.et, 77, 1, 5000, &v, NULL), 0);
            assert_int_equal(v, 3);
        }
        ferry_exec_result_free(&res);
        ferry_executor_free(x);
        world_close(&w);
    }
}

/* ---- guards ---------------------------------------------------------------------------- */

static void test_guard_rollback(void **state)
{
    (void)state;
    world w;
    world_open(&w, 2, false, NULL, NULL);
    world_bind(&w, 1, 2);
    ft_guards gs = {.fail_acquire = 4, .fail_release = 2};
    ferry_guard g[4];
    ft_guards_make(&gs, g, 4);
    const uint32_t sw[] = {0, 1};
    ferry_exec_config c = sink_cfg(&w, sw, 2);
    c.guards = g;
    c.nguards = 4;
    ferry_executor *x;
    ferry_exec_result res;
    ferry_error err = {0};
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), FERRY_EBUSY);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    assert_non_null(strstr(err.msg, "guard 4"));
    /* 1..3 acquired; each released once even though 2's release failed. */
    for (int i = 1; i <= 3; i++) {
        assert_int_equal(gs.acquired[i], 1);
        assert_int_equal(gs.released[i], 1);
    }
    assert_int_equal(gs.released[4], 0);
    assert_int_equal(res.nquarantined, 1);
    assert_int_equal(res.quarantined[0], 2);
    assert_int_equal(check_target(&w, 0), 0);   /* no byte moved */
    assert_int_equal(ferry_executor_registered(x), 0);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);

    /* Duplicate ids: refused before anything is acquired. */
    memset(&gs, 0, sizeof gs);
    gs.fail_acquire = gs.fail_release = -1;
    g[3].id = 2;
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), FERRY_EEXIST);
    for (int i = 0; i < 8; i++)
        assert_int_equal(gs.acquired[i], 0);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);

    /* A good run releases every guard exactly once, after the transfer. */
    g[3].id = 4;
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), 0);
    for (int i = 1; i <= 4; i++)
        assert_int_equal(gs.released[i], 1);
    assert_int_equal(res.nquarantined, 0);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    world_close(&w);
}

/* ---- interruptions --------------------------------------------------------------------- */

static void test_unknown_then_cleanup(void **state)
{
    (void)state;
    world w;
    world_open(&w, 2, true, "delay_ms=1500", NULL);
    world_bind(&w, 1, 2);
    ft_guards gs = {.fail_acquire = -1, .fail_release = -1};
    ferry_guard g;
    ft_guards_make(&gs, &g, 1);
    const uint32_t sw[] = {0, 1};
    ferry_exec_config c = sink_cfg(&w, sw, 2);
    c.window = 1;             /* batch 0 (worker 0's fragment) only */
    c.timeout_ms = 100;
    c.limits.max_bytes = ROWS * COLS * 2;   /* one batch per source fragment */
    c.guards = &g;
    c.nguards = 1;
    ferry_executor *x;
    ferry_exec_result res;
    ferry_error err = {0};
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), FERRY_ETIMEDOUT);
    assert_int_equal(res.state, FERRY_TICKET_UNKNOWN);
    assert_int_equal(res.npending, 1);
    ferry_pending_info pi[4];
    assert_int_equal(ferry_engine_pending(w.es, pi, 4), 1);
    assert_int_equal(pi[0].id, res.pending[0]);
    /* Its guard stays held; one local region stays pinned, the other was
     * unregistered (and checkpointed). */
    assert_int_equal(gs.released[1], 0);
    assert_int_equal(res.nquarantined, 1);
    assert_true(ferry_executor_restart_required(x));
    assert_int_equal(ferry_executor_registered(x), 1);
    ferry_exec_result res2;
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res2, &err), FERRY_ESTATE);
    ferry_exec_result_free(&res2);
    /* Once it drains, cleanup unregisters only what is left. */
    size_t regions = ferry_engine_region_count(w.es);
    struct timespec ts = {0, 20 * 1000 * 1000};
    int rc = FERRY_EBUSY;
    for (int i = 0; i < 500 && rc == FERRY_EBUSY; i++) {
        rc = ferry_executor_cleanup(x);
        if (rc == FERRY_EBUSY)
            nanosleep(&ts, NULL);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(ferry_engine_region_count(w.es), regions - 1);
    assert_false(ferry_executor_restart_required(x));
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    world_close(&w);
}

static void test_io_then_failure_is_drained(void **state)
{
    (void)state;
    world w;
    world_open(&w, 2, false, "post_fail_after=1", NULL);
    world_bind(&w, 1, 2);
    const uint32_t sw[] = {0, 1};
    ferry_exec_config c = sink_cfg(&w, sw, 2);
    c.window = 1;
    c.limits.max_ops = 1;
    ferry_executor *x;
    ferry_exec_result res;
    ferry_error err = {0};
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_true(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err) < 0);
    assert_int_equal(res.state, FERRY_TICKET_FAILED_DRAINED);
    assert_true(res.bytes_done > 0 && res.bytes_done < res.bytes);
    /* the message carries the engine's: which op of the failed batch, to which peer */
    assert_non_null(strstr(err.msg, "executor: FAILED_DRAINED after "));
    assert_non_null(strstr(err.msg, ": op 0 (WRITE of "));
    assert_non_null(strstr(err.msg, "input/output error; the ticket ended ABORTED"));
    assert_int_equal(ferry_executor_registered(x), 0);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    world_close(&w);

    /* A failure before any byte moved stays ABORTED. */
    world_open(&w, 2, false, "post_fail_after=0", NULL);
    world_bind(&w, 1, 2);
    c = sink_cfg(&w, sw, 2);
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_true(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err) < 0);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    assert_int_equal(res.bytes_done, 0);
    assert_int_equal(check_target(&w, 0), 0);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    world_close(&w);
}

/* ---- scoping ------------------------------------------------------------------------------ */

static void test_scoping(void **state)
{
    (void)state;
    /* Targets split by rows over 4: source worker 0 (rows 0..127) writes
     * only targets 0 and 1. Targets 2 and 3 have no binding, no peer map
     * entry and no guard here, and are not needed. */
    world w;
    world_open(&w, 4, true, NULL, NULL);
    world_bind(&w, 1, 2);
    const uint32_t sw0[] = {0};
    ferry_exec_config c = sink_cfg(&w, sw0, 1);
    c.npeers = 2;
    ferry_executor *x;
    ferry_exec_result res;
    ferry_error err = {0};
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), 0);
    assert_int_equal(res.bytes, ROWS * COLS * 2);
    assert_int_equal(check_target(&w, 0), ROWS / 4 * COLS);
    assert_int_equal(check_target(&w, 1), ROWS / 4 * COLS);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    /* Worker 1 of the same participant needs targets 2 and 3: absent. */
    const uint32_t sw1[] = {1};
    c = sink_cfg(&w, sw1, 1);
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), FERRY_ENOENT);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    assert_non_null(strstr(err.msg, "no binding entry"));
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    world_close(&w);

    /* Two worker groups in one process, the run uses one: only its memory
     * is registered and only its bytes move. */
    world_open(&w, 2, false, NULL, NULL);
    world_bind(&w, 1, 2);
    size_t before = ferry_engine_region_count(w.es);
    c = sink_cfg(&w, sw1, 1);
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), 0);
    assert_int_equal(res.bytes, ROWS * COLS * 2);
    assert_int_equal(ferry_engine_region_count(w.es), before);
    assert_int_equal(check_target(&w, 0), ROWS / 2 * COLS / 2);   /* rows of worker 1 only */
    ferry_exec_result_free(&res);
    ferry_executor_free(x);

    /* Selectors: empty, or naming no planned worker, never succeed empty. */
    const uint32_t none[] = {42};
    c = sink_cfg(&w, sw0, 0);
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), FERRY_EINVAL);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    c = sink_cfg(&w, none, 1);
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, w.bd, &res, &err), FERRY_ENOENT);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    world_close(&w);
}

static void test_stale_binding(void **state)
{
    (void)state;
    world w;
    world_open(&w, 2, false, NULL, NULL);
    world_bind(&w, 5, 2);
    /* The target re-registered its memory: a new binding at generation 6. */
    const uint64_t df[] = {0, 1};
    ferry_binding *fresh = bind(&w, false, 6, df, 2);
    const uint32_t sw[] = {0, 1};
    ferry_exec_config c = sink_cfg(&w, sw, 2);
    ferry_executor *x;
    ferry_exec_result res;
    ferry_error err = {0};
    assert_int_equal(ferry_executor_create(&c, &x, &err), 0);
    assert_int_equal(ferry_executor_run(x, w.a, w.bs, fresh, &res, &err), FERRY_ESTALE);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    assert_int_equal(check_target(&w, 0), 0);
    assert_int_equal(check_target(&w, 1), 0);
    ferry_exec_result_free(&res);
    ferry_executor_free(x);
    ferry_binding_free(fresh);
    world_close(&w);
}

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sink_and_reader),
        cmocka_unit_test(test_guard_rollback),
        cmocka_unit_test(test_unknown_then_cleanup),
        cmocka_unit_test(test_io_then_failure_is_drained),
        cmocka_unit_test(test_scoping),
        cmocka_unit_test(test_stale_binding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
