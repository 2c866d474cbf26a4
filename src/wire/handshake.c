/* The challenge-response handshake of every ferry connection (sockio.h). */
#include <sodium.h>
#include <string.h>
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
    fr_msg m = {.type = FR_MSG_CHALLENGE};
    fr_random_bytes(m.u.challenge.nonce, FR_WIRE_NONCE_LEN);
    m.u.challenge.instance = instance;
    uint8_t nonce_s[FR_WIRE_NONCE_LEN];
    memcpy(nonce_s, m.u.challenge.nonce, sizeof nonce_s);
    int rc = fr_send_msg(fd, &m, 0);
    if (rc < 0) {
        if (why)
            *why = "cannot send the challenge";
        return rc;
    }

    fr_frame_hdr h;
    fr_msg a;
    rc = fr_recv_msg(fd, &h, &a);
    if (rc == FERRY_EPROTO || rc == FERRY_EMSGSIZE)
        return refuse(fd, FERRY_EPROTO, "malformed handshake frame", why);
    if (rc < 0)
        return refuse(fd, rc, "no answer to the challenge", why);
    if (a.type != FR_MSG_AUTH)
        return refuse(fd, FERRY_EPROTO, "first frame is not AUTH", why);

    uint8_t want[32];
    client_mac(key, nonce_s, &a.u.auth, want);
    if (sodium_memcmp(want, a.u.auth.mac, 32) != 0)
        return refuse(fd, FERRY_EAUTH, "wrong or missing cluster token", why);
    uint16_t got = a.u.auth.role;
    if (role != 0 ? got != role : got != FR_ROLE_STORE_CLIENT && got != FR_ROLE_STORE_NODE)
        return refuse(fd, FERRY_EPROTO, "wrong connection role for this listener", why);
    if (a.u.auth.expect_instance != 0 && a.u.auth.expect_instance != instance)
        return refuse(fd, FERRY_ESTALE, "descriptor of a previous instance", why);

    fr_msg ok = {.type = FR_MSG_AUTH_OK};
    server_mac(key, a.u.auth.nonce, nonce_s, ok.u.auth_ok.mac);
    ok.u.auth_ok.pid = (uint32_t)getpid();
    rc = fr_send_msg(fd, &ok, 0);
    if (rc < 0) {
        if (why)
            *why = "cannot send AUTH_OK";
        return rc;
    }
    if (auth)
        *auth = a.u.auth;
    return 0;
}

int fr_handshake_client(int fd, const uint8_t key[32], uint64_t client_instance,
                        uint64_t expect_instance, uint16_t role, uint16_t stream,
                        uint64_t *server_instance, uint32_t *server_pid)
{
    fr_frame_hdr h;
    fr_msg c;
    int rc = fr_recv_msg(fd, &h, &c);
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
    client_mac(key, c.u.challenge.nonce, &a.u.auth, a.u.auth.mac);
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
    server_mac(key, a.u.auth.nonce, c.u.challenge.nonce, want);
    if (sodium_memcmp(want, r.u.auth_ok.mac, 32) != 0)
        return FERRY_EAUTH;
    if (server_pid)
        *server_pid = r.u.auth_ok.pid;
    return 0;
}
