/* The master server: open/recover, the listening socket and handshakes off
 * the loop (on the acceptor, through wire/hsgate.h), and the event loop
 * itself (master.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <sys/stat.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/ha_log.h"
#include "store/master_int.h"
#include "wire/hsgate.h"
#include "wire/sockio.h"

#define U(x) ((unsigned long long)(x))

void fr_master_config_default(fr_master_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->listen, sizeof c->listen, "127.0.0.1:0");
    c->heartbeat_timeout_ms = 10000;
    c->grace_ms = 0;
    c->dead_after_ms = 0;
    c->pending_timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    c->checkpoint_records = 1000000;
}

uint64_t fr_master_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void clocks(fr_master *m)
{
    uint64_t mono = fr_now_ms();
    uint64_t step = m->now_mono != 0 && mono > m->now_mono ? mono - m->now_mono : 0;
    if (step > FR_MASTER_STALL_MS) {
        m->lstats.stalls++;
        if (step >= 2 * m->cfg.heartbeat_timeout_ms / 5)
            FR_INFO("master", "the master did not run for %llu ms; that time is not held "
                    "against its peers", U(step));
        step = FR_MASTER_STALL_MS;
    }
    m->live += step;
    m->now_mono = mono;
    m->now_wall = fr_master_wall_ms();
}

/* ---- open / close ----------------------------------------------------------- */

/* Remove the regular files of dir (a replicated master's local log: the
 * cluster's state is in etcd, never in what a deposed leader left here). */
static void empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (e->d_type == DT_REG)
            (void)unlinkat(dirfd(d), e->d_name, 0);
    if (d)
        closedir(d);
}

#define HA_TOKEN_SEED 0x6665727279686121ull   /* the token's fingerprint in etcd */

/* The cluster's snapshot into a fresh state in place of m's. */
static int ha_reload(fr_master *m, const fr_master_config *c, uint64_t *seq, uint64_t *lsn,
                     ferry_error *err)
{
    fr_meta_config mc;
    fr_meta_config_default(&mc);
    mc.pending_timeout_ms = c->pending_timeout_ms;
    fr_meta *fresh = NULL;
    int rc = fr_meta_new(&mc, &fresh);
    if (rc == 0)
        rc = fr_ha_snapshot_load(m->ha, fresh, seq, lsn, err);
    if (rc < 0) {
        fr_meta_destroy(fresh);
        return rc;
    }
    FR_INFO("master", "cluster %s's log was truncated past this standby: it loaded the snapshot "
            "again (log entry %llu on)", c->cluster, U(*seq));
    fr_meta_destroy(m->meta);
    m->meta = fresh;
    return 0;
}

/* Apply the log from *seq; a standby the log was truncated past (its next
 * entry below the cluster's snapshot, or entries missing) starts again
 * from the snapshot (docs/store.md: a standby behind a truncation point). */
static int ha_catch_up(fr_master *m, const fr_master_config *c, uint64_t *seq, uint64_t *lsn,
                       ferry_error *err)
{
    uint64_t snap = 0;
    int rc = fr_ha_snapshot_seq(m->ha, &snap, err);
    if (rc == 0 && snap > *seq)
        rc = ha_reload(m, c, seq, lsn, err);
    if (rc == 0)
        rc = fr_ha_follow(m->ha, m->meta, 0, seq, lsn, NULL, err);
    if (rc == FERRY_ECORRUPT && (rc = ha_reload(m, c, seq, lsn, err)) == 0)
        rc = fr_ha_follow(m->ha, m->meta, 0, seq, lsn, NULL, err);
    return rc;
}

/* A replicated master's start: a candidate of the cluster; the state from
 * the cluster's snapshot and log, followed as a standby until this master
 * wins the leadership; then the rest of the log, a local log of its own
 * (DIR/ha, emptied first) continuing the cluster's numbering, and every
 * commit replicated from there on. */
