/* Store protocol codecs: every message round-trips; the byte layout is
 * pinned by hand-built bodies; truncation at every length, trailing bytes,
 * bad counts, oversized fields, broken field rules and unknown types are
 * refused. Decoders always get an exact-size heap copy so ASan sees any
 * over-read. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "wire/store_msg.h"

#define BUF_MAX 4096

static const uint16_t all_types[] = {
    FR_SMSG_MOUNT, FR_SMSG_UNMOUNT, FR_SMSG_PUT_START, FR_SMSG_PUT_END, FR_SMSG_PUT_REVOKE,
    FR_SMSG_GET_REPLICAS, FR_SMSG_REMOVE, FR_SMSG_REMOVE_PREFIX, FR_SMSG_EXIST, FR_SMSG_LIST,
    FR_SMSG_KV_GET, FR_SMSG_KV_PUT, FR_SMSG_KV_CAS, FR_SMSG_KV_DELETE, FR_SMSG_WATCH,
    FR_SMSG_BARRIER, FR_SMSG_Q_PUSH, FR_SMSG_Q_POP, FR_SMSG_Q_ACK, FR_SMSG_Q_NACK,
    FR_SMSG_HEARTBEAT, FR_SMSG_SEGMENT, FR_SMSG_STATUS, FR_SMSG_UNWATCH, FR_SMSG_Q_CONFIG, FR_SMSG_OK,
    FR_SMSG_PLACEMENT, FR_SMSG_REPLICAS, FR_SMSG_REMOVED, FR_SMSG_EXISTS, FR_SMSG_KEYS,
    FR_SMSG_KV_VALUE, FR_SMSG_REVISION, FR_SMSG_EVENTS, FR_SMSG_BARRIER_DONE, FR_SMSG_RECORDS,
    FR_SMSG_PUSHED, FR_SMSG_SEGMENT_DESC, FR_SMSG_STATUS_TEXT, FR_SMSG_ERROR,
};
#define NTYPES (sizeof all_types / sizeof all_types[0])

static fr_sbytes S(const char *s)
{
    return (fr_sbytes){ (const uint8_t *)s, (uint32_t)strlen(s) };
}

static const uint64_t pref_ids[] = { 7, 0x0102030405060708ull, UINT64_MAX };
static fr_smsg_item items_keys[] = { { .key = { (const uint8_t *)"a/1", 3 } },
                                     { .key = { (const uint8_t *)"a/2", 3 } } };
static fr_smsg_item items_events[] = {
    { .key = { (const uint8_t *)"k", 1 }, .val = { (const uint8_t *)"v1", 2 }, .id = 9 },
    { .key = { (const uint8_t *)"k", 1 }, .id = 10, .deleted = true },
};
static fr_smsg_item items_recs[] = {
    { .val = { (const uint8_t *)"rec", 3 }, .id = 100, .deliveries = 1 },
    { .val = { NULL, 0 }, .id = 101, .deliveries = 3 },
    { .val = { (const uint8_t *)"x", 1 }, .id = UINT64_MAX, .deliveries = UINT32_MAX },
};

/* A valid message of every type, every field of the type set. */
static void sample(uint16_t type, fr_smsg *m)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    switch (type) {
    case FR_SMSG_MOUNT:
        m->segment = 3; m->node = 4; m->size = 1ull << 40; m->granule = 64;
        m->val = S("region-descriptor-blob");
        break;
    case FR_SMSG_UNMOUNT: m->segment = 3; break;
    case FR_SMSG_PUT_START:
        m->key = S("weights/gen7/shard0"); m->size = 4u << 20; m->replica_num = 2; m->flag = true;
        m->preferred = pref_ids; m->npreferred = 3; m->slot = 0x1122334455667788ull;
        break;
    case FR_SMSG_PUT_END: case FR_SMSG_PUT_REVOKE: case FR_SMSG_REMOVE: case FR_SMSG_EXIST:
    case FR_SMSG_KV_GET:
        m->key = S("obj"); break;
    case FR_SMSG_GET_REPLICAS: m->key = S("obj"); m->lease_ms = 5000; break;
    case FR_SMSG_REMOVE_PREFIX: m->key = S("weights/"); break;
    case FR_SMSG_LIST: m->key = S("a/"); m->key2 = S("a/0"); m->limit = 100; break;
    case FR_SMSG_KV_PUT: m->key = S("cfg"); m->val = S("value bytes"); break;
    case FR_SMSG_KV_CAS: m->key = S("cfg"); m->rev = 12; m->val = S("v2"); break;
    case FR_SMSG_KV_DELETE: m->key = S("cfg"); m->rev = 13; break;
    case FR_SMSG_WATCH: m->key = S(""); m->rev = 1; break;
    case FR_SMSG_BARRIER:
        m->key = S("step-5"); m->key2 = S("rank-3"); m->members = 8; m->timeout_ms = 30000;
        break;
    case FR_SMSG_Q_PUSH: m->key = S("rollouts"); m->val = S("sample"); break;
    case FR_SMSG_Q_POP: m->key = S("rollouts"); m->limit = 16; m->lease_ms = 60000; break;
    case FR_SMSG_Q_ACK: case FR_SMSG_Q_NACK: m->id = 100; m->deliveries = 2; break;
    case FR_SMSG_HEARTBEAT: m->node = 4; break;
    case FR_SMSG_SEGMENT: m->segment = 9; break;
    case FR_SMSG_STATUS: break;
    case FR_SMSG_UNWATCH: m->id = 77; break;
    case FR_SMSG_Q_CONFIG: m->key = S("rollouts"); m->size = 1024; break;
    case FR_SMSG_OK: break;
    case FR_SMSG_REPLICAS: m->until = 123456789;   /* fall through */
    case FR_SMSG_PLACEMENT:
        m->size = 4096; m->nrep = 2;
        m->rep[0] = (fr_smsg_replica){ 3, 4, 0, 4096, true };
        m->rep[1] = (fr_smsg_replica){ 5, 6, 8192, 4096, false };
        break;
    case FR_SMSG_REMOVED: m->count = 10; m->skipped_leased = 2; m->skipped_pending = 1; break;
    case FR_SMSG_EXISTS: m->flag = true; break;
    case FR_SMSG_KEYS: m->flag = true; m->items = items_keys; m->nitems = 2; break;
    case FR_SMSG_KV_VALUE: m->rev = 5; m->create_rev = 2; m->version = 3; m->val = S("val"); break;
    case FR_SMSG_REVISION: m->rev = 14; break;
    case FR_SMSG_EVENTS: m->rev = 11; m->items = items_events; m->nitems = 2; break;
    case FR_SMSG_BARRIER_DONE: m->generation = 6; break;
    case FR_SMSG_RECORDS: m->items = items_recs; m->nitems = 3; break;
    case FR_SMSG_PUSHED: m->id = 102; break;
    case FR_SMSG_SEGMENT_DESC: m->segment = 9; m->node = 3; m->size = 1 << 20; m->val = S("desc"); break;
    case FR_SMSG_STATUS_TEXT: m->val = S("{\"segments\": []}"); break;
    case FR_SMSG_ERROR: m->status = FERRY_ESTATE; m->rev = 13; m->val = S("conflict at rev 13"); break;
    default: fail_msg("no sample for type %u", type);
    }
}

