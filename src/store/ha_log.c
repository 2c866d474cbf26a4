/* The replicated log in etcd (ha_log.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store/etcd_int.h"
#include "store/ha_log.h"
#include "store/store_int.h"

/* The key of entry seq; seq UINT64_MAX: the end of the log's range. */
static void entry_key(const fr_ha_elect *h, uint64_t seq, char *out, size_t cap)
{
    if (seq == UINT64_MAX)
        snprintf(out, cap, "ferry-ha/%s/log0", fr_ha_cluster(h));   /* '0' follows '/' */
    else
        snprintf(out, cap, "ferry-ha/%s/log/%020" PRIu64, fr_ha_cluster(h), seq);
}

void fr_ha_entries_free(fr_ha_entry *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].data);
    free(v);
}

int fr_ha_log_append(fr_ha_elect *h, int64_t epoch, uint64_t seq, const void *data, size_t len,
                     ferry_error *err)
{
    if (seq == 0 || seq == UINT64_MAX || (len && !data))
        return fr_fail(err, FERRY_EINVAL, "ha log: bad entry (seq %" PRIu64 ")", seq);
    if (len > FR_HA_LOG_ENTRY_MAX)
        return fr_fail(err, FERRY_EMSGSIZE, "ha log: entry %" PRIu64 " holds %zu bytes, at most "
                       "%u go in one", seq, len, FR_HA_LOG_ENTRY_MAX);
    char k[160];
    entry_key(h, seq, k, sizeof k);
    int64_t cur = 0;
    int rc = fr_etcd_put_if(fr_ha_etcd(h), fr_ha_key(h), epoch, k, data, len, 0, NULL, &cur, err);
    if (rc == FERRY_ESTATE)
        return fr_fail(err, rc, "ha log: epoch %" PRId64 " no longer leads cluster %s (now %" PRId64
                       "): entry %" PRIu64 " not appended", epoch, fr_ha_cluster(h), cur, seq);
    return rc;
}

int fr_ha_log_read(fr_ha_elect *h, uint64_t from, size_t max, fr_ha_entry **out, size_t *n,
                   ferry_error *err)
{
    *out = NULL;
    *n = 0;
    if (max == 0 || from == UINT64_MAX)
        return fr_fail(err, FERRY_EINVAL, "ha log: read of %zu entries from %" PRIu64, max, from);
    char a[160], b[160];
    entry_key(h, from, a, sizeof a);
    entry_key(h, UINT64_MAX, b, sizeof b);
    fr_etcd_kv *kvs = NULL;
    size_t m = 0;
    int rc = fr_etcd_range(fr_ha_etcd(h), a, b, (int64_t)max, &kvs, &m, NULL, err);
    if (rc < 0)
        return rc;
    fr_ha_entry *v = calloc(m ? m : 1, sizeof *v);
    if (!v) {
        fr_etcd_kvs_free(kvs, m);
        return fr_fail(err, FERRY_ENOMEM, "ha log: out of memory");
    }
    size_t pre = strlen(b) - 1;   /* "ferry-ha/<cluster>/log" */
    for (size_t i = 0; i < m && rc == 0; i++) {
        const char *k = kvs[i].key;
        char *end = NULL;
        if (!k || strlen(k) != pre + 21 || k[pre] != '/')
            rc = fr_fail(err, FERRY_EPROTO, "ha log: %s is not an entry's key", k ? k : "(none)");
        else
            v[i].seq = strtoull(k + pre + 1, &end, 10);
        if (rc == 0 && (!end || *end))
            rc = fr_fail(err, FERRY_EPROTO, "ha log: %s is not an entry's key", k);
        v[i].data = kvs[i].val;
        v[i].len = kvs[i].len;
        kvs[i].val = NULL;
    }
    fr_etcd_kvs_free(kvs, m);
    if (rc < 0) {
        fr_ha_entries_free(v, m);
        return rc;
    }
    *out = v;
    *n = m;
    return 0;
}

int fr_ha_log_truncate(fr_ha_elect *h, int64_t epoch, uint64_t below, int64_t *deleted,
                       ferry_error *err)
{
    char a[160], b[160];
    entry_key(h, 0, a, sizeof a);
    entry_key(h, below, b, sizeof b);
    int64_t d = 0, rev = 0;
    int rc = fr_etcd_delete_range_if(fr_ha_etcd(h), fr_ha_key(h), epoch, a, b, &d, err);
    if (rc == FERRY_ESTATE)
        return fr_fail(err, rc, "ha log: epoch %" PRId64 " no longer leads cluster %s: nothing "
                       "truncated", epoch, fr_ha_cluster(h));
    if (rc < 0)
        return rc;
    if (deleted)
        *deleted = d;
    /* the deleted entries' history goes too: etcd keeps every version of
     * every key until a compaction */
    if ((rc = fr_etcd_status(fr_ha_etcd(h), NULL, &rev, err)) == 0)
        rc = fr_etcd_compact(fr_ha_etcd(h), rev, err);
    return rc;
}

