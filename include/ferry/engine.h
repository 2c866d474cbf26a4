/* ferry transfer engine: registered memory, peers, one-sided READ/WRITE
 * batches with tickets, notifications, and a pending-transfer manager.
 *
 * Contract (see docs/engine.md):
 *  - Only registered regions marked remote-accessible can be touched by a
 *    peer; every remote access is checked against the region's key and
 *    bounds before a byte moves.
 *  - A ticket ends in exactly one terminal state: COMPLETED, ABORTED (no
 *    destination byte was touched), FAILED_DRAINED (I/O began, the
 *    destination may be modified, nothing is in flight any more). A wait
 *    that times out reports UNKNOWN: the ticket keeps its local regions
 *    pinned, is retained by the pending-transfer manager, and new
 *    submissions to its peers fail with FERRY_EFENCED until it drains or
 *    the peer is reset. Nothing is ever reported complete that is not.
 *
 * Errors: every call that can refuse for a reason the caller needs takes a
 * trailing ferry_error *err (NULL: the code only), filled with the code
 * and a sentence naming what was refused and why (the op and peer of a
 * submit, what pins a region, how many notifications of how many came).
 * The engine does not also log what it returns: the caller decides. What
 * has no caller to return to (a peer's access this engine refused as
 * target, a handshake it refused as server, dropped notifications) goes to
 * the log. A failed ticket's detail comes from ferry_ticket_error.
 */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_engine ferry_engine;
typedef struct ferry_region ferry_region;
typedef struct ferry_ticket ferry_ticket;
typedef uint32_t ferry_peer_id;

#define FERRY_TOKEN_MAX 256
#define FERRY_DESC_MAX 256   /* largest exported descriptor blob */

typedef struct ferry_engine_config {
    /* "HOST:PORT" for the tcp listener; port 0 picks one. Default
     * "127.0.0.1:0" (FERRY_LISTEN overrides). */
    char listen_addr[64];
    /* Cluster token. Default: FERRY_TOKEN, else the file named by
     * FERRY_TOKEN_FILE. Open fails with FERRY_EAUTH when there is none. */
    uint8_t token[FERRY_TOKEN_MAX];
    size_t token_len;
    /* Force one transport for every peer: "shm", "tcp" or "" (choose per
     * peer: same host -> shm, else tcp). Default from FERRY_TRANSPORT. */
    char transport[8];
    unsigned tcp_streams;      /* connections per tcp peer (default 4) */
    uint64_t tcp_chunk;        /* split size of large tcp ops (default 4 MiB) */
    unsigned shm_threads;      /* copy threads for large shm ops (default 2) */
    uint64_t window_bytes;     /* in-flight byte window per engine (default 1 GiB) */
    uint32_t window_ops;       /* in-flight operation window (default 4096) */
    int connect_timeout_ms;    /* per peer connect + handshake (default 5000) */
    /* Fault injection for tests (default from FERRY_FAULT; "" = off). A
     * comma-separated list of KEY=N:
     *   post_fail_after=N      the first N posts to a transport succeed, later
     *                          ones fail (chunks end untouched: ABORTED)
     *   complete_fail_after=N  the first N chunk completions pass, later
     *                          successes are turned into FERRY_EIO failures
     *                          (bytes moved: FAILED_DRAINED)
     *   delay_ms=N             every completion is delayed by N ms
     *   drop_after=N           after N posted chunks the connection is dropped
     *   map_fail=1             ferry_remote_map fails with FERRY_ENOTSUP
     * Counters are per engine, across peers. */
    char fault[128];
    uint64_t reserved[8];   /* zero (the init zeroes it; the library refuses anything else):
                             * room for fields to come, docs/design.md "Growth" */
} ferry_engine_config;

/* Fill cfg with defaults and the FERRY_* environment. Returns 0, or
 * FERRY_EINVAL when an environment value is malformed (FERRY_TOKEN_FILE
 * unreadable: FERRY_ENOENT); having no ferry_error, like every
 * *_config_init, it logs which value at error level. */
FERRY_API int ferry_engine_config_init(ferry_engine_config *cfg);
/* Load a token from a file (trailing newline stripped). FERRY_ENOENT when
 * it cannot be read, FERRY_EINVAL when it is empty; err says which file. */
FERRY_API int ferry_engine_config_token_file(ferry_engine_config *cfg, const char *path, ferry_error *err);
/* Generate a random token as 64 hex characters into out[65]. */
FERRY_API void ferry_token_generate(char out[65]);

