/* `ferry bench weights`: end-to-end weight-update time on one machine.
 *
 * A private master and node, trainer and rollout processes (TP x DP2 by
 * default) as in `ferry demo`. Per generation: publish, then time
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

#include "cli.h"
#include "demo_int.h"


/* Single-thread memcpy and f32 -> bf16 / f16 conversion (ferry_convert)
 * over the same pre-touched buffers, best of a few passes each, the three
 * interleaved so that load from other processes hits them alike. Rates are
 * input bytes per second; the memcpy one is also the floor's bandwidth. */
typedef struct conv_bench {
    double memcpy_gbps, bf16_gbps, f16_gbps;
    double first_touch_gbps;   /* memcpy into pages this process never touched (0: not measured) */
} conv_bench;

enum { CONV_BYTES = 256u << 20, CONV_PASSES = 5, TOUCH_BYTES = 16u << 20 };

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
    uint8_t *b = malloc(n);
    *cb = (conv_bench){ 0 };
    if (!a || !b) {
        free(a), free(b);
        return -1;
    }
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
        rc = ferry_convert(a, "f32", b, "bf16", count);
        cb->bf16_gbps = rate(n, t0, cb->bf16_gbps);
        t0 = cli_now();
        rc = rc ? rc : ferry_convert(a, "f32", b, "f16", count);
        cb->f16_gbps = rate(n, t0, cb->f16_gbps);
    }
    cb->first_touch_gbps = rc == 0 ? bench_first_touch((const uint8_t *)a) : 0;
    free(a);
    free(b);
    return rc;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static void print_convert(const conv_bench *cb, bool json)
{
    if (json) {
        printf("{\"memcpy_gbps\":%.3f,\"convert_bf16_gbps\":%.3f,\"convert_f16_gbps\":%.3f,"
               "\"convert_ratio\":%.3f,\"convert_ratio_f16\":%.3f,\"first_touch_gbps\":%.3f}\n",
               cb->memcpy_gbps, cb->bf16_gbps, cb->f16_gbps, ratio(cb->bf16_gbps, cb->memcpy_gbps),
               ratio(cb->f16_gbps, cb->memcpy_gbps), cb->first_touch_gbps);
        return;
    }
    printf("conversion, one thread, 256 MiB f32 in, best of %d: memcpy %.2f GB/s; f32 -> bf16 "
           "%.2f GB/s (convert_ratio %.3f); f32 -> f16 %.2f GB/s (%.3f)\n", CONV_PASSES,
           cb->memcpy_gbps, cb->bf16_gbps, ratio(cb->bf16_gbps, cb->memcpy_gbps), cb->f16_gbps,
           ratio(cb->f16_gbps, cb->memcpy_gbps));
    printf("first touch: memcpy into 16 MiB of resident memfd pages this process never touched: "
           "%.3f GB/s (%.1fx slower than memcpy; what a cold generation pays per page)\n",
           cb->first_touch_gbps, ratio(cb->memcpy_gbps, cb->first_touch_gbps));
}

