/* A local one-member etcd for `ferry up --ha` and `ferry-lab bench store
 * --ha` (cli.h): its command line on loopback ports the kernel picked, and
 * a wait until it answers its /health endpoint. The caller runs it (each
 * caller has its own way of tracking children). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

int cli_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int cli_etcd_prepare(cli_etcd *e, const char *dir)
{
    memset(e, 0, sizeof *e);
    const char *b = getenv("ETCD_BIN");
    snprintf(e->bin, sizeof e->bin, "%s",
             b && *b ? b : access("/usr/bin/etcd", X_OK) == 0 ? "/usr/bin/etcd" : "etcd");
    e->port = cli_free_port();
    int peer = cli_free_port();
    if (e->port < 0 || peer < 0 || peer == e->port)
        return -1;
    snprintf(e->data, sizeof e->data, "%s/etcd", dir);
    snprintf(e->url, sizeof e->url, "http://127.0.0.1:%d", e->port);
    snprintf(e->peer, sizeof e->peer, "http://127.0.0.1:%d", peer);
    snprintf(e->initial, sizeof e->initial, "ferry=%s", e->peer);
    const char *a[] = { e->bin, "--name", "ferry", "--data-dir", e->data,
                        "--listen-client-urls", e->url, "--advertise-client-urls", e->url,
                        "--listen-peer-urls", e->peer, "--initial-advertise-peer-urls", e->peer,
                        "--initial-cluster", e->initial, "--log-level", "error",
                        "--logger", "zap", NULL };
    memcpy(e->args, a, sizeof a);
    return 0;
}

/* One GET /health: 1 when etcd says it is healthy, 0 when not (yet). */
static int health(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (fd < 0)
        return 0;
    const char req[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    char buf[1024];
    size_t n = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        while (n < sizeof buf - 1 && poll(&p, 1, 1000) == 1) {
            ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
            if (r <= 0)
                break;
            n += (size_t)r;
        }
    }
    close(fd);
    buf[n] = '\0';
    return strstr(buf, "\"health\":\"true\"") != NULL;
}

int cli_etcd_wait(const cli_etcd *e, pid_t pid, double secs)
{
    for (double end = cli_now() + secs; cli_now() < end;) {
        if (health(e->port))
            return 0;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return 1;
        struct timespec ts = { 0, 50 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
    }
    return -1;
}
