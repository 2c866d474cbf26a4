/* Options of the long-running commands from argv and a JSON file
 * (cli_config.h). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_config.h"

static const cli_optdef *find(const cli_optdef *defs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(defs[i].name, name))
            return &defs[i];
    return NULL;
}

/* "--name" of an argument as given ("--name=value" -> "--name"). */
static void opt_text(const char *arg, char *out, size_t cap)
{
    size_t k = strcspn(arg, "=");
    snprintf(out, cap, "%.*s", (int)(k < cap ? k : cap - 1), arg);
}

int cli_args_parse(const char *cmd, int argc, char **argv, const cli_optdef *defs, size_t ndefs,
                   cli_args *out)
{
    memset(out, 0, sizeof *out);
    struct option lo[CLI_ARGS_MAX + 3];
    size_t k = 0;
    for (; k < ndefs && k < CLI_ARGS_MAX; k++)
        lo[k] = (struct option){ defs[k].name,
                                 defs[k].kind == CLI_OPT_FLAG ? no_argument : required_argument,
                                 NULL, 256 + (int)k };
    lo[k++] = (struct option){ "config", required_argument, NULL, 'c' };
    lo[k++] = (struct option){ "help", no_argument, NULL, 'h' };
    lo[k] = (struct option){ NULL, 0, NULL, 0 };
    /* Help wins wherever it is, before anything is checked or started. */
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i]))
            return CLI_HELP;
    opterr = 0;
    optind = 1;
    char bad[128];
    for (;;) {
        int prev = optind;
        int c = getopt_long(argc, argv, "+:h", lo, NULL);
        if (c == -1)
            break;
        const char *arg = argv[prev < argc ? prev : argc - 1];
        opt_text(arg, bad, sizeof bad);
        if (c == ':') {
            fprintf(stderr, "ferry %s: %s needs a value\n", cmd, bad);
            return -1;
        }
        if (c == '?') {
            if (optopt >= 256 || optopt == 'h')
                fprintf(stderr, "ferry %s: %s takes no value, not '%s'\n", cmd, bad,
                        strchr(arg, '=') ? strchr(arg, '=') + 1 : "");
            else
                fprintf(stderr, "ferry %s: unknown option '%s'\n", cmd, bad);
            return -1;
        }
        /* whole names only, as every command (cli_getopt.c): --hear is no
         * --heartbeat-timeout */
        const char *given = argv[optind - 1];
        if (optarg && optarg == given && optind >= 2)
            given = argv[optind - 2];
        const char *name = c == 'c' ? "config" : c == 'h' ? "help" : defs[c - 256].name;
        opt_text(given, bad, sizeof bad);
        if (strncmp(bad, "--", 2) == 0 && strcmp(bad + 2, name) != 0) {
            fprintf(stderr, "ferry %s: unknown option '%s' (did you mean --%s?)\n", cmd, bad, name);
            return -1;
        }
        if (c == 'c') {
            out->config = optarg;
            continue;
        }
        if (out->n == CLI_ARGS_MAX) {
            fprintf(stderr, "ferry %s: more than %d options\n", cmd, CLI_ARGS_MAX);
            return -1;
        }
        out->v[out->n].name = defs[c - 256].name;
        out->v[out->n].value = defs[c - 256].kind == CLI_OPT_FLAG ? NULL : optarg;
        out->n++;
    }
    if (optind < argc) {
        fprintf(stderr, "ferry %s: unexpected argument '%s' (options start with --)\n", cmd,
                argv[optind]);
        return -1;
    }
    return 0;
}

/* The value of one key as the option's text; NULL after a line on stderr. */
static const char *key_value(const char *cmd, const char *path, const char *key,
                             const cli_optdef *d, json_t *v, char *buf, size_t cap, bool *skip)
{
    *skip = false;
    if (d->kind == CLI_OPT_FLAG) {
        if (json_is_boolean(v)) {
            *skip = json_is_false(v);
            return "";
        }
        fprintf(stderr, "ferry %s: %s: key '%s' must be true or false\n", cmd, path, key);
        return NULL;
    }
    if (json_is_string(v))
        return json_string_value(v);
    if (d->kind == CLI_OPT_NUM && json_is_integer(v)) {
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
        return buf;
    }
    fprintf(stderr, "ferry %s: %s: key '%s' must be %s\n", cmd, path, key,
            d->kind == CLI_OPT_NUM ? "a whole number (or a string such as \"64M\")" : "a string");
    return NULL;
}

int cli_config_apply(const char *cmd, const char *path, const cli_optdef *defs, size_t ndefs,
                     cli_apply_fn fn, void *ctx)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL) {
        if (jerr.line < 0)   /* jansson could not read the file at all */
            fprintf(stderr, "ferry %s: cannot read the config %s: %s\n", cmd, path, jerr.text);
        else
            fprintf(stderr, "ferry %s: the config %s is not JSON: line %d, column %d: %s\n", cmd,
                    path, jerr.line, jerr.column, jerr.text);
        return -1;
    }
    int rc = 0;
    if (!json_is_object(j)) {
        fprintf(stderr, "ferry %s: the config %s must be one JSON object of options\n", cmd, path);
        rc = -1;
    }
    const char *key;
    json_t *v;
    /* Every key is checked before any is applied: an unknown one anywhere
     * refuses the whole file. */
    json_object_foreach(json_is_object(j) ? j : NULL, key, v) {
        if (rc == 0 && find(defs, ndefs, key) == NULL) {
            fprintf(stderr, "ferry %s: %s: unknown key '%s'%s\n", cmd, path, key,
                    !strcmp(key, "config") ? " (config files do not nest)" : "");
            rc = -1;
        }
    }
    json_object_foreach(rc == 0 ? j : NULL, key, v) {
        const cli_optdef *d = find(defs, ndefs, key);
        char buf[32];
        bool skip;
        const char *text = key_value(cmd, path, key, d, v, buf, sizeof buf, &skip);
        if (text == NULL) {
            rc = -1;
            break;
        }
        if (skip)
            continue;
        if (fn(ctx, d->name, d->kind == CLI_OPT_FLAG ? NULL : text) < 0) {
            fprintf(stderr, "ferry %s: (that is key '%s' of the config %s)\n", cmd, key, path);
            rc = -1;
            break;
        }
    }
    json_decref(j);
    return rc;
}

int cli_args_apply(const char *cmd, const cli_args *a, const cli_optdef *defs, size_t ndefs,
                   cli_apply_fn fn, void *ctx)
{
    if (a->config && cli_config_apply(cmd, a->config, defs, ndefs, fn, ctx) < 0)
        return -1;
    for (size_t i = 0; i < a->n; i++)
        if (fn(ctx, a->v[i].name, a->v[i].value) < 0)
            return -1;
    return 0;
}
