/* Endpoint and region descriptor blobs. Expected bytes come from a builder
 * written here from the layout in desc.c, which can also produce every kind
 * of malformed blob with a valid check. Decoders always get an exact-size
 * heap copy so ASan sees any over-read. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "wire/wire.h"

#define DESC_MAGIC 0x44595246u
#define EP_FIXED 62        /* head + endpoint fields up to and including uds_len */
#define REGION_EXTRA 32
#define CHECK_LEN 4

/* Every field of a blob, including ones a valid blob cannot have. */
typedef struct {
    uint32_t magic;
    uint16_t version, kind;
    uint64_t instance;
    uint8_t host[16];
    uint32_t pid, transports;
    uint16_t family, port;
    uint8_t addr[16];
    uint16_t uds_len;          /* as written in the length field */
    size_t uds_bytes;          /* bytes of uds actually present */
    uint8_t uds[300];
    uint64_t base, len, key;
    uint32_t flags, mem_kind;
    size_t extra;              /* junk bytes before the check */
} raw_desc;

static void le(uint8_t *p, uint64_t v, size_t k)
{
    for (size_t i = 0; i < k; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

static size_t build(const raw_desc *r, uint8_t *out)
{
    size_t o = 0;
    le(out + o, r->magic, 4); o += 4;
    le(out + o, r->version, 2); o += 2;
    le(out + o, r->kind, 2); o += 2;
    le(out + o, r->instance, 8); o += 8;
    memcpy(out + o, r->host, 16); o += 16;
    le(out + o, r->pid, 4); o += 4;
    le(out + o, r->transports, 4); o += 4;
    le(out + o, r->family, 2); o += 2;
    le(out + o, r->port, 2); o += 2;
    memcpy(out + o, r->addr, 16); o += 16;
    le(out + o, r->uds_len, 2); o += 2;
    memcpy(out + o, r->uds, r->uds_bytes); o += r->uds_bytes;
    if (r->kind == 2) {
        le(out + o, r->base, 8); o += 8;
        le(out + o, r->len, 8); o += 8;
        le(out + o, r->key, 8); o += 8;
        le(out + o, r->flags, 4); o += 4;
        le(out + o, r->mem_kind, 4); o += 4;
    }
    memset(out + o, 0x77, r->extra); o += r->extra;
    le(out + o, (uint32_t)XXH3_64bits(out, o), 4);
    return o + 4;
}

static void set_uds(raw_desc *r, const char *s)
{
    r->uds_len = (uint16_t)strlen(s);
    r->uds_bytes = strlen(s);
    memcpy(r->uds, s, strlen(s));
}

/* The raw form of sample_ep / sample_region below. */
static void raw_sample(raw_desc *r, uint16_t kind)
{
    memset(r, 0, sizeof *r);
    r->magic = DESC_MAGIC;
    r->version = 1;
    r->kind = kind;
    r->instance = 0x0123456789ABCDEFu;
    for (int i = 0; i < 16; i++) r->host[i] = (uint8_t)(0xF0 - i);
    r->pid = 31337;
    r->transports = FR_TRANSPORT_SHM | FR_TRANSPORT_TCP;
    r->family = 4;
    r->port = 40123;
    r->addr[0] = 127; r->addr[3] = 1;
    set_uds(r, "ferry-31337-0123456789abcdef");
    r->base = 0x7F0000000000u;
    r->len = 1u << 30;
    r->key = 0xC0FFEE00C0FFEE00u;
    r->flags = 0x3;
    r->mem_kind = 0;
}

static void sample_ep(fr_endpoint *ep)
{
    memset(ep, 0, sizeof *ep);
    ep->instance = 0x0123456789ABCDEFu;
    for (int i = 0; i < 16; i++) ep->host[i] = (uint8_t)(0xF0 - i);
    ep->pid = 31337;
    ep->transports = FR_TRANSPORT_SHM | FR_TRANSPORT_TCP;
    ep->family = 4;
    ep->port = 40123;
    ep->addr[0] = 127; ep->addr[3] = 1;
    strcpy(ep->uds, "ferry-31337-0123456789abcdef");
}

static void sample_region(fr_region_desc *rd)
{
    memset(rd, 0, sizeof *rd);
    sample_ep(&rd->ep);
    rd->base = 0x7F0000000000u;
    rd->len = 1u << 30;
    rd->key = 0xC0FFEE00C0FFEE00u;
    rd->flags = 0x3;
    rd->mem_kind = 0;
}

static int ep_decode(const uint8_t *in, size_t n, fr_endpoint *out)
{
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n)
        memcpy(copy, in, n);
    int rc = fr_endpoint_decode(copy, n, out);
    free(copy);
    return rc;
}

static int rd_decode(const uint8_t *in, size_t n, fr_region_desc *out)
{
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n)
        memcpy(copy, in, n);
    int rc = fr_region_desc_decode(copy, n, out);
    free(copy);
    return rc;
}

