/* The weight-update demo's shared pieces (demo_weights.c, demo_roles.c). */
#ifndef FERRY_LAB_DEMO_H
#define FERRY_LAB_DEMO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <jansson.h>

#include "ferry/ferry.h"
#include "cli_opts.h"

typedef struct demo_tensor {
    char name[160];
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t bytes;              /* bf16 */
} demo_tensor;

/* The real tensor shapes of a preset, in order, as many as fit in budget. */
typedef struct demo_model { demo_tensor *t; size_t n; uint64_t bytes; } demo_model;
int demo_model_build(const char *preset, uint64_t budget, demo_model *dm);
void demo_model_free(demo_model *dm);

/* Child processes: `ferry-lab worker trainer|rollout MASTER RANK WORLD MODEL BUDGET DP`.
 * Trainers answer "publish G"; rollouts "direct G" (single-pull), "naive G"
 * (each reads its own demand), "compat G"; replies "OK seconds a b c". */
/* The FP8 model beside it: "publish8 G" (the trainers' shards of G through
 * the default quantization rules) and "fp8 G" (a group holding FP8 weights
 * and their scales) act on MODEL DEMO_FP8_MODEL. */
#define DEMO_FP8_MODEL "-fp8"
int demo_trainer_main(int argc, char **argv);
int demo_rollout_main(int argc, char **argv);

/* The trainers' placement: every tensor cut along dim 0 into `world`
 * pieces, piece r on rank r (FSDP); *mine (malloc'd) gets rank's pieces,
 * with their first row and row count. 0 or -1. */
typedef struct shard_of { size_t tensor; uint64_t fragment, r0, rows; } shard_of;
int demo_fsdp_placement(const demo_model *m, uint32_t world, uint32_t rank, ferry_manifest **out,
                        shard_of **mine, size_t *nmine);
/* Rows [*r0, *r0 + *rows) of dim 0 that TP rank `rank` of `world` holds. */
void demo_tp_rows(const demo_tensor *t, uint32_t rank, uint32_t world, uint64_t *r0, uint64_t *rows);
uint64_t demo_row_elems(const demo_tensor *t);   /* elements per row of dim 0 */
/* What rollout `rank` of `world` (TP world/dp x DP dp) holds of t: its TP
 * rows; with ep, an expert tensor ("...experts.N...") whole on worker
 * N mod (world/dp) of each replica and nothing elsewhere (EP over a
 * replica's workers). */
void demo_rollout_rows(const demo_tensor *t, uint32_t rank, uint32_t world, uint32_t dp, bool ep,
                       uint64_t *r0, uint64_t *rows);

/* demo_xfer.c: the plain-socket baselines of `bench cluster` (p2p, bcast). */
typedef struct demo_xfer_item {
    uint32_t tensor;
    uint64_t row0, rows, bytes;
    const uint8_t *src;
} demo_xfer_item;
/* A listening TCP socket on addr (port 0: any); its fd, or -1. */
int demo_xfer_listen(const char *addr, unsigned *port);
/* Connect to every peer ("ADDR:PORT") and send each its items, all
 * streams at once; bytes: what was written. 0 or -1. */
int demo_xfer_send(const char *const *peers, const demo_xfer_item *const *items,
                   const size_t *nitems, size_t npeers, uint64_t *bytes);
/* Where an item's bytes go: its destination (and *len its bytes), NULL to refuse. */
typedef uint8_t *(*demo_xfer_place)(void *ctx, uint32_t tensor, uint64_t row0, uint64_t rows,
                                    uint64_t *len);
/* Accept nsenders streams on listen_fd and take every item into place's
 * buffers until each sender closes. 0 or -1. */
int demo_xfer_recv(int listen_fd, unsigned nsenders, demo_xfer_place place, void *ctx,
                   uint64_t *bytes);

/* A trainer's or rollout's side of the baselines: its listener, and for a
 * trainer the rollouts' listeners and layout ("peers" command). */
