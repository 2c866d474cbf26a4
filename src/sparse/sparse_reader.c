/* The sparse reader (sparse.h, docs/sparse.md "The reader"): its config,
 * and the index cache it owns. Compact indexes (and the planner's
 * secondary indexes in aux) outlive a read, keyed by object key within the
 * reader, which reads one store. An entry is used only while the object
 * still has the size and replica placement it had when read (one metadata
 * round trip, no lease, done by the read before it asks here). A read takes
 * its entries out and puts them back when done, so concurrent reads never
 * share one (and the planner may build aux without locks). Bounded in
 * entries and bytes, least recently used out. */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "sparse/sparse_int.h"

typedef struct sp_slot {
    fr_sp_entry e;
    uint64_t stamp;               /* the clock when put: smallest goes first */
    bool used;
} sp_slot;

struct ferry_sparse_reader {
    ferry_store *s;
    ferry_sparse_reader_config cfg;   /* resolved */
    pthread_mutex_t mu;               /* guards what follows */
    sp_slot *slots;                   /* cfg.cache_entries */
    uint64_t bytes, clock;
};

int ferry_sparse_reader_config_init(ferry_sparse_reader_config *cfg)
{
    if (!cfg)
        return FERRY_EINVAL;
    memset(cfg, 0, sizeof *cfg);
    cfg->cache_entries = FERRY_SPARSE_READER_CACHE_ENTRIES;
    cfg->cache_bytes = FERRY_SPARSE_READER_CACHE_BYTES;
    return 0;
}

void fr_sparse_reader_config_resolve(ferry_sparse_reader_config *cfg)
{
    ferry_sparse_reader_config d;
    (void)ferry_sparse_reader_config_init(&d);
    if (!cfg->cache_entries)
        cfg->cache_entries = d.cache_entries;
    if (!cfg->cache_bytes)
        cfg->cache_bytes = d.cache_bytes;
}

int ferry_sparse_reader_open(ferry_store *s, const ferry_sparse_reader_config *cfg,
                             ferry_sparse_reader **out, ferry_error *err)
{
    if (out)
        *out = NULL;
    if (!s || !cfg || !out)
        return fr_fail(err, FERRY_EINVAL, "sparse reader: store, config and out are required");
    if (!FR_RESERVED_OK(cfg))
        return fr_fail(err, FERRY_EINVAL, "sparse reader: the config's reserved fields must be "
                       "zero (start from ferry_sparse_reader_config_init)");
    if (cfg->cache_entries > FERRY_SPARSE_READER_CACHE_ENTRIES_MAX)
        return fr_fail(err, FERRY_EINVAL, "sparse reader: cache_entries %" PRIu64 " is more "
                       "than %u", cfg->cache_entries, FERRY_SPARSE_READER_CACHE_ENTRIES_MAX);
    ferry_sparse_reader *r = fr_calloc(1, sizeof *r);
    if (!r)
        return fr_fail(err, FERRY_ENOMEM, "sparse reader: out of memory");
    r->s = s;
    r->cfg = *cfg;
    fr_sparse_reader_config_resolve(&r->cfg);
    r->slots = fr_calloc(r->cfg.cache_entries, sizeof *r->slots);
    if (!r->slots || pthread_mutex_init(&r->mu, NULL) != 0) {
        uint64_t n = r->cfg.cache_entries;
        fr_free(r->slots);
        fr_free(r);
        return fr_fail(err, FERRY_ENOMEM, "sparse reader: out of memory for %" PRIu64 " cache "
                       "entries", n);
    }
    *out = r;
    return 0;
}

void ferry_sparse_reader_close(ferry_sparse_reader *r)
{
    if (!r)
        return;
    for (uint64_t i = 0; i < r->cfg.cache_entries; i++)
        if (r->slots[i].used)
            ferry_sparse_index_free(&r->slots[i].e.ix);
    fr_free(r->slots);
    pthread_mutex_destroy(&r->mu);
    fr_free(r);
}

ferry_store *fr_sp_reader_store(const ferry_sparse_reader *r)
{
    return r->s;
}

/* Empty slot c (under r->mu), freeing its index. */
static void slot_drop(ferry_sparse_reader *r, sp_slot *c)
{
    ferry_sparse_index_free(&c->e.ix);
    r->bytes -= c->e.bytes;
    memset(c, 0, sizeof *c);
}

bool fr_sp_cache_take(ferry_sparse_reader *r, const char *key, const ferry_object_desc *od,
                      fr_sp_entry *out)
{
    if (!r)
        return false;
    bool hit = false;
    pthread_mutex_lock(&r->mu);
    for (uint64_t i = 0; i < r->cfg.cache_entries; i++) {
        sp_slot *c = &r->slots[i];
        if (!c->used || strcmp(c->e.ix.key, key) != 0)
            continue;
        if (od->nreplicas && c->e.size == od->size && c->e.segment == od->replicas[0].segment &&
            c->e.offset == od->replicas[0].offset) {
            *out = c->e;              /* moved: the slot forgets it */
            hit = true;
            r->bytes -= c->e.bytes;
            memset(c, 0, sizeof *c);
        } else {
            slot_drop(r, c);          /* another object under the key now */
        }
        break;
    }
    pthread_mutex_unlock(&r->mu);
    return hit;
}

void fr_sp_cache_put(ferry_sparse_reader *r, fr_sp_entry *e)
{
    if (!r) {
        ferry_sparse_index_free(&e->ix);
        return;
    }
    pthread_mutex_lock(&r->mu);
    bool keep = e->bytes <= r->cfg.cache_bytes;
    for (uint64_t i = 0; i < r->cfg.cache_entries && keep; i++)
        if (r->slots[i].used && strcmp(r->slots[i].e.ix.key, e->ix.key) == 0)
            keep = false;   /* another read put the key back first */
    while (keep) {
        sp_slot *slot = NULL, *victim = NULL;
        for (uint64_t i = 0; i < r->cfg.cache_entries; i++) {
            sp_slot *c = &r->slots[i];
            if (!c->used)
                slot = slot ? slot : c;
            else if (!victim || c->stamp < victim->stamp)
                victim = c;
        }
        if (slot && r->bytes + e->bytes <= r->cfg.cache_bytes) {
            slot->e = *e;
            slot->stamp = ++r->clock;
            slot->used = true;
            r->bytes += e->bytes;
            pthread_mutex_unlock(&r->mu);
            return;
        }
        if (!victim)
            break;
        slot_drop(r, victim);
    }
    pthread_mutex_unlock(&r->mu);
    ferry_sparse_index_free(&e->ix);
}
