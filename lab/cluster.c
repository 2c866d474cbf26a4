/* `ferry-lab cluster up|check|clean`: the lab of emulated hosts (cluster.h,
 * docs/lab.md). This file: the options, the processes, the run's order. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lab.h"
#include "cli_opts.h"
#include "cluster.h"

#define START_S 120.0      /* a master or node that is not ready by then failed (a busy machine) */
#define MAX_RUN 8

typedef struct cl_opts {
    uint32_t hosts;
    const char *rate;
    uint64_t node_size;
    double check_seconds;
    const char *ready_file;
    const char *prefix;
    const char *run[MAX_RUN];
    unsigned nrun;
    bool json, bare;
    const char *net;
} cl_opts;

static int add_run(void *opts, const char *flag, const char *val)
{
    cl_opts *o = opts;
    if (o->nrun >= MAX_RUN) {
        fprintf(stderr, "ferry-lab cluster: at most %d %s commands\n", MAX_RUN, flag);
        return -1;
    }
    o->run[o->nrun++] = val;
    return 0;
}

#define COMMON_OPTS                                                                               \
    CLI_UINT(cl_opts, hosts, "hosts", "N", 2, LAB_MAX_HOSTS, "emulated hosts (default 3)"),       \
    CLI_ARG(cl_opts, rate, "rate", "RATE",                                                        \
            "each host's link, each way: a number with kbit, mbit or\n"                           \
            "gbit (1000s of bits/s), e.g. 100mbit; at most 10gbit"),                              \
    CLI_DOUBLE(cl_opts, check_seconds, "check-seconds", "S", 0.2, 30,                            \
               "each direction's link-check stream (default 1.5)"),                              \
    CLI_FLAG(cl_opts, json, "json", "the link check as JSON lines (default: a table)")

static const cli_opt check_table[] = { COMMON_OPTS };
static const cli_opt up_table[] = {
    COMMON_OPTS,
    CLI_SIZE(cl_opts, node_size, "node-size", "SIZE", 1u << 20, UINT64_MAX,
             "each host's `ferry node` segment (default 64M)"),
    CLI_LIST("run", "CMD", add_run,
             "run CMD (/bin/sh -c) in every host once the cluster is up,\n"
             "and take the lab down when all have exited (up to 8; default:\n"
             "hold until SIGINT/SIGTERM)"),
    CLI_ARG(cl_opts, ready_file, "ready-file", "F",
            "once up, write `prefix P`, `master ADDR`, `dir D` lines to F"),
    CLI_FLAG(cl_opts, bare, "bare", "the hosts and their links only: no master and no nodes\n"
                                    "(the commands run there start their own; docs/deploy.md)"),
    CLI_ARG(cl_opts, net, "net", "A.B.C",
            "the hosts' private /24: hosts A.B.C.1 .. A.B.C.N, the bridge\n"
            "A.B.C.254 (default: 10.X.Y from the pid)"),
};
static const cli_opt clean_table[] = {
    CLI_ARG(cl_opts, prefix, "prefix", "P", "the lab to remove, e.g. fl12345 (default: every lab\n"
                                            "whose ferry-lab process is gone)"),
};

static const cli_cmd check_cmd = {
    .name = "cluster check",
    .about = "Make the lab's hosts (network namespaces on a bridge, each link shaped to\n"
             "RATE both ways), check every link with a TCP stream, report the achieved\n"
             "rates and the CPU use, and remove everything. Needs root.",
    .opts = check_table,
    .nopts = sizeof check_table / sizeof check_table[0],
};
static const cli_cmd up_cmd = {
    .name = "cluster up",
    .about = "The lab of `cluster check`, then a `ferry master` on host 0 and a `ferry node`\n"
             "on every host; --run commands run in every host with FERRY_MASTER,\n"
             "FERRY_TOKEN_FILE, FERRY_LISTEN, FERRY_LAB_HOST (0..N-1), FERRY_LAB_HOSTS,\n"
             "FERRY_LAB_ADDR and FERRY_LAB_DIR set. Everything is removed on exit,\n"
             "SIGINT, SIGTERM or any failure. Needs root.",
    .opts = up_table,
    .nopts = sizeof up_table / sizeof up_table[0],
};
static const cli_cmd clean_cmd = {
    .name = "cluster clean",
    .about = "Remove what a lab killed with SIGKILL left: its namespaces (and every\n"
             "process in them) and its temp dir.",
    .opts = clean_table,
    .nopts = sizeof clean_table / sizeof clean_table[0],
};

