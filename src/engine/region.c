/* Memory registration: allocations (memfd-backed, or the memory transport's:
 * the running transport with memory hooks, see fr_transport), regions with
 * random keys registered with that transport too, the shm key table
 * mirrored for same-host peers, and the target-side check of every remote
 * access. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/engine_int.h"

/* ---- key table ---------------------------------------------------------- */

static uint32_t slot_of(uint64_t key) { return (uint32_t)(key * 0x9E3779B97F4A7C15ull >> 40) % FR_KEYTAB_SLOTS; }

int fr_keytab_lookup(const fr_keyslot *tab, uint64_t key, fr_keyslot *out)
{
    uint32_t s = slot_of(key);
    for (uint32_t i = 0; i < FR_KEYTAB_SLOTS; i++, s = (s + 1) % FR_KEYTAB_SLOTS) {
        const fr_keyslot *k = &tab[s];
        for (;;) {
            /* seqlock read: retry while a writer is inside the slot */
            uint64_t q1 = atomic_load_explicit(&k->seq, memory_order_acquire);
            if (q1 & 1)
                continue;
            uint64_t kk = atomic_load_explicit(&k->key, memory_order_relaxed);
            fr_keyslot copy;
            copy.base = k->base;
            copy.len = k->len;
            copy.flags = k->flags;
            copy.memfd_id = k->memfd_id;
            copy.memfd_off = k->memfd_off;
            copy.memfd_len = k->memfd_len;
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&k->seq, memory_order_relaxed) != q1)
                continue;
            if (kk == FR_KEY_EMPTY)
                return FERRY_ENOENT;
            if (kk != key)
                break;
            atomic_init(&copy.key, kk);
            *out = copy;
            return 0;
        }
    }
    return FERRY_ENOENT;
}

static void slot_write(fr_keyslot *k, uint64_t key, const ferry_region *r)
{
    uint64_t q = atomic_load_explicit(&k->seq, memory_order_relaxed);
    atomic_store_explicit(&k->seq, q + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    if (r) {
        k->base = (uint64_t)(uintptr_t)r->addr;
        k->len = r->len;
        k->flags = r->flags;
        k->memfd_id = r->memfd >= 0 ? r->memfd_id : 0;
        k->memfd_off = r->memfd_off;
        k->memfd_len = r->memfd_len;
    }
    atomic_store_explicit(&k->key, key, memory_order_relaxed);
    atomic_store_explicit(&k->seq, q + 2, memory_order_release);
}

static int keytab_insert(ferry_engine *e, ferry_region *r)
{
    uint32_t s = slot_of(r->key);
    for (uint32_t i = 0; i < FR_KEYTAB_SLOTS; i++, s = (s + 1) % FR_KEYTAB_SLOTS) {
        uint64_t k = atomic_load_explicit(&e->keytab[s].key, memory_order_relaxed);
        if (k == FR_KEY_EMPTY || k == FR_KEY_TOMB) {
            slot_write(&e->keytab[s], r->key, r);
            e->slot_region[s] = r;
            r->slot = (int)s;
            return 0;
        }
    }
    return FERRY_ENOSPC;
}

int fr_keytab_create(ferry_engine *e)
{
    size_t bytes = FR_KEYTAB_SLOTS * sizeof(fr_keyslot);
    e->keytab_fd = memfd_create("ferry-keytab", MFD_CLOEXEC);
    if (e->keytab_fd < 0)
        return FERRY_EIO;
    if (ftruncate(e->keytab_fd, (off_t)bytes) < 0)
        return FERRY_EIO;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, e->keytab_fd, 0);
    if (p == MAP_FAILED)
        return FERRY_ENOMEM;
    e->keytab = p;
    e->slot_region = fr_calloc(FR_KEYTAB_SLOTS, sizeof *e->slot_region);
    return e->slot_region ? 0 : FERRY_ENOMEM;
}

