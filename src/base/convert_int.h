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

#if defined(__x86_64__) && defined(__GNUC__)
#define FR_CONV_X86 1
extern const fr_conv_ops fr_conv_avx2_ops, fr_conv_avx512_ops;
#else
#define FR_CONV_X86 0
#endif

#endif
