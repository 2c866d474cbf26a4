/* base layer: errors, logging, allocation, time, randomness, hashing, JSON. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "util/testutil.h"

/* ---- errors ------------------------------------------------------------- */

static const int all_codes[] = {
    FERRY_EINVAL, FERRY_ENOMEM, FERRY_EAGAIN, FERRY_EBUSY, FERRY_ETIMEDOUT,
    FERRY_ENOENT, FERRY_EEXIST, FERRY_ENOSPC, FERRY_EACCES, FERRY_EFAULT,
    FERRY_ECONNRESET, FERRY_ECONNREFUSED, FERRY_EIO, FERRY_EPROTO,
    FERRY_EMSGSIZE, FERRY_ERANGE, FERRY_ESTALE, FERRY_ENOTSUP, FERRY_ECANCELED,
    FERRY_EAUTH, FERRY_EFENCED, FERRY_ECORRUPT, FERRY_ESTATE, FERRY_ELOST,
    FERRY_EREBUILD,
};
#define NCODES (sizeof(all_codes) / sizeof(all_codes[0]))

static void test_strerror_known(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCODES; i++) {
        const char *s = ferry_strerror(all_codes[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 5);
        assert_null(strstr(s, "unknown error"));
        for (size_t k = 0; k < i; k++) /* every code has its own text */
            assert_string_not_equal(s, ferry_strerror(all_codes[k]));
    }
    /* ferry's own codes sit in their own range, one past another. */
    for (int c = FERRY_ELAST; c <= -(FERRY_EBASE + 1); c++)
        assert_null(strstr(ferry_strerror(c), "unknown error"));
    assert_non_null(strstr(ferry_strerror(FERRY_EFENCED), "fenced"));
    assert_non_null(strstr(ferry_strerror(FERRY_EFENCED), "unknown outcome"));
    assert_string_equal(ferry_strerror(0), "success");
}

static void test_strerror_unknown(void **state)
{
    (void)state;
    assert_string_equal(ferry_strerror(12345), "unknown error 12345");
    assert_string_equal(ferry_strerror(FERRY_ELAST - 1), "unknown error -4103");
    assert_string_equal(ferry_strerror(-FERRY_EBASE), "unknown error -4096");
    assert_string_equal(ferry_strerror(INT32_MIN), "unknown error -2147483648");
    assert_string_equal(ferry_strerror(EINVAL), "unknown error 22"); /* positive */
}

static pthread_barrier_t strerror_barrier;

static void *strerror_thread(void *arg)
{
    (void)arg;
    const char *mine = ferry_strerror(99999);
    pthread_barrier_wait(&strerror_barrier); /* main formats its own now */
    pthread_barrier_wait(&strerror_barrier);
    return (void *)(strcmp(mine, "unknown error 99999") == 0 ? mine : NULL);
}

/* Unknown-code texts are per thread: another thread's call cannot change
 * the text this one holds. */
static void test_strerror_thread_local(void **state)
{
    (void)state;
    pthread_t t;
    void *ret;

    assert_int_equal(pthread_barrier_init(&strerror_barrier, NULL, 2), 0);
    assert_int_equal(pthread_create(&t, NULL, strerror_thread, NULL), 0);
    pthread_barrier_wait(&strerror_barrier);
    const char *main_text = ferry_strerror(88888);
    pthread_barrier_wait(&strerror_barrier);
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_non_null(ret);
    assert_ptr_not_equal(ret, main_text);
    assert_string_equal(main_text, "unknown error 88888");
    pthread_barrier_destroy(&strerror_barrier);
}

/* ---- logging ------------------------------------------------------------ */

