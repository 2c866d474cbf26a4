/* KV with revisions and a bounded change history (for watch). */
#include <stdlib.h>
#include <string.h>

#include "store/meta_int.h"

/* ---- history ----------------------------------------------------------- */

static kv_event *hist_at(const fr_meta *m, size_t i)
{
    return m->hist[(m->hist_head + i) % m->hist_cap];
}

static uint64_t event_bytes(const kv_event *e)
{
    return sizeof(*e) + strlen(e->key) + 1 + e->len;
}

static kv_event *event_new(uint64_t rev, uint32_t type, fr_span key, const uint8_t *val, size_t len)
{
    kv_event *e = fr_malloc(sizeof(*e) + key.n + 1 + len);
    if (e == NULL)
        return NULL;
    e->rev = rev;
    e->type = type;
    e->key = (char *)(e + 1);
    meta_cstr(e->key, key);
    e->val = (uint8_t *)e->key + key.n + 1;
    if (len != 0)
        memcpy(e->val, val, len);
    e->len = len;
    return e;
}

/* Room for one more event without failing later. */
static int hist_reserve(fr_meta *m)
{
    if (m->hist_n < m->hist_cap || m->hist_cap >= m->cfg.kv_history_events)
        return 0;
    size_t cap = m->hist_cap ? m->hist_cap * 2 : 16;
    if (cap > m->cfg.kv_history_events)
        cap = (size_t)m->cfg.kv_history_events;
    kv_event **h = fr_calloc(cap, sizeof(*h));
    if (h == NULL)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < m->hist_n; i++)
        h[i] = hist_at(m, i);
    fr_free(m->hist);
    m->hist = h;
    m->hist_cap = cap;
    m->hist_head = 0;
    return 0;
}

static void hist_drop_oldest(fr_meta *m)
{
    kv_event *e = m->hist[m->hist_head];
    m->kv_compact_rev = e->rev;
    m->hist_bytes -= event_bytes(e);
    fr_free(e);
    m->hist_head = (m->hist_head + 1) % m->hist_cap;
    m->hist_n--;
}

/* Append (room reserved); the oldest events go once a bound is passed. */
static void hist_push(fr_meta *m, kv_event *e)
{
    if (m->hist_n == m->hist_cap)
        hist_drop_oldest(m);
    m->hist[(m->hist_head + m->hist_n) % m->hist_cap] = e;
    m->hist_n++;
    m->hist_bytes += event_bytes(e);
    while (m->hist_n > 1 && m->hist_bytes > m->cfg.kv_history_bytes)
        hist_drop_oldest(m);
}

/* ---- KV state ------------------------------------------------------------ */

static kv_entry *kv_find(const fr_meta *m, const char *key)
{
    return fr_smap_get(&m->kv, key, fr_smap_hash(key));
}

static void kv_free(kv_entry *e)
{
    fr_free(e->val);
    fr_free(e);
}

/* Set key to val at revision rev (a new entry if absent). */
static int kv_set(fr_meta *m, fr_span key, fr_span val, uint64_t mod, uint64_t create,
                  uint64_t version, kv_entry **out)
{
    char k[FR_KEY_MAX + 1];
    meta_cstr(k, key);
    uint64_t h = fr_smap_hash(k);
    kv_entry *e = fr_smap_get(&m->kv, k, h), *fresh = NULL;
    uint8_t *v = fr_malloc(val.n);
    if (v == NULL)
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    if (e == NULL) {
        fresh = fr_calloc(1, sizeof(*fresh) + key.n + 1);
        if (fresh == NULL || fr_smap_reserve(&m->kv, 1) < 0) {
            fr_free(v);
            fr_free(fresh);
            return meta_fail(m, FERRY_ENOMEM, "out of memory");
        }
        e = fresh;
        e->key = (char *)(e + 1);
        memcpy(e->key, k, key.n + 1);
        e->hash = h;
        e->create_rev = create;
        fr_smap_put(&m->kv, e->key, h, e);
    }
    if (val.n != 0)
        memcpy(v, val.p, val.n);
    fr_free(e->val);
    e->val = v;
    e->len = val.n;
    e->mod_rev = mod;
    e->version = fresh != NULL ? 1 : e->version + 1;
    if (version != 0)
        e->version = version;
    *out = e;
    return 0;
}

