/* `ferry-lab bench sparse`: the sparse planner on MoE-layer-shaped tensors
 * (deepseek-v3 / kimi-k2: an expert w1 of moe_inter x hidden = 2048 x 7168,
 * a shared 7168 x 7168 weight) at densities 0.1%, 1% and 5%, against TP-style
 * target boxes (TP ranks split along rows or columns, one node each).
 *
 * Per case, measured in the same run:
 *   plan_s    one ferry_sparse_plan_batch call for every TP box, with the
 *             secondary indexes already built (best of 10 x --reps); the first,
 *             cold call that builds them is plan_cold_s;
 *   scan_s    the same selection by a full scan of nnz: every entry's
 *             coordinates tested against every box (best of --reps);
 *   read_s    ferry_sparse_reader_read for every TP box against a private
 *             store (a master and a node, children of this process): the
 *             index (read by the first rep, from the reader's cache after:
 *             index_gets, index_cache_hits), plan, ranged reads, filtering
 *             and rebasing;
 *   bytes     bytes_read = the entry bytes that read moved (its stats),
 *             bytes_read_plan = the plan's unique reads x entry bytes,
 *             bytes_in_boxes = entries inside the boxes x entry bytes (from
 *             the scan), full_object_bytes = every node reading the whole
 *             object, dense_bytes = the dense bf16 shards of the boxes;
 *   apply     ferry_sparse_apply (scatter_add) of TP rank 0's target-local
 *             result into a dense bf16 shard: entry bytes / s.
 * The object is put with ferry_put_sparse_object and planned from its index
 * as read back from the store. --no-store skips the store: the index is
 * built in memory the way put lays it out (sorted by tile, then element),
 * bytes_read is the plan's, and the apply uses a locally filtered result. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"
#include "cli_opts.h"
#include "demo.h"

typedef struct sp_opts {
    bool json, no_store;
    unsigned reps, tp;
    const char *tile_text;         /* --tile as given (NULL: 128x128) */
    uint64_t tile[2];
    uint64_t seed;
} sp_opts;

typedef struct sp_case_in {
    const char *name;
    uint64_t rows, cols;
    double density;
    int split;                   /* 0: TP along rows, 1: along columns */
} sp_case_in;

typedef struct sp_obj {
    ferry_sparse_index ix;
    int32_t *idx;                /* nnz x 2 */
    uint16_t *val;               /* bf16 */
} sp_obj;

enum { ENTRY_BYTES = 2 * 4 + 2 };    /* i32 row, i32 col, bf16 value */

static uint64_t xs(uint64_t *s)     /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void obj_free(sp_obj *o)
{
    free(o->idx);
    free(o->val);
    ferry_sparse_index_free(&o->ix);   /* tile_coords, tile_ptr and the planner's aux */
    memset(o, 0, sizeof *o);
}

/* Random distinct coordinates at the density, laid out as a sparse object:
 * a sort key (tile, element within the tile) orders them. */
