/* The log directory: opening and recovering it, rotating logs and writing
 * snapshots. See store_int.h for the file formats. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/wal_int.h"

#define SNAP_BUF (1u << 20)

static int io_fail(const fr_wal *w, const char *what, const char *name)
{
    FR_ERROR("store", "%s/%s: %s: %s", w->dir, name, what, strerror(errno));
    return FERRY_EIO;
}

static int meta_sink(void *ctx, const uint8_t *rec, size_t len)
{
    return fr_wal_append(ctx, rec, len, NULL);
}

/* ---- names ---------------------------------------------------------------- */

static void file_name(char out[40], const char *prefix, uint64_t lsn, const char *suffix)
{
    snprintf(out, 40, "%s%016" PRIx64 "%s", prefix, lsn, suffix);
}

/* Parse "<prefix><16 hex><suffix>" exactly. */
static bool parse_name(const char *name, const char *prefix, const char *suffix, uint64_t *lsn)
{
    size_t p = strlen(prefix), s = strlen(suffix);
    if (strlen(name) != p + 16 + s || strncmp(name, prefix, p) != 0 ||
        strcmp(name + p + 16, suffix) != 0)
        return false;
    uint64_t v = 0;
    for (size_t i = p; i < p + 16; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *lsn = v;
    return true;
}

typedef struct { uint64_t *v; size_t n, cap; } lsn_list;

static int lsn_add(lsn_list *l, uint64_t v)
{
    if (fr_grow((void **)&l->v, &l->cap, l->n + 1, sizeof(uint64_t)) < 0)
        return FERRY_ENOMEM;
    l->v[l->n++] = v;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* List snapshots and logs (sorted); delete leftover temporary files. */
static int list_dir(fr_wal *w, lsn_list *snaps, lsn_list *logs)
{
    int fd = dup(w->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return io_fail(w, "cannot list", ".");
    }
    rewinddir(d);
    struct dirent *e;
    int rc = 0;
    uint64_t lsn;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (parse_name(e->d_name, "snap-", ".fsnap", &lsn))
            rc = lsn_add(snaps, lsn);
        else if (parse_name(e->d_name, "wal-", ".flog", &lsn))
            rc = lsn_add(logs, lsn);
        else if (parse_name(e->d_name, "snap-", ".tmp", &lsn))
            unlinkat(w->dirfd, e->d_name, 0);   /* a snapshot that never finished */
    }
    closedir(d);
    fr_sort(snaps->v, snaps->n, sizeof(uint64_t), cmp_u64);
    fr_sort(logs->v, logs->n, sizeof(uint64_t), cmp_u64);
    return rc;
}

static int read_file(fr_wal *w, const char *name, uint8_t **out, size_t *len)
{
    int fd = openat(w->dirfd, name, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int rc = io_fail(w, "cannot open", name);
        if (fd >= 0)
            close(fd);
        return rc;
    }
    uint8_t *buf = fr_malloc((size_t)st.st_size);
    size_t got = 0;
    if (buf == NULL) {
        close(fd);
        return FERRY_ENOMEM;
    }
    while (got < (size_t)st.st_size) {
        ssize_t k = read(fd, buf + got, (size_t)st.st_size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    *out = buf;
    *len = got;
    return 0;
}

/* ---- recovery ------------------------------------------------------------- */

typedef struct {
    fr_meta *m;
    uint64_t skip_to;      /* apply records with LSN >= this */
    uint64_t applied;
    const fr_wal *w;
    const char *file;
    bool refused;          /* a record did not apply (already reported) */
} replay_ctx;

static int replay_one(void *ctx, uint64_t lsn, const uint8_t *rec, size_t len)
{
    replay_ctx *c = ctx;
    if (lsn < c->skip_to)
        return 0;          /* already in the snapshot */
    int rc = fr_meta_replay(c->m, rec, len);
    if (rc < 0) {
        FR_ERROR("store", "%s/%s: record at LSN %" PRIu64 ": %s", c->w->dir, c->file, lsn,
                 fr_meta_errmsg(c->m));
        c->refused = true;
        return rc == FERRY_ENOMEM ? rc : FERRY_ECORRUPT;
    }
    c->applied++;
    return 0;
}

static int load_snapshot(fr_wal *w, fr_meta *m, uint64_t lsn)
{
    char name[40];
    uint8_t *buf;
    size_t len;
    uint32_t kind;
    uint64_t hlsn;
    fr_wal_scan_result res;
    file_name(name, "snap-", lsn, ".fsnap");
    int rc = read_file(w, name, &buf, &len);
    if (rc < 0)
        return rc;
    replay_ctx c = { .m = m, .w = w, .file = name };
    if (fr_wal_hdr_decode(buf, len, &kind, &hlsn) < 0 || kind != FR_WAL_SNAP || hlsn != lsn) {
        FR_ERROR("store", "%s/%s: bad header", w->dir, name);
        rc = FERRY_ECORRUPT;
    } else if ((rc = fr_meta_load_begin(m)) == 0) {
        rc = fr_wal_scan(buf + FR_WAL_FILE_HDR, len - FR_WAL_FILE_HDR, 1, replay_one, &c, &res);
        if (rc == FERRY_ECORRUPT && !c.refused)
            FR_ERROR("store", "%s/%s: damaged record after byte %zu", w->dir, name,
                     FR_WAL_FILE_HDR + res.valid_len);
        if (rc == 0 && (res.torn || fr_meta_loading(m))) {
            FR_ERROR("store", "%s/%s: snapshot is cut short after %" PRIu64 " records", w->dir,
                     name, res.frames);
            rc = FERRY_ECORRUPT;
        }
    }
    fr_free(buf);
    return rc;
}

/* Create log wal-<lsn>.flog holding only its header, durably. */
static int create_log(fr_wal *w, uint64_t lsn, int *out)
{
    char name[40];
    uint8_t hdr[FR_WAL_FILE_HDR];
    file_name(name, "wal-", lsn, ".flog");
    unlinkat(w->dirfd, name, 0);   /* a header-only leftover of a crash */
    int fd = openat(w->dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return io_fail(w, "cannot create", name);
    fr_wal_hdr_encode(hdr, FR_WAL_LOG, lsn);
    if (fr_wal_write_all(fd, hdr, sizeof(hdr)) < 0 || (!w->no_sync && fsync(fd) != 0) ||
        (!w->no_sync && fr_wal_fsync_dir(w->dirfd) < 0)) {
        int rc = io_fail(w, "cannot write", name);
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

typedef struct {
    uint64_t next;          /* LSN the next record must carry */
    uint64_t prev_end;      /* LSN after the last log's last record */
    uint64_t last_start;    /* start of the last log read */
    size_t last_len;        /* its valid length, header included */
    bool have_last;
} log_walk;

/* Replay one log. last: it is the newest (a torn tail is allowed there). */
static int replay_log(fr_wal *w, fr_meta *m, uint64_t start, bool last, log_walk *lw,
                      fr_wal_recovery *rep)
{
    char name[40];
    uint8_t *buf;
    size_t len;
    uint32_t kind;
    uint64_t hlsn;
    fr_wal_scan_result res;
    file_name(name, "wal-", start, ".flog");
    int rc = read_file(w, name, &buf, &len);
    if (rc < 0)
        return rc;
    if (fr_wal_hdr_decode(buf, len, &kind, &hlsn) < 0 || kind != FR_WAL_LOG || hlsn != start) {
        fr_free(buf);
        if (last && len <= FR_WAL_FILE_HDR) {
            /* Crashed while creating it: it never held a record. */
            FR_WARN("store", "%s/%s: incomplete header, dropping the empty log", w->dir, name);
            unlinkat(w->dirfd, name, 0);
            return 0;
        }
        FR_ERROR("store", "%s/%s: bad header", w->dir, name);
        return FERRY_ECORRUPT;
    }
    /* Logs follow each other without a gap; the first one may start
     * inside the snapshot, never after it. */
    if ((lw->have_last && start != lw->prev_end) || (!lw->have_last && start > lw->next)) {
        fr_free(buf);
        FR_ERROR("store", "%s/%s: starts at LSN %" PRIu64 ", expected %" PRIu64, w->dir, name,
                 start, lw->have_last ? lw->prev_end : lw->next);
        return FERRY_ECORRUPT;
    }
    replay_ctx c = { .m = m, .skip_to = lw->next, .w = w, .file = name };
    rc = fr_wal_scan(buf + FR_WAL_FILE_HDR, len - FR_WAL_FILE_HDR, start, replay_one, &c, &res);
    fr_free(buf);
    if (rc == FERRY_ECORRUPT && !c.refused)
        FR_ERROR("store", "%s/%s: damaged record after byte %zu with valid records behind it",
                 w->dir, name, FR_WAL_FILE_HDR + res.valid_len);
    if (rc < 0)
        return rc;
    if (res.torn && !last) {
        FR_ERROR("store", "%s/%s: cut short but a newer log follows", w->dir, name);
        return FERRY_ECORRUPT;
    }
    if (res.torn) {
        rep->torn_bytes = len - FR_WAL_FILE_HDR - res.valid_len;
        FR_WARN("store", "%s/%s: dropping a torn tail of %" PRIu64 " bytes after LSN %" PRIu64,
                w->dir, name, rep->torn_bytes, res.next_lsn - 1);
    }
    rep->replayed += c.applied;
    rep->logs++;
    if (res.next_lsn > lw->next)
        lw->next = res.next_lsn;
    lw->have_last = true;
    lw->prev_end = res.next_lsn;
    lw->last_start = start;
    lw->last_len = FR_WAL_FILE_HDR + res.valid_len;
    return 0;
}

/* Append to the last log (cut at its valid length) or start a new one. */
static int open_tail(fr_wal *w, const log_walk *lw)
{
    if (lw->have_last && lw->prev_end == lw->next) {
        char name[40];
        file_name(name, "wal-", lw->last_start, ".flog");
        int fd = openat(w->dirfd, name, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)lw->last_len) != 0 || (!w->no_sync && fsync(fd) != 0)) {
            int rc = io_fail(w, "cannot reopen", name);
            if (fd >= 0)
                close(fd);
            return rc;
        }
        w->fd = fd;
        w->log_start = lw->last_start;
        w->log_bytes = lw->last_len;
        return 0;
    }
    w->log_start = lw->next;
    w->log_bytes = FR_WAL_FILE_HDR;
    return create_log(w, lw->next, &w->fd);
}

static int recover(fr_wal *w, fr_meta *m, fr_wal_recovery *rep)
{
    lsn_list snaps = { 0 }, logs = { 0 };
    log_walk lw = { .next = 1 };
    int rc = list_dir(w, &snaps, &logs);
    if (rc == 0 && snaps.n > 0) {
        rep->snapshot_lsn = snaps.v[snaps.n - 1];
        rc = load_snapshot(w, m, rep->snapshot_lsn);
        lw.next = rep->snapshot_lsn + 1;
    }
    for (size_t i = 0; rc == 0 && i < logs.n; i++)
        rc = replay_log(w, m, logs.v[i], i + 1 == logs.n, &lw, rep);
    if (rc == 0)
        rc = open_tail(w, &lw);
    rep->last_lsn = lw.next - 1;
    w->last_lsn = w->durable_lsn = lw.next - 1;
    fr_free(snaps.v);
    fr_free(logs.v);
    return rc;
}

int fr_wal_open(const char *dir, const fr_wal_opts *opts, fr_meta *m, fr_wal **out,
                fr_wal_recovery *rep)
{
    fr_wal_recovery r0;
    if (dir == NULL || m == NULL || out == NULL)
        return FERRY_EINVAL;
    if (rep == NULL)
        rep = &r0;
    memset(rep, 0, sizeof(*rep));
    fr_wal *w = fr_calloc(1, sizeof(*w));
    if (w == NULL || (w->dir = fr_strdup(dir)) == NULL) {
        fr_free(w);
        return FERRY_ENOMEM;
    }
    w->fd = w->dirfd = w->lockfd = -1;
    w->no_sync = opts != NULL && opts->no_sync;
    pthread_mutex_init(&w->mu, NULL);
    fr_cond_init_monotonic(&w->cv);
    int rc = 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        rc = io_fail(w, "cannot create", ".");
    else if ((w->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        rc = io_fail(w, "cannot open", ".");
    else if ((w->lockfd = openat(w->dirfd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
        rc = io_fail(w, "cannot open", "LOCK");
    else if (flock(w->lockfd, LOCK_EX | LOCK_NB) != 0) {
        FR_ERROR("store", "%s is in use by another process", dir);
        rc = errno == EWOULDBLOCK ? FERRY_EBUSY : FERRY_EIO;
    } else {
        rc = recover(w, m, rep);
    }
    if (rc < 0) {
        fr_wal_close(w, NULL);
        return rc;
    }
    FR_INFO("store", "%s: recovered to LSN %" PRIu64 " (snapshot %" PRIu64 ", %" PRIu64
            " log records, %" PRIu64 " torn bytes dropped)",
            dir, rep->last_lsn, rep->snapshot_lsn, rep->replayed, rep->torn_bytes);
    w->m = m;
    fr_meta_set_sink(m, meta_sink, w);
    *out = w;
    return 0;
}

int fr_wal_open_state(const char *dir, const fr_wal_opts *opts, fr_meta *m, uint64_t next_lsn,
                      fr_wal **out)
{
    if (dir == NULL || m == NULL || out == NULL || next_lsn == 0)
        return FERRY_EINVAL;
    fr_meta *empty = NULL;
    int rc = fr_meta_new(NULL, &empty);
    if (rc < 0)
        return rc;
    fr_wal_recovery rep;
    fr_wal *w = NULL;
    rc = fr_wal_open(dir, opts, empty, &w, &rep);
    if (rc == 0 && rep.last_lsn != 0) {
        FR_ERROR("store", "%s holds a log already: a state from elsewhere is not written over it",
                 dir);
        rc = FERRY_EEXIST;
    }
    if (rc < 0) {
        fr_wal_close(w, empty);
        fr_meta_destroy(empty);
        return rc;
    }
    fr_meta_set_sink(empty, NULL, NULL);
    fr_meta_destroy(empty);
    pthread_mutex_lock(&w->mu);
    w->last_lsn = w->durable_lsn = next_lsn - 1;
    pthread_mutex_unlock(&w->mu);
    w->m = m;
    fr_meta_set_sink(m, meta_sink, w);
    if (next_lsn > 1 && (rc = fr_wal_checkpoint(w, m)) < 0) {
        fr_wal_close(w, m);
        return rc;
    }
    *out = w;
    return 0;
}

void fr_wal_close(fr_wal *w, fr_meta *m)
{
    if (w == NULL)
        return;
    if (w->fd >= 0)
        fr_wal_commit(w);
    if (m != NULL && m == w->m)
        fr_meta_set_sink(m, NULL, NULL);
    if (w->fd >= 0)
        close(w->fd);
    if (w->lockfd >= 0)
        close(w->lockfd);   /* releases the flock */
    if (w->dirfd >= 0)
        close(w->dirfd);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    fr_free(w->buf);
    fr_free(w->wbuf);
    fr_free(w->dir);
    fr_free(w);
}

/* ---- snapshots and rotation --------------------------------------------------- */

typedef struct {
    int fd;
    uint8_t *buf;
    size_t len, cap;
    uint64_t seq;
} snap_writer;

static int snap_flush(snap_writer *sw)
{
    int rc = fr_wal_write_all(sw->fd, sw->buf, sw->len);
    sw->len = 0;
    return rc;
}

static int snap_sink(void *ctx, const uint8_t *rec, size_t len)
{
    snap_writer *sw = ctx;
    size_t need = sw->len + len + FR_WAL_FRAME_HEAD + FR_WAL_FRAME_TAIL;
    if (fr_grow((void **)&sw->buf, &sw->cap, need, 1) < 0)
        return FERRY_ENOMEM;
    sw->len += fr_wal_frame_encode(sw->buf + sw->len, ++sw->seq, rec, len);
    return sw->len >= SNAP_BUF ? snap_flush(sw) : 0;
}

static int write_snapshot(fr_wal *w, fr_meta *m, uint64_t lsn)
{
    char tmp[40], name[40];
    uint8_t hdr[FR_WAL_FILE_HDR];
    file_name(tmp, "snap-", lsn, ".tmp");
    file_name(name, "snap-", lsn, ".fsnap");
    snap_writer sw = { .fd = openat(w->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) };
    if (sw.fd < 0)
        return io_fail(w, "cannot create", tmp);
    fr_wal_hdr_encode(hdr, FR_WAL_SNAP, lsn);
    int rc = fr_wal_write_all(sw.fd, hdr, sizeof(hdr));
    if (rc == 0)
        rc = fr_meta_snapshot(m, snap_sink, &sw);
    if (rc == 0)
        rc = snap_flush(&sw);
    if (rc == 0 && !w->no_sync && fsync(sw.fd) != 0)
        rc = FERRY_EIO;
    if (close(sw.fd) != 0 && rc == 0)
        rc = FERRY_EIO;
    fr_free(sw.buf);
    if (rc == 0 && renameat(w->dirfd, tmp, w->dirfd, name) != 0)
        rc = FERRY_EIO;
    if (rc == 0 && !w->no_sync)
        rc = fr_wal_fsync_dir(w->dirfd);
    if (rc < 0) {
        FR_ERROR("store", "%s/%s: writing the snapshot failed: %s", w->dir, tmp, ferry_strerror(rc));
        unlinkat(w->dirfd, tmp, 0);
    }
    return rc;
}

/* Delete what snapshot `lsn` makes redundant: older snapshots, and logs
 * that start at or before it and are not the current one. */
static void prune(fr_wal *w, uint64_t lsn)
{
    lsn_list snaps = { 0 }, logs = { 0 };
    char name[40];
    if (list_dir(w, &snaps, &logs) == 0) {
        for (size_t i = 0; i < snaps.n; i++) {
            if (snaps.v[i] >= lsn)
                continue;
            file_name(name, "snap-", snaps.v[i], ".fsnap");
            unlinkat(w->dirfd, name, 0);
        }
        for (size_t i = 0; i < logs.n; i++) {
            if (logs.v[i] > lsn || logs.v[i] == w->log_start)
                continue;
            file_name(name, "wal-", logs.v[i], ".flog");
            unlinkat(w->dirfd, name, 0);
        }
        if (!w->no_sync)
            fr_wal_fsync_dir(w->dirfd);
    }
    fr_free(snaps.v);
    fr_free(logs.v);
}

int fr_wal_checkpoint(fr_wal *w, fr_meta *m)
{
    if (w == NULL || m == NULL || m != w->m)
        return FERRY_EINVAL;
    int rc = fr_wal_commit(w), fd;
    if (rc < 0)
        return rc;
    uint64_t lsn = fr_wal_last_lsn(w);
    /* The new log exists before the snapshot does: a crash in between
     * leaves the old snapshot, the old logs and an empty new log. */
    if ((rc = create_log(w, lsn + 1, &fd)) < 0)
        return rc;
    pthread_mutex_lock(&w->mu);
    while (w->committing)
        pthread_cond_wait(&w->cv, &w->mu);
    int old = w->fd;
    w->fd = fd;
    w->log_start = lsn + 1;
    w->log_bytes = FR_WAL_FILE_HDR;
    pthread_mutex_unlock(&w->mu);
    close(old);
    if ((rc = write_snapshot(w, m, lsn)) < 0)
        return rc;
    prune(w, lsn);
    pthread_mutex_lock(&w->mu);
    w->st.snapshots++;
    pthread_mutex_unlock(&w->mu);
    return 0;
}
