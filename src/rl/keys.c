/* Every store key the rl layer writes (keys.h): the only file of the layer
 * that spells one. */
#include "rl/keys.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ferry/weights.h"

/* A failed key is "", which the store refuses: never a truncated key. */
static int refuse(char *buf, size_t cap, int code)
{
    if (buf && cap)
        buf[0] = '\0';
    return code;
}

static int __attribute__((format(printf, 3, 4))) fmt(char *buf, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(buf, cap, f, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap)
        return refuse(buf, cap, FERRY_EMSGSIZE);
    return n;
}

#define NAMES_OR_REFUSE(cond)                     \
    do {                                          \
        if (!buf || !(cond))                      \
            return refuse(buf, cap, FERRY_EINVAL); \
    } while (0)

/* ---- weights --------------------------------------------------------------------------- */

int fr_key_wk(char *buf, size_t cap, const char *model, uint64_t gen, const char *what)
{
    NAMES_OR_REFUSE(model && what);
    if (gen)
        return fmt(buf, cap, "ferry/wk/%s/%020" PRIu64 "/%s", model, gen, what);
    return fmt(buf, cap, "ferry/wk/%s/%s", model, what);
}

int fr_key_wk_part(char *buf, size_t cap, const char *model, uint64_t gen, int64_t rank)
{
    char what[32] = "part/";
    if (rank >= 0)
        snprintf(what, sizeof what, "part/%" PRIu32, (uint32_t)rank);
    return fr_key_wk(buf, cap, model, gen, what);
}

int fr_key_wk_delta(char *buf, size_t cap, const char *model, uint64_t gen, const char *stage,
                    int64_t rank)
{
    char what[64];
    if (rank >= 0)
        snprintf(what, sizeof what, "delta/%s/%" PRIu32, stage, (uint32_t)rank);
    else
        snprintf(what, sizeof what, "delta/%s", stage);
    return fr_key_wk(buf, cap, model, gen, what);
}

int fr_key_delta_part(char *buf, size_t cap, const char *model, uint64_t gen, uint32_t from,
                      uint32_t to)
{
    char what[48];
    snprintf(what, sizeof what, "dpart.%" PRIu32 ".%" PRIu32, from, to);
    return fr_key_gen_file(buf, cap, model, gen, what);
}

int ferry_weights_key(const char *model, uint64_t generation, const char *fragment, char *buf,
                      size_t cap)
{
    if (!model || !*model || strchr(model, '/') || !fragment || !*fragment || (!buf && cap))
        return FERRY_EINVAL;
    int n = snprintf(buf, cap, "ferry/w/%s/%020" PRIu64 "/%s", model, generation, fragment);
    if (n < 0 || (size_t)n >= cap)
        return refuse(buf, cap, FERRY_EMSGSIZE);
    return n;
}

int fr_key_gen_file(char *buf, size_t cap, const char *model, uint64_t gen, const char *what)
{
    int n = ferry_weights_key(model, gen, what, buf, cap);
    return n < 0 ? refuse(buf, cap, n) : n;
}

int fr_key_gen_object(char *buf, size_t cap, const char *model, uint64_t gen, uint32_t rank,
                      uint32_t object)
{
    char what[32];
    snprintf(what, sizeof what, "r%" PRIu32 ".%" PRIu32, rank, object);
    return fr_key_gen_file(buf, cap, model, gen, what);
}

int fr_key_gen_prefix(char *buf, size_t cap, const char *model, uint64_t gen)
{
    int n = fr_key_gen_file(buf, cap, model, gen, "x");
    if (n <= 0)
        return n;
    buf[n - 1] = '\0';   /* "ferry/w/M/G/" */
    return n - 1;
}

int fr_key_gens(char *buf, size_t cap, const char *model)
{
    NAMES_OR_REFUSE(model);
    return fmt(buf, cap, "ferry/w/%s/", model);
}

int fr_key_gen_past(char *buf, size_t cap, const char *model, uint64_t gen)
{
    NAMES_OR_REFUSE(model);
    return fmt(buf, cap, "ferry/w/%s/%020" PRIu64 "0", model, gen);
}

int fr_key_policy_history(char *buf, size_t cap, const char *model)
{
    NAMES_OR_REFUSE(model);
    return fmt(buf, cap, "ferry/pv/%s/history", model);
}

/* ---- subscribers ----------------------------------------------------------------------- */

int fr_key_sub_demand(char *buf, size_t cap, const char *model, const char *scope, uint64_t gen,
                      uint32_t member)
{
    NAMES_OR_REFUSE(model && scope);
    return fmt(buf, cap, "ferry/wk/%s/sub/%s/%020" PRIu64 "/%" PRIu32, model, scope, gen, member);
}

