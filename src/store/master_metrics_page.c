/* The master's /metrics page in Prometheus text format (version 0.0.4),
 * rendered on the loop thread from its own state (master_metrics.h). Every
 * series is listed in docs/operations.md. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "store/ha_elect.h"
#include "store/master_int.h"
#include "wire/hsgate.h"

#define U(x) ((unsigned long long)(x))

extern const uint64_t fr_mx_wal_le[FR_MX_WAL_BUCKETS];

void fr_mx_label(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        if (c == '\\' || c == '"') {
            fputc('\\', f);
            fputc((int)c, f);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c >= 0x80) {
            size_t k = fr_utf8_seq_len(p + i, n - i);
            if (k == 0) {
                fputs("\xef\xbf\xbd", f);
                i++;
            } else {
                fwrite(p + i, 1, k, f);
                i += k;
            }
            continue;
        } else {
            fputc((int)c, f);
        }
        i++;
    }
}

void fr_mx_family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *fr_mx_finish(FILE *f, char **buf, size_t *len)
{
    bool bad = ferror(f) != 0;
    bad |= fclose(f) != 0;   /* sets *buf and *len */
    char *out = bad || *buf == NULL ? NULL : fr_malloc(*len + 1);
    if (out != NULL) {
        memcpy(out, *buf, *len);
        out[*len] = '\0';
    }
    free(*buf);
    return out;
}

static void one(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
    fr_mx_family(f, name, type, help);
    fprintf(f, "%s %llu\n", name, U(v));
}

/* "put_start" for PUT_START: label values in the style of the metric names. */
static void op_name(uint16_t type, char *out, size_t cap)
{
    const char *n = fr_smsg_type_name(type);
    size_t i = 0;
    for (; n != NULL && n[i] && i + 1 < cap; i++)
        out[i] = (char)tolower((unsigned char)n[i]);
    out[i] = '\0';
}

static void requests(FILE *f, const fr_master_mx *x)
{
    static const char *const names[] = { "ferry_master_requests_total",
                                         "ferry_master_request_errors_total" };
    static const char *const help[] = {
        "Requests received, by operation (other: frames that are not store requests).",
        "Requests answered with an error, by operation." };
    for (int k = 0; k < 2; k++) {
        const uint64_t *v = k == 0 ? x->requests : x->errors;
        fr_mx_family(f, names[k], "counter", help[k]);
        for (unsigned i = 0; i < FR_MX_OPS; i++) {
            char op[32] = "other";
            uint16_t type = (uint16_t)(FR_MX_OP_BASE + i);
            if (i != FR_MX_OP_OTHER) {
                if (!fr_smsg_is_request(type))
                    continue;
                op_name(type, op, sizeof op);
            }
            fprintf(f, "%s{op=\"%s\"} %llu\n", names[k], op, U(v[i]));
        }
    }
}

static void wal(FILE *f, fr_master *m)
{
    const fr_master_mx *x = &m->mx;
    fr_mx_family(f, "ferry_master_wal_commit_seconds", "histogram",
                 "Time of each group commit of the log (write and fsync) before replies go out.");
    uint64_t cum = 0;
    for (size_t b = 0; b < FR_MX_WAL_BUCKETS; b++) {
        cum += x->wal_bucket[b];
        char le[32];   /* "0.00005", not "5e-05": the bound as people write it */
        int n = snprintf(le, sizeof le, "%.9f", (double)fr_mx_wal_le[b] / 1e9);
        while (n > 1 && le[n - 1] == '0')
            le[--n] = '\0';
        if (le[n - 1] == '.')
            le[n - 1] = '\0';
        fprintf(f, "ferry_master_wal_commit_seconds_bucket{le=\"%s\"} %llu\n", le, U(cum));
    }
    cum += x->wal_bucket[FR_MX_WAL_BUCKETS];
    fprintf(f, "ferry_master_wal_commit_seconds_bucket{le=\"+Inf\"} %llu\n", U(cum));
    fprintf(f, "ferry_master_wal_commit_seconds_sum %.9f\n", (double)x->wal_ns / 1e9);
    fprintf(f, "ferry_master_wal_commit_seconds_count %llu\n", U(x->wal_commits));
    fr_wal_stats ws = { 0 };
    if (m->wal)
        fr_wal_stats_get(m->wal, &ws);
    one(f, "ferry_master_wal_appends_total", "counter", "Records appended to the log.", ws.appends);
    one(f, "ferry_master_wal_fsyncs_total", "counter", "fsyncs of the log.", ws.fsyncs);
    one(f, "ferry_master_wal_bytes_total", "counter", "Bytes appended to the log.", ws.bytes);
    one(f, "ferry_master_wal_snapshots_total", "counter", "Snapshots (checkpoints) written.",
        ws.snapshots);
}

