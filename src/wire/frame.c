/* Frame header and message meta codecs (see wire.h for the header layout).
 *
 * Every meta body has a fixed size. Offsets are from the start of the meta,
 * all integers little-endian, "rsv" bytes are written as zero and rejected
 * when non-zero so that they can carry meaning in a later version.
 *
 *   type        size  layout
 *   CHALLENGE     40  nonce[32] @0, instance u64 @32
 *   AUTH          88  nonce[32] @0, client_instance u64 @32,
 *                     expect_instance u64 @40, role u16 @48, stream u16 @50,
 *                     rsv u32 @52, mac[32] @56
 *   AUTH_OK       40  mac[32] @0, pid u32 @32, rsv u32 @36
 *   AUTH_FAIL      8  status i32 @0, rsv u32 @4
 *   WRITE, READ   40  key u64 @0, addr u64 @8, len u64 @16,
 *                     span_addr u64 @24, span_len u64 @32
 *   READ_RESP     16  status i32 @0, rsv u32 @4, len u64 @8
 *   ACK           16  status i32 @0, rsv u32 @4, value u64 @8
 *   NOTIFY        16  tag u64 @0, value u64 @8
 *   MAP            8  key u64 @0
 *   MAP_RESP      32  status i32 @0, rsv u32 @4, region_base u64 @8,
 *                     fd_offset u64 @16, map_len u64 @24
 *   SHM_HELLO      8  pid u32 @0, table_slots u32 @4
 *   WRITE_ROWS,   56  key u64 @0, addr u64 @8, len u64 @16 (one row),
 *   READ_ROWS         span_addr u64 @24, span_len u64 @32, stride u64 @40,
 *                     rows u32 @48, rsv u32 @52
 *
 * Validation is shared by the encoder and the decoder so that whatever one
 * side accepts the other produces. The one function (msg_check) answers
 * FERRY_EINVAL for a malformed message and FERRY_EMSGSIZE for a length above
 * a hard limit; the decoder turns FERRY_EINVAL into FERRY_EPROTO because
 * there the fault is the peer's, not the caller's. fr_wire_encode also
 * answers FERRY_EMSGSIZE when cap is too small (and then writes nothing).
 *
 * Rules beyond the comments in wire.h: reserved bytes are zero; a status is
 * 0 or in [-(FERRY_EBASE+1000), -1]; AUTH role is 1..5; READ and WRITE
 * name 1..FR_WIRE_MAX_DATA bytes and addr+len does not wrap; READ_ROWS and
 * WRITE_ROWS have 2 <= rows, 0 < len <= stride, rows*len <= FR_WIRE_MAX_DATA
 * (else FERRY_EMSGSIZE) and an extent addr + (rows-1)*stride + len that
 * does not wrap; the chunk (its extent, for rows) lies in its span; a MAP_RESP
 * with status 0 has map_len > 0 and fd_offset+map_len does not wrap. A
 * READ_RESP with a failed status carries no data; its len field is passed
 * through unchecked. */
#include <assert.h>
#include <string.h>

#include <xxhash.h>

#include "wire/wire.h"

/* Lowest status a peer may send: any errno or ferry code, with headroom for
 * codes added later, but nothing that could be mistaken for a count. */
#define FR_STATUS_MIN (-(FERRY_EBASE + 1000))

/* ---- little-endian packing ------------------------------------------- */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    put16(p, (uint16_t)v);
    put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
    return get16(p) | (uint32_t)get16(p + 2) << 16;
}

static uint64_t get64(const uint8_t *p)
{
    return get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Statuses travel as the two's complement bit pattern of the i32. */
static void put_status(uint8_t *p, int32_t s)
{
    put32(p, (uint32_t)s);
}

static int32_t get_status(const uint8_t *p)
{
    uint32_t u = get32(p);
    /* Converting an out-of-range u32 to i32 is implementation-defined;
     * spell out the two's complement mapping instead. */
    return u <= INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) + INT32_MIN;
}

/* ---- per-type meta codecs ------------------------------------------- */

static void enc_challenge(const fr_msg *m, uint8_t *p)
{
    memcpy(p, m->u.challenge.nonce, FR_WIRE_NONCE_LEN);
    put64(p + 32, m->u.challenge.instance);
}

static bool dec_challenge(const uint8_t *p, fr_msg *m)
{
    memcpy(m->u.challenge.nonce, p, FR_WIRE_NONCE_LEN);
    m->u.challenge.instance = get64(p + 32);
    return true;
}

