/* shm transport: same-host peers.
 *
 * The target exports a key table (a memfd it writes, peers map read-only)
 * and, on request, the memfd behind any region allocated with
 * ferry_mem_alloc. The initiator checks key, access and bounds against the
 * live key table, then moves bytes itself: memcpy into the mapped memfd, or
 * cross-memory attach (process_vm_readv/writev) for other registered memory.
 * The target does no work per transfer. A control connection (abstract unix
 * socket, authenticated like tcp) carries the fds and notifications; a pidfd
 * tells the initiator when the target process is gone. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "wire/hsgate.h"

/* ---- fd passing ------------------------------------------------------------ */

static int send_with_fd(int sock, const fr_msg *m, int fd)
{
    uint8_t buf[FR_WIRE_HDR_LEN + 64];
    int n = fr_wire_encode(m, 0, 0, buf, sizeof buf);
    if (n < 0)
        return n;
    struct iovec iov = {.iov_base = buf, .iov_len = (size_t)n};
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } cm;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&cm, 0, sizeof cm);
        mh.msg_control = cm.b;
        mh.msg_controllen = sizeof cm.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    ssize_t w;
    do
        w = sendmsg(sock, &mh, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w != n)
        return FERRY_ECONNRESET;
    return 0;
}

/* Receive one fixed-size message that may carry an fd (*fd = -1 if none). */
static int recv_with_fd(int sock, fr_msg *m, int *fd)
{
    uint8_t buf[FR_WIRE_HDR_LEN + 64];
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } cm;
    struct iovec iov = {.iov_base = buf, .iov_len = FR_WIRE_HDR_LEN};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
    *fd = -1;
    ssize_t r;
    do
        r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (r < 0 && errno == EINTR);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            memcpy(fd, CMSG_DATA(c), sizeof *fd);
    if (r != FR_WIRE_HDR_LEN)
        goto fail;
    fr_frame_hdr h;
    int rc = fr_wire_hdr_decode(buf, FR_WIRE_HDR_LEN, &h);
    size_t ml = rc == 0 ? fr_wire_meta_len(h.type) : 0;
    if (rc < 0 || ml > 64 || h.len != ml)
        goto fail;
    rc = fr_read_full(sock, buf + FR_WIRE_HDR_LEN, ml);
    if (rc < 0 || fr_wire_decode(&h, buf + FR_WIRE_HDR_LEN, ml, m) < 0)
        goto fail;
    return 0;
fail:
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
    return r == 0 ? FERRY_ECONNRESET : FERRY_EPROTO;
}

/* ---- server side ------------------------------------------------------------ */

typedef struct srv_conn {
    struct shm_server *srv;
    int fd;
    uint64_t peer_instance;    /* the client engine's instance, from its AUTH */
    pthread_t th;
    bool done;
    struct srv_conn *next;
} srv_conn;

typedef struct shm_server {
    ferry_engine *e;
    int lfd;
    fr_hsgate *gate;           /* accepting and handshakes, on accept_th */
    pthread_t accept_th;
    pthread_mutex_t lock;
    srv_conn *conns;
    bool stopping;
} shm_server;

/* An authenticated control connection (the gate ran its handshake). */
static void serve_ctrl(ferry_engine *e, int fd, uint64_t peer_instance)
{
    fr_msg hello = {.type = FR_MSG_SHM_HELLO};
    hello.u.shm_hello.pid = (uint32_t)getpid();
    hello.u.shm_hello.table_slots = FR_KEYTAB_SLOTS;
    if (send_with_fd(fd, &hello, e->keytab_fd) < 0)
        return;
    for (;;) {
        fr_frame_hdr h;
        fr_msg m;
        int rc = fr_recv_msg(fd, &h, &m);
        if (rc == FERRY_ECONNRESET)
            return;
        if (rc < 0 || (m.type != FR_MSG_MAP && m.type != FR_MSG_NOTIFY)) {
            char who[64];
            fr_sock_peername(fd, who, sizeof who);
            FR_WARN("shm", "dropping control connection from pid %s: %s", who,
                    rc < 0 ? ferry_strerror(rc) : "unexpected message");
            FR_STAT_ADD(e, frames_rejected, 1);
            return;
        }
        if (m.type == FR_MSG_NOTIFY) {
            fr_notify_deliver(e, peer_instance, m.u.notify.tag, m.u.notify.value);
            fr_msg ack = {.type = FR_MSG_ACK};
            if (fr_send_msg(fd, &ack, h.req_id) < 0)
                return;
            continue;
        }
        fr_msg resp = {.type = FR_MSG_MAP_RESP};
        int mfd = -1;
        if (fr_region_map_info(e, m.u.map.key, &resp.u.map_resp, &mfd) < 0)
            mfd = -1;
        else
            FR_STAT_ADD(e, shm_maps_served, 1);
        if (send_with_fd(fd, &resp, mfd) < 0)
            return;
    }
}

