/* ferry command-line tool: shared helpers. Uses the public API only. */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <getopt.h>
#include <stdio.h>
#include <sys/types.h>

#include "ferry/ferry.h"

/* The program's name for messages: "ferry", or "ferry-lab" (what it was
 * started as, without the directory). */
const char *cli_prog(void);
/* Parse "4M", "64k", "1G", "123" (binary units). 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);
/* Parse a whole decimal number: digits only (no sign, no spaces, no
 * trailing characters), no overflow. 0 on success, -1 otherwise; silent. */
int cli_parse_uint(const char *s, uint64_t *out);

/* The value v of the user-facing option opt (e.g. "--rollouts"), within
 * [min, max]. On success 0 and *out set; on bad input one line to stderr
 * that names opt, the range and v, e.g.
 *   ferry-lab: --rollouts wants a whole number from 1 to 64, not '3x'
 * and -1, *out untouched. The caller exits with status 2. */
int cli_opt_uint(const char *opt, const char *v, uint64_t min, uint64_t max, uint64_t *out);
int cli_opt_unsigned(const char *opt, const char *v, unsigned min, unsigned max, unsigned *out);
/* A finite decimal number (strtod syntax, no leading space, nothing after). */
int cli_opt_double(const char *opt, const char *v, double min, double max, double *out);
/* A size as cli_parse_size reads it; max UINT64_MAX: no upper bound. */
int cli_opt_size(const char *opt, const char *v, uint64_t min, uint64_t max, uint64_t *out);
/* Option loops. A command's loop returns 0 (run), CLI_HELP (it met -h or
 * --help: nothing is started, the usage goes to stdout, exit 0) or -1 (a
 * line on stderr said what is wrong: the usage follows there, exit 2);
 * cli_usage_exit turns that into the exit status. */
#define CLI_HELP 1
bool cli_is_help(const char *a);
/* pr from an option loop: CLI_HELP prints usage to stdout and gives 0, a
 * negative pr prints it to stderr and gives 2. */
int cli_usage_exit(int pr, void (*usage)(FILE *f));
/* The option loop of every command, on getopt_long:
 *
 *   cli_getopt g;
 *   cli_getopt_init(&g, "demo rl", argc, argv, "rollouts=,steps=,json");
 *   while (cli_getopt_next(&g)) {
 *       if (cli_getopt_is(&g, "--json")) o->json = true;
 *       else if (cli_getopt_is(&g, "--steps")) { if (cli_opt_uint(g.opt, g.val, ...) < 0) return -1; }
 *       else return cli_getopt_unhandled(&g);
 *   }
 *   return cli_getopt_end(&g, 0);
 *
 * spec lists the long options, a trailing '=' for one that takes a value;
 * --help/-h is added (and wins wherever it is). `--opt value` and
 * `--opt=value` both work; a prefix of a name does not (a new option never
 * changes an old command line). argv[0] is the command word; the others
 * may come in any order. An unknown option, a missing value and a flag given
 * a value each get one line on stderr that names the option, and the loop
 * ends: cli_getopt_end gives -1. */
#define CLI_GETOPT_MAX 48
typedef struct cli_getopt {
    const char *cmd;              /* "demo rl", for messages */
    int argc;
    char **argv;
    struct option lo[CLI_GETOPT_MAX + 2];
    char names[1024];
    bool help, failed, done;
    char opt[72];                 /* the option just returned: "--steps" */
    const char *val;              /* its value (NULL for a flag) */
    int npos;                     /* once done: the arguments that are not options */
    char **pos;
} cli_getopt;
void cli_getopt_init(cli_getopt *g, const char *cmd, int argc, char **argv, const char *spec);
/* true: an option is in g->opt (and g->val); false: none left, help, or a
 * refusal already reported. */
bool cli_getopt_next(cli_getopt *g);
bool cli_getopt_is(const cli_getopt *g, const char *opt);
/* The loop's verdict: CLI_HELP, -1 (reported), or 0; more than max_pos
 * arguments that are not options are refused, the first extra one named. */
int cli_getopt_end(cli_getopt *g, int max_pos);
/* An option of the spec that the loop has no branch for (a programming
 * error, said as one): -1. */
int cli_getopt_unhandled(cli_getopt *g);
/* Format bytes as "4 MiB" etc. into buf. */
const char *cli_fmt_size(uint64_t n, char *buf, size_t len);

/* A model preset laid out two ways (`ferry plan --model`, `ferry-lab bench
 * plan`): *src and *dst built with gpn ranks per node (0: the layouts'
 * own), *model_bytes set. 0, or 1 with the reason on stderr after "who: "
 * (nothing kept). */
int cli_layout_pair(const char *who, const char *model, const char *src_layout, const char *dst_layout,
                    uint32_t gpn, ferry_manifest **src, ferry_manifest **dst, uint64_t *model_bytes);
double cli_now(void);   /* monotonic seconds */

void cli_hex(const uint8_t *b, size_t n, char *out);
size_t cli_unhex(const char *s, uint8_t *out, size_t cap);

