/* Engine API without peers: configuration, registration, descriptors and
 * argument checking. Every bad input gets an error and changes nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "util/testutil.h"

static ferry_engine *open_default(void)
{
    ferry_engine_config c;
    ft_config(&c, NULL);
    ferry_engine *e = NULL;
    assert_int_equal(ferry_engine_open(&c, &e, NULL), 0);
    return e;
}

static void test_config(void **s)
{
    (void)s;
    ferry_engine_config c;
    ft_config(&c, NULL);
    ferry_engine *e = NULL;
    ferry_engine_config bad = c;
    bad.token_len = 0;
    assert_int_equal(ferry_engine_open(&bad, &e, NULL), FERRY_EAUTH);
    assert_null(e);
    bad = c;
    bad.tcp_streams = 0;
    assert_int_equal(ferry_engine_open(&bad, &e, NULL), FERRY_EINVAL);
    bad = c;
    snprintf(bad.transport, sizeof bad.transport, "rdma");
    assert_int_equal(ferry_engine_open(&bad, &e, NULL), FERRY_EINVAL);
    bad = c;
    snprintf(bad.listen_addr, sizeof bad.listen_addr, "not-an-address");
    assert_true(ferry_engine_open(&bad, &e, NULL) < 0);
    assert_null(e);
    setenv("FERRY_TRANSPORT", "carrier-pigeon", 1);
    assert_int_equal(ferry_engine_config_init(&bad), FERRY_EINVAL);
    unsetenv("FERRY_TRANSPORT");
    assert_int_equal(ferry_engine_config_token_file(&bad, "/nonexistent/token", NULL), FERRY_ENOENT);
    ferry_engine_close(NULL);   /* a no-op */
}

static void test_register(void **s)
{
    (void)s;
    ferry_engine *e = open_default();
    void *m;
    ferry_region *r, *r2;
    assert_int_equal(ferry_mem_alloc(e, 10000, &m, NULL), 0);
    assert_int_equal(ferry_region_register(e, NULL, 10, 0, FERRY_MEM_HOST, &r, NULL), FERRY_EINVAL);
    assert_int_equal(ferry_region_register(e, m, 0, 0, FERRY_MEM_HOST, &r, NULL), FERRY_EINVAL);
    assert_int_equal(ferry_region_register(e, m, 10, 0x80, FERRY_MEM_HOST, &r, NULL), FERRY_EINVAL);
    assert_int_equal(ferry_region_register(e, m, 10, 0, FERRY_MEM_DEVICE, &r, NULL), FERRY_ENOTSUP);
    assert_int_equal(ferry_region_register(e, m, 10000, FERRY_REMOTE_RW, FERRY_MEM_HOST, &r, NULL), 0);
    assert_int_equal(ferry_region_register(e, m, 5000, FERRY_REMOTE_READ, FERRY_MEM_HOST, &r2, NULL), 0);
    assert_true(ferry_region_key(r) != ferry_region_key(r2));   /* fresh random keys */
    assert_true(ferry_region_key(r) > 1);
    assert_ptr_equal(ferry_region_addr(r), m);
    assert_int_equal(ferry_region_len(r), 10000);
    assert_int_equal(ferry_engine_region_count(e), 2);
    /* memory with regions on it cannot be freed */
    assert_int_equal(ferry_mem_free(e, m, NULL), FERRY_EBUSY);
    assert_int_equal(ferry_region_unregister(r, NULL), 0);
    assert_int_equal(ferry_region_unregister(r2, NULL), 0);
    assert_int_equal(ferry_engine_region_count(e), 0);
    assert_int_equal(ferry_mem_free(e, m, NULL), 0);
    assert_int_equal(ferry_mem_free(e, m, NULL), FERRY_ENOENT);
    /* heap memory registers too (shm peers reach it by cross-memory attach) */
    void *h = malloc(4096);
    assert_int_equal(ferry_region_register(e, h, 4096, FERRY_REMOTE_RW, FERRY_MEM_HOST, &r, NULL), 0);
    ferry_engine_close(e);   /* unregisters what is left */
    free(h);
}

