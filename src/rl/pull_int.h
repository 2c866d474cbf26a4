/* rl internals of the single-pull group update (pull.c, pull_demand.c,
 * pull_plan.c).
 *
 * Every member describes its parameter shards as fragments of a target
 * placement (tensor, box, element strides, address, registration) in a
 * demand record. From every member's record, every member computes the
 * same group plan: identical boxes form replica sets; a set held by more
 * than one member is cut into pieces of whole rows (about 4 MiB), and
 * each piece gets one reader among the holders (readers.c: NIC balance,
 * one push per other node, then forwarded inside it). A member's own
 * reads are a target placement of the pieces it reads, planned against
 * the generation's stored placement by the reshard planner (strided runs,
 * one store read each); a push is the piece's box copied from the
 * reader's buffer into another holder's, lowered by ferry_box_lower into
 * strided WRITEs. Records carry boxes, not runs: a kimi-k2 worker of an
 * EP16 x TP8 group describes its ~5,200 shards in at most 406,832 bytes
 * (`ferry bench weights --scale`). */
#ifndef FR_RL_PULL_INT_H
#define FR_RL_PULL_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/weights.h"
/* siblings by their own names, so that the CLI (whose include path is the
 * public headers) can reach the planning code too */
#include "gen_int.h"
#include "keys.h"
#include "rl_int.h"

#define FR_SUB_PIECE (4ull << 20)   /* shared sets are cut into pieces of about this */
#define FR_SUB_WHOLE_PART (64ull << 20)   /* a set read whole moves in parts of about this */

/* One member's shard as a fragment of the group's target placement. */
typedef struct fr_sfrag {
    uint32_t worker, shard, tensor, ndim;
    const uint64_t *dims;        /* offset[ndim], shape[ndim], strides[ndim] (elements): in
                                  * the record itself where it is aligned (little-endian
                                  * hosts), else a copy */
    uint64_t addr;               /* its memory in the member's process */
    uint64_t key;                /* its registration's remote key */
} fr_sfrag;

typedef struct fr_member {
    uint32_t node;
    uint64_t segment;            /* the store segment on its node (0: unknown) */
    uint32_t nshards;
    fr_sfrag *frags;
    ferry_peer_id peer;          /* its engine, imported (the worker id when not) */
    void *owned;                 /* frags and dims, when allocated for it */
    char where[80];              /* " (node N at ADDR:PORT)": for errors that name it */
} fr_member;

/* Memory for a plan's large arrays: an anonymous mapping asked for huge
 * pages. On machines whose page tables the hypervisor shadows (the
 * development machines), the first touch of each fresh 4 KiB page costs
 * more than what the plan computes in it. *mapped: what to unmap. */
void *fr_sub_map(size_t n, size_t *mapped);
void fr_sub_unmap(void *p, size_t mapped);

/* The pushes of one hop: WRITE ops in plan order and what this worker
 * sends and receives on the hop, per worker (the notification protocol,
 * pull.c "apply"). */
typedef struct fr_pushes {
    ferry_op *ops;
    uint32_t *to;
    size_t *dep;                   /* hop 1: the index of my read piece that brings the bytes;
                                    * hop 2: how many of via's hop-1 WRITEs into me
                                    * must have landed */
    uint32_t *via;                 /* hop 2: the reader whose WRITE brings the bytes
                                    * (UINT32_MAX: none to wait for) */
    uint32_t *shard;               /* my shard each WRITE copies from */
    bool *last;                    /* it carries the last part of its set (fr_work.whole) */
    size_t n, cap;
    uint64_t *expect, *total;      /* plan: WRITEs each worker sends me; I send each */
    bool *progress;                /* plan, hop 1: it forwards my bytes: tell it early */
    uint64_t *got, *sent, *done;   /* run: landed so far; submitted; landed (sending) */
    bool *failed, *out_failed;     /* run: it sends me nothing more; it gets nothing more */
    bool *viewed;                  /* run: what it counted for me is in its memory, for me to
                                    * take through a view (it wrote nothing: fr_sub_hooks) */
} fr_pushes;

/* One piece this worker reads: reads [first, first + n) of work.io. */
typedef struct fr_rpiece {
    size_t first, n;
    uint64_t bytes;
    uint32_t shard;                /* my shard it lands in */
    bool last;                     /* the last part of its set (fr_work.whole: a set read
                                    * whole moves in parts; it is checked after this one) */
} fr_rpiece;

