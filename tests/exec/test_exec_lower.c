/* Lowering to engine batches, checked by simulation: for randomized small
 * layouts (several tensors, splits, padded / transposed / strided local
 * storage, worker groups) the lowered batches of every worker are executed
 * with memcpy between in-process buffers (remote addresses used as
 * pointers) and every target element is compared with the source element
 * at the same global coordinate, in reader and sink mode. Also: batch
 * limits, operation scoping, and selectors that must fail. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/exec.h"

#define MAXF 256

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(uint64_t n)   /* uniform-ish in [0, n) */
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng % n;
}

typedef struct side {
    ferry_manifest *m;
    ferry_binding *b;
    uint64_t nfrag;
    uint8_t *buf[MAXF];
    ferry_binding_entry e[MAXF];
    ferry_fragment f[MAXF];
} side;

static uint8_t pattern(uint32_t tensor, uint64_t linear, uint32_t k)
{
    uint64_t x = (tensor + 1) * 0x9E3779B97F4A7C15ull ^ (linear * 0xBF58476D1CE4E5B9ull) ^ k;
    x ^= x >> 29;
    return (uint8_t)(x * 0x94D049BB133111EBull >> 56);
}

/* Random local storage for fragment f of a tensor with itemsize isz. */
static void layout(ferry_binding_entry *e, const ferry_fragment *f, uint32_t ndim, uint32_t isz)
{
    uint32_t perm[FERRY_MAX_DIMS];
    for (uint32_t d = 0; d < ndim; d++)
        perm[d] = d;
    for (uint32_t d = ndim; d > 1; d--) {   /* random storage order */
        uint32_t j = (uint32_t)rnd(d), t = perm[d - 1];
        perm[d - 1] = perm[j]; perm[j] = t;
    }
    if (rnd(2) == 0)   /* half the time row-major */
        for (uint32_t d = 0; d < ndim; d++)
            perm[d] = d;
    uint64_t stride = rnd(5) == 0 ? 2 : 1;
    for (uint32_t k = ndim; k > 0; k--) {
        uint32_t d = perm[k - 1];
        e->strides[d] = stride;
        stride *= f->shape[d] + (rnd(3) == 0 ? rnd(3) : 0);
    }
    e->ndim = ndim;
    e->itemsize = isz;
    e->storage_offset = rnd(4);
    uint64_t last = e->storage_offset;
    for (uint32_t d = 0; d < ndim; d++) {
        e->shape[d] = f->shape[d];
        last += (f->shape[d] - 1) * e->strides[d];
    }
    e->nbytes = (last + 1) * isz + rnd(9);
}

static uint64_t elem_off(const ferry_binding_entry *e, const uint64_t *idx)
{
    uint64_t i = e->storage_offset;
    for (uint32_t d = 0; d < e->ndim; d++)
        i += idx[d] * e->strides[d];
    return i * e->itemsize;
}

/* Linear index in the tensor of local element idx of fragment f. */
static uint64_t global_linear(const ferry_tensor_desc *t, const ferry_fragment *f, const uint64_t *idx)
{
    uint64_t lin = 0;
    for (uint32_t d = 0; d < t->ndim; d++)
        lin = lin * t->shape[d] + f->offset[d] + idx[d];
    return lin;
}

/* Call fn for every local element of fragment i of side s. */
static bool next_idx(uint64_t *idx, const uint64_t *shape, uint32_t ndim)
{
    for (uint32_t d = ndim; d > 0; d--) {
        if (++idx[d - 1] < shape[d - 1])
            return true;
        idx[d - 1] = 0;
    }
    return false;
}

