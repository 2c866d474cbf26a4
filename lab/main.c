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
            "usage: ferry-lab demo|bench|cluster ... [options]   (WHAT --help: its forms and options)\n"
            "       ferry-lab --help | -h | help\n"
            "\n"
            "The demos and benchmarks of ferry; the operator's commands are `ferry`\n"
            "(ferry --help). Each starts its own cluster with the `ferry` beside this\n"
            "program ($FERRY_BIN overrides).\n"
            "\n"
            "demos:\n"
            "  demo                          the main job (make demo): trainers publish weight\n"
            "                                generations, rollouts take them (TP shards and whole\n"
            "                                tensors), every byte checked\n"
            "  demo engine                   one-sided engine transfers between two processes\n"
            "  demo rl                       rollout and update processes exchanging samples and\n"
            "                                policy versions; pools of changing sizes, members\n"
            "                                killed and restarted\n"
            "  demo --sparse                 sparse COO delta generations applied by EP x TP\n"
            "                                rollouts\n"
            "\n"
            "benchmarks:\n"
            "  bench weights                 weight-update time (single-pull, naive, compat)\n"
            "                                against the memcpy floor\n"
            "  bench weights --convert-only  dtype conversion (f32 -> bf16/f16) and FP8 quantization against memcpy\n"
            "  bench weights --scale         the group plan of every rollout worker at scale (no\n"
            "                                cluster)\n"
            "  bench weights --torch         a torch model's FSDP -> TP2xDP2 update against\n"
            "                                torch.save and gloo (Python, /usr/bin/python3 or\n"
            "                                $FERRY_PYTHON)\n"
            "  bench engine                  engine throughput against a baseline measured in the\n"
            "                                same run (--transport ucx: against ucx_perftest)\n"
            "  bench store                   store metadata ops/s, put/get throughput against the\n"
            "                                engine\n"
            "  bench plan                    reshard planning time (cold, cached) and peak memory\n"
            "  bench exec                    reshard 8 FSDP -> 8 TP4xDP2 processes (sink, reader)\n"
            "                                vs memcpy\n"
            "  bench sparse                  the sparse planner against a scan of every nonzero\n"
            "  bench cluster                 a weight update across the lab's hosts (root): ferry\n"
            "                                direct and compat, naive, p2p, bcast over the same\n"
            "                                shaped links, against the model (docs/lab.md)\n"
            "\n"
            "the lab (root; docs/lab.md):\n"
            "  cluster up                    H hosts (network namespaces on a bridge, links shaped\n"
            "                                both ways), a master and a node per host, --run\n"
            "                                commands inside them; all removed on exit or signal\n"
            "  cluster check                 the hosts and their links only: each link's achieved\n"
            "                                rate against the configured one, the CPU use\n"
            "  cluster clean                 remove what a SIGKILLed lab left\n"
            "\n"
            "worker processes (the demos and benchmarks start these themselves):\n");
    for (size_t i = 0; i < sizeof workers / sizeof workers[0]; i++)
        fprintf(f, "  worker %-22s %s\n", workers[i].name, workers[i].help);
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
    { "demo", cmd_demo }, { "bench", cmd_bench }, { "cluster", cmd_cluster }, { "worker", run_worker }, { "help", cmd_help },
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
