/* libFuzzer target: the records of an elastic group's membership
 * (src/rl/members.c: the epoch record and the member list, read back from
 * the store's KV). Any input must give 0 or a negative code, never a crash
 * or a leak; an epoch record that parses must format and parse again to
 * the same epoch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rl/members_int.h"

#define FR_FUZZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

static void check_epoch(const char *d, size_t n)
{
    fr_epoch a, b;
    if (fr_epoch_parse(d, n, "0123456789abcdef", &a) != 0)
        return;
    char *text = NULL;
    size_t len = 0;
    FR_FUZZ_CHECK(fr_epoch_format(&a, &text, &len) == 0);
    FR_FUZZ_CHECK(fr_epoch_parse(text, len, "0123456789abcdef", &b) == 0);
    FR_FUZZ_CHECK(a.epoch == b.epoch && a.seq == b.seq && a.gen == b.gen && a.n == b.n &&
                  a.me == b.me);
    FR_FUZZ_CHECK(a.n == 0 || memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0);
    FR_FUZZ_CHECK(a.me == UINT32_MAX || strcmp(a.ids[a.me], "0123456789abcdef") == 0);
    free(text);
    fr_epoch_free(&a);
    fr_epoch_free(&b);
}

static void check_list(const char *d, size_t n)
{
    size_t cap = n / (FR_MEMBER_ID + 1), got = 0;
    char (*ids)[FR_MEMBER_ID + 1] = calloc(cap ? cap : 1, sizeof *ids);
    FR_FUZZ_CHECK(ids != NULL);
    if (fr_members_list_parse(d, n, ids, &got) == 0) {
        FR_FUZZ_CHECK(got == cap);
        for (size_t i = 0; i < got; i++)
            FR_FUZZ_CHECK(strlen(ids[i]) == FR_MEMBER_ID &&
                          memcmp(ids[i], d + i * (FR_MEMBER_ID + 1), FR_MEMBER_ID) == 0);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_epoch((const char *)data, size);
    check_list((const char *)data, size);
    return 0;
}
