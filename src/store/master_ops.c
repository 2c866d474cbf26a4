/* The master's request dispatch: one decoded store request -> one meta call
 * -> one reply queued on the connection (sent after the next commit). */
#include <errno.h>
#include <string.h>

#include "ferry/engine.h"
#include "store/master_int.h"

#define U(x) ((unsigned long long)(x))

#ifndef FERRY_ENOTCONN   /* an errno code, per the convention, until common.h names it */
#define FERRY_ENOTCONN (-ENOTCONN)
#endif

/* A wire name as a C string in out (FR_KEY_MAX + 1 bytes). false: an error
 * reply was queued. */
static bool cname(fr_master_conn *c, uint64_t req_id, fr_sbytes s, char *out, const char *what)
{
    if (s.n > FR_KEY_MAX) {
        fr_master_reply_err(c, req_id, FERRY_EINVAL, 0, "%s longer than %d bytes", what,
                            FR_KEY_MAX);
        return false;
    }
    if (s.n)
        memcpy(out, s.p, s.n);
    out[s.n] = 0;
    return true;
}

static void reply_rev(fr_master_conn *c, uint64_t req_id, uint64_t rev)
{
    fr_smsg r = { .type = FR_SMSG_REVISION, .rev = rev };
    fr_master_reply(c, req_id, &r);
}

/* ---- segments -------------------------------------------------------------- */

/* A live node other than `node` with the same name, or NULL. */
static fr_master_node *same_name(fr_master *m, const char *name, uint64_t node)
{
    if (name[0] == 0)
        return NULL;
    size_t pos = 0;
    fr_master_node *nd;
    while ((nd = fr_umap_next(&m->nodes, &pos)) != NULL)
        if (nd->id != node && strcmp(nd->name, name) == 0)
            return nd;
    return NULL;
}

/* Everything a MOUNT must satisfy before its probe. false: refused. */
static bool mount_valid(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    if (c->role != FR_ROLE_STORE_NODE) {
        fr_master_reply_err(c, id, FERRY_EACCES, 0,
                            "only a node's own connection may mount a segment");
        return false;
    }
    if (q->node == 0) {
        fr_master_reply_err(c, id, FERRY_EINVAL, 0, "node id 0 is reserved");
        return false;
    }
    if (q->key.n > FR_SMSG_NAME_MAX || (q->key.n && memchr(q->key.p, 0, q->key.n) != NULL)) {
        fr_master_reply_err(c, id, FERRY_EINVAL, 0, "a node name is at most %d bytes, no NUL",
                            FR_SMSG_NAME_MAX);
        return false;
    }
    fr_region_desc rd;
    if (fr_region_desc_decode(q->val.p, q->val.n, &rd) < 0) {
        fr_master_reply_err(c, id, FERRY_EINVAL, 0,
                            "segment %016llx: its descriptor (%u bytes) is not a region descriptor",
                            U(q->segment), (unsigned)q->val.n);
        return false;
    }
    if (rd.len < q->size || (rd.flags & FERRY_REMOTE_RW) != FERRY_REMOTE_RW ||
        rd.mem_kind != FERRY_MEM_HOST) {
        fr_master_reply_err(c, id, FERRY_EINVAL, 0,
                            "segment %016llx of %llu bytes: its descriptor covers %llu bytes of %s "
                            "memory, %s; want host memory, readable and writable by peers",
                            U(q->segment), U(q->size), U(rd.len),
                            rd.mem_kind == FERRY_MEM_HOST ? "host" : "device",
                            (rd.flags & FERRY_REMOTE_RW) == FERRY_REMOTE_RW ? "read-write"
                                                                           : "not read-write");
        return false;
    }
    fr_seg_info si;
    if (fr_meta_seg_info(m->meta, q->segment, &si) == 0 && si.node != q->node) {
        fr_master_reply_err(c, id, FERRY_EEXIST, 0,
                            "segment %016llx is already mounted by node %016llx (%llu bytes)",
                            U(q->segment), U(si.node), U(si.size));
        return false;
    }
    char name[FR_SMSG_NAME_MAX + 1] = "";
    if (q->key.n)
        memcpy(name, q->key.p, q->key.n);
    name[q->key.n] = 0;
    const fr_master_node *other = same_name(m, name, q->node);
    if (other != NULL && other->conn != NULL && !other->suspect) {
        fr_master_reply_err(c, id, FERRY_EEXIST, 0,
                            "node name '%s' belongs to live node %016llx (%s); a new incarnation "
                            "may mount once that one is gone", name, U(other->id),
                            other->conn->peer);
        return false;
    }
    return true;
}

