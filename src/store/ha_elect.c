/* Leader election on etcd (ha_elect.h). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "store/etcd_int.h"
#include "store/ha_elect.h"

struct fr_ha_elect {
    fr_etcd *kv;                 /* the caller's requests */
    fr_etcd *ka;                 /* the renewing thread's */
    char key[FR_HA_ID_MAX + 64];
    char cluster[72];
    char id[FR_HA_ID_MAX];
    int ttl_s;
    _Atomic int64_t lease;       /* 0: none (lost: a campaign takes a new one) */
    _Atomic uint64_t renewed_ns; /* when the last renewal etcd acknowledged was sent */
    _Atomic int64_t epoch;       /* of the last campaign won */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    fr_ha_peer peers[FR_HA_PEERS_MAX];   /* under mu: the standbys' last reports */
    size_t npeers;
};

/* Sleep ms, or less when the candidate is stopped. */
static void pause_ms(fr_ha_elect *h, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&h->mu);
    while (!h->stop && pthread_cond_timedwait(&h->cv, &h->mu, &ts) == 0)
        ;
    pthread_mutex_unlock(&h->mu);
}

static bool stopping(fr_ha_elect *h)
{
    pthread_mutex_lock(&h->mu);
    bool s = h->stop;
    pthread_mutex_unlock(&h->mu);
    return s;
}

static void peers_prefix(const fr_ha_elect *h, char *start, char *end, size_t cap)
{
    snprintf(start, cap, "ferry-ha/%s/standby/", h->cluster);
    snprintf(end, cap, "ferry-ha/%s/standby0", h->cluster);   /* '0' follows '/' */
}

/* The standbys' reports (a leader's, after each renewal): kept under mu,
 * the previous ones kept when etcd does not answer. */
static void read_peers(fr_ha_elect *h)
{
    char start[FR_HA_ID_MAX + 96], end[FR_HA_ID_MAX + 96];
    peers_prefix(h, start, end, sizeof start);
    fr_etcd_kv *kvs = NULL;
    size_t n = 0;
    if (fr_etcd_range(h->ka, start, end, FR_HA_PEERS_MAX + 1, &kvs, &n, NULL, NULL) < 0)
        return;
    fr_ha_peer got[FR_HA_PEERS_MAX];
    size_t k = 0;
    for (size_t i = 0; i < n && k < FR_HA_PEERS_MAX; i++) {
        const char *id = kvs[i].key + strlen(start);
        if (!strcmp(id, h->id))
            continue;
        snprintf(got[k].id, sizeof got[k].id, "%s", id);
        got[k++].next_seq = strtoull(kvs[i].val, NULL, 10);
    }
    fr_etcd_kvs_free(kvs, n);
    pthread_mutex_lock(&h->mu);
    memcpy(h->peers, got, k * sizeof *got);
    h->npeers = k;
    pthread_mutex_unlock(&h->mu);
}

/* Renew the lease every third of the TTL; a lease etcd no longer knows is
 * lost (the next campaign takes a new one). A leader reads the standbys'
 * reports after each renewal. */
static void *renew(void *arg)
{
    fr_ha_elect *h = arg;
    int every = h->ttl_s * 1000 / 3;
    while (!stopping(h)) {
        pause_ms(h, every > 0 ? every : 1);
        int64_t lease = atomic_load(&h->lease);
        if (stopping(h) || lease == 0)
            continue;
        uint64_t sent = fr_now_ns();
        int64_t ttl = 0;
        int rc = fr_etcd_lease_keepalive(h->ka, lease, &ttl, NULL);
        if (rc == 0)
            atomic_store(&h->renewed_ns, sent);
        if (rc == 0 && fr_ha_leading(h, atomic_load(&h->epoch)))
            read_peers(h);
        else if (rc == FERRY_ENOENT) {
            int64_t want = lease;   /* unless a campaign replaced it meanwhile */
            atomic_compare_exchange_strong(&h->lease, &want, 0);
        }
    }
    return NULL;
}

static int grant(fr_ha_elect *h, ferry_error *err)
{
    uint64_t sent = fr_now_ns();
    int64_t id = 0;
    int rc = fr_etcd_lease_grant(h->kv, h->ttl_s, &id, err);
    if (rc < 0)
        return rc;
    atomic_store(&h->renewed_ns, sent);
    atomic_store(&h->lease, id);
    return 0;
}

