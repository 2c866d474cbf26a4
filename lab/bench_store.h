/* `ferry-lab bench store` (bench_store.c) and its --ha part
 * (bench_store_ha.c): what the two files share. */
#ifndef FERRY_LAB_BENCH_STORE_H
#define FERRY_LAB_BENCH_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum { CLIENTS_MAX = 64 };

typedef struct bs_opts {
    uint64_t size, total, object;
    unsigned clients, seconds, reps, batch, puts, ha_ttl;
    bool json, no_sync, sync;      /* sync: !no_sync */
    bool ha;
} bs_opts;

typedef struct bs_meta {
    uint64_t pairs, gets, removed, failed;
    double secs;
    uint64_t appends, commits;  /* the master's log during the phase */
} bs_meta;

typedef struct bs_xfer {
    char transport[8];          /* what the engine picked for the peer */
    double put, get, ewrite, eread;
    uint64_t failed;
    bool mismatch;
} bs_xfer;

/* A private cluster in a temp dir: a master and a node; with ha, a
 * one-member etcd and two replicated masters (the first leads), and
 * `master` names both ("A,B", what clients are given). */
typedef struct bs_cluster {
    char dir[256], master[128];
    pid_t mpid, npid;
    pid_t epid, m2pid;          /* ha: etcd and the second master (-1: none) */
} bs_cluster;

int bs_cluster_start(bs_cluster *c, const bs_opts *o, const char *self, bool ha);
void bs_cluster_stop(bs_cluster *c);
/* SIGKILL (a machine gone) to a child of the cluster, reaped; *p = -1. */
void bs_kill(pid_t *p);
/* The metadata phase: --clients processes against master for --seconds. */
int bs_meta_phase(const bs_opts *o, const char *self, const char *master, bs_meta *sum);
/* Metadata operations per second of a phase (PUT_START + PUT_END + GET). */
double bs_meta_ops(const bs_meta *m);

/* bench_store_ha.c: `bench store --ha`; exit status. */
int bs_ha_run(const bs_opts *o, const char *self);

#endif
