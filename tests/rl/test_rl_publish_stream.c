/* Publishing as a stream (ferry_publish_stream_*): two trainer ranks, each
 * a thread with its own store client, add the same tensors in the same
 * order from one buffer each that is refilled for every tensor (so
 * nothing of a tensor survives its add but what was stored):
 *  - 600 MB of bf16 tensors: every byte read back equal, the stored bytes
 *    balanced (no rank above the mean plus the largest tensor), and no
 *    rank ever holding more than one object (256 MiB) — less than its
 *    share of the model;
 *  - f32 tensors published as bf16: the conversion's bytes;
 *  - a rank whose add fails (a dtype it cannot convert): end fails on both
 *    ranks with that rank's reason, nothing is announced and no object of
 *    the generation is left;
 *  - the two ranks adding different tensors: refused on both, naming it;
 *  - a generation that is not newer: refused at begin. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "util/ftgroup.h"
#include "util/ftstore.h"

#define MB (1ull << 20)
#define WORLD 2

typedef struct fixture { ft_cluster c; ferry_store *s; } fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    if (ft_solo_open(&f->c, &f->s, 800 * MB, NULL) != 0) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (f) {
        ft_solo_close(&f->c, &f->s);
        free(f);
    }
    return 0;
}

/* The model of a case: nt tensors of rows x cols, held as dtype. */
typedef struct model {
    const char *dtype, *out;
    size_t nt;
    uint64_t rows, cols;
    const char *bad_dtype;    /* rank 1 adds tensor 1 as this dtype (NULL: no) */
    bool rank1_renames;       /* rank 1 names tensor 2 differently */
} model;

static uint16_t bits(uint64_t gen, size_t t, uint64_t i)
{
    return (uint16_t)((gen * 131 + t * 7919 + i * 2654435761u) >> 3) & 0x7f7f;
}

static float fval(uint64_t gen, size_t t, uint64_t i)
{
    return (float)((gen * 31 + t * 17 + i) % 1000) * 0.25f - 100.0f;
}

static void fill(void *buf, const model *m, uint64_t gen, size_t t)
{
    uint64_t n = m->rows * m->cols;
    if (!strcmp(m->dtype, "f32"))
        for (uint64_t i = 0; i < n; i++)
            ((float *)buf)[i] = fval(gen, t, i);
    else
        for (uint64_t i = 0; i < n; i++)
            ((uint16_t *)buf)[i] = bits(gen, t, i);
}

typedef struct rank_arg {
    const char *addr;
    const model *m;
    uint64_t gen;
    uint32_t rank;
    int rc, add_rc;
    uint64_t held, stored;
    char msg[1024];
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    ferry_store *s = NULL;
    a->rc = -1;
    if (ftg_worker_store(a->addr, &s) < 0)
        return NULL;
    ferry_publisher_config pc = { .model = "stream", .rank = a->rank, .world = WORLD, .keep = 2,
                                  .timeout_ms = 60000 };
    snprintf(pc.out_dtype, sizeof pc.out_dtype, "%s", a->m->out);
    ferry_error err = {0};
    ferry_publish_stream *ps = NULL;
    a->rc = ferry_publish_stream_begin(s, &pc, a->gen, &ps, &err);
    if (a->rc < 0) {
        snprintf(a->msg, sizeof a->msg, "%s", err.msg);
        ferry_store_close(s);
        return NULL;
    }
    size_t isz = !strcmp(a->m->dtype, "f32") ? 4 : 2;
    void *buf = malloc(a->m->rows * a->m->cols * isz);   /* one tensor at a time, refilled */
    for (size_t t = 0; t < a->m->nt && buf; t++) {
        char name[48];
        snprintf(name, sizeof name, "layer.%zu.weight", t);
        if (a->rank == 1 && t == 2 && a->m->rank1_renames)
            snprintf(name, sizeof name, "layer.%zu.other", t);
        fill(buf, a->m, a->gen, t);
        ferry_weight_tensor wt = { .name = name, .dtype = a->m->dtype, .ndim = 2,
                                   .shape = { a->m->rows, a->m->cols }, .data = buf };
        if (a->rank == 1 && t == 1 && a->m->bad_dtype)
            wt.dtype = a->m->bad_dtype;
        ferry_error ae = {0};
        int rc = ferry_publish_stream_add(ps, &wt, &ae);
        if (rc < 0 && !a->add_rc)
            a->add_rc = rc;
        memset(buf, 0xee, a->m->rows * a->m->cols * isz);   /* what add kept is not this */
    }
    a->held = ferry_publish_stream_held(ps);
    ferry_publish_stats st;
    a->rc = ferry_publish_stream_end(ps, &st, &err);
    a->stored = st.bytes;
    snprintf(a->msg, sizeof a->msg, "%s", a->rc ? err.msg : "");
    free(buf);
    ferry_store_close(s);
    return NULL;
}

