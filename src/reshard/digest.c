/* Manifest and topology digests (XXH3-128 of a canonical little-endian
 * encoding, docs/manifest.md) and the plan cache keyed by them. */
#include <pthread.h>
#include <string.h>

#include "reshard/reshard_int.h"

/* Encoding goes through a buffer so the streaming hasher sees large
 * updates, not one call per field. */
typedef struct enc {
    fr_hasher *h;
    uint8_t buf[1 << 14];
    size_t n;
} enc;

static void enc_bytes(enc *e, const void *p, size_t len)
{
    if (e->n + len > sizeof e->buf) {
        fr_hasher_update(e->h, e->buf, e->n);
        e->n = 0;
        if (len > sizeof e->buf) {
            fr_hasher_update(e->h, p, len);
            return;
        }
    }
    memcpy(e->buf + e->n, p, len);
    e->n += len;
}

static void enc_u64(enc *e, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    enc_bytes(e, b, 8);
}

static void enc_str(enc *e, const char *s)
{
    size_t n = strlen(s);
    enc_u64(e, n);
    enc_bytes(e, s, n);
}

static void enc_done(enc *e, uint8_t out[16])
{
    fr_hasher_update(e->h, e->buf, e->n);
    fr_hash128_t d = fr_hasher_digest(e->h);
    memcpy(out, d.b, 16);
    fr_hasher_free(e->h);
    e->h = NULL;
}

static int enc_init(enc *e, const char *magic)
{
    e->n = 0;
    e->h = fr_hasher_new(0);
    if (!e->h)
        return FERRY_ENOMEM;
    enc_str(e, magic);
    return 0;
}

/* Every group is encoded the same whether it was added as a fragment or
 * as a split: a fragment is a split of one piece. */
static void enc_group(enc *e, const ferry_manifest *m, const fr_group *g)
{
    enc_u64(e, g->tensor);
    enc_u64(e, g->ndim);
    for (uint32_t d = 0; d < g->ndim; d++) {
        enc_u64(e, G_OFF(m, g)[d]);
        enc_u64(e, G_EXT(m, g)[d]);
        enc_u64(e, G_CHUNK(m, g)[d]);
        enc_u64(e, G_RSTRIDE(m, g)[d]);
    }
    enc_u64(e, g->rank);
    enc_u64(e, g->replicas);
    enc_u64(e, g->replica_stride);
    enc_u64(e, g->replica);
    enc_u64(e, g->has_strides);
    if (g->has_strides)
        for (uint32_t d = 0; d < g->ndim; d++)
            enc_u64(e, G_STRIDES(m, g)[d]);
    enc_u64(e, g->storage_offset);
    if (g->object >= 0) {
        enc_u64(e, 1);
        enc_str(e, m->objects[g->object]);
        enc_u64(e, g->object_offset);
    } else {
        enc_u64(e, 0);
    }
}

