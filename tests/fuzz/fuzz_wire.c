/* libFuzzer target over every wire decoder. The first input byte picks the
 * decoder, the rest is its input:
 *
 *   0  frame header (fr_wire_hdr_decode)
 *   1  whole frame: header, then fr_wire_decode of the meta with that header
 *   2  endpoint blob
 *   3  region blob
 *   4  as 1, 5 as 2, 6 as 3, but the harness inserts the check itself
 *      (frame: at byte 20; blob: at the end).
 *   7  a UCX packed rkey alone (fr_ucx_rkey_ok), in an exact-size buffer:
 *      the walk that keeps UCX's length-less unpacker inside the blob must
 *      itself stay inside it. A check is a hash the fuzzer
 *      cannot forge, so without these modes it would never get past it to
 *      the field rules.
 *
 * Whenever a decode succeeds the value is encoded again, and the encoding
 * must reproduce the accepted input bytes exactly (every encoding is
 * canonical) and decode to the identical value; anything else aborts. A
 * decoded READ_ROWS/WRITE_ROWS must also describe rows a target can serve
 * without overflow (rows_sane); a decoded UCX region carries a bounded,
 * UCX-shaped rkey with zeroes after it, and a UCX endpoint a control port. corpus_wire/ seeds every message type,
 * the strided ones (*_rows) included, in modes 0, 1 and 4. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "wire/wire.h"

#define FR_FUZZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

/* Largest meta (AUTH) with room to spare. */
#define FR_FUZZ_FRAME_MAX (FR_WIRE_HDR_LEN + 128)

static bool same_hdr(const fr_frame_hdr *a, const fr_frame_hdr *b)
{
    return a->type == b->type && a->req_id == b->req_id && a->len == b->len;
}

static void fuzz_hdr(const uint8_t *in, size_t n)
{
    fr_frame_hdr h, h2;
    uint8_t b[FR_WIRE_HDR_LEN];
    if (fr_wire_hdr_decode(in, n, &h) < 0)
        return;
    fr_wire_hdr_encode(b, h.type, h.req_id, h.len);
    FR_FUZZ_CHECK(memcmp(b, in, sizeof b) == 0);
    FR_FUZZ_CHECK(fr_wire_hdr_decode(b, sizeof b, &h2) == 0 && same_hdr(&h, &h2));
}

/* Re-encode a decoded message and check it against the meta bytes it came
 * from; returns the whole re-encoded frame in out (FR_FUZZ_FRAME_MAX). */
static void msg_round_trip(const fr_frame_hdr *h, const fr_msg *m, const uint8_t *meta, uint8_t *out)
{
    size_t meta_len = fr_wire_meta_len(h->type);
    FR_FUZZ_CHECK(meta_len > 0 && h->len >= meta_len);
    int k = fr_wire_encode(m, h->req_id, h->len - meta_len, out, FR_FUZZ_FRAME_MAX);
    FR_FUZZ_CHECK(k == (int)(FR_WIRE_HDR_LEN + meta_len));
    FR_FUZZ_CHECK(memcmp(out + FR_WIRE_HDR_LEN, meta, meta_len) == 0);

    fr_frame_hdr h2;
    fr_msg m2;
    FR_FUZZ_CHECK(fr_wire_hdr_decode(out, (size_t)k, &h2) == 0 && same_hdr(h, &h2));
    FR_FUZZ_CHECK(fr_wire_decode(&h2, out + FR_WIRE_HDR_LEN, meta_len, &m2) == 0);
    FR_FUZZ_CHECK(memcmp(m, &m2, sizeof m2) == 0);
}

/* What a target computes from an accepted strided request must not wrap:
 * the extent, its end, the packed size, and the size is the frame's. */
static void rows_sane(const fr_frame_hdr *h, const fr_msg *m)
{
    if (h->type != FR_MSG_READ_ROWS && h->type != FR_MSG_WRITE_ROWS)
        return;
    const fr_msg_rows *r = &m->u.rows;
    uint64_t ext, end;
    FR_FUZZ_CHECK(r->rows >= 2 && r->len > 0 && r->stride >= r->len);
    FR_FUZZ_CHECK(fr_msg_rows_bytes(r) <= FR_WIRE_MAX_DATA);
    FR_FUZZ_CHECK(!__builtin_mul_overflow((uint64_t)r->rows - 1, r->stride, &ext) &&
                  !__builtin_add_overflow(ext, r->len, &ext) &&
                  !__builtin_add_overflow(r->addr, ext, &end));
    FR_FUZZ_CHECK(r->span_len == 0 || (r->addr >= r->span_addr && end - r->span_addr <= r->span_len));
    if (h->type == FR_MSG_WRITE_ROWS)
        FR_FUZZ_CHECK(h->len - fr_wire_meta_len(h->type) == fr_msg_rows_bytes(r));
}

