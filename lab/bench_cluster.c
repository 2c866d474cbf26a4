/* `ferry-lab bench cluster` (issue 29 items 2 and 3; docs/lab.md, "The
 * cluster benchmark"): one lab of shaped links, one set of trainer and
 * rollout processes in their hosts, and one generation moved five ways —
 * ferry direct, ferry compat, naive (every worker reads its demand from
 * the store), p2p (each trainer rank sends each worker its slices) and
 * bcast (rank 0 gathers, then sends every worker its part) — each timed,
 * each checked element by element, each host's link bytes read from the
 * kernel's counters (the switch's veth ports) and set against the model
 * (bench_cluster_model.c). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lab.h"
#include "bench_cluster.h"

typedef struct bc_opts {
    unsigned trainers, trainer_hosts, rollouts, dp, rollout_hosts, slow_hosts, slow_factor;
    uint64_t bytes, batch;
    bool ep;
    char model[64];
    const char *rate;
    double check_seconds;
    bool json;
    const char *plot;
} bc_opts;

static const cli_opt bc_table[] = {
    CLI_ARG(bc_opts, rate, "rate", "RATE", "each host's link, each way (default 200mbit: link-bound\n"
                                           "on a 2-core machine; docs/lab.md)"),
    CLI_SIZE(bc_opts, bytes, "bytes", "SIZE", 1u << 20, 4ull << 30,
             "the model's tensors up to this many bf16 bytes (default 192M)"),
    CLI_SIZE(bc_opts, batch, "batch", "SIZE", 64u << 10, 1ull << 30,
             "the direct update's batch_bytes (default 2M: reads and pushes overlap)"),
    CLI_STR(bc_opts, model, "model", "PRESET", "tensor shapes of this preset (default qwen3-8b)"),
    CLI_UINT(bc_opts, trainers, "trainers", "N", 1, 64, "trainer ranks, FSDP (default 4)"),
    CLI_UINT(bc_opts, trainer_hosts, "trainer-hosts", "N", 1, 8, "hosts of the trainers (default 2)"),
    CLI_UINT(bc_opts, rollouts, "rollouts", "N", 1, 64, "rollout workers (default 12)"),
    CLI_UINT(bc_opts, dp, "dp", "N", 1, 64, "rollout data-parallel replicas; TP = rollouts / dp (default 6)"),
    CLI_FLAG(bc_opts, ep, "ep", "expert parallelism on the rollouts: each expert tensor whole on one\n"
                                "worker of each replica (a MoE preset, e.g. --model qwen3-30b-a3b)"),
    CLI_UINT(bc_opts, rollout_hosts, "rollout-hosts", "N", 1, 14, "hosts of the rollouts (default 6)"),
    CLI_UINT(bc_opts, slow_hosts, "slow-hosts", "N", 0, 14,
             "this many rollout hosts (the last ones) on a slower link (default 0)"),
    CLI_UINT(bc_opts, slow_factor, "slow-factor", "F", 2, 1000,
             "a slow host's link is RATE / F (default 10)"),
    CLI_DOUBLE(bc_opts, check_seconds, "check-seconds", "S", 0.2, 30,
               "each direction's link-check stream (default 1.5)"),
    CLI_FLAG(bc_opts, json, "json", "one JSON object on stdout (default: a table)"),
    CLI_ARG(bc_opts, plot, "plot", "FILE.svg",
            "draw each host's link per 100 ms, one panel per strategy, with\n"
            "its link rate and the modelled bound (gnuplot; default: none)"),
};

static const cli_cmd bc_cmd = {
    .name = "bench cluster",
    .about = "A weight update across emulated hosts with shaped links (the lab, root only):\n"
             "ferry direct and compat, naive, point-to-point from the trainers and a\n"
             "rank-0 broadcast, one generation each over the same links; each one's time,\n"
             "its bytes through every host's link from the kernel's counters, the model's\n"
             "prediction of both, every byte checked.",
    .opts = bc_table,
    .nopts = sizeof bc_table / sizeof bc_table[0],
};

enum { S_DIRECT, S_COMPAT, S_NAIVE, S_P2P, S_BCAST, S_N };
static const char *const s_key[S_N] = { "direct", "compat", "naive", "p2p", "bcast" };

typedef struct bc_run {
    lab L;
    bc_topo t;
    child tr[64], ro[64];
    unsigned ntr, nro;
    char master[128];
    char stats[300];
    json_t *counters[2];   /* the direct and compat updates' own counters (demo_counters_collect) */
    bc_series series[S_N]; /* --plot: each strategy's link counters every 100 ms */
    bool plot;
    /* the CPU sampler */
    pthread_t cpu_thread;
    bool cpu_on;
    volatile int cpu_stop;
    double cpu_max;
    pthread_mutex_t cpu_lock;
} bc_run;

