/* `ferry-lab demo --sparse`: sparse COO weight deltas in the weights path. A
 * local cluster (unless FERRY_MASTER is set), trainer processes and rollout
 * processes in EP x TP over MoE-shaped tensors: routed experts owned by one
 * EP rank (OWNER), attention and a shared expert replicated across EP
 * (REPLICATE), TP splitting rows (column-parallel) or columns
 * (row-parallel). The trainers publish a dense base generation through the
 * weights backend (ferry_publish, bf16) that the rollouts load once
 * (parameter-direct, their own boxes); then every generation the trainers
 * compute the next weights, put delta = W_next - W_cur (the changed entries)
 * as one sparse object per tensor (replicated tensors: the one rank
 * ferry_sparse_admit admits), and the rollouts read their target-local
 * results (ferry_sparse_reader_read over their boxes), apply them behind
 * the base fence (a stale generation is refused first, changing nothing) and
 * compare every byte with the new weights they compute on their own.
 *
 * Weights are small integers (|w| <= 50) and deltas their differences, so
 * bf16 holds every value and every sum exactly. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "lab.h"
#include "demo.h"
#include "cli_opts.h"
#include "ferry/sparse.h"

typedef struct sp_spec {
    unsigned hidden, ffn, experts, ep, tp, layers, trainers, gens;
    uint64_t tile;            /* 0: the library's choice */
    uint32_t ppm;             /* delta density, entries per million */
    bool json;
} sp_spec;

typedef struct sp_tensor {
    char name[96];                              /* published name */
    char id[FERRY_SPARSE_ID_MAX + 1];           /* sparse tensor id: "<model>.<name>" */
    uint64_t rows, cols, seed;
    int owner;                                  /* EP rank owning it; -1: replicated */
    int putter;                                 /* trainer putting an owned tensor */
    bool split_cols;                            /* TP splits columns (else rows) */
} sp_tensor;

/* ---- the model and its weights --------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float w_base(const sp_tensor *t, uint64_t i)
{
    return (float)((int)(mix(t->seed ^ i) % 101) - 50);
}

/* Whether element i takes a new value at generation g (>= 2), and which. */
static bool w_next(const sp_tensor *t, uint64_t g, uint64_t i, uint32_t ppm, float *v)
{
    uint64_t h = mix(t->seed + g * 0xd1b54a32d192ed03ull + mix(i));
    if (h % 1000000 >= ppm)
        return false;
    *v = (float)((int)((h >> 32) % 101) - 50);
    return true;
}

static sp_tensor *sp_model(const char *model, const sp_spec *m, size_t *n)
{
    *n = (size_t)m->layers * (4 + 2 * m->experts);
    sp_tensor *t = calloc(*n, sizeof *t);
    if (!t)
        return NULL;
    size_t k = 0;
    uint64_t H = m->hidden, F = m->ffn;
    for (unsigned l = 0; l < m->layers; l++) {
        struct { const char *fmt; uint64_t r, c; bool cols; } rep[] = {
            { "layers.%u.attn.qkv", 3 * H, H, false }, { "layers.%u.attn.o", H, H, true },
            { "layers.%u.mlp.shared_expert.w1", F, H, false },
            { "layers.%u.mlp.shared_expert.w2", H, F, true },
        };
        for (int i = 0; i < 4; i++, k++) {
            snprintf(t[k].name, sizeof t[k].name, rep[i].fmt, l);
            t[k].rows = rep[i].r, t[k].cols = rep[i].c, t[k].split_cols = rep[i].cols;
            t[k].owner = -1;
        }
        for (unsigned e = 0; e < m->experts; e++)
            for (int w = 0; w < 2; w++, k++) {
                snprintf(t[k].name, sizeof t[k].name, "layers.%u.mlp.experts.%u.w%d", l, e, w + 1);
                t[k].rows = w ? H : F, t[k].cols = w ? F : H, t[k].split_cols = w == 1;
                t[k].owner = (int)(e / (m->experts / m->ep));
                t[k].putter = (int)(e % m->trainers);
            }
    }
    for (size_t i = 0; i < *n; i++) {
        snprintf(t[i].id, sizeof t[i].id, "%s.%s", model, t[i].name);
        uint64_t h = 1469598103934665603ull;
        for (const char *c = t[i].name; *c; c++)
            h = (h ^ (uint8_t)*c) * 1099511628211ull;
        t[i].seed = h;
        /* published under its sparse id: a sparse generation's tensors are
         * the dense generation's names (sparse keys carry no model) */
        snprintf(t[i].name, sizeof t[i].name, "%.95s", t[i].id);
    }
    return t;
}

/* "H,F,E,EP,TP,LAYERS,TRAINERS,TILE,PPM" <-> spec (what the children get). */
static void spec_str(const sp_spec *m, char *buf, size_t cap)
{
    snprintf(buf, cap, "%u,%u,%u,%u,%u,%u,%u,%" PRIu64 ",%" PRIu32, m->hidden, m->ffn, m->experts,
             m->ep, m->tp, m->layers, m->trainers, m->tile, m->ppm);
}

static int spec_parse(const char *s, sp_spec *m)
{
    memset(m, 0, sizeof *m);
    return sscanf(s, "%u,%u,%u,%u,%u,%u,%u,%" SCNu64 ",%" SCNu32, &m->hidden, &m->ffn, &m->experts,
                  &m->ep, &m->tp, &m->layers, &m->trainers, &m->tile, &m->ppm) == 9 ? 0 : -1;
}

/* The boxes a rollout (ep, tp index) holds: every replicated tensor and its
 * own experts, TP splitting rows or columns. idx[] names the tensor. */
static size_t sp_targets(const sp_tensor *t, size_t n, const sp_spec *m, unsigned rank,
                         ferry_sparse_target *out, size_t *idx)
{
    unsigned ep = rank / m->tp, ti = rank % m->tp;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].owner >= 0 && (unsigned)t[i].owner != ep)
            continue;
        ferry_sparse_target *g = &out[k];
        memset(g, 0, sizeof *g);
        snprintf(g->tensor_id, sizeof g->tensor_id, "%s", t[i].id);
        g->axis_index = ep;
        g->ndim = 2;
        g->shape[0] = t[i].rows, g->shape[1] = t[i].cols;
        int d = t[i].split_cols ? 1 : 0;
        g->shape[d] /= m->tp;
        g->offset[d] = ti * g->shape[d];
        idx[k++] = i;
    }
    return k;
}