uint64_t lab_parse_rate(const char *s, const char *who)
{
    static const struct { const char *unit; uint64_t mul; } units[] = {
        { "bit", 1 }, { "kbit", 1000 }, { "mbit", 1000000 }, { "gbit", 1000000000 },
    };
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || errno) {
        fprintf(stderr, "%s: --rate wants a number with a unit (100mbit), not '%s'\n", who,
                s ? s : "");
        return 0;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(end, units[i].unit)) {
            double bps = v * (double)units[i].mul;
            if (!(bps >= 8000) || bps > (double)LAB_MAX_RATE) {
                fprintf(stderr, "%s: --rate %s is outside 8kbit .. 10gbit\n", who, s);
                return 0;
            }
            return (uint64_t)bps;
        }
    fprintf(stderr, "%s: --rate %s: unknown unit '%s' (kbit, mbit or gbit)\n", who, s, end);
    return 0;
}

static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* The child side of a host's process: its own process group, in the host's
 * namespace, output to log (NULL: inherited), the lab's environment. */
static void child_exec(lab *L, unsigned host, const char *log, const char *master,
                       const char *const *argv, bool via_path, int in_fd, int out_fd)
{
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_DFL);
    char ns[64], v[512];
    snprintf(ns, sizeof ns, "%s-h%u", L->prefix, host);
    if (lab_enter(ns) < 0)
        _exit(126);
    if (log) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0)
            dup2(fd, 1), dup2(fd, 2);
    }
    int nul = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY);
    if (nul >= 0)
        dup2(nul, 0);
    if (out_fd >= 0)
        dup2(out_fd, 1);
    unsetenv("FERRY_TOKEN");
    snprintf(v, sizeof v, "%s/token", L->dir);
    setenv("FERRY_TOKEN_FILE", v, 1);
    if (master)
        setenv("FERRY_MASTER", master, 1);
    snprintf(v, sizeof v, "%s.%u:0", L->net, host + 1);
    setenv("FERRY_LISTEN", v, 1);
    snprintf(v, sizeof v, "%s.%u", L->net, host + 1);
    setenv("FERRY_LAB_ADDR", v, 1);
    snprintf(v, sizeof v, "%u", host);
    setenv("FERRY_LAB_HOST", v, 1);
    snprintf(v, sizeof v, "%u", L->hosts);
    setenv("FERRY_LAB_HOSTS", v, 1);
    setenv("FERRY_LAB_DIR", L->dir, 1);
    setenv("FERRY_BIN", lab_ferry_bin(), 1);
    /* `ferry` and `ferry-lab` as built come first on PATH */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    const char *fb = lab_ferry_bin(), *slash = strrchr(fb, '/');
    const char *path = getenv("PATH");
    if (n > 0) {
        self[n] = 0;
        char *s = strrchr(self, '/');
        if (s)
            *s = 0;
        char np[8192];
        snprintf(np, sizeof np, "%.*s:%s:%s", slash ? (int)(slash - fb) : 0, fb, self,
                 path ? path : "/usr/bin:/bin");
        setenv("PATH", np, 1);
    }
    if (via_path)
        execvp(argv[0], (char *const *)argv);
    else
        execv(argv[0], (char *const *)argv);
    _exit(127);
}

static pid_t spawn_fd(lab *L, unsigned host, const char *log, const char *master,
                      const char *const *argv, bool via_path, int in_fd, int out_fd)
{
    pid_t p = fork();
    if (p == 0)
        child_exec(L, host, log, master, argv, via_path, in_fd, out_fd);
    if (p > 0) {
        setpgid(p, p);   /* both sides: no moment where a kill of the group misses it */
        lab_record(L, LAB_UNDO_PGRP, p, NULL);
    }
    return p;
}

static pid_t spawn(lab *L, unsigned host, const char *log, const char *master, const char *const *argv,
                   bool via_path)
{
    return spawn_fd(L, host, log, master, argv, via_path, -1, -1);
}

pid_t lab_spawn_io(lab *L, unsigned host, const char *log, const char *master,
                   const char *const *argv, int in_fd, int out_fd)
{
    return spawn_fd(L, host, log, master, argv, false, in_fd, out_fd);
}

uint64_t lab_host_rate(const lab *L, unsigned host)
{
    return host < LAB_MAX_HOSTS && L->host_rate[host] ? L->host_rate[host] : L->rate;
}

