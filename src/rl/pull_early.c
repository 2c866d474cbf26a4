/* Overlapped updates (weights.h, ferry_subscriber_update_next; docs/weights.md,
 * "Overlapped updates"): a standby group pulls generation N while the
 * trainers are still publishing it.
 *
 * In the steady state generation N keeps the layout of the generation the
 * group holds (N-1, or whichever it took last): the same stored placement,
 * packed into the same objects per trainer rank, under keys that differ
 * only in the generation's number. So the group plans N on the held
 * generation's layout, exchanges its demands and plans while the trainers
 * convert and store, and starts reading as soon as every trainer rank has
 * left its part (ferry/wk/M/N/part/R, written once the rank's objects are
 * all stored). It writes the standby copy only. Nothing flips until member
 * 0 has seen, after every member's reads ended:
 *
 *   - every member's apply succeeded (each leaves its outcome before the
 *     post-apply barrier);
 *   - every trainer rank's part is the one read (same revision): a rank
 *     whose attempt failed deletes its part before it removes its objects,
 *     so an unchanged part means its objects were whole during the reads;
 *   - generation N announced, and its manifest (checked against the
 *     announced digest) has the held layout and, per rank, the checksums
 *     hash and object count of the part the reads followed.
 *
 * It writes its verdict under the group's key; every member flips on "ok",
 * or falls back on "redo": a plain update once N is announced. A
 * generation that is never announced is never flipped to. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/pull_int.h"

struct fr_early {
    ferry_subscriber *sub;
    ferry_store *s;
    const char *model;
    uint64_t next;
    const fr_gen *gs;            /* the plan's generation (NULL: this member cannot) */
    uint32_t nranks;             /* trainer ranks */
    uint64_t *rev;               /* per rank: its part's revision as read */
    uint64_t *sums;              /* its checksums hash */
    uint32_t *nobj;
    uint64_t deadline;           /* ns */
    char tag[48];                /* "<next>.<release of the demand barrier>": names the round's
                                  * values ("": the group never met) */
};

void fr_early_round_id(fr_early *ea, uint64_t release)
{
    snprintf(ea->tag, sizeof ea->tag, "%" PRIu64 ".%" PRIu64, ea->next, release);
}

/* The group's keys of overlapped rounds, one per member's outcome and
 * one verdict, overwritten round after round: each value starts with the
 * round's tag (the generation and the release number of the round's
 * demand barrier, new for every round). */
static void early_key(char *out, size_t cap, const ferry_subscriber *sub, const char *what)
{
    const ferry_subscriber_config *c = fr_sub_config(sub);
    (void)fr_key_early(out, cap, c->model, c->group, what);
}

/* "ok 2\n<digest> <objects> <segment> <sums hash>": the part of a rank that
 * stored everything. */
static bool part_ok(const ferry_kv_value *v, uint32_t *nobj, uint64_t *seg, uint64_t *sums)
{
    char line[400], hex[40];
    unsigned no;
    unsigned long long sg, sh;
    snprintf(line, sizeof line, "%.*s", (int)(v->len < sizeof line ? v->len : sizeof line - 1),
             (const char *)v->val);
    if (strncmp(line, "ok 2\n", 5) != 0 || sscanf(line + 5, "%39s %u %llu %llx", hex, &no, &sg,
                                                   &sh) != 4)
        return false;
    *nobj = no;
    *seg = sg;
    *sums = sh;
    return true;
}

