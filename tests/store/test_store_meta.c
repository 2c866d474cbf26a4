/* store: the metadata core — placement, eviction, leases, loss, KV, watch,
 * barriers, queues — and deterministic replay of its records. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_int.h"
#include "store/workload.h"

#define KiB 1024ull

static fr_meta *mk(double hw)
{
    fr_meta_config cfg;
    fr_meta *m;
    fr_meta_config_default(&cfg);
    cfg.high_watermark = hw;
    assert_int_equal(fr_meta_new(&cfg, &m), 0);
    return m;
}

static void put(fr_meta *m, const char *key, uint64_t size, const fr_replicate *rc, uint64_t now,
                fr_obj_desc *d)
{
    assert_int_equal(fr_meta_put_start(m, key, size, rc, now, d), 0);
    assert_int_equal(fr_meta_put_end(m, key, now), 0);
}

static bool errmsg_has(fr_meta *m, const char *text)
{
    return strstr(fr_meta_errmsg(m), text) != NULL;
}

/* ---- placement --------------------------------------------------------- */

static void test_placement_preferred(void **state)
{
    (void)state;
    fr_meta *m = mk(1.0);
    fr_obj_desc d;
    for (uint64_t s = 1; s <= 3; s++)
        assert_int_equal(fr_meta_mount(m, s, 100 + s, 1 << 20, 0), 0);
    assert_int_equal(fr_meta_mount(m, 2, 7, 1 << 20, 0), FERRY_EEXIST);

    uint64_t pref[] = { 3, 1 };
    fr_replicate rc = { .replica_num = 2, .preferred = pref, .npreferred = 2 };
    assert_int_equal(fr_meta_put_start(m, "a", 1000, &rc, 0, &d), 0);
    assert_int_equal(d.nrep, 2);
    assert_int_equal(d.rep[0].segment, 3);
    assert_int_equal(d.rep[0].node, 103);
    assert_true(d.rep[0].preferred);
    assert_int_equal(d.rep[1].segment, 1);
    assert_true(d.rep[1].preferred);
    assert_int_equal(d.state, FR_OBJ_PENDING);
    assert_int_equal(d.rep[0].offset % 64, 0);

    /* Unknown preferred segments are skipped; the rest fall back. */
    uint64_t pref2[] = { 99, 2, 2 };
    fr_replicate rc2 = { .replica_num = 3, .preferred = pref2, .npreferred = 3 };
    assert_int_equal(fr_meta_put_start(m, "b", 1000, &rc2, 0, &d), 0);
    assert_int_equal(d.nrep, 3);
    assert_int_equal(d.rep[0].segment, 2);
    assert_true(d.rep[0].preferred);
    assert_false(d.rep[1].preferred);
    assert_false(d.rep[2].preferred);
    /* Distinct segments, always. */
    assert_true(d.rep[0].segment != d.rep[1].segment && d.rep[1].segment != d.rep[2].segment &&
                d.rep[0].segment != d.rep[2].segment);
    /* More replicas than segments: no room, said plainly. */
    fr_replicate rc4 = { .replica_num = 4 };
    assert_int_equal(fr_meta_put_start(m, "c", 10, &rc4, 0, NULL), FERRY_ENOSPC);
    assert_true(errmsg_has(m, "distinct segments"));
    fr_replicate rc9 = { .replica_num = FR_MAX_REPLICAS + 1 };
    assert_int_equal(fr_meta_put_start(m, "c", 10, &rc9, 0, NULL), FERRY_EINVAL);
    assert_int_equal(fr_meta_put_start(m, "a", 10, NULL, 0, NULL), FERRY_EEXIST);
    assert_int_equal(fr_meta_put_start(m, "", 10, NULL, 0, NULL), FERRY_EINVAL);
    fr_meta_destroy(m);
}

/* A full preferred segment is a preference, not a requirement. */
static void test_placement_fallback(void **state)
{
    (void)state;
    fr_meta *m = mk(1.0);
    fr_obj_desc d;
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * KiB, 0), 0);
    assert_int_equal(fr_meta_mount(m, 2, 2, 64 * KiB, 0), 0);
    fr_replicate pin1 = { .preferred = (uint64_t[]){ 1 }, .npreferred = 1, .hard_pin = true };
    put(m, "fill", 60 * KiB, &pin1, 0, &d);
    assert_int_equal(d.rep[0].segment, 1);
    fr_replicate pref1 = { .preferred = (uint64_t[]){ 1 }, .npreferred = 1 };
    assert_int_equal(fr_meta_put_start(m, "x", 8 * KiB, &pref1, 0, &d), 0);
    assert_int_equal(d.nrep, 1);
    assert_int_equal(d.rep[0].segment, 2);
    assert_false(d.rep[0].preferred);
    /* Without a preference, the segment with the most free space wins. */
    assert_int_equal(fr_meta_mount(m, 3, 3, 32 * KiB, 0), 0);
    assert_int_equal(fr_meta_put_start(m, "y", 1 * KiB, NULL, 0, &d), 0);
    assert_int_equal(d.rep[0].segment, 2);      /* 56 KiB free vs 32 KiB */
    fr_seg_info si;
    assert_int_equal(fr_meta_seg_info(m, 2, &si), 0);
    assert_int_equal(si.used, 9 * KiB);
    assert_int_equal(si.objects, 2);
    uint64_t ids[8];
    assert_int_equal(fr_meta_segments(m, ids, 8), 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[2], 3);
    fr_meta_destroy(m);
}

/* Placement slots: generation g's object k lands where the same slot's
 * object of generation g - 3 was (two kept plus the one being put), small
 * objects of other slots in between; a place that is taken is no error
 * (best fit instead); slot 0 remembers nothing. */
