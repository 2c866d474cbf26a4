/* Listeners under a flood of slow handshakes (slowloris), against real
 * `ferry master` and `ferry node` processes: 1,000 connections that trickle
 * their AUTH one byte a second from 127.0.0.2.. (all of 127/8 is loopback,
 * so the flood has many source addresses and the legitimate peers have
 * their own, 127.0.0.1), or from 127.0.0.1 itself, the address the
 * legitimate peers use.
 *
 * While the flood is in flight, a new client and a new node connect to the
 * master, and a client reads and writes a node's segment over tcp and shm;
 * they must be done before the first trickling connection could have been
 * dropped (5 s after its accept), which proves they did not wait for the
 * flood to go away. The latencies are printed, not asserted. The listening
 * process keeps the same threads, holds at most one descriptor per
 * handshake in flight up to the caps, drops every trickling peer at the
 * deadline (AUTH_FAIL FERRY_ETIMEDOUT, never before 5 s: its bytes do not
 * keep it alive) and logs those 1,000 drops in a line or two. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "util/ftflood.h"
#include "util/ftstore.h"

#define MiB (1u << 20)
#define FLOOD 1000
#define DEADLINE_MS 5000        /* the master's and the engines' handshake deadline */
#define NOFILE_NEED 16384       /* test, master and node: 4 x the caps, and the flood */

typedef struct fixture {
    ft_cluster c;
    ferry_store *s, *s2;
    ft_flood *fl, *fl2;
    char log[64];               /* the master's stderr */
} fixture;

static fixture F;

static double ms_since(uint64_t t0)
{
    return (double)(fr_now_ns() - t0) / 1e6;
}

static void nap(void)   /* the step of a deadline poll */
{
    struct timespec ts = { 0, 10000000 };
    nanosleep(&ts, NULL);
}

/* Wait (deadline 20 s) until pid has at most fds descriptors open. */
static int wait_fds_at_most(pid_t pid, int fds)
{
    uint64_t end = fr_now_ms() + 20000;
    int n;
    while ((n = ft_proc_fds(pid)) > fds && fr_now_ms() < end)
        nap();
    return n;
}

/* Start the master with its stderr in F.log; returns once its acceptor
 * answers (one connection that gets its CHALLENGE), so that the threads and
 * descriptors counted next are those of a serving master. */
static void master_start(void)
{
    snprintf(F.log, sizeof F.log, "/tmp/ferry-listen-log-XXXXXX");
    int lf = mkstemp(F.log);
    assert_true(lf >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(lf, 2);
    int rc = ft_master_start(&F.c, NULL, NULL);
    dup2(saved, 2);
    close(saved);
    close(lf);
    assert_int_equal(rc, 0);
    ft_flood *one;
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.c.addr, .n = 1 }, &one), 0);
    bool up = ft_flood_wait_challenged(one, 20000);
    int with_probe = ft_proc_fds(F.c.master.pid);
    ft_flood_stop(one);
    assert_true(up);
    /* ... and until the master closed its end of it */
    assert_true(wait_fds_at_most(F.c.master.pid, with_probe - 1) <= with_probe - 1);
}

static int teardown(void **state)
{
    (void)state;
    ft_flood_stop(F.fl);
    ft_flood_stop(F.fl2);
    ferry_store_close(F.s);
    ferry_store_close(F.s2);
    ft_cluster_stop(&F.c);
    if (F.log[0])
        unlink(F.log);
    memset(&F, 0, sizeof F);
    return 0;
}

static int log_count(const char *text)
{
    FILE *f = fopen(F.log, "r");
    if (!f)
        return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, text)) {
            n++;
            fprintf(stderr, "master log: %s", line);
        }
    fclose(f);
    return n;
}

static void client_open(ferry_store **s, const char *transport)
{
    ferry_store_config cfg;
    ft_store_config(&F.c, &cfg);
    cfg.lease_ms = 1;
    if (transport)
        snprintf(cfg.engine.transport, sizeof cfg.engine.transport, "%s", transport);
    assert_int_equal(ferry_store_open(&cfg, s, NULL), 0);
}

/* A put and a get of 64 KiB through the node's segment. */
static void put_get(ferry_store *s, const char *key)
{
    static uint8_t a[64 << 10], b[64 << 10];
    ft_pattern(a, sizeof a, (uint64_t)key[0], 0);
    assert_int_equal(ferry_store_put(s, key, a, sizeof a, NULL, NULL, NULL), 0);
    size_t len = 0;
    assert_int_equal(ferry_store_get_into(s, key, b, sizeof b, &len, NULL), 0);
    assert_int_equal(len, sizeof b);
    assert_memory_equal(a, b, sizeof a);
}

