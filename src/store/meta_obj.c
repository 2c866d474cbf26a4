/* Objects: the state and how records change it. The commands that decide
 * what to record (placement, eviction, leases) are in meta_place.c. */
#include <stdlib.h>
#include <string.h>

#include "store/meta_int.h"

static const char *state_name(uint32_t s)
{
    return s == FR_OBJ_PENDING ? "pending" : s == FR_OBJ_COMPLETE ? "complete" : "lost";
}

const char *meta_obj_state_name(uint32_t s)
{
    return state_name(s);
}

meta_obj *meta_obj_find(fr_meta *m, const char *key)
{
    if (m->last_obj != NULL && strcmp(m->last_obj->key, key) == 0)
        return m->last_obj;
    meta_obj *o = fr_smap_get(&m->objs, key, fr_smap_hash(key));
    if (o != NULL)
        m->last_obj = o;
    return o;
}

static bool soft(const meta_obj *o)
{
    return o->state == FR_OBJ_COMPLETE && !o->hard_pin;
}

static void lru_unlink(meta_rep *p)
{
    if (!fr_dlist_linked(&p->in_lru))
        return;
    fr_dlist_remove(&p->in_lru);
    p->seg->lru_bytes -= fr_segalloc_round(p->seg->alloc, p->obj->size);
}

static void lru_append(meta_rep *p)
{
    fr_dlist_push_back(&p->seg->lru, &p->in_lru);
    p->seg->lru_bytes += fr_segalloc_round(p->seg->alloc, p->obj->size);
}

/* Most recently used: a new stamp, and the replicas go to the tail of
 * their segments' LRU lists (soft objects only: the lists hold nothing
 * else, so eviction never walks past pinned or pending objects). */
static void touch(fr_meta *m, meta_obj *o)
{
    o->touch_seq = ++m->touch_seq;
    if (!soft(o))
        return;
    for (uint32_t i = 0; i < o->nslots; i++) {
        meta_rep *p = &o->rep[i];
        if (p->seg == NULL)
            continue;
        lru_unlink(p);
        lru_append(p);
    }
}

/* The counts of objects by state (metrics): d = -1 before o changes state
 * or goes, +1 after it got one. */
static void obj_count(fr_meta *m, const meta_obj *o, int d)
{
    m->nobj[o->state & 3] += (uint64_t)(int64_t)d;
    if (o->state == FR_OBJ_COMPLETE)
        m->complete_bytes += (uint64_t)(int64_t)d * o->size;
}

static void obj_free(fr_meta *m, meta_obj *o)
{
    obj_count(m, o, -1);
    for (uint32_t i = 0; i < o->nslots; i++) {
        meta_rep *p = &o->rep[i];
        if (p->seg == NULL)
            continue;
        int rc = fr_segalloc_release(p->seg->alloc, p->off, o->size);
        (void)rc;   /* cannot fail: the range was reserved by this object */
        meta_slot_freed(m, o->slot, p->seg->id, p->off, fr_segalloc_round(p->seg->alloc, o->size));
        fr_dlist_remove(&p->in_seg);
        lru_unlink(p);
        p->seg->nreps--;
    }
    if (fr_dlist_linked(&o->pending))
        fr_dlist_remove(&o->pending);
    fr_smap_del(&m->objs, o->key, o->hash);
    if (m->last_obj == o)
        m->last_obj = NULL;
    fr_free(o);
}

/* Create an object holding replicas reps[] (reserved now). Not linked into
 * the pending or LRU lists. */
static int obj_create(fr_meta *m, fr_span key, uint64_t size, const fr_rec_rep *reps,
                      uint32_t nrep, meta_obj **out)
{
    char k[FR_KEY_MAX + 1];
    meta_seg *segs[FR_MAX_REPLICAS];
    meta_cstr(k, key);
    uint64_t h = fr_smap_hash(k);
    if (fr_smap_get(&m->objs, k, h) != NULL)
        return meta_fail(m, FERRY_EEXIST, "object '%s' already exists", k);
    if (size > FR_OBJ_SIZE_MAX)
        return meta_fail(m, FERRY_EINVAL, "object '%s': size %llu is too large", k,
                         (unsigned long long)size);
    for (uint32_t i = 0; i < nrep; i++) {
        segs[i] = fr_umap_get(&m->segs, reps[i].seg);
        if (segs[i] == NULL)
            return meta_fail(m, FERRY_ENOENT, "object '%s': segment %016llx is not mounted", k,
                             (unsigned long long)reps[i].seg);
        for (uint32_t j = 0; j < i; j++)
            if (segs[j] == segs[i])
                return meta_fail(m, FERRY_EINVAL, "object '%s': two replicas on segment %016llx",
                                 k, (unsigned long long)reps[i].seg);
    }
    meta_obj *o = fr_calloc(1, sizeof(*o) + nrep * sizeof(meta_rep) + key.n + 1);
    if (o == NULL || fr_smap_reserve(&m->objs, 1) < 0) {
        fr_free(o);
        return meta_fail(m, FERRY_ENOMEM, "out of memory creating object '%s'", k);
    }
    for (uint32_t i = 0; i < nrep; i++) {
        if (fr_segalloc_reserve(segs[i]->alloc, reps[i].off, size) < 0) {
            meta_fail(m, FERRY_EINVAL, "object '%s': range at %llu on segment %016llx is not free",
                      k, (unsigned long long)reps[i].off, (unsigned long long)reps[i].seg);
            while (i-- > 0)
                fr_segalloc_release(segs[i]->alloc, reps[i].off, size);
            fr_free(o);
            return FERRY_EINVAL;
        }
    }
    o->key = (char *)&o->rep[nrep];
    memcpy(o->key, k, key.n + 1);
    o->hash = h;
    o->size = size;
    o->nslots = o->nlive = nrep;
    fr_dlist_init(&o->pending);
    for (uint32_t i = 0; i < nrep; i++) {
        meta_rep *p = &o->rep[i];
        p->seg = segs[i];
        p->off = reps[i].off;
        p->obj = o;
        fr_dlist_init(&p->in_lru);
        fr_dlist_push_back(&segs[i]->reps, &p->in_seg);
        segs[i]->nreps++;
    }
    fr_smap_put(&m->objs, o->key, h, o);
    m->last_obj = o;
    *out = o;
    return 0;
}