int fr_early_wait(fr_early *ea, ferry_error *err)
{
    char prefix[FR_KEY_MAX], k[FR_KEY_MAX];
    (void)fr_key_wk_part(prefix, sizeof prefix, ea->model, ea->next, -1);
    ferry_watch *w = NULL;
    int rc = ferry_kv_watch(ea->s, prefix, 0, &w, err);
    if (rc < 0)
        return fr_fail(err, rc, "subscriber: cannot watch the trainers' parts of generation %"
                       PRIu64 ": %s", ea->next, fr_why(err, rc));
    bool *have = calloc(ea->nranks ? ea->nranks : 1, sizeof *have);
    if (!have) {
        ferry_watch_close(w);
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    }
    uint32_t missing = ea->nranks;
    while (rc == 0) {
        for (uint32_t r = 0; r < ea->nranks && rc == 0; r++) {
            if (have[r])
                continue;
            (void)fr_key_wk_part(k, sizeof k, ea->model, ea->next, r);
            ferry_kv_value v = {0};
            uint64_t seg = 0;
            if (ferry_kv_get(ea->s, k, &v, NULL) == 0 && part_ok(&v, &ea->nobj[r], &seg, &ea->sums[r])) {
                have[r] = true;
                missing--;
                ea->rev[r] = v.mod_rev;
                if (ea->nobj[r] != ea->gs->ranks[r].nobjects)
                    rc = fr_fail(err, FERRY_ESTATE, "subscriber: trainer rank %u stores "
                                 "generation %" PRIu64 " in %u objects, not %u: its layout "
                                 "changed", r, ea->next, ea->nobj[r],
                                 ea->gs->ranks[r].nobjects);
            }
            ferry_store_free(v.val);
        }
        if (rc < 0 || missing == 0)
            break;
        int left = fr_ms_left(ea->deadline);
        ferry_kv_event ev;
        rc = left == 0 ? FERRY_ETIMEDOUT : ferry_watch_next(w, left, &ev, NULL);
        if (rc == FERRY_ETIMEDOUT)
            rc = fr_fail(err, rc, "subscriber: %u of %u trainer ranks had not stored their "
                         "part of generation %" PRIu64 " in time", missing, ea->nranks,
                         ea->next);
        else if (rc < 0)
            rc = fr_fail(err, rc, "subscriber: watching the trainers' parts: %s",
                         ferry_strerror(rc));
    }
    ferry_watch_close(w);
    free(have);
    return rc;
}

void fr_early_outcome(fr_early *ea, int rc)
{
    char k[FR_KEY_MAX], what[32], v[64];
    snprintf(what, sizeof what, "out/%u", fr_sub_config(ea->sub)->rank);
    early_key(k, sizeof k, ea->sub, what);
    if (!ea->tag[0])
        return;   /* the group never met: nobody waits for it */
    int n = rc == 0 ? snprintf(v, sizeof v, "%s ok", ea->tag)
                    : snprintf(v, sizeof v, "%s failed %d", ea->tag, rc);
    (void)ferry_kv_put(ea->s, k, v, (size_t)n, NULL, NULL);
}

/* Until key holds a value of round `tag` ("<tag> <rest>"; <rest> copied
 * to buf), at most until deadline. */
static int wait_key(ferry_store *s, const char *key, const char *tag, uint64_t deadline, char *buf,
                    size_t cap)
{
    size_t tl = strlen(tag);
    ferry_watch *w = NULL;
    int rc = ferry_kv_watch(s, key, 0, &w, NULL);
    while (rc == 0) {
        ferry_kv_value v = {0};
        if (ferry_kv_get(s, key, &v, NULL) == 0) {
            const char *t = v.val;
            bool mine = v.len > tl && !memcmp(t, tag, tl) && t[tl] == ' ';
            if (mine)
                snprintf(buf, cap, "%.*s", (int)(v.len - tl - 1), t + tl + 1);
            ferry_store_free(v.val);
            if (mine)
                break;
        }
        int left = fr_ms_left(deadline);
        ferry_kv_event ev;
        rc = left == 0 ? FERRY_ETIMEDOUT : ferry_watch_next(w, left, &ev, NULL);
    }
    ferry_watch_close(w);
    return rc;
}

/* Member 0's verdict on the round (its own outcome my_rc): "ok" or
 * "redo <why>". */
