/* FP8 quantization (common.h, "FP8 quantization"): the scalar reference
 * kernels, the block driver and the public calls. The rounding is integer
 * arithmetic on the f32 product's bits (fr_fp8_from_f32_bits in base.h);
 * the x86 kernels (fp8_x86.c) compute the same bits and are chosen at run
 * time through the conversion's path probe. */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "base/convert_int.h"

/* The floor of a block's amax: a block of zeros (or of values this small)
 * gets the scale 1e-4 / FP8_MAX, as DeepGEMM's and vLLM's
 * per_block_cast_to_fp8 do (amax.clamp(1e-4)). */
#define FP8_AMAX_FLOOR 1e-4f

const fr_fp8_fmt fr_fp8_e4m3 = { 3, 120u << 23, 121u << 23, 141, 0x43e00000u, 0x7e, 141u << 23,
                                 448.0f };
const fr_fp8_fmt fr_fp8_e5m2 = { 2, 112u << 23, 113u << 23, 134, 0x47600000u, 0x7b, 134u << 23,
                                 57344.0f };

const fr_fp8_fmt *fr_fp8_fmt_of(const char *dtype)
{
    if (!dtype)
        return NULL;
    if (!strcmp(dtype, "f8e4m3") || !strcmp(dtype, "fp8_e4m3"))
        return &fr_fp8_e4m3;
    if (!strcmp(dtype, "f8e5m2") || !strcmp(dtype, "fp8_e5m2"))
        return &fr_fp8_e5m2;
    return NULL;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float fr_fp8_to_f32(uint8_t q, const fr_fp8_fmt *f)
{
    uint32_t sign = (uint32_t)(q & 0x80u) << 24, em = q & 0x7fu, m = em & ((1u << f->man) - 1);
    uint32_t e = em >> f->man, emax = (1u << (7 - f->man)) - 1;
    if (em > f->max_code && (f == &fr_fp8_e4m3 || m != 0))
        return f32_of(sign | 0x7fc00000u);
    if (e == emax && f != &fr_fp8_e4m3)
        return f32_of(sign | 0x7f800000u);      /* E5M2's infinity (never written) */
    if (e != 0)                                 /* normal: rebias */
        return f32_of(sign | ((em << (23 - f->man)) + f->norm_off));
    /* subnormal: m times the smallest subnormal, exact */
    float v = (float)m * f32_of((f->sub_base - 23u) << 23);
    return f32_of(sign | bits_of(v));
}

/* ---- the scalar reference kernels -------------------------------------------------------- */

static void ref_quant_f32(const uint8_t *restrict s, uint8_t *restrict d, size_t n, float mul,
                          const fr_fp8_fmt *f)
{
    for (size_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, s + 4 * i, 4);
        d[i] = fr_fp8_from_f32_bits(bits_of(x * mul), f);
    }
}

static void ref_quant_16(const uint8_t *restrict s, uint8_t *restrict d, size_t n, float mul,
                         const fr_fp8_fmt *f, bool bf16)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        float x = f32_of(bf16 ? fr_bf16_to_f32_bits(h) : fr_f16_to_f32_bits(h));
        d[i] = fr_fp8_from_f32_bits(bits_of(x * mul), f);
    }
}

static void ref_quant_bf16(const uint8_t *restrict s, uint8_t *restrict d, size_t n, float mul,
                           const fr_fp8_fmt *f)
{
    ref_quant_16(s, d, n, mul, f, true);
}

static void ref_quant_f16(const uint8_t *restrict s, uint8_t *restrict d, size_t n, float mul,
                          const fr_fp8_fmt *f)
{
    ref_quant_16(s, d, n, mul, f, false);
}

static uint32_t amax_of(uint32_t m, uint32_t u)
{
    u &= 0x7fffffffu;
    return u < 0x7f800000u && u > m ? u : m;
}

static uint32_t ref_amax_f32(const uint8_t *s, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, s + 4 * i, 4);
        m = amax_of(m, u);
    }
    return m;
}

