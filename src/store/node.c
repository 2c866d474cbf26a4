/* The node process's core: one segment of memfd memory served through the
 * engine and mounted on the master (store.h, ferry_node_*). */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "ferry/store.h"
#include "store/master_metrics.h"
#include "store/mconn.h"
#include "wire/sockio.h"

#define TAG "node"

struct ferry_node {
    ferry_node_config cfg;
    ferry_engine *eng;
    void *mem;
    ferry_region *reg;
    uint8_t desc[FERRY_DESC_MAX];
    size_t desc_len;
    uint64_t id, seg;
    fr_mconn *mc;
    uint64_t mounted_epoch;
    int stop[2];
    _Atomic uint64_t mounts, mount_failures;   /* metrics (node_metrics.c) */
    atomic_bool mounted;
};

int ferry_node_config_init(ferry_node_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    int rc = ferry_engine_config_init(&cfg->engine);
    const char *m = getenv("FERRY_MASTER");
    if (m && *m)
        snprintf(cfg->master, sizeof cfg->master, "%s", m);
    cfg->segment_size = 1ull << 30;
    cfg->heartbeat_ms = FR_STORE_HEARTBEAT_MS;
    cfg->timeout_ms = FR_STORE_TIMEOUT_MS;
    return rc;
}

/* One request to the master. An ERROR reply's text goes to err, or to the
 * log when there is no caller to tell (err NULL: the node's own loop). */
static int node_call(ferry_node *n, const fr_smsg *q, int timeout_ms, ferry_error *err)
{
    fr_smsg rep;
    uint8_t *b = NULL;
    int rc = fr_mconn_call(n->mc, q, 1, NULL, &rep, &b, timeout_ms);
    if (rc == 0 && rep.type == FR_SMSG_ERROR) {
        rc = rep.status;
        if (err)
            fr_fail(err, rc, "%s of segment %016llx refused by the master: %.*s",
                    fr_smsg_type_name(q->type), (unsigned long long)n->seg, (int)rep.val.n,
                    rep.val.p ? (const char *)rep.val.p : "");
        else
            FR_ERROR(TAG, "%s of segment %016llx refused by the master: %.*s",
                     fr_smsg_type_name(q->type), (unsigned long long)n->seg, (int)rep.val.n,
                     rep.val.p ? (const char *)rep.val.p : "");
    } else if (rc == 0 && rep.type != FR_SMSG_OK) {
        rc = fr_fail(err, FERRY_EPROTO, "the master answered %s with a message of another kind: "
                     "node and master versions differ?", fr_smsg_type_name(q->type));
    } else if (rc < 0) {
        fr_fail(err, rc, "%s of segment %016llx: the master at %s: %s", fr_smsg_type_name(q->type),
                (unsigned long long)n->seg, n->cfg.master, ferry_strerror(rc));
    }
    fr_free(b);
    return rc;
}

static int mount(ferry_node *n, ferry_error *err)
{
    uint64_t epoch = fr_mconn_epoch(n->mc);
    fr_smsg q = {.type = FR_SMSG_MOUNT, .segment = n->seg, .node = n->id,
                 .size = n->cfg.segment_size,
                 .val = {.p = n->desc, .n = (uint32_t)n->desc_len},
                 .key = {.p = (const uint8_t *)n->cfg.name, .n = (uint32_t)strlen(n->cfg.name)}};
    int rc = node_call(n, &q, n->cfg.timeout_ms, err);
    atomic_fetch_add(rc == 0 ? &n->mounts : &n->mount_failures, 1);
    atomic_store(&n->mounted, rc == 0);
    if (rc == 0) {
        n->mounted_epoch = epoch;
        FR_INFO(TAG, "segment %016llx (%llu bytes) mounted on the master at %s",
                (unsigned long long)n->seg, (unsigned long long)n->cfg.segment_size,
                n->cfg.master);
    }
    return rc;
}

