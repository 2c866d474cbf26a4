/* `ferry up`, `ferry down`, `ferry status`: a local cluster (one master and
 * one node on this machine) for examples, tests and development.
 *
 * State directory (--dir, default $FERRY_HOME, else ~/.ferry):
 *   token         the cluster token (generated once, mode 0600)
 *   master/       the master's log and snapshots
 *   master.addr   HOST:PORT of the running master
 *   node.ready    the node's segment id once mounted
 *   up.lock       held (flock) by `ferry up` and inherited by its master and
 *                 node: while any of them runs, another `ferry up` on the
 *                 directory is refused before it changes anything
 *   up.pids       master and node of a detached cluster: pid, start time and
 *                 command line each, so `ferry down` signals only them
 *   master.log, node.log   output of a detached cluster
 *   master.metrics, node.metrics   their metrics URLs (with --metrics) */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opts.h"
#include "up.h"

volatile sig_atomic_t up_stop;

static void on_signal(int sig)
{
    (void)sig;
    up_stop = 1;
}

static void default_dir(char *out, size_t cap)
{
    const char *h = getenv("FERRY_HOME");
    if (h && *h)
        snprintf(out, cap, "%s", h);
    else
        snprintf(out, cap, "%s/.ferry", getenv("HOME") ? getenv("HOME") : ".");
}

/* The options of up, down and status, each command's own table. */
#define DIR_DEFAULT "(default $FERRY_HOME, else ~/.ferry)"
static const cli_opt up_table[] = {
    CLI_STR(up_opts, dir, "dir", "DIR", "state directory; a token is generated there once\n" DIR_DEFAULT),
    CLI_SIZE(up_opts, size, "size", "SIZE", 1u << 20, UINT64_MAX, "the node's segment: 64M, 4G, ... (default 1G)"),
    CLI_STR(up_opts, listen, "listen", "HOST:PORT", "the master's address (default 127.0.0.1:0: any free port)"),
    CLI_FLAG(up_opts, detach, "detach",
             "return at once and leave both running for `ferry down`\n(default: stay in the foreground)"),
    CLI_FLAG(up_opts, metrics, "metrics",
             "the master and the node serve Prometheus metrics on free\n"
             "loopback ports; their URLs are printed and kept in\n"
             "DIR/master.metrics and DIR/node.metrics (default: off)"),
    CLI_FLAG(up_opts, ha, "ha",
             "replicated masters to try failover on one machine: a local\n"
             "etcd and two masters (one leads, one follows), kept in\n"
             "DIR/ha and removed when they stop; a killed master is\n"
             "started again as a standby (foreground only; default: one\n"
             "master with its log in DIR/master)"),
    CLI_UINT(up_opts, ha_ttl, "ha-ttl", "S", 1, 3600,
             "with --ha: the leader's etcd lease, what a failover takes\n(default 2)"),
};
static const cli_cmd up_cmd = {
    .name = "up",
    .about = "Start a master and a node on this machine and print the line that points clients\n"
             "at it. It stays in the foreground; Ctrl-C stops both. A --size above the memory\n"
             "this machine (and its cgroup) has available is refused before anything starts,\n"
             "and so is a second `ferry up` on a DIR whose cluster runs.",
    .opts = up_table,
    .nopts = sizeof up_table / sizeof up_table[0],
};

static const cli_opt down_table[] = {
    CLI_STR(up_opts, dir, "dir", "DIR", "the state directory of `ferry up` " DIR_DEFAULT),
};
static const cli_cmd down_cmd = {
    .name = "down",
    .about = "Stop the master and the node that `ferry up --detach` started in DIR. A recorded\n"
             "pid that now belongs to another process (same pid, other start time or command\n"
             "line) is left alone.",
    .opts = down_table,
    .nopts = sizeof down_table / sizeof down_table[0],
};

