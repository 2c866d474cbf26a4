/* Sparse generations in the weights registry, against a real master and
 * node: dense g1, sparse g2 (base g1) and g3 (base g2) announced with one
 * compare-and-swap each; a worker at g1 applies g2 then g3, a worker at
 * g2 only g3; a fresh worker (one of its shards a transposed view) loads
 * g1 dense and applies the chain; a restarted worker (a new store client)
 * discovers the active sparse generation and its chain; a worker at a
 * generation that is not a delta's base is refused with nothing applied,
 * as are bad announcements (active unchanged); retention retires sparse
 * objects with their generations (the store's objects counted before and
 * after) and never the chain to the active generation. Every element is
 * compared with a dense oracle (small integers in f32: exact). */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/ftstore.h"
#include "ferry/sparse.h"
#include "ferry/weights.h"

static int setup(void **state) { return ft_solo_setup(state, 64u << 20, 10000); }
static int teardown(void **state) { return ft_solo_teardown(state); }

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The model: a [40, 24], b [30], c [16, 8], all f32. */
#define NT 3
#define MAXE (40 * 24)
static const uint32_t t_ndim[NT] = {2, 1, 2};
static const uint64_t t_shape[NT][2] = {{40, 24}, {30, 0}, {16, 8}};
static uint64_t t_elems(int t) { return t_shape[t][0] * (t_ndim[t] == 2 ? t_shape[t][1] : 1); }

typedef struct model {
    char name[32];
    char tname[NT][64];
    float w[8][NT][MAXE];        /* the oracle per generation */
    char keys[8][NT][512];       /* sparse objects per generation */
    size_t nkeys[8];
} model;

static void model_init(model *m, const char *name)
{
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    static const char *const base[NT] = {"a", "b", "c"};
    for (int t = 0; t < NT; t++)
        snprintf(m->tname[t], sizeof m->tname[t], "%s.%s", name, base[t]);   /* sparse keys are per tensor */
    for (int t = 0; t < NT; t++)
        for (uint64_t i = 0; i < t_elems(t); i++)
            m->w[1][t][i] = (float)((i * 7 + (uint64_t)t * 5) % 31) - 15;
}

static void publish_dense(ferry_store *s, model *m, uint64_t gen)
{
    static const uint32_t rank_node[1] = {0};
    ferry_publisher_config pc = {.rank = 0, .world = 1, .rank_node = rank_node, .keep = 2,
                                 .timeout_ms = 30000};
    snprintf(pc.model, sizeof pc.model, "%s", m->name);
    ferry_weight_tensor wt[NT];
    for (int t = 0; t < NT; t++) {
        wt[t] = (ferry_weight_tensor){.name = m->tname[t], .dtype = "f32", .ndim = t_ndim[t],
                                      .data = m->w[gen][t]};
        wt[t].shape[0] = t_shape[t][0];
        wt[t].shape[1] = t_shape[t][1];
    }
    ferry_publish_stats st;
    ferry_error err = {0};
    if (ferry_publish(s, &pc, gen, wt, NT, &st, &err) != 0)
        fail_msg("publish %s %" PRIu64 ": %s", m->name, gen, err.msg);
}

/* Sparse generation gen on gen - 1: tensors a and b change (c does not),
 * w[gen] = w[gen - 1] + delta; the objects' keys in m->keys[gen]. */
static void put_delta(ferry_store *s, model *m, uint64_t gen, uint64_t base)
{
    memcpy(m->w[gen], m->w[base], sizeof m->w[gen]);
    m->nkeys[gen] = 0;
    for (int t = 0; t < 2; t++) {
        uint64_t ne = t_elems(t), nnz = ne / 10;
        int64_t idx[MAXE * 2];
        float val[MAXE];
        for (uint64_t i = 0; i < nnz; i++) {
            uint64_t e = rnd() % ne;
            float v = (float)((int)(rnd() % 9) - 4);
            if (t_ndim[t] == 2) {
                idx[2 * i] = (int64_t)(e / t_shape[t][1]);
                idx[2 * i + 1] = (int64_t)(e % t_shape[t][1]);
            } else {
                idx[i] = (int64_t)e;
            }
            val[i] = v;
            m->w[gen][t][e] += v;   /* duplicates are summed, as the put does */
        }
        ferry_sparse_desc d = {.ndim = t_ndim[t], .base_generation = base,
                               .delta_generation = gen, .apply = FERRY_SPARSE_SCATTER_ADD,
                               .nnz = nnz};
        d.shape[0] = t_shape[t][0];
        d.shape[1] = t_shape[t][1];
        snprintf(d.tensor_id, sizeof d.tensor_id, "%s", m->tname[t]);
        snprintf(d.index_dtype, sizeof d.index_dtype, "i64");
        snprintf(d.value_dtype, sizeof d.value_dtype, "f32");
        ferry_error err = {0};
        if (ferry_put_sparse_object(s, &d, idx, val, NULL, m->keys[gen][m->nkeys[gen]],
                                    sizeof m->keys[gen][0], &err) != 0)
            fail_msg("put %s %" PRIu64 ": %s", m->tname[t], gen, err.msg);
        m->nkeys[gen]++;
    }
}

