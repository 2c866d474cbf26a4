/* Compatibility mode through single-pull (weights_compat.h): every worker
 * of a rollout group gets every full tensor; the store serves each byte
 * once.
 *
 * Compatibility mode is the group update (pull.c) with whole-tensor
 * targets: every worker's shards are whole tensors in its staging buffer,
 * so every tensor is a replica set held by the whole group, read once by
 * the reader the group update's assignment picks (readers.c, balanced over
 * all batches), and pushed by it to the rest — once to each other node,
 * then forwarded there. What compat adds is the staging and the loader.
 *
 * An update: prepare (manifest, a share of the objects leased by each
 * worker, the staging size) → one KV record per worker ("verdict": ok or
 * why not, its node, staging size and region descriptor, a nonce) →
 * barrier → every record read: one failure fails everyone before anything
 * moves. Then the layout: tensors in manifest order cut into batches that
 * fit in half of the smallest staging (batch k in half k % 2; the whole
 * buffer when a tensor needs more than half), every tensor at the same
 * offset in every staging. Each batch is a subscriber (one per batch,
 * kept while the layout stays, so each batch's plan is reused across
 * generations) over the staging the group registered once, and each
 * update runs one round of each (fr_sub_round_given) with compat's hooks
 * (pull_int.h, fr_sub_hooks): a tensor is checked against its checksum
 * once on every node, by whoever brings it there (its reader after the
 * store read, a forwarder before it forwards, else the worker it landed
 * in from another node); a worker of the sender's node over shm gets no
 * WRITE but a VIEW count, and takes the tensor through a read-only view of
 * the sender's staging (ferry_remote_map; a READ when no view can be made).
 *
 * The rounds run on a helper thread, the loader on the caller's: the
 * caller hands batch k to the loader while batch k+1 moves. Round k begins
 * once this worker loaded batch k - slots, and its exchange barrier is
 * where the group meets, so no half is written before every worker is
 * done with the batch it held. A worker that fails tells the group in the
 * next round's exchange (a failure record: everyone stops there) or, after
 * the last round, at the final barrier; a cause of its own (not a FAILED
 * it was told, nor another worker's record) it first posts under the
 * attempt's abort key, and whoever only heard that something failed reads
 * the cause there once it stops. A round whose barrier timed out was
 * passed by nobody: the group stops there without another meeting.
 *
 * Record (little-endian): "FRYCOMP2", u64 generation, u32 rank, u32 node,
 * i32 verdict, u32 pad, u64 nonce, u64 staging bytes, u32 desc length,
 * u32 message length, u64 local segment (not read back: each batch's demand
 * record carries it to the group update's planner), desc, message. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "ferry/weights_compat.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/pull_int.h"
#include "rl/rl_int.h"

#define MAGIC "FRYCOMP2"
#define HDR 64
#define SLOT_ALIGN 64ull
/* In a group over several nodes a worker's reads go in batches of about
 * one block (the subscriber's batch_bytes), so that a block's pushes leave
 * while the next one is read: the NICs' in and out overlap. */
#define SPREAD_BATCH FR_COMPAT_BLOCK

typedef struct mate {
    uint32_t node;              /* as passed */
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
    bool *view;                 /* per worker: it takes my tensors through a view (mates[].shm) */
    /* One group update per batch of the layout (keyed lkey), kept across
     * generations of the same layout so that their plans are reused. */
    struct ferry_subscriber **subs;
    struct bctx *bctx;
    size_t nsubs;
    uint64_t lkey;
    bool *checked;              /* this update: per tensor, checked on its way here */
    bool node_checker;          /* this update: the lowest rank of my node, which checks
                                 * the tensors cut into blocks for it (assemble) */
    struct run *run;            /* this update */
};

static double now_s(void) { return (double)fr_now_ns() / 1e9; }
static uint64_t tmo_of(const ferry_compat_group *g) { return g->cfg.timeout_ms; }

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
    int rc = fr_rl_active_read(g->s, model, active, NULL, NULL);
    if (rc < 0)
        return fr_fail(err, rc, "no generation of %s is active (%s)", model, ferry_strerror(rc));
    if (*active == g->generation)
        return 0;
    rc = ferry_weights_manifest(g->s, model, *active, m, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < m->n; i++)
        if (m->entries[i].bytes > g->cfg.staging_bytes)
            return fr_fail(err, FERRY_EMSGSIZE, "tensor %s (%" PRIu64 " bytes) does not fit in "
                           "the staging buffer of worker %u (%" PRIu64 " bytes)",
                           m->entries[i].name, m->entries[i].bytes, g->cfg.rank,
                           g->cfg.staging_bytes);
    return fr_gen_lease_all(g->s, fr_gen_of(m), err);
}


/* ---- the exchange --------------------------------------------------------------------- */

static void rec_key(const ferry_compat_group *g, uint32_t rank, char *buf, size_t cap)
{
    (void)fr_key_compat_rec(buf, cap, g->cfg.model, g->cfg.group, rank);
}

static int put_record(ferry_compat_group *g, uint64_t gen, int verdict, uint64_t nonce,
                      const char *msg, ferry_error *err)
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
    char key[FR_KEY_MAX];
    rec_key(g, g->cfg.rank, key, sizeof key);
    int rc = ferry_kv_put(g->s, key, b, HDR + g->desc_len + ml, NULL, err);
    free(b);
    return rc;
}

/* Whether v is a well-formed record of worker k; *dl and *ml: the lengths
 * of its descriptor and message. */
static bool record_ok(const ferry_kv_value *v, uint32_t k, uint32_t *dl, uint32_t *ml)
{
    const uint8_t *b = v->val;
    *dl = v->len >= HDR ? get32(b + 48) : 0;
    *ml = v->len >= HDR ? get32(b + 52) : 0;
    return v->len >= HDR && memcmp(b, MAGIC, 8) == 0 && get32(b + 16) == k &&
           *dl <= FERRY_DESC_MAX && (uint64_t)HDR + *dl + *ml == v->len;
}

/* Mate k's node and staging from its record b, and its staging imported
 * unless the same descriptor already is (a restarted worker has another:
 * its old view goes). 1 when imported now, 0 when kept, or the import's
 * error. */