/* Wait (deadline 30 s) until every connection of the flood got its
 * CHALLENGE, closed or not. */
static ft_flood_counts wait_all_challenged(ft_flood *fl, unsigned n)
{
    ft_flood_counts c;
    uint64_t end = fr_now_ms() + 30000;
    do {
        nap();
        ft_flood_get(fl, &c);
    } while (c.challenged + c.connect_failed < n && fr_now_ms() < end);
    assert_int_equal(c.connect_failed, 0);
    assert_int_equal(c.challenged, n);
    return c;
}

/* Wait until the flood thread has seen at least n of its connections
 * closed: the server closes a displaced one at once, but the thread that
 * counts it may run later (a sanitizer build beside a busy machine). */
static ft_flood_counts wait_closed_at_least(ft_flood *fl, unsigned n)
{
    ft_flood_counts c;
    uint64_t end = fr_now_ms() + 30000;
    ft_flood_get(fl, &c);
    while (c.closed < n && fr_now_ms() < end) {
        nap();
        ft_flood_get(fl, &c);
    }
    return c;
}

/* Every trickling connection was dropped at its deadline, not before, and
 * was told it timed out. */
static void expect_dropped_at_deadline(ft_flood *fl, unsigned n, const char *who)
{
    uint64_t t0 = fr_now_ns();
    assert_true(ft_flood_wait_closed(fl, 60000));
    ft_flood_counts c;
    ft_flood_get(fl, &c);
    fprintf(stderr, "%s: %u trickling handshakes dropped at the deadline (%d ms), %llu..%llu ms "
                    "after connect (%u AUTH bytes sent at most), all gone %.0f ms after the wait "
                    "began\n",
            who, c.timed_out, DEADLINE_MS, (unsigned long long)c.timeout_life_min_ms,
            (unsigned long long)c.timeout_life_max_ms, c.bytes_max, ms_since(t0));
    assert_int_equal(c.timed_out, n);                   /* AUTH_FAIL FERRY_ETIMEDOUT */
    assert_true(c.timeout_life_min_ms >= DEADLINE_MS);  /* never before the deadline */
    assert_true(c.bytes_max >= 3);                      /* they kept sending meanwhile */
}

/* ---- the master ------------------------------------------------------------------ */

/* 1,000 trickling connections from 40 other addresses: all in flight at
 * once (under both caps); a new client and a new node connect meanwhile. */
static void test_master_flood(void **state)
{
    (void)state;
    master_start();
    const pid_t pid = F.c.master.pid;
    const int threads0 = ft_proc_threads(pid), fds0 = ft_proc_fds(pid);
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.c.addr, .n = FLOOD, .src_first = 2,
                                                      .nsrc = 40, .gap_ms = 1000 }, &F.fl), 0);
    assert_true(ft_flood_wait_challenged(F.fl, 30000));   /* all in flight, none dropped yet */
    ft_flood_counts c;
    ft_flood_get(F.fl, &c);
    const int threads1 = ft_proc_threads(pid), fds1 = ft_proc_fds(pid);
    fprintf(stderr, "master with %d trickling handshakes in flight: threads %d -> %d, "
                    "descriptors %d -> %d\n", FLOOD, threads0, threads1, fds0, fds1);
    assert_true(threads1 <= threads0);
    assert_true(fds1 <= fds0 + FLOOD + 4);

    uint64_t t = fr_now_ns();
    client_open(&F.s, NULL);
    assert_int_equal(ferry_kv_put(F.s, "listen/k", "v", 1, NULL, NULL), 0);
    const double client_ms = ms_since(t);
    t = fr_now_ns();
    assert_int_equal(ft_node_start(&F.c, 0, 4 * MiB, NULL, NULL), 0);
    const double node_ms = ms_since(t);
    const uint64_t done = fr_now_ns();
    ft_flood_counts after;
    ft_flood_get(F.fl, &after);
    fprintf(stderr, "with %d trickling handshakes in flight: a new client connected (and put a "
                    "KV) in %.1f ms, a new node connected and mounted in %.1f ms\n",
            FLOOD, client_ms, node_ms);
    /* Done while the whole flood was still there: nothing waited for it. */
    assert_true(done < c.first_start_ns + (uint64_t)DEADLINE_MS * 1000000u);
    assert_int_equal(after.closed, 0);
    put_get(F.s, "listen/obj");

    expect_dropped_at_deadline(F.fl, FLOOD, "master");
    const int fds2 = wait_fds_at_most(pid, fds0 + 2);   /* + the client and the node */
    fprintf(stderr, "master after the flood: threads %d, descriptors %d\n", ft_proc_threads(pid),
            fds2);
    assert_true(fds2 <= fds0 + 2);
    assert_true(ft_proc_threads(pid) <= threads0);
    int lines = log_count("no AUTH within 5000 ms");
    assert_true(lines >= 1 && lines <= 2);
}