static int announce(ferry_store *s, model *m, uint64_t gen, uint64_t base, uint32_t keep,
                    ferry_sparse_announce_stats *st, ferry_error *err)
{
    const char *keys[NT];
    for (size_t i = 0; i < m->nkeys[gen]; i++)
        keys[i] = m->keys[gen][i];
    return ferry_sparse_announce(s, m->name, base, gen, keys, m->nkeys[gen], keep, st, err);
}

static void put_and_announce(ferry_store *s, model *m, uint64_t gen, uint64_t base)
{
    put_delta(s, m, gen, base);
    ferry_sparse_announce_stats st;
    ferry_error err = {0};
    if (announce(s, m, gen, base, 2, &st, &err) != 0)
        fail_msg("announce %s %" PRIu64 ": %s", m->name, gen, err.msg);
    assert_int_equal(st.objects, m->nkeys[gen]);
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(s, m->name, &active, NULL, NULL), 0);   /* whole (probes) */
    assert_int_equal(active, gen);
}

/* A worker: every tensor whole, contiguous, or `a` transposed. */
typedef struct worker {
    float buf[NT][MAXE];
    ferry_param_shard sh[NT];
    bool transposed;
    uint64_t held;
} worker;

static void worker_init(worker *w, const model *m, bool transposed)
{
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < NT * MAXE; i++)
        w->buf[i / MAXE][i % MAXE] = -999;
    w->transposed = transposed;
    for (int t = 0; t < NT; t++) {
        ferry_param_shard *p = &w->sh[t];
        *p = (ferry_param_shard){.tensor = m->tname[t], .ndim = t_ndim[t], .dst = w->buf[t],
                                 .dst_bytes = sizeof w->buf[t]};
        p->shape[0] = t_shape[t][0];
        p->shape[1] = t_shape[t][1];
    }
    if (transposed) {   /* a[r][c] at buf[c * 40 + r] */
        w->sh[0].strides[0] = 1;
        w->sh[0].strides[1] = (int64_t)t_shape[0][0];
    }
}

static void worker_check(const worker *w, const model *m, uint64_t gen)
{
    for (int t = 0; t < NT; t++)
        for (uint64_t e = 0; e < t_elems(t); e++) {
            uint64_t at = e;
            if (t == 0 && w->transposed)
                at = (e % t_shape[0][1]) * t_shape[0][0] + e / t_shape[0][1];
            if (w->buf[t][at] != m->w[gen][t][e])
                fail_msg("%s element %" PRIu64 " is %g, generation %" PRIu64 " has %g", m->tname[t],
                         e, (double)w->buf[t][at], gen, (double)m->w[gen][t][e]);
        }
}

static int update(ferry_store *s, const model *m, worker *w, bool no_dense,
                  ferry_sparse_update_stats *st, ferry_error *err)
{
    ferry_sparse_update_config cfg = {.no_dense = no_dense};
    snprintf(cfg.model, sizeof cfg.model, "%s", m->name);
    return ferry_sparse_update(s, &cfg, w->sh, NT, &w->held, st, err);
}

static uint64_t count(ferry_store *s, const char *prefix)
{
    char **ks = NULL;
    size_t n = 0;
    bool more = false;
    assert_int_equal(ferry_store_list(s, prefix, NULL, 10000, &ks, &n, &more, NULL), 0);
    ferry_store_free(ks);
    return n;
}

