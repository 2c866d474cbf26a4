/* base layer: dtype conversion (f32 / bf16 / f16). Every path (scalar
 * reference, portable, AVX2 + F16C, AVX-512, auto) must give the reference's
 * bits on special values, rounding ties, subnormals and overflow, on random
 * bit patterns at every length and alignment, and under other rounding
 * modes and flush-to-zero; the reference itself is checked against
 * independent oracles (known answers, the compiler's _Float16, a nearest
 * neighbour search in double). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fenv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "base/base.h"

#define FT_CONV_TEST "test_base_convert"
#define FT_CONV_SEED 0x9e3779b97f4a7c15ull
#include "util/ftconv.h"


/* ---- the reference against independent oracles ------------------------------------------ */

/* a finite bf16 as a double; an infinity as 2^128, where the next binade
 * would start (the rounding boundary of IEEE's overflow rule) */
static double bf16_value(uint16_t b)
{
    if ((b & 0x7fff) == 0x7f80)
        return b >> 15 ? -0x1p128 : 0x1p128;
    return f_of((uint32_t)b << 16);
}

/* f32 -> bf16 by searching the two neighbours in double */
static uint16_t oracle_bf16(uint32_t u)
{
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double f = f_of(u), dl = f - bf16_value(lo), dh = bf16_value(hi) - f;
    dl = dl < 0 ? -dl : dl;
    dh = dh < 0 ? -dh : dh;
    return dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
}

