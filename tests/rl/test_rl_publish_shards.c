/* Publishing from shards (ferry_publish_shards) and from whole tensors
 * (ferry_publish), what every rank must agree on and what a placement must
 * hold, against a real master and node with four trainer processes:
 *  - a rank passing its tensors in another order, one tensor in another
 *    shape of the same size, or in another dtype fails the generation on
 *    every rank with one message naming that rank and the tensor, and
 *    leaves nothing stored;
 *  - a placement that leaves a box of a tensor unheld, or whose pieces
 *    overlap without being declared replicas, fails on every rank before
 *    anything is stored, naming the tensor and the box (and for an overlap
 *    both fragments with their ranks);
 *  - declared replicas publish, stored once;
 *  - a rollout binding whose buffer is smaller than its box is refused at
 *    prepare (direct update and subscriber), nothing written;
 *  - whole tensors are cut so that no publisher stores more than 1.1x the
 *    mean: measured on the demo's model (qwen3-8b cut to 2 GiB), printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rl/gen_int.h"
#include "rl/publish_int.h"
#include "util/ftgroup.h"
#include "ferry/weights.h"

#define WORLD 4
#define NT 6

static const uint64_t shapes[NT][2] = {
    {512, 64}, {256, 32}, {128, 128}, {64, 64}, {1024, 8}, {96, 40},
};

static float value(uint64_t gen, size_t t, uint64_t i)
{
    return (float)((gen * 5 + t * 11 + i) % 250);   /* exact in bf16 and f16 */
}

static const uint32_t rank_node[WORLD] = {0, 0, 1, 1};

/* ---- a trainer process ------------------------------------------------------------------ */

/* The full tensors as every rank holds them for ferry_publish (names in
 * names), f32 unless a mode says otherwise. */
static ferry_weight_tensor *whole_tensors(uint64_t gen, char names[NT][32])
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

/* The placement: every tensor FSDP over WORLD ranks (dim 0), except as the
 * mode says: "s:order" swaps tensors 1 and 2 (this rank), "s:shape" gives
 * tensor 3 the shape [32,128] (this rank), "s:dtype" declares tensor 5 f16
 * (this rank), "hole" leaves rank 3's rows of tensor 4 unheld, "overlap"
 * gives rank 1's piece of tensor 2 one row of rank 2's, "replica" holds
 * tensor 3 whole on ranks 0 and 1 as copies 0 and 1, "badreplica" declares
 * rows [0, 32) of tensor 3 on rank 1 a copy (1) of rank 0's whole tensor,
 * "nocopy0" holds tensor 3 only as copy 1. */
static ferry_manifest *placement(const char *mode)
{
    ferry_manifest *m = NULL;
    if (ferry_manifest_create(WORLD, rank_node, 1, &m) < 0)
        return NULL;
    static const char *const names[NT] = { "layers.0.weight", "layers.1.weight",
        "layers.2.weight", "layers.3.weight", "layers.4.weight", "layers.5.weight" };
    for (size_t i = 0; i < NT; i++) {
        size_t k = !strcmp(mode, "s:order") && (i == 1 || i == 2) ? 3 - i : i;
        ferry_tensor_desc d = { .name = names[k], .dtype = "f32", .itemsize = 4, .ndim = 2,
                                .shape = { shapes[k][0], shapes[k][1] } };
        if (!strcmp(mode, "s:shape") && k == 3) {
            d.shape[0] = 32;
            d.shape[1] = 128;
        }
        if (!strcmp(mode, "s:dtype") && k == 5) {
            d.dtype = "f16";
            d.itemsize = 2;
        }
        if (ferry_manifest_add_tensor(m, &d, NULL) < 0)
            goto bad;
        int rc = 0;
        uint64_t rows = d.shape[0], per = rows / WORLD;
        if (!strcmp(mode, "hole") && k == 4) {
            for (uint32_t r = 0; r < WORLD - 1 && rc >= 0; r++) {
                ferry_fragment f = { .tensor = (uint32_t)i, .rank = r, .offset = { r * per, 0 },
                                     .shape = { per, d.shape[1] } };
                rc = ferry_manifest_add_fragment(m, &f, NULL);
            }
        } else if (!strcmp(mode, "overlap") && k == 2) {
            for (uint32_t r = 0; r < WORLD && rc >= 0; r++) {
                ferry_fragment f = { .tensor = (uint32_t)i, .rank = r, .offset = { r * per, 0 },
                                     .shape = { per + (r == 1), d.shape[1] } };
                rc = ferry_manifest_add_fragment(m, &f, NULL);
            }
        } else if (!strcmp(mode, "badreplica") && k == 3) {
            /* a "replica" of another box: an overlap, not a copy */
            ferry_fragment a = { .tensor = (uint32_t)i, .rank = 0,
                                 .shape = { d.shape[0], d.shape[1] } };
            ferry_fragment b = { .tensor = (uint32_t)i, .rank = 1, .replica = 1,
                                 .shape = { 32, d.shape[1] } };
            rc = ferry_manifest_add_fragment(m, &a, NULL);
            if (rc >= 0)
                rc = ferry_manifest_add_fragment(m, &b, NULL);
        } else if (!strcmp(mode, "nocopy0") && k == 3) {
            ferry_fragment a = { .tensor = (uint32_t)i, .rank = 1, .replica = 1,
                                 .shape = { d.shape[0], d.shape[1] } };
            rc = ferry_manifest_add_fragment(m, &a, NULL);
        } else if (!strcmp(mode, "replica") && k == 3) {
            for (uint32_t r = 0; r < 2 && rc >= 0; r++) {
                ferry_fragment f = { .tensor = (uint32_t)i, .rank = r, .replica = r,
                                     .shape = { d.shape[0], d.shape[1] } };
                rc = ferry_manifest_add_fragment(m, &f, NULL);
            }
        } else {
            ferry_split sp = { .tensor = (uint32_t)i, .whole = true, .parts = { WORLD },
                               .rank_stride = { 1 } };
            rc = ferry_manifest_add_split(m, &sp, NULL);
        }
        if (rc < 0)
            goto bad;
    }
    return m;
bad:
    ferry_manifest_close(m);
    return NULL;
}