typedef struct fr_work {
    fr_rpiece *reads;
    size_t nreads, cap_reads;
    /* My reads, executed by exec: the read pieces are a target placement
     * (rt, fragment i = read piece i, bound at raddr[i]) planned against
     * the stored placement (rplan) and lowered once by
     * ferry_exec_store_lower into io, piece by piece; every update binds
     * rt at its generation, attests rplan and runs io's reads batch by
     * batch (pull.c). */
    ferry_manifest *rt;
    ferry_plan *rplan;
    uint64_t *raddr;
    ferry_store_reads io;
    size_t ngreads;                /* io.n: store reads (strided) */
    fr_pushes hop[2];              /* from the reader; forwarded inside a node */
    uint64_t group_read, my_read, pushed, received;
    uint64_t wrote_cross, wrote_intra;   /* run: bytes my WRITEs carried to another node's
                                          * workers, to my node's */
    /* Set before planning: shared sets are not cut into pieces (every set
     * has one reader, which reads it whole: compatibility mode's tensors) */
    bool whole;
    const fr_rd_seed *seed;        /* ... and, non-NULL, the loads the assignment starts from */
    uint64_t *wread, *wfwd;        /* per worker, the assignment's loads after this plan (with
                                    * loads[]: the seed of a plan made after this one) */
    /* per shard of mine: the member whose push brings its bytes, me when I
     * read it, UINT32_MAX when several do (pieces from several readers) */
    uint32_t *src;
    /* the group's plan, for the counters (the same on every worker) */
    fr_rd_summary sum;
    uint32_t nnodes;
    uint32_t *node_id, *node_workers;
    uint64_t *node_read;
    fr_rd_load *loads;
    uint64_t sets, shared_sets;    /* replica sets, of them held by more than one member */
} fr_work;

/* This worker's demand record (gen_int.h's placement: tensor indices of g). */
int fr_sub_encode(const ferry_subscriber_config *cfg, const fr_gen *g,
                  const ferry_param_shard *shards, size_t n, ferry_region *const *regs,
                  ferry_engine *e, uint8_t **out, size_t *len, ferry_error *err);
/* Reset every peer of the subscriber's engine that a ticket left UNKNOWN
 * by an earlier, failed update fences (pull.c: an update's first step). */
void fr_sub_unfence(ferry_subscriber *sub);

/* Decode member `worker`'s record into mb; with e, its endpoint is
 * imported (else mb->peer = worker). Every count, tensor and box is
 * checked against g, and the record against its digest. mb points into
 * the record, which must outlive it. Its arrays are carved out of space,
 * fr_sub_decode_size(b, len) bytes (8-aligned), or allocated when space
 * is NULL. */
int fr_sub_decode(const uint8_t *b, size_t len, uint32_t worker, uint64_t gen, const fr_gen *g,
                  ferry_engine *e, fr_member *mb, void *space, ferry_error *err);
size_t fr_sub_decode_size(const uint8_t *b, size_t len);
void fr_member_free(fr_member *mb);

/* The whole plan of worker `me` of a group of `world`: its read pieces
 * with their strided reads (planned against g's stored placement), its
 * pushes and what it receives. Pure: no store or engine calls. */
int fr_sub_plan(const fr_gen *g, const fr_member *mbs, uint32_t world, uint32_t me,
                fr_work *w, ferry_error *err);
/* The exec side of my reads at generation g: rt bound where my pieces
 * live, rplan attested for g (free both). */
int fr_sub_read_binding(const fr_work *w, const fr_gen *g, ferry_binding **b,
                        ferry_attested_plan **att, ferry_error *err);
int fr_work_init(fr_work *w, uint32_t world);
void fr_work_free(fr_work *w);
/* Forget the run state of a reused plan (what landed, was sent, failed). */
void fr_work_reset(fr_work *w, uint32_t world);

/* What a member keeps between updates: its last plan and the members it
 * was built from, reused while every member's record (but its generation)
 * and the stored placement hash the same. Zero it to start. */
typedef struct fr_sub_cache {
    fr_work plan;
    fr_member *mbs;                /* world of them, decoded */
    ferry_kv_value *recs;          /* the records they point into, owned */
    uint32_t world;
    void *arena;                   /* the members' arrays (fr_sub_map) */
    size_t arena_len;
    bool valid, reused;            /* a plan is held; the last call reused it */
    uint8_t key[16];
    uint64_t epoch;                /* set by the caller before each call: an elastic group's
                                    * membership epoch, part of the key (0: fixed) */
    bool whole;                    /* plans with fr_work.whole */
    fr_rd_seed seed;               /* plans from these loads (seed.load NULL: none); the
                                    * caller keys them in epoch */
} fr_sub_cache;

