/* Challenge–response authentication with the cluster token.
 *
 * The server speaks first with a random nonce and its instance id. The
 * client answers with its own nonce and HMAC-SHA256(key, "ferry-c" | nonce_s
 * | nonce_c | fields), where key is a hash of the token; the server answers
 * with HMAC(key, "ferry-s" | nonce_c | nonce_s) so the client knows it talks
 * to a cluster member too. Neither side ever sends the token. */
#include <sodium.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_int.h"

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
    crypto_auth_hmacsha256_final(&st, out);
}

static void server_mac(const uint8_t key[32], const uint8_t *nonce_c, const uint8_t *nonce_s,
                       uint8_t out[32])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, 32);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)"ferry-s", 7);
    crypto_auth_hmacsha256_update(&st, nonce_c, FR_WIRE_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, nonce_s, FR_WIRE_NONCE_LEN);
    crypto_auth_hmacsha256_final(&st, out);
}

static int refuse(ferry_engine *e, int fd, int code, const char *why)
{
    char who[64];
    fr_sock_peername(fd, who, sizeof who);
    FR_WARN("auth", "refused connection from %s: %s", who, why);
    FR_STAT_ADD(e, auth_refused, 1);
    fr_msg m = {.type = FR_MSG_AUTH_FAIL};
    m.u.auth_fail.status = code;
    (void)fr_send_msg(fd, &m, 0);
    return code;
}

int fr_auth_server(ferry_engine *e, int fd, uint16_t role, fr_msg_auth *auth)
{
    fr_msg m = {.type = FR_MSG_CHALLENGE};
    fr_random_bytes(m.u.challenge.nonce, FR_WIRE_NONCE_LEN);
    m.u.challenge.instance = e->ep.instance;
    uint8_t nonce_s[FR_WIRE_NONCE_LEN];
    memcpy(nonce_s, m.u.challenge.nonce, sizeof nonce_s);
    int rc = fr_send_msg(fd, &m, 0);
    if (rc < 0)
        return rc;

    fr_frame_hdr h;
    fr_msg a;
    rc = fr_recv_msg(fd, &h, &a);
    if (rc == FERRY_EPROTO || rc == FERRY_EMSGSIZE) {
        FR_STAT_ADD(e, frames_rejected, 1);
        return refuse(e, fd, FERRY_EPROTO, "malformed handshake frame");
    }
    if (rc < 0)
        return refuse(e, fd, rc, "no answer to the challenge");
    if (a.type != FR_MSG_AUTH)
        return refuse(e, fd, FERRY_EPROTO, "first frame is not AUTH");

    uint8_t want[32];
    client_mac(e->auth_key, nonce_s, &a.u.auth, want);
    if (sodium_memcmp(want, a.u.auth.mac, 32) != 0)
        return refuse(e, fd, FERRY_EAUTH, "wrong or missing cluster token");
    if (a.u.auth.role != role)
        return refuse(e, fd, FERRY_EPROTO, "wrong connection role for this listener");
    if (a.u.auth.expect_instance != 0 && a.u.auth.expect_instance != e->ep.instance)
        return refuse(e, fd, FERRY_ESTALE, "descriptor of a previous instance");

    fr_msg ok = {.type = FR_MSG_AUTH_OK};
    server_mac(e->auth_key, a.u.auth.nonce, nonce_s, ok.u.auth_ok.mac);
    ok.u.auth_ok.pid = (uint32_t)getpid();
    rc = fr_send_msg(fd, &ok, 0);
    if (rc < 0)
        return rc;
    *auth = a.u.auth;
    return 0;
}

int fr_auth_client(ferry_engine *e, int fd, const fr_peer *p, uint16_t role, uint16_t stream,
                   uint32_t *server_pid)
{
    fr_frame_hdr h;
    fr_msg c;
    int rc = fr_recv_msg(fd, &h, &c);
    if (rc < 0)
        return rc;
    if (c.type != FR_MSG_CHALLENGE)
        return FERRY_EPROTO;
    if (p->ep.instance != 0 && c.u.challenge.instance != p->ep.instance) {
        FR_WARN("auth", "peer at %u answers as instance %016llx, descriptor names %016llx",
                p->id, (unsigned long long)c.u.challenge.instance,
                (unsigned long long)p->ep.instance);
        return FERRY_ESTALE;
    }

    fr_msg a = {.type = FR_MSG_AUTH};
    fr_random_bytes(a.u.auth.nonce, FR_WIRE_NONCE_LEN);
    a.u.auth.client_instance = e->ep.instance;
    a.u.auth.expect_instance = p->ep.instance;
    a.u.auth.role = role;
    a.u.auth.stream = stream;
    client_mac(e->auth_key, c.u.challenge.nonce, &a.u.auth, a.u.auth.mac);
    rc = fr_send_msg(fd, &a, 0);
    if (rc < 0)
        return rc;

    fr_msg r;
    rc = fr_recv_msg(fd, &h, &r);
    if (rc < 0)
        return rc;
    if (r.type == FR_MSG_AUTH_FAIL)
        return r.u.auth_fail.status < 0 ? r.u.auth_fail.status : FERRY_EAUTH;
    if (r.type != FR_MSG_AUTH_OK)
        return FERRY_EPROTO;
    uint8_t want[32];
    server_mac(e->auth_key, a.u.auth.nonce, c.u.challenge.nonce, want);
    if (sodium_memcmp(want, r.u.auth_ok.mac, 32) != 0) {
        FR_WARN("auth", "peer %u failed to prove the cluster token", p->id);
        return FERRY_EAUTH;
    }
    if (server_pid)
        *server_pid = r.u.auth_ok.pid;
    return 0;
}
