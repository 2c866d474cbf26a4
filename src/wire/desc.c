/* Endpoint and region descriptor blobs: what one engine exports and another
 * imports through a file, a socket or the user's own channel.
 *
 * Layout (little-endian, no padding, offsets in bytes):
 *
 *   off size field
 *     0   4  magic      FR_DESC_MAGIC ("FRYD")
 *     4   2  version    FR_DESC_VERSION
 *     6   2  kind       1 endpoint, 2 region
 *     8   8  instance   (never 0)
 *    16  16  host
 *    32   4  pid
 *    36   4  transports FR_TRANSPORT_* bits, at least one
 *    40   2  family     4 or 6
 *    42   2  port
 *    44  16  addr
 *    60   2  uds_len    <= FR_UDS_MAX
 *    62   n  uds        uds_len bytes, no NUL
 *  UCX endpoints only (transports has FR_TRANSPORT_UCX):
 *     +0  2  ucx_port   the UCX control port at addr, not 0
 *  region only, after the endpoint:
 *     +0  8  base
 *     +8  8  len        > 0, base+len does not overflow
 *    +16  8  key
 *    +24  4  flags      FERRY_REMOTE_READ | FERRY_REMOTE_WRITE bits only
 *    +28  4  mem_kind   0 host, 1 device
 *   UCX endpoints only:
 *    +32  2  rkey_len   <= FR_DESC_RKEY_MAX
 *    +34  k  rkey       a UCX packed rkey, structurally valid (fr_ucx_rkey_ok) when k > 0
 *  then  4  check       low 32 bits of XXH3-64 of every byte before it
 *
 * An endpoint blob is 66..175 bytes, a region blob 98..205 (UCX: up to
 * 337, so a UCX region blob must keep rkey and socket name short enough to
 * fit FR_DESC_MAX: its encoder says FERRY_EMSGSIZE otherwise). The encoding is canonical (one blob per value), so a decoded
 * blob re-encodes to the same bytes.
 *
 * Blobs are handed in by the application, so a malformed one is a bad
 * argument: every rejection is FERRY_EINVAL. An encode into too small a
 * buffer is FERRY_EMSGSIZE, as for frames. */
#include <assert.h>
#include <string.h>

#include <xxhash.h>

#include "wire/wire.h"

#define FR_DESC_MAGIC 0x44595246u   /* bytes 'F','R','Y','D' */
#define FR_DESC_VERSION 1
#define FR_DESC_KIND_ENDPOINT 1
#define FR_DESC_KIND_REGION 2
#define FR_DESC_CHECK_LEN 4
#define FR_DESC_FLAGS_KNOWN 0x3u    /* FERRY_REMOTE_READ | FERRY_REMOTE_WRITE */
#define FR_DESC_MEM_KIND_MAX 1u     /* FERRY_MEM_DEVICE */
#define FR_DESC_TRANSPORTS_KNOWN (FR_TRANSPORT_SHM | FR_TRANSPORT_TCP | FR_TRANSPORT_UCX)
#define FR_DESC_UCX_MEMTYPE_MAX 15u  /* UCS_MEMORY_TYPE_* fit well below */

/* ---- bounded little-endian cursors ------------------------------------ */
/* Both cursors latch a failure instead of touching memory out of range, so
 * a sequence of puts or gets is checked once at the end. */

typedef struct {
    uint8_t *p;
    size_t cap, off;
    bool bad;
} fr_wcur;

typedef struct {
    const uint8_t *p;
    size_t n, off;
    bool bad;
} fr_rcur;

static uint8_t *w_take(fr_wcur *w, size_t k)
{
    if (w->bad || w->cap - w->off < k) {
        w->bad = true;
        return NULL;
    }
    uint8_t *q = w->p + w->off;
    w->off += k;
    return q;
}

static void w_le(fr_wcur *w, uint64_t v, size_t k)
{
    uint8_t *q = w_take(w, k);
    for (size_t i = 0; q && i < k; i++, v >>= 8)
        q[i] = (uint8_t)v;
}

static void w_bytes(fr_wcur *w, const void *src, size_t k)
{
    uint8_t *q = w_take(w, k);
    if (q && k)
        memcpy(q, src, k);
}

static const uint8_t *r_take(fr_rcur *r, size_t k)
{
    if (r->bad || r->n - r->off < k) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *q = r->p + r->off;
    r->off += k;
    return q;
}

static uint64_t r_le(fr_rcur *r, size_t k)
{
    const uint8_t *q = r_take(r, k);
    uint64_t v = 0;
    for (size_t i = k; q && i-- > 0;)
        v = v << 8 | q[i];
    return v;
}

