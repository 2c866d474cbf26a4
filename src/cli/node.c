/* `ferry node`: this machine's segment of store memory, in the foreground. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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
            "                  [--heartbeat MS]\n"
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
            "  --ready-file F       write the segment id to F once mounted (atomically)\n"
            "  --heartbeat MS       heartbeat period to the master (default 1000; keep it\n"
            "                       well below the master's --heartbeat-timeout)\n");
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

int cmd_node(int argc, char **argv)
{
    ferry_node_config cfg;
    int rc = ferry_node_config_init(&cfg);
    const char *ready = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            node_usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "ferry node: %s needs a value (or is unknown)\n\n", a);
            node_usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--master"))
            snprintf(cfg.master, sizeof cfg.master, "%s", v);
        else if (!strcmp(a, "--size")) {
            if (cli_opt_size(a, v, 1u << 20, UINT64_MAX, &cfg.segment_size) < 0)
                return 2;
        } else if (!strcmp(a, "--name")) {
            if (strlen(v) >= sizeof cfg.name) {
                fprintf(stderr, "ferry node: --name is at most %zu bytes, not %zu\n",
                        sizeof cfg.name - 1, strlen(v));
                return 2;
            }
            snprintf(cfg.name, sizeof cfg.name, "%s", v);
        } else if (!strcmp(a, "--listen"))
            snprintf(cfg.engine.listen_addr, sizeof cfg.engine.listen_addr, "%s", v);
        else if (!strcmp(a, "--token-file")) {
            if ((rc = ferry_engine_config_token_file(&cfg.engine, v)) < 0) {
                fprintf(stderr, "ferry node: cannot read the token file %s\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--heartbeat")) {
            if (cli_opt_unsigned(a, v, 1, 60000, &cfg.heartbeat_ms) < 0)
                return 2;
        } else if (!strcmp(a, "--ready-file"))
            ready = v;
        else {
            fprintf(stderr, "ferry node: unknown option %s\n\n", a);
            node_usage(stderr);
            return 2;
        }
    }
    if (!cfg.master[0]) {
        fprintf(stderr, "ferry node: no master: pass --master HOST:PORT or set FERRY_MASTER\n");
        return 2;
    }
    if (cfg.engine.token_len == 0) {
        fprintf(stderr, "ferry node: no cluster token: pass --token-file or set FERRY_TOKEN\n");
        return 2;
    }
    ferry_node *n = NULL;
    rc = ferry_node_open(&cfg, &n);
    if (rc < 0) {
        fprintf(stderr, "ferry node: cannot start against the master at %s: %s\n", cfg.master,
                ferry_strerror(rc));
        return 1;
    }
    g_node = n;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    char sz[32];
    printf("ferry node %016llx: segment %llu (%s) mounted on the master at %s\n",
           (unsigned long long)ferry_node_id(n), (unsigned long long)ferry_node_segment(n),
           cli_fmt_size(cfg.segment_size, sz, sizeof sz), cfg.master);
    fflush(stdout);
    if (ready) {
        char text[32];
        snprintf(text, sizeof text, "%llu\n", (unsigned long long)ferry_node_segment(n));
        if (cli_write_file_atomic(ready, text) != 0)
            fprintf(stderr, "ferry node: cannot write %s: %s\n", ready, strerror(errno));
    }
    rc = ferry_node_run(n);
    g_node = NULL;
    ferry_node_close(n);
    return rc < 0 ? 1 : 0;
}
