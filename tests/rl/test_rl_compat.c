/* Compatibility mode through single-pull: four rollout processes as two
 * "nodes" of two (node ids 7 and 9; one machine, so shm carries every
 * WRITE) against a real master and node take published generations with a
 * staging buffer smaller than the model (several batches): every worker
 * gets every tensor, in manifest order, bit-exact; the group's store reads
 * equal the published bytes (the naive compat path reads world x that);
 * the WRITEs that cross nodes add up to (nodes - 1) x published; inside a
 * node nothing is written: (workers - nodes) x published is taken through
 * read-only views of a node-mate's staging (a worker that cannot make
 * views READs instead, test_compat_no_view); the second generation
 * imports no region and registers nothing new. Then failures: an object
 * removed before an update fails prepare on every worker (nothing loaded,
 * the generation stays); an object whose bytes no longer match their
 * checksum fails its leader's read during apply and every worker returns
 * FERRY_EREBUILD (nobody hangs); the next generation loads again. A
 * worker that goes silent makes the other time out, not hang; a staging
 * buffer smaller than a tensor is refused by every worker. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "rl/gen_int.h"
#include "rl/keys.h"
#include "util/ftgroup.h"
#include "ferry/weights_compat.h"

#define NT 9
#define WORLD 4
#define MODEL "compat"
static const uint64_t shapes[NT][2] = {
    {1024, 256}, {512, 512}, {2048, 64}, {333, 77}, {4096, 1}, {2, 2}, {700, 300}, {1, 1},
    {640, 129},
};
static const uint32_t node_of[WORLD] = { 7, 7, 9, 9 };

static uint16_t bits(uint64_t g, size_t t, uint64_t i)
{
    return (uint16_t)(0x3c00u | ((g * 40503u + t * 977u + i * 31u) & 0x3ffu));
}

static const ftg_model model = { .name = MODEL, .prefix = "model", .nt = NT, .shapes = shapes,
                                  .bits = bits };

/* ---- a rollout process ------------------------------------------------------------------ */

typedef struct check {
    uint64_t gen;
    size_t seen;           /* tensors handed over, in order */
    uint64_t bad;          /* wrong bytes, wrong order, wrong size */
    size_t die_at;         /* this process kills itself when handed this tensor (0: never) */
} check;

static int load(void *ctx, const ferry_weight_entry *e, const void *data)
{
    check *c = ctx;
    char names[NT][32];
    ftg_names(&model, names);
    size_t k = c->seen++;
    if (c->die_at && k == c->die_at)
        raise(SIGKILL);   /* in the middle of the update: what it leads stops coming */
    if (k >= NT || strcmp(e->name, names[k]) != 0 || e->bytes != shapes[k][0] * shapes[k][1] * 2) {
        c->bad++;
        return 0;
    }
    const uint16_t *p = data;
    for (uint64_t i = 0; i < shapes[k][0] * shapes[k][1]; i++)
        c->bad += p[i] != bits(c->gen, k, i);
    return 0;
}

typedef struct rollout {
    ferry_store *s;
    ferry_compat_group *g;
    uint64_t gen;
    size_t die_at;
} rollout;

static void rollout_update(void *ctx, uint64_t want)
{
    rollout *w = ctx;
    if (want == 0) {   /* "update 0": the warm-up */
        uint64_t bytes = 0;
        ferry_error err = {0};
        int rc = ferry_compat_group_warm(w->g, &bytes, &err);
        printf("WARM %d %llu %s\n", rc, (unsigned long long)bytes, err.msg);
        return;
    }
    check c = { .gen = want, .die_at = w->die_at };
    ferry_compat_stats st;
    ferry_error err = {0};
    size_t regions = ferry_engine_region_count(ferry_store_engine(w->s));
    int rc = ferry_compat_group_update(w->g, &w->gen, load, &c, &st, &err);
    size_t regions_after = ferry_engine_region_count(ferry_store_engine(w->s));
    if (rc == 0 && w->gen == want)
        printf("OK %llu %llu %llu %llu %llu %llu %llu %llu %u %u %u %zu %llu %zu %zu %u %u %llu"
               " | prepare %.4f exchange %.4f plan %.4f read %.4f wait %.4f verify %.4f"
               " load %.4f barrier %.4f apply %.4f total %.4f\n",
               (unsigned long long)st.bytes_read, (unsigned long long)st.bytes_sent_cross,
               (unsigned long long)st.bytes_sent_intra, (unsigned long long)st.bytes_received,
               (unsigned long long)st.group_bytes_read, (unsigned long long)st.group_cross_bytes,
               (unsigned long long)st.group_intra_bytes, (unsigned long long)st.bytes,
               st.nodes, st.batches, st.imported, c.seen, (unsigned long long)c.bad, regions,
               regions_after, st.staging_slots, st.pipelined_batches,
               (unsigned long long)st.bytes_viewed, st.prepare_s, st.exchange_s, st.plan_s, st.read_s, st.wait_s,
               st.verify_s, st.load_s, st.barrier_s, st.apply_s, st.total_s);
    else
        printf("ERR %d %llu %zu %s\n", rc, (unsigned long long)w->gen, c.seen, err.msg);
}

