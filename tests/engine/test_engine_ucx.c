/* The ucx transport beyond the conformance suite: what a peer without the
 * cluster token gets (nothing: no worker address, no endpoint), region
 * descriptors carrying rkeys, memory from ferry_mem_alloc allocated by UCX,
 * and a peer killed while a large transfer is moving. Runs with whatever UCX_TLS the environment gives (ctest runs it
 * with tcp and with posix,cma,self). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/transport/ucx_int.h"
#include "util/testutil.h"

#define MiB (1024ull * 1024)

static void open_ucx(ferry_engine **e, const char *token)
{
    ferry_engine_config c;
    ft_config(&c, "ucx");
    if (token) {
        memset(c.token, 0, sizeof c.token);
        memcpy(c.token, token, strlen(token));
        c.token_len = strlen(token);
    }
    assert_int_equal(ferry_engine_open(&c, e, NULL), 0);
}

static ucx_state *ucx_of(ferry_engine *e)
{
    return e->tp_state[FR_TP_UCX];
}

static int connect_ctrl(ferry_engine *e)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(e->ep.ucx_port)};
    memcpy(&a.sin_addr, e->ep.addr, 4);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    fr_sock_timeouts(fd, 10000);
    return fd;
}

/* A client with the wrong token is refused at the handshake and then gets
 * EOF: not one byte of the worker address, and no UCX endpoint exists on
 * either side; an engine with the wrong token cannot import a region; the
 * right token gets exactly one address and a working transfer. */