static int kv_change_apply(fr_meta *m, const fr_rec *r)
{
    uint64_t rev = m->kv_rev + 1;
    kv_entry *e = NULL;
    char k[FR_KEY_MAX + 1];
    meta_cstr(k, r->key);
    if (r->type == FR_REC_KV_DEL && (e = kv_find(m, k)) == NULL)
        return meta_fail(m, FERRY_ENOENT, "no key '%s'", k);
    kv_event *ev = event_new(rev, r->type == FR_REC_KV_PUT ? FR_KV_PUT : FR_KV_DELETE, r->key,
                             (const uint8_t *)r->val.p, r->type == FR_REC_KV_PUT ? r->val.n : 0);
    if (ev == NULL || hist_reserve(m) < 0) {
        fr_free(ev);
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    }
    if (r->type == FR_REC_KV_PUT) {
        int rc = kv_set(m, r->key, r->val, rev, rev, 0, &e);
        if (rc < 0) {
            fr_free(ev);
            return rc;
        }
    } else {
        fr_smap_del(&m->kv, e->key, e->hash);
        kv_free(e);
    }
    m->kv_rev = rev;
    hist_push(m, ev);
    return 0;
}

static int snap_kv_apply(fr_meta *m, const fr_rec *r)
{
    kv_entry *e;
    char k[FR_KEY_MAX + 1];
    meta_cstr(k, r->key);
    if (kv_find(m, k) != NULL)
        return meta_fail(m, FERRY_EEXIST, "key '%s' twice", k);
    if (r->rev2 == 0 || r->rev < r->rev2 || r->rev > m->kv_rev || r->version == 0)
        return meta_fail(m, FERRY_EINVAL, "key '%s': bad revisions", k);
    return kv_set(m, r->key, r->val, r->rev, r->rev2, r->version, &e);
}

static int snap_event_apply(fr_meta *m, const fr_rec *r)
{
    if (r->rev != m->kv_compact_rev + m->hist_n + 1 || r->rev > m->kv_rev ||
        (r->state != FR_KV_PUT && r->state != FR_KV_DELETE) ||
        (r->state == FR_KV_DELETE && r->val.n != 0) || m->hist_n >= m->cfg.kv_history_events)
        return meta_fail(m, FERRY_EINVAL, "history event at revision %llu out of place",
                         (unsigned long long)r->rev);
    kv_event *ev = event_new(r->rev, (uint32_t)r->state, r->key, (const uint8_t *)r->val.p, r->val.n);
    if (ev == NULL || hist_reserve(m) < 0) {
        fr_free(ev);
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    }
    m->hist[(m->hist_head + m->hist_n) % m->hist_cap] = ev;
    m->hist_n++;
    m->hist_bytes += event_bytes(ev);
    return 0;
}

int meta_kv_finish_load(fr_meta *m)
{
    /* The history must cover every revision after the compacted one. */
    if (m->kv_compact_rev + m->hist_n != m->kv_rev)
        return meta_fail(m, FERRY_EINVAL, "history holds %zu events for revisions %llu..%llu",
                         m->hist_n, (unsigned long long)m->kv_compact_rev + 1,
                         (unsigned long long)m->kv_rev);
    return 0;
}

int meta_kv_apply(fr_meta *m, const fr_rec *r)
{
    switch (r->type) {
    case FR_REC_KV_PUT:
    case FR_REC_KV_DEL:
        return kv_change_apply(m, r);
    case FR_REC_SNAP_KV:
        return snap_kv_apply(m, r);
    default: /* SNAP_KV_EVENT */
        return snap_event_apply(m, r);
    }
}

void meta_kv_free_all(fr_meta *m)
{
    size_t pos = 0;
    kv_entry *e;
    while ((e = fr_smap_next(&m->kv, &pos)) != NULL)
        kv_free(e);
    fr_smap_fini(&m->kv);
    for (size_t i = 0; i < m->hist_n; i++)
        fr_free(hist_at(m, i));
    fr_free(m->hist);
}

/* ---- commands -------------------------------------------------------------- */

static int check_value(fr_meta *m, const void *val, size_t len)
{
    if (len > FR_VALUE_MAX || (val == NULL && len != 0))
        return meta_fail(m, FERRY_EINVAL, "value of %zu bytes (at most %u)", len, FR_VALUE_MAX);
    return 0;
}

int fr_meta_kv_get(fr_meta *m, const char *key, fr_kv_view *out)
{
    int rc = meta_check_name(m, "key", key);
    if (rc < 0)
        return rc;
    const kv_entry *e = kv_find(m, key);
    if (e == NULL)
        return meta_fail(m, FERRY_ENOENT, "no key '%s'", key);
    *out = (fr_kv_view){ e->val, e->len, e->mod_rev, e->create_rev, e->version };
    return 0;
}

int fr_meta_kv_put(fr_meta *m, const char *key, const void *val, size_t len, uint64_t *rev)
{
    int rc = meta_check_name(m, "key", key);
    if (rc < 0 || (rc = check_value(m, val, len)) < 0)
        return rc;
    fr_rec r = { .type = FR_REC_KV_PUT, .key = meta_span(key),
                 .val = { (const char *)val, (uint32_t)len } };
    if ((rc = meta_commit(m, &r)) == 0 && rev != NULL)
        *rev = m->kv_rev;
    return rc;
}

