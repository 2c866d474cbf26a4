/* `ferry demo`: the main job. A local cluster (a master and a node, unless
 * FERRY_MASTER points at one), trainer processes that publish policy
 * generations of a model with real tensor shapes, and rollout processes
 * that take every generation in parameter-direct form (their own TP shard
 * of every tensor, straight into their parameter buffers) and in
 * compatibility form (every full tensor, checksum-verified, as a
 * load_weights loader would get it). Every parameter byte is checked
 * against values computed independently in each process. `ferry demo
 * engine` runs the engine demo. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "demo_int.h"

typedef struct child { pid_t pid; FILE *in, *out; } child;

static int child_start(child *c, const char *const *args)
{
    memset(c, 0, sizeof *c);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
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

static int child_line(child *c, char *buf, size_t cap)
{
    if (!c->out || !fgets(buf, (int)cap, c->out)) {
        snprintf(buf, cap, "ERR the process exited");
        return -1;
    }
    buf[strcspn(buf, "\n")] = 0;
    return strncmp(buf, "OK", 2) == 0 || strncmp(buf, "READY", 5) == 0 ? 0 : -1;
}

static void child_stop(child *c)
{
    if (c->in)
        fclose(c->in);   /* EOF: the child leaves its loop */
    if (c->out)
        fclose(c->out);
    if (c->pid > 0) {
        for (int i = 0; i < 500; i++) {
            if (waitpid(c->pid, NULL, WNOHANG) == c->pid) {
                c->pid = 0;
                break;
            }
            struct timespec ts = { 0, 20 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        if (c->pid > 0) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, NULL, 0);
        }
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
    *p = 0;
}

static pid_t spawn_quiet(const char *const *args)
{
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0)
            dup2(nul, 1);
        execv("/proc/self/exe", (char *const *)args);
        _exit(127);
    }
    return p;
}

static int wait_file(const char *path, pid_t p, char *out, size_t cap)
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
        if (waitpid(p, NULL, WNOHANG) == p)
            return -1;
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return -1;
}

typedef struct demo_opts {
    unsigned trainers, rollouts, generations, dp;
    uint64_t bytes;
    char model[64];
    bool json;
} demo_opts;

typedef struct gen_row {
    double publish_s, direct_s, compat_s;
    uint64_t direct_read, compat_read, bad, pushed;
    bool ok;
    char error[256];
} gen_row;

/* Send cmd to every child of a group, wait for every reply; max of the
 * first number each reply gives (its time), sums of the second and third. */
static bool round_all(child *cs, unsigned n, const char *cmd, double *wall, uint64_t *sum2,
                      uint64_t *sum3, uint64_t *sum4, char *err, size_t errcap)
{
    double t0 = cli_now();
    for (unsigned i = 0; i < n; i++) {
        fprintf(cs[i].in, "%s\n", cmd);
        fflush(cs[i].in);
    }
    bool ok = true;
    uint64_t s4 = 0;
    *sum2 = *sum3 = 0;
    for (unsigned i = 0; i < n; i++) {
        char line[1024];
        if (child_line(&cs[i], line, sizeof line) < 0) {
            if (ok)
                snprintf(err, errcap, "%.250s", line);
            ok = false;
            continue;
        }
        double t;
        unsigned long long a = 0, b = 0, c = 0;
        if (sscanf(line, "OK %lf %llu %llu %llu", &t, &a, &b, &c) >= 2) {
            *sum2 += a;
            *sum3 += b;
            s4 += c;
        }
    }
    if (sum4)
        *sum4 = s4;
    *wall = cli_now() - t0;
    return ok;
}

static int parse(int argc, char **argv, demo_opts *o)
{
    *o = (demo_opts){ .trainers = 4, .rollouts = 4, .generations = 3, .dp = 0,
                      .bytes = 2ull << 30 };
    snprintf(o->model, sizeof o->model, "qwen3-8b");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!v)
            return -1;
        i++;
        if (!strcmp(a, "--trainers"))
            o->trainers = (unsigned)atoi(v);
        else if (!strcmp(a, "--rollouts"))
            o->rollouts = (unsigned)atoi(v);
        else if (!strcmp(a, "--dp"))
            o->dp = (unsigned)atoi(v);
        else if (!strcmp(a, "--generations"))
            o->generations = (unsigned)atoi(v);
        else if (!strcmp(a, "--bytes")) {
            if (cli_parse_size(v, &o->bytes) != 0)
                return -1;
        } else if (!strcmp(a, "--model"))
            snprintf(o->model, sizeof o->model, "%s", v);
        else
            return -1;
    }
    if (o->dp == 0)
        o->dp = o->rollouts % 2 == 0 ? 2 : 1;   /* default: TP x DP2 when it divides */
    return o->trainers && o->rollouts && o->generations && o->trainers <= 64 &&
           o->rollouts % o->dp == 0 &&
                   o->rollouts <= 64 && o->bytes >= (1u << 20) ? 0 : -1;
}

