/* Single-pull update of a rollout group (weights.h, ferry_subscriber_*).
 *
 * Every update: each worker computes its demand (runs of source bytes →
 * its parameter memory), publishes it as a KV record, and after a barrier
 * reads every member's record. All members then compute the same plan
 * (readers.c, in tensor then offset order): per tensor, the run boundaries
 * of all members cut the source into elementary ranges, shared ones into
 * 4 MiB pieces; each piece's reader is a consumer chosen to balance the
 * members' nodes' NIC loads (a tensor on a segment some members named as
 * their node's lives on that node, the rest off every node); a piece
 * goes to another node once, to one consumer there, which forwards it to
 * the others of its node. A worker reads its ranges from the store
 * straight into its parameters, in batches, and WRITEs each batch into the
 * other consumers' parameters (registered remote-writable) while it reads
 * the next one; NOTIFYs tell each consumer how many of its WRITEs have
 * landed (or that no more will come), so a worker that forwards for its
 * node forwards what has landed while the rest is still being read, and
 * every worker knows when all its bytes are there ("apply" below). Then
 * the group meets at a post-apply barrier.
 *
 * Demand record (little-endian): "FRYDMND2", u64 generation, u32 rank,
 * u32 regions, u32 runs, u32 node, u64 local segment; regions: u64 base, u32 desc length,
 * desc; runs: u32 entry, u32 region, u64 src_off, u64 len, u64 dst_off. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/rl_int.h"

#define MAGIC "FRYDMND2"
#define HDR 40
#define READ_BATCH 8192
#define PIECE (4ull << 20)   /* shared ranges are cut so that their pieces get different readers */
#define BATCH_BYTES (64ull << 20)   /* default ferry_subscriber_config.batch_bytes */
#define WATERMARK 2          /* batches in flight: the pushes of one while the next is read */


typedef struct preg { uint8_t *addr; size_t len; ferry_region *reg; } preg;

/* The last plan: readers.c's answer for every tensor, reused while the
 * group's demands (tensor, worker, source range), the tensors' sizes and
 * the members' nodes stay the same — a new generation of the same model
 * and layout costs no planning. */
typedef struct plan_cache {
    bool valid, reused;
    fr_hash128_t key;
    fr_rd_range *ranges;      /* push indices into pushes */
    size_t *base;             /* per range: its tensor's first run in the sorted runs */
    size_t n, cap, cap_base;
    fr_rd_push *pushes;
    size_t npushes, cap_pushes;
    /* what the plan moves, for the counters: the summary and, per node in
     * ascending id, its id, members, store reads and loads */
    fr_rd_summary sum;
    uint32_t nnodes;
    uint32_t *node_id, *node_workers;
    uint64_t *node_read;
    fr_rd_load *loads;
} plan_cache;

struct ferry_subscriber {
    ferry_store *s;
    ferry_subscriber_config cfg;
    ferry_param_shard *shards;
    size_t n;
    char (*names)[256];
    preg *regs;               /* one per shard, reused while (addr, len) stay */
    uint64_t generation;
    plan_cache plan;
};

/* One run of one member. */
typedef struct grun {
    uint32_t worker, entry, region;
    uint64_t src, len, dst_off;
} grun;

typedef struct member {
    uint32_t node;
    uint64_t segment;         /* the store segment on its node (0: unknown) */
    uint32_t nregions;
    uint64_t *base;
    ferry_remote_region *rr;  /* imported into this worker's engine */
    bool imported;
} member;

/* ---- my demand ---------------------------------------------------------------------- */

typedef struct collect {
    grun *v;
    size_t n, cap;
    uint32_t region;
    uint8_t *base;
    uint32_t rank;
} collect;

static int collect_run(void *ctx, size_t entry, uint64_t src_off, void *dst, uint64_t len,
                       ferry_error *err)
{
    collect *c = ctx;
    if (fr_grow((void **)&c->v, &c->cap, c->n + 1, sizeof *c->v) < 0)
        return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    c->v[c->n++] = (grun){ .worker = c->rank, .entry = (uint32_t)entry, .region = c->region,
                           .src = src_off, .len = len,
                           .dst_off = (uint64_t)((uint8_t *)dst - c->base) };
    return 0;
}

static uint64_t extent_bytes(const ferry_param_shard *p, uint64_t isz)
{
    bool strided = false;
    for (uint32_t d = 0; d < p->ndim; d++)
        strided |= p->strides[d] != 0;
    uint64_t last = 0, n = 1;
    for (uint32_t d = 0; d < p->ndim; d++) {
        if (p->shape[d] == 0)
            return 0;
        n *= p->shape[d];
        if (strided)
            last += (p->shape[d] - 1) * (uint64_t)p->strides[d];
    }
    return (strided ? last + 1 : n) * isz;
}

/* Register each shard's memory (reusing what is unchanged) and list my runs. */
static int my_demand(ferry_subscriber *sub, const ferry_weight_manifest *m, collect *c,
                     ferry_error *err)
{
    const ferry_weight_entry **byname = malloc((m->n ? m->n : 1) * sizeof *byname);
    if (!byname)
        return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    for (size_t i = 0; i < m->n; i++)
        byname[i] = &m->entries[i];
    qsort(byname, m->n, sizeof *byname, fr_rl_cmp_entry_name);
    int rc = 0;
    ferry_engine *e = ferry_store_engine(sub->s);
    for (size_t i = 0; i < sub->n && rc == 0; i++) {
        ferry_weight_entry probe;
        snprintf(probe.name, sizeof probe.name, "%s", sub->names[i]);
        const ferry_weight_entry *pp = &probe;
        const ferry_weight_entry **hit = bsearch(&pp, byname, m->n, sizeof *byname,
                                                 fr_rl_cmp_entry_name);
        if (!hit) {
            rc = fr_rl_fail(err, FERRY_ENOENT, "tensor %s is not in generation %" PRIu64,
                      probe.name, m->generation);
            break;
        }
        uint64_t len = extent_bytes(&sub->shards[i], ferry_dtype_size((*hit)->dtype));
        preg *r = &sub->regs[i];
        if (r->reg && (r->addr != sub->shards[i].dst || r->len != len)) {
            (void)ferry_region_unregister(r->reg);
            r->reg = NULL;
        }
        if (!r->reg && len) {
            rc = ferry_region_register(e, sub->shards[i].dst, len, FERRY_REMOTE_WRITE,
                                       FERRY_MEM_HOST, &r->reg);
            if (rc < 0) {
                fr_rl_fail(err, rc, "subscriber: cannot register the parameters of %s", probe.name);
                break;
            }
            r->addr = sub->shards[i].dst;
            r->len = len;
        }
        c->region = (uint32_t)i;
        c->base = sub->shards[i].dst;
        rc = fr_rl_shard_runs(m, (size_t)(*hit - m->entries), &sub->shards[i], collect_run, c,
                              err);
    }
    free(byname);
    return rc;
}