/* This rank's pieces of placement m with their data (values of tensor
 * "layers.K.weight" by its name, in the fragment's dtype). */
static ferry_shard_data *my_pieces(ferry_manifest *m, uint32_t rank, uint64_t gen, size_t *n)
{
    uint64_t nf = ferry_manifest_fragment_count(m);
    ferry_shard_data *v = calloc(nf ? nf : 1, sizeof *v);
    *n = 0;
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        ferry_tensor_desc d;
        if (ferry_manifest_fragment(m, id, &f) < 0 || f.rank != rank)
            continue;
        (void)ferry_manifest_tensor(m, f.tensor, &d);
        size_t k = (size_t)atoi(d.name + 7);
        uint64_t elems = f.shape[0] * f.shape[1];
        uint8_t *buf = malloc(elems * d.itemsize);
        for (uint64_t i = 0; i < elems; i++) {
            uint64_t g = (f.offset[0] + i / f.shape[1]) * d.shape[1] + f.offset[1] + i % f.shape[1];
            float x = value(gen, k, g);
            (void)ferry_convert(&x, "f32", buf + i * d.itemsize, d.dtype, 1);
        }
        v[(*n)++] = (ferry_shard_data){ .fragment = id, .data = buf };
    }
    return v;
}

/* argv: addr rank gen mode odd_rank. Modes starting "w:" publish whole
 * tensors (ferry_publish); the others shards. The odd rank alone runs an
 * "s:"/"w:" mode, every rank the others. */
