/* Validation fails closed: one negative test per rule, each checking the
 * code and that the message names the tensor and the fragment. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "ferry/reshard.h"

static ferry_manifest *new_manifest(uint32_t ranks, const char *dtype, uint64_t d0, uint64_t d1)
{
    ferry_manifest *m;
    assert_int_equal(ferry_manifest_create(ranks, NULL, 8, &m), 0);
    ferry_tensor_desc t = {.name = "w", .dtype = dtype, .itemsize = ferry_dtype_size(dtype), .ndim = 2,
                           .shape = {d0, d1}};
    assert_int_equal(ferry_manifest_add_tensor(m, &t, NULL), 0);
    return m;
}

static void add_rows(ferry_manifest *m, uint32_t rank, uint64_t r0, uint64_t rows, uint64_t cols, uint32_t replica)
{
    ferry_fragment f = {.tensor = 0, .rank = rank, .offset = {r0, 0}, .shape = {rows, cols}, .replica = replica};
    ferry_error err = {0};
    if (ferry_manifest_add_fragment(m, &f, &err) < 0)
        fail_msg("%s", err.msg);
}

static void expect_msg(const ferry_error *err, int rc, int code, const char *a, const char *b)
{
    assert_int_equal(rc, code);
    assert_int_equal(err->code, code);
    if (a && !strstr(err->msg, a))
        fail_msg("message '%s' lacks '%s'", err->msg, a);
    if (b && !strstr(err->msg, b))
        fail_msg("message '%s' lacks '%s'", err->msg, b);
}

static void expect_plan_fails(ferry_manifest *src, ferry_manifest *dst, const ferry_plan_options *o, int code,
                              const char *a, const char *b)
{
    ferry_plan *p = NULL;
    ferry_error err = {0};
    int rc = ferry_plan_create(src, dst, o, &p, &err);
    assert_null(p);
    expect_msg(&err, rc, code, a, b);
}

/* ---- rules checked as fragments are added --------------------------------- */

static void test_fragment_inside_shape(void **state)
{
    (void)state;
    ferry_manifest *m = new_manifest(4, "f32", 8, 4);
    ferry_error err = {0};
    ferry_fragment f = {.tensor = 0, .rank = 1, .offset = {6, 0}, .shape = {3, 4}};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_EINVAL, "tensor 'w'", "fragment 0 (rank 1)");
    assert_non_null(strstr(err.msg, "outside the tensor shape [8,4]"));
    f.offset[0] = UINT64_MAX;   /* offset + shape wraps */
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_EINVAL, "tensor 'w'", "outside");
    f = (ferry_fragment){.tensor = 0, .rank = 1, .shape = {0, 4}};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_EINVAL, "tensor 'w'", "empty");
    ferry_split s = {.tensor = 0, .offset = {4, 0}, .shape = {5, 4}, .parts = {2, 1}};
    expect_msg(&err, ferry_manifest_add_split(m, &s, &err), FERRY_EINVAL, "tensor 'w'", "split at fragment 0");
    f = (ferry_fragment){.tensor = 1, .rank = 0, .shape = {1, 1}};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_EINVAL, "fragment 0", "tensor index 1");
    assert_int_equal(ferry_manifest_fragment_count(m), 0);   /* nothing half-added */
    ferry_manifest_close(m);
}

