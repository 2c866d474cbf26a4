/* Element sizes of the dtype names every layer shares (common.h). */
#include <string.h>

#include "base/base.h"

static const struct { const char *name; uint32_t size; } dtypes[] = {
    {"bool", 1}, {"u8", 1}, {"i8", 1}, {"f8e4m3", 1}, {"f8e5m2", 1},
    {"fp8_e4m3", 1}, {"fp8_e5m2", 1},   /* the earlier spellings, kept as aliases */
    {"f16", 2}, {"bf16", 2}, {"i16", 2}, {"u16", 2},
    {"f32", 4}, {"i32", 4}, {"u32", 4},
    {"f64", 8}, {"i64", 8}, {"u64", 8},
};

uint32_t ferry_dtype_size(const char *dtype)
{
    if (!dtype)
        return 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, dtype))
            return dtypes[i].size;
    return 0;
}
