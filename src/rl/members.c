/* The membership of an elastic rollout group in the store (members_int.h). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "rl/keys.h"
#include "rl/members_int.h"
#include "rl/rl_int.h"

#define PARK_MS 5000        /* a parked arrival is renewed this often (bounds close) */
#define LIST_MAX 4096       /* members of a group */

typedef char mid[FR_MEMBER_ID + 1];

struct fr_members {
    ferry_store *s;
    char model[FR_KEY_NAME_MAX + 1], group[FR_KEY_NAME_MAX + 1];
    char prefix[FR_KEY_MAX];    /* of every key of the group's members */
    mid id;
    char name[64];
    uint64_t probe_ms;
    uint64_t gen, seq;      /* what this member's record says */
    pthread_t th;
    bool th_started;
    atomic_bool stop;
};

const char *fr_members_name(const fr_members *m) { return m->name; }

static void key_of(const fr_members *m, char *out, size_t cap, const char *what, const char *id)
{
    (void)fr_key_member(out, cap, m->model, m->group, what, id);
}

/* ---- the member list ----------------------------------------------------------------- */

static bool hex_id(const char *p)
{
    for (int i = 0; i < FR_MEMBER_ID; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    return true;
}


int fr_members_list_parse(const char *text, size_t len, char (*ids)[FR_MEMBER_ID + 1], size_t *n)
{
    *n = 0;
    if (len % (FR_MEMBER_ID + 1) || len / (FR_MEMBER_ID + 1) > LIST_MAX)
        return FERRY_EPROTO;
    for (size_t i = 0; i < len / (FR_MEMBER_ID + 1); i++) {
        const char *p = text + i * (FR_MEMBER_ID + 1);
        if (!hex_id(p) || p[FR_MEMBER_ID] != '\n')
            return FERRY_EPROTO;
        memcpy(ids[i], p, FR_MEMBER_ID);
        ids[i][FR_MEMBER_ID] = 0;
        (*n)++;
    }
    return 0;
}

/* The registered ids (*n of them, *ids: free) and the list's revision (0: none). */
static int list_get(const fr_members *m, mid **ids, uint32_t *n, uint64_t *rev)
{
    char key[FR_KEY_MAX];
    key_of(m, key, sizeof key, "list", NULL);
    ferry_kv_value v = {0};
    *ids = NULL;
    *n = 0;
    *rev = 0;
    int rc = ferry_kv_get(m->s, key, &v, NULL);
    if (rc == FERRY_ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    *rev = v.mod_rev;
    size_t cnt = v.len / (FR_MEMBER_ID + 1);
    *ids = calloc(cnt ? cnt : 1, sizeof **ids);
    if (!*ids) {
        ferry_store_free(v.val);
        return FERRY_ENOMEM;
    }
    rc = fr_members_list_parse(v.val, v.len, *ids, &cnt);
    *n = (uint32_t)cnt;
    ferry_store_free(v.val);
    if (rc < 0) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return rc;
}

static int list_cas(const fr_members *m, const mid *ids, uint32_t n, uint64_t rev)
{
    char key[FR_KEY_MAX];
    key_of(m, key, sizeof key, "list", NULL);
    char *b = malloc((size_t)n * (FR_MEMBER_ID + 1) + 1);
    if (!b)
        return FERRY_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(b + (size_t)i * (FR_MEMBER_ID + 1), ids[i], FR_MEMBER_ID);
        b[(size_t)i * (FR_MEMBER_ID + 1) + FR_MEMBER_ID] = '\n';
    }
    int rc = ferry_kv_cas(m->s, key, rev, b, (size_t)n * (FR_MEMBER_ID + 1), NULL, NULL);
    free(b);
    return rc;
}

static bool has(const mid *ids, uint32_t n, const char *id)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0)
            return true;
    return false;
}

/* Add me (add) or drop the ids in gone[ngone] from the list, retrying on
 * a concurrent change. */