/* Runs fn with stderr redirected to a fresh file; returns its contents. */
static char *capture_stderr(void (*fn)(void))
{
    char path[] = "/tmp/ferry_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    int fl = fcntl(fd, F_GETFL);
    assert_int_equal(fcntl(fd, F_SETFL, fl | O_APPEND), 0);
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

/* Every line starts with a UTC timestamp ("2025-01-31T12:34:56.789Z "):
 * check its shape and drop it, leaving "ferry[pid] LEVEL tag: message"
 * lines (tests/base/test_base_log.c tests the head itself). */
static void strip_timestamps(char *out)
{
    char *w = out;
    for (char *line = out; *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        assert_true(nl - line > 25);
        for (int i = 0; i < 24; i++)
            assert_true(i == 4 || i == 7 ? line[i] == '-' : i == 10 ? line[i] == 'T'
                        : i == 13 || i == 16 ? line[i] == ':' : i == 19 ? line[i] == '.'
                        : i == 23 ? line[i] == 'Z' : (line[i] >= '0' && line[i] <= '9'));
        assert_int_equal(line[24], ' ');
        size_t n = (size_t)(nl - line) - 25 + 1;
        memmove(w, line + 25, n);
        w += n;
        line = nl + 1;
    }
    *w = '\0';
}

static void log_some(void)
{
    ferry_log_set_level(FERRY_LOG_WARN);
    FR_DEBUG("test", "hidden debug %d", 1);
    FR_INFO("test", "hidden info %d", 2);
    FR_WARN("test", "hello %d", 42);
    FR_ERROR("net", "ends with newline\n");
    ferry_log_set_level(FERRY_LOG_OFF);
    FR_ERROR("test", "hidden when off");
}

static void test_log_format(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();
    char want[256];

    char *out = capture_stderr(log_some);
    strip_timestamps(out);
    snprintf(want, sizeof(want), "ferry[%ld] WARN test: hello 42\nferry[%ld] ERROR net: ends with newline\n",
             (long)getpid(), (long)getpid());
    assert_string_equal(out, want);
    free(out);
    ferry_log_set_level(old);
}

static void log_long(void)
{
    char msg[5000];

    memset(msg, 'x', sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = '\0';
    ferry_log_set_level(FERRY_LOG_DEBUG);
    FR_DEBUG("long", "%s|", msg);
}

static void test_log_long_line(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();

    char *out = capture_stderr(log_long);
    ferry_log_set_level(old);
    assert_non_null(strstr(out, " DEBUG long: xxx"));
    size_t len = strlen(out);
    assert_true(len > 5000);
    assert_memory_equal(out + len - 2, "|\n", 2);
    assert_ptr_equal(strchr(out, '\n'), out + len - 1); /* one line */
    free(out);
}

enum { LOG_THREADS = 4, LOG_LINES = 300 };

static void *log_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < LOG_LINES; i++)
        FR_ERROR("thr", "t=%d i=%d %s", t, i, "padding-padding-padding-padding-padding");
    return NULL;
}

static void log_threads(void)
{
    pthread_t th[LOG_THREADS];

    ferry_log_set_level(FERRY_LOG_ERROR);
    for (int t = 0; t < LOG_THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, log_thread, (void *)(intptr_t)t), 0);
    for (int t = 0; t < LOG_THREADS; t++)
        pthread_join(th[t], NULL);
}

/* Lines from concurrent threads come out whole. */
static void test_log_threads(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();
    static bool seen[LOG_THREADS][LOG_LINES];
    char prefix[64];
    int n = 0;

    char *out = capture_stderr(log_threads);
    ferry_log_set_level(old);
    strip_timestamps(out);
    snprintf(prefix, sizeof(prefix), "ferry[%ld] ERROR thr: ", (long)getpid());
    for (char *line = out, *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1, n++) {
        int t, i, used = 0;
        *nl = '\0';
        assert_memory_equal(line, prefix, strlen(prefix));
        assert_int_equal(sscanf(line + strlen(prefix), "t=%d i=%d padding-padding-padding-padding-padding%n",
                                &t, &i, &used), 2);
        assert_int_equal(line + strlen(prefix) + used, nl);
        assert_true(t >= 0 && t < LOG_THREADS && i >= 0 && i < LOG_LINES);
        assert_false(seen[t][i]);
        seen[t][i] = true;
    }
    assert_int_equal(n, LOG_THREADS * LOG_LINES);
    free(out);
}

