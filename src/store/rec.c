/* Log record codec, driven by one layout table per type (see store_int.h).
 * The table is the single description of every record: encoder, size and
 * decoder all walk it, so they cannot disagree. */
#include <string.h>

#include "store/store_int.h"

enum { F_K = 1, F_V, F_Q, F_W, F_B, F_S, F_R, F_I };
typedef struct { uint8_t kind; uint16_t off; } field;
typedef struct { const char *name; uint8_t n; field f[10]; } layout;

#define K(m) { F_K, offsetof(fr_rec, m) }
#define V(m) { F_V, offsetof(fr_rec, m) }
#define Q(m) { F_Q, offsetof(fr_rec, m) }
#define W(m) { F_W, offsetof(fr_rec, m) }
#define B(m) { F_B, offsetof(fr_rec, m) }
#define S(m) { F_S, offsetof(fr_rec, m) }
#define R { F_R, 0 }
#define I { F_I, 0 }

static const layout layouts[] = {
    [FR_REC_SEG_MOUNT] = { "SEG_MOUNT", 4, { Q(id), Q(node), Q(size), Q(granule) } },
    [FR_REC_SEG_UNMOUNT] = { "SEG_UNMOUNT", 2, { Q(id), Q(time) } },
    [FR_REC_NODE_DEAD] = { "NODE_DEAD", 2, { Q(node), Q(time) } },
    [FR_REC_PUT_START] = { "PUT_START", 5, { K(key), Q(size), Q(time), B(flag), R } },
    [FR_REC_PUT_END] = { "PUT_END", 1, { K(key) } },
    [FR_REC_PUT_REVOKE] = { "PUT_REVOKE", 1, { K(key) } },
    [FR_REC_OBJ_EVICT] = { "OBJ_EVICT", 1, { K(key) } },
    [FR_REC_OBJ_REMOVE] = { "OBJ_REMOVE", 1, { K(key) } },
    [FR_REC_OBJ_LEASE] = { "OBJ_LEASE", 2, { K(key), Q(until) } },
    [FR_REC_KV_PUT] = { "KV_PUT", 2, { K(key), V(val) } },
    [FR_REC_KV_DEL] = { "KV_DEL", 1, { K(key) } },
    [FR_REC_BAR_ARRIVE] = { "BAR_ARRIVE", 3, { K(key), K(val), W(count) } },
    [FR_REC_BAR_LEAVE] = { "BAR_LEAVE", 2, { K(key), K(val) } },
    [FR_REC_Q_CONFIG] = { "Q_CONFIG", 2, { K(key), Q(bound) } },
    [FR_REC_Q_PUSH] = { "Q_PUSH", 2, { K(key), V(val) } },
    [FR_REC_Q_POP] = { "Q_POP", 2, { Q(until), I } },
    [FR_REC_Q_ACK] = { "Q_ACK", 1, { Q(id) } },
    [FR_REC_Q_NACK] = { "Q_NACK", 1, { Q(id) } },
    [FR_REC_Q_EXPIRE] = { "Q_EXPIRE", 1, { Q(time) } },
    [FR_REC_SNAP_STATE] = { "SNAP_STATE", 4, { Q(rev), Q(rev2), Q(id), Q(seq) } },
    [FR_REC_SNAP_OBJ] = { "SNAP_OBJ", 10,
        { K(key), Q(size), S(state), B(flag), Q(until), Q(seq), Q(time), Q(node), Q(time2), R } },
    [FR_REC_SNAP_KV] = { "SNAP_KV", 5, { K(key), V(val), Q(rev), Q(rev2), Q(version) } },
    [FR_REC_SNAP_KV_EVENT] = { "SNAP_KV_EVENT", 4, { Q(rev), S(state), K(key), V(val) } },
    [FR_REC_SNAP_BAR] = { "SNAP_BAR", 3, { K(key), W(count), Q(seq) } },
    [FR_REC_SNAP_BAR_MEMBER] = { "SNAP_BAR_MEMBER", 2, { K(key), K(val) } },
    [FR_REC_SNAP_QUEUE] = { "SNAP_QUEUE", 2, { K(key), Q(bound) } },
    [FR_REC_SNAP_QREC] = { "SNAP_QREC", 6, { Q(id), K(key), S(state), W(count), Q(until), V(val) } },
    [FR_REC_SNAP_END] = { "SNAP_END", 1, { Q(count) } },
};
#define NLAYOUTS (sizeof(layouts) / sizeof(layouts[0]))

