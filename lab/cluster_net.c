/* The lab's network and its removal (cluster.h): namespaces, bridge, veth
 * pairs, TBF both ways, the undo list, and `cluster clean`. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"

/* TBF: the bucket holds 5 ms of the rate, at least 64 KiB (a GSO packet of
 * veth, which TBF would otherwise have to split) ; a packet waits at most
 * 50 ms in the queue (enough for a TCP window at these rates). */
#define TBF_BURST_MS 5
#define TBF_BURST_MIN (64u << 10)
#define TBF_LATENCY_MS 50

static volatile sig_atomic_t stop_flag;
static int stop_pipe[2] = { -1, -1 };

static void on_signal(int sig)
{
    (void)sig;
    int e = errno;
    stop_flag = 1;
    if (stop_pipe[1] >= 0 && write(stop_pipe[1], "x", 1) < 0) {
        /* the pipe is full: the flag is set, that is enough */
    }
    errno = e;
}

int lab_signals_install(void)
{
    if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    return 0;
}

bool lab_stopping(void) { return stop_flag != 0; }
int lab_stop_fd(void) { return stop_pipe[0]; }

int lab_sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof cmd)
        return -1;
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        signal(SIGINT, SIG_IGN);   /* a ^C reaches the lab, which tears down in order */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(p, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc != 0 && getenv("FERRY_LAB_VERBOSE"))
        fprintf(stderr, "ferry-lab cluster: '%s' exited %d\n", cmd, rc);
    return rc;
}

void lab_record(lab *L, enum lab_undo_kind kind, pid_t pid, const char *name)
{
    if (L->nundo >= LAB_MAX_UNDO)
        return;   /* cannot happen: LAB_MAX_HOSTS bounds what is made */
    lab_undo *u = &L->undo[L->nundo];
    memset(u, 0, sizeof *u);
    u->kind = kind;
    u->pid = pid;
    snprintf(u->name, sizeof u->name, "%s", name ? name : "");
    L->nundo++;
}

static int add_ns(lab *L, const char *ns)
{
    lab_record(L, LAB_UNDO_NETNS, 0, ns);
    if (lab_sh("ip netns add %s", ns) != 0) {
        fprintf(stderr, "ferry-lab cluster: cannot create the network namespace %s\n", ns);
        return -1;
    }
    return lab_sh("ip -n %s link set lo up", ns) == 0 ? 0 : -1;
}

static int shape(const char *ns, const char *dev, uint64_t rate)
{
    uint64_t burst = rate / 8 * TBF_BURST_MS / 1000;
    if (burst < TBF_BURST_MIN)
        burst = TBF_BURST_MIN;
    return lab_sh("tc -n %s qdisc add dev %s root tbf rate %llubit burst %llu latency %dms", ns,
                  dev, (unsigned long long)rate, (unsigned long long)burst, TBF_LATENCY_MS);
}

int lab_net_up(lab *L)
{
    char sw[64];
    snprintf(sw, sizeof sw, "%s-sw", L->prefix);
    if (add_ns(L, sw) < 0)
        return -1;
    if (lab_sh("ip -n %s link add br0 type bridge && ip -n %s addr add %s.254/24 dev br0 && "
               "ip -n %s link set br0 up", sw, sw, L->net, sw) != 0) {
        fprintf(stderr, "ferry-lab cluster: cannot make the bridge in %s\n", sw);
        return -1;
    }
    for (unsigned i = 0; i < L->hosts && !lab_stopping(); i++) {
        char ns[64];
        snprintf(ns, sizeof ns, "%s-h%u", L->prefix, i);
        if (add_ns(L, ns) < 0)
            return -1;
        /* made inside the two namespaces at once: no name ever exists in the root one */
        if (lab_sh("ip link add eth0 netns %s type veth peer name p%u netns %s", ns, i, sw) != 0 ||
            lab_sh("ip -n %s link set p%u master br0 && ip -n %s link set p%u up", sw, i, sw, i) != 0 ||
            lab_sh("ip -n %s addr add %s.%u/24 dev eth0 && ip -n %s link set eth0 up", ns, L->net,
                   i + 1, ns) != 0) {
            fprintf(stderr, "ferry-lab cluster: cannot link host %u (%s) to the switch\n", i, ns);
            return -1;
        }
        char dev[16];
        snprintf(dev, sizeof dev, "p%u", i);
        if (shape(ns, "eth0", lab_host_rate(L, i)) != 0 || shape(sw, dev, lab_host_rate(L, i)) != 0) {
            fprintf(stderr, "ferry-lab cluster: cannot shape host %u's link (tc tbf)\n", i);
            return -1;
        }
    }
    return lab_stopping() ? -1 : 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Every process inside ns killed (a command's children too, whatever group
 * they made): the namespace would outlive `ip netns del` while one runs. */
static void kill_ns_pids(const char *ns)
{
    for (int round = 0; round < 50; round++) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "ip netns pids %s 2>/dev/null", ns);
        FILE *f = popen(cmd, "r");
        if (!f)
            return;
        int n = 0, pid;
        while (fscanf(f, "%d", &pid) == 1)
            if (pid > 1 && pid != getpid()) {
                kill(pid, round < 10 ? SIGTERM : SIGKILL);
                n++;
            }
        pclose(f);
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (n == 0)
            return;
        sleep_ms(100);
    }
}