static void fuzz_frame(const uint8_t *in, size_t n)
{
    fr_frame_hdr h;
    fr_msg m;
    uint8_t b[FR_FUZZ_FRAME_MAX];
    if (fr_wire_hdr_decode(in, n, &h) < 0)
        return;
    if (fr_wire_decode(&h, in + FR_WIRE_HDR_LEN, n - FR_WIRE_HDR_LEN, &m) < 0)
        return;
    rows_sane(&h, &m);
    msg_round_trip(&h, &m, in + FR_WIRE_HDR_LEN, b);
    FR_FUZZ_CHECK(memcmp(b, in, FR_WIRE_HDR_LEN) == 0);
}

static void fuzz_endpoint(const uint8_t *in, size_t n)
{
    fr_endpoint ep, ep2;
    uint8_t b[FR_DESC_MAX];
    if (fr_endpoint_decode(in, n, &ep) < 0)
        return;
    int k = fr_endpoint_encode(&ep, b, sizeof b);
    FR_FUZZ_CHECK(k > 0 && (size_t)k == n && memcmp(b, in, n) == 0);
    FR_FUZZ_CHECK(fr_endpoint_decode(b, (size_t)k, &ep2) == 0);
    FR_FUZZ_CHECK(memcmp(&ep, &ep2, sizeof ep) == 0);
    FR_FUZZ_CHECK(memchr(ep.uds, 0, sizeof ep.uds) != NULL);
    FR_FUZZ_CHECK(((ep.transports & FR_TRANSPORT_UCX) != 0) == (ep.ucx_port != 0));
}

static void fuzz_region(const uint8_t *in, size_t n)
{
    fr_region_desc rd, rd2;
    uint8_t b[FR_DESC_MAX];
    if (fr_region_desc_decode(in, n, &rd) < 0)
        return;
    int k = fr_region_desc_encode(&rd, b, sizeof b);
    FR_FUZZ_CHECK(k > 0 && (size_t)k == n && memcmp(b, in, n) == 0);
    FR_FUZZ_CHECK(fr_region_desc_decode(b, (size_t)k, &rd2) == 0);
    FR_FUZZ_CHECK(memcmp(&rd, &rd2, sizeof rd) == 0);
    FR_FUZZ_CHECK(memchr(rd.ep.uds, 0, sizeof rd.ep.uds) != NULL);
    FR_FUZZ_CHECK(rd.rkey_len <= FR_DESC_RKEY_MAX);
    FR_FUZZ_CHECK(rd.rkey_len == 0 || ((rd.ep.transports & FR_TRANSPORT_UCX) && fr_ucx_rkey_ok(rd.rkey, rd.rkey_len)));
    for (size_t i = rd.rkey_len; i < FR_DESC_RKEY_MAX; i++)
        FR_FUZZ_CHECK(rd.rkey[i] == 0);
}

static void fuzz_rkey(const uint8_t *in, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    FR_FUZZ_CHECK(b != NULL);
    memcpy(b, in, n);
    (void)fr_ucx_rkey_ok(b, n);   /* ASan: never reads past n */
    free(b);
}

/* Run fn on in[0..n) with a valid check over in[0..at) inserted at at, in
 * an exact-size heap buffer so that over-reads still trip ASan. */
static void with_check(void (*fn)(const uint8_t *, size_t), const uint8_t *in, size_t n, size_t at)
{
    if (at > n)
        return;
    uint8_t *b = malloc(n + 4);
    FR_FUZZ_CHECK(b != NULL);
    memcpy(b, in, at);
    uint32_t c = (uint32_t)XXH3_64bits(b, at);
    for (size_t i = 0; i < 4; i++)
        b[at + i] = (uint8_t)(c >> (8 * i));
    memcpy(b + at + 4, in + at, n - at);
    fn(b, n + 4);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    switch (data[0] % 8) {
    case 0: fuzz_hdr(in, n); break;
    case 1: fuzz_frame(in, n); break;
    case 2: fuzz_endpoint(in, n); break;
    case 3: fuzz_region(in, n); break;
    case 4: with_check(fuzz_frame, in, n, 20); break;
    case 5: with_check(fuzz_endpoint, in, n, n); break;
    case 6: with_check(fuzz_region, in, n, n); break;
    default: fuzz_rkey(in, n); break;
    }
    return 0;
}