static int rollout_main(const char *addr, const char *group, uint32_t rank, uint32_t world,
                        uint64_t staging, uint64_t timeout_ms, uint64_t segment, size_t die_at)
{
    rollout w = { .die_at = die_at };
    if (ftg_worker_store(addr, &w.s) < 0)
        return 1;
    /* world 4: nodes 7, 7, 9, 9; world 2: nodes 7, 9 */
    ferry_compat_config cc = { .model = MODEL, .rank = rank, .world = world,
                               .node = node_of[world == WORLD ? rank : rank * 2],
                               .staging_bytes = staging, .timeout_ms = timeout_ms,
                               .local_segment = segment };
    snprintf(cc.group, sizeof cc.group, "%s", group);
    ferry_error err = {0};
    if (ferry_compat_group_open(w.s, &cc, &w.g, &err) < 0) {
        printf("ERR %s\n", err.msg);
        return 1;
    }
    ftg_worker_serve(rollout_update, &w);
    ferry_compat_group_close(w.g);
    ferry_store_close(w.s);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------------ */

/* The arguments of rollout_main but the rank. */
typedef struct rollout_opts {
    const char *addr, *group, *world;
    const char *staging, *staging0;   /* staging bytes; rank 0's (NULL: the same) */
    const char *timeout_ms;
    uint64_t seg7;   /* the segment node 7's workers name as theirs (0: none named) */
    int die_rank;    /* this worker kills itself at its die_at-th tensor (die_at 0: none) */
    size_t die_at;
} rollout_opts;

static void rollout_args(const void *ctx, int rank, ftg_args *a)
{
    const rollout_opts *o = ctx;
    snprintf(a->buf[0], sizeof a->buf[0], "%d", rank);
    snprintf(a->buf[1], sizeof a->buf[1], "%llu",
             node_of[rank] == 7 ? (unsigned long long)o->seg7 : 0ull);
    snprintf(a->buf[2], sizeof a->buf[2], "%zu", o->die_at && rank == o->die_rank ? o->die_at : 0);
    const char *v[] = { "--rollout", o->addr, o->group, a->buf[0], o->world,
                        rank == 0 && o->staging0 ? o->staging0 : o->staging, o->timeout_ms,
                        o->seg7 || o->die_at ? a->buf[1] : NULL, o->die_at ? a->buf[2] : NULL,
                        NULL };
    memcpy(a->argv, v, sizeof v);
}

/* Per worker, the store reads and cross-node WRITEs of the last update_ok. */
static uint64_t last_read[WORLD], last_cross[WORLD], last_viewed[WORLD], last_received[WORLD];

/* Every worker takes generation g; sums its counters. */
/* The rank started with FERRY_FAULT=map_fail=1 (no views), or -1. */
static int no_view_rank = -1;

static void update_ok(ftg_env *e, uint64_t g, uint64_t published, unsigned want_imported,
                      unsigned want_slots)
{
    assert_int_equal(ftg_send(e, "update %llu", (unsigned long long)g), 0);
    ftg_collect(e, 60000, -1);
    uint64_t read = 0, cross = 0, intra = 0, received = 0, viewed = 0;
    unsigned batches = 0;
    for (int k = 0; k < WORLD; k++) {
        const char *line = e->line[k];
        if (e->rc[k] != 0)
            fail_msg("worker %d: %s", k, line);
        unsigned long long a, b, c2, d, gr, gc, gi, bytes, bad, vw;
        unsigned nodes, nb, imported, slots, pipelined;
        size_t seen, regions, regions_after;
        if (sscanf(line, "OK %llu %llu %llu %llu %llu %llu %llu %llu %u %u %u %zu %llu %zu %zu %u %u "
                   "%llu", &a, &b, &c2, &d, &gr, &gc, &gi, &bytes, &nodes, &nb, &imported, &seen,
                   &bad, &regions, &regions_after, &slots, &pipelined, &vw) != 18)
            fail_msg("worker %d: %s", k, line);
        fprintf(stderr, "generation %llu, worker %d (node %u): %s\n", (unsigned long long)g, k,
                node_of[k], line);
        assert_int_equal(bad, 0);
        assert_int_equal(seen, NT);                 /* every tensor, in manifest order */
        assert_int_equal(bytes, published);
        /* the plan's figures, the same on every worker */
        assert_int_equal(nodes, 2);
        assert_int_equal(gr, published);
        assert_int_equal(gc, (2 - 1) * published);
        assert_int_equal(gi, (WORLD - 2) * published);
        assert_int_equal(imported, want_imported);  /* the other three staging regions, once */
        assert_int_equal(regions, regions_after);   /* nothing registered by an update */
        assert_true(nb > 1);                        /* the staging holds part of the model */
        if (k == 0)
            batches = nb;
        assert_int_equal(nb, batches);
        /* two staging halves: every batch after the first was read and sent
         * while the one before it was still on its way (one buffer: none) */
        assert_int_equal(slots, want_slots);
        if (want_slots == 2) {
            assert_true(nb > 2);
            assert_int_equal(pipelined, nb - 1);
        } else {
            assert_int_equal(pipelined, 0);
        }
        /* what this worker took in, through its staging or a view of a
         * node-mate's: everything it did not read itself */
        assert_int_equal(d + vw, published - a);
        last_read[k] = a;
        last_cross[k] = b;
        last_viewed[k] = vw;
        last_received[k] = d;
        read += a;
        cross += b;
        intra += c2;
        received += d;
        viewed += vw;
    }
    fprintf(stderr, "generation %llu: published %llu, store read %llu (%.2fx; the naive compat "
            "path reads %.2fx), cross-node WRITEs %llu (%.2fx), intra-node %llu (%.2fx), "
            "received %llu, through views %llu, %u batches\n",
            (unsigned long long)g, (unsigned long long)published, (unsigned long long)read,
            (double)read / (double)published, (double)WORLD, (unsigned long long)cross,
            (double)cross / (double)published, (unsigned long long)intra,
            (double)intra / (double)published, (unsigned long long)received,
            (unsigned long long)viewed, batches);
    assert_int_equal(read, published);               /* each byte read from the store once */
    assert_int_equal(cross, (2 - 1) * published);    /* one WRITE per remote node */
    /* inside a node (one machine: shm) no tensor is copied into a worker's
     * staging: its node-mates take it from the staging that has it,
     * through a view — unless a worker cannot make views (no_view_rank),
     * which READs them */
    if (no_view_rank < 0) {
        assert_int_equal(intra, 0);
        assert_int_equal(viewed, (WORLD - 2) * published);
    } else {
        assert_int_equal(intra, 0);
        assert_int_equal(last_viewed[no_view_rank], 0);
        assert_true(viewed > 0 && viewed < (WORLD - 2) * published);
    }
    assert_int_equal(received + viewed, (WORLD - 1) * published);
}

/* Every worker fails generation g with code `want` (or, want 0, any
 * error) within the deadline; returns how many named `needle`. */
/* The store key of the object holding tensor t's first piece in
 * generation g, and where the piece sits in it. */
static void piece_of(ferry_store *s, uint64_t g, uint32_t t, char *key, size_t cap,
                     uint64_t *off, uint64_t *bytes)
{
    fr_gen *gen = NULL;
    assert_int_equal(fr_gen_load(s, MODEL, g, &gen, NULL), 0);
    uint64_t frag = UINT64_MAX;
    for (uint64_t id = 0; frag == UINT64_MAX && id < ferry_manifest_fragment_count(gen->m); id++) {
        ferry_fragment fr;
        assert_int_equal(ferry_manifest_fragment(gen->m, id, &fr), 0);
        if (fr.tensor == t)
            frag = id;
    }
    const char *k;
    assert_int_equal(fr_gen_where(gen, frag, &k, off, bytes), 0);
    snprintf(key, cap, "%s", k);
    fr_gen_free(gen);
}

static int update_fails(ftg_env *e, uint64_t g, int want, uint64_t stays, const char *needle,
                        size_t max_seen)
{
    assert_int_equal(ftg_send(e, "update %llu", (unsigned long long)g), 0);
    ftg_collect(e, 60000, -1);
    int named = 0;
    for (int k = 0; k < WORLD; k++) {
        const char *line = e->line[k];
        assert_int_not_equal(e->rc[k], 0);
        fprintf(stderr, "generation %llu, worker %d: %s\n", (unsigned long long)g, k, line);
        int code;
        unsigned long long gen;
        size_t seen;
        if (sscanf(line, "ERR %d %llu %zu", &code, &gen, &seen) != 3)
            fail_msg("worker %d: %s", k, line);
        if (want)
            assert_int_equal(code, want);
        assert_int_equal(gen, stays);               /* the worker keeps its generation */
        assert_true(seen <= max_seen);
        named += strstr(line, needle) != NULL;
    }
    return named;
}

static void test_compat_group(void **state)
{
    ftg_env *e = *state;
    /* 1 MiB of staging: the largest tensor (512 KiB) fits in either half, the
     * model (2.1 MiB) in neither: five batches, pipelined */
    const rollout_opts group = { .addr = e->c.addr, .group = "rollout", .world = "4",
                                 .staging = "1048576", .timeout_ms = "5000" };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &group, -1, NULL), 0);
    uint64_t published = 0;
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    update_ok(e, 1, published, WORLD - 1, 2);
    assert_int_equal(ftg_publish(e->s, &model, 2, &published), 0);
    update_ok(e, 2, published, 0, 2);               /* registrations reused */

    /* The naive compatibility path, measured: each worker reads everything. */
    check c0 = { .gen = 2 };
    ferry_update_stats nst;
    uint64_t g0 = 0;
    ferry_error nerr = {0};
    assert_int_equal(ferry_weights_update_compat(e->s, MODEL, &g0, load, &c0, &nst, &nerr), 0);
    assert_int_equal(c0.bad, 0);
    assert_int_equal(nst.bytes_read, published);
    fprintf(stderr, "naive compat: one worker reads %llu bytes from the store; a group of %d "
            "reads %llu (%.2fx)\n", (unsigned long long)nst.bytes_read, WORLD,
            (unsigned long long)nst.bytes_read * WORLD, (double)WORLD);

    char names[NT][32];
    ftg_names(&model, names);
    /* An object gone before the update: prepare fails on every worker,
     * nothing is loaded, everyone stays on generation 2. */
    assert_int_equal(ftg_publish(e->s, &model, 3, NULL), 0);
    char key[FR_KEY_MAX];
    uint64_t off = 0, pbytes = 0;
    piece_of(e->s, 3, 6, key, sizeof key, &off, &pbytes);
    assert_int_equal(ferry_store_remove(e->s, key, NULL), 0);
    assert_int_equal(update_fails(e, 3, 0, 2, key, 0), WORLD);

    /* An object whose bytes no longer match the manifest: prepare passes,
     * its leader's read fails the checksum during apply, every worker
     * returns FERRY_EREBUILD, and none waits for the tensor forever. */
    assert_int_equal(ftg_publish(e->s, &model, 4, NULL), 0);
    piece_of(e->s, 4, 6, key, sizeof key, &off, &pbytes);
    void *obj = NULL;
    size_t len = 0;
    assert_int_equal(ferry_store_get(e->s, key, &obj, &len, NULL), 0);
    memset((uint8_t *)obj + off, 0, pbytes);   /* tensor 6's piece: zeros */
    /* The get leased it for 1 ms: a remove within that millisecond is
     * refused (EBUSY, seen once), so wait for the lease to lapse. */
    int rm = FERRY_EBUSY;
    for (int i = 0; i < 10000 && rm == FERRY_EBUSY; i++)
        if ((rm = ferry_store_remove(e->s, key, NULL)) == FERRY_EBUSY)
            nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    assert_int_equal(rm, 0);
    assert_int_equal(ferry_store_put(e->s, key, obj, len, NULL, NULL, NULL), 0);
    ferry_store_free(obj);
    int named = update_fails(e, 4, FERRY_EREBUILD, 2, "checksum", 6);
    assert_int_equal(named, WORLD);   /* the leader's reason reaches everyone */

    /* and the group recovers with the next generation */
    assert_int_equal(ftg_publish(e->s, &model, 5, &published), 0);
    update_ok(e, 5, published, 0, 2);
}

