/* ferry exec data model: runtime binding manifests, attested plans, and
 * lowering of a plan's regions to engine batches. See docs/exec.md.
 *
 * Everything here is pure: no sockets, no engine calls. Lowering produces
 * ferry_op arrays that an executor submits with ferry_submit.
 *
 * Errors follow reshard.h: a negative FERRY_E* code, and when `err` is not
 * NULL the same code and a message naming the fragment at fault.
 *
 * Threads: a binding is built by one thread; once attested it must not be
 * changed (a change makes its digest, and so the attestation, stale). An
 * attested plan is immutable and may be read from any thread.
 */
#ifndef FERRY_EXEC_H
#define FERRY_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"
#include "ferry/engine.h"
#include "ferry/reshard.h"
#include "ferry/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_binding ferry_binding;
typedef struct ferry_attested_plan ferry_attested_plan;

/* ---- runtime binding manifest ------------------------------------------ */

/* Where one placement fragment lives in a live process. Element (i0..in)
 * of the fragment's box sits at byte
 *   addr + (storage_offset + sum(i_d * strides[d])) * itemsize
 * and every such byte lies inside [addr, addr + nbytes). */
typedef struct ferry_binding_entry {
    uint64_t fragment;            /* fragment id in the placement manifest */
    uint64_t addr;                /* base of the local buffer in the holder's address space */
    uint64_t nbytes;              /* bytes of the local buffer */
    uint32_t worker;              /* worker (process / worker group) holding it */
    enum ferry_mem_kind kind;     /* FERRY_MEM_HOST or FERRY_MEM_DEVICE */
    uint32_t itemsize;            /* must equal the tensor's */
    uint32_t ndim;                /* must equal the tensor's */
    uint64_t shape[FERRY_MAX_DIMS];    /* must equal the fragment's box shape */
    uint64_t strides[FERRY_MAX_DIMS];  /* elements; 0 only on dims of extent 1 */
    uint64_t storage_offset;      /* elements */
    uint32_t desc_len;            /* engine endpoint / region descriptor of the holder */
    uint8_t desc[FERRY_DESC_MAX];
} ferry_binding_entry;

/* A binding: the runtime state of one side (source or target) of a
 * reshard at one generation. It holds its own reference to `placement`
 * (frozen from then on) and records the placement's digest. It need not cover every fragment:
 * a process needs entries only for the fragments its operations touch.
 * ferry_binding_free(NULL) is a no-op. */
FERRY_API int ferry_binding_create(ferry_manifest *placement, uint64_t instance_id, uint64_t generation,
                                   uint64_t lease_id, ferry_binding **out, ferry_error *err);
FERRY_API void ferry_binding_free(ferry_binding *b);

/* Add one entry, validated at once against the placement: the fragment
 * exists and has no entry yet; ndim, itemsize and shape match; strides do
 * not alias (0 only on extent-1 dims); every element lies inside nbytes and
 * addr + nbytes does not overflow (all arithmetic overflow-checked); the
 * descriptor fits. The entry is copied. */
FERRY_API int ferry_binding_add(ferry_binding *b, const ferry_binding_entry *e, ferry_error *err);

FERRY_API uint64_t ferry_binding_instance(const ferry_binding *b);
FERRY_API uint64_t ferry_binding_generation(const ferry_binding *b);
FERRY_API uint64_t ferry_binding_lease(const ferry_binding *b);
FERRY_API size_t ferry_binding_count(const ferry_binding *b);
/* Entry i in insertion order, or NULL past the end; owned by the binding. */
FERRY_API const ferry_binding_entry *ferry_binding_entry_at(const ferry_binding *b, size_t i);
/* Entry of placement fragment `fragment`, or NULL. O(log n). */
FERRY_API const ferry_binding_entry *ferry_binding_find(const ferry_binding *b, uint64_t fragment);
/* Digest of the placement the binding was validated against. */
FERRY_API void ferry_binding_placement_digest(const ferry_binding *b, uint8_t out[16]);
/* XXH3-128 of the canonical encoding (docs/exec.md): placement digest,
 * instance, generation, lease, then entries sorted by fragment id. */
FERRY_API void ferry_binding_digest(const ferry_binding *b, uint8_t out[16]);

/* JSON (docs/exec.md). from_json validates every entry against `placement`
 * exactly as ferry_binding_add does and checks the recorded placement
 * digest; errors name the entry and fragment. Text from to_json is freed by
 * the caller with free(); NULL on out-of-memory. */
FERRY_API int ferry_binding_from_json(const char *text, size_t len, ferry_manifest *placement,
                                      ferry_binding **out, ferry_error *err);
