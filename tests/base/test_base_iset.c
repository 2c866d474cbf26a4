/* Interval sets and partitions against brute-force oracles on a small
 * universe. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define U 512              /* iset universe: points 0..U-1 */
#define PU 256             /* partition universe */
#define NTAGVALS 16

/* Deterministic PRNG so a failure reproduces; the seed is printed. */
static uint64_t rng_state;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static uint64_t rnd(uint64_t n)
{
    return rng() % n;
}

static void seed(uint64_t s)
{
    rng_state = s * 0x9E3779B97F4A7C15ull + 1;
    print_message("seed %llu\n", (unsigned long long)s);
}

/* A random interval, sometimes empty or reversed, mostly short. */
static void rnd_interval(uint64_t univ, uint64_t *start, uint64_t *end)
{
    *start = rnd(univ + 1);
    switch (rnd(4)) {
    case 0: *end = rnd(univ + 1); break;                 /* any, maybe reversed */
    case 1: *end = *start; break;                        /* empty */
    default: *end = *start + rnd(24); break;             /* short */
    }
    if (*end > univ)
        *end = univ;
}

static void check_invariants(const fr_iset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        assert_true(s->v[i].start < s->v[i].end);
        if (i + 1 < s->n)
            assert_true(s->v[i].end < s->v[i + 1].start); /* disjoint, non-adjacent */
    }
    assert_true(s->n <= s->cap);
}

static void check_against(const fr_iset *s, const bool *oracle)
{
    bool seen[U] = { false };
    uint64_t total = 0;

    check_invariants(s);
    for (size_t i = 0; i < s->n; i++) {
        assert_true(s->v[i].end <= U);
        for (uint64_t p = s->v[i].start; p < s->v[i].end; p++)
            seen[p] = true;
    }
    for (size_t p = 0; p < U; p++) {
        assert_int_equal(seen[p], oracle[p]);
        total += oracle[p];
    }
    assert_int_equal(fr_iset_total(s), total);
}

static void oracle_set(bool *o, uint64_t start, uint64_t end, bool val)
{
    for (uint64_t p = start; p < end; p++)
        o[p] = val;
}

static void random_set(fr_iset *s, bool *o)
{
    size_t k = rnd(8);

    fr_iset_clear(s);
    memset(o, 0, U * sizeof(*o));
    for (size_t i = 0; i < k; i++) {
        uint64_t a, b;
        rnd_interval(U, &a, &b);
        assert_int_equal(fr_iset_insert(s, a, b), 0);
        oracle_set(o, a, b, true);
    }
}

static void check_queries(const fr_iset *s, const bool *o)
{
    uint64_t a, b;
    bool all = true, any = false;

    rnd_interval(U, &a, &b);
    for (uint64_t p = a; p < b; p++) {
        all = all && o[p];
        any = any || o[p];
    }
    assert_int_equal(fr_iset_contains(s, a, b), all);
    assert_int_equal(fr_iset_overlaps(s, a, b), any);
}

static void random_step(fr_iset *a, bool *oa, fr_iset *b, bool *ob)
{
    uint64_t x, y;
    fr_iset out;

    switch (rnd(7)) {
    case 0: case 1:
        rnd_interval(U, &x, &y);
        assert_int_equal(fr_iset_insert(a, x, y), 0);
        oracle_set(oa, x, y, true);
        break;
    case 2: case 3:
        rnd_interval(U, &x, &y);
        assert_int_equal(fr_iset_subtract(a, x, y), 0);
        oracle_set(oa, x, y, false);
        break;
    case 4:
        random_set(b, ob);
        assert_int_equal(fr_iset_union(a, b), 0);
        for (size_t p = 0; p < U; p++)
            oa[p] = oa[p] || ob[p];
        check_against(b, ob); /* src untouched */
        break;
    case 5:
        random_set(b, ob);
        assert_int_equal(fr_iset_subtract_set(a, b), 0);
        for (size_t p = 0; p < U; p++)
            oa[p] = oa[p] && !ob[p];
        break;
    default:
        random_set(b, ob);
        for (size_t p = 0; p < U; p++)
            ob[p] = oa[p] && ob[p];
        fr_iset_init(&out);
        if (rnd(2)) { /* into a fresh set; b is replaced by the result */
            assert_int_equal(fr_iset_intersect(&out, a, b), 0);
            fr_iset_free(b);
            *b = out;
        } else {      /* into one of its inputs */
            assert_int_equal(fr_iset_intersect(b, a, b), 0);
        }
        check_against(b, ob);
        break;
    }
}

