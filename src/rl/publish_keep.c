/* What the coordinator does after announcing a generation (publish.c):
 * retention of the last `keep` announced generations, and the sweep of
 * generations that were never announced (docs/weights.md, "Failures and
 * cleanup").
 *
 * The sweep's rule: once G is announced, no generation older than G that
 * is not announced yet can ever be (announcing needs an active generation
 * older than itself, and the active key only moves forward by compare-and-
 * swap), so whatever such a generation left — objects of ranks that died,
 * of a coordinator that died before anyone could decide, of an attempt
 * still running that will be refused — is removed. Announced generations
 * are the history's plus the one active before G (its coordinator may have
 * died before adding it to the history). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "rl/publish_int.h"

#define GENS_MAX 256   /* generations the history lists at most */

/* Remove every KV key of generation g (its parts, manifest, probe, status). */
static void drop_keys(ferry_store *s, const ferry_publisher_config *c, uint64_t g)
{
    static const char *const what[] = { "manifest", "probe", "status" };
    char k[FR_KEY_MAX];
    for (size_t i = 0; i < sizeof what / sizeof what[0]; i++) {
        fr_key_wk(k, sizeof k, c->model, g, what[i]);
        (void)ferry_kv_delete(s, k, 0, NULL, NULL);
    }
    for (uint32_t r = 0; r < c->world; r++) {
        (void)fr_key_wk_part(k, sizeof k, c->model, g, r);
        (void)ferry_kv_delete(s, k, 0, NULL, NULL);
    }
    /* a delta publish's words (delta_publish.c); a generation published
     * dense by ferry_publish_shards has none: its decision key is absent,
     * and the 3 x world deletes of stage words are not sent (a delta
     * attempt that failed before deciding leaves its stage words to that
     * rank's next delta publish, which replaces them) */
    (void)fr_key_wk_delta(k, sizeof k, c->model, g, "decision", -1);
    if (ferry_kv_delete(s, k, 0, NULL, NULL) == FERRY_ENOENT)
        return;
    for (uint32_t r = 0; r < c->world; r++) {
        static const char *const stage[] = { "count", "exact", "stored" };
        for (size_t i = 0; i < 3; i++) {
            (void)fr_key_wk_delta(k, sizeof k, c->model, g, stage[i], r);
            (void)ferry_kv_delete(s, k, 0, NULL, NULL);
        }
    }
}

