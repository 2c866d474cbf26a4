/* A real etcd for tests (ftetcd.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/base.h"
#include "store/etcd_int.h"
#include "store/ha_elect.h"
#include "util/ftetcd.h"
#include "util/ftstore.h"

int ft_free_port(void)
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

static const char *etcd_bin(void)
{
    const char *b = getenv("ETCD_BIN");
    if (b && *b)
        return b;
    return access("/usr/bin/etcd", X_OK) == 0 ? "/usr/bin/etcd" : "etcd";
}

/* Until urls answer a read (a deadline of 60 s); -1 when none of the n
 * processes in ps runs any more or past the deadline. */
static int wait_answers(const char *urls, const ft_peer *ps, int n)
{
    fr_etcd *c = NULL;
    if (fr_etcd_open(urls, 2000, &c, NULL) < 0)
        return -1;
    uint64_t deadline = fr_deadline_ns(60000);
    int rc = -1;
    for (;;) {
        fr_etcd_kv kv;
        ferry_error err = {0};
        int g = fr_etcd_get(c, "ft/ready", &kv, &err);
        fr_etcd_kv_clear(&kv);
        if (g == 0 || g == FERRY_ENOENT) {
            rc = 0;
            break;
        }
        int alive = 0;
        for (int i = 0; i < n; i++)
            alive += ft_proc_alive(ps[i].pid, ft_proc_start(ps[i].pid));
        if (fr_ms_left(deadline) == 0 || alive == 0) {
            fprintf(stderr, "ft_etcd: %s did not answer: %s\n", urls, err.msg);
            break;
        }
        struct timespec ts = { 0, 20 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
    }
    fr_etcd_close(c);
    return rc;
}

int ft_etcd_start(ft_etcd *e)
{
    return ft_etcd_start_on(e, "127.0.0.1");
}

int ft_etcd_start_on(ft_etcd *e, const char *host)
{
    memset(e, 0, sizeof *e);
    e->p.pid = -1;
    snprintf(e->dir, sizeof e->dir, "/tmp/ferry-etcd-test-XXXXXX");
    if (!mkdtemp(e->dir)) {
        e->dir[0] = 0;
        return -1;
    }
    int cport = ft_free_port(), pport = ft_free_port();
    if (cport < 0 || pport < 0 || cport == pport)
        return -1;
    char data[300], client[64], peer[64], cluster[96];
    snprintf(data, sizeof data, "%s/data", e->dir);
    snprintf(client, sizeof client, "http://%s:%d", host, cport);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", pport);
    snprintf(cluster, sizeof cluster, "ft=%s", peer);
    snprintf(e->url, sizeof e->url, "%s", client);
    const char *args[] = { "--name", "ft", "--data-dir", data, "--listen-client-urls", client,
                           "--advertise-client-urls", client, "--listen-peer-urls", peer,
                           "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
                           "--logger", "zap", "--log-level", "error", NULL };
    const char *bin = etcd_bin();
    if (ft_spawn_exe(&e->p, NULL, bin, args) != 0) {
        fprintf(stderr, "ft_etcd_start: cannot run %s (scripts/deps.sh installs etcd-server)\n", bin);
        return -1;
    }
    return wait_answers(e->url, &e->p, 1);
}

void ft_etcd_kill(ft_etcd *e, int sig)
{
    ft_proc_kill(&e->p, sig);
}

void ft_etcd_stop(ft_etcd *e)
{
    ft_proc_kill(&e->p, SIGKILL);
    if (e->dir[0]) {
        char cmd[320];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "ft_etcd_stop: could not remove %s\n", e->dir);
        e->dir[0] = 0;
    }
}

int ft_etcd_setup(void **state)
{
    ft_etcd *e = calloc(1, sizeof *e);
    *state = NULL;
    if (!e)
        return -1;
    if (ft_etcd_start(e) != 0) {
        ft_etcd_stop(e);   /* cmocka runs no teardown after a failed setup */
        free(e);
        return -1;
    }
    *state = e;
    return 0;
}