static void op_mount(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    if (!mount_valid(c, id, q))
        return;
    int rc = fr_master_probe_start(c, id, q);
    if (rc < 0)
        fr_master_reply_err(c, id, rc, 0, "cannot probe segment %016llx now: %s; mount again",
                            U(q->segment), ferry_strerror(rc));
}

/* The probe answered: mount (or re-attach) and make the node live. */
static void mount_finish(fr_master_conn *c, const fr_master_probe *p)
{
    fr_master *m = c->m;
    uint64_t id = p->req_id;
    fr_master_node *other = same_name(m, p->name, p->node);
    if (other != NULL) {
        if (other->conn != NULL && !other->suspect) {
            fr_master_reply_err(c, id, FERRY_EEXIST, 0, "node name '%s' belongs to live node %016llx",
                                p->name, U(other->id));
            return;
        }
        char why[160];
        snprintf(why, sizeof why, "a new incarnation of node '%s' (%016llx) mounted", p->name,
                 U(p->node));
        fr_master_node_dead(m, other, why);
        if (m->fatal)
            return;
    }
    fr_seg_info si;
    if (fr_meta_seg_info(m->meta, p->segment, &si) == 0) {
        uint64_t g = p->granule ? p->granule : 64;
        if (si.node != p->node || si.size > p->size || p->size - si.size >= g) {
            fr_master_reply_err(c, id, FERRY_EEXIST, 0,
                                "segment %016llx is already mounted by node %016llx (%llu bytes)",
                                U(p->segment), U(si.node), U(si.size));
            return;
        }
        FR_INFO("master", "node %016llx re-attached segment %016llx (%llu bytes)", U(p->node),
                U(p->segment), U(si.size));
    } else {
        int rc = fr_meta_mount(m->meta, p->segment, p->node, p->size, p->granule);
        if (rc < 0) {
            fr_master_reply_meta_err(c, id, rc, 0);
            return;
        }
        FR_INFO("master", "node %016llx%s%s%s mounted segment %016llx (%llu bytes)", U(p->node),
                p->name[0] ? " ('" : "", p->name, p->name[0] ? "')" : "", U(p->segment),
                U(p->size));
    }
    fr_master_seg *s = fr_umap_get(&m->segs, p->segment);
    fr_master_node *nd = fr_master_node_get(m, p->node, true);
    if (s == NULL) {
        if ((s = fr_calloc(1, sizeof *s)) == NULL || fr_umap_put(&m->segs, p->segment, s) < 0) {
            fr_free(s);
            s = NULL;
        } else {
            s->id = p->segment;
        }
    }
    if (s == NULL || nd == NULL) {
        fr_master_reply_err(c, id, FERRY_ENOMEM, 0, "out of memory");
        return;
    }
    s->node = p->node;
    s->attached = true;
    s->desc_len = p->desc_len;
    memcpy(s->desc, p->desc, p->desc_len);
    if (p->name[0])
        snprintf(nd->name, sizeof nd->name, "%s", p->name);
    fr_master_node_heard(c, p->node);
    fr_master_reply_ok(c, id);
}