/* Decode a body from an exact-size heap copy. */
static int decode_body(uint16_t type, const uint8_t *body, size_t len, fr_smsg *out)
{
    uint8_t *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    if (len)
        memcpy(copy, body, len);
    fr_frame_hdr h = { type, 1, (uint32_t)len };
    int rc = fr_smsg_decode(&h, copy, len, out);
    free(copy);
    return rc;
}

static bool same_bytes(fr_sbytes a, fr_sbytes b)
{
    return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static void assert_same(const fr_smsg *a, const fr_smsg *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->status, b->status);
    assert_true(same_bytes(a->key, b->key));
    assert_true(same_bytes(a->key2, b->key2));
    assert_true(same_bytes(a->val, b->val));
    const uint64_t *qa[] = { &a->segment, &a->node, &a->size, &a->granule, &a->lease_ms,
                             &a->timeout_ms, &a->until, &a->rev, &a->create_rev, &a->version,
                             &a->id, &a->count, &a->skipped_leased, &a->skipped_pending,
                             &a->generation, &a->slot };
    const uint64_t *qb[] = { &b->segment, &b->node, &b->size, &b->granule, &b->lease_ms,
                             &b->timeout_ms, &b->until, &b->rev, &b->create_rev, &b->version,
                             &b->id, &b->count, &b->skipped_leased, &b->skipped_pending,
                             &b->generation, &b->slot };
    for (size_t i = 0; i < sizeof qa / sizeof qa[0]; i++)
        if (*qa[i] != *qb[i])
            fail_msg("type %u field %zu", a->type, i);
    assert_int_equal(a->replica_num, b->replica_num);
    assert_int_equal(a->limit, b->limit);
    assert_int_equal(a->members, b->members);
    assert_int_equal(a->deliveries, b->deliveries);
    assert_int_equal(a->flag, b->flag);
    assert_int_equal(a->npreferred, b->npreferred);
    for (uint32_t i = 0; i < a->npreferred; i++)
        assert_true(fr_smsg_preferred(a, i) == fr_smsg_preferred(b, i));
    assert_int_equal(a->nrep, b->nrep);
    assert_memory_equal(a->rep, b->rep, sizeof a->rep[0] * a->nrep);
    assert_int_equal(a->nitems, b->nitems);
    size_t pa = 0, pb = 0;
    fr_smsg_item ia, ib;
    uint32_t k = 0;
    while (fr_smsg_item_next(a, &pa, &ia)) {
        assert_true(fr_smsg_item_next(b, &pb, &ib));
        assert_true(same_bytes(ia.key, ib.key));
        assert_true(same_bytes(ia.val, ib.val));
        assert_true(ia.id == ib.id);
        assert_int_equal(ia.deliveries, ib.deliveries);
        assert_int_equal(ia.deleted, ib.deleted);
        k++;
    }
    assert_false(fr_smsg_item_next(b, &pb, &ib));
    assert_int_equal(k, a->nitems);
}