static void test_log_levels(void **state)
{
    (void)state;
    enum ferry_log_level old = ferry_log_get_level();

    ferry_log_set_level(FERRY_LOG_INFO);
    assert_int_equal(ferry_log_get_level(), FERRY_LOG_INFO);
    assert_false(fr_log_on(FERRY_LOG_DEBUG));
    assert_true(fr_log_on(FERRY_LOG_INFO));
    assert_true(fr_log_on(FERRY_LOG_ERROR));
    assert_false(fr_log_on(FERRY_LOG_OFF)); /* OFF is not a level to log at */
    ferry_log_set_level(FERRY_LOG_OFF);
    assert_false(fr_log_on(FERRY_LOG_ERROR));
    ferry_log_set_level((enum ferry_log_level)42); /* bad value: default */
    assert_int_equal(ferry_log_get_level(), FERRY_LOG_WARN);
    errno = EACCES;
    FR_DEBUG("test", "not printed");
    assert_int_equal(errno, EACCES); /* logging leaves errno alone */
    ferry_log_set_level(old);
}

/* FERRY_LOG is read once, lazily: run a fresh copy of this program with the
 * variable set and have it report the level it sees as its exit status. */
static int child_level(const char *value)
{
    pid_t pid = fork();
    int status;

    assert_true(pid >= 0);
    if (pid == 0) {
        if (value != NULL)
            setenv("FERRY_LOG", value, 1);
        else
            unsetenv("FERRY_LOG");
        execl("/proc/self/exe", "test_base_misc", "--report-log-level", (char *)NULL);
        _exit(100);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_log_env(void **state)
{
    (void)state;
    assert_int_equal(child_level("debug"), FERRY_LOG_DEBUG);
    assert_int_equal(child_level("info"), FERRY_LOG_INFO);
    assert_int_equal(child_level("warn"), FERRY_LOG_WARN);
    assert_int_equal(child_level("ERROR"), FERRY_LOG_ERROR);
    assert_int_equal(child_level("off"), FERRY_LOG_OFF);
    assert_int_equal(child_level("bogus"), FERRY_LOG_WARN);
    assert_int_equal(child_level(NULL), FERRY_LOG_WARN);
}

/* ---- allocation --------------------------------------------------------- */

static void test_alloc(void **state)
{
    (void)state;
    void *p = fr_malloc(0);
    assert_non_null(p); /* NULL only ever means out of memory */
    fr_free(p);
    p = fr_calloc(0, 8);
    assert_non_null(p);
    fr_free(p);
    assert_null(fr_calloc(SIZE_MAX / 2, 4));
    assert_null(fr_reallocarray(NULL, SIZE_MAX / 2, 4));
    assert_null(fr_malloc(SIZE_MAX - 8));
    char *s = fr_strdup("ferry");
    assert_string_equal(s, "ferry");
    fr_free(s);
    assert_null(fr_strdup(NULL));
    fr_free(NULL);
}

/* Warm buffers: a freed large block comes back for the next request of
 * its size, written before (its bytes kept); small ones and NULL work;
 * a request far smaller than the block kept gets another. */
static void test_warm_alloc(void **state)
{
    (void)state;
    fr_warm_free(NULL);
    uint8_t *small = fr_warm_alloc(100);
    assert_non_null(small);
    memset(small, 7, 100);
    fr_warm_free(small);
    assert_null(fr_warm_alloc(SIZE_MAX - 8));
    size_t n = (size_t)3 << 20;
    uint8_t *a = fr_warm_alloc(n);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 0x5a, n);
    fr_warm_free(a);
    uint8_t *b = fr_warm_alloc(n - 4096);   /* fits the block kept */
    assert_non_null(b);
    uint8_t *c = fr_warm_alloc(n);          /* the pool is empty again: a new one */
    assert_non_null(c);
    assert_ptr_not_equal(b, c);
    memset(c, 1, n);
#if !FR_ASAN   /* the sanitizer build hands every block to malloc */
    assert_ptr_equal(b, a);
    assert_int_equal(b[0], 0x5a);
    assert_int_equal(b[n - 4097], 0x5a);
    fr_warm_free(c);
    uint8_t *d = fr_warm_alloc(300 << 10);  /* far smaller than the 3 MiB kept: not it */
    assert_ptr_not_equal(d, c);
    fr_warm_free(d);
#else
    fr_warm_free(c);
#endif
    fr_warm_free(b);
    for (int i = 0; i < 40; i++) {          /* more than the pool keeps: the oldest go */
        uint8_t *e = fr_warm_alloc(((size_t)i + 1) << 20);
        assert_non_null(e);
        e[0] = (uint8_t)i;
        fr_warm_free(e);
    }
}

static void test_grow(void **state)
{
    (void)state;
    uint32_t *v = NULL;
    size_t cap = 0;

    assert_int_equal(fr_grow((void **)&v, &cap, 1, sizeof(*v)), 0);
    assert_true(cap >= 1);
    for (uint32_t i = 0; i < 1000; i++) {
        assert_int_equal(fr_grow((void **)&v, &cap, i + 1, sizeof(*v)), 0);
        assert_true(cap >= i + 1);
        v[i] = i * 7;
    }
    assert_true(cap < 4000); /* doubling, not unbounded */
    for (uint32_t i = 0; i < 1000; i++)
        assert_int_equal(v[i], i * 7);

    uint32_t *before = v;
    size_t cap_before = cap;
    assert_int_equal(fr_grow((void **)&v, &cap, SIZE_MAX / 2, sizeof(*v)), FERRY_ERANGE);
    assert_int_equal(fr_grow((void **)&v, &cap, SIZE_MAX, 2), FERRY_ERANGE);
    assert_ptr_equal(v, before); /* untouched on failure */
    assert_int_equal(cap, cap_before);
    assert_int_equal(fr_grow((void **)&v, &cap, SIZE_MAX / 4, sizeof(*v)), FERRY_ENOMEM);
    assert_ptr_equal(v, before);
    assert_int_equal(fr_grow((void **)&v, &cap, 5, 0), FERRY_EINVAL);
    fr_free(v);

    uint64_t r;
    assert_int_equal(fr_add_u64(UINT64_MAX, 1, &r), FERRY_ERANGE);
    assert_int_equal(fr_mul_u64(UINT64_MAX / 2 + 1, 2, &r), FERRY_ERANGE);
    assert_int_equal(fr_mul_u64(3, 5, &r), 0);
    assert_int_equal(r, 15);
}

/* ---- time ----------------------------------------------------------------- */

static void test_deadline(void **state)
{
    (void)state;
    assert_int_equal(fr_deadline_ns(-1), UINT64_MAX);
    assert_int_equal(fr_deadline_ns(INT64_MIN), UINT64_MAX);
    assert_int_equal(fr_deadline_ns(INT64_MAX), UINT64_MAX); /* saturates */

    uint64_t before = fr_now_ns();
    uint64_t d = fr_deadline_ns(1500);
    uint64_t after = fr_now_ns();
    assert_true(d >= before + 1500000000ull);
    assert_true(d <= after + 1500000000ull);
    uint64_t d0 = fr_deadline_ns(0);
    assert_true(d0 >= after && d0 <= fr_now_ns());

    assert_true(fr_now_ns() >= after); /* monotonic */
    uint64_t ms = fr_now_ms();
    assert_true(ms >= after / 1000000 && ms <= fr_now_ns() / 1000000);

    struct timespec ts = fr_timespec_at(3500000001ull);
    assert_int_equal(ts.tv_sec, 3);
    assert_int_equal(ts.tv_nsec, 500000001);
    ts = fr_timespec_at(UINT64_MAX);
    assert_true(ts.tv_sec > 0 && (uint64_t)ts.tv_sec * 1000000000ull > fr_now_ns() + 1000000000ull * 3600 * 24 * 365 * 50);
    assert_true(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000);
}

static void test_cond_timedwait_expires(void **state)
{
    (void)state;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;

    assert_int_equal(fr_cond_init_monotonic(&cv), 0);
    uint64_t deadline = fr_deadline_ns(20);
    struct timespec ts = fr_timespec_at(deadline);
    int rc = 0;
    pthread_mutex_lock(&mu);
    while (rc == 0)
        rc = pthread_cond_timedwait(&cv, &mu, &ts);
    pthread_mutex_unlock(&mu);
    assert_int_equal(rc, ETIMEDOUT);
    assert_true(fr_now_ns() >= deadline); /* the condvar uses the monotonic clock */
    pthread_cond_destroy(&cv);
    assert_int_equal(fr_cond_init_monotonic(NULL), FERRY_EINVAL);
}

struct waker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool flag;
};