/* The children answer on stdout ("ERR ..."), the parent complains on stderr. */
static ferry_store *sp_open(const char *addr, FILE *say)
{
    ferry_error fe = {0};
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.lease_ms = 1;
    ferry_store *s = NULL;
    if (ferry_store_open(&cfg, &s, &fe) < 0) {
        fprintf(say, "%scannot reach the master at %s: %s\n", say == stdout ? "ERR " : "ferry-lab demo sparse: ",
                addr, fe.msg);
        fflush(say);
        return NULL;
    }
    return s;
}

/* A sparse reader of s with the default cache: each process that reads
 * sparse objects owns one for its life. */
static ferry_sparse_reader *sp_reader(ferry_store *s, FILE *say)
{
    ferry_sparse_reader_config cfg;
    ferry_sparse_reader *r = NULL;
    ferry_error err = {0};
    int rc = ferry_sparse_reader_config_init(&cfg);
    if (rc == 0)
        rc = ferry_sparse_reader_open(s, &cfg, &r, &err);
    if (rc < 0) {
        fprintf(say, "%scannot open a sparse reader: %s\n", say == stdout ? "ERR " : "ferry-lab demo sparse: ",
                err.msg[0] ? err.msg : ferry_strerror(rc));
        fflush(say);
    }
    return r;
}

/* The keys every trainer put for generation g (dir/keys-G-RANK). */
static char **sp_keys(const char *dir, uint64_t g, unsigned trainers, size_t *n)
{
    size_t cap = 64;
    char **k = malloc(cap * sizeof *k), line[700];
    *n = 0;
    for (unsigned r = 0; k && r < trainers; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/keys-%" PRIu64 "-%u", dir, g, r);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (*n == cap) {
                char **k2 = realloc(k, (cap *= 2) * sizeof *k);
                if (!k2)
                    break;
                k = k2;
            }
            k[(*n)++] = strdup(line);
        }
        if (f)
            fclose(f);
    }
    return k;
}

static void sp_keys_free(char **k, size_t n)
{
    for (size_t i = 0; k && i < n; i++)
        free(k[i]);
    free(k);
}

/* ---- trainer ---------------------------------------------------------------------------- */

/* Compute generation g from the weights in w (advanced in place) and put
 * this rank's share of the deltas. */
static int trainer_delta(ferry_store *s, const sp_spec *m, const sp_tensor *t, size_t n, float **w,
                         unsigned rank, uint64_t g, FILE *keys, uint64_t out[4], ferry_error *err)
{
    uint64_t cap = 0;
    int32_t *idx = NULL;
    float *dv = NULL;
    uint16_t *bv = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint64_t nnz = 0, elems = t[i].rows * t[i].cols;
        for (uint64_t e = 0; e < elems; e++) {
            float v;
            if (!w_next(&t[i], g, e, m->ppm, &v) || v == w[i][e])
                continue;
            if (nnz == cap) {
                cap = cap ? cap * 2 : 4096;
                int32_t *i2 = realloc(idx, cap * 2 * sizeof *idx);
                float *d2 = realloc(dv, cap * sizeof *dv);
                uint16_t *b2 = realloc(bv, cap * sizeof *bv);
                idx = i2 ? i2 : idx, dv = d2 ? d2 : dv, bv = b2 ? b2 : bv;
                if (!i2 || !d2 || !b2) {
                    rc = FERRY_ENOMEM;
                    break;
                }
            }
            idx[2 * nnz] = (int32_t)(e / t[i].cols);
            idx[2 * nnz + 1] = (int32_t)(e % t[i].cols);
            dv[nnz++] = v - w[i][e];
            w[i][e] = v;
        }
        if (rc < 0 || nnz == 0)
            continue;
        ferry_sparse_desc d = { .ndim = 2, .shape = { t[i].rows, t[i].cols },
                                .base_generation = g - 1, .delta_generation = g,
                                .apply = FERRY_SPARSE_SCATTER_ADD, .nnz = nnz };
        snprintf(d.tensor_id, sizeof d.tensor_id, "%s", t[i].id);
        snprintf(d.index_dtype, sizeof d.index_dtype, "i32");
        snprintf(d.value_dtype, sizeof d.value_dtype, "bf16");
        snprintf(d.placement.axis, sizeof d.placement.axis, "ep");
        d.placement.kind = t[i].owner >= 0 ? FERRY_SPARSE_OWNER : FERRY_SPARSE_REPLICATE;
        d.placement.owner = t[i].owner >= 0 ? (uint32_t)t[i].owner : 0;
        if (m->tile)
            for (int k = 0; k < 2; k++)
                d.tile[k] = m->tile < d.shape[k] ? m->tile : d.shape[k];
        bool mine = t[i].owner >= 0 && (unsigned)t[i].putter == rank;
        if (t[i].owner < 0 && (rc = ferry_sparse_admit(s, &d, rank, &mine, err)) < 0)
            break;
        if (!mine) {
            out[1] += t[i].owner < 0;   /* told to skip */
            continue;
        }
        ferry_convert(dv, "f32", bv, "bf16", nnz);
        char key[600];
        ferry_sparse_desc st;
        if ((rc = ferry_put_sparse_object(s, &d, idx, bv, &st, key, sizeof key, err)) < 0)
            break;
        fprintf(keys, "%s\n", key);
        out[0]++;
        out[2] += st.nnz;
        out[3] += st.nnz * (2 * 4 + 2);
    }
    free(idx);
    free(dv);
    free(bv);
    return rc;
}

/* argv: worker sparse-trainer MASTER RANK MODEL DIR SPEC. Commands: "base"
 * (publish generation 1 dense: "OK s bytes"), "delta G" ("OK s puts skipped
 * nnz bytes"). */
