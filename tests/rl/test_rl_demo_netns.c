/* `ferry-lab demo` across two hosts: network namespaces joined by a veth pair,
 * made and removed by this test. Host A runs the master and the only store
 * node; host B runs `ferry-lab demo` against it (FERRY_MASTER), so every
 * published byte crosses the link to A's segment and every byte the rollouts
 * read comes back across it, while the rollouts' pushes to each other stay
 * on host B. Every parameter byte of both generations must verify. Needs
 * root (to create namespaces); otherwise it skips and says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/ftnetns.h"
#include "util/ftstore.h"

static ft_netns ns;

static int group_setup(void **s)
{
    (void)s;
    ft_netns_create(&ns, "ferryd", 11);
    return 0;
}

static int group_teardown(void **s)
{
    (void)s;
    ft_netns_destroy(&ns);
    return 0;
}

static void test_demo_two_hosts(void **state)
{
    (void)state;
    FT_NEED_NETNS(&ns);
    ft_cluster c;
    memset(&c, 0, sizeof c);
    c.master_netns = ns.a;
    static const char *const extra[] = { "--heartbeat-timeout", "10000", NULL };
    int ok = ft_master_start(&c, ns.listen_a, extra) == 0 &&
             ft_node_start(&c, 0, 256u << 20, ns.a, ns.listen_a) == 0;
    if (!ok) {
        ft_cluster_stop(&c);
        fail_msg("the master and node on host A did not start");
    }
    setenv("FERRY_MASTER", c.addr, 1);
    setenv("FERRY_LISTEN", ns.listen_b, 1);
    const char *args[] = { "demo", "--bytes", "48M", "--trainers", "2", "--rollouts", "2",
                           "--generations", "2", "--json", NULL };
    ft_peer p;
    int sp = ft_spawn_exe(&p, ns.b, ft_lab_bin(), args);
    unsetenv("FERRY_MASTER");
    unsetenv("FERRY_LISTEN");
    char line[8192] = "";
    bool got = false;
    for (int i = 0; sp == 0 && i < 200 && !got; i++) {
        if (ft_read_line(&p, line, sizeof line, 240000) != 0)
            break;
        got = strstr(line, "\"ok\"") != NULL;
    }
    int st = sp == 0 ? ft_peer_wait_exit(&p, 30000) : -1;
    ft_proc_kill(&p, 9);
    ft_cluster_stop(&c);
    fprintf(stderr, "demo on host B, store on host A: %.600s\n", line);
    assert_true(got);
    assert_non_null(strstr(line, "\"ok\":true"));
    assert_null(strstr(line, "\"ok\":false"));
    assert_non_null(strstr(line, "\"generation\":2"));
    assert_int_equal(st, 0);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_two_hosts),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
