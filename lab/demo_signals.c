/* SIGINT and SIGTERM during a demo (or a benchmark on the demo's cluster):
 * every child process it started is killed and every temporary directory
 * it made is removed before the process ends by that signal.
 *
 * A signal can arrive while the main flow blocks anywhere (a child's reply
 * on a pipe, a waitpid), so it is not handled there: demo_signals_start
 * blocks both signals in every thread and one thread waits for them with
 * sigwait, then does the cleanup in ordinary thread context. Signals are
 * process-wide, so this is one static registry (children and directories)
 * behind a mutex; children are tracked through pidfds, so a child that was
 * reaped meanwhile and whose pid went to another process is never hit.
 *
 * SIGKILL cannot be handled: a demo killed so leaves its directories. Each
 * one holds the owner's pid and start time (OWNER_FILE), and the next demo
 * or benchmark, before it makes its own, removes every directory of these
 * names whose owner is gone (demo_sweep_stale). */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lab.h"
#include "demo.h"

#define KIDS_MAX 512
#define DIRS_MAX 8
#define OWNER_FILE ".ferry-owner"   /* "<pid> <start time>" of the process that made the dir */
static const char *const tmp_prefixes[] = { "ferry-demo-", "ferry-counters-" };

static _Atomic bool g_interrupted;   /* read without the mutex by demo_stopping */

static struct {
    pthread_mutex_t mu;
    bool started, stopping;
    struct { pid_t pid; int fd; } kid[KIDS_MAX];
    size_t nkid;
    char dir[DIRS_MAX][128];
    sigset_t set;
} g_sig = { .mu = PTHREAD_MUTEX_INITIALIZER };

static int pidfd_of(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    return -1;
#endif
}

static void kill_kid(int fd, pid_t pid)
{
#ifdef SYS_pidfd_send_signal
    if (fd >= 0) {
        (void)syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0);
        return;
    }
#endif
    kill(pid, SIGKILL);
}