/* Remove generation g's objects; true when none is left (leased ones stay). */
static bool drop_objects(ferry_store *s, const char *model, uint64_t g)
{
    if (!fr_sgen_drop_objects(s, model, g))   /* a sparse generation's objects (gen_sparse.c) */
        return false;
    char prefix[FR_KEY_MAX];
    if (fr_key_gen_prefix(prefix, sizeof prefix, model, g) <= 0)
        return false;
    (void)ferry_store_remove_prefix(s, prefix, NULL, NULL);
    char **ks = NULL;
    size_t nk = 0;
    bool gone = ferry_store_list(s, prefix, NULL, 1, &ks, &nk, NULL, NULL) == 0 && nk == 0;
    ferry_store_free(ks);
    return gone;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool listed(const uint64_t *gens, size_t n, uint64_t g)
{
    return bsearch(&g, gens, n, sizeof *gens, cmp_u64) != NULL;
}

/* Generations older than gen with objects stored and not in keep[0..nkeep):
 * their objects and keys go. One listing per stored generation: each skips
 * past the last one's keys ("<G>0" sorts right after every "<G>/..."). */
static void sweep(ferry_store *s, const ferry_publisher_config *c, uint64_t gen,
                  const uint64_t *keep, size_t nkeep, ferry_publish_stats *st)
{
    char prefix[FR_KEY_MAX], after[FR_KEY_MAX] = "";
    int kl = fr_key_gens(prefix, sizeof prefix, c->model);
    if (kl <= 0)
        return;
    for (int round = 0; round < 4096; round++) {
        char **ks = NULL;
        size_t nk = 0;
        if (ferry_store_list(s, prefix, after[0] ? after : NULL, 1, &ks, &nk, NULL, NULL) < 0 || nk == 0) {
            ferry_store_free(ks);
            return;
        }
        const char *k = ks[0] + kl, *slash = strchr(k, '/');
        char *end = NULL;
        uint64_t g = strtoull(k, &end, 10);
        if (!slash || end != slash || slash - k != 20) {
            snprintf(after, sizeof after, "%s", ks[0]);   /* not a generation's object */
            ferry_store_free(ks);
            continue;
        }
        ferry_store_free(ks);
        if (g >= gen)
            return;
        if (!listed(keep, nkeep, g)) {
            (void)drop_objects(s, c->model, g);
            drop_keys(s, c, g);
            st->swept_generations++;
        }
        (void)fr_key_gen_past(after, sizeof after, c->model, g);
    }
}

/* The announced generations the history lists (at most GENS_MAX, in its
 * order) into gens; the history key's revision (0: none) into *rev.
 * FERRY_ENOENT (or the read's failure) when there is none to read. */
static int read_history(ferry_store *s, const ferry_publisher_config *c, char *hk, size_t hkcap,
                        uint64_t *gens, size_t *ng, uint64_t *rev)
{
    fr_key_wk(hk, hkcap, c->model, 0, "history");
    ferry_kv_value h = {0};
    *ng = 0;
    *rev = 0;
    int rc = ferry_kv_get(s, hk, &h, NULL);
    if (rc < 0)
        return rc;
    *rev = h.mod_rev;
    for (char *p = h.val; *p && *ng < GENS_MAX;) {
        char *e;
        uint64_t g = strtoull(p, &e, 10);
        if (e == p)
            break;
        gens[(*ng)++] = g;
        p = e;
    }
    ferry_store_free(h.val);
    return 0;
}

void fr_rl_keep(ferry_store *s, const ferry_publisher_config *c, uint64_t gen, uint64_t prev,
                ferry_publish_stats *st)
{
    char hk[FR_KEY_MAX];
    uint64_t hrev = 0, gens[GENS_MAX + 2];
    size_t ng = 0;
    (void)read_history(s, c, hk, sizeof hk, gens, &ng, &hrev);
    if (prev)
        gens[ng++] = prev;
    gens[ng++] = gen;
    qsort(gens, ng, sizeof *gens, cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < ng; i++)
        if (u == 0 || gens[u - 1] != gens[i])
            gens[u++] = gens[i];
    ng = u;
    /* Retention: keep the last `keep` announced generations. */
    uint32_t keep = c->keep;
    uint64_t kept[GENS_MAX + 2];
    size_t nkept = 0;
    for (size_t i = 0; i < ng; i++) {
        if (i + keep < ng && drop_objects(s, c->model, gens[i])) {
            drop_keys(s, c, gens[i]);
            st->removed_generations++;
            continue;
        }
        /* Leased objects stay: keep the generation listed until a later
         * publish removes the rest. */
        kept[nkept++] = gens[i];
    }
    char *nh = malloc(nkept * 21 + 1);
    if (nh) {
        size_t n = 0;
        nh[0] = '\0';
        for (size_t i = 0; i < nkept; i++)
            n += (size_t)sprintf(nh + n, "%s%" PRIu64, n ? " " : "", kept[i]);
        (void)ferry_kv_cas(s, hk, hrev, nh, n, NULL, NULL);
        free(nh);
    }
    /* Whatever the retired generations left is theirs to lose too. */
    sweep(s, c, gen, gens, ng, st);
}

bool fr_rl_reclaim(ferry_store *s, const ferry_publisher_config *c)
{
    char hk[FR_KEY_MAX];
    uint64_t gens[GENS_MAX], rev = 0;
    size_t ng = 0;
    if (read_history(s, c, hk, sizeof hk, gens, &ng, &rev) < 0)
        return false;
    qsort(gens, ng, sizeof *gens, cmp_u64);
    /* The coordinator's next retention drops the keys and the listing of
     * what is gone; only the objects matter for space. */
    bool leased = false;
    size_t keep = c->keep ? c->keep : 1;   /* never the active one */
    for (size_t i = 0; i + keep < ng; i++)
        leased |= !drop_objects(s, c->model, gens[i]);
    return leased;
}
