/* `ferry master --config FILE` and `ferry node --config FILE`: the full
 * examples of docs/operations.md run as written (addresses overridden by
 * flags, which must win), every key lands where its flag would, and a bad
 * file (unknown key, wrong type, not JSON, missing) is refused with its
 * key or place named, exit 2, before anything starts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/ftstore.h"

static char out[1 << 16];
static char tmp[PATH_MAX];    /* the test's working directory */
static char token[80];

/* The JSON block after "<!-- ferry-example: NAME -->" in docs/operations.md. */
static json_t *doc_example(const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", __FILE__);   /* .../tests/cli/test_cli_config.c */
    char *cut = strstr(path, "/tests/cli/");
    assert_non_null(cut);
    snprintf(cut, sizeof path - (size_t)(cut - path), "/docs/operations.md");
    FILE *f = fopen(path, "r");
    if (f == NULL)
        fail_msg("cannot read %s", path);
    static char doc[1 << 17];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = '\0';
    fclose(f);
    char mark[96];
    snprintf(mark, sizeof mark, "<!-- ferry-example: %s -->", name);
    const char *at = strstr(doc, mark);
    if (at == NULL)
        fail_msg("no %s in %s", mark, path);
    const char *open = strstr(at, "```json\n"), *close = open ? strstr(open + 8, "```") : NULL;
    assert_non_null(close);
    json_error_t err;
    json_t *j = json_loadb(open + 8, (size_t)(close - open - 8), JSON_REJECT_DUPLICATES, &err);
    if (j == NULL)
        fail_msg("the %s example is not JSON: %s", name, err.text);
    return j;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        fail_msg("%s was not written", path);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/ferry-cli-config-XXXXXX");
    if (!mkdtemp(tmp) || chdir(tmp) != 0 || mkdir("ferry-state", 0700) != 0)
        return -1;
    /* A token of its own in the file the examples name, unlike FERRY_TOKEN:
     * a client with it gets in only if "token-file" was applied. */
    ferry_token_generate(token);
    write_file("ferry-state/token", token);
    setenv("FERRY_TOKEN", "0000000000000000000000000000000000000000000000000000000000000000", 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (chdir("/") == 0)
        ft_run(out, sizeof out, "rm -rf '%s'", tmp);
    return 0;
}

/* The master's status through a client with the file's token. */
static json_t *status_of(const char *addr)
{
    ferry_error fe = {0};
    ferry_store_config cfg;
    ferry_store_config_init(&cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s", addr);
    memcpy(cfg.engine.token, token, strlen(token));
    cfg.engine.token_len = strlen(token);
    cfg.timeout_ms = 30000;
    ferry_store *s = NULL;
    if (ferry_store_open(&cfg, &s, &fe) != 0)
        fail_msg("cannot reach the master at %s with the token file's token: %s", addr,
                 fe.msg);
    char *text = NULL;
    assert_int_equal(ferry_store_status_json(s, &text, NULL), 0);
    ferry_store_close(s);
    json_t *j = json_loads(text, 0, NULL);
    ferry_store_free(text);
    assert_non_null(j);
    return j;
}

static long long jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v))
        fail_msg("no integer %s", k);
    return (long long)json_integer_value(v);
}

/* The docs' master example, its addresses replaced by flags: it starts,
 * every value of the file is in force, and a flag given too wins. */
static void test_master_example(void **state)
{
    (void)state;
    json_t *ex = doc_example("master.json");
    assert_true(json_object_size(ex) >= 12);   /* every option has its key there */
    assert_int_equal(json_dump_file(ex, "master.json", 0), 0);
    const char *args[] = { "master", "--config", "master.json", "--listen", "127.0.0.1:0",
                           "--metrics=127.0.0.1:0", "--grace", "4321", NULL };
    ft_peer m = { .pid = -1 };
    char line[512], addr[64];
    assert_int_equal(ft_spawn_exe(&m, NULL, ft_ferry_bin(), args), 0);
    assert_int_equal(ft_read_line(&m, line, sizeof line, 30000), 0);
    assert_int_equal(sscanf(strstr(line, "listening on ") + 13, "%63s", addr), 1);
    assert_int_equal(ft_read_line(&m, line, sizeof line, 30000), 0);
    assert_non_null(strstr(line, "metrics on http://127.0.0.1:"));
    /* the files the example names, written before the lines */
    char text[256], want[300];
    read_file(json_string_value(json_object_get(ex, "addr-file")), text, sizeof text);
    snprintf(want, sizeof want, "%s\n", addr);
    assert_string_equal(text, want);
    read_file(json_string_value(json_object_get(ex, "metrics-file")), text, sizeof text);
    assert_true(strlen(text) > 1 && text[strlen(text) - 1] == '\n');
    text[strlen(text) - 1] = '\0';
    assert_non_null(strstr(line, text));   /* the URL it printed */
    struct stat st;
    assert_int_equal(stat(json_string_value(json_object_get(ex, "dir")), &st), 0);
    json_t *s = status_of(addr);
    assert_int_equal(jint(s, "heartbeat_timeout_ms"), jint(ex, "heartbeat-timeout"));
    assert_int_equal(jint(s, "dead_after_ms"), jint(ex, "dead-after"));
    assert_int_equal(jint(s, "grace_ms"), 4321);   /* the flag over the file's */
    assert_int_not_equal(jint(ex, "grace"), 4321);
    json_decref(s);
    ft_proc_kill(&m, SIGTERM);
    json_decref(ex);
}

