/* ferry-lab: the demos, the benchmarks and the worker processes they
 * start. Not installed; built on the public API and the shared command-line
 * helpers (src/cli/cli.h). The operator's commands are the installed
 * `ferry` (src/cli). */
#ifndef FERRY_LAB_H
#define FERRY_LAB_H

#include "cli.h"

/* The operator's `ferry` that the demos and benchmarks start their
 * clusters with (`ferry master`, `ferry node`, `ferry up`): $FERRY_BIN
 * when set, else `ferry` beside this program, else `ferry` on PATH. */
const char *lab_ferry_bin(void);
/* Exec `ferry-lab worker NAME ARGS...` (this program): args[0] is ignored,
 * args[1] is "worker". Returns only on failure. */
void lab_exec_self(const char *const *args);

/* A child `ferry-lab worker target` process: an engine with one registered
 * memfd region, plus a plain TCP sink for baselines. Driven over pipes. */
typedef struct cli_target {
    pid_t pid;
    FILE *in, *out;
    uint8_t desc[FERRY_DESC_MAX];
    size_t desc_len;
    unsigned sink_port;
} cli_target;

int cli_target_start(cli_target *t, const char *self, uint64_t size, const char *listen);
/* Send a command, read one reply line into reply. 0 if it starts with OK. */
int cli_target_cmd(cli_target *t, char *reply, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void cli_target_stop(cli_target *t);
/* The child side. */
int cli_target_main(int argc, char **argv);

/* Progress on stderr: on a terminal one line rewritten in place (`\r`);
 * otherwise "ferry: progress: WHAT 42% (12 s)" lines, at most one every
 * FERRY_PROGRESS_SECONDS (default 5; 0: every update), never a `\r`.
 * cli_progress_text is the same with free text ("step 3/6: ..."). */
void cli_progress(const char *what, double frac);
void cli_progress_text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_done(void);

/* bench.c: `ferry-lab bench`, and its engine benchmark */
int cmd_bench(int argc, char **argv, const char *self);
/* bench.c: one timed engine pass, total bytes from/to buf as block-sized
 * ops against rr with many tickets in flight; GB/s, 0 if any op failed. */
double cli_engine_pass(ferry_engine *e, enum ferry_opcode op, uint8_t *buf,
                       const ferry_remote_region *rr, uint64_t block, uint64_t total);
/* The same; same_block: every op moves the first block of buf to/from the
 * region's first block (the pattern of ucx_perftest, which puts one
 * buffer to one remote address again and again: the bytes stay in cache). */
double cli_engine_pass_at(ferry_engine *e, enum ferry_opcode op, uint8_t *buf,
                          const ferry_remote_region *rr, uint64_t block, uint64_t total, bool same_block);
/* bench.c: --block sizes defaulted (64K 1M 4M when none given) and each
 * checked against total; 0, or -1 with the error on stderr. */
int cli_engine_blocks(uint64_t *blocks, int *nblocks, uint64_t total);
/* One --block (flag) value appended: at most 8; 0, or -1 after a line on stderr. */
int cli_engine_block_add(uint64_t *blocks, int *nblocks, const char *flag, const char *v);
/* bench_store.c: `ferry-lab bench store` and its metadata client worker */
int cmd_bench_store(int argc, char **argv, const char *self);
int cli_bench_store_client_main(int argc, char **argv);
int cmd_demo(int argc, char **argv, const char *self);        /* demo_weights.c */
int cmd_bench_weights(int argc, char **argv, const char *self); /* bench_weights.c */
int cmd_demo_engine(int argc, char **argv, const char *self); /* demo.c */
/* bench_plan.c: `ferry-lab bench plan` */
int cmd_bench_plan(int argc, char **argv);
/* bench_exec.c: `ferry-lab bench exec`; bench_exec_worker.c: its worker
 * and the model slice + plan that parent and workers build alike. */
int cmd_bench_exec(int argc, char **argv, const char *self);
int cli_exec_worker_main(int argc, char **argv);
int cli_exec_plan(const char *preset, uint64_t budget, const char *src, const char *dst,
                  ferry_plan **out, uint64_t *model_bytes, ferry_error *err);
/* bench_sparse.c: `ferry-lab bench sparse`, the sparse planner vs a scan of nnz */
int cmd_bench_sparse(int argc, char **argv);

/* cluster.c: `ferry-lab cluster up|check|clean`, the lab of emulated hosts */
int cmd_cluster(int argc, char **argv, const char *self);
/* bench_cluster.c: `ferry-lab bench cluster`, the strategies over the lab's links */
int cmd_bench_cluster(int argc, char **argv, const char *self);

#endif
