/* Private to the meta_*.c files: the state behind fr_meta and the helpers
 * its parts share. Every mutation goes through meta_commit (live) or
 * meta_apply (replay), and meta_apply dispatches to the part that owns the
 * record type. An apply function either applies its record entirely or
 * returns an error having changed nothing. */
#ifndef FR_META_INT_H
#define FR_META_INT_H

#include <string.h>

#include "store/store_int.h"

typedef struct meta_obj meta_obj;

typedef struct meta_seg {
    uint64_t id, node, size, granule;
    uint64_t hw_limit;        /* bytes used above which placement evicts first */
    fr_segalloc *alloc;
    fr_dnode reps;            /* every replica on the segment (meta_rep.in_seg) */
    fr_dnode lru;             /* replicas of evictable objects, least recently used first */
    uint64_t nreps;
    uint64_t lru_bytes;       /* bytes held by the replicas on lru */
    uint64_t unreachable_since; /* wall ms its node became unreachable; 0: reachable. Not
                               * logged: the master's view of its nodes (meta_hold.c) */
} meta_seg;

typedef struct meta_rep {
    meta_seg *seg;            /* NULL once the segment is gone */
    uint64_t off;
    meta_obj *obj;
    fr_dnode in_seg, in_lru;
} meta_rep;

struct meta_obj {
    char *key;                /* points into the same allocation */
    uint64_t hash;
    uint64_t size;
    uint32_t state;           /* enum fr_obj_state */
    bool hard_pin;
    uint32_t nslots, nlive;   /* replica slots; slots whose segment lives */
    uint64_t lease_until, touch_seq, created;
    uint64_t lost_node, lost_at;
    fr_dnode pending;         /* in fr_meta.pending while PENDING */
    uint64_t writer;          /* client that started a PENDING put; 0: unknown. Not logged */
    uint64_t slot;            /* put_start's placement slot (meta_slot.c); 0: none. Not
                               * logged: a hint, lost with a restart */
    meta_rep rep[];
};

typedef struct kv_entry {
    char *key; uint64_t hash;
    uint8_t *val; size_t len;
    uint64_t mod_rev, create_rev, version;
} kv_entry;

typedef struct kv_event {
    uint64_t rev; uint32_t type;
    char *key; uint8_t *val; size_t len;
} kv_event;

typedef struct barrier {
    char *key; uint64_t hash;
    uint32_t count;           /* of the current generation; 0 while empty */
    uint64_t gen;
    char **members;           /* sorted (strcmp) */
    size_t n, cap;
} barrier;

typedef struct queue {
    char *name; uint64_t hash;
    uint64_t bound;
    fr_dnode ready;           /* READY records, delivery order */
    uint64_t nready, nleased;
} queue;

enum { QREC_READY = 1, QREC_LEASED = 2 };
typedef struct qrec {
    uint64_t id;
    queue *q;
    uint32_t state, deliveries;
    uint64_t until;           /* lease end while LEASED */
    fr_dnode link;            /* in q->ready while READY */
    fr_avl_node by_lease;     /* in fr_meta.qleases while LEASED, by (until, id) */
    bool mark;
    uint64_t holder;          /* client holding the lease while LEASED; 0: unknown. Not logged */
    size_t len;
    uint8_t data[];
} qrec;

