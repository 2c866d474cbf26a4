/* x86-64 kernels of the FP8 quantization (fp8.c dispatches onto them after
 * asking the CPU). Each computes exactly the scalar reference
 * (fr_fp8_from_f32_bits of the f32 product), which the tests check bit for
 * bit:
 *   - the product p = x * mul is the same IEEE f32 multiplication;
 *   - |p| is clamped to the largest finite in the f32 domain (a min that
 *     keeps a NaN: infinities and everything above saturate), then to the
 *     bits of the NaN code (sign | 0x7f) in the integer domain, which only
 *     a NaN reaches;
 *   - normal results: the reference's integer rounding, (a + half - 1 -
 *     bias offset + lsb) >> (23 - man), which for the clamped values gives
 *     the largest code and the NaN code exactly;
 *   - subnormal results: |p| + 2^k, with 2^k's ulp the smallest subnormal,
 *     rounds |p| to a multiple of it, ties to even, in one f32 addition
 *     (exact in the default round-to-nearest mode; an f32 subnormal |p|,
 *     read as 0 under DAZ, rounds to 0 either way); minus 2^k's bits is the
 *     code, 8 or 4 (the smallest normal) included;
 *   - the sign from the product, ORed in as 0x80.
 * amax: |x| + the f32 (bf16, f16) smallest normal's bits turns every
 * infinity and NaN negative as a signed integer, so a signed max leaves
 * them out (finite values stay ordered by their bits).
 * AVX2 leaves a tail of fewer than 32 (amax: 8 or 16) elements to the
 * reference; AVX-512 finishes with masked loads and stores. */
#include "base/base.h"
#include "base/convert_int.h"

#if FR_CONV_X86
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* the constants of a format, from its mantissa bits (3: E4M3, 2: E5M2) */
#define OFF(man) ((man) == 3 ? 120u << 23 : 112u << 23)
#define MAGIC(man) ((man) == 3 ? 141u << 23 : 134u << 23)
#define MAXC(man) ((man) == 3 ? 0x7eu : 0x7bu)
#define ROUND(man) ((1u << (22 - (man))) - 1 - OFF(man))
#define MAXF(man) ((man) == 3 ? 448.0f : 57344.0f)
/* the f32 bits whose rounding is the NaN code 0x7f: above every clamped finite */
#define NANB(man) ((0x7fu << (23 - (man))) + OFF(man))

/* ---- AVX2 -------------------------------------------------------------------------------- */

#define T_AVX2 __attribute__((target("avx2,f16c")))

T_AVX2 INLINE __m256i fp8_of8(__m256 x, __m256 mul, const int man)
{
    const int sh = 23 - man;
    __m256 p = _mm256_mul_ps(x, mul);
    __m256 ab = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    ab = _mm256_min_ps(_mm256_set1_ps(MAXF(man)), ab);   /* a NaN (the second operand) stays */
    __m256i a = _mm256_min_epu32(_mm256_castps_si256(ab), _mm256_set1_epi32((int)NANB(man)));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, sh), _mm256_set1_epi32(1));
    __m256i qn = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((int)ROUND(man))), lsb);
    qn = _mm256_srli_epi32(qn, sh);
    __m256i magic = _mm256_set1_epi32((int)MAGIC(man));
    __m256i qs = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(magic))),
        magic);
    /* a - the smallest normal's bits is negative (sign bit set) for a subnormal result */
    __m256 sub = _mm256_castsi256_ps(
        _mm256_sub_epi32(a, _mm256_set1_epi32((int)(OFF(man) + (1u << 23)))));
    __m256 q = _mm256_blendv_ps(_mm256_castsi256_ps(qn), _mm256_castsi256_ps(qs), sub);
    /* the sign: blendv takes p's sign bit */
    __m256 qneg = _mm256_or_ps(q, _mm256_castsi256_ps(_mm256_set1_epi32(0x80)));
    return _mm256_castps_si256(_mm256_blendv_ps(q, qneg, p));
}

/* 4 x 8 codes (each <= 0xff in a 32-bit lane) as 32 bytes in order: the
 * packs interleave 128-bit lanes, the permute restores the order */
