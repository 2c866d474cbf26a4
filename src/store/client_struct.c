/* Store client: structured objects (store.h).
 *
 * One object holds a header and then every member, each at a 64-byte
 * aligned offset. The header, little-endian:
 *
 *    0  "FRYSTRCT"   8  u32 version (1)   12  u32 members
 *   16  u64 header bytes (a multiple of 64; member data starts there)
 *   24  u64 0
 *   32  per member, 168 bytes: name[64] (NUL-padded), dtype[16] (NUL-padded),
 *       u32 ndim, u32 0, u64 shape[8], u64 offset, u64 nbytes
 *
 * A reader fetches the header with one ranged read, then exactly the bytes
 * of the member rows it wants with another: no deserialisation. Every field
 * of a header that came from the store is checked before use. */
#include <string.h>

#include "store/client_int.h"

#define MAGIC "FRYSTRCT"
#define HDR_FIXED 32
#define MEMBER_LEN 168
#define ALIGN 64
#define FIRST_READ 4096

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t align_up(uint64_t v)
{
    return (v + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
}

/* nbytes of a member from its dtype and shape; 0 with *err on failure. */
static int member_bytes(const ferry_member *m, uint64_t *out)
{
    uint64_t n = ferry_dtype_size(m->dtype);
    if (n == 0 || m->ndim > FERRY_MEMBER_NDIM_MAX)
        return FERRY_EINVAL;
    for (uint32_t d = 0; d < m->ndim; d++)
        if (fr_mul_u64(n, m->shape[d], &n) < 0)
            return FERRY_ERANGE;
    *out = n;
    return 0;
}

static int check_name(const char *name)
{
    size_t n = strnlen(name, FERRY_MEMBER_NAME_MAX + 1);
    return n == 0 || n > FERRY_MEMBER_NAME_MAX ? FERRY_EINVAL : 0;
}

/* The bytes of one structured object (*obj, fr_free; *len its size), every
 * member checked. */
static int build(const char *key, const ferry_member *members, const void *const *data, size_t n,
                 uint8_t **objp, uint64_t *len, ferry_error *err)
{
    if ((n && (!members || !data)) || n > (1u << 20))
        return fr_fail(err, FERRY_EINVAL, "put_struct: bad arguments");
    uint64_t hdr = align_up(HDR_FIXED + (uint64_t)n * MEMBER_LEN), total = hdr;
    uint8_t *h = fr_calloc(1, hdr);
    if (!h)
        return FERRY_ENOMEM;
    memcpy(h, MAGIC, 8);
    h[8] = 1;
    put64(h + 12, n);   /* low 4 bytes: members; bytes 16.. are rewritten below */
    int bad = 0;
    for (size_t i = 0; i < n && bad == 0; i++) {
        const ferry_member *m = &members[i];
        uint64_t nb = 0;
        if ((bad = check_name(m->name)) < 0)
            fr_fail(err, bad, "put_struct %s: member names are 1..%d bytes", key,
                          FERRY_MEMBER_NAME_MAX);
        for (size_t j = 0; j < i && bad == 0; j++)
            if (strcmp(members[j].name, m->name) == 0)
                bad = fr_fail(err, FERRY_EINVAL, "put_struct %s: member %s appears twice", key,
                                    m->name);
        if (bad == 0 && (bad = member_bytes(m, &nb)) < 0)
            fr_fail(err, bad, "put_struct %s: member %s: unknown dtype '%.15s' or bad shape",
                          key, m->name, m->dtype);
        if (bad == 0 && nb && !data[i])
            bad = fr_fail(err, FERRY_EINVAL, "put_struct %s: member %s has no data", key,
                                m->name);
        if (bad < 0)
            break;
        uint8_t *e = h + HDR_FIXED + i * MEMBER_LEN;
        memcpy(e, m->name, strlen(m->name));
        memcpy(e + 64, m->dtype, strnlen(m->dtype, sizeof m->dtype - 1));
        e[80] = (uint8_t)m->ndim;
        for (uint32_t d = 0; d < m->ndim; d++)
            put64(e + 88 + 8 * d, m->shape[d]);
        put64(e + 152, total);
        put64(e + 160, nb);
        total = align_up(total + nb);
    }
    put64(h + 16, hdr);
    put64(h + 24, 0);
    if (bad < 0) {
        fr_free(h);
        return bad;
    }
    /* One contiguous staging copy keeps the put a single transfer; members
     * are usually small (indices, values, index tables) next to the round
     * trips this saves. */
    uint8_t *obj = fr_malloc(total ? total : 1);
    if (!obj) {
        fr_free(h);
        return FERRY_ENOMEM;
    }
    memset(obj, 0, total);
    memcpy(obj, h, hdr);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = h + HDR_FIXED + i * MEMBER_LEN;
        uint64_t nb = get64(e + 160);
        if (nb)
            memcpy(obj + get64(e + 152), data[i], nb);
    }
    fr_free(h);
    *objp = obj;
    *len = total;
    return 0;
}