static int ha_setup(fr_master *m, const fr_master_config *c, const fr_wal_opts *wo,
                    ferry_error *err)
{
    const char *colon = strrchr(c->listen, ':');
    if (!colon || atoi(colon + 1) == 0)
        return fr_fail(err, FERRY_EINVAL, "master: with etcd, --listen must name the port: "
                       "HOST:PORT is this master's address in the cluster (given %s)", c->listen);
    /* an etcd request may take half the lease, at least 2 s: a longer TTL
     * (a crowded machine) also waits longer for a slow etcd */
    int tmo = c->ha_ttl_s > 4 ? (int)c->ha_ttl_s * 500 : 2000;
    fr_ha_config hc = { .endpoints = c->etcd, .cluster = c->cluster, .id = c->listen,
                        .ttl_s = (int)c->ha_ttl_s, .timeout_ms = tmo };
    int rc = fr_ha_open(&hc, &m->ha, err);
    if (rc < 0)
        return rc;
    uint8_t key[32];   /* the token itself never goes to etcd: a hash of its HMAC key */
    fr_auth_key(c->token, c->token_len, key);
    if ((rc = fr_ha_check_token(m->ha, fr_hash64(key, sizeof key, HA_TOKEN_SEED), err)) < 0)
        return rc;
    uint64_t seq = 1, lsn = 1;
    ferry_error e = {0};
    rc = fr_ha_snapshot_load(m->ha, m->meta, &seq, &lsn, &e);
    if (rc < 0 && rc != FERRY_ENOENT)
        return fr_fail(err, rc, "master: cannot load cluster %s's snapshot: %s", c->cluster, e.msg);
    bool said = false, outage = false;
    uint64_t reported = 0;
    for (;;) {
        memset(&e, 0, sizeof e);
        rc = ha_catch_up(m, c, &seq, &lsn, &e);
        if (rc == FERRY_ECONNREFUSED || rc == FERRY_ETIMEDOUT || rc == FERRY_EIO) {
            /* etcd unreachable or without quorum: a standby waits it out
             * (the campaign below paces the retries); it proved the
             * endpoints right at its start */
            if (!outage)
                FR_WARN("master", "standby of cluster %s cannot read the log: %s; waiting for "
                        "etcd", c->cluster, e.msg);
            outage = true;
        } else if (rc < 0) {
            if (err)
                *err = e;
            return rc;
        } else if (outage) {
            FR_INFO("master", "standby of cluster %s: etcd answers again", c->cluster);
            outage = false;
        }
        if (seq != reported && fr_ha_report(m->ha, seq, NULL) == 0)
            reported = seq;   /* the leader's metrics show the lag (a lost report: the next) */
        memset(&e, 0, sizeof e);
        rc = fr_ha_campaign(m->ha, 300, &m->epoch, &e);
        if (rc == 0)
            break;
        if (!said)
            FR_INFO("master", "standby of cluster %s: %s", c->cluster, e.msg);
        said = true;   /* once: not a line per try through an etcd outage */
    }
    if ((rc = ha_catch_up(m, c, &seq, &lsn, err)) < 0)
        return rc;
    char dir[sizeof c->dir + 8];
    snprintf(dir, sizeof dir, "%s/ha", c->dir);
    if (mkdir(c->dir, 0755) != 0 && errno != EEXIST)
        return fr_fail(err, FERRY_EIO, "master: cannot create %s: %s", c->dir, strerror(errno));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return fr_fail(err, FERRY_EIO, "master: cannot create %s: %s", dir, strerror(errno));
    empty_dir(dir);
    /* Its local log is never read back (emptied here, at every takeover):
     * the durable copy is the cluster's log in etcd, on a quorum before a
     * commit counts. An fsync of it would only add its latency to every
     * commit's. */
    fr_wal_opts lwo = *wo;
    lwo.no_sync = true;
    if ((rc = fr_wal_open_state(dir, &lwo, m->meta, lsn, &m->wal)) < 0)
        return fr_fail(err, rc, "master: cannot start its log in %s: %s", dir, ferry_strerror(rc));
    fr_wal_replicate(m->wal, m->ha, m->epoch, seq);
    if ((rc = fr_ha_count_leadership(m->ha, m->epoch, &m->ha_leaderships, err)) < 0)
        return rc;   /* fenced out already: not the leader */
    FR_INFO("master", "leads cluster %s (epoch %lld) from log entry %llu, LSN %llu", c->cluster,
            (long long)m->epoch, U(seq), U(lsn));
    return 0;
}