int fr_ha_open(const fr_ha_config *cfg, fr_ha_elect **out, ferry_error *err)
{
    *out = NULL;
    if (!cfg || !cfg->endpoints || !cfg->cluster || !*cfg->cluster || strchr(cfg->cluster, '/') ||
        strlen(cfg->cluster) > 64 || !cfg->id || !*cfg->id || strlen(cfg->id) >= FR_HA_ID_MAX ||
        cfg->ttl_s < 0)
        return fr_fail(err, FERRY_EINVAL, "ha: bad config (endpoints, a cluster name of at most 64 "
                       "characters without '/', an id shorter than %d, a TTL >= 0)", FR_HA_ID_MAX);
    fr_ha_elect *h = calloc(1, sizeof *h);
    if (!h)
        return fr_fail(err, FERRY_ENOMEM, "ha: out of memory");
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    h->ttl_s = cfg->ttl_s ? cfg->ttl_s : FR_HA_TTL_S;
    snprintf(h->key, sizeof h->key, "ferry-ha/%s/leader", cfg->cluster);
    snprintf(h->cluster, sizeof h->cluster, "%s", cfg->cluster);
    snprintf(h->id, sizeof h->id, "%s", cfg->id);
    int tmo = cfg->timeout_ms > 0 ? cfg->timeout_ms : 1000;
    int rc = fr_etcd_open(cfg->endpoints, tmo, &h->kv, err);
    if (rc == 0)
        rc = fr_etcd_open(cfg->endpoints, tmo, &h->ka, err);
    if (rc == 0)
        rc = grant(h, err);
    if (rc == 0 && pthread_create(&h->thread, NULL, renew, h) != 0)
        rc = fr_fail(err, FERRY_ENOMEM, "ha: cannot start the lease's renewing thread");
    if (rc < 0) {
        fr_etcd_close(h->kv);
        fr_etcd_close(h->ka);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return rc;
    }
    h->started = true;
    *out = h;
    return 0;
}

static void finish(fr_ha_elect *h, bool resign)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->started)
        pthread_join(h->thread, NULL);
    int64_t lease = atomic_load(&h->lease);
    if (resign && lease)
        (void)fr_etcd_lease_revoke(h->kv, lease, NULL);   /* its key goes: another wins now */
    fr_etcd_close(h->kv);
    fr_etcd_close(h->ka);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void fr_ha_close(fr_ha_elect *h) { finish(h, true); }
void fr_ha_abandon(fr_ha_elect *h) { finish(h, false); }

int fr_ha_leader(fr_ha_elect *h, char *id, size_t cap, int64_t *epoch, ferry_error *err)
{
    fr_etcd_kv kv;
    int rc = fr_etcd_get(h->kv, h->key, &kv, err);
    if (rc == FERRY_ENOENT)
        return fr_fail(err, rc, "ha: no master leads cluster %s", h->key);
    if (rc < 0)
        return rc;
    if (id && cap)
        snprintf(id, cap, "%.*s", (int)(kv.len < cap ? kv.len : cap - 1), (const char *)kv.val);
    if (epoch)
        *epoch = kv.create_rev;
    fr_etcd_kv_clear(&kv);
    return 0;
}

int fr_ha_campaign(fr_ha_elect *h, int timeout_ms, int64_t *epoch, ferry_error *err)
{
    uint64_t deadline = timeout_ms < 0 ? 0 : fr_deadline_ns(timeout_ms);
    int wait = 20;
    for (;;) {
        ferry_error e = {0};
        int rc = atomic_load(&h->lease) ? 0 : grant(h, &e);
        int64_t rev = 0;
        if (rc == 0)
            rc = fr_etcd_put_if(h->kv, h->key, 0, h->key, h->id, strlen(h->id),
                                atomic_load(&h->lease), &rev, NULL, &e);
        if (rc == 0) {
            atomic_store(&h->epoch, rev);
            *epoch = rev;
            return 0;
        }
        if (rc == FERRY_ESTATE) {
            /* the key may be this candidate's own, on its live lease (a
             * campaign after a cut from etcd that the lease survived) */
            fr_etcd_kv kv;
            if (fr_etcd_get(h->kv, h->key, &kv, NULL) == 0 && kv.lease &&
                kv.lease == atomic_load(&h->lease) && kv.len == strlen(h->id) &&
                memcmp(kv.val, h->id, kv.len) == 0) {
                uint64_t sent = fr_now_ns();   /* renewed now: leading counts from here */
                int64_t ttl = 0, lease = kv.lease;
                int krc = fr_etcd_lease_keepalive(h->kv, lease, &ttl, NULL);
                if (krc == 0) {
                    atomic_store(&h->renewed_ns, sent);
                    atomic_store(&h->epoch, kv.create_rev);
                    *epoch = kv.create_rev;
                    fr_etcd_kv_clear(&kv);
                    return 0;
                }
                /* not renewed: no leadership to report. A lease etcd let
                 * lapse meanwhile (its expiry noticed after an outage, the
                 * key about to go) is replaced on the next try. */
                if (krc == FERRY_ENOENT)
                    atomic_compare_exchange_strong(&h->lease, &lease, 0);
            }
            fr_etcd_kv_clear(&kv);
        }
        if (rc == FERRY_EIO && atomic_load(&h->lease)) {
            /* the lease may have lapsed under us (etcd: "lease not found") */
            int64_t ttl = 0;
            if (fr_etcd_lease_keepalive(h->kv, atomic_load(&h->lease), &ttl, NULL) == FERRY_ENOENT)
                atomic_store(&h->lease, 0);
        }
        int left = timeout_ms < 0 ? wait : fr_ms_left(deadline);
        if (left == 0) {
            if (rc != FERRY_ESTATE) {
                if (err)
                    *err = e;
                return rc;
            }
            char who[FR_HA_ID_MAX] = "";
            int64_t ep = 0;
            if (fr_ha_leader(h, who, sizeof who, &ep, NULL) < 0)
                snprintf(who, sizeof who, "(gone meanwhile)");
            return fr_fail(err, FERRY_ETIMEDOUT, "ha: %s leads cluster %s (epoch %" PRId64 "); "
                           "%s is a standby", who, h->key, ep, h->id);
        }
        pause_ms(h, left < wait ? left : wait);
        wait = wait < 100 ? wait * 2 : 100;   /* at most 0.1 s behind a leader's key going */
    }
}

