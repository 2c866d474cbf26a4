/* Test helpers for the cluster lab (ferry-lab cluster, bench cluster):
 * the root check and what a lab left behind. */
#ifndef FT_LAB_H
#define FT_LAB_H

#include <sys/types.h>

/* Skip the test (cmocka skip, the reason on stderr) unless it runs as root
 * with iproute2: the lab creates network namespaces. */
void ft_lab_need_root(void);
/* What a lab of owner pid left: namespaces "fl<pid>-*", temp dirs
 * "ferry-cluster-fl<pid>-*", processes whose command line names either
 * that dir or marker (may be NULL), links named after it in the root
 * namespace. A count, each one named on stderr. */
int ft_lab_leftovers(pid_t pid, const char *marker);

#endif
