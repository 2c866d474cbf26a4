/* What a fixed group's update takes (pull.c, ferry_subscriber_update): the
 * members agree on it before anything else, so that a generation announced
 * between two members' calls cannot send one member home ("nothing new")
 * while another waits for it at the demand barrier until its timeout.
 *
 * Each call: every member meets at the group's agreement barrier (reusable:
 * its generation r numbers the call, the same for every member, also for
 * one that restarted), reads the announced generation, posts (that
 * generation, the one it holds) under r, and meets again; then every
 * member reads every proposal and takes the same decision: the target is
 * the newest generation any member saw, and the round runs when any member
 * holds less — every member moves to the target together, or none does. A
 * member that does not come makes the others fail at the barrier after
 * timeout_ms, with one message. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rl/keys.h"
#include "rl/pull_int.h"
#include "rl/rl_int.h"

static void proposal_key(char *out, size_t cap, const char *model, const char *scope, uint64_t r,
                         uint32_t member)
{
    (void)fr_key_agree(out, cap, model, scope, r, member);
}

int fr_sub_agree(ferry_store *s, const char *model, const char *scope, uint32_t me, uint32_t world,
                 uint64_t held, uint64_t timeout_ms, uint64_t *target, bool *need, ferry_error *err)
{
    char bar[FR_KEY_MAX], key[FR_KEY_MAX], member[32];
    snprintf(member, sizeof member, "worker %u", me);
    *target = 0;
    *need = false;
    uint64_t r = 0;
    (void)fr_key_agree_barrier(bar, sizeof bar, model, scope, "agree");
    int rc = ferry_barrier(s, bar, member, world, timeout_ms, &r, NULL);
    if (rc < 0)
        return fr_fail(err, rc, "subscriber: not every worker of group %s came to the update "
                       "within %" PRIu64 " ms: %s", scope, timeout_ms, ferry_strerror(rc));
    if (r > 1) {   /* every member is past call r - 1's reads: my proposal there can go */
        proposal_key(key, sizeof key, model, scope, r - 1, me);
        (void)ferry_kv_delete(s, key, 0, NULL, NULL);
    }
    uint64_t seen = 0;
    rc = fr_rl_active_read(s, model, &seen, NULL, NULL);
    if (rc < 0 && rc != FERRY_ENOENT)
        seen = 0;   /* cannot tell: the others' proposals decide, a failure shows at prepare */
    char val[48];
    snprintf(val, sizeof val, "%" PRIu64 " %" PRIu64, seen, held);
    proposal_key(key, sizeof key, model, scope, r, me);
    rc = ferry_kv_put(s, key, val, strlen(val), NULL, err);
    if (rc < 0)
        return fr_fail(err, rc, "subscriber: cannot post this worker's generation for group %s: "
                       "%s", scope, fr_why(err, rc));
    (void)fr_key_agree_barrier(bar, sizeof bar, model, scope, "agreed");
    rc = ferry_barrier(s, bar, member, world, timeout_ms, NULL, NULL);
    if (rc < 0)
        return fr_fail(err, rc, "subscriber: not every worker of group %s said which generation "
                       "it saw within %" PRIu64 " ms: %s", scope, timeout_ms, ferry_strerror(rc));
    char (*keys)[FR_KEY_MAX] = malloc((size_t)world * sizeof *keys);
    ferry_kv_value *v = calloc(world, sizeof *v);
    int *res = calloc(world, sizeof *res);
    if (!keys || !v || !res) {
        free(keys), free(v), free(res);
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    }
    for (uint32_t k = 0; k < world; k++)
        proposal_key(keys[k], sizeof keys[k], model, scope, r, k);
    (void)fr_rl_kv_get_all(s, keys, world, v, res);
    uint64_t newest = 0, least = UINT64_MAX;
    rc = 0;
    for (uint32_t k = 0; k < world; k++) {
        unsigned long long a = 0, h = 0;
        int krc = res[k];
        if (krc == 0 && (v[k].len >= sizeof val || sscanf(v[k].val, "%llu %llu", &a, &h) != 2))
            krc = FERRY_EPROTO;
        ferry_store_free(v[k].val);
        if (krc < 0 && rc == 0)
            rc = fr_fail(err, krc, "subscriber: worker %u of group %s left no readable "
                         "generation: %s", k, scope, ferry_strerror(krc));
        newest = a > newest ? a : newest;
        least = h < least ? h : least;
    }
    free(keys), free(v), free(res);
    if (rc < 0)
        return rc;
    *target = newest;
    *need = newest > least;
    return 0;
}