/* The last line of log, for "why". */
static void last_line(const char *log, char *out, size_t cap)
{
    FILE *f = fopen(log, "r");
    char line[512];
    snprintf(out, cap, "(nothing in its log)");
    while (f && fgets(line, sizeof line, f))
        if (line[strspn(line, " \n")])
            snprintf(out, cap, "%.*s", (int)strcspn(line, "\n"), line);
    if (f)
        fclose(f);
}

/* Wait for file (written once the process is ready); the process exiting
 * first is reported with its host and its log's last line. */
static int wait_ready(pid_t p, const char *file, const char *log, unsigned host, const char *what,
                      char *out, size_t cap)
{
    double end = cli_now() + START_S;
    while (!lab_stopping()) {
        FILE *f = fopen(file, "r");
        if (f) {
            bool ok = fgets(out, (int)cap, f) != NULL;
            fclose(f);
            if (ok) {
                out[strcspn(out, "\n")] = 0;
                return 0;
            }
        }
        int st;
        char why[512];
        if (waitpid(p, &st, WNOHANG) == p) {
            last_line(log, why, sizeof why);
            fprintf(stderr, "ferry-lab cluster: host %u: the %s exited at start (%s %d): %s\n", host,
                    what, WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), why);
            return -1;
        }
        if (cli_now() > end) {
            fprintf(stderr, "ferry-lab cluster: host %u: the %s was not ready in %.0f s (log %s)\n",
                    host, what, START_S, log);
            return -1;
        }
        struct pollfd pf = { .fd = lab_stop_fd(), .events = POLLIN };
        poll(&pf, 1, 20);
    }
    return -1;
}

int lab_cluster_start(lab *L, uint64_t node_size, char *master, size_t cap)
{
    char tok[65], path[512], log[512], seg[64], size[32];
    ferry_token_generate(tok);
    snprintf(path, sizeof path, "%s/token", L->dir);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%s\n", tok) < 0 || fclose(f) != 0) {
        fprintf(stderr, "ferry-lab cluster: cannot write %s\n", path);
        return -1;
    }
    char mdir[512], addr_file[512], listen[64];
    snprintf(mdir, sizeof mdir, "%s/master", L->dir);
    snprintf(addr_file, sizeof addr_file, "%s/master.addr", L->dir);
    snprintf(listen, sizeof listen, "%s.1:0", L->net);
    snprintf(log, sizeof log, "%s/h0-master.log", L->dir);
    const char *ma[] = { lab_ferry_bin(), "master", "--dir", mdir, "--listen", listen,
                         "--token-file", path, "--addr-file", addr_file, NULL };
    pid_t mp = spawn(L, 0, log, NULL, ma, true);
    if (mp < 0 || wait_ready(mp, addr_file, log, 0, "master", master, cap) < 0)
        return -1;
    pid_t np[LAB_MAX_HOSTS];
    char ready[LAB_MAX_HOSTS][512];
    for (unsigned i = 0; i < L->hosts; i++) {   /* all started, then all waited for */
        snprintf(ready[i], sizeof ready[i], "%s/h%u-node.ready", L->dir, i);
        snprintf(log, sizeof log, "%s/h%u-node.log", L->dir, i);
        snprintf(listen, sizeof listen, "%s.%u:0", L->net, i + 1);
        char name[32];
        snprintf(name, sizeof name, "h%u", i);
        snprintf(size, sizeof size, "%llu",
                 (unsigned long long)(L->node_size[i] ? L->node_size[i] : node_size));
        const char *na[] = { lab_ferry_bin(), "node", "--master", master, "--listen", listen,
                             "--size", size, "--name", name, "--token-file", path,
                             "--ready-file", ready[i], NULL };
        np[i] = spawn(L, i, log, master, na, true);
        if (np[i] < 0)
            return -1;
    }
    for (unsigned i = 0; i < L->hosts; i++) {
        snprintf(log, sizeof log, "%s/h%u-node.log", L->dir, i);
        if (wait_ready(np[i], ready[i], log, i, "node", seg, sizeof seg) < 0)
            return -1;
        L->segment[i] = strtoull(seg, NULL, 10);
    }
    return 0;
}

static int write_ready(const lab *L, const char *file, const char *master)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "prefix %s\n%s%s%sdir %s\n", L->prefix, master[0] ? "master " : "", master,
                      master[0] ? "\n" : "", L->dir) < 0 ||
        fclose(f) != 0 || rename(tmp, file) != 0) {
        fprintf(stderr, "ferry-lab cluster: cannot write --ready-file %s\n", file);
        return -1;
    }
    return 0;
}