T_AVX2 INLINE __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 elements of source type st (fr_ftype) at element i, as f32 */
T_AVX2 INLINE __m256 load8(const uint8_t *s, size_t i, const int st)
{
    if (st == FR_FT_F32)
        return _mm256_loadu_ps((const float *)(s + 4 * i));
    __m128i h = _mm_loadu_si128((const __m128i *)(s + 2 * i));
    if (st == FR_FT_F16)
        return _mm256_cvtph_ps(h);   /* exact; a NaN stays a NaN with its sign */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

T_AVX2 INLINE void avx2_quant(const uint8_t *restrict s, uint8_t *restrict d, size_t n, float mul,
                              const fr_fp8_fmt *f, const int st, const int man)
{
    __m256 m = _mm256_set1_ps(mul);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = fp8_of8(load8(s, i, st), m, man), b = fp8_of8(load8(s, i + 8, st), m, man);
        __m256i c = fp8_of8(load8(s, i + 16, st), m, man);
        __m256i e = fp8_of8(load8(s, i + 24, st), m, man);
        _mm256_storeu_si256((__m256i *)(d + i), pack32(a, b, c, e));
    }
    size_t es = st == FR_FT_F32 ? 4 : 2;
    fr_fp8_scalar_ops.quant[st - 1](s + es * i, d + i, n - i, mul, f);
}

#define AVX2_QUANT(name, st)                                                                    \
    T_AVX2 static void name(const uint8_t *restrict s, uint8_t *restrict d, size_t n, float mul,  \
                            const fr_fp8_fmt *f)                                                \
    {                                                                                           \
        if (f->man == 3)                                                                        \
            avx2_quant(s, d, n, mul, f, st, 3);                                                 \
        else                                                                                    \
            avx2_quant(s, d, n, mul, f, st, 2);                                                 \
    }
AVX2_QUANT(avx2_quant_f32, FR_FT_F32)
AVX2_QUANT(avx2_quant_bf16, FR_FT_BF16)
AVX2_QUANT(avx2_quant_f16, FR_FT_F16)

T_AVX2 static uint32_t avx2_amax_f32(const uint8_t *s, size_t n)
{
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), lift = _mm256_set1_epi32(0x00800000);
    __m256i acc = lift;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(s + 4 * i));
        acc = _mm256_max_epi32(acc, _mm256_add_epi32(_mm256_and_si256(u, abs), lift));
    }
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, acc);
    uint32_t m = fr_fp8_scalar_ops.amax[0](s + 4 * i, n - i);
    for (int k = 0; k < 8; k++)
        m = (uint32_t)v[k] - 0x00800000u > m ? (uint32_t)v[k] - 0x00800000u : m;
    return m;
}

/* bf16 and f16: the same on 16-bit lanes; lift is the smallest normal's bits */
T_AVX2 INLINE uint32_t avx2_amax16(const uint8_t *s, size_t n, const int st)
{
    const uint16_t lift16 = st == FR_FT_BF16 ? 0x0080 : 0x0400;
    const __m256i abs = _mm256_set1_epi16(0x7fff), lift = _mm256_set1_epi16((short)lift16);
    __m256i acc = lift;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + 2 * i));
        acc = _mm256_max_epi16(acc, _mm256_add_epi16(_mm256_and_si256(h, abs), lift));
    }
    int16_t v[16];
    _mm256_storeu_si256((__m256i *)v, acc);
    int16_t hm = 0;
    for (int k = 0; k < 16; k++)
        hm = v[k] > hm ? v[k] : hm;
    uint16_t h = (uint16_t)(hm - lift16);
    uint32_t m = st == FR_FT_BF16 ? fr_bf16_to_f32_bits(h) : fr_f16_to_f32_bits(h);
    uint32_t t = fr_fp8_scalar_ops.amax[st - 1](s + 2 * i, n - i);
    return t > m ? t : m;
}

T_AVX2 static uint32_t avx2_amax_bf16(const uint8_t *s, size_t n)
{
    return avx2_amax16(s, n, FR_FT_BF16);
}

T_AVX2 static uint32_t avx2_amax_f16(const uint8_t *s, size_t n)
{
    return avx2_amax16(s, n, FR_FT_F16);
}

const fr_fp8_ops fr_fp8_avx2_ops = { { avx2_quant_f32, avx2_quant_bf16, avx2_quant_f16 },
                                     { avx2_amax_f32, avx2_amax_bf16, avx2_amax_f16 } };

/* ---- AVX-512 F + BW + VL ------------------------------------------------------------------ */

#define T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

