/* `ferry plan` (print a reshard plan between two layouts or two manifest
 * files) and `ferry bench plan` (cold and cached planning time and peak
 * memory, against a naive all-pairs planner measured in the same run). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"

typedef struct plan_opts {
    const char *model, *src, *dst;     /* preset + layouts, or two files */
    const char *save_src, *save_dst;
    uint32_t gpn;
    bool json;
    long runs;                         /* runs to print */
    int64_t dst_rank;
    size_t baseline_tensors;
    bool walk_all;
    const char *nic;                   /* --nic: the at-scale update model (plan_model.c) */
    uint32_t nics;
    bool models;                       /* --models: list the presets */
} plan_opts;

static void usage_plan(FILE *f, bool bench)
{
    if (bench)
        fprintf(f, "usage: ferry bench plan --model PRESET --src LAYOUT --dst LAYOUT [--gpus-per-node N]\n"
                   "                        [--baseline-tensors N] [--walk-all] [--json]\n"
                   "\n"
                   "Reshard planning time (cold and cached) and peak memory, against a naive\n"
                   "all-pairs planner measured in the same run.\n"
                   "\n"
                   "  --model PRESET        the model (ferry plan --models)\n"
                   "  --src LAYOUT          the trainers' layout, e.g. fsdp:256\n"
                   "  --dst LAYOUT          the rollouts' layout, e.g. ep:16,tp:8\n"
                   "  --gpus-per-node N     ranks per node (default 8)\n"
                   "  --baseline-tensors N  tensors the naive planner is timed on (default 1200)\n"
                   "  --walk-all            also walk every target rank's runs (default: rank 0)\n"
                   "  --json                one JSON object on stdout (default: a table)\n");
    else
        fprintf(f, "usage: ferry plan --model PRESET --src LAYOUT --dst LAYOUT [--gpus-per-node N]\n"
                   "                  [--save-src FILE] [--save-dst FILE] [--runs N] [--dst-rank R] [--json]\n"
                   "       ferry plan --model PRESET --src LAYOUT --dst LAYOUT [--gpus-per-node N]\n"
                   "                  --nic 400gbps [--nics-per-node N] [--json]   (weight update per NIC)\n"
                   "       ferry plan SRC.json DST.json [--runs N] [--dst-rank R] [--json]\n"
                   "       ferry plan --models [--json]\n"
                   "\n"
                   "The reshard plan between two layouts of a model preset, or two manifest files.\n"
                   "\n"
                   "  --model PRESET     the model (ferry plan --models lists the presets)\n"
                   "  --src LAYOUT       the trainers' layout\n"
                   "  --dst LAYOUT       the rollouts' layout\n"
                   "  --gpus-per-node N  ranks per node (default 8)\n"
                   "  --save-src FILE    write the source manifest to FILE (default: not written)\n"
                   "  --save-dst FILE    write the target manifest to FILE (default: not written)\n"
                   "  --runs N           print the plan's first N byte runs (default 0)\n"
                   "  --dst-rank R       only the runs of target rank R (default: every rank)\n"
                   "  --nic BW           model the weight update over NICs of BW (400gbps, 50GB/s)\n"
                   "  --nics-per-node N  NICs per node for --nic (default 1)\n"
                   "  --models           list the model presets\n"
                   "  --json             JSON on stdout (default: text)\n"
                   "\n"
                   "LAYOUT: comma-separated fsdp:N tp:N dp:N ep:N pp:N (e.g. fsdp:256, tp:8,dp:16,\n"
                   "        ep:32,tp:8, pp:4,tp:8), or 'replicated'\n");
}

static void usage_plan_cmd(FILE *f) { usage_plan(f, false); }
static void usage_bench_plan(FILE *f) { usage_plan(f, true); }