int fr_meta_kv_cas(fr_meta *m, const char *key, uint64_t expected, const void *val, size_t len,
                   uint64_t *rev)
{
    int rc = meta_check_name(m, "key", key);
    if (rc < 0 || (rc = check_value(m, val, len)) < 0)
        return rc;
    const kv_entry *e = kv_find(m, key);
    uint64_t cur = e != NULL ? e->mod_rev : 0;
    if (cur != expected) {
        if (rev != NULL)
            *rev = cur;
        return meta_fail(m, FERRY_ESTATE, "key '%s' is at revision %llu, not %llu%s", key,
                         (unsigned long long)cur, (unsigned long long)expected,
                         cur == 0 ? " (absent)" : "");
    }
    return fr_meta_kv_put(m, key, val, len, rev);
}

int fr_meta_kv_delete(fr_meta *m, const char *key, uint64_t expected, uint64_t *rev)
{
    int rc = meta_check_name(m, "key", key);
    if (rc < 0)
        return rc;
    const kv_entry *e = kv_find(m, key);
    if (e == NULL)
        return meta_fail(m, FERRY_ENOENT, "no key '%s'", key);
    if (expected != 0 && e->mod_rev != expected) {
        if (rev != NULL)
            *rev = e->mod_rev;
        return meta_fail(m, FERRY_ESTATE, "key '%s' is at revision %llu, not %llu", key,
                         (unsigned long long)e->mod_rev, (unsigned long long)expected);
    }
    fr_rec r = { .type = FR_REC_KV_DEL, .key = meta_span(key) };
    if ((rc = meta_commit(m, &r)) == 0 && rev != NULL)
        *rev = m->kv_rev;
    return rc;
}

uint64_t fr_meta_kv_revision(const fr_meta *m)
{
    return m->kv_rev;
}

int fr_meta_kv_watch(fr_meta *m, const char *prefix, uint64_t from_rev, fr_kv_event *ev,
                     size_t max, size_t *n, uint64_t *next_rev)
{
    size_t plen;
    if (prefix == NULL || (plen = strnlen(prefix, FR_KEY_MAX + 1)) > FR_KEY_MAX || n == NULL ||
        next_rev == NULL || (ev == NULL && max != 0))
        return meta_fail(m, FERRY_EINVAL, "bad watch arguments");
    uint64_t from = from_rev != 0 ? from_rev : m->kv_rev + 1;
    *n = 0;
    if (from <= m->kv_compact_rev)
        return meta_fail(m, FERRY_ERANGE,
                         "revision %llu has been compacted: the history starts at revision %llu; "
                         "read the current values and watch from revision %llu",
                         (unsigned long long)from, (unsigned long long)m->kv_compact_rev + 1,
                         (unsigned long long)m->kv_rev + 1);
    /* The history holds exactly revisions kv_compact_rev+1 .. kv_rev. */
    uint64_t next = from > m->kv_rev ? from : m->kv_rev + 1;
    for (uint64_t i = from - m->kv_compact_rev - 1; i < m->hist_n; i++) {
        const kv_event *e = hist_at(m, (size_t)i);
        if (!meta_prefix(e->key, prefix, plen))
            continue;
        if (*n == max) {
            next = e->rev;
            break;
        }
        ev[(*n)++] = (fr_kv_event){ e->rev, e->type, e->key, e->val, e->len };
    }
    *next_rev = next;
    return 0;
}

/* ---- snapshot ---------------------------------------------------------------- */

static int cmp_kv(const void *a, const void *b)
{
    return strcmp((*(kv_entry *const *)a)->key, (*(kv_entry *const *)b)->key);
}

int meta_kv_snapshot(fr_meta *m, snap_out *o)
{
    size_t pos = 0, n = 0;
    kv_entry *e;
    int rc;
    if (meta_scratch(m, m->kv.n) < 0)
        return FERRY_ENOMEM;
    while ((e = fr_smap_next(&m->kv, &pos)) != NULL)
        m->scratch[n++] = e;
    fr_sort(m->scratch, n, sizeof(void *), cmp_kv);
    for (size_t i = 0; i < n; i++) {
        e = m->scratch[i];
        fr_rec r = { .type = FR_REC_SNAP_KV, .key = meta_span(e->key),
                     .val = { (const char *)e->val, (uint32_t)e->len }, .rev = e->mod_rev,
                     .rev2 = e->create_rev, .version = e->version };
        if ((rc = snap_emit(o, &r)) < 0)
            return rc;
    }
    for (size_t i = 0; i < m->hist_n; i++) {
        const kv_event *ev = hist_at(m, i);
        fr_rec r = { .type = FR_REC_SNAP_KV_EVENT, .rev = ev->rev, .state = ev->type,
                     .key = meta_span(ev->key), .val = { (const char *)ev->val, (uint32_t)ev->len } };
        if ((rc = snap_emit(o, &r)) < 0)
            return rc;
    }
    return 0;
}
