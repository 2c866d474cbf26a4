/* rl internals of the delta encoder (weights.h, docs/sparse.md "Deltas from
 * a trainer"): delta.c keeps the encoder, its layout and its snapshot and
 * compares; delta_publish.c runs a publish across the ranks. */
#ifndef FR_RL_DELTA_INT_H
#define FR_RL_DELTA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/weights.h"

/* Elements compared at a time (the conversion and index buffers). */
#define FR_DELTA_CHUNK 16384u

/* One tensor of the placement as a publish sees it. */
typedef struct fr_dtensor {
    char *name;
    char dtype[16];                 /* as the trainer holds it */
    char out[16];                   /* the rollout dtype */
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint32_t owner;                 /* the rank that puts its sparse object */
    bool i64;                       /* indices in i64 (an extent past INT32_MAX) */
} fr_dtensor;

/* One copy-0 piece this rank stores. */
typedef struct fr_dpiece {
    uint64_t fragment;              /* its id in the placement */
    uint32_t tensor;                /* its tensor's index */
    uint64_t offset[FERRY_MAX_DIMS], shape[FERRY_MAX_DIMS];
    uint64_t elems;
    uint8_t *snap;                  /* the encoder's: elems in the rollout dtype */
    /* this publish */
    const void *data;
    bool has_strides;
    uint64_t strides[FERRY_MAX_DIMS], storage_offset;
    uint64_t *chg;                  /* changed elements (row-major in the box), ascending */
    uint8_t *val;                   /* their new values in the rollout dtype */
    uint64_t nchg;
    size_t chg_cap, val_cap;
} fr_dpiece;

typedef struct fr_dlayout {
    fr_dtensor *t;
    uint32_t nt;
    fr_dpiece *p;
    size_t np;
} fr_dlayout;

struct ferry_delta_encoder {
    ferry_publisher_config pc;      /* rank_node points at rank_node below */
    uint32_t *rank_node;            /* NULL when the caller gave none */
    ferry_delta_config dc;          /* resolved */
    bool have;                      /* the snapshot holds generation `last` */
    uint64_t last;
    uint32_t chain;                 /* deltas since the dense generation */
    fr_dlayout lay;                 /* the snapshot's layout (p[i].snap) */
    uint64_t bytes;                 /* the snapshot's */
    uint64_t words;                 /* the generation whose words this rank left (0: none) */
    uint64_t failed_base;           /* the base of this rank's last attempt when it failed */
    int fail_at;                    /* tests only (fr_delta_fail_at) */
    uint64_t sample_min;            /* tests only (fr_delta_sample_min); 0: FR_DELTA_SAMPLE_MIN */
};

/* Tests only: make this encoder's rank fail a sparse publish once its
 * objects are stored — FR_DELTA_FAIL_STORED: its "stored" word says it
 * failed (FERRY_EIO); FR_DELTA_DIE_STORED: the process exits (status 3)
 * there, as a rank that died. FR_DELTA_FAIL_NONE: no more. */
enum { FR_DELTA_FAIL_NONE = 0, FR_DELTA_FAIL_STORED = 1, FR_DELTA_DIE_STORED = 2 };
void fr_delta_fail_at(ferry_delta_encoder *e, int what);
/* Tests only: the sample decides from n sampled elements on (small models). */
void fr_delta_sample_min(ferry_delta_encoder *e, uint64_t n);

/* The layout of a publish: the placement's tensors (owners chosen) and
 * this rank's copy-0 pieces with their data from mine. FERRY_EINVAL with a
 * sentence (a piece without data, a dtype that cannot be a delta's). */
int fr_delta_layout(const ferry_delta_encoder *e, ferry_manifest *placement,
                    const ferry_shard_data *mine, size_t n, fr_dlayout *out, ferry_error *err);
void fr_delta_layout_free(fr_dlayout *l, bool snaps);
/* cur against the snapshot's layout: 0, or FERRY_EINVAL naming the first
 * difference. */
int fr_delta_layout_same(const fr_dlayout *snap, const fr_dlayout *cur, ferry_error *err);
/* Compare every piece of cur with the snapshot's (same layout) and record
 * the changed elements in cur's pieces, at most record_max of them: past
 * it the rest are only counted and *partial is set (the generation will
 * most likely go dense; a sparse one compares again with no bound).
 * *changed, *bytes: counts. */
