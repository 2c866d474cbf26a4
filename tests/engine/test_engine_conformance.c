/* Transport conformance: every test runs over shm and over tcp (and, with
 * FERRY_TEST_TRANSPORT=ucx, over ucx with whatever UCX_TLS says), against a
 * real peer process. Each asserts the terminal state of its tickets, the
 * bytes that landed (or that nothing landed), and that every process keeps
 * serving afterwards. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "util/testutil.h"

#define MiB (1024ull * 1024)

static const char *g_tp;   /* transport under test */

typedef struct fx {
    ferry_engine *e;
    ft_peer peer;
    ferry_remote_region rr;
    uint8_t *buf;
    uint64_t buflen;
    ferry_region *lr;
} fx;

static fx F;

static void open_engine(ferry_engine **e, ferry_engine_config *cfg)
{
    ferry_engine_config c;
    if (!cfg) {
        ft_config(&c, g_tp);
        cfg = &c;
    }
    assert_int_equal(ferry_engine_open(cfg, e, NULL), 0);
}

static void start_peer(ft_peer *p, ferry_remote_region *rr, const ft_peer_opts *o)
{
    assert_int_equal(ft_peer_start(p, o), 0);
    if (rr)
        assert_int_equal(ferry_region_import(F.e, p->desc, p->desc_len, rr, NULL), 0);
}

static void local_buf(uint64_t len)
{
    void *m;
    assert_int_equal(ferry_mem_alloc(F.e, len, &m, NULL), 0);
    F.buf = m;
    F.buflen = len;
    assert_int_equal(ferry_region_register(F.e, F.buf, len, 0, FERRY_MEM_HOST, &F.lr, NULL), 0);
}

static int setup_with(uint64_t peer_size, uint64_t local_size, const ft_peer_opts *extra)
{
    memset(&F, 0, sizeof F);
    F.peer.pid = -1;
    open_engine(&F.e, NULL);
    ft_peer_opts o = {.size = peer_size};
    if (extra)
        o = *extra;
    if (!o.size)
        o.size = peer_size;
    start_peer(&F.peer, &F.rr, &o);
    assert_string_equal(ferry_peer_transport(F.e, F.rr.peer), g_tp);
    local_buf(local_size);
    return 0;
}

static int setup_small(void **s) { (void)s; return setup_with(64 * MiB, 64 * MiB, NULL); }

/* The peer's region in plain heap memory: shm copies with cross-memory
 * attach instead of through a memfd mapping. */
static int setup_heap(void **s)
{
    (void)s;
    return setup_with(64 * MiB, 64 * MiB, &(ft_peer_opts){.size = 64 * MiB, .malloc_mem = true});
}

static int teardown(void **s)
{
    (void)s;
    ft_peer_stop(&F.peer);
    ferry_engine_close(F.e);   /* drains, unregisters and frees everything */
    memset(&F, 0, sizeof F);
    return 0;
}

static ferry_op wr(uint8_t *local, uint64_t len, uint64_t roff)
{
    return (ferry_op){.opcode = FERRY_OP_WRITE, .local = local, .len = len, .peer = F.rr.peer,
                      .remote_addr = F.rr.addr + roff, .key = F.rr.key};
}

static ferry_op rd(uint8_t *local, uint64_t len, uint64_t roff)
{
    ferry_op o = wr(local, len, roff);
    o.opcode = FERRY_OP_READ;
    return o;
}

static ferry_op nt(uint64_t tag, uint64_t value)
{
    return (ferry_op){.opcode = FERRY_OP_NOTIFY, .peer = F.rr.peer, .tag = tag, .value = value};
}

static int run(const ferry_op *ops, size_t n, int timeout_ms)
{
    ferry_ticket *t;
    int rc = ferry_submit(F.e, ops, n, 0, &t, NULL);
    if (rc < 0)
        return rc;
    int st = ferry_ticket_wait(t, timeout_ms);
    ferry_ticket_free(t);
    return st;
}

/* ---- data movement ---------------------------------------------------------- */

static void test_sizes(void **s)
{
    (void)s;
    static const uint64_t sizes[] = {1, 7, 4095, 4096, 65537, MiB + 3, 16 * MiB + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        uint64_t n = sizes[i];
        /* WRITE from an unaligned local address to an unaligned remote one */
        ft_pattern(F.buf + 1, n, 100 + i, 0);
        ferry_op w = wr(F.buf + 1, n, 3);
        assert_int_equal(run(&w, 1, 30000), FERRY_TICKET_COMPLETED);
        assert_true(ft_peer_hash(&F.peer, 3, n) == ft_hash(F.buf + 1, n));
        /* READ a filled range into another unaligned spot */
        assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill %zu", 200 + i), 0);
        memset(F.buf, 0, n + 16);
        ferry_op r = rd(F.buf + 2, n, 5);
        assert_int_equal(run(&r, 1, 30000), FERRY_TICKET_COMPLETED);
        uint8_t *want = malloc(n);
        ft_pattern(want, n, 200 + i, 5);
        assert_memory_equal(F.buf + 2, want, n);
        assert_int_equal(F.buf[0], 0);
        assert_int_equal(F.buf[n + 2], 0);   /* nothing written past the op */
        free(want);
    }
}

static int setup_gib(void **s) { (void)s; return setup_with(1024 * MiB, 1024 * MiB, NULL); }

static void test_one_gib(void **s)
{
    (void)s;
    uint64_t n = 1024 * MiB;
    ft_pattern(F.buf, n, 7, 0);
    ferry_op w = wr(F.buf, n, 0);
    assert_int_equal(run(&w, 1, 120000), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&F.peer, 0, n) == ft_hash(F.buf, n));
    memset(F.buf, 0, n);
    ferry_op r = rd(F.buf, n, 0);
    assert_int_equal(run(&r, 1, 120000), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&F.peer, 0, n) == ft_hash(F.buf, n));
}

