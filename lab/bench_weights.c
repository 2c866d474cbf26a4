/* `ferry-lab bench weights`: end-to-end weight-update time on one machine.
 *
 * A private master and node, trainer and rollout processes (TP x DP2 by
 * default) as in `ferry-lab demo`. Per generation: publish, then time
 *   - direct: the single-pull group update (each byte read from the store
 *     once by one worker, pushed to the replicas),
 *   - naive: every worker reads its own demand from the store,
 *   - compat: every worker receives every full tensor through the group
 *     update (each tensor read from the store once by its leader, written
 *     to the other workers),
 *   - naive compat: every worker reads every full tensor from the store.
 * The floors, measured in the same run, are the bytes an update must
 * deliver divided by the single-thread memcpy bandwidth of this machine:
 * for the direct updates what lands in the rollouts' parameters (model
 * bytes x DP), for the compat ones every full tensor in every rollout
 * (model bytes x rollouts). Every update verifies every byte. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "lab.h"
#include "demo.h"


/* Single-thread memcpy, f32 -> bf16 / f16 conversion (ferry_convert) and
 * FP8 quantization in 128 x 128 blocks (ferry_quantize_fp8_blocks, f32 and
 * bf16 in, f8e4m3 out) over the same pre-touched buffers, best of a few
 * passes each, all interleaved so that load from other processes hits them
 * alike. Rates are input bytes per second; the memcpy one is also the
 * floor's bandwidth. */
typedef struct conv_bench {
    double memcpy_gbps, bf16_gbps, f16_gbps;
    double quant_gbps, quant_bf16_gbps;   /* f32 (bf16) bytes quantized per second */
    double first_touch_gbps;   /* memcpy into pages this process never touched (0: not measured) */
} conv_bench;

enum { CONV_BYTES = 256u << 20, CONV_PASSES = 5, TOUCH_BYTES = 16u << 20, QUANT_COLS = 8192 };

static double rate(size_t n, double t0, double best)
{
    double dt = cli_now() - t0, r = dt > 0 ? (double)n / dt / 1e9 : 0;
    return r > best ? r : best;
}

/* What a cold generation pays: memcpy into pages of a memfd that are
 * resident (another mapping wrote them, as a node's segment is) but that
 * this mapping never touched, as a process's first write to a part of a
 * peer's segment is. A fresh mapping each pass, best of a few. */
static double bench_first_touch(const uint8_t *src)
{
    int fd = memfd_create("ferry-bench-touch", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, TOUCH_BYTES) < 0) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    double best = 0;
    uint8_t *own = mmap(NULL, TOUCH_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (own != MAP_FAILED) {
        memset(own, 1, TOUCH_BYTES);
        for (int r = 0; r < CONV_PASSES; r++) {
            uint8_t *m = mmap(NULL, TOUCH_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED)
                break;
            double t0 = cli_now();
            memcpy(m, src, TOUCH_BYTES);
            best = rate(TOUCH_BYTES, t0, best);
            munmap(m, TOUCH_BYTES);
        }
        munmap(own, TOUCH_BYTES);
    }
    close(fd);
    return best;
}

