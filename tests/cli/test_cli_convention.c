/* The command-line convention (docs/operations.md, "Command line"), for
 * every command `ferry help` and `ferry-lab --help` list, workers included:
 * --help and -h print the command's usage on stdout and exit 0;
 * --bogus exits 2 and the first line on stderr names '--bogus'; the
 * --opt=value form reaches the option (a bad value is refused by that
 * option's own message, a good one is taken and the next bad option is
 * what gets refused); a prefix of an option is refused; --version and -V;
 * the top-level help names every command and sub-form; plan --models
 * --json; progress without a terminal is whole lines without '\r'; and a
 * cluster of `ferry up --detach` is shown by `ferry status` with its one
 * node, the node's id and the segment's each the same 16 hex digits in
 * ferry up's line, status's tables, the master's log, the node's metrics
 * and status's JSON. Commands that would start processes are
 * refused before they do, so each returns at once (under `timeout`). */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "ferry/common.h"
#include "util/ftstore.h"
#include "util/testutil.h"

static char out[1 << 17], err[1 << 17];

/* `ferry ARGS` (a shell line; ferry-lab for demo, bench and worker): stdout in out, stderr in err, exit status. */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    char args[1024], path[] = "/tmp/ferry-conv-err-XXXXXX";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int st = ft_run(out, sizeof out, "timeout 120 %s %s 2>%s", ft_bin_for(args), args, path);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(err, 1, sizeof err - 1, f) : 0;
    err[n] = 0;
    if (f)
        fclose(f);
    unlink(path);
    fprintf(stderr, "ferry %s -> %d | out: %.*s | err: %.*s\n", args, st, (int)strcspn(out, "\n"),
            out, (int)strcspn(err, "\n"), err);
    return st;
}

/* The first line of err contains want. */
static void first_line_has(const char *want)
{
    const char *nl = strchr(err, '\n'), *q = strstr(err, want);
    assert_non_null(nl);
    assert_non_null(q);
    assert_true(q < nl);
}

/* Every command: its words, a --opt=BAD that its option refuses (naming
 * the option and the value), and a --opt=GOOD it takes. NULL: it has no
 * option with a value. master needs --dir before anything else is looked
 * at, so its --dir comes first (itself in the = form). */
typedef struct cmd_case {
    const char *cmd, *bad, *bad_opt, *bad_val, *good;
} cmd_case;

static const cmd_case cases[] = {
    { "demo", "--rollouts=3x", "--rollouts", "3x", "--trainers=2" },
    { "demo engine", "--size=4X", "--size", "4X", "--size=64M" },
    { "demo rl", "--steps=0", "--steps", "0", "--steps=2" },
    { "demo --sparse", "--density=2x", "--density", "2x", "--density=0.5" },
    { "bench weights", "--reps=+3", "--reps", "+3", "--reps=2" },
    { "bench weights --scale", "--workers=0", "--workers", "0", "--workers=2" },
    { "bench engine", "--streams=4q", "--streams", "4q", "--transport=tcp" },
    { "bench store", "--clients=0", "--clients", "0", "--clients=2" },
    { "bench plan", "--baseline-tensors=1e3", "--baseline-tensors", "1e3", "--model=qwen3-8b" },
    { "bench exec", "--reps=0", "--reps", "0", "--reps=2" },
    { "bench sparse", "--tile=0x4", "--tile", "0x4", "--tile=16x16" },
    { "plan", "--runs=5x", "--runs", "5x", "--runs=2" },
    { "master --dir=/nonexistent/ferry-conv", "--heartbeat-timeout=10x", "--heartbeat-timeout",
      "10x", "--heartbeat-timeout=5000" },
    { "node", "--heartbeat=60001", "--heartbeat", "60001", "--heartbeat=500" },
    { "up --dir=/nonexistent/ferry-conv", "--size=1x", "--size", "1x", "--size=64M" },
    { "down", NULL, NULL, NULL, "--dir=/nonexistent/ferry-conv" },
    { "status", NULL, NULL, NULL, "--dir=/nonexistent/ferry-conv" },
    { "worker target", "--size=4X", "--size", "4X", "--size=1M" },
    { "bench", NULL, NULL, NULL, NULL },
    { "token", NULL, NULL, NULL, NULL },
    { "version", NULL, NULL, NULL, NULL },
};
#define NCASES (sizeof cases / sizeof cases[0])

