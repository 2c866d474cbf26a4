/* Test helper: a real etcd (Debian's etcd-server; ETCD_BIN or etcd on
 * PATH) on loopback ports of its own, with its data in a temp dir, for the
 * tests of ferry's etcd client and of a replicated master. It dies with
 * the test (PDEATHSIG) and ft_etcd_stop always reaps it and removes the
 * dir. */
#ifndef FT_ETCD_H
#define FT_ETCD_H

#include "util/testutil.h"

typedef struct ft_etcd {
    char dir[256];              /* its data dir's parent (removed on stop) */
    char url[64];               /* http://127.0.0.1:PORT, the client URL */
    ft_peer p;
} ft_etcd;

/* A loopback port nobody listens on now (the kernel's pick); -1. */
int ft_free_port(void);

/* Start it and wait (a deadline of 60 s, not a sleep) until it answers a
 * read. 0, or -1 with the reason on stderr (etcd not installed: run
 * scripts/deps.sh, which installs etcd-server). */
int ft_etcd_start(ft_etcd *e);
/* The same with its client URL on host (an address of this namespace:
 * one that a namespace the test made reaches over its veth). */
int ft_etcd_start_on(ft_etcd *e, const char *host);
/* SIGKILL (a machine gone) or SIGTERM, reaped. Safe twice. */
void ft_etcd_kill(ft_etcd *e, int sig);
/* Kill it and remove its dir. Safe twice. */
void ft_etcd_stop(ft_etcd *e);

/* The same as a cmocka fixture: *state gets the ft_etcd (a failed start
 * leaves nothing behind). */
int ft_etcd_setup(void **state);
int ft_etcd_teardown(void **state);

/* A candidate of `cluster` on e with a lease of ttl_s (the test fails
 * when it cannot be made). */
struct fr_ha_elect;
struct fr_ha_elect *ft_ha_candidate(const ft_etcd *e, const char *cluster, const char *id,
                                    int ttl_s);

/* A 3-member etcd cluster on loopback ports, data in a temp dir: urls
 * names all three (what masters and clients are given). Start waits until
 * the cluster answers a read (a deadline of 60 s). A member killed
 * (SIGKILL: its machine gone) and started again rejoins with its data. */
typedef struct ft_etcd3 {
    char dir[256];
    char host[16];              /* where the client URLs listen (an IPv4 address) */
    char url[3][40], urls[128], initial[160];
    int cport[3], pport[3];
    ft_peer p[3];
} ft_etcd3;
int ft_etcd3_start(ft_etcd3 *c);
/* The same with the client URLs on host (an address of this namespace
 * that a namespace the test made reaches over its veth). */
int ft_etcd3_start_on(ft_etcd3 *c, const char *host);
void ft_etcd3_kill(ft_etcd3 *c, int i);
int ft_etcd3_restart(ft_etcd3 *c, int i);
/* Kill every member and remove the dir. Safe twice. */
void ft_etcd3_stop(ft_etcd3 *c);

#endif
