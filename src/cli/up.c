/* `ferry up`, `ferry down`, `ferry status`: a local cluster (one master and
 * one node on this machine) for examples, tests and development.
 *
 * State directory (--dir, default $FERRY_HOME, else ~/.ferry):
 *   token         the cluster token (generated once, mode 0600)
 *   master/       the master's log and snapshots
 *   master.addr   HOST:PORT of the running master
 *   node.ready    the node's segment id once mounted
 *   up.pids       master and node pids of a detached cluster
 *   master.log, node.log   output of a detached cluster */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

typedef struct up_opts {
    char dir[4096];
    char listen[64];
    uint64_t size;
    bool detach, json;
    char master[128];
} up_opts;

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void default_dir(char *out, size_t cap)
{
    const char *h = getenv("FERRY_HOME");
    if (h && *h)
        snprintf(out, cap, "%s", h);
    else
        snprintf(out, cap, "%s/.ferry", getenv("HOME") ? getenv("HOME") : ".");
}

static int parse(const char *cmd, int argc, char **argv, up_opts *o)
{
    memset(o, 0, sizeof *o);
    default_dir(o->dir, sizeof o->dir);
    snprintf(o->listen, sizeof o->listen, "127.0.0.1:0");
    o->size = 1ull << 30;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--detach"))
            o->detach = true;
        else if (!strcmp(a, "--json"))
            o->json = true;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        else if (v && !strcmp(a, "--dir"))
            snprintf(o->dir, sizeof o->dir, "%s", argv[++i]);
        else if (v && !strcmp(a, "--listen"))
            snprintf(o->listen, sizeof o->listen, "%s", argv[++i]);
        else if (v && !strcmp(a, "--master"))
            snprintf(o->master, sizeof o->master, "%s", argv[++i]);
        else if (v && !strcmp(a, "--size")) {
            if (cli_opt_size(a, argv[++i], 1u << 20, UINT64_MAX, &o->size) < 0)
                return -1;
        } else {
            fprintf(stderr, "ferry %s: unknown option or missing value: %s\n", cmd, a);
            return -1;
        }
    }
    return 0;
}

static int read_small(const char *path, char *out, size_t cap)
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

/* Start `ferry ARGS...`. A detached child gets its own session and writes
 * to log (so that nothing holds our caller's terminal or pipes open). */
static pid_t spawn(const char *const *args, bool detach, const char *log)
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
        execv("/proc/self/exe", (char *const *)args);
        _exit(127);
    }
    return p;
}

/* Wait for a file to appear (the child writes it once ready) or the child
 * to exit; deadline in seconds. */
static int wait_file(const char *path, pid_t child, double secs, char *out, size_t cap)
{
    double end = cli_now() + secs;
    while (cli_now() < end) {
        if (read_small(path, out, cap) == 0)
            return 0;
        int st;
        if (waitpid(child, &st, WNOHANG) == child)
            return -1;
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return -1;
}

static void stop_child(pid_t p)
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

static void up_usage(FILE *f)
{
    fprintf(f,
            "usage: ferry up [--dir DIR] [--size SIZE] [--listen HOST:PORT] [--detach]\n"
            "       ferry down [--dir DIR]\n"
            "       ferry status [--dir DIR | --master HOST:PORT] [--json]\n"
            "\n"
            "up starts a master and a node on this machine (state in DIR, default\n"
            "$FERRY_HOME or ~/.ferry; a token is generated there once) and prints the\n"
            "line that points clients at it. It stays in the foreground; Ctrl-C stops\n"
            "both. --detach returns at once and leaves them running for `ferry down`.\n");
}

int cmd_up(int argc, char **argv)
{
    up_opts o;
    int pr = parse("up", argc, argv, &o);
    if (pr != 0) {
        up_usage(pr > 0 ? stdout : stderr);
        return pr > 0 ? 0 : 2;
    }
    char tok[4200], mdir[4200], addrf[4200], readyf[4200], pidf[4200], addr[128], seg[64];
    char sizes[32];
    snprintf(mdir, sizeof mdir, "%s/master", o.dir);
    snprintf(addrf, sizeof addrf, "%s/master.addr", o.dir);
    snprintf(readyf, sizeof readyf, "%s/node.ready", o.dir);
    snprintf(pidf, sizeof pidf, "%s/up.pids", o.dir);
    if ((mkdir(o.dir, 0700) != 0 && errno != EEXIST) || ensure_token(o.dir, tok, sizeof tok)) {
        fprintf(stderr, "ferry up: cannot prepare %s: %s\n", o.dir, strerror(errno));
        return 1;
    }
    if (access(pidf, F_OK) == 0)
        fprintf(stderr, "ferry up: %s exists: a detached cluster may still run (ferry down)\n",
                pidf);
    remove(addrf);
    remove(readyf);
    snprintf(sizes, sizeof sizes, "%llu", (unsigned long long)o.size);
    const char *margs[] = { "ferry", "master", "--dir", mdir, "--listen", o.listen,
                            "--token-file", tok, "--addr-file", addrf, NULL };
    char mlog[4200], nlog[4200];
    snprintf(mlog, sizeof mlog, "%s/master.log", o.dir);
    snprintf(nlog, sizeof nlog, "%s/node.log", o.dir);
    pid_t mp = spawn(margs, o.detach, mlog);
    if (mp < 0 || wait_file(addrf, mp, 15, addr, sizeof addr) != 0) {
        fprintf(stderr, "ferry up: the master did not start (see %s)\n",
                o.detach ? mlog : "its errors above");
        stop_child(mp);
        return 1;
    }
    const char *nargs[] = { "ferry", "node", "--master", addr, "--size", sizes,
                            "--token-file", tok, "--ready-file", readyf, NULL };
    pid_t np = spawn(nargs, o.detach, nlog);
    if (np < 0 || wait_file(readyf, np, 60, seg, sizeof seg) != 0) {
        fprintf(stderr, "ferry up: the node did not start (see %s)\n",
                o.detach ? nlog : "its errors above");
        stop_child(np);
        stop_child(mp);
        return 1;
    }
    printf("ferry up: master at %s, node segment %s (%s), state in %s\n", addr, seg,
           cli_fmt_size(o.size, sizes, sizeof sizes), o.dir);
    printf("export FERRY_MASTER=%s FERRY_TOKEN_FILE=%s\n", addr, tok);
    fflush(stdout);
    if (o.detach) {
        char text[64];
        snprintf(text, sizeof text, "%d %d\n", (int)mp, (int)np);
        if (cli_write_file_atomic(pidf, text) != 0) {
            fprintf(stderr, "ferry up: cannot write %s; stopping\n", pidf);
            stop_child(np);
            stop_child(mp);
            return 1;
        }
        return 0;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = 0;
    while (!g_stop) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p == mp || p == np) {
            fprintf(stderr, "ferry up: the %s exited; stopping\n", p == mp ? "master" : "node");
            if (p == mp)
                mp = -1;
            else
                np = -1;
            rc = 1;
            break;
        }
    }
    stop_child(np);
    stop_child(mp);
    remove(addrf);
    remove(readyf);
    return rc;
}

