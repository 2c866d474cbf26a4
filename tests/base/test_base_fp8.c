/* base layer: FP8 quantization (f8e4m3, f8e5m2). The reference rounding is
 * checked against known bytes and a nearest-neighbour search over the 256
 * codes in double; every path (scalar, portable, AVX2, AVX-512, auto) must
 * give the reference's bytes on every bf16 and f16 input, a million random
 * f32s and the special values, at several scales, lengths and alignments;
 * the block call against a direct computation of the documented formula
 * (partial edge blocks, strides, zero and NaN blocks, ue8m0), its round
 * trip within half an FP8 ulp, and the refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define FT_CONV_TEST "test_base_fp8"
#define FT_CONV_SEED 0x243f6a8885a308d3ull
#include "util/ftconv.h"

static const fr_fp8_fmt *const fmts[] = { &fr_fp8_e4m3, &fr_fp8_e5m2 };
static const char *const fmt_names[] = { "f8e4m3", "f8e5m2" };
/* the multipliers (1 / scale) every sweep runs at */
static const float muls[] = { 1.0f, 448.0f / 1e-4f, 0x1p-8f, 3.7f, 0.01f, 448.0f / 0.73f };
#define NMULS (sizeof muls / sizeof muls[0])

static uint8_t ref(float x, const fr_fp8_fmt *f) { return fr_fp8_from_f32_bits(bits_of(x), f); }

/* ---- the reference against known bytes and an oracle ------------------------------------ */

static void test_known_answers(void **state)
{
    (void)state;
    const fr_fp8_fmt *e4 = &fr_fp8_e4m3, *e5 = &fr_fp8_e5m2;
    assert_int_equal(ref(448.0f, e4), 0x7e);
    assert_int_equal(ref(464.0f, e4), 0x7e);          /* halfway above max: saturates */
    assert_int_equal(ref(1e30f, e4), 0x7e);
    assert_int_equal(ref(INFINITY, e4), 0x7e);
    assert_int_equal(ref(-INFINITY, e4), 0xfe);
    assert_int_equal(ref(-448.0f, e4), 0xfe);
    assert_int_equal(ref(1.0f, e4), 0x38);
    assert_int_equal(ref(-1.0f, e4), 0xb8);
    assert_int_equal(ref(NAN, e4), 0x7f);
    assert_int_equal(ref(-NAN, e4), 0xff);
    assert_int_equal(ref(0.0f, e4), 0x00);
    assert_int_equal(ref(-0.0f, e4), 0x80);
    assert_int_equal(ref(0x1p-9f, e4), 0x01);         /* smallest subnormal */
    assert_int_equal(ref(0x1p-10f, e4), 0x00);        /* halfway below it: to even, 0 */
    assert_int_equal(ref(0x1.000002p-10f, e4), 0x01); /* just above halfway */
    assert_int_equal(ref(0x1.8p-9f, e4), 0x02);       /* 1.5 subnormals: to even, 2 */
    assert_int_equal(ref(0x1.4p-8f, e4), 0x02);       /* 2.5 subnormals: to even, 2 */
    assert_int_equal(ref(0x1.ep-7f, e4), 0x08);       /* 7.5 subnormals: up to the smallest normal */
    assert_int_equal(ref(0x1p-6f, e4), 0x08);
    assert_int_equal(ref(17.0f, e4), 0x58);           /* between 16 (0x58) and 18: to even */
    assert_int_equal(ref(19.0f, e4), 0x5a);           /* between 18 (0x59) and 20: to even */
    assert_int_equal(ref(432.0f, e4), 0x7e);          /* between 416 (0x7d) and 448: to even */
    assert_int_equal(ref(431.99997f, e4), 0x7d);
    assert_int_equal(ref(240.0f, e4), 0x77);
    assert_int_equal(ref(57344.0f, e5), 0x7b);
    assert_int_equal(ref(61440.0f, e5), 0x7b);        /* halfway above max: saturates */
    assert_int_equal(ref(INFINITY, e5), 0x7b);
    assert_int_equal(ref(-INFINITY, e5), 0xfb);
    assert_int_equal(ref(NAN, e5), 0x7f);
    assert_int_equal(ref(1.0f, e5), 0x3c);
    assert_int_equal(ref(0x1p-16f, e5), 0x01);
    assert_int_equal(ref(0x1p-17f, e5), 0x00);
    assert_int_equal(ref(0x1p-14f, e5), 0x04);
    /* decoding */
    assert_true(fr_fp8_to_f32(0x7e, e4) == 448.0f);
    assert_true(fr_fp8_to_f32(0xb8, e4) == -1.0f);
    assert_true(fr_fp8_to_f32(0x01, e4) == 0x1p-9f);
    assert_true(isnan(fr_fp8_to_f32(0x7f, e4)) && isnan(fr_fp8_to_f32(0xff, e4)));
    assert_true(fr_fp8_to_f32(0x7b, e5) == 57344.0f);
    assert_true(isinf(fr_fp8_to_f32(0x7c, e5)));
    assert_true(isnan(fr_fp8_to_f32(0x7f, e5)) && isnan(fr_fp8_to_f32(0x7d, e5)));
    assert_true(fr_fp8_to_f32(0x01, e5) == 0x1p-16f);
    assert_int_equal(bits_of(fr_fp8_to_f32(0x80, e4)), 0x80000000u);
}