static int demo_sparse_trainer_main(int argc, char **argv)
{
    sp_spec m;
    if (argc != 6 || spec_parse(argv[5], &m) < 0)
        return 2;
    const char *addr = argv[1], *model = argv[3], *dir = argv[4];
    unsigned rank = (unsigned)atoi(argv[2]);
    size_t n;
    sp_tensor *t = sp_model(model, &m, &n);
    float **w = t ? calloc(n, sizeof *w) : NULL;
    ferry_store *s = w ? sp_open(addr, stdout) : NULL;
    if (!s)
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (!(w[i] = malloc(t[i].rows * t[i].cols * sizeof **w))) {
            printf("ERR trainer %u: out of memory\n", rank);
            return 1;
        }
        for (uint64_t e = 0; e < t[i].rows * t[i].cols; e++)
            w[i][e] = w_base(&t[i], e);
    }
    printf("READY\n");
    fflush(stdout);
    char line[128];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, stdin)) {
        ferry_error err = {0};
        double t0 = cli_now();
        unsigned long long g;
        if (!strncmp(line, "base", 4)) {
            uint32_t *nodes = calloc(m.trainers, sizeof *nodes);
            ferry_weight_tensor *wt = calloc(n, sizeof *wt);
            for (size_t i = 0; wt && i < n; i++)
                wt[i] = (ferry_weight_tensor){ .name = t[i].name, .dtype = "f32", .ndim = 2,
                                               .shape = { t[i].rows, t[i].cols }, .data = w[i] };
            ferry_publisher_config pc = { .rank = rank, .world = m.trainers, .rank_node = nodes,
                                          .timeout_ms = FERRY_DEFAULT_TIMEOUT_MS };
            snprintf(pc.model, sizeof pc.model, "%s", model);
            snprintf(pc.out_dtype, sizeof pc.out_dtype, "bf16");
            ferry_publish_stats ps;
            memset(&ps, 0, sizeof ps);
            rc = nodes && wt ? ferry_publish(s, &pc, 1, wt, n, &ps, &err) : FERRY_ENOMEM;
            if (rc == 0)
                printf("OK %.6f %" PRIu64 "\n", cli_now() - t0, ps.bytes);
            free(nodes);
            free(wt);
        } else if (sscanf(line, "delta %llu", &g) == 1 && g >= 2) {
            char path[256];
            snprintf(path, sizeof path, "%s/keys-%llu-%u", dir, g, rank);
            FILE *keys = fopen(path, "w");
            uint64_t out[4] = { 0 };
            rc = keys ? trainer_delta(s, &m, t, n, w, rank, g, keys, out, &err) : FERRY_EIO;
            if (keys)
                fclose(keys);
            if (rc == 0)
                printf("OK %.6f %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", cli_now() - t0,
                       out[0], out[1], out[2], out[3]);
        } else {
            rc = FERRY_EINVAL;
            snprintf(err.msg, sizeof err.msg, "unknown command %.60s", line);
        }
        if (rc < 0)
            printf("ERR trainer %u: %s\n", rank, err.msg[0] ? err.msg : ferry_strerror(rc));
        fflush(stdout);
    }
    for (size_t i = 0; i < n; i++)
        free(w[i]);
    free(w);
    free(t);
    ferry_store_close(s);
    return rc == 0 ? 0 : 1;
}

/* ---- rollout ----------------------------------------------------------------------------- */

typedef struct ro_state {
    ferry_sparse_reader *rd;     /* the generations' reads */
    ferry_sparse_target *tg;
    size_t *tix, nt;
    uint16_t **buf;              /* bf16 parameters, one box each */
    float **want;                /* the weights computed here, f32 */
    uint16_t *tmp;
    uint64_t gen, dense_bytes, maxel;
} ro_state;

/* Advance the expected weights of every box to generation g (1: the base)
 * and count the elements whose bf16 bytes differ from the parameters. */
static uint64_t ro_check(ro_state *r, const sp_tensor *t, uint32_t ppm, uint64_t g)
{
    uint64_t wrong = 0;
    for (size_t k = 0; k < r->nt; k++) {
        const sp_tensor *x = &t[r->tix[k]];
        const ferry_sparse_target *b = &r->tg[k];
        uint64_t el = b->shape[0] * b->shape[1];
        for (uint64_t j = 0; j < el; j++) {
            uint64_t row = b->offset[0] + j / b->shape[1], col = b->offset[1] + j % b->shape[1];
            uint64_t e = row * x->cols + col;
            float v;
            if (g == 1)
                r->want[k][j] = w_base(x, e);
            else if (w_next(x, g, e, ppm, &v))
                r->want[k][j] = v;
        }
        ferry_convert(r->want[k], "f32", r->tmp, "bf16", el);
        for (uint64_t j = 0; j < el; j++)
            wrong += r->tmp[j] != r->buf[k][j];
    }
    return wrong;
}

/* Read the generation's results, refuse a stale base once (nothing may
 * change), apply, check. Reply "OK read_s apply_s" then the counters. */
static int ro_apply(ferry_store *s, ro_state *r, const sp_tensor *t, const sp_spec *m,
                    const char *model, uint64_t g, ferry_error *err)
{
    size_t nres = 0;
    ferry_sparse_result *res = NULL;
    ferry_sparse_stats st;
    memset(&st, 0, sizeof st);
    double t0 = cli_now();
    /* what the registry says this rollout needs: the one delta r->gen -> g */
    ferry_sparse_chain ch;
    int rc = ferry_sparse_chain_resolve(s, model, r->gen, &ch, err);
    if (rc == 0 && (ch.load_dense || ch.nlinks != 1 || ch.links[0].generation != g)) {
        snprintf(err->msg, sizeof err->msg, "the registry gives generation %" PRIu64 " a chain of %zu "
                 "deltas to %" PRIu64 "%s, not the delta to %" PRIu64, r->gen, ch.nlinks, ch.active,
                 ch.load_dense ? " after a dense load" : "", g);
        rc = FERRY_ESTATE;
    }
    if (rc == 0)
        rc = ferry_sparse_reader_read(r->rd, (const char *const *)ch.links[0].keys, ch.links[0].nkeys,
                                      r->tg, r->nt, NULL, &res, &nres, &st, err);
    ferry_sparse_chain_free(&ch);
    if (rc < 0)
        return rc;
    double t1 = cli_now();
    /* the fence: the delta g-1 -> g on a buffer said to hold g-2 */
    uint64_t fence_ok = 0;
    for (size_t i = 0; i < nres && !fence_ok; i++) {
        if (!res[i].nnz)
            continue;
        size_t k = res[i].target;
        uint64_t el = r->tg[k].shape[0] * r->tg[k].shape[1];
        memcpy(r->tmp, r->buf[k], el * 2);
        ferry_error e2 = {0};
        int f = ferry_sparse_apply(&res[i], r->buf[k], "bf16", g - 2, NULL, &e2);
        fence_ok = f == FERRY_ESTATE && memcmp(r->tmp, r->buf[k], el * 2) == 0 ? 1 : 2;
    }
    double t2 = cli_now();
    for (size_t i = 0; i < nres && rc == 0; i++) {
        uint64_t ng = 0;
        rc = ferry_sparse_apply(&res[i], r->buf[res[i].target], "bf16", r->gen, &ng, err);
        if (rc == 0 && ng != g)
            rc = FERRY_ESTATE;
    }
    double apply_s = cli_now() - t2;
    ferry_sparse_results_free(res, nres);
    if (rc < 0)
        return rc;
    r->gen = g;
    uint64_t wrong = ro_check(r, t, m->ppm, g);
    printf("OK %.6f %.6f %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
           " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
           " %" PRIu64 " %zu %.6f %" PRIu64 " %" PRIu64 " %.6f %" PRIu64 " %" PRIu64 " %.6f %.6f\n",
           t1 - t0, apply_s, st.bytes_read, r->dense_bytes,
           st.entries_read, st.entries_kept, st.unique_range_gets, st.dedup_hits,
           st.full_indices_values_get_count, st.source_objects, st.non_ep_source_object_count,
           st.index_gets, st.index_cache_hits, st.boundary_filtered, wrong, fence_ok, nres,
           st.plan_s, st.index_checks, st.index_bytes_read, st.index_s, st.index_range_bytes,
           st.value_range_bytes, st.index_range_s, st.value_range_s);
    return 0;
}

