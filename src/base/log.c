/* Logging: one level and one format for the process, lines to stderr or to
 * a callback. A line on stderr is
 *   2025-01-31T12:34:56.789Z ferry[1234] WARN master: the message
 * or, with FERRY_LOG_FORMAT=json (ferry_log_set_format), one JSON object
 *   {"ts":"2025-01-31T12:34:56.789Z","level":"warn","subsystem":"master","pid":1234,"msg":"..."}
 * (docs/operations.md, "Logs"). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/base.h"

/* The only process-wide state of the base layer: the threshold below which
 * lines are dropped and the line format, seeded once from FERRY_LOG and
 * FERRY_LOG_FORMAT. */
static atomic_int fr_log_level = FERRY_LOG_WARN;
static atomic_int fr_log_fmt = FERRY_LOG_TEXT;
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
static const char *const fr_level_json[] = {
    [FERRY_LOG_DEBUG] = "debug",
    [FERRY_LOG_INFO] = "info",
    [FERRY_LOG_WARN] = "warn",
    [FERRY_LOG_ERROR] = "error",
};

/* Unrecognised values keep the defaults rather than silencing the library
 * or garbling its lines. */
static void fr_log_read_env(void)
{
    static const struct { const char *name; enum ferry_log_level level; } map[] = {
        { "debug", FERRY_LOG_DEBUG }, { "info", FERRY_LOG_INFO },
        { "warn", FERRY_LOG_WARN },   { "warning", FERRY_LOG_WARN },
        { "error", FERRY_LOG_ERROR }, { "off", FERRY_LOG_OFF },
        { "none", FERRY_LOG_OFF },
    };
    const char *env = getenv("FERRY_LOG");

    for (size_t i = 0; env != NULL && i < sizeof(map) / sizeof(map[0]); i++) {
        if (strcasecmp(env, map[i].name) == 0) {
            atomic_store(&fr_log_level, map[i].level);
            break;
        }
    }
    const char *fmt = getenv("FERRY_LOG_FORMAT");
    if (fmt != NULL && strcasecmp(fmt, "json") == 0)
        atomic_store(&fr_log_fmt, FERRY_LOG_JSON);
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

void ferry_log_set_format(enum ferry_log_format format)
{
    fr_log_init();
    atomic_store(&fr_log_fmt, format == FERRY_LOG_JSON ? FERRY_LOG_JSON : FERRY_LOG_TEXT);
}

enum ferry_log_format ferry_log_get_format(void)
{
    fr_log_init();
    return (enum ferry_log_format)atomic_load(&fr_log_fmt);
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

int fr_log_timestamp(char out[FR_LOG_TS_LEN + 1])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (gmtime_r(&ts.tv_sec, &tm) == NULL ||
        strftime(out, FR_LOG_TS_LEN + 1, "%Y-%m-%dT%H:%M:%S", &tm) != 19) {
        snprintf(out, FR_LOG_TS_LEN + 1, "0000-00-00T00:00:00.000Z");
        return -1;
    }
    unsigned ms = (unsigned)(ts.tv_nsec / 1000000) % 1000u;
    out[19] = '.';
    out[20] = (char)('0' + ms / 100);
    out[21] = (char)('0' + ms / 10 % 10);
    out[22] = (char)('0' + ms % 10);
    out[23] = 'Z';
    out[24] = '\0';
    return 0;
}

/* One write() per call: concurrent lines may reorder but never interleave. */
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

size_t fr_utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (k == 0 || c > 0xf4 || n < k)
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) ||
        (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
        return 0;
    return k;
}

size_t fr_json_escape(char *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c == '\n' || c == '\t' || c == '\r') {
            out[o++] = '\\';
            out[o++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(out + o, "\\u00", 4);
            out[o + 4] = hex[c >> 4];
            out[o + 5] = hex[c & 15];
            o += 6;
        } else if (c < 0x80) {
            out[o++] = (char)c;
        } else {
            size_t k = fr_utf8_seq_len(p + i, n - i);
            if (k == 0) {   /* not UTF-8: U+FFFD keeps the line valid JSON */
                memcpy(out + o, "\\ufffd", 6);
                o += 6;
                i++;
                continue;
            }
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
            continue;
        }
        i++;
    }
    return o;
}

/* The message of one call as text, without its trailing newline: in stack
 * (cap bytes) or in *heap when longer (NULL: truncated to the stack). */
