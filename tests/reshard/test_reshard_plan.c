/* Planner behaviour: lowering to strided runs, coalescing within a store
 * object, replica choice, determinism, sweeps over thousands of fragments,
 * the plan cache, and presets planned end to end against a naive
 * all-pairs count. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/reshard.h"

static ferry_manifest *manifest_2d(uint32_t ranks, const uint32_t *nodes, uint64_t d0, uint64_t d1)
{
    ferry_manifest *m;
    assert_int_equal(ferry_manifest_create(ranks, nodes, 8, &m), 0);
    ferry_tensor_desc t = {.name = "w", .dtype = "f16", .itemsize = 2, .ndim = 2, .shape = {d0, d1}};
    assert_int_equal(ferry_manifest_add_tensor(m, &t, NULL), 0);
    return m;
}

static ferry_plan *plan(ferry_manifest *s, ferry_manifest *d)
{
    ferry_plan *p;
    ferry_error err = {0};
    if (ferry_plan_create(s, d, NULL, &p, &err) < 0)
        fail_msg("%s", err.msg);
    return p;
}

static size_t all_runs(const ferry_plan *p, const ferry_plan_filter *f, ferry_run *out, size_t cap)
{
    ferry_plan_iter *it;
    assert_int_equal(ferry_plan_iter_open(p, f, &it), 0);
    size_t n = 0;
    ferry_run r;
    while (ferry_plan_iter_next_run(it, &r) == 1) {
        if (n < cap)
            out[n] = r;
        n++;
    }
    ferry_plan_iter_close(it);
    return n;
}

static void test_lowering_strided(void **state)
{
    (void)state;
    /* Source: rows of 2 (FSDP); target: columns of 2 (TP row split). */
    ferry_manifest *s = manifest_2d(4, NULL, 8, 8), *d = manifest_2d(4, NULL, 8, 8);
    ferry_split sp = {.tensor = 0, .whole = true, .parts = {4, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(s, &sp, NULL), 0);
    sp = (ferry_split){.tensor = 0, .whole = true, .parts = {1, 4}, .rank_stride = {0, 1}};
    assert_int_equal(ferry_manifest_add_split(d, &sp, NULL), 0);
    ferry_plan *p = plan(s, d);
    ferry_run r[32];
    assert_int_equal(all_runs(p, NULL, r, 32), 16);
    /* target fragment 1 (columns 2..3) from source fragment 2 (rows 4..5) */
    bool found = false;
    for (int i = 0; i < 16; i++) {
        if (r[i].dst_fragment != 1 || r[i].src_fragment != 2)
            continue;
        found = true;
        assert_int_equal(r[i].len, 4);              /* 2 elements of 2 bytes */
        assert_int_equal(r[i].nouter, 1);
        assert_int_equal(r[i].count[0], 2);         /* 2 rows */
        assert_int_equal(r[i].src_offset, 2 * 2);   /* column 2 of a row of 8 */
        assert_int_equal(r[i].src_stride[0], 16);
        assert_int_equal(r[i].dst_offset, 4 * 4);   /* row 4 of a row of 2 */
        assert_int_equal(r[i].dst_stride[0], 4);
        assert_int_equal(r[i].bytes, 8);
        assert_int_equal(r[i].src_rank, 2);
        assert_int_equal(r[i].dst_rank, 1);
        assert_null(r[i].src_object);
    }
    assert_true(found);
    /* Regions carry the same geometry. */
    ferry_plan_iter *it;
    ferry_region g;
    assert_int_equal(ferry_plan_iter_open(p, NULL, &it), 0);
    assert_int_equal(ferry_plan_iter_next_region(it, &g), 1);
    assert_int_equal(ferry_plan_iter_next_run(it, &r[0]), FERRY_ESTATE);   /* one kind per iterator */
    assert_int_equal(g.ndim, 2);
    assert_int_equal(g.shape[0], 2);
    assert_int_equal(g.shape[1], 2);
    assert_int_equal(g.bytes, 8);
    ferry_plan_iter_close(it);
    ferry_plan_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(d);
}

