/* The master's long-lived state around requests: watches and their pushes,
 * and parked barrier arrivals (master_int.h). Liveness is master_live.c. */
#include <string.h>

#include "store/master_int.h"

#define U(x) ((unsigned long long)(x))

void fr_master_note_fatal(fr_master *m, int code)
{
    if (m->fatal == 0) {
        FR_ERROR("master", "fatal: %s (%s); stopping, a restart recovers from the log",
                 ferry_strerror(code), fr_meta_errmsg(m->meta));
        m->fatal = code;
    }
}

/* ---- watches --------------------------------------------------------------- */

/* Queue EVENTS frames for w from w->next_rev while there is history and the
 * connection is not backed up. With `initial`, exactly one frame (the
 * WATCH's reply, possibly empty) is queued first. */
static int watch_emit(fr_master_watch *w, bool initial)
{
    fr_master *m = w->c->m;
    for (;;) {
        if (!initial && (w->next_rev > fr_meta_kv_revision(m->meta) ||
                         fr_master_conn_pending_out(w->c) >= FR_MASTER_OUT_HIGH))
            return 0;
        size_t n = 0;
        uint64_t next = 0;
        int rc = fr_meta_kv_watch(m->meta, w->prefix, w->next_rev, m->events,
                                  FR_MASTER_EVENTS_FRAME, &n, &next);
        if (rc < 0)
            return rc;
        size_t k = 0, bytes = 0;
        for (; k < n; k++) {
            const fr_kv_event *e = &m->events[k];
            size_t len = strlen(e->key);
            size_t sz = 8 + 1 + 2 + len + 4 + (e->type == FR_KV_PUT ? e->len : 0);
            if (k > 0 && bytes + sz > FR_MASTER_FRAME_BYTES) {
                next = e->rev;
                break;
            }
            bytes += sz;
            bool del = e->type == FR_KV_DELETE;
            m->items[k] = (fr_smsg_item){
                .key = { (const uint8_t *)e->key, (uint32_t)len },
                .val = { del ? NULL : e->val, del ? 0 : (uint32_t)e->len },
                .id = e->rev, .deleted = del };
        }
        w->next_rev = next;
        if (k > 0 || initial) {
            fr_smsg r = { .type = FR_SMSG_EVENTS, .rev = next, .nitems = (uint32_t)k,
                          .items = m->items };
            fr_master_reply(w->c, w->req_id, &r);
        }
        initial = false;
        if (k == 0)
            return 0;
    }
}

void fr_master_watch_start(fr_master_conn *c, uint64_t req_id, const char *prefix, uint64_t from)
{
    fr_master *m = c->m;
    fr_master_watch *w = fr_calloc(1, sizeof *w);
    char *p = fr_strdup(prefix);
    if (w == NULL || p == NULL) {
        fr_free(w);
        fr_free(p);
        fr_master_reply_err(c, req_id, FERRY_ENOMEM, 0, "out of memory");
        return;
    }
    *w = (fr_master_watch){ .c = c, .req_id = req_id, .prefix = p,
                            .next_rev = from ? from : fr_meta_kv_revision(m->meta) + 1 };
    int rc = watch_emit(w, true);
    if (rc < 0) {
        fr_master_reply_meta_err(c, req_id, rc, fr_meta_kv_revision(m->meta) + 1);
        fr_free(p);
        fr_free(w);
        return;
    }
    fr_dlist_push_back(&m->watches, &w->mlink);
    fr_dlist_push_back(&c->watches, &w->clink);
}

void fr_master_watch_free(fr_master_watch *w)
{
    fr_dlist_remove(&w->mlink);
    fr_dlist_remove(&w->clink);
    fr_free(w->prefix);
    fr_free(w);
}

int fr_master_watch_stop(fr_master_conn *c, uint64_t id)
{
    for (fr_dnode *n = c->watches.next; n != &c->watches; n = n->next) {
        fr_master_watch *w = fr_container_of(n, fr_master_watch, clink);
        if (w->req_id == id) {
            fr_master_watch_free(w);
            return 0;
        }
    }
    return FERRY_ENOENT;
}

