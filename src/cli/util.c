/* CLI helpers: sizes, hex, clocks, progress, and the target child process. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* A size: digits, an optional fraction (".5"), an optional unit K, M, G,
 * T or P (either case; binary: K = 1024) with an optional "iB" or "B", so
 * "1.5G", "1.5GiB" and "1536M" are the same. Whole bytes: a fraction is
 * rounded down. 0 or -1 (not a size, 0 bytes, or too large). */
int cli_parse_size(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)s[0]))
        return -1;   /* strtoull would take spaces and a sign: "-1" is not 16 EiB */
    errno = 0;
    char *end;
    unsigned long long whole = strtoull(s, &end, 10);
    if (errno)
        return -1;
    uint64_t frac = 0, scale = 1;   /* the fraction's digits, and 10^their count */
    if (*end == '.') {
        end++;
        if (!isdigit((unsigned char)*end))
            return -1;
        for (; isdigit((unsigned char)*end); end++)
            if (scale < 1000000000000000000ull) {   /* 18 digits are plenty */
                frac = frac * 10 + (uint64_t)(*end - '0');
                scale *= 10;
            }
    }
    static const char units[] = "kmgtp";
    const char *u = *end ? strchr(units, tolower((unsigned char)*end)) : NULL;
    unsigned shift = u ? 10u * (unsigned)(u - units + 1) : 0;
    if (u)
        end++;
    if (u && *end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B' || (u && *end == 'b'))
        end++;
    if (*end != '\0' || (shift && whole > (UINT64_MAX >> shift)) || (!shift && frac))
        return -1;   /* trailing text, too large, or a fraction of a byte */
    uint64_t v = (uint64_t)whole << shift;
    /* the fraction of a unit: frac / scale of 2^shift, exact in 128 bits */
    unsigned __int128 part = ((unsigned __int128)frac << shift) / scale;
    if (part > UINT64_MAX - v || v + (uint64_t)part == 0)
        return -1;
    *out = v + (uint64_t)part;
    return 0;
}

int cli_parse_uint(const char *s, uint64_t *out)
{
    if (!*s)
        return -1;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p))
            return -1;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno)
        return -1;
    *out = v;
    return 0;
}

int cli_opt_uint(const char *opt, const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t x;
    if (cli_parse_uint(v, &x) == 0 && x >= min && x <= max) {
        *out = x;
        return 0;
    }
    fprintf(stderr, "ferry: %s wants a whole number from %llu to %llu, not '%s'\n", opt,
            (unsigned long long)min, (unsigned long long)max, v);
    return -1;
}

int cli_opt_unsigned(const char *opt, const char *v, unsigned min, unsigned max, unsigned *out)
{
    uint64_t x;
    if (cli_opt_uint(opt, v, min, max, &x) < 0)
        return -1;
    *out = (unsigned)x;
    return 0;
}

int cli_opt_double(const char *opt, const char *v, double min, double max, double *out)
{
    if (*v && !isspace((unsigned char)*v)) {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (end != v && !*end && errno != ERANGE && isfinite(x) && x >= min && x <= max) {
            *out = x;
            return 0;
        }
    }
    fprintf(stderr, "ferry: %s wants a number from %.15g to %.15g, not '%s'\n", opt, min, max, v);
    return -1;
}

int cli_opt_size(const char *opt, const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t x;
    int parsed = cli_parse_size(v, &x);
    if (parsed == 0 && x >= min && x <= max) {
        *out = x;
        return 0;
    }
    char lo[32], hi[32], got[32];
    cli_fmt_size(min, lo, sizeof lo);
    cli_fmt_size(max, hi, sizeof hi);
    const char *eg = min >= (1u << 20) ? "64M, 1.5G or 2TiB" : "64K, 4M or 1.5G";
    if (parsed < 0)
        fprintf(stderr, "ferry: %s wants a size: a number (decimals allowed) with K, M, G, T or P, "
                "with or without iB (binary units), such as %s; this is not one: '%s'\n", opt, eg, v);
    else if (max == UINT64_MAX || x < min)
        fprintf(stderr, "ferry: %s wants a size of at least %s (this one reads %s), not '%s'\n", opt,
                lo, cli_fmt_size(x, got, sizeof got), v);
    else
        fprintf(stderr, "ferry: %s wants a size of at most %s (this one reads %s), not '%s'\n", opt,
                hi, cli_fmt_size(x, got, sizeof got), v);
    return -1;
}

bool cli_is_help(const char *a)
{
    return !strcmp(a, "-h") || !strcmp(a, "--help");
}

int cli_usage_exit(int pr, void (*usage)(FILE *f))
{
    if (pr == CLI_HELP) {
        usage(stdout);
        return 0;
    }
    fputc('\n', stderr);
    usage(stderr);
    return 2;
}