/* the nearest finite FP8 value by search, ties to the even code, beyond
 * the largest saturating; NaN -> sign | 0x7f */
static uint8_t oracle(float x, const fr_fp8_fmt *f)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return sign | 0x7f;
    double a = fabs((double)x), best = INFINITY;
    if (a >= f->max)
        return sign | (uint8_t)f->max_code;
    uint8_t q = 0;
    for (uint32_t c = 0; c <= f->max_code; c++) {
        double d = fabs((double)fr_fp8_to_f32((uint8_t)c, f) - a);
        if (d < best || (d == best && !(c & 1)))
            best = d, q = (uint8_t)c;
    }
    return sign | q;
}

static void test_reference_against_oracle(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        /* every decoded code maps back to itself */
        for (uint32_t c = 0; c < 256; c++) {
            float v = fr_fp8_to_f32((uint8_t)c, fmts[k]);
            if (!isnan(v) && !isinf(v))
                assert_int_equal(ref(v, fmts[k]), c);
        }
        for (uint32_t h = 0; h < 0x10000; h++) {   /* every bf16, as f32 */
            float x = f_of(h << 16);
            uint8_t r = ref(x, fmts[k]), o = oracle(x, fmts[k]);
            if (r != o)
                fail_msg("%s: %a gives 0x%02x, nearest is 0x%02x", fmt_names[k], (double)x, r, o);
        }
        for (int i = 0; i < 20000; i++) {          /* random f32 in the FP8 range */
            float x = f_of((rnd32() & 0x87ffffffu) | 0x38000000u);
            uint8_t r = ref(x, fmts[k]), o = oracle(x, fmts[k]);
            if (r != o)
                fail_msg("%s: %a gives 0x%02x, nearest is 0x%02x", fmt_names[k], (double)x, r, o);
        }
    }
}

/* ---- every path bit for bit against the reference --------------------------------------- */

static unsigned long compared;

/* n elements of src (type st) through every path, each against the scalar
 * reference, every format and multiplier */
static void check_paths(const uint8_t *src, fr_ftype st, size_t n, size_t dst_off)
{
    uint8_t *want = malloc(n + 1), *got = malloc(n + 64);
    assert_non_null(want);
    assert_non_null(got);
    for (size_t k = 0; k < 2; k++)
        for (size_t m = 0; m < NMULS; m++) {
            assert_int_equal(fr_quantize_fp8_path(FR_CONV_SCALAR, src, st, want, fmts[k], n,
                                                  muls[m]), 0);
            for (size_t p = 1; p < NPATHS; p++) {
                if (!path_on(paths[p]))
                    continue;
                memset(got, 0xa5, n + 64);
                assert_int_equal(fr_quantize_fp8_path(paths[p], src, st, got + dst_off, fmts[k],
                                                      n, muls[m]), 0);
                for (size_t i = 0; i < n; i++)
                    if (got[dst_off + i] != want[i])
                        fail_msg("%s path, %s, st %d, mul %a, element %zu: 0x%02x, reference "
                                 "0x%02x", fr_conv_path_name(paths[p]), fmt_names[k], (int)st,
                                 (double)muls[m], i, got[dst_off + i], want[i]);
                assert_int_equal(got[dst_off + n], 0xa5);   /* nothing written past the end */
                compared += n;
            }
        }
    free(want);
    free(got);
}