static void *srv_conn_main(void *arg)
{
    srv_conn *c = arg;
    serve_ctrl(c->srv->e, c->fd, c->peer_instance);
    /* Its descriptor goes now, not when the next connection reaps the
     * thread; under the lock, so stop never shuts down a recycled fd. */
    pthread_mutex_lock(&c->srv->lock);
    close(c->fd);
    c->fd = -1;
    c->done = true;
    pthread_mutex_unlock(&c->srv->lock);
    return NULL;
}

/* Join connection threads that finished (server lock held). */
static void reap_locked(shm_server *s)
{
    for (srv_conn **pp = &s->conns; *pp;) {
        srv_conn *c = *pp;
        if (!c->done) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        pthread_join(c->th, NULL);
        fr_free(c);
    }
}

/* The gate's callback (on accept_th): an authenticated control connection
 * gets its own thread. Those are not capped: they proved the token. */
static void ctrl_ready(void *arg, int fd, const fr_msg_auth *auth, const char *peer)
{
    shm_server *s = arg;
    (void)peer;
    pthread_mutex_lock(&s->lock);
    reap_locked(s);
    srv_conn *c = s->stopping ? NULL : fr_calloc(1, sizeof *c);
    if (c) {
        c->srv = s;
        c->fd = fd;
        c->peer_instance = auth->client_instance;
        if (pthread_create(&c->th, NULL, srv_conn_main, c) == 0) {
            c->next = s->conns;
            s->conns = c;
        } else {
            close(fd);
            fr_free(c);
        }
    } else {
        close(fd);
    }
    pthread_mutex_unlock(&s->lock);
}

static void ctrl_failed(void *arg, int code)
{
    shm_server *s = arg;
    FR_STAT_ADD(s->e, auth_refused, 1);
    if (code == FERRY_EPROTO)
        FR_STAT_ADD(s->e, frames_rejected, 1);
}

static void *accept_main(void *arg)
{
    shm_server *s = arg;
    (void)fr_hsgate_run(s->gate);   /* a failure is logged */
    return NULL;
}

static int shm_start(ferry_engine *e, void **state, ferry_error *err)
{
    shm_server *s = fr_calloc(1, sizeof *s);
    if (!s)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    s->e = e;
    pthread_mutex_init(&s->lock, NULL);
    snprintf(e->ep.uds, sizeof e->ep.uds, "ferry-%u-%016llx", (unsigned)getpid(),
             (unsigned long long)e->ep.instance);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t nl = strlen(e->ep.uds);
    memcpy(a.sun_path + 1, e->ep.uds, nl);   /* abstract namespace: no file to clean up */
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    const char *step = "cannot listen on the abstract socket";
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, alen) < 0 || listen(s->lfd, 128) < 0)
        goto fail;
    step = "cannot open the handshake gate of";
    /* Every peer here is a local process: the source a cap counts is its
     * user (SO_PEERCRED). */
    const fr_hsgate_config gc = {
        .tag = "shm", .key = e->auth_key, .instance = e->ep.instance, .role = FR_ROLE_SHM_CTRL,
        .deadline_ms = e->cfg.connect_timeout_ms > 0 ? (unsigned)e->cfg.connect_timeout_ms : 0,
        .stop_fd = -1, .ready = ctrl_ready, .failed = ctrl_failed, .arg = s,
    };
    if (fr_hsgate_open(&gc, s->lfd, &s->gate) < 0)
        goto fail;
    step = "cannot start the thread that accepts on";
    if (pthread_create(&s->accept_th, NULL, accept_main, s) != 0)
        goto fail;
    e->ep.transports |= FR_TRANSPORT_SHM;
    *state = s;
    return 0;
fail:
    fr_fail(err, FERRY_EIO, "%s @%s: %s", step, e->ep.uds, strerror(errno));
    fr_hsgate_close(s->gate);
    if (s->lfd >= 0)
        close(s->lfd);
    pthread_mutex_destroy(&s->lock);
    fr_free(s);
    return FERRY_EIO;
}

