/* The log's frames and files, and the group commit. Directory layout,
 * snapshots and recovery are in wal_dir.c. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "store/ha_log.h"
#include "store/wal_int.h"

#define WAL_SEED 0x6672792d77616c31ull   /* "fry-wal1" */
static const char magic_log[8] = { 'F', 'E', 'R', 'R', 'Y', 'L', 'O', 'G' };
static const char magic_snap[8] = { 'F', 'E', 'R', 'R', 'Y', 'S', 'N', 'P' };

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* ---- codec ------------------------------------------------------------ */

void fr_wal_hdr_encode(uint8_t out[FR_WAL_FILE_HDR], uint32_t kind, uint64_t lsn)
{
    memcpy(out, kind == FR_WAL_SNAP ? magic_snap : magic_log, 8);
    put32(out + 8, FR_WAL_VERSION);
    put32(out + 12, 0);
    put64(out + 16, lsn);
    put64(out + 24, fr_hash64(out, 24, WAL_SEED));
}

int fr_wal_hdr_decode(const uint8_t *in, size_t n, uint32_t *kind, uint64_t *lsn)
{
    if (in == NULL || n < FR_WAL_FILE_HDR || get64(in + 24) != fr_hash64(in, 24, WAL_SEED) ||
        get32(in + 8) != FR_WAL_VERSION || get32(in + 12) != 0)
        return FERRY_EPROTO;
    if (memcmp(in, magic_log, 8) == 0)
        *kind = FR_WAL_LOG;
    else if (memcmp(in, magic_snap, 8) == 0)
        *kind = FR_WAL_SNAP;
    else
        return FERRY_EPROTO;
    *lsn = get64(in + 16);
    return 0;
}

size_t fr_wal_frame_encode(uint8_t *out, uint64_t lsn, const uint8_t *rec, size_t len)
{
    put32(out, (uint32_t)len);
    put32(out + 4, 0);
    put64(out + 8, lsn);
    memcpy(out + FR_WAL_FRAME_HEAD, rec, len);
    put64(out + FR_WAL_FRAME_HEAD + len, fr_hash64(out, FR_WAL_FRAME_HEAD + len, WAL_SEED));
    return len + FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL;
}

/* Length of the frame at p if its check holds, else 0. */
static size_t frame_checked(const uint8_t *p, size_t n)
{
    if (n < FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL)
        return 0;
    size_t len = get32(p);
    if (len > FR_REC_MAX || n - FR_WAL_FRAME_HEAD - FR_WAL_FRAME_TAIL < len)
        return 0;
    if (get64(p + FR_WAL_FRAME_HEAD + len) != fr_hash64(p, FR_WAL_FRAME_HEAD + len, WAL_SEED))
        return 0;
    return len + FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL;
}

/* After an invalid frame at off: is there a valid one further on that could
 * belong to this log (an LSN not behind the expected one)? Then the bad
 * frame is damage in the middle, not a torn tail. */
static bool valid_frame_after(const uint8_t *buf, size_t len, size_t off, uint64_t lsn)
{
    for (size_t k = off + 1; k + FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL <= len; k++) {
        uint64_t l = get64(buf + k + 8);
        if (l < lsn || l - lsn > (len - off) / (FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL))
            continue;
        if (frame_checked(buf + k, len - k) != 0)
            return true;
    }
    return false;
}

int fr_wal_scan(const uint8_t *buf, size_t len, uint64_t first_lsn, fr_wal_frame_fn fn,
                void *ctx, fr_wal_scan_result *res)
{
    size_t off = 0;
    uint64_t lsn = first_lsn;
    int rc = 0;
    memset(res, 0, sizeof(*res));
    if (buf == NULL && len != 0)
        return FERRY_EINVAL;
    while (off < len) {
        size_t fl = frame_checked(buf + off, len - off);
        if (fl == 0) {
            if (valid_frame_after(buf, len, off, lsn))
                rc = FERRY_ECORRUPT;
            else
                res->torn = true;
            break;
        }
        if (get32(buf + off + 4) != 0 || get64(buf + off + 8) != lsn) {
            rc = FERRY_ECORRUPT;   /* checks out, but does not belong here */
            break;
        }
        if (fn != NULL && (rc = fn(ctx, lsn, buf + off + FR_WAL_FRAME_HEAD,
                                   fl - FR_WAL_FRAME_HEAD - FR_WAL_FRAME_TAIL)) < 0)
            break;
        off += fl;
        lsn++;
    }
    res->valid_len = off;
    res->frames = lsn - first_lsn;
    res->next_lsn = lsn;
    return rc;
}

/* ---- file helpers ------------------------------------------------------ */

