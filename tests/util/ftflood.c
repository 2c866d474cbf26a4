/* A flood of slow connections against a ferry listener (ftflood.h). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "util/ftflood.h"
#include "wire/sockio.h"

#define CONNECTING_MAX 128   /* connections opened but not yet challenged */
#define CHALLENGE_LEN (FR_WIRE_HDR_LEN + 40)
#define AUTH_FAIL_LEN (FR_WIRE_HDR_LEN + 8)
#define AUTH_LEN (FR_WIRE_HDR_LEN + 88)

enum { C_IDLE, C_CONNECTING, C_OPEN, C_CHALLENGED, C_CLOSED, C_FAILED };

typedef struct fconn {
    int fd;
    uint8_t state;
    uint8_t rxn;
    uint8_t sent;
    bool failed_auth;
    int32_t status;
    uint64_t start_ns;
    uint8_t rx[96];
} fconn;

struct ft_flood {
    ft_flood_spec spec;
    struct sockaddr_storage dst;
    socklen_t dlen;
    fconn *c;
    unsigned next, busy;      /* next to open; opened but not challenged */
    int epfd;
    pthread_t th;
    pthread_mutex_t mu;
    ft_flood_counts counts;   /* under mu */
    atomic_bool stop;
    uint8_t frame[AUTH_LEN];
};

static void note_closed(ft_flood *f, fconn *c)
{
    uint64_t life = (fr_now_ns() - c->start_ns) / 1000000u;
    epoll_ctl(f->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    pthread_mutex_lock(&f->mu);
    if (c->state != C_CHALLENGED)
        f->busy--;
    c->state = C_CLOSED;
    f->counts.closed++;
    if (c->failed_auth && c->status == FERRY_ETIMEDOUT) {
        f->counts.timed_out++;
        if (f->counts.timeout_life_min_ms == 0 || life < f->counts.timeout_life_min_ms)
            f->counts.timeout_life_min_ms = life;
        if (life > f->counts.timeout_life_max_ms)
            f->counts.timeout_life_max_ms = life;
    } else if (c->failed_auth && c->status == FERRY_EAGAIN) {
        f->counts.displaced++;
    } else {
        f->counts.other++;
    }
    pthread_mutex_unlock(&f->mu);
}

/* Take what the server sent: its CHALLENGE, then perhaps AUTH_FAIL. */
static void on_bytes(ft_flood *f, fconn *c)
{
    fr_frame_hdr h;
    if (c->state == C_OPEN && c->rxn >= CHALLENGE_LEN) {
        if (fr_wire_hdr_decode(c->rx, FR_WIRE_HDR_LEN, &h) == 0 && h.type == FR_MSG_CHALLENGE) {
            pthread_mutex_lock(&f->mu);
            c->state = C_CHALLENGED;
            f->busy--;
            f->counts.challenged++;
            pthread_mutex_unlock(&f->mu);
        }
        memmove(c->rx, c->rx + CHALLENGE_LEN, c->rxn - CHALLENGE_LEN);
        c->rxn -= CHALLENGE_LEN;
    }
    if (c->state == C_CHALLENGED && !c->failed_auth && c->rxn >= AUTH_FAIL_LEN) {
        fr_msg m;
        if (fr_wire_hdr_decode(c->rx, FR_WIRE_HDR_LEN, &h) == 0 &&
            fr_wire_decode(&h, c->rx + FR_WIRE_HDR_LEN, AUTH_FAIL_LEN - FR_WIRE_HDR_LEN, &m) == 0 &&
            m.type == FR_MSG_AUTH_FAIL) {
            c->failed_auth = true;
            c->status = m.u.auth_fail.status;
        }
        c->rxn = 0;
    }
}

static void on_event(ft_flood *f, fconn *c, uint32_t ev)
{
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err != 0) {
            epoll_ctl(f->epfd, EPOLL_CTL_DEL, c->fd, NULL);
            close(c->fd);
            c->fd = -1;
            pthread_mutex_lock(&f->mu);
            c->state = C_FAILED;
            f->busy--;
            f->counts.connect_failed++;
            pthread_mutex_unlock(&f->mu);
            return;
        }
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = c };
        epoll_ctl(f->epfd, EPOLL_CTL_MOD, c->fd, &e);
        c->state = C_OPEN;
        pthread_mutex_lock(&f->mu);
        f->counts.opened++;
        pthread_mutex_unlock(&f->mu);
        if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
            return;
    }
    for (;;) {
        ssize_t r = recv(c->fd, c->rx + c->rxn, sizeof c->rx - c->rxn, MSG_DONTWAIT);
        if (r > 0) {
            c->rxn = (uint8_t)(c->rxn + r);
            on_bytes(f, c);
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        note_closed(f, c);   /* EOF or reset */
        return;
    }
}

