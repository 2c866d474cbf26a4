/* Sparse COO objects against a real master and node: the meta codec; put
 * and index round trip (entries sorted by (tile, element), tile_coords and
 * tile_ptr checked against a brute-force rebuild); the default tile shape;
 * the duplicate policy (scatter_add sums, scatter_set refuses); idempotent
 * put (FERRY_EEXIST, one object); owner admission (one of two ranks); every
 * bad input refused with a sentence and nothing stored; an inconsistent
 * index refused with FERRY_EPROTO. */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/base.h"
#include "util/ftstore.h"
#include "ferry/sparse.h"
#include "ferry/weights.h"
#include "sparse/sparse_int.h"

typedef ft_solo fixture;

static int setup(void **state) { return ft_solo_setup(state, 64u << 20, 10000); }
static int teardown(void **state) { return ft_solo_teardown(state); }

static size_t count_prefix(ferry_store *s, const char *prefix)
{
    char **keys = NULL;
    size_t n = 0;
    bool more = false;
    assert_int_equal(ferry_store_list(s, prefix, NULL, 1000, &keys, &n, &more, NULL), 0);
    ferry_store_free(keys);
    return n;
}

static ferry_sparse_desc desc2(const char *id, uint64_t r, uint64_t c, const char *idt,
                               const char *vdt, uint64_t nnz)
{
    ferry_sparse_desc d;
    memset(&d, 0, sizeof d);
    snprintf(d.tensor_id, sizeof d.tensor_id, "%s", id);
    d.ndim = 2;
    d.shape[0] = r;
    d.shape[1] = c;
    d.base_generation = 1;
    d.delta_generation = 2;
    d.placement.kind = FERRY_SPARSE_REPLICATE;
    snprintf(d.placement.axis, sizeof d.placement.axis, "ep");
    d.apply = FERRY_SPARSE_SCATTER_ADD;
    snprintf(d.index_dtype, sizeof d.index_dtype, "%s", idt);
    snprintf(d.value_dtype, sizeof d.value_dtype, "%s", vdt);
    d.nnz = nnz;
    return d;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- the meta codec (no cluster) ----------------------------------------------------- */

static void test_meta_codec(void **state)
{
    (void)state;
    ferry_sparse_desc d = desc2("layers.0.w1", 512, 768, "i64", "bf16", 10), back;
    d.tile[0] = d.tile[1] = 256;
    d.ntiles = 2;
    char *j = NULL;
    size_t n = 0;
    ferry_error err = {0};
    assert_int_equal(fr_sparse_meta_encode(&d, &j, &n), 0);
    assert_int_equal(fr_sparse_meta_decode(j, n, &back, &err), 0);
    assert_memory_equal(&d, &back, sizeof d);
    free(j);
    char key[600];
    assert_true(fr_sparse_key(&d, key, sizeof key) > 0);
    assert_string_equal(key, "ferry/sp/layers.0.w1/00000000000000000001-00000000000000000002/rep-ep");
    d.placement.kind = FERRY_SPARSE_OWNER;
    d.placement.owner = 3;
    assert_true(fr_sparse_key(&d, key, sizeof key) > 0);
    assert_string_equal(key,
                        "ferry/sp/layers.0.w1/00000000000000000001-00000000000000000002/own-ep-3");
    const char *bad[] = {
        "", "{", "[]", "{\"schema\":\"x\"}",
        "{\"apply\":\"scatter_add\",\"base_generation\":3,\"delta_generation\":3,"
        "\"index_dtype\":\"i64\",\"nnz\":1,\"ntiles\":1,\"placement\":{\"axis\":\"\",\"kind\":"
        "\"replicate\",\"owner\":0},\"schema\":\"ferry.sparse_object\",\"shape\":[4],"
        "\"tensor_id\":\"t\",\"tile\":[4],\"value_dtype\":\"f32\",\"version\":1}",
        "{\"apply\":\"scatter_add\",\"base_generation\":1,\"delta_generation\":3,"
        "\"index_dtype\":\"i64\",\"nnz\":1,\"ntiles\":1,\"placement\":{\"axis\":\"\",\"kind\":"
        "\"replicate\",\"owner\":0},\"schema\":\"ferry.sparse_object\",\"shape\":[4],"
        "\"tensor_id\":\"t\",\"tile\":[5],\"value_dtype\":\"f32\",\"version\":1}",
        "{\"apply\":\"scatter_add\",\"base_generation\":1,\"delta_generation\":3,"
        "\"index_dtype\":\"u8\",\"nnz\":1,\"ntiles\":1,\"placement\":{\"axis\":\"\",\"kind\":"
        "\"replicate\",\"owner\":0},\"schema\":\"ferry.sparse_object\",\"shape\":[4],"
        "\"tensor_id\":\"t\",\"tile\":[4],\"value_dtype\":\"f32\",\"version\":1}",
        "{\"apply\":\"scatter_add\",\"base_generation\":1,\"delta_generation\":3,"
        "\"index_dtype\":\"i64\",\"nnz\":1,\"ntiles\":2,\"placement\":{\"axis\":\"\",\"kind\":"
        "\"replicate\",\"owner\":0},\"schema\":\"ferry.sparse_object\",\"shape\":[4],"
        "\"tensor_id\":\"t\",\"tile\":[4],\"value_dtype\":\"f32\",\"version\":1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(fr_sparse_meta_decode(bad[i], strlen(bad[i]), &back, &err),
                         FERRY_EPROTO);
        assert_true(err.msg[0] != 0);
    }
}