int fr_delta_compare(const fr_dlayout *snap, fr_dlayout *cur, uint64_t record_max, uint64_t *changed,
                     uint64_t *bytes, bool *partial, ferry_error *err);
/* The first look (ferry_delta_publish): every stride-th chunk of every
 * piece (the first one always) compared, nothing recorded: *sampled
 * elements, *changed of them, *bytes compared (as held). A generation
 * whose sampled fraction, over every rank, is above FR_DELTA_SAMPLE_MARGIN
 * times the crossover goes dense without the whole comparison (when the
 * sample holds FR_DELTA_SAMPLE_MIN elements at least). */
#define FR_DELTA_SAMPLE_STRIDE 16u
#define FR_DELTA_SAMPLE_MARGIN 2.0
#define FR_DELTA_SAMPLE_MIN 65536u
int fr_delta_sample(const fr_dlayout *snap, const fr_dlayout *cur, uint64_t stride,
                    uint64_t *sampled, uint64_t *changed, uint64_t *bytes, ferry_error *err);
/* Drop the changes recorded in cur's pieces. */
void fr_delta_forget(fr_dlayout *cur);
/* Fill cur's snapshots from its data (new buffers, *bytes their size). */
int fr_delta_fill(fr_dlayout *cur, uint64_t *bytes, ferry_error *err);
/* Bring the snapshot to cur's values: each recorded change written in. */
void fr_delta_apply(fr_dlayout *snap, const fr_dlayout *cur);
/* The entries of tensor t recorded in cur's pieces: global coordinates
 * (i32 or i64 as t says) and values, appended at idx/val (room for them). */
uint64_t fr_delta_entries(const fr_dlayout *cur, uint32_t t, uint8_t *idx, uint8_t *val);
/* Changed entries of tensor t in cur's pieces. */
uint64_t fr_delta_count(const fr_dlayout *cur, uint32_t t);

/* ---- one publish across the ranks (delta_publish.c, delta_sparse.c) ---------------------- */

/* What one rank's publish holds while it runs. */
typedef struct fr_drun {
    ferry_store *s;
    ferry_delta_encoder *e;
    const ferry_publisher_config *c;
    uint64_t gen, base;
    fr_dlayout cur;
    ferry_delta_stats *st;
    char **keys;                 /* the sparse objects this rank put */
    uint64_t *segs;              /* where each landed */
    size_t nkeys;
    bool sweep;                  /* remove leftovers on the base first (an attempt on it failed,
                                  * or this rank knows nothing of the last ones) */
    int pre_rc;                  /* this rank failed before the sparse stages (pre_err) */
    ferry_error pre_err;
    uint8_t **parts;             /* parts read (owner), per rank */
    size_t *part_len;
} fr_drun;


double fr_delta_now(void);
/* A failed word: "failed <code> <why>" on one line, into buf. */
void fr_delta_failed_word(char *buf, size_t cap, int rc, const ferry_error *me);
/* Write this rank's word at stage (word NULL: none), meet every rank there. */
int fr_delta_meet(fr_drun *r, const char *stage, const char *word, ferry_error *err);
/* Rank q's word at stage (*val: ferry_store_free); a "failed" word gives
 * its code and sentence in err. */
int fr_delta_word(fr_drun *r, const char *stage, int64_t q, ferry_kv_value *val, ferry_error *err);
/* Every rank's word at stage in one round trip (vals[world]: each
 * ferry_store_free); the first rank whose word is missing or "failed"
 * gives the error ("rank q: ..."), with every vals[i].val freed. */
int fr_delta_words(fr_drun *r, const char *stage, ferry_kv_value *vals, ferry_error *err);
/* Stages 2 and 3 of a sparse generation (delta_sparse.c): parts, the
 * owners' objects, the announcement and the decision. 0 when announced,
 * else the error every rank returns (the caller removes what r->keys
 * holds and the parts). */
int fr_delta_sparse(fr_drun *r, ferry_error *err);
/* Remove the parts this rank put. */
void fr_delta_parts_remove(fr_drun *r);

#endif
