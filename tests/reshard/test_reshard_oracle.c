/* reshard planner against a brute-force oracle: random tensors (1-5 dims),
 * random tilings cut on random dims, splits with uneven and empty pieces,
 * replicas, strided local storage, store-object bindings, overlapping
 * targets. Every run is executed on tagged byte buffers; every target byte
 * must be written exactly once, from the right source element and byte. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/reshard.h"

#define NRANKS 256

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static uint64_t rndn(uint64_t n) { return n ? rnd() % n : 0; }

typedef struct gbox { uint32_t nd; uint64_t off[5], ext[5]; } gbox;

static const char *dtype_of(uint32_t isz)
{
    return isz == 1 ? "u8" : isz == 2 ? "bf16" : isz == 4 ? "f32" : "f64";
}

/* Random guillotine tiling of b into at most `budget` leaves. */
static size_t tile(const gbox *b, gbox *out, size_t cap, int depth)
{
    uint32_t cut[5], nc = 0;
    for (uint32_t d = 0; d < b->nd; d++)
        if (b->ext[d] > 1)
            cut[nc++] = d;
    if (!nc || depth > 4 || cap < 2 || rndn(3) == 0) {
        if (cap)
            out[0] = *b;
        return cap ? 1 : 0;
    }
    uint32_t d = cut[rndn(nc)];
    uint64_t at = 1 + rndn(b->ext[d] - 1);
    gbox x = *b, y = *b;
    x.ext[d] = at;
    y.off[d] += at;
    y.ext[d] -= at;
    size_t n = tile(&x, out, cap / 2, depth + 1);
    return n + tile(&y, out + n, cap - n, depth + 1);
}

static uint32_t rank_max_ok(void) { return 8; }

/* Add box b as a split (random parts, strides, copies) or as explicit
 * fragments (random strides, storage offsets, object bindings). */
static void add_box(ferry_manifest *m, uint32_t ti, uint32_t isz, const gbox *b, bool source,
                    uint32_t *next_replica, uint64_t *obj_off)
{
    ferry_error err = {0};
    uint32_t copies = 1 + (uint32_t)rndn(3);
    if (rndn(2)) {
        ferry_split s = {.tensor = ti, .rank = (uint32_t)rndn(rank_max_ok())};
        for (uint32_t d = 0; d < b->nd; d++) {
            s.offset[d] = b->off[d];
            s.shape[d] = b->ext[d];
            s.parts[d] = (uint32_t)(1 + rndn(b->ext[d] + 1));
            s.rank_stride[d] = (uint32_t)rndn(4);
        }
        bool one_group = rndn(2);
        s.replicas = one_group ? copies : 1;
        s.replica_stride = (uint32_t)(1 + rndn(5));
        for (uint32_t c = 0; c < (one_group ? 1 : copies); c++) {
            s.replica = *next_replica;
            *next_replica += s.replicas;
            s.rank = (uint32_t)rndn(rank_max_ok());
            assert_int_equal(ferry_manifest_add_split(m, &s, &err), 0);
        }
        return;
    }
    for (uint32_t c = 0; c < copies; c++) {
        ferry_fragment f = {.tensor = ti, .rank = (uint32_t)rndn(NRANKS), .replica = (*next_replica)++};
        uint64_t span = 1;
        for (uint32_t d = 0; d < b->nd; d++) {
            f.offset[d] = b->off[d];
            f.shape[d] = b->ext[d];
        }
        if (rndn(3) == 0) {   /* padded, dims in a random order */
            uint32_t order[5];
            for (uint32_t d = 0; d < b->nd; d++)
                order[d] = d;
            for (uint32_t d = b->nd; d > 1; d--) {
                uint32_t j = (uint32_t)rndn(d), t = order[d - 1];
                order[d - 1] = order[j];
                order[j] = t;
            }
            uint64_t s = 1 + rndn(2);
            for (uint32_t i = 0; i < b->nd; i++) {
                f.strides[order[i]] = s;
                s = s * b->ext[order[i]] + rndn(3);
            }
            f.has_strides = true;
            span = s;
        } else {
            for (uint32_t d = 0; d < b->nd; d++)
                span *= b->ext[d];
        }
        f.storage_offset = rndn(2) ? rndn(3) : 0;
        span += f.storage_offset;
        char key[16];
        if (source && (copies == 1 || rndn(2))) {
            uint32_t o = (uint32_t)rndn(3);
            snprintf(key, sizeof key, "obj%u", o);
            f.rank = 100 + o;   /* an object has one home */
            f.object = key;
            f.object_offset = obj_off[o] + rndn(2) * 8;   /* packed back to back half the time */
            obj_off[o] = f.object_offset + span * isz;
        }
        assert_int_equal(ferry_manifest_add_fragment(m, &f, &err), 0);
    }
}

