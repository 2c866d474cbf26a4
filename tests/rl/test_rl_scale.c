/* The single-pull group plan at reduced scale, in one process (no store;
 * pull_demand.c, pull_plan.c): demand records describe boxes, so their
 * size does not depend on how many rows a shard has; a TP8 shard of
 * columns (FERRY_TP_ROW: one run per row in row-major bytes) is read and
 * pushed as a few strided runs per box, never one per row; the plan built
 * again from the same layouts (the next generation) hits the cache, a
 * changed layout does not, a member at another generation is refused and
 * a record whose body does not match its digest is refused. The full-size
 * figures are `ferry-lab bench weights --scale` (docs/weights.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "rl/pull_int.h"
#include "util/testutil.h"

#define COLS 4096ull
#define TP 8u
#define WORLD 16u   /* tp:8,dp:2 */

typedef struct scene {
    ferry_model *model;
    fr_gen *g;
    ferry_manifest *dst;
    ferry_engine *e;
} scene;

/* w_row [rows, COLS] split by TP over dim 1 (a box of rows x 512 columns),
 * w_col [COLS, COLS] split over dim 0 (contiguous boxes). */
static ferry_model *model_of(uint64_t rows)
{
    ferry_model *m = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_model_create("scale", 1, 0, &m), 0);
    ferry_model_tensor t = { .desc = { .name = "w_row", .dtype = "bf16", .itemsize = 2, .ndim = 2,
                                       .shape = { rows, COLS } },
                             .role = FERRY_TP_ROW, .layer = 0, .expert = -1 };
    assert_int_equal(ferry_model_add_tensor(m, &t, &err), 0);
    t.desc.name = "w_col";
    t.desc.shape[0] = COLS;
    t.role = FERRY_TP_COLUMN;
    assert_int_equal(ferry_model_add_tensor(m, &t, &err), 0);
    return m;
}

/* The generation as a subscriber loads it: the trainers' fsdp:4 placement
 * stored, through its JSON. */
static fr_gen *gen_of(ferry_model *m, uint64_t generation)
{
    ferry_error err = {0};
    ferry_layout l;
    ferry_manifest *pl = NULL, *st = NULL;
    fr_gen *g = calloc(1, sizeof *g);
    assert_non_null(g);
    snprintf(g->model, sizeof g->model, "scale");
    g->generation = generation;
    assert_int_equal(ferry_layout_parse("fsdp:4", &l, &err), 0);
    assert_int_equal(ferry_layout_build(m, &l, &pl, &err), 0);
    assert_int_equal(ferry_manifest_stored(pl, NULL, &st, &err), 0);
    char *json = ferry_manifest_to_json(st);
    assert_non_null(json);
    fr_hash128_t h = fr_hash128(json, strlen(json), 0);
    memcpy(g->placement, h.b, 16);
    assert_int_equal(ferry_manifest_from_json(json, strlen(json), &g->m, &err), 0);
    free(json);
    ferry_manifest_close(st);
    ferry_manifest_close(pl);
    g->nranks = ferry_manifest_rank_count(g->m);
    g->ranks = calloc(g->nranks, sizeof *g->ranks);
    assert_non_null(g->ranks);
    return g;
}

static void scene_open(scene *s, uint64_t rows)
{
    memset(s, 0, sizeof *s);
    s->model = model_of(rows);
    s->g = gen_of(s->model, 1);
    ferry_error err = {0};
    ferry_layout l;
    assert_int_equal(ferry_layout_parse("tp:8,dp:2", &l, &err), 0);
    assert_int_equal(ferry_layout_build(s->model, &l, &s->dst, &err), 0);
    assert_int_equal(ferry_manifest_rank_count(s->dst), WORLD);
    ferry_engine_config cfg;
    ft_config(&cfg, NULL);
    assert_int_equal(ferry_engine_open(&cfg, &s->e, NULL), 0);
}

static void scene_close(scene *s)
{
    ferry_engine_close(s->e);
    ferry_manifest_close(s->dst);
    fr_gen_free(s->g);
    ferry_model_free(s->model);
}

/* Every worker's record for generation g: its fragments of the rollout
 * placement at made-up addresses (never touched), salt moving worker
 * `moved`'s. Eight workers a node; the second DP replica (ranks 8-15)
 * holds w_row in padded rows (PAD elements a row), so pushes between the
 * replicas are strided on one side. */