static void shm_stop(void *state)
{
    shm_server *s = state;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->lock);
    fr_hsgate_stop(s->gate);
    pthread_join(s->accept_th, NULL);   /* it closed the handshakes in flight */
    fr_hsgate_close(s->gate);
    close(s->lfd);
    pthread_mutex_lock(&s->lock);
    while (s->conns) {
        srv_conn *c = s->conns;
        s->conns = c->next;
        pthread_mutex_unlock(&s->lock);
        pthread_join(c->th, NULL);   /* it closed its descriptor */
        fr_free(c);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_destroy(&s->lock);
    fr_free(s);
}

/* ---- client side -------------------------------------------------------------- */

typedef struct shm_map {
    uint32_t memfd_id;
    uint8_t *addr;
    uint64_t len;
} shm_map;

typedef struct shm_conn {
    ferry_engine *e;
    ferry_peer_id peer;
    int ctrl;                  /* control socket */
    pthread_mutex_t ctrl_lock; /* one request/response at a time */
    pthread_cond_t ctrl_cond;  /* notify turn changes */
    uint64_t next_req;
    uint64_t notify_posted;    /* sequence given to the next posted NOTIFY (lock) */
    uint64_t notify_turn;      /* sequence of the NOTIFY allowed to go next (ctrl_lock) */
    const fr_keyslot *keytab;  /* the target's table, read-only */
    int pidfd;
    pid_t pid;

    pthread_mutex_t lock;      /* queue, maps, dead */
    pthread_cond_t cond;
    fr_chunk *head, *tail;
    atomic_bool stopping;      /* read under ctrl_lock too */
    atomic_bool dead;
    shm_map *maps;
    size_t nmaps, cap_maps;
    pthread_t *workers;
    unsigned nworkers;
} shm_conn;

#define RUN_MAX 64               /* chunks one worker takes at a time */
#define RUN_BYTES (256u << 10)   /* ... as long as they are this small together */

static bool target_alive(shm_conn *c)
{
    if (atomic_load(&c->dead))
        return false;
    bool alive;
    if (c->pidfd >= 0) {
        struct pollfd p = {.fd = c->pidfd, .events = POLLIN};
        alive = poll(&p, 1, 0) == 0;
    } else {
        alive = kill(c->pid, 0) == 0 || errno != ESRCH;
    }
    if (!alive)
        atomic_store(&c->dead, true);
    return alive;
}

/* Ask the target for the memfd behind the region of `key` (its fd in *fd,
 * to be closed by the caller, and the map response). */
static int request_memfd(shm_conn *c, uint64_t key, fr_msg *resp, int *fd)
{
    fr_msg req = {.type = FR_MSG_MAP};
    req.u.map.key = key;
    *fd = -1;
    pthread_mutex_lock(&c->ctrl_lock);
    int rc = fr_send_msg(c->ctrl, &req, ++c->next_req);
    if (rc == 0)
        rc = recv_with_fd(c->ctrl, resp, fd);
    pthread_mutex_unlock(&c->ctrl_lock);
    if (rc < 0) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        atomic_store(&c->dead, true);
        return FERRY_ECONNRESET;
    }
    if (resp->type != FR_MSG_MAP_RESP || resp->u.map_resp.status < 0 || *fd < 0) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return resp->type == FR_MSG_MAP_RESP && resp->u.map_resp.status < 0 ? resp->u.map_resp.status : FERRY_EPROTO;
    }
    return 0;
}

