/* rl internals of weight generations shared by publish.c (the publish
 * protocol), publish_keep.c (retention and the sweep of unannounced
 * generations), weights_read.c (reading generations back) and policy.c.
 * The KV layout is described at the top of publish.c. */
#ifndef FR_RL_PUBLISH_INT_H
#define FR_RL_PUBLISH_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/weights.h"

/* Check the objects of generation out->generation of model through its
 * probe key (one object per store segment): fills out->segments,
 * lost_segments and lost. 0 when whole (or nothing was recorded), FERRY_ELOST
 * with err saying so, or the store's error. */
int fr_rl_check_whole(ferry_store *s, const char *model, ferry_weights_status *out,
                      ferry_error *err);

/* Write the probe key of generation gen from its manifest text: one
 * "segment TAB key" line per distinct segment. 0 or the store's error. */
int fr_rl_probe_put(ferry_store *s, const char *model, uint64_t gen, const char *manifest,
                    size_t len, ferry_error *err);

/* After announcing gen (prev: the generation active before it, 0: none):
 * retire announced generations beyond cfg->keep, then remove the leftover
 * objects and KV keys of every generation older than gen that was never
 * announced (it never can be now). Counts into st->removed_generations and
 * st->swept_generations. Best effort: failures leave work for the next. */
void fr_rl_keep(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t prev,
                ferry_publish_stats *st);
/* A rank whose pieces find the segments full: remove the objects of the
 * announced generations past the newest `keep` (history order, the rule of
 * fr_rl_keep) that readers no longer lease. True when one of them still
 * holds leased objects (waiting for its leases to lapse may free space). */
bool fr_rl_reclaim(ferry_store *s, const ferry_publisher_config *c);

/* A put that found the segments full (FERRY_ENOSPC) retries while this
 * says so (publish_mine.c): fr_rl_reclaim, then again as leases lapse, for
 * at most half of timeout_ms. Zero it before the first call. */
typedef struct fr_space_wait {
    uint64_t deadline;
    long pause_ms;
    int tries;
    bool leased;
} fr_space_wait;
bool fr_pub_space_wait(ferry_store *s, const ferry_publisher_config *c, fr_space_wait *w);

/* The placement of a publish of whole tensors (publish.c): each tensor cut
 * along dim 0 into pieces small against a rank's share, the pieces
 * assigned by ferry_weights_assign; *data (malloc'd, *ndata entries) gets
 * this rank's pieces, pointing into the tensors. The caller closes *out. */
int fr_rl_whole_placement(const ferry_publisher_config *c, const ferry_weight_tensor *t, size_t n,
                          ferry_manifest **out, ferry_shard_data **data, size_t *ndata,
                          ferry_error *err);

/* ---- this rank's pieces (publish_mine.c) ----------------------------------------- */

#define FR_PUB_DECL 4             /* hashes per tensor in a declaration */

typedef struct fr_pub_piece {
    uint64_t sid;                /* its fragment id in the stored manifest */
    ferry_fragment src;          /* its fragment in the placement given (layout of data) */
    const void *data;
    ferry_packed at;             /* where it is packed */
} fr_pub_piece;

/* A piece of a quantized tensor (publish_quant.c): the blocks it meets,
 * their maxima and scales. */
typedef struct fr_pub_q {
    uint32_t role;               /* enum ferry_quant_role; 0: stored as out_dtype says */
    uint32_t block[2], format;
    char dtype[16];              /* the FP8 dtype */
    uint64_t b0[2], nb[2];       /* the blocks it meets: first index and count per dim */
    bool cut;                    /* a weight piece meeting a block it does not hold whole */
    uint32_t *amax;              /* nb[0] x nb[1]: a cut piece's maxima, agreed */
    float *scale;                /* nb[0] x nb[1]: the blocks' scales (set by the packing
                                  * for a piece of whole blocks) */
    size_t weight;               /* a scale piece: the weight piece whose blocks it holds */
    size_t next;                 /* a weight piece: the next one of its tensor on this rank
                                  * (SIZE_MAX: none) */
} fr_pub_q;

typedef struct fr_pub_mine {
    ferry_manifest *stored;      /* the placement's stored form */
    ferry_pack *pack;
    uint8_t digest[16];          /* of the stored manifest and the declaration: what every
                                  * rank must agree on */
    fr_pub_piece *pieces;        /* what this rank stores, in id order */
    size_t npieces;
    uint32_t nobjects;
    uint64_t *sums;              /* per piece */
    uint64_t sums_hash;
    uint64_t segment;            /* where its objects landed */
    uint64_t *decl;              /* ntensors, then per tensor FR_PUB_DECL hashes (name;
                                  * dtype as held; shape; pieces) */
    uint32_t ntensors;
    char *json;                  /* rank 0: the stored manifest's JSON */
    size_t json_len;
    bool streamed;               /* its objects were stored as a stream (publish_stream.c):
                                  * fr_pub_mine_store stores the files only */
    /* block quantization (cfg->quant): per piece, and whether any block of
     * the placement is cut by a shard (the ranks then agree on its scale) */
    fr_pub_q *q;
    size_t *qhead;               /* per tensor: its first weight piece here (SIZE_MAX: none) */
    bool exchange;
    bool amax_put;               /* this rank stored its partial maxima */
} fr_pub_mine;