void fr_master_probes_done(fr_master *m)
{
    pthread_mutex_lock(&m->mu);
    fr_master_probe *p = m->probed;
    m->probed = NULL;
    pthread_mutex_unlock(&m->mu);
    fr_master_mx_op(m, FR_SMSG_MOUNT);
    while (p) {
        fr_master_probe *next = p->next;
        fr_master_conn *c = NULL;
        for (fr_dnode *n = m->conns.next; n != &m->conns && c == NULL; n = n->next) {
            fr_master_conn *x = fr_container_of(n, fr_master_conn, link);
            if (x->serial == p->conn_serial && !x->dead)
                c = x;
        }
        if (c == NULL)
            FR_INFO("master", "node %016llx left before its mount of segment %016llx was probed",
                    U(p->node), U(p->segment));
        else if (p->rc < 0)
            fr_master_reply_err(c, p->req_id, p->rc, 0, "segment %016llx is not mounted: %s",
                                U(p->segment), p->why);
        else
            mount_finish(c, p);
        if (c != NULL && p->rc < 0)
            FR_WARN("master", "refused the mount of segment %016llx from %s: %s", U(p->segment),
                    c->peer, p->why);
        fr_free(p);
        p = next;
    }
}

static void op_unmount(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    fr_seg_info si;
    if (fr_meta_seg_info(m->meta, q->segment, &si) < 0) {
        fr_master_reply_err(c, id, FERRY_ENOENT, 0, "segment %016llx is not mounted", U(q->segment));
        return;
    }
    const fr_master_node *nd = fr_master_node_get(m, si.node, false);
    if (c->role != FR_ROLE_STORE_NODE || nd == NULL || nd->conn != c) {
        fr_master_reply_err(c, id, FERRY_EACCES, 0,
                            "segment %016llx belongs to node %016llx: only that node's own connection "
                            "may unmount it", U(q->segment), U(si.node));
        return;
    }
    uint64_t lost = 0;
    int rc = fr_meta_unmount(m->meta, q->segment, m->now_wall, &lost);
    if (rc < 0) {
        fr_master_reply_meta_err(c, id, rc, 0);
        return;
    }
    fr_free(fr_umap_del(&m->segs, q->segment));
    m->mx.lost += lost;
    FR_INFO("master", "segment %016llx unmounted (%llu objects lost)", U(q->segment), U(lost));
    fr_master_reply_ok(c, id);
}

static void op_segment(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    fr_seg_info si;
    if (fr_meta_seg_info(m->meta, q->segment, &si) < 0) {
        fr_master_reply_err(c, id, FERRY_ENOENT, 0, "segment %016llx is not mounted", U(q->segment));
        return;
    }
    const fr_master_seg *s = fr_umap_get(&m->segs, q->segment);
    if (s == NULL || !s->attached) {
        fr_master_reply_err(c, id, FERRY_ENOTCONN, 0,
                            "segment %016llx of node %016llx has not been re-attached by its node "
                            "since the master restarted",
                            U(q->segment), U(si.node));
        return;
    }
    fr_smsg r = { .type = FR_SMSG_SEGMENT_DESC, .segment = si.id, .node = si.node, .size = si.size };
    r.val.p = s->desc;
    r.val.n = s->desc_len;
    fr_master_reply(c, id, &r);
}

/* ---- objects ----------------------------------------------------------------- */

static void reply_replicas(fr_master_conn *c, uint64_t id, uint16_t type, const fr_obj_desc *d)
{
    fr_smsg r = { .type = type, .size = d->size };
    if (type == FR_SMSG_REPLICAS)
        r.until = d->lease_until;
    r.nrep = d->nrep;
    for (uint32_t i = 0; i < d->nrep && i < FR_SMSG_REPLICAS_MAX; i++)
        r.rep[i] = (fr_smsg_replica){ d->rep[i].segment, d->rep[i].node, d->rep[i].offset,
                                      d->size, d->rep[i].preferred };
    fr_master_mx_objects(c->m, type, d->size, d->lease_until);
    fr_master_reply(c, id, &r);
}

static void op_put_start(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    uint64_t pref[FR_SMSG_PREFERRED_MAX];
    uint32_t np = q->npreferred < FR_SMSG_PREFERRED_MAX ? q->npreferred : FR_SMSG_PREFERRED_MAX;
    for (uint32_t i = 0; i < np; i++)
        pref[i] = fr_smsg_preferred(q, i);
    fr_replicate rc = { .replica_num = q->replica_num, .preferred = pref, .npreferred = np,
                        .hard_pin = q->flag, .slot = q->slot };
    fr_obj_desc d;
    int err = fr_meta_put_start(m->meta, m->k1, q->size, &rc, m->now_wall, &d);
    if (err < 0) {
        fr_master_reply_meta_err(c, id, err, 0);
        return;
    }
    if (c->client != NULL)   /* revoked at once if this client goes away */
        fr_meta_set_writer(m->meta, m->k1, c->client->instance);
    reply_replicas(c, id, FR_SMSG_PLACEMENT, &d);
}