/* ---- the kernel's counters: the switch's port p<i> sends what host i downloads ---------- */

static int read_ports(const lab *L, double up[LAB_MAX_HOSTS], double down[LAB_MAX_HOSTS])
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char ns[64];
        snprintf(ns, sizeof ns, "%s-sw", L->prefix);
        if (lab_enter(ns) < 0)
            _exit(1);
        FILE *f = fopen("/proc/self/net/dev", "r");   /* this namespace's devices */
        char buf[8192];
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (n && write(p[1], buf, n) < 0)
            _exit(1);
        _exit(0);
    }
    close(p[1]);
    char buf[8192];
    size_t len = 0;
    ssize_t r;
    while (pid > 0 && len + 1 < sizeof buf && (r = read(p[0], buf + len, sizeof buf - 1 - len)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        len += (size_t)r;
    }
    buf[len] = 0;
    close(p[0]);
    if (pid > 0)
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
    return bc_parse_ports(buf, L->hosts, up, down);
}

/* ---- the CPU: the busiest second of the measured phases --------------------------------- */

static void *cpu_main(void *arg)
{
    bc_run *R = arg;
    unsigned long long st[2] = { 0, 0 };
    lab_cpu_sample(st);
    while (!R->cpu_stop) {
        for (int i = 0; i < 10 && !R->cpu_stop; i++) {
            struct timespec ts = { 0, 100 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        double b = lab_cpu_sample(st);
        pthread_mutex_lock(&R->cpu_lock);
        R->cpu_max = b > R->cpu_max ? b : R->cpu_max;
        pthread_mutex_unlock(&R->cpu_lock);
    }
    return NULL;
}

/* ---- the processes ------------------------------------------------------------------------ */

static int start_child(bc_run *R, child *c, unsigned host, const char *role, unsigned rank,
                       unsigned world, const bc_opts *o, uint64_t node)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) < 0) {
        close(in[0]), close(in[1]);
        return -1;
    }
    char rk[16], wd[16], bud[32], dp[16], log[512], seg[32], nd[16];
    snprintf(rk, sizeof rk, "%u", rank);
    snprintf(wd, sizeof wd, "%u", world);
    snprintf(bud, sizeof bud, "%llu", (unsigned long long)o->bytes);
    snprintf(dp, sizeof dp, "%u", !strcmp(role, "rollout") ? o->dp : 1);
    snprintf(log, sizeof log, "%s/h%u-%s%u.log", R->L.dir, host, role, rank);
    snprintf(seg, sizeof seg, "%llu", (unsigned long long)R->L.segment[host]);
    snprintf(nd, sizeof nd, "%llu", (unsigned long long)node);
    setenv("FERRY_DEMO_SEGMENT", seg, 1);   /* inherited by the child */
    setenv("FERRY_DEMO_NODE", nd, 1);
    /* no warm-up: it touches every segment of the machine from every process
     * (16 x the lab's segments here), minutes on a busy machine; what a cold
     * generation pays per page (about 1 GB/s) is noise against these links */
    setenv("FERRY_DEMO_COLD", "1", 1);
    setenv("FERRY_DEMO_EP", o->ep ? "1" : "0", 1);
    /* the direct update's batches small enough that reads and pushes overlap
     * (a worker reads model / DP / TP bytes: a few MiB here; with one batch the
     * pushes wait for every read, and the links take turns) */
    char batch[32];
    snprintf(batch, sizeof batch, "%llu", (unsigned long long)o->batch);
    setenv("FERRY_DEMO_BATCH", batch, 1);
    const char *argv[] = { "/proc/self/exe", "worker", role, R->master, rk, wd, o->model, bud, dp, NULL };
    pid_t p = lab_spawn_io(&R->L, host, log, R->master, argv, in[0], out[1]);
    close(in[0]);
    close(out[1]);
    c->pid = p;
    c->in = fdopen(in[1], "w");
    c->out = fdopen(out[0], "r");
    return p > 0 && c->in && c->out ? 0 : -1;
}

