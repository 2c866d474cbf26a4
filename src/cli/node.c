/* `ferry node`: this machine's segment of store memory, in the foreground;
 * options from one table, the command line over a --config file
 * (cli_opts.h), and
 * --metrics served by metrics_http.h. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"
#include "metrics_http.h"

static ferry_node *g_node;   /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    ferry_node_stop(g_node);
}

/* Write text to path through a temporary file and a rename. */
int cli_write_file_atomic(const char *path, const char *text)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    int ok = fputs(text, f) >= 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

typedef struct node_ctx {
    ferry_node_config cfg;
    char token_file[4096], ready[4096], metrics[64], metrics_file[4096];
} node_ctx;

static const cli_opt node_table[] = {
    CLI_STR(node_ctx, cfg.master, "master", "HOST:PORT", "the master (default FERRY_MASTER)"),
    CLI_SIZE(node_ctx, cfg.segment_size, "size", "SIZE", 1u << 20, UINT64_MAX,
             "segment bytes: 64M, 4G, ... (default 1G)"),
    CLI_STR(node_ctx, cfg.engine.listen_addr, "listen", "HOST:PORT",
            "where remote clients reach the segment (default\nFERRY_LISTEN, else 127.0.0.1:0)"),
    CLI_STR(node_ctx, cfg.name, "name", "NAME",
            "a name that stays the same across restarts (at most 63\n"
            "bytes): when a node of this name mounts again, the master\n"
            "declares the old process's objects lost at once instead\n"
            "of after its grace period (default: none)"),
    CLI_STR(node_ctx, token_file, "token-file", "F", "cluster token (else FERRY_TOKEN, else FERRY_TOKEN_FILE)"),
    CLI_STR(node_ctx, ready, "ready-file", "F",
            "write the segment id (decimal) to F once mounted (atomically;\ndefault: no file)"),
    CLI_UINT(node_ctx, cfg.heartbeat_ms, "heartbeat", "MS", 1, FERRY_DEFAULT_TIMEOUT_MS,
             "heartbeat period to the master (default 1000; keep it\n"
             "well below the master's --heartbeat-timeout)"),
    CLI_STR(node_ctx, metrics, "metrics", "HOST:PORT",
            "serve Prometheus metrics at http://HOST:PORT/metrics\n"
            "(port 0: any free one; default: no metrics server)"),
    CLI_STR(node_ctx, metrics_file, "metrics-file", "F",
            "write the metrics URL to F once serving (atomically;\ndefault: no file)"),
};

static const cli_cmd node_cmd = {
    .name = "node",
    .about = "Own one segment of this machine's memory (memfd, pre-faulted), serve remote\n"
             "reads and writes into it and mount it on the master. Same-host clients map it.",
    .opts = node_table,
    .nopts = sizeof node_table / sizeof node_table[0],
    .config_key = "\"master\", \"size\"",
};

static int node_page(void *arg, char **text)
{
    return ferry_node_metrics(arg, text);
}

int cmd_node(int argc, char **argv)
{
    node_ctx x;
    memset(&x, 0, sizeof x);
    ferry_node_config *cfg = &x.cfg;
    int rc = ferry_node_config_init(cfg);
    int pr = cli_parse(&node_cmd, argc, argv, &x, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &node_cmd);
    ferry_error err = {0};
    if (x.token_file[0] && ferry_engine_config_token_file(&cfg->engine, x.token_file, &err) < 0) {
        fprintf(stderr, "ferry node: %s\n", err.msg);
        return 2;
    }
    if (!cfg->master[0]) {
        fprintf(stderr, "ferry node: no master: pass --master HOST:PORT or set FERRY_MASTER\n");
        return 2;
    }
    if (cfg->engine.token_len == 0) {
        fprintf(stderr, "ferry node: no cluster token: pass --token-file or set FERRY_TOKEN\n");
        return 2;
    }
    ferry_node *n = NULL;
    rc = ferry_node_open(cfg, &n, &err);
    if (rc < 0) {
        fprintf(stderr, "ferry node: cannot start against the master at %s: %s\n", cfg->master,
                err.msg);
        return 1;
    }
    cli_metrics *mx = NULL;
    if (x.metrics[0] && cli_metrics_start("node", x.metrics, node_page, n, &mx) < 0) {
        ferry_node_close(n);
        return 1;
    }
    g_node = n;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* The metrics file, the ready file, then the lines: a ready file means
     * everything asked for is up, and whoever read the lines finds the files. */
    if (mx && x.metrics_file[0] && cli_metrics_write_file(mx, x.metrics_file) != 0)
        fprintf(stderr, "ferry node: cannot write %s: %s\n", x.metrics_file, strerror(errno));
    if (x.ready[0]) {
        char text[32];
        snprintf(text, sizeof text, "%llu\n", (unsigned long long)ferry_node_segment(n));
        if (cli_write_file_atomic(x.ready, text) != 0)
            fprintf(stderr, "ferry node: cannot write %s: %s\n", x.ready, strerror(errno));
    }
    char sz[32];
    printf("ferry node %016llx: segment %016llx (%s) mounted on the master at %s\n",
           (unsigned long long)ferry_node_id(n), (unsigned long long)ferry_node_segment(n),
           cli_fmt_size(cfg->segment_size, sz, sizeof sz), cfg->master);
    if (mx)
        printf("ferry node metrics on http://%s/metrics\n", cli_metrics_address(mx));
    fflush(stdout);
    rc = ferry_node_run(n);
    g_node = NULL;
    cli_metrics_stop(mx);   /* before the node it reads goes */
    ferry_node_close(n);
    return rc < 0 ? 1 : 0;
}
