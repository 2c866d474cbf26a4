/* Dtype conversion between f32, bf16 and f16 (base.h, common.h): the
 * scalar reference, a portable branch-free path and the dispatch onto the
 * x86 kernels (convert_x86.c). Every narrowing is one rounding of the f32
 * bit pattern to nearest, ties to even, done in integer arithmetic (or by
 * an instruction given that rounding explicitly), so no path depends on the
 * FPU's rounding mode or flush-to-zero bits. bf16 <-> f16 goes through f32,
 * which holds both exactly, so it is rounded once too. */
#include <stdatomic.h>
#include <string.h>

#include "base/base.h"
#include "base/convert_int.h"

#if FR_CONV_X86
#include <cpuid.h>
#endif

fr_ftype fr_ftype_of(const char *dtype)
{
    if (!dtype)
        return FR_FT_NONE;
    if (!strcmp(dtype, "f32"))
        return FR_FT_F32;
    if (!strcmp(dtype, "bf16"))
        return FR_FT_BF16;
    if (!strcmp(dtype, "f16"))
        return FR_FT_F16;
    return FR_FT_NONE;
}

/* ---- scalar reference: the inline functions of base.h, one by one ---------------------- */

static uint32_t ld32(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

static uint16_t ld16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static void st32(uint8_t *p, uint32_t u) { memcpy(p, &u, 4); }
static void st16(uint8_t *p, uint16_t h) { memcpy(p, &h, 2); }

static void ref_f32_bf16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        st16(d + 2 * i, fr_bf16_from_f32_bits(ld32(s + 4 * i)));
}

static void ref_f32_f16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        st16(d + 2 * i, fr_f16_from_f32_bits(ld32(s + 4 * i)));
}

static void ref_bf16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        st32(d + 4 * i, fr_bf16_to_f32_bits(ld16(s + 2 * i)));
}

static void ref_f16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        st32(d + 4 * i, fr_f16_to_f32_bits(ld16(s + 2 * i)));
}

const fr_conv_ops fr_conv_scalar_ops = { ref_f32_bf16, ref_f32_f16, ref_bf16_f32, ref_f16_f32 };

/* ---- portable: branch-free, on the compiler's generic vectors ----------------------------
 * Four lanes in GCC/Clang vector types, lowered to whatever SIMD the target
 * has (SSE2, NEON, ...) without the auto-vectoriser (which -O2 leaves out);
 * every case is computed and one selected by a mask. Tails go to the
 * reference. */

typedef uint32_t v4u __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));
typedef uint16_t v4h __attribute__((vector_size(8)));

/* m ? a : b, lane by lane, for m all ones or all zeros */
static inline v4u sel(v4i m, v4u a, v4u b) { return ((v4u)m & a) | (~(v4u)m & b); }

static inline v4u ld4x32(const uint8_t *p)
{
    v4u v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v4u ld4x16(const uint8_t *p)
{
    v4h h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, v4u);
}

static inline void st4x16(uint8_t *p, v4u v)
{
    v4h h = __builtin_convertvector(v, v4h);   /* every lane holds <= 0xffff */
    memcpy(p, &h, sizeof h);
}

static inline void st4x32(uint8_t *p, v4u v) { memcpy(p, &v, sizeof v); }

static void port_f32_bf16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4u u = ld4x32(s + 4 * i), hi = u >> 16;
        v4u r = (u + 0x7fffu + (hi & 1u)) >> 16;
        st4x16(d + 2 * i, sel((u & 0x7fffffffu) > 0x7f800000u, hi | 0x40u, r));
    }
    ref_f32_bf16(s + 4 * i, d + 2 * i, n - i);
}

static void port_f32_f16(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4u u = ld4x32(s + 4 * i), a = u & 0x7fffffffu;
        v4u sign = (u >> 16) & 0x8000u;
        /* normal: rebias, add just under half an f16 ulp plus the kept lsb */
        v4u v = a - 0x38000000u;
        v4u nr = (v + 0xfffu + ((v >> 13) & 1u)) >> 13;
        /* subnormal: q = |x| * 2^24 rounded to an integer, ties to even;
         * the product is exact, the truncating conversion and the
         * difference too, so no rounding mode enters (and no lane-variable
         * shift, which SSE2 lacks). Other lanes are zeroed first so that
         * nothing out of the int range is converted. */
        v4i sub = a < 0x38800000u;
        v4f y;
        memcpy(&y, &a, sizeof y);
        y *= 0x1p24f;
        v4u yb;
        memcpy(&yb, &y, sizeof yb);
        yb &= (v4u)sub;
        memcpy(&y, &yb, sizeof y);
        v4i t = __builtin_convertvector(y, v4i);
        v4f fr = y - __builtin_convertvector(t, v4f);
        /* masks are -1 where true: subtracting one adds one */
        v4u sr = (v4u)(t - ((fr > 0.5f) | ((fr == 0.5f) & ((t & 1) != 0))));
        v4u r = sel(a < 0x38800000u, sr, nr);
        r = sel(a >= 0x477ff000u, (v4u){ 0 } + 0x7c00u, r);
        r = sel(a > 0x7f800000u, 0x7e00u | ((a >> 13) & 0x1ffu), r);
        st4x16(d + 2 * i, sign | r);
    }
    ref_f32_f16(s + 4 * i, d + 2 * i, n - i);
}

static void port_bf16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        st4x32(d + 4 * i, ld4x16(s + 2 * i) << 16);
    ref_bf16_f32(s + 2 * i, d + 4 * i, n - i);
}