/* ---- put and the index ----------------------------------------------------------------- */

static int cmp_lex(const int64_t *a, const int64_t *b, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        if (a[k] != b[k])
            return a[k] < b[k] ? -1 : 1;
    return 0;
}

/* Read the whole object back and check order and index against the rules. */
static void check_object(ferry_store *s, const char *key, const ferry_sparse_desc *d)
{
    ferry_sparse_index ix;
    ferry_error err = {0};
    assert_int_equal(ferry_sparse_index_read(s, key, &ix, &err), 0);
    assert_memory_equal(&ix.desc, d, sizeof *d);
    assert_string_equal(ix.key, key);
    uint32_t nd = d->ndim;
    size_t isz = strcmp(d->index_dtype, "i32") == 0 ? 4 : 8;
    uint8_t *raw = malloc(d->nnz * nd * isz);
    int64_t *idx = malloc(d->nnz * nd * sizeof *idx);
    size_t len = 0;
    assert_int_equal(ferry_store_read_member(s, key, "indices", 0, d->nnz, raw, d->nnz * nd * isz,
                                             &len, NULL), 0);
    for (uint64_t i = 0; i < d->nnz * nd; i++) {
        if (isz == 4) {
            int32_t v;
            memcpy(&v, raw + i * 4, 4);
            idx[i] = v;
        } else {
            memcpy(&idx[i], raw + i * 8, 8);
        }
    }
    uint64_t t = 0;
    for (uint64_t i = 0; i < d->nnz; i++) {
        int64_t tc[FERRY_SPARSE_NDIM_MAX];
        for (uint32_t k = 0; k < nd; k++)
            tc[k] = idx[i * nd + k] / (int64_t)d->tile[k];
        if (i > 0) {   /* sorted by (tile, element), no duplicates */
            int64_t pc[FERRY_SPARSE_NDIM_MAX];
            for (uint32_t k = 0; k < nd; k++)
                pc[k] = idx[(i - 1) * nd + k] / (int64_t)d->tile[k];
            int c = cmp_lex(pc, tc, nd);
            assert_true(c < 0 || (c == 0 && cmp_lex(&idx[(i - 1) * nd], &idx[i * nd], nd) < 0));
        }
        while ((uint64_t)ix.tile_ptr[t + 1] <= i)
            t++;
        assert_true(t < d->ntiles);
        assert_int_equal(cmp_lex(&ix.tile_coords[t * nd], tc, nd), 0);
    }
    assert_int_equal(ix.tile_ptr[d->ntiles], d->nnz);
    free(raw);
    free(idx);
    ferry_sparse_index_free(&ix);
}

