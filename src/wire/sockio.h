/* wire layer: blocking socket I/O for framed messages, and the
 * challenge-response handshake every ferry connection starts with (engine
 * transports and the store protocol alike).
 *
 * The handshake: the server speaks first with CHALLENGE (a random nonce and
 * its instance id). The client answers AUTH with its own nonce, its
 * instance, the instance it expects (0: any), its role and stream, and
 * HMAC-SHA256(key, "ferry-c" | nonce_s | nonce_c | fields). The server
 * answers AUTH_OK with HMAC(key, "ferry-s" | nonce_c | nonce_s), so the
 * client knows it talks to a cluster member too, or AUTH_FAIL and closes.
 * key is derived from the cluster token (fr_auth_key); neither side ever
 * sends the token. */
#ifndef FR_SOCKIO_H
#define FR_SOCKIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "wire/wire.h"

/* Blocking, EINTR-safe, all-or-error. Return 0, FERRY_ECONNRESET on EOF or
 * reset, FERRY_ETIMEDOUT on SO_RCVTIMEO/SO_SNDTIMEO expiry, FERRY_EIO else. */
int fr_read_full(int fd, void *buf, size_t n);
int fr_write_full(int fd, const void *buf, size_t n);
int fr_writev_full(int fd, struct iovec *iov, int iovcnt);
/* Strided payloads: rows*len bytes on the socket, packed, that are rows of
 * len bytes in memory, row i at base + i*stride (any stride: rows may
 * overlap or touch). fr_write_rows sends head (hlen bytes, may be 0) first.
 * At most a few hundred iovecs per system call, whatever rows is. */
int fr_read_rows(int fd, uint8_t *base, uint64_t rows, uint64_t len, uint64_t stride);
int fr_write_rows(int fd, const void *head, size_t hlen, const uint8_t *base, uint64_t rows,
                  uint64_t len, uint64_t stride);
/* Read and discard n bytes. */
int fr_drain(int fd, uint64_t n);
/* Read one frame header + meta and decode it. Decoding failures return
 * FERRY_EPROTO/FERRY_EMSGSIZE (caller drops the connection). */
int fr_recv_msg(int fd, fr_frame_hdr *hdr, fr_msg *m);
/* Deadline forms: the whole call ends by deadline_ns (CLOCK_MONOTONIC,
 * UINT64_MAX: none) whatever the peer sends. Each read first polls for the
 * time left, so bytes arriving one at a time do not extend it, unlike
 * SO_RCVTIMEO, which restarts with every byte. FERRY_ETIMEDOUT at the
 * deadline; the socket may be blocking or not. */
int fr_read_full_by(int fd, void *buf, size_t n, uint64_t deadline_ns);
int fr_recv_msg_by(int fd, uint64_t deadline_ns, fr_frame_hdr *hdr, fr_msg *m);
/* Now plus the socket's SO_RCVTIMEO as a deadline (UINT64_MAX when none). */
uint64_t fr_sock_rcv_deadline(int fd);
/* Same as fr_recv_msg, when every frame expected on fd has a meta of exactly `meta` bytes
 * (e.g. replies to an initiator): one read instead of two; a frame of
 * another meta size is FERRY_EPROTO. */
int fr_recv_msg_sized(int fd, size_t meta, fr_frame_hdr *hdr, fr_msg *m);
/* Encode and send a message that carries no data payload. */
int fr_send_msg(int fd, const fr_msg *m, uint64_t req_id);
/* Set SO_RCVTIMEO and SO_SNDTIMEO (ms; 0 clears). */
int fr_sock_timeouts(int fd, int ms);
/* Describe the remote end of a socket for log lines ("127.0.0.1:4242"). */
void fr_sock_peername(int fd, char *buf, size_t len);

/* "A.B.C.D:PORT", "[v6]:PORT" or "localhost:PORT" into a socket address;
 * numeric only, so that nothing ever waits on a resolver. FERRY_EINVAL. */
int fr_sock_parse_hostport(const char *in, struct sockaddr_storage *ss, socklen_t *sl);
/* Connect a blocking TCP socket (TCP_NODELAY, close-on-exec) to "HOST:PORT"
 * within timeout_ms. FERRY_EINVAL (address), FERRY_ECONNREFUSED,
 * FERRY_ETIMEDOUT, FERRY_EIO. */