FERRY_API char *ferry_binding_to_json(const ferry_binding *b);

/* ---- attested plans ------------------------------------------------------ */

/* Bind `plan` to (source placement digest, target placement digest, source
 * binding digest, target binding digest, generation). Fails when a
 * binding was not validated against the plan's manifest of its side or its
 * generation differs from `generation`. The attested plan holds its own
 * reference to the plan; the bindings are not referenced (only digests are
 * kept). Free with ferry_attested_free (NULL is a no-op). */
FERRY_API int ferry_attest(ferry_plan *plan, const ferry_binding *src, const ferry_binding *dst,
                           uint64_t generation, ferry_attested_plan **out, ferry_error *err);
FERRY_API void ferry_attested_free(ferry_attested_plan *a);
FERRY_API const ferry_plan *ferry_attested_plan_get(const ferry_attested_plan *a);   /* borrowed */
FERRY_API uint64_t ferry_attested_generation(const ferry_attested_plan *a);

/* Check bindings against an attestation before any byte moves:
 * FERRY_ESTALE when a binding's generation or digest differs from the
 * attested one; FERRY_EINVAL when it was validated against a placement
 * that is not the plan's. Either binding may be NULL (not checked), so a
 * process can check the side it holds. */
FERRY_API int ferry_attested_check(const ferry_attested_plan *a, const ferry_binding *src,
                                   const ferry_binding *dst, ferry_error *err);

/* ---- lowering ---------------------------------------------------------- */

enum ferry_exec_mode {
    FERRY_EXEC_READER = 1,   /* the target process READs from source memory */
    FERRY_EXEC_SINK = 2,     /* the source process WRITEs into target memory */
};

/* How the initiator reaches a remote worker: the caller resolves the
 * worker's descriptor with ferry_peer_add / ferry_region_import. */
typedef struct ferry_peer_map {
    uint32_t worker;
    ferry_peer_id peer;
    uint64_t key;            /* remote key of the worker's registered memory */
} ferry_peer_map;

typedef struct ferry_exec_limits {
    uint64_t max_ops;        /* ops per batch, >= 1 */
    uint64_t max_bytes;      /* bytes per batch, >= 1; larger runs are split */
} ferry_exec_limits;

