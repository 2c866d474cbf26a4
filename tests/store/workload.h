/* A reproducible random mix of every metadata command, for the store
 * tests: errors included (a refused command must log nothing). Header-only
 * so each test binary gets its own copy. */
#ifndef FT_STORE_WORKLOAD_H
#define FT_STORE_WORKLOAD_H

#include <stdio.h>
#include <string.h>

#include "store/store_int.h"

#ifndef KiB
#define KiB 1024ull
#endif

static uint64_t rng_state;
static inline uint64_t rnd(void)   /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A random mix of every command, errors included (they must log nothing). */
static inline void workload(fr_meta *m, int ops, uint64_t *now)
{
    char key[32], val[64];
    fr_qrec_view v[4];
    size_t n;
    uint64_t rev, id;
    fr_barrier_state b;
    for (int i = 0; i < ops; i++, *now += 1 + rnd() % 5) {
        snprintf(key, sizeof(key), "k%u", (unsigned)(rnd() % 40));
        snprintf(val, sizeof(val), "v%llu", (unsigned long long)rnd());
        switch (rnd() % 16) {
        case 0:
            fr_meta_mount(m, rnd() % 6, rnd() % 3, 64 * KiB + rnd() % 4096, 0);
            break;
        case 1:
            if (rnd() % 8 == 0)
                fr_meta_node_dead(m, rnd() % 3, *now, NULL);
            break;
        case 2:
        case 3: {
            uint64_t pref[2] = { rnd() % 6, rnd() % 6 };
            fr_replicate rc = { .replica_num = 1 + (uint32_t)(rnd() % 2), .preferred = pref,
                                .npreferred = (uint32_t)(rnd() % 3), .hard_pin = rnd() % 5 == 0 };
            fr_meta_put_start(m, key, rnd() % (20 * KiB), &rc, *now, NULL);
            break;
        }
        case 4:
            fr_meta_put_end(m, key, *now);
            break;
        case 5:
            fr_meta_get(m, key, rnd() % 50, *now, NULL);
            break;
        case 6:
            if (rnd() % 2)
                fr_meta_remove(m, key, *now);
            else
                fr_meta_put_revoke(m, key, *now);
            break;
        case 7:
            fr_meta_kv_put(m, key, val, strlen(val), &rev);
            break;
        case 8:
            fr_meta_kv_cas(m, key, rnd() % 20, val, strlen(val), &rev);
            break;
        case 9:
            fr_meta_kv_delete(m, key, 0, &rev);
            break;
        case 10:
            fr_meta_barrier_arrive(m, rnd() % 2 ? "b1" : "b2", key, 3, &b);
            break;
        case 11:
            fr_meta_queue_push(m, rnd() % 2 ? "q1" : "q2", val, strlen(val), &id);
            break;
        case 12:
            fr_meta_queue_pop(m, rnd() % 2 ? "q1" : "q2", 1 + rnd() % 4, 1 + rnd() % 30, *now, v, &n);
            break;
        case 13:
            if (rnd() % 2)
                fr_meta_queue_ack(m, 1 + rnd() % 60, 0);
            else
                fr_meta_queue_nack(m, 1 + rnd() % 60, 0);
            break;
        case 14:
            fr_meta_tick(m, *now, NULL);
            break;
        default:
            if (rnd() % 10 == 0) {
                fr_remove_counts rc;
                fr_meta_remove_prefix(m, "k1", *now, &rc);
            } else {
                fr_meta_queue_config(m, "q2", rnd() % 8);
            }
            break;
        }
    }
}


#endif
