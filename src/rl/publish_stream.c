/* Publishing a generation as a stream (weights.h, ferry_publish_stream_*;
 * docs/weights.md, "Streaming publish").
 *
 * Every trainer rank adds the same tensors in the same order — the full
 * tensors a framework's weight generator yields on every rank, as verl's
 * does — and no rank ever holds the model: each tensor is stored, or
 * dropped, as it comes.
 *
 * Who stores a tensor is decided on the spot, the same way on every rank
 * since every rank sees the same sizes in the same order: the rank with
 * the fewest bytes so far (ties: the lower rank), so no rank stores more
 * than the mean plus the largest tensor. The storing rank converts the
 * tensor into its current object, packed exactly as ferry_manifest_pack
 * packs the placement "each tensor whole on its storing rank" (pieces in
 * order, FR_GEN_ALIGN apart, a new object when the next would pass
 * FR_GEN_OBJECT_MAX): so an object is full — and put — before the next
 * one starts, and at most one object (or one tensor larger than that) is
 * in flight per rank. At the end the placement is known; the attempt
 * checks the streamed packing against it, stores the checksums,
 * declaration and manifest, and announces as any publish does (one
 * outcome on every rank). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"
#include "rl/rl_int.h"

typedef struct st_tensor {
    char *name;
    char dtype[16];
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint32_t rank;               /* its storing rank */
} st_tensor;

struct ferry_publish_stream {
    ferry_store *s;
    ferry_publisher_config cfg;
    uint64_t gen;
    st_tensor *t;
    size_t n, cap;
    uint64_t *load;              /* per rank: bytes assigned so far */
    /* this rank's objects */
    uint8_t *buf;                /* the object being filled */
    size_t buf_cap;
    bool staged;                 /* buf is the store client's staging buffer */
    uint64_t obj_bytes;          /* of the object being filled */
    bool open;                   /* an object is being filled */
    fr_pub_streamed sx;
    size_t cap_pieces;
    uint64_t most;               /* the most bytes held at once */
    int failed;                  /* this rank's own failure (0: none) */
    char why[512];
};

static int fail(ferry_publish_stream *ps, ferry_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(ferry_publish_stream *ps, ferry_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!ps->failed) {
        ps->failed = code;
        snprintf(ps->why, sizeof ps->why, "%s", m);
    }
    return fr_fail(err, code, "%s", m);
}

int ferry_publish_stream_begin(ferry_store *s, const ferry_publisher_config *cfg,
                               uint64_t generation, ferry_publish_stream **out, ferry_error *err)
{
    if (out)
        *out = NULL;
    if (!s || !cfg || !out || generation == 0 || cfg->world == 0 || cfg->rank >= cfg->world ||
        !cfg->model[0] || strchr(cfg->model, '/') || !memchr(cfg->model, '\0', sizeof cfg->model) ||
        !FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "publish stream: bad arguments (model, rank, world, "
                       "generation)");
    if (cfg->quant)   /* each tensor is stored as it comes, before a placement exists */
        return fr_fail(err, FERRY_EINVAL, "publish stream: a streamed publish does not "
                       "quantize (the config's quant must be NULL; ferry_publish and "
                       "ferry_publish_shards do)");
    /* Generations only move forward: refused before anything is stored. */
    uint64_t active = 0;
    int rc = fr_rl_active_read(s, cfg->model, &active, NULL, err);
    if (rc < 0 && rc != FERRY_ENOENT)
        return fr_fail(err, rc, "publish stream: cannot read the active generation of %s: %s",
                       cfg->model, fr_why(err, rc));
    if (active >= generation)
        return fr_fail(err, FERRY_EINVAL, "publish stream: generation %" PRIu64 " of %s is "
                       "not newer than the active %" PRIu64, generation, cfg->model, active);
    ferry_publish_stream *ps = calloc(1, sizeof *ps);
    if (ps)
        ps->load = calloc(cfg->world, sizeof *ps->load);
    if (!ps || !ps->load) {
        if (ps)
            free(ps->load);
        free(ps);
        return fr_fail(err, FERRY_ENOMEM, "publish stream: out of memory");
    }
    ps->s = s;
    ps->cfg = *cfg;
    ps->cfg.rank_node = NULL;   /* not kept: the caller's array */
    ps->gen = generation;
    *out = ps;
    return 0;
}

