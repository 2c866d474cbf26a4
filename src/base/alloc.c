/* Allocation wrappers: NULL on failure, never abort, sizes overflow-checked. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* No object may exceed PTRDIFF_MAX (glibc refuses such requests anyway);
 * checking first also keeps sanitizer allocators, which abort instead of
 * returning NULL on absurd sizes, on the documented NULL path. */
static bool fr_size_ok(size_t size)
{
    return size <= PTRDIFF_MAX;
}

/* Zero-byte requests get one byte so NULL always means "out of memory". */
void *fr_malloc(size_t size)
{
    if (!fr_size_ok(size))
        return NULL;
    return malloc(size != 0 ? size : 1);
}

void *fr_calloc(size_t n, size_t size)
{
    size_t bytes;

    if (__builtin_mul_overflow(n, size, &bytes) || !fr_size_ok(bytes))
        return NULL;
    if (bytes == 0)
        return calloc(1, 1);
    return calloc(n, size);
}

/* realloc(p, 0) frees p in glibc and returns NULL, which reads as failure
 * while p is gone; keep p alive instead. */
void *fr_realloc(void *p, size_t size)
{
    if (!fr_size_ok(size))
        return NULL;
    return realloc(p, size != 0 ? size : 1);
}

void *fr_reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;

    if (__builtin_mul_overflow(n, size, &bytes))
        return NULL;
    return fr_realloc(p, bytes);
}

char *fr_strdup(const char *s)
{
    if (s == NULL)
        return NULL;
    size_t len = strlen(s) + 1;
    char *d = malloc(len);
    if (d != NULL)
        memcpy(d, s, len);
    return d;
}

void fr_free(void *p)
{
    free(p);
}

/* Doubling keeps repeated appends amortised O(1); when doubling would
 * overflow, fall back to exactly what is needed. */
static size_t fr_grow_target(size_t cap, size_t need, size_t esz)
{
    size_t target = cap < 8 ? 8 : cap;

    while (target < need && target <= SIZE_MAX / 2)
        target *= 2;
    if (target < need || target > SIZE_MAX / esz)
        target = need;
    return target;
}

int fr_grow(void **v, size_t *cap, size_t need, size_t esz)
{
    size_t bytes;

    if (v == NULL || cap == NULL || esz == 0)
        return FERRY_EINVAL;
    if (need <= *cap)
        return 0;
    if (__builtin_mul_overflow(need, esz, &bytes))
        return FERRY_ERANGE;
    size_t target = fr_grow_target(*cap, need, esz);
    void *p = fr_reallocarray(*v, target, esz);
    if (p == NULL)
        return FERRY_ENOMEM;
    *v = p;
    *cap = target;
    return 0;
}
