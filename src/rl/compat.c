/* Compatibility mode through single-pull (weights_compat.h): every worker
 * of a rollout group gets every full tensor; the store serves each byte
 * once.
 *
 * An update: prepare (manifest, a share of the objects leased by each
 * worker, the staging size) → one KV record per worker ("verdict": ok or
 * why not, its node, staging size and region descriptor, a nonce) →
 * barrier → every record read: one failure fails everyone before anything
 * moves; otherwise every worker computes the same plan (leaders,
 * delegates, batches) and the records' nonces name this attempt (the
 * NOTIFY tag, the batch barrier). Then, batch by batch: leaders read their
 * tensors into their staging and WRITE each one, followed by a NOTIFY in
 * the same engine batch (sent only once the WRITE landed), to the other
 * workers of their node and to one delegate per other node; delegates
 * forward what lands to the rest of their node; everyone calls the loader
 * in manifest order. A tensor is checked against its checksum once on
 * every node, by whoever brings it there (the leader from the store, a
 * delegate from the network, before it forwards); a copy from a worker of
 * the same node over shm is not hashed again. A tensor larger than CHUNK
 * is read and written in pieces, each followed by a PROGRESS notification,
 * and a receiver's wait is a liveness deadline: it runs out only after
 * timeout_ms in which nothing of the attempt came (finish()), never for a
 * whole tensor or batch. Every tensor sits at the same
 * offset in every worker's staging, so a WRITE needs no addressing beyond
 * the plan. The staging is two halves, batch k in half k % 2: the reads
 * and sends of batch k+1 go out before batch k is finished, and a half is
 * written again only after the barrier of the batch it held. A worker
 * that fails posts the batch's abort key before the batch barrier; after
 * the barrier everyone reads that batch's key and all stop together.
 *
 * Record (little-endian): "FRYCOMP2", u64 generation, u32 rank, u32 node,
 * i32 verdict, u32 pad, u64 nonce, u64 staging bytes, u32 desc length,
 * u32 message length, u64 local segment, desc, message. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights_compat.h"
#include "rl/gen_int.h"
#include "rl/rl_int.h"

#define MAGIC "FRYCOMP2"
#define HDR 64
#define STAGING_DEFAULT (256ull << 20)
#define SLOT_ALIGN 64ull
#define NV_FAILED 1ull          /* notification value: tensor << 1 | FAILED */
#define NV_PROGRESS (1ull << 63) /* ... or PROGRESS | tensor << 1: a piece of it was read or
                                  * landed, more follows (the sender is alive and moving) */
#define NV_VIEW (1ull << 62)    /* ... or VIEW | tensor << 1: it is in the sender's staging (a
                                  * worker of the receiver's node, over shm): take it from there */
#define POLL_MS 20              /* notification waits are cut into slices to reap tickets */
#define CHUNK (64ull << 20)     /* a tensor moves in pieces of this much, each one progress */
#define GROUP_BYTES (4ull << 20)  /* small tensors a leader reads in one store run: up to this */
#define GROUP_TENSORS 128        /* ... and this many */

typedef struct mate {
    uint32_t node, dnode;       /* as passed; dense 0..nnodes-1 */
    uint64_t segment;           /* the store segment on its node (0: unknown) */
    uint64_t staging;
    uint8_t desc[FERRY_DESC_MAX];
    uint32_t desc_len;
    ferry_remote_region rr;
    bool imported;
    bool shm;                   /* this update: a worker of my node, reached over shm */
    ferry_mapping view;         /* a read-only view of its staging (ferry_remote_map), made
                                 * at the first tensor it leaves there for me */
    int view_rc;                /* < 0: the view could not be made (its tensors are READ) */
} mate;

struct ferry_compat_group {
    ferry_store *s;
    ferry_compat_config cfg;
    ferry_engine *e;
    uint8_t *staging;
    ferry_region *reg;
    uint8_t desc[FERRY_DESC_MAX];
    uint32_t desc_len;
    mate *mates;
    uint64_t generation;
};

static double now_s(void) { return (double)fr_now_ns() / 1e9; }
static uint64_t tmo_of(const ferry_compat_group *g) { return g->cfg.timeout_ms ? g->cfg.timeout_ms : 60000; }

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++, v >>= 8) p[i] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++, v >>= 8) p[i] = (uint8_t)v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* ---- prepare ------------------------------------------------------------------------- */

/* The active generation's manifest and, leased, the objects of my share
 * (tensor i with i % world == rank): between them the workers check every
 * object once. */
static int prepare(ferry_compat_group *g, uint64_t *active, ferry_weight_manifest *m,
                   ferry_error *err)
{
    const char *model = g->cfg.model;
    int rc = fr_rl_active_read(g->s, model, active, NULL);
    if (rc < 0)
        return fr_rl_fail(err, rc, "no generation of %s is active (%s)", model, ferry_strerror(rc));
    if (*active == g->generation)
        return 0;
    rc = ferry_weights_manifest(g->s, model, *active, m, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < m->n; i++)
        if (m->entries[i].bytes > g->cfg.staging_bytes)
            return fr_rl_fail(err, FERRY_EMSGSIZE, "tensor %s (%" PRIu64 " bytes) does not fit in "
                              "the staging buffer of worker %u (%" PRIu64 " bytes)",
                              m->entries[i].name, m->entries[i].bytes, g->cfg.rank,
                              g->cfg.staging_bytes);
    return fr_gen_lease_all(g->s, fr_gen_of(m), err);
}


/* ---- the exchange --------------------------------------------------------------------- */

static void rec_key(const ferry_compat_group *g, uint32_t rank, char *buf, size_t cap)
{
    snprintf(buf, cap, "ferry/wc/%s/%s/rec/%u", g->cfg.model, g->cfg.group, rank);
}

static int put_record(ferry_compat_group *g, uint64_t gen, int verdict, uint64_t nonce,
                      const char *msg)
{
    size_t ml = verdict < 0 ? strlen(msg) : 0;
    uint8_t *b = malloc(HDR + g->desc_len + ml);
    if (!b)
        return FERRY_ENOMEM;
    memcpy(b, MAGIC, 8);
    put64(b + 8, gen);
    put32(b + 16, g->cfg.rank);
    put32(b + 20, g->cfg.node);
    put32(b + 24, (uint32_t)verdict);
    put32(b + 28, 0);
    put64(b + 32, nonce);
    put64(b + 40, g->cfg.staging_bytes);
    put32(b + 48, g->desc_len);
    put32(b + 52, (uint32_t)ml);
    put64(b + 56, g->cfg.local_segment);
    memcpy(b + HDR, g->desc, g->desc_len);
    memcpy(b + HDR + g->desc_len, msg, ml);
    char key[400];
    rec_key(g, g->cfg.rank, key, sizeof key);
    int rc = ferry_kv_put(g->s, key, b, HDR + g->desc_len + ml, NULL);
    free(b);
    return rc;
}

