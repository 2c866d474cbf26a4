/* Store protocol codecs (see store_msg.h for the API).
 *
 * A body is the type's fields in table order, little-endian, nothing after.
 * Field kinds (letter in the table, member of fr_smsg, encoding):
 *
 *   K key       key        u16 n in 1..KEY_MAX, n bytes, no NUL
 *   P prefix    key        u16 n in 0..KEY_MAX, n bytes, no NUL
 *   M member    key2       as K
 *   A after     key2       as P
 *   V value     val        u32 n <= VALUE_MAX, n bytes
 *   D desc      val        u16 n in 1..DESC_MAX, n bytes
 *   T text      val        u16 n <= TEXT_MAX, n bytes, no NUL
 *   S status    status     i32 in [FR_STATUS_MIN, -1]
 *   F flag      flag       u8 0 or 1
 *   R replicas  replica_num  u32 <= REPLICAS_MAX
 *   L limit     limit      u32 in 1..LIST_MAX
 *   N pop n     limit      u32 in 1..POP_MAX
 *   B members   members    u32 in 1..BARRIER_MAX
 *   d token     deliveries u32
 *   s n z g l t u r c v i C k p G   u64: segment node size granule lease_ms
 *               timeout_ms until rev create_rev version id count
 *               skipped_leased skipped_pending generation
 *   h slot      u64: a put's placement slot (0: none)
 *   x preferred  u16 n <= PREFERRED_MAX, n x u64
 *   y replicas   u8 n <= REPLICAS_MAX, n x (segment u64, node u64,
 *                offset u64, length u64, preferred u8 0/1)
 *   X keys       u32 n <= LIST_MAX, n x (u16 len 1..KEY_MAX, bytes, no NUL)
 *   E events     u32 n <= LIST_MAX, n x (rev u64, deleted u8 0/1, key as
 *                in X, u32 val len <= VALUE_MAX, bytes; empty when deleted)
 *   Q records    u32 n <= POP_MAX, n x (id u64, deliveries u32, u32 len
 *                <= VALUE_MAX, bytes)
 *
 * Every count is checked against the bytes left (count x smallest entry)
 * and its hard cap before anything is walked. One set of field rules
 * (field_check, item_check) serves encoder and decoder; a rule broken on
 * the decode side is the peer's fault and reads as FERRY_EPROTO, a limit
 * exceeded as FERRY_EMSGSIZE on both sides. */
#include <assert.h>
#include <string.h>

#include "wire/store_msg.h"

#define FR_STATUS_MIN (-(FERRY_EBASE + 1000))
#define REPLICA_LEN 33

typedef struct { uint16_t type; const char *name; const char *fields; } smsg_def;

