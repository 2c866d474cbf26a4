/* ferry reshard planner: placement manifests, layouts and model presets,
 * source -> target overlap planning, lowering to byte runs, digests and a
 * plan cache. See docs/reshard.md and docs/manifest.md.
 *
 * Everything here is a pure function of its inputs: no sockets, no store
 * calls, no transfer buffers. Output order is deterministic.
 *
 * Errors: functions that can fail on bad input take a `ferry_error *err`
 * (may be NULL). On failure they return a negative FERRY_E* code and, when
 * err is not NULL, write the same code and a NUL-terminated message into it
 * that names the tensor and fragment at fault, ready to print.
 *
 * Threads: a manifest is built, and first planned with, by one thread.
 * Once a plan uses it, it is frozen (further additions fail with
 * FERRY_ESTATE) and may be read from any thread. Plans are immutable and may be iterated from many threads at
 * once, one iterator per thread. A plan cache is thread-safe.
 */
#ifndef FERRY_RESHARD_H
#define FERRY_RESHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_MAX_DIMS 8
#define FERRY_DTYPE_MAX 16   /* dtype names are shorter than this */

typedef struct ferry_manifest ferry_manifest;
typedef struct ferry_model ferry_model;
typedef struct ferry_plan ferry_plan;
typedef struct ferry_plan_iter ferry_plan_iter;
typedef struct ferry_plan_cache ferry_plan_cache;

/* ---- data model ------------------------------------------------------ */

/* A logical tensor. Dims are >= 1; ndim 0 is a scalar (one element). */
typedef struct ferry_tensor_desc {
    const char *name;             /* unique within a manifest */
    const char *dtype;            /* "bf16", "f32", ...; see docs/manifest.md */
    uint32_t itemsize;            /* bytes per element; must match a known dtype */
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
} ferry_tensor_desc;

/* One placement fragment: the box [offset, offset+shape) of a tensor held
 * by one rank. Local storage is row-major and contiguous unless `strides`
 * (elements, per dim) are given; element (i0..in) of the box lives at
 * storage_offset + sum(i_d * strides[d]) elements into the local buffer.
 * A stored manifest also binds the fragment to a store object: its local
 * buffer starts at byte object_offset of object `object`. */
typedef struct ferry_fragment {
    uint32_t tensor;              /* index in the manifest's tensor list */
    uint32_t rank;
    uint32_t node;                /* filled by ferry_manifest_fragment */
    uint32_t replica;             /* copies of one box carry distinct replica numbers */
    uint64_t offset[FERRY_MAX_DIMS];
    uint64_t shape[FERRY_MAX_DIMS];
    bool has_strides;
    uint64_t strides[FERRY_MAX_DIMS];
    uint64_t storage_offset;      /* elements */
    const char *object;           /* NULL: not bound to a store object */
    uint64_t object_offset;       /* bytes */
} ferry_fragment;

/* A regular split of one box of a tensor over ranks: the compact form that
 * layouts use (fsdp:256 on a 1T model is 18M fragments, one split each
 * tensor). Dim d is cut into parts[d] pieces of ceil(shape/parts) elements,
 * the last one smaller; parts past the end are empty and their ranks hold
 * nothing. The piece with index (i0..in) is held by rank
 * rank + sum(i_d * rank_stride[d]); `replicas` copies of the whole split
 * sit at rank offsets k * replica_stride with replica numbers replica + k.
 * Fragments of a split get consecutive ids: copy-major, then pieces in
 * row-major order, empty pieces skipped. Local storage is contiguous. */
typedef struct ferry_split {
    uint32_t tensor;
    bool whole;                   /* true: the box is the whole tensor (offset/shape ignored) */
    uint64_t offset[FERRY_MAX_DIMS];
    uint64_t shape[FERRY_MAX_DIMS];
    uint32_t parts[FERRY_MAX_DIMS];        /* 0 is read as 1 */
    uint32_t rank;
    uint32_t rank_stride[FERRY_MAX_DIMS];
    uint32_t replicas;                     /* 0 is read as 1 */
    uint32_t replica_stride;
    uint32_t replica;
} ferry_split;