/* Workers at g1 and g2 follow the chain; the stats say what they did. */
static void test_worker_at_base(void **state)
{
    ft_solo *f = *state;
    static model m;
    static worker a, b;
    model_init(&m, "sgbase");
    publish_dense(f->s, &m, 1);
    worker_init(&a, &m, false);
    worker_init(&b, &m, false);
    ferry_sparse_update_stats st;
    ferry_error err = {0};
    assert_int_equal(update(f->s, &m, &a, false, &st, &err), 0);   /* dense g1 (active) */
    assert_int_equal(a.held, 1);
    assert_int_equal(st.dense_generation, 1);
    memcpy(&b, &a, sizeof a);
    for (int t = 0; t < NT; t++)
        b.sh[t].dst = b.buf[t];
    worker_check(&b, &m, 1);
    put_and_announce(f->s, &m, 2, 1);
    assert_int_equal(update(f->s, &m, &a, false, &st, &err), 0);
    assert_int_equal(a.held, 2);
    assert_int_equal(st.deltas, 1);
    assert_int_equal(st.dense_generation, 0);
    worker_check(&a, &m, 2);
    put_and_announce(f->s, &m, 3, 2);
    assert_int_equal(update(f->s, &m, &a, false, &st, &err), 0);   /* at g2: g3 only */
    assert_int_equal(st.deltas, 1);
    worker_check(&a, &m, 3);
    assert_int_equal(update(f->s, &m, &b, false, &st, &err), 0);   /* at g1: g2 then g3 */
    assert_int_equal(b.held, 3);
    assert_int_equal(st.deltas, 2);
    assert_int_equal(st.dense_generation, 0);
    assert_int_equal(st.dense_bytes, 0);
    assert_true(st.entries_applied > 0);
    assert_int_equal(st.read.source_objects, 4);
    worker_check(&b, &m, 3);
    print_message("# worker at g1: deltas=%" PRIu64 " entries_applied=%" PRIu64 " bytes_read=%"
                  PRIu64 " unique_range_gets=%" PRIu64 "\n", st.deltas, st.entries_applied,
                  st.read.bytes_read, st.read.unique_range_gets);
    /* current: nothing read */
    assert_int_equal(update(f->s, &m, &b, false, &st, &err), 0);
    assert_int_equal(st.deltas, 0);
    assert_int_equal(st.read.bytes_read, 0);
    /* a dense update cannot load a delta: it says what can */
    uint64_t g = 1;
    assert_int_equal(ferry_weights_update_direct(f->s, m.name, &g, b.sh, NT, NULL, &err),
                     FERRY_ESTATE);
    assert_non_null(strstr(err.msg, "sparse delta on generation 2"));
    assert_non_null(strstr(err.msg, "ferry_sparse_update"));
    print_message("# dense update at g3: %s\n", err.msg);
}

/* A fresh worker loads g1 and applies the chain; a restarted one finds it. */
static void test_fresh_and_restarted(void **state)
{
    ft_solo *f = *state;
    static model m;
    static worker w;
    model_init(&m, "sgfresh");
    publish_dense(f->s, &m, 1);
    put_and_announce(f->s, &m, 2, 1);
    put_and_announce(f->s, &m, 3, 2);
    worker_init(&w, &m, true);
    ferry_sparse_update_stats st;
    ferry_error err = {0};
    assert_int_equal(update(f->s, &m, &w, false, &st, &err), 0);
    assert_int_equal(w.held, 3);
    assert_int_equal(st.dense_generation, 1);
    assert_int_equal(st.dense_bytes, (40 * 24 + 30 + 16 * 8) * 4);
    assert_int_equal(st.deltas, 2);
    worker_check(&w, &m, 3);
    print_message("# fresh worker: dense g%" PRIu64 " (%" PRIu64 " bytes, a transposed) + %"
                  PRIu64 " deltas\n", st.dense_generation, st.dense_bytes, st.deltas);

    /* A restarted worker: a new client with nothing but the store. */
    ferry_store_config cfg;
    ft_store_config(&f->c, &cfg);
    ferry_store *s2 = NULL;
    assert_int_equal(ferry_store_open(&cfg, &s2, NULL), 0);
    ferry_weights_status ws;
    assert_int_equal(ferry_weights_active_status(s2, m.name, &ws, &err), 0);
    assert_int_equal(ws.generation, 3);
    assert_false(ws.lost);
    ferry_sparse_chain ch;
    assert_int_equal(ferry_sparse_chain_resolve(s2, m.name, 0, &ch, &err), 0);
    assert_int_equal(ch.active, 3);
    assert_int_equal(ch.dense, 1);
    assert_true(ch.load_dense);
    assert_int_equal(ch.nlinks, 2);
    assert_int_equal(ch.links[0].generation, 2);
    assert_int_equal(ch.links[0].base, 1);
    assert_int_equal(ch.links[1].generation, 3);
    assert_int_equal(ch.links[1].nkeys, 2);
    ferry_sparse_chain_free(&ch);
    assert_int_equal(ferry_sparse_chain_resolve(s2, m.name, 2, &ch, &err), 0);
    assert_false(ch.load_dense);
    assert_int_equal(ch.nlinks, 1);
    assert_int_equal(ch.links[0].generation, 3);
    ferry_sparse_chain_free(&ch);
    assert_int_equal(ferry_sparse_chain_resolve(s2, m.name, 3, &ch, &err), 0);
    assert_int_equal(ch.nlinks, 0);
    assert_false(ch.load_dense);
    ferry_sparse_chain_free(&ch);
    static worker r;
    worker_init(&r, &m, false);
    assert_int_equal(update(s2, &m, &r, false, &st, &err), 0);
    worker_check(&r, &m, 3);
    ferry_store_close(s2);
}

