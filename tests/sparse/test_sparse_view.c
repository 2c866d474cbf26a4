/* Sparse apply into real parameter views (ferry_sparse_apply_view) against a
 * real master and node: a row slice of a larger buffer (every byte outside
 * the slice untouched), a transposed (strided) view, one third of a fused
 * qkv buffer, each element checked against W_old + delta; views refused
 * before any write (overlapping strides, a buffer too small, another
 * shape, a negative stride); and the read counters of the compact indexes
 * (read by a reader's first read, from its cache after; by every one-shot
 * read) and of the per-member ranged reads, checked against the object's
 * own member sizes. */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/ftstore.h"
#include "ferry/sparse.h"

static int setup(void **state) { return ft_solo_setup(state, 64u << 20, 10000); }
static int teardown(void **state) { return ft_solo_teardown(state); }

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

#define R 64
#define C 48
#define NNZ 600

/* A delta of tensor `id` [R, C]: NNZ random (distinct) coordinates with
 * small integer values; dense[r * C + c] holds it as a dense array. */
static void make_delta(const char *id, uint64_t base, int64_t *idx, float *val, float *dense,
                       char *key, size_t keycap, ferry_store *s)
{
    memset(dense, 0, R * C * sizeof *dense);
    size_t n = 0;
    while (n < NNZ) {
        int64_t r = (int64_t)(rnd() % R), c = (int64_t)(rnd() % C);
        if (dense[r * C + c] != 0)
            continue;
        float v = (float)((int)(rnd() % 19) - 9);
        if (v == 0)
            v = 5;
        dense[r * C + c] = v;
        idx[2 * n] = r;
        idx[2 * n + 1] = c;
        val[n++] = v;
    }
    ferry_sparse_desc d = {.ndim = 2, .shape = {R, C}, .base_generation = base,
                           .delta_generation = base + 1, .tile = {16, 16},
                           .apply = FERRY_SPARSE_SCATTER_ADD, .nnz = NNZ};
    snprintf(d.tensor_id, sizeof d.tensor_id, "%s", id);
    snprintf(d.index_dtype, sizeof d.index_dtype, "i64");
    snprintf(d.value_dtype, sizeof d.value_dtype, "f32");
    ferry_error err = {0};
    int rc = ferry_put_sparse_object(s, &d, idx, val, NULL, key, keycap, &err);
    if (rc != 0)
        fail_msg("put %s: %s", id, err.msg);
}

static float old_value(uint64_t r, uint64_t c) { return (float)((r * 7 + c * 3) % 23); }

/* One read of key for the box [r0, r0 + nr) x [c0, c0 + nc). */
static ferry_sparse_result *read_box(ferry_store *s, const char *key, const char *id, uint64_t r0,
                                     uint64_t nr, uint64_t c0, uint64_t nc, ferry_sparse_stats *st)
{
    ferry_sparse_target t = {.ndim = 2, .offset = {r0, c0}, .shape = {nr, nc}};
    snprintf(t.tensor_id, sizeof t.tensor_id, "%s", id);
    const char *keys[1] = {key};
    ferry_sparse_result *res = NULL;
    size_t n = 0;
    ferry_error err = {0};
    assert_int_equal(ferry_read_sparse_objects(s, keys, 1, &t, 1, NULL, &res, &n, st, &err), 0);
    assert_int_equal(n, 1);
    return res;
}

/* A row slice [16, 40) of a [R, C] parameter held in a larger [R + 8, C]
 * buffer (rows 4.. hold the parameter): only the slice's bytes change. */