/* Decode a raw blob with the decoder of its nominal kind; a failure must
 * leave the output untouched. */
static int decode_raw(const raw_desc *r, uint16_t as_kind)
{
    uint8_t b[512];
    size_t n = build(r, b);
    fr_region_desc out, before;
    memset(&out, 0x5A, sizeof out);
    memcpy(&before, &out, sizeof out);
    int rc = as_kind == 1 ? ep_decode(b, n, &out.ep) : rd_decode(b, n, &out);
    if (rc < 0)
        assert_memory_equal(&out, &before, sizeof out);
    return rc;
}

/* ---- layout and round trips --------------------------------------------- */

static void test_ep_golden(void **state)
{
    (void)state;
    fr_endpoint ep;
    raw_desc r;
    uint8_t got[FR_DESC_MAX], want[512];
    sample_ep(&ep);
    raw_sample(&r, 1);
    size_t n = build(&r, want);
    assert_int_equal(n, EP_FIXED + strlen(ep.uds) + CHECK_LEN);
    assert_int_equal(fr_endpoint_encode(&ep, got, sizeof got), n);
    assert_memory_equal(got, want, n);
    assert_memory_equal(got, "FRYD", 4);
}

static void test_region_golden(void **state)
{
    (void)state;
    fr_region_desc rd;
    raw_desc r;
    uint8_t got[FR_DESC_MAX], want[512];
    sample_region(&rd);
    raw_sample(&r, 2);
    size_t n = build(&r, want);
    assert_int_equal(n, EP_FIXED + strlen(rd.ep.uds) + REGION_EXTRA + CHECK_LEN);
    assert_int_equal(fr_region_desc_encode(&rd, got, sizeof got), n);
    assert_memory_equal(got, want, n);
}

static void ep_round_trip(const fr_endpoint *ep)
{
    uint8_t b[FR_DESC_MAX];
    int n = fr_endpoint_encode(ep, b, sizeof b);
    assert_true(n > 0 && n <= FR_DESC_MAX);
    fr_endpoint out;
    memset(&out, 0xAA, sizeof out);
    assert_int_equal(ep_decode(b, (size_t)n, &out), 0);
    assert_memory_equal(&out, ep, sizeof out);
}

static void rd_round_trip(const fr_region_desc *rd)
{
    uint8_t b[FR_DESC_MAX];
    int n = fr_region_desc_encode(rd, b, sizeof b);
    assert_true(n > 0 && n <= FR_DESC_MAX);
    fr_region_desc out;
    memset(&out, 0xAA, sizeof out);
    assert_int_equal(rd_decode(b, (size_t)n, &out), 0);
    assert_memory_equal(&out, rd, sizeof out);
}

static void test_ep_round_trip(void **state)
{
    (void)state;
    fr_endpoint ep;
    sample_ep(&ep);
    ep_round_trip(&ep);
    memset(ep.uds, 0, sizeof ep.uds);            /* no unix socket */
    ep_round_trip(&ep);
    memset(ep.uds, 'x', FR_UDS_MAX);             /* longest name */
    ep_round_trip(&ep);
    ep.family = 6;
    for (int i = 0; i < 16; i++) ep.addr[i] = (uint8_t)(i * 17);
    ep.transports = FR_TRANSPORT_TCP;
    ep.instance = UINT64_MAX;
    ep.pid = UINT32_MAX;
    ep.port = UINT16_MAX;
    ep_round_trip(&ep);
    ep.transports = FR_TRANSPORT_SHM;
    ep.instance = 1;
    ep_round_trip(&ep);
}

