/* The store across two hosts: network namespaces joined by a veth pair,
 * made and removed by this test. Host A runs the master, a node and a
 * client; host B a node and a client. A put on A is read with
 * get_into_ranges on B; killing A's node makes B's read fail with a clear
 * error; a restarted node takes new puts. Needs root (to create
 * namespaces); otherwise it skips and says why. */
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

#include "util/ftnetns.h"
#include "util/ftstore.h"

#define MB (1u << 20)

static ft_netns ns;

static int group_setup(void **s)
{
    (void)s;
    ft_netns_create(&ns, "ferrys", 9);
    return 0;
}

static int group_teardown(void **s)
{
    (void)s;
    ft_netns_destroy(&ns);
    return 0;
}

/* ---- the client process (runs inside a namespace) ------------------------------------ */

/* Commands on stdin, one reply line each:
 *   put KEY SIZE SEED [SEGMENT]   -> OK | ERR code text
 *   ranges KEY SIZE SEED          -> OK bytes | ERR code text  (reads 4 ranges, verifies them)
 *   quit */
static int client_main(const char *master)
{
    ferry_error fe = {0};
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", master);
    snprintf(cfg.engine.listen_addr, sizeof cfg.engine.listen_addr, "%s",
             getenv("FT_LISTEN") ? getenv("FT_LISTEN") : "127.0.0.1:0");
    cfg.heartbeat_ms = 100;
    cfg.timeout_ms = 5000;
    ferry_store *s = NULL;
    int rc = ferry_store_open(&cfg, &s, &fe);
    printf(rc == 0 ? "READY\n" : "ERR %d %s\n", rc, fe.msg);
    fflush(stdout);
    if (rc < 0)
        return 1;
    char line[512], key[256];
    unsigned long long size, seed, seg;
    while (fgets(line, sizeof line, stdin)) {
        int k = 0;
        if (sscanf(line, "put %255s %llu %llu %llu", key, &size, &seed, &seg) >= 3) {
            k = sscanf(line, "put %255s %llu %llu %llu", key, &size, &seed, &seg);
            uint8_t *b = malloc(size);
            ft_pattern(b, size, seed, 0);
            uint64_t pref = seg;
            ferry_replicate_config rc2 = { .preferred_segments = &pref, .npreferred = k == 4 };
            rc = ferry_store_put(s, key, b, size, &rc2, NULL, &fe);
            free(b);
        } else if (sscanf(line, "ranges %255s %llu %llu", key, &size, &seed) == 3) {
            uint8_t *want = malloc(size), *got = calloc(1, size);
            ft_pattern(want, size, seed, 0);
            ferry_range r[4];
            int64_t res[4];
            uint64_t q = size / 4;
            for (int i = 0; i < 4; i++)
                r[i] = (ferry_range){ .key = key, .src_offset = i * q + i, .dst = got + i * q + i,
                                      .len = q - 8 };
            rc = ferry_store_get_into_ranges(s, r, 4, res, &fe);
            int64_t total = 0;
            for (int i = 0; rc == 0 && i < 4; i++) {
                total += res[i];
                if (memcmp(got + r[i].src_offset, want + r[i].src_offset, r[i].len) != 0)
                    rc = FERRY_ECORRUPT;
            }
            free(want);
            free(got);
            if (rc == 0) {
                printf("OK %lld\n", (long long)total);
                fflush(stdout);
                continue;
            }
        } else if (!strncmp(line, "quit", 4)) {
            break;
        } else {
            rc = FERRY_EINVAL;
            snprintf(fe.msg, sizeof fe.msg, "unknown command");
        }
        if (rc == 0)
            printf("OK\n");
        else
            printf("ERR %d %s\n", rc, rc == FERRY_ECORRUPT ? "bytes differ" : fe.msg);
        fflush(stdout);
    }
    ferry_store_close(s);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------------ */

static int start_client(ft_peer *p, const char *netns, const char *master, const char *listen)
{
    setenv("FT_LISTEN", listen, 1);
    const char *args[] = { "--store-client", master, NULL };
    if (ft_spawn(p, netns, args) != 0)
        return -1;
    char line[512];
    if (ft_read_line(p, line, sizeof line, 20000) != 0 || strncmp(line, "READY", 5) != 0) {
        fprintf(stderr, "client in %s: %s\n", netns, line);
        return -1;
    }
    return 0;
}

static void test_two_hosts(void **state)
{
    (void)state;
    FT_NEED_NETNS(&ns);
    ft_cluster c;
    memset(&c, 0, sizeof c);
    c.master_netns = ns.a;
    ft_peer ca = { .pid = -1 }, cb = { .pid = -1 };
    char reply[600];
    int ok = ft_master_start(&c, ns.listen_a, (const char *const[]){ "--heartbeat-timeout",
                                                                     "800", NULL }) == 0;
    ok = ok && ft_node_start(&c, 0, 16 * MB, ns.a, ns.listen_a) == 0;
    ok = ok && ft_node_start(&c, 1, 16 * MB, ns.b, ns.listen_b) == 0;
    ok = ok && start_client(&ca, ns.a, c.addr, ns.listen_a) == 0;
    ok = ok && start_client(&cb, ns.b, c.addr, ns.listen_b) == 0;
    if (!ok) {
        ft_proc_kill(&ca, SIGKILL);
        ft_proc_kill(&cb, SIGKILL);
        ft_cluster_stop(&c);
        fail_msg("could not start the two-host cluster");
    }
    /* A put on host A (into A's segment) is read on host B over tcp. */
    int r1 = ft_peer_cmd(&ca, reply, sizeof reply, 20000, "put k1 %u 11 %llu", 4 * MB,
                         (unsigned long long)c.seg[0]);
    int r2 = r1 == 0 ? ft_peer_cmd(&cb, reply, sizeof reply, 20000, "ranges k1 %u 11", 4 * MB)
                     : -1;
    char got1[600];
    snprintf(got1, sizeof got1, "%s", reply);
    /* Kill A's node: B's read fails with a clear error, not a hang. */
    ft_proc_kill(&c.node[0], SIGKILL);
    int r3 = ft_peer_cmd(&cb, reply, sizeof reply, 30000, "ranges k1 %u 11", 4 * MB);
    char got3[600];
    snprintf(got3, sizeof got3, "%s", reply);
    /* Restart it: new puts work and are read across hosts. */
    int r4 = ft_node_start(&c, 0, 16 * MB, ns.a, ns.listen_a);
    int r5 = r4 == 0 ? ft_peer_cmd(&ca, reply, sizeof reply, 20000, "put k2 %u 12 %llu", 2 * MB,
                                   (unsigned long long)c.seg[0]) : -1;
    int r6 = r5 == 0 ? ft_peer_cmd(&cb, reply, sizeof reply, 20000, "ranges k2 %u 12", 2 * MB)
                     : -1;
    fprintf(stderr, "B reads A's object: %s; after A's node died: %s; after restart: %s\n", got1,
            got3, reply);
    ft_peer_stop(&ca);
    ft_peer_stop(&cb);
    ft_cluster_stop(&c);
    assert_int_equal(r1, 0);
    assert_int_equal(r2, 0);
    assert_int_not_equal(r3, 0);
    assert_true(strncmp(got3, "ERR", 3) == 0);
    assert_non_null(strstr(got3, "k1"));
    assert_int_equal(r4, 0);
    assert_int_equal(r5, 0);
    assert_int_equal(r6, 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--store-client"))
        return client_main(argv[2]);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_hosts),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
