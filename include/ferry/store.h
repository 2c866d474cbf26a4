/* ferry store client: objects in node memory, placed by the master; a KV
 * space with revisions, compare-and-swap, watch and barriers; leased queues.
 *
 * Contract (see docs/store.md):
 *  - put_start → the client writes the bytes straight into the nodes'
 *    segments through the transfer engine → put_end makes the object
 *    visible. A reader never sees a partial object: a failed put is revoked.
 *  - A read leases the object (config lease_ms): it cannot be removed or
 *    evicted until the lease ends.
 *  - Every call is synchronous and thread-safe. The connection to the master
 *    reconnects by itself; a call that was in flight when the connection was
 *    lost fails with FERRY_ECONNRESET (its outcome is unknown), later calls
 *    wait for the master to come back (up to the call timeout).
 *  - Errors are negative FERRY_E* codes; every call that can fail takes a
 *    last ferry_error *err (NULL: the code only; common.h) that it fills
 *    with the code and a sentence (often the master's own). */
#ifndef FERRY_STORE_H
#define FERRY_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"
#include "ferry/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_store ferry_store;

#define FERRY_STORE_KEY_MAX 1024      /* bytes of a key or name */
#define FERRY_STORE_REPLICAS_MAX 8
#define FERRY_STORE_VALUE_MAX (16u << 20)  /* a KV value or a queue record */
/* The longest lease a read or a queue pop may take, an hour: a lease is
 * what frees an object or a record again when its holder dies, so a
 * longer one is refused (FERRY_EINVAL) rather than pinning it for good. */
#define FERRY_STORE_LEASE_MAX_MS 3600000u
#define FERRY_STORE_POP_MAX 4096u          /* records of one ferry_queue_pop */

