/* The processes of the weight-update demo (`ferry-lab demo`): trainer ranks
 * that publish generations, rollout workers that take them in
 * parameter-direct and compatibility form, and the synthetic model they
 * share (the real tensor shapes of a preset, cut to a byte budget, bf16).
 * Children are driven over stdin/stdout, one reply line per command. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "lab.h"
#include "demo.h"

int demo_model_build(const char *preset, uint64_t budget, demo_model *dm)
{
    memset(dm, 0, sizeof *dm);
    ferry_model *m = NULL;
    ferry_error err = {0};
    int rc = ferry_model_preset(preset, &m, &err);
    if (rc < 0)
        return rc;
    size_t n = ferry_model_tensor_count(m);
    dm->t = calloc(n, sizeof *dm->t);
    if (!dm->t) {
        ferry_model_free(m);
        return FERRY_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        ferry_model_tensor mt;
        ferry_model_tensor_at(m, i, &mt);
        uint64_t b = 2;
        for (uint32_t d = 0; d < mt.desc.ndim; d++)
            b *= mt.desc.shape[d];
        if (dm->bytes + b > budget)
            continue;   /* keep the real shapes; take what fits */
        demo_tensor *t = &dm->t[dm->n++];
        snprintf(t->name, sizeof t->name, "%s", mt.desc.name);
        t->ndim = mt.desc.ndim;
        memcpy(t->shape, mt.desc.shape, sizeof t->shape);
        t->bytes = b;
        dm->bytes += b;
    }
    ferry_model_free(m);
    return dm->n ? 0 : FERRY_EINVAL;
}

void demo_model_free(demo_model *dm)
{
    free(dm->t);
    memset(dm, 0, sizeof *dm);
}

/* bf16 bit pattern of element i of tensor t at generation g: finite,
 * different for every generation, cheap to regenerate for checking. */
static inline uint16_t bits(uint64_t g, size_t t, uint64_t i)
{
    return (uint16_t)(0x3c00u | ((g * 40503u + t * 977u + i) & 0x1ffu));
}

static void fill(uint16_t *p, uint64_t g, size_t t, uint64_t first, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        p[i] = bits(g, t, first + i);
}

void demo_tp_rows(const demo_tensor *t, uint32_t rank, uint32_t world, uint64_t *r0,
                    uint64_t *rows)
{
    uint64_t d0 = t->ndim ? t->shape[0] : 1, per = (d0 + world - 1) / world;
    *r0 = per * rank < d0 ? per * rank : d0;
    *rows = *r0 + per <= d0 ? per : d0 - *r0;
}

void demo_rollout_rows(const demo_tensor *t, uint32_t rank, uint32_t world, uint32_t dp, bool ep,
                       uint64_t *r0, uint64_t *rows)
{
    uint32_t g = dp && world % dp == 0 ? world / dp : world;   /* a replica's workers */
    const char *e = ep ? strstr(t->name, "experts.") : NULL;
    if (e && e[8] >= '0' && e[8] <= '9') {   /* an expert: whole, on its owner */
        uint32_t owner = (uint32_t)(strtoul(e + 8, NULL, 10) % g);
        *r0 = 0;
        *rows = rank % g == owner ? (t->ndim ? t->shape[0] : 1) : 0;
        return;
    }
    demo_tp_rows(t, rank % g, g, r0, rows);
}

uint64_t demo_row_elems(const demo_tensor *t)
{
    uint64_t e = 1;
    for (uint32_t d = 1; d < t->ndim; d++)
        e *= t->shape[d];
    return e;
}

/* ---- counters --------------------------------------------------------------------------
 *
 * The children's replies carry a few numbers; the counters travel beside
 * them: when FERRY_DEMO_STATS names a directory, each child writes the
 * counters of its last command there as one JSON object
 * (trainer-R.json, rollout-R.json) before it replies, and the parent reads
 * them after the round (demo_counters_collect). */

static void stats_write(const char *role, uint32_t rank, json_t *j)
{
    const char *dir = getenv("FERRY_DEMO_STATS");
    if (dir && *dir && j) {
        char path[512], tmp[520];
        snprintf(path, sizeof path, "%s/%s-%u.json", dir, role, rank);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (json_dump_file(j, tmp, JSON_COMPACT) == 0)
            (void)rename(tmp, path);
    }
    json_decref(j);
}

