/* rl internals: a weight generation as it is stored (gen.c), shared by
 * publishing (publish*.c) and every consumer (update.c, pull.c, compat.c).
 *
 * A generation G of model M is the trainers' placement in its stored form
 * (reshard's ferry_manifest_stored: copy 0 of every box, contiguous, in
 * the published dtype) packed into store objects (ferry_manifest_pack):
 *
 *   objects  ferry/w/M/G/manifest.json   the stored manifest (reshard JSON)
 *            ferry/w/M/G/r<R>.<k>        rank R's packed fragments, object k
 *            ferry/w/M/G/r<R>.sums       XXH3-64 of each of R's fragments (u64 LE, id order)
 *            ferry/w/M/G/r<R>.decl       R's declaration (gen_decl: hashes per tensor)
 *   KV       ferry/wk/M/G/manifest       the generation text below; its XXH3-128 is the
 *                                        digest the announcement carries
 *
 *   ferry-gen 2
 *   manifest <bytes> <xxh3-128 hex of manifest.json>
 *   rank <R> <segment> <objects> <xxh3-64 hex of r<R>.sums>
 *   ...                                   (one line per rank, ascending)
 */
#ifndef FR_RL_GEN_INT_H
#define FR_RL_GEN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/weights.h"

#define FR_GEN_ALIGN 64                  /* a fragment's offset in its object */
#define FR_GEN_OBJECT_MAX (256ull << 20) /* packed objects are at most this (unless one
                                          * fragment is larger) */

typedef struct fr_gen_rank {
    uint64_t segment;            /* where its objects landed (0: unknown) */
    uint32_t nobjects;
    uint64_t sums_hash;
    uint64_t *sums;              /* loaded on demand: per own fragment, in id order */
    size_t nsums;
    char **keys;                 /* its objects' store keys */
} fr_gen_rank;

typedef struct fr_gen {
    char model[128];
    uint64_t generation;
    uint8_t digest[16];
    uint8_t placement[16];       /* XXH3-128 of manifest.json: the stored placement's identity
                                  * (all 0: unknown) */
    ferry_manifest *m;           /* the stored manifest, frozen */
    ferry_pack *pack;
    uint32_t nranks;
    fr_gen_rank *ranks;
    uint32_t *ordinal;           /* per fragment: its index among its rank's (for sums);
                                  * built with the first sums loaded */
    ferry_plan *whole;           /* every tensor whole on one rank: reads of whole tensors */
    ferry_manifest *whole_m;
} fr_gen;

/* Read generation gen of model: its text (checked against the announced
 * digest when it is the active one), the stored manifest, the packing.
 * Free with fr_gen_free (NULL ok). */
int fr_gen_load(ferry_store *s, const char *model, uint64_t gen, fr_gen **out, ferry_error *err);
void fr_gen_free(fr_gen *g);

/* Where source fragment frag of g lives: its store key (borrowed from g),
 * offset in that object and bytes. */
int fr_gen_where(const fr_gen *g, uint64_t frag, const char **key, uint64_t *offset,
                 uint64_t *bytes);

/* One strided store read of a planned run: rows of len bytes from source
 * fragment frag (src: offset inside the fragment) into memory. */
typedef struct fr_gread {
    uint64_t frag, src;
    uint8_t *dst;
    uint64_t len, count, sstride, dstride;
} fr_gread;
/* Append the reads of run (its dst_offset taken from dst_base) to *v:
 * one per combination of its outer loops but the innermost. */
int fr_gread_add(fr_gread **v, size_t *n, size_t *cap, const ferry_run *run, uint8_t *dst_base);
/* Do reads v[0..n) (in batches, keys resolved through g); every byte
 * count is checked. *bytes (may be NULL) adds what was read. */
int fr_gread_run(ferry_store *s, const fr_gen *g, const fr_gread *v, size_t n, uint64_t *bytes,
                 ferry_error *err);