/* ferry_sparse_active: the announced generation and its kind, as the chain
 * says it, after dense and sparse announcements in turn. */
static void test_sparse_active(void **state)
{
    ft_solo *f = *state;
    static model m;
    model_init(&m, "sgactive");
    uint64_t g = 7;
    bool sparse = true;
    ferry_error err = {0};
    assert_int_equal(ferry_sparse_active(f->s, m.name, &g, &sparse, &err), FERRY_ENOENT);
    assert_non_null(strstr(err.msg, "no generation of sgactive"));
    assert_int_equal(g, 0);
    assert_false(sparse);
    assert_int_equal(ferry_sparse_active(f->s, "bad/name", &g, &sparse, &err), FERRY_EINVAL);
    publish_dense(f->s, &m, 1);
    assert_int_equal(ferry_sparse_active(f->s, m.name, &g, &sparse, &err), 0);
    assert_int_equal(g, 1);
    assert_false(sparse);
    put_and_announce(f->s, &m, 2, 1);
    assert_int_equal(ferry_sparse_active(f->s, m.name, &g, &sparse, &err), 0);
    assert_int_equal(g, 2);
    assert_true(sparse);
    ferry_sparse_chain ch;
    assert_int_equal(ferry_sparse_chain_resolve(f->s, m.name, 1, &ch, &err), 0);
    assert_int_equal(ch.nlinks, 1);   /* the chain agrees */
    ferry_sparse_chain_free(&ch);
    publish_dense(f->s, &m, 3);   /* the mark still names 2: 3 reads as dense */
    assert_int_equal(ferry_sparse_active(f->s, m.name, &g, &sparse, &err), 0);
    assert_int_equal(g, 3);
    assert_false(sparse);
}