static int trainer_main(char **argv)
{
    const char *addr = argv[0], *mode = argv[3];
    uint32_t rank = (uint32_t)atoi(argv[1]);
    uint64_t gen = strtoull(argv[2], NULL, 10);
    bool odd = (uint32_t)atoi(argv[4]) == rank;
    ferry_store *s = NULL;
    if (ftg_worker_store(addr, &s) < 0)
        return 1;
    ferry_publisher_config pc = { .model = "shards", .rank = rank, .world = WORLD,
                                  .rank_node = rank_node, .out_dtype = "bf16", .keep = 2,
                                  .timeout_ms = 60000 };
    ferry_publish_stats st;
    ferry_error err = {0};
    int rc;
    if (!strncmp(mode, "w:", 2)) {
        char names[NT][32];
        ferry_weight_tensor *t = whole_tensors(gen, names);
        ferry_weight_tensor sw;
        uint16_t *f16 = NULL;
        if (odd && !strcmp(mode, "w:order")) {
            sw = t[1], t[1] = t[2], t[2] = sw;
        } else if (odd && !strcmp(mode, "w:shape")) {
            t[3].shape[0] = 32;
            t[3].shape[1] = 128;
        } else if (odd && !strcmp(mode, "w:dtype")) {
            uint64_t n = shapes[5][0] * shapes[5][1];
            f16 = malloc(n * 2);
            (void)ferry_convert(t[5].data, "f32", f16, "f16", n);
            t[5].dtype = "f16";
            free((void *)t[5].data);
            t[5].data = f16;
        }
        rc = ferry_publish(s, &pc, gen, t, NT, &st, &err);
        for (size_t k = 0; k < NT; k++)
            free((void *)t[k].data);
        free(t);
    } else {
        const char *pm = !strncmp(mode, "s:", 2) && !odd ? "ok" : mode;
        ferry_manifest *m = placement(pm);
        size_t n = 0;
        ferry_shard_data *mine = m ? my_pieces(m, rank, gen, &n) : NULL;
        rc = m ? ferry_publish_shards(s, &pc, gen, m, mine, n, &st, &err) : FERRY_ENOMEM;
        for (size_t k = 0; k < n; k++)
            free((void *)mine[k].data);
        free(mine);
        ferry_manifest_close(m);
    }
    if (rc == 0)
        printf("OK %llu %llu\n", (unsigned long long)st.tensors, (unsigned long long)st.bytes);
    else
        printf("ERR %d %s\n", rc, err.msg);
    fflush(stdout);
    ferry_store_close(s);
    return 0;
}

/* ---- the test side ---------------------------------------------------------------------- */

typedef struct round_opts {
    const char *addr, *mode;
    char gen[32], odd[32];
} round_opts;

static void trainer_args(const void *ctx, int rank, ftg_args *a)
{
    const round_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { "--trainer", o->addr, a->buf[0], o->gen, o->mode, o->odd, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* One publish of generation gen by every rank in mode (odd rank odd):
 * how many said OK; every line printed. */
static int round_of(ftg_env *f, uint64_t gen, const char *mode, int odd)
{
    round_opts o = { .addr = f->c.addr, .mode = mode };
    snprintf(o.gen, sizeof o.gen, "%llu", (unsigned long long)gen);
    snprintf(o.odd, sizeof o.odd, "%d", odd);
    assert_int_equal(ftg_spawn(f, WORLD, trainer_args, &o, -1, NULL), 0);
    int ok = ftg_collect(f, 90000, -1);
    for (int k = 0; k < WORLD; k++)
        fprintf(stderr, "  %s rank %d: %s\n", mode, k, f->line[k]);
    ftg_stop(f);
    return ok;
}

/* Every rank printed exactly want. */
static void all_said(const ftg_env *f, const char *want)
{
    for (int k = 0; k < WORLD; k++)
        if (strcmp(f->line[k], want) != 0)
            fail_msg("rank %d said \"%s\", not \"%s\"", k, f->line[k], want);
}

static size_t objects_of(ftg_env *f, uint64_t gen)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "ferry/w/shards/%020llu/", (unsigned long long)gen);
    char **keys = NULL;
    size_t n = 0;
    assert_int_equal(ferry_store_list(f->s, prefix, NULL, 1000, &keys, &n, NULL, NULL), 0);
    ferry_store_free(keys);
    return n;
}

/* Generation gen is active and every tensor reads back as value(). */
static void check_generation(ftg_env *f, uint64_t gen)
{
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(f->s, "shards", &active, NULL, NULL), 0);
    assert_int_equal(active, gen);
    ferry_weight_manifest m;
    ferry_error err = {0};
    assert_int_equal(ferry_weights_manifest(f->s, "shards", gen, &m, &err), 0);
    assert_int_equal(m.n, NT);
    for (size_t k = 0; k < NT; k++) {
        const ferry_weight_entry *e = &m.entries[k];
        assert_int_equal(e->bytes, shapes[k][0] * shapes[k][1] * 2);
        uint16_t *b = malloc(e->bytes);
        if (ferry_weights_read(f->s, e, b, e->bytes, &err) != 0)
            fail_msg("reading %s: %s", e->name, err.msg);
        for (uint64_t i = 0; i < e->bytes / 2; i++) {
            float v;
            (void)ferry_convert(&b[i], "bf16", &v, "f32", 1);
            if (v != value(gen, k, i))
                fail_msg("%s element %llu: %f", e->name, (unsigned long long)i, (double)v);
        }
        free(b);
    }
    ferry_weight_manifest_free(&m);
}

