/* Engine internals shared by the engine core and its transports. */
#ifndef FR_ENGINE_INT_H
#define FR_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/base.h"
#include "ferry/engine.h"
#include "wire/sockio.h"
#include "wire/wire.h"

typedef struct fr_peer fr_peer;
typedef struct fr_transport fr_transport;

/* One unit of work posted to a transport: a whole op or a piece of one.
 * The engine creates chunks; a transport completes each exactly once with
 * fr_chunk_done, from any thread. */
typedef struct fr_chunk {
    struct ferry_ticket *t;
    enum ferry_opcode opcode;
    uint32_t op;               /* index of its op in the batch (what a failure names) */
    uint8_t *local;            /* READ: destination; WRITE: source */
    uint64_t remote_addr, key, len;
    /* rows > 1 (only to transports with .strided): rows of len bytes, row i
     * at local + i*lstride and remote_addr + i*rstride; 0 or 1: one run. */
    uint64_t rows, lstride, rstride;
    uint64_t span_addr, span_len; /* the whole op's remote range: targets check all of it */
    uint64_t tag, value;       /* NOTIFY */
    uint32_t epoch;            /* notify ordering (engine-private) */
    ferry_peer_id peer_id;     /* engine-private */
    uint64_t req_id;           /* transport-private */
    struct fr_chunk *next;     /* transport-private queue link */
    /* A wrapper transport (fault injection) may intercept the completion:
     * fr_chunk_done hands the chunk to it once, and it completes it later. */
    void (*intercept)(struct fr_chunk *c, int status, bool touched);
    void *intercept_arg;
} fr_chunk;

/* Bytes a chunk moves. */
static inline uint64_t fr_chunk_bytes(const fr_chunk *c)
{
    return c->rows > 1 ? c->rows * c->len : c->len;
}

/* Complete a chunk. status: 0 or a negative FERRY_E* code. touched: the
 * chunk's destination (remote memory for WRITE, the local buffer for READ)
 * may have been modified (I/O began). Never called twice for a chunk. */
void fr_chunk_done(fr_chunk *c, int status, bool touched);

/* Transport ops table: one const instance per transport, chosen per peer. */
struct fr_transport {
    const char *name;
    uint32_t bit;                  /* FR_TRANSPORT_* */
    uint64_t max_chunk;            /* the engine splits ops larger than this */
    /* Takes chunks of several rows (fr_chunk.rows); otherwise the engine
     * posts a strided op as one chunk per row. With .strided: max_rows is
     * the most rows in one chunk (0: as many as fit max_chunk), and
     * disjoint_rows says the transport cannot carry rows that overlap at
     * the target (remote stride < len): such an op goes one row a chunk. */
    bool strided;
    bool disjoint_rows;
    uint32_t max_rows;
    /* Started only in an engine that names it (ferry_engine_config.transport),
     * and then the only one its peers are reached by; otherwise started in
     * every engine and chosen per peer. */
    bool on_demand;
    /* Server side: start listening, fill the engine's endpoint fields that
     * belong to this transport, and serve authenticated peers. A failure
     * fills err (fr_fail) with what could not be done; the engine adds
     * which transport. */
    int (*start)(ferry_engine *e, void **state, ferry_error *err);
    /* Stop serving: close the listener and every accepted connection, join
     * every thread, free state. */
    void (*stop)(void *state);
    /* Client side: open the connection(s) to p (handshake included). A
     * failure may fill err with what failed (the address, the handshake);
     * the engine adds which peer and falls back to the code's text. */
    int (*connect)(ferry_engine *e, fr_peer *p, void **conn, ferry_error *err);
    /* Queue chunks for transfer. Never blocks on the network. Returns 0, or
     * a negative code when the connection is already dead (then no chunk
     * was taken: the caller completes them). */
    int (*post)(void *conn, fr_chunk **chunks, size_t n);
    /* Fail every queued and in-flight chunk with FERRY_ECONNRESET (touched
     * as appropriate), close sockets, join threads, free conn. */
    void (*disconnect)(void *conn);
    /* false once the connection has failed (the engine then reconnects). */
    bool (*alive)(void *conn);
    /* Optional (NULL: FERRY_ENOTSUP): a read-only mapping of the peer's
     * bytes [addr, addr + len) of the region of `key` (ferry_remote_map). */
    int (*map)(void *conn, uint64_t key, uint64_t addr, uint64_t len, ferry_mapping *out);
    /* Optional (NULL: nothing to warm, *touched = 0): touch every page of
     * [addr, addr + len) of the region of `key` through the mapping this
     * connection's own copies use (ferry_remote_warm); *touched = bytes. */
    int (*warm)(void *conn, uint64_t key, uint64_t addr, uint64_t len, bool write,
                uint64_t *touched);
    /* Optional (NULL: FERRY_ENOTSUP): *ptr = byte addr of the region of
     * `key` through the mapping this connection's own copies use, checked
     * for `access` and bounds (ferry_remote_access_begin); valid while the
     * caller holds the peer's lock. */
    int (*access)(void *conn, uint64_t key, uint64_t addr, uint64_t len, unsigned access,
                  void **ptr);

