/* Store client: KV, watch, barriers, queues, status (store.h). */
#include <errno.h>
#include <string.h>

#include "store/client_int.h"

static int check_value(const char *what, const void *val, size_t len, ferry_error *err)
{
    if (len > FERRY_STORE_VALUE_MAX)
        return fr_fail(err, FERRY_EMSGSIZE, "%s: %zu bytes, the limit is %u", what, len,
                             FERRY_STORE_VALUE_MAX);
    if (len && !val)
        return fr_fail(err, FERRY_EINVAL, "%s: no value", what);
    return 0;
}

static fr_sbytes bytes_of(const void *p, size_t n)
{
    return (fr_sbytes){ .p = n ? p : NULL, .n = (uint32_t)n };
}

static void *dup_bytes(const fr_sbytes *b)
{
    uint8_t *p = fr_malloc(b->n + 1u);
    if (p) {
        if (b->n)
            memcpy(p, b->p, b->n);
        p[b->n] = 0;   /* handy for text values */
    }
    return p;
}

int ferry_kv_get(ferry_store *s, const char *key, ferry_kv_value *out, ferry_error *err)
{
    int rc = fr_client_key(key, err);
    if (rc < 0 || !s || !out)
        return rc < 0 ? rc : FERRY_EINVAL;
    fr_smsg q = {.type = FR_SMSG_KV_GET, .key = fr_client_str(key)}, rep;
    uint8_t *b = NULL;
    rc = fr_client_rpc(s, &q, FR_SMSG_KV_VALUE, &rep, &b, err);
    if (rc == 0) {
        out->val = dup_bytes(&rep.val);
        out->len = rep.val.n;
        out->mod_rev = rep.rev;
        out->create_rev = rep.create_rev;
        out->version = rep.version;
        if (!out->val)
            rc = FERRY_ENOMEM;
    }
    fr_free(b);
    return rc;
}

static int kv_value_of(void *ctx, size_t i, const fr_smsg *rep, ferry_error *err)
{
    ferry_kv_value *v = &((ferry_kv_value *)ctx)[i];
    v->val = dup_bytes(&rep->val);
    v->len = rep->val.n;
    v->mod_rev = rep->rev;
    v->create_rev = rep->create_rev;
    v->version = rep->version;
    return v->val ? 0 : fr_fail(err, FERRY_ENOMEM, "kv_batch_get: out of memory");
}

int ferry_kv_batch_get(ferry_store *s, const char *const *keys, size_t n, ferry_kv_value *out,
                       int *results, ferry_error *err)
{
    if (!s || (n && (!keys || !out || !results)))
        return fr_fail(err, FERRY_EINVAL, "kv_batch_get: bad arguments");
    for (size_t i = 0; i < n; i++)
        memset(&out[i], 0, sizeof out[i]);
    return fr_client_key_rpcs(s, keys, n, FR_SMSG_KV_GET, FR_SMSG_KV_VALUE, kv_value_of, out,
                              results, err);
}

static int kv_change(ferry_store *s, uint16_t type, const char *key, uint64_t expected,
                     const void *val, size_t len, uint64_t *rev, ferry_error *err)
{
    int rc = fr_client_key(key, err);
    if (rc == 0)
        rc = check_value(type == FR_SMSG_KV_CAS ? "kv_cas" : "kv_put", val, len, err);
    if (rc < 0 || !s)
        return rc < 0 ? rc : FERRY_EINVAL;
    fr_smsg q = {.type = type, .key = fr_client_str(key), .rev = expected,
                 .val = bytes_of(val, len)}, rep;
    uint8_t *b = NULL;
    rc = fr_client_rpc(s, &q, FR_SMSG_REVISION, &rep, &b, err);
    if (rev && rc == 0)
        *rev = rep.rev;
    else if (rev && rc == FERRY_ESTATE && rep.type == FR_SMSG_ERROR)
        *rev = rep.rev;   /* a conflict: the key's current revision */
    fr_free(b);
    return rc;
}