static void op_get(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    fr_obj_desc d;
    int rc;
    if (q->lease_ms > 0) {
        rc = fr_meta_get(m->meta, m->k1, q->lease_ms, m->now_wall, &d);
    } else if ((rc = fr_meta_describe(m->meta, m->k1, &d)) == 0) {   /* where it is, all replicas */
        if (d.state == FR_OBJ_LOST)
            rc = fr_meta_exist(m->meta, m->k1);   /* FERRY_ELOST with its sentence */
        else if (d.state != FR_OBJ_COMPLETE) {
            fr_master_reply_err(c, id, FERRY_ENOENT, 0,
                                "object '%s' is still being written (no put_end yet)", m->k1);
            return;
        }
        if (rc >= 0)
            d.lease_until = 0;
    } else {
        fr_master_reply_err(c, id, FERRY_ENOENT, 0, "no object '%s'", m->k1);
        return;
    }
    if (rc < 0)
        fr_master_reply_meta_err(c, id, rc, 0);
    else
        reply_replicas(c, id, FR_SMSG_REPLICAS, &d);
}

static void op_list(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    fr_keylist kl = { 0 };
    int rc = fr_meta_list(m->meta, m->k1, m->k2[0] ? m->k2 : NULL, q->limit, &kl);
    if (rc < 0) {
        fr_master_reply_meta_err(c, id, rc, 0);
        return;
    }
    if (kl.n > m->items_cap) {
        fr_smsg_item *it = fr_reallocarray(m->items, kl.n, sizeof *it);
        if (it == NULL) {
            fr_free(kl.keys);
            fr_master_reply_err(c, id, FERRY_ENOMEM, 0, "out of memory");
            return;
        }
        m->items = it;
        m->items_cap = kl.n;
    }
    size_t n = 0, bytes = 0;
    bool more = kl.more;
    for (; n < kl.n; n++) {
        size_t len = strlen(kl.keys[n]);
        if (bytes + len + 2 > FR_MASTER_FRAME_BYTES) {
            more = true;
            break;
        }
        bytes += len + 2;
        m->items[n] = (fr_smsg_item){ .key = { (const uint8_t *)kl.keys[n], (uint32_t)len } };
    }
    fr_smsg r = { .type = FR_SMSG_KEYS, .flag = more, .nitems = (uint32_t)n, .items = m->items };
    fr_master_reply(c, id, &r);
    fr_free(kl.keys);
}

/* ---- KV and queues ------------------------------------------------------------ */

static void op_kv(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    uint64_t rev = 0;
    int rc;
    switch (q->type) {
    case FR_SMSG_KV_GET: {
        fr_kv_view v;
        if ((rc = fr_meta_kv_get(m->meta, m->k1, &v)) < 0)
            break;
        fr_smsg r = { .type = FR_SMSG_KV_VALUE, .rev = v.mod_rev, .create_rev = v.create_rev,
                      .version = v.version };
        r.val.p = v.val;
        r.val.n = (uint32_t)v.len;
        fr_master_reply(c, id, &r);
        return;
    }
    case FR_SMSG_KV_PUT:
        rc = fr_meta_kv_put(m->meta, m->k1, q->val.p, q->val.n, &rev);
        break;
    case FR_SMSG_KV_CAS:
        rc = fr_meta_kv_cas(m->meta, m->k1, q->rev, q->val.p, q->val.n, &rev);
        break;
    default:
        rc = fr_meta_kv_delete(m->meta, m->k1, q->rev, &rev);
        break;
    }
    if (rc < 0)
        fr_master_reply_meta_err(c, id, rc, rc == FERRY_ESTATE ? rev : 0);
    else
        reply_rev(c, id, rev);
}