static int list_change(const fr_members *m, bool add, const mid *gone, uint32_t ngone)
{
    for (int tries = 0; tries < 1000; tries++) {
        mid *ids;
        uint32_t n;
        uint64_t rev;
        int rc = list_get(m, &ids, &n, &rev);
        if (rc < 0)
            return rc;
        uint32_t k = 0;
        bool changed = false;
        if (add) {
            if (!has(ids, n, m->id)) {
                mid *more = n < LIST_MAX ? realloc(ids, (n + 1) * sizeof *ids) : NULL;
                if (!more) {
                    free(ids);
                    return n < LIST_MAX ? FERRY_ENOMEM : FERRY_ENOSPC;
                }
                ids = more;
                memcpy(ids[n], m->id, sizeof ids[n]);
                k = n + 1;
                changed = true;
            }
        } else {
            for (uint32_t i = 0; i < n; i++) {
                if (has(gone, ngone, ids[i]))
                    changed = true;
                else
                    memmove(ids[k++], ids[i], sizeof ids[i]);
            }
        }
        rc = changed ? list_cas(m, ids, k, rev) : 0;
        free(ids);
        if (rc != FERRY_ESTATE)
            return rc;
    }
    return FERRY_EBUSY;
}

/* ---- one member's record ---------------------------------------------------------------- */

static int rec_put(fr_members *m, uint64_t gen, uint64_t seq)
{
    char key[FR_KEY_MAX], val[128];
    key_of(m, key, sizeof key, "m/", m->id);
    int n = snprintf(val, sizeof val, "%" PRIu64 " %" PRIu64 " %s", gen, seq, m->name);
    int rc = ferry_kv_put(m->s, key, val, (size_t)n, NULL, NULL);
    if (rc == 0) {
        m->gen = gen;
        m->seq = seq;
    }
    return rc;
}

/* Member id's generation and last update: FERRY_ENOENT when it has no record. */
static int rec_get(const fr_members *m, const char *id, uint64_t *gen, uint64_t *seq)
{
    char key[FR_KEY_MAX];
    key_of(m, key, sizeof key, "m/", id);
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(m->s, key, &v, NULL);
    if (rc < 0)
        return rc;
    char buf[128];
    size_t n = v.len < sizeof buf - 1 ? v.len : sizeof buf - 1;
    memcpy(buf, v.val, n);
    buf[n] = 0;
    ferry_store_free(v.val);
    unsigned long long g, q;
    if (sscanf(buf, "%llu %llu", &g, &q) != 2)
        return FERRY_EPROTO;
    *gen = g;
    *seq = q;
    return 0;
}

/* Drop dead members: out of the list, their records deleted. */
static void bury(const fr_members *m, const mid *dead, uint32_t n)
{
    if (n == 0 || dead == NULL)   /* NULL: what the compiler cannot rule out on inlined paths */
        return;
    (void)list_change(m, false, dead, n);
    for (uint32_t i = 0; i < n; i++) {
        char key[FR_KEY_MAX];
        key_of(m, key, sizeof key, "m/", dead[i]);
        (void)ferry_kv_delete(m->s, key, 0, NULL, NULL);
        FR_INFO("rl", "elastic group %s: member %s is gone (its liveness probe timed out)",
                 m->prefix, dead[i]);
    }
}

/* ---- liveness -------------------------------------------------------------------------- */

static void *live_main(void *arg)
{
    fr_members *m = arg;
    char bar[FR_KEY_MAX];
    (void)fr_key_member_live(bar, sizeof bar, m->model, m->group, m->id);
    while (!atomic_load(&m->stop)) {
        int rc = ferry_barrier(m->s, bar, "member", 2, PARK_MS, NULL, NULL);
        /* the master unreachable: try again shortly, never spin */
        for (int i = 0; rc < 0 && rc != FERRY_ETIMEDOUT && i < 10 && !atomic_load(&m->stop); i++)
            nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000000L }, NULL);
    }
    return NULL;
}