static void test_paths_every_16bit_value(void **state)
{
    (void)state;
    uint16_t *h = malloc(0x10000 * 2);
    assert_non_null(h);
    for (uint32_t i = 0; i < 0x10000; i++)
        h[i] = (uint16_t)i;
    check_paths((const uint8_t *)h, FR_FT_BF16, 0x10000, 0);
    check_paths((const uint8_t *)h, FR_FT_F16, 0x10000, 0);
    free(h);
}

/* the values around every rounding boundary of both formats at multiplier 1 */
static size_t special_values(float *v)
{
    size_t n = 0;
    const float fixed[] = { 0.0f, -0.0f, 448.0f, -448.0f, 464.0f, -464.0f, 463.99997f, 464.00003f,
                            57344.0f, 61440.0f, 61439.996f, 0x1p-9f, 0x1p-10f, 0x1p-16f,
                            0x1p-17f, 0x1p-126f, 0x1p-149f, -0x1p-149f, INFINITY, -INFINITY, NAN,
                            -NAN, f_of(0x7f800001u), f_of(0xffbfffffu), 3.4e38f,
                            /* the kernels clamp to the largest finite, then to the bits
                             * that round to the NaN code (E4M3 480, E5M2 114688): those
                             * values, their neighbours and NaN payloads either side */
                            480.0f, -480.0f, 479.99997f, 480.00003f, 114688.0f, -114688.0f,
                            114687.99f, 114688.01f, f_of(0x7f7fffffu), f_of(0xff7fffffu),
                            f_of(0x7fffffffu), f_of(0xff800001u), f_of(0x7fc00001u) };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        v[n++] = fixed[i];
    for (size_t k = 0; k < 2; k++)
        for (uint32_t c = 0; c < fmts[k]->max_code; c++) {   /* halfway between neighbours */
            float lo = fr_fp8_to_f32((uint8_t)c, fmts[k]);
            float hi = fr_fp8_to_f32((uint8_t)(c + 1), fmts[k]);
            float mid = (lo + hi) / 2;   /* exact: both have few bits */
            v[n++] = mid;
            v[n++] = -mid;
            v[n++] = nextafterf(mid, 0);
            v[n++] = nextafterf(mid, INFINITY);
            v[n++] = lo;
        }
    return n;
}

static void test_paths_special_and_random_f32(void **state)
{
    (void)state;
    size_t n = 1u << 20;
    float *v = malloc((n + 2048) * sizeof *v);
    assert_non_null(v);
    size_t s = special_values(v);
    for (size_t i = s; i < n + 2048; i++) {
        uint32_t r = rnd32();
        /* half raw bit patterns, half near the FP8 range */
        v[i] = f_of(i & 1 ? r : (r & 0x87ffffffu) | 0x38000000u);
    }
    check_paths((const uint8_t *)v, FR_FT_F32, n + 2048 - 1, 0);
    /* the special values at every multiplier, each alone in its lane */
    check_paths((const uint8_t *)v, FR_FT_F32, s, 0);
    free(v);
}

static void test_paths_lengths_and_alignment(void **state)
{
    (void)state;
    uint8_t *buf = malloc(4 * 200 + 8);
    assert_non_null(buf);
    for (size_t i = 0; i < 4 * 200 + 8; i++)
        buf[i] = (uint8_t)rnd32();
    for (size_t n = 0; n <= 130; n++)
        for (size_t off = 0; off < 4; off++) {
            check_paths(buf + off, FR_FT_F32, n, off);
            check_paths(buf + off, FR_FT_BF16, n, 3 - off);
            check_paths(buf + off, FR_FT_F16, n, off);
        }
    free(buf);
    fprintf(stderr, "test_base_fp8: %lu path-element comparisons\n", compared);
}

/* the naive amax: the largest finite |x| as f32 bits */
static uint32_t naive_amax(const uint8_t *s, fr_ftype st, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        float x = fr_elem_load_f32(s + i * (st == FR_FT_F32 ? 4 : 2), st);
        if (isfinite(x) && fabsf(x) > f_of(m))
            m = bits_of(fabsf(x));
    }
    return m;
}