static int obj_build(sp_obj *o, const sp_case_in *c, const sp_opts *op)
{
    memset(o, 0, sizeof *o);
    uint64_t R = c->rows, C = c->cols, tr = op->tile[0], tc = op->tile[1];
    uint64_t gc = (C + tc - 1) / tc, want = (uint64_t)(c->density * (double)(R * C));
    uint64_t *key = malloc((want ? want : 1) * sizeof *key), seed = op->seed ^ (R * 31 + C) ^ want;
    if (!key)
        return -1;
    for (uint64_t i = 0; i < want; i++) {
        uint64_t e = xs(&seed) % (R * C), r = e / C, col = e % C;
        key[i] = ((r / tr) * gc + col / tc) * (tr * tc) + (r % tr) * tc + col % tc;
    }
    qsort(key, want, sizeof *key, u64_cmp);
    uint64_t n = 0;
    for (uint64_t i = 0; i < want; i++)
        if (n == 0 || key[n - 1] != key[i])
            key[n++] = key[i];
    o->idx = malloc(n * 2 * sizeof *o->idx);
    o->val = malloc(n * sizeof *o->val);
    o->ix.tile_coords = malloc((n * 2 + 1) * sizeof(int64_t));
    o->ix.tile_ptr = malloc((n + 2) * sizeof(int64_t));
    if (!o->idx || !o->val || !o->ix.tile_coords || !o->ix.tile_ptr) {
        free(key);
        return -1;
    }
    uint64_t T = 0, last = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t tile = key[i] / (tr * tc), in = key[i] % (tr * tc);
        uint64_t r = tile / gc * tr + in / tc, col = tile % gc * tc + in % tc;
        o->idx[2 * i] = (int32_t)r;
        o->idx[2 * i + 1] = (int32_t)col;
        o->val[i] = 0x3c00 | (uint16_t)(xs(&seed) & 0xff);    /* bf16 around 0.0078 */
        if (tile != last) {
            o->ix.tile_coords[2 * T] = (int64_t)(tile / gc);
            o->ix.tile_coords[2 * T + 1] = (int64_t)(tile % gc);
            o->ix.tile_ptr[T++] = (int64_t)i;
            last = tile;
        }
    }
    o->ix.tile_ptr[T] = (int64_t)n;
    free(key);
    ferry_sparse_desc *d = &o->ix.desc;
    snprintf(d->tensor_id, sizeof d->tensor_id, "%s", c->name);
    d->ndim = 2;
    d->shape[0] = R;
    d->shape[1] = C;
    d->tile[0] = tr;
    d->tile[1] = tc;
    d->base_generation = 1;
    d->delta_generation = 2;
    d->placement = (ferry_sparse_placement){FERRY_SPARSE_REPLICATE, "ep", 0};
    d->apply = FERRY_SPARSE_SCATTER_ADD;
    snprintf(d->index_dtype, sizeof d->index_dtype, "i32");
    snprintf(d->value_dtype, sizeof d->value_dtype, "bf16");
    d->nnz = n;
    d->ntiles = T;
    return 0;
}

static void boxes(const sp_case_in *c, unsigned tp, ferry_sparse_target *t)
{
    uint64_t ext = c->split ? c->cols : c->rows, step = ext / tp;
    for (unsigned i = 0; i < tp; i++) {
        ferry_sparse_target *x = &t[i];
        memset(x, 0, sizeof *x);
        snprintf(x->tensor_id, sizeof x->tensor_id, "%s", c->name);
        x->node = i;
        x->ndim = 2;
        x->offset[c->split] = i * step;
        x->shape[c->split] = i + 1 == tp ? ext - i * step : step;
        x->shape[1 - c->split] = c->split ? c->rows : c->cols;
    }
}

/* The baseline: every entry tested against every box; kept offsets are
 * written out (what a selection must produce). Returns entries in boxes. */
static uint64_t scan(const sp_obj *o, const ferry_sparse_target *t, unsigned nt, uint32_t *out)
{
    uint64_t kept = 0, n = o->ix.desc.nnz;
    for (unsigned k = 0; k < nt; k++) {
        uint64_t r0 = t[k].offset[0], r1 = r0 + t[k].shape[0], c0 = t[k].offset[1], c1 = c0 + t[k].shape[1];
        for (uint64_t i = 0; i < n; i++) {
            uint64_t r = (uint64_t)o->idx[2 * i], c = (uint64_t)o->idx[2 * i + 1];
            if (r >= r0 && r < r1 && c >= c0 && c < c1)
                out[kept++ % n] = (uint32_t)i;
        }
    }
    return kept;
}

/* Target-local entries of box t for the apply. */
static int make_result(const sp_obj *o, const ferry_sparse_target *t, ferry_sparse_result *res)
{
    memset(res, 0, sizeof *res);
    uint64_t n = o->ix.desc.nnz, m = 0;
    res->indices = malloc((n ? n : 1) * 2 * sizeof *res->indices);
    res->values = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!res->indices || !res->values)
        return -1;
    uint16_t *v = res->values;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = (uint64_t)o->idx[2 * i], c = (uint64_t)o->idx[2 * i + 1];
        if (r < t->offset[0] || r >= t->offset[0] + t->shape[0] || c < t->offset[1] ||
            c >= t->offset[1] + t->shape[1])
            continue;
        res->indices[2 * m] = (int64_t)(r - t->offset[0]);
        res->indices[2 * m + 1] = (int64_t)(c - t->offset[1]);
        v[m++] = o->val[i];
    }
    snprintf(res->tensor_id, sizeof res->tensor_id, "%s", t->tensor_id);
    res->ndim = 2;
    res->shape[0] = t->shape[0];
    res->shape[1] = t->shape[1];
    res->base_generation = 1;
    res->delta_generation = 2;
    res->apply = FERRY_SPARSE_SCATTER_ADD;
    snprintf(res->value_dtype, sizeof res->value_dtype, "bf16");
    res->nnz = m;
    return 0;
}