    /* Memory hooks, each optional (NULL: the transport needs none). region.c
     * calls them on the running transport that has them, with the state its
     * start() made; at most one transport of an engine may have them (a
     * region carries one remote key and one handle).
     * mem_alloc: ferry_mem_alloc's len bytes (whole pages), allocated by the
     * transport and populated, *handle its own. Any negative code: the
     * engine allocates memfd memory instead. mem_free gives one back. */
    int (*mem_alloc)(void *state, size_t len, void **addr, void **handle);
    void (*mem_free)(void *state, void *handle);
    /* reg: a remote-accessible region (flags != 0) is being registered: make
     * it reachable by the transport's peers, fill r->rkey / r->rkey_len (the
     * remote key ferry_region_export carries) and r->tp_handle (what dereg
     * releases; NULL: nothing). alloc_handle: the mem_alloc handle of the
     * allocation the region lies in, or NULL. A negative code fails the
     * registration and leaves nothing to undo, err filled with why. dereg:
     * undo a reg that succeeded, from any thread, the engine lock held or
     * not. */
    int (*reg)(void *state, ferry_region *r, void *alloc_handle, ferry_error *err);
    void (*dereg)(void *state, ferry_region *r);
};

extern const fr_transport fr_transport_tcp;
extern const fr_transport fr_transport_shm;
extern const fr_transport fr_transport_fault;   /* wraps p->inner_tp, see fault.c */
extern const fr_transport fr_transport_ucx;     /* transport/ucx*.c, when the build has UCX */
/* e->tp_state slots. */
enum { FR_TP_SHM = 0, FR_TP_TCP = 1, FR_TP_UCX = 2, FR_TP_COUNT = 3 };
/* The transports this build has, indexed like e->tp_state; NULL where a
 * transport is not built (engine.c). */
extern const fr_transport *const fr_transports[FR_TP_COUNT];

/* Fault injection (enabled by ferry_engine_config.fault / FERRY_FAULT). */
typedef struct fr_fault fr_fault;
/* A malformed spec is FERRY_EINVAL with err naming the entry. */
int fr_fault_create(const char *spec, fr_fault **out, ferry_error *err);
void fr_fault_destroy(fr_fault *f);

struct fr_peer {
    ferry_peer_id id;
    fr_endpoint ep;
    const fr_transport *tp;
    const fr_transport *inner_tp; /* the real transport when tp wraps it */
    void *conn;                /* NULL until connected */
    uint32_t fenced;           /* UNKNOWN tickets touching this peer (engine lock) */
    uint64_t reset_gen;        /* bumped by ferry_peer_reset: drops older fences */
    bool connecting;           /* a thread is connecting (engine lock) */
    pthread_rwlock_t rw;       /* read: posting to conn; write: replacing conn */
    /* Regions of this peer imported with a remote key (ferry_region_import):
     * what the ucx transport checks every access against before posting. */
    pthread_mutex_t imp_lock;
    struct fr_import *imports;
    size_t nimports, cap_imports;
};

/* One imported remote region of a peer, with the remote key it exported. */
typedef struct fr_import {
    uint64_t key, base, len;
    uint32_t flags;
    uint16_t rkey_len;
    uint8_t rkey[FR_DESC_RKEY_MAX];
} fr_import;

/* Record (or refresh) an imported region of p; 0 or FERRY_ENOMEM. */
int fr_peer_import_add(fr_peer *p, const fr_region_desc *d);
/* Copy out p's imported region with this key; false when there is none. */
bool fr_peer_import_find(fr_peer *p, uint64_t key, fr_import *out);

