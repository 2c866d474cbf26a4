/* store layer: a connection to the master, shared by the client library
 * and the node process.
 *
 * One TCP connection, authenticated with the cluster token. Calls send
 * their requests in one write and wait for the replies with the same
 * req_ids; a receiver thread reads every frame, hands replies to their
 * callers and unsolicited frames (a WATCH's later EVENTS) to a hook. The
 * same thread sends a HEARTBEAT when the connection has been quiet for the
 * heartbeat period, and reconnects by itself (with back-off) when the
 * connection is lost: calls in flight then fail with FERRY_ECONNRESET
 * (their outcome is unknown), later calls wait for the new connection. */
#ifndef FR_MCONN_H
#define FR_MCONN_H

#include <stddef.h>
#include <stdint.h>

#include "wire/store_msg.h"

typedef struct fr_mconn fr_mconn;

typedef struct fr_mconn_hooks {
    void *ctx;
    /* A frame no call waits for (on the receiver thread: must not call
     * fr_mconn_call). The message borrows from a buffer freed on return. */
    void (*push)(void *ctx, uint64_t req_id, const fr_smsg *m);
    /* The connection was lost (receiver thread). */
    void (*lost)(void *ctx);
} fr_mconn_hooks;

/* The store's defaults, set by ferry_store_config_init and
 * ferry_node_config_init and taken for 0 fields at open (client.c,
 * node.c, mconn.c): one master round trip's wait, an object's read lease,
 * the heartbeat. */
#define FR_STORE_TIMEOUT_MS 10000u
#define FR_STORE_LEASE_MS 5000u
#define FR_STORE_HEARTBEAT_MS 1000u

typedef struct fr_mconn_config {
    const char *addr;          /* "HOST:PORT", or a comma-separated list of a cluster's
                                * masters: each tried in turn, from the one that answered
                                * last, on every (re)connect */
    const uint8_t *key;        /* 32-byte key from fr_auth_key */
    uint16_t role;             /* FR_ROLE_STORE_CLIENT or FR_ROLE_STORE_NODE */
    uint64_t node;             /* sent in heartbeats (0 for clients) */
    uint32_t heartbeat_ms;     /* default 1000 */
    int timeout_ms;            /* first connect (default 10000) */
    fr_mconn_hooks hooks;
} fr_mconn_config;

/* Connect (the first attempt is made here: FERRY_EAUTH, FERRY_ECONNREFUSED,
 * FERRY_ETIMEDOUT are returned as they are) and start the receiver. */
int fr_mconn_open(const fr_mconn_config *cfg, fr_mconn **out);
void fr_mconn_close(fr_mconn *c);   /* accepts NULL */
/* Counts connections made: changes after every reconnect. */
uint64_t fr_mconn_epoch(fr_mconn *c);
/* A fresh req_id, for callers that must know it before the reply arrives. */
uint64_t fr_mconn_reserve_id(fr_mconn *c);

/* Send reqs[0..n) (ids[i] != 0: use that req_id, else a fresh one is
 * written back when ids is not NULL) and wait until every reply arrived or
 * timeout_ms passed. reps[i] borrows from bufs[i], which the caller frees
 * with fr_free (also on failure: unused entries are NULL). Returns 0 when
 * every reply arrived (each may be an ERROR), FERRY_ECONNRESET (lost with
 * requests in flight), FERRY_ETIMEDOUT, FERRY_ECONNREFUSED (no master by
 * the deadline), FERRY_EINVAL/FERRY_EMSGSIZE (a request that cannot be
 * encoded: nothing was sent). */
int fr_mconn_call(fr_mconn *c, const fr_smsg *reqs, size_t n, uint64_t *ids, fr_smsg *reps,
                  uint8_t **bufs, int timeout_ms);
/* Send without waiting for replies (they go to the push hook). */
int fr_mconn_send(fr_mconn *c, const fr_smsg *req, uint64_t req_id, int timeout_ms);

#endif