/* A disagreement fails generation 1 on every rank with want (after
 * "ERR -22 publish of shards generation 1 failed: "), nothing stored. */
static void disagrees(ftg_env *f, const char *mode, int odd, const char *want)
{
    char line[600];
    snprintf(line, sizeof line, "ERR %d publish of shards generation 1 failed: %s", FERRY_EINVAL,
             want);
    assert_int_equal(round_of(f, 1, mode, odd), 0);
    all_said(f, line);
    assert_int_equal(objects_of(f, 1), 0);
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(f->s, "shards", &active, NULL, NULL), FERRY_ENOENT);
}

static void test_ranks_disagree(void **state)
{
    ftg_env *f = *state;
    /* whole tensors (ferry_publish) */
    disagrees(f, "w:order", 2, "rank 2 passes another tensor than layers.1.weight at position 1 "
              "(names or their order differ from rank 0's)");
    disagrees(f, "w:shape", 1, "rank 1 passes tensor layers.3.weight with another shape than "
              "rank 0");
    disagrees(f, "w:dtype", 3, "rank 3 passes tensor layers.5.weight in another dtype than "
              "rank 0");
    /* shards (ferry_publish_shards) */
    disagrees(f, "s:order", 2, "rank 2 passes another tensor than layers.1.weight at position 1 "
              "(names or their order differ from rank 0's)");
    disagrees(f, "s:shape", 1, "rank 1 passes tensor layers.3.weight with another shape than "
              "rank 0");
    disagrees(f, "s:dtype", 3, "rank 3 passes tensor layers.5.weight in another dtype than "
              "rank 0");
    /* Then both publish. */
    assert_int_equal(round_of(f, 1, "w:ok", -1), WORLD);
    check_generation(f, 1);
    assert_int_equal(round_of(f, 2, "ok", -1), WORLD);
    check_generation(f, 2);
}

static void test_placement_bad(void **state)
{
    ftg_env *f = *state;
    /* Every rank checks the placement before storing; rank 0's part is the
     * one the decision names. */
    disagrees(f, "hole", -1, "rank 0: tensor layers.4.weight: no rank holds the box at offset "
              "[768,0], shape [256,8] (6144 of 8192 elements held)");
    disagrees(f, "overlap", -1, "rank 0: the placement does not hold every tensor exactly once: "
              "tensor 'layers.2.weight': source fragment 9 (rank 1, replica 0, offset [32,0], "
              "shape [33,128]) and fragment 10 (rank 2, replica 0, offset [64,0], shape [32,128]) "
              "overlap; overlapping source fragments must be declared replicas (identical boxes, "
              "distinct replica numbers)");
    disagrees(f, "badreplica", -1, "rank 0: the placement does not hold every tensor exactly "
              "once: tensor 'layers.3.weight': source fragment 13 (rank 1, replica 1, offset "
              "[0,0], shape [32,64]) and fragment 12 (rank 0, replica 0, offset [0,0], shape "
              "[64,64]) overlap; overlapping source fragments must be declared replicas "
              "(identical boxes, distinct replica numbers)");
    disagrees(f, "nocopy0", -1, "rank 0: tensor layers.3.weight: no rank holds copy 0 of the "
              "box at offset [0,0], shape [64,64] (0 of 4096 elements held)");
    /* Declared replicas: stored once, by copy 0's rank. */
    assert_int_equal(round_of(f, 1, "replica", -1), WORLD);
    check_generation(f, 1);
    fr_gen *g = NULL;
    assert_int_equal(fr_gen_load(f->s, "shards", 1, &g, NULL), 0);
    uint64_t nf = ferry_manifest_fragment_count(g->m), of3 = 0;
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment fr;
        assert_int_equal(ferry_manifest_fragment(g->m, id, &fr), 0);
        if (fr.tensor == 3) {
            of3++;
            assert_int_equal(fr.rank, 0);
        }
    }
    assert_int_equal(of3, 1);
    fr_gen_free(g);
}

/* A binding whose buffer is smaller than its box: refused at prepare, the
 * buffer untouched, the worker stays on its generation. */