bool fr_ha_leading(fr_ha_elect *h, int64_t epoch)
{
    if (!h || epoch == 0 || atomic_load(&h->epoch) != epoch || atomic_load(&h->lease) == 0)
        return false;
    return fr_now_ns() - atomic_load(&h->renewed_ns) < (uint64_t)h->ttl_s * 1000000000ull;
}

int fr_ha_fenced_put(fr_ha_elect *h, int64_t epoch, const char *key, const void *val, size_t len,
                     ferry_error *err)
{
    int64_t cur = 0;
    int rc = fr_etcd_put_if(h->kv, h->key, epoch, key, val, len, 0, NULL, &cur, err);
    if (rc == FERRY_ESTATE)
        return fr_fail(err, rc, "ha: %s no longer leads with epoch %" PRId64 " (now %" PRId64
                       "): %s not written", h->id, epoch, cur, key);
    return rc;
}

fr_etcd *fr_ha_etcd(fr_ha_elect *h) { return h->kv; }
const char *fr_ha_cluster(const fr_ha_elect *h) { return h->cluster; }
const char *fr_ha_key(const fr_ha_elect *h) { return h->key; }

int fr_ha_report(fr_ha_elect *h, uint64_t next_seq, ferry_error *err)
{
    char key[FR_HA_ID_MAX + 96], end[FR_HA_ID_MAX + 96], val[24];
    peers_prefix(h, key, end, sizeof key);
    snprintf(key + strlen(key), sizeof key - strlen(key), "%s", h->id);
    snprintf(val, sizeof val, "%" PRIu64, next_seq);
    int64_t lease = atomic_load(&h->lease);
    if (lease == 0)
        return fr_fail(err, FERRY_ESTATE, "ha: %s has no lease to report on", h->id);
    return fr_etcd_put(h->kv, key, val, strlen(val), lease, NULL, err);
}

size_t fr_ha_standbys(fr_ha_elect *h, fr_ha_peer *out, size_t max)
{
    pthread_mutex_lock(&h->mu);
    size_t n = h->npeers < max ? h->npeers : max;
    memcpy(out, h->peers, n * sizeof *out);
    pthread_mutex_unlock(&h->mu);
    return n;
}

int fr_ha_count_leadership(fr_ha_elect *h, int64_t epoch, uint64_t *n, ferry_error *err)
{
    char key[128], val[24];
    snprintf(key, sizeof key, "ferry-ha/%s/leaderships", h->cluster);
    fr_etcd_kv kv;
    int rc = fr_etcd_get(h->kv, key, &kv, err);
    if (rc < 0 && rc != FERRY_ENOENT)
        return rc;
    uint64_t count = rc == 0 ? strtoull(kv.val, NULL, 10) + 1 : 1;
    fr_etcd_kv_clear(&kv);
    snprintf(val, sizeof val, "%" PRIu64, count);
    if ((rc = fr_ha_fenced_put(h, epoch, key, val, strlen(val), err)) == 0)
        *n = count;
    return rc;
}

int fr_ha_check_token(fr_ha_elect *h, uint64_t fingerprint, ferry_error *err)
{
    char key[128], val[24];
    snprintf(key, sizeof key, "ferry-ha/%s/token", h->cluster);
    snprintf(val, sizeof val, "%016" PRIx64, fingerprint);
    /* the first candidate of the cluster names the token; the others compare */
    int rc = fr_etcd_put_if(h->kv, key, 0, key, val, strlen(val), 0, NULL, NULL, err);
    if (rc != FERRY_ESTATE)
        return rc;
    fr_etcd_kv kv;
    if ((rc = fr_etcd_get(h->kv, key, &kv, err)) < 0)
        return rc;
    bool same = kv.len == strlen(val) && memcmp(kv.val, val, kv.len) == 0;
    char theirs[24];
    snprintf(theirs, sizeof theirs, "%.*s", (int)(kv.len < 23 ? kv.len : 23), (const char *)kv.val);
    fr_etcd_kv_clear(&kv);
    if (same)
        return 0;
    return fr_fail(err, FERRY_EAUTH, "ha: cluster %s in etcd belongs to masters of another cluster "
                   "token (its fingerprint %s, this master's %s): refusing to join it; give this "
                   "master that cluster's token, or another --cluster", h->cluster, theirs, val);
}
