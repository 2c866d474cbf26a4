/* libFuzzer target over the manifest JSON reader (manifests arrive in
 * files and in generation announcements). Whatever reads must write back
 * to text that reads to the same digest and writes the same text again;
 * small manifests are also planned against themselves (bounded by plan
 * limits) and every region and run of the plan is walked; anything else
 * aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/reshard.h"

#define FR_FUZZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

static void walk(const ferry_plan *p, int runs)
{
    ferry_plan_iter *it;
    FR_FUZZ_CHECK(ferry_plan_iter_open(p, NULL, &it) == 0);
    ferry_plan_stats st;
    ferry_plan_stats_get(p, &st);
    uint64_t n = 0, bytes = 0;
    int rc;
    if (runs) {
        ferry_run r;
        while ((rc = ferry_plan_iter_next_run(it, &r)) == 1) {
            n++;
            bytes += r.bytes;
        }
        FR_FUZZ_CHECK(n == st.runs);
    } else {
        ferry_region r;
        while ((rc = ferry_plan_iter_next_region(it, &r)) == 1) {
            n++;
            bytes += r.bytes;
        }
        FR_FUZZ_CHECK(n == st.regions);
    }
    FR_FUZZ_CHECK(rc == 0 && bytes == st.bytes);
    ferry_plan_iter_close(it);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ferry_manifest *m, *m2;
    ferry_error err;
    if (ferry_manifest_from_json((const char *)data, size, &m, &err) < 0) {
        FR_FUZZ_CHECK(err.code < 0 && memchr(err.msg, 0, sizeof err.msg));
        return 0;
    }
    char *text = ferry_manifest_to_json(m);
    FR_FUZZ_CHECK(text);
    FR_FUZZ_CHECK(ferry_manifest_from_json(text, strlen(text), &m2, &err) == 0);
    uint8_t a[16], b[16];
    FR_FUZZ_CHECK(ferry_manifest_digest(m, a) == 0 && ferry_manifest_digest(m2, b) == 0);
    FR_FUZZ_CHECK(memcmp(a, b, 16) == 0);
    char *text2 = ferry_manifest_to_json(m2);
    FR_FUZZ_CHECK(text2 && strcmp(text, text2) == 0);
    free(text);
    free(text2);
    for (uint64_t id = 0; id < ferry_manifest_fragment_count(m) && id < 4096; id++) {
        ferry_fragment f;
        FR_FUZZ_CHECK(ferry_manifest_fragment(m, id, &f) == 0);
        FR_FUZZ_CHECK(f.rank < ferry_manifest_rank_count(m));
    }
    if (ferry_manifest_fragment_count(m) <= 4096) {
        ferry_plan_options o = {.max_regions = 1 << 16, .max_overlaps = 1 << 16};
        ferry_plan *p;
        if (ferry_plan_create(m, m2, &o, &p, &err) == 0) {
            walk(p, 0);
            walk(p, 1);
            ferry_plan_free(p);
        }
    }
    ferry_manifest_close(m);
    ferry_manifest_close(m2);
    return 0;
}