static int master_new(const fr_master_config *c, bool mem, fr_master **out, ferry_error *err)
{
    *out = NULL;
    fr_master *m = fr_calloc(1, sizeof *m);
    if (m == NULL)
        return fr_fail(err, FERRY_ENOMEM, "master: out of memory");
    m->cfg = *c;
    if (m->cfg.grace_ms == 0)
        m->cfg.grace_ms = m->cfg.heartbeat_timeout_ms;
    m->live = 1;   /* 0 never names a moment */
    m->mem = mem;
    m->lfd = m->epfd = m->handoff_efd = -1;
    m->stop_pipe[0] = m->stop_pipe[1] = -1;
    m->instance = fr_random_u64();
    fr_dlist_init(&m->conns);
    fr_dlist_init(&m->watches);
    fr_dlist_init(&m->waits);
    fr_umap_init(&m->nodes);
    fr_umap_init(&m->segs);
    fr_umap_init(&m->clients);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    *out = m;
    if (fr_master_mx_init(&m->mx) < 0)
        return fr_fail(err, FERRY_ENOMEM, "master: out of memory");
    m->items_cap = FR_MASTER_EVENTS_FRAME;
    m->events = fr_calloc(FR_MASTER_EVENTS_FRAME, sizeof *m->events);
    m->items = fr_calloc(FR_MASTER_EVENTS_FRAME, sizeof *m->items);
    if (m->events == NULL || m->items == NULL)
        return fr_fail(err, FERRY_ENOMEM, "master: out of memory");
    fr_meta_config mc;
    fr_meta_config_default(&mc);
    mc.pending_timeout_ms = c->pending_timeout_ms;
    int rc = fr_meta_new(&mc, &m->meta);
    if (rc < 0)
        return fr_fail(err, rc, "master: cannot set up its state: %s", ferry_strerror(rc));
    fr_wal_opts wo = { .no_sync = c->no_sync };
    fr_wal_recovery rep = { 0 };
    if (c->etcd[0]) {   /* replicated: the state comes from the cluster's log in etcd */
        if ((rc = ha_setup(m, c, &wo, err)) < 0)
            return rc;
        m->ckpt_records = fr_meta_records(m->meta);
        clocks(m);
        rc = fr_master_segs_recover(m);
        if (rc < 0)
            return fr_fail(err, rc, "master: cannot recover the segments of cluster %s: %s",
                           c->cluster, ferry_strerror(rc));
        return 0;
    }
    rc = fr_wal_open(c->dir, &wo, m->meta, &m->wal, &rep);
    if (rc == FERRY_EBUSY)
        return fr_fail(err, rc, "master: directory %s is in use by another master (its LOCK is "
                       "held)", c->dir);
    if (rc < 0)   /* the log names the record or file (wal.c) */
        return fr_fail(err, rc, "master: cannot recover %s: %s", c->dir, ferry_strerror(rc));
    FR_INFO("master", "recovered %s: snapshot at %llu, %llu log records replayed, %llu torn bytes",
            c->dir, U(rep.snapshot_lsn), U(rep.replayed), U(rep.torn_bytes));
    m->ckpt_records = fr_meta_records(m->meta);
    clocks(m);
    rc = fr_master_segs_recover(m);
    if (rc < 0)
        return fr_fail(err, rc, "master: cannot recover the segments of %s: %s", c->dir,
                       ferry_strerror(rc));
    return 0;
}

static int parse_listen(const char *s, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= sizeof host)
        return FERRY_EINVAL;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || port > 65535)
        return FERRY_EINVAL;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (host[0] == 0 || strcmp(host, "*") == 0)
        sa->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (strcmp(host, "localhost") == 0)
        sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return FERRY_EINVAL;
    return 0;
}

