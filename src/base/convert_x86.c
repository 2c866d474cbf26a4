/* x86-64 kernels of the dtype conversion (convert.c dispatches onto them
 * after asking the CPU). Each computes exactly the scalar reference of
 * base.h, which the tests check bit for bit:
 *   - f32 -> bf16: the integer rounding (bits + 0x7fff + lsb) >> 16 with a
 *     select for NaNs. AVX512_BF16's vcvtneps2bf16 is not used: it flushes
 *     f32 subnormals to zero, and the reference keeps them.
 *   - f32 -> f16: vcvtps2ph with round-to-nearest-even in its immediate
 *     (not MXCSR's mode); it produces f16 subnormals, makes NaNs quiet
 *     keeping sign and top payload bits, and overflows to infinity, as the
 *     reference does. Under DAZ an f32 subnormal input reads as zero, which
 *     is also what it rounds to.
 *   - f16 -> f32: vcvtph2ps (exact, subnormals included, DAZ ignored), with
 *     the quiet bit of NaNs restored from the source: widening keeps every
 *     bit, and vcvtph2ps makes signalling NaNs quiet.
 *   - bf16 -> f32: a shift.
 * AVX2 paths leave a tail of fewer than 16 elements to the reference;
 * AVX-512 paths finish with masked loads and stores. */
#include "base/base.h"
#include "base/convert_int.h"

#if FR_CONV_X86
#include <immintrin.h>

#define F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* ---- AVX2 + F16C ------------------------------------------------------------------------- */

#define T_AVX2 __attribute__((target("avx2,f16c")))

T_AVX2 static inline __m256i bf16_of8(__m256i u)
{
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
    __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

T_AVX2 static void avx2_f32_bf16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + 4 * i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 4 * i + 32));
        /* both halves hold values <= 0xffff: the saturating pack is exact;
         * it interleaves 128-bit lanes, the permute restores the order */
        __m256i p = _mm256_packus_epi32(bf16_of8(a), bf16_of8(b));
        _mm256_storeu_si256((__m256i *)(d + 2 * i), _mm256_permute4x64_epi64(p, 0xd8));
    }
    fr_conv_scalar_ops.f32_bf16(s + 4 * i, d + 2 * i, n - i);
}

T_AVX2 static void avx2_f32_f16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps((const float *)(s + 4 * i)), F16_RNE);
        __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps((const float *)(s + 4 * i + 32)), F16_RNE);
        _mm256_storeu_si256((__m256i *)(d + 2 * i), _mm256_set_m128i(b, a));
    }
    fr_conv_scalar_ops.f32_f16(s + 4 * i, d + 2 * i, n - i);
}

T_AVX2 static void avx2_bf16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + 2 * i));
        __m256i a = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
        __m256i b = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
        _mm256_storeu_si256((__m256i *)(d + 4 * i), _mm256_slli_epi32(a, 16));
        _mm256_storeu_si256((__m256i *)(d + 4 * i + 32), _mm256_slli_epi32(b, 16));
    }
    fr_conv_scalar_ops.bf16_f32(s + 2 * i, d + 4 * i, n - i);
}

/* vcvtph2ps is exact (f16 subnormals too, DAZ or not) except that it sets
 * the quiet bit (22) of a signalling NaN: NaN lanes get that bit back from
 * the source (its mantissa bit 9, shifted by 13). */
T_AVX2 static inline __m256i f32_of8_f16(__m128i h8)
{
    __m256i w = _mm256_castps_si256(_mm256_cvtph_ps(h8));
    __m256i h = _mm256_cvtepu16_epi32(h8);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)),
                                     _mm256_set1_epi32(0x7c00));
    __m256i bit = _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000));
    return _mm256_or_si256(_mm256_andnot_si256(bit, w),
                           _mm256_and_si256(_mm256_slli_epi32(h, 13), bit));
}

