/* A live update at kimi-k2's full tensor count: all 69,975 tensors of the
 * kimi-k2 preset with every dimension cut by KIMI_SCALE (about 1 GiB of
 * bf16), published from 8 trainer processes holding FSDP8 shards
 * (ferry_publish_shards), taken by 8 rollout processes in EP2 x TP4
 * parameter-direct (one single-pull subscriber group) and then by 2
 * rollout processes in compatibility mode (a compat group), every byte of
 * every shard and every full tensor compared with the value the publisher
 * wrote. Prints the publish and update times, tensors and bytes; asserts
 * only outcomes (every deadline is a generous bound on a condition). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "util/ftgroup.h"
#include "ferry/weights.h"
#include "ferry/weights_compat.h"

#define KIMI_SCALE 44        /* every dimension divided by this (rounded up) */
#define TRAINERS 8
#define ROLLOUTS 8
#define COMPAT 2
#define WAIT_MS 540000       /* a generous bound on each phase */
#define SEG_BYTES (3ull << 29)   /* the node's segment: 1.5 GiB for a 1 GiB generation */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The element at global row-major index i of tensor t in generation g:
 * a bf16 in [1, 2), different for neighbours, tensors and generations. */
static inline uint16_t bits(uint64_t g, uint64_t t, uint64_t i)
{
    uint64_t x = i * 0x9e3779b97f4a7c15ull + t * 0xc2b2ae3d27d4eb4full + g * 0x165667b19e3779f9ull;
    return (uint16_t)(0x3f80u | ((x >> 40) & 0x7fu));
}

/* kimi-k2 with every dimension cut by KIMI_SCALE, roles and layers kept. */
static ferry_model *small_kimi(void)
{
    ferry_model *src = NULL, *m = NULL;
    if (ferry_model_preset("kimi-k2", &src, NULL) < 0)
        return NULL;
    if (ferry_model_create("kimi-k2-small", ferry_model_layers(src), ferry_model_experts(src),
                           &m) < 0) {
        ferry_model_free(src);
        return NULL;
    }
    size_t n = ferry_model_tensor_count(src);
    for (size_t i = 0; i < n; i++) {
        ferry_model_tensor t;
        ferry_model_tensor_at(src, i, &t);
        for (uint32_t d = 0; d < t.desc.ndim; d++)
            t.desc.shape[d] = (t.desc.shape[d] + KIMI_SCALE - 1) / KIMI_SCALE;
        if (ferry_model_add_tensor(m, &t, NULL) < 0) {
            ferry_model_free(m);
            m = NULL;
            break;
        }
    }
    ferry_model_free(src);
    return m;
}

/* The placement of the model under layout text (a ferry_layout). */
static ferry_manifest *layout_of(const ferry_model *m, const char *text)
{
    ferry_layout l;
    ferry_manifest *out = NULL;
    ferry_error err = {0};
    if (ferry_layout_parse(text, &l, &err) < 0 || ferry_layout_build(m, &l, &out, &err) < 0)
        fprintf(stderr, "layout %s: %s\n", text, err.msg);
    return out;
}

/* Fill (or, with check, compare) a box of tensor t held contiguously at
 * buf: element (c0..cn) of the box is global element sum((off+c) * gstride).
 * Returns the elements that differ. */
static uint64_t box_pass(uint16_t *buf, const ferry_tensor_desc *d, uint64_t t,
                         const uint64_t *off, const uint64_t *shape, uint64_t g, bool check)
{
    uint32_t nd = d->ndim;
    uint64_t gs[FERRY_MAX_DIMS], s = 1, rows = 1;
    for (int k = (int)nd - 1; k >= 0; k--) {
        gs[k] = s;
        s *= d->shape[k];
    }
    uint64_t inner = nd ? shape[nd - 1] : 1;
    for (uint32_t k = 0; k + 1 < nd; k++)
        rows *= shape[k];
    uint64_t ctr[FERRY_MAX_DIMS] = {0}, bad = 0;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t base = nd ? off[nd - 1] : 0;
        for (uint32_t k = 0; k + 1 < nd; k++)
            base += (off[k] + ctr[k]) * gs[k];
        uint16_t *row = buf + r * inner;
        if (check) {
            for (uint64_t i = 0; i < inner; i++)
                bad += row[i] != bits(g, t, base + i);
        } else {
            for (uint64_t i = 0; i < inner; i++)
                row[i] = bits(g, t, base + i);
        }
        for (int k = (int)nd - 2; k >= 0 && ++ctr[k] == shape[k]; k--)
            ctr[k] = 0;
    }
    return bad;
}

static uint64_t box_elems(uint32_t nd, const uint64_t *shape)
{
    uint64_t n = 1;
    for (uint32_t k = 0; k < nd; k++)
        n *= shape[k];
    return n;
}

