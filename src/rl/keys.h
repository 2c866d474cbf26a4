/* Every store key the rl layer writes, formatted here and nowhere else
 * (keys.c); docs/weights.md, "Keys", lists the layout. The layout is
 * a contract between processes and versions of ferry: a key built here is
 * byte-for-byte the key an older build wrote.
 *
 * Every builder writes into buf (cap bytes) and returns the key's length,
 * or a negative code and buf holding "" (when cap > 0): FERRY_EINVAL for a
 * missing name, FERRY_EMSGSIZE when the key would not fit. A key is never
 * truncated, and the empty string is a key the store refuses, so a caller
 * that ignores the code fails at the store instead of touching another key.
 *
 * Names: M a model, S a subscriber scope (its group, or "<group>/compat<k>"),
 * Gr a group, Q a sample queue, NS a KV-cache namespace. G is a generation
 * (20 decimal digits), uid, id and a round 16 hex digits. */
#ifndef FR_RL_KEYS_H
#define FR_RL_KEYS_H

#include <stddef.h>
#include <stdint.h>

/* The longest model, group, queue or scope name a key holds (the configs
 * hold 127 bytes and a NUL; a compat scope is a group plus "/compat<k>"). */
#define FR_KEY_NAME_MAX 127
/* Bytes of a buffer that holds any key below, names of FR_KEY_NAME_MAX
 * bytes included, with its NUL (the longest, an agreement proposal, takes
 * 9 + 127 + 5 + 127 + 7 + 20 + 1 + 10 = 306). */
#define FR_KEY_MAX 400
/* A sample's payload key ("ferry/rl/Q/<20>/<16>"), which its references
 * ("store://<key>#<member>") must hold within FERRY_RECORD_REF_MAX. */
#define FR_KEY_SAMPLE_MAX (9 + FR_KEY_NAME_MAX + 1 + 20 + 1 + 16 + 1)

/* ---- weights (publish*.c, gen*.c, weights_read.c, policy.c) ---------------------------- */

/* KV "ferry/wk/M/G/<what>", or "ferry/wk/M/<what>" for gen 0 (active,
 * history): a generation's manifest text, probe, status, parts barrier. */
int fr_key_wk(char *buf, size_t cap, const char *model, uint64_t gen, const char *what);
/* KV "ferry/wk/M/G/part/<rank>": a publishing rank's part of an attempt;
 * rank -1: the prefix "ferry/wk/M/G/part/" of every rank's. */
int fr_key_wk_part(char *buf, size_t cap, const char *model, uint64_t gen, int64_t rank);
/* KV "ferry/wk/M/G/delta/<stage>/<rank>": a rank's word at one stage of a
 * delta publish (count, stored); rank -1: "ferry/wk/M/G/delta/<stage>",
 * the stage's barrier (and the decision's key, stage "decision"). */
int fr_key_wk_delta(char *buf, size_t cap, const char *model, uint64_t gen, const char *stage,
                    int64_t rank);
/* Object "ferry/w/M/G/dpart.<from>.<to>": the changed elements rank
 * `from` hands to owner `to` in a delta publish. */
int fr_key_delta_part(char *buf, size_t cap, const char *model, uint64_t gen, uint32_t from,
                      uint32_t to);
/* Object "ferry/w/M/G/<what>" (ferry_weights_key, which checks the names). */
int fr_key_gen_file(char *buf, size_t cap, const char *model, uint64_t gen, const char *what);
/* Object "ferry/w/M/G/r<rank>.<object>": rank's packed fragments. */
int fr_key_gen_object(char *buf, size_t cap, const char *model, uint64_t gen, uint32_t rank,
                      uint32_t object);
/* Prefix "ferry/w/M/G/" of a generation's objects (names checked as by
 * ferry_weights_key), and "ferry/w/M/" of every generation's. */
int fr_key_gen_prefix(char *buf, size_t cap, const char *model, uint64_t gen);
int fr_key_gens(char *buf, size_t cap, const char *model);
/* "ferry/w/M/<G>0": sorts right after every object key of generation gen
 * (a listing's `after` to skip past them). */