static void decide(fr_early *ea, int my_rc, const ferry_error *my_err, char *out, size_t cap)
{
    const ferry_subscriber_config *c = fr_sub_config(ea->sub);
    char k[FR_KEY_MAX], v[128];
    if (my_rc < 0) {
        snprintf(out, cap, "redo member 0: %s", my_err->msg);
        return;
    }
    for (uint32_t m = 0; m < c->world; m++) {
        char what[32];
        snprintf(what, sizeof what, "out/%u", m);
        early_key(k, sizeof k, ea->sub, what);
        if (wait_key(ea->s, k, ea->tag, ea->deadline, v, sizeof v) < 0) {
            snprintf(out, cap, "redo member %u left no outcome", m);
            return;
        }
        if (strcmp(v, "ok") != 0) {
            snprintf(out, cap, "redo member %u %s", m, v);
            return;
        }
    }
    for (uint32_t r = 0; r < ea->nranks; r++) {
        (void)fr_key_wk_part(k, sizeof k, ea->model, ea->next, r);
        ferry_kv_value pv = {0};
        int rc = ferry_kv_get(ea->s, k, &pv, NULL);
        ferry_store_free(pv.val);
        if (rc < 0 || pv.mod_rev != ea->rev[r]) {
            snprintf(out, cap, "redo trainer rank %u's part changed while it was read (an "
                     "attempt failed)", r);
            return;
        }
    }
    uint64_t active = 0;
    ferry_error e = {0};
    int left = fr_ms_left(ea->deadline);
    int rc = ferry_weights_wait_active(ea->s, ea->model, ea->next, left ? left : 1, &active, &e);
    if (rc < 0 || active != ea->next) {
        snprintf(out, cap, "redo %s", rc < 0 ? e.msg : "a newer generation was announced");
        return;
    }
    fr_gen *g = NULL;
    rc = fr_gen_load(ea->s, ea->model, ea->next, &g, &e);
    bool same = rc == 0 && !memcmp(g->placement, ea->gs->placement, sizeof g->placement) &&
                g->nranks == ea->nranks;
    for (uint32_t r = 0; same && r < ea->nranks; r++)
        same = g->ranks[r].nobjects == ea->nobj[r] && g->ranks[r].sums_hash == ea->sums[r];
    fr_gen_free(g);
    if (!same)
        snprintf(out, cap, "redo %s", rc < 0 ? e.msg : "the announced generation is not the one read");
    else
        snprintf(out, cap, "ok");
}

/* The held generation with next's keys: the plan's generation. */
static int spec_gen(const fr_gen *held, uint64_t next, fr_gen *gs)
{
    *gs = *held;
    gs->generation = next;
    gs->ranks = calloc(held->nranks ? held->nranks : 1, sizeof *gs->ranks);
    if (!gs->ranks)
        return FERRY_ENOMEM;
    for (uint32_t r = 0; r < held->nranks; r++) {
        fr_gen_rank *d = &gs->ranks[r];
        const fr_gen_rank *h = &held->ranks[r];
        *d = (fr_gen_rank){ .segment = h->segment, .nobjects = h->nobjects,
                            .sums_hash = h->sums_hash };
        d->keys = calloc(h->nobjects ? h->nobjects : 1, sizeof *d->keys);
        if (!d->keys)
            return FERRY_ENOMEM;
        for (uint32_t k = 0; k < h->nobjects; k++) {
            char key[FR_KEY_MAX];
            if (fr_key_gen_object(key, sizeof key, held->model, next, r, k) < 0 ||
                !(d->keys[k] = strdup(key)))
                return FERRY_ENOMEM;
        }
    }
    return 0;
}

static void spec_free(fr_gen *gs, uint32_t nranks)
{
    for (uint32_t r = 0; gs->ranks && r < nranks; r++) {
        for (uint32_t k = 0; gs->ranks[r].keys && k < gs->ranks[r].nobjects; k++)
            free(gs->ranks[r].keys[k]);
        free(gs->ranks[r].keys);
    }
    free(gs->ranks);
    gs->ranks = NULL;
}

/* A plain update of next, once it is announced. */
static int plain(ferry_subscriber *sub, uint64_t next, uint64_t deadline, uint64_t *generation,
                 ferry_update_stats *st, ferry_error *err)
{
    const ferry_subscriber_config *c = fr_sub_config(sub);
    uint64_t active = 0;
    int left = fr_ms_left(deadline);
    ferry_error e = {0};
    int rc = ferry_weights_wait_active(fr_sub_store(sub), c->model, next, left ? left : 1, &active,
                                       &e);
    if (rc == FERRY_ETIMEDOUT)
        return fr_fail(err, rc, "subscriber: generation %" PRIu64 " of %s was not announced "
                       "within %" PRIu64 " ms (the active one is %" PRIu64 "); nothing "
                       "flipped: the group still holds generation %" PRIu64, next, c->model,
                       c->timeout_ms, active, *generation);
    if (rc < 0)
        return fr_fail(err, rc, "%s", e.msg);
    return fr_sub_update_round(sub, generation, st, err);
}