static void stop_children(bc_run *R)
{
    for (unsigned i = 0; i < R->ntr; i++)
        if (R->tr[i].in)
            fclose(R->tr[i].in), R->tr[i].in = NULL;
    for (unsigned i = 0; i < R->nro; i++)
        if (R->ro[i].in)
            fclose(R->ro[i].in), R->ro[i].in = NULL;
    for (unsigned i = 0; i < R->ntr; i++)
        if (R->tr[i].out)
            fclose(R->tr[i].out), R->tr[i].out = NULL;
    for (unsigned i = 0; i < R->nro; i++)
        if (R->ro[i].out)
            fclose(R->ro[i].out), R->ro[i].out = NULL;
    /* the processes themselves: the lab's teardown (their groups are recorded) */
}

static int ready_all(child *cs, unsigned n, char *err, size_t cap)
{
    for (unsigned i = 0; i < n; i++) {
        char line[1024];
        if (demo_child_line(&cs[i], line, sizeof line) < 0 || strncmp(line, "READY", 5)) {
            snprintf(err, cap, "a process did not start: %.200s", line);
            return -1;
        }
    }
    return 0;
}

/* "listen" to one child: its port. */
static int child_port(child *c, unsigned *port)
{
    double w;
    uint64_t a, b;
    char err[256];
    if (!demo_round(c, 1, "listen", &w, &a, &b, NULL, err, sizeof err) || !a)
        return -1;
    *port = (unsigned)a;
    return 0;
}

static int start_processes(bc_run *R, const bc_opts *o, char *err, size_t cap)
{
    bc_topo *t = &R->t;
    snprintf(R->stats, sizeof R->stats, "%s/counters", R->L.dir);
    if (mkdir(R->stats, 0700) < 0 || setenv("FERRY_DEMO_STATS", R->stats, 1) < 0)
        return -1;
    for (unsigned r = 0; r < o->trainers; r++, R->ntr++)
        if (start_child(R, &R->tr[r], bc_trainer_host(t, r), "trainer", r, o->trainers, o, 0) < 0)
            return -1;
    for (unsigned w = 0; w < o->rollouts; w++, R->nro++)
        if (start_child(R, &R->ro[w], bc_rollout_host(t, w), "rollout", w, o->rollouts, o,
                        bc_rollout_host(t, w) - o->trainer_hosts) < 0)
            return -1;
    if (ready_all(R->tr, R->ntr, err, cap) < 0 || ready_all(R->ro, R->nro, err, cap) < 0)
        return -1;
    /* the baselines' sockets: every rollout and trainer 0 listen; the trainers learn them */
    static char peers[8192];
    unsigned port;
    if (child_port(&R->tr[0], &port) < 0)
        return -1;
    int n = snprintf(peers, sizeof peers, "peers %u %u %s.%u:%u", o->rollouts, o->dp, R->L.net,
                     bc_trainer_host(t, 0) + 1, port);
    for (unsigned w = 0; w < o->rollouts; w++) {
        if (child_port(&R->ro[w], &port) < 0)
            return -1;
        n += snprintf(peers + n, sizeof peers - (size_t)n, " %s.%u:%u", R->L.net,
                      bc_rollout_host(t, w) + 1, port);
    }
    double wall;
    uint64_t a, b;
    return demo_round(R->tr, R->ntr, peers, &wall, &a, &b, NULL, err, cap) ? 0 : -1;
}

/* ---- one strategy ----------------------------------------------------------------------- */

typedef struct bc_fig {
    double s, model_s;
    uint64_t bad;
    bc_links meas, model;
    double rel_err;
} bc_fig;

/* The worst relative difference of measured and modelled bytes over every
 * host and direction; where the model has (almost) nothing, the difference
 * is taken relative to the strategy's busiest modelled link instead (a
 * link that carries only acknowledgements and metadata). */
static double rel_error(const bc_topo *t, const bc_links *meas, const bc_links *model)
{
    double busiest = 0, worst = 0;
    for (unsigned h = 0; h < bc_hosts(t); h++) {
        busiest = model->up[h] > busiest ? model->up[h] : busiest;
        busiest = model->down[h] > busiest ? model->down[h] : busiest;
    }
    for (unsigned h = 0; h < bc_hosts(t); h++)
        for (int d = 0; d < 2; d++) {
            double m = d ? meas->down[h] : meas->up[h], p = d ? model->down[h] : model->up[h];
            double base = p >= 0.05 * busiest ? p : busiest;
            double e = base > 0 ? fabs(m - p) / base : 0;
            worst = e > worst ? e : worst;
        }
    return worst;
}

