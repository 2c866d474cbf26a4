/* `ferry-lab bench plan`: cold and cached reshard planning time and peak
 * memory, against a naive all-pairs planner measured in the same run. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "lab.h"
#include "cli_opts.h"

typedef struct bp_opts {
    const char *model, *src, *dst;
    uint32_t gpn;
    uint64_t baseline_tensors;
    bool walk_all, json;
} bp_opts;

static const cli_opt bp_table[] = {
    CLI_ARG(bp_opts, model, "model", "PRESET", "the model (ferry plan --models)"),
    CLI_ARG(bp_opts, src, "src", "LAYOUT", "the trainers' layout, e.g. fsdp:256"),
    CLI_ARG(bp_opts, dst, "dst", "LAYOUT", "the rollouts' layout, e.g. ep:16,tp:8"),
    CLI_UINT(bp_opts, gpn, "gpus-per-node", "N", 1, 1024, "ranks per node (default 8)"),
    CLI_UINT(bp_opts, baseline_tensors, "baseline-tensors", "N", 0, 100000000,
             "tensors the naive planner is timed on (default 1200)"),
    CLI_FLAG(bp_opts, walk_all, "walk-all", "also walk every target rank's runs (default: rank 0)"),
    CLI_FLAG(bp_opts, json, "json", "one JSON object on stdout (default: a table)"),
};

static const cli_cmd bp_cmd = {
    .name = "bench plan",
    .forms = "--model PRESET --src LAYOUT --dst LAYOUT [--gpus-per-node N]\n"
             " [--baseline-tensors N] [--walk-all] [--json]",
    .about = "Reshard planning time (cold and cached) and peak memory, against a naive\n"
             "all-pairs planner measured in the same run.",
    .opts = bp_table,
    .nopts = sizeof bp_table / sizeof bp_table[0],
};

static int parse(int argc, char **argv, bp_opts *o)
{
    memset(o, 0, sizeof *o);
    o->baseline_tensors = 1200;
    int pr = cli_parse(&bp_cmd, argc, argv, o, NULL, NULL);
    if (pr != 0)
        return pr;
    if (!o->model || !o->src || !o->dst) {
        fprintf(stderr, "ferry-lab bench plan: wants --model, --src and --dst\n");
        return -1;
    }
    return 0;
}

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
    bp_opts o;
    int pr = parse(argc, argv, &o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &bp_cmd);
    ferry_manifest *src, *dst;
    uint64_t mb = 0;
    double t0 = cli_now();
    if (cli_layout_pair("ferry-lab bench plan", o.model, o.src, o.dst, o.gpn, &src, &dst, &mb))
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
        fprintf(stderr, "ferry-lab bench plan: %s\n", err.msg);
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
