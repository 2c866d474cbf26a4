/* Interval sets (sorted, disjoint, coalesced half-open intervals) and the
 * partition of tagged intervals into disjoint pieces. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void fr_iset_init(fr_iset *s)
{
    s->v = NULL;
    s->n = 0;
    s->cap = 0;
}

void fr_iset_free(fr_iset *s)
{
    if (s == NULL)
        return;
    fr_free(s->v);
    fr_iset_init(s);
}

void fr_iset_clear(fr_iset *s)
{
    s->n = 0;
}

/* Both the starts and the ends of a coalesced set are strictly increasing,
 * so "how many intervals end (start) before x" is a binary search. */
static size_t fr_count_end_below(const fr_iset *s, uint64_t x, bool or_equal)
{
    size_t lo = 0, hi = s->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t e = s->v[mid].end;
        if (e < x || (or_equal && e == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static size_t fr_count_start_below(const fr_iset *s, uint64_t x, bool or_equal)
{
    size_t lo = 0, hi = s->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t b = s->v[mid].start;
        if (b < x || (or_equal && b == x))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Replaces v[i, j) with the r intervals of repl. Grows before touching the
 * set, so on failure the set is unchanged. */
static int fr_iset_splice(fr_iset *s, size_t i, size_t j, const fr_interval *repl, size_t r)
{
    size_t n = s->n - (j - i) + r;
    int rc = fr_grow((void **)&s->v, &s->cap, n, sizeof(*s->v));

    if (rc < 0)
        return rc;
    memmove(s->v + i + r, s->v + j, (s->n - j) * sizeof(*s->v));
    memcpy(s->v + i, repl, r * sizeof(*repl));
    s->n = n;
    return 0;
}

int fr_iset_insert(fr_iset *s, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 0;
    /* [i, j): every interval that overlaps or touches [start, end). */
    size_t i = fr_count_end_below(s, start, false);
    size_t j = fr_count_start_below(s, end, true);
    fr_interval merged = { start, end };

    if (i < j) {
        if (s->v[i].start < merged.start)
            merged.start = s->v[i].start;
        if (s->v[j - 1].end > merged.end)
            merged.end = s->v[j - 1].end;
    }
    return fr_iset_splice(s, i, j, &merged, 1);
}

int fr_iset_subtract(fr_iset *s, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 0;
    /* [i, j): every interval that overlaps [start, end). */
    size_t i = fr_count_end_below(s, start, true);
    size_t j = fr_count_start_below(s, end, false);
    fr_interval keep[2];
    size_t r = 0;

    if (i == j)
        return 0;
    if (s->v[i].start < start)
        keep[r++] = (fr_interval){ s->v[i].start, start };
    if (s->v[j - 1].end > end)
        keep[r++] = (fr_interval){ end, s->v[j - 1].end };
    return fr_iset_splice(s, i, j, keep, r);
}

bool fr_iset_contains(const fr_iset *s, uint64_t start, uint64_t end)
{
    if (start >= end)
        return true;
    size_t i = fr_count_end_below(s, start, true);
    return i < s->n && s->v[i].start <= start && s->v[i].end >= end;
}

bool fr_iset_overlaps(const fr_iset *s, uint64_t start, uint64_t end)
{
    if (start >= end)
        return false;
    size_t i = fr_count_end_below(s, start, true);
    return i < s->n && s->v[i].start < end;
}

uint64_t fr_iset_total(const fr_iset *s)
{
    uint64_t total = 0;

    /* Disjoint intervals inside [0, UINT64_MAX] cannot sum past it. */
    for (size_t i = 0; i < s->n; i++)
        total += s->v[i].end - s->v[i].start;
    return total;
}

/* ---- whole-set operations: linear merges into a scratch set ----------- */

/* Sized for the worst case up front so the merge itself cannot fail. */
static int fr_scratch(fr_iset *t, size_t cap)
{
    fr_iset_init(t);
    return fr_grow((void **)&t->v, &t->cap, cap, sizeof(*t->v));
}

/* Appends in start order, coalescing with the last interval. */
static void fr_push(fr_iset *t, uint64_t start, uint64_t end)
{
    fr_interval *last = t->n > 0 ? &t->v[t->n - 1] : NULL;

    if (last != NULL && last->end >= start) {
        if (end > last->end)
            last->end = end;
        return;
    }
    t->v[t->n++] = (fr_interval){ start, end };
}

/* Installs the result only after it is complete, so inputs may alias dst. */
static void fr_adopt(fr_iset *dst, fr_iset *t)
{
    fr_free(dst->v);
    *dst = *t;
}

int fr_iset_union(fr_iset *dst, const fr_iset *src)
{
    fr_iset t;
    size_t i = 0, j = 0;

    if (src->n == 0 || dst == src)
        return 0;
    int rc = fr_scratch(&t, dst->n + src->n);
    if (rc < 0)
        return rc;
    while (i < dst->n || j < src->n) {
        bool take_dst = j == src->n || (i < dst->n && dst->v[i].start <= src->v[j].start);
        const fr_interval *x = take_dst ? &dst->v[i++] : &src->v[j++];
        fr_push(&t, x->start, x->end);
    }
    fr_adopt(dst, &t);
    return 0;
}

/* Appends a minus the intervals of b from *j on; leaves *j at the first b
 * interval that may still overlap the next a. */
static void fr_subtract_one(fr_iset *t, fr_interval a, const fr_iset *b, size_t *j)
{
    uint64_t cur = a.start;

    while (*j < b->n && b->v[*j].end <= cur)
        (*j)++;
    while (*j < b->n && b->v[*j].start < a.end) {
        if (b->v[*j].start > cur)
            fr_push(t, cur, b->v[*j].start);
        if (b->v[*j].end > cur)
            cur = b->v[*j].end;
        if (cur >= a.end)
            return;
        (*j)++;
    }
    fr_push(t, cur, a.end);
}

int fr_iset_subtract_set(fr_iset *dst, const fr_iset *src)
{
    fr_iset t;
    size_t j = 0;

    if (dst->n == 0 || src->n == 0)
        return 0;
    /* Each src interval splits at most one dst interval in two. */
    int rc = fr_scratch(&t, dst->n + src->n);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < dst->n; i++)
        fr_subtract_one(&t, dst->v[i], src, &j);
    fr_adopt(dst, &t);
    return 0;
}

int fr_iset_intersect(fr_iset *out, const fr_iset *a, const fr_iset *b)
{
    fr_iset t;
    size_t i = 0, j = 0;

    if (a->n == 0 || b->n == 0) {
        fr_iset_clear(out);
        return 0;
    }
    int rc = fr_scratch(&t, a->n + b->n);
    if (rc < 0)
        return rc;
    while (i < a->n && j < b->n) {
        const fr_interval *x = &a->v[i], *y = &b->v[j];
        uint64_t lo = x->start > y->start ? x->start : y->start;
        uint64_t hi = x->end < y->end ? x->end : y->end;
        if (lo < hi)
            fr_push(&t, lo, hi);
        if (x->end < y->end)
            i++;
        else
            j++;
    }
    fr_adopt(out, &t);
    return 0;
}

/* ---- partition -------------------------------------------------------- */

/* Sweep over interval endpoints. Tags are mapped to dense ranks; the active
 * ranks sit in a sorted doubly linked list so each piece's tag list is read
 * in O(tags), and a Fenwick tree over "rank active" finds the list
 * predecessor of a newly active rank in O(log n). */
typedef struct {
    uint64_t pos;
    size_t rank;
    int is_end;   /* starts sort before ends at one point, so a tag that ends
                   * where it starts again never leaves the active set */
} fr_event;

typedef struct {
    const uint64_t *tags; /* distinct, ascending; rank = index */
    size_t m;
    size_t *count;        /* open input intervals per rank */
    size_t *fenwick;      /* 1-based; 1 where a rank is active */
    size_t *next, *prev;  /* circular list of active ranks, head m */
    size_t nactive;
    fr_piece *pieces;
    size_t npieces, pcap;
    uint64_t *out_tags;
    size_t ntags, tcap;
} fr_sweep;

static int fr_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int fr_cmp_event(const void *a, const void *b)
{
    const fr_event *x = a, *y = b;
    if (x->pos != y->pos)
        return (x->pos > y->pos) - (x->pos < y->pos);
    return x->is_end - y->is_end;
}

static void fr_fenwick_add(fr_sweep *w, size_t rank, bool add)
{
    for (size_t i = rank + 1; i <= w->m; i += i & (~i + 1)) {
        if (add)
            w->fenwick[i]++;
        else
            w->fenwick[i]--;
    }
}

/* Number of active ranks below rank. */
static size_t fr_fenwick_prefix(const fr_sweep *w, size_t rank)
{
    size_t sum = 0;

    for (size_t i = rank; i > 0; i -= i & (~i + 1))
        sum += w->fenwick[i];
    return sum;
}

/* Rank of the k-th (1-based) active rank. */
static size_t fr_fenwick_kth(const fr_sweep *w, size_t k)
{
    size_t pos = 0, step = 1;

    while (step <= w->m / 2)
        step <<= 1;
    for (; step > 0; step >>= 1) {
        if (pos + step <= w->m && w->fenwick[pos + step] < k) {
            pos += step;
            k -= w->fenwick[pos];
        }
    }
    return pos;
}

static void fr_activate(fr_sweep *w, size_t r)
{
    size_t below = fr_fenwick_prefix(w, r);
    size_t pred = below == 0 ? w->m : fr_fenwick_kth(w, below);
    size_t succ = w->next[pred];

    w->next[pred] = r;
    w->prev[r] = pred;
    w->next[r] = succ;
    w->prev[succ] = r;
    fr_fenwick_add(w, r, true);
    w->nactive++;
}

static void fr_deactivate(fr_sweep *w, size_t r)
{
    w->next[w->prev[r]] = w->next[r];
    w->prev[w->next[r]] = w->prev[r];
    fr_fenwick_add(w, r, false);
    w->nactive--;
}

/* Returns whether the set of active tags changed. */
static bool fr_apply(fr_sweep *w, const fr_event *e)
{
    if (!e->is_end) {
        if (w->count[e->rank]++ > 0)
            return false;
        fr_activate(w, e->rank);
        return true;
    }
    if (--w->count[e->rank] > 0)
        return false;
    fr_deactivate(w, e->rank);
    return true;
}

/* Opens a piece at pos carrying the active tags; its end is set later. */
static int fr_open_piece(fr_sweep *w, uint64_t pos)
{
    int rc = fr_grow((void **)&w->pieces, &w->pcap, w->npieces + 1, sizeof(*w->pieces));
    if (rc == 0)
        rc = fr_grow((void **)&w->out_tags, &w->tcap, w->ntags + w->nactive, sizeof(*w->out_tags));
    if (rc < 0)
        return rc;
    w->pieces[w->npieces++] = (fr_piece){ pos, pos, (uint32_t)w->nactive, NULL };
    for (size_t r = w->next[w->m]; r != w->m; r = w->next[r])
        w->out_tags[w->ntags++] = w->tags[r];
    return 0;
}

static int fr_sweep_run(fr_sweep *w, const fr_event *ev, size_t nev)
{
    bool open = false;
    size_t e = 0;

    while (e < nev) {
        uint64_t pos = ev[e].pos;
        bool changed = false;
        for (; e < nev && ev[e].pos == pos; e++)
            changed |= fr_apply(w, &ev[e]);
        if (!changed)
            continue;
        if (open)
            w->pieces[w->npieces - 1].end = pos;
        open = w->nactive > 0;
        if (open) {
            int rc = fr_open_piece(w, pos);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Distinct tags of the non-empty inputs, ascending; events for each. */
static int fr_collect(const fr_tagged_interval *in, size_t n, uint64_t **tags, size_t *m,
                      fr_event **ev, size_t *nev)
{
    size_t k = 0, u = 0;

    *tags = fr_reallocarray(NULL, n, sizeof(**tags));
    *ev = fr_reallocarray(NULL, n, 2 * sizeof(**ev));
    if (*tags == NULL || *ev == NULL)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (in[i].start < in[i].end)
            (*tags)[k++] = in[i].tag;
    qsort(*tags, k, sizeof(**tags), fr_cmp_u64);
    for (size_t i = 0; i < k; i++)
        if (u == 0 || (*tags)[u - 1] != (*tags)[i])
            (*tags)[u++] = (*tags)[i];
    *m = u;
    *nev = 0;
    for (size_t i = 0; i < n; i++) {
        if (in[i].start >= in[i].end)
            continue;
        const uint64_t *t = bsearch(&in[i].tag, *tags, u, sizeof(**tags), fr_cmp_u64);
        size_t r = (size_t)(t - *tags);
        (*ev)[(*nev)++] = (fr_event){ in[i].start, r, 0 };
        (*ev)[(*nev)++] = (fr_event){ in[i].end, r, 1 };
    }
    qsort(*ev, *nev, sizeof(**ev), fr_cmp_event);
    return 0;
}

static int fr_sweep_init(fr_sweep *w, const uint64_t *tags, size_t m)
{
    memset(w, 0, sizeof(*w));
    w->tags = tags;
    w->m = m;
    if (m > UINT32_MAX)
        return FERRY_ERANGE; /* fr_piece.ntags is 32-bit */
    w->count = fr_calloc(m + 1, sizeof(size_t));
    w->fenwick = fr_calloc(m + 1, sizeof(size_t));
    w->next = fr_calloc(m + 1, sizeof(size_t));
    w->prev = fr_calloc(m + 1, sizeof(size_t));
    if (!w->count || !w->fenwick || !w->next || !w->prev)
        return FERRY_ENOMEM;
    w->next[m] = w->prev[m] = m;
    return 0;
}

static void fr_sweep_fini(fr_sweep *w)
{
    fr_free(w->count);
    fr_free(w->fenwick);
    fr_free(w->next);
    fr_free(w->prev);
}

/* Tag storage may have moved while growing, so pointers are set last. */
static void fr_partition_finish(fr_sweep *w, fr_partition *out)
{
    size_t off = 0;

    for (size_t i = 0; i < w->npieces; i++) {
        w->pieces[i].tags = w->out_tags + off;
        off += w->pieces[i].ntags;
    }
    out->pieces = w->pieces;
    out->n = w->npieces;
    out->tag_storage = w->out_tags;
}

int fr_partition_build(const fr_tagged_interval *in, size_t n, fr_partition *out)
{
    uint64_t *tags = NULL;
    fr_event *ev = NULL;
    size_t m = 0, nev = 0;
    fr_sweep w;

    if (out == NULL || (in == NULL && n > 0))
        return FERRY_EINVAL;
    memset(out, 0, sizeof(*out));
    memset(&w, 0, sizeof(w));
    int rc = fr_collect(in, n, &tags, &m, &ev, &nev);
    if (rc == 0)
        rc = fr_sweep_init(&w, tags, m);
    if (rc == 0)
        rc = fr_sweep_run(&w, ev, nev);
    if (rc == 0)
        fr_partition_finish(&w, out);
    else {
        fr_free(w.pieces);
        fr_free(w.out_tags);
    }
    fr_sweep_fini(&w);
    fr_free(tags);
    fr_free(ev);
    return rc;
}

void fr_partition_free(fr_partition *p)
{
    if (p == NULL)
        return;
    fr_free(p->pieces);
    fr_free(p->tag_storage);
    memset(p, 0, sizeof(*p));
}