static const cli_opt status_table[] = {
    CLI_STR(up_opts, dir, "dir", "DIR", "the state directory of `ferry up`: its master.addr and\ntoken " DIR_DEFAULT),
    CLI_STR(up_opts, master, "master", "HOST:PORT", "this master instead (default: DIR/master.addr)"),
    CLI_FLAG(up_opts, json, "json", "the master's status as one JSON object (default: a table)"),
};
static const cli_cmd status_cmd = {
    .name = "status",
    .forms = "[--dir DIR | --master HOST:PORT] [--json]",
    .about = "Segments (size, used, objects, attached), nodes (id, state, when last heard),\n"
             "clients, objects and the KV revision of the running master.",
    .opts = status_table,
    .nopts = sizeof status_table / sizeof status_table[0],
};

/* The defaults, then the command's options: 0, or the exit status and
 * *run false (0 after --help, 2 on a usage error). */
static int parse(const cli_cmd *c, int argc, char **argv, up_opts *o, bool *run)
{
    memset(o, 0, sizeof *o);
    default_dir(o->dir, sizeof o->dir);
    snprintf(o->listen, sizeof o->listen, "127.0.0.1:0");
    o->size = 1ull << 30;
    o->ha_ttl = 2;
    int pr = cli_parse(c, argc, argv, o, NULL, NULL);
    *run = pr == 0;
    return pr == 0 ? 0 : cli_cmd_usage_exit(pr, c);
}

int up_read_small(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r'))
        out[--n] = '\0';
    return n > 0 ? 0 : -1;
}

static int ensure_token(const char *dir, char *path, size_t cap)
{
    snprintf(path, cap, "%s/token", dir);
    if (access(path, R_OK) == 0)
        return 0;
    char t[66];
    ferry_token_generate(t);
    strcat(t, "\n");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, t, strlen(t));
    close(fd);
    return w == (ssize_t)strlen(t) ? 0 : -1;
}

/* ---- starting and stopping ------------------------------------------------------------------- */

/* Start `ferry ARGS...`; it inherits keep_fd (the directory's lock). A
 * detached child gets its own session and writes to log (so that nothing
 * holds our caller's terminal or pipes open). */
