/* Test helpers for store tests (ftstore.h). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "util/ftstore.h"

const char *ft_ferry_bin(void)
{
    const char *b = getenv("FERRY_BIN");
    return b && *b ? b : "./ferry";
}

const char *ft_lab_bin(void)
{
    const char *b = getenv("FERRY_LAB");
    return b && *b ? b : "./ferry-lab";
}

static bool first_word(const char *s, const char *w)
{
    size_t n = strlen(w);
    return !strncmp(s, w, n) && (s[n] == ' ' || s[n] == 0);
}

const char *ft_bin_for(const char *args)
{
    bool lab = first_word(args, "demo") || first_word(args, "bench") || first_word(args, "worker") ||
               first_word(args, "cluster");
    return lab ? ft_lab_bin() : ft_ferry_bin();
}

static int start_master(ft_cluster *c, const char *listen, const char *const *extra)
{
    char mdir[300];
    snprintf(mdir, sizeof mdir, "%s/master", c->dir);
    const char *args[32] = { "master", "--dir", mdir, "--listen", listen };
    int n = 5;
    for (int i = 0; extra && extra[i] && n < 30; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    if (ft_spawn_exe(&c->master, c->master_netns, ft_ferry_bin(), args) != 0)
        return -1;
    char line[512] = "";
    if (ft_read_line(&c->master, line, sizeof line, FT_START_MS) != 0) {
        fprintf(stderr, "the master exited or said nothing within %d ms\n", FT_START_MS);
        return -1;
    }
    const char *at = strstr(line, "listening on ");
    if (!at) {
        fprintf(stderr, "the master did not say where it listens: \"%.200s\"\n", line);
        return -1;
    }
    if (sscanf(at + 13, "%63s", c->addr) != 1)
        return -1;
    return 0;
}

int ft_master_start(ft_cluster *c, const char *listen, const char *const *extra)
{
    const char *netns = c->master_netns;
    memset(c, 0, sizeof *c);
    c->master_netns = netns;
    c->master.pid = -1;
    for (int i = 0; i < FT_MAX_NODES; i++)
        c->node[i].pid = -1;
    (void)ft_token();
    snprintf(c->dir, sizeof c->dir, "/tmp/ferry-store-test-XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    return start_master(c, listen ? listen : "127.0.0.1:0", extra);
}

int ft_master_restart(ft_cluster *c, const char *const *extra)
{
    char addr[64];
    snprintf(addr, sizeof addr, "%s", c->addr);
    return start_master(c, addr, extra);
}

int ft_node_start(ft_cluster *c, int i, uint64_t size, const char *netns, const char *listen)
{
    char sz[32];
    snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
    const char *args[12] = { "node", "--master", c->addr, "--size", sz, "--heartbeat", "100" };
    int n = 7;
    if (listen) {
        args[n++] = "--listen";
        args[n++] = listen;
    }
    args[n] = NULL;
    if (ft_spawn_exe(&c->node[i], netns, ft_ferry_bin(), args) != 0)
        return -1;
    char line[512] = "";
    if (ft_read_line(&c->node[i], line, sizeof line, FT_START_MS) != 0 || !strstr(line, "mounted")) {
        fprintf(stderr, "node %d did not mount: \"%.200s\"\n", i, line);
        return -1;
    }
    const char *at = strstr(line, "segment ");
    c->seg[i] = at ? strtoull(at + 8, NULL, 16) : 0;   /* ids print as 16 hex digits */
    return 0;
}

void ft_proc_kill(ft_peer *p, int sig)
{
    if (p->pid > 0) {
        kill(p->pid, sig);
        if (ft_peer_wait_exit(p, 10000) < 0) {
            kill(p->pid, SIGKILL);
            ft_peer_wait_exit(p, 10000);
        }
    }
    if (p->in_fd > 0)
        close(p->in_fd);
    if (p->out_fd > 0)
        close(p->out_fd);
    p->in_fd = p->out_fd = -1;
    p->pid = -1;
}

void ft_cluster_stop(ft_cluster *c)
{
    for (int i = 0; i < FT_MAX_NODES; i++)
        ft_proc_kill(&c->node[i], SIGTERM);
    ft_proc_kill(&c->master, SIGTERM);
    if (c->dir[0]) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", c->dir);
        c->dir[0] = 0;
    }
}

void ft_store_config(const ft_cluster *c, ferry_store_config *cfg)
{
    ferry_store_config_init(cfg);
    snprintf(cfg->master, sizeof cfg->master, "%s", c->addr);
    ft_config(&cfg->engine, "");
    cfg->timeout_ms = 10000;
    cfg->heartbeat_ms = 100;
}

int ft_solo_open(ft_cluster *c, ferry_store **s, uint64_t seg_size, const char *const *extra)
{
    *s = NULL;
    if (ft_master_start(c, NULL, extra) != 0 || ft_node_start(c, 0, seg_size, NULL, NULL) != 0)
        goto fail;
    ferry_store_config cfg;
    ft_store_config(c, &cfg);
    cfg.lease_ms = 1;
    if (ferry_store_open(&cfg, s, NULL) != 0)
        goto fail;
    return 0;
fail:
    ft_solo_close(c, s);
    return -1;
}

void ft_solo_close(ft_cluster *c, ferry_store **s)
{
    ferry_store_close(*s);
    *s = NULL;
    ft_cluster_stop(c);
}

int ft_solo_setup(void **state, uint64_t seg_size, int heartbeat_timeout_ms)
{
    ft_solo *f = calloc(1, sizeof *f);
    *state = NULL;
    if (!f)
        return -1;
    char hb[24];
    snprintf(hb, sizeof hb, "%d", heartbeat_timeout_ms);
    const char *const extra[] = { "--heartbeat-timeout", hb, NULL };
    if (ft_solo_open(&f->c, &f->s, seg_size, extra) != 0) {
        free(f);   /* cmocka runs no teardown after a failed setup */
        return -1;
    }
    *state = f;
    return 0;
}

int ft_solo_teardown(void **state)
{
    ft_solo *f = *state;
    if (!f)
        return 0;
    ft_solo_close(&f->c, &f->s);
    free(f);
    *state = NULL;
    return 0;
}

void ft_pause_20ms(void)
{
    struct timespec ts = { 0, 20 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
    nanosleep(&ts, NULL);
}

int ft_kv_create_retried(ferry_store *s, const char *k, const char *val, uint64_t retry_ms)
{
    uint64_t dl = fr_deadline_ns((int64_t)retry_ms);
    for (;;) {
        int rc = ferry_kv_cas(s, k, 0, val, strlen(val), NULL, NULL);
        if (rc == FERRY_ESTATE) {   /* exists: ours, from a try whose answer was lost? */
            ferry_kv_value kv;
            if (ferry_kv_get(s, k, &kv, NULL) == 0) {
                bool ours = kv.len == strlen(val) && !memcmp(kv.val, val, kv.len);
                ferry_store_free(kv.val);
                rc = ours ? 0 : FERRY_ESTATE;
                if (!ours)
                    return rc;
            }
        }
        if (rc == 0 || !fr_ms_left(dl))
            return rc;
        ft_pause_20ms();
    }
}

int ft_queue_push_retried(ferry_store *s, const char *queue, const char *rec, uint64_t retry_ms,
                          int *tries)
{
    uint64_t dl = fr_deadline_ns((int64_t)retry_ms);
    int rc;
    do
        (*tries)++;
    while ((rc = ferry_queue_push(s, queue, rec, strlen(rec), NULL, NULL)) != 0 && fr_ms_left(dl) &&
           (ft_pause_20ms(), true));
    return rc;
}