/* The warm-up (ferry_compat_group_warm): every worker imports the
 * others' staging and touches the view of its node-mate's before the
 * first update, which then imports nothing and still takes the mate's
 * tensors through that view; a member that never warms times the others
 * out with a sentence saying so. */
static void test_compat_warm(void **state)
{
    ftg_env *e = *state;
    const rollout_opts group = { .addr = e->c.addr, .group = "warm", .world = "4",
                                 .staging = "1048576", .timeout_ms = "5000" };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &group, -1, NULL), 0);
    assert_int_equal(ftg_send(e, "update 0"), 0);
    ftg_collect(e, 60000, -1);
    for (int k = 0; k < WORLD; k++) {
        int rc = -1;
        unsigned long long bytes = 0;
        fprintf(stderr, "worker %d: %s\n", k, e->line[k]);
        assert_int_equal(sscanf(e->line[k], "WARM %d %llu", &rc, &bytes), 2);
        assert_int_equal(rc, 0);
        assert_int_equal(bytes, 2 * 1048576);   /* its own staging and its one node-mate's */
    }
    uint64_t published = 0;
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    update_ok(e, 1, published, 0, 2);   /* nothing left to import; views as before */

    /* three of four warm: each says the group did not meet once its timeout passed */
    ftg_stop(e);
    const rollout_opts short_wait = { .addr = e->c.addr, .group = "warm3", .world = "4",
                                      .staging = "1048576", .timeout_ms = "300" };
    assert_int_equal(ftg_start(e, WORLD - 1, rollout_args, &short_wait, -1, NULL), 0);
    assert_int_equal(ftg_send(e, "update 0"), 0);
    ftg_collect(e, 60000, -1);
    for (int k = 0; k < WORLD - 1; k++) {
        fprintf(stderr, "worker %d of 3: %s\n", k, e->line[k]);
        char want[64];
        snprintf(want, sizeof want, "WARM %d 0 ", FERRY_ETIMEDOUT);
        assert_true(strncmp(e->line[k], want, strlen(want)) == 0);
        assert_non_null(strstr(e->line[k], "not every worker of group warm3 arrived within 300 ms"));
    }
}