/* 1,000 trickling connections from 127.0.0.1, the address the client and
 * the node connect from: the master holds 256 of them (the per-address
 * cap), each newer one displacing the oldest, and the client and the node
 * get in the same way. */
static void test_master_flood_same_address(void **state)
{
    (void)state;
    master_start();
    const pid_t pid = F.c.master.pid;
    const int threads0 = ft_proc_threads(pid), fds0 = ft_proc_fds(pid);
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.c.addr, .n = FLOOD, .src_first = 1,
                                                      .nsrc = 1, .gap_ms = 1000 }, &F.fl), 0);
    ft_flood_counts c = wait_all_challenged(F.fl, FLOOD);
    c = wait_closed_at_least(F.fl, FLOOD - 256);
    const int fds1 = ft_proc_fds(pid);
    fprintf(stderr, "master, %d trickling connections from 127.0.0.1: %u displaced, "
                    "descriptors %d -> %d\n", FLOOD, c.displaced, fds0, fds1);
    assert_true(fds1 <= fds0 + 256 + 4);
    assert_true(c.displaced >= FLOOD - 256);   /* AUTH_FAIL FERRY_EAGAIN */
    assert_true(ft_proc_threads(pid) <= threads0);

    uint64_t t = fr_now_ns();
    client_open(&F.s, NULL);
    assert_int_equal(ferry_kv_put(F.s, "listen/k", "v", 1, NULL, NULL), 0);
    const double client_ms = ms_since(t);
    t = fr_now_ns();
    assert_int_equal(ft_node_start(&F.c, 0, 4 * MiB, NULL, NULL), 0);
    const double node_ms = ms_since(t);
    fprintf(stderr, "sharing 127.0.0.1 with the flood: client in %.1f ms, node in %.1f ms\n",
            client_ms, node_ms);
    assert_true(fr_now_ns() < c.first_start_ns + (uint64_t)DEADLINE_MS * 1000000u);
    ft_flood_get(F.fl, &c);
    assert_int_equal(c.timed_out, 0);
    assert_true(ft_proc_fds(pid) <= fds0 + 256 + 2 + 4);
    assert_true(log_count("a newer one came from the same address") <= 2);
}

/* 1,200 from 48 addresses, 25 each: the master holds 1,024 (the in-flight
 * cap) and a client still connects. */
static void test_master_full(void **state)
{
    (void)state;
    master_start();
    const pid_t pid = F.c.master.pid;
    const int fds0 = ft_proc_fds(pid);
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.c.addr, .n = 1200, .src_first = 2,
                                                      .nsrc = 48, .gap_ms = 1000 }, &F.fl), 0);
    ft_flood_counts c = wait_all_challenged(F.fl, 1200);
    c = wait_closed_at_least(F.fl, 1200 - 1024);
    const int fds1 = ft_proc_fds(pid);
    fprintf(stderr, "master, 1200 trickling connections: %u displaced, descriptors %d -> %d\n",
            c.displaced, fds0, fds1);
    assert_true(c.displaced >= 1200 - 1024);
    assert_true(fds1 <= fds0 + 1024 + 4);
    uint64_t t = fr_now_ns();
    client_open(&F.s, NULL);
    assert_int_equal(ferry_kv_put(F.s, "listen/k", "v", 1, NULL, NULL), 0);
    fprintf(stderr, "full master: a new client connected in %.1f ms\n", ms_since(t));
    assert_true(fr_now_ns() < c.first_start_ns + (uint64_t)DEADLINE_MS * 1000000u);
    assert_true(log_count("handshakes were in flight (the most this listener takes)") <= 2);
}

/* ---- a node's engine listeners -------------------------------------------------- */

/* The tcp port a process listens on (its only TCP listener): a LISTEN
 * socket of /proc/PID/net/tcp whose inode is one of its descriptors. */
