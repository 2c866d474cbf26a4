/* Notifications: (tag, value) pairs delivered by peers after their writes
 * are visible; counted per tag and consumed by ferry_wait_notify.
 *
 * Per tag, every sending peer (its engine instance) has its own ring of
 * unconsumed notifications, each stamped with an arrival number, so a wait
 * takes them across senders in arrival order. A ring holds at most
 * FERRY_NOTIFY_PENDING_MAX: a sender that outruns every waiter loses its
 * oldest, not the others' and not its newest (see engine.h). A tag whose
 * notifications are all consumed is freed, so tags used once (one per
 * update) do not pile up. Across its tags a peer may hold at most
 * FERRY_NOTIFY_PEER_MAX unconsumed (a count per peer, struct
 * fr_notify_peer): past it its new ones are refused, so a peer sending a
 * fresh tag each time cannot grow this engine without bound. */
#include <string.h>

#include "engine/engine_int.h"

_Static_assert((FERRY_NOTIFY_PENDING_MAX & (FERRY_NOTIFY_PENDING_MAX - 1)) == 0,
               "the ring arithmetic needs a power of two");

#define RING_MIN 2u   /* a tag holds one or two at a time, mostly: rings double from here */

typedef struct nt_ent { uint64_t seq, value; } nt_ent;

typedef struct nt_src {
    uint64_t peer;          /* the sender's engine instance */
    nt_ent *ring;           /* cap entries (a power of two); [head, head + n) */
    uint32_t cap, head, n;
    bool dropping;          /* full and dropping its oldest: warned once */
} nt_src;

struct fr_notify_peer {
    uint64_t peer;
    uint64_t n;             /* its unconsumed notifications, every tag */
    bool capped;            /* refusing new ones: warned once */
};

struct fr_notify_q {
    uint64_t tag;
    nt_src *src;
    size_t nsrc, cap_src;
    uint64_t n;             /* unconsumed, every sender */
};

/* ---- the tag index: tag -> position in e->notify ------------------------------------------
 *
 * Open addressing with linear probing over a power-of-two table of
 * positions + 1 (0: empty), at most half full; removal shifts the probe run
 * back, so there are no tombstones. A peer may hold tens of thousands of
 * tags (FERRY_NOTIFY_PEER_MAX), so a scan per notification is no option. */

static size_t tag_home(const ferry_engine *e, uint64_t tag)
{
    return (size_t)((tag * 0x9e3779b97f4a7c15ull) >> 17) & (e->cap_ntag - 1);
}

/* The slot of tag in the index, or the empty slot where it would go. */
static size_t tag_slot(const ferry_engine *e, uint64_t tag)
{
    size_t h = tag_home(e, tag);
    while (e->ntag[h] && e->notify[e->ntag[h] - 1].tag != tag)
        h = (h + 1) & (e->cap_ntag - 1);
    return h;
}

/* Room for one more tag: the index grown (and rebuilt) to stay half empty. */
static int tag_room(ferry_engine *e)
{
    if (2 * (e->nnotify + 1) <= e->cap_ntag)
        return 0;
    size_t cap = e->cap_ntag ? 2 * e->cap_ntag : 64;
    uint32_t *t = fr_calloc(cap, sizeof *t);
    if (!t)
        return -1;
    fr_free(e->ntag);
    e->ntag = t;
    e->cap_ntag = cap;
    for (size_t i = 0; i < e->nnotify; i++)
        e->ntag[tag_slot(e, e->notify[i].tag)] = (uint32_t)i + 1;
    return 0;
}

/* Take tag out of the index, then close the gap its slot leaves. */
static void tag_unindex(ferry_engine *e, uint64_t tag)
{
    size_t mask = e->cap_ntag - 1, h = tag_slot(e, tag);
    if (!e->ntag[h])
        return;
    for (size_t j = (h + 1) & mask; e->ntag[j]; j = (j + 1) & mask) {
        size_t k = tag_home(e, e->notify[e->ntag[j] - 1].tag);
        /* the entry at j may move back to h unless its home lies in (h, j] */
        bool stays = h <= j ? (k > h && k <= j) : (k > h || k <= j);
        if (!stays) {
            e->ntag[h] = e->ntag[j];
            h = j;
        }
    }
    e->ntag[h] = 0;
}