static void r_bytes(fr_rcur *r, void *dst, size_t k)
{
    const uint8_t *q = r_take(r, k);
    if (q && k)
        memcpy(dst, q, k);
}

/* ---- validation shared by encode and decode --------------------------- */

static bool endpoint_ok(const fr_endpoint *ep, size_t uds_len)
{
    if (ep->instance == 0 || (ep->family != 4 && ep->family != 6))
        return false;
    if (ep->transports == 0 || (ep->transports & ~FR_DESC_TRANSPORTS_KNOWN))
        return false;
    if ((ep->transports & FR_TRANSPORT_UCX) ? ep->ucx_port == 0 : ep->ucx_port != 0)
        return false;
    return uds_len <= FR_UDS_MAX;
}

bool fr_ucx_rkey_ok(const uint8_t *rkey, size_t n)
{
    fr_rcur r = { rkey, n, 0, false };
    uint64_t md_map = r_le(&r, 8);
    uint64_t mem_type = r_le(&r, 1);
    if (r.bad || mem_type > FR_DESC_UCX_MEMTYPE_MAX)
        return false;
    for (; md_map; md_map &= md_map - 1)
        (void)r_take(&r, (size_t)r_le(&r, 1));
    return !r.bad;
}

/* The rkey fields of a UCX region: a bounded length, zeroes past it (so a
 * value has one encoding), a UCX-shaped rkey; none for other endpoints. */
static bool rkey_ok(const fr_region_desc *rd)
{
    if (!(rd->ep.transports & FR_TRANSPORT_UCX))
        return rd->rkey_len == 0;
    if (rd->rkey_len > FR_DESC_RKEY_MAX)
        return false;
    for (size_t i = rd->rkey_len; i < FR_DESC_RKEY_MAX; i++)
        if (rd->rkey[i])
            return false;
    return rd->rkey_len == 0 || fr_ucx_rkey_ok(rd->rkey, rd->rkey_len);
}

static bool region_ok(const fr_region_desc *rd)
{
    uint64_t end;
    if (rd->len == 0 || __builtin_add_overflow(rd->base, rd->len, &end))
        return false;
    return (rd->flags & ~FR_DESC_FLAGS_KNOWN) == 0 && rd->mem_kind <= FR_DESC_MEM_KIND_MAX &&
           rkey_ok(rd);
}

/* ---- encode ----------------------------------------------------------- */

static void put_head(fr_wcur *w, uint16_t kind)
{
    w_le(w, FR_DESC_MAGIC, 4);
    w_le(w, FR_DESC_VERSION, 2);
    w_le(w, kind, 2);
}

static void put_endpoint(fr_wcur *w, const fr_endpoint *ep, size_t uds_len)
{
    w_le(w, ep->instance, 8);
    w_bytes(w, ep->host, sizeof ep->host);
    w_le(w, ep->pid, 4);
    w_le(w, ep->transports, 4);
    w_le(w, ep->family, 2);
    w_le(w, ep->port, 2);
    w_bytes(w, ep->addr, sizeof ep->addr);
    w_le(w, uds_len, 2);
    w_bytes(w, ep->uds, uds_len);
    if (ep->transports & FR_TRANSPORT_UCX)
        w_le(w, ep->ucx_port, 2);
}

static void put_region(fr_wcur *w, const fr_region_desc *rd)
{
    w_le(w, rd->base, 8);
    w_le(w, rd->len, 8);
    w_le(w, rd->key, 8);
    w_le(w, rd->flags, 4);
    w_le(w, rd->mem_kind, 4);
    if (rd->ep.transports & FR_TRANSPORT_UCX) {
        w_le(w, rd->rkey_len, 2);
        w_bytes(w, rd->rkey, rd->rkey_len);
    }
}

/* Append the check over everything written so far; bytes or EMSGSIZE. */
static int seal(fr_wcur *w)
{
    if (!w->bad)
        w_le(w, (uint32_t)XXH3_64bits(w->p, w->off), FR_DESC_CHECK_LEN);
    return w->bad ? FERRY_EMSGSIZE : (int)w->off;
}

/* strnlen bound one past the longest name: a name that fills the whole
 * array has no terminator and is refused. */
static size_t uds_len_of(const fr_endpoint *ep)
{
    return strnlen(ep->uds, sizeof ep->uds);
}

int fr_endpoint_encode(const fr_endpoint *ep, uint8_t *out, size_t cap)
{
    assert(ep && (out || cap == 0));
    size_t uds_len = uds_len_of(ep);
    if (!endpoint_ok(ep, uds_len))
        return FERRY_EINVAL;
    fr_wcur w = { out, cap, 0, false };
    put_head(&w, FR_DESC_KIND_ENDPOINT);
    put_endpoint(&w, ep, uds_len);
    return seal(&w);
}