const char *cli_fmt_size(uint64_t n, char *buf, size_t len)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    double v = (double)n;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    if (v == (double)(uint64_t)v)
        snprintf(buf, len, "%llu %s", (unsigned long long)v, u[i]);
    else
        snprintf(buf, len, "%.1f %s", v, u[i]);
    return buf;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

size_t cli_unhex(const char *s, uint8_t *out, size_t cap)
{
    size_t n = 0;
    for (; isxdigit((unsigned char)s[0]) && isxdigit((unsigned char)s[1]) && n < cap; s += 2) {
        char tmp[3] = {s[0], s[1], 0};
        out[n++] = (uint8_t)strtoul(tmp, NULL, 16);
    }
    return n;
}

/* Progress of this process (one per process: a child reports its own). */
static double g_last_progress, g_progress_t0;
static bool g_progress_shown;

/* Seconds between status lines when stderr is not a terminal:
 * FERRY_PROGRESS_SECONDS (0: every update), default 5. */
static double progress_period(void)
{
    const char *e = getenv("FERRY_PROGRESS_SECONDS");
    char *end;
    double v = e && *e ? strtod(e, &end) : 5;
    return e && *e && (*end || !(v >= 0 && v <= 86400)) ? 5 : v;
}

/* One status text: on a terminal the `\r` line it replaces, at most 20
 * times a second; elsewhere (a file, a pipe, a CI log) a whole line at
 * most every progress_period() seconds, so a log grows by a line at a
 * time and never holds a `\r`. */
static void progress_emit(const char *text, bool last)
{
    double now = cli_now();
    if (g_progress_t0 == 0)
        g_progress_t0 = now;
    if (isatty(2)) {
        if (now - g_last_progress < 0.05 && !last)
            return;
        g_last_progress = now;
        fprintf(stderr, "\r  %-72.72s", text);
        fflush(stderr);
        return;
    }
    if (g_progress_shown && now - g_last_progress < progress_period())
        return;
    g_progress_shown = true;
    g_last_progress = now;
    fprintf(stderr, "ferry: progress: %s (%.0f s)\n", text, now - g_progress_t0);
}

void cli_progress(const char *what, double frac)
{
    int w = 30, filled = (int)(frac * w + 0.5);
    char bar[32], text[128];
    for (int i = 0; i < w; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[w] = 0;
    if (isatty(2))
        snprintf(text, sizeof text, "%-28s [%s] %3.0f%%", what, bar, frac * 100);
    else
        snprintf(text, sizeof text, "%s %.0f%%", what, frac * 100);
    progress_emit(text, frac >= 1.0);
}

void cli_progress_text(const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    progress_emit(text, false);
}

void cli_progress_done(void)
{
    if (isatty(2))
        fprintf(stderr, "\r%80s\r", "");
}

/* ---- target child ------------------------------------------------------ */

int cli_target_start(cli_target *t, const char *self, uint64_t size, const char *listen)
{
    memset(t, 0, sizeof *t);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return FERRY_EIO;
    char sz[32];
    snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
    pid_t pid = fork();
    if (pid < 0)
        return FERRY_EIO;
    if (pid == 0) {
        /* a demo's parent blocks these for its signal thread; exec keeps the mask */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        const char *exe = access("/proc/self/exe", X_OK) == 0 ? "/proc/self/exe" : self;
        execl(exe, "ferry", "_target", "--size", sz, "--listen", listen ? listen : "127.0.0.1:0", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    t->pid = pid;
    t->in = fdopen(in[1], "w");
    t->out = fdopen(out[0], "r");
    char line[1024];
    if (!fgets(line, sizeof line, t->out) || strncmp(line, "READY ", 6) != 0) {
        fprintf(stderr, "ferry: target process failed to start%s%s", line[0] ? ": " : "\n", line);
        cli_target_stop(t);
        return FERRY_EIO;
    }
    char *sp = strchr(line + 6, ' ');
    t->desc_len = cli_unhex(line + 6, t->desc, sizeof t->desc);
    t->sink_port = sp ? (unsigned)strtoul(sp + 1, NULL, 10) : 0;
    return 0;
}

int cli_target_cmd(cli_target *t, char *reply, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->in, fmt, ap);
    va_end(ap);
    fputc('\n', t->in);
    fflush(t->in);
    char tmp[256];
    if (!reply) {
        reply = tmp;
        cap = sizeof tmp;
    }
    if (!fgets(reply, (int)cap, t->out))
        return -1;
    reply[strcspn(reply, "\n")] = 0;
    return strncmp(reply, "OK", 2) == 0 ? 0 : -1;
}

void cli_target_stop(cli_target *t)
{
    if (t->in) {
        fputs("quit\n", t->in);
        fclose(t->in);
    }
    if (t->out)
        fclose(t->out);
    if (t->pid > 0) {
        int st;
        /* The child exits on "quit" or on EOF of its stdin; reap it. */
        waitpid(t->pid, &st, 0);
    }
    memset(t, 0, sizeof *t);
}
