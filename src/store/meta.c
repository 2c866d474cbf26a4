/* The metadata core: construction, the commit/apply path every mutation
 * takes, replay, and segments. Objects, KV and queues live in their own
 * files; this one dispatches records to them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/meta_int.h"

void fr_meta_config_default(fr_meta_config *cfg)
{
    cfg->high_watermark = 0.95;
    cfg->granule = 64;
    cfg->align = 64;
    cfg->kv_history_events = 65536;
    cfg->kv_history_bytes = 64u << 20;
    cfg->pending_timeout_ms = 0;
}

static bool pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

int fr_meta_new(const fr_meta_config *cfg, fr_meta **out)
{
    fr_meta_config c;
    if (out == NULL)
        return FERRY_EINVAL;
    if (cfg != NULL)
        c = *cfg;
    else
        fr_meta_config_default(&c);
    if (!(c.high_watermark > 0.0 && c.high_watermark <= 1.0) || !pow2(c.granule) ||
        !pow2(c.align) || c.kv_history_events == 0)
        return FERRY_EINVAL;
    fr_meta *m = fr_calloc(1, sizeof(*m));
    if (m == NULL)
        return FERRY_ENOMEM;
    m->cfg = c;
    fr_umap_init(&m->segs);
    fr_smap_init(&m->objs);
    fr_dlist_init(&m->pending);
    fr_smap_init(&m->kv);
    fr_smap_init(&m->bars);
    fr_smap_init(&m->queues);
    fr_umap_init(&m->qrecs);
    fr_avl_init(&m->qleases, meta_qlease_cmp);
    m->q_next_id = 1;
    *out = m;
    return 0;
}

void fr_meta_destroy(fr_meta *m)
{
    if (m == NULL)
        return;
    meta_obj_free_all(m);
    meta_slot_free_all(m);
    size_t pos = 0;
    meta_seg *s;
    while ((s = fr_umap_next(&m->segs, &pos)) != NULL) {
        fr_segalloc_destroy(s->alloc);
        fr_free(s);
    }
    fr_umap_fini(&m->segs);
    meta_kv_free_all(m);
    meta_bar_free_all(m);
    meta_queue_free_all(m);
    fr_free(m->enc);
    fr_free(m->scratch);
    fr_free(m->cand);
    fr_free(m->ids);
    fr_free(m);
}

void fr_meta_set_sink(fr_meta *m, fr_rec_sink_fn fn, void *ctx)
{
    m->sink = fn;
    m->sink_ctx = ctx;
}

const char *fr_meta_errmsg(const fr_meta *m)
{
    return m->err;
}

uint64_t fr_meta_records(const fr_meta *m)
{
    return m->nrecords;
}

int meta_fail(fr_meta *m, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof(m->err), fmt, ap);
    va_end(ap);
    return code;
}

uint64_t meta_now(fr_meta *m, uint64_t now)
{
    if (now > m->clock)
        m->clock = now;
    return m->clock;
}

int meta_check_name(fr_meta *m, const char *what, const char *name)
{
    if (name == NULL || name[0] == '\0')
        return meta_fail(m, FERRY_EINVAL, "%s is empty", what);
    if (strnlen(name, FR_KEY_MAX + 1) > FR_KEY_MAX)
        return meta_fail(m, FERRY_EINVAL, "%s is longer than %d bytes", what, FR_KEY_MAX);
    return 0;
}

int meta_scratch(fr_meta *m, size_t n)
{
    return fr_grow((void **)&m->scratch, &m->scratch_cap, n, sizeof(void *));
}

bool meta_prefix(const char *key, const char *prefix, size_t plen)
{
    return strncmp(key, prefix, plen) == 0;
}

int meta_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ---- apply / commit / replay ------------------------------------------ */

static int seg_apply(fr_meta *m, const fr_rec *r);

static bool snapshot_type(uint16_t t)
{
    return t >= FR_REC_SNAP_STATE && t <= FR_REC_SNAP_END;
}

static int snap_state_apply(fr_meta *m, const fr_rec *r)
{
    if (r->id == 0 || r->rev2 > r->rev)
        return meta_fail(m, FERRY_EINVAL, "bad snapshot state");
    m->kv_rev = r->rev;
    m->kv_compact_rev = r->rev2;
    m->q_next_id = r->id;
    m->touch_seq = r->seq;
    return 0;
}

