/* Liveness of the master's peers (docs/store.md, "Liveness").
 *
 * A node is live while its connection is heard (any byte counts, not only
 * heartbeats), suspect when it is connected but silent past the heartbeat
 * timeout, gone when its connection closed. Suspect and gone nodes are
 * unreachable: no new placement, reads of objects with no other replica
 * fail fast with FERRY_EUNREACH, and every object stays. A node is declared
 * dead (its objects lost) only when it is known gone: its connection closed
 * and it did not come back within the grace period, a new incarnation of
 * the same node name mounted, or it stayed unreachable past dead_after
 * (when configured). A suspect node heard again is live again, with every
 * object.
 *
 * Clients are followed the same way by the instance id of their
 * connection, which survives their reconnects: a client gone past the
 * grace period has its unfinished puts revoked and its queue leases
 * returned; a silent one keeps everything.
 *
 * Every duration here is measured on the liveness clock (fr_master.live),
 * which counts at most FR_MASTER_STALL_MS of one loop iteration: time in
 * which the master itself did not run (an fsync, a checkpoint, a stall of
 * the process) is never held against a peer. */
#include <string.h>

#include "store/master_int.h"

#define U(x) ((unsigned long long)(x))

fr_master_node *fr_master_node_get(fr_master *m, uint64_t node, bool create)
{
    fr_master_node *nd = fr_umap_get(&m->nodes, node);
    if (nd != NULL || !create)
        return nd;
    if ((nd = fr_calloc(1, sizeof *nd)) == NULL)
        return NULL;
    nd->id = node;
    nd->quiet_since = m->live;
    if (fr_umap_put(&m->nodes, node, nd) < 0) {
        fr_free(nd);
        return NULL;
    }
    return nd;
}

void fr_master_node_reach(fr_master *m, fr_master_node *nd)
{
    bool ok = nd->conn != NULL && !nd->suspect;
    if (!ok && nd->unreachable_wall == 0)
        nd->unreachable_wall = m->now_wall ? m->now_wall : 1;
    else if (ok)
        nd->unreachable_wall = 0;
    size_t pos = 0;
    fr_master_seg *s;
    while ((s = fr_umap_next(&m->segs, &pos)) != NULL) {
        if (s->node != nd->id)
            continue;
        uint64_t since = ok && s->attached ? 0 : nd->unreachable_wall ? nd->unreachable_wall
                                                                       : m->now_wall;
        (void)fr_meta_seg_set_reachable(m->meta, s->id, since);
    }
}

static double secs(uint64_t ms)
{
    return (double)ms / 1000.0;
}

fr_master_node *fr_master_node_heard(fr_master_conn *c, uint64_t node)
{
    fr_master *m = c->m;
    fr_master_node *nd = fr_master_node_get(m, node, false);
    if (nd == NULL)
        return NULL;
    if (nd->conn != c) {
        if (nd->conn != NULL) {   /* an older connection of the same process: superseded */
            nd->conn->node = 0;
            nd->conn->dead = true;
        }
        if (nd->conn == NULL && nd->gone_since != 0)
            FR_INFO("master", "node %016llx reconnected after %.1f s: its segments are reachable "
                    "again", U(node), secs(m->live - nd->gone_since));
        nd->conn = c;
        nd->gone_since = 0;
    }
    c->node = node;
    if (nd->suspect) {
        FR_INFO("master", "node %016llx heard again after %.1f s: its segments are reachable again",
                U(node), secs(m->live - nd->quiet_since));
        nd->suspect = false;
    }
    nd->quiet_since = m->live;
    fr_master_node_reach(m, nd);
    return nd;
}

void fr_master_node_dead(fr_master *m, fr_master_node *nd, const char *why)
{
    uint64_t lost = 0;
    int rc = fr_meta_node_dead(m->meta, nd->id, m->now_wall, &lost);
    if (rc == FERRY_EIO) {
        fr_master_note_fatal(m, rc);
        return;
    }
    m->lstats.declared_dead += rc == 0;
    m->mx.lost += lost;
    if (rc == 0)
        FR_WARN("master", "node %016llx%s%s%s declared dead: %s; its segments are unmounted, %llu "
                "objects lost", U(nd->id), nd->name[0] ? " ('" : "", nd->name,
                nd->name[0] ? "')" : "", why, U(lost));
    uint64_t ids[64];
    for (;;) {   /* forget its descriptors (collected first: no delete while iterating) */
        size_t pos = 0, k = 0;
        fr_master_seg *s;
        while (k < 64 && (s = fr_umap_next(&m->segs, &pos)) != NULL)
            if (s->node == nd->id)
                ids[k++] = s->id;
        for (size_t i = 0; i < k; i++)
            fr_free(fr_umap_del(&m->segs, ids[i]));
        if (k < 64)
            break;
    }
    if (nd->conn != NULL) {   /* still connected: close it, so the process learns */
        nd->conn->node = 0;
        nd->conn->dead = true;
    }
    fr_free(fr_umap_del(&m->nodes, nd->id));
}