int ferry_node_open(const ferry_node_config *cfg, ferry_node **out, ferry_error *err)
{
    if (!cfg || !out)
        return fr_fail(err, FERRY_EINVAL, "node: no config or result");
    if (!cfg->master[0])
        return fr_fail(err, FERRY_EINVAL, "node: no master address: set FERRY_MASTER=HOST:PORT");
    if (cfg->segment_size < 4096)
        return fr_fail(err, FERRY_EINVAL, "node: a segment of %llu bytes (4096 at least)",
                       (unsigned long long)cfg->segment_size);
    if (strnlen(cfg->name, sizeof cfg->name) >= sizeof cfg->name)
        return fr_fail(err, FERRY_EINVAL, "node: its name is not NUL-terminated");
    if (!FR_RESERVED_OK(cfg) || !FR_RESERVED_OK(&cfg->engine))
        return fr_fail(err, FERRY_EINVAL, "node config: its reserved fields must be zero (start "
                       "from ferry_node_config_init)");
    ferry_node *n = fr_calloc(1, sizeof *n);
    if (!n)
        return fr_fail(err, FERRY_ENOMEM, "node: out of memory");
    n->cfg = *cfg;
    if (!n->cfg.timeout_ms)   /* a zeroed config: ferry_node_config_init's value */
        n->cfg.timeout_ms = FR_STORE_TIMEOUT_MS;
    n->stop[0] = n->stop[1] = -1;
    /* 63-bit ids: they stay positive in JSON (status) and Python ints. */
    n->id = fr_random_u64() >> 1;
    n->seg = fr_random_u64() >> 1;
    int rc = pipe2(n->stop, O_CLOEXEC | O_NONBLOCK) < 0
                 ? fr_fail(err, FERRY_EIO, "node: no pipe: %s", strerror(errno)) : 0;
    if (rc == 0 && (rc = ferry_engine_open(&n->cfg.engine, &n->eng, err)) < 0)
        fr_fail(err, rc, "node: cannot open its engine: %s", fr_why(err, rc));
    if (rc == 0 && (rc = ferry_mem_alloc(n->eng, n->cfg.segment_size, &n->mem, err)) < 0)
        fr_fail(err, rc, "node: cannot allocate a segment of %llu bytes: %s",
                (unsigned long long)n->cfg.segment_size, fr_why(err, rc));
    if (rc == 0 && (rc = ferry_region_register(n->eng, n->mem, n->cfg.segment_size, FERRY_REMOTE_RW,
                                               FERRY_MEM_HOST, &n->reg, err)) < 0)
        fr_fail(err, rc, "node: cannot register its segment: %s", fr_why(err, rc));
    if (rc == 0) {
        int k = ferry_region_export(n->reg, n->desc, sizeof n->desc);
        rc = k < 0 ? fr_fail(err, k, "node: cannot describe its segment: %s", ferry_strerror(k)) : 0;
        n->desc_len = k < 0 ? 0 : (size_t)k;
    }
    uint8_t key[32];
    fr_auth_key(n->cfg.engine.token, n->cfg.engine.token_len, key);
    fr_mconn_config mc = {
        .addr = n->cfg.master, .key = key, .role = FR_ROLE_STORE_NODE, .node = n->id,
        .heartbeat_ms = n->cfg.heartbeat_ms, .timeout_ms = n->cfg.timeout_ms,
    };
    if (rc == 0 && (rc = fr_mconn_open(&mc, &n->mc)) < 0)
        fr_fail(err, rc, rc == FERRY_EAUTH ? "node: the master at %s refused our cluster token"
                                           : "node: cannot reach the master at %s: %s",
                n->cfg.master, ferry_strerror(rc));
    if (rc == 0)
        rc = mount(n, err);
    if (rc < 0) {
        ferry_node_close(n);
        return rc;
    }
    *out = n;
    return 0;
}

uint64_t ferry_node_id(const ferry_node *n)
{
    return n ? n->id : 0;
}

uint64_t ferry_node_segment(const ferry_node *n)
{
    return n ? n->seg : 0;
}

void fr_node_counters_get(const ferry_node *n, fr_node_counters *o)
{
    *o = (fr_node_counters){ .id = n->id, .segment = n->seg, .segment_size = n->cfg.segment_size,
                             .mounts = atomic_load(&n->mounts),
                             .mount_failures = atomic_load(&n->mount_failures),
                             .mounted = atomic_load(&n->mounted) };
}

ferry_engine *fr_node_engine(ferry_node *n)
{
    return n->eng;
}

int ferry_node_run(ferry_node *n)
{
    if (!n)
        return FERRY_EINVAL;
    uint64_t next_try = 0;
    for (;;) {
        struct pollfd p = { .fd = n->stop[0], .events = POLLIN };
        if (poll(&p, 1, 100) > 0)
            return 0;
        /* A new connection means the master restarted or the link dropped:
         * mount again so the master knows where the segment is (and again
         * a second later if the master refused, say while it probes). */
        if (fr_mconn_epoch(n->mc) != n->mounted_epoch && fr_now_ms() >= next_try &&
            mount(n, NULL) < 0)
            next_try = fr_now_ms() + 1000;
    }
}

void ferry_node_stop(ferry_node *n)
{
    if (n && n->stop[1] >= 0)
        (void)!write(n->stop[1], "x", 1);
}

void ferry_node_close(ferry_node *n)
{
    if (!n)
        return;
    if (n->mc && n->mounted_epoch) {
        fr_smsg q = {.type = FR_SMSG_UNMOUNT, .segment = n->seg};
        (void)node_call(n, &q, 2000, NULL);
    }
    fr_mconn_close(n->mc);
    if (n->reg)
        (void)ferry_region_unregister(n->reg, NULL);
    if (n->mem)
        (void)ferry_mem_free(n->eng, n->mem, NULL);
    ferry_engine_close(n->eng);
    for (int i = 0; i < 2; i++)
        if (n->stop[i] >= 0)
            close(n->stop[i]);
    fr_free(n);
}
