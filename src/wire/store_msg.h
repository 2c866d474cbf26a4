/* wire layer: the store protocol, requests from clients and nodes to the
 * master and the master's replies.
 *
 * A store message is one frame (wire.h): the 24-byte header with a type in
 * FR_MSG_STORE_FIRST..FR_MSG_STORE_LAST, then a body of `len` bytes (at most
 * FR_SMSG_BODY_MAX) that holds the type's fields in a fixed order, each
 * little-endian, nothing after them. The body layouts are in store_msg.c
 * and docs/wire.md. A reply echoes the request's req_id; the master pushes
 * a WATCH's later EVENTS with the WATCH's req_id.
 *
 * Decoding is zero-copy: fr_smsg_decode fills an fr_smsg whose byte fields
 * (fr_sbytes) and lists point into the body it was given, so the body must
 * stay valid and unchanged while the message is used. Nothing is allocated.
 * Decoding is canonical: re-encoding a decoded message gives back the same
 * bytes. Names (keys, prefixes, barrier and queue names) are not
 * NUL-terminated on the wire and may not contain a NUL byte. */
#ifndef FR_STORE_MSG_H
#define FR_STORE_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/wire.h"

/* Hard limits, enforced by encoder and decoder alike (FERRY_EMSGSIZE). The
 * master may enforce tighter ones of its own (the store's FR_KEY_MAX). */
#define FR_SMSG_KEY_MAX 4096           /* bytes of a key, prefix or name */
#define FR_SMSG_VALUE_MAX (16u << 20)  /* a KV value or a queue record */
#define FR_SMSG_DESC_MAX FR_DESC_MAX   /* a mount's region descriptor blob */
#define FR_SMSG_NAME_MAX 63            /* a node's name in MOUNT (the key field) */
#define FR_SMSG_TEXT_MAX 1024          /* an error reply's text */
#define FR_SMSG_PREFERRED_MAX 64       /* preferred segments of one put_start */
#define FR_SMSG_REPLICAS_MAX 8
#define FR_SMSG_LIST_MAX 65536         /* keys of LIST, events of EVENTS */
#define FR_SMSG_POP_MAX 4096           /* records of one pop */
#define FR_SMSG_BARRIER_MAX 65536      /* members of one barrier */
#define FR_SMSG_BODY_MAX FR_WIRE_STORE_MAX_LEN

enum fr_smsg_type {
    /* requests */
    FR_SMSG_MOUNT = 32,
    FR_SMSG_UNMOUNT = 33,
    FR_SMSG_PUT_START = 34,
    FR_SMSG_PUT_END = 35,
    FR_SMSG_PUT_REVOKE = 36,
    FR_SMSG_GET_REPLICAS = 37,
    FR_SMSG_REMOVE = 38,
    FR_SMSG_REMOVE_PREFIX = 39,
    FR_SMSG_EXIST = 40,
    FR_SMSG_LIST = 41,
    FR_SMSG_KV_GET = 42,
    FR_SMSG_KV_PUT = 43,
    FR_SMSG_KV_CAS = 44,
    FR_SMSG_KV_DELETE = 45,
    FR_SMSG_WATCH = 46,
    FR_SMSG_BARRIER = 47,
    FR_SMSG_Q_PUSH = 48,
    FR_SMSG_Q_POP = 49,
    FR_SMSG_Q_ACK = 50,
    FR_SMSG_Q_NACK = 51,
    FR_SMSG_HEARTBEAT = 52,
    FR_SMSG_SEGMENT = 53,          /* where a segment is: its region descriptor */
    FR_SMSG_STATUS = 54,           /* the master's state as JSON text */
    FR_SMSG_UNWATCH = 55,          /* id: the req_id of the WATCH to end */
    FR_SMSG_Q_CONFIG = 56,         /* size: the queue's bound (0: unbounded) */
    /* replies */
    FR_SMSG_OK = 64,
    FR_SMSG_PLACEMENT = 65,
    FR_SMSG_REPLICAS = 66,
    FR_SMSG_REMOVED = 67,
    FR_SMSG_EXISTS = 68,
    FR_SMSG_KEYS = 69,
    FR_SMSG_KV_VALUE = 70,
    FR_SMSG_REVISION = 71,
    FR_SMSG_EVENTS = 72,
    FR_SMSG_BARRIER_DONE = 73,
    FR_SMSG_RECORDS = 74,
    FR_SMSG_PUSHED = 75,
    FR_SMSG_SEGMENT_DESC = 76,
    FR_SMSG_STATUS_TEXT = 77,
    FR_SMSG_ERROR = 79,
};

/* Borrowed bytes: n bytes at p (p may be NULL when n == 0). */
typedef struct { const uint8_t *p; uint32_t n; } fr_sbytes;

typedef struct fr_smsg_replica {
    uint64_t segment, node, offset, length;
    bool preferred;                /* landed on a segment the caller preferred */
} fr_smsg_replica;

/* One entry of a KEYS, EVENTS or RECORDS list. */
typedef struct fr_smsg_item {
    fr_sbytes key;                 /* KEYS, EVENTS */
    fr_sbytes val;                 /* EVENTS (empty when deleted), RECORDS (the record) */
    uint64_t id;                   /* EVENTS: revision; RECORDS: record id */
    uint32_t deliveries;           /* RECORDS: delivery number (the ack/nack token) */
    bool deleted;                  /* EVENTS */
} fr_smsg_item;