/* A placement manifest: a topology (ranks -> nodes) and fragments.
 * nodes[r] is the node of rank r; NULL means r / gpus_per_node (8 when 0).
 * The manifest copies everything it is given. Close drops the caller's
 * reference: plans keep their own, so a manifest lives until the last
 * plan using it is freed. ferry_manifest_close(NULL) is a no-op. */
FERRY_API int ferry_manifest_create(uint32_t nranks, const uint32_t *nodes, uint32_t gpus_per_node,
                                    ferry_manifest **out);
FERRY_API void ferry_manifest_close(ferry_manifest *m);

/* Add a tensor; returns its index (>= 0). Fails on a duplicate name, an
 * unknown dtype/itemsize pair, a zero dim, more than FERRY_MAX_DIMS dims or
 * an element count whose bytes overflow 64 bits. */
FERRY_API int ferry_manifest_add_tensor(ferry_manifest *m, const ferry_tensor_desc *t, ferry_error *err);
/* Add one fragment (validated at once: box inside the tensor, rank inside
 * the topology, strides that never alias, byte spans without overflow). */
FERRY_API int ferry_manifest_add_fragment(ferry_manifest *m, const ferry_fragment *f, ferry_error *err);
/* Add a split (same checks for every piece and every copy). */
FERRY_API int ferry_manifest_add_split(ferry_manifest *m, const ferry_split *s, ferry_error *err);
/* Whole-manifest checks that single additions cannot make: fragments bound
 * to the same store object must be on the same rank (an object has one
 * home) and occupy disjoint byte spans of it. */
FERRY_API int ferry_manifest_validate(ferry_manifest *m, ferry_error *err);

FERRY_API uint32_t ferry_manifest_rank_count(const ferry_manifest *m);
FERRY_API uint32_t ferry_manifest_node_of(const ferry_manifest *m, uint32_t rank);
FERRY_API uint32_t ferry_manifest_tensor_count(const ferry_manifest *m);
/* Fill *out; the strings stay owned by the manifest. */
FERRY_API int ferry_manifest_tensor(const ferry_manifest *m, uint32_t index, ferry_tensor_desc *out);
/* Index of the tensor named `name`, or FERRY_ENOENT. */
FERRY_API int ferry_manifest_find_tensor(const ferry_manifest *m, const char *name);
/* Fragments, empty split pieces excluded. */
FERRY_API uint64_t ferry_manifest_fragment_count(const ferry_manifest *m);
/* Fragment `id` (0 <= id < count) in full; out->object stays owned by the
 * manifest. O(log groups). */
FERRY_API int ferry_manifest_fragment(const ferry_manifest *m, uint64_t id, ferry_fragment *out);
/* Bytes stored by the fragments on `rank` (sum of their box sizes);
 * FERRY_ERANGE if the sum overflows 64 bits. */
FERRY_API int ferry_manifest_rank_bytes(const ferry_manifest *m, uint32_t rank, uint64_t *out);

/* XXH3-128 of a canonical encoding of the tensors and fragments (not the
 * topology), in the order they were added; the same description gives the
 * same digest on every machine. A split and the same pieces added one by
 * one are different descriptions with different digests. */
FERRY_API int ferry_manifest_digest(ferry_manifest *m, uint8_t out[16]);
/* XXH3-128 of the rank -> node map. */
FERRY_API int ferry_manifest_topology_digest(const ferry_manifest *m, uint8_t out[16]);
/* Lower-case hex of a digest: out holds 33 bytes. */
FERRY_API void ferry_digest_hex(const uint8_t d[16], char out[33]);