static void test_put_roundtrip(void **state)
{
    fixture *f = *state;
    const char *idts[] = {"i32", "i64"};
    for (int it = 0; it < 2; it++) {
        uint64_t nnz = 5000;
        ferry_sparse_desc d = desc2(it ? "w.rt64" : "w.rt32", 600, 700, idts[it], "f32", nnz);
        d.tile[0] = 128;
        d.tile[1] = 96;
        size_t isz = it ? 8 : 4;
        uint8_t *ind = malloc(nnz * 2 * isz);
        float *val = malloc(nnz * sizeof *val);
        /* distinct coordinates: a random permutation of a strided set */
        for (uint64_t i = 0; i < nnz; i++) {
            uint64_t lin = (i * 7919 + 13) % (600 * 700);
            int64_t c[2] = {(int64_t)(lin / 700), (int64_t)(lin % 700)};
            for (int k = 0; k < 2; k++) {
                if (isz == 4) {
                    int32_t v = (int32_t)c[k];
                    memcpy(ind + (i * 2 + k) * 4, &v, 4);
                } else {
                    memcpy(ind + (i * 2 + k) * 8, &c[k], 8);
                }
            }
            val[i] = (float)(int)(rnd() % 64) - 32.0f;
        }
        ferry_sparse_desc out;
        char key[512];
        ferry_error err = {0};
        assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, val, &out, key, sizeof key, &err),
                         0);
        assert_int_equal(out.nnz, nnz);
        assert_int_equal(out.tile[0], 128);
        assert_true(out.ntiles > 1 && out.ntiles <= 5 * 8);
        check_object(f->s, key, &out);
        /* every (coordinate, value) survived the sort */
        int64_t *gi = malloc(nnz * 2 * 8);
        float *gv = malloc(nnz * 4);
        uint8_t *raw = malloc(nnz * 2 * isz);
        size_t len;
        assert_int_equal(ferry_store_read_member(f->s, key, "indices", 0, nnz, raw, nnz * 2 * isz,
                                                 &len, NULL), 0);
        assert_int_equal(ferry_store_read_member(f->s, key, "values", 0, nnz, gv, nnz * 4, &len, NULL),
                         0);
        float *dense = calloc(600 * 700, sizeof *dense), *dense2 = calloc(600 * 700, 4);
        for (uint64_t i = 0; i < nnz; i++) {
            int64_t c[2];
            for (int k = 0; k < 2; k++) {
                if (isz == 4) {
                    int32_t v;
                    memcpy(&v, raw + (i * 2 + k) * 4, 4);
                    c[k] = v;
                } else {
                    memcpy(&c[k], raw + (i * 2 + k) * 8, 8);
                }
            }
            dense[c[0] * 700 + c[1]] = gv[i];
            uint64_t lin = (i * 7919 + 13) % (600 * 700);
            dense2[lin] = val[i];
        }
        assert_memory_equal(dense, dense2, 600 * 700 * 4);
        free(dense);
        free(dense2);
        free(gi);
        free(gv);
        free(raw);
        free(ind);
        free(val);
    }
    assert_int_equal(count_prefix(f->s, "ferry/sp/"), 2);
}

static void test_default_tile(void **state)
{
    fixture *f = *state;
    struct { uint32_t nd; uint64_t shape[3], tile[3]; } cases[] = {
        {2, {1024, 4096}, {128, 128}},
        {2, {8, 100000}, {8, 2048}},
        {1, {100000}, {16384}},
        {1, {300}, {300}},
        {2, {3, 5}, {3, 5}},
        {3, {8, 2048, 1024}, {8, 64, 32}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char id[32];
        snprintf(id, sizeof id, "tile.%zu", i);
        ferry_sparse_desc d = desc2(id, 1, 1, "i64", "f32", 1), out;
        d.ndim = cases[i].nd;
        memcpy(d.shape, cases[i].shape, sizeof cases[i].shape);
        int64_t ind[3] = {0, 0, 0};
        float v = 1.0f;
        ferry_error err = {0};
        assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, &v, &out, NULL, 0, &err), 0);
        uint64_t vol = 1;
        for (uint32_t k = 0; k < d.ndim; k++) {
            vol *= out.tile[k];
            assert_int_equal(out.tile[k], cases[i].tile[k]);
        }
        assert_true(vol <= 16384);
        assert_int_equal(out.ntiles, 1);
    }
}

