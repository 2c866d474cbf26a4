/* FP8 rollouts quantized once, before the network (docs/weights.md, "FP8
 * rollouts"), against a real master and node with three trainer processes
 * publishing FSDP 3 shards (ferry_publish_shards with quantization rules):
 *  - 1024 x 600 f32 "l.q_proj.weight" and 600 x 1024 bf16 "l.o_proj.weight"
 *    cut by the FSDP boundaries at rows 342/684 and 200/400 (inside blocks
 *    2 and 5, and 1 and 3, of 128 rows), a 1-D norm left unquantized (bf16);
 *    then cut along columns (TP row-parallel trainer shards of 3: columns
 *    200/400 and 342/684), then published whole (ferry_publish: its
 *    placement cuts q_proj at row 873);
 *    values spread over many magnitudes per block, a block of zeros, NaNs
 *    and infinities on both sides of a cut, a block whose largest value
 *    lies on the other side of the cut from most of its rows;
 *  - TP 2 rollout workers (column-parallel q_proj: rows; row-parallel
 *    o_proj: columns) read their FP8 shards and the scale rows or columns
 *    of them with ferry_weights_update_direct and as a subscriber group of
 *    two processes, and a subscriber holding every tensor reads each
 *    stored byte once (the group of two too): every FP8 byte and scale is
 *    compared, bit for bit, with a reference quantizer written in this file
 *    from the documented formula (it shares no code with the library: the
 *    FP8 value of a product is the nearest of the 255 finite codes, decoded
 *    here, ties to the even code);
 *  - a compatibility loader (ferry_weights_update_compat, and a
 *    compatibility group) receives (name, FP8 tensor) and
 *    (name_scale_inv, scales) whole, equal to the reference;
 *  - the generation's manifest records the quantization (roles, blocks,
 *    cut blocks) and the bytes stored are FP8 + scales: about half of bf16;
 *  - a rank that fails before the scale agreement fails the attempt on
 *    every rank at once, nothing announced;
 *  - explicit dequantization in a direct update (bf16 of rows that cut a
 *    block, a row pitch) equals the reference's q * s in bf16; refused for
 *    a tensor not in FP8 and by the subscriber;
 *  - a rollout buffer of 2-byte elements for an FP8 tensor and a shard that
 *    cuts a block are refused at prepare with a sentence, nothing written;
 *    a streamed publish and a delta encoder refuse rules. */
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

#include "rl/gen_int.h"
#include "util/ftgroup.h"
#include "ferry/weights.h"
#include "ferry/weights_compat.h"

#define WORLD 3
#define MODEL "fp8"
#define B 128

enum { TQ, TO, TN, NT };   /* q_proj (f32), o_proj (bf16), norm (f32, not quantized) */
static const char *const names[NT] = { "l.q_proj.weight", "l.o_proj.weight", "l.norm.weight" };
static const char *const scale_names[2] = { "l.q_proj.weight_scale_inv",
                                            "l.o_proj.weight_scale_inv" };
static const uint64_t shapes[NT][2] = { { 1024, 600 }, { 600, 1024 }, { 600, 1 } };
static const uint32_t rank_node[WORLD] = { 0, 0, 0 };

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Element (r, c) of tensor t in generation gen, as an f32 (o_proj is held
 * in bf16: the test rounds it there, see held()). */
static float value(uint64_t gen, int t, uint64_t r, uint64_t c)
{
    if (t == TN)
        return (float)(r % 17) * 0.25f;
    if (t == TQ) {
        if (r < B && c < B)
            return 0.0f;                                  /* a block of zeros */
        if ((r == 300 && c == 20) || (r == 345 && c == 21))
            return NAN;                                   /* both sides of the cut at 342 */
        if (r == 341 && c == 30)
            return INFINITY;
        if (r == 342 && c == 31)
            return -INFINITY;
        if (r == 350 && c == 10)
            return 1.0e4f;                                /* block (2, 0): rank 1's rows */
        if (r == 683 && c == 599)
            return -3.0e4f;                               /* block (5, 4), partial, cut at 684 */
    }
    uint64_t h = mix(gen * 1000003u + (uint64_t)t * 7919u + r * 4099u + c);
    int e = (int)((r / B * 7 + c / B * 3 + gen) % 24) - 12;   /* magnitudes per block */
    float m = (float)(h >> 40) / (float)(1u << 24) - 0.5f;    /* [-0.5, 0.5) */
    return ldexpf(m, e);
}

/* The value as a trainer holds it (o_proj in bf16: rounded to nearest
 * even here, by hand). */
