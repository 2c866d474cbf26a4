/* Publishing generations from four trainer processes against a real
 * master and node: every tensor stored once by its assigned rank,
 * converted to bf16, announced with one CAS and read back bit-exactly; a
 * trainer that dies mid-publish leaves no announcement and no objects, the
 * previous generation stays active and every live rank gets an error;
 * retention keeps two generations; a corrupted tensor is named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/ftgroup.h"
#include "ferry/weights.h"

#define WORLD 4
#define NT 12

static const uint64_t shapes[NT][2] = {
    {512, 256}, {256, 256}, {1024, 64}, {64, 64}, {4096, 1}, {300, 7},
    {128, 512}, {1, 1}, {777, 33}, {256, 128}, {2048, 16}, {512, 512},
};

static float value(uint64_t gen, size_t t, uint64_t i)
{
    return (float)((gen * 7 + t * 3 + i) % 200);   /* exact in bf16 */
}

static ferry_weight_tensor *make_tensors(uint64_t gen, char names[NT][32])
{
    ferry_weight_tensor *t = calloc(NT, sizeof *t);
    for (size_t k = 0; k < NT; k++) {
        snprintf(names[k], 32, "layers.%zu.weight", k);
        uint64_t n = shapes[k][0] * shapes[k][1];
        float *d = malloc(n * sizeof *d);
        for (uint64_t i = 0; i < n; i++)
            d[i] = value(gen, k, i);
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = "f32", .ndim = 2,
                                      .shape = { shapes[k][0], shapes[k][1] }, .data = d };
    }
    return t;
}

static void free_tensors(ferry_weight_tensor *t)
{
    for (size_t k = 0; k < NT; k++)
        free((void *)t[k].data);
    free(t);
}

/* ---- a trainer process ------------------------------------------------------------- */

