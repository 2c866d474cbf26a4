/* The sparse executor and apply against a real master and node: apply
 * (scatter_add / scatter_set into f32, bf16 and f16; the base fence; a bad
 * index changes nothing); the RFC's acceptance case (a non-EP weight read
 * by EP2 x TP2 targets on one node: one source object, no full get, two
 * unique range gets) and the same targets over two nodes; an EP expert
 * (owner ep=1: only EP1's targets, TP split inside); EP-only (the target
 * box is the whole tensor); a reader's index cache across calls (and none
 * in the one-shot read); publication of
 * target-local objects; random shapes, tiles, boxes, densities and dtypes
 * against a brute-force dense oracle (W_old + delta, or the set values,
 * exactly: every value is a small integer). */
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
#include "ferry/weights.h"

/* A master, a node, a store and a reader of it. */
typedef struct fixture {
    ferry_store *s;
    ferry_sparse_reader *rd;
    void *solo;                 /* the ft_solo */
} fixture;

static int teardown(void **state)
{
    fixture *f = *state;
    if (!f)
        return 0;
    ferry_sparse_reader_close(f->rd);
    ft_solo_teardown(&f->solo);
    free(f);
    *state = NULL;
    return 0;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    if (!f || ft_solo_setup(&f->solo, 256u << 20, 10000) != 0) {
        free(f);   /* cmocka runs no teardown after a failed setup */
        *state = NULL;
        return -1;
    }
    f->s = ((ft_solo *)f->solo)->s;
    ferry_sparse_reader_config cfg;
    ferry_error err = {0};
    if (ferry_sparse_reader_config_init(&cfg) != 0 ||
        ferry_sparse_reader_open(f->s, &cfg, &f->rd, &err) != 0) {
        print_error("sparse reader: %s\n", err.msg);
        teardown(state);
        return -1;
    }
    return 0;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static uint64_t rndn(uint64_t n) { return rnd() % n; }

/* ---- apply ----------------------------------------------------------------------------- */

static void test_apply(void **state)
{
    (void)state;
    const char *dts[] = {"f32", "bf16", "f16"};
    for (int vd = 0; vd < 3; vd++)
        for (int dd = 0; dd < 3; dd++)
            for (int mode = 0; mode < 2; mode++) {
                int64_t idx[6] = {0, 1, 2, 3, 1, 0};
                float vf[3] = {1.5f, -4.0f, 0.25f};
                uint8_t vals[12];
                assert_int_equal(ferry_convert(vf, "f32", vals, dts[vd], 3), 0);
                ferry_sparse_result r = {.ndim = 2, .shape = {3, 4}, .base_generation = 5,
                                         .delta_generation = 6, .nnz = 3, .indices = idx,
                                         .values = vals,
                                         .apply = mode ? FERRY_SPARSE_SCATTER_SET
                                                       : FERRY_SPARSE_SCATTER_ADD};
                snprintf(r.tensor_id, sizeof r.tensor_id, "w");
                snprintf(r.value_dtype, sizeof r.value_dtype, "%s", dts[vd]);
                float w[12], want[12];
                for (int i = 0; i < 12; i++)
                    w[i] = want[i] = (float)i;
                want[1] = mode ? 1.5f : 1 + 1.5f;
                want[11] = mode ? -4.0f : 11 - 4.0f;
                want[4] = mode ? 0.25f : 4.25f;
                uint8_t buf[48], before[48];
                assert_int_equal(ferry_convert(w, "f32", buf, dts[dd], 12), 0);
                memcpy(before, buf, sizeof before);
                ferry_error err = {0};
                uint64_t g = 0;
                if (!mode) {   /* the fence: a buffer at generation 4 is not the base */
                    assert_int_equal(ferry_sparse_apply(&r, buf, dts[dd], 4, &g, &err),
                                     FERRY_ESTATE);
                    assert_non_null(strstr(err.msg, "base generation 5"));
                    assert_non_null(strstr(err.msg, "generation 4"));
                    assert_memory_equal(buf, before, sizeof buf);
                }
                int64_t bad = idx[5];
                idx[5] = 4;   /* outside shape[1] = 4: refused before any write */
                assert_int_equal(ferry_sparse_apply(&r, buf, dts[dd], 5, &g, &err),
                                 FERRY_EINVAL);
                assert_memory_equal(buf, before, sizeof buf);
                idx[5] = bad;
                assert_int_equal(ferry_sparse_apply(&r, buf, dts[dd], mode ? 99 : 5, &g, &err), 0);
                assert_int_equal(g, 6);
                float got[12];
                assert_int_equal(ferry_convert(buf, dts[dd], got, "f32", 12), 0);
                for (int i = 0; i < 12; i++) {
                    float e;
                    uint8_t tmp[4];   /* the expectation rounded to the buffer's dtype */
                    ferry_convert(&want[i], "f32", tmp, dts[dd], 1);
                    ferry_convert(tmp, dts[dd], &e, "f32", 1);
                    if (got[i] != e)
                        fail_msg("%s into %s, %s: [%d] = %g, want %g", dts[vd], dts[dd],
                                 mode ? "set" : "add", i, got[i], e);
                }
            }
    /* rounding goes through f32 then to nearest even: 256 + 1 in bf16 stays 256 */
    int64_t i1[1] = {0};
    float one = 1.0f, w = 256.0f;
    uint16_t vb, wb;
    ferry_convert(&one, "f32", &vb, "bf16", 1);
    ferry_convert(&w, "f32", &wb, "bf16", 1);
    ferry_sparse_result r = {.ndim = 1, .shape = {1}, .nnz = 1, .indices = i1, .values = &vb,
                             .base_generation = 0, .delta_generation = 1};
    snprintf(r.value_dtype, sizeof r.value_dtype, "bf16");
    assert_int_equal(ferry_sparse_apply(&r, &wb, "bf16", 0, NULL, NULL), 0);
    ferry_convert(&wb, "bf16", &w, "f32", 1);
    assert_true(w == 256.0f);
    assert_int_equal(ferry_sparse_apply(&r, &wb, "f64", 0, NULL, NULL), FERRY_EINVAL);
}

/* ---- the oracle ------------------------------------------------------------------------ */

typedef struct spcase {
    ferry_sparse_desc d;       /* in: shape, tile (or 0), dtypes, apply, placement, gens */
    uint64_t nnz;              /* entries generated (duplicates possible under add) */
    ferry_sparse_target *t;
    size_t nt;
    const char *dst_dtype;
    const char *publish;       /* or NULL */
    bool one_shot;             /* ferry_read_sparse_objects, not the fixture's reader */
} spcase;

static uint64_t total_of(const ferry_sparse_desc *d)
{
    uint64_t n = 1;
    for (uint32_t k = 0; k < d->ndim; k++)
        n *= d->shape[k];
    return n;
}

static float w_old(uint64_t lin) { return (float)((int)((lin * 31) % 33) - 16); }

static bool receives(const ferry_sparse_desc *d, const ferry_sparse_target *t)
{
    return d->placement.kind == FERRY_SPARSE_REPLICATE || t->axis_index == d->placement.owner;
}

/* Put the source, read it for the targets, apply every result and compare
 * each target's buffer with the dense oracle. */
static void run_case(fixture *f, spcase *c, ferry_sparse_stats *st_out, ferry_sparse_desc *put)
{
    ferry_sparse_desc *d = &c->d;
    uint64_t N = total_of(d), n = c->nnz;
    size_t isz = strcmp(d->index_dtype, "i32") == 0 ? 4 : 8;
    float *delta = calloc(N, sizeof *delta);
    uint8_t *set = calloc(N, 1);
    uint8_t *ind = malloc(n * d->ndim * isz);
    float *vf = malloc(n * sizeof *vf);
    uint8_t *vals = malloc(n * 4);
    bool is_set = d->apply == FERRY_SPARSE_SCATTER_SET;
    uint64_t made = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t lin = rndn(N);
        if (is_set && set[lin])
            continue;    /* distinct coordinates for scatter_set */
        uint64_t rem = lin;
        for (uint32_t k = d->ndim; k-- > 0;) {
            int64_t x = (int64_t)(rem % d->shape[k]);
            rem /= d->shape[k];
            if (isz == 4) {
                int32_t v = (int32_t)x;
                memcpy(ind + (made * d->ndim + k) * 4, &v, 4);
            } else {
                memcpy(ind + (made * d->ndim + k) * 8, &x, 8);
            }
        }
        float v = (float)((int)rndn(16) - 8);
        if (v == 0)
            v = 3;
        vf[made] = v;
        delta[lin] = is_set ? v : delta[lin] + v;
        set[lin] = 1;
        made++;
    }
    d->nnz = made;
    assert_int_equal(ferry_convert(vf, "f32", vals, d->value_dtype, made), 0);
    char key[512];
    ferry_error err = {0};
    ferry_sparse_desc out;
    if (ferry_put_sparse_object(f->s, d, ind, vals, &out, key, sizeof key, &err) != 0)
        fail_msg("put: %s", err.msg);
    if (put)
        *put = out;
    const char *keys[1] = {key};
    ferry_sparse_result *res = NULL;
    size_t nres = 0;
    ferry_sparse_stats st;
    int rc = c->one_shot ? ferry_read_sparse_objects(f->s, keys, 1, c->t, c->nt, c->publish, &res,
                                                     &nres, &st, &err)
                         : ferry_sparse_reader_read(f->rd, keys, 1, c->t, c->nt, c->publish, &res,
                                                    &nres, &st, &err);
    if (rc != 0)
        fail_msg("read: %s", err.msg);
    assert_int_equal(st.index_cache_hits, 0);   /* a new object: its index is read */
    if (st_out)
        *st_out = st;
    size_t dsz = strcmp(c->dst_dtype, "f32") == 0 ? 4 : 2;
    size_t seen = 0;
    for (size_t ti = 0; ti < c->nt; ti++) {
        const ferry_sparse_target *t = &c->t[ti];
        uint64_t M = 1;
        for (uint32_t k = 0; k < d->ndim; k++)
            M *= t->shape[k];
        float *old = malloc(M * 4), *want = malloc(M * 4), *got = malloc(M * 4);
        uint8_t *buf = malloc(M * dsz);
        uint64_t in_box = 0;
        for (uint64_t j = 0; j < M; j++) {   /* box-local j -> global lin */
            uint64_t rem = j, lin = 0, mul = 1, g[FERRY_SPARSE_NDIM_MAX];
            for (uint32_t k = d->ndim; k-- > 0;) {
                g[k] = t->offset[k] + rem % t->shape[k];
                rem /= t->shape[k];
            }
            for (uint32_t k = d->ndim; k-- > 0;) {
                lin += g[k] * mul;
                mul *= d->shape[k];
            }
            old[j] = w_old(lin);
            want[j] = old[j];
            if (receives(&out, t) && set[lin]) {
                want[j] = is_set ? delta[lin] : old[j] + delta[lin];
                in_box++;
            }
        }
        assert_int_equal(ferry_convert(old, "f32", buf, c->dst_dtype, M), 0);
        size_t mine = 0;
        for (size_t r = 0; r < nres; r++) {
            if (res[r].target != ti)
                continue;
            mine++;
            assert_true(receives(&out, t));
            assert_int_equal(res[r].nnz, in_box);
            assert_int_equal(res[r].ndim, d->ndim);
            assert_memory_equal(res[r].shape, t->shape, d->ndim * 8);
            uint64_t g = 0;
            if (ferry_sparse_apply(&res[r], buf, c->dst_dtype, out.base_generation, &g, &err))
                fail_msg("apply: %s", err.msg);
            assert_int_equal(g, out.delta_generation);
        }
        assert_int_equal(mine, receives(&out, t) ? 1 : 0);
        seen += mine;
        assert_int_equal(ferry_convert(buf, c->dst_dtype, got, "f32", M), 0);
        for (uint64_t j = 0; j < M; j++)
            if (got[j] != want[j])
                fail_msg("%s target %zu element %" PRIu64 ": %g, want %g", d->tensor_id, ti, j,
                         got[j], want[j]);
        free(old);
        free(want);
        free(got);
        free(buf);
    }
    assert_int_equal(seen, nres);
    if (c->publish) {   /* the published objects hold the same entries */
        for (size_t r = 0; r < nres; r++) {
            char pk[1200];
            snprintf(pk, sizeof pk, "%s/%" PRIu32 "/%s", c->publish, res[r].target,
                     res[r].tensor_id);
            ferry_member m[4];
            size_t nm = 0;
            assert_int_equal(ferry_store_get_members(f->s, pk, m, 4, &nm, NULL), 0);
            assert_int_equal(nm, 3);
            assert_string_equal(m[1].name, "indices");
            assert_int_equal(m[1].shape[0], res[r].nnz);
            if (res[r].nnz) {
                int64_t *pi = malloc(res[r].nnz * d->ndim * 8);
                size_t len = 0;
                assert_int_equal(ferry_store_read_member(f->s, pk, "indices", 0, res[r].nnz, pi,
                                                         res[r].nnz * d->ndim * 8, &len, NULL), 0);
                assert_memory_equal(pi, res[r].indices, len);
                free(pi);
            }
        }
    }
    ferry_sparse_results_free(res, nres);
    free(delta);
    free(set);
    free(ind);
    free(vf);
    free(vals);
}