/* A group of two on two nodes started with o (worker fault_rank with
 * FERRY_FAULT=fault) refuses generation 1 on both workers, each reply
 * starting with `want`. */
static void pair_refuses(ftg_env *e, const rollout_opts *o, int fault_rank, const char *fault,
                         const char *what, const char *want)
{
    assert_int_equal(ftg_start(e, 2, rollout_args, o, fault_rank, fault), 0);
    assert_int_equal(ftg_publish(e->s, &model, 1, NULL), 0);
    assert_int_equal(ftg_send(e, "update 1"), 0);
    ftg_collect(e, 30000, -1);
    for (int k = 0; k < 2; k++) {
        assert_int_not_equal(e->rc[k], 0);
        fprintf(stderr, "%s, worker %d: %s\n", what, k, e->line[k]);
        assert_true(strncmp(e->line[k], want, strlen(want)) == 0);
    }
}

/* A worker whose engine fails every post after its first (FERRY_FAULT=
 * post_fail_after=1: no store read, no WRITE, no NOTIFY) in a group of two on two nodes: the
 * other one hears nothing for the tensors that worker leads and gives up
 * after the group timeout; both return FERRY_EREBUILD, neither hangs.
 * Staging bytes as given; the worker that fails says why on e->line[1]. */
static void silent_leader(ftg_env *e, const char *group, const char *staging, const char *what)
{
    const rollout_opts o = { .addr = e->c.addr, .group = group, .world = "2",
                             .staging = staging, .timeout_ms = "1500" };
    char want[32];
    snprintf(want, sizeof want, "ERR %d 0 ", FERRY_EREBUILD);
    /* (one post goes: the read of the generation's placement in prepare) */
    pair_refuses(e, &o, 1, "post_fail_after=1", what, want);
}

