/* Snapshots: the whole state as canonical records, and its digest. */
#include <stdlib.h>
#include <string.h>

#include "store/meta_int.h"

int snap_emit(snap_out *o, const fr_rec *r)
{
    size_t n = fr_rec_size(r);
    if (n == 0)
        return FERRY_EINVAL;
    if (fr_grow((void **)&o->buf, &o->cap, n, 1) < 0)
        return FERRY_ENOMEM;
    int len = fr_rec_encode(r, o->buf, o->cap);
    if (len < 0)
        return len;
    o->count++;
    return o->fn(o->ctx, o->buf, (size_t)len);
}

static int cmp_seg(const void *a, const void *b)
{
    uint64_t x = (*(meta_seg *const *)a)->id, y = (*(meta_seg *const *)b)->id;
    return x < y ? -1 : x > y;
}

static int emit_all(fr_meta *m, snap_out *o)
{
    fr_rec st = { .type = FR_REC_SNAP_STATE, .rev = m->kv_rev, .rev2 = m->kv_compact_rev,
                  .id = m->q_next_id, .seq = m->touch_seq };
    int rc = snap_emit(o, &st);
    if (rc < 0)
        return rc;
    size_t pos = 0, n = 0;
    meta_seg *s;
    if (meta_scratch(m, m->segs.n) < 0)
        return FERRY_ENOMEM;
    while ((s = fr_umap_next(&m->segs, &pos)) != NULL)
        m->scratch[n++] = s;
    fr_sort(m->scratch, n, sizeof(void *), cmp_seg);
    for (size_t i = 0; i < n; i++) {
        s = m->scratch[i];
        fr_rec r = { .type = FR_REC_SEG_MOUNT, .id = s->id, .node = s->node, .size = s->size,
                     .granule = s->granule };
        if ((rc = snap_emit(o, &r)) < 0)
            return rc;
    }
    if ((rc = meta_obj_snapshot(m, o)) < 0 || (rc = meta_kv_snapshot(m, o)) < 0 ||
        (rc = meta_bar_snapshot(m, o)) < 0 || (rc = meta_queue_snapshot(m, o)) < 0)
        return rc;
    fr_rec end = { .type = FR_REC_SNAP_END, .count = o->count };
    return snap_emit(o, &end);
}

int fr_meta_snapshot(fr_meta *m, fr_rec_sink_fn fn, void *ctx)
{
    if (m == NULL || fn == NULL)
        return FERRY_EINVAL;
    if (m->loading)
        return meta_fail(m, FERRY_ESTATE, "a snapshot is being loaded");
    snap_out o = { .m = m, .fn = fn, .ctx = ctx };
    int rc = emit_all(m, &o);
    fr_free(o.buf);
    return rc;
}

static int digest_sink(void *ctx, const uint8_t *rec, size_t len)
{
    uint8_t n[4] = { (uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24) };
    fr_hasher_update(ctx, n, sizeof(n));
    fr_hasher_update(ctx, rec, len);
    return 0;
}

int fr_meta_digest(fr_meta *m, fr_hash128_t *out)
{
    fr_hasher *h = fr_hasher_new(0);
    if (h == NULL)
        return FERRY_ENOMEM;
    int rc = fr_meta_snapshot(m, digest_sink, h);
    if (rc == 0)
        *out = fr_hasher_digest(h);
    fr_hasher_free(h);
    return rc;
}
