/* fault transport: a wrapper around a peer's real transport that injects
 * failures, for tests (enabled by ferry_engine_config.fault / FERRY_FAULT).
 *
 * It can fail a post (the chunks never move: ABORTED), turn successful
 * completions into failures after N (bytes moved: FAILED_DRAINED), delay
 * every completion, or drop the connection after N posted chunks (every
 * chunk in flight then fails; the next submit reconnects). Completions are
 * intercepted through fr_chunk.intercept, so the engine above runs its real
 * ticket, notify and fence logic on what it sees.
 *
 * Every count is of chunks, and the engine cuts ops for the transport
 * underneath (p->inner_tp): a strided op is one chunk per group of rows
 * (up to the chunk size over shm; up to 512 rows and the chunk size over
 * tcp, one row at a time when the remote rows overlap), so a fault hits a
 * whole group of rows at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"

#define OFF UINT64_MAX

typedef struct delayed {
    fr_chunk *c;
    int status;
    bool touched;
    uint64_t due_ns;
    struct delayed *next;
} delayed;

struct fr_fault {
    uint64_t post_fail_after, complete_fail_after, delay_ms;
    bool map_fail;                       /* ferry_remote_map refused (FERRY_ENOTSUP) */
    _Atomic uint64_t drop_after;         /* one-shot: OFF once it fired */
    _Atomic uint64_t posts, completions, posted_chunks;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    delayed *head, *tail;                /* due times are non-decreasing */
    bool stopping;
    pthread_t th;
    bool has_thread;
};

typedef struct fault_conn {
    fr_fault *f;
    const fr_transport *inner;
    void *ic;
    atomic_bool dropped;
} fault_conn;

/* ---- spec --------------------------------------------------------------- */

#define FAULT_KEYS "post_fail_after, complete_fail_after, delay_ms, drop_after, map_fail"

static int parse(const char *spec, fr_fault *f, ferry_error *err)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return fr_fail(err, FERRY_EINVAL, "bad fault spec \"%s\": \"%s\" is not KEY=N (keys: " FAULT_KEYS ")",
                           spec, tok);
        *eq = 0;
        char *end;
        unsigned long long v = strtoull(eq + 1, &end, 10);
        if (*end || eq[1] == 0)
            return fr_fail(err, FERRY_EINVAL, "bad fault spec \"%s\": %s=%s: the value is not a number", spec,
                           tok, eq + 1);
        if (!strcmp(tok, "post_fail_after"))
            f->post_fail_after = v;
        else if (!strcmp(tok, "complete_fail_after"))
            f->complete_fail_after = v;
        else if (!strcmp(tok, "delay_ms"))
            f->delay_ms = v;
        else if (!strcmp(tok, "drop_after"))
            atomic_store(&f->drop_after, v);
        else if (!strcmp(tok, "map_fail"))
            f->map_fail = v != 0;
        else
            return fr_fail(err, FERRY_EINVAL, "bad fault spec \"%s\": unknown key \"%s\" (keys: " FAULT_KEYS ")",
                           spec, tok);
    }
    return 0;
}

/* ---- delayed completions -------------------------------------------------- */

static void *delay_main(void *arg)
{
    fr_fault *f = arg;
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (!f->head && !f->stopping)
            pthread_cond_wait(&f->cond, &f->lock);
        if (!f->head)
            break;
        delayed *d = f->head;
        if (!f->stopping && fr_now_ns() < d->due_ns) {
            struct timespec ts = fr_timespec_at(d->due_ns);
            pthread_cond_timedwait(&f->cond, &f->lock, &ts);
            continue;
        }
        f->head = d->next;
        if (!f->head)
            f->tail = NULL;
        pthread_mutex_unlock(&f->lock);
        fr_chunk_done(d->c, d->status, d->touched);
        fr_free(d);
        pthread_mutex_lock(&f->lock);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

static void deliver(fr_fault *f, fr_chunk *c, int status, bool touched)
{
    delayed *d = f->delay_ms && f->has_thread ? fr_calloc(1, sizeof *d) : NULL;
    if (!d) {
        fr_chunk_done(c, status, touched);
        return;
    }
    *d = (delayed){.c = c, .status = status, .touched = touched,
                   .due_ns = fr_now_ns() + f->delay_ms * 1000000ull};
    pthread_mutex_lock(&f->lock);
    if (f->tail)
        f->tail->next = d;
    else
        f->head = d;
    f->tail = d;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

/* The inner transport completed c: apply the faults, then complete it. */
static void fault_done(fr_chunk *c, int status, bool touched)
{
    fault_conn *fc = c->intercept_arg;
    fr_fault *f = fc->f;
    uint64_t n = atomic_fetch_add(&f->completions, 1) + 1;
    if (status == 0 && f->complete_fail_after != OFF && n > f->complete_fail_after)
        status = FERRY_EIO;                  /* the bytes moved; the report says failed */
    if (status == 0 && atomic_load(&fc->dropped))
        status = FERRY_ECONNRESET;
    deliver(f, c, status, touched);
}

int fr_fault_create(const char *spec, fr_fault **out, ferry_error *err)
{
    fr_fault *f = fr_calloc(1, sizeof *f);
    if (!f)
        return fr_fail(err, FERRY_ENOMEM, "fault injection: out of memory");
    f->post_fail_after = f->complete_fail_after = OFF;
    atomic_init(&f->drop_after, OFF);
    int rc = parse(spec, f, err);
    if (rc < 0) {
        fr_free(f);
        return rc;
    }
    pthread_mutex_init(&f->lock, NULL);
    fr_cond_init_monotonic(&f->cond);
    f->has_thread = f->delay_ms > 0 && pthread_create(&f->th, NULL, delay_main, f) == 0;
    *out = f;
    return 0;
}

void fr_fault_destroy(fr_fault *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->lock);
    f->stopping = true;   /* the thread delivers what is left, then exits */
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    if (f->has_thread)
        pthread_join(f->th, NULL);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->cond);
    fr_free(f);
}