typedef struct demo_shard { size_t tensor; uint64_t r0, rows; const uint8_t *data; } demo_shard;
typedef struct demo_xfer {
    int listen_fd;
    unsigned port;
    char gather[64];               /* trainer rank 0's listener */
    char (*peers)[64];             /* the rollouts' listeners */
    uint32_t rworld, rdp;          /* the rollouts' world and DP */
    uint8_t *full;                 /* rank 0's gathered model (bcast) */
    uint64_t *toff;                /* per tensor: its offset in full */
} demo_xfer;
/* The trainer's commands of the baselines: "listen" (OK 0 PORT), "peers
 * RWORLD RDP GATHER ADDR...", "p2p G", "bcast G" (OK seconds bytes-sent).
 * 1 when line was one of them (the reply printed), 0 when it was not. */
int demo_xfer_trainer(demo_xfer *x, const char *line, const demo_model *m, uint32_t rank,
                      uint32_t world, const demo_shard *mine, size_t n);
/* The rollout's: "listen" (2, replied here); "p2p G TWORLD" and "bcast G" receive
 * into the shards (sh[k] holds tensor first[k]) from TWORLD senders (p2p)
 * or one (bcast): 1 and *secs, *bytes (the caller checks and replies), -1
 * on failure (replied here), 0 when line was none of them. */
int demo_xfer_rollout(demo_xfer *x, const char *line, const demo_model *m, ferry_param_shard *sh,
                      const uint64_t *first, size_t ns, double *secs, uint64_t *bytes, uint64_t *g);
void demo_xfer_close(demo_xfer *x);

/* Options shared by `ferry-lab demo` and `ferry-lab bench weights`: --trainers,
 * --rollouts, --dp (0: 2 when it divides the rollouts), --bytes, --model,
 * --json, and a count flag (--generations / --reps; the bench's
 * --convert-only too). */
typedef struct demo_opts {
    unsigned trainers, rollouts, dp, count;
    uint64_t bytes;
    char model[64];
    bool json, convert_only;
    bool cold;                 /* --cold: the processes skip the warm-up (FERRY_DEMO_COLD) */
    bool fp8;                  /* demo --fp8: an FP8 rollout group beside the bf16 ones */
} demo_opts;
/* The rows of both commands' option tables (cli_opts.h), the count's name
 * ("generations", "reps"), its range's top and the help of it and of --bytes
 * given. */
#define DEMO_OPT_ROWS(count_name, count_max, count_help, bytes_help)                                 \
    CLI_UINT(demo_opts, trainers, "trainers", "N", 1, 64, "trainer processes, 1-64 (default 4)"),    \
    CLI_UINT(demo_opts, rollouts, "rollouts", "N", 1, 64, "rollout processes, 1-64 (default 4)"),    \
    CLI_UINT(demo_opts, dp, "dp", "N", 0, 64,                                                        \
             "rollout data-parallel replicas; TP is rollouts / dp\n"                                 \
             "(default 2 when it divides --rollouts, else 1)"),                                      \
    CLI_UINT(demo_opts, count, count_name, "N", 1, count_max, count_help),                           \
    CLI_SIZE(demo_opts, bytes, "bytes", "SIZE", 1u << 20, UINT64_MAX, bytes_help),                   \
    CLI_STR(demo_opts, model, "model", "PRESET",                                                     \
            "tensor shapes of this preset (default qwen3-8b; ferry plan --models)"),                 \
    CLI_FLAG(demo_opts, cold, "cold",                                                                \
             "skip the processes' warm-up (generation 1 then pays the first\n"                       \
             "touches of the store's memory)"),                                                      \
    CLI_FLAG(demo_opts, json, "json", "one JSON object on stdout (default: a table)")
/* c: the command's table (of DEMO_OPT_ROWS); count and bytes: their
 * defaults. 0, CLI_HELP or -1 (cli_opts.h). */