static json_t *publish_json(const ferry_publish_stats *st)
{
    double cover = st->total_s > 0 ? (st->put_s + st->barrier_s + st->commit_s) / st->total_s : 0;
    return json_pack("{s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:I,s:f,s:f}", "bytes", (json_int_t)st->bytes,
                     "tensors", (json_int_t)st->tensors, "cross_node_bytes",
                     (json_int_t)st->cross_node_bytes, "local_bytes", (json_int_t)st->local_bytes,
                     "put_s", st->put_s, "convert_s", st->convert_s, "store_s", st->store_s,
                     "barrier_s", st->barrier_s, "commit_s", st->commit_s, "faults",
                     (json_int_t)st->faults, "total_s", st->total_s, "coverage", cover);
}

static json_t *update_json(const ferry_subscriber *sub, const ferry_update_stats *st)
{
    double cover = st->total_s > 0
                   ? (st->prepare_s + st->plan_s + st->apply_s + st->barrier_s) / st->total_s : 0;
    json_t *j = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,"
                          "s:f,s:f,s:f,s:f,s:I,s:f,s:f}",
                          "bytes_read", (json_int_t)st->bytes_read,
                          "group_bytes_read", (json_int_t)st->group_bytes_read,
                          "bytes_pushed", (json_int_t)st->bytes_pushed,
                          "bytes_received", (json_int_t)st->bytes_received,
                          "batches", (json_int_t)st->batches,
                          "pushed_cross", (json_int_t)st->group_pushed_cross,
                          "pushed_intra", (json_int_t)st->group_pushed_intra,
                          "nic_max_in", (json_int_t)st->nic_max_in,
                          "nic_max_out", (json_int_t)st->nic_max_out,
                          "nic_mean_in", st->nic_mean_in, "nic_mean_out", st->nic_mean_out,
                          "prepare_s", st->prepare_s, "exchange_s", st->exchange_s,
                          "plan_s", st->plan_s, "read_s", st->read_s, "push_s", st->push_s,
                          "forward_s", st->forward_s, "barrier_s", st->barrier_s,
                          "apply_s", st->apply_s, "nic_max_ratio_in",
                          st->nic_mean_in > 0 ? (double)st->nic_max_in / st->nic_mean_in : 0.0,
                          "nic_max_ratio_out",
                          st->nic_mean_out > 0 ? (double)st->nic_max_out / st->nic_mean_out : 0.0,
                          "faults", (json_int_t)st->faults, "total_s", st->total_s,
                          "coverage", cover);
    int n = ferry_subscriber_nodes(sub, NULL, 0);
    ferry_update_node *v = n > 0 ? calloc((size_t)n, sizeof *v) : NULL;
    json_t *nodes = json_array();
    if (!j) {
        free(v);
        json_decref(nodes);
        return NULL;
    }
    n = v ? ferry_subscriber_nodes(sub, v, (size_t)n) : 0;
    for (int i = 0; i < n; i++)
        json_array_append_new(nodes, json_pack("{s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I}", "node",
                                               (int)v[i].node, "workers", (int)v[i].workers,
                                               "store_read", (json_int_t)v[i].store_read,
                                               "pushed_in", (json_int_t)v[i].pushed_in,
                                               "pushed_out", (json_int_t)v[i].pushed_out,
                                               "pushed_intra", (json_int_t)v[i].pushed_intra,
                                               "nic_in", (json_int_t)v[i].nic_in,
                                               "nic_out", (json_int_t)v[i].nic_out));
    free(v);
    json_object_set_new(j, "nodes", nodes);
    return j;
}

static json_t *compat_json(const ferry_compat_stats *st)
{
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,"
                     "s:f,s:f,s:f,s:f,s:f,s:I}",
                     "tensors", (json_int_t)st->tensors, "bytes", (json_int_t)st->bytes,
                     "bytes_read", (json_int_t)st->bytes_read,
                     "bytes_sent_cross", (json_int_t)st->bytes_sent_cross,
                     "bytes_sent_intra", (json_int_t)st->bytes_sent_intra,
                     "bytes_received", (json_int_t)st->bytes_received,
                     "bytes_viewed", (json_int_t)st->bytes_viewed,
                     "batches", (json_int_t)st->batches,
                     "group_bytes_read", (json_int_t)st->group_bytes_read,
                     "group_cross_bytes", (json_int_t)st->group_cross_bytes,
                     "group_intra_bytes", (json_int_t)st->group_intra_bytes,
                     "staging_slots", (json_int_t)st->staging_slots,
                     "pipelined_batches", (json_int_t)st->pipelined_batches,
                     "prepare_s", st->prepare_s, "exchange_s", st->exchange_s, "plan_s", st->plan_s,
                     "read_s", st->read_s, "wait_s", st->wait_s, "verify_s", st->verify_s,
                     "load_s", st->load_s, "barrier_s", st->barrier_s, "apply_s", st->apply_s,
                     "total_s", st->total_s, "faults", (json_int_t)st->faults);
}