static int mate_take(ferry_compat_group *g, uint32_t k, const uint8_t *b, uint32_t dl,
                     ferry_error *err)
{
    mate *mt = &g->mates[k];
    mt->node = get32(b + 20);
    mt->staging = get64(b + 40);
    if (k == g->cfg.rank || (mt->imported && mt->desc_len == dl && !memcmp(mt->desc, b + HDR, dl)))
        return 0;
    mt->imported = false;
    ferry_remote_unmap(&mt->view);
    mt->view_rc = 0;
    int rc = ferry_region_import(g->e, b + HDR, dl, &mt->rr, err);
    if (rc < 0)
        return rc;
    memcpy(mt->desc, b + HDR, dl);
    mt->desc_len = dl;
    mt->imported = true;
    return 1;
}

/* Read every record: the group's verdict, the mates' nodes and regions,
 * the attempt's id. */
static int read_records(ferry_compat_group *g, uint64_t gen, uint64_t *id, uint32_t *imported,
                        ferry_error *err)
{
    uint32_t world = g->cfg.world;
    fr_hasher *h = fr_hasher_new(0x77636f6d);
    if (!h)
        return fr_fail(err, FERRY_ENOMEM, "compat: out of memory");
    int rc = 0;
    for (uint32_t k = 0; k < world && rc == 0; k++) {
        char key[FR_KEY_MAX];
        ferry_kv_value v = {0};
        rec_key(g, k, key, sizeof key);
        rc = ferry_kv_get(g->s, key, &v, NULL);
        if (rc < 0) {
            fr_fail(err, rc, "compat: worker %u left no record", k);
            break;
        }
        const uint8_t *b = v.val;
        uint32_t dl, ml;
        if (!record_ok(&v, k, &dl, &ml)) {
            rc = fr_fail(err, FERRY_EPROTO, "compat: the record of worker %u is malformed", k);
        } else if ((int32_t)get32(b + 24) < 0) {
            int code = (int32_t)get32(b + 24);
            rc = fr_fail(err, code, "worker %u: %.*s", k, (int)(ml > 400 ? 400 : ml),
                         (const char *)b + HDR + dl);
        } else if (get64(b + 8) != gen) {
            rc = fr_fail(err, FERRY_ESTATE, "compat: worker %u is updating to generation %" PRIu64
                         ", this one to %" PRIu64 "; retry", k, get64(b + 8), gen);
        } else {
            fr_hasher_update(h, b + 32, 8);
            int took = mate_take(g, k, b, dl, err);
            if (took < 0)
                rc = fr_fail(err, took, "compat: cannot reach worker %u: %s", k, err ? err->msg : "");
            else
                *imported += (uint32_t)took;
        }
        ferry_store_free(v.val);
    }
    fr_hash128_t d = fr_hasher_digest(h);
    fr_hasher_free(h);
    memcpy(id, d.b, sizeof *id);
    return rc;
}

typedef struct run run;
typedef struct bctx { struct ferry_compat_group *g; size_t k; } bctx;
static int verify_hook(void *ctx, uint32_t shard, ferry_error *err);

/* ---- the layout ------------------------------------------------------------------------ */

/* Batches: tensors in manifest order, each at a 64-byte aligned offset,
 * as many as fit in one half of the smallest staging buffer of the group,
 * batch k in half k % 2 (so that batch k+1 can move while batch k is
 * loaded); when the largest tensor needs more than half, in the whole
 * buffer, one batch at a time. */
typedef struct layout {
    uint64_t *off;            /* per tensor: its place in every staging buffer */
    size_t *bstart;           /* batch k: tensors [bstart[k], bstart[k+1]) */
    size_t nbatches;
    uint32_t slots;
    /* The subscribers' shards: tensor t is shards [tshard[t], tshard[t+1])
     * (global indices; batch k's shard i is tshard[bstart[k]] + i), blocks
     * of brows[t] rows (fr_rl_compat_block_rows; one shard, the whole
     * tensor, in a group on one node); stensor: each shard's tensor. */
    size_t *tshard;
    uint64_t *brows;
    uint32_t *stensor;
    bool spread;              /* the group spans several nodes: large tensors are cut */
} layout;

static void layout_free(layout *l)
{
    free(l->off), free(l->bstart), free(l->tshard), free(l->brows), free(l->stensor);
}

static uint64_t rows_of(const ferry_weight_entry *e) { return e->ndim ? e->shape[0] : 1; }
static uint64_t row_bytes_of(const ferry_weight_entry *e)
{
    uint64_t rows = rows_of(e);
    return rows ? e->bytes / rows : 0;
}

uint64_t fr_rl_compat_block_rows(uint64_t rows, uint64_t row_bytes)
{
    if (rows < 2 || row_bytes == 0 || row_bytes > FR_COMPAT_BLOCK / 2 ||
        rows <= FR_COMPAT_BLOCK / row_bytes)
        return rows;
    uint64_t per = FR_COMPAT_BLOCK / row_bytes;
    if (per >= FR_COMPAT_BLOCK_ALIGN)
        per -= per % FR_COMPAT_BLOCK_ALIGN;
    else if (rows > FR_COMPAT_BLOCK_ALIGN)
        per = FR_COMPAT_BLOCK_ALIGN;   /* wide rows: a larger block, never a cut FP8 block */
    return per < rows ? per : rows;
}

/* The shards of every tensor (layout.tshard): one per tensor, or, in a
 * group over several nodes, one per block of rows. */
static int make_shards(const ferry_weight_manifest *m, layout *p)
{
    size_t n = m->n, ns = 0;
    p->tshard = malloc((n + 1) * sizeof *p->tshard);
    p->brows = malloc((n ? n : 1) * sizeof *p->brows);
    if (!p->tshard || !p->brows)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const ferry_weight_entry *e = &m->entries[i];
        uint64_t rows = rows_of(e);
        p->brows[i] = p->spread ? fr_rl_compat_block_rows(rows, row_bytes_of(e)) : rows;
        p->tshard[i] = ns;
        ns += p->brows[i] && rows > p->brows[i] ? (rows + p->brows[i] - 1) / p->brows[i] : 1;
    }
    p->tshard[n] = ns;
    p->stensor = malloc((ns ? ns : 1) * sizeof *p->stensor);
    if (!p->stensor)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < n; i++)
        for (size_t s = p->tshard[i]; s < p->tshard[i + 1]; s++)
            p->stensor[s] = (uint32_t)i;
    return 0;
}

