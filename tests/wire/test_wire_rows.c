/* Strided READ/WRITE on the wire (READ_ROWS, WRITE_ROWS): round trips at
 * the edges of every bound, and one refusal per rule on both sides, the
 * encoder (FERRY_EINVAL / FERRY_EMSGSIZE) and the decoder (FERRY_EPROTO /
 * FERRY_EMSGSIZE, output untouched). Layout, truncation and reserved bytes
 * are pinned with every other type in test_wire_frame.c. Decoders get an
 * exact-size heap copy of the meta so that ASan sees any over-read. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

#define META 56
#define MAX_FRAME (FR_WIRE_HDR_LEN + META)

static void le(uint8_t *p, uint64_t v, size_t k)
{
    for (size_t i = 0; i < k; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

/* The meta bytes of r, built by hand from the layout in frame.c. */
static void meta_of(const fr_msg_rows *r, uint8_t *p)
{
    le(p, r->key, 8);
    le(p + 8, r->addr, 8);
    le(p + 16, r->len, 8);
    le(p + 24, r->span_addr, 8);
    le(p + 32, r->span_len, 8);
    le(p + 40, r->stride, 8);
    le(p + 48, r->rows, 4);
    le(p + 52, 0, 4);
}

static fr_msg_rows base(void)
{
    return (fr_msg_rows){ .key = 0xA5A5u, .addr = 1u << 20, .len = 100, .stride = 300, .rows = 7 };
}

static uint64_t bytes_of(const fr_msg_rows *r)
{
    return (uint64_t)r->rows * r->len;
}

/* fr_wire_decode of meta bytes under a header of hdr_len. */
static int decode(uint16_t type, uint64_t hdr_len, const uint8_t *meta, fr_msg *out)
{
    uint8_t *copy = malloc(META);
    assert_non_null(copy);
    memcpy(copy, meta, META);
    fr_frame_hdr h = { .type = type, .req_id = 3, .len = (uint32_t)hdr_len };
    int rc = fr_wire_decode(&h, copy, META, out);
    free(copy);
    return rc;
}

/* r encodes to its hand-built bytes and decodes back to itself, as both
 * types (WRITE_ROWS with its packed payload). */
static void assert_ok(fr_msg_rows r)
{
    static const uint16_t types[] = { FR_MSG_WRITE_ROWS, FR_MSG_READ_ROWS };
    for (size_t i = 0; i < 2; i++) {
        const uint16_t t = types[i];
        const uint64_t data = t == FR_MSG_WRITE_ROWS ? bytes_of(&r) : 0;
        fr_msg m = { .type = t }, out;
        m.u.rows = r;
        uint8_t buf[MAX_FRAME], want[META];
        assert_int_equal(fr_wire_encode(&m, 5, data, buf, sizeof buf), MAX_FRAME);
        meta_of(&r, want);
        assert_memory_equal(buf + FR_WIRE_HDR_LEN, want, META);
        fr_frame_hdr h;
        assert_int_equal(fr_wire_hdr_decode(buf, FR_WIRE_HDR_LEN, &h), 0);
        assert_int_equal(h.type, t);
        assert_true(h.len == META + data);
        memset(&out, 0x5A, sizeof out);
        assert_int_equal(decode(t, h.len, buf + FR_WIRE_HDR_LEN, &out), 0);
        assert_int_equal(out.type, t);
        assert_memory_equal(&out.u.rows, &r, sizeof r);
    }
}

/* r is refused by the encoder with enc and by the decoder with dec, as
 * both types, and a failed decode leaves its output untouched. */