/* ---- records -------------------------------------------------------------------------- */

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++, v >>= 8) p[i] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++, v >>= 8) p[i] = (uint8_t)v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }

static int encode(ferry_subscriber *sub, uint64_t gen, const collect *c, uint8_t **out,
                  size_t *len)
{
    size_t cap = HDR + (size_t)sub->n * (12 + FERRY_DESC_MAX) + c->n * 32;
    uint8_t *b = malloc(cap), *p = b;
    if (!b)
        return FERRY_ENOMEM;
    memcpy(p, MAGIC, 8);
    put64(p + 8, gen);
    put32(p + 16, sub->cfg.rank);
    put32(p + 20, (uint32_t)sub->n);
    put32(p + 24, (uint32_t)c->n);
    put32(p + 28, sub->cfg.node);
    put64(p + 32, sub->cfg.local_segment);
    p += HDR;
    for (size_t i = 0; i < sub->n; i++) {
        uint8_t desc[FERRY_DESC_MAX];
        int k = sub->regs[i].reg ? ferry_region_export(sub->regs[i].reg, desc, sizeof desc) : 0;
        if (k < 0) {
            free(b);
            return k;
        }
        put64(p, (uint64_t)(uintptr_t)sub->shards[i].dst);
        put32(p + 8, (uint32_t)k);
        memcpy(p + 12, desc, (size_t)k);
        p += 12 + (size_t)k;
    }
    for (size_t i = 0; i < c->n; i++) {
        put32(p, c->v[i].entry);
        put32(p + 4, c->v[i].region);
        put64(p + 8, c->v[i].src);
        put64(p + 16, c->v[i].len);
        put64(p + 24, c->v[i].dst_off);
        p += 32;
    }
    *out = b;
    *len = (size_t)(p - b);
    return 0;
}

/* Decode a member's record: regions into mb, runs appended to all. Every
 * count and offset is checked against the bytes there. */
static int decode(const uint8_t *b, size_t len, uint32_t worker, uint64_t gen, size_t nentries,
                  ferry_engine *e, bool import, member *mb, collect *all, ferry_error *err)
{
    if (len < HDR || memcmp(b, MAGIC, 8) != 0 || get32(b + 16) != worker)
        return fr_rl_fail(err, FERRY_EPROTO, "subscriber: the demand of worker %u is malformed",
                    worker);
    if (get64(b + 8) != gen)
        return fr_rl_fail(err, FERRY_ESTATE, "subscriber: worker %u is updating to generation %" PRIu64
                    ", this one to %" PRIu64 "; retry", worker, get64(b + 8), gen);
    uint32_t nr = get32(b + 20), nruns = get32(b + 24);
    mb->node = get32(b + 28);
    mb->segment = get64(b + 32);
    const uint8_t *p = b + HDR, *end = b + len;
    mb->nregions = nr;
    mb->base = calloc(nr ? nr : 1, sizeof *mb->base);
    mb->rr = calloc(nr ? nr : 1, sizeof *mb->rr);
    if (!mb->base || !mb->rr)
        return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    for (uint32_t i = 0; i < nr; i++) {
        if (end - p < 12 || get32(p + 8) > FERRY_DESC_MAX || (size_t)(end - p) < 12 + get32(p + 8))
            return fr_rl_fail(err, FERRY_EPROTO, "subscriber: the demand of worker %u is cut short",
                        worker);
        uint32_t dl = get32(p + 8);
        mb->base[i] = get64(p);
        if (import && dl) {
            int rc = ferry_region_import(e, p + 12, dl, &mb->rr[i]);
            if (rc < 0)
                return fr_rl_fail(err, rc, "subscriber: cannot reach worker %u: %s", worker,
                            ferry_strerror(rc));
        }
        p += 12 + dl;
    }
    mb->imported = import;
    if ((size_t)(end - p) != (size_t)nruns * 32)
        return fr_rl_fail(err, FERRY_EPROTO, "subscriber: the demand of worker %u is malformed",
                    worker);
    for (uint32_t i = 0; i < nruns; i++, p += 32) {
        grun r = { .worker = worker, .entry = get32(p), .region = get32(p + 4), .src = get64(p + 8),
                   .len = get64(p + 16), .dst_off = get64(p + 24) };
        if (r.entry >= nentries || r.region >= nr)
            return fr_rl_fail(err, FERRY_EPROTO, "subscriber: worker %u names an unknown tensor or "
                        "region", worker);
        if (fr_grow((void **)&all->v, &all->cap, all->n + 1, sizeof *all->v) < 0)
            return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
        all->v[all->n++] = r;
    }
    return 0;
}

/* ---- the plan ---------------------------------------------------------------------------- */