/* true unless the member's probe timed out on the master's clock (any
 * other failure says nothing about it: kept). */
static bool alive(const fr_members *m, const char *id)
{
    char bar[FR_KEY_MAX];
    (void)fr_key_member_live(bar, sizeof bar, m->model, m->group, id);
    return ferry_barrier(m->s, bar, "probe", 2, m->probe_ms, NULL, NULL) != FERRY_ETIMEDOUT;
}

/* ---- join and leave ----------------------------------------------------------------------- */

int fr_members_join(ferry_store *s, const char *model, const char *group, const char *name,
                    uint64_t probe_ms, fr_members **out, ferry_error *err)
{
    fr_members *m = calloc(1, sizeof *m);
    if (!m)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    m->s = s;
    m->probe_ms = probe_ms;
    snprintf(m->model, sizeof m->model, "%s", model);
    snprintf(m->group, sizeof m->group, "%s", group);
    (void)fr_key_member(m->prefix, sizeof m->prefix, model, group, "", NULL);
    snprintf(m->id, sizeof m->id, "%016" PRIx64, fr_random_u64());
    if (name && name[0]) {
        snprintf(m->name, sizeof m->name, "%s", name);
    } else {
        char host[40] = "";
        (void)gethostname(host, sizeof host - 1);
        snprintf(m->name, sizeof m->name, "%s:%d", host, (int)getpid());
    }
    for (char *p = m->name; *p; p++)   /* one word in the record */
        if (*p == ' ' || *p == '\n')
            *p = '_';
    atomic_init(&m->stop, false);
    int rc = rec_put(m, 0, 0);
    if (rc == 0)
        rc = list_change(m, true, NULL, 0);
    if (rc == 0) {
        rc = pthread_create(&m->th, NULL, live_main, m) == 0 ? 0 : FERRY_ENOMEM;
        m->th_started = rc == 0;
    }
    if (rc < 0) {
        fr_fail(err, rc, "subscriber: member %s cannot join group %s: %s", m->name, group,
                ferry_strerror(rc));
        fr_members_leave(m);
        return rc;
    }
    *out = m;
    return 0;
}

int fr_members_withdraw(fr_members *m)
{
    mid me;
    memcpy(me, m->id, sizeof me);
    int rc = list_change(m, false, &me, 1);
    char key[FR_KEY_MAX];
    key_of(m, key, sizeof key, "m/", m->id);
    int rc2 = ferry_kv_delete(m->s, key, 0, NULL, NULL);
    return rc < 0 ? rc : rc2 == FERRY_ENOENT ? 0 : rc2;
}

void fr_members_leave(fr_members *m)
{
    if (!m)
        return;
    (void)fr_members_withdraw(m);
    if (m->th_started) {
        atomic_store(&m->stop, true);
        char bar[FR_KEY_MAX];
        (void)fr_key_member_live(bar, sizeof bar, m->model, m->group, m->id);
        (void)ferry_barrier(m->s, bar, "probe", 2, 2000, NULL, NULL);   /* releases the thread */
        pthread_join(m->th, NULL);
    }
    free(m);
}

int fr_members_ensure(fr_members *m, ferry_error *err)
{
    mid *ids;
    uint32_t n;
    uint64_t rev, g, q;
    int rc = list_get(m, &ids, &n, &rev);
    bool listed = rc == 0 && has(ids, n, m->id);
    free(ids);
    if (rc == 0 && listed && rec_get(m, m->id, &g, &q) == 0)
        return 0;
    if (rc == 0)
        rc = rec_put(m, m->gen, m->seq);
    if (rc == 0)
        rc = list_change(m, true, NULL, 0);
    if (rc < 0)
        return fr_fail(err, rc, "subscriber: member %s cannot register in its group: %s",
                       m->name, ferry_strerror(rc));
    return 0;
}