typedef struct follow_ctx {
    fr_meta *m;
    uint64_t applied;
    int rc;
} follow_ctx;

static int follow_one(void *ctx, uint64_t lsn, const uint8_t *rec, size_t len)
{
    (void)lsn;
    follow_ctx *c = ctx;
    int rc = fr_meta_replay(c->m, rec, len);
    if (rc < 0) {
        c->rc = rc;
        return rc == FERRY_ENOMEM ? rc : FERRY_ECORRUPT;
    }
    c->applied++;
    return 0;
}

int fr_ha_follow(fr_ha_elect *h, fr_meta *m, size_t max_entries, uint64_t *next_seq,
                 uint64_t *next_lsn, uint64_t *applied, ferry_error *err)
{
    follow_ctx c = { .m = m };
    size_t page = 64, done = 0;
    int rc = 0;
    while (rc == 0 && (max_entries == 0 || done < max_entries)) {
        size_t want = max_entries && max_entries - done < page ? max_entries - done : page;
        fr_ha_entry *v = NULL;
        size_t n = 0;
        if ((rc = fr_ha_log_read(h, *next_seq, want, &v, &n, err)) < 0)
            break;
        for (size_t i = 0; i < n && rc == 0; i++) {
            if (v[i].seq != *next_seq) {
                rc = fr_fail(err, FERRY_ECORRUPT, "ha log: entry %" PRIu64 " follows %" PRIu64
                             " (entries missing: truncated past this standby?)", v[i].seq,
                             *next_seq - 1);
                break;
            }
            fr_wal_scan_result res;
            rc = fr_wal_scan(v[i].data, v[i].len, *next_lsn, follow_one, &c, &res);
            if (rc == 0 && res.valid_len != v[i].len)
                rc = FERRY_ECORRUPT;
            if (rc < 0) {
                rc = fr_fail(err, rc == FERRY_ENOMEM ? rc : FERRY_ECORRUPT, "ha log: entry %"
                             PRIu64 " does not apply at LSN %" PRIu64 "%s%s", v[i].seq,
                             *next_lsn, c.rc ? ": " : "", c.rc ? fr_meta_errmsg(m) : "");
                break;
            }
            *next_lsn = res.next_lsn;
            (*next_seq)++;
            done++;
        }
        fr_ha_entries_free(v, n);
        if (n < want)
            break;
    }
    if (applied)
        *applied = c.applied;
    return rc;
}

/* ---- snapshots --------------------------------------------------------------------------------- */

typedef struct snap_w {
    fr_ha_elect *h;
    int64_t epoch;
    uint64_t seq, lsn;          /* lsn: the frames' own numbering, 1.. */
    uint8_t *buf;
    size_t len, cap;
    uint32_t chunks;
    int rc;
    ferry_error *err;
} snap_w;

static void snap_key(const fr_ha_elect *h, uint64_t seq, int64_t chunk, char *out, size_t cap)
{
    if (chunk < 0)
        snprintf(out, cap, "ferry-ha/%s/snap/%020" PRIu64 "0", fr_ha_cluster(h), seq);  /* past seq's */
    else
        snprintf(out, cap, "ferry-ha/%s/snap/%020" PRIu64 "/%08" PRId64, fr_ha_cluster(h), seq, chunk);
}

static int snap_flush(snap_w *w)
{
    if (w->rc < 0 || w->len == 0)
        return w->rc;
    char k[200];
    snap_key(w->h, w->seq, w->chunks, k, sizeof k);
    int64_t cur = 0;
    w->rc = fr_etcd_put_if(fr_ha_etcd(w->h), fr_ha_key(w->h), w->epoch, k, w->buf, w->len, 0, NULL,
                           &cur, w->err);
    w->chunks++;
    w->len = 0;
    return w->rc;
}

static int snap_rec(void *ctx, const uint8_t *rec, size_t len)
{
    snap_w *w = ctx;
    size_t fl = len + FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL;
    if (w->rc < 0)
        return w->rc;
    if (fl > FR_HA_LOG_ENTRY_MAX)
        return w->rc = fr_fail(w->err, FERRY_EMSGSIZE, "ha snapshot: a record of %zu bytes", len);
    if (w->len + fl > FR_HA_LOG_ENTRY_MAX && snap_flush(w) < 0)
        return w->rc;
    if (fr_grow((void **)&w->buf, &w->cap, w->len + fl, 1) < 0)
        return w->rc = fr_fail(w->err, FERRY_ENOMEM, "ha snapshot: out of memory");
    w->len += fr_wal_frame_encode(w->buf + w->len, w->lsn++, rec, len);
    return 0;
}

static void snap_pointer_key(const fr_ha_elect *h, char *out, size_t cap)
{
    snprintf(out, cap, "ferry-ha/%s/snapshot", fr_ha_cluster(h));
}