static uint32_t ref_amax_16(const uint8_t *s, size_t n, bool bf16)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        m = amax_of(m, bf16 ? fr_bf16_to_f32_bits(h) : fr_f16_to_f32_bits(h));
    }
    return m;
}

static uint32_t ref_amax_bf16(const uint8_t *s, size_t n)
{
    return ref_amax_16(s, n, true);
}

static uint32_t ref_amax_f16(const uint8_t *s, size_t n)
{
    return ref_amax_16(s, n, false);
}

const fr_fp8_ops fr_fp8_scalar_ops = { { ref_quant_f32, ref_quant_bf16, ref_quant_f16 },
                                       { ref_amax_f32, ref_amax_bf16, ref_amax_f16 } };

/* ---- paths ------------------------------------------------------------------------------- */

/* The portable path has no kernels of its own: it runs the reference. */
static const fr_fp8_ops *fp8_ops_of(fr_conv_path path)
{
    if (path == FR_CONV_AUTO)
        path = fr_conv_path_best();
    switch (path) {
    case FR_CONV_SCALAR:
    case FR_CONV_PORTABLE:
        return &fr_fp8_scalar_ops;
#if FR_CONV_X86
    case FR_CONV_AVX2:
        return &fr_fp8_avx2_ops;
    case FR_CONV_AVX512:
        return &fr_fp8_avx512_ops;
#endif
    default:
        return NULL;
    }
}

static size_t esize(fr_ftype t) { return t == FR_FT_F32 ? 4 : 2; }

int fr_quantize_fp8_path(fr_conv_path path, const void *src, fr_ftype st, uint8_t *dst,
                         const fr_fp8_fmt *f, size_t count, float mul)
{
    if (st == FR_FT_NONE || !f || (count && (!src || !dst)) || (unsigned)path >= FR_CONV_NPATHS)
        return FERRY_EINVAL;
    if (!fr_conv_path_available(path))
        return FERRY_ENOTSUP;
    if (count)
        fp8_ops_of(path)->quant[st - 1](src, dst, count, mul, f);
    return 0;
}

int fr_fp8_amax_path(fr_conv_path path, const void *src, fr_ftype st, size_t count,
                     uint32_t *amax_bits)
{
    if (st == FR_FT_NONE || (count && !src) || !amax_bits || (unsigned)path >= FR_CONV_NPATHS)
        return FERRY_EINVAL;
    if (!fr_conv_path_available(path))
        return FERRY_ENOTSUP;
    *amax_bits = count ? fp8_ops_of(path)->amax[st - 1](src, count) : 0;
    return 0;
}

float fr_fp8_block_scale(uint32_t amax_bits, const fr_fp8_fmt *f, int scale_format)
{
    float amax = f32_of(amax_bits);
    float s = (amax > FP8_AMAX_FLOOR ? amax : FP8_AMAX_FLOOR) / f->max;
    uint32_t u = bits_of(s);   /* a normal f32: at least 1e-4 / 57344 */
    if (scale_format == FERRY_FP8_SCALE_UE8M0 && (u & 0x7fffffu))
        u = (u & 0x7f800000u) + 0x800000u;   /* 2^ceil(log2 s), exactly */
    return f32_of(u);
}

/* ---- the public calls -------------------------------------------------------------------- */

/* The source and FP8 types of a call, or a failure naming the bad one. */
static int fp8_types(const char *what, const char *wide, fr_ftype *wt, const char *narrow,
                     const fr_fp8_fmt **nf, ferry_error *err)
{
    *wt = fr_ftype_of(wide);
    *nf = fr_fp8_fmt_of(narrow);
    if (*wt == FR_FT_NONE)
        return fr_fail(err, FERRY_EINVAL, "%s: dtype %s is not f32, bf16 or f16", what,
                       wide ? wide : "(null)");
    if (!*nf)
        return fr_fail(err, FERRY_EINVAL, "%s: dtype %s is not f8e4m3 or f8e5m2", what,
                       narrow ? narrow : "(null)");
    return 0;
}

static bool scale_ok(float scale) { return isfinite(scale) && scale > 0; }