/* Read every record: the group's verdict, the mates' nodes and regions,
 * the attempt's id. */
static int read_records(ferry_compat_group *g, uint64_t gen, uint64_t *id, uint32_t *imported,
                        ferry_error *err)
{
    uint32_t world = g->cfg.world;
    fr_hasher *h = fr_hasher_new(0x77636f6d);
    if (!h)
        return fr_rl_fail(err, FERRY_ENOMEM, "compat: out of memory");
    int rc = 0;
    for (uint32_t k = 0; k < world && rc == 0; k++) {
        char key[400];
        ferry_kv_value v = {0};
        rec_key(g, k, key, sizeof key);
        rc = ferry_kv_get(g->s, key, &v);
        if (rc < 0) {
            fr_rl_fail(err, rc, "compat: worker %u left no record", k);
            break;
        }
        const uint8_t *b = v.val;
        uint32_t dl = v.len >= HDR ? get32(b + 48) : 0, ml = v.len >= HDR ? get32(b + 52) : 0;
        if (v.len < HDR || memcmp(b, MAGIC, 8) != 0 || get32(b + 16) != k ||
            dl > FERRY_DESC_MAX || (uint64_t)HDR + dl + ml != v.len) {
            rc = fr_rl_fail(err, FERRY_EPROTO, "compat: the record of worker %u is malformed", k);
        } else if ((int32_t)get32(b + 24) < 0) {
            int code = (int32_t)get32(b + 24);
            rc = fr_rl_fail(err, code, "worker %u: %.*s", k, (int)(ml > 400 ? 400 : ml),
                            (const char *)b + HDR + dl);
        } else if (get64(b + 8) != gen) {
            rc = fr_rl_fail(err, FERRY_ESTATE, "compat: worker %u is updating to generation %" PRIu64
                            ", this one to %" PRIu64 "; retry", k, get64(b + 8), gen);
        } else {
            mate *mt = &g->mates[k];
            mt->node = get32(b + 20);
            mt->staging = get64(b + 40);
            mt->segment = get64(b + 56);
            fr_hasher_update(h, b + 32, 8);
            if (k != g->cfg.rank && (!mt->imported || mt->desc_len != dl ||
                                     memcmp(mt->desc, b + HDR, dl) != 0)) {
                mt->imported = false;
                ferry_remote_unmap(&mt->view);   /* a restarted worker: another staging */
                mt->view_rc = 0;
                rc = ferry_region_import(g->e, b + HDR, dl, &mt->rr);
                if (rc < 0) {
                    fr_rl_fail(err, rc, "compat: cannot reach worker %u: %s", k, ferry_strerror(rc));
                } else {
                    memcpy(mt->desc, b + HDR, dl);
                    mt->desc_len = dl;
                    mt->imported = true;
                    (*imported)++;
                }
            }
        }
        ferry_store_free(v.val);
    }
    fr_hash128_t d = fr_hasher_digest(h);
    fr_hasher_free(h);
    memcpy(id, d.b, sizeof *id);
    return rc;
}

/* ---- the plan ----------------------------------------------------------------------------- */

typedef struct plan {
    uint32_t nnodes;
    uint32_t *nworkers;       /* per dense node */
    uint32_t *leader;         /* per tensor */
    uint32_t *delegate;       /* per tensor x node: who receives it there first */
    uint64_t *off;            /* per tensor: its place in every staging buffer */
    size_t *bstart;           /* batch k: tensors [bstart[k], bstart[k+1]) */
    size_t nbatches;
    uint32_t slots;           /* 2: batch k sits in half k % 2 of the staging (pipelined);
                               * 1: a tensor needs more than half, batches take turns */
} plan;

static void plan_free(plan *p)
{
    free(p->nworkers), free(p->leader), free(p->delegate), free(p->off), free(p->bstart);
}

typedef struct lpt { uint64_t bytes; size_t i; } lpt;
static int by_size_desc(const void *a, const void *b)
{
    const lpt *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}
static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The dense node a tensor stored on `segment` lives on: that of the
 * members that named it; UINT32_MAX when nobody did, for 0, or when
 * members of two nodes named it. */
static uint32_t segment_node(const ferry_compat_group *g, uint64_t segment)
{
    uint32_t n = UINT32_MAX;
    for (uint32_t k = 0; segment && k < g->cfg.world; k++)
        if (g->mates[k].segment == segment) {
            if (n != UINT32_MAX && n != g->mates[k].dnode)
                return UINT32_MAX;
            n = g->mates[k].dnode;
        }
    return n;
}

/* Leaders and delegates come from the group update's reader assignment
 * (fr_readers, readers.c): each tensor is an object every worker wants
 * whole, never cut (chunk 0: one leader reads it whole and checks its
 * checksum), relayed (one WRITE per other node, to a delegate that
 * forwards it there). Tensors go longest first (ties: lower index), so the
 * greedy choice balances like longest-processing-time: the reader is the
 * worker whose choice leaves the busiest NIC direction of the group least
 * loaded — a tensor on a segment that members of node X named is read on
 * X (its read stays inside the node) — and, among a node's workers, the
 * one that read least; a node's delegate is its worker that forwarded
 * least. Batches: tensors in manifest order, each at a 64-byte aligned
 * offset, as many as fit in one half of the smallest staging buffer of
 * the group, batch k in half k % 2 (so the reads of batch k+1 need not
 * wait for batch k to be loaded); when the largest tensor needs more than
 * half, in the whole buffer, one batch at a time. */