/* Open an engine: starts its listeners and progress threads. The engine
 * owns everything it creates; ferry_engine_close(NULL) is a no-op. Close
 * cancels in-flight tickets (they end FAILED_DRAINED or ABORTED), waits for
 * them to drain, unregisters every region and frees every ticket still held.
 * Refusals, with err naming the field or step: FERRY_EAUTH (no token),
 * FERRY_EINVAL (a field out of range, reserved words not zero, a bad fault
 * spec, an unknown transport), a transport that cannot start (its code:
 * the listen address taken, UCX missing). */
FERRY_API int ferry_engine_open(const ferry_engine_config *cfg, ferry_engine **out, ferry_error *err);
FERRY_API void ferry_engine_close(ferry_engine *e);

/* The engine's endpoint descriptor (instance, host, addresses): a blob of
 * at most FERRY_DESC_MAX bytes that a peer passes to ferry_peer_add.
 * Returns the blob length or a negative code. */
FERRY_API int ferry_engine_export(const ferry_engine *e, void *buf, size_t cap);
/* Human-readable "tcp://127.0.0.1:PORT" of the listener. */
FERRY_API const char *ferry_engine_address(const ferry_engine *e);

/* ---- memory ---------------------------------------------------------- */
enum ferry_mem_kind { FERRY_MEM_HOST = 0, FERRY_MEM_DEVICE = 1 };
#define FERRY_REMOTE_READ  0x1u
#define FERRY_REMOTE_WRITE 0x2u
#define FERRY_REMOTE_RW    (FERRY_REMOTE_READ | FERRY_REMOTE_WRITE)

/* Allocate len bytes of pre-faulted, page-aligned memory that same-host
 * peers can map directly: memfd-backed (ferry's shm transport), or, on an
 * engine that runs the ucx transport, allocated by UCX (so that UCX's
 * shared-memory transports map it; memfd memory when UCX's posix directory
 * cannot hold it). Free with ferry_mem_free (or it goes at the engine's
 * close); freeing memory that a region still covers is FERRY_EBUSY (err:
 * how many regions), an address ferry_mem_alloc did not return
 * FERRY_ENOENT. */
FERRY_API int ferry_mem_alloc(ferry_engine *e, size_t len, void **addr, ferry_error *err);
FERRY_API int ferry_mem_free(ferry_engine *e, void *addr, ferry_error *err);

/* Register [addr, addr+len) with a fresh random 64-bit remote key. flags:
 * FERRY_REMOTE_* (0 = local only: usable as the local side of ops, never
 * touched by a peer). Host memory only for now (FERRY_ENOTSUP otherwise).
 * The region stays owned by the engine until unregistered or engine close. */
FERRY_API int ferry_region_register(ferry_engine *e, void *addr, size_t len, unsigned flags,
                                    enum ferry_mem_kind kind, ferry_region **out, ferry_error *err);
/* Unregister. FERRY_EBUSY while an in-flight or UNKNOWN ticket uses the
 * region or a peer's access to it is being served (the region stays
 * registered and usable); err says which (a ticket's id, and whether its
 * outcome is unknown). */
FERRY_API int ferry_region_unregister(ferry_region *r, ferry_error *err);
/* Unregister many regions; interruption-safe bookkeeping: each success sets
 * regions[i] = NULL at once, so after a failure the non-NULL entries are
 * exactly the regions still registered and a retry never unregisters twice.
 * Returns 0 or the first error (the remaining entries were still tried),
 * err naming that entry. */
FERRY_API int ferry_region_unregister_all(ferry_region **regions, size_t n, ferry_error *err);
/* Regions currently registered with the engine. */
FERRY_API size_t ferry_engine_region_count(ferry_engine *e);
FERRY_API uint64_t ferry_region_key(const ferry_region *r);
FERRY_API void *ferry_region_addr(const ferry_region *r);
FERRY_API size_t ferry_region_len(const ferry_region *r);
/* Whether a region registered with e covers [addr, addr+len) (so it can
 * be the local side of ops as it is). */
FERRY_API bool ferry_region_covers(ferry_engine *e, const void *addr, size_t len);
/* Export a region descriptor (endpoint + base + len + key + flags). Returns
 * the blob length (<= FERRY_DESC_MAX) or a negative code. */
FERRY_API int ferry_region_export(const ferry_region *r, void *buf, size_t cap);

/* ---- peers ----------------------------------------------------------- */
typedef struct ferry_remote_region {
    ferry_peer_id peer;
    uint64_t addr;      /* base in the peer's address space */
    uint64_t len;
    uint64_t key;
    unsigned flags;
} ferry_remote_region;

