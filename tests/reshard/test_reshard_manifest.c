/* reshard data model: tensors, fragments, splits, accessors, digests and
 * the JSON form (round trips, hand-written files, malformed input). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/reshard.h"

static int add_tensor(ferry_manifest *m, const char *name, const char *dtype, uint32_t ndim, ...)
{
    ferry_tensor_desc t = {.name = name, .dtype = dtype, .itemsize = ferry_dtype_size(dtype), .ndim = ndim};
    va_list ap;
    va_start(ap, ndim);
    for (uint32_t d = 0; d < ndim; d++)
        t.shape[d] = va_arg(ap, uint64_t);
    va_end(ap);
    ferry_error err = {0};
    int rc = ferry_manifest_add_tensor(m, &t, &err);
    if (rc < 0)
        fail_msg("add_tensor %s: %s", name, err.msg);
    return rc;
}

static void test_dtypes(void **state)
{
    (void)state;
    assert_int_equal(ferry_dtype_size("bf16"), 2);
    assert_int_equal(ferry_dtype_size("f32"), 4);
    assert_int_equal(ferry_dtype_size("fp8_e4m3"), 1);
    assert_int_equal(ferry_dtype_size("f64"), 8);
    assert_int_equal(ferry_dtype_size("float"), 0);
    assert_int_equal(ferry_dtype_size(NULL), 0);
}

static void test_topology(void **state)
{
    (void)state;
    ferry_manifest *m;
    assert_int_equal(ferry_manifest_create(0, NULL, 8, &m), FERRY_EINVAL);
    assert_int_equal(ferry_manifest_create(20, NULL, 8, &m), 0);
    assert_int_equal(ferry_manifest_rank_count(m), 20);
    assert_int_equal(ferry_manifest_node_of(m, 7), 0);
    assert_int_equal(ferry_manifest_node_of(m, 8), 1);
    assert_int_equal(ferry_manifest_node_of(m, 19), 2);
    assert_int_equal(ferry_manifest_node_of(m, 20), UINT32_MAX);
    uint8_t a[16], b[16];
    assert_int_equal(ferry_manifest_topology_digest(m, a), 0);
    ferry_manifest_close(m);
    const uint32_t nodes[4] = {5, 5, 9, 9};
    assert_int_equal(ferry_manifest_create(4, nodes, 0, &m), 0);
    assert_int_equal(ferry_manifest_node_of(m, 2), 9);
    assert_int_equal(ferry_manifest_topology_digest(m, b), 0);
    assert_memory_not_equal(a, b, 16);
    ferry_manifest_close(m);
    ferry_manifest_close(NULL);
}

static void test_fragments_and_splits(void **state)
{
    (void)state;
    ferry_manifest *m;
    ferry_error err = {0};
    assert_int_equal(ferry_manifest_create(16, NULL, 8, &m), 0);
    assert_int_equal(add_tensor(m, "w", "bf16", 2, (uint64_t)10, (uint64_t)6), 0);
    assert_int_equal(add_tensor(m, "b", "f32", 1, (uint64_t)5), 1);
    assert_int_equal(ferry_manifest_find_tensor(m, "b"), 1);
    assert_int_equal(ferry_manifest_find_tensor(m, "nope"), FERRY_ENOENT);
    /* 10 rows over 4 ranks: chunks 3,3,3,1. */
    ferry_split s = {.tensor = 0, .whole = true, .parts = {4, 1}, .rank = 0, .rank_stride = {1, 0}, .replicas = 2,
                     .replica_stride = 8, .replica = 0};
    assert_int_equal(ferry_manifest_add_split(m, &s, &err), 0);
    assert_int_equal(ferry_manifest_fragment_count(m), 8);
    /* 5 elements over 4 ranks: chunks 2,2,1 and rank 3 holds nothing. */
    ferry_split s2 = {.tensor = 1, .whole = true, .parts = {4}, .rank = 4, .rank_stride = {1}};
    assert_int_equal(ferry_manifest_add_split(m, &s2, &err), 0);
    assert_int_equal(ferry_manifest_fragment_count(m), 11);
    ferry_fragment f = {.tensor = 1, .rank = 15, .offset = {1}, .shape = {3}, .replica = 7, .object = "obj",
                        .object_offset = 64, .storage_offset = 2};
    assert_int_equal(ferry_manifest_add_fragment(m, &f, &err), 0);
    assert_int_equal(ferry_manifest_fragment_count(m), 12);

    ferry_fragment g;
    assert_int_equal(ferry_manifest_fragment(m, 3, &g), 0);   /* copy 0, last piece */
    assert_int_equal(g.rank, 3);
    assert_int_equal(g.offset[0], 9);
    assert_int_equal(g.shape[0], 1);
    assert_int_equal(g.shape[1], 6);
    assert_int_equal(g.replica, 0);
    assert_null(g.object);
    assert_int_equal(ferry_manifest_fragment(m, 5, &g), 0);   /* copy 1, piece 1 */
    assert_int_equal(g.rank, 9);
    assert_int_equal(g.node, 1);
    assert_int_equal(g.offset[0], 3);
    assert_int_equal(g.replica, 1);
    assert_int_equal(ferry_manifest_fragment(m, 10, &g), 0);  /* b's last non-empty piece */
    assert_int_equal(g.rank, 6);
    assert_int_equal(g.offset[0], 4);
    assert_int_equal(g.shape[0], 1);
    assert_int_equal(ferry_manifest_fragment(m, 11, &g), 0);
    assert_string_equal(g.object, "obj");
    assert_int_equal(g.object_offset, 64);
    assert_int_equal(g.storage_offset, 2);
    assert_int_equal(g.replica, 7);
    assert_int_equal(ferry_manifest_fragment(m, 12, &g), FERRY_EINVAL);

    uint64_t bytes;
    assert_int_equal(ferry_manifest_rank_bytes(m, 0, &bytes), 0);
    assert_int_equal(bytes, 3 * 6 * 2);
    assert_int_equal(ferry_manifest_rank_bytes(m, 15, &bytes), 0);
    assert_int_equal(bytes, 3 * 4);
    assert_int_equal(ferry_manifest_rank_bytes(m, 7, &bytes), 0);   /* rank 3 of b's split: empty */
    assert_int_equal(bytes, 0);
    assert_int_equal(ferry_manifest_validate(m, &err), 0);

    ferry_tensor_desc t;
    assert_int_equal(ferry_manifest_tensor(m, 0, &t), 0);
    assert_string_equal(t.name, "w");
    assert_string_equal(t.dtype, "bf16");
    assert_int_equal(t.shape[0], 10);
    assert_int_equal(ferry_manifest_tensor(m, 2, &t), FERRY_EINVAL);
    ferry_manifest_close(m);
}

