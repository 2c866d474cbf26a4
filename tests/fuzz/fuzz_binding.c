/* libFuzzer target for the runtime binding JSON reader (exec layer). The
 * input is the JSON text, read against a fixed placement (a 6x4 f32 tensor in
 * two row blocks). Whatever is accepted must write back to JSON that reads
 * again to the same digest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/exec.h"

#define FR_FUZZ_CHECK(cond) do { if (!(cond)) abort(); } while (0)

static ferry_manifest *placement(void)
{
    static ferry_manifest *m;
    if (m)
        return m;
    ferry_error err = {0};
    ferry_tensor_desc t = {.name = "w", .dtype = "f32", .itemsize = 4, .ndim = 2, .shape = {6, 4}};
    ferry_split s = {.tensor = 0, .whole = true, .parts = {2, 1}, .rank_stride = {1, 0}};
    FR_FUZZ_CHECK(ferry_manifest_create(2, NULL, 8, &m) == 0);
    FR_FUZZ_CHECK(ferry_manifest_add_tensor(m, &t, &err) == 0);
    FR_FUZZ_CHECK(ferry_manifest_add_split(m, &s, &err) == 0);
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ferry_manifest *m = placement();
    ferry_binding *b = NULL;
    ferry_error err = {0};
    if (ferry_binding_from_json((const char *)data, size, m, &b, &err) != 0) {
        FR_FUZZ_CHECK(b == NULL);
        return 0;
    }
    char *text = ferry_binding_to_json(b);
    if (text) {
        ferry_binding *b2 = NULL;
        FR_FUZZ_CHECK(ferry_binding_from_json(text, strlen(text), m, &b2, &err) == 0);
        uint8_t d1[16], d2[16];
        ferry_binding_digest(b, d1);
        ferry_binding_digest(b2, d2);
        FR_FUZZ_CHECK(memcmp(d1, d2, 16) == 0);
        ferry_binding_free(b2);
        free(text);
    }
    ferry_binding_free(b);
    return 0;
}
