/* The master's STATUS document (master_int.h). */
#include <string.h>

#include "store/ha_elect.h"
#include "store/master_int.h"

static int add_segments(fr_master *m, json_t *arr)
{
    size_t n = fr_meta_segments(m->meta, NULL, 0);
    uint64_t *ids = fr_calloc(n ? n : 1, sizeof *ids);
    if (ids == NULL)
        return FERRY_ENOMEM;
    n = fr_meta_segments(m->meta, ids, n);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        fr_seg_info si;
        if (fr_meta_seg_info(m->meta, ids[i], &si) < 0)
            continue;
        const fr_master_seg *s = fr_umap_get(&m->segs, ids[i]);
        json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "id", (json_int_t)si.id,
                              "node", (json_int_t)si.node, "size", (json_int_t)si.size,
                              "used", (json_int_t)si.used, "objects", (json_int_t)si.objects,
                              "largest_free", (json_int_t)si.largest_free, "attached",
                              s != NULL && s->attached);
        if (o == NULL || json_array_append_new(arr, o) < 0)
            rc = FERRY_ENOMEM;
    }
    fr_free(ids);
    return rc;
}

static const char *node_state(const fr_master_node *nd)
{
    return nd->conn == NULL ? "gone" : nd->suspect ? "suspect" : "live";
}

static int add_nodes(fr_master *m, json_t *arr)
{
    size_t pos = 0;
    const fr_master_node *nd;
    while ((nd = fr_umap_next(&m->nodes, &pos)) != NULL) {
        uint64_t heard = nd->conn ? nd->conn->last_seen : nd->gone_since;
        json_t *o = json_pack("{s:I, s:s, s:s, s:I, s:I}", "id", (json_int_t)nd->id, "name",
                              nd->name, "state", node_state(nd), "heard_ms_ago",
                              (json_int_t)(m->live - heard), "connections",
                              (json_int_t)(nd->conn != NULL));
        if (o == NULL || json_array_append_new(arr, o) < 0)
            return FERRY_ENOMEM;
    }
    return 0;
}

/* A replicated master's leadership, the cluster's log and its standbys. */
static int add_ha(fr_master *m, json_t *j, const fr_wal_stats *ws)
{
    json_t *sb = json_array();
    fr_ha_peer peers[FR_HA_PEERS_MAX];
    size_t n = fr_ha_standbys(m->ha, peers, FR_HA_PEERS_MAX);
    for (size_t i = 0; sb && i < n; i++) {
        uint64_t lag = ws->ha_next_seq > peers[i].next_seq ? ws->ha_next_seq - peers[i].next_seq : 0;
        json_t *o = json_pack("{s:s, s:I, s:I}", "id", peers[i].id, "next_entry",
                              (json_int_t)peers[i].next_seq, "lag_entries", (json_int_t)lag);
        if (o == NULL || json_array_append_new(sb, o) < 0) {
            json_decref(sb);
            return FERRY_ENOMEM;
        }
    }
    json_t *o = sb ? json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:o}", "cluster",
                               m->cfg.cluster, "epoch", (json_int_t)m->epoch, "leaderships",
                               (json_int_t)m->ha_leaderships, "log_next_entry",
                               (json_int_t)ws->ha_next_seq, "log_entries",
                               (json_int_t)ws->ha_entries, "log_bytes", (json_int_t)ws->ha_bytes,
                               "log_append_seconds", (double)ws->ha_ns / 1e9, "standbys", sb)
                 : NULL;
    return o && json_object_set_new(j, "ha", o) == 0 ? 0 : FERRY_ENOMEM;
}

int fr_master_status_json(fr_master *m, char **out)
{
    *out = NULL;
    fr_keylist kl = { 0 };
    size_t objects = 0;
    if (fr_meta_list(m->meta, "", NULL, SIZE_MAX, &kl) == 0) {
        objects = kl.n;
        fr_free(kl.keys);
    }
    size_t clients = 0, suspect = 0, gone = 0, pos = 0;
    for (fr_dnode *n = m->conns.next; n != &m->conns; n = n->next)
        clients += fr_container_of(n, fr_master_conn, link)->role == FR_ROLE_STORE_CLIENT;
    const fr_master_client *cl;
    while ((cl = fr_umap_next(&m->clients, &pos)) != NULL) {
        suspect += cl->conn != NULL && cl->suspect;
        gone += cl->conn == NULL;
    }
    fr_wal_stats ws = { 0 };
    if (m->wal)
        fr_wal_stats_get(m->wal, &ws);
    char inst[24];
    snprintf(inst, sizeof inst, "%016llx", (unsigned long long)m->instance);
    size_t held = 0;
    for (fr_dnode *n = m->conns.next; n != &m->conns; n = n->next)
        held += fr_container_of(n, fr_master_conn, link)->held;
    json_t *live = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                             "nodes_suspected", (json_int_t)m->lstats.suspected,
                             "nodes_declared_dead", (json_int_t)m->lstats.declared_dead,
                             "clients_released", (json_int_t)m->lstats.clients_released,
                             "master_stalls", (json_int_t)m->lstats.stalls,
                             "holds", (json_int_t)m->lstats.holds,
                             "connections_held", (json_int_t)held,
                             "unsent_reply_bytes", (json_int_t)m->out_total);
    json_t *segs = json_array(), *nodes = json_array();
    json_t *j = json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:I, s:I, s:I}}",
                          "address", m->address, "instance", inst, "dir", m->cfg.dir,
                          "segments", segs, "nodes", nodes, "liveness", live,
                          "clients", (json_int_t)clients,
                          "clients_suspect", (json_int_t)suspect,
                          "clients_gone", (json_int_t)gone,
                          "grace_ms", (json_int_t)m->cfg.grace_ms,
                          "dead_after_ms", (json_int_t)m->cfg.dead_after_ms,
                          "connections", (json_int_t)m->nconns,
                          "objects", (json_int_t)objects,
                          "kv_revision", (json_int_t)fr_meta_kv_revision(m->meta),
                          "records", (json_int_t)fr_meta_records(m->meta),
                          "heartbeat_timeout_ms", (json_int_t)m->cfg.heartbeat_timeout_ms,
                          "wal", "appends", (json_int_t)ws.appends, "fsyncs", (json_int_t)ws.fsyncs,
                          "snapshots", (json_int_t)ws.snapshots);
    if (j == NULL)
        return FERRY_ENOMEM;
    int rc = add_segments(m, segs);
    if (rc == 0 && m->ha)
        rc = add_ha(m, j, &ws);
    if (rc == 0)
        rc = add_nodes(m, nodes);
    if (rc == 0) {
        *out = json_dumps(j, JSON_COMPACT);
        if (*out == NULL)
            rc = FERRY_ENOMEM;
        else if (strlen(*out) > FR_SMSG_VALUE_MAX) {
            free(*out);
            *out = NULL;
            rc = FERRY_EMSGSIZE;
        }
    }
    json_decref(j);
    return rc;
}