static uint16_t oracle_f16(uint32_t u)
{
    _Float16 h = (_Float16)f_of(u);
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

static bool f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool bf16_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* Known answers: f32 bits, bf16, f16. */
static const struct { uint32_t f; uint16_t bf, h; } known[] = {
    { 0x00000000, 0x0000, 0x0000 },   /* +0 */
    { 0x80000000, 0x8000, 0x8000 },   /* -0 */
    { 0x3f800000, 0x3f80, 0x3c00 },   /* 1 */
    { 0xbf800000, 0xbf80, 0xbc00 },   /* -1 */
    { 0x7f800000, 0x7f80, 0x7c00 },   /* +inf */
    { 0xff800000, 0xff80, 0xfc00 },   /* -inf */
    { 0x7fc00000, 0x7fc0, 0x7e00 },   /* quiet NaN */
    { 0xffc00000, 0xffc0, 0xfe00 },   /* -quiet NaN */
    { 0x7f800001, 0x7fc0, 0x7e00 },   /* signalling NaN, low payload: made quiet, not inf */
    { 0xff800001, 0xffc0, 0xfe00 },
    { 0x7fbfffff, 0x7fff, 0x7fff },   /* signalling NaN, full payload */
    { 0x7f812345, 0x7fc1, 0x7e09 },   /* payload: top bits kept */
    { 0x7fffffff, 0x7fff, 0x7fff },   /* all ones: stays NaN (bf16 must not carry) */
    { 0xffffffff, 0xffff, 0xffff },
    { 0x7f7fffff, 0x7f80, 0x7c00 },   /* f32 max: rounds up to inf in both */
    { 0x7f7f7fff, 0x7f7f, 0x7c00 },   /* just below the bf16 tie: bf16 max */
    { 0x3f808000, 0x3f80, 0x3c04 },   /* bf16 tie, even neighbour below: down */
    { 0x3f818000, 0x3f82, 0x3c0c },   /* bf16 tie, odd neighbour below: up */
    { 0x3f808001, 0x3f81, 0x3c04 },   /* just above the tie: up */
    { 0x3f801000, 0x3f80, 0x3c00 },   /* f16 tie at 1 + 2^-11, even: down */
    { 0x3f803000, 0x3f80, 0x3c02 },   /* f16 tie at 1 + 3 * 2^-11, odd: up */
    { 0x477fe000, 0x4780, 0x7bff },   /* 65504, f16 max */
    { 0x477fefff, 0x4780, 0x7bff },   /* just below 65520: f16 max */
    { 0x477ff000, 0x4780, 0x7c00 },   /* 65520: the tie to 65536, overflows to inf */
    { 0xc77ff000, 0xc780, 0xfc00 },
    { 0x47800000, 0x4780, 0x7c00 },   /* 65536 */
    { 0x38800000, 0x3880, 0x0400 },   /* 2^-14: smallest f16 normal */
    { 0x387fc000, 0x3880, 0x03ff },   /* 1023 * 2^-24: largest f16 subnormal */
    { 0x387fe000, 0x3880, 0x0400 },   /* 1023.5 * 2^-24: tie, odd below: up to the normal */
    { 0x387fa000, 0x3880, 0x03fe },   /* 1022.5 * 2^-24: tie, even below: down */
    { 0x387ff000, 0x3880, 0x0400 },   /* 1023.75 * 2^-24 */
    { 0x33800000, 0x3380, 0x0001 },   /* 2^-24: smallest f16 subnormal */
    { 0x33000000, 0x3300, 0x0000 },   /* 2^-25: tie between 0 and it: 0 (even) */
    { 0x33000001, 0x3300, 0x0001 },   /* just above: up */
    { 0x33400000, 0x3340, 0x0001 },   /* 1.5 * 2^-25 */
    { 0x33c00000, 0x33c0, 0x0002 },   /* 1.5 * 2^-24: tie between 1 and 2: 2 */
    { 0x34200000, 0x3420, 0x0002 },   /* 2.5 * 2^-24: tie between 2 and 3: 2 */
    { 0x34600000, 0x3460, 0x0004 },   /* 3.5 * 2^-24: tie between 3 and 4: 4 */
    { 0xb3c00000, 0xb3c0, 0x8002 },
    { 0x32ffffff, 0x3300, 0x0000 },   /* below 2^-25: signed zero */
    { 0xb2ffffff, 0xb300, 0x8000 },
    { 0x00000001, 0x0000, 0x0000 },   /* f32 subnormals: bf16 keeps them */
    { 0x00400000, 0x0040, 0x0000 },
    { 0x807fffff, 0x8080, 0x8000 },   /* rounds up to the smallest bf16 normal */
    { 0x00008000, 0x0000, 0x0000 },   /* bf16 subnormal tie, even: down */
    { 0x00018000, 0x0002, 0x0000 },   /* odd: up */
};
#define NKNOWN (sizeof known / sizeof known[0])

static void test_reference_known_answers(void **state)
{
    (void)state;
    for (size_t i = 0; i < NKNOWN; i++) {
        uint16_t b = fr_bf16_from_f32_bits(known[i].f), h = fr_f16_from_f32_bits(known[i].f);
        if (b != known[i].bf || h != known[i].h)
            fail_msg("%08x: bf16 %04x (want %04x), f16 %04x (want %04x)", known[i].f, b,
                     known[i].bf, h, known[i].h);
    }
}

static void test_reference_against_oracles(void **state)
{
    (void)state;
    /* every f16 and bf16 widens exactly: compare with the compiler's f16 */
    for (uint32_t v = 0; v < 65536; v++) {
        uint16_t h = (uint16_t)v;
        uint32_t w = fr_f16_to_f32_bits(h);
        if (f16_nan(h)) {   /* payload and sign kept, bit for bit */
            assert_int_equal(w, (uint32_t)(h & 0x8000) << 16 | 0x7f800000u | (h & 0x3ffu) << 13);
        } else {
            _Float16 c;
            memcpy(&c, &h, 2);
            assert_int_equal(w, bits_of((float)c));
            assert_int_equal(fr_f16_from_f32_bits(w), h);   /* and narrows back */
        }
        assert_int_equal(fr_bf16_to_f32_bits(h), v << 16);
        if (!bf16_nan(h))
            assert_int_equal(fr_bf16_from_f32_bits(v << 16), h);
    }
    /* random f32 bits, half of them near f16's range */
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = rnd32();
        if (i & 1)
            u = (u & 0x807fffffu) | ((100 + rnd32() % 45) << 23);
        uint16_t b = fr_bf16_from_f32_bits(u), h = fr_f16_from_f32_bits(u);
        if (f_of(u) != f_of(u)) {   /* NaN: NaN, sign kept, never inf */
            assert_true(bf16_nan(b) && (b >> 15) == (u >> 31));
            assert_true(f16_nan(h) && (h >> 15) == (u >> 31));
            continue;
        }
        if (b != oracle_bf16(u))
            fail_msg("bf16 of %08x: %04x, want %04x", u, b, oracle_bf16(u));
        if (h != oracle_f16(u))
            fail_msg("f16 of %08x: %04x, want %04x", u, h, oracle_f16(u));
    }
}