static void port_f16_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4u h = ld4x16(s + 2 * i), em = h & 0x7fffu;
        v4u sign = (h & 0x8000u) << 16;
        v4u normal = (em << 13) + 0x38000000u;
        v4u infnan = (em << 13) | 0x7f800000u;
        /* a subnormal is em * 2^-24: exact in f32 (em < 1024) and the
         * product a normal number, so no rounding mode and no flush-to-zero
         * can touch it */
        v4f f = __builtin_convertvector((v4i)em, v4f) * 0x1p-24f;
        v4u sub;
        memcpy(&sub, &f, sizeof sub);
        v4u r = sel(em < 0x400u, sub, normal);
        st4x32(d + 4 * i, sign | sel(em >= 0x7c00u, infnan, r));
    }
    ref_f16_f32(s + 2 * i, d + 4 * i, n - i);
}

const fr_conv_ops fr_conv_portable_ops = { port_f32_bf16, port_f32_f16, port_bf16_f32,
                                           port_f16_f32 };

/* ---- dispatch ---------------------------------------------------------------------------- */

/* What the CPU offers, probed once: CPUID is a trap to the hypervisor on
 * a VM (microseconds each), and conversions are called per tensor or per
 * element by callers; the answer cannot change while the process runs. */
static bool probe_path(fr_conv_path path);

bool fr_conv_path_available(fr_conv_path path)
{
    static atomic_uint known, have;   /* bit p: probed; bit p: available */
    unsigned bit = (unsigned)path < 32 ? 1u << (unsigned)path : 0;
    if (bit && (atomic_load_explicit(&known, memory_order_acquire) & bit))
        return (atomic_load_explicit(&have, memory_order_relaxed) & bit) != 0;
    bool ok = probe_path(path);
    if (bit) {
        if (ok)
            atomic_fetch_or_explicit(&have, bit, memory_order_relaxed);
        atomic_fetch_or_explicit(&known, bit, memory_order_release);
    }
    return ok;
}

static bool probe_path(fr_conv_path path)
{
    switch (path) {
    case FR_CONV_AUTO:
    case FR_CONV_SCALAR:
    case FR_CONV_PORTABLE:
        return true;
#if FR_CONV_X86
    case FR_CONV_AVX2: {
        /* F16C through cpuid: clang's __builtin_cpu_supports has no "f16c";
         * its state is the AVX state that the "avx2" check already found
         * enabled by the OS */
        unsigned a, b, c, d;
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
               (c & bit_F16C);
    }
    case FR_CONV_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
#endif
    default:
        return false;
    }
}

const char *fr_conv_path_name(fr_conv_path path)
{
    static const char *const names[FR_CONV_NPATHS] = { "auto", "scalar", "portable", "avx2",
                                                       "avx512" };
    return (unsigned)path < FR_CONV_NPATHS ? names[path] : "?";
}

fr_conv_path fr_conv_path_best(void)
{
    if (fr_conv_path_available(FR_CONV_AVX512))
        return FR_CONV_AVX512;
    if (fr_conv_path_available(FR_CONV_AVX2))
        return FR_CONV_AVX2;
    return FR_CONV_PORTABLE;
}

static const fr_conv_ops *ops_of(fr_conv_path path)
{
    switch (path) {
    case FR_CONV_SCALAR:
        return &fr_conv_scalar_ops;
    case FR_CONV_PORTABLE:
        return &fr_conv_portable_ops;
#if FR_CONV_X86
    case FR_CONV_AVX2:
        return &fr_conv_avx2_ops;
    case FR_CONV_AVX512:
        return &fr_conv_avx512_ops;
#endif
    default:
        return NULL;
    }
}

static bool ftype_ok(fr_ftype t) { return t == FR_FT_F32 || t == FR_FT_BF16 || t == FR_FT_F16; }

int fr_convert_path(fr_conv_path path, const void *src, fr_ftype st, void *dst, fr_ftype dt,
                    size_t count)
{
    if (!ftype_ok(st) || !ftype_ok(dt) || (count && (!src || !dst)) || count > SIZE_MAX / 4 ||
        (unsigned)path >= FR_CONV_NPATHS)
        return FERRY_EINVAL;
    if (!fr_conv_path_available(path))
        return FERRY_ENOTSUP;
    if (count == 0)
        return 0;
    if (st == dt) {
        if (src != dst)
            memmove(dst, src, count * (st == FR_FT_F32 ? 4 : 2));
        return 0;
    }
    const fr_conv_ops *ops = ops_of(path == FR_CONV_AUTO ? fr_conv_path_best() : path);
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (st == FR_FT_F32) {
        (dt == FR_FT_BF16 ? ops->f32_bf16 : ops->f32_f16)(s, d, count);
        return 0;
    }
    fr_conv_fn *widen = st == FR_FT_BF16 ? ops->bf16_f32 : ops->f16_f32;
    if (dt == FR_FT_F32) {
        widen(s, d, count);
        return 0;
    }
    /* bf16 <-> f16: through f32 in pieces that stay in L1 */
    fr_conv_fn *narrow = dt == FR_FT_BF16 ? ops->f32_bf16 : ops->f32_f16;
    uint8_t buf[4096];
    for (size_t i = 0; i < count; i += sizeof buf / 4) {
        size_t n = count - i < sizeof buf / 4 ? count - i : sizeof buf / 4;
        widen(s + 2 * i, buf, n);
        narrow(buf, d + 2 * i, n);
    }
    return 0;
}

int fr_convert(const void *src, fr_ftype st, void *dst, fr_ftype dt, size_t count)
{
    return fr_convert_path(FR_CONV_AUTO, src, st, dst, dt, count);
}

int ferry_convert(const void *src, const char *src_dtype, void *dst, const char *dst_dtype,
                  size_t count)
{
    return fr_convert(src, fr_ftype_of(src_dtype), dst, fr_ftype_of(dst_dtype), count);
}