static const smsg_def defs[] = {
    { FR_SMSG_MOUNT, "MOUNT", "snzgDP" },
    { FR_SMSG_UNMOUNT, "UNMOUNT", "s" },
    { FR_SMSG_PUT_START, "PUT_START", "KzRFxh" },
    { FR_SMSG_PUT_END, "PUT_END", "K" },
    { FR_SMSG_PUT_REVOKE, "PUT_REVOKE", "K" },
    { FR_SMSG_GET_REPLICAS, "GET_REPLICAS", "Kl" },
    { FR_SMSG_REMOVE, "REMOVE", "K" },
    { FR_SMSG_REMOVE_PREFIX, "REMOVE_PREFIX", "P" },
    { FR_SMSG_EXIST, "EXIST", "K" },
    { FR_SMSG_LIST, "LIST", "PAL" },
    { FR_SMSG_KV_GET, "KV_GET", "K" },
    { FR_SMSG_KV_PUT, "KV_PUT", "KV" },
    { FR_SMSG_KV_CAS, "KV_CAS", "KrV" },
    { FR_SMSG_KV_DELETE, "KV_DELETE", "Kr" },
    { FR_SMSG_WATCH, "WATCH", "Pr" },
    { FR_SMSG_BARRIER, "BARRIER", "KMBt" },
    { FR_SMSG_Q_PUSH, "Q_PUSH", "KV" },
    { FR_SMSG_Q_POP, "Q_POP", "KNl" },
    { FR_SMSG_Q_ACK, "Q_ACK", "id" },
    { FR_SMSG_Q_NACK, "Q_NACK", "id" },
    { FR_SMSG_HEARTBEAT, "HEARTBEAT", "n" },
    { FR_SMSG_SEGMENT, "SEGMENT", "s" },
    { FR_SMSG_STATUS, "STATUS", "" },
    { FR_SMSG_UNWATCH, "UNWATCH", "i" },
    { FR_SMSG_Q_CONFIG, "Q_CONFIG", "Kz" },
    { FR_SMSG_OK, "OK", "" },
    { FR_SMSG_PLACEMENT, "PLACEMENT", "zy" },
    { FR_SMSG_REPLICAS, "REPLICAS", "zuy" },
    { FR_SMSG_REMOVED, "REMOVED", "Ckp" },
    { FR_SMSG_EXISTS, "EXISTS", "F" },
    { FR_SMSG_KEYS, "KEYS", "FX" },
    { FR_SMSG_KV_VALUE, "KV_VALUE", "rcvV" },
    { FR_SMSG_REVISION, "REVISION", "r" },
    { FR_SMSG_EVENTS, "EVENTS", "rE" },
    { FR_SMSG_BARRIER_DONE, "BARRIER_DONE", "G" },
    { FR_SMSG_RECORDS, "RECORDS", "Q" },
    { FR_SMSG_PUSHED, "PUSHED", "i" },
    { FR_SMSG_SEGMENT_DESC, "SEGMENT_DESC", "snzD" },
    { FR_SMSG_STATUS_TEXT, "STATUS_TEXT", "V" },
    { FR_SMSG_ERROR, "ERROR", "SrT" },
};

static const smsg_def *def_of(uint16_t type)
{
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
        if (defs[i].type == type)
            return &defs[i];
    return NULL;
}

const char *fr_smsg_type_name(uint16_t type)
{
    const smsg_def *d = def_of(type);
    return d ? d->name : NULL;
}

bool fr_smsg_is_request(uint16_t type)
{
    return def_of(type) && type < FR_SMSG_OK;
}

/* ---- little-endian packing ------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, size_t k)
{
    for (size_t i = 0; i < k; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t get_le(const uint8_t *p, size_t k)
{
    uint64_t v = 0;
    for (size_t i = k; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

static int32_t status_of(uint32_t u)
{
    return u <= INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) + INT32_MIN;
}

/* ---- field tables ------------------------------------------------------ */

static uint64_t *u64_field(fr_smsg *m, char k)
{
    switch (k) {
    case 's': return &m->segment;
    case 'n': return &m->node;
    case 'z': return &m->size;
    case 'g': return &m->granule;
    case 'l': return &m->lease_ms;
    case 't': return &m->timeout_ms;
    case 'u': return &m->until;
    case 'r': return &m->rev;
    case 'c': return &m->create_rev;
    case 'v': return &m->version;
    case 'i': return &m->id;
    case 'C': return &m->count;
    case 'k': return &m->skipped_leased;
    case 'p': return &m->skipped_pending;
    case 'G': return &m->generation;
    case 'h': return &m->slot;
    default: return NULL;
    }
}

/* u32 fields: member, min and max. */
static uint32_t *u32_field(fr_smsg *m, char k, uint32_t *lo, uint32_t *hi)
{
    *lo = 0;
    *hi = UINT32_MAX;
    switch (k) {
    case 'R': *hi = FR_SMSG_REPLICAS_MAX; return &m->replica_num;
    case 'L': *lo = 1; *hi = FR_SMSG_LIST_MAX; return &m->limit;
    case 'N': *lo = 1; *hi = FR_SMSG_POP_MAX; return &m->limit;
    case 'B': *lo = 1; *hi = FR_SMSG_BARRIER_MAX; return &m->members;
    case 'd': return &m->deliveries;
    default: return NULL;
    }
}

/* Byte fields: member, width of the length prefix, min, max, NUL allowed. */
typedef struct { fr_sbytes *f; unsigned width; uint32_t lo, hi; bool text; } bytes_kind;