static void test_digest(void **state)
{
    (void)state;
    ferry_manifest *a, *b;
    uint8_t da[16], db[16], dc[16];
    ferry_error err = {0};
    for (int i = 0; i < 2; i++) {
        ferry_manifest **m = i ? &b : &a;
        assert_int_equal(ferry_manifest_create(8, NULL, 8, m), 0);
        add_tensor(*m, "x", "f32", 2, (uint64_t)4, (uint64_t)4);
        ferry_split s = {.tensor = 0, .whole = true, .parts = {2, 1}, .rank_stride = {1, 0}};
        assert_int_equal(ferry_manifest_add_split(*m, &s, &err), 0);
    }
    assert_int_equal(ferry_manifest_digest(a, da), 0);
    assert_int_equal(ferry_manifest_digest(b, db), 0);
    assert_memory_equal(da, db, 16);   /* same description, same digest */
    char hex[33];
    ferry_digest_hex(da, hex);
    assert_int_equal(strlen(hex), 32);
    /* A change invalidates the memoized digest. */
    ferry_fragment f = {.tensor = 0, .rank = 3, .shape = {1, 1}};
    assert_int_equal(ferry_manifest_add_fragment(b, &f, &err), 0);
    assert_int_equal(ferry_manifest_digest(b, dc), 0);
    assert_memory_not_equal(da, dc, 16);
    ferry_manifest_close(a);
    ferry_manifest_close(b);

    /* Each field matters: a different rank, shape, name or replica. */
    uint8_t prev[16] = {0};
    for (int v = 0; v < 5; v++) {
        ferry_manifest *m;
        assert_int_equal(ferry_manifest_create(8, NULL, 8, &m), 0);
        add_tensor(m, v == 1 ? "y" : "x", "f32", 1, (uint64_t)(v == 2 ? 5 : 4));
        ferry_fragment g = {.tensor = 0, .rank = v == 3 ? 1 : 0, .shape = {4}, .replica = v == 4 ? 1 : 0};
        assert_int_equal(ferry_manifest_add_fragment(m, &g, &err), 0);
        uint8_t d[16];
        assert_int_equal(ferry_manifest_digest(m, d), 0);
        assert_memory_not_equal(d, prev, 16);
        memcpy(prev, d, 16);
        ferry_manifest_close(m);
    }
}