static ferry_sparse_desc mkdesc(const char *id, uint32_t ndim, const uint64_t *shape)
{
    ferry_sparse_desc d;
    memset(&d, 0, sizeof d);
    snprintf(d.tensor_id, sizeof d.tensor_id, "%s", id);
    d.ndim = ndim;
    memcpy(d.shape, shape, ndim * 8);
    d.base_generation = 7;
    d.delta_generation = 8;
    d.placement.kind = FERRY_SPARSE_REPLICATE;
    snprintf(d.placement.axis, sizeof d.placement.axis, "ep");
    d.apply = FERRY_SPARSE_SCATTER_ADD;
    snprintf(d.index_dtype, sizeof d.index_dtype, "i64");
    snprintf(d.value_dtype, sizeof d.value_dtype, "bf16");
    return d;
}

static ferry_sparse_target mktarget(const char *id, uint32_t node, uint32_t ep, uint32_t ndim,
                                    const uint64_t *off, const uint64_t *shape)
{
    ferry_sparse_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.tensor_id, sizeof t.tensor_id, "%s", id);
    t.node = node;
    t.axis_index = ep;
    t.ndim = ndim;
    memcpy(t.offset, off, ndim * 8);
    memcpy(t.shape, shape, ndim * 8);
    return t;
}

