/* `ferry master --metrics` and `ferry node --metrics`: the pages parse as
 * Prometheus text format (a checker below), the counters move with the
 * operations the test performs, and hostile or slow HTTP clients leave the
 * master serving. Scrapes go through curl over 127.0.0.1 only. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "util/ftetcd.h"
#include "util/ftstore.h"

#define DEADLINE_MS 60000u  /* a generous deadline on every condition */

static ft_cluster C;
static ferry_store *S;
static char murl[128], nurl[128];     /* http://127.0.0.1:PORT/metrics */
static char page[1 << 20];

/* ---- the exposition-format checker ------------------------------------------ */

typedef struct family { char name[128], type[16]; bool help, done; } family;

static bool alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* [a-zA-Z_:][a-zA-Z0-9_:]* (labels: no colons) */
static bool name_ok(const char *s, size_t n, bool colon)
{
    if (n == 0 || !(alpha(s[0]) || (colon && s[0] == ':')))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(alpha(s[i]) || (s[i] >= '0' && s[i] <= '9') || (colon && s[i] == ':')))
            return false;
    return true;
}

static bool value_ok(const char *s, double *v)
{
    if (!strcmp(s, "+Inf") || !strcmp(s, "-Inf") || !strcmp(s, "NaN")) {
        *v = !strcmp(s, "NaN") ? NAN : s[0] == '+' ? INFINITY : -INFINITY;
        return true;
    }
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return end != s && *end == '\0' && errno == 0;
}

/* Labels {a="x",b="y"} at *p: valid names, escapes only \\ \" \n, no name
 * twice; le's value copied out. */
static bool labels_ok(const char **p, char *le, size_t lecap, char *why, size_t wcap)
{
    const char *s = *p + 1;
    char seen[16][64];
    size_t nseen = 0;
    le[0] = '\0';
    while (*s != '}') {
        size_t n = strcspn(s, "=");
        if (!name_ok(s, n, false) || s[n] != '=' || s[n + 1] != '"' || n >= 64 || nseen == 16) {
            snprintf(why, wcap, "bad label name at '%.20s'", s);
            return false;
        }
        for (size_t i = 0; i < nseen; i++)
            if (strlen(seen[i]) == n && !strncmp(seen[i], s, n)) {
                snprintf(why, wcap, "label %.*s twice", (int)n, s);
                return false;
            }
        snprintf(seen[nseen++], 64, "%.*s", (int)n, s);
        bool is_le = n == 2 && !strncmp(s, "le", 2);
        s += n + 2;
        size_t o = 0;
        while (*s != '"') {
            if (*s == '\0' || *s == '\n') {
                snprintf(why, wcap, "unterminated label value");
                return false;
            }
            if (*s == '\\') {
                if (s[1] != '\\' && s[1] != '"' && s[1] != 'n') {
                    snprintf(why, wcap, "bad escape \\%c", s[1]);
                    return false;
                }
                s++;
            }
            if (is_le && o + 1 < lecap)
                le[o++] = *s;
            s++;
        }
        if (is_le)
            le[o] = '\0';
        s++;
        if (*s == ',')
            s++;
        else if (*s != '}') {
            snprintf(why, wcap, "expected , or } at '%.20s'", s);
            return false;
        }
    }
    *p = s + 1;
    return true;
}

/* The whole page: every line a HELP, a TYPE or a sample of a declared
 * family, families contiguous and declared once, counters not negative,
 * histograms cumulative with +Inf equal to _count, no series twice. NULL if
 * it is valid, else why not. */
