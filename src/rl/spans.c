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
            (void)ferry_region_unregister(sp->reg[i]);
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
        return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    if (!sp->borrowed || sp->n != 1 || sp->reg[0] != r) {
        release(sp);
        sp->reg = calloc(1, sizeof *sp->reg);
        if (!sp->reg) {
            free(of);
            return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
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

int fr_rl_spans_register(ferry_engine *e, uint8_t *const *addr, const uint64_t *len, size_t n,
                         fr_rl_spans *sp, ferry_error *err)
{
    sp_ent *v = malloc((n ? n : 1) * sizeof *v);
    size_t *of = malloc((n ? n : 1) * sizeof *of);
    uint8_t **base = malloc((n ? n : 1) * sizeof *base);
    uint64_t *blen = malloc((n ? n : 1) * sizeof *blen);
    if (!v || !of || !base || !blen) {
        free(v), free(of), free(base), free(blen);
        return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
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
        return fr_rl_fail(err, FERRY_ENOMEM, "subscriber: out of memory");
    sp->n = nb;
    for (size_t i = 0; i < nb; i++) {
        int rc = ferry_region_register(e, base[i], (size_t)blen[i], FERRY_REMOTE_WRITE,
                                       FERRY_MEM_HOST, &sp->reg[i]);
        if (rc < 0) {
            release(sp);
            return fr_rl_fail(err, rc, "subscriber: cannot register %zu bytes of parameters "
                              "(span %zu of %zu): %s", (size_t)blen[i], i + 1, nb,
                              ferry_strerror(rc));
        }
    }
    return 0;
}
