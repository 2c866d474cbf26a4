/* ferry — error codes, logging control and version shared by every layer. */
#ifndef FERRY_COMMON_H
#define FERRY_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public API: the library is built with -fvisibility=hidden, so
 * only what a header declares FERRY_API is exported (with the linker's
 * version script, src/libferry.map, as the second fence). */
#if defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 3
#define FERRY_VERSION_PATCH 0

/*
 * Every ferry function that can fail returns int: 0 (or a non-negative
 * count) on success, a negative FERRY_E* code on failure. Codes that have an
 * errno equivalent are that errno, negated; ferry's own codes sit above
 * FERRY_EBASE so they never collide with errno values.
 */
#define FERRY_EINVAL     (-EINVAL)     /* bad argument or malformed input */
#define FERRY_ENOMEM     (-ENOMEM)     /* out of memory */
#define FERRY_EAGAIN     (-EAGAIN)     /* would block (window full, queue full) */
#define FERRY_EBUSY      (-EBUSY)      /* resource pinned by an in-flight or UNKNOWN transfer */
#define FERRY_ETIMEDOUT  (-ETIMEDOUT)  /* deadline passed */
#define FERRY_ENOENT     (-ENOENT)     /* no such object, key, peer or region */
#define FERRY_EEXIST     (-EEXIST)     /* already exists */
#define FERRY_ENOSPC     (-ENOSPC)     /* no room */
#define FERRY_EACCES     (-EACCES)     /* refused: wrong remote key or access not allowed */
#define FERRY_EFAULT     (-EFAULT)     /* address outside a registered region */
#define FERRY_ECONNRESET (-ECONNRESET) /* peer connection lost */
#define FERRY_ECONNREFUSED (-ECONNREFUSED) /* peer not listening */
#define FERRY_EIO        (-EIO)        /* I/O failed */
#define FERRY_EPROTO     (-EPROTO)     /* protocol violation / corrupt frame */
#define FERRY_EMSGSIZE   (-EMSGSIZE)   /* frame or request exceeds a hard limit */
#define FERRY_ERANGE     (-ERANGE)     /* arithmetic overflow or value out of range */
#define FERRY_ESTALE     (-ESTALE)     /* descriptor belongs to a previous instance of the peer */
#define FERRY_ENOTSUP    (-ENOTSUP)    /* not supported by this build or transport */
#define FERRY_ECANCELED  (-ECANCELED)  /* cancelled (engine closing, peer reset) */
#define FERRY_EUNREACH   (-EHOSTUNREACH) /* node unreachable (suspect or reconnecting): its objects are kept */

#define FERRY_EBASE      4096
#define FERRY_EAUTH      (-(FERRY_EBASE + 1)) /* authentication with the cluster token failed */
#define FERRY_EFENCED    (-(FERRY_EBASE + 2)) /* peer fenced: a transfer to it has an UNKNOWN outcome */
#define FERRY_ECORRUPT   (-(FERRY_EBASE + 3)) /* checksum mismatch */
#define FERRY_ESTATE     (-(FERRY_EBASE + 4)) /* call not valid in the object's current state */
#define FERRY_ELOST      (-(FERRY_EBASE + 5)) /* every replica of the object is gone */
#define FERRY_EREBUILD   (-(FERRY_EBASE + 6)) /* partial apply: parameters must be rebuilt */
#define FERRY_ELAST      (-(FERRY_EBASE + 6))

/* Why a call failed, for every call that can fail on bad input or a peer:
 * the code it returned and a sentence naming what failed (the tensor, the
 * fragment, the key, the peer). Callers pass a ferry_error * (or NULL, to
 * take only the code); the message may be read right after the call. */
typedef struct ferry_error {
    int code;          /* the negative code that was returned */
    char msg[512];     /* what failed, naming tensor and fragment */
} ferry_error;

/* The default of every config's timeout_ms (barriers, notifications, one
 * batch's wait): one minute. Each config's *_config_init() sets it. */
#define FERRY_DEFAULT_TIMEOUT_MS 60000

/* A static, human-readable text for any code (or "unknown error N"). Never NULL. */
FERRY_API const char *ferry_strerror(int code);

/* Logging goes to stderr (or to a callback: ferry_log_set_callback); a
 * library never prints to stdout. Level comes from
 * FERRY_LOG=debug|info|warn|error|off (default warn) and can be overridden
 * at run time. Every line on stderr carries the time (UTC, ISO 8601 with
 * milliseconds), the level, the subsystem and the pid:
 *   2025-01-31T12:34:56.789Z ferry[1234] WARN master: message
 * (docs/operations.md, "Logs"). */