static void print_stats(const char *what, const ferry_sparse_stats *s)
{
    printf("# %s: source_objects=%" PRIu64 " non_ep_source_object_count=%" PRIu64
           " index_gets=%" PRIu64 " index_cache_hits=%" PRIu64 " unique_range_gets=%" PRIu64
           " full_indices_values_get_count=%" PRIu64 " dedup_hits=%" PRIu64 " bytes_read=%" PRIu64
           " entries_read=%" PRIu64 " entries_kept=%" PRIu64 " boundary_filtered=%" PRIu64 "\n",
           what, s->source_objects, s->non_ep_source_object_count, s->index_gets,
           s->index_cache_hits, s->unique_range_gets, s->full_indices_values_get_count,
           s->dedup_hits, s->bytes_read, s->entries_read, s->entries_kept, s->boundary_filtered);
}

/* ---- the RFC's cases --------------------------------------------------------------------- */

/* Non-EP weight [1024, 2048] (tiles 256 x 256), EP2 x TP2 with TP
 * splitting rows in two: both EP replicas on one node share the two TP
 * ranges. */
static void test_acceptance_non_ep(void **state)
{
    fixture *f = *state;
    const uint64_t shape[2] = {1024, 2048}, half[2] = {512, 2048};
    ferry_sparse_target t[4];
    for (uint32_t ep = 0; ep < 2; ep++)
        for (uint32_t tp = 0; tp < 2; tp++) {
            uint64_t off[2] = {512 * tp, 0};
            t[ep * 2 + tp] = mktarget("shared.w", 0, ep, 2, off, half);
        }
    ferry_sparse_desc dd = mkdesc("shared.w", 2, shape);
    dd.tile[0] = dd.tile[1] = 256;   /* the counts below are for 256 x 256 tiles */
    spcase c = {.d = dd, .nnz = 20000, .t = t, .nt = 4,
                .dst_dtype = "bf16"};
    ferry_sparse_stats st;
    ferry_sparse_desc put;
    run_case(f, &c, &st, &put);
    print_stats("non-EP EP2xTP2, one node", &st);
    assert_int_equal(st.non_ep_source_object_count, 1);
    assert_int_equal(st.full_indices_values_get_count, 0);
    assert_int_equal(st.unique_range_gets, 2);
    assert_int_equal(st.dedup_hits, 2);
    assert_int_equal(st.index_gets, 1);
    assert_int_equal(st.entries_read, put.nnz);   /* each entry read once */
    assert_int_equal(st.boundary_filtered, 0);     /* the split is tile-aligned */

    /* the same object again, the replicas on two nodes: the index comes
     * from the reader's cache, each node reads its two ranges */
    char key[512];
    ferry_error err = {0};
    snprintf(key, sizeof key, "ferry/sp/shared.w/%020d-%020d/rep-ep", 7, 8);
    t[2].node = t[3].node = 1;
    const char *keys[1] = {key};
    ferry_sparse_result *res = NULL;
    size_t nres = 0;
    assert_int_equal(ferry_sparse_reader_read(f->rd, keys, 1, t, 4, NULL, &res, &nres, &st,
                                              &err), 0);
    print_stats("non-EP EP2xTP2, two nodes", &st);
    assert_int_equal(nres, 4);
    assert_int_equal(st.index_cache_hits, 1);
    assert_int_equal(st.index_gets, 0);
    assert_int_equal(st.unique_range_gets, 4);
    assert_int_equal(st.full_indices_values_get_count, 0);
    ferry_sparse_results_free(res, nres);
    /* the one-shot read keeps nothing: it reads the index again */
    assert_int_equal(ferry_read_sparse_objects(f->s, keys, 1, t, 4, NULL, &res, &nres, &st,
                                               &err), 0);
    assert_int_equal(nres, 4);
    assert_int_equal(st.index_cache_hits, 0);
    assert_int_equal(st.index_gets, 1);
    ferry_sparse_results_free(res, nres);

    /* TP splitting columns instead: each TP box needs one range per tile row */
    const uint64_t colhalf[2] = {1024, 1024};
    for (uint32_t i = 0; i < 4; i++) {
        uint64_t off[2] = {0, 1024 * (i % 2)};
        t[i] = mktarget("shared.w", 0, i / 2, 2, off, colhalf);
    }
    assert_int_equal(ferry_sparse_reader_read(f->rd, keys, 1, t, 4, NULL, &res, &nres, &st,
                                              &err), 0);
    print_stats("non-EP EP2xTP2 column split, one node", &st);
    assert_int_equal(st.index_cache_hits, 1);
    assert_int_equal(st.unique_range_gets, 2 * 4);   /* 4 tile rows x 2 column halves */
    assert_int_equal(st.full_indices_values_get_count, 0);
    ferry_sparse_results_free(res, nres);
}

