/* The leadership epoch in every store frame (docs/wire.md, "Epochs"):
 *  - a client keeps the newest epoch it heard, sends it in every request,
 *    and refuses an answer with an older one (a deposed leader's) with
 *    FERRY_ESTATE, then finds the master again;
 *  - against a master older than the epoch (it refuses the AUTH that asks
 *    for it) the client connects again without, and its frames carry none;
 *  - a client that does not ask gets an AUTH_OK whose word an old decoder
 *    reads (zero) and frames without epochs;
 *  - a replicated master that receives a newer epoch than its own refuses
 *    the request and stops.
 * The fake masters are threads of this test on loopback sockets; the real
 * one runs on an etcd of the test's own (fixtures clean up after failures). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "store/mconn.h"
#include "util/ftetcd.h"
#include "util/ftstore.h"
#include "wire/sockio.h"
#include "wire/store_msg.h"

enum { MAXC = 4, MAXR = 8 };

typedef struct fake {
    int lfd;
    char addr[32];
    uint8_t key[32];
    bool old;                    /* refuse an AUTH asking for capabilities, as an old master */
    uint64_t reply_epoch[MAXR];  /* the epoch of the answer to request i */
    int nreplies;
    /* what it saw */
    uint32_t caps[MAXC];         /* asked for, per connection */
    int nconns;
    uint64_t req_epoch[MAXR];
    bool req_trailer[MAXR];
    int nreqs;
    pthread_t thr;
} fake;