/* plan.c: `ferry plan`; master.c: `ferry master` */
int cmd_plan(int argc, char **argv);
int cmd_master(int argc, char **argv);
/* node.c: `ferry node`; up.c: `ferry up`, `ferry down`, `ferry status` */
int cmd_node(int argc, char **argv);
int cmd_up(int argc, char **argv);
int cmd_down(int argc, char **argv);
int cmd_status(int argc, char **argv);
/* up_proc.c: a process as /proc shows it: start time (clock ticks after
 * boot, /proc/PID/stat field 22) and command line (NUL-separated). */
typedef struct cli_proc {
    int pid;
    unsigned long long start;
    char cmd[8192];
    size_t cmdlen;
} cli_proc;
/* 0, or -1 when there is no such process. */
int cli_proc_read(int pid, cli_proc *p);
/* The same pid, start time and command line: the same process. */
bool cli_proc_same(const cli_proc *a, const cli_proc *b);
/* Its command line for a message ("sleep 100"). */
const char *cli_proc_show(const cli_proc *p, char *buf, size_t cap);
/* A pidfd on pid (-1 where the kernel has none, or there is no such
 * process: errno ESRCH). Opened before the identity is read, it refers to
 * the process that was read, so a signal through it reaches nobody else. */
int cli_proc_open(int pid);
/* SIGTERM, then SIGKILL after 10 s, through pidfd (or kill(pid) when it is
 * -1); 0 once it is gone, -1 if it could not be stopped. */
int cli_proc_stop(int pidfd, int pid);
/* The kernel's count of OOM kills so far (/proc/vmstat oom_kill). */
uint64_t cli_oom_kills(void);
/* "exited with status 1", "was killed by SIGKILL (out of memory?)": a wait
 * status in words, `when` (" at start", or "") after the verb; oom_before
 * from cli_oom_kills before the process started. */
void cli_exit_reason(int status, uint64_t oom_before, const char *when, char *buf, size_t cap);
/* The last lines (at most 16) of a log file, indented, or that it is empty. */
void cli_print_log_tail(FILE *out, const char *path, int lines);

/* up_pids.c: DIR/up.pids, the master (r[0]) and the node (r[1]) of a
 * detached cluster. legacy: a record of a file written before start times
 * were kept ("MASTER_PID NODE_PID"): only its command line can vouch for it
 * (`ferry ROLE` naming DIR's file). */
typedef struct cli_pidrec { const char *role; cli_proc p; bool legacy; } cli_pidrec;
int cli_pids_write(const char *path, const cli_proc *master, const cli_proc *node);
/* 0, or -1 when there is no readable file with both records. */
int cli_pids_read(const char *path, cli_pidrec r[2]);
enum { CLI_P_OURS, CLI_P_GONE, CLI_P_OTHER };
/* What runs under a record's pid now: CLI_P_OURS (the recorded process),
 * CLI_P_GONE (nothing, or it exited), CLI_P_OTHER (the pid went to another
 * process: *now says which). dir: the state directory (legacy records). */
int cli_pids_check(const cli_pidrec *r, const char *dir, cli_proc *now);

/* up_etcd.c: a local one-member etcd (Debian's etcd-server; ETCD_BIN
 * overrides the binary) on loopback ports of its own, for `ferry up --ha`
 * and `ferry-lab bench store --ha`. */
typedef struct cli_etcd {
    char bin[256], data[4200], url[64], peer[64], initial[96];
    int port;                    /* the client port */
    const char *args[20];        /* argv to exec: args[0] is bin */
} cli_etcd;
/* A loopback port nobody listens on now (the kernel's pick); -1. */
int cli_free_port(void);
/* Its ports and argv, data in DIR/etcd: 0, or -1 without free ports. */
int cli_etcd_prepare(cli_etcd *e, const char *dir);
/* Wait until the etcd run as pid answers /health as healthy: 0; 1 when
 * pid exited first (reaped); -1 after secs. */
int cli_etcd_wait(const cli_etcd *e, pid_t pid, double secs);

/* up_mem.c: what a node started now could take. */
typedef struct cli_mem {
    uint64_t avail;              /* MemAvailable (UINT64_MAX: unknown) */
    bool cg;                     /* a cgroup memory limit applies: */
    uint64_t cg_limit, cg_used;  /*   the tightest one and its use */
    char cg_file[640];           /*   the file it was read from */
} cli_mem;
/* proc: "/proc", cgroot: "/sys/fs/cgroup". -1 when nothing could be read. */
int cli_mem_probe(const char *proc, const char *cgroot, cli_mem *m);
/* The smaller of MemAvailable and what the cgroup limit leaves. */
uint64_t cli_mem_headroom(const cli_mem *m);

/* Write text to path through a temporary file and a rename: 0 or -1. */
int cli_write_file_atomic(const char *path, const char *text);
/* plan_model.c: `ferry plan --nic BW`: the weight update of the modelled
 * cluster per NIC for ferry direct, compatibility, broadcast and naive;
 * with fp8 of FP8 rollouts (both layouts quantized by the default rules). */
int cli_plan_model(const char *model, const char *src, const char *dst, uint32_t gpn, const char *nic,
                   uint32_t nics_per_node, bool fp8, bool json);
/* FP8 rollouts: *src quantized as a publish stores it (its shards may cut
 * blocks), *dst as the rollouts hold it, both by the default rules; the
 * old manifests closed. -1 with err (both left as they were) on refusal. */
int cli_quantize_pair(ferry_manifest **src, ferry_manifest **dst, ferry_error *err);

#endif
