/* The accept side of listeners (wire/hsgate.h) in one process, with small
 * caps and short deadlines: handshakes succeed and fail as with the blocking
 * server, a trickling peer is dropped at the deadline counted from accept,
 * the per-source and in-flight caps displace the oldest handshake of the
 * right source, refusals are logged a line per window, one thread serves
 * them all. Also the blocking fr_handshake_server: its socket timeout now
 * bounds the whole handshake. Loopback sources 127.0.0.2.. play different
 * addresses. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "util/ftflood.h"
#include "wire/hsgate.h"
#include "wire/sockio.h"

#define TOKEN "test-hsgate-token"
#define READY_MAX 64

typedef struct gate_fx {
    fr_hsgate *g;
    int lfd;
    char addr[64];
    pthread_t th;
    bool running;
    uint8_t key[32];
    pthread_mutex_t mu;
    int ready[READY_MAX];
    uint16_t roles[READY_MAX];
    int nready;
    int nfailed, last_failed;
} gate_fx;

static gate_fx F;

static void on_ready(void *arg, int fd, const fr_msg_auth *auth, const char *peer)
{
    gate_fx *x = arg;
    (void)peer;
    pthread_mutex_lock(&x->mu);
    if (x->nready < READY_MAX) {
        x->roles[x->nready] = auth->role;
        x->ready[x->nready++] = fd;
    } else {
        close(fd);
    }
    pthread_mutex_unlock(&x->mu);
}

static void on_failed(void *arg, int code)
{
    gate_fx *x = arg;
    pthread_mutex_lock(&x->mu);
    x->nfailed++;
    x->last_failed = code;
    pthread_mutex_unlock(&x->mu);
}

static int g_run_rc;   /* what fr_hsgate_run returned (cmocka asserts only on the main thread) */

static void *gate_main(void *arg)
{
    g_run_rc = fr_hsgate_run(arg);
    return NULL;
}