static const char *fr_log_message(char *stack, size_t cap, char **heap, size_t *len,
                                  const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(stack, cap, fmt, ap);
    const char *msg = stack;
    *heap = NULL;
    if (n < 0) {
        stack[0] = '\0';
        n = 0;
    } else if ((size_t)n >= cap) {
        *heap = malloc((size_t)n + 1);
        if (*heap != NULL && vsnprintf(*heap, (size_t)n + 1, fmt, ap2) == n)
            msg = *heap;
        else
            n = (int)cap - 1;
    }
    va_end(ap2);
    size_t l = (size_t)n;
    if (l > 0 && msg[l - 1] == '\n')
        l--;
    *len = l;
    return msg;
}

/* The whole output of one call into out (room for fr_log_need bytes). In
 * text every line of a message that spans several gets the head, so that
 * each line on stderr carries its time, level, subsystem and pid. */
static size_t fr_log_need(size_t len, size_t tag_len, bool json, size_t nl)
{
    size_t head = FR_LOG_TS_LEN + 128 + tag_len * 6;   /* the fixed text, pid and level */
    return json ? head + 6 * len + 8 : (head + 1) * (nl + 1) + len + 1;
}

static size_t fr_log_render(char *out, enum ferry_log_level level, const char *tag,
                            const char *msg, size_t len, bool json)
{
    char ts[FR_LOG_TS_LEN + 1];
    fr_log_timestamp(ts);
    size_t o = 0;
    if (json) {
        o += (size_t)sprintf(out, "{\"ts\":\"%s\",\"level\":\"%s\",\"subsystem\":\"", ts,
                             fr_level_json[level]);
        o += fr_json_escape(out + o, tag, strlen(tag));
        o += (size_t)sprintf(out + o, "\",\"pid\":%ld,\"msg\":\"", (long)getpid());
        o += fr_json_escape(out + o, msg, len);
        memcpy(out + o, "\"}\n", 3);
        return o + 3;
    }
    char head[FR_LOG_TS_LEN + 128];
    int hn = snprintf(head, sizeof head, "%s ferry[%ld] %s %.64s: ", ts, (long)getpid(),
                      fr_level_names[level], tag);
    size_t h = hn < 0 ? 0 : (size_t)hn < sizeof head ? (size_t)hn : sizeof head - 1;
    const char *p = msg, *end = msg + len;
    do {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        memcpy(out + o, head, h);
        o += h;
        memcpy(out + o, p, (size_t)(e - p));
        o += (size_t)(e - p);
        out[o++] = '\n';
        p = nl ? nl + 1 : end;
    } while (p < end);
    return o;
}

static size_t count_nl(const char *s, size_t n)
{
    size_t k = 0;
    for (const char *p = s; (p = memchr(p, '\n', n - (size_t)(p - s))) != NULL; p++)
        k++;
    return k;
}

void fr_log(enum ferry_log_level level, const char *tag, const char *fmt, ...)
{
    if (!fr_log_on(level))
        return;
    int saved_errno = errno; /* callers often log before returning -errno */
    if (tag == NULL)
        tag = "-";
    char mstack[1024], *mheap = NULL;
    size_t len;
    va_list ap;
    va_start(ap, fmt);
    const char *msg = fr_log_message(mstack, sizeof mstack, &mheap, &len, fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&fr_log_sink_lock);
    ferry_log_fn sink = fr_log_sink;
    void *sink_arg = fr_log_sink_arg;
    pthread_mutex_unlock(&fr_log_sink_lock);
    if (sink != NULL) {
        /* The message alone: the embedder adds its own time and head. */
        char *m = (char *)msg;
        m[len] = '\0';
        sink(sink_arg, level, tag, m);
        goto out;
    }

    bool json = ferry_log_get_format() == FERRY_LOG_JSON;
    size_t tl = strlen(tag);
    if (tl > 64)
        tl = 64;
    size_t need = fr_log_need(len, tl, json, json ? 0 : count_nl(msg, len));
    char lstack[4096], *line = lstack, *lheap = NULL;
    if (need > sizeof lstack && (lheap = malloc(need)) != NULL)
        line = lheap;
    else   /* out of memory: a truncated line beats none */
        while (len > 0 && fr_log_need(len, tl, json, json ? 0 : count_nl(msg, len)) > sizeof lstack)
            len /= 2;
    char tagbuf[65];
    memcpy(tagbuf, tag, tl);
    tagbuf[tl] = '\0';
    fr_write_all(line, fr_log_render(line, level, tagbuf, msg, len, json));
    free(lheap);
out:
    free(mheap);
    errno = saved_errno;
}