typedef struct sp_result {
    uint64_t nnz, ntiles;
    double plan_s, plan_cold_s, scan_s, read_s, apply_gbps;
    uint64_t bytes_read, bytes_read_plan, bytes_in_boxes, full_object_bytes, dense_bytes;
    uint64_t range_gets, full_gets;
    uint64_t index_gets, index_cache_hits;   /* summed over the reps */
    ferry_sparse_plan_stats st;
} sp_result;

/* scatter_add of r into a dense bf16 shard of its shape, best of reps:
 * entry bytes (ENTRY_BYTES each) applied per second. */
static double apply_gbps(const ferry_sparse_result *r, unsigned reps)
{
    uint16_t *dense = calloc(r->shape[0] * r->shape[1], sizeof *dense);
    double best = 0;
    for (unsigned k = 0; dense && r->nnz && k < reps; k++) {
        ferry_error err = {0};
        double t0 = cli_now();
        int rc = ferry_sparse_apply(r, dense, "bf16", r->base_generation, NULL, &err);
        double dt = cli_now() - t0;
        if (rc < 0) {
            fprintf(stderr, "ferry-lab bench sparse: apply: %s\n", err.msg);
            best = 0;
            break;
        }
        double g = (double)(r->nnz * ENTRY_BYTES) / dt / 1e9;
        best = g > best ? g : best;
    }
    free(dense);
    return best;
}

/* Best-of plans of the TP boxes on ix (the first, cold call apart). */
static int time_plans(ferry_sparse_index *ix, const ferry_sparse_target *t, const sp_opts *op, sp_result *res)
{
    ferry_sparse_index *src[] = {ix};
    ferry_sparse_plan p;
    ferry_error err = {0};
    /* planning is cheap: ten times the reps, best of them */
    for (unsigned r = 0; r <= op->reps * 10; r++) {
        if (ferry_sparse_plan_batch(src, 1, t, op->tp, &p, &err) < 0) {
            fprintf(stderr, "ferry-lab bench sparse: plan: %s\n", err.msg);
            return -1;
        }
        if (r == 0) {
            res->plan_cold_s = p.stats.plan_s;
        } else if (r == 1 || p.stats.plan_s < res->plan_s) {
            res->plan_s = p.stats.plan_s;
            res->st = p.stats;
            res->bytes_read_plan = 0;
            for (size_t k = 0; k < p.nreads; k++)
                res->bytes_read_plan += (p.reads[k].end - p.reads[k].start) * ENTRY_BYTES;
        }
        ferry_sparse_plan_free(&p);
    }
    return 0;
}

/* The store half: put, index read, plans from that index, reads, apply of
 * rank 0's result; the object is removed after. */