static int put_start_apply(fr_meta *m, const fr_rec *r)
{
    meta_obj *o;
    if (r->nrep == 0)
        return meta_fail(m, FERRY_EINVAL, "put with no replica");
    int rc = obj_create(m, r->key, r->size, r->rep, r->nrep, &o);
    if (rc < 0)
        return rc;
    o->state = FR_OBJ_PENDING;
    obj_count(m, o, 1);
    o->hard_pin = r->flag != 0;
    o->created = meta_now(m, r->time);
    o->touch_seq = ++m->touch_seq;
    fr_dlist_push_back(&m->pending, &o->pending);
    return 0;
}

static int snap_obj_apply(fr_meta *m, const fr_rec *r)
{
    meta_obj *o;
    if (r->state < FR_OBJ_PENDING || r->state > FR_OBJ_LOST ||
        (r->state == FR_OBJ_LOST) != (r->nrep == 0) || r->seq > m->touch_seq)
        return meta_fail(m, FERRY_EINVAL, "bad object state %llu with %u replicas",
                         (unsigned long long)r->state, r->nrep);
    int rc = obj_create(m, r->key, r->size, r->rep, r->nrep, &o);
    if (rc < 0)
        return rc;
    o->state = (uint32_t)r->state;
    obj_count(m, o, 1);
    o->hard_pin = r->flag != 0;
    o->lease_until = r->until;
    o->touch_seq = r->seq;
    o->created = r->time;
    o->lost_node = r->node;
    o->lost_at = r->time2;
    return 0;
}

int meta_obj_apply(fr_meta *m, const fr_rec *r)
{
    if (r->type == FR_REC_PUT_START)
        return put_start_apply(m, r);
    if (r->type == FR_REC_SNAP_OBJ)
        return snap_obj_apply(m, r);
    char k[FR_KEY_MAX + 1];
    meta_cstr(k, r->key);
    meta_obj *o = meta_obj_find(m, k);
    if (o == NULL)
        return meta_fail(m, FERRY_ENOENT, "no object '%s'", k);
    switch (r->type) {
    case FR_REC_PUT_END:
        if (o->state != FR_OBJ_PENDING)
            return meta_fail(m, FERRY_ESTATE, "object '%s' is %s, not pending", k, state_name(o->state));
        obj_count(m, o, -1);
        o->state = FR_OBJ_COMPLETE;
        obj_count(m, o, 1);
        fr_dlist_remove(&o->pending);
        touch(m, o);
        return 0;
    case FR_REC_PUT_REVOKE:
        if (o->state == FR_OBJ_COMPLETE)
            return meta_fail(m, FERRY_ESTATE, "object '%s' is complete: remove it instead", k);
        break;
    case FR_REC_OBJ_EVICT:
        /* Leases are checked when eviction is decided, against that
         * moment's clock; replay cannot know that clock, so it only checks
         * what never changes with time. */
        if (!soft(o))
            return meta_fail(m, FERRY_ESTATE, "object '%s' is %s%s: not evictable", k,
                             state_name(o->state), o->hard_pin ? " and hard-pinned" : "");
        break;
    case FR_REC_OBJ_REMOVE:
        if (o->state == FR_OBJ_PENDING)
            return meta_fail(m, FERRY_ESTATE, "object '%s' is pending: revoke it instead", k);
        break;
    default: /* OBJ_LEASE */
        if (o->state != FR_OBJ_COMPLETE)
            return meta_fail(m, FERRY_ESTATE, "object '%s' is %s: no lease", k, state_name(o->state));
        if (r->until > o->lease_until)
            o->lease_until = r->until;
        touch(m, o);
        return 0;
    }
    obj_free(m, o);
    return 0;
}