int fr_members_done(fr_members *m, uint64_t gen, uint64_t seq)
{
    return rec_put(m, gen, seq);
}

int fr_members_hold(fr_members *m, uint64_t gen)
{
    return m->gen == gen ? 0 : rec_put(m, gen, m->seq);
}

void fr_epoch_free(fr_epoch *ep)
{
    if (ep) {
        free(ep->ids);
        memset(ep, 0, sizeof *ep);
    }
}

/* ---- epochs ----------------------------------------------------------------------------------- */

int fr_epoch_parse(const char *text, size_t len, const char *me, fr_epoch *ep)
{
    memset(ep, 0, sizeof *ep);
    char head[96];
    size_t hl = 0;
    while (hl < len && hl < sizeof head - 1 && text[hl] != '\n')
        hl++;
    if (hl == len || text[hl] != '\n')
        return FERRY_EPROTO;
    memcpy(head, text, hl);
    head[hl] = 0;
    unsigned long long e, q, g;
    unsigned n;
    int used = -1;
    if (sscanf(head, "%llu %llu %llu %u%n", &e, &q, &g, &n, &used) != 4 || used != (int)hl ||
        n > LIST_MAX || len - hl - 1 != (size_t)n * (FR_MEMBER_ID + 1))
        return FERRY_EPROTO;
    if (!(ep->ids = calloc(n ? n : 1, sizeof *ep->ids)))
        return FERRY_ENOMEM;
    const char *p = text + hl + 1;
    for (unsigned i = 0; i < n; i++, p += FR_MEMBER_ID + 1) {
        if (!hex_id(p) || p[FR_MEMBER_ID] != '\n') {
            fr_epoch_free(ep);
            return FERRY_EPROTO;
        }
        memcpy(ep->ids[i], p, FR_MEMBER_ID);
    }
    *ep = (fr_epoch){ .epoch = e, .seq = q, .gen = g, .n = n, .me = UINT32_MAX, .ids = ep->ids };
    for (uint32_t i = 0; me && i < n; i++)
        if (strcmp(ep->ids[i], me) == 0)
            ep->me = i;
    return 0;
}

int fr_epoch_format(const fr_epoch *ep, char **out, size_t *len)
{
    size_t cap = 96 + (size_t)ep->n * (FR_MEMBER_ID + 1);
    char *b = malloc(cap);
    if (!b)
        return FERRY_ENOMEM;
    int l = snprintf(b, cap, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %u\n", ep->epoch, ep->seq,
                     ep->gen, ep->n);
    for (uint32_t i = 0; i < ep->n; i++)
        l += snprintf(b + l, cap - (size_t)l, "%.16s\n", ep->ids[i]);
    *out = b;
    *len = (size_t)l;
    return 0;
}

/* The epoch record: FERRY_ENOENT when there is none; *rev its revision. */
static int epoch_get(const fr_members *m, fr_epoch *ep, uint64_t *rev)
{
    char key[FR_KEY_MAX];
    key_of(m, key, sizeof key, "epoch", NULL);
    ferry_kv_value v = {0};
    memset(ep, 0, sizeof *ep);
    int rc = ferry_kv_get(m->s, key, &v, NULL);
    if (rc < 0)
        return rc;
    *rev = v.mod_rev;
    rc = fr_epoch_parse(v.val, v.len, m->id, ep);
    ferry_store_free(v.val);
    return rc;
}

static int epoch_cas(const fr_members *m, const fr_epoch *ep, uint64_t rev)
{
    char key[FR_KEY_MAX], *b = NULL;
    size_t len = 0;
    key_of(m, key, sizeof key, "epoch", NULL);
    int rc = fr_epoch_format(ep, &b, &len);
    if (rc == 0)
        rc = ferry_kv_cas(m->s, key, rev, b, len, NULL, NULL);
    free(b);
    return rc;
}

/* Whether everyone of ep took part in it or is gone; the ones still owing
 * it are probed at most every probe period (*next_probe), the dead dropped. */
