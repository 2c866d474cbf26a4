/* `ferry-lab demo rl`'s accounting, robust to members killed at any point.
 *
 * Two records, kept apart:
 * - the members' ledgers (demo_rl.c): "A sid" before a push, "P sid uid
 *   version" once it landed ("F sid" if it did not), "B sid" for a
 *   recompute request taken, "L uid id token latency sid" for each admitted
 *   delivery before its ack, "T uid id token" for each ack that held, "W
 *   version seconds wrong" per weight load, "U seconds" per publish, "E" at
 *   a clean exit (a ledger without it belongs to a killed incarnation);
 * - the queue's claim log (ferry_sample_claims_open): every claim the
 *   queue wrote, watched by the parent from before the first sample. A value "<id> <token> done" is the commit of that delivery
 *   (docs/samples.md, "Ending a record"): of an ack when the delivery was
 *   admitted (an "L" line names it), of a stale rejection otherwise (a
 *   rejected delivery never leaves ferry_sample_pop, so no ledger names it).
 *
 * Per sample (uid): trained = one ack commit, stale = one rejection
 * commit, lost = pushed ("P") and never committed, duplicated = committed
 * as trained more than once (or a session trained under two uids). The
 * ledgers must agree with the log: every "T" has its commit, and a commit
 * of an admitted delivery without a "T" comes from a member killed inside
 * its ack. What a kill leaves undecided in a ledger (the push in flight) is
 * bounded by the kills. */
#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "lab.h"
#include "demo_rl.h"

typedef struct dv { uint64_t uid, id; uint32_t tok; unsigned file; } dv;   /* a delivery */
typedef struct pe { uint64_t uid; char *sid; unsigned file; } pe;           /* a push */
typedef struct lfile { bool killed, drain, roll; unsigned inc; } lfile;

typedef struct tab {
    pe *p; size_t np, capp;
    dv *l, *t, *done; size_t nl, nt, nd, capl, capt, capd;
    char **b; size_t nb, capb;
    char **dang; size_t ndang, capdang;   /* the sessions of pushes a kill cut short */
    double *lat, *load, *pub; size_t nlat, nload, npub, caplat, capload, cappub;
    lfile f[4 * RL_POOL_MAX * 64]; unsigned nf;
} tab;

#define GROW(arr, n, cap)                                                         \
    ((n) < (cap) || ((arr) = realloc((arr), ((cap) = (cap) ? (cap) * 2 : 1024) * \
                                                   sizeof *(arr))) != NULL)

static int cmp_dv(const void *a, const void *b)
{
    const dv *x = a, *y = b;
    if (x->uid != y->uid)
        return x->uid < y->uid ? -1 : 1;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->tok < y->tok ? -1 : x->tok > y->tok;
}
static int cmp_pe(const void *a, const void *b)
{
    const pe *x = a, *y = b;
    return x->uid < y->uid ? -1 : x->uid > y->uid;
}
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* qsort and bsearch, for arrays that may be empty (and then NULL) */
static void sort(void *base, size_t n, size_t sz, int (*cmp)(const void *, const void *))
{
    if (n > 1)
        qsort(base, n, sz, cmp);
}
static void *find(const void *key, const void *base, size_t n, size_t sz,
                  int (*cmp)(const void *, const void *))
{
    return n ? bsearch(key, base, n, sz, cmp) : NULL;
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    sort(v, n, sizeof *v, cmp_d);
    size_t k = (size_t)(p * (double)n + 0.999999);
    return v[(k ? k - 1 : 0) < n ? (k ? k - 1 : 0) : n - 1];
}

static bool add_dv(dv **arr, size_t *n, size_t *cap, dv d)
{
    if (!GROW(*arr, *n, *cap))
        return false;
    (*arr)[(*n)++] = d;
    return true;
}

static bool add_num(double **arr, size_t *n, size_t *cap, double x)
{
    if (!GROW(*arr, *n, *cap))
        return false;
    (*arr)[(*n)++] = x;
    return true;
}