static void test_row_slice(void **state)
{
    ft_solo *f = *state;
    static int64_t idx[2 * NNZ];
    static float val[NNZ], delta[R * C];
    char key[512];
    make_delta("slice.w", 3, idx, val, delta, key, sizeof key, f->s);
    ferry_sparse_stats st;
    ferry_sparse_result *res = read_box(f->s, key, "slice.w", 16, 24, 0, C, &st);
    enum { BR = R + 8 };
    static float buf[BR * C], before[BR * C];
    for (uint64_t r = 0; r < BR; r++)
        for (uint64_t c = 0; c < C; c++)
            buf[r * C + c] = r >= 4 && r < 4 + R ? old_value(r - 4, c) : -1000.0f - (float)r;
    memcpy(before, buf, sizeof buf);
    ferry_sparse_view v = {.data = &buf[(4 + 16) * C], .dtype = "f32", .ndim = 2,
                           .shape = {24, C}, .strides = {C, 1},
                           .bytes = (uint64_t)(BR - 20) * C * sizeof(float)};
    ferry_error err = {0};
    uint64_t g = 0;
    assert_int_equal(ferry_sparse_apply_view(res, &v, 3, &g, &err), 0);
    assert_int_equal(g, 4);
    uint64_t changed = 0;
    for (uint64_t r = 0; r < BR; r++)
        for (uint64_t c = 0; c < C; c++) {
            bool in = r >= 20 && r < 44;
            float want = in ? old_value(r - 4, c) + delta[(r - 4) * C + c] : before[r * C + c];
            if (buf[r * C + c] != want)
                fail_msg("row slice: element (%" PRIu64 ", %" PRIu64 ") is %g, want %g", r, c,
                         (double)buf[r * C + c], (double)want);
            changed += buf[r * C + c] != before[r * C + c];
        }
    assert_int_equal(changed, res->nnz);
    assert_true(res->nnz > 0);
    print_message("# row slice: %" PRIu64 " entries applied into rows [20, 44) of a [%d, %d] "
                  "buffer, every other byte unchanged\n", res->nnz, BR, C);
    ferry_sparse_results_free(res, 1);
}

/* The box [8, 40) x [12, 36) held transposed: element (r, c) of the box at
 * t[c * 32 + r] (strides (1, 32)). */
static void test_transposed(void **state)
{
    ft_solo *f = *state;
    static int64_t idx[2 * NNZ];
    static float val[NNZ], delta[R * C];
    char key[512];
    make_delta("tr.w", 5, idx, val, delta, key, sizeof key, f->s);
    ferry_sparse_stats st;
    ferry_sparse_result *res = read_box(f->s, key, "tr.w", 8, 32, 12, 24, &st);
    static float t[24 * 32];
    for (uint64_t r = 0; r < 32; r++)
        for (uint64_t c = 0; c < 24; c++)
            t[c * 32 + r] = old_value(8 + r, 12 + c);
    ferry_sparse_view v = {.data = t, .dtype = "f32", .ndim = 2, .shape = {32, 24},
                           .strides = {1, 32}, .bytes = sizeof t};
    ferry_error err = {0};
    assert_int_equal(ferry_sparse_apply_view(res, &v, 5, NULL, &err), 0);
    for (uint64_t r = 0; r < 32; r++)
        for (uint64_t c = 0; c < 24; c++) {
            float want = old_value(8 + r, 12 + c) + delta[(8 + r) * C + 12 + c];
            if (t[c * 32 + r] != want)
                fail_msg("transposed: box element (%" PRIu64 ", %" PRIu64 ") is %g, want %g", r,
                         c, (double)t[c * 32 + r], (double)want);
        }
    print_message("# transposed: %" PRIu64 " entries into a [24, 32] buffer holding the box "
                  "[32, 24] transposed\n", res->nnz);
    ferry_sparse_results_free(res, 1);
}

/* q, k and v [R, C] fused as rows of one bf16 qkv [3R, C]: k's delta goes
 * into the middle third, q's and v's rows stay as they were. */
