/* `ferry-lab bench weights --torch`: the torch comparison of docs/weights.md
 * ("Against torch.save, gloo and point-to-point"). The benchmark itself is Python
 * (python/ferry/bench_torch.py: torch, gloo and the ferry package); this
 * launcher runs it with the interpreter $FERRY_PYTHON (default
 * /usr/bin/python3, where Debian's torch lives), the package built next to
 * this binary (build/python) ahead of an installed one, and this binary as
 * the `ferry up` it starts, then relays its JSON (--json) or prints a
 * short table from it (each variant's first round, steady-state median
 * and max, the speedups). The module's progress lines and errors go to
 * stderr as they come. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "lab.h"
#include "cli_opts.h"

#define BT_MAX_ARGS 64

/* The path of this binary: /proc/self/exe, else argv[0] as given. */
static void self_path(const char *self, char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n > 0) {
        out[n] = '\0';
        return;
    }
    snprintf(out, cap, "%s", self);
}

/* PYTHONPATH with DIR/python first when the package was built there. */
static int set_pythonpath(const char *exe)
{
    char dir[PATH_MAX], probe[PATH_MAX + 32], path[2 * PATH_MAX + 40];
    snprintf(dir, sizeof dir, "%s", exe);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return 0;   /* found on PATH with no directory: the installed package */
    *slash = '\0';
    snprintf(probe, sizeof probe, "%s/python/ferry/__init__.py", dir);
    struct stat st;
    if (stat(probe, &st) != 0)
        return 0;
    const char *old = getenv("PYTHONPATH");
    if (old && *old)
        snprintf(path, sizeof path, "%s/python:%s", dir, old);
    else
        snprintf(path, sizeof path, "%s/python", dir);
    return setenv("PYTHONPATH", path, 1);
}

/* Read all of fd into a NUL-terminated buffer (NULL on no memory). */
static char *read_all(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb, cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    if (buf)
        buf[len] = '\0';
    return buf;
}

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

static const char *const bt_variant[] = { "torch_save", "gloo_bcast", "p2p", "ferry_shard" };
static const char *const bt_name[] = { "torch.save/load via /dev/shm", "gloo broadcast",
                                       "gloo p2p into the parameters",
                                       "ferry shard publish + direct update" };

/* <variant><suffix>, or -1 where the result lacks it (a variant not run). */
static double vnum(const json_t *r, const char *v, const char *suffix)
{
    char k[64];
    snprintf(k, sizeof k, "%s%s", v, suffix);
    const json_t *x = json_object_get(r, k);
    return x ? json_number_value(x) : -1;
}

static void print_human(const json_t *r)
{
    char sz[32];
    printf("torch model: %.1fM parameters (%s bf16, %lld tensors), %lld trainers %s -> %lld "
           "rollouts %s; first touch %.2f GB/s, warm memcpy %.2f GB/s\n",
           num(r, "params") / 1e6, cli_fmt_size((uint64_t)num(r, "model_bytes"), sz, sizeof sz),
           (long long)num(r, "tensors"), (long long)num(r, "trainers"),
           json_string_value(json_object_get(r, "src_layout")), (long long)num(r, "rollouts"),
           json_string_value(json_object_get(r, "dst_layout")), num(r, "first_touch_gbps"),
           num(r, "warm_memcpy_gbps"));
    if (json_is_true(json_object_get(r, "warm_up")))
        printf("  ferry's warm-up before round 1: %s touched, the slowest process %.2f s\n",
               cli_fmt_size((uint64_t)num(r, "warm_up_bytes"), sz, sizeof sz), num(r, "warm_up_s"));
    else
        printf("  no warm-up (--cold): ferry's first round pays its first touches\n");
    printf("  %-36s %9s %12s %9s\n", "", "first", "steady med", "max");
    for (size_t i = 0; i < sizeof bt_variant / sizeof *bt_variant; i++) {
        const char *v = bt_variant[i];
        if (vnum(r, v, "_s") < 0)
            continue;   /* --variants: not run */
        printf("  %-36s %7.3f s %10.3f s %7.3f s\n", bt_name[i], vnum(r, v, "_first_s"),
               vnum(r, v, "_s"), vnum(r, v, "_max_s"));
    }
    printf("  steady state: the %lld round(s) after the first", (long long)num(r, "rounds"));
    static const char *const sp[][2] = { { "speedup_vs_torch_save", "torch.save" },
                                         { "speedup_vs_gloo", "gloo" },
                                         { "speedup_vs_p2p", "p2p" } };
    const char *sep = "; ferry's median";
    for (size_t i = 0; i < sizeof sp / sizeof *sp; i++)
        if (json_object_get(r, sp[i][0])) {
            printf("%s %.2fx vs %s", sep, num(r, sp[i][0]), sp[i][1]);
            sep = ",";
        }
    printf("\n  %lld parameter hashes equal to the trainers' model", (long long)num(r, "hash_checks"));
    if (json_object_get(r, "faults_per_update"))
        printf("; ferry minor faults per update: rollouts %.0f (%lld pages written)",
               num(r, "faults_per_update"), (long long)num(r, "pages_written"));
    printf("\n");
}

