/* `ferry-lab demo rl`'s own pieces: options and phases (demo_rl_opts.c), the
 * child processes (demo_rl.c), the parent that scales pools and kills
 * members (demo_rl_run.c) and the accounting over the ledgers and the
 * claim log (demo_rl_tally.c). */
#ifndef FERRY_LAB_DEMO_RL_H
#define FERRY_LAB_DEMO_RL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/ferry.h"

#define RL_PHASES_MAX 16
#define RL_POOL_MAX 64

/* One phase: pool sizes held for `steps` update steps. */
typedef struct rl_phase { unsigned rollouts, updaters, steps; } rl_phase;

typedef struct rl_opts {
    rl_phase phase[RL_PHASES_MAX];
    unsigned nphase, steps;          /* steps: all phases together */
    unsigned max_rollouts, max_updaters;
    unsigned batch, tokens, lag, kills;
    double rate;                     /* samples/s per rollout (0: as fast as it can) */
    double train_ms;
    uint64_t weight_bytes, bound, lease_ms, seed;
    bool recompute, json, seeded;
} rl_opts;

void demo_rl_usage(FILE *f);
/* 0, CLI_HELP or -1 (a line on stderr said what is wrong). */
int demo_rl_parse(int argc, char **argv, rl_opts *o);

/* The policy weights of version v: RL_NT f32 tensors, value(i) = v * 1000 + i % 997. */
#define RL_NT 4

/* One pop-read-train-ack round of an update member (or of the parent's
 * final drain): pops until `want` samples are admitted (drain: until a pop
 * finds the queue empty), "trains" for train_ms, acks. Each admitted
 * delivery is written to the ledger before the ack ("L uid id token
 * latency_ms session") and each ack that held after it ("T uid id
 * token"), one line per write, so a SIGKILL loses no line before it.
 * Returns the samples acked, or -1 (err says why); *popped (may be NULL):
 * records the pops delivered, stale ones included. */
int64_t demo_rl_train(ferry_sample_queue *q, unsigned want, bool drain, double train_ms,
                      uint64_t ntok, FILE *ledger, uint64_t *popped, ferry_error *err);
ferry_store *demo_rl_open_store(const char *addr);
/* A ledger file dir/name, line-buffered. */
FILE *demo_rl_ledger(const char *dir, const char *name);

/* What the ledgers and the claim log say (demo_rl_tally). */
typedef struct rl_tally {
    uint64_t produced, trained, stale, sent_back, dropped, recompute_lost, recomputed, lost;
    uint64_t duplicated;
    uint64_t acks_cut_by_kill;       /* committed by a member killed before it wrote "T" */
    uint64_t leased_by_killed;       /* deliveries a killed member held uncommitted */
    uint64_t redelivered_trained;    /* of their samples, trained by a later delivery */
    uint64_t landed_unrecorded;      /* pushed by a rollout killed before it wrote "P" */
    uint64_t dangling_pushes;        /* killed rollouts' pushes in flight */
    uint64_t orphaned_payloads;      /* payloads stored by a rollout killed before its record */
    uint64_t inconsistent;           /* anything the rules above do not explain */
    uint64_t restarted_produced, restarted_trained, trained_by_drain;
    uint64_t weight_errors, claim_events;
    double latency_ms_p50, latency_ms_p99, load_s_p50, publish_s_p50;
} rl_tally;

/* Read every ledger in dir and the claim log (opened on queue before the
 * first sample, up to its mark), list the payload objects left under the
 * queue, and account. 0, or -1 with why in err. */
int demo_rl_tally(ferry_store *s, const char *queue, const char *dir, ferry_sample_claims *claims,
                  bool recompute, rl_tally *t, char *err, size_t cap);

#endif
