/* The replicated log of a cluster of masters, in etcd (docs/store.md,
 * "High availability"): entries ferry-ha/<cluster>/log/<seq, 20 digits>,
 * each the bytes of one group commit (opaque here), appended by the
 * leader only: every append is one etcd transaction fenced by the
 * leadership's epoch (ha_elect.h), so a deposed leader appends nothing.
 * A standby reads the entries in order from the sequence it has applied.
 * Truncation (fenced too) deletes the entries below a sequence a snapshot
 * covers, then compacts etcd's history, so that etcd's database stays
 * bounded however long the job runs. */
#ifndef FR_STORE_HA_LOG_H
#define FR_STORE_HA_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "store/ha_elect.h"

/* An entry's bytes at most: etcd refuses requests over 1.5 MiB. */
#define FR_HA_LOG_ENTRY_MAX (1u << 20)

typedef struct fr_ha_entry {
    uint64_t seq;
    void *data;                  /* malloc'd */
    size_t len;
} fr_ha_entry;
void fr_ha_entries_free(fr_ha_entry *v, size_t n);

/* Entry seq (>= 1) = data, while epoch leads; FERRY_ESTATE when it does
 * not (nothing written), FERRY_EMSGSIZE over FR_HA_LOG_ENTRY_MAX. */
int fr_ha_log_append(fr_ha_elect *h, int64_t epoch, uint64_t seq, const void *data, size_t len,
                     ferry_error *err);
/* Up to max entries (>= 1) from seq `from` on, in order: *out (*n). */
int fr_ha_log_read(fr_ha_elect *h, uint64_t from, size_t max, fr_ha_entry **out, size_t *n,
                   ferry_error *err);
/* Delete every entry below seq `below` while epoch leads (FERRY_ESTATE
 * otherwise), then compact etcd's history to now. *deleted may be NULL. */
int fr_ha_log_truncate(fr_ha_elect *h, int64_t epoch, uint64_t below, int64_t *deleted,
                       ferry_error *err);

/* A standby keeping up (the hot standby): apply to m the log entries from
 * *next_seq on, all those there are now (at most max_entries when it is
 * not 0), each entry's frames walked as recovery walks a log file — the
 * frames' LSNs continuing *next_lsn — and each record replayed into m
 * (fr_meta_replay). Advances *next_seq and *next_lsn past the whole
 * entries it applied; *applied (may be NULL): the records. FERRY_ECORRUPT
 * for an entry that is not whole frames continuing the LSNs or holds a
 * record that does not apply (m then holds that entry's records before
 * it: a standby that gets this rebuilds from a snapshot). */
struct fr_meta;

/* Snapshots in etcd: m's state (quiescent: no mutation meanwhile), the
 * state after the log's entries below `seq`, whose next record carries
 * LSN `lsn`, written while epoch leads as chunks of at most
 * FR_HA_LOG_ENTRY_MAX under ferry-ha/<cluster>/snap/<seq>/, then named
 * by the cluster's snapshot key (seq, lsn, chunks, the state's digest);
 * then the log below seq and older snapshots are deleted and etcd's
 * history compacted. FERRY_ESTATE (nothing named, nothing deleted) when
 * epoch no longer leads. */
int fr_ha_snapshot_put(fr_ha_elect *h, int64_t epoch, struct fr_meta *m, uint64_t seq,
                       uint64_t lsn, ferry_error *err);
/* Load the cluster's snapshot into m (empty): *seq and *lsn of the log
 * entry and record that follow it (fr_ha_follow from there). FERRY_ENOENT
 * when there is none (follow from entry 1, LSN 1); FERRY_ECORRUPT when
 * its chunks do not rebuild the state it names (m partial: drop it). */
int fr_ha_snapshot_load(fr_ha_elect *h, struct fr_meta *m, uint64_t *seq, uint64_t *lsn,
                        ferry_error *err);

/* The log entry that follows the cluster's snapshot (0: no snapshot). A
 * follower whose next entry is below it was truncated past: it must load
 * the snapshot (the entries it lacks are gone). */
int fr_ha_snapshot_seq(fr_ha_elect *h, uint64_t *seq, ferry_error *err);

int fr_ha_follow(fr_ha_elect *h, struct fr_meta *m, size_t max_entries, uint64_t *next_seq,
                 uint64_t *next_lsn, uint64_t *applied, ferry_error *err);

#endif