/* --delta (ferry.bench_delta): one line per case, then the goals' figures. */
static void print_delta_human(const json_t *r)
{
    char sz[32];
    printf("torch deltas: %.1fM parameters (%s bf16), %lld trainers %s -> %lld rollouts %s; "
           "crossover %.3g, K %lld; first touch %.2f GB/s, warm memcpy %.2f GB/s\n",
           num(r, "params") / 1e6, cli_fmt_size((uint64_t)num(r, "model_bytes"), sz, sizeof sz),
           (long long)num(r, "trainers"), json_string_value(json_object_get(r, "src_layout")),
           (long long)num(r, "rollouts"), json_string_value(json_object_get(r, "dst_layout")),
           num(r, "crossover"), (long long)num(r, "max_chain"), num(r, "first_touch_gbps"),
           num(r, "warm_memcpy_gbps"));
    printf("  %-8s %9s %-15s %9s %9s %9s %9s %9s %8s\n", "case", "changed", "delta kind", "encode s",
           "publish s", "update s", "delta s", "dense s", "speedup");
    const char *k;
    json_t *c;
    json_object_foreach(json_object_get(r, "delta_cases"), k, c) {
        const json_t *d = json_object_get(c, "delta"), *kinds = json_object_get(d, "kind");
        const json_t *last = json_array_get(kinds, json_array_size(kinds) - 1);
        printf("  %-8s %8.3f%% %-15s %9.3f %9.3f %9.3f %9.3f %9.3f %7.2fx\n", k,
               100 * num(d, "changed_fraction"), last ? json_string_value(last) : "?",
               num(d, "encode_s"), num(d, "publish_s"), num(d, "update_s"), num(d, "s"),
               num(json_object_get(c, "dense"), "s"), num(c, "speedup"));
    }
    printf("  delta_speedup_1pct %.2f, delta_speedup_min %.2f, delta_real_fraction %.4f, "
           "delta_real_speedup %.2f, encode_ratio %.2f (%.2f GB/s solo)\n  %lld parameter hashes "
           "equal to the trainers' model\n", num(r, "delta_speedup_1pct"), num(r, "delta_speedup_min"),
           num(r, "delta_real_fraction"), num(r, "delta_real_speedup"), num(r, "encode_ratio"),
           num(r, "encode_gbps_solo"), (long long)num(r, "hash_checks"));
}

/* --fp8 (ferry.bench_fp8): the first round, the steady state, the goals' figures. */
static void print_fp8_human(const json_t *r)
{
    char sz[32];
    const json_t *q = json_object_get(r, "quant"), *st = json_object_get(r, "steady");
    const json_t *blk = json_object_get(q, "block"), *first = json_object_get(r, "first");
    printf("torch FP8 rollouts: %.1fM parameters (%s bf16; %lld of %lld tensors FP8 in %lld x %lld "
           "blocks), %lld trainers %s -> %lld rollouts %s; first touch %.2f GB/s, warm memcpy %.2f "
           "GB/s\n", num(r, "params") / 1e6,
           cli_fmt_size((uint64_t)num(r, "model_bytes"), sz, sizeof sz), (long long)num(r, "fp8_tensors"),
           (long long)num(r, "tensors"), (long long)json_integer_value(json_array_get(blk, 0)),
           (long long)json_integer_value(json_array_get(blk, 1)), (long long)num(r, "trainers"),
           json_string_value(json_object_get(r, "src_layout")), (long long)num(r, "rollouts"),
           json_string_value(json_object_get(r, "dst_layout")), num(r, "first_touch_gbps"),
           num(r, "warm_memcpy_gbps"));
    printf("  %-6s %9s %12s %10s %10s %12s %12s\n", "", "first", "steady med", "publish", "update",
           "read", "pushed");
    static const char *const side[] = { "bf16", "fp8" };
    for (size_t i = 0; i < 2; i++) {
        const json_t *s = json_object_get(st, side[i]);
        printf("  %-6s %7.3f s %10.3f s %8.3f s %8.3f s %12.0f %12.0f\n", side[i],
               num(json_object_get(first, side[i]), "s"), num(s, "s"), num(s, "publish_s"),
               num(s, "update_s"), num(s, "read_bytes"), num(s, "pushed_bytes"));
    }
    printf("  fp8_speedup %.2f (first %.2f), fp8_bytes_ratio %.3f (the quantized tensors alone "
           "%.3f), quant_ratio %.3f (bf16 %.3f)\n  %lld parameter hashes equal to the reference\n",
           num(r, "fp8_speedup"), num(r, "fp8_speedup_first"), num(r, "fp8_bytes_ratio"),
           num(r, "fp8_bytes_ratio_quantized"), num(r, "quant_ratio"), num(r, "quant_ratio_bf16"),
           (long long)num(r, "hash_checks"));
}

/* The launcher's own options; every other one is ferry.bench_torch's, whose
 * argparse declares, checks and explains it (its --help follows this one). */
typedef struct bt_opts {
    bool json;
} bt_opts;