/* JSON (docs/manifest.md). Parsing checks everything the add functions
 * check; errors name the JSON entry. A manifest quantized in FP8 blocks is
 * written as the layout before it and a "quantize" entry, and read by
 * quantizing again (ferry_manifest_quantize's checks). Text from
 * ferry_manifest_to_json is freed by the caller with free(). Save writes
 * atomically. */
FERRY_API int ferry_manifest_from_json(const char *text, size_t len, ferry_manifest **out, ferry_error *err);
FERRY_API int ferry_manifest_load(const char *path, ferry_manifest **out, ferry_error *err);
FERRY_API char *ferry_manifest_to_json(const ferry_manifest *m);
FERRY_API int ferry_manifest_save(const ferry_manifest *m, const char *path, ferry_error *err);

/* ---- stored manifests and packing ------------------------------------- */

/* The stored form of placement m: the same topology and tensors (dtype
 * replaced when not NULL), the copy numbered 0 of every box (other
 * replicas dropped: a box is stored once), contiguous row-major local
 * storage (strides dropped), no object bindings. Splits stay splits. The
 * caller closes *out. */
FERRY_API int ferry_manifest_stored(const ferry_manifest *m, const char *dtype, ferry_manifest **out,
                                    ferry_error *err);

/* Where every fragment of a manifest lives when each rank's fragments are
 * packed into store objects: in fragment-id order, each at an offset
 * aligned to `align` (a power of two), a new object begun when the next
 * fragment would take the current one past max_bytes (a larger fragment
 * gets an object of its own). A pure function of the manifest, so a
 * reader needs no table of bindings. The pack references m. */
typedef struct ferry_pack ferry_pack;
typedef struct ferry_packed {
    uint32_t rank;       /* the fragment's rank */
    uint32_t object;     /* object number on that rank, from 0 */
    uint64_t offset;     /* bytes into the object */
    uint64_t bytes;      /* the fragment's box, contiguous */
} ferry_packed;
FERRY_API int ferry_manifest_pack(const ferry_manifest *m, uint64_t align, uint64_t max_bytes,
                                  ferry_pack **out, ferry_error *err);
FERRY_API void ferry_pack_free(ferry_pack *p);   /* NULL ok */
FERRY_API int ferry_pack_fragment(const ferry_pack *p, uint64_t id, ferry_packed *out);
FERRY_API uint32_t ferry_pack_objects(const ferry_pack *p, uint32_t rank);
FERRY_API uint64_t ferry_pack_object_bytes(const ferry_pack *p, uint32_t rank, uint32_t object);

/* ---- models and layouts ---------------------------------------------- */

/* How tensor parallelism cuts a tensor. */
enum ferry_tp_role {
    FERRY_TP_REPLICATED = 0,  /* norms, routers, MLA down-projections: whole on every TP rank */
    FERRY_TP_COLUMN = 1,      /* dim 0 (output features): q/k/v, gate/up, MLA up-projections */
    FERRY_TP_ROW = 2,         /* dim 1 (input features): o_proj, down_proj */
    FERRY_TP_VOCAB = 3,       /* dim 0 over the vocabulary: embedding, lm_head */
};

#define FERRY_LAYER_FIRST (-1)   /* before the layers: embedding (first PP stage) */
#define FERRY_LAYER_LAST  (-2)   /* after the layers: final norm, lm_head (last PP stage) */

typedef struct ferry_model_tensor {
    ferry_tensor_desc desc;
    enum ferry_tp_role role;
    int32_t layer;     /* 0..layers-1, FERRY_LAYER_FIRST or FERRY_LAYER_LAST */
    int32_t expert;    /* routed expert index, or -1 */
} ferry_model_tensor;

/* A model: a named tensor list with roles. Free with ferry_model_free
 * (NULL is a no-op). */
FERRY_API int ferry_model_create(const char *name, uint32_t layers, uint32_t experts, ferry_model **out);
FERRY_API void ferry_model_free(ferry_model *m);
FERRY_API int ferry_model_add_tensor(ferry_model *m, const ferry_model_tensor *t, ferry_error *err);
/* Presets with the shapes of the public configs, in bf16: "qwen3-8b",
 * "qwen3-30b-a3b", "deepseek-v3", "kimi-k2". FERRY_ENOENT for others. */
