/* wire layer: the accept side of a listener, shared by the master and the
 * engine's tcp and shm listeners (hsgate.c).
 *
 * One thread accepts connections and runs every handshake in flight at
 * once, non-blocking, on one epoll set (fr_hs_server): no thread per
 * handshake, so a connection that never finishes its handshake costs one
 * descriptor and a few hundred bytes until it is dropped, and the number of
 * such connections is capped. The rules:
 *
 *  - Deadline: a handshake not finished deadline_ms after accept is
 *    dropped (AUTH_FAIL FERRY_ETIMEDOUT where the socket takes it, then
 *    close), however the peer spaces its bytes.
 *  - Per source: at most max_per_source handshakes in flight from one
 *    source (an IPv4 or IPv6 address; on a unix socket, the peer's uid). A
 *    new connection from a source at its cap replaces that source's oldest
 *    handshake.
 *  - In flight: at most max_inflight handshakes, and never more than a
 *    quarter of the process's descriptor limit. A new connection when full
 *    replaces the oldest handshake of the source with the most in flight.
 *
 * Replacing the oldest instead of refusing the newest keeps a peer that
 * shares an address with a flood (loopback, a NAT) able to connect: its own
 * handshake takes a round trip, and it is displaced only when
 * max_per_source newer connections from that address arrive within it.
 * Every drop and refusal is logged, one line per kind per
 * FR_HSGATE_LOG_WINDOW_MS at most; the next line counts those not logged.
 * Connections that completed their handshake are not counted here at all:
 * they belong to the ready callback. */
#ifndef FR_WIRE_HSGATE_H
#define FR_WIRE_HSGATE_H

#include <stdint.h>

#include "wire/sockio.h"

#define FR_HSGATE_DEADLINE_MS 5000
#define FR_HSGATE_INFLIGHT 1024
#define FR_HSGATE_PER_SOURCE 256
#define FR_HSGATE_LOG_WINDOW_MS 10000
#define FR_HSGATE_PEER 64              /* room for "[v6]:port" or "uid U pid P" */

typedef struct fr_hsgate fr_hsgate;

/* An authenticated connection: fd is blocking again and now belongs to the
 * callee; auth is the client's AUTH; peer names it for log lines. Called on
 * the gate's thread: return soon (start a thread, queue it). */
typedef void (*fr_hsgate_ready_fn)(void *arg, int fd, const fr_msg_auth *auth, const char *peer);
/* A handshake that did not finish: its code (FERRY_EAUTH, FERRY_EPROTO,
 * FERRY_ESTALE, FERRY_ETIMEDOUT, FERRY_EAGAIN when displaced, or the socket
 * error). For counters; the gate logs it. */
typedef void (*fr_hsgate_failed_fn)(void *arg, int code);

typedef struct fr_hsgate_config {
    const char *tag;                /* log subsystem ("master", "tcp", "shm") */
    const uint8_t *key;             /* 32-byte HMAC key (fr_auth_key), copied */
    uint64_t instance;              /* sent in CHALLENGE */
    uint16_t role;                  /* as for fr_handshake_server (0: either store role) */
    unsigned deadline_ms;           /* 0: FR_HSGATE_DEADLINE_MS */
    unsigned max_inflight;          /* 0: FR_HSGATE_INFLIGHT */
    unsigned max_per_source;        /* 0: FR_HSGATE_PER_SOURCE */
    int stop_fd;                    /* a descriptor whose readability ends fr_hsgate_run;
                                     * -1 for none (0 is a descriptor too) */
    fr_hsgate_ready_fn ready;       /* required */
    fr_hsgate_failed_fn failed;     /* may be NULL */
    void *arg;
} fr_hsgate_config;

typedef struct fr_hsgate_stats {
    uint64_t accepted;              /* connections accepted */
    uint64_t authenticated;         /* handed to the ready callback */
    uint64_t refused;               /* handshakes that failed (token, role, frame, socket) */
    uint64_t timed_out;             /* dropped at the deadline */
    uint64_t displaced;             /* dropped for a newer connection (either cap) */
    uint64_t accept_errors;         /* accept() failures (out of descriptors, ...) */
    uint32_t inflight;              /* handshakes in flight now */
    uint32_t inflight_peak;         /* the most at once */
    uint32_t max_inflight;          /* the cap in force (after the descriptor limit) */
} fr_hsgate_stats;

/* A gate over the listening socket lfd (made non-blocking; the caller keeps
 * owning it and closes it after fr_hsgate_close). FERRY_EINVAL, FERRY_ENOMEM,
 * FERRY_EIO. Free with fr_hsgate_close. */
int fr_hsgate_open(const fr_hsgate_config *c, int lfd, fr_hsgate **out);
/* Accept and handshake until fr_hsgate_stop or the stop_fd; on return every
 * handshake still in flight is closed. 0, or FERRY_EIO when the listener
 * itself failed (logged). Run it on one thread, once. */
int fr_hsgate_run(fr_hsgate *g);
/* Make fr_hsgate_run return soon; any thread, async-signal-safe. */
void fr_hsgate_stop(fr_hsgate *g);
/* Counters, from any thread. */
void fr_hsgate_get_stats(fr_hsgate *g, fr_hsgate_stats *out);
/* Free the gate (after fr_hsgate_run returned, or when it never ran).
 * Accepts NULL. Does not close lfd. */
void fr_hsgate_close(fr_hsgate *g);

#endif
