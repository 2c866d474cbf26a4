/* base layer: internal helpers every other layer uses. Depends on nothing
 * but libc, libxxhash, libsodium and jansson. Internal names are fr_. */
#ifndef FR_BASE_H
#define FR_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

#include <jansson.h>

#include "ferry/common.h"

/* ---- errors ----------------------------------------------------------- */
/* Fill err (may be NULL) with code and a sentence; returns code. The
 * arguments may point into err->msg itself (a message wrapped in more
 * context): the sentence is formatted aside first. Every layer fails
 * through it. */
int fr_fail(ferry_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The sentence a call below left in err for its failure rc, to wrap in
 * more context: fr_fail(err, rc, "reading %s: %s", key, fr_why(err, rc)).
 * The code's own text when err holds no sentence for rc (a call that
 * returned the code alone, or err left from an earlier failure), so a stale
 * sentence is never repeated; "" when err is NULL (fr_fail formats nothing). */
const char *fr_why(const ferry_error *err, int rc);
/* Whether the n bytes at p are all zero: a public struct's reserved tail,
 * which a caller leaves zero (docs/design.md, "Defaults and growth"). */
bool fr_all_zero(const void *p, size_t n);
#define FR_RESERVED_OK(cfg) fr_all_zero((cfg)->reserved, sizeof (cfg)->reserved)

/* ---- logging ---------------------------------------------------------- */
/* One function, a level and a subsystem tag ("engine", "tcp", ...). Lines go
 * to stderr as "2025-01-31T12:34:56.789Z ferry[pid] LEVEL tag: message"
 * (one such line per line of a message), or as one JSON object per call
 * under FERRY_LOG_FORMAT=json, or to the callback of ferry_log_set_callback.
 * Thread-safe. */