/* One ledger line (complete: it ended in '\n'). */
static bool ledger_line(tab *tb, unsigned fi, char *line, char *pending, size_t pcap,
                        uint64_t *wrong)
{
    char sid[160];
    unsigned long long uid, id, ver, lat;
    unsigned tok;
    double secs;
    switch (line[0]) {
    case 'A':
        snprintf(pending, pcap, "%.150s", line + 2);
        return true;
    case 'F':
        pending[0] = '\0';
        return true;
    case 'P':
        pending[0] = '\0';
        if (sscanf(line, "P %159s %llx %llu", sid, &uid, &ver) != 3 || !GROW(tb->p, tb->np, tb->capp))
            return false;
        tb->p[tb->np++] = (pe){ uid, strdup(sid), fi };
        return true;
    case 'B':
        if (!GROW(tb->b, tb->nb, tb->capb))
            return false;
        tb->b[tb->nb++] = strdup(line + 2);
        return true;
    case 'L':
        if (sscanf(line, "L %llx %llu %u %llu", &uid, &id, &tok, &lat) != 4)
            return false;
        return add_dv(&tb->l, &tb->nl, &tb->capl, (dv){ uid, id, tok, fi }) &&
               add_num(&tb->lat, &tb->nlat, &tb->caplat, (double)lat);
    case 'T':
        if (sscanf(line, "T %llx %llu %u", &uid, &id, &tok) != 3)
            return false;
        return add_dv(&tb->t, &tb->nt, &tb->capt, (dv){ uid, id, tok, fi });
    case 'W':
        if (sscanf(line, "W %llu %lf %llu", &ver, &secs, &lat) != 3)
            return false;
        *wrong += lat;
        return add_num(&tb->load, &tb->nload, &tb->capload, secs);
    case 'U':
        return sscanf(line, "U %lf", &secs) == 1 &&
               add_num(&tb->pub, &tb->npub, &tb->cappub, secs);
    default:
        return false;
    }
}

/* Every ledger of dir. */
static int read_ledgers(tab *tb, const char *dir, rl_tally *t, char *err, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return snprintf(err, cap, "cannot read %s", dir), -1;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        unsigned rank, inc;
        bool roll = sscanf(de->d_name, "roll-%u-%u", &rank, &inc) == 2;
        bool drain = !strcmp(de->d_name, "upd-drain-0");
        if (!roll && !drain && sscanf(de->d_name, "upd-%u-%u", &rank, &inc) != 2)
            continue;
        if (tb->nf == sizeof tb->f / sizeof tb->f[0]) {
            snprintf(err, cap, "too many member incarnations");
            rc = -1;
            break;
        }
        char path[512], line[512], pending[200] = "";
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned fi = tb->nf++;
        tb->f[fi] = (lfile){ .killed = true, .drain = drain, .roll = roll, .inc = drain ? 0 : inc };
        while (fgets(line, sizeof line, f)) {
            size_t n = strlen(line);
            if (!n || line[n - 1] != '\n')
                break;   /* the last line, cut by the kill */
            line[n - 1] = '\0';
            if (!strcmp(line, "E"))
                tb->f[fi].killed = false;
            else if (!ledger_line(tb, fi, line, pending, sizeof pending, &t->weight_errors)) {
                snprintf(err, cap, "%s: a line the demo did not write: '%.80s'", de->d_name, line);
                rc = -1;
                break;
            }
        }
        fclose(f);
        if (roll && tb->f[fi].killed && pending[0]) {
            t->dangling_pushes++;   /* killed between "A" and knowing whether it landed */
            if (GROW(tb->dang, tb->ndang, tb->capdang))
                tb->dang[tb->ndang++] = strdup(pending);
        }
    }
    closedir(d);
    return rc;
}