enum ferry_log_level {
    FERRY_LOG_DEBUG = 0,
    FERRY_LOG_INFO = 1,
    FERRY_LOG_WARN = 2,
    FERRY_LOG_ERROR = 3,
    FERRY_LOG_OFF = 4,
};
FERRY_API void ferry_log_set_level(enum ferry_log_level level);
FERRY_API enum ferry_log_level ferry_log_get_level(void);
/* The form of lines on stderr: FERRY_LOG_TEXT as above, or FERRY_LOG_JSON,
 * one object per line:
 *   {"ts":"2025-01-31T12:34:56.789Z","level":"warn","subsystem":"master",
 *    "pid":1234,"msg":"message"}
 * (strings escaped, bytes that are not UTF-8 as U+FFFD). The default comes
 * from FERRY_LOG_FORMAT=text|json (text when unset or unrecognised).
 * Process-wide, like the level. */
enum ferry_log_format {
    FERRY_LOG_TEXT = 0,
    FERRY_LOG_JSON = 1,
};
FERRY_API void ferry_log_set_format(enum ferry_log_format format);
FERRY_API enum ferry_log_format ferry_log_get_format(void);
/* Where log lines go instead of stderr: fn(arg, level, tag, msg) is called
 * on the thread that logs, for each line at or above the level, with the
 * subsystem tag and the message without the time, pid and level or a
 * trailing newline (both strings valid only during the call); the format
 * does not apply. fn must return quickly and must not call into ferry.
 * NULL fn restores stderr. Process-wide, like the level; a line logged on
 * another thread while this runs may still reach the previous callback. */
typedef void (*ferry_log_fn)(void *arg, enum ferry_log_level level, const char *tag, const char *msg);
FERRY_API void ferry_log_set_callback(ferry_log_fn fn, void *arg);

/* Bytes per element of a dtype name ("bool", "u8", "i8", "f8e4m3",
 * "f8e5m2" (or "fp8_e4m3", "fp8_e5m2"), "f16", "bf16", "i16", "u16", "f32", "i32", "u32", "f64", "i64",
 * "u64"), or 0 for an unknown one. */
FERRY_API uint32_t ferry_dtype_size(const char *dtype);

/* Convert count elements between "f32", "bf16" and "f16" (any pair; the
 * same dtype copies). Widening is exact, bit for bit (a NaN keeps its
 * payload). Narrowing rounds to nearest, ties to even, once (bf16 <-> f16
 * goes through f32, which holds both exactly); values beyond the target's
 * range become infinities; NaNs stay NaNs (made quiet, sign kept); f16
 * subnormals are produced and read exactly. The result does not depend on
 * the FPU's rounding mode or flush-to-zero state. Vectorised (AVX-512 or
 * AVX2 + F16C chosen at run time, generic SIMD elsewhere); no alignment
 * needed. src and dst must not overlap unless equal with equal dtypes.
 * FERRY_EINVAL for another dtype, or NULL buffers with count > 0. */
FERRY_API int ferry_convert(const void *src, const char *src_dtype, void *dst, const char *dst_dtype,
                            size_t count);

/* ---- FP8 quantization ----------------------------------------------------------------------
 * The two FP8 formats of weight checkpoints, as dtype names:
 *   "f8e4m3"  OCP E4M3 "fn": bias 7, no infinities, largest 448 (0x7e), NaN 0x7f/0xff,
 *             smallest subnormal 2^-9;
 *   "f8e5m2"  E5M2: bias 15, largest finite 57344 (0x7b), NaN written as 0x7f/0xff,
 *             smallest subnormal 2^-16 (its infinities are never written: values beyond
 *             the largest finite saturate, as in E4M3).
 * "fp8_e4m3" and "fp8_e5m2" are accepted as the same types.
 *
 * Quantizing element x with scale s (the dequantization multiplier, what
 * checkpoints store as weight_scale_inv: x ~ q * s) computes, in f32 and in
 * the FPU's default round-to-nearest mode,
 *     m = 1.0f / s;  p = (float)x * m;  q = fp8(p)
 * where fp8() rounds p once to the nearest FP8 value, ties to even
 * (subnormals exactly), saturates every |p| beyond the largest finite
 * (infinities too) to +-largest, and makes a NaN the FP8 NaN with its sign.
 * The sign of a zero is kept. Every path (portable, AVX2, AVX-512, chosen
 * at run time) gives the same bytes. docs/weights.md, "FP8 quantization". */