/* One option of plan or bench plan: 0, or -1 after a line on stderr. */
static int plan_opt(plan_opts *o, const char *a, const char *v)
{
    uint64_t n;
    int rc = 0;
    if (!strcmp(a, "--json"))
        o->json = true;
    else if (!strcmp(a, "--walk-all"))
        o->walk_all = true;
    else if (!strcmp(a, "--models"))
        o->models = true;
    else if (!strcmp(a, "--model"))
        o->model = v;
    else if (!strcmp(a, "--src"))
        o->src = v;
    else if (!strcmp(a, "--dst"))
        o->dst = v;
    else if (!strcmp(a, "--save-src"))
        o->save_src = v;
    else if (!strcmp(a, "--save-dst"))
        o->save_dst = v;
    else if (!strcmp(a, "--gpus-per-node"))
        rc = cli_opt_unsigned(a, v, 1, 1024, &o->gpn);
    else if (!strcmp(a, "--runs")) {
        if ((rc = cli_opt_uint(a, v, 0, 1000000000, &n)) == 0)
            o->runs = (long)n;
    } else if (!strcmp(a, "--dst-rank")) {
        if ((rc = cli_opt_uint(a, v, 0, UINT32_MAX, &n)) == 0)   /* ranks are uint32 */
            o->dst_rank = (int64_t)n;
    } else if (!strcmp(a, "--nic"))
        o->nic = v;
    else if (!strcmp(a, "--nics-per-node"))
        rc = cli_opt_unsigned(a, v, 1, 64, &o->nics);
    else if (!strcmp(a, "--baseline-tensors")) {
        if ((rc = cli_opt_uint(a, v, 0, 100000000, &n)) == 0)
            o->baseline_tensors = (size_t)n;
    } else {
        fprintf(stderr, "ferry plan: option %s is not handled\n", a);   /* a table bug */
        rc = -1;
    }
    return rc;
}

static int parse_plan(int argc, char **argv, plan_opts *o, bool bench)
{
    memset(o, 0, sizeof *o);
    o->dst_rank = -1;
    o->baseline_tensors = 1200;
    const char *cmd = bench ? "bench plan" : "plan";
    cli_getopt g;
    cli_getopt_init(&g, cmd, argc, argv,
                    bench ? "model=,src=,dst=,gpus-per-node=,baseline-tensors=,walk-all,json"
                          : "model=,src=,dst=,gpus-per-node=,save-src=,save-dst=,runs=,dst-rank=,"
                            "nic=,nics-per-node=,models,json");
    while (cli_getopt_next(&g))
        if (plan_opt(o, g.opt, g.val) < 0)
            return -1;
    int pr = cli_getopt_end(&g, bench ? 0 : 2);
    if (pr != 0)
        return pr;
    if (o->models)
        return 0;
    if (g.npos == 2 && !o->model && !o->src && !o->dst) {
        o->src = g.pos[0];
        o->dst = g.pos[1];
        return 0;
    }
    if (g.npos == 1) {
        fprintf(stderr, "ferry %s: one manifest file '%s'; the plan needs two (SRC.json DST.json)\n",
                cmd, g.pos[0]);
        return -1;
    }
    if (g.npos || !o->model || !o->src || !o->dst) {
        fprintf(stderr, "ferry %s: wants --model, --src and --dst%s\n", cmd,
                bench ? "" : ", or two manifest files");
        return -1;
    }
    return 0;
}

