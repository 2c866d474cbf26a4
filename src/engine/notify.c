/* Notifications: (tag, value) pairs delivered by peers after their writes
 * are visible; counted per tag and consumed by ferry_wait_notify. */
#include <string.h>

#include "engine/engine_int.h"

struct fr_notify_q {
    uint64_t tag;
    uint64_t *values;
    size_t n, cap, head;   /* values[head..n) are unconsumed */
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

void fr_notify_deliver(ferry_engine *e, uint64_t tag, uint64_t value)
{
    pthread_mutex_lock(&e->nlock);
    struct fr_notify_q *q = find(e, tag, true);
    if (q && q->head > 0 && q->head == q->n)
        q->head = q->n = 0;
    if (q && fr_grow((void **)&q->values, &q->cap, q->n + 1, sizeof *q->values) == 0)
        q->values[q->n++] = value;
    else
        FR_ERROR("engine", "out of memory: notification tag %llu dropped", (unsigned long long)tag);
    pthread_cond_broadcast(&e->ncond);
    pthread_mutex_unlock(&e->nlock);
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
        if (q && q->n - q->head >= count) {
            if (values)
                memcpy(values, q->values + q->head, count * sizeof *values);
            q->head += count;
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
        fr_free(e->notify[i].values);
    fr_free(e->notify);
    e->notify = NULL;
    e->nnotify = e->cap_notify = 0;
}