static float held(uint64_t gen, int t, uint64_t r, uint64_t c)
{
    float v = value(gen, t, r, c);
    if (t != TO || isnan(v))
        return v;
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

/* ---- the reference quantizer (docs/weights.md: the block and element formulas) -------- */

static double e4m3_value(int code)   /* a finite code 0..0x7e, positive */
{
    int e = (code >> 3) & 15, m = code & 7;
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

static uint8_t ref_fp8(float p)
{
    if (isnan(p))
        return (uint8_t)(signbit(p) ? 0xff : 0x7f);
    double a = fabs((double)p);
    if (isinf(a))   /* saturates: no infinity in E4M3 */
        a = 448;
    int best = 0;
    double bd = INFINITY;
    for (int k = 0; k <= 0x7e; k++) {
        double d = fabs(e4m3_value(k) - a);
        if (d < bd || (d == bd && (k & 1) == 0 && (best & 1))) {
            bd = d;
            best = k;
        }
    }
    return (uint8_t)(best | (signbit(p) ? 0x80 : 0));
}

/* Tensor t quantized whole: q (rows x cols bytes) and scales. */
static void reference(uint64_t gen, int t, uint8_t *q, float *scales)
{
    uint64_t rows = shapes[t][0], cols = shapes[t][1], nbc = (cols + B - 1) / B;
    for (uint64_t br = 0; br * B < rows; br++)
        for (uint64_t bc = 0; bc < nbc; bc++) {
            float amax = 0;
            for (uint64_t r = br * B; r < rows && r < br * B + B; r++)
                for (uint64_t c = bc * B; c < cols && c < bc * B + B; c++) {
                    float x = fabsf(held(gen, t, r, c));
                    if (isfinite(x) && x > amax)
                        amax = x;
                }
            volatile float s = (amax > 1e-4f ? amax : 1e-4f) / 448.0f;
            volatile float m = 1.0f / s;
            scales[br * nbc + bc] = s;
            for (uint64_t r = br * B; r < rows && r < br * B + B; r++)
                for (uint64_t c = bc * B; c < cols && c < bc * B + B; c++) {
                    volatile float p = held(gen, t, r, c) * m;
                    q[r * cols + c] = ref_fp8(p);
                }
        }
}

/* ---- a trainer process ------------------------------------------------------------------ */

/* FSDP over WORLD ranks along dim 0 of every tensor (the norm whole on
 * rank 0); with cols, along dim 1 (TP row-parallel shards of 3: q_proj's
 * columns cut at 200 and 400, o_proj's at 342 and 684). */
static ferry_manifest *placement(bool cols)
{
    ferry_manifest *m = NULL;
    if (ferry_manifest_create(WORLD, rank_node, 1, &m) < 0)
        return NULL;
    for (int t = 0; t < NT; t++) {
        ferry_tensor_desc d = { .name = names[t], .dtype = t == TO ? "bf16" : "f32",
                                .itemsize = t == TO ? 2 : 4, .ndim = t == TN ? 1 : 2,
                                .shape = { shapes[t][0], shapes[t][1] } };
        ferry_split sp = { .tensor = (uint32_t)t, .whole = true };
        sp.parts[cols ? 1 : 0] = t == TN ? 1 : WORLD;
        sp.rank_stride[cols ? 1 : 0] = 1;
        if (ferry_manifest_add_tensor(m, &d, NULL) < 0 || ferry_manifest_add_split(m, &sp, NULL) < 0) {
            ferry_manifest_close(m);
            return NULL;
        }
    }
    return m;
}

static ferry_shard_data *my_pieces(ferry_manifest *m, uint32_t rank, uint64_t gen, size_t *n)
{
    uint64_t nf = ferry_manifest_fragment_count(m);
    ferry_shard_data *v = calloc(nf, sizeof *v);
    *n = 0;
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(m, id, &f) < 0 || f.rank != rank)
            continue;
        int t = (int)f.tensor;
        uint64_t cols = t == TN ? 1 : f.shape[1], elems = f.shape[0] * cols;
        uint8_t *buf = malloc(elems * 4);
        for (uint64_t i = 0; i < elems; i++) {
            float x = held(gen, t, f.offset[0] + i / cols, f.offset[1] + i % cols);
            if (t == TO) {
                uint32_t u;
                memcpy(&u, &x, 4);
                uint16_t h = (uint16_t)(u >> 16);
                if (isnan(x))
                    h = 0x7fc0;
                memcpy(buf + 2 * i, &h, 2);
            } else {
                memcpy(buf + 4 * i, &x, 4);
            }
        }
        v[(*n)++] = (ferry_shard_data){ .fragment = id, .data = buf };
    }
    return v;
}

/* Whole tensors for ferry_publish (every rank holds them): its placement
 * cuts q_proj into pieces of rows that end inside a block. */
