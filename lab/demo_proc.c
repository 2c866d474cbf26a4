/* Processes of the weight-update demo and benchmark: a private master and
 * node (unless FERRY_MASTER is set), trainer and rollout children driven
 * over pipes (demo.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lab.h"
#include "demo.h"

int demo_child_start(child *c, const char *const *args)
{
    memset(c, 0, sizeof *c);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = demo_fork();
    if (pid < 0) {
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        execv("/proc/self/exe", (char *const *)args);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->pid = pid;
    c->in = fdopen(in[1], "w");
    c->out = fdopen(out[0], "r");
    return c->in && c->out ? 0 : -1;
}

int demo_child_line(child *c, char *buf, size_t cap)
{
    if (!c->out || !fgets(buf, (int)cap, c->out)) {
        snprintf(buf, cap, demo_stopping() ? "ERR interrupted" : "ERR the process exited");
        return -1;
    }
    buf[strcspn(buf, "\n")] = 0;
    return strncmp(buf, "OK", 2) == 0 || strncmp(buf, "READY", 5) == 0 ? 0 : -1;
}

void demo_child_stop(child *c)
{
    if (c->in)
        fclose(c->in);   /* EOF: the child leaves its loop */
    if (c->out)
        fclose(c->out);
    if (c->pid > 0) {
        pid_t pid = c->pid;
        for (int i = 0; i < 500; i++) {
            if (waitpid(pid, NULL, WNOHANG) == pid) {
                c->pid = 0;
                break;
            }
            struct timespec ts = { 0, 20 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        if (c->pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        demo_reaped(pid);
    }
    memset(c, 0, sizeof *c);
}

static void child_term(pid_t *p)
{
    if (*p <= 0)
        return;
    kill(*p, SIGTERM);
    for (int i = 0; i < 500 && waitpid(*p, NULL, WNOHANG) != *p; i++) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        if (i == 499) {
            kill(*p, SIGKILL);
            waitpid(*p, NULL, 0);
        }
    }
    demo_reaped(*p);
    *p = 0;
}

static pid_t spawn_quiet(const char *const *args)
{
    pid_t p = demo_fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0)
            dup2(nul, 1);
        execvp(lab_ferry_bin(), (char *const *)args);   /* the operator's ferry */
        _exit(127);
    }
    return p;
}

/* Wait for the file p writes once ready; a p that exits first is reaped
 * (and *p cleared). 0 or -1. */