/* Random split points of [0, total) into n pieces, shuffled into ops. */
static size_t random_ops(ferry_op *ops, size_t n, uint64_t total, bool write, unsigned seed)
{
    uint64_t *cuts = calloc(n + 1, sizeof *cuts);
    srand(seed);
    for (size_t i = 1; i < n; i++)
        cuts[i] = ((uint64_t)rand() * RAND_MAX + (uint64_t)rand()) % total;
    cuts[n] = total;
    for (size_t i = 1; i < n; i++)       /* insertion sort is fine for 1000 */
        for (size_t j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
            uint64_t t = cuts[j]; cuts[j] = cuts[j - 1]; cuts[j - 1] = t;
        }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (cuts[i + 1] > cuts[i])
            ops[k++] = write ? wr(F.buf + cuts[i], cuts[i + 1] - cuts[i], cuts[i])
                             : rd(F.buf + cuts[i], cuts[i + 1] - cuts[i], cuts[i]);
    for (size_t i = k; i > 1; i--) {
        size_t j = (size_t)rand() % i;
        ferry_op t = ops[i - 1]; ops[i - 1] = ops[j]; ops[j] = t;
    }
    free(cuts);
    return k;
}

static void test_many_ops_per_batch(void **s)
{
    (void)s;
    uint64_t total = 48 * MiB;
    ferry_op *ops = calloc(1000, sizeof *ops);
    ft_pattern(F.buf, total, 11, 0);
    size_t n = random_ops(ops, 1000, total, true, 1);
    assert_true(n > 900);
    assert_int_equal(run(ops, n, 60000), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&F.peer, 0, total) == ft_hash(F.buf, total));
    memset(F.buf, 0, total);
    n = random_ops(ops, 1000, total, false, 2);
    assert_int_equal(run(ops, n, 60000), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&F.peer, 0, total) == ft_hash(F.buf, total));
    free(ops);
}

static void test_many_tickets_in_flight(void **s)
{
    (void)s;
    enum { N = 64 };
    uint64_t piece = 512 * 1024;
    ferry_ticket *t[N];
    ft_pattern(F.buf, N * piece, 12, 0);
    for (int i = 0; i < N; i++) {
        ferry_op w = wr(F.buf + i * piece, piece, i * piece);
        assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t[i], NULL), 0);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(ferry_ticket_wait(t[i], 30000), FERRY_TICKET_COMPLETED);
        assert_int_equal(ferry_ticket_bytes(t[i]), piece);
        ferry_ticket_free(t[i]);
    }
    assert_true(ft_peer_hash(&F.peer, 0, N * piece) == ft_hash(F.buf, N * piece));
}

static void test_notify_after_writes(void **s)
{
    (void)s;
    uint64_t n = 32 * MiB;
    ft_pattern(F.buf, n, 13, 0);
    /* the peer hashes its memory the moment the notification arrives */
    assert_int_equal(ft_peer_send(&F.peer, "waitnotify 7 2 30000 0 %llu", (unsigned long long)n), 0);
    ferry_op ops[34];
    for (int i = 0; i < 16; i++)
        ops[i] = wr(F.buf + i * 2 * MiB, 2 * MiB, i * 2 * MiB);
    ops[16] = nt(7, 41);
    for (int i = 16; i < 32; i++)
        ops[i + 1] = wr(F.buf + i * MiB * 2, 2 * MiB, i * 2 * MiB);
    ops[33] = nt(7, 42);
    assert_int_equal(run(ops, 34, 30000), FERRY_TICKET_COMPLETED);
    char reply[256];
    assert_int_equal(ft_peer_reply(&F.peer, reply, sizeof reply, 30000), 0);
    uint64_t h = strtoull(reply + 3, NULL, 16);
    assert_true(h == ft_hash(F.buf, n));
    assert_non_null(strstr(reply, " 41 42"));   /* in order */
}

/* Many notifies interleaved with writes, chunks spread over every stream:
 * the notifies arrive in batch order, each after its writes. */
static void test_notify_order_stress(void **s)
{
    (void)s;
    enum { NN = 50, PER = 3 };
    uint64_t piece = 384 * 1024;
    ft_pattern(F.buf, NN * PER * piece, 17, 0);
    for (int round = 0; round < 4; round++) {
        assert_int_equal(ft_peer_send(&F.peer, "waitnotify 11 %d 30000 0 %llu", NN,
                                      (unsigned long long)(NN * PER * piece)), 0);
        ferry_op ops[NN * (PER + 1)];
        size_t n = 0;
        for (int k = 0; k < NN; k++) {
            for (int j = 0; j < PER; j++) {
                uint64_t off = (uint64_t)(k * PER + j) * piece;
                ops[n++] = wr(F.buf + off, piece, off);
            }
            ops[n++] = nt(11, (uint64_t)k);
        }
        assert_int_equal(run(ops, n, 30000), FERRY_TICKET_COMPLETED);
        char reply[1024];
        assert_int_equal(ft_peer_reply(&F.peer, reply, sizeof reply, 30000), 0);
        assert_true(strtoull(reply + 3, NULL, 16) == ft_hash(F.buf, NN * PER * piece));
        char *p = strchr(reply + 3, ' ');
        for (int k = 0; k < NN; k++) {
            assert_non_null(p);
            assert_int_equal(strtoull(p + 1, &p, 10), (unsigned long long)k);
        }
    }
}

/* ---- refused accesses --------------------------------------------------------- */

static void assert_refused(ferry_op op, int want_err)
{
    uint64_t before = ft_peer_hash(&F.peer, 0, F.rr.len);
    ferry_ticket *t;
    assert_int_equal(ferry_submit(F.e, &op, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_ABORTED);
    assert_int_equal(ferry_ticket_error(t, NULL), want_err);
    /* the detail names the op, its peer and that the peer refused it */
    ferry_error err = {0};
    char what[64];
    snprintf(what, sizeof what, "op 0 (%s of ", op.opcode == FERRY_OP_WRITE ? "WRITE" : "READ");
    assert_int_equal(ferry_ticket_error(t, &err), want_err);
    ft_assert_says(&err, want_err, what, "refused by the peer", "ended ABORTED");
    assert_int_equal(ferry_ticket_bytes(t), 0);
    ferry_ticket_free(t);
    assert_true(ft_peer_hash(&F.peer, 0, F.rr.len) == before);   /* target untouched */
}

/* A write at off lands and reads back from the peer. */
static void assert_serving_at(uint64_t off)
{
    ft_pattern(F.buf, 4096, 99, 0);
    ferry_op w = wr(F.buf, 4096, off);
    assert_int_equal(run(&w, 1, 30000), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&F.peer, off, 4096) == ft_hash(F.buf, 4096));
}

