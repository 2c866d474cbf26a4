/* Bitwise difference of two arrays of 2- or 4-byte elements (base.h): the
 * positions of the elements that differ, for the delta encoder (rl). The
 * reference compares element by element; the portable path skips runs of
 * equal 8-byte words, the common case when few elements change; the x86
 * path (diff_x86.c) 128 bytes at a time. Every path lists the same
 * positions in the same order. */
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "base/diff_int.h"

static size_t scalar_diff(const uint8_t *a, const uint8_t *b, size_t esize, size_t n,
                          uint32_t *idx)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i * esize, b + i * esize, esize) != 0)
            idx[k++] = (uint32_t)i;
    return k;
}

size_t fr_diff_tail(const uint8_t *a, const uint8_t *b, size_t esize, size_t from, size_t n,
                    uint32_t *idx, size_t k)
{
    for (size_t i = from; i < n; i++)
        if (memcmp(a + i * esize, b + i * esize, esize) != 0)
            idx[k++] = (uint32_t)i;
    return k;
}

/* 8-byte words: equal ones (most of them) cost one load and compare each. */
static size_t portable_diff(const uint8_t *a, const uint8_t *b, size_t esize, size_t n,
                            uint32_t *idx)
{
    size_t per = 8 / esize, k = 0, i = 0;
    for (; i + per <= n; i += per) {
        uint64_t x, y;
        memcpy(&x, a + i * esize, 8);
        memcpy(&y, b + i * esize, 8);
        if (x == y)
            continue;
        k = fr_diff_tail(a, b, esize, i, i + per, idx, k);
    }
    return fr_diff_tail(a, b, esize, i, n, idx, k);
}

size_t fr_diff_path(fr_conv_path path, const void *a, const void *b, size_t esize, size_t n,
                    uint32_t *idx)
{
    if ((esize != 2 && esize != 4) || (uint64_t)n > UINT32_MAX)
        return 0;
    if (path == FR_CONV_AUTO)
        path = fr_conv_path_best();
    if (!fr_conv_path_available(path))
        return 0;
    switch (path) {
    case FR_CONV_SCALAR:
        return scalar_diff(a, b, esize, n, idx);
#if FR_DIFF_X86
    case FR_CONV_AVX2:
    case FR_CONV_AVX512:
        return fr_diff_avx2(a, b, esize, n, idx);
#endif
    default:
        return portable_diff(a, b, esize, n, idx);
    }
}