static int make_layout(const ferry_compat_group *g, const ferry_weight_manifest *m, layout *p)
{
    size_t n = m->n;
    uint64_t cap = UINT64_MAX, largest = 0;
    for (uint32_t k = 0; k < g->cfg.world; k++) {
        cap = g->mates[k].staging < cap ? g->mates[k].staging : cap;
        p->spread |= g->mates[k].node != g->mates[0].node;
    }
    p->off = malloc((n ? n : 1) * sizeof *p->off);
    p->bstart = malloc((n + 1) * sizeof *p->bstart);
    if (!p->off || !p->bstart || make_shards(m, p) < 0)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < n; i++)
        largest = m->entries[i].bytes > largest ? m->entries[i].bytes : largest;
    uint64_t half = (cap / 2) & ~(SLOT_ALIGN - 1);
    p->slots = largest <= half ? 2 : 1;
    uint64_t room = p->slots == 2 ? half : cap, at = 0;
    p->nbatches = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t o = (at + SLOT_ALIGN - 1) & ~(SLOT_ALIGN - 1);
        if (i == 0 || o + m->entries[i].bytes > room) {
            p->bstart[p->nbatches++] = i;
            o = 0;
        }
        at = o + m->entries[i].bytes;
        p->off[i] = o + (p->slots == 2 && p->nbatches % 2 == 0 ? half : 0);
    }
    p->bstart[p->nbatches] = n;
    return 0;
}

/* The digest of a layout and the tensors in it: the batches' subscribers
 * (their shards) are kept while it stays. */
static uint64_t layout_key(const ferry_weight_manifest *m, const layout *p, uint32_t world)
{
    uint64_t h = fr_hash64(&world, sizeof world, p->nbatches ^ (uint64_t)p->spread << 63);
    for (size_t i = 0; i < m->n; i++) {
        const ferry_weight_entry *e = &m->entries[i];
        h = fr_hash64(e->name, strlen(e->name), h);
        h = fr_hash64(e->shape, e->ndim * sizeof *e->shape, h ^ e->ndim);
        h = fr_hash64(e->dtype, strlen(e->dtype), h);
        h = fr_hash64(&p->off[i], sizeof p->off[i], h);
    }
    return h;
}

/* ---- the batches: one group update each ---------------------------------------------- */

/* Batch k's subscriber: its shards are the batch's tensors, whole, at
 * their places in this worker's staging. */
static int open_batch(ferry_compat_group *g, const ferry_weight_manifest *m, const layout *p,
                      size_t k, ferry_error *err)
{
    size_t a = p->tshard[p->bstart[k]], n = p->tshard[p->bstart[k + 1]] - a;
    ferry_param_shard *sh = calloc(n ? n : 1, sizeof *sh);
    if (!sh)
        return fr_fail(err, FERRY_ENOMEM, "compat: out of memory");
    for (size_t i = 0; i < n; i++) {
        size_t t = p->stensor[a + i];
        const ferry_weight_entry *e = &m->entries[t];
        ferry_param_shard *s = &sh[i];
        s->tensor = e->name;
        s->ndim = e->ndim;
        int64_t stride = 1;
        for (uint32_t d = e->ndim; d-- > 0;) {
            s->shape[d] = e->shape[d];
            s->strides[d] = stride;
            stride *= (int64_t)e->shape[d];
        }
        /* block j of the tensor: rows [j * brows, ...) at their place */
        uint64_t r0 = (a + i - p->tshard[t]) * p->brows[t], rb = row_bytes_of(e);
        if (e->ndim && p->tshard[t + 1] - p->tshard[t] > 1) {
            s->offset[0] = r0;
            s->shape[0] = e->shape[0] - r0 < p->brows[t] ? e->shape[0] - r0 : p->brows[t];
        }
        s->dst = g->staging + p->off[t] + r0 * rb;
        s->dst_bytes = e->ndim ? s->shape[0] * rb : e->bytes;
    }
    ferry_subscriber_config sc = { .rank = g->cfg.rank, .world = g->cfg.world,
                                   .timeout_ms = tmo_of(g), .node = g->cfg.node,
                                   .local_segment = g->cfg.local_segment,
                                   .batch_bytes = p->spread ? SPREAD_BATCH : 0 };
    snprintf(sc.model, sizeof sc.model, "%s", g->cfg.model);
    snprintf(sc.group, sizeof sc.group, "%s", g->cfg.group);
    int rc = ferry_subscriber_open(g->s, &sc, sh, n, &g->subs[k], err);
    free(sh);
    if (rc < 0)
        return rc;
    char scope[96];
    snprintf(scope, sizeof scope, "%s/compat%zu", g->cfg.group, k);
    fr_subscriber_set_scope(g->subs[k], scope);
    g->bctx[k] = (bctx){ g, k };
    fr_sub_hooks h = { .region = g->reg, .view = g->view, .verify = verify_hook,
                       .ctx = &g->bctx[k] };
    fr_subscriber_set_hooks(g->subs[k], &h);
    fr_subscriber_set_whole(g->subs[k]);
    return 0;
}

static void close_batches(ferry_compat_group *g)
{
    for (size_t k = 0; k < g->nsubs; k++)
        ferry_subscriber_close(g->subs[k]);
    free(g->subs), free(g->bctx);
    g->subs = NULL, g->bctx = NULL;
    g->nsubs = 0;
    g->lkey = 0;
}

/* The subscribers of this layout: kept from the last update when it is
 * the same (their plans are reused then), else made anew. */
