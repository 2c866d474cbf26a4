/* `ferry plan --model M --src L --dst L --nic BW`: the weight update of a
 * modelled cluster, per NIC, for four ways of doing it (docs/weights.md,
 * "Reader assignment and the at-scale model").
 *
 * Cluster: the trainers (src layout) on their nodes, each tensor stored by
 * the rank ferry_weights_assign picks, on that rank's node; the rollout
 * workers (dst layout) on nodes of their own after the trainers'. A
 * worker's demand is its fragments of the dst layout.
 *
 * Coordinates: per tensor, the box edges of every fragment cut each dim;
 * the grid cells are held wholly or not at all by every fragment, so the
 * cells, laid end to end in row-major order, are the tensor's bytes in an
 * order in which every fragment is a few contiguous runs. Byte counts are
 * exact; offsets are not the row-major ones (a TP row shard would be one
 * run per row there — a billion runs for kimi-k2 — and one run here). The
 * reader assignment is the code the subscriber runs (src/rl/readers.c). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../rl/rl_int.h"   /* the reader assignment: internal, the same code pull.c uses */

#define CHUNK (4ull << 20)
#define MAX_CELLS (1u << 20)

enum { S_DIRECT, S_COMPAT, S_BCAST, S_NAIVE, S_FLOOR, S_COUNT };
static const char *const s_key[S_COUNT] = { "direct", "compat", "broadcast", "naive", "lower_bound" };
static const char *const s_name[S_COUNT] = { "ferry direct", "ferry compatibility",
                                             "broadcast from rank 0", "every worker reads",
                                             "lower bound" };

typedef struct totals {
    uint64_t *in, *out;           /* per node */
    uint64_t store_read, cross_push;
} totals;

typedef struct fbox { uint32_t rank; uint64_t off[FERRY_MAX_DIMS], shape[FERRY_MAX_DIMS]; } fbox;

typedef struct model_run {
    uint32_t nnodes, ntrainer_nodes, nworkers;
    uint32_t *wnode;              /* rollout worker -> node */
    totals t[S_COUNT];
    fr_readers *direct, *compat;
    /* per tensor scratch */
    fbox *boxes;
    size_t nboxes, cap_boxes;
    fr_rd_demand *d;
    size_t nd, cap_d;
    uint64_t *cuts[FERRY_MAX_DIMS];
    uint32_t ncuts[FERRY_MAX_DIMS];
    uint64_t *voff;               /* per cell: offset in the cell order (+1 entry: the total) */
    uint8_t *need;                /* per (cell, node): a worker of the node holds the cell */
    size_t cap_cells;
    uint64_t demand_bytes, model_bytes;
    double assign_s;
} model_run;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* "400gbps", "100Gb/s", "25GB/s", "12.5GBps": b = bits, B = bytes. */
static int parse_bw(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0) || !isfinite(v))
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1e3; end++; break;
    case 'm': case 'M': mul = 1e6; end++; break;
    case 'g': case 'G': mul = 1e9; end++; break;
    case 't': case 'T': mul = 1e12; end++; break;
    default: break;
    }
    if (*end == 'b')
        mul /= 8;
    else if (*end != 'B')
        return -1;
    end++;
    if (strcmp(end, "ps") && strcmp(end, "/s") && strcmp(end, "it/s") && strcmp(end, "its/s"))
        return -1;
    *out = v * mul;
    return 0;
}

static int grow(void **v, size_t *cap, size_t need, size_t esz)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *n = realloc(*v, c * esz);
    if (!n)
        return -1;
    *v = n;
    *cap = c;
    return 0;
}

