/* Publishing generations from four trainer processes against a real
 * master and node: every tensor stored once by its assigned rank,
 * converted to bf16, announced with one CAS and read back bit-exactly; a
 * trainer that dies mid-publish leaves no announcement, the previous
 * generation stays active and every live rank gets the same error;
 * retention keeps two generations; a corrupted tensor is named. Failures:
 * a retried generation decides afresh; a coordinator that dies before or
 * during a publish leaves the others' objects removed and its own to the
 * retry or the next announcement; one rank's own failure fails every rank
 * at once with one message; after a node restart the active generation is
 * reported lost and a newer one publishes. */
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "rl/gen_int.h"
#include "rl/keys.h"
#include "util/ftgroup.h"
#include "util/ftstore.h"
#include "ferry/samples.h"
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

static const uint32_t rank_node[WORLD] = {0, 0, 1, 1};

/* The first tensor ferry_weights_assign gives this rank (bf16 sizes). */
static size_t first_of(uint32_t rank)
{
    uint64_t sizes[NT];
    uint32_t pub[NT];
    for (size_t k = 0; k < NT; k++)
        sizes[k] = shapes[k][0] * shapes[k][1] * 2;
    if (ferry_weights_assign(sizes, NT, rank_node, WORLD, pub, NULL) < 0)
        return 0;
    for (size_t k = 0; k < NT; k++)
        if (pub[k] == rank)
            return k;
    return 0;
}

/* Modes: ok; die (store one object under tensor 0's key, exit before the
 * barrier); die_own (store this rank's first tensor, exit before the
 * barrier); arrive_die (store this rank's first tensor, meet the others at
 * the publish barrier, exit before any decision: a coordinator that dies
 * during the publish); claim_die (the same, after claiming the decision
 * as a coordinator does before announcing); baddtype (this rank alone
 * passes an unknown dtype);
 * dupname (this rank alone names two tensors alike); abort (this rank
 * calls ferry_publish_abort instead of publishing). */