pid_t up_spawn_exe(const char *exe, const char *const *args, bool detach, const char *log,
                   int keep_fd)
{
    pid_t p = fork();
    if (p == 0) {
        if (detach) {
            setsid();
            int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
            int out = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
            if (in < 0 || out < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
                _exit(127);
        }
        if (keep_fd >= 0 && fcntl(keep_fd, F_SETFD, 0) < 0)
            _exit(127);
        execvp(exe, (char *const *)args);
        _exit(127);
    }
    return p;
}

pid_t up_spawn(const char *const *args, bool detach, const char *log, int keep_fd)
{
    return up_spawn_exe("/proc/self/exe", args, detach, log, keep_fd);
}

/* Wait for a file to appear (the child writes it once ready) or the child
 * to exit; deadline in seconds. 0: ready; 1: the child exited (*status,
 * reaped); -1: neither within the deadline. */
int up_wait_file(const char *path, pid_t child, double secs, char *out, size_t cap,
                 int *status)
{
    double end = cli_now() + secs;
    while (cli_now() < end) {
        if (up_read_small(path, out, cap) == 0)
            return 0;
        if (up_stop)
            return 2;   /* SIGINT/SIGTERM while starting */
        if (waitpid(child, status, WNOHANG) == child)
            return 1;
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return -1;
}

void up_stop_child(pid_t p)
{
    if (p <= 0)
        return;
    kill(p, SIGTERM);
    for (int i = 0; i < 500; i++) {
        if (waitpid(p, NULL, WNOHANG) == p || (kill(p, 0) != 0 && errno == ESRCH))
            return;
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
}

/* Why a child did not come up, with what its log says when it has one. */
void up_explain_start(const char *who, int w, int status, uint64_t oom0, double secs,
                      bool detach, const char *log)
{
    char why[160];
    if (w == 1) {
        cli_exit_reason(status, oom0, " at start", why, sizeof why);
        fprintf(stderr, "ferry up: the %s %s; nothing is left running\n", who, why);
    } else {
        fprintf(stderr, "ferry up: the %s was not ready after %.0f s; stopped, nothing is left "
                "running\n", who, secs);
    }
    if (detach)
        cli_print_log_tail(stderr, log, 8);
    else
        fprintf(stderr, "  (its own messages, if any, are above)\n");
}

void up_node_name(const char *dir, char *out, size_t cap)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = dir; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    snprintf(out, cap, "up-%016llx", (unsigned long long)h);
}

/* --size against what the machine (and its cgroup) can give now. */
static int check_size(const up_opts *o)
{
    cli_mem m;
    if (cli_mem_probe("/proc", "/sys/fs/cgroup", &m) < 0 || o->size <= cli_mem_headroom(&m))
        return 0;
    char a[32], b[32] = "unknown", c[32], d[32], e[32];
    cli_fmt_size(o->size, a, sizeof a);
    if (m.avail != UINT64_MAX)
        cli_fmt_size(m.avail, b, sizeof b);
    if (m.cg)
        fprintf(stderr, "ferry up: --size %s is more than this machine can give a node now: "
                "MemAvailable is %s, and the cgroup limit of %s (%s) has %s in use, leaving %s. "
                "Nothing was started; choose a smaller --size.\n", a, b,
                cli_fmt_size(m.cg_limit, c, sizeof c), m.cg_file,
                cli_fmt_size(m.cg_used, d, sizeof d),
                cli_fmt_size(m.cg_limit - m.cg_used, e, sizeof e));
    else
        fprintf(stderr, "ferry up: --size %s is more than this machine can give a node now: "
                "MemAvailable is %s (/proc/meminfo) and no cgroup memory limit applies. "
                "Nothing was started; choose a smaller --size.\n", a, b);
    return -1;
}

/* Why DIR/up.lock is held: the detached cluster of up.pids, or another up. */
static void explain_running(const char *dir, const char *pidf, const char *addrf)
{
    cli_pidrec r[2];
    cli_proc now;
    char addr[128] = "";
    (void)up_read_small(addrf, addr, sizeof addr);
    if (cli_pids_read(pidf, r) == 0 && cli_pids_check(&r[0], dir, &now) == CLI_P_OURS)
        fprintf(stderr, "ferry up: a cluster started with --detach runs in %s already (master "
                "%s, pid %d; node pid %d); nothing was changed. `ferry down --dir %s` stops "
                "it.\n", dir, addr[0] ? addr : "?", r[0].p.pid, r[1].p.pid, dir);
    else
        fprintf(stderr, "ferry up: another `ferry up` holds %s/up.lock (one in the foreground, "
                "or the master or node of one that was killed%s%s); nothing was changed.\n",
                dir, addr[0] ? ": master " : "", addr);
}

/* Take DIR/up.lock: its fd, -2 when it is held, -1 on an error. */
static int take_lock(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/up.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        return fd;
    int e = errno;
    close(fd);
    errno = e;
    return e == EWOULDBLOCK ? -2 : -1;
}

/* A cluster recorded in up.pids still running (one started before up.lock
 * existed): refuse. A stale record goes. */
static int check_old_pids(const char *dir, const char *pidf, const char *addrf)
{
    cli_pidrec r[2];
    if (cli_pids_read(pidf, r) < 0) {
        (void)remove(pidf);
        return 0;
    }
    cli_proc now;
    for (int k = 0; k < 2; k++)
        if (cli_pids_check(&r[k], dir, &now) == CLI_P_OURS) {
            explain_running(dir, pidf, addrf);
            return -1;
        }
    fprintf(stderr, "ferry up: removed a stale %s (its processes are gone)\n", pidf);
    (void)remove(pidf);
    return 0;
}

int cmd_up(int argc, char **argv)
{
    up_opts o;
    bool run;
    int pst = parse(&up_cmd, argc, argv, &o, &run);
    if (!run)
        return pst;
    if (o.ha && o.detach) {
        fprintf(stderr, "ferry up: --ha runs in the foreground (Ctrl-C stops the etcd, the masters "
                "and the node it started); --detach is for the single master\n");
        return 2;
    }
    if (check_size(&o) < 0)
        return 1;
    char tok[4200], mdir[4200], addrf[4200], readyf[4200], pidf[4200], addr[128], seg[64];
    char mmf[4200], nmf[4200], murl[128] = "", nurl[128] = "";
    char sizes[32];
    snprintf(mdir, sizeof mdir, "%s/master", o.dir);
    snprintf(addrf, sizeof addrf, "%s/master.addr", o.dir);
    snprintf(readyf, sizeof readyf, "%s/node.ready", o.dir);
    snprintf(pidf, sizeof pidf, "%s/up.pids", o.dir);
    snprintf(mmf, sizeof mmf, "%s/master.metrics", o.dir);
    snprintf(nmf, sizeof nmf, "%s/node.metrics", o.dir);
    if (mkdir(o.dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "ferry up: cannot make %s: %s\n", o.dir, strerror(errno));
        return 1;
    }
    int lock = take_lock(o.dir);
    if (lock == -2) {
        explain_running(o.dir, pidf, addrf);
        return 1;
    }
    if (lock < 0) {
        fprintf(stderr, "ferry up: cannot lock %s/up.lock: %s\n", o.dir, strerror(errno));
        return 1;
    }
    if (check_old_pids(o.dir, pidf, addrf) < 0) {
        close(lock);
        return 1;
    }
    if (ensure_token(o.dir, tok, sizeof tok) < 0) {
        fprintf(stderr, "ferry up: cannot write the token %s: %s\n", tok, strerror(errno));
        close(lock);
        return 1;
    }
    remove(addrf);
    remove(readyf);
    remove(mmf);
    remove(nmf);
    struct sigaction sa = {0};
    if (o.ha) {
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        return up_ha(&o, lock, tok);
    }
    snprintf(sizes, sizeof sizes, "%llu", (unsigned long long)o.size);
    /* The metrics file is written after the address file: waiting for it
     * last waits for both. */
    const char *margs[] = { "ferry", "master", "--dir", mdir, "--listen", o.listen,
                            "--token-file", tok, "--addr-file", addrf,
                            o.metrics ? "--metrics" : NULL, "127.0.0.1:0", "--metrics-file", mmf,
                            NULL };
    char mlog[4200], nlog[4200];
    snprintf(mlog, sizeof mlog, "%s/master.log", o.dir);
    snprintf(nlog, sizeof nlog, "%s/node.log", o.dir);
    uint64_t oom0 = cli_oom_kills();
    int st = 0;
    /* From before the first child: a SIGTERM or SIGINT while the cluster
     * starts stops what was started (the default action would leave the
     * children running, orphaned). */
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    pid_t mp = up_spawn(margs, o.detach, mlog, lock);
    int w = mp < 0 ? 1 : up_wait_file(addrf, mp, 15, addr, sizeof addr, &st);
    if (w == 0 && o.metrics)
        w = up_wait_file(mmf, mp, 15, murl, sizeof murl, &st);
    if (w == 2) {
        up_stop_child(mp);
        remove(addrf);
        fprintf(stderr, "ferry up: stopped by a signal while starting; nothing is left running\n");
        return 0;
    }
    if (w != 0) {
        up_explain_start("master", w, st, oom0, 15, o.detach, mlog);
        if (w < 0)
            up_stop_child(mp);
        return 1;
    }
    /* The node's name follows the directory, so a node restarted by a
     * later `ferry up --dir` is known as a new incarnation of this one and
     * the old one's objects are declared lost at once (docs/store.md). */
    char name[32];
    up_node_name(o.dir, name, sizeof name);
    const char *nargs[] = { "ferry", "node", "--master", addr, "--size", sizes, "--name", name,
                            "--token-file", tok, "--ready-file", readyf,
                            o.metrics ? "--metrics" : NULL, "127.0.0.1:0", "--metrics-file", nmf,
                            NULL };
    pid_t np = up_spawn(nargs, o.detach, nlog, lock);
    w = np < 0 ? 1 : up_wait_file(readyf, np, 60, seg, sizeof seg, &st);
    if (w == 2) {
        up_stop_child(np);
        up_stop_child(mp);
        remove(addrf);
        remove(readyf);
        fprintf(stderr, "ferry up: stopped by a signal while starting; nothing is left running\n");
        return 0;
    }
    if (w != 0) {
        up_explain_start("node", w, st, oom0, 60, o.detach, nlog);
        if (w < 0)
            up_stop_child(np);
        up_stop_child(mp);
        remove(addrf);
        return 1;
    }
    uint64_t segid = 0;   /* node.ready holds it in decimal; shown as every id is */
    (void)cli_parse_uint(seg, &segid);
    printf("ferry up: master at %s, node segment %016llx (%s), state in %s\n", addr,
           (unsigned long long)segid,
           cli_fmt_size(o.size, sizes, sizeof sizes), o.dir);
    if (o.metrics && up_read_small(nmf, nurl, sizeof nurl) == 0)   /* written before node.ready */
        printf("ferry up: metrics at %s (master) and %s (node)\n", murl, nurl);
    printf("export FERRY_MASTER=%s FERRY_TOKEN_FILE=%s\n", addr, tok);
    fflush(stdout);
    if (o.detach) {
        cli_proc pm, pn;
        if (cli_proc_read(mp, &pm) < 0 || cli_proc_read(np, &pn) < 0 ||
            cli_pids_write(pidf, &pm, &pn) != 0) {
            fprintf(stderr, "ferry up: cannot write %s; stopping\n", pidf);
            up_stop_child(np);
            up_stop_child(mp);
            return 1;
        }
        return 0;
    }
    int rc = 0;
    while (!up_stop) {
        pid_t p = waitpid(-1, &st, 0);
        if (p == mp || p == np) {
            char why[160];
            cli_exit_reason(st, oom0, "", why, sizeof why);
            fprintf(stderr, "ferry up: the %s %s; stopping\n", p == mp ? "master" : "node", why);
            if (p == mp)
                mp = -1;
            else
                np = -1;
            rc = 1;
            break;
        }
    }
    up_stop_child(np);
    up_stop_child(mp);
    remove(addrf);
    remove(readyf);
    remove(mmf);
    remove(nmf);
    return rc;
}

int cmd_down(int argc, char **argv)
{
    up_opts o;
    bool run;
    int pst = parse(&down_cmd, argc, argv, &o, &run);
    if (!run)
        return pst;
    char pidf[4200], f[4200];
    snprintf(pidf, sizeof pidf, "%s/up.pids", o.dir);
    cli_pidrec r[2];
    if (cli_pids_read(pidf, r) != 0) {
        fprintf(stderr, "ferry down: no detached cluster in %s\n", o.dir);
        return 1;
    }
    int stopped = 0, failed = 0, which = 0;
    for (int k = 1; k >= 0; k--) {   /* the node first: it unmounts from a live master */
        cli_proc now;
        int fd = r[k].p.pid > 0 ? cli_proc_open(r[k].p.pid) : -1;
        int st = fd < 0 && errno == ESRCH ? CLI_P_GONE : cli_pids_check(&r[k], o.dir, &now);
        char shown[200];
        if (st == CLI_P_OURS && cli_proc_stop(fd, r[k].p.pid) == 0) {
            stopped++;
            which = k;
        } else if (st == CLI_P_OURS) {
            fprintf(stderr, "ferry down: the %s (pid %d) did not stop\n", r[k].role, r[k].p.pid);
            failed++;
        } else if (st == CLI_P_GONE) {
            fprintf(stderr, "ferry down: the %s (pid %d) was not running any more\n", r[k].role,
                    r[k].p.pid);
        } else {
            fprintf(stderr, "ferry down: pid %d is not the %s that `ferry up` started in %s any "
                    "more (it is now `%s`); left alone\n", r[k].p.pid, r[k].role, o.dir,
                    cli_proc_show(&now, shown, sizeof shown));
        }
        if (fd >= 0)
            close(fd);
    }
    if (failed)
        return 1;
    remove(pidf);
    snprintf(f, sizeof f, "%s/master.addr", o.dir);
    remove(f);
    snprintf(f, sizeof f, "%s/node.ready", o.dir);
    remove(f);
    snprintf(f, sizeof f, "%s/master.metrics", o.dir);
    remove(f);
    snprintf(f, sizeof f, "%s/node.metrics", o.dir);
    remove(f);
    if (stopped == 2) {
        printf("ferry down: stopped the master (pid %d) and the node (pid %d)\n", r[0].p.pid,
               r[1].p.pid);
        return 0;
    }
    if (stopped == 1) {
        printf("ferry down: stopped the %s (pid %d)\n", r[which].role, r[which].p.pid);
        return 0;
    }
    fprintf(stderr, "ferry down: no cluster of %s was running; its stale up.pids is removed\n",
            o.dir);
    return 1;
}

static void print_status(json_t *j)
{
    char a[32], b[32];
    printf("master %s (instance %s)\n", json_string_value(json_object_get(j, "address")),
           json_string_value(json_object_get(j, "instance")) ?
           json_string_value(json_object_get(j, "instance")) : "?");
    printf("%-18s %-18s %10s %10s %8s %s\n", "segment", "node", "size", "used", "objects",
           "attached");
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(j, "segments"), i, s) {
        printf("%016llx   %016llx   %10s %10s %8lld %s\n",
               (unsigned long long)json_integer_value(json_object_get(s, "id")),
               (unsigned long long)json_integer_value(json_object_get(s, "node")),
               cli_fmt_size((uint64_t)json_integer_value(json_object_get(s, "size")), a, sizeof a),
               cli_fmt_size((uint64_t)json_integer_value(json_object_get(s, "used")), b, sizeof b),
               (long long)json_integer_value(json_object_get(s, "objects")),
               json_is_true(json_object_get(s, "attached")) ? "yes" : "no");
    }
    json_t *nodes = json_object_get(j, "nodes");
    if (json_array_size(nodes) > 0)
        printf("%-18s %-8s %-10s %s\n", "node", "state", "heard", "name");
    json_array_foreach(nodes, i, s) {
        const char *name = json_string_value(json_object_get(s, "name"));
        printf("%016llx   %-8s %7.1f s  %s\n",
               (unsigned long long)json_integer_value(json_object_get(s, "id")),
               json_string_value(json_object_get(s, "state")) ?
               json_string_value(json_object_get(s, "state")) : "?",
               (double)json_integer_value(json_object_get(s, "heard_ms_ago")) / 1000.0,
               name && *name ? name : "-");
    }
    /* "nodes" is the array of the nodes the master knows, not a count */
    printf("objects %lld, nodes %zu, clients %lld, kv revision %lld\n",
           (long long)json_integer_value(json_object_get(j, "objects")),
           json_array_size(nodes),
           (long long)json_integer_value(json_object_get(j, "clients")),
           (long long)json_integer_value(json_object_get(j, "kv_revision")));
}

int cmd_status(int argc, char **argv)
{
    up_opts o;
    bool run;
    int pst = parse(&status_cmd, argc, argv, &o, &run);
    if (!run)
        return pst;
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    char f[4200], addr[128];
    snprintf(f, sizeof f, "%s/token", o.dir);
    if (access(f, R_OK) == 0)
        ferry_engine_config_token_file(&cfg.engine, f, NULL);   /* none: the open below says so */
    snprintf(f, sizeof f, "%s/master.addr", o.dir);
    if (o.master[0])
        snprintf(cfg.master, sizeof cfg.master, "%s", o.master);
    else if (up_read_small(f, addr, sizeof addr) == 0)
        snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.timeout_ms = 5000;
    ferry_store *s = NULL;
    ferry_error e = {0};
    int rc = ferry_store_open(&cfg, &s, &e);
    char *text = NULL;
    if (rc == 0)
        rc = ferry_store_status_json(s, &text, &e);
    ferry_store_close(s);
    if (rc < 0) {
        fprintf(stderr, "ferry status: %s\n", e.msg);
        return 1;
    }
    json_t *j = o.json ? NULL : json_loads(text, 0, NULL);
    if (j)
        print_status(j);
    else
        printf("%s\n", text);
    json_decref(j);
    ferry_store_free(text);
    return 0;
}
