/* The claim protocol of sample queues (docs/samples.md, "Ending a record").
 *
 * A sample (uid) has one payload object and one or more queue records (a
 * push retried across a master restart can land twice). Its claim
 * ferry/rl/Q/claim/<uid> says which delivery of which record owns it:
 *   "<id> <token>"        delivery <token> of record <id> may train it
 *   "<id> <token> done"   that delivery acked it (or rejected it as stale)
 * Marking the claim done is the commit point of an ack. Only after it is
 * the payload removed, and only after the payload is gone is the record
 * acked. A consumer killed anywhere in between leaves a record that is
 * delivered again; whoever pops it finds the claim done and finishes it
 * (payload, then record) instead of handing it out. So no payload outlives
 * its last record, and no delivery after the commit trains the sample. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "rl/keys.h"
#include "rl/sampleq_int.h"

uint64_t fr_sq_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool fr_sq_retryable(int rc)
{
    return rc == FERRY_ECONNRESET || rc == FERRY_ECONNREFUSED || rc == -EPIPE ||
           rc == -ENOTCONN;
}

void fr_sq_backoff(unsigned *ms)
{
    struct timespec ts = { 0, (long)*ms * 1000000L };
    nanosleep(&ts, NULL);
    *ms = *ms < 50 ? *ms * 2 : 100;
}

int fr_sq_ack_retry(ferry_sample_queue *q, uint64_t id, uint32_t token, ferry_error *err)
{
    unsigned wait = 2;
    bool retried = false;
    uint64_t dl = fr_deadline_ns((int64_t)q->cfg.push_timeout_ms);
    for (;;) {
        int rc = ferry_queue_ack(q->s, id, token, err);
        if (rc == FERRY_ENOENT && retried)
            return 0;   /* the first try landed; its reply was lost */
        if (!fr_sq_retryable(rc) || fr_now_ns() >= dl)
            return rc;
        retried = true;
        fr_sq_backoff(&wait);
    }
}

/* ---- the claim value ------------------------------------------------------------------ */

typedef struct cval { uint64_t id, rev; uint32_t token; bool done; } cval;

static void claim_key(const ferry_sample_queue *q, uint64_t uid, char *key, size_t cap)
{
    (void)fr_key_claim(key, cap, q->cfg.queue, uid);
}

static int claim_text(char *buf, size_t cap, const ferry_sample *smp, bool done)
{
    return snprintf(buf, cap, "%" PRIu64 " %" PRIu32 "%s", smp->id, smp->token,
                    done ? " done" : "");
}

/* Parse a claim: "<id> <token>[ done]", or a bare "<id>" as written before
 * tokens were kept (token 0: any delivery of that record takes it over).
 * false for anything else. */
static bool claim_parse(const char *p, size_t len, cval *c)
{
    char buf[64];
    if (len >= sizeof buf)
        return false;
    memcpy(buf, p, len);
    buf[len] = '\0';
    unsigned long long id = 0;
    unsigned tok = 0;
    char word[8] = "", *end = NULL;
    int n = sscanf(buf, "%llu %u %7s", &id, &tok, word);
    if (n < 1 || (n == 3 && strcmp(word, "done")))
        return false;
    strtoull(buf, &end, 10);
    if (n == 1 && *end)
        return false;
    *c = (cval){ .id = id, .token = n >= 2 ? tok : 0, .done = n == 3 };
    return true;
}

/* 0 and *c, FERRY_ENOENT, FERRY_EPROTO (not a claim we wrote), an error. */
static int claim_get(ferry_sample_queue *q, const char *key, cval *c)
{
    ferry_kv_value v = {0};
    int rc = ferry_kv_get(q->s, key, &v, NULL);
    if (rc < 0)
        return rc;
    bool ok = claim_parse(v.val, v.len, c);
    c->rev = v.mod_rev;
    ferry_store_free(v.val);
    return ok ? 0 : FERRY_EPROTO;
}

static void add_claim(ferry_sample_queue *q, const ferry_sample *smp, const char *key,
                      uint64_t rev)
{
    if (q->nclaims == q->capclaims) {
        size_t nc = q->capclaims ? q->capclaims * 2 : 256;
        fr_sq_claim *n = realloc(q->claims, nc * sizeof *n);
        if (!n)
            return;
        q->claims = n;
        q->capclaims = nc;
    }
    fr_sq_claim *c = &q->claims[q->nclaims++];
    *c = (fr_sq_claim){ .version = smp->session.policy_version, .uid = smp->uid, .id = smp->id,
                        .rev = rev, .token = smp->token };
    snprintf(c->key, sizeof c->key, "%s", key);
}