/* The --run commands in every host until all exit (or, with none, until a
 * signal), the CPU sampled each second. 0 when every command exited 0. */
static int run_phase(lab *L, const cl_opts *o, const char *master)
{
    pid_t pids[LAB_MAX_HOSTS * MAX_RUN];
    unsigned n = 0, left = 0, failed = 0;
    for (unsigned r = 0; r < o->nrun; r++)
        for (unsigned h = 0; h < L->hosts; h++) {
            const char *argv[] = { "/bin/sh", "-c", o->run[r], NULL };
            pids[n] = spawn(L, h, NULL, master[0] ? master : NULL, argv, false);
            if (pids[n] < 0)
                return -1;
            n++, left++;
        }
    unsigned long long cpu[2] = { 0, 0 };
    lab_cpu_sample(cpu);
    while (!lab_stopping() && (o->nrun == 0 || left > 0)) {
        struct pollfd pf = { .fd = lab_stop_fd(), .events = POLLIN };
        poll(&pf, 1, 1000);
        double busy = lab_cpu_sample(cpu);
        L->cpu_max = busy > L->cpu_max ? busy : L->cpu_max;
        for (unsigned k = 0; k < n; k++) {
            int st;
            if (pids[k] > 0 && waitpid(pids[k], &st, WNOHANG) == pids[k]) {
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    fprintf(stderr, "ferry-lab cluster: host %u: --run '%s' exited %d\n",
                            k % L->hosts, o->run[k / L->hosts],
                            WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
                    failed++;
                }
                pids[k] = 0;
                left--;
            }
        }
    }
    return failed || lab_stopping() ? -1 : 0;
}

int lab_open(lab *L, unsigned hosts, uint64_t rate)
{
    memset(L, 0, sizeof *L);
    L->hosts = hosts;
    L->rate = rate;
    int pid = (int)getpid();
    snprintf(L->prefix, sizeof L->prefix, "fl%d", pid);
    snprintf(L->net, sizeof L->net, "10.%d.%d", 64 + pid / 250 % 128, pid % 250);
    const char *t = getenv("TMPDIR");
    snprintf(L->dir, sizeof L->dir, "%s/ferry-cluster-%s-XXXXXX", t && *t ? t : "/tmp", L->prefix);
    if (lab_signals_install() < 0 || !mkdtemp(L->dir)) {
        fprintf(stderr, "ferry-lab: cannot make a temp dir\n");
        return -1;
    }
    lab_record(L, LAB_UNDO_DIR, 0, L->dir);
    return 0;
}

/* A.B.C of a private /24 (10/8, 172.16/12, 192.168/16): 0, or -1 after a line. */
static int parse_net(const char *net, char *out, size_t cap)
{
    unsigned a, b, c;
    int n = 0;
    if (sscanf(net, "%u.%u.%u%n", &a, &b, &c, &n) != 3 || net[n] || b > 255 || c > 255 ||
        !(a == 10 || (a == 172 && b >= 16 && b < 32) || (a == 192 && b == 168))) {
        fprintf(stderr, "ferry-lab cluster: --net %s: want the first three numbers of a private "
                        "/24, such as 10.0.0 (10/8, 172.16/12 or 192.168/16)\n", net);
        return -1;
    }
    snprintf(out, cap, "%u.%u.%u", a, b, c);
    return 0;
}