/* ---- simulated buffers ---------------------------------------------------- */

typedef struct sim {
    ferry_manifest *m;
    uint64_t nbuf;
    uint64_t **buf;     /* per fragment (or per object after nfrags) */
    uint64_t *len;
} sim;

static uint64_t frag_span(const ferry_manifest *m, const ferry_fragment *f)
{
    ferry_tensor_desc t;
    ferry_manifest_tensor(m, f->tensor, &t);
    uint64_t span = 1;
    for (uint32_t d = 0; d < t.ndim; d++)
        span = f->has_strides ? span + (f->shape[d] - 1) * f->strides[d] : span * f->shape[d];
    return (span + f->storage_offset) * t.itemsize;
}

/* Byte position in the local buffer of global element c, byte k. */
static uint64_t local_pos(const ferry_manifest *m, const ferry_fragment *f, const uint64_t *c, uint32_t k)
{
    ferry_tensor_desc t;
    ferry_manifest_tensor(m, f->tensor, &t);
    uint64_t e = f->storage_offset, rs = 1;
    for (int d = (int)t.ndim - 1; d >= 0; d--) {
        uint64_t st = f->has_strides ? f->strides[d] : rs;
        e += (c[d] - f->offset[d]) * st;
        rs *= f->shape[d];
    }
    return e * t.itemsize + k + (f->object ? f->object_offset : 0);
}

static uint64_t tag_of(uint32_t tensor, const ferry_tensor_desc *t, const uint64_t *c, uint32_t k)
{
    uint64_t lin = 0;
    for (uint32_t d = 0; d < t->ndim; d++)
        lin = lin * t->shape[d] + c[d];
    return ((uint64_t)tensor << 40 | lin << 4 | k) + 1;
}

/* Visit every element of fragment f. */
typedef void (*visit_fn)(void *ctx, const ferry_fragment *f, const uint64_t *c);
static void each_element(const ferry_manifest *m, const ferry_fragment *f, visit_fn fn, void *ctx)
{
    ferry_tensor_desc t;
    ferry_manifest_tensor(m, f->tensor, &t);
    uint64_t c[8];
    memcpy(c, f->offset, sizeof c);
    for (;;) {
        fn(ctx, f, c);
        int d = (int)t.ndim - 1;
        for (; d >= 0; d--) {
            if (++c[d] < f->offset[d] + f->shape[d])
                break;
            c[d] = f->offset[d];
        }
        if (d < 0)
            return;
    }
}

typedef struct fill_ctx { sim *s; uint64_t *b; } fill_ctx;

static void fill_elem(void *ctx, const ferry_fragment *f, const uint64_t *c)
{
    fill_ctx *x = ctx;
    ferry_tensor_desc t;
    ferry_manifest_tensor(x->s->m, f->tensor, &t);
    for (uint32_t k = 0; k < t.itemsize; k++)
        x->b[local_pos(x->s->m, f, c, k)] = tag_of(f->tensor, &t, c, k);
}