static void test_rank_inside_topology(void **state)
{
    (void)state;
    ferry_manifest *m = new_manifest(4, "f32", 8, 4);
    ferry_error err = {0};
    ferry_fragment f = {.tensor = 0, .rank = 4, .shape = {8, 4}};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_EINVAL, "tensor 'w'", "rank 4 outside the topology");
    /* 4 pieces at stride 1 from rank 1 reach rank 4; so do copies. */
    ferry_split s = {.tensor = 0, .whole = true, .parts = {4, 1}, .rank = 1, .rank_stride = {1, 0}};
    expect_msg(&err, ferry_manifest_add_split(m, &s, &err), FERRY_EINVAL, "tensor 'w'", "reach rank 4");
    s = (ferry_split){.tensor = 0, .whole = true, .rank = 0, .replicas = 3, .replica_stride = 2};
    expect_msg(&err, ferry_manifest_add_split(m, &s, &err), FERRY_EINVAL, "tensor 'w'", "reach rank 4");
    /* Reach that wraps 64 bits must not pass as a small rank: piece term
     * (2^32-2)(2^32-1) = 2^64 - 3*2^32 + 2, copy term 3*2^30 * 4 = 3*2^32;
     * summed modulo 2^64 that is rank 2. */
    s = (ferry_split){.tensor = 0, .whole = true, .parts = {UINT32_MAX, 1}, .rank = 0,
                      .rank_stride = {UINT32_MAX, 0}, .replicas = 3u * (1u << 30) + 1, .replica_stride = 4};
    expect_msg(&err, ferry_manifest_add_split(m, &s, &err), FERRY_EINVAL, "tensor 'w'", "outside the topology");
    ferry_manifest_close(m);
}

static void test_tensor_rules(void **state)
{
    (void)state;
    ferry_manifest *m;
    ferry_error err = {0};
    assert_int_equal(ferry_manifest_create(1, NULL, 8, &m), 0);
    ferry_tensor_desc t = {.name = "a", .dtype = "bf16", .itemsize = 4, .ndim = 1, .shape = {3}};
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_EINVAL, "tensor 'a'", "itemsize 4");
    t.dtype = "bf17";
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_EINVAL, "tensor 'a'", "unknown dtype 'bf17'");
    t = (ferry_tensor_desc){.name = "a", .dtype = "bf16", .itemsize = 2, .ndim = 2, .shape = {3, 0}};
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_EINVAL, "tensor 'a'", "dim 1 is 0");
    t.ndim = 9;
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_EINVAL, "tensor 'a'", "9 dims");
    t = (ferry_tensor_desc){.name = "a", .dtype = "bf16", .itemsize = 2, .ndim = 1, .shape = {3}};
    assert_int_equal(ferry_manifest_add_tensor(m, &t, &err), 0);
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_EEXIST, "tensor 'a'", "declared twice");
    t.name = "";
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_EINVAL, "tensor 1", "name");
    ferry_manifest_close(m);
}

static void test_overflow(void **state)
{
    (void)state;
    ferry_manifest *m;
    ferry_error err = {0};
    assert_int_equal(ferry_manifest_create(1, NULL, 8, &m), 0);
    ferry_tensor_desc t = {.name = "huge", .dtype = "f64", .itemsize = 8, .ndim = 3,
                           .shape = {1ull << 30, 1ull << 30, 1ull << 4}};
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_ERANGE, "tensor 'huge'", "overflows");
    t.shape[2] = 4;   /* 2^62 elements fit, their bytes do not */
    expect_msg(&err, ferry_manifest_add_tensor(m, &t, &err), FERRY_ERANGE, "tensor 'huge'", "byte size overflows");
    t = (ferry_tensor_desc){.name = "v", .dtype = "f32", .itemsize = 4, .ndim = 2, .shape = {4, 4}};
    assert_int_equal(ferry_manifest_add_tensor(m, &t, &err), 0);
    ferry_fragment f = {.tensor = 0, .rank = 0, .shape = {4, 4}, .has_strides = true, .strides = {1ull << 62, 1}};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_ERANGE, "tensor 'v'", "fragment 0");
    f = (ferry_fragment){.tensor = 0, .rank = 0, .shape = {4, 4}, .storage_offset = UINT64_MAX - 3};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_ERANGE, "tensor 'v'", "byte span overflows");
    f = (ferry_fragment){.tensor = 0, .rank = 0, .shape = {4, 4}, .object = "o", .object_offset = UINT64_MAX - 10};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_ERANGE, "tensor 'v'", "fragment 0 (rank 0)");
    ferry_manifest_close(m);
}