static void test_help_and_bogus(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCASES; i++) {
        const char *forms[] = { "--help", "-h" };
        for (int k = 0; k < 2; k++) {
            assert_int_equal(run("%s %s", cases[i].cmd, forms[k]), 0);
            assert_non_null(strstr(out, "usage"));
            assert_string_equal(err, "");
        }
        assert_int_equal(run("%s --bogus", cases[i].cmd), 2);
        assert_string_equal(out, "");
        first_line_has("'--bogus'");
    }
    /* help is not a token: no run of 64 hex digits (what `ferry token` prints) */
    assert_int_equal(run("token --help"), 0);
    size_t run_len = 0;
    for (const char *p = out; *p; p++) {
        run_len = isxdigit((unsigned char)*p) ? run_len + 1 : 0;
        assert_true(run_len < 64);
    }
    assert_int_equal(run("token"), 0);   /* and the command itself still makes one */
    assert_int_equal(strlen(out), 65);
}

static void test_equals_form(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCASES; i++) {
        const cmd_case *c = &cases[i];
        if (c->bad) {   /* the value reached the option's own check */
            assert_int_equal(run("%s %s", c->cmd, c->bad), 2);
            char want[160];
            snprintf(want, sizeof want, "%s wants ", c->bad_opt);
            first_line_has(want);
            snprintf(want, sizeof want, "'%s'", c->bad_val);
            first_line_has(want);
        }
        if (c->good) {   /* taken: what is refused is the option after it */
            assert_int_equal(run("%s %s --bogus", c->cmd, c->good), 2);
            first_line_has("'--bogus'");
            const char *eq = strchr(c->good, '=');
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(eq - c->good), c->good);
            const char *nl = strchr(err, '\n'), *q = strstr(err, name);
            assert_true(q == NULL || q > nl);   /* not named on the refusal's line */
        }
    }
    /* the two forms of a value, and a missing one */
    assert_int_equal(run("plan --model=qwen3-8b --src=fsdp:8 --dst tp:4,dp:2 --runs=2"), 0);
    assert_non_null(strstr(out, "model.embed_tokens.weight"));
    assert_int_equal(run("demo rl --steps"), 2);
    first_line_has("--steps needs a value");
    /* a flag given a value, a prefix of a name, an unexpected argument */
    assert_int_equal(run("bench sparse --json=1"), 2);
    first_line_has("--json takes no value");
    assert_int_equal(run("up --dir=/nonexistent/ferry-conv --det"), 2);
    first_line_has("'--det' (did you mean --detach?)");
    assert_int_equal(run("master --dir=/nonexistent/ferry-conv --heartbeat 500"), 2);
    first_line_has("'--heartbeat' (did you mean --heartbeat-timeout?)");
    assert_int_equal(run("bench weights --convert-only=1"), 2);   /* the bench's own flag */
    first_line_has("--convert-only takes no value");
    assert_int_equal(run("demo engine extra"), 2);
    first_line_has("unexpected argument 'extra'");
    /* a top-level word that is no command */
    assert_int_equal(run("--bogus"), 2);
    first_line_has("'--bogus'");
}

