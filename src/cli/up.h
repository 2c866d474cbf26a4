/* `ferry up` (up.c) and its --ha form (up_ha.c): what the two share. */
#ifndef FERRY_CLI_UP_H
#define FERRY_CLI_UP_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct up_opts {
    char dir[4096];
    char listen[64];
    uint64_t size;
    bool detach, json, metrics, ha;
    unsigned ha_ttl;
    char master[128];
} up_opts;

/* Set by SIGINT/SIGTERM while `ferry up` runs. */
extern volatile sig_atomic_t up_stop;

/* A small file's first line: 0, or -1 when absent or empty. */
int up_read_small(const char *path, char *out, size_t cap);
/* Start exe (up_spawn: `ferry ARGS...`); it inherits keep_fd (the
 * directory's lock). A detached child gets its own session and writes to
 * log. */
pid_t up_spawn_exe(const char *exe, const char *const *args, bool detach, const char *log,
                   int keep_fd);
pid_t up_spawn(const char *const *args, bool detach, const char *log, int keep_fd);
/* Wait for a file the child writes once ready: 0 ready; 1 the child
 * exited (*status, reaped); 2 stopped by a signal; -1 past secs. */
int up_wait_file(const char *path, pid_t child, double secs, char *out, size_t cap,
                 int *status);
/* SIGTERM, then SIGKILL after 10 s; reaped. */
void up_stop_child(pid_t p);
/* Why a child did not come up (w from up_wait_file). */
void up_explain_start(const char *who, int w, int status, uint64_t oom0, double secs,
                      bool detach, const char *log);
/* The node's name for DIR: a node started again on DIR is the same node. */
void up_node_name(const char *dir, char *out, size_t cap);

/* `ferry up --ha` in the foreground, DIR/up.lock held as lock: exit status. */
int up_ha(const up_opts *o, int lock, const char *tok);

#endif