void fr_keytab_destroy(ferry_engine *e)
{
    if (e->keytab)
        munmap(e->keytab, FR_KEYTAB_SLOTS * sizeof(fr_keyslot));
    if (e->keytab_fd >= 0)
        close(e->keytab_fd);
    fr_free(e->slot_region);
    e->slot_region = NULL;
    e->keytab = NULL;
    e->keytab_fd = -1;
}

/* ---- allocations (ferry_mem_alloc) ----------------------------------- */

static fr_mem *mem_find(ferry_engine *e, const uint8_t *addr, uint64_t len)
{
    for (size_t i = 0; i < e->nmems; i++) {
        fr_mem *m = e->mems[i];
        if (addr >= m->addr && addr - m->addr <= (ptrdiff_t)m->len && len <= m->len - (uint64_t)(addr - m->addr))
            return m;
    }
    return NULL;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23   /* Linux 5.14 */
#endif

/* Pre-fault: first touches cost ~1 GB/s here, never pay them mid-transfer.
 * In slices, not with MAP_POPULATE: populating holds the process's mmap
 * lock, and a gigabyte of it would stall every other thread that needs the
 * lock (a malloc growing its arena, a heartbeat thread among them) for
 * seconds. */
static void prefault(uint8_t *p, size_t len, size_t page)
{
    const size_t slice = 16u << 20;
    for (size_t off = 0; off < len; off += slice) {
        size_t n = len - off < slice ? len - off : slice;
        if (madvise(p + off, n, MADV_POPULATE_WRITE) == 0)
            continue;
        for (size_t k = 0; k < n; k += page)   /* older kernels: touch each page */
            ((volatile uint8_t *)p)[off + k] = 0;
    }
}

int fr_mem_transport(const ferry_engine *e)
{
    for (int i = 0; i < FR_TP_COUNT; i++) {
        const fr_transport *tp = fr_transports[i];
        if (tp && e->tp_state[i] && (tp->mem_alloc || tp->reg))
            return i;
    }
    return -1;
}

static void mem_destroy(ferry_engine *e, fr_mem *m)
{
    if (m->tp_handle)   /* NULL once its transport stopped */
        fr_transports[m->tp]->mem_free(e->tp_state[m->tp], m->tp_handle);
    if (m->fd >= 0) {
        munmap(m->addr, m->len);
        close(m->fd);
    }
    fr_free(m);
}

int ferry_mem_alloc(ferry_engine *e, size_t len, void **addr, ferry_error *err)
{
    if (!e || !addr || len == 0)
        return fr_fail(err, FERRY_EINVAL, "mem alloc: no engine or addr, or 0 bytes");
    long page = sysconf(_SC_PAGESIZE);
    if (len > SIZE_MAX - (size_t)page)
        return fr_fail(err, FERRY_ENOMEM, "mem alloc: %zu bytes cannot be allocated", len);
    uint64_t rounded = (len + (uint64_t)page - 1) & ~((uint64_t)page - 1);
    const char *step = "allocate its bookkeeping";
    int rc;
    fr_mem *m = fr_calloc(1, sizeof *m);
    if (!m)
        goto fail;
    m->fd = -1;
    m->tp = -1;
    void *p = NULL;
    /* The memory transport's own memory first: what it lets a peer map and
     * copy into directly (ucx: UCX's shared-memory transports). */
    int mt = fr_mem_transport(e);
    if (mt >= 0 && fr_transports[mt]->mem_alloc &&
        fr_transports[mt]->mem_alloc(e->tp_state[mt], rounded, &p, &m->tp_handle) == 0)
        m->tp = mt;
    else
        p = m->tp_handle = NULL;
    if (!p) {   /* memfd memory (no memory transport, or it could not allocate) */
        step = "create a memfd";
        m->fd = memfd_create("ferry-mem", MFD_CLOEXEC);
        if (m->fd < 0)
            goto fail;
        step = "size its memfd";
        if (ftruncate(m->fd, (off_t)rounded) < 0)
            goto fail;
        step = "map its memfd";
        p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
        if (p == MAP_FAILED)
            goto fail;
        prefault(p, rounded, (size_t)page);
    }
    m->addr = p;
    m->len = rounded;
    pthread_mutex_lock(&e->lock);
    rc = fr_grow((void **)&e->mems, &e->cap_mems, e->nmems + 1, sizeof *e->mems);
    if (rc == 0) {
        m->id = ++e->next_mem_id;
        e->mems[e->nmems++] = m;
    }
    pthread_mutex_unlock(&e->lock);
    if (rc < 0) {
        mem_destroy(e, m);
        return fr_fail(err, rc, "mem alloc of %zu bytes: %s", len, ferry_strerror(rc));
    }
    *addr = p;
    return 0;
fail:
    rc = fr_fail(err, FERRY_ENOMEM, "mem alloc of %zu bytes: cannot %s: %s", len, step,
                 m ? strerror(errno) : "out of memory");
    if (m && m->fd >= 0)
        close(m->fd);
    fr_free(m);
    return rc;
}

int ferry_mem_free(ferry_engine *e, void *addr, ferry_error *err)
{
    if (!e || !addr)
        return fr_fail(err, FERRY_EINVAL, "mem free: no engine or addr");
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < e->nmems; i++) {
        fr_mem *m = e->mems[i];
        if (m->addr != addr)
            continue;
        if (m->regions > 0) {
            const uint32_t n = m->regions;
            pthread_mutex_unlock(&e->lock);
            return fr_fail(err, FERRY_EBUSY, "mem free: %u registered region%s still lie%s in the %llu bytes "
                           "at %p: unregister %s first", n, n == 1 ? "" : "s", n == 1 ? "s" : "",
                           (unsigned long long)m->len, addr, n == 1 ? "it" : "them");
        }
        e->mems[i] = e->mems[--e->nmems];
        pthread_mutex_unlock(&e->lock);
        mem_destroy(e, m);
        return 0;
    }
    pthread_mutex_unlock(&e->lock);
    return fr_fail(err, FERRY_ENOENT, "mem free: %p is not the start of memory from this engine's "
                   "ferry_mem_alloc", addr);
}

