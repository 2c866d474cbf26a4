/* Layout strings, model presets and the placements layouts build: FSDP,
 * TP column/row/vocab/replicated, EP ownership, PP stages, DP replicas and
 * their products. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/reshard.h"

/* ---- layout strings ------------------------------------------------------- */

static void test_layout_parse(void **state)
{
    (void)state;
    ferry_layout l;
    ferry_error err = {0};
    char buf[64];
    assert_int_equal(ferry_layout_parse("fsdp:256", &l, &err), 0);
    assert_int_equal(l.fsdp, 256);
    assert_int_equal(l.tp, 1);
    assert_int_equal(ferry_layout_ranks(&l), 256);
    assert_int_equal(ferry_layout_parse("tp:8,dp:16", &l, &err), 0);
    assert_int_equal(ferry_layout_ranks(&l), 128);
    assert_true(ferry_layout_format(&l, buf, sizeof buf) > 0);
    assert_string_equal(buf, "dp:16,tp:8");
    assert_int_equal(ferry_layout_parse("ep:32,tp:8", &l, &err), 0);
    assert_int_equal(l.ep, 32);
    assert_int_equal(ferry_layout_ranks(&l), 256);
    assert_int_equal(ferry_layout_parse("pp:4,tp:8,gpn:4,node:3", &l, &err), 0);
    assert_int_equal(l.pp, 4);
    assert_int_equal(l.gpus_per_node, 4);
    assert_int_equal(l.first_node, 3);
    ferry_layout_format(&l, buf, sizeof buf);
    assert_string_equal(buf, "pp:4,tp:8,gpn:4,node:3");
    ferry_layout back;
    assert_int_equal(ferry_layout_parse(buf, &back, &err), 0);
    assert_memory_equal(&l, &back, sizeof l);
    assert_int_equal(ferry_layout_parse("replicated", &l, &err), 0);
    assert_int_equal(ferry_layout_ranks(&l), 1);
    ferry_layout_format(&l, buf, sizeof buf);
    assert_string_equal(buf, "replicated");
    assert_int_equal(ferry_layout_format(&l, buf, 4), FERRY_ENOSPC);

    static const char *bad[] = {"", "fsdp:0", "tp:8,tp:4", "foo:2", "tp:", "tp:8,", "tp:-1", "tp:+2", "tp:8x",
                                "tp:99999999999", "ep:4096,tp:8192", "tp", ",tp:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        assert_int_equal(ferry_layout_parse(bad[i], &l, &err), FERRY_EINVAL);
        assert_true(strlen(err.msg) > 10);
    }
}

/* ---- presets -------------------------------------------------------------- */

static uint64_t shape_of(const ferry_model *m, const char *name, int dim)
{
    for (size_t i = 0; i < ferry_model_tensor_count(m); i++) {
        ferry_model_tensor t;
        ferry_model_tensor_at(m, i, &t);
        if (!strcmp(t.desc.name, name))
            return t.desc.shape[dim];
    }
    fail_msg("no tensor %s", name);
    return 0;
}