/* A store handle on the master at addr whose calls may take WAIT_MS: a
 * 128 MiB put by one of 18 processes on two busy cores can take longer
 * than the default 10 s. */
static int worker_store(const char *addr, ferry_store **s)
{
    ferry_error fe = {0};
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    cfg.lease_ms = 1;
    cfg.timeout_ms = WAIT_MS;
    *s = NULL;
    if (ferry_store_open(&cfg, s, &fe) < 0) {
        printf("ERR open %s\n", fe.msg);
        fflush(stdout);
        return -1;
    }
    return 0;
}

/* ---- a trainer: its FSDP8 shards, published ------------------------------------------ */

static int trainer_main(const char *addr, uint32_t rank, uint64_t gen)
{
    ferry_store *s = NULL;
    if (worker_store(addr, &s) < 0)
        return 1;
    double t0 = now_s();
    ferry_model *m = small_kimi();
    ferry_manifest *pl = m ? layout_of(m, "fsdp:8") : NULL;
    if (!pl) {
        printf("ERR cannot build the placement\n");
        return 1;
    }
    uint64_t nf = ferry_manifest_fragment_count(pl), bytes = 0;
    ferry_shard_data *mine = calloc(nf / TRAINERS + 1024, sizeof *mine);
    size_t n = 0;
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(pl, id, &f) < 0 || f.rank != rank)
            continue;
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(pl, f.tensor, &d);
        uint64_t e = box_elems(d.ndim, f.shape);
        uint16_t *buf = malloc(e * 2);
        box_pass(buf, &d, f.tensor, f.offset, f.shape, gen, false);
        mine[n++] = (ferry_shard_data){ .fragment = id, .data = buf };
        bytes += e * 2;
    }
    double t1 = now_s();
    uint32_t nodes[TRAINERS] = {0};
    ferry_publisher_config pc = { .model = "kimi", .rank = rank, .world = TRAINERS,
                                  .rank_node = nodes, .keep = 2, .timeout_ms = WAIT_MS };
    ferry_publish_stats st;
    ferry_error err = {0};
    int rc = ferry_publish_shards(s, &pc, gen, pl, mine, n, &st, &err);
    double t2 = now_s();
    if (rc == 0)
        printf("OK publish_s %.3f setup_s %.3f pieces %zu bytes %llu tensors %llu total_tensors "
               "%llu total_bytes %llu put_s %.3f barrier_s %.3f commit_s %.3f\n", t2 - t1, t1 - t0,
               n, (unsigned long long)st.bytes, (unsigned long long)st.tensors,
               (unsigned long long)st.total_tensors, (unsigned long long)st.total_bytes, st.put_s,
               st.barrier_s, st.commit_s);
    else
        printf("ERR %d %s\n", rc, err.msg);
    fflush(stdout);
    for (size_t k = 0; k < n; k++)
        free((void *)mine[k].data);
    free(mine);
    ferry_manifest_close(pl);
    ferry_model_free(m);
    ferry_store_close(s);
    return 0;
}

/* ---- a rollout: its EP2 x TP4 shards, parameter-direct in a group ------------------------ */

