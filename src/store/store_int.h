/* store layer, internal API: the pure core of the master.
 *
 * Four pieces, each usable alone:
 *
 *   - small containers: an intrusive AVL tree, intrusive lists and two
 *     open-addressing hash maps (string keys, u64 keys);
 *   - fr_segalloc: an allocator of offsets inside one segment;
 *   - fr_meta: the master's metadata as a deterministic state machine,
 *     driven by explicit commands and an explicit clock (callers pass
 *     now_ms; nothing here reads the time). Every mutation is first
 *     expressed as a log record (fr_rec), applied through the same code path
 *     that replays it, then handed to a sink (the WAL);
 *   - fr_wal: the log directory: records appended and group-committed with
 *     fsync, snapshots, and recovery after a crash.
 *
 * Nothing here is thread-safe except fr_wal's append/sync/commit, which may
 * be called from several threads. An fr_meta belongs to one thread (the
 * master's event loop). Names are fr_*; the public API lives elsewhere. */
#ifndef FR_STORE_INT_H
#define FR_STORE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/base.h"

/* ---- limits ------------------------------------------------------------ */
#define FR_KEY_MAX 1024              /* bytes of a key or name, NUL excluded */
#define FR_MAX_REPLICAS 8
#define FR_PREFERRED_MAX 64          /* preferred segments in one put_start */
#define FR_VALUE_MAX (16u << 20)     /* a KV value or a queue record */
#define FR_BARRIER_MAX 65536         /* members of one barrier */
#define FR_POP_MAX 4096              /* records in one pop */
#define FR_OBJ_SIZE_MAX (1ull << 56) /* bytes of one object */
/* Largest encoded record: a value plus two names and fixed fields. */
#define FR_REC_MAX (FR_VALUE_MAX + 2 * FR_KEY_MAX + 256)

/* qsort that accepts an empty (NULL) array. */
static inline void fr_sort(void *v, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    if (n > 1)
        qsort(v, n, size, cmp);
}

#define fr_container_of(p, T, m) ((T *)(void *)((char *)(p) - offsetof(T, m)))