FERRY_API int ferry_model_preset(const char *name, ferry_model **out, ferry_error *err);
/* Name of preset i, or NULL past the last. */
FERRY_API const char *ferry_model_preset_name(size_t i);
FERRY_API const char *ferry_model_name(const ferry_model *m);
FERRY_API uint32_t ferry_model_layers(const ferry_model *m);
FERRY_API uint32_t ferry_model_experts(const ferry_model *m);
FERRY_API size_t ferry_model_tensor_count(const ferry_model *m);
/* Fill *out; strings stay owned by the model. */
FERRY_API int ferry_model_tensor_at(const ferry_model *m, size_t i, ferry_model_tensor *out);
FERRY_API uint64_t ferry_model_param_count(const ferry_model *m);
FERRY_API uint64_t ferry_model_bytes(const ferry_model *m);

/* A parallel layout. Absent dimensions are 1. Ranks are numbered with tp
 * innermost: rank = (((pp*dp + dp_i)*ep + ep_i)*fsdp + fsdp_i)*tp + tp_i.
 * Node of a rank: first_node + rank / gpus_per_node. */
typedef struct ferry_layout {
    uint32_t fsdp, tp, dp, ep, pp;
    uint32_t gpus_per_node;   /* 0 means 8 */
    uint32_t first_node;
} ferry_layout;

/* Parse "fsdp:256", "tp:8,dp:16", "ep:32,tp:8", "pp:4,tp:8", also
 * "replicated" (one rank) and "gpn:N" (gpus per node). */
FERRY_API int ferry_layout_parse(const char *text, ferry_layout *out, ferry_error *err);
/* Canonical text of a layout into buf; returns its length or a code. */
FERRY_API int ferry_layout_format(const ferry_layout *l, char *buf, size_t cap);
/* Ranks in the layout, or 0 when the product overflows 32 bits. */
FERRY_API uint32_t ferry_layout_ranks(const ferry_layout *l);
/* Build the placement of every tensor of `model` under `l`:
 *  fsdp  dim-0 pieces of every tensor (of the TP piece when tp > 1);
 *  tp    by role: column dim 0, row dim 1, vocab dim 0, replicated whole;
 *  ep    routed expert e on EP rank e*ep/experts, TP-split inside its EP
 *        group; other tensors are replicated across EP ranks;
 *  pp    layer l on stage l*pp/layers, embedding first, head last;
 *  dp    replicas, each a distinct fragment on a distinct rank.
 * The caller closes *out. */
FERRY_API int ferry_layout_build(const ferry_model *model, const ferry_layout *l, ferry_manifest **out,
                                 ferry_error *err);

/* ---- block quantization of a layout ---------------------------------- */

/* Which tensors of a (rollout) layout are stored as FP8 in blocks with f32
 * scales, and how (docs/weights.md, "FP8 rollouts"). ferry_quant_rules_init()
 * sets the defaults; a zeroed struct is taken as the defaults too: NULL
 * strings are the default strings, the fp8 options follow
 * ferry_fp8_options_init (128 x 128 blocks, FERRY_FP8_SCALE_F32). An empty
 * string is an empty list. The reserved words must be zero. */
typedef struct ferry_quant_rules {
    const char *dtype;        /* "f8e4m3" (default) or "f8e5m2" */
    /* comma-separated name globs (fnmatch(3), no flags: '*' crosses '.'):
     * a tensor is quantized when it matches one of `include` and none of
     * `exclude`. Defaults: FERRY_QUANT_INCLUDE, FERRY_QUANT_EXCLUDE. */
    const char *include;
    const char *exclude;
    /* the scale tensor's name: "%s" (exactly once) is the weight's name;
     * "%%" is a '%'. Default FERRY_QUANT_SCALE_NAME. */
    const char *scale_name;
    ferry_fp8_options fp8;    /* block shape and scale format */
    uint64_t reserved[8];     /* zero: room for fields to come */
} ferry_quant_rules;