void fr_mem_destroy_all(ferry_engine *e)
{
    for (size_t i = 0; i < e->nmems; i++)
        mem_destroy(e, e->mems[i]);
    fr_free(e->mems);
    e->mems = NULL;
    e->nmems = e->cap_mems = 0;
}

/* ---- regions ------------------------------------------------------------- */

/* Index of the first region with addr > a (regions sorted by addr). */
static size_t upper_bound(ferry_engine *e, const uint8_t *a)
{
    size_t lo = 0, hi = e->nregions;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (e->regions[mid]->addr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

ferry_region *fr_region_find_local(ferry_engine *e, const uint8_t *addr, uint64_t len)
{
    /* Regions may overlap (the same buffer registered twice); scan back from
     * the last region starting at or below addr for one that covers it. */
    size_t i = upper_bound(e, addr);
    while (i > 0) {
        ferry_region *r = e->regions[--i];
        uint64_t off = (uint64_t)(addr - r->addr);
        if (off <= r->len && len <= r->len - off)
            return r;
    }
    return NULL;
}

bool ferry_region_covers(ferry_engine *e, const void *addr, size_t len)
{
    if (!e || !addr)
        return false;
    pthread_mutex_lock(&e->lock);
    bool yes = fr_region_find_local(e, addr, len) != NULL;
    pthread_mutex_unlock(&e->lock);
    return yes;
}

/* Undo the memory transport's reg hook, if it ran. */
static void region_dereg(ferry_engine *e, ferry_region *r)
{
    int mt = fr_mem_transport(e);
    if (mt >= 0 && fr_transports[mt]->dereg && (r->tp_handle || r->rkey_len))
        fr_transports[mt]->dereg(e->tp_state[mt], r);
}

int ferry_region_register(ferry_engine *e, void *addr, size_t len, unsigned flags,
                          enum ferry_mem_kind kind, ferry_region **out, ferry_error *err)
{
    if (!e || !addr || !out || len == 0)
        return fr_fail(err, FERRY_EINVAL, "region register: no engine, addr or out, or 0 bytes");
    if (flags & ~FERRY_REMOTE_RW)
        return fr_fail(err, FERRY_EINVAL, "region register: flags 0x%x: only FERRY_REMOTE_READ and "
                       "FERRY_REMOTE_WRITE are defined", flags);
    if (kind != FERRY_MEM_HOST)
        return fr_fail(err, FERRY_ENOTSUP, "region register: memory kind %d: only host memory can be "
                       "registered", (int)kind);
    if ((uintptr_t)addr + len < (uintptr_t)addr)
        return fr_fail(err, FERRY_ERANGE, "region register: %p + %zu bytes wraps the address space", addr, len);
    ferry_region *r = fr_calloc(1, sizeof *r);
    if (!r)
        return fr_fail(err, FERRY_ENOMEM, "region register: out of memory");
    r->e = e;
    r->addr = addr;
    r->len = len;
    r->flags = flags;
    r->kind = kind;
    r->memfd = -1;
    r->slot = -1;
    atomic_init(&r->remote_refs, 0);
    r->key = fr_random_u64();
    int mt = flags ? fr_mem_transport(e) : -1;
    if (mt >= 0 && fr_transports[mt]->reg) {
        pthread_mutex_lock(&e->lock);
        fr_mem *tm = mem_find(e, r->addr, r->len);
        void *alloc_handle = tm && tm->tp == mt ? tm->tp_handle : NULL;
        pthread_mutex_unlock(&e->lock);
        ferry_error why = {0};
        int mrc = fr_transports[mt]->reg(e->tp_state[mt], r, alloc_handle, &why);
        if (mrc < 0) {
            fr_free(r);
            return fr_fail(err, mrc, "region register of %zu bytes at %p: the %s transport refused it: %s", len,
                           addr, fr_transports[mt]->name, why.code ? why.msg : ferry_strerror(mrc));
        }
    }

    pthread_mutex_lock(&e->lock);
    int rc = fr_grow((void **)&e->regions, &e->cap_regions, e->nregions + 1, sizeof *e->regions);
    if (rc < 0) {
        fr_fail(err, rc, "region register: out of memory");
        goto fail;
    }
    fr_mem *m = mem_find(e, r->addr, r->len);
    if (m) {
        r->memfd = m->fd;
        r->memfd_id = m->id;
        r->memfd_off = (uint64_t)(r->addr - m->addr);
        r->memfd_len = m->len;
    }
    if (flags) {
        rc = keytab_insert(e, r);
        if (rc < 0) {
            fr_fail(err, rc, "region register: the key table is full (%u remote-accessible regions at most)",
                    (unsigned)FR_KEYTAB_SLOTS);
            goto fail;
        }
    }
    if (m)
        m->regions++;
    size_t at = upper_bound(e, r->addr);
    memmove(&e->regions[at + 1], &e->regions[at], (e->nregions - at) * sizeof *e->regions);
    e->regions[at] = r;
    e->nregions++;
    pthread_mutex_unlock(&e->lock);
    *out = r;
    return 0;
fail:
    pthread_mutex_unlock(&e->lock);
    region_dereg(e, r);
    fr_free(r);
    return rc;
}

/* Remove r from the engine's tables; caller holds the lock. */
static void region_remove_locked(ferry_engine *e, ferry_region *r)
{
    for (size_t i = 0; i < e->nregions; i++) {
        if (e->regions[i] != r)
            continue;
        memmove(&e->regions[i], &e->regions[i + 1], (e->nregions - i - 1) * sizeof *e->regions);
        e->nregions--;
        break;
    }
    if (r->slot >= 0) {
        slot_write(&e->keytab[r->slot], FR_KEY_TOMB, NULL);
        e->slot_region[r->slot] = NULL;
    }
    if (r->memfd_id) {   /* inside a ferry_mem_alloc allocation (memfd or a transport's) */
        fr_mem *m = mem_find(e, r->addr, r->len);
        if (m && m->regions > 0)
            m->regions--;
    }
}

/* Why r cannot be unregistered now (engine lock held): into err. */
static int busy_locked(ferry_engine *e, const ferry_region *r, unsigned served, ferry_error *err)
{
    char what[160] = "";
    if (r->pins > 0) {
        bool unknown = false;
        uint64_t id = fr_ticket_pinning_locked(e, r, &unknown);
        snprintf(what, sizeof what, "%u ticket%s of this engine use%s it (ticket %llu %s)", r->pins,
                 r->pins == 1 ? "" : "s", r->pins == 1 ? "s" : "", (unsigned long long)id,
                 unknown ? "has an unknown outcome: it stays until it drains or its peer is reset"
                         : "is in flight");
    }
    if (served > 0)
        snprintf(what + strlen(what), sizeof what - strlen(what), "%s%u remote access%s by peers %s being served",
                 r->pins > 0 ? "; " : "", served, served == 1 ? "" : "es", served == 1 ? "is" : "are");
    return fr_fail(err, FERRY_EBUSY, "region unregister: the %llu bytes at %p are pinned: %s",
                   (unsigned long long)r->len, (void *)r->addr, what);
}

int ferry_region_unregister(ferry_region *r, ferry_error *err)
{
    if (!r)
        return fr_fail(err, FERRY_EINVAL, "region unregister: no region");
    ferry_engine *e = r->e;
    pthread_mutex_lock(&e->lock);
    const unsigned served = atomic_load(&r->remote_refs);
    if (r->pins > 0 || served > 0) {
        int rc = busy_locked(e, r, served, err);
        pthread_mutex_unlock(&e->lock);
        return rc;
    }
    region_remove_locked(e, r);
    pthread_mutex_unlock(&e->lock);
    region_dereg(e, r);
    fr_free(r);
    return 0;
}

int ferry_region_unregister_all(ferry_region **regions, size_t n, ferry_error *err)
{
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        if (!regions[i])
            continue;
        int rc = ferry_region_unregister(regions[i], first == 0 ? err : NULL);
        if (rc == 0) {
            regions[i] = NULL;   /* checkpoint each success at once */
        } else if (first == 0) {
            first = rc;
            if (err)
                fr_fail(err, rc, "region %zu of %zu: %s", i, n, err->msg);
        }
    }
    return first;
}

size_t ferry_engine_region_count(ferry_engine *e)
{
    pthread_mutex_lock(&e->lock);
    size_t n = e->nregions;
    pthread_mutex_unlock(&e->lock);
    return n;
}

void fr_region_destroy_all(ferry_engine *e)
{
    for (size_t i = 0; i < e->nregions; i++)
        fr_free(e->regions[i]);
    fr_free(e->regions);
    e->regions = NULL;
    e->nregions = e->cap_regions = 0;
}

uint64_t ferry_region_key(const ferry_region *r) { return r ? r->key : 0; }
void *ferry_region_addr(const ferry_region *r) { return r ? r->addr : NULL; }
size_t ferry_region_len(const ferry_region *r) { return r ? r->len : 0; }

int ferry_region_export(const ferry_region *r, void *buf, size_t cap)
{
    if (!r || !buf)
        return FERRY_EINVAL;
    fr_region_desc d = {.ep = r->e->ep, .base = (uint64_t)(uintptr_t)r->addr, .len = r->len,
                        .key = r->key, .flags = r->flags, .mem_kind = r->kind};
    d.rkey_len = r->rkey_len;   /* 0 unless the memory transport gave the region a remote key */
    memcpy(d.rkey, r->rkey, r->rkey_len);
    return fr_region_desc_encode(&d, buf, cap);
}

/* ---- target side -------------------------------------------------------- */

/* Owner-side key lookup (caller holds the engine lock). */
static ferry_region *find_by_key(ferry_engine *e, uint64_t key)
{
    if (key == FR_KEY_EMPTY || key == FR_KEY_TOMB)
        return NULL;
    uint32_t s = slot_of(key);
    for (uint32_t i = 0; i < FR_KEYTAB_SLOTS; i++, s = (s + 1) % FR_KEYTAB_SLOTS) {
        uint64_t k = atomic_load_explicit(&e->keytab[s].key, memory_order_relaxed);
        if (k == FR_KEY_EMPTY)
            return NULL;
        if (k == key)
            return e->slot_region[s];
    }
    return NULL;
}

/* [a, a+n) inside [base, base+len)? */
static bool inside(uint64_t a, uint64_t n, uint64_t base, uint64_t len)
{
    return a >= base && a - base <= len && n <= len - (a - base);
}

int fr_region_acquire(ferry_engine *e, const fr_msg_rw *rw, unsigned need, ferry_region **reg,
                      uint8_t **ptr)
{
    int rc = FERRY_EACCES;
    uint64_t span_addr = rw->span_len ? rw->span_addr : rw->addr;
    uint64_t span_len = rw->span_len ? rw->span_len : rw->len;
    pthread_mutex_lock(&e->lock);
    ferry_region *r = find_by_key(e, rw->key);
    if (!r || !(r->flags & need))
        goto refuse;
    uint64_t base = (uint64_t)(uintptr_t)r->addr;
    if (!inside(span_addr, span_len, base, r->len) || !inside(rw->addr, rw->len, span_addr, span_len)) {
        rc = FERRY_EFAULT;
        goto refuse;
    }
    atomic_fetch_add(&r->remote_refs, 1);
    pthread_mutex_unlock(&e->lock);
    *reg = r;
    *ptr = r->addr + (rw->addr - base);
    return 0;
refuse:
    pthread_mutex_unlock(&e->lock);
    FR_STAT_ADD(e, remote_refused, 1);
    if (rw->addr == span_addr)   /* one line per op, not per chunk */
        FR_WARN("engine", "refused remote %s of %llu bytes at 0x%llx: %s",
                need == FERRY_REMOTE_WRITE ? "write" : "read", (unsigned long long)span_len,
                (unsigned long long)span_addr,
                rc == FERRY_EFAULT ? "outside the region" : "bad key or access not allowed");
    return rc;
}

void fr_region_release(ferry_region *r)
{
    atomic_fetch_sub(&r->remote_refs, 1);
}

int fr_region_map_info(ferry_engine *e, uint64_t key, fr_msg_map_resp *out, int *fd)
{
    pthread_mutex_lock(&e->lock);
    ferry_region *r = find_by_key(e, key);
    int rc = 0;
    if (!r || !r->flags)
        rc = FERRY_EACCES;
    else if (r->memfd < 0)
        rc = FERRY_ENOTSUP;
    if (rc == 0) {
        out->region_base = (uint64_t)(uintptr_t)r->addr;
        out->fd_offset = r->memfd_off;
        out->map_len = r->memfd_len;
        *fd = r->memfd;
    }
    pthread_mutex_unlock(&e->lock);
    out->status = rc;
    return rc;
}

int fr_region_rkey_info(ferry_engine *e, uint64_t key, fr_import *out)
{
    pthread_mutex_lock(&e->lock);
    ferry_region *r = find_by_key(e, key);
    int rc = r && r->flags && r->rkey_len ? 0 : FERRY_EACCES;
    if (rc == 0) {
        *out = (fr_import){.key = key, .base = (uint64_t)(uintptr_t)r->addr, .len = r->len,
                           .flags = r->flags, .rkey_len = r->rkey_len};
        memcpy(out->rkey, r->rkey, r->rkey_len);
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}

void fr_mem_transport_stopping(ferry_engine *e, int slot)
{
    const fr_transport *tp = fr_transports[slot];
    void *state = e->tp_state[slot];
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < e->nregions; i++)
        if (tp->dereg && (e->regions[i]->tp_handle || e->regions[i]->rkey_len))
            tp->dereg(state, e->regions[i]);
    for (size_t i = 0; i < e->nmems; i++) {
        fr_mem *m = e->mems[i];
        if (m->tp == slot && m->tp_handle) {
            tp->mem_free(state, m->tp_handle);
            m->tp_handle = NULL;
        }
    }
    pthread_mutex_unlock(&e->lock);
}
