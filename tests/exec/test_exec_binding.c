/* Runtime binding manifests: validation (one negative test per rule, each
 * naming the fragment), digests, JSON round trips, and attested plans that
 * refuse stale or foreign bindings. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/exec.h"

/* A 6x4 f32 tensor split in parts0 row blocks, one per rank. */
static ferry_manifest *placement(uint32_t parts0)
{
    ferry_manifest *m;
    ferry_error err = {0};
    assert_int_equal(ferry_manifest_create(parts0, NULL, 8, &m), 0);
    ferry_tensor_desc t = {.name = "w", .dtype = "f32", .itemsize = 4, .ndim = 2, .shape = {6, 4}};
    assert_int_equal(ferry_manifest_add_tensor(m, &t, &err), 0);
    ferry_split s = {.tensor = 0, .whole = true, .parts = {parts0, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(m, &s, &err), 0);
    return m;
}

static ferry_binding_entry entry(uint64_t fragment, uint32_t worker)
{
    ferry_binding_entry e = {
        .fragment = fragment, .addr = 0x100000 + fragment * 0x1000, .nbytes = 48, .worker = worker,
        .kind = FERRY_MEM_HOST, .itemsize = 4, .ndim = 2, .shape = {3, 4}, .strides = {4, 1},
        .storage_offset = 0, .desc_len = 3, .desc = {0xde, 0xad, 0x01},
    };
    return e;
}

static ferry_binding *binding(ferry_manifest *m, uint64_t gen)
{
    ferry_binding *b;
    assert_int_equal(ferry_binding_create(m, 0xabcdef0123456789ull, gen, 77, &b, NULL), 0);
    for (uint64_t f = 0; f < ferry_manifest_fragment_count(m); f++) {
        ferry_binding_entry e = entry(f, (uint32_t)f);
        assert_int_equal(ferry_binding_add(b, &e, NULL), 0);
    }
    return b;
}

/* Expect `e` refused with `code` and a message naming fragment `frag`. */
static void refused(ferry_binding *b, const ferry_binding_entry *e, int code, const char *frag)
{
    ferry_error err = {0};
    assert_int_equal(ferry_binding_add(b, e, &err), code);
    assert_int_equal(err.code, code);
    if (strstr(err.msg, frag) == NULL)
        fail_msg("message \"%s\" does not name %s", err.msg, frag);
}

static void test_validation_rules(void **state)
{
    (void)state;
    ferry_manifest *m = placement(2);
    ferry_binding *b;
    assert_int_equal(ferry_binding_create(m, 1, 1, 1, &b, NULL), 0);
    ferry_binding_entry e;

    e = entry(2, 0);                       /* no such fragment */
    refused(b, &e, FERRY_ENOENT, "fragment 2");
    e = entry(1, 0); e.itemsize = 2;       /* itemsize */
    refused(b, &e, FERRY_EINVAL, "fragment 1");
    e = entry(1, 0); e.ndim = 1;           /* rank of the shape */
    refused(b, &e, FERRY_EINVAL, "fragment 1");
    e = entry(1, 0); e.shape[0] = 2;       /* shape */
    refused(b, &e, FERRY_EINVAL, "fragment 1");
    e = entry(1, 0); e.strides[0] = 0;     /* aliasing stride */
    refused(b, &e, FERRY_EINVAL, "fragment 1");
    e = entry(1, 0); e.strides[0] = 5;     /* last element past nbytes: (2*5+3+1)*4 = 56 > 48 */
    refused(b, &e, FERRY_ERANGE, "fragment 1");
    e = entry(1, 0); e.storage_offset = 1; /* offset pushes the last element out */
    refused(b, &e, FERRY_ERANGE, "fragment 1");
    e = entry(1, 0); e.strides[0] = UINT64_MAX / 2;   /* stride arithmetic overflows */
    refused(b, &e, FERRY_ERANGE, "fragment 1");
    e = entry(1, 0); e.storage_offset = UINT64_MAX;   /* span overflows */
    refused(b, &e, FERRY_ERANGE, "fragment 1");
    e = entry(1, 0); e.addr = UINT64_MAX - 10;        /* addr + nbytes overflows */
    refused(b, &e, FERRY_ERANGE, "fragment 1");
    e = entry(1, 0); e.kind = (enum ferry_mem_kind)7; /* device kind */
    refused(b, &e, FERRY_EINVAL, "fragment 1");
    e = entry(1, 0); e.desc_len = FERRY_DESC_MAX + 1; /* descriptor */
    refused(b, &e, FERRY_EMSGSIZE, "fragment 1");

    /* Padded and transposed storage that stays inside nbytes is fine. */
    e = entry(1, 0); e.strides[0] = 5; e.nbytes = 56;
    assert_int_equal(ferry_binding_add(b, &e, NULL), 0);
    e = entry(1, 0);                       /* duplicate */
    refused(b, &e, FERRY_EEXIST, "fragment 1");
    e = entry(0, 0); e.strides[0] = 1; e.strides[1] = 3;   /* column-major 3x4 */
    assert_int_equal(ferry_binding_add(b, &e, NULL), 0);
    assert_int_equal(ferry_binding_count(b), 2);
    assert_non_null(ferry_binding_find(b, 0));
    assert_int_equal(ferry_binding_find(b, 1)->strides[0], 5);
    assert_null(ferry_binding_find(b, 2));
    ferry_binding_free(b);
    ferry_manifest_close(m);
}

static void test_digest(void **state)
{
    (void)state;
    ferry_manifest *m = placement(2);
    ferry_binding *a = binding(m, 3), *b;
    uint8_t da[16], db[16];
    ferry_binding_digest(a, da);

    /* Same entries added in the other order: same digest. */
    assert_int_equal(ferry_binding_create(m, 0xabcdef0123456789ull, 3, 77, &b, NULL), 0);
    ferry_binding_entry e1 = entry(1, 1), e0 = entry(0, 0);
    assert_int_equal(ferry_binding_add(b, &e1, NULL), 0);
    assert_int_equal(ferry_binding_add(b, &e0, NULL), 0);
    ferry_binding_digest(b, db);
    assert_memory_equal(da, db, 16);
    ferry_binding_free(b);

    /* Each field changes the digest. */
    for (int field = 0; field < 4; field++) {
        assert_int_equal(ferry_binding_create(m, 0xabcdef0123456789ull, field == 0 ? 4 : 3,
                                              field == 1 ? 78 : 77, &b, NULL), 0);
        ferry_binding_entry x = entry(0, 0), y = entry(1, 1);
        if (field == 2) x.addr += 4;
        if (field == 3) y.desc[2] = 2;
        assert_int_equal(ferry_binding_add(b, &x, NULL), 0);
        assert_int_equal(ferry_binding_add(b, &y, NULL), 0);
        ferry_binding_digest(b, db);
        assert_memory_not_equal(da, db, 16);
        ferry_binding_free(b);
    }
    ferry_binding_free(a);
    ferry_manifest_close(m);
}

static void test_json_roundtrip(void **state)
{
    (void)state;
    ferry_manifest *m = placement(2);
    ferry_binding *a;
    assert_int_equal(ferry_binding_create(m, UINT64_MAX - 1, 9, 0x8000000000000001ull, &a, NULL), 0);
    ferry_binding_entry e = entry(1, 5);
    e.addr = 0xfffffff000000000ull; e.strides[0] = 5; e.nbytes = 64; e.storage_offset = 2;
    e.kind = FERRY_MEM_DEVICE;
    assert_int_equal(ferry_binding_add(a, &e, NULL), 0);
    e = entry(0, 4); e.desc_len = 0;
    assert_int_equal(ferry_binding_add(a, &e, NULL), 0);

    char *text = ferry_binding_to_json(a);
    assert_non_null(text);
    ferry_binding *b;
    ferry_error err = {0};
    if (ferry_binding_from_json(text, strlen(text), m, &b, &err) < 0)
        fail_msg("%s", err.msg);
    uint8_t da[16], db[16];
    ferry_binding_digest(a, da);
    ferry_binding_digest(b, db);
    assert_memory_equal(da, db, 16);
    assert_int_equal(ferry_binding_instance(b), UINT64_MAX - 1);
    assert_int_equal(ferry_binding_lease(b), 0x8000000000000001ull);
    assert_int_equal(ferry_binding_generation(b), 9);
    const ferry_binding_entry *g = ferry_binding_find(b, 1);
    assert_int_equal(g->addr, 0xfffffff000000000ull);
    assert_int_equal(g->kind, FERRY_MEM_DEVICE);
    assert_int_equal(g->desc_len, 3);
    char *again = ferry_binding_to_json(b);
    assert_string_equal(text, again);
    free(again);
    ferry_binding_free(b);

    /* The same text against another placement is refused. */
    ferry_manifest *other = placement(3);
    assert_int_equal(ferry_binding_from_json(text, strlen(text), other, &b, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "placement"));
    ferry_manifest_close(other);
    free(text);
    ferry_binding_free(a);
    ferry_manifest_close(m);
}

static void test_json_errors(void **state)
{
    (void)state;
    ferry_manifest *m = placement(2);
    ferry_binding *a = binding(m, 1), *b = NULL;
    char *text = ferry_binding_to_json(a);
    assert_non_null(text);
    ferry_error err = {0};
    /* Edit one field of the text and expect a message naming fragment 1. */
    static const struct { const char *from, *to; } edits[] = {
        {"\"shape\": [\n    3,", "\"shape\": [\n    2,"},
        {"\"itemsize\": 4,\n   \"shape\": [\n    3,\n    4\n   ],\n   \"strides\": [\n    4,\n    1\n   ],\n   \"storage_offset\": 0,\n   \"desc\": \"dead01\"\n  }\n ]",
         "\"itemsize\": 2,\n   \"shape\": [\n    3,\n    4\n   ],\n   \"strides\": [\n    4,\n    1\n   ],\n   \"storage_offset\": 0,\n   \"desc\": \"dead01\"\n  }\n ]"},
        {"\"kind\": \"host\",\n   \"itemsize\": 4,\n   \"shape\": [\n    3,\n    4\n   ],\n   \"strides\": [\n    4,\n    1\n   ],\n   \"storage_offset\": 0,\n   \"desc\": \"dead01\"\n  }\n ]",
         "\"kind\": \"tpu\",\n   \"itemsize\": 4,\n   \"shape\": [\n    3,\n    4\n   ],\n   \"strides\": [\n    4,\n    1\n   ],\n   \"storage_offset\": 0,\n   \"desc\": \"dead01\"\n  }\n ]"},
        {"\"storage_offset\": 0,\n   \"desc\": \"dead01\"\n  }\n ]", "\"storage_offset\": 1,\n   \"desc\": \"dead01\"\n  }\n ]"},
        {"\"desc\": \"dead01\"\n  }\n ]", "\"desc\": \"dead0\"\n  }\n ]"},
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        const char *at = i == 0 ? strstr(strstr(text, "\"fragment\": 1"), edits[i].from) : strstr(text, edits[i].from);
        if (at == NULL)
            fail_msg("edit %zu: pattern not found in\n%s", i, text);
        size_t pre = (size_t)(at - text), fl = strlen(edits[i].from), tl = strlen(edits[i].to);
        char *bad = malloc(strlen(text) + tl + 1);
        memcpy(bad, text, pre);
        strcpy(bad + pre, edits[i].to);
        strcat(bad, at + fl);
        int rc = ferry_binding_from_json(bad, strlen(bad), m, &b, &err);
        assert_true(rc < 0);
        assert_null(b);
        if (strstr(err.msg, "fragment 1") == NULL)
            fail_msg("edit %zu: message \"%s\" does not name fragment 1", i, err.msg);
        free(bad);
    }
    const char *junk[] = {"", "[]", "{\"format\":\"ferry-binding\",\"version\":2}", "{\"format\":\"x\"}"};
    for (size_t i = 0; i < 4; i++)
        assert_true(ferry_binding_from_json(junk[i], strlen(junk[i]), m, &b, &err) < 0);
    free(text);
    ferry_binding_free(a);
    ferry_manifest_close(m);
}

static void test_attest(void **state)
{
    (void)state;
    ferry_manifest *src = placement(2), *dst = placement(3);
    ferry_plan *p;
    ferry_error err = {0};
    assert_int_equal(ferry_plan_create(src, dst, NULL, &p, &err), 0);
    ferry_binding *bs = binding(src, 5), *bd;
    assert_int_equal(ferry_binding_create(dst, 2, 5, 2, &bd, NULL), 0);
    for (uint64_t f = 0; f < 3; f++) {
        ferry_binding_entry e = entry(f, 10 + (uint32_t)f);
        e.shape[0] = 2; e.nbytes = 32;
        assert_int_equal(ferry_binding_add(bd, &e, NULL), 0);
    }
    ferry_attested_plan *a;
    /* Wrong generation, swapped sides: refused at attestation. */
    assert_int_equal(ferry_attest(p, bs, bd, 6, &a, &err), FERRY_ESTALE);
    assert_int_equal(ferry_attest(p, bd, bs, 5, &a, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "placement"));
    assert_int_equal(ferry_attest(p, bs, bd, 5, &a, &err), 0);
    assert_int_equal(ferry_attested_check(a, bs, bd, &err), 0);
    assert_int_equal(ferry_attested_check(a, bs, NULL, &err), 0);

    /* A binding changed after attestation is stale. */
    ferry_binding *bs2;
    assert_int_equal(ferry_binding_create(src, 0xabcdef0123456789ull, 5, 77, &bs2, NULL), 0);
    ferry_binding_entry e = entry(0, 0);
    e.addr += 8; e.nbytes += 8;
    assert_int_equal(ferry_binding_add(bs2, &e, NULL), 0);
    assert_int_equal(ferry_attested_check(a, bs2, bd, &err), FERRY_ESTALE);
    assert_non_null(strstr(err.msg, "stale"));
    /* A newer generation of the same process is stale. */
    ferry_binding *bs6 = binding(src, 6);
    assert_int_equal(ferry_attested_check(a, bs6, bd, &err), FERRY_ESTALE);
    assert_non_null(strstr(err.msg, "generation"));
    /* A binding of another placement does not belong to the plan. */
    assert_int_equal(ferry_attested_check(a, bd, NULL, &err), FERRY_EINVAL);
    assert_int_equal(ferry_attested_check(a, NULL, bs, &err), FERRY_EINVAL);

    /* Lowering with a stale binding fails before producing anything. */
    uint32_t w = 10;
    ferry_peer_map pm[2] = {{.worker = 0, .peer = 1, .key = 9}, {.worker = 1, .peer = 2, .key = 9}};
    ferry_lower_args args = {.mode = FERRY_EXEC_READER, .workers = &w, .nworkers = 1,
                             .peers = pm, .npeers = 2, .limits = {.max_ops = 4, .max_bytes = 1024}};
    ferry_batch_list out;
    assert_int_equal(ferry_exec_lower(a, bs6, bd, &args, &out, &err), FERRY_ESTALE);
    assert_int_equal(out.nops, 0);
    assert_null(out.ops);
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &out, &err), 0);
    assert_true(out.nops > 0);
    ferry_batch_list_free(&out);

    ferry_binding_free(bs6);
    ferry_binding_free(bs2);
    ferry_attested_free(a);
    ferry_attested_free(NULL);
    ferry_plan_free(p);   /* the attestation held its own reference until now */
    ferry_binding_free(bs);
    ferry_binding_free(bd);
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validation_rules),
        cmocka_unit_test(test_digest),
        cmocka_unit_test(test_json_roundtrip),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_attest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