/* The claim log up to its mark: the done commits. */
static int read_claims(tab *tb, ferry_sample_claims *claims, rl_tally *t, char *err, size_t cap)
{
    for (;;) {
        ferry_sample_claim c;
        ferry_error why = {0};
        int rc = ferry_sample_claims_next(claims, FERRY_DEFAULT_TIMEOUT_MS, &c, &why);
        if (rc < 0 && rc != FERRY_EPROTO)
            return snprintf(err, cap, "the claim log stopped: %s", why.msg), -1;
        if (rc == 0 && c.mark)
            return 0;
        t->claim_events++;
        if (rc == 0 && c.done && !c.deleted &&
            !add_dv(&tb->done, &tb->nd, &tb->capd, (dv){ c.uid, c.id, c.token, 0 }))
            return snprintf(err, cap, "out of memory"), -1;
    }
}

/* Payload objects still under the queue: orphans of pushes a kill cut
 * between the payload and its record (removed here). */
static void payloads_left(ferry_store *s, const char *queue, rl_tally *t)
{
    char **keys = NULL;
    size_t n = 0;
    bool more = false;
    if (ferry_sample_payloads(s, queue, 4096, &keys, &n, &more, NULL) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        t->orphaned_payloads++;
        (void)ferry_store_remove(s, keys[i], NULL);
    }
    ferry_store_free(keys);
}

static const pe *find_push(const tab *tb, uint64_t uid)
{
    pe key = { .uid = uid };
    return find(&key, tb->p, tb->np, sizeof *tb->p, cmp_pe);
}

static bool has(const dv *arr, size_t n, dv k) { return find(&k, arr, n, sizeof k, cmp_dv); }

/* The first of the sorted commits with this uid (nd if none). */
static size_t first_commit(const tab *tb, uint64_t uid)
{
    size_t k = 0, hi = tb->nd;
    while (k < hi) {
        size_t mid = (k + hi) / 2;
        if (tb->done[mid].uid < uid)
            k = mid + 1;
        else
            hi = mid;
    }
    return k < tb->nd && tb->done[k].uid == uid ? k : tb->nd;
}

