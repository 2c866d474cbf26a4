/* `ferry-lab bench cluster` (bench_cluster.c, bench_cluster_model.c;
 * docs/lab.md "The cluster benchmark"): the strategies of a weight update
 * over the lab's shaped links, against the model of each. */
#ifndef FERRY_LAB_BENCH_CLUSTER_H
#define FERRY_LAB_BENCH_CLUSTER_H

#include <jansson.h>
#include <pthread.h>

#include "demo.h"
#include "cluster.h"

/* TCP payload per byte TBF meters: a full segment carries MSS (1448) bytes
 * in an Ethernet frame of MTU + 14 (1514) bytes (docs/lab.md, "The link
 * check"). The model's times use the payload rate, rate x this. */
#define BC_PAYLOAD_FRACTION (1448.0 / 1514.0)

/* The benchmark's cluster: trainers (FSDP over T ranks, T/TH per host) on
 * hosts 0..TH-1, rollout workers (TP W/DP x DP, W/RH per host, a TP group's
 * ranks consecutive) on hosts TH..TH+RH-1. */
typedef struct bc_topo {
    const demo_model *m;
    unsigned T, TH, W, DP, RH;
    bool ep;                        /* experts whole on one worker of each replica */
    uint64_t rate[LAB_MAX_HOSTS];   /* bits/s, each host's link */
    uint64_t *rank_bytes;           /* per trainer rank: the bytes of its shards */
    shard_of **rank_rows;           /* per trainer rank: its shards */
    size_t *nrank_rows;
} bc_topo;

/* Payload bytes through each host's link: up (host -> switch), down. */
typedef struct bc_links { double up[LAB_MAX_HOSTS], down[LAB_MAX_HOSTS]; } bc_links;

int bc_topo_init(bc_topo *t, const demo_model *m, unsigned T, unsigned TH, unsigned W, unsigned DP,
                 unsigned RH);
void bc_topo_free(bc_topo *t);
unsigned bc_hosts(const bc_topo *t);
unsigned bc_trainer_host(const bc_topo *t, unsigned rank);
unsigned bc_rollout_host(const bc_topo *t, unsigned worker);

/* The busiest link's time: max over hosts of max(up, down) / payload rate. */
double bc_time(const bc_topo *t, const bc_links *l);
/* The lower bound: every rollout host takes in each byte its workers hold
 * once (compat: every whole tensor once), every trainer host sends each of
 * its bytes out once. */
void bc_model_bound(const bc_topo *t, bool compat, bc_links *l);
/* Every worker reads its demand from the store objects (naive), or gets it
 * from the trainer ranks that hold it (p2p): the same bytes. */
void bc_model_p2p(const bc_topo *t, bc_links *l);
/* Rank 0 gathers (g), then sends every worker its demand (s): two phases,
 * one after the other. */
void bc_model_bcast(const bc_topo *t, bc_links *g, bc_links *s);
/* ferry direct: the trainer hosts send each byte once; the rollout hosts'
 * in and out are the reader assignment's (the subscriber's plan, `nodes`
 * of its counters: nic_in, nic_out per rollout node). -1 without them. */
int bc_model_direct(const bc_topo *t, const json_t *nodes, bc_links *l);
/* ferry compat: each whole tensor into every rollout host once, read by one
 * reader and pushed once to each other host: the library's reader
 * assignment over whole tensors, the large ones cut into blocks of rows as
 * compat cuts them in a group over several nodes (fr_um_compat). 0 or -1. */
int bc_model_compat(const bc_topo *t, bc_links *l);

/* ---- --plot (bench_cluster_plot.c) ---- */

/* The switch namespace's /proc/net/dev text (buf, modified): each host's
 * port counters, up[i] (what host i sent) and down[i] (what it received),
 * bytes. 0, or -1 unless every host's port was there. */
int bc_parse_ports(char *buf, unsigned hosts, double *up, double *down);

typedef struct bc_hostv { double v[LAB_MAX_HOSTS]; } bc_hostv;
/* Every host's counters over one strategy, sampled every 100 ms. */
typedef struct bc_series {
    unsigned hosts;
    size_t n, cap;
    double *t;                 /* seconds since the strategy began */
    bc_hostv *up, *down;       /* cumulative bytes at t */
} bc_series;
typedef struct bc_sampler {
    pthread_t th;
    bool on, failed;
    volatile int stop;
    const lab *L;
    bc_series *s;
    uint64_t t0;               /* CLOCK_MONOTONIC ns */
} bc_sampler;
/* A thread (in the switch namespace) filling s until bc_sampler_stop,
 * which says whether it got at least two samples and every read worked:
 * 0 or -1. */
int bc_sampler_start(bc_sampler *sp, const lab *L, bc_series *s);
int bc_sampler_stop(bc_sampler *sp);
void bc_series_free(bc_series *s);

/* One panel's captions. */
typedef struct bc_plot_panel { const char *name; double time_s, model_s, bound_s; } bc_plot_panel;
/* The SVG: one panel per strategy (s[k], p[k]), its data and gnuplot
 * script in dir. 0, or -1 with err set. */
int bc_plot_write(const char *svg, const char *dir, const bc_topo *t, const bc_series *s,
                  const bc_plot_panel *p, unsigned ns, char *err, size_t cap);

#endif
