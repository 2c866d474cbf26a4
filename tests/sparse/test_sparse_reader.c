/* The sparse reader and its index cache against a real master and node: a
 * second read of an unchanged object is served by the cache
 * (index_cache_hits) and gives the same results; two readers of one store
 * keep independent caches; an object removed and put again under the same
 * key is read again, never served stale; the bounds (entries, bytes) evict;
 * concurrent reads on one reader; and the config: defaults, a zeroed
 * config, a reserved word that is not zero (FERRY_EINVAL with a sentence,
 * nothing opened), too many entries, NULL arguments, close(NULL). */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "util/ftstore.h"
#include "ferry/sparse.h"

enum { ROWS = 64, COLS = 48 };

static int setup(void **state) { return ft_solo_setup(state, 64u << 20, 10000); }
static int teardown(void **state) { return ft_solo_teardown(state); }

static ferry_sparse_reader *open_reader(ferry_store *s, uint32_t entries, uint64_t bytes)
{
    ferry_sparse_reader_config cfg;
    assert_int_equal(ferry_sparse_reader_config_init(&cfg), 0);
    if (entries)
        cfg.cache_entries = entries;
    if (bytes)
        cfg.cache_bytes = bytes;
    ferry_sparse_reader *r = NULL;
    ferry_error err = {0};
    if (ferry_sparse_reader_open(s, &cfg, &r, &err) != 0)
        fail_msg("reader: %s", err.msg);
    return r;
}

/* Put tensor id's delta 1 -> 2: nnz entries on the diagonal-ish cells
 * (row i % ROWS, column (i * 7) % COLS, distinct for nnz <= ROWS), each
 * value base + i. The key into key. */
static void put_delta(ferry_store *s, const char *id, uint64_t nnz, float base, char *key,
                      size_t keycap)
{
    ferry_sparse_desc d = {.ndim = 2, .shape = {ROWS, COLS}, .base_generation = 1,
                           .delta_generation = 2, .tile = {16, 16},
                           .apply = FERRY_SPARSE_SCATTER_SET, .nnz = nnz};
    snprintf(d.tensor_id, sizeof d.tensor_id, "%s", id);
    snprintf(d.index_dtype, sizeof d.index_dtype, "i64");
    snprintf(d.value_dtype, sizeof d.value_dtype, "f32");
    int64_t idx[2 * ROWS];
    float val[ROWS];
    for (uint64_t i = 0; i < nnz; i++) {
        idx[2 * i] = (int64_t)(i % ROWS);
        idx[2 * i + 1] = (int64_t)((i * 7) % COLS);
        val[i] = base + (float)i;
    }
    ferry_error err = {0};
    if (ferry_put_sparse_object(s, &d, idx, val, NULL, key, keycap, &err) != 0)
        fail_msg("put %s: %s", id, err.msg);
}

/* Read key for the whole tensor (one target) through r (NULL: the
 * one-shot read); the one result's entries summed into *sum. */
static ferry_sparse_stats read_all(ferry_store *s, ferry_sparse_reader *r, const char *id,
                                   const char *key, uint64_t *nnz, double *sum)
{
    ferry_sparse_target t = {.ndim = 2, .shape = {ROWS, COLS}};
    snprintf(t.tensor_id, sizeof t.tensor_id, "%s", id);
    const char *keys[1] = {key};
    ferry_sparse_result *res = NULL;
    size_t n = 0;
    ferry_sparse_stats st;
    ferry_error err = {0};
    int rc = r ? ferry_sparse_reader_read(r, keys, 1, &t, 1, NULL, &res, &n, &st, &err)
               : ferry_read_sparse_objects(s, keys, 1, &t, 1, NULL, &res, &n, &st, &err);
    if (rc != 0)
        fail_msg("read %s: %s", key, err.msg);
    assert_int_equal(n, 1);
    *nnz = res[0].nnz;
    *sum = 0;
    for (uint64_t i = 0; i < res[0].nnz; i++)
        *sum += ((const float *)res[0].values)[i];
    ferry_sparse_results_free(res, n);
    return st;
}

