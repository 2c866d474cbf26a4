/* store layer: the master server (`ferry master`).
 *
 * An epoll event loop over TCP that serves the store protocol
 * (wire/store_msg.h) by driving the metadata core (fr_meta) and its
 * write-ahead log (fr_wal). One thread owns the loop and the meta; an accept
 * thread runs every handshake in flight (non-blocking, a 5 s deadline from
 * accept, capped in flight and per source address: wire/hsgate.h) and hands
 * authenticated sockets to the loop, so a client that never answers, or
 * answers a byte at a time, cannot stall anyone.
 *
 * Each loop iteration decodes and applies every complete request of every
 * readable connection, commits the log once, and only then sends the
 * replies and watch pushes: nothing is acknowledged before it is durable.
 * The protocol, liveness and back-pressure rules are in docs/store.md
 * ("Master server").
 *
 * Only standard headers and ferry/common.h (for ferry_error) here. */
#ifndef FR_STORE_MASTER_H
#define FR_STORE_MASTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"

typedef struct fr_master fr_master;

typedef struct fr_master_config {
    char dir[4096];                 /* state directory (WAL, snapshots) */
    char listen[64];                /* "HOST:PORT", port 0 picks one; default "127.0.0.1:0" */
    uint8_t token[256];             /* cluster token (required) */
    size_t token_len;
    uint64_t heartbeat_timeout_ms;  /* default 10000: a peer silent this long is suspect */
    uint64_t grace_ms;              /* a node or client whose connection closed is dead after
                                     * this unless it reconnects; 0: heartbeat_timeout_ms */
    uint64_t dead_after_ms;         /* a suspect peer is dead after this; 0 (default): never */
    uint64_t pending_timeout_ms;    /* default FERRY_DEFAULT_TIMEOUT_MS: a PENDING object whose writer vanished is revoked */
    uint64_t checkpoint_records;    /* snapshot after this many log records, default 1000000 */
    bool no_sync;                   /* tests/bench only: the log is not fsynced */
    char etcd[1024];                /* replicated: etcd client URLs ("": a single master) */
    char cluster[72];               /* the cluster's name in etcd */
    uint32_t ha_ttl_s;              /* the leadership lease (0: FR_HA_TTL_S) */
} fr_master_config;

void fr_master_config_default(fr_master_config *c);

/* Recover the directory and bind + listen (SO_REUSEADDR). FERRY_EINVAL (bad
 * config or address), FERRY_EBUSY (another master holds the directory),
 * FERRY_ECORRUPT (the log is damaged), -EADDRINUSE (the address is taken),
 * FERRY_EIO, FERRY_ENOMEM. Every failure is also logged with a sentence.
 * The caller owns *out and frees it with fr_master_close. */
int fr_master_open(const fr_master_config *c, fr_master **out, ferry_error *err);
/* "HOST:PORT" actually bound (the port filled in when 0 was asked for).
 * Valid until fr_master_close. */
const char *fr_master_address(const fr_master *m);
/* Serve until fr_master_stop. Returns 0, or the fatal error that ended the
 * loop (FERRY_EIO when the log cannot be written: restart recovers). Call
 * at most once. */
int fr_master_run(fr_master *m);
/* Make fr_master_run return soon. Async-signal-safe (one pipe write). */
void fr_master_stop(fr_master *m);
/* Commit, close every connection and the log, free m. Accepts NULL. Must
 * not run concurrently with fr_master_run. */
void fr_master_close(fr_master *m);

/* ---- in-process use without sockets (fuzzing, unit tests) -------------- */
/* A master over `dir` (recovered like fr_master_open) that listens nowhere
 * and starts no thread; the log is not fsynced and is checkpointed every
 * 10000 records. Free with fr_master_close. */
int fr_master_open_mem(const char *dir, fr_master **out);
/* Feed `data` to a fresh in-memory connection of `role` (FR_ROLE_STORE_CLIENT
 * or FR_ROLE_STORE_NODE) as the byte stream it received: every complete
 * frame is parsed and dispatched exactly as on a socket, the log is
 * committed, watch pushes are generated, all output is discarded, then the
 * connection is closed (parked barrier arrivals withdrawn). Returns the
 * number of frames taken from the stream, or the fatal error (FERRY_EIO)
 * that stopped the master. */
int fr_master_feed(fr_master *m, uint16_t role, const uint8_t *data, size_t n);

#endif
