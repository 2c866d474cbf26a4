/* base layer, inside the conversion (convert.c, convert_x86.c): one table
 * of bulk kernels per implementation path. */
#ifndef FR_CONVERT_INT_H
#define FR_CONVERT_INT_H

#include <stddef.h>
#include <stdint.h>

/* n elements from s to d; no alignment, no overlap, n may be 0. */
typedef void fr_conv_fn(const uint8_t *restrict s, uint8_t *restrict d, size_t n);

typedef struct fr_conv_ops {
    fr_conv_fn *f32_bf16, *f32_f16, *bf16_f32, *f16_f32;
} fr_conv_ops;

extern const fr_conv_ops fr_conv_scalar_ops, fr_conv_portable_ops;

/* FP8 quantization kernels (fp8.c, fp8_x86.c), one table per path, indexed
 * by the source's fr_ftype - 1 (f32, bf16, f16). quant: n elements times
 * mul, rounded into format f (fr_fp8_from_f32_bits); amax: the f32 bits of
 * the largest finite |x| of n elements (0 for none). */
typedef void fr_fp8_quant_fn(const uint8_t *restrict s, uint8_t *restrict d, size_t n, float mul,
                             const struct fr_fp8_fmt *f);
typedef uint32_t fr_fp8_amax_fn(const uint8_t *s, size_t n);

typedef struct fr_fp8_ops {
    fr_fp8_quant_fn *quant[3];
    fr_fp8_amax_fn *amax[3];
} fr_fp8_ops;

extern const fr_fp8_ops fr_fp8_scalar_ops;

#if defined(__x86_64__) && defined(__GNUC__)
#define FR_CONV_X86 1
extern const fr_conv_ops fr_conv_avx2_ops, fr_conv_avx512_ops;
extern const fr_fp8_ops fr_fp8_avx2_ops, fr_fp8_avx512_ops;
#else
#define FR_CONV_X86 0
#endif

#endif
