/* `ferry-lab bench weights --scale`: the single-pull group plan of every worker
 * of a large rollout group, on one machine, with no store and no network
 * (docs/weights.md, "Scale benchmark").
 *
 * It runs the code a subscriber runs between the demand barrier and the
 * reads: the generation is the trainers' placement in its stored form
 * (round-tripped through its JSON, as fr_gen_load reads it), every
 * worker's demand record is encoded as a subscriber encodes it from its
 * shards of the rollout layout, and each worker's plan is the subscriber's
 * (fr_sub_plan_records, reached through src/testing/testing.h) over
 * all the records — decode, replica sets, reader assignment, push
 * lowering, reads planned by the reshard planner — first cold (nothing
 * cached), then with the next generation's records (the same layouts:
 * the plan cache must hit).
 *
 * Processes: the parent builds the generation; a child builds the rollout
 * placement and the records and sends them back; then each worker is
 * planned in a child of its own, which holds what a worker holds at that
 * point (the generation and the records) and reports its times and its
 * peak resident memory (VmHWM). Every plan is checked: the group reads
 * the model once, every worker gets exactly its demand (read or pushed),
 * every worker computes the same group figures, and the workers' own
 * reads add up to the group's. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lab.h"
#include "cli_opts.h"
#include "testing.h"   /* the subscriber's planning, as pull.c runs it: not public API */

#define FAKE_BASE 0x7f0000000000ull   /* workers' parameter memory: addresses only, never touched */

typedef struct scale_opts {
    const char *model, *src, *dst;
    uint32_t gpn;                  /* rollout GPUs per node (the node in each record) */
    uint32_t workers;              /* how many to plan (0: all) */
    bool scale, json;              /* scale: the form's own word */
} scale_opts;

/* What a worker's planning child reports. */
typedef struct worker_result {
    double cold_s, cold_cpu_s, cached_s;
    uint64_t peak_rss, base_rss, my_read, group_read, reads, pieces, pushes, sets, shared_sets;
    int rc;
    char msg[600];
} worker_result;

/* The figures over every worker planned. */
typedef struct scale_result {
    double cold_max, cold_sum, cold_cpu_max, cached_max, cached_sum;
    uint32_t cold_worker, planned;
    uint64_t peak_rss, base_rss, reads_max, pushes_max, pieces_max, group_read, sets, shared_sets;
} scale_result;

static const cli_opt scale_table[] = {
    CLI_FLAG(scale_opts, scale, "scale", "this form: the planning at scale"),
    CLI_ARG(scale_opts, model, "model", "PRESET", "the model (default kimi-k2)"),
    CLI_ARG(scale_opts, src, "src", "LAYOUT", "the trainers' layout (default fsdp:256)"),
    CLI_ARG(scale_opts, dst, "dst", "LAYOUT", "the rollout workers' layout (default ep:16,tp:8)"),
    CLI_UINT(scale_opts, gpn, "gpus-per-node", "N", 1, 1u << 16, "rollout GPUs per node (default 8)"),
    CLI_UINT(scale_opts, workers, "workers", "N", 1, 1u << 20, "how many workers to plan (default: all)"),
    CLI_FLAG(scale_opts, json, "json", "one JSON object on stdout (default: text)"),
};

static const cli_cmd scale_cmd = {
    .name = "bench weights",
    .forms = "--scale [--model PRESET] [--src LAYOUT] [--dst LAYOUT]\n"
             " [--gpus-per-node N] [--workers N] [--json]",
    .about = "Plans the single-pull update of every rollout worker of dst on this machine\n"
             "(no store, no network).",
    .opts = scale_table,
    .nopts = sizeof scale_table / sizeof scale_table[0],
};

static int parse_scale(int argc, char **argv, scale_opts *o)
{
    *o = (scale_opts){ .model = "kimi-k2", .src = "fsdp:256", .dst = "ep:16,tp:8", .gpn = 8 };
    return cli_parse(&scale_cmd, argc, argv, o, NULL, NULL);
}

/* VmHWM (peak resident) or VmRSS (now) of this process. */
static uint64_t vm_status(const char *what)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256], fmt[32];
    unsigned long long kb = 0;
    snprintf(fmt, sizeof fmt, "%s: %%llu kB", what);
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kb << 10;
}