static void test_duplicates(void **state)
{
    fixture *f = *state;
    /* scatter_add: (1,1) three times sums to 7; in bf16 and f16 too */
    const char *vdts[] = {"f32", "bf16", "f16"};
    for (int v = 0; v < 3; v++) {
        char id[32];
        snprintf(id, sizeof id, "dup.%s", vdts[v]);
        ferry_sparse_desc d = desc2(id, 4, 4, "i32", vdts[v], 4), out;
        int32_t ind[8] = {1, 1, 0, 2, 1, 1, 1, 1};
        float fv[4] = {1.0f, 5.0f, 2.0f, 4.0f};
        uint8_t vals[16];
        assert_int_equal(ferry_convert(fv, "f32", vals, vdts[v], 4), 0);
        char key[512];
        ferry_error err = {0};
        assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, vals, &out, key, sizeof key, &err),
                         0);
        assert_int_equal(out.nnz, 2);
        uint8_t got[8];
        float gf[2];
        size_t len;
        assert_int_equal(ferry_store_read_member(f->s, key, "values", 0, 2, got, sizeof got, &len, NULL),
                         0);
        assert_int_equal(ferry_convert(got, vdts[v], gf, "f32", 2), 0);
        assert_true(gf[0] == 5.0f && gf[1] == 7.0f);   /* (0,2) then (1,1) */
    }
    /* scatter_set refuses, naming the coordinate; nothing stored */
    ferry_sparse_desc d = desc2("dup.set", 4, 4, "i64", "f32", 3);
    d.apply = FERRY_SPARSE_SCATTER_SET;
    int64_t ind[6] = {0, 0, 3, 2, 3, 2};
    float vals[3] = {1, 2, 3};
    ferry_error err = {0};
    assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, vals, NULL, NULL, 0, &err),
                     FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "(3, 2)"));
    assert_int_equal(count_prefix(f->s, "ferry/sp/dup.set/"), 0);
}

static void test_idempotent_and_admit(void **state)
{
    fixture *f = *state;
    ferry_sparse_desc d = desc2("idem", 16, 16, "i64", "f32", 2);
    int64_t ind[4] = {1, 2, 3, 4};
    float vals[2] = {1, 2};
    ferry_error err = {0};
    char key[512];
    assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, vals, NULL, key, sizeof key, &err), 0);
    /* a retry of the same logical key, even with other content */
    vals[0] = 9;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, vals, NULL, NULL, 0, &err),
                     FERRY_EEXIST);
    assert_non_null(strstr(err.msg, "already exists"));
    assert_int_equal(count_prefix(f->s, "ferry/sp/idem/"), 1);
    float got[2];
    size_t len;
    assert_int_equal(ferry_store_read_member(f->s, key, "values", 0, 2, got, sizeof got, &len, NULL), 0);
    assert_true(got[0] == 1.0f);
    /* another placement is another logical key */
    d.placement.kind = FERRY_SPARSE_OWNER;
    d.placement.owner = 1;
    assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, vals, NULL, NULL, 0, &err), 0);
    assert_int_equal(count_prefix(f->s, "ferry/sp/idem/"), 2);

    /* admission: two ranks, one admitted; a retry by the winner still is */
    ferry_sparse_desc a = desc2("adm", 16, 16, "i64", "f32", 0);
    bool r0 = false, r1 = false, again = false;
    assert_int_equal(ferry_sparse_admit(f->s, &a, 0, &r0, &err), 0);
    assert_int_equal(ferry_sparse_admit(f->s, &a, 1, &r1, &err), 0);
    assert_int_equal(ferry_sparse_admit(f->s, &a, 0, &again, &err), 0);
    assert_true(r0 && !r1 && again);
    a.delta_generation = 3;   /* the next update admits afresh */
    assert_int_equal(ferry_sparse_admit(f->s, &a, 1, &r1, &err), 0);
    assert_true(r1);
}

/* ferry_put_sparse_objects: each object as its own put would store it
 * (the same bytes, index and key), an existing key refused, a bad
 * descriptor refused with its sentence, the others stored all the same. */