static bool bytes_field(fr_smsg *m, char k, bytes_kind *b)
{
    b->width = 2;
    b->lo = 0;
    b->hi = FR_SMSG_KEY_MAX;
    b->text = true;
    switch (k) {
    case 'K': b->f = &m->key; b->lo = 1; return true;
    case 'P': b->f = &m->key; return true;
    case 'M': b->f = &m->key2; b->lo = 1; return true;
    case 'A': b->f = &m->key2; return true;
    case 'V': b->f = &m->val; b->width = 4; b->hi = FR_SMSG_VALUE_MAX; b->text = false; return true;
    case 'D': b->f = &m->val; b->lo = 1; b->hi = FR_SMSG_DESC_MAX; b->text = false; return true;
    case 'T': b->f = &m->val; b->hi = FR_SMSG_TEXT_MAX; return true;
    default: return false;
    }
}

/* n bytes at p against a kind's rules: 0, FERRY_EINVAL or FERRY_EMSGSIZE. */
static int bytes_check(const uint8_t *p, uint64_t n, uint32_t lo, uint32_t hi, bool text)
{
    if (n > hi)
        return FERRY_EMSGSIZE;
    if (n < lo || (n > 0 && !p))
        return FERRY_EINVAL;
    if (text && n > 0 && memchr(p, 0, (size_t)n))
        return FERRY_EINVAL;
    return 0;
}

/* ---- a bounded reader ------------------------------------------------- */

typedef struct { const uint8_t *p; size_t n, off; } rd;

static bool rd_has(const rd *r, size_t k)
{
    return r->n - r->off >= k;
}

static uint64_t rd_int(rd *r, size_t k)   /* caller checked rd_has(r, k) */
{
    uint64_t v = get_le(r->p + r->off, k);
    r->off += k;
    return v;
}

/* Length-prefixed bytes: the length is read, bounded by the kind and by the
 * bytes left, and the view set. */
static int rd_bytes(rd *r, unsigned width, uint32_t lo, uint32_t hi, bool text, fr_sbytes *out)
{
    if (!rd_has(r, width))
        return FERRY_EPROTO;
    uint64_t n = rd_int(r, width);
    if (n > hi)
        return FERRY_EMSGSIZE;
    if (!rd_has(r, (size_t)n))
        return FERRY_EPROTO;
    const uint8_t *p = n ? r->p + r->off : NULL;
    int rc = bytes_check(p, n, lo, hi, text);
    if (rc < 0)
        return rc == FERRY_EINVAL ? FERRY_EPROTO : rc;
    out->p = p;
    out->n = (uint32_t)n;
    r->off += (size_t)n;
    return 0;
}

/* ---- list items --------------------------------------------------------- */

typedef struct { unsigned count_width; uint32_t max; size_t min_entry; } list_kind;

static bool list_kind_of(uint16_t type, list_kind *lk)
{
    switch (type) {
    case FR_SMSG_KEYS: *lk = (list_kind){ 4, FR_SMSG_LIST_MAX, 3 }; return true;
    case FR_SMSG_EVENTS: *lk = (list_kind){ 4, FR_SMSG_LIST_MAX, 16 }; return true;
    case FR_SMSG_RECORDS: *lk = (list_kind){ 4, FR_SMSG_POP_MAX, 16 }; return true;
    default: return false;
    }
}

static int item_check(uint16_t type, const fr_smsg_item *it)
{
    int rc = 0;
    if (type != FR_SMSG_RECORDS)
        rc = bytes_check(it->key.p, it->key.n, 1, FR_SMSG_KEY_MAX, true);
    if (rc == 0 && type != FR_SMSG_KEYS)
        rc = bytes_check(it->val.p, it->val.n, 0, FR_SMSG_VALUE_MAX, false);
    if (rc == 0 && type == FR_SMSG_EVENTS && it->deleted && it->val.n != 0)
        rc = FERRY_EINVAL;
    return rc;
}