static void test_presets(void **state)
{
    (void)state;
    static const struct { const char *name; uint64_t lo, hi; size_t tensors; } want[] = {
        {"qwen3-8b", 8150000000ull, 8250000000ull, 3 + 36 * 11},                  /* published 8.2B */
        {"qwen3-30b-a3b", 30300000000ull, 30700000000ull, 3 + 48 * (9 + 128 * 3)}, /* 30.5B */
        {"deepseek-v3", 668000000000ull, 674000000000ull, 3 + 61 * 9 + 3 * 3 + 58 * (2 + 257 * 3)}, /* 671B */
        {"kimi-k2", 1020000000000ull, 1040000000000ull, 3 + 61 * 9 + 1 * 3 + 60 * (2 + 385 * 3)},  /* 1.03T */
    };
    ferry_error err = {0};
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(ferry_model_preset_name(i), want[i].name);
        ferry_model *m;
        assert_int_equal(ferry_model_preset(want[i].name, &m, &err), 0);
        uint64_t n = ferry_model_param_count(m);
        if (n < want[i].lo || n > want[i].hi)
            fail_msg("%s: %llu parameters", want[i].name, (unsigned long long)n);
        assert_int_equal(ferry_model_bytes(m), 2 * n);   /* bf16 */
        assert_int_equal(ferry_model_tensor_count(m), want[i].tensors);
        ferry_model_free(m);
    }
    assert_null(ferry_model_preset_name(4));
    ferry_model *m;
    assert_int_equal(ferry_model_preset("llama-9", &m, &err), FERRY_ENOENT);
    assert_non_null(strstr(err.msg, "llama-9"));

    assert_int_equal(ferry_model_preset("qwen3-8b", &m, NULL), 0);
    assert_int_equal(shape_of(m, "model.layers.0.self_attn.k_proj.weight", 0), 1024);
    assert_int_equal(shape_of(m, "model.layers.35.self_attn.q_norm.weight", 0), 128);
    assert_int_equal(shape_of(m, "lm_head.weight", 0), 151936);
    ferry_model_free(m);
    assert_int_equal(ferry_model_preset("qwen3-30b-a3b", &m, NULL), 0);
    assert_int_equal(shape_of(m, "model.layers.47.mlp.experts.127.down_proj.weight", 1), 768);
    assert_int_equal(shape_of(m, "model.layers.0.mlp.gate.weight", 0), 128);
    assert_int_equal(shape_of(m, "model.layers.0.self_attn.o_proj.weight", 1), 4096);
    ferry_model_free(m);
    assert_int_equal(ferry_model_preset("deepseek-v3", &m, NULL), 0);
    assert_int_equal(ferry_model_experts(m), 256);
    assert_int_equal(shape_of(m, "model.layers.2.mlp.down_proj.weight", 1), 18432);
    assert_int_equal(shape_of(m, "model.layers.3.mlp.shared_experts.gate_proj.weight", 0), 2048);
    assert_int_equal(shape_of(m, "model.layers.60.self_attn.q_b_proj.weight", 0), 128 * 192);
    assert_int_equal(shape_of(m, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 0), 576);
    assert_int_equal(shape_of(m, "model.layers.0.self_attn.kv_b_proj.weight", 0), 128 * 256);
    ferry_model_free(m);
    assert_int_equal(ferry_model_preset("kimi-k2", &m, NULL), 0);
    assert_int_equal(ferry_model_experts(m), 384);
    assert_int_equal(shape_of(m, "model.layers.1.mlp.experts.383.gate_proj.weight", 0), 2048);
    assert_int_equal(shape_of(m, "model.layers.0.mlp.gate_proj.weight", 0), 18432);
    assert_int_equal(shape_of(m, "model.layers.5.self_attn.o_proj.weight", 1), 64 * 128);
    assert_int_equal(shape_of(m, "model.embed_tokens.weight", 0), 163840);
    ferry_model_free(m);
}

static void test_model_rules(void **state)
{
    (void)state;
    ferry_model *m;
    ferry_error err = {0};
    assert_int_equal(ferry_model_create("tiny", 2, 2, &m), 0);
    ferry_model_tensor t = {.desc = {.name = "n", .dtype = "bf16", .itemsize = 2, .ndim = 1, .shape = {4}},
                            .role = FERRY_TP_ROW, .layer = 0, .expert = -1};
    assert_int_equal(ferry_model_add_tensor(m, &t, &err), FERRY_EINVAL);   /* row split of 1-D */
    t.role = FERRY_TP_REPLICATED;
    t.layer = 2;
    assert_int_equal(ferry_model_add_tensor(m, &t, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "layer 2"));
    t.layer = 1;
    t.expert = 2;
    assert_int_equal(ferry_model_add_tensor(m, &t, &err), FERRY_EINVAL);
    t.expert = 1;
    assert_int_equal(ferry_model_add_tensor(m, &t, &err), 0);
    assert_int_equal(ferry_model_tensor_count(m), 1);
    ferry_model_free(m);
}

/* ---- placements ----------------------------------------------------------- */

