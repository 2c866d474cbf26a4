/* A small etcd v3 client over etcd's JSON gateway (HTTP/1.1 POSTs of JSON
 * to /v3/...; keys and values base64), for what a replicated master needs
 * of etcd: leases, reads, puts, deletes and the compare-and-put that
 * elects a leader and fences a deposed one (docs/store.md, "High
 * availability"). Not a general client: one request at a time per handle
 * (a mutex serializes callers), no watch yet.
 *
 * libcurl is loaded at the first fr_etcd_open (dlopen of libcurl.so.4, as
 * the CLI loads libmicrohttpd): a process that never talks to etcd does
 * not pay for it, and libferry links no HTTP code.
 *
 * Every call fails with a sentence (fr_fail): FERRY_ECONNREFUSED when no
 * endpoint answered (each one tried in order, the last one's reason
 * said), FERRY_ETIMEDOUT past the handle's timeout, FERRY_EPROTO for an
 * answer that is not what etcd sends, FERRY_EIO for an error etcd
 * returned (its message said). */
#ifndef FR_STORE_ETCD_INT_H
#define FR_STORE_ETCD_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"

typedef struct fr_etcd fr_etcd;

#define FR_ETCD_ENDPOINTS_MAX 8

/* endpoints: comma-separated base URLs ("http://127.0.0.1:2379,..."), at
 * most FR_ETCD_ENDPOINTS_MAX; timeout_ms bounds each request (connection
 * included). Nothing is sent yet. */
int fr_etcd_open(const char *endpoints, int timeout_ms, fr_etcd **out, ferry_error *err);
void fr_etcd_close(fr_etcd *e);

/* A key as etcd holds it: its value (malloc'd, NUL-terminated past len),
 * its revisions (create_rev 0: absent) and the lease it is attached to. */
typedef struct fr_etcd_kv {
    char *key;                   /* fr_etcd_range only (NULL from fr_etcd_get) */
    void *val;
    size_t len;
    int64_t create_rev, mod_rev, version, lease;
} fr_etcd_kv;
void fr_etcd_kv_clear(fr_etcd_kv *kv);

/* Leases: *id of a new lease of ttl_s seconds; a keep-alive renews it
 * (*ttl: the seconds granted; FERRY_ENOENT when it has expired or was
 * revoked); revoking deletes every key attached to it. */
int fr_etcd_lease_grant(fr_etcd *e, int64_t ttl_s, int64_t *id, ferry_error *err);
int fr_etcd_lease_keepalive(fr_etcd *e, int64_t id, int64_t *ttl, ferry_error *err);
int fr_etcd_lease_revoke(fr_etcd *e, int64_t id, ferry_error *err);

/* key = val, attached to lease (0: none); *rev (may be NULL): the
 * revision of the change. */
int fr_etcd_put(fr_etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                int64_t *rev, ferry_error *err);
/* FERRY_ENOENT when there is no such key (*out cleared). */
int fr_etcd_get(fr_etcd *e, const char *key, fr_etcd_kv *out, ferry_error *err);
/* *deleted (may be NULL): keys removed (0 or 1). */
int fr_etcd_delete(fr_etcd *e, const char *key, int64_t *deleted, ferry_error *err);

/* One transaction: key = val (attached to lease) only if cmp_key's
 * create revision is cmp_create_rev (0: cmp_key must not exist). The
 * leader's election (cmp_key = key, 0) and the fencing of everything a
 * leader writes (cmp_key = its leadership key, the create revision it won
 * with): a deposed leader's put fails here, in etcd, whatever its own
 * clock says. FERRY_ESTATE when the compare fails (nothing written; *cur,
 * may be NULL, gets cmp_key's create revision then, 0: absent). */
int fr_etcd_put_if(fr_etcd *e, const char *cmp_key, int64_t cmp_create_rev, const char *key,
                   const void *val, size_t len, int64_t lease, int64_t *rev, int64_t *cur,
                   ferry_error *err);

/* The keys in [start, end) in key order, at most limit of them (0: no
 * limit): *out (malloc'd, *n entries; fr_etcd_kvs_free), *more whether
 * etcd holds more in the range (may be NULL). */
int fr_etcd_range(fr_etcd *e, const char *start, const char *end, int64_t limit, fr_etcd_kv **out,
                  size_t *n, bool *more, ferry_error *err);
void fr_etcd_kvs_free(fr_etcd_kv *kvs, size_t n);

/* Delete the keys in [start, end) only if cmp_key's create revision is
 * cmp_create_rev (FERRY_ESTATE otherwise, nothing deleted); *deleted (may
 * be NULL): how many. */
int fr_etcd_delete_range_if(fr_etcd *e, const char *cmp_key, int64_t cmp_create_rev,
                            const char *start, const char *end, int64_t *deleted,
                            ferry_error *err);

/* Compact etcd's history up to revision rev (its database keeps no
 * version older than rev of any key afterwards). */
int fr_etcd_compact(fr_etcd *e, int64_t rev, ferry_error *err);

/* The size of the etcd member's database file, bytes (the first endpoint
 * that answers), and the cluster's revision now. */
int fr_etcd_status(fr_etcd *e, int64_t *db_size, int64_t *revision, ferry_error *err);

#endif