static void fill_or_check(side *s, bool fill)
{
    for (uint64_t i = 0; i < s->nfrag; i++) {
        ferry_tensor_desc t;
        assert_int_equal(ferry_manifest_tensor(s->m, s->f[i].tensor, &t), 0);
        uint64_t idx[FERRY_MAX_DIMS] = {0};
        do {
            uint64_t lin = global_linear(&t, &s->f[i], idx);
            uint8_t *p = s->buf[i] + elem_off(&s->e[i], idx);
            for (uint32_t k = 0; k < t.itemsize; k++) {
                if (fill)
                    p[k] = pattern(s->f[i].tensor, lin, k);
                else if (p[k] != pattern(s->f[i].tensor, lin, k))
                    fail_msg("target fragment %lu of %s: element %lu byte %u is %u, want %u",
                             (unsigned long)i, t.name, (unsigned long)lin, k, p[k],
                             pattern(s->f[i].tensor, lin, k));
            }
        } while (next_idx(idx, s->f[i].shape, t.ndim));
    }
}

static void add_tensors(ferry_manifest *m, const ferry_tensor_desc *t, size_t nt, bool src)
{
    for (size_t i = 0; i < nt; i++) {
        assert_int_equal(ferry_manifest_add_tensor(m, &t[i], NULL), (int)i);
        ferry_split sp = {.tensor = (uint32_t)i, .whole = true};
        uint32_t rs = 1;
        for (uint32_t d = t[i].ndim; d > 0; d--) {
            uint64_t maxp = t[i].shape[d - 1] < 3 ? t[i].shape[d - 1] : 3;
            sp.parts[d - 1] = (uint32_t)(1 + rnd(maxp));
            sp.rank_stride[d - 1] = rs;
            rs *= sp.parts[d - 1];
        }
        (void)src;
        ferry_error err = {0};
        if (ferry_manifest_add_split(m, &sp, &err) < 0)
            fail_msg("%s", err.msg);
    }
}

/* Bind every fragment of s with worker = base + rank % groups. */
static void bind_side(side *s, uint32_t base, uint32_t groups, uint64_t gen)
{
    s->nfrag = ferry_manifest_fragment_count(s->m);
    assert_true(s->nfrag <= MAXF);
    assert_int_equal(ferry_binding_create(s->m, base, gen, 1, &s->b, NULL), 0);
    for (uint64_t i = 0; i < s->nfrag; i++) {
        assert_int_equal(ferry_manifest_fragment(s->m, i, &s->f[i]), 0);
        ferry_tensor_desc t;
        assert_int_equal(ferry_manifest_tensor(s->m, s->f[i].tensor, &t), 0);
        memset(&s->e[i], 0, sizeof(s->e[i]));
        layout(&s->e[i], &s->f[i], t.ndim, t.itemsize);
        s->buf[i] = malloc(s->e[i].nbytes);
        assert_non_null(s->buf[i]);
        s->e[i].fragment = i;
        s->e[i].addr = (uint64_t)(uintptr_t)s->buf[i];
        s->e[i].worker = base + s->f[i].rank % groups;
        s->e[i].kind = FERRY_MEM_HOST;
        ferry_error err = {0};
        if (ferry_binding_add(s->b, &s->e[i], &err) < 0)
            fail_msg("%s", err.msg);
    }
}

static void free_side(side *s)
{
    for (uint64_t i = 0; i < s->nfrag; i++)
        free(s->buf[i]);
    ferry_binding_free(s->b);
    ferry_manifest_close(s->m);
}

/* Execute a batch list as the engine would: READ copies remote -> local,
 * WRITE local -> remote. Checks the limits and the peer/key of each op. */
static uint64_t g_strided;   /* strided ops seen by simulate() */