static int store_case(ferry_store *s, ferry_sparse_reader *rd, sp_obj *o, const ferry_sparse_target *t,
                      const sp_opts *op, sp_result *res)
{
    ferry_error err = {0};
    char key[512];
    ferry_sparse_desc d = o->ix.desc, got;
    d.ntiles = 0;
    if (ferry_put_sparse_object(s, &d, o->idx, o->val, &got, key, sizeof key, &err) < 0) {
        fprintf(stderr, "ferry-lab bench sparse: put: %s\n", err.msg);
        return -1;
    }
    ferry_sparse_index six;
    memset(&six, 0, sizeof six);
    int rc = ferry_sparse_index_read(s, key, &six, &err);
    if (rc == 0 && (six.desc.ntiles != o->ix.desc.ntiles || six.desc.nnz != o->ix.desc.nnz)) {
        snprintf(err.msg, sizeof err.msg, "the stored index differs from the generated one");
        rc = -1;
    }
    if (rc == 0)
        rc = time_plans(&six, t, op, res);
    ferry_sparse_index_free(&six);
    const char *keys[] = {key};
    for (unsigned r = 0; rc == 0 && r < op->reps; r++) {
        ferry_sparse_result *out = NULL;
        size_t n = 0;
        ferry_sparse_stats st = {0};
        double t0 = cli_now();
        rc = ferry_sparse_reader_read(rd, keys, 1, t, op->tp, NULL, &out, &n, &st, &err);
        double dt = cli_now() - t0;
        res->index_gets += st.index_gets;
        res->index_cache_hits += st.index_cache_hits;
        if (rc == 0 && (r == 0 || dt < res->read_s)) {
            res->read_s = dt;
            res->bytes_read = st.bytes_read;
            res->range_gets = st.unique_range_gets;
            res->full_gets = st.full_indices_values_get_count;
        }
        for (size_t i = 0; rc == 0 && r + 1 == op->reps && i < n; i++)
            if (out[i].target == 0)
                res->apply_gbps = apply_gbps(&out[i], op->reps);
        ferry_sparse_results_free(out, n);
    }
    if (rc < 0)
        fprintf(stderr, "ferry-lab bench sparse: %s\n", err.msg);
    ferry_store_remove(s, key, NULL);
    return rc < 0 ? -1 : 0;
}

static int run_case(ferry_store *s, ferry_sparse_reader *rd, const sp_case_in *c, const sp_opts *op,
                    sp_result *res)
{
    sp_obj o;
    ferry_sparse_target t[64];
    memset(res, 0, sizeof *res);
    if (obj_build(&o, c, op) < 0) {
        obj_free(&o);
        return -1;
    }
    boxes(c, op->tp, t);
    res->nnz = o.ix.desc.nnz;
    res->ntiles = o.ix.desc.ntiles;
    int rc = s ? store_case(s, rd, &o, t, op, res) : time_plans(&o.ix, t, op, res);
    if (rc == 0 && !s) {
        ferry_sparse_result local;
        res->bytes_read = res->bytes_read_plan;
        if (make_result(&o, &t[0], &local) == 0)
            res->apply_gbps = apply_gbps(&local, op->reps);
        free(local.indices);
        free(local.values);
    }
    uint32_t *sel = malloc((res->nnz ? res->nnz : 1) * sizeof *sel);
    if (rc < 0 || !sel) {
        free(sel);
        obj_free(&o);
        return -1;
    }
    uint64_t kept = 0;
    for (unsigned r = 0; r < op->reps; r++) {
        double t0 = cli_now();
        kept = scan(&o, t, op->tp, sel);
        double dt = cli_now() - t0;
        res->scan_s = r == 0 || dt < res->scan_s ? dt : res->scan_s;
    }
    free(sel);
    res->bytes_in_boxes = kept * ENTRY_BYTES;
    res->full_object_bytes = (uint64_t)op->tp * res->nnz * ENTRY_BYTES;
    res->dense_bytes = c->rows * c->cols * 2;
    obj_free(&o);
    return 0;
}

/* "RxC", each side 1..2048. */
static int parse_tile(const char *opt, const char *v, uint64_t tile[2])
{
    char buf[64];
    const char *x = strchr(v, 'x');
    size_t n = x ? (size_t)(x - v) : 0;
    uint64_t r, c;
    if (x && n < sizeof buf) {
        memcpy(buf, v, n);
        buf[n] = 0;
        if (cli_parse_uint(buf, &r) == 0 && cli_parse_uint(x + 1, &c) == 0 && r >= 1 && r <= 2048 &&
            c >= 1 && c <= 2048) {
            tile[0] = r;
            tile[1] = c;
            return 0;
        }
    }
    fprintf(stderr, "ferry-lab: %s wants ROWSxCOLS, each a whole number from 1 to 2048, not '%s'\n", opt, v);
    return -1;
}

