/* ferry sparse COO weight deltas (docs/sparse.md): one structured object
 * per logical tensor update, a compact tile index, an address-free planner
 * that reads only the index, ranged reads of the entries each target box
 * needs (read once per node), boundary filtering, rebasing to target-local
 * coordinates, and scatter apply with a base-generation fence.
 *
 * Object (a structured object, ferry_store_put_struct), key
 *   "ferry/sp/<tensor_id>/<base, 20 digits>-<delta, 20 digits>/<placement>"
 * with members
 *   "meta"        u8[n]          the descriptor as JSON (ferry_sparse_desc)
 *   "tile_coords" i64[ntiles, ndim]   tile coordinates (element // tile), ascending
 *   "tile_ptr"    i64[ntiles + 1]     entries of tile i: [tile_ptr[i], tile_ptr[i+1])
 *   "indices"     i32|i64[nnz, ndim]  global element coordinates
 *   "values"      f32|bf16|f16[nnz]
 * Entries are sorted by (tile coordinate, element coordinate), row-major
 * order of each; indices and values share entry offsets, so rows
 * [start, end) of both are one logical range. */
#ifndef FERRY_SPARSE_H
#define FERRY_SPARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"
#include "ferry/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_SPARSE_NDIM_MAX 8
#define FERRY_SPARSE_ID_MAX 200

enum ferry_sparse_apply {
    FERRY_SPARSE_SCATTER_ADD = 0,   /* values are deltas: dst += v */
    FERRY_SPARSE_SCATTER_SET = 1,   /* values are exact new values: dst = v */
};

/* Source placement of a logical weight over a named placement axis
 * (e.g. "ep"): OWNER — the object belongs to one index of the axis (an EP
 * expert: only targets with that index read it); REPLICATE — every index
 * reads it (a non-EP/shared weight). */
enum ferry_sparse_placement_kind { FERRY_SPARSE_REPLICATE = 0, FERRY_SPARSE_OWNER = 1 };
typedef struct ferry_sparse_placement {
    enum ferry_sparse_placement_kind kind;
    char axis[16];            /* "" for REPLICATE over nothing */
    uint32_t owner;           /* OWNER: the axis index owning the object */
} ferry_sparse_placement;

/* Duplicate coordinates in one put: FERRY_SPARSE_SCATTER_ADD sums them
 * (in float32, then converted), FERRY_SPARSE_SCATTER_SET refuses them
 * (FERRY_EINVAL naming the coordinate) — documented in docs/sparse.md. */
typedef struct ferry_sparse_desc {
    char tensor_id[FERRY_SPARSE_ID_MAX + 1];
    uint32_t ndim;
    uint64_t shape[FERRY_SPARSE_NDIM_MAX];      /* global shape */
    uint64_t base_generation, delta_generation; /* base < delta */
    ferry_sparse_placement placement;
    uint64_t tile[FERRY_SPARSE_NDIM_MAX];       /* tile shape; all 0 on put: chosen from shape */
    enum ferry_sparse_apply apply;
    char index_dtype[8];                        /* "i32" or "i64" */
    char value_dtype[8];                        /* "f32", "bf16" or "f16" */
    uint64_t nnz;                               /* after duplicate handling */
    uint64_t ntiles;                            /* non-empty tiles */
} ferry_sparse_desc;

/* ---- put ------------------------------------------------------------------------- */

/* Validate (every index inside shape, dtypes, nnz > 0 consistent with the
 * arrays, base < delta, ndim 1..8), sort, build the tile index and store one
 * structured object (hard-pinned, one replica). indices: nnz x ndim of
 * index_dtype, global coordinates; values: nnz of value_dtype. d->nnz is
 * the input count; d->tile all 0 picks a tile shape (docs/sparse.md); on
 * success *out (may be NULL) is the stored descriptor (nnz after duplicates,
 * ntiles, the tile shape) and key (may be NULL) the object's key.
 * Idempotent per logical key (tensor, base, delta, placement): putting the
 * same logical key again returns FERRY_EEXIST and stores nothing, so a
 * retry never creates a second object. Bad input: FERRY_EINVAL with a
 * sentence in err; nothing stored. */