int fr_sock_connect(const char *addr, int timeout_ms, int *fd);
/* Connect fd (created non-blocking) to ss by deadline_ns (CLOCK_MONOTONIC,
 * UINT64_MAX: none); leaves fd blocking. */
int fr_sock_connect_deadline(int fd, const struct sockaddr_storage *ss, socklen_t sl,
                             uint64_t deadline_ns);

/* ---- handshake (handshake.c) ------------------------------------------- */
/* The 32-byte HMAC key of a cluster token. */
void fr_auth_key(const uint8_t *token, size_t len, uint8_t key[32]);
/* Server side on a freshly accepted fd: send CHALLENGE, check AUTH (MAC,
 * role, expected instance), answer AUTH_OK with our pid. The socket's
 * receive timeout (fr_sock_timeouts), when set, is the deadline of the
 * whole handshake from this call (FERRY_ETIMEDOUT), however the peer
 * spaces its bytes; the same holds for fr_handshake_client. role 0 accepts
 * either store role, FR_ROLE_STORE_CLIENT or FR_ROLE_STORE_NODE (the
 * master serves both on one port; auth->role tells which). On failure answer
 * AUTH_FAIL where possible and return FERRY_EAUTH (wrong token), FERRY_EPROTO
 * (malformed frame, wrong role), FERRY_ESTALE (client expects another
 * instance) or the socket error; *why (may be NULL) says why in words. On
 * success *auth (may be NULL) is the client's AUTH. */
int fr_handshake_server(int fd, const uint8_t key[32], uint64_t instance, uint16_t role,
                        fr_msg_auth *auth, const char **why);
/* The server side without blocking, for a listener that runs many
 * handshakes on one thread (hsgate.h): the same frames and checks as
 * fr_handshake_server, driven by the caller's poll loop on a non-blocking
 * socket. The state is plain memory (no allocation, nothing to free). */
#define FR_HS_BUF 128   /* the largest handshake frame (AUTH: 112 bytes) fits */
enum { FR_HS_WANT_READ = 1, FR_HS_WANT_WRITE = 2 };
typedef struct fr_hs_server {
    uint8_t nonce_s[FR_WIRE_NONCE_LEN];
    uint8_t buf[FR_HS_BUF];     /* the frame being sent or received */
    uint16_t len, off;          /* its length and the bytes done */
    uint8_t state;
    int result;                 /* the outcome, once decided */
    const char *why;            /* a refusal in words (static text) */
    fr_msg_auth auth;           /* the client's AUTH, once accepted */
} fr_hs_server;
/* Queue the CHALLENGE. */
void fr_hs_server_init(fr_hs_server *h, uint64_t instance);
/* Do what the socket allows now: FR_HS_WANT_READ or FR_HS_WANT_WRITE
 * (call again when fd is readable / writable), 0 once AUTH_OK is sent
 * (h->auth is the client's AUTH; the socket holds nothing of ours and
 * nothing the client sent after AUTH has been read), or the refusal code
 * of fr_handshake_server with h->why, after AUTH_FAIL was sent where the
 * socket allowed. Reads never go past the AUTH frame. */
int fr_hs_server_step(fr_hs_server *h, int fd, const uint8_t key[32], uint64_t instance,
                      uint16_t role);
/* Give up (deadline, eviction): send AUTH_FAIL with code when the socket
 * is between frames and takes it at once; the caller closes fd. */
void fr_hs_server_abort(fr_hs_server *h, int fd, int code);

/* Client side. expect_instance 0 accepts any server instance; otherwise a
 * CHALLENGE from another instance is FERRY_ESTALE before AUTH is sent.
 * FERRY_EAUTH when the server refuses our token or cannot prove its own.
 * server_instance and server_pid may be NULL. */
int fr_handshake_client(int fd, const uint8_t key[32], uint64_t client_instance,
                        uint64_t expect_instance, uint16_t role, uint16_t stream,
                        uint64_t *server_instance, uint32_t *server_pid);
/* The same asking for the capabilities want (FR_AUTH_CAP_*): *got (may be
 * NULL), those the server speaks too. A server older than a bit refuses
 * the AUTH (FERRY_EPROTO): connect again with want 0. */
int fr_handshake_client_caps(int fd, const uint8_t key[32], uint64_t client_instance,
                             uint64_t expect_instance, uint16_t role, uint16_t stream,
                             uint32_t want, uint32_t *got, uint64_t *server_instance,
                             uint32_t *server_pid);

#endif