/* The ranks' agreement on the scales of cut blocks (publish_quant.c),
 * called by every rank of a publish with rules: with p->exchange (a shard
 * cuts a block), it stores the partial maxima of its cut blocks; every
 * rank meets the others at the generation's "amax" barrier (failed: this
 * rank could not prepare; it still meets them, storing nothing), then
 * reads its neighbours' maxima. Then every cut piece's scales are set.
 * A neighbour's maxima missing: FERRY_ECANCELED (that rank failed). */
int fr_pub_quant_agree(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                       fr_pub_mine *p, bool failed, ferry_error *err);
/* Per piece of p: its quantization (role, blocks); the first pass over the
 * cut pieces' data (their partial maxima). */
int fr_pub_quant_prepare(fr_pub_mine *p, const ferry_publisher_config *c,
                         ferry_manifest *placement, ferry_error *err);
/* Pack quantized piece i at out (its packed place): FP8 bytes with its
 * blocks' scales, or a scale piece's f32s. */
void fr_pub_quant_pack(fr_pub_mine *p, size_t i, const ferry_tensor_desc *src, uint8_t *out);
void fr_pub_quant_free(fr_pub_mine *p);

/* The placement slot of one of a rank's objects or files ("<k>", "sums",
 * "decl", "manifest.json"): the same in every generation (store.h). */
uint64_t fr_pub_slot(const char *model, uint32_t rank, const char *what);

/* What a rank stored as a stream (publish_stream.c), adopted by the
 * attempt once the placement is known: the packing must be the one the
 * generation's placement gives. */
typedef struct fr_pub_streamed {
    uint32_t nobjects;
    uint64_t segment;            /* where its objects landed */
    size_t npieces;
    uint64_t *sums;              /* per piece, in id order */
    ferry_packed *at;            /* where each piece was packed */
    uint64_t tensors, bytes, cross_node_bytes, local_bytes;
    double convert_s, store_s;
} fr_pub_streamed;
/* Publish gen from a placement whose pieces this rank already stored
 * (sx), or fail the attempt on every rank with why. */
int fr_rl_publish_streamed(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                           ferry_manifest *placement, const fr_pub_streamed *sx, const char *why,
                           ferry_publish_stats *st, ferry_error *err);

/* Check the placement (ranks, dtypes, every tensor covered once), make
 * its stored form, packing and declaration, and find this rank's pieces
 * and their data. Nothing is stored. */
int fr_pub_mine_prepare(fr_pub_mine *p, const ferry_publisher_config *c, ferry_manifest *placement,
                        const ferry_shard_data *data, size_t n, ferry_error *err);
/* Pack, convert, checksum and store this rank's objects, its checksums and
 * declaration (and rank 0 the manifest JSON). */
int fr_pub_mine_store(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                      ferry_manifest *placement, fr_pub_mine *p, ferry_publish_stats *st,
                      ferry_error *err);
/* The bytes of this rank's largest packed object of placement (0: none). */
int fr_pub_mine_most(const ferry_publisher_config *c, ferry_manifest *placement, uint64_t *most,
                     ferry_error *err);
/* Remove what fr_pub_mine_store stored (an attempt failed). */
void fr_pub_mine_remove(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                        const fr_pub_mine *p);
void fr_pub_mine_free(fr_pub_mine *p);
/* Put, replacing a leftover of an earlier attempt under the key. */
int fr_pub_put(ferry_store *s, const char *key, const void *data, uint64_t nb,
               const ferry_replicate_config *repl, ferry_object_desc *d, ferry_error *err);

/* ---- the decision of one attempt (publish_decide.c) ----------------------------- */

typedef struct fr_pub_decision {
    int rc;              /* 0: announced; else the code every rank returns */
    bool keep;           /* undecided: this rank keeps its objects (the generation may
                          * still be announced; a later sweep removes them if not) */
    char why[600];       /* the failure, without "publish of M generation G failed: " */
} fr_pub_decision;

/* The coordinator (mine: its own pieces and declaration): gather every
 * rank's part and check they agree, claim attempt's decision,
 * announce (with record, may be NULL), write the decision, then retention
 * and the sweep (fr_rl_keep). */
void fr_rl_decide(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t attempt,
                  const fr_pub_mine *mine, const char *record, ferry_publish_stats *st,
                  fr_pub_decision *d);
/* Every other rank: wait up to cfg->timeout_ms for attempt's decision;
 * then take the one there is or decide the attempt failed. */
void fr_rl_await(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t attempt,
                 fr_pub_decision *d);

#endif