int demo_parse(const cli_cmd *c, int argc, char **argv, unsigned count, uint64_t bytes, demo_opts *o);

/* A child over pipes. */
typedef struct child { pid_t pid; FILE *in, *out; } child;

/* A private master and node (unless FERRY_MASTER is set), trainers and
 * rollouts (TP rollouts/dp x DP dp). */
typedef struct demo_group {
    char dir[64];
    bool own;
    char addr[128];
    pid_t master, node;
    child tr[64], ro[64];
    unsigned ntr, nro;
    double warm_s;             /* the slowest process's warm-up (READY's first number) */
    uint64_t warm_bytes;       /* bytes the processes touched in it, summed */
} demo_group;
int demo_group_start(demo_group *g, const char *model, uint64_t budget, uint64_t model_bytes,
                     unsigned trainers, unsigned rollouts, unsigned dp, const char *who);
void demo_group_stop(demo_group *g);
/* Only the temp dir and the cluster (a master and a node with a segment of
 * seg_bytes, unless FERRY_MASTER is set); demo_group_stop ends them. */
int demo_cluster_start(demo_group *g, uint64_t seg_bytes, const char *who);
/* One child `/proc/self/exe args` over pipes; its next line (0 for "OK..."
 * or "READY..."); close its stdin and reap it. */
int demo_child_start(child *c, const char *const *args);
int demo_child_line(child *c, char *buf, size_t cap);
void demo_child_stop(child *c);

/* The counters the weight demo's children leave beside their replies
 * (demo_roles.c): open makes a temp dir and sets FERRY_DEMO_STATS for the
 * children started after it; collect merges role-0..n-1 into one JSON
 * object; close removes the dir. */
int demo_counters_open(char *dir, size_t cap);
void demo_counters_close(const char *dir);
json_t *demo_counters_collect(const char *dir, const char *role, unsigned n);

/* `ferry-lab demo rl` and its children. */
int cmd_demo_rl(int argc, char **argv);
int demo_rl_rollout_main(int argc, char **argv);
int demo_rl_update_main(int argc, char **argv);
/* Send cmd to each of cs[0..n) (all at once), wait for every reply. *wall:
 * the longest time a child reported for the command itself (its checking of
 * the bytes afterwards excluded); sums of the replies' other numbers. */
bool demo_round(child *cs, unsigned n, const char *cmd, double *wall, uint64_t *sum2,
                uint64_t *sum3, uint64_t *sum4, char *err, size_t errcap);

int cmd_demo_sparse(int argc, char **argv);   /* `ferry-lab demo --sparse` and its sparse-* workers */

/* demo_signals.c: from demo_signals_start on (call it before any thread
 * starts; demo_cluster_start and demo_counters_open do), SIGINT and SIGTERM
 * kill every child started through demo_fork, remove every directory made
 * by demo_mkdtemp and end the process by that signal. */
int demo_signals_start(void);
/* fork(): the child (0) gets SIGINT and SIGTERM unblocked for its exec;
 * the parent tracks it until demo_reaped. -1 once a signal is being
 * handled. */
pid_t demo_fork(void);
void demo_reaped(pid_t pid);
/* Whether a signal is being handled (the children are being killed). */
bool demo_stopping(void);
/* mkdtemp(tmpl) and remember it (tmpl shorter than 128): 0 or -1. */
int demo_mkdtemp(char *tmpl);
/* Where the demos make their directories: $TMPDIR when it is an absolute
 * path of at most 32 characters (the paths made under it must fit the
 * demo's buffers), else /tmp. */
const char *demo_tmp_dir(void);
/* Remove the ferry-demo-* and ferry-counters-* directories of demo_tmp_dir whose
 * owner process is gone (a demo killed with SIGKILL); how many. The first
 * demo_mkdtemp of a process does it. */
int demo_sweep_stale(void);
/* Remove dir and everything in it, and forget it. */
void demo_rmtree(const char *dir);
#endif
