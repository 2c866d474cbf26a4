/* The single-pull group plan (pull_int.h): from every member's demand
 * (pull_demand.c), this worker's reads and pushes. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "reshard/reshard_int.h"
#include "rl/pull_int.h"

/* ---- the plan ---------------------------------------------------------------------------- */

static int cmp_frag(const void *a, const void *b)
{
    const fr_sfrag *x = *(const fr_sfrag *const *)a, *y = *(const fr_sfrag *const *)b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    for (uint32_t k = 0; k < 2 * x->ndim; k++)   /* offset, then shape (same ndim) */
        if (x->dims[k] != y->dims[k])
            return x->dims[k] < y->dims[k] ? -1 : 1;
    if (x->worker != y->worker)
        return x->worker < y->worker ? -1 : 1;
    return x->shard < y->shard ? -1 : x->shard > y->shard;
}

static bool same_box(const fr_sfrag *a, const fr_sfrag *b)
{
    return a->tensor == b->tensor && memcmp(a->dims, b->dims, 16 * (size_t)a->ndim) == 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int fr_work_init(fr_work *w, uint32_t world)
{
    memset(w, 0, sizeof *w);
    for (int h = 0; h < 2; h++) {
        fr_pushes *ps = &w->hop[h];
        ps->expect = calloc(world, sizeof *ps->expect);
        ps->got = calloc(world, sizeof *ps->got);
        ps->failed = calloc(world, sizeof *ps->failed);
        ps->total = calloc(world, sizeof *ps->total);
        ps->sent = calloc(world, sizeof *ps->sent);
        ps->done = calloc(world, sizeof *ps->done);
        ps->progress = calloc(world, sizeof *ps->progress);
        ps->out_failed = calloc(world, sizeof *ps->out_failed);
        ps->viewed = calloc(world, sizeof *ps->viewed);
        if (!ps->expect || !ps->got || !ps->failed || !ps->total || !ps->sent || !ps->done ||
            !ps->progress || !ps->out_failed || !ps->viewed)
            return FERRY_ENOMEM;
    }
    return 0;
}

void fr_work_reset(fr_work *w, uint32_t world)
{
    w->wrote_cross = w->wrote_intra = 0;
    for (int h = 0; h < 2; h++) {
        fr_pushes *ps = &w->hop[h];
        memset(ps->got, 0, world * sizeof *ps->got);
        memset(ps->sent, 0, world * sizeof *ps->sent);
        memset(ps->done, 0, world * sizeof *ps->done);
        memset(ps->failed, 0, world * sizeof *ps->failed);
        memset(ps->out_failed, 0, world * sizeof *ps->out_failed);
        memset(ps->viewed, 0, world * sizeof *ps->viewed);
    }
}

void fr_work_free(fr_work *w)
{
    for (int h = 0; h < 2; h++) {
        fr_pushes *ps = &w->hop[h];
        free(ps->ops), free(ps->to), free(ps->dep), free(ps->via), free(ps->shard);
        free(ps->last), free(ps->viewed);
        free(ps->expect), free(ps->got), free(ps->failed), free(ps->total), free(ps->sent);
        free(ps->done), free(ps->progress), free(ps->out_failed);
    }
    free(w->reads);
    ferry_store_reads_free(&w->io);
    ferry_plan_free(w->rplan);
    ferry_manifest_close(w->rt);
    free(w->raddr);
    free(w->src);
    free(w->wread), free(w->wfwd);
    free(w->node_id), free(w->node_workers), free(w->node_read), free(w->loads);
    memset(w, 0, sizeof *w);
}

/* One parallel array of a push list grown to cap entries of size bytes. */
static bool regrow(void **p, size_t cap, size_t size)
{
    void *n = realloc(*p, cap * size);
    if (n)
        *p = n;
    return n != NULL;
}

static int add_push(fr_pushes *ps, const ferry_op *op, uint32_t to, size_t dep, uint32_t via,
                    uint32_t shard, bool last)
{
    size_t cap = ps->cap;
    if (fr_grow((void **)&ps->ops, &ps->cap, ps->n + 1, sizeof *ps->ops) < 0)
        return FERRY_ENOMEM;
    /* every array grown (each call first), so that none is left shorter than cap */
    bool ok = ps->cap == cap;
    if (!ok) {
        ok = regrow((void **)&ps->to, ps->cap, sizeof *ps->to);
        ok = regrow((void **)&ps->dep, ps->cap, sizeof *ps->dep) && ok;
        ok = regrow((void **)&ps->via, ps->cap, sizeof *ps->via) && ok;
        ok = regrow((void **)&ps->shard, ps->cap, sizeof *ps->shard) && ok;
        ok = regrow((void **)&ps->last, ps->cap, sizeof *ps->last) && ok;
    }
    if (!ok) {
        ps->cap = cap;   /* the arrays grown keep at least their old size */
        return FERRY_ENOMEM;
    }
    ps->ops[ps->n] = *op;
    ps->dep[ps->n] = dep;
    ps->via[ps->n] = via;
    ps->shard[ps->n] = shard;
    ps->last[ps->n] = last;
    ps->to[ps->n++] = to;
    return 0;
}

/* Everything one plan needs while it walks the sets. */
typedef struct planner {
    const fr_gen *g;
    const fr_member *mbs;
    uint32_t world, me;
    fr_work *w;
    uint32_t *wnode;
    fr_readers *rd;
    fr_rd_demand *d;
    size_t capd;
    uint64_t *scratch;             /* per push of a piece: the count covering it */
    size_t caps;
    ferry_manifest *rt;            /* my read pieces as a target placement */
    uint32_t *rtid;                /* per tensor: its index in rt (UINT32_MAX: not there yet) */
    uint32_t *rshard;              /* per read piece: my shard */
    size_t caprs, capra;
    ferry_op *ops;                 /* scratch: one push's WRITEs */
    size_t capops;
    uint32_t *tnode;               /* per tensor: the dense node its bytes live on, or
                                    * FR_RD_NO_NODE (NULL: nobody named a segment) */
} planner;

/* The dense node a segment lives on: that of the members that named it as
 * their node's; FR_RD_NO_NODE when nobody did, for segment 0, or when
 * members of two nodes named it. */
static uint32_t segment_node(const planner *P, uint64_t segment)
{
    uint32_t n = FR_RD_NO_NODE;
    for (uint32_t k = 0; segment && k < P->world; k++)
        if (P->mbs[k].segment == segment) {
            if (n != FR_RD_NO_NODE && n != P->wnode[k])
                return FR_RD_NO_NODE;
            n = P->wnode[k];
        }
    return n;
}

/* Where each tensor's stored bytes live, when members named their nodes'
 * segments: a tensor all of whose pieces landed on one segment lives on
 * that segment's node, so a reader there reads it locally. */
static int tensor_nodes(planner *P)
{
    bool named = false;
    for (uint32_t k = 0; k < P->world; k++)
        named |= P->mbs[k].segment != 0;
    if (!named)
        return 0;
    const fr_gen *g = P->g;
    uint32_t nt = ferry_manifest_tensor_count(g->m);
    uint64_t *seg = malloc((nt ? nt : 1) * sizeof *seg);
    P->tnode = malloc((nt ? nt : 1) * sizeof *P->tnode);
    if (!seg || !P->tnode) {
        free(seg);
        return FERRY_ENOMEM;
    }
    for (uint32_t t = 0; t < nt; t++)
        seg[t] = UINT64_MAX;   /* none seen yet */
    for (uint64_t id = 0; id < ferry_manifest_fragment_count(g->m); id++) {
        ferry_fragment f;
        (void)ferry_manifest_fragment(g->m, id, &f);
        uint64_t s = f.rank < g->nranks ? g->ranks[f.rank].segment : 0;
        seg[f.tensor] = seg[f.tensor] == UINT64_MAX || seg[f.tensor] == s ? s : 0;
    }
    for (uint32_t t = 0; t < nt; t++)
        P->tnode[t] = seg[t] == UINT64_MAX ? FR_RD_NO_NODE : segment_node(P, seg[t]);
    free(seg);
    return 0;
}

/* The copy of rows [row0, row0 + rows) of a set's box from fragment f to
 * fragment t: one run (the lowering every push goes through). */
static void piece_run(const ferry_tensor_desc *d, const fr_sfrag *f, const fr_sfrag *t,
                      uint64_t row0, uint64_t rows, ferry_run *run)
{
    uint64_t shape[FERRY_MAX_DIMS];
    memcpy(shape, f->dims + f->ndim, f->ndim * sizeof *shape);
    if (f->ndim)
        shape[0] = rows;
    ferry_box_lower(f->ndim, shape, d->itemsize, f->dims + 2 * f->ndim, t->dims + 2 * t->ndim, run);
    run->src_offset = f->ndim ? row0 * f->dims[2 * f->ndim] * d->itemsize : 0;
    run->dst_offset = t->ndim ? row0 * t->dims[2 * t->ndim] * d->itemsize : 0;
}

static uint64_t run_ops(const ferry_run *r)
{
    uint64_t n = 1;
    for (uint32_t i = 0; i + 1 < r->nouter; i++)
        n *= r->count[i];
    return n;
}

/* The WRITEs of one push, lowered by exec (outer loops unrolled, the
 * innermost strided). */
static int push_ops(planner *P, const ferry_run *r, const fr_sfrag *f, const fr_sfrag *t,
                    uint32_t hop, size_t dep, uint32_t via, bool last)
{
    bool self = t->worker == P->me;
    size_t n = 0;
    int rc = ferry_exec_run_ops(r, FERRY_OP_WRITE, f->addr, t->addr,
                                self ? 0 : P->mbs[t->worker].peer, self ? 0 : t->key, &P->ops, &n,
                                &P->capops);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = add_push(&P->w->hop[hop - 1], &P->ops[i], t->worker, dep, via, f->shard, last);
    return rc;
}

/* My read of rows [row0, +rows) of fragment f: a fragment of the read
 * target (its box within f, f's strides). Returns its index. */
static int add_read(planner *P, const fr_sfrag *f, uint64_t row0, uint64_t rows, uint64_t bytes,
                    size_t *idx)
{
    fr_work *w = P->w;
    if (P->rtid[f->tensor] == UINT32_MAX) {   /* the target holds only tensors I read */
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(P->g->m, f->tensor, &d);
        int ti = ferry_manifest_add_tensor(P->rt, &d, NULL);
        if (ti < 0)
            return ti;
        P->rtid[f->tensor] = (uint32_t)ti;
    }
    ferry_fragment fr = { .tensor = P->rtid[f->tensor], .rank = 0, .has_strides = true };
    for (uint32_t k = 0; k < f->ndim; k++) {
        fr.offset[k] = f->dims[k];
        fr.shape[k] = f->dims[f->ndim + k];
        fr.strides[k] = f->dims[2 * f->ndim + k];
    }
    if (f->ndim) {
        fr.offset[0] += row0;
        fr.shape[0] = rows;
        fr.storage_offset = row0 * fr.strides[0];
    }
    if (fr_grow((void **)&w->reads, &w->cap_reads, w->nreads + 1, sizeof *w->reads) < 0 ||
        fr_grow((void **)&P->rshard, &P->caprs, w->nreads + 1, sizeof *P->rshard) < 0 ||
        fr_grow((void **)&w->raddr, &P->capra, w->nreads + 1, sizeof *w->raddr) < 0)
        return FERRY_ENOMEM;
    w->raddr[w->nreads] = f->addr;
    int rc = ferry_manifest_add_fragment(P->rt, &fr, NULL);
    if (rc < 0)
        return rc;
    P->rshard[w->nreads] = f->shard;
    w->reads[w->nreads] = (fr_rpiece){ .bytes = bytes, .shard = f->shard, .last = true };
    *idx = w->nreads++;
    return 0;
}

#define SRC_NONE (UINT32_MAX - 1)   /* fr_work.src: nothing brings it (yet) */

/* Member k brings bytes of my shard: the one source, or several. */
static void note_src(fr_work *w, uint32_t shard, uint32_t k)
{
    w->src[shard] = w->src[shard] == SRC_NONE || w->src[shard] == k ? k : UINT32_MAX;
}

/* One replica set fs[0..k): its pieces, their readers and pushes; my part. */
static int plan_set(planner *P, const fr_sfrag *const *fs, size_t k)
{
    fr_work *w = P->w;
    ferry_tensor_desc d;
    (void)ferry_manifest_tensor(P->g->m, fs[0]->tensor, &d);
    uint32_t nd = fs[0]->ndim;
    uint64_t rows = nd ? fs[0]->dims[nd] : 1, row = d.itemsize;
    for (uint32_t i = 1; i < nd; i++)
        row *= fs[0]->dims[nd + i];
    uint64_t per = k > 1 && !w->whole ? (FR_SUB_PIECE / row ? FR_SUB_PIECE / row : 1) : rows;
    per = per ? per : 1;   /* (a tensor of no rows: one empty piece) */
    uint64_t np = (rows + per - 1) / per;
    w->sets++;
    w->shared_sets += k > 1;
    if (fr_grow((void **)&P->d, &P->capd, np * k, sizeof *P->d) < 0)
        return FERRY_ENOMEM;
    for (uint64_t p = 0; p < np; p++) {
        uint64_t r = rows - p * per < per ? rows - p * per : per;
        for (size_t j = 0; j < k; j++)
            P->d[p * k + j] = (fr_rd_demand){ fs[j]->worker, p * per * row, r * row };
    }
    const fr_rd_range *g;
    const fr_rd_push *pu;
    size_t ng, npu;
    uint32_t src = P->tnode ? P->tnode[fs[0]->tensor] : FR_RD_NO_NODE;
    int rc = fr_readers_object(P->rd, src, rows * row, P->d, np * k, &g, &ng, &pu, &npu);
    if (rc < 0)
        return rc;
    for (size_t q = 0; q < ng; q++) {
        uint64_t p = g[q].off / (per * row), rowq = p * per, nrowsq = g[q].len / row;
        /* A set read whole (fr_work.whole) by one reader still moves in
         * parts of about FR_SUB_WHOLE_PART: each part its own read and its
         * own pushes, so that those waiting for it hear after each part;
         * its check waits for the last part (fr_rpiece.last). */
        uint64_t sub = w->whole && k > 1 ? FR_SUB_WHOLE_PART / row : nrowsq;
        sub = sub ? sub : 1;
        for (uint64_t r0 = 0; r0 < nrowsq; r0 += sub) {
            uint64_t row0 = rowq + r0, nrows = nrowsq - r0 < sub ? nrowsq - r0 : sub;
            uint64_t len = nrows * row;
            bool last = r0 + nrows == nrowsq;
            const fr_sfrag *reader = fs[g[q].reader % k];
            w->group_read += len;
            w->node_read[P->wnode[reader->worker]] += len;
            size_t read = 0;
            if (reader->worker == P->me) {
                if ((rc = add_read(P, reader, row0, nrows, len, &read)) < 0)
                    return rc;
                w->reads[read].last = last;
                w->my_read += len;
                note_src(w, reader->shard, P->me);
            }
            if (fr_grow((void **)&P->scratch, &P->caps, g[q].npush ? g[q].npush : 1,
                        sizeof *P->scratch) < 0)
                return FERRY_ENOMEM;
            for (size_t x = g[q].push; x < g[q].push + g[q].npush; x++) {
                const fr_sfrag *f = fs[pu[x].from % k], *t = fs[pu[x].to % k];
                uint32_t hop = pu[x].hop;
                fr_pushes *ps = &w->hop[hop - 1];
                ferry_run run;
                piece_run(&d, f, t, row0, nrows, &run);
                uint64_t nops = run_ops(&run);
                if (f->worker != P->me) {
                    if (t->worker == P->me) {
                        ps->expect[f->worker] += nops;
                        P->scratch[x - g[q].push] = ps->expect[f->worker];
                        w->received += len;
                        note_src(w, t->shard, f->worker);
                    }
                    if (hop == 2 && reader->worker == P->me)
                        w->hop[0].progress[f->worker] = true;   /* it forwards what I read */
                    continue;
                }
                size_t dep = read;
                uint32_t via = UINT32_MAX;
                for (size_t j = g[q].push; hop == 2 && j < x; j++)   /* the hop-1 WRITE into f */
                    if (pu[j].hop == 1 && pu[j].to == pu[x].from &&
                        fs[pu[j].from % k]->worker != P->me) {
                        dep = (size_t)P->scratch[j - g[q].push];
                        via = fs[pu[j].from % k]->worker;
                        break;
                    }
                if ((rc = push_ops(P, &run, f, t, hop, dep, via, last)) < 0)
                    return rc;
                if (t->worker != P->me) {
                    ps->total[t->worker] += nops;
                    w->pushed += len;
                }
            }
        }
    }
    return 0;
}

int fr_sub_read_binding(const fr_work *w, const fr_gen *g, ferry_binding **b,
                        ferry_attested_plan **att, ferry_error *err)
{
    *b = NULL;
    *att = NULL;
    int rc = fr_rl_bind(w->rt, g->generation, 0, NULL, 0, w->raddr, NULL, b, err);
    if (rc == 0)
        rc = fr_rl_attest_reads(g, w->rplan, *b, att, err);
    if (rc < 0) {
        ferry_binding_free(*b);
        *b = NULL;
    }
    return rc;
}

/* My reads: the read target planned against the stored placement and
 * lowered by exec into strided store reads, grouped by piece in piece
 * order. The planner yields runs target fragment by target fragment, in
 * the order the pieces were added, so the reads come grouped already; a
 * counting sort by piece is the fallback. */
static int plan_reads(planner *P, ferry_error *err)
{
    fr_work *w = P->w;
    if (w->nreads == 0)
        return 0;
    ferry_binding *b = NULL;
    ferry_attested_plan *att = NULL;
    w->rt = P->rt;
    P->rt = NULL;   /* the work keeps it */
    /* FP8 blocks: rows of shards checked at registration (pull.c) */
    int rc = fr_manifest_quant_like(w->rt, P->g->m, false, err);
    if (rc == 0)
        rc = ferry_plan_create(P->g->m, w->rt, NULL, &w->rplan, err);
    ferry_plan_stats ps;   /* a read per run in 2-D: sized once, not grown by doubling */
    if (rc == 0 && ferry_plan_stats_get(w->rplan, &ps) == 0 && ps.runs &&
        (w->io.v = malloc(ps.runs * sizeof *w->io.v)) != NULL)
        w->io.cap = ps.runs;
    if (rc == 0)
        rc = fr_sub_read_binding(w, P->g, &b, &att, err);
    if (rc == 0)
        rc = ferry_exec_store_lower(att, b, (const uint32_t[]){ 0 }, 1, NULL, &w->io, err);
    ferry_attested_free(att);
    ferry_binding_free(b);
    ferry_store_read *v = w->io.v;
    size_t nv = w->io.n;
    bool ordered = true;
    for (size_t i = 0; rc == 0 && i < nv; i++) {
        ordered &= i == 0 || v[i - 1].dst_fragment <= v[i].dst_fragment;
        w->reads[v[i].dst_fragment].n++;
    }
    for (size_t i = 0, at = 0; rc == 0 && i < w->nreads; i++) {
        w->reads[i].first = at;
        at += w->reads[i].n;
        w->reads[i].n = ordered ? w->reads[i].n : 0;
    }
    if (rc == 0 && !ordered) {
        ferry_store_read *h = malloc((nv ? nv : 1) * sizeof *h);
        if (!h)
            rc = FERRY_ENOMEM;
        for (size_t i = 0; rc == 0 && i < nv; i++) {
            fr_rpiece *rp = &w->reads[v[i].dst_fragment];
            h[rp->first + rp->n++] = v[i];
        }
        if (rc == 0) {
            free(w->io.v);
            w->io.v = h;
            w->io.cap = nv;
        }
    }
    w->ngreads = w->io.n;
    if (rc < 0 && err && !err->msg[0])
        fr_fail(err, rc, "subscriber: planning the reads: %s", ferry_strerror(rc));
    return rc;
}

/* Node of every member as dense ids 0..n-1 (readers.c wants them small). */
static int dense_nodes(planner *P)
{
    uint32_t world = P->world, *v = malloc(world * sizeof *v), n = 0;
    fr_work *w = P->w;
    if (!v)
        return FERRY_ENOMEM;
    for (uint32_t k = 0; k < world; k++)
        v[k] = P->mbs[k].node;
    qsort(v, world, sizeof *v, cmp_u32);
    for (uint32_t k = 0; k < world; k++)
        if (k == 0 || v[k] != v[n - 1])
            v[n++] = v[k];
    for (uint32_t k = 0; k < world; k++)
        P->wnode[k] = (uint32_t)((uint32_t *)bsearch(&P->mbs[k].node, v, n, sizeof *v, cmp_u32) - v);
    w->nnodes = n;
    w->node_id = v;
    w->node_workers = calloc(n, sizeof *w->node_workers);
    w->node_read = calloc(n, sizeof *w->node_read);
    w->loads = calloc(n, sizeof *w->loads);
    if (!w->node_workers || !w->node_read || !w->loads)
        return FERRY_ENOMEM;
    for (uint32_t k = 0; k < world; k++)
        w->node_workers[P->wnode[k]]++;
    return 0;
}

/* Every member's fragments in cmp_frag's order (tensor, box, worker,
 * shard): a counting sort by tensor, in worker and shard order, so that
 * only each tensor's few boxes are left to sort (none when it has one). */
static int sort_frags(planner *P, const fr_sfrag **all)
{
    uint32_t nt = ferry_manifest_tensor_count(P->g->m);
    size_t *at = calloc((size_t)nt + 1, sizeof *at);
    if (!at)
        return FERRY_ENOMEM;
    for (uint32_t k = 0; k < P->world; k++)
        for (uint32_t i = 0; i < P->mbs[k].nshards; i++)
            at[P->mbs[k].frags[i].tensor + 1]++;
    for (uint32_t t = 0; t < nt; t++)
        at[t + 1] += at[t];
    for (uint32_t k = 0; k < P->world; k++)
        for (uint32_t i = 0; i < P->mbs[k].nshards; i++)
            all[at[P->mbs[k].frags[i].tensor]++] = &P->mbs[k].frags[i];
    for (uint32_t t = 0; t < nt; t++) {
        size_t a = t ? at[t - 1] : 0, b = at[t];
        for (size_t i = a + 1; i < b; i++)
            if (cmp_frag(&all[i - 1], &all[i]) > 0) {
                qsort(all + a, b - a, sizeof *all, cmp_frag);
                break;
            }
    }
    free(at);
    return 0;
}

int fr_sub_plan(const fr_gen *g, const fr_member *mbs, uint32_t world, uint32_t me, fr_work *w,
                ferry_error *err)
{
    planner P = { .g = g, .mbs = mbs, .world = world, .me = me, .w = w };
    size_t total = 0;
    for (uint32_t k = 0; k < world; k++)
        total += mbs[k].nshards;
    const fr_sfrag **all = malloc((total ? total : 1) * sizeof *all);
    P.wnode = malloc(world * sizeof *P.wnode);
    w->src = malloc((mbs[me].nshards ? mbs[me].nshards : 1) * sizeof *w->src);
    int rc = all && P.wnode && w->src ? dense_nodes(&P) : FERRY_ENOMEM;
    for (uint32_t i = 0; w->src && i < mbs[me].nshards; i++)
        w->src[i] = SRC_NONE;
    fr_rd_config cfg = { .nworkers = world, .worker_node = P.wnode, .nnodes = w->nnodes,
                         .chunk = 0, .relay = true };
    if (rc == 0)
        rc = fr_readers_open(&cfg, &P.rd);
    if (rc == 0 && w->seed)
        fr_readers_seed(P.rd, w->seed);
    if (rc == 0)
        rc = tensor_nodes(&P);
    if (rc == 0)
        rc = ferry_manifest_create(1, NULL, 1, &P.rt);
    uint32_t nt = ferry_manifest_tensor_count(g->m);
    if (rc == 0 && !(P.rtid = malloc((nt ? nt : 1) * sizeof *P.rtid)))
        rc = FERRY_ENOMEM;
    for (uint32_t t = 0; rc == 0 && t < nt; t++)
        P.rtid[t] = UINT32_MAX;
    size_t n = total;
    if (rc == 0)
        rc = sort_frags(&P, all);
    for (size_t a = 0; a < n && rc == 0;) {
        size_t b = a + 1;
        while (b < n && same_box(all[a], all[b]))
            b++;
        rc = plan_set(&P, all + a, b - a);
        a = b;
    }
    if (rc == 0) {
        fr_readers_summary(P.rd, &w->sum);
        memcpy(w->loads, fr_readers_loads(P.rd), w->nnodes * sizeof *w->loads);
        w->wread = malloc(world * sizeof *w->wread);
        w->wfwd = malloc(world * sizeof *w->wfwd);
        if (!w->wread || !w->wfwd)
            rc = FERRY_ENOMEM;
        else {
            memcpy(w->wread, fr_readers_wread(P.rd), world * sizeof *w->wread);
            memcpy(w->wfwd, fr_readers_wfwd(P.rd), world * sizeof *w->wfwd);
        }
    }
    if (rc == 0) {
        rc = plan_reads(&P, err);
    } else if (!(err && err->msg[0])) {
        fr_fail(err, rc, "subscriber: planning: %s", ferry_strerror(rc));
    }
    fr_readers_close(P.rd);
    ferry_manifest_close(P.rt);
    free(P.rtid);
    free(P.rshard);
    free(P.tnode);
    free(P.scratch);
    free(P.ops);
    free(P.d);
    free(P.wnode);
    free(all);
    return rc;
}
