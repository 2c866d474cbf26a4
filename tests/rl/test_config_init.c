/* Every config struct's *_config_init() sets the documented defaults and
 * refuses NULL; a config the caller zeroed instead resolves, where the
 * library takes it, to exactly the init's values, and a field the caller
 * set is kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "exec/exec_int.h"
#include "ferry/ferry.h"
#include "ferry/weights_compat.h"
#include "rl/rl_int.h"
#include "sparse/sparse_int.h"

static void test_null_refused(void **state)
{
    (void)state;
    assert_int_equal(ferry_publisher_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_subscriber_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_sparse_update_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_delta_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_compat_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_sample_queue_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_exec_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_stream_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_store_exec_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_replicate_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_engine_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_store_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_master_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_node_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_sparse_reader_config_init(NULL), FERRY_EINVAL);
}

static void test_documented_defaults(void **state)
{
    (void)state;
    ferry_publisher_config pc;
    memset(&pc, 0xa5, sizeof pc);   /* init sets every field, garbage or not */
    assert_int_equal(ferry_publisher_config_init(&pc), 0);
    assert_int_equal(pc.keep, 2);
    assert_int_equal(pc.timeout_ms, FERRY_DEFAULT_TIMEOUT_MS);
    assert_string_equal(pc.model, "");
    assert_null(pc.rank_node);
    ferry_subscriber_config sc;
    memset(&sc, 0xa5, sizeof sc);
    assert_int_equal(ferry_subscriber_config_init(&sc), 0);
    assert_int_equal(sc.timeout_ms, FERRY_DEFAULT_TIMEOUT_MS);
    assert_int_equal(sc.batch_bytes, 64ull << 20);
    assert_int_equal(sc.world, 0);
    ferry_sparse_update_config uc;
    memset(&uc, 0xa5, sizeof uc);
    assert_int_equal(ferry_sparse_update_config_init(&uc), 0);
    assert_false(uc.no_dense);
    assert_int_equal(uc.axis_index, 0);
    ferry_delta_config dc;
    memset(&dc, 0xa5, sizeof dc);
    assert_int_equal(ferry_delta_config_init(&dc), 0);
    assert_true(dc.crossover == FERRY_DELTA_CROSSOVER);
    assert_int_equal(dc.max_chain, FERRY_DELTA_CHAIN);
    for (size_t i = 0; i < sizeof dc.reserved / sizeof dc.reserved[0]; i++)
        assert_int_equal(dc.reserved[i], 0);
    ferry_compat_config cc;
    memset(&cc, 0xa5, sizeof cc);
    assert_int_equal(ferry_compat_config_init(&cc), 0);
    assert_int_equal(cc.staging_bytes, 256ull << 20);
    assert_int_equal(cc.timeout_ms, FERRY_DEFAULT_TIMEOUT_MS);
    ferry_sample_queue_config qc;
    memset(&qc, 0xa5, sizeof qc);
    assert_int_equal(ferry_sample_queue_config_init(&qc), 0);
    assert_int_equal(qc.push_timeout_ms, FERRY_DEFAULT_TIMEOUT_MS);
    assert_int_equal(qc.lease_ms, 30000);
    assert_int_equal(qc.bound, 0);
    ferry_exec_config xc;
    memset(&xc, 0xa5, sizeof xc);
    assert_int_equal(ferry_exec_config_init(&xc), 0);
    assert_int_equal(xc.limits.max_ops, 4096);
    assert_int_equal(xc.limits.max_bytes, 64ull << 20);
    assert_int_equal(xc.window, 8);
    assert_int_equal(xc.timeout_ms, FERRY_DEFAULT_TIMEOUT_MS);
    assert_null(xc.engine);
    ferry_stream_config tc;
    memset(&tc, 0xa5, sizeof tc);
    assert_int_equal(ferry_stream_config_init(&tc), 0);
    assert_int_equal(tc.timeout_ms, FERRY_DEFAULT_TIMEOUT_MS);
    assert_int_equal(tc.nguards, 0);
    ferry_store_exec_config rc;
    memset(&rc, 0xa5, sizeof rc);
    assert_int_equal(ferry_store_exec_config_init(&rc), 0);
    assert_int_equal(rc.max_reads, 8192);
    assert_null(rc.store);
    ferry_replicate_config pl;
    memset(&pl, 0xa5, sizeof pl);
    assert_int_equal(ferry_replicate_config_init(&pl), 0);
    assert_int_equal(pl.replica_num, 1);
    assert_false(pl.hard_pin);
    assert_int_equal(pl.slot, 0);
    ferry_sparse_reader_config sp;
    memset(&sp, 0xa5, sizeof sp);
    assert_int_equal(ferry_sparse_reader_config_init(&sp), 0);
    assert_int_equal(sp.cache_entries, 64);
    assert_int_equal(sp.cache_bytes, 256ull << 20);
}

