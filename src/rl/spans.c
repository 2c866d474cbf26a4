/* The memory a rollout worker's shards live in, registered for remote
 * writes as few regions as it takes (gen_int.h, fr_rl_spans): shards whose
 * bytes touch or overlap share one region. An engine holds a bounded
 * number of regions (16,384 keys), and a worker of kimi-k2 in EP2 x TP4
 * holds about 35,000 shards: one region each does not fit, while shards
 * carved from a few large buffers (as a rollout engine's parameters are)
 * become a few regions. Only bytes a shard's own box covers are ever
 * written; a region adds no byte that is not some shard's. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "rl/gen_int.h"
#include "rl/rl_int.h"

typedef struct sp_ent { uint8_t *addr; uint64_t len; size_t shard; } sp_ent;

static int by_addr(const void *a, const void *b)
{
    const sp_ent *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static void release(fr_rl_spans *sp)
{
    for (size_t i = 0; i < sp->n && !sp->borrowed; i++)
        if (sp->reg && sp->reg[i])
            (void)ferry_region_unregister(sp->reg[i], NULL);
    free(sp->base), free(sp->len), free(sp->reg);
    sp->base = NULL, sp->len = NULL, sp->reg = NULL;
    sp->n = 0;
    sp->borrowed = false;
}

void fr_rl_spans_free(fr_rl_spans *sp)
{
    if (!sp)
        return;
    release(sp);
    free(sp->of);
    memset(sp, 0, sizeof *sp);
}

ferry_region *fr_rl_spans_region(const fr_rl_spans *sp, size_t shard)
{
    return sp && shard < sp->nshards && sp->of[shard] < sp->n ? sp->reg[sp->of[shard]] : NULL;
}

int fr_rl_spans_borrow(ferry_region *r, size_t n, fr_rl_spans *sp, ferry_error *err)
{
    size_t *of = malloc((n ? n : 1) * sizeof *of);
    if (!of)
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    if (!sp->borrowed || sp->n != 1 || sp->reg[0] != r) {
        release(sp);
        sp->reg = calloc(1, sizeof *sp->reg);
        if (!sp->reg) {
            free(of);
            return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
        }
        sp->reg[0] = r;
        sp->n = 1;
        sp->borrowed = true;
    }
    for (size_t i = 0; i < n; i++)
        of[i] = 0;
    free(sp->of);
    sp->of = of;
    sp->nshards = n;
    return 0;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25   /* Linux 6.1 */
#endif

/* Back the 2 MiB-aligned inside of a span with transparent huge pages
 * where the kernel allows: a same-host peer's push is a cross-memory
 * attach (process_vm_writev), which pins the target's pages a few at a
 * time; on 4 KiB pages it copied at 5.6 GB/s on the development VM, on
 * huge pages at 9.5 (memcpy's rate). MADV_COLLAPSE moves what is resident
 * now into huge pages (a copy, once, here at registration); MADV_HUGEPAGE
 * makes later faults take them. Advice only: memory that is not private
 * anonymous (a memfd, a file, shmem with THP off), a kernel without
 * either, or no free huge page leaves the span as it was. */
static void advise_huge(uint8_t *addr, uint64_t len)
{
    const uintptr_t huge = 2u << 20;
    uintptr_t a = ((uintptr_t)addr + huge - 1) & ~(huge - 1);
    uintptr_t e = ((uintptr_t)addr + len) & ~(huge - 1);
    if (e <= a)
        return;
    if (madvise((void *)a, e - a, MADV_HUGEPAGE) == 0)
        (void)madvise((void *)a, e - a, MADV_COLLAPSE);
}

void fr_rl_spans_advise(uint8_t *const *addr, const uint64_t *len, size_t n)
{
    sp_ent *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return;   /* advice only */
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (addr[i] && len[i])
            v[m++] = (sp_ent){ addr[i], len[i], i };
    qsort(v, m, sizeof *v, by_addr);
    for (size_t i = 0; i < m;) {
        uint8_t *b = v[i].addr, *end = b + v[i].len;
        for (i++; i < m && v[i].addr <= end; i++)
            if (v[i].addr + v[i].len > end)
                end = v[i].addr + v[i].len;
        advise_huge(b, (uint64_t)(end - b));
    }
    free(v);
}

int fr_rl_spans_register(ferry_engine *e, uint8_t *const *addr, const uint64_t *len, size_t n,
                         fr_rl_spans *sp, ferry_error *err)
{
    sp_ent *v = malloc((n ? n : 1) * sizeof *v);
    size_t *of = malloc((n ? n : 1) * sizeof *of);
    uint8_t **base = malloc((n ? n : 1) * sizeof *base);
    uint64_t *blen = malloc((n ? n : 1) * sizeof *blen);
    if (!v || !of || !base || !blen) {
        free(v), free(of), free(base), free(blen);
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    }
    size_t m = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        of[i] = SIZE_MAX;
        if (len[i])
            v[m++] = (sp_ent){ addr[i], len[i], i };
    }
    qsort(v, m, sizeof *v, by_addr);
    for (size_t i = 0; i < m; i++) {
        uint8_t *end = v[i].addr + v[i].len;
        if (nb && v[i].addr <= base[nb - 1] + blen[nb - 1]) {   /* touches the last span */
            if (end > base[nb - 1] + blen[nb - 1])
                blen[nb - 1] = (uint64_t)(end - base[nb - 1]);
        } else {
            base[nb] = v[i].addr;
            blen[nb++] = v[i].len;
        }
        of[v[i].shard] = nb - 1;
    }
    free(v);
    bool same = sp->reg && !sp->borrowed && nb == sp->n &&
                !memcmp(base, sp->base, nb * sizeof *base) &&
                !memcmp(blen, sp->len, nb * sizeof *blen);
    free(sp->of);
    sp->of = of;
    sp->nshards = n;
    if (same) {
        free(base), free(blen);
        return 0;
    }
    release(sp);
    sp->base = base;
    sp->len = blen;
    sp->reg = calloc(nb ? nb : 1, sizeof *sp->reg);
    if (!sp->reg)
        return fr_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    sp->n = nb;
    for (size_t i = 0; i < nb; i++) {
        advise_huge(base[i], blen[i]);
        int rc = ferry_region_register(e, base[i], (size_t)blen[i], FERRY_REMOTE_WRITE,
                                       FERRY_MEM_HOST, &sp->reg[i], err);
        if (rc < 0) {
            release(sp);
            return fr_fail(err, rc, "subscriber: cannot register %zu bytes of parameters "
                           "(span %zu of %zu): %s", (size_t)blen[i], i + 1, nb, err ? err->msg : "");
        }
    }
    return 0;
}