int ferry_subscriber_update_next(ferry_subscriber *sub, uint64_t next, uint64_t *generation,
                                 bool *overlapped, ferry_update_stats *st, ferry_error *err)
{
    ferry_update_stats local = {0};
    bool ov = false;
    if (!st)
        st = &local;
    if (!overlapped)
        overlapped = &ov;
    memset(st, 0, sizeof *st);
    *overlapped = false;
    if (!sub || !generation || next == 0)
        return fr_fail(err, FERRY_EINVAL, "subscriber: bad arguments");
    fr_sub_unfence(sub);   /* peers an earlier failed update left fenced (pull.c) */
    const ferry_subscriber_config *c = fr_sub_config(sub);
    uint64_t f0 = fr_minor_faults(), t0 = fr_now_ns();
    uint64_t tmo = c->timeout_ms;
    uint64_t deadline = fr_deadline_ns((int64_t)tmo);
    int rc;
    if (!fr_sub_can_overlap(sub)) {
        rc = plain(sub, next, deadline, generation, st, err);
        goto out;
    }
    fr_gen *held = fr_sub_held(sub);
    ferry_error why = {0};
    fr_gen gs = {0};
    uint32_t nr = held ? held->nranks : 0;
    fr_early ea = { .sub = sub, .s = fr_sub_store(sub), .model = c->model, .next = next,
                    .nranks = nr, .deadline = deadline };
    ea.rev = calloc(nr ? nr : 1, sizeof *ea.rev);
    ea.sums = calloc(nr ? nr : 1, sizeof *ea.sums);
    ea.nobj = calloc(nr ? nr : 1, sizeof *ea.nobj);
    if (!ea.rev || !ea.sums || !ea.nobj)
        fr_fail(&why, FERRY_ENOMEM, "out of memory");
    else if (!held)
        fr_fail(&why, FERRY_ESTATE, "it holds no generation to plan on (a group's first "
                "update is a plain one)");
    else if (next <= held->generation)
        fr_fail(&why, FERRY_ESTATE, "it holds generation %" PRIu64 " already",
                held->generation);
    else if (spec_gen(held, next, &gs) < 0)
        fr_fail(&why, FERRY_ENOMEM, "out of memory");
    else
        ea.gs = &gs;
    ferry_update_stats est = {0};
    ferry_error rerr = {0};
    int rrc = fr_sub_early_round(sub, &ea, ea.gs, next, &why, &est, &rerr);
    char verdict[sizeof rerr.msg + 64], k[FR_KEY_MAX];
    early_key(k, sizeof k, sub, "verdict");
    if (!ea.tag[0]) {   /* the group never met: no verdict to wait for */
        snprintf(verdict, sizeof verdict, "lost");
    } else if (c->rank == 0) {
        int n = snprintf(verdict, sizeof verdict, "%s ", ea.tag);
        decide(&ea, rrc, &rerr, verdict + n, sizeof verdict - (size_t)n);
        (void)ferry_kv_put(ea.s, k, verdict, strlen(verdict), NULL, NULL);
        memmove(verdict, verdict + n, strlen(verdict + n) + 1);
    } else if (wait_key(ea.s, k, ea.tag, deadline, verdict, sizeof verdict) < 0) {
        snprintf(verdict, sizeof verdict, "lost");
    }
    if (strcmp(verdict, "ok") == 0) {
        /* the held layout now names next's objects */
        for (uint32_t r = 0; r < nr; r++) {
            fr_gen_rank t = held->ranks[r];
            held->ranks[r].keys = gs.ranks[r].keys;
            held->ranks[r].sums_hash = ea.sums[r];
            gs.ranks[r].keys = t.keys;
            free(held->ranks[r].sums);
            held->ranks[r].sums = NULL;
            held->ranks[r].nsums = 0;
        }
        held->generation = next;
        fr_sub_early_took(sub, next);
        *generation = next;
        *st = est;
        st->generation = next;
        *overlapped = true;
        rc = 0;
    } else if (strcmp(verdict, "lost") == 0) {
        rc = ea.tag[0] ? fr_fail(err, FERRY_ETIMEDOUT, "subscriber: member 0 of group %s gave "
                                 "no verdict on generation %" PRIu64 " within %" PRIu64
                                 " ms; nothing flipped", c->group, next, tmo)
                       : fr_fail(err, rrc < 0 ? rrc : FERRY_EIO, "%s; nothing flipped",
                                 rerr.msg);
    } else {
        FR_INFO("rl", "group %s: generation %" PRIu64 " not overlapped (%s): a plain update",
                c->group, next, verdict + 5);
        rc = plain(sub, next, deadline, generation, st, err);
    }
    spec_free(&gs, nr);
    free(ea.rev);
    free(ea.sums);
    free(ea.nobj);
out:
    st->faults = fr_minor_faults() - f0;
    st->total_s = (double)(fr_now_ns() - t0) / 1e9;
    return rc;
}