/* Build (or load) the two manifests. */
static int load_pair(const plan_opts *o, ferry_manifest **src, ferry_manifest **dst, uint64_t *model_bytes)
{
    ferry_error err = {0};
    *src = *dst = NULL;
    if (!o->model) {
        if (ferry_manifest_load(o->src, src, &err) < 0 || ferry_manifest_load(o->dst, dst, &err) < 0)
            goto fail;
        return 0;
    }
    ferry_model *m;
    if (ferry_model_preset(o->model, &m, &err) < 0)
        goto fail;
    *model_bytes = ferry_model_bytes(m);
    ferry_layout ls, ld;
    int rc = ferry_layout_parse(o->src, &ls, &err);
    if (rc == 0)
        rc = ferry_layout_parse(o->dst, &ld, &err);
    if (rc == 0 && o->gpn)
        ls.gpus_per_node = ld.gpus_per_node = o->gpn;
    if (rc == 0)
        rc = ferry_layout_build(m, &ls, src, &err);
    if (rc == 0)
        rc = ferry_layout_build(m, &ld, dst, &err);
    ferry_model_free(m);
    if (rc < 0)
        goto fail;
    return 0;
fail:
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
    ferry_plan_filter f = {-1, -1, o->dst_rank};
    ferry_plan_iter *it;
    if (ferry_plan_iter_open(p, &f, &it) < 0)
        return;
    const ferry_manifest *dst = ferry_plan_dst(p);
    printf("\n%-52s %10s %5s %14s %10s %5s %12s %10s %s\n", "tensor", "src_frag", "src_r", "src_offset", "dst_frag",
           "dst_r", "dst_offset", "len", "loops (count x src_stride/dst_stride)");
    ferry_run r;
    for (long n = 0; n < o->runs && ferry_plan_iter_next_run(it, &r) == 1; n++) {
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
    int pr = parse_plan(argc, argv, &o, false);
    if (pr != 0)
        return cli_usage_exit(pr, usage_plan_cmd);
    if (o.models)
        return print_models(o.json);
    if (o.nic)
        return cli_plan_model(o.model, o.src, o.dst, o.gpn, o.nic, o.nics, o.json);
    ferry_manifest *src, *dst;
    uint64_t mb = 0;
    double t0 = cli_now();
    if (load_pair(&o, &src, &dst, &mb))
        return 1;
    double build_s = o.model ? cli_now() - t0 : 0;
    ferry_error err = {0};
    int rc = 0;
    if (o.save_src && ferry_manifest_save(src, o.save_src, &err) < 0)
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

/* ---- bench -------------------------------------------------------------- */

static uint64_t peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss * 1024;
}

typedef struct box { uint32_t tensor; uint32_t ndim; uint64_t off[FERRY_MAX_DIMS], shape[FERRY_MAX_DIMS]; } box;

/* The fragments of tensors [0, ntensors) as boxes: layouts add them in
 * tensor order, so they are a prefix of the fragment ids. */
static box *materialize(const ferry_manifest *m, uint32_t ntensors, bool first_copy_only, size_t *n)
{
    size_t cap = 1024, k = 0;
    box *v = malloc(cap * sizeof *v);
    uint64_t total = ferry_manifest_fragment_count(m);
    for (uint64_t id = 0; v && id < total; id++) {
        ferry_fragment f;
        ferry_manifest_fragment(m, id, &f);
        if (f.tensor >= ntensors)
            break;
        if (first_copy_only && f.replica != 0)
            continue;
        if (k == cap) {
            box *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return NULL;
            }
            v = nv;
        }
        ferry_tensor_desc t;
        ferry_manifest_tensor(m, f.tensor, &t);
        v[k].tensor = f.tensor;
        v[k].ndim = t.ndim;
        memcpy(v[k].off, f.offset, sizeof f.offset);
        memcpy(v[k].shape, f.shape, sizeof f.shape);
        k++;
    }
    *n = k;
    return v;
}

/* Naive planner: every (source, target) fragment pair of a tensor is
 * tested. Sources are replica 0 only: the plan reads each box from one
 * copy, and layouts number one copy of every box 0. */
static uint64_t naive_regions(const box *s, size_t ns, const box *t, size_t nt)
{
    uint64_t n = 0;
    size_t si = 0;
    for (size_t ti = 0; ti < nt;) {
        size_t te = ti;
        while (te < nt && t[te].tensor == t[ti].tensor)
            te++;
        while (si < ns && s[si].tensor < t[ti].tensor)
            si++;
        size_t se = si;
        while (se < ns && s[se].tensor == t[ti].tensor)
            se++;
        for (size_t a = ti; a < te; a++)
            for (size_t b = si; b < se; b++) {
                bool hit = true;
                for (uint32_t d = 0; d < t[a].ndim && hit; d++)
                    hit = s[b].off[d] < t[a].off[d] + t[a].shape[d] && t[a].off[d] < s[b].off[d] + s[b].shape[d];
                n += hit;
            }
        ti = te;
    }
    return n;
}