static ferry_manifest *sample(void)
{
    ferry_manifest *m;
    ferry_error err = {0};
    const uint32_t nodes[6] = {0, 0, 0, 1, 1, 7};
    assert_int_equal(ferry_manifest_create(6, nodes, 0, &m), 0);
    add_tensor(m, "layer \"0\".w\\q\n", "bf16", 3, (uint64_t)4, (uint64_t)6, (uint64_t)2);
    add_tensor(m, "scalar", "f64", 0);
    ferry_split s = {.tensor = 0, .offset = {0, 2, 0}, .shape = {4, 4, 2}, .parts = {3, 2, 1},
                     .rank = 0, .rank_stride = {1, 3, 0}, .replicas = 1};
    assert_int_equal(ferry_manifest_add_split(m, &s, &err), 0);
    ferry_fragment f = {.tensor = 0, .rank = 5, .shape = {4, 2, 2}, .has_strides = true, .strides = {1, 8, 4},
                        .storage_offset = 3, .object = "gen/7/obj", .object_offset = 4096, .replica = 2};
    assert_int_equal(ferry_manifest_add_fragment(m, &f, &err), 0);
    ferry_fragment sc = {.tensor = 1, .rank = 4};
    assert_int_equal(ferry_manifest_add_fragment(m, &sc, &err), 0);
    ferry_split s2 = {.tensor = 0, .whole = true, .parts = {2, 1, 1}, .rank_stride = {1}, .rank = 2,
                      .replicas = 2, .replica_stride = 2, .replica = 5};
    assert_int_equal(ferry_manifest_add_split(m, &s2, &err), 0);
    return m;
}

