/* Every command's options through getopt_long (cli.h, "Option loops"): one
 * table per command, so `--opt value`, `--opt=value`, -h/--help and the
 * messages for a bad option are the same everywhere (docs/operations.md,
 * "Command-line convention"). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* "rollouts=,json" into g->lo: a name ending in '=' takes a value. */
static int build_table(cli_getopt *g, const char *spec)
{
    size_t n = strlen(spec);
    if (n >= sizeof g->names)
        return -1;
    memcpy(g->names, spec, n + 1);
    size_t k = 0;
    for (char *p = g->names; *p && k < CLI_GETOPT_MAX;) {
        char *end = p + strcspn(p, ",");
        bool more = *end == ',';
        *end = 0;
        size_t len = strlen(p);
        bool val = len > 0 && p[len - 1] == '=';
        if (val)
            p[len - 1] = 0;
        g->lo[k] = (struct option){ p, val ? required_argument : no_argument, NULL, 256 + (int)k };
        k++;
        if (!more)
            break;
        p = end + 1;
    }
    g->lo[k++] = (struct option){ "help", no_argument, NULL, 'h' };
    g->lo[k] = (struct option){ NULL, 0, NULL, 0 };
    return 0;
}

void cli_getopt_init(cli_getopt *g, const char *cmd, int argc, char **argv, const char *spec)
{
    memset(g, 0, sizeof *g);
    g->cmd = cmd;
    g->argc = argc;
    g->argv = argv;
    if (build_table(g, spec) < 0) {   /* a table bug, not the user's */
        fprintf(stderr, "%s %s: option table too long\n", cli_prog(), cmd);
        g->failed = true;
    }
    /* Help wins wherever it is (before a "--"), so that nothing is checked
     * or started first. */
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (cli_is_help(argv[i]))
            g->help = true;
    opterr = 0;
    optind = 0;   /* glibc: start over, permutation state included */
}

/* "--name" of an argument as given ("--name=value" -> "--name"). */
static void opt_text(const char *arg, char *out, size_t cap)
{
    size_t k = strcspn(arg, "=");
    snprintf(out, cap, "%.*s", (int)(k < cap ? k : cap - 1), arg);
}

/* The one line on stderr for what getopt_long refused. */
static void refuse(cli_getopt *g, int c)
{
    const char *arg = g->argv[optind > 0 && optind <= g->argc ? optind - 1 : 0];
    char text[80];
    if (c == '?' && optopt > 0 && optopt < 256 && optopt != 'h') {
        snprintf(text, sizeof text, "-%c", optopt);   /* a short option */
        fprintf(stderr, "%s %s: unknown option '%s'\n", cli_prog(), g->cmd, text);
        return;
    }
    opt_text(arg, text, sizeof text);
    if (c == ':')
        fprintf(stderr, "%s %s: %s needs a value\n", cli_prog(), g->cmd, text);
    else if (optopt != 0)   /* a flag given a value: --json=1 */
        fprintf(stderr, "%s %s: %s takes no value, not '%s'\n", cli_prog(), g->cmd, text,
                strchr(arg, '=') ? strchr(arg, '=') + 1 : "");
    else
        fprintf(stderr, "%s %s: unknown option '%s'\n", cli_prog(), g->cmd, text);
}

bool cli_getopt_next(cli_getopt *g)
{
    if (g->help || g->failed || g->done)
        return false;
    int li = -1;
    int c = getopt_long(g->argc, g->argv, ":h", g->lo, &li);
    if (c == -1) {
        g->done = true;
        g->npos = g->argc - optind;
        g->pos = g->argv + optind;
        return false;
    }
    if (c == 'h') {   /* -h after a "--" that a value took ("--name --"): help all the same */
        g->help = true;
        return false;
    }
    if (c == '?' || c == ':') {
        refuse(g, c);
        g->failed = true;
        return false;
    }
    const struct option *o = &g->lo[c - 256];
    /* getopt_long takes any unique prefix (--roll for --rollouts); ferry
     * takes whole names only, so that a new option never changes what an
     * old command line means. */
    const char *given = g->argv[optind - 1];
    if (o->has_arg && optarg == given && optind >= 2)
        given = g->argv[optind - 2];   /* --opt value: the value was the last one */
    char text[80];
    opt_text(given, text, sizeof text);
    if (strcmp(text + 2, o->name) != 0) {
        fprintf(stderr, "%s %s: unknown option '%s' (did you mean --%s?)\n", cli_prog(), g->cmd, text,
                o->name);
        g->failed = true;
        return false;
    }
    snprintf(g->opt, sizeof g->opt, "--%s", o->name);
    g->val = o->has_arg ? optarg : NULL;
    return true;
}

bool cli_getopt_is(const cli_getopt *g, const char *opt)
{
    return !strcmp(g->opt, opt);
}

int cli_getopt_end(cli_getopt *g, int max_pos)
{
    if (g->help)
        return CLI_HELP;
    if (g->failed)
        return -1;
    if (g->npos > max_pos) {
        const char *a = g->pos[max_pos];
        fprintf(stderr, "%s %s: unexpected argument '%s'%s\n", cli_prog(), g->cmd, a,
                max_pos == 0 ? " (this command takes options only)" : "");
        return -1;
    }
    return 0;
}

int cli_getopt_unhandled(cli_getopt *g)
{
    fprintf(stderr, "%s %s: option %s is not handled\n", cli_prog(), g->cmd, g->opt);   /* a table bug */
    g->failed = true;
    return -1;
}