static void sim_source(sim *s, ferry_manifest *m, const char **objs, size_t nobj)
{
    uint64_t n = ferry_manifest_fragment_count(m);
    s->m = m;
    s->nbuf = n + nobj;
    s->buf = calloc(s->nbuf, sizeof *s->buf);
    s->len = calloc(s->nbuf, sizeof *s->len);
    for (uint64_t id = 0; id < n; id++) {
        ferry_fragment f;
        assert_int_equal(ferry_manifest_fragment(m, id, &f), 0);
        uint64_t slot = id;
        if (f.object) {
            for (slot = 0; slot < nobj && strcmp(objs[slot], f.object); slot++)
                ;
            assert_true(slot < nobj);
            slot += n;
        }
        uint64_t need = frag_span(m, &f) + (f.object ? f.object_offset : 0);
        if (need > s->len[slot]) {
            s->buf[slot] = realloc(s->buf[slot], need * sizeof(uint64_t));
            memset(s->buf[slot] + s->len[slot], 0, (need - s->len[slot]) * sizeof(uint64_t));
            s->len[slot] = need;
        }
        fill_ctx x = {s, s->buf[slot]};
        each_element(m, &f, fill_elem, &x);
    }
}

static void sim_free(sim *s)
{
    for (uint64_t i = 0; i < s->nbuf; i++)
        free(s->buf[i]);
    free(s->buf);
    free(s->len);
}

typedef struct check_ctx { const ferry_manifest *m; const uint64_t *got; const uint32_t *writes; uint64_t seen; } check_ctx;

static void check_elem(void *ctx, const ferry_fragment *f, const uint64_t *c)
{
    check_ctx *x = ctx;
    ferry_tensor_desc t;
    ferry_manifest_tensor(x->m, f->tensor, &t);
    for (uint32_t k = 0; k < t.itemsize; k++) {
        uint64_t pos = local_pos(x->m, f, c, k);
        assert_int_equal(x->writes[pos], 1);
        assert_int_equal(x->got[pos], tag_of(f->tensor, &t, c, k));   /* same name in both manifests */
        x->seen++;
    }
}

/* Execute every run and check the targets. Tensor indices of the tag are
 * target-side: sources and targets list tensors in the same order here. */