/* The docs' node example against a master, its addresses and size replaced
 * by flags: it mounts under the example's name, writes the example's ready
 * file, and the size of the flag wins. */
static void test_node_example(void **state)
{
    (void)state;
    json_t *ex = doc_example("node.json");
    assert_true(json_object_size(ex) >= 9);
    assert_int_equal(json_dump_file(ex, "node.json", 0), 0);
    char tf[PATH_MAX + 32];
    snprintf(tf, sizeof tf, "%s/ferry-state/token", tmp);
    const char *margs[] = { "master", "--dir", "node-test-master", "--token-file", tf,
                            "--no-sync", NULL };
    ft_peer m = { .pid = -1 }, n = { .pid = -1 };
    char line[512], addr[64];
    assert_int_equal(ft_spawn_exe(&m, NULL, ft_ferry_bin(), margs), 0);
    assert_int_equal(ft_read_line(&m, line, sizeof line, 30000), 0);
    assert_int_equal(sscanf(strstr(line, "listening on ") + 13, "%63s", addr), 1);
    const char *nargs[] = { "node", "--config", "node.json", "--master", addr, "--size=32M",
                            "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", NULL };
    assert_int_equal(ft_spawn_exe(&n, NULL, ft_ferry_bin(), nargs), 0);
    assert_int_equal(ft_read_line(&n, line, sizeof line, 30000), 0);
    if (!strstr(line, "mounted"))
        fail_msg("the node did not mount: %s", line);
    assert_non_null(strstr(line, "(32 MiB)"));
    char text[64];
    assert_int_equal(ft_read_line(&n, line, sizeof line, 30000), 0);
    assert_non_null(strstr(line, "metrics on http://127.0.0.1:"));
    read_file(json_string_value(json_object_get(ex, "ready-file")), text, sizeof text);
    assert_true(strtoull(text, NULL, 10) > 0);
    json_t *s = status_of(addr), *nd;
    size_t i;
    bool named = false;
    json_array_foreach(json_object_get(s, "nodes"), i, nd)
        named |= !strcmp(json_string_value(json_object_get(nd, "name")),
                         json_string_value(json_object_get(ex, "name")));
    assert_true(named);
    json_array_foreach(json_object_get(s, "segments"), i, nd)
        assert_int_equal(jint(nd, "size"), 32 << 20);
    json_decref(s);
    ft_proc_kill(&n, SIGTERM);
    ft_proc_kill(&m, SIGTERM);
    json_decref(ex);
}

/* `ferry CMD --config FILE ARGS` with FILE holding text: exit 2 before
 * anything starts (no state directory made), stderr naming what is wrong. */
static void refused(const char *cmd, const char *text, const char *args, const char *want)
{
    write_file("bad.json", text);
    int st = ft_run(out, sizeof out, "timeout 60 %s %s --config bad.json %s 2>&1", ft_ferry_bin(),
                    cmd, args);
    fprintf(stderr, "%s --config <%s> %s -> %d: %.*s\n", cmd, text, args, st,
            (int)strcspn(out, "\n"), out);
    assert_int_equal(st, 2);
    if (!strstr(out, want))
        fail_msg("'%s' not in: %s", want, out);
    struct stat sb;
    assert_int_not_equal(stat("never-made", &sb), 0);
}

static void test_bad_files(void **state)
{
    (void)state;
    const char *dir = "\"dir\": \"never-made\"";
    char t[512];
    snprintf(t, sizeof t, "{%s, \"heartbeat-timout\": 5000}", dir);
    refused("master", t, "", "unknown key 'heartbeat-timout'");
    refused("node", "{\"master\": \"127.0.0.1:1\", \"bogus\": 1}", "", "unknown key 'bogus'");
    snprintf(t, sizeof t, "{%s, \"config\": \"other.json\"}", dir);
    refused("master", t, "", "unknown key 'config'");
    snprintf(t, sizeof t, "{%s, \"heartbeat-timeout\": \"soon\"}", dir);
    refused("master", t, "", "key 'heartbeat-timeout'");
    snprintf(t, sizeof t, "{%s, \"heartbeat-timeout\": 1.5}", dir);
    refused("master", t, "", "key 'heartbeat-timeout' must be a whole number");
    snprintf(t, sizeof t, "{%s, \"no-sync\": \"yes\"}", dir);
    refused("master", t, "", "key 'no-sync' must be true or false");
    refused("master", "{\"dir\": 5}", "", "key 'dir' must be a string");
    refused("node", "{\"master\": \"127.0.0.1:1\", \"size\": \"4X\"}", "", "'4X'");
    refused("master", "[1, 2]", "", "must be one JSON object");
    snprintf(t, sizeof t, "{%s,\n \"grace\": }", dir);
    refused("master", t, "", "line 2");
    snprintf(t, sizeof t, "{%s, \"grace\": 1, \"grace\": 2}", dir);
    refused("master", t, "", "duplicate");
    /* a flag after the file is checked like any other */
    snprintf(t, sizeof t, "{%s}", dir);
    refused("master", t, "--grace 0", "--grace wants");
    refused("master", t, "--bogus", "unknown option '--bogus'");
    refused("master", t, "--no-sync=1", "--no-sync takes no value");
    int st = ft_run(out, sizeof out, "%s master --config no-such.json 2>&1", ft_ferry_bin());
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "cannot read the config no-such.json"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_master_example),
        cmocka_unit_test(test_node_example),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
