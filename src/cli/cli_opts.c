/* A command's options from its one table (cli_opts.h): the command line
 * through cli_getopt, the --config file through jansson, the --help text. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opts.h"

#define WRAP 80   /* the usage's forms are wrapped before this column */

static const cli_opt *find(const cli_cmd *c, const char *name)
{
    for (size_t i = 0; i < c->nopts; i++)
        if (!strcmp(c->opts[i].name, name))
            return &c->opts[i];
    return NULL;
}

/* One value into its field: 0, or -1 after a line on stderr. from_file:
 * text does not outlive the call (a CLI_OPT_ARG keeps a copy). */
static int store(const cli_cmd *c, const cli_opt *o, const char *text, void *opts, bool from_file)
{
    char *field = (char *)opts + o->off, flag[80];
    snprintf(flag, sizeof flag, "--%s", o->name);
    uint64_t n;
    switch (o->kind) {
    case CLI_OPT_FLAG:
        *(bool *)field = true;
        return 0;
    case CLI_OPT_STR:
        if (strlen(text) >= o->size) {
            fprintf(stderr, "%s %s: %s is at most %zu bytes, not %zu\n", cli_prog(), c->name, flag,
                    o->size - 1, strlen(text));
            return -1;
        }
        memcpy(field, text, strlen(text) + 1);
        return 0;
    case CLI_OPT_ARG:
        if (from_file && (text = strdup(text)) == NULL)   /* kept for the process's life */
            return -1;
        *(const char **)field = text;
        return 0;
    case CLI_OPT_UINT:
    case CLI_OPT_SIZE:
        if ((o->kind == CLI_OPT_UINT ? cli_opt_uint(flag, text, o->min, o->max, &n)
                                     : cli_opt_size(flag, text, o->min, o->max, &n)) < 0)
            return -1;
        if (o->size == sizeof(uint32_t))
            *(uint32_t *)field = (uint32_t)n;   /* max fits: the table says so */
        else
            *(uint64_t *)field = n;
        return 0;
    case CLI_OPT_DOUBLE:
        return cli_opt_double(flag, text, o->dmin, o->dmax, (double *)field);
    case CLI_OPT_CHOICE:
        for (const char *w = o->arg;; w++) {
            size_t n = strcspn(w, "|");
            if (strlen(text) == n && !strncmp(w, text, n)) {
                if (from_file && (text = strdup(text)) == NULL)
                    return -1;
                *(const char **)field = text;
                return 0;
            }
            if (!w[n])
                break;
            w += n;
        }
        fprintf(stderr, "%s: %s wants ", cli_prog(), flag);   /* as cli_opt_uint says it */
        for (const char *w = o->arg; *w;) {   /* "a, b or c" */
            size_t n = strcspn(w, "|");
            fprintf(stderr, "%s%.*s", w == o->arg ? "" : w[n] ? ", " : " or ", (int)n, w);
            w += n + (w[n] == '|');
        }
        fprintf(stderr, ", not '%s'\n", text);
        return -1;
    case CLI_OPT_EACH:
        if (from_file && (text = strdup(text)) == NULL)   /* fn may keep it */
            return -1;
        return o->each(opts, flag, text);
    }
    return -1;
}

/* The value of one key as the option's text; NULL after a line on stderr.
 * *skip: a flag set to false (its default). */
static const char *key_value(const cli_cmd *c, const char *path, const char *key, const cli_opt *o,
                             json_t *v, char *buf, size_t cap, bool *skip)
{
    *skip = false;
    bool num = o->kind == CLI_OPT_UINT || o->kind == CLI_OPT_SIZE;
    if (o->kind == CLI_OPT_DOUBLE && json_is_number(v)) {
        snprintf(buf, cap, "%.17g", json_number_value(v));
        return buf;
    }
    if (o->kind == CLI_OPT_FLAG) {
        if (json_is_boolean(v)) {
            *skip = json_is_false(v);
            return "";
        }
        fprintf(stderr, "%s %s: %s: key '%s' must be true or false\n", cli_prog(), c->name, path, key);
        return NULL;
    }
    if (json_is_string(v))
        return json_string_value(v);
    if (num && json_is_integer(v)) {
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
        return buf;
    }
    fprintf(stderr, "%s %s: %s: key '%s' must be %s\n", cli_prog(), c->name, path, key,
            num ? "a whole number (or a string such as \"64M\")"
                : o->kind == CLI_OPT_DOUBLE ? "a number" : "a string");
    return NULL;
}

