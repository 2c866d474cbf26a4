/* Rollout dtype conversion between f32, bf16 and f16 (weights.h). Every
 * narrowing goes through f32 bits with one rounding (to nearest, ties to
 * even), so bf16 <-> f16 is rounded once too (f32 holds both exactly). */
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"

enum { F32 = 1, BF16 = 2, F16 = 3 };

static int kind(const char *d)
{
    if (!d)
        return 0;
    if (!strcmp(d, "f32"))
        return F32;
    if (!strcmp(d, "bf16"))
        return BF16;
    if (!strcmp(d, "f16"))
        return F16;
    return 0;
}

static uint16_t f16_from_bits(uint32_t u)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x1ffu);   /* quiet NaN */
    if (a >= 0x477ff000u)                     /* rounds to >= 65536: infinity */
        return sign | 0x7c00u;
    if (a < 0x38800000u) {                    /* below 2^-14: f16 subnormal or zero */
        if (a < 0x33000000u)                  /* below half the smallest subnormal */
            return sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;             /* value / 2^-24 = m * 2^(e - 126) */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return sign | (uint16_t)q;
    }
    /* normal: rebias the exponent, round the mantissa from 23 to 10 bits */
    uint32_t v = a - 0x38000000u;             /* exponent - 112 */
    uint32_t q = v >> 13, rem = v & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
        q++;                                  /* may carry into the exponent: still right */
    return sign | (uint16_t)q;
}

static uint32_t bits_of_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return sign | 0x7f800000u | (m << 13);
    if (e != 0)
        return sign | ((e + 112) << 23) | (m << 13);
    if (m == 0)
        return sign;
    /* subnormal: normalise */
    uint32_t sh = 0;
    while (!(m & 0x400u)) {
        m <<= 1;
        sh++;
    }
    return sign | ((113 - sh) << 23) | ((m & 0x3ffu) << 13);
}

static uint32_t load_bits(const uint8_t *p, int k)
{
    if (k == F32) {
        uint32_t u;
        memcpy(&u, p, 4);
        return u;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return k == BF16 ? (uint32_t)h << 16 : bits_of_f16(h);
}

int ferry_convert(const void *src, const char *src_dtype, void *dst, const char *dst_dtype,
                  size_t count)
{
    int sk = kind(src_dtype), dk = kind(dst_dtype);
    if (!sk || !dk || (count && (!src || !dst)))
        return FERRY_EINVAL;
    size_t ss = sk == F32 ? 4 : 2, ds = dk == F32 ? 4 : 2;
    if (sk == dk) {
        if (src != dst)
            memmove(dst, src, count * ss);
        return 0;
    }
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (size_t i = 0; i < count; i++) {
        uint32_t u = load_bits(s + i * ss, sk);
        if (dk == F32) {
            memcpy(d + i * ds, &u, 4);
            continue;
        }
        uint16_t h = dk == BF16 ? fr_bf16_from_f32_bits(u) : f16_from_bits(u);
        memcpy(d + i * ds, &h, 2);
    }
    return 0;
}