/* The revision at which this handle took smp's delivery's claim (newest
 * first: an ack follows its pop closely). */
static bool claim_rev(const ferry_sample_queue *q, const ferry_sample *smp, uint64_t *rev)
{
    for (size_t i = q->nclaims; i-- > 0;) {
        const fr_sq_claim *c = &q->claims[i];
        if (c->uid == smp->uid && c->id == smp->id && c->token == smp->token) {
            *rev = c->rev;
            return true;
        }
    }
    return false;
}

/* ---- taking and committing ------------------------------------------------------------- */

int fr_sq_take(ferry_sample_queue *q, const ferry_sample *smp, bool done)
{
    char key[FR_KEY_MAX], val[64];
    claim_key(q, smp->uid, key, sizeof key);
    int n = claim_text(val, sizeof val, smp, done);
    unsigned wait = 2;
    uint64_t dl = fr_deadline_ns((int64_t)q->cfg.push_timeout_ms);
    for (int round = 0;; round++) {
        if (round > 16)
            return FERRY_ESTATE;   /* others keep changing it: give the record back */
        uint64_t r = 0;
        int rc = ferry_kv_cas(q->s, key, 0, val, (size_t)n, &r, NULL);
        if (rc == FERRY_ESTATE) {
            cval c;
            rc = claim_get(q, key, &c);
            if (rc == FERRY_ENOENT)
                continue;   /* deleted in between: take it fresh */
            if (rc == FERRY_EPROTO || (rc == 0 && c.id != smp->id))
                return FR_SQ_DUPLICATE;
            if (rc == 0 && c.token == smp->token && c.done == done) {
                add_claim(q, smp, key, c.rev);   /* our own take, whose reply was lost */
                return FR_SQ_TAKEN;
            }
            if (rc == 0 && c.done)
                return FR_SQ_DONE;
            if (rc == 0 && c.token > smp->token)
                return FR_SQ_LATE;
            if (rc == 0)   /* an earlier delivery of this record: this one takes over */
                rc = ferry_kv_cas(q->s, key, c.rev, val, (size_t)n, &r, NULL);
            if (rc == FERRY_ESTATE)
                continue;
        }
        if (rc == 0) {
            add_claim(q, smp, key, r);
            return FR_SQ_TAKEN;
        }
        if (!fr_sq_retryable(rc) || fr_now_ns() >= dl)
            return rc;
        fr_sq_backoff(&wait);
    }
}

/* This delivery's claim as it stands: 0 and *rev (0: no claim at all), 1
 * when this delivery marked it done already, FERRY_ESTALE when it belongs
 * to another delivery or record, or an error. */
static int claim_mine(ferry_sample_queue *q, const char *key, const ferry_sample *smp,
                      uint64_t *rev)
{
    cval c;
    int rc = claim_get(q, key, &c);
    if (rc == FERRY_ENOENT) {
        *rev = 0;   /* deleted with its version (set_version): commit it afresh */
        return 0;
    }
    if (rc == FERRY_EPROTO || (rc == 0 && (c.id != smp->id || c.token != smp->token)))
        return FERRY_ESTALE;
    if (rc < 0)
        return rc;
    *rev = c.rev;
    return c.done ? 1 : 0;
}