static void test_region_round_trip(void **state)
{
    (void)state;
    fr_region_desc rd;
    sample_region(&rd);
    for (uint32_t flags = 0; flags <= 3; flags++) {
        for (uint32_t kind = 0; kind <= 1; kind++) {
            rd.flags = flags;
            rd.mem_kind = kind;
            rd_round_trip(&rd);
        }
    }
    rd.base = UINT64_MAX - 1;                    /* ends exactly at UINT64_MAX */
    rd.len = 1;
    rd_round_trip(&rd);
    rd.base = 0;
    rd.len = UINT64_MAX;
    rd.key = 0;
    rd_round_trip(&rd);
    memset(rd.ep.uds, 'y', FR_UDS_MAX);
    rd_round_trip(&rd);
}

static void test_max_size(void **state)
{
    (void)state;
    fr_region_desc rd;
    uint8_t b[FR_DESC_MAX];
    sample_region(&rd);
    memset(rd.ep.uds, 'z', FR_UDS_MAX);
    assert_int_equal(fr_region_desc_encode(&rd, b, sizeof b), EP_FIXED + FR_UDS_MAX + REGION_EXTRA + CHECK_LEN);
    assert_int_equal(fr_endpoint_encode(&rd.ep, b, sizeof b), EP_FIXED + FR_UDS_MAX + CHECK_LEN);
    assert_true(EP_FIXED + FR_UDS_MAX + REGION_EXTRA + CHECK_LEN <= FR_DESC_MAX);
}

/* The decoded name is always NUL-terminated and zero-padded. */
static void test_uds_terminated(void **state)
{
    (void)state;
    fr_endpoint ep, out;
    uint8_t b[FR_DESC_MAX];
    sample_ep(&ep);
    strcpy(ep.uds, "abc");
    int n = fr_endpoint_encode(&ep, b, sizeof b);
    assert_true(n > 0);
    memset(&out, 'Q', sizeof out);
    assert_int_equal(ep_decode(b, (size_t)n, &out), 0);
    assert_string_equal(out.uds, "abc");
    for (size_t i = 3; i < sizeof out.uds; i++)
        assert_int_equal(out.uds[i], 0);
}

/* ---- negative tests ----------------------------------------------------- */

static void test_truncated(void **state)
{
    (void)state;
    uint8_t b[FR_DESC_MAX];
    fr_endpoint ep;
    fr_region_desc rd;
    sample_region(&rd);
    int n = fr_endpoint_encode(&rd.ep, b, sizeof b);
    assert_true(n > 0);
    for (int k = 0; k < n; k++)
        assert_int_equal(ep_decode(b, (size_t)k, &ep), FERRY_EINVAL);
    n = fr_region_desc_encode(&rd, b, sizeof b);
    assert_true(n > 0);
    for (int k = 0; k < n; k++)
        assert_int_equal(rd_decode(b, (size_t)k, &rd), FERRY_EINVAL);
}

static void test_trailing(void **state)
{
    (void)state;
    raw_desc r;
    for (uint16_t kind = 1; kind <= 2; kind++) {
        raw_sample(&r, kind);
        assert_int_equal(decode_raw(&r, kind), 0);
        /* Junk between the fields and a check that covers it. */
        for (size_t extra = 1; extra <= 9; extra += 8) {
            r.extra = extra;
            assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        }
        /* Junk after a valid blob (the check no longer sits last). */
        uint8_t b[512];
        fr_region_desc out;
        r.extra = 0;
        size_t n = build(&r, b);
        b[n] = 0;
        int rc = kind == 1 ? ep_decode(b, n + 1, &out.ep) : rd_decode(b, n + 1, &out);
        assert_int_equal(rc, FERRY_EINVAL);
    }
}

static void test_oversized_input(void **state)
{
    (void)state;
    raw_desc r;
    raw_sample(&r, 1);
    /* A blob over FR_DESC_MAX is refused even with a valid check (the
     * decoder does not even hash it). */
    r.extra = FR_DESC_MAX;
    assert_int_equal(decode_raw(&r, 1), FERRY_EINVAL);
}