static void test_placement_slots(void **state)
{
    (void)state;
    fr_meta *m = mk(1.0);
    fr_obj_desc d;
    assert_int_equal(fr_meta_mount(m, 1, 1, 2048 * KiB, 0), 0);
    uint64_t at[8][4];
    char key[32];
    for (int g = 0; g < 8; g++) {
        for (int k = 0; k < 4; k++) {
            fr_replicate rc = { .hard_pin = true, .slot = 0x5100 + (uint64_t)k };
            snprintf(key, sizeof key, "g%d/o%d", g, k);
            put(m, key, 100 * KiB + (uint64_t)k * KiB, &rc, 0, &d);
            at[g][k] = d.rep[0].offset;
            fr_replicate rs = { .hard_pin = true, .slot = 0x5200 + (uint64_t)k };
            snprintf(key, sizeof key, "g%d/small%d", g, k);   /* interleaved, slots of their own */
            put(m, key, 3 * KiB, &rs, 0, NULL);
        }
        if (g >= 2) {   /* retention: generation g - 2 goes once g is in */
            for (int k = 0; k < 4; k++) {
                snprintf(key, sizeof key, "g%d/o%d", g - 2, k);
                assert_int_equal(fr_meta_remove(m, key, 0), 0);
                snprintf(key, sizeof key, "g%d/small%d", g - 2, k);
                assert_int_equal(fr_meta_remove(m, key, 0), 0);
            }
        }
        for (int k = 0; g >= 3 && k < 4; k++)
            assert_true(at[g][k] == at[g - 3][k]);
    }
    /* generation 6's places are free again; a slotless object of the same
     * size comes first: where it did not take slot 0x5100's newest place
     * the slot's put takes it, where it did the put goes elsewhere, no error */
    for (int k = 0; k < 4; k++) {
        snprintf(key, sizeof key, "g6/o%d", k);
        assert_int_equal(fr_meta_remove(m, key, 0), 0);
    }
    fr_replicate plain = { .hard_pin = true };
    put(m, "squatter", 100 * KiB, &plain, 0, &d);
    uint64_t squat = d.rep[0].offset;
    fr_replicate rc0 = { .hard_pin = true, .slot = 0x5100 };
    put(m, "g9/o0", 100 * KiB, &rc0, 0, &d);
    if (squat != at[6][0])
        assert_true(d.rep[0].offset == at[6][0]);
    else
        assert_true(d.rep[0].offset != at[6][0]);
    /* slot 0: nothing remembered, an ordinary best fit */
    fr_replicate none = { .hard_pin = true };
    put(m, "n0", 101 * KiB, &none, 0, &d);
    fr_meta_destroy(m);
}

/* ---- eviction ---------------------------------------------------------- */

static void test_eviction_lru(void **state)
{
    (void)state;
    fr_meta *m = mk(1.0);
    fr_obj_desc d;
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * KiB, 0), 0);
    put(m, "a", 16 * KiB, NULL, 1, NULL);
    put(m, "b", 16 * KiB, NULL, 2, NULL);
    put(m, "c", 16 * KiB, NULL, 3, NULL);
    put(m, "d", 16 * KiB, NULL, 4, NULL);
    /* A read makes "a" the most recently used (lease 0: no protection). */
    assert_int_equal(fr_meta_get(m, "a", 0, 5, &d), 0);
    put(m, "e", 16 * KiB, NULL, 6, NULL);
    assert_int_equal(fr_meta_exist(m, "b"), 0);    /* least recently used went first */
    assert_int_equal(fr_meta_exist(m, "a"), 1);
    put(m, "f", 20 * KiB, NULL, 7, NULL);          /* needs two evictions: c, then d */
    assert_int_equal(fr_meta_exist(m, "c"), 0);
    assert_int_equal(fr_meta_exist(m, "d"), 0);
    assert_int_equal(fr_meta_exist(m, "a"), 1);
    assert_int_equal(fr_meta_exist(m, "e"), 1);
    /* A pending object is never evicted. */
    assert_int_equal(fr_meta_put_start(m, "p", 10 * KiB, NULL, 8, NULL), 0);
    put(m, "g", 16 * KiB, NULL, 9, NULL);          /* evicts a, then e */
    assert_int_equal(fr_meta_exist(m, "a"), 0);
    assert_int_equal(fr_meta_describe(m, "p", &d), 0);
    assert_int_equal(d.state, FR_OBJ_PENDING);
    fr_meta_destroy(m);
}

/* Above the high watermark placement evicts first, even when there is room. */
static void test_eviction_watermark(void **state)
{
    (void)state;
    fr_meta *m = mk(0.5);
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * KiB, 0), 0);
    put(m, "a", 16 * KiB, NULL, 1, NULL);
    put(m, "b", 16 * KiB, NULL, 2, NULL);   /* exactly at the watermark */
    put(m, "c", 16 * KiB, NULL, 3, NULL);   /* would pass it: "a" goes */
    assert_int_equal(fr_meta_exist(m, "a"), 0);
    assert_int_equal(fr_meta_exist(m, "b"), 1);
    /* Hard-pinned data may push a segment past the watermark: above it
     * with nothing evictable, a fit is still a fit. */
    fr_replicate pin = { .hard_pin = true };
    put(m, "p1", 16 * KiB, &pin, 4, NULL);   /* evicts b, lands at 32 KiB */
    put(m, "p2", 16 * KiB, &pin, 5, NULL);   /* evicts c, lands at 32 KiB */
    put(m, "p3", 16 * KiB, &pin, 6, NULL);   /* nothing to evict, fits: 48 KiB */
    assert_int_equal(fr_meta_exist(m, "c"), 0);
    fr_seg_info si;
    assert_int_equal(fr_meta_seg_info(m, 1, &si), 0);
    assert_int_equal(si.used, 48 * KiB);
    fr_meta_destroy(m);
}

