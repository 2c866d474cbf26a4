/* `ferry plan`: print a reshard plan between two layouts or two manifest
 * files (the planning benchmark is `ferry-lab bench plan`). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "cli_opts.h"

typedef struct plan_opts {
    const char *model, *src, *dst;     /* preset + layouts, or two files */
    const char *save_src, *save_dst;
    uint32_t gpn;
    bool json;
    uint64_t runs;                     /* runs to print */
    uint64_t dst_rank;                 /* UINT64_MAX: every rank */
    const char *nic;                   /* --nic: the at-scale update model (plan_model.c) */
    uint32_t nics;
    bool fp8;                          /* --fp8: FP8 rollouts (the default quantization rules) */
    bool models;                       /* --models: list the presets */
} plan_opts;

static const cli_opt plan_table[] = {
    CLI_ARG(plan_opts, model, "model", "PRESET", "the model (ferry plan --models lists the presets)"),
    CLI_ARG(plan_opts, src, "src", "LAYOUT", "the trainers' layout"),
    CLI_ARG(plan_opts, dst, "dst", "LAYOUT", "the rollouts' layout"),
    CLI_UINT(plan_opts, gpn, "gpus-per-node", "N", 1, 1024, "ranks per node (default 8)"),
    CLI_ARG(plan_opts, save_src, "save-src", "FILE", "write the source manifest to FILE (default: not written)"),
    CLI_ARG(plan_opts, save_dst, "save-dst", "FILE", "write the target manifest to FILE (default: not written)"),
    CLI_UINT(plan_opts, runs, "runs", "N", 0, 1000000000, "print the plan's first N byte runs (default 0)"),
    CLI_UINT(plan_opts, dst_rank, "dst-rank", "R", 0, UINT32_MAX,   /* ranks are uint32 */
             "only the runs of target rank R (default: every rank)"),
    CLI_ARG(plan_opts, nic, "nic", "BW", "model the weight update over NICs of BW (400gbps, 50GB/s)"),
    CLI_UINT(plan_opts, nics, "nics-per-node", "N", 1, 64, "NICs per node for --nic (default 1)"),
    CLI_FLAG(plan_opts, fp8, "fp8", "FP8 rollouts: the linear weights in f8e4m3 128 x 128 blocks with "
             "f32 scales, as FP8 checkpoints store them (default: as the manifests say)"),
    CLI_FLAG(plan_opts, models, "models", "list the model presets"),
    CLI_FLAG(plan_opts, json, "json", "JSON on stdout (default: text)"),
};

static const cli_cmd plan_cmd = {
    .name = "plan",
    .forms = "--model PRESET --src LAYOUT --dst LAYOUT [--gpus-per-node N] [--fp8]\n"
             " [--save-src FILE] [--save-dst FILE] [--runs N] [--dst-rank R] [--json]\n"
             "--model PRESET --src LAYOUT --dst LAYOUT [--gpus-per-node N]\n"
             " --nic 400gbps [--nics-per-node N] [--fp8] [--json]   (weight update per NIC)\n"
             "SRC.json DST.json [--fp8] [--runs N] [--dst-rank R] [--json]\n"
             "--models [--json]",
    .about = "The reshard plan between two layouts of a model preset, or two manifest files.",
    .opts = plan_table,
    .nopts = sizeof plan_table / sizeof plan_table[0],
    .max_pos = 2,
    .footer = "LAYOUT: comma-separated fsdp:N tp:N dp:N ep:N pp:N (e.g. fsdp:256, tp:8,dp:16,\n"
              "        ep:32,tp:8, pp:4,tp:8), or 'replicated'\n",
};

static int parse_plan(int argc, char **argv, plan_opts *o)
{
    memset(o, 0, sizeof *o);
    o->dst_rank = UINT64_MAX;
    int npos;
    char **pos;
    int pr = cli_parse(&plan_cmd, argc, argv, o, &npos, &pos);
    if (pr != 0)
        return pr;
    if (o->models)
        return 0;
    if (npos == 2 && !o->model && !o->src && !o->dst) {
        o->src = pos[0];
        o->dst = pos[1];
        return 0;
    }
    if (npos == 1) {
        fprintf(stderr, "ferry plan: one manifest file '%s'; the plan needs two (SRC.json DST.json)\n",
                pos[0]);
        return -1;
    }
    if (npos || !o->model || !o->src || !o->dst) {
        fprintf(stderr, "ferry plan: wants --model, --src and --dst, or two manifest files\n");
        return -1;
    }
    return 0;
}