/* 1 MiB of staging: five batches of a few tensors. */
static void test_compat_silent_leader(void **state)
{
    silent_leader(*state, "faulty", "1048576", "faulty group");
}

/* 8 MiB of staging: the whole model (9 tensors, 2.1 MiB) is one batch, and
 * each leader reads its tensors in one store run. That run fails on worker
 * 1; it fails all its tensors at once with the run's error (naming how
 * many and where they start, and the object), without reading them again
 * one by one (behind a stalled node, each of those reads could wait out
 * the store's timeout); worker 0, to which worker 1's engine can send
 * nothing, not even FAILED, gives up after the group timeout. */
static void test_compat_failed_group_read(void **state)
{
    ftg_env *e = *state;
    silent_leader(e, "faultyrun", "8388608", "faulty group read");
    assert_non_null(strstr(e->line[1], " tensors from model."));
    assert_non_null(strstr(e->line[1], "input/output error"));
}

/* A staging buffer smaller than the largest tensor (512 KiB) on one
 * worker of two: both refuse the generation before anything moves. */
static void test_compat_staging_too_small(void **state)
{
    ftg_env *e = *state;
    const rollout_opts o = { .addr = e->c.addr, .group = "small", .world = "2",
                             .staging = "262144", .staging0 = "786432", .timeout_ms = "5000" };
    char want[32];
    snprintf(want, sizeof want, "ERR %d 0 0 worker 1: ", FERRY_EMSGSIZE);
    pair_refuses(e, &o, -1, NULL, "small staging", want);
}