static void flip_all(const uint8_t *good, size_t n, uint16_t kind)
{
    static const uint8_t masks[] = { 1, 2, 4, 8, 16, 32, 64, 128, 0xFF };
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof masks; k++) {
            uint8_t b[FR_DESC_MAX];
            memcpy(b, good, n);
            b[i] ^= masks[k];
            fr_region_desc out;
            int rc = kind == 1 ? ep_decode(b, n, &out.ep) : rd_decode(b, n, &out);
            assert_int_equal(rc, FERRY_EINVAL);
        }
    }
}

static void test_flips(void **state)
{
    (void)state;
    fr_region_desc rd;
    uint8_t b[FR_DESC_MAX];
    sample_region(&rd);
    int n = fr_endpoint_encode(&rd.ep, b, sizeof b);
    assert_true(n > 0);
    flip_all(b, (size_t)n, 1);
    n = fr_region_desc_encode(&rd, b, sizeof b);
    assert_true(n > 0);
    flip_all(b, (size_t)n, 2);
}

static void test_bad_head(void **state)
{
    (void)state;
    raw_desc r;
    for (uint16_t kind = 1; kind <= 2; kind++) {
        raw_sample(&r, kind);
        r.magic = 0x31595246u;                   /* a frame's "FRY1" */
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        raw_sample(&r, kind);
        r.version = 0;
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        r.version = 2;
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        raw_sample(&r, kind);
        r.kind = 0;
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        r.kind = 3;
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
    }
    /* Each decoder takes its own kind only. */
    raw_sample(&r, 2);
    assert_int_equal(decode_raw(&r, 1), FERRY_EINVAL);
    raw_sample(&r, 1);
    assert_int_equal(decode_raw(&r, 2), FERRY_EINVAL);
}

/* Each endpoint rule, on both sides: the decoder refuses a raw blob that
 * breaks it, the encoder refuses a struct that does. */
static void check_ep_rule(void (*breakit)(raw_desc *r, fr_endpoint *ep), bool enc_side)
{
    for (uint16_t kind = 1; kind <= 2; kind++) {
        raw_desc r;
        fr_region_desc rd;
        uint8_t b[FR_DESC_MAX];
        raw_sample(&r, kind);
        sample_region(&rd);
        breakit(&r, &rd.ep);
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        if (!enc_side)
            continue;
        if (kind == 1)
            assert_int_equal(fr_endpoint_encode(&rd.ep, b, sizeof b), FERRY_EINVAL);
        else
            assert_int_equal(fr_region_desc_encode(&rd, b, sizeof b), FERRY_EINVAL);
    }
}

static void fam0(raw_desc *r, fr_endpoint *ep) { r->family = 0; ep->family = 0; }
static void fam5(raw_desc *r, fr_endpoint *ep) { r->family = 5; ep->family = 5; }
static void fam10(raw_desc *r, fr_endpoint *ep) { r->family = 10; ep->family = 10; }
static void inst0(raw_desc *r, fr_endpoint *ep) { r->instance = 0; ep->instance = 0; }
static void tr_none(raw_desc *r, fr_endpoint *ep) { r->transports = 0; ep->transports = 0; }
static void tr_bit2(raw_desc *r, fr_endpoint *ep) { r->transports = 4; ep->transports = 4; }
static void tr_extra(raw_desc *r, fr_endpoint *ep) { r->transports = 0x80000003u; ep->transports = 0x80000003u; }

static void uds_long(raw_desc *r, fr_endpoint *ep)
{
    memset(r->uds, 'a', FR_UDS_MAX + 1);
    r->uds_len = FR_UDS_MAX + 1;
    r->uds_bytes = FR_UDS_MAX + 1;
    memset(ep->uds, 'a', sizeof ep->uds);        /* no terminator anywhere */
}

/* A C string cannot hold a NUL inside, so these break the blob only. */
static void uds_nul_first(raw_desc *r, fr_endpoint *ep) { (void)ep; r->uds[0] = 0; }
static void uds_nul_last(raw_desc *r, fr_endpoint *ep) { (void)ep; r->uds[r->uds_bytes - 1] = 0; }

