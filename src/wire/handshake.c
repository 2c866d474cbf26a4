/* The challenge-response handshake of every ferry connection (sockio.h). */
#include <assert.h>
#include <errno.h>
#include <sodium.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "wire/sockio.h"

void fr_auth_key(const uint8_t *token, size_t len, uint8_t key[32])
{
    crypto_generichash(key, 32, token, len, (const uint8_t *)"ferry-cluster-token", 19);
}

static void client_mac(const uint8_t key[32], const uint8_t *nonce_s, const fr_msg_auth *a,
                       uint8_t out[32])
{
    crypto_auth_hmacsha256_state st;
    uint8_t fields[20];
    memcpy(fields, &a->client_instance, 8);
    memcpy(fields + 8, &a->expect_instance, 8);
    memcpy(fields + 16, &a->role, 2);
    memcpy(fields + 18, &a->stream, 2);
    crypto_auth_hmacsha256_init(&st, key, 32);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)"ferry-c", 7);
    crypto_auth_hmacsha256_update(&st, nonce_s, FR_WIRE_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, a->nonce, FR_WIRE_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, fields, sizeof fields);
    if (a->caps)   /* covered when set, so that nobody between strips them unseen */
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)&a->caps, sizeof a->caps);
    crypto_auth_hmacsha256_final(&st, out);
}

static void server_mac(const uint8_t key[32], const uint8_t *nonce_c, const uint8_t *nonce_s,
                       uint32_t caps, uint8_t out[32])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, 32);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)"ferry-s", 7);
    crypto_auth_hmacsha256_update(&st, nonce_c, FR_WIRE_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, nonce_s, FR_WIRE_NONCE_LEN);
    if (caps)
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)&caps, sizeof caps);
    crypto_auth_hmacsha256_final(&st, out);
}

/* The server's verdict on an AUTH answering the challenge nonce_s: 0 and
 * *reply = AUTH_OK, or the refusal code and *reply = AUTH_FAIL, *why saying
 * why in words. */
static int server_check(const uint8_t key[32], uint64_t instance, uint16_t role,
                        const uint8_t *nonce_s, const fr_msg *a, fr_msg *reply, const char **why)
{
    int code = 0;
    memset(reply, 0, sizeof *reply);
    if (a->type != FR_MSG_AUTH) {
        code = FERRY_EPROTO;
        *why = "first frame is not AUTH";
    } else {
        uint8_t want[32];
        uint16_t got = a->u.auth.role;
        client_mac(key, nonce_s, &a->u.auth, want);
        if (sodium_memcmp(want, a->u.auth.mac, 32) != 0) {
            code = FERRY_EAUTH;
            *why = "wrong or missing cluster token";
        } else if (role != 0 ? got != role
                             : got != FR_ROLE_STORE_CLIENT && got != FR_ROLE_STORE_NODE) {
            code = FERRY_EPROTO;
            *why = "wrong connection role for this listener";
        } else if (a->u.auth.expect_instance != 0 && a->u.auth.expect_instance != instance) {
            code = FERRY_ESTALE;
            *why = "descriptor of a previous instance";
        }
    }
    if (code < 0) {
        reply->type = FR_MSG_AUTH_FAIL;
        reply->u.auth_fail.status = code;
        return code;
    }
    reply->type = FR_MSG_AUTH_OK;
    reply->u.auth_ok.caps = a->u.auth.caps & FR_AUTH_CAPS_KNOWN;
    server_mac(key, a->u.auth.nonce, nonce_s, reply->u.auth_ok.caps, reply->u.auth_ok.mac);
    reply->u.auth_ok.pid = (uint32_t)getpid();
    return 0;
}

static void challenge(uint64_t instance, uint8_t nonce_s[FR_WIRE_NONCE_LEN], fr_msg *m)
{
    memset(m, 0, sizeof *m);
    m->type = FR_MSG_CHALLENGE;
    fr_random_bytes(m->u.challenge.nonce, FR_WIRE_NONCE_LEN);
    m->u.challenge.instance = instance;
    memcpy(nonce_s, m->u.challenge.nonce, FR_WIRE_NONCE_LEN);
}

static int refuse(int fd, int code, const char *text, const char **why)
{
    if (why)
        *why = text;
    fr_msg m = {.type = FR_MSG_AUTH_FAIL};
    m.u.auth_fail.status = code;
    (void)fr_send_msg(fd, &m, 0);
    return code;
}