int ferry_kv_put(ferry_store *s, const char *key, const void *val, size_t len, uint64_t *rev, ferry_error *err)
{
    return kv_change(s, FR_SMSG_KV_PUT, key, 0, val, len, rev, err);
}

int ferry_kv_cas(ferry_store *s, const char *key, uint64_t expected, const void *val,
                 size_t len, uint64_t *rev, ferry_error *err)
{
    return kv_change(s, FR_SMSG_KV_CAS, key, expected, val, len, rev, err);
}

int ferry_kv_delete(ferry_store *s, const char *key, uint64_t expected, uint64_t *rev, ferry_error *err)
{
    return kv_change(s, FR_SMSG_KV_DELETE, key, expected, NULL, 0, rev, err);
}

/* ---- watch --------------------------------------------------------------------------- */

typedef struct wev { struct wev *next; ferry_kv_event ev; } wev;

struct ferry_watch {
    ferry_store *s;
    char *prefix;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t req_id;      /* of the WATCH now active */
    uint64_t want;        /* the next revision not yet queued */
    bool lost;            /* the connection dropped: subscribe again */
    wev *head, *tail;
    wev *cur;             /* handed out by the last ferry_watch_next */
};

static void wev_free(wev *e)
{
    if (!e)
        return;
    fr_free(e->ev.key);
    fr_free(e->ev.val);
    fr_free(e);
}

/* Queue the events of an EVENTS message (lock held). front: they are older
 * than anything queued (the reply to WATCH, which can be overtaken by a
 * push handled on the receiver thread). */
static void queue_events(ferry_watch *w, const fr_smsg *m, bool front)
{
    wev *first = NULL, *last = NULL;
    size_t pos = 0;
    fr_smsg_item it;
    while (fr_smsg_item_next(m, &pos, &it)) {
        if (it.id < w->want && !front)
            continue;   /* already seen before a resubscription */
        wev *e = fr_calloc(1, sizeof *e);
        if (!e)
            break;
        e->ev.rev = it.id;
        e->ev.deleted = it.deleted;
        e->ev.key = dup_bytes(&it.key);
        e->ev.val = it.deleted ? NULL : dup_bytes(&it.val);
        e->ev.len = it.deleted ? 0 : it.val.n;
        if (!e->ev.key || (!it.deleted && !e->ev.val)) {
            wev_free(e);
            break;
        }
        if (last)
            last->next = e;
        else
            first = e;
        last = e;
    }
    if (first) {
        if (front) {
            last->next = w->head;
            w->head = first;
            if (!w->tail)
                w->tail = last;
        } else {
            if (w->tail)
                w->tail->next = first;
            else
                w->head = first;
            w->tail = last;
        }
    }
    for (wev *e = w->head; e; e = e->next)
        if (e->ev.rev + 1 > w->want)
            w->want = e->ev.rev + 1;
    if (m->rev > w->want)
        w->want = m->rev;
    pthread_cond_broadcast(&w->cond);
}

