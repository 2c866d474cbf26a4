/* Demand records of the single-pull group update (pull_int.h), and the
 * plan a member keeps while the records stay the same.
 *
 * Record (little-endian): "FRYDMND4", u64 generation, 16 bytes of digest,
 * u32 rank, u32 shards, u32 node, u32 endpoint length, u64 local segment,
 * the engine's endpoint blob, zeros to a multiple of 8; per shard: u32 tensor (index in the
 * stored placement), u32 ndim, u64 address, u64 registered length, u64
 * remote key, then offset[ndim], shape[ndim], strides[ndim] (u64,
 * elements). A shard is a box, whatever its shape: a TP8 column shard of
 * a [7168, 18432] tensor is 80 bytes, not 7168 rows.
 *
 * The digest is XXH3-128 of everything after it: what the plan depends
 * on. Decoding checks it, so a
 * record whose body does not match its digest is refused; the plan cache
 * keys on the digests alone, so an update whose records all carry the
 * digests of the last plan's hashes 16 bytes per member, not every record
 * (a kimi-k2 EP16 x TP8 group sends 128 records of ~400 KB each). */
#include <arpa/inet.h>
#include <endian.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "rl/pull_int.h"
#include "wire/wire.h"

#define MAGIC "FRYDMND4"
#define HDR 56
#define DIGEST_AT 16
#define BODY 32      /* the digest covers [BODY, len) */

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++, v >>= 8) p[i] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++, v >>= 8) p[i] = (uint8_t)v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return le64toh(v); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return le32toh(v); }

/* The digest of record b (len >= HDR): one pass (XXH3's streaming form
 * is many times slower on these sizes). */
static fr_hash128_t body_digest(const uint8_t *b, size_t len)
{
    return fr_hash128(b + BODY, len - BODY, 0x64656d64);
}

/* ---- records -------------------------------------------------------------------------- */

static bool empty_box(const ferry_param_shard *s)
{
    for (uint32_t k = 0; k < s->ndim && k < FERRY_MAX_DIMS; k++)
        if (s->shape[k] == 0)
            return true;
    return false;
}

/* One shard at p: its tensor checked against g; the bytes written. */
static int put_shard(const fr_gen *g, const ferry_param_shard *s, const ferry_region *reg,
                     uint8_t *p, size_t *wrote, ferry_error *err)
{
    int ti = ferry_manifest_find_tensor(g->m, s->tensor ? s->tensor : "");
    ferry_tensor_desc d;
    if (ti < 0 || ferry_manifest_tensor(g->m, (uint32_t)ti, &d) < 0)
        return fr_fail(err, FERRY_ENOENT, "tensor %s is not in generation %" PRIu64 " of %s",
                       s->tensor ? s->tensor : "(null)", g->generation, g->model);
    if (s->ndim != d.ndim)
        return fr_fail(err, FERRY_EINVAL, "shard of %s has %u dims, the tensor %u", d.name,
                       s->ndim, d.ndim);
    *wrote = 0;
    if (empty_box(s))
        return 0;
    bool strided = false;
    for (uint32_t k = 0; k < d.ndim; k++) {
        if (s->offset[k] > d.shape[k] || s->shape[k] > d.shape[k] - s->offset[k] ||
            s->strides[k] < 0)
            return fr_fail(err, FERRY_ERANGE, "shard of %s: dim %u [%" PRIu64 ", +%" PRIu64
                           ") is empty or outside %" PRIu64, d.name, k, s->offset[k],
                           s->shape[k], d.shape[k]);
        strided |= s->strides[k] != 0;
    }
    put32(p, (uint32_t)ti);
    put32(p + 4, d.ndim);
    put64(p + 8, (uint64_t)(uintptr_t)s->dst);
    put64(p + 16, reg ? ferry_region_len(reg) : 0);
    put64(p + 24, reg ? ferry_region_key(reg) : 0);
    p += 32;
    uint64_t dense = 1;
    for (int k = (int)d.ndim - 1; k >= 0; k--) {
        put64(p + 8 * (size_t)k, s->offset[k]);
        put64(p + 8 * (d.ndim + (size_t)k), s->shape[k]);
        put64(p + 8 * (2 * d.ndim + (size_t)k),
              strided ? (s->strides[k] ? (uint64_t)s->strides[k] : 1) : dense);
        dense *= s->shape[k];
    }
    *wrote = 32 + 24 * (size_t)d.ndim;
    return 0;
}