int demo_counters_open(char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/ferry-counters-XXXXXX", demo_tmp_dir());
    if (demo_signals_start() < 0 || demo_mkdtemp(dir) < 0)
        return -1;
    return setenv("FERRY_DEMO_STATS", dir, 1);
}

void demo_counters_close(const char *dir)
{
    demo_rmtree(dir);
    unsetenv("FERRY_DEMO_STATS");
}

/* The n children's files of a role merged: byte counts summed, times the
 * longest (the group waits for its slowest member), the group's figures
 * (the same in every rollout) and nodes from rank 0. A new reference, or
 * NULL when a file is missing. */
json_t *demo_counters_collect(const char *dir, const char *role, unsigned n)
{
    static const char *const sums[] = { "bytes", "tensors", "cross_node_bytes", "local_bytes",
                                        "bytes_read", "bytes_pushed", "bytes_received", "batches",
                                        "bytes_sent_cross", "bytes_sent_intra", "bytes_viewed",
                                        "faults" };
    json_t *out = NULL;
    for (unsigned r = 0; r < n; r++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s-%u.json", dir, role, r);
        json_t *j = json_load_file(path, 0, NULL);
        if (!j) {
            json_decref(out);
            return NULL;
        }
        (void)unlink(path);   /* a later round must not see it again */
        if (!out) {
            out = j;
            continue;
        }
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            json_t *o = json_object_get(out, k);
            bool sum = false;
            for (size_t i = 0; i < sizeof sums / sizeof *sums; i++)
                sum |= !strcmp(k, sums[i]);
            if (sum && json_is_integer(v))
                json_integer_set(o, json_integer_value(o) + json_integer_value(v));
            else if (json_is_real(v) && strlen(k) > 2 && !strcmp(k + strlen(k) - 2, "_s") &&
                     json_real_value(v) > json_real_value(o))
                json_real_set(o, json_real_value(v));
            else if (json_is_real(v) && !strcmp(k, "coverage") &&
                     json_real_value(v) < json_real_value(o))   /* the worst process's */
                json_real_set(o, json_real_value(v));
        }
        json_decref(j);
    }
    return out;
}

typedef struct role_args {
    ferry_store *s;
    demo_model m;
    uint32_t rank, world, dp;
    char model[64];
} role_args;

static int open_role(int argc, char **argv, role_args *a)
{
    ferry_error fe = {0};
    if (argc != 7)
        return -1;
    memset(a, 0, sizeof *a);
    a->rank = (uint32_t)atoi(argv[2]);
    a->world = (uint32_t)atoi(argv[3]);
    snprintf(a->model, sizeof a->model, "%s", argv[4]);
    uint64_t budget = strtoull(argv[5], NULL, 10);
    if (demo_model_build(argv[4], budget, &a->m) < 0)
        return -1;
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", argv[1]);
    cfg.lease_ms = 2000;
    cfg.timeout_ms = FERRY_DEFAULT_TIMEOUT_MS;
    if (ferry_store_open(&cfg, &a->s, &fe) < 0) {
        printf("ERR %s\n", fe.msg);
        fflush(stdout);
        return -1;
    }
    a->dp = (uint32_t)atoi(argv[6]);
    if (a->dp == 0 || a->world % a->dp)
        a->dp = 1;
    return 0;   /* the role says READY after its set-up (ready()) */
}

/* Set-up done: "READY <warm-up s> <bytes warmed>", the figures of the
 * documented warm-up (docs/weights.md, "Warm memory"); 0 0 with --cold. */
static void ready(double warm_s, uint64_t warm_bytes)
{
    printf("READY %.4f %llu\n", warm_s, (unsigned long long)warm_bytes);
    fflush(stdout);
}

/* A number from the environment (0 when unset): the lab's bench cluster
 * tells its processes their host's segment and node this way. */
static uint64_t env_u64(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : 0;
}

static bool demo_cold(void)
{
    const char *v = getenv("FERRY_DEMO_COLD");
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- trainer ------------------------------------------------------------------------ */

/* The trainers' placement: every tensor cut along dim 0 into `world`
 * pieces, piece r on rank r (FSDP); *mine gets this rank's pieces, with
 * their first row and row count. */
int demo_fsdp_placement(const demo_model *m, uint32_t world, uint32_t rank,
                          ferry_manifest **out, shard_of **mine, size_t *nmine)
{
    int rc = ferry_manifest_create(world, NULL, 1, out);
    for (size_t i = 0; i < m->n && rc >= 0; i++) {
        ferry_tensor_desc d = { .name = m->t[i].name, .dtype = "bf16", .itemsize = 2,
                                .ndim = m->t[i].ndim };
        memcpy(d.shape, m->t[i].shape, sizeof d.shape);
        rc = ferry_manifest_add_tensor(*out, &d, NULL);
        ferry_split sp = { .tensor = (uint32_t)i, .whole = true, .parts = { world },
                           .rank_stride = { 1 } };
        if (rc >= 0)
            rc = ferry_manifest_add_split(*out, &sp, NULL);
    }
    *mine = calloc(m->n ? m->n : 1, sizeof **mine);
    *nmine = 0;
    uint64_t nf = rc >= 0 && *mine ? ferry_manifest_fragment_count(*out) : 0;
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(*out, id, &f) == 0 && f.rank == rank)
            (*mine)[(*nmine)++] = (shard_of){ f.tensor, id, m->t[f.tensor].ndim ? f.offset[0] : 0,
                                              m->t[f.tensor].ndim ? f.shape[0] : 1 };
    }
    return rc < 0 || !*mine ? -1 : 0;
}