static void test_contiguous_rows_one_record(void **state)
{
    (void)state;
    /* Whole rows on both sides: one flat run per region, no loops. */
    ferry_manifest *s = manifest_2d(4, NULL, 8, 8), *d = manifest_2d(4, NULL, 8, 8);
    ferry_split sp = {.tensor = 0, .whole = true, .parts = {4, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(s, &sp, NULL), 0);
    sp.parts[0] = 3;   /* 3,3,2 rows */
    assert_int_equal(ferry_manifest_add_split(d, &sp, NULL), 0);
    ferry_plan *p = plan(s, d);
    ferry_run r[16];
    size_t n = all_runs(p, NULL, r, 16);
    assert_int_equal(n, 5);   /* [0,3): 2 sources, [3,6): 2, [6,8): 1 */
    for (size_t i = 0; i < n; i++)
        assert_int_equal(r[i].nouter, 0);
    assert_int_equal(r[1].src_fragment, 1);
    assert_int_equal(r[1].src_offset, 0);
    assert_int_equal(r[1].len, 16);             /* row 2 */
    assert_int_equal(r[1].dst_offset, 2 * 16);
    assert_int_equal(r[2].src_offset, 16);      /* row 3 of source fragment 1 */
    assert_int_equal(r[2].dst_fragment, 1);
    ferry_plan_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(d);
}

static void test_coalesce_in_object(void **state)
{
    (void)state;
    for (int gap = 0; gap < 2; gap++) {
        ferry_manifest *s = manifest_2d(4, NULL, 8, 4), *d = manifest_2d(4, NULL, 8, 4);
        ferry_fragment a = {.tensor = 0, .rank = 2, .shape = {4, 4}, .object = "gen1/w", .object_offset = 100};
        ferry_fragment b = {.tensor = 0, .rank = 2, .offset = {4, 0}, .shape = {4, 4}, .object = "gen1/w",
                            .object_offset = 132 + (uint64_t)gap * 2};
        assert_int_equal(ferry_manifest_add_fragment(s, &a, NULL), 0);
        assert_int_equal(ferry_manifest_add_fragment(s, &b, NULL), 0);
        ferry_fragment t = {.tensor = 0, .rank = 1, .shape = {8, 4}};
        assert_int_equal(ferry_manifest_add_fragment(d, &t, NULL), 0);
        ferry_plan *p = plan(s, d);
        ferry_plan_stats st;
        ferry_plan_stats_get(p, &st);
        assert_int_equal(st.regions, 2);
        ferry_run r[4];
        size_t n = all_runs(p, NULL, r, 4);
        assert_int_equal(n, gap ? 2 : 1);
        assert_int_equal(st.runs, n);
        assert_string_equal(r[0].src_object, "gen1/w");
        assert_int_equal(r[0].src_offset, 100);
        assert_int_equal(r[0].len, gap ? 32 : 64);
        assert_int_equal(r[0].bytes, gap ? 32 : 64);
        ferry_plan_free(p);
        ferry_manifest_close(s);
        ferry_manifest_close(d);
    }
}

static void test_replica_choice(void **state)
{
    (void)state;
    /* Source copies on nodes 0, 1, 2; targets on nodes 1, 3, 3. */
    const uint32_t sn[3] = {0, 1, 2}, dn[3] = {1, 3, 3};
    ferry_manifest *s = manifest_2d(3, sn, 4, 4), *d = manifest_2d(3, dn, 4, 4);
    ferry_split sp = {.tensor = 0, .whole = true, .replicas = 3, .replica_stride = 1};
    assert_int_equal(ferry_manifest_add_split(s, &sp, NULL), 0);
    assert_int_equal(ferry_manifest_add_split(d, &sp, NULL), 0);
    ferry_plan *p = plan(s, d);
    ferry_run r[4];
    assert_int_equal(all_runs(p, NULL, r, 4), 3);
    assert_int_equal(r[0].src_rank, 1);   /* same node */
    assert_int_equal(r[1].src_rank, 1);   /* none on node 3: spread by target rank */
    assert_int_equal(r[2].src_rank, 2);
    ferry_plan_filter f = {-1, 1, -1};
    assert_int_equal(all_runs(p, &f, r, 4), 2);
    ferry_plan_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(d);
}

static uint64_t run_hash(const ferry_plan *p)
{
    ferry_plan_iter *it;
    assert_int_equal(ferry_plan_iter_open(p, NULL, &it), 0);
    uint64_t h = 1469598103934665603ull;
    ferry_run r;
    while (ferry_plan_iter_next_run(it, &r) == 1) {
        const uint64_t v[] = {r.tensor, r.src_fragment, r.dst_fragment, r.src_rank, r.dst_rank, r.src_offset,
                              r.dst_offset, r.len, r.nouter, r.count[0], r.src_stride[0], r.dst_stride[0]};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
            h = (h ^ v[i]) * 1099511628211ull;
    }
    ferry_plan_iter_close(it);
    return h;
}

static ferry_manifest *layout(const ferry_model *m, const char *text)
{
    ferry_layout l;
    ferry_manifest *man;
    ferry_error err = {0};
    assert_int_equal(ferry_layout_parse(text, &l, &err), 0);
    if (ferry_layout_build(m, &l, &man, &err) < 0)
        fail_msg("%s", err.msg);
    return man;
}

static void test_determinism_and_cache(void **state)
{
    (void)state;
    ferry_model *m;
    assert_int_equal(ferry_model_preset("qwen3-8b", &m, NULL), 0);
    ferry_manifest *s1 = layout(m, "fsdp:16"), *d1 = layout(m, "tp:4,dp:2");
    ferry_manifest *s2 = layout(m, "fsdp:16"), *d2 = layout(m, "tp:4,dp:2");
    ferry_manifest *d3 = layout(m, "pp:2,tp:4");
    ferry_plan_cache *c;
    assert_int_equal(ferry_plan_cache_create(2, &c), 0);
    ferry_plan *p1, *p2, *p3, *p4;
    bool hit = true;
    ferry_error err = {0};
    assert_int_equal(ferry_plan_cache_get(c, s1, d1, NULL, &p1, &hit, &err), 0);
    assert_false(hit);
    assert_int_equal(ferry_plan_cache_get(c, s1, d1, NULL, &p2, &hit, &err), 0);
    assert_true(hit);
    assert_ptr_equal(p1, p2);
    /* Fresh manifests with the same description hit the same plan. */
    assert_int_equal(ferry_plan_cache_get(c, s2, d2, NULL, &p3, &hit, &err), 0);
    assert_true(hit);
    assert_ptr_equal(p1, p3);
    ferry_plan *fresh = plan(s2, d2);
    assert_true(run_hash(fresh) == run_hash(p1));   /* deterministic */
    ferry_plan_stats a, b;
    ferry_plan_stats_get(fresh, &a);
    ferry_plan_stats_get(p1, &b);
    assert_memory_equal(a.src_digest, b.src_digest, 16);
    assert_memory_equal(a.topology_digest, b.topology_digest, 16);
    assert_int_equal(a.regions, b.regions);
    /* A hit still honours the caller's limits. */
    ferry_plan_options o = {.max_regions = 10};
    ferry_plan *px = NULL;
    assert_int_equal(ferry_plan_cache_get(c, s1, d1, &o, &px, &hit, &err), FERRY_EMSGSIZE);
    assert_null(px);
    assert_non_null(strstr(err.msg, "max_regions"));
    /* Another target misses; capacity 2 keeps both, a third evicts the
     * least recently used (s1 -> d3 was used last). */
    assert_int_equal(ferry_plan_cache_get(c, s1, d3, NULL, &p4, &hit, &err), 0);
    assert_false(hit);
    assert_int_equal(ferry_plan_cache_size(c), 2);
    ferry_plan *p5;
    assert_int_equal(ferry_plan_cache_get(c, d1, s1, NULL, &p5, &hit, &err), 0);   /* reverse direction */
    assert_false(hit);
    assert_int_equal(ferry_plan_cache_size(c), 2);
    ferry_plan *p6;
    assert_int_equal(ferry_plan_cache_get(c, s1, d3, NULL, &p6, &hit, &err), 0);
    assert_true(hit);
    assert_int_equal(ferry_plan_cache_get(c, s1, d1, NULL, &px, &hit, &err), 0);
    assert_false(hit);   /* evicted */
    /* Plans outlive the cache. */
    ferry_plan_cache_free(c);
    assert_true(run_hash(p1) == run_hash(fresh));
    for (ferry_plan **q = (ferry_plan *[]){p1, p2, p3, p4, p5, p6, px, fresh}, **e = q + 8; q < e; q++)
        ferry_plan_free(*q);
    ferry_manifest_close(s1);
    ferry_manifest_close(d1);
    ferry_manifest_close(s2);
    ferry_manifest_close(d2);
    ferry_manifest_close(d3);
    ferry_model_free(m);
    ferry_plan_cache_free(NULL);
    ferry_plan_free(NULL);
}

static void test_sweep_many_fragments(void **state)
{
    (void)state;
    /* 4000 source rows of 3 against 4000 target rows of 3 shifted by one:
     * every target overlaps two sources. */
    const uint64_t n = 4000;
    ferry_manifest *s = manifest_2d(8, NULL, 3 * n + 1, 2), *d = manifest_2d(8, NULL, 3 * n + 1, 2);
    for (uint64_t i = 0; i < n; i++) {
        ferry_fragment f = {.tensor = 0, .rank = (uint32_t)(i % 8), .offset = {3 * i, 0}, .shape = {3, 2}};
        assert_int_equal(ferry_manifest_add_fragment(s, &f, NULL), 0);
        f.offset[0] = 3 * i + 1;
        assert_int_equal(ferry_manifest_add_fragment(d, &f, NULL), 0);
    }
    ferry_fragment last = {.tensor = 0, .rank = 0, .offset = {3 * n, 0}, .shape = {1, 2}};
    assert_int_equal(ferry_manifest_add_fragment(s, &last, NULL), 0);
    ferry_plan *p = plan(s, d);
    ferry_plan_stats st;
    ferry_plan_stats_get(p, &st);
    assert_int_equal(st.regions, 2 * n);
    assert_int_equal(st.bytes, 3 * n * 2 * 2);
    ferry_plan_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(d);

    /* Crossing splits: 64 row bands against 64 column bands, 4096 regions. */
    s = manifest_2d(8, NULL, 64, 64);
    d = manifest_2d(8, NULL, 64, 64);
    for (uint64_t i = 0; i < 64; i++) {
        ferry_fragment f = {.tensor = 0, .rank = 0, .offset = {i, 0}, .shape = {1, 64}};
        assert_int_equal(ferry_manifest_add_fragment(s, &f, NULL), 0);
        f = (ferry_fragment){.tensor = 0, .rank = 1, .offset = {0, i}, .shape = {64, 1}};
        assert_int_equal(ferry_manifest_add_fragment(d, &f, NULL), 0);
    }
    p = plan(s, d);
    ferry_plan_stats_get(p, &st);
    assert_int_equal(st.regions, 4096);
    ferry_plan_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(d);
}

/* Naive all-pairs count over materialized fragments (replica 0 sources). */
static uint64_t naive_regions(const ferry_manifest *s, const ferry_manifest *d)
{
    uint64_t ns = ferry_manifest_fragment_count(s), nd = ferry_manifest_fragment_count(d), n = 0;
    ferry_fragment *fs = calloc(ns, sizeof *fs);
    for (uint64_t i = 0; i < ns; i++)
        ferry_manifest_fragment(s, i, &fs[i]);
    for (uint64_t j = 0; j < nd; j++) {
        ferry_fragment t;
        ferry_manifest_fragment(d, j, &t);
        ferry_tensor_desc td;
        ferry_manifest_tensor(d, t.tensor, &td);
        int si = ferry_manifest_find_tensor(s, td.name);
        for (uint64_t i = 0; i < ns; i++) {
            if (fs[i].tensor != (uint32_t)si || fs[i].replica)
                continue;
            bool hit = true;
            for (uint32_t k = 0; k < td.ndim && hit; k++)
                hit = fs[i].offset[k] < t.offset[k] + t.shape[k] && t.offset[k] < fs[i].offset[k] + fs[i].shape[k];
            n += hit;
        }
    }
    free(fs);
    return n;
}

static void test_presets_end_to_end(void **state)
{
    (void)state;
    static const char *pairs[][2] = {{"fsdp:4", "tp:2,dp:2"}, {"tp:2,dp:2", "pp:2,tp:2"}, {"pp:2,tp:2", "fsdp:3"}};
    ferry_model *m;
    assert_int_equal(ferry_model_preset("qwen3-8b", &m, NULL), 0);
    for (size_t i = 0; i < 3; i++) {
        ferry_manifest *s = layout(m, pairs[i][0]), *d = layout(m, pairs[i][1]);
        ferry_plan *p = plan(s, d);
        ferry_plan_stats st;
        ferry_plan_stats_get(p, &st);
        assert_int_equal(st.regions, naive_regions(s, d));
        assert_int_equal(st.tensors, ferry_model_tensor_count(m));
        /* Per target rank: its runs carry exactly the bytes it stores. */
        uint64_t max = 0, sum = 0;
        for (uint32_t r = 0; r < ferry_manifest_rank_count(d); r++) {
            ferry_plan_filter f = {-1, -1, r};
            ferry_plan_iter *it;
            assert_int_equal(ferry_plan_iter_open(p, &f, &it), 0);
            ferry_run run;
            uint64_t got = 0, want;
            while (ferry_plan_iter_next_run(it, &run) == 1) {
                assert_int_equal(run.dst_rank, r);
                got += run.bytes;
            }
            ferry_plan_iter_close(it);
            ferry_manifest_rank_bytes(d, r, &want);
            assert_int_equal(got, want);
            max = want > max ? want : max;
            sum += want;
        }
        assert_int_equal(st.max_rank_bytes, max);
        assert_int_equal(st.bytes, sum);
        assert_true(st.mean_rank_bytes * ferry_manifest_rank_count(d) > (double)sum - 1);
        ferry_plan_free(p);
        ferry_manifest_close(s);
        ferry_manifest_close(d);
    }
    ferry_model_free(m);
}

static void test_tensor_filter_and_order(void **state)
{
    (void)state;
    ferry_model *m;
    assert_int_equal(ferry_model_preset("qwen3-8b", &m, NULL), 0);
    ferry_manifest *s = layout(m, "fsdp:8"), *d = layout(m, "tp:4");
    ferry_plan *p = plan(s, d);
    ferry_plan_iter *it;
    ferry_region r;
    uint32_t last = 0;
    uint64_t n = 0;
    assert_int_equal(ferry_plan_iter_open(p, NULL, &it), 0);
    while (ferry_plan_iter_next_region(it, &r) == 1) {
        assert_true(r.tensor >= last);   /* target tensor order */
        last = r.tensor;
        n++;
    }
    ferry_plan_iter_close(it);
    int ti = ferry_manifest_find_tensor(d, "model.layers.3.mlp.down_proj.weight");
    ferry_plan_filter f = {ti, -1, -1};
    uint64_t k = 0;
    assert_int_equal(ferry_plan_iter_open(p, &f, &it), 0);
    while (ferry_plan_iter_next_region(it, &r) == 1) {
        assert_int_equal(r.tensor, (uint32_t)ti);
        k++;
    }
    ferry_plan_iter_close(it);
    assert_int_equal(k, 8 * 4);   /* row split x FSDP rows: every pair meets */
    f.tensor = 100000;
    assert_int_equal(ferry_plan_iter_open(p, &f, &it), 0);
    assert_int_equal(ferry_plan_iter_next_region(it, &r), 0);
    ferry_plan_iter_close(it);
    ferry_plan_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(d);
    ferry_model_free(m);
}

static void test_scalar(void **state)
{
    (void)state;
    ferry_manifest *s, *d;
    assert_int_equal(ferry_manifest_create(4, NULL, 2, &s), 0);
    assert_int_equal(ferry_manifest_create(4, NULL, 2, &d), 0);
    ferry_tensor_desc t = {.name = "step", .dtype = "i64", .itemsize = 8, .ndim = 0};
    assert_int_equal(ferry_manifest_add_tensor(s, &t, NULL), 0);
    assert_int_equal(ferry_manifest_add_tensor(d, &t, NULL), 0);
    ferry_split sp = {.tensor = 0, .whole = true, .rank = 0, .replicas = 2, .replica_stride = 2};
    assert_int_equal(ferry_manifest_add_split(s, &sp, NULL), 0);
    sp.replicas = 4;
    sp.replica_stride = 1;
    assert_int_equal(ferry_manifest_add_split(d, &sp, NULL), 0);
    ferry_plan *p = plan(s, d);
    ferry_run r[8];
    assert_int_equal(all_runs(p, NULL, r, 8), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r[i].len, 8);
        assert_int_equal(r[i].nouter, 0);
        assert_int_equal(r[i].dst_rank, (uint32_t)i);
        /* copies on ranks 0 (node 0) and 2 (node 1): same node wins */
        assert_int_equal(r[i].src_rank, i < 2 ? 0 : 2);
    }
    ferry_plan_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lowering_strided),
        cmocka_unit_test(test_contiguous_rows_one_record),
        cmocka_unit_test(test_coalesce_in_object),
        cmocka_unit_test(test_replica_choice),
        cmocka_unit_test(test_determinism_and_cache),
        cmocka_unit_test(test_sweep_many_fragments),
        cmocka_unit_test(test_presets_end_to_end),
        cmocka_unit_test(test_tensor_filter_and_order),
        cmocka_unit_test(test_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
