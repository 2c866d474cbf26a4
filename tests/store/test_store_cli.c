/* `ferry up --detach`, `ferry status`, `ferry down` through the built
 * binary (FERRY_BIN), on a private state directory; and their process
 * hygiene: a stale up.pids never gets an unrelated process signalled, a
 * second `ferry up` changes nothing of a running cluster, a --size the
 * machine cannot give is refused before anything starts, and a node that
 * dies at start is explained. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/ftstore.h"

static void test_up_status_down(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-up-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char out[8192];
    const char *bin = ft_ferry_bin();
    int up = ft_run(out, sizeof out, "FERRY_TOKEN= FERRY_TOKEN_FILE= %s up --dir %s --size 32M --detach",
                 bin, dir);
    char *exp = strstr(out, "export FERRY_MASTER=");
    char master[64] = "";
    if (exp)
        sscanf(exp, "export FERRY_MASTER=%63s", master);
    int st = up == 0 ? ft_run(out, sizeof out, "%s status --dir %s --json", bin, dir) : -1;
    bool has_seg = strstr(out, "\"segments\"") && strstr(out, "33554432");
    int st2 = up == 0 ? ft_run(out, sizeof out, "%s status --dir %s", bin, dir) : -1;
    bool table = strstr(out, "32 MiB") != NULL;
    /* The token file written by up authenticates a client; none refuses it. */
    char tok[300];
    snprintf(tok, sizeof tok, "%s/token", dir);
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", master);
    ferry_store *s = NULL;
    int open_rc = ferry_engine_config_token_file(&cfg.engine, tok, NULL);
    if (open_rc == 0)
        open_rc = ferry_store_open(&cfg, &s, NULL);
    int put_rc = s ? ferry_store_put(s, "hello", "world", 5, NULL, NULL, NULL) : -1;
    ferry_store_close(s);
    int down = ft_run(out, sizeof out, "%s down --dir %s", bin, dir);
    int again = ft_run(out, sizeof out, "%s down --dir %s 2>&1", bin, dir);
    int gone = ft_run(out, sizeof out, "%s status --dir %s 2>&1", bin, dir);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(up, 0);
    assert_non_null(exp);
    assert_int_equal(st, 0);
    assert_true(has_seg);
    assert_int_equal(st2, 0);
    assert_true(table);
    assert_int_equal(open_rc, 0);
    assert_int_equal(put_rc, 0);
    assert_int_equal(down, 0);
    assert_int_not_equal(again, 0);
    assert_int_not_equal(gone, 0);
}

/* ---- process hygiene ---------------------------------------------------------------------- */

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static void rm_rf(const char *dir)
{
    char out[64];
    ft_run(out, sizeof out, "rm -rf '%s'", dir);
}

static bool file_has(const char *path, const char *what)
{
    char buf[8192] = "";
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    return strstr(buf, what) != NULL;
}

/* A process of this test that has nothing to do with ferry. */
static pid_t spawn_sleep(void)
{
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlive the test */
        execlp("sleep", "sleep", "100", (char *)NULL);
        _exit(127);
    }
    assert_true(p > 0);
    for (int i = 0; i < 2000; i++) {   /* until it is `sleep` (exec done) */
        char cmd[256];
        if (ft_proc_cmdline(p, cmd, sizeof cmd) == 0 && !strcmp(cmd, "sleep 100"))
            return p;
        sleep_ms(5);
    }
    fail_msg("sleep did not start");
    return -1;
}

/* up.pids naming a pid that now belongs to an unrelated process (here a
 * `sleep` of the test): `ferry down` signals nothing, says what it found,
 * and does not claim to have stopped anything. Once in the form written
 * before start times were kept ("MASTER NODE"), once with a start time and
 * command line that are not the sleep's. */