/* An EP expert owned by ep=1: EP0's targets get nothing, EP1's two TP
 * boxes (columns, cutting through tiles) get their parts. */
static void test_ep_expert(void **state)
{
    fixture *f = *state;
    const uint64_t shape[2] = {512, 768}, box[2] = {512, 384};
    ferry_sparse_target t[4];
    for (uint32_t i = 0; i < 4; i++) {
        uint64_t off[2] = {0, 384 * (i % 2)};
        t[i] = mktarget("expert.3.w1", i / 2, i / 2, 2, off, box);
    }
    ferry_sparse_desc dd = mkdesc("expert.3.w1", 2, shape);
    dd.tile[0] = dd.tile[1] = 256;   /* 384 cuts through these tiles */
    spcase c = {.d = dd, .nnz = 8000, .t = t, .nt = 4,
                .dst_dtype = "f32"};
    c.d.placement.kind = FERRY_SPARSE_OWNER;
    c.d.placement.owner = 1;
    snprintf(c.d.value_dtype, sizeof c.d.value_dtype, "f32");
    ferry_sparse_stats st;
    run_case(f, &c, &st, NULL);
    print_stats("EP expert owner ep=1, TP2 columns", &st);
    assert_int_equal(st.non_ep_source_object_count, 0);
    assert_int_equal(st.source_objects, 1);
    assert_true(st.boundary_filtered > 0);   /* 384 is not a multiple of the 256 tile */
    assert_int_equal(st.full_indices_values_get_count, 0);
}

