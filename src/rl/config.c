/*
 * The rl configs' defaults, written once: each *_config_init() sets every
 * field, and the entry points that take a config the caller may have zeroed
 * instead (open, publish) resolve its 0 fields here, from the same init,
 * before anything uses it. No other rl file writes a default.
 */
#include <string.h>

#include "rl/rl_int.h"
#include "ferry/samples.h"
#include "ferry/weights_compat.h"

#define PUBLISHER_KEEP 2u                     /* generations retained */
#define SUBSCRIBER_BATCH_BYTES (64ull << 20)  /* apply's batch of reads */
#define COMPAT_STAGING_BYTES (256ull << 20)   /* a compat worker's staging */
#define SAMPLE_LEASE_MS 30000u                /* a popped sample's lease */

int ferry_publisher_config_init(ferry_publisher_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->keep = PUBLISHER_KEEP;
    cfg->timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    return 0;
}

int ferry_subscriber_config_init(ferry_subscriber_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    cfg->batch_bytes = SUBSCRIBER_BATCH_BYTES;
    return 0;
}

int ferry_sparse_update_config_init(ferry_sparse_update_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    return 0;
}

int ferry_compat_config_init(ferry_compat_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->staging_bytes = COMPAT_STAGING_BYTES;
    cfg->timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    return 0;
}

int ferry_sample_queue_config_init(ferry_sample_queue_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->push_timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    cfg->lease_ms = SAMPLE_LEASE_MS;
    return 0;
}

/* A zeroed field takes the init's value. */
#define FILL(c, d, f) ((c)->f = (c)->f ? (c)->f : (d).f)

void fr_rl_publisher_resolve(ferry_publisher_config *c)
{
    ferry_publisher_config d;
    (void)ferry_publisher_config_init(&d);
    FILL(c, d, keep);
    FILL(c, d, timeout_ms);
}

void fr_rl_subscriber_resolve(ferry_subscriber_config *c)
{
    ferry_subscriber_config d;
    (void)ferry_subscriber_config_init(&d);
    FILL(c, d, timeout_ms);
    FILL(c, d, batch_bytes);
}

void fr_rl_compat_resolve(ferry_compat_config *c)
{
    ferry_compat_config d;
    (void)ferry_compat_config_init(&d);
    FILL(c, d, staging_bytes);
    FILL(c, d, timeout_ms);
}

void fr_rl_sample_queue_resolve(ferry_sample_queue_config *c)
{
    ferry_sample_queue_config d;
    (void)ferry_sample_queue_config_init(&d);
    FILL(c, d, push_timeout_ms);
    FILL(c, d, lease_ms);
}