/* ---- every path against the reference ---------------------------------------------------- */

enum { GUARD = 64 };

/* Converts n elements of src (type st) at byte offsets so and do with
 * path p and with the reference; compares the outputs and the guard bytes
 * around them. */
static void check_run(fr_conv_path p, const uint8_t *src, fr_ftype st, fr_ftype dt, size_t n,
                      size_t so, size_t dof)
{
    size_t ss = st == FR_FT_F32 ? 4 : 2, ds = dt == FR_FT_F32 ? 4 : 2;
    uint8_t *in = malloc(n * ss + 8), *got = malloc(n * ds + 2 * GUARD + 8);
    uint8_t *want = malloc(n * ds + 8);
    assert_non_null(in);
    assert_non_null(got);
    assert_non_null(want);
    memcpy(in + so, src, n * ss);
    memset(got, 0xa5, n * ds + 2 * GUARD + 8);
    uint8_t *g = got + GUARD + dof;
    assert_int_equal(fr_convert_path(FR_CONV_SCALAR, in + so, st, want, dt, n), 0);
    assert_int_equal(fr_convert_path(p, in + so, st, g, dt, n), 0);
    for (size_t i = 0; i < n * ds; i++)
        if (g[i] != want[i])
            fail_msg("%s, %zu elements (offsets %zu/%zu), types %d -> %d: element %zu differs "
                     "from the reference", fr_conv_path_name(p), n, so, dof, st, dt, i / ds);
    for (size_t i = 0; i < GUARD + dof; i++)
        assert_int_equal(got[i], 0xa5);
    for (size_t i = 0; i < GUARD; i++)
        assert_int_equal(g[n * ds + i], 0xa5);
    free(in);
    free(got);
    free(want);
}

/* The special values, every tie kind and random bits, as f32. */
static size_t fill_f32(uint32_t *v, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < NKNOWN && k < n; i++)
        v[k++] = known[i].f;
    while (k < n) {
        uint32_t u = rnd32();
        switch (rnd32() % 6) {
        case 0:   /* bf16 tie, either neighbour parity */
            u = (u & 0xffff0000u) | 0x8000u;
            break;
        case 1:   /* f16 normal tie */
            u = (u & 0x807fe000u) | ((113 + rnd32() % 30) << 23) | 0x1000u;
            break;
        case 2: {   /* f16 subnormal tie: exponent 103..112, half of the dropped bits */
            uint32_t e = 103 + rnd32() % 10, sh = 126 - e;
            u = (u & 0x807fffffu & ~((1u << sh) - 1)) | (e << 23) | (1u << (sh - 1));
            break;
        }
        case 3:   /* near f16's range */
            u = (u & 0x807fffffu) | ((100 + rnd32() % 45) << 23);
            break;
        case 4:   /* NaN or infinity with a random payload */
            u |= 0x7f800000u;
            break;
        default:
            break;
        }
        v[k++] = u;
    }
    return k;
}