static void simulate(const ferry_batch_list *bl, const ferry_exec_limits *lim, enum ferry_exec_mode mode)
{
    uint64_t total = 0;
    assert_true(bl->nbatches > 0);
    assert_int_equal(bl->batch_start[0], 0);
    assert_int_equal(bl->batch_start[bl->nbatches], bl->nops);
    for (size_t b = 0; b < bl->nbatches; b++) {
        size_t lo = bl->batch_start[b], hi = bl->batch_start[b + 1];
        uint64_t bytes = 0;
        assert_true(hi > lo);
        assert_true(hi - lo <= lim->max_ops);
        for (size_t i = lo; i < hi; i++) {
            const ferry_op *op = &bl->ops[i];
            assert_int_equal(op->opcode, mode == FERRY_EXEC_READER ? FERRY_OP_READ : FERRY_OP_WRITE);
            assert_int_equal(op->key, op->peer * 7u + 1);
            assert_true(op->len > 0);
            /* a strided op: rows that never overlap, on either side */
            uint64_t rows = op->count > 1 ? op->count : 1;
            if (rows > 1) {
                assert_true(op->local_stride >= op->len && op->remote_stride >= op->len);
                g_strided++;
            }
            bytes += rows * op->len;
            for (uint64_t k = 0; k < rows; k++) {
                uint8_t *local = (uint8_t *)op->local + k * op->local_stride;
                uint8_t *remote = (uint8_t *)(uintptr_t)(op->remote_addr + k * op->remote_stride);
                if (op->opcode == FERRY_OP_READ)
                    memcpy(local, remote, op->len);
                else
                    memcpy(remote, local, op->len);
            }
        }
        assert_true(bytes <= lim->max_bytes);
        total += bytes;
    }
    assert_int_equal(total, bl->bytes);
}

static void one_case(void)
{
    static const char *dtypes[] = {"u8", "bf16", "f32", "f64"};
    ferry_tensor_desc t[3];
    char names[3][8];
    size_t nt = 1 + rnd(3);
    for (size_t i = 0; i < nt; i++) {
        names[i][0] = 't'; names[i][1] = (char)('0' + i); names[i][2] = '\0';
        t[i] = (ferry_tensor_desc){.name = names[i], .dtype = dtypes[rnd(4)], .ndim = (uint32_t)rnd(4)};
        t[i].itemsize = ferry_dtype_size(t[i].dtype);
        assert_true(t[i].itemsize > 0);
        for (uint32_t d = 0; d < t[i].ndim; d++)
            t[i].shape[d] = 1 + rnd(6);
    }
    side s = {0}, d = {0};
    assert_int_equal(ferry_manifest_create(27, NULL, 8, &s.m), 0);
    assert_int_equal(ferry_manifest_create(27, NULL, 8, &d.m), 0);
    add_tensors(s.m, t, nt, true);
    add_tensors(d.m, t, nt, false);
    ferry_plan *p;
    ferry_error err = {0};
    if (ferry_plan_create(s.m, d.m, NULL, &p, &err) < 0)
        fail_msg("%s", err.msg);
    uint32_t sg = 1 + (uint32_t)rnd(3), dg = 1 + (uint32_t)rnd(3);
    bind_side(&s, 0, sg, 4);
    bind_side(&d, 50, dg, 4);
    ferry_attested_plan *a;
    assert_int_equal(ferry_attest(p, s.b, d.b, 4, &a, &err), 0);
    ferry_plan_stats st;
    assert_int_equal(ferry_plan_stats_get(p, &st), 0);

    ferry_peer_map pm[6];
    for (uint32_t w = 0; w < 3; w++) {
        pm[w] = (ferry_peer_map){.worker = w, .peer = w, .key = w * 7u + 1};
        pm[3 + w] = (ferry_peer_map){.worker = 50 + w, .peer = 50 + w, .key = (50 + w) * 7u + 1};
    }
    static const uint64_t maxb[] = {1, 3, 8, 64, 1 << 20};
    fill_or_check(&s, true);
    for (int mode = FERRY_EXEC_READER; mode <= FERRY_EXEC_SINK; mode++) {
        for (uint64_t i = 0; i < d.nfrag; i++)
            memset(d.buf[i], 0xEE, d.e[i].nbytes);
        uint32_t base = mode == FERRY_EXEC_READER ? 50 : 0, groups = mode == FERRY_EXEC_READER ? dg : sg;
        uint64_t moved = 0;
        for (uint32_t w = base; w < base + groups; w++) {
            ferry_lower_args args = {.mode = (enum ferry_exec_mode)mode, .workers = &w, .nworkers = 1,
                                     .peers = pm, .npeers = 6,
                                     .limits = {.max_ops = 1 + rnd(5), .max_bytes = maxb[rnd(5)]}};
            ferry_batch_list bl;
            int rc = ferry_exec_lower(a, s.b, d.b, &args, &bl, &err);
            if (rc == FERRY_ENOENT && strstr(err.msg, "holds no fragment") != NULL)
                continue;   /* fewer ranks than worker groups */
            if (rc < 0)
                fail_msg("%s", err.msg);
            simulate(&bl, &args.limits, (enum ferry_exec_mode)mode);
            moved += bl.bytes;
            ferry_batch_list_free(&bl);
        }
        assert_int_equal(moved, st.bytes);
        fill_or_check(&d, false);
    }
    ferry_attested_free(a);
    ferry_plan_free(p);
    free_side(&s);
    free_side(&d);
}

