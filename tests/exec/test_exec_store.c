/* Store reads through exec (exec.h, "store reads"), against a real master
 * and node: a tensor stored as two row blocks packed into one object is
 * read by a target split by columns into padded (strided) memory, every
 * element and every padding element checked; the reads run in parts; a
 * binding whose buffer is smaller than its box is refused before anything
 * is lowered or read; a stale binding, reads lowered for other entries,
 * a fragment the locate callback does not know (ABORTED: the target
 * untouched), a missing object (FAILED_DRAINED, named), a binding that
 * lays its box out unlike the placement (refused at lowering); and one
 * run lowered into engine ops (ferry_exec_run_ops). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ferry/ferry.h"
#include "util/ftstore.h"
#include "util/testutil.h"

#define ROWS 64
#define COLS 48
#define HALF (COLS / 2)
#define PITCH (HALF + 5)          /* padded row of a target half */
#define PAD 0x5a5a5a5au
#define GEN 7

static int setup(void **state) { return ft_solo_setup(state, 64u << 20, 10000); }
static int teardown(void **state) { return ft_solo_teardown(state); }

static uint32_t value(uint64_t r, uint64_t c) { return (uint32_t)(r * 1000 + c + 1); }

typedef struct world {
    ferry_store *s;
    ferry_manifest *sm, *dm;
    ferry_plan *p;
    ferry_binding *src, *dst;
    ferry_attested_plan *a;
    uint32_t tgt[2][ROWS * PITCH];
    const char *key;               /* what locate answers (NULL: nothing) */
} world;

/* Source fragment f (rows [32 f, 32 f + 32)) lives at f x its bytes in the object. */
static int locate(void *ctx, uint64_t fragment, const char **key, uint64_t *offset)
{
    world *w = ctx;
    if (!w->key || fragment > 1)
        return FERRY_ENOENT;
    *key = w->key;
    *offset = fragment * (ROWS / 2) * COLS * 4;
    return 0;
}

static ferry_manifest *manifest(bool by_rows)
{
    ferry_manifest *m = NULL;
    assert_int_equal(ferry_manifest_create(2, NULL, 8, &m), 0);
    ferry_tensor_desc d = { .name = "w", .dtype = "f32", .itemsize = 4, .ndim = 2,
                            .shape = { ROWS, COLS } };
    assert_int_equal(ferry_manifest_add_tensor(m, &d, NULL), 0);
    for (uint32_t k = 0; k < 2; k++) {
        ferry_fragment f = { .tensor = 0, .rank = k };
        f.offset[0] = by_rows ? k * ROWS / 2 : 0;
        f.offset[1] = by_rows ? 0 : k * HALF;
        f.shape[0] = by_rows ? ROWS / 2 : ROWS;
        f.shape[1] = by_rows ? COLS : HALF;
        if (!by_rows) {
            f.has_strides = true;
            f.strides[0] = PITCH;
            f.strides[1] = 1;
        }
        assert_true(ferry_manifest_add_fragment(m, &f, NULL) >= 0);
    }
    return m;
}

/* The target binding: half k at w->tgt[k], nbytes[k] bytes (0: all of it). */
static int bind(world *w, uint64_t gen, const uint64_t nbytes[2], uint64_t pitch,
                ferry_binding **out, ferry_error *err)
{
    int rc = ferry_binding_create(w->dm, 0, gen, 0, out, err);
    for (uint32_t k = 0; k < 2 && rc == 0; k++) {
        ferry_binding_entry e = { .fragment = k, .addr = (uint64_t)(uintptr_t)w->tgt[k],
                                  .nbytes = nbytes && nbytes[k] ? nbytes[k] : sizeof w->tgt[k],
                                  .worker = k, .kind = FERRY_MEM_HOST, .itemsize = 4,
                                  .ndim = 2, .shape = { ROWS, HALF }, .strides = { pitch, 1 } };
        rc = ferry_binding_add(*out, &e, err);
    }
    if (rc < 0) {
        ferry_binding_free(*out);
        *out = NULL;
    }
    return rc;
}

