/* etcd v3 over its JSON gateway (etcd_int.h). */
#define CURL_DISABLE_TYPECHECK   /* its macros would wrap the loaded functions' calls */
#include <curl/curl.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store/etcd_int.h"

#define CURL_LIBRARY "libcurl.so.4"

/* The functions of libcurl used here, resolved once by load_curl. */
#define CURL_FUNCS(X) \
    X(curl_global_init) X(curl_easy_init) X(curl_easy_setopt) X(curl_easy_perform) \
    X(curl_easy_getinfo) X(curl_easy_cleanup) X(curl_easy_strerror) X(curl_slist_append) \
    X(curl_slist_free_all)

static struct {
#define CURL_SLOT(f) __typeof__(f) *f;
    CURL_FUNCS(CURL_SLOT)
#undef CURL_SLOT
} cu;
static bool cu_ok;
static char cu_error[256];

static void load_curl(void)
{
    void *h = dlopen(CURL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cu_error, sizeof cu_error, "cannot load %s (install libcurl4): %s", CURL_LIBRARY,
                 dlerror());
        return;
    }
#define CURL_RESOLVE(f)                                                            \
    {                                                                              \
        void *sym = dlsym(h, #f);                                                  \
        if (!sym) {                                                                \
            snprintf(cu_error, sizeof cu_error, "%s has no %s", CURL_LIBRARY, #f); \
            return;                                                                \
        }                                                                          \
        memcpy(&cu.f, &sym, sizeof sym);                                           \
    }
    CURL_FUNCS(CURL_RESOLVE)
#undef CURL_RESOLVE
    if (cu.curl_global_init(CURL_GLOBAL_NOTHING) != CURLE_OK) {
        snprintf(cu_error, sizeof cu_error, "%s: curl_global_init failed", CURL_LIBRARY);
        return;
    }
    cu_ok = true;
}

struct fr_etcd {
    pthread_mutex_t mu;
    CURL *h;
    struct curl_slist *hdr;
    char *ep[FR_ETCD_ENDPOINTS_MAX];
    size_t nep, cur;             /* endpoints; the one that answered last */
    int timeout_ms;
    char *buf;                   /* the answer being received */
    size_t len, cap;
};

/* ---- base64 and numbers ------------------------------------------------------------------ */

static char *b64(const void *p, size_t n)
{
    size_t cap = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
    char *s = malloc(cap);
    if (s)
        sodium_bin2base64(s, cap, p, n, sodium_base64_VARIANT_ORIGINAL);
    return s;
}

/* A base64 field into *out (malloc'd, NUL-terminated past *n); "" or
 * absent (proto3 leaves empty fields out): 0 bytes. */
static int unb64(const json_t *j, void **out, size_t *n)
{
    const char *s = json_is_string(j) ? json_string_value(j) : "";
    size_t sl = strlen(s), cap = sl / 4 * 3 + 3;
    unsigned char *p = malloc(cap + 1);
    if (!p)
        return FERRY_ENOMEM;
    size_t got = 0;
    if (sl && sodium_base642bin(p, cap, s, sl, NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL) != 0) {
        free(p);
        return FERRY_EPROTO;
    }
    p[got] = 0;
    *out = p;
    *n = got;
    return 0;
}

/* int64 fields travel as JSON strings; absent means 0. */
static int64_t i64(const json_t *o, const char *name)
{
    const json_t *j = json_object_get(o, name);
    if (json_is_string(j))
        return strtoll(json_string_value(j), NULL, 10);
    if (json_is_integer(j))
        return (int64_t)json_integer_value(j);
    return 0;
}

static char *i64s(int64_t v, char out[24])
{
    snprintf(out, 24, "%" PRId64, v);
    return out;
}

/* ---- requests ------------------------------------------------------------------------------ */

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    fr_etcd *e = arg;
    size_t k = size * n;
    if (e->len + k + 1 > e->cap) {
        size_t cap = (e->len + k + 1) * 2;
        char *b = realloc(e->buf, cap);
        if (!b)
            return 0;   /* curl fails the transfer */
        e->buf = b;
        e->cap = cap;
    }
    memcpy(e->buf + e->len, p, k);
    e->len += k;
    e->buf[e->len] = 0;
    return k;
}