static void assert_still_serving(void) { assert_serving_at(0); }

static void test_wrong_key(void **s)
{
    (void)s;
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill 5"), 0);
    ferry_op w = wr(F.buf, 4096, 0);
    w.key ^= 0x5555;
    assert_refused(w, FERRY_EACCES);
    ferry_op r = rd(F.buf, 4096, 0);
    r.key += 1;
    memset(F.buf, 0xAB, 4096);
    assert_refused(r, FERRY_EACCES);
    assert_int_equal(F.buf[100], 0xAB);   /* local buffer untouched too */
    assert_still_serving();
}

static void test_out_of_bounds(void **s)
{
    (void)s;
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill 6"), 0);
    assert_refused(wr(F.buf, 20, F.rr.len - 10), FERRY_EFAULT);
    ferry_op below = wr(F.buf, 16, 0);
    below.remote_addr = F.rr.addr - 8;
    assert_refused(below, FERRY_EFAULT);
    assert_refused(rd(F.buf, 2 * MiB, F.rr.len - MiB), FERRY_EFAULT);
    /* several chunks, only the last outside: no chunk may land */
    assert_refused(wr(F.buf, 16 * MiB + 5, F.rr.len - 12 * MiB), FERRY_EFAULT);
    assert_refused(rd(F.buf, 16 * MiB + 5, F.rr.len - 12 * MiB), FERRY_EFAULT);
    assert_still_serving();
}

static void test_not_remote_accessible(void **s)
{
    (void)s;
    ft_peer ro, none;
    ferry_remote_region rro, rnone;
    start_peer(&ro, &rro, &(ft_peer_opts){.size = MiB, .flags = "r"});
    start_peer(&none, &rnone, &(ft_peer_opts){.size = MiB, .flags = "none"});
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = F.buf, .len = 64, .peer = rro.peer,
                  .remote_addr = rro.addr, .key = rro.key};
    assert_int_equal(run(&w, 1, 30000), FERRY_TICKET_ABORTED);
    w.opcode = FERRY_OP_READ;
    assert_int_equal(run(&w, 1, 30000), FERRY_TICKET_COMPLETED);   /* reading is allowed */
    ferry_op r = {.opcode = FERRY_OP_READ, .local = F.buf, .len = 64, .peer = rnone.peer,
                  .remote_addr = rnone.addr, .key = rnone.key};
    assert_int_equal(run(&r, 1, 30000), FERRY_TICKET_ABORTED);
    ft_peer_stop(&ro);
    ft_peer_stop(&none);
    assert_still_serving();
}

static void test_local_not_registered(void **s)
{
    (void)s;
    uint8_t stack[64];
    ferry_op w = wr(stack, sizeof stack, 0);
    ferry_ticket *t = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, &err), FERRY_EFAULT);
    assert_null(t);
    ft_assert_says(&err, FERRY_EFAULT, "op 0: local buffer", "+64 is not inside a registered region", NULL);
    w = wr(F.buf + F.buflen - 8, 16, 0);   /* runs past the local region */
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, &err), FERRY_EFAULT);
    ft_assert_says(&err, FERRY_EFAULT, "op 0: local buffer", "+16 is not inside a registered region", NULL);
    w = wr(F.buf, 16, 0);
    w.peer = 999;
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, &err), FERRY_ENOENT);
    ft_assert_says(&err, FERRY_ENOENT, "op 0: no peer 999", NULL, NULL);
    w.peer = F.rr.peer;
    w.len = 0;
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, NULL), FERRY_EINVAL);
    assert_still_serving();
}

static void test_wrong_token_refused(void **s)
{
    (void)s;
    ft_peer other;
    start_peer(&other, NULL, &(ft_peer_opts){.size = MiB, .token = "another-cluster-token"});
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(F.e, other.desc, other.desc_len, &rr, NULL), FERRY_EAUTH);
    /* the refusing process keeps serving its own cluster */
    ferry_engine_config c;
    ft_config(&c, g_tp);
    memcpy(c.token, "another-cluster-token", 21);
    c.token_len = 21;
    ferry_engine *e2;
    open_engine(&e2, &c);
    ferry_remote_region rr2;
    assert_int_equal(ferry_region_import(e2, other.desc, other.desc_len, &rr2, NULL), 0);
    void *m;
    ferry_region *lr;
    assert_int_equal(ferry_mem_alloc(e2, 4096, &m, NULL), 0);
    assert_int_equal(ferry_region_register(e2, m, 4096, 0, FERRY_MEM_HOST, &lr, NULL), 0);
    ft_pattern(m, 4096, 3, 0);
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = m, .len = 4096, .peer = rr2.peer,
                  .remote_addr = rr2.addr, .key = rr2.key};
    ferry_ticket *t;
    assert_int_equal(ferry_submit(e2, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t);
    assert_true(ft_peer_hash(&other, 0, 4096) == ft_hash(m, 4096));
    char reply[128];
    unsigned long long refused, auth, frames;
    assert_int_equal(ft_peer_cmd(&other, reply, sizeof reply, 30000, "stats"), 0);
    assert_int_equal(sscanf(reply, "OK %llu %llu %llu", &refused, &auth, &frames), 3);
    assert_true(auth >= 1);
    ferry_engine_close(e2);
    ft_peer_stop(&other);
}

/* ---- strided ops ------------------------------------------------------------- */

static ferry_op strided(ferry_op o, uint64_t count, uint64_t lstride, uint64_t rstride)
{
    o.count = count;
    o.local_stride = lstride;
    o.remote_stride = rstride;
    return o;
}