typedef struct ferry_store_config {
    /* Master address "HOST:PORT". Default: FERRY_MASTER. */
    char master[128];
    /* The client's own engine (token, transport, listen address). The
     * master connection authenticates with the same token. */
    ferry_engine_config engine;
    int timeout_ms;          /* per call, including waiting for a reconnect (default 10000) */
    uint64_t lease_ms;       /* lease taken by reads (default 5000; at most
                              * FERRY_STORE_LEASE_MAX_MS, else open fails) */
    uint32_t heartbeat_ms;   /* heartbeat period to the master (default 1000) */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_store_config;

/* Defaults and the FERRY_* environment. FERRY_EINVAL for a malformed value. */
FERRY_API int ferry_store_config_init(ferry_store_config *cfg);
/* Connect to the master (authenticating with the token) and open the
 * client's engine. FERRY_EAUTH for a token the master refuses,
 * FERRY_ECONNREFUSED/FERRY_ETIMEDOUT when no master answers. */
FERRY_API int ferry_store_open(const ferry_store_config *cfg, ferry_store **out, ferry_error *err);
/* Close the connection and the engine; buffers stay the caller's. NULL ok. */
FERRY_API void ferry_store_close(ferry_store *s);
/* The client's engine (to register memory, or to use directly). */
FERRY_API ferry_engine *ferry_store_engine(ferry_store *s);

/* ---- registered buffers -------------------------------------------------- */
/* Register [buf, buf+len) for put_from/get_into without a copy. Buffers that
 * were not registered are registered for the duration of each call (a
 * little slower, still no copy). FERRY_EEXIST if it overlaps one already
 * registered. Unregister: FERRY_ENOENT if buf does not start one. */
FERRY_API int ferry_store_register_buffer(ferry_store *s, void *buf, size_t len, ferry_error *err);
FERRY_API int ferry_store_unregister_buffer(ferry_store *s, void *buf, ferry_error *err);

/* A staging buffer owned by this client, for callers that pack bytes before
 * a put (the weights publish does): at least len bytes, registered as by
 * ferry_store_register_buffer, and kept across calls so its pages stay
 * resident — packing into freshly allocated memory pays a page fault per
 * 4 KiB, which on a virtual machine costs 40-100x the copy itself. One
 * taker at a time: FERRY_EBUSY while it is taken. Its contents are what the
 * last taker left. A larger len replaces it (the old one is freed).
 * Give it back with ferry_store_staging_give: abandon = true when a put from
 * it timed out and the engine may still read it — it is then left
 * allocated and registered, never reused, and the next take makes a new
 * one. Freed by ferry_store_close. */
FERRY_API int ferry_store_staging_take(ferry_store *s, size_t len, void **out, ferry_error *err);
FERRY_API void ferry_store_staging_give(ferry_store *s, bool abandon);

/* ---- objects --------------------------------------------------------------- */
typedef struct ferry_replicate_config {
    uint32_t replica_num;               /* 0 means 1; at most FERRY_STORE_REPLICAS_MAX */
    const uint64_t *preferred_segments; /* tried first, in order; a preference only */
    uint32_t npreferred;
    bool hard_pin;                      /* never evicted */
    /* Placement slot, 0 for none: the master remembers where the
     * last few objects put under a slot were when they were removed, and a
     * put under the same slot takes one of those places when it is free and
     * large enough, before any other. A preference, like preferred_segments.
     * What it is for: a process copies fast only into memory it has written
     * before, so a writer that puts each new version of an object under one
     * slot writes where it wrote before (docs/store.md, "Placement slots"). */
    uint64_t slot;
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_replicate_config;

/* Every field of *cfg to its default (replica_num 1, the rest empty or 0).
 * A 0 replica_num in a zeroed config means 1. */
FERRY_API int ferry_replicate_config_init(ferry_replicate_config *cfg);

typedef struct ferry_replica_info {
    uint64_t segment, node, offset;
    bool preferred;                     /* landed on a segment the caller preferred */
} ferry_replica_info;

typedef struct ferry_object_desc {
    uint64_t size;
    uint32_t nreplicas;
    ferry_replica_info replicas[FERRY_STORE_REPLICAS_MAX];
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_object_desc;

/* Store len bytes under key (rc may be NULL: one replica, soft). Any memory
 * (put_from: the same, documented for registered buffers). placed (may be
 * NULL) reports where each replica landed. FERRY_EEXIST, FERRY_ENOSPC (with
 * sizes in the error text), FERRY_EINVAL. A failed transfer revokes the
 * object: nothing partial is ever visible. */
FERRY_API int ferry_store_put(ferry_store *s, const char *key, const void *buf, size_t len,
                              const ferry_replicate_config *rc, ferry_object_desc *placed, ferry_error *err);
FERRY_API int ferry_store_put_from(ferry_store *s, const char *key, const void *buf, size_t len,
                                   const ferry_replicate_config *rc, ferry_object_desc *placed, ferry_error *err);
/* A put whose bytes the caller writes in place, with no copy where the
 * store allows it: ferry_store_put_begin places the object (as a put
 * does: FERRY_EEXIST, FERRY_ENOSPC, FERRY_EINVAL, len > 0) and sets *at to
 * len bytes the caller fills — the object's place in its segment itself
 * when it has one replica on a node of this machine reached over shm (the
 * client's own mapping of that segment, which ferry_store_warm warms), or
 * else the client's staging buffer (ferry_store_staging_take; a buffer of
 * the put's own while another thread holds it), copied to every replica
 * at the end. ferry_store_put_end(p, commit, placed) completes it (commit)
 * or revokes it (!commit, or a failed copy): until it returns nobody sees
 * the object, and a revoked one is never seen. Until then the caller holds
 * the connection to the segment's node (ferry_remote_access_begin): fill
 * *at and end the put; do not wait on the store in between. placed (may be
 * NULL) as for ferry_store_put. p is freed by put_end. */
typedef struct ferry_put_slot ferry_put_slot;
FERRY_API int ferry_store_put_begin(ferry_store *s, const char *key, size_t len,
                                    const ferry_replicate_config *rc, void **at, ferry_put_slot **out, ferry_error *err);
FERRY_API int ferry_store_put_end(ferry_put_slot *p, bool commit, ferry_object_desc *placed, ferry_error *err);
/* Whether the put's bytes go straight into the segment (no copy at end). */
FERRY_API bool ferry_store_put_in_place(const ferry_put_slot *p);
/* Many puts: one master round trip to place them all, one engine batch for
 * the bytes, one round trip to complete them. results[i]: 0 or an error;
 * every entry is set, also when the whole call fails (then each holds that
 * error, or FERRY_ECANCELED for puts never tried). Returns 0 or the first
 * failure. */
FERRY_API int ferry_store_batch_put_from(ferry_store *s, const char *const *keys, const void *const *bufs,
                                         const size_t *lens, size_t n, const ferry_replicate_config *rc,
                                         int *results, ferry_error *err);

/* Read a whole object into a new buffer (*buf, free with ferry_store_free). */
FERRY_API int ferry_store_get(ferry_store *s, const char *key, void **buf, size_t *len, ferry_error *err);
FERRY_API void ferry_store_free(void *buf);
/* Read a whole object into buf (cap bytes): *len = its size. FERRY_ENOENT,
 * FERRY_ELOST (its last replica's node died), FERRY_EMSGSIZE if cap is too
 * small (nothing read, *len says how much is needed). */
FERRY_API int ferry_store_get_into(ferry_store *s, const char *key, void *buf, size_t cap, size_t *len, ferry_error *err);
FERRY_API int ferry_store_batch_get_into(ferry_store *s, const char *const *keys, void *const *bufs,
                                         const size_t *caps, size_t n, int64_t *results, ferry_error *err);

/* One byte range of an object, read into dst. */
typedef struct ferry_range {
    const char *key;
    uint64_t src_offset;
    void *dst;
    uint64_t len;
} ferry_range;
/* Read many ranges: one master round trip for all keys, then every read in
 * parallel through the engine. results[i]: bytes read (len, or fewer when
 * the object ends first) or a negative error for that range (FERRY_ERANGE:
 * src_offset past the end). Every entry is set, also when the whole call
 * fails. Returns 0 when every range succeeded, else the first failure. */
FERRY_API int ferry_store_get_into_ranges(ferry_store *s, const ferry_range *ranges, size_t n,
                                          int64_t *results, ferry_error *err);

/* Rows of one object read into memory: row i is bytes [src_offset + i *
 * src_stride, + len) of the object, landing at dst + i * dst_stride. */
typedef struct ferry_strided_range {
    const char *key;
    uint64_t src_offset;
    void *dst;
    uint64_t len;            /* bytes per row */
    uint64_t count;          /* rows; 0 or 1: one contiguous range */
    uint64_t src_stride, dst_stride;   /* bytes from one row to the next */
} ferry_strided_range;
/* Read many strided ranges as get_into_ranges does (one master round trip,
 * one engine op per range whatever its row count). The whole extent must
 * lie inside the object (FERRY_ERANGE otherwise, nothing read for that
 * range); results[i]: len * count, or the range's error. */
FERRY_API int ferry_store_get_into_strided(ferry_store *s, const ferry_strided_range *ranges, size_t n,
                                           int64_t *results, ferry_error *err);

/* 1 if the object exists and is complete, 0 if not, FERRY_ELOST. */
FERRY_API int ferry_store_exist(ferry_store *s, const char *key, ferry_error *err);
/* FERRY_EBUSY while a reader holds a lease (every read takes one for the
 * config's lease_ms, 5 s by default), FERRY_ENOENT. */
FERRY_API int ferry_store_remove(ferry_store *s, const char *key, ferry_error *err);
/* ferry_store_remove of many keys in one round trip: results[i] 0 or that
 * key's error (FERRY_EBUSY, FERRY_ENOENT); every entry is set. Returns 0
 * or the first failure. */
FERRY_API int ferry_store_batch_remove(ferry_store *s, const char *const *keys, size_t n,
                                       int *results, ferry_error *err);
/* Remove every unleased object whose key starts with prefix. */
FERRY_API int ferry_store_remove_prefix(ferry_store *s, const char *prefix, uint64_t *removed, ferry_error *err);
/* Where an object lives (no lease taken). replicas[i].preferred is
 * reported by put only (the master does not keep it): false here. */
FERRY_API int ferry_store_get_replica_desc(ferry_store *s, const char *key, ferry_object_desc *out, ferry_error *err);
/* ferry_store_get_replica_desc of many keys in one master round trip (no
 * lease taken): out[i] the place of keys[i] and results[i] 0, or results[i]
 * that key's error (FERRY_ENOENT, FERRY_ELOST) and out[i] zeroed. Every
 * entry is set, also when the whole call fails (then each holds that
 * error). Returns 0 or the first failure. */
FERRY_API int ferry_store_batch_get_replica_desc(ferry_store *s, const char *const *keys, size_t n,
                                                 ferry_object_desc *out, int *results,
                                                 ferry_error *err);
/* Keys with the prefix after `after` (NULL: from the start), ascending, at
 * most max. *keys is one allocation (free with ferry_store_free) holding the
 * pointer array and the strings. *more: there are further keys. */
FERRY_API int ferry_store_list(ferry_store *s, const char *prefix, const char *after, size_t max,
                               char ***keys, size_t *n, bool *more, ferry_error *err);

/* ---- structured objects ----------------------------------------------------- */
/* Named members stored in one object, each aligned to 64 bytes behind a
 * header that describes them, so a reader fetches one member, or rows of
 * it, with one ranged read and no deserialisation.
 * dtype: a name ferry_dtype_size (common.h) knows. nbytes = product(shape)
 * x its size. */
#define FERRY_MEMBER_NAME_MAX 63
#define FERRY_MEMBER_NDIM_MAX 8
typedef struct ferry_member {
    char name[FERRY_MEMBER_NAME_MAX + 1];
    char dtype[16];
    uint32_t ndim;
    uint64_t shape[FERRY_MEMBER_NDIM_MAX];
    uint64_t offset;   /* byte offset in the object (set by put_struct) */
    uint64_t nbytes;
} ferry_member;
/* Store members[i] (name, dtype, ndim, shape; offset and nbytes are
 * computed) with bytes data[i]. FERRY_EINVAL for a duplicate or bad name,
 * unknown dtype, bad shape. */
FERRY_API int ferry_store_put_struct(ferry_store *s, const char *key, const ferry_member *members,
                                     const void *const *data, size_t n, const ferry_replicate_config *rc, ferry_error *err);
/* Many structured objects stored at once: their bytes built as
 * put_struct builds one, then one ferry_store_batch_put_from (one round
 * trip to place them all, one engine batch, one round trip to complete
 * them). Object i: keys[i], nmembers[i] members members[i] with bytes
 * data[i]. results[i]: 0 or its error (FERRY_EEXIST, FERRY_EINVAL for its
 * members, ...); every entry is set. Returns 0 or the first failure. */
FERRY_API int ferry_store_batch_put_struct(ferry_store *s, const char *const *keys,
                                           const ferry_member *const *members,
                                           const void *const *const *data, const size_t *nmembers,
                                           size_t n, const ferry_replicate_config *rc, int *results,
                                           ferry_error *err);
/* The members of a structured object (up to cap into out; *n = count).
 * FERRY_EPROTO if the object is not a structured object. */
FERRY_API int ferry_store_get_members(ferry_store *s, const char *key, ferry_member *out, size_t cap,
                                      size_t *n, ferry_error *err);
/* ferry_store_get_members of many objects at once: one round trip to
 * locate them all, one batch of ranged reads for their member tables (a
 * second one only for tables longer than 4 KiB). Object i's members go to
 * out[i * cap ...] (up to cap), counts[i] = its member count, results[i] 0
 * or its error (as get_members'). Every entry is set, also when the whole
 * call fails. Returns 0 or the first failure. */
FERRY_API int ferry_store_batch_get_members(ferry_store *s, const char *const *keys, size_t n,
                                            ferry_member *out, size_t cap, size_t *counts,
                                            int *results, ferry_error *err);
/* Rows [row_begin, row_end) of member (along its first dimension; a 0-d
 * member has one row) into dst (cap bytes); *len = bytes read.
 * FERRY_ENOENT (no such member), FERRY_ERANGE (rows out of bounds),
 * FERRY_EMSGSIZE (cap too small). */
FERRY_API int ferry_store_read_member(ferry_store *s, const char *key, const char *member,
                                      uint64_t row_begin, uint64_t row_end, void *dst, size_t cap,
                                      size_t *len, ferry_error *err);

/* ---- KV ------------------------------------------------------------------------ */
/* Values are at most FERRY_STORE_VALUE_MAX bytes. Every successful change
 * takes the next global revision (*rev, may be NULL). */
typedef struct ferry_kv_value {
    void *val; size_t len;       /* ferry_store_free(val) */
    uint64_t mod_rev, create_rev, version;
} ferry_kv_value;
FERRY_API int ferry_kv_get(ferry_store *s, const char *key, ferry_kv_value *out, ferry_error *err);
/* ferry_kv_get of n keys in one round trip: out[i] and results[i] 0, or
 * results[i] that key's error (FERRY_ENOENT) and out[i] zeroed. Every entry
 * is set, also when the whole call fails. Returns 0 or the first failure.
 * Free each out[i].val with ferry_store_free. */
FERRY_API int ferry_kv_batch_get(ferry_store *s, const char *const *keys, size_t n,
                                 ferry_kv_value *out, int *results, ferry_error *err);
FERRY_API int ferry_kv_put(ferry_store *s, const char *key, const void *val, size_t len, uint64_t *rev, ferry_error *err);
/* Put only if the key's mod revision is expected (0: must not exist).
 * FERRY_ESTATE on a conflict, with *rev = the key's current revision. */
FERRY_API int ferry_kv_cas(ferry_store *s, const char *key, uint64_t expected, const void *val,
                           size_t len, uint64_t *rev, ferry_error *err);
/* expected 0: unconditional. */
FERRY_API int ferry_kv_delete(ferry_store *s, const char *key, uint64_t expected, uint64_t *rev, ferry_error *err);
/* Unconditional deletes of many keys in one round trip: results[i] 0 or
 * that key's error (FERRY_ENOENT); every entry is set. Returns 0 or the
 * first failure. */
FERRY_API int ferry_kv_batch_delete(ferry_store *s, const char *const *keys, size_t n,
                                    int *results, ferry_error *err);

/* Watch: the master pushes every change to keys with the prefix, from
 * revision from_rev (0: from now on). Survives master restarts (resumes from
 * the next revision). FERRY_ERANGE if from_rev was compacted away. */
typedef struct ferry_watch ferry_watch;
typedef struct ferry_kv_event {
    uint64_t rev;
    bool deleted;
    char *key;                   /* valid until the next ferry_watch_next */
    void *val; size_t len;
} ferry_kv_event;
FERRY_API int ferry_kv_watch(ferry_store *s, const char *prefix, uint64_t from_rev, ferry_watch **out, ferry_error *err);
/* Next event, oldest first: 0, or FERRY_ETIMEDOUT after timeout_ms (<0:
 * forever). */
FERRY_API int ferry_watch_next(ferry_watch *w, int timeout_ms, ferry_kv_event *ev, ferry_error *err);
FERRY_API void ferry_watch_close(ferry_watch *w);

/* Wait until `count` distinct members arrived at barrier `name` (reusable:
 * the next use starts a new generation). FERRY_ETIMEDOUT after timeout_ms
 * (0: no timeout); the arrival is then withdrawn. */
FERRY_API int ferry_barrier(ferry_store *s, const char *name, const char *member, uint32_t count,
                            uint64_t timeout_ms, uint64_t *generation, ferry_error *err);

/* ---- queues --------------------------------------------------------------------- */
typedef struct ferry_qrecord {
    uint64_t id;
    uint32_t token;              /* delivery number: pass to ack/nack */
    void *data; size_t len;      /* ferry_qrecords_free */
} ferry_qrecord;
/* Bound a queue: a push finding `bound` records outstanding (ready +
 * leased) fails with FERRY_EAGAIN (0: unbounded, the default). Durable like
 * every other change; records already queued stay. */
FERRY_API int ferry_queue_config(ferry_store *s, const char *queue, uint64_t bound, ferry_error *err);
/* Append a record; FERRY_EAGAIN when a bounded queue is full. */
FERRY_API int ferry_queue_push(ferry_store *s, const char *queue, const void *data, size_t len,
                               uint64_t *id, ferry_error *err);
/* Lease up to max ready records for lease_ms; *n may be 0. max is 1 to
 * FERRY_STORE_POP_MAX, lease_ms 1 to FERRY_STORE_LEASE_MAX_MS (FERRY_EINVAL). */
FERRY_API int ferry_queue_pop(ferry_store *s, const char *queue, uint32_t max, uint64_t lease_ms,
                              ferry_qrecord *out, size_t *n, ferry_error *err);
FERRY_API void ferry_qrecords_free(ferry_qrecord *recs, size_t n);
/* ack: the record is done (FERRY_ESTALE if it was delivered again since
 * your lease lapsed). nack: deliver it again now. */
FERRY_API int ferry_queue_ack(ferry_store *s, uint64_t id, uint32_t token, ferry_error *err);
FERRY_API int ferry_queue_nack(ferry_store *s, uint64_t id, uint32_t token, ferry_error *err);

/* The master's state as JSON text (ferry_store_free). */
FERRY_API int ferry_store_status_json(ferry_store *s, char **json, ferry_error *err);

/* Warm this process's way to the store's memory: every page of every
 * segment this client reaches through a mapping (the segments of this
 * machine's nodes, over shm) is touched once through the mapping its puts
 * and gets copy through (ferry_remote_warm; write: for writing, as a
 * publisher's puts need, else for reading). Segments on other machines
 * have nothing to warm and are not connected to. Costs one first touch per page of the segments
 * (docs/store.md, "Warm mappings"): a set-up step, off the critical path,
 * after which no put or get pays for a page-table entry. *bytes (may be
 * NULL): the bytes warmed. Returns 0, or the first error met (the other
 * segments are still warmed). */
FERRY_API int ferry_store_warm(ferry_store *s, bool write, uint64_t *bytes, ferry_error *err);

/* ---- the master process ----------------------------------------------------------- */
/* The metadata server: an event loop over TCP serving the store protocol,
 * every change logged (group-committed fsync) before it is acknowledged,
 * snapshots, node and client liveness (docs/store.md, "Liveness"): a silent
 * node is suspect (unreachable, objects kept), never dead by a timeout
 * alone unless dead_after_ms is set. */
typedef struct ferry_master ferry_master;
typedef struct ferry_master_config {
    char dir[4096];                 /* state directory (log, snapshots); one master at a time */
    char listen[64];                /* "HOST:PORT", port 0 picks one (default 127.0.0.1:0) */
    uint8_t token[FERRY_TOKEN_MAX]; /* cluster token (required) */
    size_t token_len;
    uint64_t heartbeat_timeout_ms;  /* a node or client silent this long is suspect (10000) */
    uint64_t grace_ms;              /* a node or client whose connection closed is declared dead
                                     * (objects lost; puts revoked, queue leases returned) after
                                     * this unless it reconnects (0: heartbeat_timeout_ms) */
    uint64_t dead_after_ms;         /* a suspect node is declared dead after this (0: never) */
    uint64_t pending_timeout_ms;    /* revoke puts whose writer vanished (FERRY_DEFAULT_TIMEOUT_MS) */
    uint64_t checkpoint_records;    /* snapshot after this many log records (1000000) */
    bool no_sync;                   /* do not fsync the log: tests and benchmarks only */
    /* A replicated master (docs/store.md, "High availability"): with etcd
     * set, ferry_master_open follows the cluster's log in etcd as a standby
     * until it wins the leadership of `cluster`, then serves, every commit
     * replicated through etcd first. NULL: a single master. Copied. */
    const char *etcd;               /* etcd client URLs, comma-separated */
    const char *cluster;            /* the cluster's name (with etcd; required then) */
    uint64_t ha_ttl_s;              /* the leadership lease, seconds (0: 2) */
    uint64_t reserved[5];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_master_config;
/* Defaults; the token from FERRY_TOKEN or FERRY_TOKEN_FILE when set. */
FERRY_API int ferry_master_config_init(ferry_master_config *cfg);
/* Recover dir and listen. FERRY_EBUSY (another master owns dir),
 * FERRY_ECORRUPT (a damaged log: the log names the record), -EADDRINUSE,
 * FERRY_EINVAL, FERRY_EIO; err says which. */
FERRY_API int ferry_master_open(const ferry_master_config *cfg, ferry_master **out, ferry_error *err);
/* "HOST:PORT" actually bound. */
FERRY_API const char *ferry_master_address(const ferry_master *m);
/* Serve until ferry_master_stop: 0, or the fatal error (FERRY_EIO: the log
 * cannot be written; a restart recovers). */
FERRY_API int ferry_master_run(ferry_master *m);
FERRY_API void ferry_master_stop(ferry_master *m);    /* async-signal-safe */
FERRY_API void ferry_master_close(ferry_master *m);   /* NULL ok */
/* The master's counters and gauges as Prometheus text (format 0.0.4; every
 * series in docs/operations.md, "Metrics"), for an HTTP server such as
 * `ferry master --metrics`. Any thread, while ferry_master_run runs: the
 * loop renders the text itself and publishes it, so nothing here reads the
 * loop's state. A snapshot at most 100 ms old is returned at once; an older
 * one makes the loop render anew, waited for up to wait_ms (the latest one
 * there is comes back when the loop does not answer in time, or has
 * stopped). FERRY_EAGAIN before the loop published its first. *text is
 * NUL-terminated: ferry_store_free. */
FERRY_API int ferry_master_metrics(ferry_master *m, int wait_ms, char **text);

/* ---- the node process ------------------------------------------------------------- */
/* A node owns one memfd-backed segment of this machine's memory, pre-faulted
 * at open, registered with its engine for remote reads and writes and
 * mounted on the master. Same-host clients map it, so their puts and gets
 * are one memcpy. The node heartbeats the master and mounts again after a
 * master restart (the master recognises the segment). Closing the node
 * unmounts it: objects whose only replica lived there become lost. */
typedef struct ferry_node ferry_node;
typedef struct ferry_node_config {
    char master[128];        /* default FERRY_MASTER */
    /* A name that stays the same when the node restarts (a new process is a
     * new incarnation: new node and segment ids). When a node mounts under
     * the name of one that is gone or suspect, the master declares the old
     * one dead at once instead of waiting out its grace period; a live node
     * keeps its name. "" (default): no name. */
    char name[64];
    ferry_engine_config engine;  /* its listen address is where clients reach the segment */
    uint64_t segment_size;   /* bytes (default 1 GiB) */
    uint32_t heartbeat_ms;   /* default 1000 */
    int timeout_ms;          /* first connection to the master (default 10000) */
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_node_config;
FERRY_API int ferry_node_config_init(ferry_node_config *cfg);
/* Allocate and pre-fault the segment, connect, mount. FERRY_ENOMEM when the
 * memory cannot be had, the master's errors otherwise. */
FERRY_API int ferry_node_open(const ferry_node_config *cfg, ferry_node **out, ferry_error *err);
FERRY_API uint64_t ferry_node_id(const ferry_node *n);
FERRY_API uint64_t ferry_node_segment(const ferry_node *n);
/* Serve until ferry_node_stop: keeps the mount alive across master
 * restarts. Returns 0 after a stop. */
FERRY_API int ferry_node_run(ferry_node *n);
/* Async-signal-safe. */
FERRY_API void ferry_node_stop(ferry_node *n);
/* The node's counters as Prometheus text (docs/operations.md, "Metrics"):
 * its segment, its registrations (mounts) with the master, the bytes its
 * engine served to remote peers per transport. Any thread, while the node
 * is open. *text: ferry_store_free. */
FERRY_API int ferry_node_metrics(ferry_node *n, char **text);
/* Unmount (best effort), unregister and free the segment. NULL ok. */
FERRY_API void ferry_node_close(ferry_node *n);

#ifdef __cplusplus
}
#endif
#endif
