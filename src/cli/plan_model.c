/* `ferry plan --model M --src L --dst L --nic BW`: the weight update of a
 * modelled cluster, per NIC, for five ways of doing it (docs/weights.md,
 * "Reader assignment and the at-scale model").
 *
 * Cluster: the trainers (src layout) on their nodes, each tensor stored by
 * the rank ferry_weights_assign picks, on that rank's node; the rollout
 * workers (dst layout) on nodes of their own after the trainers'. A
 * worker's demand is its fragments of the dst layout. The model itself is
 * the library's (fr_update_model, src/testing/update_model.c: the reader
 * assignment the subscriber runs); this file gives it the NIC and prints. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "testing.h"   /* fr_update_model: the library's model, not public API */

static const char *const s_key[FR_UM_COUNT] = { "direct", "compat", "broadcast", "naive", "p2p",
                                                "lower_bound" };
static const char *const s_name[FR_UM_COUNT] = { "ferry direct", "ferry compatibility",
                                                 "broadcast from rank 0", "every worker reads",
                                                 "trainers point-to-point",
                                                 "lower bound" };

/* "400gbps", "100Gb/s", "25GB/s", "12.5GBps": b = bits, B = bytes. */
static int parse_bw(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0) || !isfinite(v))
        return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1e3; end++; break;
    case 'm': case 'M': mul = 1e6; end++; break;
    case 'g': case 'G': mul = 1e9; end++; break;
    case 't': case 'T': mul = 1e12; end++; break;
    default: break;
    }
    if (*end == 'b')
        mul /= 8;
    else if (*end != 'B')
        return -1;
    end++;
    if (strcmp(end, "ps") && strcmp(end, "/s") && strcmp(end, "it/s") && strcmp(end, "its/s"))
        return -1;
    *out = v * mul;
    return 0;
}

typedef struct figures {
    uint64_t max_in, max_out, store_read, cross_push;
    double mean_in, mean_out, time_s;
} figures;

static figures figures_of(const fr_um_totals *t, uint32_t nnodes, uint32_t nics, double bw)
{
    figures f = { .store_read = t->store_read, .cross_push = t->cross_push };
    uint64_t worst = 0;
    for (uint32_t n = 0; n < nnodes; n++) {
        f.max_in = t->in[n] > f.max_in ? t->in[n] : f.max_in;
        f.max_out = t->out[n] > f.max_out ? t->out[n] : f.max_out;
        f.mean_in += (double)t->in[n];
        f.mean_out += (double)t->out[n];
        uint64_t w = t->in[n] > t->out[n] ? t->in[n] : t->out[n];
        worst = w > worst ? w : worst;
    }
    /* per NIC: a node's bytes spread over its NICs */
    f.mean_in /= (double)nnodes * nics;
    f.mean_out /= (double)nnodes * nics;
    f.max_in /= nics;
    f.max_out /= nics;
    f.time_s = (double)worst / nics / bw;
    return f;
}

static void print_table(const fr_update_model *m, const figures *f, const char *model, const char *src,
                        const char *dst, const char *nic, uint32_t nics, double bw, bool fp8)
{
    char b[6][32];
    uint32_t rn = m->nnodes - m->ntrainer_nodes;
    printf("weight update  %s  %s -> %s  (trainers on %u node%s store each tensor once; rollouts on "
           "%u other node%s)\n", model, src, dst, m->ntrainer_nodes, m->ntrainer_nodes == 1 ? "" : "s",
           rn, rn == 1 ? "" : "s");
    if (fp8)
        printf("FP8 rollouts: the linear weights quantized once by the trainers, f8e4m3 in 128 x 128 "
               "blocks with f32 scales (the default rules); every other tensor bf16\n");
    printf("NIC %s = %.2f GB/s, %u per node; model %s in %s of rollout demand; reader assignment "
           "%.2f s\n\n", nic, bw / 1e9, nics, cli_fmt_size(m->model_bytes, b[0], sizeof b[0]),
           cli_fmt_size(m->demand_bytes, b[1], sizeof b[1]), m->assign_s);
    printf("  %-22s %12s %12s %12s %12s %12s %10s %9s\n", "per NIC", "store read", "max in", "max out",
           "mean in", "mean out", "time s", "x direct");
    for (int s = 0; s < FR_UM_COUNT; s++) {
        printf("  %-22s %12s %12s %12s %12s %12s %10.3f %9.2f\n", s_name[s],
               cli_fmt_size(f[s].store_read, b[0], sizeof b[0]), cli_fmt_size(f[s].max_in, b[1], sizeof b[1]),
               cli_fmt_size(f[s].max_out, b[2], sizeof b[2]),
               cli_fmt_size((uint64_t)f[s].mean_in, b[3], sizeof b[3]),
               cli_fmt_size((uint64_t)f[s].mean_out, b[4], sizeof b[4]), f[s].time_s,
               f[FR_UM_DIRECT].time_s > 0 ? f[s].time_s / f[FR_UM_DIRECT].time_s : 0);
    }
    printf("\ntime: max over NICs of max(bytes in, bytes out) / bandwidth; means over all %u nodes.\n",
           m->nnodes);
}