int fr_handshake_server(int fd, const uint8_t key[32], uint64_t instance, uint16_t role,
                        fr_msg_auth *auth, const char **why)
{
    /* The socket's receive timeout bounds the whole handshake, not each
     * read: a peer trickling its AUTH a byte at a time is cut off on time. */
    const uint64_t deadline = fr_sock_rcv_deadline(fd);
    uint8_t nonce_s[FR_WIRE_NONCE_LEN];
    fr_msg m;
    challenge(instance, nonce_s, &m);
    int rc = fr_send_msg(fd, &m, 0);
    if (rc < 0) {
        if (why)
            *why = "cannot send the challenge";
        return rc;
    }

    fr_frame_hdr h;
    fr_msg a;
    rc = fr_recv_msg_by(fd, deadline, &h, &a);
    if (rc == FERRY_EPROTO || rc == FERRY_EMSGSIZE)
        return refuse(fd, FERRY_EPROTO, "malformed handshake frame", why);
    if (rc < 0)
        return refuse(fd, rc, rc == FERRY_ETIMEDOUT ? "no AUTH before the handshake deadline"
                                                    : "no answer to the challenge", why);
    const char *text = NULL;
    fr_msg reply;
    int code = server_check(key, instance, role, nonce_s, &a, &reply, &text);
    rc = fr_send_msg(fd, &reply, 0);
    if (code < 0) {
        if (why)
            *why = text;
        return code;
    }
    if (rc < 0) {
        if (why)
            *why = "cannot send AUTH_OK";
        return rc;
    }
    if (auth)
        *auth = a.u.auth;
    return 0;
}

/* ---- the server side, non-blocking (sockio.h) --------------------------------- */

enum { HS_SEND_CHALLENGE = 0, HS_RECV, HS_SEND_REPLY, HS_DONE };

static void hs_put(fr_hs_server *h, const fr_msg *m, uint8_t state)
{
    int n = fr_wire_encode(m, 0, 0, h->buf, sizeof h->buf);
    assert(n > 0);   /* handshake frames always encode into FR_HS_BUF */
    h->len = (uint16_t)(n > 0 ? n : 0);
    h->off = 0;
    h->state = state;
}

void fr_hs_server_init(fr_hs_server *h, uint64_t instance)
{
    memset(h, 0, sizeof *h);
    fr_msg m;
    challenge(instance, h->nonce_s, &m);
    hs_put(h, &m, HS_SEND_CHALLENGE);
}

static int hs_end(fr_hs_server *h, int code, const char *why)
{
    h->state = HS_DONE;
    h->result = code;
    h->why = why;
    return code;
}

/* A complete header, or header and meta, is in buf: go on reading the
 * meta, or judge the AUTH and queue the reply. */
static void hs_parsed(fr_hs_server *h, const uint8_t key[32], uint64_t instance, uint16_t role)
{
    fr_frame_hdr hdr;
    fr_msg a, reply;
    const char *text = NULL;
    int code;
    if (fr_wire_hdr_decode(h->buf, FR_WIRE_HDR_LEN, &hdr) < 0) {
        code = FERRY_EPROTO;
        text = "malformed handshake frame";
    } else if (hdr.type != FR_MSG_AUTH) {
        code = FERRY_EPROTO;
        text = "first frame is not AUTH";
    } else if (h->len == FR_WIRE_HDR_LEN) {
        h->len = (uint16_t)(FR_WIRE_HDR_LEN + fr_wire_meta_len(FR_MSG_AUTH));
        return;   /* now the meta */
    } else if (fr_wire_decode(&hdr, h->buf + FR_WIRE_HDR_LEN, h->len - FR_WIRE_HDR_LEN, &a) < 0) {
        code = FERRY_EPROTO;
        text = "malformed handshake frame";
    } else {
        code = server_check(key, instance, role, h->nonce_s, &a, &reply, &text);
        if (code == 0)
            h->auth = a.u.auth;
    }
    if (code < 0) {
        memset(&reply, 0, sizeof reply);
        reply.type = FR_MSG_AUTH_FAIL;
        reply.u.auth_fail.status = code;
    }
    hs_put(h, &reply, HS_SEND_REPLY);
    h->result = code;
    h->why = text;
}

