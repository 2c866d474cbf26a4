/* ferry command-line tool: shared helpers. Uses the public API only. */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "ferry/ferry.h"

/* Parse "4M", "64k", "1G", "123" (binary units). 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);
/* Parse a whole decimal number: digits only (no sign, no spaces, no
 * trailing characters), no overflow. 0 on success, -1 otherwise; silent. */
int cli_parse_uint(const char *s, uint64_t *out);

/* The value v of the user-facing option opt (e.g. "--rollouts"), within
 * [min, max]. On success 0 and *out set; on bad input one line to stderr
 * that names opt, the range and v, e.g.
 *   ferry: --rollouts wants a whole number from 1 to 64, not '3x'
 * and -1, *out untouched. The caller exits with status 2. */
int cli_opt_uint(const char *opt, const char *v, uint64_t min, uint64_t max, uint64_t *out);
int cli_opt_unsigned(const char *opt, const char *v, unsigned min, unsigned max, unsigned *out);
/* A finite decimal number (strtod syntax, no leading space, nothing after). */
int cli_opt_double(const char *opt, const char *v, double min, double max, double *out);
/* A size as cli_parse_size reads it; max UINT64_MAX: no upper bound. */
int cli_opt_size(const char *opt, const char *v, uint64_t min, uint64_t max, uint64_t *out);
/* Format bytes as "4 MiB" etc. into buf. */
const char *cli_fmt_size(uint64_t n, char *buf, size_t len);
double cli_now(void);   /* monotonic seconds */

void cli_hex(const uint8_t *b, size_t n, char *out);
size_t cli_unhex(const char *s, uint8_t *out, size_t cap);

/* A child `ferry _target` process: an engine with one registered memfd
 * region, plus a plain TCP sink for baselines. Driven over pipes. */
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

/* Progress line on stderr (only when stderr is a terminal). */
void cli_progress(const char *what, double frac);
void cli_progress_done(void);

int cmd_bench(int argc, char **argv, const char *self);
/* bench.c: one timed engine pass, total bytes from/to buf as block-sized
 * ops against rr with many tickets in flight; GB/s, 0 if any op failed. */
double cli_engine_pass(ferry_engine *e, enum ferry_opcode op, uint8_t *buf,
                       const ferry_remote_region *rr, uint64_t block, uint64_t total);
/* bench_store.c: `ferry bench store` and its metadata client child */
int cmd_bench_store(int argc, char **argv, const char *self);
int cli_bench_store_client_main(int argc, char **argv);
int cmd_demo(int argc, char **argv, const char *self);        /* demo_weights.c */
int cmd_bench_weights(int argc, char **argv, const char *self); /* bench_weights.c */
int cmd_demo_engine(int argc, char **argv, const char *self); /* demo.c */
/* master.c: `ferry master` */
int cmd_master(int argc, char **argv);
/* node.c: `ferry node`; up.c: `ferry up`, `ferry down`, `ferry status` */
int cmd_node(int argc, char **argv);
int cmd_up(int argc, char **argv);
int cmd_down(int argc, char **argv);
int cmd_status(int argc, char **argv);
/* Write text to path through a temporary file and a rename: 0 or -1. */
int cli_write_file_atomic(const char *path, const char *text);
/* plan.c: `ferry plan` and `ferry bench plan` */
int cmd_plan(int argc, char **argv);
int cmd_bench_plan(int argc, char **argv);
/* bench_exec.c: `ferry bench exec`; bench_exec_worker.c: its worker child
 * and the model slice + plan that parent and workers build alike. */
int cmd_bench_exec(int argc, char **argv, const char *self);
int cli_exec_worker_main(int argc, char **argv);
int cli_exec_plan(const char *preset, uint64_t budget, const char *src, const char *dst,
                  ferry_plan **out, uint64_t *model_bytes, ferry_error *err);

/* plan_model.c: `ferry plan --nic BW`: the weight update of the modelled
 * cluster per NIC for ferry direct, compatibility, broadcast and naive. */
int cli_plan_model(const char *model, const char *src, const char *dst, uint32_t gpn, const char *nic,
                   uint32_t nics_per_node, bool json);

/* bench_sparse.c: `ferry bench sparse`, the sparse planner vs a scan of nnz */
int cmd_bench_sparse(int argc, char **argv);

#endif