static void op_pop(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    fr_qrec_view *v = fr_calloc(q->limit, sizeof *v);
    fr_smsg_item *it = fr_calloc(q->limit, sizeof *it);
    size_t n = 0;
    int rc = v && it ? fr_meta_queue_pop(m->meta, m->k1, q->limit, q->lease_ms, m->now_wall, v, &n)
                     : FERRY_ENOMEM;
    if (rc < 0) {
        if (rc == FERRY_ENOMEM && !(v && it))
            fr_master_reply_err(c, id, rc, 0, "out of memory");
        else
            fr_master_reply_meta_err(c, id, rc, 0);
        goto out;
    }
    /* One reply frame must hold them all: records past the budget go back
     * to the queue (at its tail) rather than being dropped. */
    size_t keep = 0, bytes = 0;
    for (; keep < n && bytes + v[keep].len + 16 <= FR_MASTER_FRAME_BYTES; keep++) {
        bytes += v[keep].len + 16;
        it[keep] = (fr_smsg_item){ .val = { v[keep].data, (uint32_t)v[keep].len },
                                   .id = v[keep].id, .deliveries = v[keep].deliveries };
        if (c->client != NULL)   /* returned at once if this client goes away */
            fr_meta_set_holder(m->meta, v[keep].id, v[keep].deliveries, c->client->instance);
    }
    fr_smsg r = { .type = FR_SMSG_RECORDS, .nitems = (uint32_t)keep, .items = it };
    fr_master_reply(c, id, &r);
    for (size_t i = keep; i < n; i++) {
        rc = fr_meta_queue_nack(m->meta, v[i].id, v[i].deliveries);
        if (rc == FERRY_EIO)
            fr_master_note_fatal(m, rc);
    }
out:
    fr_free(v);
    fr_free(it);
}

static void op_queue(fr_master_conn *c, uint64_t id, const fr_smsg *q)
{
    fr_master *m = c->m;
    int rc;
    if (q->type == FR_SMSG_Q_PUSH) {
        uint64_t rid = 0;
        if ((rc = fr_meta_queue_push(m->meta, m->k1, q->val.p, q->val.n, &rid)) == 0) {
            fr_smsg r = { .type = FR_SMSG_PUSHED, .id = rid };
            fr_master_reply(c, id, &r);
            return;
        }
    } else if (q->type == FR_SMSG_Q_CONFIG) {
        rc = fr_meta_queue_config(m->meta, m->k1, q->size);
    } else if (q->type == FR_SMSG_Q_ACK) {
        rc = fr_meta_queue_ack(m->meta, q->id, q->deliveries);
    } else {
        rc = fr_meta_queue_nack(m->meta, q->id, q->deliveries);
    }
    if (rc < 0)
        fr_master_reply_meta_err(c, id, rc, 0);
    else
        fr_master_reply_ok(c, id);
}

/* ---- the rest ---------------------------------------------------------------- */

static void op_status(fr_master_conn *c, uint64_t id)
{
    char *text = NULL;
    int rc = fr_master_status_json(c->m, &text);
    if (rc < 0) {
        fr_master_reply_err(c, id, rc, 0, "cannot build the status: %s", ferry_strerror(rc));
        return;
    }
    fr_smsg r = { .type = FR_SMSG_STATUS_TEXT };
    r.val.p = (const uint8_t *)text;
    r.val.n = (uint32_t)strlen(text);
    fr_master_reply(c, id, &r);
    free(text);
}

/* Names each request carries: 1 = key in k1, 2 = key2 in k2 too. */
static int names_of(uint16_t type)
{
    switch (type) {
    case FR_SMSG_PUT_START: case FR_SMSG_PUT_END: case FR_SMSG_PUT_REVOKE:
    case FR_SMSG_GET_REPLICAS: case FR_SMSG_REMOVE: case FR_SMSG_REMOVE_PREFIX:
    case FR_SMSG_EXIST: case FR_SMSG_KV_GET: case FR_SMSG_KV_PUT: case FR_SMSG_KV_CAS:
    case FR_SMSG_KV_DELETE: case FR_SMSG_WATCH: case FR_SMSG_Q_PUSH: case FR_SMSG_Q_POP:
    case FR_SMSG_Q_CONFIG:
        return 1;
    case FR_SMSG_LIST: case FR_SMSG_BARRIER:
        return 2;
    default:
        return 0;
    }
}