static void world_open(world *w, ferry_store *s)
{
    memset(w, 0, sizeof *w);
    w->s = s;
    w->key = "exec-store/w";
    uint32_t *src = malloc(ROWS * COLS * 4);
    assert_non_null(src);
    for (uint64_t r = 0; r < ROWS; r++)
        for (uint64_t c = 0; c < COLS; c++)
            src[r * COLS + c] = value(r, c);
    (void)ferry_store_remove(s, w->key, NULL);
    assert_int_equal(ferry_store_put(s, w->key, src, ROWS * COLS * 4, NULL, NULL, NULL), 0);
    free(src);
    w->sm = manifest(true);
    w->dm = manifest(false);
    ferry_error err = {0};
    assert_int_equal(ferry_plan_create(w->sm, w->dm, NULL, &w->p, &err), 0);
    assert_int_equal(ferry_binding_create(w->sm, 0, GEN, 0, &w->src, &err), 0);
    assert_int_equal(bind(w, GEN, NULL, PITCH, &w->dst, &err), 0);
    assert_int_equal(ferry_attest(w->p, w->src, w->dst, GEN, &w->a, &err), 0);
    for (uint32_t k = 0; k < 2; k++)
        for (size_t i = 0; i < ROWS * PITCH; i++)
            w->tgt[k][i] = PAD;
}

static void world_close(world *w)
{
    ferry_attested_free(w->a);
    ferry_binding_free(w->dst);
    ferry_binding_free(w->src);
    ferry_plan_free(w->p);
    ferry_manifest_close(w->sm);
    ferry_manifest_close(w->dm);
}

/* Half k holds its columns exactly, its padding untouched; or (want
 * false) nothing of it was written. */
static void check_half(const world *w, uint32_t k, bool want)
{
    for (uint64_t r = 0; r < ROWS; r++)
        for (uint64_t c = 0; c < PITCH; c++) {
            uint32_t got = w->tgt[k][r * PITCH + c];
            uint32_t exp = want && c < HALF ? value(r, k * HALF + c) : PAD;
            if (got != exp)
                fail_msg("half %u row %llu col %llu: %u, expected %u", k, (unsigned long long)r,
                         (unsigned long long)c, got, exp);
        }
}

static void test_store_read(void **state)
{
    ft_solo *so = *state;
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    world_open(w, so->s);
    ferry_error err = {0};
    ferry_store_reads r = {0};
    /* worker 1 only: its half, as strided reads (one per source block) */
    assert_int_equal(ferry_exec_store_lower(w->a, w->dst, (const uint32_t[]){ 1 }, 1, NULL, &r, &err), 0);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.bytes, ROWS * HALF * 4);
    for (size_t i = 0; i < r.n; i++) {
        assert_int_equal(r.v[i].count, ROWS / 2);   /* rows ride in one read */
        assert_int_equal(r.v[i].dst_stride, PITCH * 4);
        assert_int_equal(r.v[i].src_stride, COLS * 4);
    }
    ferry_store_exec_config xc = { .store = so->s, .locate = locate, .locate_ctx = w };
    ferry_exec_result res;
    assert_int_equal(ferry_exec_store_run(&xc, w->a, w->dst, &r, 0, r.n, &res, &err), 0);
    assert_int_equal(res.state, FERRY_TICKET_COMPLETED);
    assert_int_equal(res.bytes_done, ROWS * HALF * 4);
    check_half(w, 1, true);
    check_half(w, 0, false);
    ferry_exec_result_free(&res);
    ferry_store_reads_free(&r);

    /* both workers, one read per call, in two parts */
    assert_int_equal(ferry_exec_store_lower(w->a, w->dst, (const uint32_t[]){ 0, 1 }, 2, NULL, &r, &err), 0);
    assert_int_equal(r.n, 4);
    xc.max_reads = 1;
    assert_int_equal(ferry_exec_store_run(&xc, w->a, w->dst, &r, 0, 1, &res, &err), 0);
    assert_int_equal(res.batches, 1);
    assert_int_equal(ferry_exec_store_run(&xc, w->a, w->dst, &r, 1, r.n, &res, &err), 0);
    assert_int_equal(res.batches, 3);
    assert_int_equal(res.state, FERRY_TICKET_COMPLETED);
    check_half(w, 0, true);
    check_half(w, 1, true);
    printf("store reads: %zu strided reads of %llu bytes, every element and pad checked\n", r.n,
           (unsigned long long)r.bytes);
    ferry_store_reads_free(&r);
    world_close(w);
    free(w);
}