/* Add (or find) the peer described by an endpoint blob and connect to it.
 * The same peer instance always maps to the same id. A blob from a previous
 * instance of a peer that has restarted on the same address is refused with
 * FERRY_ESTALE at connect. err names the failure: a blob that does not
 * decode, no transport both sides have (FERRY_ENOTSUP, with what the peer
 * offers), the connect (the address, FERRY_EAUTH: the tokens differ). */
FERRY_API int ferry_peer_add(ferry_engine *e, const void *desc, size_t len, ferry_peer_id *out,
                             ferry_error *err);
/* Decode a region blob, add its peer, fill out; refusals as ferry_peer_add. */
FERRY_API int ferry_region_import(ferry_engine *e, const void *desc, size_t len, ferry_remote_region *out,
                                  ferry_error *err);
/* Whether a region descriptor's owner runs on this machine (the same boot
 * id): 1 or 0, without connecting; FERRY_EINVAL for a malformed one. */
FERRY_API int ferry_region_desc_local(const ferry_engine *e, const void *desc, size_t len);
/* Drop every connection to the peer: its in-flight ops fail, their tickets
 * drain (FAILED_DRAINED or ABORTED), its fence is lifted, and the next
 * submission reconnects. */
FERRY_API int ferry_peer_reset(ferry_engine *e, ferry_peer_id peer);
/* A read-only view of a same-host peer's memory (ferry_remote_map). */
typedef struct ferry_mapping {
    const void *addr;   /* the first byte asked for, in this process */
    void *base;         /* the whole mapping (for ferry_remote_unmap) */
    size_t len;
} ferry_mapping;

/* Map bytes [addr, addr + len) of an imported remote region read-only into
 * this process: zero-copy reads of a same-host peer's memory. The peer must
 * be reached over shm and the range must lie in a region it allocated with
 * ferry_mem_alloc (FERRY_ENOTSUP otherwise: tcp, ucx, heap memory reached
 * by cross-memory attach), registered remote-readable (FERRY_EACCES),
 * checked against its live key table like a READ (FERRY_EFAULT outside
 * it). The view is the caller's until ferry_remote_unmap: it outlives the
 * connection (a reset or the peer's exit leave it readable: the pages stay
 * while mapped), and revoking the region's key afterwards does not revoke
 * it. The bytes are the peer's live memory, seen as it writes them: the
 * reader synchronises with the writer by other means (a NOTIFY after the
 * writes). */
FERRY_API int ferry_remote_map(ferry_engine *e, const ferry_remote_region *rr, uint64_t addr, uint64_t len,
                               ferry_mapping *out, ferry_error *err);
/* Warm this process's way to bytes [addr, addr + len) of an imported
 * remote region: where the engine copies through a mapping of the peer's
 * memory (a same-host peer over shm, memory from ferry_mem_alloc), touch
 * every page of that mapping once, so that later READs and WRITEs there
 * copy at memory speed instead of paying a first touch per page (on VMs
 * 20-50x a warm copy; docs/engine.md, "Warm mappings"). write: touch for
 * writing (the region must be remote-writable, FERRY_EACCES otherwise):
 * each page's first word is rewritten with its own value by a locked add
 * of 0, which a concurrent writer cannot lose; else a read. Checked like
 * the op it prepares (FERRY_EFAULT outside the region). *touched (may be
 * NULL): the bytes warmed, 0 where there is no mapping to warm (tcp, ucx,
 * heap memory reached by cross-memory attach). Costs one first touch per
 * page, once per process: call it at set-up, off the critical path. */
FERRY_API int ferry_remote_warm(ferry_engine *e, const ferry_remote_region *rr, uint64_t addr, uint64_t len,
                                bool write, uint64_t *touched, ferry_error *err);
/* Release a view (and zero it); an empty one is a no-op. */
FERRY_API void ferry_remote_unmap(ferry_mapping *m);

/* Direct access to a same-host peer's memory, as UCX's ucp_rkey_ptr: *ptr
 * points at byte addr of an imported remote region through the mapping
 * this engine's own copies use (warm once ferry_remote_warm or earlier
 * copies touched it), so the caller reads or writes [addr, addr + len)
 * in place, with no copy by the engine. access: FERRY_REMOTE_READ and/or
 * FERRY_REMOTE_WRITE, checked like the op against the live key table
 * (FERRY_EACCES, FERRY_EFAULT outside the region). FERRY_ENOTSUP where
 * there is no such mapping (tcp, ucx, heap memory reached by cross-memory
 * attach): the caller moves the bytes with ops instead. The pointer is
 * valid until ferry_remote_access_end(*out), which the caller must call
 * soon: until then the connection to the peer is held (a reset or a
 * reconnect waits for it), so hold it for a copy, not across a wait for
 * the engine. The peer sees the bytes as they are written: synchronise
 * by other means (a NOTIFY, the store's commit). ferry_remote_map, _warm
 * and _access_begin fill err with the range, the peer and why (its key
 * refused, outside the region, no mapping over this transport, the
 * connect). */