static void test_fused_qkv(void **state)
{
    ft_solo *f = *state;
    static int64_t idx[2 * NNZ];
    static float val[NNZ], delta[R * C];
    char key[512];
    make_delta("attn.k", 9, idx, val, delta, key, sizeof key, f->s);
    ferry_sparse_stats st;
    ferry_sparse_result *res = read_box(f->s, key, "attn.k", 0, R, 0, C, &st);
    static float w[3 * R * C];
    static uint16_t qkv[3 * R * C], before[3 * R * C];
    for (uint64_t r = 0; r < 3 * R; r++)
        for (uint64_t c = 0; c < C; c++)
            w[r * C + c] = old_value(r % R, c) + (float)(r / R) * 30;
    assert_int_equal(ferry_convert(w, "f32", qkv, "bf16", 3 * R * C), 0);
    memcpy(before, qkv, sizeof qkv);
    ferry_sparse_view v = {.data = &qkv[R * C], .dtype = "bf16", .ndim = 2, .shape = {R, C},
                           .bytes = sizeof qkv - R * C * sizeof *qkv};
    ferry_error err = {0};
    assert_int_equal(ferry_sparse_apply_view(res, &v, 9, NULL, &err), 0);
    static float got[3 * R * C];
    assert_int_equal(ferry_convert(qkv, "bf16", got, "f32", 3 * R * C), 0);
    for (uint64_t r = 0; r < 3 * R; r++)
        for (uint64_t c = 0; c < C; c++) {
            bool k = r >= R && r < 2 * R;
            if (!k) {
                if (qkv[r * C + c] != before[r * C + c])
                    fail_msg("fused qkv: row %" PRIu64 " (q or v) changed at column %" PRIu64, r, c);
                continue;
            }
            float want = w[r * C + c] + delta[(r - R) * C + c];   /* small integers: exact in bf16 */
            if (got[r * C + c] != want)
                fail_msg("fused qkv: k element (%" PRIu64 ", %" PRIu64 ") is %g, want %g", r - R,
                         c, (double)got[r * C + c], (double)want);
        }
    print_message("# fused qkv: %" PRIu64 " entries of k into rows [%d, %d) of a bf16 [%d, %d] "
                  "buffer; q and v unchanged\n", res->nnz, R, 2 * R, 3 * R, C);
    ferry_sparse_results_free(res, 1);
}

/* Views refused before any write, each naming why. */
static void test_bad_views(void **state)
{
    ft_solo *f = *state;
    static int64_t idx[2 * NNZ];
    static float val[NNZ], delta[R * C];
    char key[512];
    make_delta("bad.w", 1, idx, val, delta, key, sizeof key, f->s);
    ferry_sparse_stats st;
    ferry_sparse_result *res = read_box(f->s, key, "bad.w", 0, 16, 0, 16, &st);
    assert_true(res->nnz > 0);
    static float buf[64 * 64], before[64 * 64];
    for (size_t i = 0; i < 64 * 64; i++)
        buf[i] = before[i] = (float)i;
    struct { ferry_sparse_view v; const char *why; int code; } cases[] = {
        {{.data = buf, .dtype = "f32", .ndim = 2, .shape = {16, 16}, .strides = {8, 1}},
         "on one address", FERRY_EINVAL},   /* rows overlap */
        {{.data = buf, .dtype = "f32", .ndim = 2, .shape = {16, 16}, .strides = {1, 1}},
         "on one address", FERRY_EINVAL},
        {{.data = buf, .dtype = "f32", .ndim = 2, .shape = {16, 16}, .strides = {64, 1},
          .bytes = 64 * 15 * 4}, "its memory holds", FERRY_EINVAL},   /* one row short */
        {{.data = buf, .dtype = "f32", .ndim = 2, .shape = {16, 15}, .strides = {64, 1}},
         "local shape", FERRY_EINVAL},
        {{.data = buf, .dtype = "f32", .ndim = 2, .shape = {16, 16}, .strides = {64, -1}},
         "negative", FERRY_EINVAL},
        {{.data = buf, .dtype = "i32", .ndim = 2, .shape = {16, 16}, .strides = {64, 1}},
         "dtypes", FERRY_EINVAL},
        {{.data = buf, .dtype = "f32", .ndim = 1, .shape = {256}}, "dimensions", FERRY_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ferry_error err = {0};
        assert_int_equal(ferry_sparse_apply_view(res, &cases[i].v, 1, NULL, &err), cases[i].code);
        if (!strstr(err.msg, cases[i].why))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err.msg, cases[i].why);
        assert_memory_equal(buf, before, sizeof buf);
        print_message("# refused: %s\n", err.msg);
    }
    /* the fence holds for views too */
    ferry_sparse_view ok = {.data = buf, .dtype = "f32", .ndim = 2, .shape = {16, 16},
                            .strides = {64, 1}, .bytes = sizeof buf};
    ferry_error err = {0};
    assert_int_equal(ferry_sparse_apply_view(res, &ok, 7, NULL, &err), FERRY_ESTATE);
    assert_non_null(strstr(err.msg, "nothing changed"));
    assert_memory_equal(buf, before, sizeof buf);
    assert_int_equal(ferry_sparse_apply_view(res, &ok, 1, NULL, &err), 0);
    ferry_sparse_results_free(res, 1);
}