static void test_descriptors(void **s)
{
    (void)s;
    ferry_engine *e = open_default();
    uint8_t d[FERRY_DESC_MAX];
    int n = ferry_engine_export(e, d, sizeof d);
    assert_true(n > 0 && n <= FERRY_DESC_MAX);
    assert_int_equal(ferry_engine_export(e, d, 8), FERRY_EMSGSIZE);
    assert_non_null(strstr(ferry_engine_address(e), "tcp://127.0.0.1:"));
    ferry_peer_id id;
    /* corrupt descriptors are rejected before any connection is tried */
    for (int i = 0; i < n; i++) {
        uint8_t c[FERRY_DESC_MAX];
        memcpy(c, d, (size_t)n);
        c[i] ^= 0x40;
        assert_true(ferry_peer_add(e, c, (size_t)n, &id, NULL) < 0);
    }
    assert_true(ferry_peer_add(e, d, (size_t)n - 1, &id, NULL) < 0);
    ferry_remote_region rr;
    assert_true(ferry_region_import(e, d, (size_t)n, &rr, NULL) < 0);   /* an endpoint is not a region */
    /* an engine may talk to itself */
    assert_int_equal(ferry_peer_add(e, d, (size_t)n, &id, NULL), 0);
    ferry_peer_id id2;
    assert_int_equal(ferry_peer_add(e, d, (size_t)n, &id2, NULL), 0);
    assert_int_equal(id, id2);   /* same instance, same id */
    assert_int_equal(ferry_peer_reset(e, 12345), FERRY_ENOENT);
    ferry_engine_close(e);
}

static void test_loopback_self(void **s)
{
    (void)s;
    const char *tps[] = {"shm", "tcp"};
    for (int k = 0; k < 2; k++) {
        ferry_engine_config c;
        ft_config(&c, tps[k]);
        ferry_engine *e;
        assert_int_equal(ferry_engine_open(&c, &e, NULL), 0);
        void *src, *dst;
        ferry_region *rs, *rd;
        assert_int_equal(ferry_mem_alloc(e, 1 << 20, &src, NULL), 0);
        assert_int_equal(ferry_mem_alloc(e, 1 << 20, &dst, NULL), 0);
        assert_int_equal(ferry_region_register(e, src, 1 << 20, 0, FERRY_MEM_HOST, &rs, NULL), 0);
        assert_int_equal(ferry_region_register(e, dst, 1 << 20, FERRY_REMOTE_WRITE, FERRY_MEM_HOST, &rd, NULL), 0);
        uint8_t blob[FERRY_DESC_MAX];
        int n = ferry_region_export(rd, blob, sizeof blob);
        ferry_remote_region rr;
        assert_int_equal(ferry_region_import(e, blob, (size_t)n, &rr, NULL), 0);
        assert_string_equal(ferry_peer_transport(e, rr.peer), tps[k]);
        ft_pattern(src, 1 << 20, 5, 0);
        ferry_op ops[2] = {{.opcode = FERRY_OP_WRITE, .local = src, .len = 1 << 20, .peer = rr.peer,
                            .remote_addr = rr.addr, .key = rr.key},
                           {.opcode = FERRY_OP_NOTIFY, .peer = rr.peer, .tag = 5, .value = 6}};
        ferry_ticket *t;
        assert_int_equal(ferry_submit(e, ops, 2, 0, &t, NULL), 0);
        assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
        ferry_ticket_free(t);
        uint64_t v = 0;
        assert_int_equal(ferry_wait_notify(e, 5, 1, 10000, &v, NULL), 0);
        assert_int_equal(v, 6);
        assert_int_equal(ferry_wait_notify(e, 5, 1, 50, NULL, NULL), FERRY_ETIMEDOUT);
        assert_memory_equal(src, dst, 1 << 20);
        ferry_engine_stats st;
        ferry_engine_get_stats(e, &st);
        assert_int_equal(st.bytes_written, 1 << 20);
        assert_int_equal(st.tickets_completed, 1);
        ferry_engine_close(e);
    }
}