static void *wake_later(void *arg)
{
    struct waker *w = arg;
    usleep(20000);
    pthread_mutex_lock(&w->mu);
    w->flag = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The "forever" timespec must be one libc accepts (no EINVAL) and that does
 * not expire. */
static void test_cond_wait_forever(void **state)
{
    (void)state;
    struct waker w = { .mu = PTHREAD_MUTEX_INITIALIZER, .flag = false };
    pthread_t t;
    int rc = 0;

    assert_int_equal(fr_cond_init_monotonic(&w.cv), 0);
    struct timespec ts = fr_timespec_at(fr_deadline_ns(-1));
    assert_int_equal(pthread_create(&t, NULL, wake_later, &w), 0);
    pthread_mutex_lock(&w.mu);
    while (!w.flag && rc == 0)
        rc = pthread_cond_timedwait(&w.cv, &w.mu, &ts);
    pthread_mutex_unlock(&w.mu);
    pthread_join(t, NULL);
    assert_int_equal(rc, 0);
    assert_true(w.flag);
    pthread_cond_destroy(&w.cv);
}

/* ---- randomness ----------------------------------------------------------- */

static void test_random(void **state)
{
    (void)state;
    uint8_t buf[64] = { 0 }, zero[64] = { 0 };

    for (int i = 0; i < 200000; i++)
        assert_true(fr_random_u64() > 1);
    assert_int_not_equal(fr_random_u64(), fr_random_u64());
    fr_random_bytes(buf, sizeof(buf));
    assert_memory_not_equal(buf, zero, sizeof(buf));
    fr_random_bytes(NULL, 0);
}

/* ---- hashing -------------------------------------------------------------- */

static void test_hash_known_answers(void **state)
{
    (void)state;
    char hex[33];

    assert_int_equal(fr_hash64("", 0, 0), 0x2D06800538D394C2ull);
    assert_int_equal(fr_hash64(NULL, 0, 0), 0x2D06800538D394C2ull);
    fr_hash128_hex(fr_hash128("", 0, 0), hex);
    assert_string_equal(hex, "99aa06d3014798d86001c324468d497f"); /* big-endian */
    assert_int_equal(strlen(hex), 32);
    fr_hash128_hex(fr_hash128("abc", 3, 1), hex);
    assert_int_equal(strlen(hex), 32);
    for (size_t i = 0; i < 32; i++)
        assert_non_null(strchr("0123456789abcdef", hex[i]));
    assert_int_not_equal(fr_hash64("abc", 3, 0), fr_hash64("abc", 3, 1));
}

static void test_hasher_streaming(void **state)
{
    (void)state;
    uint8_t data[3000];

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 31 + 7);
    const size_t cuts[] = { 0, 1, 17, 240, 1024, 2999, 3000 };
    fr_hash128_t want = fr_hash128(data, sizeof(data), 42);
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
        fr_hasher *h = fr_hasher_new(42);
        assert_non_null(h);
        fr_hasher_update(h, data, cuts[c]);
        fr_hasher_update(h, NULL, 0);
        fr_hasher_update(h, data + cuts[c], sizeof(data) - cuts[c]);
        fr_hash128_t got = fr_hasher_digest(h);
        assert_memory_equal(got.b, want.b, sizeof(want.b));
        got = fr_hasher_digest(h); /* digest does not consume the state */
        assert_memory_equal(got.b, want.b, sizeof(want.b));
        fr_hasher_free(h);
    }
    fr_hash128_t other = fr_hash128(data, sizeof(data), 43);
    assert_memory_not_equal(other.b, want.b, sizeof(want.b));
    fr_hasher_free(NULL);
}

