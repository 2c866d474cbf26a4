/* Reader assignment (src/rl/readers.c): every demanded byte has exactly one
 * reader and reaches every run that wants it once; readers consume what
 * they read; the answer depends on the input, not its order; NIC loads
 * stay balanced; a subscriber group over two nodes reads each byte once
 * and forwards inside a node; and `ferry plan --nic` (the at-scale model
 * built on it) runs on kimi-k2 and ranks ferry direct no slower than the
 * baselines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <jansson.h>

#include "rl/rl_int.h"
#include "rl/gen_int.h"
#include "rl/keys.h"
#include "util/ftgroup.h"

#define MIB (1ull << 20)

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

typedef struct object {
    uint32_t src;
    uint64_t size;
    fr_rd_demand *d;
    size_t n;
} object;

/* The output in terms of what runs are (worker, off, len), not where they
 * sit in the input: equal for any order of the input. */
static uint64_t canonical(const object *o, const fr_rd_range *g, size_t ng, const fr_rd_push *p,
                          uint64_t h)
{
    for (size_t i = 0; i < ng; i++) {
        const fr_rd_demand *rd = &o->d[g[i].reader];
        uint64_t v[5] = { g[i].off, g[i].len, rd->worker, rd->off, rd->len };
        h = fnv(h, v, sizeof v);
        for (size_t k = g[i].push; k < g[i].push + g[i].npush; k++) {
            const fr_rd_demand *f = &o->d[p[k].from], *t = &o->d[p[k].to];
            uint64_t w[7] = { f->worker, f->off, f->len, t->worker, t->off, t->len, p[k].hop };
            h = fnv(h, w, sizeof w);
        }
    }
    return h;
}

/* Check one object's answer byte-exactly (on a coarse grid: every run
 * boundary is a multiple of `unit`). */
static void check_object(const object *o, const fr_rd_config *cfg, uint64_t unit,
                         const fr_rd_range *g, size_t ng, const fr_rd_push *p, size_t np)
{
    size_t cells = (size_t)(o->size / unit);
    /* per (cell, run): times the run got the cell (read or pushed) */
    uint8_t *got = calloc(cells * o->n + 1, 1);
    uint8_t *read = calloc(cells + 1, 1);
    assert_non_null(got);
    uint64_t prev_end = 0;
    size_t pushes = 0;
    for (size_t i = 0; i < ng; i++) {
        assert_true(g[i].off >= prev_end);            /* disjoint, in order */
        prev_end = g[i].off + g[i].len;
        const fr_rd_demand *rd = &o->d[g[i].reader];
        assert_true(rd->off <= g[i].off && g[i].off + g[i].len <= rd->off + rd->len);
        bool shared = false;   /* pieces are cut only where two workers meet */
        for (size_t k = g[i].push; k < g[i].push + g[i].npush; k++)
            shared |= o->d[p[k].to].worker != rd->worker;
        if (cfg->chunk && shared)
            assert_true(g[i].len <= cfg->chunk);
        assert_true(g[i].push == pushes);
        pushes += g[i].npush;
        for (uint64_t c = g[i].off / unit; c < (g[i].off + g[i].len) / unit; c++) {
            assert_int_equal(read[c], 0);
            read[c] = 1;
            got[c * o->n + g[i].reader]++;
        }
        for (size_t k = g[i].push; k < g[i].push + g[i].npush; k++) {
            const fr_rd_demand *f = &o->d[p[k].from], *t = &o->d[p[k].to];
            assert_true(t->off <= g[i].off && g[i].off + g[i].len <= t->off + t->len);
            assert_true(f->off <= g[i].off && g[i].off + g[i].len <= f->off + f->len);
            if (p[k].hop == 1) {
                assert_int_equal(p[k].from, g[i].reader);
            } else {
                assert_int_equal(p[k].hop, 2);
                assert_true(cfg->relay);
                /* forwarded inside the node by a run that got hop 1 */
                assert_int_equal(cfg->worker_node[f->worker], cfg->worker_node[t->worker]);
                bool fed = false;
                for (size_t q = g[i].push; q < g[i].push + g[i].npush; q++)
                    fed |= p[q].hop == 1 && p[q].to == p[k].from && q < k;
                assert_true(fed);
            }
            for (uint64_t c = g[i].off / unit; c < (g[i].off + g[i].len) / unit; c++)
                got[c * o->n + p[k].to]++;
        }
    }
    assert_int_equal(pushes, np);
    /* every cell of every run exactly once; nothing outside the runs */
    for (size_t j = 0; j < o->n; j++)
        for (size_t c = 0; c < cells; c++) {
            bool want = c * unit >= o->d[j].off && (c + 1) * unit <= o->d[j].off + o->d[j].len;
            assert_int_equal(got[c * o->n + j], want ? 1 : 0);
        }
    for (size_t c = 0; c < cells; c++) {
        bool any = false;
        for (size_t j = 0; j < o->n; j++)
            any |= c * unit >= o->d[j].off && (c + 1) * unit <= o->d[j].off + o->d[j].len;
        assert_int_equal(read[c], any ? 1 : 0);
    }
    free(got);
    free(read);
}

/* Random objects: runs on a grid of `unit`, some shared, some duplicated
 * by one worker, some bytes wanted by nobody. */
