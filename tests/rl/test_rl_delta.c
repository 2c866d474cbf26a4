/* The delta encoder (ferry_delta_publish; docs/sparse.md, "Deltas from a
 * trainer"):
 *  - the bitwise difference kernel gives the same positions on every path
 *    (scalar reference, portable, AVX2 where the CPU has it);
 *  - the config's defaults and refusals;
 *  - three trainer processes (FSDP rows, a column split held strided, a
 *    whole tensor, a replicated one, a transposed one; f32 held, bf16
 *    published) publish generations through their encoders against a real
 *    master and node, and after every announced one a rollout following
 *    the chain (ferry_sparse_update) holds exactly the trainers' weights
 *    cast to bf16, bit for bit — with changes a bf16 scatter_add would not
 *    reproduce; the first generation is dense, a changed fraction above
 *    the crossover is dense, the chain is cut after K deltas;
 *  - bad input: a rank whose tensor changed shape, or whose piece changed
 *    box, fails the generation on every rank with nothing stored; a rank
 *    failing after the owners stored leaves nothing stored and nothing
 *    announced; a rank that dies after storing leaves its objects, which
 *    the next publish's owners remove;
 *  - a fresh rollout rebuilds from the chain (dense generation + deltas). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "rl/delta_int.h"
#include "util/ftgroup.h"
#include "ferry/weights.h"

#define WORLD 3
#define NT 5
#define MODEL "dl"
#define GEN_MAX 16
#define TIMEOUT_MS 8000

static const char *const names[NT] = { "dl.w0", "dl.w1", "dl.w2", "dl.w3", "dl.w4" };
static const uint32_t ndims[NT] = { 2, 2, 2, 1, 2 };
static const uint64_t shapes[NT][2] = { {96, 40}, {64, 64}, {50, 30}, {7, 1}, {16, 24} };
static const uint32_t rank_node[WORLD] = {0, 0, 0};

static uint64_t elems_of(size_t t)
{
    return shapes[t][0] * (ndims[t] == 2 ? shapes[t][1] : 1);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* ---- the weights: f32, as a trainer holds them -------------------------------------------- */

typedef struct model {
    float *w[NT];
    uint64_t gen;
} model;

static void model_init(model *m)
{
    for (size_t t = 0; t < NT; t++) {
        m->w[t] = malloc(elems_of(t) * sizeof(float));
        for (uint64_t e = 0; e < elems_of(t); e++) {
            uint64_t u = mix(t * 1000003 + e);
            m->w[t][e] = ((float)(u % 4001) - 2000.0f) / 1000.0f + 0.001f;
        }
    }
    m->gen = 1;
}

static void model_free(model *m)
{
    for (size_t t = 0; t < NT; t++)
        free(m->w[t]);
}

/* One optimizer-like step to generation g: a fraction frac of the
 * elements moves by a relative -6 % .. +6 % (steps of 2^-9: the smallest
 * vanish in bf16, the others land between bf16 neighbours). */
static void model_step(model *m, uint64_t g, double frac)
{
    for (size_t t = 0; t < NT; t++)
        for (uint64_t e = 0; e < elems_of(t); e++) {
            uint64_t u = mix((g << 40) ^ (t << 32) ^ e);
            double f = frac >= 2 ? (t == 4 ? frac - 2 : 0) : frac;   /* >= 2: w4 alone, frac - 2 */
            if ((double)(u % 1000000) >= f * 1e6)
                continue;
            int r = (int)((u >> 24) % 64) - 32;
            m->w[t][e] += m->w[t][e] * (float)r / 512.0f;
        }
    m->gen = g;
}

static void model_at(model *m, uint64_t gen, const double *fracs)
{
    model_init(m);
    for (uint64_t g = 2; g <= gen; g++)
        model_step(m, g, fracs[g]);
}

/* ---- a trainer process ------------------------------------------------------------------ */

/* The placement: w0 rows over the 3 ranks (32 each; "box": 40/28/28), w1
 * columns (22, 22, 20; held as column slices of the whole tensor, strided),
 * w2 whole on rank 1 ("shape": declared [30, 50]), w3 whole on rank 2 with
 * a replica on rank 0, w4 whole on rank 0 held transposed. */