static void test_put_batch(void **state)
{
    fixture *f = *state;
    enum { N = 4 };
    ferry_sparse_desc d[N];
    int64_t ind[N][6] = {{3, 1, 0, 0, 3, 1}, {5, 5, 1, 2, 0, 0}, {0, 0, 15, 15, 7, 7},
                         {1, 1, 2, 2, 3, 3}};
    float vals[N][3] = {{1, 2, 4}, {5, 6, 7}, {8, 9, 10}, {11, 12, 13}};
    const void *pi[N], *pv[N];
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "batch%d", i);
        d[i] = desc2(id, 16, 16, "i64", "f32", 3);
        pi[i] = ind[i], pv[i] = vals[i];
    }
    ferry_error err = {0};
    /* batch1 exists already; batch2's descriptor is bad (base == delta) */
    assert_int_equal(ferry_put_sparse_object(f->s, &d[1], ind[1], vals[1], NULL, NULL, 0, &err), 0);
    d[2].base_generation = d[2].delta_generation;
    ferry_sparse_desc got[N];
    char keys[N][512];
    int res[N];
    memset(keys, 0, sizeof keys);
    assert_int_equal(ferry_put_sparse_objects(f->s, d, pi, pv, N, got, &keys[0][0], sizeof keys[0],
                                              res, &err), FERRY_EEXIST);
    assert_non_null(strstr(err.msg, "already exists"));   /* the first failure, in order */
    assert_int_equal(res[0], 0);
    assert_int_equal(res[1], FERRY_EEXIST);
    assert_int_equal(res[2], FERRY_EINVAL);
    assert_int_equal(res[3], 0);
    assert_non_null(strstr(keys[1], "ferry/sp/batch1/"));
    for (int i = 0; i < N; i += 3) {   /* stored as a single put stores them */
        assert_int_equal(got[i].nnz, i == 0 ? 2 : 3);   /* batch0 has (3, 1) twice: summed */
        ferry_sparse_index ix;
        assert_int_equal(ferry_sparse_index_read(f->s, keys[i], &ix, &err), 0);
        assert_int_equal(ix.desc.nnz, got[i].nnz);
        ferry_sparse_index_free(&ix);
        float v[3];
        size_t len;
        assert_int_equal(ferry_store_read_member(f->s, keys[i], "values", 0, got[i].nnz, v,
                                                 sizeof v, &len, NULL), 0);
        if (i == 0)   /* sorted: (0, 0) first, then (3, 1) = 1 + 4 */
            assert_true(v[0] == 2.0f && v[1] == 5.0f);
        else
            assert_true(v[0] == 11.0f && v[1] == 12.0f && v[2] == 13.0f);
    }
    assert_int_equal(count_prefix(f->s, "ferry/sp/batch2/"), 0);
    /* removed many at once, with their admission keys; each key answers */
    bool adm = false;
    assert_int_equal(ferry_sparse_admit(f->s, &d[3], 0, &adm, &err), 0);
    assert_true(adm);
    char bad[] = "not/a/key";
    const char *rk[4] = { keys[1], "ferry/sp/batch9/00000000000000000001-00000000000000000002/rep-ep",
                          keys[3], bad };
    bad[0] = '\0';   /* an empty key: no sparse object's */
    int rr[4];
    int rmrc = ferry_sparse_remove_many(f->s, rk, 4, rr, &err);
    /* The test's reads lease for 1 ms, but a lease the batch put's lookup
     * took in the same master loop turn as the removal can still hold on a
     * loaded machine: such an entry (FERRY_EBUSY) is removed again, alone,
     * until its lease is gone. */
    for (int i = 0; i < 4; i++) {
        uint64_t dl = fr_deadline_ns(10000);
        while (rr[i] == FERRY_EBUSY && fr_ms_left(dl) > 0) {
            struct timespec ts = { 0, 10 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
            nanosleep(&ts, NULL);
            const char *one[1] = { rk[i] };
            (void)ferry_sparse_remove_many(f->s, one, 1, &rr[i], NULL);
        }
    }
    assert_true(rmrc == FERRY_ENOENT || rmrc == FERRY_EBUSY);
    assert_int_equal(rr[0], 0);
    assert_int_equal(rr[1], FERRY_ENOENT);
    assert_int_equal(rr[2], 0);
    assert_int_equal(rr[3], FERRY_EINVAL);
    assert_int_equal(count_prefix(f->s, "ferry/sp/batch1/"), 0);
    assert_int_equal(count_prefix(f->s, "ferry/sp/batch3/"), 0);
    adm = false;   /* its admission key went too: admitted afresh */
    assert_int_equal(ferry_sparse_admit(f->s, &d[3], 1, &adm, &err), 0);
    assert_true(adm);
    /* zero objects: nothing to do */
    assert_int_equal(ferry_put_sparse_objects(f->s, d, pi, pv, 0, NULL, NULL, 0, res, &err), 0);
}

