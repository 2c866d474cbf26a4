/* Notifications: (tag, value) pairs delivered by peers after their writes
 * are visible; counted per tag and consumed by ferry_wait_notify.
 *
 * Per tag, every sending peer (its engine instance) has its own ring of
 * unconsumed notifications, each stamped with an arrival number, so a wait
 * takes them across senders in arrival order. A ring holds at most
 * FERRY_NOTIFY_PENDING_MAX: a sender that outruns every waiter loses its
 * oldest, not the others' and not its newest (see engine.h). A tag whose
 * notifications are all consumed is freed, so tags used once (one per
 * update) do not pile up. */
#include <string.h>

#include "engine/engine_int.h"

_Static_assert((FERRY_NOTIFY_PENDING_MAX & (FERRY_NOTIFY_PENDING_MAX - 1)) == 0,
               "the ring arithmetic needs a power of two");

#define RING_MIN 16u

typedef struct nt_ent { uint64_t seq, value; } nt_ent;

typedef struct nt_src {
    uint64_t peer;          /* the sender's engine instance */
    nt_ent *ring;           /* cap entries (a power of two); [head, head + n) */
    uint32_t cap, head, n;
    bool dropping;          /* full and dropping its oldest: warned once */
} nt_src;

struct fr_notify_q {
    uint64_t tag;
    nt_src *src;
    size_t nsrc, cap_src;
    uint64_t n;             /* unconsumed, every sender */
};

static struct fr_notify_q *find(ferry_engine *e, uint64_t tag, bool create)
{
    for (size_t i = 0; i < e->nnotify; i++)
        if (e->notify[i].tag == tag)
            return &e->notify[i];
    if (!create || fr_grow((void **)&e->notify, &e->cap_notify, e->nnotify + 1, sizeof *e->notify) < 0)
        return NULL;
    struct fr_notify_q *q = &e->notify[e->nnotify++];
    memset(q, 0, sizeof *q);
    q->tag = tag;
    return q;
}

static void q_free(struct fr_notify_q *q)
{
    for (size_t i = 0; i < q->nsrc; i++)
        fr_free(q->src[i].ring);
    fr_free(q->src);
}

/* Drop q (all consumed) from the engine's list. */
static void q_remove(ferry_engine *e, struct fr_notify_q *q)
{
    q_free(q);
    *q = e->notify[--e->nnotify];
}

static nt_src *src_find(struct fr_notify_q *q, uint64_t peer)
{
    for (size_t i = 0; i < q->nsrc; i++)
        if (q->src[i].peer == peer)
            return &q->src[i];
    if (fr_grow((void **)&q->src, &q->cap_src, q->nsrc + 1, sizeof *q->src) < 0)
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

static void drop_oldest(ferry_engine *e, struct fr_notify_q *q, nt_src *s)
{
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
    struct fr_notify_q *q = find(e, tag, true);
    nt_src *s = q ? src_find(q, peer) : NULL;
    if (s && s->n == FERRY_NOTIFY_PENDING_MAX)
        drop_oldest(e, q, s);
    if (s && src_room(s) == 0) {
        s->ring[(s->head + s->n) & (s->cap - 1)] = (nt_ent){ e->notify_seq++, value };
        s->n++;
        q->n++;
    } else {
        FR_STAT_ADD(e, notify_dropped, 1);
        FR_ERROR("engine", "out of memory: a notification with tag %llu from peer %016llx dropped",
                 (unsigned long long)tag, (unsigned long long)peer);
        if (q && q->n == 0)
            q_remove(e, q);
    }
    pthread_cond_broadcast(&e->ncond);
    pthread_mutex_unlock(&e->nlock);
}

/* Take the oldest unconsumed notification of q (q->n > 0). */
static uint64_t take_oldest(struct fr_notify_q *q)
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
    return v;
}

int ferry_wait_notify(ferry_engine *e, uint64_t tag, uint32_t count, int timeout_ms, uint64_t *values)
{
    if (!e || count == 0)
        return FERRY_EINVAL;
    uint64_t deadline = fr_deadline_ns(timeout_ms);
    struct timespec ts = fr_timespec_at(deadline);
    pthread_mutex_lock(&e->nlock);
    for (;;) {
        struct fr_notify_q *q = find(e, tag, false);
        if (q && q->n >= count) {
            for (uint32_t i = 0; i < count; i++) {
                uint64_t v = take_oldest(q);
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
            pthread_mutex_unlock(&e->nlock);
            return FERRY_ETIMEDOUT;
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
}