static int batches_for(ferry_compat_group *g, const ferry_weight_manifest *m, const layout *p,
                       ferry_error *err)
{
    uint64_t key = layout_key(m, p, g->cfg.world);
    if (g->subs && g->lkey == key && g->nsubs == p->nbatches)
        return 0;
    close_batches(g);
    g->subs = calloc(p->nbatches ? p->nbatches : 1, sizeof *g->subs);
    g->bctx = calloc(p->nbatches ? p->nbatches : 1, sizeof *g->bctx);
    if (!g->subs || !g->bctx) {
        close_batches(g);
        return fr_fail(err, FERRY_ENOMEM, "compat: out of memory");
    }
    g->nsubs = p->nbatches;
    for (size_t k = 0; k < p->nbatches; k++) {
        int rc = open_batch(g, m, p, k, err);
        if (rc < 0) {
            close_batches(g);
            return rc;
        }
    }
    g->lkey = key;
    return 0;
}

/* ---- one update: the rounds (a helper thread) and the loader (the caller's) ----------- */

struct run {
    ferry_compat_group *g;
    const ferry_weight_manifest *m;
    const layout *p;
    ferry_compat_stats *st;
    uint64_t id;               /* the attempt (the records' nonces) */
    ferry_exec_stream *xs;     /* READs where no view of a node-mate's staging can be made */
    const uint8_t **src;       /* per tensor: where the loader finds it */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t ready;              /* rounds done (their tensors there and checked) */
    size_t loaded;             /* batches handed to the loader */
    bool stopped;              /* the helper stops: nothing more becomes ready */
    bool main_done;            /* the caller stopped loading */
    int rc;                    /* the helper's first failure (err) */
    ferry_error err;
    bool derived;              /* ... told by another worker, which posts the cause */
    int lrc;                   /* the loader's (lerr) */
    ferry_error lerr;
    bool posted;
    bool early;                /* the helper stopped at a round (the group stops there) */
    uint64_t verify_ns;        /* helper: time spent checking */
};

static void abort_key(const run *r, char *buf, size_t cap)
{
    (void)fr_key_compat_run(buf, cap, r->g->cfg.model, r->g->cfg.group, r->id, "abort");
}

/* A cause of my own, posted for the group (the first one posted wins)
 * before the group can hear of it: those that only hear that something
 * failed read it once they stop. */
static void post_cause(run *r, const char *msg)
{
    if (r->posted)
        return;
    r->posted = true;
    char key[FR_KEY_MAX], why[600];
    abort_key(r, key, sizeof key);
    int n = snprintf(why, sizeof why, "worker %u: %s", r->g->cfg.rank, msg);
    size_t len = (size_t)(n < (int)sizeof why ? n : (int)sizeof why - 1);
    (void)ferry_kv_cas(r->g->s, key, 0, why, len, NULL, NULL);
}

static int verify_hook(void *ctx, uint32_t shard, ferry_error *err)
{
    bctx *b = ctx;
    run *r = b->g->run;
    const layout *p = r->p;
    size_t t = p->stensor[p->tshard[p->bstart[b->k]] + shard];
    if (p->tshard[t + 1] - p->tshard[t] > 1)
        return 0;   /* one block of a tensor cut: checked whole once here (batch_arrived) */
    const ferry_weight_entry *e = &r->m->entries[t];
    uint64_t t0 = fr_now_ns();
    int rc = fr_gen_verify_tensor(b->g->s, fr_gen_of(r->m), e->index,
                                  b->g->staging + r->p->off[t], err);
    r->verify_ns += fr_now_ns() - t0;
    b->g->checked[t] = true;
    if (rc < 0) {
        snprintf(err->msg + strlen(err->msg), sizeof err->msg - strlen(err->msg),
                 "; the loaded weights must be rebuilt");
        post_cause(r, err->msg);   /* before anyone hears FAILED */
    }
    return rc;
}

/* Tensor t came to me from worker `from` through a view of its staging
 * (a worker of my node over shm): a read-only view of that staging, made
 * at its first such tensor and kept while its registration stays, or,
 * when no view can be made, a READ into my own staging. */
static const uint8_t *mate_view(ferry_compat_group *g, uint32_t from)
{
    mate *mt = &g->mates[from];
    if (!mt->view.addr && mt->view_rc == 0) {
        ferry_error why = {0};
        mt->view_rc = ferry_remote_map(g->e, &mt->rr, mt->rr.addr, mt->rr.len, &mt->view, &why);
        if (mt->view_rc < 0)
            FR_WARN("compat", "no view of worker %u's staging (%s): its tensors are READ instead",
                    from, why.msg);
    }
    return mt->view.addr;
}

/* Bytes [off, off + len) of worker from's staging (a node-mate's, where
 * it left them for me) READ into the same place of mine. */
static int read_mate(run *r, const ferry_weight_entry *e, uint32_t from, uint64_t off,
                     uint64_t len, ferry_error *err)
{
    ferry_compat_group *g = r->g;
    const mate *mt = &g->mates[from];
    ferry_op op = { .opcode = FERRY_OP_READ, .local = g->staging + off, .len = len,
                    .peer = mt->rr.peer, .remote_addr = mt->rr.addr + off, .key = mt->rr.key };
    uint64_t id = 0;
    int te = 0;
    int rc = len == 0 ? 0 : ferry_exec_stream_submit(r->xs, &op, 1, &id);
    if (rc == 0 && id && ferry_exec_stream_wait(r->xs, id, true, &te) != FERRY_TICKET_COMPLETED)
        rc = te ? te : FERRY_EIO;
    if (rc < 0) {
        ferry_error se = {0};
        bool said = ferry_exec_stream_error(r->xs, &se) == rc && se.msg[0];
        return fr_fail(err, FERRY_EREBUILD, "compat: reading tensor %s from the staging of "
                       "worker %u failed: %s; the loaded weights must be rebuilt", e->name,
                       from, said ? se.msg : ferry_strerror(rc));
    }
    r->st->bytes_received += len;
    return 0;
}

static int take_view(run *r, size_t t, uint32_t from, ferry_error *err)
{
    const ferry_weight_entry *e = &r->m->entries[t];
    const uint8_t *v = mate_view(r->g, from);
    if (v) {
        r->src[t] = v + r->p->off[t];
        r->st->bytes_viewed += e->bytes;
        return 0;
    }
    return read_mate(r, e, from, r->p->off[t], e->bytes, err);
}

