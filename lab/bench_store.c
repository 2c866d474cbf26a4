/* `ferry-lab bench store`: the store's metadata rate, and its put/get throughput
 * against the engine moving the same bytes in the same run.
 *
 * A private cluster: a master in a temp dir (fsync on, the durable
 * configuration, unless --no-sync) and one node, both children of this
 * process, stopped and removed at the end, on failure and on SIGINT/SIGTERM.
 *  - metadata: --clients processes (`ferry-lab worker store-client`) loop for
 *    --seconds over 64 zero-length objects: batch_put_from (64 PUT_START and
 *    64 PUT_END in two pipelined round trips), batch_get_into with capacity
 *    0 (64 GET_REPLICAS in one), then remove_prefix.
 *  - throughput: --total bytes as --object objects from one registered
 *    buffer, put in batches of --batch, read back with batch_get_into into a
 *    second one; same host (the engine picks shm) and over tcp. The baseline
 *    is the store client's own engine writing and reading the same bytes in
 *    the same block size to a `ferry-lab worker target` child's region, interleaved
 *    with the store passes so both see the same noise. Best of --reps.
 * Reads lease objects; the clients use a 1 ms lease so that the objects can
 * be removed right after (a longer lease would only delay the removal). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lab.h"
#include "bench_store.h"
#include "cli_opts.h"

enum { META_BATCH = 64, PIDS_MAX = CLIENTS_MAX + 6, BATCH_MAX = 256 };

#define META_GOAL 50000.0
#define RATIO_GOAL 0.85
#define XFER_PREFIX "bench-xfer/"

/* Children and the temp dir, for the signal handler. */
static volatile pid_t g_pids[PIDS_MAX];
static char g_dir[2][256];   /* --ha runs two clusters at once */

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static void block_signals(sigset_t *old)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    sigprocmask(SIG_BLOCK, &s, old);
}

static void track(pid_t p)
{
    for (int i = 0; i < PIDS_MAX && p > 0; i++)
        if (g_pids[i] <= 0) {
            g_pids[i] = p;
            return;
        }
}

static void untrack(pid_t p)
{
    for (int i = 0; i < PIDS_MAX && p > 0; i++)
        if (g_pids[i] == p)
            g_pids[i] = 0;
}

/* rm -rf through fork and exec: async-signal-safe, so the signal handler
 * cleans up the same way as the normal path. */
static void rm_tree(const char *dir)
{
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/rm", "rm", "-rf", "--", dir, (char *)NULL);
        _exit(127);
    }
    if (p > 0)
        waitpid(p, NULL, 0);
}

static void on_signal(int sig)
{
    for (int i = 0; i < PIDS_MAX; i++)
        if (g_pids[i] > 0)
            kill(g_pids[i], SIGKILL);
    for (int i = 0; i < PIDS_MAX; i++)
        if (g_pids[i] > 0)
            waitpid(g_pids[i], NULL, 0);
    for (int i = 0; i < 2; i++)
        if (g_dir[i][0])
            rm_tree(g_dir[i]);
    _exit(128 + sig);
}

/* Run exe with args, stdin/stdout from in/out (-1: inherited). The child
 * dies with this process; signals are blocked across the fork so the
 * handler never runs in the child and always sees the pid tracked. */
static pid_t spawn_exe(const char *exe, const char *const *args, int in, int out)
{
    sigset_t old;
    block_signals(&old);
    pid_t p = fork();
    if (p == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if ((in >= 0 && dup2(in, 0) < 0) || (out >= 0 && dup2(out, 1) < 0))
            _exit(127);
        execvp(exe, (char *const *)args);
        _exit(127);
    }
    track(p);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return p;
}

/* Run `ferry ARGS...` (or `ferry-lab worker ...`). */
static pid_t spawn(const char *self, const char *const *args, int in, int out)
{
    /* a worker is this program; the master and the node are the operator's ferry */
    bool worker = args[1] && !strcmp(args[1], "worker");
    const char *exe = !worker ? lab_ferry_bin() : access("/proc/self/exe", X_OK) == 0 ? "/proc/self/exe" : self;
    return spawn_exe(exe, args, in, out);
}

/* SIGTERM, then SIGKILL after 10 s; *p = -1. */
static void stop_child(pid_t *p)
{
    if (*p <= 0)
        return;
    untrack(*p);
    kill(*p, SIGTERM);
    for (int i = 0; i < 500 && waitpid(*p, NULL, WNOHANG) == 0; i++)
        sleep_ms(20);
    if (kill(*p, 0) == 0 || errno != ESRCH) {
        kill(*p, SIGKILL);
        waitpid(*p, NULL, 0);
    }
    *p = -1;
}

