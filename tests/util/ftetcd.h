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

#endif