static const char *check_exposition(const char *text)
{
    static char why[512];
    static family fam[256];
    static char series[4096][256];
    size_t nfam = 0, nseries = 0;
    family *cur = NULL;
    double last_bucket = -1, inf_bucket = -1;
    if (text[0] == '\0' || text[strlen(text) - 1] != '\n')
        return "the page does not end with a newline";
    char *copy = strdup(text);
    for (char *line = copy, *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
        *nl = '\0';
        if (line[0] == '#') {
            char kw[8], name[128], rest[256] = "";
            if (sscanf(line, "# %7s %127s %255[^\n]", kw, name, rest) < 2)
                continue;   /* a plain comment */
            if (strcmp(kw, "HELP") && strcmp(kw, "TYPE"))
                continue;
            if (!name_ok(name, strlen(name), true)) {
                snprintf(why, sizeof why, "bad family name in '%s'", line);
                goto bad;
            }
            family *f = NULL;
            for (size_t i = 0; i < nfam; i++)
                if (!strcmp(fam[i].name, name))
                    f = &fam[i];
            if (f == NULL) {
                f = &fam[nfam++];
                memset(f, 0, sizeof *f);
                snprintf(f->name, sizeof f->name, "%s", name);
            } else if (f->done || (kw[0] == 'H' ? f->help : f->type[0] != '\0')) {
                snprintf(why, sizeof why, "%s of %s twice or after its samples", kw, name);
                goto bad;
            }
            if (cur && cur != f)
                cur->done = true;
            cur = f;
            if (kw[0] == 'H') {
                f->help = true;
            } else {
                if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram") &&
                    strcmp(rest, "summary") && strcmp(rest, "untyped")) {
                    snprintf(why, sizeof why, "bad type '%s' of %s", rest, name);
                    goto bad;
                }
                snprintf(f->type, sizeof f->type, "%.15s", rest);
                last_bucket = inf_bucket = -1;
            }
            continue;
        }
        if (line[0] == '\0') {
            snprintf(why, sizeof why, "an empty line");
            goto bad;
        }
        const char *p = line;
        size_t n = strcspn(p, "{ ");
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)n, p);
        if (!name_ok(p, n, true)) {
            snprintf(why, sizeof why, "bad metric name in '%s'", line);
            goto bad;
        }
        p += n;
        char le[32] = "";
        if (*p == '{' && !labels_ok(&p, le, sizeof le, why, sizeof why))
            goto bad;
        if (*p != ' ') {
            snprintf(why, sizeof why, "no value in '%s'", line);
            goto bad;
        }
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(p - line), line);
        for (size_t i = 0; i < nseries; i++)
            if (!strcmp(series[i], key)) {
                snprintf(why, sizeof why, "series %s twice", key);
                goto bad;
            }
        if (nseries < 4096)
            snprintf(series[nseries++], sizeof series[0], "%s", key);
        double v;
        char val[64];
        if (sscanf(p + 1, "%63s", val) != 1 || !value_ok(val, &v)) {
            snprintf(why, sizeof why, "bad value in '%s'", line);
            goto bad;
        }
        /* the sample belongs to the family declared last */
        const char *base = cur ? cur->name : "";
        size_t bl = strlen(base);
        const char *suffix = strncmp(name, base, bl) == 0 ? name + bl : NULL;
        bool hist = cur && !strcmp(cur->type, "histogram");
        if (cur == NULL || cur->type[0] == '\0' || suffix == NULL ||
            (suffix[0] && !(hist && (!strcmp(suffix, "_bucket") || !strcmp(suffix, "_sum") ||
                                     !strcmp(suffix, "_count"))))) {
            snprintf(why, sizeof why, "sample %s outside a declared family (last: %s)", name, base);
            goto bad;
        }
        if (!strcmp(cur->type, "counter") && !(v >= 0)) {
            snprintf(why, sizeof why, "counter %s is %g", key, v);
            goto bad;
        }
        if (hist && !strcmp(suffix, "_bucket")) {
            if (le[0] == '\0' || v < last_bucket) {
                snprintf(why, sizeof why, "bucket %s not cumulative or without le", key);
                goto bad;
            }
            last_bucket = v;
            if (!strcmp(le, "+Inf"))
                inf_bucket = v;
        }
        if (hist && !strcmp(suffix, "_count") && v != inf_bucket) {
            snprintf(why, sizeof why, "%s is %g but the +Inf bucket %g", key, v, inf_bucket);
            goto bad;
        }
    }
    free(copy);
    return NULL;
bad:
    free(copy);
    return why;
}

/* ---- scraping ------------------------------------------------------------------- */