/* Encode the sample of type into buf; returns the frame length. */
static size_t encode_sample(uint16_t type, fr_smsg *m, uint8_t *buf)
{
    sample(type, m);
    int k = fr_smsg_encode(m, 0xabcdef, buf, BUF_MAX);
    assert_true(k >= FR_WIRE_HDR_LEN);
    return (size_t)k;
}

static void test_round_trip(void **state)
{
    (void)state;
    uint8_t buf[BUF_MAX], buf2[BUF_MAX];
    for (size_t t = 0; t < NTYPES; t++) {
        fr_smsg m, d;
        size_t k = encode_sample(all_types[t], &m, buf);
        size_t body;
        assert_int_equal(fr_smsg_body_len(&m, &body), 0);
        assert_int_equal(k, FR_WIRE_HDR_LEN + body);
        fr_frame_hdr h;
        assert_int_equal(fr_wire_hdr_decode(buf, k, &h), 0);
        assert_int_equal(h.type, all_types[t]);
        assert_true(h.req_id == 0xabcdef);
        assert_int_equal(h.len, body);
        assert_int_equal(fr_smsg_decode(&h, buf + FR_WIRE_HDR_LEN, body, &d), 0);
        assert_same(&m, &d);
        /* The decoded (borrowed, raw-list) form re-encodes to the same bytes. */
        assert_int_equal(fr_smsg_encode(&d, 0xabcdef, buf2, sizeof buf2), (int)k);
        assert_memory_equal(buf, buf2, k);
        assert_non_null(fr_smsg_type_name(all_types[t]));
        assert_int_equal(fr_smsg_is_request(all_types[t]), all_types[t] < FR_SMSG_OK);
        /* The engine's decoder refuses store frames. */
        fr_msg em;
        assert_int_equal(fr_wire_decode(&h, buf + FR_WIRE_HDR_LEN, body, &em), FERRY_EPROTO);
    }
}

/* The layout, pinned with hand-built bytes. */
static void test_pinned_bytes(void **state)
{
    (void)state;
    uint8_t buf[BUF_MAX];
    fr_smsg m;
    size_t k = encode_sample(FR_SMSG_PUT_START, &m, buf);
    static const uint8_t want[] = {
        19, 0, 'w', 'e', 'i', 'g', 'h', 't', 's', '/', 'g', 'e', 'n', '7', '/', 's', 'h', 'a',
        'r', 'd', '0',
        0, 0, 0x40, 0, 0, 0, 0, 0,        /* size 4 MiB */
        2, 0, 0, 0,                       /* replica_num */
        1,                                /* hard pin */
        3, 0,                             /* preferred count */
        7, 0, 0, 0, 0, 0, 0, 0,
        8, 7, 6, 5, 4, 3, 2, 1,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,   /* placement slot */
    };
    assert_int_equal(k, FR_WIRE_HDR_LEN + sizeof want);
    assert_memory_equal(buf + FR_WIRE_HDR_LEN, want, sizeof want);

    k = encode_sample(FR_SMSG_RECORDS, &m, buf);
    static const uint8_t want_recs[] = {
        3, 0, 0, 0,
        100, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 'r', 'e', 'c',
        101, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 'x',
    };
    assert_int_equal(k, FR_WIRE_HDR_LEN + sizeof want_recs);
    assert_memory_equal(buf + FR_WIRE_HDR_LEN, want_recs, sizeof want_recs);

    k = encode_sample(FR_SMSG_ERROR, &m, buf);
    assert_int_equal(buf[FR_WIRE_HDR_LEN], (uint8_t)(FERRY_ESTATE & 0xff));
    assert_int_equal(buf[FR_WIRE_HDR_LEN + 3], 0xff);
    assert_int_equal(buf[FR_WIRE_HDR_LEN + 12], 18);   /* text length */
}