int cmd_demo(int argc, char **argv, const char *self)
{
    if (argc >= 2 && !strcmp(argv[1], "engine"))
        return cmd_demo_engine(argc - 1, argv + 1, self);
    demo_opts o;
    if (parse(argc, argv, &o) < 0) {
        fprintf(stderr, "usage: ferry demo [--trainers N] [--rollouts N] [--generations N]\n"
                        "                  [--bytes SIZE] [--model PRESET] [--json]\n"
                        "       ferry demo engine [--size SIZE] [--json]\n");
        return 2;
    }
    demo_model dm;
    if (demo_model_build(o.model, o.bytes, &dm) < 0) {
        fprintf(stderr, "ferry demo: unknown model preset %s (ferry plan --models)\n", o.model);
        return 2;
    }
    if (!getenv("FERRY_TOKEN") && !getenv("FERRY_TOKEN_FILE")) {
        char tok[65];
        ferry_token_generate(tok);
        setenv("FERRY_TOKEN", tok, 1);
    }
    char dir[] = "/tmp/ferry-demo-XXXXXX", addr[128] = "", f1[128], f2[128], seg[64];
    pid_t master = 0, node = 0;
    int rc = 1;
    child tr[64] = {{0}}, ro[64] = {{0}};
    const char *ext = getenv("FERRY_MASTER");
    if (ext && *ext) {
        snprintf(addr, sizeof addr, "%s", ext);
    } else {
        if (!mkdtemp(dir)) {
            fprintf(stderr, "ferry demo: cannot make a temp dir\n");
            return 1;
        }
        char mdir[160], segsz[32];
        snprintf(mdir, sizeof mdir, "%s/master", dir);
        snprintf(f1, sizeof f1, "%s/addr", dir);
        snprintf(f2, sizeof f2, "%s/ready", dir);
        /* two generations kept plus one being published */
        snprintf(segsz, sizeof segsz, "%llu", (unsigned long long)(dm.bytes * 3 + (256ull << 20)));
        const char *ma[] = { "ferry", "master", "--dir", mdir, "--addr-file", f1, NULL };
        master = spawn_quiet(ma);
        if (master <= 0 || wait_file(f1, master, addr, sizeof addr) < 0) {
            fprintf(stderr, "ferry demo: the master did not start\n");
            goto out;
        }
        const char *na[] = { "ferry", "node", "--master", addr, "--size", segsz, "--ready-file",
                             f2, NULL };
        node = spawn_quiet(na);
        if (node <= 0 || wait_file(f2, node, seg, sizeof seg) < 0) {
            fprintf(stderr, "ferry demo: the node did not start (%s of memory)\n", segsz);
            goto out;
        }
    }
    char sz[32], buf[32];
    if (!o.json)
        fprintf(stderr, "ferry demo: %u trainers publish %u generations of %s (%zu tensors with "
                "its real shapes, %s bf16) through the store at %s;\n%u rollout workers (TP%u x DP%u) "
                "take each one parameter-direct, single-pull (every byte read from the store once, "
                "pushed to its replicas),\nand whole (compatibility), checking every byte.\n",
                o.trainers, o.generations, o.model, dm.n, cli_fmt_size(dm.bytes, sz, sizeof sz),
                addr, o.rollouts, o.rollouts / o.dp, o.dp);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)o.bytes);
    char dps[16];
    snprintf(dps, sizeof dps, "%u", o.dp);
    for (unsigned k = 0; k < o.trainers + o.rollouts; k++) {
        bool t = k < o.trainers;
        unsigned r = t ? k : k - o.trainers;
        char rk[16], ws[16];
        snprintf(rk, sizeof rk, "%u", r);
        snprintf(ws, sizeof ws, "%u", t ? o.trainers : o.rollouts);
        const char *args[] = { "ferry", t ? "_demo_trainer" : "_demo_rollout", addr, rk, ws,
                               o.model, buf, dps, NULL };
        child *c = t ? &tr[r] : &ro[r];
        char line[512];
        if (child_start(c, args) < 0 || child_line(c, line, sizeof line) < 0) {
            fprintf(stderr, "ferry demo: a %s did not start: %s\n", t ? "trainer" : "rollout",
                    line);
            goto out;
        }
    }
    gen_row rows[64] = {{0}};
    unsigned ng = o.generations > 64 ? 64 : o.generations;
    bool all_ok = true;
    for (unsigned g = 1; g <= ng; g++) {
        gen_row *row = &rows[g - 1];
        char cmd[64];
        uint64_t a, b;
        snprintf(cmd, sizeof cmd, "publish %u", g);
        if (!o.json)
            cli_progress("publish", (double)(g - 1) / ng);
        row->ok = round_all(tr, o.trainers, cmd, &row->publish_s, &a, &b, NULL, row->error,
                            sizeof row->error);
        snprintf(cmd, sizeof cmd, "direct %u", g);
        if (row->ok && !o.json)
            cli_progress("direct update", (g - 0.66) / ng);
        row->ok = row->ok && round_all(ro, o.rollouts, cmd, &row->direct_s, &row->direct_read,
                                       &row->bad, &row->pushed, row->error, sizeof row->error);
        snprintf(cmd, sizeof cmd, "compat %u", g);
        if (row->ok && !o.json)
            cli_progress("compat update", (g - 0.33) / ng);
        row->ok = row->ok && round_all(ro, o.rollouts, cmd, &row->compat_s, &row->compat_read,
                                       &b, NULL, row->error, sizeof row->error);
        row->bad += b;
        row->ok = row->ok && row->bad == 0;
        all_ok = all_ok && row->ok;
    }
    if (!o.json)
        cli_progress_done();
    if (o.json) {
        printf("{\"ok\":%s,\"model\":\"%s\",\"tensors\":%zu,\"bytes\":%llu,\"trainers\":%u,"
               "\"rollouts\":%u,\"dp\":%u,\"generations\":[", all_ok ? "true" : "false",
               o.model, dm.n, (unsigned long long)dm.bytes, o.trainers, o.rollouts, o.dp);
        for (unsigned g = 0; g < ng; g++)
            printf("%s{\"generation\":%u,\"publish_s\":%.4f,\"direct_s\":%.4f,"
                   "\"direct_store_bytes\":%llu,\"direct_read_ratio\":%.3f,\"direct_pushed_bytes\":%llu,"
                   "\"compat_s\":%.4f,"
                   "\"compat_store_bytes\":%llu,\"wrong_bytes\":%llu,\"ok\":%s}", g ? "," : "",
                   g + 1, rows[g].publish_s, rows[g].direct_s,
                   (unsigned long long)rows[g].direct_read,
                   (double)rows[g].direct_read / (double)dm.bytes,
                   (unsigned long long)rows[g].pushed, rows[g].compat_s,
                   (unsigned long long)rows[g].compat_read, (unsigned long long)rows[g].bad,
                   rows[g].ok ? "true" : "false");
        printf("]}\n");
    } else {
        printf("%-4s %10s %8s %9s %12s %12s %9s %12s %s\n", "gen", "publish s", "GB/s",
               "direct s", "store read", "pushed", "compat s", "store read", "every byte");
        for (unsigned g = 0; g < ng; g++) {
            char r1[32], r2[32], r3[32];
            printf("%-4u %10.3f %8.2f %9.3f %12s %12s %9.3f %12s %s\n", g + 1, rows[g].publish_s,
                   rows[g].publish_s > 0 ? (double)dm.bytes / rows[g].publish_s / 1e9 : 0,
                   rows[g].direct_s, cli_fmt_size(rows[g].direct_read, r1, sizeof r1),
                   cli_fmt_size(rows[g].pushed, r3, sizeof r3),
                   rows[g].compat_s, cli_fmt_size(rows[g].compat_read, r2, sizeof r2),
                   rows[g].ok ? "verified" : rows[g].error[0] ? rows[g].error : "WRONG");
        }
        printf("direct: the group read %.2fx the published bytes from the store (each byte once; "
               "a worker-reads-its-own baseline reads %ux); compat: every worker reads every "
               "tensor (%ux).\n", (double)rows[0].direct_read / (double)dm.bytes, o.dp,
               o.rollouts);
        printf("%s\n", all_ok ? "demo ok" : "demo FAILED");
    }
    rc = all_ok ? 0 : 1;
out:
    for (unsigned k = 0; k < 64; k++) {
        child_stop(&tr[k]);
        child_stop(&ro[k]);
    }
    child_term(&node);
    child_term(&master);
    if (!(ext && *ext)) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "ferry demo: could not remove %s\n", dir);
    }
    demo_model_free(&dm);
    return rc;
}