void fr_master_watch_push_all(fr_master *m)
{
    uint64_t rev = fr_meta_kv_revision(m->meta);
    fr_dnode *n = m->watches.next;
    while (n != &m->watches) {
        fr_master_watch *w = fr_container_of(n, fr_master_watch, mlink);
        n = n->next;
        if (w->next_rev > rev || w->c->dead || w->c->closing)
            continue;
        int rc = watch_emit(w, false);
        if (rc < 0) {   /* compacted past this watcher: it must resync */
            fr_master_mx_op(m, FR_SMSG_WATCH);
            fr_master_reply_meta_err(w->c, w->req_id, rc, rev + 1);
            fr_master_watch_free(w);
        }
    }
}

/* ---- barriers ------------------------------------------------------------------ */

void fr_master_wait_free(fr_master_wait *w, bool leave)
{
    if (leave) {
        int rc = fr_meta_barrier_leave(w->c->m->meta, w->name, w->member);
        if (rc == FERRY_EIO)
            fr_master_note_fatal(w->c->m, rc);
    }
    fr_dlist_remove(&w->mlink);
    fr_dlist_remove(&w->clink);
    fr_free(w->name);
    fr_free(w->member);
    fr_free(w);
}

void fr_master_barrier(fr_master_conn *c, uint64_t req_id, const char *name, const char *member,
                       uint32_t count, uint64_t timeout_ms)
{
    fr_master *m = c->m;
    fr_barrier_state st;
    int rc = fr_meta_barrier_arrive(m->meta, name, member, count, &st);
    if (rc < 0) {
        fr_master_reply_meta_err(c, req_id, rc, 0);
        return;
    }
    if (st.released) {
        fr_smsg r = { .type = FR_SMSG_BARRIER_DONE, .generation = st.generation };
        fr_master_reply(c, req_id, &r);
        fr_dnode *n = m->waits.next;
        while (n != &m->waits) {
            fr_master_wait *w = fr_container_of(n, fr_master_wait, mlink);
            n = n->next;
            if (w->generation == st.generation && strcmp(w->name, name) == 0) {
                fr_master_reply(w->c, w->req_id, &r);
                fr_master_wait_free(w, false);
            }
        }
        return;
    }
    fr_master_wait *w = fr_calloc(1, sizeof *w);
    char *nm = fr_strdup(name), *mb = fr_strdup(member);
    if (w == NULL || nm == NULL || mb == NULL) {
        fr_free(w);
        fr_free(nm);
        fr_free(mb);
        (void)fr_meta_barrier_leave(m->meta, name, member);
        fr_master_reply_err(c, req_id, FERRY_ENOMEM, 0, "out of memory");
        return;
    }
    uint64_t deadline = 0;
    if (timeout_ms > 0 && fr_add_u64(m->now_mono, timeout_ms, &deadline) < 0)
        deadline = 0;
    *w = (fr_master_wait){ .c = c, .req_id = req_id, .generation = st.generation,
                           .deadline = deadline, .timeout_ms = timeout_ms, .name = nm,
                           .member = mb };
    fr_dlist_push_back(&m->waits, &w->mlink);
    fr_dlist_push_back(&c->waits, &w->clink);
}

void fr_master_barrier_timeouts(fr_master *m)
{
    fr_dnode *n = m->waits.next;
    while (n != &m->waits) {
        fr_master_wait *w = fr_container_of(n, fr_master_wait, mlink);
        n = n->next;
        if (w->deadline == 0 || w->deadline > m->now_mono)
            continue;
        fr_barrier_state st = { 0 };
        (void)fr_meta_barrier_status(m->meta, w->name, &st);
        fr_master_mx_op(m, FR_SMSG_BARRIER);
        fr_master_reply_err(w->c, w->req_id, FERRY_ETIMEDOUT, 0,
                            "barrier '%s' timed out after %llu ms with %u of %u members", w->name,
                            U(w->timeout_ms), st.arrived, st.count);
        fr_master_wait_free(w, true);
    }
}

uint64_t fr_master_barrier_next_deadline(const fr_master *m)
{
    uint64_t d = UINT64_MAX;
    for (const fr_dnode *n = m->waits.next; n != &m->waits; n = n->next) {
        const fr_master_wait *w = fr_container_of(n, const fr_master_wait, mlink);
        if (w->deadline != 0 && w->deadline < d)
            d = w->deadline;
    }
    return d;
}