/* Wrong bases: refused, nothing applied, nothing announced. */
static void test_wrong_base(void **state)
{
    ft_solo *f = *state;
    static model m;
    static worker w, before;
    model_init(&m, "sgwrong");
    publish_dense(f->s, &m, 1);
    worker_init(&w, &m, false);
    ferry_sparse_update_stats st;
    ferry_error err = {0};
    assert_int_equal(update(f->s, &m, &w, false, &st, &err), 0);
    put_and_announce(f->s, &m, 2, 1);
    put_and_announce(f->s, &m, 3, 2);
    memcpy(&before, &w, sizeof w);

    /* g3's delta read directly by a worker at g1: the fence refuses it */
    ferry_sparse_target t = {.ndim = 2, .shape = {40, 24}};
    snprintf(t.tensor_id, sizeof t.tensor_id, "%s", m.tname[0]);
    const char *k3[1] = {m.keys[3][0]};
    ferry_sparse_result *res = NULL;
    size_t nres = 0;
    assert_int_equal(ferry_read_sparse_objects(f->s, k3, 1, &t, 1, NULL, &res, &nres, NULL, &err), 0);
    assert_int_equal(nres, 1);
    assert_int_equal(ferry_sparse_apply(res, w.buf[0], "f32", 1, NULL, &err), FERRY_ESTATE);
    assert_non_null(strstr(err.msg, "applies to base generation 2 but the buffer holds generation 1"));
    print_message("# at g1, g3's delta: %s\n", err.msg);
    ferry_sparse_results_free(res, nres);
    assert_memory_equal(w.buf, before.buf, sizeof w.buf);

    /* off the chain with no dense load allowed: refused, nothing written */
    static worker fresh, fresh0;
    worker_init(&fresh, &m, false);
    memcpy(&fresh0, &fresh, sizeof fresh);
    assert_int_equal(update(f->s, &m, &fresh, true, &st, &err), FERRY_ESTATE);
    assert_non_null(strstr(err.msg, "not on the active chain"));
    assert_non_null(strstr(err.msg, "nothing applied"));
    assert_memory_equal(fresh.buf, fresh0.buf, sizeof fresh.buf);
    assert_int_equal(fresh.held, 0);
    print_message("# off the chain: %s\n", err.msg);
    /* a generation newer than the active one */
    w.held = 9;
    assert_int_equal(update(f->s, &m, &w, false, &st, &err), FERRY_ESTATE);
    assert_non_null(strstr(err.msg, "newer than the active generation 3"));
    w.held = 1;
    assert_memory_equal(w.buf, before.buf, sizeof w.buf);

    /* bad announcements: nothing announced, g3 stays active */
    put_delta(f->s, &m, 4, 3);
    ferry_sparse_announce_stats as;
    assert_int_equal(announce(f->s, &m, 4, 2, 2, &as, &err), FERRY_ESTATE);   /* base not active */
    assert_non_null(strstr(err.msg, "active generation is 3"));
    print_message("# announce on a stale base: %s\n", err.msg);
    const char *wrong[1] = {m.keys[3][0]};   /* a 2 -> 3 object for 3 -> 4 */
    assert_int_equal(ferry_sparse_announce(f->s, m.name, 3, 4, wrong, 1, 2, &as, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "the delta 2 -> 3, not 3 -> 4"));
    const char *missing[1] = {"ferry/sp/none/00000000000000000003-00000000000000000004/rep"};
    assert_int_equal(ferry_sparse_announce(f->s, m.name, 3, 4, missing, 1, 2, &as, &err), FERRY_ENOENT);
    const char *twice[2] = {m.keys[4][0], m.keys[4][0]};
    assert_int_equal(ferry_sparse_announce(f->s, m.name, 3, 4, twice, 2, 2, &as, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "named twice"));
    /* a tensor the dense generation lacks */
    int64_t idx[2] = {0, 0};
    float val[1] = {1};
    ferry_sparse_desc d = {.ndim = 2, .shape = {4, 4}, .base_generation = 3, .delta_generation = 4,
                           .apply = FERRY_SPARSE_SCATTER_ADD, .nnz = 1};
    snprintf(d.tensor_id, sizeof d.tensor_id, "sgwrong.other");
    snprintf(d.index_dtype, sizeof d.index_dtype, "i64");
    snprintf(d.value_dtype, sizeof d.value_dtype, "f32");
    char ok[512];
    assert_int_equal(ferry_put_sparse_object(f->s, &d, idx, val, NULL, ok, sizeof ok, &err), 0);
    const char *other[1] = {ok};
    assert_int_equal(ferry_sparse_announce(f->s, m.name, 3, 4, other, 1, 2, &as, &err), FERRY_EINVAL);
    assert_non_null(strstr(err.msg, "is not in dense generation 1"));
    uint64_t active = 0;
    assert_int_equal(ferry_weights_active(f->s, m.name, &active, NULL, NULL), 0);
    assert_int_equal(active, 3);
    /* the worker at g1 still updates through the chain */
    assert_int_equal(update(f->s, &m, &w, false, &st, &err), 0);
    worker_check(&w, &m, 3);
}