/* Quantize count elements of src ("f32", "bf16" or "f16") into dst
 * ("f8e4m3" or "f8e5m2") with one scale as above; scale must be finite with
 * 1/scale a finite, normal f32 (about 3e-39 < scale < 8.5e37). No alignment
 * needed; src and dst must not overlap. FERRY_EINVAL with a sentence in err
 * for an unknown dtype, a bad scale or NULL buffers with count > 0; nothing
 * is written then. */
FERRY_API int ferry_quantize_fp8(const void *src, const char *src_dtype, void *dst,
                                 const char *dst_dtype, size_t count, float scale,
                                 ferry_error *err);

/* Inverse of ferry_quantize_fp8 for consumers and tests that ask for it:
 * y = (float)q * scale in f32, then written as dst_dtype ("f32", "bf16" or
 * "f16", narrowing as ferry_convert does); the FP8 NaN gives a NaN. Not
 * vectorised. Same failures as ferry_quantize_fp8 (any finite scale > 0). */
FERRY_API int ferry_dequantize_fp8(const void *src, const char *src_dtype, void *dst,
                                   const char *dst_dtype, size_t count, float scale,
                                   ferry_error *err);

/* How a block's scale is stored. */
enum ferry_fp8_scale_format {
    FERRY_FP8_SCALE_F32 = 0,    /* s = amax / FP8_MAX as an f32 (DeepSeek-V3's weight_scale_inv) */
    FERRY_FP8_SCALE_UE8M0 = 1,  /* s rounded up to a power of two, 2^ceil(log2(amax / FP8_MAX)),
                                 * still stored as an f32 (its exponent byte is the ue8m0 code) */
};

/* The block layout of ferry_quantize_fp8_blocks. ferry_fp8_options_init()
 * sets the defaults; a zeroed struct (or NULL) is taken as the defaults too:
 * 0 block sizes are 128, the scale format FERRY_FP8_SCALE_F32. The reserved
 * words must be zero. */
typedef struct ferry_fp8_options {
    uint32_t block_rows;     /* rows of a block (default 128) */
    uint32_t block_cols;     /* columns of a block (default 128) */
    uint32_t scale_format;   /* enum ferry_fp8_scale_format */
    uint32_t reserved32;     /* must be zero */
    uint64_t reserved[6];    /* must be zero */
} ferry_fp8_options;

#define FERRY_FP8_DEFAULT_BLOCK 128

FERRY_API void ferry_fp8_options_init(ferry_fp8_options *opt);

/* Quantize a rows x cols row-major region of src (src_stride elements from
 * one row's start to the next, >= cols) into dst (dst_stride, >= cols) in
 * blocks of block_rows x block_cols (the last row and column of blocks may
 * be partial), one scale per block: amax = the largest finite |x| of the
 * block (NaNs and infinities left out), max(amax, 1e-4f) (a block of zeros
 * gets 1e-4f / FP8_MAX, as DeepSeek's and vLLM's per-block casts do),
 * s = that / FP8_MAX (448 or 57344) in f32, rounded up to a power of two
 * for FERRY_FP8_SCALE_UE8M0; every element is then quantized with s as
 * ferry_quantize_fp8 does (NaN stays NaN, an infinity saturates). scales
 * receives ceil(rows / block_rows) x ceil(cols / block_cols) f32s, row-major,
 * contiguous. FERRY_EINVAL with a sentence for an unknown dtype, a stride
 * below cols, NULL buffers with elements, an unknown scale format or
 * nonzero reserved words; nothing is written then. */
FERRY_API int ferry_quantize_fp8_blocks(const void *src, const char *src_dtype, size_t src_stride,
                                        void *dst, const char *dst_dtype, size_t dst_stride,
                                        size_t rows, size_t cols, float *scales,
                                        const ferry_fp8_options *opt, ferry_error *err);

/* Inverse of ferry_quantize_fp8_blocks, each block with its scale (the
 * layout above) as ferry_dequantize_fp8 does. Same failures, and a scale
 * that is not finite and > 0. */
FERRY_API int ferry_dequantize_fp8_blocks(const void *src, const char *src_dtype,
                                          size_t src_stride, void *dst, const char *dst_dtype,
                                          size_t dst_stride, size_t rows, size_t cols,
                                          const float *scales, const ferry_fp8_options *opt,
                                          ferry_error *err);

#ifdef __cplusplus
}
#endif
#endif