static void test_paths_amax(void **state)
{
    (void)state;
    uint8_t *buf = malloc(4 * 300);
    assert_non_null(buf);
    const fr_ftype ts[] = { FR_FT_F32, FR_FT_BF16, FR_FT_F16 };
    for (int round = 0; round < 40; round++) {
        for (size_t i = 0; i < 4 * 300; i++)
            buf[i] = (uint8_t)rnd32();
        for (size_t t = 0; t < 3; t++)
            for (size_t n = 0; n <= 300; n += 1 + (size_t)round % 7) {
                uint32_t want = naive_amax(buf, ts[t], n);
                for (size_t p = 0; p < NPATHS; p++) {
                    uint32_t got = 1;
                    if (!path_on(paths[p]))
                        continue;
                    assert_int_equal(fr_fp8_amax_path(paths[p], buf, ts[t], n, &got), 0);
                    if (got != want)
                        fail_msg("%s amax, type %d, n %zu: %08x, want %08x",
                                 fr_conv_path_name(paths[p]), (int)ts[t], n, got, want);
                }
            }
    }
    free(buf);
}

/* ---- the block call ---------------------------------------------------------------------- */

/* the documented scale of a block, computed here from the formula */
static float formula_scale(float amax, const fr_fp8_fmt *f, bool ue8m0)
{
    float s = fmaxf(amax, 1e-4f) / f->max;
    if (ue8m0)
        s = ldexpf(1.0f, (int)ceil(log2((double)s)));   /* exact in double for these */
    return s;
}

/* quantize a rows x cols region at strides, check every scale and byte
 * against the formula, and the round trip */
static void check_blocks(fr_ftype st, const char *sdt, size_t k, size_t rows, size_t cols,
                         size_t ss, size_t ds, uint32_t br, uint32_t bc, bool ue8m0,
                         const uint8_t *src)
{
    size_t es = st == FR_FT_F32 ? 4 : 2, nrb = (rows + br - 1) / br, ncb = (cols + bc - 1) / bc;
    uint8_t *dst = malloc(rows * ds + 1);
    float *scales = malloc((nrb * ncb + 1) * sizeof *scales), *back = malloc(rows * cols * 4);
    assert_non_null(dst);
    assert_non_null(scales);
    assert_non_null(back);
    ferry_fp8_options o;
    ferry_fp8_options_init(&o);
    o.block_rows = br, o.block_cols = bc;
    o.scale_format = ue8m0 ? FERRY_FP8_SCALE_UE8M0 : FERRY_FP8_SCALE_F32;
    ferry_error err = { 0 };
    scales[nrb * ncb] = -7.0f;
    assert_int_equal(ferry_quantize_fp8_blocks(src, sdt, ss, dst, fmt_names[k], ds, rows, cols,
                                               scales, &o, &err), 0);
    assert_true(scales[nrb * ncb] == -7.0f);   /* no scale past the last */
    const fr_fp8_fmt *f = fmts[k];
    for (size_t bi = 0; bi < nrb; bi++)
        for (size_t bj = 0; bj < ncb; bj++) {
            float amax = 0;
            for (size_t r = bi * br; r < rows && r < (bi + 1) * br; r++)
                for (size_t c = bj * bc; c < cols && c < (bj + 1) * bc; c++) {
                    float x = fr_elem_load_f32(src + (r * ss + c) * es, st);
                    if (isfinite(x))
                        amax = fmaxf(amax, fabsf(x));
                }
            float s = scales[bi * ncb + bj], plain = formula_scale(amax, f, false);
            assert_true(s == formula_scale(amax, f, ue8m0));
            if (ue8m0) {   /* a power of two, at least the plain scale, below twice it */
                assert_int_equal(bits_of(s) & 0x7fffff, 0);
                assert_true(s >= plain && s < 2 * plain);
            }
            float mul = 1.0f / s;
            for (size_t r = bi * br; r < rows && r < (bi + 1) * br; r++)
                for (size_t c = bj * bc; c < cols && c < (bj + 1) * bc; c++) {
                    float x = fr_elem_load_f32(src + (r * ss + c) * es, st);
                    uint8_t q = dst[r * ds + c];
                    assert_int_equal(q, ref(x * mul, f));
                }
        }
    /* the round trip: within half an FP8 ulp (the larger neighbour gap) times the scale */
    assert_int_equal(ferry_dequantize_fp8_blocks(dst, fmt_names[k], ds, back, "f32", cols, rows,
                                                 cols, scales, &o, &err), 0);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            float x = fr_elem_load_f32(src + (r * ss + c) * es, st), y = back[r * cols + c];
            uint8_t q = dst[r * ds + c] & 0x7f;
            if (isnan(x)) {
                assert_true(isnan(y));
                continue;
            }
            if (isinf(x) || q == f->max_code)
                continue;   /* saturated: no ulp bound */
            float v = fr_fp8_to_f32(q, f), up = fr_fp8_to_f32((uint8_t)(q + 1), f);
            float down = q ? fr_fp8_to_f32((uint8_t)(q - 1), f) : 0;
            double gap = fmax((double)up - v, (double)v - down);
            /* plus the f32 roundings of the product, the inverse and the dequantization */
            double s = scales[r / br * ncb + c / bc];
            double bound = 0.5 * gap * s + fabs((double)x) * 4e-7 + 1e-45;
            if (fabs((double)x - y) > bound)
                fail_msg("round trip (%zu, %zu): %a -> 0x%02x -> %a, off by more than %a", r, c,
                         (double)x, dst[r * ds + c], (double)y, bound);
        }
    free(dst);
    free(scales);
    free(back);
}