static void test_iset_random_vs_bitmap(void **state)
{
    (void)state;
    static bool oa[U], ob[U];
    fr_iset a, b;

    seed(12345);
    fr_iset_init(&a);
    fr_iset_init(&b);
    for (int i = 0; i < 20000; i++) {
        if (rnd(500) == 0) {
            fr_iset_clear(&a);
            memset(oa, 0, sizeof(oa));
        }
        random_step(&a, oa, &b, ob);
        check_against(&a, oa);
        check_queries(&a, oa);
    }
    fr_iset_free(&a);
    fr_iset_free(&b);
    assert_null(a.v);
    assert_int_equal(a.n, 0);
}

static void expect(const fr_iset *s, const fr_interval *want, size_t n)
{
    assert_int_equal(s->n, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(s->v[i].start, want[i].start);
        assert_int_equal(s->v[i].end, want[i].end);
    }
}

static void test_iset_edge_cases(void **state)
{
    (void)state;
    fr_iset s;

    fr_iset_init(&s);
    assert_int_equal(fr_iset_insert(&s, 0, 10), 0);
    assert_int_equal(fr_iset_insert(&s, 10, 20), 0); /* adjacent: coalesced */
    expect(&s, (fr_interval[]){ { 0, 20 } }, 1);
    assert_int_equal(fr_iset_insert(&s, 30, 40), 0);
    assert_int_equal(fr_iset_insert(&s, 50, 60), 0);
    assert_int_equal(fr_iset_insert(&s, 5, 50), 0);  /* bridges three */
    expect(&s, (fr_interval[]){ { 0, 60 } }, 1);
    assert_int_equal(fr_iset_subtract(&s, 10, 20), 0); /* split */
    expect(&s, (fr_interval[]){ { 0, 10 }, { 20, 60 } }, 2);
    assert_int_equal(fr_iset_insert(&s, 7, 3), 0);     /* reversed: no-op */
    assert_int_equal(fr_iset_insert(&s, 15, 15), 0);   /* empty: no-op */
    assert_int_equal(fr_iset_subtract(&s, 30, 30), 0);
    assert_int_equal(fr_iset_subtract(&s, 40, 35), 0);
    expect(&s, (fr_interval[]){ { 0, 10 }, { 20, 60 } }, 2);
    assert_int_equal(fr_iset_subtract(&s, 10, 20), 0); /* exactly the gap */
    expect(&s, (fr_interval[]){ { 0, 10 }, { 20, 60 } }, 2);
    assert_int_equal(fr_iset_subtract(&s, 0, 10), 0);  /* exactly one */
    expect(&s, (fr_interval[]){ { 20, 60 } }, 1);
    assert_true(fr_iset_contains(&s, 20, 60));
    assert_false(fr_iset_contains(&s, 19, 60));
    assert_false(fr_iset_contains(&s, 20, 61));
    assert_true(fr_iset_contains(&s, 5, 5));   /* empty range is covered */
    assert_false(fr_iset_overlaps(&s, 60, 70));
    assert_false(fr_iset_overlaps(&s, 0, 20));
    assert_true(fr_iset_overlaps(&s, 59, 70));
    assert_false(fr_iset_overlaps(&s, 30, 30));
    assert_int_equal(fr_iset_union(&s, &s), 0);           /* self-aliasing */
    expect(&s, (fr_interval[]){ { 20, 60 } }, 1);
    assert_int_equal(fr_iset_intersect(&s, &s, &s), 0);
    expect(&s, (fr_interval[]){ { 20, 60 } }, 1);
    assert_int_equal(fr_iset_subtract_set(&s, &s), 0);
    assert_int_equal(s.n, 0);
    assert_int_equal(fr_iset_total(&s), 0);
    fr_iset_free(&s);
}

