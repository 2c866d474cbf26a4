/* store layer: internals of the master server shared by master.c (loop,
 * sockets, timers), master_conn.c (connection buffers, framing, replies),
 * master_ops.c (request dispatch) and master_sync.c (watches, barriers,
 * liveness, status). Everything here belongs to the loop thread. */
#ifndef FR_STORE_MASTER_INT_H
#define FR_STORE_MASTER_INT_H

#include "store/master.h"
#include "store/master_metrics.h"
#include "store/store_int.h"
#include "wire/store_msg.h"

#define FR_MASTER_OUT_HIGH (64u << 20)   /* stop reading a connection above this unsent output */
#define FR_MASTER_OUT_TOTAL (256u << 20) /* ... or above FR_MASTER_OUT_LOW while every connection's
                                          * unsent output together passes this */
#define FR_MASTER_OUT_LOW (1u << 20)
#define FR_MASTER_READ_BURST (4u << 20)  /* bytes read from one connection per iteration */
#define FR_MASTER_TICK_MS 100            /* granularity of liveness checks */
#define FR_MASTER_STALL_MS 500           /* most of one loop iteration the liveness clock counts */
#define FR_MASTER_PROBE_MS 5000          /* a MOUNT's probe of the node's engine */
#define FR_MASTER_PROBES_MAX 16          /* probes in flight */
#define FR_MASTER_HANDSHAKE_MS 5000     /* a handshake's deadline, from accept */
#define FR_MASTER_LINGER_MS 1000        /* a closing connection's time to read our last reply */
#define FR_MASTER_HANDSHAKES_MAX 1024    /* handshakes in flight (at most 1/4 of RLIMIT_NOFILE) */
#define FR_MASTER_HANDSHAKES_PER_SOURCE 256 /* handshakes in flight from one address */
#define FR_MASTER_EVENTS_FRAME 4096      /* events in one EVENTS frame */
#define FR_MASTER_FRAME_BYTES (48u << 20) /* budget of one list reply (the wire allows 64 MiB) */

/* A byte buffer: data in [off, len). */
typedef struct fr_master_buf { uint8_t *p; size_t off, len, cap; } fr_master_buf;

typedef struct fr_master_client fr_master_client;

typedef struct fr_master_conn {
    fr_master *m;
    int fd;                      /* -1: in-memory (fr_master_feed) */
    uint64_t serial;
    uint16_t role;               /* FR_ROLE_STORE_CLIENT / FR_ROLE_STORE_NODE */
    uint64_t node;               /* node id this connection speaks for (0: none) */
    uint64_t instance;           /* the peer's instance from its handshake (0: unknown) */
    uint32_t caps;               /* FR_AUTH_CAP_EPOCH: every frame carries an epoch */
    fr_master_client *client;    /* client role with an instance: its record */
    char peer[64];
    fr_master_buf in, out;
    uint64_t last_seen;          /* liveness clock (fr_master.live) of the last byte read */
    bool held;                   /* input left unparsed: its output is over FR_MASTER_OUT_HIGH */
    uint64_t frames;             /* frames received */
    bool closing;                /* flush what is queued, then close */
    bool shut;                   /* closing, output sent and FIN sent: input is discarded */
    uint64_t linger_until;       /* monotonic ms: close a shut connection by then */
    bool dead;                   /* close now */
    bool reading;                /* EPOLLIN registered */
    bool writing;                /* EPOLLOUT registered */
    fr_dnode link;               /* fr_master.conns */
    fr_dnode watches;            /* fr_master_watch.clink */
    fr_dnode waits;              /* fr_master_wait.clink */
} fr_master_conn;

typedef struct fr_master_watch {
    fr_master_conn *c;
    uint64_t req_id;
    uint64_t next_rev;
    char *prefix;
    fr_dnode mlink, clink;
} fr_master_watch;

/* A BARRIER arrival parked until its generation is released. */
typedef struct fr_master_wait {
    fr_master_conn *c;
    uint64_t req_id;
    uint64_t generation;
    uint64_t deadline;           /* monotonic ms; 0: none */
    uint64_t timeout_ms;
    char *name, *member;
    fr_dnode mlink, clink;
} fr_master_wait;

/* A node as the master sees it: live (its connection is heard), suspect
 * (connected but silent past the heartbeat timeout) or gone (its connection
 * closed). Suspect and gone nodes are unreachable: their segments get no
 * new placement and reads of their objects fail fast, but nothing is lost
 * until the node is declared dead (docs/store.md, "Liveness"). */