/* Wait for the file a child writes once ready; -1 if it exits first (then
 * *child = -1) or after secs. */
static int wait_file(const char *path, pid_t *child, double secs, char *out, size_t cap)
{
    for (double end = cli_now() + secs; cli_now() < end; sleep_ms(20)) {
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(out, 1, cap - 1, f);
            fclose(f);
            out[n] = '\0';
            out[strcspn(out, "\r\n")] = '\0';
            if (out[0])
                return 0;
        }
        if (waitpid(*child, NULL, WNOHANG) == *child) {
            untrack(*child);
            *child = -1;
            return -1;
        }
    }
    return -1;
}

void bs_kill(pid_t *p)
{
    if (*p <= 0)
        return;
    untrack(*p);
    kill(*p, SIGKILL);
    waitpid(*p, NULL, 0);
    *p = -1;
}

void bs_cluster_stop(bs_cluster *c)
{
    stop_child(&c->npid);
    stop_child(&c->mpid);
    stop_child(&c->m2pid);
    stop_child(&c->epid);
    if (c->dir[0]) {
        sigset_t old;
        block_signals(&old);
        for (int i = 0; i < 2; i++)
            if (!strcmp(g_dir[i], c->dir))
                g_dir[i][0] = '\0';
        sigprocmask(SIG_SETMASK, &old, NULL);
        rm_tree(c->dir);
        c->dir[0] = '\0';
    }
}

/* ha: etcd, then the first master (it leads: it writes its address file),
 * then the second (a standby: it follows, does not listen). c->master
 * names both. */
static int ha_masters(bs_cluster *c, const bs_opts *o, const char *self, int null)
{
    cli_etcd e;
    char elog[300], ttl[16], listen[2][32], mdir[2][300], addrf[2][300], addr[128];
    if (cli_etcd_prepare(&e, c->dir) != 0)
        return -1;
    snprintf(ttl, sizeof ttl, "%u", o->ha_ttl);
    c->epid = spawn_exe(e.bin, e.args, -1, null);
    int w = c->epid < 0 ? 1 : cli_etcd_wait(&e, c->epid, 60);
    if (w != 0) {
        snprintf(elog, sizeof elog, "%s", w == 1 ? "exited" : "did not answer within 60 s");
        fprintf(stderr, "ferry-lab bench store: etcd (%s) %s (scripts/deps.sh installs "
                "etcd-server)\n", e.bin, elog);
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        snprintf(listen[i], sizeof listen[i], "127.0.0.1:%d", cli_free_port());
        snprintf(mdir[i], sizeof mdir[i], "%s/master%d", c->dir, i);
        snprintf(addrf[i], sizeof addrf[i], "%s/master%d.addr", c->dir, i);
        const char *margs[] = { "ferry", "master", "--dir", mdir[i], "--listen", listen[i],
                                "--addr-file", addrf[i], "--etcd", e.url, "--cluster", "bench",
                                "--ha-ttl", ttl, o->sync ? NULL : "--no-sync", NULL };
        pid_t *p = i == 0 ? &c->mpid : &c->m2pid;
        *p = spawn(self, margs, -1, null);
        if (i == 0 && (c->mpid < 0 || wait_file(addrf[0], &c->mpid, 60, addr, sizeof addr) != 0)) {
            fprintf(stderr, "ferry-lab bench store: the first replicated master did not lead "
                    "(see its errors above)\n");
            return -1;
        }
        if (i == 1 && c->m2pid < 0)
            return -1;
    }
    snprintf(c->master, sizeof c->master, "%s,%s", listen[0], listen[1]);
    return 0;
}