static void run(fixture *f, const model *m, uint64_t gen, rank_arg a[WORLD])
{
    pthread_t th[WORLD];
    for (uint32_t r = 0; r < WORLD; r++) {
        a[r] = (rank_arg){ .addr = f->c.addr, .m = m, .gen = gen, .rank = r };
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (uint32_t r = 0; r < WORLD; r++) {
        pthread_join(th[r], NULL);
        fprintf(stderr, "generation %llu rank %u: rc %d, add %d, held %llu, stored %llu: %s\n",
                (unsigned long long)gen, r, a[r].rc, a[r].add_rc, (unsigned long long)a[r].held,
                (unsigned long long)a[r].stored, a[r].msg);
    }
}

/* Every tensor of the active generation read back equal to what was added. */
static void check_read(fixture *f, const model *m, uint64_t gen)
{
    ferry_weight_manifest wm = {0};
    ferry_error err = {0};
    assert_int_equal(ferry_weights_manifest(f->s, "stream", gen, &wm, &err), 0);
    assert_int_equal(wm.n, m->nt);
    uint64_t n = m->rows * m->cols;
    uint16_t *got = malloc(n * 2), *want = malloc(n * 2);
    float *src = malloc(n * 4);
    assert_non_null(got);
    assert_non_null(want);
    assert_non_null(src);
    for (size_t t = 0; t < m->nt; t++) {
        char name[48];
        snprintf(name, sizeof name, "layer.%zu.weight", t);
        const ferry_weight_entry *e = NULL;
        for (size_t i = 0; i < wm.n && !e; i++)
            if (!strcmp(wm.entries[i].name, name))
                e = &wm.entries[i];
        assert_non_null(e);
        assert_string_equal(e->dtype, "bf16");
        assert_int_equal(ferry_weights_read(f->s, e, got, n * 2, &err), 0);
        if (!strcmp(m->dtype, "f32")) {
            fill(src, m, gen, t);
            assert_int_equal(ferry_convert(src, "f32", want, "bf16", n), 0);
        } else {
            fill(want, m, gen, t);
        }
        assert_memory_equal(got, want, n * 2);
    }
    free(got);
    free(want);
    free(src);
    ferry_weight_manifest_free(&wm);
}

static size_t objects_of(fixture *f, uint64_t gen)
{
    char prefix[300];
    int kl = ferry_weights_key("stream", gen, "x", prefix, sizeof prefix);
    prefix[kl - 1] = '\0';
    char **keys = NULL;
    size_t nk = 0;
    assert_int_equal(ferry_store_list(f->s, prefix, NULL, 1000, &keys, &nk, NULL, NULL), 0);
    ferry_store_free(keys);
    return nk;
}

static void test_stream(void **state)
{
    fixture *f = *state;
    rank_arg a[WORLD];
    /* 600 MB: 10 tensors of 60 MB, 5 to each rank, 2 objects each */
    const model big = { .dtype = "bf16", .out = "", .nt = 10, .rows = 7680, .cols = 3906 };
    run(f, &big, 1, a);
    uint64_t total = 0, largest = big.rows * big.cols * 2;
    for (int r = 0; r < WORLD; r++) {
        assert_int_equal(a[r].rc, 0);
        total += a[r].stored;
    }
    assert_int_equal(total, big.nt * largest);
    for (int r = 0; r < WORLD; r++) {
        assert_true(a[r].stored <= total / WORLD + largest);   /* balanced */
        assert_true(a[r].held <= FR_GEN_OBJECT_MAX);           /* one object at a time */
        assert_true(a[r].held < a[r].stored);                  /* less than its share */
    }
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(f->s, "stream", &active, NULL, NULL), 0);
    assert_int_equal(active, 1);
    check_read(f, &big, 1);

    /* f32 published as bf16 */
    const model conv = { .dtype = "f32", .out = "bf16", .nt = 5, .rows = 300, .cols = 257 };
    run(f, &conv, 2, a);
    for (int r = 0; r < WORLD; r++)
        assert_int_equal(a[r].rc, 0);
    check_read(f, &conv, 2);

    /* rank 1 cannot convert one of its tensors: both fail with its reason,
     * nothing announced, no object of generation 3 left */
    const model bad = { .dtype = "f32", .out = "bf16", .nt = 5, .rows = 300, .cols = 257,
                        .bad_dtype = "u8" };
    run(f, &bad, 3, a);
    assert_int_equal(a[1].add_rc, FERRY_EINVAL);
    for (int r = 0; r < WORLD; r++) {
        assert_int_equal(a[r].rc, FERRY_EINVAL);
        assert_non_null(strstr(a[r].msg, "rank 1"));
        assert_non_null(strstr(a[r].msg, "cannot convert u8"));
    }
    assert_int_equal(ferry_weights_active(f->s, "stream", &active, NULL, NULL), 0);
    assert_int_equal(active, 2);
    assert_int_equal(objects_of(f, 3), 0);

    /* the ranks add different tensors: refused on both, naming it */
    const model differ = { .dtype = "bf16", .out = "", .nt = 4, .rows = 64, .cols = 64,
                           .rank1_renames = true };
    run(f, &differ, 4, a);
    for (int r = 0; r < WORLD; r++) {
        assert_int_not_equal(a[r].rc, 0);
        assert_non_null(strstr(a[r].msg, "publish of stream generation 4 failed"));
    }
    assert_int_equal(ferry_weights_active(f->s, "stream", &active, NULL, NULL), 0);
    assert_int_equal(active, 2);

    /* not newer than the active generation: refused at begin */
    run(f, &conv, 2, a);
    for (int r = 0; r < WORLD; r++) {
        assert_int_equal(a[r].rc, FERRY_EINVAL);
        assert_non_null(strstr(a[r].msg, "not newer"));
    }
    /* and the stream goes on */
    run(f, &conv, 5, a);
    for (int r = 0; r < WORLD; r++)
        assert_int_equal(a[r].rc, 0);
    check_read(f, &conv, 5);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stream, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