int ferry_store_put_struct(ferry_store *s, const char *key, const ferry_member *members,
                           const void *const *data, size_t n, const ferry_replicate_config *rc, ferry_error *err)
{
    if (!s)
        return fr_fail(err, FERRY_EINVAL, "put_struct: bad arguments");
    uint8_t *obj = NULL;
    uint64_t total = 0;
    int r = build(key, members, data, n, &obj, &total, err);
    if (r < 0)
        return r;
    r = ferry_store_put(s, key, obj, total, rc, NULL, err);
    fr_free(obj);
    return r;
}

int ferry_store_batch_put_struct(ferry_store *s, const char *const *keys,
                                 const ferry_member *const *members, const void *const *const *data,
                                 const size_t *nmembers, size_t n, const ferry_replicate_config *rc,
                                 int *results, ferry_error *err)
{
    if (!s || (n && (!keys || !members || !data || !nmembers || !results)))
        return fr_fail(err, FERRY_EINVAL, "batch_put_struct: bad arguments");
    if (n == 0)
        return 0;
    uint8_t **obj = fr_calloc(n, sizeof *obj);
    const char **k = fr_calloc(n, sizeof *k);
    const void **b = fr_calloc(n, sizeof *b);
    size_t *len = fr_calloc(n, sizeof *len), *slot = fr_calloc(n, sizeof *slot);
    int *res = fr_calloc(n, sizeof *res);
    int first = obj && k && b && len && slot && res ? 0 : fr_fail(err, FERRY_ENOMEM, "batch_put_struct: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = first;
        if (first < 0)
            continue;
        uint64_t total = 0;
        if ((results[i] = build(keys[i], members[i], data[i], nmembers[i], &obj[i], &total, err)) < 0)
            continue;
        k[m] = keys[i], b[m] = obj[i], len[m] = total, slot[m++] = i;
    }
    if (first == 0 && m) {
        (void)ferry_store_batch_put_from(s, k, b, len, m, rc, res, err);   /* per object below */
        for (size_t q = 0; q < m; q++)
            results[slot[q]] = res[q];
    }
    for (size_t i = 0; i < n; i++) {
        if (results[i] < 0 && first == 0)
            first = results[i];
        if (obj)
            fr_free(obj[i]);
    }
    fr_free(obj);
    fr_free(k);
    fr_free(b);
    fr_free(len);
    fr_free(slot);
    fr_free(res);
    return first;
}

/* Parse and check a header read from the store (n bytes at p, object of
 * size bytes). *need: header bytes when more must be read first. */
static int parse_header(const char *key, const uint8_t *p, uint64_t n, uint64_t size,
                        ferry_member *out, size_t cap, size_t *count, uint64_t *need, ferry_error *err)
{
    *need = 0;
    if (n < HDR_FIXED || memcmp(p, MAGIC, 8) != 0)
        return fr_fail(err, FERRY_EPROTO, "%s is a plain object, not a structured one (those are "
                             "made by put_struct or put_tensor); read it whole with get or "
                             "get_into", key);
    if ((get64(p + 8) & 0xffffffffu) != 1)
        goto bad;
    uint64_t cnt = get64(p + 8) >> 32;
    uint64_t hdr = get64(p + 16);
    if (get64(p + 24) != 0 || hdr % ALIGN || hdr > size ||
        hdr < align_up(HDR_FIXED + cnt * MEMBER_LEN))
        goto bad;
    if (hdr > n) {
        *need = hdr;
        return 0;
    }
    *count = cnt;
    for (uint64_t i = 0; i < cnt; i++) {
        const uint8_t *e = p + HDR_FIXED + i * MEMBER_LEN;
        ferry_member m;
        memset(&m, 0, sizeof m);
        memcpy(m.name, e, 64);
        memcpy(m.dtype, e + 64, 16);
        if (m.name[FERRY_MEMBER_NAME_MAX] || m.dtype[15] || check_name(m.name) < 0)
            goto bad;
        m.ndim = (uint32_t)get64(e + 80);
        if (m.ndim > FERRY_MEMBER_NDIM_MAX)
            goto bad;
        for (uint32_t d = 0; d < m.ndim; d++)
            m.shape[d] = get64(e + 88 + 8 * d);
        m.offset = get64(e + 152);
        m.nbytes = get64(e + 160);
        uint64_t nb, end;
        if (member_bytes(&m, &nb) < 0 || nb != m.nbytes || m.offset < hdr ||
            fr_add_u64(m.offset, nb, &end) < 0 || end > size)
            goto bad;
        if (i < cap)
            out[i] = m;
    }
    return 0;
bad:
    return fr_fail(err, FERRY_EPROTO, "%s is a structured object whose member table is damaged "
                         "or of another version", key);
}