#define PAD (COLS / TP + 128)
static ferry_kv_value *records(const scene *s, const fr_gen *g, uint32_t moved, uint64_t salt)
{
    ferry_kv_value *recs = calloc(WORLD, sizeof *recs);
    assert_non_null(recs);
    for (uint32_t r = 0; r < WORLD; r++) {
        ferry_param_shard sh[4];
        ferry_region *regs[4] = {0};
        size_t n = 0;
        for (uint64_t id = 0; id < ferry_manifest_fragment_count(s->dst); id++) {
            ferry_fragment f;
            ferry_tensor_desc d;
            assert_int_equal(ferry_manifest_fragment(s->dst, id, &f), 0);
            if (f.rank != r)
                continue;
            assert_true(n < 4);
            assert_int_equal(ferry_manifest_tensor(s->dst, f.tensor, &d), 0);
            sh[n] = (ferry_param_shard){ .tensor = d.name, .ndim = d.ndim,
                                         .dst = (void *)(uintptr_t)(((uint64_t)r << 40) +
                                                                    (n << 36) +
                                                                    (r == moved ? salt : 0)) };
            for (uint32_t k = 0; k < d.ndim; k++)
                sh[n].offset[k] = f.offset[k], sh[n].shape[k] = f.shape[k];
            if (r >= 8 && !strcmp(d.name, "w_row"))
                sh[n].strides[0] = PAD, sh[n].strides[1] = 1;
            n++;
        }
        ferry_subscriber_config cfg = { .rank = r, .world = WORLD, .node = r / 8 };
        ferry_error err = {0};
        uint8_t *b = NULL;
        size_t len = 0;
        assert_int_equal(fr_sub_encode(&cfg, g, sh, n, regs, s->e, &b, &len, &err), 0);
        recs[r].val = b;
        recs[r].len = len;
    }
    return recs;
}

static void records_free(ferry_kv_value *recs)
{
    for (uint32_t r = 0; recs && r < WORLD; r++)
        ferry_store_free(recs[r].val);
    free(recs);
}

/* Records describe boxes: the same size whatever the rows of a shard. */
static void test_record_size_independent_of_rows(void **state)
{
    (void)state;
    size_t len[2][WORLD];
    const uint64_t rows[2] = { 8192, 8192 * 16 };
    for (int v = 0; v < 2; v++) {
        scene s;
        scene_open(&s, rows[v]);
        ferry_kv_value *recs = records(&s, s.g, UINT32_MAX, 0);
        for (uint32_t r = 0; r < WORLD; r++)
            len[v][r] = recs[r].len;
        records_free(recs);
        scene_close(&s);
    }
    for (uint32_t r = 0; r < WORLD; r++) {
        assert_int_equal(len[0][r], len[1][r]);
        /* header and endpoint (at most FERRY_DESC_MAX), two 2-D shards of 80 bytes */
        assert_true(len[0][r] <= 56 + FERRY_DESC_MAX + 8 + 2 * 80);
    }
}

/* Every worker's plan: the reads and pushes of w_row (boxes of 512 bf16
 * columns: rows of 1024 bytes, 8 KiB apart in the source) are strided, a
 * few per box, and the group reads every byte once. */
static void test_strided_reads_and_pushes(void **state)
{
    (void)state;
    const uint64_t rows = 8192;    /* a box of 8 MiB: two 4 MiB pieces of 4096 rows */
    const uint64_t row = COLS / TP * 2;
    scene s;
    scene_open(&s, rows);
    ferry_kv_value *recs = records(&s, s.g, UINT32_MAX, 0);
    uint64_t row_reads = 0, row_pushes = 0, col_pushes = 0, group_read = 0, my_reads = 0;
    for (uint32_t me = 0; me < WORLD; me++) {
        fr_sub_cache c = {0};
        ferry_kv_value *mine = calloc(WORLD, sizeof *mine);
        assert_non_null(mine);
        for (uint32_t k = 0; k < WORLD; k++) {   /* the cache takes its records over */
            mine[k].val = malloc(recs[k].len);
            assert_non_null(mine[k].val);
            memcpy(mine[k].val, recs[k].val, recs[k].len);
            mine[k].len = recs[k].len;
        }
        ferry_error err = {0};
        assert_int_equal(fr_sub_plan_records(&c, s.g, mine, WORLD, me, NULL, &err), 0);
        for (uint32_t k = 0; k < WORLD; k++)
            assert_null(mine[k].val);
        const fr_work *w = &c.plan;
        for (size_t i = 0; i < w->ngreads; i++) {
            const ferry_store_read *r = &w->io.v[i];
            if (r->len == row) {   /* w_row: a source fragment's 2048 rows in one read */
                assert_int_equal(r->count, rows / 4);
                assert_int_equal(r->src_stride, COLS * 2);
                assert_int_equal(r->dst_stride, me >= 8 ? PAD * 2 : row);
                row_reads++;
            } else {               /* w_col: contiguous in both */
                assert_true(r->count <= 1);
                assert_int_equal(r->len % (COLS * 2), 0);
            }
        }
        for (int h = 0; h < 2; h++)
            for (size_t i = 0; i < w->hop[h].n; i++) {
                const ferry_op *op = &w->hop[h].ops[i];
                if (op->len == row) {   /* a 4096-row piece of w_row in one WRITE */
                    assert_int_equal(op->count, 4096);
                    assert_true(op->local_stride == row || op->local_stride == PAD * 2);
                    assert_true(op->remote_stride == row || op->remote_stride == PAD * 2);
                    assert_true(op->local_stride != op->remote_stride);
                    row_pushes++;
                } else {                /* w_col: one contiguous 4 MiB piece */
                    assert_true(op->count <= 1);
                    assert_int_equal(op->len, 4ull << 20);
                    col_pushes++;
                }
            }
        group_read = w->group_read;
        my_reads += w->my_read;
        fr_sub_cache_free(&c);
        free(mine);
    }
    /* 8 boxes of w_row, 2 pieces each, each piece over 2 source fragments
     * read once and pushed once (to the other replica); 8 boxes of w_col,
     * one 4 MiB piece each, pushed once */
    assert_int_equal(row_reads, 8 * 2 * 2);
    assert_int_equal(row_pushes, 8 * 2);
    assert_int_equal(col_pushes, 8);
    assert_int_equal(group_read, 2 * rows * COLS + 2 * COLS * COLS);
    assert_int_equal(my_reads, group_read);
    records_free(recs);
    scene_close(&s);
}