/* The --config file: every key checked before any is stored. */
static int apply_file(const cli_cmd *c, const char *path, void *opts, bool *given)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL) {
        if (jerr.line < 0)   /* jansson could not read the file at all */
            fprintf(stderr, "%s %s: cannot read the config %s: %s\n", cli_prog(), c->name, path,
                    jerr.text);
        else
            fprintf(stderr, "%s %s: the config %s is not JSON: line %d, column %d: %s\n", cli_prog(),
                    c->name, path, jerr.line, jerr.column, jerr.text);
        return -1;
    }
    int rc = 0;
    if (!json_is_object(j)) {
        fprintf(stderr, "%s %s: the config %s must be one JSON object of options\n", cli_prog(),
                c->name, path);
        rc = -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(json_is_object(j) ? j : NULL, key, v) {
        if (rc == 0 && find(c, key) == NULL) {
            fprintf(stderr, "%s %s: %s: unknown key '%s'%s\n", cli_prog(), c->name, path, key,
                    !strcmp(key, "config") ? " (config files do not nest)" : "");
            rc = -1;
        }
    }
    json_object_foreach(rc == 0 ? j : NULL, key, v) {
        const cli_opt *o = find(c, key);
        char buf[32];
        bool skip;
        const char *text = key_value(c, path, key, o, v, buf, sizeof buf, &skip);
        if (text == NULL) {
            rc = -1;
            break;
        }
        if (skip)
            continue;
        if (store(c, o, text, opts, true) < 0) {
            fprintf(stderr, "%s %s: (that is key '%s' of the config %s)\n", cli_prog(), c->name, key,
                    path);
            rc = -1;
            break;
        }
        given[o - c->opts] = true;
    }
    json_decref(j);
    return rc;
}

/* "dir=,listen=,no-sync" for cli_getopt, --config last when taken. */
static int spec_of(const cli_cmd *c, char *spec, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i <= c->nopts; i++) {
        if (i == c->nopts && !c->config_key)
            break;
        const char *name = i < c->nopts ? c->opts[i].name : "config";
        bool val = i == c->nopts || c->opts[i].kind != CLI_OPT_FLAG;
        int w = snprintf(spec + k, cap - k, "%s%s%s", k ? "," : "", name, val ? "=" : "");
        if (w < 0 || (size_t)w >= cap - k)
            return -1;
        k += (size_t)w;
    }
    return 0;
}

int cli_parse(const cli_cmd *c, int argc, char **argv, void *opts, int *npos, char ***pos)
{
    char spec[1024];
    if (c->nopts > CLI_GETOPT_MAX - 1 || spec_of(c, spec, sizeof spec) < 0) {
        fprintf(stderr, "%s %s: option table too long\n", cli_prog(), c->name);   /* a table bug */
        return -1;
    }
    struct { const cli_opt *o; const char *v; } seen[CLI_GETOPT_MAX * 2];
    size_t nseen = 0;
    const char *config = NULL;
    cli_getopt g;
    cli_getopt_init(&g, c->name, argc, argv, spec);
    while (cli_getopt_next(&g)) {
        if (cli_getopt_is(&g, "--config")) {
            config = g.val;
            continue;
        }
        if (nseen == sizeof seen / sizeof seen[0]) {
            fprintf(stderr, "%s %s: more than %zu options\n", cli_prog(), c->name, nseen);
            return -1;
        }
        seen[nseen].o = find(c, g.opt + 2);
        seen[nseen++].v = g.val;
    }
    int pr = cli_getopt_end(&g, c->max_pos);
    if (pr != 0)
        return pr;
    bool given[CLI_GETOPT_MAX] = { false };
    if (config && apply_file(c, config, opts, given) < 0)
        return -1;
    for (size_t i = 0; i < nseen; i++) {   /* after the file: the command line overrides it */
        if (store(c, seen[i].o, seen[i].v, opts, false) < 0)
            return -1;
        given[seen[i].o - c->opts] = true;
    }
    for (size_t i = 0; i < c->nopts; i++)
        if (c->opts[i].required && !given[i]) {
            fprintf(stderr, "%s %s: --%s %s is required\n", cli_prog(), c->name, c->opts[i].name,
                    c->opts[i].arg);
            return -1;
        }
    if (npos)
        *npos = g.npos;
    if (pos)
        *pos = g.pos;
    return 0;
}

