/* wire layer: framing and codecs of every message that crosses a socket.
 * Nothing else in ferry decodes bytes that came from the network.
 *
 * All integers are little-endian on the wire. A frame is a 24-byte header
 * followed by `len` bytes:
 *
 *   off size field
 *     0   4  magic   FR_WIRE_MAGIC ("FRY1")
 *     4   2  version FR_WIRE_VERSION
 *     6   2  type    enum fr_msg_type
 *     8   8  req_id  request id chosen by the initiator, echoed in replies
 *    16   4  len     bytes after the header (meta + data)
 *    20   4  check   low 32 bits of XXH3-64 of bytes 0..19
 *
 * Every message starts with a fixed-size "meta" body. WRITE, WRITE_ROWS and
 * READ_RESP carry a data payload after their meta: the receiver decodes the
 * meta, validates it, and then receives the data straight into its
 * destination.
 * Decoders never read past their input and reject anything malformed with
 * FERRY_EPROTO (bad magic/version/type/check/length) or FERRY_EMSGSIZE
 * (length above the hard limit for the type). */
#ifndef FR_WIRE_H
#define FR_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/common.h"

#define FR_WIRE_MAGIC 0x31595246u      /* bytes 'F','R','Y','1' */
#define FR_WIRE_VERSION 1
#define FR_WIRE_HDR_LEN 24
#define FR_WIRE_MAX_DATA (64u << 20)   /* hard max of one frame's data payload */
#define FR_WIRE_NONCE_LEN 32
#define FR_WIRE_MAC_LEN 32

enum fr_msg_type {
    FR_MSG_CHALLENGE = 1, /* server -> client, first frame on every connection */
    FR_MSG_AUTH = 2,      /* client -> server */
    FR_MSG_AUTH_OK = 3,   /* server -> client */
    FR_MSG_AUTH_FAIL = 4, /* server -> client, then close */
    FR_MSG_WRITE = 5,     /* meta + data */
    FR_MSG_READ = 6,
    FR_MSG_READ_RESP = 7, /* meta + data (data only when status == 0) */
    FR_MSG_ACK = 8,       /* reply to WRITE and NOTIFY */
    FR_MSG_NOTIFY = 9,
    FR_MSG_MAP = 10,      /* shm: ask for the memfd behind a region */
    FR_MSG_MAP_RESP = 11, /* shm: reply; the fd travels as SCM_RIGHTS */
    FR_MSG_SHM_HELLO = 12,/* shm: server -> client after AUTH_OK; key-table fd as SCM_RIGHTS */
    FR_MSG_WRITE_ROWS = 13, /* meta + the rows' data packed back to back; answered by ACK */
    FR_MSG_READ_ROWS = 14,  /* answered by READ_RESP carrying the rows packed */
    FR_MSG_TYPE_MAX = 14,
};

/* Store protocol frames (wire/store_msg.h) use types in this range and a
 * variable-length body of at most FR_WIRE_STORE_MAX_LEN bytes instead of a
 * fixed meta. fr_wire_hdr_decode accepts the whole range (fr_smsg_decode
 * rejects types it does not know); fr_wire_decode refuses store frames. */
#define FR_MSG_STORE_FIRST 32
#define FR_MSG_STORE_LAST 127
#define FR_WIRE_STORE_MAX_LEN FR_WIRE_MAX_DATA

/* Connection roles announced in AUTH: engine transports, and store
 * protocol connections to the master from clients and from nodes. */
enum fr_conn_role {
    FR_ROLE_TCP_STREAM = 1, FR_ROLE_SHM_CTRL = 2, FR_ROLE_STORE_CLIENT = 3, FR_ROLE_STORE_NODE = 4,
    FR_ROLE_UCX_CTRL = 5,   /* the ucx transport's control connection */
};

typedef struct {
    uint16_t type;
    uint64_t req_id;
    uint32_t len;
} fr_frame_hdr;

