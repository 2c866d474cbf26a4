/* exec layer internals: shared by binding, JSON, attestation and lowering. */
#ifndef FR_EXEC_INT_H
#define FR_EXEC_INT_H

#include <stdio.h>

#include "ferry/exec.h"

struct ferry_binding {
    ferry_manifest *placement;     /* referenced */
    uint8_t placement_digest[16];
    uint64_t instance, generation, lease;
    ferry_binding_entry *v;        /* insertion order */
    size_t n, cap;
    size_t *order;                 /* indices into v, sorted by fragment id */
};

/* A config's zeroed fields to their defaults (config.c: the values of the
 * *_config_init() calls), once, where an open or run takes the config. */
void fr_exec_config_resolve(ferry_exec_config *c);
void fr_stream_config_resolve(ferry_stream_config *c);
/* The sentence of the stream's first error (the engine's: the refused op,
 * or the first failed op of the failed batch), valid until the stream is
 * closed; NULL when there is none or it has none (ferry_exec_stream_fail). */
void fr_store_exec_config_resolve(ferry_store_exec_config *c);

/* The binding's digest with instance, generation and lease taken as 0:
 * what its entries are, whatever update they serve (store reads lowered
 * once are reused across generations while it stays). */
void fr_binding_layout_digest(const ferry_binding *b, uint8_t out[16]);

#endif
