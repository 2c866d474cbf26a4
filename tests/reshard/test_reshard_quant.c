/* Block quantization as a property of a layout (ferry_manifest_quantize):
 * the name rules, the derived scale tensor's name and shape, each worker's
 * scale rows and columns under TP row and column shards (placed and
 * planned), and the refusal of a layout whose shard boundary cuts a block. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/reshard.h"
#include "util/testutil.h"

static ferry_tensor_desc desc2(const char *name, const char *dtype, uint64_t r, uint64_t c)
{
    return (ferry_tensor_desc){ .name = name, .dtype = dtype, .itemsize = ferry_dtype_size(dtype),
                                .ndim = 2, .shape = { r, c } };
}

/* ---- rules ----------------------------------------------------------------------------- */

static void test_rules(void **state)
{
    (void)state;
    ferry_quant_rules r, z;
    assert_int_equal(ferry_quant_rules_init(NULL), FERRY_EINVAL);
    memset(&r, 0xa5, sizeof r);   /* init sets every field */
    assert_int_equal(ferry_quant_rules_init(&r), 0);
    assert_string_equal(r.include, FERRY_QUANT_INCLUDE);
    assert_string_equal(r.exclude, FERRY_QUANT_EXCLUDE);
    assert_int_equal(r.fp8.scale_format, FERRY_FP8_SCALE_F32);
    for (size_t i = 0; i < 8; i++)
        assert_int_equal(r.reserved[i], 0);
    memset(&z, 0, sizeof z);
    assert_string_equal(r.dtype, "f8e4m3");
    assert_string_equal(r.scale_name, "%s_scale_inv");
    assert_int_equal(r.fp8.block_rows, 128);
    assert_int_equal(r.fp8.block_cols, 128);
    ferry_error err = { 0 };
    static const struct { const char *name; int ndim; int want; } cases[] = {
        { "model.layers.0.self_attn.q_proj.weight", 2, 1 },
        { "model.layers.3.mlp.experts.5.gate_proj.weight", 2, 1 },
        { "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 2, 1 },
        { "model.layers.3.mlp.gate.weight", 2, 0 },   /* the MoE router */
        { "model.embed_tokens.weight", 2, 0 },
        { "lm_head.weight", 2, 0 },
        { "model.layers.0.input_layernorm.weight", 1, 0 },
        { "model.layers.0.self_attn.kv_a_layernorm.weight", 1, 0 },
        { "model.norm.weight", 1, 0 },
        { "model.layers.3.mlp.gate.e_score_correction_bias", 1, 0 },
        { "model.layers.0.self_attn.q_proj.bias", 1, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ferry_tensor_desc t = desc2(cases[i].name, "bf16", 256, 256);
        t.ndim = (uint32_t)cases[i].ndim;
        assert_int_equal(ferry_quant_rules_match(&r, &t, &err), cases[i].want);
        assert_int_equal(ferry_quant_rules_match(&z, &t, &err), cases[i].want);   /* zeroed */
        assert_int_equal(ferry_quant_rules_match(NULL, &t, &err), cases[i].want);
    }
    /* own rules: every tensor but the experts' */
    ferry_quant_rules o = r;
    o.include = "*";
    o.exclude = "*.experts.*,*norm*";
    ferry_tensor_desc t = desc2("model.layers.3.mlp.experts.5.up_proj.weight", "f32", 64, 64);
    assert_int_equal(ferry_quant_rules_match(&o, &t, &err), 0);
    t.name = "lm_head.weight";
    assert_int_equal(ferry_quant_rules_match(&o, &t, &err), 1);
    /* a selected tensor that cannot be quantized in blocks */
    t = desc2("x.bias", "bf16", 64, 1);
    t.ndim = 1;
    assert_int_equal(ferry_quant_rules_match(&o, &t, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "x.bias", "1 dims", "2-D");
    t = desc2("x.idx", "i32", 64, 64);
    assert_int_equal(ferry_quant_rules_match(&o, &t, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "x.idx", "i32", NULL);
    /* rules that do not hold */
    t = desc2("w.weight", "bf16", 64, 64);
    ferry_quant_rules b = r;
    b.dtype = "bf16";
    assert_int_equal(ferry_quant_rules_match(&b, &t, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "bf16", "f8e4m3", NULL);
    const char *bad_names[] = { "scales", "%s_%s", "%s_%d", "%" };
    for (size_t i = 0; i < 4; i++) {
        b = r;
        b.scale_name = bad_names[i];
        assert_int_equal(ferry_quant_rules_match(&b, &t, &err), FERRY_EINVAL);
        ft_assert_says(&err, FERRY_EINVAL, "scale name", NULL, NULL);
    }
    b = r;
    b.fp8.scale_format = 7;
    assert_int_equal(ferry_quant_rules_match(&b, &t, &err), FERRY_EINVAL);
    b = r;
    b.reserved[3] = 1;
    assert_int_equal(ferry_quant_rules_match(&b, &t, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "reserved", NULL, NULL);
}

/* ---- the derived scale tensor ------------------------------------------------------------- */

static ferry_manifest *three_tensors(void)
{
    ferry_manifest *m;
    ferry_error err = { 0 };
    assert_int_equal(ferry_manifest_create(1, NULL, 8, &m), 0);
    ferry_tensor_desc w = desc2("a.weight", "bf16", 300, 260), e = desc2("emb.embed.weight", "bf16", 50, 64);
    ferry_tensor_desc n = { .name = "a.norm.weight", .dtype = "bf16", .itemsize = 2, .ndim = 1,
                            .shape = { 260 } };
    assert_int_equal(ferry_manifest_add_tensor(m, &w, &err), 0);
    assert_int_equal(ferry_manifest_add_tensor(m, &n, &err), 1);
    assert_int_equal(ferry_manifest_add_tensor(m, &e, &err), 2);
    for (uint32_t i = 0; i < 3; i++) {
        ferry_split s = { .tensor = i, .whole = true };
        assert_int_equal(ferry_manifest_add_split(m, &s, &err), 0);
    }
    return m;
}

static void test_scale_tensor(void **state)
{
    (void)state;
    ferry_error err = { 0 };
    ferry_manifest *m = three_tensors(), *q = NULL, *q2 = NULL;
    assert_int_equal(ferry_manifest_quantize(m, NULL, &q, &err), 0);
    assert_int_equal(ferry_manifest_tensor_count(q), 4);
    ferry_tensor_desc d;
    ferry_tensor_quant tq;
    assert_int_equal(ferry_manifest_tensor(q, 0, &d), 0);
    assert_string_equal(d.dtype, "f8e4m3");
    assert_int_equal(d.itemsize, 1);
    assert_int_equal(ferry_manifest_tensor_quant(q, 0, &tq), 0);
    assert_int_equal(tq.role, FERRY_QUANT_WEIGHT);
    assert_int_equal(tq.partner, 3);
    assert_int_equal(tq.fp8.block_rows, 128);
    assert_string_equal(tq.fp8_dtype, "f8e4m3");
    assert_int_equal(ferry_manifest_tensor(q, 3, &d), 0);
    assert_string_equal(d.name, "a.weight_scale_inv");
    assert_string_equal(d.dtype, "f32");
    assert_int_equal(d.ndim, 2);
    assert_int_equal(d.shape[0], 3);   /* ceil(300 / 128) */
    assert_int_equal(d.shape[1], 3);   /* ceil(260 / 128) */
    assert_int_equal(ferry_manifest_tensor_quant(q, 3, &tq), 0);
    assert_int_equal(tq.role, FERRY_QUANT_SCALE);
    assert_int_equal(tq.partner, 0);
    for (uint32_t i = 1; i < 3; i++) {   /* the norm and the embedding: as they were */
        assert_int_equal(ferry_manifest_tensor(q, i, &d), 0);
        assert_string_equal(d.dtype, "bf16");
        assert_int_equal(ferry_manifest_tensor_quant(q, i, &tq), 0);
        assert_int_equal(tq.role, FERRY_QUANT_NONE);
    }
    ferry_fragment f;
    assert_int_equal(ferry_manifest_fragment_count(q), 4);
    assert_int_equal(ferry_manifest_fragment(q, 3, &f), 0);
    assert_int_equal(f.tensor, 3);
    assert_int_equal(f.shape[0], 3);
    assert_int_equal(f.shape[1], 3);
    /* another name rule and block shape */
    ferry_quant_rules r;
    ferry_quant_rules_init(&r);
    r.scale_name = "%s.scale%%";
    r.fp8.block_rows = 64, r.fp8.block_cols = 32;
    assert_int_equal(ferry_manifest_quantize(m, &r, &q2, &err), 0);
    assert_int_equal(ferry_manifest_tensor(q2, 3, &d), 0);
    assert_string_equal(d.name, "a.weight.scale%");
    assert_int_equal(d.shape[0], 5);   /* ceil(300 / 64) */
    assert_int_equal(d.shape[1], 9);   /* ceil(260 / 32) */
    /* the digest covers the quantization; the source's stays */
    uint8_t dm[16], dq[16], dq2[16], again[16];
    assert_int_equal(ferry_manifest_digest(m, dm), 0);
    assert_int_equal(ferry_manifest_digest(q, dq), 0);
    assert_int_equal(ferry_manifest_digest(q2, dq2), 0);
    assert_memory_not_equal(dm, dq, 16);
    assert_memory_not_equal(dq, dq2, 16);
    ferry_manifest *q3;
    assert_int_equal(ferry_manifest_quantize(m, NULL, &q3, &err), 0);
    assert_int_equal(ferry_manifest_digest(q3, again), 0);
    assert_memory_equal(dq, again, 16);
    ferry_manifest_close(q3);
    /* JSON: the layout before and "quantize"; read back, the same manifest */
    char *text = ferry_manifest_to_json(q2);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"quantize\":{\"dtype\":\"f8e4m3\",\"block\":[64,32]"));
    assert_non_null(strstr(text, "{\"name\":\"a.weight\",\"scale\":\"a.weight.scale%\"}"));
    assert_null(strstr(text, "\"name\":\"a.weight.scale%\",\"dtype\""));
    ferry_manifest *back;
    assert_int_equal(ferry_manifest_from_json(text, strlen(text), &back, &err), 0);
    assert_int_equal(ferry_manifest_digest(back, again), 0);
    assert_memory_equal(dq2, again, 16);
    assert_int_equal(ferry_manifest_tensor_quant(back, 3, &tq), 0);
    assert_int_equal(tq.role, FERRY_QUANT_SCALE);
    char *text2 = ferry_manifest_to_json(back);
    assert_string_equal(text, text2);
    free(text2);
    ferry_manifest_close(back);
    /* a "quantize" that names no tensor of the manifest, or cuts a block */
    char *at = strstr(text, "{\"name\":\"a.weight\",\"scale\"");
    memcpy(at, "{\"name\":\"b", 10);
    assert_int_equal(ferry_manifest_from_json(text, strlen(text), &back, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "quantize", "'b.weight'", NULL);
    memcpy(at, "{\"name\":\"a", 10);
    at = strstr(text, "[64,32]");
    memcpy(at, "[96,32]", 7);
    assert_int_equal(ferry_manifest_from_json(text, strlen(text), &back, &err), 0);
    ferry_manifest_close(back);   /* one fragment: 300 rows end at the tensor's edge */
    free(text);
    /* the fragments of a quantized tensor and of its scales are fixed */
    ferry_fragment add = { .tensor = 0, .rank = 0, .replica = 1, .shape = { 300, 260 } };
    assert_int_equal(ferry_manifest_add_fragment(q, &add, &err), FERRY_ESTATE);
    ft_assert_says(&err, FERRY_ESTATE, "a.weight", "fixed", NULL);
    ferry_split sp = { .tensor = 3, .whole = true, .replica = 1 };
    assert_int_equal(ferry_manifest_add_split(q, &sp, &err), FERRY_ESTATE);
    /* quantized twice; a scale name that is taken */
    assert_int_equal(ferry_manifest_quantize(q, NULL, &q3, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "quantized already", NULL, NULL);
    assert_null(q3);
    r.scale_name = "a.norm%s";
    r.include = "*";
    r.exclude = "*norm*,*embed*";
    ferry_manifest_close(q2);
    q2 = NULL;
    ferry_manifest *m2;
    assert_int_equal(ferry_manifest_create(1, NULL, 8, &m2), 0);
    ferry_tensor_desc w = desc2("w", "f32", 128, 128), s = desc2("a.normw", "f32", 1, 1);
    assert_int_equal(ferry_manifest_add_tensor(m2, &w, &err), 0);
    assert_int_equal(ferry_manifest_add_tensor(m2, &s, &err), 1);
    assert_int_equal(ferry_manifest_quantize(m2, &r, &q2, &err), FERRY_EEXIST);
    ft_assert_says(&err, FERRY_EEXIST, "'w'", "a.normw", "taken");
    assert_null(q2);
    ferry_manifest_close(m2);
    ferry_manifest_close(q);
    ferry_manifest_close(m);
}

/* ---- TP shards: each worker's scale rows and columns ------------------------------------- */

/* A layer's worth: a column-parallel q_proj, a row-parallel o_proj, a norm. */
static ferry_model *small_model(uint64_t qrows, uint64_t hidden)
{
    ferry_model *md;
    ferry_error err = { 0 };
    assert_int_equal(ferry_model_create("q", 1, 0, &md), 0);
    ferry_model_tensor t = { .desc = desc2("l.q_proj.weight", "bf16", qrows, hidden),
                             .role = FERRY_TP_COLUMN, .layer = 0, .expert = -1 };
    assert_int_equal(ferry_model_add_tensor(md, &t, &err), 0);
    t.desc = desc2("l.o_proj.weight", "bf16", hidden, qrows);
    t.role = FERRY_TP_ROW;
    assert_int_equal(ferry_model_add_tensor(md, &t, &err), 0);
    t.desc = (ferry_tensor_desc){ .name = "l.norm.weight", .dtype = "bf16", .itemsize = 2,
                                  .ndim = 1, .shape = { hidden } };
    t.role = FERRY_TP_REPLICATED;
    assert_int_equal(ferry_model_add_tensor(md, &t, &err), 0);
    return md;
}

static ferry_manifest *quantized_layout(const ferry_model *md, const char *text)
{
    ferry_layout l;
    ferry_manifest *m, *q;
    ferry_error err = { 0 };
    assert_int_equal(ferry_layout_parse(text, &l, &err), 0);
    assert_int_equal(ferry_layout_build(md, &l, &m, &err), 0);
    assert_int_equal(ferry_manifest_quantize(m, NULL, &q, &err), 0);
    ferry_manifest_close(m);
    return q;
}

/* Every fragment of a quantized weight has, on its rank with its replica
 * number, one fragment of the scale tensor: its box's blocks. */
static void check_scale_fragments(const ferry_manifest *q)
{
    uint64_t n = ferry_manifest_fragment_count(q), matched = 0, scales = 0;
    for (uint64_t i = 0; i < n; i++) {
        ferry_fragment w, s;
        ferry_tensor_quant tq;
        assert_int_equal(ferry_manifest_fragment(q, i, &w), 0);
        assert_int_equal(ferry_manifest_tensor_quant(q, w.tensor, &tq), 0);
        scales += tq.role == FERRY_QUANT_SCALE;
        if (tq.role != FERRY_QUANT_WEIGHT)
            continue;
        int found = 0;
        for (uint64_t j = 0; j < n; j++) {
            assert_int_equal(ferry_manifest_fragment(q, j, &s), 0);
            if (s.tensor != tq.partner || s.rank != w.rank || s.replica != w.replica)
                continue;
            found++;
            for (int d = 0; d < 2; d++) {
                uint64_t b = d ? tq.fp8.block_cols : tq.fp8.block_rows;
                assert_int_equal(s.offset[d], w.offset[d] / b);
                assert_int_equal(s.shape[d], (w.offset[d] + w.shape[d] + b - 1) / b - w.offset[d] / b);
            }
        }
        assert_int_equal(found, 1);
        matched++;
    }
    assert_int_equal(matched, scales);
}

/* The scale rows and columns a target rank receives in plan p: the union
 * of its regions of tensor `scale`, which must be the box off x shape. */
static void check_planned(ferry_plan *p, uint32_t scale, uint32_t rank, uint64_t r0, uint64_t nr,
                          uint64_t c0, uint64_t nc)
{
    ferry_plan_filter f = { .tensor = scale, .src_rank = -1, .dst_rank = rank };
    ferry_plan_iter *it;
    ferry_region g;
    assert_int_equal(ferry_plan_iter_open(p, &f, &it), 0);
    uint64_t elems = 0, bytes = 0;
    while (ferry_plan_iter_next_region(it, &g) == 1) {
        assert_true(g.offset[0] >= r0 && g.offset[0] + g.shape[0] <= r0 + nr);
        assert_true(g.offset[1] >= c0 && g.offset[1] + g.shape[1] <= c0 + nc);
        elems += g.shape[0] * g.shape[1];
        bytes += g.bytes;
    }
    ferry_plan_iter_close(it);
    assert_int_equal(elems, nr * nc);   /* regions of a plan are disjoint: the whole box */
    assert_int_equal(bytes, nr * nc * 4);
}

static void test_tp_scale_slices(void **state)
{
    (void)state;
    ferry_error err = { 0 };
    /* q_proj 1024 x 600 (5 block columns, the last partial), o_proj 600 x 1024 */
    ferry_model *md = small_model(1024, 600);
    /* trainer side: whole tensors on one rank; rollouts: TP 2 (q_proj by
     * rows: 512 each; o_proj by columns: 512 each), DP 2 */
    ferry_manifest *src = quantized_layout(md, "replicated");
    ferry_manifest *dst = quantized_layout(md, "tp:2,dp:2");
    check_scale_fragments(src);
    check_scale_fragments(dst);
    int qs = ferry_manifest_find_tensor(dst, "l.q_proj.weight_scale_inv");
    int os = ferry_manifest_find_tensor(dst, "l.o_proj.weight_scale_inv");
    assert_true(qs >= 0 && os >= 0);
    ferry_tensor_desc d;
    assert_int_equal(ferry_manifest_tensor(dst, (uint32_t)qs, &d), 0);
    assert_int_equal(d.shape[0], 8);
    assert_int_equal(d.shape[1], 5);
    assert_int_equal(ferry_manifest_tensor(dst, (uint32_t)os, &d), 0);
    assert_int_equal(d.shape[0], 5);
    assert_int_equal(d.shape[1], 8);
    ferry_plan *p;
    assert_int_equal(ferry_plan_create(src, dst, NULL, &p, &err), 0);
    for (uint32_t rank = 0; rank < 4; rank++) {
        uint32_t tp = rank % 2;
        check_planned(p, (uint32_t)qs, rank, 4 * tp, 4, 0, 5);   /* column-parallel: block rows */
        check_planned(p, (uint32_t)os, rank, 0, 5, 4 * tp, 4);   /* row-parallel: block columns */
    }
    ferry_plan_stats st;
    assert_int_equal(ferry_plan_stats_get(p, &st), 0);
    /* FP8 weights (1 byte), scales (4 bytes) and the bf16 norm, on every rank */
    assert_int_equal(st.bytes, 4 * (512 * 600 * 2 + 4 * 5 * 4 * 2 + 600 * 2));
    ferry_plan_free(p);
    /* a source that holds the weights in bf16, or in other blocks, is refused by the planner */
    ferry_layout l;
    ferry_manifest *plain, *other;
    assert_int_equal(ferry_layout_parse("replicated", &l, &err), 0);
    assert_int_equal(ferry_layout_build(md, &l, &plain, &err), 0);
    p = NULL;
    assert_int_equal(ferry_plan_create(plain, dst, NULL, &p, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "l.q_proj.weight", "bf16", "quantized the same way");
    assert_null(p);
    assert_int_equal(ferry_plan_create(src, plain, NULL, &p, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "l.q_proj.weight", "f8e4m3 in 128 x 128", "not planned");
    ferry_quant_rules r;
    ferry_quant_rules_init(&r);
    r.fp8.block_cols = 64;
    assert_int_equal(ferry_manifest_quantize(plain, &r, &other, &err), 0);
    assert_int_equal(ferry_plan_create(other, dst, NULL, &p, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "128 x 64", "128 x 128", NULL);
    ferry_manifest_close(other);
    ferry_manifest_close(plain);
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
    ferry_model_free(md);
}

/* ---- refusal: a shard boundary inside a block ---------------------------------------------- */

static void test_cut_block_refused(void **state)
{
    (void)state;
    ferry_error err = { 0 };
    ferry_model *md = small_model(1024, 640);
    ferry_layout l;
    ferry_manifest *m, *q = (ferry_manifest *)&q;
    /* TP 3: q_proj's rows in pieces of 342, o_proj's columns likewise */
    assert_int_equal(ferry_layout_parse("tp:3", &l, &err), 0);
    assert_int_equal(ferry_layout_build(md, &l, &m, &err), 0);
    assert_int_equal(ferry_manifest_quantize(m, NULL, &q, &err), FERRY_EINVAL);
    assert_null(q);   /* nothing returned */
    ft_assert_says(&err, FERRY_EINVAL, "'l.q_proj.weight'", "worker 0", "ends at row 342");
    ft_assert_says(&err, FERRY_EINVAL, "block row 2", "rows 256..383", "whole blocks");
    /* the same layout with the column-parallel tensor left out: o_proj's columns */
    ferry_quant_rules r;
    ferry_quant_rules_init(&r);
    r.exclude = "*q_proj*,*norm*";
    q = (ferry_manifest *)&q;
    assert_int_equal(ferry_manifest_quantize(m, &r, &q, &err), FERRY_EINVAL);
    assert_null(q);
    ft_assert_says(&err, FERRY_EINVAL, "'l.o_proj.weight'", "worker 0", "ends at column 342");
    ferry_manifest_close(m);
    /* a fragment of its own that starts inside a block: worker 1 */
    assert_int_equal(ferry_manifest_create(2, NULL, 8, &m), 0);
    ferry_tensor_desc w = desc2("w.weight", "f32", 256, 256);
    assert_int_equal(ferry_manifest_add_tensor(m, &w, &err), 0);
    ferry_fragment f0 = { .tensor = 0, .rank = 0, .shape = { 100, 256 } };
    ferry_fragment f1 = { .tensor = 0, .rank = 1, .offset = { 100, 0 }, .shape = { 156, 256 } };
    assert_int_equal(ferry_manifest_add_fragment(m, &f1, &err), 0);
    assert_int_equal(ferry_manifest_add_fragment(m, &f0, &err), 0);
    assert_int_equal(ferry_manifest_quantize(m, NULL, &q, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "worker 1", "starts at row 100", "block row 0");
    /* blocks of 100 rows (the last one partial) hold both shards whole */
    ferry_quant_rules_init(&r);
    r.fp8.block_rows = 100;
    assert_int_equal(ferry_manifest_quantize(m, &r, &q, &err), 0);
    check_scale_fragments(q);
    /* its JSON with 128-row blocks instead: refused when read */
    char *text = ferry_manifest_to_json(q), *at = text ? strstr(text, "\"block\":[100,128]") : NULL;
    assert_non_null(at);
    memcpy(at, "\"block\":[128,128]", 17);
    ferry_manifest *back = (ferry_manifest *)&back;
    assert_int_equal(ferry_manifest_from_json(text, strlen(text), &back, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "worker 1", "starts at row 100", NULL);
    free(text);
    ferry_manifest_close(q);
    /* a fragment bound to a store object */
    ferry_manifest_close(m);
    assert_int_equal(ferry_manifest_create(1, NULL, 8, &m), 0);
    assert_int_equal(ferry_manifest_add_tensor(m, &w, &err), 0);
    ferry_fragment fb = { .tensor = 0, .shape = { 256, 256 }, .object = "obj" };
    assert_int_equal(ferry_manifest_add_fragment(m, &fb, &err), 0);
    assert_int_equal(ferry_manifest_quantize(m, NULL, &q, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "store object", "obj", NULL);
    ferry_manifest_close(m);
    ferry_model_free(md);
}

/* The presets quantize the way FP8 checkpoints do: Kimi-K2 under its
 * serving layout, without a fragment listed one by one. */
static void test_preset(void **state)
{
    (void)state;
    ferry_error err = { 0 };
    ferry_model *md;
    assert_int_equal(ferry_model_preset("deepseek-v3", &md, &err), 0);
    ferry_manifest *q = quantized_layout(md, "ep:8,tp:8");
    uint32_t n = ferry_manifest_tensor_count(q), weights = 0, scales = 0;
    for (uint32_t i = 0; i < n; i++) {
        ferry_tensor_quant tq;
        ferry_tensor_desc d;
        assert_int_equal(ferry_manifest_tensor_quant(q, i, &tq), 0);
        assert_int_equal(ferry_manifest_tensor(q, i, &d), 0);
        weights += tq.role == FERRY_QUANT_WEIGHT;
        scales += tq.role == FERRY_QUANT_SCALE;
        if (strstr(d.name, "embed") || strstr(d.name, "norm") || strstr(d.name, "lm_head") ||
            strstr(d.name, "mlp.gate.weight"))
            assert_int_equal(tq.role, FERRY_QUANT_NONE);
    }
    assert_int_equal(weights, scales);
    assert_true(weights > 40000);
    ferry_manifest_close(q);
    ferry_model_free(md);
}

/* Random splits with replicas, each quantized in random blocks: a layout
 * is refused exactly when one of its fragments (listed through the public
 * calls) starts or ends inside a block away from the tensor's edge, and an
 * accepted one has the scale fragments of check_scale_fragments and plans
 * from a quantized whole-tensor source. */
static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(uint64_t n)
{
    rnd_state ^= rnd_state << 13, rnd_state ^= rnd_state >> 7, rnd_state ^= rnd_state << 17;
    return rnd_state % n;
}

static void test_random_splits(void **state)
{
    (void)state;
    static const uint32_t blocks[] = { 1, 2, 3, 8, 16, 128 };
    int accepted = 0, refused = 0;
    for (int it = 0; it < 300; it++) {
        ferry_error err = { 0 };
        uint32_t b0 = blocks[rnd(6)], b1 = blocks[rnd(6)];
        uint64_t rows = 1 + rnd(300), cols = 1 + rnd(300);
        /* parts that are often whole blocks: a multiple of the block or not */
        uint32_t p0 = 1 + (uint32_t)rnd(4), p1 = 1 + (uint32_t)rnd(4), reps = 1 + (uint32_t)rnd(2);
        if (rnd(2))
            rows = (1 + rnd(4)) * b0 * p0 - rnd(2) * rnd(b0);
        ferry_manifest *m, *src, *q = NULL, *qs;
        assert_int_equal(ferry_manifest_create(p0 * p1 * reps, NULL, 8, &m), 0);
        assert_int_equal(ferry_manifest_create(1, NULL, 8, &src), 0);
        ferry_tensor_desc t = desc2("w.weight", "bf16", rows, cols);
        assert_int_equal(ferry_manifest_add_tensor(m, &t, &err), 0);
        assert_int_equal(ferry_manifest_add_tensor(src, &t, &err), 0);
        ferry_split sp = { .tensor = 0, .whole = true, .parts = { p0, p1 },
                           .rank_stride = { p1, 1 }, .replicas = reps,
                           .replica_stride = p0 * p1 };
        assert_int_equal(ferry_manifest_add_split(m, &sp, &err), 0);
        ferry_split whole = { .tensor = 0, .whole = true };
        assert_int_equal(ferry_manifest_add_split(src, &whole, &err), 0);
        bool cut = false;
        for (uint64_t i = 0; i < ferry_manifest_fragment_count(m); i++) {
            ferry_fragment f;
            assert_int_equal(ferry_manifest_fragment(m, i, &f), 0);
            for (int d = 0; d < 2; d++) {
                uint64_t b = d ? b1 : b0, end = f.offset[d] + f.shape[d], dim = d ? cols : rows;
                cut |= f.offset[d] % b != 0 || (end != dim && end % b != 0);
            }
        }
        ferry_quant_rules r;
        ferry_quant_rules_init(&r);
        r.fp8.block_rows = b0, r.fp8.block_cols = b1;
        int rc = ferry_manifest_quantize(m, &r, &q, &err);
        assert_int_equal(rc, cut ? FERRY_EINVAL : 0);
        if (cut) {
            ft_assert_says(&err, FERRY_EINVAL, "w.weight", "worker", "whole blocks");
            refused++;
        } else {
            check_scale_fragments(q);
            assert_int_equal(ferry_manifest_quantize(src, &r, &qs, &err), 0);
            ferry_plan *p;
            assert_int_equal(ferry_plan_create(qs, q, NULL, &p, &err), 0);
            ferry_plan_free(p);
            ferry_manifest_close(qs);
            ferry_manifest_close(q);
            accepted++;
        }
        ferry_manifest_close(src);
        ferry_manifest_close(m);
    }
    assert_true(accepted > 30 && refused > 30);
}

/* A trainer layout quantized as a source (ferry_manifest_quantize_source):
 * whatever its shards cut, accepted; each scale fragment is the blocks
 * whose first element its weight fragment holds (none: no fragment), so
 * the scale fragments of each copy tile the scale tensor (a plan into a
 * whole quantized target says so: every element held, no overlap but
 * declared copies); the JSON round trip keeps it, digest included. */
static void test_source_cut_blocks(void **state)
{
    (void)state;
    static const uint32_t blocks[] = { 1, 2, 3, 8, 16, 128 };
    int cuts = 0;
    for (int it = 0; it < 300; it++) {
        ferry_error err = { 0 };
        uint32_t b0 = blocks[rnd(6)], b1 = blocks[rnd(6)];
        uint64_t rows = 1 + rnd(300), cols = 1 + rnd(300);
        uint32_t p0 = 1 + (uint32_t)rnd(4), p1 = 1 + (uint32_t)rnd(4), reps = 1 + (uint32_t)rnd(2);
        ferry_manifest *m, *src, *q = NULL, *qs, *back;
        assert_int_equal(ferry_manifest_create(p0 * p1 * reps, NULL, 8, &m), 0);
        assert_int_equal(ferry_manifest_create(1, NULL, 8, &src), 0);
        ferry_tensor_desc t = desc2("w.weight", "bf16", rows, cols);
        assert_int_equal(ferry_manifest_add_tensor(m, &t, &err), 0);
        assert_int_equal(ferry_manifest_add_tensor(src, &t, &err), 0);
        ferry_split sp = { .tensor = 0, .whole = true, .parts = { p0, p1 },
                           .rank_stride = { p1, 1 }, .replicas = reps,
                           .replica_stride = p0 * p1 };
        assert_int_equal(ferry_manifest_add_split(m, &sp, &err), 0);
        ferry_split whole = { .tensor = 0, .whole = true };
        assert_int_equal(ferry_manifest_add_split(src, &whole, &err), 0);
        ferry_quant_rules r;
        ferry_quant_rules_init(&r);
        r.fp8.block_rows = b0, r.fp8.block_cols = b1;
        if (ferry_manifest_quantize_source(m, &r, &q, &err) != 0)
            fail_msg("%s", err.msg);
        cuts += ferry_manifest_quantize(m, &r, &qs, NULL) != 0;
        if (qs != NULL)
            ferry_manifest_close(qs);
        uint64_t n = ferry_manifest_fragment_count(q), nb0 = (rows + b0 - 1) / b0,
                 nb1 = (cols + b1 - 1) / b1, held = 0;
        for (uint64_t i = 0; i < n; i++) {
            ferry_fragment s, w;
            assert_int_equal(ferry_manifest_fragment(q, i, &s), 0);
            if (s.tensor != 1)
                continue;
            held += s.shape[0] * s.shape[1];
            int found = 0;   /* its weight fragment: same rank and copy, holds its first blocks' starts */
            for (uint64_t j = 0; j < n; j++) {
                assert_int_equal(ferry_manifest_fragment(q, j, &w), 0);
                if (w.tensor != 0 || w.rank != s.rank || w.replica != s.replica)
                    continue;
                bool own = true;
                for (int d = 0; d < 2; d++) {
                    uint64_t b = d ? b1 : b0;
                    own &= s.offset[d] == (w.offset[d] + b - 1) / b &&
                           s.offset[d] + s.shape[d] == (w.offset[d] + w.shape[d] + b - 1) / b;
                }
                found += own;
            }
            assert_int_equal(found, 1);
        }
        assert_int_equal(held, nb0 * nb1 * reps);
        assert_int_equal(ferry_manifest_quantize(src, &r, &qs, &err), 0);
        ferry_plan *p;
        if (ferry_plan_create(q, qs, NULL, &p, &err) != 0)
            fail_msg("plan: %s", err.msg);
        ferry_plan_free(p);
        char *json = ferry_manifest_to_json(q);
        assert_non_null(strstr(json, "\"cut_blocks\":true"));
        assert_int_equal(ferry_manifest_from_json(json, strlen(json), &back, &err), 0);
        uint8_t d1[16], d2[16];
        assert_int_equal(ferry_manifest_digest(q, d1), 0);
        assert_int_equal(ferry_manifest_digest(back, d2), 0);
        assert_memory_equal(d1, d2, 16);
        free(json);
        ferry_manifest_close(back);
        ferry_manifest_close(qs);
        ferry_manifest_close(q);
        ferry_manifest_close(src);
        ferry_manifest_close(m);
    }
    assert_true(cuts > 30);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_scale_tensor),
        cmocka_unit_test(test_tp_scale_slices),
        cmocka_unit_test(test_cut_block_refused),
        cmocka_unit_test(test_preset),
        cmocka_unit_test(test_random_splits),
        cmocka_unit_test(test_source_cut_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
