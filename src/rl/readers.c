/* Reader assignment for single-pull weight updates (rl_int.h, fr_readers_*).
 *
 * The goal is the update time of a rollout cluster: every node's NIC moves
 * bytes in (store reads of objects held elsewhere, pushes from readers on
 * other nodes) and out (pushes to other nodes, store reads served), and the
 * update lasts as long as the busiest direction of the busiest NIC. Each
 * demanded byte is read from the store once; the choice left is which
 * consumer reads it, and that choice moves load between NICs. A greedy
 * walk in a fixed order puts each piece where the resulting load of the
 * reader's node is lowest: longest-processing-time style, it keeps every
 * node within about one piece of the others once pieces are small
 * compared with a node's total (hence the chunking of shared ranges).
 *
 * Cost per object: sorting its runs, then per elementary range sorting
 * its consumers and, per piece, one pass over them. Nothing is expanded
 * per element or per byte. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/rl_int.h"

typedef struct cons {
    uint32_t worker, node;
    uint64_t off, len;
    uint32_t idx;             /* demand index */
} cons;

struct fr_readers {
    fr_rd_config cfg;
    uint32_t *wnode;
    fr_rd_load *load;
    uint64_t *wread;          /* per worker: bytes read */
    uint64_t *wfwd;           /* per worker: bytes forwarded on hop 2 */
    uint64_t store_read, pushed_cross, pushed_intra, nranges_all, npushes_all;
    /* per node scratch, valid where stamp == serial */
    uint64_t *stamp, serial;
    uint32_t *ncons;          /* consumer runs on the node in this range */
    uint64_t *dstamp, dserial;   /* per node: deleg valid where dstamp == dserial */
    uint32_t *deleg;          /* index into cons of the node's delegate */
    /* per object scratch */
    uint32_t *ord, *ends, *act, *pos;
    uint64_t *cuts;
    cons *c;
    uint32_t *nodes;          /* distinct consumer nodes of a range, ascending */
    size_t cap_d, cap_c;
    fr_rd_range *ranges;
    fr_rd_push *pushes;
    size_t nranges, cap_ranges, npushes, cap_pushes;
};

int fr_readers_open(const fr_rd_config *cfg, fr_readers **out)
{
    if (!cfg || !out || cfg->nworkers == 0 || cfg->nnodes == 0 || !cfg->worker_node)
        return FERRY_EINVAL;
    for (uint32_t w = 0; w < cfg->nworkers; w++)
        if (cfg->worker_node[w] >= cfg->nnodes)
            return FERRY_EINVAL;
    fr_readers *r = calloc(1, sizeof *r);
    if (!r)
        return FERRY_ENOMEM;
    r->cfg = *cfg;
    uint32_t nw = cfg->nworkers, nn = cfg->nnodes;
    r->wnode = malloc(nw * sizeof *r->wnode);
    r->wread = calloc(nw, sizeof *r->wread);
    r->wfwd = calloc(nw, sizeof *r->wfwd);
    r->load = calloc(nn, sizeof *r->load);
    r->stamp = calloc(nn, sizeof *r->stamp);
    r->ncons = calloc(nn, sizeof *r->ncons);
    r->deleg = calloc(nn, sizeof *r->deleg);
    r->dstamp = calloc(nn, sizeof *r->dstamp);
    r->nodes = calloc(nn, sizeof *r->nodes);
    if (!r->wnode || !r->wread || !r->wfwd || !r->load || !r->stamp || !r->ncons || !r->deleg ||
        !r->dstamp || !r->nodes) {
        fr_readers_close(r);
        return FERRY_ENOMEM;
    }
    memcpy(r->wnode, cfg->worker_node, nw * sizeof *r->wnode);
    r->cfg.worker_node = r->wnode;
    *out = r;
    return 0;
}

void fr_readers_close(fr_readers *r)
{
    if (!r)
        return;
    free(r->wnode), free(r->wread), free(r->wfwd), free(r->load), free(r->stamp);
    free(r->ncons), free(r->deleg), free(r->dstamp), free(r->nodes);
    free(r->ord), free(r->ends), free(r->act), free(r->pos), free(r->cuts), free(r->c);
    free(r->ranges), free(r->pushes);
    free(r);
}