static void execute_and_check(ferry_plan *p, sim *src, const char **objs, size_t nobj)
{
    ferry_manifest *dst = ferry_plan_dst(p);
    uint64_t nd = ferry_manifest_fragment_count(dst);
    uint64_t **out = calloc(nd, sizeof *out);
    uint32_t **wr = calloc(nd, sizeof *wr);
    uint64_t *olen = calloc(nd, sizeof *olen);
    for (uint64_t id = 0; id < nd; id++) {
        ferry_fragment f;
        ferry_manifest_fragment(dst, id, &f);
        olen[id] = frag_span(dst, &f);
        out[id] = calloc(olen[id], sizeof(uint64_t));
        wr[id] = calloc(olen[id], sizeof(uint32_t));
    }
    ferry_plan_iter *it;
    assert_int_equal(ferry_plan_iter_open(p, NULL, &it), 0);
    ferry_run r;
    int rc;
    uint64_t runs = 0, bytes = 0;
    uint64_t nsrc = ferry_manifest_fragment_count(ferry_plan_src(p));
    while ((rc = ferry_plan_iter_next_run(it, &r)) == 1) {
        runs++;
        uint64_t slot = r.src_fragment;
        if (r.src_object) {
            for (slot = 0; slot < nobj && strcmp(objs[slot], r.src_object); slot++)
                ;
            assert_true(slot < nobj);
            slot += nsrc;
        }
        uint64_t c[FERRY_MAX_DIMS] = {0}, pieces = 0;
        for (;;) {
            uint64_t so = r.src_offset, dof = r.dst_offset;
            for (uint32_t i = 0; i < r.nouter; i++) {
                so += c[i] * r.src_stride[i];
                dof += c[i] * r.dst_stride[i];
            }
            assert_true(so + r.len <= src->len[slot]);
            assert_true(dof + r.len <= olen[r.dst_fragment]);
            for (uint64_t b = 0; b < r.len; b++) {
                if (src->buf[slot][so + b] == 0) {
                    fprintf(stderr, "run t%u src_frag %llu obj %s so %llu len %llu nouter %u dst_frag %llu dof %llu\n", r.tensor,
                            (unsigned long long)r.src_fragment, r.src_object ? r.src_object : "-", (unsigned long long)r.src_offset,
                            (unsigned long long)r.len, r.nouter, (unsigned long long)r.dst_fragment, (unsigned long long)r.dst_offset);
                    for (uint32_t i = 0; i < r.nouter; i++) fprintf(stderr, "  %llu x %llu/%llu\n", (unsigned long long)r.count[i], (unsigned long long)r.src_stride[i], (unsigned long long)r.dst_stride[i]);
                    ferry_fragment f; ferry_manifest_fragment(ferry_plan_src(p), r.src_fragment, &f);
                    ferry_tensor_desc t; ferry_manifest_tensor(ferry_plan_src(p), f.tensor, &t);
                    fprintf(stderr, "  src frag nd %u off %llu,%llu shape %llu,%llu strides? %d %llu,%llu so %llu oo %llu\n", t.ndim, (unsigned long long)f.offset[0], (unsigned long long)f.offset[1], (unsigned long long)f.shape[0], (unsigned long long)f.shape[1], f.has_strides, (unsigned long long)f.strides[0], (unsigned long long)f.strides[1], (unsigned long long)f.storage_offset, (unsigned long long)f.object_offset);
                }
                assert_int_not_equal(src->buf[slot][so + b], 0);   /* a byte that holds data */
                out[r.dst_fragment][dof + b] = src->buf[slot][so + b];
                wr[r.dst_fragment][dof + b]++;
            }
            pieces++;
            int i = (int)r.nouter - 1;
            for (; i >= 0; i--) {
                if (++c[i] < r.count[i])
                    break;
                c[i] = 0;
            }
            if (i < 0)
                break;
        }
        assert_int_equal(pieces * r.len, r.bytes);
        bytes += r.bytes;
    }
    assert_int_equal(rc, 0);
    ferry_plan_iter_close(it);
    ferry_plan_stats st;
    ferry_plan_stats_get(p, &st);
    assert_int_equal(st.runs, runs);
    assert_int_equal(st.bytes, bytes);
    uint64_t want = 0;
    for (uint64_t id = 0; id < nd; id++) {
        ferry_fragment f;
        ferry_manifest_fragment(dst, id, &f);
        check_ctx x = {dst, out[id], wr[id], 0};
        each_element(dst, &f, check_elem, &x);
        want += x.seen;
        uint64_t written = 0;   /* nothing outside the fragment's elements (padding) */
        for (uint64_t b = 0; b < olen[id]; b++)
            written += wr[id][b];
        assert_int_equal(written, x.seen);
        free(out[id]);
        free(wr[id]);
    }
    assert_int_equal(want, bytes);
    free(out);
    free(wr);
    free(olen);
}

/* Regions: count, bytes, containment in their fragments, and filters. */
static void check_regions(ferry_plan *p)
{
    ferry_plan_stats st;
    ferry_plan_stats_get(p, &st);
    ferry_plan_iter *it;
    assert_int_equal(ferry_plan_iter_open(p, NULL, &it), 0);
    ferry_region r;
    uint64_t n = 0, bytes = 0, per_dst[NRANKS] = {0}, per_src[NRANKS] = {0};
    while (ferry_plan_iter_next_region(it, &r) == 1) {
        ferry_fragment fs, fd;
        ferry_manifest_fragment(ferry_plan_src(p), r.src_fragment, &fs);
        ferry_manifest_fragment(ferry_plan_dst(p), r.dst_fragment, &fd);
        assert_int_equal(fs.rank, r.src_rank);
        assert_int_equal(fd.rank, r.dst_rank);
        for (uint32_t d = 0; d < r.ndim; d++) {
            assert_true(r.shape[d] > 0);
            assert_true(r.offset[d] >= fs.offset[d] && r.offset[d] + r.shape[d] <= fs.offset[d] + fs.shape[d]);
            assert_true(r.offset[d] >= fd.offset[d] && r.offset[d] + r.shape[d] <= fd.offset[d] + fd.shape[d]);
        }
        n++;
        bytes += r.bytes;
        per_dst[r.dst_rank]++;
        per_src[r.src_rank]++;
    }
    ferry_plan_iter_close(it);
    assert_int_equal(n, st.regions);
    assert_int_equal(bytes, st.bytes);
    for (int64_t rank = 0; rank < 12; rank++) {
        for (int side = 0; side < 2; side++) {
            ferry_plan_filter f = {-1, side ? rank : -1, side ? -1 : rank};
            assert_int_equal(ferry_plan_iter_open(p, &f, &it), 0);
            uint64_t k = 0;
            while (ferry_plan_iter_next_region(it, &r) == 1) {
                assert_int_equal(side ? r.src_rank : r.dst_rank, (uint64_t)rank);
                k++;
            }
            ferry_plan_iter_close(it);
            assert_int_equal(k, side ? per_src[rank] : per_dst[rank]);
        }
    }
}