/* A gate on 127.0.0.1:0 with these limits, running on its own thread. */
static void gate_start(unsigned deadline_ms, unsigned inflight, unsigned per_source)
{
    memset(&F, 0, sizeof F);
    pthread_mutex_init(&F.mu, NULL);
    fr_auth_key((const uint8_t *)TOKEN, strlen(TOKEN), F.key);
    F.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(F.lfd >= 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    assert_int_equal(bind(F.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(F.lfd, 512), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(F.lfd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(F.addr, sizeof F.addr, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    const fr_hsgate_config c = {
        .tag = "test", .key = F.key, .instance = 42, .role = FR_ROLE_TCP_STREAM,
        .deadline_ms = deadline_ms, .max_inflight = inflight, .max_per_source = per_source,
        .stop_fd = -1, .ready = on_ready, .failed = on_failed, .arg = &F,
    };
    assert_int_equal(fr_hsgate_open(&c, F.lfd, &F.g), 0);
    assert_int_equal(pthread_create(&F.th, NULL, gate_main, F.g), 0);
    F.running = true;
}

static int teardown(void **state)
{
    (void)state;
    if (F.running) {
        fr_hsgate_stop(F.g);
        pthread_join(F.th, NULL);
        F.running = false;
        assert_int_equal(g_run_rc, 0);
    }
    fr_hsgate_close(F.g);
    F.g = NULL;
    if (F.lfd > 0)
        close(F.lfd);
    for (int i = 0; i < F.nready; i++)
        close(F.ready[i]);
    pthread_mutex_destroy(&F.mu);
    memset(&F, 0, sizeof F);
    return 0;
}

static fr_hsgate_stats stats(void)
{
    fr_hsgate_stats s;
    fr_hsgate_get_stats(F.g, &s);
    return s;
}

static void nap(void)   /* the step of a deadline poll */
{
    poll(NULL, 0, 5);
}

/* Wait (deadline 20 s) until the gate has n handshakes in flight. */
static void wait_inflight(uint32_t n)
{
    uint64_t end = fr_now_ms() + 20000;
    while (stats().inflight != n && fr_now_ms() < end)
        nap();
    assert_int_equal(stats().inflight, n);
}

/* Connect from 127.0.0.<src> and run the client handshake with token. */
static int client(unsigned src, const char *token, uint16_t role, int *out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(0x7f000000u | src);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct sockaddr_storage ss;
    socklen_t sl;
    assert_int_equal(fr_sock_parse_hostport(F.addr, &ss, &sl), 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&ss, sl), 0);
    fr_sock_timeouts(fd, 20000);
    uint8_t key[32];
    fr_auth_key((const uint8_t *)token, strlen(token), key);
    uint64_t inst = 0;
    int rc = fr_handshake_client(fd, key, 7, 0, role, 3, &inst, NULL);
    if (rc == 0)
        assert_int_equal(inst, 42);
    if (out && rc == 0)
        *out = fd;
    else
        close(fd);
    return rc;
}

static int nready(void)
{
    pthread_mutex_lock(&F.mu);
    int n = F.nready;
    pthread_mutex_unlock(&F.mu);
    return n;
}

/* ---- tests --------------------------------------------------------------------- */

static void test_handshakes(void **state)
{
    (void)state;
    gate_start(5000, 16, 4);
    int fd;
    assert_int_equal(client(1, TOKEN, FR_ROLE_TCP_STREAM, &fd), 0);
    uint64_t end = fr_now_ms() + 20000;
    while (nready() < 1 && fr_now_ms() < end)
        nap();
    assert_int_equal(nready(), 1);
    assert_int_equal(F.roles[0], FR_ROLE_TCP_STREAM);
    /* The handed-over socket is blocking and carries what the client sends next. */
    assert_int_equal(fcntl(F.ready[0], F_GETFL) & O_NONBLOCK, 0);
    assert_int_equal(write(fd, "next", 4), 4);
    char buf[4];
    assert_int_equal(fr_read_full(F.ready[0], buf, 4), 0);
    assert_memory_equal(buf, "next", 4);
    close(fd);

    assert_int_equal(client(1, "another token", FR_ROLE_TCP_STREAM, NULL), FERRY_EAUTH);
    assert_int_equal(client(1, TOKEN, FR_ROLE_SHM_CTRL, NULL), FERRY_EPROTO);
    end = fr_now_ms() + 20000;
    while (stats().refused < 2 && fr_now_ms() < end)
        nap();
    fr_hsgate_stats s = stats();
    assert_int_equal(s.refused, 2);
    assert_int_equal(s.authenticated, 1);
    assert_int_equal(F.nfailed, 2);
    assert_int_equal(F.last_failed, FERRY_EPROTO);
    assert_int_equal(nready(), 1);
}

/* A peer sending a byte every 100 ms keeps a per-read timeout of 600 ms
 * alive for ever; the gate drops it 600 ms after accept and says so. */
static void test_deadline_from_accept(void **state)
{
    (void)state;
    gate_start(600, 16, 4);
    ft_flood *fl;
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.addr, .n = 3, .src_first = 2,
                                                      .nsrc = 3, .gap_ms = 100 }, &fl), 0);
    bool all_closed = ft_flood_wait_closed(fl, 30000);
    ft_flood_counts c;
    ft_flood_get(fl, &c);
    ft_flood_stop(fl);
    assert_true(all_closed);
    fprintf(stderr, "trickle: %u bytes each before the drop, lived %llu..%llu ms\n", c.bytes_max,
            (unsigned long long)c.timeout_life_min_ms, (unsigned long long)c.timeout_life_max_ms);
    assert_int_equal(c.timed_out, 3);            /* AUTH_FAIL FERRY_ETIMEDOUT, not a MAC verdict */
    assert_true(c.bytes_max >= 2);               /* they were sending during the handshake */
    assert_true(c.timeout_life_min_ms >= 600);   /* never before the deadline */
    fr_hsgate_stats s = stats();
    assert_int_equal(s.timed_out, 3);
    assert_int_equal(s.inflight, 0);
}

/* A source at its cap: each new connection displaces that source's oldest;
 * a legitimate client from the same address still gets in, and one from
 * another address displaces nothing. */
static void test_per_source_cap(void **state)
{
    (void)state;
    gate_start(20000, 16, 3);
    ft_flood *fl;
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.addr, .n = 5, .src_first = 2,
                                                      .nsrc = 1, .gap_ms = 60000 }, &fl), 0);
    uint64_t end = fr_now_ms() + 20000;
    ft_flood_counts c;
    do {
        nap();
        ft_flood_get(fl, &c);
    } while ((c.challenged < 5 || c.closed < 2) && fr_now_ms() < end);
    wait_inflight(3);
    assert_int_equal(c.displaced, 2);   /* AUTH_FAIL FERRY_EAGAIN */
    assert_int_equal(stats().displaced, 2);
    assert_int_equal(client(2, TOKEN, FR_ROLE_TCP_STREAM, NULL), 0);
    assert_int_equal(stats().displaced, 3);
    assert_int_equal(client(3, TOKEN, FR_ROLE_TCP_STREAM, NULL), 0);
    assert_int_equal(stats().displaced, 3);
    wait_inflight(2);
    ft_flood_stop(fl);
    assert_int_equal(stats().inflight_peak, 3);
}