static int write_all(int fd, const void *p, size_t n)
{
    for (const uint8_t *b = p; n;) {
        ssize_t w = write(fd, b, n);
        if (w <= 0)
            return -1;
        b += w, n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    for (uint8_t *b = p; n;) {
        ssize_t r = read(fd, b, n);
        if (r <= 0)
            return -1;
        b += r, n -= (size_t)r;
    }
    return 0;
}

/* ---- the generation ----------------------------------------------------------------------- */

/* ---- the records (a child) ---------------------------------------------------------------- */

/* Worker r's shards: its fragments of the rollout placement, each in a
 * contiguous buffer of its own at a made-up address. */
static int worker_shards(ferry_manifest *dst, const uint64_t *ids, size_t n,
                         ferry_param_shard *sh)
{
    uint64_t at = FAKE_BASE;
    for (size_t i = 0; i < n; i++) {
        ferry_fragment f;
        ferry_tensor_desc d;
        if (ferry_manifest_fragment(dst, ids[i], &f) < 0 ||
            ferry_manifest_tensor(dst, f.tensor, &d) < 0)
            return FERRY_EIO;
        sh[i] = (ferry_param_shard){ .tensor = d.name, .ndim = d.ndim,
                                     .dst = (void *)(uintptr_t)at };
        uint64_t bytes = d.itemsize;
        for (uint32_t k = 0; k < d.ndim; k++) {
            sh[i].offset[k] = f.offset[k];
            sh[i].shape[k] = f.shape[k];
            bytes *= f.shape[k];
        }
        at += (bytes + 255) & ~255ull;
    }
    return 0;
}

/* Encode every worker's record; to fd: u32 workers, u64 shard bytes, then
 * per worker u64 length, f64 encode seconds, the record. */
static int encode_all(const ferry_model *model, const scale_opts *o, const fr_gen *g, int fd)
{
    ferry_error err = {0};
    ferry_layout l;
    ferry_manifest *dst = NULL;
    ferry_engine *e = NULL;
    ferry_engine_config ec;
    char tok[65];
    int rc = ferry_layout_parse(o->dst, &l, &err);
    if (rc == 0)
        rc = ferry_layout_build(model, &l, &dst, &err);
    if (rc == 0)
        rc = ferry_engine_config_init(&ec);
    if (rc == 0) {   /* a real endpoint for the records; nobody connects to it */
        snprintf(ec.listen_addr, sizeof ec.listen_addr, "127.0.0.1:0");
        ferry_token_generate(tok);
        memcpy(ec.token, tok, 64);
        ec.token_len = 64;
        rc = ferry_engine_open(&ec, &e, NULL);
    }
    uint32_t world = dst ? ferry_manifest_rank_count(dst) : 0;
    uint64_t nf = dst ? ferry_manifest_fragment_count(dst) : 0;
    uint64_t *ids = rc == 0 ? malloc((nf ? nf : 1) * sizeof *ids) : NULL;
    size_t *first = rc == 0 ? calloc((size_t)world + 1, sizeof *first) : NULL;
    if (rc == 0 && (!ids || !first))
        rc = FERRY_ENOMEM;
    for (uint64_t id = 0; rc == 0 && id < nf; id++) {   /* bucket fragments by rank */
        ferry_fragment f;
        rc = ferry_manifest_fragment(dst, id, &f);
        first[f.rank + 1]++;
    }
    for (uint32_t r = 0; rc == 0 && r < world; r++)
        first[r + 1] += first[r];
    size_t *fill = rc == 0 ? malloc(((size_t)world + 1) * sizeof *fill) : NULL;
    if (rc == 0 && !fill)
        rc = FERRY_ENOMEM;
    if (rc == 0)
        memcpy(fill, first, ((size_t)world + 1) * sizeof *fill);
    for (uint64_t id = 0; rc == 0 && id < nf; id++) {
        ferry_fragment f;
        rc = ferry_manifest_fragment(dst, id, &f);
        ids[fill[f.rank]++] = id;
    }
    if (rc == 0)
        rc = write_all(fd, &world, sizeof world) < 0 ? FERRY_EIO : 0;
    for (uint32_t r = 0; rc == 0 && r < world; r++) {
        size_t n = first[r + 1] - first[r];
        ferry_param_shard *sh = calloc(n ? n : 1, sizeof *sh);
        ferry_region **regs = calloc(n ? n : 1, sizeof *regs);   /* unregistered: key 0 */
        uint8_t *rec = NULL;
        size_t len = 0;
        rc = sh && regs ? worker_shards(dst, ids + first[r], n, sh) : FERRY_ENOMEM;
        ferry_subscriber_config cfg = { .rank = r, .world = world, .node = r / o->gpn };
        double t0 = cli_now();
        if (rc == 0)
            rc = fr_test_sub_encode(&cfg, g, sh, n, regs, e, &rec, &len, &err);
        double dt = cli_now() - t0;
        uint64_t l64 = len;
        if (rc == 0 && (write_all(fd, &l64, sizeof l64) < 0 || write_all(fd, &dt, sizeof dt) < 0 ||
                        write_all(fd, rec, len) < 0))
            rc = FERRY_EIO;
        free(rec);
        free(regs);
        free(sh);
    }
    if (rc < 0)
        fprintf(stderr, "ferry-lab bench weights --scale: building the demand records failed: %s\n",
                err.msg[0] ? err.msg : ferry_strerror(rc));
    free(fill);
    free(first);
    free(ids);
    ferry_engine_close(e);
    ferry_manifest_close(dst);
    return rc;
}

/* ---- planning (a child per worker) ------------------------------------------------------- */

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t box_bytes(const ferry_manifest *m, uint32_t tensor, uint32_t ndim,
                          const uint64_t *shape)
{
    ferry_tensor_desc d;
    (void)ferry_manifest_tensor(m, tensor, &d);
    uint64_t b = d.itemsize;
    for (uint32_t k = 0; k < ndim; k++)
        b *= shape ? shape[k] : d.shape[k];
    return b;
}

/* Worker me's plan checked: it gets exactly its demand (read or pushed),
 * the group reads the whole model once; its figures into r. */
static int check_plan(const fr_test_sub *c, uint32_t me, const fr_gen *g, worker_result *r)
{
    const ferry_manifest *m = fr_test_gen_manifest(g);
    fr_test_sub_figures w;
    fr_test_sub_figures_get(c, me, &w);
    uint64_t model = 0;
    for (uint32_t t = 0; t < ferry_manifest_tensor_count(m); t++) {
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(m, t, &d);
        model += box_bytes(m, t, d.ndim, NULL);
    }
    if (w.my_read + w.received != w.demand || w.group_read != model) {
        snprintf(r->msg, sizeof r->msg, "worker %u: reads %" PRIu64 " + receives %" PRIu64
                 " bytes of a demand of %" PRIu64 "; the group reads %" PRIu64 " of %" PRIu64,
                 me, w.my_read, w.received, w.demand, w.group_read, model);
        return FERRY_EIO;
    }
    r->my_read = w.my_read;
    r->group_read = w.group_read;
    r->sets = w.sets, r->shared_sets = w.shared_sets;
    r->reads = w.reads, r->pieces = w.pieces, r->pushes = w.pushes;
    return 0;
}

/* Worker me's planning, as at an update: cold (nothing kept), then the
 * next generation with the same layouts (the records differ in their
 * generation only, as fr_sub_encode writes them; the plan is kept). */
/* Touch every page this process inherited resident (one byte of each,
 * the pages /proc/self/pagemap says are present). A worker holds the
 * generation and the records in memory it has touched already (it built
 * them); a forked child has not, and where the hypervisor shadows page
 * tables (the development machines) the first touch of each page in the
 * child costs about as much as a fresh page. Pages that are not present
 * are left alone (touching them would make them resident), and so are
 * mappings of 16 GiB and more (a sanitizer's shadow, no worker's data).
 * Under a sanitizer the byte goes through a pipe, by the system call
 * itself: a page that cannot be read is then an EFAULT, not a crash, and
 * the sanitizer does not object to redzones being read (slower: a system
 * call a page). */
static void touch_inherited(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    int pm = open("/proc/self/pagemap", O_RDONLY), p[2] = { -1, -1 };
    char line[4096], sink[4096];
    unsigned long page = (unsigned long)sysconf(_SC_PAGESIZE);
    uint64_t ent[512];
    size_t queued = 0;
    if (!f || pm < 0 || pipe2(p, O_NONBLOCK) < 0)
        goto out;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perm[8];
        if (!strchr(line, '\n') || sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) != 3 ||
            perm[0] != 'r' || perm[1] != 'w' || hi - lo >= (16ul << 30))
            continue;
        for (unsigned long a = lo; a < hi;) {
            size_t n = (hi - a) / page < 512 ? (hi - a) / page : 512;
            ssize_t got = pread(pm, ent, n * sizeof *ent, (off_t)(a / page * sizeof *ent));
            if (got <= 0)
                break;
            for (size_t i = 0; i < (size_t)got / sizeof *ent; i++) {
                if (!(ent[i] >> 63))   /* not present */
                    continue;
#if defined(__SANITIZE_ADDRESS__)
                if (syscall(SYS_write, p[1], (const void *)(a + i * page), 1) == 1 &&
                    ++queued == sizeof sink)
                    queued = read(p[0], sink, sizeof sink) > 0 ? 0 : queued;
#else
                sink[0] ^= *(volatile const char *)(a + i * page);
                (void)queued;
#endif
            }
            a += n * page;
        }
    }