static ferry_kv_value *copy_of(ferry_kv_value *recs)
{
    ferry_kv_value *c = calloc(WORLD, sizeof *c);
    assert_non_null(c);
    for (uint32_t k = 0; k < WORLD; k++) {
        c[k].val = malloc(recs[k].len);
        assert_non_null(c[k].val);
        memcpy(c[k].val, recs[k].val, recs[k].len);
        c[k].len = recs[k].len;
    }
    return c;
}

/* The next generation of the same layouts plans nothing; a moved buffer
 * plans again; a member at another generation is refused. */
static void test_plan_cache(void **state)
{
    (void)state;
    scene s;
    scene_open(&s, 8192);
    fr_gen *g2 = gen_of(s.model, 2), *g3 = gen_of(s.model, 3);
    ferry_kv_value *r1 = records(&s, s.g, UINT32_MAX, 0), *r2 = records(&s, g2, UINT32_MAX, 0);
    ferry_kv_value *r3 = records(&s, g3, 5, 1ull << 20);   /* worker 5's buffers moved */
    fr_sub_cache c = {0};
    ferry_error err = {0};
    const uint32_t me = 3;
    assert_int_equal(fr_sub_plan_records(&c, s.g, r1, WORLD, me, NULL, &err), 0);
    assert_false(c.reused);
    size_t nops = c.plan.hop[0].n, nreads = c.plan.ngreads;
    /* generation 2, same layouts: the records differ in their generation */
    assert_int_equal(fr_sub_plan_records(&c, g2, r2, WORLD, me, NULL, &err), 0);
    assert_true(c.reused);
    assert_non_null(r2[0].val);   /* not taken: the plan kept points into r1's */
    assert_int_equal(c.plan.hop[0].n, nops);
    assert_int_equal(c.plan.ngreads, nreads);
    /* one member at generation 3 with the key of generation 2: refused */
    ferry_kv_value *mixed = copy_of(r2);
    ferry_kv_value *r3same = records(&s, g3, UINT32_MAX, 0);
    ferry_store_free(mixed[7].val);
    mixed[7].val = r3same[7].val;
    r3same[7].val = NULL;
    assert_int_equal(fr_sub_plan_records(&c, g2, mixed, WORLD, me, NULL, &err), FERRY_ESTATE);
    assert_non_null(strstr(err.msg, "worker 7 is updating to generation 3"));
    /* generation 3 with worker 5's buffers elsewhere: a new plan */
    memset(&err, 0, sizeof err);
    assert_int_equal(fr_sub_plan_records(&c, g3, r3, WORLD, me, NULL, &err), 0);
    assert_false(c.reused);
    fr_sub_cache_free(&c);
    records_free(mixed);
    records_free(r3same);
    records_free(r3);
    records_free(r2);
    records_free(r1);
    fr_gen_free(g3);
    fr_gen_free(g2);
    scene_close(&s);
}