static int trainer_main(char **argv)
{
    const char *addr = argv[0], *mode = argv[3];
    uint32_t rank = (uint32_t)atoi(argv[1]);
    uint64_t gen = strtoull(argv[2], NULL, 10);
    uint64_t timeout = strtoull(argv[4], NULL, 10);
    ferry_store *s = NULL;
    if (ftg_worker_store(addr, &s) < 0)
        return 1;
    char names[NT][32];
    ferry_weight_tensor *t = make_tensors(gen, names);
    if (strstr(mode, "die")) {
        size_t k = !strcmp(mode, "die") ? 0 : first_of(rank);
        char key[FR_KEY_MAX];   /* what a rank dying mid-publish leaves: its first object */
        fr_key_gen_object(key, sizeof key, "tiny", gen, rank, 0);
        (void)ferry_store_put(s, key, t[k].data, 1024, NULL, NULL, NULL);
        if (!strcmp(mode, "arrive_die") || !strcmp(mode, "claim_die")) {
            char bk[128], member[32];
            snprintf(bk, sizeof bk, "ferry/wk/tiny/%020llu/parts", (unsigned long long)gen);
            snprintf(member, sizeof member, "rank %u", rank);
            uint64_t a = 0;
            (void)ferry_barrier(s, bk, member, WORLD, 30000, &a, NULL);
            if (!strcmp(mode, "claim_die")) {
                /* claim the decision (docs/weights.md, the status key), then die */
                char sk[128], sv[64];
                snprintf(sk, sizeof sk, "ferry/wk/tiny/%020llu/status", (unsigned long long)gen);
                snprintf(sv, sizeof sv, "%llu deciding", (unsigned long long)a);
                (void)ferry_kv_put(s, sk, sv, strlen(sv), NULL, NULL);
            }
        }
        fflush(stdout);
        _exit(3);
    }
    if (!strcmp(mode, "baddtype"))
        t[5].dtype = "q7";
    if (!strcmp(mode, "dupname"))
        t[3].name = t[2].name;   /* two tensors under one key */
    ferry_publisher_config pc = { .model = "tiny", .rank = rank, .world = WORLD,
                                  .rank_node = rank_node, .out_dtype = "bf16", .keep = 2,
                                  .timeout_ms = timeout };
    ferry_publish_stats st;
    ferry_error err = {0};
    int rc = !strcmp(mode, "abort")
                 ? ferry_publish_abort(s, &pc, gen, "the trainer's own check failed", &err)
                 : ferry_publish(s, &pc, gen, t, NT, &st, &err);
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
typedef struct round_opts {
    const char *addr;
    char gen[32], timeout[32];
    int odd_rank;              /* the rank that runs odd_mode (-1: none) */
    const char *odd_mode;
} round_opts;

static void trainer_args(const void *ctx, int rank, ftg_args *a)
{
    const round_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { "--trainer", o->addr, a->buf[0], o->gen,
                        rank == o->odd_rank ? o->odd_mode : "ok", o->timeout, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* Run one publish round: rank odd_rank (-1: none) runs odd_mode, the others
 * publish with timeout_ms; the replies are collected within it plus 30 s (a rank
 * that dies is skipped). Returns how many said OK and copies the first
 * error line. */
static int round_mode(ftg_env *f, uint64_t gen, int odd_rank, const char *odd_mode,
                      uint64_t timeout_ms, char *first_err, size_t cap)
{
    round_opts o = { .addr = f->c.addr, .odd_rank = odd_rank, .odd_mode = odd_mode };
    snprintf(o.gen, sizeof o.gen, "%llu", (unsigned long long)gen);
    snprintf(o.timeout, sizeof o.timeout, "%llu", (unsigned long long)timeout_ms);
    assert_int_equal(ftg_spawn(f, WORLD, trainer_args, &o, -1, NULL), 0);
    bool dies = odd_mode && strstr(odd_mode, "die");
    int ok = ftg_collect(f, (int)timeout_ms + 30000, dies ? odd_rank : -1);
    first_err[0] = 0;
    for (int k = 0; k < WORLD && !first_err[0]; k++)
        if (f->rc[k] != 0 && f->line[k][0])
            snprintf(first_err, cap, "%s", f->line[k]);
    ftg_stop(f);   /* each has exited or does within 10 s; else SIGKILL */
    return ok;
}

/* The same with rank die_rank (-1: none) dying before the barrier. A round
 * in which every rank takes part gets a generous deadline (under four CPU
 * hogs a healthy round once missed 1500 ms: "not every trainer rank
 * arrived"); one with a dying rank a short one, since the others must wait
 * it out. */
static int round_of(ftg_env *f, uint64_t gen, int die_rank, char *first_err, size_t cap)
{
    return round_mode(f, gen, die_rank, "die", die_rank < 0 ? 60000 : 1500, first_err, cap);
}

/* Every rank that replied (all but skip) printed the same line. */
static void same_lines(const ftg_env *f, int skip)
{
    int first = skip == 0 ? 1 : 0;
    for (int k = 0; k < WORLD; k++) {
        if (k == skip)
            continue;
        fprintf(stderr, "  rank %d: %s\n", k, f->line[k]);
        if (strcmp(f->line[k], f->line[first]) != 0)
            fail_msg("rank %d said \"%s\", rank %d \"%s\"", k, f->line[k], first, f->line[first]);
    }
}

static void check_generation(ftg_env *f, uint64_t gen)
{
    uint64_t active = 0;
    uint8_t dg[16];
    assert_int_equal(ferry_weights_active(f->s, "tiny", &active, dg, NULL), 0);
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
        int rrc = ferry_weights_read(f->s, e, b, e->bytes, &err);
        if (rrc != 0)
            fail_msg("reading %s: %s", e->name, err.msg);
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
    /* A corrupted byte of a piece names the tensor and the piece: what a
     * reader checks after every read (and a compatibility receiver after
     * every tensor). */
    uint8_t tmp[64 * 64 * 2];
    assert_int_equal(ferry_weights_read(f->s, &m.entries[3], tmp, sizeof tmp, &err), 0);
    tmp[5] ^= 0x40;
    assert_int_equal(fr_gen_verify_tensor(f->s, fr_gen_of(&m), 3, tmp, &err), FERRY_ECORRUPT);
    assert_non_null(strstr(err.msg, "layers.3.weight"));
    assert_non_null(strstr(err.msg, "checksum"));
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
    int urc = ferry_weights_update_direct(s, "tiny", &g, sh, NT, &st, &err);
    if (urc != 0)
        fail_msg("update_direct: %d %s", urc, err.msg);
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
    assert_int_equal(ferry_store_list(f->s, prefix, NULL, 1000, &keys, &n, NULL, NULL), 0);
    ferry_store_free(keys);
    return n;
}

/* Objects of a whole generation: every rank's packed objects, checksums
 * and declaration, and the placement. */
static size_t full_objects(ftg_env *f, uint64_t gen)
{
    fr_gen *g = NULL;
    assert_int_equal(fr_gen_load(f->s, "tiny", gen, &g, NULL), 0);
    size_t n = 1;
    for (uint32_t r = 0; r < g->nranks; r++)
        n += g->ranks[r].nobjects + 2;
    fr_gen_free(g);
    return n;
}

static void test_publish_generations(void **state)
{
    ftg_env *f = *state;
    char e[1024];
    assert_int_equal(round_of(f, 1, -1, e, sizeof e), WORLD);
    check_generation(f, 1);
    assert_int_equal(objects_of(f, 1), full_objects(f, 1));
    uint64_t w0 = 0, w1 = 0;
    update_worker(f->s, &w0, 1, 0);
    update_worker(f->s, &w1, 1, 1);

    /* Rank 3 dies mid-publish: no announcement, errors; the live ranks
     * removed what they stored (what the dead one stored, if its put beat
     * the owner's, stays until the next announcement). */
    assert_int_equal(round_of(f, 2, 3, e, sizeof e), 0);
    fprintf(stderr, "live ranks said: %s\n", e);
    assert_non_null(strstr(e, "generation 2 failed"));
    check_generation(f, 1);
    assert_true(objects_of(f, 2) <= 1);

    /* Two more generations: the first one is retired (keep 2); nothing of
     * the failed generation 2 is left. */
    assert_int_equal(round_of(f, 3, -1, e, sizeof e), WORLD);
    assert_int_equal(objects_of(f, 2), 0);
    assert_int_equal(round_of(f, 4, -1, e, sizeof e), WORLD);
    check_generation(f, 4);
    assert_int_equal(objects_of(f, 1), 0);
    assert_int_equal(objects_of(f, 3), full_objects(f, 3));
    assert_int_equal(objects_of(f, 4), full_objects(f, 4));
    /* An older generation cannot be published over a newer one, and the
     * refusal leaves the stored generation alone. */
    assert_int_equal(round_of(f, 3, -1, e, sizeof e), 0);
    assert_non_null(strstr(e, "not newer"));
    assert_int_equal(objects_of(f, 3), full_objects(f, 3));
    /* Workers on generation 1 catch up; a new worker loads the active one;
     * nothing is republished. */
    update_worker(f->s, &w0, 4, 0);
    uint64_t fresh = 0;
    update_worker(f->s, &fresh, 4, 1);

    /* The node holding the generation dies: prepare fails before any
     * parameter is touched and the worker stays on its generation. */
    ft_proc_kill(&f->c.node[0], 9);
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    char key[FR_KEY_MAX];
    fr_key_gen_object(key, sizeof key, "tiny", 4, 0, 0);   /* rank 0's first object */
    int ex = 1;
    for (int i = 0; i < 1000 && ex != FERRY_ELOST; i++) {
        ex = ferry_store_exist(f->s, key, NULL);
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

/* A failed attempt leaves a decision behind: retrying the same generation
 * must give every rank the retry's decision, not the old one. */
static void test_publish_retry_after_failure(void **state)
{
    ftg_env *f = *state;
    char e[1024];
    assert_int_equal(round_of(f, 1, -1, e, sizeof e), WORLD);
    /* Rank 3 dies before the barrier: every live rank fails alike. */
    assert_int_equal(round_of(f, 2, 3, e, sizeof e), 0);
    same_lines(f, 3);
    assert_non_null(strstr(e, "publish of tiny generation 2 failed: not every trainer rank "
                              "arrived within 1500 ms"));
    assert_null(strstr(e, "failed: failed"));
    check_generation(f, 1);
    /* The retry of generation 2: every rank announces. */
    assert_int_equal(round_of(f, 2, -1, e, sizeof e), WORLD);
    check_generation(f, 2);
    assert_int_equal(objects_of(f, 2), full_objects(f, 2));
}

/* A coordinator that dies before or during a publish: the other ranks
 * remove what they stored and fail alike; the retry replaces what the
 * coordinator left; the next announcement removes the objects of a
 * generation that was never announced. */
static void test_publish_coordinator_dies(void **state)
{
    ftg_env *f = *state;
    char e[1024];
    assert_int_equal(round_of(f, 1, -1, e, sizeof e), WORLD);
    /* Rank 0 stores its first tensor, then dies before the barrier. */
    assert_int_equal(round_mode(f, 2, 0, "die_own", 1500, e, sizeof e), 0);
    same_lines(f, 0);
    assert_non_null(strstr(e, "generation 2 failed: not every trainer rank arrived"));
    assert_int_equal(objects_of(f, 2), 1);   /* only the dead rank's own object */
    check_generation(f, 1);
    /* The retry replaces the dead rank's leftover and announces. */
    assert_int_equal(round_of(f, 2, -1, e, sizeof e), WORLD);
    check_generation(f, 2);
    /* Rank 0 meets the others at the barrier and dies before deciding. */
    assert_int_equal(round_mode(f, 3, 0, "arrive_die", 1500, e, sizeof e), 0);
    same_lines(f, 0);
    assert_non_null(strstr(e, "generation 3 failed: the coordinator (rank 0) gave no decision "
                              "within 1500 ms"));
    assert_int_equal(objects_of(f, 3), 1);
    check_generation(f, 2);
    /* The same, rank 0 dying after claiming the decision, before announcing. */
    assert_int_equal(round_mode(f, 3, 0, "claim_die", 1500, e, sizeof e), 0);
    same_lines(f, 0);
    assert_non_null(strstr(e, "generation 3 failed: the coordinator (rank 0) gave no decision "
                              "within 1500 ms"));
    assert_int_equal(objects_of(f, 3), 1);
    check_generation(f, 2);
    /* Generation 4 is announced: generation 3 never was and never can be,
     * so its leftover goes; 2 stays (keep 2). */
    assert_int_equal(round_of(f, 4, -1, e, sizeof e), WORLD);
    check_generation(f, 4);
    assert_int_equal(objects_of(f, 3), 0);
    assert_int_equal(objects_of(f, 2), full_objects(f, 2));
    assert_int_equal(objects_of(f, 1), 0);
}

/* One rank fails before it stores anything (a check of its own): every
 * rank fails at once (the others wait up to a minute otherwise) with the
 * same code and message, naming the rank and the reason. */
static void test_publish_one_rank_fails(void **state)
{
    ftg_env *f = *state;
    char e[1024];
    assert_int_equal(round_mode(f, 1, 2, "baddtype", 60000, e, sizeof e), 0);
    same_lines(f, -1);
    char want[128];
    snprintf(want, sizeof want, "ERR %d publish of tiny generation 1 failed: rank 2: tensor "
             "layers.5.weight", FERRY_EINVAL);
    assert_non_null(strstr(e, want));
    assert_int_equal(objects_of(f, 1), 0);
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(f->s, "tiny", &active, NULL, NULL), FERRY_ENOENT);
    /* The same through ferry_publish_abort (what the Python wrapper calls
     * when its own checks fail). */
    assert_int_equal(round_mode(f, 1, 1, "abort", 60000, e, sizeof e), 0);
    same_lines(f, -1);
    snprintf(want, sizeof want, "ERR %d publish of tiny generation 1 failed: rank 1: the "
             "trainer's own check failed", FERRY_EINVAL);
    assert_string_equal(e, want);
    assert_int_equal(objects_of(f, 1), 0);
    /* Two tensors of one name (one key) are refused, not overwritten. */
    assert_int_equal(round_mode(f, 1, 3, "dupname", 60000, e, sizeof e), 0);
    same_lines(f, -1);
    snprintf(want, sizeof want, "ERR %d publish of tiny generation 1 failed: rank 3: tensor "
             "layers.2.weight is named twice", FERRY_EINVAL);
    assert_string_equal(e, want);
    assert_int_equal(objects_of(f, 1), 0);
    /* Then the generation publishes. */
    assert_int_equal(round_mode(f, 1, -1, NULL, 60000, e, sizeof e), WORLD);
    check_generation(f, 1);
}

/* The node restarts (stopped cleanly: its segment is unmounted and every
 * object of the active generation is lost; a new node comes up empty): the
 * active generation is reported lost, not current, and a newer generation
 * publishes. */
static void test_publish_after_node_restart(void **state)
{
    ftg_env *f = *state;
    char e[1024];
    assert_int_equal(round_of(f, 1, -1, e, sizeof e), WORLD);
    check_generation(f, 1);
    ft_proc_kill(&f->c.node[0], SIGTERM);
    assert_int_equal(ft_node_start(&f->c, 0, 64u << 20, NULL, NULL), 0);
    char key[256];
    ferry_weights_key("tiny", 1, "layers.0.weight", key, sizeof key);
    int ex = 1;
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    for (int i = 0; i < 1000 && ex == 1; i++) {   /* deadline 20 s */
        ex = ferry_store_exist(f->s, key, NULL);
        if (ex == 1)
            nanosleep(&ts, NULL);
    }
    assert_int_not_equal(ex, 1);
    uint64_t active = 0;
    uint8_t dg[16];
    assert_int_equal(ferry_weights_active(f->s, "tiny", &active, dg, NULL), FERRY_ELOST);
    assert_int_equal(active, 1);   /* the number stays known: the next one must be newer */
    ferry_weights_status ws;
    ferry_error err = {0};
    assert_int_equal(ferry_weights_active_status(f->s, "tiny", &ws, &err), FERRY_ELOST);
    fprintf(stderr, "status: %s\n", err.msg);
    assert_int_equal(ws.generation, 1);
    assert_true(ws.lost);
    assert_int_equal(ws.segments, 1);
    assert_int_equal(ws.lost_segments, 1);
    assert_non_null(strstr(err.msg, "generation 1 of tiny is lost"));
    ferry_policy_version pv;
    assert_int_equal(ferry_policy_current(f->s, "tiny", &pv, &err), FERRY_ELOST);
    assert_non_null(strstr(err.msg, "generation 1 of tiny is lost"));
    /* The lost number is not reused; the next one publishes onto the new node. */
    assert_int_equal(round_of(f, 1, -1, e, sizeof e), 0);
    assert_non_null(strstr(e, "not newer"));
    assert_int_equal(round_of(f, 2, -1, e, sizeof e), WORLD);
    check_generation(f, 2);
    assert_int_equal(ferry_weights_active_status(f->s, "tiny", &ws, &err), 0);
    assert_false(ws.lost);
    assert_int_equal(ws.lost_segments, 0);
    assert_int_equal(ferry_policy_current(f->s, "tiny", &pv, &err), 0);
    assert_int_equal(pv.version, 2);
    ferry_policy_version_clear(&pv);
}

/* A publisher faster than its readers' leases: the segment holds two
 * generations, keep = 1, and a reader leases each generation it takes
 * (for 400 ms). Generation 3 finds the segment full of the active
 * generation and the retired, still leased, generation 1: it waits for
 * that lease to lapse, removes it and publishes; a streamed generation
 * the same. With a lease longer than
 * half the publisher's timeout it fails with FERRY_ENOSPC instead, nothing
 * announced, and the active generation stays loadable. */
enum { FULL_ELEMS = 1 << 20 };   /* 4 MiB of f32 per generation */

static int publish_full(ferry_store *s, uint64_t gen, uint64_t timeout_ms, float *data,
                        ferry_error *err);

/* The same generation through the streaming publish (each tensor handed
 * over as it comes). */
static int stream_full(ferry_store *s, uint64_t gen, uint64_t timeout_ms, float *data,
                       ferry_error *err)
{
    for (size_t i = 0; i < FULL_ELEMS; i++)
        data[i] = (float)(gen * 1000003u + i);
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, "full");
    pc.world = 1;
    pc.keep = 1;
    pc.timeout_ms = timeout_ms;
    static const uint32_t node0[1] = { 0 };
    pc.rank_node = node0;
    ferry_weight_tensor t = { .name = "w", .dtype = "f32", .ndim = 1, .shape = { FULL_ELEMS },
                              .data = data };
    ferry_publish_stream *ps = NULL;
    int rc = ferry_publish_stream_begin(s, &pc, gen, &ps, err);
    if (rc == 0 && (rc = ferry_publish_stream_add(ps, &t, err)) < 0)
        (void)ferry_publish_stream_abort(ps, "the test's tensor was refused");
    int erc = ps ? ferry_publish_stream_end(ps, NULL, err) : rc;
    return rc < 0 ? rc : erc;
}

static int publish_full(ferry_store *s, uint64_t gen, uint64_t timeout_ms, float *data,
                        ferry_error *err)
{
    for (size_t i = 0; i < FULL_ELEMS; i++)
        data[i] = (float)(gen * 1000003u + i);
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, "full");
    pc.rank = 0;
    pc.world = 1;
    pc.keep = 1;
    pc.timeout_ms = timeout_ms;
    static const uint32_t node0[1] = { 0 };
    pc.rank_node = node0;
    ferry_weight_tensor t = { .name = "w", .dtype = "f32", .ndim = 1, .shape = { FULL_ELEMS },
                              .data = data };
    return ferry_publish(s, &pc, gen, &t, 1, NULL, err);
}

static void read_full(ferry_store *r, uint64_t want, float *out)
{
    ferry_param_shard sh = { .tensor = "w", .ndim = 1, .shape = { FULL_ELEMS }, .dst = out,
                             .dst_bytes = FULL_ELEMS * sizeof *out, .elem_bytes = 4 };
    uint64_t g = 0;
    ferry_error err = {0};
    assert_int_equal(ferry_weights_update_direct(r, "full", &g, &sh, 1, NULL, &err), 0);
    assert_int_equal(g, want);
    for (size_t i = 0; i < FULL_ELEMS; i += 4099)
        assert_true(out[i] == (float)(want * 1000003u + i));
}

/* A master and one node whose segment holds two generations (torn down
 * by the fixture, also after a failed assertion). */
static int full_setup(void **state)
{
    return ft_solo_setup(state, (uint64_t)FULL_ELEMS * 4 * 2 + (1u << 20), 10000);
}

static void test_publish_waits_for_leases(void **state)
{
    ft_solo *f = *state;
    ft_cluster c = f->c;   /* its address and token, for the readers' configs */
    ferry_store *s = f->s, *r = NULL;
    ferry_store_config rc;
    ft_store_config(&c, &rc);
    rc.lease_ms = 400;   /* every read the reader makes holds its object for 400 ms */
    assert_int_equal(ferry_store_open(&rc, &r, NULL), 0);
    float *data = malloc(FULL_ELEMS * sizeof *data), *out = malloc(FULL_ELEMS * sizeof *out);
    assert_non_null(data);
    assert_non_null(out);
    ferry_error err = {0};
    assert_int_equal(publish_full(s, 1, 20000, data, &err), 0);
    read_full(r, 1, out);
    assert_int_equal(publish_full(s, 2, 20000, data, &err), 0);   /* retires 1, leased: it stays */
    read_full(r, 2, out);
    int rc3 = publish_full(s, 3, 20000, data, &err);
    fprintf(stderr, "generation 3 beside a leased retired generation: %d %s\n", rc3, err.msg);
    assert_int_equal(rc3, 0);
    read_full(r, 3, out);
    ferry_store_close(r);
    /* the streaming publish the same way: a reader leasing for 1.5 s takes
     * 3; 4 retires it, still leased; streamed 5 waits for that lease */
    rc.lease_ms = 1500;
    assert_int_equal(ferry_store_open(&rc, &r, NULL), 0);
    read_full(r, 3, out);
    assert_int_equal(publish_full(s, 4, 20000, data, &err), 0);
    read_full(r, 4, out);
    int rc5 = stream_full(s, 5, 20000, data, &err);
    fprintf(stderr, "streamed generation 5 beside a leased retired generation: %d %s\n", rc5,
            rc5 < 0 ? err.msg : "");
    assert_int_equal(rc5, 0);
    read_full(r, 5, out);
    ferry_store_close(r);
    /* a lease that outlives the publisher's patience: refused, nothing lost */
    rc.lease_ms = 60000;
    assert_int_equal(ferry_store_open(&rc, &r, NULL), 0);
    read_full(r, 5, out);                                           /* leases 5 for a minute */
    assert_int_equal(publish_full(s, 6, 20000, data, &err), 0);    /* retires 5: it stays */
    read_full(r, 6, out);
    memset(&err, 0, sizeof err);
    assert_int_equal(publish_full(s, 7, 1000, data, &err), FERRY_ENOSPC);
    fprintf(stderr, "generation 7 beside a generation leased for a minute: %s\n", err.msg);
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(s, "full", &active, NULL, NULL), 0);
    assert_int_equal(active, 6);
    ferry_store_close(r);
    ferry_store_config lc;
    ft_store_config(&c, &lc);
    lc.lease_ms = 1;
    assert_int_equal(ferry_store_open(&lc, &r, NULL), 0);
    read_full(r, 6, out);                                           /* still whole */
    ferry_store_close(r);
    free(data);
    free(out);
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--trainer"))
        return trainer_main(argv + 2);
    ft_token();
    /* the node's death below is noticed in 2.5 s */
    static const char *const master_hb[] = { "--heartbeat-timeout", "2500", NULL };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(test_publish_generations, ftg_setup, ftg_teardown,
                                                 (void *)master_hb),
        cmocka_unit_test_setup_teardown(test_publish_retry_after_failure, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_publish_coordinator_dies, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_publish_one_rank_fails, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_publish_after_node_restart, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_publish_waits_for_leases, full_setup, ft_solo_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
