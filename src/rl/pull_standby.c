/* Standby copies of a subscriber's shards (weights.h,
 * ferry_subscriber_open_standby; docs/weights.md, "Standby copies").
 *
 * An update is the ordinary single-pull update with the shards' buffers
 * pointed at the copy that is not active: the demand record advertises
 * that copy's addresses and keys, so the member's own reads and every push
 * from the others land in it, and nothing of the update ever touches the
 * active copy. Only after the post-apply barrier (every byte landed on
 * every member) does `active` move, with one atomic store.
 *
 * Readers never lock: read_begin counts itself into the copy it saw
 * active, then looks again; if a flip came in between, it counts itself
 * out and retries. An update looks at the target copy's count only after
 * the flip that made it the standby copy, so (every access sequentially
 * consistent) a reader either is counted before that look, and the update
 * waits for it, or sees the flip and moves to the new copy: nobody reads a
 * copy that is being written. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "rl/pull_int.h"

/* ---- open / close ------------------------------------------------------------------------ */

void fr_standby_free(fr_standby *sb)
{
    if (!sb)
        return;
    fr_rl_spans_free(&sb->spans);
    fr_sub_cache_free(&sb->pc);
    free(sb->bufs[0]);
    free(sb->bufs[1]);
    free(sb);
}

int ferry_subscriber_open_standby(ferry_store *s, const ferry_subscriber_config *cfg,
                                  const ferry_param_shard *shards, void *const *standby, size_t n,
                                  ferry_standby_flip_fn on_flip, void *ctx,
                                  ferry_subscriber **out, ferry_error *err)
{
    if (!out || (n && !standby))
        return fr_fail(err, FERRY_EINVAL, "subscriber: bad arguments (standby copies)");
    for (size_t i = 0; i < n; i++)
        if (shards && (!standby[i] || standby[i] == shards[i].dst))
            return fr_fail(err, FERRY_EINVAL, "subscriber: shard %zu (%s): the standby copy "
                           "must be a buffer of its own", i,
                           shards[i].tensor ? shards[i].tensor : "(null)");
    fr_standby *sb = calloc(1, sizeof *sb);
    if (sb) {
        sb->bufs[0] = calloc(n ? n : 1, sizeof *sb->bufs[0]);
        sb->bufs[1] = calloc(n ? n : 1, sizeof *sb->bufs[1]);
    }
    if (!sb || !sb->bufs[0] || !sb->bufs[1]) {
        fr_standby_free(sb);
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    }
    int rc = ferry_subscriber_open(s, cfg, shards, n, out, err);
    if (rc < 0) {
        fr_standby_free(sb);
        return rc;
    }
    fr_sub_advise(shards, standby, n);
    sb->n = n;
    for (size_t i = 0; i < n; i++) {
        sb->bufs[0][i] = shards[i].dst;
        sb->bufs[1][i] = standby[i];
    }
    sb->fn = on_flip;
    sb->ctx = ctx;
    fr_subscriber_set_standby(*out, sb);
    return 0;
}

/* ---- readers ------------------------------------------------------------------------------- */

static void view_of(const fr_standby *sb, uint32_t c, ferry_standby_view *v)
{
    *v = (ferry_standby_view){ .copy = c, .generation = atomic_load(&sb->gen[c]),
                               .bufs = sb->bufs[c], .n = sb->n };
}

int ferry_subscriber_read_begin(ferry_subscriber *sub, ferry_standby_view *v)
{
    fr_standby *sb = sub ? fr_subscriber_standby(sub) : NULL;
    if (!sb || !v)
        return FERRY_EINVAL;
    for (;;) {
        uint32_t c = atomic_load(&sb->active);
        atomic_fetch_add(&sb->readers[c], 1);
        if (atomic_load(&sb->active) == c) {
            view_of(sb, c, v);
            return 0;
        }
        atomic_fetch_sub(&sb->readers[c], 1);   /* flipped meanwhile: the new one */
    }
}

void ferry_subscriber_read_end(ferry_subscriber *sub, const ferry_standby_view *v)
{
    fr_standby *sb = sub ? fr_subscriber_standby(sub) : NULL;
    if (!sb || !v || v->copy > 1)
        return;
    /* never below 0: an unpaired read_end must not make every later
     * update wait for a reader that is not there */
    uint64_t n = atomic_load(&sb->readers[v->copy]);
    while (n && !atomic_compare_exchange_weak(&sb->readers[v->copy], &n, n - 1))
        ;
}

int ferry_subscriber_active_view(const ferry_subscriber *sub, ferry_standby_view *v)
{
    const fr_standby *sb = sub ? fr_subscriber_standby(sub) : NULL;
    if (!sb || !v)
        return FERRY_EINVAL;
    view_of(sb, atomic_load(&sb->active), v);
    return 0;
}

/* ---- the update's side --------------------------------------------------------------------- */

typedef struct sb_iv { uintptr_t a, e; uint32_t copy; size_t shard; } sb_iv;