static const cli_opt sparse_table[] = {
    CLI_UINT(sp_opts, tp, "tp", "N", 1, 64, "TP ranks: target boxes along rows and along columns (default 8)"),
    CLI_ARG(sp_opts, tile_text, "tile", "RxC", "the tile given to the put, each side 1-2048 (default 128x128)"),
    CLI_UINT(sp_opts, reps, "reps", "N", 1, 100000, "best of N scans, of 10 x N plans (default 5)"),
    CLI_FLAG(sp_opts, no_store, "no-store", "no store: the index built in memory, bytes read the plan's\n(default: a private master and node)"),
    CLI_FLAG(sp_opts, json, "json", "one JSON object on stdout (default: a table)"),
};

static const cli_cmd sparse_cmd = {
    .name = "bench sparse",
    .about = "The sparse planner against a scan of every nonzero, and the reads it plans from the store.",
    .opts = sparse_table,
    .nopts = sizeof sparse_table / sizeof sparse_table[0],
};

static int parse(int argc, char **argv, sp_opts *o)
{
    *o = (sp_opts){.reps = 5, .tp = 8, .tile = {128, 128}, .seed = 0x9e3779b97f4a7c15ull};
    int pr = cli_parse(&sparse_cmd, argc, argv, o, NULL, NULL);
    if (pr == 0 && o->tile_text && parse_tile("--tile", o->tile_text, o->tile) < 0)
        return -1;
    return pr;
}

static void print_case(const sp_opts *op, const sp_case_in *c, const sp_result *r, bool first)
{
    double ratio = r->bytes_in_boxes ? (double)r->bytes_read / (double)r->bytes_in_boxes : 0;
    char b1[32], b2[32], b3[32], b4[32];
    if (op->json) {
        printf("%s{\"tensor\":\"%s\",\"shape\":[%llu,%llu],\"split\":\"%s\",\"density\":%g,"
               "\"nnz\":%llu,\"ntiles\":%llu,\"tiles_hit\":%llu,\"groups_visited\":%llu,"
               "\"ranges\":%llu,\"unique_reads\":%llu,\"plan_s\":%.9f,\"plan_cold_s\":%.9f,"
               "\"scan_s\":%.9f,\"read_s\":%.6f,\"bytes_read\":%llu,\"bytes_read_from\":\"%s\","
               "\"bytes_read_plan\":%llu,\"unique_range_gets\":%llu,\"full_indices_values_get_count\":%llu,"
               "\"index_gets\":%llu,\"index_cache_hits\":%llu,"
               "\"bytes_in_boxes\":%llu,\"full_object_bytes\":%llu,\"dense_bytes\":%llu,"
               "\"read_ratio\":%.4f,\"apply_gbps\":%.4f}",
               first ? "" : ",", c->name, (unsigned long long)c->rows, (unsigned long long)c->cols,
               c->split ? "cols" : "rows", c->density, (unsigned long long)r->nnz, (unsigned long long)r->ntiles,
               (unsigned long long)r->st.tiles_hit, (unsigned long long)r->st.groups_visited,
               (unsigned long long)r->st.ranges, (unsigned long long)r->st.unique_reads, r->plan_s,
               r->plan_cold_s, r->scan_s, r->read_s, (unsigned long long)r->bytes_read,
               op->no_store ? "plan" : "store", (unsigned long long)r->bytes_read_plan,
               (unsigned long long)r->range_gets, (unsigned long long)r->full_gets,
               (unsigned long long)r->index_gets, (unsigned long long)r->index_cache_hits,
               (unsigned long long)r->bytes_in_boxes, (unsigned long long)r->full_object_bytes,
               (unsigned long long)r->dense_bytes, ratio, r->apply_gbps);
        return;
    }
    printf("%-9s %-4s %4.1f%% %8llu %5llu %5llu %6llu %9.2e %9.2e %6.0fx %9.2e %10s %10s %10s %10s %6.3f %6.2f\n",
           c->name, c->split ? "cols" : "rows", c->density * 100, (unsigned long long)r->nnz,
           (unsigned long long)r->ntiles, (unsigned long long)r->st.tiles_hit,
           (unsigned long long)r->st.groups_visited, r->plan_s, r->scan_s, r->plan_s > 0 ? r->scan_s / r->plan_s : 0,
           r->read_s, cli_fmt_size(r->bytes_read, b1, sizeof b1), cli_fmt_size(r->bytes_in_boxes, b2, sizeof b2),
           cli_fmt_size(r->full_object_bytes, b3, sizeof b3), cli_fmt_size(r->dense_bytes, b4, sizeof b4), ratio,
           r->apply_gbps);
}