/* The cell grid of the tensor's boxes; returns the cell count, 0 on failure. */
static size_t cell_grid(model_run *m, const ferry_tensor_desc *t)
{
    size_t cells = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        uint64_t *c = realloc(m->cuts[d], (2 * m->nboxes + 2) * sizeof *c);
        if (!c)
            return 0;
        m->cuts[d] = c;
        size_t n = 0;
        c[n++] = 0;
        c[n++] = t->shape[d];
        for (size_t b = 0; b < m->nboxes; b++) {
            c[n++] = m->boxes[b].off[d];
            c[n++] = m->boxes[b].off[d] + m->boxes[b].shape[d];
        }
        qsort(c, n, sizeof *c, cmp_u64);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (i == 0 || c[i] != c[k - 1])
                c[k++] = c[i];
        m->ncuts[d] = (uint32_t)k;
        cells *= k - 1;
        if (cells > MAX_CELLS)
            return 0;
    }
    if (grow((void **)&m->voff, &m->cap_cells, cells + 1, sizeof *m->voff) < 0)
        return 0;
    uint8_t *need = realloc(m->need, cells * m->nnodes);
    if (!need)
        return 0;
    m->need = need;
    memset(need, 0, cells * m->nnodes);
    /* offsets in row-major cell order */
    uint32_t idx[FERRY_MAX_DIMS] = {0};
    uint64_t at = 0;
    for (size_t c = 0; c < cells; c++) {
        m->voff[c] = at;
        uint64_t b = t->itemsize;
        for (uint32_t d = 0; d < t->ndim; d++)
            b *= m->cuts[d][idx[d] + 1] - m->cuts[d][idx[d]];
        at += b;
        for (int d = (int)t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < m->ncuts[d] - 1)
                break;
            idx[d] = 0;
        }
    }
    m->voff[cells] = at;
    return cells;
}