int fr_wal_write_all(int fd, const uint8_t *buf, size_t len)
{
    while (len > 0) {
        ssize_t k = write(fd, buf, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return FERRY_EIO;
        buf += k;
        len -= (size_t)k;
    }
    return 0;
}

int fr_wal_fsync_dir(int dirfd)
{
    return fsync(dirfd) == 0 ? 0 : FERRY_EIO;
}

/* ---- replication ------------------------------------------------------------ */

/* The frames of one commit (out, len) to the cluster's log: entries of at
 * most FR_HA_LOG_ENTRY_MAX bytes, cut between frames. Runs on the
 * committing thread without mu: only it touches next_seq then. */
static int replicate(fr_wal *w, const uint8_t *out, size_t len, ferry_error *err)
{
    size_t at = 0;
    while (at < len) {
        size_t end = at;
        while (end < len) {   /* whole frames: head (the record's length first) + rec + tail */
            size_t fl = FR_WAL_FRAME_HEAD + (size_t)get32(out + end) + FR_WAL_FRAME_TAIL;
            if (end > at && end + fl - at > FR_HA_LOG_ENTRY_MAX)
                break;
            end += fl;
        }
        if (end > len || end - at > FR_HA_LOG_ENTRY_MAX)
            return fr_fail(err, FERRY_EMSGSIZE, "a frame of %zu bytes does not fit a log entry",
                           end - at);
        int rc = fr_ha_log_append(w->ha, w->epoch, w->next_seq, out + at, end - at, err);
        if (rc < 0)
            return rc;
        w->next_seq++;
        at = end;
    }
    return 0;
}

void fr_wal_replicate(fr_wal *w, struct fr_ha_elect *ha, int64_t epoch, uint64_t next_seq)
{
    pthread_mutex_lock(&w->mu);
    while (w->committing)
        pthread_cond_wait(&w->cv, &w->mu);
    w->ha = ha;
    w->epoch = epoch;
    w->next_seq = next_seq;
    pthread_mutex_unlock(&w->mu);
}

uint64_t fr_wal_next_seq(fr_wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->next_seq;
    pthread_mutex_unlock(&w->mu);
    return v;
}

/* ---- append and group commit -------------------------------------------- */

int fr_wal_append(fr_wal *w, const uint8_t *rec, size_t len, uint64_t *lsn)
{
    if (w == NULL || rec == NULL || len == 0 || len > FR_REC_MAX)
        return FERRY_EINVAL;
    pthread_mutex_lock(&w->mu);
    int rc = w->err;
    if (rc == 0 && fr_grow((void **)&w->buf, &w->bcap,
                           w->blen + len + FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL, 1) < 0)
        rc = FERRY_ENOMEM;
    if (rc == 0) {
        w->last_lsn++;
        w->blen += fr_wal_frame_encode(w->buf + w->blen, w->last_lsn, rec, len);
        w->st.appends++;
        if (lsn != NULL)
            *lsn = w->last_lsn;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* Write and fsync everything appended so far. Called with mu held and no
 * commit running; drops mu during the I/O so appends go on meanwhile. */
static void lead_commit(fr_wal *w)
{
    uint8_t *out = w->buf;
    size_t len = w->blen, cap = w->bcap;
    uint64_t target = w->last_lsn;
    int fd = w->fd;
    w->buf = w->wbuf;
    w->bcap = w->wcap;
    w->blen = 0;
    w->wbuf = out;
    w->wcap = cap;
    w->committing = true;
    pthread_mutex_unlock(&w->mu);

    int rc = fr_wal_write_all(fd, out, len);
    if (rc == 0 && !w->no_sync && fdatasync(fd) != 0)
        rc = FERRY_EIO;
    int saved = errno;
    ferry_error rerr = {0};
    uint64_t seq0 = w->next_seq, t0 = fr_now_ns();
    int rrc = rc == 0 && w->ha && len ? replicate(w, out, len, &rerr) : 0;
    uint64_t ha_ns = w->next_seq != seq0 ? fr_now_ns() - t0 : 0;

    pthread_mutex_lock(&w->mu);
    w->committing = false;
    if (rc < 0) {
        /* Never retry: after a failed fsync the kernel may have dropped the
         * dirty pages, so a later success would prove nothing. */
        w->err = FERRY_EIO;
        FR_ERROR("store", "write-ahead log %s: %s failed: %s; refusing further commits",
                 w->dir, len ? "write/fdatasync" : "fdatasync", strerror(saved));
    } else if (rrc < 0) {
        /* Not replicated: never acknowledged. Another leader may already
         * hold what etcd has; this master stops committing. */
        w->err = rrc;
        FR_ERROR("store", "write-ahead log %s: replicating a commit failed: %s; refusing further "
                 "commits", w->dir, rerr.msg);
    } else {
        w->durable_lsn = target;
        w->log_bytes += len;
        w->st.fsyncs++;
        w->st.bytes += len;
    }
    if (w->next_seq != seq0) {   /* appended, also when a later piece failed */
        w->st.ha_entries += w->next_seq - seq0;
        w->st.ha_bytes += rrc == 0 ? len : 0;
        w->st.ha_ns += ha_ns;
    }
    pthread_cond_broadcast(&w->cv);
}

int fr_wal_sync(fr_wal *w, uint64_t lsn, uint64_t deadline_ns)
{
    if (w == NULL)
        return FERRY_EINVAL;
    struct timespec ts = fr_timespec_at(deadline_ns);
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    if (lsn > w->last_lsn)
        rc = FERRY_EINVAL;
    while (rc == 0 && w->durable_lsn < lsn) {
        if (w->err != 0) {
            rc = w->err;
        } else if (!w->committing) {
            lead_commit(w);
        } else if (deadline_ns == UINT64_MAX) {
            pthread_cond_wait(&w->cv, &w->mu);
        } else if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT &&
                   w->durable_lsn < lsn) {
            rc = FERRY_ETIMEDOUT;
        }
    }
    if (rc == 0 && w->err != 0 && w->durable_lsn < lsn)
        rc = w->err;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int fr_wal_commit(fr_wal *w)
{
    if (w == NULL)
        return FERRY_EINVAL;
    return fr_wal_sync(w, fr_wal_last_lsn(w), UINT64_MAX);
}

uint64_t fr_wal_last_lsn(fr_wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->last_lsn;
    pthread_mutex_unlock(&w->mu);
    return v;
}

uint64_t fr_wal_durable_lsn(fr_wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->durable_lsn;
    pthread_mutex_unlock(&w->mu);
    return v;
}

void fr_wal_stats_get(fr_wal *w, fr_wal_stats *st)
{
    pthread_mutex_lock(&w->mu);
    *st = w->st;
    st->log_bytes = w->log_bytes;
    st->ha_next_seq = w->next_seq;
    pthread_mutex_unlock(&w->mu);
}
