/* Progress lines on stderr for the demos and benchmarks (lab.h). */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "lab.h"

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