/* Segment locality: the store's only segment named by the workers of node
 * 7 as their node's (local_segment), node 9 naming none. Every tensor is
 * led on node 7 (its reads stay inside the node; the leaders balanced over
 * the two workers there), node 9 reads nothing and takes every byte in
 * once; every worker still gets every tensor, bit-exact. */
static void test_compat_segment_local(void **state)
{
    ftg_env *e = *state;
    uint64_t published = 0;
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    ferry_weight_manifest m;
    memset(&m, 0, sizeof m);
    assert_int_equal(ferry_weights_manifest(e->s, MODEL, 1, &m, NULL), 0);
    uint64_t seg = m.entries[0].segment;
    assert_true(seg != 0);
    ferry_weight_manifest_free(&m);
    const rollout_opts o = { .addr = e->c.addr, .group = "seg", .world = "4",
                             .staging = "786432", .timeout_ms = "20000", .seg7 = seg };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &o, -1, NULL), 0);
    /* 768 KiB of staging: the largest tensor fits, not in half: one batch at a time */
    update_ok(e, 1, published, WORLD - 1, 1);
    fprintf(stderr, "segment on node 7: store reads %llu %llu | %llu %llu, cross-node WRITEs "
            "%llu %llu | %llu %llu\n", (unsigned long long)last_read[0],
            (unsigned long long)last_read[1], (unsigned long long)last_read[2],
            (unsigned long long)last_read[3], (unsigned long long)last_cross[0],
            (unsigned long long)last_cross[1], (unsigned long long)last_cross[2],
            (unsigned long long)last_cross[3]);
    assert_int_equal(last_read[0] + last_read[1], published);   /* node 7 leads every tensor */
    assert_true(last_read[0] > 0 && last_read[1] > 0);         /* balanced inside node 7 */
    assert_int_equal(last_read[2] + last_read[3], 0);
    assert_int_equal(last_cross[0] + last_cross[1], published); /* node 9 takes it in once */
    assert_int_equal(last_cross[2] + last_cross[3], 0);
}

/* A worker whose engine refuses views (FERRY_FAULT=map_fail=1: as if its
 * node-mates' staging could not be mapped) READs what its node-mates leave
 * in their staging for it: the update is whole and bit-exact, it viewed
 * nothing, the others still view. */
static void test_compat_no_view(void **state)
{
    ftg_env *e = *state;
    const rollout_opts group = { .addr = e->c.addr, .group = "noview", .world = "4",
                                 .staging = "1048576", .timeout_ms = "20000" };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &group, 1, "map_fail=1"), 0);
    uint64_t published = 0;
    assert_int_equal(ftg_publish(e->s, &model, 1, &published), 0);
    no_view_rank = 1;
    update_ok(e, 1, published, WORLD - 1, 2);
    no_view_rank = -1;
    /* worker 1 (node 7) took in by READ what worker 0 led, by WRITE what
     * came from node 9 */
    assert_int_equal(last_viewed[1], 0);
    assert_int_equal(last_received[1], published - last_read[1]);
    assert_true(last_viewed[0] > 0 && last_viewed[2] > 0 && last_viewed[3] > 0);
}

