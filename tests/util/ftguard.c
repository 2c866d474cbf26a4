/* Allocation guards for the exec tests (ftguard.h). */
#include "util/ftguard.h"

int ft_guard_acquire(void *ctx, uint64_t id)
{
    ft_guards *g = ctx;
    if ((int)id == g->fail_acquire)
        return FERRY_EBUSY;
    g->acquired[id]++;
    return 0;
}

int ft_guard_release(void *ctx, uint64_t id)
{
    ft_guards *g = ctx;
    g->released[id]++;
    return (int)id == g->fail_release ? FERRY_EIO : 0;
}

void ft_guards_make(ft_guards *gs, ferry_guard *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = (ferry_guard){ .id = i + 1, .ctx = gs, .acquire = ft_guard_acquire,
                              .release = ft_guard_release };
}