typedef struct fr_master_node {
    uint64_t id;                 /* random per node process: its incarnation */
    char name[FR_SMSG_NAME_MAX + 1];  /* stable across incarnations ("": none) */
    fr_master_conn *conn;        /* NULL while gone */
    uint64_t gone_since;         /* liveness clock when its connection closed (gone) */
    uint64_t quiet_since;        /* liveness clock of its last sign of life */
    uint64_t unreachable_wall;   /* wall ms it became unreachable; 0: reachable */
    bool suspect;
} fr_master_node;

/* A client process, by the instance id of its connection (stable across
 * its reconnects): what it holds is released only when it is gone past
 * the grace period. */
struct fr_master_client {
    uint64_t instance;
    fr_master_conn *conn;        /* NULL while gone */
    uint64_t gone_since;         /* liveness clock */
    char peer[64];
    bool suspect;
};

/* A MOUNT waiting for its probe of the node's engine (off the loop). */
typedef struct fr_master_probe {
    fr_master *m;
    uint64_t conn_serial, req_id;
    uint64_t segment, node, size, granule;
    char name[FR_SMSG_NAME_MAX + 1];
    uint8_t desc[FR_SMSG_DESC_MAX];
    uint16_t desc_len;
    int rc;                      /* the probe's result */
    char why[320];
    struct fr_master_probe *next;
} fr_master_probe;

typedef struct fr_master_seg {
    uint64_t id, node;
    bool attached;               /* its node mounted it since this master started */
    uint16_t desc_len;
    uint8_t desc[FR_SMSG_DESC_MAX];
} fr_master_seg;

/* Handoff of authenticated sockets from handshake threads to the loop. */
typedef struct fr_master_handoff {
    int fd;
    uint16_t role;
    uint64_t instance;           /* the peer's client_instance */
    uint32_t caps;               /* FR_AUTH_CAP_* the handshake agreed on */
    char peer[64];
    struct fr_master_handoff *next;
} fr_master_handoff;

struct fr_master {
    fr_master_config cfg;
    fr_meta *meta;
    fr_wal *wal;
    struct fr_ha_elect *ha;      /* replicated (cfg.etcd): this master's candidacy */
    uint64_t ha_leaderships;     /* the cluster's leaderships, this one included */
    int64_t epoch;               /* its leadership's */
    uint64_t instance;
    uint8_t key[32];
    char address[80];
    bool mem;                    /* no sockets (fr_master_open_mem) */
    int lfd, epfd;
    int stop_pipe[2];
    int handoff_efd;
    int fatal;                   /* first fatal error; ends the loop */
    uint64_t serial;
    uint64_t now_mono, now_wall; /* clocks of the current iteration */
    uint64_t live;               /* liveness clock, ms: advances at most FR_MASTER_STALL_MS per
                                  * iteration, so time the loop did not run is never held
                                  * against a peer */
    uint64_t ckpt_records;       /* fr_meta_records at the last checkpoint */
    uint64_t next_liveness;      /* monotonic ms */
    fr_dnode conns;
    size_t nconns;
    fr_dnode watches;
    fr_dnode waits;
    fr_umap nodes;               /* id -> fr_master_node */
    fr_umap clients;             /* instance -> fr_master_client */
    bool resume;                 /* a held connection drained: parse it next iteration */
    size_t out_total;            /* unsent reply bytes over every connection */
    struct {                     /* since start, in STATUS */
        uint64_t suspected, declared_dead, clients_released, stalls, holds;
    } lstats;
    fr_master_mx mx;             /* metrics: counters and the published snapshot */
    fr_umap segs;                /* id -> fr_master_seg */
    /* scratch of the dispatcher (the loop is single-threaded) */
    char k1[FR_KEY_MAX + 1], k2[FR_KEY_MAX + 1];
    fr_kv_event *events;         /* FR_MASTER_EVENTS_FRAME */
    fr_smsg_item *items;         /* FR_MASTER_EVENTS_FRAME, grown for KEYS */
    size_t items_cap;
    /* accept side */
    pthread_t acceptor;
    bool acceptor_started;
    struct fr_hsgate *gate;      /* handshakes in flight, run by the acceptor */
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* a probe finished (fr_master_close waits for them) */
    fr_master_handoff *handoff;  /* under mu */
    fr_master_probe *probed;     /* finished probes, under mu */
    size_t nprobes;              /* probes in flight, under mu */
    bool closing;                /* under mu */
};