static void enc_auth(const fr_msg *m, uint8_t *p)
{
    const fr_msg_auth *a = &m->u.auth;
    memcpy(p, a->nonce, FR_WIRE_NONCE_LEN);
    put64(p + 32, a->client_instance);
    put64(p + 40, a->expect_instance);
    put16(p + 48, a->role);
    put16(p + 50, a->stream);
    put32(p + 52, a->caps);
    memcpy(p + 56, a->mac, FR_WIRE_MAC_LEN);
}

static bool dec_auth(const uint8_t *p, fr_msg *m)
{
    fr_msg_auth *a = &m->u.auth;
    memcpy(a->nonce, p, FR_WIRE_NONCE_LEN);
    a->client_instance = get64(p + 32);
    a->expect_instance = get64(p + 40);
    a->role = get16(p + 48);
    a->stream = get16(p + 50);
    a->caps = get32(p + 52);
    memcpy(a->mac, p + 56, FR_WIRE_MAC_LEN);
    return (a->caps & ~FR_AUTH_CAPS_KNOWN) == 0;
}

static void enc_auth_ok(const fr_msg *m, uint8_t *p)
{
    memcpy(p, m->u.auth_ok.mac, FR_WIRE_MAC_LEN);
    put32(p + 32, m->u.auth_ok.pid);
    put32(p + 36, m->u.auth_ok.caps);
}

static bool dec_auth_ok(const uint8_t *p, fr_msg *m)
{
    memcpy(m->u.auth_ok.mac, p, FR_WIRE_MAC_LEN);
    m->u.auth_ok.pid = get32(p + 32);
    m->u.auth_ok.caps = get32(p + 36);
    return (m->u.auth_ok.caps & ~FR_AUTH_CAPS_KNOWN) == 0;
}

static void enc_auth_fail(const fr_msg *m, uint8_t *p)
{
    put_status(p, m->u.auth_fail.status);
    put32(p + 4, 0);
}

static bool dec_auth_fail(const uint8_t *p, fr_msg *m)
{
    m->u.auth_fail.status = get_status(p);
    return get32(p + 4) == 0;
}

static void enc_rw(const fr_msg *m, uint8_t *p)
{
    put64(p, m->u.rw.key);
    put64(p + 8, m->u.rw.addr);
    put64(p + 16, m->u.rw.len);
    put64(p + 24, m->u.rw.span_addr);
    put64(p + 32, m->u.rw.span_len);
}

static bool dec_rw(const uint8_t *p, fr_msg *m)
{
    m->u.rw.key = get64(p);
    m->u.rw.addr = get64(p + 8);
    m->u.rw.len = get64(p + 16);
    m->u.rw.span_addr = get64(p + 24);
    m->u.rw.span_len = get64(p + 32);
    return true;
}

static void enc_rows(const fr_msg *m, uint8_t *p)
{
    const fr_msg_rows *r = &m->u.rows;
    put64(p, r->key);
    put64(p + 8, r->addr);
    put64(p + 16, r->len);
    put64(p + 24, r->span_addr);
    put64(p + 32, r->span_len);
    put64(p + 40, r->stride);
    put32(p + 48, r->rows);
    put32(p + 52, 0);
}

static bool dec_rows(const uint8_t *p, fr_msg *m)
{
    fr_msg_rows *r = &m->u.rows;
    r->key = get64(p);
    r->addr = get64(p + 8);
    r->len = get64(p + 16);
    r->span_addr = get64(p + 24);
    r->span_len = get64(p + 32);
    r->stride = get64(p + 40);
    r->rows = get32(p + 48);
    return get32(p + 52) == 0;
}

static void enc_read_resp(const fr_msg *m, uint8_t *p)
{
    put_status(p, m->u.read_resp.status);
    put32(p + 4, 0);
    put64(p + 8, m->u.read_resp.len);
}

static bool dec_read_resp(const uint8_t *p, fr_msg *m)
{
    m->u.read_resp.status = get_status(p);
    m->u.read_resp.len = get64(p + 8);
    return get32(p + 4) == 0;
}

static void enc_ack(const fr_msg *m, uint8_t *p)
{
    put_status(p, m->u.ack.status);
    put32(p + 4, 0);
    put64(p + 8, m->u.ack.value);
}