/* argv: worker sparse-rollout MASTER RANK MODEL DIR SPEC. Commands: "load"
 * (the base, dense, into its boxes: "OK s bytes wrong"), "apply G". */
static int demo_sparse_rollout_main(int argc, char **argv)
{
    sp_spec m;
    if (argc != 6 || spec_parse(argv[5], &m) < 0)
        return 2;
    const char *addr = argv[1], *model = argv[3];
    unsigned rank = (unsigned)atoi(argv[2]);
    size_t n;
    sp_tensor *t = sp_model(model, &m, &n);
    ro_state r = { 0 };
    r.tg = t ? calloc(n, sizeof *r.tg) : NULL;
    r.tix = calloc(n, sizeof *r.tix);
    ferry_store *s = r.tg && r.tix ? sp_open(addr, stdout) : NULL;
    if (s && !(r.rd = sp_reader(s, stdout))) {
        ferry_store_close(s);
        s = NULL;
    }
    if (!s)
        return 1;
    r.nt = sp_targets(t, n, &m, rank, r.tg, r.tix);
    r.buf = calloc(r.nt, sizeof *r.buf);
    r.want = calloc(r.nt, sizeof *r.want);
    ferry_param_shard *sh = calloc(r.nt, sizeof *sh);
    bool ok = r.buf && r.want && sh;
    for (size_t k = 0; ok && k < r.nt; k++) {
        uint64_t el = r.tg[k].shape[0] * r.tg[k].shape[1];
        r.maxel = el > r.maxel ? el : r.maxel;
        r.dense_bytes += el * 2;
        ok = (r.buf[k] = calloc(el, 2)) && (r.want[k] = calloc(el, sizeof(float)));
        sh[k] = (ferry_param_shard){ .tensor = t[r.tix[k]].name, .ndim = 2,
                                     .offset = { r.tg[k].offset[0], r.tg[k].offset[1] },
                                     .shape = { r.tg[k].shape[0], r.tg[k].shape[1] },
                                     .dst = r.buf[k] };
    }
    if (!ok || !(r.tmp = malloc(r.maxel * 2))) {
        printf("ERR rollout %u: out of memory\n", rank);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);
    char line[128];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, stdin)) {
        ferry_error err = {0};
        unsigned long long g;
        if (!strncmp(line, "load", 4)) {
            double t0 = cli_now();
            ferry_update_stats us;
            memset(&us, 0, sizeof us);
            uint64_t gen = 0;
            rc = ferry_weights_update_direct(s, model, &gen, sh, r.nt, &us, &err);
            double secs = cli_now() - t0;
            if (rc == 0) {
                r.gen = gen;
                uint64_t wrong = gen == 1 ? ro_check(&r, t, m.ppm, 1) : UINT64_MAX;
                printf("OK %.6f %" PRIu64 " %" PRIu64 "\n", secs, us.bytes_read, wrong);
            }
        } else if (sscanf(line, "apply %llu", &g) == 1 && g >= 2) {
            rc = ro_apply(s, &r, t, &m, model, g, &err);
        } else if (!strncmp(line, "join", 4)) {
            /* a fresh worker (a restart): empty boxes, generation 0, and the
             * registry's rule to the active generation */
            for (size_t k = 0; k < r.nt; k++)
                memset(r.buf[k], 0, r.tg[k].shape[0] * r.tg[k].shape[1] * 2);
            ferry_sparse_update_config uc = { .axis_index = rank / m.tp };
            snprintf(uc.model, sizeof uc.model, "%s", model);
            ferry_sparse_update_stats us;
            uint64_t gen = 0;
            double t0 = cli_now();
            rc = ferry_sparse_update(s, &uc, sh, r.nt, &gen, &us, &err);
            double secs = cli_now() - t0;
            if (rc == 0) {
                uint64_t wrong = gen == r.gen ? ro_check(&r, t, m.ppm, gen) : UINT64_MAX;
                printf("OK %.6f %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %"
                       PRIu64 "\n", secs, gen, us.dense_generation, us.dense_bytes, us.deltas,
                       us.read.bytes_read, wrong);
            }
        } else {
            rc = FERRY_EINVAL;
            snprintf(err.msg, sizeof err.msg, "unknown command %.60s", line);
        }
        if (rc < 0)
            printf("ERR rollout %u: %s\n", rank, err.msg[0] ? err.msg : ferry_strerror(rc));
        fflush(stdout);
    }
    for (size_t k = 0; k < r.nt; k++) {
        free(r.buf[k]);
        free(r.want[k]);
    }
    free(r.buf);
    free(r.want);
    free(r.tmp);
    free(r.tg);
    free(r.tix);
    free(sh);
    free(t);
    ferry_sparse_reader_close(r.rd);
    ferry_store_close(s);
    return rc == 0 ? 0 : 1;
}

