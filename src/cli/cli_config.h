/* The options of `ferry master` and `ferry node`, from the command line
 * (getopt_long: --opt value, --opt=value, -h/--help) and from a JSON file
 * (--config FILE) whose keys are the same long names: every option has a
 * key, flags override the file, an unknown key is refused by name
 * (docs/operations.md, "Config files"). */
#ifndef FERRY_CLI_CONFIG_H
#define FERRY_CLI_CONFIG_H

#include <stddef.h>
#include <stdio.h>

enum cli_opt_kind {
    CLI_OPT_FLAG,   /* no value; in a file: true (false: the default) */
    CLI_OPT_STR,    /* a string */
    CLI_OPT_NUM,    /* a whole number or a size; in a file: a number, or a string as on the
                     * command line ("64M") */
};
typedef struct cli_optdef { const char *name; enum cli_opt_kind kind; } cli_optdef;

/* Apply one option: name from the table, value NULL for a flag. Strings are
 * valid only during the call. 0, or -1 after a line on stderr saying what
 * is wrong (exit 2). */
typedef int (*cli_apply_fn)(void *ctx, const char *name, const char *value);

#define CLI_ARGS_MAX 64
typedef struct cli_args {
    const char *config;                    /* --config FILE, or NULL */
    size_t n;
    struct { const char *name, *value; } v[CLI_ARGS_MAX];  /* in command-line order */
} cli_args;

/* Parse argv (argv[0] is the command) against defs, applying nothing: 0,
 * CLI_HELP (-h/--help anywhere) or -1 after one line on stderr that names
 * the bad option ("ferry master: unknown option '--bogus'"). */
int cli_args_parse(const char *cmd, int argc, char **argv, const cli_optdef *defs, size_t ndefs,
                   cli_args *out);
/* Everything in order: the --config file's keys, then the command line's
 * options (so flags override the file). 0 or -1 (a line on stderr). */
int cli_args_apply(const char *cmd, const cli_args *a, const cli_optdef *defs, size_t ndefs,
                   cli_apply_fn fn, void *ctx);
/* The file alone (tests and cli_args_apply). */
int cli_config_apply(const char *cmd, const char *path, const cli_optdef *defs, size_t ndefs,
                     cli_apply_fn fn, void *ctx);

#endif