/* XXH3-64 of fragment frag as published (loads its rank's sums). */
int fr_gen_checksum(ferry_store *s, fr_gen *g, uint64_t frag, uint64_t *out, ferry_error *err);

/* Check a whole tensor (row-major, contiguous at data) against its
 * fragments' checksums: FERRY_ECORRUPT naming the tensor and fragment. */
int fr_gen_verify_tensor(ferry_store *s, fr_gen *g, uint32_t tensor, const void *data,
                         ferry_error *err);

/* XXH3 (streaming, 64 bits of the 128) of a piece's packed bytes: what a
 * fragment's checksum is; fr_gen_box_hash gives the same over a box in
 * any layout. */
uint64_t fr_gen_bytes_hash(const void *data, size_t len);
/* Hash a box of a buffer in row-major element order, as XXH3-64 of its
 * bytes packed: what a fragment's checksum covers. */
uint64_t fr_gen_box_hash(const uint8_t *base, uint32_t ndim, const uint64_t *shape,
                         const uint64_t *strides, uint32_t itemsize);

/* Lease every object of g (one master round trip): FERRY_ELOST naming the
 * object when one is gone, before anything is read. */
int fr_gen_lease_all(ferry_store *s, const fr_gen *g, ferry_error *err);

/* A target manifest of `ranks` ranks (0 is read as 1) holding shards[i] on
 * rank rank_of[i] (NULL: all on rank 0), with g's tensors; empty shards are
 * left out, so fragment j is shards[(*shard_of)[j]] (free it):
 * FERRY_ENOENT for a tensor not in g, FERRY_ERANGE for a box outside it,
 * FERRY_EINVAL for a bad shape or strides. */
int fr_rl_target(const fr_gen *g, const ferry_param_shard *shards, size_t n, uint32_t ranks,
                 const uint32_t *rank_of, ferry_manifest **out, size_t **shard_of,
                 ferry_error *err);

/* A rollout binding against its tensor d (the generation's): the bytes its
 * box spans in its buffer (strides as given, 0s: row-major contiguous)
 * into *span; FERRY_EINVAL naming the tensor and box when they pass
 * p->dst_bytes (when given) or the buffer is NULL. */
int fr_rl_shard_check(const ferry_param_shard *p, const ferry_tensor_desc *d, uint64_t *span,
                      ferry_error *err);

/* A rollout binding of tensor ti of g against how g stores it: for a
 * tensor stored as FP8 in blocks, a buffer of elements other than one byte
 * (a consumer asking bf16 of an FP8 tensor: ferry does not dequantize in
 * an update) and a shard whose box cuts a block (it would need the scale
 * of rows it does not hold) are refused, FERRY_EINVAL with a sentence
 * naming the tensor. 0 for every other tensor. */
int fr_rl_shard_quant_check(const fr_gen *g, uint32_t ti, const ferry_param_shard *p,
                            ferry_error *err);

/* The memory of a rollout worker's shards registered for remote writes
 * (spans.c): shards whose bytes touch or overlap share one region (an
 * engine holds at most 16,384). */
typedef struct fr_rl_spans {
    size_t n;                    /* merged spans (regions) */
    uint8_t **base;
    uint64_t *len;
    ferry_region **reg;
    size_t *of;                  /* per shard: its span (SIZE_MAX: it spans no byte) */
    size_t nshards;
    bool borrowed;               /* reg[0] is the caller's (fr_rl_spans_borrow) */
} fr_rl_spans;
/* Every one of n shards lies in r, which the caller registered and keeps:
 * not registered again, not unregistered by fr_rl_spans_free. */
int fr_rl_spans_borrow(ferry_region *r, size_t n, fr_rl_spans *sp, ferry_error *err);
/* Register the spans of shards (addr[i], len[i] bytes; 0: none), keeping
 * the regions of the last call when the merged spans are the same. */
int fr_rl_spans_register(ferry_engine *e, uint8_t *const *addr, const uint64_t *len, size_t n,
                         fr_rl_spans *sp, ferry_error *err);