/* Build (or load) the two manifests. */
static int load_pair(const plan_opts *o, ferry_manifest **src, ferry_manifest **dst, uint64_t *model_bytes)
{
    if (o->model)
        return cli_layout_pair("ferry plan", o->model, o->src, o->dst, o->gpn, src, dst, model_bytes);
    ferry_error err = {0};
    *src = *dst = NULL;
    if (ferry_manifest_load(o->src, src, &err) == 0 && ferry_manifest_load(o->dst, dst, &err) == 0)
        return 0;
    fprintf(stderr, "ferry plan: %s\n", err.msg[0] ? err.msg : ferry_strerror(err.code));
    ferry_manifest_close(*src);
    ferry_manifest_close(*dst);
    *src = *dst = NULL;
    return 1;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t node_count(const ferry_manifest *m)
{
    uint32_t n = ferry_manifest_rank_count(m), distinct = 0;
    uint32_t *v = malloc(n * sizeof *v);
    if (!v)
        return 0;
    for (uint32_t r = 0; r < n; r++)
        v[r] = ferry_manifest_node_of(m, r);
    qsort(v, n, sizeof *v, cmp_u32);
    for (uint32_t r = 0; r < n; r++)
        distinct += r == 0 || v[r] != v[r - 1];
    free(v);
    return distinct;
}

static void print_runs(const ferry_plan *p, const plan_opts *o)
{
    ferry_plan_filter f = {-1, -1, o->dst_rank == UINT64_MAX ? -1 : (int64_t)o->dst_rank};
    ferry_plan_iter *it;
    if (ferry_plan_iter_open(p, &f, &it) < 0)
        return;
    const ferry_manifest *dst = ferry_plan_dst(p);
    printf("\n%-52s %10s %5s %14s %10s %5s %12s %10s %s\n", "tensor", "src_frag", "src_r", "src_offset", "dst_frag",
           "dst_r", "dst_offset", "len", "loops (count x src_stride/dst_stride)");
    ferry_run r;
    for (uint64_t n = 0; n < o->runs && ferry_plan_iter_next_run(it, &r) == 1; n++) {
        ferry_tensor_desc t;
        ferry_manifest_tensor(dst, r.tensor, &t);
        printf("%-52.52s %10" PRIu64 " %5u %14" PRIu64 " %10" PRIu64 " %5u %12" PRIu64 " %10" PRIu64 " ", t.name,
               r.src_fragment, r.src_rank, r.src_offset, r.dst_fragment, r.dst_rank, r.dst_offset, r.len);
        for (uint32_t i = 0; i < r.nouter; i++)
            printf("%s%" PRIu64 "x%" PRIu64 "/%" PRIu64, i ? " " : "", r.count[i], r.src_stride[i], r.dst_stride[i]);
        printf("%s%s\n", r.nouter ? "" : "-", r.src_object ? " (object)" : "");
    }
    ferry_plan_iter_close(it);
}

static void print_plan(const plan_opts *o, ferry_plan *p, double build_s)
{
    ferry_plan_stats s;
    ferry_plan_stats_get(p, &s);
    const ferry_manifest *src = ferry_plan_src(p), *dst = ferry_plan_dst(p);
    char ds[33], dd[33], dt[33], b1[32], b2[32], b3[32];
    ferry_digest_hex(s.src_digest, ds);
    ferry_digest_hex(s.dst_digest, dd);
    ferry_digest_hex(s.topology_digest, dt);
    if (o->json) {
        printf("{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"tensors\":%" PRIu64 ",\"src_ranks\":%u,"
               "\"dst_ranks\":%u,\"src_fragments\":%" PRIu64 ",\"dst_fragments\":%" PRIu64 ",\"regions\":%" PRIu64
               ",\"runs\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"max_rank_bytes\":%" PRIu64 ",\"mean_rank_bytes\":%.1f,"
               "\"plan_s\":%.6f,\"build_s\":%.6f,\"src_digest\":\"%s\",\"dst_digest\":\"%s\",\"topology_digest\":\"%s\"}\n",
               o->model ? o->model : "", o->src, o->dst, s.tensors, ferry_manifest_rank_count(src),
               ferry_manifest_rank_count(dst), s.src_fragments, s.dst_fragments, s.regions, s.runs, s.bytes,
               s.max_rank_bytes, s.mean_rank_bytes, s.plan_s, build_s, ds, dd, dt);
        return;
    }
    printf("plan  %s%s%s -> %s\n\n", o->model ? o->model : "", o->model ? "  " : "", o->src, o->dst);
    printf("  %-22s %20s %20s\n", "", "source", "target");
    printf("  %-22s %20u %20u\n", "ranks", ferry_manifest_rank_count(src), ferry_manifest_rank_count(dst));
    printf("  %-22s %20u %20u\n", "nodes", node_count(src), node_count(dst));
    printf("  %-22s %20u %20u\n", "tensors", ferry_manifest_tensor_count(src), ferry_manifest_tensor_count(dst));
    printf("  %-22s %20" PRIu64 " %20" PRIu64 "\n", "fragments", s.src_fragments, s.dst_fragments);
    printf("  %-22s %20.20s %20.20s\n\n", "digest", ds, dd);
    printf("  %-22s %20" PRIu64 "\n", "tensors planned", s.tensors);
    printf("  %-22s %20" PRIu64 "\n", "regions", s.regions);
    printf("  %-22s %20" PRIu64 "\n", "runs", s.runs);
    printf("  %-22s %20" PRIu64 "  (%s)\n", "bytes", s.bytes, cli_fmt_size(s.bytes, b1, sizeof b1));
    printf("  %-22s %20" PRIu64 "  (%s)\n", "max bytes / dst rank", s.max_rank_bytes,
           cli_fmt_size(s.max_rank_bytes, b2, sizeof b2));
    printf("  %-22s %20.0f  (%s)\n", "mean bytes / dst rank", s.mean_rank_bytes,
           cli_fmt_size((uint64_t)s.mean_rank_bytes, b3, sizeof b3));
    printf("  %-22s %20.6f s\n", "planning time", s.plan_s);
    if (build_s > 0)
        printf("  %-22s %20.6f s\n", "manifest build time", build_s);
    printf("  %-22s %s\n", "topology digest", dt);
    if (o->runs)
        print_runs(p, o);
}

/* `ferry plan --models`: the presets, a table or a JSON array. */
static int print_models(bool json)
{
    if (json)
        printf("[");
    size_t shown = 0;
    for (size_t i = 0; ferry_model_preset_name(i); i++) {
        ferry_model *m;
        if (ferry_model_preset(ferry_model_preset_name(i), &m, NULL) < 0)
            continue;
        if (json)
            printf("%s{\"name\":\"%s\",\"tensors\":%zu,\"params\":%" PRIu64 ",\"bytes\":%" PRIu64
                   ",\"layers\":%u,\"experts\":%u}", shown ? "," : "", ferry_model_name(m),
                   ferry_model_tensor_count(m), ferry_model_param_count(m), ferry_model_bytes(m),
                   ferry_model_layers(m), ferry_model_experts(m));
        else
            printf("%-16s %8zu tensors %18" PRIu64 " params %4u layers %4u experts\n",
                   ferry_model_name(m), ferry_model_tensor_count(m), ferry_model_param_count(m),
                   ferry_model_layers(m), ferry_model_experts(m));
        shown++;
        ferry_model_free(m);
    }
    if (json)
        printf("]\n");
    return 0;
}

int cmd_plan(int argc, char **argv)
{
    plan_opts o;
    int pr = parse_plan(argc, argv, &o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &plan_cmd);
    if (o.models)
        return print_models(o.json);
    if (o.nic)
        return cli_plan_model(o.model, o.src, o.dst, o.gpn, o.nic, o.nics, o.fp8, o.json);
    ferry_manifest *src, *dst;
    uint64_t mb = 0;
    double t0 = cli_now();
    if (load_pair(&o, &src, &dst, &mb))
        return 1;
    ferry_error err = {0};
    int rc = 0;
    if (o.fp8 && cli_quantize_pair(&src, &dst, &err) < 0)
        rc = 1;
    double build_s = o.model ? cli_now() - t0 : 0;
    if (!rc && o.save_src && ferry_manifest_save(src, o.save_src, &err) < 0)
        rc = 1;
    if (!rc && o.save_dst && ferry_manifest_save(dst, o.save_dst, &err) < 0)
        rc = 1;
    ferry_plan *p = NULL;
    if (!rc && ferry_plan_create(src, dst, NULL, &p, &err) < 0)
        rc = 1;
    if (rc)
        fprintf(stderr, "ferry plan: %s\n", err.msg);
    else
        print_plan(&o, p, build_s);
    ferry_plan_free(p);
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
    return rc;
}