/* The page at url into page: NULL, or why it could not be had or parsed. */
static const char *try_scrape(const char *url)
{
    static char why[256];
    int st = ft_run(page, sizeof page, "curl -sS --fail --max-time 60 '%s'", url);
    if (st != 0) {
        snprintf(why, sizeof why, "curl %s exited with %d: %.100s", url, st, page);
        return why;
    }
    const char *bad = check_exposition(page);
    if (bad)
        snprintf(why, sizeof why, "%s is not valid exposition text: %s", url, bad);
    return bad ? why : NULL;
}

static void scrape(const char *url)
{
    const char *why = try_scrape(url);
    if (why)
        fail_msg("%s", why);
}

/* The value of one series ("name{labels}" exactly as printed), -1 if absent. */
static double value_in(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)) != NULL; p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

static double metric(const char *url, const char *series)
{
    scrape(url);
    return value_in(page, series);
}

/* Scrape until series reaches at least want (the loop publishes a fresh
 * snapshot at most every 100 ms) or the deadline passes: its last value, -1
 * when a scrape failed. Never ends the test. */
static double try_wait_metric(const char *url, const char *series, double want)
{
    double v = -1;
    uint64_t end = fr_now_ms() + DEADLINE_MS;
    while (try_scrape(url) == NULL && (v = value_in(page, series)) < want && fr_now_ms() < end) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return v;
}

static double wait_metric(const char *url, const char *series, double want)
{
    double v = try_wait_metric(url, series, want);
    if (v < want)
        fail_msg("%s stayed %g, below %g, for %d s", series, v, want, DEADLINE_MS / 1000);
    return v;
}

/* The HTTP status curl gets for `curl ARGS URL` (negative: curl failed). */
static int http_code(const char *args, const char *url)
{
    char out[64];
    int st = ft_run(out, sizeof out, "curl -s -o /dev/null -w '%%{http_code}' --max-time 60 %s '%s'",
                    args, url);
    return st == 0 ? atoi(out) : -st;
}

/* "http://..." after "metrics on " in a process's line. */
static void url_from(ft_peer *p, char url[128])
{
    char line[512];
    assert_int_equal(ft_read_line(p, line, sizeof line, 30000), 0);
    const char *at = strstr(line, "metrics on ");
    if (at == NULL)
        fail_msg("no metrics line: %s", line);
    assert_int_equal(sscanf(at + 11, "%127s", url), 1);
    assert_int_equal(strncmp(url, "http://127.0.0.1:", 17), 0);
}

static int setup(void **state)
{
    (void)state;
    const char *extra[] = { "--metrics", "127.0.0.1:0", "--grace", "300", NULL };
    if (ft_master_start(&C, NULL, extra) != 0)
        return -1;
    url_from(&C.master, murl);
    const char *args[] = { "node", "--master", C.addr, "--size", "16M", "--heartbeat", "100",
                           "--metrics", "127.0.0.1:0", NULL };
    char line[512];
    if (ft_spawn_exe(&C.node[0], NULL, ft_ferry_bin(), args) != 0 ||
        ft_read_line(&C.node[0], line, sizeof line, 30000) != 0 || !strstr(line, "mounted"))
        return -1;
    url_from(&C.node[0], nurl);
    ferry_store_config cfg;
    ft_store_config(&C, &cfg);
    cfg.lease_ms = 1;
    return ferry_store_open(&cfg, &S, NULL) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    ferry_store_close(S);
    S = NULL;
    ft_cluster_stop(&C);
    return 0;
}

/* ---- tests ---------------------------------------------------------------------- */

/* Both pages parse and have every family the docs list; the checker itself
 * refuses what it must. */