int fr_sub_encode(const ferry_subscriber_config *cfg, const fr_gen *g,
                  const ferry_param_shard *shards, size_t n, ferry_region *const *regs,
                  ferry_engine *e, uint8_t **out, size_t *len, ferry_error *err)
{
    uint8_t ep[FERRY_DESC_MAX];
    int el = ferry_engine_export(e, ep, sizeof ep);
    if (el < 0)
        return fr_fail(err, el, "subscriber: cannot describe this worker's engine");
    size_t pad = (8 - (size_t)el % 8) % 8;   /* the shards start 8-aligned */
    size_t cap = HDR + (size_t)el + pad;
    uint32_t nonempty = 0;   /* a shard with an empty box holds nothing: left out */
    for (size_t i = 0; i < n; i++) {
        cap += 32 + 24 * (size_t)(shards[i].ndim < FERRY_MAX_DIMS ? shards[i].ndim : FERRY_MAX_DIMS);
        nonempty += !empty_box(&shards[i]);
    }
    uint8_t *b = malloc(cap), *p = b;
    if (!b)
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    memcpy(p, MAGIC, 8);
    put64(p + 8, g->generation);
    put32(p + 32, cfg->rank);
    put32(p + 36, nonempty);
    put32(p + 40, cfg->node);
    put32(p + 44, (uint32_t)el);
    put64(p + 48, cfg->local_segment);
    memcpy(p + HDR, ep, (size_t)el);
    memset(p + HDR + el, 0, pad);
    p += HDR + (size_t)el + pad;
    for (size_t i = 0; i < n; i++) {
        size_t wrote = 0;   /* an empty shard writes nothing, but its tensor is checked */
        int rc = put_shard(g, &shards[i], regs[i], p, &wrote, err);
        if (rc < 0) {
            free(b);
            return rc;
        }
        p += wrote;
    }
    *out = b;
    *len = (size_t)(p - b);
    fr_hash128_t d = body_digest(b, *len);
    memcpy(b + DIGEST_AT, d.b, 16);
    return 0;
}

void fr_member_free(fr_member *mb)
{
    if (!mb)
        return;
    free(mb->owned);
    memset(mb, 0, sizeof *mb);
}

void *fr_sub_map(size_t n, size_t *mapped)
{
    const size_t huge = 2u << 20;
    size_t want = (n + huge - 1) & ~(huge - 1), len = n > huge ? want + huge : (n ? n : 1);
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (n <= huge) {
        *mapped = len;
        return p;
    }
    /* keep [at, at + want) from the first 2 MiB boundary, so that every
     * huge page lies inside; the rest goes back */
    uint8_t *at = (uint8_t *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
    if (at > p)
        munmap(p, (size_t)(at - p));
    if (p + len > at + want)
        munmap(at + want, (size_t)(p + len - (at + want)));
    (void)madvise(at, want, MADV_HUGEPAGE);   /* a hint: without THP, plain pages */
    *mapped = want;
    return at;
}

void fr_sub_unmap(void *p, size_t mapped)
{
    if (p)
        munmap(p, mapped);
}

/* The shards of a record start 8-aligned: where the record is too and
 * the host is little-endian, a shard's dims are read in place. */
static size_t body_at(const uint8_t *b)
{
    return HDR + ((get32(b + 44) + 7) & ~(size_t)7);
}

static bool in_place(const uint8_t *b)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return ((uintptr_t)b & 7) == 0;
#else
    (void)b;
    return false;
#endif
}

/* A well-formed record of ns shards: its dims are what follows the fixed
 * part of each shard. false when the header cannot be right. */
static bool counts(const uint8_t *b, size_t len, uint32_t *ns, size_t *ndims)
{
    if (len < HDR || get32(b + 44) > FERRY_DESC_MAX || len < body_at(b))
        return false;
    size_t body = len - body_at(b);
    *ns = get32(b + 36);
    if ((size_t)*ns > body / 32)
        return false;
    *ndims = (body - 32 * (size_t)*ns) / 8;
    return true;
}

size_t fr_sub_decode_size(const uint8_t *b, size_t len)
{
    uint32_t ns;
    size_t ndims;
    if (!counts(b, len, &ns, &ndims))
        return 0;
    return (size_t)ns * sizeof(fr_sfrag) + (in_place(b) ? 0 : ndims * 8);
}

static int cut_short(ferry_error *err, uint32_t worker)
{
    return fr_fail(err, FERRY_EPROTO, "subscriber: the demand of worker %u is cut short", worker);
}

/* The shards of a record, from p to end: into mb->frags; their dims in
 * place, or copied to copy (NULL: in place). */
