/* `ferry master`: the store's metadata server in the foreground.
 *
 * The server is ferry_master_* (store.h); this file parses options (one
 * table: the command line over a --config file, cli_opts.h), finds the cluster
 * token, reports the bound address, serves --metrics (metrics_http.h) and
 * turns SIGTERM/SIGINT into a clean stop. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opts.h"
#include "metrics_http.h"

static ferry_master *g_master;   /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    ferry_master_stop(g_master);
}

static int read_token_file(const char *path, ferry_master_config *c)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "ferry master: cannot read token file %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t n = fread(c->token, 1, sizeof c->token, f);
    fclose(f);
    while (n > 0 && (c->token[n - 1] == '\n' || c->token[n - 1] == '\r'))
        n--;
    if (n == 0) {
        fprintf(stderr, "ferry master: token file %s is empty\n", path);
        return -1;
    }
    c->token_len = n;
    return 0;
}

static int find_token(const char *file, ferry_master_config *c)
{
    if (file)
        return read_token_file(file, c);
    const char *t = getenv("FERRY_TOKEN");
    if (t && *t) {
        size_t n = strlen(t);
        if (n > sizeof c->token) {
            fprintf(stderr, "ferry master: FERRY_TOKEN is longer than %zu bytes\n", sizeof c->token);
            return -1;
        }
        memcpy(c->token, t, n);
        c->token_len = n;
        return 0;
    }
    if (getenv("FERRY_TOKEN_FILE") && *getenv("FERRY_TOKEN_FILE"))
        return read_token_file(getenv("FERRY_TOKEN_FILE"), c);
    fprintf(stderr, "ferry master: no cluster token: pass --token-file F or set FERRY_TOKEN or "
                    "FERRY_TOKEN_FILE (`ferry token` makes one)\n");
    return -1;
}

static int write_addr_file(const char *path, const char *addr)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    int bad = fprintf(f, "%s\n", addr) < 0;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

typedef struct master_ctx {
    ferry_master_config c;
    char dir[4096], token_file[4096], addr_file[4096], metrics[64], metrics_file[4096];
    char etcd[1024], cluster[72];
} master_ctx;

static const cli_opt master_table[] = {
    CLI_STR_REQUIRED(master_ctx, dir, "dir", "DIR",
                     "state directory (created if needed; one master at a time;\n"
                     "required, no default)"),
    CLI_STR(master_ctx, c.listen, "listen", "HOST:PORT", "address to serve (default 127.0.0.1:0: any free port)"),
    CLI_STR(master_ctx, token_file, "token-file", "F", "cluster token (else FERRY_TOKEN, else FERRY_TOKEN_FILE)"),
    CLI_UINT(master_ctx, c.heartbeat_timeout_ms, "heartbeat-timeout", "MS", 1, 86400000,   /* up to a day */
             "a node or client silent this long is suspect (10000)"),
    CLI_UINT(master_ctx, c.grace_ms, "grace", "MS", 1, 86400000,
             "a peer whose connection closed is dead after this unless\n"
             "it reconnects (default: the heartbeat timeout)"),
    CLI_UINT(master_ctx, c.dead_after_ms, "dead-after", "MS", 0, 30ull * 86400000,
             "a suspect node is dead after this (default 0: never)"),
    CLI_UINT(master_ctx, c.pending_timeout_ms, "pending-timeout", "MS", 1, 86400000,
             "revoke objects whose writer vanished mid-put (default: a minute)"),
    CLI_UINT(master_ctx, c.checkpoint_records, "checkpoint-records", "N", 1, 1000000000,
             "snapshot after N log records (1000000)"),
    CLI_STR(master_ctx, addr_file, "addr-file", "F",
            "write HOST:PORT to F once listening (atomically; default:\nno file)"),
    CLI_FLAG(master_ctx, c.no_sync, "no-sync",
             "do not fsync the log (tests and benchmarks only; default:\nevery commit is fsynced)"),
    CLI_STR(master_ctx, metrics, "metrics", "HOST:PORT",
            "serve Prometheus metrics at http://HOST:PORT/metrics\n"
            "(port 0: any free one; default: no metrics server)"),
    CLI_STR(master_ctx, metrics_file, "metrics-file", "F",
            "write the metrics URL to F once serving (atomically;\ndefault: no file)"),
    CLI_STR(master_ctx, etcd, "etcd", "URLS",
            "replicated: etcd client URLs, comma-separated; this master\n"
            "follows the cluster's log in etcd as a standby until it\n"
            "leads (default: none, a single master)"),
    CLI_STR(master_ctx, cluster, "cluster", "NAME",
            "the replicated cluster's name in etcd (with --etcd)"),
    CLI_UINT(master_ctx, c.ha_ttl_s, "ha-ttl", "S", 1, 3600,
             "the leader's etcd lease: a standby takes over this long\n"
             "after the leader's machine went silent (default 2)"),
};

