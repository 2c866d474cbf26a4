/* Replicated masters (ferry master --etcd): two `ferry master` processes of
 * one cluster on a real etcd; the first leads and serves, the second
 * follows as a standby and does not listen. A client given both addresses
 * writes; the leader is killed with SIGKILL (its machine gone); the standby
 * takes over within the lease TTL and every acknowledged write is there.
 * The leader killed again and again under the whole workload is
 * test_store_ha_kill. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "store/ha_log.h"
#include "util/ftetcd.h"
#include "util/ftstore.h"

typedef struct member { char port[32], dir[64], mdir[96]; ft_peer p; } member;

/* etcd and the two masters' ports and directories; the teardown kills
 * whatever runs and removes every directory, also after a failed
 * assertion. */
typedef struct env { ft_etcd e; member ms[2]; } env;

static int setup(void **state)
{
    env *v = calloc(1, sizeof *v);
    *state = v;
    if (!v || ft_etcd_start(&v->e) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        member *m = &v->ms[i];
        m->p.pid = -1;
        snprintf(m->port, sizeof m->port, "127.0.0.1:%d", ft_free_port());
        snprintf(m->dir, sizeof m->dir, "/tmp/ferry-store-test-XXXXXX");
        if (!mkdtemp(m->dir)) {
            m->dir[0] = 0;
            return -1;
        }
        char md[sizeof m->mdir];   /* via a buffer of its own: the sanitizer build's
                                    * -Werror=restrict sees one object in m */
        snprintf(md, sizeof md, "%s/master", m->dir);
        memcpy(m->mdir, md, sizeof md);
    }
    return 0;
}

static int teardown(void **state)
{
    env *v = *state;
    if (!v)
        return 0;
    char cmd[160];
    for (int i = 0; i < 2; i++) {
        ft_proc_kill(&v->ms[i].p, SIGKILL);
        if (v->ms[i].dir[0]) {
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", v->ms[i].dir);
            if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", v->ms[i].dir);
        }
    }
    ft_etcd_stop(&v->e);
    free(v);
    return 0;
}

/* ttl: --ha-ttl (the tests that measure no failover take 10 s: 2 s leases
 * lapse beside the whole suite on 2 cores); ckpt: --checkpoint-records
 * (NULL: the default): a snapshot into etcd, and the log below it
 * truncated, every ckpt records. */
static void start_member_ckpt(member *m, const char *url, const char *ttl, const char *ckpt)
{
    const char *args[] = { "master", "--dir", m->mdir, "--listen", m->port, "--etcd", url,
                           "--cluster", "k", "--ha-ttl", ttl, ckpt ? "--checkpoint-records" : NULL,
                           ckpt, NULL };
    assert_int_equal(ft_spawn_exe(&m->p, NULL, ft_ferry_bin(), args), 0);
}

static void start_member(member *m, const char *url)
{
    start_member_ckpt(m, url, "2", NULL);
}

static void wait_listening(member *m)
{
    char line[512] = "";
    assert_int_equal(ft_read_line(&m->p, line, sizeof line, 60000), 0);
    assert_non_null(strstr(line, "listening on"));
}

/* A client config naming both masters. */
static void both(const env *v, ferry_store_config *cfg)
{
    ft_cluster any;
    memset(&any, 0, sizeof any);
    snprintf(any.addr, sizeof any.addr, "%s", v->ms[0].port);
    ft_store_config(&any, cfg);
    snprintf(cfg->master, sizeof cfg->master, "%s,%s", v->ms[0].port, v->ms[1].port);
}

static void test_failover(void **state)
{
    env *v = *state;
    start_member(&v->ms[0], v->e.url);
    wait_listening(&v->ms[0]);                    /* it leads: it listens */
    start_member(&v->ms[1], v->e.url);            /* the standby: it follows, does not listen */
    ferry_store_config cfg;
    both(v, &cfg);
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    enum { N = 300 };
    char k[32], val[32];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "acked/%d", i);
        snprintf(val, sizeof val, "v%d", i * 7);
        assert_int_equal(ferry_kv_put(s, k, val, strlen(val), NULL, &err), 0);   /* acknowledged */
    }
    uint64_t t0 = fr_now_ns();
    ft_proc_kill(&v->ms[0].p, SIGKILL);
    wait_listening(&v->ms[1]);
    double listening = (double)(fr_now_ns() - t0) / 1e9;
    uint64_t deadline = fr_deadline_ns(30000);
    int rc = -1;
    while (fr_ms_left(deadline) > 0 && (rc = ferry_kv_put(s, "after", "1", 1, NULL, NULL)) != 0) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
    }
    double acked = (double)(fr_now_ns() - t0) / 1e9;
    assert_int_equal(rc, 0);
    fprintf(stderr, "leader killed: the standby listened after %.2f s, the first write was "
            "acknowledged by it after %.2f s (TTL 2 s)\n", listening, acked);
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "acked/%d", i);
        snprintf(val, sizeof val, "v%d", i * 7);
        ferry_kv_value kv;
        assert_int_equal(ferry_kv_get(s, k, &kv, &err), 0);
        assert_int_equal(kv.len, strlen(val));
        assert_memory_equal(kv.val, val, kv.len);
        ferry_store_free(kv.val);
    }
    ferry_store_close(s);
}