/* Retention: sparse objects go with their generations, the chain stays. */
static void test_retention(void **state)
{
    ft_solo *f = *state;
    static model m;
    model_init(&m, "sgkeep");
    char sp[64], dw[64];
    snprintf(sp, sizeof sp, "ferry/sp/%s.", m.name);
    snprintf(dw, sizeof dw, "ferry/w/%s/", m.name);
    publish_dense(f->s, &m, 1);
    uint64_t dense1 = count(f->s, dw);
    assert_true(dense1 > 0);
    put_and_announce(f->s, &m, 2, 1);
    put_and_announce(f->s, &m, 3, 2);   /* keep 2, widened to the chain 1 -> 2 -> 3 */
    assert_int_equal(count(f->s, sp), 4);
    assert_int_equal(count(f->s, dw), dense1);
    print_message("# after g3: %" PRIu64 " sparse objects, %" PRIu64 " dense objects\n",
                  count(f->s, sp), count(f->s, dw));
    memcpy(m.w[4], m.w[3], sizeof m.w[4]);
    m.w[4][2][5] += 1;
    publish_dense(f->s, &m, 4);   /* keep 2: g1 and g2 retire */
    assert_int_equal(count(f->s, sp), 2);   /* g3's */
    for (size_t i = 0; i < m.nkeys[2]; i++)
        assert_int_equal(ferry_store_exist(f->s, m.keys[2][i], NULL), 0);
    char g1[96];
    snprintf(g1, sizeof g1, "%s%020d/", dw, 1);
    assert_int_equal(count(f->s, g1), 0);   /* dense g1 retired too */
    uint64_t dense4 = count(f->s, dw);
    assert_int_equal(dense4, dense1);       /* g4's, as many as g1 had */
    print_message("# after dense g4: %" PRIu64 " sparse objects, %" PRIu64 " dense objects\n",
                  count(f->s, sp), dense4);
    put_delta(f->s, &m, 5, 4);
    ferry_sparse_announce_stats as;
    ferry_error err = {0};
    assert_int_equal(announce(f->s, &m, 5, 4, 2, &as, &err), 0);
    assert_int_equal(as.removed_generations, 1);   /* g3, its objects with it */
    assert_int_equal(as.chain, 2);
    assert_int_equal(count(f->s, sp), 2);
    for (size_t i = 0; i < m.nkeys[3]; i++)
        assert_int_equal(ferry_store_exist(f->s, m.keys[3][i], NULL), 0);
    put_delta(f->s, &m, 6, 5);
    assert_int_equal(announce(f->s, &m, 6, 5, 2, &as, &err), 0);
    assert_int_equal(as.chain, 3);
    assert_int_equal(as.removed_generations, 0);   /* 4 -> 5 -> 6 stays whole */
    assert_int_equal(count(f->s, sp), 4);
    assert_int_equal(count(f->s, dw), dense4);
    print_message("# after sparse g5, g6 (keep 2): %" PRIu64 " sparse objects, %" PRIu64
                  " dense objects\n", count(f->s, sp), count(f->s, dw));
    static worker w;
    worker_init(&w, &m, false);
    ferry_sparse_update_stats st;
    assert_int_equal(update(f->s, &m, &w, false, &st, &err), 0);
    assert_int_equal(st.dense_generation, 4);
    assert_int_equal(st.deltas, 2);
    worker_check(&w, &m, 6);
}

/* A sparse generation with no objects (nothing changed) is a link like
 * any other. */
static void test_empty_delta(void **state)
{
    ft_solo *f = *state;
    static model m;
    static worker w;
    model_init(&m, "sgempty");
    publish_dense(f->s, &m, 1);
    worker_init(&w, &m, false);
    ferry_sparse_update_stats st;
    ferry_error err = {0};
    assert_int_equal(update(f->s, &m, &w, false, &st, &err), 0);
    ferry_sparse_announce_stats as;
    assert_int_equal(ferry_sparse_announce(f->s, m.name, 1, 2, NULL, 0, 2, &as, &err), 0);
    assert_int_equal(as.objects, 0);
    memcpy(m.w[2], m.w[1], sizeof m.w[2]);
    ferry_sparse_chain ch;
    assert_int_equal(ferry_sparse_chain_resolve(f->s, m.name, 1, &ch, &err), 0);
    assert_int_equal(ch.nlinks, 1);
    assert_int_equal(ch.links[0].nkeys, 0);
    ferry_sparse_chain_free(&ch);
    assert_int_equal(update(f->s, &m, &w, false, &st, &err), 0);
    assert_int_equal(w.held, 2);
    assert_int_equal(st.deltas, 1);
    assert_int_equal(st.entries_applied, 0);
    worker_check(&w, &m, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_at_base),
        cmocka_unit_test(test_fresh_and_restarted),
        cmocka_unit_test(test_sparse_active),
        cmocka_unit_test(test_wrong_base),
        cmocka_unit_test(test_retention),
        cmocka_unit_test(test_empty_delta),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