static void test_hard_pin_and_enospc(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * KiB, 0), 0);
    fr_replicate pin = { .hard_pin = true };
    put(m, "p1", 16 * KiB, &pin, 1, NULL);
    put(m, "p2", 16 * KiB, &pin, 2, NULL);
    put(m, "s1", 16 * KiB, NULL, 3, NULL);
    put(m, "big", 32 * KiB, NULL, 4, NULL);   /* s1 is evicted, never p1/p2 */
    assert_int_equal(fr_meta_exist(m, "s1"), 0);
    assert_int_equal(fr_meta_exist(m, "p1"), 1);
    assert_int_equal(fr_meta_exist(m, "p2"), 1);
    /* Pin everything: no soft object left, so a put fails plainly. */
    assert_int_equal(fr_meta_remove(m, "big", 5), 0);
    put(m, "p3", 32 * KiB, &pin, 6, NULL);
    assert_int_equal(fr_meta_put_start(m, "x", 1, NULL, 7, NULL), FERRY_ENOSPC);
    assert_true(errmsg_has(m, "no room"));
    assert_int_equal(fr_meta_exist(m, "p3"), 1);
    /* Larger than any segment: refused without evicting anything. */
    fr_meta_remove(m, "p3", 8);
    put(m, "s2", 16 * KiB, NULL, 9, NULL);
    assert_int_equal(fr_meta_put_start(m, "huge", 128 * KiB, NULL, 10, NULL), FERRY_ENOSPC);
    assert_int_equal(fr_meta_exist(m, "s2"), 1);
    fr_meta_destroy(m);
}

/* A placement that cannot succeed evicts nothing: leased objects (like
 * pinned and pending ones) stay where they are, so neither their bytes nor
 * the free runs they cut count as room that eviction could make. */
#define MiB (1024 * KiB)
static void test_eviction_futile(void **state)
{
    (void)state;
    fr_meta *m = mk(1.0);
    fr_obj_desc d;
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * MiB, 0), 0);
    put(m, "leased", 8 * MiB, NULL, 1, NULL);
    assert_int_equal(fr_meta_get(m, "leased", 1000, 2, &d), 0);   /* until 1002 */
    const char *soft[] = { "s0", "s1", "s2", "s3" };
    for (int i = 0; i < 4; i++)
        put(m, soft[i], 14 * MiB, NULL, 3 + (uint64_t)i, NULL);
    /* 64 MiB: room only if the leased object went too. */
    assert_int_equal(fr_meta_put_start(m, "big", 64 * MiB, NULL, 10, NULL), FERRY_ENOSPC);
    assert_true(errmsg_has(m, "no room"));
    for (int i = 0; i < 4; i++)
        assert_int_equal(fr_meta_exist(m, soft[i]), 1);
    assert_int_equal(fr_meta_exist(m, "leased"), 1);
    fr_seg_info si;
    assert_int_equal(fr_meta_seg_info(m, 1, &si), 0);
    assert_int_equal(si.used, 64 * MiB);
    assert_int_equal(si.objects, 5);
    /* Once the lease has ended, the same put evicts all five and fits. */
    put(m, "big", 64 * MiB, NULL, 1002, NULL);
    assert_int_equal(fr_meta_exist(m, "leased"), 0);
    assert_int_equal(fr_meta_exist(m, "s3"), 0);
    fr_meta_destroy(m);

    /* Enough bytes in all, but the leased object sits in the middle: the
     * largest run eviction could free is 32 KiB, so a 40 KiB put evicts
     * nothing; a 32 KiB one fits after evicting the LRU objects. */
    m = mk(1.0);
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * KiB, 0), 0);
    put(m, "a", 16 * KiB, NULL, 1, &d);
    assert_int_equal(d.rep[0].offset, 0);
    put(m, "b", 16 * KiB, NULL, 2, &d);
    assert_int_equal(d.rep[0].offset, 16 * KiB);
    put(m, "c", 32 * KiB, NULL, 3, &d);
    assert_int_equal(d.rep[0].offset, 32 * KiB);
    assert_int_equal(fr_meta_get(m, "b", 1000, 4, NULL), 0);
    assert_int_equal(fr_meta_put_start(m, "x", 40 * KiB, NULL, 5, NULL), FERRY_ENOSPC);
    assert_int_equal(fr_meta_exist(m, "a"), 1);
    assert_int_equal(fr_meta_exist(m, "c"), 1);
    put(m, "y", 32 * KiB, NULL, 6, &d);
    assert_int_equal(d.rep[0].offset, 32 * KiB);
    assert_int_equal(fr_meta_exist(m, "b"), 1);
    assert_int_equal(fr_meta_exist(m, "c"), 0);
    /* A hard-pinned object blocks the same way. */
    fr_meta_destroy(m);
    m = mk(1.0);
    fr_replicate pin = { .hard_pin = true };
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * KiB, 0), 0);
    put(m, "a", 16 * KiB, NULL, 1, NULL);
    put(m, "p", 16 * KiB, &pin, 2, NULL);
    put(m, "c", 32 * KiB, NULL, 3, NULL);
    assert_int_equal(fr_meta_put_start(m, "x", 40 * KiB, NULL, 5, NULL), FERRY_ENOSPC);
    assert_int_equal(fr_meta_exist(m, "a"), 1);
    assert_int_equal(fr_meta_exist(m, "c"), 1);
    fr_meta_destroy(m);

    /* Two replicas, and only one of two segments can make room: the put
     * fails without evicting on the segment that could have. */
    m = mk(1.0);
    fr_replicate two = { .replica_num = 2 };
    fr_replicate on1 = { .preferred = (uint64_t[]){ 1 }, .npreferred = 1 };
    fr_replicate on2 = { .preferred = (uint64_t[]){ 2 }, .npreferred = 1 };
    assert_int_equal(fr_meta_mount(m, 1, 1, 64 * KiB, 0), 0);
    assert_int_equal(fr_meta_mount(m, 2, 2, 64 * KiB, 0), 0);
    put(m, "soft1", 64 * KiB, &on1, 1, &d);
    assert_int_equal(d.rep[0].segment, 1);
    put(m, "held2", 64 * KiB, &on2, 2, &d);
    assert_int_equal(d.rep[0].segment, 2);
    assert_int_equal(fr_meta_get(m, "held2", 1000, 3, NULL), 0);
    assert_int_equal(fr_meta_put_start(m, "x", 32 * KiB, &two, 4, NULL), FERRY_ENOSPC);
    assert_true(errmsg_has(m, "only 1 of 2 segments"));
    assert_int_equal(fr_meta_exist(m, "soft1"), 1);
    /* One replica goes where eviction can make room. */
    put(m, "y", 32 * KiB, NULL, 5, &d);
    assert_int_equal(d.rep[0].segment, 1);
    assert_int_equal(fr_meta_exist(m, "soft1"), 0);
    assert_int_equal(fr_meta_exist(m, "held2"), 1);
    fr_meta_destroy(m);
}

