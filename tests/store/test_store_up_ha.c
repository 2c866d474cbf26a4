/* `ferry up --ha` through the built binary: a local etcd, two replicated
 * masters and a node; a client given the printed FERRY_MASTER writes, the
 * leader is killed with SIGKILL, the standby takes over (every
 * acknowledged write there), the killed master is started again as a
 * standby; Ctrl-C (SIGTERM) stops everything and removes DIR/ha. The
 * teardown kills whatever the test saw started, also after a failed
 * assertion. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "util/ftstore.h"

enum { SEEN_MAX = 8, LINE_MS = 120000 };

typedef struct env {
    char dir[64];
    ft_peer up;
    pid_t seen[SEEN_MAX];              /* etcd and masters it said it started */
    unsigned long long start[SEEN_MAX];
    int nseen;
} env;

static int setup(void **state)
{
    env *v = calloc(1, sizeof *v);
    *state = v;
    if (!v)
        return -1;
    v->up.pid = -1;
    snprintf(v->dir, sizeof v->dir, "/tmp/ferry-up-ha-test-XXXXXX");
    return mkdtemp(v->dir) ? 0 : -1;
}

static int teardown(void **state)
{
    env *v = *state;
    if (!v)
        return 0;
    ft_proc_kill(&v->up, SIGTERM);   /* it stops its own children */
    for (int i = 0; i < v->nseen; i++)
        if (ft_proc_alive(v->seen[i], v->start[i]))
            kill(v->seen[i], SIGKILL);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", v->dir);
    if (v->dir[0] && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", v->dir);
    free(v);
    return 0;
}

static void saw(env *v, pid_t p)
{
    assert_true(p > 0 && v->nseen < SEEN_MAX);
    v->start[v->nseen] = ft_proc_start(p);
    v->seen[v->nseen++] = p;
}

/* Lines of `ferry up` until one holds want (the test fails past LINE_MS). */
static void read_until(env *v, const char *want, char *line, size_t cap)
{
    for (;;) {
        assert_int_equal(ft_read_line(&v->up, line, cap, LINE_MS), 0);
        print_message("ferry up: %s\n", line);
        if (strstr(line, want))
            return;
    }
}

static int put_retry(ferry_store *s, int i)
{
    char k[32], val[32];
    snprintf(k, sizeof k, "up-ha/%d", i);
    snprintf(val, sizeof val, "v%d", i * 5);
    uint64_t deadline = fr_deadline_ns(60000);
    int rc;
    while ((rc = ferry_kv_put(s, k, val, strlen(val), NULL, NULL)) != 0 && fr_ms_left(deadline)) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
    }
    return rc;
}

static void test_up_ha_failover(void **state)
{
    env *v = *state;
    const char *args[] = { "up", "--ha", "--dir", v->dir, "--size", "32M", NULL };
    assert_int_equal(ft_spawn_exe(&v->up, NULL, ft_ferry_bin(), args), 0);
    char line[1024], masters[sizeof ((ferry_store_config *)0)->master] = "", url[64];
    int epid = 0, p0 = 0, p1 = 0;
    read_until(v, "ferry up --ha: etcd at", line, sizeof line);
    const char *at = strstr(line, "etcd at ");
    assert_int_equal(sscanf(at, "etcd at %63s (pid %d)", url, &epid), 2);
    at = strstr(line, "leads (pid ");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "leads (pid %d)", &p0), 1);
    at = strstr(line, "standby (pid ");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "standby (pid %d)", &p1), 1);
    saw(v, epid);
    saw(v, p0);
    saw(v, p1);
    read_until(v, "export FERRY_MASTER=", line, sizeof line);
    assert_int_equal(sscanf(strstr(line, "FERRY_MASTER="), "FERRY_MASTER=%127s", masters), 1);
    assert_non_null(strchr(masters, ','));   /* both masters */

    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", masters);
    char tok[128];
    snprintf(tok, sizeof tok, "%s/token", v->dir);
    assert_int_equal(ferry_engine_config_token_file(&cfg.engine, tok, NULL), 0);
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    enum { N = 40 };
    for (int i = 0; i < N; i++)
        assert_int_equal(put_retry(s, i), 0);
    kill(p0, SIGKILL);                               /* the leader's machine gone */
    for (int i = N; i < 2 * N; i++)
        assert_int_equal(put_retry(s, i), 0);        /* acknowledged by the standby */
    for (int i = 0; i < 2 * N; i++) {
        char k[32], val[32];
        snprintf(k, sizeof k, "up-ha/%d", i);
        snprintf(val, sizeof val, "v%d", i * 5);
        ferry_kv_value kv;
        assert_int_equal(ferry_kv_get(s, k, &kv, &err), 0);
        assert_int_equal(kv.len, strlen(val));
        assert_memory_equal(kv.val, val, kv.len);
        ferry_store_free(kv.val);
    }
    ferry_store_close(s);
    read_until(v, "started it again as a standby (pid ", line, sizeof line);
    int p2 = 0;
    assert_int_equal(sscanf(strstr(line, "standby (pid "), "standby (pid %d)", &p2), 1);
    saw(v, p2);

    /* Ctrl-C: everything it started stops, DIR/ha goes. */
    ft_peer_signal(&v->up, SIGTERM);
    int st = -1;
    assert_int_equal(ft_wait_status(v->up.pid, 60000, &st), 0);
    v->up.pid = -1;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int i = 0; i < v->nseen; i++)
        assert_false(ft_proc_alive(v->seen[i], v->start[i]));
    char ha[128];
    struct stat sb;
    snprintf(ha, sizeof ha, "%s/ha", v->dir);
    assert_int_not_equal(stat(ha, &sb), 0);
}

/* --ha is the foreground's: with --detach it is a usage error, nothing started. */
static void test_up_ha_detach_refused(void **state)
{
    env *v = *state;
    char out[2048];
    int st = ft_run(out, sizeof out, "%s up --ha --detach --dir %s --size 32M 2>&1", ft_ferry_bin(),
                    v->dir);
    print_message("ferry up --ha --detach -> %d: %s", st, out);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "--ha runs in the foreground"));
    char ha[128];
    struct stat sb;
    snprintf(ha, sizeof ha, "%s/ha", v->dir);
    assert_int_not_equal(stat(ha, &sb), 0);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_up_ha_failover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_up_ha_detach_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