static int make_plan(ferry_compat_group *g, const ferry_weight_manifest *m, plan *p)
{
    uint32_t world = g->cfg.world;
    size_t n = m->n;
    uint32_t *ids = malloc(world * sizeof *ids), *wnode = malloc(world * sizeof *wnode);
    uint64_t *bytes = malloc((n ? n : 1) * sizeof *bytes);
    fr_rd_demand *want = malloc(world * sizeof *want);
    lpt *ord = malloc((n ? n : 1) * sizeof *ord);
    fr_readers *rd = NULL;
    int rc = FERRY_ENOMEM;
    if (!ids || !wnode || !bytes || !want || !ord)
        goto out;
    uint64_t cap = UINT64_MAX;
    for (uint32_t k = 0; k < world; k++) {
        ids[k] = g->mates[k].node;
        if (g->mates[k].staging < cap)
            cap = g->mates[k].staging;
    }
    qsort(ids, world, sizeof *ids, cmp_u32);
    uint32_t nn = 0;
    for (uint32_t k = 0; k < world; k++)
        if (k == 0 || ids[k] != ids[nn - 1])
            ids[nn++] = ids[k];
    p->nnodes = nn;
    p->nworkers = calloc(nn, sizeof *p->nworkers);
    p->leader = malloc((n ? n : 1) * sizeof *p->leader);
    p->delegate = malloc((n ? n : 1) * nn * sizeof *p->delegate);
    p->off = malloc((n ? n : 1) * sizeof *p->off);
    p->bstart = malloc((n + 1) * sizeof *p->bstart);
    if (!p->nworkers || !p->leader || !p->delegate || !p->off || !p->bstart)
        goto out;
    for (uint32_t k = 0; k < world; k++) {
        mate *mt = &g->mates[k];
        mt->dnode = (uint32_t)((uint32_t *)bsearch(&mt->node, ids, nn, sizeof *ids, cmp_u32) - ids);
        p->nworkers[mt->dnode]++;
    }
    for (size_t i = 0; i < n; i++) {
        bytes[i] = m->entries[i].bytes;
        ord[i] = (lpt){ bytes[i], i };
    }
    qsort(ord, n, sizeof *ord, by_size_desc);
    for (uint32_t k = 0; k < world; k++)
        wnode[k] = g->mates[k].dnode;
    fr_rd_config rcfg = { .nworkers = world, .worker_node = wnode, .nnodes = nn, .chunk = 0,
                          .relay = true };
    if ((rc = fr_readers_open(&rcfg, &rd)) < 0)
        goto out;
    for (size_t j = 0; j < n; j++) {
        size_t i = ord[j].i;
        uint32_t src = segment_node(g, m->entries[i].segment);
        for (uint32_t k = 0; k < world; k++)
            want[k] = (fr_rd_demand){ .worker = k, .off = 0, .len = bytes[i] };
        const fr_rd_range *rg;
        const fr_rd_push *ps;
        size_t nr = 0, np = 0;
        if ((rc = fr_readers_object(rd, src == UINT32_MAX ? FR_RD_NO_NODE : src, bytes[i], want,
                                    world, &rg, &nr, &ps, &np)) < 0)
            goto out;
        /* an empty tensor has no range: rank 0 leads it, the lowest rank
         * of every other node is its delegate (nothing moves but the
         * notification) */
        uint32_t l = nr ? want[rg[0].reader].worker : 0, ln = g->mates[l].dnode;
        p->leader[i] = l;
        for (uint32_t d = 0; d < nn; d++) {
            uint32_t dl = l;
            for (uint32_t k = 0; d != ln && k < world && dl == l; k++)
                if (g->mates[k].dnode == d)
                    dl = k;
            p->delegate[i * nn + d] = dl;
        }
        for (size_t x = 0; nr && x < rg[0].npush; x++) {
            const fr_rd_push *q = &ps[rg[0].push + x];
            uint32_t to = want[q->to].worker, tn = g->mates[to].dnode;
            if (q->hop == 1 && tn != ln)
                p->delegate[i * nn + tn] = to;
        }
    }
    uint64_t half = (cap / 2) & ~(SLOT_ALIGN - 1), largest = 0;
    for (size_t i = 0; i < n; i++)
        largest = bytes[i] > largest ? bytes[i] : largest;
    p->slots = largest <= half ? 2 : 1;
    uint64_t room = p->slots == 2 ? half : cap;
    p->nbatches = 0;
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t o = (at + SLOT_ALIGN - 1) & ~(SLOT_ALIGN - 1);
        if (i == 0 || o + bytes[i] > room) {
            p->bstart[p->nbatches++] = i;
            o = 0;
        }
        at = o + bytes[i];
        p->off[i] = o + (p->slots == 2 && p->nbatches % 2 == 0 ? half : 0);
    }
    p->bstart[p->nbatches] = n;
    rc = 0;
out:
    fr_readers_close(rd);
    free(ids), free(wnode), free(bytes), free(want), free(ord);
    return rc;
}

/* ---- apply ---------------------------------------------------------------------------------- */

enum { PENDING = 0, LANDED = 1, FAILED = 2 };

typedef struct sent {
    uint64_t t;               /* the batch in the push stream */
    size_t tensor;
    uint32_t to;
    bool write;
    uint64_t bytes;           /* what its WRITEs move */
} sent;

typedef struct apply {
    ferry_compat_group *g;
    const ferry_weight_manifest *m;
    const plan *p;
    ferry_weights_tensor_fn fn;
    void *ctx;
    ferry_compat_stats *st;
    ferry_error *err;
    uint64_t tag;
    ferry_exec_stream *xs;    /* my WRITEs and notifications (exec's push stream) */
    uint8_t *state;           /* per tensor */
    const uint8_t **src;      /* per tensor: where it is for the loader (NULL: my staging) */
    uint64_t silent_ns;       /* time spent waiting since the last notification came */
    sent *out;
    size_t nout, cap_out;
    size_t next;              /* the next tensor to hand to fn */
    int rc;                   /* my first failure */
    bool derived;             /* it was a FAILED from a sender: the sender posts the cause */
} apply;