static void test_json_round_trip(void **state)
{
    (void)state;
    ferry_manifest *a = sample(), *b;
    ferry_error err = {0};
    char *text = ferry_manifest_to_json(a);
    assert_non_null(text);
    int rc = ferry_manifest_from_json(text, strlen(text), &b, &err);
    if (rc < 0)
        fail_msg("%s", err.msg);
    uint8_t da[16], db[16];
    ferry_manifest_digest(a, da);
    ferry_manifest_digest(b, db);
    assert_memory_equal(da, db, 16);
    ferry_manifest_topology_digest(a, da);
    ferry_manifest_topology_digest(b, db);
    assert_memory_equal(da, db, 16);
    char *text2 = ferry_manifest_to_json(b);
    assert_string_equal(text, text2);
    assert_int_equal(ferry_manifest_fragment_count(a), ferry_manifest_fragment_count(b));
    for (uint64_t id = 0; id < ferry_manifest_fragment_count(a); id++) {
        ferry_fragment x, y;
        ferry_manifest_fragment(a, id, &x);
        ferry_manifest_fragment(b, id, &y);
        assert_int_equal(x.rank, y.rank);
        assert_int_equal(x.node, y.node);
        assert_int_equal(x.replica, y.replica);
        assert_memory_equal(x.offset, y.offset, sizeof x.offset);
        assert_memory_equal(x.shape, y.shape, sizeof x.shape);
        assert_memory_equal(x.strides, y.strides, sizeof x.strides);
        assert_int_equal(x.storage_offset, y.storage_offset);
        assert_true((x.object == NULL) == (y.object == NULL));
        if (x.object)
            assert_string_equal(x.object, y.object);
    }
    free(text);
    free(text2);

    /* Save and load through a file. */
    char path[] = "/tmp/ferry-manifest-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ferry_manifest_save(a, path, &err), 0);
    ferry_manifest *c;
    assert_int_equal(ferry_manifest_load(path, &c, &err), 0);
    uint8_t dc[16];
    ferry_manifest_digest(a, da);
    ferry_manifest_digest(c, dc);
    assert_memory_equal(da, dc, 16);
    unlink(path);
    assert_int_equal(ferry_manifest_load(path, &c, &err), FERRY_ENOENT);
    assert_non_null(strstr(err.msg, path));
    ferry_manifest_close(c);
    ferry_manifest_close(a);
    ferry_manifest_close(b);
}

