/* Object commands: each checks the request against the state, decides
 * (placement, which objects to evict), and commits records. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/store.h"
#include "store/meta_int.h"

typedef struct meta_cand {
    meta_seg *s;
    uint64_t free;
    bool pref, chosen;
    uint64_t off;
} meta_cand;

static bool leased(const meta_obj *o, uint64_t now)
{
    return o->lease_until > now;
}

static uint64_t seg_used(const meta_seg *s)
{
    return fr_segalloc_used(s->alloc);
}

/* Most free first; ids break ties so placement is a function of the state. */
static int cmp_cand(const void *a, const void *b)
{
    const meta_cand *x = a, *y = b;
    if (x->free != y->free)
        return x->free > y->free ? -1 : 1;
    return x->s->id < y->s->id ? -1 : x->s->id > y->s->id;
}

/* Candidates in the order placement tries them: the preferred segments that
 * are mounted, in the caller's order, then every other segment. */
static int build_cands(fr_meta *m, const fr_replicate *rc, size_t *ncand)
{
    size_t n = 0, pos = 0;
    meta_seg *s;
    if (fr_grow((void **)&m->cand, &m->cand_cap, m->segs.n, sizeof(meta_cand)) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory placing an object");
    for (uint32_t i = 0; i < rc->npreferred; i++) {
        s = fr_umap_get(&m->segs, rc->preferred[i]);
        bool dup = false;
        for (size_t k = 0; k < n && !dup; k++)
            dup = m->cand[k].s == s;
        if (s == NULL || dup || s->unreachable_since != 0)
            continue;
        m->cand[n++] = (meta_cand){ .s = s, .pref = true };
    }
    size_t npref = n;
    while ((s = fr_umap_next(&m->segs, &pos)) != NULL) {
        if (s->unreachable_since != 0)   /* its node is suspect: nothing new goes there */
            continue;
        bool dup = false;
        for (size_t k = 0; k < npref && !dup; k++)
            dup = m->cand[k].s == s;
        if (!dup)
            m->cand[n++] = (meta_cand){ .s = s, .free = s->size - seg_used(s) };
    }
    fr_sort(m->cand + npref, n - npref, sizeof(meta_cand), cmp_cand);
    *ncand = n;
    return 0;
}

/* Evict the least recently used soft object on s that is not leased.
 * Returns 1 if one was evicted, 0 if none can be, or an error. */
static int evict_one(fr_meta *m, meta_seg *s, uint64_t now)
{
    for (fr_dnode *n = s->lru.next; n != &s->lru; n = n->next) {
        meta_obj *o = fr_container_of(n, meta_rep, in_lru)->obj;
        if (leased(o, now))
            continue;
        FR_DEBUG("store", "evicting '%s' (%llu bytes) for room on segment %016llx", o->key,
                 (unsigned long long)o->size, (unsigned long long)s->id);
        fr_rec r = { .type = FR_REC_OBJ_EVICT, .key = meta_span(o->key) };
        int rc = meta_commit(m, &r);
        m->evictions += rc >= 0;
        return rc < 0 ? rc : 1;
    }
    return 0;
}

static int cmp_rep_off(const void *a, const void *b)
{
    const meta_rep *x = *(meta_rep *const *)a, *y = *(meta_rep *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Whether len bytes would fit on s once eviction took everything it may
 * take (soft objects not leased at now): the free runs left then are the
 * gaps between the replicas that stay (leased, hard-pinned, pending), and
 * one of them must hold len at the allocator's alignment. O(replicas on
 * s); it runs only when the object does not fit already. */
static int fits_after_eviction(fr_meta *m, const meta_seg *s, uint64_t len, uint64_t now,
                               bool *fits)
{
    size_t n = 0;
    if (meta_scratch(m, s->nreps) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory placing an object");
    for (const fr_dnode *d = s->reps.next; d != &s->reps; d = d->next) {
        meta_rep *p = fr_container_of(d, meta_rep, in_seg);
        if (!fr_dlist_linked(&p->in_lru) || leased(p->obj, now))
            m->scratch[n++] = p;
    }
    fr_sort(m->scratch, n, sizeof(void *), cmp_rep_off);
    fr_segalloc_stats st;
    fr_segalloc_get_stats(s->alloc, &st);
    uint64_t al = m->cfg.align > s->granule ? m->cfg.align : s->granule, from = 0;
    *fits = false;
    for (size_t i = 0; i <= n && !*fits; i++) {
        const meta_rep *p = i < n ? m->scratch[i] : NULL;
        uint64_t to = p != NULL ? p->off : st.size;
        uint64_t start = (from + al - 1) & ~(al - 1);
        *fits = start >= from && start <= to && to - start >= len;
        if (p != NULL && p->off + fr_segalloc_round(s->alloc, p->obj->size) > from)
            from = p->off + fr_segalloc_round(s->alloc, p->obj->size);
    }
    return 0;
}

/* 1 if the object fits on c now or after evicting, 0 if not, or an error. */
static int can_place(fr_meta *m, const meta_cand *c, uint64_t size, uint64_t now)
{
    uint64_t len = fr_segalloc_round(c->s->alloc, size), off;
    if (len > c->s->size - seg_used(c->s) + c->s->lru_bytes)
        return 0;
    if (fr_segalloc_find(c->s->alloc, len, m->cfg.align, &off) == 0)
        return 1;
    bool fits = false;
    int rc = fits_after_eviction(m, c->s, len, now, &fits);
    return rc < 0 ? rc : fits;
}

/* Place on c: with eviction, until the object fits without passing the
 * watermark or nothing more can go (then it is placed if it fits at all).
 * A placement that cannot succeed evicts nothing. */
static int place_evicting(fr_meta *m, meta_cand *c, uint64_t size, uint64_t now)
{
    uint64_t len = fr_segalloc_round(c->s->alloc, size), off;
    int can = can_place(m, c, size, now);
    if (can <= 0)
        return can;
    for (;;) {
        int fit = fr_segalloc_find(c->s->alloc, len, m->cfg.align, &off);
        if (fit == 0 && seg_used(c->s) + len <= c->s->hw_limit)
            break;
        int ev = evict_one(m, c->s, now);
        if (ev < 0)
            return ev;
        if (ev == 0) {
            if (fit < 0)
                return 0;
            break;
        }
    }
    c->chosen = true;
    c->off = off;
    return 1;
}

/* reachable_only: leave out replicas on segments whose node is unreachable. */
static void fill_desc(const meta_obj *o, bool reachable_only, fr_obj_desc *out)
{
    memset(out, 0, sizeof(*out));
    out->size = o->size;
    out->state = o->state;
    out->hard_pin = o->hard_pin;
    out->lease_until = o->lease_until;
    for (uint32_t i = 0; i < o->nslots; i++) {
        const meta_rep *p = &o->rep[i];
        if (p->seg == NULL || (reachable_only && p->seg->unreachable_since != 0))
            continue;
        out->rep[out->nrep++] = (fr_replica_desc){ p->seg->id, p->seg->node, p->off, false };
    }
}

static int lost(fr_meta *m, const meta_obj *o)
{
    uint64_t ago = m->clock > o->lost_at ? m->clock - o->lost_at : 0;
    return meta_fail(m, FERRY_ELOST,
                     "object '%s' is lost: its last replica was on node %016llx, declared dead "
                     "(or unmounted) %llu s ago; put it again",
                     o->key, (unsigned long long)o->lost_node, (unsigned long long)(ago / 1000));
}

static int check_replicate(fr_meta *m, const fr_replicate *rc, uint32_t *want)
{
    *want = rc->replica_num != 0 ? rc->replica_num : 1;
    if (*want > FR_MAX_REPLICAS)
        return meta_fail(m, FERRY_EINVAL, "replica_num %u is above %d", *want, FR_MAX_REPLICAS);
    if (rc->npreferred > FR_PREFERRED_MAX || (rc->npreferred != 0 && rc->preferred == NULL))
        return meta_fail(m, FERRY_EINVAL, "bad preferred segment list (%u)", rc->npreferred);
    return 0;
}

static int no_room(fr_meta *m, const char *key, uint64_t size, uint32_t want, uint32_t got,
                   size_t ncand)
{
    uint64_t largest = 0;
    for (size_t i = 0; i < ncand; i++) {
        fr_segalloc_stats st;
        fr_segalloc_get_stats(m->cand[i].s->alloc, &st);
        if (st.largest_free > largest)
            largest = st.largest_free;
    }
    return meta_fail(m, FERRY_ENOSPC,
                     "no room for object '%s' (%llu bytes x %u replicas): only %u of %zu "
                     "segments can hold it after evicting every soft object; largest free "
                     "extent %llu bytes",
                     key, (unsigned long long)size, want, got, ncand, (unsigned long long)largest);
}

int fr_meta_put_start(fr_meta *m, const char *key, uint64_t size, const fr_replicate *rc,
                      uint64_t now_ms, fr_obj_desc *out)
{
    static const fr_replicate defaults = { 0 };
    uint32_t want, got = 0;
    size_t ncand = 0;
    int err = meta_check_name(m, "object key", key);
    if (err < 0)
        return err;
    if (rc == NULL)
        rc = &defaults;
    if ((err = check_replicate(m, rc, &want)) < 0)
        return err;
    if (size > FR_OBJ_SIZE_MAX)
        return meta_fail(m, FERRY_EINVAL, "object '%s': size %llu is too large", key,
                         (unsigned long long)size);
    uint64_t now = meta_now(m, now_ms);
    meta_obj *old = meta_obj_find(m, key);
    if (old != NULL && old->state != FR_OBJ_LOST)
        return meta_fail(m, FERRY_EEXIST, "object '%s' already exists (%s)", key,
                         meta_obj_state_name(old->state));
    if ((err = build_cands(m, rc, &ncand)) < 0)
        return err;
    if (ncand < want && m->segs.n >= want)   /* transient: the client tries again */
        return meta_fail(m, FERRY_EUNREACH,
                         "object '%s' needs %u distinct segments: %zu of the %zu mounted are on "
                         "reachable nodes now (the others' nodes are not heard from or "
                         "reconnecting)",
                         key, want, ncand, m->segs.n);
    if (ncand < want)
        return meta_fail(m, FERRY_ENOSPC, "object '%s' needs %u distinct segments; %zu mounted",
                         key, want, m->segs.n);

    /* Pass 1: segments with room below the watermark, in candidate order;
     * on each, a place the slot had before (meta_slot.c) ahead of the best
     * fit. */
    for (size_t i = 0; i < ncand && got < want; i++) {
        meta_cand *c = &m->cand[i];
        uint64_t len = fr_segalloc_round(c->s->alloc, size);
        if ((meta_slot_place(m, rc->slot, c->s, len, &c->off) ||
             fr_segalloc_find(c->s->alloc, len, m->cfg.align, &c->off) == 0) &&
            seg_used(c->s) + len <= c->s->hw_limit) {
            c->chosen = true;
            got++;
        }
    }
    /* Pass 2: make room by evicting, in the same order. With more than one
     * replica still to place, first make sure that enough candidates can
     * take one, so that a put that fails evicts nothing (evicting on one
     * segment only ever frees room on the others). */
    uint32_t can = got;
    for (size_t i = 0; want - got > 1 && i < ncand && can < want; i++) {
        int c = m->cand[i].chosen ? 0 : can_place(m, &m->cand[i], size, now);
        if (c < 0)
            return c;
        can += (uint32_t)c;
    }
    if (want - got > 1 && can < want)
        return no_room(m, key, size, want, can, ncand);
    for (size_t i = 0; i < ncand && got < want; i++) {
        if (m->cand[i].chosen)
            continue;
        int placed = place_evicting(m, &m->cand[i], size, now);
        if (placed < 0)
            return placed;
        got += (uint32_t)placed;
    }
    if (got < want)
        return no_room(m, key, size, want, got, ncand);

    if (old != NULL) {
        fr_rec rm = { .type = FR_REC_OBJ_REMOVE, .key = meta_span(key) };
        if ((err = meta_commit(m, &rm)) < 0)
            return err;
    }
    fr_rec r = { .type = FR_REC_PUT_START, .key = meta_span(key), .size = size, .time = now,
                 .flag = rc->hard_pin };
    for (size_t i = 0; i < ncand && r.nrep < want; i++) {
        if (!m->cand[i].chosen)
            continue;
        r.rep[r.nrep].seg = m->cand[i].s->id;
        r.rep[r.nrep].off = m->cand[i].off;
        r.nrep++;
    }
    if ((err = meta_commit(m, &r)) < 0)
        return err;
    meta_obj *made = meta_obj_find(m, key);
    if (made != NULL)
        made->slot = rc->slot;
    if (out != NULL) {
        fill_desc(made, false, out);
        for (uint32_t i = 0, k = 0; i < ncand && k < out->nrep; i++)
            if (m->cand[i].chosen)
                out->rep[k++].preferred = m->cand[i].pref;
    }
    return 0;
}

int fr_meta_put_end(fr_meta *m, const char *key, uint64_t now_ms)
{
    int err = meta_check_name(m, "object key", key);
    if (err < 0)
        return err;
    meta_now(m, now_ms);
    meta_obj *o = meta_obj_find(m, key);
    if (o == NULL)
        return meta_fail(m, FERRY_ENOENT, "no object '%s' (revoked, or put_start never ran)", key);
    if (o->state == FR_OBJ_LOST)
        return lost(m, o);
    if (o->state != FR_OBJ_PENDING)
        return meta_fail(m, FERRY_ESTATE, "object '%s' is already complete", key);
    fr_rec r = { .type = FR_REC_PUT_END, .key = meta_span(key) };
    return meta_commit(m, &r);
}

int fr_meta_put_revoke(fr_meta *m, const char *key, uint64_t now_ms)
{
    int err = meta_check_name(m, "object key", key);
    if (err < 0)
        return err;
    meta_now(m, now_ms);
    meta_obj *o = meta_obj_find(m, key);
    if (o == NULL)
        return meta_fail(m, FERRY_ENOENT, "no object '%s'", key);
    if (o->state == FR_OBJ_COMPLETE)
        return meta_fail(m, FERRY_ESTATE, "object '%s' is complete: remove it instead", key);
    fr_rec r = { .type = FR_REC_PUT_REVOKE, .key = meta_span(key) };
    return meta_commit(m, &r);
}

/* A read of an object that is not there: absent, still being written, or lost. */
static int unreadable(fr_meta *m, const char *key, const meta_obj *o)
{
    if (o == NULL)
        return meta_fail(m, FERRY_ENOENT, "no object '%s'", key);
    if (o->state == FR_OBJ_LOST)
        return lost(m, o);
    return meta_fail(m, FERRY_ENOENT, "object '%s' is still being written (no put_end yet)", key);
}

/* A read needs one replica whose node is reachable; the others are kept
 * (their node may come back). */
static int reachable(fr_meta *m, const meta_obj *o, uint64_t now)
{
    const meta_seg *worst = NULL;
    for (uint32_t i = 0; i < o->nslots; i++) {
        const meta_seg *s = o->rep[i].seg;
        if (s == NULL)
            continue;
        if (s->unreachable_since == 0)
            return 0;
        if (worst == NULL || s->unreachable_since > worst->unreachable_since)
            worst = s;
    }
    if (worst == NULL)
        return 0;
    uint64_t ago = now > worst->unreachable_since ? now - worst->unreachable_since : 0;
    return meta_fail(m, FERRY_EUNREACH,
                     "object '%s' is only on node %016llx, unreachable for %llu.%01llu s (not heard "
                     "from, or reconnecting); its data is kept: retry when the node is back",
                     o->key, (unsigned long long)worst->node, (unsigned long long)(ago / 1000),
                     (unsigned long long)(ago % 1000 / 100));
}

int fr_meta_get(fr_meta *m, const char *key, uint64_t lease_ms, uint64_t now_ms, fr_obj_desc *out)
{
    int err = meta_check_name(m, "object key", key);
    if (err < 0)
        return err;
    if (lease_ms > FERRY_STORE_LEASE_MAX_MS)
        return meta_fail(m, FERRY_EINVAL, "a read's lease of %llu ms is above the longest, %u ms "
                         "(an hour)", (unsigned long long)lease_ms, FERRY_STORE_LEASE_MAX_MS);
    uint64_t now = meta_now(m, now_ms), until;
    meta_obj *o = meta_obj_find(m, key);
    if (o == NULL || o->state != FR_OBJ_COMPLETE)
        return unreadable(m, key, o);
    if ((err = reachable(m, o, now)) < 0)
        return err;
    if (fr_add_u64(now, lease_ms, &until) < 0)
        until = UINT64_MAX;
    fr_rec r = { .type = FR_REC_OBJ_LEASE, .key = meta_span(key), .until = until };
    if ((err = meta_commit(m, &r)) < 0)
        return err;
    if (out != NULL)
        fill_desc(o, true, out);
    return 0;
}

int fr_meta_describe(const fr_meta *m, const char *key, fr_obj_desc *out)
{
    if (key == NULL || out == NULL)
        return FERRY_EINVAL;
    const meta_obj *o = fr_smap_get(&m->objs, key, fr_smap_hash(key));
    if (o == NULL)
        return FERRY_ENOENT;
    fill_desc(o, false, out);
    return 0;
}

int fr_meta_remove(fr_meta *m, const char *key, uint64_t now_ms)
{
    int err = meta_check_name(m, "object key", key);
    if (err < 0)
        return err;
    uint64_t now = meta_now(m, now_ms);
    meta_obj *o = meta_obj_find(m, key);
    if (o == NULL)
        return meta_fail(m, FERRY_ENOENT, "no object '%s'", key);
    if (o->state == FR_OBJ_PENDING)
        return meta_fail(m, FERRY_ESTATE, "object '%s' is pending: revoke it instead", key);
    if (o->state == FR_OBJ_COMPLETE && leased(o, now))
        return meta_fail(m, FERRY_EBUSY,
                         "object '%s' is leased to a reader for %llu ms more; remove it after",
                         key, (unsigned long long)(o->lease_until - now));
    fr_rec r = { .type = FR_REC_OBJ_REMOVE, .key = meta_span(key) };
    return meta_commit(m, &r);
}

int fr_meta_remove_prefix(fr_meta *m, const char *prefix, uint64_t now_ms, fr_remove_counts *out)
{
    fr_remove_counts cnt = { 0 };
    size_t pos = 0, n = 0, plen;
    meta_obj *o;
    int rc = 0;
    if (prefix == NULL || (plen = strnlen(prefix, FR_KEY_MAX + 1)) > FR_KEY_MAX)
        return meta_fail(m, FERRY_EINVAL, "bad prefix");
    uint64_t now = meta_now(m, now_ms);
    if (meta_scratch(m, m->objs.n) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    while ((o = fr_smap_next(&m->objs, &pos)) != NULL) {
        if (!meta_prefix(o->key, prefix, plen))
            continue;
        if (o->state == FR_OBJ_PENDING)
            cnt.skipped_pending++;
        else if (o->state == FR_OBJ_COMPLETE && leased(o, now))
            cnt.skipped_leased++;
        else
            m->scratch[n++] = o->key;
    }
    /* Sorted, so the log reads the same whatever the hash order was. */
    fr_sort(m->scratch, n, sizeof(void *), meta_cmp_str);
    for (size_t i = 0; i < n && rc == 0; i++) {
        fr_rec r = { .type = FR_REC_OBJ_REMOVE, .key = meta_span(m->scratch[i]) };
        rc = meta_commit(m, &r);
        if (rc == 0)
            cnt.removed++;
    }
    if (out != NULL)
        *out = cnt;
    return rc;
}

int fr_meta_exist(fr_meta *m, const char *key)
{
    int err = meta_check_name(m, "object key", key);
    if (err < 0)
        return err;
    const meta_obj *o = meta_obj_find(m, key);
    if (o == NULL || o->state == FR_OBJ_PENDING)
        return 0;
    return o->state == FR_OBJ_LOST ? lost(m, o) : 1;
}

int fr_meta_list(fr_meta *m, const char *prefix, const char *after, size_t max, fr_keylist *out)
{
    size_t pos = 0, n = 0, plen;
    const meta_obj *o;
    if (out == NULL || prefix == NULL || (plen = strnlen(prefix, FR_KEY_MAX + 1)) > FR_KEY_MAX)
        return meta_fail(m, FERRY_EINVAL, "bad prefix");
    memset(out, 0, sizeof(*out));
    const char **keys = fr_calloc(m->objs.n ? m->objs.n : 1, sizeof(*keys));
    if (keys == NULL)
        return meta_fail(m, FERRY_ENOMEM, "out of memory listing objects");
    while ((o = fr_smap_next(&m->objs, &pos)) != NULL)
        if (o->state == FR_OBJ_COMPLETE && meta_prefix(o->key, prefix, plen) &&
            (after == NULL || strcmp(o->key, after) > 0))
            keys[n++] = o->key;
    fr_sort(keys, n, sizeof(*keys), meta_cmp_str);
    out->keys = keys;
    out->more = n > max;
    out->n = n > max ? max : n;
    return 0;
}
