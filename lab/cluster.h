/* `ferry-lab cluster`: H emulated hosts (network namespaces on a bridge in
 * a "switch" namespace, each host's link shaped both ways), a master and a
 * node per host, commands run inside the hosts, and everything removed
 * again (docs/lab.md). Internal to lab/cluster*.c. */
#ifndef FERRY_LAB_CLUSTER_H
#define FERRY_LAB_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define LAB_MAX_HOSTS 16          /* two cores carry every host's TCP */
#define LAB_MAX_RATE 10000000000ull   /* 10 gbit/s: above it the CPU decides, not TBF */
#define LAB_MAX_UNDO 128
#define LAB_CPU_BOUND 0.9         /* busiest second's share of the machine above this: CPU-bound */

enum lab_undo_kind { LAB_UNDO_PGRP, LAB_UNDO_NETNS, LAB_UNDO_DIR };

/* One resource to remove at teardown, recorded before it is created (a
 * half-made one is removed too; removing what is not there is harmless). */
typedef struct lab_undo {
    enum lab_undo_kind kind;
    pid_t pid;            /* LAB_UNDO_PGRP: the leader of a process group */
    char name[256];       /* LAB_UNDO_NETNS: the namespace; LAB_UNDO_DIR: the path */
} lab_undo;

typedef struct lab {
    char prefix[24];      /* "fl<pid>": every namespace is "<prefix>-sw" or "<prefix>-h<i>" */
    char dir[256];        /* the run's temp dir (logs, master state, token) */
    char net[16];         /* "10.A.B": the hosts are .1 .. .H, the switch's bridge .254 */
    unsigned hosts;
    uint64_t rate;        /* bits/s, each host's link, each direction */
    uint64_t host_rate[LAB_MAX_HOSTS];   /* a host's own rate (0: rate) */
    uint64_t node_size[LAB_MAX_HOSTS];   /* a host's node segment (0: the size given to lab_cluster_start) */
    uint64_t segment[LAB_MAX_HOSTS];     /* each host's node's store segment, once up */
    lab_undo undo[LAB_MAX_UNDO];
    unsigned nundo;
    double cpu_max;       /* busiest sampled second, share of all CPUs (0..1) */
} lab;

/* cluster.c */
/* "100mbit" -> bits/s; 0 after a line on stderr (who: the command's name). */
uint64_t lab_parse_rate(const char *s, const char *who);
/* L named after this process (prefix, addresses, temp dir made and
 * recorded), the signal handlers installed; hosts and rate set. 0 or -1. */
int lab_open(lab *L, unsigned hosts, uint64_t rate);
/* A host's link rate (host_rate, else rate). */
uint64_t lab_host_rate(const lab *L, unsigned host);
/* A master on host 0 and a node on every host (node_size[i], else
 * node_size), each recorded; master gets its address; L->segment filled.
 * 0, or -1 after a line on stderr. */
int lab_cluster_start(lab *L, uint64_t node_size, char *master, size_t cap);
/* argv run in host (its own process group, recorded for teardown, the
 * lab's environment): stdin/stdout to the pipes when in/out are given
 * (else /dev/null and log or inherited), stderr to log when given. */
pid_t lab_spawn_io(lab *L, unsigned host, const char *log, const char *master,
                   const char *const *argv, int in_fd, int out_fd);

/* cluster_net.c */
/* SIGINT/SIGTERM set the flag (and wake lab_wait_fd's poll); true once one came. */
int lab_signals_install(void);
bool lab_stopping(void);
int lab_stop_fd(void);
/* Run a shell command line to completion (fork + /bin/sh -c, never system():
 * that ignores SIGINT while it waits). Its exit status, -1 if it did not run. */
int lab_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void lab_record(lab *L, enum lab_undo_kind kind, pid_t pid, const char *name);
/* The namespaces, the bridge, the veth pairs, the addresses and the TBF
 * qdiscs, each recorded as it is made. 0, or -1 after a line on stderr. */
int lab_net_up(lab *L);
/* Every recorded resource removed, newest first; processes inside the
 * namespaces are killed before the namespace goes. Idempotent. */
void lab_teardown(lab *L);
/* Remove the leftovers of prefix, or (NULL) of every lab whose owner is gone. */
int lab_clean(const char *prefix);
/* Enter the network namespace ns (in a child). 0 or -1. */
int lab_enter(const char *ns);

/* cluster_probe.c */
/* Each host's link checked both ways with a TCP stream of `seconds`; prints
 * achieved / configured per direction. worst gets the ratio (link rate in
 * Ethernet frames / configured) farthest from 1. 0, or -1 after a line. */
int lab_check_links(lab *L, double seconds, bool json, double *worst);
/* The machine's busy share since the last call (/proc/stat), 0..1; the
 * first call starts the count and gives 0. */
double lab_cpu_sample(unsigned long long st[2]);

#endif