int demo_trainer_main(int argc, char **argv)
{
    role_args a;
    if (open_role(argc, argv, &a) < 0)
        return 1;
    /* Each rank holds its FSDP shards only, and publishes them as they
     * are: no gather (ferry_publish_shards). */
    ferry_manifest *pl = NULL;
    shard_of *mine = NULL;
    size_t nmine = 0;
    if (demo_fsdp_placement(&a.m, a.world, a.rank, &pl, &mine, &nmine) < 0) {
        printf("ERR cannot describe the trainers' placement\n");
        fflush(stdout);
        return 1;
    }
    uint64_t bytes = 0;
    for (size_t k = 0; k < nmine; k++)
        bytes += mine[k].rows * demo_row_elems(&a.m.t[mine[k].tensor]) * 2;
    uint8_t *mem = malloc(bytes ? bytes : 1);
    ferry_shard_data *data = calloc(nmine ? nmine : 1, sizeof *data);
    if (!mem || !data)
        return 1;
    for (size_t k = 0, off = 0; k < nmine; k++) {
        data[k] = (ferry_shard_data){ .fragment = mine[k].fragment, .data = mem + off };
        off += mine[k].rows * demo_row_elems(&a.m.t[mine[k].tensor]) * 2;
    }
    memset(mem, 0, bytes);   /* a trainer's shards live in memory it has written */
    ferry_publisher_config pc = { .rank = a.rank, .world = a.world, .keep = 2,
                                  .timeout_ms = 120000, .segment = env_u64("FERRY_DEMO_SEGMENT") };
    snprintf(pc.model, sizeof pc.model, "%s", a.model);
    /* The FP8 model ("publish8 G", after "publish G" filled the shards): the
     * same shards through the default quantization rules, quantized here. */
    ferry_quant_rules qr;
    ferry_quant_rules_init(&qr);
    ferry_publisher_config pc8 = pc;
    pc8.quant = &qr;
    snprintf(pc8.model, sizeof pc8.model, "%s" DEMO_FP8_MODEL, a.model);
    double w0 = cli_now();
    uint64_t wb = 0;
    ferry_error werr = {0};
    if (!demo_cold() && ferry_publish_warm(a.s, &pc, pl, &wb, &werr) < 0) {
        printf("ERR %s\n", werr.msg);
        fflush(stdout);
        return 1;
    }
    ready(demo_cold() ? 0 : cli_now() - w0, wb);
    demo_shard *ds = calloc(nmine ? nmine : 1, sizeof *ds);
    if (!ds)
        return 1;
    for (size_t k = 0; k < nmine; k++)
        ds[k] = (demo_shard){ mine[k].tensor, mine[k].r0, mine[k].rows, data[k].data };
    demo_xfer x = {0};
    static char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long g;
        if (demo_xfer_trainer(&x, line, &a.m, a.rank, a.world, ds, nmine))
            continue;
        if (sscanf(line, "publish8 %llu", &g) == 1) {   /* before "publish %llu", which reads "8" */
            ferry_publish_stats st;
            ferry_error err = {0};
            double t0 = cli_now();
            if (ferry_publish_shards(a.s, &pc8, g, pl, data, nmine, &st, &err) == 0)
                printf("OK %.4f %llu %llu\n", cli_now() - t0, (unsigned long long)st.bytes,
                       (unsigned long long)st.tensors);
            else
                printf("ERR %s\n", err.msg);
            fflush(stdout);
            continue;
        }
        if (sscanf(line, "publish %llu", &g) != 1)
            break;
        for (size_t k = 0; k < nmine; k++) {
            uint64_t re = demo_row_elems(&a.m.t[mine[k].tensor]);
            fill((uint16_t *)(uintptr_t)data[k].data, g, mine[k].tensor, mine[k].r0 * re,
                 mine[k].rows * re);
        }
        ferry_publish_stats st;
        ferry_error err = {0};
        double t0 = cli_now();
        int rc = ferry_publish_shards(a.s, &pc, g, pl, data, nmine, &st, &err);
        if (rc == 0)
            stats_write("trainer", a.rank, publish_json(&st));
        if (rc == 0)
            printf("OK %.4f %llu %llu\n", cli_now() - t0, (unsigned long long)st.bytes,
                   (unsigned long long)st.tensors);
        else
            printf("ERR %s\n", err.msg);
        fflush(stdout);
    }
    demo_xfer_close(&x);
    free(ds);
    ferry_store_close(a.s);
    free(mem);
    free(data);
    free(mine);
    ferry_manifest_close(pl);
    demo_model_free(&a.m);
    return 0;
}