/* Per uid, over the sorted commits. */
static void account(tab *tb, bool recompute, rl_tally *t)
{
    sort(tb->p, tb->np, sizeof *tb->p, cmp_pe);
    sort(tb->l, tb->nl, sizeof *tb->l, cmp_dv);
    sort(tb->t, tb->nt, sizeof *tb->t, cmp_dv);
    sort(tb->done, tb->nd, sizeof *tb->done, cmp_dv);
    sort(tb->b, tb->nb, sizeof *tb->b, cmp_str);
    char **trained_sids = calloc(tb->nd + 1, sizeof *trained_sids);
    size_t nts = 0, unknown_stale = 0;
    for (size_t i = 0; i < tb->nd;) {
        size_t j = i;
        unsigned ntrain = 0, nstale = 0;
        for (; j < tb->nd && tb->done[j].uid == tb->done[i].uid; j++) {
            dv c = tb->done[j];
            const dv *l = find(&c, tb->l, tb->nl, sizeof c, cmp_dv);
            if (!l) {
                nstale++;
                continue;
            }
            ntrain++;
            if (!has(tb->t, tb->nt, c)) {   /* committed, but its "T" line never came */
                if (tb->f[l->file].killed)
                    t->acks_cut_by_kill++;
                else
                    t->inconsistent++;
            }
        }
        const pe *p = find_push(tb, tb->done[i].uid);
        if (!p)
            t->landed_unrecorded++;
        if (ntrain > 1)
            t->duplicated += ntrain - 1;
        if ((ntrain && nstale) || nstale > 1)
            t->inconsistent++;   /* ended twice */
        if (ntrain) {
            t->trained++;
            if (p && trained_sids)
                trained_sids[nts++] = p->sid;
        } else {
            t->stale++;
            if (p && find(&p->sid, tb->b, tb->nb, sizeof *tb->b, cmp_str))
                t->sent_back++;
            else if (!p)
                unknown_stale++;   /* a push a kill cut short: matched below by session */
            else if (recompute)
                t->recompute_lost++;   /* the window before the request is pushed */
            else
                t->dropped++;
        }
        i = j;
    }
    /* the pushes a kill cut short name their session in "A": those sent back say so in "B" */
    size_t matched = 0;
    for (size_t i = 0; i < tb->ndang; i++)
        if (find(&tb->dang[i], tb->b, tb->nb, sizeof *tb->b, cmp_str))
            matched++;
    if (matched > unknown_stale)
        matched = unknown_stale;
    t->sent_back += matched;
    if (recompute)
        t->recompute_lost += unknown_stale - matched;
    else
        t->dropped += unknown_stale;
    /* a session trained under two uids (a recompute redone twice) is trained twice too */
    if (trained_sids) {
        sort(trained_sids, nts, sizeof *trained_sids, cmp_str);
        for (size_t i = 1; i < nts; i++)
            if (!strcmp(trained_sids[i], trained_sids[i - 1]))
                t->duplicated++;
        free(trained_sids);
    }
    for (size_t i = 0; i < tb->np; i++) {
        if (first_commit(tb, tb->p[i].uid) == tb->nd)
            t->lost++;
        if (i && tb->p[i].uid == tb->p[i - 1].uid)
            t->inconsistent++;
        if (tb->f[tb->p[i].file].inc > 0)
            t->restarted_produced++;
        size_t sl = strlen(tb->p[i].sid);
        if (sl && tb->p[i].sid[sl - 1] == '+')
            t->recomputed++;
    }
    t->produced = tb->np + t->landed_unrecorded;
    for (size_t i = 0; i < tb->nt; i++) {
        dv x = tb->t[i];
        if (!has(tb->done, tb->nd, x))
            t->inconsistent++;   /* an ack that held without its commit */
        if (i && !cmp_dv(&tb->t[i], &tb->t[i - 1]))
            t->duplicated++;
        if (tb->f[x.file].drain)
            t->trained_by_drain++;
        else if (tb->f[x.file].inc > 0)
            t->restarted_trained++;
    }
    for (size_t i = 0; i < tb->nl; i++) {
        dv x = tb->l[i];
        if (!tb->f[x.file].killed || has(tb->done, tb->nd, x))
            continue;
        t->leased_by_killed++;   /* it died holding it: delivered again */
        for (size_t k = first_commit(tb, x.uid); k < tb->nd && tb->done[k].uid == x.uid; k++)
            if (has(tb->l, tb->nl, tb->done[k])) {
                t->redelivered_trained++;
                break;
            }
    }
}

int demo_rl_tally(ferry_store *s, const char *queue, const char *dir, ferry_sample_claims *claims,
                  bool recompute, rl_tally *t, char *err, size_t cap)
{
    memset(t, 0, sizeof *t);
    tab *tb = calloc(1, sizeof *tb);
    if (!tb)
        return snprintf(err, cap, "out of memory"), -1;
    int rc = read_ledgers(tb, dir, t, err, cap);
    if (rc == 0)
        rc = read_claims(tb, claims, t, err, cap);
    if (rc == 0) {
        payloads_left(s, queue, t);
        account(tb, recompute, t);
        /* a push in flight at a kill either landed or left its payload, at most one each */
        if (t->landed_unrecorded + t->orphaned_payloads > t->dangling_pushes)
            t->inconsistent += t->landed_unrecorded + t->orphaned_payloads - t->dangling_pushes;
        t->latency_ms_p50 = pct(tb->lat, tb->nlat, 0.50);
        t->latency_ms_p99 = pct(tb->lat, tb->nlat, 0.99);
        t->load_s_p50 = pct(tb->load, tb->nload, 0.50);
        t->publish_s_p50 = pct(tb->pub, tb->npub, 0.50);
    }
    for (size_t i = 0; i < tb->np; i++)
        free(tb->p[i].sid);
    for (size_t i = 0; i < tb->nb; i++)
        free(tb->b[i]);
    for (size_t i = 0; i < tb->ndang; i++)
        free(tb->dang[i]);
    free(tb->dang);
    free(tb->p), free(tb->l), free(tb->t), free(tb->done), free(tb->b);
    free(tb->lat), free(tb->load), free(tb->pub);
    free(tb);
    return rc;
}