static int get_shards(const uint8_t *p, const uint8_t *end, uint32_t worker, const fr_gen *g,
                      uint64_t *copy, fr_member *mb, ferry_error *err)
{
    uint32_t nt = ferry_manifest_tensor_count(g->m);
    for (uint32_t i = 0; i < mb->nshards; i++) {
        if (end - p < 32)
            return cut_short(err, worker);
        fr_sfrag *f = &mb->frags[i];
        *f = (fr_sfrag){ .worker = worker, .shard = i, .tensor = get32(p), .ndim = get32(p + 4),
                         .addr = get64(p + 8), .key = get64(p + 24) };
        ferry_tensor_desc d;
        if (f->tensor >= nt || ferry_manifest_tensor(g->m, f->tensor, &d) < 0 ||
            f->ndim != d.ndim || (size_t)(end - p - 32) < 24 * (size_t)f->ndim)
            return fr_fail(err, FERRY_EPROTO, "subscriber: worker %u names an unknown tensor "
                           "or a bad shard", worker);
        p += 32;
        if (copy) {
            for (uint32_t k = 0; k < 3 * f->ndim; k++)
                copy[k] = get64(p + 8 * k);
            f->dims = copy;
            copy += 3 * f->ndim;
        } else {
            f->dims = (const uint64_t *)(const void *)p;
        }
        for (uint32_t k = 0; k < f->ndim; k++) {
            uint64_t o = f->dims[k], s = f->dims[f->ndim + k];
            if (s == 0 || o > d.shape[k] || s > d.shape[k] - o)
                return fr_fail(err, FERRY_EPROTO, "subscriber: worker %u demands a box outside "
                               "tensor %s", worker, d.name);
        }
        p += 24 * (size_t)f->ndim;
    }
    if (p != end)
        return fr_fail(err, FERRY_EPROTO, "subscriber: the demand of worker %u is malformed",
                       worker);
    return 0;
}

/* Where a member runs, for the errors that name a worker: its node and
 * its engine's address, from the endpoint blob in its record (a worker
 * that cannot be reached is named by the host it is on). */
static void member_where(fr_member *mb, const uint8_t *ep, size_t n)
{
    fr_endpoint e;
    char a[INET6_ADDRSTRLEN];
    if (fr_endpoint_decode(ep, n, &e) == 0 && (e.family == 4 || e.family == 6) &&
        inet_ntop(e.family == 4 ? AF_INET : AF_INET6, e.addr, a, sizeof a))
        snprintf(mb->where, sizeof mb->where, " (node %u at %s:%u)", mb->node, a, e.port);
    else
        snprintf(mb->where, sizeof mb->where, " (node %u)", mb->node);
}

int fr_sub_decode(const uint8_t *b, size_t len, uint32_t worker, uint64_t gen, const fr_gen *g,
                  ferry_engine *e, fr_member *mb, void *space, ferry_error *err)
{
    memset(mb, 0, sizeof *mb);
    if (len < HDR || memcmp(b, MAGIC, 8) != 0 || get32(b + 32) != worker)
        return fr_fail(err, FERRY_EPROTO, "subscriber: the demand of worker %u is malformed",
                       worker);
    if (get64(b + 8) != gen)
        return fr_fail(err, FERRY_ESTATE, "subscriber: worker %u is updating to generation %"
                       PRIu64 ", this one to %" PRIu64 "; retry", worker, get64(b + 8), gen);
    fr_hash128_t d = body_digest(b, len);
    if (memcmp(d.b, b + DIGEST_AT, 16) != 0)
        return fr_fail(err, FERRY_EPROTO, "subscriber: the demand of worker %u does not match "
                       "its digest", worker);
    uint32_t ns;
    size_t ndims;
    if (!counts(b, len, &ns, &ndims))
        return cut_short(err, worker);
    mb->node = get32(b + 40);
    mb->segment = get64(b + 48);
    if (!space && !(space = mb->owned = malloc(fr_sub_decode_size(b, len) + 8)))
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    mb->frags = space;
    mb->nshards = ns;
    mb->peer = worker;
    member_where(mb, b + HDR, get32(b + 44));
    if (e) {
        int rc = ferry_peer_add(e, b + HDR, get32(b + 44), &mb->peer, err);
        if (rc < 0)
            return fr_fail(err, rc, "subscriber: cannot reach worker %u: %s", worker, err ? err->msg : "");
    }
    uint64_t *copy = in_place(b) ? NULL : (uint64_t *)(void *)(mb->frags + ns);
    return get_shards(b + body_at(b), b + len, worker, g, copy, mb, err);
}

/* ---- the plan kept between updates ------------------------------------------------------- */

/* What the plan depends on: the stored placement the reads are planned
 * against (its JSON's hash, checked when the generation was loaded) and
 * every member's record but its generation (the records' digests). */