/* A strided WRITE over a peer filled with `seed`: the peer's bytes in
 * [0, check) must be the fill with exactly the rows replaced. */
static void strided_write_case(uint64_t seed, uint64_t loff, uint64_t roff, uint64_t rows,
                               uint64_t len, uint64_t ls, uint64_t rs)
{
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill %llu", (unsigned long long)seed), 0);
    uint64_t lext = (rows - 1) * ls + len, rext = (rows - 1) * rs + len;
    uint64_t check = roff + rext + 4096;
    assert_true(loff + lext <= F.buflen && check <= F.rr.len);
    ft_pattern(F.buf + loff, lext, seed + 1, 0);
    uint8_t *want = malloc(check);
    ft_pattern(want, check, seed, 0);
    for (uint64_t i = 0; i < rows; i++)
        memcpy(want + roff + i * rs, F.buf + loff + i * ls, len);
    ferry_op w = strided(wr(F.buf + loff, len, roff), rows, ls, rs);
    ferry_ticket *t;
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 60000), FERRY_TICKET_COMPLETED);
    assert_int_equal(ferry_ticket_bytes(t), rows * len);
    ferry_ticket_free(t);
    assert_true(ft_peer_hash(&F.peer, 0, check) == ft_hash(want, check));
    free(want);
}

/* A strided READ from a peer filled with `seed` into a local buffer set to
 * 0xC5: every row matches the peer, every other byte is still 0xC5. */
static void strided_read_case(uint64_t seed, uint64_t loff, uint64_t roff, uint64_t rows,
                              uint64_t len, uint64_t ls, uint64_t rs)
{
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill %llu", (unsigned long long)seed), 0);
    uint64_t lext = (rows - 1) * ls + len, check = loff + lext + 4096;
    assert_true(check <= F.buflen && roff + (rows - 1) * rs + len <= F.rr.len);
    memset(F.buf, 0xC5, check);
    uint8_t *want = malloc(check), *row = malloc(len);
    memset(want, 0xC5, check);
    for (uint64_t i = 0; i < rows; i++) {
        ft_pattern(row, len, seed, roff + i * rs);
        memcpy(want + loff + i * ls, row, len);
    }
    ferry_op r = strided(rd(F.buf + loff, len, roff), rows, ls, rs);
    assert_int_equal(run(&r, 1, 60000), FERRY_TICKET_COMPLETED);
    assert_memory_equal(F.buf, want, check);
    free(row);
    free(want);
}

static void test_strided(void **s)
{
    (void)s;
    /* odd sizes and strides; strided remote with contiguous local (the
     * TP-column case) and the reverse; rows spread over several chunks;
     * rows larger than a chunk (each row split) */
    strided_write_case(40, 3, 7, 300, 2050, 2051, 4099);
    strided_write_case(41, 0, 64, 512, 2048, 2048, 8192);
    strided_write_case(42, 5, 1, 700, 6144, 12288, 6144);
    strided_write_case(43, 0, 0, 3000, 2050, 2050, 4100);
    strided_write_case(44, 1, 3, 3, 3 * MiB + 1, 3 * MiB + 9, 4 * MiB);
    strided_write_case(45, 0, 9, 1, 4096, 0, 0);   /* count 1: one contiguous run */
    strided_read_case(50, 3, 7, 300, 2050, 4099, 2051);
    strided_read_case(51, 0, 64, 512, 2048, 8192, 2048);
    strided_read_case(52, 1, 5, 3000, 2050, 4100, 2050);
    strided_read_case(53, 2, 3, 3, 3 * MiB + 1, 4 * MiB, 3 * MiB + 9);
    strided_read_case(54, 0, 0, 100, 8, 8, 0);     /* remote stride 0: one row read 100 times */
    assert_still_serving();
}

/* A strided WRITE, then a NOTIFY: the peer hashes its memory when the
 * notification arrives, so every row must be visible by then. NOTIFY
 * ignores the strided fields. */
static void test_strided_then_notify(void **s)
{
    (void)s;
    const uint64_t rows = 2000, len = 3000, rs = 4096, span = (rows - 1) * rs + len;
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill 60"), 0);
    uint8_t *want = malloc(span);
    ft_pattern(want, span, 60, 0);
    ft_pattern(F.buf, rows * len, 61, 0);
    for (uint64_t i = 0; i < rows; i++)
        memcpy(want + i * rs, F.buf + i * len, len);
    assert_int_equal(ft_peer_send(&F.peer, "waitnotify 8 1 30000 0 %llu", (unsigned long long)span), 0);
    ferry_op ops[2] = {strided(wr(F.buf, len, 0), rows, len, rs), strided(nt(8, 77), 5, 1, 1)};
    assert_int_equal(run(ops, 2, 30000), FERRY_TICKET_COMPLETED);
    char reply[256];
    assert_int_equal(ft_peer_reply(&F.peer, reply, sizeof reply, 30000), 0);
    assert_true(strtoull(reply + 3, NULL, 16) == ft_hash(want, span));
    assert_non_null(strstr(reply, " 77"));
    free(want);
}