static void test_format(void **state)
{
    (void)state;
    assert_non_null(check_exposition("# TYPE a counter\na -1\n"));
    assert_non_null(check_exposition("a 1\n"));
    assert_non_null(check_exposition("# TYPE a gauge\na{x=\"\\q\"} 1\n"));
    assert_non_null(check_exposition("# TYPE a gauge\na 1\na 2\n"));
    assert_non_null(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                     "h_bucket{le=\"+Inf\"} 1\nh_count 1\n"));
    assert_null(check_exposition("# HELP a x\n# TYPE a gauge\na{x=\"\\\"\\n\"} +Inf\n"));
    scrape(murl);
    const char *families[] = {
        "ferry_master_requests_total", "ferry_master_request_errors_total",
        "ferry_master_put_bytes_total", "ferry_master_get_object_bytes_total", "ferry_master_objects",
        "ferry_master_segment_used_bytes", "ferry_master_segment_free_bytes",
        "ferry_master_connections", "ferry_master_handshakes_refused_total",
        "ferry_master_wal_commit_seconds", "ferry_master_evictions_total",
        "ferry_master_objects_lost_total", "ferry_master_queue_ready_records",
        "ferry_master_queue_redeliveries_total", "ferry_master_object_leases_total",
        "ferry_master_queue_leased_records", "ferry_master_nodes",
    };
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        char t[160];
        snprintf(t, sizeof t, "# TYPE %s ", families[i]);
        if (!strstr(page, t))
            fail_msg("no family %s on the master's page", families[i]);
    }
    /* The page is a snapshot the loop refreshes at most every 100 ms: the one
     * scraped above may predate the node's mount, so wait for it. */
    assert_true(wait_metric(murl, "ferry_master_connections{role=\"node\"}", 1) >= 1);
    assert_true(wait_metric(murl, "ferry_master_segments", 1) == 1);
    assert_true(wait_metric(nurl, "ferry_node_registrations_total", 1) == 1);
    wait_metric(nurl, "ferry_node_mounted", 1);
    assert_true(value_in(page, "ferry_node_mounted") == 1);
    assert_true(value_in(page, "ferry_node_segment_bytes") == 16 << 20);
    assert_non_null(strstr(page, "# TYPE ferry_node_served_bytes_total counter"));
}

/* Puts, gets, a miss, a KV put: each moves its counters by exactly what was
 * done (this test is the master's only client meanwhile). */
static void test_counters_move(void **state)
{
    (void)state;
    scrape(murl);
    double put0 = value_in(page, "ferry_master_requests_total{op=\"put_start\"}");
    double end0 = value_in(page, "ferry_master_requests_total{op=\"put_end\"}");
    double pb0 = value_in(page, "ferry_master_put_bytes_total");
    double gb0 = value_in(page, "ferry_master_get_object_bytes_total");
    double err0 = value_in(page, "ferry_master_request_errors_total{op=\"get_replicas\"}");
    double obj0 = value_in(page, "ferry_master_objects{state=\"complete\"}");
    double kv0 = value_in(page, "ferry_master_requests_total{op=\"kv_put\"}");
    double wal0 = value_in(page, "ferry_master_wal_commit_seconds_count");
    double lease0 = value_in(page, "ferry_master_object_leases_total");
    double bytes0 = value_in(page, "ferry_master_object_bytes");
    assert_true(put0 >= 0 && pb0 >= 0 && err0 >= 0 && obj0 >= 0 && wal0 >= 0);
    static uint8_t buf[3000];
    const size_t sizes[] = { 1000, 2000, 3000 };
    for (int i = 0; i < 3; i++) {
        char key[32];
        snprintf(key, sizeof key, "mx/counters/%d", i);
        assert_int_equal(ferry_store_put(S, key, buf, sizes[i], NULL, NULL, NULL), 0);
        size_t got = 0;
        assert_int_equal(ferry_store_get_into(S, key, buf, sizeof buf, &got, NULL), 0);
        assert_int_equal(got, sizes[i]);
    }
    size_t got;
    assert_int_equal(ferry_store_get_into(S, "mx/no-such-key", buf, sizeof buf, &got, NULL), FERRY_ENOENT);
    assert_int_equal(ferry_kv_put(S, "mx/kv", "v", 1, NULL, NULL), 0);
    wait_metric(murl, "ferry_master_requests_total{op=\"kv_put\"}", kv0 + 1);
    assert_true(value_in(page, "ferry_master_requests_total{op=\"put_start\"}") == put0 + 3);
    assert_true(value_in(page, "ferry_master_requests_total{op=\"put_end\"}") == end0 + 3);
    assert_true(value_in(page, "ferry_master_put_bytes_total") == pb0 + 6000);
    assert_true(value_in(page, "ferry_master_get_object_bytes_total") == gb0 + 6000);
    assert_true(value_in(page, "ferry_master_request_errors_total{op=\"get_replicas\"}") == err0 + 1);
    assert_true(value_in(page, "ferry_master_objects{state=\"complete\"}") == obj0 + 3);
    assert_true(value_in(page, "ferry_master_object_bytes") == bytes0 + 6000);
    assert_true(value_in(page, "ferry_master_object_leases_total") == lease0 + 3);   /* lease_ms 1 */
    /* every acknowledged change was committed to the log first */
    assert_true(value_in(page, "ferry_master_wal_commit_seconds_count") > wal0);
    assert_true(value_in(page, "ferry_master_wal_commit_seconds_sum") > 0);
}