/* ferry_sparse_remove takes the object and its admission key (admitted
 * afresh after it); ferry_sparse_remove_tensors every object of the tensors
 * named by a prefix, and nothing else. */
static void test_remove(void **state)
{
    fixture *f = *state;
    int64_t ind[4] = {1, 2, 3, 4};
    float vals[2] = {1, 2};
    ferry_error err = {0};
    char key[512];
    ferry_sparse_desc d = desc2("rm.a", 16, 16, "i64", "f32", 2);
    assert_int_equal(ferry_put_sparse_object(f->s, &d, ind, vals, NULL, key, sizeof key, &err), 0);
    bool adm = false;
    assert_int_equal(ferry_sparse_admit(f->s, &d, 0, &adm, &err), 0);
    assert_true(adm);
    assert_int_equal(ferry_sparse_admit(f->s, &d, 1, &adm, &err), 0);
    assert_false(adm);
    assert_int_equal(ferry_sparse_remove(f->s, key, NULL), 0);
    assert_int_equal(ferry_store_exist(f->s, key, NULL), 0);
    assert_int_equal(ferry_sparse_remove(f->s, key, &err), FERRY_ENOENT);
    assert_non_null(strstr(err.msg, key));
    assert_int_equal(ferry_sparse_admit(f->s, &d, 1, &adm, &err), 0);
    assert_true(adm);   /* its admission key went with it */
    assert_int_equal(ferry_sparse_remove(f->s, "", NULL), FERRY_EINVAL);

    const char *ids[] = { "rm.a", "rm.b", "rmx.c" };
    for (size_t i = 0; i < 3; i++) {
        ferry_sparse_desc e = desc2(ids[i], 16, 16, "i64", "f32", 2);
        assert_int_equal(ferry_put_sparse_object(f->s, &e, ind, vals, NULL, NULL, 0, &err), 0);
    }
    uint64_t removed = 0;
    assert_int_equal(ferry_sparse_remove_tensors(f->s, "rm.", &removed, NULL), 0);
    assert_int_equal(removed, 2);
    assert_int_equal(count_prefix(f->s, "ferry/sp/rm."), 0);
    assert_int_equal(count_prefix(f->s, "ferry/sp/rmx."), 1);
    assert_int_equal(ferry_sparse_remove_tensors(f->s, "", NULL, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "empty tensor prefix"));
}

static void test_bad_input(void **state)
{
    fixture *f = *state;
    int64_t ind[4] = {1, 2, 3, 4};
    float vals[2] = {1, 2};
    struct { const char *what, *expect; ferry_sparse_desc d; } c[16];
    size_t n = 0;
    ferry_sparse_desc ok = desc2("bad", 16, 16, "i64", "f32", 2);
#define BAD(w, e, stmt) do { c[n].what = w; c[n].expect = e; c[n].d = ok; \
        { ferry_sparse_desc *d = &c[n].d; stmt; } n++; } while (0)
    BAD("out of bounds", "outside the shape", d->shape[1] = 4);
    BAD("value dtype", "value dtype", snprintf(d->value_dtype, 8, "f64"));
    BAD("index dtype", "index dtype", snprintf(d->index_dtype, 8, "u32"));
    BAD("nnz 0", "nnz", d->nnz = 0);
    BAD("nnz huge", "nnz", d->nnz = UINT64_MAX / 4);
    BAD("base == delta", "base < delta", d->base_generation = 2);
    BAD("ndim 0", "ndim", d->ndim = 0);
    BAD("ndim 9", "ndim", d->ndim = 9);
    BAD("zero extent", "shape[1]", d->shape[1] = 0);
    BAD("tile beyond shape", "tile[0]", (d->tile[0] = 32, d->tile[1] = 4));
    BAD("partial tile", "tile shape", d->tile[0] = 4);
    BAD("tensor id", "tensor_id", snprintf(d->tensor_id, 8, "a/b"));
    BAD("owner without axis", "axis", (d->placement.kind = FERRY_SPARSE_OWNER,
                                       d->placement.axis[0] = 0));
    BAD("apply", "apply", d->apply = (enum ferry_sparse_apply)7);
