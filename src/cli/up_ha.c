/* `ferry up --ha`: replicated masters on one machine, for a user who wants
 * to try failover (docs/store.md, "High availability"). In the foreground:
 * a one-member etcd, two `ferry master --etcd` (the first leads, the second
 * follows as a standby) and a node given both masters, everything under
 * DIR/ha (removed when they stop). A master that exits — killed to try a
 * failover, or stepped down — is started again as a standby, unless it
 * exited by itself right after its start (a configuration it refuses);
 * etcd or the node exiting stops everything. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "up.h"

#define HA_CLUSTER "up"
#define HA_START_S 60.0          /* etcd, a leader, the node: each at most this */
#define HA_RESTART_MIN_S 2.0     /* a master that exits (not killed) sooner is not restarted */

typedef struct ha_master {
    char dir[4300], addrf[4300], metricsf[4300], listen[64];
    pid_t pid;
    double started;
} ha_master;

typedef struct ha_up {
    const up_opts *o;
    int lock;
    const char *tok;
    char ha[4200], ttl[16];
    cli_etcd e;
    pid_t epid, npid;
    ha_master m[2];
} ha_up;

static void rm_tree(const char *dir)
{
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/rm", "rm", "-rf", "--", dir, (char *)NULL);
        _exit(127);
    }
    if (p > 0)
        waitpid(p, NULL, 0);
}

static pid_t start_master(ha_up *u, ha_master *m)
{
    remove(m->addrf);
    const char *args[] = { "ferry", "master", "--dir", m->dir, "--listen", m->listen,
                           "--token-file", u->tok, "--addr-file", m->addrf, "--etcd", u->e.url,
                           "--cluster", HA_CLUSTER, "--ha-ttl", u->ttl,
                           u->o->metrics ? "--metrics" : NULL, "127.0.0.1:0", "--metrics-file",
                           m->metricsf, NULL };
    m->started = cli_now();
    m->pid = up_spawn(args, false, NULL, u->lock);
    return m->pid;
}

static void stop_all(ha_up *u)
{
    up_stop_child(u->npid);   /* the node first: it unmounts from a live master */
    up_stop_child(u->m[1].pid);
    up_stop_child(u->m[0].pid);   /* SIGTERM: a leader resigns */
    up_stop_child(u->epid);
    u->npid = u->m[0].pid = u->m[1].pid = u->epid = -1;
    char f[4200];
    snprintf(f, sizeof f, "%s/master.addr", u->o->dir);
    remove(f);
    snprintf(f, sizeof f, "%s/node.ready", u->o->dir);
    remove(f);
    rm_tree(u->ha);
}

/* etcd, the leader, the standby, the node; 0, or the exit status after
 * everything started was stopped. */