/* ---- rollout -------------------------------------------------------------------------- */

/* The expected values repeat every 512 elements (bits()), so a block of
 * PATTERN of them, a multiple of that, is the expectation for every
 * block of a tensor: the loader compares with memcmp at memory speed and
 * counts element by element only in a block that differs. */
enum { PATTERN = 32768 };
typedef struct verify_ctx {
    const demo_model *m;
    uint64_t g;
    uint64_t bad;
    size_t seen;
    uint16_t pat[PATTERN];
} verify_ctx;

static int check_full(void *ctx, const ferry_weight_entry *e, const void *data)
{
    verify_ctx *v = ctx;
    size_t t = 0;
    while (t < v->m->n && strcmp(v->m->t[t].name, e->name) != 0)
        t++;
    if (t == v->m->n || e->bytes != v->m->t[t].bytes)
        return FERRY_EPROTO;
    for (uint64_t i = 0; i < PATTERN; i++)
        v->pat[i] = bits(v->g, t, i);
    const uint16_t *p = data;
    const uint64_t n = e->bytes / 2;
    for (uint64_t at = 0; at < n; at += PATTERN) {
        uint64_t k = n - at < PATTERN ? n - at : PATTERN;
        if (memcmp(p + at, v->pat, k * 2) == 0)
            continue;
        for (uint64_t i = 0; i < k; i++)
            v->bad += p[at + i] != v->pat[i];
    }
    v->seen++;
    return 0;
}

/* Wrong elements of the shards against generation g. */
static uint64_t check_shards(const demo_model *m, const ferry_param_shard *sh,
                             const uint64_t *first, size_t ns, uint64_t g)
{
    uint64_t bad = 0;
    for (size_t k = 0; k < ns; k++) {
        const demo_tensor *t = &m->t[first[k]];
        uint64_t n = sh[k].shape[0] * demo_row_elems(t), base = sh[k].offset[0] * demo_row_elems(t);
        const uint16_t *p = sh[k].dst;
        for (uint64_t i = 0; i < n; i++)
            bad += p[i] != bits(g, first[k], base + i);
    }
    return bad;
}

/* A rollout's parameter buffer, as an inference engine's allocator
 * hands out large blocks: 2 MiB-aligned from 2 MiB on, so that the
 * subscriber's huge-page advice (docs/weights.md, "Warm memory") covers
 * all of it. */
static void *param_alloc(size_t n)
{
    const size_t huge = 2u << 20;
    void *p = NULL;
    if (n < huge)
        return malloc(n ? n : 1);
    return posix_memalign(&p, huge, (n + huge - 1) & ~(huge - 1)) == 0 ? p : NULL;
}

/* The FP8 rollout group ("fp8 G"), opened at its first update: the same
 * TP rows as the bf16 group, each weight the default rules pick as FP8
 * bytes with its scale rows beside it, the rest bf16. */
typedef struct fp8_group {
    ferry_subscriber *sub;
    ferry_param_shard *sh;
    size_t *tensor;              /* per shard: its demo tensor */
    int *kind;                   /* 0 bf16, 1 FP8 weight (its scales the next shard), 2 scales */
    char (*scale_name)[200];
    size_t n;
    uint64_t cur;
} fp8_group;

static void fp8_close(fp8_group *f)
{
    ferry_subscriber_close(f->sub);
    for (size_t k = 0; k < f->n; k++)
        free(f->sh[k].dst);
    free(f->sh);
    free(f->tensor);
    free(f->kind);
    free(f->scale_name);
}

static int fp8_shard(fp8_group *f, const char *name, size_t tensor, int kind, uint32_t ndim,
                     const uint64_t *off, const uint64_t *shape, size_t bytes)
{
    ferry_param_shard *p = &f->sh[f->n];
    p->tensor = name;
    p->ndim = ndim;
    memcpy(p->offset, off, sizeof p->offset);
    memcpy(p->shape, shape, sizeof p->shape);
    p->dst = param_alloc(bytes);
    if (!p->dst)
        return -1;
    memset(p->dst, 0, bytes);
    p->dst_bytes = bytes;
    f->tensor[f->n] = tensor;
    f->kind[f->n++] = kind;
    return 0;
}

