/* A command's options, declared once (docs/operations.md, "Command line"):
 * one table gives getopt_long its options, stores each value where it
 * goes, checked, and prints the command's --help. The commands that run
 * for long (master, node) also take their options from a JSON file
 * (--config FILE) whose keys are the same names; the command line
 * overrides the file, and an unknown key is refused by name.
 *
 *   typedef struct up_opts { char dir[4096]; uint64_t size; bool detach; } up_opts;
 *   static const cli_opt up_table[] = {
 *       CLI_STR(up_opts, dir, "dir", "DIR", "state directory (default ~/.ferry)"),
 *       CLI_SIZE(up_opts, size, "size", "SIZE", 1u << 20, UINT64_MAX, "segment (default 1G)"),
 *       CLI_FLAG(up_opts, detach, "detach", "return at once (default: stay)"),
 *   };
 *   static const cli_cmd up_cmd = { .name = "up", .opts = up_table, .nopts = 3, .about = "..." };
 *   up_opts o = { .size = 1ull << 30 };          // the defaults, then
 *   int pr = cli_parse(&up_cmd, argc, argv, &o, NULL);
 *   if (pr != 0) return cli_cmd_usage_exit(pr, &up_cmd);
 */
#ifndef FERRY_CLI_OPTS_H
#define FERRY_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum cli_opt_kind {
    CLI_OPT_FLAG,   /* no value: a bool set to true; in a file true or false */
    CLI_OPT_STR,    /* a string copied into a char array, refused when it does not fit */
    CLI_OPT_ARG,    /* a string kept as a const char * (argv's, or the file's, kept) */
    CLI_OPT_UINT,   /* a whole number in [min, max] into a uint64_t or a uint32_t */
    CLI_OPT_SIZE,   /* a size ("64M") in [min, max] into a uint64_t */
    CLI_OPT_DOUBLE, /* a decimal number in [dmin, dmax] into a double */
    CLI_OPT_CHOICE, /* one of the words of arg ("drop|recompute"), kept as a const char * */
    CLI_OPT_EACH,   /* every occurrence, in order, handed to each(): the command stores it
                     * (a repeatable option appends; repeat marks it "..." in the help) */
};

/* A CLI_OPT_EACH option's value: 0, or -1 after a line on stderr (the
 * cli_opt_* checks in cli.h say it in the table's words). flag: "--block". */
typedef int (*cli_opt_each)(void *opts, const char *flag, const char *val);

typedef struct cli_opt {
    const char *name;          /* "heartbeat-timeout": --heartbeat-timeout, and the file's key */
    enum cli_opt_kind kind;
    const char *arg;           /* the value in the help ("MS"); NULL for a flag */
    size_t off, size;          /* where the value goes in the options struct, and its size */
    uint64_t min, max;         /* CLI_OPT_UINT and CLI_OPT_SIZE */
    bool required;
    const char *help;          /* its lines in --help ('\n' breaks one), its default said */
    double dmin, dmax;         /* CLI_OPT_DOUBLE */
    cli_opt_each each;         /* CLI_OPT_EACH */
    bool repeat;               /* CLI_OPT_EACH: given more than once, each one counts */
} cli_opt;

#define CLI_FIELD(T, f) offsetof(T, f), sizeof(((T *)0)->f)
#define CLI_FLAG(T, f, name, help) { name, CLI_OPT_FLAG, NULL, CLI_FIELD(T, f), 0, 0, false, help, 0, 0, NULL, false }
#define CLI_STR(T, f, name, arg, help) { name, CLI_OPT_STR, arg, CLI_FIELD(T, f), 0, 0, false, help, 0, 0, NULL, false }
#define CLI_ARG(T, f, name, arg, help) { name, CLI_OPT_ARG, arg, CLI_FIELD(T, f), 0, 0, false, help, 0, 0, NULL, false }
#define CLI_UINT(T, f, name, arg, lo, hi, help) \
    { name, CLI_OPT_UINT, arg, CLI_FIELD(T, f), lo, hi, false, help, 0, 0, NULL, false }
#define CLI_SIZE(T, f, name, arg, lo, hi, help) \
    { name, CLI_OPT_SIZE, arg, CLI_FIELD(T, f), lo, hi, false, help, 0, 0, NULL, false }
#define CLI_DOUBLE(T, f, name, arg, lo, hi, help) \
    { name, CLI_OPT_DOUBLE, arg, CLI_FIELD(T, f), 0, 0, false, help, lo, hi, NULL, false }
/* arg lists the words: "drop|recompute"; the field is a const char *. */
#define CLI_CHOICE(T, f, name, arg, help) \
    { name, CLI_OPT_CHOICE, arg, CLI_FIELD(T, f), 0, 0, false, help, 0, 0, NULL, false }
/* An option the command stores itself through fn (a seed that also marks
 * itself given, a list parsed as a whole); CLI_LIST: repeatable, each
 * occurrence handed over in order ("--block 64K --block 1M"). */
#define CLI_EACH(name, arg, fn, help) \
    { name, CLI_OPT_EACH, arg, 0, 0, 0, 0, false, help, 0, 0, fn, false }
#define CLI_LIST(name, arg, fn, help) \
    { name, CLI_OPT_EACH, arg, 0, 0, 0, 0, false, help, 0, 0, fn, true }
/* A string option the command cannot run without (shown without brackets). */
#define CLI_STR_REQUIRED(T, f, name, arg, help) { name, CLI_OPT_STR, arg, CLI_FIELD(T, f), 0, 0, true, help, 0, 0, NULL, false }

/* A command: its options and the text around them in its --help. */
typedef struct cli_cmd {
    const char *name;          /* "master", "plan": messages, usage */
    const char *forms;         /* the usage lines after "usage: ferry NAME " ('\n' between
                                * forms); NULL: one form made from the table */
    const char *about;         /* the paragraphs between the usage and the options */
    const cli_opt *opts;
    size_t nopts;
    const char *config_key;    /* non-NULL: --config FILE is taken (its keys: the option names,
                                * e.g. "\"dir\", \"heartbeat-timeout\""), this text says which */
    int max_pos;               /* arguments that are not options, at most */
    const char *footer;        /* after the options, or NULL */
} cli_cmd;

/* Parse argv (argv[0]: the command word) into opts, the struct the table's
 * offsets point into, which holds the defaults: the --config file's keys
 * first, then the command line's options. 0, CLI_HELP (-h/--help anywhere:
 * nothing checked, nothing stored) or -1 after one line on stderr naming
 * the option, the value or the key. pos (may be NULL when max_pos is 0)
 * gets the arguments that are not options, *npos their count. */
int cli_parse(const cli_cmd *c, int argc, char **argv, void *opts, int *npos, char ***pos);
/* The command's --help: usage, about, every option with its help. */
void cli_cmd_usage(FILE *f, const cli_cmd *c);
/* pr from cli_parse: CLI_HELP prints the usage to stdout and gives 0, a
 * negative pr prints it to stderr and gives 2. */
int cli_cmd_usage_exit(int pr, const cli_cmd *c);

#endif