static struct fr_notify_q *find(ferry_engine *e, uint64_t tag, bool create)
{
    if (e->cap_ntag) {
        size_t h = tag_slot(e, tag);
        if (e->ntag[h])
            return &e->notify[e->ntag[h] - 1];
    }
    if (!create || tag_room(e) < 0 ||
        fr_grow((void **)&e->notify, &e->cap_notify, e->nnotify + 1, sizeof *e->notify) < 0)
        return NULL;
    struct fr_notify_q *q = &e->notify[e->nnotify++];
    memset(q, 0, sizeof *q);
    q->tag = tag;
    e->ntag[tag_slot(e, tag)] = (uint32_t)e->nnotify;
    return q;
}

static void q_free(struct fr_notify_q *q)
{
    for (size_t i = 0; i < q->nsrc; i++)
        fr_free(q->src[i].ring);
    fr_free(q->src);
}

/* Drop q (all consumed) from the engine's list and the index; the last
 * queue moves into its place. */
static void q_remove(ferry_engine *e, struct fr_notify_q *q)
{
    tag_unindex(e, q->tag);
    q_free(q);
    size_t at = (size_t)(q - e->notify), last = --e->nnotify;
    if (at != last) {
        uint64_t moved = e->notify[last].tag;
        *q = e->notify[last];
        e->ntag[tag_slot(e, moved)] = (uint32_t)at + 1;
    }
}

static nt_src *src_find(struct fr_notify_q *q, uint64_t peer, bool create)
{
    for (size_t i = 0; q && i < q->nsrc; i++)
        if (q->src[i].peer == peer)
            return &q->src[i];
    if (!q || !create || fr_grow((void **)&q->src, &q->cap_src, q->nsrc + 1, sizeof *q->src) < 0)
        return NULL;
    nt_src *s = &q->src[q->nsrc++];
    memset(s, 0, sizeof *s);
    s->peer = peer;
    return s;
}

/* Room for one more in s's ring, doubling it up to the cap. 0 or -1. */
static int src_room(nt_src *s)
{
    if (s->n < s->cap)
        return 0;
    uint32_t cap = s->cap ? s->cap * 2 : RING_MIN;
    nt_ent *r = fr_calloc(cap, sizeof *r);
    if (!r)
        return -1;
    for (uint32_t i = 0; i < s->n; i++)
        r[i] = s->ring[(s->head + i) & (s->cap - 1)];
    fr_free(s->ring);
    s->ring = r;
    s->cap = cap;
    s->head = 0;
    return 0;
}

/* The count of peer's unconsumed notifications (created at 0 when create). */
static struct fr_notify_peer *peer_count(ferry_engine *e, uint64_t peer, bool create)
{
    for (size_t i = 0; i < e->nnpeer; i++)
        if (e->npeer[i].peer == peer)
            return &e->npeer[i];
    if (!create || fr_grow((void **)&e->npeer, &e->cap_npeer, e->nnpeer + 1, sizeof *e->npeer) < 0)
        return NULL;
    struct fr_notify_peer *c = &e->npeer[e->nnpeer++];
    *c = (struct fr_notify_peer){ .peer = peer };
    return c;
}

/* A peer's count with nothing left unconsumed leaves the list (the last
 * count moves into its place). */
static void peer_drop_empty(ferry_engine *e, struct fr_notify_peer *c)
{
    if (c->n == 0)
        *c = e->npeer[--e->nnpeer];
}

/* One of peer's notifications consumed or dropped. */
static void peer_less(ferry_engine *e, uint64_t peer)
{
    struct fr_notify_peer *c = peer_count(e, peer, false);
    if (!c)
        return;
    if (--c->n < FERRY_NOTIFY_PEER_MAX)
        c->capped = false;
    peer_drop_empty(e, c);
}

static void drop_oldest(ferry_engine *e, struct fr_notify_q *q, nt_src *s)
{
    peer_less(e, s->peer);
    s->head = (s->head + 1) & (s->cap - 1);
    s->n--;
    q->n--;
    FR_STAT_ADD(e, notify_dropped, 1);
    if (s->dropping)
        return;
    s->dropping = true;
    FR_WARN("engine", "peer %016llx has sent %u notifications with tag %llu that nobody has "
            "consumed; dropping the oldest of them from now on (counted in notify_dropped)",
            (unsigned long long)s->peer, (unsigned)FERRY_NOTIFY_PENDING_MAX,
            (unsigned long long)q->tag);
}