typedef struct { uint8_t nonce[FR_WIRE_NONCE_LEN]; uint64_t instance; } fr_msg_challenge;
typedef struct {
    uint8_t nonce[FR_WIRE_NONCE_LEN];
    uint64_t client_instance;
    uint64_t expect_instance;   /* 0: any instance; else must equal the server's */
    uint16_t role;              /* enum fr_conn_role */
    uint16_t stream;            /* stream index for FR_ROLE_TCP_STREAM */
    uint32_t caps;              /* FR_AUTH_CAP_*: what the client can speak (0: none) */
    uint8_t mac[FR_WIRE_MAC_LEN];
} fr_msg_auth;
/* caps: the server's AUTH_OK echoes the client's bits it speaks too. A peer
 * older than a bit refuses a frame with it (the field was reserved, zero):
 * a client that set one connects again without it (sockio.h). */
typedef struct { uint8_t mac[FR_WIRE_MAC_LEN]; uint32_t pid; uint32_t caps; } fr_msg_auth_ok;
/* Store connections: every store frame's body is followed by the sender's
 * leadership epoch, u64 (docs/wire.md, "Epochs"). */
#define FR_AUTH_CAP_EPOCH 1u
#define FR_AUTH_CAPS_KNOWN FR_AUTH_CAP_EPOCH
typedef struct { int32_t status; } fr_msg_auth_fail;
/* WRITE (then len data bytes) and READ. span_addr/span_len name the whole op
 * this chunk belongs to: the target checks the whole span on every chunk, so
 * an op partly outside a region is refused in all its chunks and touches
 * nothing. span_len == 0 means the span is the chunk itself (span_addr 0). */
typedef struct { uint64_t key, addr, len, span_addr, span_len; } fr_msg_rw;
/* WRITE_ROWS (then rows*len data bytes) and READ_ROWS: rows of len bytes,
 * row i at addr + i*stride at the target; the initiator's own layout does
 * not travel. 2 <= rows, 0 < len <= stride, rows*len <= FR_WIRE_MAX_DATA,
 * and addr + (rows-1)*stride + len (the chunk's extent) neither wraps nor
 * leaves the span, which means what it means for fr_msg_rw. */
typedef struct { uint64_t key, addr, len, stride, span_addr, span_len; uint32_t rows; } fr_msg_rows;
typedef struct { int32_t status; uint64_t len; } fr_msg_read_resp;
typedef struct { int32_t status; uint64_t value; } fr_msg_ack;
typedef struct { uint64_t tag, value; } fr_msg_notify;
typedef struct { uint64_t key; } fr_msg_map;
typedef struct {
    int32_t status;
    uint64_t region_base;       /* region start in the owner's address space */
    uint64_t fd_offset;         /* offset of region_base inside the memfd (page aligned down by the client) */
    uint64_t map_len;           /* bytes of the memfd the client may map */
} fr_msg_map_resp;
typedef struct { uint32_t pid; uint32_t table_slots; } fr_msg_shm_hello;

typedef struct {
    uint16_t type;
    union {
        fr_msg_challenge challenge;
        fr_msg_auth auth;
        fr_msg_auth_ok auth_ok;
        fr_msg_auth_fail auth_fail;
        fr_msg_rw rw;                 /* WRITE, READ */
        fr_msg_rows rows;             /* WRITE_ROWS, READ_ROWS */
        fr_msg_read_resp read_resp;
        fr_msg_ack ack;
        fr_msg_notify notify;
        fr_msg_map map;
        fr_msg_map_resp map_resp;
        fr_msg_shm_hello shm_hello;
    } u;
} fr_msg;

/* Bytes a valid WRITE_ROWS/READ_ROWS moves: rows * len. */
static inline uint64_t fr_msg_rows_bytes(const fr_msg_rows *r)
{
    return (uint64_t)r->rows * r->len;
}

/* Size of the fixed meta body of a type; 0 for an unknown or store type. */
size_t fr_wire_meta_len(uint16_t type);

/* Encode a header into out[FR_WIRE_HDR_LEN]. */
void fr_wire_hdr_encode(uint8_t *out, uint16_t type, uint64_t req_id, uint32_t len);
/* Decode and validate a header: magic, version, known type, check, and that
 * len is consistent with the type (== meta for fixed messages, >= meta and
 * <= meta + FR_WIRE_MAX_DATA for WRITE/WRITE_ROWS/READ_RESP, <= FR_WIRE_STORE_MAX_LEN
 * for store types). n < FR_WIRE_HDR_LEN is
 * FERRY_EPROTO (truncated). */
