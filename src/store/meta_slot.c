/* Placement slots: a put may name a slot (fr_replicate.slot, nonzero), and
 * the master remembers where the last few objects of each slot were when
 * they went. A later put of the same slot takes one of those places when it
 * is still free and large enough, before any best fit.
 *
 * Why: a process writes a place in a node's segment fast only when it has
 * written it before (its page-table entries exist; on VMs a first write
 * through a new entry costs 20-50x a warm copy, docs/weights.md "Warm
 * memory"). A publisher that puts each generation's pieces under the same
 * slots lands them where its own earlier generations were, so its copies
 * and its readers' copies stay warm, and the segment does not fragment as
 * generations come and go.
 *
 * A hint, never a requirement: nothing of it is logged, a restarted master
 * starts with none, and a put whose places are taken is placed as any
 * other. The memory is bounded: a fixed table of SLOT_TABLE entries,
 * direct-mapped by the slot's value (a collision forgets the older slot),
 * each keeping the SLOT_PLACES most recent places. */
#include "store/meta_int.h"

#define SLOT_TABLE 8192u
#define SLOT_PLACES 4u

typedef struct slot_place { uint64_t seg, off, len; } slot_place;

typedef struct slot_entry {
    uint64_t slot;                     /* 0: empty */
    uint32_t n;                        /* places kept, newest first */
    slot_place at[SLOT_PLACES];
} slot_entry;

struct meta_slots {
    slot_entry e[SLOT_TABLE];
};

static slot_entry *entry_of(const fr_meta *m, uint64_t slot)
{
    /* slots are hashes or small counters: mix, so both spread */
    uint64_t h = slot * 0x9e3779b97f4a7c15ull;
    return m->slots ? &m->slots->e[(h >> 40) % SLOT_TABLE] : NULL;
}

void meta_slot_freed(fr_meta *m, uint64_t slot, uint64_t seg, uint64_t off, uint64_t len)
{
    if (slot == 0)
        return;
    if (m->slots == NULL && (m->slots = fr_calloc(1, sizeof *m->slots)) == NULL)
        return;   /* a hint: without memory for it, places are best fits */
    slot_entry *e = entry_of(m, slot);
    if (e->slot != slot)
        *e = (slot_entry){ .slot = slot };
    uint32_t keep = e->n < SLOT_PLACES ? e->n : SLOT_PLACES - 1;
    memmove(&e->at[1], &e->at[0], keep * sizeof e->at[0]);
    e->at[0] = (slot_place){ .seg = seg, .off = off, .len = len };
    e->n = keep + 1;
}

bool meta_slot_place(const fr_meta *m, uint64_t slot, const meta_seg *s, uint64_t len,
                     uint64_t *off)
{
    const slot_entry *e = slot ? entry_of(m, slot) : NULL;
    if (e == NULL || e->slot != slot)
        return false;
    for (uint32_t i = 0; i < e->n; i++) {
        const slot_place *p = &e->at[i];
        if (p->seg == s->id && p->len >= len && fr_segalloc_is_free(s->alloc, p->off, len)) {
            *off = p->off;
            return true;
        }
    }
    return false;
}

void meta_slot_free_all(fr_meta *m)
{
    fr_free(m->slots);
    m->slots = NULL;
}