int ferry_quantize_fp8(const void *src, const char *src_dtype, void *dst, const char *dst_dtype,
                       size_t count, float scale, ferry_error *err)
{
    fr_ftype st;
    const fr_fp8_fmt *f;
    int rc = fp8_types("quantize", src_dtype, &st, dst_dtype, &f, err);
    if (rc < 0)
        return rc;
    if (count && (!src || !dst))
        return fr_fail(err, FERRY_EINVAL, "quantize: NULL buffer with %zu elements", count);
    float mul = 1.0f / scale;
    if (!scale_ok(scale) || !isnormal(mul))
        return fr_fail(err, FERRY_EINVAL, "quantize: scale %g has no finite, normal inverse",
                       (double)scale);
    return fr_quantize_fp8_path(FR_CONV_AUTO, src, st, dst, f, count, mul);
}

static void dequant_run(const uint8_t *s, const fr_fp8_fmt *f, uint8_t *d, fr_ftype dt,
                        size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        fr_elem_store_f32(d + i * esize(dt), dt, fr_fp8_to_f32(s[i], f) * scale);
}

int ferry_dequantize_fp8(const void *src, const char *src_dtype, void *dst, const char *dst_dtype,
                         size_t count, float scale, ferry_error *err)
{
    fr_ftype dt;
    const fr_fp8_fmt *f;
    int rc = fp8_types("dequantize", dst_dtype, &dt, src_dtype, &f, err);
    if (rc < 0)
        return rc;
    if (count && (!src || !dst))
        return fr_fail(err, FERRY_EINVAL, "dequantize: NULL buffer with %zu elements", count);
    if (!scale_ok(scale))
        return fr_fail(err, FERRY_EINVAL, "dequantize: scale %g is not finite and > 0",
                       (double)scale);
    dequant_run(src, f, dst, dt, count, scale);
    return 0;
}

void ferry_fp8_options_init(ferry_fp8_options *opt)
{
    if (!opt)
        return;
    *opt = (ferry_fp8_options){ .block_rows = FERRY_FP8_DEFAULT_BLOCK,
                                .block_cols = FERRY_FP8_DEFAULT_BLOCK,
                                .scale_format = FERRY_FP8_SCALE_F32 };
}

/* The options resolved once, where the call takes them: NULL and 0 fields
 * are the defaults of ferry_fp8_options_init. */
static int blocks_args(const char *what, const ferry_fp8_options *in, ferry_fp8_options *o,
                       const void *src, size_t src_stride, const void *dst, size_t dst_stride,
                       size_t rows, size_t cols, const float *scales, ferry_error *err)
{
    ferry_fp8_options_init(o);
    if (in) {
        if (!FR_RESERVED_OK(in) || in->reserved32)
            return fr_fail(err, FERRY_EINVAL, "%s: the options' reserved fields must be zero",
                           what);
        if (in->scale_format != FERRY_FP8_SCALE_F32 && in->scale_format != FERRY_FP8_SCALE_UE8M0)
            return fr_fail(err, FERRY_EINVAL, "%s: unknown scale format %u", what,
                           in->scale_format);
        o->scale_format = in->scale_format;
        if (in->block_rows)
            o->block_rows = in->block_rows;
        if (in->block_cols)
            o->block_cols = in->block_cols;
    }
    if (rows > 1 && src_stride < cols)
        return fr_fail(err, FERRY_EINVAL, "%s: source stride %zu is below the %zu columns", what,
                       src_stride, cols);
    if (rows > 1 && dst_stride < cols)
        return fr_fail(err, FERRY_EINVAL, "%s: destination stride %zu is below the %zu columns",
                       what, dst_stride, cols);
    if (rows && cols && (!src || !dst || !scales))
        return fr_fail(err, FERRY_EINVAL, "%s: NULL buffer for a %zu x %zu region", what, rows,
                       cols);
    size_t widest = src_stride > dst_stride ? src_stride : dst_stride;
    widest = widest > cols ? widest : cols;
    if (widest && rows > SIZE_MAX / 4 / widest)
        return fr_fail(err, FERRY_ERANGE, "%s: a %zu x %zu region overflows the address space",
                       what, rows, cols);
    return 0;
}