FERRY_API int ferry_put_sparse_object(ferry_store *s, const ferry_sparse_desc *d, const void *indices,
                                      const void *values, ferry_sparse_desc *out, char *key, size_t keycap,
                                      ferry_error *err);
/* ferry_put_sparse_object of n objects (d[i], indices[i], values[i]) at
 * once, each checked, sorted and built as one put does, then stored
 * together: one master round trip looks every key up (an existing one is
 * FERRY_EEXIST before anything of it is sorted), one batch of puts stores
 * the rest (ferry_store_batch_put_struct). results[i]: 0 with out[i] (out
 * may be NULL) and the key at keys + i * keycap (keys may be NULL) set, or
 * object i's error (its key set too when its descriptor made one: the
 * existing object's for FERRY_EEXIST); every entry is set. Returns 0 or the first failure in
 * order, its sentence in err. An object that failed stores nothing; the
 * others are stored whatever another's fate. */
FERRY_API int ferry_put_sparse_objects(ferry_store *s, const ferry_sparse_desc *d,
                                       const void *const *indices, const void *const *values,
                                       size_t n, ferry_sparse_desc *out, char *keys, size_t keycap,
                                       int *results, ferry_error *err);

/* Owner admission for a weight several source ranks hold (a replicated,
 * non-EP weight): exactly one caller per logical key is admitted (*admitted
 * true: compute the delta and put it); every other caller is told to skip.
 * A compare-and-swap on "ferry/sp/<tensor>/<base>-<delta>/<placement>/owner"
 * naming the rank. */
FERRY_API int ferry_sparse_admit(ferry_store *s, const ferry_sparse_desc *d, uint32_t rank, bool *admitted,
                                 ferry_error *err);

/* Remove the sparse object at key (as ferry_put_sparse_object returned it)
 * and its admission key: the object's removal says what came of it (0,
 * FERRY_ENOENT when gone already, a reader's lease refusing it, or the
 * store's error); the admission key goes either way. */
FERRY_API int ferry_sparse_remove(ferry_store *s, const char *key, ferry_error *err);
/* ferry_sparse_remove of n keys: the objects in one round trip, their
 * admission keys in another. results[i]: the object's removal (0,
 * FERRY_EBUSY while leased, FERRY_ENOENT, FERRY_EINVAL for a key that is
 * no sparse object's); every entry is set. Returns 0 or the first failure. */
FERRY_API int ferry_sparse_remove_many(ferry_store *s, const char *const *keys, size_t n,
                                       int *results, ferry_error *err);
/* Remove every sparse object whose tensor id starts with tensor_prefix
 * (e.g. "<model>." for a model's tensors); *removed (may be NULL) counts
 * them, as ferry_store_remove_prefix. Their admission keys stay. */
FERRY_API int ferry_sparse_remove_tensors(ferry_store *s, const char *tensor_prefix, uint64_t *removed,
                                          ferry_error *err);

/* Remove every sparse object of tensor_id whose base generation is `base`
 * (any delta, any placement): the leftovers of deltas on `base` that were
 * never announced (docs/sparse.md, "Deltas from a trainer": a delta
 * publish's owners remove them before putting). Leased objects stay.
 * *removed (may be NULL) counts them. Their admission keys stay. */
FERRY_API int ferry_sparse_remove_base(ferry_store *s, const char *tensor_id, uint64_t base,
                                       uint64_t *removed, ferry_error *err);

/* ---- the compact index --------------------------------------------------------------- */

typedef struct ferry_sparse_index {
    char key[512];
    ferry_sparse_desc desc;
    int64_t *tile_coords;        /* ntiles x ndim */
    int64_t *tile_ptr;           /* ntiles + 1 */
    void *aux;                   /* the planner's secondary indexes (built lazily) */
} ferry_sparse_index;

/* Read only meta, tile_coords and tile_ptr of a sparse object (never
 * indices or values). FERRY_EPROTO when the object is not a sparse object
 * or its index is inconsistent (tile_ptr not ascending, ends != nnz, tiles
 * out of the shape). */
FERRY_API int ferry_sparse_index_read(ferry_store *s, const char *key, ferry_sparse_index *out,
                                      ferry_error *err);