static void test_version_and_top_help(void **state)
{
    (void)state;
    char want[64];
    snprintf(want, sizeof want, "ferry %d.%d.%d\n", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR,
             FERRY_VERSION_PATCH);
    const char *forms[] = { "--version", "-V", "version" };
    for (int k = 0; k < 3; k++) {
        assert_int_equal(run("%s", forms[k]), 0);
        assert_string_equal(out, want);
        assert_string_equal(err, "");
    }
    const char *helps[] = { "--help", "-h", "help" };
    static const char *const listed[] = {
        "  master ", "  node ", "  up ", "  down ", "  status ", "  plan ", "  token ", "  version ",
        "--version", "-V", "FERRY_MASTER", "FERRY_HOME", "ferry-lab",
    };
    /* a command's options are in its own --help (its table), not here */
    static const char *const unlisted[] = { "--dir", "--master", "--model", "--listen", "--json" };
    /* the demos and benchmarks are ferry-lab's, and only there */
    static const char *const lab_listed[] = {
        "  demo ", "demo engine", "demo rl", "demo --sparse", "  bench weights ",
        "bench weights --scale", "bench weights --convert-only", "bench weights --torch",
        "bench engine", "bench store", "bench plan", "bench exec", "bench sparse",
        "worker target", "worker trainer", "worker exec", "worker store-client",
        "cluster up", "cluster check", "cluster clean",
    };
    for (int k = 0; k < 3; k++) {
        assert_int_equal(run("%s", helps[k]), 0);
        assert_int_equal(strncmp(out, "usage: ferry <command>", 22), 0);
        for (size_t i = 0; i < sizeof listed / sizeof listed[0]; i++) {
            if (!strstr(out, listed[i]))
                fail_msg("ferry %s does not mention '%s'", helps[k], listed[i]);
        }
        for (size_t i = 0; i < sizeof unlisted / sizeof unlisted[0]; i++) {
            if (strstr(out, unlisted[i]))
                fail_msg("ferry %s repeats the option '%s'", helps[k], unlisted[i]);
        }
        if (strstr(out, "  demo") || strstr(out, "  bench") || strstr(out, "  worker") ||
            strstr(out, " _"))
            fail_msg("ferry %s lists a demo, a benchmark or a worker", helps[k]);
    }
    /* every operator command of the table is in it */
    for (size_t i = 0; i < NCASES; i++) {
        char word[64];
        snprintf(word, sizeof word, "  %.*s", (int)strcspn(cases[i].cmd, " "), cases[i].cmd);
        if (!strcmp(ft_bin_for(cases[i].cmd), ft_ferry_bin()) && !strstr(out, word))
            fail_msg("ferry help does not list '%s'", cases[i].cmd);
    }
    /* and ferry-lab's help, every demo, benchmark and worker */
    char lab_help[1 << 14];
    assert_int_equal(ft_run(lab_help, sizeof lab_help, "%s --help", ft_lab_bin()), 0);
    assert_int_equal(strncmp(lab_help, "usage: ferry-lab ", 17), 0);
    for (size_t i = 0; i < sizeof lab_listed / sizeof lab_listed[0]; i++)
        if (!strstr(lab_help, lab_listed[i]))
            fail_msg("ferry-lab --help does not mention '%s'", lab_listed[i]);
}

static void test_plan_models_json(void **state)
{
    (void)state;
    assert_int_equal(run("plan --models --json"), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    assert_non_null(j);
    assert_true(json_is_array(j));
    assert_true(json_array_size(j) >= 2);
    size_t i;
    json_t *m;
    bool kimi = false;
    json_array_foreach(j, i, m) {
        assert_true(json_integer_value(json_object_get(m, "tensors")) > 0);
        kimi |= !strcmp(json_string_value(json_object_get(m, "name")), "kimi-k2");
    }
    assert_true(kimi);
    json_decref(j);
    assert_int_equal(run("plan --models"), 0);   /* the table */
    assert_non_null(strstr(out, "kimi-k2"));
    assert_null(strchr(out, '{'));
}

/* Without a terminal, progress is lines of their own: FERRY_PROGRESS_SECONDS=0
 * prints every update, so the count does not depend on the machine's speed. */
static void test_progress_lines(void **state)
{
    (void)state;
    setenv("FERRY_PROGRESS_SECONDS", "0", 1);
    int st = run("demo engine --size=64M");
    unsetenv("FERRY_PROGRESS_SECONDS");
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "demo ok"));
    assert_non_null(strstr(err, "ferry: progress: "));
    assert_null(strchr(err, '\r'));
    /* every progress text is a whole line that ends with its seconds */
    for (const char *p = strstr(err, "ferry: progress: "); p; p = strstr(p + 1, "ferry: progress: ")) {
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        assert_true(nl > p && nl[-1] == ')');
    }
}

/* ---- a cluster: status's node count and the one form of a node id ----------------------- */

static char g_dir[64];

