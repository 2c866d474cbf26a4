/* Test helpers: peer processes driven over pipes, deadlines, patterns.
 * A test binary calls ft_main_peer(argc, argv) first thing in main: when
 * started with --peer it becomes a target process (an engine with one
 * registered region) that answers line commands on stdin. */
#ifndef FT_TESTUTIL_H
#define FT_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ferry/engine.h"

typedef struct ft_peer {
    pid_t pid;
    int in_fd;            /* commands to the peer */
    int out_fd;           /* replies from the peer */
    char buf[4096];
    size_t blen;
    uint8_t desc[FERRY_DESC_MAX];   /* region descriptor */
    size_t desc_len;
    uint8_t ep[FERRY_DESC_MAX];     /* endpoint descriptor */
    size_t ep_len;
    uint64_t region_addr, region_len;
} ft_peer;

/* Options of a peer process. */
typedef struct ft_peer_opts {
    uint64_t size;           /* region bytes */
    bool malloc_mem;         /* plain heap memory instead of ferry_mem_alloc (shm then uses CMA) */
    const char *flags;       /* "rw", "r", "w", "none" */
    const char *token;       /* NULL: the test's token */
    const char *listen;      /* NULL: 127.0.0.1:0 */
    const char *netns;       /* run inside this network namespace (ip netns exec) */
} ft_peer_opts;

/* If argv[1] == "--peer", run the peer and return its exit code;
 * if argv[1] == "--initiator", run one verified transfer round against the
 * region descriptor argv[2] (hex) and print "OK <transport> <hash>" (the
 * hash of the pattern written) or "FAIL <why>"; else -1. */
int ft_main_peer(int argc, char **argv);

/* The token every test process shares (random per test run, exported as
 * FERRY_TOKEN so child processes inherit it). Its first call also applies
 * FERRY_TEST_FILTER (docs/testing.md): only the tests whose names match run. */
const char *ft_token(void);
/* An engine config for the test: token, transport forced to `transport`. */
void ft_config(ferry_engine_config *cfg, const char *transport);
/* An engine opened with ft_config (a cmocka failure if it cannot be). */
ferry_engine *ft_engine_open(const char *transport);

/* How long a child process started by a test may take to say it is ready.
 * A generous deadline on that condition, never a measurement: under a
 * sanitizer beside five other tests and CPU hogs, a peer that maps and
 * registers 1 GiB took longer than the 20 s this was. */
#define FT_START_MS 120000

/* Start a peer; waits for READY up to FT_START_MS. 0 or a negative code;
 * on failure says on stderr what the peer printed or that it said nothing. */
int ft_peer_start(ft_peer *p, const ft_peer_opts *o);
/* Run this test binary with args (NULL-terminated) as a child, optionally
 * inside a network namespace, its stdin/stdout on pipes (no READY wait). */
int ft_spawn(ft_peer *p, const char *netns, const char *const *args);
/* The same with another executable. */
int ft_spawn_exe(ft_peer *p, const char *netns, const char *exe, const char *const *args);
/* Read one line of the child's output within timeout_ms. 0 or -1. */
int ft_read_line(ft_peer *p, char *out, size_t cap, int timeout_ms);
/* Send one command line and wait for its reply line (without "\n").
 * Returns 0 if the reply starts with "OK", -1 otherwise or on timeout. */
int ft_peer_cmd(ft_peer *p, char *reply, size_t cap, int timeout_ms, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The two halves of ft_peer_cmd: send a line now, read its reply later. */
int ft_peer_send(ft_peer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ft_peer_reply(ft_peer *p, char *reply, size_t cap, int timeout_ms);
/* Hash of the peer's region [off, off+len). */
uint64_t ft_peer_hash(ft_peer *p, uint64_t off, uint64_t len);
/* Stop: "quit", wait up to 10 s, then SIGKILL. Always reaps. Safe twice. */
void ft_peer_stop(ft_peer *p);
void ft_peer_signal(ft_peer *p, int sig);
/* Wait for the peer process to exit (deadline), reaping it. */
int ft_peer_wait_exit(ft_peer *p, int timeout_ms);

/* Deterministic pattern: byte i of the stream (seed). */
/* Run a shell command (printf-style) and capture its stdout into out (at
 * most cap - 1 bytes, NUL-terminated). Its exit status, or -1 when it could
 * not be started or did not exit normally. */
int ft_run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Processes as /proc shows them (for tests of process hygiene). */
/* Wait up to timeout_ms for child pid to exit and reap it: 0 and its wait
 * status, or -1 (still running). */
int ft_wait_status(pid_t pid, int timeout_ms, int *status);
/* Up to cap pids whose parent is parent; how many. */
size_t ft_children(pid_t parent, pid_t *out, size_t cap);
/* The command line with its arguments joined by spaces: 0, or -1 when the
 * process is gone (or has none: a zombie). */
int ft_proc_cmdline(pid_t pid, char *out, size_t cap);
/* Its start time (/proc/PID/stat field 22), 0 when there is no such process. */
unsigned long long ft_proc_start(pid_t pid);
/* Whether the process that had this pid and start time still runs (a
 * zombie does not). */
bool ft_proc_alive(pid_t pid, unsigned long long start);

void ft_pattern(uint8_t *buf, uint64_t len, uint64_t seed, uint64_t offset);
uint64_t ft_hash(const void *buf, uint64_t len);

/* The test fails unless err (filled by a failed call) holds code and each
 * of the words w1..w3 (NULL: none). */
void ft_assert_says(const ferry_error *err, int code, const char *w1, const char *w2,
                    const char *w3);

#endif