FERRY_API void ferry_sparse_index_free(ferry_sparse_index *ix);

/* ---- the planner (pure: no store, no payload) ------------------------------------------ */

/* A target: a logical box of a tensor on a node, at an index of the
 * placement axis. */
typedef struct ferry_sparse_target {
    char tensor_id[FERRY_SPARSE_ID_MAX + 1];
    uint32_t node;
    uint32_t axis_index;              /* e.g. its EP rank (owner filtering) */
    uint32_t ndim;
    uint64_t offset[FERRY_SPARSE_NDIM_MAX], shape[FERRY_SPARSE_NDIM_MAX];   /* global box */
} ferry_sparse_target;

/* An entry range of one source object for one target. */
typedef struct ferry_sparse_range {
    uint64_t start, end;              /* entry offsets */
    bool boundary;                    /* holds tiles crossing the box: filter coordinates */
} ferry_sparse_range;

/* One physical read: a unique (source, node, entry range) after dedup. */
typedef struct ferry_sparse_read {
    uint32_t source, node;
    uint64_t start, end;
} ferry_sparse_read;

/* What (source, target) pair needs: ranges[first, first + n). */
typedef struct ferry_sparse_pair {
    uint32_t source, target;
    size_t first, n;
} ferry_sparse_pair;

typedef struct ferry_sparse_plan_stats {
    uint64_t pairs;                  /* (source, target) pairs after placement filtering */
    uint64_t filtered_out;           /* pairs placement filtering removed */
    uint64_t tiles_hit;
    uint64_t groups_visited;         /* row/column groups the 2-D path looked at */
    uint64_t nd_fallback_tiles;      /* tiles the N-D path scanned (bounded, counted) */
    uint64_t ranges, ranges_coalesced_from;
    uint64_t unique_reads, dedup_hits; /* physical reads after dedup; ranges served by one */
    double plan_s;
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_sparse_plan_stats;

typedef struct ferry_sparse_plan {
    ferry_sparse_pair *pairs; size_t npairs;
    ferry_sparse_range *ranges; size_t nranges;
    ferry_sparse_read *reads; size_t nreads;
    ferry_sparse_plan_stats stats;
} ferry_sparse_plan;

/* Plan a whole target batch in one call: placement filtering (OWNER: only
 * targets whose axis_index == owner; REPLICATE: all), box intersection, tile
 * selection through row-group/column-group secondary indexes for 2-D (the
 * direction with fewer candidate groups; never a scan of nnz), a generic
 * N-D path (bounded, counted), ranges sorted and coalesced, boundary tiles
 * flagged, reads deduplicated by (source, node, range). Sources and targets
 * match by tensor_id. The planner may build and keep secondary indexes in
 * sources[i]->aux. */
FERRY_API int ferry_sparse_plan_batch(ferry_sparse_index *const *sources, size_t nsources,
                                      const ferry_sparse_target *targets, size_t ntargets,
                                      ferry_sparse_plan *out, ferry_error *err);
FERRY_API void ferry_sparse_plan_free(ferry_sparse_plan *p);

/* ---- execution ------------------------------------------------------------------------ */

/* A target-local COO result. */
typedef struct ferry_sparse_result {
    uint32_t target;                 /* index into the targets array */
    char tensor_id[FERRY_SPARSE_ID_MAX + 1];
    uint32_t ndim;
    uint64_t shape[FERRY_SPARSE_NDIM_MAX];   /* the target's local shape */
    uint64_t base_generation, delta_generation;
    enum ferry_sparse_apply apply;
    char value_dtype[8];
    uint64_t nnz;
    int64_t *indices;                /* nnz x ndim, target-local */
    void *values;                    /* nnz of value_dtype */
} ferry_sparse_result;

typedef struct ferry_sparse_stats {
    uint64_t source_objects;         /* distinct source objects read */
    uint64_t non_ep_source_object_count;  /* distinct REPLICATE objects */
    uint64_t index_gets;             /* compact indexes read from the store */
    uint64_t index_cache_hits;       /* compact indexes a reader's cache served */
    uint64_t unique_range_gets;      /* physical ranged reads (indices+values as one) */
    uint64_t full_indices_values_get_count;  /* reads of a whole object's entries (fallback) */
    uint64_t dedup_hits;             /* target ranges served by another target's read */
    uint64_t bytes_read;             /* entry bytes read (indices + values) */
    uint64_t entries_read, entries_kept, boundary_filtered;
    double plan_s, read_s, filter_s;
    /* (docs/sparse.md, "Counters") The compact indexes: */
    uint64_t index_checks;           /* cached indexes checked against the store (one metadata
                                      * round trip each) */
    uint64_t index_bytes_read;       /* meta + tile_coords + tile_ptr bytes read (index_gets) */
    double index_s;                  /* checks and reads of the compact indexes, wall */
    /* The per-range reads, split by member: every unique read is one range
     * of `indices` and one of `values`; the indices ranges go in one batch,
     * then the values ranges in another, so each is timed on its own
     * (read_s = index_range_s + value_range_s). */
    uint64_t index_range_gets;       /* ranges of the indices member read (= unique_range_gets) */
    uint64_t index_range_bytes;      /* their bytes (the coordinates) */
    uint64_t value_range_bytes;      /* bytes of the values ranges (bytes_read = the two) */
    double index_range_s, value_range_s;
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_sparse_stats;

/* ---- the reader: reads with an index cache --------------------------------------------- */

/* A reader of sparse objects from one store, keeping the compact indexes
 * it read (and the planner's secondary indexes built on them) for its
 * later reads: a second read of an unchanged object costs one metadata
 * round trip instead of reading its index (the member table, then meta,
 * tile_coords and tile_ptr) and building the secondary indexes again. The
 * cache is the reader's own; two readers share nothing. Keyed by object
 * key; an entry is used only while the object still has the size and
 * replica placement it had when read (checked on every read), else it is
 * dropped and the index read again (docs/sparse.md, "The reader"). Bounded
 * in entries and bytes, least recently used out. Thread-safe: concurrent
 * reads on one reader are fine (a mutex guards the cache; a read takes its
 * entries out while it works and puts them back at the end). */
typedef struct ferry_sparse_reader ferry_sparse_reader;

#define FERRY_SPARSE_READER_CACHE_ENTRIES 64u              /* default: indexes kept */
#define FERRY_SPARSE_READER_CACHE_ENTRIES_MAX 65536u       /* the most a config may ask */
#define FERRY_SPARSE_READER_CACHE_BYTES (256ull << 20)     /* default: their bytes, at most */

typedef struct ferry_sparse_reader_config {
    uint64_t cache_bytes;     /* bytes of cached indexes at most (tile_coords, tile_ptr and
                               * the entry's own bookkeeping); an index larger than this is
                               * used for its read and not kept */
    uint64_t cache_entries;   /* indexes kept at most, 1..FERRY_SPARSE_READER_CACHE_ENTRIES_MAX */
    uint64_t reserved[8];     /* zero (the init zeroes it; the library refuses anything else):
                               * room for fields to come, docs/design.md "Growth" */
} ferry_sparse_reader_config;

/* Every field of *cfg to its default (cache_entries
 * FERRY_SPARSE_READER_CACHE_ENTRIES, cache_bytes
 * FERRY_SPARSE_READER_CACHE_BYTES). A zeroed config is taken the same way:
 * a 0 cache_entries or cache_bytes is its default. FERRY_EINVAL for NULL. */
FERRY_API int ferry_sparse_reader_config_init(ferry_sparse_reader_config *cfg);
/* A reader of s with an empty cache. s must outlive the reader (close the
 * reader first); the config is copied. Refused with FERRY_EINVAL and a
 * sentence, nothing opened (*out NULL): a NULL argument, a reserved word
 * that is not zero, cache_entries above FERRY_SPARSE_READER_CACHE_ENTRIES_MAX.
 * FERRY_ENOMEM. No store call is made. */
FERRY_API int ferry_sparse_reader_open(ferry_store *s, const ferry_sparse_reader_config *cfg,
                                       ferry_sparse_reader **out, ferry_error *err);
/* Free the reader and its cache; no read may be running on it. NULL ok. */
FERRY_API void ferry_sparse_reader_close(ferry_sparse_reader *r);

/* For the targets (all on this node, or each read on its node: reads are
 * deduplicated per target node): the compact indexes (from the reader's
 * cache when still valid, else read and kept), planning, ranged reads of
 * indices/values, boundary filtering, rebasing. keys: the source objects
 * (the manifest). *out: ntargets-independent array of results (one per
 * (source, target) pair with entries, or an empty one), freed with
 * ferry_sparse_results_free. publish_prefix non-NULL: also store each
 * result as a target-local structured object under
 * "<prefix>/<target>/<tensor>". st (may be NULL): this call's counters,
 * index_cache_hits the indexes the reader's cache served. On failure
 * nothing is returned (*out NULL, *nout 0), with a sentence in err. */
FERRY_API int ferry_sparse_reader_read(ferry_sparse_reader *r, const char *const *keys, size_t nkeys,
                                       const ferry_sparse_target *targets, size_t ntargets,
                                       const char *publish_prefix, ferry_sparse_result **out,
                                       size_t *nout, ferry_sparse_stats *st, ferry_error *err);
/* The same read once, with no cache across calls: every index is read
 * from the store (index_cache_hits 0) and dropped at the end. For a
 * caller that reads each object once; one that reads objects again keeps
 * a ferry_sparse_reader. */
FERRY_API int ferry_read_sparse_objects(ferry_store *s, const char *const *keys, size_t nkeys,
                                        const ferry_sparse_target *targets, size_t ntargets,
                                        const char *publish_prefix, ferry_sparse_result **out,
                                        size_t *nout, ferry_sparse_stats *st, ferry_error *err);
FERRY_API void ferry_sparse_results_free(ferry_sparse_result *r, size_t n);
/* sum += x, field by field (counters and times alike). */
FERRY_API void ferry_sparse_stats_add(ferry_sparse_stats *sum, const ferry_sparse_stats *x);

/* Where a result lands: a view of the target box in memory — element
 * (i0, ..., in) of the box at data + sum(ik * strides[k]) elements. The
 * box may be a slice of a larger parameter (a row slice: data at the
 * slice's first row, strides of the whole buffer), one part of a fused
 * parameter (q of qkv_proj), a transposed view (strides (1, rows)), or a
 * contiguous buffer (strides all 0). */
typedef struct ferry_sparse_view {
    void *data;                      /* element (0, ..., 0) of the box */
    char dtype[8];                   /* "f32", "bf16" or "f16" */
    uint32_t ndim;                   /* the result's */
    uint64_t shape[FERRY_SPARSE_NDIM_MAX];    /* the result's local shape */
    int64_t strides[FERRY_SPARSE_NDIM_MAX];   /* elements, >= 0; all 0: row-major contiguous */
    uint64_t bytes;                  /* bytes at data the view may reach (0: not said); a view
                                      * whose last element lies past them is refused */
} ferry_sparse_view;

/* Apply a result into a view (scatter_add or scatter_set), with the base
 * fence of ferry_sparse_apply. Refused before any write (FERRY_EINVAL, the
 * sentence names the tensor and ends "nothing changed"): a shape other
 * than the result's, a negative stride, strides under which two elements
 * of the box share an address (checked by the sufficient rule: sorted by
 * stride, each dimension's stride is at least the extent the smaller ones
 * span), a view reaching past v->bytes, an index outside the shape.
 * new_generation (may be NULL) = r->delta_generation on success. */
FERRY_API int ferry_sparse_apply_view(const ferry_sparse_result *r, const ferry_sparse_view *v,
                                      uint64_t current_generation, uint64_t *new_generation,
                                      ferry_error *err);

/* Apply a result into a dense local buffer (row-major, r->shape, dtype
 * "f32", "bf16" or "f16"): scatter_add or scatter_set. Base fence: when
 * r->apply is SCATTER_ADD and current_generation != r->base_generation,
 * FERRY_ESTATE naming both generations and nothing changes. *
 * new_generation (may be NULL) = r->delta_generation on success. */
FERRY_API int ferry_sparse_apply(const ferry_sparse_result *r, void *dst, const char *dst_dtype,
                                 uint64_t current_generation, uint64_t *new_generation, ferry_error *err);

#ifdef __cplusplus
}
#endif
#endif