/* A client with the wrong token is refused at the handshake: counted by
 * reason. */
static void test_refused_handshake(void **state)
{
    (void)state;
    double a0 = metric(murl, "ferry_master_handshakes_refused_total{reason=\"auth\"}");
    assert_true(a0 >= 0);
    ferry_store_config cfg;
    ft_store_config(&C, &cfg);
    memset(cfg.engine.token, 'x', 32);
    cfg.engine.token_len = 32;
    cfg.timeout_ms = 3000;
    ferry_store *bad = NULL;
    assert_int_not_equal(ferry_store_open(&cfg, &bad, NULL), 0);
    wait_metric(murl, "ferry_master_handshakes_refused_total{reason=\"auth\"}", a0 + 1);
}

/* Records whose lease lapses are delivered again (counted), the queue's
 * depth is shown under its name, escaped: quote, backslash, newline, UTF-8
 * kept, a byte that is not UTF-8 as U+FFFD. */
static void test_queues(void **state)
{
    (void)state;
    const char *q = "mx \"q\\\n\xc3\xa9\xff";
    const char *label = "mx \\\"q\\\\\\n\xc3\xa9\xef\xbf\xbd";
    double r0 = metric(murl, "ferry_master_queue_redeliveries_total{reason=\"lease_expired\"}");
    assert_true(r0 >= 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ferry_queue_push(S, q, "rec", 3, NULL, NULL), 0);
    ferry_qrecord rec[1];
    size_t n = 0;
    assert_int_equal(ferry_queue_pop(S, q, 1, 1, rec, &n, NULL), 0);
    assert_int_equal(n, 1);
    ferry_qrecords_free(rec, n);
    wait_metric(murl, "ferry_master_queue_redeliveries_total{reason=\"lease_expired\"}", r0 + 1);
    char series[160];
    snprintf(series, sizeof series, "ferry_master_queue_ready_records{queue=\"%s\"}", label);
    double ready = value_in(page, series);
    snprintf(series, sizeof series, "ferry_master_queue_leased_records{queue=\"%s\"}", label);
    double leased = value_in(page, series);
    assert_true(ready >= 0 && leased >= 0);
    assert_true(ready + leased == 3);
}

/* A client whose engine speaks tcp: the node serves its write and its read
 * and counts the bytes by transport. */
static void test_node_served(void **state)
{
    (void)state;
    scrape(nurl);
    double w0 = value_in(page, "ferry_node_served_bytes_total{transport=\"tcp\",op=\"write\"}");
    double r0 = value_in(page, "ferry_node_served_bytes_total{transport=\"tcp\",op=\"read\"}");
    assert_true(w0 >= 0 && r0 >= 0);
    ferry_store_config cfg;
    ft_store_config(&C, &cfg);
    snprintf(cfg.engine.transport, sizeof cfg.engine.transport, "tcp");
    cfg.lease_ms = 1;
    ferry_store *t = NULL;
    assert_int_equal(ferry_store_open(&cfg, &t, NULL), 0);
    size_t len = 1 << 20;
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    ft_pattern(buf, len, 7, 0);
    assert_int_equal(ferry_store_put(t, "mx/tcp", buf, len, NULL, NULL, NULL), 0);
    memset(buf, 0, len);
    size_t got = 0;
    assert_int_equal(ferry_store_get_into(t, "mx/tcp", buf, len, &got, NULL), 0);
    assert_int_equal(got, len);
    ferry_store_close(t);
    free(buf);
    scrape(nurl);   /* the node's counters are read live: no snapshot to wait for */
    assert_true(value_in(page, "ferry_node_served_bytes_total{transport=\"tcp\",op=\"write\"}") >=
                w0 + (double)len);
    assert_true(value_in(page, "ferry_node_served_bytes_total{transport=\"tcp\",op=\"read\"}") >=
                r0 + (double)len);
}

