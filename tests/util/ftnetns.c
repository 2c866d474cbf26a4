/* Two network namespaces joined by veth (ftnetns.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/ftnetns.h"

int ft_sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "netns: '%s' failed (%d)\n", cmd, rc);
    return rc;
}

bool ft_netns_create(ft_netns *n, const char *tag, int subnet)
{
    memset(n, 0, sizeof *n);
    if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1") != 0)
        return false;
    int pid = (int)getpid();
    snprintf(n->a, sizeof n->a, "%s-%d-a", tag, pid);
    snprintf(n->b, sizeof n->b, "%s-%d-b", tag, pid);
    snprintf(n->veth_a, sizeof n->veth_a, "%.2sa%d", tag, pid % 10000000);
    snprintf(n->veth_b, sizeof n->veth_b, "%.2sb%d", tag, pid % 10000000);
    snprintf(n->addr_a, sizeof n->addr_a, "10.213.%d.1", subnet);
    snprintf(n->addr_b, sizeof n->addr_b, "10.213.%d.2", subnet);
    snprintf(n->listen_a, sizeof n->listen_a, "%s:0", n->addr_a);
    snprintf(n->listen_b, sizeof n->listen_b, "%s:0", n->addr_b);
    n->allowed = ft_sh("ip netns add %s", n->a) == 0;
    n->up = n->allowed && ft_sh("ip netns add %s", n->b) == 0 &&
            ft_sh("ip link add %s type veth peer name %s", n->veth_a, n->veth_b) == 0 &&
            ft_sh("ip link set %s netns %s", n->veth_a, n->a) == 0 &&
            ft_sh("ip link set %s netns %s", n->veth_b, n->b) == 0 &&
            ft_sh("ip -n %s addr add %s/24 dev %s", n->a, n->addr_a, n->veth_a) == 0 &&
            ft_sh("ip -n %s addr add %s/24 dev %s", n->b, n->addr_b, n->veth_b) == 0 &&
            ft_sh("ip -n %s link set %s up", n->a, n->veth_a) == 0 &&
            ft_sh("ip -n %s link set %s up", n->b, n->veth_b) == 0 &&
            ft_sh("ip -n %s link set lo up", n->a) == 0 && ft_sh("ip -n %s link set lo up", n->b) == 0;
    return n->up;
}

/* Deleting a namespace deletes the veth end inside it, and so the pair. */
void ft_netns_destroy(ft_netns *n)
{
    if (n->a[0])
        ft_sh("ip netns del %s 2>/dev/null", n->a);
    if (n->b[0])
        ft_sh("ip netns del %s 2>/dev/null", n->b);
    memset(n, 0, sizeof *n);
}