static int wait_file(const char *path, pid_t *p, char *out, size_t cap)
{
    for (int i = 0; i < 3000; i++) {
        FILE *f = fopen(path, "r");
        if (f) {
            bool ok = fgets(out, (int)cap, f) != NULL;
            fclose(f);
            if (ok) {
                out[strcspn(out, "\n")] = 0;
                return 0;
            }
        }
        if (waitpid(*p, NULL, WNOHANG) == *p) {
            demo_reaped(*p);
            *p = 0;
            return -1;
        }
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* Send cmd to every child of a group, wait for every reply; max of the
 * first number each reply gives (its time), sums of the second and third. */
bool demo_round(child *cs, unsigned n, const char *cmd, double *wall, uint64_t *sum2,
                      uint64_t *sum3, uint64_t *sum4, char *err, size_t errcap)
{
    double t0 = cli_now();
    for (unsigned i = 0; i < n; i++) {
        fprintf(cs[i].in, "%s\n", cmd);
        fflush(cs[i].in);
    }
    bool ok = true;
    uint64_t s4 = 0;
    double tmax = -1;
    *sum2 = *sum3 = 0;
    for (unsigned i = 0; i < n; i++) {
        char line[1024];
        if (demo_child_line(&cs[i], line, sizeof line) < 0) {
            if (ok)
                snprintf(err, errcap, "%.250s", line);
            ok = false;
            continue;
        }
        double t;
        unsigned long long a = 0, b = 0, c = 0;
        if (sscanf(line, "OK %lf %llu %llu %llu", &t, &a, &b, &c) >= 2) {
            tmax = t > tmax ? t : tmax;
            *sum2 += a;
            *sum3 += b;
            s4 += c;
        }
    }
    if (sum4)
        *sum4 = s4;
    *wall = tmax >= 0 ? tmax : cli_now() - t0;
    return ok;
}

int demo_cluster_start(demo_group *g, uint64_t seg_bytes, const char *who)
{
    memset(g, 0, sizeof *g);
    snprintf(g->dir, sizeof g->dir, "%s/ferry-demo-XXXXXX", demo_tmp_dir());
    const char *ext = getenv("FERRY_MASTER");
    if (!getenv("FERRY_TOKEN") && !getenv("FERRY_TOKEN_FILE")) {
        char tok[65];
        ferry_token_generate(tok);
        setenv("FERRY_TOKEN", tok, 1);
    }
    if (demo_signals_start() < 0 || demo_mkdtemp(g->dir) < 0) {
        fprintf(stderr, "%s: cannot make a temp dir\n", who);
        return -1;
    }
    g->own = true;   /* the dir; the cluster only without FERRY_MASTER */
    if (ext && *ext) {
        snprintf(g->addr, sizeof g->addr, "%s", ext);
        return 0;
    }
    char mdir[160], f1[128], f2[128], seg[64], segsz[32];
    snprintf(mdir, sizeof mdir, "%s/master", g->dir);
    snprintf(f1, sizeof f1, "%s/addr", g->dir);
    snprintf(f2, sizeof f2, "%s/ready", g->dir);
    snprintf(segsz, sizeof segsz, "%llu", (unsigned long long)seg_bytes);
    const char *ma[] = { "ferry", "master", "--dir", mdir, "--addr-file", f1, NULL };
    g->master = spawn_quiet(ma);
    if (g->master <= 0 || wait_file(f1, &g->master, g->addr, sizeof g->addr) < 0) {
        fprintf(stderr, "%s: the master did not start\n", who);
        return -1;
    }
    const char *na[] = { "ferry", "node", "--master", g->addr, "--size", segsz,
                         "--ready-file", f2, NULL };
    g->node = spawn_quiet(na);
    if (g->node <= 0 || wait_file(f2, &g->node, seg, sizeof seg) < 0) {
        fprintf(stderr, "%s: the node did not start (%s bytes of memory)\n", who, segsz);
        return -1;
    }
    return 0;
}

#define PROGRESS_MS 2000   /* a progress call this often while the processes set up */

int demo_group_start(demo_group *g, const char *model, uint64_t budget, uint64_t model_bytes,
                     unsigned trainers, unsigned rollouts, unsigned dp, const char *who)
{
    /* two generations kept plus one being published */
    if (demo_cluster_start(g, model_bytes * 3 + (256ull << 20), who) < 0)
        return -1;
    char buf[32], dps[16];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)budget);
    snprintf(dps, sizeof dps, "%u", dp);
    g->ntr = trainers;
    g->nro = rollouts;
    for (unsigned k = 0; k < trainers + rollouts; k++) {
        bool t = k < trainers;
        unsigned r = t ? k : k - trainers;
        char rk[16], ws[16];
        snprintf(rk, sizeof rk, "%u", r);
        snprintf(ws, sizeof ws, "%u", t ? trainers : rollouts);
        const char *args[] = { "ferry-lab", "worker", t ? "trainer" : "rollout", g->addr, rk, ws,
                               model, buf, dps, NULL };
        child *c = t ? &g->tr[r] : &g->ro[r];
        if (demo_child_start(c, args) < 0) {
            fprintf(stderr, "%s: a %s did not start\n", who, t ? "trainer" : "rollout");
            return -1;
        }
    }
    /* every process started before any is waited for: their warm-ups
     * (READY's figures) run side by side; a progress line every few
     * seconds while they set up (allocating and touching their memory
     * takes tens of seconds on a VM) */
    for (unsigned k = 0; k < trainers + rollouts; k++) {
        bool t = k < trainers;
        child *c = t ? &g->tr[k] : &g->ro[k - trainers];
        char line[512] = "";
        struct pollfd pf = { .fd = c->out ? fileno(c->out) : -1, .events = POLLIN };
        while (pf.fd >= 0 && poll(&pf, 1, PROGRESS_MS) == 0)
            cli_progress_text("%s: %u of %u processes set up and warmed", who, k,
                              trainers + rollouts);
        if (demo_child_line(c, line, sizeof line) < 0) {
            fprintf(stderr, "%s: a %s did not start: %s\n", who, t ? "trainer" : "rollout", line);
            return -1;
        }
        double ws = 0;
        unsigned long long wb = 0;
        if (sscanf(line, "READY %lf %llu", &ws, &wb) == 2) {
            g->warm_s = ws > g->warm_s ? ws : g->warm_s;
            g->warm_bytes += wb;
        }
    }
    return 0;
}

void demo_group_stop(demo_group *g)
{
    for (unsigned k = 0; k < 64; k++) {
        demo_child_stop(&g->tr[k]);
        demo_child_stop(&g->ro[k]);
    }
    child_term(&g->node);
    child_term(&g->master);
    if (g->own) {
        demo_rmtree(g->dir);
        g->own = false;
    }
}

int demo_parse(const cli_cmd *c, int argc, char **argv, unsigned count, uint64_t bytes, demo_opts *o)
{
    *o = (demo_opts){ .trainers = 4, .rollouts = 4, .count = count, .bytes = bytes };
    snprintf(o->model, sizeof o->model, "qwen3-8b");
    int pr = cli_parse(c, argc, argv, o, NULL, NULL);
    if (pr != 0)
        return pr;
    if (o->dp == 0)
        o->dp = o->rollouts % 2 == 0 ? 2 : 1;   /* default: TP x DP2 when it divides */
    if (o->rollouts % o->dp) {
        fprintf(stderr, "ferry-lab: --rollouts %u is not a multiple of --dp %u\n", o->rollouts, o->dp);
        return -1;
    }
    return o->trainers && o->trainers <= 64 && o->rollouts && o->rollouts <= 64 &&
                   o->rollouts % o->dp == 0 && o->count && o->bytes >= (1u << 20) ? 0 : -1;
}