static size_t item_len(uint16_t type, const fr_smsg_item *it)
{
    switch (type) {
    case FR_SMSG_KEYS: return 2 + (size_t)it->key.n;
    case FR_SMSG_EVENTS: return 8 + 1 + 2 + (size_t)it->key.n + 4 + (size_t)it->val.n;
    default: return 8 + 4 + 4 + (size_t)it->val.n;
    }
}

/* Read one item. FERRY_EPROTO / FERRY_EMSGSIZE. */
static int rd_item(rd *r, uint16_t type, fr_smsg_item *it)
{
    memset(it, 0, sizeof *it);
    int rc;
    if (type == FR_SMSG_EVENTS) {
        if (!rd_has(r, 9))
            return FERRY_EPROTO;
        it->id = rd_int(r, 8);
        uint64_t del = rd_int(r, 1);
        if (del > 1)
            return FERRY_EPROTO;
        it->deleted = del == 1;
    } else if (type == FR_SMSG_RECORDS) {
        if (!rd_has(r, 12))
            return FERRY_EPROTO;
        it->id = rd_int(r, 8);
        it->deliveries = (uint32_t)rd_int(r, 4);
    }
    if (type != FR_SMSG_RECORDS) {
        rc = rd_bytes(r, 2, 1, FR_SMSG_KEY_MAX, true, &it->key);
        if (rc < 0)
            return rc;
    }
    if (type != FR_SMSG_KEYS) {
        rc = rd_bytes(r, 4, 0, FR_SMSG_VALUE_MAX, false, &it->val);
        if (rc < 0)
            return rc;
    }
    rc = item_check(type, it);
    return rc == FERRY_EINVAL ? FERRY_EPROTO : rc;
}

/* Validate an encoded list of n items in exactly len bytes at p. */
static int list_scan(uint16_t type, const uint8_t *p, size_t len, uint32_t n)
{
    rd r = { p, len, 0 };
    fr_smsg_item it;
    for (uint32_t i = 0; i < n; i++) {
        int rc = rd_item(&r, type, &it);
        if (rc < 0)
            return rc;
    }
    return r.off == len ? 0 : FERRY_EPROTO;
}

bool fr_smsg_item_next(const fr_smsg *m, size_t *pos, fr_smsg_item *out)
{
    list_kind lk;
    if (!list_kind_of(m->type, &lk))
        return false;
    if (m->items) {
        if (*pos >= m->nitems)
            return false;
        *out = m->items[(*pos)++];
        return true;
    }
    if (!m->items_raw || *pos >= m->items_len)
        return false;
    rd r = { m->items_raw, m->items_len, *pos };
    if (rd_item(&r, m->type, out) < 0)
        return false;
    *pos = r.off;
    return true;
}

uint64_t fr_smsg_preferred(const fr_smsg *m, uint32_t i)
{
    assert(i < m->npreferred);
    return m->preferred ? m->preferred[i] : get_le(m->preferred_le + 8 * (size_t)i, 8);
}

/* ---- size and checks (encode side) -------------------------------------- */

