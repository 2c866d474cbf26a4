/* `ferry-lab cluster` (docs/lab.md): a 3-host lab comes up with a master
 * and a node per host, its link check reports a rate, a client inside a
 * host reaches the master, and teardown leaves nothing; the lab killed at
 * random points (SIGTERM, SIGINT, and SIGKILL followed by `cluster clean`)
 * leaves nothing; bad input, no root and a host whose master dies at start
 * exit with a clear message and create nothing. Needs root (it creates
 * network namespaces); otherwise it skips and says why. No timing is
 * asserted: the link check's figures are printed. */
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/ftlab.h"
#include "util/testutil.h"
#include "util/ftstore.h"

#define DEADLINE_MS (300 * 1000)   /* a backstop far above a lab's setup and teardown under load */

static char tmp[256];


/* `ferry-lab ARGS...` in the background, stdout and stderr into log. */
static pid_t lab_start(const char *log, const char *env_bin, const char *const *args)
{
    pid_t p = fork();
    if (p == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1), dup2(fd, 2);
        if (env_bin)
            setenv("FERRY_BIN", env_bin, 1);
        const char *argv[32] = { "ferry-lab" };
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = args[i];
        execv(ft_lab_bin(), (char *const *)argv);
        _exit(127);
    }
    return p;
}

