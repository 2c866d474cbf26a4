/* rl internals shared by publish.c and the policy registry (policy.c). */
#ifndef FR_RL_POLICY_INT_H
#define FR_RL_POLICY_INT_H

#include "ferry/weights.h"

/* ferry_publish, with `record` (text without newlines, or NULL) appended to
 * the announcing compare-and-swap's value: "G <digest hex> <record>". */
int fr_rl_publish(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                  const char *record, const ferry_weight_tensor *t, size_t n,
                  ferry_publish_stats *st, ferry_error *err);

#endif