int ft_etcd_teardown(void **state)
{
    ft_etcd *e = *state;
    if (e) {
        ft_etcd_stop(e);
        free(e);
    }
    return 0;
}

fr_ha_elect *ft_ha_candidate(const ft_etcd *e, const char *cluster, const char *id, int ttl_s)
{
    fr_ha_config c = { .endpoints = e->url, .cluster = cluster, .id = id, .ttl_s = ttl_s,
                       .timeout_ms = 10000 };
    fr_ha_elect *h = NULL;
    ferry_error err = {0};
    if (fr_ha_open(&c, &h, &err) < 0)
        fail_msg("candidate %s: %s", id, err.msg);
    return h;
}

/* Member i of c: its argv (the same at every start: a member started again
 * on its data dir rejoins). */
static int member_spawn(ft_etcd3 *c, int i)
{
    char name[16], data[300], client[64], peer[64];
    snprintf(name, sizeof name, "m%d", i);
    snprintf(data, sizeof data, "%s/m%d", c->dir, i);
    snprintf(client, sizeof client, "http://%s:%d", c->host, c->cport[i]);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", c->pport[i]);
    const char *args[] = { "--name", name, "--data-dir", data, "--listen-client-urls", client,
                           "--advertise-client-urls", client, "--listen-peer-urls", peer,
                           "--initial-advertise-peer-urls", peer, "--initial-cluster", c->initial,
                           "--initial-cluster-state", "new", "--logger", "zap",
                           "--log-level", "error", NULL };
    const char *bin = etcd_bin();
    if (ft_spawn_exe(&c->p[i], NULL, bin, args) != 0) {
        fprintf(stderr, "ft_etcd3: cannot run %s (scripts/deps.sh installs etcd-server)\n", bin);
        return -1;
    }
    return 0;
}

int ft_etcd3_start(ft_etcd3 *c)
{
    return ft_etcd3_start_on(c, "127.0.0.1");
}

int ft_etcd3_start_on(ft_etcd3 *c, const char *host)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "%s", host);
    for (int i = 0; i < 3; i++)
        c->p[i].pid = -1;
    snprintf(c->dir, sizeof c->dir, "/tmp/ferry-etcd3-test-XXXXXX");
    if (!mkdtemp(c->dir)) {
        c->dir[0] = 0;
        return -1;
    }
    size_t il = 0, ul = 0;
    for (int i = 0; i < 3; i++) {
        c->cport[i] = ft_free_port();
        c->pport[i] = ft_free_port();
        if (c->cport[i] < 0 || c->pport[i] < 0)
            return -1;
        snprintf(c->url[i], sizeof c->url[i], "http://%s:%d", c->host, c->cport[i]);
        il += (size_t)snprintf(c->initial + il, sizeof c->initial - il, "%sm%d=http://127.0.0.1:%d",
                               i ? "," : "", i, c->pport[i]);
        ul += (size_t)snprintf(c->urls + ul, sizeof c->urls - ul, "%s%s", i ? "," : "", c->url[i]);
    }
    for (int i = 0; i < 3; i++)
        if (member_spawn(c, i) != 0)
            return -1;
    return wait_answers(c->urls, c->p, 3);
}

void ft_etcd3_kill(ft_etcd3 *c, int i)
{
    ft_proc_kill(&c->p[i], SIGKILL);
}

int ft_etcd3_restart(ft_etcd3 *c, int i)
{
    return member_spawn(c, i);
}

void ft_etcd3_stop(ft_etcd3 *c)
{
    for (int i = 0; i < 3; i++)
        ft_proc_kill(&c->p[i], SIGKILL);
    if (c->dir[0]) {
        char cmd[320];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "ft_etcd3_stop: could not remove %s\n", c->dir);
        c->dir[0] = 0;
    }
}