/* The mapping of a target memfd, asking the target for it the first time. */
static int get_map(shm_conn *c, const fr_keyslot *s, uint64_t key, uint8_t **base)
{
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nmaps; i++) {
        if (c->maps[i].memfd_id == s->memfd_id) {
            *base = c->maps[i].addr;
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&c->lock);

    fr_msg resp;
    int fd = -1;
    int rc = request_memfd(c, key, &resp, &fd);
    if (rc < 0)
        return rc;
    void *p = mmap(NULL, resp.u.map_resp.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return FERRY_ENOMEM;
    pthread_mutex_lock(&c->lock);
    rc = fr_grow((void **)&c->maps, &c->cap_maps, c->nmaps + 1, sizeof *c->maps);
    if (rc == 0)
        c->maps[c->nmaps++] = (shm_map){.memfd_id = s->memfd_id, .addr = p, .len = resp.u.map_resp.map_len};
    pthread_mutex_unlock(&c->lock);
    if (rc < 0) {
        munmap(p, resp.u.map_resp.map_len);
        return rc;
    }
    *base = p;
    return 0;
}

/* Cross-memory attach of one row of a chunk. */
static int cma_row(shm_conn *c, const fr_chunk *k, uint8_t *local, uint64_t remote, bool *touched)
{
    uint64_t done = 0;
    while (done < k->len) {
        struct iovec l = {.iov_base = local + done, .iov_len = k->len - done};
        struct iovec r = {.iov_base = (void *)(uintptr_t)(remote + done), .iov_len = k->len - done};
        ssize_t n = k->opcode == FERRY_OP_WRITE ? process_vm_writev(c->pid, &l, 1, &r, 1, 0)
                                                : process_vm_readv(c->pid, &l, 1, &r, 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = errno;
            if (err == ESRCH)
                atomic_store(&c->dead, true);
            return err == ESRCH ? FERRY_ECONNRESET : err == EPERM ? FERRY_EACCES : FERRY_EFAULT;
        }
        *touched = true;
        done += (uint64_t)n;
    }
    return 0;
}

static int cma(shm_conn *c, const fr_chunk *k, bool *touched)
{
    const uint64_t rows = k->rows > 1 ? k->rows : 1;
    int rc = 0;
    for (uint64_t i = 0; i < rows && rc == 0; i++)
        rc = cma_row(c, k, k->local + i * k->lstride, k->remote_addr + i * k->rstride, touched);
    return rc;
}

/* Notifies go out in the order they were posted, whichever copy worker
 * picked them up: each waits for its turn on the control socket. */
static void do_notify(shm_conn *c, fr_chunk *k)
{
    fr_msg m = {.type = FR_MSG_NOTIFY}, ack;
    m.u.notify.tag = k->tag;
    m.u.notify.value = k->value;
    fr_frame_hdr h;
    int rc = 0;
    pthread_mutex_lock(&c->ctrl_lock);
    while (c->notify_turn != k->req_id && !c->stopping && !atomic_load(&c->dead))
        pthread_cond_wait(&c->ctrl_cond, &c->ctrl_lock);
    if (c->notify_turn != k->req_id)
        rc = FERRY_ECONNRESET;
    if (rc == 0)
        rc = fr_send_msg(c->ctrl, &m, ++c->next_req);
    if (rc == 0)
        rc = fr_recv_msg(c->ctrl, &h, &ack);
    c->notify_turn++;
    pthread_cond_broadcast(&c->ctrl_cond);
    pthread_mutex_unlock(&c->ctrl_lock);
    if (rc < 0 || ack.type != FR_MSG_ACK) {
        atomic_store(&c->dead, true);
        fr_chunk_done(k, FERRY_ECONNRESET, false);
        return;
    }
    fr_chunk_done(k, ack.u.ack.status, false);
}

/* The last mapping a worker used: consecutive chunks usually hit the same
 * memfd, and maps live as long as the connection. */
typedef struct map_hint { uint64_t memfd_id; uint8_t *base; } map_hint;

/* Copy one chunk (the target's liveness is checked by the caller). */
static int copy_one(shm_conn *c, fr_chunk *k, bool *touched, map_hint *h)
{
    fr_keyslot s;
    unsigned need = k->opcode == FERRY_OP_WRITE ? FERRY_REMOTE_WRITE : FERRY_REMOTE_READ;
    if (fr_keytab_lookup(c->keytab, k->key, &s) < 0 || !(s.flags & need))
        return FERRY_EACCES;
    /* the whole op must fit, so a partly-outside op touches nothing in any chunk */
    if (k->span_addr < s.base || k->span_addr - s.base > s.len || k->span_len > s.len - (k->span_addr - s.base))
        return FERRY_EFAULT;
    int rc = 0;
    uint8_t *base = NULL;
    if (s.memfd_id != 0 && h->base && h->memfd_id == s.memfd_id)
        base = h->base;
    else if (s.memfd_id != 0 && (rc = get_map(c, &s, k->key, &base)) == 0)
        *h = (map_hint){ .memfd_id = s.memfd_id, .base = base };
    if (s.memfd_id != 0 && rc == 0) {
        /* Every row lies inside the span checked above. */
        uint8_t *remote = base + s.memfd_off + (k->remote_addr - s.base);
        const uint64_t rows = k->rows > 1 ? k->rows : 1;
        *touched = true;
        if (k->opcode == FERRY_OP_WRITE)
            for (uint64_t i = 0; i < rows; i++)
                memcpy(remote + i * k->rstride, k->local + i * k->lstride, k->len);
        else
            for (uint64_t i = 0; i < rows; i++)
                memcpy(k->local + i * k->lstride, remote + i * k->rstride, k->len);
        return 0;
    }
    return cma(c, k, touched);
}

/* Copy a run of READ/WRITE chunks. The target's liveness is checked once
 * before and once after the run (each check is a syscall, which would
 * dominate small ops): a target that died during the copies never gets a
 * COMPLETED for any chunk of the run. */
static void do_rw_run(shm_conn *c, fr_chunk **ks, size_t n)
{
    int rcs[RUN_MAX];
    bool touched[RUN_MAX];
    bool alive = target_alive(c);
    map_hint h = {0};
    for (size_t i = 0; i < n; i++) {
        touched[i] = false;
        rcs[i] = alive ? copy_one(c, ks[i], &touched[i], &h) : FERRY_ECONNRESET;
    }
    atomic_thread_fence(memory_order_release);
    bool still = alive && target_alive(c);
    for (size_t i = 0; i < n; i++)
        fr_chunk_done(ks[i], rcs[i] == 0 && !still ? FERRY_ECONNRESET : rcs[i], touched[i]);
}

static void *worker_main(void *arg)
{
    shm_conn *c = arg;
    fr_chunk *run[RUN_MAX];
    for (;;) {
        pthread_mutex_lock(&c->lock);
        while (!c->head && !c->stopping)
            pthread_cond_wait(&c->cond, &c->lock);
        if (!c->head) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        /* A NOTIFY alone; else consecutive READ/WRITE chunks up to RUN_BYTES
         * (small ops share one liveness check; big ones still spread over
         * the workers one chunk each). */
        size_t n = 0;
        uint64_t bytes = 0;
        bool notify = c->head->opcode == FERRY_OP_NOTIFY;
        while (c->head && n < (notify ? 1u : RUN_MAX) &&
               (n == 0 || (c->head->opcode != FERRY_OP_NOTIFY && bytes + fr_chunk_bytes(c->head) <= RUN_BYTES))) {
            fr_chunk *k = c->head;
            c->head = k->next;
            if (!c->head)
                c->tail = NULL;
            bytes += fr_chunk_bytes(k);
            run[n++] = k;
        }
        pthread_mutex_unlock(&c->lock);
        if (c->stopping) {
            for (size_t i = 0; i < n; i++)
                fr_chunk_done(run[i], FERRY_ECONNRESET, false);
        } else if (notify) {
            do_notify(c, run[0]);
        } else {
            do_rw_run(c, run, n);
        }
    }
}

static void conn_free(shm_conn *c)
{
    for (size_t i = 0; i < c->nmaps; i++)
        munmap(c->maps[i].addr, c->maps[i].len);
    fr_free(c->maps);
    if (c->keytab)
        munmap((void *)c->keytab, FR_KEYTAB_SLOTS * sizeof(fr_keyslot));
    if (c->ctrl >= 0)
        close(c->ctrl);
    if (c->pidfd >= 0)
        close(c->pidfd);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->ctrl_lock);
    pthread_cond_destroy(&c->ctrl_cond);
    pthread_cond_destroy(&c->cond);
    fr_free(c->workers);
    fr_free(c);
}

