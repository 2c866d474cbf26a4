/* Open-addressing hash maps: linear probing, power-of-two capacity, load at
 * most 3/4, deletion by backward shift (no tombstones, so probe lengths do
 * not grow with churn). */
#include <string.h>

#include "store/store_int.h"

#define MIN_CAP 16

/* ---- string keys ---------------------------------------------------- */

uint64_t fr_smap_hash(const char *key)
{
    return fr_hash64(key, strlen(key), 0x66657272796b6579ull);
}

void fr_smap_init(fr_smap *m)
{
    m->s = NULL;
    m->cap = m->n = 0;
}

void fr_smap_fini(fr_smap *m)
{
    fr_free(m->s);
    fr_smap_init(m);
}

/* Capacity (a power of two, load <= 3/4) for n + extra items, starting
 * from cap (MIN_CAP when 0); FERRY_ENOMEM when it cannot be addressed. */
static int grown_cap(size_t n, size_t extra, size_t cap, size_t slot, size_t *out)
{
    size_t need = n + extra;
    if (need < n)
        return FERRY_ENOMEM;
    if (cap == 0)
        cap = MIN_CAP;
    while (need > cap / 4 * 3) {
        if (cap > SIZE_MAX / 2 / slot)
            return FERRY_ENOMEM;
        cap *= 2;
    }
    *out = cap;
    return 0;
}

static void sput(fr_sslot *s, size_t cap, uint64_t h, const char *key, void *item)
{
    size_t i = (size_t)h & (cap - 1);
    while (s[i].item != NULL)
        i = (i + 1) & (cap - 1);
    s[i].h = h;
    s[i].key = key;
    s[i].item = item;
}

int fr_smap_reserve(fr_smap *m, size_t extra)
{
    size_t cap;
    int rc = grown_cap(m->n, extra, m->cap, sizeof(fr_sslot), &cap);
    if (rc < 0)
        return rc;
    if (cap == m->cap)
        return 0;
    fr_sslot *s = fr_calloc(cap, sizeof(*s));
    if (s == NULL)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->s[i].item != NULL)
            sput(s, cap, m->s[i].h, m->s[i].key, m->s[i].item);
    fr_free(m->s);
    m->s = s;
    m->cap = cap;
    return 0;
}

static size_t sfind(const fr_smap *m, const char *key, uint64_t h)
{
    if (m->cap == 0)
        return SIZE_MAX;
    size_t i = (size_t)h & (m->cap - 1);
    while (m->s[i].item != NULL) {
        if (m->s[i].h == h && strcmp(m->s[i].key, key) == 0)
            return i;
        i = (i + 1) & (m->cap - 1);
    }
    return SIZE_MAX;
}

void *fr_smap_get(const fr_smap *m, const char *key, uint64_t h)
{
    size_t i = sfind(m, key, h);
    return i == SIZE_MAX ? NULL : m->s[i].item;
}

int fr_smap_put(fr_smap *m, const char *key, uint64_t h, void *item)
{
    int rc = fr_smap_reserve(m, 1);
    if (rc < 0)
        return rc;
    sput(m->s, m->cap, h, key, item);
    m->n++;
    return 0;
}

void *fr_smap_del(fr_smap *m, const char *key, uint64_t h)
{
    size_t i = sfind(m, key, h), mask = m->cap - 1;
    if (i == SIZE_MAX)
        return NULL;
    void *item = m->s[i].item;
    /* Backward shift: pull later members of the cluster into the hole when
     * their home slot is not cyclically within (hole, j]. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->s[j].item == NULL)
            break;
        size_t home = (size_t)m->s[j].h & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].item = NULL;
    m->n--;
    return item;
}

void *fr_smap_next(const fr_smap *m, size_t *pos)
{
    while (*pos < m->cap) {
        void *item = m->s[(*pos)++].item;
        if (item != NULL)
            return item;
    }
    return NULL;
}

/* ---- u64 keys ------------------------------------------------------- */

static size_t uhome(uint64_t key, size_t cap)
{
    /* murmur3 finaliser: ids are sequential, so spread them. */
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

void fr_umap_init(fr_umap *m)
{
    m->s = NULL;
    m->cap = m->n = 0;
}

void fr_umap_fini(fr_umap *m)
{
    fr_free(m->s);
    fr_umap_init(m);
}

static void uput(fr_uslot *s, size_t cap, uint64_t key, void *item)
{
    size_t i = uhome(key, cap);
    while (s[i].item != NULL)
        i = (i + 1) & (cap - 1);
    s[i].key = key;
    s[i].item = item;
}

int fr_umap_reserve(fr_umap *m, size_t extra)
{
    size_t cap;
    int rc = grown_cap(m->n, extra, m->cap, sizeof(fr_uslot), &cap);
    if (rc < 0)
        return rc;
    if (cap == m->cap)
        return 0;
    fr_uslot *s = fr_calloc(cap, sizeof(*s));
    if (s == NULL)
        return FERRY_ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->s[i].item != NULL)
            uput(s, cap, m->s[i].key, m->s[i].item);
    fr_free(m->s);
    m->s = s;
    m->cap = cap;
    return 0;
}

static size_t ufind(const fr_umap *m, uint64_t key)
{
    if (m->cap == 0)
        return SIZE_MAX;
    size_t i = uhome(key, m->cap);
    while (m->s[i].item != NULL) {
        if (m->s[i].key == key)
            return i;
        i = (i + 1) & (m->cap - 1);
    }
    return SIZE_MAX;
}

void *fr_umap_get(const fr_umap *m, uint64_t key)
{
    size_t i = ufind(m, key);
    return i == SIZE_MAX ? NULL : m->s[i].item;
}

int fr_umap_put(fr_umap *m, uint64_t key, void *item)
{
    int rc = fr_umap_reserve(m, 1);
    if (rc < 0)
        return rc;
    uput(m->s, m->cap, key, item);
    m->n++;
    return 0;
}

void *fr_umap_del(fr_umap *m, uint64_t key)
{
    size_t i = ufind(m, key), mask = m->cap - 1;
    if (i == SIZE_MAX)
        return NULL;
    void *item = m->s[i].item;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->s[j].item == NULL)
            break;
        size_t home = uhome(m->s[j].key, m->cap);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].item = NULL;
    m->n--;
    return item;
}

void *fr_umap_next(const fr_umap *m, size_t *pos)
{
    while (*pos < m->cap) {
        void *item = m->s[(*pos)++].item;
        if (item != NULL)
            return item;
    }
    return NULL;
}