static int verify_arrived(run *r, size_t t, ferry_error *err)
{
    const ferry_weight_entry *e = &r->m->entries[t];
    uint64_t t0 = fr_now_ns();
    int rc = fr_gen_verify_tensor(r->g->s, fr_gen_of(r->m), e->index, r->src[t], err);
    r->verify_ns += fr_now_ns() - t0;
    if (rc < 0) {
        snprintf(err->msg + strlen(err->msg), sizeof err->msg - strlen(err->msg),
                 " as it arrived; the loaded weights must be rebuilt");
        return FERRY_EREBUILD;
    }
    return 0;
}

/* Tensor t of batch k, cut into blocks: each block in my staging, copied
 * from a node-mate's where it left it for me (through its view, or READ),
 * then the whole tensor checked by one worker of the node (its blocks came
 * by several ways and nobody checked it whole on the way; every block
 * came to the node once, so the node's copies are the same bytes). A
 * failed check fails the group (the cause posted): the loaded weights
 * must be rebuilt. */
static int assemble(run *r, size_t k, size_t t, const fr_work *w, ferry_error *err)
{
    ferry_compat_group *g = r->g;
    const layout *p = r->p;
    const ferry_weight_entry *e = &r->m->entries[t];
    uint32_t me = g->cfg.rank;
    size_t base = p->tshard[p->bstart[k]];
    uint64_t rb = row_bytes_of(e), rows = rows_of(e);
    r->src[t] = g->staging + p->off[t];
    for (size_t s = p->tshard[t]; s < p->tshard[t + 1]; s++) {
        uint32_t from = w->src[s - base];
        uint64_t r0 = (s - p->tshard[t]) * p->brows[t];
        uint64_t off = p->off[t] + r0 * rb;
        uint64_t len = (rows - r0 < p->brows[t] ? rows - r0 : p->brows[t]) * rb;
        if (from == me || from >= g->cfg.world)   /* I read it; nothing brings it */
            continue;
        if (!w->hop[0].viewed[from] && !w->hop[1].viewed[from]) {
            r->st->bytes_received += len;
            continue;
        }
        const uint8_t *v = mate_view(g, from);
        if (v) {
            memcpy(g->staging + off, v + off, len);
            r->st->bytes_viewed += len;
            continue;
        }
        int rc = read_mate(r, e, from, off, len, err);
        if (rc < 0)
            return rc;
    }
    return g->node_checker ? verify_arrived(r, t, err) : 0;
}

/* After round k: where each tensor of the batch is for the loader, and a
 * check of what came to my node from another one and was not checked on
 * its way (I forwarded nothing of it). */