/* The plan of worker `me` from every member's record recs[0..world)
 * (record k is worker k's): the cached one when nothing it depends on
 * changed (the records' digests and the stored placement, hashed: nothing
 * decoded, c->reused), else every record decoded (with e, the others'
 * endpoints imported) and planned anew; then the cache takes the records
 * over (recs[k].val is set to NULL; it frees them with ferry_store_free).
 * FERRY_ESTATE when a member is at another generation. */
int fr_sub_plan_records(fr_sub_cache *c, const fr_gen *g, ferry_kv_value *recs,
                        uint32_t world, uint32_t me, ferry_engine *e, ferry_error *err);
void fr_sub_cache_free(fr_sub_cache *c);

/* ---- the group update under another mode's control (compat.c) ------------------------- */

/* What compatibility mode (compat.c) changes in a group update whose
 * shards are whole tensors in its staging: the memory is registered by
 * the caller; each shared set is read whole by one reader, whose bytes
 * are checked by `verify` where they come to a node (by the reader after
 * its read, by a worker that forwards them before it forwards, never
 * twice in one worker) before they leave it; a worker of the reader's
 * node marked in `view` is sent no WRITE: the NOTIFY that counts its
 * bytes says VIEW, and it takes them from the sender's memory itself;
 * every target hears what landed after every batch (a liveness signal). */
typedef struct fr_sub_hooks {
    ferry_region *region;          /* every shard lies inside it (not registered again) */
    const bool *view;              /* per member (NULL: none) */
    int (*verify)(void *ctx, uint32_t shard, ferry_error *err);
    void *ctx;
} fr_sub_hooks;
void fr_subscriber_set_hooks(ferry_subscriber *sub, const fr_sub_hooks *h);
/* Plan with fr_work.whole: every set read whole by one reader. */
void fr_subscriber_set_whole(ferry_subscriber *sub);
/* Plan the next round from the loads after plan w (another subscriber's,
 * made before: the reader assignment balances across both). */
void fr_subscriber_seed(ferry_subscriber *sub, const fr_work *w);
/* One update of sub's group to the generation of m (prepared by the
 * caller: nothing is read or leased again), or, m NULL, the exchange that
 * tells the group why this worker cannot take part (why). No post-apply
 * barrier: the caller's next round or barrier is the group's meeting.
 * *derived: the failure came from a worker that fed this one (it knows the
 * cause). */
int fr_sub_round_given(ferry_subscriber *sub, const ferry_weight_manifest *m, uint64_t gen,
                       const ferry_error *why, ferry_update_stats *st, bool *derived,
                       ferry_error *err);
/* The plan of the last round (NULL before one was made). */
const fr_work *fr_subscriber_work(const ferry_subscriber *sub);
/* Remove this worker's demand record of generation gen (after the group met). */
void fr_subscriber_forget(ferry_subscriber *sub, uint64_t gen);
void fr_subscriber_set_scope(ferry_subscriber *sub, const char *scope);

/* ---- elastic groups (pull_elastic.c over members.c) ------------------------------------- */

struct fr_members;
/* A conflict of a member's shards with the generation's layout: a tensor
 * it is not in, a box outside it, a buffer too small. */
static inline bool fr_layout_conflict(int rc)
{
    return rc == FERRY_ENOENT || rc == FERRY_EINVAL || rc == FERRY_ERANGE;
}

/* One update of an elastic group: this member's position among world,
 * for generation gen, update seq of membership epoch `epoch`. The
 * exchange says whether this member prepared but its shards do not fit
 * the generation (self_layout: it left the group before it told the
 * others, so the next epoch they make does not name it), and the code
 * another member told the group it cannot take part with (others_code,
 * 0: none). */
typedef struct fr_sub_round {
    uint32_t me, world;
    uint64_t gen, seq, epoch;
    bool self_layout;
    int others_code;
} fr_sub_round;
/* pull.c: run that update (st is reset; its membership fields are set). */
/* pull_agree.c: a fixed group's members agree, at every update call, on
 * the generation to take (*target: the newest any member saw announced)
 * and whether to move (*need: some member holds less); held: this
 * member's. The same answer on every member, or every member fails. */
int fr_sub_agree(ferry_store *s, const char *model, const char *scope, uint32_t me, uint32_t world,
                 uint64_t held, uint64_t timeout_ms, uint64_t *target, bool *need, ferry_error *err);
int fr_sub_round_run(ferry_subscriber *sub, fr_sub_round *r, uint64_t *generation,
                     ferry_update_stats *st, ferry_error *err);
