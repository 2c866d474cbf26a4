/* Replicated masters (ferry master --etcd): two `ferry master` processes of
 * one cluster on a real etcd; the first leads and serves, the second
 * follows as a standby and does not listen. A client given both addresses
 * writes; the leader is killed with SIGKILL (its machine gone); the standby
 * takes over within the lease TTL and every acknowledged write is there. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "util/ftetcd.h"
#include "util/ftstore.h"

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void test_failover(void **state)
{
    (void)state;
    ft_etcd e;
    assert_int_equal(ft_etcd_start(&e), 0);
    char pa[32], pb[32];
    snprintf(pa, sizeof pa, "127.0.0.1:%d", free_port());
    snprintf(pb, sizeof pb, "127.0.0.1:%d", free_port());
    const char *extra[] = { "--etcd", e.url, "--cluster", "t", "--ha-ttl", "2", NULL };
    ft_cluster a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    assert_int_equal(ft_master_start(&a, pa, extra), 0);   /* it leads: it listens */
    /* the standby: it follows and does not listen */
    char bdir[64];
    snprintf(bdir, sizeof bdir, "/tmp/ferry-store-test-XXXXXX");
    assert_non_null(mkdtemp(bdir));
    snprintf(b.dir, sizeof b.dir, "%s", bdir);
    char mdir[96];
    snprintf(mdir, sizeof mdir, "%s/master", bdir);
    const char *bargs[] = { "master", "--dir", mdir, "--listen", pb, "--etcd", e.url, "--cluster",
                            "t", "--ha-ttl", "2", NULL };
    assert_int_equal(ft_spawn_exe(&b.master, NULL, ft_ferry_bin(), bargs), 0);
    ferry_store_config cfg;
    ft_store_config(&a, &cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s,%s", pa, pb);
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    enum { N = 300 };
    char k[32], v[32];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "acked/%d", i);
        snprintf(v, sizeof v, "v%d", i * 7);
        assert_int_equal(ferry_kv_put(s, k, v, strlen(v), NULL, &err), 0);   /* acknowledged */
    }
    uint64_t t0 = fr_now_ns();
    ft_proc_kill(&a.master, SIGKILL);
    char line[512] = "";
    assert_int_equal(ft_read_line(&b.master, line, sizeof line, 30000), 0);
    double listening = (double)(fr_now_ns() - t0) / 1e9;
    assert_non_null(strstr(line, "listening on"));
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
        snprintf(v, sizeof v, "v%d", i * 7);
        ferry_kv_value kv;
        assert_int_equal(ferry_kv_get(s, k, &kv, &err), 0);
        assert_int_equal(kv.len, strlen(v));
        assert_memory_equal(kv.val, v, kv.len);
        ferry_store_free(kv.val);
    }
    ferry_store_close(s);
    ft_cluster_stop(&a);
    ft_cluster_stop(&b);
    ft_etcd_stop(&e);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
