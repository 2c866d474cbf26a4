/* The model of `ferry-lab bench cluster` (bench_cluster.h): per strategy,
 * the payload bytes through every host's link in each direction, from the
 * layouts' exact byte counts, and the time of the busiest link. */
#include <stdlib.h>
#include <string.h>

#include "bench_cluster.h"
#include "testing.h"   /* fr_um_compat: the library's reader assignment */

unsigned bc_hosts(const bc_topo *t) { return t->TH + t->RH; }
unsigned bc_trainer_host(const bc_topo *t, unsigned rank) { return rank / (t->T / t->TH); }
unsigned bc_rollout_host(const bc_topo *t, unsigned w) { return t->TH + w / (t->W / t->RH); }

static uint64_t row_bytes(const demo_tensor *x) { return demo_row_elems(x) * 2; }

int bc_topo_init(bc_topo *t, const demo_model *m, unsigned T, unsigned TH, unsigned W, unsigned DP,
                 unsigned RH)
{
    memset(t, 0, sizeof *t);
    *t = (bc_topo){ .m = m, .T = T, .TH = TH, .W = W, .DP = DP, .RH = RH };
    t->rank_bytes = calloc(T, sizeof *t->rank_bytes);
    t->rank_rows = calloc(T, sizeof *t->rank_rows);
    t->nrank_rows = calloc(T, sizeof *t->nrank_rows);
    if (!t->rank_bytes || !t->rank_rows || !t->nrank_rows)
        return -1;
    for (unsigned r = 0; r < T; r++) {
        ferry_manifest *pl = NULL;
        int rc = demo_fsdp_placement(m, T, r, &pl, &t->rank_rows[r], &t->nrank_rows[r]);
        ferry_manifest_close(pl);
        if (rc < 0)
            return -1;
        for (size_t k = 0; k < t->nrank_rows[r]; k++)
            t->rank_bytes[r] += t->rank_rows[r][k].rows * row_bytes(&m->t[t->rank_rows[r][k].tensor]);
    }
    return 0;
}

void bc_topo_free(bc_topo *t)
{
    for (unsigned r = 0; t->rank_rows && r < t->T; r++)
        free(t->rank_rows[r]);
    free(t->rank_rows);
    free(t->nrank_rows);
    free(t->rank_bytes);
    memset(t, 0, sizeof *t);
}

double bc_time(const bc_topo *t, const bc_links *l)
{
    double worst = 0;
    for (unsigned h = 0; h < bc_hosts(t); h++) {
        double b = l->up[h] > l->down[h] ? l->up[h] : l->down[h];
        double s = b / ((double)t->rate[h] / 8 * BC_PAYLOAD_FRACTION);
        worst = s > worst ? s : worst;
    }
    return worst;
}

/* Worker w's demand bytes of tensor i. */
static uint64_t demand(const bc_topo *t, unsigned w, size_t i)
{
    uint64_t r0, rows;
    demo_rollout_rows(&t->m->t[i], w, t->W, t->DP, t->ep, &r0, &rows);
    return rows * row_bytes(&t->m->t[i]);
}

/* Bytes of worker w's demand that trainer rank r holds. */
static uint64_t overlap(const bc_topo *t, unsigned w, unsigned r)
{
    uint64_t b = 0;
    for (size_t k = 0; k < t->nrank_rows[r]; k++) {
        const shard_of *s = &t->rank_rows[r][k];
        uint64_t r0, rows;
        demo_rollout_rows(&t->m->t[s->tensor], w, t->W, t->DP, t->ep, &r0, &rows);
        uint64_t a = r0 > s->r0 ? r0 : s->r0, e = r0 + rows < s->r0 + s->rows ? r0 + rows : s->r0 + s->rows;
        if (a < e)
            b += (e - a) * row_bytes(&t->m->t[s->tensor]);
    }
    return b;
}

static void trainers_send_once(const bc_topo *t, bc_links *l)
{
    for (unsigned r = 0; r < t->T; r++)
        l->up[bc_trainer_host(t, r)] += (double)t->rank_bytes[r];
}

