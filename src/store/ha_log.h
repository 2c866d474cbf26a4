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

#endif