/* POST body to path on the endpoints in turn, from the one that answered
 * last; *reply: the answer's JSON object (json_decref). An answer that is
 * an error of etcd's ({"error": ..., "code": ...}) fails with FERRY_EIO and
 * its message. */
static int call(fr_etcd *e, const char *path, json_t *body, json_t **reply, ferry_error *err)
{
    *reply = NULL;
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text)
        return fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    pthread_mutex_lock(&e->mu);
    int rc = FERRY_ECONNREFUSED;
    char why[CURL_ERROR_SIZE + 160] = "";
    for (size_t t = 0; t < e->nep; t++) {
        size_t i = (e->cur + t) % e->nep;
        char url[512];
        snprintf(url, sizeof url, "%s%s", e->ep[i], path);
        char cerr[CURL_ERROR_SIZE] = "";
        e->len = 0;
        cu.curl_easy_setopt(e->h, CURLOPT_URL, url);
        cu.curl_easy_setopt(e->h, CURLOPT_POSTFIELDS, text);
        cu.curl_easy_setopt(e->h, CURLOPT_ERRORBUFFER, cerr);
        CURLcode c = cu.curl_easy_perform(e->h);
        long status = 0;
        if (c == CURLE_OK)
            cu.curl_easy_getinfo(e->h, CURLINFO_RESPONSE_CODE, &status);
        if (c != CURLE_OK) {
            rc = c == CURLE_OPERATION_TIMEDOUT ? FERRY_ETIMEDOUT : FERRY_ECONNREFUSED;
            snprintf(why, sizeof why, "%s: %s", e->ep[i], cerr[0] ? cerr : cu.curl_easy_strerror(c));
            continue;
        }
        e->cur = i;
        json_error_t je;
        json_t *j = e->len ? json_loadb(e->buf, e->len, 0, &je) : NULL;
        if (!json_is_object(j)) {
            json_decref(j);
            rc = FERRY_EPROTO;
            snprintf(why, sizeof why, "%s%s answered HTTP %ld with no JSON object", e->ep[i], path,
                     status);
            break;
        }
        const json_t *msg = json_object_get(j, "message");
        if (!msg)
            msg = json_object_get(j, "error");
        if (status != 200 || json_object_get(j, "code")) {
            rc = FERRY_EIO;
            snprintf(why, sizeof why, "%s%s: HTTP %ld: %s", e->ep[i], path, status,
                     json_is_string(msg) ? json_string_value(msg) : "(no message)");
            json_decref(j);
            break;
        }
        *reply = j;
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&e->mu);
    free(text);
    if (rc < 0)
        return fr_fail(err, rc, "etcd: %s", why[0] ? why : "no endpoint");
    return 0;
}

/* POST {field: "<v>"} (etcd's JSON takes int64s as strings) to path. */
static int call_i64(fr_etcd *e, const char *path, const char *field, int64_t v, json_t **reply,
                    ferry_error *err)
{
    char n[24];
    return call(e, path, json_pack("{ss}", field, i64s(v, n)), reply, err);
}

/* POST {"key": base64(key)} to path. */
static int call_key(fr_etcd *e, const char *path, const char *key, json_t **reply,
                    ferry_error *err)
{
    *reply = NULL;
    char *k = b64(key, strlen(key));
    int rc = k ? call(e, path, json_pack("{ss}", "key", k), reply, err)
               : fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    free(k);
    return rc;
}

/* ---- the handle ----------------------------------------------------------------------------- */