static void test_down_stale_pids(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-down-test-XXXXXX", pidf[300], out[8192];
    assert_non_null(mkdtemp(dir));
    snprintf(pidf, sizeof pidf, "%s/up.pids", dir);
    pid_t sp = spawn_sleep();
    unsigned long long start = ft_proc_start(sp);
    const char *forms[] = { "%d %d\n",
                            "master %d 1 6665727279006d6173746572\nnode %d 1 6665727279006e6f6465\n" };
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(pidf, "w");
        assert_non_null(f);
        fprintf(f, forms[k], (int)sp, (int)sp);
        fclose(f);
        int st = ft_run(out, sizeof out, "%s down --dir %s 2>&1", ft_ferry_bin(), dir);
        bool alive = ft_proc_alive(sp, start);
        print_message("stale up.pids (%s): ferry down -> %d: %s", k ? "with start times" : "pids only",
                      st, out);
        bool ok = alive && !strstr(out, "stopped") && st != 0 && strstr(out, "sleep 100") &&
                  access(pidf, F_OK) != 0;
        if (!ok || k == 1) {   /* the end, or a failure: clean up first */
            kill(sp, SIGKILL);
            waitpid(sp, NULL, 0);
            rm_rf(dir);
        }
        assert_true(alive);                      /* not signalled */
        assert_null(strstr(out, "stopped"));     /* and not reported stopped */
        assert_int_not_equal(st, 0);
        assert_non_null(strstr(out, "sleep 100"));   /* what it found instead */
        assert_int_not_equal(access(pidf, F_OK), 0); /* the stale file is gone */
    }
}

typedef struct fstate { bool exists; ino_t ino; struct timespec mtime; char text[256]; } fstate;

static fstate file_state(const char *path)
{
    fstate f = {0};
    struct stat st;
    if (stat(path, &st) != 0)
        return f;
    f.exists = true;
    f.ino = st.st_ino;
    f.mtime = st.st_mtim;
    FILE *fp = fopen(path, "r");
    if (fp) {
        size_t n = fread(f.text, 1, sizeof f.text - 1, fp);
        f.text[n] = 0;
        fclose(fp);
    }
    return f;
}

static bool same_file(const fstate *a, const fstate *b)
{
    return a->exists && b->exists && a->ino == b->ino && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec && !strcmp(a->text, b->text);
}

/* A second `ferry up` on a directory whose cluster runs (detached, then in
 * the foreground) is refused and changes nothing: master.addr, node.ready
 * and up.pids stay as they were, and the cluster keeps serving. */
static void test_second_up_changes_nothing(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-up2-test-XXXXXX", out[8192], f[3][300];
    assert_non_null(mkdtemp(dir));
    const char *bin = ft_ferry_bin(), *names[3] = { "master.addr", "node.ready", "up.pids" };
    int up = ft_run(out, sizeof out, "%s up --dir %s --size 32M --detach 2>&1", bin, dir);
    fstate before[3], after[3];
    for (int i = 0; i < 3; i++) {
        snprintf(f[i], sizeof f[i], "%s/%s", dir, names[i]);
        before[i] = file_state(f[i]);
    }
    int again = ft_run(out, sizeof out, "%s up --dir %s --size 32M --detach 2>&1", bin, dir);
    print_message("second ferry up --detach -> %d: %s", again, out);
    bool said = strstr(out, "runs in") != NULL;
    int fg = ft_run(out, sizeof out, "timeout 60 %s up --dir %s --size 32M 2>&1", bin, dir);
    print_message("second ferry up (foreground) -> %d: %s", fg, out);
    for (int i = 0; i < 3; i++)
        after[i] = file_state(f[i]);
    int status = ft_run(out, sizeof out, "%s status --dir %s --json", bin, dir);
    bool seg = strstr(out, "33554432") != NULL;
    int down = ft_run(out, sizeof out, "%s down --dir %s 2>&1", bin, dir);
    rm_rf(dir);
    assert_int_equal(up, 0);
    for (int i = 0; i < 3; i++) {
        if (!same_file(&before[i], &after[i]))
            print_error("%s changed (exists %d -> %d)\n", names[i], before[i].exists, after[i].exists);
        assert_true(same_file(&before[i], &after[i]));
    }
    assert_int_equal(status, 0);
    assert_true(seg);
    assert_int_equal(down, 0);
    assert_int_equal(again, 1);
    assert_true(said);
    assert_int_equal(fg, 1);
}

/* The same against a `ferry up` in the foreground (no up.pids): refused,
 * nothing changed; the first one still stops its cluster on SIGTERM. */