static int open_sockets(fr_master *m, ferry_error *err)
{
    struct sockaddr_in sa;
    if (parse_listen(m->cfg.listen, &sa) < 0)
        return fr_fail(err, FERRY_EINVAL, "master: bad listen address '%s' (want IPv4 HOST:PORT)",
                       m->cfg.listen);
    m->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (m->lfd < 0)
        return fr_fail(err, FERRY_EIO, "master: no socket: %s", strerror(errno));
    int one = 1;
    setsockopt(m->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(m->lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(m->lfd, 512) < 0) {
        int e = errno;
        return fr_fail(err, e == EADDRINUSE ? -EADDRINUSE : e == EACCES ? FERRY_EACCES : FERRY_EIO,
                       "master: cannot listen on %s: %s", m->cfg.listen, strerror(e));
    }
    socklen_t sl = sizeof sa;
    getsockname(m->lfd, (struct sockaddr *)&sa, &sl);
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
    snprintf(m->address, sizeof m->address, "%s:%u", host, (unsigned)ntohs(sa.sin_port));
    if (pipe2(m->stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0 ||
        (m->handoff_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        (m->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        return fr_fail(err, FERRY_EIO, "master: cannot set up its event loop: %s", strerror(errno));
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &m->stop_pipe };
    if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->stop_pipe[0], &ev) < 0)
        return fr_fail(err, FERRY_EIO, "master: cannot set up its event loop: %s", strerror(errno));
    ev.data.ptr = &m->handoff_efd;
    if (epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->handoff_efd, &ev) < 0)
        return fr_fail(err, FERRY_EIO, "master: cannot set up its event loop: %s", strerror(errno));
    int rc = fr_master_mx_open(&m->mx, m->epfd);
    if (rc < 0)
        return fr_fail(err, rc, "master: cannot set up its metrics: %s", ferry_strerror(rc));
    return 0;
}

static int accept_open(fr_master *m);   /* the accept path, below */

int fr_master_open(const fr_master_config *c, fr_master **out, ferry_error *err)
{
    if (c == NULL || out == NULL)
        return fr_fail(err, FERRY_EINVAL, "master: no config or result");
    if (c->dir[0] == 0)
        return fr_fail(err, FERRY_EINVAL, "master: no state directory");
    if (c->token_len == 0 || c->token_len > sizeof c->token)
        return fr_fail(err, FERRY_EINVAL, "master: no cluster token (set FERRY_TOKEN or "
                       "FERRY_TOKEN_FILE), or one longer than %zu bytes", sizeof c->token);
    if (c->heartbeat_timeout_ms == 0)
        return fr_fail(err, FERRY_EINVAL, "master: a heartbeat timeout of 0 ms");
    if (c->dead_after_ms != 0 && c->dead_after_ms < c->heartbeat_timeout_ms)
        return fr_fail(err, FERRY_EINVAL, "master: dead-after (%llu ms) must not be shorter than "
                       "the heartbeat timeout (%llu ms)", U(c->dead_after_ms),
                       U(c->heartbeat_timeout_ms));
    fr_master *m;
    int rc = master_new(c, false, &m, err);
    if (rc == 0) {
        fr_auth_key(c->token, c->token_len, m->key);
        rc = open_sockets(m, err);
        if (rc == 0 && (rc = accept_open(m)) < 0)
            fr_fail(err, rc, "master: cannot start accepting connections: %s", ferry_strerror(rc));
    }
    if (rc < 0) {
        fr_master_close(m);
        return rc;
    }
    FR_INFO("master", "listening on %s (dir %s, instance %016llx)", m->address, c->dir,
            U(m->instance));
    *out = m;
    return 0;
}

int fr_master_open_mem(const char *dir, fr_master **out)
{
    fr_master_config c;
    fr_master_config_default(&c);
    if (dir == NULL || strlen(dir) >= sizeof c.dir)
        return FERRY_EINVAL;
    snprintf(c.dir, sizeof c.dir, "%s", dir);
    c.no_sync = true;
    c.checkpoint_records = 10000;
    fr_master *m;
    int rc = master_new(&c, true, &m, NULL);
    if (rc < 0) {
        fr_master_close(m);
        return rc;
    }
    snprintf(m->address, sizeof m->address, "memory");
    *out = m;
    return 0;
}

const char *fr_master_address(const fr_master *m)
{
    return m->address;
}

void fr_master_stop(fr_master *m)
{
    if (m && m->stop_pipe[1] >= 0) {
        char b = 1;
        ssize_t n = write(m->stop_pipe[1], &b, 1);
        (void)n;
    }
}

void fr_master_close(fr_master *m)
{
    if (m == NULL)
        return;
    /* No handshake is in flight: the acceptor closed them before
     * fr_master_run joined it. */
    fr_hsgate_close(m->gate);
    pthread_mutex_lock(&m->mu);
    m->closing = true;
    while (m->nprobes > 0)   /* probes in flight hold m: wait for them */
        pthread_cond_wait(&m->cv, &m->mu);
    fr_master_handoff *h = m->handoff;
    m->handoff = NULL;
    fr_master_probe *pr = m->probed;
    m->probed = NULL;
    pthread_mutex_unlock(&m->mu);
    while (pr) {
        fr_master_probe *next = pr->next;
        fr_free(pr);
        pr = next;
    }
    while (h) {
        fr_master_handoff *next = h->next;
        close(h->fd);
        fr_free(h);
        h = next;
    }
    while (!fr_dlist_empty(&m->conns))
        fr_master_conn_free(fr_container_of(m->conns.next, fr_master_conn, link));
    if (m->wal && fr_wal_commit(m->wal) < 0)
        FR_ERROR("master", "final commit failed");
    fr_wal_close(m->wal, m->meta);
    fr_ha_close(m->ha);   /* resign: a standby takes over at once */
    fr_meta_destroy(m->meta);
    fr_master_segs_free(m);
    int fds[] = { m->lfd, m->epfd, m->handoff_efd, m->stop_pipe[0], m->stop_pipe[1] };
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    pthread_mutex_destroy(&m->mu);
    fr_master_mx_fini(&m->mx);
    fr_free(m->events);
    fr_free(m->items);
    fr_free(m);
}

/* ---- accepting: handshakes off the loop ------------------------------------- */

/* The gate's callback for an authenticated socket (on the acceptor):
 * queue it for the loop. */
static void handshake_done(void *arg, int fd, const fr_msg_auth *auth, const char *peer)
{
    fr_master *m = arg;
    fr_master_handoff *h = NULL;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
        (h = fr_calloc(1, sizeof *h)) == NULL) {
        FR_WARN("master", "refused connection from %s: cannot set up the socket", peer);
        close(fd);
        return;
    }
    pthread_mutex_lock(&m->mu);
    h->fd = fd;
    h->role = auth->role;
    h->instance = auth->client_instance;
    h->caps = auth->caps & FR_AUTH_CAPS_KNOWN;   /* what AUTH_OK echoed */
    snprintf(h->peer, sizeof h->peer, "%s", peer);
    h->next = m->handoff;
    m->handoff = h;
    uint64_t one = 1;
    ssize_t n = write(m->handoff_efd, &one, sizeof one);
    (void)n;
    pthread_mutex_unlock(&m->mu);
}