static void kill_group(pid_t pg)
{
    if (kill(-pg, SIGTERM) < 0 && errno == ESRCH) {
        waitpid(pg, NULL, WNOHANG);
        return;
    }
    for (int i = 0; i < 100; i++) {   /* 5 s for a clean exit, then SIGKILL */
        if (waitpid(pg, NULL, WNOHANG) == pg || (kill(-pg, 0) < 0 && errno == ESRCH))
            break;
        sleep_ms(50);
    }
    kill(-pg, SIGKILL);
    waitpid(pg, NULL, 0);
}

void lab_teardown(lab *L)
{
    /* the processes first, so that none holds a namespace or the dir */
    for (unsigned k = L->nundo; k-- > 0;)
        if (L->undo[k].kind == LAB_UNDO_PGRP && L->undo[k].pid > 0) {
            kill_group(L->undo[k].pid);
            L->undo[k].pid = 0;
        }
    for (unsigned k = L->nundo; k-- > 0;) {
        lab_undo *u = &L->undo[k];
        if (u->kind == LAB_UNDO_NETNS && u->name[0]) {
            kill_ns_pids(u->name);
            lab_sh("ip netns del %s 2>/dev/null", u->name);
        } else if (u->kind == LAB_UNDO_DIR && u->name[0]) {
            lab_sh("rm -rf '%s'", u->name);
        }
        u->name[0] = 0;
    }
    L->nundo = 0;
}

int lab_enter(const char *ns)
{
    char path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

/* A lab's owner is alive: its pid runs ferry-lab. */
static bool owner_alive(int pid)
{
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fgets(comm, sizeof comm, f) != NULL;
    fclose(f);
    return ok && !strncmp(comm, "ferry-lab", 9);
}

static const char *tmp_dir(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

int lab_clean(const char *prefix)
{
    int removed = 0;
    DIR *d = opendir("/var/run/netns");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid, n = 0;
        if (sscanf(e->d_name, "fl%d-%n", &pid, &n) != 1 || n == 0)
            continue;
        char p[24];
        snprintf(p, sizeof p, "fl%d", pid);
        if (prefix ? strcmp(p, prefix) != 0 : owner_alive(pid))
            continue;
        kill_ns_pids(e->d_name);
        if (lab_sh("ip netns del %s 2>/dev/null", e->d_name) == 0) {
            printf("removed namespace %s\n", e->d_name);
            removed++;
        }
    }
    if (d)
        closedir(d);
    d = opendir(tmp_dir());
    while (d && (e = readdir(d))) {
        int pid, n = 0;
        if (sscanf(e->d_name, "ferry-cluster-fl%d-%n", &pid, &n) != 1 || n == 0)
            continue;
        char p[24];
        snprintf(p, sizeof p, "fl%d", pid);
        if (prefix ? strcmp(p, prefix) != 0 : owner_alive(pid))
            continue;
        if (lab_sh("rm -rf '%s/%s'", tmp_dir(), e->d_name) == 0) {
            printf("removed %s/%s\n", tmp_dir(), e->d_name);
            removed++;
        }
    }
    if (d)
        closedir(d);
    printf("%d leftover%s removed\n", removed, removed == 1 ? "" : "s");
    return 0;
}