static int by_entry_src(const void *a, const void *b)
{
    const grun *x = a, *y = b;
    if (x->entry != y->entry)
        return x->entry < y->entry ? -1 : 1;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    return x->worker < y->worker ? -1 : x->worker > y->worker;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The pushes of one hop: WRITE ops in plan order, grouped by target
 * worker when sent, and what this worker sends and receives on the hop,
 * per worker (the notification protocol, "apply" below). */
typedef struct pushes {
    ferry_op *ops;
    uint32_t *to;
    size_t *dep;                   /* hop 1: the index of my read that brings the bytes;
                                    * hop 2: how many of via's hop-1 WRITEs into me
                                    * must have landed */
    uint32_t *via;                 /* hop 2: the reader whose WRITE brings the bytes
                                    * (UINT32_MAX: none to wait for) */
    size_t n, cap;
    uint64_t *expect, *got;        /* receiving: WRITEs each worker sends me, landed so far */
    bool *failed;                  /* receiving: it sends me nothing more */
    uint64_t *total, *sent, *done; /* sending: WRITEs to each worker, submitted, landed */
    bool *progress;                /* sending, hop 1: it forwards my bytes: tell it early */
    bool *out_failed;              /* sending: it gets nothing more (told FAILED) */
} pushes;

typedef struct work {
    ferry_range *reads;
    size_t nreads, cap_reads;
    pushes hop[2];                 /* from the reader; forwarded inside a node */
    uint64_t group_read, my_read, pushed, received;
    uint64_t *scratch;             /* per push of a piece: the count covering it */
    size_t cap_scratch;
} work;

static int pushes_init(pushes *ps, uint32_t world)
{
    ps->expect = calloc(world, sizeof *ps->expect);
    ps->got = calloc(world, sizeof *ps->got);
    ps->failed = calloc(world, sizeof *ps->failed);
    ps->total = calloc(world, sizeof *ps->total);
    ps->sent = calloc(world, sizeof *ps->sent);
    ps->done = calloc(world, sizeof *ps->done);
    ps->progress = calloc(world, sizeof *ps->progress);
    ps->out_failed = calloc(world, sizeof *ps->out_failed);
    return ps->expect && ps->got && ps->failed && ps->total && ps->sent && ps->done &&
                   ps->progress && ps->out_failed ? 0 : FERRY_ENOMEM;
}

static void pushes_free(pushes *ps)
{
    free(ps->ops), free(ps->to), free(ps->dep), free(ps->via);
    free(ps->expect), free(ps->got), free(ps->failed), free(ps->total), free(ps->sent);
    free(ps->done), free(ps->progress), free(ps->out_failed);
}

static int add_read(work *w, const char *key, uint64_t off, void *dst, uint64_t len)
{
    if (fr_grow((void **)&w->reads, &w->cap_reads, w->nreads + 1, sizeof *w->reads) < 0)
        return FERRY_ENOMEM;
    w->reads[w->nreads++] = (ferry_range){ .key = key, .src_offset = off, .dst = dst, .len = len };
    return 0;
}

static int add_push(pushes *ps, uint32_t to, size_t dep, uint32_t via, void *local,
                    const ferry_remote_region *rr, uint64_t remote, uint64_t len)
{
    size_t cap = ps->cap;
    if (fr_grow((void **)&ps->ops, &ps->cap, ps->n + 1, sizeof *ps->ops) < 0)
        return FERRY_ENOMEM;
    if (ps->cap != cap) {
        uint32_t *np = realloc(ps->to, ps->cap * sizeof *np);
        if (np)
            ps->to = np;
        size_t *nd = realloc(ps->dep, ps->cap * sizeof *nd);
        if (nd)
            ps->dep = nd;
        uint32_t *nv = realloc(ps->via, ps->cap * sizeof *nv);
        if (nv)
            ps->via = nv;
        if (!np || !nd || !nv) {
            ps->cap = cap;   /* to, dep and via keep their old size */
            return FERRY_ENOMEM;
        }
    }
    ps->ops[ps->n] = (ferry_op){ .opcode = FERRY_OP_WRITE, .local = local, .len = len,
                                 .peer = rr->peer, .remote_addr = remote, .key = rr->key };
    ps->dep[ps->n] = dep;
    ps->via[ps->n] = via;
    ps->to[ps->n++] = to;
    return 0;
}

/* Where bytes [off, off+len) of run r's source land in my parameters. */
static uint8_t *my_dst(const ferry_subscriber *sub, const grun *r, uint64_t off)
{
    return (uint8_t *)sub->shards[r->region].dst + r->dst_off + (off - r->src);
}

/* Node of every member as dense ids 0..n-1 (readers.c wants them small);
 * *ids (the caller frees) gets the real ids in ascending order. */
static uint32_t dense_nodes(const member *mbs, uint32_t world, uint32_t *wnode, uint32_t **ids)
{
    uint32_t *v = malloc(world * sizeof *v), n = 0;
    *ids = v;
    if (!v)
        return 0;
    for (uint32_t k = 0; k < world; k++)
        v[k] = mbs[k].node;
    qsort(v, world, sizeof *v, cmp_u32);
    for (uint32_t k = 0; k < world; k++)
        if (k == 0 || v[k] != v[n - 1])
            v[n++] = v[k];
    for (uint32_t k = 0; k < world; k++)
        wnode[k] = (uint32_t)((uint32_t *)bsearch(&mbs[k].node, v, n, sizeof *v, cmp_u32) - v);
    return n;
}

/* The dense node a tensor stored on `segment` lives on: that of the members
 * that named it as their node's segment; FR_RD_NO_NODE when nobody did,
 * for segment 0, or when members of two nodes named it (then where it
 * lives is not known). */
static uint32_t segment_node(const member *mbs, const uint32_t *wnode, uint32_t world,
                             uint64_t segment)
{
    uint32_t n = FR_RD_NO_NODE;
    for (uint32_t k = 0; segment && k < world; k++)
        if (mbs[k].segment == segment) {
            if (n != FR_RD_NO_NODE && n != wnode[k])
                return FR_RD_NO_NODE;
            n = wnode[k];
        }
    return n;
}

/* My part of one piece: its read if I am the reader, the pushes I send,
 * and who feeds me. */
static int plan_piece(ferry_subscriber *sub, const char *key, const grun *runs,
                      const fr_rd_range *g, const fr_rd_push *p, member *mbs, work *w)
{
    uint32_t me = sub->cfg.rank;
    const grun *reader = &runs[g->reader];
    w->group_read += g->len;
    if (reader->worker == me) {
        if (add_read(w, key, g->off, my_dst(sub, reader, g->off), g->len) < 0)
            return FERRY_ENOMEM;
        w->my_read += g->len;
    }
    size_t read = w->nreads ? w->nreads - 1 : 0;   /* hop 1 leaves from the reader: my last read */
    if (fr_grow((void **)&w->scratch, &w->cap_scratch, g->npush ? g->npush : 1,
                sizeof *w->scratch) < 0)
        return FERRY_ENOMEM;
    for (size_t k = g->push; k < g->push + g->npush; k++) {
        const grun *f = &runs[p[k].from], *t = &runs[p[k].to];
        bool hop2 = p[k].hop == 2;
        pushes *ps = &w->hop[hop2];
        if (f->worker != me) {
            if (t->worker == me) {
                w->scratch[k - g->push] = ++ps->expect[f->worker];
                w->received += g->len;
            }
            if (hop2 && reader->worker == me)
                w->hop[0].progress[f->worker] = true;   /* it forwards what I read */
            continue;
        }
        size_t dep = read;
        uint32_t via = UINT32_MAX;
        for (size_t j = g->push; hop2 && j < k; j++)   /* the hop-1 WRITE into my run f */
            if (p[j].hop == 1 && p[j].to == p[k].from && runs[p[j].from].worker != me) {
                dep = (size_t)w->scratch[j - g->push];
                via = runs[p[j].from].worker;
                break;
            }
        const member *mb = &mbs[t->worker];
        uint64_t off = t->dst_off + (g->off - t->src);   /* inside the region */
        int rc;
        if (t->worker == me) {
            /* one worker needing the bytes twice: a copy after they arrive */
            rc = add_push(ps, me, dep, via, my_dst(sub, f, g->off), &(ferry_remote_region){0},
                          mb->base[t->region] + off, g->len);
        } else {
            rc = add_push(ps, t->worker, dep, via, my_dst(sub, f, g->off), &mb->rr[t->region],
                          mb->rr[t->region].addr + off, g->len);
            ps->total[t->worker]++;
            w->pushed += g->len;
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* What the plan depends on: the members' nodes, every run's (tensor,
 * worker, source range) in plan order, the tensors' sizes and the nodes
 * they live on. */
static fr_hash128_t plan_key(const collect *all, const ferry_weight_manifest *m,
                             const uint32_t *wnode, const uint32_t *src, uint32_t world)
{
    fr_hasher *h = fr_hasher_new(0x66727264);
    if (!h)
        return (fr_hash128_t){{0}};
    fr_hasher_update(h, &world, sizeof world);
    fr_hasher_update(h, wnode, world * sizeof *wnode);
    for (size_t i = 0; i < all->n; i++) {
        const grun *r = &all->v[i];
        uint64_t v[6] = { r->entry, r->worker, r->src, r->len, m->entries[r->entry].bytes,
                          src[r->entry] };
        fr_hasher_update(h, v, sizeof v);
    }
    fr_hash128_t k = fr_hasher_digest(h);
    fr_hasher_free(h);
    return k;
}

/* Every tensor's pieces from readers.c, into the cache. */
static int plan_all(plan_cache *pc, const ferry_weight_manifest *m, const collect *all,
                    const uint32_t *wnode, const uint32_t *src, const uint32_t *ids,
                    uint32_t nnodes, uint32_t world, ferry_error *err)
{
    fr_rd_demand *d = malloc((all->n ? all->n : 1) * sizeof *d);
    fr_readers *rd = NULL;
    fr_rd_config cfg = { .nworkers = world, .worker_node = wnode, .nnodes = nnodes,
                         .chunk = PIECE, .relay = true };
    free(pc->node_id), free(pc->node_workers), free(pc->node_read), free(pc->loads);
    pc->nnodes = 0;
    pc->node_id = malloc(nnodes * sizeof *pc->node_id);
    pc->node_workers = calloc(nnodes, sizeof *pc->node_workers);
    pc->node_read = calloc(nnodes, sizeof *pc->node_read);
    pc->loads = calloc(nnodes, sizeof *pc->loads);
    int rc = d && pc->node_id && pc->node_workers && pc->node_read && pc->loads
                 ? fr_readers_open(&cfg, &rd) : FERRY_ENOMEM;
    if (rc == 0) {
        memcpy(pc->node_id, ids, nnodes * sizeof *ids);
        for (uint32_t k = 0; k < world; k++)
            pc->node_workers[wnode[k]]++;
        pc->nnodes = nnodes;
    }
    pc->n = pc->npushes = 0;
    for (size_t a = 0; a < all->n && rc == 0;) {
        size_t b = a;
        while (b < all->n && all->v[b].entry == all->v[a].entry)
            b++;
        for (size_t i = a; i < b; i++)
            d[i - a] = (fr_rd_demand){ all->v[i].worker, all->v[i].src, all->v[i].len };
        const ferry_weight_entry *e = &m->entries[all->v[a].entry];
        const fr_rd_range *g;
        const fr_rd_push *p;
        size_t ng, np;
        rc = fr_readers_object(rd, src[all->v[a].entry], e->bytes, d, b - a, &g, &ng, &p, &np);
        if (rc == FERRY_EINVAL) {
            rc = fr_rl_fail(err, FERRY_EPROTO, "subscriber: a demand for %s lies outside it",
                            e->name);
            break;
        }
        if (rc == 0 && (fr_grow((void **)&pc->ranges, &pc->cap, pc->n + ng, sizeof *pc->ranges) < 0 ||
                        fr_grow((void **)&pc->base, &pc->cap_base, pc->n + ng, sizeof *pc->base) < 0 ||
                        fr_grow((void **)&pc->pushes, &pc->cap_pushes, pc->npushes + np,
                                sizeof *pc->pushes) < 0))
            rc = FERRY_ENOMEM;
        for (size_t i = 0; i < ng && rc == 0; i++) {
            pc->ranges[pc->n] = g[i];
            pc->ranges[pc->n].push += pc->npushes;
            pc->base[pc->n++] = a;
        }
        if (rc == 0 && np)
            memcpy(pc->pushes + pc->npushes, p, np * sizeof *p);
        pc->npushes += np;
        for (size_t i = 0; i < ng && rc == 0; i++)
            pc->node_read[wnode[all->v[a + g[i].reader].worker]] += g[i].len;
        a = b;
    }
    if (rc == 0) {
        fr_readers_summary(rd, &pc->sum);
        memcpy(pc->loads, fr_readers_loads(rd), nnodes * sizeof *pc->loads);
    }
    free(d);
    fr_readers_close(rd);
    if (rc < 0 && rc != FERRY_EPROTO)
        fr_rl_fail(err, rc, "subscriber: planning: %s", ferry_strerror(rc));
    return rc;
}

/* Plan (or reuse the last plan) and fill my work from it. */
static int plan(ferry_subscriber *sub, const ferry_weight_manifest *m, collect *all,
                member *mbs, work *w, ferry_error *err)
{
    uint32_t world = sub->cfg.world, nnodes = 0, *ids = NULL;
    plan_cache *pc = &sub->plan;
    uint32_t *wnode = malloc(world * sizeof *wnode);
    uint32_t *src = malloc((m->n ? m->n : 1) * sizeof *src);
    if (!wnode || !src || (nnodes = dense_nodes(mbs, world, wnode, &ids)) == 0) {
        free(wnode), free(src), free(ids);
        return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    }
    for (size_t i = 0; i < m->n; i++)
        src[i] = segment_node(mbs, wnode, world, m->entries[i].segment);
    qsort(all->v, all->n, sizeof *all->v, by_entry_src);
    fr_hash128_t key = plan_key(all, m, wnode, src, world);
    pc->reused = pc->valid && memcmp(&key, &pc->key, sizeof key) == 0;
    int rc = 0;
    if (!pc->reused) {
        pc->valid = false;
        rc = plan_all(pc, m, all, wnode, src, ids, nnodes, world, err);
        pc->valid = rc == 0;
        pc->key = key;
    }
    free(wnode);
    free(src);
    free(ids);
    for (size_t i = 0; i < pc->n && rc == 0; i++) {
        const grun *runs = all->v + pc->base[i];
        rc = plan_piece(sub, m->entries[runs->entry].key, runs, &pc->ranges[i], pc->pushes, mbs, w);
        if (rc < 0)
            fr_rl_fail(err, rc, "subscriber: planning: %s", ferry_strerror(rc));
    }
    return rc;
}

bool fr_subscriber_plan_reused(const ferry_subscriber *sub) { return sub && sub->plan.reused; }

int ferry_subscriber_nodes(const ferry_subscriber *sub, ferry_update_node *out, size_t cap)
{
    if (!sub || (cap && !out))
        return FERRY_EINVAL;
    const plan_cache *pc = &sub->plan;
    if (!pc->valid)
        return 0;
    for (uint32_t n = 0; n < pc->nnodes && n < cap; n++) {
        const fr_rd_load *l = &pc->loads[n];
        out[n] = (ferry_update_node){ .node = pc->node_id[n], .workers = pc->node_workers[n],
                                      .store_read = pc->node_read[n], .pushed_in = l->push_in,
                                      .pushed_out = l->push_out, .pushed_intra = l->intra,
                                      .nic_in = l->read_in + l->push_in,
                                      .nic_out = l->push_out + l->serve_out };
    }
    return (int)pc->nnodes;
}

/* The group's figures of the plan into the stats. */
static void plan_stats(const plan_cache *pc, ferry_update_stats *st)
{
    if (!pc->valid)
        return;
    st->group_pushed_cross = pc->sum.pushed_cross;
    st->group_pushed_intra = pc->sum.pushed_intra;
    st->nodes = pc->nnodes;
    st->nic_max_in = pc->sum.max_in;
    st->nic_max_out = pc->sum.max_out;
    st->nic_mean_in = pc->sum.mean_in;
    st->nic_mean_out = pc->sum.mean_out;
}

/* ---- apply ------------------------------------------------------------------------------- */

/* My reads [from, to), every byte count checked. */
static int do_reads(ferry_subscriber *sub, work *w, size_t from, size_t to, ferry_error *err)
{
    int rc = 0;
    for (size_t at = from; at < to && rc == 0; at += READ_BATCH) {
        size_t n = to - at < READ_BATCH ? to - at : READ_BATCH;
        int64_t *res = calloc(n, sizeof *res);
        if (!res)
            return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
        rc = ferry_store_get_into_ranges(sub->s, w->reads + at, n, res);
        for (size_t i = 0; i < n; i++)
            if (res[i] != (int64_t)w->reads[at + i].len) {
                rc = fr_rl_fail(err, FERRY_EREBUILD, "subscriber: reading %s at %" PRIu64 " failed: %s",
                          w->reads[at + i].key, w->reads[at + i].src_offset,
                          res[i] < 0 ? ferry_store_last_error() : "short read");
                break;
            }
        free(res);
    }
    return rc;
}

static ferry_peer_id peer_of(const member *mb)
{
    for (uint32_t r = 0; r < mb->nregions; r++)
        if (mb->rr[r].key)
            return mb->rr[r].peer;
    return 0;
}

/* How a receiver learns what landed. On each hop a sender S sends a target
 * T its WRITEs in plan order; once some have completed, a NOTIFY (tag of
 * the hop) carries S << NV_SHIFT | how many of them have landed, or
 * S << NV_SHIFT | NV_FAILED when S will send T nothing more (its reads, a
 * push to T, or what it was to forward failed). A NOTIFY is submitted
 * only after the WRITEs it counts have completed, so it never overtakes
 * them. T knows from the plan how many WRITEs each S has for it: it is
 * done with S when the count reaches that number or S failed. On hop 1 a
 * reader tells the workers that forward its bytes after every batch, so
 * that they forward batch k while batch k+1 is read (the scatter stage of
 * the pipeline); the others, and hop 2, hear once, at the end. */
#define NV_SHIFT 40
#define NV_FAILED (1ull << 39)
#define NV_COUNT (NV_FAILED - 1)

typedef struct apply {
    ferry_subscriber *sub;
    ferry_engine *e;
    work *w;
    member *mbs;
    uint64_t tag[2];
    int rc;                        /* the first failure of my sends (EREBUILD for me) */
    ferry_error *err;
    ferry_ticket **t[2];           /* per hop, WATERMARK slots x world WRITE tickets */
    uint64_t *at[2];               /* per hop and slot: what each target's count reaches */
    ferry_ticket **nt;             /* NOTIFY tickets in flight, reaped before the next ones */
    uint32_t *nto;                 /* their targets */
    size_t nnt, cap_nt, cap_nto;
    ferry_op *ops;                 /* scratch for one target's WRITEs */
    size_t fnext;                  /* hop 2: WRITEs [0, fnext) are submitted */
    uint64_t fround;
    bool fstop;                    /* a worker feeding my forwards failed or went quiet */
} apply;

static int fail_once(apply *ap, int code, const char *fmt, uint32_t to)
{
    if (ap->rc == 0)
        ap->rc = fr_rl_fail(ap->err, FERRY_EREBUILD, fmt, to, ferry_strerror(code));
    return ap->rc;
}

static void notify(apply *ap, int h, uint32_t to, uint64_t value)
{
    uint64_t v = (uint64_t)ap->sub->cfg.rank << NV_SHIFT | value;
    ferry_op op = { .opcode = FERRY_OP_NOTIFY, .peer = peer_of(&ap->mbs[to]), .tag = ap->tag[h],
                    .value = v };
    if (fr_grow((void **)&ap->nt, &ap->cap_nt, ap->nnt + 1, sizeof *ap->nt) < 0 ||
        fr_grow((void **)&ap->nto, &ap->cap_nto, ap->nnt + 1, sizeof *ap->nto) < 0) {
        fail_once(ap, FERRY_ENOMEM, "subscriber: notifying worker %u: %s", to);
        return;
    }
    int s = ferry_submit(ap->e, &op, 1, 0, &ap->nt[ap->nnt]);
    if (s < 0)
        fail_once(ap, s, "subscriber: notifying worker %u: %s", to);
    else
        ap->nto[ap->nnt++] = to;
}

static void reap_notifies(apply *ap)
{
    int tmo = ap->sub->cfg.timeout_ms ? (int)ap->sub->cfg.timeout_ms : 60000;
    for (size_t i = 0; i < ap->nnt; i++) {
        int st = ferry_ticket_wait(ap->nt[i], tmo);
        int te = ferry_ticket_error(ap->nt[i]);
        ferry_ticket_free(ap->nt[i]);
        if (st != FERRY_TICKET_COMPLETED)
            fail_once(ap, te ? te : FERRY_EIO, "subscriber: notifying worker %u failed: %s",
                      ap->nto[i]);
    }
    ap->nnt = 0;
}

/* WRITEs [a, b) of hop h: local copies now, one ticket per other target
 * into slot (not waited for). */
static void send_ops(apply *ap, int h, size_t slot, size_t a, size_t b)
{
    const pushes *ps = &ap->w->hop[h];
    uint32_t world = ap->sub->cfg.world, me = ap->sub->cfg.rank;
    ferry_ticket **t = ap->t[h] + slot * world;
    uint64_t *at = ap->at[h] + slot * world;
    for (size_t i = a; i < b; i++)   /* a worker needing a range twice */
        if (ps->to[i] == me)
            memcpy((void *)(uintptr_t)ps->ops[i].remote_addr, ps->ops[i].local, ps->ops[i].len);
    for (uint32_t to = 0; to < world; to++) {
        size_t n = 0;
        for (size_t i = a; to != me && !ps->out_failed[to] && i < b; i++)
            if (ps->to[i] == to)
                ap->ops[n++] = ps->ops[i];
        if (n == 0)
            continue;
        int s = ferry_submit(ap->e, ap->ops, n, 0, &t[to]);
        if (s < 0) {
            t[to] = NULL;
            ap->w->hop[h].out_failed[to] = true;
            notify(ap, h, to, NV_FAILED);
            fail_once(ap, s, "subscriber: pushing to worker %u: %s", to);
            continue;
        }
        ap->w->hop[h].sent[to] += n;
        at[to] = ap->w->hop[h].sent[to];
    }
}

/* Wait for the tickets of a slot; tell each target what landed (early
 * only where it forwards my bytes; always once all of it did), or that it
 * gets nothing more. The notifications before have landed first, so that
 * a target hears its counts in order and nothing after its last one. */
static void settle(apply *ap, int h, size_t slot)
{
    reap_notifies(ap);
    pushes *ps = &ap->w->hop[h];
    uint32_t world = ap->sub->cfg.world;
    ferry_ticket **t = ap->t[h] + slot * world;
    const uint64_t *at = ap->at[h] + slot * world;
    int tmo = ap->sub->cfg.timeout_ms ? (int)ap->sub->cfg.timeout_ms : 60000;
    for (uint32_t to = 0; to < world; to++) {
        if (!t[to])
            continue;
        int st = ferry_ticket_wait(t[to], tmo);
        int te = ferry_ticket_error(t[to]);
        ferry_ticket_free(t[to]);
        t[to] = NULL;
        if (ps->out_failed[to])
            continue;
        if (st != FERRY_TICKET_COMPLETED) {
            ps->out_failed[to] = true;
            notify(ap, h, to, NV_FAILED);
            fail_once(ap, te ? te : FERRY_EIO, "subscriber: pushing to worker %u failed: %s", to);
            continue;
        }
        if (at[to] <= ps->done[to])
            continue;
        ps->done[to] = at[to];
        if (ps->done[to] == ps->total[to] || ps->progress[to])
            notify(ap, h, to, ps->done[to]);
    }
}

/* After the last settle: every target still short gets FAILED. */
static void finish(apply *ap, int h)
{
    pushes *ps = &ap->w->hop[h];
    reap_notifies(ap);
    for (uint32_t to = 0; to < ap->sub->cfg.world; to++)
        if (ps->total[to] && !ps->out_failed[to] && ps->done[to] < ps->total[to]) {
            ps->out_failed[to] = true;
            notify(ap, h, to, NV_FAILED);
        }
}

static bool fed(const pushes *ps, uint32_t world, bool *ok)
{
    bool all = true;
    for (uint32_t k = 0; k < world; k++) {
        if (ps->failed[k])
            *ok = false;
        else if (ps->got[k] < ps->expect[k])
            all = false;
    }
    return all;
}

/* Take one notification of hop h, waiting up to timeout_ms. */
static int take(apply *ap, int h, int timeout_ms)
{
    uint64_t v = 0;
    int rc = ferry_wait_notify(ap->e, ap->tag[h], 1, timeout_ms, &v);
    if (rc < 0)
        return rc;
    pushes *ps = &ap->w->hop[h];
    uint64_t from = v >> NV_SHIFT;
    if (from >= ap->sub->cfg.world)
        return 0;
    if (v & NV_FAILED)
        ps->failed[from] = true;
    else if ((v & NV_COUNT) > ps->got[from])
        ps->got[from] = v & NV_COUNT;
    return 0;
}

/* Hop 2: submit the forwards whose bytes have landed, in plan order. */
static void forward(apply *ap)
{
    const pushes *p2 = &ap->w->hop[1], *p1 = &ap->w->hop[0];
    size_t b = ap->fnext;
    for (; b < p2->n && !ap->fstop; b++) {
        uint32_t v = p2->via[b];
        if (v == UINT32_MAX)
            continue;
        if (p1->failed[v])
            ap->fstop = true;
        if (p1->failed[v] || p1->got[v] < p2->dep[b])
            break;
    }
    if (b == ap->fnext)
        return;
    size_t slot = (size_t)(ap->fround++ % WATERMARK);
    settle(ap, 1, slot);
    send_ops(ap, 1, slot, ap->fnext, b);
    ap->fnext = b;
}

/* The pipeline of one worker: my reads in batches of about batch_bytes;
 * the WRITEs of a batch leave (one ticket per target, not waited for) as
 * soon as its reads are in, and the next batch is read while they are in
 * flight; at most WATERMARK batches are in flight (before reading batch k
 * the WRITEs of batch k - WATERMARK must have landed). Between batches and
 * then until every worker feeding me has told me everything, what landed
 * for my node is forwarded (hop 2). The reads land in my parameters,
 * which are the WRITEs' source: no staging copy. */
static int run_apply(apply *ap, bool *reads_ok, bool *fed_ok, int *quiet, ferry_update_stats *st)
{
    ferry_subscriber *sub = ap->sub;
    work *w = ap->w;
    const pushes *p1 = &w->hop[0];
    uint32_t world = sub->cfg.world;
    int tmo = sub->cfg.timeout_ms ? (int)sub->cfg.timeout_ms : 60000;
    uint64_t budget = sub->cfg.batch_bytes ? sub->cfg.batch_bytes : BATCH_BYTES;
    *reads_ok = true;
    size_t ra = 0, pa = 0;
    for (uint64_t b = 0; ra < w->nreads; b++) {
        size_t slot = (size_t)(b % WATERMARK);
        settle(ap, 0, slot);   /* batch b - WATERMARK */
        size_t rb = ra;
        for (uint64_t bytes = 0; rb < w->nreads && (rb == ra || bytes < budget); rb++)
            bytes += w->reads[rb].len;
        double t0 = (double)fr_now_ns() / 1e9;
        int rr = do_reads(sub, w, ra, rb, ap->err);
        st->read_s += (double)fr_now_ns() / 1e9 - t0;
        st->batches++;
        if (rr < 0) {
            *reads_ok = false;
            if (ap->rc == 0)
                ap->rc = rr;
            break;
        }
        size_t pb = pa;
        while (pb < p1->n && p1->dep[pb] < rb)
            pb++;
        send_ops(ap, 0, slot, pa, pb);
        ra = rb;
        pa = pb;
        while (take(ap, 0, 0) == 0)
            ;
        forward(ap);
    }
    for (size_t k = 0; k < WATERMARK; k++)   /* the older batch first */
        settle(ap, 0, (size_t)((st->batches + k) % WATERMARK));
    finish(ap, 0);
    double t1 = (double)fr_now_ns() / 1e9;
    /* what reaches me, forwarded as it lands */
    uint64_t deadline = fr_now_ns() + (uint64_t)tmo * 1000000u;
    bool ok = true;
    while (!fed(&w->hop[0], world, &ok)) {
        uint64_t now = fr_now_ns();
        int left = now < deadline ? (int)((deadline - now) / 1000000u) : 0;
        int r = take(ap, 0, left);
        if (r < 0) {
            *quiet = r;
            ap->fstop = true;
            break;
        }
        forward(ap);
    }
    forward(ap);
    for (size_t k = 0; k < WATERMARK; k++)
        settle(ap, 1, (size_t)((ap->fround + k) % WATERMARK));
    finish(ap, 1);
    reap_notifies(ap);
    deadline = fr_now_ns() + (uint64_t)tmo * 1000000u;
    while (!fed(&w->hop[1], world, &ok)) {
        uint64_t now = fr_now_ns();
        int left = now < deadline ? (int)((deadline - now) / 1000000u) : 0;
        int r = take(ap, 1, left);
        if (r < 0) {
            *quiet = r;
            ok = false;
            break;
        }
    }
    (void)fed(&w->hop[0], world, &ok);
    *fed_ok = ok && *quiet == 0;
    st->forward_s = (double)fr_now_ns() / 1e9 - t1;
    return ap->rc;
}

int ferry_subscriber_update(ferry_subscriber *sub, uint64_t *generation, ferry_update_stats *st,
                            ferry_error *err)
{
    ferry_update_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!sub || !generation)
        return fr_rl_fail(err, FERRY_EINVAL, "subscriber: bad arguments");
    double t0 = (double)fr_now_ns() / 1e9;
    ferry_weight_manifest m = {0};
    bool current = false;
    uint64_t g = *generation;
    int rc = fr_rl_prepare(sub->s, sub->cfg.model, &g, &m, &current, st, err);
    st->generation = *generation;
    if (rc < 0 || current)
        return rc;   /* every member sees the same active generation, or retries */
    uint32_t world = sub->cfg.world, me = sub->cfg.rank;
    collect mine = { .rank = me }, all = {0};
    member *mbs = calloc(world, sizeof *mbs);
    work w = {0};
    uint8_t *rec = NULL;
    size_t reclen = 0;
    char key[400], bar[400];
    rc = mbs && pushes_init(&w.hop[0], world) == 0 && pushes_init(&w.hop[1], world) == 0
             ? my_demand(sub, &m, &mine, err)
                           : fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    if (rc == 0)
        rc = encode(sub, m.generation, &mine, &rec, &reclen);
    double tx = (double)fr_now_ns() / 1e9;
    snprintf(key, sizeof key, "ferry/wk/%s/sub/%s/%020" PRIu64 "/%u", sub->cfg.model,
             sub->cfg.group, m.generation, me);
    if (rc == 0 && (rc = ferry_kv_put(sub->s, key, rec, reclen, NULL)) < 0)
        fr_rl_fail(err, rc, "subscriber: cannot publish the demand: %s", ferry_store_last_error());
    free(rec);
    /* Everyone meets here even after a local failure, so nobody waits for
     * a demand that never comes. */
    snprintf(bar, sizeof bar, "ferry/wb/%s/sub/%s/%020" PRIu64 "/demand", sub->cfg.model,
             sub->cfg.group, m.generation);
    char member_name[32];
    snprintf(member_name, sizeof member_name, "worker %u", me);
    uint64_t tmo = sub->cfg.timeout_ms ? sub->cfg.timeout_ms : 60000;
    int brc = ferry_barrier(sub->s, bar, member_name, world, tmo, NULL);
    if (rc == 0 && brc < 0)
        rc = fr_rl_fail(err, brc, "subscriber: not every worker of group %s arrived: %s",
                  sub->cfg.group, ferry_strerror(brc));
    for (uint32_t k = 0; k < world && rc == 0; k++) {
        ferry_kv_value v = {0};
        snprintf(key, sizeof key, "ferry/wk/%s/sub/%s/%020" PRIu64 "/%u", sub->cfg.model,
                 sub->cfg.group, m.generation, k);
        rc = ferry_kv_get(sub->s, key, &v);
        if (rc < 0) {
            fr_rl_fail(err, rc, "subscriber: worker %u left no demand", k);
            break;
        }
        rc = decode(v.val, v.len, k, m.generation, m.n, ferry_store_engine(sub->s), k != me,
                    &mbs[k], &all, err);
        ferry_store_free(v.val);
    }
    double t1 = (double)fr_now_ns() / 1e9;
    st->prepare_s = t1 - t0;
    st->exchange_s = t1 - tx;
    if (rc == 0)
        rc = plan(sub, &m, &all, mbs, &w, err);
    double t2 = (double)fr_now_ns() / 1e9;
    st->plan_s = t2 - t1;
    if (rc == 0) {
        plan_stats(&sub->plan, st);
        /* reads, pushes and forwards as one pipeline (run_apply) */
        apply ap = { .sub = sub, .e = ferry_store_engine(sub->s), .w = &w, .mbs = mbs, .err = err,
                     .tag = { fr_hash64(bar, strlen(bar), 0) | 1, fr_hash64(bar, strlen(bar), 1) | 1 } };
        size_t nmax = w.hop[0].n > w.hop[1].n ? w.hop[0].n : w.hop[1].n;
        for (int h = 0; h < 2; h++) {
            ap.t[h] = calloc((size_t)world * WATERMARK, sizeof *ap.t[h]);
            ap.at[h] = calloc((size_t)world * WATERMARK, sizeof *ap.at[h]);
        }
        ap.ops = malloc((nmax ? nmax : 1) * sizeof *ap.ops);
        bool reads_ok = false, fed_ok = false;
        int quiet = 0;
        if (!ap.t[0] || !ap.t[1] || !ap.at[0] || !ap.at[1] || !ap.ops)
            rc = fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
        else
            rc = run_apply(&ap, &reads_ok, &fed_ok, &quiet, st);
        for (int h = 0; h < 2; h++)
            free(ap.t[h]), free(ap.at[h]);
        free(ap.ops);
        free(ap.nt);
        free(ap.nto);
        st->apply_s = (double)fr_now_ns() / 1e9 - t2;
        /* the part of apply after the time spent reading */
        st->push_s = st->apply_s - st->read_s > 0 ? st->apply_s - st->read_s : 0;
        if (rc == 0 && !fed_ok)
            rc = fr_rl_fail(err, FERRY_EREBUILD, "subscriber: %s from a worker that feeds this one; "
                      "the parameters must be rebuilt", quiet < 0 ? "no notification" : "a failed read");
    }
    /* The group meets again only if it met the first time. When that
     * barrier timed out nobody passed it (an arrival that times out is
     * withdrawn, so it could not release without me); when my reply was
     * lost, I did not apply and the others fail without me. Waiting here
     * for members that will not come would take the timeout a second time. */
    if (brc == 0) {
        snprintf(bar, sizeof bar, "ferry/wb/%s/sub/%s/%020" PRIu64 "/applied", sub->cfg.model,
                 sub->cfg.group, m.generation);
        double t6 = (double)fr_now_ns() / 1e9;
        brc = ferry_barrier(sub->s, bar, member_name, world, tmo, NULL);
        st->barrier_s = (double)fr_now_ns() / 1e9 - t6;
        if (rc == 0 && brc < 0)
            rc = fr_rl_fail(err, FERRY_EREBUILD, "subscriber: the group did not finish together: %s",
                      ferry_strerror(brc));
    }
    /* Every member has read every demand: mine can go. */
    snprintf(key, sizeof key, "ferry/wk/%s/sub/%s/%020" PRIu64 "/%u", sub->cfg.model,
             sub->cfg.group, m.generation, me);
    if (brc == 0)
        (void)ferry_kv_delete(sub->s, key, 0, NULL);
    st->bytes_read = w.my_read;
    st->group_bytes_read = w.group_read;
    st->bytes_pushed = w.pushed;
    st->bytes_received = w.received;
    st->ranges = w.nreads;
    st->tensors = sub->n;
    if (rc == 0) {
        *generation = m.generation;
        st->generation = m.generation;
        sub->generation = m.generation;
    }
    for (uint32_t k = 0; mbs && k < world; k++) {
        free(mbs[k].base);
        free(mbs[k].rr);
    }
    free(mbs);
    free(mine.v);
    free(all.v);
    free(w.reads);
    for (int h = 0; h < 2; h++)
        pushes_free(&w.hop[h]);
    free(w.scratch);
    ferry_weight_manifest_free(&m);
    return rc;
}

/* ---- open / close --------------------------------------------------------------------------- */

int ferry_subscriber_open(ferry_store *s, const ferry_subscriber_config *cfg,
                          const ferry_param_shard *shards, size_t n, ferry_subscriber **out,
                          ferry_error *err)
{
    if (!s || !cfg || !out || (n && !shards) || cfg->world == 0 || cfg->rank >= cfg->world ||
        !cfg->model[0] || !cfg->group[0] || strchr(cfg->group, '/'))
        return fr_rl_fail(err, FERRY_EINVAL, "subscriber: bad arguments (model, group, rank, world)");
    ferry_subscriber *sub = calloc(1, sizeof *sub);
    if (!sub)
        return FERRY_ENOMEM;
    sub->s = s;
    sub->cfg = *cfg;
    sub->n = n;
    sub->shards = calloc(n ? n : 1, sizeof *sub->shards);
    sub->names = calloc(n ? n : 1, sizeof *sub->names);
    sub->regs = calloc(n ? n : 1, sizeof *sub->regs);
    if (!sub->shards || !sub->names || !sub->regs) {
        ferry_subscriber_close(sub);
        return FERRY_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        sub->shards[i] = shards[i];
        snprintf(sub->names[i], sizeof sub->names[i], "%s", shards[i].tensor ? shards[i].tensor : "");
        sub->shards[i].tensor = sub->names[i];
    }
    *out = sub;
    return 0;
}

void ferry_subscriber_close(ferry_subscriber *sub)
{
    if (!sub)
        return;
    for (size_t i = 0; sub->regs && i < sub->n; i++)
        if (sub->regs[i].reg)
            (void)ferry_region_unregister(sub->regs[i].reg);
    free(sub->regs);
    free(sub->plan.ranges);
    free(sub->plan.base);
    free(sub->plan.pushes);
    free(sub->plan.node_id);
    free(sub->plan.node_workers);
    free(sub->plan.node_read);
    free(sub->plan.loads);
    free(sub->names);
    free(sub->shards);
    free(sub);
}