static int handshake(ferry_engine *e, fr_peer *p, shm_conn *c, ferry_error *err)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t nl = strnlen(p->ep.uds, FR_UDS_MAX);
    if (nl == 0)
        return fr_fail(err, FERRY_ENOTSUP, "the peer serves no shm socket");
    memcpy(a.sun_path + 1, p->ep.uds, nl);
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    c->ctrl = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->ctrl < 0)
        return fr_fail(err, FERRY_EIO, "socket: %s", strerror(errno));
    if (connect(c->ctrl, (struct sockaddr *)&a, alen) < 0)
        return fr_fail(err, FERRY_ECONNREFUSED, "connect to @%.*s: %s (is the peer process alive?)", (int)nl,
                       p->ep.uds, strerror(errno));
    fr_sock_timeouts(c->ctrl, e->cfg.connect_timeout_ms);
    uint32_t pid;
    int rc = fr_auth_client(e, c->ctrl, p, FR_ROLE_SHM_CTRL, 0, &pid, err);
    if (rc < 0)
        return rc;
    fr_msg hello;
    int tfd;
    rc = recv_with_fd(c->ctrl, &hello, &tfd);
    if (rc < 0)
        return fr_fail(err, rc, "no key table from the peer: %s", ferry_strerror(rc));
    if (hello.type != FR_MSG_SHM_HELLO || hello.u.shm_hello.table_slots != FR_KEYTAB_SLOTS || tfd < 0) {
        if (tfd >= 0)
            close(tfd);
        return fr_fail(err, FERRY_EPROTO, "the peer's hello is malformed (another ferry version?)");
    }
    void *t = mmap(NULL, FR_KEYTAB_SLOTS * sizeof(fr_keyslot), PROT_READ, MAP_SHARED, tfd, 0);
    close(tfd);
    if (t == MAP_FAILED)
        return fr_fail(err, FERRY_ENOMEM, "cannot map the peer's key table: %s", strerror(errno));
    c->keytab = t;
    c->pid = (pid_t)hello.u.shm_hello.pid;
    c->pidfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
    fr_sock_timeouts(c->ctrl, 0);
    return 0;
}