static void test_strides_alias(void **state)
{
    (void)state;
    ferry_manifest *m = new_manifest(2, "f32", 4, 4);
    ferry_error err = {0};
    ferry_fragment f = {.tensor = 0, .rank = 1, .shape = {4, 4}, .has_strides = true, .strides = {2, 1}};
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_EINVAL, "tensor 'w'", "alias");
    f.strides[0] = 0;
    expect_msg(&err, ferry_manifest_add_fragment(m, &f, &err), FERRY_EINVAL, "fragment 0 (rank 1)", "alias");
    f.strides[0] = 1;   /* column-major: fine */
    f.strides[1] = 4;
    assert_int_equal(ferry_manifest_add_fragment(m, &f, &err), 0);
    ferry_manifest_close(m);
}

static void test_object_rules(void **state)
{
    (void)state;
    ferry_manifest *m = new_manifest(4, "f32", 8, 4);
    ferry_error err = {0};
    ferry_fragment a = {.tensor = 0, .rank = 2, .shape = {4, 4}, .object = "blob", .object_offset = 0};
    ferry_fragment b = {.tensor = 0, .rank = 2, .offset = {4, 0}, .shape = {4, 4}, .object = "blob",
                        .object_offset = 60};   /* a spans [0, 64) */
    assert_int_equal(ferry_manifest_add_fragment(m, &a, &err), 0);
    assert_int_equal(ferry_manifest_add_fragment(m, &b, &err), 0);
    expect_msg(&err, ferry_manifest_validate(m, &err), FERRY_EINVAL, "tensor 'w'", "fragment 1");
    assert_non_null(strstr(err.msg, "overlap in bytes [60, 64) of object 'blob'"));
    ferry_manifest_close(m);

    m = new_manifest(4, "f32", 8, 4);
    b.object_offset = 64;
    b.rank = 3;
    assert_int_equal(ferry_manifest_add_fragment(m, &a, &err), 0);
    assert_int_equal(ferry_manifest_add_fragment(m, &b, &err), 0);
    expect_msg(&err, ferry_manifest_validate(m, &err), FERRY_EINVAL, "fragment 1 (rank 3", "one home");
    ferry_manifest_close(m);

    m = new_manifest(4, "f32", 8, 4);
    ferry_fragment c = {.tensor = 0, .rank = 0, .shape = {4, 4}, .object = ""};
    expect_msg(&err, ferry_manifest_add_fragment(m, &c, &err), FERRY_EINVAL, "tensor 'w'", "object key");
    c = (ferry_fragment){.tensor = 0, .rank = 0, .shape = {4, 4}, .object_offset = 8};
    expect_msg(&err, ferry_manifest_add_fragment(m, &c, &err), FERRY_EINVAL, "fragment 0", "without an object");
    ferry_manifest_close(m);
}

/* ---- rules checked when planning ------------------------------------------ */

static void test_target_not_covered(void **state)
{
    (void)state;
    ferry_manifest *src = new_manifest(4, "bf16", 8, 4), *dst = new_manifest(4, "bf16", 8, 4);
    add_rows(src, 0, 0, 3, 4, 0);
    add_rows(src, 1, 5, 3, 4, 0);   /* rows 3 and 4 missing */
    add_rows(dst, 0, 0, 2, 4, 0);   /* covered */
    add_rows(dst, 1, 2, 4, 4, 0);   /* rows 2..5: 8 of 16 elements covered */
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "tensor 'w': target fragment 1 (rank 1", "8 of 16 elements");
    /* A failed plan leaves the manifests open: fill the hole, plan again. */
    add_rows(src, 2, 3, 2, 4, 0);
    ferry_plan *p;
    ferry_error err = {0};
    assert_int_equal(ferry_plan_create(src, dst, NULL, &p, &err), 0);
    ferry_plan_stats st;
    ferry_plan_stats_get(p, &st);
    assert_int_equal(st.regions, 1 + 3);
    ferry_plan_free(p);
    ferry_manifest_close(src);
    ferry_manifest_close(dst);

    /* A split target whose last piece falls in a hole. */
    src = new_manifest(4, "bf16", 8, 4);
    dst = new_manifest(4, "bf16", 8, 4);
    add_rows(src, 0, 0, 6, 4, 0);
    ferry_split s = {.tensor = 0, .whole = true, .parts = {4, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(dst, &s, NULL), 0);
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "target fragment 3 (rank 3", "offset [6,0]");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
}