typedef struct ferry_remote_access ferry_remote_access;
FERRY_API int ferry_remote_access_begin(ferry_engine *e, const ferry_remote_region *rr, uint64_t addr,
                                        uint64_t len, unsigned access, void **ptr,
                                        ferry_remote_access **out, ferry_error *err);
FERRY_API void ferry_remote_access_end(ferry_remote_access *a);   /* NULL: a no-op */

/* Name of the transport chosen for a peer ("shm"/"tcp"), NULL if unknown. */
FERRY_API const char *ferry_peer_transport(const ferry_engine *e, ferry_peer_id peer);

/* ---- batches and tickets ---------------------------------------------- */
enum ferry_opcode { FERRY_OP_READ = 1, FERRY_OP_WRITE = 2, FERRY_OP_NOTIFY = 3 };

/* One operation, in the shape of fi_write: local buffer, length, peer,
 * remote address, key. local must lie inside a region registered with this
 * engine. NOTIFY uses peer, tag and value only; it is delivered after every
 * earlier WRITE of the same batch to that peer is visible there.
 *
 * Strided form (READ/WRITE): count 0 or 1 is one contiguous run of len
 * bytes; count > 1 is `count` rows of len bytes each, row i at
 * local + i*local_stride and remote_addr + i*remote_stride (the op moves
 * count*len bytes). Its local extent [local, local + (count-1)*local_stride
 * + len) must lie inside one registered region, and the target checks its
 * whole remote span [remote_addr, remote_addr + (count-1)*remote_stride +
 * len) before any row moves. Arithmetic that overflows is FERRY_EINVAL.
 * Rows whose destinations overlap land in no particular order. The fields
 * sit at the end, so a zero-initialised op is contiguous. */
typedef struct ferry_op {
    enum ferry_opcode opcode;
    void *local;
    uint64_t len;           /* bytes per row (the whole op when count <= 1) */
    ferry_peer_id peer;
    uint64_t remote_addr;
    uint64_t key;
    uint64_t tag, value;    /* NOTIFY only */
    uint64_t count;         /* rows; 0 or 1: contiguous */
    uint64_t local_stride, remote_stride;   /* bytes between rows (count > 1) */
} ferry_op;

enum ferry_ticket_state {
    FERRY_TICKET_PENDING = 0,        /* in flight */
    FERRY_TICKET_COMPLETED = 1,
    FERRY_TICKET_ABORTED = 2,        /* no destination byte touched */
    FERRY_TICKET_FAILED_DRAINED = 3, /* I/O began and failed; nothing in flight */
    FERRY_TICKET_UNKNOWN = 4,        /* a wait timed out; retained and fenced */
};
FERRY_API const char *ferry_ticket_state_name(enum ferry_ticket_state s);

#define FERRY_SUBMIT_NONBLOCK 0x1u  /* return FERRY_EAGAIN instead of blocking on a full window */

/* Validate and submit ops[0..n) as one batch. Every op is checked before
 * anything moves (registered local buffer, known peer, sizes); a bad op
 * fails the whole call with nothing submitted, err naming it ("op 3: local
 * buffer 0x...+4096 is not inside a registered region"). Blocks while the
 * in-flight window is full (a batch larger than the whole window is
 * admitted when the window is empty), or returns FERRY_EAGAIN with
 * FERRY_SUBMIT_NONBLOCK. Returns FERRY_EFENCED when a peer of the batch is
 * fenced (err: the op, the peer and the UNKNOWN ticket that fences it). On
 * success *out is a ticket the caller frees with ferry_ticket_free. */
FERRY_API int ferry_submit(ferry_engine *e, const ferry_op *ops, size_t n, unsigned flags,
                           ferry_ticket **out, ferry_error *err);
/* Wait up to timeout_ms (<0: forever) for a terminal state. Returns the
 * state (>= 0); a timeout returns FERRY_TICKET_UNKNOWN and fences the
 * ticket's peers until it drains or they are reset. */
FERRY_API int ferry_ticket_wait(ferry_ticket *t, int timeout_ms);
/* Current state without waiting (PENDING, UNKNOWN or terminal). */
FERRY_API int ferry_ticket_test(const ferry_ticket *t);
/* First error that failed the ticket (0 when none), e.g. FERRY_EACCES.
 * When there is one, err (may be NULL) gets it with a sentence naming the
 * first op that failed (its index in the batch, opcode, bytes, peer,
 * remote address and key), the cause ("refused by the peer: access
 * refused ...", "the connection to the peer was lost") and the ticket's
 * outcome (ABORTED, FAILED_DRAINED); err is left alone when there is none.
 * Valid from the failure on, while the ticket is held. */