static int bench_convert(conv_bench *cb)
{
    size_t n = CONV_BYTES, count = n / 4;
    float *a = malloc(n);
    uint8_t *b = malloc(n), *q = malloc(count);
    float *scales = malloc(count / (FERRY_FP8_DEFAULT_BLOCK * FERRY_FP8_DEFAULT_BLOCK) * 4);
    *cb = (conv_bench){ 0 };
    if (!a || !b || !q || !scales) {
        free(a), free(b), free(q), free(scales);
        return -1;
    }
    memset(q, 3, count);
    uint32_t x = 12345;
    for (size_t i = 0; i < count; i++) {   /* weights-like values in (-1, 1), pages touched */
        x = x * 1664525u + 1013904223u;
        a[i] = ((float)(x >> 8) - 8388608.0f) / 8388608.0f;
    }
    memset(b, 2, n);
    int rc = 0;
    for (int r = 0; r < CONV_PASSES && rc == 0; r++) {
        double t0 = cli_now();
        memcpy(b, a, n);
        cb->memcpy_gbps = rate(n, t0, cb->memcpy_gbps);
        b[r] ^= ((uint8_t *)a)[n - 1 - (size_t)r];   /* keep the copy observable */
        t0 = cli_now();
        rc = ferry_convert(a, "f32", b, "f16", count);
        cb->f16_gbps = rate(n, t0, cb->f16_gbps);
        t0 = cli_now();
        rc = rc ? rc : ferry_convert(a, "f32", b, "bf16", count);
        cb->bf16_gbps = rate(n, t0, cb->bf16_gbps);
        /* a QUANT_COLS-wide matrix, the shape of a large projection */
        t0 = cli_now();
        rc = rc ? rc : ferry_quantize_fp8_blocks(a, "f32", QUANT_COLS, q, "f8e4m3", QUANT_COLS,
                                                 count / QUANT_COLS, QUANT_COLS, scales, NULL,
                                                 NULL);
        cb->quant_gbps = rate(n, t0, cb->quant_gbps);
        t0 = cli_now();   /* b holds count bf16 values now */
        rc = rc ? rc : ferry_quantize_fp8_blocks(b, "bf16", QUANT_COLS, q, "f8e4m3", QUANT_COLS,
                                                 count / QUANT_COLS, QUANT_COLS, scales, NULL,
                                                 NULL);
        cb->quant_bf16_gbps = rate(n / 2, t0, cb->quant_bf16_gbps);
    }
    cb->first_touch_gbps = rc == 0 ? bench_first_touch((const uint8_t *)a) : 0;
    free(a);
    free(b);
    free(q);
    free(scales);
    return rc;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static void print_quant(const conv_bench *cb)
{
    printf("fp8 quantization, one thread, 128 x 128 blocks, %u columns, f8e4m3 out: f32 in "
           "%.2f GB/s (quant_ratio %.3f); bf16 in %.2f GB/s (quant_ratio_bf16 %.3f)\n",
           (unsigned)QUANT_COLS, cb->quant_gbps, ratio(cb->quant_gbps, cb->memcpy_gbps),
           cb->quant_bf16_gbps, ratio(cb->quant_bf16_gbps, cb->memcpy_gbps));
}

static void print_convert(const conv_bench *cb, bool json)
{
    if (json) {
        printf("{\"memcpy_gbps\":%.3f,\"convert_bf16_gbps\":%.3f,\"convert_f16_gbps\":%.3f,"
               "\"convert_ratio\":%.3f,\"convert_ratio_f16\":%.3f,\"quant_gbps\":%.3f,"
               "\"quant_bf16_gbps\":%.3f,\"quant_ratio\":%.3f,\"quant_ratio_bf16\":%.3f,"
               "\"first_touch_gbps\":%.3f}\n",
               cb->memcpy_gbps, cb->bf16_gbps, cb->f16_gbps, ratio(cb->bf16_gbps, cb->memcpy_gbps),
               ratio(cb->f16_gbps, cb->memcpy_gbps), cb->quant_gbps, cb->quant_bf16_gbps,
               ratio(cb->quant_gbps, cb->memcpy_gbps), ratio(cb->quant_bf16_gbps, cb->memcpy_gbps),
               cb->first_touch_gbps);
        return;
    }
    printf("conversion, one thread, 256 MiB f32 in, best of %d: memcpy %.2f GB/s; f32 -> bf16 "
           "%.2f GB/s (convert_ratio %.3f); f32 -> f16 %.2f GB/s (%.3f)\n", CONV_PASSES,
           cb->memcpy_gbps, cb->bf16_gbps, ratio(cb->bf16_gbps, cb->memcpy_gbps), cb->f16_gbps,
           ratio(cb->f16_gbps, cb->memcpy_gbps));
    print_quant(cb);
    printf("first touch: memcpy into 16 MiB of resident memfd pages this process never touched: "
           "%.3f GB/s (%.1fx slower than memcpy; what a cold generation pays per page)\n",
           cb->first_touch_gbps, ratio(cb->memcpy_gbps, cb->first_touch_gbps));
}

static const cli_opt weights_table[] = {
    DEMO_OPT_ROWS("reps", 100000, "steady-state generations timed after the first (default 5)",
                  "the model's tensors up to this many bf16 bytes (default 1G)"),
    CLI_FLAG(demo_opts, convert_only, "convert-only",
             "only the f32 -> bf16/f16 conversion and FP8 quantization against memcpy (no cluster)"),
};

static const cli_cmd weights_cmd = {
    .name = "bench weights",
    .about = "Weight-update time (single-pull, naive, compat) against the memcpy floor, the\n"
             "first generation and the steady state.",
    .opts = weights_table,
    .nopts = sizeof weights_table / sizeof weights_table[0],
    .footer = "Other forms: ferry-lab bench weights --scale (the planning at scale, no cluster)\n"
              "and --torch (against torch.save and gloo), each with --help.\n",
};

/* ---- per generation, then first and steady state -------------------------------------- */

enum { FIG_PUBLISH, FIG_DIRECT, FIG_NAIVE, FIG_COMPAT, FIG_NCOMPAT, FIG_N };
static const char *const fig_key[FIG_N] = { "publish", "direct", "naive", "compat",
                                            "naive_compat" };

/* One generation's figures: each phase's time (the slowest process), the
 * store bytes read, and the counters of the publish, the direct and the
 * compat group update (summed bytes and faults, the slowest phases). */
typedef struct gen_fig {
    double t[FIG_N];
    uint64_t read[FIG_N], pushed;
    json_t *pj, *cj, *kj;
} gen_fig;

/* First generation, then the median and the max over the steady state. */
typedef struct fig_sum { double first, median, max; } fig_sum;

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static fig_sum summarize(const double *v, unsigned n)
{
    fig_sum s = { .first = v[0] };
    unsigned m = n - 1;
    double *w = malloc((m ? m : 1) * sizeof *w);
    if (!w || !m) {
        free(w);
        return s;
    }
    memcpy(w, v + 1, m * sizeof *w);
    qsort(w, m, sizeof *w, cmp_dbl);
    s.median = m % 2 ? w[m / 2] : (w[m / 2 - 1] + w[m / 2]) / 2;
    s.max = w[m - 1];
    free(w);
    return s;
}

static double counter(const json_t *j, const char *k)
{
    return j ? json_number_value(json_object_get(j, k)) : 0;
}

/* The steady-state generation whose direct update took the median time
 * (the upper one of two): its counters are the ones printed. */
static unsigned median_gen(const gen_fig *gf, unsigned ngen)
{
    unsigned best = 1;
    fig_sum d;
    double *v = malloc(ngen * sizeof *v);
    if (!v || ngen < 2) {
        free(v);
        return ngen - 1;
    }
    for (unsigned g = 0; g < ngen; g++)
        v[g] = gf[g].t[FIG_DIRECT];
    d = summarize(v, ngen);
    for (unsigned g = 1; g < ngen; g++)
        if (v[g] >= d.median && (v[best] < d.median || v[g] < v[best]))
            best = g;
    free(v);
    return best;
}

static char *dump(const json_t *j)
{
    return j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) : NULL;
}