/* ---- the parent --------------------------------------------------------------------------- */

/* What the table stores: the spec, and the options it is derived from
 * (--rollouts: TP = rollouts / EP; --density: ppm). */
typedef struct sp_args {
    sp_spec s;
    unsigned rollouts;
    double density;
} sp_args;

static const cli_opt sp_table[] = {
    CLI_UINT(sp_args, rollouts, "rollouts", "N", 1, 64, "rollout processes, EP x TP (default 4)"),
    CLI_UINT(sp_args, s.ep, "ep", "N", 1, 64, "expert-parallel degree (default 2)"),
    CLI_UINT(sp_args, s.trainers, "trainers", "N", 1, 64, "trainer processes (default 2)"),
    CLI_UINT(sp_args, s.gens, "generations", "N", 1, 64, "delta generations (default 3)"),
    /* at least one entry per million: the children count in ppm */
    CLI_DOUBLE(sp_args, density, "density", "FRACTION", 1e-6, 1,
               "the deltas' density (default 0.01)"),
    CLI_UINT(sp_args, s.hidden, "hidden", "N", 1, 16384, "hidden size (default 512)"),
    CLI_UINT(sp_args, s.ffn, "ffn", "N", 1, 65536, "FFN size (default 1024)"),
    CLI_UINT(sp_args, s.experts, "experts", "N", 1, 256, "experts (default 8)"),
    CLI_UINT(sp_args, s.layers, "layers", "N", 1, 64, "MoE layers (default 1)"),
    /* larger is cut to the shape */
    CLI_UINT(sp_args, s.tile, "tile", "N", 0, 65536, "COO tile (default 0: the library's choice)"),
    CLI_FLAG(sp_args, s.json, "json", "one JSON object on stdout (default: text)"),
};

static const cli_cmd sp_cmd = {
    .name = "demo --sparse",
    .about = "Trainers publish a dense base generation and sparse COO delta generations of an MoE\n"
             "layer; EP x TP rollouts read only the entries of their own boxes and apply them.",
    .opts = sp_table,
    .nopts = sizeof sp_table / sizeof sp_table[0],
};

static int parse_sparse(int argc, char **argv, sp_spec *o)
{
    sp_args a = { .s = { .hidden = 512, .ffn = 1024, .experts = 8, .ep = 2, .tp = 0, .layers = 1,
                         .trainers = 2, .gens = 3 },
                  .rollouts = 4, .density = 0.01 };
    /* --sparse is the form's own word (in the usage's name), wherever it stands */
    char **args = malloc(((size_t)argc + 1) * sizeof *args);
    if (!args)
        return -1;
    int n = 0;
    for (int i = 0; i < argc; i++)
        if (i == 0 || strcmp(argv[i], "--sparse"))
            args[n++] = argv[i];
    args[n] = NULL;
    int pr = cli_parse(&sp_cmd, n, args, &a, NULL, NULL);
    free(args);
    if (pr != 0)
        return pr;
    *o = a.s;
    o->ppm = (uint32_t)(a.density * 1e6 + 0.5);
    unsigned rollouts = a.rollouts;
    if (rollouts % o->ep) {
        fprintf(stderr, "ferry-lab: --rollouts %u is not a multiple of --ep %u\n", rollouts, o->ep);
        return -1;
    }
    o->tp = rollouts / o->ep;
    if (o->experts % o->ep) {
        fprintf(stderr, "ferry-lab: --experts %u is not a multiple of --ep %u\n", o->experts, o->ep);
        return -1;
    }
    if (o->hidden % o->tp || o->ffn % o->tp) {
        fprintf(stderr, "ferry-lab: --hidden %u and --ffn %u must be multiples of TP = --rollouts / --ep = %u\n",
                o->hidden, o->ffn, o->tp);
        return -1;
    }
    return rollouts >= 1 && rollouts <= 64 && o->trainers >= 1 && o->trainers <= 64 &&
                   o->gens >= 1 && o->gens <= 64 && o->layers >= 1 && o->layers <= 64 &&
                   o->experts >= o->ep && o->experts % o->ep == 0 && o->experts <= 256 &&
                   o->hidden >= o->tp && o->hidden % o->tp == 0 && o->ffn % o->tp == 0 &&
                   o->ffn >= o->tp && o->hidden <= 16384 && o->ffn <= 65536 && o->ppm >= 1
               ? 0 : -1;
}

/* Send cmd to every child, collect every reply line; false on any ERR. */
static bool sp_round(child *cs, unsigned n, const char *cmd, char (*lines)[512], char *err,
                     size_t cap)
{
    for (unsigned i = 0; i < n; i++) {
        fprintf(cs[i].in, "%s\n", cmd);
        fflush(cs[i].in);
    }
    bool ok = true;
    for (unsigned i = 0; i < n; i++)
        if (demo_child_line(&cs[i], lines[i], sizeof lines[i]) < 0) {
            if (ok)
                snprintf(err, cap, "%.250s", lines[i]);
            ok = false;
        }
    return ok;
}

enum { C_READ_S, C_APPLY_S, C_BYTES, C_DENSE, C_EREAD, C_EKEPT, C_RANGES, C_DEDUP, C_FULL,
       C_SOURCES, C_NONEP, C_IGETS, C_IHITS, C_BFILT, C_WRONG, C_FENCE, C_RESULTS, C_PLAN_S,
       C_ICHECKS, C_IBYTES, C_INDEX_S, C_IRBYTES, C_VRBYTES, C_IRANGE_S, C_VRANGE_S, C_N };
static const char *const c_names[C_N] = {
    "read_s", "apply_s", "bytes_read", "dense_bytes", "entries_read", "entries_kept",
    "unique_range_gets", "dedup_hits", "full_indices_values_get_count", "source_objects",
    "non_ep_source_object_count", "index_gets", "index_cache_hits", "boundary_filtered",
    "wrong_elements", "fence", "results", "plan_s", "index_checks", "index_bytes_read",
    "index_s", "index_range_bytes", "value_range_bytes", "index_range_s", "value_range_s",
};
static bool c_timed(int k)
{
    return k == C_READ_S || k == C_APPLY_S || k == C_PLAN_S || k == C_INDEX_S ||
           k == C_IRANGE_S || k == C_VRANGE_S;
}