static void test_iset_extremes(void **state)
{
    (void)state;
    fr_iset s;

    fr_iset_init(&s);
    assert_int_equal(fr_iset_insert(&s, 0, UINT64_MAX), 0);
    assert_int_equal(fr_iset_total(&s), UINT64_MAX);
    assert_int_equal(fr_iset_subtract(&s, 1, UINT64_MAX - 1), 0);
    expect(&s, (fr_interval[]){ { 0, 1 }, { UINT64_MAX - 1, UINT64_MAX } }, 2);
    assert_int_equal(fr_iset_total(&s), 2);
    assert_true(fr_iset_contains(&s, UINT64_MAX - 1, UINT64_MAX));
    assert_int_equal(fr_iset_insert(&s, 1, UINT64_MAX - 1), 0);
    expect(&s, (fr_interval[]){ { 0, UINT64_MAX } }, 1);
    fr_iset_free(&s);
}

/* Many small disjoint inserts in reverse order exercise growth and the
 * shifting splice; the set must stay sorted. */
static void test_iset_many(void **state)
{
    (void)state;
    fr_iset s;

    fr_iset_init(&s);
    for (uint64_t i = 10000; i > 0; i--)
        assert_int_equal(fr_iset_insert(&s, 3 * i, 3 * i + 1), 0);
    assert_int_equal(s.n, 10000);
    check_invariants(&s);
    assert_int_equal(fr_iset_total(&s), 10000);
    for (uint64_t i = 1; i <= 10000; i++)
        assert_int_equal(fr_iset_insert(&s, 3 * i + 1, 3 * i + 3), 0);
    expect(&s, (fr_interval[]){ { 3, 30003 } }, 1);
    fr_iset_free(&s);
}

/* ---- partition ---------------------------------------------------------- */

static uint64_t tag_value(size_t idx)
{
    /* Scrambled, so tag order differs from index order. */
    return (idx + 1) * 0x9E3779B97F4A7C15ull;
}

static uint32_t piece_mask(const fr_piece *p)
{
    uint32_t mask = 0;

    assert_true(p->ntags > 0);
    for (uint32_t k = 0; k < p->ntags; k++) {
        if (k > 0)
            assert_true(p->tags[k - 1] < p->tags[k]); /* ascending, distinct */
        size_t idx = NTAGVALS;
        for (size_t t = 0; t < NTAGVALS; t++)
            if (tag_value(t) == p->tags[k])
                idx = t;
        assert_true(idx < NTAGVALS);
        mask |= 1u << idx;
    }
    return mask;
}

static void check_partition(const fr_partition *part, const uint32_t *oracle)
{
    size_t pi = 0;

    for (size_t i = 0; i < part->n; i++) {
        const fr_piece *p = &part->pieces[i];
        assert_true(p->start < p->end);
        assert_true(p->end <= PU);
        if (i + 1 < part->n) {
            const fr_piece *q = &part->pieces[i + 1];
            assert_true(p->end <= q->start);
            if (p->end == q->start) /* adjacent pieces must differ */
                assert_int_not_equal(piece_mask(p), piece_mask(q));
        }
    }
    for (uint64_t x = 0; x < PU; x++) {
        while (pi < part->n && part->pieces[pi].end <= x)
            pi++;
        bool in_piece = pi < part->n && part->pieces[pi].start <= x;
        uint32_t got = in_piece ? piece_mask(&part->pieces[pi]) : 0;
        assert_int_equal(got, oracle[x]);
    }
}