/* Locate the object and read its member table. */
static int load(ferry_store *s, const char *key, fr_objloc *loc, ferry_member **members,
                size_t *count, ferry_error *err)
{
    int st = 0;
    int rc = fr_client_locate(s, &key, 1, loc, &st, err);
    if (rc == 0)
        rc = st;
    if (rc < 0)
        return rc;
    ferry_range r = {.key = key, .src_offset = 0,
                     .len = loc->size < FIRST_READ ? loc->size : FIRST_READ};
    uint8_t *buf = NULL;
    uint64_t need = r.len;
    ferry_member *m = NULL;
    for (int pass = 0; pass < 2; pass++) {
        fr_free(buf);
        buf = fr_malloc(need ? need : 1);
        if (!buf)
            return FERRY_ENOMEM;
        r.dst = buf;
        r.len = need;
        int64_t got = 0;
        rc = ferry_store_get_into_ranges(s, &r, 1, &got, err);
        if (rc < 0)
            break;
        size_t cnt = 0;
        uint64_t more = 0;
        rc = parse_header(key, buf, (uint64_t)got, loc->size, NULL, 0, &cnt, &more, err);
        if (rc < 0)
            break;
        if (more) {
            need = more;
            continue;
        }
        m = fr_calloc(cnt ? cnt : 1, sizeof *m);
        if (!m) {
            rc = FERRY_ENOMEM;
            break;
        }
        rc = parse_header(key, buf, (uint64_t)got, loc->size, m, cnt, count, &more, err);
        break;
    }
    fr_free(buf);
    if (rc < 0 || !m) {
        fr_free(m);
        return rc < 0 ? rc : fr_fail(err, FERRY_EPROTO, "%s: header keeps growing", key);
    }
    *members = m;
    return 0;
}

int ferry_store_get_members(ferry_store *s, const char *key, ferry_member *out, size_t cap,
                            size_t *n, ferry_error *err)
{
    if (!s || !n || (cap && !out))
        return fr_fail(err, FERRY_EINVAL, "get_members: bad arguments");
    fr_objloc loc;
    ferry_member *m = NULL;
    size_t cnt = 0;
    int rc = load(s, key, &loc, &m, &cnt, err);
    if (rc < 0)
        return rc;
    memcpy(out, m, (cnt < cap ? cnt : cap) * sizeof *m);
    *n = cnt;
    fr_free(m);
    return 0;
}

/* One object's header of a batch: where it lives, the bytes read of it. */
typedef struct bhead {
    uint8_t *buf;
    uint64_t len;
} bhead;