int fr_wire_hdr_decode(const uint8_t *in, size_t n, fr_frame_hdr *out);

/* Encode header + meta of m into out (cap bytes). data_len is the number of
 * data bytes that will follow (WRITE: must equal m->u.rw.len; WRITE_ROWS:
 * fr_msg_rows_bytes(&m->u.rows); READ_RESP: must
 * equal m->u.read_resp.len, or 0 when status != 0; others: 0). Returns bytes
 * written (header + meta) or a negative code. */
int fr_wire_encode(const fr_msg *m, uint64_t req_id, uint64_t data_len, uint8_t *out, size_t cap);
/* Decode the meta body of a frame whose header was already decoded (not a
 * store frame: FERRY_EPROTO). body has
 * n bytes (n >= fr_wire_meta_len(hdr->type) needed). Checks cross-field
 * consistency: WRITE rw.len == hdr.len - meta; WRITE_ROWS rows*len == hdr.len
 * - meta; the READ/WRITE_ROWS bounds above; READ_RESP len == hdr.len - meta
 * when status == 0, and hdr.len == meta when status != 0; READ len <=
 * FR_WIRE_MAX_DATA and len > 0; statuses are <= 0. */
int fr_wire_decode(const fr_frame_hdr *hdr, const uint8_t *body, size_t n, fr_msg *out);

/* ---- descriptors (exported blobs) --------------------------------------- */
#define FR_TRANSPORT_SHM 1u
#define FR_TRANSPORT_TCP 2u
#define FR_TRANSPORT_UCX 4u     /* a UCX worker behind an authenticated control port */
#define FR_UDS_MAX 107
/* Most bytes of a region's transport blob (a UCX packed rkey). */
#define FR_DESC_RKEY_MAX 128

typedef struct {
    uint64_t instance;          /* random per engine open; never 0 */
    uint8_t host[16];           /* host identity: boot id x network namespace */
    uint32_t pid;
    uint32_t transports;        /* FR_TRANSPORT_* bits */
    uint16_t family;            /* 4 or 6 */
    uint16_t port;
    uint8_t addr[16];           /* IPv4 in the first 4 bytes */
    char uds[FR_UDS_MAX + 1];   /* abstract unix socket name, NUL terminated ("" = none) */
    uint16_t ucx_port;          /* FR_TRANSPORT_UCX: the control port at addr (never 0) */
} fr_endpoint;

typedef struct {
    fr_endpoint ep;
    uint64_t base, len, key;
    uint32_t flags;             /* FERRY_REMOTE_* */
    uint32_t mem_kind;          /* enum ferry_mem_kind */
    /* FR_TRANSPORT_UCX endpoints only: the region's packed UCX rkey (0 bytes
     * when the region is not remote-accessible); bytes past rkey_len are 0. */
    uint16_t rkey_len;
    uint8_t rkey[FR_DESC_RKEY_MAX];
} fr_region_desc;

/* Blob layout: magic "FRYD" u32, version u16, kind u16 (1 endpoint, 2 region),
 * fields, then u32 check (XXH3-64 low bits of everything before). The UCX
 * fields (ucx_port, rkey) are present only when transports has
 * FR_TRANSPORT_UCX, so other blobs are byte for byte what they were. */
#define FR_DESC_MAX 256
int fr_endpoint_encode(const fr_endpoint *ep, uint8_t *out, size_t cap);      /* bytes or <0 */
int fr_endpoint_decode(const uint8_t *in, size_t n, fr_endpoint *out);
int fr_region_desc_encode(const fr_region_desc *rd, uint8_t *out, size_t cap);
int fr_region_desc_decode(const uint8_t *in, size_t n, fr_region_desc *out);
/* A UCX packed rkey's structure (UCX 1.x): u64 md_map, u8 memory type,
 * then for each bit of md_map a u8 length and that many bytes, all inside
 * the n bytes (bytes after the last entry are allowed: later UCX versions
 * append fields). UCX's own unpacker takes no length, so this is what keeps
 * it inside the blob. */
bool fr_ucx_rkey_ok(const uint8_t *rkey, size_t n);

#endif