/* A full gate displaces the oldest handshake of the source that has the
 * most in flight, not of a light one. */
static void test_inflight_cap(void **state)
{
    (void)state;
    gate_start(20000, 6, 4);
    ft_flood *heavy, *light;
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.addr, .n = 4, .src_first = 2,
                                                      .nsrc = 1, .gap_ms = 60000 }, &heavy), 0);
    assert_true(ft_flood_wait_challenged(heavy, 20000));
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.addr, .n = 2, .src_first = 3,
                                                      .nsrc = 1, .gap_ms = 60000 }, &light), 0);
    assert_true(ft_flood_wait_challenged(light, 20000));
    wait_inflight(6);
    assert_int_equal(client(4, TOKEN, FR_ROLE_TCP_STREAM, NULL), 0);
    ft_flood_counts h, l;
    uint64_t end = fr_now_ms() + 20000;
    do {
        nap();
        ft_flood_get(heavy, &h);
    } while (h.closed < 1 && fr_now_ms() < end);
    ft_flood_get(light, &l);
    assert_int_equal(h.displaced, 1);
    assert_int_equal(l.closed, 0);
    fr_hsgate_stats s = stats();
    assert_int_equal(s.displaced, 1);
    assert_int_equal(s.inflight_peak, 6);
    ft_flood_stop(heavy);
    ft_flood_stop(light);
}