int bs_cluster_start(bs_cluster *c, const bs_opts *o, const char *self, bool ha)
{
    *c = (bs_cluster){ .mpid = -1, .npid = -1, .epid = -1, .m2pid = -1 };
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(c->dir, sizeof c->dir, "%s/ferry-bench-store-XXXXXX", tmp);
    if (!mkdtemp(c->dir)) {
        fprintf(stderr, "ferry-lab bench store: cannot create a directory in %s: %s\n", tmp,
                strerror(errno));
        c->dir[0] = '\0';
        return -1;
    }
    sigset_t old;
    block_signals(&old);
    int slot = g_dir[0][0] ? 1 : 0;
    snprintf(g_dir[slot], sizeof g_dir[slot], "%s", c->dir);
    sigprocmask(SIG_SETMASK, &old, NULL);
    char mdir[300], addrf[300], readyf[300], size[32], seg[64];
    snprintf(mdir, sizeof mdir, "%s/master", c->dir);
    snprintf(addrf, sizeof addrf, "%s/master.addr", c->dir);
    snprintf(readyf, sizeof readyf, "%s/node.ready", c->dir);
    snprintf(size, sizeof size, "%llu", (unsigned long long)o->size);
    /* Their banners would mix with --json output: stdout goes nowhere. */
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    const char *margs[] = { "ferry", "master", "--dir", mdir, "--listen", "127.0.0.1:0",
                            "--addr-file", addrf, o->sync ? NULL : "--no-sync", NULL };
    if (ha && ha_masters(c, o, self, null) != 0) {
        close(null);
        return -1;
    }
    if (!ha) {
        c->mpid = spawn(self, margs, -1, null);
        if (c->mpid < 0 || wait_file(addrf, &c->mpid, 15, c->master, sizeof c->master) != 0) {
            fprintf(stderr, "ferry-lab bench store: the master did not start (see its errors above)\n");
            close(null);
            return -1;
        }
    }
    const char *nargs[] = { "ferry", "node", "--master", c->master, "--size", size,
                            "--ready-file", readyf, NULL };
    c->npid = spawn(self, nargs, -1, null);
    close(null);
    if (c->npid < 0 || wait_file(readyf, &c->npid, 60, seg, sizeof seg) != 0) {
        fprintf(stderr, "ferry-lab bench store: the node did not start (see its errors above)\n");
        return -1;
    }
    return 0;
}

/* A batch call that failed as a whole can leave results at 0: then every
 * object counts as failed. */
static uint64_t put_failures(int rc, const int *res, size_t n)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += res[i] < 0;
    return rc < 0 && bad == 0 ? n : bad;
}

/* results start at FERRY_EIO: a call that failed before filling them
 * counts every object as failed. */
static uint64_t get_failures(const int64_t *res, size_t n, uint64_t want)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += res[i] != (int64_t)want;
    return bad;
}

/* ---- metadata ---------------------------------------------------------------- */

/* `ferry-lab worker store-client MASTER SECONDS ID`: prints READY once
 * connected, starts on a line on stdin, prints
 * "DONE pairs gets removed failed seconds". */
int cli_bench_store_client_main(int argc, char **argv)
{
    ferry_error fe = {0};
    if (argc != 4) {
        fprintf(stderr, "usage: ferry-lab worker store-client MASTER SECONDS ID\n");
        return 2;
    }
    ferry_store_config cfg;
    ferry_store *s = NULL;
    int rc = ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", argv[1]);
    cfg.lease_ms = 1;
    if (rc == 0)
        rc = ferry_store_open(&cfg, &s, &fe);
    if (rc < 0) {
        printf("FAIL %s\n", fe.msg[0] ? fe.msg : ferry_strerror(rc));
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) {
        ferry_store_close(s);
        return 1;
    }
    char prefix[64], names[META_BATCH][96];
    const char *keys[META_BATCH];
    const void *bufs[META_BATCH] = { 0 };
    void *dst[META_BATCH] = { 0 };
    size_t lens[META_BATCH] = { 0 };   /* zero-length: puts and gets are metadata only */
    int pres[META_BATCH];
    int64_t gres[META_BATCH];
    bs_meta m = { 0 };
    bool said = false;
    snprintf(prefix, sizeof prefix, "bench-meta/%s/", argv[3]);
    double secs = atof(argv[2]), t0 = cli_now();
    for (unsigned long long it = 0; cli_now() - t0 < secs; it++) {
        for (int k = 0; k < META_BATCH; k++) {
            snprintf(names[k], sizeof names[k], "%s%llu/%d", prefix, it, k);
            keys[k] = names[k];
            gres[k] = FERRY_EIO;
        }
        rc = ferry_store_batch_put_from(s, keys, bufs, lens, META_BATCH, NULL, pres, NULL);
        uint64_t bad = put_failures(rc, pres, META_BATCH);
        m.pairs += META_BATCH - bad;
        m.failed += bad;
        rc = ferry_store_batch_get_into(s, keys, dst, lens, META_BATCH, gres, NULL);
        bad = get_failures(gres, META_BATCH, 0);
        m.gets += META_BATCH - bad;
        m.failed += bad;
        uint64_t n = 0;
        /* This round's objects are still leased for a millisecond: the
         * next round removes them. */
        if (ferry_store_remove_prefix(s, prefix, &n, &fe) == 0)
            m.removed += n;
        if (m.failed && !said) {
            fprintf(stderr, "ferry-lab bench store: client %s: %s\n", argv[3], fe.msg);
            said = true;
        }
    }
    m.secs = cli_now() - t0;
    for (int i = 0; i < 50 && m.removed < m.pairs; i++) {
        uint64_t n = 0;
        sleep_ms(5);
        if (ferry_store_remove_prefix(s, prefix, &n, NULL) == 0)
            m.removed += n;
    }
    printf("DONE %llu %llu %llu %llu %.6f\n", (unsigned long long)m.pairs,
           (unsigned long long)m.gets, (unsigned long long)m.removed,
           (unsigned long long)m.failed, m.secs);
    fflush(stdout);
    ferry_store_close(s);
    return 0;
}