static object *random_objects(size_t nobj, uint32_t nworkers, uint32_t nnodes, uint64_t unit)
{
    object *o = calloc(nobj, sizeof *o);
    for (size_t i = 0; i < nobj; i++) {
        o[i].size = (1 + rnd() % 64) * unit;
        o[i].src = rnd() % 3 == 0 ? FR_RD_NO_NODE : (uint32_t)(rnd() % nnodes);
        o[i].n = 1 + rnd() % 24;
        o[i].d = calloc(o[i].n, sizeof *o[i].d);
        uint64_t cells = o[i].size / unit;
        for (size_t j = 0; j < o[i].n; j++) {
            uint64_t a = rnd() % cells, b = a + 1 + rnd() % (cells - a);
            if (j && rnd() % 4 == 0) {
                o[i].d[j] = o[i].d[rnd() % j];      /* the same box again */
                o[i].d[j].worker = (uint32_t)(rnd() % nworkers);
            } else {
                o[i].d[j] = (fr_rd_demand){ (uint32_t)(rnd() % nworkers), a * unit, (b - a) * unit };
            }
        }
    }
    return o;
}

static void free_objects(object *o, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(o[i].d);
    free(o);
}

static uint64_t run_all(const fr_rd_config *cfg, const object *o, size_t n, uint64_t unit,
                        fr_rd_summary *sum)
{
    fr_readers *r;
    assert_int_equal(fr_readers_open(cfg, &r), 0);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        const fr_rd_range *g;
        const fr_rd_push *p;
        size_t ng, np;
        assert_int_equal(fr_readers_object(r, o[i].src, o[i].size, o[i].d, o[i].n, &g, &ng, &p, &np), 0);
        if (unit)
            check_object(&o[i], cfg, unit, g, ng, p, np);
        h = canonical(&o[i], g, ng, p, h);
    }
    if (sum)
        fr_readers_summary(r, sum);
    fr_readers_close(r);
    return h;
}

static void test_every_byte_once(void **state)
{
    (void)state;
    enum { W = 12, N = 3, OBJ = 300 };
    uint32_t node[W];
    for (uint32_t w = 0; w < W; w++)
        node[w] = w % N;
    const uint64_t unit = 4096;
    object *o = random_objects(OBJ, W, N, unit);
    for (int mode = 0; mode < 4; mode++) {
        fr_rd_config cfg = { .nworkers = W, .worker_node = node, .nnodes = N,
                             .chunk = mode & 1 ? 8 * unit : 0, .relay = mode & 2 };
        fr_rd_summary s;
        run_all(&cfg, o, OBJ, unit, &s);
        assert_true(s.ranges > 0);
    }
    free_objects(o, OBJ);
}

static void test_bad_input(void **state)
{
    (void)state;
    uint32_t node[2] = { 0, 1 };
    fr_rd_config cfg = { .nworkers = 2, .worker_node = node, .nnodes = 2 };
    fr_readers *r;
    assert_int_equal(fr_readers_open(&cfg, &r), 0);
    const fr_rd_range *g;
    const fr_rd_push *p;
    size_t ng, np;
    fr_rd_demand past = { 0, 10, 8 }, who = { 2, 0, 1 }, ok = { 1, 0, 16 };
    assert_int_equal(fr_readers_object(r, 0, 16, &past, 1, &g, &ng, &p, &np), FERRY_EINVAL);
    assert_int_equal(fr_readers_object(r, 0, 16, &who, 1, &g, &ng, &p, &np), FERRY_EINVAL);
    assert_int_equal(fr_readers_object(r, 5, 16, &ok, 1, &g, &ng, &p, &np), FERRY_EINVAL);
    assert_int_equal(fr_readers_object(r, 1, 16, &ok, 1, &g, &ng, &p, &np), 0);
    assert_int_equal(ng, 1);
    assert_int_equal(np, 0);
    fr_readers_close(r);
    node[1] = 7;
    assert_int_equal(fr_readers_open(&cfg, &r), FERRY_EINVAL);
}

static void test_deterministic_any_order(void **state)
{
    (void)state;
    enum { W = 16, N = 4, OBJ = 200 };
    uint32_t node[W];
    for (uint32_t w = 0; w < W; w++)
        node[w] = w / 4;
    object *o = random_objects(OBJ, W, N, 64);
    fr_rd_config cfg = { .nworkers = W, .worker_node = node, .nnodes = N, .chunk = 256, .relay = true };
    fr_rd_summary s1, s2, s3;
    uint64_t h1 = run_all(&cfg, o, OBJ, 0, &s1), h2 = run_all(&cfg, o, OBJ, 0, &s2);
    assert_true(h1 == h2);
    assert_memory_equal(&s1, &s2, sizeof s1);
    /* shuffle every object's runs: same answer in terms of the runs */
    for (size_t i = 0; i < OBJ; i++)
        for (size_t j = o[i].n; j > 1; j--) {
            size_t k = rnd() % j;
            fr_rd_demand t = o[i].d[j - 1];
            o[i].d[j - 1] = o[i].d[k];
            o[i].d[k] = t;
        }
    uint64_t h3 = run_all(&cfg, o, OBJ, 0, &s3);
    assert_true(h1 == h3);
    assert_memory_equal(&s1, &s3, sizeof s1);
    free_objects(o, OBJ);
}

