/* What the master knows about its peers' liveness, kept beside the logged
 * state: which segments are unreachable, which client started each pending
 * put and holds each queue lease. None of it is logged: after a restart
 * every segment waits for its node to re-attach (the master marks them),
 * and leases and pending puts fall back to their own timeouts. */
#include "store/meta_int.h"

int fr_meta_seg_set_reachable(fr_meta *m, uint64_t seg_id, uint64_t since_ms)
{
    meta_seg *s = fr_umap_get(&m->segs, seg_id);
    if (s == NULL)
        return FERRY_ENOENT;
    s->unreachable_since = since_ms;
    return 0;
}

void fr_meta_set_writer(fr_meta *m, const char *key, uint64_t client)
{
    meta_obj *o = meta_obj_find(m, key);
    if (o != NULL && o->state == FR_OBJ_PENDING)
        o->writer = client;
}

void fr_meta_set_holder(fr_meta *m, uint64_t rec_id, uint32_t token, uint64_t client)
{
    qrec *r = fr_umap_get(&m->qrecs, rec_id);
    if (r != NULL && r->state == QREC_LEASED && r->deliveries == token)
        r->holder = client;
}

/* Keys of the client's pending puts, collected first: a revoke changes the
 * pending list being walked. */
static int revoke_writer(fr_meta *m, uint64_t client, uint64_t now, uint64_t *count)
{
    size_t n = 0;
    for (fr_dnode *d = m->pending.next; d != &m->pending; d = d->next)
        n += fr_container_of(d, meta_obj, pending)->writer == client;
    if (n == 0)
        return 0;
    if (meta_scratch(m, n) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    n = 0;
    for (fr_dnode *d = m->pending.next; d != &m->pending; d = d->next) {
        meta_obj *o = fr_container_of(d, meta_obj, pending);
        if (o->writer == client)
            m->scratch[n++] = o->key;
    }
    fr_sort(m->scratch, n, sizeof(void *), meta_cmp_str);
    for (size_t i = 0; i < n; i++) {
        int rc = fr_meta_put_revoke(m, m->scratch[i], now);
        if (rc == FERRY_EIO)
            return rc;
        *count += rc == 0;
    }
    return 0;
}

static int return_holder(fr_meta *m, uint64_t client, uint64_t *count)
{
    size_t n = 0, pos = 0;
    qrec *r;
    while ((r = fr_umap_next(&m->qrecs, &pos)) != NULL)
        n += r->state == QREC_LEASED && r->holder == client;
    if (n == 0)
        return 0;
    if (meta_scratch(m, n) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    n = 0;
    pos = 0;
    while ((r = fr_umap_next(&m->qrecs, &pos)) != NULL)
        if (r->state == QREC_LEASED && r->holder == client)
            m->scratch[n++] = r;
    for (size_t i = 0; i < n; i++) {
        qrec *q = m->scratch[i];
        int rc = fr_meta_queue_nack(m, q->id, q->deliveries);
        if (rc == FERRY_EIO)
            return rc;
        *count += rc == 0;
    }
    return 0;
}

int fr_meta_release_client(fr_meta *m, uint64_t client, uint64_t now_ms, uint64_t *revoked,
                           uint64_t *returned)
{
    uint64_t rv = 0, rt = 0;
    int rc = client == 0 ? 0 : revoke_writer(m, client, meta_now(m, now_ms), &rv);
    if (rc == 0 && client != 0)
        rc = return_holder(m, client, &rt);
    if (revoked != NULL)
        *revoked = rv;
    if (returned != NULL)
        *returned = rt;
    return rc;
}