static int connect_to(const char *url)
{
    unsigned port = 0;
    assert_int_equal(sscanf(url, "http://127.0.0.1:%u/", &port), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;   /* the server may hang up on garbage: that is its right */
        c += w;
        n -= (size_t)w;
    }
}

/* Read until the server closes or answers (or the deadline): how it reacts
 * is its business, as long as it stays up for everyone else. */
static void drain(int fd)
{
    char b[4096];
    uint64_t end = fr_now_ms() + DEADLINE_MS;
    while (fr_now_ms() < end) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 1000) > 0 && recv(fd, b, sizeof b, 0) <= 0)
            return;
    }
}

/* Garbage, a request line too long, headers past the memory limit, NUL
 * bytes, a request cut off and held open, a client that sends requests and
 * never reads the answers, methods and paths that are not /metrics: the
 * master keeps answering its store clients and the page keeps coming. */
static void test_hostile_http(void **state)
{
    (void)state;
    char other[160];
    snprintf(other, sizeof other, "%.*s/other", (int)(strlen(murl) - strlen("/metrics")), murl);
    assert_int_equal(http_code("", other), 404);
    assert_int_equal(http_code("-X POST --data x", murl), 405);
    assert_int_equal(http_code("-X DELETE", murl), 405);
    assert_int_equal(http_code("-I", murl), 200);
    double g0 = metric(murl, "ferry_master_requests_total{op=\"get_replicas\"}");

    /* one after the other, each closed by us or by the server */
    static char big[300 << 10];
    const char *junk[] = { "GARBAGE\r\n\r\n", "GET /metrics HTTP/9.9\r\n\r\n",
                           "GET /metrics\r\n\r\n", "\r\n\r\n\r\n", "GET  HTTP/1.1\r\n\r\n",
                           "GET /%00%ff/../metrics HTTP/1.1\r\nHost: x\r\n\r\n" };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        int fd = connect_to(murl);
        send_all(fd, junk[i], strlen(junk[i]));
        drain(fd);
        close(fd);
    }
    int fd = connect_to(murl);   /* a request line of 300 KiB */
    memset(big, 'a', sizeof big);
    memcpy(big, "GET /", 5);
    send_all(fd, big, sizeof big);
    drain(fd);
    close(fd);
    fd = connect_to(murl);   /* headers of 300 KiB */
    send_all(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ", 39);
    send_all(fd, big + 5, sizeof big - 5);
    drain(fd);
    close(fd);
    fd = connect_to(murl);   /* binary, NULs included */
    ft_pattern((uint8_t *)big, 64 << 10, 99, 0);
    send_all(fd, big, 64 << 10);
    drain(fd);
    close(fd);

    /* held open while everything else goes on: a request cut off, and one
     * that asks again and again without reading the answers */
    int cut = connect_to(murl);
    send_all(cut, "GET /metr", 9);
    int deaf = connect_to(murl);
    for (int i = 0; i < 200; i++)
        send_all(deaf, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 35);
    static uint8_t buf[4096];
    for (int i = 0; i < 50; i++) {
        char key[32];
        snprintf(key, sizeof key, "mx/hostile/%d", i);
        assert_int_equal(ferry_store_put(S, key, buf, sizeof buf, NULL, NULL, NULL), 0);
        size_t got = 0;
        assert_int_equal(ferry_store_get_into(S, key, buf, sizeof buf, &got, NULL), 0);
    }
    wait_metric(murl, "ferry_master_requests_total{op=\"get_replicas\"}", g0 + 50);
    assert_int_equal(http_code("", murl), 200);
    close(cut);
    close(deaf);
}

/* Soft objects make room for new ones (evictions counted); a node killed
 * and not back within --grace is declared dead and its objects lost. Last:
 * it ends the node. */