int bs_meta_phase(const bs_opts *o, const char *self, const char *master, bs_meta *sum)
{
    pid_t pids[CLIENTS_MAX];
    FILE *in[CLIENTS_MAX] = { 0 }, *out[CLIENTS_MAX] = { 0 };
    char secs[16], line[1200] = "";
    unsigned n = 0;
    int rc = 0;
    snprintf(secs, sizeof secs, "%u", o->seconds);
    for (; n < o->clients && rc == 0; n++) {
        int a[2], b[2];
        char id[16];
        snprintf(id, sizeof id, "%u", n);
        if (pipe2(a, O_CLOEXEC) < 0)
            break;
        if (pipe2(b, O_CLOEXEC) < 0) {
            close(a[0]);
            close(a[1]);
            break;
        }
        const char *args[] = { "ferry-lab", "worker", "store-client", master, secs, id, NULL };
        pids[n] = spawn(self, args, a[0], b[1]);
        close(a[0]);
        close(b[1]);
        in[n] = fdopen(a[1], "w");
        out[n] = fdopen(b[0], "r");
        if (pids[n] < 0 || !in[n] || !out[n])
            rc = -1;
    }
    if (n < o->clients)
        rc = -1;
    for (unsigned i = 0; i < n && rc == 0; i++) {
        if (!fgets(line, sizeof line, out[i]) || strncmp(line, "READY", 5) != 0) {
            fprintf(stderr, "ferry-lab bench store: metadata client %u did not start%s%s", i,
                    line[0] ? ": " : "\n", line);
            rc = -1;
        }
        line[0] = '\0';
    }
    for (unsigned i = 0; i < n && rc == 0; i++)
        if (fputs("GO\n", in[i]) < 0 || fflush(in[i]) != 0)
            rc = -1;
    for (double t0 = cli_now(); rc == 0 && cli_now() - t0 < o->seconds; sleep_ms(100))
        cli_progress("metadata", (cli_now() - t0) / o->seconds);
    for (unsigned i = 0; i < n && rc == 0; i++) {
        unsigned long long p, g, r, f;
        double t;
        if (!fgets(line, sizeof line, out[i]) ||
            sscanf(line, "DONE %llu %llu %llu %llu %lf", &p, &g, &r, &f, &t) != 5) {
            fprintf(stderr, "ferry-lab bench store: metadata client %u failed\n", i);
            rc = -1;
            break;
        }
        sum->pairs += p;
        sum->gets += g;
        sum->removed += r;
        sum->failed += f;
        sum->secs = t > sum->secs ? t : sum->secs;
    }
    cli_progress_done();
    for (unsigned i = 0; i < n; i++) {
        if (in[i])
            fclose(in[i]);   /* EOF: a client still waiting for GO exits */
        if (out[i])
            fclose(out[i]);
        if (pids[i] > 0) {
            if (rc < 0)
                kill(pids[i], SIGKILL);
            untrack(pids[i]);
            waitpid(pids[i], NULL, 0);
        }
    }
    return rc;
}

/* The master's log counters from its status: records appended, and group
 * commits (its "fsyncs" counter, which counts commits with --no-sync too). */
static int wal_counts(ferry_store *s, uint64_t *appends, uint64_t *commits)
{
    char *text = NULL;
    int rc = ferry_store_status_json(s, &text, NULL);
    json_t *j = rc == 0 ? json_loads(text, 0, NULL) : NULL;
    json_t *w = json_object_get(j, "wal");
    *appends = (uint64_t)json_integer_value(json_object_get(w, "appends"));
    *commits = (uint64_t)json_integer_value(json_object_get(w, "fsyncs"));
    json_decref(j);
    ferry_store_free(text);
    return rc < 0 ? rc : w ? 0 : FERRY_EPROTO;
}

/* ---- throughput ---------------------------------------------------------------- */

typedef struct xfer_ctx {
    const bs_opts *o;
    ferry_store *s;
    ferry_engine *e;
    ferry_remote_region rr;
    uint8_t *src, *dst;
    const char **keys;
    uint64_t nobj, bytes;
    ferry_error err;          /* why the last failed store call failed */
} xfer_ctx;

