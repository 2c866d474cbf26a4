/* The client's staging buffer (store.h, ferry_store_staging_take): one
 * reusable, registered buffer whose pages stay resident across puts. It is
 * an anonymous mapping rounded up to 2 MiB and advised for transparent huge
 * pages (best effort: where THP is off it is plain 4 KiB pages, still
 * touched only once). */
#include <sys/mman.h>

#include "store/client_int.h"

#define STAGE_ALIGN (2u << 20)

/* Forget s->stage (under s->lock): unregister and unmap it, unless
 * abandoned (then the engine may still read it: leave both). */
static void stage_drop(ferry_store *s, bool abandon)
{
    if (!s->stage)
        return;
    for (size_t i = 0; i < s->nbufs; i++) {
        if (s->bufs[i].addr != s->stage)
            continue;
        if (!abandon && ferry_region_unregister(s->bufs[i].reg, NULL) != 0)
            abandon = true;   /* still pinned by a transfer: never unmap it */
        s->bufs[i] = s->bufs[--s->nbufs];
        break;
    }
    if (!abandon)
        munmap(s->stage, s->stage_len);
    s->stage = NULL;
    s->stage_len = 0;
}

int ferry_store_staging_take(ferry_store *s, size_t len, void **out, ferry_error *err)
{
    if (!s || !out || !len)
        return fr_fail(err, FERRY_EINVAL, "staging_take: no store, destination or length");
    if (len > SIZE_MAX - STAGE_ALIGN)
        return fr_fail(err, FERRY_EINVAL, "staging_take: %zu bytes is too large", len);
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    if (s->stage_busy) {
        rc = fr_fail(err, FERRY_EBUSY, "staging_take: the staging buffer is taken");
        goto out;
    }
    if (s->stage_len < len) {
        stage_drop(s, false);
        size_t n = (len + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
        void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            rc = fr_fail(err, FERRY_ENOMEM, "staging_take: no memory for %zu bytes", n);
            goto out;
        }
        (void)madvise(m, n, MADV_HUGEPAGE);
        ferry_region *reg = NULL;
        rc = fr_grow((void **)&s->bufs, &s->cap_bufs, s->nbufs + 1, sizeof *s->bufs);
        if (rc == 0)
            rc = ferry_region_register(s->eng, m, n, 0, FERRY_MEM_HOST, &reg, NULL);
        if (rc != 0) {
            munmap(m, n);
            rc = fr_fail(err, rc, "staging_take: cannot register %zu bytes", n);
            goto out;
        }
        s->bufs[s->nbufs++] = (fr_ubuf){ .addr = m, .len = n, .reg = reg };
        s->stage = m;
        s->stage_len = n;
    }
    s->stage_busy = true;
    *out = s->stage;
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void ferry_store_staging_give(ferry_store *s, bool abandon)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    if (s->stage_busy && abandon)
        stage_drop(s, true);
    s->stage_busy = false;
    pthread_mutex_unlock(&s->lock);
}

void fr_client_stage_fini(ferry_store *s)
{
    stage_drop(s, false);
}