/* Readers: a consumer, preferably one on the object's own node. */
static void test_reader_prefers_local(void **state)
{
    (void)state;
    uint32_t node[4] = { 0, 0, 1, 1 };
    fr_rd_config cfg = { .nworkers = 4, .worker_node = node, .nnodes = 2, .relay = true };
    fr_readers *r;
    assert_int_equal(fr_readers_open(&cfg, &r), 0);
    fr_rd_demand d[3] = { { 0, 0, 1000 }, { 3, 0, 1000 }, { 1, 500, 500 } };
    const fr_rd_range *g;
    const fr_rd_push *p;
    size_t ng, np;
    assert_int_equal(fr_readers_object(r, 1, 1000, d, 3, &g, &ng, &p, &np), 0);
    assert_int_equal(ng, 2);
    assert_int_equal(d[g[0].reader].worker, 3);   /* the object is on node 1 */
    assert_int_equal(d[g[1].reader].worker, 3);
    /* [500, 1000): to node 0 once (hop 1), forwarded there (hop 2) */
    assert_int_equal(g[1].npush, 2);
    assert_int_equal(p[g[1].push].hop, 1);
    assert_int_equal(p[g[1].push + 1].hop, 2);
    const fr_rd_load *l = fr_readers_loads(r);
    assert_int_equal(l[1].read_in, 0);
    assert_int_equal(l[1].serve_out, 0);
    assert_int_equal(l[1].push_out, 1000);
    assert_int_equal(l[0].push_in, 1000);
    assert_int_equal(l[0].intra, 500);
    fr_readers_close(r);
}

/* 4 nodes x 4 workers, every worker wants every byte (the compatibility
 * demand), objects of 1..40 MiB in the store on no worker node. Each node
 * must take every byte in once: in = total on every node. Out: each piece
 * goes out 3 times (relay) from its reader's node; the greedy puts each
 * piece on the node that ends lowest, so no node exceeds the mean by more
 * than one piece's pushes (3 x chunk). Flat pushes send 12 copies. */
static void test_nic_balance(void **state)
{
    (void)state;
    enum { W = 16, N = 4, OBJ = 64 };
    uint32_t node[W];
    for (uint32_t w = 0; w < W; w++)
        node[w] = w / 4;
    object *o = calloc(OBJ, sizeof *o);
    uint64_t total = 0;
    for (size_t i = 0; i < OBJ; i++) {
        o[i].size = (1 + rnd() % 40) * MIB + rnd() % 4096;
        o[i].src = FR_RD_NO_NODE;
        o[i].n = W;
        o[i].d = calloc(W, sizeof *o[i].d);
        for (uint32_t w = 0; w < W; w++)
            o[i].d[w] = (fr_rd_demand){ w, 0, o[i].size };
        total += o[i].size;
    }
    const uint64_t chunk = 4 * MIB;
    fr_rd_config cfg = { .nworkers = W, .worker_node = node, .nnodes = N, .chunk = chunk, .relay = true };
    fr_rd_summary s;
    run_all(&cfg, o, OBJ, 0, &s);
    fprintf(stderr, "replicated demand, %d nodes: in max %.1f MiB (total %.1f MiB), out max/mean %.4f\n",
            N, (double)s.max_in / MIB, (double)total / MIB, (double)s.max_out / s.mean_out);
    assert_int_equal(s.store_read, total);
    assert_int_equal(s.max_in, total);
    assert_true(s.mean_in == (double)total);
    assert_int_equal(s.pushed_cross, 3 * total);
    assert_true((double)s.max_out <= s.mean_out + 3.0 * chunk);
    assert_true((double)s.max_out / s.mean_out <= 1.05);

    cfg.relay = false;
    run_all(&cfg, o, OBJ, 0, &s);
    fprintf(stderr, "flat: in max/mean %.4f, out max/mean %.4f\n", (double)s.max_in / s.mean_in,
            (double)s.max_out / s.mean_out);
    assert_int_equal(s.pushed_cross, 12 * total);
    free_objects(o, OBJ);
}

/* A large shared object without chunks has one reader and its node carries
 * all the pushes; with 4 MiB chunks the pieces spread over the nodes. */