static bool dec_ack(const uint8_t *p, fr_msg *m)
{
    m->u.ack.status = get_status(p);
    m->u.ack.value = get64(p + 8);
    return get32(p + 4) == 0;
}

static void enc_notify(const fr_msg *m, uint8_t *p)
{
    put64(p, m->u.notify.tag);
    put64(p + 8, m->u.notify.value);
}

static bool dec_notify(const uint8_t *p, fr_msg *m)
{
    m->u.notify.tag = get64(p);
    m->u.notify.value = get64(p + 8);
    return true;
}

static void enc_map(const fr_msg *m, uint8_t *p)
{
    put64(p, m->u.map.key);
}

static bool dec_map(const uint8_t *p, fr_msg *m)
{
    m->u.map.key = get64(p);
    return true;
}

static void enc_map_resp(const fr_msg *m, uint8_t *p)
{
    const fr_msg_map_resp *r = &m->u.map_resp;
    put_status(p, r->status);
    put32(p + 4, 0);
    put64(p + 8, r->region_base);
    put64(p + 16, r->fd_offset);
    put64(p + 24, r->map_len);
}

static bool dec_map_resp(const uint8_t *p, fr_msg *m)
{
    fr_msg_map_resp *r = &m->u.map_resp;
    r->status = get_status(p);
    r->region_base = get64(p + 8);
    r->fd_offset = get64(p + 16);
    r->map_len = get64(p + 24);
    return get32(p + 4) == 0;
}

static void enc_shm_hello(const fr_msg *m, uint8_t *p)
{
    put32(p, m->u.shm_hello.pid);
    put32(p + 4, m->u.shm_hello.table_slots);
}

static bool dec_shm_hello(const uint8_t *p, fr_msg *m)
{
    m->u.shm_hello.pid = get32(p);
    m->u.shm_hello.table_slots = get32(p + 4);
    return true;
}

typedef struct {
    uint8_t meta_len;
    bool has_data;   /* a data payload may follow the meta */
    void (*enc)(const fr_msg *m, uint8_t *p);
    bool (*dec)(const uint8_t *p, fr_msg *m);  /* false: reserved bytes set */
} fr_codec;

static const fr_codec codecs[FR_MSG_TYPE_MAX + 1] = {
    [FR_MSG_CHALLENGE] = { 40, false, enc_challenge, dec_challenge },
    [FR_MSG_AUTH] = { 88, false, enc_auth, dec_auth },
    [FR_MSG_AUTH_OK] = { 40, false, enc_auth_ok, dec_auth_ok },
    [FR_MSG_AUTH_FAIL] = { 8, false, enc_auth_fail, dec_auth_fail },
    [FR_MSG_WRITE] = { 40, true, enc_rw, dec_rw },
    [FR_MSG_READ] = { 40, false, enc_rw, dec_rw },
    [FR_MSG_READ_RESP] = { 16, true, enc_read_resp, dec_read_resp },
    [FR_MSG_ACK] = { 16, false, enc_ack, dec_ack },
    [FR_MSG_NOTIFY] = { 16, false, enc_notify, dec_notify },
    [FR_MSG_MAP] = { 8, false, enc_map, dec_map },
    [FR_MSG_MAP_RESP] = { 32, false, enc_map_resp, dec_map_resp },
    [FR_MSG_SHM_HELLO] = { 8, false, enc_shm_hello, dec_shm_hello },
    [FR_MSG_WRITE_ROWS] = { 56, true, enc_rows, dec_rows },
    [FR_MSG_READ_ROWS] = { 56, false, enc_rows, dec_rows },
};

static const fr_codec *codec_of(uint16_t type)
{
    if (type > FR_MSG_TYPE_MAX || codecs[type].meta_len == 0)
        return NULL;
    return &codecs[type];
}

size_t fr_wire_meta_len(uint16_t type)
{
    const fr_codec *c = codec_of(type);
    return c ? c->meta_len : 0;
}

/* ---- validation shared by encode and decode --------------------------- */

static bool status_ok(int32_t s)
{
    return s <= 0 && s >= FR_STATUS_MIN;
}

/* The span, when given, must contain the chunk [addr, end). */
static int span_check(uint64_t addr, uint64_t end, uint64_t span_addr, uint64_t span_len)
{
    uint64_t span_end;
    if (span_len == 0)
        return span_addr == 0 ? 0 : FERRY_EINVAL;
    if (__builtin_add_overflow(span_addr, span_len, &span_end))
        return FERRY_EINVAL;
    if (addr < span_addr || end > span_end)
        return FERRY_EINVAL;
    return 0;
}

