/* The update of an elastic rollout group member (weights.h, world 0;
 * docs/weights.md, "Elastic groups").
 *
 * The members are the ones registered in the store (members.c). Each
 * update finds or makes the epoch of the active generation that names
 * this member, runs the single-pull update (pull.c) at its position among
 * the epoch's members, under names of that update alone, and records that
 * it took part. When other members told the group they cannot take part
 * (a layout that conflicts with the generation's, an engine that fails),
 * nothing was written anywhere; the others then make the next epoch
 * without them and update in the same call. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "rl/members_int.h"
#include "rl/pull_int.h"

int fr_sub_elastic_update(ferry_subscriber *sub, fr_members *mem, uint64_t *generation,
                          ferry_update_stats *st, ferry_error *err)
{
    const ferry_subscriber_config *cfg = fr_sub_config(sub);
    ferry_store *s = fr_sub_store(sub);
    uint64_t tmo = cfg->timeout_ms;
    uint64_t deadline = fr_now_ns() + tmo * 1000000u, active = 0;
    int rc = fr_rl_active_read(s, cfg->model, &active, NULL, NULL);
    if (rc < 0)
        return fr_fail(err, rc, "no generation of %s is active (%s)", cfg->model,
                       ferry_strerror(rc));
    st->generation = *generation;
    /* A member that holds the active generation has nothing to take —
     * unless an update to it was made while its record said otherwise (it
     * opened holding it): the others wait for it there, so it takes part,
     * as if it held nothing (its parameters get the same bytes again). */
    uint64_t none = 0, *held = generation;
    if (active == *generation) {
        (void)fr_members_hold(mem, active);   /* so no later update of it waits for me */
        if (!fr_members_owes(mem, active))
            return 0;
        held = &none;
    }
    if ((rc = fr_members_ensure(mem, err)) < 0)
        return rc;
    for (;;) {
        fr_epoch ep;
        if ((rc = fr_members_epoch(mem, active, deadline, &ep, err)) < 0)
            return rc;
        fr_sub_round r = { .me = ep.me, .world = ep.n, .gen = ep.gen, .seq = ep.seq,
                           .epoch = ep.epoch };
        rc = fr_sub_round_run(sub, &r, held, st, err);
        if (!r.self_layout)   /* refused: it left the group at the exchange, no record */
            (void)fr_members_done(mem, rc == 0 ? *held : *generation, ep.seq);
        if (rc == 0)
            *generation = *held;
        fr_epoch_free(&ep);
        if (rc == 0)
            return 0;
        if (r.self_layout) {
            ferry_error why = err ? *err : (ferry_error){0};
            return fr_fail(err, rc, "subscriber: member %s of group %s refused at the "
                           "prepare of generation %" PRIu64 " (it left the group; nothing "
                           "was written): %s", fr_members_name(mem), cfg->group, active,
                           why.msg);
        }
        /* Another member's layout conflicts (it leaves the group) and
         * nothing was written: the next epoch goes without it, within the
         * same deadline. */
        if (!r.self_layout && fr_layout_conflict(r.others_code) && fr_now_ns() < deadline) {
            FR_INFO("rl", "elastic group %s: update %" PRIu64 " to generation %" PRIu64
                    " goes on without a member that cannot take part (%s)", cfg->group, r.seq,
                    active, err ? err->msg : "");
            if (err)
                memset(err, 0, sizeof *err);
            continue;
        }
        return rc;
    }
}