/* Until the child has exited (its pidfd turns readable), 10 s at most. */
static void await_kid(int fd, pid_t pid)
{
    for (int i = 0; i < 500; i++) {
        if (fd >= 0) {
            struct pollfd p = { .fd = fd, .events = POLLIN };
            if (poll(&p, 1, 20) != 0)
                return;
        } else {
            if (kill(pid, 0) != 0 && errno == ESRCH)
                return;
            struct timespec ts = { 0, 20 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
    }
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if ((flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT)
        fprintf(stderr, "ferry-lab: cannot remove %s: %s\n", path, strerror(errno));
    return 0;
}

/* Remove dir and everything in it; forget it. Called with mu held. */
static void rmtree_locked(const char *dir)
{
    (void)nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    for (size_t i = 0; i < DIRS_MAX; i++)
        if (!strcmp(g_sig.dir[i], dir))
            g_sig.dir[i][0] = 0;
}

static void *watch_main(void *arg)
{
    (void)arg;
    int sig = 0;
    if (sigwait(&g_sig.set, &sig) != 0)
        return NULL;
    pthread_mutex_lock(&g_sig.mu);   /* held to the end: nothing new starts */
    g_sig.stopping = true;
    g_interrupted = true;
    for (size_t i = 0; i < g_sig.nkid; i++)
        kill_kid(g_sig.kid[i].fd, g_sig.kid[i].pid);
    for (size_t i = 0; i < g_sig.nkid; i++)
        await_kid(g_sig.kid[i].fd, g_sig.kid[i].pid);
    char removed[DIRS_MAX * 130] = "";
    for (size_t i = 0; i < DIRS_MAX; i++) {
        if (!g_sig.dir[i][0])
            continue;
        size_t len = strlen(removed);
        snprintf(removed + len, sizeof removed - len, "%s%s", len ? ", " : "", g_sig.dir[i]);
        char d[128];
        snprintf(d, sizeof d, "%s", g_sig.dir[i]);
        rmtree_locked(d);
    }
    fprintf(stderr, "\nferry: SIG%s: stopped %zu child processes%s%s\n", sigabbrev_np(sig),
            g_sig.nkid, removed[0] ? ", removed " : "", removed);
    /* end by the signal itself, so that the caller sees how we ended */
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    _exit(128 + sig);
}

bool demo_stopping(void)
{
    return g_interrupted;
}

int demo_signals_start(void)
{
    pthread_mutex_lock(&g_sig.mu);
    int rc = 0;
    if (!g_sig.started) {
        sigemptyset(&g_sig.set);
        sigaddset(&g_sig.set, SIGINT);
        sigaddset(&g_sig.set, SIGTERM);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        rc = pthread_sigmask(SIG_BLOCK, &g_sig.set, NULL);
        if (rc == 0)
            rc = pthread_create(&t, &at, watch_main, NULL);
        pthread_attr_destroy(&at);
        g_sig.started = rc == 0;
        if (rc != 0)
            pthread_sigmask(SIG_UNBLOCK, &g_sig.set, NULL);
    }
    pthread_mutex_unlock(&g_sig.mu);
    return rc == 0 ? 0 : -1;
}

pid_t demo_fork(void)
{
    pthread_mutex_lock(&g_sig.mu);
    if (g_sig.stopping || g_sig.nkid == KIDS_MAX) {
        pthread_mutex_unlock(&g_sig.mu);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* the child: it must not start with the parent's signals blocked
         * (exec keeps the mask); it never touches the mutex again */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        return 0;
    }
    if (pid > 0) {
        g_sig.kid[g_sig.nkid].pid = pid;
        g_sig.kid[g_sig.nkid++].fd = pidfd_of(pid);
    }
    pthread_mutex_unlock(&g_sig.mu);
    return pid;
}

void demo_reaped(pid_t pid)
{
    pthread_mutex_lock(&g_sig.mu);
    for (size_t i = 0; i < g_sig.nkid; i++)
        if (g_sig.kid[i].pid == pid) {
            if (g_sig.kid[i].fd >= 0)
                close(g_sig.kid[i].fd);
            g_sig.kid[i] = g_sig.kid[--g_sig.nkid];
            break;
        }
    pthread_mutex_unlock(&g_sig.mu);
}

/* Write dir's owner (this process). */
static void own(const char *dir)
{
    cli_proc me;
    char path[256];
    snprintf(path, sizeof path, "%s/" OWNER_FILE, dir);
    FILE *f = cli_proc_read((int)getpid(), &me) == 0 ? fopen(path, "w") : NULL;
    if (f) {
        fprintf(f, "%d %llu\n", (int)getpid(), me.start);
        fclose(f);
    }
}

/* Is the owner recorded in dir gone? false when it cannot tell (no owner
 * file yet: a directory being made, or one of an older ferry). */
static bool owner_gone(const char *dir)
{
    char path[256];
    snprintf(path, sizeof path, "%s/" OWNER_FILE, dir);
    FILE *f = fopen(path, "r");
    int pid = 0;
    unsigned long long start = 0;
    bool read = f && fscanf(f, "%d %llu", &pid, &start) == 2 && pid > 0;
    if (f)
        fclose(f);
    if (!read)
        return false;
    cli_proc p;
    return cli_proc_read(pid, &p) < 0 || p.start != start;
}

const char *demo_tmp_dir(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] == '/' && strlen(t) <= 32 ? t : "/tmp";
}

int demo_sweep_stale(void)
{
    const char *tmp = demo_tmp_dir();
    DIR *d = opendir(tmp);
    int removed = 0;
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        bool ours = false;
        for (size_t i = 0; i < sizeof tmp_prefixes / sizeof *tmp_prefixes; i++)
            ours |= !strncmp(de->d_name, tmp_prefixes[i], strlen(tmp_prefixes[i]));
        char path[256];
        if (!ours || snprintf(path, sizeof path, "%s/%s", tmp, de->d_name) >= (int)sizeof path ||
            !owner_gone(path))
            continue;
        (void)nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        removed++;
    }
    closedir(d);
    return removed;
}

int demo_mkdtemp(char *tmpl)
{
    static _Atomic bool swept;
    if (!atomic_exchange(&swept, true))
        (void)demo_sweep_stale();   /* what demos killed with SIGKILL left */
    pthread_mutex_lock(&g_sig.mu);
    int rc = -1;
    size_t slot = DIRS_MAX;
    for (size_t i = 0; i < DIRS_MAX && slot == DIRS_MAX; i++)
        if (!g_sig.dir[i][0])
            slot = i;
    if (!g_sig.stopping && slot < DIRS_MAX && strlen(tmpl) < sizeof g_sig.dir[0] && mkdtemp(tmpl)) {
        snprintf(g_sig.dir[slot], sizeof g_sig.dir[slot], "%s", tmpl);
        own(tmpl);
        rc = 0;
    }
    pthread_mutex_unlock(&g_sig.mu);
    return rc;
}

void demo_rmtree(const char *dir)
{
    pthread_mutex_lock(&g_sig.mu);
    rmtree_locked(dir);
    pthread_mutex_unlock(&g_sig.mu);
}