int fr_etcd_open(const char *endpoints, int timeout_ms, fr_etcd **out, ferry_error *err)
{
    *out = NULL;
    if (!endpoints || !*endpoints || timeout_ms <= 0)
        return fr_fail(err, FERRY_EINVAL, "etcd: no endpoints, or a timeout of %d ms", timeout_ms);
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, load_curl);
    if (!cu_ok)
        return fr_fail(err, FERRY_ENOTSUP, "etcd: %s", cu_error);
    fr_etcd *e = calloc(1, sizeof *e);
    if (!e)
        return fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    pthread_mutex_init(&e->mu, NULL);
    e->timeout_ms = timeout_ms;
    int rc = 0;
    for (const char *p = endpoints; *p && rc == 0;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n > 400 || e->nep == FR_ETCD_ENDPOINTS_MAX ||
            (strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0))
            rc = fr_fail(err, FERRY_EINVAL, "etcd: endpoint %zu of \"%s\" is not an http:// or "
                         "https:// URL (at most %d endpoints)", e->nep + 1, endpoints,
                         FR_ETCD_ENDPOINTS_MAX);
        else if (!(e->ep[e->nep] = strndup(p, n - (p[n - 1] == '/'))))
            rc = fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
        else
            e->nep++;
        p += n + (p[n] == ',');
    }
    if (rc == 0 && !(e->h = cu.curl_easy_init()))
        rc = fr_fail(err, FERRY_ENOMEM, "etcd: curl_easy_init failed");
    if (rc == 0)
        e->hdr = cu.curl_slist_append(NULL, "Content-Type: application/json");
    if (rc == 0) {
        cu.curl_easy_setopt(e->h, CURLOPT_HTTPHEADER, e->hdr);
        cu.curl_easy_setopt(e->h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
        cu.curl_easy_setopt(e->h, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
        cu.curl_easy_setopt(e->h, CURLOPT_NOSIGNAL, 1L);
        cu.curl_easy_setopt(e->h, CURLOPT_WRITEFUNCTION, on_data);
        cu.curl_easy_setopt(e->h, CURLOPT_WRITEDATA, e);
        cu.curl_easy_setopt(e->h, CURLOPT_PROXY, "");   /* never an http_proxy of the environment */
    }
    if (rc < 0) {
        fr_etcd_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

void fr_etcd_close(fr_etcd *e)
{
    if (!e)
        return;
    if (e->h)
        cu.curl_easy_cleanup(e->h);
    if (e->hdr)
        cu.curl_slist_free_all(e->hdr);
    for (size_t i = 0; i < e->nep; i++)
        free(e->ep[i]);
    free(e->buf);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void fr_etcd_kv_clear(fr_etcd_kv *kv)
{
    free(kv->key);
    free(kv->val);
    memset(kv, 0, sizeof *kv);
}

void fr_etcd_kvs_free(fr_etcd_kv *kvs, size_t n)
{
    for (size_t i = 0; kvs && i < n; i++)
        fr_etcd_kv_clear(&kvs[i]);
    free(kvs);
}

/* ---- leases --------------------------------------------------------------------------------- */

int fr_etcd_lease_grant(fr_etcd *e, int64_t ttl_s, int64_t *id, ferry_error *err)
{
    json_t *r = NULL;
    int rc = call_i64(e, "/v3/lease/grant", "TTL", ttl_s, &r, err);
    if (rc < 0)
        return rc;
    *id = i64(r, "ID");
    const json_t *msg = json_object_get(r, "error");
    if (*id == 0)   /* said before r (which holds msg) goes */
        rc = fr_fail(err, FERRY_EIO, "etcd: no lease granted%s%s", json_is_string(msg) ? ": " : "",
                     json_is_string(msg) ? json_string_value(msg) : "");
    json_decref(r);
    return rc;
}

int fr_etcd_lease_keepalive(fr_etcd *e, int64_t id, int64_t *ttl, ferry_error *err)
{
    json_t *r = NULL;
    int rc = call_i64(e, "/v3/lease/keepalive", "ID", id, &r, err);
    if (rc < 0)
        return rc;
    const json_t *res = json_object_get(r, "result");
    *ttl = res ? i64(res, "TTL") : 0;
    json_decref(r);
    if (*ttl <= 0)
        return fr_fail(err, FERRY_ENOENT, "etcd: lease %" PRId64 " has expired or was revoked", id);
    return 0;
}

int fr_etcd_lease_revoke(fr_etcd *e, int64_t id, ferry_error *err)
{
    json_t *r = NULL;
    int rc = call_i64(e, "/v3/lease/revoke", "ID", id, &r, err);
    json_decref(r);
    return rc;
}

/* ---- keys ------------------------------------------------------------------------------------ */

static int kv_of(const json_t *kv, fr_etcd_kv *out, bool want_key);

/* {"key", "value", "lease"} of a put; NULL when out of memory. */
static json_t *put_req(const char *key, const void *val, size_t len, int64_t lease)
{
    char *k = b64(key, strlen(key)), *v = b64(val, len), n[24];
    json_t *o = k && v ? json_pack("{ssss}", "key", k, "value", v) : NULL;
    if (o && lease && json_object_set_new(o, "lease", json_string(i64s(lease, n))) < 0) {
        json_decref(o);
        o = NULL;
    }
    free(k);
    free(v);
    return o;
}

int fr_etcd_put(fr_etcd *e, const char *key, const void *val, size_t len, int64_t lease,
                int64_t *rev, ferry_error *err)
{
    json_t *q = put_req(key, val, len, lease), *r = NULL;
    if (!q)
        return fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    int rc = call(e, "/v3/kv/put", q, &r, err);
    if (rc == 0 && rev)
        *rev = i64(json_object_get(r, "header"), "revision");
    json_decref(r);
    return rc;
}

int fr_etcd_get(fr_etcd *e, const char *key, fr_etcd_kv *out, ferry_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *r = NULL;
    int rc = call_key(e, "/v3/kv/range", key, &r, err);
    if (rc < 0)
        return rc;
    const json_t *kvs = json_object_get(r, "kvs"), *kv = json_array_get(kvs, 0);
    if (!kv) {
        json_decref(r);
        return fr_fail(err, FERRY_ENOENT, "etcd: no key %s", key);
    }
    rc = kv_of(kv, out, false);
    json_decref(r);
    if (rc < 0)
        return fr_fail(err, rc, "etcd: the value of %s is not base64", key);
    return 0;
}

int fr_etcd_delete(fr_etcd *e, const char *key, int64_t *deleted, ferry_error *err)
{
    json_t *r = NULL;
    int rc = call_key(e, "/v3/kv/deleterange", key, &r, err);
    if (rc == 0 && deleted)
        *deleted = i64(r, "deleted");
    json_decref(r);
    return rc;
}

int fr_etcd_put_if(fr_etcd *e, const char *cmp_key, int64_t cmp_create_rev, const char *key,
                   const void *val, size_t len, int64_t lease, int64_t *rev, int64_t *cur,
                   ferry_error *err)
{
    char *ck = b64(cmp_key, strlen(cmp_key)), n[24];
    json_t *put = put_req(key, val, len, lease), *q = NULL;
    if (ck && put)
        /* on failure, read cmp_key back: whose it is now */
        q = json_pack("{s:[{ss ss ss ss}] s:[{so}] s:[{s:{ss}}]}",
                      "compare", "key", ck, "target", "CREATE", "result", "EQUAL",
                      "create_revision", i64s(cmp_create_rev, n),
                      "success", "request_put", put,
                      "failure", "request_range", "key", ck);
    else
        json_decref(put);
    free(ck);
    if (!q)
        return fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    json_t *r = NULL;
    int rc = call(e, "/v3/kv/txn", q, &r, err);
    if (rc < 0)
        return rc;
    bool ok = json_is_true(json_object_get(r, "succeeded"));
    if (ok && rev)
        *rev = i64(json_object_get(r, "header"), "revision");
    if (!ok && cur) {
        const json_t *rr = json_object_get(json_array_get(json_object_get(r, "responses"), 0),
                                           "response_range");
        const json_t *kv = json_array_get(json_object_get(rr, "kvs"), 0);
        *cur = kv ? i64(kv, "create_revision") : 0;
    }
    json_decref(r);
    if (!ok)
        return fr_fail(err, FERRY_ESTATE, "etcd: %s was not created at revision %" PRId64
                       " (another holds it, or it is gone): %s not written", cmp_key,
                       cmp_create_rev, key);
    return 0;
}

/* One etcd kv object of an answer into *out (key too when want_key). */
static int kv_of(const json_t *kv, fr_etcd_kv *out, bool want_key)
{
    memset(out, 0, sizeof *out);
    out->create_rev = i64(kv, "create_revision");
    out->mod_rev = i64(kv, "mod_revision");
    out->version = i64(kv, "version");
    out->lease = i64(kv, "lease");
    size_t kl = 0;
    int rc = want_key ? unb64(json_object_get(kv, "key"), (void **)&out->key, &kl) : 0;
    if (rc == 0)
        rc = unb64(json_object_get(kv, "value"), &out->val, &out->len);
    if (rc < 0)
        fr_etcd_kv_clear(out);
    return rc;
}

int fr_etcd_range(fr_etcd *e, const char *start, const char *end, int64_t limit, fr_etcd_kv **out,
                  size_t *n, bool *more, ferry_error *err)
{
    *out = NULL;
    *n = 0;
    char *k = b64(start, strlen(start)), *re = b64(end, strlen(end)), num[24];
    json_t *q = k && re ? json_pack("{ssss}", "key", k, "range_end", re) : NULL;
    if (q && limit > 0 && json_object_set_new(q, "limit", json_string(i64s(limit, num))) < 0) {
        json_decref(q);
        q = NULL;
    }
    free(k);
    free(re);
    if (!q)
        return fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    json_t *r = NULL;
    int rc = call(e, "/v3/kv/range", q, &r, err);
    if (rc < 0)
        return rc;
    const json_t *kvs = json_object_get(r, "kvs");
    size_t m = json_array_size(kvs);
    fr_etcd_kv *v = calloc(m ? m : 1, sizeof *v);
    if (!v) {
        json_decref(r);
        return fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    }
    for (size_t i = 0; i < m && rc == 0; i++)
        if ((rc = kv_of(json_array_get(kvs, i), &v[i], true)) < 0)
            rc = fr_fail(err, rc, "etcd: a key or value in [%s, %s) is not base64", start, end);
    if (more)
        *more = json_is_true(json_object_get(r, "more"));
    json_decref(r);
    if (rc < 0) {
        fr_etcd_kvs_free(v, m);
        return rc;
    }
    *out = v;
    *n = m;
    return 0;
}

int fr_etcd_delete_range_if(fr_etcd *e, const char *cmp_key, int64_t cmp_create_rev,
                            const char *start, const char *end, int64_t *deleted,
                            ferry_error *err)
{
    char *ck = b64(cmp_key, strlen(cmp_key)), *k = b64(start, strlen(start));
    char *re = b64(end, strlen(end)), n[24];
    json_t *q = ck && k && re
        ? json_pack("{s:[{ss ss ss ss}] s:[{s:{ss ss}}]}",
                    "compare", "key", ck, "target", "CREATE", "result", "EQUAL",
                    "create_revision", i64s(cmp_create_rev, n),
                    "success", "request_delete_range", "key", k, "range_end", re)
        : NULL;
    free(ck);
    free(k);
    free(re);
    if (!q)
        return fr_fail(err, FERRY_ENOMEM, "etcd: out of memory");
    json_t *r = NULL;
    int rc = call(e, "/v3/kv/txn", q, &r, err);
    if (rc < 0)
        return rc;
    bool ok = json_is_true(json_object_get(r, "succeeded"));
    if (ok && deleted) {
        const json_t *d = json_object_get(json_array_get(json_object_get(r, "responses"), 0),
                                          "response_delete_range");
        *deleted = i64(d, "deleted");
    }
    json_decref(r);
    if (!ok)
        return fr_fail(err, FERRY_ESTATE, "etcd: %s was not created at revision %" PRId64
                       ": nothing in [%s, %s) deleted", cmp_key, cmp_create_rev, start, end);
    return 0;
}

int fr_etcd_compact(fr_etcd *e, int64_t rev, ferry_error *err)
{
    json_t *r = NULL;
    int rc = call_i64(e, "/v3/kv/compaction", "revision", rev, &r, err);
    json_decref(r);
    return rc;
}

int fr_etcd_status(fr_etcd *e, int64_t *db_size, int64_t *revision, ferry_error *err)
{
    json_t *r = NULL;
    int rc = call(e, "/v3/maintenance/status", json_object(), &r, err);
    if (rc < 0)
        return rc;
    if (db_size)
        *db_size = i64(r, "dbSize");
    if (revision)
        *revision = i64(json_object_get(r, "header"), "revision");
    json_decref(r);
    return 0;
}
