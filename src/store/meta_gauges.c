/* What the master's metrics page reports about the metadata: one read-only
 * walk over the objects and the queues (master_metrics.h). O(objects); the
 * loop renders at most once per max(100 ms, 10 x the last render's cost). */
#include "store/master_metrics.h"
#include "store/meta_int.h"

void fr_meta_gauges_get(const fr_meta *m, uint64_t now_ms, fr_meta_gauges *g)
{
    memset(g, 0, sizeof *g);
    size_t pos = 0;
    const meta_obj *o;
    while ((o = fr_smap_next(&m->objs, &pos)) != NULL) {
        if (o->state == FR_OBJ_COMPLETE) {
            g->complete++;
            g->complete_bytes += o->size;
            g->leased += o->lease_until > now_ms;   /* as meta_place.c's leased() */
        } else if (o->state == FR_OBJ_PENDING) {
            g->pending++;
        } else {
            g->lost++;
        }
    }
    g->evictions = m->evictions;
    g->queues = m->queues.n;
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