static void test_source_overlap(void **state)
{
    (void)state;
    /* Partial overlap is never allowed. */
    ferry_manifest *src = new_manifest(4, "bf16", 8, 4), *dst = new_manifest(4, "bf16", 8, 4);
    add_rows(src, 0, 0, 5, 4, 0);
    add_rows(src, 1, 4, 4, 4, 1);
    add_rows(dst, 0, 0, 8, 4, 0);
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "tensor 'w': source fragment 0 (rank 0", "fragment 1 (rank 1");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);

    /* Identical boxes are copies only with distinct replica numbers. */
    src = new_manifest(4, "bf16", 8, 4);
    dst = new_manifest(4, "bf16", 8, 4);
    add_rows(src, 0, 0, 8, 4, 0);
    add_rows(src, 3, 0, 8, 4, 0);
    add_rows(dst, 0, 0, 8, 4, 0);
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "tensor 'w'", "same replica number 0");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);

    /* Two splits whose copies reuse a replica number. */
    src = new_manifest(8, "bf16", 8, 4);
    dst = new_manifest(8, "bf16", 8, 4);
    ferry_split s = {.tensor = 0, .whole = true, .parts = {2, 1}, .rank_stride = {1, 0}, .replicas = 2,
                     .replica_stride = 2};
    assert_int_equal(ferry_manifest_add_split(src, &s, NULL), 0);
    s.rank = 4;
    s.replica = 1;   /* copies 1, 2 collide with 0, 1 */
    assert_int_equal(ferry_manifest_add_split(src, &s, NULL), 0);
    add_rows(dst, 0, 0, 8, 4, 0);
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "source fragment 2 (rank 2, replica 1", "fragment 4 (rank 4, replica 1");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);

    /* A split overlapping a fragment that is not one of its pieces. */
    src = new_manifest(8, "bf16", 8, 4);
    dst = new_manifest(8, "bf16", 8, 4);
    s = (ferry_split){.tensor = 0, .whole = true, .parts = {4, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(src, &s, NULL), 0);
    add_rows(src, 7, 3, 2, 4, 1);
    add_rows(dst, 0, 0, 8, 4, 0);
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "source fragment 1 (rank 1", "fragment 4 (rank 7");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
}

static void test_cross_manifest_consistency(void **state)
{
    (void)state;
    ferry_manifest *src = new_manifest(2, "bf16", 8, 4), *dst = new_manifest(2, "f16", 8, 4);
    add_rows(src, 0, 0, 8, 4, 0);
    add_rows(dst, 0, 0, 8, 4, 0);
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "tensor 'w'", "dtype bf16 (itemsize 2) in the source, f16");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);

    src = new_manifest(2, "bf16", 8, 4);
    dst = new_manifest(2, "bf16", 8, 5);
    add_rows(src, 0, 0, 8, 4, 0);
    add_rows(dst, 0, 0, 8, 5, 0);
    expect_plan_fails(src, dst, NULL, FERRY_EINVAL, "tensor 'w'", "shape [8,4] in the source, [8,5] in the target");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);

    src = new_manifest(2, "bf16", 8, 4);
    dst = new_manifest(2, "bf16", 8, 4);
    add_rows(src, 0, 0, 8, 4, 0);
    ferry_tensor_desc t = {.name = "extra", .dtype = "f32", .itemsize = 4, .ndim = 1, .shape = {3}};
    assert_int_equal(ferry_manifest_add_tensor(dst, &t, NULL), 1);
    ferry_fragment f = {.tensor = 1, .rank = 1, .shape = {3}};
    assert_int_equal(ferry_manifest_add_fragment(dst, &f, NULL), 0);
    expect_plan_fails(src, dst, NULL, FERRY_ENOENT, "tensor 'extra'", "no such tensor");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
}