T_AVX2 static void avx2_f16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + 2 * i));
        __m256i a = f32_of8_f16(_mm256_castsi256_si128(h));
        __m256i b = f32_of8_f16(_mm256_extracti128_si256(h, 1));
        _mm256_storeu_si256((__m256i *)(d + 4 * i), a);
        _mm256_storeu_si256((__m256i *)(d + 4 * i + 32), b);
    }
    fr_conv_scalar_ops.f16_f32(s + 2 * i, d + 4 * i, n - i);
}

const fr_conv_ops fr_conv_avx2_ops = { avx2_f32_bf16, avx2_f32_f16, avx2_bf16_f32,
                                       avx2_f16_f32 };

/* ---- AVX-512 F + BW + VL ------------------------------------------------------------------ */

#define T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

/* the mask of the first k < 16 lanes */
#define LANES(k) ((__mmask16)((1u << (k)) - 1))

T_AVX512 static inline __m256i bf16_of16(__m512i u)
{
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                             _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* Measured (2-core AMD EPYC, 256 MiB): 512-bit vectors narrowed with
 * vpmovdw ran at 12-13 GB/s on buffers not 64-byte aligned (malloc's), the
 * 256-bit kernel at 17-20 GB/s aligned or not, so the bulk stays 256 bits
 * wide and only the tail is masked. */
T_AVX512 static void avx512_f32_bf16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = n - n % 16;
    avx2_f32_bf16(s, d, i);
    if (i < n) {
        __mmask16 k = LANES(n - i);
        _mm256_mask_storeu_epi16(d + 2 * i, k, bf16_of16(_mm512_maskz_loadu_epi32(k, s + 4 * i)));
    }
}

T_AVX512 static void avx512_f32_f16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm512_cvtps_ph(_mm512_loadu_ps(s + 4 * i), F16_RNE);
        __m256i b = _mm512_cvtps_ph(_mm512_loadu_ps(s + 4 * i + 64), F16_RNE);
        _mm512_storeu_si512(d + 2 * i, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : LANES(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, s + 4 * i), F16_RNE);
        _mm256_mask_storeu_epi16(d + 2 * i, k, h);
    }
}

T_AVX512 static void avx512_bf16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i h = _mm512_loadu_si512(s + 2 * i);
        __m512i a = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(h));
        __m512i b = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1));
        _mm512_storeu_si512(d + 4 * i, _mm512_slli_epi32(a, 16));
        _mm512_storeu_si512(d + 4 * i + 64, _mm512_slli_epi32(b, 16));
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : LANES(n - i);
        __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, s + 2 * i));
        _mm512_mask_storeu_epi32(d + 4 * i, k, _mm512_slli_epi32(a, 16));
    }
}

/* as f32_of8_f16 */
T_AVX512 static inline __m512i f32_of16_f16(__m256i h16)
{
    __m512i w = _mm512_castps_si512(_mm512_cvtph_ps(h16));
    __m512i h = _mm512_cvtepu16_epi32(h16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(h, _mm512_set1_epi32(0x7fff)),
                                            _mm512_set1_epi32(0x7c00));
    /* bit 22 of NaN lanes from the source */
    return _mm512_mask_ternarylogic_epi32(w, nan, _mm512_slli_epi32(h, 13),
                                          _mm512_set1_epi32(0x00400000), 0xd8);
}

T_AVX512 static void avx512_f16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i h = _mm512_loadu_si512(s + 2 * i);
        _mm512_storeu_si512(d + 4 * i, f32_of16_f16(_mm512_castsi512_si256(h)));
        _mm512_storeu_si512(d + 4 * i + 64, f32_of16_f16(_mm512_extracti64x4_epi64(h, 1)));
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : LANES(n - i);
        _mm512_mask_storeu_epi32(d + 4 * i, k, f32_of16_f16(_mm256_maskz_loadu_epi16(k, s + 2 * i)));
    }
}

const fr_conv_ops fr_conv_avx512_ops = { avx512_f32_bf16, avx512_f32_f16, avx512_bf16_f32,
                                         avx512_f16_f32 };

#endif