out:
    if (p[0] >= 0)
        close(p[0]), close(p[1]);
    if (pm >= 0)
        close(pm);
    if (f)
        fclose(f);
}

static void plan_worker(const fr_gen *g, ferry_kv_value *recs, uint32_t world, uint32_t me,
                        worker_result *r)
{
    touch_inherited();
    r->base_rss = vm_status("VmRSS");
    fr_test_sub *c = NULL;
    ferry_error err = {0};
    /* the cache takes the records it plans from over: give it the pointers
     * (what it frees dies with this child) and keep them for the next round */
    ferry_kv_value *mine = malloc(world * sizeof *mine);
    if (!mine) {
        r->rc = FERRY_ENOMEM;
        snprintf(r->msg, sizeof r->msg, "out of memory");
        return;
    }
    memcpy(mine, recs, world * sizeof *mine);
    double c0 = cpu_now(), t0 = cli_now();
    int rc = fr_test_sub_plan(&c, g, 1, mine, world, me, &err);
    double t1 = cli_now();
    r->cold_cpu_s = cpu_now() - c0;
    uint64_t next = 2;   /* the same stored placement, one generation on */
    for (uint32_t k = 0; k < world; k++)
        for (int i = 0; i < 8; i++)
            ((uint8_t *)recs[k].val)[8 + i] = (uint8_t)(next >> (8 * i));
    double t2 = cli_now();
    if (rc == 0)
        rc = fr_test_sub_plan(&c, g, next, recs, world, me, &err);
    double t3 = cli_now();
    fr_test_sub_figures fig;
    if (rc == 0)
        fr_test_sub_figures_get(c, me, &fig);
    if (rc == 0 && !fig.reused) {
        snprintf(r->msg, sizeof r->msg, "worker %u: the next generation was planned again", me);
        rc = FERRY_EIO;
    }
    if (rc == 0)
        rc = check_plan(c, me, g, r);
    else if (!r->msg[0])
        snprintf(r->msg, sizeof r->msg, "worker %u: %s", me,
                 err.msg[0] ? err.msg : ferry_strerror(rc));
    r->peak_rss = vm_status("VmHWM");   /* before the plan is freed */
    fr_test_sub_free(c);   /* and the records it took over */
    free(mine);
    r->rc = rc;
    r->cold_s = t1 - t0;
    r->cached_s = t3 - t2;
}