/* ---- help --------------------------------------------------------------- */

/* Text with '\n' breaks, every line after the first indented by ind. */
static void lines(FILE *f, const char *s, int ind)
{
    for (bool first = true; *s; first = false) {
        size_t n = strcspn(s, "\n");
        fprintf(f, "%*s%.*s\n", first ? 0 : ind, "", (int)n, s);
        s += n + (s[n] == '\n');
    }
}

/* "[--name ARG]", "--name ARG" for a required option, "[--name ARG]..."
 * for a repeatable one. */
static int form_item(const cli_opt *o, char *buf, size_t cap)
{
    return snprintf(buf, cap, "%s--%s%s%s%s%s", o->required ? "" : "[", o->name, o->arg ? " " : "",
                    o->arg ? o->arg : "", o->required ? "" : "]", o->repeat ? "..." : "");
}

/* The one form the table makes: required options first, --config last,
 * wrapped under the first option. */
static void table_form(FILE *f, const cli_cmd *c, int ind)
{
    int col = ind;
    char item[160];
    for (int pass = 0; pass < 3; pass++) {
        size_t n = pass == 2 ? (c->config_key ? 1 : 0) : c->nopts;
        for (size_t i = 0; i < n; i++) {
            if (pass == 2)
                snprintf(item, sizeof item, "[--config FILE]");
            else if (c->opts[i].required != (pass == 0))
                continue;
            else
                form_item(&c->opts[i], item, sizeof item);
            int w = (int)strlen(item);
            if (col > ind && col + 1 + w >= WRAP) {
                fprintf(f, "\n%*s", ind, "");
                col = ind;
            }
            col += fprintf(f, "%s%s", col > ind ? " " : "", item);
        }
    }
    fputc('\n', f);
}

void cli_cmd_usage(FILE *f, const cli_cmd *c)
{
    int ind = fprintf(f, "usage: %s %s", cli_prog(), c->name);
    if (!c->forms) {
        fputc(' ', f);
        table_form(f, c, ind + 1);
    } else if (!c->forms[0]) {
        fputc('\n', f);
    } else {   /* a line that starts with a space goes on the form above it */
        for (const char *s = c->forms; *s;) {
            size_t n = strcspn(s, "\n");
            if (s == c->forms)
                fputc(' ', f);
            else if (s[0] == ' ')
                fprintf(f, "%*s", ind, "");
            else
                fprintf(f, "%*s%s %s ", ind - (int)strlen(c->name) - (int)strlen(cli_prog()) - 1, "",
                        cli_prog(), c->name);
            fprintf(f, "%.*s\n", (int)n, s);
            s += n + (s[n] == '\n');
        }
    }
    if (c->about)
        fprintf(f, "\n%s\n", c->about);
    int w = 0;
    for (size_t i = 0; i < c->nopts; i++) {
        int k = (int)strlen(c->opts[i].name) + (c->opts[i].arg ? (int)strlen(c->opts[i].arg) + 1 : 0);
        w = k > w ? k : w;
    }
    if (c->config_key && w < (int)strlen("config FILE"))
        w = (int)strlen("config FILE");
    if (c->nopts || c->config_key)
        fputc('\n', f);
    for (size_t i = 0; i < c->nopts; i++) {
        const cli_opt *o = &c->opts[i];
        int k = fprintf(f, "  --%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "%*s", w + 6 - k, "");
        lines(f, o->help, w + 6);
    }
    if (c->config_key) {
        int k = fprintf(f, "  --config FILE");
        fprintf(f, "%*s", w + 6 - k, "");
        fprintf(f, "options from a JSON object whose keys are the option\n"
                   "%*snames (%s, ...); the command line\n"
                   "%*soverrides it (docs/operations.md; default: no file)\n",
                w + 6, "", c->config_key, w + 6, "");
    }
    if (c->footer)
        fprintf(f, "\n%s", c->footer);
}

int cli_cmd_usage_exit(int pr, const cli_cmd *c)
{
    if (pr == CLI_HELP) {
        cli_cmd_usage(stdout, c);
        return 0;
    }
    fputc('\n', stderr);
    cli_cmd_usage(stderr, c);
    return 2;
}