static unsigned listen_port(pid_t pid)
{
    char path[64], link[64], line[512], p[384];
    unsigned long inodes[256];
    int ni = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && ni < 256;) {
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        ssize_t n = readlink(p, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
                ni++;
        }
    }
    closedir(d);
    snprintf(path, sizeof path, "/proc/%d/net/tcp", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned port = 0;
    while (!port && fgets(line, sizeof line, f)) {
        unsigned lp, st;
        unsigned long inode;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*d %*d %lu", &lp, &st,
                   &inode) != 3 || st != 0x0A)
            continue;
        for (int i = 0; i < ni; i++)
            if (inodes[i] == inode)
                port = lp;
    }
    fclose(f);
    return port;
}

/* The abstract unix socket name of a process's shm listener. */
static bool shm_name(pid_t pid, char *out, size_t cap)
{
    char want[32], line[512];
    snprintf(want, sizeof want, "@ferry-%d-", (int)pid);
    FILE *f = fopen("/proc/net/unix", "r");
    if (!f)
        return false;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *at = strstr(line, want);
        if (at) {
            at[strcspn(at, " \n")] = 0;
            snprintf(out, cap, "%s", at + 1);
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* 1,000 trickling connections on a node's tcp listener and 300 on its shm
 * listener (one user: 256 at most stay, the per-source cap) while a tcp
 * client and an shm client each write and read its segment. */
static void test_node_flood(void **state)
{
    (void)state;
    master_start();
    assert_int_equal(ft_node_start(&F.c, 0, 16 * MiB, NULL, NULL), 0);
    const pid_t pid = F.c.node[0].pid;
    char tcp[64], uds[108];
    unsigned port = listen_port(pid);
    assert_true(port > 0);
    snprintf(tcp, sizeof tcp, "127.0.0.1:%u", port);
    assert_true(shm_name(pid, uds, sizeof uds));
    const int threads0 = ft_proc_threads(pid), fds0 = ft_proc_fds(pid);
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = tcp, .n = FLOOD, .src_first = 2,
                                                      .nsrc = 40, .gap_ms = 1000 }, &F.fl), 0);
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .uds = uds, .n = 300, .gap_ms = 1000 },
                                    &F.fl2), 0);
    assert_true(ft_flood_wait_challenged(F.fl, 30000));
    ft_flood_counts u = wait_all_challenged(F.fl2, 300);
    ft_flood_counts c;
    ft_flood_get(F.fl, &c);
    const int threads1 = ft_proc_threads(pid), fds1 = ft_proc_fds(pid);
    fprintf(stderr, "node with %d (tcp) + 300 (shm, %u displaced) trickling handshakes: threads "
                    "%d -> %d, descriptors %d -> %d\n", FLOOD, u.displaced, threads0, threads1,
            fds0, fds1);
    assert_true(threads1 <= threads0);
    assert_true(fds1 <= fds0 + FLOOD + 256 + 4);
    assert_true(u.displaced >= 300 - 256);

    uint64_t t = fr_now_ns();
    client_open(&F.s, "tcp");
    put_get(F.s, "listen/tcp");
    const double tcp_ms = ms_since(t);
    t = fr_now_ns();
    client_open(&F.s2, "shm");
    put_get(F.s2, "listen/shm");
    const double shm_ms = ms_since(t);
    fprintf(stderr, "node flooded: a tcp client connected, wrote and read 64 KiB in %.1f ms; "
                    "an shm client in %.1f ms\n", tcp_ms, shm_ms);
    assert_true(fr_now_ns() < c.first_start_ns + (uint64_t)DEADLINE_MS * 1000000u);
    ft_flood_get(F.fl, &c);
    assert_int_equal(c.closed, 0);

    expect_dropped_at_deadline(F.fl, FLOOD, "node tcp");
    assert_true(ft_flood_wait_closed(F.fl2, 30000));
    ferry_store_close(F.s);
    ferry_store_close(F.s2);
    F.s = F.s2 = NULL;
    const int fds2 = wait_fds_at_most(pid, fds0);
    fprintf(stderr, "node after the flood: threads %d, descriptors %d\n", ft_proc_threads(pid),
            fds2);
    assert_true(fds2 <= fds0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    /* Raised before any child starts: they inherit it. */
    unsigned long nofile = ft_flood_raise_nofile(NOFILE_NEED);
    if (nofile < NOFILE_NEED) {
        fprintf(stderr, "test_store_listen needs RLIMIT_NOFILE >= %d (the hard limit allows %lu)\n",
                NOFILE_NEED, nofile);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_master_flood, teardown),
        cmocka_unit_test_teardown(test_master_flood_same_address, teardown),
        cmocka_unit_test_teardown(test_master_full, teardown),
        cmocka_unit_test_teardown(test_node_flood, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