/* Run fn in a child; what it writes to its pipe end comes back through *fd. */
static pid_t spawn(int *fd)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]), close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        *fd = p[1];
        return 0;
    }
    close(p[1]);
    *fd = p[0];
    return pid;
}

static bool reap(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return false;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Each worker planned in a child of its own, which holds what a worker
 * holds then (the generation, every record) and starts on a heap of its
 * own; the group's figures checked across workers. */
static int plan_all(const fr_gen *g, ferry_kv_value *recs, uint32_t world, uint32_t n,
                    bool progress, scale_result *s)
{
    uint64_t reads = 0;
    for (uint32_t me = 0; me < n; me++) {
        if (progress)
            cli_progress("bench weights --scale", (double)me / n);
        worker_result r = {0};
        int fd = -1;
        pid_t pid = spawn(&fd);
        if (pid == 0) {
            plan_worker(g, recs, world, me, &r);
            _exit(write_all(fd, &r, sizeof r) == 0 ? 0 : 1);
        }
        bool ok = pid > 0 && read_all(fd, &r, sizeof r) == 0;
        if (fd >= 0)
            close(fd);
        ok = pid > 0 && reap(pid) && ok;
        if (!ok || r.rc < 0) {
            fprintf(stderr, "ferry-lab bench weights --scale: planning failed: %s\n",
                    ok ? r.msg : "the planning process died");
            return -1;
        }
        if (s->group_read && (r.group_read != s->group_read || r.sets != s->sets)) {
            fprintf(stderr, "ferry-lab bench weights --scale: worker %u's group plan differs from "
                    "worker 0's\n", me);
            return -1;
        }
        reads += r.my_read;
        s->group_read = r.group_read, s->sets = r.sets, s->shared_sets = r.shared_sets;
        if (r.cold_s > s->cold_max)
            s->cold_max = r.cold_s, s->cold_worker = me;
        s->cold_sum += r.cold_s;
        s->cold_cpu_max = r.cold_cpu_s > s->cold_cpu_max ? r.cold_cpu_s : s->cold_cpu_max;
        s->cached_max = r.cached_s > s->cached_max ? r.cached_s : s->cached_max;
        s->cached_sum += r.cached_s;
        s->peak_rss = r.peak_rss > s->peak_rss ? r.peak_rss : s->peak_rss;
        s->base_rss = r.base_rss > s->base_rss ? r.base_rss : s->base_rss;
        s->reads_max = r.reads > s->reads_max ? r.reads : s->reads_max;
        s->pieces_max = r.pieces > s->pieces_max ? r.pieces : s->pieces_max;
        s->pushes_max = r.pushes > s->pushes_max ? r.pushes : s->pushes_max;
        s->planned = me + 1;
    }
    if (progress)
        cli_progress_done();
    if (n == world && reads != s->group_read) {
        fprintf(stderr, "ferry-lab bench weights --scale: the workers read %" PRIu64 " bytes, the "
                "group plan %" PRIu64 "\n", reads, s->group_read);
        return -1;
    }
    return 0;
}

/* ---- the command ---------------------------------------------------------------------------- */

static int read_records(int fd, ferry_kv_value **out, uint32_t *world, uint64_t *max_len,
                        uint64_t *total, double *enc_max)
{
    if (read_all(fd, world, sizeof *world) < 0 || *world == 0)
        return -1;
    ferry_kv_value *recs = calloc(*world, sizeof *recs);
    if (!recs)
        return -1;
    *out = recs;
    for (uint32_t k = 0; k < *world; k++) {
        uint64_t len;
        double dt;
        if (read_all(fd, &len, sizeof len) < 0 || read_all(fd, &dt, sizeof dt) < 0 ||
            len > FERRY_STORE_VALUE_MAX || !(recs[k].val = malloc(len ? len : 1)) ||
            read_all(fd, recs[k].val, len) < 0)
            return -1;
        recs[k].len = len;
        *max_len = len > *max_len ? len : *max_len;
        *total += len;
        *enc_max = dt > *enc_max ? dt : *enc_max;
    }
    return 0;
}

static void print_scale(const scale_opts *o, const fr_gen *g, uint32_t world, uint64_t max_len,
                        uint64_t total, double enc_max, const scale_result *r)
{
    double cold_mean = r->planned ? r->cold_sum / r->planned : 0;
    double cached_mean = r->planned ? r->cached_sum / r->planned : 0;
    bool met = max_len <= (1u << 20) && r->cold_max <= 2 && r->cached_max <= 0.01 &&
               r->peak_rss <= (512ull << 20);
    if (o->json) {
        printf("{\"model\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"tensors\":%u,\"workers\":%u,"
               "\"planned\":%u,\"scale_demand_bytes_max\":%" PRIu64 ",\"scale_demand_bytes_total\":%"
               PRIu64 ",\"scale_encode_s_max\":%.6f,\"scale_plan_cold_s\":%.4f,"
               "\"scale_plan_cold_mean_s\":%.4f,\"scale_plan_cold_cpu_s\":%.4f,"
               "\"scale_plan_cold_worker\":%u,"
               "\"scale_plan_cached_s\":%.6f,\"scale_plan_cached_mean_s\":%.6f,"
               "\"scale_peak_rss_bytes\":%" PRIu64 ",\"scale_base_rss_bytes\":%" PRIu64 ",\"replica_sets\":%" PRIu64
               ",\"shared_sets\":%" PRIu64 ",\"reads_max\":%" PRIu64 ",\"read_pieces_max\":%"
               PRIu64 ",\"pushes_max\":%" PRIu64 ",\"group_read_bytes\":%" PRIu64
               ",\"verified\":true,\"goals_met\":%s}\n",
               o->model, o->src, o->dst, ferry_manifest_tensor_count(fr_test_gen_manifest(g)), world, r->planned,
               max_len, total, enc_max, r->cold_max, cold_mean, r->cold_cpu_max, r->cold_worker, r->cached_max,
               cached_mean, r->peak_rss, r->base_rss, r->sets, r->shared_sets, r->reads_max, r->pieces_max,
               r->pushes_max, r->group_read, met ? "true" : "false");
        return;
    }
    char a[32], b[32], c[32];
    printf("ferry-lab bench weights --scale: %s %s -> %s, %u tensors, %u workers (%u planned), "
           "%s read by the group\n", o->model, o->src, o->dst, ferry_manifest_tensor_count(fr_test_gen_manifest(g)),
           world, r->planned, cli_fmt_size(r->group_read, a, sizeof a));
    printf("demand record: largest %s (goal <= 1 MiB), all %s; encode <= %.4f s\n",
           cli_fmt_size(max_len, b, sizeof b), cli_fmt_size(total, c, sizeof c), enc_max);
    printf("plan per worker: cold max %.3f s (worker %u; mean %.3f; CPU at most %.3f; goal <= 2), "
           "next generation max %.5f s (mean %.5f; goal <= 0.01); peak rss %s (goal <= 512 MiB); "
           "%s\n", r->cold_max, r->cold_worker, cold_mean, r->cold_cpu_max, r->cached_max, cached_mean,
           cli_fmt_size(r->peak_rss, a, sizeof a), met ? "every goal met" : "a goal missed");
    printf("resident before planning (the generation and every record): %s\n",
           cli_fmt_size(r->base_rss, a, sizeof a));
    printf("per worker at most %" PRIu64 " strided reads in %" PRIu64 " pieces, %" PRIu64
           " pushes; %" PRIu64 " replica sets, %" PRIu64 " shared; every plan verified\n",
           r->reads_max, r->pieces_max, r->pushes_max, r->sets, r->shared_sets);
}

int cmd_bench_scale(int argc, char **argv)
{
    scale_opts o;
    int pr = parse_scale(argc, argv, &o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &scale_cmd);
    ferry_error err = {0};
    ferry_model *model = NULL;
    fr_gen *g = NULL;
    ferry_layout dl;
    int rc = ferry_layout_parse(o.dst, &dl, &err);   /* before anything is built */
    if (rc == 0)
        rc = ferry_model_preset(o.model, &model, &err);
    if (rc == 0)
        rc = fr_test_gen_build(model, o.src, &g, &err);
    if (rc < 0) {
        fprintf(stderr, "ferry-lab bench weights --scale: %s\n", err.msg[0] ? err.msg : ferry_strerror(rc));
        ferry_model_free(model);
        return 2;
    }
    int fd = -1;
    pid_t pid = spawn(&fd);
    if (pid == 0)
        _exit(encode_all(model, &o, g, fd) == 0 ? 0 : 1);
    ferry_kv_value *recs = NULL;
    uint32_t world = 0;
    uint64_t max_len = 0, total = 0;
    double enc_max = 0;
    bool ok = pid > 0 && read_records(fd, &recs, &world, &max_len, &total, &enc_max) == 0;
    if (fd >= 0)
        close(fd);
    ok = pid > 0 && reap(pid) && ok;
    ferry_model_free(model);
    malloc_trim(0);   /* what building the generation freed is no worker's memory */
    scale_result r = {0};
    if (!ok)
        fprintf(stderr, "ferry-lab bench weights --scale: no demand records came back\n");
    else
        ok = plan_all(g, recs, world, o.workers && o.workers < world ? o.workers : world,
                      !o.json, &r) == 0;
    if (ok)
        print_scale(&o, g, world, max_len, total, enc_max, &r);
    for (uint32_t k = 0; recs && k < world; k++)
        free(recs[k].val);
    free(recs);
    fr_test_gen_free(g);
    return ok ? 0 : 1;
}