static void test_json_hand_written(void **state)
{
    (void)state;
    const char *text =
        "{\"format\":\"ferry.manifest\",\"version\":1,\"topology\":{\"ranks\":16,\"gpus_per_node\":4},"
        "\"tensors\":[{\"name\":\"emb\",\"dtype\":\"bf16\",\"shape\":[100,8]}],"
        "\"fragments\":[{\"tensor\":\"emb\",\"rank\":0,\"node\":0,\"offset\":[0,0],\"shape\":[50,8]},"
        "{\"tensor\":0,\"split\":{\"offset\":[50,0],\"shape\":[50,8],\"parts\":[3,1],\"rank\":5,\"rank_stride\":[4,0]}}]}";
    ferry_manifest *m;
    ferry_error err = {0};
    int rc = ferry_manifest_from_json(text, strlen(text), &m, &err);
    if (rc < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(ferry_manifest_fragment_count(m), 4);
    ferry_fragment f;
    ferry_manifest_fragment(m, 3, &f);
    assert_int_equal(f.rank, 13);
    assert_int_equal(f.node, 3);
    assert_int_equal(f.offset[0], 84);
    assert_int_equal(f.shape[0], 16);
    ferry_manifest_close(m);
}

static void expect_bad(const char *text, const char *needle)
{
    ferry_manifest *m = NULL;
    ferry_error err = {0};
    int rc = ferry_manifest_from_json(text, strlen(text), &m, &err);
    if (rc >= 0)
        fail_msg("accepted: %s", text);
    assert_int_equal(err.code, rc);
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    assert_null(m);
}

#define HEAD "{\"format\":\"ferry.manifest\",\"version\":1,\"topology\":{\"ranks\":4},"
#define TENS "\"tensors\":[{\"name\":\"w\",\"dtype\":\"f32\",\"shape\":[8,4]}],"

static void test_json_malformed(void **state)
{
    (void)state;
    expect_bad("{", "manifest");
    expect_bad("[]", "must be an object");
    expect_bad("{\"format\":\"other\",\"version\":1}", "format");
    expect_bad("{\"format\":\"ferry.manifest\",\"version\":2,\"topology\":{\"ranks\":1},\"tensors\":[],\"fragments\":[]}",
               "version 2");
    expect_bad(HEAD TENS "\"fragments\":[], \"extra\":1}", "unknown key 'extra'");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"rank\":0,\"offset\":[0,0],\"shape\":[8,4],\"typo\":1}]}",
               "fragments[0]: unknown key 'typo'");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":3,\"rank\":0,\"offset\":[0,0],\"shape\":[8,4]}]}", "out of range");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":\"v\",\"rank\":0,\"offset\":[0,0],\"shape\":[8,4]}]}",
               "no tensor named 'v'");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"rank\":-1,\"offset\":[0,0],\"shape\":[8,4]}]}", "'rank'");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"rank\":0,\"offset\":[0],\"shape\":[8,4]}]}", "'offset'");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"rank\":0,\"offset\":[0,1],\"shape\":[8,4]}]}",
               "outside the tensor shape");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"rank\":9,\"offset\":[0,0],\"shape\":[8,4]}]}",
               "outside the topology");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"rank\":1,\"node\":3,\"offset\":[0,0],\"shape\":[8,4]}]}",
               "disagrees with the topology");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"split\":{\"rank\":0,\"parts\":[8,1],\"rank_stride\":[1,0]}}]}",
               "outside the topology");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"split\":{\"rank\":0,\"offset\":[0,0]}}]}", "come together");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"split\":{\"rank\":0,\"parts\":[2,1]}}]}",
               "needs 'rank_stride'");
    expect_bad(HEAD TENS "\"fragments\":[{\"tensor\":0,\"rank\":0,\"split\":{\"rank\":0}}]}", "only 'tensor' and 'split'");
    expect_bad(HEAD "\"tensors\":[{\"name\":\"w\",\"dtype\":\"f32\",\"itemsize\":2,\"shape\":[8]}],\"fragments\":[]}",
               "does not match dtype");
    expect_bad(HEAD "\"tensors\":[{\"name\":\"w\",\"dtype\":\"q4\",\"shape\":[8]}],\"fragments\":[]}", "unknown dtype");
    expect_bad(HEAD "\"tensors\":[{\"name\":\"w\",\"dtype\":\"f32\",\"shape\":[1,2,3,4,5,6,7,8,9]}],\"fragments\":[]}",
               "'shape'");
    expect_bad("{\"format\":\"ferry.manifest\",\"version\":1,\"topology\":{\"nodes\":[]},\"tensors\":[],\"fragments\":[]}",
               "'nodes'");
    expect_bad("{\"format\":\"ferry.manifest\",\"version\":1,\"topology\":{\"ranks\":0},\"tensors\":[],\"fragments\":[]}",
               "'ranks'");
    expect_bad("{\"format\":\"ferry.manifest\",\"version\":1,\"format\":\"x\"}", "duplicate");
}


/* The stored form keeps copy 0 of every box, contiguous, in the new dtype;
 * the packing puts every rank's fragments in id order, aligned, in objects
 * no larger than the cap unless one fragment is larger itself. */