/* A zeroed config resolves to the init's values; what the caller set stays. */
static void test_zeroed_resolves_to_init(void **state)
{
    (void)state;
    ferry_publisher_config pz = {0}, pi;
    ferry_publisher_config_init(&pi);
    fr_rl_publisher_resolve(&pz);
    assert_memory_equal(&pz, &pi, sizeof pz);
    ferry_subscriber_config sz = {0}, si;
    ferry_subscriber_config_init(&si);
    fr_rl_subscriber_resolve(&sz);
    assert_memory_equal(&sz, &si, sizeof sz);
    ferry_compat_config cz = {0}, ci;
    ferry_compat_config_init(&ci);
    fr_rl_compat_resolve(&cz);
    assert_memory_equal(&cz, &ci, sizeof cz);
    ferry_sample_queue_config qz = {0}, qi;
    ferry_sample_queue_config_init(&qi);
    fr_rl_sample_queue_resolve(&qz);
    assert_memory_equal(&qz, &qi, sizeof qz);
    ferry_exec_config xz = {0}, xi;
    ferry_exec_config_init(&xi);
    fr_exec_config_resolve(&xz);
    assert_memory_equal(&xz, &xi, sizeof xz);
    ferry_stream_config tz = {0}, ti;
    ferry_stream_config_init(&ti);
    fr_stream_config_resolve(&tz);
    assert_memory_equal(&tz, &ti, sizeof tz);
    ferry_store_exec_config rz = {0}, ri;
    ferry_store_exec_config_init(&ri);
    fr_store_exec_config_resolve(&rz);
    assert_memory_equal(&rz, &ri, sizeof rz);
    ferry_sparse_reader_config spz = {0}, spi;
    ferry_sparse_reader_config_init(&spi);
    fr_sparse_reader_config_resolve(&spz);
    assert_memory_equal(&spz, &spi, sizeof spz);

    ferry_subscriber_config set = {0};
    set.timeout_ms = 1234;
    set.batch_bytes = 1;
    fr_rl_subscriber_resolve(&set);
    assert_int_equal(set.timeout_ms, 1234);
    assert_int_equal(set.batch_bytes, 1);
    ferry_exec_config xs = {0};
    xs.timeout_ms = -1;   /* forever: kept, not taken for "unset" */
    xs.window = 3;
    fr_exec_config_resolve(&xs);
    assert_int_equal(xs.timeout_ms, -1);
    assert_int_equal(xs.window, 3);
    assert_int_equal(xs.limits.max_ops, 4096);
}

/* A config whose reserved tail is not zero is refused, with nothing opened. */
static void test_reserved_refused(void **state)
{
    ferry_error fe = {0};
    (void)state;
    ferry_engine_config ec;
    assert_int_equal(ferry_engine_config_init(&ec), 0);
    ec.reserved[7] = 1;
    ferry_engine *e = NULL;
    ferry_log_set_level(FERRY_LOG_OFF);
    assert_int_equal(ferry_engine_open(&ec, &e, NULL), FERRY_EINVAL);
    assert_null(e);
    ferry_store_config sc;
    assert_int_equal(ferry_store_config_init(&sc), 0);
    snprintf(sc.master, sizeof sc.master, "127.0.0.1:1");
    sc.reserved[0] = 1;
    ferry_store *s = NULL;
    assert_int_equal(ferry_store_open(&sc, &s, &fe), FERRY_EINVAL);
    assert_null(s);
    assert_non_null(strstr(fe.msg, "reserved"));
    /* the master's and the node's opens say why, as the client's does */
    ferry_master_config mc;
    assert_int_equal(ferry_master_config_init(&mc), 0);
    mc.reserved[2] = 1;
    ferry_master *ma = NULL;
    assert_int_equal(ferry_master_open(&mc, &ma, &fe), FERRY_EINVAL);
    assert_null(ma);
    assert_non_null(strstr(fe.msg, "master config: its reserved fields must be zero"));
    ferry_node_config nc;
    assert_int_equal(ferry_node_config_init(&nc), 0);
    snprintf(nc.master, sizeof nc.master, "127.0.0.1:1");
    nc.segment_size = 100;
    ferry_node *no = NULL;
    assert_int_equal(ferry_node_open(&nc, &no, &fe), FERRY_EINVAL);
    assert_null(no);
    assert_non_null(strstr(fe.msg, "a segment of 100 bytes"));
    ferry_plan_options po = {0};
    po.reserved[3] = 9;
    ferry_plan *p = NULL;
    ferry_manifest *m = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_manifest_create(1, NULL, 1, &m), 0);
    assert_int_equal(ferry_plan_create(m, m, &po, &p, &err), FERRY_EINVAL);
    assert_null(p);
    assert_non_null(strstr(err.msg, "reserved"));
    ferry_manifest_close(m);
    /* the configs with an rl or exec entry: the same check, through the
     * resolve that every entry runs */
    ferry_exec_config xc;
    ferry_exec_config_init(&xc);
    xc.reserved[0] = 1;
    ferry_executor *x = NULL;
    memset(&err, 0, sizeof err);
    int fake;
    xc.engine = (ferry_engine *)&fake;   /* never used: the reserved check comes first */
    xc.workers = (const uint32_t[]){ 0 };
    xc.nworkers = 1;
    assert_int_equal(ferry_executor_create(&xc, &x, &err), FERRY_EINVAL);
    assert_null(x);
    assert_non_null(strstr(err.msg, "reserved"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_refused),
        cmocka_unit_test(test_documented_defaults),
        cmocka_unit_test(test_zeroed_resolves_to_init),
        cmocka_unit_test(test_reserved_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
