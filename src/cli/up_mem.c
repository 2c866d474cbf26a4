/* How much memory a node started now could take (`ferry up --size` is
 * checked against it before anything starts): MemAvailable from
 * PROC/meminfo, and the tightest cgroup memory limit on this process's
 * cgroup and its ancestors (v2: memory.max and memory.current; v1:
 * memory.limit_in_bytes and memory.usage_in_bytes), read under CGROOT.
 * libc only, so that tests/cli/test_cli_mem.c can include this file and run
 * it on a made-up tree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Limits at or above this are "max" written as a number (v1 writes
 * 9223372036854771712 for no limit). */
#define MEM_NO_LIMIT (1ull << 62)

static int read_u64(const char *path, uint64_t *out, bool *max)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[64] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    buf[strcspn(buf, "\n")] = 0;
    *max = !strcmp(buf, "max");
    if (*max)
        return 0;
    char *end = NULL;
    if (buf[0] < '0' || buf[0] > '9')
        return -1;
    unsigned long long v = strtoull(buf, &end, 10);
    if (*end)
        return -1;
    *max = v >= MEM_NO_LIMIT;
    *out = v;
    return 0;
}

static uint64_t mem_available(const char *proc)
{
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/meminfo", proc);
    FILE *f = fopen(path, "r");
    unsigned long long kb = 0;
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    if (f)
        fclose(f);
    return found ? (uint64_t)kb * 1024 : UINT64_MAX;
}

/* Walk from base/rel up to base, keeping the limit that leaves the least. */
static void walk(const char *base, const char *rel, const char *limit_name, const char *used_name,
                 cli_mem *m)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s%s", base, rel);
    size_t blen = strlen(base);
    for (;;) {
        size_t n = strlen(dir);
        while (n > blen && dir[n - 1] == '/')
            dir[--n] = 0;
        char lp[600], up[600];
        snprintf(lp, sizeof lp, "%s/%s", dir, limit_name);
        snprintf(up, sizeof up, "%s/%s", dir, used_name);
        uint64_t lim = 0, used = 0;
        bool max = true, umax = false;
        if (read_u64(lp, &lim, &max) == 0 && !max && read_u64(up, &used, &umax) == 0) {
            uint64_t left = used < lim ? lim - used : 0;
            if (!m->cg || left < m->cg_limit - m->cg_used) {
                m->cg = true;
                m->cg_limit = lim;
                m->cg_used = used < lim ? used : lim;
                snprintf(m->cg_file, sizeof m->cg_file, "%s", lp);
            }
        }
        char *slash = strrchr(dir, '/');
        if (n <= blen || !slash || (size_t)(slash - dir) < blen)
            break;
        *slash = 0;
    }
}

int cli_mem_probe(const char *proc, const char *cgroot, cli_mem *m)
{
    memset(m, 0, sizeof *m);
    m->avail = mem_available(proc);
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/self/cgroup", proc);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/')
            continue;
        *c1 = *c2 = 0;
        const char *ctrls = c1 + 1, *rel = c2 + 1;
        char base[512];
        if (!strcmp(line, "0") && !*ctrls) {   /* v2: unified, or hybrid under unified/ */
            snprintf(base, sizeof base, "%s/cgroup.controllers", cgroot);
            bool pure = access(base, F_OK) == 0;
            snprintf(base, sizeof base, pure ? "%s" : "%s/unified", cgroot);
            walk(base, rel, "memory.max", "memory.current", m);
            continue;
        }
        char list[256];
        snprintf(list, sizeof list, ",%s,", ctrls);
        if (strstr(list, ",memory,")) {   /* v1 */
            snprintf(base, sizeof base, "%s/memory", cgroot);
            walk(base, rel, "memory.limit_in_bytes", "memory.usage_in_bytes", m);
        }
    }
    if (f)
        fclose(f);
    return m->avail == UINT64_MAX && !m->cg ? -1 : 0;
}

uint64_t cli_mem_headroom(const cli_mem *m)
{
    uint64_t h = m->avail;
    if (m->cg && m->cg_limit - m->cg_used < h)
        h = m->cg_limit - m->cg_used;
    return h;
}