typedef struct gen_row {
    double put_s, c[C_N];         /* c: times as the slowest rollout, counts summed */
    uint64_t puts, skipped, nnz, put_bytes, fence_refused;
    ferry_sparse_stats node;      /* one batched read of every rollout's boxes */
    ferry_sparse_announce_stats ann;   /* the generation's announcement */
    bool ok;
    char error[256];
} gen_row;

/* The same generation read once for all rollouts' boxes on their node, as a
 * node-level reader would: what per-node dedup saves. */
static int node_read(ferry_store *s, ferry_sparse_reader *rd, const sp_tensor *t, size_t n,
                     const sp_spec *m, const char *model, uint64_t g, ferry_sparse_stats *st,
                     ferry_error *err)
{
    unsigned R = m->ep * m->tp;
    ferry_sparse_target *tg = calloc(n * R, sizeof *tg);
    size_t *tix = calloc(n, sizeof *tix), nt = 0, nres = 0;
    ferry_sparse_chain ch;
    int rc = ferry_sparse_chain_resolve(s, model, g - 1, &ch, err);
    if (rc == 0 && (!tg || !tix || ch.nlinks < 1))
        rc = FERRY_ENOMEM;
    if (rc == 0) {
        for (unsigned r = 0; r < R; r++)
            nt += sp_targets(t, n, m, r, tg + nt, tix);
        ferry_sparse_result *res = NULL;
        rc = ferry_sparse_reader_read(rd, (const char *const *)ch.links[0].keys, ch.links[0].nkeys,
                                      tg, nt, NULL, &res, &nres, st, err);
        ferry_sparse_results_free(res, nres);
    }
    if (rc == 0 || rc == FERRY_ENOMEM)
        ferry_sparse_chain_free(&ch);
    free(tg);
    free(tix);
    return rc;
}

static json_t *row_json(const gen_row *r, unsigned g)
{
    json_t *c = json_object(), *nd = json_object();
    for (int k = 0; k < C_N; k++)
        if (k != C_READ_S && k != C_APPLY_S && k != C_FENCE && !c_timed(k))
            json_object_set_new(c, c_names[k], json_integer((json_int_t)r->c[k]));
        else if (c_timed(k) && k != C_READ_S && k != C_APPLY_S)
            json_object_set_new(c, c_names[k], json_real(r->c[k]));
    const ferry_sparse_stats *x = &r->node;
    json_object_set_new(nd, "unique_range_gets", json_integer((json_int_t)x->unique_range_gets));
    json_object_set_new(nd, "dedup_hits", json_integer((json_int_t)x->dedup_hits));
    json_object_set_new(nd, "full_indices_values_get_count",
                        json_integer((json_int_t)x->full_indices_values_get_count));
    json_object_set_new(nd, "bytes_read", json_integer((json_int_t)x->bytes_read));
    json_object_set_new(nd, "entries_read", json_integer((json_int_t)x->entries_read));
    json_object_set_new(nd, "source_objects", json_integer((json_int_t)x->source_objects));
    json_object_set_new(nd, "non_ep_source_object_count",
                        json_integer((json_int_t)x->non_ep_source_object_count));
    double ratio = r->c[C_DENSE] > 0 ? r->c[C_BYTES] / r->c[C_DENSE] : 0;
    json_object_set_new(c, "announce", json_pack("{s:I, s:I, s:i, s:I, s:f}", "objects",
                        (json_int_t)r->ann.objects, "dense_generation",
                        (json_int_t)r->ann.dense_generation, "chain", (int)r->ann.chain,
                        "removed_generations", (json_int_t)r->ann.removed_generations,
                        "announce_s", r->ann.announce_s));
    return json_pack("{s:i, s:b, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:f, s:I, s:I, s:o, s:o, s:s}",
                     "generation", (int)g, "ok", r->ok, "nnz", (json_int_t)r->nnz,
                     "puts", (json_int_t)r->puts, "admission_skips", (json_int_t)r->skipped,
                     "put_s", r->put_s, "sparse_bytes", (json_int_t)r->c[C_BYTES],
                     "dense_bytes", (json_int_t)r->c[C_DENSE], "ratio", ratio,
                     "read_s", r->c[C_READ_S], "apply_s", r->c[C_APPLY_S],
                     "wrong_elements", (json_int_t)r->c[C_WRONG],
                     "fence_refused", (json_int_t)r->fence_refused, "counters", c,
                     "node_batched", nd, "error", r->error);
}

static void print_table(const gen_row *rows, unsigned ng)
{
    printf("%-4s %9s %7s %11s %11s %7s %7s %6s %5s %13s %7s %7s %s\n", "gen", "nnz", "put s",
           "sparse read", "dense", "ratio", "ranges", "dedup", "full", "node: ranges", "read s",
           "apply s", "every byte");
    for (unsigned i = 0; i < ng; i++) {
        const gen_row *r = &rows[i];
        char a[32], b[32];
        printf("%-4u %9" PRIu64 " %7.3f %11s %11s %6.2f%% %7.0f %6.0f %5.0f %6" PRIu64 "/%-6" PRIu64
               " %7.3f %7.3f %s\n", i + 2, r->nnz, r->put_s,
               cli_fmt_size((uint64_t)r->c[C_BYTES], a, sizeof a),
               cli_fmt_size((uint64_t)r->c[C_DENSE], b, sizeof b),
               r->c[C_DENSE] > 0 ? 100 * r->c[C_BYTES] / r->c[C_DENSE] : 0, r->c[C_RANGES],
               r->c[C_DEDUP], r->c[C_FULL], r->node.unique_range_gets, r->node.dedup_hits,
               r->c[C_READ_S], r->c[C_APPLY_S],
               r->ok ? "verified" : r->error[0] ? r->error : "WRONG");
    }
}