static int rollout_main(const char *addr, uint32_t rank, uint64_t gen)
{
    ferry_store *s = NULL;
    if (worker_store(addr, &s) < 0)
        return 1;
    ferry_model *m = small_kimi();
    ferry_manifest *tl = m ? layout_of(m, "ep:2,tp:4") : NULL;
    if (!tl) {
        printf("ERR cannot build the layout\n");
        return 1;
    }
    uint64_t nf = ferry_manifest_fragment_count(tl), bytes = 0;
    size_t n = 0, cap = 1024;
    ferry_param_shard *sh = malloc(cap * sizeof *sh);
    uint32_t *tidx = malloc(cap * sizeof *tidx);
    for (uint64_t id = 0; id < nf; id++) {
        ferry_fragment f;
        if (ferry_manifest_fragment(tl, id, &f) < 0 || f.rank != rank)
            continue;
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(tl, f.tensor, &d);
        if (n == cap) {
            cap *= 2;
            sh = realloc(sh, cap * sizeof *sh);
            tidx = realloc(tidx, cap * sizeof *tidx);
        }
        uint64_t b = box_elems(d.ndim, f.shape) * 2;
        /* dst: an offset into the arena, made a pointer below */
        sh[n] = (ferry_param_shard){ .tensor = d.name, .ndim = d.ndim,
                                     .dst = (void *)(uintptr_t)bytes, .dst_bytes = b };
        memcpy(sh[n].offset, f.offset, sizeof f.offset);
        memcpy(sh[n].shape, f.shape, sizeof f.shape);
        tidx[n++] = f.tensor;
        bytes += b;
    }
    /* The parameters in one buffer, as a rollout engine holds them in a
     * few large ones: its shards touch, and their memory is one region. */
    uint8_t *arena = calloc(1, bytes ? bytes : 1);
    for (size_t k = 0; k < n; k++)
        sh[k].dst = arena + (uintptr_t)sh[k].dst;
    ferry_subscriber_config sc = { .model = "kimi", .group = "ep2tp4", .rank = rank,
                                   .world = ROLLOUTS, .timeout_ms = WAIT_MS };
    ferry_subscriber *sub = NULL;
    ferry_error err = {0};
    ferry_update_stats st = {0};
    uint64_t g = 0, bad = 0;
    double t0 = now_s();
    int rc = ferry_subscriber_open(s, &sc, sh, n, &sub, &err);
    if (rc == 0)
        rc = ferry_subscriber_update(sub, &g, &st, &err);
    double t1 = now_s();
    for (size_t k = 0; rc == 0 && k < n; k++) {
        ferry_tensor_desc d;
        (void)ferry_manifest_tensor(tl, tidx[k], &d);
        bad += box_pass(sh[k].dst, &d, tidx[k], sh[k].offset, sh[k].shape, gen, true);
    }
    if (rc == 0)
        printf("OK update_s %.3f shards %zu bytes %llu gen %llu bad %llu bytes_read %llu "
               "pushed %llu received %llu group_read %llu prepare_s %.3f plan_s %.3f apply_s %.3f\n",
               t1 - t0, n, (unsigned long long)bytes, (unsigned long long)g,
               (unsigned long long)bad, (unsigned long long)st.bytes_read,
               (unsigned long long)st.bytes_pushed, (unsigned long long)st.bytes_received,
               (unsigned long long)st.group_bytes_read, st.prepare_s, st.plan_s, st.apply_s);
    else
        printf("ERR %d %s\n", rc, err.msg);
    fflush(stdout);
    ferry_subscriber_close(sub);
    free(arena);
    free(sh);
    free(tidx);
    ferry_manifest_close(tl);
    ferry_model_free(m);
    ferry_store_close(s);
    return 0;
}

/* ---- a rollout in compatibility mode: every full tensor ---------------------------------- */

typedef struct compat_ctx { uint64_t gen, bad, tensors, bytes, order_bad; } compat_ctx;

static int on_tensor(void *ctx, const ferry_weight_entry *e, const void *data)
{
    compat_ctx *c = ctx;
    const uint16_t *b = data;
    c->order_bad += e->index != c->tensors;   /* manifest order */
    for (uint64_t i = 0; i < e->bytes / 2; i++)
        c->bad += b[i] != bits(c->gen, e->index, i);
    c->tensors++;
    c->bytes += e->bytes;
    return 0;
}

static int compat_main(const char *addr, uint32_t rank, uint64_t gen)
{
    ferry_store *s = NULL;
    if (worker_store(addr, &s) < 0)
        return 1;
    ferry_compat_config cc = { .model = "kimi", .group = "compat", .rank = rank, .world = COMPAT,
                               .staging_bytes = 64u << 20, .timeout_ms = WAIT_MS };
    ferry_compat_group *cg = NULL;
    ferry_compat_stats st = {0};
    ferry_error err = {0};
    compat_ctx ctx = { .gen = gen };
    uint64_t g = 0;
    double t0 = now_s();
    int rc = ferry_compat_group_open(s, &cc, &cg, &err);
    if (rc == 0)
        rc = ferry_compat_group_update(cg, &g, on_tensor, &ctx, &st, &err);
    double t1 = now_s();
    if (rc == 0)
        printf("OK update_s %.3f tensors %llu bytes %llu gen %llu bad %llu order_bad %llu "
               "read %llu group_read %llu batches %u prepare_s %.3f read_s %.3f wait_s %.3f verify_s %.3f "
               "load_s %.3f barrier_s %.3f\n", t1 - t0,
               (unsigned long long)ctx.tensors, (unsigned long long)ctx.bytes,
               (unsigned long long)g, (unsigned long long)ctx.bad,
               (unsigned long long)ctx.order_bad, (unsigned long long)st.bytes_read,
               (unsigned long long)st.group_bytes_read, st.batches, st.prepare_s, st.read_s, st.wait_s,
               st.verify_s, st.load_s, st.barrier_s);
    else
        printf("ERR %d %s\n", rc, err.msg);
    fflush(stdout);
    ferry_compat_group_close(cg);
    ferry_store_close(s);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------- */

typedef struct phase { const char *role, *addr, *gen; } phase;

static void role_args(const void *ctx, int rank, ftg_args *a)
{
    const phase *p = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    const char *v[] = { p->role, p->addr, a->buf[0], p->gen, NULL };
    memcpy(a->argv, v, sizeof v);
}

/* Run n processes of a role to their one reply each; every reply OK. */
static double run_phase(ftg_env *e, const char *role, int n, uint64_t gen)
{
    char gs[32];
    snprintf(gs, sizeof gs, "%llu", (unsigned long long)gen);
    phase p = { role, e->c.addr, gs };
    double t0 = now_s();
    assert_int_equal(ftg_spawn(e, n, role_args, &p, -1, NULL), 0);
    int ok = ftg_collect(e, WAIT_MS, -1);
    double wall = now_s() - t0;
    for (int k = 0; k < n; k++)
        fprintf(stderr, "  %s %d: %s\n", role + 2, k, e->line[k]);
    assert_int_equal(ok, n);
    return wall;
}

/* The number after "key " in line. */
static double field(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, " %s ", key);
    const char *p = strstr(line, k);
    return p ? strtod(p + strlen(k), NULL) : -1;
}