void fr_master_client_attach(fr_master_conn *c)
{
    fr_master *m = c->m;
    if (c->instance == 0 || c->role != FR_ROLE_STORE_CLIENT)
        return;
    fr_master_client *cl = fr_umap_get(&m->clients, c->instance);
    if (cl == NULL) {
        if ((cl = fr_calloc(1, sizeof *cl)) == NULL)
            return;
        cl->instance = c->instance;
        if (fr_umap_put(&m->clients, c->instance, cl) < 0) {
            fr_free(cl);
            return;
        }
    } else if (cl->conn != NULL && cl->conn != c) {
        cl->conn->client = NULL;   /* the client reconnected: its old connection is over */
        cl->conn->dead = true;
    }
    cl->conn = c;
    cl->gone_since = 0;
    cl->suspect = false;
    memcpy(cl->peer, c->peer, sizeof cl->peer);
    c->client = cl;
}

static bool node_has_segments(fr_master *m, uint64_t node)
{
    size_t pos = 0;
    const fr_master_seg *s;
    while ((s = fr_umap_next(&m->segs, &pos)) != NULL)
        if (s->node == node)
            return true;
    return false;
}

void fr_master_conn_gone(fr_master_conn *c)
{
    fr_master *m = c->m;
    if (c->client != NULL && c->client->conn == c) {
        c->client->conn = NULL;
        c->client->gone_since = m->live ? m->live : 1;
    }
    c->client = NULL;
    if (c->role != FR_ROLE_STORE_NODE)
        return;
    /* Every node this connection spoke for (one, unless a peer mounted
     * under several node ids). */
    size_t pos = 0;
    fr_master_node *nd;
    while ((nd = fr_umap_next(&m->nodes, &pos)) != NULL) {
        if (nd->conn != c)
            continue;
        nd->conn = NULL;
        nd->gone_since = m->live ? m->live : 1;
        if (m->closing)
            continue;
        if (!node_has_segments(m, nd->id)) {   /* it unmounted first: a clean exit */
            FR_INFO("master", "node %016llx left", U(nd->id));
            fr_free(fr_umap_del(&m->nodes, nd->id));
            pos = 0;   /* the walk restarts: a delete may move entries */
            continue;
        }
        FR_WARN("master", "node %016llx disconnected: unreachable until it reconnects; declared "
                "dead if it has not within %.1f s", U(nd->id), secs(m->cfg.grace_ms));
        fr_master_node_reach(m, nd);
    }
}

/* One node at a tick: suspect, heard again, or dead. false: it was freed. */
static bool node_tick(fr_master *m, fr_master_node *nd)
{
    const fr_master_config *cfg = &m->cfg;
    char why[160];
    if (nd->conn == NULL) {
        uint64_t gone = m->live - nd->gone_since;
        if (gone <= cfg->grace_ms)
            return true;
        snprintf(why, sizeof why, "its connection closed %.1f s ago and it did not reconnect "
                 "within the grace period", secs(gone));
        fr_master_node_dead(m, nd, why);
        return false;
    }
    uint64_t quiet = m->live - nd->conn->last_seen;
    if (!nd->suspect && quiet > cfg->heartbeat_timeout_ms) {
        nd->suspect = true;
        nd->quiet_since = nd->conn->last_seen;
        m->lstats.suspected++;
        FR_WARN("master", "node %016llx is suspect: not heard for %.1f s; nothing new is placed "
                "there and reads of its objects fail until it is heard again (they are kept)",
                U(nd->id), secs(quiet));
        fr_master_node_reach(m, nd);
    } else if (nd->suspect && quiet <= cfg->heartbeat_timeout_ms) {
        fr_master_node_heard(nd->conn, nd->id);
    }
    if (nd->suspect && cfg->dead_after_ms != 0 && quiet > cfg->dead_after_ms) {
        snprintf(why, sizeof why, "not heard for %.1f s, past dead-after (%.1f s)", secs(quiet),
                 secs(cfg->dead_after_ms));
        fr_master_node_dead(m, nd, why);
        return false;
    }
    return true;
}