static int fp8_open(fp8_group *f, const role_args *a, bool ep, const ferry_subscriber_config *base,
                    ferry_error *err)
{
    const uint64_t b = FERRY_FP8_DEFAULT_BLOCK;
    f->sh = calloc(2 * a->m.n + 1, sizeof *f->sh);
    f->tensor = calloc(2 * a->m.n + 1, sizeof *f->tensor);
    f->kind = calloc(2 * a->m.n + 1, sizeof *f->kind);
    f->scale_name = calloc(a->m.n + 1, sizeof *f->scale_name);
    if (!f->sh || !f->tensor || !f->kind || !f->scale_name)
        return -1;
    for (size_t i = 0; i < a->m.n; i++) {
        const demo_tensor *t = &a->m.t[i];
        uint64_t r0, rows, off[FERRY_MAX_DIMS] = {0}, shape[FERRY_MAX_DIMS];
        demo_rollout_rows(t, a->rank, a->world, a->dp, ep, &r0, &rows);
        if (rows == 0)
            continue;
        ferry_tensor_desc d = { .name = t->name, .dtype = "bf16", .itemsize = 2, .ndim = t->ndim };
        memcpy(d.shape, t->shape, sizeof d.shape);
        int pick = ferry_quant_rules_match(NULL, &d, err);
        if (pick < 0)
            return -1;
        memcpy(shape, t->shape, sizeof shape);
        if (t->ndim) {
            off[0] = r0;
            shape[0] = rows;
        }
        uint64_t n = rows * demo_row_elems(t);
        if (fp8_shard(f, t->name, i, pick, t->ndim, off, shape, n * (pick ? 1 : 2)) < 0)
            return -1;
        if (!pick)
            continue;
        snprintf(f->scale_name[i], sizeof f->scale_name[i], "%s_scale_inv", t->name);
        uint64_t soff[FERRY_MAX_DIMS] = { r0 / b }, sshape[FERRY_MAX_DIMS] = {
            (rows + b - 1) / b, (t->shape[1] + b - 1) / b };
        if (fp8_shard(f, f->scale_name[i], i, 2, 2, soff, sshape, sshape[0] * sshape[1] * 4) < 0)
            return -1;
    }
    ferry_subscriber_config sc = *base;
    snprintf(sc.model, sizeof sc.model, "%s" DEMO_FP8_MODEL, a->model);
    snprintf(sc.group, sizeof sc.group, "demo-fp8");
    return ferry_subscriber_open(a->s, &sc, f->sh, f->n, &f->sub, err);
}

/* Wrong bytes of the FP8 group against generation g: each FP8 shard and its
 * scales against ferry_quantize_fp8_blocks over the shard's bf16 values (a
 * shard holds whole blocks: its quantization is the whole tensor's), the
 * bf16 shards against the values. */
static uint64_t fp8_check(const fp8_group *f, const demo_model *m, uint64_t g)
{
    uint64_t bad = 0;
    for (size_t k = 0; k < f->n; k++) {
        const ferry_param_shard *p = &f->sh[k];
        const demo_tensor *t = &m->t[f->tensor[k]];
        uint64_t re = demo_row_elems(t), n = p->shape[0] * re, base = p->offset[0] * re;
        if (f->kind[k] == 0) {
            const uint16_t *v = p->dst;
            for (uint64_t i = 0; i < n; i++)
                bad += v[i] != bits(g, f->tensor[k], base + i);
            continue;
        }
        if (f->kind[k] != 1)
            continue;   /* scales: checked with their weight */
        uint16_t *x = malloc(n * 2);
        uint8_t *q = malloc(n);
        float *sc = malloc(f->sh[k + 1].dst_bytes);
        if (!x || !q || !sc) {
            free(x), free(q), free(sc);
            return n;
        }
        for (uint64_t i = 0; i < n; i++)
            x[i] = bits(g, f->tensor[k], base + i);
        if (ferry_quantize_fp8_blocks(x, "bf16", re, q, "f8e4m3", re, p->shape[0], re, sc, NULL,
                                      NULL) < 0)
            bad += n;
        const uint8_t *got = p->dst;
        for (uint64_t i = 0; i < n; i++)
            bad += got[i] != q[i];
        bad += memcmp(sc, f->sh[k + 1].dst, f->sh[k + 1].dst_bytes) != 0;
        free(x), free(q), free(sc);
    }
    return bad;
}