static void check_all_pairs(size_t n, size_t so, size_t dof)
{
    uint32_t *f = malloc(n * 4 + 4);
    uint16_t *h = malloc(n * 2 + 2);
    assert_non_null(f);
    assert_non_null(h);
    fill_f32(f, n);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)rnd32();
    for (size_t k = 0; k < NPATHS; k++) {
        if (!path_on(paths[k]))
            continue;
        check_run(paths[k], (const uint8_t *)f, FR_FT_F32, FR_FT_BF16, n, so, dof);
        check_run(paths[k], (const uint8_t *)f, FR_FT_F32, FR_FT_F16, n, so, dof);
        check_run(paths[k], (const uint8_t *)h, FR_FT_BF16, FR_FT_F32, n, so, dof);
        check_run(paths[k], (const uint8_t *)h, FR_FT_F16, FR_FT_F32, n, so, dof);
        check_run(paths[k], (const uint8_t *)h, FR_FT_BF16, FR_FT_F16, n, so, dof);
        check_run(paths[k], (const uint8_t *)h, FR_FT_F16, FR_FT_BF16, n, so, dof);
    }
    free(f);
    free(h);
}

static void test_paths_every_16bit_value(void **state)
{
    (void)state;
    uint16_t *h = malloc(65536 * 2);
    assert_non_null(h);
    for (uint32_t v = 0; v < 65536; v++)
        h[v] = (uint16_t)v;
    for (size_t k = 0; k < NPATHS; k++) {
        if (!path_on(paths[k]))
            continue;
        for (int t = 0; t < 4; t++) {
            fr_ftype st = t & 1 ? FR_FT_F16 : FR_FT_BF16;
            fr_ftype dt = t < 2 ? FR_FT_F32 : (st == FR_FT_F16 ? FR_FT_BF16 : FR_FT_F16);
            check_run(paths[k], (const uint8_t *)h, st, dt, 65536, 0, 0);
        }
    }
    free(h);
}

static void test_paths_special_values_and_ties(void **state)
{
    (void)state;
    /* the known answers on their own, through every path, element by
     * element in a vector's worth of copies */
    for (size_t k = 0; k < NPATHS; k++) {
        if (!path_on(paths[k]))
            continue;
        uint32_t f[64];
        uint16_t b[64], h[64];
        for (size_t i = 0; i < NKNOWN; i++) {
            for (int j = 0; j < 64; j++)
                f[j] = known[i].f;
            assert_int_equal(fr_convert_path(paths[k], f, FR_FT_F32, b, FR_FT_BF16, 64), 0);
            assert_int_equal(fr_convert_path(paths[k], f, FR_FT_F32, h, FR_FT_F16, 64), 0);
            for (int j = 0; j < 64; j++)
                if (b[j] != known[i].bf || h[j] != known[i].h)
                    fail_msg("%s, %08x at %d: bf16 %04x (want %04x), f16 %04x (want %04x)",
                             fr_conv_path_name(paths[k]), known[i].f, j, b[j], known[i].bf,
                             h[j], known[i].h);
        }
    }
    check_all_pairs(200000, 0, 0);
}

static void test_paths_lengths_and_alignment(void **state)
{
    (void)state;
    /* every length up to a few vectors (tails of each width), odd large
     * ones, at every byte offset of source and destination */
    for (size_t n = 0; n <= 100; n++)
        for (size_t off = 0; off < 4; off++)
            check_all_pairs(n, off, (off * 3) % 4);
    const size_t big[] = { 1023, 4097, 65537, 100003 };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        check_all_pairs(big[i], i % 4, (i + 1) % 4);
}

static void test_paths_other_fpu_modes(void **state)
{
    (void)state;
    /* no path may depend on the rounding mode or on DAZ/FTZ (which torch's
     * set_flush_denormal turns on): the reference is integer arithmetic */
    const int modes[] = { FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO };
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        assert_int_equal(fesetround(modes[m]), 0);
        check_all_pairs(20000, m, 0);
        assert_int_equal(fesetround(FE_TONEAREST), 0);
    }
#if defined(__x86_64__)
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);   /* FTZ | DAZ */
    check_all_pairs(20000, 1, 3);
    _mm_setcsr(csr);
#endif
}

/* ---- the API ----------------------------------------------------------------------------- */