static int lab_exit(pid_t p)
{
    int st = 0;
    if (ft_wait_status(p, DEADLINE_MS, &st) < 0)
        fail_msg("the lab (pid %d) did not exit", (int)p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void slurp(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = 0;
    if (f)
        fclose(f);
}


/* Wait (deadline) for the ready file; false when the lab exited first. */
static bool wait_ready(const char *file, pid_t p)
{
    for (int i = 0; i < DEADLINE_MS / 20; i++) {
        if (access(file, R_OK) == 0)
            return true;
        if (kill(p, 0) < 0)
            return false;
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return false;
}

static void test_up_reach_teardown(void **state)
{
    (void)state;
    ft_lab_need_root();
    char log[300], out[1 << 16];
    snprintf(log, sizeof log, "%s/up.log", tmp);
    const char *args[] = { "cluster", "up", "--hosts", "3", "--rate", "100mbit", "--check-seconds",
                           "1", "--run", "ferry status --dir \"$FERRY_LAB_DIR\" && echo reached-from-$FERRY_LAB_HOST",
                           NULL };
    pid_t p = lab_start(log, NULL, args);
    int rc = lab_exit(p);
    slurp(log, out, sizeof out);
    fprintf(stderr, "%s", out);
    assert_int_equal(rc, 0);
    for (int h = 0; h < 3; h++) {   /* each host's link, both ways, and the client in each host */
        char want[64];
        snprintf(want, sizeof want, "host %d down link", h);
        assert_non_null(strstr(out, want));
        snprintf(want, sizeof want, "reached-from-%d", h);
        assert_non_null(strstr(out, want));
    }
    const char *w = strstr(out, "link check: worst link ");
    assert_non_null(w);
    assert_true(atof(w + strlen("link check: worst link ")) > 0);
    assert_non_null(strstr(out, "nodes 3"));
    assert_non_null(strstr(out, "cpu: busiest second used "));
    assert_int_equal(ft_lab_leftovers(p, NULL), 0);
}

/* Killed at random points, setup included: nothing is left. */
static void test_killed_anywhere(void **state)
{
    (void)state;
    ft_lab_need_root();
    srand((unsigned)getpid());
    for (int it = 0; it < 6; it++) {
        char log[300], ready[300], out[1 << 16];
        snprintf(log, sizeof log, "%s/kill%d.log", tmp, it);
        snprintf(ready, sizeof ready, "%s/ready%d", tmp, it);
        const char *args[] = { "cluster", "up", "--hosts", "2", "--rate", "50mbit", "--check-seconds",
                               "0.3", "--ready-file", ready, NULL };
        pid_t p = lab_start(log, NULL, args);
        int sig = it % 2 ? SIGINT : SIGTERM;
        if (it == 5) {   /* once fully up */
            assert_true(wait_ready(ready, p));
            char n[64];
            ft_run(n, sizeof n, "ip netns list | grep -c '^fl%d-'", (int)p);
            assert_int_equal(atoi(n), 3);   /* the switch and two hosts */
        } else {   /* somewhere in the setup: namespaces, shaping, link check, processes */
            struct timespec ts = { 0, (long)(rand() % 1000) * 1000 * 1000 * (it + 1) / 2 };
            while (ts.tv_nsec >= 1000000000L)
                ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            nanosleep(&ts, NULL);
        }
        kill(p, sig);
        int rc = lab_exit(p);
        slurp(log, out, sizeof out);
        fprintf(stderr, "iteration %d (%s): exit %d, last output: %.300s\n", it,
                sig == SIGINT ? "SIGINT" : "SIGTERM", rc, out + (strlen(out) > 300 ? strlen(out) - 300 : 0));
        assert_int_equal(ft_lab_leftovers(p, ready), 0);
    }
    /* SIGKILL: nothing runs the teardown; `cluster clean --prefix` does */
    char log[300], ready[300], out[4096];
    snprintf(log, sizeof log, "%s/sigkill.log", tmp);
    snprintf(ready, sizeof ready, "%s/ready-k", tmp);
    const char *args[] = { "cluster", "up", "--hosts", "2", "--rate", "50mbit", "--check-seconds",
                           "0.3", "--ready-file", ready, NULL };
    pid_t p = lab_start(log, NULL, args);
    assert_true(wait_ready(ready, p));
    kill(p, SIGKILL);
    lab_exit(p);
    assert_true(ft_lab_leftovers(p, ready) > 0);
    assert_int_equal(ft_run(out, sizeof out, "%s cluster clean --prefix fl%d", ft_lab_bin(), (int)p), 0);
    fprintf(stderr, "clean: %s", out);
    unlink(ready);
    assert_int_equal(ft_lab_leftovers(p, ready), 0);
}

/* Bad input and no root: status 2, the reason, nothing created. A master
 * that dies at start: status 1, the host and why, nothing left. */
static void test_refusals(void **state)
{
    (void)state;
    ft_lab_need_root();
    static const struct { const char *args[12]; const char *want; } cases[] = {
        { { "cluster", "up", "--hosts", "1", "--rate", "10mbit" }, "--hosts wants a whole number from 2 to 16" },
        { { "cluster", "up", "--hosts", "17", "--rate", "10mbit" }, "--hosts wants a whole number from 2 to 16" },
        { { "cluster", "check", "--rate", "0mbit" }, "--rate 0mbit is outside" },
        { { "cluster", "check", "--rate", "0" }, "unknown unit" },
        { { "cluster", "check", "--rate", "10furlong" }, "unknown unit 'furlong'" },
        { { "cluster", "check" }, "wants --rate" },
        { { "cluster", "up", "--rate", "10mbit", "--node-size", "1000G" }, "available memory" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char log[300], out[8192];
        snprintf(log, sizeof log, "%s/bad%zu.log", tmp, i);
        pid_t p = lab_start(log, NULL, cases[i].args);
        assert_int_equal(lab_exit(p), 2);
        slurp(log, out, sizeof out);
        if (!strstr(out, cases[i].want))
            fail_msg("case %zu: '%s' not in: %s", i, cases[i].want, out);
        assert_int_equal(ft_lab_leftovers(p, NULL), 0);
    }
    char out[8192];
    if (system("command -v setpriv >/dev/null") == 0) {
        int rc = ft_run(out, sizeof out, "setpriv --reuid 65534 --regid 65534 --clear-groups %s cluster "
                        "check --rate 10mbit 2>&1", ft_lab_bin());
        fprintf(stderr, "not root: %d %s", rc, out);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, "needs root"));
    } else {
        fprintf(stderr, "setpriv is missing: the not-root case is not run\n");
    }
    char log[300];
    snprintf(log, sizeof log, "%s/dies.log", tmp);
    const char *args[] = { "cluster", "up", "--hosts", "2", "--rate", "50mbit", "--check-seconds", "0.3", NULL };
    pid_t p = lab_start(log, "/bin/false", args);
    assert_int_equal(lab_exit(p), 1);
    slurp(log, out, sizeof out);
    fprintf(stderr, "%s", out);
    assert_non_null(strstr(out, "host 0: the master exited at start"));
    assert_int_equal(ft_lab_leftovers(p, NULL), 0);
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/ferry-test-lab-XXXXXX");
    if (!mkdtemp(tmp))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_up_reach_teardown),
        cmocka_unit_test(test_killed_anywhere),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
