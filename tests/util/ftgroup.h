/* Test helpers: a group of worker processes (rollout or trainer ranks,
 * this test binary started again with the test's own arguments) against a
 * real master and node. The cmocka fixture ftg_setup/ftg_teardown holds
 * the cluster, the test's store handle and the workers, so a failed
 * assertion never leaves a process behind. A worker answers each command
 * with one line on stdout. */
#ifndef FT_GROUP_H
#define FT_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/store.h"
#include "ferry/weights.h"
#include "util/ftstore.h"

#define FTG_MAX 8        /* workers in a group */
#define FTG_LINE 1024    /* a reply line */

typedef struct ftg_env {
    ft_cluster c;
    ferry_store *s;                 /* the test's store handle */
    int n;                          /* workers started */
    ft_peer w[FTG_MAX];
    int rc[FTG_MAX];                /* last ftg_collect: 0 when the reply said OK */
    char line[FTG_MAX][FTG_LINE];   /* last ftg_collect: the reply ("" when none) */
} ftg_env;

/* cmocka fixture. On entry *state is NULL or the master's extra arguments
 * (NULL-terminated, the test's prestate); starts the master, one node with
 * a 64 MiB segment and a store handle with a 1 ms lease (the test's reads
 * must not hold back retention); *state becomes the ftg_env. The teardown
 * (run after a failed test too) stops the workers, the store, the cluster
 * and frees the env. */
int ftg_setup(void **state);
int ftg_teardown(void **state);

/* The arguments of worker `rank` after the test binary: the function fills
 * argv (NULL-terminated); strings it formats go in buf. */
typedef struct ftg_args {
    const char *argv[16];
    char buf[4][32];
} ftg_args;
typedef void ftg_args_fn(const void *ctx, int rank, ftg_args *a);

/* Start n workers, the ones still running stopped first. Worker fault_rank
 * (-1: none) gets FERRY_FAULT=fault in its environment, no other does.
 * ftg_spawn returns once they run; ftg_start also waits (20 s) for each to
 * say READY and returns -1 (the line on stderr) if one does not. */
int ftg_spawn(ftg_env *e, int n, ftg_args_fn *fn, const void *ctx, int fault_rank,
              const char *fault);
int ftg_start(ftg_env *e, int n, ftg_args_fn *fn, const void *ctx, int fault_rank,
              const char *fault);
/* Send one command line to every worker. 0 or -1. */
int ftg_send(ftg_env *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Read one reply of every worker but `skip` (-1: none), each within
 * timeout_ms, into e->line and e->rc. Returns how many said OK. */
int ftg_collect(ftg_env *e, int timeout_ms, int skip);
/* Stop every worker ("quit", SIGKILL after 10 s) and reap it. Safe twice. */
void ftg_stop(ftg_env *e);

/* A model of 2-D bf16 tensors named "<prefix>.<k>.weight"; element i of
 * tensor t in generation gen holds bits(gen, t, i). */
typedef struct ftg_model {
    const char *name;
    const char *prefix;
    size_t nt;
    const uint64_t (*shapes)[2];
    uint16_t (*bits)(uint64_t gen, size_t t, uint64_t i);
} ftg_model;

/* A bits function for ftg_model: bf16 values in [1, 2) that differ
 * between neighbouring elements, tensors and generations. */
uint16_t ftg_bits(uint64_t gen, size_t t, uint64_t i);
/* The tensor names, names[0 .. m->nt). */
void ftg_names(const ftg_model *m, char (*names)[32]);
/* Publish generation gen of the whole model from one rank (keep 2);
 * *bytes (may be NULL) gets the bytes published. 0 or a FERRY_E* code
 * (the reason on stderr). */
int ftg_publish(ferry_store *s, const ftg_model *m, uint64_t gen, uint64_t *bytes);

/* In a worker: a store handle on the master at addr, lease 1 ms. On
 * failure prints "ERR open <why>" as the worker's reply and returns -1. */
int ftg_worker_store(const char *addr, ferry_store **s);
/* The same with reads leased lease_ms: a worker whose reads must keep a
 * generation from being retired under them while the publisher runs on. */
int ftg_worker_store_lease(const char *addr, uint64_t lease_ms, ferry_store **s);
/* In a worker: say READY, then run update(ctx, GEN) for every "update GEN"
 * line on stdin (it prints the one reply line); returns at EOF or at any
 * other line. */
void ftg_worker_serve(void (*update)(void *ctx, uint64_t gen), void *ctx);

/* A worker of a subscriber group holding row shards of every tensor of a
 * model. */
typedef struct ftg_sub {
    const ftg_model *m;
    ferry_store *s;
    ferry_subscriber *sub;
    char (*names)[32];
    ferry_param_shard *sh;   /* m->nt shards */
    uint64_t gen;            /* the generation it holds */
} ftg_sub;

/* In a worker: the store at addr (ftg_worker_store), row shard tp of tpdeg
 * of every tensor of m (dim 0 cut in parts of ceil(rows / tpdeg)) in
 * zeroed buffers, and a subscriber on them with sc. On failure prints
 * "ERR <why>" as the worker's reply and returns -1. */
int ftg_sub_open(ftg_sub *w, const ftg_model *m, const char *addr,
                 const ferry_subscriber_config *sc, uint32_t tp, uint32_t tpdeg);
/* The same, its store's reads leased lease_ms (ftg_worker_store_lease). */
int ftg_sub_open_lease(ftg_sub *w, const ftg_model *m, const char *addr,
                       const ferry_subscriber_config *sc, uint32_t tp, uint32_t tpdeg,
                       uint64_t lease_ms);
/* The same on a store the worker opened itself (its own call timeout,
 * lease, ...): w owns s from then on, also when it fails (ftg_sub_close). */
int ftg_sub_open_on(ftg_sub *w, const ftg_model *m, ferry_store *s,
                    const ferry_subscriber_config *sc, uint32_t tp, uint32_t tpdeg);
/* Prints the reply to "update want" from what ferry_subscriber_update
 * returned (rc, st, err; w->gen the generation it left) and the shards'
 * elements that do not hold generation want (bad; 0 when it failed). */
typedef void ftg_sub_report_fn(const ftg_sub *w, uint64_t want, int rc,
                               const ferry_update_stats *st, uint64_t bad, const ferry_error *err);
/* ftg_worker_serve: each "update GEN" updates w and checks every shard
 * element, then report prints the reply. */
void ftg_sub_serve(ftg_sub *w, ftg_sub_report_fn *report);
/* The shards' elements that do not hold generation gen. */
uint64_t ftg_sub_bad(const ftg_sub *w, uint64_t gen);
void ftg_sub_close(ftg_sub *w);

#endif
