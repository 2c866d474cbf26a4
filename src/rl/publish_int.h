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

/* "ferry/wk/<model>/<gen, 20 digits>/<what>", or "ferry/wk/<model>/<what>"
 * for gen 0. */
void fr_wk_key(char *out, size_t cap, const char *model, uint64_t gen, const char *what);

/* Check the objects of generation out->generation of model through its
 * probe key (one object per store segment): fills out->segments,
 * lost_segments and lost. 0 when whole (or nothing was recorded), FERRY_ELOST
 * with err saying so, or the store's error. */
int fr_rl_check_whole(ferry_store *s, const char *model, ferry_weights_status *out,
                      ferry_error *err);

/* Write the probe key of generation gen from its manifest text: one
 * "segment TAB key" line per distinct segment. 0 or the store's error. */
int fr_rl_probe_put(ferry_store *s, const char *model, uint64_t gen, const char *manifest,
                    size_t len);

/* After announcing gen (prev: the generation active before it, 0: none):
 * retire announced generations beyond cfg->keep, then remove the leftover
 * objects and KV keys of every generation older than gen that was never
 * announced (it never can be now). Counts into st->removed_generations and
 * st->swept_generations. Best effort: failures leave work for the next. */
void fr_rl_keep(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t prev,
                ferry_publish_stats *st);

/* ---- the decision of one attempt (publish_decide.c) ----------------------------- */

typedef struct fr_pub_decision {
    int rc;              /* 0: announced; else the code every rank returns */
    bool keep;           /* undecided: this rank keeps its objects (the generation may
                          * still be announced; a later sweep removes them if not) */
    char why[600];       /* the failure, without "publish of M generation G failed: " */
} fr_pub_decision;

/* The coordinator: gather the n tensors' parts, claim attempt's decision,
 * announce (with record, may be NULL), write the decision, then retention
 * and the sweep (fr_rl_keep). */
void fr_rl_decide(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t attempt,
                  size_t n, const char *record, ferry_publish_stats *st, fr_pub_decision *d);
/* Every other rank: wait up to cfg->timeout_ms for attempt's decision;
 * then take the one there is or decide the attempt failed. */
void fr_rl_await(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t attempt,
                 fr_pub_decision *d);

#endif