static void test_chunks_split_fanout(void **state)
{
    (void)state;
    uint32_t node[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
    object o = { .src = FR_RD_NO_NODE, .size = 256 * MIB, .n = 8 };
    o.d = calloc(8, sizeof *o.d);
    for (uint32_t w = 0; w < 8; w++)
        o.d[w] = (fr_rd_demand){ w, 0, o.size };
    fr_rd_config cfg = { .nworkers = 8, .worker_node = node, .nnodes = 8, .relay = true };
    fr_rd_summary whole, cut;
    run_all(&cfg, &o, 1, 0, &whole);
    cfg.chunk = 4 * MIB;
    run_all(&cfg, &o, 1, 0, &cut);
    assert_int_equal(whole.max_out, 7 * o.size);
    assert_int_equal(cut.max_out, 7 * o.size / 8);
    assert_int_equal(cut.ranges, 64);
    free(o.d);
}

/* ---- a subscriber group over two nodes -------------------------------------------------- */

#define NT 4
static const uint64_t shapes[NT][2] = { {1536, 2048}, {512, 512}, {333, 77}, {2, 2} };

static const ftg_model model = { .name = "relay", .prefix = "relay", .nt = NT, .shapes = shapes,
                                  .bits = ftg_bits };

static void rollout_report(const ftg_sub *w, uint64_t want, int rc, const ferry_update_stats *st,
                           uint64_t bad, const ferry_error *err)
{
    ferry_update_node nd[4];
    int nn = ferry_subscriber_nodes(w->sub, nd, 4);
    if (rc == 0 && w->gen == want && nn == 2) {
        printf("OK %llu %llu %llu %llu %llu %d %llu %llu", (unsigned long long)st->bytes_read,
               (unsigned long long)st->group_bytes_read, (unsigned long long)st->bytes_pushed,
               (unsigned long long)st->bytes_received, (unsigned long long)bad,
               fr_subscriber_plan_reused(w->sub), (unsigned long long)st->batches,
               (unsigned long long)st->ranges);
        /* the group's counters, then per node */
        printf(" %llu %llu %u %llu %llu %.1f %.1f", (unsigned long long)st->group_pushed_cross,
               (unsigned long long)st->group_pushed_intra, st->nodes,
               (unsigned long long)st->nic_max_in, (unsigned long long)st->nic_max_out,
               st->nic_mean_in, st->nic_mean_out);
        for (int k = 0; k < nn; k++)
            printf(" %u %u %llu %llu %llu %llu %llu %llu", nd[k].node, nd[k].workers,
                   (unsigned long long)nd[k].store_read, (unsigned long long)nd[k].pushed_in,
                   (unsigned long long)nd[k].pushed_out, (unsigned long long)nd[k].pushed_intra,
                   (unsigned long long)nd[k].nic_in, (unsigned long long)nd[k].nic_out);
        printf("\n");
    } else
        printf("ERR %d %s\n", rc, err->msg);
}

/* A DP replica holding every tensor whole, on logical node `node`, in
 * subscriber group `group`, naming `segment` as its node's store segment
 * (0: unknown). */
static int rollout_main(const char *addr, uint32_t rank, uint32_t world, uint32_t node,
                        const char *group, uint64_t timeout_ms, uint64_t segment)
{
    ferry_subscriber_config sc = { .model = "relay", .rank = rank, .world = world,
                                   .timeout_ms = timeout_ms, .node = node,
                                   .batch_bytes = 1,     /* every read its own batch */
                                   .local_segment = segment };
    snprintf(sc.group, sizeof sc.group, "%s", group);
    ftg_sub w;
    if (ftg_sub_open(&w, &model, addr, &sc, 0, 1) < 0)   /* every tensor whole */
        return 1;
    ftg_sub_serve(&w, rollout_report);
    ftg_sub_close(&w);
    return 0;
}

/* The arguments of rollout_main for a DP4 group over nodes 7 (ranks 0 and
 * 1) and 9 (ranks 2 and 3). */
typedef struct rollout_opts {
    const char *addr, *group, *timeout_ms;
    uint64_t seg7;   /* the segment node 7's workers name as theirs (0: none named) */
} rollout_opts;

static void rollout_args(const void *ctx, int rank, ftg_args *a)
{
    const rollout_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    snprintf(a->buf[1], sizeof a->buf[1], "%d", rank < 2 ? 7 : 9);
    snprintf(a->buf[2], sizeof a->buf[2], "%llu", rank < 2 ? (unsigned long long)o->seg7 : 0ull);
    const char *v[] = { "--rollout", o->addr, a->buf[0], "4", a->buf[1], o->group, o->timeout_ms,
                        o->seg7 ? a->buf[2] : NULL, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* The group's counters a worker printed (after its own figures), checked
 * against what the plan must do for DP4 over two nodes: each published
 * byte read once, sent across once, pushed twice inside nodes (to the
 * reader's neighbour, and forwarded on the other node). node_read gets the
 * plan's store reads per node. */
static void check_counters(const char *p, uint64_t published, uint64_t node_read[2])
{
    unsigned long long cross, intra, max_in, max_out;
    unsigned nodes;
    double mean_in, mean_out;
    int at = 0;
    assert_int_equal(sscanf(p, " %llu %llu %u %llu %llu %lf %lf%n", &cross, &intra, &nodes,
                            &max_in, &max_out, &mean_in, &mean_out, &at), 7);
    assert_int_equal(cross, published);
    assert_int_equal(intra, 2 * published);
    assert_int_equal(nodes, 2);
    unsigned long long in_sum = 0, out_sum = 0, in_max = 0, out_max = 0, cross_out = 0;
    for (int k = 0; k < 2; k++) {
        unsigned id, workers;
        unsigned long long rd, pin, pout, pintra, nin, nout;
        int more = 0;
        p += at;
        assert_int_equal(sscanf(p, " %u %u %llu %llu %llu %llu %llu %llu%n", &id, &workers, &rd,
                                &pin, &pout, &pintra, &nin, &nout, &more), 8);
        at = more;
        assert_int_equal(id, k ? 9 : 7);                 /* ascending real ids */
        assert_int_equal(workers, 2);
        assert_int_equal(nin, rd + pin);                 /* every store read crosses a NIC */
        assert_int_equal(nout, pout);
        node_read[k] = rd;
        in_sum += nin, out_sum += nout, cross_out += pout;
        in_max = nin > in_max ? nin : in_max;
        out_max = nout > out_max ? nout : out_max;
        (void)pintra;
    }
    assert_int_equal(cross_out, published);
    assert_int_equal(max_in, in_max);
    assert_int_equal(max_out, out_max);
    assert_true(mean_in > (double)in_sum / 2 - 1 && mean_in < (double)in_sum / 2 + 1);
    assert_true(mean_out > (double)out_sum / 2 - 1 && mean_out < (double)out_sum / 2 + 1);
}

/* Four DP replicas, two per node (nodes 7 and 9: any ids). Every piece is
 * read once, pushed to the reader's neighbour, sent to the other node once
 * and forwarded there: 3 pushes per byte, and both nodes read. The second
 * generation reuses the first one's plan. The counters every worker
 * reports for the group agree with that: store reads = the union of the
 * demands = the published bytes, one cross-node push and two intra-node
 * ones per byte, per node figures that add up, apply in several batches. */
static void test_subscriber_two_nodes(void **state)
{
    enum { WORLD = 4 };
    ftg_env *e = *state;   /* the master's heartbeat timeout 3 s: node death below */
    const rollout_opts group = { .addr = e->c.addr, .group = "g", .timeout_ms = "20000" };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &group, -1, NULL), 0);
    for (uint64_t g = 1; g <= 3; g++) {
        uint64_t published = 0;
        assert_int_equal(ftg_publish(e->s, &model, g, &published), 0);
        assert_int_equal(ftg_send(e, "update %llu", (unsigned long long)g), 0);
        ftg_collect(e, 30000, -1);
        uint64_t read = 0, pushed = 0, received = 0, node_read[2] = {0}, own_read[2] = {0};
        uint64_t batches = 0;
        char first[1024] = "";
        for (int k = 0; k < WORLD; k++) {
            const char *line = e->line[k];
            assert_int_equal(e->rc[k], 0);
            unsigned long long a, b, c2, d, bad, nb, nr;
            int reused, at = 0;
            if (sscanf(line, "OK %llu %llu %llu %llu %llu %d %llu %llu%n", &a, &b, &c2, &d, &bad,
                       &reused, &nb, &nr, &at) != 8)
                fail_msg("worker %d: %s", k, line);
            assert_int_equal(nb, nr);   /* batch_bytes 1: one read per batch */
            batches += nb;
            /* the group's figures: the same on every worker */
            if (k == 0)
                snprintf(first, sizeof first, "%s", line + at);
            else
                assert_string_equal(line + at, first);
            check_counters(line + at, published, node_read);
            assert_int_equal(bad, 0);
            assert_int_equal(b, published);
            assert_int_equal(reused, g > 1);   /* the same demands: the plan is reused */
            read += a;
            own_read[k / 2] += a;
            pushed += c2;
            received += d;
        }
        fprintf(stderr, "two nodes, generation %llu: published %llu, read %llu (node 7: %llu, "
                "node 9: %llu), pushed %llu\n", (unsigned long long)g, (unsigned long long)published,
                (unsigned long long)read, (unsigned long long)node_read[0],
                (unsigned long long)node_read[1], (unsigned long long)pushed);
        assert_int_equal(read, published);
        assert_int_equal(pushed, 3 * published);
        assert_int_equal(received, 3 * published);
        assert_true(node_read[0] > 0 && node_read[1] > 0);
        assert_int_equal(node_read[0] + node_read[1], published);   /* per node, from the plan */
        assert_int_equal(own_read[0], node_read[0]);   /* what the workers did is what it says */
        assert_int_equal(own_read[1], node_read[1]);
        assert_true(batches > WORLD);   /* some worker pipelined several batches */
    }

    /* A reader whose engine fails part-way through apply (after a few
     * posts: some batches read and pushed, then its reads fail): nobody
     * hangs; every worker it feeds, directly or through a forward on the
     * other node, returns FERRY_EREBUILD (told FAILED, or no word before
     * the timeout) and so does the reader; a worker that returns 0 holds
     * every byte of the generation. The group's timeout is also how long
     * the healthy workers may take to meet at the group's barriers, so it
     * is a generous 10 s: under load a worker can arrive seconds late, and
     * 2 s made a healthy worker fail the demand barrier. */
    const char *fault = getenv("FT_READER_FAULT") ? getenv("FT_READER_FAULT") : "post_fail_after=8";
    int faulty = getenv("FT_READER_FAULTY") ? atoi(getenv("FT_READER_FAULTY")) : 3;
    const rollout_opts failing = { .addr = e->c.addr, .group = "f", .timeout_ms = "10000" };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &failing, faulty, fault), 0);
    assert_int_equal(ftg_publish(e->s, &model, 4, NULL), 0);
    assert_int_equal(ftg_send(e, "update 4"), 0);
    ftg_collect(e, 60000, -1);   /* two barrier timeouts at most, with room */
    int rebuild = 0;
    char want[32];
    snprintf(want, sizeof want, "ERR %d ", FERRY_EREBUILD);
    for (int k = 0; k < WORLD; k++) {
        const char *line = e->line[k];
        int rr = e->rc[k];
        fprintf(stderr, "failing reader, worker %d: %.200s\n", k, line);
        if (rr == 0) {
            unsigned long long a, b, c2, d, bad;
            assert_int_equal(sscanf(line, "OK %llu %llu %llu %llu %llu", &a, &b, &c2, &d, &bad), 5);
            assert_int_equal(bad, 0);
            assert_true(k != faulty);
        } else {
            assert_true(strncmp(line, want, strlen(want)) == 0);
            rebuild++;
        }
    }
    assert_true(rebuild >= 2);   /* the reader and at least one worker it feeds */

    /* A reader *process* killed (SIGKILL) during the update: its
     * completions are slowed (delay_ms) so it is still applying when it
     * dies, right after every demand of the group is in (the exchange is
     * over). Nobody hangs; the workers it fed get FERRY_EREBUILD (or, when
     * the kill came before they reached it, a connection error with their
     * parameters untouched); a worker that returns 0 holds every byte.
     * Its demand being in the store does not mean it reached the demand
     * barrier: a kill in between leaves the others timing out there,
     * also before any parameter is touched. */
    const rollout_opts killed = { .addr = e->c.addr, .group = "k", .timeout_ms = "10000" };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &killed, faulty, "delay_ms=300"), 0);
    assert_int_equal(ftg_publish(e->s, &model, 5, NULL), 0);
    assert_int_equal(ftg_send(e, "update 5"), 0);
    bool exchanged = false;
    for (int i = 0; i < 2000 && !exchanged; i++) {   /* deadline 20 s */
        exchanged = true;
        for (int k = 0; k < WORLD && exchanged; k++) {
            char key[256];
            snprintf(key, sizeof key, "ferry/wk/relay/sub/k/%020d/%d", 5, k);
            ferry_kv_value v = {0};
            exchanged = ferry_kv_get(e->s, key, &v, NULL) == 0;
            ferry_store_free(v.val);
        }
        if (!exchanged) {
            struct timespec ts = { 0, 10 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    assert_true(exchanged);
    ft_proc_kill(&e->w[faulty], SIGKILL);
    ftg_collect(e, 60000, faulty);   /* two barrier timeouts at most, with room */
    rebuild = 0;
    for (int k = 0; k < WORLD; k++) {
        if (k == faulty)
            continue;
        const char *line = e->line[k];
        int rr = e->rc[k];
        fprintf(stderr, "reader killed, worker %d: %.200s\n", k, line);
        if (rr == 0) {
            unsigned long long a, b, c2, d, bad;
            assert_int_equal(sscanf(line, "OK %llu %llu %llu %llu %llu", &a, &b, &c2, &d, &bad), 5);
            assert_int_equal(bad, 0);
        } else if (strstr(line, "cannot reach worker")) {
            /* the kill landed before this worker imported the dead one's
             * region: it failed before touching a parameter, so it stays on
             * its generation (a plain connection error, not EREBUILD) */
            assert_true(strncmp(line, "ERR -111 ", 9) == 0 || strncmp(line, "ERR -104 ", 9) == 0);
            rebuild++;
        } else if (strstr(line, "not every worker of group k arrived")) {
            /* the kill landed between its demand and the demand barrier */
            assert_true(strncmp(line, "ERR -110 ", 9) == 0);
            rebuild++;
        } else {
            assert_true(strncmp(line, want, strlen(want)) == 0);
            rebuild++;
        }
    }
    assert_true(rebuild >= 1);   /* at least one worker it fed */

    /* The node holding a generation dies before the update: prepare fails
     * on every worker (FERRY_ELOST) before any byte moves, and none of them
     * advances. */
    assert_int_equal(ftg_publish(e->s, &model, 6, NULL), 0);
    const rollout_opts lost_node = { .addr = e->c.addr, .group = "n", .timeout_ms = "3000" };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &lost_node, -1, NULL), 0);
    ft_proc_kill(&e->c.node[0], SIGKILL);
    char key[FR_KEY_MAX];
    fr_key_gen_object(key, sizeof key, "relay", 6, 0, 0);   /* trainer rank 0's first object */
    int ex = 1;
    for (int i = 0; i < 2000 && ex != FERRY_ELOST; i++) {   /* deadline 20 s */
        ex = ferry_store_exist(e->s, key, NULL);
        if (ex != FERRY_ELOST) {
            struct timespec ts = { 0, 10 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    assert_int_equal(ex, FERRY_ELOST);
    assert_int_equal(ftg_send(e, "update 6"), 0);
    ftg_collect(e, 30000, -1);
    char lost[32];
    snprintf(lost, sizeof lost, "ERR %d ", FERRY_ELOST);
    for (int k = 0; k < WORLD; k++) {
        const char *line = e->line[k];
        assert_int_equal(e->rc[k], -1);
        fprintf(stderr, "node lost, worker %d: %.200s\n", k, line);
        assert_true(strncmp(line, lost, strlen(lost)) == 0);
    }
}

/* ---- the at-scale model ---------------------------------------------------------------- */

/* Segment locality: the same DP4 group over nodes 7 and 9, the store's
 * only segment named by the workers of node 7 as their node's
 * (local_segment), node 9 naming none. Every tensor lives on node 7, so
 * node 7's workers read every byte, their reads stay inside the node
 * (NIC in of node 7 = 0), and node 9 takes every byte in once, pushed. */
static void test_subscriber_segment_local(void **state)
{
    enum { WORLD = 4 };
    ftg_env *e = *state;
    uint64_t published = 0;
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    ferry_weight_manifest m;
    memset(&m, 0, sizeof m);
    assert_int_equal(ferry_weights_manifest(e->s, "relay", 1, &m, NULL), 0);
    uint64_t seg = m.entries[0].segment;
    assert_true(seg != 0);
    for (size_t i = 0; i < m.n; i++)
        assert_int_equal(m.entries[i].segment, seg);   /* one store node */
    ferry_weight_manifest_free(&m);
    const rollout_opts group = { .addr = e->c.addr, .group = "s", .timeout_ms = "20000", .seg7 = seg };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &group, -1, NULL), 0);
    assert_int_equal(ftg_send(e, "update 1"), 0);
    ftg_collect(e, 30000, -1);
    uint64_t own_read[2] = {0};
    for (int k = 0; k < WORLD; k++) {
        const char *line = e->line[k];
        assert_int_equal(e->rc[k], 0);
        unsigned long long a, b, c2, d, bad, nb, nr, cross, intra, max_in, max_out;
        unsigned nodes;
        double mean_in, mean_out;
        int reused, at = 0, at2 = 0;
        if (sscanf(line, "OK %llu %llu %llu %llu %llu %d %llu %llu%n", &a, &b, &c2, &d, &bad,
                   &reused, &nb, &nr, &at) != 8)
            fail_msg("worker %d: %s", k, line);
        assert_int_equal(bad, 0);
        assert_int_equal(b, published);
        own_read[k / 2] += a;
        const char *p = line + at;
        assert_int_equal(sscanf(p, " %llu %llu %u %llu %llu %lf %lf%n", &cross, &intra, &nodes,
                                &max_in, &max_out, &mean_in, &mean_out, &at2), 7);
        assert_int_equal(cross, published);        /* every byte to node 9 once */
        assert_int_equal(intra, 2 * published);
        assert_int_equal(max_in, published);       /* node 9's pushes in, nothing else */
        assert_int_equal(max_out, published);      /* node 7's pushes out */
        p += at2;
        for (int n = 0; n < 2; n++) {
            unsigned id, workers;
            unsigned long long rd, pin, pout, pintra, nin, nout;
            int more = 0;
            assert_int_equal(sscanf(p, " %u %u %llu %llu %llu %llu %llu %llu%n", &id, &workers, &rd,
                                    &pin, &pout, &pintra, &nin, &nout, &more), 8);
            p += more;
            assert_int_equal(id, n ? 9 : 7);
            if (n == 0) {   /* node 7 holds the segment: it reads everything, locally */
                assert_int_equal(rd, published);
                assert_int_equal(nin, 0);
                assert_int_equal(pin, 0);
                assert_int_equal(nout, published);
            } else {        /* node 9 reads nothing and takes every byte in once */
                assert_int_equal(rd, 0);
                assert_int_equal(nin, published);
                assert_int_equal(pin, published);
                assert_int_equal(nout, 0);
            }
        }
        if (k == 0)
            fprintf(stderr, "segment on node 7: published %llu, %s\n",
                    (unsigned long long)published, line + at);
    }
    assert_int_equal(own_read[0], published);   /* the workers of node 7 read it all */
    assert_int_equal(own_read[1], 0);
}

static double strategy(json_t *root, const char *name, const char *key)
{
    json_t *s = json_object_get(root, name);
    assert_non_null(s);
    json_t *v = json_object_get(s, key);
    assert_non_null(v);
    return json_number_value(v);
}

/* `ferry plan ARGS --json` parsed, or NULL with *status its exit status. */
static json_t *plan_json(const char *args, int *status)
{
    const char *bin = getenv("FERRY_BIN");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s plan %s --json 2>/dev/null", bin && *bin ? bin : "./ferry", args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (*status != 0)
        return NULL;
    json_error_t je;
    json_t *root = json_loads(buf, 0, &je);
    if (!root)
        fprintf(stderr, "not JSON (%s): %s\n", je.text, buf);
    assert_non_null(root);
    return root;
}

/* Units and NICs per node: 100 Gb/s is 12.5 GB/s; two NICs halve the
 * time and the per-NIC bytes. A rate without a unit is refused. */
static void test_plan_model_options(void **state)
{
    (void)state;
    const char *base = "--model qwen3-30b-a3b --src fsdp:16 --dst ep:4,tp:2,dp:2 --gpus-per-node 4";
    char args[512];
    int st;
    snprintf(args, sizeof args, "%s --nic 100gbps", base);
    json_t *a = plan_json(args, &st);
    assert_int_equal(st, 0);
    snprintf(args, sizeof args, "%s --nic 12.5GB/s --nics-per-node 2", base);
    json_t *b = plan_json(args, &st);
    assert_int_equal(st, 0);
    assert_true(strategy(a, "direct", "time_s") > 0);
    assert_true(fabs(strategy(a, "direct", "time_s") - 2 * strategy(b, "direct", "time_s")) < 1e-5);
    assert_true(fabs(strategy(a, "naive", "max_in_bytes") - 2 * strategy(b, "naive", "max_in_bytes")) <= 2);
    assert_true(strategy(a, "direct", "store_read_bytes") == strategy(b, "direct", "store_read_bytes"));
    /* the lower bound is a bound */
    assert_true(strategy(a, "lower_bound", "time_s") <= strategy(a, "direct", "time_s"));
    json_decref(a);
    json_decref(b);
    snprintf(args, sizeof args, "%s --nic 400", base);
    assert_null(plan_json(args, &st));
    assert_int_equal(st, 2);
}

/* --fp8: the same update of FP8 rollouts (both layouts quantized by the
 * default rules) moves about half the bytes: the direct update's store
 * reads and time; so does the plan between the two layouts. */
static void test_plan_model_fp8(void **state)
{
    (void)state;
    const char *base = "--model qwen3-30b-a3b --src fsdp:16 --dst ep:4,tp:2,dp:2 --gpus-per-node 4 "
                       "--nic 100gbps";
    char args[512];
    int st;
    json_t *a = plan_json(base, &st);
    assert_int_equal(st, 0);
    snprintf(args, sizeof args, "%s --fp8", base);
    json_t *b = plan_json(args, &st);
    assert_int_equal(st, 0);
    assert_true(json_is_false(json_object_get(a, "fp8")) && json_is_true(json_object_get(b, "fp8")));
    double mb = json_number_value(json_object_get(b, "model_bytes")) /
                json_number_value(json_object_get(a, "model_bytes"));
    double rd = strategy(b, "direct", "store_read_bytes") / strategy(a, "direct", "store_read_bytes");
    double tm = strategy(b, "direct", "time_s") / strategy(a, "direct", "time_s");
    fprintf(stderr, "qwen3-30b-a3b fsdp:16 -> ep:4,tp:2,dp:2, FP8 / bf16: model bytes %.4f, direct store "
            "reads %.4f, direct time %.4f\n", mb, rd, tm);
    assert_true(mb > 0.45 && mb < 0.55);
    assert_true(rd > 0.45 && rd < 0.55);
    assert_true(tm > 0.4 && tm < 0.6);
    json_decref(a);
    json_decref(b);
    /* the plan between the two layouts too: a scale tensor beside every FP8 weight, half the bytes */
    const char *lay = "--model qwen3-30b-a3b --src fsdp:16 --dst ep:4,tp:2,dp:2 --gpus-per-node 4";
    a = plan_json(lay, &st);
    assert_int_equal(st, 0);
    snprintf(args, sizeof args, "%s --fp8", lay);
    b = plan_json(args, &st);
    assert_int_equal(st, 0);
    double ta = json_number_value(json_object_get(a, "tensors"));
    double tb = json_number_value(json_object_get(b, "tensors"));
    double by = json_number_value(json_object_get(b, "bytes")) / json_number_value(json_object_get(a, "bytes"));
    assert_true(tb > ta && tb < 2 * ta);
    assert_true(by > 0.45 && by < 0.55);
    json_decref(a);
    json_decref(b);
}

static void test_plan_model_cli(void **state)
{
    (void)state;
    int st;
    json_t *root = plan_json("--model kimi-k2 --src fsdp:256 --dst ep:16,tp:8 --gpus-per-node 8 "
                             "--nic 400gbps", &st);
    assert_int_equal(st, 0);
    double direct = strategy(root, "direct", "time_s"), naive = strategy(root, "naive", "time_s");
    double bcast = strategy(root, "broadcast", "time_s"), compat = strategy(root, "compat", "time_s");
    fprintf(stderr, "kimi-k2 fsdp:256 -> ep:16,tp:8 at 400 Gb/s: direct %.3f s, compat %.3f s, "
            "broadcast %.3f s, naive %.3f s\n", direct, compat, bcast, naive);
    assert_true(direct > 0);
    assert_true(direct <= naive);
    assert_true(direct <= bcast);
    assert_true(direct <= compat);
    /* ferry reads each demanded byte once; the naive update once per worker */
    assert_true(strategy(root, "direct", "store_read_bytes") < strategy(root, "naive", "store_read_bytes"));
    json_decref(root);
}

int main(int argc, char **argv)
{
    /* test_subscriber_two_nodes kills the store's node: the master notices in 3 s */
    static const char *const master_hb[] = { "--heartbeat-timeout", "3000", NULL };
    if ((argc == 8 || argc == 9) && !strcmp(argv[1], "--rollout"))
        return rollout_main(argv[2], (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]),
                            (uint32_t)atoi(argv[5]), argv[6], strtoull(argv[7], NULL, 10),
                            argc == 9 ? strtoull(argv[8], NULL, 10) : 0);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_byte_once),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_deterministic_any_order),
        cmocka_unit_test(test_reader_prefers_local),
        cmocka_unit_test(test_nic_balance),
        cmocka_unit_test(test_chunks_split_fanout),
        cmocka_unit_test_prestate_setup_teardown(test_subscriber_two_nodes, ftg_setup, ftg_teardown,
                                                 (void *)master_hb),
        cmocka_unit_test_setup_teardown(test_subscriber_segment_local, ftg_setup, ftg_teardown),
        cmocka_unit_test(test_plan_model_options),
        cmocka_unit_test(test_plan_model_fp8),
        cmocka_unit_test(test_plan_model_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