int fr_key_sub_barrier(char *buf, size_t cap, const char *model, const char *scope, uint64_t gen,
                       const char *what)
{
    NAMES_OR_REFUSE(model && scope && what);
    return fmt(buf, cap, "ferry/wb/%s/sub/%s/%020" PRIu64 "/%s", model, scope, gen, what);
}

int fr_key_agree_barrier(char *buf, size_t cap, const char *model, const char *scope,
                         const char *what)
{
    NAMES_OR_REFUSE(model && scope && what);
    return fmt(buf, cap, "ferry/wb/%s/sub/%s/%s", model, scope, what);
}

int fr_key_agree(char *buf, size_t cap, const char *model, const char *scope, uint64_t round,
                 uint32_t member)
{
    NAMES_OR_REFUSE(model && scope);
    return fmt(buf, cap, "ferry/wk/%s/sub/%s/agree/%020" PRIu64 "/%" PRIu32, model, scope, round,
               member);
}

int fr_key_early(char *buf, size_t cap, const char *model, const char *group, const char *what)
{
    NAMES_OR_REFUSE(model && group && what);
    return fmt(buf, cap, "ferry/wk/%s/sub/%s/early/%s", model, group, what);
}

/* ---- elastic membership ---------------------------------------------------------------- */

int fr_key_member(char *buf, size_t cap, const char *model, const char *group, const char *what,
                  const char *id)
{
    NAMES_OR_REFUSE(model && group && what);
    return fmt(buf, cap, "ferry/wg/%s/%s/%s%s", model, group, what, id ? id : "");
}

int fr_key_member_live(char *buf, size_t cap, const char *model, const char *group,
                       const char *id)
{
    NAMES_OR_REFUSE(model && group && id);
    return fmt(buf, cap, "ferry/wl/%s/%s/%s", model, group, id);
}

/* ---- the compat group ------------------------------------------------------------------ */

int fr_key_compat_rec(char *buf, size_t cap, const char *model, const char *group, uint32_t rank)
{
    NAMES_OR_REFUSE(model && group);
    return fmt(buf, cap, "ferry/wc/%s/%s/rec/%" PRIu32, model, group, rank);
}

int fr_key_compat_run(char *buf, size_t cap, const char *model, const char *group, uint64_t id,
                      const char *what)
{
    NAMES_OR_REFUSE(model && group && what);
    return fmt(buf, cap, "ferry/wc/%s/%s/%016" PRIx64 "/%s", model, group, id, what);
}

int fr_key_compat(char *buf, size_t cap, const char *model, const char *group, const char *what)
{
    NAMES_OR_REFUSE(model && group && what);
    return fmt(buf, cap, "ferry/wc/%s/%s/%s", model, group, what);
}

/* ---- sample queues and the KV cache ---------------------------------------------------- */

int fr_key_sample(char *buf, size_t cap, const char *queue, uint64_t version, uint64_t uid)
{
    NAMES_OR_REFUSE(queue);
    return fmt(buf, cap, "ferry/rl/%s/%020" PRIu64 "/%016" PRIx64, queue, version, uid);
}

int fr_key_samples(char *buf, size_t cap, const char *queue)
{
    NAMES_OR_REFUSE(queue);
    return fmt(buf, cap, "ferry/rl/%s/", queue);
}

int fr_key_claim(char *buf, size_t cap, const char *queue, uint64_t uid)
{
    NAMES_OR_REFUSE(queue);
    return fmt(buf, cap, "ferry/rl/%s/claim/%016" PRIx64, queue, uid);
}

int fr_key_claims(char *buf, size_t cap, const char *queue)
{
    NAMES_OR_REFUSE(queue);
    return fmt(buf, cap, "ferry/rl/%s/claim/", queue);
}

int fr_key_claims_mark(char *buf, size_t cap, const char *queue)
{
    NAMES_OR_REFUSE(queue);
    return fmt(buf, cap, "ferry/rl/%s/claim/end", queue);
}

int fr_key_kvcache(char *buf, size_t cap, const char *ns, uint64_t version)
{
    NAMES_OR_REFUSE(ns && ns[0] && !strchr(ns, '/'));
    return fmt(buf, cap, "ferry/kv/%s/%020" PRIu64 "/", ns, version);
}

int fr_key_kvcache_version(const char *key, uint64_t *version)
{
    static const char kv[] = "ferry/kv/";
    if (!key || !version || strncmp(key, kv, sizeof kv - 1) != 0)
        return FERRY_EINVAL;
    const char *p = strchr(key + sizeof kv - 1, '/');   /* after <ns> */
    if (!p || strlen(p + 1) < 21 || p[21] != '/')
        return FERRY_EINVAL;
    uint64_t v = 0;
    for (int i = 1; i <= 20; i++) {
        if (p[i] < '0' || p[i] > '9')
            return FERRY_EINVAL;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    *version = v;
    return 0;
}