/* Put the object being filled (r<rank>.<k>, under its placement slot). */
static int flush(ferry_publish_stream *ps, ferry_error *err)
{
    if (!ps->open)
        return 0;
    const ferry_publisher_config *c = &ps->cfg;
    uint32_t k = ps->sx.nobjects;
    char key[FR_KEY_MAX], what[16];
    (void)fr_key_gen_object(key, sizeof key, c->model, ps->gen, c->rank, k);
    snprintf(what, sizeof what, "%u", k);
    ferry_replicate_config repl = { .replica_num = 1, .hard_pin = true,
                                    .preferred_segments = &c->segment,
                                    .npreferred = c->segment ? 1 : 0,
                                    .slot = fr_pub_slot(c->model, c->rank, what) };
    ferry_object_desc d = {0};
    uint64_t t0 = fr_now_ns();
    int rc = fr_pub_put(ps->s, key, ps->buf, ps->obj_bytes, &repl, &d, err);
    for (fr_space_wait w = {0}; rc == FERRY_ENOSPC && fr_pub_space_wait(ps->s, c, &w);)
        rc = fr_pub_put(ps->s, key, ps->buf, ps->obj_bytes, &repl, &d, err);
    ps->sx.store_s += (double)(fr_now_ns() - t0) / 1e9;
    if (rc == FERRY_ETIMEDOUT && ps->staged) {   /* the engine may still read it */
        ferry_store_staging_give(ps->s, true);
        ps->buf = NULL, ps->buf_cap = 0, ps->staged = false;
    }
    if (rc < 0)
        return fail(ps, err, rc, "rank %u could not store %" PRIu64 " bytes of its pieces: %s",
                    c->rank, ps->obj_bytes, fr_why(err, rc));
    ps->sx.segment = d.nreplicas ? d.replicas[0].segment : 0;
    if (c->segment && ps->sx.segment != c->segment)
        ps->sx.cross_node_bytes += ps->obj_bytes;
    else if (c->segment)
        ps->sx.local_bytes += ps->obj_bytes;
    ps->sx.nobjects++;
    ps->open = false;
    ps->obj_bytes = 0;
    return 0;
}

/* Room for `need` bytes of the object being filled. */
static int room(ferry_publish_stream *ps, uint64_t need, ferry_error *err)
{
    if (need <= ps->buf_cap)
        return 0;
    if (!ps->staged && !ps->buf) {   /* the client's staging buffer, kept across generations */
        void *b = NULL;
        uint64_t want = need > FR_GEN_OBJECT_MAX ? need : FR_GEN_OBJECT_MAX;
        if (ferry_store_staging_take(ps->s, (size_t)want, &b, NULL) == 0) {
            ps->buf = b, ps->buf_cap = (size_t)want, ps->staged = true;
            return 0;
        }
    }
    /* larger than the staging buffer (one tensor past an object), or it is
     * taken: a buffer of the stream's own */
    uint8_t *nb = malloc((size_t)need);
    if (!nb)
        return fail(ps, err, FERRY_ENOMEM, "rank %u: no memory for %" PRIu64 " bytes",
                    ps->cfg.rank, need);
    if (ps->obj_bytes)
        memcpy(nb, ps->buf, (size_t)ps->obj_bytes);
    if (ps->staged)
        ferry_store_staging_give(ps->s, false);
    else
        free(ps->buf);
    ps->buf = nb, ps->buf_cap = (size_t)need, ps->staged = false;
    return 0;
}

/* n elements of src (dtype sd) into dst as dd, hashed as they are written
 * (*sum: fr_gen_bytes_hash of the bytes written), a cache-sized chunk at a
 * time so that the hash reads them from cache, not memory. */