static double put_pass(xfer_ctx *x, const char *what, uint64_t *failed)
{
    const void *bufs[BATCH_MAX];
    size_t lens[BATCH_MAX];
    int res[BATCH_MAX];
    double t0 = cli_now();
    for (uint64_t i = 0; i < x->nobj; i += x->o->batch) {
        size_t n = x->nobj - i < x->o->batch ? (size_t)(x->nobj - i) : x->o->batch;
        for (size_t k = 0; k < n; k++) {
            bufs[k] = x->src + (i + k) * x->o->object;
            lens[k] = x->o->object;
        }
        int rc = ferry_store_batch_put_from(x->s, x->keys + i, bufs, lens, n, NULL, res, &x->err);
        *failed += put_failures(rc, res, n);
        cli_progress(what, (double)(i + n) / (double)x->nobj);
    }
    return (double)x->bytes / (cli_now() - t0) / 1e9;
}

static double get_pass(xfer_ctx *x, const char *what, uint64_t *failed)
{
    void *bufs[BATCH_MAX];
    size_t caps[BATCH_MAX];
    int64_t res[BATCH_MAX];
    double t0 = cli_now();
    for (uint64_t i = 0; i < x->nobj; i += x->o->batch) {
        size_t n = x->nobj - i < x->o->batch ? (size_t)(x->nobj - i) : x->o->batch;
        for (size_t k = 0; k < n; k++) {
            bufs[k] = x->dst + (i + k) * x->o->object;
            caps[k] = x->o->object;
            res[k] = FERRY_EIO;
        }
        (void)ferry_store_batch_get_into(x->s, x->keys + i, bufs, caps, n, res, &x->err);
        *failed += get_failures(res, n, x->o->object);
        cli_progress(what, (double)(i + n) / (double)x->nobj);
    }
    return (double)x->bytes / (cli_now() - t0) / 1e9;
}

/* Remove the pass's objects once the reads' 1 ms leases have lapsed. */
static int clear_objects(xfer_ctx *x)
{
    uint64_t total = 0;
    for (int i = 0; i < 200 && total < x->nobj; i++) {
        uint64_t n = 0;
        sleep_ms(5);
        int rc = ferry_store_remove_prefix(x->s, XFER_PREFIX, &n, &x->err);
        if (rc < 0)
            return rc;
        total += n;
    }
    return total == x->nobj ? 0 : FERRY_EBUSY;
}

static double max2(double a, double b)
{
    return a > b ? a : b;
}