/* Bytes of one field of m, after checking its rules. */
static int field_len(const fr_smsg *cm, char k, size_t *len)
{
    fr_smsg *m = (fr_smsg *)cm;   /* only read: the tables hand out members */
    bytes_kind b;
    uint32_t lo, hi;
    uint32_t *w;
    if (u64_field(m, k)) {
        *len = 8;
        return 0;
    }
    if ((w = u32_field(m, k, &lo, &hi))) {
        *len = 4;
        return *w < lo ? FERRY_EINVAL : *w > hi ? FERRY_EMSGSIZE : 0;
    }
    if (bytes_field(m, k, &b)) {
        *len = b.width + (size_t)b.f->n;
        return bytes_check(b.f->p, b.f->n, b.lo, b.hi, b.text);
    }
    switch (k) {
    case 'S':
        *len = 4;
        return m->status < 0 && m->status >= FR_STATUS_MIN ? 0 : FERRY_EINVAL;
    case 'F':
        *len = 1;
        return 0;
    case 'x':
        if (m->npreferred > FR_SMSG_PREFERRED_MAX)
            return FERRY_EMSGSIZE;
        if (m->npreferred && !m->preferred && !m->preferred_le)
            return FERRY_EINVAL;
        *len = 2 + 8 * (size_t)m->npreferred;
        return 0;
    case 'y':
        if (m->nrep > FR_SMSG_REPLICAS_MAX)
            return FERRY_EMSGSIZE;
        *len = 1 + REPLICA_LEN * (size_t)m->nrep;
        return 0;
    default:
        break;
    }
    /* X, E, Q: a list */
    list_kind lk;
    if (!list_kind_of(m->type, &lk))
        return FERRY_EINVAL;
    if (m->nitems > lk.max)
        return FERRY_EMSGSIZE;
    size_t total = lk.count_width;
    if (m->items) {
        for (uint32_t i = 0; i < m->nitems; i++) {
            int rc = item_check(m->type, &m->items[i]);
            if (rc < 0)
                return rc;
            total += item_len(m->type, &m->items[i]);
            if (total > FR_SMSG_BODY_MAX)
                return FERRY_EMSGSIZE;
        }
    } else {
        if ((m->nitems || m->items_len) && !m->items_raw)
            return FERRY_EINVAL;
        if (m->items_len > FR_SMSG_BODY_MAX)
            return FERRY_EMSGSIZE;
        int rc = list_scan(m->type, m->items_raw, m->items_len, m->nitems);
        if (rc < 0)
            return rc == FERRY_EPROTO ? FERRY_EINVAL : rc;
        total += m->items_len;
    }
    *len = total;
    return 0;
}

int fr_smsg_body_len(const fr_smsg *m, size_t *len)
{
    assert(m && len);
    const smsg_def *d = def_of(m->type);
    if (!d)
        return FERRY_EINVAL;
    size_t total = 0;
    for (const char *k = d->fields; *k; k++) {
        size_t fl;
        int rc = field_len(m, *k, &fl);
        if (rc < 0)
            return rc;
        total += fl;
        if (total > FR_SMSG_BODY_MAX)
            return FERRY_EMSGSIZE;
    }
    *len = total;
    return 0;
}

/* ---- encode ---------------------------------------------------------------- */

static size_t put_bytes(uint8_t *p, unsigned width, fr_sbytes b)
{
    put_le(p, b.n, width);
    if (b.n)
        memcpy(p + width, b.p, b.n);
    return width + (size_t)b.n;
}

static size_t put_item(uint8_t *p, uint16_t type, const fr_smsg_item *it)
{
    size_t o = 0;
    if (type == FR_SMSG_EVENTS) {
        put_le(p, it->id, 8);
        p[8] = it->deleted;
        o = 9;
    } else if (type == FR_SMSG_RECORDS) {
        put_le(p, it->id, 8);
        put_le(p + 8, it->deliveries, 4);
        o = 12;
    }
    if (type != FR_SMSG_RECORDS)
        o += put_bytes(p + o, 2, it->key);
    if (type != FR_SMSG_KEYS)
        o += put_bytes(p + o, 4, it->val);
    return o;
}

/* Write field k (already checked by field_len); returns its length. */
static size_t put_field(uint8_t *p, const fr_smsg *cm, char k)
{
    fr_smsg *m = (fr_smsg *)cm;
    bytes_kind b;
    uint32_t lo, hi;
    uint64_t *q;
    uint32_t *w;
    size_t o;
    if ((q = u64_field(m, k))) {
        put_le(p, *q, 8);
        return 8;
    }
    if ((w = u32_field(m, k, &lo, &hi))) {
        put_le(p, *w, 4);
        return 4;
    }
    if (bytes_field(m, k, &b))
        return put_bytes(p, b.width, *b.f);
    switch (k) {
    case 'S':
        put_le(p, (uint32_t)m->status, 4);
        return 4;
    case 'F':
        p[0] = m->flag;
        return 1;
    case 'x':
        put_le(p, m->npreferred, 2);
        for (uint32_t i = 0; i < m->npreferred; i++)
            put_le(p + 2 + 8 * (size_t)i, fr_smsg_preferred(m, i), 8);
        return 2 + 8 * (size_t)m->npreferred;
    case 'y':
        p[0] = (uint8_t)m->nrep;
        o = 1;
        for (uint32_t i = 0; i < m->nrep; i++, o += REPLICA_LEN) {
            const fr_smsg_replica *r = &m->rep[i];
            put_le(p + o, r->segment, 8);
            put_le(p + o + 8, r->node, 8);
            put_le(p + o + 16, r->offset, 8);
            put_le(p + o + 24, r->length, 8);
            p[o + 32] = r->preferred;
        }
        return o;
    default:
        break;
    }
    put_le(p, m->nitems, 4);
    o = 4;
    if (m->items) {
        for (uint32_t i = 0; i < m->nitems; i++)
            o += put_item(p + o, m->type, &m->items[i]);
    } else if (m->items_len) {
        memcpy(p + o, m->items_raw, m->items_len);
        o += m->items_len;
    }
    return o;
}