static void test_strided_refused(void **s)
{
    (void)s;
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill 7"), 0);
    /* only the last row runs one byte past the region: no row may land */
    const uint64_t rows = 1000, len = 4096, rs = 8192;
    uint64_t roff = F.rr.len - ((rows - 1) * rs + len) + 1;
    assert_refused(strided(wr(F.buf, len, roff), rows, len, rs), FERRY_EFAULT);
    memset(F.buf, 0xAB, rows * len);
    assert_refused(strided(rd(F.buf, len, roff), rows, len, rs), FERRY_EFAULT);
    for (uint64_t i = 0; i < rows * len; i++)
        if (F.buf[i] != 0xAB)
            fail_msg("local byte %llu changed by a refused READ", (unsigned long long)i);
    /* the same rows one byte lower fit */
    ft_pattern(F.buf, rows * len, 8, 0);
    ferry_op ok = strided(wr(F.buf, len, roff - 1), rows, len, rs);
    assert_int_equal(run(&ok, 1, 30000), FERRY_TICKET_COMPLETED);

    /* overflowing arithmetic: nothing is submitted */
    ferry_ticket *t = NULL;
    ferry_op o = strided(wr(F.buf, 16, 0), UINT64_MAX / 2, 16, 4);          /* count*len */
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EINVAL);
    o = strided(wr(F.buf, 16, 0), 3, 16, UINT64_MAX / 2);                    /* (count-1)*remote_stride */
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EINVAL);
    o = strided(wr(F.buf, 16, 0), 3, UINT64_MAX / 2, 16);                    /* (count-1)*local_stride */
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EINVAL);
    o = strided(wr(F.buf, 16, 0), 2, 16, UINT64_MAX - F.rr.addr);            /* remote end */
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EINVAL);
    o = strided(wr(F.buf, 0, 0), 4, 16, 16);                                 /* zero-length rows */
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EINVAL);

    /* local extent outside registered memory: the first row is inside, the
     * last runs past the region; and unregistered memory altogether */
    o = strided(wr(F.buf, 64, 0), 3, F.buflen / 2, 64);
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EFAULT);
    o = strided(rd(F.buf, 64, 0), 3, F.buflen / 2, 64);
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EFAULT);
    uint8_t stack[256];
    o = strided(wr(stack, 16, 0), 4, 64, 64);
    assert_int_equal(ferry_submit(F.e, &o, 1, 0, &t, NULL), FERRY_EFAULT);
    assert_null(t);
    assert_still_serving();
}

/* Chunks the engine cuts a strided op into for the transport under test:
 * rows grouped up to the chunk size and the transport's row limit, or one
 * row a chunk where it takes no rows. */
static uint64_t strided_chunks(uint64_t rows, uint64_t len, uint64_t rstride)
{
    const fr_transport *tp = strcmp(g_tp, "shm") == 0 ? &fr_transport_shm : &fr_transport_tcp;
#ifdef FERRY_HAVE_UCX
    if (strcmp(g_tp, "ucx") == 0)
        tp = &fr_transport_ucx;
#endif
    uint64_t cs = tp->max_chunk ? tp->max_chunk : F.e->cfg.tcp_chunk;
    if (!tp->strided || (tp->disjoint_rows && rstride < len))
        return rows;
    uint64_t per = cs / len;
    if (tp->max_rows && per > tp->max_rows)
        per = tp->max_rows;
    return (rows + per - 1) / per;
}

static uint64_t peer_refusals(void)
{
    char reply[128];
    unsigned long long refused, auth, frames;
    assert_int_equal(ft_peer_cmd(&F.peer, reply, sizeof reply, 30000, "stats"), 0);
    assert_int_equal(sscanf(reply, "OK %llu %llu %llu", &refused, &auth, &frames), 3);
    return refused;
}

/* One strided op, counted: completions (one per chunk: over tcp one per
 * request) as ops_completed here, and, over tcp, requests the peer refused
 * as its remote_refused. */
static uint64_t completions_of(ferry_op op, int want_state)
{
    ferry_engine_stats a, b;
    ferry_engine_get_stats(F.e, &a);
    assert_int_equal(run(&op, 1, 60000), want_state);
    ferry_engine_get_stats(F.e, &b);
    return (b.ops_completed - a.ops_completed) + (b.ops_failed - a.ops_failed);
}

/* A strided op costs a request per chunk of rows, not per row: a TP column
 * shard (4096 rows of 1 KiB, stride 4 KiB) is a handful of requests over
 * tcp (its row limit) and over shm (its chunk size), and a peer that
 * refuses it counts one refusal per request it was sent. Rows that overlap
 * at the target still go one by one over tcp (the wire carries disjoint
 * rows only). */
static void test_strided_requests(void **s)
{
    (void)s;
    const uint64_t rows = 4096, len = 1024, rs = 4096, span = (rows - 1) * rs + len;
    const uint64_t want = strided_chunks(rows, len, rs);
    assert_true(want <= rows / 256);   /* not a request per row */
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "fill 70"), 0);
    uint8_t *expect = malloc(span);
    ft_pattern(expect, span, 70, 0);
    ft_pattern(F.buf, rows * len, 71, 0);
    for (uint64_t i = 0; i < rows; i++)
        memcpy(expect + i * rs, F.buf + i * len, len);
    assert_int_equal(completions_of(strided(wr(F.buf, len, 0), rows, len, rs), FERRY_TICKET_COMPLETED), want);
    assert_true(ft_peer_hash(&F.peer, 0, span) == ft_hash(expect, span));
    /* back into rows 2 KiB apart locally: scattered on arrival */
    memset(F.buf, 0xC5, rows * 2 * len);
    assert_int_equal(completions_of(strided(rd(F.buf, len, 0), rows, 2 * len, rs), FERRY_TICKET_COMPLETED), want);
    for (uint64_t i = 0; i < rows; i++) {
        assert_memory_equal(F.buf + i * 2 * len, expect + i * rs, len);
        assert_int_equal(F.buf[i * 2 * len + len], 0xC5);
    }
    free(expect);

    /* the last row one byte out: every request refused, none applied */
    const uint64_t roff = F.rr.len - span + 1;
    uint64_t before = peer_refusals();
    assert_int_equal(completions_of(strided(wr(F.buf, len, roff), rows, len, rs), FERRY_TICKET_ABORTED), want);
    uint64_t refused = peer_refusals() - before;
    assert_int_equal(refused, strcmp(g_tp, "tcp") == 0 ? want : 0);   /* shm checks at the initiator */

    /* overlapping remote rows (stride 0: the same row read 64 times) */
    assert_int_equal(completions_of(strided(rd(F.buf, 512, 0), 64, 512, 0), FERRY_TICKET_COMPLETED),
                     strided_chunks(64, 512, 0));
    assert_still_serving();
}

/* ---- failures of the peer --------------------------------------------------------- */

/* A batch that cannot finish while the peer is stopped: writes, then a
 * notification that needs the peer to answer. The path is warmed first (a
 * shm initiator maps the target's memory on first use, which needs the
 * target awake), so the stall hits mid-stream, after I/O began. */