#undef BAD
    for (size_t i = 0; i < n; i++) {
        ferry_error err = {0};
        int rc = ferry_put_sparse_object(f->s, &c[i].d, ind, vals, NULL, NULL, 0, &err);
        if (rc != FERRY_EINVAL || !strstr(err.msg, c[i].expect))
            fail_msg("%s: rc %d, '%s'", c[i].what, rc, err.msg);
        assert_non_null(strstr(err.msg, "nothing stored"));
    }
    int64_t neg[4] = {1, 2, -1, 4};
    ferry_error err = {0};
    assert_int_equal(ferry_put_sparse_object(f->s, &ok, neg, vals, NULL, NULL, 0, &err),
                     FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "indices[1] = (-1, 4)"));
    assert_int_equal(ferry_put_sparse_object(f->s, &ok, NULL, vals, NULL, NULL, 0, &err),
                     FERRY_EINVAL);
    assert_int_equal(count_prefix(f->s, "ferry/sp/"), 0);
}

static void test_index_refuses(void **state)
{
    fixture *f = *state;
    ferry_sparse_index ix;
    ferry_error err = {0};
    /* missing, not structured, not sparse */
    assert_int_equal(ferry_sparse_index_read(f->s, "ferry/sp/none", &ix, &err), FERRY_ENOENT);
    assert_int_equal(ferry_store_put(f->s, "plain", "abcdefgh", 8, NULL, NULL, NULL), 0);
    assert_int_equal(ferry_sparse_index_read(f->s, "plain", &ix, &err), FERRY_EPROTO);
    /* a well-formed meta over a tile_ptr that does not reach nnz */
    ferry_sparse_desc d = desc2("forged", 16, 16, "i64", "f32", 2);
    d.tile[0] = d.tile[1] = 8;
    d.ntiles = 1;
    char *meta;
    size_t mlen;
    assert_int_equal(fr_sparse_meta_encode(&d, &meta, &mlen), 0);
    int64_t tc[2] = {0, 0}, tp[2] = {0, 1}, ind[4] = {0, 0, 1, 1};
    float vals[2] = {1, 2};
    ferry_member m[5];
    memset(m, 0, sizeof m);
    const char *names[5] = {"meta", "tile_coords", "tile_ptr", "indices", "values"};
    const char *dts[5] = {"u8", "i64", "i64", "i64", "f32"};
    uint64_t s0[5] = {mlen, 1, 2, 2, 2}, s1[5] = {0, 2, 0, 2, 0};
    for (int i = 0; i < 5; i++) {
        snprintf(m[i].name, sizeof m[i].name, "%s", names[i]);
        snprintf(m[i].dtype, sizeof m[i].dtype, "%s", dts[i]);
        m[i].ndim = s1[i] ? 2 : 1;
        m[i].shape[0] = s0[i];
        m[i].shape[1] = s1[i];
    }
    const void *data[5] = {meta, tc, tp, ind, vals};
    assert_int_equal(ferry_store_put_struct(f->s, "forged1", m, data, 5, NULL, NULL), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_sparse_index_read(f->s, "forged1", &ix, &err), FERRY_EPROTO);
    assert_non_null(strstr(err.msg, "tile_ptr"));
    /* fixed tile_ptr, but a tile outside the grid */
    tp[1] = 2;
    tc[1] = 2;
    assert_int_equal(ferry_store_put_struct(f->s, "forged2", m, data, 5, NULL, NULL), 0);
    assert_int_equal(ferry_sparse_index_read(f->s, "forged2", &ix, &err), FERRY_EPROTO);
    assert_non_null(strstr(err.msg, "grid"));
    /* consistent: accepted */
    tc[1] = 1;
    assert_int_equal(ferry_store_put_struct(f->s, "forged3", m, data, 5, NULL, NULL), 0);
    assert_int_equal(ferry_sparse_index_read(f->s, "forged3", &ix, &err), 0);
    ferry_sparse_index_free(&ix);
    ferry_sparse_index_free(NULL);
    free(meta);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_codec),
        cmocka_unit_test_setup_teardown(test_put_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_tile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotent_and_admit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_refuses, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
