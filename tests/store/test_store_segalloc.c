/* store: the segment allocator against an oracle of allocated ranges. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "store/store_int.h"

static uint64_t rng_state;
static uint64_t rnd(void)   /* splitmix64: reproducible runs */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct { uint64_t off, len; } range;
typedef struct { range *v; size_t n; uint64_t total; uint64_t largest; } free_list;

static int collect(void *ctx, uint64_t off, uint64_t len)
{
    free_list *f = ctx;
    f->v = realloc(f->v, (f->n + 1) * sizeof(range));
    f->v[f->n++] = (range){ off, len };
    f->total += len;
    if (len > f->largest)
        f->largest = len;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Allocated ranges and free extents tile [0, size) exactly, free extents
 * are coalesced, and the stats agree. */
static void check(fr_segalloc *a, const range *alloc, size_t n, uint64_t size)
{
    free_list f = { 0 };
    fr_segalloc_walk_free(a, collect, &f);
    range *all = malloc((n + f.n + 1) * sizeof(range));
    memcpy(all, alloc, n * sizeof(range));
    memcpy(all + n, f.v, f.n * sizeof(range));
    qsort(all, n + f.n, sizeof(range), cmp_range);
    uint64_t at = 0;
    for (size_t i = 0; i < n + f.n; i++) {
        assert_int_equal(all[i].off, at);   /* no gap, no overlap */
        at += all[i].len;
    }
    assert_int_equal(at, size);
    for (size_t i = 1; i < f.n; i++)   /* coalesced: free extents never touch */
        assert_true(f.v[i - 1].off + f.v[i - 1].len < f.v[i].off);
    fr_segalloc_stats st;
    fr_segalloc_get_stats(a, &st);
    assert_int_equal(st.free, f.total);
    assert_int_equal(st.used, size - f.total);
    assert_int_equal(st.free_extents, f.n);
    assert_int_equal(st.largest_free, f.largest);
    assert_int_equal(st.allocations, n);
    free(all);
    free(f.v);
}

static void test_basic(void **state)
{
    (void)state;
    fr_segalloc *a;
    uint64_t off, off2;
    assert_int_equal(fr_segalloc_new(1000, 3, &a), FERRY_EINVAL);   /* granule not a power of 2 */
    assert_int_equal(fr_segalloc_new(32, 64, &a), FERRY_EINVAL);
    assert_int_equal(fr_segalloc_new(4096 + 10, 64, &a), 0);        /* rounded down */
    fr_segalloc_stats st;
    fr_segalloc_get_stats(a, &st);
    assert_int_equal(st.size, 4096);
    assert_int_equal(fr_segalloc_round(a, 0), 64);
    assert_int_equal(fr_segalloc_round(a, 65), 128);

    assert_int_equal(fr_segalloc_alloc(a, 100, 0, &off), 0);
    assert_int_equal(off, 0);
    assert_int_equal(fr_segalloc_alloc(a, 1, 1024, &off2), 0);
    assert_int_equal(off2 % 1024, 0);
    assert_int_equal(fr_segalloc_alloc(a, 1, 3, &off2), FERRY_EINVAL);
    assert_int_equal(fr_segalloc_alloc(a, 8192, 0, &off2), FERRY_ENOSPC);
    /* Double free and partial overlap with free space are refused. */
    assert_int_equal(fr_segalloc_release(a, off, 100), 0);
    assert_int_equal(fr_segalloc_release(a, off, 100), FERRY_EINVAL);
    assert_int_equal(fr_segalloc_release(a, 4096, 64), FERRY_EINVAL);
    assert_int_equal(fr_segalloc_release(a, 32, 64), FERRY_EINVAL);  /* misaligned */
    /* reserve takes exactly the range asked for, and only free space. */
    assert_int_equal(fr_segalloc_reserve(a, 128, 64), 0);
    assert_int_equal(fr_segalloc_reserve(a, 128, 64), FERRY_EINVAL);
    assert_int_equal(fr_segalloc_reserve(a, 0, 4096), FERRY_EINVAL);
    assert_int_equal(fr_segalloc_reserve(a, 4096 - 64, 128), FERRY_EINVAL);
    assert_int_equal(fr_segalloc_release(a, 128, 64), 0);
    assert_int_equal(fr_segalloc_release(a, off2, 1), 0);
    fr_segalloc_get_stats(a, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.free_extents, 1);
    fr_segalloc_destroy(a);
    fr_segalloc_destroy(NULL);
}

/* Best fit: the smallest hole that holds the request. */
static void test_best_fit(void **state)
{
    (void)state;
    fr_segalloc *a;
    uint64_t off[8], got;
    assert_int_equal(fr_segalloc_new(64 * 100, 64, &a), 0);
    /* Holes of 3, 1 and 2 granules separated by live blocks. */
    static const uint64_t sizes[7] = { 3, 1, 1, 1, 2, 1, 91 };
    for (int i = 0; i < 7; i++)
        assert_int_equal(fr_segalloc_alloc(a, sizes[i] * 64, 0, &off[i]), 0);
    assert_int_equal(fr_segalloc_release(a, off[0], 3 * 64), 0);
    assert_int_equal(fr_segalloc_release(a, off[2], 64), 0);
    assert_int_equal(fr_segalloc_release(a, off[4], 2 * 64), 0);
    assert_int_equal(fr_segalloc_alloc(a, 64, 0, &got), 0);
    assert_int_equal(got, off[2]);
    assert_int_equal(fr_segalloc_alloc(a, 100, 0, &got), 0);
    assert_int_equal(got, off[4]);
    assert_int_equal(fr_segalloc_find(a, 3 * 64, 0, &got), 0);
    assert_int_equal(got, off[0]);
    assert_int_equal(fr_segalloc_find(a, 4 * 64, 0, &got), FERRY_ENOSPC);
    fr_segalloc_destroy(a);
}

static void random_run(uint64_t seed, uint64_t size, uint64_t granule, int ops)
{
    fr_segalloc *a;
    range *live = calloc((size_t)ops, sizeof(range));
    size_t n = 0;
    rng_state = seed;
    assert_int_equal(fr_segalloc_new(size, granule, &a), 0);
    for (int i = 0; i < ops; i++) {
        if (n > 0 && rnd() % 100 < 45) {
            size_t k = (size_t)(rnd() % n);
            assert_int_equal(fr_segalloc_release(a, live[k].off, live[k].len), 0);
            live[k] = live[--n];
        } else {
            uint64_t len = 1 + rnd() % (rnd() % 8 == 0 ? size / 8 : 4 * granule);
            uint64_t align = 1ull << (rnd() % 13);
            uint64_t off;
            int rc = fr_segalloc_alloc(a, len, align, &off);
            if (rc == FERRY_ENOSPC) {
                /* Honest ENOSPC: no free extent holds the aligned range. */
                free_list f = { 0 };
                fr_segalloc_walk_free(a, collect, &f);
                uint64_t need = fr_segalloc_round(a, len), al = align > granule ? align : granule;
                for (size_t j = 0; j < f.n; j++) {
                    uint64_t s = (f.v[j].off + al - 1) & ~(al - 1);
                    assert_true(s >= f.v[j].off + f.v[j].len || f.v[j].off + f.v[j].len - s < need);
                }
                free(f.v);
                continue;
            }
            assert_int_equal(rc, 0);
            assert_int_equal(off % align, 0);
            assert_int_equal(off % granule, 0);
            live[n++] = (range){ off, fr_segalloc_round(a, len) };
        }
        if (i % 97 == 0)
            check(a, live, n, size);
    }
    check(a, live, n, size);
    /* Free everything in random order: one extent again. */
    while (n > 0) {
        size_t k = (size_t)(rnd() % n);
        assert_int_equal(fr_segalloc_release(a, live[k].off, live[k].len), 0);
        live[k] = live[--n];
    }
    check(a, live, 0, size);
    fr_segalloc_stats st;
    fr_segalloc_get_stats(a, &st);
    assert_int_equal(st.free_extents, 1);
    assert_int_equal(st.largest_free, size);
    fr_segalloc_destroy(a);
    free(live);
}

static void test_random_oracle(void **state)
{
    (void)state;
    random_run(1, 1 << 20, 64, 20000);
    random_run(2, 1 << 16, 1, 20000);
    random_run(3, 1ull << 40, 4096, 5000);
}

/* Free space in many small holes cannot hold a large object; freeing the
 * blocks between the holes coalesces them, and then it fits. */
static void test_fragmentation(void **state)
{
    (void)state;
    fr_segalloc *a;
    const uint64_t blk = 1024, nblk = 1024;
    uint64_t off[1024], big;
    assert_int_equal(fr_segalloc_new(blk * nblk, 64, &a), 0);
    for (uint64_t i = 0; i < nblk; i++) {
        assert_int_equal(fr_segalloc_alloc(a, blk, 0, &off[i]), 0);
        assert_int_equal(off[i], i * blk);
    }
    for (uint64_t i = 0; i < nblk; i += 2)
        assert_int_equal(fr_segalloc_release(a, off[i], blk), 0);
    fr_segalloc_stats st;
    fr_segalloc_get_stats(a, &st);
    assert_int_equal(st.free, blk * nblk / 2);
    assert_int_equal(st.largest_free, blk);
    assert_int_equal(st.free_extents, nblk / 2);
    assert_int_equal(fr_segalloc_alloc(a, 256 * blk, 0, &big), FERRY_ENOSPC);
    /* Free the odd blocks of the first quarter: with the free even blocks
     * around them, 257 blocks coalesce into one extent. */
    for (uint64_t i = 1; i < nblk / 4; i += 2)
        assert_int_equal(fr_segalloc_release(a, off[i], blk), 0);
    fr_segalloc_get_stats(a, &st);
    assert_int_equal(st.largest_free, blk * (nblk / 4 + 1));
    assert_int_equal(st.free_extents, nblk / 2 - nblk / 8);
    assert_int_equal(fr_segalloc_alloc(a, 256 * blk, 0, &big), 0);
    assert_int_equal(big, 0);
    fr_segalloc_destroy(a);
}

/* Replaying reservations on a fresh allocator gives the same free space. */
static void test_reserve_replay(void **state)
{
    (void)state;
    fr_segalloc *a, *b;
    range live[512];
    size_t n = 0;
    rng_state = 42;
    assert_int_equal(fr_segalloc_new(1 << 20, 64, &a), 0);
    assert_int_equal(fr_segalloc_new(1 << 20, 64, &b), 0);
    for (int i = 0; i < 2000; i++) {
        if (n > 0 && (rnd() % 3 == 0 || n == 512)) {
            size_t k = (size_t)(rnd() % n);
            assert_int_equal(fr_segalloc_release(a, live[k].off, live[k].len), 0);
            assert_int_equal(fr_segalloc_release(b, live[k].off, live[k].len), 0);
            live[k] = live[--n];
            continue;
        }
        uint64_t off, len = 1 + rnd() % 8000;
        if (fr_segalloc_alloc(a, len, 1ull << (rnd() % 10), &off) != 0)
            continue;
        assert_int_equal(fr_segalloc_reserve(b, off, len), 0);
        assert_int_equal(fr_segalloc_reserve(b, off, len), FERRY_EINVAL);
        live[n++] = (range){ off, len };
    }
    free_list fa = { 0 }, fb = { 0 };
    fr_segalloc_walk_free(a, collect, &fa);
    fr_segalloc_walk_free(b, collect, &fb);
    assert_int_equal(fa.n, fb.n);
    assert_memory_equal(fa.v, fb.v, fa.n * sizeof(range));
    free(fa.v);
    free(fb.v);
    fr_segalloc_destroy(a);
    fr_segalloc_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_best_fit),
        cmocka_unit_test(test_random_oracle),
        cmocka_unit_test(test_fragmentation),
        cmocka_unit_test(test_reserve_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