/* 40 handshakes dropped at once make one log line, not 40. */
static void test_log_rate_limited(void **state)
{
    (void)state;
    char path[] = "/tmp/ferry-hsgate-log-XXXXXX";
    int lf = mkstemp(path);
    assert_true(lf >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(lf, 2);
    gate_start(300, 64, 64);
    ft_flood *fl;
    int rc = ft_flood_start(&(ft_flood_spec){ .tcp = F.addr, .n = 40, .src_first = 2, .nsrc = 40,
                                              .gap_ms = 60000 }, &fl);
    bool closed = rc == 0 && ft_flood_wait_closed(fl, 30000);
    ft_flood_counts c = { 0 };
    if (rc == 0) {
        ft_flood_get(fl, &c);
        ft_flood_stop(fl);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char buf[16384];
    ssize_t n = pread(lf, buf, sizeof buf - 1, 0);
    close(lf);
    unlink(path);
    assert_int_equal(rc, 0);
    assert_true(closed);
    assert_int_equal(c.timed_out, 40);
    assert_true(n > 0);
    buf[n] = 0;
    int lines = 0;
    for (const char *p = buf; (p = strstr(p, "no AUTH within 300 ms")) != NULL; p++)
        lines++;
    fprintf(stderr, "log of 40 drops:\n%s", buf);
    assert_true(lines >= 1 && lines <= 2);
}

/* Hundreds of handshakes in flight: still one thread; every one of them
 * costs the listener one descriptor, and all are closed on stop. */
static void test_one_thread(void **state)
{
    (void)state;
    assert_true(ft_flood_raise_nofile(4096) >= 4096);
    gate_start(20000, 1024, 256);
    int threads0 = ft_proc_threads(getpid()), fds0 = ft_proc_fds(getpid());
    ft_flood *fl;
    assert_int_equal(ft_flood_start(&(ft_flood_spec){ .tcp = F.addr, .n = 300, .src_first = 2,
                                                      .nsrc = 30, .gap_ms = 60000 }, &fl), 0);
    assert_true(ft_flood_wait_challenged(fl, 20000));
    wait_inflight(300);
    int threads1 = ft_proc_threads(getpid()), fds1 = ft_proc_fds(getpid());
    fprintf(stderr, "300 handshakes in flight: threads %d -> %d, descriptors %d -> %d\n", threads0,
            threads1, fds0, fds1);
    assert_int_equal(threads1, threads0 + 1);   /* the flood's own thread */
    assert_true(fds1 <= fds0 + 2 * 300 + 2);    /* each end of each connection, the flood's epoll */
    fr_hsgate_stop(F.g);
    pthread_join(F.th, NULL);
    F.running = false;
    assert_true(ft_flood_wait_closed(fl, 20000));
    ft_flood_stop(fl);
    assert_int_equal(stats().inflight, 0);
}

/* The blocking server: a socket timeout of 600 ms used to restart with
 * every byte; now it is the deadline of the whole handshake. */
static void *trickle_main(void *arg)
{
    int fd = *(int *)arg;
    uint8_t ch[FR_WIRE_HDR_LEN + 40], frame[FR_WIRE_HDR_LEN + 88];
    if (fr_read_full(fd, ch, sizeof ch) < 0)
        return NULL;
    fr_msg m = { .type = FR_MSG_AUTH };
    m.u.auth.role = FR_ROLE_TCP_STREAM;
    if (fr_wire_encode(&m, 0, 0, frame, sizeof frame) != (int)sizeof frame)
        return NULL;
    for (size_t i = 0; i + 1 < sizeof frame; i++) {
        if (send(fd, frame + i, 1, MSG_NOSIGNAL) != 1)
            break;
        poll(NULL, 0, 100);
    }
    return NULL;
}

static void test_blocking_deadline(void **state)
{
    (void)state;
    int sp[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, trickle_main, &sp[1]), 0);
    uint8_t key[32];
    fr_auth_key((const uint8_t *)TOKEN, strlen(TOKEN), key);
    assert_int_equal(fr_sock_timeouts(sp[0], 600), 0);
    const char *why = NULL;
    uint64_t t0 = fr_now_ms();
    int rc = fr_handshake_server(sp[0], key, 1, FR_ROLE_TCP_STREAM, NULL, &why);
    uint64_t took = fr_now_ms() - t0;
    shutdown(sp[0], SHUT_RDWR);
    pthread_join(th, NULL);
    close(sp[0]);
    close(sp[1]);
    fprintf(stderr, "blocking handshake: %s after %llu ms (%s)\n", ferry_strerror(rc),
            (unsigned long long)took, why ? why : "");
    assert_int_equal(rc, FERRY_ETIMEDOUT);   /* per-byte timeouts would end in FERRY_EAUTH */
    assert_true(took >= 600);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_handshakes, teardown),
        cmocka_unit_test_teardown(test_deadline_from_accept, teardown),
        cmocka_unit_test_teardown(test_per_source_cap, teardown),
        cmocka_unit_test_teardown(test_inflight_cap, teardown),
        cmocka_unit_test_teardown(test_log_rate_limited, teardown),
        cmocka_unit_test_teardown(test_one_thread, teardown),
        cmocka_unit_test(test_blocking_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