int fr_key_gen_past(char *buf, size_t cap, const char *model, uint64_t gen);
/* KV "ferry/pv/M/history": the policy versions announced. */
int fr_key_policy_history(char *buf, size_t cap, const char *model);

/* ---- subscribers (pull*.c) ----------------------------------------------------------- */

/* KV "ferry/wk/M/sub/S/G/<member>": a member's demand for generation gen. */
int fr_key_sub_demand(char *buf, size_t cap, const char *model, const char *scope, uint64_t gen,
                      uint32_t member);
/* Barrier "ferry/wb/M/sub/S/G/<what>" (demand, applied). */
int fr_key_sub_barrier(char *buf, size_t cap, const char *model, const char *scope, uint64_t gen,
                       const char *what);
/* Barrier "ferry/wb/M/sub/S/<what>" (agree, agreed). */
int fr_key_agree_barrier(char *buf, size_t cap, const char *model, const char *scope,
                         const char *what);
/* KV "ferry/wk/M/sub/S/agree/<round, 20 digits>/<member>": a proposal. */
int fr_key_agree(char *buf, size_t cap, const char *model, const char *scope, uint64_t round,
                 uint32_t member);
/* KV "ferry/wk/M/sub/Gr/early/<what>": an overlapped round's outcome or verdict. */
int fr_key_early(char *buf, size_t cap, const char *model, const char *group, const char *what);

/* ---- elastic membership (members.c) ------------------------------------------------ */

/* KV "ferry/wg/M/Gr/<what><id>" (id may be NULL): the member list
 * ("list"), a member's record ("m/", id), the epoch ("epoch"); with what ""
 * and no id, the prefix of them all. */
int fr_key_member(char *buf, size_t cap, const char *model, const char *group, const char *what,
                  const char *id);
/* Barrier "ferry/wl/M/Gr/<id>": a member's liveness. */
int fr_key_member_live(char *buf, size_t cap, const char *model, const char *group,
                       const char *id);

/* ---- the compat group (compat.c) -------------------------------------------------- */

/* KV "ferry/wc/M/Gr/rec/<rank>": a worker's record. */
int fr_key_compat_rec(char *buf, size_t cap, const char *model, const char *group, uint32_t rank);
/* "ferry/wc/M/Gr/<id, 16 hex>/<what>": an attempt's abort cause (KV) or done barrier. */
int fr_key_compat_run(char *buf, size_t cap, const char *model, const char *group, uint64_t id,
                      const char *what);
/* Barrier "ferry/wc/M/Gr/<what>" (prepared). */
int fr_key_compat(char *buf, size_t cap, const char *model, const char *group, const char *what);

/* ---- sample queues (sampleq*.c) and the KV cache ---------------------------------- */

/* Object "ferry/rl/Q/<version, 20 digits>/<uid, 16 hex>": a sample's payload. */
int fr_key_sample(char *buf, size_t cap, const char *queue, uint64_t version, uint64_t uid);
/* "ferry/rl/Q/": every payload (and claim) of the queue. */
int fr_key_samples(char *buf, size_t cap, const char *queue);
/* KV "ferry/rl/Q/claim/<uid, 16 hex>": which delivery trains the sample. */
int fr_key_claim(char *buf, size_t cap, const char *queue, uint64_t uid);
/* "ferry/rl/Q/claim/": every claim of the queue. */
int fr_key_claims(char *buf, size_t cap, const char *queue);
/* KV "ferry/rl/Q/claim/end": the marker ferry_sample_claims_mark puts. */
int fr_key_claims_mark(char *buf, size_t cap, const char *queue);
/* Object prefix "ferry/kv/NS/<version, 20 digits>/" of the KV cache; ns
 * must be non-empty and hold no '/' (FERRY_EINVAL). */
int fr_key_kvcache(char *buf, size_t cap, const char *ns, uint64_t version);
/* The version of a KV-cache key ("ferry/kv/NS/<20 digits>/<name>"): 0, or
 * FERRY_EINVAL for anything else. */
int fr_key_kvcache_version(const char *key, uint64_t *version);

#endif
