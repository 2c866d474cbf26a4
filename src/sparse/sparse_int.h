/* sparse layer internals shared by object.c (put, admission, the index
 * read), sparse_plan.c (the pure batch planner), sparse_reader.c (the
 * reader and its index cache) and exec.c (ranged reads, filtering,
 * rebasing, apply). Internal names are fr_sp_ / fr_sparse_. */
#ifndef FR_SPARSE_INT_H
#define FR_SPARSE_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>

#include "ferry/reshard.h"
#include "ferry/sparse.h"

/* Frees what the planner keeps in ferry_sparse_index.aux (its lazily built
 * secondary indexes). NULL ok. Implemented by sparse_plan.c; called by
 * ferry_sparse_index_free (object.c). */
void fr_sparse_aux_free(void *aux);

/* The "meta" member: the descriptor as JSON. Encode: *out is a NUL-
 * terminated string (free()), *len its length without the NUL. Decode:
 * parses and checks every field (schema "ferry.sparse_object", ndim 1..8,
 * shape and tile entries > 0, base < delta, dtypes known, placement kind
 * and axis) — the decoder of bytes that come from the store, fuzzed by
 * tests/fuzz/fuzz_sparse_meta.c. FERRY_EPROTO with a sentence on anything
 * malformed. Implemented in object.c. */
int fr_sparse_meta_encode(const ferry_sparse_desc *d, char **out, size_t *len);
int fr_sparse_meta_decode(const char *text, size_t len, ferry_sparse_desc *out, ferry_error *err);

/* "ferry/sp/<tensor>/<base %020>-<delta %020>/<placement>" where placement
 * renders as "rep" / "rep-<axis>" / "own-<axis>-<owner>". Returns the
 * length, FERRY_EMSGSIZE when cap is too small. Implemented in object.c. */
int fr_sparse_key(const ferry_sparse_desc *d, char *buf, size_t cap);

/* ferry_sparse_index_read that also returns the "indices" and "values"
 * member descriptions (offsets for ranged reads; either may be NULL).
 * Implemented in object.c. */
int fr_sparse_index_load(ferry_store *s, const char *key, ferry_sparse_index *out,
                         ferry_member *indices, ferry_member *values, ferry_error *err);
/* fr_sparse_index_load of n keys at once: one batch of member tables
 * (ferry_store_batch_get_members), then one batch of every object's index
 * ranges. rcs[i]: 0 with out[i] (and mi[i], mv[i] when not NULL) set, or
 * that key's error, without its sentence (fr_sparse_index_load of that
 * key gives it). Returns 0, or FERRY_ENOMEM with every rcs[i] that. */
int fr_sparse_index_load_many(ferry_store *s, const char *const *keys, size_t n,
                              ferry_sparse_index *out, ferry_member *mi, ferry_member *mv,
                              int *rcs);

/* ---- the reader's index cache (sparse_reader.c) ------------------------------------------ */

/* One source object's compact index as a read uses it, and as the
 * reader's cache keeps it between reads. */
typedef struct fr_sp_entry {
    uint64_t size, segment, offset;   /* the object's identity when its index was read */
    ferry_member mi, mv;              /* its indices and values members */
    ferry_sparse_index ix;            /* ix.key: the object's key */
    uint64_t bytes;                   /* what it counts against the cache's bound */
} fr_sp_entry;

/* The entry of key whose object still has od's size and first replica
 * (moved out of the cache into *out: the caller owns it until
 * fr_sp_cache_put), or false. An entry of key that no longer matches is
 * freed. r NULL: false. */
bool fr_sp_cache_take(ferry_sparse_reader *r, const char *key, const ferry_object_desc *od,
                      fr_sp_entry *out);
/* Give e back to the cache (least recently used entries out to make room),
 * or free it when it cannot be kept (larger than the bound, another read
 * put the key back first, r NULL). e is the cache's or freed after. */
void fr_sp_cache_put(ferry_sparse_reader *r, fr_sp_entry *e);
/* The store the reader reads from. */
ferry_store *fr_sp_reader_store(const ferry_sparse_reader *r);
/* ferry_sparse_reader_config with its 0 fields set to the init's values. */
void fr_sparse_reader_config_resolve(ferry_sparse_reader_config *cfg);

/* Bytes of one element of a value dtype ("f32" 4, "bf16"/"f16" 2) or of an
 * index dtype ("i32" 4, "i64" 8); 0 for anything else. */
static inline size_t fr_sp_value_size(const char *dt)
{
    if (!dt) return 0;
    if (dt[0] == 'f' && dt[1] == '3' && dt[2] == '2' && !dt[3]) return 4;
    if (dt[0] == 'f' && dt[1] == '1' && dt[2] == '6' && !dt[3]) return 2;
    if (dt[0] == 'b' && dt[1] == 'f' && dt[2] == '1' && dt[3] == '6' && !dt[4]) return 2;
    return 0;
}
static inline size_t fr_sp_index_size(const char *dt)
{
    if (!dt || dt[0] != 'i') return 0;
    if (dt[1] == '3' && dt[2] == '2' && !dt[3]) return 4;
    if (dt[1] == '6' && dt[2] == '4' && !dt[3]) return 8;
    return 0;
}

/* Coordinate k of entry i in an nnz x ndim index array of isz-byte (4: i32,
 * 8: i64) integers; unaligned buffers are fine. */
static inline int64_t fr_sp_coord(const void *indices, size_t isz, uint64_t i, uint32_t ndim,
                                  uint32_t k)
{
    const uint8_t *p = (const uint8_t *)indices + (i * ndim + k) * isz;
    if (isz == 4) {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

#endif
