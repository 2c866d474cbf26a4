/* tcp transport: listen and peer addresses. */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "engine/transport/tcp_int.h"

/* ======================================================================
 * addresses
 * ==================================================================== */

/* Endpoint fields and "tcp://HOST:PORT" from the bound listener address. */
void fr_tcp_publish_endpoint(ferry_engine *e, const struct sockaddr_storage *ss)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        e->ep.family = 6;
        e->ep.port = ntohs(a->sin6_port);
        memcpy(e->ep.addr, &a->sin6_addr, 16);
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(e->address, sizeof e->address, "tcp://[%s]:%u", host, (unsigned)e->ep.port);
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        e->ep.family = 4;
        e->ep.port = ntohs(a->sin_port);
        memset(e->ep.addr, 0, sizeof e->ep.addr);
        memcpy(e->ep.addr, &a->sin_addr, 4);
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(e->address, sizeof e->address, "tcp://%s:%u", host, (unsigned)e->ep.port);
    }
    e->ep.transports |= FR_TRANSPORT_TCP;
}

/* sockaddr and printable name of a peer's tcp endpoint. */
int fr_tcp_endpoint_sockaddr(const fr_endpoint *ep, struct sockaddr_storage *ss, socklen_t *sl,
                             char *name, size_t nlen)
{
    char host[INET6_ADDRSTRLEN] = "?";

    memset(ss, 0, sizeof *ss);
    if (ep->family == 4) {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons(ep->port);
        memcpy(&a->sin_addr, ep->addr, 4);
        *sl = sizeof *a;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(name, nlen, "%s:%u", host, (unsigned)ep->port);
        return 0;
    }
    if (ep->family == 6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(ep->port);
        memcpy(&a->sin6_addr, ep->addr, 16);
        *sl = sizeof *a;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(name, nlen, "[%s]:%u", host, (unsigned)ep->port);
        return 0;
    }
    return FERRY_EINVAL;
}

void fr_tcp_set_nodelay(int fd)
{
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ======================================================================
 * server side
 * ==================================================================== */