static ferry_ticket *submit_stalled(void)
{
    ferry_op warm = wr(F.buf, 4096, 0);
    assert_int_equal(run(&warm, 1, 30000), FERRY_TICKET_COMPLETED);
    ft_peer_signal(&F.peer, SIGSTOP);
    ft_pattern(F.buf, 4 * MiB, 21, 0);
    ferry_op ops[2] = {wr(F.buf, 4 * MiB, 0), nt(3, 1)};
    ferry_ticket *t;
    assert_int_equal(ferry_submit(F.e, ops, 2, 0, &t, NULL), 0);
    return t;
}

static void test_timeout_unknown_fences(void **s)
{
    (void)s;
    ferry_ticket *t = submit_stalled();
    assert_int_equal(ferry_ticket_wait(t, 200), FERRY_TICKET_UNKNOWN);
    assert_int_equal(ferry_ticket_test(t), FERRY_TICKET_UNKNOWN);
    ferry_pending_info info[4];
    assert_int_equal(ferry_engine_pending(F.e, info, 4), 1);
    assert_int_equal(info[0].peer, F.rr.peer);
    /* registrations stay pinned, the peer is fenced */
    assert_int_equal(ferry_region_unregister(F.lr, NULL), FERRY_EBUSY);
    ferry_op w = wr(F.buf, 64, 0);
    ferry_ticket *t2 = NULL;
    assert_int_equal(ferry_submit(F.e, &w, 1, 0, &t2, NULL), FERRY_EFENCED);
    /* the peer comes back: the ticket drains, the fence lifts */
    ft_peer_signal(&F.peer, SIGCONT);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t);
    assert_int_equal(ferry_engine_pending(F.e, NULL, 0), 0);
    assert_still_serving();
    assert_int_equal(ferry_region_unregister(F.lr, NULL), 0);
    F.lr = NULL;
}

static void test_reset_drains_unknown(void **s)
{
    (void)s;
    ferry_ticket *t = submit_stalled();
    assert_int_equal(ferry_ticket_wait(t, 200), FERRY_TICKET_UNKNOWN);
    ferry_ticket_free(t);   /* the pending-transfer manager keeps it */
    assert_int_equal(ferry_engine_pending(F.e, NULL, 0), 1);
    assert_int_equal(ferry_peer_reset(F.e, F.rr.peer), 0);
    /* the reset drained it: nothing pending, nothing pinned */
    assert_int_equal(ferry_engine_pending(F.e, NULL, 0), 0);
    ferry_engine_stats st;
    ferry_engine_get_stats(F.e, &st);
    assert_int_equal(st.tickets_completed, 1);   /* the warm-up only */
    assert_int_equal(st.tickets_failed, 1);      /* the writes had begun */
    assert_int_equal(st.tickets_aborted, 0);
    if (strcmp(g_tp, "ucx") == 0 && getenv("UCX_TLS") && strstr(getenv("UCX_TLS"), "tcp")) {
        /* UCX 1.13's tcp transport aborts one process or the other now and
         * then (an internal assertion, tcp_ep.c:294, in its connection
         * matching) when a peer whose endpoint was force-closed while it
         * was stopped resumes and is connected to again: about 2 runs in
         * 100 of this test beside CPU hogs. Not ours to fix; docs/engine.md
         * says so. Here the reset peer is replaced rather than resumed, and
         * the engine must reach the new one. */
        ft_peer_signal(&F.peer, SIGKILL);
        assert_int_equal(ft_peer_wait_exit(&F.peer, 10000), 0);
        ft_peer_stop(&F.peer);
        start_peer(&F.peer, &F.rr, &(ft_peer_opts){.size = 64 * MiB});
        assert_still_serving();
        return;
    }
    /* The peer was stopped, not dead: what it had already received of the
     * failed writes (in its socket buffer) it may still apply when it
     * resumes, at any time after this; a reset frees this side, it cannot
     * recall bytes from the peer. So the check writes where they never
     * reach (they cover [0, 4 MiB)). */
    ft_peer_signal(&F.peer, SIGCONT);
    assert_serving_at(8 * MiB);   /* reconnects */
}

static void test_peer_killed_mid_transfer(void **s)
{
    (void)s;
    ferry_ticket *t = submit_stalled();
    /* I/O has begun and cannot finish: the wait times out, the peer is fenced */
    assert_int_equal(ferry_ticket_wait(t, 200), FERRY_TICKET_UNKNOWN);
    ferry_op w0 = wr(F.buf, 64, 0);
    ferry_ticket *t0 = NULL;
    assert_int_equal(ferry_submit(F.e, &w0, 1, 0, &t0, NULL), FERRY_EFENCED);
    ft_peer_signal(&F.peer, SIGKILL);
    assert_int_equal(ft_peer_wait_exit(&F.peer, 10000), 0);
    int st = ferry_ticket_wait(t, 30000);
    assert_int_equal(st, FERRY_TICKET_FAILED_DRAINED);   /* the writes began: never COMPLETED */
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_ECONNRESET);
    ferry_error err = {0};
    assert_int_equal(ferry_ticket_error(t, &err), FERRY_ECONNRESET);
    /* its first failed op: the WRITE or the NOTIFY after it, whichever the lost connection failed first */
    ft_assert_says(&err, FERRY_ECONNRESET, "op ", "connection to the peer was lost", "ended FAILED_DRAINED");
    ferry_ticket_free(t);
    assert_int_equal(ferry_engine_pending(F.e, NULL, 0), 0);
    /* the dead peer refuses new work, saying which; another peer is served */
    ferry_op w = wr(F.buf, 64, 0);
    ferry_ticket *t2 = NULL;
    char peer[48];
    snprintf(peer, sizeof peer, "op 0: cannot connect to peer %u ", F.rr.peer);
    assert_true(ferry_submit(F.e, &w, 1, 0, &t2, &err) < 0);
    ft_assert_says(&err, err.code, peer, NULL, NULL);
    ft_peer_stop(&F.peer);
    start_peer(&F.peer, &F.rr, &(ft_peer_opts){.size = MiB});
    assert_still_serving();
}