static ferry_manifest *placement(const char *flag)
{
    ferry_manifest *m = NULL;
    if (ferry_manifest_create(WORLD, rank_node, 1, &m) < 0)
        return NULL;
    int rc = 0;
    for (uint32_t t = 0; t < NT && rc >= 0; t++) {
        ferry_tensor_desc d = { .name = names[t], .dtype = "f32", .itemsize = 4, .ndim = ndims[t],
                                .shape = { shapes[t][0], shapes[t][1] } };
        if (t == 2 && !strcmp(flag, "shape")) {
            d.shape[0] = 30;
            d.shape[1] = 50;
        }
        rc = ferry_manifest_add_tensor(m, &d, NULL);
        if (t == 0) {
            uint64_t rows[WORLD] = {32, 32, 32}, r0 = 0;
            if (!strcmp(flag, "box"))
                rows[0] = 40, rows[1] = 28, rows[2] = 28;
            for (uint32_t r = 0; r < WORLD && rc >= 0; r0 += rows[r], r++) {
                ferry_fragment f = { .tensor = t, .rank = r, .offset = { r0, 0 },
                                     .shape = { rows[r], 40 } };
                rc = ferry_manifest_add_fragment(m, &f, NULL);
            }
        } else if (t == 1) {
            uint64_t c0 = 0, cols[WORLD] = {22, 22, 20};
            for (uint32_t r = 0; r < WORLD && rc >= 0; c0 += cols[r], r++) {
                ferry_fragment f = { .tensor = t, .rank = r, .offset = { 0, c0 },
                                     .shape = { 64, cols[r] }, .has_strides = true,
                                     .strides = { 64, 1 }, .storage_offset = c0 };
                rc = ferry_manifest_add_fragment(m, &f, NULL);
            }
        } else if (t == 2) {
            ferry_fragment f = { .tensor = t, .rank = 1, .shape = { d.shape[0], d.shape[1] } };
            rc = ferry_manifest_add_fragment(m, &f, NULL);
        } else if (t == 3) {
            for (uint32_t k = 0; k < 2 && rc >= 0; k++) {
                ferry_fragment f = { .tensor = t, .rank = k ? 0 : 2, .replica = k, .shape = { 7 } };
                rc = ferry_manifest_add_fragment(m, &f, NULL);
            }
        } else {
            ferry_fragment f = { .tensor = t, .rank = 0, .shape = { 16, 24 }, .has_strides = true,
                                 .strides = { 1, 16 } };
            rc = ferry_manifest_add_fragment(m, &f, NULL);
        }
    }
    if (rc < 0) {
        ferry_manifest_close(m);
        return NULL;
    }
    return m;
}

/* This rank's pieces: pointers into the model (rows; whole tensors; w1's
 * columns through strides), w4 transposed into tr. */
static ferry_shard_data *pieces(ferry_manifest *m, const model *w, uint32_t rank, float *tr,
                                size_t *n)
{
    uint64_t nf = ferry_manifest_fragment_count(m);
    ferry_shard_data *v = calloc(nf, sizeof *v);
    *n = 0;
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        (void)ferry_manifest_fragment(m, id, &f);
        if (f.rank != rank || f.replica != 0)
            continue;
        const float *data = w->w[f.tensor];
        if (f.tensor == 0)
            data += f.offset[0] * 40;
        if (f.tensor == 4) {
            for (uint64_t i = 0; i < 16; i++)
                for (uint64_t j = 0; j < 24; j++)
                    tr[j * 16 + i] = data[i * 24 + j];
            data = tr;
        }
        v[(*n)++] = (ferry_shard_data){ .fragment = id, .data = data };
    }
    return v;
}

/* argv: addr rank max_chain crossover fracs ("f2,f3,...": the steps to the
 * generation the worker starts at, generation 1 + their count). Lines
 * "pub G FRAC FLAG FLAGRANK" publish G (stepping the weights to G first
 * when they are older) with FLAG on rank FLAGRANK ("-", "shape", "box",
 * "fail", "die", "cross": another crossover); "reset" resets the encoder. One reply line each. */