static void test_no_address_without_token(void **s)
{
    (void)s;
    ferry_engine *t;
    open_ucx(&t, NULL);
    void *m;
    ferry_region *r;
    assert_int_equal(ferry_mem_alloc(t, MiB, &m, NULL), 0);
    assert_int_equal(ferry_region_register(t, m, MiB, FERRY_REMOTE_RW, FERRY_MEM_HOST, &r, NULL), 0);
    uint8_t d[FERRY_DESC_MAX];
    int dn = ferry_region_export(r, d, sizeof d);
    assert_true(dn > 0);
    fr_region_desc rd;
    assert_int_equal(fr_region_desc_decode(d, (size_t)dn, &rd), 0);
    assert_true(rd.rkey_len > 0);   /* the rkey travels in the descriptor */

    /* raw: a handshake keyed by another token */
    int fd = connect_ctrl(t);
    uint8_t wrong[32];
    fr_auth_key((const uint8_t *)"not-the-cluster-token", 21, wrong);
    uint64_t inst = 0;
    assert_int_equal(fr_handshake_client(fd, wrong, 42, t->ep.instance, FR_ROLE_UCX_CTRL, 0, &inst, NULL),
                     FERRY_EAUTH);
    uint8_t b[64];
    ssize_t got = read(fd, b, sizeof b);
    assert_true(got <= 0);   /* closed: nothing after the refusal */
    close(fd);

    /* an engine of another cluster */
    ferry_engine *other;
    open_ucx(&other, "not-the-cluster-token");
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(other, d, (size_t)dn, &rr, NULL), FERRY_EAUTH);
    assert_int_equal(atomic_load(&ucx_of(t)->addrs_sent), 0);
    assert_int_equal(atomic_load(&ucx_of(other)->eps_created), 0);
    /* the gate counts a refusal after it has told the client: wait for it */
    ferry_engine_stats st;
    uint64_t deadline = fr_deadline_ns(30000);
    do
        ferry_engine_get_stats(t, &st);
    while (st.auth_refused < 2 && fr_now_ns() < deadline && usleep(1000) == 0);
    assert_true(st.auth_refused >= 2);
    ferry_engine_close(other);

    /* the cluster's own engine */
    ferry_engine *mine;
    open_ucx(&mine, NULL);
    assert_int_equal(ferry_region_import(mine, d, (size_t)dn, &rr, NULL), 0);
    /* the connection may still be finishing on the engine's own thread
     * (seen under ASan beside a loaded machine): wait for it */
    deadline = fr_deadline_ns(30000);
    while ((atomic_load(&ucx_of(t)->addrs_sent) < 1 || atomic_load(&ucx_of(mine)->eps_created) < 1) &&
           fr_now_ns() < deadline && usleep(1000) == 0)
        ;
    assert_int_equal(atomic_load(&ucx_of(t)->addrs_sent), 1);
    assert_int_equal(atomic_load(&ucx_of(mine)->eps_created), 1);
    void *lm;
    ferry_region *lr;
    assert_int_equal(ferry_mem_alloc(mine, 4096, &lm, NULL), 0);
    assert_int_equal(ferry_region_register(mine, lm, 4096, 0, FERRY_MEM_HOST, &lr, NULL), 0);
    ft_pattern(lm, 4096, 5, 0);
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = lm, .len = 4096, .peer = rr.peer,
                  .remote_addr = rr.addr + 100, .key = rr.key};
    ferry_ticket *tk;
    assert_int_equal(ferry_submit(mine, &w, 1, 0, &tk, NULL), 0);
    assert_int_equal(ferry_ticket_wait(tk, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(tk);
    assert_memory_equal((uint8_t *)m + 100, lm, 4096);
    ferry_engine_close(mine);
    ferry_engine_close(t);
}

/* Descriptors of a ucx engine: canonical round trip, the rkey bounded and
 * shaped, and a region that is not remote-accessible has no rkey. */
static void test_descriptor_rkey(void **s)
{
    (void)s;
    ferry_engine *e;
    open_ucx(&e, NULL);
    void *m;
    ferry_region *rw, *none;
    assert_int_equal(ferry_mem_alloc(e, MiB, &m, NULL), 0);
    assert_int_equal(ferry_region_register(e, m, MiB, FERRY_REMOTE_RW, FERRY_MEM_HOST, &rw, NULL), 0);
    assert_int_equal(ferry_region_register(e, m, 4096, 0, FERRY_MEM_HOST, &none, NULL), 0);
    uint8_t d[FERRY_DESC_MAX], d2[FERRY_DESC_MAX];
    int n = ferry_region_export(rw, d, sizeof d);
    assert_true(n > 0);
    fr_region_desc rd;
    assert_int_equal(fr_region_desc_decode(d, (size_t)n, &rd), 0);
    assert_true(rd.ep.transports & FR_TRANSPORT_UCX);
    assert_int_not_equal(rd.ep.ucx_port, 0);
    assert_true(rd.rkey_len > 0 && rd.rkey_len <= FR_DESC_RKEY_MAX);
    assert_true(fr_ucx_rkey_ok(rd.rkey, rd.rkey_len));
    assert_int_equal(fr_region_desc_encode(&rd, d2, sizeof d2), n);
    assert_memory_equal(d, d2, (size_t)n);
    /* truncated rkeys are refused: cut one byte off and reseal */
    for (uint16_t k = 1; k < rd.rkey_len; k++) {
        fr_region_desc cut = rd;
        memset(cut.rkey + k, 0, FR_DESC_RKEY_MAX - k);
        cut.rkey_len = k;
        if (!fr_ucx_rkey_ok(cut.rkey, k))
            assert_true(fr_region_desc_encode(&cut, d2, sizeof d2) == FERRY_EINVAL);
    }
    assert_false(fr_ucx_rkey_ok(rd.rkey, 8));   /* no memory type byte */
    int k = ferry_region_export(none, d, sizeof d);
    assert_true(k > 0);
    assert_int_equal(fr_region_desc_decode(d, (size_t)k, &rd), 0);
    assert_int_equal(rd.rkey_len, 0);
    ferry_engine_close(e);
}

/* A peer SIGKILLed while large writes to it are in flight (nothing
 * stopped: the kill lands wherever the transfer is). Every ticket ends
 * (none hangs, nothing stays pending), and once one has failed no later
 * one is COMPLETED: each ticket's notify is acknowledged by the peer over
 * the same connection, in order, so a COMPLETED after a failure would be a
 * completion reported after the peer was gone. (The deterministic version,
 * the peer stopped and then killed mid-ticket, is the conformance suite's
 * test_peer_killed_mid_transfer.) */
static void test_killed_while_moving(void **s)
{
    (void)s;
    ferry_engine *e;
    open_ucx(&e, NULL);
    ft_peer p;
    assert_int_equal(ft_peer_start(&p, &(ft_peer_opts){.size = 256 * MiB}), 0);
    ferry_remote_region rr;
    assert_int_equal(ferry_region_import(e, p.desc, p.desc_len, &rr, NULL), 0);
    void *m;
    ferry_region *lr;
    assert_int_equal(ferry_mem_alloc(e, 256 * MiB, &m, NULL), 0);
    assert_int_equal(ferry_region_register(e, m, 256 * MiB, 0, FERRY_MEM_HOST, &lr, NULL), 0);
    enum { N = 8 };
    ferry_ticket *tk[N];
    for (int i = 0; i < N; i++) {
        ferry_op w = {.opcode = FERRY_OP_WRITE, .local = m, .len = 256 * MiB, .peer = rr.peer,
                      .remote_addr = rr.addr, .key = rr.key};
        ferry_op ops[2] = {w, {.opcode = FERRY_OP_NOTIFY, .peer = rr.peer, .tag = 1, .value = (uint64_t)i}};
        assert_int_equal(ferry_submit(e, ops, 2, 0, &tk[i], NULL), 0);
    }
    ft_peer_signal(&p, SIGKILL);
    assert_int_equal(ft_peer_wait_exit(&p, 10000), 0);
    bool failed = false;
    for (int i = 0; i < N; i++) {
        int st = ferry_ticket_wait(tk[i], 60000);
        assert_true(st == FERRY_TICKET_COMPLETED || st == FERRY_TICKET_FAILED_DRAINED ||
                    st == FERRY_TICKET_ABORTED);
        if (st == FERRY_TICKET_COMPLETED)
            assert_false(failed);
        else
            failed = true;
        ferry_ticket_free(tk[i]);
    }
    assert_int_equal(ferry_engine_pending(e, NULL, 0), 0);
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = m, .len = 64, .peer = rr.peer,
                  .remote_addr = rr.addr, .key = rr.key};
    ferry_ticket *t2 = NULL;
    assert_true(ferry_submit(e, &w, 1, 0, &t2, NULL) < 0);   /* the dead peer refuses new work */
    ft_peer_stop(&p);
    ferry_engine_close(e);
}