static void test_blocks(void **state)
{
    (void)state;
    size_t rows = 300, cols = 260, ss = 271;
    float *a = malloc(rows * ss * 4);
    uint16_t *h = malloc(rows * ss * 2);
    assert_non_null(a);
    assert_non_null(h);
    for (size_t i = 0; i < rows * ss; i++) {
        /* weights-like values whose size varies by block */
        float x = ((float)(rnd32() >> 8) - 8388608.0f) / 8388608.0f;
        a[i] = x * (float)(1 + (i / ss / 128) * 100 + (i % ss / 128) * 7);
    }
    /* a block of zeros (rows 128..255, columns 0..127), a NaN and an
     * infinity in block (0, 1), a tiny block (rows 256.., columns 256..) */
    for (size_t r = 128; r < 256; r++)
        for (size_t c = 0; c < 128; c++)
            a[r * ss + c] = (r & 1) ? 0.0f : -0.0f;
    a[5 * ss + 130] = NAN;
    a[6 * ss + 131] = -INFINITY;
    for (size_t r = 256; r < rows; r++)
        for (size_t c = 256; c < cols; c++)
            a[r * ss + c] *= 1e-7f;
    assert_int_equal(fr_convert(a, FR_FT_F32, h, FR_FT_BF16, rows * ss), 0);
    for (size_t k = 0; k < 2; k++)
        for (int u = 0; u < 2; u++) {
            check_blocks(FR_FT_F32, "f32", k, rows, cols, ss, 263, 128, 128, u, (uint8_t *)a);
            check_blocks(FR_FT_BF16, "bf16", k, rows, cols, ss, cols, 128, 128, u, (uint8_t *)h);
            check_blocks(FR_FT_F32, "f32", k, rows, cols, ss, cols, 1, 64, u, (uint8_t *)a);
            check_blocks(FR_FT_F32, "f32", k, 7, 5, 5, 5, 3, 2, u, (uint8_t *)a);
            /* 501 blocks a row: more than one tile of the driver (at most
             * 256 blocks side by side), the last tile and block partial */
            check_blocks(FR_FT_F32, "f32", k, 40, 1001, 1001, 1003, 3, 2, u, (uint8_t *)a);
            check_blocks(FR_FT_BF16, "bf16", k, 40, 1001, 1001, 1001, 3, 2, u, (uint8_t *)h);
        }
    /* the pinned facts: the zero block's scale, the NaN and the infinity */
    uint8_t *q = malloc(rows * cols);
    float sc[9];
    assert_int_equal(ferry_quantize_fp8_blocks(a, "f32", ss, q, "f8e4m3", cols, rows, cols, sc,
                                               NULL, NULL), 0);
    assert_true(sc[3] == 1e-4f / 448.0f);
    assert_int_equal(q[128 * cols + 0], 0x80);   /* -0 stays -0 */
    assert_int_equal(q[129 * cols + 0], 0x00);
    assert_int_equal(q[5 * cols + 130], 0x7f);   /* NaN stays NaN */
    assert_int_equal(q[6 * cols + 131], 0xfe);   /* -inf saturates, left out of amax */
    assert_true(sc[1] < INFINITY && sc[1] > 0);
    /* 1-row regions take any stride, and an empty region writes nothing */
    assert_int_equal(ferry_quantize_fp8_blocks(a, "f32", 0, q, "f8e4m3", 0, 1, cols, sc, NULL,
                                               NULL), 0);
    assert_int_equal(ferry_quantize_fp8_blocks(NULL, "f32", 0, NULL, "f8e4m3", 0, 0, 5, NULL,
                                               NULL, NULL), 0);
    free(q);
    free(a);
    free(h);
}

