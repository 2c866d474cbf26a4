/* The replicated log in etcd (ha_log.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store/etcd_int.h"
#include "store/ha_log.h"

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
