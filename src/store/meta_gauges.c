/* What the master's metrics page reports about the metadata
 * (master_metrics.h): counts the meta keeps as objects change state, and
 * one walk over the queues. Nothing here walks the objects: with 200 000 of
 * them such a walk took the loop 40-140 ms on a loaded 2-core machine. */
#include "store/master_metrics.h"
#include "store/meta_int.h"

void fr_meta_gauges_get(const fr_meta *m, fr_meta_gauges *g)
{
    *g = (fr_meta_gauges){ .complete = m->nobj[FR_OBJ_COMPLETE], .pending = m->nobj[FR_OBJ_PENDING],
                           .lost = m->nobj[FR_OBJ_LOST], .complete_bytes = m->complete_bytes,
                           .evictions = m->evictions, .queues = m->queues.n };
}

size_t fr_meta_queue_gauges(const fr_meta *m, fr_meta_qgauge *out, size_t cap)
{
    size_t pos = 0, n = 0;
    const queue *q;
    while ((q = fr_smap_next(&m->queues, &pos)) != NULL) {
        if (n < cap)
            out[n] = (fr_meta_qgauge){ q->name, q->nready, q->nleased, q->bound };
        n++;
    }
    return n;
}