int fr_smsg_encode(const fr_smsg *m, uint64_t req_id, uint8_t *out, size_t cap)
{
    assert(m && (out || cap == 0));
    size_t body;
    int rc = fr_smsg_body_len(m, &body);
    if (rc < 0)
        return rc;
    if (cap < FR_WIRE_HDR_LEN || cap - FR_WIRE_HDR_LEN < body)
        return FERRY_EMSGSIZE;
    /* body <= FR_SMSG_BODY_MAX (64 MiB): the total fits an int and a u32. */
    fr_wire_hdr_encode(out, m->type, req_id, (uint32_t)body);
    uint8_t *p = out + FR_WIRE_HDR_LEN;
    const smsg_def *d = def_of(m->type);
    size_t o = 0;
    for (const char *k = d->fields; *k; k++)
        o += put_field(p + o, m, *k);
    assert(o == body);
    return (int)(FR_WIRE_HDR_LEN + body);
}

/* ---- decode ---------------------------------------------------------------- */

static int rd_field(rd *r, fr_smsg *m, char k)
{
    bytes_kind b;
    uint32_t lo, hi;
    uint64_t *q;
    uint32_t *w;
    if ((q = u64_field(m, k))) {
        if (!rd_has(r, 8))
            return FERRY_EPROTO;
        *q = rd_int(r, 8);
        return 0;
    }
    if ((w = u32_field(m, k, &lo, &hi))) {
        if (!rd_has(r, 4))
            return FERRY_EPROTO;
        *w = (uint32_t)rd_int(r, 4);
        return *w < lo ? FERRY_EPROTO : *w > hi ? FERRY_EMSGSIZE : 0;
    }
    if (bytes_field(m, k, &b))
        return rd_bytes(r, b.width, b.lo, b.hi, b.text, b.f);
    switch (k) {
    case 'S':
        if (!rd_has(r, 4))
            return FERRY_EPROTO;
        m->status = status_of((uint32_t)rd_int(r, 4));
        return m->status < 0 && m->status >= FR_STATUS_MIN ? 0 : FERRY_EPROTO;
    case 'F': {
        if (!rd_has(r, 1))
            return FERRY_EPROTO;
        uint64_t f = rd_int(r, 1);
        m->flag = f == 1;
        return f <= 1 ? 0 : FERRY_EPROTO;
    }
    case 'x': {
        if (!rd_has(r, 2))
            return FERRY_EPROTO;
        uint64_t n = rd_int(r, 2);
        if (n > FR_SMSG_PREFERRED_MAX)
            return FERRY_EMSGSIZE;
        if (!rd_has(r, 8 * (size_t)n))
            return FERRY_EPROTO;
        m->npreferred = (uint32_t)n;
        m->preferred_le = n ? r->p + r->off : NULL;
        r->off += 8 * (size_t)n;
        return 0;
    }
    case 'y': {
        if (!rd_has(r, 1))
            return FERRY_EPROTO;
        uint64_t n = rd_int(r, 1);
        if (n > FR_SMSG_REPLICAS_MAX)
            return FERRY_EMSGSIZE;
        if (!rd_has(r, REPLICA_LEN * (size_t)n))
            return FERRY_EPROTO;
        m->nrep = (uint32_t)n;
        for (uint32_t i = 0; i < n; i++) {
            fr_smsg_replica *rp = &m->rep[i];
            rp->segment = rd_int(r, 8);
            rp->node = rd_int(r, 8);
            rp->offset = rd_int(r, 8);
            rp->length = rd_int(r, 8);
            uint64_t f = rd_int(r, 1);
            if (f > 1)
                return FERRY_EPROTO;
            rp->preferred = f == 1;
        }
        return 0;
    }
    default:
        break;
    }
    list_kind lk;
    if (!list_kind_of(m->type, &lk))
        return FERRY_EPROTO;
    if (!rd_has(r, lk.count_width))
        return FERRY_EPROTO;
    uint64_t n = rd_int(r, lk.count_width);
    if (n > lk.max)
        return FERRY_EMSGSIZE;
    /* Each entry takes at least min_entry bytes: a count the input cannot
     * hold is refused before any entry is walked. */
    if ((r->n - r->off) / lk.min_entry < n)
        return FERRY_EPROTO;
    size_t start = r->off;
    fr_smsg_item it;
    for (uint64_t i = 0; i < n; i++) {
        int rc = rd_item(r, m->type, &it);
        if (rc < 0)
            return rc;
    }
    m->nitems = (uint32_t)n;
    m->items_raw = n ? r->p + start : NULL;
    m->items_len = r->off - start;
    return 0;
}