/* clocks */
uint64_t fr_master_wall_ms(void);

/* master_conn.c */
fr_master_conn *fr_master_conn_new(fr_master *m, int fd, uint16_t role, const char *peer);
/* Unlink, withdraw its barrier arrivals, drop its watches, close, free. */
void fr_master_conn_free(fr_master_conn *c);
/* Read what is there (up to a burst) and dispatch complete frames. */
void fr_master_conn_read(fr_master_conn *c);
/* Dispatch complete frames already in c->in. */
void fr_master_conn_parse(fr_master_conn *c);
/* Write queued output; false when the connection broke. */
bool fr_master_conn_flush(fr_master_conn *c);
/* A closing connection whose output is sent: FIN, then discard its input
 * until EOF or the linger deadline (so the kernel does not reset it with
 * our last reply unread). */
void fr_master_conn_shut(fr_master_conn *c);
/* Update epoll interest after a flush or a change of state. */
void fr_master_conn_interest(fr_master_conn *c);
/* Queue one reply frame. Replaces an unencodable reply by an ERROR. */
void fr_master_reply(fr_master_conn *c, uint64_t req_id, const fr_smsg *r);
void fr_master_reply_ok(fr_master_conn *c, uint64_t req_id);
void fr_master_reply_err(fr_master_conn *c, uint64_t req_id, int code, uint64_t detail,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* ERROR with fr_meta_errmsg (or strerror when it is empty); notes FERRY_EIO. */
void fr_master_reply_meta_err(fr_master_conn *c, uint64_t req_id, int code, uint64_t detail);
size_t fr_master_conn_pending_out(const fr_master_conn *c);
/* Back-pressure: true when c must not be answered more until its output
 * drains (its own limit, or the master's total with c a big part of it). */
bool fr_master_conn_backed_up(const fr_master_conn *c);

/* master_ops.c */
void fr_master_dispatch(fr_master_conn *c, const fr_frame_hdr *h, const fr_smsg *r);

/* master_sync.c */
void fr_master_watch_start(fr_master_conn *c, uint64_t req_id, const char *prefix, uint64_t from);
int fr_master_watch_stop(fr_master_conn *c, uint64_t id);
void fr_master_watch_free(fr_master_watch *w);
void fr_master_watch_push_all(fr_master *m);
void fr_master_barrier(fr_master_conn *c, uint64_t req_id, const char *name, const char *member,
                       uint32_t count, uint64_t timeout_ms);
void fr_master_wait_free(fr_master_wait *w, bool leave);
void fr_master_barrier_timeouts(fr_master *m);
uint64_t fr_master_barrier_next_deadline(const fr_master *m);
void fr_master_liveness(fr_master *m);
/* A node-role connection spoke for node id (MOUNT done or HEARTBEAT): it is
 * that node's connection from now on, and the node is live. NULL when the
 * node is unknown. */
fr_master_node *fr_master_node_heard(fr_master_conn *c, uint64_t node);
/* Forget a node: its segments are unmounted in the meta (objects whose
 * last replica was there are lost). why says it in the log. */
void fr_master_node_dead(fr_master *m, fr_master_node *nd, const char *why);
/* Recompute whether a node's segments are reachable and tell the meta. */
void fr_master_node_reach(fr_master *m, fr_master_node *nd);
fr_master_node *fr_master_node_get(fr_master *m, uint64_t node, bool create);
/* A connection is being freed: the node or client it spoke for is gone. */
void fr_master_conn_gone(fr_master_conn *c);
/* A new client-role connection with an instance id: find or make its
 * client record (a previous connection of the same client is superseded). */
void fr_master_client_attach(fr_master_conn *c);
/* Finished probes: mount or refuse (master_ops.c). */
void fr_master_probes_done(fr_master *m);
/* Probe the engine a MOUNT's descriptor names, off the loop; the MOUNT is
 * answered when it is done (master_probe.c). FERRY_EAGAIN: too many in
 * flight. */
int fr_master_probe_start(fr_master_conn *c, uint64_t req_id, const fr_smsg *q);
int fr_master_status_json(fr_master *m, char **out);
/* Segment descriptors known to this master: seed from recovered segments. */
int fr_master_segs_recover(fr_master *m);
void fr_master_segs_free(fr_master *m);
/* Record a fatal error (FERRY_EIO from the log): the loop ends. */
void fr_master_note_fatal(fr_master *m, int code);

#endif