/* A decoded (or to-be-encoded) message. Only the fields of its type matter;
 * which ones those are is listed per type in store_msg.c.
 *
 * Lists, to encode: set preferred (host-order ids) or preferred_le (the
 * encoded ids, as a decode leaves them), and items (an array) or items_raw
 * (an encoded list, as a decode leaves it; it is validated again). Decoding
 * sets only the _le/_raw forms; read them with fr_smsg_preferred() and
 * fr_smsg_item_next(). Replicas are few and always copied. */
typedef struct fr_smsg {
    uint16_t type;
    int32_t status;                /* ERROR: a FERRY_E* code (< 0) */
    fr_sbytes key;                 /* key; prefix; barrier or queue name */
    fr_sbytes key2;                /* BARRIER: member; LIST: list keys after this ("" = start) */
    fr_sbytes val;                 /* KV value; queue record; MOUNT descriptor; ERROR text */
    uint64_t segment, node, size, granule;
    uint64_t lease_ms, timeout_ms;
    uint64_t until;                /* REPLICAS: lease expiry (master's clock, ms) */
    uint64_t rev;                  /* CAS/DELETE: expected (0: none); WATCH: from;
                                      KV_VALUE: mod rev; REVISION; EVENTS: next rev;
                                      ERROR: detail (e.g. the current rev on a conflict) */
    uint64_t create_rev, version;  /* KV_VALUE */
    uint64_t id;                   /* ACK/NACK/PUSHED: record id */
    uint64_t count;                /* REMOVED: removed */
    uint64_t skipped_leased, skipped_pending;  /* REMOVED */
    uint64_t generation;           /* BARRIER_DONE */
    uint64_t slot;                 /* PUT_START: placement slot (0: none; store.h) */
    uint32_t replica_num;          /* PUT_START: 0..FR_SMSG_REPLICAS_MAX (0 means 1) */
    uint32_t limit;                /* LIST: max keys; Q_POP: max records */
    uint32_t members;              /* BARRIER: member count */
    uint32_t deliveries;           /* ACK/NACK: token from pop (0: unchecked) */
    bool flag;                     /* PUT_START: hard pin; EXISTS: exists; KEYS: more */
    uint32_t npreferred;
    const uint64_t *preferred;
    const uint8_t *preferred_le;
    uint32_t nrep;
    fr_smsg_replica rep[FR_SMSG_REPLICAS_MAX];
    uint32_t nitems;
    const fr_smsg_item *items;
    const uint8_t *items_raw;
    size_t items_len;              /* bytes at items_raw */
} fr_smsg;

/* "PUT_START", or NULL for a type that is not a store message. */
const char *fr_smsg_type_name(uint16_t type);
bool fr_smsg_is_request(uint16_t type);

/* Body length of m's encoding into *len, or FERRY_EINVAL (bad type or
 * field) / FERRY_EMSGSIZE (a field, count or the body above its limit). */
int fr_smsg_body_len(const fr_smsg *m, size_t *len);
/* Encode header + body of m into out (cap bytes). Returns the bytes
 * written, or FERRY_EINVAL / FERRY_EMSGSIZE as above, or FERRY_EMSGSIZE when
 * cap is too small (then nothing is written). m is only read. */
int fr_smsg_encode(const fr_smsg *m, uint64_t req_id, uint8_t *out, size_t cap);

/* Decode the body of a frame whose header was decoded by
 * fr_wire_hdr_decode: exactly hdr->len bytes of body (n >= hdr->len, else
 * FERRY_EPROTO). FERRY_EPROTO for anything malformed (unknown type,
 * truncated, count beyond the bytes left, bad flag, NUL in a name, trailing
 * bytes), FERRY_EMSGSIZE for a field or count above its hard limit. On
 * success out borrows from body (see above); on failure out is untouched.
 * Never reads past body + n, never allocates. */
int fr_smsg_decode(const fr_frame_hdr *hdr, const uint8_t *body, size_t n, fr_smsg *out);

/* Connections that agreed on FR_AUTH_CAP_EPOCH in their handshake: the
 * same frame with the sender's leadership epoch (u64, little-endian) after
 * the body, counted in the header's length (docs/wire.md, "Epochs").
 * Encode: as fr_smsg_encode (FERRY_EMSGSIZE when the body leaves no room
 * for the epoch). Decode: as fr_smsg_decode over the body before the
 * epoch, then *epoch; FERRY_EPROTO for a body shorter than the epoch. */
#define FR_SMSG_EPOCH_LEN 8
int fr_smsg_encode_epoch(const fr_smsg *m, uint64_t req_id, uint64_t epoch, uint8_t *out,
                         size_t cap);
int fr_smsg_decode_epoch(const fr_frame_hdr *hdr, const uint8_t *body, size_t n, fr_smsg *out,
                         uint64_t *epoch);

/* Preferred segment i (< m->npreferred) from either list form. */
uint64_t fr_smsg_preferred(const fr_smsg *m, uint32_t i);
/* Walk the list of a KEYS, EVENTS or RECORDS message (decoded, or encodable
 * with items_raw or items): *pos starts at 0; returns false at the end. */
bool fr_smsg_item_next(const fr_smsg *m, size_t *pos, fr_smsg_item *out);

#endif