static int batch_arrived(run *r, size_t k, const fr_work *w, ferry_error *err)
{
    ferry_compat_group *g = r->g;
    uint32_t me = g->cfg.rank;
    const layout *p = r->p;
    for (size_t t = p->bstart[k]; t < p->bstart[k + 1]; t++) {
        if (p->tshard[t + 1] - p->tshard[t] > 1) {
            int rc = assemble(r, k, t, w, err);
            if (rc < 0)
                return rc;
            continue;
        }
        const ferry_weight_entry *e = &r->m->entries[t];
        uint32_t from = w->src[p->tshard[t] - p->tshard[p->bstart[k]]];
        r->src[t] = g->staging + r->p->off[t];
        if (from == me || from >= g->cfg.world)   /* I read it; nothing brings it (empty) */
            continue;
        if (w->hop[0].viewed[from] || w->hop[1].viewed[from]) {
            int rc = take_view(r, t, from, err);
            if (rc < 0)
                return rc;
            continue;
        }
        r->st->bytes_received += e->bytes;
        if (g->checked[t] || (g->mates[from].node == g->mates[me].node && g->mates[from].shm))
            continue;   /* a copy of bytes checked on this node */
        int rc = verify_arrived(r, t, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The helper's first failure; not derived, its cause is posted. */
static void helper_failed(run *r, int rc, const ferry_error *e, bool derived)
{
    if (r->rc)
        return;
    r->rc = rc;
    r->err = *e;
    r->derived = derived;
    if (!derived)
        post_cause(r, e->msg);
}

/* The rounds, one per batch, on a thread of their own so that the caller
 * loads batch k while batch k+1 moves. Round k begins once this worker
 * loaded batch k - slots (its half is free here) and its exchange barrier
 * is where the group meets: nobody writes into a half before every worker
 * is done with the batch it held. A worker that failed tells the group in
 * the next round's exchange (everyone stops there), or, after the last
 * round, at the final barrier; a barrier that timed out nobody passed. */
static void *rounds(void *arg)
{
    run *r = arg;
    ferry_compat_group *g = r->g;
    const layout *p = r->p;
    for (size_t k = 0; k < p->nbatches; k++) {
        pthread_mutex_lock(&r->mu);
        while (!r->main_done && !r->rc && r->loaded + p->slots < k + 1)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->lrc && !r->rc) {   /* the loader stopped: the group hears it now */
            ferry_error e = r->lerr;
            pthread_mutex_unlock(&r->mu);
            helper_failed(r, r->lrc, &e, false);
            pthread_mutex_lock(&r->mu);
        }
        bool announce = r->rc != 0 || r->main_done;
        pthread_mutex_unlock(&r->mu);
        ferry_update_stats us;
        bool derived = false;
        ferry_error e = {0};
        if (announce) {
            if (r->rc != FERRY_ETIMEDOUT) {   /* after a timed-out barrier nobody goes on */
                ferry_error why = r->rc ? r->err : (ferry_error){ .code = FERRY_EREBUILD };
                why.code = FERRY_EREBUILD;
                (void)fr_sub_round_given(g->subs[k], NULL, r->m->generation, &why, &us,
                                         &derived, &e);
                r->st->barrier_s += us.exchange_s;
            }
            r->early = true;
            break;
        }
        /* the reader assignment balances over all batches, not batch by batch */
        const fr_work *before = k ? fr_subscriber_work(g->subs[k - 1]) : NULL;
        if (before)
            fr_subscriber_seed(g->subs[k], before);
        int rc = fr_sub_round_given(g->subs[k], r->m, r->m->generation, NULL, &us, &derived, &e);
        const fr_work *w = fr_subscriber_work(g->subs[k]);
        ferry_compat_stats *st = r->st;
        st->barrier_s += us.exchange_s;
        st->plan_s += us.plan_s;
        st->read_s += us.read_s;
        st->wait_s += us.forward_s;
        if (w) {
            st->bytes_read += w->my_read;
            st->tensors_led += w->nreads;
            st->bytes_sent_cross += w->wrote_cross;
            st->bytes_sent_intra += w->wrote_intra;
            st->group_bytes_read += w->group_read;
            st->group_cross_bytes += w->sum.pushed_cross;
            st->group_intra_bytes += w->sum.pushed_intra;
            st->nodes = w->nnodes;
        }
        if (rc == 0)
            rc = batch_arrived(r, k, w, &e);
        if (rc < 0) {
            if (rc == FERRY_ETIMEDOUT) {
                char was[sizeof e.msg];
                snprintf(was, sizeof was, "%s", e.msg);
                fr_fail(&e, FERRY_ETIMEDOUT, "compat: the group did not reach batch %zu "
                        "together within %" PRIu64 " ms of this worker arriving (a worker "
                        "died, hung or cannot reach the master): %s; the loaded weights "
                        "must be rebuilt", k, tmo_of(g), was);
            }
            helper_failed(r, rc, &e, derived);
            if (rc == FERRY_ETIMEDOUT) {   /* nobody passed that barrier: nobody goes on */
                r->early = true;
                break;
            }
        }
        if (k > 0 && p->slots == 2)
            st->pipelined_batches++;
        pthread_mutex_lock(&r->mu);
        r->ready = rc == 0 ? k + 1 : r->ready;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&r->mu);
    r->stopped = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* The caller's side: batch by batch, once its round is done, every tensor
 * to the loader in manifest order. */
static void load_all(run *r, ferry_weights_tensor_fn fn, void *ctx)
{
    const layout *p = r->p;
    for (size_t k = 0; k < p->nbatches; k++) {
        pthread_mutex_lock(&r->mu);
        while (r->ready <= k && !r->stopped)
            pthread_cond_wait(&r->cv, &r->mu);
        bool go = r->ready > k;
        pthread_mutex_unlock(&r->mu);
        if (!go)
            break;
        int lrc = 0;
        ferry_error le = {0};
        for (size_t t = p->bstart[k]; t < p->bstart[k + 1] && lrc == 0; t++) {
            const ferry_weight_entry *e = &r->m->entries[t];
            double t1 = now_s();
            int x = fn(ctx, e, r->src[t]);
            r->st->load_s += now_s() - t1;
            if (x != 0) {
                lrc = x;
                snprintf(le.msg, sizeof le.msg, "the loader stopped at tensor %s (%d)", e->name, x);
                le.code = x;
                break;
            }
            r->st->tensors++;
            r->st->bytes += e->bytes;
        }
        pthread_mutex_lock(&r->mu);
        if (lrc) {
            r->lrc = lrc;
            r->lerr = le;
        } else {
            r->loaded = k + 1;
        }
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        if (lrc)
            break;
    }
    pthread_mutex_lock(&r->mu);
    r->main_done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Every batch: the rounds on a helper thread, the loader here; then,
 * unless the group stopped at a round, the final barrier, after which
 * every worker reads the posted cause (if any) and all return the same. */
static int run_update(ferry_compat_group *g, const ferry_weight_manifest *m, const layout *p,
                      uint64_t id, ferry_weights_tensor_fn fn, void *ctx, ferry_compat_stats *st,
                      ferry_error *err)
{
    run r = { .g = g, .m = m, .p = p, .st = st, .id = id };
    r.src = calloc(m->n ? m->n : 1, sizeof *r.src);
    free(g->checked);
    g->checked = calloc(m->n ? m->n : 1, 1);
    ferry_stream_config sc = { .engine = g->e, .timeout_ms = (int)tmo_of(g) };
    if (!r.src || !g->checked || ferry_exec_stream_open(&sc, &r.xs, NULL, NULL) < 0) {
        free(r.src);
        return fr_fail(err, FERRY_ENOMEM, "compat: out of memory");
    }
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    g->run = &r;
    st->staging_slots = p->slots;
    st->batches = (uint32_t)p->nbatches;
    pthread_t th;
    int rc = pthread_create(&th, NULL, rounds, &r);
    if (rc != 0) {
        rc = fr_fail(err, FERRY_ENOMEM, "compat: cannot start a thread: %s", strerror(rc));
    } else {
        load_all(&r, fn, ctx);
        pthread_join(th, NULL);
        if (r.lrc && !r.rc)   /* failed at the last batch: the helper went on already */
            helper_failed(&r, r.lrc, &r.lerr, false);
        /* Stopped at a round (all did), or the final barrier: all meet. */
        if (!r.early) {
            char bar[FR_KEY_MAX], member[32];
            (void)fr_key_compat_run(bar, sizeof bar, g->cfg.model, g->cfg.group, id, "done");
            snprintf(member, sizeof member, "worker %u", g->cfg.rank);
            double t0 = now_s();
            int brc = ferry_barrier(g->s, bar, member, g->cfg.world, tmo_of(g), NULL, NULL);
            st->barrier_s += now_s() - t0;
            if (brc < 0 && r.rc == 0) {
                ferry_error e = {0};
                fr_fail(&e, FERRY_EREBUILD, "compat: the group did not finish batch %zu "
                        "together within %" PRIu64 " ms of this worker arriving (a worker "
                        "died, hung or cannot reach the master): %s; the loaded weights "
                        "must be rebuilt", p->nbatches ? p->nbatches - 1 : 0, tmo_of(g),
                        ferry_strerror(brc));
                helper_failed(&r, FERRY_EREBUILD, &e, false);
            }
        }
        char key[FR_KEY_MAX];
        abort_key(&r, key, sizeof key);
        ferry_kv_value v = {0};
        if (ferry_kv_get(g->s, key, &v, NULL) == 0) {
            if (r.rc == 0 || r.derived) {   /* the cause, for those that only heard of it */
                r.rc = FERRY_EREBUILD;
                snprintf(r.err.msg, sizeof r.err.msg, "%.*s", (int)(v.len > 400 ? 400 : v.len),
                         (const char *)v.val);
            }
            ferry_store_free(v.val);
        }
        /* the worker whose fn stopped it returns fn's code, the others EREBUILD */
        rc = !r.rc ? 0 : r.lrc && r.rc == r.lrc && !r.derived ? r.lrc : FERRY_EREBUILD;
        if (rc && err) {
            *err = r.err;
            err->code = rc;
        }
        for (size_t k = 0; k < p->nbatches; k++)
            fr_subscriber_forget(g->subs[k], m->generation);
    }
    st->verify_s += (double)r.verify_ns / 1e9;
    g->run = NULL;
    (void)ferry_exec_stream_close(r.xs, NULL);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
    free(r.src);
    return rc;
}

static int group_update(ferry_compat_group *g, uint64_t *generation, ferry_weights_tensor_fn fn,
                        void *ctx, ferry_compat_stats *st, ferry_error *err);

int ferry_compat_group_update(ferry_compat_group *g, uint64_t *generation,
                              ferry_weights_tensor_fn fn, void *ctx, ferry_compat_stats *st,
                              ferry_error *err)
{
    ferry_compat_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    uint64_t f0 = fr_minor_faults();
    int rc = group_update(g, generation, fn, ctx, st, err);
    st->faults = fr_minor_faults() - f0;
    return rc;
}

static int group_update(ferry_compat_group *g, uint64_t *generation, ferry_weights_tensor_fn fn,
                        void *ctx, ferry_compat_stats *st, ferry_error *err)
{
    if (err)
        err->msg[0] = 0;
    if (!g || !generation || !fn)
        return fr_fail(err, FERRY_EINVAL, "compat: bad arguments");
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
    int rc = put_record(g, active, verdict, fr_random_u64(), perr.msg, err);
    if (rc < 0)
        fr_fail(err, rc, "compat: cannot record this worker's verdict: %s", fr_why(err, rc));
    char bar[FR_KEY_MAX], member[32];
    (void)fr_key_compat(bar, sizeof bar, g->cfg.model, g->cfg.group, "prepared");
    snprintf(member, sizeof member, "worker %u", g->cfg.rank);
    int brc = ferry_barrier(g->s, bar, member, g->cfg.world, tmo_of(g), NULL, NULL);
    if (rc == 0 && brc < 0)
        rc = fr_fail(err, brc, "compat: not every worker of group %s arrived: %s",
                     g->cfg.group, ferry_strerror(brc));
    uint64_t id = 0;
    if (rc == 0)
        rc = read_records(g, active, &id, &st->imported, err);
    double t2 = now_s();
    st->exchange_s = t2 - t1;
    layout p = {0};
    if (rc == 0 && (rc = make_layout(g, &m, &p)) < 0)
        fr_fail(err, rc, "compat: planning: %s", ferry_strerror(rc));
    if (rc == 0)
        rc = batches_for(g, &m, &p, err);
    double t3 = now_s();
    st->plan_s = t3 - t2;
    if (rc == 0) {
        /* Who takes my tensors through a view of my staging: the workers of
         * my node that I reach over shm (every sender decides for its own
         * targets; a receiver that cannot make the view READs instead). */
        for (uint32_t k = 0; k < g->cfg.world; k++) {
            const char *tp = k == g->cfg.rank ? NULL : ferry_peer_transport(g->e, g->mates[k].rr.peer);
            g->mates[k].shm = tp && !strcmp(tp, "shm") &&
                              g->mates[k].node == g->mates[g->cfg.rank].node;
            g->view[k] = g->mates[k].shm;
        }
        g->node_checker = true;
        for (uint32_t k = 0; k < g->cfg.rank; k++)
            g->node_checker &= g->mates[k].node != g->mates[g->cfg.rank].node;
        rc = run_update(g, &m, &p, id, fn, ctx, st, err);
        st->apply_s = now_s() - t3;
    }
    layout_free(&p);
    if (rc == 0) {
        g->generation = m.generation;
        *generation = m.generation;
        st->generation = m.generation;
    }
    ferry_weight_manifest_free(&m);
    st->total_s = now_s() - t0;
    return rc;
}

/* ---- the warm-up ---------------------------------------------------------------------------- */

/* Worker k's record as a warm-up reads it (any generation: a member may
 * have gone on to an update): its node, and its staging imported as the
 * update would (read_records keeps an import whose descriptor is the same).
 * 1 when there is none, 0, or an error. A warm-up only prepares: what it
 * could not import or map, the update does as without it. */
static int warm_record(ferry_compat_group *g, uint32_t k, ferry_error *err)
{
    char key[FR_KEY_MAX];
    ferry_kv_value v = {0};
    rec_key(g, k, key, sizeof key);
    int rc = ferry_kv_get(g->s, key, &v, NULL);
    if (rc == FERRY_ENOENT)
        return 1;
    if (rc < 0)
        return fr_fail(err, rc, "compat warm-up: cannot read the record of worker %u: %s", k,
                       ferry_strerror(rc));
    uint32_t dl, ml;
    if (!record_ok(&v, k, &dl, &ml)) {
        ferry_store_free(v.val);
        return fr_fail(err, FERRY_EPROTO, "compat warm-up: the record of worker %u is malformed", k);
    }
    ferry_error why = {0};
    if (mate_take(g, k, v.val, dl, &why) < 0)
        /* a record of a process gone (a restarted member's, not yet
         * rewritten): its update imports the new one */
        FR_WARN("compat", "warm-up: worker %u's staging not imported (%s); its first update "
                "does it", k, why.msg);
    ferry_store_free(v.val);
    return rc;
}

int ferry_compat_group_warm(ferry_compat_group *g, uint64_t *bytes, ferry_error *err)
{
    uint64_t none = 0;
    if (!bytes)
        bytes = &none;
    *bytes = 0;
    if (!g)
        return fr_fail(err, FERRY_EINVAL, "compat warm-up: no group");
    int rc = put_record(g, 0, 0, 0, "", err);
    if (rc < 0)
        return fr_fail(err, rc, "compat warm-up: cannot record this worker: %s", fr_why(err, rc));
    /* Every member meets here after leaving its record: the records read
     * after it are this incarnation's, not those a group of the same name
     * left before (a job restarted against the same master). */
    char bar[FR_KEY_MAX], member[32];
    (void)fr_key_compat(bar, sizeof bar, g->cfg.model, g->cfg.group, "warm");
    snprintf(member, sizeof member, "worker %u", g->cfg.rank);
    const uint32_t world = g->cfg.world;
    rc = ferry_barrier(g->s, bar, member, world, tmo_of(g), NULL, NULL);
    if (rc < 0)
        return fr_fail(err, rc, "compat warm-up: not every worker of group %s arrived within %" PRIu64
                       " ms (%s; every member calls ferry_compat_group_warm)", g->cfg.group, tmo_of(g),
                       ferry_strerror(rc));
    for (uint32_t k = 0; k < world && rc == 0; k++)
        if ((rc = warm_record(g, k, err)) == 1)
            rc = fr_fail(err, FERRY_EPROTO, "compat warm-up: worker %u arrived without a record", k);
    /* This worker's own staging, written once through: ferry_mem_alloc
     * populated it, yet on a VM the first write of each page still costs
     * a first touch (a first memcpy at 0.3-0.7 GB/s against 10-15 after
     * one write a page; docs/weights.md, "Warm memory"). A locked add of 0
     * keeps whatever a page holds. */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (rc == 0) {
        for (size_t at = 0; at + 8 <= g->cfg.staging_bytes; at += page)
            (void)__atomic_fetch_add((uint64_t *)(void *)(g->staging + at), 0, __ATOMIC_RELAXED);
        *bytes += g->cfg.staging_bytes;
    }
    /* The views an update takes node-mates' tensors through, made and
     * touched now: each page of a new mapping costs a first touch. */
    const uint32_t me = g->cfg.rank;
    for (uint32_t k = 0; k < world && rc == 0; k++) {
        mate *mt = &g->mates[k];
        const char *tp = k == me || !mt->imported ? NULL : ferry_peer_transport(g->e, mt->rr.peer);
        if (!tp || strcmp(tp, "shm") != 0 || mt->node != g->mates[me].node)
            continue;
        if (!mt->view.addr && mt->view_rc == 0) {
            ferry_error why = {0};
            mt->view_rc = ferry_remote_map(g->e, &mt->rr, mt->rr.addr, mt->rr.len, &mt->view, &why);
            if (mt->view_rc < 0)
                FR_WARN("compat", "no view of worker %u's staging (%s): its tensors are READ instead",
                        k, why.msg);
        }
        if (!mt->view.addr)
            continue;
        const volatile uint8_t *v = mt->view.addr;
        uint64_t sum = 0;
        for (size_t at = 0; at < mt->rr.len; at += page)
            sum += v[at];
        (void)sum;
        *bytes += mt->rr.len;
    }
    return rc;
}

/* ---- open / close --------------------------------------------------------------------------- */

int ferry_compat_group_open(ferry_store *s, const ferry_compat_config *cfg,
                            ferry_compat_group **out, ferry_error *err)
{
    if (!s || !cfg || !out || cfg->world == 0 || cfg->rank >= cfg->world || !cfg->model[0] ||
        strchr(cfg->model, '/') || !cfg->group[0] || strchr(cfg->group, '/'))
        return fr_fail(err, FERRY_EINVAL, "compat: bad arguments (model, group, rank, world)");
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "compat: the config's reserved fields must be zero "
                       "(start from ferry_compat_config_init)");
    ferry_compat_group *g = calloc(1, sizeof *g);
    if (!g)
        return fr_fail(err, FERRY_ENOMEM, "compat: out of memory");
    g->s = s;
    g->cfg = *cfg;
    fr_rl_compat_resolve(&g->cfg);
    g->e = ferry_store_engine(s);
    g->mates = calloc(cfg->world, sizeof *g->mates);
    g->view = calloc(cfg->world, sizeof *g->view);
    int rc = g->mates && g->view
                 ? ferry_mem_alloc(g->e, (size_t)g->cfg.staging_bytes, (void **)&g->staging, err)
                 : fr_fail(err, FERRY_ENOMEM, "out of memory");
    if (rc < 0) {
        g->staging = NULL;
        fr_fail(err, rc, "compat: cannot allocate %" PRIu64 " bytes of staging: %s",
                g->cfg.staging_bytes, err ? err->msg : "");
        goto fail;
    }
    /* remote-readable too: the workers of my node take my tensors from it
     * through a view (or READ them) */
    rc = ferry_region_register(g->e, g->staging, (size_t)g->cfg.staging_bytes, FERRY_REMOTE_RW,
                               FERRY_MEM_HOST, &g->reg, err);
    int dl = rc == 0 ? ferry_region_export(g->reg, g->desc, sizeof g->desc) : rc;
    if (dl < 0) {
        fr_fail(err, dl, "compat: cannot register the staging buffer: %s",
                rc < 0 && err ? err->msg : ferry_strerror(dl));
        rc = dl;
        goto fail;
    }
    g->desc_len = (uint32_t)dl;
    /* This worker's record, so that the others' warm-ups find it however
     * late this one calls its own (best effort: the warm-up writes it again) */
    (void)put_record(g, 0, 0, 0, "", NULL);
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
        (void)ferry_region_unregister(g->reg, NULL);
    if (g->staging)
        (void)ferry_mem_free(g->e, g->staging, NULL);
    close_batches(g);
    for (uint32_t k = 0; g->mates && k < g->cfg.world; k++)
        ferry_remote_unmap(&g->mates[k].view);
    free(g->mates);
    free(g->view);
    free(g->checked);
    free(g);
}