/* The linear weights, the way FP8 checkpoints (DeepSeek-V3, Kimi-K2) choose
 * them: every "...weight" except embeddings, norms, lm_head and MoE router
 * gates ("mlp.gate.weight"). A selected tensor must be 2-D f32, bf16 or f16. */
#define FERRY_QUANT_INCLUDE "*weight"
#define FERRY_QUANT_EXCLUDE "*embed*,*norm*,*lm_head*,*.gate.weight"
#define FERRY_QUANT_SCALE_NAME "%s_scale_inv"

/* Set every field to its default; FERRY_EINVAL for NULL. */
FERRY_API int ferry_quant_rules_init(ferry_quant_rules *r);

/* Whether `r` (NULL: the defaults) selects tensor t: 1 yes, 0 no. A
 * selected tensor that is not 2-D, or not f32, bf16 or f16, and rules that
 * do not hold (an unknown FP8 dtype, a scale name without exactly one
 * "%s", a block size or scale format ferry_quantize_fp8_blocks refuses,
 * nonzero reserved words) fail with FERRY_EINVAL and a sentence naming
 * the tensor or the field. */
FERRY_API int ferry_quant_rules_match(const ferry_quant_rules *r, const ferry_tensor_desc *t,
                                      ferry_error *err);

/* The layout m with the tensors `r` selects stored as FP8 in blocks: each
 * keeps its index, name, shape and fragments (ranks, replicas, strides in
 * elements), its dtype becomes r's FP8 type (itemsize 1); and, after m's
 * tensors, in the order of their weights, one scale tensor each: f32, shape
 * ceil(rows / block_rows) x ceil(cols / block_cols), named by r's
 * scale_name, with one fragment for each fragment of its weight, on the
 * same rank with the same replica number: the blocks of the weight's box
 * (a split gives a split), contiguous. Unselected tensors and their
 * fragments are copied as they are. The quantization is recorded per
 * tensor (ferry_manifest_tensor_quant), covered by the digest, and checked
 * by ferry_plan_create; the fragments of a quantized tensor or a scale
 * tensor are fixed (adding one fails with FERRY_ESTATE).
 * Refused, nothing returned, with FERRY_EINVAL and a sentence: a fragment
 * of a selected tensor whose box starts or ends inside a block (a shard
 * boundary that cuts a block: the sentence names the tensor, the worker
 * (rank), the dim and the boundary); a fragment bound to a store object;
 * a scale name taken by another tensor (FERRY_EEXIST); a manifest with
 * quantized tensors already; what ferry_quant_rules_match refuses. The
 * caller closes *out. */
FERRY_API int ferry_manifest_quantize(const ferry_manifest *m, const ferry_quant_rules *r,
                                      ferry_manifest **out, ferry_error *err);

/* The same for a source (trainer) layout, whose shards may cut blocks
 * (FSDP shards of a row count that is not a multiple of the block): the
 * weights as ferry_manifest_quantize makes them, and each block's scale
 * held by the fragment holding the block's first element (its first row
 * and first column), so the scale fragments tile the scale tensor once: a
 * fragment [off, end) holds scale blocks [ceil(off / B), ceil(end / B)) in
 * each dim (none when that is empty). A split whose pieces hold whole
 * blocks gives a split; otherwise one scale fragment per piece. Every
 * rank holding a part of a cut block must quantize it with the scale of
 * the whole block (the publisher agrees on it: docs/weights.md, "FP8
 * rollouts"). Recorded as such (JSON: "cut_blocks": true; the digest
 * covers it); the planner plans from it like from any quantized source.
 * Refused as ferry_manifest_quantize refuses, but for cut blocks. */