static void test_api(void **state)
{
    (void)state;
    assert_int_equal(fr_ftype_of("f32"), FR_FT_F32);
    assert_int_equal(fr_ftype_of("bf16"), FR_FT_BF16);
    assert_int_equal(fr_ftype_of("f16"), FR_FT_F16);
    assert_int_equal(fr_ftype_of("f64"), FR_FT_NONE);
    assert_int_equal(fr_ftype_of(NULL), FR_FT_NONE);
    assert_true(fr_conv_path_available(FR_CONV_AUTO));
    assert_true(fr_conv_path_available(fr_conv_path_best()));
    assert_true(fr_conv_path_best() != FR_CONV_AUTO && fr_conv_path_best() != FR_CONV_SCALAR);
    assert_string_equal(fr_conv_path_name(FR_CONV_PORTABLE), "portable");
    assert_string_equal(fr_conv_path_name(FR_CONV_NPATHS), "?");
    fprintf(stderr, "test_base_convert: auto is the %s path here\n",
            fr_conv_path_name(fr_conv_path_best()));

    float f[3] = { 1.0f, -2.5f, 65504.0f };
    uint16_t h[3], b[3];
    assert_int_equal(ferry_convert(f, "f32", h, "f16", 3), 0);
    assert_int_equal(h[0], 0x3c00);
    assert_int_equal(h[1], 0xc100);
    assert_int_equal(h[2], 0x7bff);
    assert_int_equal(ferry_convert(h, "f16", b, "bf16", 3), 0);
    assert_int_equal(b[0], 0x3f80);
    assert_int_equal(b[1], 0xc020);
    assert_int_equal(b[2], 0x4780);   /* 65504 rounds to 65536 in bf16 */
    float back[3];
    assert_int_equal(ferry_convert(b, "bf16", back, "f32", 3), 0);
    assert_true(back[0] == 1.0f && back[1] == -2.5f && back[2] == 65536.0f);
    /* the same dtype copies; in place is allowed then */
    uint16_t c[3];
    assert_int_equal(ferry_convert(h, "f16", c, "f16", 3), 0);
    assert_memory_equal(c, h, sizeof c);
    assert_int_equal(ferry_convert(c, "f16", c, "f16", 3), 0);
    assert_memory_equal(c, h, sizeof c);
    /* refused: other dtypes, NULL buffers with elements, bad paths; nothing
     * written */
    memset(c, 0x5a, sizeof c);
    assert_int_equal(ferry_convert(f, "f64", c, "f16", 3), FERRY_EINVAL);
    assert_int_equal(ferry_convert(f, "f32", c, "fp8_e4m3", 3), FERRY_EINVAL);
    assert_int_equal(ferry_convert(f, NULL, c, "f16", 3), FERRY_EINVAL);
    assert_int_equal(ferry_convert(NULL, "f32", c, "f16", 3), FERRY_EINVAL);
    assert_int_equal(ferry_convert(f, "f32", NULL, "f16", 3), FERRY_EINVAL);
    assert_int_equal(fr_convert_path(FR_CONV_NPATHS, f, FR_FT_F32, c, FR_FT_F16, 3),
                     FERRY_EINVAL);
    assert_int_equal(fr_convert(f, FR_FT_F32, c, FR_FT_F16, SIZE_MAX / 2), FERRY_EINVAL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(c[i], 0x5a5a);
    assert_int_equal(ferry_convert(NULL, "f32", NULL, "bf16", 0), 0);
    /* the per-element helpers agree with the bulk conversion */
    for (int i = 0; i < 3; i++) {
        uint16_t e;
        fr_elem_store_f32(&e, FR_FT_F16, f[i]);
        assert_int_equal(e, h[i]);
        assert_true(fr_elem_load_f32(&b[i], FR_FT_BF16) == back[i]);
        assert_true(fr_elem_load_f32(&f[i], FR_FT_F32) == f[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_known_answers),
        cmocka_unit_test(test_reference_against_oracles),
        cmocka_unit_test(test_paths_every_16bit_value),
        cmocka_unit_test(test_paths_special_values_and_ties),
        cmocka_unit_test(test_paths_lengths_and_alignment),
        cmocka_unit_test(test_paths_other_fpu_modes),
        cmocka_unit_test(test_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