static bool round_all(bc_run *R, bool trainers, bool rollouts, const char *cmd, double *wall,
                      uint64_t *bad, char *err, size_t cap)
{
    child all[128];
    unsigned n = 0;
    for (unsigned i = 0; trainers && i < R->ntr; i++)
        all[n++] = R->tr[i];
    for (unsigned i = 0; rollouts && i < R->nro; i++)
        all[n++] = R->ro[i];
    uint64_t a;
    return demo_round(all, n, cmd, wall, &a, bad, NULL, err, cap);
}

static int measure(bc_run *R, int s, bc_fig *f, json_t **nodes, char *err, size_t cap)
{
    double u0[LAB_MAX_HOSTS] = { 0 }, d0[LAB_MAX_HOSTS] = { 0 };
    double u1[LAB_MAX_HOSTS] = { 0 }, d1[LAB_MAX_HOSTS] = { 0 };
    if (read_ports(&R->L, u0, d0) < 0) {
        snprintf(err, cap, "cannot read the switch's port counters");
        return -1;
    }
    char cmd[64];
    bool ok;
    f->bad = 0;
    bc_sampler sp;
    if (R->plot && bc_sampler_start(&sp, &R->L, &R->series[s]) < 0) {
        snprintf(err, cap, "--plot: cannot start the link sampler");
        return -1;
    }
    switch (s) {
    case S_DIRECT:
    case S_COMPAT:
    case S_NAIVE:
        snprintf(cmd, sizeof cmd, "%s 1", s_key[s]);
        ok = round_all(R, false, true, cmd, &f->s, &f->bad, err, cap);
        break;
    case S_P2P:
        snprintf(cmd, sizeof cmd, "p2p 1 %u", R->ntr);
        ok = round_all(R, true, true, cmd, &f->s, &f->bad, err, cap);
        break;
    default:
        ok = round_all(R, true, true, "bcast 1", &f->s, &f->bad, err, cap);
        break;
    }
    if (R->plot && bc_sampler_stop(&sp) < 0 && ok) {
        snprintf(err, cap, "--plot: cannot sample the switch's port counters");
        return -1;
    }
    if (ok && read_ports(&R->L, u1, d1) < 0) {
        snprintf(err, cap, "cannot read the switch's port counters");
        return -1;
    }
    if (!ok)
        return -1;
    for (unsigned h = 0; h < R->L.hosts; h++) {
        f->meas.up[h] = u1[h] - u0[h];
        f->meas.down[h] = d1[h] - d0[h];
    }
    if (s == S_DIRECT || s == S_COMPAT) {
        json_t *j = demo_counters_collect(R->stats, s == S_DIRECT ? "rollout" : "compat", R->nro);
        if (s == S_DIRECT && j) {
            *nodes = json_incref(json_object_get(j, "nodes"));
            json_object_del(j, "nodes");
        }
        R->counters[s == S_DIRECT ? 0 : 1] = j;
    }
    if (f->bad) {
        snprintf(err, cap, "%s: %llu elements differ from the generation", s_key[s],
                 (unsigned long long)f->bad);
        return -1;
    }
    return 0;
}

/* ---- the report ----------------------------------------------------------------------- */

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static void print_links(const bc_topo *t, const bc_fig *f, const char *prefix)
{
    printf("%s[", prefix);
    for (unsigned h = 0; h < bc_hosts(t); h++)
        printf("%s{\"host\":%u,\"role\":\"%s\",\"up\":%.0f,\"down\":%.0f,\"model_up\":%.0f,"
               "\"model_down\":%.0f}", h ? "," : "", h, h < t->TH ? "trainer" : "rollout",
               f->meas.up[h], f->meas.down[h], f->model.up[h], f->model.down[h]);
    printf("]");
}