static int publish_whole(ferry_store *s, const ferry_publisher_config *pc, uint64_t gen,
                         ferry_publish_stats *st, ferry_error *err)
{
    ferry_weight_tensor t[NT];
    ferry_manifest *m = placement(false), *one = NULL;   /* every tensor whole on one rank */
    (void)ferry_manifest_create(1, NULL, 1, &one);
    for (int k = 0; k < NT; k++) {
        ferry_tensor_desc d;
        ferry_fragment f = { .tensor = (uint32_t)k, .shape = { shapes[k][0], shapes[k][1] } };
        (void)ferry_manifest_tensor(m, (uint32_t)k, &d);
        (void)ferry_manifest_add_tensor(one, &d, NULL);
        (void)ferry_manifest_add_fragment(one, &f, NULL);
    }
    size_t n = 0;
    ferry_shard_data *v = my_pieces(one, 0, gen, &n);
    for (int k = 0; k < NT; k++)
        t[k] = (ferry_weight_tensor){ .name = names[k], .dtype = k == TO ? "bf16" : "f32",
                                      .ndim = k == TN ? 1 : 2,
                                      .shape = { shapes[k][0], shapes[k][1] }, .data = v[k].data };
    free(v);
    ferry_manifest_close(one);
    ferry_manifest_close(m);
    int rc = ferry_publish(s, pc, gen, t, NT, st, err);
    for (int k = 0; k < NT; k++)
        free((void *)t[k].data);
    return rc;
}

/* argv: addr rank gen mode ("rows", "cols": shards; "whole": ferry_publish) */
static int trainer_main(char **argv)
{
    uint32_t rank = (uint32_t)atoi(argv[1]);
    uint64_t gen = strtoull(argv[2], NULL, 10);
    const char *mode = argv[3];
    ferry_store *s = NULL;
    if (ftg_worker_store(argv[0], &s) < 0)
        return 1;
    ferry_quant_rules rules;
    ferry_quant_rules_init(&rules);
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, "%s", MODEL);
    snprintf(pc.out_dtype, sizeof pc.out_dtype, "bf16");
    pc.rank = rank;
    pc.world = WORLD;
    pc.rank_node = rank_node;
    pc.timeout_ms = 60000;
    pc.quant = &rules;
    ferry_manifest *m = placement(!strcmp(mode, "cols"));
    size_t n = 0;
    ferry_shard_data *mine = my_pieces(m, rank, gen, &n);
    ferry_publish_stats st;
    ferry_error err = {0};
    if (!strcmp(mode, "nodata") && rank == 1)   /* fails before the agreement */
        n--;
    int rc = !strcmp(mode, "whole") ? publish_whole(s, &pc, gen, &st, &err)
                                    : ferry_publish_shards(s, &pc, gen, m, mine, n, &st, &err);
    if (rc == 0)
        printf("OK %llu %llu\n", (unsigned long long)st.bytes, (unsigned long long)st.total_bytes);
    else
        printf("ERR %d %s\n", rc, err.msg);
    fflush(stdout);
    for (size_t k = 0; k < n + (!strcmp(mode, "nodata") && rank == 1); k++)
        free((void *)mine[k].data);
    free(mine);
    ferry_manifest_close(m);
    ferry_store_close(s);
    return 0;
}

/* ---- the test side ---------------------------------------------------------------------- */

typedef struct round_opts {
    const char *addr, *mode;
    char gen[32];
} round_opts;

