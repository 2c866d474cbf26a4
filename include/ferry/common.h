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

/* Bytes per element of a dtype name ("bool", "u8", "i8", "fp8_e4m3",
 * "fp8_e5m2", "f16", "bf16", "i16", "u16", "f32", "i32", "u32", "f64", "i64",
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

#ifdef __cplusplus
}
#endif
#endif