/* Every proper prefix of every body is refused, and so is a body shorter
 * than the header says or with a trailing byte. */
static void test_truncation(void **state)
{
    (void)state;
    uint8_t buf[BUF_MAX];
    for (size_t t = 0; t < NTYPES; t++) {
        fr_smsg m, d;
        size_t k = encode_sample(all_types[t], &m, buf);
        size_t body = k - FR_WIRE_HDR_LEN;
        for (size_t len = 0; len < body; len++)
            assert_int_equal(decode_body(all_types[t], buf + FR_WIRE_HDR_LEN, len, &d), FERRY_EPROTO);
        fr_frame_hdr h = { all_types[t], 1, (uint32_t)body };
        if (body > 0)
            assert_int_equal(fr_smsg_decode(&h, buf + FR_WIRE_HDR_LEN, body - 1, &d), FERRY_EPROTO);
        buf[k] = 0;
        assert_int_equal(decode_body(all_types[t], buf + FR_WIRE_HDR_LEN, body + 1, &d), FERRY_EPROTO);
    }
}

/* A changed byte either fails to decode or decodes to something that
 * re-encodes to exactly the changed bytes; a failed decode leaves its
 * output alone. */
static void test_byte_flips(void **state)
{
    (void)state;
    uint8_t buf[BUF_MAX], buf2[BUF_MAX];
    static const uint8_t vals[] = { 0x00, 0x01, 0x02, 0x7f, 0x80, 0xff };
    for (size_t t = 0; t < NTYPES; t++) {
        fr_smsg m, d;
        size_t k = encode_sample(all_types[t], &m, buf);
        size_t body = k - FR_WIRE_HDR_LEN;
        for (size_t i = 0; i < body; i++) {
            uint8_t keep = buf[FR_WIRE_HDR_LEN + i];
            for (size_t v = 0; v < sizeof vals; v++) {
                buf[FR_WIRE_HDR_LEN + i] = vals[v];
                memset(&d, 0x5a, sizeof d);
                int rc = decode_body(all_types[t], buf + FR_WIRE_HDR_LEN, body, &d);
                if (rc < 0) {
                    assert_true(rc == FERRY_EPROTO || rc == FERRY_EMSGSIZE);
                    uint8_t junk[sizeof d];
                    memset(junk, 0x5a, sizeof junk);
                    assert_memory_equal(&d, junk, sizeof d);
                    continue;
                }
                /* d borrows from a freed copy: decode in place to re-encode. */
                fr_frame_hdr h = { all_types[t], 0xabcdef, (uint32_t)body };
                assert_int_equal(fr_smsg_decode(&h, buf + FR_WIRE_HDR_LEN, body, &d), 0);
                assert_int_equal(fr_smsg_encode(&d, 0xabcdef, buf2, sizeof buf2), (int)k);
                assert_memory_equal(buf + FR_WIRE_HDR_LEN, buf2 + FR_WIRE_HDR_LEN, body);
            }
            buf[FR_WIRE_HDR_LEN + i] = keep;
        }
    }
}