/* ---- leases ------------------------------------------------------------- */

static void test_leases(void **state)
{
    (void)state;
    fr_meta *m = mk(1.0);
    fr_obj_desc d;
    fr_remove_counts rc;
    assert_int_equal(fr_meta_mount(m, 1, 1, 48 * KiB, 0), 0);
    put(m, "k/a", 16 * KiB, NULL, 0, NULL);
    put(m, "k/b", 16 * KiB, NULL, 0, NULL);
    put(m, "k/c", 16 * KiB, NULL, 0, NULL);
    assert_int_equal(fr_meta_get(m, "k/a", 1000, 100, &d), 0);
    assert_int_equal(d.lease_until, 1100);
    assert_int_equal(d.nrep, 1);
    /* A shorter lease never shortens the one held. */
    assert_int_equal(fr_meta_get(m, "k/a", 10, 200, &d), 0);
    assert_int_equal(d.lease_until, 1100);
    assert_int_equal(fr_meta_remove(m, "k/a", 500), FERRY_EBUSY);
    assert_true(errmsg_has(m, "leased"));
    /* Eviction passes over the leased object although it is the LRU one. */
    assert_int_equal(fr_meta_get(m, "k/b", 0, 300, NULL), 0);
    assert_int_equal(fr_meta_get(m, "k/c", 0, 300, NULL), 0);
    put(m, "other", 16 * KiB, NULL, 600, NULL);
    assert_int_equal(fr_meta_exist(m, "k/a"), 1);
    assert_int_equal(fr_meta_exist(m, "k/b"), 0);
    /* remove_prefix skips it and says so. */
    assert_int_equal(fr_meta_remove(m, "other", 700), 0);
    assert_int_equal(fr_meta_put_start(m, "k/pending", 1, NULL, 700, NULL), 0);
    assert_int_equal(fr_meta_remove_prefix(m, "k/", 800, &rc), 0);
    assert_int_equal(rc.removed, 1);          /* k/c */
    assert_int_equal(rc.skipped_leased, 1);   /* k/a */
    assert_int_equal(rc.skipped_pending, 1);
    /* Once the lease ends the object can go. */
    assert_int_equal(fr_meta_remove(m, "k/a", 1100), 0);
    assert_int_equal(fr_meta_remove(m, "k/a", 1100), FERRY_ENOENT);
    assert_int_equal(fr_meta_remove(m, "k/pending", 1100), FERRY_ESTATE);
    fr_meta_destroy(m);
}

/* ---- object states and listing -------------------------------------------- */

static void test_states_and_list(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    fr_keylist kl;
    fr_seg_info si;
    assert_int_equal(fr_meta_mount(m, 1, 1, 1 << 20, 0), 0);
    assert_int_equal(fr_meta_put_start(m, "w", 5000, NULL, 0, NULL), 0);
    assert_int_equal(fr_meta_get(m, "w", 10, 0, NULL), FERRY_ENOENT);   /* not visible yet */
    assert_true(errmsg_has(m, "still being written"));
    assert_int_equal(fr_meta_exist(m, "w"), 0);
    assert_int_equal(fr_meta_put_revoke(m, "w", 1), 0);
    assert_int_equal(fr_meta_seg_info(m, 1, &si), 0);
    assert_int_equal(si.used, 0);
    assert_int_equal(fr_meta_put_end(m, "w", 1), FERRY_ENOENT);
    static const char *keys[] = { "b/2", "a/1", "b/10", "b/1", "c" };
    for (int i = 0; i < 5; i++)
        put(m, keys[i], 10, NULL, 2, NULL);
    assert_int_equal(fr_meta_put_end(m, "c", 3), FERRY_ESTATE);
    assert_int_equal(fr_meta_put_revoke(m, "c", 3), FERRY_ESTATE);
    assert_int_equal(fr_meta_put_start(m, "b/pending", 10, NULL, 3, NULL), 0);
    assert_int_equal(fr_meta_list(m, "b/", NULL, 100, &kl), 0);
    assert_int_equal(kl.n, 3);
    assert_string_equal(kl.keys[0], "b/1");
    assert_string_equal(kl.keys[1], "b/10");
    assert_string_equal(kl.keys[2], "b/2");
    assert_false(kl.more);
    fr_free(kl.keys);
    assert_int_equal(fr_meta_list(m, "", "a/1", 2, &kl), 0);
    assert_int_equal(kl.n, 2);
    assert_string_equal(kl.keys[0], "b/1");
    assert_true(kl.more);
    fr_free(kl.keys);
    fr_meta_destroy(m);
}

/* ---- node death ------------------------------------------------------------ */