int fr_sq_mark_done(ferry_sample_queue *q, const ferry_sample *smp, ferry_error *err)
{
    uint64_t rev = 0;
    bool have_rev = claim_rev(q, smp, &rev);   /* else one more round trip to read it */
    char key[FR_KEY_MAX], val[64];
    claim_key(q, smp->uid, key, sizeof key);
    int n = claim_text(val, sizeof val, smp, true);
    unsigned wait = 2;
    bool retried = false;
    uint64_t dl = fr_deadline_ns((int64_t)q->cfg.push_timeout_ms);
    for (int round = 0;; round++) {
        int rc = 0;
        if (!have_rev) {
            rc = claim_mine(q, key, smp, &rev);
            if (rc == 1)   /* done: by our own try whose reply was lost, or acked twice */
                return retried ? 0 : FERRY_ESTALE;
            if (rc < 0 && rc != FERRY_ESTALE)
                fr_fail(err, rc, "reading its claim %s: %s", key, ferry_strerror(rc));
        }
        if (rc == 0)
            rc = ferry_kv_cas(q->s, key, rev, val, (size_t)n, NULL, err);
        if (rc == 0 || rc == FERRY_ESTALE)
            return rc;
        if (rc == FERRY_ESTATE) {
            /* changed since we looked: a newer delivery took it, or (after a
             * lost reply) our own commit landed; look again */
            if (round >= 4)
                return FERRY_ESTALE;
            have_rev = false;
            continue;
        }
        if (!fr_sq_retryable(rc) || fr_now_ns() >= dl)
            return rc;
        retried = true;
        have_rev = false;
        fr_sq_backoff(&wait);
    }
}

/* ---- finishing --------------------------------------------------------------------------- */

static void defer(ferry_sample_queue *q, const char *payload, uint64_t uid, uint64_t id,
                  uint32_t token)
{
    /* No room: the record simply stays leased; once the lease lapses it is
     * delivered again and finished by whoever pops it. */
    if (q->ndef >= FR_SQ_DEFERRED_MAX)
        return;
    if (!q->def && !(q->def = calloc(FR_SQ_DEFERRED_MAX, sizeof *q->def)))
        return;
    fr_sq_deferred *d = &q->def[q->ndef++];
    *d = (fr_sq_deferred){ .after_ms = fr_sq_wall_ms() + 100, .uid = uid, .id = id,
                           .token = token };
    snprintf(d->key, sizeof d->key, "%s", payload);
}

void fr_sq_finish(ferry_sample_queue *q, const char *payload, uint64_t uid, uint64_t id,
                  uint32_t token)
{
    int rc = payload[0] ? ferry_store_remove(q->s, payload, NULL) : 0;
    if (rc == 0 || rc == FERRY_ENOENT)
        (void)fr_sq_ack_retry(q, id, token, NULL);   /* FERRY_ESTALE: delivered again, theirs to end */
    else
        defer(q, payload, uid, id, token);     /* a read lease (or the master away) */
}

void fr_sq_retry_deferred(ferry_sample_queue *q, bool all)
{
    uint64_t now = fr_sq_wall_ms();
    size_t keep = 0;
    for (size_t i = 0; i < q->ndef; i++) {
        fr_sq_deferred *d = &q->def[i];
        if (!all && d->after_ms > now) {
            q->def[keep++] = *d;
            continue;
        }
        int rc = ferry_store_remove(q->s, d->key, NULL);
        if (rc == 0 || rc == FERRY_ENOENT) {
            (void)fr_sq_ack_retry(q, d->id, d->token, NULL);
        } else if (!all) {
            d->after_ms = now + 100;
            q->def[keep++] = *d;
        }
        /* all (close) and still refused: forgotten here; the record, still
         * leased, is delivered again and finished then */
    }
    q->ndef = keep;
}

static bool deferred_uid(const ferry_sample_queue *q, uint64_t uid)
{
    for (size_t i = 0; i < q->ndef; i++)
        if (q->def[i].uid == uid)
            return true;
    return false;
}

void fr_sq_drop_claims(ferry_sample_queue *q, uint64_t input_version)
{
    /* A duplicate of a sample beyond the lag window is stale and never
     * trained, so its claim can go; a record still waiting here to be
     * finished keeps it, so that its redelivery is finished, not rejected. */
    size_t keep = 0;
    for (size_t i = 0; i < q->nclaims; i++) {
        fr_sq_claim *c = &q->claims[i];
        if (c->version + q->cfg.max_policy_lag < input_version && !deferred_uid(q, c->uid))
            (void)ferry_kv_delete(q->s, c->key, 0, NULL, NULL);
        else
            q->claims[keep++] = *c;
    }
    q->nclaims = keep;
}

/* ---- the claim log (samples.h) -------------------------------------------------------- */

struct ferry_sample_claims {
    ferry_store *s;
    ferry_watch *w;
    char prefix[FR_KEY_MAX];     /* of the queue's claims */
    char mark[FR_KEY_MAX];
    size_t plen;
};

