/* Test helper: two "hosts" on one machine — network namespaces joined by a
 * veth pair, made by the test and always removed by it. Needs root and
 * iproute2; otherwise ft_netns_create says so and returns false. */
#ifndef FT_NETNS_H
#define FT_NETNS_H

#include <stdbool.h>

typedef struct ft_netns {
    char a[32], b[32];          /* namespace names */
    char veth_a[16], veth_b[16];
    char addr_a[16], addr_b[16];
    char listen_a[24], listen_b[24];   /* "ADDR:0" */
    bool up;
    bool allowed;               /* this process may create namespaces at all */
} ft_netns;

/* Namespaces "<tag>-<pid>-a|b" with addresses 10.213.<subnet>.1 and .2. */
/* A shell command built from fmt (system()); its status, and a line on
 * stderr naming the command when it fails. */
int ft_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool ft_netns_create(ft_netns *n, const char *tag, int subnet);
void ft_netns_destroy(ft_netns *n);
/* In a test: skip, with the reason, only when this process may not create
 * network namespaces (not root, no iproute2, or no CAP_SYS_ADMIN: the first
 * `ip netns add` refused); any later step failing is the test's failure. */
#define FT_NEED_NETNS(n)                                                               \
    do {                                                                               \
        if (!(n)->up && !(n)->allowed) {                                               \
            fprintf(stderr, "skipped: multi-host test needs root, iproute2 and "      \
                            "CAP_SYS_ADMIN to create network namespaces\n");          \
            skip();                                                                    \
        }                                                                              \
        if (!(n)->up)                                                                  \
            fail_msg("network namespaces could not be set up (the failing ip "        \
                     "command is on stderr)");                                        \
    } while (0)

#endif