static double expect_sum(uint64_t nnz, float base)
{
    return (double)nnz * base + (double)nnz * (double)(nnz - 1) / 2;
}

/* A second read of an unchanged object: the index from the cache, the
 * same entries. */
static void test_cache_hits(void **state)
{
    ft_solo *f = *state;
    char key[512];
    put_delta(f->s, "rd.hit", 40, 1.0f, key, sizeof key);
    ferry_sparse_reader *r = open_reader(f->s, 0, 0);
    uint64_t n1, n2;
    double s1, s2;
    ferry_sparse_stats st = read_all(f->s, r, "rd.hit", key, &n1, &s1);
    assert_int_equal(st.index_gets, 1);
    assert_int_equal(st.index_cache_hits, 0);
    st = read_all(f->s, r, "rd.hit", key, &n2, &s2);
    assert_int_equal(st.index_gets, 0);
    assert_true(st.index_cache_hits > 0);
    assert_int_equal(st.index_cache_hits, 1);
    assert_int_equal(st.index_bytes_read, 0);
    assert_int_equal(st.index_checks, 1);   /* the check still happens */
    assert_int_equal(n1, 40);
    assert_int_equal(n2, n1);
    assert_true(s1 == s2 && s1 == expect_sum(40, 1.0f));
    ferry_sparse_reader_close(r);
}

/* Two readers of one store share nothing; the one-shot read keeps
 * nothing. */
static void test_independent(void **state)
{
    ft_solo *f = *state;
    char key[512];
    put_delta(f->s, "rd.two", 20, 2.0f, key, sizeof key);
    ferry_sparse_reader *a = open_reader(f->s, 0, 0), *b = open_reader(f->s, 0, 0);
    uint64_t n;
    double sum;
    ferry_sparse_stats st = read_all(f->s, a, "rd.two", key, &n, &sum);
    assert_int_equal(st.index_gets, 1);
    st = read_all(f->s, a, "rd.two", key, &n, &sum);
    assert_int_equal(st.index_cache_hits, 1);
    /* b has never read it: its cache is empty, whatever a holds */
    st = read_all(f->s, b, "rd.two", key, &n, &sum);
    assert_int_equal(st.index_gets, 1);
    assert_int_equal(st.index_cache_hits, 0);
    st = read_all(f->s, b, "rd.two", key, &n, &sum);
    assert_int_equal(st.index_cache_hits, 1);
    /* closing b leaves a's cache as it was */
    ferry_sparse_reader_close(b);
    st = read_all(f->s, a, "rd.two", key, &n, &sum);
    assert_int_equal(st.index_cache_hits, 1);
    assert_int_equal(st.index_gets, 0);
    for (int k = 0; k < 2; k++) {
        st = read_all(f->s, NULL, "rd.two", key, &n, &sum);
        assert_int_equal(st.index_gets, 1);
        assert_int_equal(st.index_cache_hits, 0);
    }
    assert_int_equal(n, 20);
    assert_true(sum == expect_sum(20, 2.0f));
    ferry_sparse_reader_close(a);
}

/* The object removed and put again under the same key, with other
 * entries: the reader reads the new index, never the cached one. */