static void assert_refused(fr_msg_rows r, int enc, int dec)
{
    static const uint16_t types[] = { FR_MSG_WRITE_ROWS, FR_MSG_READ_ROWS };
    for (size_t i = 0; i < 2; i++) {
        const uint16_t t = types[i];
        /* the payload a WRITE_ROWS would carry, where it can be framed */
        uint64_t data = 0;
        if (t == FR_MSG_WRITE_ROWS && r.len <= FR_WIRE_MAX_DATA && r.rows <= FR_WIRE_MAX_DATA &&
            bytes_of(&r) <= FR_WIRE_MAX_DATA)
            data = bytes_of(&r);
        fr_msg m = { .type = t }, out, before;
        m.u.rows = r;
        uint8_t buf[MAX_FRAME], meta[META];
        memset(buf, 0xEE, sizeof buf);
        assert_int_equal(fr_wire_encode(&m, 5, data, buf, sizeof buf), enc);
        meta_of(&r, meta);
        memset(&out, 0x3C, sizeof out);
        memcpy(&before, &out, sizeof out);
        assert_int_equal(decode(t, META + data, meta, &out), dec);
        assert_memory_equal(&out, &before, sizeof out);
    }
}

static void test_rows_round_trip(void **state)
{
    (void)state;
    fr_msg_rows r = base();
    assert_ok(r);
    r.rows = 2;                                        /* the fewest rows */
    assert_ok(r);
    r = base();
    r.stride = r.len;                                  /* rows that touch */
    assert_ok(r);
    r = (fr_msg_rows){ .key = 1, .addr = 0, .len = 1024, .stride = 4096, .rows = 65536 };
    assert_int_equal(bytes_of(&r), FR_WIRE_MAX_DATA); /* exactly one frame's worth */
    assert_ok(r);
    r = (fr_msg_rows){ .key = 1, .addr = 0, .len = FR_WIRE_MAX_DATA / 2, .stride = UINT64_MAX / 2, .rows = 2 };
    assert_ok(r);                                      /* huge stride, extent UINT64_MAX/2 + len */
    /* the last row ends exactly at the top of the address space */
    r = base();
    r.addr = UINT64_MAX - ((r.rows - 1) * r.stride + r.len);
    assert_ok(r);
    /* with a span: the op's, containing every row of the chunk */
    r = base();
    r.span_addr = r.addr - 4096;
    r.span_len = 4096 + (r.rows - 1) * r.stride + r.len;
    assert_ok(r);
    r.span_len += 1000;
    assert_ok(r);
}

static void test_rows_refused(void **state)
{
    (void)state;
    const int EI = FERRY_EINVAL, EP = FERRY_EPROTO, EM = FERRY_EMSGSIZE;
    fr_msg_rows r;

    /* rows >= 2: one row is a plain READ/WRITE */
    r = base(); r.rows = 0;  assert_refused(r, EI, EP);
    r = base(); r.rows = 1;  assert_refused(r, EI, EP);
    /* len > 0 */
    r = base(); r.len = 0;   assert_refused(r, EI, EP);
    /* stride >= len: rows are disjoint and ascending */
    r = base(); r.stride = r.len - 1; assert_refused(r, EI, EP);
    r = base(); r.stride = 0;         assert_refused(r, EI, EP);
    /* rows*len <= FR_WIRE_MAX_DATA */
    r = (fr_msg_rows){ .addr = 0, .len = 1024, .stride = 1024, .rows = 65537 };
    assert_refused(r, EM, EM);
    r = (fr_msg_rows){ .addr = 0, .len = FR_WIRE_MAX_DATA / 2 + 1, .stride = FR_WIRE_MAX_DATA, .rows = 2 };
    assert_refused(r, EM, EM);
    r = (fr_msg_rows){ .addr = 0, .len = UINT64_MAX, .stride = UINT64_MAX, .rows = UINT32_MAX };
    assert_refused(r, EM, EM);                         /* rows*len itself overflows */
    /* no overflow of addr + (rows-1)*stride + len */
    r = (fr_msg_rows){ .addr = 0, .len = 1, .stride = UINT64_MAX / 2 + 1, .rows = 3 };
    assert_refused(r, EI, EP);                         /* (rows-1)*stride */
    r = (fr_msg_rows){ .addr = 0, .len = 2, .stride = UINT64_MAX - 1, .rows = 2 };
    assert_refused(r, EI, EP);                         /* + len */
    r = base();
    r.addr = UINT64_MAX - ((r.rows - 1) * r.stride + r.len) + 1;
    assert_refused(r, EI, EP);                         /* addr + extent */
    /* the span contains the chunk's whole extent */
    r = base(); r.span_addr = 8;                       /* an address without a length */
    assert_refused(r, EI, EP);
    r = base(); r.span_addr = r.addr + 1; r.span_len = 1u << 30;
    assert_refused(r, EI, EP);                         /* starts after the first row */
    r = base(); r.span_addr = r.addr; r.span_len = (r.rows - 1) * r.stride + r.len - 1;
    assert_refused(r, EI, EP);                         /* the last row runs out by one byte */
    r = base(); r.span_addr = UINT64_MAX - 10; r.span_len = 100;
    assert_refused(r, EI, EP);                         /* the span wraps */
}