/* Submit n NOTIFYs (tag, values first..first+n-1) from e to peer, in
 * batches, and wait for each batch to complete. */
static void send_notifies(ferry_engine *e, ferry_peer_id peer, uint64_t tag, uint64_t first,
                          uint64_t n)
{
    enum { BATCH = 256 };
    ferry_op ops[BATCH];
    for (uint64_t done = 0; done < n;) {
        uint32_t k = n - done < BATCH ? (uint32_t)(n - done) : BATCH;
        for (uint32_t i = 0; i < k; i++)
            ops[i] = (ferry_op){ .opcode = FERRY_OP_NOTIFY, .peer = peer, .tag = tag,
                                 .value = first + done + i };
        ferry_ticket *t;
        assert_int_equal(ferry_submit(e, ops, k, 0, &t, NULL), 0);
        assert_int_equal(ferry_ticket_wait(t, 60000), FERRY_TICKET_COMPLETED);
        ferry_ticket_free(t);
        done += k;
    }
}

/* Two engines over transport tp, e and other, each with the peer of e's
 * notification target: e reaches itself (self), other reaches e. */
static void notify_pair(const char *tp, ferry_engine **e, ferry_engine **other,
                        ferry_remote_region *self, ferry_remote_region *from_other)
{
    ferry_engine_config c;
    ft_config(&c, tp);
    assert_int_equal(ferry_engine_open(&c, e, NULL), 0);
    assert_int_equal(ferry_engine_open(&c, other, NULL), 0);
    void *m;
    ferry_region *r;
    assert_int_equal(ferry_mem_alloc(*e, 4096, &m, NULL), 0);
    assert_int_equal(ferry_region_register(*e, m, 4096, FERRY_REMOTE_WRITE, FERRY_MEM_HOST, &r, NULL), 0);
    uint8_t blob[FERRY_DESC_MAX];
    int n = ferry_region_export(r, blob, sizeof blob);
    assert_int_equal(ferry_region_import(*e, blob, (size_t)n, self, NULL), 0);
    assert_int_equal(ferry_region_import(*other, blob, (size_t)n, from_other, NULL), 0);
}

/* Notifications nobody consumes are bounded per (peer, tag): past
 * FERRY_NOTIFY_PENDING_MAX a sender's oldest are dropped and counted, the
 * other senders' are kept, and a waiter sees the newest in arrival order. */
static void test_notify_bound(void **s)
{
    (void)s;
    const char *tps[] = {"shm", "tcp"};
    enum { EXTRA = 1000, OTHER = 3 };
    const uint64_t total = FERRY_NOTIFY_PENDING_MAX + EXTRA, tag = 9;
    uint64_t *vals = malloc(FERRY_NOTIFY_PENDING_MAX * sizeof *vals);
    assert_non_null(vals);
    for (int k = 0; k < 2; k++) {
        ferry_engine *e, *other;
        ferry_remote_region self, from_other;
        notify_pair(tps[k], &e, &other, &self, &from_other);

        /* Another sender first: its few are never dropped for e's flood. */
        send_notifies(other, from_other.peer, tag, 1u << 30, OTHER);
        send_notifies(e, self.peer, tag, 0, total);
        ferry_engine_stats st;
        ferry_engine_get_stats(e, &st);
        assert_int_equal(st.notify_dropped, EXTRA);
        assert_int_equal(ferry_wait_notify(e, tag, OTHER, 10000, vals, NULL), 0);
        for (int i = 0; i < OTHER; i++)
            assert_int_equal(vals[i], (1u << 30) + (uint64_t)i);
        /* e's newest, oldest first: EXTRA .. total-1 */
        assert_int_equal(ferry_wait_notify(e, tag, FERRY_NOTIFY_PENDING_MAX, 10000, vals, NULL), 0);
        for (uint64_t i = 0; i < FERRY_NOTIFY_PENDING_MAX; i++)
            if (vals[i] != EXTRA + i)
                fail_msg("notification %llu has value %llu, want %llu", (unsigned long long)i,
                         (unsigned long long)vals[i], (unsigned long long)(EXTRA + i));
        assert_int_equal(ferry_wait_notify(e, tag, 1, 50, NULL, NULL), FERRY_ETIMEDOUT);
        /* Below the bound counts are exact again. */
        send_notifies(e, self.peer, tag, 7, 2);
        assert_int_equal(ferry_wait_notify(e, tag, 2, 10000, vals, NULL), 0);
        assert_int_equal(vals[0], 7);
        assert_int_equal(vals[1], 8);
        ferry_engine_get_stats(e, &st);
        assert_int_equal(st.notify_dropped, EXTRA);
        ferry_engine_close(other);
        ferry_engine_close(e);
    }
    free(vals);
}

