/* Logging: one level for the process, lines to stderr or to a callback. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/base.h"

/* The only process-wide state of the base layer: the threshold below which
 * lines are dropped, seeded once from FERRY_LOG. */
static atomic_int fr_log_level = FERRY_LOG_WARN;
static pthread_once_t fr_log_once = PTHREAD_ONCE_INIT;

/* Process-wide as the level is: where lines go instead of stderr. */
static pthread_mutex_t fr_log_sink_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry_log_fn fr_log_sink;
static void *fr_log_sink_arg;

static const char *const fr_level_names[] = {
    [FERRY_LOG_DEBUG] = "DEBUG",
    [FERRY_LOG_INFO] = "INFO",
    [FERRY_LOG_WARN] = "WARN",
    [FERRY_LOG_ERROR] = "ERROR",
};

/* Unrecognised values keep the default rather than silencing the library. */
static void fr_log_read_env(void)
{
    static const struct { const char *name; enum ferry_log_level level; } map[] = {
        { "debug", FERRY_LOG_DEBUG }, { "info", FERRY_LOG_INFO },
        { "warn", FERRY_LOG_WARN },   { "warning", FERRY_LOG_WARN },
        { "error", FERRY_LOG_ERROR }, { "off", FERRY_LOG_OFF },
        { "none", FERRY_LOG_OFF },
    };
    const char *env = getenv("FERRY_LOG");

    if (env == NULL)
        return;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (strcasecmp(env, map[i].name) == 0) {
            atomic_store(&fr_log_level, map[i].level);
            return;
        }
    }
}

static void fr_log_init(void)
{
    pthread_once(&fr_log_once, fr_log_read_env);
}

void ferry_log_set_level(enum ferry_log_level level)
{
    /* Read the environment first so a later lazy read cannot undo this. */
    fr_log_init();
    if ((int)level < FERRY_LOG_DEBUG || level > FERRY_LOG_OFF)
        level = FERRY_LOG_WARN;
    atomic_store(&fr_log_level, level);
}

enum ferry_log_level ferry_log_get_level(void)
{
    fr_log_init();
    return (enum ferry_log_level)atomic_load(&fr_log_level);
}

void ferry_log_set_callback(ferry_log_fn fn, void *arg)
{
    pthread_mutex_lock(&fr_log_sink_lock);
    fr_log_sink = fn;
    fr_log_sink_arg = fn ? arg : NULL;
    pthread_mutex_unlock(&fr_log_sink_lock);
}

bool fr_log_on(enum ferry_log_level level)
{
    int l = (int)level;

    /* The current level is never negative, so this also rejects bad values. */
    return l >= (int)ferry_log_get_level() && l < FERRY_LOG_OFF;
}

/* One write() per line: concurrent lines may reorder but never interleave. */
static void fr_write_all(const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        buf += w;
        len -= (size_t)w;
    }
}

/* Formats the whole line into buf (cap bytes); returns the length it needs. */
static int fr_log_format(char *buf, size_t cap, enum ferry_log_level level,
                         const char *tag, const char *fmt, va_list ap)
{
    int head = snprintf(buf, cap, "ferry[%ld] %s %s: ", (long)getpid(),
                        fr_level_names[level], tag != NULL ? tag : "-");
    if (head < 0)
        return -1;
    size_t off = (size_t)head < cap ? (size_t)head : cap;
    int body = vsnprintf(buf + off, cap - off, fmt, ap);
    if (body < 0)
        return -1;
    return head + body + 1; /* + '\n' */
}

static void fr_log_emit(char *line, int len)
{
    /* The caller may have ended its message with '\n'; keep one. */
    size_t n = (size_t)len - 1;
    if (n > 0 && line[n - 1] == '\n')
        n--;
    line[n] = '\n';
    fr_write_all(line, n + 1);
}

/* The message alone (no head, no trailing newline) to the callback. */
static void fr_log_to_sink(ferry_log_fn fn, void *arg, enum ferry_log_level level, const char *tag,
                           const char *fmt, va_list ap)
{
    char stack[1024], *heap = NULL, *msg = stack;
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(stack, sizeof stack, fmt, ap);
    if (n >= (int)sizeof stack && (heap = malloc((size_t)n + 1)) != NULL) {
        vsnprintf(heap, (size_t)n + 1, fmt, ap2);
        msg = heap;
    }
    va_end(ap2);
    if (n < 0)
        return;
    size_t len = strlen(msg);
    if (len > 0 && msg[len - 1] == '\n')
        msg[len - 1] = '\0';
    fn(arg, level, tag != NULL ? tag : "-", msg);
    free(heap);
}

void fr_log(enum ferry_log_level level, const char *tag, const char *fmt, ...)
{
    if (!fr_log_on(level))
        return;
    int saved_errno = errno; /* callers often log before returning -errno */
    char stack[1024];
    va_list ap;

    pthread_mutex_lock(&fr_log_sink_lock);
    ferry_log_fn sink = fr_log_sink;
    void *sink_arg = fr_log_sink_arg;
    pthread_mutex_unlock(&fr_log_sink_lock);
    if (sink != NULL) {
        va_start(ap, fmt);
        fr_log_to_sink(sink, sink_arg, level, tag, fmt, ap);
        va_end(ap);
        errno = saved_errno;
        return;
    }

    va_start(ap, fmt);
    int len = fr_log_format(stack, sizeof(stack), level, tag, fmt, ap);
    va_end(ap);
    if (len < 0)
        goto out;
    if ((size_t)len < sizeof(stack)) {
        fr_log_emit(stack, len);
        goto out;
    }
    /* Long line: format again into a buffer of the exact size, or truncate. */
    char *heap = malloc((size_t)len + 1);
    if (heap == NULL) {
        fr_log_emit(stack, (int)sizeof(stack) - 1);
        goto out;
    }
    va_start(ap, fmt);
    len = fr_log_format(heap, (size_t)len + 1, level, tag, fmt, ap);
    va_end(ap);
    if (len > 0)
        fr_log_emit(heap, len);
    free(heap);
out:
    errno = saved_errno;
}
