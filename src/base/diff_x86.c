/* The AVX2 kernel of the bitwise difference (diff.c): 128 bytes of each
 * array a step; a step whose four vectors compare equal costs two loads, a
 * compare and an AND per vector, and the positions of a step that differs
 * come from the compare masks in ascending order. Compiled with target
 * attributes, called only when the CPU has AVX2. */
#include <stddef.h>
#include <stdint.h>

#include "base/diff_int.h"

#if FR_DIFF_X86
#include <immintrin.h>

#define T_AVX2 __attribute__((target("avx2")))

/* Equality masks of one 32-byte vector: 1 bit per byte (movemask). */
T_AVX2 static inline __m256i eq_vec(const uint8_t *a, const uint8_t *b, size_t esize)
{
    __m256i x = _mm256_loadu_si256((const __m256i *)a), y = _mm256_loadu_si256((const __m256i *)b);
    return esize == 2 ? _mm256_cmpeq_epi16(x, y) : _mm256_cmpeq_epi32(x, y);
}

T_AVX2 size_t fr_diff_avx2(const uint8_t *a, const uint8_t *b, size_t esize, size_t n,
                           uint32_t *idx)
{
    const size_t per = 32 / esize;          /* elements a vector */
    const unsigned shift = esize == 2 ? 1 : 2;   /* byte bit -> element */
    size_t k = 0, i = 0;
    for (; i + 4 * per <= n; i += 4 * per) {
        const uint8_t *pa = a + i * esize, *pb = b + i * esize;
        __m256i e0 = eq_vec(pa, pb, esize), e1 = eq_vec(pa + 32, pb + 32, esize);
        __m256i e2 = eq_vec(pa + 64, pb + 64, esize), e3 = eq_vec(pa + 96, pb + 96, esize);
        __m256i all = _mm256_and_si256(_mm256_and_si256(e0, e1), _mm256_and_si256(e2, e3));
        if ((uint32_t)_mm256_movemask_epi8(all) == 0xffffffffu)
            continue;
        __m256i e[4] = { e0, e1, e2, e3 };
        for (int v = 0; v < 4; v++) {
            uint32_t m = ~(uint32_t)_mm256_movemask_epi8(e[v]);
            while (m) {
                unsigned bit = (unsigned)__builtin_ctz(m);
                idx[k++] = (uint32_t)(i + (size_t)v * per + (bit >> shift));
                m &= ~(((1u << esize) - 1u) << (bit & ~(esize - 1u)));   /* the element's bytes */
            }
        }
    }
    return fr_diff_tail(a, b, esize, i, n, idx, k);
}
#endif