/* ---- JSON ----------------------------------------------------------------- */

static void test_json_canonical(void **state)
{
    (void)state;
    const char *text = "{ \"b\": 1, \"a\": [true, null, \"x\"], \"c\": {\"z\": 1.5, \"y\": \"s\"} }";
    json_t *j = NULL;
    char err[200] = "";

    assert_int_equal(fr_json_parse(text, strlen(text), &j, err, sizeof(err)), 0);
    char *dump = fr_json_dump_canonical(j);
    assert_string_equal(dump, "{\"a\":[true,null,\"x\"],\"b\":1,\"c\":{\"y\":\"s\",\"z\":1.5}}");
    json_t *again = NULL;
    assert_int_equal(fr_json_parse(dump, strlen(dump), &again, NULL, 0), 0);
    assert_true(json_equal(j, again));
    free(dump);
    json_decref(again);
    json_decref(j);
}

static void test_json_parse_errors(void **state)
{
    (void)state;
    json_t *j = (json_t *)1;
    char err[200] = "";

    assert_int_equal(fr_json_parse("{\"a\": 1,\n \"b\": }", 16, &j, err, sizeof(err)), FERRY_EINVAL);
    assert_null(j);
    assert_true(strlen(err) > 0);
    assert_non_null(strstr(err, ":2:")); /* located: line 2 */
    err[0] = '\0';
    assert_int_equal(fr_json_parse("{\"a\":1,\"a\":2}", 13, &j, err, sizeof(err)), FERRY_EINVAL);
    assert_true(strlen(err) > 0); /* duplicate keys refused */
    assert_int_equal(fr_json_parse("", 0, &j, NULL, 0), FERRY_EINVAL);
    assert_int_equal(fr_json_parse("[1]", 3, NULL, err, sizeof(err)), FERRY_EINVAL);
}

