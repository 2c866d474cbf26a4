/* `ferry node`: this machine's segment of store memory, in the foreground;
 * options from the command line over a --config file (cli_config.h), and
 * --metrics served by metrics_http.h. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_config.h"
#include "metrics_http.h"

static ferry_node *g_node;   /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    ferry_node_stop(g_node);
}

static void node_usage(FILE *f)
{
    fprintf(f,
            "usage: ferry node --master HOST:PORT [--size SIZE] [--listen HOST:PORT]\n"
            "                  [--name NAME] [--token-file F] [--ready-file F]\n"
            "                  [--heartbeat MS] [--metrics HOST:PORT] [--metrics-file F]\n"
            "                  [--config FILE]\n"
            "\n"
            "Own one segment of this machine's memory (memfd, pre-faulted), serve remote\n"
            "reads and writes into it and mount it on the master. Same-host clients map it.\n"
            "\n"
            "  --master HOST:PORT   the master (default FERRY_MASTER)\n"
            "  --size SIZE          segment bytes: 64M, 4G, ... (default 1G)\n"
            "  --listen HOST:PORT   where remote clients reach the segment (default\n"
            "                       FERRY_LISTEN, else 127.0.0.1:0)\n"
            "  --name NAME          a name that stays the same across restarts (at most 63\n"
            "                       bytes): when a node of this name mounts again, the master\n"
            "                       declares the old process's objects lost at once instead\n"
            "                       of after its grace period (default: none)\n"
            "  --token-file F       cluster token (else FERRY_TOKEN, else FERRY_TOKEN_FILE)\n"
            "  --ready-file F       write the segment id (decimal) to F once mounted (atomically;\n"
            "                       default: no file)\n"
            "  --heartbeat MS       heartbeat period to the master (default 1000; keep it\n"
            "                       well below the master's --heartbeat-timeout)\n"
            "  --metrics HOST:PORT  serve Prometheus metrics at http://HOST:PORT/metrics\n"
            "                       (port 0: any free one; default: no metrics server)\n"
            "  --metrics-file F     write the metrics URL to F once serving (atomically;\n"
            "                       default: no file)\n"
            "  --config FILE        options from a JSON object whose keys are the option\n"
            "                       names (\"master\", \"size\", ...); options on the command\n"
            "                       line override it (docs/operations.md; default: no file)\n");
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

static const cli_optdef node_opts[] = {
    { "master", CLI_OPT_STR }, { "size", CLI_OPT_NUM }, { "listen", CLI_OPT_STR },
    { "name", CLI_OPT_STR }, { "token-file", CLI_OPT_STR }, { "ready-file", CLI_OPT_STR },
    { "heartbeat", CLI_OPT_NUM }, { "metrics", CLI_OPT_STR }, { "metrics-file", CLI_OPT_STR },
};

typedef struct node_ctx {
    ferry_node_config cfg;
    char ready[4096], metrics[64], metrics_file[4096];
} node_ctx;

static int set_str(const char *opt, const char *v, char *dst, size_t cap)
{
    if (strlen(v) >= cap) {
        fprintf(stderr, "ferry node: --%s is at most %zu bytes, not %zu\n", opt, cap - 1,
                strlen(v));
        return -1;
    }
    snprintf(dst, cap, "%s", v);
    return 0;
}

static int node_apply(void *arg, const char *name, const char *v)
{
    node_ctx *x = arg;
    ferry_node_config *cfg = &x->cfg;
    char opt[64];
    snprintf(opt, sizeof opt, "--%s", name);
    if (!strcmp(name, "master"))
        return set_str(name, v, cfg->master, sizeof cfg->master);
    if (!strcmp(name, "size"))
        return cli_opt_size(opt, v, 1u << 20, UINT64_MAX, &cfg->segment_size);
    if (!strcmp(name, "name"))
        return set_str(name, v, cfg->name, sizeof cfg->name);
    if (!strcmp(name, "listen"))
        return set_str(name, v, cfg->engine.listen_addr, sizeof cfg->engine.listen_addr);
    if (!strcmp(name, "token-file")) {
        if (ferry_engine_config_token_file(&cfg->engine, v) < 0) {
            fprintf(stderr, "ferry node: cannot read the token file %s\n", v);
            return -1;
        }
        return 0;
    }
    if (!strcmp(name, "heartbeat"))
        return cli_opt_unsigned(opt, v, 1, 60000, &cfg->heartbeat_ms);
    if (!strcmp(name, "ready-file"))
        return set_str(name, v, x->ready, sizeof x->ready);
    if (!strcmp(name, "metrics"))
        return set_str(name, v, x->metrics, sizeof x->metrics);
    if (!strcmp(name, "metrics-file"))
        return set_str(name, v, x->metrics_file, sizeof x->metrics_file);
    fprintf(stderr, "ferry node: option --%s is not handled\n", name);   /* a table bug */
    return -1;
}

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
    cli_args a;
    size_t nopts = sizeof node_opts / sizeof node_opts[0];
    int pr = cli_args_parse("node", argc, argv, node_opts, nopts, &a);
    if (pr == 0 && cli_args_apply("node", &a, node_opts, nopts, node_apply, &x) < 0)
        pr = -1;
    if (pr != 0)
        return cli_usage_exit(pr, node_usage);
    if (!cfg->master[0]) {
        fprintf(stderr, "ferry node: no master: pass --master HOST:PORT or set FERRY_MASTER\n");
        return 2;
    }
    if (cfg->engine.token_len == 0) {
        fprintf(stderr, "ferry node: no cluster token: pass --token-file or set FERRY_TOKEN\n");
        return 2;
    }
    ferry_node *n = NULL;
    rc = ferry_node_open(cfg, &n);
    if (rc < 0) {
        fprintf(stderr, "ferry node: cannot start against the master at %s: %s\n", cfg->master,
                ferry_strerror(rc));
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