static int fake_listen(fake *f)
{
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(f->lfd, 8) != 0 ||
        getsockname(f->lfd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", ntohs(a.sin_port));
    return 0;
}

/* An old master's refusal of an AUTH whose reserved word is not zero. */
static int old_refuses(fake *f, int fd)
{
    fr_msg ch = { .type = FR_MSG_CHALLENGE }, a;
    fr_random_bytes(ch.u.challenge.nonce, FR_WIRE_NONCE_LEN);
    fr_frame_hdr h;
    if (fr_send_msg(fd, &ch, 0) < 0 || fr_recv_msg_by(fd, fr_deadline_ns(10000), &h, &a) < 0)
        return -1;
    f->caps[f->nconns++] = a.u.auth.caps;
    fr_msg no = { .type = FR_MSG_AUTH_FAIL };
    no.u.auth_fail.status = FERRY_EPROTO;
    (void)fr_send_msg(fd, &no, 0);
    return 0;
}

/* Answer requests OK, each with its scripted epoch, until the connection
 * closes or the script ends. */
static void serve(fake *f, int fd, uint32_t caps)
{
    while (f->nreqs < f->nreplies) {
        uint8_t raw[FR_WIRE_HDR_LEN], body[4096];
        fr_frame_hdr h;
        if (fr_read_full(fd, raw, sizeof raw) < 0 || fr_wire_hdr_decode(raw, sizeof raw, &h) < 0 ||
            h.len > sizeof body || fr_read_full(fd, body, h.len) < 0)
            return;
        fr_smsg m;
        uint64_t ep = 0;
        int i = f->nreqs;
        int rc = caps & FR_AUTH_CAP_EPOCH ? fr_smsg_decode_epoch(&h, body, h.len, &m, &ep)
                                          : fr_smsg_decode(&h, body, h.len, &m);   /* no trailer */
        if (rc < 0 || m.type == FR_SMSG_HEARTBEAT)
            continue;
        f->req_epoch[i] = ep;
        f->req_trailer[i] = caps & FR_AUTH_CAP_EPOCH;
        f->nreqs++;
        fr_smsg ok = { .type = FR_SMSG_OK };
        uint8_t out[64];
        int n = caps & FR_AUTH_CAP_EPOCH
                    ? fr_smsg_encode_epoch(&ok, h.req_id, f->reply_epoch[i], out, sizeof out)
                    : fr_smsg_encode(&ok, h.req_id, out, sizeof out);
        if (n < 0 || fr_write_full(fd, out, (size_t)n) < 0)
            return;
    }
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    while (f->nconns < MAXC && f->nreqs < f->nreplies) {
        struct pollfd p = { .fd = f->lfd, .events = POLLIN };
        if (poll(&p, 1, 30000) != 1)
            break;
        int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            break;
        fr_sock_timeouts(fd, 10000);
        if (f->old && f->nconns == 0) {
            (void)old_refuses(f, fd);
            close(fd);
            continue;
        }
        fr_msg_auth auth;
        if (fr_handshake_server(fd, f->key, 42, FR_ROLE_STORE_CLIENT, &auth, NULL) == 0) {
            f->caps[f->nconns++] = auth.caps;
            serve(f, fd, auth.caps & FR_AUTH_CAPS_KNOWN);
        }
        close(fd);
    }
    return NULL;
}

static int fake_setup(void **state)
{
    fake *f = calloc(1, sizeof *f);
    *state = f;
    if (!f)
        return -1;
    f->lfd = -1;
    fr_random_bytes(f->key, sizeof f->key);
    return fake_listen(f);
}

static int fake_teardown(void **state)
{
    fake *f = *state;
    if (f && f->lfd >= 0) {
        shutdown(f->lfd, SHUT_RDWR);
        close(f->lfd);
    }
    free(f);
    return 0;
}

static fr_mconn *client(fake *f)
{
    fr_mconn_config cfg = { .addr = f->addr, .key = f->key, .role = FR_ROLE_STORE_CLIENT,
                            .heartbeat_ms = 600000, .timeout_ms = 10000 };
    fr_mconn *c = NULL;
    assert_int_equal(fr_mconn_open(&cfg, &c), 0);
    return c;
}

static int call(fr_mconn *c)
{
    const char *k = "k";
    fr_smsg req = { .type = FR_SMSG_KV_PUT };
    req.key.p = (const uint8_t *)k;
    req.key.n = 1;
    fr_smsg rep;
    uint8_t *buf = NULL;
    int rc = fr_mconn_call(c, &req, 1, NULL, &rep, &buf, 10000);
    fr_free(buf);
    return rc;
}

static void test_stale_answer_refused(void **state)
{
    fake *f = *state;
    const uint64_t script[] = { 5, 3, 6 };
    memcpy(f->reply_epoch, script, sizeof script);
    f->nreplies = 3;
    assert_int_equal(pthread_create(&f->thr, NULL, fake_main, f), 0);
    fr_mconn *c = client(f);
    assert_int_equal(call(c), 0);              /* epoch 5 heard */
    assert_int_equal(call(c), FERRY_ESTATE);   /* epoch 3: a deposed leader's answer */
    assert_int_equal(call(c), 0);              /* connected again: epoch 6 */
    fr_mconn_close(c);
    pthread_join(f->thr, NULL);
    assert_int_equal(f->nconns, 2);            /* the stale answer's connection was dropped */
    assert_int_equal(f->caps[0], FR_AUTH_CAP_EPOCH);
    assert_true(f->req_trailer[0] && f->req_trailer[1] && f->req_trailer[2]);
    assert_int_equal(f->req_epoch[0], 0);      /* nothing heard yet */
    assert_int_equal(f->req_epoch[1], 5);
    assert_int_equal(f->req_epoch[2], 5);      /* the refused 3 was not taken */
}

static void test_old_master(void **state)
{
    fake *f = *state;
    f->old = true;
    f->reply_epoch[0] = 0;
    f->nreplies = 1;
    assert_int_equal(pthread_create(&f->thr, NULL, fake_main, f), 0);
    fr_mconn *c = client(f);
    assert_int_equal(call(c), 0);
    fr_mconn_close(c);
    pthread_join(f->thr, NULL);
    assert_int_equal(f->nconns, 2);            /* asked, refused, connected again without */
    assert_int_equal(f->caps[0], FR_AUTH_CAP_EPOCH);
    assert_int_equal(f->caps[1], 0);
    assert_int_equal(f->nreqs, 1);
    assert_false(f->req_trailer[0]);           /* decoded strictly: no epoch after the body */
}

/* What an old client (which never asks) gets: an AUTH_OK with its word 0. */
static void test_old_client(void **state)
{
    fake *f = *state;
    f->nreplies = 1;
    f->reply_epoch[0] = 9;
    assert_int_equal(pthread_create(&f->thr, NULL, fake_main, f), 0);
    int fd = -1;
    assert_int_equal(fr_sock_connect(f->addr, 10000, &fd), 0);
    fr_sock_timeouts(fd, 10000);
    uint32_t got = 77;
    assert_int_equal(fr_handshake_client_caps(fd, f->key, 1, 0, FR_ROLE_STORE_CLIENT, 0, 0, &got,
                                              NULL, NULL), 0);
    assert_int_equal(got, 0);
    fr_smsg ok = { .type = FR_SMSG_STATUS };
    uint8_t out[64], raw[FR_WIRE_HDR_LEN];
    int n = fr_smsg_encode(&ok, 1, out, sizeof out);
    assert_true(n > 0);
    assert_int_equal(fr_write_full(fd, out, (size_t)n), 0);
    fr_frame_hdr h;
    assert_int_equal(fr_read_full(fd, raw, sizeof raw), 0);
    assert_int_equal(fr_wire_hdr_decode(raw, sizeof raw, &h), 0);
    assert_int_equal(h.len, 0);                /* OK with no epoch after it */
    close(fd);
    pthread_join(f->thr, NULL);
    assert_false(f->req_trailer[0]);
}

/* ---- a real replicated master ----------------------------------------------------- */

typedef struct real { ft_etcd e; ft_peer m; char dir[64], port[32]; } real;

static int real_setup(void **state)
{
    real *r = calloc(1, sizeof *r);
    *state = r;
    if (!r)
        return -1;
    r->m.pid = -1;
    snprintf(r->port, sizeof r->port, "127.0.0.1:%d", ft_free_port());
    snprintf(r->dir, sizeof r->dir, "/tmp/ferry-epoch-test-XXXXXX");
    if (!mkdtemp(r->dir)) {
        r->dir[0] = 0;
        return -1;
    }
    return ft_etcd_start(&r->e);
}

static int real_teardown(void **state)
{
    real *r = *state;
    if (!r)
        return 0;
    ft_proc_kill(&r->m, SIGKILL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
    if (r->dir[0] && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", r->dir);
    ft_etcd_stop(&r->e);
    free(r);
    return 0;
}

/* One KV_PUT carrying epoch; the answer's type, status and epoch (-1:
 * the connection closed first). */
static int put_with(int fd, uint64_t id, uint64_t epoch, fr_smsg *rep, uint64_t *rep_epoch,
                    uint8_t *body, size_t cap)
{
    const char *k = "e";
    fr_smsg req = { .type = FR_SMSG_KV_PUT };
    req.key.p = (const uint8_t *)k;
    req.key.n = 1;
    uint8_t out[128], raw[FR_WIRE_HDR_LEN];
    int n = fr_smsg_encode_epoch(&req, id, epoch, out, sizeof out);
    fr_frame_hdr h;
    if (n < 0 || fr_write_full(fd, out, (size_t)n) < 0 || fr_read_full(fd, raw, sizeof raw) < 0 ||
        fr_wire_hdr_decode(raw, sizeof raw, &h) < 0 || h.len > cap || fr_read_full(fd, body, h.len) < 0)
        return -1;
    return fr_smsg_decode_epoch(&h, body, h.len, rep, rep_epoch);
}

static void test_master_refuses_newer_epoch(void **state)
{
    real *r = *state;
    char mdir[96], line[512] = "";
    snprintf(mdir, sizeof mdir, "%s/m", r->dir);
    const char *args[] = { "master", "--dir", mdir, "--listen", r->port, "--etcd", r->e.url,
                           "--cluster", "ep", "--ha-ttl", "4", NULL };
    assert_int_equal(ft_spawn_exe(&r->m, NULL, ft_ferry_bin(), args), 0);
    assert_int_equal(ft_read_line(&r->m, line, sizeof line, 60000), 0);
    assert_non_null(strstr(line, "listening on"));
    uint8_t key[32];
    const char *tok = ft_token();
    fr_auth_key((const uint8_t *)tok, strlen(tok), key);
    int fd = -1;
    assert_int_equal(fr_sock_connect(r->port, 10000, &fd), 0);
    fr_sock_timeouts(fd, 10000);
    uint32_t got = 0;
    assert_int_equal(fr_handshake_client_caps(fd, key, 7, 0, FR_ROLE_STORE_CLIENT, 0,
                                              FR_AUTH_CAP_EPOCH, &got, NULL, NULL), 0);
    assert_int_equal(got, FR_AUTH_CAP_EPOCH);
    fr_smsg rep;
    uint64_t ep = 0;
    uint8_t body[2048];
    assert_int_equal(put_with(fd, 1, 0, &rep, &ep, body, sizeof body), 0);
    assert_int_equal(rep.type, FR_SMSG_REVISION);
    assert_true(ep > 0);                         /* the leadership's epoch */
    assert_int_equal(put_with(fd, 2, ep, &rep, &ep, body, sizeof body), 0);
    assert_int_equal(rep.type, FR_SMSG_REVISION);   /* its own epoch: served */
    uint64_t ep2 = 0;
    int rc = put_with(fd, 3, ep + 1000, &rep, &ep2, body, sizeof body);
    if (rc == 0) {                               /* the refusal, when it got out before the stop */
        assert_int_equal(rep.type, FR_SMSG_ERROR);
        assert_int_equal(rep.status, FERRY_ESTATE);
    }
    close(fd);
    int st = 0;
    assert_int_equal(ft_wait_status(r->m.pid, 60000, &st), 0);   /* it stopped */
    r->m.pid = -1;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
}

int main(void)
{
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stale_answer_refused, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_old_master, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_old_client, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_master_refuses_newer_epoch, real_setup, real_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