static void usage_weights(FILE *f)
{
    fprintf(f, "usage: ferry bench weights [--trainers N (4)] [--rollouts N (4)] [--dp N (2 if it divides)] "
               "[--bytes SIZE (1G)] [--model PRESET (qwen3-8b)] [--reps N (3)] [--json]\n"
               "                           [--convert-only] | --scale [...] (see --scale --help)\n"
               "                           | --torch [...] (against torch.save and gloo; see --torch --help)\n"
               "  --convert-only  only the f32 -> bf16/f16 conversion against memcpy (no "
               "cluster)\n");
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
    int pr = demo_parse("bench weights", argc, argv, "--reps", 3, 1ull << 30, &o);
    if (pr != 0)
        return cli_usage_exit(pr, usage_weights);
    bool convert_only = o.convert_only;
    conv_bench cb;
    if (bench_convert(&cb) < 0) {
        fprintf(stderr, "ferry bench weights: no memory for the 2 x 256 MiB conversion buffers\n");
        return 1;
    }
    if (convert_only) {
        print_convert(&cb, o.json);
        return 0;
    }
    demo_model dm;
    if (demo_model_build(o.model, o.bytes, &dm) < 0) {
        fprintf(stderr, "ferry bench weights: unknown model preset %s\n", o.model);
        return 2;
    }
    double bw = cb.memcpy_gbps;
    demo_group grp;
    int rc = 1;
    double best_direct = 0, best_naive = 0, best_compat = 0, best_ncompat = 0;
    uint64_t direct_read = 0, naive_read = 0, compat_read = 0, ncompat_read = 0, pushed = 0;
    bool ok = true;
    char err[256] = "";
    char cdir[64] = "";
    json_t *counters = NULL;   /* of the best direct update */
    json_t *pcounters = NULL;  /* of the publish before it */
    json_t *ccounters = NULL;  /* of the best compat group update */
    if (demo_counters_open(cdir, sizeof cdir) < 0)
        cdir[0] = 0;
    if (demo_group_start(&grp, o.model, o.bytes, dm.bytes, o.trainers, o.rollouts, o.dp,
                         "ferry bench weights") < 0)
        goto out;
    for (unsigned g = 1; g <= o.count + 1 && ok; g++) {
        char cmd[64];
        double t;
        uint64_t a, b, c;
        if (!o.json)
            cli_progress("bench weights", (double)(g - 1) / (o.count + 1));
        snprintf(cmd, sizeof cmd, "publish %u", g);
        ok = demo_round(grp.tr, grp.ntr, cmd, &t, &a, &b, NULL, err, sizeof err);
        json_t *pj = ok && cdir[0] ? demo_counters_collect(cdir, "trainer", grp.ntr) : NULL;
        /* generation 1 warms every buffer up and is not counted */
        snprintf(cmd, sizeof cmd, "direct %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &t, &a, &b, &c, err, sizeof err) && b == 0;
        json_t *cj = ok && cdir[0] ? demo_counters_collect(cdir, "rollout", grp.nro) : NULL;
        if (ok && g > 1 && (best_direct == 0 || t < best_direct)) {
            best_direct = t;
            direct_read = a;
            pushed = c;
            json_decref(counters);
            counters = json_incref(cj);
            json_decref(pcounters);
            pcounters = json_incref(pj);
        }
        json_decref(cj);
        json_decref(pj);
        snprintf(cmd, sizeof cmd, "naive %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &t, &a, &b, NULL, err, sizeof err);
        if (ok && g > 1 && (best_naive == 0 || t < best_naive)) {
            best_naive = t;
            naive_read = a;
        }
        snprintf(cmd, sizeof cmd, "compat %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &t, &a, &b, NULL, err, sizeof err) && b == 0;
        json_t *kj = ok && cdir[0] ? demo_counters_collect(cdir, "compat", grp.nro) : NULL;
        if (ok && g > 1 && (best_compat == 0 || t < best_compat)) {
            best_compat = t;
            compat_read = a;
            json_decref(ccounters);
            ccounters = json_incref(kj);
        }
        json_decref(kj);
        snprintf(cmd, sizeof cmd, "naive_compat %u", g);
        ok = ok && demo_round(grp.ro, grp.nro, cmd, &t, &a, &b, NULL, err, sizeof err) && b == 0;
        if (ok && g > 1 && (best_ncompat == 0 || t < best_ncompat)) {
            best_ncompat = t;
            ncompat_read = a;
        }
    }
    if (!o.json)
        cli_progress_done();
    if (!ok) {
        fprintf(stderr, "ferry bench weights: an update failed: %s\n", err);
        goto out;
    }
    uint64_t delivered = dm.bytes * o.dp, cdelivered = dm.bytes * o.rollouts;
    double floor_s = bw > 0 ? (double)delivered / (bw * 1e9) : 0;
    double cfloor_s = bw > 0 ? (double)cdelivered / (bw * 1e9) : 0;
    double pub = (double)dm.bytes;
    char *cjs = counters ? json_dumps(counters, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                                     JSON_REAL_PRECISION(10)) : NULL;
    char *pjs = pcounters ? json_dumps(pcounters, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                                       JSON_REAL_PRECISION(10)) : NULL;
    char *kjs = ccounters ? json_dumps(ccounters, JSON_COMPACT | JSON_PRESERVE_ORDER |
                                                       JSON_REAL_PRECISION(10)) : NULL;
    if (o.json) {
        printf("{\"model\":\"%s\",\"bytes\":%llu,\"trainers\":%u,\"rollouts\":%u,\"dp\":%u,"
               "\"direct_s\":%.4f,\"naive_s\":%.4f,\"compat_s\":%.4f,\"floor_s\":%.4f,"
               "\"memcpy_gbps\":%.3f,\"direct_ratio_to_floor\":%.3f,\"store_read_ratio\":%.3f,"
               "\"naive_store_read_ratio\":%.3f,\"compat_store_read_ratio\":%.3f,"
               "\"pushed_bytes\":%llu,\"verified\":true,\"direct_counters\":%s,"
               "\"publish_counters\":%s,\"naive_compat_s\":%.4f,"
               "\"naive_compat_store_read_ratio\":%.3f,\"compat_to_naive_compat\":%.3f,"
               "\"compat_counters\":%s,\"convert_bf16_gbps\":%.3f,\"convert_f16_gbps\":%.3f,"
               "\"convert_ratio\":%.3f,\"convert_ratio_f16\":%.3f,\"compat_floor_s\":%.4f,"
               "\"compat_ratio_to_floor\":%.3f,\"first_touch_gbps\":%.3f}\n",
               o.model, (unsigned long long)dm.bytes, o.trainers, o.rollouts, o.dp, best_direct,
               best_naive, best_compat, floor_s, bw, floor_s > 0 ? best_direct / floor_s : 0,
               direct_read / pub, naive_read / pub, compat_read / pub,
               (unsigned long long)pushed, cjs ? cjs : "null", pjs ? pjs : "null", best_ncompat,
               ncompat_read / pub, best_ncompat > 0 ? best_compat / best_ncompat : 0,
               kjs ? kjs : "null", cb.bf16_gbps, cb.f16_gbps, ratio(cb.bf16_gbps, bw),
               ratio(cb.f16_gbps, bw), cfloor_s, ratio(best_compat, cfloor_s),
               cb.first_touch_gbps);
    } else {
        char sz[32];
        printf("ferry bench weights: %s, %zu tensors, %s bf16; %u trainers, %u rollouts (TP%u x "
               "DP%u); best of %u generations after a warm-up one\n", o.model, dm.n,
               cli_fmt_size(dm.bytes, sz, sizeof sz), o.trainers, o.rollouts, o.rollouts / o.dp,
               o.dp, o.count);
        printf("%-28s %10s %12s %12s\n", "update", "seconds", "x its floor", "store read");
        printf("%-28s %10.3f %12.2f %11.2fx\n", "direct (single-pull)", best_direct,
               best_direct / floor_s, direct_read / pub);
        printf("%-28s %10.3f %12.2f %11.2fx\n", "naive (each reads its own)", best_naive,
               best_naive / floor_s, naive_read / pub);
        printf("%-28s %10.3f %12.2f %11.2fx\n", "compat (group, leaders)", best_compat,
               ratio(best_compat, cfloor_s), compat_read / pub);
        printf("%-28s %10.3f %12.2f %11.2fx\n", "naive compat (each reads all)", best_ncompat,
               ratio(best_ncompat, cfloor_s), ncompat_read / pub);
        printf("floor: %s into the rollouts' parameters at %.2f GB/s (memcpy, one thread) = "
               "%.3f s\n", cli_fmt_size(delivered, sz, sizeof sz), bw, floor_s);
        printf("compat floor: %s (every full tensor into every rollout) at %.2f GB/s = %.3f s "
               "(compat_ratio_to_floor %.2f)\n", cli_fmt_size(cdelivered, sz, sizeof sz), bw,
               cfloor_s, ratio(best_compat, cfloor_s));
        if (counters) {
            const json_t *u = counters;
#define N(k) json_number_value(json_object_get(u, k))
            printf("direct, slowest worker (s): prepare %.3f (exchange %.3f), plan %.3f, read %.3f, "
                   "push %.3f (forward %.3f), barrier %.3f; apply %.3f in %.0f batches; pushed "
                   "cross-node %.0f, intra-node %.0f bytes; NIC in max/mean %.2f\n",
                   N("prepare_s"), N("exchange_s"), N("plan_s"), N("read_s"), N("push_s"),
                   N("forward_s"), N("barrier_s"), N("apply_s"), N("batches"), N("pushed_cross"),
                   N("pushed_intra"), N("nic_max_ratio_in"));
#undef N
        }
        print_convert(&cb, false);
    }
    free(cjs);
    free(pjs);
    free(kjs);
    rc = 0;
out:
    demo_group_stop(&grp);
    demo_model_free(&dm);
    json_decref(counters);
    json_decref(pcounters);
    json_decref(ccounters);
    if (cdir[0])
        demo_counters_close(cdir);
    return rc;
}
