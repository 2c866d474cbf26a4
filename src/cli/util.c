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
const char *cli_prog(void)
{
    return program_invocation_short_name;
}

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
    fprintf(stderr, "%s: %s wants a whole number from %llu to %llu, not '%s'\n", cli_prog(), opt,
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
    fprintf(stderr, "%s: %s wants a number from %.15g to %.15g, not '%s'\n", cli_prog(), opt, min, max, v);
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
        fprintf(stderr, "%s: %s wants a size: a number (decimals allowed) with K, M, G, T or P, "
                "with or without iB (binary units), such as %s; this is not one: '%s'\n", cli_prog(), opt, eg, v);
    else if (max == UINT64_MAX || x < min)
        fprintf(stderr, "%s: %s wants a size of at least %s (this one reads %s), not '%s'\n", cli_prog(), opt,
                lo, cli_fmt_size(x, got, sizeof got), v);
    else
        fprintf(stderr, "%s: %s wants a size of at most %s (this one reads %s), not '%s'\n", cli_prog(), opt,
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

int cli_layout_pair(const char *who, const char *model, const char *src_layout, const char *dst_layout,
                    uint32_t gpn, ferry_manifest **src, ferry_manifest **dst, uint64_t *model_bytes)
{
    ferry_error err = {0};
    *src = *dst = NULL;
    ferry_model *m;
    if (ferry_model_preset(model, &m, &err) < 0)
        goto fail;
    *model_bytes = ferry_model_bytes(m);
    ferry_layout ls, ld;
    int rc = ferry_layout_parse(src_layout, &ls, &err);
    if (rc == 0)
        rc = ferry_layout_parse(dst_layout, &ld, &err);
    if (rc == 0 && gpn)
        ls.gpus_per_node = ld.gpus_per_node = gpn;
    if (rc == 0)
        rc = ferry_layout_build(m, &ls, src, &err);
    if (rc == 0)
        rc = ferry_layout_build(m, &ld, dst, &err);
    ferry_model_free(m);
    if (rc == 0)
        return 0;
fail:
    fprintf(stderr, "%s: %s\n", who, err.msg[0] ? err.msg : ferry_strerror(err.code));
    ferry_manifest_close(*src);
    ferry_manifest_close(*dst);
    *src = *dst = NULL;
    return 1;
}