static int epoch_over(fr_members *m, const fr_epoch *ep, uint64_t *next_probe, bool probe,
                      bool *over)
{
    mid *ids, *owe = calloc(ep->n ? ep->n : 1, sizeof *owe);
    uint32_t n, nowe = 0;
    uint64_t rev;
    int rc = owe ? list_get(m, &ids, &n, &rev) : FERRY_ENOMEM;
    if (rc < 0) {
        free(owe);
        return rc;
    }
    for (uint32_t i = 0; i < ep->n; i++) {
        uint64_t g, q;
        if (strcmp(ep->ids[i], m->id) == 0 || !has(ids, n, ep->ids[i]))
            continue;
        int r = rec_get(m, ep->ids[i], &g, &q);   /* unreadable: still owing (a gone member's
                                                    * record is deleted: ENOENT) */
        if ((r == 0 && q < ep->seq) || (r < 0 && r != FERRY_ENOENT))
            memcpy(owe[nowe++], ep->ids[i], sizeof owe[0]);
    }
    free(ids);
    *over = nowe == 0;
    if (nowe && probe && fr_now_ns() >= *next_probe) {
        mid *dead = calloc(nowe, sizeof *dead);
        uint32_t nd = 0;
        for (uint32_t i = 0; dead && i < nowe; i++)
            if (!alive(m, owe[i]))
                memcpy(dead[nd++], owe[i], sizeof dead[0]);
        bury(m, dead, nd);
        *over = dead && nd == nowe;
        free(dead);
        *next_probe = fr_now_ns() + m->probe_ms * 1000000u;
    }
    free(owe);
    return 0;
}

/* A new epoch after prev (NULL: the first): the live registered members
 * that do not hold gen, this one first if it is not listed. */
static int epoch_make(fr_members *m, const fr_epoch *prev, uint64_t gen, fr_epoch *ep)
{
    mid *ids, *dead = NULL;
    uint32_t n, nd = 0;
    uint64_t rev;
    int rc = list_get(m, &ids, &n, &rev);
    if (rc < 0)
        return rc;
    memset(ep, 0, sizeof *ep);
    ep->ids = calloc(n + 1, sizeof *ep->ids);
    dead = calloc(n + 1, sizeof *dead);
    if (!ep->ids || !dead)
        rc = FERRY_ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        uint64_t g = 0, q = 0;
        bool mine = strcmp(ids[i], m->id) == 0;
        if (!mine && rec_get(m, ids[i], &g, &q) == FERRY_ENOENT)
            continue;   /* joining or leaving right now: not of this update */
        if (!mine && g == gen)
            continue;   /* it holds the generation already */
        if (!mine && !alive(m, ids[i])) {
            memcpy(dead[nd++], ids[i], sizeof dead[0]);
            continue;
        }
        memcpy(ep->ids[ep->n++], ids[i], sizeof ep->ids[0]);
    }
    if (rc == 0 && !has(ep->ids, ep->n, m->id))
        memcpy(ep->ids[ep->n++], m->id, sizeof ep->ids[0]);
    free(ids);
    if (rc == 0)
        bury(m, dead, nd);
    free(dead);
    if (rc < 0) {
        fr_epoch_free(ep);
        return rc;
    }
    bool same = prev && prev->n == ep->n;
    for (uint32_t i = 0; same && i < ep->n; i++)
        same = strcmp(prev->ids[i], ep->ids[i]) == 0;
    ep->epoch = prev ? prev->epoch + !same : 1;
    ep->seq = prev ? prev->seq + 1 : 1;
    ep->gen = gen;
    for (uint32_t i = 0; i < ep->n; i++)
        if (strcmp(ep->ids[i], m->id) == 0)
            ep->me = i;
    return 0;
}