/* A READ or WRITE names 1..FR_WIRE_MAX_DATA bytes that fit in the u64
 * address space; anything else cannot describe a real transfer. */
static int rw_check(const fr_msg_rw *rw)
{
    uint64_t end;
    if (rw->len == 0)
        return FERRY_EINVAL;
    if (rw->len > FR_WIRE_MAX_DATA)
        return FERRY_EMSGSIZE;
    if (__builtin_add_overflow(rw->addr, rw->len, &end))
        return FERRY_EINVAL;
    return span_check(rw->addr, end, rw->span_addr, rw->span_len);
}

/* READ_ROWS / WRITE_ROWS: disjoint rows in ascending order (one row or
 * overlapping rows go as plain READ/WRITE), at most one frame's worth of
 * data, and an extent that fits in the u64 address space. */
static int rows_check(const fr_msg_rows *r)
{
    uint64_t bytes, ext, end;
    if (r->rows < 2 || r->len == 0 || r->stride < r->len)
        return FERRY_EINVAL;
    if (__builtin_mul_overflow(r->len, (uint64_t)r->rows, &bytes) || bytes > FR_WIRE_MAX_DATA)
        return FERRY_EMSGSIZE;
    if (__builtin_mul_overflow((uint64_t)r->rows - 1, r->stride, &ext) ||
        __builtin_add_overflow(ext, r->len, &ext) || __builtin_add_overflow(r->addr, ext, &end))
        return FERRY_EINVAL;
    return span_check(r->addr, end, r->span_addr, r->span_len);
}

static int read_resp_check(const fr_msg_read_resp *r, uint64_t data_len)
{
    if (!status_ok(r->status))
        return FERRY_EINVAL;
    if (r->status != 0)   /* a failed read carries no data, whatever len says */
        return data_len == 0 ? 0 : FERRY_EINVAL;
    if (r->len > FR_WIRE_MAX_DATA)
        return FERRY_EMSGSIZE;
    return r->len == data_len ? 0 : FERRY_EINVAL;
}

static int map_resp_check(const fr_msg_map_resp *r)
{
    uint64_t end;
    if (!status_ok(r->status))
        return FERRY_EINVAL;
    if (r->status != 0)
        return 0;
    if (r->map_len == 0 || __builtin_add_overflow(r->fd_offset, r->map_len, &end))
        return FERRY_EINVAL;
    return 0;
}

/* data_len: bytes of payload after the meta. 0, FERRY_EINVAL or
 * FERRY_EMSGSIZE. */
static int msg_check(const fr_msg *m, uint64_t data_len)
{
    int rc;
    switch (m->type) {
    case FR_MSG_AUTH:
        rc = (m->u.auth.role >= FR_ROLE_TCP_STREAM && m->u.auth.role <= FR_ROLE_UCX_CTRL &&
              (m->u.auth.caps & ~FR_AUTH_CAPS_KNOWN) == 0) ? 0 : FERRY_EINVAL;
        break;
    case FR_MSG_AUTH_OK:
        rc = (m->u.auth_ok.caps & ~FR_AUTH_CAPS_KNOWN) == 0 ? 0 : FERRY_EINVAL;
        break;
    case FR_MSG_AUTH_FAIL:
        rc = status_ok(m->u.auth_fail.status) ? 0 : FERRY_EINVAL;
        break;
    case FR_MSG_WRITE:
        rc = rw_check(&m->u.rw);
        return rc < 0 ? rc : (m->u.rw.len == data_len ? 0 : FERRY_EINVAL);
    case FR_MSG_READ:
        rc = rw_check(&m->u.rw);
        break;
    case FR_MSG_WRITE_ROWS:
        rc = rows_check(&m->u.rows);
        return rc < 0 ? rc : (fr_msg_rows_bytes(&m->u.rows) == data_len ? 0 : FERRY_EINVAL);
    case FR_MSG_READ_ROWS:
        rc = rows_check(&m->u.rows);
        break;
    case FR_MSG_READ_RESP:
        return read_resp_check(&m->u.read_resp, data_len);
    case FR_MSG_ACK:
        rc = status_ok(m->u.ack.status) ? 0 : FERRY_EINVAL;
        break;
    case FR_MSG_MAP_RESP:
        rc = map_resp_check(&m->u.map_resp);
        break;
    default:
        rc = 0;
        break;
    }
    if (rc == 0 && data_len != 0)
        rc = FERRY_EINVAL;
    return rc;
}