/* ---- intrusive doubly linked list (circular, with a head node) --------- */
typedef struct fr_dnode { struct fr_dnode *prev, *next; } fr_dnode;
static inline void fr_dlist_init(fr_dnode *n) { n->prev = n->next = n; }
static inline bool fr_dlist_empty(const fr_dnode *h) { return h->next == h; }
/* A node that was initialised or removed points at itself. */
static inline bool fr_dlist_linked(const fr_dnode *n) { return n->next != n; }
static inline void fr_dlist_push_back(fr_dnode *h, fr_dnode *n)
{
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}
static inline void fr_dlist_remove(fr_dnode *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* ---- AVL tree (intrusive, distinct keys) -------------------------------- */
/* The comparator orders nodes; a probe is a node embedded in a stack copy of
 * the containing struct with only the key fields set. All operations are
 * O(log n) and never allocate. */
typedef struct fr_avl_node { struct fr_avl_node *l, *r; int h; } fr_avl_node;
typedef int (*fr_avl_cmp_fn)(const fr_avl_node *a, const fr_avl_node *b);
typedef struct fr_avl { fr_avl_node *root; fr_avl_cmp_fn cmp; size_t n; } fr_avl;

void fr_avl_init(fr_avl *t, fr_avl_cmp_fn cmp);
void fr_avl_insert(fr_avl *t, fr_avl_node *x);  /* x's key must not be in t */
void fr_avl_remove(fr_avl *t, fr_avl_node *x);  /* x must be in t */
fr_avl_node *fr_avl_ceil(const fr_avl *t, const fr_avl_node *probe);   /* least >= probe */
fr_avl_node *fr_avl_higher(const fr_avl *t, const fr_avl_node *probe); /* least > probe */
fr_avl_node *fr_avl_floor(const fr_avl *t, const fr_avl_node *probe);  /* greatest <= probe */
fr_avl_node *fr_avl_first(const fr_avl *t);
fr_avl_node *fr_avl_last(const fr_avl *t);

/* ---- hash maps (open addressing, linear probing, backward-shift delete) */
/* Maps borrow keys: a string key must stay valid (usually it lives in the
 * item) until it is deleted. Neither map owns or frees items. Iteration
 * order depends on history, so nothing that must be deterministic may
 * depend on it: callers sort. */
typedef struct { uint64_t h; const char *key; void *item; } fr_sslot;
typedef struct fr_smap { fr_sslot *s; size_t cap, n; } fr_smap;
uint64_t fr_smap_hash(const char *key);
void fr_smap_init(fr_smap *m);
void fr_smap_fini(fr_smap *m);
/* Make room for `extra` more entries, so that the next `extra` puts cannot
 * fail. FERRY_ENOMEM, map unchanged. */
int fr_smap_reserve(fr_smap *m, size_t extra);
void *fr_smap_get(const fr_smap *m, const char *key, uint64_t h);
int fr_smap_put(fr_smap *m, const char *key, uint64_t h, void *item); /* key absent */
void *fr_smap_del(fr_smap *m, const char *key, uint64_t h);          /* the item or NULL */
/* Iterate: *pos starts at 0; returns the next item or NULL at the end. */
void *fr_smap_next(const fr_smap *m, size_t *pos);

typedef struct { uint64_t key; void *item; } fr_uslot;
typedef struct fr_umap { fr_uslot *s; size_t cap, n; } fr_umap;
void fr_umap_init(fr_umap *m);
void fr_umap_fini(fr_umap *m);
int fr_umap_reserve(fr_umap *m, size_t extra);
void *fr_umap_get(const fr_umap *m, uint64_t key);
int fr_umap_put(fr_umap *m, uint64_t key, void *item); /* key absent, item != NULL */
void *fr_umap_del(fr_umap *m, uint64_t key);
void *fr_umap_next(const fr_umap *m, size_t *pos);

/* ---- segment allocator --------------------------------------------------- */
/* Hands out byte ranges [off, off+len) of a segment of `size` bytes. Every
 * range is a whole number of granules (len is rounded up) and starts at a
 * multiple of max(align, granule). Free extents are kept coalesced in two
 * AVL trees (by offset, by (length, offset)); allocation is best fit among
 * extents that can hold the aligned range, O(log n). Release never
 * allocates memory, so it cannot fail on a valid range.
 *
 * find + reserve is how the metadata core allocates: the placement decision
 * (find) is separate from the state change (reserve), so replaying a log
 * record reserves exactly the range that was chosen the first time. */
typedef struct fr_segalloc fr_segalloc;
typedef struct fr_segalloc_stats {
    uint64_t size;          /* usable bytes (size rounded down to the granule) */
    uint64_t used, free;
    uint64_t largest_free;  /* longest free extent */
    uint64_t free_extents;
    uint64_t allocations;   /* reserved ranges outstanding */
} fr_segalloc_stats;

/* granule: a power of two >= 1. FERRY_EINVAL if size < granule. */
int fr_segalloc_new(uint64_t size, uint64_t granule, fr_segalloc **out);
void fr_segalloc_destroy(fr_segalloc *a);              /* accepts NULL */
/* Bytes a request of len takes: len rounded up to the granule (len 0 counts
 * as 1). 0 if that overflows. */
uint64_t fr_segalloc_round(const fr_segalloc *a, uint64_t len);
/* Where alloc would put a range: FERRY_ENOSPC when no extent can hold it,
 * FERRY_EINVAL for align not a power of two. Changes nothing. */
int fr_segalloc_find(const fr_segalloc *a, uint64_t len, uint64_t align, uint64_t *off);
int fr_segalloc_alloc(fr_segalloc *a, uint64_t len, uint64_t align, uint64_t *off);
/* Take exactly [off, off+round(len)): FERRY_EINVAL unless it lies inside
 * one free extent and off is granule-aligned; FERRY_ENOMEM (unchanged). */
int fr_segalloc_reserve(fr_segalloc *a, uint64_t off, uint64_t len);
/* Whether reserve(off, len) would succeed for lack of a conflict: the range
 * is granule-aligned, in bounds and inside one free extent. */
bool fr_segalloc_is_free(const fr_segalloc *a, uint64_t off, uint64_t len);
/* Give back a range taken by alloc/reserve with the same len. Coalesces
 * with free neighbours. FERRY_EINVAL if the range is out of bounds,
 * misaligned or overlaps free space (a double free). */
int fr_segalloc_release(fr_segalloc *a, uint64_t off, uint64_t len);
void fr_segalloc_get_stats(const fr_segalloc *a, fr_segalloc_stats *st);
uint64_t fr_segalloc_used(const fr_segalloc *a);       /* O(1) */
/* Visit free extents in ascending offset order; a non-zero return stops. */
typedef int (*fr_segalloc_visit_fn)(void *ctx, uint64_t off, uint64_t len);
int fr_segalloc_walk_free(const fr_segalloc *a, fr_segalloc_visit_fn fn, void *ctx);

/* ---- log records ----------------------------------------------------------- */
/* A record is one mutation of the metadata (or one piece of a snapshot).
 * Encoding, little-endian: u16 type, then the type's fields in the order of
 * the table below, nothing after. Field kinds: k = name (u16 length 1..
 * FR_KEY_MAX, no NUL byte), v = bytes (u32 length <= FR_VALUE_MAX), q = u64,
 * w = u32, b = u8 that is 0 or 1, s = u8, r = replicas (u8 n <=
 * FR_MAX_REPLICAS, then n x (u64 segment, u64 offset)), i = ids (u32 n in
 * 1..FR_POP_MAX, then n x u64). Decoding is canonical: re-encoding a
 * decoded record gives back the same bytes.
 *
 *   type               fields (fr_rec member)
 *   SEG_MOUNT        q id, q node, q size, q granule
 *   SEG_UNMOUNT      q id, q time
 *   NODE_DEAD        q node, q time
 *   PUT_START        k key, q size, q time, b flag (hard pin), r reps
 *   PUT_END, PUT_REVOKE, OBJ_EVICT, OBJ_REMOVE, KV_DEL    k key
 *   OBJ_LEASE        k key, q until
 *   KV_PUT           k key, v val
 *   BAR_ARRIVE       k key (barrier), k val (member), w count
 *   BAR_LEAVE        k key, k val
 *   Q_CONFIG         k key (queue), q bound
 *   Q_PUSH           k key (queue), v val (record bytes)
 *   Q_POP            q until, i ids
 *   Q_ACK, Q_NACK    q id
 *   Q_EXPIRE         q time
 * Snapshot only (accepted between fr_meta_load_begin and SNAP_END):
 *   SNAP_STATE       q rev (KV revision), q rev2 (compacted revision),
 *                    q id (next queue record id), q seq (touch sequence)
 *   SNAP_OBJ         k key, q size, s state, b flag, q until (lease),
 *                    q seq (touch), q time (created), q node (lost on),
 *                    q time2 (lost at), r reps
 *   SNAP_KV          k key, v val, q rev (mod), q rev2 (create), q version
 *   SNAP_KV_EVENT    q rev, s state (1 put, 2 delete), k key, v val
 *   SNAP_BAR         k key, w count, q seq (generation)
 *   SNAP_BAR_MEMBER  k key, k val
 *   SNAP_QUEUE       k key, q bound
 *   SNAP_QREC        q id, k key (queue), s state, w count (deliveries),
 *                    q until, v val
 *   SNAP_END         q count (records before it)
 * SEG_MOUNT appears in snapshots too. */
enum fr_rec_type {
    FR_REC_SEG_MOUNT = 1, FR_REC_SEG_UNMOUNT = 2, FR_REC_NODE_DEAD = 3,
    FR_REC_PUT_START = 4, FR_REC_PUT_END = 5, FR_REC_PUT_REVOKE = 6,
    FR_REC_OBJ_EVICT = 7, FR_REC_OBJ_REMOVE = 8, FR_REC_OBJ_LEASE = 9,
    FR_REC_KV_PUT = 10, FR_REC_KV_DEL = 11,
    FR_REC_BAR_ARRIVE = 12, FR_REC_BAR_LEAVE = 13,
    FR_REC_Q_CONFIG = 14, FR_REC_Q_PUSH = 15, FR_REC_Q_POP = 16,
    FR_REC_Q_ACK = 17, FR_REC_Q_NACK = 18, FR_REC_Q_EXPIRE = 19,
    FR_REC_SNAP_STATE = 64, FR_REC_SNAP_OBJ = 65, FR_REC_SNAP_KV = 66,
    FR_REC_SNAP_KV_EVENT = 67, FR_REC_SNAP_BAR = 68, FR_REC_SNAP_BAR_MEMBER = 69,
    FR_REC_SNAP_QUEUE = 70, FR_REC_SNAP_QREC = 71, FR_REC_SNAP_END = 72,
};

/* Borrowed bytes. Names in records are not NUL-terminated. */
typedef struct { const char *p; uint32_t n; } fr_span;
typedef struct { uint64_t seg, off; } fr_rec_rep;

/* A decoded (or to-be-encoded) record. Only the fields of its type matter.
 * Spans and ids_le point into the decoded buffer (borrowed). To encode
 * Q_POP set ids (host order); decoding sets ids_le (n x u64 LE), read it
 * with fr_rec_id(). */
typedef struct fr_rec {
    uint16_t type;
    fr_span key, val;
    uint64_t id, node, size, granule, time, time2, until, bound;
    uint64_t rev, rev2, version, seq, count, flag, state;
    uint32_t nrep;
    fr_rec_rep rep[FR_MAX_REPLICAS];
    uint32_t nids;
    const uint64_t *ids;
    const uint8_t *ids_le;
} fr_rec;

const char *fr_rec_type_name(uint16_t type);   /* "PUT_START", or "?" */
/* Encoded length of r, or 0 if r is not encodable (bad type or field). */
size_t fr_rec_size(const fr_rec *r);
/* Encode into buf (cap bytes). Returns the length, or FERRY_EINVAL (bad
 * record) / FERRY_EMSGSIZE (cap too small). */
int fr_rec_encode(const fr_rec *r, uint8_t *buf, size_t cap);
/* Decode exactly len bytes. FERRY_EPROTO for anything malformed: unknown
 * type, bad length, field out of range, trailing bytes. Never reads past
 * buf+len. */
int fr_rec_decode(const uint8_t *buf, size_t len, fr_rec *r);
uint64_t fr_rec_id(const fr_rec *r, uint32_t i);

/* ---- metadata core ----------------------------------------------------------- */
typedef struct fr_meta fr_meta;

typedef struct fr_meta_config {
    double high_watermark;        /* (0,1]; default 0.95 */
    uint64_t granule;             /* default segment granule (power of 2); 64 */
    uint64_t align;               /* object alignment in a segment; 64 */
    uint64_t kv_history_events;   /* watch history bound; 65536 */
    uint64_t kv_history_bytes;    /* 64 MiB */
    uint64_t pending_timeout_ms;  /* tick revokes older PENDING objects; 0 = never */
} fr_meta_config;
void fr_meta_config_default(fr_meta_config *cfg);

/* A record sink: called once per mutation with the encoded record, after the
 * mutation is applied and before the call that caused it returns. A sink
 * error leaves the state ahead of the log, so the meta refuses every later
 * mutation with FERRY_EIO: the owner must restart and recover. */
typedef int (*fr_rec_sink_fn)(void *ctx, const uint8_t *rec, size_t len);

/* cfg may be NULL (defaults). FERRY_EINVAL for a bad config. */
int fr_meta_new(const fr_meta_config *cfg, fr_meta **out);
void fr_meta_destroy(fr_meta *m);                           /* accepts NULL */
void fr_meta_set_sink(fr_meta *m, fr_rec_sink_fn fn, void *ctx);
/* Text of the last failure of a call on m (never NULL; "" if none). */
const char *fr_meta_errmsg(const fr_meta *m);
/* Mutations applied (live or replayed) since creation. */
uint64_t fr_meta_records(const fr_meta *m);

/* Apply one encoded record without sending it to the sink (recovery).
 * FERRY_EPROTO if it does not decode, FERRY_ECORRUPT if it does not apply
 * to the current state (the log and the state disagree), FERRY_ENOMEM.
 * On error nothing changed. */
int fr_meta_replay(fr_meta *m, const uint8_t *rec, size_t len);
/* Start loading a snapshot into an empty meta: records until SNAP_END are
 * snapshot records. FERRY_ESTATE if m is not empty. */
int fr_meta_load_begin(fr_meta *m);
bool fr_meta_loading(const fr_meta *m);
/* Emit the whole state as canonical snapshot records (sorted; SNAP_END
 * last) to fn. Loading them into an empty meta gives an identical state.
 * Read-only: m is not changed. */
int fr_meta_snapshot(fr_meta *m, fr_rec_sink_fn fn, void *ctx);
/* XXH3-128 over the snapshot records: equal digests, equal states. */
int fr_meta_digest(fr_meta *m, fr_hash128_t *out);

/* -- segments -- */
/* Mount a segment of `size` bytes owned by `node`. granule 0: the config's.
 * FERRY_EEXIST if the id is mounted; FERRY_EINVAL for size < granule. */
int fr_meta_mount(fr_meta *m, uint64_t seg_id, uint64_t node, uint64_t size, uint64_t granule);
/* Unmount: replicas on the segment are gone; objects left with none become
 * LOST. *lost (may be NULL): objects that became LOST. */
int fr_meta_unmount(fr_meta *m, uint64_t seg_id, uint64_t now_ms, uint64_t *lost);
/* Node death: every segment of `node` is unmounted as above. FERRY_ENOENT
 * if the node has no segment. */
int fr_meta_node_dead(fr_meta *m, uint64_t node, uint64_t now_ms, uint64_t *lost);
typedef struct fr_seg_info {
    uint64_t id, node, size, used, largest_free, objects;
} fr_seg_info;
int fr_meta_seg_info(const fr_meta *m, uint64_t seg_id, fr_seg_info *out);
/* Mounted segment ids, ascending, into ids; returns how many are mounted.
 * When that exceeds cap nothing is written: call again with room. */
size_t fr_meta_segments(const fr_meta *m, uint64_t *ids, size_t cap);

/* -- the master's view of liveness (meta_hold.c; nothing here is logged) -- */
/* Mark a segment unreachable since wall time since_ms (its node is suspect
 * or disconnected), or reachable again (since_ms 0). An unreachable segment
 * gets no new placement and reads of objects with no reachable replica fail
 * with FERRY_EUNREACH; its objects stay. A recovered or newly mounted
 * segment is reachable until marked. FERRY_ENOENT if not mounted. */
int fr_meta_seg_set_reachable(fr_meta *m, uint64_t seg_id, uint64_t since_ms);
/* Tag a PENDING object with the client that started it, a LEASED queue
 * record with the client that popped it (token: its delivery number). */
void fr_meta_set_writer(fr_meta *m, const char *key, uint64_t client);
void fr_meta_set_holder(fr_meta *m, uint64_t rec_id, uint32_t token, uint64_t client);
/* A client is gone: revoke the PENDING puts it started and return the
 * queue records it holds to their queues (delivered again at once).
 * Counts in *revoked and *returned (may be NULL). Errors are those of the
 * log (FERRY_EIO). */
int fr_meta_release_client(fr_meta *m, uint64_t client, uint64_t now_ms, uint64_t *revoked,
                           uint64_t *returned);

/* -- objects -- */
enum fr_obj_state { FR_OBJ_PENDING = 1, FR_OBJ_COMPLETE = 2, FR_OBJ_LOST = 3 };
typedef struct fr_replicate {
    uint32_t replica_num;          /* 0 means 1 */
    const uint64_t *preferred;     /* segment ids, tried first, in order */
    uint32_t npreferred;
    bool hard_pin;                 /* never evicted */
    uint64_t slot;                 /* placement slot (meta_slot.c); 0: none */
} fr_replicate;
typedef struct fr_replica_desc {
    uint64_t segment, node, offset;
    bool preferred;                /* landed on a segment the caller preferred */
} fr_replica_desc;
typedef struct fr_obj_desc {
    uint64_t size;
    uint32_t state;                /* enum fr_obj_state */
    bool hard_pin;
    uint64_t lease_until;          /* ms in the caller's clock; 0 = never leased */
    uint32_t nrep;
    fr_replica_desc rep[FR_MAX_REPLICAS];
} fr_obj_desc;

/* Reserve room for `size` bytes on replica_num distinct segments: the
 * preferred ones first when they have room, then the others (most free
 * first). A segment that would pass the high watermark, or has no extent
 * for the object, first evicts soft objects (COMPLETE, not hard-pinned, not
 * leased at now_ms) from that segment, least recently used first; the
 * evictions are kept even if the put fails. The object is PENDING
 * (invisible) until put_end. A LOST object of the same key is replaced.
 * Segments of unreachable nodes are never chosen. FERRY_EEXIST (key
 * pending or complete), FERRY_ENOSPC (fewer than replica_num segments can
 * hold it), FERRY_EUNREACH (enough segments are mounted but too few are
 * reachable now: transient), FERRY_EINVAL. out may be NULL. */
int fr_meta_put_start(fr_meta *m, const char *key, uint64_t size, const fr_replicate *rc,
                      uint64_t now_ms, fr_obj_desc *out);
/* PENDING -> COMPLETE (visible; most recently used). FERRY_ENOENT,
 * FERRY_ESTATE (not pending), FERRY_ELOST (its replicas died meanwhile). */
int fr_meta_put_end(fr_meta *m, const char *key, uint64_t now_ms);
/* Abandon a PENDING object: its space is freed. FERRY_ESTATE if complete. */
int fr_meta_put_revoke(fr_meta *m, const char *key, uint64_t now_ms);
/* Replicas of a COMPLETE object under a lease until max(current lease,
 * now_ms + lease_ms); marks it most recently used. While leased the object
 * cannot be removed or evicted. Only
 * replicas on reachable segments are listed: FERRY_EUNREACH when none is
 * (the message names the node and for how long). FERRY_ENOENT (absent or
 * pending), FERRY_ELOST (with the node and time in the message). */
int fr_meta_get(fr_meta *m, const char *key, uint64_t lease_ms, uint64_t now_ms, fr_obj_desc *out);
/* Where an object lives, any state, no lease, no LRU touch. */
int fr_meta_describe(const fr_meta *m, const char *key, fr_obj_desc *out);
/* FERRY_EBUSY while leased, FERRY_ESTATE if pending, FERRY_ENOENT. A LOST
 * object can be removed. */
int fr_meta_remove(fr_meta *m, const char *key, uint64_t now_ms);
typedef struct fr_remove_counts {
    uint64_t removed, skipped_leased, skipped_pending;
} fr_remove_counts;
/* Remove every COMPLETE or LOST object whose key starts with prefix ("" =
 * all), except leased ones; pending ones are left alone. Counts in *out. */
int fr_meta_remove_prefix(fr_meta *m, const char *prefix, uint64_t now_ms, fr_remove_counts *out);
/* 1 if COMPLETE, 0 if absent or pending, FERRY_ELOST if lost. */
int fr_meta_exist(fr_meta *m, const char *key);
/* COMPLETE keys with the prefix, strictly after `after` (NULL = from the
 * start), ascending byte order, at most max. keys[] borrows the strings:
 * valid until the next mutation of m; the array is the caller's to
 * fr_free(). */
typedef struct fr_keylist { const char **keys; size_t n; bool more; } fr_keylist;
int fr_meta_list(fr_meta *m, const char *prefix, const char *after, size_t max, fr_keylist *out);

/* -- KV -- */
typedef struct fr_kv_view {
    const uint8_t *val; size_t len;   /* borrowed until the next mutation of m */
    uint64_t mod_rev, create_rev, version;
} fr_kv_view;
int fr_meta_kv_get(fr_meta *m, const char *key, fr_kv_view *out);
/* Each successful put/cas/delete takes the next global revision (*rev). */
int fr_meta_kv_put(fr_meta *m, const char *key, const void *val, size_t len, uint64_t *rev);
/* Put only if the key's mod revision is `expected` (0: the key must not
 * exist). On a conflict FERRY_ESTATE and *rev = the key's mod revision (0
 * if absent). */
int fr_meta_kv_cas(fr_meta *m, const char *key, uint64_t expected, const void *val, size_t len,
                   uint64_t *rev);
/* expected 0: unconditional. FERRY_ENOENT, FERRY_ESTATE (conflict). */
int fr_meta_kv_delete(fr_meta *m, const char *key, uint64_t expected, uint64_t *rev);
uint64_t fr_meta_kv_revision(const fr_meta *m);
enum fr_kv_event_type { FR_KV_PUT = 1, FR_KV_DELETE = 2 };
typedef struct fr_kv_event {
    uint64_t rev; uint32_t type;
    const char *key; const uint8_t *val; size_t len;  /* borrowed until the next mutation */
} fr_kv_event;
/* Changes to keys with the prefix at revisions >= from_rev, oldest first,
 * at most max into ev; *n the count, *next_rev the revision to ask from
 * next time. from_rev 0 means "after now". FERRY_ERANGE if from_rev has
 * been compacted out of the bounded history (message says the oldest
 * revision still held). */
int fr_meta_kv_watch(fr_meta *m, const char *prefix, uint64_t from_rev, fr_kv_event *ev,
                     size_t max, size_t *n, uint64_t *next_rev);

/* -- barriers -- */
typedef struct fr_barrier_state {
    uint64_t generation;   /* arrive: the generation joined; status: the current one */
    uint32_t arrived, count;
    bool released;         /* arrive: this arrival completed the generation */
} fr_barrier_state;
/* Arrive at barrier `name` of `count` members. When the count-th distinct
 * member arrives the generation is released and the next one starts empty,
 * so a name can be reused. Arriving twice in one generation changes
 * nothing. FERRY_EINVAL if count differs from the generation's count. A
 * waiter that joined generation g is released once status shows > g. */
int fr_meta_barrier_arrive(fr_meta *m, const char *name, const char *member, uint32_t count,
                           fr_barrier_state *out);
/* Withdraw an arrival from the current generation (a waiter timed out).
 * FERRY_ENOENT if the member is not waiting. */
int fr_meta_barrier_leave(fr_meta *m, const char *name, const char *member);
int fr_meta_barrier_status(const fr_meta *m, const char *name, fr_barrier_state *out);

/* -- queues -- */
/* Records of a queue: READY (in FIFO order) or LEASED (popped, until an ack,
 * a nack or the lease's end at a tick). Ids are global and increasing. */
typedef struct fr_qrec_view {
    uint64_t id;
    uint32_t deliveries;   /* this delivery's number: the token for ack/nack */
    uint64_t lease_until;
    const uint8_t *data; size_t len;   /* borrowed until the next mutation */
} fr_qrec_view;
typedef struct fr_queue_stats { uint64_t ready, leased, bound; } fr_queue_stats;
/* Create a queue or change its bound (0: unbounded). */
int fr_meta_queue_config(fr_meta *m, const char *queue, uint64_t bound);
/* Append a record (the queue is created unbounded if absent). FERRY_EAGAIN
 * when ready + leased records reach the bound. */
int fr_meta_queue_push(fr_meta *m, const char *queue, const void *data, size_t len, uint64_t *id);
/* Lease up to n READY records until now_ms + lease_ms (lease_ms >= 1). */
int fr_meta_queue_pop(fr_meta *m, const char *queue, uint32_t n, uint64_t lease_ms,
                      uint64_t now_ms, fr_qrec_view *out, size_t *nout);
/* token: the delivery number from pop, or 0 to skip the check. ack removes
 * the record for good: FERRY_ENOENT if already acked; FERRY_ESTALE if it was
 * delivered again since (your lease lapsed). nack makes a LEASED record
 * READY again at the tail: FERRY_ESTATE if it is not leased. */
int fr_meta_queue_ack(fr_meta *m, uint64_t id, uint32_t token);
int fr_meta_queue_nack(fr_meta *m, uint64_t id, uint32_t token);
int fr_meta_queue_stats(const fr_meta *m, const char *queue, fr_queue_stats *out);

/* -- time -- */
typedef struct fr_tick_result { uint64_t redelivered, revoked; } fr_tick_result;
/* Expire queue leases that ended at or before now_ms (records go back to
 * READY at the tail) and revoke PENDING objects older than the configured
 * timeout. out may be NULL. */
int fr_meta_tick(fr_meta *m, uint64_t now_ms, fr_tick_result *out);
/* The earliest time a tick would change something, UINT64_MAX if none. */
uint64_t fr_meta_next_deadline(const fr_meta *m);

/* ---- write-ahead log, snapshots, recovery ------------------------------- */
/* A directory holds wal-<lsn>.flog logs (the first record's LSN, 16 hex
 * digits) and snap-<lsn>.fsnap snapshots (the last LSN they include), and a
 * LOCK file (flock: one owner at a time). Every file starts with a 32-byte
 * header, then frames; all little-endian:
 *
 *   header  0 magic "FERRYLOG" / "FERRYSNP", 8 u32 version (1), 12 u32 0,
 *           16 u64 lsn, 24 u64 XXH3-64 of bytes 0..23
 *   frame   0 u32 len, 4 u32 0, 8 u64 lsn, 16 record (len bytes),
 *           16+len u64 XXH3-64 of bytes 0..16+len-1
 *
 * LSNs are consecutive across logs; in a snapshot the frame LSNs count
 * from 1. A frame that is cut short or fails its check ends the log if
 * nothing valid follows it (a torn tail: the file is truncated there on
 * open); if a valid frame follows, the log is corrupt and open fails with
 * FERRY_ECORRUPT. */
#define FR_WAL_FILE_HDR 32
#define FR_WAL_FRAME_HEAD 16
#define FR_WAL_FRAME_TAIL 8
#define FR_WAL_VERSION 1
enum fr_wal_kind { FR_WAL_LOG = 1, FR_WAL_SNAP = 2 };

void fr_wal_hdr_encode(uint8_t out[FR_WAL_FILE_HDR], uint32_t kind, uint64_t lsn);
/* FERRY_EPROTO for a short, unknown or corrupt header. */
int fr_wal_hdr_decode(const uint8_t *in, size_t n, uint32_t *kind, uint64_t *lsn);
/* Frame rec (len bytes) into out (len + 24 bytes). Returns the frame size. */
size_t fr_wal_frame_encode(uint8_t *out, uint64_t lsn, const uint8_t *rec, size_t len);
typedef int (*fr_wal_frame_fn)(void *ctx, uint64_t lsn, const uint8_t *rec, size_t len);
typedef struct fr_wal_scan_result {
    size_t valid_len;    /* bytes of whole, valid frames from the start */
    uint64_t frames;
    uint64_t next_lsn;   /* first_lsn + frames */
    bool torn;           /* bytes after valid_len that are not a frame */
} fr_wal_scan_result;
/* Walk the frames of a file body (after its header); frame i must carry
 * LSN first_lsn + i. fn gets each valid frame in order; its error stops the
 * scan and is returned. FERRY_ECORRUPT if an invalid frame is followed by
 * a valid one or a frame has a valid check but the wrong LSN. */
int fr_wal_scan(const uint8_t *buf, size_t len, uint64_t first_lsn, fr_wal_frame_fn fn,
                void *ctx, fr_wal_scan_result *res);

typedef struct fr_wal fr_wal;
typedef struct fr_wal_opts {
    bool no_sync;        /* skip fsync (tests, benchmarks): not durable */
} fr_wal_opts;
typedef struct fr_wal_recovery {
    uint64_t snapshot_lsn;     /* 0: started without a snapshot */
    uint64_t replayed;         /* log records applied */
    uint64_t last_lsn;         /* LSN of the last record recovered */
    uint64_t torn_bytes;       /* dropped from the tail of the last log */
    uint32_t logs;             /* log files read */
} fr_wal_recovery;
/* Open (creating if needed) the directory, load the newest snapshot and
 * replay the logs into m, which must be empty and have no sink; truncate a
 * torn tail; then make the WAL m's sink. FERRY_EBUSY (another owner holds
 * the lock), FERRY_ECORRUPT (corruption that is not a torn tail, or a record
 * that does not apply), FERRY_EIO. On failure m holds a partial state: drop
 * it. rep may be NULL. */
int fr_wal_open(const char *dir, const fr_wal_opts *opts, fr_meta *m, fr_wal **out,
                fr_wal_recovery *rep);
/* A WAL for a state built elsewhere (a standby that followed a cluster's
 * log): dir (created if needed) must hold no log; m's state is written as
 * its first snapshot at LSN next_lsn - 1 and its records go on from
 * next_lsn, so that its numbering continues the state's. FERRY_EEXIST when
 * dir holds a log. */
int fr_wal_open_state(const char *dir, const fr_wal_opts *opts, fr_meta *m, uint64_t next_lsn,
                      fr_wal **out);
/* Commit what was appended, close the files and detach from m (if
 * attached). Accepts NULL. */
void fr_wal_close(fr_wal *w, fr_meta *m);
/* Buffer a record; *lsn (may be NULL) is its LSN. Durable only after a
 * commit that covers it. Thread-safe. */
int fr_wal_append(fr_wal *w, const uint8_t *rec, size_t len, uint64_t *lsn);
/* Group commit: return once every record up to lsn is durable. If no commit
 * is running, this caller writes and fsyncs everything appended so far;
 * otherwise it waits for the running one and checks again, so one fsync
 * covers every record appended before it started. deadline_ns: absolute
 * CLOCK_MONOTONIC, UINT64_MAX = forever (FERRY_ETIMEDOUT). After a write
 * or fsync failure every call returns FERRY_EIO: nothing is retried. */
int fr_wal_sync(fr_wal *w, uint64_t lsn, uint64_t deadline_ns);
int fr_wal_commit(fr_wal *w);               /* sync up to the last append */
/* Replicate from now on (docs/store.md, "High availability"): each group
 * commit, once written and fsynced here, is appended to the cluster's log
 * in etcd (ha_log.h) from entry next_seq on, fenced by epoch, before any
 * record of it counts as durable; a commit larger than an entry's limit
 * goes in several entries, cut between frames. When an append fails —
 * etcd unreachable, or the leadership of epoch gone (FERRY_ESTATE) — the
 * WAL refuses every later commit with that code: nothing it did not
 * replicate is ever acknowledged. NULL ha: local only again. */
struct fr_ha_elect;
void fr_wal_replicate(fr_wal *w, struct fr_ha_elect *ha, int64_t epoch, uint64_t next_seq);
/* The log entry the next replicated commit appends. */
uint64_t fr_wal_next_seq(fr_wal *w);
uint64_t fr_wal_last_lsn(fr_wal *w);
uint64_t fr_wal_durable_lsn(fr_wal *w);
typedef struct fr_wal_stats {
    uint64_t appends, fsyncs, bytes, log_bytes, snapshots;
    /* replicated (fr_wal_replicate): entries and bytes appended to the
     * cluster's log in etcd, the time those appends took, and the entry
     * the next commit appends */
    uint64_t ha_entries, ha_bytes, ha_ns, ha_next_seq;
} fr_wal_stats;
void fr_wal_stats_get(fr_wal *w, fr_wal_stats *st);
/* Snapshot m (which must be this WAL's meta, quiescent: no mutation runs
 * meanwhile) and rotate: commit, start a new log at the next LSN, write
 * snap-<last>.fsnap (tmp, fsync, rename, fsync dir), then delete logs and
 * snapshots it makes redundant. On failure the older files stay and
 * recovery still works. */
int fr_wal_checkpoint(fr_wal *w, fr_meta *m);

/* Internal to the WAL files: log file helpers shared by wal.c and
 * wal_dir.c. */
int fr_wal_write_all(int fd, const uint8_t *buf, size_t len);
int fr_wal_fsync_dir(int dirfd);

#endif