FERRY_API int ferry_ticket_error(const ferry_ticket *t, ferry_error *err);
/* The ticket's id: the id ferry_engine_pending reports while its outcome is
 * UNKNOWN. */
FERRY_API uint64_t ferry_ticket_id(const ferry_ticket *t);
/* Bytes confirmed moved (for diagnostics). */
FERRY_API uint64_t ferry_ticket_bytes(const ferry_ticket *t);
/* Release the caller's handle. A ticket still in flight is handed to the
 * pending-transfer manager (state UNKNOWN, regions pinned, peers fenced) and
 * freed by the engine once it drains. NULL is a no-op. */
FERRY_API void ferry_ticket_free(ferry_ticket *t);

/* Pending-transfer manager: tickets whose outcome is UNKNOWN. */
typedef struct ferry_pending_info {
    uint64_t id;
    ferry_peer_id peer;       /* first fenced peer of the ticket */
    uint64_t bytes_total;
    uint64_t age_ms;
} ferry_pending_info;
/* Fill up to cap entries; returns how many tickets are pending. */
FERRY_API int ferry_engine_pending(ferry_engine *e, ferry_pending_info *out, size_t cap);

/* Wait until `count` notifications with `tag` have arrived (and consume
 * them). values (may be NULL) receives their values in arrival order.
 * FERRY_ETIMEDOUT after timeout_ms (<0: forever); nothing is consumed then,
 * and err says how many of the count had arrived, from how many peers.
 *
 * Unconsumed notifications are bounded per (sending peer, tag): when a
 * peer has FERRY_NOTIFY_PENDING_MAX of them waiting on a tag, each new one
 * from it drops its oldest (counted in ferry_engine_stats.notify_dropped,
 * a warning logged once until that backlog is consumed). Counts stay exact
 * below the bound; past it a waiter sees the newest FERRY_NOTIFY_PENDING_MAX
 * of that peer, never a dropped one, and a wait for more than that which
 * only this peer's notifications could satisfy ends only by its timeout.
 *
 * And bounded per sending peer across all its tags: a peer with
 * FERRY_NOTIFY_PEER_MAX unconsumed notifications in all has every new
 * one dropped (not an old one: it may be what a waiter is about to take)
 * until some are consumed — unless its backlog on the new one's tag is
 * full, where the per-tag rule above drops that tag's oldest instead —,
 * counted in notify_dropped and in notify_peer_capped, warned once per
 * backlog. A peer that sends a new tag with each notification (which no
 * waiter asked for) so grows this engine's memory by at most about
 * FERRY_NOTIFY_PEER_MAX x 400 bytes (21.0 MiB measured for 600,000). */
#define FERRY_NOTIFY_PENDING_MAX 65536u
#define FERRY_NOTIFY_PEER_MAX 65536u
FERRY_API int ferry_wait_notify(ferry_engine *e, uint64_t tag, uint32_t count, int timeout_ms,
                                uint64_t *values, ferry_error *err);

/* Counters since open. */
typedef struct ferry_engine_stats {
    uint64_t bytes_written, bytes_read;       /* as initiator, completed */
    uint64_t ops_completed, ops_failed;
    uint64_t tickets_completed, tickets_aborted, tickets_failed, tickets_unknown;
    uint64_t remote_refused;                  /* remote accesses this engine refused as target */
    uint64_t auth_refused;                    /* connections refused at the handshake */
    uint64_t frames_rejected;                 /* malformed frames dropped */
    uint64_t notify_dropped;                  /* notifications dropped unconsumed (the bound
                                               * FERRY_NOTIFY_PENDING_MAX, or out of memory) */
    /* As target, over tcp: bytes peers read from and wrote into this
     * engine's regions. Same-host peers over shm move bytes without this
     * process; what it serves them is the mapping (shm_maps_served). */
    uint64_t served_read_bytes, served_write_bytes;
    uint64_t shm_maps_served;
    uint64_t notify_peer_capped;              /* of notify_dropped: new ones refused
                                               * at a peer's FERRY_NOTIFY_PEER_MAX across tags */
    uint64_t reserved[8];   /* zeroed by the library: room for fields to come */
} ferry_engine_stats;
FERRY_API void ferry_engine_get_stats(const ferry_engine *e, ferry_engine_stats *out);

#ifdef __cplusplus
}
#endif
#endif