/* EP-only: each target box is the whole tensor (no TP): the one read is
 * the whole entry range, and is counted as such. */
static void test_ep_only(void **state)
{
    fixture *f = *state;
    const uint64_t shape[2] = {300, 200}, zero[2] = {0, 0};
    ferry_sparse_target t[2] = {mktarget("ep.only", 0, 0, 2, zero, shape),
                                mktarget("ep.only", 0, 1, 2, zero, shape)};
    spcase c = {.d = mkdesc("ep.only", 2, shape), .nnz = 3000, .t = t, .nt = 2,
                .dst_dtype = "f16"};
    snprintf(c.d.value_dtype, sizeof c.d.value_dtype, "f16");
    c.d.apply = FERRY_SPARSE_SCATTER_SET;
    c.publish = "ferry/sp-local/ep-only";
    ferry_sparse_stats st;
    run_case(f, &c, &st, NULL);
    print_stats("EP-only, two EP targets on one node", &st);
    assert_int_equal(st.unique_range_gets, 1);
    assert_int_equal(st.full_indices_values_get_count, 1);
    assert_int_equal(st.dedup_hits, 1);
    assert_int_equal(st.boundary_filtered, 0);
}

/* Errors: a missing key, a target box outside the tensor. */
static void test_exec_errors(void **state)
{
    fixture *f = *state;
    const char *keys[1] = {"ferry/sp/nothing/x"};
    const uint64_t shape[2] = {8, 8}, zero[2] = {0, 0}, big[2] = {9, 8};
    ferry_sparse_target t = mktarget("nothing", 0, 0, 2, zero, shape);
    ferry_sparse_result *res = (ferry_sparse_result *)1;
    size_t n = 7;
    ferry_error err = {0};
    assert_int_equal(ferry_read_sparse_objects(f->s, keys, 1, &t, 1, NULL, &res, &n, NULL, &err),
                     FERRY_ENOENT);
    assert_null(res);
    assert_int_equal(n, 0);
    res = (ferry_sparse_result *)1;
    n = 7;
    assert_int_equal(ferry_sparse_reader_read(f->rd, keys, 1, &t, 1, NULL, &res, &n, NULL, &err),
                     FERRY_ENOENT);
    assert_null(res);
    assert_int_equal(n, 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_sparse_reader_read(NULL, keys, 1, &t, 1, NULL, &res, &n, NULL, &err),
                     FERRY_EINVAL);
    assert_true(err.msg[0] != 0);
    ferry_sparse_desc d = mkdesc("small", 2, shape);
    d.nnz = 1;
    int64_t ind[2] = {1, 1};
    uint16_t v = 0x3f80;   /* 1.0 in bf16 */
    char key[512];
    assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, &v, NULL, key, sizeof key, &err), 0);
    keys[0] = key;
    t = mktarget("small", 0, 0, 2, zero, big);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_read_sparse_objects(f->s, keys, 1, &t, 1, NULL, &res, &n, NULL, &err),
                     FERRY_EINVAL);
    assert_true(err.msg[0] != 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_sparse_reader_read(f->rd, keys, 1, &t, 1, NULL, &res, &n, NULL, &err),
                     FERRY_EINVAL);
    assert_true(err.msg[0] != 0);
}

