/* ucx transport internals shared by its files: ucx_server.c (the engine's
 * UCP context and worker, its progress thread, the control listener and
 * memory mapping) and ucx.c (the initiator side and the ops table).
 *
 * One UCP worker per engine, in UCS_THREAD_MODE_MULTI: submitting threads
 * post puts and gets themselves, one progress thread drives the worker and
 * sleeps on its event fd when idle. Completions are never delivered from
 * inside a UCX callback: callbacks only count, and the progress thread
 * completes finished batches after ucp_worker_progress returns. */
#ifndef FR_UCX_INT_H
#define FR_UCX_INT_H

#include "engine/transport/ucx_sym.h"   /* UCX, loaded when the transport starts */

#include "engine/engine_int.h"
#include "wire/hsgate.h"

#define UCX_TAG "ucx"
#define UCX_ADDR_MAX 8192u     /* largest worker address a control peer may send */
#define UCX_UNPACK_PAD 512u    /* zeroes after a worker address or rkey handed to UCX */

typedef struct ucx_state ucx_state;
typedef struct ucx_conn ucx_conn;

/* One post() of READ/WRITE chunks: every put or get, then one endpoint
 * flush. pending counts what is outstanding plus one for the poster; the
 * batch is done when it reaches 0. */
typedef struct ucx_slot {
    struct ucx_batch *b;
    int status;                /* the chunk's own refusal or op error */
    bool issued;               /* an op was posted for it (its destination may change) */
} ucx_slot;

typedef struct ucx_batch {
    ucx_conn *c;               /* not to be touched once claimed by an abandon */
    ucx_state *st;
    atomic_uint pending;
    /* Whoever completes the chunks claims them first: the batch's last
     * callback, or the connection's failure when UCX keeps requests of a
     * closed endpoint outstanding (its shared-memory transports do), which
     * completes them and leaves the batch to be freed by that callback. */
    atomic_bool claimed;
    struct ucx_batch *live_prev, *live_next;   /* the connection's live batches (c->lock) */
    int flush_status;
    size_t n;
    fr_chunk **chunks;
    ucx_slot *slots;
    struct ucx_batch *next;    /* state's done list */
} ucx_batch;

struct ucx_state {
    ferry_engine *e;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int worker_fd;             /* ucp_worker_get_efd */
    int wake_fd;               /* eventfd: posts, closes, stop */
    int epfd;
    pthread_t progress;
    bool has_progress;

    pthread_mutex_t lock;      /* below */
    pthread_cond_t cond;
    ucx_batch *done;           /* batches whose last request finished */
    ucx_batch *abandoned;      /* failed at a close, UCX still holding requests; freed at stop */
    ucx_conn *conns;           /* initiator connections known to the progress thread */
    bool stopping;

    /* control listener (serving side) */
    int lfd;
    fr_hsgate *gate;
    pthread_t acceptor;
    bool has_acceptor;
    struct ucx_srv_conn *srv_conns;

    _Atomic uint64_t addrs_sent, eps_created;
    atomic_bool no_peer_mode;  /* UCX refused peer error handling here (shared-memory transports) */
};

struct ucx_conn {
    ucx_state *st;
    fr_peer *p;
    ucp_ep_h ep;
    int fd;                    /* control connection */
    char peer[64];

    pthread_mutex_t lock;      /* below */
    pthread_cond_t cond;
    bool failed;               /* no new work; everything outstanding fails */
    atomic_bool ep_err;        /* UCX reported the endpoint failed (set without the lock:
                                * its callback runs under the worker's lock, which a
                                * poster may be waiting for while holding ours) */
    bool ep_closed;            /* the endpoint was closed (by the progress thread) */
    bool closing;              /* disconnect() waits for the progress thread to let go */
    bool released;             /* the progress thread no longer uses it */
    uint32_t batches;          /* live batches */
    ucx_batch *live;           /* them */
    uint8_t *out;              /* control bytes not yet sent */
    size_t out_len, out_off, out_cap;
    bool want_out;             /* EPOLLOUT is armed */
    fr_chunk *await_head, *await_tail;   /* notifies sent or queued, awaiting their ACK */
    /* Keys asked of the peer (a key that came without its descriptor):
     * in order, each with the chunks parked on its answer. */
    struct ucx_keyreq {
        uint64_t key, req_id;
        fr_chunk *parked;
        struct ucx_keyreq *next;
    } *kq_head, *kq_tail;
    uint64_t next_req;
    uint8_t in[256];           /* partial control frames received */
    size_t in_len;
    struct {
        uint64_t key, base, len;
        uint32_t flags;
        ucp_rkey_h rk;
    } *rkeys;
    size_t nrkeys, cap_rkeys;
    ucx_conn *next;            /* state's list */
};

/* ucx_server.c */
int fr_ucx_start(ferry_engine *e, void **state, ferry_error *err);
void fr_ucx_stop(void *state);
/* The memory hooks of the ops table (fr_transport): mem_alloc allocates
 * with UCX (ucp_mem_map, UCP_MEM_MAP_ALLOCATE), reg maps a region with
 * ucp_mem_map (or uses its allocation's mapping) and packs its rkey. */
int fr_ucx_mem_alloc(void *state, size_t len, void **addr, void **handle);
void fr_ucx_mem_free(void *state, void *handle);
int fr_ucx_region_map(void *state, ferry_region *r, void *alloc_handle, ferry_error *err);
void fr_ucx_region_unmap(void *state, ferry_region *r);
/* Hand a connection to the progress thread (its control fd joins the epoll
 * set). 0 or a negative code. */
int fr_ucx_attach(ucx_state *st, ucx_conn *c);
/* Wake the progress thread. */
void fr_ucx_wake(ucx_state *st);
/* Keep or drop an abandoned batch on the state's list (st->lock inside). */
void fr_ucx_abandoned_add(ucx_state *st, ucx_batch *b);
void fr_ucx_abandoned_del(ucx_state *st, ucx_batch *b);
/* A batch's count reached 0: queue it for completion. */
void fr_ucx_batch_finished(ucx_batch *b);
/* UCX status to a ferry code. */
int fr_ucx_code(ucs_status_t s);

/* ucx.c, called by the progress thread */
/* Control bytes arrived or may be sent (events: EPOLLIN/EPOLLOUT/...). */
void fr_ucx_conn_io(ucx_conn *c, uint32_t events);
/* Fail c: close its endpoint (forced), fail its notifies. Progress thread. */
void fr_ucx_conn_fail(ucx_conn *c, int code);
/* Send what is queued; arm or disarm EPOLLOUT. Progress thread. */
void fr_ucx_conn_flush_out(ucx_conn *c);
/* Complete a finished batch's chunks (progress thread, no UCX lock held). */
void fr_ucx_batch_complete(ucx_batch *b);

#endif