int fr_hs_server_step(fr_hs_server *h, int fd, const uint8_t key[32], uint64_t instance,
                      uint16_t role)
{
    while (h->state != HS_DONE) {
        ssize_t r;
        if (h->state == HS_RECV) {
            r = recv(fd, h->buf + h->off, (size_t)(h->len - h->off), MSG_DONTWAIT);
            if (r == 0)
                return hs_end(h, FERRY_ECONNRESET, "no answer to the challenge");
        } else {
            r = send(fd, h->buf + h->off, (size_t)(h->len - h->off), MSG_DONTWAIT | MSG_NOSIGNAL);
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return h->state == HS_RECV ? FR_HS_WANT_READ : FR_HS_WANT_WRITE;
            return hs_end(h, errno == ECONNRESET || errno == EPIPE ? FERRY_ECONNRESET : FERRY_EIO,
                          h->state == HS_RECV ? "no answer to the challenge"
                          : h->state == HS_SEND_CHALLENGE ? "cannot send the challenge"
                          : h->result == 0 ? "cannot send AUTH_OK" : h->why);
        }
        h->off = (uint16_t)(h->off + r);
        if (h->off < h->len)
            continue;
        if (h->state == HS_SEND_CHALLENGE) {
            h->state = HS_RECV;
            h->len = FR_WIRE_HDR_LEN;   /* exactly the frame: what follows AUTH is the caller's */
            h->off = 0;
        } else if (h->state == HS_RECV) {
            hs_parsed(h, key, instance, role);
        } else {
            return hs_end(h, h->result, h->why);
        }
    }
    return h->result;
}

void fr_hs_server_abort(fr_hs_server *h, int fd, int code)
{
    /* Only between frames: a refusal spliced into a half-sent challenge
     * would be garbage to the peer. One try; the socket is closed next. */
    if (h->state == HS_RECV) {
        fr_msg m = {.type = FR_MSG_AUTH_FAIL};
        m.u.auth_fail.status = code;
        uint8_t buf[FR_WIRE_HDR_LEN + 16];
        int n = fr_wire_encode(&m, 0, 0, buf, sizeof buf);
        if (n > 0)
            (void)!send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    hs_end(h, code, h->why);
}

int fr_handshake_client(int fd, const uint8_t key[32], uint64_t client_instance,
                        uint64_t expect_instance, uint16_t role, uint16_t stream,
                        uint64_t *server_instance, uint32_t *server_pid)
{
    return fr_handshake_client_caps(fd, key, client_instance, expect_instance, role, stream, 0,
                                    NULL, server_instance, server_pid);
}

int fr_handshake_client_caps(int fd, const uint8_t key[32], uint64_t client_instance,
                             uint64_t expect_instance, uint16_t role, uint16_t stream,
                             uint32_t want, uint32_t *got, uint64_t *server_instance,
                             uint32_t *server_pid)
{
    /* As on the server: the receive timeout bounds the whole handshake. */
    const uint64_t deadline = fr_sock_rcv_deadline(fd);
    fr_frame_hdr h;
    fr_msg c;
    int rc = fr_recv_msg_by(fd, deadline, &h, &c);
    if (rc < 0)
        return rc;
    if (c.type == FR_MSG_AUTH_FAIL)
        return c.u.auth_fail.status < 0 ? c.u.auth_fail.status : FERRY_EAUTH;
    if (c.type != FR_MSG_CHALLENGE)
        return FERRY_EPROTO;
    if (server_instance)
        *server_instance = c.u.challenge.instance;
    if (expect_instance != 0 && c.u.challenge.instance != expect_instance)
        return FERRY_ESTALE;

    fr_msg a = {.type = FR_MSG_AUTH};
    fr_random_bytes(a.u.auth.nonce, FR_WIRE_NONCE_LEN);
    a.u.auth.client_instance = client_instance;
    a.u.auth.expect_instance = expect_instance;
    a.u.auth.role = role;
    a.u.auth.stream = stream;
    a.u.auth.caps = want;
    client_mac(key, c.u.challenge.nonce, &a.u.auth, a.u.auth.mac);
    rc = fr_send_msg(fd, &a, 0);
    if (rc < 0)
        return rc;

    fr_msg r;
    rc = fr_recv_msg_by(fd, deadline, &h, &r);
    if (rc < 0)
        return rc;
    if (r.type == FR_MSG_AUTH_FAIL)
        return r.u.auth_fail.status < 0 ? r.u.auth_fail.status : FERRY_EAUTH;
    if (r.type != FR_MSG_AUTH_OK)
        return FERRY_EPROTO;
    uint8_t mac[32];
    server_mac(key, a.u.auth.nonce, c.u.challenge.nonce, r.u.auth_ok.caps, mac);
    if (sodium_memcmp(mac, r.u.auth_ok.mac, 32) != 0 || (r.u.auth_ok.caps & ~want) != 0)
        return FERRY_EAUTH;
    if (server_pid)
        *server_pid = r.u.auth_ok.pid;
    if (got)
        *got = r.u.auth_ok.caps;
    return 0;
}