int ferry_store_batch_get_members(ferry_store *s, const char *const *keys, size_t n,
                                  ferry_member *out, size_t cap, size_t *counts, int *results,
                                  ferry_error *err)
{
    if (!s || (n && (!keys || !counts || !results || (cap && !out))))
        return fr_fail(err, FERRY_EINVAL, "batch_get_members: bad arguments");
    if (n == 0)
        return 0;
    fr_objloc *loc = fr_calloc(n, sizeof *loc);
    bhead *h = fr_calloc(n, sizeof *h);
    ferry_range *r = fr_calloc(n, sizeof *r);
    int64_t *got = fr_calloc(n, sizeof *got);
    size_t *idx = fr_calloc(n, sizeof *idx);
    int rc = loc && h && r && got && idx ? 0 : fr_fail(err, FERRY_ENOMEM, "batch_get_members: out of memory");
    for (size_t i = 0; i < n; i++) {
        counts[i] = 0;
        results[i] = rc;
    }
    if (rc == 0)
        rc = fr_client_locate(s, keys, n, loc, results, err);
    for (size_t i = 0; i < n && rc == 0; i++) {   /* a first read of each, then the rest of long tables */
        h[i].len = results[i] < 0 ? 0 : loc[i].size < FIRST_READ ? loc[i].size : FIRST_READ;
        uint64_t more = 0;
        if (results[i] == 0 && h[i].len == 0)   /* an empty object: refused as a plain one */
            results[i] = parse_header(keys[i], (const uint8_t *)"", 0, 0, NULL, 0, &counts[i], &more, err);
    }
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        size_t nr = 0;
        for (size_t i = 0; i < n; i++) {
            if (results[i] < 0 || h[i].buf || h[i].len == 0)
                continue;
            h[i].buf = fr_malloc(h[i].len);
            if (!h[i].buf) {
                results[i] = fr_fail(err, FERRY_ENOMEM, "batch_get_members: out of memory");
                continue;
            }
            r[nr] = (ferry_range){ .key = keys[i], .src_offset = 0, .dst = h[i].buf, .len = h[i].len };
            idx[nr++] = i;
        }
        if (nr)
            ferry_store_get_into_ranges(s, r, nr, got, err);   /* each range's result below */
        for (size_t k = 0; k < nr; k++) {
            size_t i = idx[k];
            if (got[k] < 0) {
                results[i] = (int)got[k];
                continue;
            }
            uint64_t more = 0;
            results[i] = parse_header(keys[i], h[i].buf, (uint64_t)got[k], loc[i].size,
                                      cap ? out + i * cap : NULL, cap, &counts[i], &more, err);
            if (results[i] == 0 && more) {
                if (pass == 1) {
                    results[i] = fr_fail(err, FERRY_EPROTO, "%s: header keeps growing", keys[i]);
                    continue;
                }
                fr_free(h[i].buf);
                h[i].buf = NULL;   /* read again, whole, in the second pass */
                h[i].len = more;
            }
        }
    }
    int first = rc;
    for (size_t i = 0; i < n; i++) {
        if (rc < 0)
            results[i] = rc;
        if (results[i] < 0)
            counts[i] = 0;
        if (results[i] < 0 && first == 0)
            first = results[i];
        if (h)
            fr_free(h[i].buf);
    }
    fr_free(loc);
    fr_free(h);
    fr_free(r);
    fr_free(got);
    fr_free(idx);
    return first;
}

int ferry_store_read_member(ferry_store *s, const char *key, const char *member,
                            uint64_t row_begin, uint64_t row_end, void *dst, size_t cap,
                            size_t *len, ferry_error *err)
{
    if (!s || !member || !len || (cap && !dst))
        return fr_fail(err, FERRY_EINVAL, "read_member: bad arguments");
    fr_objloc loc;
    ferry_member *m = NULL;
    size_t cnt = 0;
    int rc = load(s, key, &loc, &m, &cnt, err);
    if (rc < 0)
        return rc;
    const ferry_member *f = NULL;
    for (size_t i = 0; i < cnt && !f; i++)
        if (strcmp(m[i].name, member) == 0)
            f = &m[i];
    uint64_t rows = 0, row_bytes = 0;
    if (!f)
        rc = fr_fail(err, FERRY_ENOENT, "%s has no member %s", key, member);
    else {
        rows = f->ndim ? f->shape[0] : 1;
        row_bytes = rows ? f->nbytes / rows : 0;
        if (row_begin > row_end || row_end > rows)
            rc = fr_fail(err, FERRY_ERANGE, "%s.%s: rows %llu..%llu outside 0..%llu", key,
                               member, (unsigned long long)row_begin,
                               (unsigned long long)row_end, (unsigned long long)rows);
        else if ((row_end - row_begin) * row_bytes > cap)
            rc = fr_fail(err, FERRY_EMSGSIZE, "%s.%s: %llu bytes, the buffer has %zu", key,
                               member, (unsigned long long)((row_end - row_begin) * row_bytes),
                               cap);
    }
    if (rc == 0) {
        ferry_range r = {.key = key, .src_offset = f->offset + row_begin * row_bytes,
                         .dst = dst, .len = (row_end - row_begin) * row_bytes};
        int64_t got = 0;
        rc = r.len ? ferry_store_get_into_ranges(s, &r, 1, &got, err) : 0;
        if (rc == 0)
            *len = (size_t)got;
    }
    fr_free(m);
    return rc;
}