/* A worker killed in the middle of an update (SIGKILL from inside its
 * loader, at its third tensor, after it led and sent part of the first
 * batches): the three others do not wait for it for ever, nor for a fixed
 * time per tensor: once nothing of the attempt has come for the group
 * timeout (2 s of silence) they fail with FERRY_EREBUILD, still at their
 * generation, each saying what it waited for. */
static void test_compat_killed_peer(void **state)
{
    ftg_env *e = *state;
    const rollout_opts o = { .addr = e->c.addr, .group = "killed", .world = "4",
                             .staging = "1048576", .timeout_ms = "2000", .die_rank = 1,
                             .die_at = 2 };
    assert_int_equal(ftg_start(e, WORLD, rollout_args, &o, -1, NULL), 0);
    assert_int_equal(ftg_publish(e->s, &model, 1, NULL), 0);
    assert_int_equal(ftg_send(e, "update 1"), 0);
    /* a generous deadline on the replies; the dead worker gives none */
    assert_int_equal(ftg_collect(e, 60000, 1), 0);
    for (int k = 0; k < WORLD; k++) {
        if (k == 1)
            continue;
        const char *line = e->line[k];
        fprintf(stderr, "killed peer, worker %d: %s\n", k, line);
        int code;
        unsigned long long gen;
        size_t seen;
        if (sscanf(line, "ERR %d %llu %zu", &code, &gen, &seen) != 3)
            fail_msg("worker %d: %s", k, line);
        assert_int_equal(code, FERRY_EREBUILD);
        assert_int_equal(gen, 0);
        assert_true(seen < NT);
        /* what it saw: a sender that went quiet or the group at a batch
         * (after the 2000 ms liveness deadline), or, for a worker sending
         * to the dead one, the lost connection (under load the sender can
         * notice first: "sending tensor ... to worker 1 failed: connection
         * to peer lost", or, when its submit tries to reconnect, "...
         * failed: connection refused: peer not listening"), or, for a
         * worker of its node that had no view of its staging yet, the READ
         * it tried instead ("reading tensor ... from the staging of worker
         * 1 failed: connection refused: peer not listening", seen once
         * under the sanitizer), or, for a worker whose round sends to
         * it, the send that found it gone ("subscriber: notifying worker
         * 1 (node 0 at ADDR): connection refused: peer not listening", seen
         * once under the sanitizer; "notifying worker 1 (node 0 at ADDR)
         * failed: connection to peer lost" beside four hogs), or, at a round that imports its endpoint,
         * "cannot reach worker 1: connection refused" (seen beside four
         * hogs) */
        bool waited = strstr(line, "nothing came from worker") != NULL ||
                      strstr(line, "did not reach batch") != NULL ||
                      strstr(line, "did not finish batch") != NULL;
        bool sent = strstr(line, "to worker 1 failed") != NULL ||
                    strstr(line, "notifying worker 1 (node ") != NULL ||
                    strstr(line, "pushing to worker 1 (node ") != NULL ||
                    strstr(line, "cannot reach worker 1: ") != NULL ||
                    strstr(line, "from the staging of worker 1 failed") != NULL;
        if (!waited && !sent)
            fail_msg("worker %d names no cause: %s", k, line);
        if (waited)
            assert_non_null(strstr(line, "2000 ms"));
    }
    /* the dead one's reply: none, its stdout closed */
    assert_int_not_equal(ft_peer_reply(&e->w[1], e->line[1], sizeof e->line[1], 10000), 0);
}

int main(int argc, char **argv)
{
    if (argc >= 8 && argc <= 10 && !strcmp(argv[1], "--rollout"))
        return rollout_main(argv[2], argv[3], (uint32_t)atoi(argv[4]), (uint32_t)atoi(argv[5]),
                            strtoull(argv[6], NULL, 10), strtoull(argv[7], NULL, 10),
                            argc >= 9 ? strtoull(argv[8], NULL, 10) : 0,
                            argc == 10 ? (size_t)strtoull(argv[9], NULL, 10) : 0);
    ft_token();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_compat_group, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_compat_silent_leader, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_compat_failed_group_read, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_compat_staging_too_small, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_compat_segment_local, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_compat_killed_peer, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_compat_no_view, ftg_setup, ftg_teardown),
        cmocka_unit_test_setup_teardown(test_compat_warm, ftg_setup, ftg_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