/* ---- the wrapper ops -------------------------------------------------------- */

static int fault_connect(ferry_engine *e, fr_peer *p, void **out, ferry_error *err)
{
    fault_conn *fc = fr_calloc(1, sizeof *fc);
    if (!fc)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    fc->f = e->fault;
    fc->inner = p->inner_tp;
    int rc = fc->inner->connect(e, p, &fc->ic, err);
    if (rc < 0) {
        fr_free(fc);
        return rc;
    }
    *out = fc;
    return 0;
}

static int fault_post(void *conn, fr_chunk **chunks, size_t n)
{
    fault_conn *fc = conn;
    fr_fault *f = fc->f;
    if (atomic_load(&fc->dropped))
        return FERRY_ECONNRESET;
    uint64_t k = atomic_fetch_add(&f->posts, 1) + 1;
    if (f->post_fail_after != OFF && k > f->post_fail_after)
        return FERRY_EIO;                    /* nothing taken: the engine fails them untouched */
    uint64_t total = atomic_fetch_add(&f->posted_chunks, n) + n;
    uint64_t drop = atomic_load(&f->drop_after);
    if (drop != OFF && total > drop && atomic_compare_exchange_strong(&f->drop_after, &drop, OFF)) {
        FR_WARN("fault", "dropping the connection after %llu chunks", (unsigned long long)drop);
        atomic_store(&fc->dropped, true);   /* what is in flight now fails */
    }
    for (size_t i = 0; i < n; i++) {
        chunks[i]->intercept = fault_done;
        chunks[i]->intercept_arg = fc;
    }
    int rc = fc->inner->post(fc->ic, chunks, n);
    if (rc < 0)
        for (size_t i = 0; i < n; i++)
            chunks[i]->intercept = NULL;
    return rc;
}

static void fault_disconnect(void *conn)
{
    fault_conn *fc = conn;
    fc->inner->disconnect(fc->ic);   /* completes everything through fault_done */
    fr_free(fc);
}

static bool fault_alive(void *conn)
{
    fault_conn *fc = conn;
    return !atomic_load(&fc->dropped) && fc->inner->alive(fc->ic);
}

static int fault_map(void *conn, uint64_t key, uint64_t addr, uint64_t len, ferry_mapping *out)
{
    fault_conn *fc = conn;
    if (atomic_load(&fc->dropped))
        return FERRY_ECONNRESET;
    if (fc->f->map_fail)
        return FERRY_ENOTSUP;   /* as for a peer whose memory cannot be mapped */
    return fc->inner->map ? fc->inner->map(fc->ic, key, addr, len, out) : FERRY_ENOTSUP;
}

static int fault_warm(void *conn, uint64_t key, uint64_t addr, uint64_t len, bool write,
                      uint64_t *touched)
{
    fault_conn *fc = conn;
    *touched = 0;
    if (!fault_alive(conn))
        return FERRY_ECONNRESET;
    return fc->inner->warm ? fc->inner->warm(fc->ic, key, addr, len, write, touched) : 0;
}

const fr_transport fr_transport_fault = {
    .name = "fault",
    .bit = 0,
    .max_chunk = 0,
    .start = NULL,     /* client-side only: the real transports serve */
    .stop = NULL,
    .connect = fault_connect,
    .post = fault_post,
    .disconnect = fault_disconnect,
    .alive = fault_alive,
    .map = fault_map,
    .warm = fault_warm,
};