static fr_hash128_t plan_key(const ferry_kv_value *recs, uint32_t world, const fr_gen *g,
                             uint64_t epoch)
{
    /* one buffer hashed in one pass: per member its length, magic, digest;
     * then the membership epoch */
    uint8_t *b = malloc(28 + 32 * (size_t)world);
    if (!b)
        return (fr_hash128_t){{0}};
    static const uint8_t none[16];
    if (memcmp(g->placement, none, 16) != 0)
        memcpy(b, g->placement, 16);
    else
        (void)ferry_manifest_digest(g->m, b);
    put32(b + 16, world);
    for (uint32_t k = 0; k < world; k++) {
        uint8_t *p = b + 20 + 32 * (size_t)k;
        const uint8_t *r = recs[k].val;
        put64(p, recs[k].len);
        if (recs[k].len >= HDR) {
            memcpy(p + 8, r, 8);
            memcpy(p + 16, r + DIGEST_AT, 16);
        } else {   /* malformed: decoding will say so; keyed apart from any plan */
            memset(p + 8, 0xff, 24);
        }
    }
    put64(b + 20 + 32 * (size_t)world, epoch);
    fr_hash128_t k = fr_hash128(b, 28 + 32 * (size_t)world, 0x66727264);
    free(b);
    return k;
}

static void free_members(fr_sub_cache *c)
{
    for (uint32_t k = 0; c->mbs && k < c->world; k++)
        fr_member_free(&c->mbs[k]);
    free(c->mbs);
    c->mbs = NULL;
}

void fr_sub_cache_free(fr_sub_cache *c)
{
    if (!c)
        return;
    fr_work_free(&c->plan);
    free_members(c);
    fr_sub_unmap(c->arena, c->arena_len);
    for (uint32_t k = 0; c->recs && k < c->world; k++)
        ferry_store_free(c->recs[k].val);
    free(c->recs);
    memset(c, 0, sizeof *c);
}

/* Every record decoded into one mapping: the members' fragments (about
 * 26 MB for a kimi-k2 EP16 x TP8 group), their dims read in place. */
static int decode_all(fr_sub_cache *c, const fr_gen *g, const ferry_kv_value *recs,
                      uint32_t world, uint32_t me, ferry_engine *e, ferry_error *err)
{
    size_t total = 0;
    for (uint32_t k = 0; k < world; k++)
        total += (fr_sub_decode_size(recs[k].val, recs[k].len) + 7) & ~(size_t)7;
    if (!(c->arena = fr_sub_map(total, &c->arena_len)))
        return fr_fail(err, FERRY_ENOMEM, "subscriber: no memory for the group's demand "
                       "(%zu bytes)", total);
    int rc = 0;
    uint8_t *at = c->arena;
    for (uint32_t k = 0; k < world && rc == 0; k++) {
        rc = fr_sub_decode(recs[k].val, recs[k].len, k, g->generation, g, k != me ? e : NULL,
                           &c->mbs[k], at, err);
        at += (fr_sub_decode_size(recs[k].val, recs[k].len) + 7) & ~(size_t)7;
    }
    return rc;
}

int fr_sub_plan_records(fr_sub_cache *c, const fr_gen *g, ferry_kv_value *recs,
                        uint32_t world, uint32_t me, ferry_engine *e, ferry_error *err)
{
    fr_hash128_t key = plan_key(recs, world, g, c->epoch);
    c->reused = c->valid && c->world == world && memcmp(key.b, c->key, sizeof c->key) == 0;
    for (uint32_t k = 0; c->reused && k < world; k++) {   /* the generation the key skips */
        uint64_t gen = recs[k].len >= 16 ? get64((const uint8_t *)recs[k].val + 8) : 0;
        if (gen != g->generation)
            return fr_fail(err, FERRY_ESTATE, "subscriber: worker %u is updating to generation "
                           "%" PRIu64 ", this one to %" PRIu64 "; retry", k, gen, g->generation);
    }
    if (c->reused) {
        fr_work_reset(&c->plan, world);
        return 0;
    }
    bool whole = c->whole;
    fr_rd_seed seed = c->seed;
    fr_sub_cache_free(c);
    c->whole = whole;
    c->seed = seed;
    c->world = world;
    c->mbs = calloc(world, sizeof *c->mbs);
    c->recs = calloc(world, sizeof *c->recs);
    int rc = c->mbs && c->recs ? fr_work_init(&c->plan, world) : FERRY_ENOMEM;
    if (rc < 0)
        return fr_fail(err, rc, "subscriber: out of memory");
    c->plan.whole = c->whole;
    c->plan.seed = c->seed.load ? &c->seed : NULL;
    for (uint32_t k = 0; k < world; k++) {   /* the members point into them */
        c->recs[k] = recs[k];
        recs[k].val = NULL;
        recs[k].len = 0;
    }
    rc = decode_all(c, g, c->recs, world, me, e, err);
    if (rc == 0)
        rc = fr_sub_plan(g, c->mbs, world, me, &c->plan, err);
    c->valid = rc == 0;
    memcpy(c->key, key.b, sizeof c->key);
    return rc;
}