int ferry_sample_claims_open(ferry_store *s, const char *queue, ferry_sample_claims **out,
                             ferry_error *err)
{
    if (!s || !queue || !queue[0] || !out)
        return fr_fail(err, FERRY_EINVAL, "sample claims: no store, queue or result");
    *out = NULL;
    ferry_sample_claims *c = calloc(1, sizeof *c);
    if (!c)
        return fr_fail(err, FERRY_ENOMEM, "sample claims: out of memory");
    c->s = s;
    int n = fr_key_claims(c->prefix, sizeof c->prefix, queue);
    int rc = n < 0 ? n : fr_key_claims_mark(c->mark, sizeof c->mark, queue);
    if (rc < 0)
        fr_fail(err, rc, "sample claims: the queue name '%s' is too long", queue);
    else if ((rc = ferry_kv_watch(s, c->prefix, 0, &c->w, err)) < 0)
        fr_fail(err, rc, "sample claims of queue %s: %s", queue, fr_why(err, rc));
    if (rc < 0) {
        free(c);
        return rc;
    }
    c->plen = (size_t)n;
    *out = c;
    return 0;
}

int ferry_sample_claims_next(ferry_sample_claims *c, int timeout_ms, ferry_sample_claim *out,
                             ferry_error *err)
{
    if (!c || !out)
        return fr_fail(err, FERRY_EINVAL, "sample claims: no log or result");
    memset(out, 0, sizeof *out);
    ferry_kv_event ev;
    int rc;
    do   /* the mark's removal is no event of the log */
        rc = ferry_watch_next(c->w, timeout_ms, &ev, err);
    while (rc == 0 && ev.deleted && !strcmp(ev.key, c->mark));
    if (rc == FERRY_ETIMEDOUT)
        return fr_fail(err, rc, "sample claims: no claim written within %d ms", timeout_ms);
    if (rc < 0)
        return rc;
    out->deleted = ev.deleted;
    if (!strcmp(ev.key, c->mark)) {
        out->mark = true;
        return 0;
    }
    const char *u = ev.key + c->plen;
    char *end = NULL;
    out->uid = strtoull(u, &end, 16);
    if (end != u + 16 || *end)   /* under the prefix, but no claim of this queue */
        return fr_fail(err, FERRY_EPROTO, "sample claims: %s is no claim of this queue", ev.key);
    cval v;
    if (ev.deleted)
        return 0;
    if (!claim_parse(ev.val, ev.len, &v))
        return fr_fail(err, FERRY_EPROTO, "sample claims: the claim %s holds no claim this "
                       "version of ferry knows", ev.key);
    out->id = v.id;
    out->token = v.token;
    out->done = v.done;
    return 0;
}

int ferry_sample_claims_mark(ferry_sample_claims *c, ferry_error *err)
{
    if (!c)
        return fr_fail(err, FERRY_EINVAL, "sample claims: no log");
    int rc = ferry_kv_put(c->s, c->mark, "mark", 4, NULL, err);
    if (rc == 0)
        (void)ferry_kv_delete(c->s, c->mark, 0, NULL, NULL);   /* the watch saw the put */
    return rc;
}

void ferry_sample_claims_close(ferry_sample_claims *c)
{
    if (!c)
        return;
    ferry_watch_close(c->w);
    free(c);
}

int ferry_sample_payloads(ferry_store *s, const char *queue, size_t max, char ***keys, size_t *n,
                          bool *more, ferry_error *err)
{
    if (!s || !queue || !queue[0] || !keys || !n)
        return fr_fail(err, FERRY_EINVAL, "sample payloads: no store, queue or result");
    *keys = NULL;
    *n = 0;
    char prefix[FR_KEY_MAX], claims[FR_KEY_MAX];
    int rc = fr_key_samples(prefix, sizeof prefix, queue);
    int cl = rc < 0 ? rc : fr_key_claims(claims, sizeof claims, queue);
    if (cl < 0)
        return fr_fail(err, cl, "sample payloads: the queue name '%s' is too long", queue);
    rc = ferry_store_list(s, prefix, NULL, max, keys, n, more, err);
    if (rc < 0)
        return rc;
    size_t k = 0;
    for (size_t i = 0; i < *n; i++)   /* claims are KV, never objects: defensive */
        if (strncmp((*keys)[i], claims, (size_t)cl) != 0)
            (*keys)[k++] = (*keys)[i];
    *n = k;
    return 0;
}