static void test_kimi_live(void **state)
{
    ftg_env *e = *state;
    ferry_model *m = small_kimi();
    assert_non_null(m);
    size_t ntensors = ferry_model_tensor_count(m);
    uint64_t model_bytes = ferry_model_bytes(m);
    ferry_model_free(m);
    fprintf(stderr, "kimi-k2 / %d: %zu tensors, %llu bytes\n", KIMI_SCALE, ntensors,
            (unsigned long long)model_bytes);
    assert_int_equal(ntensors, 69975);

    double pub_wall = run_phase(e, "--trainer", TRAINERS, 1);
    double pub_max = 0;
    uint64_t pub_bytes = 0;
    for (int k = 0; k < TRAINERS; k++) {
        double x = field(e->line[k], "publish_s");
        pub_max = x > pub_max ? x : pub_max;
        pub_bytes += (uint64_t)field(e->line[k], "bytes");
        assert_true(field(e->line[k], "total_tensors") == (double)ntensors);
        assert_true(field(e->line[k], "total_bytes") == (double)model_bytes);
    }
    assert_int_equal(pub_bytes, model_bytes);   /* every byte stored once */
    ftg_stop(e);

    double dir_wall = run_phase(e, "--rollout", ROLLOUTS, 1);
    double dir_max = 0;
    uint64_t dir_bytes = 0;
    for (int k = 0; k < ROLLOUTS; k++) {
        double x = field(e->line[k], "update_s");
        dir_max = x > dir_max ? x : dir_max;
        dir_bytes += (uint64_t)field(e->line[k], "bytes");
        assert_true(field(e->line[k], "bad") == 0);
        assert_true(field(e->line[k], "gen") == 1);
        assert_true(field(e->line[k], "group_read") == (double)model_bytes);
    }
    ftg_stop(e);

    double compat_wall = run_phase(e, "--compat", COMPAT, 1);
    double compat_max = 0;
    for (int k = 0; k < COMPAT; k++) {
        double x = field(e->line[k], "update_s");
        compat_max = x > compat_max ? x : compat_max;
        assert_true(field(e->line[k], "bad") == 0);
        assert_true(field(e->line[k], "order_bad") == 0);
        assert_true(field(e->line[k], "tensors") == (double)ntensors);
        assert_true(field(e->line[k], "bytes") == (double)model_bytes);
        assert_true(field(e->line[k], "group_read") == (double)model_bytes);
    }
    ftg_stop(e);
    fprintf(stderr, "kimi live: %zu tensors, %llu bytes; publish %.2f s (slowest rank; %.2f s "
            "with process start), direct EP2xTP4 update %.2f s (slowest worker; %.2f s wall), "
            "%llu bytes of shards; compat update %.2f s (slowest; %.2f s wall), %llu bytes per "
            "worker; every byte verified\n", ntensors, (unsigned long long)model_bytes, pub_max,
            pub_wall, dir_max, dir_wall, (unsigned long long)dir_bytes, compat_max, compat_wall,
            (unsigned long long)model_bytes);
}

static int setup(void **state)
{
    ftg_env *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    for (int k = 0; k < FTG_MAX; k++)
        e->w[k].pid = -1;
    if (ft_solo_open(&e->c, &e->s, SEG_BYTES, NULL) != 0) {
        free(e);
        return -1;
    }
    *state = e;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--trainer"))
        return trainer_main(argv[2], (uint32_t)atoi(argv[3]), strtoull(argv[4], NULL, 10));
    if (argc == 5 && !strcmp(argv[1], "--rollout"))
        return rollout_main(argv[2], (uint32_t)atoi(argv[3]), strtoull(argv[4], NULL, 10));
    if (argc == 5 && !strcmp(argv[1], "--compat"))
        return compat_main(argv[2], (uint32_t)atoi(argv[3]), strtoull(argv[4], NULL, 10));
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kimi_live, setup, ftg_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