static void print_json(const fr_update_model *m, const figures *f, const char *model, const char *src,
                       const char *dst, uint32_t nics, double bw, bool fp8)
{
    printf("{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"fp8\":%s,\"nic_bytes_per_s\":%.0f,"
           "\"nics_per_node\":%u,"
           "\"trainer_nodes\":%u,\"rollout_nodes\":%u,\"model_bytes\":%" PRIu64 ",\"demand_bytes\":%" PRIu64
           ",\"assign_s\":%.3f", model, src, dst, fp8 ? "true" : "false", bw, nics, m->ntrainer_nodes, m->nnodes - m->ntrainer_nodes,
           m->model_bytes, m->demand_bytes, m->assign_s);
    for (int s = 0; s < FR_UM_COUNT; s++)
        printf(",\"%s\":{\"store_read_bytes\":%" PRIu64 ",\"max_in_bytes\":%" PRIu64 ",\"max_out_bytes\":%"
               PRIu64 ",\"mean_in_bytes\":%.0f,\"mean_out_bytes\":%.0f,\"cross_push_bytes\":%" PRIu64
               ",\"time_s\":%.6f,\"ratio_to_direct\":%.4f}", s_key[s], f[s].store_read, f[s].max_in,
               f[s].max_out, f[s].mean_in, f[s].mean_out, f[s].cross_push, f[s].time_s,
               f[FR_UM_DIRECT].time_s > 0 ? f[s].time_s / f[FR_UM_DIRECT].time_s : 0);
    printf("}\n");
}

int cli_quantize_pair(ferry_manifest **src, ferry_manifest **dst, ferry_error *err)
{
    ferry_manifest *qs = NULL, *qd = NULL;
    int rc = ferry_manifest_quantize_source(*src, NULL, &qs, err);
    if (rc == 0)
        rc = ferry_manifest_quantize(*dst, NULL, &qd, err);
    if (rc < 0) {
        ferry_manifest_close(qs);
        return rc;
    }
    ferry_manifest_close(*src);
    ferry_manifest_close(*dst);
    *src = qs, *dst = qd;
    return 0;
}

int cli_plan_model(const char *model, const char *src, const char *dst, uint32_t gpn, const char *nic,
                   uint32_t nics, bool fp8, bool json)
{
    double bw;
    if (parse_bw(nic, &bw) < 0) {
        fprintf(stderr, "ferry: --nic wants a rate such as 400gbps, 100Gb/s or 25GB/s, not '%s'\n", nic);
        return 2;
    }
    if (!model) {
        fprintf(stderr, "ferry plan: --nic needs --model, --src and --dst\n");
        return 2;
    }
    nics = nics ? nics : 1;
    ferry_error err = {0};
    ferry_model *pm = NULL;
    ferry_manifest *ms = NULL, *md = NULL;
    ferry_layout ls, ld;
    int rc = ferry_model_preset(model, &pm, &err);
    if (rc == 0)
        rc = ferry_layout_parse(src, &ls, &err);
    if (rc == 0)
        rc = ferry_layout_parse(dst, &ld, &err);
    if (rc == 0 && gpn)
        ls.gpus_per_node = ld.gpus_per_node = gpn;
    if (rc == 0)
        rc = ferry_layout_build(pm, &ls, &ms, &err);
    if (rc == 0)
        rc = ferry_layout_build(pm, &ld, &md, &err);
    if (rc == 0 && fp8)
        rc = cli_quantize_pair(&ms, &md, &err);
    ferry_model_free(pm);
    if (rc < 0) {
        fprintf(stderr, "ferry plan: %s\n", err.msg[0] ? err.msg : ferry_strerror(rc));
        ferry_manifest_close(ms);
        ferry_manifest_close(md);
        return 1;
    }
    fr_update_model *m = NULL;
    rc = fr_update_model_build(ms, md, &m);
    ferry_manifest_close(ms);
    ferry_manifest_close(md);
    if (rc < 0) {
        fprintf(stderr, "ferry plan: modelling the update failed (out of memory or too many cells)\n");
        return 1;
    }
    figures f[FR_UM_COUNT];
    for (int s = 0; s < FR_UM_COUNT; s++)
        f[s] = figures_of(&m->t[s], m->nnodes, nics, bw);
    if (json)
        print_json(m, f, model, src, dst, nics, bw, fp8);
    else
        print_table(m, f, model, src, dst, nic, nics, bw, fp8);
    fr_update_model_free(m);
    return 0;
}