/* One client at a tick. false: it was freed. */
static bool client_tick(fr_master *m, fr_master_client *cl)
{
    const fr_master_config *cfg = &m->cfg;
    if (cl->conn == NULL) {
        uint64_t gone = m->live - cl->gone_since;
        if (gone <= cfg->grace_ms)
            return true;
        uint64_t revoked = 0, returned = 0;
        int rc = fr_meta_release_client(m->meta, cl->instance, m->now_wall, &revoked, &returned);
        if (rc == FERRY_EIO)
            fr_master_note_fatal(m, rc);
        m->lstats.clients_released += revoked || returned;
        m->mx.returned += returned;
        if (revoked || returned)
            FR_INFO("master", "client %s gone for %.1f s: %llu unfinished puts revoked, %llu "
                    "queue records delivered again", cl->peer, secs(gone), U(revoked),
                    U(returned));
        fr_free(fr_umap_del(&m->clients, cl->instance));
        return false;
    }
    uint64_t quiet = m->live - cl->conn->last_seen;
    if (!cl->suspect && quiet > cfg->heartbeat_timeout_ms) {
        cl->suspect = true;
        FR_WARN("master", "client %s (#%llu) not heard for %.1f s; what it holds is kept",
                cl->peer, U(cl->conn->serial), secs(quiet));
    } else if (cl->suspect && quiet <= cfg->heartbeat_timeout_ms) {
        cl->suspect = false;
        FR_INFO("master", "client %s heard again", cl->peer);
    }
    if (cl->suspect && cfg->dead_after_ms != 0 && quiet > cfg->dead_after_ms) {
        FR_WARN("master", "closing connection %s (#%llu): not heard for %.1f s, past dead-after",
                cl->peer, U(cl->conn->serial), secs(quiet));
        cl->conn->dead = true;   /* released after the grace, like any client that left */
    }
    return true;
}

void fr_master_liveness(fr_master *m)
{
    /* A connection we are not reading (its replies are backed up) cannot be
     * heard: our own back-pressure is not its silence. */
    for (fr_dnode *n = m->conns.next; n != &m->conns; n = n->next) {
        fr_master_conn *c = fr_container_of(n, fr_master_conn, link);
        if (!c->reading || c->held)
            c->last_seen = m->live;
    }
    for (bool again = true; again && m->fatal == 0;) {   /* restart the walk after a free */
        again = false;
        size_t pos = 0;
        fr_master_node *nd;
        while (!again && (nd = fr_umap_next(&m->nodes, &pos)) != NULL)
            again = !node_tick(m, nd);
    }
    for (bool again = true; again && m->fatal == 0;) {
        again = false;
        size_t pos = 0;
        fr_master_client *cl;
        while (!again && (cl = fr_umap_next(&m->clients, &pos)) != NULL)
            again = !client_tick(m, cl);
    }
}

int fr_master_segs_recover(fr_master *m)
{
    size_t n = fr_meta_segments(m->meta, NULL, 0);
    uint64_t *ids = fr_calloc(n ? n : 1, sizeof *ids);
    if (ids == NULL)
        return FERRY_ENOMEM;
    n = fr_meta_segments(m->meta, ids, n);
    for (size_t i = 0; i < n; i++) {
        fr_seg_info si;
        fr_master_seg *s = fr_calloc(1, sizeof *s);
        if (s == NULL || fr_meta_seg_info(m->meta, ids[i], &si) < 0 ||
            fr_umap_put(&m->segs, ids[i], s) < 0) {
            fr_free(s);
            fr_free(ids);
            return FERRY_ENOMEM;
        }
        *s = (fr_master_seg){ .id = si.id, .node = si.node };
        /* Gone until it re-attaches: the grace period runs from now. */
        fr_master_node *nd = fr_master_node_get(m, si.node, true);
        if (nd == NULL) {
            fr_free(ids);
            return FERRY_ENOMEM;
        }
        nd->gone_since = m->live ? m->live : 1;
        fr_master_node_reach(m, nd);
    }
    if (n)
        FR_INFO("master", "%zu recovered segments wait for their nodes to re-attach", n);
    fr_free(ids);
    return 0;
}

void fr_master_segs_free(fr_master *m)
{
    size_t pos = 0;
    void *p;
    while ((p = fr_umap_next(&m->segs, &pos)) != NULL)
        fr_free(p);
    pos = 0;
    while ((p = fr_umap_next(&m->nodes, &pos)) != NULL)
        fr_free(p);
    pos = 0;
    while ((p = fr_umap_next(&m->clients, &pos)) != NULL)
        fr_free(p);
    fr_umap_fini(&m->segs);
    fr_umap_fini(&m->nodes);
    fr_umap_fini(&m->clients);
}