/* A registered local region. */
struct ferry_region {
    ferry_engine *e;
    uint8_t *addr;
    uint64_t len;
    uint64_t key;
    unsigned flags;
    enum ferry_mem_kind kind;
    uint32_t pins;             /* local tickets using it (engine lock) */
    atomic_uint remote_refs;   /* remote accesses being served */
    int memfd;                 /* backing memfd when from ferry_mem_alloc, else -1 */
    uint64_t memfd_off;        /* offset of addr in the memfd */
    uint64_t memfd_len;
    uint32_t memfd_id;         /* the ferry_mem_alloc allocation it lies in (memfd or a transport's), 0: none */
    int slot;                  /* shm key-table slot */
    void *tp_handle;           /* the memory transport's, from its reg hook, else NULL */
    uint16_t rkey_len;         /* remote key from the reg hook, exported in the descriptor; 0: none */
    uint8_t rkey[FR_DESC_RKEY_MAX];
};

/* An allocation from ferry_mem_alloc: memfd-backed, or (an engine that runs
 * a transport with a mem_alloc hook) the transport's, fd -1. */
typedef struct fr_mem {
    uint8_t *addr;
    uint64_t len;
    int fd;
    int tp;                    /* FR_TP_* of the transport whose allocation it is, or -1 */
    void *tp_handle;           /* the transport's handle; NULL once it gave the memory back */
    uint32_t id;
    uint32_t regions;          /* regions inside it (engine lock) */
} fr_mem;

/* shm key table: a memfd the owner writes and same-host peers map read-only.
 * Open addressing on key; each slot guarded by a seqlock. */
#define FR_KEYTAB_SLOTS 16384u
#define FR_KEY_EMPTY 0u
#define FR_KEY_TOMB 1u
typedef struct fr_keyslot {
    _Atomic uint64_t seq;
    _Atomic uint64_t key;
    uint64_t base, len;
    uint32_t flags;
    uint32_t memfd_id;         /* 0: not memfd-backed (use cross-memory attach) */
    uint64_t memfd_off;
    uint64_t memfd_len;
    uint64_t pad;
} fr_keyslot;

/* Look a key up in a (possibly remote) key table; copies the slot out
 * consistently. 0 or FERRY_ENOENT. */
int fr_keytab_lookup(const fr_keyslot *tab, uint64_t key, fr_keyslot *out);

struct ferry_engine {
    ferry_engine_config cfg;
    uint8_t auth_key[32];      /* derived from the token */
    fr_endpoint ep;
    char address[80];

    pthread_mutex_t lock;      /* regions, mems, peers, tickets, window */
    pthread_cond_t cond;       /* window and ticket state changes */
    bool closing;

    ferry_region **regions;    /* sorted by addr */
    size_t nregions, cap_regions;
    fr_mem **mems;
    size_t nmems, cap_mems;
    uint32_t next_mem_id;

    int keytab_fd;
    fr_keyslot *keytab;        /* FR_KEYTAB_SLOTS slots */
    ferry_region **slot_region;/* owner-side: region of each key-table slot */

    fr_peer **peers;           /* index = peer id */
    size_t npeers, cap_peers;

    uint64_t inflight_bytes;
    uint32_t inflight_ops;
    uint32_t admit_waiters;    /* submitters blocked on the window (lock) */
    uint64_t next_ticket_id;
    struct ferry_ticket *tickets;   /* live tickets, doubly linked */

    /* notifications */
    pthread_mutex_t nlock;
    pthread_cond_t ncond;
    struct fr_notify_q *notify;
    size_t nnotify, cap_notify;
    uint64_t notify_seq;       /* arrival number of the next notification (nlock) */
    uint32_t *ntag;            /* tag -> notify position + 1, open addressing (notify.c) */
    size_t cap_ntag;
    struct fr_notify_peer *npeer;  /* unconsumed notifications per sending peer (nlock) */
    size_t nnpeer, cap_npeer;

    void *tp_state[FR_TP_COUNT];   /* per transport (FR_TP_*); ucx only when chosen */
    fr_fault *fault;           /* fault injection, NULL when off */

    struct {
        _Atomic uint64_t bytes_written, bytes_read, ops_completed, ops_failed;
        _Atomic uint64_t tickets_completed, tickets_aborted, tickets_failed, tickets_unknown;
        _Atomic uint64_t remote_refused, auth_refused, frames_rejected;
        _Atomic uint64_t notify_dropped;
        _Atomic uint64_t served_read_bytes, served_write_bytes, shm_maps_served;
        _Atomic uint64_t notify_peer_capped;
    } stats;
};