T_AVX512 INLINE __m128i fp8_of16(__m512 x, __m512 mul, const int man)
{
    const int sh = 23 - man;
    __m512 p = _mm512_mul_ps(x, mul);
    __m512 ab = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32(0x7fffffff)));
    ab = _mm512_min_ps(_mm512_set1_ps(MAXF(man)), ab);   /* a NaN (the second operand) stays */
    __m512i a = _mm512_min_epu32(_mm512_castps_si512(ab), _mm512_set1_epi32((int)NANB(man)));
    __mmask16 odd = _mm512_test_epi32_mask(a, _mm512_set1_epi32(1 << sh));
    __m512i q = _mm512_add_epi32(a, _mm512_set1_epi32((int)ROUND(man)));
    q = _mm512_srli_epi32(_mm512_mask_add_epi32(q, odd, q, _mm512_set1_epi32(1)), sh);
    __m512i magic = _mm512_set1_epi32((int)MAGIC(man));
    __mmask16 sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32((int)(OFF(man) + (1u << 23))));
    __m512i qs =
        _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(magic)));
    q = _mm512_mask_sub_epi32(q, sub, qs, magic);
    __mmask16 neg = _mm512_cmplt_epi32_mask(_mm512_castps_si512(p), _mm512_setzero_si512());
    q = _mm512_mask_or_epi32(q, neg, q, _mm512_set1_epi32(0x80));
    return _mm512_cvtepi32_epi8(q);
}

T_AVX512 INLINE __m512 load16(const uint8_t *s, size_t i, __mmask16 k, const int st)
{
    if (st == FR_FT_F32)
        return _mm512_maskz_loadu_ps(k, s + 4 * i);
    __m256i h = _mm256_maskz_loadu_epi16(k, s + 2 * i);
    if (st == FR_FT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

T_AVX512 INLINE void avx512_quant(const uint8_t *restrict s, uint8_t *restrict d, size_t n,
                                  float mul, const int st, const int man)
{
    __m512 m = _mm512_set1_ps(mul);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m128i a = fp8_of16(load16(s, i, 0xffff, st), m, man);
        __m128i b = fp8_of16(load16(s, i + 16, 0xffff, st), m, man);
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_set_m128i(b, a));
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm_mask_storeu_epi8(d + i, k, fp8_of16(load16(s, i, k, st), m, man));
    }
}

#define AVX512_QUANT(name, st)                                                                  \
    T_AVX512 static void name(const uint8_t *restrict s, uint8_t *restrict d, size_t n,          \
                              float mul, const fr_fp8_fmt *f)                                   \
    {                                                                                           \
        if (f->man == 3)                                                                        \
            avx512_quant(s, d, n, mul, st, 3);                                                  \
        else                                                                                    \
            avx512_quant(s, d, n, mul, st, 2);                                                  \
    }
AVX512_QUANT(avx512_quant_f32, FR_FT_F32)
AVX512_QUANT(avx512_quant_bf16, FR_FT_BF16)
AVX512_QUANT(avx512_quant_f16, FR_FT_F16)

T_AVX512 static uint32_t avx512_amax_f32(const uint8_t *s, size_t n)
{
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), lift = _mm512_set1_epi32(0x00800000);
    __m512i acc = lift;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512i u = _mm512_maskz_loadu_epi32(k, s + 4 * i);   /* 0 lanes: neutral */
        acc = _mm512_max_epi32(acc, _mm512_add_epi32(_mm512_and_si512(u, abs), lift));
    }
    return (uint32_t)_mm512_reduce_max_epi32(acc) - 0x00800000u;
}

T_AVX512 INLINE uint32_t avx512_amax16(const uint8_t *s, size_t n, const int st)
{
    const uint16_t lift16 = st == FR_FT_BF16 ? 0x0080 : 0x0400;
    const __m512i abs = _mm512_set1_epi16(0x7fff), lift = _mm512_set1_epi16((short)lift16);
    __m512i acc = lift;
    for (size_t i = 0; i < n; i += 32) {
        __mmask32 k = n - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (n - i)) - 1);
        __m512i h = _mm512_maskz_loadu_epi16(k, s + 2 * i);
        acc = _mm512_max_epi16(acc, _mm512_add_epi16(_mm512_and_si512(h, abs), lift));
    }
    /* 16-bit lanes: widen the two halves, then one 32-bit reduction */
    __m512i lo = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(acc));
    __m512i hi = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(acc, 1));
    uint16_t h = (uint16_t)(_mm512_reduce_max_epi32(_mm512_max_epi32(lo, hi)) - lift16);
    return st == FR_FT_BF16 ? fr_bf16_to_f32_bits(h) : fr_f16_to_f32_bits(h);
}

T_AVX512 static uint32_t avx512_amax_bf16(const uint8_t *s, size_t n)
{
    return avx512_amax16(s, n, FR_FT_BF16);
}

T_AVX512 static uint32_t avx512_amax_f16(const uint8_t *s, size_t n)
{
    return avx512_amax16(s, n, FR_FT_F16);
}

const fr_fp8_ops fr_fp8_avx512_ops = { { avx512_quant_f32, avx512_quant_bf16, avx512_quant_f16 },
                                       { avx512_amax_f32, avx512_amax_bf16, avx512_amax_f16 } };

#endif