#define TIMING_RULE                                                                              \
    "each figure is the slowest process's time of one step of one generation: publish = "        \
    "ferry_publish_shards on every trainer (packing and conversion, the store puts, the ranks' " \
    "barrier, the announcement and retention); direct/naive/compat/naive_compat = the rollouts' " \
    "update call (exchange, plan, store reads, pushes, forwards, apply, post-apply barrier; "     \
    "compat includes the loader's check of every element); the byte checks run after, outside " \
    "the timing; first = generation 1 in freshly started processes, steady = generations 2.. "  \
    "(median and max); faults = minor page faults summed over the role's processes during the " \
    "call"

static void bench_report(const demo_opts *o, const demo_model *dm, const conv_bench *cb,
                         const demo_group *grp, const gen_fig *gf, unsigned ngen)
{
    double bw = cb->memcpy_gbps, pub = (double)dm->bytes;
    uint64_t delivered = dm->bytes * o->dp, cdelivered = dm->bytes * o->rollouts;
    double floor_s = bw > 0 ? (double)delivered / (bw * 1e9) : 0;
    double cfloor_s = bw > 0 ? (double)cdelivered / (bw * 1e9) : 0;
    fig_sum fs[FIG_N], flt[3];
    double *v = calloc(ngen, sizeof *v);
    if (!v)
        return;
    for (int k = 0; k < FIG_N; k++) {
        for (unsigned g = 0; g < ngen; g++)
            v[g] = gf[g].t[k];
        fs[k] = summarize(v, ngen);
    }
    for (int k = 0; k < 3; k++) {   /* faults: publish, direct, compat */
        for (unsigned g = 0; g < ngen; g++)
            v[g] = counter(k == 0 ? gf[g].pj : k == 1 ? gf[g].cj : gf[g].kj, "faults");
        flt[k] = summarize(v, ngen);
    }
    free(v);
    /* pages each step writes: the publish stores the model once, a direct
     * update lands model x DP in the parameters, compat every tensor in
     * every rollout's staging (or a view of a mate's) */
    double pages[3] = { pub / 4096, (double)delivered / 4096, (double)cdelivered / 4096 };
    const gen_fig *m = &gf[median_gen(gf, ngen)];
    char *cjs = dump(m->cj), *pjs = dump(m->pj), *kjs = dump(m->kj);
    /* the first generation's, to see where its time goes against the steady state's */
    char *cjs1 = dump(gf[0].cj), *pjs1 = dump(gf[0].pj), *kjs1 = dump(gf[0].kj);
    if (o->json) {
        printf("{\"model\":\"%s\",\"bytes\":%llu,\"trainers\":%u,\"rollouts\":%u,\"dp\":%u,"
               "\"steady_generations\":%u,\"timing_rule\":\"%s\",\"warm_up\":%s,"
               "\"warm_up_s\":%.4f,\"warm_up_bytes\":%llu,", o->model,
               (unsigned long long)dm->bytes, o->trainers, o->rollouts, o->dp, ngen - 1,
               TIMING_RULE, o->cold ? "false" : "true", grp->warm_s,
               (unsigned long long)grp->warm_bytes);
        for (int k = 0; k < FIG_N; k++)
            printf("\"%s_s\":%.4f,\"%s_first_s\":%.4f,\"%s_max_s\":%.4f,", fig_key[k],
                   fs[k].median, fig_key[k], fs[k].first, fig_key[k], fs[k].max);
        printf("\"floor_s\":%.4f,\"compat_floor_s\":%.4f,\"memcpy_gbps\":%.3f,"
               "\"warm_memcpy_gbps\":%.3f,\"first_touch_gbps\":%.3f,"
               "\"direct_ratio_to_floor\":%.3f,\"direct_first_ratio_to_floor\":%.3f,"
               "\"direct_max_ratio_to_floor\":%.3f,\"compat_ratio_to_floor\":%.3f,"
               "\"compat_first_ratio_to_floor\":%.3f,\"compat_max_ratio_to_floor\":%.3f,"
               "\"store_read_ratio\":%.3f,\"naive_store_read_ratio\":%.3f,"
               "\"compat_store_read_ratio\":%.3f,\"naive_compat_store_read_ratio\":%.3f,"
               "\"compat_to_naive_compat\":%.3f,\"pushed_bytes\":%llu,\"verified\":true,"
               "\"publish_phase_coverage\":%.3f,\"update_phase_coverage\":%.3f,",
               floor_s, cfloor_s, bw, bw, cb->first_touch_gbps, ratio(fs[FIG_DIRECT].median, floor_s),
               ratio(fs[FIG_DIRECT].first, floor_s), ratio(fs[FIG_DIRECT].max, floor_s),
               ratio(fs[FIG_COMPAT].median, cfloor_s), ratio(fs[FIG_COMPAT].first, cfloor_s),
               ratio(fs[FIG_COMPAT].max, cfloor_s), m->read[FIG_DIRECT] / pub,
               m->read[FIG_NAIVE] / pub, m->read[FIG_COMPAT] / pub, m->read[FIG_NCOMPAT] / pub,
               ratio(fs[FIG_COMPAT].median, fs[FIG_NCOMPAT].median),
               (unsigned long long)m->pushed, counter(m->pj, "coverage"), counter(m->cj, "coverage"));
        static const char *const fk[3] = { "publish", "update", "compat_update" };
        for (int k = 0; k < 3; k++)
            printf("\"faults_per_%s\":%.0f,\"faults_per_%s_first\":%.0f,"
                   "\"faults_per_%s_max\":%.0f,\"pages_per_%s\":%.0f,\"fault_ratio_%s\":%.5f,",
                   fk[k], flt[k].median, fk[k], flt[k].first, fk[k], flt[k].max, fk[k], pages[k],
                   fk[k], ratio(flt[k].median, pages[k]));
        printf("\"generations_s\":{");
        for (int k = 0; k < FIG_N; k++) {
            printf("%s\"%s\":[", k ? "," : "", fig_key[k]);
            for (unsigned g = 0; g < ngen; g++)
                printf("%s%.4f", g ? "," : "", gf[g].t[k]);
            printf("]");
        }
        printf("},\"first_counters\":{\"direct\":%s,\"publish\":%s,\"compat\":%s}",
               cjs1 ? cjs1 : "null", pjs1 ? pjs1 : "null", kjs1 ? kjs1 : "null");
        printf(",\"direct_counters\":%s,\"publish_counters\":%s,\"compat_counters\":%s,"
               "\"convert_bf16_gbps\":%.3f,\"convert_f16_gbps\":%.3f,\"convert_ratio\":%.3f,"
               "\"convert_ratio_f16\":%.3f,\"quant_gbps\":%.3f,\"quant_bf16_gbps\":%.3f,"
               "\"quant_ratio\":%.3f,\"quant_ratio_bf16\":%.3f}\n", cjs ? cjs : "null",
               pjs ? pjs : "null", kjs ? kjs : "null", cb->bf16_gbps, cb->f16_gbps,
               ratio(cb->bf16_gbps, bw), ratio(cb->f16_gbps, bw), cb->quant_gbps,
               cb->quant_bf16_gbps, ratio(cb->quant_gbps, bw), ratio(cb->quant_bf16_gbps, bw));
    } else {
        char sz[32];
        printf("ferry-lab bench weights: %s, %zu tensors, %s bf16; %u trainers, %u rollouts (TP%u x "
               "DP%u); generation 1, then %u in the steady state\n", o->model, dm->n,
               cli_fmt_size(dm->bytes, sz, sizeof sz), o->trainers, o->rollouts,
               o->rollouts / o->dp, o->dp, ngen - 1);
        printf("machine: warm memcpy %.2f GB/s (one thread), first touch %.3f GB/s (%.1fx slower)\n",
               bw, cb->first_touch_gbps, ratio(bw, cb->first_touch_gbps));
        if (o->cold)
            printf("warm-up: none (--cold): generation 1 pays a first touch per page it lands on\n");
        else
            printf("warm-up: %s touched by the %u processes before generation 1 (staging, and "
                   "the segment through each one's mapping), the slowest in %.2f s\n",
                   cli_fmt_size(grp->warm_bytes, sz, sizeof sz), o->trainers + o->rollouts,
                   grp->warm_s);
        printf("%-22s %9s %9s %9s %9s %9s %7s %9s %9s\n", "step", "first s", "median s",
               "max s", "x floor", "1st x fl", "read", "faults", "1st flts");
        for (int k = 0; k < FIG_N; k++) {
            double fl = k == FIG_PUBLISH ? 0 : k <= FIG_NAIVE ? floor_s : cfloor_s;
            int fi = k == FIG_PUBLISH ? 0 : k == FIG_DIRECT ? 1 : k == FIG_COMPAT ? 2 : -1;
            char xf[16] = "-", x1[16] = "-", fa[16] = "-", f1[16] = "-", rd[16] = "-";
            if (fl > 0) {
                snprintf(xf, sizeof xf, "%.2f", fs[k].median / fl);
                snprintf(x1, sizeof x1, "%.2f", fs[k].first / fl);
                snprintf(rd, sizeof rd, "%.2fx", m->read[k] / pub);
            }
            if (fi >= 0) {
                snprintf(fa, sizeof fa, "%.0f", flt[fi].median);
                snprintf(f1, sizeof f1, "%.0f", flt[fi].first);
            }
            printf("%-22s %9.3f %9.3f %9.3f %9s %9s %7s %9s %9s\n", fig_key[k], fs[k].first,
                   fs[k].median, fs[k].max, xf, x1, rd, fa, f1);
        }
        char sz2[32];
        printf("floor: %s into the rollouts' parameters at %.2f GB/s = %.3f s; compat floor: %s "
               "(every full tensor into every rollout) = %.3f s\n",
               cli_fmt_size(delivered, sz, sizeof sz), bw, floor_s,
               cli_fmt_size(cdelivered, sz2, sizeof sz2), cfloor_s);
        printf("faults: minor page faults summed over the processes of the step (median of the "
               "steady state; the update writes %.0f pages, the publish %.0f)\n", pages[1],
               pages[0]);
        if (m->cj) {
            const json_t *u = m->cj;
#define N(k) counter(u, k)
            printf("direct, slowest worker, median generation (s): prepare %.3f (exchange %.3f), "
                   "plan %.3f, read %.3f, push %.3f (forward %.3f), barrier %.3f; apply %.3f in "
                   "%.0f batches; pushed cross-node %.0f, intra-node %.0f bytes; NIC in max/mean "
                   "%.2f; prepare + plan + apply + barrier = %.0f%% of each worker's call at "
                   "least\n", N("prepare_s"), N("exchange_s"), N("plan_s"), N("read_s"),
                   N("push_s"), N("forward_s"), N("barrier_s"), N("apply_s"), N("batches"),
                   N("pushed_cross"), N("pushed_intra"), N("nic_max_ratio_in"),
                   100 * N("coverage"));
#undef N
        }
        if (m->pj) {
            const json_t *u = m->pj;
            printf("publish, slowest rank, median generation (s): put %.3f (convert %.3f, store "
                   "%.3f), barrier %.3f, commit %.3f; put + barrier + commit = %.0f%% of each "
                   "rank's call at least\n", counter(u, "put_s"), counter(u, "convert_s"),
                   counter(u, "store_s"), counter(u, "barrier_s"), counter(u, "commit_s"),
                   100 * counter(u, "coverage"));
        }
        printf("timing: %s\n", TIMING_RULE);
        print_convert(cb, false);
    }
    free(cjs);
    free(pjs);
    free(kjs);
    free(cjs1);
    free(pjs1);
    free(kjs1);
}