void bc_model_bound(const bc_topo *t, bool compat, bc_links *l)
{
    memset(l, 0, sizeof *l);
    trainers_send_once(t, l);
    unsigned per = t->W / t->RH;
    for (unsigned h = 0; h < t->RH; h++)
        for (size_t i = 0; i < t->m->n; i++) {
            if (compat) {
                l->down[t->TH + h] += (double)t->m->t[i].bytes;
                continue;
            }
            /* the union of the host's workers' rows */
            uint64_t lo[64], hi[64], held = 0;
            unsigned n = 0;
            for (unsigned k = 0; k < per && n < 64; k++) {
                uint64_t r0, rows;
                demo_rollout_rows(&t->m->t[i], h * per + k, t->W, t->DP, t->ep, &r0, &rows);
                if (rows)
                    lo[n] = r0, hi[n++] = r0 + rows;
            }
            for (unsigned a = 1; a < n; a++)   /* by first row */
                for (unsigned b = a; b > 0 && lo[b - 1] > lo[b]; b--) {
                    uint64_t x = lo[b], y = hi[b];
                    lo[b] = lo[b - 1], hi[b] = hi[b - 1], lo[b - 1] = x, hi[b - 1] = y;
                }
            uint64_t end = 0;
            for (unsigned a = 0; a < n; a++) {
                uint64_t from = lo[a] > end ? lo[a] : end;
                if (hi[a] > from)
                    held += hi[a] - from;
                end = hi[a] > end ? hi[a] : end;
            }
            held *= row_bytes(&t->m->t[i]);
            l->down[t->TH + h] += (double)held;
        }
}

void bc_model_p2p(const bc_topo *t, bc_links *l)
{
    memset(l, 0, sizeof *l);
    for (unsigned w = 0; w < t->W; w++)
        for (unsigned r = 0; r < t->T; r++) {
            double b = (double)overlap(t, w, r);
            l->up[bc_trainer_host(t, r)] += b;
            l->down[bc_rollout_host(t, w)] += b;
        }
}

void bc_model_bcast(const bc_topo *t, bc_links *g, bc_links *s)
{
    memset(g, 0, sizeof *g);
    memset(s, 0, sizeof *s);
    unsigned h0 = bc_trainer_host(t, 0);
    for (unsigned r = 1; r < t->T; r++)
        if (bc_trainer_host(t, r) != h0) {
            g->up[bc_trainer_host(t, r)] += (double)t->rank_bytes[r];
            g->down[h0] += (double)t->rank_bytes[r];
        }
    for (unsigned w = 0; w < t->W; w++)
        for (size_t i = 0; i < t->m->n; i++) {
            double b = (double)demand(t, w, i);
            s->up[h0] += b;
            s->down[bc_rollout_host(t, w)] += b;
        }
}

int bc_model_direct(const bc_topo *t, const json_t *nodes, bc_links *l)
{
    memset(l, 0, sizeof *l);
    trainers_send_once(t, l);
    size_t i;
    const json_t *n;
    unsigned seen = 0;
    json_array_foreach(nodes, i, n) {
        json_int_t node = json_integer_value(json_object_get(n, "node"));
        if (node < 0 || (unsigned)node >= t->RH)
            return -1;
        l->down[t->TH + node] = (double)json_integer_value(json_object_get(n, "nic_in"));
        l->up[t->TH + node] = (double)json_integer_value(json_object_get(n, "nic_out"));
        seen++;
    }
    return seen == t->RH ? 0 : -1;
}

int bc_model_compat(const bc_topo *t, bc_links *l)
{
    memset(l, 0, sizeof *l);
    trainers_send_once(t, l);
    uint64_t *sizes = calloc(t->m->n ? t->m->n : 1, sizeof *sizes);
    uint64_t *rows = calloc(t->m->n ? t->m->n : 1, sizeof *rows);
    uint32_t *wnode = calloc(t->W, sizeof *wnode);
    uint64_t in[LAB_MAX_HOSTS] = { 0 }, out[LAB_MAX_HOSTS] = { 0 };
    int rc = sizes && rows && wnode ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < t->m->n; i++)
        sizes[i] = t->m->t[i].bytes, rows[i] = t->m->t[i].bytes / row_bytes(&t->m->t[i]);
    for (unsigned w = 0; rc == 0 && w < t->W; w++)
        wnode[w] = bc_rollout_host(t, w) - t->TH;
    if (rc == 0 && fr_um_compat(sizes, rows, t->m->n, wnode, t->W, t->RH, in, out) < 0)
        rc = -1;
    for (unsigned h = 0; rc == 0 && h < t->RH; h++) {
        l->down[t->TH + h] = (double)in[h];
        l->up[t->TH + h] = (double)out[h];
    }
    free(sizes);
    free(rows);
    free(wnode);
    return rc;
}