int cmd_down(int argc, char **argv)
{
    up_opts o;
    int pr = parse("down", argc, argv, &o);
    if (pr != 0) {
        up_usage(pr > 0 ? stdout : stderr);
        return pr > 0 ? 0 : 2;
    }
    char pidf[4200], text[64];
    snprintf(pidf, sizeof pidf, "%s/up.pids", o.dir);
    int mp = 0, np = 0;
    if (read_small(pidf, text, sizeof text) != 0 || sscanf(text, "%d %d", &mp, &np) != 2) {
        fprintf(stderr, "ferry down: no detached cluster in %s\n", o.dir);
        return 1;
    }
    stop_child(np);
    stop_child(mp);
    remove(pidf);
    char f[4200];
    snprintf(f, sizeof f, "%s/master.addr", o.dir);
    remove(f);
    snprintf(f, sizeof f, "%s/node.ready", o.dir);
    remove(f);
    printf("ferry down: stopped the master (pid %d) and the node (pid %d)\n", mp, np);
    return 0;
}

static void print_status(json_t *j)
{
    char a[32], b[32];
    printf("master %s (instance %s)\n", json_string_value(json_object_get(j, "address")),
           json_string_value(json_object_get(j, "instance")) ?
           json_string_value(json_object_get(j, "instance")) : "?");
    printf("%-22s %-18s %10s %10s %8s %s\n", "segment", "node", "size", "used", "objects",
           "attached");
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(j, "segments"), i, s) {
        printf("%-22llu %-18llx %10s %10s %8lld %s\n",
               (unsigned long long)json_integer_value(json_object_get(s, "id")),
               (unsigned long long)json_integer_value(json_object_get(s, "node")),
               cli_fmt_size((uint64_t)json_integer_value(json_object_get(s, "size")), a, sizeof a),
               cli_fmt_size((uint64_t)json_integer_value(json_object_get(s, "used")), b, sizeof b),
               (long long)json_integer_value(json_object_get(s, "objects")),
               json_is_true(json_object_get(s, "attached")) ? "yes" : "no");
    }
    printf("objects %lld, nodes %lld, clients %lld, kv revision %lld\n",
           (long long)json_integer_value(json_object_get(j, "objects")),
           (long long)json_integer_value(json_object_get(j, "nodes")),
           (long long)json_integer_value(json_object_get(j, "clients")),
           (long long)json_integer_value(json_object_get(j, "kv_revision")));
}

int cmd_status(int argc, char **argv)
{
    up_opts o;
    int pr = parse("status", argc, argv, &o);
    if (pr != 0) {
        up_usage(pr > 0 ? stdout : stderr);
        return pr > 0 ? 0 : 2;
    }
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    char f[4200], addr[128];
    snprintf(f, sizeof f, "%s/token", o.dir);
    if (access(f, R_OK) == 0)
        ferry_engine_config_token_file(&cfg.engine, f);
    snprintf(f, sizeof f, "%s/master.addr", o.dir);
    if (o.master[0])
        snprintf(cfg.master, sizeof cfg.master, "%s", o.master);
    else if (read_small(f, addr, sizeof addr) == 0)
        snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.timeout_ms = 5000;
    ferry_store *s = NULL;
    int rc = ferry_store_open(&cfg, &s);
    char *text = NULL;
    if (rc == 0)
        rc = ferry_store_status_json(s, &text);
    ferry_store_close(s);
    if (rc < 0) {
        fprintf(stderr, "ferry status: %s\n", ferry_store_last_error());
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