static void test_changed_object(void **state)
{
    ft_solo *f = *state;
    char key[512], key2[512];
    put_delta(f->s, "rd.chg", 30, 1.0f, key, sizeof key);
    ferry_sparse_reader *r = open_reader(f->s, 0, 0);
    uint64_t n;
    double sum;
    (void)read_all(f->s, r, "rd.chg", key, &n, &sum);
    ferry_sparse_stats st = read_all(f->s, r, "rd.chg", key, &n, &sum);
    assert_int_equal(st.index_cache_hits, 1);
    assert_int_equal(n, 30);
    /* the read leased it for 1 ms: a remove within that millisecond is
     * refused, so wait for the lease to lapse */
    int rm = FERRY_EBUSY;
    for (int i = 0; i < 10000 && rm == FERRY_EBUSY; i++)
        if ((rm = ferry_sparse_remove(f->s, key, NULL)) == FERRY_EBUSY)
            nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    assert_int_equal(rm, 0);
    /* gone: the read fails, and the entry is not served */
    ferry_sparse_target t = {.ndim = 2, .shape = {ROWS, COLS}, .tensor_id = "rd.chg"};
    const char *keys[1] = {key};
    ferry_sparse_result *res = NULL;
    size_t nres = 0;
    ferry_error err = {0};
    assert_int_equal(ferry_sparse_reader_read(r, keys, 1, &t, 1, NULL, &res, &nres, &st, &err),
                     FERRY_ENOENT);
    assert_non_null(strstr(err.msg, key));
    put_delta(f->s, "rd.chg", 50, 100.0f, key2, sizeof key2);
    assert_string_equal(key, key2);   /* the same logical key */
    st = read_all(f->s, r, "rd.chg", key, &n, &sum);
    assert_int_equal(st.index_cache_hits, 0);
    assert_int_equal(st.index_gets, 1);
    assert_int_equal(n, 50);
    assert_true(sum == expect_sum(50, 100.0f));
    /* and the new index is the one kept */
    st = read_all(f->s, r, "rd.chg", key, &n, &sum);
    assert_int_equal(st.index_cache_hits, 1);
    assert_int_equal(n, 50);
    assert_true(sum == expect_sum(50, 100.0f));
    ferry_sparse_reader_close(r);
}

/* The bounds: one entry keeps the last index read; a byte bound smaller
 * than any index keeps none. */
static void test_bounds(void **state)
{
    ft_solo *f = *state;
    char kx[512], ky[512];
    put_delta(f->s, "rd.bx", 10, 1.0f, kx, sizeof kx);
    put_delta(f->s, "rd.by", 10, 1.0f, ky, sizeof ky);
    uint64_t n;
    double sum;
    ferry_sparse_reader *one = open_reader(f->s, 1, 0);
    (void)read_all(f->s, one, "rd.bx", kx, &n, &sum);
    assert_int_equal(read_all(f->s, one, "rd.bx", kx, &n, &sum).index_cache_hits, 1);
    (void)read_all(f->s, one, "rd.by", ky, &n, &sum);    /* x out, y in */
    assert_int_equal(read_all(f->s, one, "rd.bx", kx, &n, &sum).index_gets, 1);
    assert_int_equal(read_all(f->s, one, "rd.bx", kx, &n, &sum).index_cache_hits, 1);
    ferry_sparse_reader_close(one);
    ferry_sparse_reader *tiny = open_reader(f->s, 0, 1);
    for (int k = 0; k < 2; k++) {
        ferry_sparse_stats st = read_all(f->s, tiny, "rd.bx", kx, &n, &sum);
        assert_int_equal(st.index_gets, 1);
        assert_int_equal(st.index_cache_hits, 0);
    }
    assert_int_equal(n, 10);
    ferry_sparse_reader_close(tiny);
}

/* Several threads reading through one reader at once. */
typedef struct rd_thread {
    ft_solo *f;
    ferry_sparse_reader *r;
    const char *key;
    uint64_t hits, bad;
} rd_thread;

