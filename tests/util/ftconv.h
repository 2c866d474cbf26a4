/* Helpers of the conversion tests (test_base_convert, test_base_fp8): the
 * paths every check runs on, whether this CPU has one (said once, then its
 * checks are skipped: a path the CPU lacks cannot run here), a xorshift
 * for random bit patterns and f32 <-> bits. Define FT_CONV_TEST (the
 * test's name, for the message) and FT_CONV_SEED before including. */
#ifndef FT_CONV_H
#define FT_CONV_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/convert_int.h"

static const fr_conv_path paths[] = { FR_CONV_SCALAR, FR_CONV_PORTABLE, FR_CONV_AVX2,
                                      FR_CONV_AVX512, FR_CONV_AUTO };
#define NPATHS (sizeof paths / sizeof paths[0])

static inline bool path_on(fr_conv_path p)
{
    if (fr_conv_path_available(p))
        return true;
    static bool said[FR_CONV_NPATHS];
    if (!said[p])
        fprintf(stderr, "%s: this CPU or build has no %s path; its checks are skipped\n",
                FT_CONV_TEST, fr_conv_path_name(p));
    said[p] = true;
    return false;
}

static uint64_t rng = FT_CONV_SEED;
static inline uint32_t rnd32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static inline float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#endif