/* A port for a peer that must come back on the same address, taken below
 * the kernel's ephemeral range: a port from binding port 0 could go to any
 * other process's connect() or bind(:0) between the peer's stop and its
 * restart, and on a busy machine running tests side by side that is a
 * chance, not never. Bound once with SO_REUSEADDR, as the listener does. */
static uint16_t free_port(void)
{
    unsigned lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2)
            lo = 32768;
        fclose(f);
    }
    assert_true(lo > 11000);
    for (int i = 0; i < 1000; i++) {
        uint16_t port = (uint16_t)(10000 + fr_random_u64() % (lo - 10000));
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        assert_true(fd >= 0);
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
        close(fd);
        if (rc == 0)
            return port;
    }
    fail_msg("no free port below %u", lo);
    return 0;
}

static void test_peer_restart_same_address(void **s)
{
    (void)s;
    char listen[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", free_port());
    ft_peer p1, p2;
    ferry_remote_region r1, r2;
    start_peer(&p1, &r1, &(ft_peer_opts){.size = MiB, .listen = listen});
    uint8_t old_desc[FERRY_DESC_MAX];
    size_t old_len = p1.desc_len;
    memcpy(old_desc, p1.desc, old_len);
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = F.buf, .len = 4096, .peer = r1.peer,
                  .remote_addr = r1.addr, .key = r1.key};
    assert_int_equal(run(&w, 1, 30000), FERRY_TICKET_COMPLETED);
    ft_peer_stop(&p1);
    start_peer(&p2, &r2, &(ft_peer_opts){.size = MiB, .listen = listen});
    assert_int_not_equal(r1.peer, r2.peer);
    /* the old descriptor is refused: its submit fails, nothing completes */
    ferry_ticket *t = NULL;
    int rc = ferry_submit(F.e, &w, 1, 0, &t, NULL);
    if (rc == 0) {
        assert_int_not_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
        ferry_ticket_free(t);
    }
    ferry_remote_region again;
    rc = ferry_region_import(F.e, old_desc, old_len, &again, NULL);
    assert_true(rc == FERRY_ESTALE || rc == FERRY_ECONNREFUSED);
    if (strcmp(g_tp, "tcp") == 0)
        assert_int_equal(rc, FERRY_ESTALE);
    /* the new one works */
    w.peer = r2.peer;
    w.remote_addr = r2.addr;
    w.key = r2.key;
    ft_pattern(F.buf, 4096, 77, 0);
    assert_int_equal(run(&w, 1, 30000), FERRY_TICKET_COMPLETED);
    assert_true(ft_peer_hash(&p2, 0, 4096) == ft_hash(F.buf, 4096));
    ft_peer_stop(&p2);
}

/* ---- raw sockets sending garbage ------------------------------------------------------ */

static int raw_connect(void)
{
    fr_endpoint ep;
    assert_int_equal(fr_endpoint_decode(F.peer.ep, F.peer.ep_len, &ep), 0);
    int fd;
    if (strcmp(g_tp, "shm") != 0) {   /* tcp, or the ucx control port */
        uint16_t port = strcmp(g_tp, "ucx") == 0 ? ep.ucx_port : ep.port;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
        memcpy(&a.sin_addr, ep.addr, 4);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    } else {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        size_t nl = strlen(ep.uds);
        memcpy(a.sun_path + 1, ep.uds, nl);
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        assert_int_equal(connect(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)), 0);
    }
    fr_sock_timeouts(fd, 10000);
    return fd;
}

/* An authenticated raw connection, as a real client would have. */
static int raw_authed(void)
{
    int fd = raw_connect();
    fr_peer fake = {.id = 0};
    assert_int_equal(fr_endpoint_decode(F.peer.ep, F.peer.ep_len, &fake.ep), 0);
    uint16_t role = strcmp(g_tp, "tcp") == 0 ? FR_ROLE_TCP_STREAM
                  : strcmp(g_tp, "ucx") == 0 ? FR_ROLE_UCX_CTRL : FR_ROLE_SHM_CTRL;
    assert_int_equal(fr_auth_client(F.e, fd, &fake, role, 0, NULL, NULL), 0);
    if (role == FR_ROLE_SHM_CTRL) {   /* swallow SHM_HELLO (header + meta; its fd is dropped) */
        uint8_t b[FR_WIRE_HDR_LEN + 8];
        assert_int_equal(fr_read_full(fd, b, sizeof b), 0);
    } else if (role == FR_ROLE_UCX_CTRL) {   /* swallow the worker address (u32 length, bytes) */
        uint8_t lb[4], b[8192];
        assert_int_equal(fr_read_full(fd, lb, 4), 0);
        uint32_t n = lb[0] | (uint32_t)lb[1] << 8 | (uint32_t)lb[2] << 16 | (uint32_t)lb[3] << 24;
        assert_true(n > 0 && n <= sizeof b);
        assert_int_equal(fr_read_full(fd, b, n), 0);
    }
    return fd;
}

static void expect_dropped(int fd)
{
    uint8_t b[64];
    ssize_t r;
    do
        r = read(fd, b, sizeof b);   /* the server closes: EOF (or reset) */
    while (r > 0);
    assert_true(r <= 0);
    close(fd);
}

static void test_corrupt_frames(void **s)
{
    (void)s;
    uint8_t junk[200];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    /* garbage instead of the handshake */
    int fd = raw_connect();
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    expect_dropped(fd);
    /* a truncated frame, then hang up */
    fd = raw_connect();
    assert_int_equal(write(fd, junk, 10), 10);
    close(fd);
    /* after authenticating: a header with a bad check */
    fd = raw_authed();
    uint8_t h[FR_WIRE_HDR_LEN];
    fr_wire_hdr_encode(h, FR_MSG_NOTIFY, 1, 16);
    h[9] ^= 1;
    assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
    expect_dropped(fd);
    /* an oversized length */
    fd = raw_authed();
    fr_wire_hdr_encode(h, FR_MSG_WRITE, 1, FR_WIRE_MAX_DATA + 1000);
    assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
    expect_dropped(fd);
    /* an unknown type */
    fd = raw_authed();
    fr_wire_hdr_encode(h, 77, 1, 0);
    assert_int_equal(write(fd, h, sizeof h), (ssize_t)sizeof h);
    expect_dropped(fd);
    char reply[128];
    unsigned long long refused, auth, frames;
    assert_int_equal(ft_peer_cmd(&F.peer, reply, sizeof reply, 30000, "stats"), 0);
    assert_int_equal(sscanf(reply, "OK %llu %llu %llu", &refused, &auth, &frames), 3);
    assert_true(frames >= 3);
    assert_true(auth >= 1);
    assert_still_serving();
}