/* Open connections up to CONNECTING_MAX not yet challenged. false: the
 * listener's backlog is full for now (unix sockets). */
static bool open_more(ft_flood *f)
{
    while (f->next < f->spec.n && f->busy < CONNECTING_MAX) {
        fconn *c = &f->c[f->next];
        int fd = socket(f->dst.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return false;
        if (f->dst.ss_family == AF_INET) {
            struct sockaddr_in src = { .sin_family = AF_INET };
            src.sin_addr.s_addr = htonl(0x7f000000u | (f->spec.src_first + f->next % f->spec.nsrc));
            if (bind(fd, (struct sockaddr *)&src, sizeof src) < 0) {
                close(fd);
                return false;
            }
        }
        c->start_ns = fr_now_ns();
        int rc = connect(fd, (struct sockaddr *)&f->dst, f->dlen);
        if (rc < 0 && errno == EAGAIN) {   /* a unix listener's backlog is full */
            close(fd);
            return false;
        }
        pthread_mutex_lock(&f->mu);
        if (f->counts.first_start_ns == 0)
            f->counts.first_start_ns = c->start_ns;
        pthread_mutex_unlock(&f->mu);
        f->next++;
        if (rc < 0 && errno != EINPROGRESS) {
            close(fd);
            c->state = C_FAILED;
            pthread_mutex_lock(&f->mu);
            f->counts.connect_failed++;
            pthread_mutex_unlock(&f->mu);
            continue;
        }
        c->fd = fd;
        c->state = rc == 0 ? C_OPEN : C_CONNECTING;
        pthread_mutex_lock(&f->mu);
        f->busy++;
        if (rc == 0)
            f->counts.opened++;
        pthread_mutex_unlock(&f->mu);
        struct epoll_event e = { .events = rc == 0 ? EPOLLIN : EPOLLOUT, .data.ptr = c };
        epoll_ctl(f->epfd, EPOLL_CTL_ADD, fd, &e);
    }
    return true;
}

/* One more byte of AUTH on every challenged connection (never the last). */
static void trickle(ft_flood *f)
{
    unsigned most = 0;
    for (unsigned i = 0; i < f->next; i++) {
        fconn *c = &f->c[i];
        if (c->state != C_CHALLENGED || c->sent >= AUTH_LEN - 1)
            continue;
        if (send(c->fd, f->frame + c->sent, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1)
            c->sent++;
        if (c->sent > most)
            most = c->sent;
    }
    pthread_mutex_lock(&f->mu);
    if (most > f->counts.bytes_max)
        f->counts.bytes_max = most;
    pthread_mutex_unlock(&f->mu);
}

static void *flood_main(void *arg)
{
    ft_flood *f = arg;
    struct epoll_event evs[256];
    uint64_t gap = (uint64_t)f->spec.gap_ms * 1000000u;
    uint64_t next_tick = fr_now_ns() + gap;
    while (!atomic_load(&f->stop)) {
        bool room = open_more(f);
        uint64_t now = fr_now_ns();
        int wait = now >= next_tick ? 0 : (int)((next_tick - now + 999999) / 1000000);
        if (!room || (f->next < f->spec.n && f->busy < CONNECTING_MAX))
            wait = wait > 5 ? 5 : wait;   /* try again soon */
        if (wait > 50)
            wait = 50;                    /* see stop in time */
        int n = epoll_wait(f->epfd, evs, 256, wait);
        for (int i = 0; i < n; i++)
            on_event(f, evs[i].data.ptr, evs[i].events);
        if (fr_now_ns() >= next_tick) {
            trickle(f);
            next_tick += gap;
        }
    }
    return NULL;
}

int ft_flood_start(const ft_flood_spec *s, ft_flood **out)
{
    ft_flood *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->spec = *s;
    f->epfd = -1;
    if (f->spec.gap_ms == 0)
        f->spec.gap_ms = 1000;
    if (f->spec.nsrc == 0)
        f->spec.nsrc = 1;
    if (f->spec.src_first == 0)
        f->spec.src_first = 1;
    if (s->tcp) {
        if (fr_sock_parse_hostport(s->tcp, &f->dst, &f->dlen) < 0)
            goto fail;
    } else if (s->uds) {
        struct sockaddr_un *a = (struct sockaddr_un *)&f->dst;
        size_t nl = strlen(s->uds);
        if (nl + 1 >= sizeof a->sun_path)
            goto fail;
        a->sun_family = AF_UNIX;
        memcpy(a->sun_path + 1, s->uds, nl);   /* abstract: a NUL first */
        f->dlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    } else {
        goto fail;
    }
    /* A well-formed AUTH frame (a wrong MAC, never completed anyway): only
     * its slowness can get it dropped. */
    fr_msg m = { .type = FR_MSG_AUTH };
    m.u.auth.role = FR_ROLE_STORE_CLIENT;
    if (fr_wire_encode(&m, 0, 0, f->frame, sizeof f->frame) != AUTH_LEN)
        goto fail;
    f->c = calloc(f->spec.n, sizeof *f->c);
    f->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (!f->c || f->epfd < 0)
        goto fail;
    for (unsigned i = 0; i < f->spec.n; i++)
        f->c[i].fd = -1;
    pthread_mutex_init(&f->mu, NULL);
    if (pthread_create(&f->th, NULL, flood_main, f) != 0) {
        pthread_mutex_destroy(&f->mu);
        goto fail;
    }
    *out = f;
    return 0;
fail:
    if (f->epfd >= 0)
        close(f->epfd);
    free(f->c);
    free(f);
    return -1;
}

void ft_flood_get(ft_flood *f, ft_flood_counts *c)
{
    pthread_mutex_lock(&f->mu);
    *c = f->counts;
    pthread_mutex_unlock(&f->mu);
}

static bool wait_for(ft_flood *f, int timeout_ms, bool closed)
{
    uint64_t end = fr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        ft_flood_counts c;
        ft_flood_get(f, &c);
        unsigned done = c.closed + c.connect_failed;
        if (closed && done >= f->spec.n)
            return true;
        if (!closed && done > 0)
            return false;
        if (!closed && c.challenged >= f->spec.n)
            return true;
        if (fr_now_ns() >= end)
            return false;
        struct timespec ts = { 0, 5000000 };
        nanosleep(&ts, NULL);   /* the step of a deadline poll */
    }
}

bool ft_flood_wait_challenged(ft_flood *f, int timeout_ms)
{
    return wait_for(f, timeout_ms, false);
}

bool ft_flood_wait_closed(ft_flood *f, int timeout_ms)
{
    return wait_for(f, timeout_ms, true);
}

void ft_flood_stop(ft_flood *f)
{
    if (!f)
        return;
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    for (unsigned i = 0; i < f->spec.n; i++)
        if (f->c[i].fd >= 0)
            close(f->c[i].fd);
    close(f->epfd);
    pthread_mutex_destroy(&f->mu);
    free(f->c);
    free(f);
}

unsigned long ft_flood_raise_nofile(unsigned long want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return 0;
    if (rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return (unsigned long)rl.rlim_cur;
}

static int count_dir(pid_t pid, const char *what)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, what);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

int ft_proc_threads(pid_t pid)
{
    return count_dir(pid, "task");
}

int ft_proc_fds(pid_t pid)
{
    int n = count_dir(pid, "fd");
    return n < 0 || pid != getpid() ? n : n - 1;   /* not the directory being read */
}