static int start(ha_up *u, uint64_t oom0)
{
    char addr[128], seg[64], readyf[4200], sizes[32], name[32], masters[160];
    int st = 0, w;
    if (cli_etcd_prepare(&u->e, u->ha) != 0) {
        fprintf(stderr, "ferry up: no free loopback ports for etcd\n");
        return 1;
    }
    u->epid = up_spawn_exe(u->e.bin, u->e.args, false, NULL, u->lock);
    w = u->epid < 0 ? 1 : cli_etcd_wait(&u->e, u->epid, HA_START_S);
    if (w != 0) {
        fprintf(stderr, "ferry up: etcd (%s) %s; scripts/deps.sh installs etcd-server. Nothing "
                "is left running\n", u->e.bin, w == 1 ? "exited at start" : "did not answer");
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        ha_master *m = &u->m[i];
        snprintf(m->listen, sizeof m->listen, "127.0.0.1:%d", cli_free_port());
        snprintf(m->dir, sizeof m->dir, "%s/master%d", u->ha, i);
        snprintf(m->addrf, sizeof m->addrf, "%s/master%d.addr", u->ha, i);
        snprintf(m->metricsf, sizeof m->metricsf, "%s/master%d.metrics", u->ha, i);
        if (start_master(u, m) < 0)
            return 1;
        if (i == 1)
            break;
        w = up_wait_file(m->addrf, m->pid, HA_START_S, addr, sizeof addr, &st);
        if (w == 0 && u->o->metrics)
            w = up_wait_file(m->metricsf, m->pid, HA_START_S, addr, sizeof addr, &st);
        if (w != 0) {
            if (w != 2)
                up_explain_start("first master", w, st, oom0, HA_START_S, false, NULL);
            if (w == 1)
                m->pid = -1;
            return w == 2 ? 0 : 1;
        }
    }
    snprintf(masters, sizeof masters, "%s,%s", u->m[0].listen, u->m[1].listen);
    char f[4200];
    snprintf(f, sizeof f, "%s/master.addr", u->o->dir);
    snprintf(readyf, sizeof readyf, "%s/node.ready", u->o->dir);
    if (cli_write_file_atomic(f, masters) != 0) {
        fprintf(stderr, "ferry up: cannot write %s: %s\n", f, strerror(errno));
        return 1;
    }
    snprintf(sizes, sizeof sizes, "%llu", (unsigned long long)u->o->size);
    up_node_name(u->o->dir, name, sizeof name);
    const char *nargs[] = { "ferry", "node", "--master", masters, "--size", sizes, "--name", name,
                            "--token-file", u->tok, "--ready-file", readyf, NULL };
    u->npid = up_spawn(nargs, false, NULL, u->lock);
    w = u->npid < 0 ? 1 : up_wait_file(readyf, u->npid, HA_START_S, seg, sizeof seg, &st);
    if (w != 0) {
        if (w != 2)
            up_explain_start("node", w, st, oom0, HA_START_S, false, NULL);
        if (w == 1)
            u->npid = -1;
        return w == 2 ? 0 : 1;
    }
    uint64_t segid = 0;
    (void)cli_parse_uint(seg, &segid);
    printf("ferry up --ha: etcd at %s (pid %d); master %s leads (pid %d), master %s follows as "
           "a standby (pid %d); node segment %016llx (%s); state in %s\n", u->e.url, (int)u->epid,
           u->m[0].listen, (int)u->m[0].pid, u->m[1].listen, (int)u->m[1].pid,
           (unsigned long long)segid, cli_fmt_size(u->o->size, sizes, sizeof sizes), u->ha);
    if (u->o->metrics && up_read_small(u->m[0].metricsf, addr, sizeof addr) == 0)
        printf("ferry up --ha: the leader's metrics at %s (a standby serves its own once it "
               "leads: %s/masterN.metrics)\n", addr, u->ha);
    printf("ferry up --ha: to try a failover, `kill -9 %d`: the standby leads within about %s s "
           "and the killed master comes back as a standby\n", (int)u->m[0].pid, u->ttl);
    printf("export FERRY_MASTER=%s FERRY_TOKEN_FILE=%s\n", masters, u->tok);
    fflush(stdout);
    return -1;   /* running */
}

/* Until a signal, etcd or the node exits, or a master cannot stay up. */
static int supervise(ha_up *u, uint64_t oom0)
{
    while (!up_stop) {
        int st = 0;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0 && errno == EINTR)
            continue;
        if (p < 0)
            return 1;
        char why[160];
        cli_exit_reason(st, oom0, "", why, sizeof why);
        int k = p == u->m[0].pid ? 0 : p == u->m[1].pid ? 1 : -1;
        if (k < 0 && p != u->epid && p != u->npid)
            continue;
        if (k < 0) {
            fprintf(stderr, "ferry up: the %s %s; stopping\n", p == u->epid ? "etcd" : "node", why);
            if (p == u->epid)
                u->epid = -1;
            else
                u->npid = -1;
            return 1;
        }
        ha_master *m = &u->m[k];
        m->pid = -1;
        if (WIFSIGNALED(st))   /* a failover being tried, most likely: no out-of-memory guess */
            snprintf(why, sizeof why, "was killed by SIG%s", sigabbrev_np(WTERMSIG(st)) ?
                     sigabbrev_np(WTERMSIG(st)) : "?");
        if (WIFEXITED(st) && cli_now() - m->started < HA_RESTART_MIN_S) {
            fprintf(stderr, "ferry up: the master at %s %s right after its start; stopping\n",
                    m->listen, why);
            return 1;
        }
        if (start_master(u, m) < 0)
            return 1;
        printf("ferry up --ha: the master at %s %s; the other one leads; started it again as a "
               "standby (pid %d)\n", m->listen, why, (int)m->pid);
        fflush(stdout);
    }
    return 0;
}

int up_ha(const up_opts *o, int lock, const char *tok)
{
    ha_up u = { .o = o, .lock = lock, .tok = tok, .epid = -1, .npid = -1 };
    u.m[0].pid = u.m[1].pid = -1;
    snprintf(u.ha, sizeof u.ha, "%s/ha", o->dir);
    snprintf(u.ttl, sizeof u.ttl, "%u", o->ha_ttl);
    rm_tree(u.ha);   /* what a killed `ferry up --ha` left */
    if (mkdir(u.ha, 0700) != 0) {
        fprintf(stderr, "ferry up: cannot make %s: %s\n", u.ha, strerror(errno));
        return 1;
    }
    uint64_t oom0 = cli_oom_kills();
    int rc = start(&u, oom0);
    if (rc < 0)
        rc = supervise(&u, oom0);
    else if (rc == 0)
        fprintf(stderr, "ferry up: stopped by a signal while starting; nothing is left running\n");
    stop_all(&u);
    return rc;
}