static void test_limits(void **state)
{
    (void)state;
    /* 32 source pieces of 2 rows, 5 target pieces of 13 rows: two target
     * boundaries (13, 39) cut a source piece, so 32 + 2 regions. */
    ferry_manifest *src = new_manifest(64, "bf16", 64, 4), *dst = new_manifest(64, "bf16", 64, 4);
    ferry_split s = {.tensor = 0, .whole = true, .parts = {32, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(src, &s, NULL), 0);
    s.parts[0] = 5;
    assert_int_equal(ferry_manifest_add_split(dst, &s, NULL), 0);
    ferry_plan_options o = {.max_fragments = 31};
    expect_plan_fails(src, dst, &o, FERRY_EMSGSIZE, "source manifest has 32 fragments", "max_fragments");
    o = (ferry_plan_options){.max_regions = 33};
    expect_plan_fails(src, dst, &o, FERRY_EMSGSIZE, "tensor 'w'", "max_regions");
    ferry_plan *p;
    o.max_regions = 34;
    assert_int_equal(ferry_plan_create(src, dst, &o, &p, NULL), 0);
    ferry_plan_stats st;
    ferry_plan_stats_get(p, &st);
    assert_int_equal(st.regions, 34);
    ferry_plan_free(p);
    ferry_manifest_close(src);
    ferry_manifest_close(dst);

    /* Overlap records: one per (target fragment, source fragment) pair
     * when both sides are fragments added one by one. */
    src = new_manifest(64, "bf16", 64, 4);
    dst = new_manifest(64, "bf16", 64, 4);
    for (uint32_t i = 0; i < 8; i++) {
        add_rows(src, i, i * 8, 8, 4, 0);
        add_rows(dst, i, i * 8, 8, 4, 0);
    }
    o = (ferry_plan_options){.max_overlaps = 7};
    expect_plan_fails(src, dst, &o, FERRY_EMSGSIZE, "tensor 'w'", "max_overlaps");
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
}

static void test_frozen(void **state)
{
    (void)state;
    ferry_manifest *src = new_manifest(2, "bf16", 8, 4), *dst = new_manifest(2, "bf16", 8, 4);
    add_rows(src, 0, 0, 8, 4, 0);
    add_rows(dst, 1, 0, 8, 4, 0);
    ferry_plan *p;
    ferry_error err = {0};
    assert_int_equal(ferry_plan_create(src, dst, NULL, &p, &err), 0);
    ferry_fragment f = {.tensor = 0, .rank = 0, .shape = {1, 1}};
    expect_msg(&err, ferry_manifest_add_fragment(src, &f, &err), FERRY_ESTATE, "frozen", NULL);
    ferry_tensor_desc t = {.name = "z", .dtype = "f32", .itemsize = 4, .ndim = 1, .shape = {1}};
    expect_msg(&err, ferry_manifest_add_tensor(dst, &t, &err), FERRY_ESTATE, "frozen", NULL);
    /* The plan keeps both manifests alive past the caller's close. */
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
    ferry_plan_stats st;
    ferry_plan_stats_get(p, &st);
    assert_int_equal(st.regions, 1);
    assert_int_equal(ferry_manifest_fragment_count(ferry_plan_src(p)), 1);
    ferry_plan_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fragment_inside_shape),
        cmocka_unit_test(test_rank_inside_topology),
        cmocka_unit_test(test_tensor_rules),
        cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_strides_alias),
        cmocka_unit_test(test_object_rules),
        cmocka_unit_test(test_target_not_covered),
        cmocka_unit_test(test_source_overlap),
        cmocka_unit_test(test_cross_manifest_consistency),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_frozen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
