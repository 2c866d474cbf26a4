/* rl layer internals shared by update.c and pull.c. */
#ifndef FR_RL_INT_H
#define FR_RL_INT_H

#include <stdbool.h>

#include "ferry/weights.h"

/* Fill err (may be NULL) with code and a message; returns code. */
int fr_rl_fail(ferry_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The active generation and its manifest (every object leased), unless
 * *generation is already the active one (*current). Sets st->generation
 * (the current one) and st->prepare_s. */
int fr_rl_prepare(ferry_store *s, const char *model, uint64_t *generation,
                  ferry_weight_manifest *m, bool *current, ferry_update_stats *st,
                  ferry_error *err);

/* One contiguous run of a shard: bytes [src_off, src_off+len) of manifest
 * entry `entry` go to dst. */
typedef int (*fr_rl_emit_fn)(void *ctx, size_t entry, uint64_t src_off, void *dst, uint64_t len,
                             ferry_error *err);
/* Every run of shard p of manifest entry ei, in order. */
int fr_rl_shard_runs(const ferry_weight_manifest *m, size_t ei, const ferry_param_shard *p,
                     fr_rl_emit_fn emit, void *ctx, ferry_error *err);
/* qsort/bsearch order of entry pointers by name. */
int fr_rl_cmp_entry_name(const void *a, const void *b);

#endif
