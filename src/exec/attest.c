/* Attested plans: a plan bound to the digests of both placements, both
 * bindings and a generation, checked before any byte moves. */
#include <inttypes.h>
#include <string.h>

#include "base/base.h"
#include "exec/exec_int.h"
#include "reshard/reshard_int.h"

struct ferry_attested_plan {
    ferry_plan *plan;              /* referenced */
    uint8_t src_placement[16], dst_placement[16];
    uint8_t src_binding[16], dst_binding[16];
    uint64_t generation;
};

/* One side: generation, placement, then digest. */
static int check_side(const char *side, const ferry_binding *b, const uint8_t placement[16],
                      const uint8_t *binding_digest, uint64_t generation, ferry_error *err)
{
    char want[33], got[33];
    uint8_t d[16];

    if (memcmp(b->placement_digest, placement, 16) != 0) {
        ferry_digest_hex(placement, want);
        ferry_digest_hex(b->placement_digest, got);
        return fr_fail(err, FERRY_EINVAL, "%s binding (instance 0x%" PRIx64 ") belongs to placement %s,"
                       " the plan's %s placement is %s", side, b->instance, got, side, want);
    }
    if (b->generation != generation)
        return fr_fail(err, FERRY_ESTALE, "%s binding (instance 0x%" PRIx64 ") is at generation %" PRIu64
                       ", the plan is attested for generation %" PRIu64, side, b->instance,
                       b->generation, generation);
    if (binding_digest != NULL) {
        ferry_binding_digest(b, d);
        if (memcmp(d, binding_digest, 16) != 0) {
            ferry_digest_hex(binding_digest, want);
            ferry_digest_hex(d, got);
            return fr_fail(err, FERRY_ESTALE, "%s binding (instance 0x%" PRIx64 ") has digest %s,"
                           " the plan was attested with %s: the binding is stale", side, b->instance,
                           got, want);
        }
    }
    return 0;
}

int ferry_attest(ferry_plan *plan, const ferry_binding *src, const ferry_binding *dst,
                 uint64_t generation, ferry_attested_plan **out, ferry_error *err)
{
    ferry_plan_stats st;

    if (plan == NULL || src == NULL || dst == NULL || out == NULL)
        return fr_fail(err, FERRY_EINVAL, "attest: plan and both bindings are required");
    *out = NULL;
    int rc = ferry_plan_stats_get(plan, &st);
    if (rc < 0)
        return fr_fail(err, rc, "attest: %s", ferry_strerror(rc));
    rc = check_side("source", src, st.src_digest, NULL, generation, err);
    if (rc == 0)
        rc = check_side("target", dst, st.dst_digest, NULL, generation, err);
    if (rc < 0)
        return rc;
    ferry_attested_plan *a = fr_calloc(1, sizeof(*a));
    if (a == NULL)
        return fr_fail(err, FERRY_ENOMEM, "attest: out of memory");
    fr_plan_ref(plan);
    a->plan = plan;
    memcpy(a->src_placement, st.src_digest, 16);
    memcpy(a->dst_placement, st.dst_digest, 16);
    ferry_binding_digest(src, a->src_binding);
    ferry_binding_digest(dst, a->dst_binding);
    a->generation = generation;
    *out = a;
    return 0;
}

void ferry_attested_free(ferry_attested_plan *a)
{
    if (a == NULL)
        return;
    ferry_plan_free(a->plan);
    fr_free(a);
}

const ferry_plan *ferry_attested_plan_get(const ferry_attested_plan *a) { return a->plan; }
uint64_t ferry_attested_generation(const ferry_attested_plan *a) { return a->generation; }

int ferry_attested_check(const ferry_attested_plan *a, const ferry_binding *src,
                         const ferry_binding *dst, ferry_error *err)
{
    if (a == NULL)
        return fr_fail(err, FERRY_EINVAL, "check: no attested plan");
    int rc = 0;
    if (src != NULL)
        rc = check_side("source", src, a->src_placement, a->src_binding, a->generation, err);
    if (rc == 0 && dst != NULL)
        rc = check_side("target", dst, a->dst_placement, a->dst_binding, a->generation, err);
    return rc;
}
