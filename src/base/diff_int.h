/* base layer, inside the bitwise difference (diff.c, diff_x86.c). */
#ifndef FR_DIFF_INT_H
#define FR_DIFF_INT_H

#include <stddef.h>
#include <stdint.h>

/* The reference over elements [from, n), appending to idx[k..]; the new k. */
size_t fr_diff_tail(const uint8_t *a, const uint8_t *b, size_t esize, size_t from, size_t n,
                    uint32_t *idx, size_t k);

#if defined(__x86_64__) && defined(__GNUC__)
#define FR_DIFF_X86 1
/* AVX2: 128 bytes a step, the rest through fr_diff_tail. */
size_t fr_diff_avx2(const uint8_t *a, const uint8_t *b, size_t esize, size_t n, uint32_t *idx);
#else
#define FR_DIFF_X86 0
#endif

#endif