static size_t blocks_of(size_t n, uint32_t b) { return n / b + (n % b != 0); }

/* The block driver walks a strip of block rows in tiles: as many whole
 * blocks side by side as fit FP8_TILE_BYTES of source (at most
 * FP8_TILE_BLOCKS), which for the usual widths is the whole strip: rows
 * read from first column to last, one after the other in memory, so the
 * hardware prefetcher streams them (block by block, each row was a few
 * lines in its own page, too short for it: 0.65 of memcpy; tiles of
 * 256 KiB, L2-sized but with 2 KiB row pieces, ran at 0.51). The first
 * pass takes the blocks' amax row by row, the second quantizes the tile
 * again, from cache (docs/weights.md, "Paths"). */
#define FP8_TILE_BYTES (4u << 20)
#define FP8_TILE_BLOCKS 256u

typedef struct fp8_strip {
    fr_fp8_amax_fn *amax;
    fr_fp8_quant_fn *quant;
    const fr_fp8_fmt *f;
    int scale_format;
    size_t es, src_stride, dst_stride;   /* bytes per source element; strides in elements */
    uint32_t bc;                         /* block columns */
} fp8_strip;

/* One strip of nr rows (s, d at its first row), every column; scales gets
 * its blocks' scales in order. */
static void quant_strip(const fp8_strip *k, const uint8_t *s, uint8_t *d, size_t nr,
                        size_t cols, float *scales)
{
    size_t per = FP8_TILE_BYTES / (nr * k->bc * k->es);
    per = per < 1 ? 1 : per > FP8_TILE_BLOCKS ? FP8_TILE_BLOCKS : per;
    for (size_t c0 = 0, b0 = 0; c0 < cols; c0 += per * k->bc, b0 += per) {
        size_t w = cols - c0 < per * k->bc ? cols - c0 : per * k->bc;
        size_t nb = w / k->bc + (w % k->bc != 0);
        uint32_t amax[FP8_TILE_BLOCKS] = { 0 };
        float mul[FP8_TILE_BLOCKS];
        for (size_t r = 0; r < nr; r++) {
            const uint8_t *row = s + (r * k->src_stride + c0) * k->es;
            for (size_t b = 0, c = 0; b < nb; b++, c += k->bc) {
                uint32_t m = k->amax(row + c * k->es, w - c < k->bc ? w - c : k->bc);
                amax[b] = m > amax[b] ? m : amax[b];
            }
        }
        for (size_t b = 0; b < nb; b++) {
            scales[b0 + b] = fr_fp8_block_scale(amax[b], k->f, k->scale_format);
            mul[b] = 1.0f / scales[b0 + b];
        }
        for (size_t r = 0; r < nr; r++) {
            const uint8_t *row = s + (r * k->src_stride + c0) * k->es;
            uint8_t *out = d + r * k->dst_stride + c0;
            for (size_t b = 0, c = 0; b < nb; b++, c += k->bc)
                k->quant(row + c * k->es, out + c, w - c < k->bc ? w - c : k->bc, mul[b], k->f);
        }
    }
}

int ferry_quantize_fp8_blocks(const void *src, const char *src_dtype, size_t src_stride,
                              void *dst, const char *dst_dtype, size_t dst_stride, size_t rows,
                              size_t cols, float *scales, const ferry_fp8_options *opt,
                              ferry_error *err)
{
    const char *what = "quantize blocks";
    fr_ftype st;
    const fr_fp8_fmt *f;
    ferry_fp8_options o;
    int rc = fp8_types(what, src_dtype, &st, dst_dtype, &f, err);
    if (rc == 0)
        rc = blocks_args(what, opt, &o, src, src_stride, dst, dst_stride, rows, cols, scales, err);
    if (rc < 0 || !rows || !cols)
        return rc;
    const fr_fp8_ops *ops = fp8_ops_of(FR_CONV_AUTO);
    const fp8_strip k = { ops->amax[st - 1], ops->quant[st - 1], f, (int)o.scale_format,
                          esize(st), src_stride, dst_stride, o.block_cols };
    size_t ncb = blocks_of(cols, o.block_cols);
    for (size_t r0 = 0; r0 < rows; r0 += o.block_rows) {
        size_t nr = rows - r0 < o.block_rows ? rows - r0 : o.block_rows;
        quant_strip(&k, (const uint8_t *)src + r0 * src_stride * k.es,
                    (uint8_t *)dst + r0 * dst_stride, nr, cols,
                    scales + r0 / o.block_rows * ncb);
    }
    return 0;
}