static void test_ep_rules(void **state)
{
    (void)state;
    check_ep_rule(fam0, true);
    check_ep_rule(fam5, true);
    check_ep_rule(fam10, true);
    check_ep_rule(inst0, true);
    check_ep_rule(tr_none, true);
    check_ep_rule(tr_bit2, true);
    check_ep_rule(tr_extra, true);
    check_ep_rule(uds_long, true);
    check_ep_rule(uds_nul_first, false);
    check_ep_rule(uds_nul_last, false);
}

/* A length field that runs past the blob or claims more than FR_UDS_MAX. */
static void test_uds_length_field(void **state)
{
    (void)state;
    raw_desc r;
    for (uint16_t kind = 1; kind <= 2; kind++) {
        raw_sample(&r, kind);
        r.uds_len = (uint16_t)(r.uds_bytes + 1);
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        r.uds_len = (uint16_t)(r.uds_bytes - 1);
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        r.uds_len = UINT16_MAX;
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        /* Longer than FR_UDS_MAX yet short enough to stay under
         * FR_DESC_MAX: only the name limit stops it (ASan would see the
         * overflow of fr_endpoint.uds). */
        memset(r.uds, 'b', 180);
        r.uds_len = 180;
        r.uds_bytes = 180;
        assert_int_equal(decode_raw(&r, kind), FERRY_EINVAL);
        r.uds_len = 0;
        r.uds_bytes = 0;
        assert_int_equal(decode_raw(&r, kind), 0);
    }
}

static void check_region_rule(uint64_t base, uint64_t len, uint32_t flags, uint32_t mem_kind)
{
    raw_desc r;
    fr_region_desc rd;
    uint8_t b[FR_DESC_MAX];
    raw_sample(&r, 2);
    r.base = base; r.len = len; r.flags = flags; r.mem_kind = mem_kind;
    assert_int_equal(decode_raw(&r, 2), FERRY_EINVAL);
    sample_region(&rd);
    rd.base = base; rd.len = len; rd.flags = flags; rd.mem_kind = mem_kind;
    assert_int_equal(fr_region_desc_encode(&rd, b, sizeof b), FERRY_EINVAL);
}

static void test_region_rules(void **state)
{
    (void)state;
    check_region_rule(4096, 0, 3, 0);
    check_region_rule(UINT64_MAX, 1, 3, 0);
    check_region_rule(2, UINT64_MAX - 1, 3, 0);
    check_region_rule(4096, 4096, 4, 0);
    check_region_rule(4096, 4096, 0x80000001u, 0);
    check_region_rule(4096, 4096, 3, 2);
    check_region_rule(4096, 4096, 3, UINT32_MAX);
}

static void test_encode_cap(void **state)
{
    (void)state;
    fr_region_desc rd;
    sample_region(&rd);
    for (int kind = 1; kind <= 2; kind++) {
        uint8_t full[FR_DESC_MAX];
        int need = kind == 1 ? fr_endpoint_encode(&rd.ep, full, sizeof full)
                             : fr_region_desc_encode(&rd, full, sizeof full);
        assert_true(need > 0);
        for (int cap = 0; cap < need; cap++) {
            uint8_t b[FR_DESC_MAX + 8];
            memset(b, 0xA5, sizeof b);
            int rc = kind == 1 ? fr_endpoint_encode(&rd.ep, b, (size_t)cap)
                               : fr_region_desc_encode(&rd, b, (size_t)cap);
            assert_int_equal(rc, FERRY_EMSGSIZE);
            for (size_t i = (size_t)cap; i < sizeof b; i++)
                assert_int_equal(b[i], 0xA5);       /* nothing past cap */
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep_golden),
        cmocka_unit_test(test_region_golden),
        cmocka_unit_test(test_ep_round_trip),
        cmocka_unit_test(test_region_round_trip),
        cmocka_unit_test(test_max_size),
        cmocka_unit_test(test_uds_terminated),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_trailing),
        cmocka_unit_test(test_oversized_input),
        cmocka_unit_test(test_flips),
        cmocka_unit_test(test_bad_head),
        cmocka_unit_test(test_ep_rules),
        cmocka_unit_test(test_uds_length_field),
        cmocka_unit_test(test_region_rules),
        cmocka_unit_test(test_encode_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
