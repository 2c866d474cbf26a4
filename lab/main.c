/* ferry-lab: the demos and the benchmarks, and the worker processes they
 * start (lab.h). Built beside `ferry` and never installed: `make demo` and
 * `make bench` run it, and so do the tests. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lab.h"
#include "demo.h"

/* A worker's entry point: argv[0] is its name. */
typedef struct lab_worker {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} lab_worker;

static const lab_worker workers[] = {
    { "trainer", demo_trainer_main, "a trainer of `demo` and `bench weights`" },
    { "rollout", demo_rollout_main, "a rollout of `demo` and `bench weights`" },
    { "rl-rollout", demo_rl_rollout_main, "a rollout process of `demo rl`" },
    { "rl-update", demo_rl_update_main, "an update process of `demo rl`" },
    { "sparse-trainer", cmd_demo_sparse, "a trainer of `demo --sparse`" },
    { "sparse-rollout", cmd_demo_sparse, "a rollout of `demo --sparse`" },
    { "target", cli_target_main, "the passive engine of `demo engine` and `bench engine|store`" },
    { "exec", cli_exec_worker_main, "a source or target rank of `bench exec`" },
    { "store-client", cli_bench_store_client_main, "a metadata client of `bench store`" },
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry-lab demo|bench ... [options]   (WHAT --help: its options)\n"
            "       ferry-lab --help | -h | help\n"
            "\n"
            "The demos and benchmarks of ferry; the operator's commands are `ferry`\n"
            "(ferry --help). Each starts its own cluster with the `ferry` beside this\n"
            "program ($FERRY_BIN overrides).\n"
            "\n"
            "demos:\n"
            "  demo [--trainers N] [--rollouts N] [--dp N] [--generations N] [--bytes SIZE]\n"
            "       [--model PRESET] [--json]\n"
            "                                the main job (make demo): trainers publish weight\n"
            "                                generations, rollouts take them (TP shards and whole\n"
            "                                tensors), every byte checked\n"
            "  demo engine [--size SIZE] [--json]\n"
            "                                one-sided engine transfers between two processes\n"
            "  demo rl [--rollouts N] [--updaters N] [--steps N] [--batch N] [--max-policy-lag K]\n"
            "          [--stale drop|recompute] [--weights SIZE] [--pools R:U[xSTEPS],...] [--kill N]\n"
            "          [--json] ...\n"
            "                                rollout and update processes exchanging samples and policy\n"
            "                                versions; pools of changing sizes, members killed and restarted\n"
            "  demo --sparse [--density D] [--rollouts N] [--ep N] [--generations N] [--json] ...\n"
            "                                sparse COO delta generations applied by EP x TP rollouts\n"
            "\n"
            "benchmarks:\n"
            "  bench weights [--rollouts N] [--dp N] [--bytes SIZE] [--model PRESET] [--reps N] [--json]\n"
            "                                weight-update time (single-pull, naive, compat) against\n"
            "                                the memcpy floor\n"
            "  bench weights --convert-only [--json]\n"
            "                                dtype conversion (f32 -> bf16/f16) against memcpy\n"
            "  bench weights --scale [--model PRESET] [--src LAYOUT] [--dst LAYOUT] [--workers N] [--json]\n"
            "                                the group plan of every rollout worker at scale (no cluster)\n"
            "  bench weights --torch [--rounds N] [--json]\n"
            "                                a torch model's FSDP -> TP2xDP2 update against torch.save\n"
            "                                and a gloo broadcast (Python, /usr/bin/python3 or $FERRY_PYTHON)\n"
            "  bench engine [--transport shm|tcp] [--block SIZE] [--total SIZE] [--streams N]\n"
            "               [--threads N] [--reps N] [--rows N [--row SIZE] [--stride SIZE]] [--json]\n"
            "                                engine throughput against a baseline measured in the same run\n"
            "  bench store [--clients N] [--seconds N] [--size SIZE] [--total SIZE] [--object SIZE]\n"
            "              [--batch N] [--reps N] [--no-sync] [--json]\n"
            "                                store metadata ops/s, put/get throughput against the engine\n"
            "  bench plan --model PRESET --src LAYOUT --dst LAYOUT [--baseline-tensors N] [--walk-all] [--json]\n"
            "                                reshard planning time (cold, cached) and peak memory\n"
            "  bench exec [--model PRESET] [--bytes SIZE] [--src LAYOUT] [--dst LAYOUT] [--reps N] [--json]\n"
            "                                reshard 8 FSDP -> 8 TP4xDP2 processes (sink, reader) vs memcpy\n"
            "  bench sparse [--tp N] [--tile RxC] [--reps N] [--no-store] [--json]\n"
            "                                the sparse planner against a scan of every nonzero\n"
            "\n"
            "worker processes (the demos and benchmarks start these themselves):\n");
    for (size_t i = 0; i < sizeof workers / sizeof workers[0]; i++)
        fprintf(f, "  worker %-23s %s\n", workers[i].name, workers[i].help);
    fprintf(f, "\n"
               "environment: FERRY_BIN (the ferry that starts the clusters), FERRY_PYTHON (bench\n"
               "             weights --torch), FERRY_LOG, FERRY_TRANSPORT, FERRY_PROGRESS_SECONDS\n"
               "             (ferry --help says more)\n");
}

const char *lab_ferry_bin(void)
{
    static char path[PATH_MAX];   /* this process's answer, the same every time */
    const char *env = getenv("FERRY_BIN");
    if (env && *env)
        return env;
    if (path[0])
        return path;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash && (size_t)(slash - self) + 7 < sizeof path) {
            snprintf(path, sizeof path, "%.*s/ferry", (int)(slash - self), self);
            if (access(path, X_OK) == 0)
                return path;
        }
    }
    snprintf(path, sizeof path, "ferry");   /* on PATH (execvp) */
    return path;
}

void lab_exec_self(const char *const *args)
{
    execv("/proc/self/exe", (char *const *)args);
}

static int run_worker(int argc, char **argv, const char *self)
{
    (void)self;
    if (argc >= 2)
        for (size_t i = 0; i < sizeof workers / sizeof workers[0]; i++)
            if (!strcmp(argv[1], workers[i].name))
                return workers[i].main(argc - 1, argv + 1);
    if (argc >= 2 && cli_is_help(argv[1])) {
        usage(stdout);
        return 0;
    }
    if (argc < 2)
        fprintf(stderr, "ferry-lab worker: which worker? (ferry-lab --help lists them)\n");
    else
        fprintf(stderr, "ferry-lab worker: unknown worker '%s' (ferry-lab --help lists them)\n", argv[1]);
    return 2;
}

static int cmd_help(int argc, char **argv, const char *self)
{
    (void)argc, (void)argv, (void)self;
    usage(stdout);
    return 0;
}

/* ferry-lab's commands: argv[0] is the command's name, self this program
 * as started (where /proc/self/exe is missing). */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv, const char *self);
} commands[] = {
    { "demo", cmd_demo }, { "bench", cmd_bench }, { "worker", run_worker }, { "help", cmd_help },
};

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        fprintf(stderr, "ferry-lab: which command? (ferry-lab --help lists them)\n");
        return 2;
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name))
            return commands[i].run(argc - 1, argv + 1, argv[0]);
    if (cli_is_help(cmd))
        return cmd_help(argc - 1, argv + 1, argv[0]);
    fprintf(stderr, "ferry-lab: unknown %s '%s' (ferry-lab --help lists the commands)\n",
            cmd[0] == '-' ? "option" : "command", cmd);
    return 2;
}
