/* Leader election of replicated masters on etcd (docs/store.md, "High
 * availability"): one leadership key per cluster, held on the leader's
 * etcd lease; the key's create revision is the leadership's epoch, and
 * every write the leader makes to etcd can be fenced by it (a deposed
 * leader's fenced write fails in etcd, not by a timer of its own).
 *
 * A candidate grants itself a lease of ttl_s seconds and renews it from a
 * thread of its own, every third of the TTL. Campaigning is one
 * compare-and-put: the key created on the candidate's lease if nobody
 * holds it. When the leader's machine goes silent nobody renews its
 * lease, etcd deletes the key after the TTL, and the next campaign wins.
 *
 * The local view (fr_ha_leading) is conservative: leadership counts as
 * held only while the last renewal etcd acknowledged is less than a TTL
 * old (measured from when the renewal was sent), so a leader cut off from
 * etcd stops counting itself leader before etcd can let another win. */
#ifndef FR_STORE_HA_ELECT_H
#define FR_STORE_HA_ELECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"

typedef struct fr_ha_elect fr_ha_elect;

#define FR_HA_TTL_S 2          /* the default lease TTL, seconds */
#define FR_HA_ID_MAX 256

typedef struct fr_ha_config {
    const char *endpoints;     /* etcd client URLs, comma-separated */
    const char *cluster;       /* the cluster's name: its etcd key is ferry-ha/<cluster>/leader */
    const char *id;            /* this candidate (its address, "host:port"), < FR_HA_ID_MAX */
    int ttl_s;                 /* lease TTL (0: FR_HA_TTL_S) */
    int timeout_ms;            /* each etcd request (0: 1000) */
} fr_ha_config;

/* A candidate: connected, its lease granted and renewed from now on. */
int fr_ha_open(const fr_ha_config *cfg, fr_ha_elect **out, ferry_error *err);
/* Resign (the lease revoked, so another candidate wins at once) and free. */
void fr_ha_close(fr_ha_elect *h);
/* Stop renewing without resigning and free: what a machine that goes
 * silent leaves behind (tests; the lease runs out after its TTL). */
void fr_ha_abandon(fr_ha_elect *h);

/* Campaign until leading or timeout_ms (< 0: forever): 0 with *epoch, the
 * leadership's epoch; FERRY_ETIMEDOUT with the current leader in err;
 * another code when etcd cannot be reached. A candidate whose lease ran
 * out (cut off from etcd longer than the TTL) takes a new one first. */
int fr_ha_campaign(fr_ha_elect *h, int timeout_ms, int64_t *epoch, ferry_error *err);

/* Who leads now, as etcd says: its id and epoch; FERRY_ENOENT when nobody. */
int fr_ha_leader(fr_ha_elect *h, char *id, size_t cap, int64_t *epoch, ferry_error *err);

/* Whether this candidate still leads with epoch, by its own conservative
 * view (no request). */
bool fr_ha_leading(fr_ha_elect *h, int64_t epoch);

/* key = val in etcd, only while the leadership of epoch is this one's
 * (FERRY_ESTATE otherwise: nothing written). */
int fr_ha_fenced_put(fr_ha_elect *h, int64_t epoch, const char *key, const void *val, size_t len,
                     ferry_error *err);

/* A standby's progress, for the leader's metrics: the next log entry it
 * will apply, put on its lease (gone with it) under
 * ferry-ha/<cluster>/standby/<id>. */
int fr_ha_report(fr_ha_elect *h, uint64_t next_seq, ferry_error *err);

/* The standbys' reports as the renewing thread last read them: it reads
 * them after each renewal (every third of the TTL) while this candidate
 * leads. Up to max into out, the count returned; its own report is left
 * out. */
#define FR_HA_PEERS_MAX 16
typedef struct fr_ha_peer {
    char id[FR_HA_ID_MAX];
    uint64_t next_seq;
} fr_ha_peer;
size_t fr_ha_standbys(fr_ha_elect *h, fr_ha_peer *out, size_t max);

/* Count the leadership of epoch in the cluster's count of leaderships
 * (ferry-ha/<cluster>/leaderships, written fenced by epoch): *n, the
 * count with this one. */
int fr_ha_count_leadership(fr_ha_elect *h, int64_t epoch, uint64_t *n, ferry_error *err);

/* The cluster's token, by a fingerprint of its key
 * (ferry-ha/<cluster>/token, written by the cluster's first candidate):
 * FERRY_EAUTH, with both fingerprints, when the cluster in etcd was made
 * by masters of another token. */
int fr_ha_check_token(fr_ha_elect *h, uint64_t fingerprint, ferry_error *err);

/* The candidate's etcd connection (for the log: ha_log.h), its cluster's
 * name and the leadership key that fences. */
struct fr_etcd *fr_ha_etcd(fr_ha_elect *h);
const char *fr_ha_cluster(const fr_ha_elect *h);
const char *fr_ha_key(const fr_ha_elect *h);

#endif