static void test_node_death(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    fr_obj_desc d;
    uint64_t lost;
    assert_int_equal(fr_meta_mount(m, 10, 1, 1 << 20, 0), 0);
    assert_int_equal(fr_meta_mount(m, 11, 1, 1 << 20, 0), 0);
    assert_int_equal(fr_meta_mount(m, 20, 2, 1 << 20, 0), 0);
    fr_replicate on1 = { .preferred = (uint64_t[]){ 10 }, .npreferred = 1 };
    fr_replicate both = { .replica_num = 2, .preferred = (uint64_t[]){ 11, 20 }, .npreferred = 2 };
    put(m, "only1", 100, &on1, 0, NULL);
    put(m, "both", 100, &both, 0, NULL);
    assert_int_equal(fr_meta_put_start(m, "writing", 100, &on1, 0, NULL), 0);
    assert_int_equal(fr_meta_get(m, "only1", 5000, 10, NULL), 0);   /* a lease does not save it */

    assert_int_equal(fr_meta_node_dead(m, 1, 1234, &lost), 0);
    assert_int_equal(lost, 2);
    assert_int_equal(fr_meta_node_dead(m, 1, 1235, &lost), FERRY_ENOENT);
    assert_int_equal(fr_meta_get(m, "only1", 0, 1300, &d), FERRY_ELOST);
    assert_true(errmsg_has(m, "lost"));
    assert_true(errmsg_has(m, "node 0000000000000001"));
    assert_true(errmsg_has(m, "s ago"));
    assert_int_equal(fr_meta_exist(m, "only1"), FERRY_ELOST);
    assert_int_equal(fr_meta_put_end(m, "writing", 1300), FERRY_ELOST);
    /* The surviving replica keeps "both" readable. */
    assert_int_equal(fr_meta_get(m, "both", 0, 1300, &d), 0);
    assert_int_equal(d.nrep, 1);
    assert_int_equal(d.rep[0].segment, 20);
    /* A lost key can be put again (it lands on a live segment) or removed. */
    assert_int_equal(fr_meta_put_start(m, "only1", 100, &on1, 1400, &d), 0);
    assert_int_equal(d.rep[0].segment, 20);
    assert_int_equal(fr_meta_put_end(m, "only1", 1400), 0);
    assert_int_equal(fr_meta_exist(m, "only1"), 1);
    assert_int_equal(fr_meta_remove(m, "writing", 1400), 0);
    /* Unmounting the last segment loses what lived only there. */
    assert_int_equal(fr_meta_unmount(m, 20, 1500, &lost), 0);
    assert_int_equal(lost, 2);
    assert_int_equal(fr_meta_unmount(m, 20, 1500, &lost), FERRY_ENOENT);
    assert_int_equal(fr_meta_exist(m, "both"), FERRY_ELOST);
    fr_meta_destroy(m);
}

/* ---- KV ---------------------------------------------------------------------- */

static void test_kv(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    fr_kv_view v;
    uint64_t rev;
    assert_int_equal(fr_meta_kv_put(m, "gen", "1", 1, &rev), 0);
    assert_int_equal(rev, 1);
    assert_int_equal(fr_meta_kv_put(m, "other", "x", 1, &rev), 0);
    assert_int_equal(rev, 2);
    assert_int_equal(fr_meta_kv_put(m, "gen", "2", 1, &rev), 0);
    assert_int_equal(rev, 3);
    assert_int_equal(fr_meta_kv_get(m, "gen", &v), 0);
    assert_int_equal(v.len, 1);
    assert_memory_equal(v.val, "2", 1);
    assert_int_equal(v.mod_rev, 3);
    assert_int_equal(v.create_rev, 1);
    assert_int_equal(v.version, 2);
    /* CAS: a stale revision loses and learns the current one. */
    assert_int_equal(fr_meta_kv_cas(m, "gen", 1, "3", 1, &rev), FERRY_ESTATE);
    assert_int_equal(rev, 3);
    assert_true(errmsg_has(m, "revision 3"));
    assert_int_equal(fr_meta_kv_cas(m, "gen", 0, "3", 1, &rev), FERRY_ESTATE);
    assert_int_equal(fr_meta_kv_cas(m, "gen", 3, "3", 1, &rev), 0);
    assert_int_equal(rev, 4);
    assert_int_equal(fr_meta_kv_cas(m, "new", 0, "", 0, &rev), 0);   /* create-only */
    assert_int_equal(rev, 5);
    assert_int_equal(fr_meta_kv_cas(m, "new", 0, "", 0, &rev), FERRY_ESTATE);
    assert_int_equal(fr_meta_kv_delete(m, "gen", 3, &rev), FERRY_ESTATE);
    assert_int_equal(fr_meta_kv_delete(m, "gen", 4, &rev), 0);
    assert_int_equal(rev, 6);
    assert_int_equal(fr_meta_kv_get(m, "gen", &v), FERRY_ENOENT);
    assert_int_equal(fr_meta_kv_delete(m, "gen", 0, &rev), FERRY_ENOENT);
    assert_int_equal(fr_meta_kv_revision(m), 6);
    assert_int_equal(fr_meta_kv_put(m, "big", "x", FR_VALUE_MAX + 1ull, &rev), FERRY_EINVAL);
    /* Recreated keys start a new life. */
    assert_int_equal(fr_meta_kv_put(m, "gen", "9", 1, &rev), 0);
    assert_int_equal(fr_meta_kv_get(m, "gen", &v), 0);
    assert_int_equal(v.create_rev, 7);
    assert_int_equal(v.version, 1);
    fr_meta_destroy(m);
}