static void trainer_args(const void *ctx, int rank, ftg_args *a)
{
    const round_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { "--trainer", o->addr, a->buf[0], o->gen, o->mode, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* Every trainer publishes gen; how many said OK. */
static int publish_round(ftg_env *f, uint64_t gen, const char *mode)
{
    round_opts o = { .addr = f->c.addr, .mode = mode };
    snprintf(o.gen, sizeof o.gen, "%llu", (unsigned long long)gen);
    assert_int_equal(ftg_spawn(f, WORLD, trainer_args, &o, -1, NULL), 0);
    int ok = ftg_collect(f, 90000, -1);
    for (int k = 0; k < WORLD; k++)
        fprintf(stderr, "  trainer %d: %s\n", k, f->line[k]);
    ftg_stop(f);
    return ok;
}

static void publish(ftg_env *f, uint64_t gen, const char *mode)
{
    assert_int_equal(publish_round(f, gen, mode), WORLD);
}

/* The expected bytes of every quantized tensor and its scales. */
typedef struct expect {
    uint8_t *q[2];
    float *s[2];
} expect;

static void expect_of(uint64_t gen, expect *e)
{
    for (int t = 0; t < 2; t++) {
        e->q[t] = malloc(shapes[t][0] * shapes[t][1]);
        e->s[t] = malloc(((shapes[t][0] + B - 1) / B) * ((shapes[t][1] + B - 1) / B) * 4);
        reference(gen, t, e->q[t], e->s[t]);
    }
}

static void expect_free(expect *e)
{
    for (int t = 0; t < 2; t++) {
        free(e->q[t]);
        free(e->s[t]);
    }
}

/* Box [r0, r0+nr) x [c0, c0+nc) of a rows x cols tensor of esz-byte
 * elements, as bound (contiguous), equals the same box of want. */
static void same_box(const char *what, const uint8_t *got, const uint8_t *want, uint64_t cols,
                     uint64_t r0, uint64_t nr, uint64_t c0, uint64_t nc, size_t esz)
{
    for (uint64_t r = 0; r < nr; r++)
        if (memcmp(got + r * nc * esz, want + ((r0 + r) * cols + c0) * esz, nc * esz) != 0) {
            for (uint64_t c = 0; c < nc; c++)
                if (memcmp(got + (r * nc + c) * esz, want + ((r0 + r) * cols + c0 + c) * esz, esz))
                    fail_msg("%s: element [%llu,%llu] differs from the reference", what,
                             (unsigned long long)(r0 + r), (unsigned long long)(c0 + c));
        }
}

/* TP worker w of 2: q_proj rows [512w, +512) (column-parallel), o_proj
 * columns [512w, +512) (row-parallel), the scale blocks of each, the norm. */
typedef struct worker {
    ferry_param_shard sh[5];
    uint8_t *q, *o;
    float *qs, *os;
    uint16_t *norm;
} worker;

static void worker_bind(worker *w, int k)
{
    memset(w, 0, sizeof *w);
    w->q = calloc(512 * 600, 1);
    w->o = calloc(600 * 512, 1);
    w->qs = calloc(4 * 5, 4);
    w->os = calloc(5 * 4, 4);
    w->norm = calloc(600, 2);
    uint64_t o = 512 * (uint64_t)k;
    w->sh[0] = (ferry_param_shard){ .tensor = names[TQ], .ndim = 2, .offset = { o, 0 },
                                    .shape = { 512, 600 }, .dst = w->q, .dst_bytes = 512 * 600,
                                    .elem_bytes = 1 };
    w->sh[1] = (ferry_param_shard){ .tensor = scale_names[TQ], .ndim = 2, .offset = { o / B, 0 },
                                    .shape = { 4, 5 }, .dst = w->qs, .dst_bytes = 80,
                                    .elem_bytes = 4 };
    w->sh[2] = (ferry_param_shard){ .tensor = names[TO], .ndim = 2, .offset = { 0, o },
                                    .shape = { 600, 512 }, .dst = w->o, .dst_bytes = 600 * 512,
                                    .elem_bytes = 1 };
    w->sh[3] = (ferry_param_shard){ .tensor = scale_names[TO], .ndim = 2, .offset = { 0, o / B },
                                    .shape = { 5, 4 }, .dst = w->os, .dst_bytes = 80,
                                    .elem_bytes = 4 };
    w->sh[4] = (ferry_param_shard){ .tensor = names[TN], .ndim = 1, .shape = { 600 },
                                    .dst = w->norm, .dst_bytes = 1200, .elem_bytes = 2 };
}

static void worker_check(const worker *w, int k, const expect *e, uint64_t gen)
{
    uint64_t o = 512 * (uint64_t)k;
    same_box("q_proj", w->q, e->q[TQ], 600, o, 512, 0, 600, 1);
    same_box("q_proj scales", (const uint8_t *)w->qs, (const uint8_t *)e->s[TQ], 5, o / B, 4, 0,
             5, 4);
    same_box("o_proj", w->o, e->q[TO], 1024, 0, 600, o, 512, 1);
    same_box("o_proj scales", (const uint8_t *)w->os, (const uint8_t *)e->s[TO], 8, 0, 5,
             o / B, 4, 4);
    for (uint64_t r = 0; r < 600; r++) {
        float x = value(gen, TN, r, 0);
        uint32_t u;
        memcpy(&u, &x, 4);
        assert_int_equal(w->norm[r], (uint16_t)(u >> 16));   /* exact in bf16 */
    }
}

static void worker_free(worker *w)
{
    free(w->q);
    free(w->o);
    free(w->qs);
    free(w->os);
    free(w->norm);
}

/* argv: addr worker gen. TP worker k of a subscriber group of 2 (its own
 * process): one update to gen, every byte checked against the reference.
 * Prints "OK <group bytes read> <group bytes pushed>". */
static int rollout_main(char **argv)
{
    int k = atoi(argv[1]);
    uint64_t gen = strtoull(argv[2], NULL, 10);
    ferry_store *s = NULL;
    if (ftg_worker_store(argv[0], &s) < 0)
        return 1;
    worker w;
    worker_bind(&w, k);
    ferry_subscriber_config sc = { .model = MODEL, .group = "tp2", .rank = (uint32_t)k,
                                   .world = 2, .timeout_ms = 60000 };
    snprintf(sc.group, sizeof sc.group, "tp2-%llu", (unsigned long long)gen);
    ferry_subscriber *sub = NULL;
    ferry_error err = {0};
    ferry_update_stats st = {0};
    uint64_t have = 0;
    int rc = ferry_subscriber_open(s, &sc, w.sh, 5, &sub, &err);
    if (rc == 0)
        rc = ferry_subscriber_update(sub, &have, &st, &err);
    ferry_subscriber_close(sub);
    if (rc != 0) {
        printf("ERR %d %s\n", rc, err.msg);
    } else {
        expect e;
        expect_of(gen, &e);
        worker_check(&w, k, &e, gen);   /* fails the process: no OK line */
        expect_free(&e);
        printf("OK %llu %llu %llu\n", (unsigned long long)have,
               (unsigned long long)st.group_bytes_read,
               (unsigned long long)(st.group_pushed_cross + st.group_pushed_intra));
    }
    fflush(stdout);
    worker_free(&w);
    ferry_store_close(s);
    return 0;
}

static void rollout_args(const void *ctx, int rank, ftg_args *a)
{
    const round_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { "--rollout", o->addr, a->buf[0], o->gen, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* A compatibility loader's view: (name, FP8 tensor) and (name_scale_inv,
 * scales), each whole, as an FP8 checkpoint's loader takes them. */
typedef struct loaded {
    const expect *e;
    int seen;
} loaded;

static int load_one(void *ctx, const ferry_weight_entry *en, const void *data)
{
    loaded *l = ctx;
    for (int t = 0; t < 2; t++) {
        uint64_t n = shapes[t][0] * shapes[t][1];
        uint64_t ns = ((shapes[t][0] + B - 1) / B) * ((shapes[t][1] + B - 1) / B);
        if (!strcmp(en->name, names[t])) {
            assert_string_equal(en->dtype, "f8e4m3");
            assert_int_equal(en->bytes, n);
            assert_memory_equal(data, l->e->q[t], n);
            l->seen++;
        } else if (!strcmp(en->name, scale_names[t])) {
            assert_string_equal(en->dtype, "f32");
            assert_int_equal(en->shape[0] * en->shape[1], ns);
            assert_memory_equal(data, l->e->s[t], ns * 4);
            l->seen++;
        }
    }
    return 0;
}

/* Generations 1-3 published from FSDP rows, TP row-parallel columns and
 * whole tensors, each cutting blocks. */
static void test_fp8_fsdp_to_tp(void **state)
{
    ftg_env *f = *state;
    expect e;
    static const char *const modes[] = { "rows", "cols", "whole" };
    for (uint64_t gen = 1; gen <= 3; gen++) {
        const char *mode = modes[gen - 1];
        fprintf(stderr, "generation %llu, from %s\n", (unsigned long long)gen, mode);
        publish(f, gen, mode);
        expect_of(gen, &e);
        /* the block (2, 0) of q_proj: its maximum, 1e4, lies in rank 1's rows;
         * rank 0's rows of it were quantized with that scale too */
        assert_true(e.s[TQ][2 * 5] == 1.0e4f / 448.0f);
        assert_true(e.s[TQ][0] == 1e-4f / 448.0f);   /* the block of zeros */

        /* The generation's manifest records the quantization. */
        fr_gen *g = NULL;
        ferry_error err = {0};
        assert_int_equal(fr_gen_load(f->s, MODEL, gen, &g, &err), 0);
        int qi = ferry_manifest_find_tensor(g->m, names[TQ]);
        int si = ferry_manifest_find_tensor(g->m, scale_names[TQ]);
        int ni = ferry_manifest_find_tensor(g->m, names[TN]);
        assert_true(qi >= 0 && si >= 0 && ni >= 0);
        ferry_tensor_quant tq;
        assert_int_equal(ferry_manifest_tensor_quant(g->m, (uint32_t)qi, &tq), 0);
        assert_int_equal(tq.role, FERRY_QUANT_WEIGHT);
        assert_int_equal(tq.partner, si);
        assert_string_equal(tq.fp8_dtype, "f8e4m3");
        assert_int_equal(ferry_manifest_tensor_quant(g->m, (uint32_t)ni, &tq), 0);
        assert_int_equal(tq.role, FERRY_QUANT_NONE);
        char *json = ferry_manifest_to_json(g->m);
        assert_non_null(strstr(json, "\"cut_blocks\":true"));
        free(json);
        if (!strcmp(mode, "cols")) {   /* o_proj's scale columns 0-2, 3-5, 6-7 */
            int oi = ferry_manifest_find_tensor(g->m, scale_names[TO]);
            for (uint64_t id = 0; id < ferry_manifest_fragment_count(g->m); id++) {
                ferry_fragment fr;
                assert_int_equal(ferry_manifest_fragment(g->m, id, &fr), 0);
                if ((int)fr.tensor != oi)
                    continue;
                static const uint64_t off[3] = { 0, 3, 6 }, len[3] = { 3, 3, 2 };
                assert_int_equal(fr.offset[1], off[fr.rank]);
                assert_int_equal(fr.shape[1], len[fr.rank]);
                assert_int_equal(fr.shape[0], 5);
            }
        }
        /* scale fragments: rank 0 block rows 0-2, rank 1 3-5, rank 2 6-7 of q_proj */
        uint64_t nf = ferry_manifest_fragment_count(g->m), stored = 0;
        for (uint64_t id = 0; id < nf; id++) {
            ferry_fragment fr;
            assert_int_equal(ferry_manifest_fragment(g->m, id, &fr), 0);
            ferry_tensor_desc d;
            assert_int_equal(ferry_manifest_tensor(g->m, fr.tensor, &d), 0);
            stored += fr.shape[0] * (d.ndim > 1 ? fr.shape[1] : 1) * d.itemsize;
            if ((int)fr.tensor == si && !strcmp(mode, "rows")) {
                static const uint64_t off[3] = { 0, 3, 6 }, len[3] = { 3, 3, 2 };
                assert_int_equal(fr.offset[0], off[fr.rank]);
                assert_int_equal(fr.shape[0], len[fr.rank]);
            }
        }
        uint64_t fp8 = 1024 * 600 + 600 * 1024, scales = (8 * 5 + 5 * 8) * 4, norm = 600 * 2;
        uint64_t bf16 = (1024 * 600 + 600 * 1024) * 2 + norm;
        assert_int_equal(stored, fp8 + scales + norm);
        fprintf(stderr, "stored: %llu bytes (FP8 %llu + scales %llu + norm %llu); as bf16 %llu: "
                "%.3f\n", (unsigned long long)stored, (unsigned long long)fp8,
                (unsigned long long)scales, (unsigned long long)norm, (unsigned long long)bf16,
                (double)stored / (double)bf16);
        fr_gen_free(g);

        /* TP 2, each worker on its own (parameter-direct). */
        for (int k = 0; k < 2; k++) {
            worker w;
            worker_bind(&w, k);
            uint64_t have = 0;
            ferry_update_stats st;
            if (ferry_weights_update_direct(f->s, MODEL, &have, w.sh, 5, &st, &err) != 0)
                fail_msg("worker %d: %s", k, err.msg);
            assert_int_equal(have, gen);
            assert_int_equal(st.bytes_read, 512 * 600 + 600 * 512 + 80 + 80 + 1200);
            worker_check(&w, k, &e, gen);
            worker_free(&w);
        }
        /* A subscriber group of one holding both workers' shards: every
         * stored byte read once, FP8 + scales. */
        worker w[2];
        ferry_param_shard all[10];
        for (int k = 0; k < 2; k++) {
            worker_bind(&w[k], k);
            memcpy(all + 5 * k, w[k].sh, sizeof w[k].sh);
        }
        ferry_subscriber_config sc = { .model = MODEL, .group = "g", .rank = 0, .world = 1,
                                       .timeout_ms = 30000 };
        ferry_subscriber *sub = NULL;
        uint64_t have = 0;
        ferry_update_stats st;
        assert_int_equal(ferry_subscriber_open(f->s, &sc, all, 10, &sub, &err), 0);
        if (ferry_subscriber_update(sub, &have, &st, &err) != 0)
            fail_msg("subscriber: %s", err.msg);
        assert_int_equal(have, gen);
        fprintf(stderr, "subscriber: group bytes read %llu (FP8 + scales + norm %llu; bf16 "
                "%llu)\n", (unsigned long long)st.group_bytes_read,
                (unsigned long long)stored, (unsigned long long)bf16);
        assert_int_equal(st.group_bytes_read, stored);
        ferry_subscriber_close(sub);
        for (int k = 0; k < 2; k++) {
            worker_check(&w[k], k, &e, gen);
            worker_free(&w[k]);
        }
        /* TP 2 as a subscriber group of two processes: FP8 rows and
         * columns, scales and the norm read once and pushed between them */
        round_opts ro = { .addr = f->c.addr };
        snprintf(ro.gen, sizeof ro.gen, "%llu", (unsigned long long)gen);
        assert_int_equal(ftg_spawn(f, 2, rollout_args, &ro, -1, NULL), 0);
        int ok = ftg_collect(f, 90000, -1);
        for (int k = 0; k < 2; k++)
            fprintf(stderr, "  rollout %d: %s\n", k, f->line[k]);
        ftg_stop(f);
        assert_int_equal(ok, 2);
        char want[64];
        snprintf(want, sizeof want, "OK %llu %llu ", (unsigned long long)gen,
                 (unsigned long long)stored);
        for (int k = 0; k < 2; k++)
            assert_true(!strncmp(f->line[k], want, strlen(want)));
        loaded l = { .e = &e };
        have = 0;
        if (ferry_weights_update_compat(f->s, MODEL, &have, load_one, &l, NULL, &err) != 0)
            fail_msg("compat: %s", err.msg);
        assert_int_equal(l.seen, 4);
        /* the compatibility group (a group of one): the same tensors */
        ferry_compat_config cc = { .model = MODEL, .group = "compat", .world = 1,
                                   .staging_bytes = 4u << 20, .timeout_ms = 30000 };
        ferry_compat_group *cg = NULL;
        assert_int_equal(ferry_compat_group_open(f->s, &cc, &cg, &err), 0);
        loaded lg = { .e = &e };
        have = 0;
        if (ferry_compat_group_update(cg, &have, load_one, &lg, NULL, &err) != 0)
            fail_msg("compat group: %s", err.msg);
        assert_int_equal(lg.seen, 4);
        ferry_compat_group_close(cg);
        expect_free(&e);
    }
}

/* An FP8 tensor asked into 2-byte elements, or by a shard cutting a block:
 * refused at prepare, nothing written. */
static void test_fp8_bindings_refused(void **state)
{
    ftg_env *f = *state;
    /* A rank that fails before the agreement (no data for a piece) still
     * meets the others at it: every rank fails at once with its reason
     * (the trainers wait 60 s for each other: a hang would fail the
     * collect), nothing announced; then the generation publishes. */
    assert_int_equal(publish_round(f, 1, "nodata"), 0);
    for (int k = 0; k < WORLD; k++)
        assert_non_null(strstr(f->line[k], "rank 1 holds fragment"));
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(f->s, MODEL, &active, NULL, NULL), FERRY_ENOENT);
    publish(f, 1, "rows");
    uint8_t *buf = malloc(342 * 600 * 2);
    memset(buf, 0xa5, 342 * 600 * 2);
    ferry_param_shard sh = { .tensor = names[TQ], .ndim = 2, .shape = { 342, 600 }, .dst = buf,
                             .dst_bytes = 342 * 600 * 2, .elem_bytes = 2 };
    ferry_error err = {0};
    uint64_t g = 0;
    assert_int_equal(ferry_weights_update_direct(f->s, MODEL, &g, &sh, 1, NULL, &err),
                     FERRY_EINVAL);
    fprintf(stderr, "bf16 of FP8: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "tensor l.q_proj.weight is published as f8e4m3 in 128 x 128 "
                           "blocks (its scales in tensor l.q_proj.weight_scale_inv): the shard's "
                           "buffer holds 2-byte elements, an FP8 buffer one-byte ones"));
    sh.elem_bytes = 1;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_weights_update_direct(f->s, MODEL, &g, &sh, 1, NULL, &err),
                     FERRY_EINVAL);
    fprintf(stderr, "cut block: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "the shard at offset [0,0], shape [342,600] ends at row 342, "
                           "inside block row 2: a rollout shard must hold whole blocks"));
    ferry_subscriber_config sc = { .model = MODEL, .group = "r", .rank = 0, .world = 1,
                                   .timeout_ms = 30000 };
    ferry_subscriber *sub = NULL;
    assert_int_equal(ferry_subscriber_open(f->s, &sc, &sh, 1, &sub, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_subscriber_update(sub, &g, NULL, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "a rollout shard must hold whole blocks"));
    ferry_subscriber_close(sub);
    assert_int_equal(g, 0);
    for (size_t i = 0; i < 342 * 600 * 2; i++)
        assert_int_equal(buf[i], 0xa5);
    free(buf);
    /* A streamed publish stores each tensor as it comes: no rules. */
    ferry_quant_rules rules;
    ferry_quant_rules_init(&rules);
    ferry_publisher_config pc;
    ferry_publisher_config_init(&pc);
    snprintf(pc.model, sizeof pc.model, "%s", MODEL);
    pc.world = 1;
    pc.quant = &rules;
    ferry_publish_stream *ps = NULL;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_publish_stream_begin(f->s, &pc, 2, &ps, &err), FERRY_EINVAL);
    assert_null(ps);
    assert_non_null(strstr(err.msg, "a streamed publish does not quantize"));
    /* nor a delta encoder (deltas compare in the rollout dtype) */
    ferry_delta_encoder *enc = NULL;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_delta_encoder_open(&pc, NULL, &enc, &err), FERRY_EINVAL);
    assert_null(enc);
    assert_non_null(strstr(err.msg, "a delta encoder does not quantize"));
}