static const layout *layout_of(uint16_t type)
{
    if (type >= NLAYOUTS || layouts[type].name == NULL)
        return NULL;
    return &layouts[type];
}

const char *fr_rec_type_name(uint16_t type)
{
    const layout *l = layout_of(type);
    return l != NULL ? l->name : "?";
}

static const fr_span *span_at(const fr_rec *r, const field *f)
{
    return (const fr_span *)(const void *)((const char *)r + f->off);
}

static uint64_t u64_at(const fr_rec *r, const field *f)
{
    return *(const uint64_t *)(const void *)((const char *)r + f->off);
}

static bool name_ok(const char *p, uint64_t n)
{
    return p != NULL && n >= 1 && n <= FR_KEY_MAX && memchr(p, 0, n) == NULL;
}

/* Size of one field, or 0 when its value cannot be encoded. */
static size_t field_size(const fr_rec *r, const field *f)
{
    const fr_span *s;
    uint64_t v;
    switch (f->kind) {
    case F_K:
        s = span_at(r, f);
        return name_ok(s->p, s->n) ? 2 + (size_t)s->n : 0;
    case F_V:
        s = span_at(r, f);
        return s->n <= FR_VALUE_MAX && (s->p != NULL || s->n == 0) ? 4 + (size_t)s->n : 0;
    case F_Q:
        return 8;
    case F_W:
        return u64_at(r, f) <= UINT32_MAX ? 4 : 0;
    case F_B:
        return u64_at(r, f) <= 1 ? 1 : 0;
    case F_S:
        return u64_at(r, f) <= UINT8_MAX ? 1 : 0;
    case F_R:
        return r->nrep <= FR_MAX_REPLICAS ? 1 + 16 * (size_t)r->nrep : 0;
    case F_I:
        v = r->nids;
        return v >= 1 && v <= FR_POP_MAX && (r->ids != NULL || r->ids_le != NULL) ? 4 + 8 * (size_t)v : 0;
    default:
        return 0;
    }
}

size_t fr_rec_size(const fr_rec *r)
{
    const layout *l = r != NULL ? layout_of(r->type) : NULL;
    if (l == NULL)
        return 0;
    size_t n = 2;
    for (unsigned i = 0; i < l->n; i++) {
        size_t k = field_size(r, &l->f[i]);
        if (k == 0)
            return 0;
        n += k;
    }
    return n;
}