bool fr_members_owes(fr_members *m, uint64_t gen)
{
    fr_epoch r;
    uint64_t rev, next = UINT64_MAX;
    bool owes = false, over = true;
    if (epoch_get(m, &r, &rev) == 0 && r.gen == gen && r.me != UINT32_MAX && m->seq < r.seq)
        owes = r.n > 1 && epoch_over(m, &r, &next, false, &over) == 0 && !over;
    fr_epoch_free(&r);
    return owes;
}

static int waited_out(const fr_members *m, const fr_epoch *r, uint64_t gen, ferry_error *err)
{
    return fr_fail(err, FERRY_ETIMEDOUT, "subscriber: member %s waited for the update of its "
                   "group to generation %" PRIu64 " (update %" PRIu64 ", epoch %" PRIu64
                   ", %u members) to finish, to take the next one, and it has not; retry",
                   m->name, r ? r->gen : gen, r ? r->seq : 0, r ? r->epoch : 0, r ? r->n : 0);
}

int fr_members_epoch(fr_members *m, uint64_t gen, uint64_t deadline_ns, fr_epoch *ep,
                     ferry_error *err)
{
    ferry_watch *w = NULL;
    uint64_t next_probe = 0;
    int rc = ferry_kv_watch(m->s, m->prefix, 0, &w, NULL);
    for (; rc == 0;) {
        fr_epoch r;
        uint64_t rev = 0;
        int g = epoch_get(m, &r, &rev);
        if (g < 0 && g != FERRY_ENOENT) {
            rc = fr_fail(err, g, "subscriber: member %s cannot read its group's epoch: %s",
                         m->name, ferry_strerror(g));
            break;
        }
        bool have = g == 0;
        bool over = true;
        if (have && r.gen == gen && r.me != UINT32_MAX && m->seq < r.seq) {
            /* mine, not taken part in yet: unless the others are all
             * through with it (this member came too late for it) */
            rc = r.n > 1 ? epoch_over(m, &r, &next_probe, false, &over) : 0;
            if (rc == 0 && !(r.n > 1 && over)) {
                *ep = r;
                break;
            }
            m->seq = r.seq;   /* missed: the next one */
        }
        if (rc == 0 && have && r.gen == gen)   /* an update to gen without me: it ends first */
            rc = epoch_over(m, &r, &next_probe, true, &over);
        if (rc == 0 && over) {
            rc = epoch_make(m, have ? &r : NULL, gen, ep);
            if (rc == 0 && (rc = epoch_cas(m, ep, have ? rev : 0)) == 0) {
                fr_epoch_free(&r);
                break;
            }
            fr_epoch_free(ep);
            if (rc == FERRY_ESTATE)   /* someone else made it: read it */
                rc = 0;
        }
        uint64_t now = fr_now_ns();
        if (rc == 0 && now >= deadline_ns)
            rc = waited_out(m, have ? &r : NULL, gen, err);
        else if (rc < 0)
            fr_fail(err, rc, "subscriber: member %s: the group's membership: %s", m->name,
                    ferry_strerror(rc));
        fr_epoch_free(&r);
        if (rc < 0 || over)
            continue;
        /* wait for a change of the group's records, or the next probe */
        uint64_t left = (deadline_ns - now) / 1000000u, wait = left < m->probe_ms ? left : m->probe_ms;
        ferry_kv_event ev;
        int wr = ferry_watch_next(w, (int)(wait ? wait : 1), &ev, NULL);
        if (wr < 0 && wr != FERRY_ETIMEDOUT) {   /* watches end on compaction: poll instead */
            ferry_watch_close(w);
            w = NULL;
            nanosleep(&(struct timespec){ .tv_nsec = 50 * 1000000L }, NULL);
            rc = ferry_kv_watch(m->s, m->prefix, 0, &w, NULL);
        }
    }
    if (w)
        ferry_watch_close(w);
    else if (rc < 0 && err && !err->code)
        fr_fail(err, rc, "subscriber: member %s cannot watch its group: %s", m->name,
                ferry_strerror(rc));
    return rc;
}
