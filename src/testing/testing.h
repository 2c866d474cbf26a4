/* Internals that the programs run as the library runs them, for the
 * at-scale model of `ferry plan --nic` and the planning benchmark of
 * `ferry-lab bench weights --scale` (docs/weights.md, "Reader assignment
 * and the at-scale model", "Scale benchmark").
 *
 * NOT part of the public API: no ferry_ names, not exported by
 * libferry.so (src/libferry.map keeps fr_* local), no stability promised;
 * a program reaches them by linking libferry.a. They exist so that no
 * program includes a layer's internal header (src/LAYER/NAME_int.h): this
 * header needs the public ones only. */
#ifndef FERRY_TESTING_H
#define FERRY_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/ferry.h"

/* ---- the update model (update_model.c) -------------------------------------------------
 * The weight update of a modelled cluster: the trainers (src) on their
 * nodes, each tensor stored once by the rank ferry_weights_assign picks;
 * the rollout workers (dst) on nodes of their own after the trainers'.
 * Per node, the bytes in and out under each way of doing the update, the
 * reader assignment being the subscriber's own (src/rl/readers.c). */
enum {
    FR_UM_DIRECT,   /* ferry's group update: single-pull, pushes to replicas */
    FR_UM_COMPAT,   /* compatibility mode: every worker, every whole tensor */
    FR_UM_BCAST,    /* rank 0 reads, then sends each worker its demand */
    FR_UM_NAIVE,    /* every worker reads its own demand from the store */
    FR_UM_P2P,      /* each publisher sends each worker its demand, no store: the
                     * bytes of naive, from the same nodes */
    FR_UM_FLOOR,    /* the lower bound */
    FR_UM_COUNT
};
typedef struct fr_um_totals {
    uint64_t *in, *out;              /* per node (nnodes) */
    uint64_t store_read, cross_push;
} fr_um_totals;
typedef struct fr_update_model {
    uint32_t nnodes, ntrainer_nodes, nworkers;
    fr_um_totals t[FR_UM_COUNT];
    uint64_t model_bytes, demand_bytes;
    double assign_s;                 /* seconds in the reader assignment */
} fr_update_model;
/* 0 and *out (fr_update_model_free frees it), or FERRY_ENOMEM (out of
 * memory, or a tensor cut into too many cells). */
int fr_update_model_build(const ferry_manifest *src, const ferry_manifest *dst, fr_update_model **out);
void fr_update_model_free(fr_update_model *m);   /* NULL: nothing */
/* Compatibility mode as the group update runs it (src/rl/compat.c): every
 * tensor (sizes[0..n) bytes of rows[0..n) rows, in manifest order) wanted
 * whole by each of nworkers workers; in a group over several nodes a large
 * tensor is cut into blocks of whole rows (fr_rl_compat_block_rows), each
 * read by one reader (a set is never cut further: pull_plan.c's
 * fr_work.whole), one push per other node then forwarded there, the loads
 * balanced over all blocks; the objects on no worker's node (a
 * trainer's). Per node (nnodes): bytes in and out of its NIC. 0 or
 * FERRY_ENOMEM. */
int fr_um_compat(const uint64_t *sizes, const uint64_t *rows, size_t n,
                 const uint32_t *worker_node, uint32_t nworkers, uint32_t nnodes, uint64_t *in,
                 uint64_t *out);

/* ---- the subscriber's planning (sub_probe.c) ------------------------------------------- */
/* A generation as a subscriber holds it (opaque). */
typedef struct fr_gen fr_gen;
/* The trainers' placement of model in layout src, stored as a publish
 * stores it and read back as a subscriber reads it (through its JSON),
 * generation 1. fr_test_gen_free frees it. */
int fr_test_gen_build(const ferry_model *model, const char *src, fr_gen **out, ferry_error *err);
void fr_test_gen_free(fr_gen *g);
const ferry_manifest *fr_test_gen_manifest(const fr_gen *g);
/* A worker's demand record for g, as Subscriber's update encodes it;
 * *rec is malloc'd (the caller frees it). */
int fr_test_sub_encode(const ferry_subscriber_config *cfg, const fr_gen *g, const ferry_param_shard *sh,
                       size_t n, ferry_region *const *regs, ferry_engine *e, uint8_t **rec, size_t *len,
                       ferry_error *err);
/* Worker me's plan over every worker's record (recs[world]) for g, with
 * its generation replaced by generation: the subscriber's
 * fr_sub_plan_records, its cache in *s (created on the first call; a call
 * with the same layouts reuses the plan). The cache takes the records'
 * buffers over: fr_test_sub_free frees them. */
typedef struct fr_test_sub fr_test_sub;
int fr_test_sub_plan(fr_test_sub **s, const fr_gen *g, uint64_t generation, ferry_kv_value *recs,
                     uint32_t world, uint32_t me, ferry_error *err);
/* The last plan's figures for worker me. */
typedef struct fr_test_sub_figures {
    bool reused;                     /* the plan came from the cache */
    uint64_t demand;                 /* bytes of me's shards */
    uint64_t my_read, received;      /* what me reads from the store, and is pushed */
    uint64_t group_read;             /* what the group reads */
    uint64_t sets, shared_sets;      /* replica sets, those of more than one worker */
    uint64_t reads, pieces, pushes;  /* me's store reads, their pieces, the pushes it sends */
} fr_test_sub_figures;
void fr_test_sub_figures_get(const fr_test_sub *s, uint32_t me, fr_test_sub_figures *out);
void fr_test_sub_free(fr_test_sub *s);   /* NULL: nothing */

#endif
