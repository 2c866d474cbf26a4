/* ferry weight updates (docs/weights.md): publishing a policy generation
 * from every trainer rank — from whole tensors, from the shards each rank
 * holds, or as a stream of tensors — with one announcement and retention;
 * reading a generation back; updating rollout workers from it, each worker
 * reading its own demand or a rollout group reading each byte once
 * (single-pull, pushes between workers), into the parameters or into
 * standby copies flipped after the update, plainly or overlapped with the
 * publish; sparse generations; counters for every publish and update. */
#ifndef FERRY_WEIGHTS_H
#define FERRY_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"
#include "ferry/reshard.h"
#include "ferry/sparse.h"
#include "ferry/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One publisher rank per tensor, balancing bytes across trainer nodes,
 * then across the ranks of each node. Every rank passes the same tensor
 * sizes in the same order and the same rank -> node map, and gets the same
 * answer: the result depends on nothing else (no hashing of pointers, no
 * randomness, no thread timing).
 *
 * Algorithm (longest-processing-time first): tensors are taken in
 * decreasing size (ties: lower index first); each goes to the node with the
 * fewest bytes so far (ties: lower node id), and inside it to the rank with
 * the fewest bytes (ties: lower rank). The heaviest node carries at most
 * mean + the largest tensor, and in practice within a fraction of a percent
 * of the mean once tensors outnumber nodes many times (docs/weights.md).
 *
 * tensor_bytes[ntensors]; rank_node[nranks] (node ids are any u32; a node
 * with no rank never publishes). publisher[ntensors] receives ranks.
 * FERRY_EINVAL for no ranks or NULL arrays, FERRY_ENOMEM. */
FERRY_API int ferry_weights_assign(const uint64_t *tensor_bytes, size_t ntensors,
                                   const uint32_t *rank_node, uint32_t nranks, uint32_t *publisher,
                                   ferry_error *err);

/* ferry_convert (f32 / bf16 / f16 conversion, used for the rollout dtype)
 * is declared in ferry/common.h, included above. */

/* The store key of one object of a generation:
 * "ferry/w/<model>/<generation, 20 digits>/<fragment>". Returns the length
 * (without NUL), or FERRY_EMSGSIZE when it does not fit in cap, FERRY_EINVAL
 * for an empty model name or one holding '/'. */
FERRY_API int ferry_weights_key(const char *model, uint64_t generation, const char *fragment, char *buf,
                                size_t cap);


/* ---- publishing a generation ------------------------------------------------ */

/* One tensor as a trainer rank holds it: the full, contiguous tensor. */
typedef struct ferry_weight_tensor {
    const char *name;
    const char *dtype;              /* of data */
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    const void *data;
    uint64_t reserved[4];   /* zero: room for fields to come */
} ferry_weight_tensor;