/* A record whose body was changed without its digest is refused. */
static void test_digest_checked(void **state)
{
    (void)state;
    scene s;
    scene_open(&s, 8192);
    ferry_kv_value *recs = records(&s, s.g, UINT32_MAX, 0);
    ((uint8_t *)recs[6].val)[recs[6].len - 1] ^= 1;   /* a stride of worker 6's last shard */
    fr_sub_cache c = {0};
    ferry_error err = {0};
    assert_int_equal(fr_sub_plan_records(&c, s.g, recs, WORLD, 0, NULL, &err), FERRY_EPROTO);
    assert_non_null(strstr(err.msg, "the demand of worker 6 does not match its digest"));
    assert_false(c.valid);
    fr_sub_cache_free(&c);
    records_free(recs);
    scene_close(&s);
}

/* Three dims, the second replica's shards padded in two of them: a read
 * run then has two loops (more reads than runs: the reads leave their
 * presized array for the heap) and a push one WRITE per plane. */
static void test_three_dims_padded(void **state)
{
    (void)state;
    ferry_model *m = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_model_create("scale3", 1, 0, &m), 0);
    ferry_model_tensor t = { .desc = { .name = "w3", .dtype = "bf16", .itemsize = 2, .ndim = 3,
                                       .shape = { 256, 64, 32 } },
                             .role = FERRY_TP_ROW, .layer = 0, .expert = -1 };
    assert_int_equal(ferry_model_add_tensor(m, &t, &err), 0);
    scene s = { .model = m, .g = gen_of(m, 1) };
    ferry_layout l;
    assert_int_equal(ferry_layout_parse("tp:8,dp:2", &l, &err), 0);
    assert_int_equal(ferry_layout_build(m, &l, &s.dst, &err), 0);
    ferry_engine_config cfg;
    ft_config(&cfg, NULL);
    assert_int_equal(ferry_engine_open(&cfg, &s.e, NULL), 0);
    ferry_kv_value *recs = calloc(WORLD, sizeof *recs);
    assert_non_null(recs);
    for (uint32_t r = 0; r < WORLD; r++) {   /* box [256, 8, 32]; ranks 8-15 padded */
        ferry_param_shard sh = { .tensor = "w3", .ndim = 3, .offset = { 0, (r % 8) * 8, 0 },
                                 .shape = { 256, 8, 32 }, .dst = (void *)(uintptr_t)((uint64_t)r << 40) };
        if (r >= 8)
            sh.strides[0] = 8 * 40 + 16, sh.strides[1] = 40, sh.strides[2] = 1;
        ferry_region *regs[1] = {0};
        ferry_subscriber_config sc = { .rank = r, .world = WORLD, .node = r / 8 };
        uint8_t *b = NULL;
        size_t len = 0;
        assert_int_equal(fr_sub_encode(&sc, s.g, &sh, 1, regs, s.e, &b, &len, &err), 0);
        recs[r] = (ferry_kv_value){ .val = b, .len = len };
    }
    uint64_t reads = 0, pushes = 0, mine = 0, group = 0;
    for (uint32_t me = 0; me < WORLD; me++) {
        fr_sub_cache c = {0};
        ferry_kv_value *copy = copy_of(recs);
        assert_int_equal(fr_sub_plan_records(&c, s.g, copy, WORLD, me, NULL, &err), 0);
        const fr_work *w = &c.plan;
        for (size_t i = 0; i < w->ngreads; i++) {   /* against fsdp:4 pieces [64, 64, 32] */
            const ferry_store_read *r = &w->io.v[i];
            assert_int_equal(r->len, me >= 8 ? 64 : 512);
            assert_int_equal(r->count, me >= 8 ? 8 : 64);
            assert_int_equal(r->src_stride, me >= 8 ? 64 : 64 * 32 * 2);
        }
        if (w->nreads)
            assert_int_equal(w->ngreads, me >= 8 ? 4 * 64 : 4);
        reads += w->ngreads;
        for (size_t i = 0; i < w->hop[0].n; i++) {   /* a plane of 8 rows of 64 bytes */
            assert_int_equal(w->hop[0].ops[i].len, 64);
            assert_int_equal(w->hop[0].ops[i].count, 8);
        }
        pushes += w->hop[0].n + w->hop[1].n;
        mine += w->my_read;
        group = w->group_read;
        fr_sub_cache_free(&c);
        free(copy);
    }
    assert_int_equal(group, 256 * 64 * 32 * 2);
    assert_int_equal(mine, group);
    assert_int_equal(pushes, 8 * 256);   /* each box once to its other replica, by plane */
    assert_true(reads >= 8 * 4);
    records_free(recs);
    scene_close(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_size_independent_of_rows),
        cmocka_unit_test(test_strided_reads_and_pushes),
        cmocka_unit_test(test_plan_cache),
        cmocka_unit_test(test_digest_checked),
        cmocka_unit_test(test_three_dims_padded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