/* ---- window and cleanup ------------------------------------------------------------------ */

static int setup_window(void **s)
{
    (void)s;
    memset(&F, 0, sizeof F);
    ferry_engine_config c;
    ft_config(&c, g_tp);
    c.window_ops = 2;
    open_engine(&F.e, &c);
    start_peer(&F.peer, &F.rr, &(ft_peer_opts){.size = 8 * MiB});
    local_buf(8 * MiB);
    return 0;
}

static void test_window_full(void **s)
{
    (void)s;
    ft_peer_signal(&F.peer, SIGSTOP);
    ferry_op n2[2] = {nt(1, 1), nt(1, 2)};
    ferry_ticket *t1, *t2 = NULL;
    assert_int_equal(ferry_submit(F.e, n2, 2, 0, &t1, NULL), 0);   /* fills the 2-op window */
    ferry_op w = wr(F.buf, 4096, 0);
    assert_int_equal(ferry_submit(F.e, &w, 1, FERRY_SUBMIT_NONBLOCK, &t2, NULL), FERRY_EAGAIN);
    assert_null(t2);
    ft_peer_signal(&F.peer, SIGCONT);
    assert_int_equal(ferry_ticket_wait(t1, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t1);
    assert_int_equal(ferry_submit(F.e, &w, 1, FERRY_SUBMIT_NONBLOCK, &t2, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t2, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t2);
    assert_int_equal(ft_peer_cmd(&F.peer, NULL, 0, 30000, "waitnotify 1 2 1000 0 0"), 0);
}

static void test_interrupted_cleanup(void **s)
{
    (void)s;
    size_t base = ferry_engine_region_count(F.e);
    ferry_region *regs[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(ferry_region_register(F.e, F.buf + i * MiB, MiB, 0, FERRY_MEM_HOST, &regs[i], NULL), 0);
    /* pin the middle one with a ticket whose outcome is unknown */
    ft_peer_signal(&F.peer, SIGSTOP);
    ferry_op ops[2] = {{.opcode = FERRY_OP_WRITE, .local = F.buf + MiB + 8, .len = 64, .peer = F.rr.peer,
                        .remote_addr = F.rr.addr, .key = F.rr.key}, nt(9, 9)};
    ferry_ticket *t;
    assert_int_equal(ferry_submit(F.e, ops, 2, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 100), FERRY_TICKET_UNKNOWN);
    /* the op's local buffer lies in regs[1] (the innermost region covering it) */
    int rc = ferry_region_unregister_all(regs, 3, NULL);
    assert_int_equal(rc, FERRY_EBUSY);
    assert_null(regs[0]);
    assert_non_null(regs[1]);   /* recorded as still registered */
    assert_null(regs[2]);
    assert_int_equal(ferry_engine_region_count(F.e), base + 1);
    ft_peer_signal(&F.peer, SIGCONT);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t);
    assert_int_equal(ferry_region_unregister_all(regs, 3, NULL), 0);
    for (int i = 0; i < 3; i++)
        assert_null(regs[i]);
    assert_int_equal(ferry_engine_region_count(F.e), base);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_small, teardown)
static const struct CMUnitTest tests[] = {
    T(test_sizes),
    cmocka_unit_test_setup_teardown(test_one_gib, setup_gib, teardown),
    T(test_many_ops_per_batch),
    T(test_many_tickets_in_flight),
    T(test_notify_after_writes),
    T(test_notify_order_stress),
    T(test_strided),
    T(test_strided_then_notify),
    T(test_strided_refused),
    T(test_strided_requests),
    cmocka_unit_test_setup_teardown(test_strided, setup_heap, teardown),
    cmocka_unit_test_setup_teardown(test_strided_refused, setup_heap, teardown),
    T(test_wrong_key),
    T(test_out_of_bounds),
    T(test_not_remote_accessible),
    T(test_local_not_registered),
    T(test_wrong_token_refused),
    T(test_timeout_unknown_fences),
    T(test_reset_drains_unknown),
    T(test_peer_killed_mid_transfer),
    T(test_peer_restart_same_address),
    T(test_corrupt_frames),
    cmocka_unit_test_setup_teardown(test_window_full, setup_window, teardown),
    T(test_interrupted_cleanup),
};

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    signal(SIGPIPE, SIG_IGN);
    const char *only = getenv("FERRY_TEST_TRANSPORT");
    int fails = 0;
    if (!only || !strcmp(only, "shm")) {
        g_tp = "shm";
        fails += _cmocka_run_group_tests("conformance/shm", tests, sizeof tests / sizeof *tests, NULL, NULL);
    }
    if (!only || !strcmp(only, "tcp")) {
        g_tp = "tcp";
        fails += _cmocka_run_group_tests("conformance/tcp", tests, sizeof tests / sizeof *tests, NULL, NULL);
    }
#ifdef FERRY_HAVE_UCX
    if (only && !strcmp(only, "ucx")) {   /* only when asked: its UCX_TLS says which UCX transports */
        g_tp = "ucx";
        setenv("FERRY_TRANSPORT", "ucx", 1);   /* the peers start their ucx transport too */
        char name[96];
        snprintf(name, sizeof name, "conformance/ucx(UCX_TLS=%s)", getenv("UCX_TLS") ? getenv("UCX_TLS") : "default");
        fails += _cmocka_run_group_tests(name, tests, sizeof tests / sizeof *tests, NULL, NULL);
    }
#endif
    return fails;
}
