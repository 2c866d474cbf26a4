/* ferry weight updates, compatibility mode through single-pull: every
 * worker of a rollout group receives every full tensor of the active
 * generation (for an existing load_weights(name, tensor) loader) while the
 * store serves each published byte once (docs/weights.md, "Compatibility
 * mode, single-pull").
 *
 * It is the single-pull group update (weights.h, ferry_subscriber_*) with
 * whole-tensor targets: the staging buffer holds the model batch by batch,
 * each batch is one round of the group update whose shards are its
 * tensors whole, so each tensor is read once, by the reader the group's
 * assignment picks (balancing the nodes' NIC loads; every worker computes
 * the same), and written once into the staging of one worker on every
 * other node, which forwards it to the other workers of its node. Inside
 * a node, over shm, nothing is written: the node-mates load the tensor
 * from the sender's staging through a read-only view (ferry_remote_map;
 * READ where no view can be made). The tensor's checksums from the
 * manifest are verified by whoever brings it onto a node,
 * and every worker hands it to the loader callback, in manifest order. */
#ifndef FERRY_WEIGHTS_COMPAT_H
#define FERRY_WEIGHTS_COMPAT_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_compat_group ferry_compat_group;

typedef struct ferry_compat_config {
    char model[128];
    char group[64];          /* the rollout group: every member passes the same; no '/' */
    uint32_t rank, world;    /* this worker of the group */
    uint32_t node;           /* this worker's node (any id; the same for all: one node) */
    uint64_t staging_bytes;  /* this worker's staging buffer (0: 256 MiB); at least the
                              * largest tensor, else an update fails with FERRY_EMSGSIZE
                              * on every worker; tensors travel in batches that fit */
    uint64_t timeout_ms;     /* barriers and notifications (default FERRY_DEFAULT_TIMEOUT_MS) */
    uint64_t local_segment;  /* the store segment on this worker's node (0:
                              * unknown). A tensor stored on a segment that members of node X
                              * named is led by a worker on X (its read stays inside the
                              * node); the others are balanced over all nodes as before */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_compat_config;

/* Every field of *cfg to its default (staging_bytes 256 MiB, timeout_ms
 * FERRY_DEFAULT_TIMEOUT_MS, the rest empty or 0). A zeroed config is taken
 * the same way: a 0 staging_bytes or timeout_ms is its default. */
FERRY_API int ferry_compat_config_init(ferry_compat_config *cfg);

typedef struct ferry_compat_stats {
    uint64_t generation;
    /* this worker */
    uint64_t tensors, bytes;        /* handed to the callback */
    uint64_t tensors_led;           /* tensors it led (read from the store) */
    uint64_t bytes_read;            /* its store reads */
    uint64_t bytes_sent_cross;      /* WRITEs that landed on another node's worker */
    uint64_t bytes_sent_intra;      /* WRITEs that landed on a worker of its node */
    uint64_t bytes_received;        /* WRITEs that landed in its staging */
    uint32_t batches;               /* staging batches of the update */
    uint32_t imported;              /* remote staging regions imported (0: all reused) */
    /* the group's plan (the same on every worker) */
    uint64_t group_bytes_read;      /* = the published bytes: each read once */
    uint64_t group_cross_bytes;     /* = (nodes - 1) x published: one WRITE per remote node */
    uint64_t group_intra_bytes;     /* = (workers - nodes) x published: the fan-out */
    uint32_t nodes;
    /* phases (s): prepare (manifest, objects checked and leased) and the
     * exchange (KV record + barrier + every record read) before anything
     * moves; then per batch: reads (store, summed), waiting for notifications
     * and forwarding, checksums, the callback, the batch barriers (and the
     * abort check); apply is the wall time of all batches */
    double prepare_s, exchange_s, plan_s, read_s, wait_s, verify_s, load_s, barrier_s, apply_s;
    double total_s;
    /* the pipeline: staging_slots is 2 when the staging is split
     * in two halves (batch k in half k % 2; the reads and sends of batch k+1
     * go out while batch k is still forwarded, verified and loaded, and a
     * half is written again only after every worker finished the batch it
     * held), 1 when the largest tensor needs more than half; pipelined_batches
     * counts the batches whose reads and sends went out before the previous
     * batch was finished (batches - 1 with two halves) */
    uint32_t staging_slots;
    uint32_t pipelined_batches;
    /* bytes this worker handed to the loader straight from the
     * staging of a worker of its node (over shm) through a read-only view:
     * no WRITE into its own staging. bytes_received counts what landed in
     * its own staging (WRITEs from other nodes, and READs where no view
     * could be made). */
    uint64_t bytes_viewed;
    uint64_t faults;                /* minor page faults the process took during the
                                     * call, every thread's (docs/weights.md, "Warm memory") */
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_compat_stats;

/* Allocate and register this worker's staging buffer (shm-mappable,
 * remote-writable) with the store client's engine; it is reused across
 * updates until close. It leaves this worker's record (its staging's
 * descriptor) for the others' warm-ups; the group meets at the first
 * update (or ferry_compat_group_warm).
 * FERRY_EINVAL for bad arguments (world 0, rank >= world, empty model or
 * group, a '/' in the group), FERRY_ENOMEM. */
FERRY_API int ferry_compat_group_open(ferry_store *s, const ferry_compat_config *cfg,
                                      ferry_compat_group **out, ferry_error *err);

/* The group's part of the documented warm-up (docs/weights.md, "Warm
 * memory"), once after open, off the critical path; every member calls it.
 * It leaves this worker's record, meets the others (a barrier, at most
 * cfg.timeout_ms), imports the members' staging regions, makes
 * and touches the read-only views of the staging of this worker's
 * node-mates that the first update would otherwise make and touch while
 * the loader waits, and writes through its own staging once (populated
 * memory too: on a VM the first write of each page costs a first touch,
 * 20-50x a warm copy). *bytes (may be NULL): the bytes touched, its own
 * staging and the views.
 * FERRY_ETIMEDOUT when a member did not arrive in time; what could not be
 * imported or mapped is left to the update, which does it as without a
 * warm-up. */
FERRY_API int ferry_compat_group_warm(ferry_compat_group *g, uint64_t *bytes, ferry_error *err);

/* Update to the active generation with the whole group (every member
 * calls it; a worker already at the active generation returns 0 at once,
 * so members are kept at the same generation). fn(ctx, entry, data) gets
 * every tensor whole and checksum-verified, in manifest order; data is
 * valid during the call only and read-only (it points into this worker's
 * staging buffer, or into a view of a node-mate's).
 *
 * Prepare (nothing moves, fn is not called): the manifest (digest
 * checked), a share of the objects checked and leased by each worker, the
 * staging size; each worker's verdict goes to the KV and after a barrier
 * every worker reads every verdict: one failure makes every worker return
 * it (FERRY_ENOENT / FERRY_ELOST naming the tensor, FERRY_EMSGSIZE, ...),
 * a member at another generation FERRY_ESTATE; *generation stays.
 * Apply: batches of tensors; a leader's failed read (or checksum), a
 * failed WRITE, a FAILED or missing notification, a checksum mismatch on
 * arrival or a non-zero return of fn stop the update on every worker after
 * that batch: each returns FERRY_EREBUILD (the loader has part of a
 * generation; the message names the tensor and the cause where known), or
 * fn's code on the worker whose fn stopped it. Nobody hangs: every wait
 * ends after timeout_ms. On success *generation advances. */
FERRY_API int ferry_compat_group_update(ferry_compat_group *g, uint64_t *generation,
                                        ferry_weights_tensor_fn fn, void *ctx, ferry_compat_stats *st,
                                        ferry_error *err);

/* Unregister and free the staging buffer. NULL ok. */
FERRY_API void ferry_compat_group_close(ferry_compat_group *g);

#ifdef __cplusplus
}
#endif
#endif