int cmd_bench_sparse(int argc, char **argv)
{
    sp_opts op;
    int pr = parse(argc, argv, &op);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &sparse_cmd);
    static const char *const names[] = {"expert.w1", "shared"};
    static const uint64_t shapes[][2] = {{2048, 7168}, {7168, 7168}};
    static const double dens[] = {0.001, 0.01, 0.05};
    demo_group g;
    ferry_store *s = NULL;
    ferry_sparse_reader *rd = NULL;   /* every case's reads: each case reads its object reps times */
    uint64_t igets = 0, ihits = 0;
    int rc = 0;
    if (!op.no_store) {
        ferry_store_config cfg;
        if (demo_cluster_start(&g, 512ull << 20, "ferry-lab bench sparse") < 0 || (rc = ferry_store_config_init(&cfg)) < 0)
            goto out;
        snprintf(cfg.master, sizeof cfg.master, "%s", g.addr);
        cfg.lease_ms = 1;   /* each object is removed right after its reads */
        if ((rc = ferry_store_open(&cfg, &s, NULL)) < 0) {
            fprintf(stderr, "ferry-lab bench sparse: store: %s\n", ferry_strerror(rc));
            goto out;
        }
        ferry_sparse_reader_config rcfg;
        ferry_error err = {0};
        if ((rc = ferry_sparse_reader_config_init(&rcfg)) < 0 ||
            (rc = ferry_sparse_reader_open(s, &rcfg, &rd, &err)) < 0) {
            fprintf(stderr, "ferry-lab bench sparse: reader: %s\n", err.msg[0] ? err.msg : ferry_strerror(rc));
            goto out;
        }
    }
    if (!op.json)
        printf("ferry-lab bench sparse: TP%u boxes (one node each), tile %llux%llu, entry %d bytes (i32 x2 + bf16), "
               "read = bytes moved by %s; apply GB/s of entry bytes\n"
               "%-9s %-4s %5s %8s %5s %5s %6s %9s %9s %7s %9s %10s %10s %10s %10s %6s %6s\n",
               op.tp, (unsigned long long)op.tile[0], (unsigned long long)op.tile[1], ENTRY_BYTES,
               op.no_store ? "the plan's unique reads (--no-store)" : "ferry_sparse_reader_read",
               "tensor", "tp", "dens", "nnz", "tiles", "hit", "groups", "plan_s", "scan_s", "scan/pl", "read_s",
               "read", "in_boxes", "full_obj", "dense", "ratio", "apply");
    else
        printf("{\"tp\":%u,\"tile\":[%llu,%llu],\"entry_bytes\":%d,\"cases\":[", op.tp,
               (unsigned long long)op.tile[0], (unsigned long long)op.tile[1], ENTRY_BYTES);
    int n = 0;
    for (int t = 0; t < 2; t++)
        for (int split = 0; split < 2; split++)
            for (int d = 0; d < 3; d++) {
                sp_case_in c = {names[t], shapes[t][0], shapes[t][1], dens[d], split};
                sp_result r;
                if (run_case(s, rd, &c, &op, &r) < 0) {
                    rc = -1;
                    continue;
                }
                igets += r.index_gets;
                ihits += r.index_cache_hits;
                print_case(&op, &c, &r, n++ == 0);
                fflush(stdout);
            }
    if (op.json)
        printf("]}\n");
    else if (s)
        printf("index reads %llu, index cache hits %llu (the reader's, over %u reads of each object)\n",
               (unsigned long long)igets, (unsigned long long)ihits, op.reps);
out:
    ferry_sparse_reader_close(rd);
    ferry_store_close(s);
    if (!op.no_store)
        demo_group_stop(&g);
    return rc < 0 ? 1 : 0;
}