void fr_log(enum ferry_log_level level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool fr_log_on(enum ferry_log_level level);
/* Now in UTC as ISO 8601 with milliseconds, "2025-01-31T12:34:56.789Z"
 * (FR_LOG_TS_LEN characters and a NUL). 0, or -1 when the clock cannot be
 * read as a date (the text is then all zeros). */
#define FR_LOG_TS_LEN 24
int fr_log_timestamp(char out[FR_LOG_TS_LEN + 1]);
/* The n bytes of s as the inside of a JSON string: quotes, backslashes and
 * control characters escaped, bytes that are not UTF-8 as U+FFFD. out has
 * room for 6 * n bytes; returns the bytes written (no NUL). */
size_t fr_json_escape(char *out, const char *s, size_t n);
/* Bytes of the UTF-8 sequence of a character >= 0x80 at s (n bytes left):
 * 2 to 4, or 0 when it is not UTF-8 (overlong forms, surrogates and values
 * above U+10FFFF are not). */
size_t fr_utf8_seq_len(const unsigned char *s, size_t n);
#define FR_DEBUG(tag, ...) do { if (fr_log_on(FERRY_LOG_DEBUG)) fr_log(FERRY_LOG_DEBUG, tag, __VA_ARGS__); } while (0)
#define FR_INFO(tag, ...)  fr_log(FERRY_LOG_INFO, tag, __VA_ARGS__)
#define FR_WARN(tag, ...)  fr_log(FERRY_LOG_WARN, tag, __VA_ARGS__)
#define FR_ERROR(tag, ...) fr_log(FERRY_LOG_ERROR, tag, __VA_ARGS__)

/* ---- allocation ------------------------------------------------------- */
/* Thin wrappers: return NULL on failure (never abort); n*size overflow-checked. */
void *fr_malloc(size_t size);
void *fr_calloc(size_t n, size_t size);
void *fr_realloc(void *p, size_t size);
void *fr_reallocarray(void *p, size_t n, size_t size);
char *fr_strdup(const char *s);
void fr_free(void *p);
/* Warm buffers: large blocks that are freed into a per-process pool (at
 * most 256 MiB, the oldest returned to the system first) and handed out
 * again by size, so that a buffer of the same size every update is written
 * through pages its process has written before (on a VM a first write
 * through a fresh page costs ~15 us: docs/base.md, "Warm buffers"). Small
 * ones come from malloc. Free only with fr_warm_free. Under ASan: malloc. */
void *fr_warm_alloc(size_t size);
void fr_warm_free(void *p);
/* 1 when built with AddressSanitizer (gcc's macro, clang's feature test). */
#if defined(__SANITIZE_ADDRESS__)
#define FR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FR_ASAN 1
#endif
#endif
#ifndef FR_ASAN
#define FR_ASAN 0
#endif
/* Grow *v (element size esz) so it holds at least need elements; doubles capacity. */
int fr_grow(void **v, size_t *cap, size_t need, size_t esz);

/* Overflow-checked arithmetic: return FERRY_ERANGE on overflow. */
static inline int fr_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{ return __builtin_add_overflow(a, b, out) ? FERRY_ERANGE : 0; }
static inline int fr_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{ return __builtin_mul_overflow(a, b, out) ? FERRY_ERANGE : 0; }

/* ---- dtype conversion: f32, bf16, f16 (convert.c) ------------------------ */
/* The scalar reference of every conversion, one element at a time. The bulk
 * paths of fr_convert are checked bit for bit against these. */

/* f32 bits -> bf16, to nearest, ties to even (an overflow carries into the
 * infinity); NaNs stay NaNs, made quiet, sign kept. */
static inline uint16_t fr_bf16_from_f32_bits(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* bf16 -> f32 bits: exact. */
static inline uint32_t fr_bf16_to_f32_bits(uint16_t h) { return (uint32_t)h << 16; }

/* f32 bits -> f16, to nearest, ties to even: beyond f16's range (|x| that
 * rounds to 65536 or more) an infinity; f16 subnormals produced exactly;
 * NaNs stay NaNs (made quiet, sign and the top payload bits kept). */
static inline uint16_t fr_f16_from_f32_bits(uint32_t u)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x1ffu);   /* quiet NaN */
    if (a >= 0x477ff000u)                     /* rounds to >= 65536: infinity */
        return sign | 0x7c00u;
    if (a < 0x38800000u) {                    /* below 2^-14: f16 subnormal or zero */
        if (a < 0x33000000u)                  /* at most half the smallest subnormal */
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

/* f16 -> f32 bits: exact, subnormals included; a NaN keeps its payload bit
 * for bit (a signalling one stays signalling). */
static inline uint32_t fr_f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return sign | 0x7f800000u | (m << 13);
    if (e != 0)
        return sign | ((e + 112) << 23) | (m << 13);
    if (m == 0)
        return sign;
    uint32_t sh = 0;                          /* subnormal: normalise */
    while (!(m & 0x400u)) {
        m <<= 1;
        sh++;
    }
    return sign | ((113 - sh) << 23) | ((m & 0x3ffu) << 13);
}

/* The element types fr_convert handles; 0 for any other dtype name. */
typedef enum fr_ftype { FR_FT_NONE = 0, FR_FT_F32, FR_FT_BF16, FR_FT_F16 } fr_ftype;
fr_ftype fr_ftype_of(const char *dtype);

/* One element of type t (not FR_FT_NONE) at p, no alignment needed: read
 * as f32, or written from f32 with the rounding above. For code that
 * touches scattered elements; runs of them go through fr_convert. */
static inline float fr_elem_load_f32(const void *p, fr_ftype t)
{
    uint32_t u;
    if (t == FR_FT_F32) {
        memcpy(&u, p, 4);
    } else {
        uint16_t h;
        memcpy(&h, p, 2);
        u = t == FR_FT_BF16 ? fr_bf16_to_f32_bits(h) : fr_f16_to_f32_bits(h);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void fr_elem_store_f32(void *p, fr_ftype t, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (t == FR_FT_F32) {
        memcpy(p, &u, 4);
        return;
    }
    uint16_t h = t == FR_FT_BF16 ? fr_bf16_from_f32_bits(u) : fr_f16_from_f32_bits(u);
    memcpy(p, &h, 2);
}

/* Implementations of the bulk conversion. FR_CONV_AUTO picks the fastest
 * the CPU runs (AVX-512, then AVX2 + F16C, then portable); the others exist
 * so that tests and `ferry bench weights` can run each one. */
typedef enum fr_conv_path {
    FR_CONV_AUTO = 0,
    FR_CONV_SCALAR,      /* the reference above, one element at a time */
    FR_CONV_PORTABLE,    /* branch-free C the compiler vectorises */
    FR_CONV_AVX2,        /* x86-64: AVX2 + F16C */
    FR_CONV_AVX512,      /* x86-64: AVX-512 F + BW */
    FR_CONV_NPATHS
} fr_conv_path;
/* Whether this build and CPU can run a path (FR_CONV_AUTO always). */
bool fr_conv_path_available(fr_conv_path path);
/* "auto", "scalar", "portable", "avx2", "avx512"; "?" for another value. */
const char *fr_conv_path_name(fr_conv_path path);
/* The path FR_CONV_AUTO resolves to on this CPU. */
fr_conv_path fr_conv_path_best(void);

/* Convert count elements from src (type st) to dst (type dt): any pair; the
 * same type copies (memmove). Results are identical, bit for bit, on every
 * path and independent of the FPU's rounding mode and flush-to-zero state.
 * No alignment needed; src and dst must not overlap unless equal with equal
 * types. FERRY_EINVAL for FR_FT_NONE, NULL buffers with count > 0 or an
 * unknown path; FERRY_ENOTSUP for a path this CPU cannot run. */
int fr_convert(const void *src, fr_ftype st, void *dst, fr_ftype dt, size_t count);
int fr_convert_path(fr_conv_path path, const void *src, fr_ftype st, void *dst, fr_ftype dt,
                    size_t count);

/* ---- bitwise difference (diff.c, diff_x86.c) ---------------------------- */

/* The positions i in [0, n) where element i of a and of b (esize bytes
 * each: 2 or 4; no alignment needed) differ bit for bit, ascending, into
 * idx (room for n); returns how many. n < 2^32. Every path gives the same
 * output: FR_CONV_SCALAR compares element by element (the reference),
 * FR_CONV_PORTABLE skips equal 8-byte words, FR_CONV_AVX2 / AVX512 (where
 * available; AVX512 runs the AVX2 kernel) 128 bytes at a time; AUTO the
 * best. An esize other than 2 or 4, or a path this CPU lacks: 0 and
 * nothing written (callers check the path with fr_conv_path_available). */
size_t fr_diff_path(fr_conv_path path, const void *a, const void *b, size_t esize, size_t n,
                    uint32_t *idx);

/* ---- FP8 quantization (fp8.c) ------------------------------------------ */
/* One FP8 format, as the rounding needs it (common.h, "FP8 quantization"). */
typedef struct fr_fp8_fmt {
    uint32_t man;        /* mantissa bits: 3 (E4M3), 2 (E5M2) */
    uint32_t norm_off;   /* (127 - bias) << 23: f32 bits minus this, >> (23 - man), is the code */
    uint32_t min_norm;   /* f32 bits of the smallest normal */
    uint32_t sub_base;   /* 151 - bias - man: a subnormal's shift is sub_base - f32 exponent */
    uint32_t max_bits;   /* f32 bits of the largest finite */
    uint32_t max_code;   /* its code: 0x7e, 0x7b */
    uint32_t sub_magic;  /* f32 bits of 2^(23 + log2 of the smallest subnormal) */
    float max;           /* 448, 57344 */
} fr_fp8_fmt;

extern const fr_fp8_fmt fr_fp8_e4m3, fr_fp8_e5m2;
/* The format of a dtype name ("f8e4m3", "f8e5m2" and the fp8_ aliases), or NULL. */
const fr_fp8_fmt *fr_fp8_fmt_of(const char *dtype);

/* The scalar reference: f32 bits -> FP8, once to nearest, ties to even,
 * saturating to +-largest (infinities too), NaN -> sign | 0x7f. */
static inline uint8_t fr_fp8_from_f32_bits(uint32_t u, const fr_fp8_fmt *f)
{
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7fu;
    if (a >= f->max_bits)
        return sign | (uint8_t)f->max_code;
    uint32_t q, rem, half;
    if (a >= f->min_norm) {
        uint32_t v = a - f->norm_off, sh = 23 - f->man;
        q = v >> sh, rem = v & ((1u << sh) - 1), half = 1u << (sh - 1);
    } else {
        uint32_t sh = f->sub_base - (a >> 23);  /* value / smallest subnormal = m >> sh */
        if (a < 0x00800000u || sh > 25)         /* below a quarter of the smallest subnormal */
            return sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    }
    if (rem > half || (rem == half && (q & 1u)))
        q++;                                    /* may carry into the exponent: still right */
    return sign | (uint8_t)q;
}

/* FP8 -> f32, exact (the NaN codes give a quiet NaN with their sign). */
float fr_fp8_to_f32(uint8_t q, const fr_fp8_fmt *f);

/* ferry_quantize_fp8 on one path (fr_conv_path: scalar is the reference,
 * portable runs it too; avx2, avx512), for tests and the bench. mul is
 * 1/scale. FERRY_ENOTSUP for a path this CPU cannot run. */
int fr_quantize_fp8_path(fr_conv_path path, const void *src, fr_ftype st, uint8_t *dst,
                         const fr_fp8_fmt *f, size_t count, float mul);
/* The block scale of amax (f32 bits of the largest finite |x|) as
 * ferry_quantize_fp8_blocks computes it. */
float fr_fp8_block_scale(uint32_t amax_bits, const fr_fp8_fmt *f, int scale_format);
/* The f32 bits of the largest finite |x| of n elements of type st on a path. */
int fr_fp8_amax_path(fr_conv_path path, const void *src, fr_ftype st, size_t count,
                     uint32_t *amax_bits);

/* Block quantization of a region that lies anywhere in a tensor's block
 * grid (a trainer's shard, whose boundaries may cut blocks): the region's
 * first element is element (row0, col0) of the tensor; blocks are
 * block[0] x block[1] from the tensor's origin. Grids are indexed from the
 * block holding the region's first element: grid[(r / B0 - row0 / B0) *
 * grid_stride + (c / B1 - col0 / B1)] for tensor element (r, c). Strides
 * in elements (src) and bytes (dst: one per FP8 element).
 * fr_fp8_region_amax: the largest finite |x| (f32 bits) of the region's
 * part of each block, max-ed into amax (which the caller zeroes).
 * fr_fp8_region_quant: every element with its block's scale (the
 * dequantization multiplier), as ferry_quantize_fp8 computes it: the same
 * bytes a whole-tensor ferry_quantize_fp8_blocks gives when the scales are
 * the whole blocks'. No checks: the callers check their arguments. */
void fr_fp8_region_amax(const void *src, fr_ftype st, size_t src_stride, size_t rows,
                        size_t cols, uint64_t row0, uint64_t col0, const uint32_t block[2],
                        uint32_t *amax, size_t grid_stride);
void fr_fp8_region_quant(const void *src, fr_ftype st, size_t src_stride, uint8_t *dst,
                         size_t dst_stride, size_t rows, size_t cols, uint64_t row0,
                         uint64_t col0, const uint32_t block[2], const float *scales,
                         size_t grid_stride, const fr_fp8_fmt *f);

/* ---- time ------------------------------------------------------------- */
uint64_t fr_now_ns(void);             /* CLOCK_MONOTONIC */
uint64_t fr_now_ms(void);
/* Minor page faults this process has taken so far (getrusage: every
 * thread's); the difference around a call is what the call cost in first
 * touches of memory or of mappings (docs/weights.md, "Warm memory"). */
uint64_t fr_minor_faults(void);
/* Deadline helpers. timeout_ms < 0 means "forever" (deadline UINT64_MAX). */
uint64_t fr_deadline_ns(int64_t timeout_ms);
/* Milliseconds left before deadline (ns), rounded up, for poll and
 * timeouts in ms: -1 for UINT64_MAX (forever), 0 once it has passed. */
int fr_ms_left(uint64_t deadline_ns);
/* Absolute CLOCK_MONOTONIC timespec for pthread_cond_timedwait on a condvar
 * created with fr_cond_init_monotonic. */
struct timespec fr_timespec_at(uint64_t deadline_ns);
int fr_cond_init_monotonic(pthread_cond_t *cond);

/* ---- randomness (libsodium) ------------------------------------------- */
void fr_random_bytes(void *buf, size_t n);
/* Uniform over [2, UINT64_MAX]: never 0 or 1, which callers reserve as
 * special key values. */
uint64_t fr_random_u64(void);

/* ---- hashing (XXH3) --------------------------------------------------- */
uint64_t fr_hash64(const void *data, size_t len, uint64_t seed);
typedef struct { uint8_t b[16]; } fr_hash128_t;
fr_hash128_t fr_hash128(const void *data, size_t len, uint64_t seed);
/* Streaming 128-bit hash for canonical encodings built piecewise. */
typedef struct fr_hasher fr_hasher;
fr_hasher *fr_hasher_new(uint64_t seed);
void fr_hasher_update(fr_hasher *h, const void *data, size_t len);
fr_hash128_t fr_hasher_digest(const fr_hasher *h);
void fr_hasher_free(fr_hasher *h);
/* Lower-case hex of a 128-bit digest: 32 chars + NUL. */
void fr_hash128_hex(fr_hash128_t h, char out[33]);

/* ---- JSON (jansson) ----------------------------------------------------- */
/* Load/parse with an error message (file:line:col: text) into err (may be NULL). */
int fr_json_load_file(const char *path, json_t **out, char *err, size_t errlen);
int fr_json_parse(const char *text, size_t len, json_t **out, char *err, size_t errlen);
/* Canonical dump: sorted keys, compact; caller frees with free(). */
char *fr_json_dump_canonical(const json_t *j);
int fr_json_write_file(const char *path, const json_t *j);   /* atomic: tmp + rename */
/* Typed getters that fail with FERRY_EINVAL and a message on missing/wrong type. */
int fr_json_get_u64(const json_t *obj, const char *key, uint64_t *out, char *err, size_t errlen);
int fr_json_get_str(const json_t *obj, const char *key, const char **out, char *err, size_t errlen);

#endif