static void test_second_up_foreground(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-up2fg-test-XXXXXX", out[8192], addrf[300], readyf[300];
    assert_non_null(mkdtemp(dir));
    snprintf(addrf, sizeof addrf, "%s/master.addr", dir);
    snprintf(readyf, sizeof readyf, "%s/node.ready", dir);
    const char *bin = ft_ferry_bin();
    pid_t first = fork();
    if (first == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        execl(bin, "ferry", "up", "--dir", dir, "--size", "32M", (char *)NULL);
        _exit(127);
    }
    assert_true(first > 0);
    fstate a = {0}, r = {0};
    for (int i = 0; i < 6000 && !(a.exists && r.exists && a.text[0] && r.text[0]); i++) {
        a = file_state(addrf);
        r = file_state(readyf);
        if (!(a.exists && r.exists))
            sleep_ms(10);
    }
    int again = ft_run(out, sizeof out, "%s up --dir %s --size 32M --detach 2>&1", bin, dir);
    print_message("ferry up next to a foreground one -> %d: %s", again, out);
    bool said = strstr(out, "another `ferry up` holds") != NULL;
    fstate a2 = file_state(addrf), r2 = file_state(readyf);
    bool no_pids = access(strcat(strcpy(out, dir), "/up.pids"), F_OK) != 0;
    kill(first, SIGTERM);
    int ws = 0;
    int w = ft_wait_status(first, 60000, &ws);
    if (w < 0) {
        kill(first, SIGKILL);
        waitpid(first, NULL, 0);
    }
    rm_rf(dir);
    assert_true(a.exists && r.exists);
    assert_true(same_file(&a, &a2));
    assert_true(same_file(&r, &r2));
    assert_true(no_pids);
    assert_int_equal(again, 1);
    assert_true(said);
    assert_int_equal(w, 0);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

/* A --size the machine cannot give is refused before anything starts,
 * naming the size and what is available. 1 PiB: more than any machine
 * here has, and a node that tried would fail to map it, not exhaust memory. */
static void test_size_refused(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-size-test-XXXXXX", sub[300], out[8192];
    assert_non_null(mkdtemp(dir));
    snprintf(sub, sizeof sub, "%s/u", dir);
    int st = ft_run(out, sizeof out, "timeout 120 %s up --dir %s --size 1048576G --detach 2>&1",
                    ft_ferry_bin(), sub);
    print_message("ferry up --size 1048576G -> %d: %s", st, out);
    bool started = access(sub, F_OK) == 0;
    if (st == 0)
        ft_run(out + 4096, 4096, "%s down --dir %s", ft_ferry_bin(), sub);
    rm_rf(dir);
    assert_int_equal(st, 1);
    assert_non_null(strstr(out, "--size 1024 TiB is more than"));
    assert_non_null(strstr(out, "MemAvailable is "));
    assert_non_null(strstr(out, "cgroup"));
    assert_false(started);   /* not even the state directory was made */
}

/* How many processes (of anyone) have dir in their command line. */
static size_t procs_naming(const char *dir)
{
    size_t n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char *end, cmd[8192];
        long pid = strtol(e->d_name, &end, 10);
        if (!*end && pid > 0 && ft_proc_cmdline((pid_t)pid, cmd, sizeof cmd) == 0 &&
            strstr(cmd, dir))
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

/* The node dies at start: `ferry up` says how (its exit status, or the
 * signal that killed it) and shows the end of node.log, and leaves nothing
 * running. Here a node that exits: it cannot listen (FERRY_LISTEN is a bad
 * address). */
static void test_node_exits_at_start(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-nodeexit-test-XXXXXX", out[8192];
    assert_non_null(mkdtemp(dir));
    const char *bin = ft_ferry_bin();
    int st = ft_run(out, sizeof out, "FERRY_LISTEN=256.0.0.1:1 %s up --dir %s --size 32M --detach 2>&1",
                    bin, dir);
    print_message("node exits at start -> %d: %s", st, out);
    for (int i = 0; i < 500 && procs_naming(dir); i++)
        sleep_ms(10);
    size_t left = procs_naming(dir);
    if (st == 0)   /* it came up after all: stop it before failing */
        ft_run(out + 4096, 4096, "%s down --dir %s", bin, dir);
    rm_rf(dir);
    assert_int_equal(st, 1);
    assert_non_null(strstr(out, "the node exited with status 1 at start"));
    assert_non_null(strstr(out, "node.log:"));
    assert_non_null(strstr(out, "ferry node: cannot start"));   /* the log's last line */
    assert_int_equal(left, 0);
}

/* The node killed with SIGKILL before it was ready: found among up's
 * children and killed while it faults in its 512 MiB; a run where it was
 * ready first is redone. */
static void test_node_killed_at_start(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-nodekill-test-XXXXXX", out[8192];
    assert_non_null(mkdtemp(dir));
    const char *bin = ft_ferry_bin();
    bool killed = false, said = true;
    for (int attempt = 0; attempt < 5 && !killed; attempt++) {
        char log[300];
        snprintf(log, sizeof log, "%s/up.out", dir);
        pid_t up = fork();
        if (up == 0) {
            int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            dup2(fd, 1);
            dup2(fd, 2);
            execl(bin, "ferry", "up", "--dir", dir, "--size", "512M", "--detach", (char *)NULL);
            _exit(127);
        }
        assert_true(up > 0);
        pid_t node = 0;
        for (int w = 0; w < 30000 && !node; w++) {   /* 30 s */
            pid_t kids[16];
            size_t n = ft_children(up, kids, 16);
            for (size_t i = 0; i < n; i++) {
                char cmd[8192];
                if (ft_proc_cmdline(kids[i], cmd, sizeof cmd) == 0 && !strncmp(cmd, "ferry node ", 11))
                    node = kids[i];
            }
            if (!node)
                usleep(1000);
        }
        if (node)
            kill(node, SIGKILL);
        int ws = 0;
        if (ft_wait_status(up, 120000, &ws) < 0) {
            kill(up, SIGKILL);
            waitpid(up, &ws, 0);
        }
        killed = node && WIFEXITED(ws) && WEXITSTATUS(ws) == 1;
        print_message("attempt %d: node %d killed, ferry up -> %d %s\n", attempt, (int)node,
                      WEXITSTATUS(ws), file_has(log, "SIGKILL") ? "(says SIGKILL)" : "");
        if (killed)   /* the hint, or what the kernel says; and the log */
            said = file_has(log, "the node was killed by SIGKILL at start") &&
                   file_has(log, "out of memory") && file_has(log, "node.log");
        else
            ft_run(out, sizeof out, "%s down --dir %s", bin, dir);
    }
    for (int i = 0; i < 500 && procs_naming(dir); i++)
        sleep_ms(10);
    size_t left = procs_naming(dir);
    ft_run(out, sizeof out, "%s down --dir %s", bin, dir);   /* whatever a failed run left */
    rm_rf(dir);
    assert_true(killed);
    assert_true(said);
    assert_int_equal(left, 0);
}

/* SIGTERM while the cluster starts (the master up, the node not yet
 * ready): `ferry up` stops what it started and exits 0, nothing left
 * running. Before, the signal's default action killed `ferry up` alone
 * and left the master and the node running, orphaned. A run where the
 * node was ready first is redone. */
static void test_up_signal_while_starting(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-upsig-test-XXXXXX", out[8192], addrf[300], readyf[300];
    assert_non_null(mkdtemp(dir));
    snprintf(addrf, sizeof addrf, "%s/master.addr", dir);
    snprintf(readyf, sizeof readyf, "%s/node.ready", dir);
    const char *bin = ft_ferry_bin();
    bool early = false;
    int ws = 0, w = 0;
    for (int attempt = 0; attempt < 5 && !early; attempt++) {
        pid_t up = fork();
        if (up == 0) {
            int fd = open("/dev/null", O_WRONLY);
            dup2(fd, 1);
            dup2(fd, 2);
            execl(bin, "ferry", "up", "--dir", dir, "--size", "512M", (char *)NULL);
            _exit(127);
        }
        assert_true(up > 0);
        for (int i = 0; i < 30000 && access(addrf, F_OK) != 0; i++)   /* 30 s */
            usleep(1000);
        early = access(readyf, F_OK) != 0;   /* the node not ready yet */
        kill(up, SIGTERM);
        w = ft_wait_status(up, 120000, &ws);
        if (w < 0) {
            kill(up, SIGKILL);
            waitpid(up, &ws, 0);
        }
        print_message("attempt %d: SIGTERM %s the node was ready -> %d\n", attempt,
                      early ? "before" : "after", WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    }
    for (int i = 0; i < 500 && procs_naming(dir); i++)
        sleep_ms(10);
    size_t left = procs_naming(dir);
    if (left)
        ft_run(out, sizeof out, "pkill -f %s", dir);
    rm_rf(dir);
    assert_true(early);
    assert_int_equal(w, 0);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    assert_int_equal(left, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_up_status_down),
        cmocka_unit_test(test_down_stale_pids),
        cmocka_unit_test(test_second_up_changes_nothing),
        cmocka_unit_test(test_second_up_foreground),
        cmocka_unit_test(test_up_signal_while_starting),
        cmocka_unit_test(test_size_refused),
        cmocka_unit_test(test_node_exits_at_start),
        cmocka_unit_test(test_node_killed_at_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
