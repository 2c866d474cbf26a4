/* store layer: internals of the client library (client*.c). */
#ifndef FR_CLIENT_INT_H
#define FR_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "ferry/store.h"
#include "store/mconn.h"
#include "store/store_int.h"

/* A buffer registered with ferry_store_register_buffer. */
typedef struct fr_ubuf { uint8_t *addr; size_t len; ferry_region *reg; } fr_ubuf;

/* A segment the client has resolved: where its bytes are. */
typedef struct fr_segref { uint64_t id, node; ferry_remote_region rr; } fr_segref;

struct ferry_store {
    ferry_store_config cfg;
    ferry_engine *eng;
    fr_mconn *mc;
    pthread_mutex_t lock;      /* segs, bufs, watches */
    fr_umap segs;              /* segment id -> fr_segref */
    fr_ubuf *bufs;
    size_t nbufs, cap_bufs;
    fr_umap watches;           /* WATCH req_id -> ferry_watch */
    uint8_t *stage;            /* ferry_store_staging_take (mmap'd; also in bufs) */
    size_t stage_len;
    bool stage_busy;
};

/* Free the staging buffer (ferry_store_close, before the engine closes). */
void fr_client_stage_fini(ferry_store *s);

/* One request, one reply of type want (an ERROR reply becomes its status
 * and *err's text). *buf holds the reply's bytes: fr_free it. */
int fr_client_rpc(ferry_store *s, const fr_smsg *req, uint16_t want, fr_smsg *rep,
                  uint8_t **buf, ferry_error *err);
/* n requests in one round trip; status[i] per reply as in fr_client_rpc.
 * Returns 0 or the connection error (then every status is that error). */
int fr_client_rpc_many(ferry_store *s, const fr_smsg *reqs, size_t n, uint16_t want,
                       fr_smsg *reps, uint8_t **bufs, int *status, ferry_error *err);
void fr_client_free_bufs(uint8_t **bufs, size_t n);
/* n requests of one type naming one key each, one round trip: results[i]
 * per key (every entry set). each (may be NULL) takes every reply that
 * succeeded, before its buffer is freed; what it returns is its result.
 * Returns 0 or the first failure. */
typedef int (*fr_client_reply_fn)(void *ctx, size_t i, const fr_smsg *rep, ferry_error *err);
int fr_client_key_rpcs(ferry_store *s, const char *const *keys, size_t n, uint16_t type,
                       uint16_t want, fr_client_reply_fn each, void *ctx, int *results,
                       ferry_error *err);
/* What request q (the first of n) does, in words for error messages. */
void fr_client_describe(const fr_smsg *q, size_t n, char *out, size_t cap);
/* Where segment id lives (asks the master the first time). */
int fr_client_segment(ferry_store *s, uint64_t id, fr_segref *out, ferry_error *err);
/* Forget a segment (its node restarted or failed). */
void fr_client_forget_segment(ferry_store *s, uint64_t id);
/* A local region covering [p, p+len): a registered buffer's, or a temporary
 * registration (*tmp set: unregister it after use). */
int fr_client_local(ferry_store *s, const void *p, size_t len, ferry_region **tmp, ferry_error *err);
/* fr_sbytes of a C string (NULL: empty). */
fr_sbytes fr_client_str(const char *s);
/* Validate a key: 1..FERRY_STORE_KEY_MAX bytes. */
int fr_client_key(const char *key, ferry_error *err);

/* Where a leased object lives. */
typedef struct fr_objloc {
    uint64_t size;
    uint32_t nrep;
    fr_smsg_replica rep[FR_SMSG_REPLICAS_MAX];
} fr_objloc;
/* Lease and locate many keys in one round trip; status[i] per key. */
int fr_client_locate(ferry_store *s, const char *const *keys, size_t n, fr_objloc *locs,
                     int *status, ferry_error *err);
/* Watch plumbing (client_kv.c), called on the connection's receiver thread. */
void fr_client_watch_push(void *ctx, uint64_t req_id, const fr_smsg *m);
void fr_client_watch_lost(void *ctx);

#endif
