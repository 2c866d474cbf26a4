/* The master's metrics: counting on the loop, the snapshot it publishes and
 * the copy other threads take (master_metrics.h). The page itself is
 * rendered by master_metrics_page.c. */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "store/master_int.h"
#include "wire/hsgate.h"

int fr_master_mx_init(fr_master_mx *x)
{
    memset(x, 0, sizeof *x);
    x->wake_fd = -1;
    x->op = FR_MX_OP_OTHER;
    if (pthread_mutex_init(&x->mu, NULL) != 0)
        return FERRY_ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&x->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        pthread_mutex_destroy(&x->mu);
        return FERRY_ENOMEM;
    }
    return 0;
}

void fr_master_mx_fini(fr_master_mx *x)
{
    if (x->wake_fd >= 0)
        close(x->wake_fd);
    x->wake_fd = -1;
    fr_free(x->text);
    x->text = NULL;
    pthread_cond_destroy(&x->cv);
    pthread_mutex_destroy(&x->mu);
}

int fr_master_mx_open(fr_master_mx *x, int epfd)
{
    x->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (x->wake_fd < 0)
        return FERRY_EIO;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &x->wake_fd };
    return epoll_ctl(epfd, EPOLL_CTL_ADD, x->wake_fd, &ev) < 0 ? FERRY_EIO : 0;
}

static unsigned op_index(uint16_t type)
{
    return type >= FR_MX_OP_BASE && type < FR_MX_OP_BASE + FR_MX_OP_OTHER
               ? (unsigned)(type - FR_MX_OP_BASE) : FR_MX_OP_OTHER;
}

void fr_master_mx_request(fr_master *m, uint16_t type)
{
    m->mx.op = op_index(type);
    m->mx.requests[m->mx.op]++;
}

void fr_master_mx_op(fr_master *m, uint16_t type)
{
    m->mx.op = op_index(type);
}

void fr_master_mx_error(fr_master *m)
{
    m->mx.errors[m->mx.op]++;
}

void fr_master_mx_objects(fr_master *m, uint16_t reply_type, uint64_t size, uint64_t lease_until)
{
    if (reply_type == FR_SMSG_PLACEMENT) {
        m->mx.put_bytes += size;
    } else if (reply_type == FR_SMSG_REPLICAS) {
        m->mx.get_bytes += size;
        m->mx.leases += lease_until != 0;
    }
}

/* Upper bounds of the commit-latency buckets, in nanoseconds: 50 us to 5 s,
 * around what an fsync costs on local disks (tens of microseconds to tens
 * of milliseconds). */
const uint64_t fr_mx_wal_le[FR_MX_WAL_BUCKETS] = {
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 25000000,
    50000000, 100000000, 250000000, 500000000, 1000000000, 5000000000ull,
};

void fr_master_mx_wal_commit(fr_master *m, uint64_t ns)
{
    size_t b = 0;
    while (b < FR_MX_WAL_BUCKETS && ns > fr_mx_wal_le[b])
        b++;
    m->mx.wal_bucket[b]++;
    m->mx.wal_commits++;
    m->mx.wal_ns += ns;
}

void fr_master_mx_handshake_failed(void *arg, int code)
{
    fr_master *m = arg;
    int k = code == FERRY_EAUTH ? FR_MX_HS_AUTH : code == FERRY_EPROTO ? FR_MX_HS_PROTO
          : code == FERRY_ESTALE ? FR_MX_HS_STALE : code == FERRY_ETIMEDOUT ? FR_MX_HS_TIMEOUT
          : code == FERRY_EAGAIN ? FR_MX_HS_DISPLACED : FR_MX_HS_SOCKET;
    atomic_fetch_add_explicit(&m->mx.hs_refused[k], 1, memory_order_relaxed);
}

/* ---- publication ------------------------------------------------------------- */

void fr_master_mx_woken(fr_master *m)
{
    uint64_t v;
    ssize_t r = read(m->mx.wake_fd, &v, sizeof v);
    (void)r;
}

void fr_master_mx_publish(fr_master *m, bool force)
{
    fr_master_mx *x = &m->mx;
    if (x->wake_fd < 0 || (!force && !atomic_exchange(&x->want, false)))
        return;
    uint64_t t0 = fr_now_ns();
    char *text = fr_master_mx_render(m);
    uint64_t t1 = fr_now_ns();
    x->render_ns = t1 - t0;
    if (text == NULL)   /* out of memory: readers keep the previous snapshot */
        return;
    uint64_t gap = 10 * x->render_ns;
    if (gap < (uint64_t)FR_MX_MIN_INTERVAL_MS * 1000000)
        gap = (uint64_t)FR_MX_MIN_INTERVAL_MS * 1000000;
    pthread_mutex_lock(&x->mu);
    char *old = x->text;
    x->text = text;
    x->seq++;
    x->published_ns = t1;
    x->next_ns = t1 + gap;
    x->running = true;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    fr_free(old);
}

void fr_master_mx_stopped(fr_master *m)
{
    pthread_mutex_lock(&m->mx.mu);
    m->mx.running = false;
    pthread_cond_broadcast(&m->mx.cv);
    pthread_mutex_unlock(&m->mx.mu);
}

int fr_master_mx_text(fr_master *m, int wait_ms, char **out)
{
    fr_master_mx *x = &m->mx;
    *out = NULL;
    pthread_mutex_lock(&x->mu);
    uint64_t now = fr_now_ns();
    if (x->running && (x->text == NULL || now >= x->next_ns) && x->wake_fd >= 0) {
        /* Ask the loop for a fresh one and give it until the deadline. */
        uint64_t seq = x->seq;
        atomic_store(&x->want, true);
        uint64_t one = 1;
        ssize_t w = write(x->wake_fd, &one, sizeof one);
        (void)w;
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += wait_ms / 1000;
        dl.tv_nsec += (long)(wait_ms % 1000) * 1000000;
        if (dl.tv_nsec >= 1000000000) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000;
        }
        while (x->running && x->seq == seq &&
               pthread_cond_timedwait(&x->cv, &x->mu, &dl) != ETIMEDOUT) {
        }
    }
    int rc = 0;
    if (x->text == NULL)
        rc = FERRY_EAGAIN;
    else if ((*out = fr_strdup(x->text)) == NULL)
        rc = FERRY_ENOMEM;
    pthread_mutex_unlock(&x->mu);
    return rc;
}