static void test_watch(void **state)
{
    (void)state;
    fr_meta_config cfg;
    fr_meta *m;
    fr_kv_event ev[8];
    size_t n;
    uint64_t next, rev;
    fr_meta_config_default(&cfg);
    cfg.kv_history_events = 4;
    assert_int_equal(fr_meta_new(&cfg, &m), 0);
    assert_int_equal(fr_meta_kv_watch(m, "", 0, ev, 8, &n, &next), 0);
    assert_int_equal(n, 0);
    assert_int_equal(next, 1);
    fr_meta_kv_put(m, "a/1", "x", 1, &rev);     /* 1 */
    fr_meta_kv_put(m, "b/1", "y", 1, &rev);     /* 2 */
    fr_meta_kv_put(m, "a/2", "zz", 2, &rev);    /* 3 */
    fr_meta_kv_delete(m, "a/1", 0, &rev);       /* 4 */
    assert_int_equal(fr_meta_kv_watch(m, "a/", 1, ev, 8, &n, &next), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ev[0].rev, 1);
    assert_string_equal(ev[0].key, "a/1");
    assert_int_equal(ev[1].rev, 3);
    assert_memory_equal(ev[1].val, "zz", 2);
    assert_int_equal(ev[2].type, FR_KV_DELETE);
    assert_int_equal(next, 5);
    /* At most max: next_rev points at the first one left out. */
    assert_int_equal(fr_meta_kv_watch(m, "a/", 1, ev, 1, &n, &next), 0);
    assert_int_equal(n, 1);
    assert_int_equal(next, 3);
    assert_int_equal(fr_meta_kv_watch(m, "a/", next, ev, 8, &n, &next), 0);
    assert_int_equal(n, 2);
    assert_int_equal(next, 5);
    /* Future revisions: nothing yet, ask again from there. */
    assert_int_equal(fr_meta_kv_watch(m, "", 9, ev, 8, &n, &next), 0);
    assert_int_equal(n, 0);
    assert_int_equal(next, 9);
    /* The history is bounded: old revisions are compacted with a clear error. */
    for (int i = 0; i < 6; i++)
        fr_meta_kv_put(m, "c", "v", 1, &rev);    /* 5..10 */
    assert_int_equal(fr_meta_kv_watch(m, "", 1, ev, 8, &n, &next), FERRY_ERANGE);
    assert_true(errmsg_has(m, "compacted"));
    assert_true(errmsg_has(m, "starts at revision 7"));
    assert_int_equal(fr_meta_kv_watch(m, "", 6, ev, 8, &n, &next), FERRY_ERANGE);
    assert_int_equal(fr_meta_kv_watch(m, "", 7, ev, 8, &n, &next), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ev[0].rev, 7);
    assert_int_equal(next, 11);
    fr_meta_destroy(m);
}

/* ---- barriers ------------------------------------------------------------------ */

static void test_barrier(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    fr_barrier_state b;
    assert_int_equal(fr_meta_barrier_status(m, "step", &b), FERRY_ENOENT);
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r0", 3, &b), 0);
    assert_int_equal(b.generation, 0);
    assert_int_equal(b.arrived, 1);
    assert_false(b.released);
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r1", 3, &b), 0);
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r1", 3, &b), 0);   /* twice: no change */
    assert_int_equal(b.arrived, 2);
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r2", 4, &b), FERRY_EINVAL);
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r2", 3, &b), 0);
    assert_true(b.released);
    assert_int_equal(b.generation, 0);
    assert_int_equal(fr_meta_barrier_status(m, "step", &b), 0);
    assert_int_equal(b.generation, 1);     /* waiters of generation 0 are released */
    assert_int_equal(b.arrived, 0);
    /* Reuse: the next generation starts empty, even with another count. */
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r0", 2, &b), 0);
    assert_int_equal(b.generation, 1);
    assert_false(b.released);
    assert_int_equal(fr_meta_barrier_leave(m, "step", "r0"), 0);
    assert_int_equal(fr_meta_barrier_leave(m, "step", "r0"), FERRY_ENOENT);
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r5", 2, &b), 0);
    assert_int_equal(fr_meta_barrier_arrive(m, "step", "r6", 2, &b), 0);
    assert_true(b.released);
    assert_int_equal(b.generation, 1);
    assert_int_equal(fr_meta_barrier_status(m, "step", &b), 0);
    assert_int_equal(b.generation, 2);
    fr_meta_destroy(m);
}

/* ---- queues ---------------------------------------------------------------------- */