static void test_store_read_refused(void **state)
{
    ft_solo *so = *state;
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    world_open(w, so->s);
    ferry_error err = {0};
    ferry_store_reads r = {0};
    ferry_exec_result res;
    ferry_store_exec_config xc = { .store = so->s, .locate = locate, .locate_ctx = w };

    /* a buffer one element short of its box: refused when bound */
    ferry_binding *small = NULL;
    uint64_t short_by[2] = { 0, ((ROWS - 1) * PITCH + HALF) * 4 - 4 };
    assert_int_equal(bind(w, GEN, short_by, PITCH, &small, &err), FERRY_ERANGE);
    assert_null(small);
    printf("too small: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "binding fragment 1 of w"));
    assert_non_null(strstr(err.msg, "past the"));

    /* a binding of another generation than the attestation */
    ferry_binding *old = NULL;
    assert_int_equal(bind(w, GEN - 1, NULL, PITCH, &old, &err), 0);
    assert_int_equal(ferry_exec_store_lower(w->a, old, (const uint32_t[]){ 0 }, 1, NULL, &r, &err),
                     FERRY_ESTALE);
    assert_int_equal(r.n, 0);
    assert_int_equal(ferry_exec_store_lower(w->a, w->dst, (const uint32_t[]){ 0 }, 1, NULL, &r, &err), 0);
    assert_int_equal(ferry_exec_store_run(&xc, w->a, old, &r, 0, r.n, &res, &err), FERRY_ESTALE);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    ferry_binding_free(old);

    /* reads lowered for other entries (another buffer) than the attested binding's */
    ferry_binding *moved = NULL;
    ferry_attested_plan *a2 = NULL;
    assert_int_equal(ferry_binding_create(w->dm, 0, GEN, 0, &moved, &err), 0);
    ferry_binding_entry e0 = *ferry_binding_find(w->dst, 0);
    e0.addr = (uint64_t)(uintptr_t)w->tgt[1];
    assert_int_equal(ferry_binding_add(moved, &e0, &err), 0);
    assert_int_equal(ferry_attest(w->p, w->src, moved, GEN, &a2, &err), 0);
    assert_int_equal(ferry_exec_store_run(&xc, a2, moved, &r, 0, r.n, &res, &err), FERRY_ESTALE);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    ferry_attested_free(a2);
    ferry_binding_free(moved);

    /* a fragment the generation does not store: nothing read */
    w->key = NULL;
    assert_int_equal(ferry_exec_store_run(&xc, w->a, w->dst, &r, 0, r.n, &res, &err), FERRY_EPROTO);
    assert_int_equal(res.state, FERRY_TICKET_ABORTED);
    assert_int_equal(res.bytes_done, 0);
    check_half(w, 0, false);
    check_half(w, 1, false);

    /* the object is gone: the store call fails and says which */
    w->key = "exec-store/missing";
    int rc = ferry_exec_store_run(&xc, w->a, w->dst, &r, 0, r.n, &res, &err);
    assert_true(rc < 0);
    assert_int_equal(res.state, FERRY_TICKET_FAILED_DRAINED);
    printf("missing object: %s (%s)\n", err.msg, ferry_ticket_state_name(res.state));
    assert_non_null(strstr(err.msg, "reading exec-store/missing at"));
    check_half(w, 0, false);
    ferry_store_reads_free(&r);

    /* a binding that lays its box out unlike the placement */
    ferry_binding *other = NULL;
    ferry_attested_plan *a3 = NULL;
    assert_int_equal(bind(w, GEN, NULL, HALF, &other, &err), 0);
    assert_int_equal(ferry_attest(w->p, w->src, other, GEN, &a3, &err), 0);
    assert_int_equal(ferry_exec_store_lower(a3, other, (const uint32_t[]){ 0 }, 1, NULL, &r, &err),
                     FERRY_EINVAL);
    printf("layout: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "target fragment 0"));
    assert_int_equal(r.n, 0);
    ferry_attested_free(a3);
    ferry_binding_free(other);
    world_close(w);
    free(w);
}

/* One run into ops: a 3-D box from a dense layout into one with padded
 * rows and planes is one op per plane (its rows strided); the ops, copied
 * row by row, move exactly the box. */
static void test_run_ops(void **state)
{
    (void)state;
    enum { P = 3, R = 4, C = 5, RP = 8, PP = 40 };   /* target: rows of 8, planes of 40 */
    uint16_t src[P * R * C], dst[P * PP];
    for (size_t i = 0; i < P * R * C; i++)
        src[i] = (uint16_t)(i + 1);
    memset(dst, 0, sizeof dst);
    uint64_t shape[3] = { P, R, C }, ss[3] = { R * C, C, 1 }, ds[3] = { PP, RP, 1 };
    ferry_run run = {0};
    ferry_box_lower(3, shape, 2, ss, ds, &run);
    ferry_op *ops = NULL;
    size_t n = 0, cap = 0;
    uint64_t sb = (uint64_t)(uintptr_t)src, db = (uint64_t)(uintptr_t)dst;
    assert_int_equal(ferry_exec_run_ops(&run, FERRY_OP_WRITE, sb, db, 3, 9, &ops, &n, &cap), 0);
    assert_int_equal(n, P);
    for (size_t k = 0; k < n; k++) {
        const ferry_op *o = &ops[k];
        assert_int_equal(o->opcode, FERRY_OP_WRITE);
        assert_int_equal(o->len, C * 2);
        assert_int_equal(o->count, R);
        assert_int_equal(o->local_stride, C * 2);
        assert_int_equal(o->remote_stride, RP * 2);
        assert_int_equal((uint64_t)(uintptr_t)o->local, sb + k * R * C * 2);
        assert_int_equal(o->remote_addr, db + k * PP * 2);
        assert_int_equal(o->peer, 3);
        assert_int_equal(o->key, 9);
        for (uint64_t r = 0; r < o->count; r++)
            memcpy((uint8_t *)(uintptr_t)o->remote_addr + r * o->remote_stride,
                   (const uint8_t *)o->local + r * o->local_stride, o->len);
    }
    for (size_t p = 0; p < P; p++)
        for (size_t i = 0; i < PP; i++) {
            size_t r = i / RP, c = i % RP;
            uint16_t want = r < R && c < C ? src[(p * R + r) * C + c] : 0;
            assert_int_equal(dst[p * PP + i], want);
        }
    /* READ: the same bytes, seen from the target */
    assert_int_equal(ferry_exec_run_ops(&run, FERRY_OP_READ, sb, db, 3, 9, &ops, &n, &cap), 0);
    assert_int_equal(n, 2 * P);
    for (size_t k = 0; k < P; k++) {
        const ferry_op *w = &ops[k], *r = &ops[P + k];
        assert_int_equal(r->opcode, FERRY_OP_READ);
        assert_ptr_equal(r->local, (void *)(uintptr_t)w->remote_addr);
        assert_int_equal(r->remote_addr, (uint64_t)(uintptr_t)w->local);
        assert_int_equal(r->local_stride, w->remote_stride);
        assert_int_equal(r->remote_stride, w->local_stride);
        assert_int_equal(r->count, w->count);
    }
    assert_int_equal(ferry_exec_run_ops(&run, FERRY_OP_NOTIFY, sb, db, 3, 9, &ops, &n, &cap),
                     FERRY_EINVAL);
    assert_int_equal(n, 2 * P);
    free(ops);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_ops),
        cmocka_unit_test_setup_teardown(test_store_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_read_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
