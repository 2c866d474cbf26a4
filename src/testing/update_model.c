/* The update model (testing.h): the bytes in and out of every node of a
 * modelled cluster for the weight update done four ways, and the lower
 * bound; `ferry plan --nic` prints it per NIC (docs/weights.md, "Reader
 * assignment and the at-scale model").
 *
 * Coordinates: per tensor, the box edges of every fragment cut each dim;
 * the grid cells are held wholly or not at all by every fragment, so the
 * cells, laid end to end in row-major order, are the tensor's bytes in an
 * order in which every fragment is a few contiguous runs. Byte counts are
 * exact; offsets are not the row-major ones (a TP row shard would be one
 * run per row there — a billion runs for kimi-k2 — and one run here). The
 * reader assignment is the code the subscriber runs (src/rl/readers.c). */
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "../rl/rl_int.h"   /* the reader assignment, as pull.c uses it */
#include "testing.h"

#define CHUNK (4ull << 20)
#define MAX_CELLS (1u << 20)

static double now_s(void)
{
    return (double)fr_now_ns() / 1e9;
}

typedef struct fbox { uint32_t rank; uint64_t off[FERRY_MAX_DIMS], shape[FERRY_MAX_DIMS]; } fbox;

typedef struct model_run {
    uint32_t nnodes, ntrainer_nodes, nworkers;
    uint32_t *wnode;              /* rollout worker -> node */
    bool spread;                  /* the workers are on several nodes (compat cuts tensors) */
    fr_um_totals t[FR_UM_COUNT];
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
    double t0 = now_s();
    if (fr_readers_object(m->direct, src, size, m->d, m->nd, &g, &ng, &p, &np) < 0)
        return -1;
    m->assign_s += now_s() - t0;
    uint64_t uni = 0;
    for (size_t i = 0; i < ng; i++)
        uni += g[i].len;
    /* every worker reads its own */
    fr_um_totals *nv = &m->t[FR_UM_NAIVE], *bc = &m->t[FR_UM_BCAST], *fl = &m->t[FR_UM_FLOOR];
    fr_um_totals *pp = &m->t[FR_UM_P2P];
    uint32_t n0 = m->wnode[0];
    for (size_t i = 0; i < m->nd; i++) {
        uint32_t n = m->wnode[m->d[i].worker];
        uint64_t len = m->d[i].len;
        m->demand_bytes += len;
        nv->store_read += len;
        if (n != src) {
            nv->in[n] += len;
            nv->out[src] += len;
            pp->in[n] += len;   /* p2p: the same bytes from the publisher, no store */
            pp->out[src] += len;
            pp->cross_push += len;
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
    /* compatibility: every worker, the whole tensor; in a group over
     * several nodes a large one in blocks of rows, each its own set
     * (compat.c, fr_rl_compat_block_rows) */
    if (grow((void **)&m->d, &m->cap_d, m->nworkers, sizeof *m->d) < 0)
        return -1;
    uint64_t rows = t->ndim ? t->shape[0] : 1, rb = rows ? size / rows : 0;
    uint64_t per = m->spread ? fr_rl_compat_block_rows(rows, rb) : rows;
    uint64_t nb = per && rows > per ? (rows + per - 1) / per : 1;
    for (uint64_t b = 0; b < nb; b++) {
        uint64_t len = nb == 1 ? size : (rows - b * per < per ? rows - b * per : per) * rb;
        m->nd = 0;
        for (uint32_t w = 0; w < m->nworkers; w++)
            m->d[m->nd++] = (fr_rd_demand){ w, 0, len };
        t0 = now_s();
        if (fr_readers_object(m->compat, src, len, m->d, m->nd, &g, &ng, &p, &np) < 0)
            return -1;
        m->assign_s += now_s() - t0;
    }
    return 0;
}

static void from_readers(fr_um_totals *t, const fr_readers *r, uint32_t nnodes)
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

static void model_free(model_run *m)
{
    free(m->wnode);
    for (int s = 0; s < FR_UM_COUNT; s++)
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
    for (int s = 0; rc == 0 && s < FR_UM_COUNT; s++) {
        m->t[s].in = calloc(m->nnodes, sizeof(uint64_t));
        m->t[s].out = calloc(m->nnodes, sizeof(uint64_t));
        rc = m->t[s].in && m->t[s].out ? 0 : -1;
    }
    fr_rd_config cfg = { .nworkers = m->nworkers, .worker_node = m->wnode, .nnodes = m->nnodes,
                         .chunk = CHUNK, .relay = true };
    /* compat reads a whole set with one reader (pull_plan.c: a whole set
     * is never cut into pieces), its sets whole tensors or, over several
     * nodes, blocks of rows (compat.c) */
    for (uint32_t w = 1; rc == 0 && m->wnode && w < m->nworkers; w++)
        m->spread |= m->wnode[w] != m->wnode[0];
    fr_rd_config ccfg = cfg;
    ccfg.chunk = 0;
    if (rc == 0 && (!m->wnode || fr_readers_open(&cfg, &m->direct) < 0 ||
                    fr_readers_open(&ccfg, &m->compat) < 0))
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
        from_readers(&m->t[FR_UM_DIRECT], m->direct, m->nnodes);
        from_readers(&m->t[FR_UM_COMPAT], m->compat, m->nnodes);
    }
    free(rank_node), free(bytes), free(pub);
    return rc;
}

int fr_update_model_build(const ferry_manifest *src, const ferry_manifest *dst, fr_update_model **out)
{
    model_run *m = calloc(1, sizeof *m);
    fr_update_model *u = calloc(1, sizeof *u);
    int rc = m && u ? build(m, src, dst) : -1;
    if (rc == 0) {
        *u = (fr_update_model){ .nnodes = m->nnodes, .ntrainer_nodes = m->ntrainer_nodes,
                                .nworkers = m->nworkers, .model_bytes = m->model_bytes,
                                .demand_bytes = m->demand_bytes, .assign_s = m->assign_s };
        for (int s = 0; s < FR_UM_COUNT; s++) {   /* the totals move to the result */
            u->t[s] = m->t[s];
            m->t[s].in = m->t[s].out = NULL;
        }
        *out = u;
        u = NULL;
    }
    if (m)
        model_free(m);
    free(m);
    free(u);
    return rc < 0 ? FERRY_ENOMEM : 0;
}

void fr_update_model_free(fr_update_model *u)
{
    if (!u)
        return;
    for (int s = 0; s < FR_UM_COUNT; s++)
        free(u->t[s].in), free(u->t[s].out);
    free(u);
}

int fr_um_compat(const uint64_t *sizes, const uint64_t *rows, size_t n,
                 const uint32_t *worker_node, uint32_t nworkers, uint32_t nnodes, uint64_t *in,
                 uint64_t *out)
{
    fr_rd_config cfg = { .nworkers = nworkers, .worker_node = worker_node, .nnodes = nnodes,
                         .chunk = 0, .relay = true };
    fr_readers *r = NULL;
    fr_rd_demand *d = malloc((nworkers ? nworkers : 1) * sizeof *d);
    int rc = d && fr_readers_open(&cfg, &r) == 0 ? 0 : FERRY_ENOMEM;
    bool spread = false;
    for (uint32_t w = 1; w < nworkers; w++)
        spread |= worker_node[w] != worker_node[0];
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint64_t rb = rows[i] ? sizes[i] / rows[i] : 0;
        uint64_t per = spread ? fr_rl_compat_block_rows(rows[i], rb) : rows[i];
        uint64_t nb = per && rows[i] > per ? (rows[i] + per - 1) / per : 1;
        for (uint64_t b = 0; rc == 0 && b < nb; b++) {
            uint64_t len = nb == 1 ? sizes[i] : (rows[i] - b * per < per ? rows[i] - b * per : per) * rb;
            const fr_rd_range *g;
            const fr_rd_push *p;
            size_t ng, np;
            for (uint32_t w = 0; w < nworkers; w++)
                d[w] = (fr_rd_demand){ w, 0, len };
            if (fr_readers_object(r, FR_RD_NO_NODE, len, d, nworkers, &g, &ng, &p, &np) < 0)
                rc = FERRY_ENOMEM;
        }
    }
    if (rc == 0) {
        const fr_rd_load *l = fr_readers_loads(r);
        for (uint32_t k = 0; k < nnodes; k++) {
            in[k] = l[k].read_in + l[k].push_in;
            out[k] = l[k].push_out + l[k].serve_out;
        }
    }
    fr_readers_close(r);
    free(d);
    return rc;
}