FERRY_API int ferry_manifest_quantize_source(const ferry_manifest *m, const ferry_quant_rules *r,
                                             ferry_manifest **out, ferry_error *err);

enum ferry_quant_role {
    FERRY_QUANT_NONE = 0,     /* stored as its dtype says */
    FERRY_QUANT_WEIGHT = 1,   /* FP8 in blocks; `partner` is its scale tensor */
    FERRY_QUANT_SCALE = 2,    /* the f32 scales of weight `partner`, one per block */
};

/* How a tensor of a manifest is stored. */
typedef struct ferry_tensor_quant {
    uint32_t role;            /* enum ferry_quant_role */
    uint32_t partner;         /* tensor index; 0 for FERRY_QUANT_NONE */
    ferry_fp8_options fp8;    /* the blocks and scale format (zero for NONE) */
    char fp8_dtype[FERRY_DTYPE_MAX];   /* the weight's FP8 dtype ("" for NONE) */
    uint64_t reserved[4];     /* zeroed by the library */
} ferry_tensor_quant;

/* Fill *out for tensor `index` of m; FERRY_EINVAL past the last tensor. */
FERRY_API int ferry_manifest_tensor_quant(const ferry_manifest *m, uint32_t index,
                                          ferry_tensor_quant *out);

/* ---- plans ----------------------------------------------------------- */