static void test_binding_too_small(void **state)
{
    ftg_env *f = *state;
    assert_int_equal(round_of(f, 1, "ok", -1), WORLD);
    /* rows [8, 40) of layers.2.weight (128 x 128 bf16), 32 rows: 8192 bytes */
    size_t cap = 32 * 128 * 2;
    uint8_t *buf = malloc(cap + 64);
    memset(buf, 0xa5, cap + 64);
    ferry_param_shard sh = { .tensor = "layers.2.weight", .ndim = 2, .offset = { 8, 0 },
                             .shape = { 32, 128 }, .dst = buf, .dst_bytes = cap - 2 };
    const char *want = "tensor layers.2.weight: the shard at offset [8,0], shape [32,128] spans "
                       "8192 bytes of its buffer, which holds 8190";
    ferry_error err = {0};
    uint64_t g = 0;
    assert_int_equal(ferry_weights_update_direct(f->s, "shards", &g, &sh, 1, NULL, &err),
                     FERRY_EINVAL);
    fprintf(stderr, "direct: %s\n", err.msg);
    assert_non_null(strstr(err.msg, want));
    assert_int_equal(g, 0);
    /* strided: a row pitch of 130 elements spans 31 * 130 + 128 elements */
    sh.strides[0] = 130;
    sh.strides[1] = 1;
    sh.dst_bytes = (31 * 130 + 128) * 2 - 1;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_weights_update_direct(f->s, "shards", &g, &sh, 1, NULL, &err),
                     FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "spans 8316 bytes of its buffer, which holds 8315"));
    /* The subscriber: its prepare refuses it (a group of one). */
    sh.strides[0] = sh.strides[1] = 0;
    sh.dst_bytes = cap - 2;
    ferry_subscriber_config sc = { .model = "shards", .group = "small", .rank = 0, .world = 1,
                                   .timeout_ms = 30000 };
    ferry_subscriber *sub = NULL;
    assert_int_equal(ferry_subscriber_open(f->s, &sc, &sh, 1, &sub, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_subscriber_update(sub, &g, NULL, &err), FERRY_EINVAL);
    fprintf(stderr, "subscriber: %s\n", err.msg);
    assert_non_null(strstr(err.msg, want));
    assert_int_equal(g, 0);
    ferry_subscriber_close(sub);
    for (size_t i = 0; i < cap + 64; i++)
        assert_int_equal(buf[i], 0xa5);
    /* Room enough, but 4-byte elements said for a bf16 tensor: refused by
     * the direct update and the subscriber's prepare alike, untouched. */
    const char *esz = "tensor layers.2.weight: the shard's buffer holds 4-byte elements; the "
                      "published dtype bf16 has 2-byte ones";
    sh.dst_bytes = cap;
    sh.elem_bytes = 4;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_weights_update_direct(f->s, "shards", &g, &sh, 1, NULL, &err),
                     FERRY_EINVAL);
    assert_non_null(strstr(err.msg, esz));
    assert_int_equal(ferry_subscriber_open(f->s, &sc, &sh, 1, &sub, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_subscriber_update(sub, &g, NULL, &err), FERRY_EINVAL);
    fprintf(stderr, "subscriber, element size: %s\n", err.msg);
    assert_non_null(strstr(err.msg, esz));
    assert_int_equal(g, 0);
    ferry_subscriber_close(sub);
    for (size_t i = 0; i < cap + 64; i++)
        assert_int_equal(buf[i], 0xa5);
    /* The same binding with room for its box (and the right element size,
     * or none said): updated. */
    sh.elem_bytes = 2;
    assert_int_equal(ferry_subscriber_open(f->s, &sc, &sh, 1, &sub, &err), 0);
    assert_int_equal(ferry_subscriber_update(sub, &g, NULL, &err), 0);
    assert_int_equal(g, 1);
    ferry_subscriber_close(sub);
    for (uint64_t i = 0; i < 32 * 128; i++) {
        float v;
        (void)ferry_convert(buf + 2 * i, "bf16", &v, "f32", 1);
        assert_true(v == value(1, 2, 8 * 128 + i));
    }
    for (size_t i = cap; i < cap + 64; i++)
        assert_int_equal(buf[i], 0xa5);
    free(buf);
}

/* ---- balance of a whole-tensor publish ------------------------------------------------- */

/* The demo's model: qwen3-8b's tensors in order while they fit in 2 GiB,
 * bf16 (lab/demo_roles.c, demo_model_build). */