/* Start the children: trainers, then rollouts ("READY" each). */
static int start_children(demo_group *g, const char *model, const char *spec, const sp_spec *m,
                          child *tr, child *ro)
{
    unsigned R = m->ep * m->tp;
    for (unsigned k = 0; k < m->trainers + R; k++) {
        bool trainer = k < m->trainers;
        char rk[16], line[512] = "";
        snprintf(rk, sizeof rk, "%u", trainer ? k : k - m->trainers);
        const char *args[] = { "ferry-lab", "worker", trainer ? "sparse-trainer" : "sparse-rollout",
                               g->addr, rk, model, g->dir, spec, NULL };
        child *c = trainer ? &tr[k] : &ro[k - m->trainers];
        if (demo_child_start(c, args) < 0 || demo_child_line(c, line, sizeof line) < 0) {
            fprintf(stderr, "ferry-lab demo sparse: a %s did not start: %s\n",
                    trainer ? "trainer" : "rollout", line);
            return -1;
        }
    }
    return 0;
}

/* One delta generation: put, apply, the node-level read. */
static void run_gen(ferry_store *s, ferry_sparse_reader *rd, child *tr, child *ro, const sp_tensor *t, size_t n,
                    const sp_spec *m, const char *dir, const char *model, unsigned g, gen_row *row)
{
    static char lines[64][512];
    unsigned R = m->ep * m->tp;
    char cmd[64];
    snprintf(cmd, sizeof cmd, "delta %u", g);
    row->ok = sp_round(tr, m->trainers, cmd, lines, row->error, sizeof row->error);
    for (unsigned i = 0; row->ok && i < m->trainers; i++) {
        double secs;
        unsigned long long a, b, c, d;
        if (sscanf(lines[i], "OK %lf %llu %llu %llu %llu", &secs, &a, &b, &c, &d) == 5) {
            row->put_s = secs > row->put_s ? secs : row->put_s;
            row->puts += a, row->skipped += b, row->nnz += c, row->put_bytes += d;
        }
    }
    /* the coordinator announces the generation: one compare-and-swap of
     * the model's active key, as a dense publish makes */
    ferry_error aerr = {0};
    size_t nk = 0;
    char **keys = row->ok ? sp_keys(dir, g, m->trainers, &nk) : NULL;
    if (row->ok && (!keys || ferry_sparse_announce(s, model, g - 1, g, (const char *const *)keys, nk,
                                                   2, &row->ann, &aerr) < 0)) {
        snprintf(row->error, sizeof row->error, "announce: %.200s", aerr.msg);
        row->ok = false;
    }
    sp_keys_free(keys, nk);
    snprintf(cmd, sizeof cmd, "apply %u", g);
    row->ok = row->ok && sp_round(ro, R, cmd, lines, row->error, sizeof row->error);
    for (unsigned i = 0; row->ok && i < R; i++) {
        const char *p = lines[i] + 2;
        for (int k = 0; k < C_N; k++) {
            char *end;
            double v = strtod(p, &end);
            if (end == p) {
                snprintf(row->error, sizeof row->error, "rollout %u: short reply", i);
                row->ok = false;
                break;
            }
            p = end;
            bool timed = c_timed(k);
            row->c[k] = timed ? (v > row->c[k] ? v : row->c[k]) : row->c[k] + v;
            if (k == C_FENCE)
                row->fence_refused += v == 1;
        }
    }
    ferry_error err = {0};
    if (row->ok && node_read(s, rd, t, n, m, model, g, &row->node, &err) < 0) {
        snprintf(row->error, sizeof row->error, "node read: %.200s", err.msg);
        row->ok = false;
    }
    if (row->ok && row->c[C_WRONG] != 0)
        snprintf(row->error, sizeof row->error, "%.0f elements wrong", row->c[C_WRONG]);
    if (row->ok && row->fence_refused != R)
        snprintf(row->error, sizeof row->error, "the base fence let a stale apply through");
    row->ok = row->ok && row->c[C_WRONG] == 0 && row->fence_refused == R;
}