/* ---- header ----------------------------------------------------------- */

static uint32_t hdr_check(const uint8_t *hdr)
{
    return (uint32_t)XXH3_64bits(hdr, 20);
}

void fr_wire_hdr_encode(uint8_t *out, uint16_t type, uint64_t req_id, uint32_t len)
{
    put32(out, FR_WIRE_MAGIC);
    put16(out + 4, FR_WIRE_VERSION);
    put16(out + 6, type);
    put64(out + 8, req_id);
    put32(out + 16, len);
    put32(out + 20, hdr_check(out));
}

/* Is len a possible frame length for type? A fixed-size message of any
 * other length is malformed (EPROTO); only a data-carrying message can be
 * "too large" (EMSGSIZE). */
static int hdr_len_check(uint16_t type, uint64_t len)
{
    if (type >= FR_MSG_STORE_FIRST && type <= FR_MSG_STORE_LAST)
        return len <= FR_WIRE_STORE_MAX_LEN ? 0 : FERRY_EMSGSIZE;
    const fr_codec *c = codec_of(type);
    if (!c)
        return FERRY_EPROTO;
    if (!c->has_data)
        return len == c->meta_len ? 0 : FERRY_EPROTO;
    if (len < c->meta_len)
        return FERRY_EPROTO;
    return len - c->meta_len <= FR_WIRE_MAX_DATA ? 0 : FERRY_EMSGSIZE;
}

int fr_wire_hdr_decode(const uint8_t *in, size_t n, fr_frame_hdr *out)
{
    assert(out && (in || n == 0));
    if (n < FR_WIRE_HDR_LEN)
        return FERRY_EPROTO;
    if (get32(in) != FR_WIRE_MAGIC || get16(in + 4) != FR_WIRE_VERSION)
        return FERRY_EPROTO;
    /* The check goes before the length rule so that a corrupted length is
     * reported as corruption, not as an oversized frame. */
    if (get32(in + 20) != hdr_check(in))
        return FERRY_EPROTO;
    uint16_t type = get16(in + 6);
    uint32_t len = get32(in + 16);
    int rc = hdr_len_check(type, len);
    if (rc < 0)
        return rc;
    out->type = type;
    out->req_id = get64(in + 8);
    out->len = len;
    return 0;
}

/* ---- messages --------------------------------------------------------- */

int fr_wire_encode(const fr_msg *m, uint64_t req_id, uint64_t data_len, uint8_t *out, size_t cap)
{
    assert(m && (out || cap == 0));
    const fr_codec *c = codec_of(m->type);
    if (!c)
        return FERRY_EINVAL;
    int rc = msg_check(m, data_len);
    if (rc < 0)
        return rc;
    size_t need = FR_WIRE_HDR_LEN + (size_t)c->meta_len;
    if (cap < need)
        return FERRY_EMSGSIZE;
    /* msg_check bounds data_len by FR_WIRE_MAX_DATA, so this fits in u32. */
    fr_wire_hdr_encode(out, m->type, req_id, (uint32_t)(c->meta_len + data_len));
    c->enc(m, out + FR_WIRE_HDR_LEN);
    return (int)need;
}

int fr_wire_decode(const fr_frame_hdr *hdr, const uint8_t *body, size_t n, fr_msg *out)
{
    assert(hdr && out && (body || n == 0));
    /* hdr normally comes from fr_wire_hdr_decode, but it is re-checked so
     * that the data length below cannot underflow whatever the caller did. */
    int rc = hdr_len_check(hdr->type, hdr->len);
    if (rc < 0)
        return rc;
    const fr_codec *c = codec_of(hdr->type);
    if (!c)
        return FERRY_EPROTO;   /* a store frame: fr_smsg_decode's */
    if (n < c->meta_len)
        return FERRY_EPROTO;
    fr_msg m;
    memset(&m, 0, sizeof m);
    m.type = hdr->type;
    if (!c->dec(body, &m))
        return FERRY_EPROTO;
    rc = msg_check(&m, hdr->len - c->meta_len);
    if (rc < 0)
        return rc == FERRY_EINVAL ? FERRY_EPROTO : rc;
    memcpy(out, &m, sizeof m);
    return 0;
}
