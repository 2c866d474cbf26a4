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

/* ---- warm buffers (base.h) ---------------------------------------------- */

#include <pthread.h>
#include <sys/mman.h>

#define WARM_HDR 64                          /* keeps the block 64-byte aligned */
#define WARM_MIN ((size_t)256 << 10)         /* below: malloc's free lists are warm */
#define WARM_KEEP ((size_t)256 << 20)        /* kept, free, per process at most */
#define WARM_SLOTS 512                       /* an update frees one block per tensor and more */
#define WARM_GRAIN ((size_t)64 << 10)

#if !FR_ASAN
typedef struct warm_hdr {
    size_t cap;                              /* bytes after the header; 0: from malloc */
} warm_hdr;

static pthread_mutex_t warm_mu = PTHREAD_MUTEX_INITIALIZER;
static void *warm_kept[WARM_SLOTS];          /* oldest first */
static size_t warm_nkept, warm_bytes;

static void warm_unmap(void *h)
{
    (void)munmap(h, ((warm_hdr *)h)->cap + WARM_HDR);
}

#endif

void *fr_warm_alloc(size_t size)
{
#if FR_ASAN
    return fr_malloc(size);   /* the sanitizer sees every block */
#else
    if (!fr_size_ok(size) || size > PTRDIFF_MAX - WARM_HDR - WARM_GRAIN)
        return NULL;
    if (size < WARM_MIN) {
        warm_hdr *h = malloc(size + WARM_HDR);
        if (!h)
            return NULL;
        h->cap = 0;
        return (uint8_t *)h + WARM_HDR;
    }
    pthread_mutex_lock(&warm_mu);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < warm_nkept; i++) {   /* the smallest that fits, not far too big */
        size_t cap = ((warm_hdr *)warm_kept[i])->cap;
        if (cap >= size && cap / 2 <= size + WARM_GRAIN &&
            (best == SIZE_MAX || cap < ((warm_hdr *)warm_kept[best])->cap))
            best = i;
    }
    void *h = NULL;
    if (best != SIZE_MAX) {
        h = warm_kept[best];
        warm_bytes -= ((warm_hdr *)h)->cap;
        memmove(&warm_kept[best], &warm_kept[best + 1], (warm_nkept - best - 1) * sizeof h);
        warm_nkept--;
    }
    pthread_mutex_unlock(&warm_mu);
    if (h)
        return (uint8_t *)h + WARM_HDR;
    size_t len = (size + WARM_HDR + WARM_GRAIN - 1) / WARM_GRAIN * WARM_GRAIN;
    h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED)
        return NULL;
    ((warm_hdr *)h)->cap = len - WARM_HDR;
    return (uint8_t *)h + WARM_HDR;
#endif
}

void fr_warm_free(void *p)
{
#if FR_ASAN
    fr_free(p);
#else
    if (!p)
        return;
    warm_hdr *h = (warm_hdr *)((uint8_t *)p - WARM_HDR);
    if (h->cap == 0) {
        free(h);
        return;
    }
    void *drop[WARM_SLOTS + 1];
    size_t ndrop = 0;
    pthread_mutex_lock(&warm_mu);
    if (h->cap > WARM_KEEP) {
        drop[ndrop++] = h;
    } else {
        while (warm_nkept && (warm_nkept == WARM_SLOTS || warm_bytes + h->cap > WARM_KEEP)) {
            drop[ndrop++] = warm_kept[0];   /* the oldest goes */
            warm_bytes -= ((warm_hdr *)warm_kept[0])->cap;
            memmove(&warm_kept[0], &warm_kept[1], (warm_nkept - 1) * sizeof warm_kept[0]);
            warm_nkept--;
        }
        warm_kept[warm_nkept++] = h;
        warm_bytes += h->cap;
    }
    pthread_mutex_unlock(&warm_mu);
    for (size_t i = 0; i < ndrop; i++)
        warm_unmap(drop[i]);
#endif
}