static void test_oracle_random(void **state)
{
    (void)state;
    for (int i = 0; i < 300; i++)
        one_case();
    assert_true(g_strided > 0);   /* the random layouts do produce strided ops */
}

/* Fixture for the scoping and selector tests: an 8x4 f32 tensor, source
 * row-split over 4 ranks, target row-split over 2 ranks; target worker 100
 * holds rank 0, worker 101 rank 1 (one participant, two worker groups). */
typedef struct fx {
    ferry_manifest *sm, *dm;
    ferry_plan *p;
    uint8_t sbuf[4][32], dbuf[2][64];
} fx;

static void fx_open(fx *x)
{
    ferry_tensor_desc t = {.name = "w", .dtype = "f32", .itemsize = 4, .ndim = 2, .shape = {8, 4}};
    assert_int_equal(ferry_manifest_create(4, NULL, 8, &x->sm), 0);
    assert_int_equal(ferry_manifest_create(2, NULL, 8, &x->dm), 0);
    assert_int_equal(ferry_manifest_add_tensor(x->sm, &t, NULL), 0);
    assert_int_equal(ferry_manifest_add_tensor(x->dm, &t, NULL), 0);
    ferry_split s = {.tensor = 0, .whole = true, .parts = {4, 1}, .rank_stride = {1, 0}};
    assert_int_equal(ferry_manifest_add_split(x->sm, &s, NULL), 0);
    s.parts[0] = 2;
    assert_int_equal(ferry_manifest_add_split(x->dm, &s, NULL), 0);
    assert_int_equal(ferry_plan_create(x->sm, x->dm, NULL, &x->p, NULL), 0);
}