static int failf(apply *ap, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(apply *ap, int code, const char *fmt, ...)
{
    if (ap->rc)
        return ap->rc;
    ap->rc = code;
    if (ap->err) {
        va_list va;
        va_start(va, fmt);
        vsnprintf(ap->err->msg, sizeof ap->err->msg, fmt, va);
        va_end(va);
        ap->err->code = code;
    }
    return code;
}

/* One engine batch to worker `to`: the tensor's bytes into the same place
 * of its staging and a NOTIFY after them (not sent if the WRITE fails:
 * the ticket then says so and the target is told FAILED), or only a
 * NOTIFY saying FAILED — or, to a worker of my node over shm, only a
 * NOTIFY saying VIEW: it takes the tensor from my staging through a
 * read-only view, and nothing is copied for it. Not waited for. */
static void send(apply *ap, size_t t, uint32_t to, bool ok)
{
    ferry_compat_group *g = ap->g;
    const mate *mt = &g->mates[to];
    bool view = ok && mt->shm;
    /* the last piece of a large tensor (send_all), or all of a small one */
    uint64_t at = ok ? ap->m->entries[t].bytes / CHUNK * CHUNK : 0;
    at = at == ap->m->entries[t].bytes && at ? at - CHUNK : at;
    uint64_t len = ok && !view ? ap->m->entries[t].bytes - at : 0;
    ferry_op ops[2];
    size_t n = 0;
    if (len)
        ops[n++] = (ferry_op){ .opcode = FERRY_OP_WRITE, .local = g->staging + ap->p->off[t] + at,
                               .len = len, .peer = mt->rr.peer,
                               .remote_addr = mt->rr.addr + ap->p->off[t] + at, .key = mt->rr.key };
    ops[n++] = (ferry_op){ .opcode = FERRY_OP_NOTIFY, .peer = mt->rr.peer, .tag = ap->tag,
                           .value = (uint64_t)t << 1 | (!ok ? NV_FAILED : view ? NV_VIEW : 0) };
    if (fr_grow((void **)&ap->out, &ap->cap_out, ap->nout + 1, sizeof *ap->out) < 0) {
        failf(ap, FERRY_EREBUILD, "compat: out of memory sending tensor %s", ap->m->entries[t].name);
        return;
    }
    uint64_t tk = 0;
    int rc = ferry_exec_stream_submit(ap->xs, ops, n, &tk);
    if (rc < 0) {
        failf(ap, FERRY_EREBUILD, "compat: sending tensor %s to worker %u failed: %s",
              ap->m->entries[t].name, to, ferry_strerror(rc));
        return;   /* the target hears nothing: it times out */
    }
    ap->out[ap->nout++] = (sent){ tk, t, to, len > 0, len };
}

/* Whether worker k gets tensor t from me: as its leader, the other
 * workers of my node and the delegate of every other node; as the
 * delegate of my node (the leader elsewhere), the other workers of my node. */
static bool feeds(const apply *ap, size_t t, uint32_t k)
{
    const plan *p = ap->p;
    const ferry_compat_group *g = ap->g;
    uint32_t me = g->cfg.rank, mine = g->mates[me].dnode, l = p->leader[t];
    if (k == me)
        return false;
    uint32_t kn = g->mates[k].dnode;
    return l == me ? (kn == mine || p->delegate[t * p->nnodes + kn] == k)
                   : (kn == mine && p->delegate[t * p->nnodes + mine] == me);
}

/* Tensor t to everyone I feed. A large one goes in CHUNK pieces, piece by
 * piece to every target in turn (so that no target waits in silence while
 * the whole tensor goes to the others first), each but the last followed
 * by a PROGRESS notification in its engine batch; the last piece and the
 * tensor's notification go once every earlier piece to that target landed
 * (FAILED if one did not). */
static void send_all(apply *ap, size_t t, bool ok)
{
    ferry_compat_group *g = ap->g;
    const uint32_t world = g->cfg.world;
    const uint64_t len = ap->m->entries[t].bytes;
    uint64_t pieces = ok ? (len + CHUNK - 1) / CHUNK : 0;
    uint64_t *tk = pieces > 1 ? calloc((size_t)world * (pieces - 1), sizeof *tk) : NULL;
    bool *bad = pieces > 1 ? calloc(world, sizeof *bad) : NULL;
    if (pieces > 1 && (!tk || !bad)) {
        free(tk), free(bad);
        failf(ap, FERRY_EREBUILD, "compat: out of memory sending tensor %s", ap->m->entries[t].name);
        pieces = 0;
        ok = false;
    }
    for (uint64_t p = 0; p + 1 < pieces; p++)
        for (uint32_t k = 0; k < world; k++) {
            if (!feeds(ap, t, k) || bad[k] || g->mates[k].shm)   /* a view: nothing to copy */
                continue;
            const mate *mt = &g->mates[k];
            uint64_t at = p * CHUNK;
            ferry_op ops[2] = {
                { .opcode = FERRY_OP_WRITE, .local = g->staging + ap->p->off[t] + at, .len = CHUNK,
                  .peer = mt->rr.peer, .remote_addr = mt->rr.addr + ap->p->off[t] + at,
                  .key = mt->rr.key },
                { .opcode = FERRY_OP_NOTIFY, .peer = mt->rr.peer, .tag = ap->tag,
                  .value = NV_PROGRESS | (uint64_t)t << 1 } };
            int rc = ferry_exec_stream_submit(ap->xs, ops, 2, &tk[(size_t)k * (pieces - 1) + p]);
            if (rc < 0) {
                bad[k] = true;
                failf(ap, FERRY_EREBUILD, "compat: sending tensor %s to worker %u failed: %s",
                      ap->m->entries[t].name, k, ferry_strerror(rc));
            }
        }
    for (uint32_t k = 0; k < world; k++) {
        if (!feeds(ap, t, k))
            continue;
        for (uint64_t p = 0; p + 1 < pieces; p++) {
            uint64_t x = tk[(size_t)k * (pieces - 1) + p];
            if (!x)
                continue;
            int te = 0;   /* one piece: the stream's timeout is a liveness bound */
            int st = ferry_exec_stream_wait(ap->xs, x, true, &te);
            if (st == FERRY_TICKET_COMPLETED && !bad[k]) {
                if (g->mates[k].dnode == g->mates[g->cfg.rank].dnode)
                    ap->st->bytes_sent_intra += CHUNK;
                else
                    ap->st->bytes_sent_cross += CHUNK;
            } else if (!bad[k]) {
                bad[k] = true;
                failf(ap, FERRY_EREBUILD, "compat: sending tensor %s to worker %u failed: %s",
                      ap->m->entries[t].name, k, ferry_strerror(te ? te : FERRY_EIO));
            }
        }
        send(ap, t, k, ok && !(bad && bad[k]));
    }
    free(tk);
    free(bad);
}

/* Tell those waiting for tensor t from me that a piece of it was read. */
static void progress_all(apply *ap, size_t t)
{
    ferry_compat_group *g = ap->g;
    for (uint32_t k = 0; k < g->cfg.world; k++) {
        if (!feeds(ap, t, k))
            continue;
        ferry_op op = { .opcode = FERRY_OP_NOTIFY, .peer = g->mates[k].rr.peer, .tag = ap->tag,
                        .value = NV_PROGRESS | (uint64_t)t << 1 };
        uint64_t tk = 0;
        if (fr_grow((void **)&ap->out, &ap->cap_out, ap->nout + 1, sizeof *ap->out) < 0 ||
            ferry_exec_stream_submit(ap->xs, &op, 1, &tk) < 0)
            continue;   /* a hint only: the tensor's own notification says what happened */
        ap->out[ap->nout++] = (sent){ tk, t, k, false, 0 };
    }
}

/* Who sends me tensor t: its leader when it is on my node, else the
 * delegate of my node (the leader when that is me). */
static uint32_t sender_of(const apply *ap, size_t t)
{
    const ferry_compat_group *g = ap->g;
    uint32_t me = g->cfg.rank, mine = g->mates[me].dnode, l = ap->p->leader[t];
    if (g->mates[l].dnode == mine)
        return l;
    uint32_t d = ap->p->delegate[t * ap->p->nnodes + mine];
    return d == me ? l : d;
}

/* Whether tensor t must be checked against its checksum as it lands here.
 * A tensor is checked on every node by the worker that brings it there:
 * its leader as it reads it from the store, the delegate of every other
 * node as it arrives from the network. A copy from a worker of this node
 * over shm is a memcpy of those checked bytes and is not hashed again;
 * anything else is. */
static bool check_on_arrival(const apply *ap, size_t t)
{
    const ferry_compat_group *g = ap->g;
    uint32_t from = sender_of(ap, t);
    if (g->mates[from].dnode != g->mates[g->cfg.rank].dnode)
        return true;
    const char *tr = ferry_peer_transport(g->e, g->mates[from].rr.peer);
    return !tr || strcmp(tr, "shm") != 0;
}

/* Reap finished tickets (all of them, waiting, when wait). A WRITE that
 * failed leaves its target without a NOTIFY: it is told FAILED now. */
static void reap(apply *ap, bool wait)
{
    ferry_compat_group *g = ap->g;
    size_t keep = 0, n = ap->nout, nfailed = 0;
    sent *failed = n ? malloc(n * sizeof *failed) : NULL;
    for (size_t i = 0; i < n; i++) {
        sent s = ap->out[i];
        /* each ticket is a tensor (its pieces land one after the other):
         * the timeout is per ticket, not for everything in flight */
        int te = 0;
        int state = ferry_exec_stream_wait(ap->xs, s.t, wait, &te);
        if (state == FERRY_TICKET_PENDING) {
            ap->out[keep++] = s;
            continue;
        }
        if (state == FERRY_TICKET_COMPLETED) {
            if (s.write) {
                uint64_t len = s.bytes;
                if (g->mates[s.to].dnode == g->mates[g->cfg.rank].dnode)
                    ap->st->bytes_sent_intra += len;
                else
                    ap->st->bytes_sent_cross += len;
            }
            continue;
        }
        failf(ap, FERRY_EREBUILD, "compat: sending tensor %s to worker %u failed: %s",
              ap->m->entries[s.tensor].name, s.to, ferry_strerror(te ? te : FERRY_EIO));
        if (s.write && failed)   /* told below (without memory: it times out) */
            failed[nfailed++] = s;
    }
    ap->nout = keep;
    for (size_t i = 0; i < nfailed; i++)
        send(ap, failed[i].tensor, failed[i].to, false);
    free(failed);
}

/* Hand the tensors that are there, in manifest order, to the loader. */
static void deliver(apply *ap, size_t end)
{
    ferry_compat_group *g = ap->g;
    while (ap->rc == 0 && ap->next < end && ap->state[ap->next] != PENDING) {
        size_t t = ap->next;
        const ferry_weight_entry *e = &ap->m->entries[t];
        if (ap->state[t] == FAILED) {
            ap->derived = ap->rc == 0;
            failf(ap, FERRY_EREBUILD, "tensor %s did not arrive (its leader, worker %u, could not "
                  "read or send it); the loaded weights must be rebuilt", e->name, ap->p->leader[t]);
            return;
        }
        const uint8_t *data = ap->src[t] ? ap->src[t] : g->staging + ap->p->off[t];
        double t1 = now_s();
        int r = ap->fn(ap->ctx, e, data);
        ap->st->load_s += now_s() - t1;
        if (r != 0) {
            failf(ap, r, "the loader stopped at tensor %s (%d)", e->name, r);
            return;
        }
        ap->st->tensors++;
        ap->st->bytes += e->bytes;
        ap->next++;
    }
}

/* Tensor t is in the staging of its sender, a worker of my node: through
 * a read-only view of that staging (made at the first such tensor and
 * kept while the sender's registration stays), or, when no view can be
 * made, READ into my staging. false when the READ failed. */
static bool take_view(apply *ap, size_t t)
{
    ferry_compat_group *g = ap->g;
    uint32_t from = sender_of(ap, t);
    mate *mt = &g->mates[from];
    const ferry_weight_entry *e = &ap->m->entries[t];
    if (!mt->view.addr && mt->view_rc == 0) {
        mt->view_rc = ferry_remote_map(g->e, &mt->rr, mt->rr.addr, mt->rr.len, &mt->view);
        if (mt->view_rc < 0)
            FR_WARN("compat", "no view of worker %u's staging (%s): its tensors are READ instead",
                    from, ferry_strerror(mt->view_rc));
    }
    if (mt->view.addr) {
        ap->src[t] = (const uint8_t *)mt->view.addr + ap->p->off[t];
        ap->st->bytes_viewed += e->bytes;
        return true;
    }
    ferry_op op = { .opcode = FERRY_OP_READ, .local = g->staging + ap->p->off[t], .len = e->bytes,
                    .peer = mt->rr.peer, .remote_addr = mt->rr.addr + ap->p->off[t],
                    .key = mt->rr.key };
    uint64_t id = 0;
    int te = 0;
    int rc = e->bytes == 0 ? 0 : ferry_exec_stream_submit(ap->xs, &op, 1, &id);
    if (rc == 0 && id && ferry_exec_stream_wait(ap->xs, id, true, &te) != FERRY_TICKET_COMPLETED)
        rc = te ? te : FERRY_EIO;
    if (rc < 0) {
        failf(ap, FERRY_EREBUILD, "compat: reading tensor %s from the staging of worker %u "
              "failed: %s; the loaded weights must be rebuilt", e->name, from, ferry_strerror(rc));
        return false;
    }
    ap->st->bytes_received += e->bytes;
    return true;
}

/* One notification: tensor t landed here (forward it if I am my node's
 * delegate for it) or will not. */
static void on_notify(apply *ap, uint64_t v, size_t a, size_t b)
{
    ferry_compat_group *g = ap->g;
    ap->silent_ns = 0;   /* the group moves: the deadline starts again */
    if (v & NV_PROGRESS)
        return;
    size_t t = (size_t)((v & ~NV_VIEW) >> 1);
    uint32_t me = g->cfg.rank;
    if (t < a || t >= b || ap->p->leader[t] == me || ap->state[t] != PENDING)
        return;   /* not this batch's, or not mine to receive: ignore */
    bool ok = !(v & NV_FAILED);
    if (ok && (v & NV_VIEW))
        ok = take_view(ap, t);
    else if (ok)
        ap->st->bytes_received += ap->m->entries[t].bytes;
    if (ok && check_on_arrival(ap, t)) {   /* before it is forwarded or loaded */
        const ferry_weight_entry *e = &ap->m->entries[t];
        double t0 = now_s();
        ferry_error verr = {0};
        ok = fr_gen_verify_tensor(g->s, fr_gen_of(ap->m), e->index,
                                  ap->src[t] ? ap->src[t] : g->staging + ap->p->off[t],
                                  &verr) == 0;
        ap->st->verify_s += now_s() - t0;
        if (!ok)
            failf(ap, FERRY_EREBUILD, "%s as it arrived; the loaded weights must be rebuilt",
                  verr.msg);
    }
    ap->state[t] = ok ? LANDED : FAILED;
    send_all(ap, t, ok);
}

static bool settled(const apply *ap, size_t a, size_t b)
{
    for (size_t t = a; t < b; t++)
        if (ap->state[t] == PENDING)
            return false;
    return true;
}

typedef struct piece_ctx { apply *ap; size_t t; } piece_ctx;

static void piece_read(void *ctx)
{
    piece_ctx *c = ctx;
    progress_all(c->ap, c->t);
}

/* Read tensor t from the store into its place in my staging (exec's store
 * reads of the whole-tensor target) and check it against its checksums.
 * A large one is read in pieces of about CHUNK bytes, and after each
 * piece those waiting for it hear that it moves. */
static int read_tensor(apply *ap, size_t t, ferry_error *err)
{
    ferry_compat_group *g = ap->g;
    const ferry_weight_entry *e = &ap->m->entries[t];
    uint8_t *dst = g->staging + ap->p->off[t];
    fr_gen *gen = fr_gen_of(ap->m);
    piece_ctx pc = { ap, t };
    int rc = fr_rl_read_whole(g->s, gen, e->index, dst, e->bytes, e->bytes > CHUNK ? CHUNK : 0,
                              piece_read, &pc, err);
    if (rc == 0)
        rc = fr_gen_verify_tensor(g->s, gen, e->index, dst, err);
    return rc;
}

/* My reads and sends of batch [a, b) (its tensors I lead). Meanwhile
 * what lands of tensors [lo, hi) is forwarded and, up to `ready`, handed
 * to the loader: with two staging halves the previous batch is still
 * arriving while this one is read, and the next one's leaders may
 * already be sending it. */
static void lead(apply *ap, size_t a, size_t b, size_t lo, size_t hi, size_t ready)
{
    ferry_compat_group *g = ap->g;
    uint32_t me = g->cfg.rank;
    uint64_t v;
    uint32_t idx[GROUP_TENSORS];
    size_t tt[GROUP_TENSORS], cap[GROUP_TENSORS];
    void *dst[GROUP_TENSORS];
    for (size_t t = a; t < b;) {
        if (ap->p->leader[t] != me) {
            t++;
            continue;
        }
        /* the small tensors I lead from t on, read in one store run; a
         * large one alone, in pieces with progress */
        size_t n = 0;
        uint64_t sum = 0;
        for (size_t u = t; u < b && n < GROUP_TENSORS; u++) {
            const ferry_weight_entry *e = &ap->m->entries[u];
            if (ap->p->leader[u] != me)
                continue;
            if (n && sum + e->bytes > GROUP_BYTES)
                break;
            tt[n] = u;
            idx[n] = e->index;
            dst[n] = g->staging + ap->p->off[u];
            cap[n++] = e->bytes;
            sum += e->bytes;
            if (e->bytes > GROUP_BYTES)
                break;
        }
        double t0 = now_s();
        int grc = 0;
        ferry_error gerr = {0};
        if (n > 1)
            grc = fr_rl_read_wholes(g->s, fr_gen_of(ap->m), idx, dst, cap, n, &gerr);
        ap->st->read_s += now_s() - t0;
        /* A run that failed fails all its tensors with its error (which
         * names the object): reading them again one by one could wait out
         * the store's timeout once per tensor behind a stalled node. */
        if (grc < 0)
            failf(ap, FERRY_EREBUILD, "compat: reading %zu tensors from %s on: %s; the loaded "
                  "weights must be rebuilt", n, ap->m->entries[tt[0]].name, gerr.msg);
        for (size_t k = 0; k < n; k++) {
            size_t u = tt[k];
            const ferry_weight_entry *e = &ap->m->entries[u];
            ferry_error rerr = {0};
            /* read together: checked one by one; a tensor alone: read
             * (in pieces when large) and checked */
            t0 = now_s();
            int r = grc < 0 ? grc
                  : n > 1 ? fr_gen_verify_tensor(g->s, fr_gen_of(ap->m), e->index, dst[k], &rerr)
                          : read_tensor(ap, u, &rerr);
            ap->st->read_s += now_s() - t0;
            if (r < 0 && grc == 0)
                failf(ap, FERRY_EREBUILD, "%s; the loaded weights must be rebuilt", rerr.msg);
            else if (r == 0) {
                ap->st->bytes_read += e->bytes;
                ap->st->tensors_led++;
            }
            ap->state[u] = r < 0 ? FAILED : LANDED;
            send_all(ap, u, r == 0);
        }
        t = tt[n - 1] + 1;
        while (ferry_wait_notify(g->e, ap->tag, 1, 0, &v) == 0)
            on_notify(ap, v, lo, hi);
        deliver(ap, ready);
    }
}

/* The rest of batch [a, b): what comes to me, forwarded and loaded as it
 * lands; notifications of the next batch, up to `hi`, are taken too (its
 * leaders may already be sending it). */
static void finish(apply *ap, size_t a, size_t b, size_t hi)
{
    ferry_compat_group *g = ap->g;
    uint32_t me = g->cfg.rank;
    uint64_t v;
    double t1 = now_s();
    const uint64_t limit = tmo_of(g) * 1000000ull;
    /* A liveness deadline, not one for the batch: it counts only the time
     * spent waiting here since the last notification of this attempt (a
     * piece that landed or was read anywhere in the group, a tensor), so a
     * slow group that keeps moving never runs out, while a sender that died
     * or stopped leaves its receivers waiting timeout_ms at most. Time this
     * worker spent elsewhere (loading, checking) is not counted, and what
     * queued meanwhile is taken before the deadline is looked at. */
    ap->silent_ns = 0;
    deliver(ap, b);
    while (!settled(ap, a, b)) {
        while (ferry_wait_notify(g->e, ap->tag, 1, 0, &v) == 0)
            on_notify(ap, v, a, hi);
        reap(ap, false);
        deliver(ap, b);
        if (settled(ap, a, b))
            break;
        if (ap->silent_ns >= limit) {
            size_t t = a;
            while (ap->state[t] != PENDING)
                t++;
            failf(ap, FERRY_EREBUILD, "compat: nothing came from worker %u for tensor %s for %"
                  PRIu64 " ms (it died, hung or cannot reach this worker); the loaded weights "
                  "must be rebuilt", sender_of(ap, t), ap->m->entries[t].name, tmo_of(g));
            for (t = a; t < b; t++)   /* whoever waits on me hears it */
                if (ap->state[t] == PENDING) {
                    ap->state[t] = FAILED;
                    if (ap->p->delegate[t * ap->p->nnodes + g->mates[me].dnode] == me)
                        send_all(ap, t, false);
                }
            break;
        }
        uint64_t w0 = fr_now_ns();
        if (ferry_wait_notify(g->e, ap->tag, 1, POLL_MS, &v) == 0)
            on_notify(ap, v, a, hi);
        else
            ap->silent_ns += fr_now_ns() - w0;
    }
    reap(ap, true);
    deliver(ap, b);
    ap->st->wait_s += now_s() - t1;
}

/* Every batch; after each, a barrier and the abort check. With two
 * staging halves the reads and sends of batch k+1 go out before batch k
 * is finished: the half they fill held batch k-1, which every worker
 * finished before the barrier after it (so a half is written again only
 * once the whole group is done with it: the watermark is two batches). */
static int run_apply(apply *ap, uint64_t id)
{
    ferry_compat_group *g = ap->g;
    const plan *p = ap->p;
    char bar[400], abort_key[400], member[32];
    snprintf(bar, sizeof bar, "ferry/wc/%s/%s/%016" PRIx64 "/batch", g->cfg.model, g->cfg.group, id);
    snprintf(member, sizeof member, "worker %u", g->cfg.rank);
    bool posted = false;
    const size_t nb = p->nbatches;
    const bool two = p->slots == 2;
    ap->st->staging_slots = p->slots;
    if (two && nb)
        lead(ap, p->bstart[0], p->bstart[1], 0, p->bstart[nb > 1 ? 2 : 1], 0);
    for (size_t k = 0; k < (nb ? nb : 1); k++) {
        if (nb) {
            /* notifications can come for this batch and, with two halves, the next */
            size_t a = p->bstart[k], b = p->bstart[k + 1];
            size_t hi = two && k + 1 < nb ? p->bstart[k + 2] : b;
            if (!two)
                lead(ap, a, b, a, b, b);
            else if (k + 1 < nb) {
                lead(ap, b, hi, a, hi, b);
                ap->st->pipelined_batches++;
            }
            finish(ap, a, b, hi);
        }
        ap->st->batches++;
        double t0 = now_s();
        /* One abort key per batch: a worker that passed this barrier and
         * failed in the next batch posts under that batch's key, so a
         * slower one still checking this batch does not stop a batch
         * early while the others go on to its barrier. */
        snprintf(abort_key, sizeof abort_key, "ferry/wc/%s/%s/%016" PRIx64 "/abort/%zu",
                 g->cfg.model, g->cfg.group, id, k);
        if (ap->rc && !ap->derived && !posted) {   /* the first cause posted wins */
            char why[600];
            int n = snprintf(why, sizeof why, "worker %u: %s", g->cfg.rank,
                             ap->err ? ap->err->msg : ferry_strerror(ap->rc));
            (void)ferry_kv_cas(g->s, abort_key, 0, why,
                               (size_t)(n < (int)sizeof why ? n : (int)sizeof why - 1), NULL);
            posted = true;
        }
        int brc = ferry_barrier(g->s, bar, member, g->cfg.world, tmo_of(g), NULL);
        if (brc < 0) {
            failf(ap, FERRY_EREBUILD, "compat: the group did not finish batch %zu together "
                  "within %" PRIu64 " ms of this worker arriving (a worker died, hung or cannot "
                  "reach the master): %s; the loaded weights must be rebuilt", k, tmo_of(g),
                  ferry_strerror(brc));
            ap->st->barrier_s += now_s() - t0;
            return ap->rc;
        }
        ferry_kv_value v = {0};
        int arc = ferry_kv_get(g->s, abort_key, &v);
        ap->st->barrier_s += now_s() - t0;
        if (arc == 0) {
            /* the cause, for those that only heard of it */
            if (ap->rc == 0 || ap->derived) {
                ap->rc = 0;
                failf(ap, FERRY_EREBUILD, "%.*s",
                      (int)(v.len > 400 ? 400 : v.len), (const char *)v.val);
            }
            ferry_store_free(v.val);
            return ap->rc;
        }
        if (ap->rc)
            return ap->rc;
    }
    return 0;
}

int ferry_compat_group_update(ferry_compat_group *g, uint64_t *generation,
                              ferry_weights_tensor_fn fn, void *ctx, ferry_compat_stats *st,
                              ferry_error *err)
{
    ferry_compat_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (err)
        err->msg[0] = 0;
    if (!g || !generation || !fn)
        return fr_rl_fail(err, FERRY_EINVAL, "compat: bad arguments");
    double t0 = now_s();
    g->generation = *generation;
    st->generation = *generation;
    ferry_weight_manifest m = {0};
    uint64_t active = 0;
    ferry_error perr = {0};
    int verdict = prepare(g, &active, &m, &perr);
    if (verdict == 0 && active == g->generation)
        return 0;   /* current; every member sees the same active generation */
    if (verdict < 0 && active == 0) {
        if (err)
            *err = perr;
        return verdict;   /* nothing announced: nobody goes further */
    }
    double t1 = now_s();
    st->prepare_s = t1 - t0;
    /* Every worker records its verdict, even a failed one, so nobody waits
     * for a record that never comes. */
    int rc = put_record(g, active, verdict, fr_random_u64(), perr.msg);
    if (rc < 0)
        fr_rl_fail(err, rc, "compat: cannot record this worker's verdict: %s",
                   ferry_store_last_error());
    char bar[400], member[32];
    snprintf(bar, sizeof bar, "ferry/wc/%s/%s/prepared", g->cfg.model, g->cfg.group);
    snprintf(member, sizeof member, "worker %u", g->cfg.rank);
    int brc = ferry_barrier(g->s, bar, member, g->cfg.world, tmo_of(g), NULL);
    if (rc == 0 && brc < 0)
        rc = fr_rl_fail(err, brc, "compat: not every worker of group %s arrived: %s",
                        g->cfg.group, ferry_strerror(brc));
    uint64_t id = 0;
    if (rc == 0)
        rc = read_records(g, active, &id, &st->imported, err);
    double t2 = now_s();
    st->exchange_s = t2 - t1;
    plan p = {0};
    if (rc == 0 && (rc = make_plan(g, &m, &p)) < 0)
        fr_rl_fail(err, rc, "compat: planning: %s", ferry_strerror(rc));
    double t3 = now_s();
    st->plan_s = t3 - t2;
    if (rc == 0) {
        uint64_t total = m.bytes;
        st->nodes = p.nnodes;
        st->group_bytes_read = total;
        st->group_cross_bytes = total * (p.nnodes - 1);
        st->group_intra_bytes = total * (g->cfg.world - p.nnodes);
        /* Who takes my tensors through a view of my staging: the workers of
         * my node that I reach over shm (every sender decides for its own
         * targets; a receiver that cannot make the view READs instead). */
        for (uint32_t k = 0; k < g->cfg.world; k++) {
            const char *tp = k == g->cfg.rank ? NULL : ferry_peer_transport(g->e, g->mates[k].rr.peer);
            g->mates[k].shm = tp && !strcmp(tp, "shm") &&
                              g->mates[k].dnode == g->mates[g->cfg.rank].dnode;
        }
        apply ap = { .g = g, .m = &m, .p = &p, .fn = fn, .ctx = ctx, .st = st, .err = err,
                     .tag = id | 1, .state = calloc(m.n ? m.n : 1, 1),
                     .src = calloc(m.n ? m.n : 1, sizeof *ap.src) };
        /* The WRITEs go through exec's push stream: each batch's outcome
         * tallied, nothing left in flight once it is closed. */
        ferry_stream_config sc = { .engine = g->e, .timeout_ms = (int)tmo_of(g) };
        rc = ap.state && ap.src && ferry_exec_stream_open(&sc, &ap.xs, NULL, NULL) == 0
                 ? run_apply(&ap, id)
                 : fr_rl_fail(err, FERRY_ENOMEM, "compat: out of memory");
        if (ap.xs) {
            reap(&ap, true);   /* nothing stays in flight after a failure */
            (void)ferry_exec_stream_close(ap.xs, NULL);
        }
        free(ap.out);
        free(ap.state);
        free(ap.src);
        st->apply_s = now_s() - t3;
    }
    plan_free(&p);
    if (rc == 0) {
        g->generation = m.generation;
        *generation = m.generation;
        st->generation = m.generation;
    }
    ferry_weight_manifest_free(&m);
    st->total_s = now_s() - t0;
    return rc;
}

/* ---- open / close --------------------------------------------------------------------------- */

int ferry_compat_group_open(ferry_store *s, const ferry_compat_config *cfg,
                            ferry_compat_group **out, ferry_error *err)
{
    if (!s || !cfg || !out || cfg->world == 0 || cfg->rank >= cfg->world || !cfg->model[0] ||
        strchr(cfg->model, '/') || !cfg->group[0] || strchr(cfg->group, '/'))
        return fr_rl_fail(err, FERRY_EINVAL, "compat: bad arguments (model, group, rank, world)");
    ferry_compat_group *g = calloc(1, sizeof *g);
    if (!g)
        return fr_rl_fail(err, FERRY_ENOMEM, "compat: out of memory");
    g->s = s;
    g->cfg = *cfg;
    if (!g->cfg.staging_bytes)
        g->cfg.staging_bytes = STAGING_DEFAULT;
    g->e = ferry_store_engine(s);
    g->mates = calloc(cfg->world, sizeof *g->mates);
    int rc = g->mates ? ferry_mem_alloc(g->e, (size_t)g->cfg.staging_bytes, (void **)&g->staging)
                      : FERRY_ENOMEM;
    if (rc < 0) {
        g->staging = NULL;
        fr_rl_fail(err, rc, "compat: cannot allocate %" PRIu64 " bytes of staging: %s",
                   g->cfg.staging_bytes, ferry_strerror(rc));
        goto fail;
    }
    /* remote-readable too: the workers of my node take my tensors from it
     * through a view (or READ them) */
    rc = ferry_region_register(g->e, g->staging, (size_t)g->cfg.staging_bytes, FERRY_REMOTE_RW,
                               FERRY_MEM_HOST, &g->reg);
    int dl = rc == 0 ? ferry_region_export(g->reg, g->desc, sizeof g->desc) : rc;
    if (dl < 0) {
        rc = dl;
        fr_rl_fail(err, rc, "compat: cannot register the staging buffer: %s", ferry_strerror(rc));
        goto fail;
    }
    g->desc_len = (uint32_t)dl;
    *out = g;
    return 0;
fail:
    ferry_compat_group_close(g);
    return rc;
}

void ferry_compat_group_close(ferry_compat_group *g)
{
    if (!g)
        return;
    if (g->reg)
        (void)ferry_region_unregister(g->reg);
    if (g->staging)
        (void)ferry_mem_free(g->e, g->staging);
    for (uint32_t k = 0; g->mates && k < g->cfg.world; k++)
        ferry_remote_unmap(&g->mates[k].view);
    free(g->mates);
    free(g);
}