void fr_master_dispatch(fr_master_conn *c, const fr_frame_hdr *h, const fr_smsg *q)
{
    fr_master *m = c->m;
    uint64_t id = h->req_id;
    int names = names_of(q->type);
    if (names >= 1 && !cname(c, id, q->key, m->k1, q->type == FR_SMSG_BARRIER ? "name" : "key"))
        return;
    if (names >= 2 && !cname(c, id, q->key2, m->k2, q->type == FR_SMSG_BARRIER ? "member" : "key"))
        return;
    int rc = 0;
    switch (q->type) {
    case FR_SMSG_MOUNT: op_mount(c, id, q); return;
    case FR_SMSG_UNMOUNT: op_unmount(c, id, q); return;
    case FR_SMSG_SEGMENT: op_segment(c, id, q); return;
    case FR_SMSG_PUT_START: op_put_start(c, id, q); return;
    case FR_SMSG_PUT_END: rc = fr_meta_put_end(m->meta, m->k1, m->now_wall); break;
    case FR_SMSG_PUT_REVOKE: rc = fr_meta_put_revoke(m->meta, m->k1, m->now_wall); break;
    case FR_SMSG_GET_REPLICAS: op_get(c, id, q); return;
    case FR_SMSG_REMOVE: rc = fr_meta_remove(m->meta, m->k1, m->now_wall); break;
    case FR_SMSG_REMOVE_PREFIX: {
        fr_remove_counts rm = { 0 };
        if ((rc = fr_meta_remove_prefix(m->meta, m->k1, m->now_wall, &rm)) < 0)
            break;
        fr_smsg r = { .type = FR_SMSG_REMOVED, .count = rm.removed,
                      .skipped_leased = rm.skipped_leased, .skipped_pending = rm.skipped_pending };
        fr_master_reply(c, id, &r);
        return;
    }
    case FR_SMSG_EXIST: {
        if ((rc = fr_meta_exist(m->meta, m->k1)) < 0)
            break;
        fr_smsg r = { .type = FR_SMSG_EXISTS, .flag = rc == 1 };
        fr_master_reply(c, id, &r);
        return;
    }
    case FR_SMSG_LIST: op_list(c, id, q); return;
    case FR_SMSG_KV_GET: case FR_SMSG_KV_PUT: case FR_SMSG_KV_CAS: case FR_SMSG_KV_DELETE:
        op_kv(c, id, q);
        return;
    case FR_SMSG_WATCH: fr_master_watch_start(c, id, m->k1, q->rev); return;
    case FR_SMSG_UNWATCH:
        if (fr_master_watch_stop(c, q->id) < 0)
            fr_master_reply_err(c, id, FERRY_ENOENT, 0, "no watch with id %llu on this connection",
                                U(q->id));
        else
            fr_master_reply_ok(c, id);
        return;
    case FR_SMSG_BARRIER:
        fr_master_barrier(c, id, m->k1, m->k2, q->members, q->timeout_ms);
        return;
    case FR_SMSG_Q_PUSH: case FR_SMSG_Q_ACK: case FR_SMSG_Q_NACK: case FR_SMSG_Q_CONFIG:
        op_queue(c, id, q);
        return;
    case FR_SMSG_Q_POP: op_pop(c, id, q); return;
    case FR_SMSG_HEARTBEAT:
        /* Any byte read already counts as a sign of life; a node's heartbeat
         * also says which node speaks (after a reconnect, before a re-MOUNT). */
        if (c->role == FR_ROLE_STORE_NODE && q->node != 0)
            (void)fr_master_node_heard(c, q->node);
        break;
    case FR_SMSG_STATUS: op_status(c, id); return;
    default:
        fr_master_reply_err(c, id, FERRY_EPROTO, 0, "unknown request type %u", q->type);
        c->closing = true;
        return;
    }
    if (rc < 0)
        fr_master_reply_meta_err(c, id, rc, 0);
    else
        fr_master_reply_ok(c, id);
}