/* Bad input: a master of another cluster token started on a cluster in
 * etcd is refused with a sentence naming both fingerprints; the leader
 * keeps serving. */
static void test_other_token_refused(void **state)
{
    env *v = *state;
    start_member_ckpt(&v->ms[0], v->e.url, "10", NULL);
    wait_listening(&v->ms[0]);
    static char out[8192];
    int st = ft_run(out, sizeof out, "FERRY_TOKEN_FILE= FERRY_TOKEN=another-token %s master --dir "
                    "%s --listen %s --etcd %s --cluster k 2>&1", ft_ferry_bin(), v->ms[1].mdir,
                    v->ms[1].port, v->e.url);
    fprintf(stderr, "a master of another token -> %d: %s", st, out);
    assert_int_equal(st, 1);
    assert_non_null(strstr(out, "another cluster token"));
    ferry_store_config cfg;
    both(v, &cfg);
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    assert_int_equal(ferry_kv_put(s, "still", "1", 1, NULL, &err), 0);
    ferry_store_close(s);
}

/* Bad input: a standby the log was truncated past (stopped while the
 * leader wrote snapshots and truncated the log below them) loads the
 * snapshot again by itself; when the leader is killed it leads with every
 * acknowledged write. */
static void test_standby_truncated_past(void **state)
{
    env *v = *state;
    start_member_ckpt(&v->ms[0], v->e.url, "10", "40");
    wait_listening(&v->ms[0]);
    start_member_ckpt(&v->ms[1], v->e.url, "10", "40");
    ferry_store_config cfg;
    both(v, &cfg);
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    char k[32], val[32];
    assert_int_equal(ferry_kv_put(s, "t/first", "1", 1, NULL, &err), 0);
    /* the standby follows (the leader lists its report) before it is stopped */
    bool following = false;
    for (uint64_t dl = fr_deadline_ns(60000); !following && fr_ms_left(dl);) {
        char *text = NULL;
        if (ferry_store_status_json(s, &text, NULL) == 0)
            following = strstr(text, v->ms[1].port) != NULL;
        ferry_store_free(text);
        struct timespec ts = { 0, 20 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
    }
    assert_true(following);
    ft_peer_signal(&v->ms[1].p, SIGSTOP);        /* the standby falls behind */
    enum { N = 400 };
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "t/%d", i);
        snprintf(val, sizeof val, "w%d", i);
        assert_int_equal(ferry_kv_put(s, k, val, strlen(val), NULL, &err), 0);
    }
    /* the leader's snapshots moved past what the stopped standby applied
     * (a few entries at most) and the log below them is gone */
    fr_ha_elect *probe = ft_ha_candidate(&v->e, "k", "probe", 10);
    uint64_t snap = 0;
    assert_int_equal(fr_ha_snapshot_seq(probe, &snap, &err), 0);
    fr_ha_close(probe);
    fprintf(stderr, "the cluster's snapshot follows log entry %llu\n", (unsigned long long)snap);
    assert_true(snap > 100);
    ft_peer_signal(&v->ms[1].p, SIGCONT);
    ft_proc_kill(&v->ms[0].p, SIGKILL);
    wait_listening(&v->ms[1]);                   /* it did not stop on the missing entries */
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "t/%d", i);
        snprintf(val, sizeof val, "w%d", i);
        ferry_kv_value kv;
        uint64_t deadline = fr_deadline_ns(60000);
        int rc;
        while ((rc = ferry_kv_get(s, k, &kv, &err)) != 0 && rc != FERRY_ENOENT && fr_ms_left(deadline)) {
            struct timespec ts = { 0, 20 * 1000 * 1000 };   /* retried until a deadline */
            nanosleep(&ts, NULL);
        }
        assert_int_equal(rc, 0);
        assert_int_equal(kv.len, strlen(val));
        assert_memory_equal(kv.val, val, kv.len);
        ferry_store_free(kv.val);
    }
    ferry_store_close(s);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_failover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_token_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_standby_truncated_past, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
