/* store layer: internals of the master server shared by master.c (loop,
 * sockets, timers), master_conn.c (connection buffers, framing, replies),
 * master_ops.c (request dispatch) and master_sync.c (watches, barriers,
 * liveness, status). Everything here belongs to the loop thread. */
#ifndef FR_STORE_MASTER_INT_H
#define FR_STORE_MASTER_INT_H

#include "store/master.h"
#include "store/store_int.h"
#include "wire/store_msg.h"

#define FR_MASTER_OUT_HIGH (64u << 20)   /* stop reading a connection above this unsent output */
#define FR_MASTER_READ_BURST (4u << 20)  /* bytes read from one connection per iteration */
#define FR_MASTER_TICK_MS 100            /* granularity of liveness checks */
#define FR_MASTER_HANDSHAKE_MS 5000     /* a handshake's deadline, from accept */
#define FR_MASTER_LINGER_MS 1000        /* a closing connection's time to read our last reply */
#define FR_MASTER_HANDSHAKES_MAX 1024    /* handshakes in flight (at most 1/4 of RLIMIT_NOFILE) */
#define FR_MASTER_HANDSHAKES_PER_SOURCE 256 /* handshakes in flight from one address */
#define FR_MASTER_EVENTS_FRAME 4096      /* events in one EVENTS frame */
#define FR_MASTER_FRAME_BYTES (48u << 20) /* budget of one list reply (the wire allows 64 MiB) */

/* A byte buffer: data in [off, len). */
typedef struct fr_master_buf { uint8_t *p; size_t off, len, cap; } fr_master_buf;

typedef struct fr_master_conn {
    fr_master *m;
    int fd;                      /* -1: in-memory (fr_master_feed) */
    uint64_t serial;
    uint16_t role;               /* FR_ROLE_STORE_CLIENT / FR_ROLE_STORE_NODE */
    uint64_t node;               /* node id this connection speaks for (0: none) */
    char peer[64];
    fr_master_buf in, out;
    uint64_t last_seen;          /* monotonic ms of the last frame */
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

typedef struct fr_master_node {
    uint64_t id;
    uint64_t last_heard;         /* monotonic ms */
} fr_master_node;

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
    char peer[64];
    struct fr_master_handoff *next;
} fr_master_handoff;

struct fr_master {
    fr_master_config cfg;
    fr_meta *meta;
    fr_wal *wal;
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
    uint64_t ckpt_records;       /* fr_meta_records at the last checkpoint */
    uint64_t next_liveness;      /* monotonic ms */
    fr_dnode conns;
    size_t nconns;
    fr_dnode watches;
    fr_dnode waits;
    fr_umap nodes;               /* id -> fr_master_node */
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
    fr_master_handoff *handoff;  /* under mu */
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
void fr_master_node_touch(fr_master *m, uint64_t node);
void fr_master_liveness(fr_master *m);
int fr_master_status_json(fr_master *m, char **out);
/* Segment descriptors known to this master: seed from recovered segments. */
int fr_master_segs_recover(fr_master *m);
void fr_master_segs_free(fr_master *m);
/* Record a fatal error (FERRY_EIO from the log): the loop ends. */
void fr_master_note_fatal(fr_master *m, int code);

#endif