static int trainer_main(char **argv)
{
    const char *addr = argv[0];
    uint32_t rank = (uint32_t)atoi(argv[1]);
    uint64_t gen = strtoull(argv[2], NULL, 10);
    bool die = !strcmp(argv[3], "die");
    ferry_store *s = NULL;
    if (ftg_worker_store(addr, &s) < 0)
        return 1;
    char names[NT][32];
    ferry_weight_tensor *t = make_tensors(gen, names);
    static const uint32_t rank_node[WORLD] = {0, 0, 1, 1};
    if (die) {
        /* Store one object of the generation, then die before the barrier. */
        char key[256];
        ferry_weights_key("tiny", gen, names[0], key, sizeof key);
        (void)ferry_store_put(s, key, t[0].data, 1024, NULL, NULL);
        fflush(stdout);
        _exit(3);
    }
    ferry_publisher_config pc = { .model = "tiny", .rank = rank, .world = WORLD,
                                  .rank_node = rank_node, .out_dtype = "bf16", .keep = 2,
                                  .timeout_ms = 1500 };
    ferry_publish_stats st;
    ferry_error err = {0};
    int rc = ferry_publish(s, &pc, gen, t, NT, &st, &err);
    if (rc == 0)
        printf("OK %llu %llu\n", (unsigned long long)st.tensors, (unsigned long long)st.bytes);
    else
        printf("ERR %d %s\n", rc, err.msg);
    fflush(stdout);
    free_tensors(t);
    ferry_store_close(s);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------ */

/* The arguments of trainer_main after the rank. */
typedef struct round_opts { const char *addr; char gen[32]; int die_rank; } round_opts;

static void trainer_args(const void *ctx, int rank, ftg_args *a)
{
    const round_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { "--trainer", o->addr, a->buf[0], o->gen, rank == o->die_rank ? "die" : "ok",
                        NULL };
    memcpy(a->argv, v, sizeof v);
}

/* Run one publish round: rank die_rank (-1: none) dies; returns how many
 * said OK and copies the first error line. */
static int round_of(ftg_env *f, uint64_t gen, int die_rank, char *first_err, size_t cap)
{
    round_opts o = { .addr = f->c.addr, .die_rank = die_rank };
    snprintf(o.gen, sizeof o.gen, "%llu", (unsigned long long)gen);
    assert_int_equal(ftg_spawn(f, WORLD, trainer_args, &o, -1, NULL), 0);
    int ok = ftg_collect(f, 30000, die_rank);
    first_err[0] = 0;
    for (int k = 0; k < WORLD && !first_err[0]; k++)
        if (f->rc[k] != 0 && f->line[k][0])
            snprintf(first_err, cap, "%s", f->line[k]);
    ftg_stop(f);   /* each has exited or does within 10 s; else SIGKILL */
    return ok;
}

static void check_generation(ftg_env *f, uint64_t gen)
{
    uint64_t active = 0;
    uint8_t dg[16];
    assert_int_equal(ferry_weights_active(f->s, "tiny", &active, dg), 0);
    assert_int_equal(active, gen);
    ferry_weight_manifest m;
    ferry_error err = {0};
    assert_int_equal(ferry_weights_manifest(f->s, "tiny", gen, &m, &err), 0);
    assert_int_equal(m.n, NT);
    assert_memory_equal(m.digest, dg, 16);
    uint32_t publishers = 0;
    for (size_t k = 0; k < NT; k++) {
        const ferry_weight_entry *e = &m.entries[k];
        char name[32];
        snprintf(name, sizeof name, "layers.%zu.weight", k);
        assert_string_equal(e->name, name);
        assert_string_equal(e->dtype, "bf16");
        assert_int_equal(e->bytes, shapes[k][0] * shapes[k][1] * 2);
        publishers |= 1u << e->publisher;
        uint16_t *b = malloc(e->bytes);
        assert_int_equal(ferry_weights_read(f->s, e, b, e->bytes, &err), 0);
        for (uint64_t i = 0; i < e->bytes / 2; i++) {
            float v;
            assert_int_equal(ferry_convert(&b[i], "bf16", &v, "f32", 1), 0);
            if (v != value(gen, k, i))
                fail_msg("gen %llu tensor %zu element %llu: %f", (unsigned long long)gen, k,
                         (unsigned long long)i, (double)v);
        }
        free(b);
    }
    assert_int_equal(publishers, 0xf);   /* the work was spread over every rank */
    /* A corrupted byte (here: a checksum that does not match) names the tensor. */
    ferry_weight_entry bad = m.entries[3];
    bad.checksum ^= 1;
    uint8_t tmp[64 * 64 * 2];
    assert_int_equal(ferry_weights_read(f->s, &bad, tmp, sizeof tmp, &err), FERRY_ECORRUPT);
    assert_non_null(strstr(err.msg, "layers.3.weight"));
    ferry_weight_manifest_free(&m);
}


/* A rollout worker holding rows [half*R/2, (half+1)*R/2) of every tensor
 * (TP along dim 0), stored with a padded row pitch, updated parameter-direct;
 * and the same generation through the compatibility path. */
typedef struct compat_ctx { uint64_t gen; size_t seen; bool bad; } compat_ctx;

static int on_tensor(void *ctx, const ferry_weight_entry *e, const void *data)
{
    compat_ctx *c = ctx;
    size_t k = (size_t)atoi(e->name + 7);
    const uint16_t *b = data;
    for (uint64_t i = 0; i < e->bytes / 2; i++) {
        float v;
        ferry_convert(&b[i], "bf16", &v, "f32", 1);
        c->bad |= v != value(c->gen, k, i);
    }
    c->seen++;
    return 0;
}

static void update_worker(ferry_store *s, uint64_t *cur, uint64_t want_gen, int half)
{
    ferry_param_shard sh[NT];
    uint16_t *buf[NT];
    for (size_t k = 0; k < NT; k++) {
        uint64_t rows = shapes[k][0] / 2 + (half ? shapes[k][0] % 2 : 0);
        uint64_t pitch = shapes[k][1] + 3;   /* padded rows: strided destination */
        buf[k] = calloc(rows * pitch + 1, 2);
        sh[k] = (ferry_param_shard){ .tensor = NULL, .ndim = 2,
                                     .offset = { half ? shapes[k][0] / 2 : 0, 0 },
                                     .shape = { rows, shapes[k][1] },
                                     .strides = { (int64_t)pitch, 1 }, .dst = buf[k] };
    }
    char names[NT][32];
    for (size_t k = 0; k < NT; k++) {
        snprintf(names[k], 32, "layers.%zu.weight", k);
        sh[k].tensor = names[k];
    }
    ferry_update_stats st;
    ferry_error err = {0};
    uint64_t g = *cur;
    assert_int_equal(ferry_weights_update_direct(s, "tiny", &g, sh, NT, &st, &err), 0);
    assert_int_equal(g, want_gen);
    uint64_t demand = 0;
    for (size_t k = 0; k < NT; k++) {
        uint64_t pitch = shapes[k][1] + 3;
        demand += sh[k].shape[0] * sh[k].shape[1] * 2;
        for (uint64_t r = 0; r < sh[k].shape[0]; r++)
            for (uint64_t c = 0; c < shapes[k][1]; c++) {
                float v;
                ferry_convert(&buf[k][r * pitch + c], "bf16", &v, "f32", 1);
                uint64_t gi = (sh[k].offset[0] + r) * shapes[k][1] + c;
                if (v != value(want_gen, k, gi))
                    fail_msg("direct: tensor %zu row %llu col %llu", k, (unsigned long long)r,
                             (unsigned long long)c);
            }
        for (uint64_t r = 0; r < sh[k].shape[0]; r++)   /* padding untouched */
            for (uint64_t c = shapes[k][1]; c < pitch; c++)
                assert_int_equal(buf[k][r * pitch + c], 0);
        free(buf[k]);
    }
    assert_int_equal(st.bytes_read, demand);   /* exactly its demand */
    *cur = g;
    /* Already current: nothing is read. */
    assert_int_equal(ferry_weights_update_direct(s, "tiny", &g, sh, 0, &st, &err), 0);
    assert_int_equal(st.bytes_read, 0);
    compat_ctx cc = { .gen = want_gen };
    uint64_t g2 = 0;
    assert_int_equal(ferry_weights_update_compat(s, "tiny", &g2, on_tensor, &cc, &st, &err), 0);
    assert_int_equal(g2, want_gen);
    assert_int_equal(cc.seen, NT);
    assert_false(cc.bad);
}

static size_t objects_of(ftg_env *f, uint64_t gen)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "ferry/w/tiny/%020llu/", (unsigned long long)gen);
    char **keys = NULL;
    size_t n = 0;
    assert_int_equal(ferry_store_list(f->s, prefix, NULL, 1000, &keys, &n, NULL), 0);
    ferry_store_free(keys);
    return n;
}