int fr_smsg_decode(const fr_frame_hdr *hdr, const uint8_t *body, size_t n, fr_smsg *out)
{
    assert(hdr && out && (body || n == 0));
    const smsg_def *d = def_of(hdr->type);
    if (!d)
        return FERRY_EPROTO;
    if (hdr->len > FR_SMSG_BODY_MAX)
        return FERRY_EMSGSIZE;
    if (n < hdr->len)
        return FERRY_EPROTO;
    fr_smsg m;
    memset(&m, 0, sizeof m);
    m.type = hdr->type;
    rd r = { body, hdr->len, 0 };
    for (const char *k = d->fields; *k; k++) {
        int rc = rd_field(&r, &m, *k);
        if (rc < 0)
            return rc;
    }
    if (r.off != r.n)
        return FERRY_EPROTO;   /* trailing bytes */
    *out = m;
    return 0;
}

/* ---- the epoch trailer ---------------------------------------------------- */

int fr_smsg_encode_epoch(const fr_smsg *m, uint64_t req_id, uint64_t epoch, uint8_t *out,
                         size_t cap)
{
    size_t body;
    int rc = fr_smsg_body_len(m, &body);
    if (rc < 0)
        return rc;
    if (body > FR_SMSG_BODY_MAX - FR_SMSG_EPOCH_LEN)
        return FERRY_EMSGSIZE;
    if (cap < FR_WIRE_HDR_LEN + FR_SMSG_EPOCH_LEN || cap - FR_WIRE_HDR_LEN - FR_SMSG_EPOCH_LEN < body)
        return FERRY_EMSGSIZE;
    int n = fr_smsg_encode(m, req_id, out, cap);
    if (n < 0)
        return n;
    fr_wire_hdr_encode(out, m->type, req_id, (uint32_t)(body + FR_SMSG_EPOCH_LEN));
    for (int i = 0; i < 8; i++)
        out[n + i] = (uint8_t)(epoch >> (8 * i));
    return n + FR_SMSG_EPOCH_LEN;
}

int fr_smsg_decode_epoch(const fr_frame_hdr *hdr, const uint8_t *body, size_t n, fr_smsg *out,
                         uint64_t *epoch)
{
    assert(hdr && out && epoch && (body || n == 0));
    if (hdr->len < FR_SMSG_EPOCH_LEN || n < hdr->len)
        return FERRY_EPROTO;
    fr_frame_hdr h = *hdr;
    h.len -= FR_SMSG_EPOCH_LEN;
    int rc = fr_smsg_decode(&h, body, h.len, out);
    if (rc < 0)
        return rc;
    uint64_t e = 0;
    for (int i = 0; i < 8; i++)
        e |= (uint64_t)body[h.len + i] << (8 * i);
    *epoch = e;
    return 0;
}