int cmd_demo_sparse(int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "sparse-trainer"))
        return demo_sparse_trainer_main(argc, argv);
    if (argc >= 1 && !strcmp(argv[0], "sparse-rollout"))
        return demo_sparse_rollout_main(argc, argv);
    sp_spec m;
    int pr = parse_sparse(argc, argv, &m);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &sp_cmd);
    unsigned R = m.ep * m.tp;
    char model[64], spec[160], sz[32];
    snprintf(model, sizeof model, "demosp%d", (int)getpid());
    spec_str(&m, spec, sizeof spec);
    size_t n;
    sp_tensor *t = sp_model(model, &m, &n);
    if (!t)
        return 1;
    uint64_t params = 0;
    for (size_t i = 0; i < n; i++)
        params += t[i].rows * t[i].cols;
    demo_group g;
    child tr[64], ro[64];
    memset(tr, 0, sizeof tr);
    memset(ro, 0, sizeof ro);
    gen_row rows[64];
    memset(rows, 0, sizeof rows);
    ferry_store *s = NULL;
    ferry_sparse_reader *rd = NULL;   /* the node-level reads */
    int rc = 1;
    /* the dense generation twice over (publish), the deltas, headroom */
    if (demo_cluster_start(&g, params * 2 * 3 + (uint64_t)m.gens * params * 10 * m.ppm / 1000000 * 2 +
                                   (256ull << 20), "ferry-lab demo sparse") < 0 ||
        start_children(&g, model, spec, &m, tr, ro) < 0 || !(s = sp_open(g.addr, stderr)) ||
        !(rd = sp_reader(s, stderr)))
        goto out;
    if (!m.json)
        printf("ferry-lab demo sparse: %u trainers, %u rollouts (EP%u x TP%u) on the master at %s;\n"
               "  %u layer(s) of %u experts (OWNER by EP) and 4 shared tensors (REPLICATE), "
               "hidden %u, ffn %u: %zu tensors, %" PRIu64 " parameters (%s bf16);\n"
               "  %u delta generations at density %.4g%%, bf16 values, i32 indices\n",
               m.trainers, R, m.ep, m.tp, g.addr, m.layers, m.experts, m.hidden, m.ffn, n, params,
               cli_fmt_size(params * 2, sz, sizeof sz), m.gens, m.ppm / 1e4);
    static char lines[64][512];
    char err[256] = "";
    double pub_s = 0, load_s = 0;
    uint64_t load_bytes = 0, load_wrong = 0;
    if (!sp_round(tr, m.trainers, "base", lines, err, sizeof err)) {
        fprintf(stderr, "ferry-lab demo sparse: publishing the base: %s\n", err);
        goto out;
    }
    for (unsigned i = 0; i < m.trainers; i++) {
        double x = 0;
        sscanf(lines[i], "OK %lf", &x);
        pub_s = x > pub_s ? x : pub_s;
    }
    if (!sp_round(ro, R, "load", lines, err, sizeof err)) {
        fprintf(stderr, "ferry-lab demo sparse: loading the base: %s\n", err);
        goto out;
    }
    for (unsigned i = 0; i < R; i++) {
        double x = 0;
        unsigned long long b = 0, w = 0;
        sscanf(lines[i], "OK %lf %llu %llu", &x, &b, &w);
        load_s = x > load_s ? x : load_s;
        load_bytes += b, load_wrong += w;
    }
    bool all_ok = load_wrong == 0;
    if (!m.json)
        printf("base: generation 1 published dense in %.3f s; the rollouts loaded their boxes "
               "(%s read) in %.3f s, %s\n\n", pub_s, cli_fmt_size(load_bytes, sz, sizeof sz),
               load_s, load_wrong ? "WRONG" : "every byte verified");
    for (unsigned k = 0; k < m.gens; k++) {
        if (!m.json)
            cli_progress("delta generations", (double)k / m.gens);
        run_gen(s, rd, tr, ro, t, n, &m, g.dir, model, k + 2, &rows[k]);
        all_ok = all_ok && rows[k].ok;
        if (!rows[k].ok) {
            m.gens = k + 1;
            break;
        }
    }
    if (!m.json)
        cli_progress_done();
    /* A fresh rollout (rollout 0 restarted with nothing): the registry's
     * rule gives it the dense generation and the whole chain. */
    double join_s = 0;
    unsigned long long j_gen = 0, j_dense = 0, j_dbytes = 0, j_deltas = 0, j_sbytes = 0,
                       j_wrong = 1;
    bool join_ok = all_ok && sp_round(ro, 1, "join", lines, err, sizeof err) &&
                   sscanf(lines[0], "OK %lf %llu %llu %llu %llu %llu %llu", &join_s, &j_gen,
                          &j_dense, &j_dbytes, &j_deltas, &j_sbytes, &j_wrong) == 7 &&
                   j_wrong == 0 && j_gen == m.gens + 1ull && j_dense == 1 && j_deltas == m.gens;
    if (all_ok && !join_ok && !err[0])
        snprintf(err, sizeof err, "the fresh rollout got generation %llu (dense %llu + %llu "
                 "deltas), %llu elements wrong", j_gen, j_dense, j_deltas, j_wrong);
    all_ok = all_ok && join_ok;
    if (m.json) {
        json_t *gens = json_array();
        for (unsigned k = 0; k < m.gens; k++)
            json_array_append_new(gens, row_json(&rows[k], k + 2));
        json_t *o = json_pack("{s:b, s:i, s:i, s:i, s:i, s:f, s:i, s:I, s:I, s:{s:f, s:f, s:I, s:I}, s:o, "
                              "s:{s:b, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:s}}",
                              "ok", all_ok, "trainers", (int)m.trainers, "rollouts", (int)R,
                              "ep", (int)m.ep, "tp", (int)m.tp, "density", m.ppm / 1e6,
                              "tensors", (int)n, "parameters", (json_int_t)params,
                              "dense_model_bytes", (json_int_t)(params * 2), "base",
                              "publish_s", pub_s, "load_s", load_s,
                              "load_bytes", (json_int_t)load_bytes,
                              "wrong_elements", (json_int_t)load_wrong, "generations", gens,
                              "fresh_worker", "ok", join_ok, "generation", (json_int_t)j_gen,
                              "dense_generation", (json_int_t)j_dense,
                              "dense_bytes", (json_int_t)j_dbytes, "deltas", (json_int_t)j_deltas,
                              "sparse_bytes", (json_int_t)j_sbytes, "s", join_s,
                              "wrong_elements", (json_int_t)j_wrong, "error", err);
        char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8))
                      : NULL;
        printf("%s\n", txt ? txt : "{\"ok\":false}");
        free(txt);
        json_decref(o);
    } else {
        print_table(rows, m.gens);
        const gen_row *l = &rows[m.gens - 1];
        char db[32];
        printf("\nevery generation announced in the registry (one compare-and-swap each; the "
               "last: chain of %u from dense generation %" PRIu64 ", %.3f s);\na fresh rollout "
               "restarted after generation %u: dense generation %llu (%s) + %llu deltas (%s) in "
               "%.3f s, %s\n", l->ann.chain, l->ann.dense_generation, l->ann.announce_s,
               m.gens + 1, j_dense, cli_fmt_size(j_dbytes, db, sizeof db), j_deltas,
               cli_fmt_size(j_sbytes, sz, sizeof sz), join_s,
               join_ok ? "every byte verified" : err);
        printf("\nsparse read: index + value bytes the rollouts read (%.0f entries for %.0f kept; "
               "each rollout reads its own boxes);\ndense: what a dense update of the same boxes "
               "reads. ranges/dedup/full: unique range gets, dedup hits, full-object gets summed "
               "over the rollouts;\nnode: one batched read of every rollout's boxes on their node "
               "(%" PRIu64 " range gets, %" PRIu64 " dedup hits, %s). Puts %" PRIu64
               " per generation, %" PRIu64 " admission skips; the stale-base apply was refused "
               "by %" PRIu64 " of %u rollouts, nothing changed.\n%s\n",
               l->c[C_EREAD], l->c[C_EKEPT], l->node.unique_range_gets, l->node.dedup_hits,
               cli_fmt_size(l->node.bytes_read, sz, sizeof sz), l->puts, l->skipped,
               l->fence_refused, R, all_ok ? "demo sparse ok" : "demo sparse FAILED");
    }
    rc = all_ok ? 0 : 1;
out:
    ferry_sparse_reader_close(rd);
    if (s) {
        char p[128];
        snprintf(p, sizeof p, "%s.", model);   /* every tensor of the model */
        (void)ferry_sparse_remove_tensors(s, p, NULL, NULL);
        ferry_store_close(s);
    }
    for (unsigned k = 0; k < 64; k++) {
        demo_child_stop(&tr[k]);
        demo_child_stop(&ro[k]);
    }
    demo_group_stop(&g);
    free(t);
    return rc;
}