/* ---- the element calls, options and refusals -------------------------------------------- */

static void test_element_calls(void **state)
{
    (void)state;
    const float x[6] = { 1.0f, -3.0f, 0.5f, 1000.0f, NAN, 0x1p-12f };
    uint8_t q[6];
    ferry_error err = { 0 };
    /* scale 2: x / 2, as the dequantization multiplier */
    assert_int_equal(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 6, 2.0f, &err), 0);
    const uint8_t want[6] = { 0x30, 0xbc, 0x28, 0x7e, 0x7f, 0x00 };
    assert_memory_equal(q, want, 6);
    assert_int_equal(ferry_quantize_fp8(x, "f32", q, "fp8_e4m3", 6, 2.0f, &err), 0);
    assert_memory_equal(q, want, 6);
    float y[6];
    assert_int_equal(ferry_dequantize_fp8(q, "f8e4m3", y, "f32", 6, 2.0f, &err), 0);
    assert_true(y[0] == 1.0f && y[1] == -3.0f && y[2] == 0.5f && y[3] == 896.0f && isnan(y[4]) &&
                y[5] == 0.0f);
    uint16_t b[6];
    assert_int_equal(ferry_dequantize_fp8(q, "f8e4m3", b, "bf16", 6, 2.0f, &err), 0);
    assert_int_equal(b[0], 0x3f80);
    assert_int_equal(ferry_quantize_fp8(x, "f32", q, "f8e5m2", 6, 1.0f, &err), 0);
    assert_int_equal(q[3], ref(1000.0f, &fr_fp8_e5m2));
    assert_int_equal(ferry_dtype_size("f8e4m3"), 1);
    assert_int_equal(ferry_dtype_size("f8e5m2"), 1);
    assert_int_equal(ferry_dtype_size("fp8_e5m2"), 1);
    /* options: NULL, zeroed and init are the same defaults */
    ferry_fp8_options o, z = { 0 };
    ferry_fp8_options_init(&o);
    assert_int_equal(o.block_rows, 128);
    assert_int_equal(o.block_cols, 128);
    assert_int_equal(o.scale_format, FERRY_FP8_SCALE_F32);
    float a[200 * 130];
    for (size_t i = 0; i < 200 * 130; i++)
        a[i] = (float)(i % 977) - 400.0f;
    uint8_t q1[200 * 130], q2[200 * 130], q3[200 * 130];
    float s1[4], s2[4], s3[4];
    assert_int_equal(ferry_quantize_fp8_blocks(a, "f32", 130, q1, "f8e4m3", 130, 200, 130, s1,
                                               NULL, &err), 0);
    assert_int_equal(ferry_quantize_fp8_blocks(a, "f32", 130, q2, "f8e4m3", 130, 200, 130, s2, &z,
                                               &err), 0);
    assert_int_equal(ferry_quantize_fp8_blocks(a, "f32", 130, q3, "f8e4m3", 130, 200, 130, s3, &o,
                                               &err), 0);
    assert_memory_equal(q1, q2, sizeof q1);
    assert_memory_equal(q1, q3, sizeof q1);
    assert_memory_equal(s1, s2, sizeof s1);
    assert_memory_equal(s1, s3, sizeof s1);
}

