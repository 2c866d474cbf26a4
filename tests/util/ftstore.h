/* Test helpers: real `ferry master` and `ferry node` processes (FERRY_BIN)
 * for store tests. Children die with the test (PDEATHSIG) and are always
 * reaped by ft_cluster_stop. */
#ifndef FT_STORE_H
#define FT_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/store.h"
#include "util/testutil.h"

#define FT_MAX_NODES 4

typedef struct ft_cluster {
    char dir[256];              /* temp dir: master state under dir/master */
    char addr[64];              /* the master's HOST:PORT */
    ft_peer master;
    ft_peer node[FT_MAX_NODES];
    uint64_t seg[FT_MAX_NODES]; /* segment id of each node */
    const char *master_netns;
} ft_cluster;

/* Path of the ferry CLI (FERRY_BIN or ./ferry). */
const char *ft_ferry_bin(void);
/* Path of ferry-lab, the demos and benchmarks (FERRY_LAB or ./ferry-lab). */
const char *ft_lab_bin(void);
/* The program that runs a command line: ferry-lab for "demo ...", "bench
 * ..." and "worker ...", ferry for the rest. */
const char *ft_bin_for(const char *args);
/* Make a temp dir and start a master on listen (NULL: 127.0.0.1:0) with
 * extra arguments (NULL-terminated, may be NULL). 0 or -1. */
int ft_master_start(ft_cluster *c, const char *listen, const char *const *extra);
/* Restart the master on the same dir and address after it died. */
int ft_master_restart(ft_cluster *c, const char *const *extra);
/* Start node i with a segment of size bytes (netns and listen may be NULL). */
int ft_node_start(ft_cluster *c, int i, uint64_t size, const char *netns, const char *listen);
/* Signal a process and reap it (SIGKILL: a crash). */
void ft_proc_kill(ft_peer *p, int sig);
/* Kill everything and remove the temp dir. Safe twice. */
void ft_cluster_stop(ft_cluster *c);
/* A store config pointing at c with the test's token. */
void ft_store_config(const ft_cluster *c, ferry_store_config *cfg);

/* A master with extra arguments (NULL-terminated, may be NULL), one node
 * with a seg_size segment, and a store client whose reads lease for 1 ms (a
 * read never holds back a removal or a retention the test waits on). On
 * failure everything started is stopped again. 0 or -1. */
int ft_solo_open(ft_cluster *c, ferry_store **s, uint64_t seg_size, const char *const *extra);
/* Close the client and stop the cluster. Safe twice. */
void ft_solo_close(ft_cluster *c, ferry_store **s);

/* The same as a cmocka fixture: *state gets the ft_solo (the master's
 * heartbeat timeout as given). */
typedef struct ft_solo { ft_cluster c; ferry_store *s; } ft_solo;
int ft_solo_setup(void **state, uint64_t seg_size, int heartbeat_timeout_ms);
int ft_solo_teardown(void **state);

/* Operations retried across a failover (the HA tests): each try again 20
 * ms after a failed one, until acknowledged or retry_ms passed; the last
 * code. ft_kv_create_retried: a CAS creating key k with val; a key that
 * exists with val is a try whose answer was lost (0), with another value
 * FERRY_ESTATE. ft_queue_push_retried counts every try in *tries (a retried
 * push whose answer was lost may queue a second copy). */
void ft_pause_20ms(void);
int ft_kv_create_retried(ferry_store *s, const char *k, const char *val, uint64_t retry_ms);
int ft_queue_push_retried(ferry_store *s, const char *queue, const char *rec, uint64_t retry_ms,
                          int *tries);

#endif
