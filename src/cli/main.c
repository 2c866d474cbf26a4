/* ferry: the operator's command line (master, node, up, down, status,
 * plan, token, version). Each command's options are one table
 * (cli_opts.h); the demos and benchmarks are ferry-lab (lab/). */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "cli_opts.h"

static void usage(FILE *f);

static const cli_cmd token_cmd = {
    .name = "token", .forms = "", .about = "Print a new random cluster token (64 hex digits) on stdout.",
};
static const cli_cmd version_cmd = {
    .name = "version", .forms = "(or ferry --version, ferry -V)", .about = "Print ferry's version.",
};

/* token and version take no options (but --help). */
static int cmd_token(int argc, char **argv)
{
    int pr = cli_parse(&token_cmd, argc, argv, NULL, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &token_cmd);
    char t[65];
    ferry_token_generate(t);
    printf("%s\n", t);
    return 0;
}

static int cmd_version(int argc, char **argv)
{
    int pr = cli_parse(&version_cmd, argc, argv, NULL, NULL, NULL);
    if (pr != 0)
        return cli_cmd_usage_exit(pr, &version_cmd);
    printf("ferry %d.%d.%d\n", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH);
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

/* The operator's commands: the one place a command's name, its function
 * and its lines in `ferry --help` are given. Their options are not: each
 * command's own --help gives its forms and options from its option table. */
typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);   /* argv[0]: the command's name */
    const char *help;                    /* what it does; '\n' breaks the line */
} cli_command;

static int cmd_help(int argc, char **argv)
{
    (void)argc, (void)argv;
    usage(stdout);
    return 0;
}

static const cli_command commands[] = {
    { "master", cmd_master, "the store's metadata server" },
    { "node", cmd_node, "this machine's segment of store memory" },
    { "up", cmd_up, "a master and a node on this machine; prints the export line" },
    { "down", cmd_down, "stop a cluster started with up --detach" },
    { "status", cmd_status, "segments, nodes, clients, objects of the running master" },
    { "plan", cmd_plan,
      "the reshard plan between two layouts or manifests, the modelled\n"
      "update per NIC, the model presets\n"
      "(LAYOUT: fsdp:256, tp:8,dp:16, ep:32,tp:8, pp:4,tp:8)" },
    { "token", cmd_token, "print a new random cluster token" },
    { "version", cmd_version, "print the version (also ferry --version, ferry -V)" },
    { "help", cmd_help, "this text" },
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

/* Text with '\n' line breaks, each line after the first indented by ind. */
static void print_lines(FILE *f, const char *s, int ind)
{
    for (bool first = true; *s; first = false) {
        size_t n = strcspn(s, "\n");
        fprintf(f, "%*s%.*s\n", first ? 0 : ind, "", (int)n, s);
        s += n + (s[n] == '\n');
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry <command> [options]      ferry <command> --help: that command's options\n"
               "       ferry --version | -V           ferry --help | -h | help\n"
               "\n"
               "commands:\n");
    enum { COL = 12 };
    for (size_t i = 0; i < NCOMMANDS; i++) {
        fprintf(f, "  %-*s", COL - 2, commands[i].name);
        print_lines(f, commands[i].help, COL);
    }
    fprintf(f, "\n"
               "Every command takes --opt value and --opt=value; -h/--help prints its options and\n"
               "their defaults; a usage error exits with status 2. The demos and benchmarks are\n"
               "ferry-lab, built beside ferry and not installed (ferry-lab --help).\n"
               "\n"
               "environment: FERRY_TOKEN / FERRY_TOKEN_FILE (cluster token), FERRY_MASTER=HOST:PORT,\n"
               "             FERRY_HOME (state of up/down/status), FERRY_LOG=debug|info|warn|error|off,\n"
               "             FERRY_LOG_FORMAT=json, FERRY_TRANSPORT=shm|tcp (force a transport),\n"
               "             FERRY_LISTEN=HOST:PORT, FERRY_PROGRESS_SECONDS=N (progress lines off a terminal)\n");
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
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(cmd, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V"))
        return cmd_version(1, (char *[]){ "version", NULL });
    if (cli_is_help(cmd))
        return cmd_help(argc - 1, argv + 1);
    fprintf(stderr, "ferry: unknown %s '%s' (ferry --help lists the commands)\n",
            cmd[0] == '-' ? "option" : "command", cmd);
    return 2;
}