static int meta_apply(fr_meta *m, const fr_rec *r)
{
    /* SEG_MOUNT belongs to both worlds; the rest to one. */
    if (r->type != FR_REC_SEG_MOUNT && snapshot_type(r->type) != m->loading)
        return meta_fail(m, FERRY_EINVAL, "%s record %s a snapshot", fr_rec_type_name(r->type),
                         m->loading ? "inside" : "outside");
    switch (r->type) {
    case FR_REC_SEG_MOUNT:
    case FR_REC_SEG_UNMOUNT:
    case FR_REC_NODE_DEAD:
        return seg_apply(m, r);
    case FR_REC_PUT_START:
    case FR_REC_PUT_END:
    case FR_REC_PUT_REVOKE:
    case FR_REC_OBJ_EVICT:
    case FR_REC_OBJ_REMOVE:
    case FR_REC_OBJ_LEASE:
    case FR_REC_SNAP_OBJ:
        return meta_obj_apply(m, r);
    case FR_REC_KV_PUT:
    case FR_REC_KV_DEL:
    case FR_REC_SNAP_KV:
    case FR_REC_SNAP_KV_EVENT:
        return meta_kv_apply(m, r);
    case FR_REC_BAR_ARRIVE:
    case FR_REC_BAR_LEAVE:
    case FR_REC_SNAP_BAR:
    case FR_REC_SNAP_BAR_MEMBER:
        return meta_bar_apply(m, r);
    case FR_REC_Q_CONFIG:
    case FR_REC_Q_PUSH:
    case FR_REC_Q_POP:
    case FR_REC_Q_ACK:
    case FR_REC_Q_NACK:
    case FR_REC_Q_EXPIRE:
    case FR_REC_SNAP_QUEUE:
    case FR_REC_SNAP_QREC:
        return meta_queue_apply(m, r);
    case FR_REC_SNAP_STATE:
        return snap_state_apply(m, r);
    case FR_REC_SNAP_END:
        if (r->count != m->load_count)
            return meta_fail(m, FERRY_EINVAL, "snapshot ends after %llu records, not %llu",
                             (unsigned long long)m->load_count, (unsigned long long)r->count);
        if (meta_kv_finish_load(m) < 0)
            return FERRY_EINVAL;
        if (meta_obj_finish_load(m) < 0)
            return FERRY_ENOMEM;
        m->loading = false;
        return 0;
    default:
        return meta_fail(m, FERRY_EINVAL, "unknown record type %u", r->type);
    }
}

int meta_commit(fr_meta *m, const fr_rec *r)
{
    if (m->broken)
        return meta_fail(m, FERRY_EIO, "the metadata log failed earlier: restart to recover");
    if (m->loading)
        return meta_fail(m, FERRY_ESTATE, "a snapshot is being loaded");
    size_t n = fr_rec_size(r);
    if (n == 0)
        return meta_fail(m, FERRY_EINVAL, "%s record cannot be encoded", fr_rec_type_name(r->type));
    if (fr_grow((void **)&m->enc, &m->enc_cap, n, 1) < 0)
        return meta_fail(m, FERRY_ENOMEM, "out of memory encoding a record");
    int len = fr_rec_encode(r, m->enc, m->enc_cap);
    if (len < 0)
        return meta_fail(m, len, "%s record cannot be encoded", fr_rec_type_name(r->type));
    int rc = meta_apply(m, r);
    if (rc < 0)
        return rc;
    m->nrecords++;
    if (m->sink != NULL) {
        int s = m->sink(m->sink_ctx, m->enc, (size_t)len);
        if (s < 0) {
            m->broken = true;
            return meta_fail(m, FERRY_EIO, "logging a %s record failed (%s): restart to recover",
                             fr_rec_type_name(r->type), ferry_strerror(s));
        }
    }
    return 0;
}

int fr_meta_replay(fr_meta *m, const uint8_t *rec, size_t len)
{
    fr_rec r;
    int rc = fr_rec_decode(rec, len, &r);
    if (rc < 0)
        return meta_fail(m, FERRY_EPROTO, "malformed record (%zu bytes)", len);
    rc = meta_apply(m, &r);
    if (rc == FERRY_ENOMEM)
        return rc;
    if (rc < 0) {
        char why[sizeof(m->err)];
        memcpy(why, m->err, sizeof(why));
        return meta_fail(m, FERRY_ECORRUPT, "%s record does not apply: %s",
                         fr_rec_type_name(r.type), why);
    }
    if (m->loading)      /* SNAP_END, which ends loading, is not counted */
        m->load_count++;
    m->nrecords++;
    return 0;
}

int fr_meta_load_begin(fr_meta *m)
{
    if (m->segs.n || m->objs.n || m->kv.n || m->bars.n || m->queues.n || m->kv_rev ||
        m->hist_n || m->loading)
        return meta_fail(m, FERRY_ESTATE, "a snapshot loads only into an empty state");
    m->loading = true;
    m->load_count = 0;
    return 0;
}

bool fr_meta_loading(const fr_meta *m)
{
    return m->loading;
}

/* ---- segments ------------------------------------------------------------ */

