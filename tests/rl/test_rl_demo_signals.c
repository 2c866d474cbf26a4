/* `ferry-lab demo` and `ferry-lab demo rl` ended by SIGINT and by SIGTERM in the
 * middle of a run, through the built binary: the process ends by that
 * signal, its temporary directories (the cluster's /tmp/ferry-demo-*, the
 * weight demo's /tmp/ferry-counters-*) are gone, and none of the processes
 * it started (master, node, trainers, rollouts, update processes) still
 * runs. Ended by SIGKILL, which nothing can handle: the children end, the
 * directories stay, and the next demo removes them (their owner is gone)
 * before it makes its own. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/ftstore.h"

enum { KIDS = 64 };

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* The path that follows `flag` in a command line, up to `suffix`. */
static bool path_after(const char *cmd, const char *flag, const char *suffix, char *out,
                       size_t cap)
{
    const char *p = strstr(cmd, flag);
    if (!p)
        return false;
    p += strlen(flag);
    const char *e = strstr(p, suffix);
    if (!e || (size_t)(e - p) >= cap)
        return false;
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = 0;
    return true;
}

/* FERRY_DEMO_STATS in a process's environment (the counters dir). */
static bool stats_dir(pid_t pid, char *out, size_t cap)
{
    char path[64], env[16384];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(env, 1, sizeof env - 1, f);
    fclose(f);
    env[n] = 0;
    for (size_t i = 0; i < n; i += strlen(env + i) + 1)
        if (!strncmp(env + i, "FERRY_DEMO_STATS=", 17)) {
            snprintf(out, cap, "%s", env + i + 17);
            return true;
        }
    return false;
}

/* Run `ferry ARGS`, wait until a child whose command is `role` runs (the
 * demo is in the middle of its work), send sig, and check what is left. */
static void interrupted(const char *what, const char *const *args, const char *role, int sig,
                        bool counters)
{
    unsetenv("FERRY_MASTER");   /* the demo's own cluster, in its own temp dir */
    ft_peer p;
    assert_int_equal(ft_spawn_exe(&p, NULL, ft_lab_bin(), args), 0);
    pid_t kids[KIDS];
    unsigned long long start[KIDS];
    size_t n = 0;
    char dir[256] = "", cdir[256] = "";
    bool ready = false;
    for (int w = 0; w < 12000 && !ready; w++) {   /* 120 s */
        n = ft_children(p.pid, kids, KIDS);
        bool has_role = false;
        for (size_t i = 0; i < n; i++) {
            char cmd[8192];
            if (ft_proc_cmdline(kids[i], cmd, sizeof cmd) < 0)
                continue;
            if (!dir[0])
                path_after(cmd, " master --dir ", "/master", dir, sizeof dir);
            if (strstr(cmd, role)) {
                has_role = true;
                if (counters && !cdir[0])
                    stats_dir(kids[i], cdir, sizeof cdir);
            }
        }
        ready = has_role && dir[0] && (!counters || cdir[0]);
        if (!ready)
            sleep_ms(10);
    }
    if (!ready) {   /* stop it before failing: a SIGINT lets it clean up after itself */
        kill(p.pid, SIGINT);
        if (ft_wait_status(p.pid, 60000, &(int){0}) < 0) {
            kill(p.pid, SIGKILL);
            waitpid(p.pid, NULL, 0);
        }
        p.pid = -1;
        ft_peer_stop(&p);
    }
    assert_true(ready);
    n = ft_children(p.pid, kids, KIDS);
    for (size_t i = 0; i < n; i++)
        start[i] = ft_proc_start(kids[i]);
    assert_int_equal(access(dir, F_OK), 0);
    print_message("%s: %zu children, %s%s%s; sending SIG%s\n", what, n, dir,
                  cdir[0] ? " and " : "", cdir, sigabbrev_np(sig));
    assert_int_equal(kill(p.pid, sig), 0);
    int st = 0;
    int w = ft_wait_status(p.pid, 60000, &st);
    if (w < 0)
        kill(p.pid, SIGKILL);
    p.pid = -1;
    ft_peer_stop(&p);
    assert_int_equal(w, 0);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), sig);
    size_t alive = 0;
    for (int t = 0; t < 1000; t++) {   /* their exits may still be on the way: 10 s */
        alive = 0;
        for (size_t i = 0; i < n; i++)
            alive += ft_proc_alive(kids[i], start[i]);
        if (!alive)
            break;
        sleep_ms(10);
    }
    bool dir_left = access(dir, F_OK) == 0, cdir_left = cdir[0] && access(cdir, F_OK) == 0;
    print_message("after SIG%s: %zu of %zu children still run; %s %s; %s %s\n",
                  sigabbrev_np(sig), alive, n, dir, dir_left ? "is still there" : "is gone",
                  cdir[0] ? cdir : "(no counters dir)", cdir_left ? "is still there" : "");
    if (sig == SIGKILL && dir_left) {
        /* the next demo sweeps what this one left */
        static const char *const next[] = { "demo", "--bytes", "8M", "--trainers", "1",
                                            "--rollouts", "1", "--generations", "1", NULL };
        ft_peer q;
        assert_int_equal(ft_spawn_exe(&q, NULL, ft_lab_bin(), next), 0);
        int qs = 0;
        int qw = ft_wait_status(q.pid, 120000, &qs);
        if (qw < 0)
            kill(q.pid, SIGINT);
        q.pid = qw < 0 ? q.pid : -1;
        ft_peer_stop(&q);
        bool swept = access(dir, F_OK) != 0 && !(cdir[0] && access(cdir, F_OK) == 0);
        print_message("the next demo (exit %d): %s\n", qw == 0 && WIFEXITED(qs) ? WEXITSTATUS(qs) : -1,
                      swept ? "removed what the killed one left" : "left them");
        assert_true(swept);
        dir_left = cdir_left = false;
        assert_int_equal(qw, 0);
    } else if (sig == SIGKILL) {
        fail_msg("SIGKILL left nothing to sweep: %s", dir);
    }
    if (dir_left) {   /* leave no trace of a failed run either */
        char out[256];
        ft_run(out, sizeof out, "rm -rf '%s'", dir);
    }
    if (cdir_left) {
        char out[256];
        ft_run(out, sizeof out, "rm -rf '%s'", cdir);
    }
    assert_int_equal(alive, 0);
    assert_false(dir_left);
    assert_false(cdir_left);
}