/* ---- serving remote accesses (target side) ---------------------------- */
/* Check a remote access and take a reference on the region so it cannot be
 * unregistered while the access is served. The whole op span
 * [span_addr, span_addr+span_len) must lie in the region (span_len 0: the
 * access itself), so every chunk of a partly-outside op is refused. need:
 * FERRY_REMOTE_READ or FERRY_REMOTE_WRITE. Returns 0 with *ptr (for addr)
 * set and *reg to release, or FERRY_EACCES (unknown key, access not allowed)
 * / FERRY_EFAULT (outside the region) and counts the refusal. */
int fr_region_acquire(ferry_engine *e, const fr_msg_rw *rw, unsigned need, ferry_region **reg,
                      uint8_t **ptr);
void fr_region_release(ferry_region *r);
/* Look up a region by key for shm MAP (under the engine lock). */
int fr_region_map_info(ferry_engine *e, uint64_t key, fr_msg_map_resp *out, int *fd);

/* Region bookkeeping used by the engine core (region.c). */
int fr_keytab_create(ferry_engine *e);
void fr_keytab_destroy(ferry_engine *e);
void fr_mem_destroy_all(ferry_engine *e);
void fr_region_destroy_all(ferry_engine *e);
/* Registered region covering [addr, addr+len) (engine lock held), or NULL. */
ferry_region *fr_region_find_local(ferry_engine *e, const uint8_t *addr, uint64_t len);

/* Peers (engine.c). Connect the peer if it has no live connection; a
 * failure fills err with the peer, the transport and why. */
int fr_peer_connect(ferry_engine *e, ferry_peer_id peer, ferry_error *err);
/* Post chunks to the peer's live connection; FERRY_ECONNRESET when there is
 * none (the caller completes the chunks). from_completion: called from a
 * transport's completion path (never blocks on a reset in progress). */
int fr_peer_post(ferry_engine *e, ferry_peer_id peer, fr_chunk **c, size_t n, bool from_completion);
/* Tickets (ticket.c), for engine close. */
void fr_tickets_wait_drained(ferry_engine *e);
/* The id of a ticket that pins r (engine lock held), 0 when none; *unknown:
 * whether its outcome is UNKNOWN. For ferry_region_unregister's refusal. */
uint64_t fr_ticket_pinning_locked(ferry_engine *e, const ferry_region *r, bool *unknown);
void fr_tickets_destroy_all(ferry_engine *e);

/* Deliver a notification that arrived from a peer: peer is the sending
 * engine's instance (from its authenticated handshake), which the bound on
 * unconsumed notifications (FERRY_NOTIFY_PENDING_MAX) is counted per. */
void fr_notify_deliver(ferry_engine *e, uint64_t peer, uint64_t tag, uint64_t value);
void fr_notify_destroy(ferry_engine *e);

/* ---- authentication (auth.c) -------------------------------------------- */
/* Client side: expects the server to be instance p->ep.instance. Returns 0
 * and the server's pid, or FERRY_EAUTH / FERRY_ESTALE / FERRY_EPROTO /
 * FERRY_ECONNRESET with err saying which. */
int fr_auth_client(ferry_engine *e, int fd, const fr_peer *p, uint16_t role,
                   uint16_t stream, uint32_t *server_pid, ferry_error *err);

/* The transport slot (FR_TP_*) running on e with memory hooks, or -1. */
int fr_mem_transport(const ferry_engine *e);
/* Called by a transport's stop() once nothing of it can touch memory any
 * more (its threads joined) and before it releases what its memory hooks
 * need: every region's registration with it goes (dereg) and so does every
 * allocation it made (mem_free, the memory gone as a memfd allocation's
 * goes at close); the regions and allocations stay listed until the
 * engine frees them. slot: the transport's FR_TP_*. */
void fr_mem_transport_stopping(ferry_engine *e, int slot);
/* A remote-accessible region of this engine by key, as a peer imports it
 * (base, length, flags, remote key); FERRY_EACCES when there is none or it
 * has no remote key. */
int fr_region_rkey_info(ferry_engine *e, uint64_t key, fr_import *out);

/* Stats helper. */
#define FR_STAT_ADD(e, field, n) atomic_fetch_add_explicit(&(e)->stats.field, (n), memory_order_relaxed)

#endif