int ferry_dequantize_fp8_blocks(const void *src, const char *src_dtype, size_t src_stride,
                                void *dst, const char *dst_dtype, size_t dst_stride, size_t rows,
                                size_t cols, const float *scales, const ferry_fp8_options *opt,
                                ferry_error *err)
{
    const char *what = "dequantize blocks";
    fr_ftype dt;
    const fr_fp8_fmt *f;
    ferry_fp8_options o;
    int rc = fp8_types(what, dst_dtype, &dt, src_dtype, &f, err);
    if (rc == 0)
        rc = blocks_args(what, opt, &o, src, src_stride, dst, dst_stride, rows, cols, scales, err);
    if (rc < 0 || !rows || !cols)
        return rc;
    size_t nrb = blocks_of(rows, o.block_rows), ncb = blocks_of(cols, o.block_cols);
    for (size_t i = 0; i < nrb * ncb; i++)
        if (!scale_ok(scales[i]))
            return fr_fail(err, FERRY_EINVAL, "%s: scale %zu (%g) is not finite and > 0", what, i,
                           (double)scales[i]);
    const uint8_t *s = src;
    uint8_t *d = dst;
    size_t es = esize(dt);
    for (size_t r = 0; r < rows; r++)
        for (size_t c0 = 0; c0 < cols; c0 += o.block_cols) {
            size_t nc = cols - c0 < o.block_cols ? cols - c0 : o.block_cols;
            dequant_run(s + r * src_stride + c0, f, d + (r * dst_stride + c0) * es, dt, nc,
                        scales[r / o.block_rows * ncb + c0 / o.block_cols]);
        }
    return 0;
}

/* ---- regions of a block grid (a trainer's shard) ------------------------------------------ */

void fr_fp8_region_amax(const void *src, fr_ftype st, size_t src_stride, size_t rows,
                        size_t cols, uint64_t row0, uint64_t col0, const uint32_t block[2],
                        uint32_t *amax, size_t grid_stride)
{
    const fr_fp8_ops *ops = fp8_ops_of(FR_CONV_AUTO);
    size_t es = esize(st);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + r * src_stride * es;
        uint32_t *g = amax + ((row0 + r) / block[0] - row0 / block[0]) * grid_stride;
        for (size_t c = 0; c < cols;) {
            uint64_t gc = col0 + c, n = block[1] - gc % block[1];
            n = n < cols - c ? n : cols - c;
            uint32_t m = ops->amax[st - 1](row + c * es, (size_t)n);
            uint32_t *a = g + (gc / block[1] - col0 / block[1]);
            *a = m > *a ? m : *a;
            c += (size_t)n;
        }
    }
}

void fr_fp8_region_quant(const void *src, fr_ftype st, size_t src_stride, uint8_t *dst,
                         size_t dst_stride, size_t rows, size_t cols, uint64_t row0,
                         uint64_t col0, const uint32_t block[2], const float *scales,
                         size_t grid_stride, const fr_fp8_fmt *f)
{
    const fr_fp8_ops *ops = fp8_ops_of(FR_CONV_AUTO);
    size_t es = esize(st);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + r * src_stride * es;
        const float *g = scales + ((row0 + r) / block[0] - row0 / block[0]) * grid_stride;
        for (size_t c = 0; c < cols;) {
            uint64_t gc = col0 + c, n = block[1] - gc % block[1];
            n = n < cols - c ? n : cols - c;
            float mul = 1.0f / g[gc / block[1] - col0 / block[1]];
            ops->quant[st - 1](row + c * es, dst + r * dst_stride + c, (size_t)n, mul, f);
            c += (size_t)n;
        }
    }
}