static void one_case(uint64_t seed, bool partial_source)
{
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    ferry_manifest *src, *dst;
    uint32_t gpn = 1 + (uint32_t)rndn(8);
    assert_int_equal(ferry_manifest_create(NRANKS, NULL, gpn, &src), 0);
    assert_int_equal(ferry_manifest_create(NRANKS, NULL, 1 + (uint32_t)rndn(8), &dst), 0);
    uint32_t ntensors = 1 + (uint32_t)rndn(3);
    uint64_t obj_off[3] = {0};
    ferry_error err = {0};
    for (uint32_t ti = 0; ti < ntensors; ti++) {
        uint32_t isz = 1u << rndn(4);
        gbox whole = {.nd = 1 + (uint32_t)rndn(5)};
        ferry_tensor_desc t = {.dtype = dtype_of(isz), .itemsize = isz, .ndim = whole.nd};
        char name[32];
        snprintf(name, sizeof name, "t%u", ti);
        t.name = name;
        for (uint32_t d = 0; d < whole.nd; d++)
            t.shape[d] = whole.ext[d] = 1 + rndn(whole.nd > 3 ? 4 : 7);
        assert_int_equal(ferry_manifest_add_tensor(src, &t, &err), (int)ti);
        assert_int_equal(ferry_manifest_add_tensor(dst, &t, &err), (int)ti);
        gbox leaves[16], tl[16];
        size_t nl = tile(&whole, leaves, 16, 0);
        uint32_t rep = 0;
        bool keep[16];
        for (size_t i = 0; i < nl; i++) {
            keep[i] = !partial_source || nl == 1 || rndn(3) != 0;
            if (keep[i])
                add_box(src, ti, isz, &leaves[i], true, &rep, obj_off);
        }
        /* Targets: a fresh tiling of kept space, plus random sub-boxes. */
        rep = 0;
        for (size_t i = 0; i < nl; i++) {
            if (!keep[i])
                continue;
            const gbox *area = partial_source ? &leaves[i] : &whole;
            if (!partial_source && i > 0)
                break;
            size_t nt = tile(area, tl, 16, 0);
            for (size_t j = 0; j < nt; j++)
                add_box(dst, ti, isz, &tl[j], false, &rep, NULL);
            gbox sub = *area;
            for (uint32_t d = 0; d < sub.nd; d++) {
                uint64_t a = rndn(area->ext[d]);
                sub.off[d] = area->off[d] + a;
                sub.ext[d] = 1 + rndn(area->ext[d] - a);
            }
            add_box(dst, ti, isz, &sub, false, &rep, NULL);
        }
    }
    static const char *objs[] = {"obj0", "obj1", "obj2"};
    ferry_plan *p;
    int rc = ferry_plan_create(src, dst, NULL, &p, &err);
    if (rc < 0)
        fail_msg("seed %llu: %s", (unsigned long long)seed, err.msg);
    sim s;
    sim_source(&s, src, objs, 3);
    execute_and_check(p, &s, objs, 3);
    check_regions(p);
    sim_free(&s);
    ferry_plan_free(p);
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
}

static void test_oracle_full(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 400; seed++)
        one_case(seed, false);
}

static void test_oracle_partial_source(void **state)
{
    (void)state;
    for (uint64_t seed = 1000; seed <= 1300; seed++)
        one_case(seed, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_full),
        cmocka_unit_test(test_oracle_partial_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