static uint32_t cut_index(const uint64_t *c, uint32_t n, uint64_t v)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (c[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Every box's cells as demand runs (adjacent cells merged). */
static int box_runs(model_run *m, const ferry_tensor_desc *t)
{
    m->nd = 0;
    for (size_t b = 0; b < m->nboxes; b++) {
        const fbox *x = &m->boxes[b];
        uint32_t lo[FERRY_MAX_DIMS], hi[FERRY_MAX_DIMS], idx[FERRY_MAX_DIMS];
        for (uint32_t d = 0; d < t->ndim; d++) {
            lo[d] = idx[d] = cut_index(m->cuts[d], m->ncuts[d], x->off[d]);
            hi[d] = cut_index(m->cuts[d], m->ncuts[d], x->off[d] + x->shape[d]);
        }
        uint32_t node = m->wnode[x->rank];
        for (;;) {
            size_t cell = 0;
            for (uint32_t d = 0; d < t->ndim; d++)
                cell = cell * (m->ncuts[d] - 1) + idx[d];
            uint64_t off = m->voff[cell], len = m->voff[cell + 1] - off;
            m->need[cell * m->nnodes + node] = 1;
            fr_rd_demand *last = m->nd ? &m->d[m->nd - 1] : NULL;
            if (last && last->worker == x->rank && last->off + last->len == off) {
                last->len += len;
            } else {
                if (grow((void **)&m->d, &m->cap_d, m->nd + 1, sizeof *m->d) < 0)
                    return -1;
                m->d[m->nd++] = (fr_rd_demand){ x->rank, off, len };
            }
            int d = (int)t->ndim - 1;
            for (; d >= 0; d--) {
                if (++idx[d] < hi[d])
                    break;
                idx[d] = lo[d];
            }
            if (d < 0)
                break;
        }
    }
    return 0;
}

/* One tensor under the four strategies and the lower bound. */
static int one_tensor(model_run *m, const ferry_tensor_desc *t, uint32_t src)
{
    size_t cells = cell_grid(m, t);
    if (!cells || box_runs(m, t) < 0)
        return -1;
    uint64_t size = m->voff[cells];
    m->model_bytes += size;
    const fr_rd_range *g;
    const fr_rd_push *p;
    size_t ng, np;
    double t0 = cli_now();
    if (fr_readers_object(m->direct, src, size, m->d, m->nd, &g, &ng, &p, &np) < 0)
        return -1;
    m->assign_s += cli_now() - t0;
    uint64_t uni = 0;
    for (size_t i = 0; i < ng; i++)
        uni += g[i].len;
    /* every worker reads its own */
    totals *nv = &m->t[S_NAIVE], *bc = &m->t[S_BCAST], *fl = &m->t[S_FLOOR];
    uint32_t n0 = m->wnode[0];
    for (size_t i = 0; i < m->nd; i++) {
        uint32_t n = m->wnode[m->d[i].worker];
        uint64_t len = m->d[i].len;
        m->demand_bytes += len;
        nv->store_read += len;
        if (n != src) {
            nv->in[n] += len;
            nv->out[src] += len;
        }
        if (n != n0) {   /* broadcast: rank 0 sends each worker its demand */
            bc->out[n0] += len;
            bc->in[n] += len;
            bc->cross_push += len;
        }
    }
    bc->store_read += uni;
    if (n0 != src) {
        bc->in[n0] += uni;
        bc->out[src] += uni;
    }
    /* lower bound: every node takes in each cell one of its workers holds
     * once; the store node sends each such cell out once */
    fl->store_read += uni;
    for (size_t c = 0; c < cells; c++) {
        uint64_t len = m->voff[c + 1] - m->voff[c];
        bool away = false;
        for (uint32_t n = 0; n < m->nnodes; n++)
            if (m->need[c * m->nnodes + n] && n != src) {
                fl->in[n] += len;
                away = true;
            }
        if (away)
            fl->out[src] += len;
    }
    /* compatibility: every worker, the whole tensor */
    m->nd = 0;
    if (grow((void **)&m->d, &m->cap_d, m->nworkers, sizeof *m->d) < 0)
        return -1;
    for (uint32_t w = 0; w < m->nworkers; w++)
        m->d[m->nd++] = (fr_rd_demand){ w, 0, size };
    t0 = cli_now();
    if (fr_readers_object(m->compat, src, size, m->d, m->nd, &g, &ng, &p, &np) < 0)
        return -1;
    m->assign_s += cli_now() - t0;
    return 0;
}

static void from_readers(totals *t, const fr_readers *r, uint32_t nnodes)
{
    const fr_rd_load *l = fr_readers_loads(r);
    fr_rd_summary s;
    fr_readers_summary(r, &s);
    for (uint32_t n = 0; n < nnodes; n++) {
        t->in[n] = l[n].read_in + l[n].push_in;
        t->out[n] = l[n].push_out + l[n].serve_out;
    }
    t->store_read = s.store_read;
    t->cross_push = s.pushed_cross;
}

typedef struct figures {
    uint64_t max_in, max_out, store_read, cross_push;
    double mean_in, mean_out, time_s;
} figures;

static figures figures_of(const totals *t, uint32_t nnodes, uint32_t nics, double bw)
{
    figures f = { .store_read = t->store_read, .cross_push = t->cross_push };
    uint64_t worst = 0;
    for (uint32_t n = 0; n < nnodes; n++) {
        f.max_in = t->in[n] > f.max_in ? t->in[n] : f.max_in;
        f.max_out = t->out[n] > f.max_out ? t->out[n] : f.max_out;
        f.mean_in += (double)t->in[n];
        f.mean_out += (double)t->out[n];
        uint64_t w = t->in[n] > t->out[n] ? t->in[n] : t->out[n];
        worst = w > worst ? w : worst;
    }
    /* per NIC: a node's bytes spread over its NICs */
    f.mean_in /= (double)nnodes * nics;
    f.mean_out /= (double)nnodes * nics;
    f.max_in /= nics;
    f.max_out /= nics;
    f.time_s = (double)worst / nics / bw;
    return f;
}

static void model_free(model_run *m)
{
    free(m->wnode);
    for (int s = 0; s < S_COUNT; s++)
        free(m->t[s].in), free(m->t[s].out);
    fr_readers_close(m->direct);
    fr_readers_close(m->compat);
    free(m->boxes);
    free(m->d);
    for (int d = 0; d < FERRY_MAX_DIMS; d++)
        free(m->cuts[d]);
    free(m->voff);
    free(m->need);
}

static int build(model_run *m, const ferry_manifest *src, const ferry_manifest *dst)
{
    uint32_t sr = ferry_manifest_rank_count(src), nt = ferry_manifest_tensor_count(dst);
    uint32_t *rank_node = malloc(sr * sizeof *rank_node);
    uint64_t *bytes = malloc((nt ? nt : 1) * sizeof *bytes);
    uint32_t *pub = malloc((nt ? nt : 1) * sizeof *pub);
    int rc = rank_node && bytes && pub ? 0 : -1;
    for (uint32_t r = 0; rc == 0 && r < sr; r++) {
        rank_node[r] = ferry_manifest_node_of(src, r);
        m->ntrainer_nodes = rank_node[r] + 1 > m->ntrainer_nodes ? rank_node[r] + 1 : m->ntrainer_nodes;
    }
    for (uint32_t i = 0; rc == 0 && i < nt; i++) {
        ferry_tensor_desc t;
        ferry_manifest_tensor(dst, i, &t);
        bytes[i] = t.itemsize;
        for (uint32_t d = 0; d < t.ndim; d++)
            bytes[i] *= t.shape[d];
    }
    ferry_error err = {0};
    if (rc == 0 && ferry_weights_assign(bytes, nt, rank_node, sr, pub, &err) < 0)
        rc = -1;
    m->nworkers = ferry_manifest_rank_count(dst);
    m->wnode = malloc(m->nworkers * sizeof *m->wnode);
    uint32_t maxn = 0;
    for (uint32_t w = 0; rc == 0 && m->wnode && w < m->nworkers; w++) {
        m->wnode[w] = m->ntrainer_nodes + ferry_manifest_node_of(dst, w);
        maxn = m->wnode[w] > maxn ? m->wnode[w] : maxn;
    }
    m->nnodes = maxn + 1;
    for (int s = 0; rc == 0 && s < S_COUNT; s++) {
        m->t[s].in = calloc(m->nnodes, sizeof(uint64_t));
        m->t[s].out = calloc(m->nnodes, sizeof(uint64_t));
        rc = m->t[s].in && m->t[s].out ? 0 : -1;
    }
    fr_rd_config cfg = { .nworkers = m->nworkers, .worker_node = m->wnode, .nnodes = m->nnodes,
                         .chunk = CHUNK, .relay = true };
    if (rc == 0 && (!m->wnode || fr_readers_open(&cfg, &m->direct) < 0 ||
                    fr_readers_open(&cfg, &m->compat) < 0))
        rc = -1;
    /* fragments come in tensor order */
    uint64_t nf = ferry_manifest_fragment_count(dst), id = 0;
    for (uint32_t ti = 0; rc == 0 && ti < nt; ti++) {
        m->nboxes = 0;
        ferry_fragment f;
        for (; id < nf && ferry_manifest_fragment(dst, id, &f) == 0 && f.tensor == ti; id++) {
            if (grow((void **)&m->boxes, &m->cap_boxes, m->nboxes + 1, sizeof *m->boxes) < 0) {
                rc = -1;
                break;
            }
            fbox *b = &m->boxes[m->nboxes++];
            b->rank = f.rank;
            memcpy(b->off, f.offset, sizeof b->off);
            memcpy(b->shape, f.shape, sizeof b->shape);
        }
        ferry_tensor_desc t;
        ferry_manifest_tensor(dst, ti, &t);
        if (rc == 0 && m->nboxes && one_tensor(m, &t, rank_node[pub[ti]]) < 0)
            rc = -1;
    }
    if (rc == 0) {
        from_readers(&m->t[S_DIRECT], m->direct, m->nnodes);
        from_readers(&m->t[S_COMPAT], m->compat, m->nnodes);
    }
    free(rank_node), free(bytes), free(pub);
    return rc;
}

static void print_table(const model_run *m, const figures *f, const char *model, const char *src,
                        const char *dst, const char *nic, uint32_t nics, double bw)
{
    char b[6][32];
    uint32_t rn = m->nnodes - m->ntrainer_nodes;
    printf("weight update  %s  %s -> %s  (trainers on %u node%s store each tensor once; rollouts on "
           "%u other node%s)\n", model, src, dst, m->ntrainer_nodes, m->ntrainer_nodes == 1 ? "" : "s",
           rn, rn == 1 ? "" : "s");
    printf("NIC %s = %.2f GB/s, %u per node; model %s in %s of rollout demand; reader assignment "
           "%.2f s\n\n", nic, bw / 1e9, nics, cli_fmt_size(m->model_bytes, b[0], sizeof b[0]),
           cli_fmt_size(m->demand_bytes, b[1], sizeof b[1]), m->assign_s);
    printf("  %-22s %12s %12s %12s %12s %12s %10s %9s\n", "per NIC", "store read", "max in", "max out",
           "mean in", "mean out", "time s", "x direct");
    for (int s = 0; s < S_COUNT; s++) {
        printf("  %-22s %12s %12s %12s %12s %12s %10.3f %9.2f\n", s_name[s],
               cli_fmt_size(f[s].store_read, b[0], sizeof b[0]), cli_fmt_size(f[s].max_in, b[1], sizeof b[1]),
               cli_fmt_size(f[s].max_out, b[2], sizeof b[2]),
               cli_fmt_size((uint64_t)f[s].mean_in, b[3], sizeof b[3]),
               cli_fmt_size((uint64_t)f[s].mean_out, b[4], sizeof b[4]), f[s].time_s,
               f[S_DIRECT].time_s > 0 ? f[s].time_s / f[S_DIRECT].time_s : 0);
    }
    printf("\ntime: max over NICs of max(bytes in, bytes out) / bandwidth; means over all %u nodes.\n",
           m->nnodes);
}

static void print_json(const model_run *m, const figures *f, const char *model, const char *src,
                       const char *dst, uint32_t nics, double bw)
{
    printf("{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"nic_bytes_per_s\":%.0f,\"nics_per_node\":%u,"
           "\"trainer_nodes\":%u,\"rollout_nodes\":%u,\"model_bytes\":%" PRIu64 ",\"demand_bytes\":%" PRIu64
           ",\"assign_s\":%.3f", model, src, dst, bw, nics, m->ntrainer_nodes, m->nnodes - m->ntrainer_nodes,
           m->model_bytes, m->demand_bytes, m->assign_s);
    for (int s = 0; s < S_COUNT; s++)
        printf(",\"%s\":{\"store_read_bytes\":%" PRIu64 ",\"max_in_bytes\":%" PRIu64 ",\"max_out_bytes\":%"
               PRIu64 ",\"mean_in_bytes\":%.0f,\"mean_out_bytes\":%.0f,\"cross_push_bytes\":%" PRIu64
               ",\"time_s\":%.6f,\"ratio_to_direct\":%.4f}", s_key[s], f[s].store_read, f[s].max_in,
               f[s].max_out, f[s].mean_in, f[s].mean_out, f[s].cross_push, f[s].time_s,
               f[S_DIRECT].time_s > 0 ? f[s].time_s / f[S_DIRECT].time_s : 0);
    printf("}\n");
}

int cli_plan_model(const char *model, const char *src, const char *dst, uint32_t gpn, const char *nic,
                   uint32_t nics, bool json)
{
    double bw;
    if (parse_bw(nic, &bw) < 0) {
        fprintf(stderr, "ferry: --nic wants a rate such as 400gbps, 100Gb/s or 25GB/s, not '%s'\n", nic);
        return 2;
    }
    if (!model) {
        fprintf(stderr, "ferry plan: --nic needs --model, --src and --dst\n");
        return 2;
    }
    nics = nics ? nics : 1;
    ferry_error err = {0};
    ferry_model *pm = NULL;
    ferry_manifest *ms = NULL, *md = NULL;
    ferry_layout ls, ld;
    int rc = ferry_model_preset(model, &pm, &err);
    if (rc == 0)
        rc = ferry_layout_parse(src, &ls, &err);
    if (rc == 0)
        rc = ferry_layout_parse(dst, &ld, &err);
    if (rc == 0 && gpn)
        ls.gpus_per_node = ld.gpus_per_node = gpn;
    if (rc == 0)
        rc = ferry_layout_build(pm, &ls, &ms, &err);
    if (rc == 0)
        rc = ferry_layout_build(pm, &ld, &md, &err);
    ferry_model_free(pm);
    if (rc < 0) {
        fprintf(stderr, "ferry plan: %s\n", err.msg[0] ? err.msg : ferry_strerror(rc));
        ferry_manifest_close(ms);
        ferry_manifest_close(md);
        return 1;
    }
    model_run m = {0};
    rc = build(&m, ms, md);
    ferry_manifest_close(ms);
    ferry_manifest_close(md);
    if (rc < 0) {
        fprintf(stderr, "ferry plan: modelling the update failed (out of memory or too many cells)\n");
        model_free(&m);
        return 1;
    }
    figures f[S_COUNT];
    for (int s = 0; s < S_COUNT; s++)
        f[s] = figures_of(&m.t[s], m.nnodes, nics, bw);
    if (json)
        print_json(&m, f, model, src, dst, nics, bw);
    else
        print_table(&m, f, model, src, dst, nic, nics, bw);
    model_free(&m);
    return 0;
}