static void le(uint8_t *p, uint64_t v, size_t k)
{
    for (size_t i = 0; i < k; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

/* Counts beyond their cap are EMSGSIZE; counts the bytes cannot hold are
 * EPROTO, checked before any entry is walked. */
static void test_bad_counts(void **state)
{
    (void)state;
    uint8_t b[64];
    fr_smsg d;
    /* KEYS: flag, u32 count */
    memset(b, 0, sizeof b);
    b[0] = 1;
    le(b + 1, UINT32_MAX, 4);
    assert_int_equal(decode_body(FR_SMSG_KEYS, b, 5, &d), FERRY_EMSGSIZE);
    le(b + 1, FR_SMSG_LIST_MAX + 1, 4);
    assert_int_equal(decode_body(FR_SMSG_KEYS, b, 5, &d), FERRY_EMSGSIZE);
    le(b + 1, FR_SMSG_LIST_MAX, 4);
    assert_int_equal(decode_body(FR_SMSG_KEYS, b, 5, &d), FERRY_EPROTO);
    le(b + 1, 2, 4);   /* one key "a" only */
    le(b + 5, 1, 2);
    b[7] = 'a';
    assert_int_equal(decode_body(FR_SMSG_KEYS, b, 8, &d), FERRY_EPROTO);
    le(b + 1, 1, 4);
    assert_int_equal(decode_body(FR_SMSG_KEYS, b, 8, &d), 0);
    assert_int_equal(d.nitems, 1);
    /* RECORDS: cap is FR_SMSG_POP_MAX */
    memset(b, 0, sizeof b);
    le(b, FR_SMSG_POP_MAX + 1, 4);
    assert_int_equal(decode_body(FR_SMSG_RECORDS, b, 4, &d), FERRY_EMSGSIZE);
    le(b, 3, 4);
    assert_int_equal(decode_body(FR_SMSG_RECORDS, b, 4 + 2 * 16, &d), FERRY_EPROTO);
    le(b, 2, 4);
    assert_int_equal(decode_body(FR_SMSG_RECORDS, b, 4 + 2 * 16, &d), 0);
    /* EVENTS: rev, count */
    memset(b, 0, sizeof b);
    le(b + 8, FR_SMSG_LIST_MAX + 1, 4);
    assert_int_equal(decode_body(FR_SMSG_EVENTS, b, 12, &d), FERRY_EMSGSIZE);
    le(b + 8, 1, 4);
    assert_int_equal(decode_body(FR_SMSG_EVENTS, b, 12, &d), FERRY_EPROTO);
    /* PLACEMENT: size, u8 replicas */
    memset(b, 0, sizeof b);
    b[8] = FR_SMSG_REPLICAS_MAX + 1;
    assert_int_equal(decode_body(FR_SMSG_PLACEMENT, b, 9, &d), FERRY_EMSGSIZE);
    b[8] = 1;
    assert_int_equal(decode_body(FR_SMSG_PLACEMENT, b, 9 + 32, &d), FERRY_EPROTO);
    assert_int_equal(decode_body(FR_SMSG_PLACEMENT, b, 9 + 33, &d), 0);
    b[9 + 32] = 2;   /* preferred flag */
    assert_int_equal(decode_body(FR_SMSG_PLACEMENT, b, 9 + 33, &d), FERRY_EPROTO);
    /* PUT_START: key "k", size, replica_num, flag, u16 preferred, u64 slot */
    memset(b, 0, sizeof b);
    le(b, 1, 2);
    b[2] = 'k';
    le(b + 16, FR_SMSG_PREFERRED_MAX + 1, 2);
    assert_int_equal(decode_body(FR_SMSG_PUT_START, b, 18, &d), FERRY_EMSGSIZE);
    le(b + 16, 1, 2);
    assert_int_equal(decode_body(FR_SMSG_PUT_START, b, 18 + 7, &d), FERRY_EPROTO);
    assert_int_equal(decode_body(FR_SMSG_PUT_START, b, 18 + 8, &d), FERRY_EPROTO);   /* no slot */
    assert_int_equal(decode_body(FR_SMSG_PUT_START, b, 18 + 8 + 7, &d), FERRY_EPROTO);
    assert_int_equal(decode_body(FR_SMSG_PUT_START, b, 18 + 8 + 8, &d), 0);
    le(b + 11, FR_SMSG_REPLICAS_MAX + 1, 4);
    assert_int_equal(decode_body(FR_SMSG_PUT_START, b, 18 + 8 + 8, &d), FERRY_EMSGSIZE);

    /* The encoder applies the same caps. */
    uint8_t out[BUF_MAX];
    fr_smsg m;
    sample(FR_SMSG_KEYS, &m);
    m.nitems = FR_SMSG_LIST_MAX + 1;
    assert_int_equal(fr_smsg_encode(&m, 1, out, sizeof out), FERRY_EMSGSIZE);
    sample(FR_SMSG_PUT_START, &m);
    m.npreferred = FR_SMSG_PREFERRED_MAX + 1;
    assert_int_equal(fr_smsg_encode(&m, 1, out, sizeof out), FERRY_EMSGSIZE);
    sample(FR_SMSG_PLACEMENT, &m);
    m.nrep = FR_SMSG_REPLICAS_MAX + 1;
    assert_int_equal(fr_smsg_encode(&m, 1, out, sizeof out), FERRY_EMSGSIZE);
    sample(FR_SMSG_RECORDS, &m);
    m.items = NULL;   /* a count without entries */
    assert_int_equal(fr_smsg_encode(&m, 1, out, sizeof out), FERRY_EINVAL);
    m.nitems = 0;
    m.items_len = 5;  /* a raw length without bytes */
    assert_int_equal(fr_smsg_encode(&m, 1, out, sizeof out), FERRY_EINVAL);
}

/* Length prefixes above a field's hard limit: EMSGSIZE before the bytes are
 * looked for, on both sides. */
static void test_oversize_fields(void **state)
{
    (void)state;
    uint8_t b[16];
    fr_smsg d, m;
    memset(b, 0, sizeof b);
    le(b, FR_SMSG_KEY_MAX + 1, 2);
    assert_int_equal(decode_body(FR_SMSG_KV_GET, b, 2, &d), FERRY_EMSGSIZE);
    le(b, FR_SMSG_KEY_MAX, 2);
    assert_int_equal(decode_body(FR_SMSG_KV_GET, b, 2, &d), FERRY_EPROTO);
    /* KV_PUT: key "k", u32 value length */
    le(b, 1, 2);
    b[2] = 'k';
    le(b + 3, FR_SMSG_VALUE_MAX + 1, 4);
    assert_int_equal(decode_body(FR_SMSG_KV_PUT, b, 7, &d), FERRY_EMSGSIZE);
    le(b + 3, UINT32_MAX, 4);
    assert_int_equal(decode_body(FR_SMSG_Q_PUSH, b, 7, &d), FERRY_EMSGSIZE);
    le(b + 3, FR_SMSG_VALUE_MAX, 4);
    assert_int_equal(decode_body(FR_SMSG_KV_PUT, b, 7, &d), FERRY_EPROTO);
    /* MOUNT descriptor */
    uint8_t mb[4 * 8 + 2];
    memset(mb, 0, sizeof mb);
    le(mb + 32, FR_SMSG_DESC_MAX + 1, 2);
    assert_int_equal(decode_body(FR_SMSG_MOUNT, mb, sizeof mb, &d), FERRY_EMSGSIZE);
    /* ERROR text: status, rev, u16 text */
    uint8_t eb[14];
    memset(eb, 0, sizeof eb);
    le(eb, (uint32_t)FERRY_EIO, 4);
    le(eb + 12, FR_SMSG_TEXT_MAX + 1, 2);
    assert_int_equal(decode_body(FR_SMSG_ERROR, eb, sizeof eb, &d), FERRY_EMSGSIZE);

    static uint8_t big[FR_SMSG_KEY_MAX + 1];
    memset(big, 'k', sizeof big);
    uint8_t *out = malloc(2 * FR_SMSG_KEY_MAX + 1024);
    assert_non_null(out);
    sample(FR_SMSG_KV_GET, &m);
    m.key = (fr_sbytes){ big, FR_SMSG_KEY_MAX };
    assert_true(fr_smsg_encode(&m, 1, out, 2 * FR_SMSG_KEY_MAX + 1024) > 0);
    m.key.n = FR_SMSG_KEY_MAX + 1;
    assert_int_equal(fr_smsg_encode(&m, 1, out, 2 * FR_SMSG_KEY_MAX + 1024), FERRY_EMSGSIZE);
    sample(FR_SMSG_MOUNT, &m);
    m.val = (fr_sbytes){ big, FR_SMSG_DESC_MAX + 1 };
    assert_int_equal(fr_smsg_encode(&m, 1, out, 2 * FR_SMSG_KEY_MAX + 1024), FERRY_EMSGSIZE);
    sample(FR_SMSG_ERROR, &m);
    m.val = (fr_sbytes){ big, FR_SMSG_TEXT_MAX + 1 };
    assert_int_equal(fr_smsg_encode(&m, 1, out, 2 * FR_SMSG_KEY_MAX + 1024), FERRY_EMSGSIZE);
    sample(FR_SMSG_KV_PUT, &m);
    m.val = (fr_sbytes){ big, FR_SMSG_VALUE_MAX + 1 };   /* checked before it is read */
    assert_int_equal(fr_smsg_encode(&m, 1, out, 2 * FR_SMSG_KEY_MAX + 1024), FERRY_EMSGSIZE);
    free(out);
}

/* Field rules beyond lengths. */
static void test_field_rules(void **state)
{
    (void)state;
    uint8_t out[BUF_MAX];
    fr_smsg m;
    size_t pos = 0;
    fr_smsg_item it;
#define BAD(type, stmt, code) do { sample(type, &m); stmt; \
        assert_int_equal(fr_smsg_encode(&m, 1, out, sizeof out), code); } while (0)
    BAD(FR_SMSG_PUT_END, m.key = S(""), FERRY_EINVAL);
    BAD(FR_SMSG_PUT_END, m.key = ((fr_sbytes){ (const uint8_t *)"a\0b", 3 }), FERRY_EINVAL);
    BAD(FR_SMSG_BARRIER, m.key2 = S(""), FERRY_EINVAL);
    BAD(FR_SMSG_BARRIER, m.members = 0, FERRY_EINVAL);
    BAD(FR_SMSG_BARRIER, m.members = FR_SMSG_BARRIER_MAX + 1, FERRY_EMSGSIZE);
    BAD(FR_SMSG_LIST, m.limit = 0, FERRY_EINVAL);
    BAD(FR_SMSG_Q_POP, m.limit = 0, FERRY_EINVAL);
    BAD(FR_SMSG_Q_POP, m.limit = FR_SMSG_POP_MAX + 1, FERRY_EMSGSIZE);
    BAD(FR_SMSG_MOUNT, m.val = S(""), FERRY_EINVAL);
    BAD(FR_SMSG_ERROR, m.status = 0, FERRY_EINVAL);
    BAD(FR_SMSG_ERROR, m.status = 5, FERRY_EINVAL);
    BAD(FR_SMSG_ERROR, m.status = -(FERRY_EBASE + 1001), FERRY_EINVAL);
    BAD(FR_SMSG_ERROR, m.val = ((fr_sbytes){ (const uint8_t *)"x\0", 2 }), FERRY_EINVAL);
    BAD(FR_SMSG_PUT_START, m.preferred = NULL, FERRY_EINVAL);
    static fr_smsg_item bad_ev[] = { { .key = { (const uint8_t *)"k", 1 },
                                       .val = { (const uint8_t *)"v", 1 }, .deleted = true } };
    BAD(FR_SMSG_EVENTS, (m.items = bad_ev, m.nitems = 1), FERRY_EINVAL);
    static fr_smsg_item bad_key[] = { { .key = { NULL, 0 } } };
    BAD(FR_SMSG_KEYS, (m.items = bad_key, m.nitems = 1), FERRY_EINVAL);
#undef BAD
    /* Prefixes and "after" may be empty; a text may be empty. */
    sample(FR_SMSG_LIST, &m);
    m.key = S("");
    m.key2 = S("");
    assert_true(fr_smsg_encode(&m, 1, out, sizeof out) > 0);
    sample(FR_SMSG_ERROR, &m);
    m.val = S("");
    assert_true(fr_smsg_encode(&m, 1, out, sizeof out) > 0);

    /* Decode side: empty key, NUL in a key, flag 2, status 0, limit 0. */
    fr_smsg d;
    uint8_t b[16] = { 0 };
    assert_int_equal(decode_body(FR_SMSG_EXIST, b, 2, &d), FERRY_EPROTO);
    le(b, 2, 2);
    b[2] = 'a';
    b[3] = 0;
    assert_int_equal(decode_body(FR_SMSG_EXIST, b, 4, &d), FERRY_EPROTO);
    b[0] = 2;
    assert_int_equal(decode_body(FR_SMSG_EXISTS, b, 1, &d), FERRY_EPROTO);
    b[0] = 1;
    assert_int_equal(decode_body(FR_SMSG_EXISTS, b, 1, &d), 0);
    assert_true(d.flag);
    memset(b, 0, sizeof b);
    assert_int_equal(decode_body(FR_SMSG_ERROR, b, 14, &d), FERRY_EPROTO);
    le(b, 1, 4);
    assert_int_equal(decode_body(FR_SMSG_ERROR, b, 14, &d), FERRY_EPROTO);
    le(b, (uint32_t)FERRY_ENOENT, 4);
    assert_int_equal(decode_body(FR_SMSG_ERROR, b, 14, &d), 0);
    assert_int_equal(d.status, FERRY_ENOENT);
    /* EVENTS: a deleted event with a value. */
    uint8_t e[8 + 4 + 8 + 1 + 3 + 5];
    memset(e, 0, sizeof e);
    le(e + 8, 1, 4);
    e[20] = 1;
    le(e + 21, 1, 2);
    e[23] = 'k';
    le(e + 24, 1, 4);
    assert_int_equal(decode_body(FR_SMSG_EVENTS, e, sizeof e, &d), FERRY_EPROTO);
    e[20] = 0;
    assert_int_equal(decode_body(FR_SMSG_EVENTS, e, sizeof e, &d), 0);
    /* d borrows from a freed copy; decode in place to walk it. */
    fr_frame_hdr h = { FR_SMSG_EVENTS, 1, sizeof e };
    assert_int_equal(fr_smsg_decode(&h, e, sizeof e, &d), 0);
    assert_true(fr_smsg_item_next(&d, &pos, &it));
    assert_int_equal(it.key.n, 1);
    assert_int_equal(it.val.n, 1);
    assert_false(it.deleted);
    assert_false(fr_smsg_item_next(&d, &pos, &it));
}

static void test_unknown_types(void **state)
{
    (void)state;
    static const uint16_t bad[] = { 0, FR_MSG_WRITE, FR_MSG_TYPE_MAX, 31, 57, 63, 78, 80,
                                    127, 128, UINT16_MAX };
    uint8_t out[BUF_MAX];
    uint8_t body[4] = { 0 };
    fr_smsg m, d;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(decode_body(bad[i], body, 0, &d), FERRY_EPROTO);
        assert_int_equal(decode_body(bad[i], body, sizeof body, &d), FERRY_EPROTO);
        sample(FR_SMSG_OK, &m);
        m.type = bad[i];
        assert_int_equal(fr_smsg_encode(&m, 1, out, sizeof out), FERRY_EINVAL);
        assert_null(fr_smsg_type_name(bad[i]));
        assert_false(fr_smsg_is_request(bad[i]));
    }
    /* Headers: the store range is accepted up to FR_WIRE_STORE_MAX_LEN. */
    fr_frame_hdr h;
    uint8_t hb[FR_WIRE_HDR_LEN];
    fr_wire_hdr_encode(hb, FR_MSG_STORE_LAST, 1, FR_WIRE_STORE_MAX_LEN);
    assert_int_equal(fr_wire_hdr_decode(hb, sizeof hb, &h), 0);
    fr_wire_hdr_encode(hb, FR_SMSG_KV_PUT, 1, FR_WIRE_STORE_MAX_LEN + 1);
    assert_int_equal(fr_wire_hdr_decode(hb, sizeof hb, &h), FERRY_EMSGSIZE);
    fr_wire_hdr_encode(hb, FR_MSG_STORE_LAST + 1, 1, 0);
    assert_int_equal(fr_wire_hdr_decode(hb, sizeof hb, &h), FERRY_EPROTO);
    fr_wire_hdr_encode(hb, FR_MSG_STORE_FIRST - 1, 1, 0);
    assert_int_equal(fr_wire_hdr_decode(hb, sizeof hb, &h), FERRY_EPROTO);
    assert_int_equal(fr_wire_meta_len(FR_SMSG_OK), 0);
    /* A body length above the cap, even from a hand-made header. */
    h = (fr_frame_hdr){ FR_SMSG_OK, 1, FR_SMSG_BODY_MAX + 1 };
    assert_int_equal(fr_smsg_decode(&h, body, 0, &d), FERRY_EMSGSIZE);
}