static int trainer_main(char **argv)
{
    uint32_t rank = (uint32_t)atoi(argv[1]);
    ferry_store *s = NULL;
    if (ftg_worker_store(argv[0], &s) < 0)
        return 1;
    double fracs[GEN_MAX + 2] = {0};
    uint64_t gen = 1;
    for (char *p = argv[4]; *p && gen <= GEN_MAX;) {
        char *end;
        fracs[++gen] = strtod(p, &end);
        p = *end ? end + 1 : end;
    }
    model w;
    model_at(&w, gen, fracs);
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, MODEL);
    pc.rank = rank;
    pc.world = WORLD;
    pc.rank_node = rank_node;
    snprintf(pc.out_dtype, sizeof pc.out_dtype, "bf16");
    pc.timeout_ms = TIMEOUT_MS;
    ferry_delta_config dc;
    ferry_delta_config_init(&dc);
    dc.max_chain = (uint32_t)atoi(argv[2]);
    dc.crossover = strtod(argv[3], NULL);
    ferry_delta_encoder *e = NULL;
    ferry_error err = {0};
    if (ferry_delta_encoder_open(&pc, &dc, &e, &err) < 0) {
        printf("ERR open %s\n", err.msg);
        return 1;
    }
    fr_delta_sample_min(e, 1);   /* the first look decides on this small model too */
    float tr[16 * 24];
    printf("READY\n");
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long g;
        double frac;
        char flag[32];
        unsigned fr;
        if (!strncmp(line, "reset", 5)) {
            ferry_delta_encoder_reset(e);
            printf("OK reset %llu\n", (unsigned long long)ferry_delta_encoder_bytes(e));
            fflush(stdout);
            continue;
        }
        if (sscanf(line, "pub %llu %lf %31s %u", &g, &frac, flag, &fr) != 4)
            break;
        if (g > w.gen)
            model_step(&w, g, frac);
        const char *my = fr == rank ? flag : "-";
        fr_delta_fail_at(e, !strcmp(my, "fail") ? FR_DELTA_FAIL_STORED
                            : !strcmp(my, "die") ? FR_DELTA_DIE_STORED : FR_DELTA_FAIL_NONE);
        ferry_manifest *m = placement(my);
        size_t n = 0;
        ferry_shard_data *mine = pieces(m, &w, rank, tr, &n);
        ferry_delta_stats st;
        memset(&err, 0, sizeof err);
        double cross = e->dc.crossover;
        if (!strcmp(my, "cross"))   /* an encoder configured otherwise than rank 0's */
            e->dc.crossover = 0.5;
        int rc = ferry_delta_publish(s, e, g, m, mine, n, &st, &err);
        e->dc.crossover = cross;
        if (rc == 0)
            printf("OK %d %u %llu %llu %llu %llu %llu %llu\n", (int)st.kind, st.chain,
                   (unsigned long long)st.changed, (unsigned long long)st.total_changed,
                   (unsigned long long)st.objects, (unsigned long long)st.nnz,
                   (unsigned long long)st.part_bytes, (unsigned long long)ferry_delta_encoder_bytes(e));
        else
            printf("ERR %d %s\n", rc, err.msg);
        fflush(stdout);
        free(mine);
        ferry_manifest_close(m);
    }
    ferry_delta_encoder_close(e);
    model_free(&w);
    ferry_store_close(s);
    return 0;
}

/* ---- the test side ---------------------------------------------------------------------- */

typedef struct opts {
    const char *addr;
    char chain[16], cross[32], fracs[256];
} opts;