static int shm_connect(ferry_engine *e, fr_peer *p, void **out, ferry_error *err)
{
    shm_conn *c = fr_calloc(1, sizeof *c);
    if (!c)
        return fr_fail(err, FERRY_ENOMEM, "out of memory");
    c->e = e;
    c->peer = p->id;
    c->ctrl = -1;
    c->pidfd = -1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->ctrl_lock, NULL);
    pthread_cond_init(&c->ctrl_cond, NULL);
    pthread_cond_init(&c->cond, NULL);
    int rc = handshake(e, p, c, err);
    if (rc < 0)
        goto fail;
    c->workers = fr_calloc(e->cfg.shm_threads, sizeof *c->workers);
    rc = FERRY_ENOMEM;
    if (!c->workers) {
        fr_fail(err, rc, "out of memory");
        goto fail;
    }
    for (; c->nworkers < e->cfg.shm_threads; c->nworkers++)
        if (pthread_create(&c->workers[c->nworkers], NULL, worker_main, c) != 0)
            break;
    if (c->nworkers == 0) {
        fr_fail(err, rc, "cannot start a copy thread");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    conn_free(c);
    return rc;
}

static int shm_post(void *conn, fr_chunk **chunks, size_t n)
{
    shm_conn *c = conn;
    pthread_mutex_lock(&c->lock);
    if (c->stopping || atomic_load(&c->dead)) {
        pthread_mutex_unlock(&c->lock);
        return FERRY_ECONNRESET;
    }
    for (size_t i = 0; i < n; i++) {
        chunks[i]->next = NULL;
        if (chunks[i]->opcode == FERRY_OP_NOTIFY)
            chunks[i]->req_id = c->notify_posted++;
        if (c->tail)
            c->tail->next = chunks[i];
        else
            c->head = chunks[i];
        c->tail = chunks[i];
    }
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

static void shm_disconnect(void *conn)
{
    shm_conn *c = conn;
    pthread_mutex_lock(&c->lock);
    c->stopping = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    shutdown(c->ctrl, SHUT_RDWR);   /* unblocks a worker waiting on the target */
    pthread_mutex_lock(&c->ctrl_lock);
    pthread_cond_broadcast(&c->ctrl_cond);
    pthread_mutex_unlock(&c->ctrl_lock);
    /* Workers fail what is still queued, finish the copy in hand, and exit. */
    for (unsigned i = 0; i < c->nworkers; i++)
        pthread_join(c->workers[i], NULL);
    conn_free(c);
}

/* ferry_remote_map: a read-only view of [addr, addr + len) of the region
 * of `key`, checked against the live key table like a READ, in a mapping
 * of its own (not the connection's cache): the caller unmaps it. */
static int shm_map_remote(void *conn, uint64_t key, uint64_t addr, uint64_t len, ferry_mapping *out)
{
    shm_conn *c = conn;
    if (!target_alive(c))
        return FERRY_ECONNRESET;
    fr_keyslot s;
    if (fr_keytab_lookup(c->keytab, key, &s) < 0 || !(s.flags & FERRY_REMOTE_READ))
        return FERRY_EACCES;
    if (addr < s.base || addr - s.base > s.len || len > s.len - (addr - s.base))
        return FERRY_EFAULT;
    if (s.memfd_id == 0)
        return FERRY_ENOTSUP;   /* heap memory: cross-memory attach only, no mapping */
    fr_msg resp;
    int fd = -1;
    int rc = request_memfd(c, key, &resp, &fd);
    if (rc < 0)
        return rc;
    const fr_msg_map_resp *mr = &resp.u.map_resp;
    uint64_t at = mr->fd_offset + (addr - s.base);
    if (mr->region_base != s.base || at < mr->fd_offset || at > mr->map_len ||
        len > mr->map_len - at) {
        close(fd);
        return FERRY_EPROTO;   /* the answer does not match the key table */
    }
    void *p = mmap(NULL, mr->map_len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return FERRY_ENOMEM;
    *out = (ferry_mapping){ .addr = (const uint8_t *)p + at, .base = p, .len = mr->map_len };
    return 0;
}

/* ferry_remote_warm: touch each page of [addr, addr + len) through the
 * connection's cached mapping of the region's memfd — the one the copy
 * workers use — so that their copies find the page-table entries there.
 * A write touch adds 0 to the first word of each page with a locked
 * instruction: it keeps the value, and no write of another process or
 * thread to that word can fall between its read and its write. Heap
 * memory (reached by cross-memory attach, which the kernel copies
 * through its own mappings) has nothing to warm. */
static int shm_warm(void *conn, uint64_t key, uint64_t addr, uint64_t len, bool write,
                    uint64_t *touched)
{
    shm_conn *c = conn;
    *touched = 0;
    if (!target_alive(c))
        return FERRY_ECONNRESET;
    fr_keyslot s;
    unsigned need = write ? FERRY_REMOTE_WRITE : FERRY_REMOTE_READ;
    if (fr_keytab_lookup(c->keytab, key, &s) < 0 || !(s.flags & need))
        return FERRY_EACCES;
    if (addr < s.base || addr - s.base > s.len || len > s.len - (addr - s.base))
        return FERRY_EFAULT;
    if (s.memfd_id == 0 || len == 0)
        return 0;
    uint8_t *base = NULL;
    int rc = get_map(c, &s, key, &base);
    if (rc < 0)
        return rc;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint8_t *p = base + s.memfd_off + (addr - s.base);
    uint8_t *first = (uint8_t *)((uintptr_t)p & ~(uintptr_t)(page - 1)), *end = p + len;
    uint64_t sum = 0;
    for (uint8_t *q = first < p ? first + page : first; q < end; q += page) {
        if (write)
            (void)__atomic_fetch_add((uint64_t *)(void *)q, 0, __ATOMIC_RELAXED);
        else
            sum += *(volatile const uint8_t *)q;
    }
    if (first < p)   /* the partial first page: its first word may lie outside */
        sum += *(volatile const uint8_t *)p;
    (void)sum;
    *touched = len;
    return 0;
}

/* ferry_remote_access_begin: a pointer through the cached mapping. */
static int shm_access(void *conn, uint64_t key, uint64_t addr, uint64_t len, unsigned access,
                      void **ptr)
{
    shm_conn *c = conn;
    if (!target_alive(c))
        return FERRY_ECONNRESET;
    fr_keyslot s;
    if (fr_keytab_lookup(c->keytab, key, &s) < 0 || (s.flags & access) != access)
        return FERRY_EACCES;
    if (addr < s.base || addr - s.base > s.len || len > s.len - (addr - s.base))
        return FERRY_EFAULT;
    if (s.memfd_id == 0)
        return FERRY_ENOTSUP;   /* heap memory: cross-memory attach only */
    uint8_t *base = NULL;
    int rc = get_map(c, &s, key, &base);
    if (rc < 0)
        return rc;
    *ptr = base + s.memfd_off + (addr - s.base);
    return 0;
}

static bool shm_alive(void *conn)
{
    return target_alive(conn);
}

const fr_transport fr_transport_shm = {
    .name = "shm",
    .bit = FR_TRANSPORT_SHM,
    .max_chunk = 2u << 20,
    .strided = true,   /* a chunk of rows is one run of memcpy under one check */
    .start = shm_start,
    .stop = shm_stop,
    .connect = shm_connect,
    .post = shm_post,
    .disconnect = shm_disconnect,
    .alive = shm_alive,
    .map = shm_map_remote,
    .warm = shm_warm,
    .access = shm_access,
};