static void test_queue(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    fr_qrec_view v[8];
    size_t n;
    uint64_t id;
    fr_queue_stats st;
    fr_tick_result t;
    for (int i = 0; i < 3; i++) {
        char rec[16];
        snprintf(rec, sizeof(rec), "r%d", i);
        assert_int_equal(fr_meta_queue_push(m, "q", rec, strlen(rec), &id), 0);
        assert_int_equal(id, (uint64_t)i + 1);
    }
    assert_int_equal(fr_meta_queue_pop(m, "q", 2, 100, 0, v, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(v[0].id, 1);
    assert_memory_equal(v[0].data, "r0", 2);
    assert_int_equal(v[0].deliveries, 1);
    assert_int_equal(v[1].lease_until, 100);
    assert_int_equal(fr_meta_next_deadline(m), 100);
    assert_int_equal(fr_meta_tick(m, 99, &t), 0);
    assert_int_equal(t.redelivered, 0);
    /* The lease lapses: both come back, behind record 3. */
    assert_int_equal(fr_meta_tick(m, 100, &t), 0);
    assert_int_equal(t.redelivered, 2);
    assert_int_equal(fr_meta_next_deadline(m), UINT64_MAX);
    assert_int_equal(fr_meta_queue_pop(m, "q", 8, 50, 200, v, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(v[0].id, 3);
    assert_int_equal(v[0].deliveries, 1);
    assert_int_equal(v[1].id, 1);
    assert_int_equal(v[1].deliveries, 2);
    assert_int_equal(v[2].id, 2);
    /* Ack once; a consumer whose lease lapsed cannot ack the redelivery. */
    assert_int_equal(fr_meta_queue_ack(m, 1, 1), FERRY_ESTALE);
    assert_true(errmsg_has(m, "delivered"));
    assert_int_equal(fr_meta_queue_ack(m, 1, 2), 0);
    assert_int_equal(fr_meta_queue_ack(m, 1, 2), FERRY_ENOENT);
    /* nack: deliverable again at once. */
    assert_int_equal(fr_meta_queue_nack(m, 3, 1), 0);
    assert_int_equal(fr_meta_queue_nack(m, 3, 1), FERRY_ESTATE);
    assert_int_equal(fr_meta_queue_stats(m, "q", &st), 0);
    assert_int_equal(st.ready, 1);
    assert_int_equal(st.leased, 1);
    assert_int_equal(fr_meta_queue_pop(m, "q", 8, 50, 210, v, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].id, 3);
    assert_int_equal(v[0].deliveries, 2);
    assert_int_equal(fr_meta_queue_pop(m, "q", 8, 50, 210, v, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(fr_meta_queue_pop(m, "none", 8, 50, 210, v, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(fr_meta_queue_pop(m, "q", 0, 50, 210, v, &n), FERRY_EINVAL);
    assert_int_equal(fr_meta_queue_pop(m, "q", 1, 0, 210, v, &n), FERRY_EINVAL);
    fr_meta_destroy(m);
}

static void test_queue_bound(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    fr_qrec_view v[4];
    size_t n;
    uint64_t id;
    assert_int_equal(fr_meta_queue_config(m, "b", 2), 0);
    assert_int_equal(fr_meta_queue_push(m, "b", "1", 1, &id), 0);
    assert_int_equal(fr_meta_queue_push(m, "b", "2", 1, &id), 0);
    assert_int_equal(fr_meta_queue_push(m, "b", "3", 1, &id), FERRY_EAGAIN);
    assert_true(errmsg_has(m, "full"));
    /* Leased records still count: they are not done until acked. */
    assert_int_equal(fr_meta_queue_pop(m, "b", 1, 10, 0, v, &n), 0);
    assert_int_equal(fr_meta_queue_push(m, "b", "3", 1, &id), FERRY_EAGAIN);
    assert_int_equal(fr_meta_queue_ack(m, v[0].id, 0), 0);
    assert_int_equal(fr_meta_queue_push(m, "b", "3", 1, &id), 0);
    assert_int_equal(fr_meta_queue_config(m, "b", 0), 0);
    assert_int_equal(fr_meta_queue_push(m, "b", "4", 1, &id), 0);
    fr_meta_destroy(m);
}

static void test_pending_timeout(void **state)
{
    (void)state;
    fr_meta_config cfg;
    fr_meta *m;
    fr_tick_result t;
    fr_meta_config_default(&cfg);
    cfg.pending_timeout_ms = 1000;
    assert_int_equal(fr_meta_new(&cfg, &m), 0);
    assert_int_equal(fr_meta_mount(m, 1, 1, 1 << 20, 0), 0);
    assert_int_equal(fr_meta_put_start(m, "slow", 10, NULL, 100, NULL), 0);
    assert_int_equal(fr_meta_put_start(m, "done", 10, NULL, 200, NULL), 0);
    assert_int_equal(fr_meta_put_end(m, "done", 300), 0);
    assert_int_equal(fr_meta_next_deadline(m), 1100);
    assert_int_equal(fr_meta_tick(m, 1099, &t), 0);
    assert_int_equal(t.revoked, 0);
    assert_int_equal(fr_meta_tick(m, 1100, &t), 0);
    assert_int_equal(t.revoked, 1);
    assert_int_equal(fr_meta_put_end(m, "slow", 1200), FERRY_ENOENT);
    assert_int_equal(fr_meta_exist(m, "done"), 1);
    fr_meta_destroy(m);
}

/* ---- replay ------------------------------------------------------------------------ */

typedef struct { uint8_t *buf; size_t len, cap; size_t nrec; } rec_log;

static int log_sink(void *ctx, const uint8_t *rec, size_t len)
{
    rec_log *l = ctx;
    while (l->len + len + 4 > l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4096;
        l->buf = realloc(l->buf, l->cap);
    }
    memcpy(l->buf + l->len, &(uint32_t){ (uint32_t)len }, 4);
    memcpy(l->buf + l->len + 4, rec, len);
    l->len += len + 4;
    l->nrec++;
    return 0;
}

static void replay_into(fr_meta *m, const rec_log *l, bool snapshot)
{
    if (snapshot)
        assert_int_equal(fr_meta_load_begin(m), 0);
    for (size_t off = 0; off < l->len;) {
        uint32_t len;
        memcpy(&len, l->buf + off, 4);
        assert_int_equal(fr_meta_replay(m, l->buf + off + 4, len), 0);
        off += 4 + len;
    }
    assert_false(fr_meta_loading(m));
}

static void assert_same(fr_meta *a, fr_meta *b)
{
    fr_hash128_t x, y;
    assert_int_equal(fr_meta_digest(a, &x), 0);
    assert_int_equal(fr_meta_digest(b, &y), 0);
    assert_memory_equal(&x, &y, sizeof(x));
}

/* Replaying the records a meta emitted rebuilds the same state; so does
 * loading its snapshot; and both keep behaving the same afterwards. */
static void test_replay_equals_state(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        fr_meta *live = mk(0.9), *replayed = mk(0.9), *loaded = mk(0.9);
        rec_log log = { 0 }, snap = { 0 };
        uint64_t now = 0, now2;
        fr_meta_set_sink(live, log_sink, &log);
        rng_state = seed;
        workload(live, 3000, &now);
        assert_true(log.nrec > 100);
        replay_into(replayed, &log, false);
        assert_same(live, replayed);
        assert_int_equal(fr_meta_snapshot(live, log_sink, &snap), 0);
        replay_into(loaded, &snap, true);
        assert_same(live, loaded);
        /* Same commands from here on give the same states. */
        uint64_t st = rng_state;
        now2 = now;
        fr_meta_set_sink(live, NULL, NULL);
        workload(live, 1000, &now);
        rng_state = st;
        workload(loaded, 1000, &now2);
        assert_same(live, loaded);
        fr_meta_destroy(live);
        fr_meta_destroy(replayed);
        fr_meta_destroy(loaded);
        free(log.buf);
        free(snap.buf);
    }
}

/* Records that do not fit the state are refused and change nothing. */
static void test_replay_rejects(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    uint8_t buf[256];
    fr_hash128_t before, after;
    assert_int_equal(fr_meta_mount(m, 1, 1, 1 << 20, 0), 0);
    assert_int_equal(fr_meta_digest(m, &before), 0);
    fr_rec_rep rep = { 1, 0 };
    const fr_rec bad[] = {
        { .type = FR_REC_PUT_END, .key = { "nope", 4 } },
        { .type = FR_REC_PUT_START, .key = { "x", 1 }, .size = 10, .nrep = 1,
          .rep = { { 2, 0 } } },                                         /* no segment 2 */
        { .type = FR_REC_PUT_START, .key = { "x", 1 }, .size = 10, .nrep = 1,
          .rep = { { 1, 32 } } },                                        /* misaligned */
        { .type = FR_REC_PUT_START, .key = { "x", 1 }, .size = 10, .nrep = 2,
          .rep = { { 1, 0 }, { 1, 64 } } },                             /* same segment twice */
        { .type = FR_REC_Q_ACK, .id = 5 },
        { .type = FR_REC_Q_POP, .until = 1, .nids = 1, .ids = (uint64_t[]){ 1 } },
        { .type = FR_REC_SNAP_END, .count = 0 },                         /* not loading */
        { .type = FR_REC_SEG_MOUNT, .id = 1, .node = 1, .size = 4096, .granule = 64 },
        { .type = FR_REC_SEG_MOUNT, .id = 2, .node = 1, .size = 4096, .granule = 3 },
    };
    (void)rep;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int len = fr_rec_encode(&bad[i], buf, sizeof(buf));
        assert_true(len > 0);
        assert_int_equal(fr_meta_replay(m, buf, (size_t)len), FERRY_ECORRUPT);
        assert_true(strlen(fr_meta_errmsg(m)) > 10);
    }
    /* Malformed bytes: FERRY_EPROTO. */
    assert_int_equal(fr_meta_replay(m, (const uint8_t *)"\x05\x00\x01", 3), FERRY_EPROTO);
    assert_int_equal(fr_meta_digest(m, &after), 0);
    assert_memory_equal(&before, &after, sizeof(before));
    fr_meta_destroy(m);
}

/* Every record type encodes canonically and decodes to the same fields. */
static void test_rec_codec(void **state)
{
    (void)state;
    uint8_t buf[512], buf2[512];
    fr_rec r, d;
    memset(&r, 0, sizeof(r));
    r.type = FR_REC_PUT_START;
    r.key = (fr_span){ "obj", 3 };
    r.size = 1234;
    r.time = 99;
    r.flag = 1;
    r.nrep = 2;
    r.rep[0] = (fr_rec_rep){ 7, 4096 };
    r.rep[1] = (fr_rec_rep){ 9, 0 };
    int len = fr_rec_encode(&r, buf, sizeof(buf));
    assert_int_equal(len, (int)fr_rec_size(&r));
    assert_int_equal(fr_rec_decode(buf, (size_t)len, &d), 0);
    assert_int_equal(d.size, 1234);
    assert_int_equal(d.nrep, 2);
    assert_int_equal(d.rep[1].seg, 9);
    assert_memory_equal(d.key.p, "obj", 3);
    assert_int_equal(fr_rec_encode(&d, buf2, sizeof(buf2)), len);
    assert_memory_equal(buf, buf2, (size_t)len);
    /* Every prefix is refused, and so are trailing bytes. */
    for (int k = 0; k < len; k++)
        assert_int_equal(fr_rec_decode(buf, (size_t)k, &d), FERRY_EPROTO);
    assert_int_equal(fr_rec_decode(buf, (size_t)len + 1, &d), FERRY_EPROTO);
    /* Bad fields never encode. */
    r.flag = 2;
    assert_int_equal(fr_rec_encode(&r, buf, sizeof(buf)), FERRY_EINVAL);
    r.flag = 1;
    r.key = (fr_span){ "a\0b", 3 };
    assert_int_equal(fr_rec_encode(&r, buf, sizeof(buf)), FERRY_EINVAL);
    r.key = (fr_span){ "obj", 3 };
    assert_int_equal(fr_rec_encode(&r, buf, 10), FERRY_EMSGSIZE);
    uint64_t ids[3] = { 5, 6, 1ull << 60 };
    fr_rec p = { .type = FR_REC_Q_POP, .until = 77, .nids = 3, .ids = ids };
    len = fr_rec_encode(&p, buf, sizeof(buf));
    assert_int_equal(fr_rec_decode(buf, (size_t)len, &d), 0);
    assert_int_equal(fr_rec_id(&d, 2), 1ull << 60);
    assert_string_equal(fr_rec_type_name(FR_REC_Q_POP), "Q_POP");
    assert_string_equal(fr_rec_type_name(999), "?");
}

/* A failing sink stops every later mutation: the state may be ahead of the
 * log, so only a restart can make them agree again. */
static int failing_sink(void *ctx, const uint8_t *rec, size_t len)
{
    (void)ctx;
    (void)rec;
    (void)len;
    return FERRY_EIO;
}

static void test_sink_failure(void **state)
{
    (void)state;
    fr_meta *m = mk(0.95);
    uint64_t rev;
    fr_meta_set_sink(m, failing_sink, NULL);
    assert_int_equal(fr_meta_kv_put(m, "a", "1", 1, &rev), FERRY_EIO);
    fr_meta_set_sink(m, NULL, NULL);
    assert_int_equal(fr_meta_kv_put(m, "b", "1", 1, &rev), FERRY_EIO);
    assert_true(errmsg_has(m, "restart"));
    fr_meta_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement_preferred),
        cmocka_unit_test(test_placement_fallback),
        cmocka_unit_test(test_placement_slots),
        cmocka_unit_test(test_eviction_lru),
        cmocka_unit_test(test_eviction_watermark),
        cmocka_unit_test(test_hard_pin_and_enospc),
        cmocka_unit_test(test_eviction_futile),
        cmocka_unit_test(test_leases),
        cmocka_unit_test(test_states_and_list),
        cmocka_unit_test(test_node_death),
        cmocka_unit_test(test_kv),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_queue),
        cmocka_unit_test(test_queue_bound),
        cmocka_unit_test(test_pending_timeout),
        cmocka_unit_test(test_replay_equals_state),
        cmocka_unit_test(test_replay_rejects),
        cmocka_unit_test(test_rec_codec),
        cmocka_unit_test(test_sink_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