#define REFUSED(call)                                                                           \
    do {                                                                                        \
        memset(&err, 0, sizeof err);                                                            \
        memset(q, 0x5a, sizeof q);                                                              \
        assert_int_equal((call), FERRY_EINVAL);                                                 \
        assert_int_equal(err.code, FERRY_EINVAL);                                               \
        assert_true(strlen(err.msg) > 10);                                                      \
        assert_int_equal(q[0], 0x5a);                                                           \
    } while (0)

static void test_refusals(void **state)
{
    (void)state;
    float x[64] = { 1.0f }, sc[4] = { 1.0f, 1.0f, 1.0f, 1.0f };
    uint8_t q[64];
    ferry_error err;
    REFUSED(ferry_quantize_fp8(x, "f64", q, "f8e4m3", 4, 1.0f, &err));
    REFUSED(ferry_quantize_fp8(x, "f32", q, "f8e3m4", 4, 1.0f, &err));
    REFUSED(ferry_quantize_fp8(x, "f32", q, "bf16", 4, 1.0f, &err));
    REFUSED(ferry_quantize_fp8(x, NULL, q, "f8e4m3", 4, 1.0f, &err));
    REFUSED(ferry_quantize_fp8(NULL, "f32", q, "f8e4m3", 4, 1.0f, &err));
    REFUSED(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 4, 0.0f, &err));
    REFUSED(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 4, -1.0f, &err));
    REFUSED(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 4, INFINITY, &err));
    REFUSED(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 4, NAN, &err));
    REFUSED(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 4, 1e-39f, &err));   /* 1/s is infinite */
    REFUSED(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 4, 3e38f, &err));    /* 1/s is subnormal */
    REFUSED(ferry_dequantize_fp8(q, "f8e4m3", x, "f32", 4, 0.0f, &err));
    REFUSED(ferry_dequantize_fp8(q, "f32", x, "f32", 4, 1.0f, &err));
    /* the block call: a 1-D buffer asked as 8 x 8 with stride 1, NULLs,
     * dtypes, options */
    REFUSED(ferry_quantize_fp8_blocks(x, "f32", 1, q, "f8e4m3", 8, 8, 8, sc, NULL, &err));
    REFUSED(ferry_quantize_fp8_blocks(x, "f32", 8, q, "f8e4m3", 4, 8, 8, sc, NULL, &err));
    REFUSED(ferry_quantize_fp8_blocks(x, "f32", 8, q, "f8e4m3", 8, 8, 8, NULL, NULL, &err));
    REFUSED(ferry_quantize_fp8_blocks(NULL, "f32", 8, q, "f8e4m3", 8, 8, 8, sc, NULL, &err));
    REFUSED(ferry_quantize_fp8_blocks(x, "u8", 8, q, "f8e4m3", 8, 8, 8, sc, NULL, &err));
    REFUSED(ferry_quantize_fp8_blocks(x, "f32", 8, q, "f16", 8, 8, 8, sc, NULL, &err));
    ferry_fp8_options o;
    ferry_fp8_options_init(&o);
    o.scale_format = 7;
    REFUSED(ferry_quantize_fp8_blocks(x, "f32", 8, q, "f8e4m3", 8, 8, 8, sc, &o, &err));
    ferry_fp8_options_init(&o);
    o.reserved[5] = 1;
    REFUSED(ferry_quantize_fp8_blocks(x, "f32", 8, q, "f8e4m3", 8, 8, 8, sc, &o, &err));
    ferry_fp8_options_init(&o);
    o.reserved32 = 1;
    REFUSED(ferry_quantize_fp8_blocks(x, "f32", 8, q, "f8e4m3", 8, 8, 8, sc, &o, &err));
    sc[0] = 0.0f;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_dequantize_fp8_blocks(q, "f8e4m3", 8, x, "f32", 8, 8, 8, sc, NULL,
                                                 &err), FERRY_EINVAL);
    assert_true(strstr(err.msg, "scale 0") != NULL);
    /* NULL err takes only the code */
    assert_int_equal(ferry_quantize_fp8(x, "f32", q, "f8e4m3", 4, 0.0f, NULL), FERRY_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers),
        cmocka_unit_test(test_reference_against_oracle),
        cmocka_unit_test(test_paths_every_16bit_value),
        cmocka_unit_test(test_paths_special_and_random_f32),
        cmocka_unit_test(test_paths_lengths_and_alignment),
        cmocka_unit_test(test_paths_amax),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_element_calls),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