typedef struct ferry_lower_args {
    enum ferry_exec_mode mode;
    const uint32_t *workers;  /* selector: initiating workers whose ops to lower */
    size_t nworkers;          /* >= 1: an empty selector is an error */
    const ferry_peer_map *peers;
    size_t npeers;
    ferry_exec_limits limits;
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_lower_args;

/* Lowered batches: ops of batch i are ops[batch_start[i] .. batch_start[i+1]). */
typedef struct ferry_batch_list {
    ferry_op *ops;
    size_t nops;
    size_t *batch_start;      /* nbatches + 1 entries */
    size_t nbatches;
    uint64_t bytes;
} ferry_batch_list;

/* Lower the ops that the selected workers perform. Runs ferry_attested_check
 * first. Reader mode: initiators are target workers, local = target memory,
 * remote = source memory, peer/key from the source worker's map entry;
 * sink mode the reverse, WRITE ops. Every contiguous run of the local and
 * remote storage becomes one op (split at max_bytes); adjacent ops are
 * merged, and runs of equal length at constant local and remote strides
 * (rows of one region) become one strided op (ferry_op.count > 1) inside
 * one local binding entry. Errors: an empty selector, a selected worker absent from the
 * initiating binding, or a selection with no planned op (FERRY_EINVAL /
 * FERRY_ENOENT); a region whose remote fragment has no binding entry or
 * whose remote worker has no peer mapping (FERRY_ENOENT); overflow
 * (FERRY_ERANGE). On success the caller frees *out with
 * ferry_batch_list_free; on failure *out is empty. */
FERRY_API int ferry_exec_lower(const ferry_attested_plan *a, const ferry_binding *src,
                               const ferry_binding *dst, const ferry_lower_args *args,
                               ferry_batch_list *out, ferry_error *err);
FERRY_API void ferry_batch_list_free(ferry_batch_list *b);

/* Lower one run (a plan's, or ferry_box_lower's copy between two local
 * layouts) between two memories into engine ops: FERRY_OP_WRITE from
 * src_base + src offsets into dst_base + dst offsets (the source
 * initiates), or FERRY_OP_READ of the same bytes (the target initiates:
 * local = dst). The run's innermost loop rides in each op's rows (count,
 * local_stride, remote_stride), its outer loops are unrolled, one op per
 * combination. Appended to (*ops, *n), grown as needed (*cap; free with
 * free()). Pure. FERRY_EINVAL for another opcode, FERRY_ENOMEM (*n kept). */
FERRY_API int ferry_exec_run_ops(const ferry_run *run, enum ferry_opcode opcode, uint64_t src_base,
                                 uint64_t dst_base, ferry_peer_id peer, uint64_t key, ferry_op **ops,
                                 size_t *n, size_t *cap);

/* ---- executors ------------------------------------------------------------- */

/* An allocation guard: a token that keeps one of the caller's allocations
 * (source or target memory) valid while a transfer may touch it. The
 * executor acquires every guard before the first byte moves and releases
 * each only once its transfer reached a terminal state. acquire/release
 * return 0 or a negative error; ids must be distinct. */
typedef struct ferry_guard {
    uint64_t id;
    void *ctx;
    int (*acquire)(void *ctx, uint64_t id);
    int (*release)(void *ctx, uint64_t id);
} ferry_guard;

typedef struct ferry_exec_config {
    enum ferry_exec_mode mode;
    ferry_engine *engine;         /* the initiating process's engine */
    const uint32_t *workers;      /* selector: this process's initiating workers (>= 1) */
    size_t nworkers;
    const ferry_peer_map *peers;  /* how to reach the remote workers the ops touch */
    size_t npeers;
    ferry_exec_limits limits;     /* per batch; 0 fields: 4096 ops, 64 MiB */
    uint32_t window;              /* batches in flight (default 8) */
    int timeout_ms;               /* wait for one batch; on expiry the outcome is UNKNOWN
                                     (default FERRY_DEFAULT_TIMEOUT_MS; < 0: forever) */
    uint64_t notify_tag;          /* sink: after every WRITE landed, one NOTIFY(tag,
                                     generation) to each target peer; 0: none */
    const ferry_guard *guards;    /* tokens for the allocations the ops touch */
    size_t nguards;
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_exec_config;

/* Every field of *cfg to its default (limits 4096 ops and 64 MiB per
 * batch, window 8, timeout_ms FERRY_DEFAULT_TIMEOUT_MS, the rest empty or
 * 0). A zeroed config is taken the same way: a 0 limit, window or
 * timeout_ms is its default. */
FERRY_API int ferry_exec_config_init(ferry_exec_config *cfg);

/* What a run did. Owned arrays are freed by ferry_exec_result_free. */
typedef struct ferry_exec_result {
    enum ferry_ticket_state state;  /* COMPLETED, ABORTED (no byte of any target touched),
                                       FAILED_DRAINED (I/O began; nothing in flight),
                                       UNKNOWN (a batch's wait expired) */
    int error;                      /* first error (0 when COMPLETED) */
    uint64_t bytes, ops, batches;   /* planned for this process */
    uint64_t bytes_done;            /* in batches that completed */
    uint64_t *pending;              /* pending-transfer ids of UNKNOWN batches */
    size_t npending;
    uint64_t *quarantined;          /* guard ids NOT released: their release failed, or
                                       their transfer is UNKNOWN (release them once
                                       ferry_engine_pending no longer lists the ids) */
    size_t nquarantined;
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_exec_result;
FERRY_API void ferry_exec_result_free(ferry_exec_result *r);

typedef struct ferry_executor ferry_executor;

/* An executor for one process: the config is copied (arrays too). */
FERRY_API int ferry_executor_create(const ferry_exec_config *cfg, ferry_executor **out, ferry_error *err);
/* Run the attested plan's ops of the selected workers: check the bindings
 * against the attestation, reject duplicate guard ids, acquire every guard
 * (on a failure: release what was acquired, best effort and complete —
 * failed releases are quarantined — and return ABORTED), register the
 * initiating workers' local memory, lower, and keep `window` batches in
 * flight until all reached a terminal state; then (sink) notify the target
 * peers, release the guards and unregister the local memory. Returns 0
 * when the run's state is COMPLETED, else its error; *res is filled in
 * both cases (free it). Errors before any byte moved (stale binding, bad
 * selector, duplicate guard, guard acquisition) leave state ABORTED. */
FERRY_API int ferry_executor_run(ferry_executor *x, const ferry_attested_plan *a, const ferry_binding *src,
                                 const ferry_binding *dst, ferry_exec_result *res, ferry_error *err);
/* Local memory still registered after a run (a region pinned by an UNKNOWN
 * batch cannot be unregistered): every unregistration is checkpointed at
 * once, an interrupted cleanup marks the executor restart-required, and
 * ferry_executor_cleanup retries only what is still registered — never an
 * address already released. 0 when nothing is left; FERRY_EBUSY while
 * something stays pinned. */
FERRY_API int ferry_executor_cleanup(ferry_executor *x);
FERRY_API bool ferry_executor_restart_required(const ferry_executor *x);
FERRY_API size_t ferry_executor_registered(const ferry_executor *x);
/* Free (after a best-effort cleanup; what stays pinned is left to the
 * engine, which unregisters it at close). NULL is a no-op. */
FERRY_API void ferry_executor_free(ferry_executor *x);

/* ---- push streams --------------------------------------------------------- */

/* The executors' batch lifecycle for a caller that submits batches one at
 * a time, as their bytes become ready, with many in flight, and needs each
 * batch's outcome at a point of its own: the rollout group's pipelined
 * pushes and compatibility mode's WRITEs (docs/exec.md, "Push streams");
 * ferry_executor_run runs its batches through one. The ops come lowered
 * (ferry_exec_run_ops, ferry_exec_lower) against memory the caller
 * registered; the stream registers nothing.
 *
 * open acquires every guard (on a failure: the ones acquired are released,
 * failed releases quarantined, *res says ABORTED, no stream). Each batch
 * is waited for (or tested) by its id; its outcome is tallied: bytes of
 * completed batches, the first error, whether I/O began, and the ticket id
 * of a batch whose wait expired (UNKNOWN: the engine's pending manager
 * keeps it, its peers fenced). close waits for every batch still in flight
 * — nothing stays in flight past it — then releases the guards, or, when a
 * batch was UNKNOWN, releases none (all quarantined: that memory may still
 * be touched), fills *res like ferry_executor_run and frees the stream.
 * One thread per stream. */
typedef struct ferry_exec_stream ferry_exec_stream;

typedef struct ferry_stream_config {
    ferry_engine *engine;
    int timeout_ms;               /* one batch's wait (default FERRY_DEFAULT_TIMEOUT_MS; < 0: forever) */
    const ferry_guard *guards;    /* copied */
    size_t nguards;
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_stream_config;

/* Every field of *cfg to its default (timeout_ms FERRY_DEFAULT_TIMEOUT_MS,
 * the rest 0). A 0 timeout_ms in a zeroed config is its default. */
FERRY_API int ferry_stream_config_init(ferry_stream_config *cfg);

/* res may be NULL (then a failed acquisition's quarantine is not reported). */
FERRY_API int ferry_exec_stream_open(const ferry_stream_config *cfg, ferry_exec_stream **out,
                                     ferry_exec_result *res, ferry_error *err);
/* Submit ops[0..n) as one engine batch (ferry_submit: blocks while the
 * engine's window is full). *id names it until its terminal wait. A batch
 * the engine refuses is not submitted; its error becomes the stream's
 * first error when none was yet. */
FERRY_API int ferry_exec_stream_submit(ferry_exec_stream *s, const ferry_op *ops, size_t n, uint64_t *id);
/* The batch's state: block waits up to the stream's timeout (an expired
 * wait is UNKNOWN), otherwise PENDING is returned while it is in flight.
 * A terminal state is tallied and frees the id; *error (may be NULL) gets
 * the batch's error (0 when COMPLETED, FERRY_ETIMEDOUT when UNKNOWN).
 * FERRY_EINVAL for an id not in flight. */
FERRY_API int ferry_exec_stream_wait(ferry_exec_stream *s, uint64_t id, bool block, int *error);
FERRY_API size_t ferry_exec_stream_inflight(const ferry_exec_stream *s);
/* The stream's first error (0 while none); err (may be NULL), when there is
 * one, gets its sentence: the refused submit's op, or the failed batch's
 * first failed op, peer and cause (ferry_ticket_error), or the batch whose
 * outcome became unknown. Left alone while there is none. */
FERRY_API int ferry_exec_stream_error(const ferry_exec_stream *s, ferry_error *err);
/* Record a failure of the caller's part of the work (out of memory before
 * a submit) as the first error when none was yet. */
FERRY_API void ferry_exec_stream_fail(ferry_exec_stream *s, int code);
/* Returns 0 when every batch completed and no failure was recorded, else
 * the first error; *res (may be NULL) as for ferry_executor_run: state
 * COMPLETED, ABORTED (no batch began I/O), FAILED_DRAINED or UNKNOWN;
 * bytes, ops, batches submitted, bytes_done, pending, quarantined. s is
 * freed; NULL is FERRY_EINVAL. */
FERRY_API int ferry_exec_stream_close(ferry_exec_stream *s, ferry_exec_result *res);

/* The workers on the other side that the given workers exchange bytes
 * with under the plan (a passive sink target uses it to know how many
 * sources will notify it). Writes up to cap ids, ascending, into out;
 * *n = how many there are. */
FERRY_API int ferry_exec_counterparts(const ferry_attested_plan *a, const ferry_binding *src,
                                      const ferry_binding *dst, bool of_target, const uint32_t *workers,
                                      size_t nworkers, uint32_t *out, size_t cap, size_t *n,
                                      ferry_error *err);

/* ---- store reads ------------------------------------------------------------ */

/* A plan whose source is a stored generation (fragments packed into store
 * objects) is executed by the target with strided store reads, straight
 * into the target binding's memory (docs/exec.md, "Store reads"). The
 * source binding of such a plan is an empty binding of the stored
 * placement at the generation: the attestation binds the generation and
 * the target binding; no source memory is addressed.
 *
 * One strided read: `count` rows of `len` bytes, row i from byte
 * src_offset + i * src_stride of the source (the object `key`, or, when
 * key is NULL, the packed bytes of src_fragment, found by the locate
 * callback at run time: a generation's object keys change from one
 * generation to the next while its plan stays) into dst + i * dst_stride. */
typedef struct ferry_store_read {
    uint64_t src_fragment, dst_fragment;
    const char *key;                /* the run's src_object (valid while the plan lives), or NULL */
    uint64_t src_offset;
    void *dst;
    uint64_t len, count, src_stride, dst_stride;
} ferry_store_read;

typedef struct ferry_store_reads {
    ferry_store_read *v;
    size_t n, cap;
    uint64_t bytes;
    uint8_t layout[16];             /* the entries they were lowered for (generation aside) */
} ferry_store_reads;
FERRY_API void ferry_store_reads_free(ferry_store_reads *r);   /* keeps nothing; NULL ok */

/* Lower the attested plan's runs into the selected target workers'
 * fragments (and, with a filter, only the runs it selects: a tensor, a
 * source rank) to store reads, appended to *out in plan order (target
 * fragment by target fragment): a run's innermost loop rides in the read's
 * rows, its outer loops are unrolled. Checks the target binding against
 * the attestation first; every target fragment a selected worker reads
 * must have a binding entry whose layout (strides, storage offset) is the
 * placement fragment's — the planner's offsets are computed from the
 * placement (FERRY_EINVAL naming the fragment otherwise). Pure: no store
 * call. On failure *out keeps what it held before. */
FERRY_API int ferry_exec_store_lower(const ferry_attested_plan *a, const ferry_binding *dst,
                                     const uint32_t *workers, size_t nworkers,
                                     const ferry_plan_filter *filter, ferry_store_reads *out,
                                     ferry_error *err);

/* Where source fragment `fragment`'s packed bytes start: an object key
 * (borrowed; valid until the run returns) and a byte offset in it. */
typedef int (*ferry_store_locate_fn)(void *ctx, uint64_t fragment, const char **key,
                                     uint64_t *offset);

typedef struct ferry_store_exec_config {
    ferry_store *store;
    ferry_store_locate_fn locate;   /* for reads without a key */
    void *locate_ctx;
    size_t max_reads;               /* reads per store call (0: 8192) */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_store_exec_config;

/* Every field of *cfg to its default (max_reads 8192, the rest 0). A 0
 * max_reads in a zeroed config is its default. */
FERRY_API int ferry_store_exec_config_init(ferry_store_exec_config *cfg);

/* Run reads [from, to) of r, checking `dst` against the attestation
 * first, and that r was lowered for a binding with dst's entries (r may
 * come from an earlier generation's attestation of the same plan and
 * entries: a rollout group lowers once and reads every generation with
 * it; FERRY_ESTALE when the entries differ). Every read's byte count is checked.
 * res->state: COMPLETED; ABORTED when no store call was made (a stale
 * binding, a fragment the locate callback does not know: no byte of the
 * target touched); FAILED_DRAINED when a store call failed after it was
 * made (the store call returned: nothing is in flight, but the target may
 * be written); UNKNOWN when a read timed out (bytes may still land).
 * Returns 0 when COMPLETED, else the error, with a message naming the
 * object and offset of the read that failed. */
FERRY_API int ferry_exec_store_run(const ferry_store_exec_config *cfg, const ferry_attested_plan *a,
                                   const ferry_binding *dst, const ferry_store_reads *r, size_t from,
                                   size_t to, ferry_exec_result *res, ferry_error *err);

#ifdef __cplusplus
}
#endif
#endif
