/* Two hosts on one machine: network namespaces joined by a veth pair, made
 * and removed by this test. A target in one namespace, an initiator in the
 * other: the engine must see two hosts (tcp, not shm) and move every byte.
 * Needs root (to create namespaces); otherwise it skips and says why. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/testutil.h"

#define ADDR_A "10.213.7.1"
#define ADDR_B "10.213.7.2"

static char ns_a[32], ns_b[32], veth_a[16], veth_b[16];
static bool have_ns;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "netns test: '%s' failed (%d)\n", cmd, rc);
    return rc;
}

static int group_setup(void **s)
{
    (void)s;
    if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1") != 0)
        return 0;
    pid_t pid = getpid();
    snprintf(ns_a, sizeof ns_a, "ferry-%d-a", (int)pid);
    snprintf(ns_b, sizeof ns_b, "ferry-%d-b", (int)pid);
    snprintf(veth_a, sizeof veth_a, "fa%d", (int)pid % 100000000);
    snprintf(veth_b, sizeof veth_b, "fb%d", (int)pid % 100000000);
    have_ns = sh("ip netns add %s", ns_a) == 0 && sh("ip netns add %s", ns_b) == 0 &&
              sh("ip link add %s type veth peer name %s", veth_a, veth_b) == 0 &&
              sh("ip link set %s netns %s", veth_a, ns_a) == 0 && sh("ip link set %s netns %s", veth_b, ns_b) == 0 &&
              sh("ip -n %s addr add " ADDR_A "/24 dev %s", ns_a, veth_a) == 0 &&
              sh("ip -n %s addr add " ADDR_B "/24 dev %s", ns_b, veth_b) == 0 &&
              sh("ip -n %s link set %s up", ns_a, veth_a) == 0 && sh("ip -n %s link set %s up", ns_b, veth_b) == 0 &&
              sh("ip -n %s link set lo up", ns_a) == 0 && sh("ip -n %s link set lo up", ns_b) == 0;
    return 0;
}

/* Deleting a namespace deletes the veth end inside it, and so the pair. */
static int group_teardown(void **s)
{
    (void)s;
    if (ns_a[0])
        sh("ip netns del %s", ns_a);
    if (ns_b[0])
        sh("ip netns del %s", ns_b);
    return 0;
}

static void need_ns(void)
{
    if (!have_ns) {
        fprintf(stderr, "skipped: multi-host test needs root and iproute2 to create network namespaces\n");
        skip();
    }
}

static void hexdesc(const ft_peer *p, char *out)
{
    for (size_t i = 0; i < p->desc_len; i++)
        sprintf(out + 2 * i, "%02x", p->desc[i]);
}

static void test_two_hosts(void **s)
{
    (void)s;
    need_ns();
    ft_peer target, init;
    uint64_t size = 32u << 20;
    assert_int_equal(ft_peer_start(&target, &(ft_peer_opts){.size = size, .listen = ADDR_A ":0", .netns = ns_a}), 0);
    char hex[2 * 256 + 1];
    hexdesc(&target, hex);
    const char *args[] = {"--initiator", hex, NULL};
    assert_int_equal(ft_spawn(&init, ns_b, args), 0);
    char line[256];
    assert_int_equal(ft_read_line(&init, line, sizeof line, 60000), 0);
    ft_peer_wait_exit(&init, 10000);
    ft_peer_stop(&init);
    /* tcp was chosen (different hosts), every byte went over and came back */
    assert_true(strncmp(line, "OK tcp ", 7) == 0);
    uint64_t want = strtoull(line + 7, NULL, 16);
    assert_true(ft_peer_hash(&target, 0, size) == want);
    char reply[128];
    unsigned long long refused, auth, frames;
    assert_int_equal(ft_peer_cmd(&target, reply, sizeof reply, 30000, "stats"), 0);
    assert_int_equal(sscanf(reply, "OK %llu %llu %llu", &refused, &auth, &frames), 3);
    assert_true(refused >= 1);   /* the wrong-key write was refused by the target */
    /* the target host goes away: the next initiator fails with a clear error */
    ft_peer_stop(&target);
    assert_int_equal(ft_spawn(&init, ns_b, args), 0);
    assert_int_equal(ft_read_line(&init, line, sizeof line, 60000), 0);
    ft_peer_stop(&init);
    assert_true(strncmp(line, "FAIL setup", 10) == 0);
}

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_hosts),
    };
    return cmocka_run_group_tests_name("engine_netns", tests, group_setup, group_teardown);
}