int ferry_manifest_digest(ferry_manifest *m, uint8_t out[16])
{
    if (!m || !out)
        return FERRY_EINVAL;
    if (m->digest_valid) {
        memcpy(out, m->digest, 16);
        return 0;
    }
    enc *e = fr_malloc(sizeof *e);
    if (!e || enc_init(e, "ferry.manifest.v1") < 0) {
        fr_free(e);
        return FERRY_ENOMEM;
    }
    enc_u64(e, m->ntensors);
    for (size_t i = 0; i < m->ntensors; i++) {
        const fr_tensor *t = &m->tensors[i];
        enc_str(e, t->name);
        enc_str(e, t->dtype);
        enc_u64(e, t->itemsize);
        enc_u64(e, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            enc_u64(e, t->shape[d]);
    }
    enc_u64(e, m->ngroups);
    for (size_t g = 0; g < m->ngroups; g++)
        enc_group(e, m, &m->groups[g]);
    /* block quantization, only where there is some: the digests of
     * manifests without it stay what they were */
    for (size_t i = 0; i < m->ntensors; i++) {
        const fr_tensor *t = &m->tensors[i];
        if (!t->qrole)
            continue;
        enc_str(e, "quant");
        enc_u64(e, i);
        enc_u64(e, t->qrole);
        enc_u64(e, t->qpartner);
        enc_u64(e, t->qblock[0]);
        enc_u64(e, t->qblock[1]);
        enc_u64(e, t->qformat);
        enc_str(e, t->qdtype);
        if (t->qcut)   /* a source layout whose shards may cut blocks */
            enc_str(e, "cut");
    }
    enc_done(e, m->digest);
    fr_free(e);
    m->digest_valid = true;
    memcpy(out, m->digest, 16);
    return 0;
}

static void enc_topology(enc *e, const ferry_manifest *m)
{
    enc_u64(e, m->nranks);
    for (uint32_t r = 0; r < m->nranks; r++)
        enc_u64(e, m->nodes[r]);
}

int ferry_manifest_topology_digest(const ferry_manifest *m, uint8_t out[16])
{
    if (!m || !out)
        return FERRY_EINVAL;
    enc *e = fr_malloc(sizeof *e);
    if (!e || enc_init(e, "ferry.topology.v1") < 0) {
        fr_free(e);
        return FERRY_ENOMEM;
    }
    enc_topology(e, m);
    enc_done(e, out);
    fr_free(e);
    return 0;
}

int fr_topology_pair_digest(const ferry_manifest *a, const ferry_manifest *b, uint8_t out[16])
{
    enc *e = fr_malloc(sizeof *e);
    if (!e || enc_init(e, "ferry.topology.pair.v1") < 0) {
        fr_free(e);
        return FERRY_ENOMEM;
    }
    enc_topology(e, a);
    enc_topology(e, b);
    enc_done(e, out);
    fr_free(e);
    return 0;
}

void ferry_digest_hex(const uint8_t d[16], char out[33])
{
    static const char x[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = x[d[i] >> 4];
        out[2 * i + 1] = x[d[i] & 15];
    }
    out[32] = 0;
}

/* ---- plan cache --------------------------------------------------------- */

typedef struct cache_entry {
    uint8_t key[48];
    ferry_plan *plan;
    uint64_t used;       /* LRU clock */
} cache_entry;

struct ferry_plan_cache {
    pthread_mutex_t mu;
    cache_entry *v;
    size_t n, cap;
    uint64_t clock;
};

int ferry_plan_cache_create(size_t capacity, ferry_plan_cache **out)
{
    if (!out || capacity == 0)
        return FERRY_EINVAL;
    ferry_plan_cache *c = fr_calloc(1, sizeof *c);
    if (!c)
        return FERRY_ENOMEM;
    c->v = fr_calloc(capacity, sizeof *c->v);
    if (!c->v) {
        fr_free(c);
        return FERRY_ENOMEM;
    }
    c->cap = capacity;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return 0;
}

void ferry_plan_cache_free(ferry_plan_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        ferry_plan_free(c->v[i].plan);
    pthread_mutex_destroy(&c->mu);
    fr_free(c->v);
    fr_free(c);
}

size_t ferry_plan_cache_size(ferry_plan_cache *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static int cache_key(ferry_manifest *src, ferry_manifest *dst, uint8_t key[48])
{
    int rc = ferry_manifest_digest(src, key);
    if (rc == 0)
        rc = ferry_manifest_digest(dst, key + 16);
    if (rc == 0)
        rc = fr_topology_pair_digest(src, dst, key + 32);
    return rc;
}

int ferry_plan_cache_get(ferry_plan_cache *c, ferry_manifest *src, ferry_manifest *dst,
                         const ferry_plan_options *opt, ferry_plan **out, bool *hit,
                         ferry_error *err)
{
    if (!c || !src || !dst || !out)
        return fr_fail(err, FERRY_EINVAL, "null argument");
    if (hit)
        *hit = false;
    uint8_t key[48];
    int rc = cache_key(src, dst, key);
    if (rc < 0)
        return fr_fail(err, rc, "digest: %s", ferry_strerror(rc));
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++) {
        if (memcmp(c->v[i].key, key, sizeof key))
            continue;
        ferry_plan *p = c->v[i].plan;
        c->v[i].used = ++c->clock;
        fr_plan_ref(p);
        pthread_mutex_unlock(&c->mu);
        rc = fr_plan_check_limits(p, opt, err);
        if (rc < 0) {
            ferry_plan_free(p);
            return rc;
        }
        if (hit)
            *hit = true;
        *out = p;
        return 0;
    }
    pthread_mutex_unlock(&c->mu);

    /* Plan outside the lock: two threads missing on one key both plan, and
     * the second insert finds the first and keeps it. */
    ferry_plan *p;
    rc = ferry_plan_create(src, dst, opt, &p, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++) {
        if (!memcmp(c->v[i].key, key, sizeof key)) {
            ferry_plan_free(p);
            p = c->v[i].plan;
            fr_plan_ref(p);
            c->v[i].used = ++c->clock;
            pthread_mutex_unlock(&c->mu);
            *out = p;
            return 0;
        }
    }
    size_t slot = c->n;
    if (c->n == c->cap) {
        slot = 0;
        for (size_t i = 1; i < c->n; i++)
            if (c->v[i].used < c->v[slot].used)
                slot = i;
        ferry_plan_free(c->v[slot].plan);
    } else {
        c->n++;
    }
    memcpy(c->v[slot].key, key, sizeof key);
    c->v[slot].plan = p;
    c->v[slot].used = ++c->clock;
    fr_plan_ref(p);
    pthread_mutex_unlock(&c->mu);
    *out = p;
    return 0;
}