static ferry_binding *fx_bind(fx *x, bool src, const uint64_t *frags, size_t n)
{
    ferry_binding *b;
    assert_int_equal(ferry_binding_create(src ? x->sm : x->dm, 1, 1, 1, &b, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        uint64_t rows = src ? 2 : 4;
        ferry_binding_entry e = {.fragment = frags[i], .nbytes = rows * 16, .itemsize = 4, .ndim = 2,
                                 .shape = {rows, 4}, .strides = {4, 1}, .kind = FERRY_MEM_HOST,
                                 .worker = (uint32_t)(src ? frags[i] : 100 + frags[i])};
        e.addr = (uint64_t)(uintptr_t)(src ? x->sbuf[frags[i]] : x->dbuf[frags[i]]);
        assert_int_equal(ferry_binding_add(b, &e, NULL), 0);
    }
    return b;
}

static void test_scoping_and_selectors(void **state)
{
    (void)state;
    fx x;
    fx_open(&x);
    /* Target process holds worker groups 100 and 101 but runs only 100's
     * ops (reader): it needs source fragments 0 and 1 only; sources 2 and 3
     * and their peer mappings are absent. */
    const uint64_t sf[] = {0, 1}, df[] = {0, 1};
    ferry_binding *bs = fx_bind(&x, true, sf, 2), *bd = fx_bind(&x, false, df, 2);
    ferry_attested_plan *a;
    ferry_error err = {0};
    assert_int_equal(ferry_attest(x.p, bs, bd, 1, &a, &err), 0);
    ferry_peer_map pm[] = {{.worker = 0, .peer = 0, .key = 1}, {.worker = 1, .peer = 1, .key = 8}};
    uint32_t w = 100;
    ferry_lower_args args = {.mode = FERRY_EXEC_READER, .workers = &w, .nworkers = 1,
                             .peers = pm, .npeers = 2, .limits = {.max_ops = 16, .max_bytes = 1 << 20}};
    ferry_batch_list bl;
    if (ferry_exec_lower(a, bs, bd, &args, &bl, &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(bl.nops, 2);          /* one contiguous 32-byte op per source fragment */
    assert_int_equal(bl.bytes, 64);
    assert_int_equal(bl.nbatches, 1);
    ferry_batch_list_free(&bl);

    /* Worker 101 needs source fragment 2, which is not bound. */
    w = 101;
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_ENOENT);
    assert_non_null(strstr(err.msg, "source fragment 2"));
    assert_null(bl.ops);

    /* Empty selectors, unknown workers, a worker of the other side. */
    args.workers = NULL;
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_EINVAL);
    args.workers = &w; args.nworkers = 0;
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "empty"));
    args.nworkers = 1; w = 7;
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_ENOENT);
    w = 0;   /* a source worker is no reader initiator */
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_ENOENT);
    /* Bad mode and limits. */
    w = 100;
    args.limits.max_ops = 0;
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_EINVAL);
    args.limits.max_ops = 16;
    args.mode = (enum ferry_exec_mode)0;
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_EINVAL);
    /* A missing peer mapping. */
    args.mode = FERRY_EXEC_READER;
    args.npeers = 1;
    assert_int_equal(ferry_exec_lower(a, bs, bd, &args, &bl, &err), FERRY_ENOENT);
    assert_non_null(strstr(err.msg, "worker 1"));

    /* Sink: source worker 0 writes only into target fragment 0; target
     * fragment 1's entry (an unrelated target) is not needed. */
    ferry_attested_free(a);
    ferry_binding_free(bd);
    bd = fx_bind(&x, false, df, 1);
    assert_int_equal(ferry_attest(x.p, bs, bd, 1, &a, &err), 0);
    ferry_peer_map tpm[] = {{.worker = 100, .peer = 5, .key = 36}};
    args = (ferry_lower_args){.mode = FERRY_EXEC_SINK, .workers = &w, .nworkers = 1, .peers = tpm,
                              .npeers = 1, .limits = {.max_ops = 1, .max_bytes = 8}};
    w = 0;
    if (ferry_exec_lower(a, bs, bd, &args, &bl, &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(bl.bytes, 32);
    assert_int_equal(bl.nbatches, 4);      /* 32 bytes in 8-byte batches */
    for (size_t i = 0; i < bl.nops; i++)
        assert_true(bl.ops[i].opcode == FERRY_OP_WRITE && bl.ops[i].peer == 5 && bl.ops[i].len == 8);
    ferry_batch_list_free(&bl);
    ferry_batch_list_free(&bl);            /* idempotent on an emptied list */

    ferry_attested_free(a);
    ferry_binding_free(bs);
    ferry_binding_free(bd);
    ferry_plan_free(x.p);
    ferry_manifest_close(x.sm);
    ferry_manifest_close(x.dm);
}

/* Rows on the source, columns on the target: each (source, target) region
 * is rows of a few elements at the source's row pitch, one strided op. */
static void test_rows_to_columns_strided(void **state)
{
    (void)state;
    ferry_tensor_desc t = {.name = "w", .dtype = "f32", .itemsize = 4, .ndim = 2, .shape = {8, 4}};
    ferry_manifest *sm, *dm;
    assert_int_equal(ferry_manifest_create(2, NULL, 8, &sm), 0);
    assert_int_equal(ferry_manifest_create(2, NULL, 8, &dm), 0);
    assert_int_equal(ferry_manifest_add_tensor(sm, &t, NULL), 0);
    assert_int_equal(ferry_manifest_add_tensor(dm, &t, NULL), 0);
    ferry_split rs = {.tensor = 0, .whole = true, .parts = {2, 1}, .rank_stride = {1, 0}};
    ferry_split cs = {.tensor = 0, .whole = true, .parts = {1, 2}, .rank_stride = {0, 1}};
    assert_int_equal(ferry_manifest_add_split(sm, &rs, NULL), 0);
    assert_int_equal(ferry_manifest_add_split(dm, &cs, NULL), 0);
    ferry_plan *p;
    assert_int_equal(ferry_plan_create(sm, dm, NULL, &p, NULL), 0);
    static uint8_t sbuf[2][64], dbuf[2][64];
    ferry_binding *bs, *bd;
    assert_int_equal(ferry_binding_create(sm, 1, 1, 1, &bs, NULL), 0);
    assert_int_equal(ferry_binding_create(dm, 1, 1, 1, &bd, NULL), 0);
    for (uint64_t f = 0; f < 2; f++) {
        ferry_binding_entry e = {.fragment = f, .nbytes = 64, .itemsize = 4, .ndim = 2, .shape = {4, 4},
                                 .strides = {4, 1}, .kind = FERRY_MEM_HOST, .worker = (uint32_t)f,
                                 .addr = (uint64_t)(uintptr_t)sbuf[f]};
        assert_int_equal(ferry_binding_add(bs, &e, NULL), 0);
        e = (ferry_binding_entry){.fragment = f, .nbytes = 64, .itemsize = 4, .ndim = 2, .shape = {8, 2},
                                  .strides = {2, 1}, .kind = FERRY_MEM_HOST, .worker = 10 + (uint32_t)f,
                                  .addr = (uint64_t)(uintptr_t)dbuf[f]};
        assert_int_equal(ferry_binding_add(bd, &e, NULL), 0);
    }
    ferry_attested_plan *a;
    ferry_error err = {0};
    assert_int_equal(ferry_attest(p, bs, bd, 1, &a, &err), 0);
    ferry_peer_map pm[] = {{.worker = 10, .peer = 3, .key = 9}, {.worker = 11, .peer = 4, .key = 9}};
    uint32_t w = 0;
    ferry_lower_args args = {.mode = FERRY_EXEC_SINK, .workers = &w, .nworkers = 1, .peers = pm,
                             .npeers = 2, .limits = {.max_ops = 16, .max_bytes = 1 << 20}};
    ferry_batch_list bl;
    if (ferry_exec_lower(a, bs, bd, &args, &bl, &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(bl.nops, 2);   /* one per target, not one per row */
    assert_int_equal(bl.bytes, 64);
    for (size_t i = 0; i < 2; i++) {
        const ferry_op *op = &bl.ops[i];
        uint64_t k = op->peer - 3;
        assert_int_equal(op->count, 4);
        assert_int_equal(op->len, 8);
        assert_int_equal(op->local_stride, 16);
        assert_int_equal(op->remote_stride, 8);
        assert_ptr_equal(op->local, sbuf[0] + 8 * k);
        assert_int_equal(op->remote_addr, (uint64_t)(uintptr_t)dbuf[k]);
    }
    ferry_batch_list_free(&bl);
    /* a byte limit cuts the rows into several strided ops */
    args.limits.max_bytes = 16;
    if (ferry_exec_lower(a, bs, bd, &args, &bl, &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(bl.nops, 4);
    for (size_t i = 0; i < bl.nops; i++)
        assert_int_equal(bl.ops[i].count, 2);
    ferry_batch_list_free(&bl);
    ferry_attested_free(a);
    ferry_binding_free(bs);
    ferry_binding_free(bd);
    ferry_plan_free(p);
    ferry_manifest_close(sm);
    ferry_manifest_close(dm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_random),
        cmocka_unit_test(test_scoping_and_selectors),
        cmocka_unit_test(test_rows_to_columns_strided),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
