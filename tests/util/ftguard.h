/* Allocation guards for the exec tests: per-id counts of acquire and
 * release, and the ids whose acquire or release fails. */
#ifndef FT_GUARD_H
#define FT_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/exec.h"

typedef struct ft_guards {
    int acquired[8], released[8];   /* by id (ids 1..7) */
    int fail_acquire, fail_release; /* the id whose acquire (FERRY_EBUSY) or release
                                     * (FERRY_EIO, still counted) fails; -1: none */
} ft_guards;

int ft_guard_acquire(void *ctx, uint64_t id);
int ft_guard_release(void *ctx, uint64_t id);
/* g[0..n): ids 1..n over gs. */
void ft_guards_make(ft_guards *gs, ferry_guard *g, size_t n);

#endif
