/* base layer: the head of every log line (UTC time with milliseconds, pid,
 * level, subsystem), the JSON form (FERRY_LOG_FORMAT=json) and the callback
 * an embedding program takes lines with. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/base.h"

/* Runs fn with stderr redirected to a fresh file; returns its contents. */
static char *capture_stderr(void (*fn)(void))
{
    char path[] = "/tmp/ferry_test_logfmt_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    fn();
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    char *buf = calloc(1, (size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)len, 0), len);
    close(fd);
    return buf;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "2025-01-31T12:34:56.789Z" -> ms since the epoch, -1 if malformed. */
static int64_t parse_ts(const char *s)
{
    struct tm tm = { 0 };
    int ms = -1, used = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms, &used) != 7 || used != 24 || ms < 0)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm) * 1000 + ms;
}

static int64_t t_before, t_after;

static void log_text(void)
{
    ferry_log_set_level(FERRY_LOG_INFO);
    ferry_log_set_format(FERRY_LOG_TEXT);
    t_before = wall_ms();
    FR_INFO("master", "first %d", 1);
    FR_WARN("node", "two\nlines\n");
    t_after = wall_ms();
}

/* The head: time, pid, level, subsystem; a message of two lines gives two
 * lines, each with the head. The time is the wall clock's (between readings
 * taken before and after). */
static void test_text_head(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();
    char *out = capture_stderr(log_text);
    ferry_log_set_level(old);
    const char *want[] = { "INFO master: first 1", "WARN node: two", "WARN node: lines" };
    char *line = out;
    for (size_t i = 0; i < 3; i++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        int64_t t = parse_ts(line);
        assert_true(t >= t_before && t <= t_after);
        char rest[128];
        snprintf(rest, sizeof rest, " ferry[%ld] %s", (long)getpid(), want[i]);
        assert_string_equal(line + 24, rest);
        line = nl + 1;
    }
    assert_string_equal(line, "");
    free(out);
}

static void log_json(void)
{
    ferry_log_set_level(FERRY_LOG_DEBUG);
    ferry_log_set_format(FERRY_LOG_JSON);
    t_before = wall_ms();
    FR_ERROR("store", "key \"a\\b\"\nnext\tline \x01 caf\xc3\xa9 bad\xff end\n");
    FR_DEBUG("engine", "plain");
    t_after = wall_ms();
    ferry_log_set_format(FERRY_LOG_TEXT);
}

/* One JSON object per line, whatever the message holds: quotes,
 * backslashes, newlines, control characters, UTF-8 kept, other bytes as
 * U+FFFD. */
static void test_json_lines(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();
    char *out = capture_stderr(log_json);
    ferry_log_set_level(old);
    const char *msgs[] = { "key \"a\\b\"\nnext\tline \x01 caf\xc3\xa9 bad\xef\xbf\xbd end", "plain" };
    const char *levels[] = { "error", "debug" }, *subs[] = { "store", "engine" };
    char *line = out;
    for (size_t i = 0; i < 2; i++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        json_error_t err;
        json_t *j = json_loads(line, JSON_REJECT_DUPLICATES, &err);
        if (j == NULL)
            fail_msg("not JSON (%s): %s", err.text, line);
        assert_int_equal(json_object_size(j), 5);
        const char *ts = json_string_value(json_object_get(j, "ts"));
        assert_non_null(ts);
        int64_t t = parse_ts(ts);
        assert_true(t >= t_before && t <= t_after);
        assert_string_equal(json_string_value(json_object_get(j, "level")), levels[i]);
        assert_string_equal(json_string_value(json_object_get(j, "subsystem")), subs[i]);
        assert_int_equal(json_integer_value(json_object_get(j, "pid")), getpid());
        assert_string_equal(json_string_value(json_object_get(j, "msg")), msgs[i]);
        json_decref(j);
        line = nl + 1;
    }
    assert_string_equal(line, "");
    free(out);
}

static void log_json_long(void)
{
    static char msg[20000];
    memset(msg, '"', sizeof msg - 1);   /* each byte escapes to two */
    msg[sizeof msg - 1] = '\0';
    ferry_log_set_level(FERRY_LOG_WARN);
    ferry_log_set_format(FERRY_LOG_JSON);
    FR_WARN("long", "%s", msg);
    ferry_log_set_format(FERRY_LOG_TEXT);
}

/* A message longer than any stack buffer is one whole object. */
static void test_json_long(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();
    char *out = capture_stderr(log_json_long);
    ferry_log_set_level(old);
    size_t n = strlen(out);
    assert_true(n > 40000);
    assert_ptr_equal(strchr(out, '\n'), out + n - 1);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(strlen(json_string_value(json_object_get(j, "msg"))), 19999);
    json_decref(j);
    free(out);
}

/* FERRY_LOG_FORMAT is read once, lazily: a fresh copy of this program with
 * the variable set reports the format it sees as its exit status. */
static int child_format(const char *value)
{
    pid_t pid = fork();
    int status;
    assert_true(pid >= 0);
    if (pid == 0) {
        if (value != NULL)
            setenv("FERRY_LOG_FORMAT", value, 1);
        else
            unsetenv("FERRY_LOG_FORMAT");
        execl("/proc/self/exe", "test_base_log", "--report-log-format", (char *)NULL);
        _exit(100);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_format_env(void **state)
{
    (void)state;
    assert_int_equal(child_format("json"), FERRY_LOG_JSON);
    assert_int_equal(child_format("JSON"), FERRY_LOG_JSON);
    assert_int_equal(child_format("text"), FERRY_LOG_TEXT);
    assert_int_equal(child_format("yaml"), FERRY_LOG_TEXT);
    assert_int_equal(child_format(NULL), FERRY_LOG_TEXT);
}

typedef struct seen { int n; enum ferry_log_level level; char tag[32], msg[128]; } seen;

static void take(void *arg, enum ferry_log_level level, const char *tag, const char *msg)
{
    seen *s = arg;
    s->n++;
    s->level = level;
    snprintf(s->tag, sizeof s->tag, "%s", tag);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
}

static seen cb_seen;

static void log_to_callback(void)
{
    ferry_log_set_level(FERRY_LOG_INFO);
    ferry_log_set_format(FERRY_LOG_JSON);   /* the format is for stderr only */
    ferry_log_set_callback(take, &cb_seen);
    FR_INFO("weights", "published %d tensors\n", 3);
    FR_DEBUG("weights", "below the level");
    ferry_log_set_callback(NULL, NULL);
    ferry_log_set_format(FERRY_LOG_TEXT);
    FR_WARN("weights", "back on stderr");
}

/* The callback takes the message alone (no head, no newline), at the
 * level, and nothing reaches stderr while it is set. */
static void test_callback(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();
    char *out = capture_stderr(log_to_callback);
    ferry_log_set_level(old);
    assert_int_equal(cb_seen.n, 1);
    assert_int_equal(cb_seen.level, FERRY_LOG_INFO);
    assert_string_equal(cb_seen.tag, "weights");
    assert_string_equal(cb_seen.msg, "published 3 tensors");
    assert_null(strstr(out, "published"));
    assert_non_null(strstr(out, " WARN weights: back on stderr\n"));
    free(out);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--report-log-format") == 0)
        return (int)ferry_log_get_format();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_head),
        cmocka_unit_test(test_json_lines),
        cmocka_unit_test(test_json_long),
        cmocka_unit_test(test_format_env),
        cmocka_unit_test(test_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