static void test_evictions_and_lost(void **state)
{
    (void)state;
    scrape(murl);
    double ev0 = value_in(page, "ferry_master_evictions_total");
    double lost0 = value_in(page, "ferry_master_objects_lost_total");
    assert_true(ev0 >= 0 && lost0 >= 0);
    size_t len = 3 << 20;
    uint8_t *buf = calloc(1, len);
    assert_non_null(buf);
    for (int i = 0; i < 10; i++) {   /* 30 MiB through a 16 MiB segment */
        char key[32];
        snprintf(key, sizeof key, "mx/evict/%d", i);
        assert_int_equal(ferry_store_put(S, key, buf, len, NULL, NULL, NULL), 0);
    }
    free(buf);
    double ev = wait_metric(murl, "ferry_master_evictions_total", ev0 + 1);
    double held = value_in(page, "ferry_master_objects{state=\"complete\"}");
    fprintf(stderr, "evictions %g, complete objects %g\n", ev - ev0, held);
    assert_true(held >= 1);
    ft_proc_kill(&C.node[0], SIGKILL);
    wait_metric(murl, "ferry_master_objects_lost_total", lost0 + held);
    assert_true(value_in(page, "ferry_master_objects{state=\"lost\"}") >= held);
    assert_true(value_in(page, "ferry_master_nodes_declared_dead_total") >= 1);
    assert_true(value_in(page, "ferry_master_segments") == 0);
}

/* `ferry up --metrics --detach`: both URLs printed, kept in the state
 * directory, and each serving its page; `ferry down` stops both. */
static void test_up_metrics(void **state)
{
    (void)state;
    char dir[] = "/tmp/ferry-up-metrics-XXXXXX";
    assert_non_null(mkdtemp(dir));
    static char out[1 << 14];
    int st = ft_run(out, sizeof out, "%s up --dir %s --size 32M --metrics --detach 2>&1",
                    ft_ferry_bin(), dir);
    fprintf(stderr, "ferry up --metrics --detach -> %d: %s", st, out);
    const char *at = strstr(out, "metrics at ");
    char mu[128] = "", nu[128] = "";
    bool ok = st == 0 && at && sscanf(at, "metrics at %127s (master) and %127s", mu, nu) == 2;
    char f[300], text[160];
    if (ok) {
        snprintf(f, sizeof f, "%s/master.metrics", dir);
        FILE *fp = fopen(f, "r");
        ok = fp && fgets(text, sizeof text, fp) && !strncmp(text, mu, strlen(mu));
        if (fp)
            fclose(fp);
    }
    /* nothing here may end the test before `ferry down` */
    /* the pages are snapshots refreshed at most every 100 ms: wait for them */
    double live = ok ? try_wait_metric(mu, "ferry_master_nodes{state=\"live\"}", 1) : -1;
    if (ok && !(ok = live == 1))
        fprintf(stderr, "live nodes on %s: %g (%s)\n", mu, live, try_scrape(mu) ? try_scrape(mu) : "");
    double reg = ok ? try_wait_metric(nu, "ferry_node_registrations_total", 1) : -1;
    if (ok && !(ok = reg == 1))
        fprintf(stderr, "registrations on %s: %g (%s)\n", nu, reg, try_scrape(nu) ? try_scrape(nu) : "");
    int down = ft_run(out, sizeof out, "%s down --dir %s 2>&1", ft_ferry_bin(), dir);
    ft_run(out, sizeof out, "rm -rf '%s'", dir);
    assert_true(ok);
    assert_int_equal(down, 0);
}

/* ---- replicated masters ---------------------------------------------------------- */

/* etcd and two `ferry master --etcd --metrics`, removed by the teardown
 * also after a failed assertion. */
typedef struct ha_env {
    ft_etcd e;
    ft_peer m[2];
    char dir[2][64], port[2][32];
} ha_env;

static int ha_setup(void **state)
{
    ha_env *h = calloc(1, sizeof *h);
    *state = h;
    if (!h || ft_etcd_start(&h->e) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        h->m[i].pid = -1;
        snprintf(h->port[i], sizeof h->port[i], "127.0.0.1:%d", ft_free_port());
        snprintf(h->dir[i], sizeof h->dir[i], "/tmp/ferry-ha-metrics-XXXXXX");
        if (!mkdtemp(h->dir[i])) {
            h->dir[i][0] = 0;
            return -1;
        }
    }
    return 0;
}