/* A replicated master (--etcd): its leadership and the cluster's log. */
static void ha(FILE *f, fr_master *m)
{
    if (m->ha == NULL)
        return;
    fr_wal_stats ws = { 0 };
    fr_wal_stats_get(m->wal, &ws);
    one(f, "ferry_master_ha_epoch", "gauge",
        "The epoch of this master's leadership (the leadership key's create revision in etcd).",
        (uint64_t)m->epoch);
    one(f, "ferry_master_ha_leaderships", "gauge",
        "Leaderships the cluster has had, this one included (each a leadership change).",
        m->ha_leaderships);
    one(f, "ferry_master_ha_log_entries_total", "counter",
        "Entries this leader appended to the cluster's log in etcd.", ws.ha_entries);
    one(f, "ferry_master_ha_log_bytes_total", "counter",
        "Bytes this leader appended to the cluster's log in etcd.", ws.ha_bytes);
    fr_mx_family(f, "ferry_master_ha_log_append_seconds_total", "counter",
                 "Time the appends to etcd took (each group commit waits for its own).");
    fprintf(f, "ferry_master_ha_log_append_seconds_total %.9f\n", (double)ws.ha_ns / 1e9);
    one(f, "ferry_master_ha_log_next_entry", "gauge",
        "The log entry the next group commit appends.", ws.ha_next_seq);
    fr_ha_peer peers[FR_HA_PEERS_MAX];
    size_t n = fr_ha_standbys(m->ha, peers, FR_HA_PEERS_MAX);
    fr_mx_family(f, "ferry_master_ha_standby_lag_entries", "gauge",
                 "Log entries a standby has still to apply, by its last report (a standby "
                 "reports at most every 0.3 s, the leader reads every third of the TTL).");
    for (size_t i = 0; i < n; i++) {
        fputs("ferry_master_ha_standby_lag_entries{standby=\"", f);
        fr_mx_label(f, peers[i].id);
        fprintf(f, "\"} %llu\n", U(ws.ha_next_seq > peers[i].next_seq ?
                                   ws.ha_next_seq - peers[i].next_seq : 0));
    }
}

static void handshakes(FILE *f, fr_master *m)
{
    static const char *const why[FR_MX_HS_N] = { "auth", "protocol", "stale", "timeout",
                                                 "displaced", "socket" };
    fr_mx_family(f, "ferry_master_handshakes_refused_total", "counter",
                 "Connections dropped before their handshake finished, by reason: auth (wrong "
                 "token or role), protocol (malformed), stale (old instance), timeout (past the "
                 "deadline), displaced (a newer connection took its place), socket (an error).");
    for (int k = 0; k < FR_MX_HS_N; k++)
        fprintf(f, "ferry_master_handshakes_refused_total{reason=\"%s\"} %llu\n", why[k],
                U(atomic_load_explicit(&m->mx.hs_refused[k], memory_order_relaxed)));
    fr_hsgate_stats gs = { 0 };
    if (m->gate)
        fr_hsgate_get_stats(m->gate, &gs);
    one(f, "ferry_master_connections_accepted_total", "counter",
        "TCP connections accepted (before their handshake).", gs.accepted);
    one(f, "ferry_master_handshakes_in_flight", "gauge", "Handshakes in progress now.",
        gs.inflight);
    size_t role[2] = { 0, 0 };
    for (fr_dnode *n = m->conns.next; n != &m->conns; n = n->next)
        role[fr_container_of(n, fr_master_conn, link)->role == FR_ROLE_STORE_NODE]++;
    fr_mx_family(f, "ferry_master_connections", "gauge", "Authenticated connections now, by role.");
    fprintf(f, "ferry_master_connections{role=\"client\"} %zu\n", role[0]);
    fprintf(f, "ferry_master_connections{role=\"node\"} %zu\n", role[1]);
    one(f, "ferry_master_unsent_reply_bytes", "gauge",
        "Reply bytes queued for connections that have not read them yet.", m->out_total);
}

static void objects(FILE *f, fr_master *m)
{
    fr_meta_gauges g;
    fr_meta_gauges_get(m->meta, &g);
    fr_mx_family(f, "ferry_master_objects", "gauge", "Objects now, by state.");
    fprintf(f, "ferry_master_objects{state=\"complete\"} %llu\n", U(g.complete));
    fprintf(f, "ferry_master_objects{state=\"pending\"} %llu\n", U(g.pending));
    fprintf(f, "ferry_master_objects{state=\"lost\"} %llu\n", U(g.lost));
    one(f, "ferry_master_object_bytes", "gauge", "Bytes of complete objects (one replica each).",
        g.complete_bytes);
    one(f, "ferry_master_object_leases_total", "counter",
        "Read leases granted (replicas handed out under a lease).", m->mx.leases);
    one(f, "ferry_master_put_bytes_total", "counter",
        "Bytes of objects placed by put_start (the master sees sizes, never payload).",
        m->mx.put_bytes);
    one(f, "ferry_master_get_object_bytes_total", "counter",
        "Sizes of the objects whose replicas were handed to readers, one per lookup: a "
        "ranged read counts its whole object, so this bounds what readers moved, it does "
        "not measure it (readers move bytes without the master).", m->mx.get_bytes);
    one(f, "ferry_master_evictions_total", "counter",
        "Soft objects evicted to make room for new ones.", g.evictions);
    one(f, "ferry_master_objects_lost_total", "counter",
        "Objects that became lost (their last replica's segment unmounted or node dead).",
        m->mx.lost);
    one(f, "ferry_master_kv_revision", "gauge", "The KV space's revision.",
        fr_meta_kv_revision(m->meta));
}

