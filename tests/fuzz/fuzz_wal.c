/* libFuzzer target over everything the store reads back from disk: log and
 * snapshot files, their frames, and the records inside. The first input
 * byte picks the mode, the rest is its input:
 *
 *   0  a log file: header, then frames, replayed into a fresh state
 *   1  as 0, but the harness writes a correct check into every frame it can
 *      delimit (a check is a hash the fuzzer cannot forge; without this it
 *      would never reach the LSN rules or the records)
 *   2  a sequence of records, each prefixed by a u16 length, replayed into
 *      a fresh state
 *   3  as 2, but as a snapshot (between load_begin and SNAP_END)
 *
 * Whenever a record decodes, re-encoding it must give back the same bytes.
 * Whatever state the records build, its snapshot must load into a fresh
 * state with the same digest. Anything else aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "store/store_int.h"

#define FR_FUZZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

static void rec_round_trip(const uint8_t *in, size_t n)
{
    fr_rec r, r2;
    static uint8_t out[65536 + 64];
    if (fr_rec_decode(in, n, &r) < 0)
        return;
    int k = fr_rec_encode(&r, out, sizeof(out));
    FR_FUZZ_CHECK(k == (int)n && memcmp(out, in, n) == 0);
    FR_FUZZ_CHECK(fr_rec_decode(out, (size_t)k, &r2) == 0 && r2.type == r.type);
}

typedef struct { uint8_t *buf; size_t len, cap; } bytes;

static int collect(void *ctx, const uint8_t *rec, size_t len)
{
    bytes *b = ctx;
    if (b->len + len + 4 > b->cap) {
        size_t cap = (b->len + len + 4) * 2;
        uint8_t *p = realloc(b->buf, cap);
        if (p == NULL)
            return FERRY_ENOMEM;
        b->buf = p;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, &(uint32_t){ (uint32_t)len }, 4);
    memcpy(b->buf + b->len + 4, rec, len);
    b->len += len + 4;
    return 0;
}

/* The snapshot of any state loads back to the same state. */
static void snapshot_round_trip(fr_meta *m)
{
    if (fr_meta_loading(m))
        return;
    bytes snap = { 0 };
    fr_meta *m2;
    fr_hash128_t a, b;
    FR_FUZZ_CHECK(fr_meta_snapshot(m, collect, &snap) == 0);
    FR_FUZZ_CHECK(fr_meta_new(NULL, &m2) == 0 && fr_meta_load_begin(m2) == 0);
    for (size_t off = 0; off < snap.len;) {
        uint32_t len;
        memcpy(&len, snap.buf + off, 4);
        FR_FUZZ_CHECK(fr_meta_replay(m2, snap.buf + off + 4, len) == 0);
        off += 4 + len;
    }
    FR_FUZZ_CHECK(!fr_meta_loading(m2));
    FR_FUZZ_CHECK(fr_meta_digest(m, &a) == 0 && fr_meta_digest(m2, &b) == 0);
    FR_FUZZ_CHECK(memcmp(&a, &b, sizeof(a)) == 0);
    fr_meta_destroy(m2);
    free(snap.buf);
}

static int replay_frame(void *ctx, uint64_t lsn, const uint8_t *rec, size_t len)
{
    (void)lsn;
    rec_round_trip(rec, len);
    fr_meta_replay(ctx, rec, len);
    return 0;
}

static void fuzz_log(const uint8_t *in, size_t n, bool fix)
{
    uint32_t kind;
    uint64_t lsn;
    fr_wal_scan_result res;
    fr_meta *m;
    uint8_t *body = malloc(n + 1);
    if (body == NULL || fr_meta_new(NULL, &m) < 0)
        abort();
    memcpy(body, in, n);
    size_t off = 0;
    if (fix) {
        /* Make every frame the harness can delimit check out. */
        while (n - off >= FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL) {
            uint32_t len = (uint32_t)body[off] | (uint32_t)body[off + 1] << 8;   /* keep it short */
            body[off + 2] = body[off + 3] = 0;
            if (n - off - FR_WAL_FRAME_HEAD - FR_WAL_FRAME_TAIL < len)
                break;
            uint64_t h = XXH3_64bits_withSeed(body + off, FR_WAL_FRAME_HEAD + len, 0x6672792d77616c31ull);
            for (int i = 0; i < 8; i++)
                body[off + FR_WAL_FRAME_HEAD + len + i] = (uint8_t)(h >> (8 * i));
            off += FR_WAL_FRAME_HEAD + len + FR_WAL_FRAME_TAIL;
        }
        lsn = n >= 16 ? ((uint64_t)body[8] | (uint64_t)body[9] << 8) : 1;
        fr_wal_scan(body, n, lsn, replay_frame, m, &res);
    } else if (fr_wal_hdr_decode(body, n, &kind, &lsn) == 0) {
        fr_wal_scan(body + FR_WAL_FILE_HDR, n - FR_WAL_FILE_HDR, lsn, replay_frame, m, &res);
    } else {
        fr_wal_scan(body, n, 1, replay_frame, m, &res);
    }
    if (fix || res.frames > 0)
        FR_FUZZ_CHECK(res.valid_len <= n);
    snapshot_round_trip(m);
    fr_meta_destroy(m);
    free(body);
}

static void fuzz_records(const uint8_t *in, size_t n, bool snapshot)
{
    fr_meta *m;
    if (fr_meta_new(NULL, &m) < 0)
        abort();
    if (snapshot)
        FR_FUZZ_CHECK(fr_meta_load_begin(m) == 0);
    size_t off = 0;
    while (n - off >= 2) {
        size_t len = (size_t)in[off] | (size_t)in[off + 1] << 8;
        off += 2;
        if (len > n - off)
            len = n - off;
        rec_round_trip(in + off, len);
        fr_meta_replay(m, in + off, len);
        off += len;
    }
    snapshot_round_trip(m);
    fr_meta_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] % 4) {
    case 0:
        fuzz_log(data + 1, size - 1, false);
        break;
    case 1:
        fuzz_log(data + 1, size - 1, true);
        break;
    case 2:
        fuzz_records(data + 1, size - 1, false);
        break;
    default:
        fuzz_records(data + 1, size - 1, true);
        break;
    }
    return 0;
}