static void convert_hashed(const void *src, const char *sd, uint8_t *dst, const char *dd,
                           uint64_t n, uint64_t *sum)
{
    const uint64_t chunk = 8192;
    uint32_t is = ferry_dtype_size(sd), os = ferry_dtype_size(dd);
    bool same = strcmp(sd, dd) == 0;
    fr_hasher *h = fr_hasher_new(0);
    for (uint64_t e = 0; e < n; e += chunk) {
        uint64_t k = n - e < chunk ? n - e : chunk;
        if (same)
            memcpy(dst + e * os, (const uint8_t *)src + e * is, (size_t)(k * is));
        else
            (void)ferry_convert((const uint8_t *)src + e * is, sd, dst + e * os, dd, k);
        if (h)
            fr_hasher_update(h, dst + e * os, (size_t)(k * os));
    }
    if (h) {
        fr_hash128_t d = fr_hasher_digest(h);
        memcpy(sum, d.b, sizeof *sum);
        fr_hasher_free(h);
    } else {
        *sum = fr_gen_bytes_hash(dst, (size_t)(n * os));
    }
}

static int check_tensor(ferry_publish_stream *ps, const ferry_weight_tensor *t, uint64_t *elems,
                        ferry_error *err)
{
    const char *od = ps->cfg.out_dtype;
    if (!t->name || !t->name[0] || strpbrk(t->name, "\t\n") ||
        strlen(t->name) >= sizeof ((ferry_weight_entry *)0)->name)
        return fail(ps, err, FERRY_EINVAL, "tensor %zu has no usable name", ps->n);
    if (!t->dtype || ferry_dtype_size(t->dtype) == 0 || t->ndim > FERRY_MAX_DIMS)
        return fail(ps, err, FERRY_EINVAL, "tensor %s: bad dtype or dims", t->name);
    if (od[0] && strcmp(t->dtype, od) != 0 && ferry_convert(NULL, t->dtype, NULL, od, 0) < 0)
        return fail(ps, err, FERRY_EINVAL, "tensor %s: cannot convert %s to %s", t->name,
                    t->dtype, od);
    *elems = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        *elems *= t->shape[d];
    if (*elems && !t->data)
        return fail(ps, err, FERRY_EINVAL, "tensor %s: no data", t->name);
    return 0;
}

int ferry_publish_stream_add(ferry_publish_stream *ps, const ferry_weight_tensor *t,
                             ferry_error *err)
{
    if (!ps || !t)
        return fr_fail(err, FERRY_EINVAL, "publish stream: bad arguments");
    if (ps->failed)   /* said once; end() fails the attempt on every rank */
        return fr_fail(err, ps->failed, "%s", ps->why);
    uint64_t elems = 0;
    int rc = check_tensor(ps, t, &elems, err);
    if (rc < 0)
        return rc;
    const char *od = ps->cfg.out_dtype[0] ? ps->cfg.out_dtype : t->dtype;
    uint64_t bytes = elems * ferry_dtype_size(od);
    /* its storing rank: the fewest bytes so far, ties the lower rank */
    uint32_t r = 0;
    for (uint32_t k = 1; k < ps->cfg.world; k++)
        if (ps->load[k] < ps->load[r])
            r = k;
    ps->load[r] += bytes;
    if (fr_grow((void **)&ps->t, &ps->cap, ps->n + 1, sizeof *ps->t) < 0 ||
        !(ps->t[ps->n].name = strdup(t->name)))
        return fail(ps, err, FERRY_ENOMEM, "publish stream: out of memory");
    st_tensor *e = &ps->t[ps->n++];
    snprintf(e->dtype, sizeof e->dtype, "%s", t->dtype);
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->rank = r;
    if (r != ps->cfg.rank)
        return 0;   /* another rank stores it */
    /* packed as ferry_manifest_pack packs it (manifest_pack.c, place) */
    uint64_t at = ps->open ? (ps->obj_bytes + FR_GEN_ALIGN - 1) / FR_GEN_ALIGN * FR_GEN_ALIGN : 0;
    if (ps->open && at + bytes > FR_GEN_OBJECT_MAX && ps->obj_bytes > 0) {
        if ((rc = flush(ps, err)) < 0)
            return rc;
        at = 0;
    }
    if ((rc = room(ps, at + bytes, err)) < 0)
        return rc;
    if (at > ps->obj_bytes)
        memset(ps->buf + ps->obj_bytes, 0, (size_t)(at - ps->obj_bytes));
    uint64_t t0 = fr_now_ns(), sum = 0;
    convert_hashed(t->data, t->dtype, ps->buf + at, od, elems, &sum);
    if (fr_grow((void **)&ps->sx.sums, &ps->cap_pieces, ps->sx.npieces + 1,
                sizeof *ps->sx.sums) < 0)
        return fail(ps, err, FERRY_ENOMEM, "publish stream: out of memory");
    ferry_packed *np = realloc(ps->sx.at, ps->cap_pieces * sizeof *np);
    if (!np)
        return fail(ps, err, FERRY_ENOMEM, "publish stream: out of memory");
    ps->sx.at = np;
    ps->sx.sums[ps->sx.npieces] = sum;
    ps->sx.at[ps->sx.npieces++] = (ferry_packed){ .rank = r, .object = ps->sx.nobjects,
                                                  .offset = at, .bytes = bytes };
    ps->sx.convert_s += (double)(fr_now_ns() - t0) / 1e9;
    ps->sx.tensors++;
    ps->sx.bytes += bytes;
    ps->open = true;
    ps->obj_bytes = at + bytes;
    if (ps->obj_bytes > ps->most)
        ps->most = ps->obj_bytes;
    return 0;
}