int cmd_bench_scale(int argc, char **argv);   /* bench_scale.c */
int cmd_bench_torch(int argc, char **argv, const char *self);   /* bench_torch.c */

int cmd_bench_weights(int argc, char **argv, const char *self)
{
    (void)self;
    for (int i = 1; i < argc; i++)   /* --scale: the group plan at scale, no cluster */
        if (!strcmp(argv[i], "--scale"))
            return cmd_bench_scale(argc, argv);
    for (int i = 1; i < argc; i++)   /* --torch: against torch.save and gloo (Python) */
        if (!strcmp(argv[i], "--torch"))
            return cmd_bench_torch(argc, argv, self);
    demo_opts o;   /* the demo's options, and --convert-only */
    int pr = demo_parse(&weights_cmd, argc, argv, 5, 1ull << 30, &o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &weights_cmd);
    bool convert_only = o.convert_only;
    if (o.cold)
        setenv("FERRY_DEMO_COLD", "1", 1);
    else
        unsetenv("FERRY_DEMO_COLD");
    conv_bench cb;
    if (bench_convert(&cb) < 0) {
        fprintf(stderr, "ferry-lab bench weights: no memory for the conversion buffers (2 x 256 MiB and 64 MiB)\n");
        return 1;
    }
    if (convert_only) {
        print_convert(&cb, o.json);
        return 0;
    }
    demo_model dm;
    if (demo_model_build(o.model, o.bytes, &dm) < 0) {
        fprintf(stderr, "ferry-lab bench weights: unknown model preset %s\n", o.model);
        return 2;
    }
    demo_group grp = {0};
    int rc = 1;
    unsigned ngen = o.count + 1;   /* the first generation, then o.count in the steady state */
    gen_fig *gf = calloc(ngen, sizeof *gf);
    bool ok = gf != NULL;
    char err[256] = "";
    char cdir[64] = "";
    if (demo_counters_open(cdir, sizeof cdir) < 0)
        cdir[0] = 0;
    if (!ok || demo_group_start(&grp, o.model, o.bytes, dm.bytes, o.trainers, o.rollouts, o.dp,
                                "ferry-lab bench weights") < 0)
        goto out;
    for (unsigned g = 1; g <= ngen && ok; g++) {
        gen_fig *f = &gf[g - 1];
        char cmd[64];
        uint64_t a, b, c;
        if (!o.json)
            cli_progress("bench weights", (double)(g - 1) / ngen);
        snprintf(cmd, sizeof cmd, "publish %u", g);
        ok = demo_round(grp.tr, grp.ntr, cmd, &f->t[FIG_PUBLISH], &a, &b, NULL, err, sizeof err);
        f->pj = ok && cdir[0] ? demo_counters_collect(cdir, "trainer", grp.ntr) : NULL;
        snprintf(cmd, sizeof cmd, "direct %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &f->t[FIG_DIRECT], &f->read[FIG_DIRECT], &b,
                              &f->pushed, err, sizeof err) && b == 0;
        f->cj = ok && cdir[0] ? demo_counters_collect(cdir, "rollout", grp.nro) : NULL;
        snprintf(cmd, sizeof cmd, "naive %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &f->t[FIG_NAIVE], &f->read[FIG_NAIVE], &b,
                              NULL, err, sizeof err) && b == 0;
        snprintf(cmd, sizeof cmd, "compat %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &f->t[FIG_COMPAT], &f->read[FIG_COMPAT], &b,
                              NULL, err, sizeof err) && b == 0;
        f->kj = ok && cdir[0] ? demo_counters_collect(cdir, "compat", grp.nro) : NULL;
        snprintf(cmd, sizeof cmd, "naive_compat %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &f->t[FIG_NCOMPAT], &f->read[FIG_NCOMPAT], &b,
                              NULL, err, sizeof err) && b == 0;
        (void)c;
    }
    if (!o.json)
        cli_progress_done();
    if (!ok) {
        fprintf(stderr, "ferry-lab bench weights: an update failed: %s\n", err);
        goto out;
    }
    bench_report(&o, &dm, &cb, &grp, gf, ngen);
    rc = 0;
out:
    demo_group_stop(&grp);
    demo_model_free(&dm);
    for (unsigned g = 0; gf && g < ngen; g++) {
        json_decref(gf[g].pj);
        json_decref(gf[g].cj);
        json_decref(gf[g].kj);
    }
    free(gf);
    if (cdir[0])
        demo_counters_close(cdir);
    return rc;
}