static int xfer_reps(xfer_ctx *x, const char *label, bs_xfer *r)
{
    char what[64];
    uint64_t *w = (uint64_t *)(void *)x->src;
    for (uint64_t i = 0; i < x->bytes / 8; i++)
        w[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
    /* Warm-up of both paths: connections, segment mappings, page tables (as
     * `ferry-lab bench engine` does), so that --reps 1 is not a cold figure. */
    if (cli_engine_pass(x->e, FERRY_OP_WRITE, x->src, &x->rr, x->o->object, x->bytes) <= 0)
        return FERRY_EIO;
    snprintf(what, sizeof what, "warm-up %s", label);
    put_pass(x, what, &r->failed);
    get_pass(x, what, &r->failed);
    int wrc = clear_objects(x);
    if (wrc < 0 || r->failed) {
        fprintf(stderr, "ferry-lab bench store: %s warm-up failed: %s\n", label, x->err.msg);
        return wrc < 0 ? wrc : FERRY_EIO;
    }
    for (unsigned rep = 0; rep < x->o->reps; rep++) {
        snprintf(what, sizeof what, "put %s %u/%u", label, rep + 1, x->o->reps);
        r->put = max2(r->put, put_pass(x, what, &r->failed));
        if (rep == 0)
            memset(x->dst, 0, x->bytes);
        snprintf(what, sizeof what, "get %s %u/%u", label, rep + 1, x->o->reps);
        r->get = max2(r->get, get_pass(x, what, &r->failed));
        if (rep == 0)
            r->mismatch = memcmp(x->src, x->dst, x->bytes) != 0;
        if (r->failed)
            fprintf(stderr, "ferry-lab bench store: %s: %llu puts/gets failed: %s\n", label,
                    (unsigned long long)r->failed, x->err.msg);
        int rc = clear_objects(x);
        if (rc < 0 || r->failed)
            return rc < 0 ? rc : FERRY_EIO;
        snprintf(what, sizeof what, "engine %s %u/%u", label, rep + 1, x->o->reps);
        cli_progress(what, 0.5);
        double ew = cli_engine_pass(x->e, FERRY_OP_WRITE, x->src, &x->rr, x->o->object, x->bytes);
        double er = cli_engine_pass(x->e, FERRY_OP_READ, x->dst, &x->rr, x->o->object, x->bytes);
        if (ew <= 0 || er <= 0)
            return FERRY_EIO;
        r->ewrite = max2(r->ewrite, ew);
        r->eread = max2(r->eread, er);
    }
    cli_progress_done();
    return 0;
}

/* One transport: a store client forced to it ("" = the engine's choice),
 * two registered buffers, the target's region imported into its engine. */
static int xfer_phase(const bs_opts *o, const char *master, const char *transport,
                      const cli_target *tgt, const char *label, bs_xfer *r)
{
    xfer_ctx x = { .o = o, .nobj = o->total / o->object };
    x.bytes = x.nobj * o->object;
    char(*names)[32] = calloc(x.nobj, sizeof *names);
    x.keys = calloc(x.nobj, sizeof *x.keys);
    void *src = NULL, *dst = NULL;
    bool reg_src = false, reg_dst = false;
    ferry_store_config cfg;
    int rc = names && x.keys ? ferry_store_config_init(&cfg) : FERRY_ENOMEM;
    if (rc == 0) {
        snprintf(cfg.master, sizeof cfg.master, "%s", master);
        snprintf(cfg.engine.transport, sizeof cfg.engine.transport, "%s", transport);
        cfg.lease_ms = 1;
        rc = ferry_store_open(&cfg, &x.s, &x.err);
    }
    for (uint64_t i = 0; rc == 0 && i < x.nobj; i++) {
        snprintf(names[i], sizeof names[i], XFER_PREFIX "%06llu", (unsigned long long)i);
        x.keys[i] = names[i];
    }
    if (rc == 0) {
        x.e = ferry_store_engine(x.s);
        rc = ferry_mem_alloc(x.e, x.bytes, &src, &x.err);
    }
    if (rc == 0)
        rc = ferry_mem_alloc(x.e, x.bytes, &dst, &x.err);
    if (rc == 0 && (rc = ferry_store_register_buffer(x.s, src, x.bytes, &x.err)) == 0)
        reg_src = true;
    if (rc == 0 && (rc = ferry_store_register_buffer(x.s, dst, x.bytes, &x.err)) == 0)
        reg_dst = true;
    if (rc == 0)
        rc = ferry_region_import(x.e, tgt->desc, tgt->desc_len, &x.rr, &x.err);
    if (rc == 0) {
        x.src = src;
        x.dst = dst;
        rc = xfer_reps(&x, label, r);
        const char *t = ferry_peer_transport(x.e, x.rr.peer);
        snprintf(r->transport, sizeof r->transport, "%s", t ? t : transport);
    }
    if (rc < 0)
        fprintf(stderr, "ferry-lab bench store: %s pass failed: %s\n", label,
                x.err.msg[0] ? x.err.msg : ferry_strerror(rc));
    if (reg_src)
        ferry_store_unregister_buffer(x.s, src, NULL);
    if (reg_dst)
        ferry_store_unregister_buffer(x.s, dst, NULL);
    if (src)
        ferry_mem_free(x.e, src, NULL);
    if (dst)
        ferry_mem_free(x.e, dst, NULL);
    ferry_store_close(x.s);
    free(names);
    free(x.keys);
    return rc;
}

/* ---- command ---------------------------------------------------------------------- */

static const cli_opt store_table[] = {
    CLI_UINT(bs_opts, clients, "clients", "N", 1, CLIENTS_MAX, "metadata client processes (4)"),
    CLI_UINT(bs_opts, seconds, "seconds", "N", 1, 3600, "metadata phase duration (3)"),
    /* the node's segment: ferry node wants 1 MiB at least */
    CLI_SIZE(bs_opts, size, "size", "SIZE", 1u << 20, UINT64_MAX, "the node's segment (1G)"),
    CLI_SIZE(bs_opts, total, "total", "SIZE", 1, UINT64_MAX, "bytes per throughput pass (512M)"),
    CLI_SIZE(bs_opts, object, "object", "SIZE", 8, UINT64_MAX, "object and engine block size (4M)"),
    CLI_UINT(bs_opts, batch, "batch", "N", 1, BATCH_MAX, "objects per batch_put_from / batch_get_into call (64)"),
    CLI_UINT(bs_opts, reps, "reps", "N", 1, 100000, "best of N passes (3)"),
    CLI_FLAG(bs_opts, no_sync, "no-sync",
             "the master does not fsync its log (not the durable setup;\ndefault: it does)"),
    CLI_FLAG(bs_opts, json, "json", "one JSON object on stdout (default: a table)"),
    CLI_FLAG(bs_opts, ha, "ha",
             "replicated masters on a local etcd against the single master,\n"
             "both in this run: metadata ops/s, put latency, the cluster\n"
             "log's bytes per op, and one leader kill mid-workload\n"
             "(instead of the throughput phases; default: off)"),
    CLI_UINT(bs_opts, ha_ttl, "ha-ttl", "S", 1, 3600, "with --ha: the leader's lease TTL (2)"),
    CLI_UINT(bs_opts, puts, "puts", "N", 10, 1000000, "with --ha: timed single puts per master setup (300)"),
};

static const cli_cmd store_cmd = {
    .name = "bench store",
    .about = "Store metadata operations per second, and put/get throughput against the engine\n"
             "and memcpy measured in the same run (a private master and node).",
    .opts = store_table,
    .nopts = sizeof store_table / sizeof store_table[0],
};

static int parse(int argc, char **argv, bs_opts *o)
{
    *o = (bs_opts){ .size = 1ull << 30, .total = 512ull << 20, .object = 4ull << 20,
                    .clients = 4, .seconds = 3, .reps = 3, .batch = 64, .puts = 300,
                    .ha_ttl = 2 };
    int pr = cli_parse(&store_cmd, argc, argv, o, NULL, NULL);
    if (pr != 0)
        return pr;
    o->sync = !o->no_sync;
    if (o->object <= o->total && o->total <= o->size && o->object >= 8)
        return 0;
    fprintf(stderr, "ferry-lab bench store: need --object <= --total <= --size\n");
    return -1;
}

static double ratio(double v, double base)
{
    return base > 0 ? v / base : 0;
}

double bs_meta_ops(const bs_meta *m)
{
    return m->secs > 0 ? (double)(2 * m->pairs + m->gets) / m->secs : 0;
}

static void print_json(const bs_opts *o, const bs_meta *m, const bs_xfer *x)
{
    double ops = bs_meta_ops(m);
    bool met = ops >= META_GOAL && ratio(x[0].put, x[0].ewrite) >= RATIO_GOAL &&
               ratio(x[0].get, x[0].eread) >= RATIO_GOAL;
    printf("{\"meta_ops_per_s\":%.0f,\"put_pairs_per_s\":%.0f,\"gets_per_s\":%.0f,\"clients\":%u,",
           ops, m->secs > 0 ? (double)m->pairs / m->secs : 0,
           m->secs > 0 ? (double)m->gets / m->secs : 0, o->clients);
    for (int t = 0; t < 2; t++)
        printf("%s\"transport\":\"%s\",\"put_gbps\":%.3f,\"get_gbps\":%.3f,\"engine_gbps\":%.3f,"
               "\"engine_read_gbps\":%.3f,\"put_ratio\":%.3f,\"get_ratio\":%.3f%s",
               t ? "\"tcp\":{" : "", x[t].transport, x[t].put, x[t].get, x[t].ewrite,
               x[t].eread, ratio(x[t].put, x[t].ewrite), ratio(x[t].get, x[t].eread),
               t ? "}," : ",");
    printf("\"meta_log_records\":%llu,\"meta_log_commits\":%llu,", (unsigned long long)m->appends,
           (unsigned long long)m->commits);
    printf("\"sync\":%s,\"object_bytes\":%llu,\"total_bytes\":%llu,\"batch\":%u,\"reps\":%u,"
           "\"failed\":%llu,\"verified\":%s,\"goals_met\":%s}\n",
           o->sync ? "true" : "false", (unsigned long long)o->object,
           (unsigned long long)(o->total / o->object * o->object), o->batch, o->reps,
           (unsigned long long)(m->failed + x[0].failed + x[1].failed),
           x[0].mismatch || x[1].mismatch ? "false" : "true", met ? "true" : "false");
}

static void print_table(const bs_opts *o, const bs_meta *m, const bs_xfer *x)
{
    double ops = bs_meta_ops(m);
    char row[160], fig[48], base[48];
    printf("%-28s %16s %16s %7s %10s %4s\n", "phase", "figure", "baseline", "ratio", "goal", "met");
    snprintf(row, sizeof row, "metadata, %u clients", o->clients);
    snprintf(fig, sizeof fig, "%.0f ops/s", ops);
    printf("%-28s %16s %16s %7s %10s %4s\n", row, fig, "-", "-", ">= 50000", ops >= META_GOAL ? "yes" : "no");
    snprintf(fig, sizeof fig, "%.0f /s", m->secs > 0 ? (double)m->pairs / m->secs : 0);
    printf("%-28s %16s\n", "  put_start+put_end pairs", fig);
    snprintf(fig, sizeof fig, "%.0f /s", m->secs > 0 ? (double)m->gets / m->secs : 0);
    printf("%-28s %16s\n", "  get_replica_list", fig);
    for (int t = 0; t < 2; t++)
        for (int g = 0; g < 2; g++) {
            double v = g ? x[t].get : x[t].put, b = g ? x[t].eread : x[t].ewrite;
            snprintf(row, sizeof row, "%s, %s (%s)", g ? "get" : "put", t ? "tcp" : "same host",
                     x[t].transport);
            snprintf(fig, sizeof fig, "%.2f GB/s", v);
            snprintf(base, sizeof base, "%.2f GB/s", b);
            printf("%-28s %16s %16s %7.2f %10s %4s\n", row, fig, base, ratio(v, b), ">= 0.85",
                   ratio(v, b) >= RATIO_GOAL ? "yes" : "no");
        }
    printf("master log during the metadata phase: %llu records in %llu group commits%s\n",
           (unsigned long long)m->appends, (unsigned long long)m->commits,
           o->sync ? " (one fdatasync each)" : " (not synced)");
    char sz[32];
    printf("baseline: the client's own engine %s %s blocks to/from a target process's region\n",
           "writing/reading the same bytes as", cli_fmt_size(o->object, sz, sizeof sz));
    if (m->removed < m->pairs)
        printf("note: %llu metadata objects were still leased at the end and not removed\n",
               (unsigned long long)(m->pairs - m->removed));
    if (m->failed + x[0].failed + x[1].failed || x[0].mismatch || x[1].mismatch)
        printf("FAILED: %llu puts/gets failed%s\n",
               (unsigned long long)(m->failed + x[0].failed + x[1].failed),
               x[0].mismatch || x[1].mismatch ? ", bytes read back differ" : "");
}

int cmd_bench_store(int argc, char **argv, const char *self)
{
    bs_opts o;
    int pr = parse(argc, argv, &o);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &store_cmd);
    if (!getenv("FERRY_TOKEN") && !getenv("FERRY_TOKEN_FILE")) {
        char tok[65];
        ferry_token_generate(tok);   /* a private cluster for this run */
        setenv("FERRY_TOKEN", tok, 1);
    }
    struct sigaction sa = { 0 }, old_int, old_term;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    bs_cluster c;
    cli_target tgt = { 0 };
    bs_meta m = { 0 };
    bs_xfer x[2] = { { .transport = "" }, { .transport = "tcp" } };
    char sz[32], sz2[32];
    if (o.ha) {
        int st = bs_ha_run(&o, self);
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        return st;
    }
    if (!o.json) {
        printf("ferry-lab bench store: master fsync %s, node segment %s; metadata: %u clients for %u s;\n"
               "throughput: %llu x %s objects per pass, batches of %u, best of %u\n",
               o.sync ? "on" : "off", cli_fmt_size(o.size, sz, sizeof sz), o.clients, o.seconds,
               (unsigned long long)(o.total / o.object), cli_fmt_size(o.object, sz2, sizeof sz2),
               o.batch, o.reps);
        fflush(stdout);
    }
    int rc = bs_cluster_start(&c, &o, self, false);
    ferry_store *admin = NULL;
    ferry_store_config acfg;
    uint64_t a0 = 0, f0 = 0;
    if (rc == 0 && (rc = ferry_store_config_init(&acfg)) == 0) {
        snprintf(acfg.master, sizeof acfg.master, "%s", c.master);
        rc = ferry_store_open(&acfg, &admin, NULL);
    }
    if (rc == 0)
        rc = wal_counts(admin, &a0, &f0);
    if (rc == 0)
        rc = bs_meta_phase(&o, self, c.master, &m);
    if (rc == 0 && (rc = wal_counts(admin, &m.appends, &m.commits)) == 0) {
        m.appends -= a0;
        m.commits -= f0;
    }
    ferry_store_close(admin);
    if (rc == 0) {
        sigset_t old;
        block_signals(&old);
        rc = cli_target_start(&tgt, self, o.total / o.object * o.object, NULL);
        track(tgt.pid);
        sigprocmask(SIG_SETMASK, &old, NULL);
    }
    if (rc == 0)
        rc = xfer_phase(&o, c.master, "", &tgt, "same host", &x[0]);
    if (rc == 0)
        rc = xfer_phase(&o, c.master, "tcp", &tgt, "tcp", &x[1]);
    untrack(tgt.pid);
    if (tgt.pid > 0)
        cli_target_stop(&tgt);
    bs_cluster_stop(&c);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (rc < 0)
        return 1;
    if (o.json)
        print_json(&o, &m, x);
    else
        print_table(&o, &m, x);
    return m.failed || x[0].mismatch || x[1].mismatch ? 1 : 0;
}