const fr_rd_load *fr_readers_loads(const fr_readers *r) { return r->load; }
const uint64_t *fr_readers_wread(const fr_readers *r) { return r->wread; }
const uint64_t *fr_readers_wfwd(const fr_readers *r) { return r->wfwd; }

void fr_readers_seed(fr_readers *r, const fr_rd_seed *s)
{
    memcpy(r->load, s->load, r->cfg.nnodes * sizeof *r->load);
    memcpy(r->wread, s->wread, r->cfg.nworkers * sizeof *r->wread);
    memcpy(r->wfwd, s->wfwd, r->cfg.nworkers * sizeof *r->wfwd);
}

void fr_readers_summary(const fr_readers *r, fr_rd_summary *out)
{
    memset(out, 0, sizeof *out);
    out->store_read = r->store_read;
    out->pushed_cross = r->pushed_cross;
    out->pushed_intra = r->pushed_intra;
    out->ranges = r->nranges_all;
    out->pushes = r->npushes_all;
    double si = 0, so = 0;
    for (uint32_t n = 0; n < r->cfg.nnodes; n++) {
        const fr_rd_load *l = &r->load[n];
        uint64_t in = l->read_in + l->push_in, o = l->push_out + l->serve_out;
        if (in > out->max_in)
            out->max_in = in, out->max_in_node = n;
        if (o > out->max_out)
            out->max_out = o, out->max_out_node = n;
        si += (double)in;
        so += (double)o;
    }
    out->mean_in = si / r->cfg.nnodes;
    out->mean_out = so / r->cfg.nnodes;
}

/* ---- one object ------------------------------------------------------------------------ */

/* qsort has no context: the demand array being sorted is passed here. One
 * handle is used by one thread; planning in two threads at once uses two
 * handles but would share this, hence thread-local. */
static _Thread_local const fr_rd_demand *g_d;