static const cli_opt bt_table[] = {
    CLI_FLAG(bt_opts, json, "json", "print the module's JSON result (default: a short table)"),
};

static const cli_cmd bt_cmd = {
    .name = "bench weights --torch",
    .forms = "[OPTION]...",
    .about = "A torch weight update against torch.save, gloo and point-to-point, on the\n"
             "same shards. Runs $FERRY_PYTHON (default /usr/bin/python3) -m\n"
             "ferry.bench_torch; every option but the launcher's own (below) is the\n"
             "module's, passed on: its help follows. The first round is reported alone,\n"
             "the steady-state rounds after it. With --delta it runs ferry.bench_delta:\n"
             "deltas from the trainers (ferry.torch.publish_delta) against the dense shard\n"
             "update of the same weights; with --fp8 ferry.bench_fp8: FP8 rollouts (quantized\n"
             "once by the trainers) against the bf16 update of the same weights.",
    .opts = bt_table,
    .nopts = sizeof bt_table / sizeof bt_table[0],
};

/* argv[i] is the launcher's own option o. */
static bool own(const char *a, const cli_opt *o)
{
    return !strncmp(a, "--", 2) && !strcmp(a + 2, o->name);
}

int cmd_bench_torch(int argc, char **argv, const char *self)
{
    char exe[PATH_MAX];
    const char *args[BT_MAX_ARGS + 6];
    const char *py = getenv("FERRY_PYTHON");
    bt_opts o = {0};
    bool help = false;
    int n = 0;
    py = py && *py ? py : "/usr/bin/python3";
    args[n++] = py;
    args[n++] = "-m";
    args[n++] = "ferry.bench_torch";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--torch"))
            continue;
        if (own(argv[i], &bt_table[0]))
            o.json = true;
        help = help || cli_is_help(argv[i]);
        if (n >= BT_MAX_ARGS) {
            fprintf(stderr, "ferry-lab bench weights --torch: more than %d arguments\n", BT_MAX_ARGS - 4);
            return cli_cmd_usage_exit(-1, &bt_cmd);
        }
        if (!own(argv[i], &bt_table[0]))
            args[n++] = argv[i];
    }
    if (!help)
        args[n++] = "--json";   /* the module's JSON is what this relays */
    args[n] = NULL;
    self_path(self, exe, sizeof exe);
    if (set_pythonpath(exe) < 0 || setenv("FERRY_BIN", lab_ferry_bin(), 1) < 0 ||
        setenv("FERRY_LAB", exe, 0) < 0) {   /* --fp8 runs its --convert-only for quant_ratio */
        fprintf(stderr, "ferry-lab bench weights --torch: cannot set the environment: %s\n", strerror(errno));
        return 1;
    }
    if (help) {   /* the module's own help, straight to stdout */
        cli_cmd_usage(stdout, &bt_cmd);
        printf("\n");
        fflush(stdout);
        execv(py, (char *const *)args);
        fprintf(stderr, "ferry-lab bench weights --torch: cannot run %s: %s (set FERRY_PYTHON)\n", py,
                strerror(errno));
        return 1;
    }
    int pfd[2];
    if (pipe(pfd) < 0) {
        fprintf(stderr, "ferry-lab bench weights --torch: pipe: %s\n", strerror(errno));
        return 1;
    }
    fflush(stdout);
    uint64_t oom0 = cli_oom_kills();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ferry-lab bench weights --torch: fork: %s\n", strerror(errno));
        close(pfd[0]), close(pfd[1]);
        return 1;
    }
    if (pid == 0) {
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]), close(pfd[1]);
        execv(py, (char *const *)args);
        fprintf(stderr, "ferry-lab bench weights --torch: cannot run %s: %s (set FERRY_PYTHON to a "
                "python3 with torch)\n", py, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char *out = read_all(pfd[0]);
    close(pfd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char why[160];
        cli_exit_reason(st, oom0, "", why, sizeof why);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 127)
            fprintf(stderr, "ferry-lab bench weights --torch: %s -m ferry.bench_torch %s\n", py, why);
        free(out);
        return WIFEXITED(st) && WEXITSTATUS(st) == 2 ? 2 : 1;   /* 2: its usage error */
    }
    /* the result is the module's last line */
    size_t len = out ? strlen(out) : 0;
    while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == ' '))
        out[--len] = '\0';
    const char *line = NULL;
    if (len > 0) {
        line = strrchr(out, '\n');
        line = line ? line + 1 : out;
    }
    json_error_t jerr;
    json_t *r = line ? json_loads(line, 0, &jerr) : NULL;
    if (!r || !json_is_object(r) || !json_object_get(r, "hash_checks")) {
        fprintf(stderr, "ferry-lab bench weights --torch: %s -m ferry.bench_torch printed no result "
                "object\n", py);
        json_decref(r);
        free(out);
        return 1;
    }
    if (o.json)
        printf("%s\n", line);
    else if (json_object_get(r, "delta_cases"))
        print_delta_human(r);
    else if (json_object_get(r, "fp8_speedup"))
        print_fp8_human(r);
    else
        print_human(r);
    json_decref(r);
    free(out);
    return 0;
}