static int ha_teardown(void **state)
{
    ha_env *h = *state;
    if (!h)
        return 0;
    char cmd[128];
    for (int i = 0; i < 2; i++) {
        ft_proc_kill(&h->m[i], SIGKILL);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->dir[i]);
        if (h->dir[i][0] && system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", h->dir[i]);
    }
    ft_etcd_stop(&h->e);
    free(h);
    return 0;
}

static void ha_start(ha_env *h, int i)
{
    char mdir[96];
    snprintf(mdir, sizeof mdir, "%s/m", h->dir[i]);
    const char *args[] = { "master", "--dir", mdir, "--listen", h->port[i], "--etcd", h->e.url,
                           "--cluster", "mx", "--ha-ttl", "4", "--metrics", "127.0.0.1:0", NULL };
    assert_int_equal(ft_spawn_exe(&h->m[i], NULL, ft_ferry_bin(), args), 0);
}

/* It leads once it listens; then its metrics line. */
static void ha_leading(ha_env *h, int i, char url[128])
{
    char line[512] = "";
    assert_int_equal(ft_read_line(&h->m[i], line, sizeof line, 60000), 0);
    assert_non_null(strstr(line, "listening on"));
    url_from(&h->m[i], url);
}

/* The leader's page: its epoch, the cluster's leaderships, what it
 * appended to the log, the standby's lag (present, then 0 once it caught
 * up); after the leader is killed the standby's page counts a second
 * leadership with a newer epoch. */
static void test_ha_series(void **state)
{
    ha_env *h = *state;
    char u0[128], u1[128], lag[160];
    ha_start(h, 0);
    ha_leading(h, 0, u0);
    ha_start(h, 1);
    ferry_store_config cfg;
    ft_cluster any;
    memset(&any, 0, sizeof any);
    snprintf(any.addr, sizeof any.addr, "%s", h->port[0]);
    ft_store_config(&any, &cfg);
    snprintf(cfg.master, sizeof cfg.master, "%s,%s", h->port[0], h->port[1]);
    ferry_store *s = NULL;
    ferry_error err = {0};
    assert_int_equal(ferry_store_open(&cfg, &s, &err), 0);
    for (int i = 0; i < 20; i++)
        assert_int_equal(ferry_kv_put(s, "ha/mx", "v", 1, NULL, &err), 0);
    double epoch0 = wait_metric(u0, "ferry_master_ha_epoch", 1);
    assert_true(value_in(page, "ferry_master_ha_leaderships") == 1);
    assert_non_null(strstr(page, "# TYPE ferry_master_ha_standby_lag_entries gauge"));
    assert_true(wait_metric(u0, "ferry_master_ha_log_entries_total", 20) >= 20);
    assert_true(value_in(page, "ferry_master_ha_log_bytes_total") > 0);
    assert_true(value_in(page, "ferry_master_ha_log_next_entry") >= 21);
    snprintf(lag, sizeof lag, "ferry_master_ha_standby_lag_entries{standby=\"%s\"}", h->port[1]);
    double v = wait_metric(u0, lag, 0);   /* reported: the standby follows */
    for (uint64_t end = fr_now_ms() + DEADLINE_MS; v != 0 && fr_now_ms() < end;) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };   /* the next try of a deadline-bound wait */
        nanosleep(&ts, NULL);
        v = metric(u0, lag);
    }
    assert_true(v == 0);
    fprintf(stderr, "leader: epoch %g, 1 leadership; the standby caught up (lag 0)\n", epoch0);
    ft_proc_kill(&h->m[0], SIGKILL);
    ha_leading(h, 1, u1);
    assert_true(wait_metric(u1, "ferry_master_ha_leaderships", 2) == 2);
    double epoch1 = value_in(page, "ferry_master_ha_epoch");
    assert_true(epoch1 > epoch0);
    fprintf(stderr, "after the kill: epoch %g, 2 leaderships\n", epoch1);
    ferry_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_counters_move),
        cmocka_unit_test(test_refused_handshake),
        cmocka_unit_test(test_queues),
        cmocka_unit_test(test_node_served),
        cmocka_unit_test(test_hostile_http),
        cmocka_unit_test(test_up_metrics),
        cmocka_unit_test(test_evictions_and_lost),
        cmocka_unit_test_setup_teardown(test_ha_series, ha_setup, ha_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
