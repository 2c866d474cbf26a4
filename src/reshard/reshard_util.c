/* reshard helpers: error messages, dims formatting, a string -> index
 * map, dtype sizes. */
#include <stdio.h>
#include <string.h>

#include "reshard/reshard_int.h"

/* ---- errors and formatting ---------------------------------------------- */

const char *fr_fmt_dims(char *buf, size_t cap, const uint64_t *v, uint32_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (uint32_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%llu", i ? "," : "", (unsigned long long)v[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
    return buf;
}

/* ---- string map --------------------------------------------------------- */

void fr_strmap_free(fr_strmap *m)
{
    fr_free(m->slot);
    memset(m, 0, sizeof *m);
}

int64_t fr_strmap_find(const fr_strmap *m, const char *key, fr_strmap_key_fn fn, const void *ctx)
{
    if (!m->cap)
        return -1;
    size_t mask = m->cap - 1;
    for (size_t i = fr_hash64(key, strlen(key), 0) & mask;; i = (i + 1) & mask) {
        uint32_t s = m->slot[i];
        if (!s)
            return -1;
        if (!strcmp(fn(ctx, s - 1), key))
            return s - 1;
    }
}

int fr_strmap_insert(fr_strmap *m, const char *key, uint32_t idx, fr_strmap_key_fn fn, const void *ctx)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        uint32_t *ns = fr_calloc(ncap, sizeof *ns);
        if (!ns)
            return FERRY_ENOMEM;
        for (size_t i = 0; i < m->cap; i++) {
            uint32_t s = m->slot[i];
            if (!s)
                continue;
            const char *k = fn(ctx, s - 1);
            size_t j = fr_hash64(k, strlen(k), 0) & (ncap - 1);
            while (ns[j])
                j = (j + 1) & (ncap - 1);
            ns[j] = s;
        }
        fr_free(m->slot);
        m->slot = ns;
        m->cap = ncap;
    }
    size_t mask = m->cap - 1;
    size_t i = fr_hash64(key, strlen(key), 0) & mask;
    while (m->slot[i])
        i = (i + 1) & mask;
    m->slot[i] = idx + 1;
    m->n++;
    return 0;
}
