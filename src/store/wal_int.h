/* Private to wal.c and wal_dir.c: the state behind fr_wal. */
#ifndef FR_WAL_INT_H
#define FR_WAL_INT_H

#include <pthread.h>

#include "store/store_int.h"

struct fr_wal {
    char *dir;
    int dirfd, lockfd;
    int fd;                   /* current log, append-only */
    bool no_sync;
    fr_meta *m;               /* the meta this WAL is the sink of */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* a commit finished */
    uint8_t *buf;             /* frames appended, not yet written */
    size_t blen, bcap;
    uint8_t *wbuf;            /* the other buffer: written by the committing thread */
    size_t wcap;
    uint64_t last_lsn, durable_lsn;
    bool committing;
    int err;                  /* sticky: FERRY_EIO after a failed write or fsync */
    uint64_t log_start;       /* LSN of the current log's first record */
    uint64_t log_bytes;       /* bytes in the current log file */
    fr_wal_stats st;
    /* replicated (fr_wal_replicate): every commit also appended to the
     * cluster's log in etcd, fenced by the leadership's epoch */
    struct fr_ha_elect *ha;
    int64_t epoch;
    uint64_t next_seq;        /* the log entry the next commit appends */
};

#endif
