/* rl internals: the membership of an elastic rollout group (members.c),
 * kept in the store (docs/weights.md, "Elastic groups").
 *
 * Under prefix P = "ferry/wg/<model>/<group>/" the KV space holds
 *  - P "list": the registered members' ids, one a line, in join order;
 *  - P "m/<id>": one member's state, "<generation> <seq> <name>": the
 *    generation it holds and the last update (seq) it took part in;
 *  - P "epoch": the update now running or last run, "<epoch> <seq>
 *    <generation> <n>" then n ids: its members, in the order that makes
 *    their positions. seq counts updates; epoch changes only when the
 *    member set does (the plan cache keys on it).
 * Liveness is the master's: every member parks an arrival at its own
 * barrier "ferry/wl/<model>/<group>/<id>" (count 2) from a thread, again
 * whenever it is released or times out; a connection that closes has its
 * arrivals withdrawn by the master at once. A probe arrives there as
 * "probe": a live member releases it at once, a dead one lets it time out
 * (the master's clock). */
#ifndef FR_RL_MEMBERS_INT_H
#define FR_RL_MEMBERS_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/weights.h"

#define FR_MEMBER_ID 16                 /* hex digits of a member id */

typedef struct fr_members fr_members;

/* The update a member takes part in: its epoch, update number (seq),
 * generation, members (ids[n]) and this member's position. */
typedef struct fr_epoch {
    uint64_t epoch, seq, gen;
    uint32_t n, me;
    char (*ids)[FR_MEMBER_ID + 1];
} fr_epoch;

/* Register under model/group as name (NULL or "": HOST:PID), holding
 * generation 0, and start the liveness thread. probe_ms: how long a probe
 * waits for a member before it is judged dead. */
int fr_members_join(ferry_store *s, const char *model, const char *group, const char *name,
                    uint64_t probe_ms, fr_members **out, ferry_error *err);
/* Withdraw the registration (best effort) and stop the thread. NULL ok. */
void fr_members_leave(fr_members *m);
const char *fr_members_name(const fr_members *m);
/* Registered again if a probe judged this member gone (or it withdrew). */
int fr_members_ensure(fr_members *m, ferry_error *err);
/* Out of the group (the thread stays: ensure registers it again). */
int fr_members_withdraw(fr_members *m);
/* The update to generation gen this member takes part in: the epoch
 * record when it names this member and this member has not taken part in
 * it yet; else, once the update in it is over (every member of it took
 * part or is gone; the dead are probed and dropped), a new one: the live
 * registered members that do not hold gen, this one included. Waits up
 * to deadline_ns (CLOCK_MONOTONIC): FERRY_ETIMEDOUT naming the update
 * waited for. ep: fr_epoch_free. */
int fr_members_epoch(fr_members *m, uint64_t gen, uint64_t deadline_ns, fr_epoch *ep,
                     ferry_error *err);
/* Whether the update to gen now running names this member, which has not
 * taken part in it, and others of it are still at it (they wait for it). */
bool fr_members_owes(fr_members *m, uint64_t gen);
/* This member took part in update seq and now holds generation gen. */
int fr_members_done(fr_members *m, uint64_t gen, uint64_t seq);
/* This member holds gen (a call that found it current): the record says so. */
int fr_members_hold(fr_members *m, uint64_t gen);
void fr_epoch_free(fr_epoch *ep);

/* The records' codecs (pure; tests/fuzz/fuzz_members.c). An epoch record
 * is "<epoch> <seq> <gen> <n>\n" and n lines of 16 lowercase hex digits;
 * parse: 0, FERRY_EPROTO (anything else), FERRY_ENOMEM; ep->me is the
 * position of id me (UINT32_MAX: absent, or me NULL). format: *out
 * malloc'd (free), *len its bytes. The list is n such lines: ids has room
 * for len / 17 of them. */
int fr_epoch_parse(const char *text, size_t len, const char *me, fr_epoch *ep);
int fr_epoch_format(const fr_epoch *ep, char **out, size_t *len);
int fr_members_list_parse(const char *text, size_t len, char (*ids)[FR_MEMBER_ID + 1], size_t *n);

#endif