struct fr_meta {
    fr_meta_config cfg;
    fr_umap segs;             /* id -> meta_seg */
    fr_smap objs;             /* key -> meta_obj */
    meta_obj *last_obj;       /* the last object found: a command and its
                               * apply look the same key up twice */
    fr_dnode pending;         /* PENDING objects, oldest first */
    uint64_t touch_seq;       /* last LRU stamp handed out */
    uint64_t clock;           /* latest now_ms seen: time never runs backwards */
    uint64_t nrecords;
    /* KV */
    fr_smap kv;
    uint64_t kv_rev, kv_compact_rev;
    kv_event **hist;          /* ring of the last changes, oldest at hist_head */
    size_t hist_cap, hist_head, hist_n;
    uint64_t hist_bytes;
    fr_smap bars;
    fr_barrier_state bar_last;  /* set by a BAR_ARRIVE apply */
    /* queues */
    fr_smap queues;
    fr_umap qrecs;            /* id -> qrec */
    fr_avl qleases;
    uint64_t q_next_id;
    uint64_t *ids;            /* pop's id list */
    size_t ids_cap;
    /* log */
    fr_rec_sink_fn sink;
    void *sink_ctx;
    uint8_t *enc;
    size_t enc_cap;
    bool broken, loading;
    uint64_t load_count;
    uint64_t last_lost;       /* set by unmount/node-death applies */
    uint64_t evictions;       /* soft objects evicted by placement since made (metrics) */
    uint64_t nobj[4];         /* objects by state (enum fr_obj_state), kept by meta_obj.c */
    uint64_t complete_bytes;  /* bytes of COMPLETE objects, likewise */
    void **scratch;           /* for applies and read-only walks */
    size_t scratch_cap;
    struct meta_cand *cand;   /* placement candidates (put_start only) */
    struct meta_slots *slots; /* where objects of each placement slot were (meta_slot.c) */
    size_t cand_cap;
    char err[512];
};

/* meta.c */
int meta_fail(fr_meta *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int meta_commit(fr_meta *m, const fr_rec *r);
uint64_t meta_now(fr_meta *m, uint64_t now);
int meta_check_name(fr_meta *m, const char *what, const char *name);
static inline fr_span meta_span(const char *s)
{
    fr_span sp = { s, s != NULL ? (uint32_t)strnlen(s, FR_KEY_MAX + 1) : 0 };
    return sp;
}
/* Copy a record name into a NUL-terminated buffer. */
static inline void meta_cstr(char buf[FR_KEY_MAX + 1], fr_span s)
{
    memcpy(buf, s.p, s.n);
    buf[s.n] = '\0';
}
int meta_scratch(fr_meta *m, size_t n);
bool meta_prefix(const char *key, const char *prefix, size_t plen);
int meta_cmp_str(const void *a, const void *b);   /* qsort over const char * */

/* meta_slot.c: where the objects of each placement slot were */
void meta_slot_freed(fr_meta *m, uint64_t slot, uint64_t seg, uint64_t off, uint64_t len);
bool meta_slot_place(const fr_meta *m, uint64_t slot, const meta_seg *s, uint64_t len,
                     uint64_t *off);
void meta_slot_free_all(fr_meta *m);

/* meta_obj.c */
int meta_obj_apply(fr_meta *m, const fr_rec *r);
void meta_drop_seg(fr_meta *m, meta_seg *s, uint64_t node, uint64_t now);
void meta_obj_free_all(fr_meta *m);
int meta_obj_finish_load(fr_meta *m);
meta_obj *meta_obj_find(fr_meta *m, const char *key);
const char *meta_obj_state_name(uint32_t s);
uint64_t meta_obj_next_deadline(const fr_meta *m);
int meta_obj_tick(fr_meta *m, uint64_t now, uint64_t *revoked);

/* meta_kv.c */
int meta_kv_apply(fr_meta *m, const fr_rec *r);
void meta_kv_free_all(fr_meta *m);
int meta_kv_finish_load(fr_meta *m);

/* meta_queue.c */
int meta_queue_apply(fr_meta *m, const fr_rec *r);
void meta_queue_free_all(fr_meta *m);
int meta_qlease_cmp(const fr_avl_node *a, const fr_avl_node *b);

/* meta_snap.c: writing goes through snap_emit, which numbers the records. */
typedef struct snap_out {
    fr_meta *m;
    fr_rec_sink_fn fn;
    void *ctx;
    uint64_t count;
    uint8_t *buf;
    size_t cap;
} snap_out;
int snap_emit(snap_out *o, const fr_rec *r);
int meta_obj_snapshot(fr_meta *m, snap_out *o);
int meta_kv_snapshot(fr_meta *m, snap_out *o);
int meta_queue_snapshot(fr_meta *m, snap_out *o);

/* meta_bar.c */
int meta_bar_apply(fr_meta *m, const fr_rec *r);
void meta_bar_free_all(fr_meta *m);
int meta_bar_snapshot(fr_meta *m, snap_out *o);

#endif