static int by_start(const void *a, const void *b)
{
    const fr_rd_demand *x = &g_d[*(const uint32_t *)a], *y = &g_d[*(const uint32_t *)b];
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    if (x->worker != y->worker)
        return x->worker < y->worker ? -1 : 1;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

static int by_end(const void *a, const void *b)
{
    const fr_rd_demand *x = &g_d[*(const uint32_t *)a], *y = &g_d[*(const uint32_t *)b];
    uint64_t ex = x->off + x->len, ey = y->off + y->len;
    if (ex != ey)
        return ex < ey ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : *(const uint32_t *)a > *(const uint32_t *)b;
}

/* qsort, skipped when the input is in order already (runs usually come
 * sorted: by worker, then offset). */
static void sort(void *v, size_t n, size_t sz, int (*cmp)(const void *, const void *))
{
    const char *p = v;
    for (size_t i = 1; i < n; i++)
        if (cmp(p + (i - 1) * sz, p + i * sz) > 0) {
            qsort(v, n, sz, cmp);
            return;
        }
}

/* Consumers in (node, worker, off, len) order; the demand index breaks
 * exact duplicates (indistinguishable to every counter). */
static int by_cons(const void *a, const void *b)
{
    const cons *x = a, *y = b;
    if (x->node != y->node)
        return x->node < y->node ? -1 : 1;
    if (x->worker != y->worker)
        return x->worker < y->worker ? -1 : 1;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int reserve(fr_readers *r, size_t n)
{
    if (n <= r->cap_d)
        return 0;
    size_t cap = n < 64 ? 64 : n;
    uint32_t *o = realloc(r->ord, cap * sizeof *o);
    if (o) r->ord = o;
    uint32_t *e = realloc(r->ends, cap * sizeof *e);
    if (e) r->ends = e;
    uint32_t *a = realloc(r->act, cap * sizeof *a);
    if (a) r->act = a;
    uint32_t *p = realloc(r->pos, cap * sizeof *p);
    if (p) r->pos = p;
    uint64_t *c = realloc(r->cuts, 2 * cap * sizeof *c);
    if (c) r->cuts = c;
    cons *cc = realloc(r->c, cap * sizeof *cc);
    if (cc) r->c = cc;
    if (!o || !e || !a || !p || !c || !cc)
        return FERRY_ENOMEM;
    r->cap_d = cap;
    return 0;
}

static int add_push(fr_readers *r, uint32_t from, uint32_t to, uint32_t hop)
{
    if (fr_grow((void **)&r->pushes, &r->cap_pushes, r->npushes + 1, sizeof *r->pushes) < 0)
        return FERRY_ENOMEM;
    r->pushes[r->npushes++] = (fr_rd_push){ .from = from, .to = to, .hop = hop };
    return 0;
}

/* The reader of a piece of len bytes wanted by the m consumers r->c[0..m),
 * whose distinct nodes are r->nodes[0..nd) with counts in r->ncons: its
 * index in r->c. */
static size_t choose_reader(const fr_readers *r, uint32_t src, uint64_t len, size_t m, uint32_t nd)
{
    const cons *c = r->c;
    /* Each choice raises the node loads of every consumer node: the
     * reader's by its read and its pushes, the others' by what they are
     * pushed. Score a reader by the highest resulting load among those
     * nodes (the top two "not the reader" loads give it in O(1)), then by
     * its own node's resulting load, max(in, out) and then in + out (so
     * that the direction that is not the busiest one balances too), the
     * bytes it adds to NICs, the bytes its worker read so far, and the
     * lower worker id. */
    uint64_t top1 = 0, top2 = 0;
    uint32_t top1_node = UINT32_MAX;
    for (uint32_t k = 0; k < nd; k++) {
        uint32_t n = r->nodes[k];
        const fr_rd_load *l = &r->load[n];
        uint64_t in = l->read_in + l->push_in + len * (r->cfg.relay ? 1 : r->ncons[n]);
        uint64_t out = l->push_out + l->serve_out, v = in > out ? in : out;
        if (top1_node == UINT32_MAX || v > top1) {
            top2 = top1;
            top1 = v;
            top1_node = n;
        } else if (v > top2) {
            top2 = v;
        }
    }
    size_t best = 0;
    uint64_t best_score = UINT64_MAX, best_own = UINT64_MAX, best_sum = UINT64_MAX;
    uint64_t best_added = UINT64_MAX;
    for (size_t i = 0; i < m; i++) {
        if (i && c[i].worker == c[i - 1].worker)
            continue;
        uint32_t n = c[i].node;
        const fr_rd_load *l = &r->load[n];
        uint64_t pushes = r->cfg.relay ? nd - 1 : (uint64_t)(m - r->ncons[n]);
        uint64_t add_in = src != n ? len : 0, add_out = pushes * len;
        uint64_t in = l->read_in + l->push_in + add_in;
        uint64_t out = l->push_out + l->serve_out + add_out;
        uint64_t own = in > out ? in : out, sum = in + out, added = add_in + add_out;
        uint64_t others = n == top1_node ? top2 : top1;
        uint64_t score = own > others ? own : others;
        int cmp = score != best_score ? (score < best_score ? -1 : 1)
                : own != best_own ? (own < best_own ? -1 : 1)
                : sum != best_sum ? (sum < best_sum ? -1 : 1)
                : added != best_added ? (added < best_added ? -1 : 1)
                : r->wread[c[i].worker] != r->wread[c[best].worker]
                    ? (r->wread[c[i].worker] < r->wread[c[best].worker] ? -1 : 1)
                : c[i].worker < c[best].worker ? -1 : 1;
        if (cmp < 0) {
            best = i;
            best_score = score;
            best_own = own;
            best_sum = sum;
            best_added = added;
        }
    }
    return best;
}

/* One piece [off, off+len) wanted by the m consumers r->c[0..m), whose
 * distinct nodes are r->nodes[0..nd) with counts in r->ncons: its reader,
 * its pushes, the loads. */
static int assign_piece(fr_readers *r, uint32_t src, uint64_t off, uint64_t len, size_t m,
                        uint32_t nd)
{
    const cons *c = r->c;
    size_t best = choose_reader(r, src, len, m, nd);
    const cons *rd = &c[best];
    uint32_t rn = rd->node;
    if (fr_grow((void **)&r->ranges, &r->cap_ranges, r->nranges + 1, sizeof *r->ranges) < 0)
        return FERRY_ENOMEM;
    fr_rd_range *g = &r->ranges[r->nranges++];
    *g = (fr_rd_range){ .off = off, .len = len, .reader = rd->idx, .push = r->npushes };
    r->wread[rd->worker] += len;
    r->store_read += len;
    if (src != rn) {
        r->load[rn].read_in += len;
        if (src != FR_RD_NO_NODE)
            r->load[src].serve_out += len;
    }
    /* delegates: per other node the consumer that forwarded least */
    r->dserial++;
    for (size_t i = 0; r->cfg.relay && i < m; i++) {
        uint32_t n = c[i].node;
        if (n == rn)
            continue;
        if (r->dstamp[n] != r->dserial) {
            r->dstamp[n] = r->dserial;
            r->deleg[n] = (uint32_t)i;
        } else if (r->wfwd[c[i].worker] < r->wfwd[c[r->deleg[n]].worker]) {
            r->deleg[n] = (uint32_t)i;
        }
    }
    /* hop 1, then hop 2, each in (node, worker) order: c's order */
    if (fr_grow((void **)&r->pushes, &r->cap_pushes, r->npushes + m, sizeof *r->pushes) < 0)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < m; i++) {
        uint32_t n = c[i].node;
        if (i == best)
            continue;
        bool cross = n != rn;
        if (cross && r->cfg.relay && r->deleg[n] != i)
            continue;
        if (add_push(r, rd->idx, c[i].idx, 1) < 0)
            return FERRY_ENOMEM;
        if (cross) {
            r->load[rn].push_out += len;
            r->load[n].push_in += len;
            r->pushed_cross += len;
        } else {
            r->load[n].intra += len;
            r->pushed_intra += len;
        }
    }
    for (size_t i = 0; r->cfg.relay && i < m; i++) {
        uint32_t n = c[i].node;
        if (n == rn || i == r->deleg[n])
            continue;
        const cons *dl = &c[r->deleg[n]];
        if (add_push(r, dl->idx, c[i].idx, 2) < 0)
            return FERRY_ENOMEM;
        r->load[n].intra += len;
        r->pushed_intra += len;
        r->wfwd[dl->worker] += len;
    }
    g = &r->ranges[r->nranges - 1];
    g->npush = (uint32_t)(r->npushes - g->push);
    return 0;
}

/* The active runs over [lo, hi): sort them, find their nodes, cut. */
static int assign_range(fr_readers *r, uint32_t src, const fr_rd_demand *d, size_t nact,
                        uint64_t lo, uint64_t hi)
{
    cons *c = r->c;
    for (size_t i = 0; i < nact; i++) {
        const fr_rd_demand *x = &d[r->act[i]];
        c[i] = (cons){ .worker = x->worker, .node = r->wnode[x->worker], .off = x->off,
                       .len = x->len, .idx = r->act[i] };
    }
    sort(c, nact, sizeof *c, by_cons);
    r->serial++;
    uint32_t nd = 0;
    bool shared = false;
    for (size_t i = 0; i < nact; i++) {
        uint32_t n = c[i].node;
        if (r->stamp[n] != r->serial) {
            r->stamp[n] = r->serial;
            r->ncons[n] = 0;
            r->nodes[nd++] = n;
        }
        r->ncons[n]++;
        shared |= c[i].worker != c[0].worker;
    }
    uint64_t piece = shared && r->cfg.chunk ? r->cfg.chunk : hi - lo;
    for (uint64_t at = lo; at < hi; at += piece) {
        int rc = assign_piece(r, src, at, hi - at < piece ? hi - at : piece, nact, nd);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* An object one run wants (most of them in a large group: an expert's TP
 * shard has one holder): what the sweep below gives for it, without the
 * sweep — one range, read by its only consumer, no pushes. */
static int single(fr_readers *r, uint32_t src, uint64_t size, const fr_rd_demand *d,
                  const fr_rd_range **ranges, size_t *nranges, const fr_rd_push **pushes,
                  size_t *npushes)
{
    if (d->worker >= r->cfg.nworkers || d->off > size || d->len > size - d->off)
        return FERRY_EINVAL;
    if (d->len) {
        if (fr_grow((void **)&r->ranges, &r->cap_ranges, 1, sizeof *r->ranges) < 0)
            return FERRY_ENOMEM;
        uint32_t rn = r->wnode[d->worker];
        r->ranges[0] = (fr_rd_range){ .off = d->off, .len = d->len, .reader = 0, .push = 0 };
        r->nranges = 1;
        r->wread[d->worker] += d->len;
        r->store_read += d->len;
        if (src != rn) {
            r->load[rn].read_in += d->len;
            if (src != FR_RD_NO_NODE)
                r->load[src].serve_out += d->len;
        }
    }
    r->nranges_all += r->nranges;
    *ranges = r->ranges, *nranges = r->nranges;
    *pushes = r->pushes, *npushes = 0;
    return 0;
}

int fr_readers_object(fr_readers *r, uint32_t src_node, uint64_t size, const fr_rd_demand *d,
                      size_t n, const fr_rd_range **ranges, size_t *nranges,
                      const fr_rd_push **pushes, size_t *npushes)
{
    if (!r || (n && !d) || !ranges || !nranges || !pushes || !npushes || n > UINT32_MAX ||
        (src_node != FR_RD_NO_NODE && src_node >= r->cfg.nnodes))
        return FERRY_EINVAL;
    r->nranges = r->npushes = 0;
    *ranges = NULL, *pushes = NULL, *nranges = *npushes = 0;
    if (n == 1)
        return single(r, src_node, size, d, ranges, nranges, pushes, npushes);
    if (reserve(r, n) < 0)
        return FERRY_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i].worker >= r->cfg.nworkers || d[i].off > size || d[i].len > size - d[i].off)
            return FERRY_EINVAL;
        if (d[i].len)
            r->ord[k++] = (uint32_t)i;
    }
    memcpy(r->ends, r->ord, k * sizeof *r->ends);
    g_d = d;
    sort(r->ord, k, sizeof *r->ord, by_start);
    sort(r->ends, k, sizeof *r->ends, by_end);
    /* every start and end, in order: a merge of the two sorted lists */
    size_t nc = 0;
    for (size_t a = 0, b = 0; a < k || b < k;) {
        uint64_t x = a < k ? d[r->ord[a]].off : UINT64_MAX;
        uint64_t y = b < k ? d[r->ends[b]].off + d[r->ends[b]].len : UINT64_MAX;
        if (a < k && x <= y)
            r->cuts[nc++] = x, a++;
        else
            r->cuts[nc++] = y, b++;
    }
    size_t si = 0, ei = 0, nact = 0;
    int rc = 0;
    for (size_t j = 0; j < nc && rc == 0; j++) {
        uint64_t at = r->cuts[j];
        if (j && r->cuts[j - 1] == at)
            continue;
        for (; ei < k && d[r->ends[ei]].off + d[r->ends[ei]].len == at; ei++) {
            uint32_t x = r->ends[ei], p = r->pos[x];
            r->act[p] = r->act[--nact];
            r->pos[r->act[p]] = p;
        }
        for (; si < k && d[r->ord[si]].off == at; si++) {
            r->pos[r->ord[si]] = (uint32_t)nact;
            r->act[nact++] = r->ord[si];
        }
        size_t nx = j + 1;
        while (nx < nc && r->cuts[nx] == at)
            nx++;
        if (nact && nx < nc)
            rc = assign_range(r, src_node, d, nact, at, r->cuts[nx]);
    }
    g_d = NULL;
    if (rc < 0)
        return rc;
    r->nranges_all += r->nranges;
    r->npushes_all += r->npushes;
    *ranges = r->ranges, *nranges = r->nranges;
    *pushes = r->pushes, *npushes = r->npushes;
    return 0;
}