void fr_client_watch_push(void *ctx, uint64_t req_id, const fr_smsg *m)
{
    ferry_store *s = ctx;
    if (m->type != FR_SMSG_EVENTS)
        return;   /* heartbeat replies, late replies of timed-out calls */
    pthread_mutex_lock(&s->lock);
    ferry_watch *w = fr_umap_get(&s->watches, req_id);
    if (w) {
        pthread_mutex_lock(&w->lock);
        queue_events(w, m, false);
        pthread_mutex_unlock(&w->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

void fr_client_watch_lost(void *ctx)
{
    ferry_store *s = ctx;
    pthread_mutex_lock(&s->lock);
    size_t pos = 0;
    ferry_watch *w;
    while ((w = fr_umap_next(&s->watches, &pos))) {
        pthread_mutex_lock(&w->lock);
        w->lost = true;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

/* Send WATCH from w->want under a fresh req_id and queue its backlog. */
static int subscribe(ferry_watch *w, uint64_t from, ferry_error *err)
{
    ferry_store *s = w->s;
    uint64_t id = fr_mconn_reserve_id(s->mc);
    pthread_mutex_lock(&s->lock);
    if (w->req_id)
        (void)fr_umap_del(&s->watches, w->req_id);
    w->req_id = 0;
    int rc = fr_umap_put(&s->watches, id, w);
    if (rc == 0)
        w->req_id = id;
    pthread_mutex_unlock(&s->lock);
    if (rc < 0)
        return rc;
    fr_smsg q = {.type = FR_SMSG_WATCH, .key = fr_client_str(w->prefix), .rev = from}, rep;
    uint8_t *b = NULL;
    int st = 0;
    rc = fr_mconn_call(s->mc, &q, 1, &id, &rep, &b, s->cfg.timeout_ms);
    if (rc == 0 && rep.type == FR_SMSG_ERROR) {
        char text[FR_SMSG_TEXT_MAX + 1];
        size_t n = rep.val.n;
        memcpy(text, rep.val.p ? (const void *)rep.val.p : "", n);
        text[n] = 0;
        st = fr_fail(err, rep.status, "watching the keys under '%s': %s", w->prefix, text);
    } else if (rc == 0 && rep.type != FR_SMSG_EVENTS) {
        st = fr_fail(err, FERRY_EPROTO, "watch: unexpected reply");
    } else if (rc < 0) {
        st = fr_fail(err, rc, "watching the keys under '%s': %s", w->prefix, ferry_strerror(rc));
    }
    if (st == 0) {
        pthread_mutex_lock(&w->lock);
        w->lost = false;
        queue_events(w, &rep, true);
        pthread_mutex_unlock(&w->lock);
    }
    fr_free(b);
    return st;
}

int ferry_kv_watch(ferry_store *s, const char *prefix, uint64_t from_rev, ferry_watch **out, ferry_error *err)
{
    if (!s || !out || (prefix && strlen(prefix) > FERRY_STORE_KEY_MAX))
        return fr_fail(err, FERRY_EINVAL, "watch: bad arguments");
    ferry_watch *w = fr_calloc(1, sizeof *w);
    if (!w || !(w->prefix = fr_strdup(prefix ? prefix : ""))) {
        fr_free(w);
        return FERRY_ENOMEM;
    }
    w->s = s;
    pthread_mutex_init(&w->lock, NULL);
    fr_cond_init_monotonic(&w->cond);
    w->want = from_rev;
    int rc = subscribe(w, from_rev, err);
    if (rc < 0) {
        ferry_watch_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

int ferry_watch_next(ferry_watch *w, int timeout_ms, ferry_kv_event *ev, ferry_error *err)
{
    if (!w || !ev)
        return FERRY_EINVAL;
    uint64_t deadline = fr_deadline_ns(timeout_ms);
    pthread_mutex_lock(&w->lock);
    wev_free(w->cur);
    w->cur = NULL;
    for (;;) {
        if (w->head) {
            w->cur = w->head;
            w->head = w->head->next;
            if (!w->head)
                w->tail = NULL;
            *ev = w->cur->ev;
            pthread_mutex_unlock(&w->lock);
            return 0;
        }
        if (w->lost) {
            uint64_t from = w->want ? w->want : 0;
            pthread_mutex_unlock(&w->lock);
            int rc = subscribe(w, from, err);
            if (rc == FERRY_ERANGE || rc == FERRY_EINVAL)
                return rc;
            pthread_mutex_lock(&w->lock);
            if (rc < 0 && fr_now_ns() >= deadline) {
                pthread_mutex_unlock(&w->lock);
                return rc;
            }
            continue;
        }
        if (deadline == UINT64_MAX) {
            pthread_cond_wait(&w->cond, &w->lock);
            continue;
        }
        struct timespec ts = fr_timespec_at(deadline);
        if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT && !w->head &&
            !w->lost) {
            pthread_mutex_unlock(&w->lock);
            return FERRY_ETIMEDOUT;
        }
    }
}

void ferry_watch_close(ferry_watch *w)
{
    if (!w)
        return;
    ferry_store *s = w->s;
    pthread_mutex_lock(&s->lock);
    uint64_t id = w->req_id;
    if (id)
        (void)fr_umap_del(&s->watches, id);
    pthread_mutex_unlock(&s->lock);
    if (id) {
        fr_smsg q = {.type = FR_SMSG_UNWATCH, .id = id};
        (void)fr_mconn_send(s->mc, &q, fr_mconn_reserve_id(s->mc), 0);
    }
    wev_free(w->cur);
    while (w->head) {
        wev *e = w->head;
        w->head = e->next;
        wev_free(e);
    }
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    fr_free(w->prefix);
    fr_free(w);
}

/* ---- barrier ---------------------------------------------------------------------------- */

int ferry_barrier(ferry_store *s, const char *name, const char *member, uint32_t count,
                  uint64_t timeout_ms, uint64_t *generation, ferry_error *err)
{
    int rc = fr_client_key(name, err);
    if (rc == 0)
        rc = fr_client_key(member, err);
    if (rc < 0 || !s || count == 0)
        return rc < 0 ? rc : fr_fail(err, FERRY_EINVAL, "barrier: count must be >= 1");
    fr_smsg q = {.type = FR_SMSG_BARRIER, .key = fr_client_str(name),
                 .key2 = fr_client_str(member), .members = count, .timeout_ms = timeout_ms},
            rep;
    uint8_t *b = NULL;
    /* The master answers when the barrier releases or times out: wait for
     * that, plus the usual call timeout for the round trip. */
    int wait = timeout_ms == 0 || timeout_ms > INT32_MAX / 2
                   ? -1 : (int)timeout_ms + s->cfg.timeout_ms;
    rc = fr_mconn_call(s->mc, &q, 1, NULL, &rep, &b, wait);
    if (rc < 0)
        rc = fr_fail(err, rc, "barrier '%s': %s", name, ferry_strerror(rc));
    else if (rep.type == FR_SMSG_ERROR)
        rc = fr_fail(err, rep.status, "barrier '%s': %.*s", name, (int)rep.val.n,
                           rep.val.p ? (const char *)rep.val.p : "");
    else if (rep.type != FR_SMSG_BARRIER_DONE)
        rc = fr_fail(err, FERRY_EPROTO, "barrier: unexpected reply");
    else if (generation)
        *generation = rep.generation;
    fr_free(b);
    return rc;
}

/* ---- queues ------------------------------------------------------------------------------ */

int ferry_queue_push(ferry_store *s, const char *queue, const void *data, size_t len,
                     uint64_t *id, ferry_error *err)
{
    int rc = fr_client_key(queue, err);
    if (rc == 0)
        rc = check_value("queue_push", data, len, err);
    if (rc < 0 || !s)
        return rc < 0 ? rc : FERRY_EINVAL;
    fr_smsg q = {.type = FR_SMSG_Q_PUSH, .key = fr_client_str(queue), .val = bytes_of(data, len)},
            rep;
    uint8_t *b = NULL;
    rc = fr_client_rpc(s, &q, FR_SMSG_PUSHED, &rep, &b, err);
    if (rc == 0 && id)
        *id = rep.id;
    fr_free(b);
    return rc;
}

/* One cap on a pop everywhere: the public one, the wire's and the log's. */
_Static_assert(FERRY_STORE_POP_MAX == FR_SMSG_POP_MAX && FR_SMSG_POP_MAX == FR_POP_MAX,
               "the pop caps of store.h, the wire and the log differ");

int ferry_queue_pop(ferry_store *s, const char *queue, uint32_t max, uint64_t lease_ms,
                    ferry_qrecord *out, size_t *n, ferry_error *err)
{
    int rc = fr_client_key(queue, err);
    if (rc < 0 || !s || !out || !n)
        return rc < 0 ? rc : fr_fail(err, FERRY_EINVAL, "queue_pop: bad arguments");
    if (max == 0 || max > FERRY_STORE_POP_MAX)
        return fr_fail(err, FERRY_EINVAL, "queue_pop: max %u is not in 1..%u", max,
                             FERRY_STORE_POP_MAX);
    if (lease_ms == 0 || lease_ms > FERRY_STORE_LEASE_MAX_MS)
        return fr_fail(err, FERRY_EINVAL, "queue_pop: a lease of %llu ms is not in 1..%u ms "
                             "(an hour at most)", (unsigned long long)lease_ms,
                             FERRY_STORE_LEASE_MAX_MS);
    fr_smsg q = {.type = FR_SMSG_Q_POP, .key = fr_client_str(queue), .limit = max,
                 .lease_ms = lease_ms}, rep;
    uint8_t *b = NULL;
    *n = 0;
    rc = fr_client_rpc(s, &q, FR_SMSG_RECORDS, &rep, &b, err);
    size_t pos = 0, k = 0;
    fr_smsg_item it;
    while (rc == 0 && k < max && fr_smsg_item_next(&rep, &pos, &it)) {
        void *d = dup_bytes(&it.val);
        if (!d) {
            rc = FERRY_ENOMEM;   /* the records stay leased: they come back */
            break;
        }
        out[k++] = (ferry_qrecord){ .id = it.id, .token = it.deliveries, .data = d,
                                    .len = it.val.n };
    }
    if (rc < 0) {
        ferry_qrecords_free(out, k);
        k = 0;
    }
    *n = k;
    fr_free(b);
    return rc;
}

void ferry_qrecords_free(ferry_qrecord *recs, size_t n)
{
    for (size_t i = 0; recs && i < n; i++) {
        fr_free(recs[i].data);
        recs[i].data = NULL;
    }
}

static int q_settle(ferry_store *s, uint16_t type, uint64_t id, uint32_t token, ferry_error *err)
{
    if (!s)
        return FERRY_EINVAL;
    fr_smsg q = {.type = type, .id = id, .deliveries = token}, rep;
    uint8_t *b = NULL;
    int rc = fr_client_rpc(s, &q, FR_SMSG_OK, &rep, &b, err);
    fr_free(b);
    return rc;
}

int ferry_queue_config(ferry_store *s, const char *queue, uint64_t bound, ferry_error *err)
{
    int rc = fr_client_key(queue, err);
    if (rc < 0 || !s)
        return rc < 0 ? rc : FERRY_EINVAL;
    fr_smsg q = {.type = FR_SMSG_Q_CONFIG, .key = fr_client_str(queue), .size = bound}, rep;
    uint8_t *b = NULL;
    rc = fr_client_rpc(s, &q, FR_SMSG_OK, &rep, &b, err);
    fr_free(b);
    return rc;
}

int ferry_queue_ack(ferry_store *s, uint64_t id, uint32_t token, ferry_error *err)
{
    return q_settle(s, FR_SMSG_Q_ACK, id, token, err);
}

int ferry_queue_nack(ferry_store *s, uint64_t id, uint32_t token, ferry_error *err)
{
    return q_settle(s, FR_SMSG_Q_NACK, id, token, err);
}

int ferry_store_status_json(ferry_store *s, char **json, ferry_error *err)
{
    if (!s || !json)
        return FERRY_EINVAL;
    fr_smsg q = {.type = FR_SMSG_STATUS}, rep;
    uint8_t *b = NULL;
    int rc = fr_client_rpc(s, &q, FR_SMSG_STATUS_TEXT, &rep, &b, err);
    if (rc == 0) {
        *json = dup_bytes(&rep.val);
        if (!*json)
            rc = FERRY_ENOMEM;
    }
    fr_free(b);
    return rc;
}

int ferry_kv_batch_delete(ferry_store *s, const char *const *keys, size_t n, int *results,
                          ferry_error *err)
{
    return fr_client_key_rpcs(s, keys, n, FR_SMSG_KV_DELETE, FR_SMSG_REVISION, NULL, NULL, results,
                              err);
}