int fr_region_desc_encode(const fr_region_desc *rd, uint8_t *out, size_t cap)
{
    assert(rd && (out || cap == 0));
    size_t uds_len = uds_len_of(&rd->ep);
    if (!endpoint_ok(&rd->ep, uds_len) || !region_ok(rd))
        return FERRY_EINVAL;
    fr_wcur w = { out, cap, 0, false };
    put_head(&w, FR_DESC_KIND_REGION);
    put_endpoint(&w, &rd->ep, uds_len);
    put_region(&w, rd);
    return seal(&w);
}

/* ---- decode ----------------------------------------------------------- */

/* Verify the trailing check and the head; on success r covers the bytes
 * before the check, positioned after the head. */
static bool open_blob(const uint8_t *in, size_t n, uint16_t kind, fr_rcur *r)
{
    if (!in || n > FR_DESC_MAX || n < 8 + FR_DESC_CHECK_LEN)
        return false;
    size_t body = n - FR_DESC_CHECK_LEN;
    fr_rcur c = { in + body, FR_DESC_CHECK_LEN, 0, false };
    if (r_le(&c, FR_DESC_CHECK_LEN) != (uint32_t)XXH3_64bits(in, body))
        return false;
    *r = (fr_rcur){ in, body, 0, false };
    uint64_t magic = r_le(r, 4), version = r_le(r, 2), k = r_le(r, 2);
    return magic == FR_DESC_MAGIC && version == FR_DESC_VERSION && k == kind;
}

static bool get_endpoint(fr_rcur *r, fr_endpoint *ep)
{
    ep->instance = r_le(r, 8);
    r_bytes(r, ep->host, sizeof ep->host);
    ep->pid = (uint32_t)r_le(r, 4);
    ep->transports = (uint32_t)r_le(r, 4);
    ep->family = (uint16_t)r_le(r, 2);
    ep->port = (uint16_t)r_le(r, 2);
    r_bytes(r, ep->addr, sizeof ep->addr);
    size_t uds_len = (size_t)r_le(r, 2);
    if (r->bad || uds_len > FR_UDS_MAX)
        return false;
    r_bytes(r, ep->uds, uds_len);
    /* ep->uds was zeroed by the caller, so the name is terminated. */
    if (r->bad || memchr(ep->uds, 0, uds_len))
        return false;
    if (ep->transports & FR_TRANSPORT_UCX)
        ep->ucx_port = (uint16_t)r_le(r, 2);
    return !r->bad && endpoint_ok(ep, uds_len);
}

static void get_region(fr_rcur *r, fr_region_desc *rd)
{
    rd->base = r_le(r, 8);
    rd->len = r_le(r, 8);
    rd->key = r_le(r, 8);
    rd->flags = (uint32_t)r_le(r, 4);
    rd->mem_kind = (uint32_t)r_le(r, 4);
    if (!(rd->ep.transports & FR_TRANSPORT_UCX))
        return;
    size_t k = (size_t)r_le(r, 2);
    if (r->bad || k > FR_DESC_RKEY_MAX) {
        r->bad = true;
        return;
    }
    rd->rkey_len = (uint16_t)k;
    r_bytes(r, rd->rkey, k);
}

/* Everything before the check consumed, nothing more. */
static bool closed(const fr_rcur *r)
{
    return !r->bad && r->off == r->n;
}

int fr_endpoint_decode(const uint8_t *in, size_t n, fr_endpoint *out)
{
    assert(out);
    fr_rcur r;
    fr_endpoint ep;
    memset(&ep, 0, sizeof ep);
    if (!open_blob(in, n, FR_DESC_KIND_ENDPOINT, &r) || !get_endpoint(&r, &ep) || !closed(&r))
        return FERRY_EINVAL;
    memcpy(out, &ep, sizeof ep);
    return 0;
}

int fr_region_desc_decode(const uint8_t *in, size_t n, fr_region_desc *out)
{
    assert(out);
    fr_rcur r;
    fr_region_desc rd;
    memset(&rd, 0, sizeof rd);
    if (!open_blob(in, n, FR_DESC_KIND_REGION, &r) || !get_endpoint(&r, &rd.ep))
        return FERRY_EINVAL;
    get_region(&r, &rd);
    if (!closed(&r) || !region_ok(&rd))
        return FERRY_EINVAL;
    memcpy(out, &rd, sizeof rd);
    return 0;
}