/* tiny: 4 layers, 4 experts, hidden 8, vocab 10. */
static ferry_model *tiny(void)
{
    ferry_model *m;
    ferry_error err = {0};
    assert_int_equal(ferry_model_create("tiny", 4, 4, &m), 0);
    typedef struct { const char *name; uint64_t d0, d1; enum ferry_tp_role role; int layer, expert; } spec;
    spec v[64];
    size_t n = 0;
    v[n++] = (spec){"embed", 10, 8, FERRY_TP_VOCAB, FERRY_LAYER_FIRST, -1};
    static char names[64][32];
    for (int l = 0; l < 4; l++) {
        snprintf(names[n], 32, "l%d.norm", l);
        v[n] = (spec){names[n], 8, 0, FERRY_TP_REPLICATED, l, -1};
        n++;
        snprintf(names[n], 32, "l%d.q", l);
        v[n] = (spec){names[n], 8, 8, FERRY_TP_COLUMN, l, -1};
        n++;
        snprintf(names[n], 32, "l%d.o", l);
        v[n] = (spec){names[n], 8, 8, FERRY_TP_ROW, l, -1};
        n++;
        for (int e = 0; e < 4 && l == 3; e++) {
            snprintf(names[n], 32, "l3.e%d.gate", e);
            v[n] = (spec){names[n], 6, 8, FERRY_TP_COLUMN, l, e};
            n++;
            snprintf(names[n], 32, "l3.e%d.down", e);
            v[n] = (spec){names[n], 8, 6, FERRY_TP_ROW, l, e};
            n++;
        }
    }
    v[n++] = (spec){"norm", 8, 0, FERRY_TP_REPLICATED, FERRY_LAYER_LAST, -1};
    v[n++] = (spec){"lm_head", 10, 8, FERRY_TP_VOCAB, FERRY_LAYER_LAST, -1};
    for (size_t i = 0; i < n; i++) {
        ferry_model_tensor t = {.desc = {.name = v[i].name, .dtype = "bf16", .itemsize = 2, .ndim = v[i].d1 ? 2 : 1,
                                         .shape = {v[i].d0, v[i].d1}},
                                .role = v[i].role, .layer = v[i].layer, .expert = v[i].expert};
        assert_int_equal(ferry_model_add_tensor(m, &t, &err), 0);
    }
    return m;
}

static ferry_manifest *build(const ferry_model *m, const char *layout)
{
    ferry_layout l;
    ferry_manifest *man;
    ferry_error err = {0};
    assert_int_equal(ferry_layout_parse(layout, &l, &err), 0);
    if (ferry_layout_build(m, &l, &man, &err) < 0)
        fail_msg("%s: %s", layout, err.msg);
    return man;
}

/* The fragments of tensor `name` as "rank:r0+rows,c0+cols" sorted lines
 * compared against `want` (same format, ';'-separated, any order). */
static void expect_frags(const ferry_manifest *m, const char *name, const char *want)
{
    int ti = ferry_manifest_find_tensor(m, name);
    assert_true(ti >= 0);
    char got[64][48];
    size_t n = 0;
    for (uint64_t id = 0; id < ferry_manifest_fragment_count(m); id++) {
        ferry_fragment f;
        ferry_manifest_fragment(m, id, &f);
        if (f.tensor != (uint32_t)ti)
            continue;
        assert_true(n < 64);
        ferry_tensor_desc t;
        ferry_manifest_tensor(m, f.tensor, &t);
        if (t.ndim == 1)
            snprintf(got[n++], 48, "%u:%llu+%llu", f.rank, (unsigned long long)f.offset[0],
                     (unsigned long long)f.shape[0]);
        else
            snprintf(got[n++], 48, "%u:%llu+%llu,%llu+%llu", f.rank, (unsigned long long)f.offset[0],
                     (unsigned long long)f.shape[0], (unsigned long long)f.offset[1], (unsigned long long)f.shape[1]);
    }
    size_t k = 0;
    char w[1024];
    snprintf(w, sizeof w, "%s", want);
    for (char *save, *tok = strtok_r(w, ";", &save); tok; tok = strtok_r(NULL, ";", &save), k++) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            if (!strcmp(got[i], tok)) {
                found = true;
                got[i][0] = 0;
            }
        if (!found)
            fail_msg("%s: missing fragment %s", name, tok);
    }
    if (k != n)
        fail_msg("%s: %zu fragments, want %zu", name, n, k);
}