static const char *const demo_args[] = { "demo", "--bytes", "48M", "--trainers", "2",
                                         "--rollouts", "2", "--generations", "64", NULL };
static const char *const rl_args[] = { "demo", "rl", "--rollouts", "1", "--steps", "100000",
                                       "--batch", "8", "--tokens", "16", "--weights", "1M", NULL };

static void test_demo_sigint(void **state)
{
    (void)state;
    interrupted("ferry-lab demo", demo_args, "worker rollout ", SIGINT, true);
}

static void test_demo_sigterm(void **state)
{
    (void)state;
    interrupted("ferry-lab demo", demo_args, "worker rollout ", SIGTERM, true);
}

static void test_demo_rl_sigint(void **state)
{
    (void)state;
    interrupted("ferry-lab demo rl", rl_args, "worker rl-rollout ", SIGINT, false);
}

static void test_demo_rl_sigterm(void **state)
{
    (void)state;
    interrupted("ferry-lab demo rl", rl_args, "worker rl-rollout ", SIGTERM, false);
}

/* The SIGKILL runs in a TMPDIR of their own: any demo sweeps what a killed
 * one left in its TMPDIR, so a demo of another test running beside this
 * one could sweep it before this test looks. Made by the setup, removed by
 * the teardown (which runs when the test fails too). */
static char g_tmp[64], g_was_tmp[256];
static bool g_had_tmp;

static int own_tmpdir(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ferry-sigkill-XXXXXX");
    const char *was = getenv("TMPDIR");
    g_had_tmp = was != NULL;
    snprintf(g_was_tmp, sizeof g_was_tmp, "%s", was ? was : "");
    return mkdtemp(g_tmp) && setenv("TMPDIR", g_tmp, 1) == 0 ? 0 : -1;
}

static int drop_tmpdir(void **state)
{
    (void)state;
    char out[256];
    if (g_had_tmp)
        setenv("TMPDIR", g_was_tmp, 1);
    else
        unsetenv("TMPDIR");
    return ft_run(out, sizeof out, "rm -rf '%s'", g_tmp) == 0 ? 0 : -1;
}

static void test_demo_sigkill(void **state)
{
    (void)state;
    interrupted("ferry-lab demo", demo_args, "worker rollout ", SIGKILL, true);
}

static void test_demo_rl_sigkill(void **state)
{
    (void)state;
    interrupted("ferry-lab demo rl", rl_args, "worker rl-rollout ", SIGKILL, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_sigint),
        cmocka_unit_test(test_demo_sigterm),
        cmocka_unit_test(test_demo_rl_sigint),
        cmocka_unit_test(test_demo_rl_sigterm),
        cmocka_unit_test_setup_teardown(test_demo_sigkill, own_tmpdir, drop_tmpdir),
        cmocka_unit_test_setup_teardown(test_demo_rl_sigkill, own_tmpdir, drop_tmpdir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