/* The payload of a WRITE_ROWS is exactly rows*len bytes; a READ_ROWS has
 * none; a header that says otherwise is refused. */
static void test_rows_payload(void **state)
{
    (void)state;
    fr_msg_rows r = base();
    const uint64_t n = bytes_of(&r);
    uint8_t buf[MAX_FRAME], meta[META];
    fr_msg m = { .type = FR_MSG_WRITE_ROWS }, out;
    m.u.rows = r;
    assert_int_equal(fr_wire_encode(&m, 1, n - 1, buf, sizeof buf), FERRY_EINVAL);
    assert_int_equal(fr_wire_encode(&m, 1, n + 1, buf, sizeof buf), FERRY_EINVAL);
    assert_int_equal(fr_wire_encode(&m, 1, r.len, buf, sizeof buf), FERRY_EINVAL);   /* one row */
    assert_int_equal(fr_wire_encode(&m, 1, 0, buf, sizeof buf), FERRY_EINVAL);
    meta_of(&r, meta);
    assert_int_equal(decode(FR_MSG_WRITE_ROWS, META + n, meta, &out), 0);
    assert_int_equal(decode(FR_MSG_WRITE_ROWS, META + n - 1, meta, &out), FERRY_EPROTO);
    assert_int_equal(decode(FR_MSG_WRITE_ROWS, META + n + 1, meta, &out), FERRY_EPROTO);
    assert_int_equal(decode(FR_MSG_WRITE_ROWS, META, meta, &out), FERRY_EPROTO);
    assert_int_equal(decode(FR_MSG_WRITE_ROWS, META + (uint64_t)FR_WIRE_MAX_DATA + 1, meta, &out),
                     FERRY_EMSGSIZE);

    m.type = FR_MSG_READ_ROWS;
    assert_int_equal(fr_wire_encode(&m, 1, n, buf, sizeof buf), FERRY_EINVAL);
    assert_int_equal(fr_wire_encode(&m, 1, 0, buf, sizeof buf), MAX_FRAME);
    assert_int_equal(decode(FR_MSG_READ_ROWS, META, meta, &out), 0);
    assert_int_equal(decode(FR_MSG_READ_ROWS, META + n, meta, &out), FERRY_EPROTO);
    /* the 56-byte meta is the only length a READ_ROWS frame may have */
    uint8_t h[FR_WIRE_HDR_LEN];
    fr_frame_hdr hd;
    fr_wire_hdr_encode(h, FR_MSG_READ_ROWS, 1, META + 1);
    assert_int_equal(fr_wire_hdr_decode(h, sizeof h, &hd), FERRY_EPROTO);
    fr_wire_hdr_encode(h, FR_MSG_WRITE_ROWS, 1, META - 1);
    assert_int_equal(fr_wire_hdr_decode(h, sizeof h, &hd), FERRY_EPROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_round_trip),
        cmocka_unit_test(test_rows_refused),
        cmocka_unit_test(test_rows_payload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