/* Every handshake runs on the acceptor, non-blocking (wire/hsgate.h): a
 * deadline from accept, caps in flight and per source address, one thread
 * however many connect. */
static int accept_open(fr_master *m)
{
    const fr_hsgate_config gc = {
        .tag = "master", .key = m->key, .instance = m->instance, .role = 0,
        .deadline_ms = FR_MASTER_HANDSHAKE_MS, .max_inflight = FR_MASTER_HANDSHAKES_MAX,
        .max_per_source = FR_MASTER_HANDSHAKES_PER_SOURCE, .stop_fd = m->stop_pipe[0],
        .ready = handshake_done, .failed = fr_master_mx_handshake_failed, .arg = m,
    };
    return fr_hsgate_open(&gc, m->lfd, &m->gate);
}

static void *accept_main(void *arg)
{
    fr_master *m = arg;
    (void)fr_hsgate_run(m->gate);   /* a failure is logged; the loop serves on */
    return NULL;
}

/* Move authenticated sockets from the handshake threads into the loop. */
static void take_handoffs(fr_master *m)
{
    uint64_t v;
    ssize_t r = read(m->handoff_efd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&m->mu);
    fr_master_handoff *h = m->handoff;
    m->handoff = NULL;
    pthread_mutex_unlock(&m->mu);
    fr_master_probes_done(m);
    while (h) {
        fr_master_handoff *next = h->next;
        fr_master_conn *c = fr_master_conn_new(m, h->fd, h->role, h->peer);
        if (c != NULL) {
            c->instance = h->instance;
            c->caps = h->caps;
            fr_master_client_attach(c);
        }
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
        if (c == NULL || epoll_ctl(m->epfd, EPOLL_CTL_ADD, h->fd, &ev) < 0) {
            if (c) {
                c->fd = -1;
                fr_master_conn_free(c);
            }
            close(h->fd);
        } else {
            c->reading = true;
            FR_INFO("master", "connection #%llu from %s (%s)", U(c->serial), c->peer,
                    h->role == FR_ROLE_STORE_NODE ? "node" : "client");
        }
        fr_free(h);
        h = next;
    }
}

