/* `ferry plan` and `ferry-lab bench plan` through the built binaries
 * (FERRY_BIN, FERRY_LAB):
 * layouts, --json, manifests saved and planned from files, bad input. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry/reshard.h"

/* ferry-lab for "bench ...", ferry for the rest. */
static const char *bin(const char *args)
{
    bool lab = !strncmp(args, "bench ", 6);
    const char *b = getenv(lab ? "FERRY_LAB" : "FERRY_BIN");
    return b && *b ? b : lab ? "./ferry-lab" : "./ferry";
}

/* Run `ferry ARGS` (or `ferry-lab bench ...`), capture stdout (and stderr into *err_out when given);
 * returns the exit status. */
static int run(char **out, char **err_out, const char *fmt, ...)
{
    char args[2048], cmd[4096], errf[] = "/tmp/ferry-cli-err-XXXXXX";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int fd = mkstemp(errf);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", bin(args), args, errf);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    *out = buf;
    FILE *e = fopen(errf, "r");
    char *eb = calloc(1, 8192);
    if (e) {
        size_t m = fread(eb, 1, 8191, e);
        eb[m] = 0;
        fclose(e);
    }
    unlink(errf);
    if (err_out)
        *err_out = eb;
    else
        free(eb);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("not JSON (%s): %s", e.text, text);
    return j;
}

static uint64_t num(const json_t *j, const char *key)
{
    const json_t *v = json_object_get(j, key);
    if (!json_is_integer(v))
        fail_msg("no integer '%s'", key);
    return (uint64_t)json_integer_value(v);
}

static void test_plan_layouts_json(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run(&out, NULL, "plan --model qwen3-8b --src fsdp:8 --dst tp:4,dp:2 --json"), 0);
    json_t *j = parse(out);
    assert_int_equal(num(j, "tensors"), 399);
    assert_int_equal(num(j, "src_ranks"), 8);
    assert_int_equal(num(j, "dst_ranks"), 8);
    /* two DP copies of a bf16 model, norms on all 4 TP ranks of each:
     * 36 * (2 * 4096 + 2 * 128) + 4096 norm parameters, 3 more copies */
    assert_int_equal(num(j, "bytes"), 2ull * 2 * 8190735360ull + 2ull * 3 * 2 * (36 * 8448 + 4096));
    assert_int_equal(num(j, "src_fragments"), 399 * 8);
    assert_true(num(j, "regions") >= num(j, "dst_fragments"));
    assert_int_equal(num(j, "runs"), num(j, "regions"));
    assert_true(num(j, "max_rank_bytes") >= num(j, "bytes") / 8);
    assert_true(json_is_real(json_object_get(j, "plan_s")));
    assert_int_equal(strlen(json_string_value(json_object_get(j, "src_digest"))), 32);
    json_decref(j);
    free(out);
}

static void test_plan_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-cli-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *out, *err;
    assert_int_equal(run(&out, NULL, "plan --model qwen3-30b-a3b --src ep:4,tp:2 --dst pp:2,tp:4 --json "
                                     "--save-src %s/src.json --save-dst %s/dst.json", dir, dir), 0);
    json_t *a = parse(out);
    free(out);
    assert_int_equal(run(&out, NULL, "plan %s/src.json %s/dst.json --json", dir, dir), 0);
    json_t *b = parse(out);
    free(out);
    static const char *keys[] = {"regions", "runs", "bytes", "src_fragments", "dst_fragments", "max_rank_bytes"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_int_equal(num(a, keys[i]), num(b, keys[i]));
    static const char *dig[] = {"src_digest", "dst_digest", "topology_digest"};
    for (size_t i = 0; i < 3; i++)
        assert_string_equal(json_string_value(json_object_get(a, dig[i])), json_string_value(json_object_get(b, dig[i])));
    json_decref(a);
    json_decref(b);

    /* The human table and the runs listing. */
    assert_int_equal(run(&out, NULL, "plan %s/src.json %s/dst.json --runs 3 --dst-rank 1", dir, dir), 0);
    assert_non_null(strstr(out, "regions"));
    assert_non_null(strstr(out, "max bytes / dst rank"));
    assert_non_null(strstr(out, "planning time"));
    assert_non_null(strstr(out, "model.embed_tokens.weight"));
    free(out);

    /* A target the source cannot fill fails with the tensor's name. */
    char path[512];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"format\":\"ferry.manifest\",\"version\":1,\"topology\":{\"ranks\":2},"
          "\"tensors\":[{\"name\":\"lm_head.weight\",\"dtype\":\"f32\",\"shape\":[151936,2048]}],"
          "\"fragments\":[{\"tensor\":0,\"rank\":1,\"offset\":[0,0],\"shape\":[1,1]}]}",
          f);
    fclose(f);
    assert_int_equal(run(&out, &err, "plan %s/src.json %s", dir, path), 1);
    assert_non_null(strstr(err, "tensor 'lm_head.weight'"));
    assert_non_null(strstr(err, "dtype bf16"));
    free(out);
    free(err);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_plan_bad_input(void **state)
{
    (void)state;
    char *out, *err;
    assert_int_equal(run(&out, &err, "plan --model qwen3-8b --src fsdp:0 --dst tp:2"), 1);
    assert_non_null(strstr(err, "fsdp"));
    free(out);
    free(err);
    assert_int_equal(run(&out, &err, "plan --model nope --src fsdp:2 --dst tp:2"), 1);
    assert_non_null(strstr(err, "no model preset 'nope'"));
    free(out);
    free(err);
    assert_int_equal(run(&out, &err, "plan /nonexistent/a.json /nonexistent/b.json"), 1);
    assert_non_null(strstr(err, "/nonexistent/a.json"));
    free(out);
    free(err);
    assert_int_equal(run(&out, &err, "plan --model qwen3-8b --src fsdp:2"), 2);
    assert_non_null(strstr(err, "usage"));
    free(out);
    free(err);
    assert_int_equal(run(&out, NULL, "plan --models"), 0);
    assert_non_null(strstr(out, "kimi-k2"));
    free(out);
}

static void test_bench_plan(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run(&out, NULL, "bench plan --model qwen3-30b-a3b --src fsdp:64 --dst ep:8,tp:2 --json"), 0);
    json_t *j = parse(out);
    assert_true(json_is_true(json_object_get(j, "cache_hit")));
    assert_true(json_is_true(json_object_get(j, "same_plan")));
    assert_true(json_is_true(json_object_get(j, "rank0_bytes_ok")));
    assert_true(num(j, "peak_rss_bytes") > 0);
    assert_true(num(j, "regions") > 0);
    const json_t *b = json_object_get(j, "baseline");
    assert_true(json_is_object(b));
    assert_true(json_is_true(json_object_get(b, "regions_match")));
    assert_true(json_real_value(json_object_get(j, "cold_s")) > 0);
    json_decref(j);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_layouts_json),
        cmocka_unit_test(test_plan_files),
        cmocka_unit_test(test_plan_bad_input),
        cmocka_unit_test(test_bench_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