const ferry_subscriber_config *fr_sub_config(const ferry_subscriber *sub);
ferry_store *fr_sub_store(const ferry_subscriber *sub);
/* pull_elastic.c: ferry_subscriber_update of an elastic member. */
int fr_sub_elastic_update(ferry_subscriber *sub, struct fr_members *mem, uint64_t *generation,
                          ferry_update_stats *st, ferry_error *err);

/* ---- standby copies (pull_standby.c; weights.h, ferry_subscriber_open_standby) ---- */

/* Two copies of a subscriber's shards. The updating thread swaps the
 * target copy's buffers into the shards (what register and the demand
 * record use) and keeps the other copy's registration and plan here, so
 * that each copy is registered once and each copy's plan is reused while
 * the members alternate in step. Readers pin a copy by counting
 * themselves in it (readers[]) and re-checking `active`; an update waits
 * for the target's count to drop to 0 after publishing nothing yet. */
typedef struct fr_standby {
    size_t n;
    void **bufs[2];                  /* per copy, n buffers (copy 0: the shards' dst) */
    _Atomic uint32_t active;
    _Atomic uint64_t gen[2];
    _Atomic uint64_t readers[2];
    uint32_t held;                   /* the copy the subscriber's spans and plan describe */
    fr_rl_spans spans;               /* the other copy's registration */
    fr_sub_cache pc;                 /* the plan made while the other copy was advertised */
    bool checked;                    /* the copies were found disjoint */
    ferry_standby_flip_fn fn;
    void *ctx;
} fr_standby;

/* Before an update's demand goes out: wait (timeout_ms) until no reader
 * holds the standby copy, check once that the copies do not overlap, and
 * make the standby copy the target (shards' dst, *spans and *pc swapped
 * with the ones kept for it). Nothing is written on a failure. */
int fr_standby_begin(fr_standby *sb, const fr_gen *g, ferry_param_shard *shards,
                     fr_rl_spans *spans, fr_sub_cache *pc, uint64_t timeout_ms,
                     ferry_error *err);
/* After the post-apply barrier: the target holds gen and becomes active;
 * the callback runs. */
void fr_standby_flip(fr_standby *sb, uint64_t gen);
/* A failed update: err's message says that nothing flipped. */
void fr_standby_failed(const fr_standby *sb, ferry_error *err);
void fr_standby_free(fr_standby *sb);
/* pull.c: the subscriber's standby copies (NULL: none), and attaching them. */
fr_standby *fr_subscriber_standby(const ferry_subscriber *sub);
void fr_subscriber_set_standby(ferry_subscriber *sub, fr_standby *sb);

/* ---- overlapped updates (pull_early.c) ------------------------------------------------- */
typedef struct fr_early fr_early;
/* The generation the last update took, kept when the subscriber can
 * overlap (standby copies, a fixed group, not compatibility mode), NULL
 * otherwise or when none is held. */
fr_gen *fr_sub_held(ferry_subscriber *sub);
bool fr_sub_can_overlap(const ferry_subscriber *sub);
/* One overlapped round of generation next planned on gs (NULL: this
 * member cannot, why says so and the group hears it): its records and
 * barriers under the group's "early" scope, the standby copy its target,
 * fr_early_wait between the plan and the apply, fr_early_outcome before
 * the post-apply barrier. Nothing flips. */
int fr_sub_early_round(ferry_subscriber *sub, fr_early *ea, const fr_gen *gs, uint64_t next,
                       const ferry_error *why, ferry_update_stats *st, ferry_error *err);
/* The group's verdict was "ok": the standby copy (holding next) flips. */
void fr_sub_early_took(ferry_subscriber *sub, uint64_t next);
/* A plain update of a fixed group (ferry_subscriber_update's round). */
int fr_sub_update_round(ferry_subscriber *sub, uint64_t *generation, ferry_update_stats *st,
                        ferry_error *err);
/* Until every trainer rank has stored its part of the generation. */
int fr_early_wait(fr_early *ea, ferry_error *err);
/* The release number of the round's demand barrier: the same on every
 * member, new for every round (a retried generation included). */
void fr_early_round_id(fr_early *ea, uint64_t release);
/* This member's outcome of the round's apply (rc), for the verdict. */
void fr_early_outcome(fr_early *ea, int rc);
/* Advise the buffers of shards (bufs[i], or shards[i].dst when bufs is
 * NULL) whose dst_bytes the caller gave for huge pages (spans.c). */
void fr_sub_advise(const ferry_param_shard *shards, void *const *bufs, size_t n);

#endif
