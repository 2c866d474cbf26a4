/* The node's /metrics page (store.h, ferry_node_metrics): its counters and
 * its engine's, all atomics, read on the caller's thread. Every series is
 * listed in docs/operations.md. */
#include <stdio.h>

#include "base/base.h"
#include "ferry/store.h"
#include "store/master_metrics.h"

#define U(x) ((unsigned long long)(x))

static void one(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
    fr_mx_family(f, name, type, help);
    fprintf(f, "%s %llu\n", name, U(v));
}

int ferry_node_metrics(ferry_node *n, char **text)
{
    if (!n || !text)
        return FERRY_EINVAL;
    *text = NULL;
    fr_node_counters c;
    fr_node_counters_get(n, &c);
    ferry_engine *e = fr_node_engine(n);
    ferry_engine_stats es;
    ferry_engine_get_stats(e, &es);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return FERRY_ENOMEM;
    fr_mx_family(f, "ferry_node_info", "gauge", "This node: its id, segment and version.");
    fprintf(f, "ferry_node_info{node=\"%016llx\",segment=\"%016llx\",version=\"%d.%d.%d\"} 1\n",
            U(c.id), U(c.segment), FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH);
    one(f, "ferry_node_segment_bytes", "gauge", "Size of the node's segment.", c.segment_size);
    one(f, "ferry_node_registrations_total", "counter",
        "Mounts of the segment the master accepted (the first, and one after each reconnect).",
        c.mounts);
    one(f, "ferry_node_registration_failures_total", "counter",
        "Mounts the master refused or did not answer.", c.mount_failures);
    one(f, "ferry_node_mounted", "gauge", "1 when the node's last mount succeeded.", c.mounted);
    one(f, "ferry_node_engine_regions", "gauge", "Memory regions registered with the engine.",
        ferry_engine_region_count(e));
    fr_mx_family(f, "ferry_node_served_bytes_total", "counter",
                 "Bytes the node's engine served to remote peers, by transport and direction "
                 "(read: peers read from the segment; write: peers wrote into it). Same-host "
                 "peers over shm copy through a mapping, without this process.");
    fprintf(f, "ferry_node_served_bytes_total{transport=\"tcp\",op=\"read\"} %llu\n",
            U(es.served_read_bytes));
    fprintf(f, "ferry_node_served_bytes_total{transport=\"tcp\",op=\"write\"} %llu\n",
            U(es.served_write_bytes));
    one(f, "ferry_node_shm_maps_served_total", "counter",
        "Mappings of the segment handed to same-host peers (shm transport).", es.shm_maps_served);
    one(f, "ferry_node_remote_refused_total", "counter",
        "Remote reads and writes refused (bad key, outside the region, not allowed).",
        es.remote_refused);
    one(f, "ferry_node_handshakes_refused_total", "counter",
        "Engine connections refused at the handshake (wrong token).", es.auth_refused);
    one(f, "ferry_node_frames_rejected_total", "counter", "Malformed frames dropped.",
        es.frames_rejected);
    one(f, "ferry_node_notify_dropped_total", "counter",
        "Notifications dropped unconsumed (a peer's backlog on one tag, or over all its tags).",
        es.notify_dropped);
    one(f, "ferry_node_notify_peer_capped_total", "counter",
        "Of those, new notifications refused because their peer had FERRY_NOTIFY_PEER_MAX "
        "unconsumed over all its tags.", es.notify_peer_capped);
    *text = fr_mx_finish(f, &buf, &len);
    return *text ? 0 : FERRY_ENOMEM;
}