static size_t demo_model(ferry_weight_tensor **out, char (**names)[128])
{
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_preset("qwen3-8b", &m, NULL), 0);
    size_t n = ferry_model_tensor_count(m), k = 0;
    uint64_t bytes = 0;
    *out = calloc(n, sizeof **out);
    *names = calloc(n, sizeof **names);
    static const uint8_t dummy[1];
    for (size_t i = 0; i < n; i++) {
        ferry_model_tensor mt;
        ferry_model_tensor_at(m, i, &mt);
        uint64_t b = 2;
        for (uint32_t d = 0; d < mt.desc.ndim; d++)
            b *= mt.desc.shape[d];
        if (bytes + b > (2ull << 30))
            continue;
        bytes += b;
        snprintf((*names)[k], 128, "%s", mt.desc.name);
        ferry_weight_tensor *t = &(*out)[k++];
        *t = (ferry_weight_tensor){ .name = (*names)[k - 1], .dtype = "bf16",
                                    .ndim = mt.desc.ndim, .data = dummy };
        memcpy(t->shape, mt.desc.shape, sizeof t->shape);
    }
    ferry_model_free(m);
    return k;
}

static double max_over_mean(const uint64_t *per, uint32_t n)
{
    uint64_t max = 0, sum = 0;
    for (uint32_t r = 0; r < n; r++) {
        sum += per[r];
        max = per[r] > max ? per[r] : max;
    }
    return (double)max / ((double)sum / n);
}

static void test_whole_balance(void **state)
{
    (void)state;
    ferry_weight_tensor *t = NULL;
    char (*names)[128] = NULL;
    size_t n = demo_model(&t, &names);
    uint64_t total = 0, largest = 0;
    uint64_t *bytes = calloc(n, sizeof *bytes);
    uint32_t *pub = calloc(n, sizeof *pub);
    for (size_t i = 0; i < n; i++) {
        bytes[i] = 2;
        for (uint32_t d = 0; d < t[i].ndim; d++)
            bytes[i] *= t[i].shape[d];
        total += bytes[i];
        largest = bytes[i] > largest ? bytes[i] : largest;
    }
    fprintf(stderr, "demo model: %zu tensors, %llu bytes, the largest %llu (%.1f %%)\n", n,
            (unsigned long long)total, (unsigned long long)largest, 100.0 * largest / total);
    static const uint32_t one_node[8] = {0}, two_nodes[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    static const struct { uint32_t world; const uint32_t *nodes; const char *what; } cases[] = {
        { 4, one_node, "4 ranks, 1 node" }, { 4, two_nodes + 2, "4 ranks, 2 nodes" },
        { 8, one_node, "8 ranks, 1 node" }, { 8, two_nodes, "8 ranks, 2 nodes" },
        { 3, one_node, "3 ranks, 1 node" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint32_t w = cases[c].world;
        /* Uncut (each tensor whole on one rank): what the embedding did. */
        uint64_t per[8] = {0};
        assert_int_equal(ferry_weights_assign(bytes, n, cases[c].nodes, w, pub, NULL), 0);
        for (size_t i = 0; i < n; i++)
            per[pub[i]] += bytes[i];
        double uncut = max_over_mean(per, w);
        /* Cut, as ferry_publish places them. */
        ferry_publisher_config pc = { .model = "demo", .world = w, .rank_node = cases[c].nodes,
                                      .out_dtype = "bf16" };
        ferry_manifest *pl = NULL;
        ferry_shard_data *data = NULL;
        size_t nd = 0;
        ferry_error err = {0};
        assert_int_equal(fr_rl_whole_placement(&pc, t, n, &pl, &data, &nd, &err), 0);
        uint64_t cut[8] = {0};
        for (uint32_t r = 0; r < w; r++)
            assert_int_equal(ferry_manifest_rank_bytes(pl, r, &cut[r]), 0);
        double ratio = max_over_mean(cut, w);
        fprintf(stderr, "publish balance, %s: max/mean %.4f (uncut %.4f; the heaviest rank "
                "%.1f %% of the model, uncut %.1f %%), %llu pieces\n", cases[c].what, ratio,
                uncut, 100.0 * ratio / w, 100.0 * uncut / w,
                (unsigned long long)ferry_manifest_fragment_count(pl));
        assert_true(ratio <= 1.1);
        free(data);
        ferry_manifest_close(pl);
    }
    free(bytes);
    free(pub);
    free(t);
    free(names);
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--trainer"))
        return trainer_main(argv + 2);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_balance),
        cmocka_unit_test_setup_teardown(test_ranks_disagree, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_placement_bad, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_binding_too_small, ftg_setup, ftg_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
