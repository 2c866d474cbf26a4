/* Cluster lab test helpers (ftlab.h). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/ftlab.h"
#include "util/testutil.h"

void ft_lab_need_root(void)
{
    if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: the lab needs root and iproute2 to create network namespaces\n");
        skip();
    }
}

/* What a lab of owner pid left: namespaces "fl<pid>-*", temp dirs
 * "ferry-cluster-fl<pid>-*", processes whose command line names either
 * that dir or marker. A count, the first one named on stderr. */
int ft_lab_leftovers(pid_t pid, const char *marker)
{
    char ns[32], dirp[64];
    snprintf(ns, sizeof ns, "fl%d-", (int)pid);
    snprintf(dirp, sizeof dirp, "ferry-cluster-fl%d-", (int)pid);
    int n = 0;
    DIR *d = opendir("/var/run/netns");
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, ns, strlen(ns)) && ++n)
            fprintf(stderr, "left: namespace %s\n", e->d_name);
    if (d)
        closedir(d);
    const char *t = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    d = opendir(t);
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, dirp, strlen(dirp)) && ++n)
            fprintf(stderr, "left: %s/%s\n", t, e->d_name);
    if (d)
        closedir(d);
    d = opendir("/proc");
    while (d && (e = readdir(d))) {
        int p = atoi(e->d_name);
        char cmd[4096];
        if (p > 0 && p != getpid() && ft_proc_cmdline(p, cmd, sizeof cmd) == 0 &&
            (strstr(cmd, dirp) || (marker && strstr(cmd, marker))) && ++n)
            fprintf(stderr, "left: process %d: %.200s\n", p, cmd);
    }
    if (d)
        closedir(d);
    char out[256];
    ft_run(out, sizeof out, "ip link show | grep -c 'fl%d' || true", (int)pid);
    if (atoi(out) > 0 && ++n)
        fprintf(stderr, "left: a link named after fl%d in the root namespace\n", (int)pid);
    return n;
}