/* ---- random cases against the oracle ------------------------------------------------------ */

static void test_random_oracle(void **state)
{
    fixture *f = *state;
    const char *vdts[] = {"f32", "bf16", "f16"};
    const char *idts[] = {"i32", "i64"};
    uint64_t totals[4] = {0};
    for (int it = 0; it < 40; it++) {
        uint32_t nd = 1 + (uint32_t)rndn(3);
        uint64_t shape[3];
        for (uint32_t k = 0; k < nd; k++)
            shape[k] = nd == 1 ? 1 + rndn(5000) : nd == 2 ? 1 + rndn(300) : 1 + rndn(40);
        char id[32];
        snprintf(id, sizeof id, "rand.%d", it);
        spcase c = {.d = mkdesc(id, nd, shape), .dst_dtype = vdts[rndn(3)], .one_shot = it % 2};
        snprintf(c.d.value_dtype, sizeof c.d.value_dtype, "%s", vdts[rndn(3)]);
        snprintf(c.d.index_dtype, sizeof c.d.index_dtype, "%s", idts[rndn(2)]);
        if (rndn(2))
            for (uint32_t k = 0; k < nd; k++)
                c.d.tile[k] = 1 + rndn(shape[k] < 64 ? shape[k] : 64);
        c.d.apply = rndn(3) == 0 ? FERRY_SPARSE_SCATTER_SET : FERRY_SPARSE_SCATTER_ADD;
        if (rndn(2)) {
            c.d.placement.kind = FERRY_SPARSE_OWNER;
            c.d.placement.owner = (uint32_t)rndn(2);
        }
        uint64_t N = total_of(&c.d);
        double density = (double)(1 + rndn(200)) / 1000.0;
        c.nnz = (uint64_t)(density * (double)N) + 1;
        /* targets: 2 EP replicas x a grid of random cuts per dimension */
        uint64_t cuts[3][4], ncut[3];
        size_t nboxes = 1;
        for (uint32_t k = 0; k < nd; k++) {
            ncut[k] = 1 + rndn(shape[k] < 3 ? shape[k] : 3);
            cuts[k][0] = 0;
            for (uint64_t q = 1; q < ncut[k]; q++) {   /* ascending, distinct */
                uint64_t lo = cuts[k][q - 1] + 1, room = shape[k] - (ncut[k] - q) - lo + 1;
                cuts[k][q] = lo + rndn(room);
            }
            cuts[k][ncut[k]] = shape[k];
            nboxes *= ncut[k];
        }
        ferry_sparse_target t[2 * 27];
        c.nt = 0;
        for (uint32_t ep = 0; ep < 2; ep++)
            for (size_t b = 0; b < nboxes; b++) {
                uint64_t off[3], sh[3];
                size_t rem = b;
                for (uint32_t k = 0; k < nd; k++) {
                    uint64_t q = rem % ncut[k];
                    rem /= ncut[k];
                    off[k] = cuts[k][q];
                    sh[k] = cuts[k][q + 1] - cuts[k][q];
                }
                t[c.nt++] = mktarget(id, (uint32_t)rndn(2), ep, nd, off, sh);
            }
        c.t = t;
        if (it % 5 == 0) {
            static char pfx[64];
            snprintf(pfx, sizeof pfx, "ferry/sp-local/r%d", it);
            c.publish = pfx;
        }
        ferry_sparse_stats st;
        run_case(f, &c, &st, NULL);
        totals[0] += st.unique_range_gets;
        totals[1] += st.entries_read;
        totals[2] += st.entries_kept;
        totals[3] += st.boundary_filtered;
    }
    printf("# random oracle: 40 cases, unique_range_gets=%" PRIu64 " entries_read=%" PRIu64
           " entries_kept=%" PRIu64 " boundary_filtered=%" PRIu64 "\n", totals[0], totals[1],
           totals[2], totals[3]);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply),
        cmocka_unit_test_setup_teardown(test_acceptance_non_ep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ep_expert, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ep_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_oracle, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