int cmd_bench_plan(int argc, char **argv)
{
    plan_opts o;
    int pr = parse_plan(argc, argv, &o, true);
    if (pr != 0)
        return cli_usage_exit(pr, usage_bench_plan);
    ferry_manifest *src, *dst;
    uint64_t mb = 0;
    double t0 = cli_now();
    if (load_pair(&o, &src, &dst, &mb))
        return 1;
    double build_s = cli_now() - t0;
    ferry_plan_cache *cache;
    ferry_plan *p = NULL, *p2 = NULL;
    ferry_error err = {0};
    bool hit1 = false, hit2 = false;
    if (ferry_plan_cache_create(8, &cache) < 0)
        return 1;
    t0 = cli_now();
    int rc = ferry_plan_cache_get(cache, src, dst, NULL, &p, &hit1, &err);
    double cold_s = cli_now() - t0;
    double cached_s = 0;
    if (rc == 0) {
        t0 = cli_now();
        rc = ferry_plan_cache_get(cache, src, dst, NULL, &p2, &hit2, &err);
        cached_s = cli_now() - t0;
    }
    if (rc < 0) {
        fprintf(stderr, "ferry bench plan: %s\n", err.msg);
        ferry_plan_cache_free(cache);
        return 1;
    }
    ferry_plan_stats s;
    ferry_plan_stats_get(p, &s);

    /* What an executor on target rank 0 does: walk its runs. */
    ferry_plan_filter f = {-1, -1, 0};
    ferry_plan_iter *it;
    uint64_t r0_runs = 0, r0_bytes = 0, r0_want = 0;
    t0 = cli_now();
    if (ferry_plan_iter_open(p, &f, &it) == 0) {
        ferry_run r;
        while (ferry_plan_iter_next_run(it, &r) == 1) {
            r0_runs++;
            r0_bytes += r.bytes;
        }
        ferry_plan_iter_close(it);
    }
    double r0_s = cli_now() - t0;
    ferry_manifest_rank_bytes(dst, 0, &r0_want);
    uint64_t rss = peak_rss();

    /* Optionally every run of the plan, as all executors together would. */
    uint64_t all_runs = 0, all_bytes = 0;
    double all_s = 0;
    if (o.walk_all && ferry_plan_iter_open(p, NULL, &it) == 0) {
        ferry_run r;
        t0 = cli_now();
        while (ferry_plan_iter_next_run(it, &r) == 1) {
            all_runs++;
            all_bytes += r.bytes;
        }
        all_s = cli_now() - t0;
        ferry_plan_iter_close(it);
    }
    bool all_ok = !o.walk_all || (all_runs == s.runs && all_bytes == s.bytes);

    /* Baseline in the same run: materialized fragments + all-pairs test,
     * on the first baseline_tensors tensors; the plan's own regions of
     * those tensors must agree. */
    uint32_t nb = (uint32_t)o.baseline_tensors;
    if (nb > ferry_manifest_tensor_count(dst))
        nb = ferry_manifest_tensor_count(dst);
    size_t ns = 0, nt = 0;
    t0 = cli_now();
    box *bs = materialize(src, nb, true, &ns), *bt = materialize(dst, nb, false, &nt);
    uint64_t naive = bs && bt ? naive_regions(bs, ns, bt, nt) : 0;
    double naive_s = cli_now() - t0;
    free(bs);
    free(bt);
    uint64_t mine = 0;
    t0 = cli_now();
    for (uint32_t ti = 0; ti < nb; ti++) {
        ferry_plan_filter tf = {ti, -1, -1};
        ferry_region r;
        if (ferry_plan_iter_open(p, &tf, &it) < 0)
            break;
        while (ferry_plan_iter_next_region(it, &r) == 1)
            mine++;
        ferry_plan_iter_close(it);
    }
    double walk_s = cli_now() - t0;
    double per_tensor = nb ? naive_s / nb : 0;
    double naive_est = per_tensor * (double)s.tensors;
    double frag_bytes = (double)(s.src_fragments + s.dst_fragments) * (double)sizeof(box);

    if (o.json) {
        printf("{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"tensors\":%" PRIu64 ",\"src_fragments\":%" PRIu64
               ",\"dst_fragments\":%" PRIu64 ",\"regions\":%" PRIu64 ",\"runs\":%" PRIu64 ",\"bytes\":%" PRIu64
               ",\"max_rank_bytes\":%" PRIu64 ",\"build_s\":%.6f,\"cold_s\":%.6f,\"cached_s\":%.9f,\"cache_hit\":%s,"
               "\"same_plan\":%s,\"peak_rss_bytes\":%" PRIu64 ",\"rank0_runs\":%" PRIu64 ",\"rank0_bytes\":%" PRIu64
               ",\"rank0_bytes_ok\":%s,\"rank0_walk_s\":%.6f,\"walk_all_s\":%.6f,\"walk_all_ok\":%s,"
               "\"baseline\":{\"what\":\"materialized fragments, all-pairs overlap test per tensor\",\"tensors\":%u,"
               "\"s\":%.6f,\"regions\":%" PRIu64 ",\"plan_regions\":%" PRIu64 ",\"regions_match\":%s,\"plan_walk_s\":%.6f,"
               "\"extrapolated_s\":%.3f,\"extrapolated_fragment_bytes\":%.0f},\"baseline_ratio\":%.2f}\n",
               o.model, o.src, o.dst, s.tensors, s.src_fragments, s.dst_fragments, s.regions, s.runs, s.bytes,
               s.max_rank_bytes, build_s, cold_s, cached_s, hit2 ? "true" : "false", p == p2 ? "true" : "false", rss,
               r0_runs, r0_bytes, r0_bytes == r0_want ? "true" : "false", r0_s, all_s, all_ok ? "true" : "false",
               nb, naive_s, naive, mine,
               naive == mine ? "true" : "false", walk_s, naive_est, frag_bytes, cold_s > 0 ? naive_est / cold_s : 0);
    } else {
        char b1[32], b2[32];
        printf("bench plan  %s  %s -> %s\n\n", o.model, o.src, o.dst);
        printf("  tensors %" PRIu64 "  fragments %" PRIu64 " -> %" PRIu64 "  regions %" PRIu64 "  runs %" PRIu64
               "  bytes %s\n", s.tensors, s.src_fragments, s.dst_fragments, s.regions, s.runs,
               cli_fmt_size(s.bytes, b1, sizeof b1));
        printf("  manifest build  %10.6f s\n", build_s);
        printf("  cold plan       %10.6f s   (validate, digest, plan, stats)\n", cold_s);
        printf("  cached plan     %10.9f s   (hit: %s, same plan: %s)\n", cached_s, hit2 ? "yes" : "no",
               p == p2 ? "yes" : "no");
        printf("  peak rss        %10s\n", cli_fmt_size(rss, b2, sizeof b2));
        printf("  rank 0 walk     %10.6f s   %" PRIu64 " runs, bytes %s\n", r0_s, r0_runs,
               r0_bytes == r0_want ? "match its fragments" : "DO NOT match its fragments");
        if (o.walk_all)
            printf("  all runs walk   %10.6f s   %" PRIu64 " runs, %s\n", all_s, all_runs,
                   all_ok ? "count and bytes match the stats" : "DO NOT match the stats");
        printf("  baseline        %10.6f s   naive all-pairs on %u tensors (%" PRIu64 " regions, plan: %" PRIu64
               " %s)\n", naive_s, nb, naive, mine, naive == mine ? "match" : "MISMATCH");
        printf("                  %10.3f s   extrapolated to all tensors (%.0f MB of fragment boxes): %.1fx the cold plan\n",
               naive_est, frag_bytes / 1e6, cold_s > 0 ? naive_est / cold_s : 0);
    }
    ferry_plan_free(p);
    ferry_plan_free(p2);
    ferry_plan_cache_free(cache);
    ferry_manifest_close(src);
    ferry_manifest_close(dst);
    return naive == mine && r0_bytes == r0_want && all_ok ? 0 : 1;
}