/* ---- the loop ------------------------------------------------------------------ */

/* After a batch: commit once, then send replies and pushes, then close what
 * must be closed and checkpoint when due. */
static void finish_batch(fr_master *m)
{
    if (m->fatal == 0 && fr_wal_last_lsn(m->wal) != fr_wal_durable_lsn(m->wal)) {
        uint64_t t0 = fr_now_ns();
        int rc = fr_wal_commit(m->wal);
        fr_master_mx_wal_commit(m, fr_now_ns() - t0);
        if (rc < 0) {
            fr_master_note_fatal(m, rc == FERRY_EIO ? rc : FERRY_EIO);
            return;
        }
    }
    if (m->fatal)
        return;
    fr_master_watch_push_all(m);
    fr_dnode *n = m->conns.next;
    while (n != &m->conns) {
        fr_master_conn *c = fr_container_of(n, fr_master_conn, link);
        n = n->next;
        if (!c->dead && fr_master_conn_pending_out(c) > 0)
            fr_master_conn_flush(c);
        if (c->closing && !c->shut && !c->dead && fr_master_conn_pending_out(c) == 0)
            fr_master_conn_shut(c);
        if (c->shut && m->now_mono >= c->linger_until)
            c->dead = true;
        if (c->dead) {
            fr_master_conn_free(c);
            continue;
        }
        if (c->held && !fr_master_conn_backed_up(c))
            m->resume = true;   /* drained: its buffered requests go next iteration */
        fr_master_conn_interest(c);
    }
    if (fr_meta_records(m->meta) - m->ckpt_records >= m->cfg.checkpoint_records) {
        int rc = fr_wal_checkpoint(m->wal, m->meta);
        if (rc < 0)
            FR_WARN("master", "checkpoint failed: %s (the log still recovers)", ferry_strerror(rc));
        ferry_error e = {0};
        if (m->ha && (rc = fr_ha_snapshot_put(m->ha, m->epoch, m->meta, fr_wal_next_seq(m->wal),
                                              fr_wal_last_lsn(m->wal) + 1, &e)) < 0)
            FR_WARN("master", "snapshot into etcd failed: %s (the cluster's log still has it all)",
                    e.msg);
        m->ckpt_records = fr_meta_records(m->meta);
    }
}

static void timers(fr_master *m)
{
    if (m->ha && m->fatal == 0 && !fr_ha_leading(m->ha, m->epoch)) {
        /* its lease not renewed for a TTL: another master may lead now */
        FR_ERROR("master", "lost the leadership of cluster %s (epoch %lld): stopping",
                 m->cfg.cluster, (long long)m->epoch);
        fr_master_note_fatal(m, FERRY_ESTATE);
    }
    if (fr_meta_next_deadline(m->meta) <= m->now_wall) {
        fr_tick_result tr = { 0 };
        int rc = fr_meta_tick(m->meta, m->now_wall, &tr);
        if (rc == FERRY_EIO)
            fr_master_note_fatal(m, rc);
        m->mx.redelivered += tr.redelivered;
        if (rc != FERRY_EIO && tr.revoked)
            FR_INFO("master", "revoked %llu pending objects whose writer vanished", U(tr.revoked));
    }
    if (fr_master_barrier_next_deadline(m) <= m->now_mono)
        fr_master_barrier_timeouts(m);
    if (m->now_mono >= m->next_liveness) {
        fr_master_liveness(m);
        m->next_liveness = m->now_mono + FR_MASTER_TICK_MS;
    }
}