void fr_notify_deliver(ferry_engine *e, uint64_t peer, uint64_t tag, uint64_t value)
{
    pthread_mutex_lock(&e->nlock);
    struct fr_notify_peer *c = peer_count(e, peer, true);
    /* at the bound over all tags: refused, unless its ring on this tag is
     * full (then the per-tag rule drops its oldest there: no more held) */
    bool at_bound = c && c->n >= FERRY_NOTIFY_PEER_MAX;
    const nt_src *mine = at_bound ? src_find(find(e, tag, false), peer, false) : NULL;
    if (at_bound && !(mine && mine->n == FERRY_NOTIFY_PENDING_MAX)) {
        FR_STAT_ADD(e, notify_dropped, 1);
        FR_STAT_ADD(e, notify_peer_capped, 1);
        if (!c->capped)
            FR_WARN("engine", "peer %016llx has %u unconsumed notifications over all its tags; "
                    "refusing its new ones until some are consumed (counted in "
                    "notify_peer_capped)", (unsigned long long)peer,
                    (unsigned)FERRY_NOTIFY_PEER_MAX);
        c->capped = true;
        pthread_mutex_unlock(&e->nlock);
        return;
    }
    struct fr_notify_q *q = c ? find(e, tag, true) : NULL;
    nt_src *s = q ? src_find(q, peer, true) : NULL;
    if (s && s->n == FERRY_NOTIFY_PENDING_MAX)
        drop_oldest(e, q, s);
    if (s && src_room(s) == 0) {
        s->ring[(s->head + s->n) & (s->cap - 1)] = (nt_ent){ e->notify_seq++, value };
        s->n++;
        q->n++;
        c->n++;
    } else {
        FR_STAT_ADD(e, notify_dropped, 1);
        FR_ERROR("engine", "out of memory: a notification with tag %llu from peer %016llx dropped",
                 (unsigned long long)tag, (unsigned long long)peer);
        if (q && q->n == 0)
            q_remove(e, q);
        if (c)
            peer_drop_empty(e, c);
    }
    pthread_cond_broadcast(&e->ncond);
    pthread_mutex_unlock(&e->nlock);
}

/* Take the oldest unconsumed notification of q (q->n > 0). */
static uint64_t take_oldest(ferry_engine *e, struct fr_notify_q *q)
{
    nt_src *best = NULL;
    for (size_t i = 0; i < q->nsrc; i++) {
        nt_src *s = &q->src[i];
        if (s->n && (!best || s->ring[s->head].seq < best->ring[best->head].seq))
            best = s;
    }
    uint64_t v = best->ring[best->head].value;
    best->head = (best->head + 1) & (best->cap - 1);
    if (--best->n == 0)
        best->dropping = false;
    q->n--;
    peer_less(e, best->peer);
    return v;
}

int ferry_wait_notify(ferry_engine *e, uint64_t tag, uint32_t count, int timeout_ms, uint64_t *values,
                      ferry_error *err)
{
    if (!e || count == 0)
        return fr_fail(err, FERRY_EINVAL, "wait notify: no engine, or a count of 0");
    uint64_t deadline = fr_deadline_ns(timeout_ms);
    struct timespec ts = fr_timespec_at(deadline);
    pthread_mutex_lock(&e->nlock);
    for (;;) {
        struct fr_notify_q *q = find(e, tag, false);
        if (q && q->n >= count) {
            for (uint32_t i = 0; i < count; i++) {
                uint64_t v = take_oldest(e, q);
                if (values)
                    values[i] = v;
            }
            if (q->n == 0)
                q_remove(e, q);
            pthread_mutex_unlock(&e->nlock);
            return 0;
        }
        if (timeout_ms < 0) {
            pthread_cond_wait(&e->ncond, &e->nlock);
        } else if (pthread_cond_timedwait(&e->ncond, &e->nlock, &ts) != 0 && fr_now_ns() >= deadline) {
            q = find(e, tag, false);
            const uint64_t have = q ? q->n : 0;
            size_t senders = 0;
            for (size_t i = 0; q && i < q->nsrc; i++)
                senders += q->src[i].n > 0;
            pthread_mutex_unlock(&e->nlock);
            return fr_fail(err, FERRY_ETIMEDOUT, "wait notify: timed out after %d ms waiting for %u notifications "
                           "with tag %llu: %llu of %u arrived (from %zu peer%s); none consumed", timeout_ms, count,
                           (unsigned long long)tag, (unsigned long long)have, count, senders,
                           senders == 1 ? "" : "s");
        }
    }
}

void fr_notify_destroy(ferry_engine *e)
{
    for (size_t i = 0; i < e->nnotify; i++)
        q_free(&e->notify[i]);
    fr_free(e->notify);
    e->notify = NULL;
    e->nnotify = e->cap_notify = 0;
    fr_free(e->ntag);
    e->ntag = NULL;
    e->cap_ntag = 0;
    fr_free(e->npeer);
    e->npeer = NULL;
    e->nnpeer = e->cap_npeer = 0;
}