static const cli_cmd master_cmd = {
    .name = "master",
    .about = "Serve the store's metadata (segments, objects, KV, barriers, queues) over TCP.\n"
             "Every change is logged in DIR before it is acknowledged; a restart on the same\n"
             "DIR recovers it. Nodes that owned segments get --grace to re-attach.\n"
             "\n"
             "A node or client silent for --heartbeat-timeout is suspect: nothing new is placed\n"
             "on a suspect node and reads of its objects fail fast, but its objects are kept and\n"
             "come back when it is heard again. A node is declared dead (its objects lost) only\n"
             "when its connection closed and it did not reconnect within --grace, a new node of\n"
             "the same name mounted, or it stayed suspect past --dead-after.",
    .opts = master_table,
    .nopts = sizeof master_table / sizeof master_table[0],
    .config_key = "\"dir\", \"heartbeat-timeout\"",
};

static int master_page(void *arg, char **text)
{
    return ferry_master_metrics(arg, 2000, text);
}

/* Parse the command line and the --config file into x: 0, or the exit
 * status (0 after --help, 2 on a usage error). */
static int master_parse(int argc, char **argv, master_ctx *x, bool *run)
{
    *run = false;
    memset(x, 0, sizeof *x);
    ferry_master_config_init(&x->c);
    x->c.token_len = 0;   /* found below, with its own error messages */
    int pr = cli_parse(&master_cmd, argc, argv, x, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &master_cmd);
    snprintf(x->c.dir, sizeof x->c.dir, "%s", x->dir);
    if (x->etcd[0] && !x->cluster[0]) {
        fprintf(stderr, "ferry master: --etcd needs --cluster NAME\n");
        return 2;
    }
    if (x->etcd[0]) {
        x->c.etcd = x->etcd;
        x->c.cluster = x->cluster;
    }
    if (find_token(x->token_file[0] ? x->token_file : NULL, &x->c) < 0)
        return 2;
    if (x->c.dead_after_ms != 0 && x->c.dead_after_ms < x->c.heartbeat_timeout_ms) {
        fprintf(stderr, "ferry master: --dead-after %llu must be 0 or at least the heartbeat "
                "timeout (%llu)\n", (unsigned long long)x->c.dead_after_ms,
                (unsigned long long)x->c.heartbeat_timeout_ms);
        return 2;
    }
    *run = true;
    return 0;
}

int cmd_master(int argc, char **argv)
{
    master_ctx x;
    bool run;
    int st = master_parse(argc, argv, &x, &run);
    if (!run)
        return st;
    ferry_master_config *c = &x.c;
    ferry_master *m = NULL;
    ferry_error err = {0};
    int rc = ferry_master_open(c, &m, &err);
    if (rc < 0) {
        fprintf(stderr, "ferry master: cannot start: %s%s\n", err.msg,
                rc == FERRY_ECORRUPT ? " (the record is named above); refusing to start" : "");
        return 1;
    }
    cli_metrics *mx = NULL;
    if (x.metrics[0] && cli_metrics_start("master", x.metrics, master_page, m, &mx) < 0) {
        ferry_master_close(m);
        return 1;
    }
    g_master = m;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    /* The files before the lines: whoever read the lines finds the files. */
    const char *bad = NULL;
    if (x.addr_file[0] && write_addr_file(x.addr_file, ferry_master_address(m)) < 0)
        bad = x.addr_file;
    else if (mx && x.metrics_file[0] && cli_metrics_write_file(mx, x.metrics_file) < 0)
        bad = x.metrics_file;
    if (bad) {
        fprintf(stderr, "ferry master: cannot write %s: %s\n", bad, strerror(errno));
        cli_metrics_stop(mx);
        ferry_master_close(m);
        return 1;
    }
    printf("ferry master listening on %s (dir %s)\n", ferry_master_address(m), c->dir);
    if (mx)
        printf("ferry master metrics on http://%s/metrics\n", cli_metrics_address(mx));
    fflush(stdout);
    rc = ferry_master_run(m);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    g_master = NULL;
    cli_metrics_stop(mx);   /* before the master it reads goes */
    ferry_master_close(m);
    if (rc < 0) {
        fprintf(stderr, "ferry master: stopped on error: %s\n", ferry_strerror(rc));
        return 1;
    }
    return 0;
}
