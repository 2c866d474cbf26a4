/* Test helper: a flood of slow connections (slowloris) against a ferry
 * listener, run on its own thread. Each connection reads the server's
 * CHALLENGE, then trickles a well-formed AUTH frame one byte every gap_ms
 * (it never sends the last byte), and records when and how the server
 * closed it. TCP connections come from 127.0.0.<src_first> ..
 * 127.0.0.<src_first + nsrc - 1> round robin (all of 127/8 is loopback), so
 * one test plays many source addresses. Raise RLIMIT_NOFILE first
 * (ft_flood_raise_nofile) for floods of hundreds. */
#ifndef FT_FLOOD_H
#define FT_FLOOD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ft_flood ft_flood;

typedef struct ft_flood_spec {
    const char *tcp;        /* "127.0.0.1:PORT", or NULL */
    const char *uds;        /* abstract unix socket name (no leading '@'), or NULL */
    unsigned n;             /* connections */
    unsigned src_first;     /* tcp: last octet of the first source address (>= 1) */
    unsigned nsrc;          /* tcp: source addresses (>= 1) */
    unsigned gap_ms;        /* one byte every gap_ms (default 1000) */
} ft_flood_spec;

typedef struct ft_flood_counts {
    unsigned opened;        /* connected */
    unsigned challenged;    /* got the server's CHALLENGE */
    unsigned closed;        /* closed by the server */
    unsigned connect_failed;
    unsigned timed_out;     /* ... after AUTH_FAIL FERRY_ETIMEDOUT */
    unsigned displaced;     /* ... after AUTH_FAIL FERRY_EAGAIN */
    unsigned other;         /* ... with another status or none */
    uint64_t first_start_ns;      /* CLOCK_MONOTONIC of the first connect() */
    uint64_t timeout_life_min_ms; /* connect() to close, of the timed-out ones */
    uint64_t timeout_life_max_ms;
    unsigned bytes_max;     /* most AUTH bytes sent on one connection */
} ft_flood_counts;

/* Start the flood (it connects at once, a few hundred at a time). 0 or -1. */
int ft_flood_start(const ft_flood_spec *s, ft_flood **out);
void ft_flood_get(ft_flood *f, ft_flood_counts *c);
/* Wait until every connection is open and challenged, or any closed, or
 * timeout_ms passed. true when all were challenged and none closed. */
bool ft_flood_wait_challenged(ft_flood *f, int timeout_ms);
/* Wait until every connection is closed (or failed to connect). */
bool ft_flood_wait_closed(ft_flood *f, int timeout_ms);
/* Close what is left and join the thread. NULL ok. */
void ft_flood_stop(ft_flood *f);

/* Raise the soft RLIMIT_NOFILE to at least want (up to the hard limit);
 * returns the soft limit now in force. Children inherit it. */
unsigned long ft_flood_raise_nofile(unsigned long want);
/* Threads and open descriptors of a process (/proc/PID/task, /proc/PID/fd);
 * -1 when it cannot be read. */
int ft_proc_threads(pid_t pid);
int ft_proc_fds(pid_t pid);

#endif