static int seg_mount_apply(fr_meta *m, const fr_rec *r)
{
    if (fr_umap_get(&m->segs, r->id) != NULL)
        return meta_fail(m, FERRY_EEXIST, "segment %016llx is already mounted",
                         (unsigned long long)r->id);
    if (!pow2(r->granule) || r->size < r->granule)
        return meta_fail(m, FERRY_EINVAL, "segment %016llx: size %llu, granule %llu",
                         (unsigned long long)r->id, (unsigned long long)r->size,
                         (unsigned long long)r->granule);
    meta_seg *s = fr_calloc(1, sizeof(*s));
    if (s == NULL || fr_umap_reserve(&m->segs, 1) < 0 ||
        fr_segalloc_new(r->size, r->granule, &s->alloc) < 0) {
        fr_free(s);
        return meta_fail(m, FERRY_ENOMEM, "out of memory mounting a segment");
    }
    s->id = r->id;
    s->node = r->node;
    s->granule = r->granule;
    fr_segalloc_stats st;
    fr_segalloc_get_stats(s->alloc, &st);
    s->size = st.size;
    s->hw_limit = (uint64_t)((double)s->size * m->cfg.high_watermark);
    fr_dlist_init(&s->reps);
    fr_dlist_init(&s->lru);
    fr_umap_put(&m->segs, s->id, s);
    return 0;
}

static void seg_drop(fr_meta *m, meta_seg *s, uint64_t node, uint64_t now)
{
    meta_drop_seg(m, s, node, now);
    fr_umap_del(&m->segs, s->id);
    fr_segalloc_destroy(s->alloc);
    fr_free(s);
}

static int seg_apply(fr_meta *m, const fr_rec *r)
{
    meta_seg *s;
    size_t pos = 0, n = 0;
    m->last_lost = 0;
    switch (r->type) {
    case FR_REC_SEG_MOUNT:
        return seg_mount_apply(m, r);
    case FR_REC_SEG_UNMOUNT:
        s = fr_umap_get(&m->segs, r->id);
        if (s == NULL)
            return meta_fail(m, FERRY_ENOENT, "segment %016llx is not mounted",
                             (unsigned long long)r->id);
        meta_now(m, r->time);
        seg_drop(m, s, s->node, r->time);
        return 0;
    default: /* NODE_DEAD */
        if (meta_scratch(m, m->segs.n) < 0)
            return meta_fail(m, FERRY_ENOMEM, "out of memory");
        while ((s = fr_umap_next(&m->segs, &pos)) != NULL)
            if (s->node == r->node)
                m->scratch[n++] = s;
        if (n == 0)
            return meta_fail(m, FERRY_ENOENT, "node %016llx has no mounted segment",
                             (unsigned long long)r->node);
        meta_now(m, r->time);
        for (size_t i = 0; i < n; i++)
            seg_drop(m, m->scratch[i], r->node, r->time);
        return 0;
    }
}

int fr_meta_mount(fr_meta *m, uint64_t seg_id, uint64_t node, uint64_t size, uint64_t granule)
{
    fr_rec r = { .type = FR_REC_SEG_MOUNT, .id = seg_id, .node = node, .size = size,
                 .granule = granule != 0 ? granule : m->cfg.granule };
    return meta_commit(m, &r);
}

int fr_meta_unmount(fr_meta *m, uint64_t seg_id, uint64_t now_ms, uint64_t *lost)
{
    fr_rec r = { .type = FR_REC_SEG_UNMOUNT, .id = seg_id, .time = meta_now(m, now_ms) };
    int rc = meta_commit(m, &r);
    if (rc == 0 && lost != NULL)
        *lost = m->last_lost;
    return rc;
}

int fr_meta_node_dead(fr_meta *m, uint64_t node, uint64_t now_ms, uint64_t *lost)
{
    fr_rec r = { .type = FR_REC_NODE_DEAD, .node = node, .time = meta_now(m, now_ms) };
    int rc = meta_commit(m, &r);
    if (rc == 0 && lost != NULL)
        *lost = m->last_lost;
    return rc;
}

int fr_meta_seg_info(const fr_meta *m, uint64_t seg_id, fr_seg_info *out)
{
    const meta_seg *s = fr_umap_get(&m->segs, seg_id);
    if (s == NULL)
        return FERRY_ENOENT;
    fr_segalloc_stats st;
    fr_segalloc_get_stats(s->alloc, &st);
    out->id = s->id;
    out->node = s->node;
    out->size = st.size;
    out->used = st.used;
    out->largest_free = st.largest_free;
    out->objects = s->nreps;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

size_t fr_meta_segments(const fr_meta *m, uint64_t *ids, size_t cap)
{
    size_t pos = 0, n = 0;
    const meta_seg *s;
    if (ids == NULL || cap < m->segs.n)
        return m->segs.n;
    while ((s = fr_umap_next(&m->segs, &pos)) != NULL)
        ids[n++] = s->id;
    fr_sort(ids, n, sizeof(*ids), cmp_u64);
    return n;
}