static void trainer_args(const void *ctx, int rank, ftg_args *a)
{
    const opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { "--trainer", o->addr, a->buf[0], o->chain, o->cross, o->fracs, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* A rollout: every tensor whole in bf16, the generation it holds. */
typedef struct rollout {
    uint16_t *buf[NT];
    uint64_t gen;
} rollout;

static void rollout_open(rollout *r)
{
    for (size_t t = 0; t < NT; t++)
        r->buf[t] = calloc(elems_of(t), 2);
    r->gen = 0;
}

static void rollout_close(rollout *r)
{
    for (size_t t = 0; t < NT; t++)
        free(r->buf[t]);
}

/* Follow the chain to the active generation; return the elements that
 * differ from the weights at gen cast to bf16 (bit for bit). */
static uint64_t rollout_check(ftg_env *f, rollout *r, uint64_t gen, const double *fracs,
                              ferry_sparse_update_stats *ust)
{
    ferry_param_shard sh[NT];
    memset(sh, 0, sizeof sh);
    for (size_t t = 0; t < NT; t++)
        sh[t] = (ferry_param_shard){ .tensor = names[t], .ndim = ndims[t],
                                     .shape = { shapes[t][0], shapes[t][1] }, .dst = r->buf[t],
                                     .dst_bytes = elems_of(t) * 2 };
    ferry_sparse_update_config uc;
    ferry_sparse_update_config_init(&uc);
    snprintf(uc.model, sizeof uc.model, MODEL);
    ferry_error err = {0};
    if (ferry_sparse_update(f->s, &uc, sh, NT, &r->gen, ust, &err) != 0)
        fail_msg("rollout update to %llu: %s", (unsigned long long)gen, err.msg);
    assert_int_equal(r->gen, gen);
    model w;
    model_at(&w, gen, fracs);
    uint64_t bad = 0;
    for (size_t t = 0; t < NT; t++)
        for (uint64_t e = 0; e < elems_of(t); e++) {
            uint16_t want;
            (void)ferry_convert(&w.w[t][e], "f32", &want, "bf16", 1);
            bad += want != r->buf[t][e];
        }
    model_free(&w);
    return bad;
}

/* Elements of the step to gen whose bf16 value a scatter_add would not
 * give: the trainer's f32 step (new - old), in bf16, added to the old bf16
 * value and rounded. */
static uint64_t add_inexact(uint64_t gen, const double *fracs)
{
    model a, b;
    model_at(&a, gen - 1, fracs);
    model_at(&b, gen, fracs);
    uint64_t n = 0;
    for (size_t t = 0; t < NT; t++)
        for (uint64_t e = 0; e < elems_of(t); e++) {
            uint16_t o, nw, d, sum;
            float of, nf, df, sf;
            (void)ferry_convert(&a.w[t][e], "f32", &o, "bf16", 1);
            (void)ferry_convert(&b.w[t][e], "f32", &nw, "bf16", 1);
            (void)ferry_convert(&o, "bf16", &of, "f32", 1);
            nf = b.w[t][e];
            df = nf - a.w[t][e];   /* the trainer's step, in f32 */
            (void)ferry_convert(&df, "f32", &d, "bf16", 1);
            (void)ferry_convert(&d, "bf16", &df, "f32", 1);
            sf = of + df;
            (void)ferry_convert(&sf, "f32", &sum, "bf16", 1);
            n += sum != nw;
        }
    model_free(&a);
    model_free(&b);
    return n;
}

/* One publish on every rank: how many said OK (lines printed). */
static int pub(ftg_env *f, uint64_t g, double frac, const char *flag, int flag_rank, int skip)
{
    assert_int_equal(ftg_send(f, "pub %llu %g %s %d", (unsigned long long)g, frac, flag,
                              flag_rank), 0);
    int ok = ftg_collect(f, 60000, skip);
    for (int k = 0; k < WORLD; k++)
        fprintf(stderr, "  gen %llu %s rank %d: %s\n", (unsigned long long)g, flag, k, f->line[k]);
    return ok;
}

/* Every rank's reply: OK with kind (and chain); summed counters. */
typedef struct reply {
    int kind;
    unsigned chain;
    unsigned long long changed, tchanged, objects, nnz, part_bytes, snap;
} reply;

static void all_ok(ftg_env *f, int kind, unsigned chain, reply *sum)
{
    memset(sum, 0, sizeof *sum);
    for (int k = 0; k < WORLD; k++) {
        reply x;
        if (sscanf(f->line[k], "OK %d %u %llu %llu %llu %llu %llu %llu", &x.kind, &x.chain,
                   &x.changed, &x.tchanged, &x.objects, &x.nnz, &x.part_bytes, &x.snap) != 8)
            fail_msg("rank %d said \"%s\"", k, f->line[k]);
        assert_int_equal(x.kind, kind);
        assert_int_equal(x.chain, chain);
        sum->changed += x.changed;
        sum->tchanged = x.tchanged;
        sum->objects += x.objects;
        sum->nnz += x.nnz;
        sum->part_bytes += x.part_bytes;
        sum->snap += x.snap;
    }
    if (kind == FERRY_DELTA_SPARSE || kind == FERRY_DELTA_DENSE_FIRST)
        assert_int_equal(sum->changed, sum->tchanged);   /* else estimated from the sample */
}

/* Sparse objects of the model whose key names base generation `base`. */
static size_t sparse_on(ftg_env *f, uint64_t base)
{
    char **keys = NULL, want[32];
    size_t n = 0, hits = 0;
    assert_int_equal(ferry_store_list(f->s, "ferry/sp/dl.", NULL, 1000, &keys, &n, NULL, NULL), 0);
    snprintf(want, sizeof want, "/%020llu-", (unsigned long long)base);
    for (size_t i = 0; i < n; i++)
        hits += strstr(keys[i], want) != NULL;
    ferry_store_free(keys);
    return hits;
}

static size_t objects_of(ftg_env *f, uint64_t gen)
{
    char prefix[64], **keys = NULL;
    size_t n = 0;
    snprintf(prefix, sizeof prefix, "ferry/w/" MODEL "/%020llu/", (unsigned long long)gen);
    assert_int_equal(ferry_store_list(f->s, prefix, NULL, 1000, &keys, &n, NULL, NULL), 0);
    ferry_store_free(keys);
    return n;
}

static uint64_t active_of(ftg_env *f)
{
    uint64_t a = 0;
    assert_int_equal(ferry_weights_active(f->s, MODEL, &a, NULL, NULL), 0);
    return a;
}

static void all_err(ftg_env *f, const char *has, int skip)
{
    for (int k = 0; k < WORLD; k++)
        if (k != skip && (strncmp(f->line[k], "ERR", 3) || !strstr(f->line[k], has)))
            fail_msg("rank %d said \"%s\", wanted an error with \"%s\"", k, f->line[k], has);
}

static void test_chain(void **state)
{
    ftg_env *f = *state;
    double fracs[GEN_MAX + 2] = {0};
    opts o = { .addr = f->c.addr, .chain = "2", .cross = "0.05", .fracs = "" };
    assert_int_equal(ftg_start(f, WORLD, trainer_args, &o, -1, NULL), 0);
    rollout ro;
    rollout_open(&ro);
    ferry_sparse_update_stats ust;
    reply sum;
    uint64_t inexact = 0, model_elems = 0;
    for (size_t t = 0; t < NT; t++)
        model_elems += elems_of(t);

    /* g1: no snapshot anywhere: dense, every rank's snapshot filled */
    assert_int_equal(pub(f, 1, 0, "-", -1, -1), WORLD);
    all_ok(f, FERRY_DELTA_DENSE_FIRST, 0, &sum);
    assert_int_equal(sum.snap, model_elems * 2);
    assert_int_equal(rollout_check(f, &ro, 1, fracs, &ust), 0);

    /* g2: 2 % of the elements step: sparse on 1 */
    fracs[2] = 0.02;
    assert_int_equal(pub(f, 2, fracs[2], "-", -1, -1), WORLD);
    all_ok(f, FERRY_DELTA_SPARSE, 1, &sum);
    assert_true(sum.changed > 0 && (double)sum.changed < 0.03 * (double)model_elems);
    assert_int_equal(sum.nnz, sum.changed);       /* one entry per changed element */
    assert_true(sum.part_bytes > 0);              /* split tensors' entries reached owners */
    assert_true(sum.objects >= 4 && sum.objects <= NT);
    assert_int_equal(rollout_check(f, &ro, 2, fracs, &ust), 0);
    assert_int_equal(ust.deltas, 1);
    assert_int_equal(ust.entries_applied, sum.nnz);
    inexact += add_inexact(2, fracs);
    assert_int_equal(objects_of(f, 2), 0);        /* the parts are gone */

    /* g3: 30 % change, above twice the crossover: dense by the first look
     * (its sample holds every element here: each piece is one chunk) */
    fracs[3] = 0.3;
    assert_int_equal(pub(f, 3, fracs[3], "-", -1, -1), WORLD);
    all_ok(f, FERRY_DELTA_DENSE_FRACTION, 0, &sum);
    assert_true((double)sum.tchanged > 0.1 * (double)model_elems);
    assert_int_equal(sum.nnz, 0);
    assert_int_equal(rollout_check(f, &ro, 3, fracs, &ust), 0);

    /* g4, g5 sparse; K = 2: g6 dense, so a chain never holds more */
    for (uint64_t g = 4; g <= 6; g++) {
        fracs[g] = 0.01;
        assert_int_equal(pub(f, g, fracs[g], "-", -1, -1), WORLD);
        if (g < 6)
            all_ok(f, FERRY_DELTA_SPARSE, (unsigned)(g - 3), &sum);
        else
            all_ok(f, FERRY_DELTA_DENSE_CHAIN, 0, &sum);
        assert_int_equal(rollout_check(f, &ro, g, fracs, &ust), 0);
        if (g < 6)
            inexact += add_inexact(g, fracs);
    }
    /* the exactness is not the test's luck: a bf16 scatter_add of the
     * differences would have missed these elements */
    fprintf(stderr, "  elements a bf16 scatter_add would get wrong: %llu\n",
            (unsigned long long)inexact);
    assert_true(inexact > 0);

    /* g7, bad input: rank 1 declares w2 in another shape, rank 2 gives w0
     * another box: refused on every rank, nothing stored */
    fracs[7] = 0.01;
    assert_int_equal(pub(f, 7, fracs[7], "shape", 1, -1), 0);
    all_err(f, "failed: rank 1: tensor dl.w2 has the shape (30, 50), in the last generation "
            "(50, 30) (reset the encoder and publish dense); nothing stored", -1);
    assert_int_equal(pub(f, 7, fracs[7], "box", 2, -1), 0);
    all_err(f, "failed: rank 2: its piece 0 is dl.w0 [68:96, 0:40], in the last generation "
            "dl.w0 [64:96, 0:40] (reset the encoder and publish dense); nothing stored", -1);
    assert_int_equal(pub(f, 7, fracs[7], "cross", 1, -1), 0);
    all_err(f, "failed: rank 1: its encoder has crossover 0.5 and max_chain 2, rank 0's 0.05 and 2: "
            "every rank must decide alike; nothing stored", -1);
    assert_int_equal(sparse_on(f, 6), 0);
    assert_int_equal(objects_of(f, 7), 0);
    assert_int_equal(active_of(f), 6);

    /* g7, a rank failing after the owners stored: not announced, nothing left */
    assert_int_equal(pub(f, 7, fracs[7], "fail", 2, -1), 0);
    all_err(f, "rank 2: rank 2 failed after storing its objects (injected)", -1);
    assert_int_equal(sparse_on(f, 6), 0);
    assert_int_equal(active_of(f), 6);

    /* g7 published (the encoders kept generation 6) */
    assert_int_equal(pub(f, 7, fracs[7], "-", -1, -1), WORLD);
    all_ok(f, FERRY_DELTA_SPARSE, 1, &sum);
    assert_int_equal(rollout_check(f, &ro, 7, fracs, &ust), 0);

    /* g8, rank 1 dies with its objects stored: the others time out, g8 is
     * not announced, rank 1's objects stay ... */
    fracs[8] = 0.01;
    assert_int_equal(pub(f, 8, fracs[8], "die", 1, 1), 0);
    all_err(f, "not every trainer rank arrived", 1);
    assert_int_equal(active_of(f), 7);
    size_t left = sparse_on(f, 7);
    fprintf(stderr, "  objects a dead rank left on generation 7: %zu\n", left);
    assert_true(left > 0);
    /* ... until the next publish: every rank restarted (no snapshot), so
     * g8 goes dense, and the owners remove the leftovers on 7 first */
    snprintf(o.fracs, sizeof o.fracs, "%g,%g,%g,%g,%g,%g,%g", fracs[2], fracs[3], fracs[4],
             fracs[5], fracs[6], fracs[7], fracs[8]);
    assert_int_equal(ftg_start(f, WORLD, trainer_args, &o, -1, NULL), 0);
    assert_int_equal(pub(f, 8, fracs[8], "-", -1, -1), WORLD);
    all_ok(f, FERRY_DELTA_DENSE_FIRST, 0, &sum);
    assert_int_equal(sparse_on(f, 7), 0);
    assert_int_equal(rollout_check(f, &ro, 8, fracs, &ust), 0);

    /* g9, g10 sparse; a fresh rollout rebuilds from dense 8 + 2 deltas. In
     * g10 half of w4 changes: rank 0 (which holds it) changes more than the
     * crossover of its own elements, so it stops recording, but the
     * generation's fraction is below it: sparse, rank 0 compares again */
    for (uint64_t g = 9; g <= 10; g++) {
        fracs[g] = g == 9 ? 0.005 : 2.5;
        assert_int_equal(pub(f, g, fracs[g], "-", -1, -1), WORLD);
        all_ok(f, FERRY_DELTA_SPARSE, (unsigned)(g - 8), &sum);
        unsigned long long ch0 = 0;
        assert_int_equal(sscanf(f->line[0], "OK %*d %*u %llu", &ch0), 1);
        if (g == 10)
            assert_true(ch0 > 0.05 * 3072 && sum.changed < 0.05 * (double)model_elems);
    }
    rollout fresh;
    rollout_open(&fresh);
    assert_int_equal(rollout_check(f, &fresh, 10, fracs, &ust), 0);
    assert_int_equal(ust.dense_generation, 8);
    assert_int_equal(ust.deltas, 2);
    assert_int_equal(rollout_check(f, &ro, 10, fracs, &ust), 0);
    assert_int_equal(ust.deltas, 2);
    rollout_close(&fresh);

    /* a reset encoder publishes dense on every rank */
    assert_int_equal(ftg_send(f, "reset"), 0);
    assert_int_equal(ftg_collect(f, 20000, -1), WORLD);
    for (int k = 0; k < WORLD; k++)
        assert_string_equal(f->line[k], "OK reset 0");
    fracs[11] = 0.005;
    assert_int_equal(pub(f, 11, fracs[11], "-", -1, -1), WORLD);
    all_ok(f, FERRY_DELTA_DENSE_FIRST, 0, &sum);
    assert_int_equal(rollout_check(f, &ro, 11, fracs, &ust), 0);
    /* g12: 7 %, above the crossover but under twice it: the first look
     * leaves it to the whole comparison, whose exact counts make it dense */
    fracs[12] = 0.07;
    assert_int_equal(pub(f, 12, fracs[12], "-", -1, -1), WORLD);
    all_ok(f, FERRY_DELTA_DENSE_FRACTION, 0, &sum);
    assert_int_equal(sum.changed, sum.tchanged);   /* exact, not estimated */
    assert_true((double)sum.tchanged > 0.05 * (double)model_elems);
    assert_int_equal(rollout_check(f, &ro, 12, fracs, &ust), 0);
    rollout_close(&ro);
    ftg_stop(f);
}

/* ---- without a cluster -------------------------------------------------------------------- */

static void test_diff_paths(void **state)
{
    (void)state;
    uint64_t seed = 7;
    enum { N = 5000 };
    uint8_t *a = malloc(N * 4), *b = malloc(N * 4);
    uint32_t *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    const fr_conv_path paths[] = { FR_CONV_PORTABLE, FR_CONV_AVX2, FR_CONV_AVX512, FR_CONV_AUTO };
    int ran = 0;
    for (int round = 0; round < 200; round++) {
        size_t esize = round % 2 ? 4 : 2, n = (size_t)(mix(++seed) % N);
        for (size_t i = 0; i < n * esize; i++)
            a[i] = b[i] = (uint8_t)mix(++seed);
        /* changes: none, a few, runs, one byte of an element, the last one */
        double p = (double)(round % 5) * 0.02;
        for (size_t i = 0; i < n; i++)
            if ((double)(mix(++seed) % 1000) < p * 1000) {
                uint64_t u = mix(++seed);
                b[i * esize + (size_t)(u % esize)] ^= (uint8_t)(1u << (u >> 8) % 8);
            }
        if (n && round % 3 == 0)
            b[(n - 1) * esize] ^= 1;
        size_t k = fr_diff_path(FR_CONV_SCALAR, a, b, esize, n, want);
        for (size_t i = 0, j = 0; i < n; i++)   /* the reference against memcmp */
            if (memcmp(a + i * esize, b + i * esize, esize)) {
                assert_true(j < k);
                assert_int_equal(want[j++], i);
            }
        for (size_t q = 0; q < sizeof paths / sizeof paths[0]; q++) {
            if (!fr_conv_path_available(paths[q]))
                continue;
            ran++;
            size_t kk = fr_diff_path(paths[q], a, b, esize, n, got);
            assert_int_equal(kk, k);
            assert_memory_equal(got, want, k * sizeof *got);
        }
    }
    fprintf(stderr, "  %d path runs matched the reference (avx2 %s)\n", ran,
            fr_conv_path_available(FR_CONV_AVX2) ? "available" : "not available: skipped");
    assert_int_equal(fr_diff_path(FR_CONV_SCALAR, a, b, 8, 4, got), 0);
    free(a);
    free(b);
    free(want);
    free(got);
}

static void test_config(void **state)
{
    (void)state;
    ferry_delta_config dc;
    assert_int_equal(ferry_delta_config_init(NULL), FERRY_EINVAL);
    assert_int_equal(ferry_delta_config_init(&dc), 0);
    assert_true(dc.crossover == FERRY_DELTA_CROSSOVER);
    assert_int_equal(dc.max_chain, FERRY_DELTA_CHAIN);
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, "m");
    pc.world = 2;
    ferry_delta_encoder *e = (ferry_delta_encoder *)&pc;
    ferry_error err = {0};
    /* a zeroed config is the defaults */
    ferry_delta_config zero;
    memset(&zero, 0, sizeof zero);
    assert_int_equal(ferry_delta_encoder_open(&pc, &zero, &e, &err), 0);
    assert_true(e->dc.crossover == FERRY_DELTA_CROSSOVER);
    assert_int_equal(e->dc.max_chain, FERRY_DELTA_CHAIN);
    assert_int_equal(ferry_delta_encoder_bytes(e), 0);
    ferry_delta_encoder_close(e);
    ferry_delta_encoder_close(NULL);
    ferry_delta_encoder_reset(NULL);
    dc.reserved[3] = 1;
    assert_int_equal(ferry_delta_encoder_open(&pc, &dc, &e, &err), FERRY_EINVAL);
    assert_null(e);
    assert_non_null(strstr(err.msg, "reserved"));
    ferry_delta_config_init(&dc);
    dc.max_chain = FERRY_DELTA_CHAIN_MAX + 1;
    assert_int_equal(ferry_delta_encoder_open(&pc, &dc, &e, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "max_chain"));
    ferry_delta_config_init(&dc);
    dc.crossover = NAN;
    assert_int_equal(ferry_delta_encoder_open(&pc, &dc, &e, &err), FERRY_EINVAL);
    dc.crossover = -0.5;
    assert_int_equal(ferry_delta_encoder_open(&pc, &dc, &e, &err), FERRY_EINVAL);
    ferry_delta_config_init(&dc);
    pc.rank = 2;   /* rank >= world */
    assert_int_equal(ferry_delta_encoder_open(&pc, &dc, &e, &err), FERRY_EINVAL);
    assert_int_equal(ferry_delta_publish(NULL, NULL, 1, NULL, NULL, 0, NULL, &err), FERRY_EINVAL);
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--trainer"))
        return trainer_main(argv + 2);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_diff_paths),
        cmocka_unit_test(test_config),
        cmocka_unit_test_setup_teardown(test_chain, ftg_setup, ftg_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