static void test_json_getters(void **state)
{
    (void)state;
    const char *text = "{\"n\": 7, \"s\": \"hi\", \"neg\": -1, \"f\": 1.5, \"big\": 9223372036854775807}";
    json_t *j = NULL;
    char err[200];
    uint64_t u = 0;
    const char *s = NULL;

    assert_int_equal(fr_json_parse(text, strlen(text), &j, NULL, 0), 0);
    assert_int_equal(fr_json_get_u64(j, "n", &u, err, sizeof(err)), 0);
    assert_int_equal(u, 7);
    assert_int_equal(fr_json_get_u64(j, "big", &u, err, sizeof(err)), 0);
    assert_int_equal(u, INT64_MAX);
    assert_int_equal(fr_json_get_str(j, "s", &s, err, sizeof(err)), 0);
    assert_string_equal(s, "hi");

    err[0] = '\0';
    assert_int_equal(fr_json_get_u64(j, "s", &u, err, sizeof(err)), FERRY_EINVAL);
    assert_non_null(strstr(err, "'s'"));
    err[0] = '\0';
    assert_int_equal(fr_json_get_u64(j, "f", &u, err, sizeof(err)), FERRY_EINVAL);
    assert_non_null(strstr(err, "'f'"));
    err[0] = '\0';
    assert_int_equal(fr_json_get_u64(j, "neg", &u, err, sizeof(err)), FERRY_EINVAL);
    assert_non_null(strstr(err, "'neg'"));
    err[0] = '\0';
    assert_int_equal(fr_json_get_u64(j, "missing", &u, err, sizeof(err)), FERRY_EINVAL);
    assert_non_null(strstr(err, "missing"));
    err[0] = '\0';
    assert_int_equal(fr_json_get_str(j, "n", &s, err, sizeof(err)), FERRY_EINVAL);
    assert_non_null(strstr(err, "'n'"));
    assert_int_equal(fr_json_get_str(j, "nope", &s, NULL, 0), FERRY_EINVAL);
    json_t *arr = json_array();
    assert_int_equal(fr_json_get_u64(arr, "n", &u, err, sizeof(err)), FERRY_EINVAL);
    assert_int_equal(fr_json_get_str(NULL, "n", &s, err, sizeof(err)), FERRY_EINVAL);
    json_decref(arr);
    assert_int_equal(u, INT64_MAX); /* failures leave *out alone */
    json_decref(j);
}