void meta_drop_seg(fr_meta *m, meta_seg *s, uint64_t node, uint64_t now)
{
    while (!fr_dlist_empty(&s->reps)) {
        meta_rep *p = fr_container_of(s->reps.next, meta_rep, in_seg);
        meta_obj *o = p->obj;
        fr_dlist_remove(&p->in_seg);
        lru_unlink(p);
        p->seg = NULL;
        if (--o->nlive > 0)
            continue;
        /* The last replica is gone: the object stays as a LOST marker so
         * readers learn what happened instead of "no such object". */
        obj_count(m, o, -1);
        o->state = FR_OBJ_LOST;
        obj_count(m, o, 1);
        o->lost_node = node;
        o->lost_at = now;
        o->lease_until = 0;
        if (fr_dlist_linked(&o->pending))
            fr_dlist_remove(&o->pending);
        m->last_lost++;
    }
    s->nreps = 0;
}

void meta_obj_free_all(fr_meta *m)
{
    size_t pos = 0;
    meta_obj *o;
    while ((o = fr_smap_next(&m->objs, &pos)) != NULL)
        fr_free(o);
    fr_smap_fini(&m->objs);
    memset(m->nobj, 0, sizeof m->nobj);
    m->complete_bytes = 0;
}

static int cmp_touch(const void *a, const void *b)
{
    const meta_obj *x = *(meta_obj *const *)a, *y = *(meta_obj *const *)b;
    if (x->touch_seq != y->touch_seq)
        return x->touch_seq < y->touch_seq ? -1 : 1;
    return strcmp(x->key, y->key);
}

/* After a snapshot: the pending list and the LRU lists follow the touch
 * stamps, which is the order they had when the snapshot was taken. */
int meta_obj_finish_load(fr_meta *m)
{
    size_t pos = 0, n = 0;
    meta_obj *o;
    if (meta_scratch(m, m->objs.n) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory finishing a snapshot");
    while ((o = fr_smap_next(&m->objs, &pos)) != NULL)
        m->scratch[n++] = o;
    fr_sort(m->scratch, n, sizeof(void *), cmp_touch);
    for (size_t i = 0; i < n; i++) {
        o = m->scratch[i];
        if (o->state == FR_OBJ_PENDING) {
            fr_dlist_push_back(&m->pending, &o->pending);
        } else if (soft(o)) {
            for (uint32_t k = 0; k < o->nslots; k++)
                if (o->rep[k].seg != NULL)
                    lru_append(&o->rep[k]);
        }
    }
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp((*(meta_obj *const *)a)->key, (*(meta_obj *const *)b)->key);
}

int meta_obj_snapshot(fr_meta *m, snap_out *out)
{
    size_t pos = 0, n = 0;
    meta_obj *o;
    if (meta_scratch(m, m->objs.n) < 0)
        return FERRY_ENOMEM;
    while ((o = fr_smap_next(&m->objs, &pos)) != NULL)
        m->scratch[n++] = o;
    fr_sort(m->scratch, n, sizeof(void *), cmp_key);
    for (size_t i = 0; i < n; i++) {
        o = m->scratch[i];
        fr_rec r = { .type = FR_REC_SNAP_OBJ, .key = meta_span(o->key), .size = o->size,
                     .state = o->state, .flag = o->hard_pin, .until = o->lease_until,
                     .seq = o->touch_seq, .time = o->created, .node = o->lost_node,
                     .time2 = o->lost_at };
        for (uint32_t k = 0; k < o->nslots; k++) {
            if (o->rep[k].seg == NULL)
                continue;
            r.rep[r.nrep].seg = o->rep[k].seg->id;
            r.rep[r.nrep].off = o->rep[k].off;
            r.nrep++;
        }
        int rc = snap_emit(out, &r);
        if (rc < 0)
            return rc;
    }
    return 0;
}

uint64_t meta_obj_next_deadline(const fr_meta *m)
{
    if (m->cfg.pending_timeout_ms == 0 || fr_dlist_empty(&m->pending))
        return UINT64_MAX;
    const meta_obj *o = fr_container_of(m->pending.next, meta_obj, pending);
    uint64_t t;
    return fr_add_u64(o->created, m->cfg.pending_timeout_ms, &t) < 0 ? UINT64_MAX : t;
}

int meta_obj_tick(fr_meta *m, uint64_t now, uint64_t *revoked)
{
    while (meta_obj_next_deadline(m) <= now) {
        meta_obj *o = fr_container_of(m->pending.next, meta_obj, pending);
        fr_rec r = { .type = FR_REC_PUT_REVOKE, .key = meta_span(o->key) };
        int rc = meta_commit(m, &r);
        if (rc < 0)
            return rc;
        (*revoked)++;
    }
    return 0;
}