int demo_rollout_main(int argc, char **argv)
{
    ferry_error fe = {0};
    role_args a;
    if (open_role(argc, argv, &a) < 0)
        return 1;
    ferry_param_shard *sh = calloc(a.m.n, sizeof *sh);
    uint64_t *first = calloc(a.m.n, sizeof *first);
    size_t ns = 0;
    /* TP over world/dp ranks, each TP shard held by dp replicas; with
     * FERRY_DEMO_EP, each expert whole on one worker of each replica */
    bool ep = env_u64("FERRY_DEMO_EP") != 0;
    for (size_t i = 0; i < a.m.n; i++) {
        const demo_tensor *t = &a.m.t[i];
        uint64_t r0, rows;
        demo_rollout_rows(t, a.rank, a.world, a.dp, ep, &r0, &rows);
        if (rows == 0)
            continue;
        ferry_param_shard *p = &sh[ns];
        p->tensor = t->name;
        p->ndim = t->ndim;
        memcpy(p->shape, t->shape, sizeof p->shape);
        if (t->ndim) {
            p->offset[0] = r0;
            p->shape[0] = rows;
        }
        p->dst = param_alloc(rows * demo_row_elems(t) * 2);
        if (!p->dst)
            return 1;
        memset(p->dst, 0, rows * demo_row_elems(t) * 2);   /* loaded weights live in written memory */
        p->dst_bytes = rows * demo_row_elems(t) * 2;
        first[ns++] = i;
    }
    ferry_subscriber_config sc = { .rank = a.rank, .world = a.world, .timeout_ms = 120000,
                                   .node = (uint32_t)env_u64("FERRY_DEMO_NODE"),
                                   .local_segment = env_u64("FERRY_DEMO_SEGMENT"),
                                   .batch_bytes = env_u64("FERRY_DEMO_BATCH") };
    snprintf(sc.model, sizeof sc.model, "%s", a.model);
    snprintf(sc.group, sizeof sc.group, "demo");
    ferry_subscriber *sub = NULL;
    ferry_error oerr = {0};
    if (ferry_subscriber_open(a.s, &sc, sh, ns, &sub, &oerr) < 0)
        return 1;
    /* Compatibility mode: the same group, one staging buffer per worker
     * that holds the largest tensor and the whole model up to 1 GiB (256 MiB
     * at least): few batches, so few batch barriers; kept open across
     * generations so its registration is reused. */
    uint64_t largest = 0, staging = a.m.bytes < (1ull << 30) ? a.m.bytes : 1ull << 30;
    for (size_t i = 0; i < a.m.n; i++)
        largest = a.m.t[i].bytes > largest ? a.m.t[i].bytes : largest;
    staging = largest > staging ? largest : staging;
    ferry_compat_config cc = { .rank = a.rank, .world = a.world, .timeout_ms = 120000,
                               .node = (uint32_t)env_u64("FERRY_DEMO_NODE"),
                               .local_segment = env_u64("FERRY_DEMO_SEGMENT"),
                               .staging_bytes = staging > (256ull << 20) ? staging : 256ull << 20 };
    snprintf(cc.model, sizeof cc.model, "%s", a.model);
    snprintf(cc.group, sizeof cc.group, "demo");
    ferry_compat_group *cg = NULL;
    if (ferry_compat_group_open(a.s, &cc, &cg, &oerr) < 0) {
        printf("ERR %s\n", oerr.msg);
        fflush(stdout);
        return 1;
    }
    double w0 = cli_now();
    uint64_t wb = 0;
    uint64_t vb = 0;
    if (!demo_cold() && ferry_store_warm(a.s, false, &wb, &fe) < 0) {
        printf("ERR %s\n", fe.msg);
        fflush(stdout);
        return 1;
    }
    /* The compat group's part: it waits for every member's record (left at
     * open). A member far behind in its set-up only costs the first compat
     * update what the warm-up would have done: said, not fatal. */
    if (!demo_cold() && ferry_compat_group_warm(cg, &vb, &fe) < 0)
        fprintf(stderr, "rollout %u: %s; its first compat update makes them instead\n", a.rank,
                fe.msg);
    ready(demo_cold() ? 0 : cli_now() - w0, wb + vb);
    uint64_t cur = 0, naive_gen = 0, compat_gen = 0;
    fp8_group f8 = {0};
    demo_xfer x = {0};
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long g;
        ferry_update_stats st;
        ferry_error err = {0};
        double t0 = cli_now(), xs = 0;
        uint64_t xb = 0, xg = 0;
        int xr = demo_xfer_rollout(&x, line, &a.m, sh, first, ns, &xs, &xb, &xg);
        if (xr == 2) {
            /* replied */
        } else if (xr > 0) {   /* a baseline's bytes landed: check them, as every update's */
            uint64_t bad = check_shards(&a.m, sh, first, ns, xg);
            printf("OK %.4f %llu %llu 0\n", xs, (unsigned long long)xb, (unsigned long long)bad);
        } else if (xr < 0) {
            break;
        } else if (sscanf(line, "direct %llu", &g) == 1) {
            int rc = ferry_subscriber_update(sub, &cur, &st, &err);
            double dt = cli_now() - t0;
            if (rc == 0)
                stats_write("rollout", a.rank, update_json(sub, &st));
            uint64_t bad = rc == 0 ? check_shards(&a.m, sh, first, ns, g) : 0;
            if (rc == 0 && cur == g)
                printf("OK %.4f %llu %llu %llu\n", dt, (unsigned long long)st.bytes_read,
                       (unsigned long long)bad, (unsigned long long)st.bytes_pushed);
            else
                printf("ERR %s\n", rc ? err.msg : "not at the expected generation");
        } else if (sscanf(line, "fp8 %llu", &g) == 1) {
            int rc = f8.sub ? 0 : fp8_open(&f8, &a, ep, &sc, &err);
            if (rc == 0)
                rc = ferry_subscriber_update(f8.sub, &f8.cur, &st, &err);
            double dt = cli_now() - t0;
            uint64_t bad = rc == 0 ? fp8_check(&f8, &a.m, g) : 0;
            if (rc == 0 && f8.cur == g)
                printf("OK %.4f %llu %llu %llu\n", dt, (unsigned long long)st.bytes_read,
                       (unsigned long long)bad, (unsigned long long)st.bytes_pushed);
            else
                printf("ERR %s\n", rc ? (err.msg[0] ? err.msg : "out of memory") :
                       "not at the expected generation");
        } else if (sscanf(line, "naive %llu", &g) == 1) {
            /* The baseline: every worker reads its own demand from the store. */
            for (size_t k = 0; k < ns; k++)   /* so that the check below means something */
                memset(sh[k].dst, 0, sh[k].shape[0] * demo_row_elems(&a.m.t[first[k]]) * 2);
            t0 = cli_now();
            int rc = ferry_weights_update_direct(a.s, a.model, &naive_gen, sh, ns, &st, &err);
            double dt = cli_now() - t0;
            uint64_t bad = rc == 0 ? check_shards(&a.m, sh, first, ns, g) : 0;
            if (rc == 0 && naive_gen == g)
                printf("OK %.4f %llu %llu 0\n", dt, (unsigned long long)st.bytes_read,
                       (unsigned long long)bad);
            else
                printf("ERR %s\n", rc ? err.msg : "not at the expected generation");
        } else if (sscanf(line, "compat %llu", &g) == 1) {
            /* The group update: each byte read from the store once, by the
             * tensor's leader, and handed to the others (on one machine
             * through a view of its staging). */
            verify_ctx *v = calloc(1, sizeof *v);
            if (!v)
                return 1;
            *v = (verify_ctx){ .m = &a.m, .g = g };
            ferry_compat_stats cs;
            int rc = ferry_compat_group_update(cg, &compat_gen, check_full, v, &cs, &err);
            double dt = cli_now() - t0;
            if (rc == 0)
                stats_write("compat", a.rank, compat_json(&cs));
            if (rc == 0 && compat_gen == g && v->seen == a.m.n)
                printf("OK %.4f %llu %llu\n", dt, (unsigned long long)cs.bytes_read,
                       (unsigned long long)v->bad);
            else
                printf("ERR %s\n", rc ? err.msg : "incomplete generation");
            free(v);
        } else if (sscanf(line, "naive_compat %llu", &g) == 1) {
            /* The baseline: every worker reads every tensor from the store. */
            verify_ctx *v = calloc(1, sizeof *v);
            if (!v)
                return 1;
            *v = (verify_ctx){ .m = &a.m, .g = g };
            uint64_t gen = 0;
            int rc = ferry_weights_update_compat(a.s, a.model, &gen, check_full, v, &st, &err);
            double dt = cli_now() - t0;
            if (rc == 0 && gen == g && v->seen == a.m.n)
                printf("OK %.4f %llu %llu\n", dt, (unsigned long long)st.bytes_read,
                       (unsigned long long)v->bad);
            else
                printf("ERR %s\n", rc ? err.msg : "incomplete generation");
            free(v);
        } else {
            break;
        }
        fflush(stdout);
    }
    demo_xfer_close(&x);
    fp8_close(&f8);
    ferry_compat_group_close(cg);
    ferry_subscriber_close(sub);
    for (size_t k = 0; k < ns; k++)
        free(sh[k].dst);
    free(sh);
    free(first);
    ferry_store_close(a.s);
    demo_model_free(&a.m);
    return 0;
}