static void test_stored_and_pack(void **state)
{
    (void)state;
    ferry_manifest *m, *s;
    ferry_error err = {0};
    assert_int_equal(ferry_manifest_create(4, NULL, 2, &m), 0);
    add_tensor(m, "w", "f32", 2, (uint64_t)10, (uint64_t)6);   /* 240 B */
    add_tensor(m, "b", "f32", 1, (uint64_t)7);                 /* 28 B */
    /* w: 3 dim-0 pieces (4, 4, 2 rows) on ranks 0..2, a second copy on 1..3 */
    ferry_split sp = {.tensor = 0, .whole = true, .parts = {3, 1}, .rank = 0,
                      .rank_stride = {1, 0}, .replicas = 2, .replica_stride = 1};
    assert_int_equal(ferry_manifest_add_split(m, &sp, &err), 0);
    /* b: whole on rank 3 with strides (padded), copy 1 on rank 0 */
    ferry_fragment f = {.tensor = 1, .rank = 3, .shape = {7}, .has_strides = true,
                        .strides = {2}};
    assert_int_equal(ferry_manifest_add_fragment(m, &f, &err), 0);
    f.rank = 0;
    f.replica = 1;
    f.has_strides = false;
    assert_int_equal(ferry_manifest_add_fragment(m, &f, &err), 0);
    assert_int_equal(ferry_manifest_fragment_count(m), 8);

    assert_int_equal(ferry_manifest_stored(m, "bf16", &s, &err), 0);
    assert_int_equal(ferry_manifest_fragment_count(s), 4);   /* 3 pieces of w, b once */
    ferry_tensor_desc td;
    assert_int_equal(ferry_manifest_tensor(s, 0, &td), 0);
    assert_string_equal(td.dtype, "bf16");
    assert_int_equal(td.itemsize, 2);
    ferry_fragment g;
    assert_int_equal(ferry_manifest_fragment(s, 3, &g), 0);
    assert_int_equal(g.rank, 3);
    assert_false(g.has_strides);
    assert_int_equal(ferry_manifest_fragment(s, 2, &g), 0);
    assert_int_equal(g.offset[0], 8);
    assert_int_equal(g.shape[0], 2);
    ferry_manifest *bad = (ferry_manifest *)&g;   /* overwritten with NULL on failure */
    assert_int_equal(ferry_manifest_stored(m, "float", &bad, &err), FERRY_EINVAL);
    assert_null(bad);

    /* 64-byte alignment, 64-byte objects: w's 48-byte pieces one per object. */
    ferry_pack *p;
    assert_int_equal(ferry_manifest_pack(m, 64, 64, &p, &err), 0);
    ferry_packed k;
    assert_int_equal(ferry_pack_fragment(p, 0, &k), 0);   /* w piece 0, copy 0: rank 0 */
    assert_int_equal(k.rank, 0);
    assert_int_equal(k.object, 0);
    assert_int_equal(k.offset, 0);
    assert_int_equal(k.bytes, 96);
    assert_int_equal(ferry_pack_fragment(p, 7, &k), 0);   /* b copy 1 on rank 0 */
    assert_int_equal(k.rank, 0);
    assert_int_equal(k.object, 1);                        /* 96 + 28 > 64: a new object */
    assert_int_equal(k.offset, 0);
    assert_int_equal(k.bytes, 28);
    assert_int_equal(ferry_pack_objects(p, 0), 2);
    assert_int_equal(ferry_pack_object_bytes(p, 0, 0), 96);
    assert_int_equal(ferry_pack_fragment(p, 5, &k), 0);   /* w piece 2 copy 1: rank 3 */
    assert_int_equal(k.rank, 3);
    assert_int_equal(ferry_pack_fragment(p, 6, &k), 0);   /* b copy 0 on rank 3 after it */
    assert_int_equal(k.rank, 3);
    assert_int_equal(k.object, 1);                        /* 48 -> 64 aligned + 28 > 64: a new one */
    ferry_pack_free(p);
    /* Large objects: everything of a rank in one, aligned. */
    assert_int_equal(ferry_manifest_pack(m, 64, 1 << 20, &p, &err), 0);
    assert_int_equal(ferry_pack_fragment(p, 7, &k), 0);
    assert_int_equal(k.object, 0);
    assert_int_equal(k.offset, 128);   /* after rank 0's 96-byte piece, aligned */
    assert_int_equal(ferry_pack_fragment(p, 6, &k), 0);
    assert_int_equal(k.offset, 64);    /* after rank 3's 48-byte piece of w */
    assert_int_equal(ferry_pack_fragment(p, 8, &k), FERRY_EINVAL);
    ferry_pack_free(p);
    ferry_manifest_close(s);
    ferry_manifest_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_topology),
        cmocka_unit_test(test_fragments_and_splits),
        cmocka_unit_test(test_digest),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_json_hand_written),
        cmocka_unit_test(test_json_malformed),
        cmocka_unit_test(test_stored_and_pack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
