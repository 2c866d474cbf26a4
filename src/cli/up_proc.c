/* Processes of `ferry up` / `ferry down`: who a pid is (its start time and
 * command line, so that a pid the kernel gave to another process since is
 * never signalled), stopping one through a pidfd, and why one ended. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

int cli_proc_read(int pid, cli_proc *p)
{
    memset(p, 0, sizeof *p);
    p->pid = pid;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
     * count the fields after its last ')'; starttime is field 22. */
    char *q = strrchr(buf, ')');
    if (!q)
        return -1;
    q++;
    for (int field = 3; field < 22 && q; field++)
        q = strchr(q + 1, ' ');
    if (!q || sscanf(q, " %llu", &p->start) != 1)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, p->cmd, sizeof p->cmd);
    close(fd);
    p->cmdlen = n > 0 ? (size_t)n : 0;   /* empty: a zombie, or a kernel thread */
    return 0;
}

bool cli_proc_same(const cli_proc *a, const cli_proc *b)
{
    return a->pid == b->pid && a->start == b->start && a->cmdlen == b->cmdlen &&
           memcmp(a->cmd, b->cmd, a->cmdlen) == 0;
}

const char *cli_proc_show(const cli_proc *p, char *buf, size_t cap)
{
    size_t n = p->cmdlen < cap - 1 ? p->cmdlen : cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p->cmd[i];
        buf[i] = c == 0 ? ' ' : c < 32 || c == 127 ? '?' : (char)c;
    }
    while (n > 0 && buf[n - 1] == ' ')
        n--;
    buf[n] = 0;
    if (!n)
        snprintf(buf, cap, "(no command line)");
    return buf;
}

/* ---- stopping -------------------------------------------------------------------------- */

int cli_proc_open(int pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    /* Headers without pidfd_open: no pidfd, and the caller signals by PID
     * after checking the process's start time and command line (send_sig). */
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

static int send_sig(int pidfd, int pid, int sig)
{
#ifdef SYS_pidfd_send_signal
    if (pidfd >= 0)
        return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
#endif
    return kill(pid, sig);
}

/* Whether the process is gone within secs: the pidfd turns readable when it
 * exits; without one, kill(pid, 0) stops finding it. */
static bool gone_within(int pidfd, int pid, double secs)
{
    double end = cli_now() + secs;
    for (;;) {
        double left = end - cli_now();
        if (pidfd >= 0) {
            struct pollfd pf = { .fd = pidfd, .events = POLLIN };
            int r = poll(&pf, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
            if (r > 0)
                return true;
            if (r < 0 && errno != EINTR)
                return false;
        } else {
            if (kill(pid, 0) != 0 && errno == ESRCH)
                return true;
            struct timespec ts = { 0, 20 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        if (left <= 0)
            return false;
    }
}

int cli_proc_stop(int pidfd, int pid)
{
    if (send_sig(pidfd, pid, SIGTERM) != 0)
        return errno == ESRCH ? 0 : -1;
    if (gone_within(pidfd, pid, 10))
        return 0;
    if (send_sig(pidfd, pid, SIGKILL) != 0)
        return errno == ESRCH ? 0 : -1;
    return gone_within(pidfd, pid, 10) ? 0 : -1;
}

/* ---- why a process ended ------------------------------------------------------------------ */

uint64_t cli_oom_kills(void)
{
    FILE *f = fopen("/proc/vmstat", "r");
    char line[128];
    unsigned long long n = 0;
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = sscanf(line, "oom_kill %llu", &n) == 1;
    if (f)
        fclose(f);
    return n;
}

void cli_exit_reason(int status, uint64_t oom_before, const char *when, char *buf, size_t cap)
{
    if (WIFEXITED(status)) {
        snprintf(buf, cap, "exited with status %d%s", WEXITSTATUS(status), when);
        return;
    }
    if (!WIFSIGNALED(status)) {
        snprintf(buf, cap, "ended%s (wait status %#x)", when, (unsigned)status);
        return;
    }
    int sig = WTERMSIG(status);
    const char *abbrev = sigabbrev_np(sig);
    const char *why = "";
    if (sig == SIGKILL)
        why = cli_oom_kills() > oom_before ? " (the kernel's OOM killer ran meanwhile: out of memory)"
                                           : " (out of memory?)";
    snprintf(buf, cap, "was killed by SIG%s%s%s", abbrev ? abbrev : "?", when, why);
}

void cli_print_log_tail(FILE *out, const char *path, int lines)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(out, "  (%s cannot be read)\n", path);
        return;
    }
    /* keep the last `lines` lines, each cut to 300 characters */
    enum { MAXL = 16, W = 301 };
    char ring[MAXL][W];
    int n = 0;
    if (lines > MAXL)
        lines = MAXL;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        snprintf(ring[n % lines], W, "%.300s", line);
        n++;
    }
    fclose(f);
    if (n == 0) {
        fprintf(out, "  (%s is empty)\n", path);
        return;
    }
    fprintf(out, "  the end of %s:\n", path);
    for (int i = n > lines ? n - lines : 0; i < n; i++)
        fprintf(out, "    %s\n", ring[i % lines]);
}
