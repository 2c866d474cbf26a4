/* libFuzzer target over the store protocol decoder (fr_smsg_decode, and
 * fr_smsg_decode_epoch over the same bodies). The
 * first input byte picks the mode:
 *
 *   even  the second byte picks a message type (every store type, plus a
 *         few that are not), the rest is the body; the harness makes the
 *         header, so the fuzzer need not forge its check
 *   odd   the rest is a whole frame: fr_wire_hdr_decode, then
 *         fr_smsg_decode of the body with that header
 *
 * Whenever a decode succeeds the message is encoded again twice, once from
 * the decoded (borrowed, raw-list) form and once with its lists copied into
 * arrays; both must reproduce the accepted bytes exactly and decode to the
 * same message. Anything else aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/store_msg.h"

#define FR_FUZZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

static const uint16_t types[] = {
    FR_SMSG_MOUNT, FR_SMSG_UNMOUNT, FR_SMSG_PUT_START, FR_SMSG_PUT_END, FR_SMSG_PUT_REVOKE,
    FR_SMSG_GET_REPLICAS, FR_SMSG_REMOVE, FR_SMSG_REMOVE_PREFIX, FR_SMSG_EXIST, FR_SMSG_LIST,
    FR_SMSG_KV_GET, FR_SMSG_KV_PUT, FR_SMSG_KV_CAS, FR_SMSG_KV_DELETE, FR_SMSG_WATCH,
    FR_SMSG_BARRIER, FR_SMSG_Q_PUSH, FR_SMSG_Q_POP, FR_SMSG_Q_ACK, FR_SMSG_Q_NACK,
    FR_SMSG_HEARTBEAT, FR_SMSG_OK, FR_SMSG_PLACEMENT, FR_SMSG_REPLICAS, FR_SMSG_REMOVED,
    FR_SMSG_EXISTS, FR_SMSG_KEYS, FR_SMSG_KV_VALUE, FR_SMSG_REVISION, FR_SMSG_EVENTS,
    FR_SMSG_BARRIER_DONE, FR_SMSG_RECORDS, FR_SMSG_PUSHED, FR_SMSG_ERROR,
    0, FR_MSG_WRITE, 53, 76, 127,
};

/* Encode m and compare with the frame it came from (header + body). */
static void same_encoding(const fr_smsg *m, uint64_t req_id, const uint8_t *body, size_t len)
{
    size_t blen;
    FR_FUZZ_CHECK(fr_smsg_body_len(m, &blen) == 0 && blen == len);
    uint8_t *out = malloc(FR_WIRE_HDR_LEN + len);
    FR_FUZZ_CHECK(out != NULL);
    int k = fr_smsg_encode(m, req_id, out, FR_WIRE_HDR_LEN + len);
    FR_FUZZ_CHECK(k == (int)(FR_WIRE_HDR_LEN + len));
    FR_FUZZ_CHECK(len == 0 || memcmp(out + FR_WIRE_HDR_LEN, body, len) == 0);
    fr_frame_hdr h;
    fr_smsg m2;
    FR_FUZZ_CHECK(fr_wire_hdr_decode(out, (size_t)k, &h) == 0);
    FR_FUZZ_CHECK(h.type == m->type && h.req_id == req_id && h.len == len);
    FR_FUZZ_CHECK(fr_smsg_decode(&h, out + FR_WIRE_HDR_LEN, len, &m2) == 0);
    FR_FUZZ_CHECK(m2.nitems == m->nitems && m2.npreferred == m->npreferred && m2.nrep == m->nrep);
    free(out);
}

static void round_trip(const fr_smsg *m, uint64_t req_id, const uint8_t *body, size_t len)
{
    same_encoding(m, req_id, body, len);

    /* The same message with its lists as arrays. */
    fr_smsg a = *m;
    uint64_t pref[FR_SMSG_PREFERRED_MAX];
    for (uint32_t i = 0; i < m->npreferred; i++)
        pref[i] = fr_smsg_preferred(m, i);
    a.preferred = m->npreferred ? pref : NULL;
    a.preferred_le = NULL;
    fr_smsg_item *items = NULL;
    if (m->nitems) {
        /* nitems is bounded by the decoder's caps (<= FR_SMSG_LIST_MAX). */
        items = calloc(m->nitems, sizeof *items);
        FR_FUZZ_CHECK(items != NULL);
        size_t pos = 0;
        uint32_t n = 0;
        while (n < m->nitems && fr_smsg_item_next(m, &pos, &items[n]))
            n++;
        FR_FUZZ_CHECK(n == m->nitems && pos == m->items_len);
        FR_FUZZ_CHECK(!fr_smsg_item_next(m, &pos, &items[0]));
    }
    a.items = items;
    a.items_raw = NULL;
    a.items_len = 0;
    same_encoding(&a, req_id, body, len);
    free(items);
}

/* The same body read as a frame of an epoch connection (the last 8 bytes
 * the epoch): when it decodes, encoding it again with its epoch gives back
 * the bytes, and the body before the epoch round-trips as any body. */
static void epoch_round_trip(const fr_frame_hdr *h, const uint8_t *body, size_t len)
{
    fr_smsg m;
    uint64_t epoch = 0;
    if (fr_smsg_decode_epoch(h, body, len, &m, &epoch) != 0)
        return;
    FR_FUZZ_CHECK(h->len >= FR_SMSG_EPOCH_LEN);
    uint8_t *out = malloc(FR_WIRE_HDR_LEN + h->len);
    FR_FUZZ_CHECK(out != NULL);
    int k = fr_smsg_encode_epoch(&m, h->req_id, epoch, out, FR_WIRE_HDR_LEN + h->len);
    FR_FUZZ_CHECK(k == (int)(FR_WIRE_HDR_LEN + h->len));
    FR_FUZZ_CHECK(memcmp(out + FR_WIRE_HDR_LEN, body, h->len) == 0);
    free(out);
    round_trip(&m, h->req_id, body, h->len - FR_SMSG_EPOCH_LEN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    fr_smsg m;
    if ((data[0] & 1) == 0) {
        if (size < 2)
            return 0;
        uint16_t type = types[data[1] % (sizeof types / sizeof types[0])];
        fr_frame_hdr h = { type, 42, (uint32_t)(size - 2) };
        if (fr_smsg_decode(&h, data + 2, size - 2, &m) == 0)
            round_trip(&m, 42, data + 2, size - 2);
        epoch_round_trip(&h, data + 2, size - 2);
        return 0;
    }
    fr_frame_hdr h;
    if (fr_wire_hdr_decode(data + 1, size - 1, &h) < 0)
        return 0;
    const uint8_t *body = data + 1 + FR_WIRE_HDR_LEN;
    size_t n = size - 1 - FR_WIRE_HDR_LEN;
    if (fr_smsg_decode(&h, body, n, &m) == 0)
        round_trip(&m, h.req_id, body, h.len);
    return 0;
}