typedef struct ferry_publisher_config {
    char model[128];                /* no '/' */
    uint32_t rank, world;           /* this trainer rank of world */
    const uint32_t *rank_node;      /* node of each trainer rank (world entries) */
    char out_dtype[16];             /* rollout dtype ("f32","bf16","f16"); "" keeps each tensor's */
    uint64_t segment;               /* this node's store segment, preferred (0: none) */
    uint32_t keep;                  /* generations retained (default 2) */
    uint64_t timeout_ms;            /* barrier wait (default FERRY_DEFAULT_TIMEOUT_MS) */
    /* Block quantization before the network (docs/weights.md, "FP8
     * rollouts"): the tensors these rules pick are stored as FP8 in blocks
     * with their f32 scale tensors, quantized once by the ranks that hold
     * them from the values they hold (not from out_dtype); the other
     * tensors as out_dtype says. NULL (the default): none. Read during the
     * call only. Not for the streaming publish or a delta encoder. */
    const ferry_quant_rules *quant;
    uint64_t reserved[7];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_publisher_config;

/* Every field of *cfg to its default (keep 2, timeout_ms
 * FERRY_DEFAULT_TIMEOUT_MS, the rest empty or 0). A config the caller zeroed
 * instead is taken the same way: a 0 keep or timeout_ms is its default. */
FERRY_API int ferry_publisher_config_init(ferry_publisher_config *cfg);

typedef struct ferry_publish_stats {
    uint64_t tensors, bytes;              /* stored by this rank */
    uint64_t total_tensors, total_bytes;  /* the whole generation */
    uint64_t cross_node_bytes;            /* this rank's bytes that landed off its segment */
    double put_s, commit_s;
    uint64_t removed_generations;         /* retention, coordinator only */
    /* Phases, in order: put_s (= convert_s + store_s), barrier_s,
     * commit_s (the coordinator's gather, announce and retention, or the
     * wait for its decision). */
    double convert_s;                     /* dtype conversion and checksums (in put_s) */
    double store_s;                       /* the store puts (in put_s) */
    double barrier_s;                     /* recording this rank's part, waiting for every rank */
    uint64_t local_bytes;                 /* this rank's bytes that landed on its segment
                                           * (with cfg.segment; bytes = local + cross-node) */
    uint64_t swept_generations;           /* coordinator only: generations older than
                                           * this one that were never announced, whose leftover
                                           * objects this publish removed */
    uint64_t faults;                      /* minor page faults the process took
                                           * during the call, every thread's: first touches
                                           * of memory or mappings (0 in a warm steady
                                           * state; docs/weights.md, "Warm memory") */
    double total_s;                       /* the call's wall time: put_s +
                                           * barrier_s + commit_s cover it but for reading
                                           * the active generation first */
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_publish_stats;

/* Publish `generation` (> every earlier one) from this rank. Every rank of
 * the world calls it with the same tensors in the same order (each with its
 * full reconstructed tensor). The rank that ferry_weights_assign picks for a
 * tensor converts it to out_dtype and stores it once: hard-pinned, one
 * replica, preferring this node's segment, under ferry_weights_key, with
 * its XXH3-64 checksum recorded in its part of the manifest (a leftover
 * object of an earlier failed attempt at this generation is replaced).
 * Ranks then meet at a barrier; the barrier's release numbers the attempt.
 * Rank 0 (the coordinator) checks every part, claims the attempt's decision,
 * writes the manifest and announces the generation with one
 * compare-and-swap of the model's active key carrying the manifest digest.
 *
 * Every rank of an attempt gets the same answer: 0 on every rank, or the
 * same code and message on every rank ("publish of M generation G failed:
 * rank R: <why>" with the failing rank's own code, e.g. FERRY_EINVAL for a
 * bad tensor; FERRY_ETIMEDOUT "not every trainer rank arrived within T ms"
 * when a rank never reached the barrier; FERRY_ETIMEDOUT "the coordinator
 * (rank 0) gave no decision within T ms" when it died after the barrier).
 * A failed rank still takes part (it fails the attempt at once, not after
 * the timeout). On a failure the previous generation stays active and
 * every live rank removes the objects it stored; objects of ranks that died
 * are replaced by a retry of the generation, or removed by the next
 * announcement of a newer one (docs/weights.md, "Failures and cleanup").
 * After an announcement the coordinator removes generations older than the
 * last `keep` (objects still leased by readers stay until a later publish).
 * A generation that is not newer than the active one is refused on every
 * rank before anything is stored (FERRY_EINVAL). */
FERRY_API int ferry_publish(ferry_store *s, const ferry_publisher_config *cfg, uint64_t generation,
                            const ferry_weight_tensor *tensors, size_t n, ferry_publish_stats *st,
                            ferry_error *err);

/* One piece this rank holds of a placement: fragment `fragment` of the
 * placement manifest, its bytes at data, laid out as the fragment says
 * (its strides and storage offset; contiguous when it has none) in its
 * tensor's dtype. */
typedef struct ferry_shard_data {
    uint64_t fragment;
    const void *data;
} ferry_shard_data;

/* Publish `generation` from the pieces this rank holds, with no gather:
 * every rank passes the same placement (a ferry_manifest of the whole
 * trainer world: FSDP, TP, PP, EP shards or any mix; world ranks) and the
 * data of its own fragments. Each box is stored once — by the rank holding
 * its copy numbered 0 (other copies are replicas and need no data) —
 * converted to out_dtype, packed with the rank's other pieces into
 * hard-pinned objects of one replica on its node's segment, each piece's
 * XXH3-64 recorded. Before anything is stored, every rank checks the
 * placement covers every tensor exactly once and that it was given every
 * piece it must store; the coordinator checks that every rank passed the
 * same placement (names, dtypes, shapes, order and pieces), naming the rank
 * and tensor that differ. Announcement, failures, cleanup and retention as
 * for ferry_publish. The placement is frozen. With cfg->quant, the tensors
 * the rules pick are stored as FP8 in blocks with their scale tensors
 * (ferry_manifest_quantize_source: each block's scale with the rank
 * holding its first element); where a shard cuts a block the ranks agree
 * on its scale from partial maxima (one more barrier, no dense bytes
 * exchanged), so every block is quantized as a whole-tensor quantization
 * would (docs/weights.md, "Publishing FP8"). */
FERRY_API int ferry_publish_shards(ferry_store *s, const ferry_publisher_config *cfg, uint64_t generation,
                                   ferry_manifest *placement, const ferry_shard_data *mine, size_t n,
                                   ferry_publish_stats *st, ferry_error *err);

/* The publisher's warm-up (docs/weights.md, "Warm memory"): what this
 * rank's publishes of `placement` will write is written once now, off the
 * critical path — the store client's staging buffer sized for this rank's
 * largest packed object, and every page of the store's segments on this
 * machine through the mapping the puts copy through (ferry_store_warm for
 * writing). Local to the rank: no barrier, nothing stored, no generation.
 * *bytes (may be NULL): the bytes touched. Without it, the first
 * generations pay a first touch per page they land on (on VMs 20-50x a
 * warm copy). FERRY_EINVAL for a bad config or placement, FERRY_EBUSY when
 * another thread holds the staging buffer. */
FERRY_API int ferry_publish_warm(ferry_store *s, const ferry_publisher_config *cfg,
                                 ferry_manifest *placement, uint64_t *bytes, ferry_error *err);

/* Publishing as a stream (docs/weights.md, "Streaming publish"): for a
 * framework that hands every trainer rank the full tensors one at a time
 * (a weight generator, as verl's), without any rank holding the model.
 * Every rank of the world calls begin, then add with the same tensors in
 * the same order, then end. Each tensor is stored by one rank, chosen as
 * it comes — the rank with the fewest bytes so far (ties: the lower
 * rank), the same choice on every rank, so no rank stores more than the
 * mean plus the largest tensor — converted to out_dtype straight into
 * that rank's current object; an object is put as soon as the next
 * tensor would pass it (256 MiB), so a rank holds at most one object, or
 * one tensor larger than that, at a time (ferry_publish_stream_held).
 * The tensor's data is not used after add returns. end announces the
 * generation as ferry_publish does (the same outcome, errors, cleanup
 * and retention; the stream's placement — each tensor whole on its
 * storing rank — is what every rank checks against the others).
 * begin refuses a generation not newer than the active one before
 * anything is stored (FERRY_EINVAL). A tensor add refuses (a bad name,
 * dtype, no data, a failed store) fails this rank's part of the attempt:
 * later adds return the same error, and end fails the attempt on every
 * rank at once, this rank's objects removed. Always call end (it frees
 * the stream). cfg->rank_node is not used. */
typedef struct ferry_publish_stream ferry_publish_stream;
FERRY_API int ferry_publish_stream_begin(ferry_store *s, const ferry_publisher_config *cfg,
                                         uint64_t generation, ferry_publish_stream **out, ferry_error *err);
FERRY_API int ferry_publish_stream_add(ferry_publish_stream *ps, const ferry_weight_tensor *t,
                                       ferry_error *err);
FERRY_API int ferry_publish_stream_end(ferry_publish_stream *ps, ferry_publish_stats *st, ferry_error *err);
/* This rank cannot go on (why: its reason, e.g. a tensor its caller could
 * not hand over): end fails the attempt on every rank with it. */
FERRY_API int ferry_publish_stream_abort(ferry_publish_stream *ps, const char *why);
/* The most bytes this rank's stream has held at once so far (its object
 * being filled). */
FERRY_API uint64_t ferry_publish_stream_held(const ferry_publish_stream *ps);

/* This rank cannot publish `generation` (why: its reason, e.g. a check of
 * its own inputs failed before it could call ferry_publish). It takes part
 * in the attempt with a failed part, so the other ranks fail at once rather
 * than after cfg->timeout_ms, and returns the error every rank of the
 * attempt gets: FERRY_EINVAL "publish of M generation G failed: rank R:
 * <why>" (or, like ferry_publish, a timeout when a rank never arrived).
 * cfg->rank_node may be NULL. Never returns 0. */
FERRY_API int ferry_publish_abort(ferry_store *s, const ferry_publisher_config *cfg, uint64_t generation,
                                  const char *why, ferry_error *err);

/* ---- reading a generation ------------------------------------------------------ */

/* One tensor of a published generation. */
typedef struct ferry_weight_entry {
    char name[256];
    char dtype[16];
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t bytes;
    uint64_t checksum;              /* XXH3-64 of the stored bytes */
    uint32_t publisher;             /* trainer rank */
    uint64_t segment;               /* where it landed */
    char key[384];                  /* store key */
    /* A tensor is stored as the pieces its trainers held (docs/weights.md,
     * "Stored generations"): publisher, segment and key above are those of
     * its first piece, checksum is 0 (every piece has its own, checked by
     * ferry_weights_read). */
    uint32_t index;                 /* its index in the stored placement */
    void *internal;                 /* the generation it belongs to */
    uint64_t reserved[4];   /* zero: room for fields to come */
} ferry_weight_entry;

typedef struct ferry_weight_manifest {
    uint64_t generation;
    uint8_t digest[16];             /* XXH3-128 of the manifest text */
    ferry_weight_entry *entries;
    size_t n;
    uint64_t bytes;
    ferry_manifest *stored;         /* the stored placement: every piece of every
                                     * tensor, its rank and box (borrowed until free) */
    void *internal;                 /* */
    uint64_t reserved[4];   /* zero: room for fields to come */
} ferry_weight_manifest;

/* The announced generation of a model and whether its objects are still
 * there. Every publish records one object key per store segment the
 * generation landed on; each is checked (one existence check per segment,
 * no lease). */
typedef struct ferry_weights_status {
    uint64_t generation;            /* the announced generation (0: none) */
    uint8_t digest[16];             /* XXH3-128 of its manifest */
    uint32_t segments;              /* store segments holding its objects (0: not recorded) */
    uint32_t lost_segments;         /* of them, whose objects are gone (lost or removed) */
    bool lost;                      /* lost_segments > 0: the generation cannot be loaded */
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_weights_status;
/* 0 when the generation is whole; FERRY_ENOENT when none was announced;
 * FERRY_ELOST when objects of it are gone — a node holding them restarted
 * or died — with *out filled and err saying "generation G of M is lost:
 * ...; publish generation G+1 or later" (a lost number is never reused:
 * workers that loaded G before the loss still hold it). */
FERRY_API int ferry_weights_active_status(ferry_store *s, const char *model, ferry_weights_status *out,
                                          ferry_error *err);
/* The active generation of a model (0 and FERRY_ENOENT when none), checked
 * as ferry_weights_active_status: FERRY_ELOST (with *generation and digest
 * set) when its objects are gone. */
FERRY_API int ferry_weights_active(ferry_store *s, const char *model, uint64_t *generation,
                                   uint8_t digest[16], ferry_error *err);
/* Wait, at most timeout_ms (< 0: forever), until the model's announced
 * generation is at least `at_least` (> 0), and set *generation to it: a
 * watch of the model's announcement, no polling. A receiver started
 * together with the publish it waits for (as verl starts them) calls this
 * first, so it never takes the generation before. FERRY_ETIMEDOUT with
 * err "generation G of M was not announced within T ms (the active one is
 * A)" (*generation: the active one, 0 if none); FERRY_ELOST when the
 * generation reached is lost, as ferry_weights_active. */
FERRY_API int ferry_weights_wait_active(ferry_store *s, const char *model, uint64_t at_least, int timeout_ms,
                                        uint64_t *generation, ferry_error *err);
/* The manifest of a generation, its digest checked against the announced
 * one when it is the active generation. Free with ferry_weight_manifest_free. */
FERRY_API int ferry_weights_manifest(ferry_store *s, const char *model, uint64_t generation,
                                     ferry_weight_manifest *out, ferry_error *err);
FERRY_API void ferry_weight_manifest_free(ferry_weight_manifest *m);
/* Read entry i's bytes into dst (cap bytes) straight from the store and
 * verify its checksum: FERRY_ECORRUPT naming the tensor on a mismatch. */
FERRY_API int ferry_weights_read(ferry_store *s, const ferry_weight_entry *e, void *dst, size_t cap,
                                 ferry_error *err);

/* ---- updating a rollout worker (store reads) ------------------------------------- */

/* One parameter shard of a rollout worker: the box [offset, offset+shape) of
 * a published tensor, written to dst with element strides (all 0: row-major
 * contiguous). Its dtype is the published one (the publisher converted). */
typedef struct ferry_param_shard {
    const char *tensor;
    uint32_t ndim;                       /* the tensor's */
    uint64_t offset[FERRY_MAX_DIMS];
    uint64_t shape[FERRY_MAX_DIMS];
    int64_t strides[FERRY_MAX_DIMS];     /* elements, >= 0 */
    void *dst;
    uint64_t dst_bytes;                  /* bytes of the buffer at dst; 0: not
                                          * said. A box whose last element lies past them
                                          * is refused at prepare (FERRY_EINVAL naming the
                                          * tensor and box), before anything is written */
    uint64_t elem_bytes;                 /* bytes of one element of the buffer; 0: not
                                          * said. When set and the published dtype's
                                          * element has another size, prepare refuses the
                                          * shard (FERRY_EINVAL naming tensor, sizes and
                                          * dtype) before anything is written */
    /* Explicit dequantization (ferry_weights_update_direct only; docs/weights.md,
     * "FP8 rollouts"): NULL, the default, receives the tensor as published;
     * "f32", "bf16" or "f16" asks a tensor published as FP8 in blocks for
     * q * s in that dtype, from its FP8 bytes and the scales of the blocks
     * the shard meets (lossy with respect to the trainer's weights; the
     * shard need not hold whole blocks; rows contiguous). Refused
     * (FERRY_EINVAL) for a tensor not published as FP8, and by the
     * subscriber and sparse updates (FERRY_ENOTSUP). */
    const char *dequantize;
    uint64_t reserved[2];   /* zero: room for fields to come */
} ferry_param_shard;

typedef struct ferry_update_stats {
    uint64_t generation;
    uint64_t bytes_read;          /* from the store */
    uint64_t ranges;              /* byte ranges read */
    uint64_t tensors;
    uint64_t bytes_pushed;        /* single-pull: written into other workers' parameters */
    uint64_t bytes_received;      /* single-pull: pushed into this worker's parameters */
    uint64_t group_bytes_read;    /* single-pull: the whole group's store reads */
    double prepare_s, read_s, push_s;
    /* (docs/weights.md, "Counters") Single-pull only unless said;
     * 0 elsewhere. Phases: prepare_s covers the manifest and leases and the
     * demand exchange; read_s is the time inside store reads (summed over
     * batches); push_s runs from the end of the last read to the end of the
     * forwards (what the pushes cost beyond the reads they overlap). */
    double exchange_s;            /* demands to the KV, barrier, every demand read back
                                   * (inside prepare_s) */
    double plan_s;                /* planning (or reusing the last plan) */
    double forward_s;             /* from the end of this worker's own reads and pushes to
                                   * the last byte forwarded to it and by it (inside push_s;
                                   * forwards also run earlier, between read batches) */
    double barrier_s;             /* the post-apply barrier */
    double apply_s;               /* reads + pushes + forwards, wall */
    uint64_t batches;             /* this worker's read batches (pipelined with its pushes) */
    /* The whole group's plan (every worker computes the same plan, so every
     * worker reports the same figures): */
    uint64_t group_pushed_cross;  /* pushed from one node to another (each byte once per
                                   * other node holding a consumer) */
    uint64_t group_pushed_intra;  /* pushed between workers of one node, forwards included */
    uint32_t nodes;               /* distinct nodes of the group (ferry_subscriber_nodes) */
    uint64_t nic_max_in, nic_max_out;    /* the busiest node's NIC, each direction */
    double nic_mean_in, nic_mean_out;    /* mean over the group's nodes */
    /* The membership this update ran with (docs/weights.md,
     * "Elastic groups"): fixed groups report epoch 0, members = world and
     * position = rank; elastic ones the epoch's number, its size and this
     * worker's place in it. */
    uint64_t epoch;
    uint32_t members, position;
    uint64_t faults;              /* minor page faults the process took during the
                                   * call, every thread's (docs/weights.md, "Warm memory") */
    double total_s;               /* the call's wall time: prepare_s + plan_s +
                                   * apply_s + barrier_s cover it (single-pull) */
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_update_stats;

/* Parameter-direct update, each worker reading its own demand from the
 * store: the active generation's manifest is fetched and checked, every
 * shard's bytes are read with get_into_ranges straight into dst (runs of a
 * contiguous inner dimension; other strides through a staging buffer), and
 * every range's byte count is verified. *generation (in: the worker's
 * current one) is set to the active generation; nothing is read when it is
 * already current (return 0, stats.bytes_read 0). Errors name the tensor:
 * FERRY_ENOENT (not in the generation), FERRY_ERANGE (a box outside it),
 * FERRY_ELOST (a node holding part of it died). On an error during the
 * reads the parameters may be partly written: FERRY_EREBUILD (rebuild them
 * with a full update). Each worker reads its own demand: for a group, the
 * single-pull update below reads each byte once for all of its workers. */
FERRY_API int ferry_weights_update_direct(ferry_store *s, const char *model, uint64_t *generation,
                                          const ferry_param_shard *shards, size_t n,
                                          ferry_update_stats *st, ferry_error *err);

/* Compatibility update: every tensor of the active generation, whole and
 * checksum-verified, handed to fn(ctx, entry, data) in manifest order (data
 * valid during the call) — the shape of a load_weights(iterable) loader.
 * A non-zero return from fn stops the update with that code. */
typedef int (*ferry_weights_tensor_fn)(void *ctx, const ferry_weight_entry *e, const void *data);
FERRY_API int ferry_weights_update_compat(ferry_store *s, const char *model, uint64_t *generation,
                                          ferry_weights_tensor_fn fn, void *ctx, ferry_update_stats *st,
                                          ferry_error *err);

/* ---- single-pull update of a rollout group ------------------------------------------ */

/* The workers of a rollout group update together: their demands (shards)
 * are merged per tensor into disjoint byte ranges (shared ones cut into
 * 4 MiB pieces); each range is read from the store exactly once, by one
 * worker that needs it (chosen to balance the NIC load of the workers'
 * nodes: a deterministic choice every worker makes alike, reused across
 * generations while the demands stay), straight into its own parameters,
 * and pushed one-sided by the engine into the parameters of the other
 * workers that need it — once per other node, to one worker there that
 * forwards it to the rest of its node — each push followed by a
 * notification. Data-parallel replicas therefore cost the store one read
 * per byte, not one per replica, and a node's NIC one transfer per byte. */
typedef struct ferry_subscriber ferry_subscriber;
typedef struct ferry_subscriber_config {
    char model[128];
    char group[64];          /* the rollout group: every member passes the same */
    uint32_t rank, world;    /* this worker of the group; world 0: an elastic group, whose
                              * membership lives in the store (rank ignored; docs/weights.md,
                              * "Elastic groups") */
    uint64_t timeout_ms;     /* barriers and notifications (default FERRY_DEFAULT_TIMEOUT_MS) */
    uint32_t node;           /* this worker's node (any id; 0 for all: one node). Readers
                              * are chosen to balance every node's NIC load, and a range
                              * crosses to another node once, then is forwarded there */
    uint64_t batch_bytes;    /* apply runs in batches of about this many bytes
                              * of this worker's reads: the pushes of batch k are in flight
                              * (and forwarded inside the other nodes as they land) while
                              * batch k+1 is read, at most two batches at once (0: 64 MiB;
                              * a batch holds at least one range; shared ranges are 4 MiB
                              * pieces) */
    uint64_t local_segment;  /* the store segment on this worker's node (0: unknown).
                              * Exchanged with the demands: a tensor stored on a segment that
                              * members of node X named lives on X, so it is read by a worker
                              * on X where the NIC loads allow it, and that read counts as
                              * inside the node (not NIC in); tensors on a segment nobody
                              * named (or named from two nodes) count as off every node */
    char member[64];         /* elastic groups (world 0): this member's name in
                              * errors and in the group's records ("": "HOST:PID") */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_subscriber_config;

/* Every field of *cfg to its default (timeout_ms FERRY_DEFAULT_TIMEOUT_MS,
 * batch_bytes 64 MiB, the rest empty or 0). A zeroed config is taken the
 * same way: a 0 timeout_ms or batch_bytes is its default. */
FERRY_API int ferry_subscriber_config_init(ferry_subscriber_config *cfg);

/* The worker's shards are copied; their buffers stay the caller's and must
 * stay valid until close (they are registered for remote writes, and the
 * registrations are reused across updates while address and size stay). */
FERRY_API int ferry_subscriber_open(ferry_store *s, const ferry_subscriber_config *cfg,
                                    const ferry_param_shard *shards, size_t n, ferry_subscriber **out,
                                    ferry_error *err);
/* Update to the active generation with the whole group: prepare (manifest,
 * leases), exchange demands (KV + barrier; every worker must agree on the
 * generation, else FERRY_ESTATE and all stay), read this worker's ranges
 * and push them as a pipeline of batches (cfg.batch_bytes), forward what
 * lands for its node, wait for every push aimed at it, post-apply barrier;
 * then *generation advances. A failed read anywhere is reported to the
 * workers it would have fed (those that got all their bytes before it are
 * not affected): they return FERRY_EREBUILD (rebuild with a full update).
 * Every member calls it.
 * Elastic groups (cfg.world 0): open registers the member under the group
 * in the store and starts a thread of the subscriber's own that keeps an
 * arrival parked at the member's liveness barrier (it uses the store until
 * close); close withdraws both. Each update runs with the members
 * registered at its prepare (a membership epoch every one of them agrees
 * on; members that died are dropped, new ones included, positions are the
 * places in the epoch's list). A member that arrives while an update of
 * the group is in flight waits (up to timeout_ms) for it to end and then
 * takes the next one: FERRY_ETIMEDOUT naming the update it waited for. A
 * member whose shards conflict with the generation's layout is refused
 * (its error names it and the tensor; it leaves the group) and the others
 * go on without it in the same call. */
FERRY_API int ferry_subscriber_update(ferry_subscriber *sub, uint64_t *generation, ferry_update_stats *st,
                                      ferry_error *err);
FERRY_API void ferry_subscriber_close(ferry_subscriber *sub);

/* Per node of the group, what the last update's plan moved (the same on
 * every worker): NIC bytes are cross-node only; the store counts as off
 * every node, so every store read crosses the reader's NIC. */
typedef struct ferry_update_node {
    uint32_t node;                /* the id the members passed in ferry_subscriber_config.node */
    uint32_t workers;             /* members on it */
    uint64_t store_read;          /* bytes its workers read from the store */
    uint64_t pushed_in;           /* pushed to it from other nodes */
    uint64_t pushed_out;          /* pushed from it to other nodes */
    uint64_t pushed_intra;        /* pushed between (or inside) its workers, forwards included */
    uint64_t nic_in, nic_out;     /* store_read + pushed_in; pushed_out */
} ferry_update_node;
/* Fill out[0..cap) in ascending node id with the last update's figures;
 * returns the number of nodes (which may exceed cap: call again with more
 * room), 0 before any update that planned. FERRY_EINVAL for a NULL sub or
 * a NULL out with cap > 0. */
FERRY_API int ferry_subscriber_nodes(const ferry_subscriber *sub, ferry_update_node *out, size_t cap);

/* ---- standby copies: updates without pausing inference (docs/weights.md,
 * "Standby copies") ---------------------------------------------------------------------- */

/* One copy of a subscriber's parameters: which one, the generation it
 * holds, and shard i's buffer in it. */
typedef struct ferry_standby_view {
    uint32_t copy;                /* 0: the shards' dst buffers; 1: the standby buffers */
    uint64_t generation;          /* the generation the copy holds (0: what it held at open) */
    void *const *bufs;            /* n entries: shard i's buffer in this copy (the caller's
                                   * pointers, borrowed until close) */
    size_t n;
} ferry_standby_view;

/* Called by ferry_subscriber_update on the updating thread after a flip,
 * before the update returns: v is the new active copy (valid during the
 * call; v->bufs until close). */
typedef void (*ferry_standby_flip_fn)(void *ctx, const ferry_standby_view *v);

/* ferry_subscriber_open with a standby copy of every shard: standby[i] is
 * a second buffer for shards[i], with the same layout (its box, strides
 * and dst_bytes). Copy 0 (the dst buffers) is active at open. Each update
 * writes the standby copy only — it is what the demand record advertises,
 * so the other members push into it — and after the post-apply barrier
 * (every byte landed on every member) the subscriber flips: the standby
 * copy becomes active, on_flip (may be NULL) is called, and the next
 * update writes the other copy. A failed update never flips: the active
 * copy is untouched and keeps its generation (the error says so).
 * Before writing a copy, an update waits (at most half of cfg.timeout_ms,
 * so that the group hears why before its own barrier wait ends) until no
 * reader holds it (ferry_subscriber_read_begin); on a timeout it fails
 * with FERRY_ETIMEDOUT before anything is written, and so does the group.
 * Both copies are the caller's, registered once each and reused, and
 * must stay valid until close; they must not overlap (FERRY_EINVAL at
 * the first update, naming the shard). Costs twice the shards' memory.
 * Dense updates only: ferry_sparse_update needs the base in the buffer it
 * applies to, which the standby copy does not hold (docs/weights.md). */
FERRY_API int ferry_subscriber_open_standby(ferry_store *s, const ferry_subscriber_config *cfg,
                                            const ferry_param_shard *shards, void *const *standby, size_t n,
                                            ferry_standby_flip_fn on_flip, void *ctx,
                                            ferry_subscriber **out, ferry_error *err);

/* An overlapped update (docs/weights.md, "Overlapped updates"): take
 * generation `next` while the trainers may still be publishing it. Every
 * member of a standby group (ferry_subscriber_open_standby, a fixed
 * group, not compatibility mode) calls it with the same next. In the
 * steady state — next keeps the layout of the generation the group took
 * last — the group exchanges its demands and plans at once, on the held
 * generation's layout, reads each byte as soon as every trainer rank has
 * stored its part of next, pushes as an update does, all into the standby
 * copy; then member 0 checks that every member's apply succeeded, that no
 * trainer rank's attempt failed during the reads, and that next was
 * announced with the layout and checksums the reads followed, and the
 * group flips (*overlapped true). Otherwise — a group's first update, a
 * changed layout, a failed attempt meanwhile, a newer generation
 * announced instead — nothing flips and every member falls back to a
 * plain update once next is announced (*overlapped false; the reason is
 * logged at info level). A generation never announced is never flipped
 * to: FERRY_ETIMEDOUT after cfg.timeout_ms, the active copy untouched.
 * Other subscribers (no standby copies, elastic groups, compatibility
 * mode) wait for next's announcement and update plainly. overlapped and
 * st may be NULL. Errors as ferry_subscriber_update. */
FERRY_API int ferry_subscriber_update_next(ferry_subscriber *sub, uint64_t next, uint64_t *generation,
                                           bool *overlapped, ferry_update_stats *st, ferry_error *err);

/* A reader of the active copy: pins it (lock-free: two atomic operations
 * and a re-check) and fills *v; until ferry_subscriber_read_end(sub, v)
 * no update writes into that copy, so every element read through v->bufs
 * is of v->generation. A flip meanwhile makes later read_begin calls see
 * the new copy; the pinned one stays whole. Any number of threads may
 * read at once, concurrently with the update. Hold a pin for one step of
 * inference, not across updates: the next update waits for it. Close the
 * subscriber only once no reader holds a pin or will take one.
 * FERRY_EINVAL for a NULL argument or a subscriber opened without standby
 * copies (read_end then does nothing). */
FERRY_API int ferry_subscriber_read_begin(ferry_subscriber *sub, ferry_standby_view *v);
FERRY_API void ferry_subscriber_read_end(ferry_subscriber *sub, const ferry_standby_view *v);

/* The active copy, without pinning it (for the thread that runs the
 * updates, or a caller that keeps readers off the standby copy itself,
 * e.g. by swapping pointers in on_flip between inference steps). */
FERRY_API int ferry_subscriber_active_view(const ferry_subscriber *sub, ferry_standby_view *v);

/* ---- sparse generations (docs/sparse.md, "Sparse generations") ---------------------------- */

/* What an announcement of a sparse generation did. */
typedef struct ferry_sparse_announce_stats {
    uint64_t objects;                /* sparse objects of the generation */
    uint64_t nnz;                    /* their entries, summed */
    uint64_t dense_generation;       /* the dense generation the chain starts at */
    uint32_t chain;                  /* generations of the chain, the dense one and this included */
    uint64_t removed_generations;    /* retention: generations retired by this announcement */
    double announce_s;
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_sparse_announce_stats;

/* Announce sparse generation `generation` of model: the delta base ->
 * generation made of the sparse objects keys[0..nkeys) (ferry_put_sparse_object,
 * each of base `base` and delta `generation`; nkeys 0: nothing changed).
 * One compare-and-swap of the model's active key, the same one a dense
 * publish makes: the active generation advances to `generation`, and its
 * generation text (which the announced digest covers) records its base,
 * the base's digest and the dense generation its chain starts at. Then
 * retention as for ferry_publish (`keep`, 0: 2), widened so that the
 * chain from the dense generation to this one stays whole; a retired
 * sparse generation's objects are removed with it.
 * Refused before anything is written: FERRY_ESTATE when `base` is not the
 * active generation (the sentence names both) or another announcement
 * wins the compare-and-swap; FERRY_EINVAL for a key that is not a sparse
 * object of (base, generation), a tensor the dense generation does not
 * have or has in another shape, a key named twice, generation <= base, or
 * a chain that would pass FR_SGEN_CHAIN_MAX (64) generations (publish a
 * dense one); FERRY_ENOENT for a missing object. Called by one process
 * (the trainers' coordinator) once every rank's objects are stored. */
FERRY_API int ferry_sparse_announce(ferry_store *s, const char *model, uint64_t base, uint64_t generation,
                                    const char *const *keys, size_t nkeys, uint32_t keep,
                                    ferry_sparse_announce_stats *st, ferry_error *err);

/* One sparse generation of a chain: the delta base -> generation. */
typedef struct ferry_sparse_link {
    uint64_t generation, base;
    char **keys;                     /* its objects */
    size_t nkeys;
} ferry_sparse_link;

/* What a worker holding `held` needs to reach the active generation. */
typedef struct ferry_sparse_chain {
    uint64_t active;                 /* the active generation */
    uint64_t dense;                  /* the dense generation the active chain starts at (the
                                      * active one when it is dense) */
    bool load_dense;                 /* load `dense` whole first: the worker holds no
                                      * generation of the chain (fresh, older, or off it) */
    ferry_sparse_link *links;        /* then apply these, in order (none: dense, or current) */
    size_t nlinks;
} ferry_sparse_chain;

/* The rule (docs/sparse.md): the active chain is D -> g1 -> ... -> gk, D
 * dense. A worker holding D or some gi applies the links after it; any
 * other worker (0: fresh) loads D whole, then applies every link; a worker
 * holding the active generation needs nothing. FERRY_ESTATE when held is
 * newer than the active generation; FERRY_ENOENT when nothing is active;
 * FERRY_ELOST naming the generation when a link's text is gone;
 * FERRY_ECORRUPT when a link does not match the digest that names it.
 * Free with ferry_sparse_chain_free (NULL ok). */
FERRY_API int ferry_sparse_chain_resolve(ferry_store *s, const char *model, uint64_t held,
                                         ferry_sparse_chain *out, ferry_error *err);
FERRY_API void ferry_sparse_chain_free(ferry_sparse_chain *c);

/* The announced generation (*generation) and whether it is a sparse one
 * (*sparse), in one round trip and without reading its text: what a worker
 * of a group checks before it joins the group's dense update (a sparse
 * generation is followed by each worker alone, ferry_sparse_update).
 * FERRY_ENOENT when nothing is announced. A sparse generation announced by
 * a library older than this call reads as dense here; the group's update
 * then refuses it (FERRY_ESTATE, "is a sparse delta"). */
FERRY_API int ferry_sparse_active(ferry_store *s, const char *model, uint64_t *generation,
                                  bool *sparse, ferry_error *err);

typedef struct ferry_sparse_update_config {
    char model[128];
    uint32_t axis_index;             /* this worker's index of the placement axis (its EP rank):
                                      * OWNER objects reach only the matching index */
    bool no_dense;                   /* never load a dense generation: a worker that is not on
                                      * the active chain is refused (FERRY_ESTATE), nothing applied */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_sparse_update_config;

/* Every field of *cfg to its default (every field empty or 0). */
FERRY_API int ferry_sparse_update_config_init(ferry_sparse_update_config *cfg);

typedef struct ferry_sparse_update_stats {
    uint64_t generation;             /* held after the call */
    uint64_t dense_generation;       /* loaded whole first (0: none) */
    uint64_t dense_bytes, dense_ranges;
    uint64_t deltas;                 /* sparse generations applied */
    uint64_t entries_applied;
    ferry_sparse_stats read;         /* the chain's sparse reads, summed */
    double resolve_s, read_s, dense_s, apply_s;
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_sparse_update_stats;

/* Bring a worker's shards (boxes of the published tensors, each with its
 * buffer and element strides: a slice of a larger parameter, one part of a
 * fused one, a transposed view; ferry_param_shard, in the published dtype)
 * from *generation to the active generation by the rule of
 * ferry_sparse_chain_resolve. Every link's objects are read for the
 * shards' boxes and every delta's base checked against the generation it
 * will be applied to before anything is written; then the dense
 * generation is loaded (when the rule says so) and the deltas applied in
 * order. Nothing is read when *generation is the active one. Refused with
 * nothing written: a shard naming a tensor the chain's dense generation
 * lacks (FERRY_ENOENT), a box outside its tensor (FERRY_ERANGE), a
 * buffer too small or strides that overlap (FERRY_EINVAL), an off-chain
 * worker with cfg->no_dense (FERRY_ESTATE), a failed read. A failure
 * after the first write (a dense read failing midway): FERRY_EREBUILD.
 * On success *generation is the active one. */
FERRY_API int ferry_sparse_update(ferry_store *s, const ferry_sparse_update_config *cfg,
                                  const ferry_param_shard *shards, size_t n, uint64_t *generation,
                                  ferry_sparse_update_stats *st, ferry_error *err);

/* ---- deltas from a trainer (docs/sparse.md, "Deltas from a trainer") ---------------------- */

/* Defaults of ferry_delta_config. */
#define FERRY_DELTA_CROSSOVER 0.05   /* changed fraction above which a generation goes dense */
#define FERRY_DELTA_CHAIN 8u         /* deltas after a dense generation at most (K) */
#define FERRY_DELTA_CHAIN_MAX 62u    /* the most a config may ask (a chain holds 64 at most) */

typedef struct ferry_delta_config {
    double crossover;        /* a generation whose changed fraction (changed elements over
                              * every rank's elements) is above it is published dense;
                              * >= 1: only the chain rule and a missing snapshot make one */
    uint32_t max_chain;      /* K, 1..FERRY_DELTA_CHAIN_MAX: after K deltas the next
                              * generation is dense, so a fresh rollout replays at most K */
    uint64_t reserved[8];    /* zero (the init zeroes it; the library refuses anything else):
                              * room for fields to come, docs/design.md "Growth" */
} ferry_delta_config;

/* Every field of *cfg to its default (crossover FERRY_DELTA_CROSSOVER,
 * max_chain FERRY_DELTA_CHAIN). A zeroed config is taken the same way. */
FERRY_API int ferry_delta_config_init(ferry_delta_config *cfg);

/* A trainer rank's delta encoder: what this rank last published, in the
 * rollout dtype (its snapshot: one copy of the pieces it stores, the
 * bytes of its part of a dense generation), and the chain it is on. One
 * call at a time on an encoder; encoders share nothing. */
typedef struct ferry_delta_encoder ferry_delta_encoder;

/* An encoder for rank pc->rank of pc->world publishing pc->model (the
 * publisher config of ferry_publish_shards: out_dtype, segment, keep,
 * timeout_ms, rank_node; copied). Empty: its first publish is dense.
 * Refused with FERRY_EINVAL and a sentence, nothing opened (*out NULL): a
 * bad publisher config (quantization rules included: deltas are not
 * quantized), a reserved word of dc that is not zero, max_chain
 * above FERRY_DELTA_CHAIN_MAX, a negative or NaN crossover. No store call. */
FERRY_API int ferry_delta_encoder_open(const ferry_publisher_config *pc, const ferry_delta_config *dc,
                                       ferry_delta_encoder **out, ferry_error *err);
/* Forget the snapshot (its memory is freed): the next publish is dense and
 * takes whatever layout it is given. For a rank whose layout changed. */
FERRY_API void ferry_delta_encoder_reset(ferry_delta_encoder *e);
/* The bytes the encoder holds for its snapshot (0 when empty). */
FERRY_API uint64_t ferry_delta_encoder_bytes(const ferry_delta_encoder *e);
/* NULL ok. */
FERRY_API void ferry_delta_encoder_close(ferry_delta_encoder *e);

/* How a generation went. */
enum ferry_delta_kind {
    FERRY_DELTA_SPARSE = 0,          /* a sparse generation on the last one */
    FERRY_DELTA_DENSE_FIRST = 1,     /* dense: a rank had no snapshot (a first publish,
                                      * a reset, a restart, another publisher meanwhile) */
    FERRY_DELTA_DENSE_FRACTION = 2,  /* dense: the changed fraction was above the crossover */
    FERRY_DELTA_DENSE_CHAIN = 3,     /* dense: the chain held max_chain deltas already */
};

typedef struct ferry_delta_stats {
    enum ferry_delta_kind kind;      /* the same on every rank */
    uint32_t chain;                  /* deltas since the dense generation, this one included
                                      * (0: this one is dense) */
    uint64_t elements, changed;      /* this rank's: elements it stores, of them changed (all
                                      * of them when it had no snapshot to compare with) */
    uint64_t total_elements, total_changed;   /* every rank's */
    uint64_t compared_bytes;         /* bytes of this rank's pieces compared (as held) */
    uint64_t objects, nnz;           /* sparse: objects this rank put as owner, their entries */
    uint64_t stored_bytes;           /* bytes this rank stored: its sparse objects' indices
                                      * and values, or its dense pieces */
    uint64_t part_bytes;             /* entries this rank handed to other owners */
    double encode_s;                 /* compare and encode (0 when not compared) */
    double encode_gbps;              /* compared_bytes / encode_s / 1e9 */
    double exchange_s;               /* the counts to every rank and the decision */
    double store_s;                  /* parts, objects (sparse) or the dense publish's put_s */
    double commit_s;                 /* meeting, announcing (or the dense publish's rest) */
    double snapshot_s;               /* bringing the snapshot to the new generation */
    double total_s;
    ferry_publish_stats dense;       /* the dense publish's own figures (kind != SPARSE) */
    uint64_t sampled;                /* this rank's elements of the first look (a sample of
                                      * every piece); a generation that went dense by it
                                      * reports changed and total_changed as the sample's
                                      * share */
    uint64_t reserved[7];   /* zeroed by the library: room for fields to come */
} ferry_delta_stats;

/* Publish `generation` from the pieces this rank holds (the arguments of
 * ferry_publish_shards: the whole world's placement, this rank's
 * fragments' data), as a sparse delta on the generation this encoder last
 * published when that is cheaper, else dense. Every rank of the world
 * calls it with its encoder.
 *
 * Each rank converts its copy-0 pieces to the rollout dtype and compares
 * them bit for bit with its snapshot (AVX2 where the CPU has it, else a
 * portable path with the same output): first a sample (every 16th chunk),
 * whose counts meet at a barrier, then — unless that decided — everything,
 * whose exact counts meet at a second one; every rank takes the same
 * decision: dense (ferry_publish_shards, the snapshot refilled) when a
 * rank has no snapshot, the chain holds max_chain deltas, or the changed
 * fraction is above the crossover (by the sample when it is above twice
 * the crossover); otherwise sparse. Sparse: each tensor has one
 * owner (the rank holding all of it, else a byte-balanced choice,
 * ferry_weights_assign); every rank hands the changed elements of
 * tensors it does not own to their owners as one part object per owner
 * on its own segment (changed elements only, never dense bytes); each
 * owner puts one sparse object per changed tensor — global coordinates,
 * the new values in the rollout dtype, scatter_set: exact — and rank 0
 * announces them with ferry_sparse_announce once every rank stored its
 * objects. Every rank gets the same answer.
 *
 * Refused on every rank with nothing stored (FERRY_EINVAL "delta publish
 * of M generation G failed: rank R: <why>"): a rank whose pieces differ
 * from the layout of its snapshot (a tensor's name, dtype or shape, a
 * piece's box; reset its encoder and publish dense), a piece without
 * data, a rollout dtype other than f32/bf16/f16, an encoder whose
 * crossover or max_chain differs from rank 0's. A rank failing after
 * others stored: the generation is not announced; every live rank removes
 * what it stored; what a dead rank left (objects on the base generation)
 * is removed by the owners at the next publish (docs/sparse.md). The
 * snapshot moves only when the generation was announced.
 * st may be NULL. */
FERRY_API int ferry_delta_publish(ferry_store *s, ferry_delta_encoder *e, uint64_t generation,
                                  ferry_manifest *placement, const ferry_shard_data *mine, size_t n,
                                  ferry_delta_stats *st, ferry_error *err);

#ifdef __cplusplus
}
#endif
#endif