/* The compact-index and per-member counters, against the object's members. */
static void test_counters(void **state)
{
    ft_solo *f = *state;
    static int64_t idx[2 * NNZ];
    static float val[NNZ], delta[R * C];
    char key[512];
    make_delta("cnt.w", 2, idx, val, delta, key, sizeof key, f->s);
    ferry_member m[8];
    size_t nm = 0;
    assert_int_equal(ferry_store_get_members(f->s, key, m, 8, &nm, NULL), 0);
    uint64_t index_bytes = 0, ib = 0, vb = 0;
    for (size_t i = 0; i < nm; i++) {
        if (!strcmp(m[i].name, "meta") || !strcmp(m[i].name, "tile_coords") ||
            !strcmp(m[i].name, "tile_ptr"))
            index_bytes += m[i].nbytes;
        if (!strcmp(m[i].name, "indices"))
            ib = m[i].nbytes;
        if (!strcmp(m[i].name, "values"))
            vb = m[i].nbytes;
    }
    /* two TP halves by rows on one node: two ranges, each of both members */
    ferry_sparse_target t[2] = {{.tensor_id = "cnt.w", .ndim = 2, .offset = {0, 0}, .shape = {32, C}},
                                {.tensor_id = "cnt.w", .ndim = 2, .offset = {32, 0}, .shape = {32, C}}};
    const char *keys[1] = {key};
    ferry_sparse_reader_config rc;
    ferry_sparse_reader *rd = NULL;
    assert_int_equal(ferry_sparse_reader_config_init(&rc), 0);
    assert_int_equal(ferry_sparse_reader_open(f->s, &rc, &rd, NULL), 0);
    /* calls 0 and 1 through the reader, 2 and 3 one-shot */
    for (int call = 0; call < 4; call++) {
        ferry_sparse_result *res = NULL;
        size_t n = 0;
        ferry_sparse_stats st;
        ferry_error err = {0};
        bool cached = call == 1;
        if (call < 2)
            assert_int_equal(ferry_sparse_reader_read(rd, keys, 1, t, 2, NULL, &res, &n, &st, &err), 0);
        else
            assert_int_equal(ferry_read_sparse_objects(f->s, keys, 1, t, 2, NULL, &res, &n, &st, &err), 0);
        assert_int_equal(st.index_checks, 1);
        assert_int_equal(st.index_gets, cached ? 0 : 1);
        assert_int_equal(st.index_cache_hits, cached ? 1 : 0);
        assert_int_equal(st.index_bytes_read, cached ? 0 : index_bytes);
        assert_int_equal(st.index_range_gets, st.unique_range_gets);
        assert_int_equal(st.unique_range_gets, 2);
        assert_int_equal(st.index_range_bytes, ib);   /* every entry once, the whole member */
        assert_int_equal(st.value_range_bytes, vb);
        assert_int_equal(st.index_range_bytes + st.value_range_bytes, st.bytes_read);
        assert_true(st.read_s == st.index_range_s + st.value_range_s);
        print_message("# counters (call %d): index_checks=%" PRIu64 " index_gets=%" PRIu64
                      " index_bytes_read=%" PRIu64 " index_s=%.6f index_range_gets=%" PRIu64
                      " index_range_bytes=%" PRIu64 " index_range_s=%.6f value_range_bytes=%"
                      PRIu64 " value_range_s=%.6f read_s=%.6f\n", call, st.index_checks,
                      st.index_gets, st.index_bytes_read, st.index_s, st.index_range_gets,
                      st.index_range_bytes, st.index_range_s, st.value_range_bytes,
                      st.value_range_s, st.read_s);
        ferry_sparse_stats sum = {0};
        ferry_sparse_stats_add(&sum, &st);
        ferry_sparse_stats_add(&sum, &st);
        assert_int_equal(sum.index_range_bytes, 2 * st.index_range_bytes);
        assert_int_equal(sum.bytes_read, 2 * st.bytes_read);
        ferry_sparse_results_free(res, n);
    }
    ferry_sparse_reader_close(rd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_slice),
        cmocka_unit_test(test_transposed),
        cmocka_unit_test(test_fused_qkv),
        cmocka_unit_test(test_bad_views),
        cmocka_unit_test(test_counters),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