static int run_lab(const cl_opts *o, bool up)
{
    uint64_t rate = lab_parse_rate(o->rate, "ferry-lab cluster");
    if (!rate)
        return 2;
    char net[16] = "";
    if (o->net && parse_net(o->net, net, sizeof net) < 0)
        return 2;
    uint64_t avail = mem_available();
    if (up && avail && (uint64_t)o->hosts * o->node_size > avail / 4 * 3) {
        fprintf(stderr, "ferry-lab cluster: %u hosts x --node-size %llu bytes is more than 3/4 of the "
                        "machine's available memory (%llu bytes)\n", o->hosts,
                (unsigned long long)o->node_size, (unsigned long long)avail);
        return 2;
    }
    if (geteuid() != 0) {
        fprintf(stderr, "ferry-lab cluster: needs root (it creates network namespaces, veth links "
                        "and qdiscs); not running as root\n");
        return 2;
    }
    double t_start = cli_now();
    lab L;
    if (lab_open(&L, o->hosts, rate) < 0)
        return 1;
    if (net[0])   /* the namespaces are the lab's own: one /24 in two labs never meets */
        snprintf(L.net, sizeof L.net, "%s", net);
    printf("lab %s: %u hosts %s.1-%u on a bridge (%s.254) in namespace %s-sw, links %s each way\n",
           L.prefix, L.hosts, L.net, L.hosts, L.net, L.prefix, o->rate);
    fflush(stdout);
    int rc = 1;
    double worst = 0;
    char master[128] = "";
    if (lab_net_up(&L) < 0 || lab_check_links(&L, o->check_seconds, o->json, &worst) < 0)
        goto out;
    printf("link check: worst link %.3f of the configured rate (goal: within 0.95..1.05)%s\n", worst,
           worst < 0.95 || worst > 1.05 ? " - MISSED: the links do not run at RATE" : "");
    if (up) {
        if (!o->bare && lab_cluster_start(&L, o->node_size, master, sizeof master) < 0)
            goto out;
        if (o->bare)
            printf("cluster up: %u bare hosts, no master and no nodes (dir %s)\n", L.hosts, L.dir);
        else
            printf("cluster up: master %s on host 0, a node on each of the %u hosts (dir %s)\n",
                   master, L.hosts, L.dir);
        fflush(stdout);
        if (o->ready_file && write_ready(&L, o->ready_file, master) < 0)
            goto out;
        if (run_phase(&L, o, master) < 0 && !(o->nrun == 0 && lab_stopping()))
            goto out;
    }
    rc = 0;
out:
    if (lab_stopping())
        fprintf(stderr, "ferry-lab cluster: interrupted: taking the lab down\n");
    struct rusage me, kids;
    getrusage(RUSAGE_SELF, &me);
    getrusage(RUSAGE_CHILDREN, &kids);
    double own = (double)(me.ru_utime.tv_sec + me.ru_stime.tv_sec + kids.ru_utime.tv_sec +
                          kids.ru_stime.tv_sec) +
                 (me.ru_utime.tv_usec + me.ru_stime.tv_usec + kids.ru_utime.tv_usec +
                  kids.ru_stime.tv_usec) / 1e6;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double wall = cli_now() - t_start;
    printf("cpu: busiest second used %.2f of the machine's %ld CPUs (every process's); the lab's "
           "own processes %.2f of it over the run%s\n", L.cpu_max, ncpu,
           wall > 0 && ncpu > 0 ? own / wall / (double)ncpu : 0,
           L.cpu_max > LAB_CPU_BOUND ? "\ncpu: CPU-bound, not link-bound: lower the rate (or run on a "
                                      "quieter machine)" : " - link-bound");
    lab_teardown(&L);
    if (o->ready_file)
        unlink(o->ready_file);
    printf("lab %s removed\n", L.prefix);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry-lab cluster up|check|clean [options]\n"
               "       (ferry-lab cluster WHAT --help for each one's options; docs/lab.md)\n");
}

int cmd_cluster(int argc, char **argv, const char *self)
{
    (void)self;
    const char *what = argc >= 2 ? argv[1] : "";
    const cli_cmd *c = !strcmp(what, "up") ? &up_cmd : !strcmp(what, "check") ? &check_cmd
                     : !strcmp(what, "clean") ? &clean_cmd : NULL;
    if (!c) {
        if (argc < 2)
            fprintf(stderr, "ferry-lab cluster: which? up, check or clean\n");
        else if (!cli_is_help(what))
            fprintf(stderr, "ferry-lab cluster: unknown command '%s'\n", what);
        return cli_usage_exit(argc >= 2 && cli_is_help(what) ? CLI_HELP : -1, usage);
    }
    cl_opts o = { .hosts = 3, .node_size = 64ull << 20, .check_seconds = 1.5 };
    int pr = cli_parse(c, argc - 1, argv + 1, &o, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, c);
    if (c == &clean_cmd) {
        if (geteuid() != 0) {
            fprintf(stderr, "ferry-lab cluster clean: needs root; not running as root\n");
            return 2;
        }
        return lab_clean(o.prefix);
    }
    if (!o.rate) {
        fprintf(stderr, "ferry-lab %s: wants --rate (e.g. --rate 100mbit)\n", c->name);
        return cli_cmd_usage_exit(-1, c);
    }
    return run_lab(&o, c == &up_cmd);
}