/* A key that came without its descriptor (endpoint from ferry_peer_add,
 * address and key from elsewhere, as pull-on-demand and the subscriber
 * do): the target describes the region over the control connection and
 * the write lands; a key it does not have is refused untouched. */
static void test_key_without_descriptor(void **s)
{
    (void)s;
    ferry_engine *e;
    open_ucx(&e, NULL);
    ft_peer p;
    assert_int_equal(ft_peer_start(&p, &(ft_peer_opts){.size = MiB}), 0);
    fr_region_desc rd;
    assert_int_equal(fr_region_desc_decode(p.desc, p.desc_len, &rd), 0);
    ferry_peer_id id;
    assert_int_equal(ferry_peer_add(e, p.ep, p.ep_len, &id, NULL), 0);
    void *m;
    ferry_region *lr;
    assert_int_equal(ferry_mem_alloc(e, 64 * 1024, &m, NULL), 0);
    assert_int_equal(ferry_region_register(e, m, 64 * 1024, 0, FERRY_MEM_HOST, &lr, NULL), 0);
    assert_int_equal(ft_peer_cmd(&p, NULL, 0, 30000, "fill 9"), 0);
    uint64_t before = ft_peer_hash(&p, 0, MiB);
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = m, .len = 4096, .peer = id,
                  .remote_addr = rd.base + 8192, .key = rd.key ^ 1};
    ferry_ticket *t;
    assert_int_equal(ferry_submit(e, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_ABORTED);
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_EACCES);
    ferry_ticket_free(t);
    assert_true(ft_peer_hash(&p, 0, MiB) == before);
    ft_pattern(m, 4096, 11, 0);
    w.key = rd.key;
    assert_int_equal(ferry_submit(e, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t);
    assert_true(ft_peer_hash(&p, 8192, 4096) == ft_hash(m, 4096));
    w.remote_addr = rd.base + MiB - 100;   /* the description bounds it too */
    assert_int_equal(ferry_submit(e, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_ABORTED);
    assert_int_equal(ferry_ticket_error(t, NULL), FERRY_EFAULT);
    ferry_ticket_free(t);
    ft_peer_stop(&p);
    ferry_engine_close(e);
}

/* ferry_mem_alloc of an engine on ucx is UCX's own allocation (no memfd),
 * the way ucx_perftest allocates: another engine's writes land in it, its
 * region's rkey comes from that allocation, it is freed like any other
 * (EBUSY while a region covers it), and one still allocated at the
 * engine's close goes with it. */
static void test_mem_alloc_is_ucx_memory(void **s)
{
    (void)s;
    ferry_engine *e, *e2;
    open_ucx(&e, NULL);
    open_ucx(&e2, NULL);
    void *m, *kept, *src;
    assert_int_equal(ferry_mem_alloc(e, 4 * MiB, &m, NULL), 0);
    assert_int_equal(ferry_mem_alloc(e, MiB, &kept, NULL), 0);
    fr_mem *fm = NULL;
    for (size_t i = 0; i < e->nmems; i++)
        if (e->mems[i]->addr == m)
            fm = e->mems[i];
    assert_non_null(fm);
    assert_non_null(fm->tp_handle);
    assert_int_equal(fm->fd, -1);
    ferry_region *rw, *lr;
    assert_int_equal(ferry_region_register(e, m, 4 * MiB, FERRY_REMOTE_RW, FERRY_MEM_HOST, &rw, NULL), 0);
    assert_null(rw->tp_handle);            /* the allocation's mapping, not one of its own */
    assert_true(rw->rkey_len > 0);
    uint8_t d[FERRY_DESC_MAX], ep[FERRY_DESC_MAX];
    int n = ferry_region_export(rw, d, sizeof d), epn = ferry_engine_export(e, ep, sizeof ep);
    assert_true(n > 0 && epn > 0);
    fr_region_desc rd;
    assert_int_equal(fr_region_desc_decode(d, (size_t)n, &rd), 0);
    ferry_peer_id id;
    assert_int_equal(ferry_peer_add(e2, ep, (size_t)epn, &id, NULL), 0);
    assert_int_equal(ferry_mem_alloc(e2, MiB, &src, NULL), 0);
    assert_int_equal(ferry_region_register(e2, src, MiB, 0, FERRY_MEM_HOST, &lr, NULL), 0);
    ft_pattern(src, MiB, 31, 0);
    memset(m, 0, 4 * MiB);
    ferry_op w = {.opcode = FERRY_OP_WRITE, .local = src, .len = MiB, .peer = id,
                  .remote_addr = rd.base + 3 * MiB, .key = rd.key};
    ferry_ticket *t;
    assert_int_equal(ferry_submit(e2, &w, 1, 0, &t, NULL), 0);
    assert_int_equal(ferry_ticket_wait(t, 30000), FERRY_TICKET_COMPLETED);
    ferry_ticket_free(t);
    assert_memory_equal((uint8_t *)m + 3 * MiB, src, MiB);
    uint8_t *zero = calloc(1, 3 * MiB);   /* what it did not write stays zero */
    assert_non_null(zero);
    assert_memory_equal(m, zero, 3 * MiB);
    free(zero);
    assert_int_equal(ferry_mem_free(e, m, NULL), FERRY_EBUSY);
    assert_int_equal(ferry_region_unregister(rw, NULL), 0);
    assert_int_equal(ferry_mem_free(e, m, NULL), 0);
    ferry_engine_close(e2);
    ferry_engine_close(e);   /* `kept` goes with it */
    (void)kept;
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_mem_alloc_is_ucx_memory),
    cmocka_unit_test(test_key_without_descriptor),
    cmocka_unit_test(test_no_address_without_token),
    cmocka_unit_test(test_descriptor_rkey),
    cmocka_unit_test(test_killed_while_moving),
};

int main(int argc, char **argv)
{
    int rc = ft_main_peer(argc, argv);
    if (rc >= 0)
        return rc;
    ft_token();
    signal(SIGPIPE, SIG_IGN);
    setenv("FERRY_TRANSPORT", "ucx", 1);   /* the peers too */
    char name[96];
    snprintf(name, sizeof name, "ucx(UCX_TLS=%s)", getenv("UCX_TLS") ? getenv("UCX_TLS") : "default");
    return _cmocka_run_group_tests(name, tests, sizeof tests / sizeof *tests, NULL, NULL);
}
