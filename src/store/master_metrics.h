/* store layer: the counters behind `ferry master --metrics` and `ferry node
 * --metrics` (docs/operations.md, "Metrics"), and how another thread reads
 * them without racing the master's loop.
 *
 * The master's counters belong to its loop thread (plain integers, written
 * and read there) except the handshake refusals, which the acceptor thread
 * counts (atomics). Only the loop renders them, as Prometheus text, into a
 * snapshot it publishes under mx.mu; a reader (the HTTP server's thread)
 * copies the latest snapshot under the same mutex. Neither side holds the
 * mutex for more than a pointer swap or a copy of a few kilobytes, so a
 * slow or stuck scraper never stalls the loop: the bytes go to the network
 * from the reader's own copy.
 *
 * A reader whose snapshot is older than mx.min_age asks for a fresh one
 * (an eventfd in the loop's epoll set) and waits for it up to a deadline;
 * the loop renders at most once per max(FR_MX_MIN_INTERVAL_MS, 10 x the
 * last render's cost), so scrapes however frequent take at most about a
 * tenth of the loop's time. */
#ifndef FR_STORE_MASTER_METRICS_H
#define FR_STORE_MASTER_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct fr_master fr_master;
typedef struct fr_meta fr_meta;
struct ferry_node;

#define FR_MX_OP_BASE 32          /* FR_SMSG_MOUNT, the first request type */
#define FR_MX_OPS 32              /* request types FR_MX_OP_BASE.. (index 0..30), then "other" */
#define FR_MX_OP_OTHER (FR_MX_OPS - 1)
#define FR_MX_WAL_BUCKETS 15      /* upper bounds in fr_mx_wal_le, then +Inf */
#define FR_MX_MIN_INTERVAL_MS 100 /* a snapshot this young is served as it is */
#define FR_MX_QUEUES_MAX 256      /* queues listed by name; the rest only counted */

enum { FR_MX_HS_AUTH, FR_MX_HS_PROTO, FR_MX_HS_STALE, FR_MX_HS_TIMEOUT, FR_MX_HS_DISPLACED,
       FR_MX_HS_SOCKET, FR_MX_HS_N };

typedef struct fr_master_mx {
    /* loop thread only */
    unsigned op;                  /* the request answered now: index into requests/errors */
    uint64_t requests[FR_MX_OPS], errors[FR_MX_OPS];
    uint64_t put_bytes, get_bytes;
    uint64_t leases;              /* read leases granted (GET_REPLICAS with a lease) */
    uint64_t lost;                /* objects that became LOST (unmount, node death) */
    uint64_t redelivered;         /* queue records whose lease lapsed */
    uint64_t returned;            /* queue records taken back from a client that is gone */
    uint64_t wal_commits, wal_ns, wal_bucket[FR_MX_WAL_BUCKETS + 1];
    uint64_t render_ns;           /* what the last render cost */
    /* the acceptor thread */
    _Atomic uint64_t hs_refused[FR_MX_HS_N];
    /* publication */
    int wake_fd;                  /* eventfd: a reader wants a fresh snapshot; -1: none */
    atomic_bool want;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* a snapshot was published, or the loop stopped */
    char *text;                   /* under mu: the latest snapshot (NUL-terminated) */
    uint64_t seq;                 /* under mu: snapshots published */
    uint64_t published_ns;        /* under mu: when text was rendered (fr_now_ns) */
    uint64_t next_ns;             /* under mu: no render before this */
    bool running;                 /* under mu: the loop runs and answers requests */
} fr_master_mx;

/* Set up x (wake_fd -1: a master without sockets never publishes). */
int fr_master_mx_init(fr_master_mx *x);
void fr_master_mx_fini(fr_master_mx *x);
/* The wake eventfd, added to the loop's epoll set with data.ptr = &x->wake_fd. */
int fr_master_mx_open(fr_master_mx *x, int epfd);

/* Loop-side counting. */
void fr_master_mx_request(fr_master *m, uint16_t type);   /* a frame arrived: op := type */
void fr_master_mx_op(fr_master *m, uint16_t type);        /* an answer for type follows */
void fr_master_mx_error(fr_master *m);                    /* an ERROR reply is queued */
/* A PLACEMENT or REPLICAS reply (lease_until 0: no lease). */
void fr_master_mx_objects(fr_master *m, uint16_t reply_type, uint64_t size, uint64_t lease_until);
void fr_master_mx_wal_commit(fr_master *m, uint64_t ns);
/* The gate's failed callback (acceptor thread): arg is the master. */
void fr_master_mx_handshake_failed(void *arg, int code);

/* Loop: the wake eventfd was readable. */
void fr_master_mx_woken(fr_master *m);
/* Loop, after each iteration: render and publish when a reader asked (or
 * always with force), then wake the readers. */
void fr_master_mx_publish(fr_master *m, bool force);
/* Loop: it stops answering; readers waiting get the last snapshot. */
void fr_master_mx_stopped(fr_master *m);

/* Any thread: a copy of a snapshot at most FR_MX_MIN_INTERVAL_MS old when
 * the loop can render one within wait_ms, else the latest there is.
 * FERRY_EAGAIN when none was ever published; FERRY_ENOMEM. *out: fr_free. */
int fr_master_mx_text(fr_master *m, int wait_ms, char **out);
/* The Prometheus text itself (loop thread). NULL: out of memory. */
char *fr_master_mx_render(fr_master *m);

/* What the meta can say about itself in O(1) (meta_gauges.c). */
typedef struct fr_meta_gauges {
    uint64_t complete, pending, lost;    /* objects by state */
    uint64_t complete_bytes;             /* bytes of COMPLETE objects */
    uint64_t evictions;                  /* since this meta was made */
    uint64_t queues;
} fr_meta_gauges;
void fr_meta_gauges_get(const fr_meta *m, fr_meta_gauges *out);
typedef struct fr_meta_qgauge { const char *name; uint64_t ready, leased, bound; } fr_meta_qgauge;
/* Up to cap queues (any order); returns how many there are. Names are
 * borrowed until the next mutation. */
size_t fr_meta_queue_gauges(const fr_meta *m, fr_meta_qgauge *out, size_t cap);

/* Prometheus helpers shared by the master's and the node's pages: a label
 * value escaped (backslash, quote, newline; bytes that are not UTF-8 as
 * U+FFFD), and a family's HELP and TYPE lines. */
void fr_mx_label(FILE *f, const char *s);
void fr_mx_family(FILE *f, const char *name, const char *type, const char *help);
/* Close a memstream (open_memstream(buf, len)) into an fr_malloc'd copy of
 * its text; NULL on error. */
char *fr_mx_finish(FILE *f, char **buf, size_t *len);

/* The node's counters (node.c) for its page (node_metrics.c). */
typedef struct fr_node_counters {
    uint64_t id, segment, segment_size;
    uint64_t mounts, mount_failures;
    bool mounted;                 /* its last mount on the master succeeded */
} fr_node_counters;
void fr_node_counters_get(const struct ferry_node *n, fr_node_counters *out);
struct ferry_engine *fr_node_engine(struct ferry_node *n);

#endif