static void report(const bc_run *R, const bc_opts *o, const bc_fig *f, double publish_s,
                   double bound_s, double cbound_s, double link_ratio)
{
    const bc_topo *t = &R->t;
    double maxerr = 0;
    for (int s = 0; s < S_N; s++)
        maxerr = f[s].rel_err > maxerr ? f[s].rel_err : maxerr;
    double d = f[S_DIRECT].s;
    if (o->json) {
        printf("{\"model\":\"%s\",\"bytes\":%llu,\"tensors\":%zu,\"trainers\":%u,\"trainer_hosts\":%u,"
               "\"rollouts\":%u,\"dp\":%u,\"rollout_hosts\":%u,\"rate_bps\":%llu,\"slow_hosts\":%u,"
               "\"slow_factor\":%u,\"ep\":%s,\"payload_fraction\":%.4f,\"verified\":true,\"publish_s\":%.3f,"
               "\"bound_s\":%.3f,\"compat_bound_s\":%.3f", o->model,
               (unsigned long long)t->m->bytes, t->m->n, o->trainers, o->trainer_hosts, o->rollouts,
               o->dp, o->rollout_hosts, (unsigned long long)R->L.rate, o->slow_hosts, o->slow_factor,
               o->ep ? "true" : "false", BC_PAYLOAD_FRACTION, publish_s, bound_s, cbound_s);
        for (int s = 0; s < S_N; s++)
            printf(",\"%s_s\":%.3f,\"%s_model_s\":%.3f,\"%s_ratio_to_model\":%.3f,"
                   "\"%s_link_bytes_rel_error\":%.4f", s_key[s], f[s].s, s_key[s], f[s].model_s,
                   s_key[s], ratio(f[s].s, f[s].model_s), s_key[s], f[s].rel_err);
        printf(",\"direct_ratio_to_bound\":%.3f,\"compat_ratio_to_bound\":%.3f,"
               "\"speedup_vs_bcast\":%.3f,\"speedup_vs_p2p\":%.3f,\"speedup_vs_naive\":%.3f,"
               "\"link_bytes_max_rel_error\":%.4f,\"cpu_busy_max\":%.3f,\"link_rate_achieved\":%.4f,"
               "\"links\":{", ratio(d, bound_s), ratio(f[S_COMPAT].s, cbound_s),
               ratio(f[S_BCAST].s, d), ratio(f[S_P2P].s, d), ratio(f[S_NAIVE].s, d), maxerr,
               R->cpu_max, link_ratio);
        for (int s = 0; s < S_N; s++) {
            char k[32];
            snprintf(k, sizeof k, "%s\"%s\":", s ? "," : "", s_key[s]);
            print_links(t, &f[s], k);
        }
        char *dj = R->counters[0] ? json_dumps(R->counters[0], JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
        char *cj = R->counters[1] ? json_dumps(R->counters[1], JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
        printf("},\"direct_counters\":%s,\"compat_counters\":%s}\n", dj ? dj : "null", cj ? cj : "null");
        free(dj);
        free(cj);
        return;
    }
    char sz[32];
    printf("bench cluster: %s, %zu tensors, %s bf16; %u trainer ranks (FSDP) on %u hosts, %u rollouts "
           "(TP%u x DP%u) on %u hosts; links %.0f Mbit/s%s\n", o->model, t->m->n,
           cli_fmt_size(t->m->bytes, sz, sizeof sz), o->trainers, o->trainer_hosts, o->rollouts,
           o->rollouts / o->dp, o->dp, o->rollout_hosts, (double)R->L.rate / 1e6,
           o->slow_hosts ? " (the last rollout hosts slower, --slow-hosts)" : "");
    printf("publish %.3f s (into each trainer host's own node: no link)\n", publish_s);
    printf("%-8s %9s %9s %8s %9s %11s\n", "strategy", "time s", "model s", "x model", "x bound",
           "link bytes");
    for (int s = 0; s < S_N; s++)
        printf("%-8s %9.3f %9.3f %8.3f %9.3f %10.1f%%\n", s_key[s], f[s].s, f[s].model_s,
               ratio(f[s].s, f[s].model_s), ratio(f[s].s, s == S_COMPAT ? cbound_s : bound_s),
               100 * f[s].rel_err);
    printf("bound %.3f s (compat's %.3f s); ferry direct is %.2fx faster than bcast, %.2fx than p2p, "
           "%.2fx than naive\n", bound_s, cbound_s, ratio(f[S_BCAST].s, d), ratio(f[S_P2P].s, d),
           ratio(f[S_NAIVE].s, d));
    printf("link bytes: measured (kernel counters of the switch's ports) against the model, worst "
           "host and direction %.1f%%; link check %.3f of the configured rate; busiest CPU second "
           "%.2f of the machine%s\n", 100 * maxerr, link_ratio, R->cpu_max,
           R->cpu_max > LAB_CPU_BOUND ? " - CPU-bound: lower --rate" : " - link-bound");
    printf("every strategy's bytes checked element by element in every rollout worker\n");
}

/* ---- the run ---------------------------------------------------------------------------- */

static int check_layout(const bc_opts *o)
{
    const char *why = NULL;
    if (o->trainers % o->trainer_hosts)
        why = "--trainers must be a multiple of --trainer-hosts";
    else if (o->rollouts % o->rollout_hosts)
        why = "--rollouts must be a multiple of --rollout-hosts";
    else if (o->rollouts % o->dp)
        why = "--dp must divide --rollouts";
    else if (o->trainer_hosts + o->rollout_hosts > LAB_MAX_HOSTS)
        why = "--trainer-hosts + --rollout-hosts is more than the lab's 16 hosts";
    else if (o->slow_hosts > o->rollout_hosts)
        why = "--slow-hosts is more than --rollout-hosts";
    if (why)
        fprintf(stderr, "ferry-lab bench cluster: %s\n", why);
    return why ? -1 : 0;
}

int cmd_bench_cluster(int argc, char **argv, const char *self)
{
    (void)self;
    bc_opts o = { .trainers = 4, .trainer_hosts = 2, .rollouts = 12, .dp = 6, .rollout_hosts = 6,
                  .slow_factor = 10, .bytes = 192ull << 20, .batch = 2ull << 20, .check_seconds = 1.5 };
    snprintf(o.model, sizeof o.model, "qwen3-8b");
    int pr = cli_parse(&bc_cmd, argc, argv, &o, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &bc_cmd);
    const char *rate_s = o.rate ? o.rate : "200mbit";
    uint64_t rate = lab_parse_rate(rate_s, "ferry-lab bench cluster");
    if (!rate || check_layout(&o) < 0)
        return 2;
    demo_model dm;
    if (demo_model_build(o.model, o.bytes, &dm) < 0) {
        fprintf(stderr, "ferry-lab bench cluster: unknown model preset %s\n", o.model);
        return 2;
    }
    if (geteuid() != 0) {
        fprintf(stderr, "ferry-lab bench cluster: needs root (the lab makes network namespaces); "
                        "not running as root\n");
        demo_model_free(&dm);
        return 2;
    }
    if (o.plot) {   /* a file it cannot write is refused before anything is made */
        int fd = open(o.plot, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "ferry-lab bench cluster: --plot %s: %s\n", o.plot, strerror(errno));
            demo_model_free(&dm);
            return 2;
        }
        close(fd);
    }
    static bc_run R;
    memset(&R, 0, sizeof R);
    R.plot = o.plot != NULL;
    pthread_mutex_init(&R.cpu_lock, NULL);
    int rc = 1;
    char err[512] = "";
    int trc = bc_topo_init(&R.t, &dm, o.trainers, o.trainer_hosts, o.rollouts, o.dp, o.rollout_hosts);
    R.t.ep = o.ep;
    if (trc < 0 ||
        lab_open(&R.L, bc_hosts(&R.t), rate) < 0) {
        fprintf(stderr, "ferry-lab bench cluster: cannot set up (out of memory, or no temp dir)\n");
        bc_topo_free(&R.t);
        demo_model_free(&dm);
        return 1;
    }
    unsigned H = bc_hosts(&R.t);
    for (unsigned h = 0; h < H; h++) {
        bool slow = h >= H - o.slow_hosts;
        R.L.host_rate[h] = slow ? rate / o.slow_factor : rate;
        R.t.rate[h] = lab_host_rate(&R.L, h);
        /* a trainer host keeps three generations of its ranks' shards; the rollouts' hold none */
        uint64_t mine = 0;
        for (unsigned r = 0; h < o.trainer_hosts && r < o.trainers; r++)
            if (bc_trainer_host(&R.t, r) == h)
                mine += R.t.rank_bytes[r];
        R.L.node_size[h] = (h < o.trainer_hosts ? 3 * mine : 0) + (64ull << 20);
    }
    if (!o.json)
        printf("lab %s: %u hosts, links %s each way\n", R.L.prefix, H, rate_s);
    fflush(stdout);
    double worst = 0;
    int saved = dup(1);
    if (o.json && saved >= 0)
        dup2(2, 1);   /* the lab's own lines to stderr: stdout holds the JSON alone */
    int nrc = lab_net_up(&R.L) < 0 || lab_check_links(&R.L, o.check_seconds, false, &worst) < 0 ||
              lab_cluster_start(&R.L, 64ull << 20, R.master, sizeof R.master) < 0;
    fflush(stdout);
    if (o.json && saved >= 0)
        dup2(saved, 1);
    if (saved >= 0)
        close(saved);
    if (nrc)
        goto out;
    if (start_processes(&R, &o, err, sizeof err) < 0) {
        if (!err[0])
            snprintf(err, sizeof err, "the trainer and rollout processes did not start");
        goto out;
    }
    /* the sampler never takes SIGINT/SIGTERM: the main thread must, so that
     * its wait for a reply is interrupted and the lab comes down */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    R.cpu_on = pthread_create(&R.cpu_thread, NULL, cpu_main, &R) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    double publish_s = 0;
    uint64_t bad = 0;
    bc_fig f[S_N];
    memset(f, 0, sizeof f);
    json_t *nodes = NULL;
    if (!o.json)
        cli_progress_text("publish");
    if (!round_all(&R, true, false, "publish 1", &publish_s, &bad, err, sizeof err))
        goto out;
    json_decref(demo_counters_collect(R.stats, "trainer", R.ntr));
    for (int s = 0; s < S_N; s++) {
        if (!o.json)
            cli_progress_text("%s (%d of %d)", s_key[s], s + 1, S_N);
        if (measure(&R, s, &f[s], &nodes, err, sizeof err) < 0 || lab_stopping())
            goto out;
    }
    if (!o.json)
        cli_progress_done();
    bc_links g, sc, lb;
    if (!nodes || bc_model_direct(&R.t, nodes, &f[S_DIRECT].model) < 0) {
        snprintf(err, sizeof err, "the direct update's plan gave no per-node loads");
        json_decref(nodes);
        goto out;
    }
    json_decref(nodes);
    if (bc_model_compat(&R.t, &f[S_COMPAT].model) < 0) {
        snprintf(err, sizeof err, "modelling compat: out of memory");
        goto out;
    }
    bc_model_p2p(&R.t, &f[S_NAIVE].model);
    bc_model_p2p(&R.t, &f[S_P2P].model);
    bc_model_bcast(&R.t, &g, &sc);
    for (unsigned h = 0; h < H; h++) {
        f[S_BCAST].model.up[h] = g.up[h] + sc.up[h];
        f[S_BCAST].model.down[h] = g.down[h] + sc.down[h];
    }
    for (int s = 0; s < S_N; s++) {
        f[s].model_s = s == S_BCAST ? bc_time(&R.t, &g) + bc_time(&R.t, &sc) : bc_time(&R.t, &f[s].model);
        f[s].rel_err = rel_error(&R.t, &f[s].meas, &f[s].model);
    }
    bc_model_bound(&R.t, false, &lb);
    double bound_s = bc_time(&R.t, &lb);
    bc_model_bound(&R.t, true, &lb);
    double cbound_s = bc_time(&R.t, &lb);
    if (R.cpu_on) {
        R.cpu_stop = 1;
        pthread_join(R.cpu_thread, NULL);
        R.cpu_on = false;
    }
    if (o.plot) {
        bc_plot_panel pp[S_N];
        for (int s = 0; s < S_N; s++)
            pp[s] = (bc_plot_panel){ s_key[s], f[s].s, f[s].model_s, s == S_COMPAT ? cbound_s : bound_s };
        if (bc_plot_write(o.plot, R.L.dir, &R.t, R.series, pp, S_N, err, sizeof err) < 0)
            goto out;
        fprintf(o.json ? stderr : stdout, "plot: %s (one panel per strategy)\n", o.plot);
    }
    report(&R, &o, f, publish_s, bound_s, cbound_s, worst);
    rc = 0;
out:
    if (R.cpu_on) {
        R.cpu_stop = 1;
        pthread_join(R.cpu_thread, NULL);
    }
    if (rc != 0)
        fprintf(stderr, "ferry-lab bench cluster: %s\n",
                lab_stopping() ? "interrupted: taking the lab down" : err[0] ? err : "the lab did not come up");
    stop_children(&R);
    lab_teardown(&R.L);
    unsetenv("FERRY_DEMO_STATS");
    json_decref(R.counters[0]);
    json_decref(R.counters[1]);
    for (int s = 0; s < S_N; s++)
        bc_series_free(&R.series[s]);
    bc_topo_free(&R.t);
    demo_model_free(&dm);
    return rc;
}