/* This process's resident memory (bytes). */
static uint64_t rss_bytes(void)
{
    unsigned long long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* A peer that sends every notification with a tag of its own (that nobody
 * waits for) is held to FERRY_NOTIFY_PEER_MAX unconsumed over all its tags:
 * 600,000 such frames leave memory within the stated bound (about 400
 * bytes a notification), the rest are refused and counted, another
 * sender's are still delivered, and a consumed one makes room again. */
static void test_notify_peer_bound(void **s)
{
    (void)s;
    enum { FRAMES = 600000, BATCH = 256 };
    ferry_engine *e, *other;
    ferry_remote_region self, from_other;
    notify_pair("tcp", &e, &other, &self, &from_other);
    send_notifies(e, self.peer, 1, 0, 1);   /* connections up, first allocations made */
    assert_int_equal(ferry_wait_notify(e, 1, 1, 10000, NULL, NULL), 0);
    uint64_t rss0 = rss_bytes(), x = 0x9e3779b97f4a7c15ull;
    ferry_op ops[BATCH];
    for (uint64_t done = 0; done < FRAMES;) {
        uint32_t k = FRAMES - done < BATCH ? (uint32_t)(FRAMES - done) : BATCH;
        for (uint32_t i = 0; i < k; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;   /* a fresh tag each */
            ops[i] = (ferry_op){ .opcode = FERRY_OP_NOTIFY, .peer = self.peer,
                                 .tag = (x >> 1) | (1ull << 62), .value = done + i };
        }
        ferry_ticket *t;
        assert_int_equal(ferry_submit(e, ops, k, 0, &t, NULL), 0);
        assert_int_equal(ferry_ticket_wait(t, 60000), FERRY_TICKET_COMPLETED);
        ferry_ticket_free(t);
        done += k;
    }
    uint64_t grown = rss_bytes() - rss0;
    ferry_engine_stats st;
    ferry_engine_get_stats(e, &st);
    print_message("%d notifications with fresh tags: memory +%.1f MiB, %llu refused at the "
                  "peer's bound of %u\n", FRAMES, grown / 1048576.0,
                  (unsigned long long)st.notify_peer_capped, (unsigned)FERRY_NOTIFY_PEER_MAX);
    assert_int_equal(st.notify_peer_capped, FRAMES - FERRY_NOTIFY_PEER_MAX);
    assert_int_equal(st.notify_dropped, FRAMES - FERRY_NOTIFY_PEER_MAX);
#ifndef __SANITIZE_ADDRESS__
    /* (under AddressSanitizer its quarantine and redzones, not ferry,
     * decide the resident size: the counts above and below still hold) */
    assert_true(grown <= (uint64_t)FERRY_NOTIFY_PEER_MAX * 400 + (8ull << 20));
#endif
    /* another sender is not held to e's bound */
    send_notifies(other, from_other.peer, 5, 100, 3);
    uint64_t vals[3];
    assert_int_equal(ferry_wait_notify(e, 5, 3, 10000, vals, NULL), 0);
    assert_true(vals[0] == 100 && vals[2] == 102);
    /* the first tag e sent was kept: consuming it makes room for one more */
    x = 0x9e3779b97f4a7c15ull * 6364136223846793005ull + 1442695040888963407ull;
    assert_int_equal(ferry_wait_notify(e, (x >> 1) | (1ull << 62), 1, 10000, vals, NULL), 0);
    assert_int_equal(vals[0], 0);
    send_notifies(e, self.peer, 7, 42, 1);
    assert_int_equal(ferry_wait_notify(e, 7, 1, 10000, vals, NULL), 0);
    assert_int_equal(vals[0], 42);
    ferry_engine_get_stats(e, &st);
    assert_int_equal(st.notify_peer_capped, FRAMES - FERRY_NOTIFY_PEER_MAX);
    ferry_engine_close(other);
    ferry_engine_close(e);
}

/* Refusals at open and with memory say which field, file or region. */
static void test_detail_setup(void **s)
{
    (void)s;
    ferry_engine_config c;
    ft_config(&c, NULL);
    ferry_engine *e = NULL;
    ferry_error err = {0};
    ferry_engine_config bad = c;
    snprintf(bad.fault, sizeof bad.fault, "delay_ms=5,sometimes=1");
    assert_int_equal(ferry_engine_open(&bad, &e, &err), FERRY_EINVAL);
    assert_null(e);
    ft_assert_says(&err, FERRY_EINVAL, "bad fault spec", "unknown key \"sometimes\"", "post_fail_after");
    snprintf(bad.fault, sizeof bad.fault, "drop_after=soon");
    assert_int_equal(ferry_engine_open(&bad, &e, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "bad fault spec", "drop_after=soon", "not a number");
    bad = c;
    bad.token_len = 0;
    assert_int_equal(ferry_engine_open(&bad, &e, &err), FERRY_EAUTH);
    ft_assert_says(&err, FERRY_EAUTH, "no cluster token", "FERRY_TOKEN", NULL);
    bad = c;
    bad.tcp_streams = 0;
    assert_int_equal(ferry_engine_open(&bad, &e, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "tcp_streams 0", NULL, NULL);
    bad = c;
    bad.reserved[3] = 1;
    assert_int_equal(ferry_engine_open(&bad, &e, &err), FERRY_EINVAL);
    ft_assert_says(&err, FERRY_EINVAL, "reserved", NULL, NULL);
    bad = c;
    snprintf(bad.listen_addr, sizeof bad.listen_addr, "not-an-address");
    assert_true(ferry_engine_open(&bad, &e, &err) < 0);
    ft_assert_says(&err, err.code, "cannot start the tcp transport", "not-an-address", NULL);
    assert_int_equal(ferry_engine_config_token_file(&bad, "/nonexistent/token", &err), FERRY_ENOENT);
    ft_assert_says(&err, FERRY_ENOENT, "/nonexistent/token", NULL, NULL);

    e = open_default();
    void *m;
    ferry_region *r;
    assert_int_equal(ferry_mem_alloc(e, 8192, &m, NULL), 0);
    assert_int_equal(ferry_region_register(e, m, 10, 0, FERRY_MEM_DEVICE, &r, &err), FERRY_ENOTSUP);
    ft_assert_says(&err, FERRY_ENOTSUP, "host memory", NULL, NULL);
    assert_int_equal(ferry_region_register(e, m, 4096, 0, FERRY_MEM_HOST, &r, &err), 0);
    assert_int_equal(ferry_mem_free(e, m, &err), FERRY_EBUSY);
    ft_assert_says(&err, FERRY_EBUSY, "1 registered region", "unregister it first", NULL);
    assert_int_equal(ferry_mem_free(e, (char *)m + 4096, &err), FERRY_ENOENT);
    ft_assert_says(&err, FERRY_ENOENT, "ferry_mem_alloc", NULL, NULL);
    assert_int_equal(ferry_region_unregister(r, NULL), 0);
    assert_int_equal(ferry_mem_free(e, m, NULL), 0);
    ferry_engine_close(e);
}

/* A refused submit names the op; a failed ticket names its first failed op,
 * its peer and the cause; a wait for notifications says how many came. */
static void test_detail_transfers(void **s)
{
    (void)s;
    const char *tps[] = {"shm", "tcp"};
    for (int k = 0; k < 2; k++) {
        ferry_engine *e = ft_engine_open(tps[k]);
        void *src, *dst;
        ferry_region *rs, *rd;
        ferry_error err = {0};
        assert_int_equal(ferry_mem_alloc(e, 8192, &src, NULL), 0);
        assert_int_equal(ferry_mem_alloc(e, 8192, &dst, NULL), 0);
        assert_int_equal(ferry_region_register(e, src, 8192, 0, FERRY_MEM_HOST, &rs, NULL), 0);
        assert_int_equal(ferry_region_register(e, dst, 8192, FERRY_REMOTE_WRITE, FERRY_MEM_HOST, &rd, NULL), 0);
        uint8_t blob[FERRY_DESC_MAX];
        int n = ferry_region_export(rd, blob, sizeof blob);
        ferry_remote_region rr;
        assert_int_equal(ferry_region_import(e, blob, (size_t)n, &rr, &err), 0);
        char peer[32];
        snprintf(peer, sizeof peer, "peer %u", rr.peer);
        uint8_t *heap = malloc(4096);
        ferry_op ops[2] = {{.opcode = FERRY_OP_WRITE, .local = src, .len = 4096, .peer = rr.peer,
                            .remote_addr = rr.addr, .key = rr.key},
                           {.opcode = FERRY_OP_WRITE, .local = heap, .len = 4096, .peer = rr.peer,
                            .remote_addr = rr.addr + 4096, .key = rr.key}};
        ferry_ticket *t = NULL;
        assert_int_equal(ferry_submit(e, ops, 2, 0, &t, &err), FERRY_EFAULT);
        assert_null(t);
        ft_assert_says(&err, FERRY_EFAULT, "op 1: local buffer", "not inside a registered region", NULL);
        ops[1].local = (uint8_t *)src + 4096;
        ops[1].peer = 99;
        assert_int_equal(ferry_submit(e, ops, 2, 0, &t, &err), FERRY_ENOENT);
        ft_assert_says(&err, FERRY_ENOENT, "op 1: ", "no peer 99", NULL);
        ops[1].peer = rr.peer;
        ops[1].opcode = 7;
        assert_int_equal(ferry_submit(e, ops, 2, 0, &t, &err), FERRY_EINVAL);
        ft_assert_says(&err, FERRY_EINVAL, "op 1: opcode 7", NULL, NULL);

        /* a wrong remote key on op 1: the ticket names it and its peer */
        ops[1].opcode = FERRY_OP_WRITE;
        ops[1].key = rr.key ^ 0x5a5a;
        assert_int_equal(ferry_submit(e, ops, 2, 0, &t, &err), 0);
        int st = ferry_ticket_wait(t, 30000);
        assert_true(st == FERRY_TICKET_ABORTED || st == FERRY_TICKET_FAILED_DRAINED);
        assert_int_equal(ferry_ticket_error(t, NULL), FERRY_EACCES);
        assert_int_equal(ferry_ticket_error(t, &err), FERRY_EACCES);
        ft_assert_says(&err, FERRY_EACCES, "op 1 (WRITE of 4096 bytes to ", peer, "refused by the peer");
        ft_assert_says(&err, FERRY_EACCES, ferry_ticket_state_name(st), NULL, NULL);
        ferry_ticket_free(t);

        /* a ticket that completed has no error: err is left alone */
        ops[1].key = rr.key;
        assert_int_equal(ferry_submit(e, ops, 2, 0, &t, &err), 0);
        assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
        err.code = 12345;
        assert_int_equal(ferry_ticket_error(t, &err), 0);
        assert_int_equal(err.code, 12345);
        ferry_ticket_free(t);

        ferry_op note = {.opcode = FERRY_OP_NOTIFY, .peer = rr.peer, .tag = 9, .value = 1};
        assert_int_equal(ferry_submit(e, &note, 1, 0, &t, NULL), 0);
        assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
        ferry_ticket_free(t);
        for (int i = 0; i < 500; i++) {   /* the one sent has arrived, or does soon */
            assert_int_equal(ferry_wait_notify(e, 9, 2, 10, NULL, &err), FERRY_ETIMEDOUT);
            if (strstr(err.msg, "1 of 2 arrived"))
                break;
        }
        ft_assert_says(&err, FERRY_ETIMEDOUT, "tag 9", "1 of 2 arrived", "from 1 peer");

        ferry_mapping v;
        int rc = ferry_remote_map(e, &rr, rr.addr, 4096, &v, &err);
        if (strcmp(tps[k], "tcp") == 0) {
            assert_int_equal(rc, FERRY_ENOTSUP);
            ft_assert_says(&err, FERRY_ENOTSUP, "remote map of 4096 bytes", peer, "over tcp");
        } else {
            assert_int_equal(rc, FERRY_EACCES);   /* registered write-only */
            ft_assert_says(&err, FERRY_EACCES, "remote map", "not remote-readable", NULL);
        }
        free(heap);
        ferry_engine_close(e);
    }
}

/* Engines with different tokens: the refusal says so. */
static void test_detail_auth(void **s)
{
    (void)s;
    ferry_engine *a = ft_engine_open("shm");
    ferry_engine_config c;
    ft_config(&c, "shm");
    memset(c.token, 'x', 32);
    c.token_len = 32;
    ferry_engine *b = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_engine_open(&c, &b, &err), 0);
    uint8_t d[FERRY_DESC_MAX];
    int n = ferry_engine_export(a, d, sizeof d);
    ferry_peer_id id;
    assert_int_equal(ferry_peer_add(b, d, (size_t)n, &id, &err), FERRY_EAUTH);
    ft_assert_says(&err, FERRY_EAUTH, "cannot connect to peer", "over shm", "same cluster token");
    d[0] ^= 0xff;
    assert_true(ferry_peer_add(b, d, (size_t)n, &id, &err) < 0);
    ft_assert_says(&err, err.code, "does not decode", NULL, NULL);
    ferry_engine_close(b);
    ferry_engine_close(a);
}

static void test_names(void **s)
{
    (void)s;
    assert_string_equal(ferry_ticket_state_name(FERRY_TICKET_COMPLETED), "COMPLETED");
    assert_string_equal(ferry_ticket_state_name(FERRY_TICKET_FAILED_DRAINED), "FAILED_DRAINED");
    assert_non_null(ferry_strerror(FERRY_EFENCED));
    assert_true(strstr(ferry_strerror(FERRY_EFENCED), "fenced") != NULL);
    assert_int_equal(ferry_ticket_wait(NULL, 0), FERRY_EINVAL);
    ferry_ticket_free(NULL);
}

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_register),
        cmocka_unit_test(test_descriptors),
        cmocka_unit_test(test_loopback_self),
        cmocka_unit_test(test_notify_bound),
        cmocka_unit_test(test_notify_peer_bound),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_detail_setup),
        cmocka_unit_test(test_detail_transfers),
        cmocka_unit_test(test_detail_auth),
    };
    return cmocka_run_group_tests_name("engine_api", tests, NULL, NULL);
}