static int by_start(const void *x, const void *y)
{
    const sb_iv *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* The two copies share no byte (shards of one copy may: they share a
 * region). Every interval is checked against the furthest end of the
 * other copy's intervals that start before it. */
static int check_disjoint(const fr_standby *sb, const fr_gen *g, const ferry_param_shard *shards,
                          ferry_error *err)
{
    sb_iv *v = malloc((sb->n ? 2 * sb->n : 1) * sizeof *v);
    if (!v)
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < sb->n && rc == 0; i++) {
        int ti = ferry_manifest_find_tensor(g->m, shards[i].tensor);
        if (ti < 0)
            continue;   /* register_shards names it */
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(g->m, (uint32_t)ti, &d);
        for (uint32_t c = 0; c < 2 && rc == 0; c++) {
            ferry_param_shard p = shards[i];
            p.dst = sb->bufs[c][i];
            uint64_t len = 0;
            rc = fr_rl_shard_check(&p, &d, &len, err);
            if (rc == 0 && len)
                v[m++] = (sb_iv){ (uintptr_t)p.dst, (uintptr_t)p.dst + len, c, i };
        }
    }
    qsort(v, m, sizeof *v, by_start);
    uintptr_t end[2] = { 0, 0 };
    for (size_t k = 0; k < m && rc == 0; k++) {
        if (v[k].a < end[1 - v[k].copy])
            rc = fr_fail(err, FERRY_EINVAL, "subscriber: shard %zu (%s): its %s copy overlaps "
                         "the other copy of the parameters", v[k].shard,
                         shards[v[k].shard].tensor, v[k].copy ? "standby" : "first");
        if (v[k].e > end[v[k].copy])
            end[v[k].copy] = v[k].e;
    }
    free(v);
    return rc;
}

/* Until nobody reads copy c, at most timeout_ms. */
static int wait_readers(fr_standby *sb, uint32_t c, uint64_t timeout_ms, ferry_error *err)
{
    uint64_t t0 = fr_now_ns(), deadline = t0 + timeout_ms * 1000000u;
    long pause_ns = 20000;
    while (atomic_load(&sb->readers[c]) != 0) {
        if (fr_now_ns() >= deadline)
            return fr_fail(err, FERRY_ETIMEDOUT, "subscriber: %" PRIu64 " reader(s) still "
                           "hold the standby copy (generation %" PRIu64 ") after %" PRIu64
                           " ms; nothing was written", (uint64_t)atomic_load(&sb->readers[c]),
                           (uint64_t)atomic_load(&sb->gen[c]), timeout_ms);
        struct timespec ts = { 0, pause_ns };
        nanosleep(&ts, NULL);   /* a reader's step, not a busy core */
        if (pause_ns < 1000000)
            pause_ns *= 2;
    }
    return 0;
}

static void swap_spans(fr_rl_spans *a, fr_rl_spans *b)
{
    fr_rl_spans t = *a;
    *a = *b;
    *b = t;
}

static void swap_cache(fr_sub_cache *a, fr_sub_cache *b)
{
    fr_sub_cache t = *a;
    *a = *b;
    *b = t;
}

int fr_standby_begin(fr_standby *sb, const fr_gen *g, ferry_param_shard *shards,
                     fr_rl_spans *spans, fr_sub_cache *pc, uint64_t timeout_ms,
                     ferry_error *err)
{
    uint32_t target = 1 - atomic_load(&sb->active);
    if (!sb->checked) {
        int rc = check_disjoint(sb, g, shards, err);
        if (rc < 0)
            return rc;
        sb->checked = true;
    }
    /* half the group's timeout: the others, waiting at the demand barrier
     * for this member, hear why before their own wait ends */
    int rc = wait_readers(sb, target, timeout_ms / 2, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < sb->n; i++)
        shards[i].dst = sb->bufs[target][i];
    if (sb->held != target) {   /* the target's registration and plan in use, the other's kept */
        swap_spans(spans, &sb->spans);
        swap_cache(pc, &sb->pc);
        sb->held = target;
    }
    return 0;
}

void fr_standby_flip(fr_standby *sb, uint64_t gen)
{
    uint32_t target = 1 - atomic_load(&sb->active);
    atomic_store(&sb->gen[target], gen);
    atomic_store(&sb->active, target);
    if (sb->fn) {
        ferry_standby_view v;
        view_of(sb, target, &v);
        sb->fn(sb->ctx, &v);
    }
}

void fr_standby_failed(const fr_standby *sb, ferry_error *err)
{
    if (!err)
        return;
    uint32_t a = atomic_load(&sb->active);
    char tail[160];
    int k = snprintf(tail, sizeof tail, "; nothing flipped: the active copy (%u) still holds "
                     "generation %" PRIu64, a, (uint64_t)atomic_load(&sb->gen[a]));
    size_t have = strlen(err->msg);
    if (k > 0 && have + (size_t)k < sizeof err->msg)
        memcpy(err->msg + have, tail, (size_t)k + 1);
}
