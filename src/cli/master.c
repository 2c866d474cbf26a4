/* `ferry master`: the store's metadata server in the foreground.
 *
 * The server is ferry_master_* (store.h); this file parses options, finds
 * the cluster token, reports the bound address and turns SIGTERM/SIGINT
 * into a clean stop. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static ferry_master *g_master;   /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    ferry_master_stop(g_master);
}

static void master_usage(FILE *f)
{
    fprintf(f,
            "usage: ferry master --dir DIR [--listen HOST:PORT] [--token-file F]\n"
            "                    [--heartbeat-timeout MS] [--grace MS] [--dead-after MS]\n"
            "                    [--pending-timeout MS] [--checkpoint-records N]\n"
            "                    [--addr-file F] [--no-sync]\n"
            "\n"
            "Serve the store's metadata (segments, objects, KV, barriers, queues) over TCP.\n"
            "Every change is logged in DIR before it is acknowledged; a restart on the same\n"
            "DIR recovers it. Nodes that owned segments get --grace to re-attach.\n"
            "\n"
            "A node or client silent for --heartbeat-timeout is suspect: nothing new is placed\n"
            "on a suspect node and reads of its objects fail fast, but its objects are kept and\n"
            "come back when it is heard again. A node is declared dead (its objects lost) only\n"
            "when its connection closed and it did not reconnect within --grace, a new node of\n"
            "the same name mounted, or it stayed suspect past --dead-after.\n"
            "\n"
            "  --dir DIR               state directory (created if needed; one master at a time)\n"
            "  --listen HOST:PORT      address to serve (default 127.0.0.1:0: any free port)\n"
            "  --token-file F          cluster token (else FERRY_TOKEN, else FERRY_TOKEN_FILE)\n"
            "  --heartbeat-timeout MS  a node or client silent this long is suspect (10000)\n"
            "  --grace MS              a peer whose connection closed is dead after this unless\n"
            "                          it reconnects (default: the heartbeat timeout)\n"
            "  --dead-after MS         a suspect node is dead after this (default 0: never)\n"
            "  --pending-timeout MS    revoke objects whose writer vanished mid-put (60000)\n"
            "  --checkpoint-records N  snapshot after N log records (1000000)\n"
            "  --addr-file F           write HOST:PORT to F once listening (atomically)\n"
            "  --no-sync               do not fsync the log (tests and benchmarks only)\n");
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

static const char *open_error(int rc, const ferry_master_config *c)
{
    static char buf[4400];
    if (rc == FERRY_EBUSY)
        snprintf(buf, sizeof buf, "directory %s is in use by another master", c->dir);
    else if (rc == FERRY_ECORRUPT)
        snprintf(buf, sizeof buf, "the log in %s is corrupt (details above); refusing to start",
                 c->dir);
    else if (rc == -EADDRINUSE)
        snprintf(buf, sizeof buf, "address %s is already in use", c->listen);
    else if (rc == FERRY_EINVAL)
        snprintf(buf, sizeof buf, "bad configuration (listen address '%s'?)", c->listen);
    else
        snprintf(buf, sizeof buf, "%s", ferry_strerror(rc));
    return buf;
}

int cmd_master(int argc, char **argv)
{
    ferry_master_config c;
    ferry_master_config_init(&c);
    c.token_len = 0;   /* found below, with its own error messages */
    const char *token_file = NULL, *addr_file = NULL, *dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            master_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-sync")) {
            c.no_sync = true;
            continue;
        }
        if (v == NULL) {
            fprintf(stderr, "ferry master: unknown option or missing value: %s\n\n", a);
            master_usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--dir"))
            dir = v;
        else if (!strcmp(a, "--listen"))
            snprintf(c.listen, sizeof c.listen, "%s", v);
        else if (!strcmp(a, "--token-file"))
            token_file = v;
        else if (!strcmp(a, "--addr-file"))
            addr_file = v;
        else if (!strcmp(a, "--heartbeat-timeout")) {   /* up to a day */
            if (cli_opt_uint(a, v, 1, 86400000, &c.heartbeat_timeout_ms) < 0)
                return 2;
        } else if (!strcmp(a, "--grace")) {
            if (cli_opt_uint(a, v, 1, 86400000, &c.grace_ms) < 0)
                return 2;
        } else if (!strcmp(a, "--dead-after")) {   /* 0: never */
            if (cli_opt_uint(a, v, 0, 30ull * 86400000, &c.dead_after_ms) < 0)
                return 2;
        } else if (!strcmp(a, "--pending-timeout")) {
            if (cli_opt_uint(a, v, 1, 86400000, &c.pending_timeout_ms) < 0)
                return 2;
        } else if (!strcmp(a, "--checkpoint-records")) {
            if (cli_opt_uint(a, v, 1, 1000000000, &c.checkpoint_records) < 0)
                return 2;
        } else {
            fprintf(stderr, "ferry master: unknown option %s\n\n", a);
            master_usage(stderr);
            return 2;
        }
    }
    if (dir == NULL || strlen(dir) >= sizeof c.dir) {
        fprintf(stderr, "ferry master: --dir DIR is required\n\n");
        master_usage(stderr);
        return 2;
    }
    snprintf(c.dir, sizeof c.dir, "%s", dir);
    if (find_token(token_file, &c) < 0)
        return 2;

    ferry_master *m = NULL;
    if (c.dead_after_ms != 0 && c.dead_after_ms < c.heartbeat_timeout_ms) {
        fprintf(stderr, "ferry master: --dead-after %llu must be 0 or at least the heartbeat "
                "timeout (%llu)\n", (unsigned long long)c.dead_after_ms,
                (unsigned long long)c.heartbeat_timeout_ms);
        return 2;
    }
    int rc = ferry_master_open(&c, &m);
    if (rc < 0) {
        fprintf(stderr, "ferry master: cannot start: %s\n", open_error(rc, &c));
        return 1;
    }
    g_master = m;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    printf("ferry master listening on %s (dir %s)\n", ferry_master_address(m), c.dir);
    fflush(stdout);
    if (addr_file && write_addr_file(addr_file, ferry_master_address(m)) < 0) {
        fprintf(stderr, "ferry master: cannot write %s: %s\n", addr_file, strerror(errno));
        ferry_master_close(m);
        return 1;
    }
    rc = ferry_master_run(m);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    g_master = NULL;
    ferry_master_close(m);
    if (rc < 0) {
        fprintf(stderr, "ferry master: stopped on error: %s\n", ferry_strerror(rc));
        return 1;
    }
    return 0;
}
