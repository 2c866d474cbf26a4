/* The public face of the master (store.h, ferry_master_*): a thin layer
 * over the internal server of master.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/store.h"
#include "store/master.h"
#include "store/master_metrics.h"

struct ferry_master { fr_master *m; };

int ferry_master_config_init(ferry_master_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    fr_master_config d;
    fr_master_config_default(&d);
    snprintf(cfg->listen, sizeof cfg->listen, "%s", d.listen);
    cfg->heartbeat_timeout_ms = d.heartbeat_timeout_ms;
    cfg->grace_ms = d.grace_ms;
    cfg->dead_after_ms = d.dead_after_ms;
    cfg->pending_timeout_ms = d.pending_timeout_ms;
    cfg->checkpoint_records = d.checkpoint_records;
    /* The engine's config reader knows where tokens come from. */
    ferry_engine_config ec;
    int rc = ferry_engine_config_init(&ec);
    memcpy(cfg->token, ec.token, ec.token_len);
    cfg->token_len = ec.token_len;
    return rc;
}

int ferry_master_open(const ferry_master_config *cfg, ferry_master **out, ferry_error *err)
{
    if (!cfg || !out)
        return fr_fail(err, FERRY_EINVAL, "master: no config or result");
    if (cfg->token_len > sizeof ((fr_master_config *)0)->token)
        return fr_fail(err, FERRY_EINVAL, "master: a token longer than %zu bytes",
                       sizeof ((fr_master_config *)0)->token);
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "master config: its reserved fields must be zero (start "
                       "from ferry_master_config_init)");
    fr_master_config c;
    fr_master_config_default(&c);
    snprintf(c.dir, sizeof c.dir, "%s", cfg->dir);
    snprintf(c.listen, sizeof c.listen, "%s", cfg->listen);
    memcpy(c.token, cfg->token, cfg->token_len);
    c.token_len = cfg->token_len;
    c.heartbeat_timeout_ms = cfg->heartbeat_timeout_ms;
    c.grace_ms = cfg->grace_ms;
    c.dead_after_ms = cfg->dead_after_ms;
    c.pending_timeout_ms = cfg->pending_timeout_ms;
    c.checkpoint_records = cfg->checkpoint_records;
    c.no_sync = cfg->no_sync;
    if (cfg->etcd && *cfg->etcd) {
        if (strlen(cfg->etcd) >= sizeof c.etcd || !cfg->cluster || !*cfg->cluster ||
            strlen(cfg->cluster) >= sizeof c.cluster || cfg->ha_ttl_s > 3600)
            return fr_fail(err, FERRY_EINVAL, "master: with etcd, a cluster name (at most %zu "
                           "characters), etcd URLs of at most %zu and a TTL of at most an hour",
                           sizeof c.cluster - 1, sizeof c.etcd - 1);
        snprintf(c.etcd, sizeof c.etcd, "%s", cfg->etcd);
        snprintf(c.cluster, sizeof c.cluster, "%s", cfg->cluster);
        c.ha_ttl_s = (uint32_t)cfg->ha_ttl_s;
    }
    ferry_master *m = fr_calloc(1, sizeof *m);
    if (!m)
        return fr_fail(err, FERRY_ENOMEM, "master: out of memory");
    int rc = fr_master_open(&c, &m->m, err);
    if (rc < 0) {
        fr_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

const char *ferry_master_address(const ferry_master *m)
{
    return m ? fr_master_address(m->m) : NULL;
}

int ferry_master_run(ferry_master *m)
{
    return m ? fr_master_run(m->m) : FERRY_EINVAL;
}

void ferry_master_stop(ferry_master *m)
{
    if (m)
        fr_master_stop(m->m);
}

void ferry_master_close(ferry_master *m)
{
    if (!m)
        return;
    fr_master_close(m->m);
    fr_free(m);
}

int ferry_master_metrics(ferry_master *m, int wait_ms, char **out)
{
    if (!m || !out)
        return FERRY_EINVAL;
    return fr_master_mx_text(m->m, wait_ms < 0 ? 0 : wait_ms, out);
}
