/* ferry — command-line entry point. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "demo_int.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry <command> [options]      ferry <command> --help: that command's options\n"
            "       ferry --version | -V           ferry --help | -h | help\n"
            "\n"
            "commands:\n"
            "  demo [--trainers N] [--rollouts N] [--dp N] [--generations N] [--bytes SIZE]\n"
            "       [--model PRESET] [--json]\n"
            "                                the main job: trainers publish weight generations, rollouts\n"
            "                                take them (TP shards and whole tensors), every byte checked\n"
            "  demo engine [--size SIZE] [--json]\n"
            "                                one-sided engine transfers between two processes\n"
            "  demo rl [--rollouts N] [--updaters N] [--steps N] [--batch N] [--max-policy-lag K]\n"
            "          [--stale drop|recompute] [--weights SIZE] [--pools R:U[xSTEPS],...] [--kill N]\n"
            "          [--json] ...\n"
            "                                rollout and update processes exchanging samples and policy\n"
            "                                versions; pools of changing sizes, members killed and restarted\n"
            "  demo --sparse [--density D] [--rollouts N] [--ep N] [--generations N] [--json] ...\n"
            "                                sparse COO delta generations applied by EP x TP rollouts\n"
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
            "  plan --model PRESET --src LAYOUT --dst LAYOUT [--runs N] [--dst-rank R] [--json]\n"
            "  plan --model PRESET --src LAYOUT --dst LAYOUT --nic BW [--nics-per-node N] [--json]\n"
            "  plan SRC.json DST.json [--runs N] [--dst-rank R] [--json]\n"
            "  plan --models [--json]\n"
            "                                the reshard plan between two layouts or manifests, the\n"
            "                                modelled update per NIC, the model presets\n"
            "                                (LAYOUT: fsdp:256, tp:8,dp:16, ep:32,tp:8, pp:4,tp:8)\n"
            "  master --dir DIR [--listen HOST:PORT] [--metrics HOST:PORT] [--config FILE] ...\n"
            "                                the store's metadata server\n"
            "  node --master HOST:PORT [--size SIZE] [--listen HOST:PORT] [--metrics HOST:PORT]\n"
            "       [--config FILE] ...\n"
            "                                this machine's segment of store memory\n"
            "  up [--dir DIR] [--size SIZE] [--listen HOST:PORT] [--detach] [--metrics]\n"
            "                                a master and a node on this machine; prints the export line\n"
            "  down [--dir DIR]              stop a cluster started with up --detach\n"
            "  status [--dir DIR | --master HOST:PORT] [--json]\n"
            "                                segments, nodes, clients, objects of the running master\n"
            "  token                         print a new random cluster token\n"
            "  version                       print the version (also ferry --version, ferry -V)\n"
            "  help                          this text\n"
            "\n"
            "Every command takes --opt value and --opt=value; -h/--help prints its options and\n"
            "their defaults; a usage error exits with status 2.\n"
            "\n"
            "environment: FERRY_TOKEN / FERRY_TOKEN_FILE (cluster token), FERRY_MASTER=HOST:PORT,\n"
            "             FERRY_HOME (state of up/down/status), FERRY_LOG=debug|info|warn|error|off,\n"
            "             FERRY_LOG_FORMAT=json, FERRY_TRANSPORT=shm|tcp (force a transport),\n"
            "             FERRY_LISTEN=HOST:PORT, FERRY_PROGRESS_SECONDS=N (progress lines off a terminal)\n");
}

static void usage_token(FILE *f)
{
    fprintf(f, "usage: ferry token\n\nPrint a new random cluster token (64 hex digits) on stdout.\n");
}

static void usage_version(FILE *f)
{
    fprintf(f, "usage: ferry version (or ferry --version, ferry -V)\n\nPrint ferry's version.\n");
}

/* token and version take no options (but --help). */
static int cmd_simple(const char *cmd, int argc, char **argv)
{
    bool token = !strcmp(cmd, "token");
    cli_getopt g;
    cli_getopt_init(&g, cmd, argc, argv, "");
    while (cli_getopt_next(&g))
        return cli_usage_exit(cli_getopt_unhandled(&g), token ? usage_token : usage_version);
    int pr = cli_getopt_end(&g, 0);
    if (pr != 0)
        return cli_usage_exit(pr, token ? usage_token : usage_version);
    if (token) {
        char t[65];
        ferry_token_generate(t);
        printf("%s\n", t);
    } else {
        printf("ferry %d.%d.%d\n", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH);
    }
    return 0;
}

/* A master or node serves many connections, and the listeners cap the
 * handshakes in flight at a quarter of the descriptor limit: take up
 * to 65536 of the hard limit (commonly 1024 soft, much more hard). */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max && rl.rlim_cur < 65536) {
        rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    if (argc < 2) {
        fprintf(stderr, "ferry: which command? (ferry --help lists them)\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "_demo_trainer"))
        return demo_trainer_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "_demo_rollout"))
        return demo_rollout_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "_demo_rl_rollout"))
        return demo_rl_rollout_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "_demo_rl_update"))
        return demo_rl_update_main(argc - 1, argv + 1);
    if (!strncmp(cmd, "_demo_sparse_", 13))
        return cmd_demo_sparse(argc - 1, argv + 1);
    if (!strcmp(cmd, "_target"))
        return cli_target_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "_exec_worker"))
        return cli_exec_worker_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "_bench_store_client"))
        return cli_bench_store_client_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench"))
        return cmd_bench(argc - 1, argv + 1, argv[0]);
    if (!strcmp(cmd, "plan"))
        return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "master"))
        return cmd_master(argc - 1, argv + 1);
    if (!strcmp(cmd, "node"))
        return cmd_node(argc - 1, argv + 1);
    if (!strcmp(cmd, "up"))
        return cmd_up(argc - 1, argv + 1);
    if (!strcmp(cmd, "down"))
        return cmd_down(argc - 1, argv + 1);
    if (!strcmp(cmd, "status"))
        return cmd_status(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo"))
        return cmd_demo(argc - 1, argv + 1, argv[0]);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V"))
        return cmd_simple("version", 1, (char *[]){ "version", NULL });
    if (!strcmp(cmd, "token") || !strcmp(cmd, "version"))
        return cmd_simple(cmd, argc - 1, argv + 1);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ferry: unknown %s '%s' (ferry --help lists the commands)\n",
            cmd[0] == '-' ? "option" : "command", cmd);
    return 2;
}