static void *reader_thread(void *arg)
{
    rd_thread *a = arg;
    ferry_sparse_target t = {.ndim = 2, .shape = {ROWS, COLS}, .tensor_id = "rd.conc"};
    const char *keys[1] = {a->key};
    for (int i = 0; i < 20; i++) {
        ferry_sparse_result *res = NULL;
        size_t n = 0;
        ferry_sparse_stats st;
        ferry_error err = {0};
        if (ferry_sparse_reader_read(a->r, keys, 1, &t, 1, NULL, &res, &n, &st, &err) != 0 ||
            n != 1 || res[0].nnz != 25)
            a->bad++;
        a->hits += st.index_cache_hits;
        ferry_sparse_results_free(res, n);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    ft_solo *f = *state;
    char key[512];
    put_delta(f->s, "rd.conc", 25, 3.0f, key, sizeof key);
    ferry_sparse_reader *r = open_reader(f->s, 0, 0);
    rd_thread a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (rd_thread){.f = f, .r = r, .key = key};
        assert_int_equal(pthread_create(&th[i], NULL, reader_thread, &a[i]), 0);
    }
    uint64_t hits = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
        hits += a[i].hits;
    }
    assert_true(hits > 0);
    print_message("# 4 threads x 20 reads on one reader: %" PRIu64 " index cache hits\n", hits);
    ferry_sparse_reader_close(r);
}

/* The config: defaults, and what open refuses (nothing opened). */
static void test_config(void **state)
{
    ft_solo *f = *state;
    ferry_sparse_reader_config cfg;
    memset(&cfg, 0xa5, sizeof cfg);
    assert_int_equal(ferry_sparse_reader_config_init(&cfg), 0);
    assert_int_equal(cfg.cache_entries, FERRY_SPARSE_READER_CACHE_ENTRIES);
    assert_int_equal(cfg.cache_entries, 64);
    assert_int_equal(cfg.cache_bytes, FERRY_SPARSE_READER_CACHE_BYTES);
    assert_int_equal(cfg.cache_bytes, 256ull << 20);
    for (size_t i = 0; i < sizeof cfg.reserved / sizeof cfg.reserved[0]; i++)
        assert_int_equal(cfg.reserved[i], 0);
    assert_int_equal(ferry_sparse_reader_config_init(NULL), FERRY_EINVAL);

    ferry_sparse_reader *r = (ferry_sparse_reader *)&cfg;   /* set to NULL on refusal */
    ferry_error err = {0};
    cfg.reserved[5] = 1;
    assert_int_equal(ferry_sparse_reader_open(f->s, &cfg, &r, &err), FERRY_EINVAL);
    assert_null(r);
    assert_int_equal(err.code, FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "reserved"));
    print_message("# reserved: %s\n", err.msg);
    cfg.reserved[5] = 0;
    cfg.cache_entries = FERRY_SPARSE_READER_CACHE_ENTRIES_MAX + 1;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_sparse_reader_open(f->s, &cfg, &r, &err), FERRY_EINVAL);
    assert_null(r);
    assert_non_null(strstr(err.msg, "cache_entries"));
    cfg.cache_entries = FERRY_SPARSE_READER_CACHE_ENTRIES;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_sparse_reader_open(NULL, &cfg, &r, &err), FERRY_EINVAL);
    assert_true(err.msg[0] != 0);
    assert_int_equal(ferry_sparse_reader_open(f->s, NULL, &r, &err), FERRY_EINVAL);
    assert_int_equal(ferry_sparse_reader_open(f->s, &cfg, NULL, &err), FERRY_EINVAL);
    assert_int_equal(ferry_sparse_reader_open(f->s, &cfg, &r, NULL), 0);   /* err may be NULL */
    ferry_sparse_reader_close(r);

    /* a zeroed config is taken as the defaults */
    ferry_sparse_reader_config zero;
    memset(&zero, 0, sizeof zero);
    r = NULL;
    assert_int_equal(ferry_sparse_reader_open(f->s, &zero, &r, &err), 0);
    assert_non_null(r);
    char key[512];
    put_delta(f->s, "rd.zero", 5, 1.0f, key, sizeof key);
    uint64_t n;
    double sum;
    (void)read_all(f->s, r, "rd.zero", key, &n, &sum);
    assert_int_equal(read_all(f->s, r, "rd.zero", key, &n, &sum).index_cache_hits, 1);
    ferry_sparse_reader_close(r);
    ferry_sparse_reader_close(NULL);   /* fine */
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_hits),
        cmocka_unit_test(test_independent),
        cmocka_unit_test(test_changed_object),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
