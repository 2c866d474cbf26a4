/* Sample queue internals shared by sampleq.c (open, push, pop, read, ack)
 * and sampleq_claim.c (the claim protocol: which delivery of a record trains
 * its sample, and ending a record without ever leaving its payload behind). */
#ifndef FR_SAMPLEQ_INT_H
#define FR_SAMPLEQ_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/samples.h"
#include "rl/keys.h"

#define FR_SQ_DEFERRED_MAX 4096

/* A claim this handle took (for delivery `token` of record `id`, at
 * revision `rev`); deleted once its version leaves the lag window. */
typedef struct fr_sq_claim {
    uint64_t version, uid, id, rev;
    uint32_t token;
    char key[FR_KEY_MAX];
} fr_sq_claim;

/* A finished record whose payload removal a reader's lease refused: the
 * record stays leased (unacked) until the payload is gone, then is acked. */
typedef struct fr_sq_deferred {
    uint64_t after_ms, uid, id;
    uint32_t token;
    char key[FERRY_RECORD_REF_MAX + 1];
} fr_sq_deferred;

struct ferry_sample_queue {
    ferry_store *s;
    ferry_sample_queue_config cfg;
    char recompute[160];
    ferry_sample_stats st;
    fr_sq_claim *claims; size_t nclaims, capclaims;
    fr_sq_deferred *def; size_t ndef;
};

uint64_t fr_sq_wall_ms(void);
/* A failure that a retry may cure (the master restarting). */
bool fr_sq_retryable(int rc);
/* Sleep *ms (2 ms doubling to 100 ms) before a retry. */
void fr_sq_backoff(unsigned *ms);
/* ferry_queue_ack, retried while the master is unreachable (up to
 * push_timeout_ms); FERRY_ENOENT after a retry counts as done. */
int fr_sq_ack_retry(ferry_sample_queue *q, uint64_t id, uint32_t token, ferry_error *err);

/* What a popped delivery of a sample record may do (fr_sq_take). */
enum fr_sq_take {
    FR_SQ_TAKEN,       /* this delivery holds the claim: apply the version rule */
    FR_SQ_DUPLICATE,   /* another record of the same uid holds it: ack this one away */
    FR_SQ_DONE,        /* this record is finished already: fr_sq_finish it */
    FR_SQ_LATE,        /* a newer delivery of this record holds it: not ours */
};
/* Claim smp's uid for this delivery (record id and token): an enum
 * fr_sq_take, or a negative code when the master stayed unreachable. done:
 * claim it as done at once (a stale sample: its rejection commits with the
 * claim itself), so FR_SQ_TAKEN means committed. */
int fr_sq_take(ferry_sample_queue *q, const ferry_sample *smp, bool done);
/* Mark this delivery's claim done (the commit point of an ack): from then
 * on every delivery of the record is finished, never handed out. 0;
 * FERRY_ESTALE when the record was delivered again since (or this delivery
 * was acked already); another negative code when the master stayed
 * unreachable. */
int fr_sq_mark_done(ferry_sample_queue *q, const ferry_sample *smp, ferry_error *err);
/* End a record whose sample is done: remove the payload, then ack the
 * record, never the other way round. A removal refused by a reader's lease
 * is deferred with the record, which stays leased until then. */
void fr_sq_finish(ferry_sample_queue *q, const char *payload, uint64_t uid, uint64_t id,
                  uint32_t token);
/* Retry the deferred removals that are due (all: every one, once). */
void fr_sq_retry_deferred(ferry_sample_queue *q, bool all);
/* Delete the claims of versions that left the lag window of input_version
 * (those of records still deferred here stay). */
void fr_sq_drop_claims(ferry_sample_queue *q, uint64_t input_version);

#endif