static void test_partition_random_vs_oracle(void **state)
{
    (void)state;
    fr_tagged_interval in[48];
    uint32_t oracle[PU];

    seed(777);
    for (int round = 0; round < 3000; round++) {
        size_t n = rnd(sizeof(in) / sizeof(in[0]) + 1);
        size_t ntag = 1 + rnd(NTAGVALS);
        memset(oracle, 0, sizeof(oracle));
        for (size_t i = 0; i < n; i++) {
            size_t t = rnd(ntag);
            rnd_interval(PU, &in[i].start, &in[i].end);
            in[i].tag = tag_value(t);
            for (uint64_t x = in[i].start; x < in[i].end; x++)
                oracle[x] |= 1u << t;
        }
        fr_partition part;
        assert_int_equal(fr_partition_build(n ? in : NULL, n, &part), 0);
        check_partition(&part, oracle);
        fr_partition_free(&part);
        assert_null(part.pieces);
    }
}

static void test_partition_example(void **state)
{
    (void)state;
    const fr_tagged_interval in[] = {
        { 0, 10, 5 }, { 5, 15, 3 }, { 20, 30, 5 }, { 30, 40, 5 },
        { 0, 10, 5 }, { 50, 50, 9 }, { 45, 44, 9 },
    };
    fr_partition p;

    assert_int_equal(fr_partition_build(in, sizeof(in) / sizeof(in[0]), &p), 0);
    assert_int_equal(p.n, 4);
    assert_int_equal(p.pieces[0].start, 0);
    assert_int_equal(p.pieces[0].end, 5);
    assert_int_equal(p.pieces[0].ntags, 1);
    assert_int_equal(p.pieces[0].tags[0], 5);
    assert_int_equal(p.pieces[1].start, 5);
    assert_int_equal(p.pieces[1].end, 10);
    assert_int_equal(p.pieces[1].ntags, 2);
    assert_int_equal(p.pieces[1].tags[0], 3);
    assert_int_equal(p.pieces[1].tags[1], 5);
    assert_int_equal(p.pieces[2].start, 10);
    assert_int_equal(p.pieces[2].end, 15);
    assert_int_equal(p.pieces[2].ntags, 1);
    assert_int_equal(p.pieces[2].tags[0], 3);
    assert_int_equal(p.pieces[3].start, 20); /* [20,30) and [30,40) merged */
    assert_int_equal(p.pieces[3].end, 40);
    assert_int_equal(p.pieces[3].tags[0], 5);
    fr_partition_free(&p);

    assert_int_equal(fr_partition_build(NULL, 0, &p), 0);
    assert_int_equal(p.n, 0);
    fr_partition_free(&p);
    assert_int_equal(fr_partition_build(NULL, 3, &p), FERRY_EINVAL);
}

/* Nested intervals with many distinct tags: the piece at the centre carries
 * all of them, in ascending order. */
static void test_partition_nested(void **state)
{
    (void)state;
    enum { N = 300 };
    fr_tagged_interval in[N];
    fr_partition p;

    for (size_t i = 0; i < N; i++)
        in[i] = (fr_tagged_interval){ i, 2 * N - i, (uint64_t)(N - i) * 1000 };
    assert_int_equal(fr_partition_build(in, N, &p), 0);
    assert_int_equal(p.n, 2 * N - 1);
    const fr_piece *mid = &p.pieces[N - 1];
    assert_int_equal(mid->start, N - 1);
    assert_int_equal(mid->end, N + 1);
    assert_int_equal(mid->ntags, N);
    for (size_t k = 0; k < N; k++)
        assert_int_equal(mid->tags[k], (k + 1) * 1000);
    fr_partition_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_iset_edge_cases),
        cmocka_unit_test(test_iset_extremes),
        cmocka_unit_test(test_iset_many),
        cmocka_unit_test(test_iset_random_vs_bitmap),
        cmocka_unit_test(test_partition_example),
        cmocka_unit_test(test_partition_nested),
        cmocka_unit_test(test_partition_random_vs_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
