/* Leased queues: records are READY (FIFO) or LEASED until an ack (gone), a
 * nack or the lease's end at a tick (READY again, at the tail). Every
 * record is accounted for in one of the two states until it is acked:
 * nothing is dropped. */
#include <stdlib.h>
#include <string.h>

#include "ferry/store.h"
#include "store/meta_int.h"

int meta_qlease_cmp(const fr_avl_node *a, const fr_avl_node *b)
{
    const qrec *x = fr_container_of(a, qrec, by_lease), *y = fr_container_of(b, qrec, by_lease);
    if (x->until != y->until)
        return x->until < y->until ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static queue *q_find(const fr_meta *m, const char *name)
{
    return fr_smap_get(&m->queues, name, fr_smap_hash(name));
}

static int q_create(fr_meta *m, const char *name, queue **out)
{
    size_t len = strlen(name);
    queue *q = fr_calloc(1, sizeof(*q) + len + 1);
    if (q == NULL || fr_smap_reserve(&m->queues, 1) < 0) {
        fr_free(q);
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    }
    q->name = (char *)(q + 1);
    memcpy(q->name, name, len + 1);
    q->hash = fr_smap_hash(q->name);
    fr_dlist_init(&q->ready);
    fr_smap_put(&m->queues, q->name, q->hash, q);
    *out = q;
    return 0;
}

static void make_ready(qrec *r)
{
    r->state = QREC_READY;
    r->until = 0;
    fr_dlist_push_back(&r->q->ready, &r->link);
    r->q->nready++;
}

static void make_leased(fr_meta *m, qrec *r, uint64_t until)
{
    r->state = QREC_LEASED;
    r->until = until;
    fr_avl_insert(&m->qleases, &r->by_lease);
    r->q->nleased++;
}

/* Take r out of whichever state it is in. */
static void detach(fr_meta *m, qrec *r)
{
    if (r->state == QREC_READY) {
        fr_dlist_remove(&r->link);
        r->q->nready--;
    } else {
        fr_avl_remove(&m->qleases, &r->by_lease);
        r->q->nleased--;
    }
}

/* A new record in q (READY or LEASED as given). */
static int qrec_add(fr_meta *m, queue *q, uint64_t id, fr_span data, uint32_t state,
                    uint32_t deliveries, uint64_t until)
{
    qrec *r = fr_calloc(1, sizeof(*r) + data.n);
    if (r == NULL || fr_umap_reserve(&m->qrecs, 1) < 0) {
        fr_free(r);
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    }
    r->id = id;
    r->q = q;
    r->deliveries = deliveries;
    r->len = data.n;
    if (data.n != 0)
        memcpy(r->data, data.p, data.n);
    fr_dlist_init(&r->link);
    if (state == QREC_READY)
        make_ready(r);
    else
        make_leased(m, r, until);
    fr_umap_put(&m->qrecs, id, r);
    return 0;
}

static int push_apply(fr_meta *m, const fr_rec *r)
{
    char name[FR_KEY_MAX + 1];
    queue *q;
    meta_cstr(name, r->key);
    bool fresh = (q = q_find(m, name)) == NULL;
    int rc;
    if (fresh && (rc = q_create(m, name, &q)) < 0)
        return rc;
    if ((rc = qrec_add(m, q, m->q_next_id, r->val, QREC_READY, 0, 0)) < 0) {
        if (fresh) {
            fr_smap_del(&m->queues, q->name, q->hash);
            fr_free(q);
        }
        return rc;
    }
    m->q_next_id++;
    return 0;
}

static int pop_apply(fr_meta *m, const fr_rec *r)
{
    uint32_t i;
    int rc = 0;
    qrec *x;
    /* Check every id first (ready, listed once), so a bad record changes
     * nothing. */
    for (i = 0; i < r->nids; i++) {
        x = fr_umap_get(&m->qrecs, fr_rec_id(r, i));
        if (x == NULL || x->state != QREC_READY || x->mark) {
            rc = meta_fail(m, FERRY_ESTATE, "record %llu is not ready to pop",
                           (unsigned long long)fr_rec_id(r, i));
            break;
        }
        x->mark = true;
    }
    for (uint32_t k = 0; k < i; k++)
        ((qrec *)fr_umap_get(&m->qrecs, fr_rec_id(r, k)))->mark = false;
    if (rc < 0)
        return rc;
    for (i = 0; i < r->nids; i++) {
        x = fr_umap_get(&m->qrecs, fr_rec_id(r, i));
        detach(m, x);
        if (x->deliveries < UINT32_MAX)
            x->deliveries++;
        make_leased(m, x, r->until);
    }
    return 0;
}

static int snap_qrec_apply(fr_meta *m, const fr_rec *r)
{
    char name[FR_KEY_MAX + 1];
    meta_cstr(name, r->key);
    queue *q = q_find(m, name);
    if (q == NULL || r->id == 0 || r->id >= m->q_next_id || fr_umap_get(&m->qrecs, r->id) != NULL ||
        (r->state != QREC_READY && r->state != QREC_LEASED) ||
        (r->state == QREC_READY && r->until != 0) || (r->state == QREC_LEASED && r->count == 0))
        return meta_fail(m, FERRY_EINVAL, "queue record %llu out of place", (unsigned long long)r->id);
    return qrec_add(m, q, r->id, r->val, (uint32_t)r->state, (uint32_t)r->count, r->until);
}

int meta_queue_apply(fr_meta *m, const fr_rec *r)
{
    char name[FR_KEY_MAX + 1];
    queue *q;
    qrec *x;
    int rc;
    switch (r->type) {
    case FR_REC_Q_CONFIG:
    case FR_REC_SNAP_QUEUE:
        meta_cstr(name, r->key);
        q = q_find(m, name);
        if (q != NULL && r->type == FR_REC_SNAP_QUEUE)
            return meta_fail(m, FERRY_EEXIST, "queue '%s' twice", name);
        if (q == NULL && (rc = q_create(m, name, &q)) < 0)
            return rc;
        q->bound = r->bound;
        return 0;
    case FR_REC_Q_PUSH:
        return push_apply(m, r);
    case FR_REC_Q_POP:
        return pop_apply(m, r);
    case FR_REC_SNAP_QREC:
        return snap_qrec_apply(m, r);
    case FR_REC_Q_EXPIRE:
        meta_now(m, r->time);
        for (fr_avl_node *n; (n = fr_avl_first(&m->qleases)) != NULL;) {
            x = fr_container_of(n, qrec, by_lease);
            if (x->until > r->time)
                break;
            detach(m, x);
            make_ready(x);
        }
        return 0;
    default: /* Q_ACK, Q_NACK */
        x = fr_umap_get(&m->qrecs, r->id);
        if (x == NULL)
            return meta_fail(m, FERRY_ENOENT, "no queue record %llu", (unsigned long long)r->id);
        if (r->type == FR_REC_Q_NACK) {
            if (x->state != QREC_LEASED)
                return meta_fail(m, FERRY_ESTATE, "queue record %llu is not leased",
                                 (unsigned long long)r->id);
            detach(m, x);
            make_ready(x);
            return 0;
        }
        detach(m, x);
        fr_umap_del(&m->qrecs, x->id);
        fr_free(x);
        return 0;
    }
}

void meta_queue_free_all(fr_meta *m)
{
    size_t pos = 0;
    void *p;
    while ((p = fr_umap_next(&m->qrecs, &pos)) != NULL)
        fr_free(p);
    fr_umap_fini(&m->qrecs);
    pos = 0;
    while ((p = fr_smap_next(&m->queues, &pos)) != NULL)
        fr_free(p);
    fr_smap_fini(&m->queues);
}

/* ---- commands -------------------------------------------------------------- */

int fr_meta_queue_config(fr_meta *m, const char *queue_name, uint64_t bound)
{
    int rc = meta_check_name(m, "queue name", queue_name);
    if (rc < 0)
        return rc;
    fr_rec r = { .type = FR_REC_Q_CONFIG, .key = meta_span(queue_name), .bound = bound };
    return meta_commit(m, &r);
}

int fr_meta_queue_push(fr_meta *m, const char *queue_name, const void *data, size_t len, uint64_t *id)
{
    int rc = meta_check_name(m, "queue name", queue_name);
    if (rc < 0)
        return rc;
    if (len > FR_VALUE_MAX || (data == NULL && len != 0))
        return meta_fail(m, FERRY_EINVAL, "record of %zu bytes (at most %u)", len, FR_VALUE_MAX);
    const queue *q = q_find(m, queue_name);
    if (q != NULL && q->bound != 0 && q->nready + q->nleased >= q->bound)
        return meta_fail(m, FERRY_EAGAIN,
                         "queue '%s' is full: %llu records outstanding (bound %llu); "
                         "consumers must ack some first",
                         queue_name, (unsigned long long)(q->nready + q->nleased),
                         (unsigned long long)q->bound);
    fr_rec r = { .type = FR_REC_Q_PUSH, .key = meta_span(queue_name),
                 .val = { (const char *)data, (uint32_t)len } };
    if ((rc = meta_commit(m, &r)) == 0 && id != NULL)
        *id = m->q_next_id - 1;
    return rc;
}

int fr_meta_queue_pop(fr_meta *m, const char *queue_name, uint32_t n, uint64_t lease_ms,
                      uint64_t now_ms, fr_qrec_view *out, size_t *nout)
{
    int rc = meta_check_name(m, "queue name", queue_name);
    if (rc < 0)
        return rc;
    if (n == 0 || n > FR_POP_MAX || out == NULL || nout == NULL)
        return meta_fail(m, FERRY_EINVAL, "a pop takes 1 to %d records, not %u", FR_POP_MAX, n);
    if (lease_ms == 0 || lease_ms > FERRY_STORE_LEASE_MAX_MS)
        return meta_fail(m, FERRY_EINVAL, "a pop's lease of %llu ms is not in 1..%u ms (an hour "
                         "at most)", (unsigned long long)lease_ms, FERRY_STORE_LEASE_MAX_MS);
    uint64_t now = meta_now(m, now_ms), until;
    *nout = 0;
    queue *q = q_find(m, queue_name);
    if (q == NULL || q->nready == 0)
        return 0;
    if (fr_add_u64(now, lease_ms, &until) < 0)
        until = UINT64_MAX;
    size_t take = q->nready < n ? (size_t)q->nready : n;
    if (fr_grow((void **)&m->ids, &m->ids_cap, take, sizeof(uint64_t)) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    fr_dnode *d = q->ready.next;
    for (size_t i = 0; i < take; i++, d = d->next)
        m->ids[i] = fr_container_of(d, qrec, link)->id;
    fr_rec r = { .type = FR_REC_Q_POP, .until = until, .nids = (uint32_t)take, .ids = m->ids };
    if ((rc = meta_commit(m, &r)) < 0)
        return rc;
    for (size_t i = 0; i < take; i++) {
        const qrec *x = fr_umap_get(&m->qrecs, m->ids[i]);
        out[i] = (fr_qrec_view){ x->id, x->deliveries, x->until, x->data, x->len };
    }
    *nout = take;
    return 0;
}

static int check_token(fr_meta *m, const qrec *x, uint64_t id, uint32_t token)
{
    if (x == NULL)
        return meta_fail(m, FERRY_ENOENT, "queue record %llu does not exist (acked already?)",
                         (unsigned long long)id);
    if (token != 0 && token != x->deliveries)
        return meta_fail(m, FERRY_ESTALE,
                         "queue record %llu: your lease (delivery %u) lapsed and it was delivered "
                         "again (delivery %u)",
                         (unsigned long long)id, token, x->deliveries);
    return 0;
}

int fr_meta_queue_ack(fr_meta *m, uint64_t id, uint32_t token)
{
    int rc = check_token(m, fr_umap_get(&m->qrecs, id), id, token);
    if (rc < 0)
        return rc;
    fr_rec r = { .type = FR_REC_Q_ACK, .id = id };
    return meta_commit(m, &r);
}

int fr_meta_queue_nack(fr_meta *m, uint64_t id, uint32_t token)
{
    const qrec *x = fr_umap_get(&m->qrecs, id);
    int rc = check_token(m, x, id, token);
    if (rc < 0)
        return rc;
    if (x->state != QREC_LEASED)
        return meta_fail(m, FERRY_ESTATE, "queue record %llu is not leased (its lease lapsed)",
                         (unsigned long long)id);
    fr_rec r = { .type = FR_REC_Q_NACK, .id = id };
    return meta_commit(m, &r);
}

int fr_meta_queue_stats(const fr_meta *m, const char *queue_name, fr_queue_stats *out)
{
    if (queue_name == NULL || out == NULL)
        return FERRY_EINVAL;
    const queue *q = q_find(m, queue_name);
    if (q == NULL)
        return FERRY_ENOENT;
    *out = (fr_queue_stats){ q->nready, q->nleased, q->bound };
    return 0;
}

/* ---- time -------------------------------------------------------------------- */

static uint64_t lease_deadline(const fr_meta *m)
{
    fr_avl_node *n = fr_avl_first(&m->qleases);
    return n != NULL ? fr_container_of(n, qrec, by_lease)->until : UINT64_MAX;
}

int fr_meta_tick(fr_meta *m, uint64_t now_ms, fr_tick_result *out)
{
    fr_tick_result res = { 0, 0 };
    uint64_t now = meta_now(m, now_ms);
    int rc = 0;
    if (lease_deadline(m) <= now) {
        fr_avl_node *n = fr_avl_first(&m->qleases);
        for (; n != NULL && fr_container_of(n, qrec, by_lease)->until <= now;
             n = fr_avl_higher(&m->qleases, n))
            res.redelivered++;
        fr_rec r = { .type = FR_REC_Q_EXPIRE, .time = now };
        rc = meta_commit(m, &r);
    }
    if (rc == 0)
        rc = meta_obj_tick(m, now, &res.revoked);
    if (out != NULL)
        *out = res;
    return rc;
}

uint64_t fr_meta_next_deadline(const fr_meta *m)
{
    uint64_t a = lease_deadline(m), b = meta_obj_next_deadline(m);
    return a < b ? a : b;
}

/* ---- snapshot ---------------------------------------------------------------- */

static int cmp_q(const void *a, const void *b)
{
    return strcmp((*(queue *const *)a)->name, (*(queue *const *)b)->name);
}

static int cmp_leased(const void *a, const void *b)
{
    const qrec *x = *(qrec *const *)a, *y = *(qrec *const *)b;
    int c = strcmp(x->q->name, y->q->name);
    if (c != 0)
        return c;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int emit_qrec(snap_out *o, const qrec *x)
{
    fr_rec r = { .type = FR_REC_SNAP_QREC, .id = x->id, .key = meta_span(x->q->name),
                 .state = x->state, .count = x->deliveries, .until = x->until,
                 .val = { (const char *)x->data, (uint32_t)x->len } };
    return snap_emit(o, &r);
}

int meta_queue_snapshot(fr_meta *m, snap_out *o)
{
    size_t pos = 0, n = 0;
    queue *q;
    int rc;
    if (meta_scratch(m, m->queues.n > m->qleases.n ? m->queues.n : m->qleases.n) < 0)
        return FERRY_ENOMEM;
    while ((q = fr_smap_next(&m->queues, &pos)) != NULL)
        m->scratch[n++] = q;
    fr_sort(m->scratch, n, sizeof(void *), cmp_q);
    for (size_t i = 0; i < n; i++) {
        q = m->scratch[i];
        fr_rec r = { .type = FR_REC_SNAP_QUEUE, .key = meta_span(q->name), .bound = q->bound };
        if ((rc = snap_emit(o, &r)) < 0)
            return rc;
        for (fr_dnode *d = q->ready.next; d != &q->ready; d = d->next)
            if ((rc = emit_qrec(o, fr_container_of(d, qrec, link))) < 0)
                return rc;
    }
    n = 0;
    for (fr_avl_node *a = fr_avl_first(&m->qleases); a != NULL; a = fr_avl_higher(&m->qleases, a))
        m->scratch[n++] = fr_container_of(a, qrec, by_lease);
    fr_sort(m->scratch, n, sizeof(void *), cmp_leased);
    for (size_t i = 0; i < n; i++)
        if ((rc = emit_qrec(o, m->scratch[i])) < 0)
            return rc;
    return 0;
}