static int cluster_teardown(void **state)
{
    (void)state;
    if (g_dir[0]) {
        char o[4096];
        ft_run(o, sizeof o, "%s down --dir=%s >/dev/null 2>&1; rm -rf '%s'", ft_ferry_bin(), g_dir,
               g_dir);
        g_dir[0] = 0;
    }
    return 0;
}

/* The line after the one that starts with head, its n-th word (0-based). */
static bool word_after(const char *text, const char *head, int n, char *w, size_t cap)
{
    const char *p = text;
    while (p && strncmp(p, head, strlen(head)))
        p = (p = strchr(p, '\n')) ? p + 1 : NULL;
    if (!p || !(p = strchr(p, '\n')))
        return false;
    p++;
    for (int k = 0; k <= n; k++) {
        p += strspn(p, " ");
        size_t len = strcspn(p, " \n");
        if (len == 0)
            return false;
        if (k == n) {
            snprintf(w, cap, "%.*s", (int)len, p);
            return true;
        }
        p += len;
    }
    return false;
}

static bool is_id(const char *w)
{
    if (strlen(w) != 16)
        return false;
    for (int k = 0; k < 16; k++)
        if (!isxdigit((unsigned char)w[k]) || isupper((unsigned char)w[k]))
            return false;
    return true;
}

static void test_status_and_node_ids(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ferry-conv-up-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    setenv("FERRY_LOG", "info", 1);   /* the master's log names the node that mounted */
    int st = run("up --detach --metrics --dir=%s --size=64M", g_dir);
    unsetenv("FERRY_LOG");
    assert_int_equal(st, 0);
    char up_seg[64];
    const char *u = strstr(out, "node segment ");
    assert_non_null(u);
    assert_int_equal(sscanf(u + 13, "%63s", up_seg), 1);
    assert_int_equal(run("status --dir=%s", g_dir), 0);
    assert_non_null(strstr(out, ", nodes 1, "));   /* not 0: the nodes are an array */
    char seg[64], id_seg[64], id_node[64], id[32];
    assert_true(word_after(out, "segment ", 0, seg, sizeof seg));
    assert_true(word_after(out, "segment ", 1, id_seg, sizeof id_seg));
    assert_true(word_after(out, "node ", 0, id_node, sizeof id_node));
    assert_true(is_id(seg));
    assert_string_equal(seg, up_seg);   /* ferry up's line: the same form */
    assert_true(is_id(id_node));
    assert_string_equal(id_seg, id_node);
    /* the master's log line of the mount */
    char log[1 << 15];
    assert_int_equal(ft_run(log, sizeof log, "cat '%s/master.log'", g_dir), 0);
    char want[256];
    snprintf(want, sizeof want, "node %s", id_node);
    const char *l = strstr(log, want);
    assert_non_null(l);
    snprintf(want, sizeof want, "mounted segment %s ", seg);
    assert_non_null(strstr(l, want));
    /* the node's metrics label */
    assert_int_equal(ft_run(out, sizeof out, "curl -sf \"$(cat '%s/node.metrics')\"", g_dir), 0);
    snprintf(want, sizeof want, "ferry_node_info{node=\"%s\",segment=\"%s\"", id_node, seg);
    assert_non_null(strstr(out, want));
    /* the JSON form carries the same id, as a number */
    assert_int_equal(run("status --json --dir %s", g_dir), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    json_t *nodes = json_object_get(j, "nodes");
    assert_int_equal(json_array_size(nodes), 1);
    snprintf(id, sizeof id, "%016llx",
             (unsigned long long)json_integer_value(json_object_get(json_array_get(nodes, 0), "id")));
    json_decref(j);
    assert_string_equal(id, id_node);
    assert_int_equal(run("down --dir=%s", g_dir), 0);
    assert_non_null(strstr(out, "stopped the master"));
    ft_run(out, sizeof out, "rm -rf '%s'", g_dir);
    g_dir[0] = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_and_bogus),
        cmocka_unit_test(test_equals_form),
        cmocka_unit_test(test_version_and_top_help),
        cmocka_unit_test(test_plan_models_json),
        cmocka_unit_test(test_progress_lines),
        cmocka_unit_test_teardown(test_status_and_node_ids, cluster_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
