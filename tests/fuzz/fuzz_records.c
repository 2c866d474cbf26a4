/* libFuzzer target: the rollout/update record decoders (samples.h). Any
 * input must give 0 or a negative code, never a crash or a leak; a record
 * that decodes must encode and decode again to the same canonical text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/samples.h"

static void check_rollout(const char *d, size_t n)
{
    ferry_rollout_session r;
    ferry_error err = {0};
    if (ferry_rollout_session_from_json(d, n, &r, &err) < 0)
        return;
    char *a = NULL, *b = NULL;
    ferry_rollout_session r2;
    if (ferry_rollout_session_to_json(&r, &a) != 0 ||
        ferry_rollout_session_from_json(a, strlen(a), &r2, &err) != 0)
        abort();
    if (ferry_rollout_session_to_json(&r2, &b) != 0 || strcmp(a, b) != 0)
        abort();
    free(a);
    free(b);
    ferry_rollout_session_clear(&r);
    ferry_rollout_session_clear(&r2);
}

static void check_update(const char *d, size_t n)
{
    ferry_update_session r;
    ferry_error err = {0};
    if (ferry_update_session_from_json(d, n, &r, &err) < 0)
        return;
    char *a = NULL, *b = NULL;
    ferry_update_session r2;
    if (ferry_update_session_to_json(&r, &a) != 0 ||
        ferry_update_session_from_json(a, strlen(a), &r2, &err) != 0)
        abort();
    if (ferry_update_session_to_json(&r2, &b) != 0 || strcmp(a, b) != 0)
        abort();
    free(a);
    free(b);
    ferry_update_session_clear(&r);
    ferry_update_session_clear(&r2);
}

static void check_policy(const char *d, size_t n)
{
    ferry_policy_version r;
    ferry_error err = {0};
    if (ferry_policy_version_from_json(d, n, &r, &err) < 0)
        return;
    char *a = NULL;
    ferry_policy_version r2;
    if (ferry_policy_version_to_json(&r, &a) != 0 ||
        ferry_policy_version_from_json(a, strlen(a), &r2, &err) != 0 || r2.version != r.version)
        abort();
    free(a);
    ferry_policy_version_clear(&r);
    ferry_policy_version_clear(&r2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *d = (const char *)data;
    check_rollout(d, size);
    check_update(d, size);
    check_policy(d, size);
    uint64_t v;
    char *z = malloc(size + 1);
    memcpy(z, data, size);
    z[size] = 0;
    (void)ferry_kvcache_ref_version(z, &v);
    free(z);
    return 0;
}