/* cap too small: EMSGSIZE and nothing written. The array and the raw
 * forms of lists encode alike. */
static void test_encode_cap_and_forms(void **state)
{
    (void)state;
    uint8_t buf[BUF_MAX], buf2[BUF_MAX];
    static const uint16_t listy[] = { FR_SMSG_KEYS, FR_SMSG_EVENTS, FR_SMSG_RECORDS,
                                      FR_SMSG_PUT_START };
    for (size_t t = 0; t < NTYPES; t++) {
        fr_smsg m;
        size_t k = encode_sample(all_types[t], &m, buf);
        memset(buf2, 0xee, sizeof buf2);
        assert_int_equal(fr_smsg_encode(&m, 1, buf2, k - 1), FERRY_EMSGSIZE);
        for (size_t i = 0; i < k; i++)
            assert_int_equal(buf2[i], 0xee);
        assert_int_equal(fr_smsg_encode(&m, 1, NULL, 0), FERRY_EMSGSIZE);
    }
    for (size_t t = 0; t < sizeof listy / sizeof listy[0]; t++) {
        fr_smsg m, d;
        size_t k = encode_sample(listy[t], &m, buf);
        fr_frame_hdr h;
        assert_int_equal(fr_wire_hdr_decode(buf, k, &h), 0);
        assert_int_equal(fr_smsg_decode(&h, buf + FR_WIRE_HDR_LEN, h.len, &d), 0);
        assert_null(d.items);
        assert_null(d.preferred);
        /* Relay the raw form in a fresh message. */
        fr_smsg r = m;
        r.items = NULL;
        r.items_raw = d.items_raw;
        r.items_len = d.items_len;
        r.preferred = NULL;
        r.preferred_le = d.preferred_le;
        assert_int_equal(fr_smsg_encode(&r, 0xabcdef, buf2, sizeof buf2), (int)k);
        assert_memory_equal(buf, buf2, k);
        /* A raw list that does not match its count is refused. */
        if (r.nitems) {
            r.nitems++;
            assert_int_equal(fr_smsg_encode(&r, 1, buf2, sizeof buf2), FERRY_EINVAL);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_pinned_bytes),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_byte_flips),
        cmocka_unit_test(test_bad_counts),
        cmocka_unit_test(test_oversize_fields),
        cmocka_unit_test(test_field_rules),
        cmocka_unit_test(test_unknown_types),
        cmocka_unit_test(test_encode_cap_and_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