int fr_ha_snapshot_put(fr_ha_elect *h, int64_t epoch, fr_meta *m, uint64_t seq, uint64_t lsn,
                       ferry_error *err)
{
    snap_w w = { .h = h, .epoch = epoch, .seq = seq, .lsn = 1, .err = err };
    int rc = fr_meta_snapshot(m, snap_rec, &w);
    if (rc == 0)
        rc = snap_flush(&w);
    if (rc == 0 && w.rc < 0)
        rc = w.rc;
    free(w.buf);
    if (rc < 0)
        return rc == FERRY_ESTATE ? fr_fail(err, rc, "ha snapshot: epoch %" PRId64 " no longer "
                                            "leads cluster %s", epoch, fr_ha_cluster(h)) : rc;
    fr_hash128_t d;
    char hex[33], val[160], pk[200];
    if ((rc = fr_meta_digest(m, &d)) < 0)
        return fr_fail(err, rc, "ha snapshot: cannot digest the state");
    fr_hash128_hex(d, hex);
    int n = snprintf(val, sizeof val, "%" PRIu64 " %" PRIu64 " %u %s", seq, lsn, w.chunks, hex);
    snap_pointer_key(h, pk, sizeof pk);
    if ((rc = fr_etcd_put_if(fr_ha_etcd(h), fr_ha_key(h), epoch, pk, val, (size_t)n, 0, NULL, NULL,
                             err)) < 0)
        return rc;
    /* what the snapshot makes redundant: older snapshots, the log below seq */
    char a[200], b[200];
    snap_key(h, 0, 0, a, sizeof a);
    snap_key(h, seq, 0, b, sizeof b);
    if ((rc = fr_etcd_delete_range_if(fr_ha_etcd(h), fr_ha_key(h), epoch, a, b, NULL, err)) < 0)
        return rc;
    return fr_ha_log_truncate(h, epoch, seq, NULL, err);
}

int fr_ha_snapshot_load(fr_ha_elect *h, fr_meta *m, uint64_t *seq, uint64_t *lsn, ferry_error *err)
{
    char pk[200];
    snap_pointer_key(h, pk, sizeof pk);
    fr_etcd_kv kv;
    int rc = fr_etcd_get(fr_ha_etcd(h), pk, &kv, err);
    if (rc < 0)
        return rc == FERRY_ENOENT ? fr_fail(err, rc, "ha: cluster %s has no snapshot",
                                            fr_ha_cluster(h)) : rc;
    unsigned long long s = 0, l = 0;
    unsigned chunks = 0;
    char hex[40] = "";
    int got = sscanf(kv.val, "%llu %llu %u %39s", &s, &l, &chunks, hex);
    fr_etcd_kv_clear(&kv);
    if (got != 4 || s == 0 || l == 0)
        return fr_fail(err, FERRY_ECORRUPT, "ha: the snapshot key of cluster %s is malformed",
                       fr_ha_cluster(h));
    if ((rc = fr_meta_load_begin(m)) < 0)
        return fr_fail(err, rc, "ha: the state to load a snapshot into is not empty");
    follow_ctx c = { .m = m };
    uint64_t next = 1;
    for (unsigned i = 0; i < chunks && rc == 0; i++) {
        char k[200];
        snap_key(h, s, i, k, sizeof k);
        if ((rc = fr_etcd_get(fr_ha_etcd(h), k, &kv, err)) < 0) {
            rc = fr_fail(err, FERRY_ECORRUPT, "ha: snapshot chunk %u of %u is missing", i, chunks);
            break;
        }
        fr_wal_scan_result res;
        rc = fr_wal_scan(kv.val, kv.len, next, follow_one, &c, &res);
        if (rc == 0 && res.valid_len != kv.len)
            rc = FERRY_ECORRUPT;
        next = res.next_lsn;
        fr_etcd_kv_clear(&kv);
        if (rc < 0)
            rc = fr_fail(err, FERRY_ECORRUPT, "ha: snapshot chunk %u does not apply", i);
    }
    fr_hash128_t d;
    char dh[33] = "";
    if (rc == 0 && (fr_meta_loading(m) || fr_meta_digest(m, &d) < 0 ||
                    (fr_hash128_hex(d, dh), strcmp(dh, hex) != 0)))
        rc = fr_fail(err, FERRY_ECORRUPT, "ha: the snapshot of cluster %s does not rebuild the "
                     "state it names", fr_ha_cluster(h));
    if (rc == 0) {
        *seq = s;
        *lsn = l;
    }
    return rc;
}

int fr_ha_snapshot_seq(fr_ha_elect *h, uint64_t *seq, ferry_error *err)
{
    char pk[200];
    snap_pointer_key(h, pk, sizeof pk);
    fr_etcd_kv kv;
    *seq = 0;
    int rc = fr_etcd_get(fr_ha_etcd(h), pk, &kv, err);
    if (rc == FERRY_ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    unsigned long long s = 0;
    int got = sscanf(kv.val, "%llu", &s);
    fr_etcd_kv_clear(&kv);
    if (got != 1 || s == 0)
        return fr_fail(err, FERRY_ECORRUPT, "ha: the snapshot key of cluster %s is malformed",
                       fr_ha_cluster(h));
    *seq = s;
    return 0;
}