/* Explicit dequantization (ferry_param_shard.dequantize, direct updates):
 * q_proj rows [0, 342) — a shard that cuts a block — into bf16 with a row
 * pitch of 610, equal to the reference's q * s rounded to bf16 by hand;
 * asked of a tensor not in FP8, or of the subscriber: refused. */
static void test_fp8_dequantize(void **state)
{
    ftg_env *f = *state;
    publish(f, 1, "rows");
    expect e;
    expect_of(1, &e);
    uint64_t pitch = 610, rows = 342, cols = 600;
    uint16_t *buf = malloc(rows * pitch * 2);
    memset(buf, 0xa5, rows * pitch * 2);
    ferry_param_shard sh = { .tensor = names[TQ], .ndim = 2, .shape = { rows, cols },
                             .strides = { (int64_t)pitch, 1 }, .dst = buf,
                             .dst_bytes = rows * pitch * 2, .elem_bytes = 2,
                             .dequantize = "bf16" };
    ferry_error err = {0};
    uint64_t g = 0;
    ferry_update_stats st;
    if (ferry_weights_update_direct(f->s, MODEL, &g, &sh, 1, &st, &err) != 0)
        fail_msg("dequantize: %s", err.msg);
    assert_int_equal(g, 1);
    /* FP8 rows 0-341 and the scales of block rows 0-2 */
    assert_int_equal(st.bytes_read, rows * cols + 3 * 5 * 4);
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t c = 0; c < cols; c++) {
            uint8_t q = e.q[TQ][r * cols + c];
            float s = e.s[TQ][(r / B) * 5 + c / B];
            uint16_t want;
            if ((q & 0x7f) == 0x7f) {
                want = 0x7fc0;   /* a NaN: checked as one below */
            } else {
                volatile float x = (float)e4m3_value(q & 0x7f) * s;
                if (q & 0x80)
                    x = -x;
                uint32_t u;
                float xv = x;
                memcpy(&u, &xv, 4);
                want = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            }
            uint16_t got = buf[r * pitch + c];
            if ((q & 0x7f) == 0x7f)
                assert_true((got & 0x7f80) == 0x7f80 && (got & 0x7f));
            else if (got != want)
                fail_msg("[%llu,%llu]: 0x%04x, the reference 0x%04x", (unsigned long long)r,
                         (unsigned long long)c, got, want);
        }
        for (uint64_t c = cols; c < pitch && r + 1 < rows; c++)
            assert_int_equal(buf[r * pitch + c], 0xa5a5);   /* the pitch's gap untouched */
    }
    /* not an FP8 tensor */
    ferry_param_shard nn = { .tensor = names[TN], .ndim = 1, .shape = { 600 }, .dst = buf,
                             .dst_bytes = 1200, .dequantize = "bf16" };
    g = 0;
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_weights_update_direct(f->s, MODEL, &g, &nn, 1, NULL, &err),
                     FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "tensor l.norm.weight is published as bf16, not as FP8 in "
                           "blocks: there is nothing to dequantize (asked bf16)"));
    /* the subscriber does not */
    ferry_subscriber_config sc = { .model = MODEL, .group = "d", .rank = 0, .world = 1,
                                   .timeout_ms = 30000 };
    ferry_subscriber *sub = NULL;
    assert_int_equal(ferry_subscriber_open(f->s, &sc, &sh, 1, &sub, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(ferry_subscriber_update(sub, &g, NULL, &err), FERRY_ENOTSUP);
    fprintf(stderr, "subscriber: %s\n", err.msg);
    ferry_subscriber_close(sub);
    assert_int_equal(g, 0);
    free(buf);
    expect_free(&e);
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "--trainer"))
        return trainer_main(argv + 2);
    if (argc == 5 && !strcmp(argv[1], "--rollout"))
        return rollout_main(argv + 2);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fp8_fsdp_to_tp, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_fp8_bindings_refused, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_fp8_dequantize, ftg_setup, ftg_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