typedef struct ferry_plan_options {
    /* Fail with FERRY_EMSGSIZE rather than grow past these. 0: default. */
    uint64_t max_fragments;   /* per manifest (default 2^36) */
    uint64_t max_regions;     /* regions of the plan (default 2^40) */
    uint64_t max_overlaps;    /* (source split, target split) pairs held in memory (default 2^24) */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_plan_options;

/* Build the plan that fills every target fragment of `dst` from `src`.
 * Fails closed (nothing is returned) when: a target tensor is missing from
 * the source or differs in dtype, itemsize or shape; two source fragments
 * of a tensor overlap without being identical boxes with distinct replica
 * numbers; a target fragment is not fully covered by source fragments;
 * a tensor stored differently (ferry_manifest_quantize: FP8 blocks in
 * one and not the other, other blocks, scale format or FP8 type; the
 * sentence says which); a limit of `opt` (may be NULL) is passed. On
 * success both manifests are frozen and referenced by the plan; a failure
 * leaves them as they were.
 * Free with ferry_plan_free (NULL is a no-op). */
FERRY_API int ferry_plan_create(ferry_manifest *src, ferry_manifest *dst, const ferry_plan_options *opt,
                                ferry_plan **out, ferry_error *err);
FERRY_API void ferry_plan_free(ferry_plan *p);

typedef struct ferry_plan_stats {
    uint64_t tensors;          /* target tensors planned */
    uint64_t src_fragments, dst_fragments;
    uint64_t regions;          /* (source fragment, target fragment) overlaps */
    uint64_t runs;             /* lowered byte-run records after coalescing */
    uint64_t bytes;            /* bytes delivered: every target fragment once */
    uint64_t max_rank_bytes;   /* most bytes a single target rank receives */
    double mean_rank_bytes;    /* bytes / target ranks in the topology */
    uint32_t dst_ranks;
    double plan_s;             /* wall time ferry_plan_create spent */
    uint8_t src_digest[16], dst_digest[16], topology_digest[16];
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_plan_stats;
FERRY_API int ferry_plan_stats_get(const ferry_plan *p, ferry_plan_stats *out);
FERRY_API ferry_manifest *ferry_plan_src(const ferry_plan *p);   /* borrowed */
FERRY_API ferry_manifest *ferry_plan_dst(const ferry_plan *p);   /* borrowed */

/* One overlap: the box of tensor `tensor` that target fragment
 * `dst_fragment` takes from source fragment `src_fragment`. Tensor indices
 * are the target manifest's (src_tensor: the source's). When the source
 * has replicas of the box, the plan picks one: on the target's node when
 * there is one, else spread by target rank. */
typedef struct ferry_region {
    uint32_t tensor, src_tensor;
    uint32_t ndim;
    uint64_t src_fragment, dst_fragment;
    uint32_t src_rank, dst_rank;
    uint64_t offset[FERRY_MAX_DIMS];   /* global coordinates */
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t bytes;
} ferry_region;

/* A lowered byte movement: `len` contiguous bytes, repeated over `nouter`
 * nested loops (outermost first): piece (c0..) starts at
 * src_offset + sum(c_i * src_stride[i]) and dst_offset + sum(c_i * dst_stride[i]).
 * Source offsets are into the bound store object when src_object is set,
 * else into the source fragment's local buffer; target offsets are into the
 * target fragment's local buffer. Runs next to each other in one object
 * and one target fragment are coalesced (src_fragment then names the
 * first). src_object stays valid while the plan lives. */
typedef struct ferry_run {
    uint32_t tensor;
    uint64_t src_fragment, dst_fragment;
    uint32_t src_rank, dst_rank;
    const char *src_object;
    uint64_t src_offset, dst_offset;
    uint64_t len;
    uint32_t nouter;
    uint64_t count[FERRY_MAX_DIMS];
    uint64_t src_stride[FERRY_MAX_DIMS], dst_stride[FERRY_MAX_DIMS];
    uint64_t bytes;            /* len * product of counts */
} ferry_run;

/* Lower a copy of one box of `shape` elements (itemsize bytes each)
 * between two strided layouts (element strides per dim) into one run:
 * len, nouter, count, src_stride, dst_stride and bytes are set (offsets,
 * fragments and ranks are left to the caller). Contiguous inner dims fold
 * into len, contiguous neighbours into one loop. The lowering every plan
 * run goes through, for copies between two local layouts (a replica's
 * push, a piece into a staging buffer). */
FERRY_API void ferry_box_lower(uint32_t ndim, const uint64_t *shape, uint32_t itemsize,
                               const uint64_t *src_strides, const uint64_t *dst_strides, ferry_run *run);

/* Which part of a plan an iterator walks: -1 means any. */
typedef struct ferry_plan_filter {
    int64_t tensor;            /* target tensor index */
    int64_t src_rank, dst_rank;
} ferry_plan_filter;

/* Iterate regions or runs (one kind per iterator) in plan order: target
 * tensor, target split, source box, target fragment, source fragment.
 * filter may be NULL. The iterator references the plan, which must outlive
 * it. next returns 1 with *out filled, 0 at the end, or a negative code. */
FERRY_API int ferry_plan_iter_open(const ferry_plan *p, const ferry_plan_filter *filter, ferry_plan_iter **out);
FERRY_API int ferry_plan_iter_next_region(ferry_plan_iter *it, ferry_region *out);
FERRY_API int ferry_plan_iter_next_run(ferry_plan_iter *it, ferry_run *out);
FERRY_API void ferry_plan_iter_close(ferry_plan_iter *it);

/* A cache of plans keyed by (source digest, target digest, topology digest
 * of both manifests), least recently used evicted past `capacity` plans.
 * get returns a plan reference the caller frees with ferry_plan_free; a hit
 * returns the cached plan without planning again (*hit set when not NULL).
 * A hit still checks the limits of `opt`. Free releases the cache's own
 * references (NULL is a no-op). */
FERRY_API int ferry_plan_cache_create(size_t capacity, ferry_plan_cache **out);
FERRY_API void ferry_plan_cache_free(ferry_plan_cache *c);
FERRY_API int ferry_plan_cache_get(ferry_plan_cache *c, ferry_manifest *src, ferry_manifest *dst,
                                   const ferry_plan_options *opt, ferry_plan **out, bool *hit,
                                   ferry_error *err);
FERRY_API size_t ferry_plan_cache_size(ferry_plan_cache *c);

#ifdef __cplusplus
}
#endif
#endif