/* The placement the stream made: each tensor whole on its storing rank. */
static int placement_of(const ferry_publish_stream *ps, ferry_manifest **out, ferry_error *err)
{
    int rc = ferry_manifest_create(ps->cfg.world, NULL, 1, out);
    for (size_t i = 0; i < ps->n && rc >= 0; i++) {
        const st_tensor *e = &ps->t[i];
        ferry_tensor_desc d = { .name = e->name, .dtype = e->dtype,
                                .itemsize = ferry_dtype_size(e->dtype), .ndim = e->ndim };
        memcpy(d.shape, e->shape, sizeof d.shape);
        rc = ferry_manifest_add_tensor(*out, &d, err);
        ferry_fragment f = { .tensor = (uint32_t)i, .rank = e->rank };
        memcpy(f.shape, e->shape, sizeof f.shape);
        if (rc >= 0)
            rc = ferry_manifest_add_fragment(*out, &f, err);
    }
    return rc < 0 ? rc : 0;
}

static void stream_free(ferry_publish_stream *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        free(ps->t[i].name);
    free(ps->t);
    free(ps->load);
    if (ps->staged)
        ferry_store_staging_give(ps->s, false);
    else
        free(ps->buf);
    free(ps->sx.sums);
    free(ps->sx.at);
    free(ps);
}

int ferry_publish_stream_end(ferry_publish_stream *ps, ferry_publish_stats *st, ferry_error *err)
{
    ferry_publish_stats local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!ps)
        return fr_fail(err, FERRY_EINVAL, "publish stream: bad arguments");
    ferry_error me = {0};
    if (!ps->failed)
        (void)flush(ps, &me);
    ferry_manifest *pl = NULL;
    int prc = ps->failed ? 0 : placement_of(ps, &pl, &me);
    if (prc < 0)   /* e.g. a tensor named twice */
        fail(ps, &me, prc, "rank %u: %s", ps->cfg.rank, me.msg);
    if (ps->failed) {
        /* my own failure: the attempt fails on every rank, so nothing of
         * mine can be announced — my objects go now */
        char key[FR_KEY_MAX];
        for (uint32_t k = 0; k <= ps->sx.nobjects; k++)
            if (fr_key_gen_object(key, sizeof key, ps->cfg.model, ps->gen, ps->cfg.rank, k) > 0)
                (void)ferry_store_remove(ps->s, key, NULL);
    }
    uint32_t node0 = 0;
    ferry_publisher_config c = ps->cfg;
    c.rank_node = &node0;   /* unused: the stream chose the storing ranks */
    int rc = fr_rl_publish_streamed(ps->s, &c, ps->gen, pl, &ps->sx,
                                    ps->failed ? ps->why : NULL, st, err);
    ferry_manifest_close(pl);
    stream_free(ps);
    return rc;
}

int ferry_publish_stream_abort(ferry_publish_stream *ps, const char *why)
{
    if (!ps)
        return FERRY_EINVAL;
    ferry_error e = {0};
    fail(ps, &e, FERRY_EINVAL, "rank %u: %s", ps->cfg.rank, why && *why ? why : "it gave up");
    return 0;
}

uint64_t ferry_publish_stream_held(const ferry_publish_stream *ps)
{
    return ps ? ps->most : 0;
}
