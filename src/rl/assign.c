/* Publisher assignment and object keys (weights.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ferry/weights.h"
#include "rl/rl_int.h"

typedef struct { uint64_t bytes; size_t idx; } item;

static int by_size_desc(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

typedef struct {
    uint32_t node;
    uint64_t load;
    uint32_t first, count;   /* its ranks in the sorted rank list */
} node_load;

static int by_node(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int ferry_weights_assign(const uint64_t *tensor_bytes, size_t ntensors,
                         const uint32_t *rank_node, uint32_t nranks, uint32_t *publisher,
                         ferry_error *err)
{
    if (nranks == 0 || !rank_node || (ntensors && (!tensor_bytes || !publisher)))
        return fr_fail(err, FERRY_EINVAL, "assign: no trainer ranks or no arrays");
    /* Ranks sorted by (node, rank): each node's ranks are one run. */
    uint64_t *rk = malloc(nranks * sizeof *rk);
    uint64_t *rank_load = calloc(nranks, sizeof *rank_load);
    node_load *nodes = calloc(nranks, sizeof *nodes);
    item *it = malloc((ntensors ? ntensors : 1) * sizeof *it);
    if (!rk || !rank_load || !nodes || !it) {
        free(rk), free(rank_load), free(nodes), free(it);
        return fr_fail(err, FERRY_ENOMEM, "assign: out of memory");
    }
    for (uint32_t r = 0; r < nranks; r++)
        rk[r] = (uint64_t)rank_node[r] << 32 | r;
    qsort(rk, nranks, sizeof *rk, by_node);
    uint32_t nn = 0;
    for (uint32_t i = 0; i < nranks; i++) {
        uint32_t node = (uint32_t)(rk[i] >> 32);
        if (nn == 0 || nodes[nn - 1].node != node)
            nodes[nn++] = (node_load){ .node = node, .first = i };
        nodes[nn - 1].count++;
    }
    for (size_t t = 0; t < ntensors; t++)
        it[t] = (item){ .bytes = tensor_bytes[t], .idx = t };
    qsort(it, ntensors, sizeof *it, by_size_desc);
    for (size_t k = 0; k < ntensors; k++) {
        uint32_t best = 0;   /* nodes are in ascending id order: ties go low */
        for (uint32_t n = 1; n < nn; n++)
            if (nodes[n].load < nodes[best].load)
                best = n;
        node_load *nl = &nodes[best];
        uint32_t br = nl->first;
        for (uint32_t i = nl->first + 1; i < nl->first + nl->count; i++)
            if (rank_load[i] < rank_load[br])
                br = i;
        nl->load += it[k].bytes;
        rank_load[br] += it[k].bytes;
        publisher[it[k].idx] = (uint32_t)rk[br];
    }
    free(rk), free(rank_load), free(nodes), free(it);
    return 0;
}