/* Advise the merged spans of shards (addr[i], len[i] bytes; 0: none) for
 * transparent huge pages, collapsing what is resident (spans.c): pushes
 * from same-host peers copy into them at memcpy speed. Done at
 * registration and, for shards whose size is known then, at open. */
void fr_rl_spans_advise(uint8_t *const *addr, const uint64_t *len, size_t n);
/* The region holding shard i (NULL when it spans no byte). */
ferry_region *fr_rl_spans_region(const fr_rl_spans *sp, size_t shard);
void fr_rl_spans_free(fr_rl_spans *sp);   /* unregisters; NULL ok */

/* Fill the public manifest from g (entries per tensor); m keeps a reference
 * (g is freed with the manifest). */
int fr_gen_to_manifest(fr_gen *g, ferry_weight_manifest *m, ferry_error *err);
/* The generation behind a manifest filled by ferry_weights_manifest. */
fr_gen *fr_gen_of(const ferry_weight_manifest *m);

/* Read the boxes of shards[0..n) of generation g from the store into
 * their buffers (parameter-direct, each shard its own demand; strides as
 * the shards give them): the reads every byte count of which is checked.
 * *bytes and *ranges (may be NULL) add what was read. On a failed read the
 * buffers may be partly written: FERRY_EREBUILD. */
int fr_gen_read_shards(ferry_store *s, fr_gen *g, const ferry_param_shard *shards, size_t n,
                       uint64_t *bytes, uint64_t *ranges, ferry_error *err);

/* ---- sparse generations (gen_sparse_text.c, gen_sparse.c) -------------------------------
 *
 * A sparse generation G of model M is announced like a dense one (the
 * active key "G <digest>", the digest over its generation text in
 * ferry/wk/M/G/manifest), but its text is
 *
 *   ferry-sparse 1
 *   base <F> <xxh3-128 hex of F's generation text>
 *   dense <D>                              the dense generation the chain starts at
 *   object <key>                           one line per sparse object (sparse.h), any order
 *   ...
 *
 * so a chain G -> F -> ... -> D is checked link by link from the digest the
 * active key carries. */

#define FR_SGEN_MAGIC "ferry-sparse 1\n"
#define FR_SGEN_CHAIN_MAX 64     /* generations a chain holds at most, the dense one included */

typedef struct fr_sgen {
    uint64_t generation, base, dense;
    uint8_t base_digest[16];
    char **keys;
    size_t nkeys;
} fr_sgen;

/* Whether a generation text is a sparse generation's. */
bool fr_sgen_is(const char *text, size_t len);
/* Parse a sparse generation text (FERRY_EPROTO when malformed). */
int fr_sgen_parse(const char *text, size_t len, uint64_t generation, fr_sgen *out);
void fr_sgen_free(fr_sgen *g);
/* Generation gen's text (any generation's, dense or sparse) from its
 * manifest key, NUL-terminated in *text (the caller frees), and its
 * digest. 0 or the store's error. */
int fr_sgen_text(ferry_store *s, const char *model, uint64_t gen, char **text, size_t *len,
                 uint8_t digest[16], ferry_error *err);
/* Retention: remove the sparse objects of generation g of model (and their
 * admission keys). true when none is left, also when g is not a sparse
 * generation or its text is gone; false while a reader still leases one
 * (the generation stays listed until a later publish). */
bool fr_sgen_drop_objects(ferry_store *s, const char *model, uint64_t g);

/* ferry_sparse_announce; with probe_given (the probe lines, "segment TAB
 * key\n" of one object per segment) the objects are taken as they are —
 * the caller made them itself (the delta encoder: each owner put its
 * tensors' objects of exactly (base, gen) in the placement's shapes) —
 * so no index is read; st->nnz stays 0. */
int fr_sgen_announce(ferry_store *s, const char *model, uint64_t base, uint64_t gen,
                     const char *const *keys, size_t nkeys, uint32_t keep, const char *probe_given,
                     ferry_sparse_announce_stats *st, ferry_error *err);

#endif
