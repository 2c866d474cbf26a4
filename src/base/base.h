/* base layer: internal helpers every other layer uses. Depends on nothing
 * but libc, libxxhash, libsodium and jansson. Internal names are fr_. */
#ifndef FR_BASE_H
#define FR_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <pthread.h>

#include <jansson.h>

#include "ferry/common.h"

/* ---- logging ---------------------------------------------------------- */
/* One function, a level and a subsystem tag ("engine", "tcp", ...). Lines go
 * to stderr as "ferry[pid] LEVEL tag: message". Thread-safe. */
void fr_log(enum ferry_log_level level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool fr_log_on(enum ferry_log_level level);
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
/* Grow *v (element size esz) so it holds at least need elements; doubles capacity. */
int fr_grow(void **v, size_t *cap, size_t need, size_t esz);

/* Overflow-checked arithmetic: return FERRY_ERANGE on overflow. */
static inline int fr_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{ return __builtin_add_overflow(a, b, out) ? FERRY_ERANGE : 0; }
static inline int fr_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{ return __builtin_mul_overflow(a, b, out) ? FERRY_ERANGE : 0; }

/* ---- bf16 --------------------------------------------------------------- */
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

/* ---- time ------------------------------------------------------------- */
uint64_t fr_now_ns(void);             /* CLOCK_MONOTONIC */
uint64_t fr_now_ms(void);
/* Deadline helpers. timeout_ms < 0 means "forever" (deadline UINT64_MAX). */
uint64_t fr_deadline_ns(int64_t timeout_ms);
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

/* ---- interval sets ---------------------------------------------------- */
/* Half-open [start, end) byte intervals. An fr_iset is kept sorted, disjoint
 * and coalesced (adjacent intervals merged). */
typedef struct { uint64_t start, end; } fr_interval;
typedef struct { fr_interval *v; size_t n, cap; } fr_iset;
void fr_iset_init(fr_iset *s);
void fr_iset_free(fr_iset *s);
void fr_iset_clear(fr_iset *s);
int fr_iset_insert(fr_iset *s, uint64_t start, uint64_t end);     /* union in one interval */
int fr_iset_union(fr_iset *dst, const fr_iset *src);
int fr_iset_subtract(fr_iset *s, uint64_t start, uint64_t end);   /* remove [start,end) */
int fr_iset_subtract_set(fr_iset *dst, const fr_iset *src);
int fr_iset_intersect(fr_iset *out, const fr_iset *a, const fr_iset *b);
bool fr_iset_contains(const fr_iset *s, uint64_t start, uint64_t end); /* fully covered? */
bool fr_iset_overlaps(const fr_iset *s, uint64_t start, uint64_t end);
uint64_t fr_iset_total(const fr_iset *s);                         /* sum of lengths */

/* Partition: given n tagged, possibly overlapping intervals, produce the
 * disjoint pieces of their union, each with the tags of the inputs covering
 * it (tags sorted ascending). Pieces are sorted by start; two adjacent pieces
 * with the same tag set are merged. Caller frees with fr_partition_free.
 * Runs in O(n log n + output). */
typedef struct { uint64_t start, end; uint64_t tag; } fr_tagged_interval;
typedef struct { uint64_t start, end; uint32_t ntags; uint64_t *tags; } fr_piece;
typedef struct { fr_piece *pieces; size_t n; uint64_t *tag_storage; } fr_partition;
int fr_partition_build(const fr_tagged_interval *in, size_t n, fr_partition *out);
void fr_partition_free(fr_partition *p);

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