static void test_publish_generations(void **state)
{
    ftg_env *f = *state;
    char e[1024];
    assert_int_equal(round_of(f, 1, -1, e, sizeof e), WORLD);
    check_generation(f, 1);
    assert_int_equal(objects_of(f, 1), NT);
    uint64_t w0 = 0, w1 = 0;
    update_worker(f->s, &w0, 1, 0);
    update_worker(f->s, &w1, 1, 1);

    /* Rank 3 dies mid-publish: no announcement, nothing left, errors. */
    assert_int_equal(round_of(f, 2, 3, e, sizeof e), 0);
    fprintf(stderr, "live ranks said: %s\n", e);
    assert_non_null(strstr(e, "generation 2 failed"));
    check_generation(f, 1);
    assert_int_equal(objects_of(f, 2), 0);

    /* Two more generations: the first one is retired (keep 2). */
    assert_int_equal(round_of(f, 3, -1, e, sizeof e), WORLD);
    assert_int_equal(round_of(f, 4, -1, e, sizeof e), WORLD);
    check_generation(f, 4);
    assert_int_equal(objects_of(f, 1), 0);
    assert_int_equal(objects_of(f, 3), NT);
    assert_int_equal(objects_of(f, 4), NT);
    /* An older generation cannot be published over a newer one, and the
     * refusal leaves the stored generation alone. */
    assert_int_equal(round_of(f, 3, -1, e, sizeof e), 0);
    assert_non_null(strstr(e, "not newer"));
    assert_int_equal(objects_of(f, 3), NT);
    /* Workers on generation 1 catch up; a new worker loads the active one;
     * nothing is republished. */
    update_worker(f->s, &w0, 4, 0);
    uint64_t fresh = 0;
    update_worker(f->s, &fresh, 4, 1);

    /* The node holding the generation dies: prepare fails before any
     * parameter is touched and the worker stays on its generation. */
    ft_proc_kill(&f->c.node[0], 9);
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    char key[256];
    ferry_weights_key("tiny", 4, "layers.0.weight", key, sizeof key);
    int ex = 1;
    for (int i = 0; i < 1000 && ex != FERRY_ELOST; i++) {
        ex = ferry_store_exist(f->s, key);
        if (ex != FERRY_ELOST)
            nanosleep(&ts, NULL);
    }
    assert_int_equal(ex, FERRY_ELOST);
    uint16_t dst[64 * 64];
    memset(dst, 0, sizeof dst);
    ferry_param_shard one = { .tensor = "layers.3.weight", .ndim = 2, .shape = { 64, 64 },
                              .dst = dst };
    uint64_t g = 3;
    ferry_error err = {0};
    assert_int_equal(ferry_weights_update_direct(f->s, "tiny", &g, &one, 1, NULL, &err),
                     FERRY_ELOST);
    assert_int_equal(g, 3);
    assert_non_null(strstr(err.msg, "not whole"));
    for (size_t i = 0; i < 64 * 64; i++)
        assert_int_equal(dst[i], 0);
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "--trainer"))
        return trainer_main(argv + 2);
    ft_token();
    /* the node's death below is noticed in 2.5 s */
    static const char *const master_hb[] = { "--heartbeat-timeout", "2500", NULL };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(test_publish_generations, ftg_setup, ftg_teardown,
                                                 (void *)master_hb),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