/* Connections held for back-pressure whose output drained: dispatch the
 * requests they had already sent. */
static void resume_held(fr_master *m)
{
    m->resume = false;
    for (fr_dnode *n = m->conns.next; n != &m->conns && m->fatal == 0; n = n->next) {
        fr_master_conn *c = fr_container_of(n, fr_master_conn, link);
        if (c->held && !c->dead && !fr_master_conn_backed_up(c)) {
            c->held = false;
            fr_master_conn_parse(c);
        }
    }
}

static int loop_timeout(fr_master *m)
{
    if (m->resume)
        return 0;
    uint64_t t = FR_MASTER_TICK_MS;
    uint64_t d = fr_meta_next_deadline(m->meta);
    if (d != UINT64_MAX)
        t = d <= m->now_wall ? 0 : (d - m->now_wall < t ? d - m->now_wall : t);
    d = fr_master_barrier_next_deadline(m);
    if (d != UINT64_MAX)
        t = d <= m->now_mono ? 0 : (d - m->now_mono < t ? d - m->now_mono : t);
    return (int)t;
}

int fr_master_run(fr_master *m)
{
    if (m == NULL || m->mem)
        return FERRY_EINVAL;
    if (pthread_create(&m->acceptor, NULL, accept_main, m) != 0)
        return FERRY_ENOMEM;
    m->acceptor_started = true;
    struct epoll_event evs[256];
    bool stop = false;
    clocks(m);
    m->next_liveness = m->now_mono + FR_MASTER_TICK_MS;
    fr_master_mx_publish(m, true);   /* readers have a snapshot from the start */
    while (!stop && m->fatal == 0) {
        int n = epoll_wait(m->epfd, evs, 256, loop_timeout(m));
        if (n < 0 && errno != EINTR) {
            fr_master_note_fatal(m, FERRY_EIO);
            break;
        }
        clocks(m);
        for (int i = 0; i < n && m->fatal == 0; i++) {
            void *p = evs[i].data.ptr;
            if (p == &m->stop_pipe) {
                stop = true;
            } else if (p == &m->handoff_efd) {
                take_handoffs(m);
            } else if (p == &m->mx.wake_fd) {
                fr_master_mx_woken(m);
            } else {
                fr_master_conn *c = p;
                if (c->dead)
                    continue;
                if (evs[i].events & EPOLLIN)
                    fr_master_conn_read(c);
                else if (evs[i].events & (EPOLLHUP | EPOLLERR))
                    c->dead = true;
            }
        }
        if (m->resume)
            resume_held(m);
        timers(m);
        finish_batch(m);
        fr_master_mx_publish(m, false);
    }
    fr_master_mx_stopped(m);
    fr_hsgate_stop(m->gate);   /* a fatal error ends the loop without the stop pipe */
    pthread_join(m->acceptor, NULL);
    m->acceptor_started = false;
    if (m->fatal == 0)
        FR_INFO("master", "stopped");
    return m->fatal;
}

int fr_master_feed(fr_master *m, uint16_t role, const uint8_t *data, size_t n)
{
    if (m == NULL || !m->mem || m->fatal)
        return m && m->fatal ? m->fatal : FERRY_EINVAL;
    clocks(m);
    fr_master_conn *c = fr_master_conn_new(m, -1, role, "memory");
    if (c == NULL)
        return FERRY_ENOMEM;
    int answered = 0;
    size_t done = 0;
    while (done < n && !c->dead && !c->closing) {   /* in pieces, as a socket would deliver */
        size_t k = n - done < 4096 ? n - done : 4096;
        uint8_t *p = fr_realloc(c->in.p, c->in.len + k);
        if (p == NULL)
            break;
        c->in.p = p;
        c->in.cap = c->in.len + k;
        memcpy(p + c->in.len, data + done, k);
        c->in.len += k;
        done += k;
        fr_master_conn_parse(c);
    }
    answered = c->frames > INT32_MAX ? INT32_MAX : (int)c->frames;
    timers(m);
    c->dead = true;
    finish_batch(m);
    return m->fatal ? m->fatal : answered;
}
