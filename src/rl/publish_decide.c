/* The decision of one publish attempt (publish.c): the coordinator's
 * gather, claim and announcement, and the other ranks' wait for it.
 *
 * An attempt is numbered by the release of the generation's barrier (A:
 * every rank released together gets the same number; a retry gets a new
 * one), and its decision lives in the generation's status key as
 * "A deciding", "A ok" or "A failed <code> <why>". A status of another
 * attempt (an earlier failed one) is never taken for this one's.
 *
 * One decision per attempt: the coordinator claims it with a
 * compare-and-swap ("A deciding", or straight to "A failed ..."), and a
 * rank that waited timeout_ms in vain writes "A failed <timed out> the
 * coordinator (rank 0) gave no decision ..." with a compare-and-swap too
 * (over nothing, an earlier attempt's status, or "A deciding"), so either
 * the coordinator decides or the waiting ranks do, and every rank returns
 * what the status says. A coordinator that claimed announces only within
 * half of timeout_ms of the barrier, and writes its decision over its own
 * claim only: a waiting rank that finds "A deciding" at its deadline with
 * nothing announced may decide the attempt failed. (Left open: an
 * announcing compare-and-swap sent in time but applied by the master more
 * than half the timeout later.)
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

enum { ST_NONE, ST_DECIDING, ST_OK, ST_FAILED };

typedef struct status {
    uint64_t rev;        /* the key's mod revision (0: absent) */
    uint64_t attempt;
    int kind;            /* ST_NONE: absent, unreadable or of no attempt */
    int code;
    char why[600];
} status;

static void parse_status(const char *v, size_t len, status *st)
{
    char buf[700];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), v);
    char *e = NULL;
    st->kind = ST_NONE;
    st->attempt = strtoull(buf, &e, 10);
    if (e == buf || *e != ' ')
        return;
    e++;
    if (!strcmp(e, "deciding")) {
        st->kind = ST_DECIDING;
    } else if (!strcmp(e, "ok")) {
        st->kind = ST_OK;
    } else if (!strncmp(e, "failed ", 7)) {
        char *w = NULL;
        st->code = (int)strtol(e + 7, &w, 10);
        if (w == e + 7 || st->code >= 0)
            return;
        st->kind = ST_FAILED;
        snprintf(st->why, sizeof st->why, "%s", *w == ' ' ? w + 1 : w);
    }
}