static void test_fsdp(void **state)
{
    (void)state;
    ferry_model *m = tiny();
    ferry_manifest *man = build(m, "fsdp:3");
    assert_int_equal(ferry_manifest_rank_count(man), 3);
    expect_frags(man, "l0.q", "0:0+3,0+8;1:3+3,0+8;2:6+2,0+8");
    expect_frags(man, "embed", "0:0+4,0+8;1:4+4,0+8;2:8+2,0+8");
    expect_frags(man, "l0.o", "0:0+3,0+8;1:3+3,0+8;2:6+2,0+8");   /* dim 0 for every tensor */
    ferry_manifest_close(man);
    man = build(m, "fsdp:6");   /* 8 rows over 6 ranks: chunks of 2, ranks 4 and 5 hold nothing */
    expect_frags(man, "l1.norm", "0:0+2;1:2+2;2:4+2;3:6+2");
    expect_frags(man, "l3.e0.gate", "0:0+1,0+8;1:1+1,0+8;2:2+1,0+8;3:3+1,0+8;4:4+1,0+8;5:5+1,0+8");
    ferry_manifest_close(man);
    man = build(m, "fsdp:11");   /* no tensor has 11 rows: rank 10 holds nothing */
    uint64_t b;
    ferry_manifest_rank_bytes(man, 10, &b);
    assert_int_equal(b, 0);
    ferry_manifest_rank_bytes(man, 9, &b);
    assert_int_equal(b, 2 * 8 * 2);   /* the last row of embed and of lm_head */
    ferry_manifest_close(man);
    ferry_model_free(m);
}

static void test_tp(void **state)
{
    (void)state;
    ferry_model *m = tiny();
    ferry_manifest *man = build(m, "tp:4");
    expect_frags(man, "embed", "0:0+3,0+8;1:3+3,0+8;2:6+3,0+8;3:9+1,0+8");   /* vocab, uneven */
    expect_frags(man, "l2.q", "0:0+2,0+8;1:2+2,0+8;2:4+2,0+8;3:6+2,0+8");    /* column */
    expect_frags(man, "l2.o", "0:0+8,0+2;1:0+8,2+2;2:0+8,4+2;3:0+8,6+2");    /* row */
    expect_frags(man, "l2.norm", "0:0+8;1:0+8;2:0+8;3:0+8");                /* replicated */
    expect_frags(man, "l3.e1.down", "0:0+8,0+2;1:0+8,2+2;2:0+8,4+2");   /* rank 3: nothing */
    ferry_manifest_close(man);
    ferry_model_free(m);
}

static void test_ep_tp(void **state)
{
    (void)state;
    ferry_model *m = tiny();
    ferry_manifest *man = build(m, "ep:2,tp:2");
    /* experts 0,1 on EP rank 0 (ranks 0,1); 2,3 on EP rank 1 (ranks 2,3) */
    expect_frags(man, "l3.e0.gate", "0:0+3,0+8;1:3+3,0+8");
    expect_frags(man, "l3.e1.down", "0:0+8,0+3;1:0+8,3+3");
    expect_frags(man, "l3.e2.gate", "2:0+3,0+8;3:3+3,0+8");
    expect_frags(man, "l3.e3.gate", "2:0+3,0+8;3:3+3,0+8");
    /* dense tensors: TP inside each EP rank, replicated across EP ranks */
    expect_frags(man, "l0.q", "0:0+4,0+8;1:4+4,0+8;2:0+4,0+8;3:4+4,0+8");
    expect_frags(man, "norm", "0:0+8;1:0+8;2:0+8;3:0+8");
    ferry_manifest_close(man);
    man = build(m, "ep:3");   /* expert e on EP rank e*3/4: 0,0,1,2 */
    expect_frags(man, "l3.e1.gate", "0:0+6,0+8");
    expect_frags(man, "l3.e2.gate", "1:0+6,0+8");
    expect_frags(man, "l3.e3.gate", "2:0+6,0+8");
    ferry_manifest_close(man);
    ferry_model_free(m);
}

static void test_pp_tp(void **state)
{
    (void)state;
    ferry_model *m = tiny();
    ferry_manifest *man = build(m, "pp:2,tp:2");
    expect_frags(man, "embed", "0:0+5,0+8;1:5+5,0+8");
    expect_frags(man, "l1.q", "0:0+4,0+8;1:4+4,0+8");
    expect_frags(man, "l2.q", "2:0+4,0+8;3:4+4,0+8");
    expect_frags(man, "l3.e3.down", "2:0+8,0+3;3:0+8,3+3");
    expect_frags(man, "lm_head", "2:0+5,0+8;3:5+5,0+8");
    expect_frags(man, "norm", "2:0+8;3:0+8");
    ferry_manifest_close(man);
    ferry_error err = {0};
    ferry_layout l;
    ferry_layout_parse("pp:5", &l, &err);
    assert_int_equal(ferry_layout_build(m, &l, &man, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "4 layers"));
    ferry_model_free(m);
}

