/* Barriers: named, counted, generation-numbered so a name can be reused. */
#include <stdlib.h>
#include <string.h>

#include "store/meta_int.h"

/* ---- barriers -------------------------------------------------------------- */

static barrier *bar_find(const fr_meta *m, const char *name)
{
    return fr_smap_get(&m->bars, name, fr_smap_hash(name));
}

/* Index of member in b->members, or where it would go (*found false). */
static size_t bar_search(const barrier *b, const char *member, bool *found)
{
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(b->members[mid], member);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static void bar_clear(barrier *b)
{
    for (size_t i = 0; i < b->n; i++)
        fr_free(b->members[i]);
    b->n = 0;
    b->count = 0;
}

static int bar_create(fr_meta *m, const char *name, barrier **out)
{
    size_t len = strlen(name);
    barrier *b = fr_calloc(1, sizeof(*b) + len + 1);
    if (b == NULL || fr_smap_reserve(&m->bars, 1) < 0) {
        fr_free(b);
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    }
    b->key = (char *)(b + 1);
    memcpy(b->key, name, len + 1);
    b->hash = fr_smap_hash(b->key);
    fr_smap_put(&m->bars, b->key, b->hash, b);
    *out = b;
    return 0;
}

/* Add member to b's current generation (count must match); release the
 * generation when it is full. */
static int bar_add(fr_meta *m, barrier *b, fr_span member, uint64_t count, bool may_release)
{
    char mem[FR_KEY_MAX + 1];
    bool found;
    meta_cstr(mem, member);
    if (count == 0 || count > FR_BARRIER_MAX || (b->n > 0 && b->count != count))
        return meta_fail(m, FERRY_EINVAL, "barrier '%s' counts %u members, not %llu", b->key,
                         b->count, (unsigned long long)count);
    size_t at = bar_search(b, mem, &found);
    if (found)
        return meta_fail(m, FERRY_EEXIST, "member '%s' already waits at barrier '%s'", mem, b->key);
    if (!may_release && b->n + 1 >= count)
        return meta_fail(m, FERRY_EINVAL, "barrier '%s' would be complete", b->key);
    char *copy = fr_strdup(mem);
    if (copy == NULL || fr_grow((void **)&b->members, &b->cap, b->n + 1, sizeof(char *)) < 0) {
        fr_free(copy);
        return meta_fail(m, FERRY_ENOMEM, "out of memory");
    }
    memmove(b->members + at + 1, b->members + at, (b->n - at) * sizeof(char *));
    b->members[at] = copy;
    b->n++;
    b->count = (uint32_t)count;
    m->bar_last = (fr_barrier_state){ b->gen, (uint32_t)b->n, b->count, false };
    if (b->n == b->count) {
        bar_clear(b);
        b->gen++;
        m->bar_last.released = true;
    }
    return 0;
}

int meta_bar_apply(fr_meta *m, const fr_rec *r)
{
    char name[FR_KEY_MAX + 1], mem[FR_KEY_MAX + 1];
    bool found;
    meta_cstr(name, r->key);
    barrier *b = bar_find(m, name);
    int rc;
    switch (r->type) {
    case FR_REC_SNAP_BAR:
        if (b != NULL || r->count > FR_BARRIER_MAX)
            return meta_fail(m, FERRY_EINVAL, "barrier '%s' twice or too large", name);
        if ((rc = bar_create(m, name, &b)) < 0)
            return rc;
        b->count = (uint32_t)r->count;
        b->gen = r->seq;
        return 0;
    case FR_REC_SNAP_BAR_MEMBER:
        if (b == NULL)
            return meta_fail(m, FERRY_ENOENT, "no barrier '%s'", name);
        return bar_add(m, b, r->val, b->count, false);
    case FR_REC_BAR_ARRIVE:
        if (b != NULL)
            return bar_add(m, b, r->val, r->count, true);
        if (r->count == 0 || r->count > FR_BARRIER_MAX)
            return meta_fail(m, FERRY_EINVAL, "barrier count %llu", (unsigned long long)r->count);
        if ((rc = bar_create(m, name, &b)) < 0)
            return rc;
        if ((rc = bar_add(m, b, r->val, r->count, true)) < 0) {
            fr_smap_del(&m->bars, b->key, b->hash);   /* as if never created */
            fr_free(b);
        }
        return rc;
    default: /* BAR_LEAVE */
        meta_cstr(mem, r->val);
        size_t at = b != NULL ? bar_search(b, mem, &found) : 0;
        if (b == NULL || !found)
            return meta_fail(m, FERRY_ENOENT, "member '%s' is not waiting at barrier '%s'", mem, name);
        fr_free(b->members[at]);
        memmove(b->members + at, b->members + at + 1, (b->n - at - 1) * sizeof(char *));
        if (--b->n == 0)
            b->count = 0;
        return 0;
    }
}

void meta_bar_free_all(fr_meta *m)
{
    size_t pos = 0;
    barrier *b;
    while ((b = fr_smap_next(&m->bars, &pos)) != NULL) {
        bar_clear(b);
        fr_free(b->members);
        fr_free(b);
    }
    fr_smap_fini(&m->bars);
}

/* ---- commands ---------------------------------------------------------------- */

int fr_meta_barrier_arrive(fr_meta *m, const char *name, const char *member, uint32_t count,
                           fr_barrier_state *out)
{
    int rc = meta_check_name(m, "barrier name", name);
    bool found;
    if (rc < 0 || (rc = meta_check_name(m, "barrier member", member)) < 0)
        return rc;
    if (count == 0 || count > FR_BARRIER_MAX)
        return meta_fail(m, FERRY_EINVAL, "barrier count %u (1..%d)", count, FR_BARRIER_MAX);
    const barrier *b = bar_find(m, name);
    if (b != NULL && b->n > 0 && b->count != count)
        return meta_fail(m, FERRY_EINVAL, "barrier '%s' counts %u members, not %u", name, b->count,
                         count);
    if (b != NULL && (bar_search(b, member, &found), found)) {
        if (out != NULL)
            *out = (fr_barrier_state){ b->gen, (uint32_t)b->n, b->count, false };
        return 0;
    }
    fr_rec r = { .type = FR_REC_BAR_ARRIVE, .key = meta_span(name), .val = meta_span(member),
                 .count = count };
    if ((rc = meta_commit(m, &r)) == 0 && out != NULL)
        *out = m->bar_last;
    return rc;
}

int fr_meta_barrier_leave(fr_meta *m, const char *name, const char *member)
{
    int rc = meta_check_name(m, "barrier name", name);
    bool found;
    if (rc < 0 || (rc = meta_check_name(m, "barrier member", member)) < 0)
        return rc;
    const barrier *b = bar_find(m, name);
    if (b == NULL || (bar_search(b, member, &found), !found))
        return meta_fail(m, FERRY_ENOENT, "member '%s' is not waiting at barrier '%s'", member, name);
    fr_rec r = { .type = FR_REC_BAR_LEAVE, .key = meta_span(name), .val = meta_span(member) };
    return meta_commit(m, &r);
}

int fr_meta_barrier_status(const fr_meta *m, const char *name, fr_barrier_state *out)
{
    if (name == NULL || out == NULL)
        return FERRY_EINVAL;
    const barrier *b = bar_find(m, name);
    if (b == NULL)
        return FERRY_ENOENT;
    *out = (fr_barrier_state){ b->gen, (uint32_t)b->n, b->count, false };
    return 0;
}

/* ---- snapshot ---------------------------------------------------------------- */

static int cmp_bar(const void *a, const void *b)
{
    return strcmp((*(barrier *const *)a)->key, (*(barrier *const *)b)->key);
}

int meta_bar_snapshot(fr_meta *m, snap_out *o)
{
    size_t pos = 0, n = 0;
    barrier *b;
    int rc;
    if (meta_scratch(m, m->bars.n) < 0)
        return FERRY_ENOMEM;
    while ((b = fr_smap_next(&m->bars, &pos)) != NULL)
        m->scratch[n++] = b;
    fr_sort(m->scratch, n, sizeof(void *), cmp_bar);
    for (size_t i = 0; i < n; i++) {
        b = m->scratch[i];
        fr_rec r = { .type = FR_REC_SNAP_BAR, .key = meta_span(b->key), .count = b->count,
                     .seq = b->gen };
        if ((rc = snap_emit(o, &r)) < 0)
            return rc;
        for (size_t k = 0; k < b->n; k++) {
            fr_rec mr = { .type = FR_REC_SNAP_BAR_MEMBER, .key = meta_span(b->key),
                          .val = meta_span(b->members[k]) };
            if ((rc = snap_emit(o, &mr)) < 0)
                return rc;
        }
    }
    return 0;
}