static uint8_t *put_le(uint8_t *p, uint64_t v, unsigned bytes)
{
    for (unsigned i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + bytes;
}

static uint64_t get_le(const uint8_t *p, unsigned bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int fr_rec_encode(const fr_rec *r, uint8_t *buf, size_t cap)
{
    size_t need = fr_rec_size(r);
    if (need == 0)
        return FERRY_EINVAL;
    if (buf == NULL || cap < need || need > INT32_MAX)
        return FERRY_EMSGSIZE;
    const layout *l = layout_of(r->type);
    uint8_t *p = put_le(buf, r->type, 2);
    for (unsigned i = 0; i < l->n; i++) {
        const field *f = &l->f[i];
        const fr_span *s;
        switch (f->kind) {
        case F_K:
        case F_V:
            s = span_at(r, f);
            p = put_le(p, s->n, f->kind == F_K ? 2 : 4);
            if (s->n != 0)
                memcpy(p, s->p, s->n);
            p += s->n;
            break;
        case F_Q:
            p = put_le(p, u64_at(r, f), 8);
            break;
        case F_W:
            p = put_le(p, u64_at(r, f), 4);
            break;
        case F_B:
        case F_S:
            p = put_le(p, u64_at(r, f), 1);
            break;
        case F_R:
            p = put_le(p, r->nrep, 1);
            for (uint32_t k = 0; k < r->nrep; k++) {
                p = put_le(p, r->rep[k].seg, 8);
                p = put_le(p, r->rep[k].off, 8);
            }
            break;
        case F_I:
            p = put_le(p, r->nids, 4);
            for (uint32_t k = 0; k < r->nids; k++)
                p = put_le(p, fr_rec_id(r, k), 8);
            break;
        }
    }
    return (int)(p - buf);
}

/* A bounded reader: every take checks the bytes left first. */
typedef struct { const uint8_t *p; size_t left; } reader;

static bool take(reader *rd, size_t n, const uint8_t **out)
{
    if (rd->left < n)
        return false;
    *out = rd->p;
    rd->p += n;
    rd->left -= n;
    return true;
}

static bool take_le(reader *rd, unsigned bytes, uint64_t *v)
{
    const uint8_t *p;
    if (!take(rd, bytes, &p))
        return false;
    *v = get_le(p, bytes);
    return true;
}

static bool dec_field(reader *rd, const field *f, fr_rec *r)
{
    uint64_t v, *dst = (uint64_t *)(void *)((char *)r + f->off);
    fr_span *s = (fr_span *)(void *)((char *)r + f->off);
    const uint8_t *p;
    switch (f->kind) {
    case F_K:
    case F_V:
        if (!take_le(rd, f->kind == F_K ? 2 : 4, &v) || !take(rd, (size_t)v, &p))
            return false;
        if (f->kind == F_K ? !name_ok((const char *)p, v) : v > FR_VALUE_MAX)
            return false;
        s->p = (const char *)p;
        s->n = (uint32_t)v;
        return true;
    case F_Q:
        return take_le(rd, 8, dst);
    case F_W:
        return take_le(rd, 4, dst);
    case F_B:
        return take_le(rd, 1, dst) && *dst <= 1;
    case F_S:
        return take_le(rd, 1, dst);
    case F_R:
        if (!take_le(rd, 1, &v) || v > FR_MAX_REPLICAS)
            return false;
        r->nrep = (uint32_t)v;
        for (uint32_t k = 0; k < r->nrep; k++)
            if (!take_le(rd, 8, &r->rep[k].seg) || !take_le(rd, 8, &r->rep[k].off))
                return false;
        return true;
    case F_I:
        if (!take_le(rd, 4, &v) || v < 1 || v > FR_POP_MAX || !take(rd, 8 * (size_t)v, &p))
            return false;
        r->nids = (uint32_t)v;
        r->ids_le = p;
        return true;
    default:
        return false;
    }
}

int fr_rec_decode(const uint8_t *buf, size_t len, fr_rec *r)
{
    uint64_t type;
    if (r == NULL || (buf == NULL && len != 0))
        return FERRY_EINVAL;
    memset(r, 0, sizeof(*r));
    reader rd = { buf, len };
    if (!take_le(&rd, 2, &type))
        return FERRY_EPROTO;
    const layout *l = layout_of((uint16_t)type);
    if (l == NULL)
        return FERRY_EPROTO;
    r->type = (uint16_t)type;
    for (unsigned i = 0; i < l->n; i++)
        if (!dec_field(&rd, &l->f[i], r))
            return FERRY_EPROTO;
    return rd.left == 0 ? 0 : FERRY_EPROTO;
}

uint64_t fr_rec_id(const fr_rec *r, uint32_t i)
{
    if (r->ids != NULL)
        return r->ids[i];
    return get_le(r->ids_le + 8 * (size_t)i, 8);
}