static void test_tp_dp_and_fsdp_tp(void **state)
{
    (void)state;
    ferry_model *m = tiny();
    ferry_manifest *man = build(m, "tp:2,dp:3");
    expect_frags(man, "l0.q", "0:0+4,0+8;1:4+4,0+8;2:0+4,0+8;3:4+4,0+8;4:0+4,0+8;5:4+4,0+8");
    expect_frags(man, "l3.e2.gate", "0:0+3,0+8;1:3+3,0+8;2:0+3,0+8;3:3+3,0+8;4:0+3,0+8;5:3+3,0+8");
    /* DP copies are distinct fragments with distinct replica numbers */
    int ti = ferry_manifest_find_tensor(man, "l0.norm");
    uint32_t seen = 0;
    for (uint64_t id = 0; id < ferry_manifest_fragment_count(man); id++) {
        ferry_fragment f;
        ferry_manifest_fragment(man, id, &f);
        if (f.tensor == (uint32_t)ti) {
            assert_true(f.replica < 6);
            assert_false(seen & (1u << f.replica));
            seen |= 1u << f.replica;
        }
    }
    assert_int_equal(seen, 0x3f);
    ferry_manifest_close(man);
    man = build(m, "fsdp:2,tp:2");   /* rank = fsdp_i * 2 + tp_i */
    expect_frags(man, "l0.q", "0:0+2,0+8;2:2+2,0+8;1:4+2,0+8;3:6+2,0+8");
    expect_frags(man, "l0.o", "0:0+4,0+4;1:0+4,4+4;2:4+4,0+4;3:4+4,4+4");
    expect_frags(man, "l0.norm", "0:0+4;1:0+4;2:4+4;3:4+4");
    ferry_manifest_close(man);
    ferry_model_free(m);
}

/* Every layout of every small preset must be a valid source (disjoint or
 * declared copies, full coverage) and a valid target: plan to and from a
 * single rank holding everything. */
static void test_layouts_plan(void **state)
{
    (void)state;
    static const char *layouts[] = {"fsdp:8", "tp:8,dp:2", "ep:4,tp:2", "pp:4,tp:2", "fsdp:4,tp:2",
                                    "pp:2,dp:2,ep:2,tp:2", "replicated"};
    static const char *models[] = {"qwen3-8b", "qwen3-30b-a3b"};
    for (size_t mi = 0; mi < 2; mi++) {
        ferry_model *m;
        assert_int_equal(ferry_model_preset(models[mi], &m, NULL), 0);
        ferry_manifest *one = build(m, "replicated");
        for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
            ferry_manifest *man = build(m, layouts[li]);
            for (int dir = 0; dir < 2; dir++) {
                ferry_plan *p;
                ferry_error err = {0};
                if (ferry_plan_create(dir ? man : one, dir ? one : man, NULL, &p, &err) < 0)
                    fail_msg("%s %s %s: %s", models[mi], layouts[li], dir ? "->1" : "1->", err.msg);
                ferry_plan_stats st;
                ferry_plan_stats_get(p, &st);
                uint64_t sum = 0, b;
                ferry_manifest *dst = dir ? one : man;
                for (uint32_t r = 0; r < ferry_manifest_rank_count(dst); r++) {
                    ferry_manifest_rank_bytes(dst, r, &b);
                    sum += b;
                }
                assert_int_equal(st.bytes, sum);
                if (dir)
                    assert_int_equal(st.bytes, ferry_model_bytes(m));
                ferry_plan_free(p);
            }
            ferry_manifest_close(man);
        }
        ferry_manifest_close(one);
        ferry_model_free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_parse),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_model_rules),
        cmocka_unit_test(test_fsdp),
        cmocka_unit_test(test_tp),
        cmocka_unit_test(test_ep_tp),
        cmocka_unit_test(test_pp_tp),
        cmocka_unit_test(test_tp_dp_and_fsdp_tp),
        cmocka_unit_test(test_layouts_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