static int status_get(ferry_store *s, const char *key, status *st, ferry_error *err)
{
    memset(st, 0, sizeof *st);
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(s, key, &v, err);
    if (rc == FERRY_ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    st->rev = v.mod_rev;
    parse_status(v.val, v.len, st);
    ferry_store_free(v.val);
    return 0;
}

/* Replace the status of revision rev (0: absent) with val: 0, FERRY_ESTATE. */
static int status_cas(ferry_store *s, const char *key, uint64_t rev, const char *val)
{
    return ferry_kv_cas(s, key, rev, val, strlen(val), NULL, NULL);
}

static void take(fr_pub_decision *d, const status *st)
{
    d->rc = st->kind == ST_OK ? 0 : st->code;
    snprintf(d->why, sizeof d->why, "%s", st->kind == ST_OK ? "" : st->why);
}

static void failed(fr_pub_decision *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void failed(fr_pub_decision *d, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->why, sizeof d->why, fmt, ap);
    va_end(ap);
    d->rc = code;
}

/* ---- the coordinator ----------------------------------------------------------------- */

/* Where rank r's declaration differs from the coordinator's: the first
 * tensor whose name, dtype and shape, or pieces differ. */
static void differs(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint32_t r,
                    const fr_pub_mine *mine, fr_pub_decision *d)
{
    char key[FR_KEY_MAX], what[40];
    snprintf(what, sizeof what, "r%u.decl", r);
    (void)fr_key_gen_file(key, sizeof key, c->model, gen, what);
    void *buf = NULL;
    size_t len = 0;
    if (ferry_store_get(s, key, &buf, &len, NULL) < 0 || len < 8) {
        failed(d, FERRY_EINVAL, "rank %u passed another placement than rank 0", r);
        ferry_store_free(buf);
        return;
    }
    const uint64_t *theirs = buf, *ours = mine->decl;
    uint64_t nt = theirs[0];
    if (nt != ours[0] || len != (nt * FR_PUB_DECL + 1) * 8) {
        failed(d, FERRY_EINVAL, "rank %u passed %" PRIu64 " tensors, rank 0 %" PRIu64, r, nt,
               ours[0]);
    } else {
        failed(d, FERRY_EINVAL, "rank %u passed another placement than rank 0", r);
        static const char *const what[FR_PUB_DECL] = {
            NULL, "in another dtype", "with another shape", "in other pieces" };
        for (uint64_t t = 0; t < nt; t++) {
            const uint64_t *a = ours + 1 + FR_PUB_DECL * t, *b = theirs + 1 + FR_PUB_DECL * t;
            ferry_tensor_desc td;
            (void)ferry_manifest_tensor(mine->stored, (uint32_t)t, &td);
            int k = 0;
            while (k < FR_PUB_DECL && a[k] == b[k])
                k++;
            if (k == 0)
                failed(d, FERRY_EINVAL, "rank %u passes another tensor than %s at position %"
                       PRIu64 " (names or their order differ from rank 0's)", r, td.name, t);
            else if (k < FR_PUB_DECL)
                failed(d, FERRY_EINVAL, "rank %u passes tensor %s %s than rank 0", r, td.name,
                       what[k]);
            if (k < FR_PUB_DECL)
                break;
        }
    }
    ferry_store_free(buf);
}

/* Every rank's part, checked against the coordinator's own: on success
 * *gentext (malloc'd) is the generation text (gen_int.h); else d says
 * which rank failed or differs and why, with its code. */
static int gather(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                  const fr_pub_mine *mine, char **gentext, size_t *glen, fr_pub_decision *d)
{
    size_t cap = 256 + (size_t)c->world * 96, n = 0;
    char *text = malloc(cap), dh[33];
    if (!text) {
        failed(d, FERRY_ENOMEM, "the coordinator (rank 0) ran out of memory");
        return d->rc;
    }
    int rc = 0;
    bool canceled = false;   /* a part failed only because another rank failed */
    if (mine) {
        ferry_digest_hex(mine->digest, dh);
        fr_hash128_t jh = fr_hash128(mine->json, mine->json_len, 0);
        char jhex[33];
        fr_hash128_hex(jh, jhex);
        n += (size_t)snprintf(text + n, cap - n, "ferry-gen 2\nmanifest %zu %s\n", mine->json_len,
                              jhex);
    }
    /* every rank's part in one round trip */
    char (*keys)[FR_KEY_MAX] = malloc((size_t)c->world * sizeof *keys);
    ferry_kv_value *parts = calloc(c->world, sizeof *parts);
    int *res = calloc(c->world, sizeof *res);
    if (!keys || !parts || !res) {
        failed(d, FERRY_ENOMEM, "the coordinator (rank 0) ran out of memory");
        rc = d->rc;
    } else {
        for (uint32_t r = 0; r < c->world; r++)
            (void)fr_key_wk_part(keys[r], sizeof keys[r], c->model, gen, r);
        (void)fr_rl_kv_get_all(s, keys, c->world, parts, res);
    }
    for (uint32_t r = 0; r < c->world && rc == 0; r++) {
        const ferry_kv_value v = parts[r];
        if ((rc = res[r]) < 0) {
            failed(d, rc, "rank %u left no part (%s)", r, ferry_strerror(rc));
            break;
        }
        char line[1000];
        snprintf(line, sizeof line, "%.*s", (int)(v.len < sizeof line ? v.len : sizeof line - 1),
                 (const char *)v.val);
        char hex[40];
        unsigned no;
        unsigned long long seg, sh;
        if (strncmp(line, "ok 2\n", 5) != 0) {
            status st = {0};
            char tmp[1100];
            char *eol = strchr(line, '\n');
            if (eol)
                *eol = '\0';
            snprintf(tmp, sizeof tmp, "0 %s", line);
            parse_status(tmp, strlen(tmp), &st);
            if (st.kind == ST_FAILED && st.code == FERRY_ECANCELED) {
                /* it failed because another rank did (publish_quant.c):
                 * that rank's reason is the one to report */
                if (!canceled)
                    failed(d, st.code, "rank %u: %s", r, st.why);
                canceled = true;
                continue;
            }
            if (st.kind == ST_FAILED)
                failed(d, st.code, "rank %u: %s", r, st.why);
            else
                failed(d, FERRY_EPROTO, "rank %u left a malformed part", r);
            rc = d->rc;
        } else if (sscanf(line + 5, "%39s %u %llu %llx", hex, &no, &seg, &sh) != 4) {
            failed(d, FERRY_EPROTO, "rank %u left a malformed part", r);
            rc = d->rc;
        } else if (!mine) {
            if (canceled)
                continue;   /* rank 0's own part said why */
            failed(d, FERRY_EPROTO, "rank 0 has no placement");   /* its own part said why */
            rc = d->rc;
        } else if (strcmp(hex, dh) != 0) {
            differs(s, c, gen, r, mine, d);
            rc = d->rc;
        } else {
            n += (size_t)snprintf(text + n, cap - n, "rank %u %llu %u %016llx\n", r, seg, no, sh);
        }
    }
    for (uint32_t r = 0; parts && r < c->world; r++)
        ferry_store_free(parts[r].val);
    free(keys);
    free(parts);
    free(res);
    if (rc == 0 && canceled)
        rc = d->rc;
    if (rc < 0) {
        free(text);
        return rc;
    }
    *gentext = text;
    *glen = n;
    return 0;
}

/* Write the manifest and probes, then announce gen with one CAS of the
 * active key; *prev: the generation active before. 0, or d says why not. */
static int announce(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                    const char *record, const char *man, size_t mlen, uint64_t cas_by_ns,
                    uint64_t *prev, fr_pub_decision *d)
{
    char k[FR_KEY_MAX];
    ferry_error se = {0};
    fr_key_wk(k, sizeof k, c->model, gen, "manifest");
    int rc = ferry_kv_put(s, k, man, mlen, NULL, &se);
    if (rc < 0) {
        failed(d, rc, "cannot store the manifest: %s", se.msg);
        return rc;
    }
    if ((rc = fr_rl_probe_put(s, c->model, gen, man, mlen, &se)) < 0) {
        failed(d, rc, "cannot store the generation's probes: %s", se.msg);
        return rc;
    }
    fr_hash128_t dg = fr_hash128(man, mlen, 0);
    char hex[33];
    fr_hash128_hex(dg, hex);
    /* "G digest[ record]": the policy record rides on the same CAS. */
    size_t vcap = 64 + (record ? strlen(record) : 0);
    char *val = malloc(vcap);
    if (!val) {
        failed(d, FERRY_ENOMEM, "the coordinator (rank 0) ran out of memory");
        return d->rc;
    }
    int vn = snprintf(val, vcap, "%" PRIu64 " %s%s%s", gen, hex, record ? " " : "",
                      record ? record : "");
    fr_key_wk(k, sizeof k, c->model, 0, "active");
    ferry_kv_value cur = {0};
    uint64_t expected = 0, active = 0;
    rc = ferry_kv_get(s, k, &cur, &se);
    if (rc == 0) {
        expected = cur.mod_rev;
        active = strtoull(cur.val, NULL, 10);
        ferry_store_free(cur.val);
    } else if (rc != FERRY_ENOENT) {
        failed(d, rc, "cannot read the active generation: %s", se.msg);
        free(val);
        return rc;
    }
    *prev = active;
    if (fr_now_ns() > cas_by_ns) {
        /* The other ranks give up on a decision timeout_ms after the
         * barrier: past half of it, announcing could contradict them. */
        failed(d, FERRY_ETIMEDOUT, "the coordinator (rank 0) could not announce it within %"
               PRIu64 " ms of the barrier", c->timeout_ms / 2);
        free(val);
        return d->rc;
    }
    if (active >= gen) {
        failed(d, FERRY_EINVAL, "generation %" PRIu64 " is not newer than the active %" PRIu64,
               gen, active);
        free(val);
        return d->rc;
    }
    rc = ferry_kv_cas(s, k, expected, val, (size_t)vn, NULL, &se);
    free(val);
    if (rc == FERRY_ESTATE) {
        failed(d, rc, "another publish announced a generation of %s meanwhile", c->model);
        return rc;
    }
    if (rc < 0) {
        /* The CAS may have landed before its reply was lost: look. */
        uint64_t now = 0;
        if (fr_rl_active_read(s, c->model, &now, NULL, NULL) == 0 && now == gen)
            return 0;
        failed(d, rc, "cannot announce: %s", se.msg);
        return rc;
    }
    return 0;
}

/* Claim attempt's decision: "A failed ..." when d already holds a failure,
 * else "A deciding". 0 when claimed; else d holds the decision there is
 * (the waiting ranks gave up first) or why nothing could be written. */
static int claim(ferry_store *s, const char *sk, uint64_t attempt, uint64_t *rev,
                 fr_pub_decision *d)
{
    char sv[700];
    if (d->rc < 0)
        snprintf(sv, sizeof sv, "%" PRIu64 " failed %d %s", attempt, d->rc, d->why);
    else
        snprintf(sv, sizeof sv, "%" PRIu64 " deciding", attempt);
    ferry_error se = {0};
    for (int tries = 0; tries < 8; tries++) {
        status st;
        int rc = status_get(s, sk, &st, &se);
        if (rc == 0 && st.attempt == attempt && st.kind != ST_NONE && st.rev) {
            take(d, &st);   /* the other ranks gave up waiting: their decision stands */
            return FERRY_ECANCELED;
        }
        if (rc == 0 && (rc = ferry_kv_cas(s, sk, st.rev, sv, strlen(sv), rev, &se)) == FERRY_ESTATE)
            continue;
        if (rc == 0)
            return 0;
        failed(d, rc, "the coordinator (rank 0) cannot record its decision: %s", se.msg);
        return rc;
    }
    failed(d, FERRY_ESTATE, "the coordinator (rank 0) cannot record its decision: the status "
           "keeps changing");
    return FERRY_ESTATE;
}

void fr_rl_decide(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t attempt,
                  const fr_pub_mine *mine, const char *record, ferry_publish_stats *pst,
                  fr_pub_decision *d)
{
    uint64_t tmo = c->timeout_ms;
    uint64_t cas_by = fr_deadline_ns((int64_t)(tmo / 2));
    char sk[FR_KEY_MAX], sv[700];
    fr_key_wk(sk, sizeof sk, c->model, gen, "status");
    memset(d, 0, sizeof *d);
    char *man = NULL;
    size_t mlen = 0;
    uint64_t rev = 0;
    int grc = gather(s, c, gen, mine, &man, &mlen, d);
    if (claim(s, sk, attempt, &rev, d) < 0 || grc < 0) {
        free(man);
        return;
    }
    uint64_t prev = 0;
    int arc = announce(s, c, gen, record, man, mlen, cas_by, &prev, d);
    free(man);
    if (arc == 0)
        snprintf(sv, sizeof sv, "%" PRIu64 " ok", attempt);
    else
        snprintf(sv, sizeof sv, "%" PRIu64 " failed %d %s", attempt, d->rc, d->why);
    /* Over our own claim only: the waiting ranks replace "deciding" once
     * they give up, and then theirs is the decision every rank returns. */
    status st;
    if (ferry_kv_cas(s, sk, rev, sv, strlen(sv), NULL, NULL) == FERRY_ESTATE &&
        status_get(s, sk, &st, NULL) == 0 && st.attempt == attempt && st.kind >= ST_OK) {
        take(d, &st);
        arc = arc == 0 && d->rc < 0 ? d->rc : arc;
    }
    if (arc == 0) {
        d->rc = 0;
        fr_rl_keep(s, c, gen, prev, pst);
    }
}

/* ---- the other ranks --------------------------------------------------------------------- */

/* At the deadline: take the decision there is, or make one. A coordinator
 * that claimed the decision ("deciding") announces within half the
 * timeout or not at all, so at the deadline an attempt still "deciding"
 * and not announced has failed: its coordinator died (or hangs). */
static void give_up(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                    uint64_t attempt, uint64_t tmo, const char *sk, fr_pub_decision *d)
{
    char sv[300];
    snprintf(sv, sizeof sv, "%" PRIu64 " failed %d the coordinator (rank 0) gave no decision "
             "within %" PRIu64 " ms", attempt, FERRY_ETIMEDOUT, tmo);
    bool deciding = false;
    for (int tries = 0; tries < 8; tries++) {
        status st;
        int rc = status_get(s, sk, &st, NULL);
        if (rc == 0 && st.attempt == attempt && st.rev && (st.kind == ST_OK || st.kind == ST_FAILED)) {
            take(d, &st);
            return;
        }
        deciding = rc == 0 && st.attempt == attempt && st.rev && st.kind == ST_DECIDING;
        if (deciding) {
            uint64_t now = 0;
            if (fr_rl_active_read(s, c->model, &now, NULL, NULL) == 0 && now == gen) {
                d->rc = 0;   /* announced; the coordinator died before saying so */
                return;
            }
        }
        if (rc == 0 && (rc = status_cas(s, sk, st.rev, sv)) == FERRY_ESTATE)
            continue;
        if (rc == 0)
            break;
        /* Nothing written: when the coordinator had claimed, whether it
         * announced stays unknown: keep this rank's objects. */
        d->keep = deciding;
        break;
    }
    failed(d, FERRY_ETIMEDOUT, "the coordinator (rank 0) gave no decision within %" PRIu64 " ms",
           tmo);
}

void fr_rl_await(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t attempt,
                 fr_pub_decision *d)
{
    memset(d, 0, sizeof *d);
    char sk[FR_KEY_MAX];
    fr_key_wk(sk, sizeof sk, c->model, gen, "status");
    uint64_t tmo = c->timeout_ms;
    uint64_t deadline = fr_deadline_ns(tmo);
    ferry_watch *w = NULL;
    for (;;) {
        /* Watch from now on, then read what is there; each change is read
         * again (there are two: "deciding", then the decision). */
        if (!w && ferry_kv_watch(s, sk, 0, &w, NULL) < 0)
            w = NULL;
        status st;
        if (status_get(s, sk, &st, NULL) == 0 && st.attempt == attempt && st.rev &&
            (st.kind == ST_OK || st.kind == ST_FAILED)) {
            ferry_watch_close(w);
            take(d, &st);
            return;
        }
        int left = fr_ms_left(deadline);
        if (left == 0)
            break;
        if (w) {
            ferry_kv_event ev;
            int rc = ferry_watch_next(w, left, &ev, NULL);
            if (rc == FERRY_ETIMEDOUT)
                break;
            if (rc < 0) {   /* the watch broke: open another */
                ferry_watch_close(w);
                w = NULL;
            }
        } else {
            /* No watch to be had (the master is unreachable?): look again soon. */
            struct timespec ts = { 0, 20 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    ferry_watch_close(w);
    give_up(s, c, gen, attempt, tmo, sk, d);
}