static size_t count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static void test_json_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry_test_json_XXXXXX";
    char path[128], bad[128], missing[128], err[300];
    json_t *back = NULL;

    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/conf.json", dir);
    snprintf(bad, sizeof(bad), "%s/bad.json", dir);
    snprintf(missing, sizeof(missing), "%s/missing.json", dir);
    json_t *j = json_pack("{s:i, s:[s, b], s:{}}", "z", 3, "a", "x", 1, "m");
    assert_non_null(j);

    assert_int_equal(fr_json_write_file(path, j), 0);
    assert_int_equal(fr_json_write_file(path, j), 0); /* replaces */
    assert_int_equal(count_entries(dir), 1);         /* no temp file left */
    assert_int_equal(fr_json_load_file(path, &back, err, sizeof(err)), 0);
    assert_true(json_equal(j, back));
    json_decref(back);

    FILE *f = fopen(path, "r");
    char content[256] = "";
    assert_non_null(f);
    assert_true(fread(content, 1, sizeof(content) - 1, f) > 0);
    fclose(f);
    assert_string_equal(content, "{\"a\":[\"x\",true],\"m\":{},\"z\":3}\n");

    assert_int_equal(fr_json_load_file(missing, &back, err, sizeof(err)), FERRY_ENOENT);
    assert_null(back);
    assert_non_null(strstr(err, "missing.json"));

    f = fopen(bad, "w");
    assert_non_null(f);
    fputs("{\n  \"a\": [1, 2,\n", f);
    fclose(f);
    err[0] = '\0';
    assert_int_equal(fr_json_load_file(bad, &back, err, sizeof(err)), FERRY_EINVAL);
    assert_null(back);
    assert_non_null(strstr(err, "bad.json:"));

    char nodir[160];
    snprintf(nodir, sizeof(nodir), "%s/no/such/dir.json", dir);
    assert_int_equal(fr_json_write_file(nodir, j), FERRY_ENOENT);

    json_decref(j);
    unlink(path);
    unlink(bad);
    assert_int_equal(rmdir(dir), 0);
}

/* The harness itself: stopping a peer that has already exited (and is not
 * yet reaped) writes "quit" into a pipe with no reader. That must be EPIPE
 * and a clean stop, not a SIGPIPE that kills the test (a CI run once lost
 * test_engine_netns this way when a failed initiator exited first). */
static void test_harness_stop_after_exit(void **s)
{
    (void)s;
    ft_peer p;
    const char *args[] = {"-c", "exit 0", NULL};
    assert_int_equal(ft_spawn_exe(&p, NULL, "/bin/sh", args), 0);
    siginfo_t si;
    memset(&si, 0, sizeof si);
    /* wait for the exit without reaping it: the pid stays a zombie */
    assert_int_equal(waitid(P_PID, (id_t)p.pid, &si, WEXITED | WNOWAIT), 0);
    assert_int_equal(si.si_pid, p.pid);
    ft_peer_stop(&p);                 /* would die of SIGPIPE before the fix */
    assert_int_equal(p.pid, -1);
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);   /* reaped, nothing left */
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--report-log-level") == 0)
        return (int)ferry_log_get_level();

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_harness_stop_after_exit),
        cmocka_unit_test(test_strerror_known),
        cmocka_unit_test(test_strerror_unknown),
        cmocka_unit_test(test_strerror_thread_local),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_log_format),
        cmocka_unit_test(test_log_long_line),
        cmocka_unit_test(test_log_threads),
        cmocka_unit_test(test_log_env),
        cmocka_unit_test(test_alloc),
        cmocka_unit_test(test_warm_alloc),
        cmocka_unit_test(test_grow),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_cond_timedwait_expires),
        cmocka_unit_test(test_cond_wait_forever),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_hash_known_answers),
        cmocka_unit_test(test_hasher_streaming),
        cmocka_unit_test(test_json_canonical),
        cmocka_unit_test(test_json_parse_errors),
        cmocka_unit_test(test_json_getters),
        cmocka_unit_test(test_json_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