static void segments(FILE *f, fr_master *m)
{
    size_t n = fr_meta_segments(m->meta, NULL, 0);
    uint64_t *ids = fr_calloc(n ? n : 1, sizeof *ids);
    if (ids == NULL)
        return;
    n = fr_meta_segments(m->meta, ids, n);
    one(f, "ferry_master_segments", "gauge", "Mounted segments.", n);
    static const char *const names[] = { "ferry_master_segment_bytes",
                                         "ferry_master_segment_used_bytes",
                                         "ferry_master_segment_free_bytes" };
    static const char *const help[] = { "Size of each segment.", "Bytes allocated in each segment.",
                                        "Bytes free in each segment." };
    for (int k = 0; k < 3; k++) {
        fr_mx_family(f, names[k], "gauge", help[k]);
        for (size_t i = 0; i < n; i++) {
            fr_seg_info si;
            if (fr_meta_seg_info(m->meta, ids[i], &si) < 0)
                continue;
            uint64_t v = k == 0 ? si.size : k == 1 ? si.used : si.size - si.used;
            fprintf(f, "%s{segment=\"%016llx\",node=\"%016llx\"} %llu\n", names[k], U(si.id),
                    U(si.node), U(v));
        }
    }
    fr_free(ids);
}

static void queues(FILE *f, fr_master *m)
{
    fr_meta_qgauge q[FR_MX_QUEUES_MAX];
    size_t total = fr_meta_queue_gauges(m->meta, q, FR_MX_QUEUES_MAX);
    size_t n = total < FR_MX_QUEUES_MAX ? total : FR_MX_QUEUES_MAX;
    one(f, "ferry_master_queues", "gauge", "Queues (at most 256 are listed by name below).", total);
    static const char *const names[] = { "ferry_master_queue_ready_records",
                                         "ferry_master_queue_leased_records" };
    static const char *const help[] = { "Records waiting in each queue.",
                                         "Records of each queue popped and under a lease." };
    for (int k = 0; k < 2; k++) {
        fr_mx_family(f, names[k], "gauge", help[k]);
        for (size_t i = 0; i < n; i++) {
            fprintf(f, "%s{queue=\"", names[k]);
            fr_mx_label(f, q[i].name);
            fprintf(f, "\"} %llu\n", U(k == 0 ? q[i].ready : q[i].leased));
        }
    }
    fr_mx_family(f, "ferry_master_queue_redeliveries_total", "counter",
                 "Queue records delivered again, by reason: lease_expired (not acked in time), "
                 "holder_gone (the client that held it is gone).");
    fprintf(f, "ferry_master_queue_redeliveries_total{reason=\"lease_expired\"} %llu\n",
            U(m->mx.redelivered));
    fprintf(f, "ferry_master_queue_redeliveries_total{reason=\"holder_gone\"} %llu\n",
            U(m->mx.returned));
}

static void liveness(FILE *f, fr_master *m)
{
    size_t st[3] = { 0, 0, 0 }, pos = 0;
    const fr_master_node *nd;
    while ((nd = fr_umap_next(&m->nodes, &pos)) != NULL)
        st[nd->conn == NULL ? 2 : nd->suspect ? 1 : 0]++;
    fr_mx_family(f, "ferry_master_nodes", "gauge", "Nodes known now, by state.");
    fprintf(f, "ferry_master_nodes{state=\"live\"} %zu\n", st[0]);
    fprintf(f, "ferry_master_nodes{state=\"suspect\"} %zu\n", st[1]);
    fprintf(f, "ferry_master_nodes{state=\"gone\"} %zu\n", st[2]);
    one(f, "ferry_master_nodes_suspected_total", "counter", "Times a node became suspect.",
        m->lstats.suspected);
    one(f, "ferry_master_nodes_declared_dead_total", "counter", "Nodes declared dead.",
        m->lstats.declared_dead);
    one(f, "ferry_master_clients_released_total", "counter",
        "Clients gone past the grace period whose puts and leases were released.",
        m->lstats.clients_released);
    one(f, "ferry_master_stalls_total", "counter",
        "Loop iterations that took longer than 500 ms (not held against peers).",
        m->lstats.stalls);
}

char *fr_master_mx_render(fr_master *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return NULL;
    fr_mx_family(f, "ferry_master_info", "gauge", "This master: its instance and version.");
    fprintf(f, "ferry_master_info{instance=\"%016llx\",version=\"%d.%d.%d\"} 1\n",
            U(m->instance), FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH);
    requests(f, &m->mx);
    objects(f, m);
    segments(f, m);
    queues(f, m);
    handshakes(f, m);
    liveness(f, m);
    wal(f, m);
    ha(f, m);
    fr_mx_family(f, "ferry_master_metrics_render_seconds", "gauge",
                 "What rendering the previous snapshot of this page cost the loop.");
    fprintf(f, "ferry_master_metrics_render_seconds %.6f\n", (double)m->mx.render_ns / 1e9);
    return fr_mx_finish(f, &buf, &len);
}
