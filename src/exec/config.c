/*
 * The exec configs' defaults, written once: each *_config_init() sets every
 * field, and the opens that take a config the caller may have zeroed
 * instead resolve its 0 fields here, from the same init.
 */
#include <string.h>

#include "exec/exec_int.h"

#define BATCH_OPS 4096u              /* ops per engine batch */
#define BATCH_BYTES (64ull << 20)    /* bytes per engine batch */
#define WINDOW 8u                    /* batches in flight */
#define STORE_READS 8192u            /* reads per store call */

int ferry_exec_config_init(ferry_exec_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->limits.max_ops = BATCH_OPS;
    cfg->limits.max_bytes = BATCH_BYTES;
    cfg->window = WINDOW;
    cfg->timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    return 0;
}

int ferry_stream_config_init(ferry_stream_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    return 0;
}

int ferry_store_exec_config_init(ferry_store_exec_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->max_reads = STORE_READS;
    return 0;
}

#define FILL(c, d, f) ((c)->f = (c)->f ? (c)->f : (d).f)

void fr_exec_config_resolve(ferry_exec_config *c)
{
    ferry_exec_config d;
    (void)ferry_exec_config_init(&d);
    FILL(c, d, limits.max_ops);
    FILL(c, d, limits.max_bytes);
    FILL(c, d, window);
    FILL(c, d, timeout_ms);
}

void fr_stream_config_resolve(ferry_stream_config *c)
{
    ferry_stream_config d;
    (void)ferry_stream_config_init(&d);
    FILL(c, d, timeout_ms);
}

void fr_store_exec_config_resolve(ferry_store_exec_config *c)
{
    ferry_store_exec_config d;
    (void)ferry_store_exec_config_init(&d);
    FILL(c, d, max_reads);
}
