#include "util/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/base.h"

static char g_token[65];

const char *ft_token(void)
{
    if (!g_token[0]) {
        const char *only = getenv("FERRY_TEST_FILTER");   /* a developer's run of some tests */
        if (only && *only)
            cmocka_set_test_filter(only);
        const char *t = getenv("FERRY_TOKEN");
        if (t && *t && strlen(t) < sizeof g_token) {
            snprintf(g_token, sizeof g_token, "%s", t);
        } else {
            ferry_token_generate(g_token);
            setenv("FERRY_TOKEN", g_token, 1);
        }
    }
    return g_token;
}

void ft_config(ferry_engine_config *cfg, const char *transport)
{
    ft_token();
    ferry_engine_config_init(cfg);
    snprintf(cfg->transport, sizeof cfg->transport, "%s", transport ? transport : "");
}

ferry_engine *ft_engine_open(const char *transport)
{
    ferry_engine_config c;
    ft_config(&c, transport);
    ferry_engine *e = NULL;
    ferry_error err = {0};
    if (ferry_engine_open(&c, &e, &err) < 0)
        fail_msg("engine open: %s", err.msg);
    return e;
}

static uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void ft_pattern(uint8_t *buf, uint64_t len, uint64_t seed, uint64_t offset)
{
    uint64_t i = 0;
    while (i < len) {
        uint64_t pos = offset + i;
        uint64_t w = splitmix(seed ^ (pos >> 3) * 0x100000001B3ull);
        unsigned b = (unsigned)(pos & 7);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* A whole word in one store, the same bytes as the loop below:
         * byte by byte, filling 1 GiB took a third of the conformance
         * suite's time. */
        if (b == 0 && len - i >= 8) {
            memcpy(buf + i, &w, 8);
            i += 8;
            continue;
        }
#endif
        for (; b < 8 && i < len; b++, i++)
            buf[i] = (uint8_t)(w >> (8 * b));
    }
}

uint64_t ft_hash(const void *buf, uint64_t len) { return fr_hash64(buf, len, 0); }

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
    size_t n = 0;
    while (s[0] && s[1] && n < cap && s[0] != ' ') {
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1)
            break;
        out[n++] = (uint8_t)v;
        s += 2;
    }
    return n;
}

/* ---- the peer process ---------------------------------------------------- */

static int peer_loop(ferry_engine *e, uint8_t *mem, uint64_t size)
{
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long a, b, c, d, f;
        if (strncmp(line, "quit", 4) == 0)
            break;
        if (sscanf(line, "fill %llu", &a) == 1) {
            ft_pattern(mem, size, a, 0);
            printf("OK\n");
        } else if (sscanf(line, "hash %llu %llu", &a, &b) == 2) {
            if (a > size || b > size - a)
                printf("ERR range\n");
            else
                printf("OK %016" PRIx64 "\n", ft_hash(mem + a, b));
        } else if (sscanf(line, "waitnotify %llu %llu %llu %llu %llu", &a, &b, &c, &d, &f) == 5) {
            uint64_t vals[64];
            int rc = ferry_wait_notify(e, a, (uint32_t)b, (int)c, b <= 64 ? vals : NULL, NULL);
            /* hash right at delivery: the writes before the notify must be visible */
            uint64_t h = d <= size && f <= size - d ? ft_hash(mem + d, f) : 0;
            if (rc < 0) {
                printf("ERR %d\n", rc);
            } else {
                printf("OK %016" PRIx64, h);
                for (unsigned long long i = 0; i < b && i < 64; i++)
                    printf(" %" PRIu64, vals[i]);
                printf("\n");
            }
        } else if (strncmp(line, "stats", 5) == 0) {
            ferry_engine_stats s;
            ferry_engine_get_stats(e, &s);
            printf("OK %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", s.remote_refused, s.auth_refused,
                   s.frames_rejected);
        } else {
            printf("ERR unknown command\n");
        }
        fflush(stdout);
    }
    return 0;
}

/* One round as the active side: WRITE a pattern into the whole remote
 * region, READ it back, compare; then a WRITE with a wrong key must abort. */
static int initiator_main(const char *desc_hex)
{
    uint8_t d[FERRY_DESC_MAX];
    size_t dn = unhex(desc_hex, d, sizeof d);
    ferry_engine_config cfg;
    ferry_engine_config_init(&cfg);
    ferry_engine *e;
    ferry_remote_region rr;
    void *a, *b;
    ferry_region *ra;
    int rc = ferry_engine_open(&cfg, &e, NULL);
    if (rc == 0)
        rc = ferry_region_import(e, d, dn, &rr, NULL);
    if (rc == 0)
        rc = ferry_mem_alloc(e, 2 * rr.len, &a, NULL);
    if (rc == 0)
        rc = ferry_region_register(e, a, 2 * rr.len, 0, FERRY_MEM_HOST, &ra, NULL);
    if (rc < 0) {
        printf("FAIL setup %s\n", ferry_strerror(rc));
        return 1;
    }
    b = (uint8_t *)a + rr.len;
    ft_pattern(a, rr.len, 31, 0);
    ferry_op ops[2] = {{.opcode = FERRY_OP_WRITE, .local = a, .len = rr.len, .peer = rr.peer,
                        .remote_addr = rr.addr, .key = rr.key},
                       {.opcode = FERRY_OP_READ, .local = b, .len = rr.len, .peer = rr.peer,
                        .remote_addr = rr.addr, .key = rr.key}};
    ferry_ticket *t;
    const char *why = NULL;
    for (int i = 0; i < 2 && !why; i++) {
        if (ferry_submit(e, &ops[i], 1, 0, &t, NULL) < 0 || ferry_ticket_wait(t, 60000) != FERRY_TICKET_COMPLETED)
            why = i ? "read" : "write";
        ferry_ticket_free(t);
    }
    if (!why && memcmp(a, b, rr.len) != 0)
        why = "read-back mismatch";
    ops[0].key ^= 1;
    if (!why && (ferry_submit(e, &ops[0], 1, 0, &t, NULL) < 0 || ferry_ticket_wait(t, 60000) != FERRY_TICKET_ABORTED))
        why = "wrong key not refused";
    if (!why)
        ferry_ticket_free(t);
    if (why)
        printf("FAIL %s\n", why);
    else
        printf("OK %s %016" PRIx64 "\n", ferry_peer_transport(e, rr.peer), ft_hash(a, rr.len));
    ferry_engine_close(e);
    return why ? 1 : 0;
}

int ft_main_peer(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--initiator") == 0)
        return initiator_main(argv[2]);
    if (argc < 2 || strcmp(argv[1], "--peer") != 0)
        return -1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlive the test */
    uint64_t size = 1 << 20;
    bool use_malloc = false;
    unsigned flags = FERRY_REMOTE_RW;
    const char *listen = NULL, *token = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size"))
            size = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--mem"))
            use_malloc = !strcmp(argv[i + 1], "malloc");
        else if (!strcmp(argv[i], "--flags"))
            flags = !strcmp(argv[i + 1], "rw") ? FERRY_REMOTE_RW : !strcmp(argv[i + 1], "r") ? FERRY_REMOTE_READ
                  : !strcmp(argv[i + 1], "w") ? FERRY_REMOTE_WRITE : 0;
        else if (!strcmp(argv[i], "--listen"))
            listen = argv[i + 1];
        else if (!strcmp(argv[i], "--token"))
            token = argv[i + 1];
    }
    ferry_engine_config cfg;
    ferry_engine_config_init(&cfg);
    if (token) {
        memcpy(cfg.token, token, strlen(token));
        cfg.token_len = strlen(token);
    }
    if (listen)
        snprintf(cfg.listen_addr, sizeof cfg.listen_addr, "%s", listen);
    ferry_engine *e;
    int rc = ferry_engine_open(&cfg, &e, NULL);
    if (rc < 0) {
        printf("FAIL open %d\n", rc);
        return 1;
    }
    void *mem;
    if (use_malloc) {
        mem = aligned_alloc(4096, (size + 4095) & ~4095ull);
        if (mem)
            memset(mem, 0, size);
    } else if (ferry_mem_alloc(e, size, &mem, NULL) < 0) {
        mem = NULL;
    }
    ferry_region *r;
    if (!mem || ferry_region_register(e, mem, size, flags, FERRY_MEM_HOST, &r, NULL) < 0) {
        printf("FAIL region\n");
        return 1;
    }
    uint8_t d[FERRY_DESC_MAX], ep[FERRY_DESC_MAX];
    int dn = ferry_region_export(r, d, sizeof d);
    int en = ferry_engine_export(e, ep, sizeof ep);
    char dh[2 * FERRY_DESC_MAX + 1], eh[2 * FERRY_DESC_MAX + 1];
    hex(d, (size_t)dn, dh);
    hex(ep, (size_t)en, eh);
    printf("READY %s %s %p\n", dh, eh, mem);
    fflush(stdout);
    rc = peer_loop(e, mem, size);
    ferry_engine_close(e);   /* releases the region and engine-allocated memory */
    if (use_malloc)
        free(mem);
    return rc;
}

/* ---- driving a peer ------------------------------------------------------- */

int ft_read_line(ft_peer *p, char *out, size_t cap, int timeout_ms)
{
    uint64_t deadline = fr_deadline_ns(timeout_ms);
    for (;;) {
        char *nl = memchr(p->buf, '\n', p->blen);
        if (nl) {
            size_t n = (size_t)(nl - p->buf);
            size_t m = n < cap - 1 ? n : cap - 1;
            memcpy(out, p->buf, m);
            out[m] = 0;
            memmove(p->buf, nl + 1, p->blen - n - 1);
            p->blen -= n + 1;
            return 0;
        }
        uint64_t now = fr_now_ns();
        if (now >= deadline || p->blen == sizeof p->buf)
            return -1;
        struct pollfd pf = {.fd = p->out_fd, .events = POLLIN};
        int left = (int)((deadline - now) / 1000000) + 1;
        if (poll(&pf, 1, left) <= 0)
            continue;
        ssize_t r = read(p->out_fd, p->buf + p->blen, sizeof p->buf - p->blen);
        if (r <= 0)
            return -1;
        p->blen += (size_t)r;
    }
}

int ft_spawn(ft_peer *p, const char *netns, const char *const *args)
{
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        return -1;
    self[sl] = 0;
    return ft_spawn_exe(p, netns, self, args);
}

int ft_spawn_exe(ft_peer *p, const char *netns, const char *exe, const char *const *args)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    const char *self = exe;
    const char *argv[40];
    int n = 0;
    if (netns) {
        argv[n++] = "ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = netns;
    }
    argv[n++] = self;
    for (int i = 0; args[i] && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    /* The test writes commands into the peer's stdin; a peer that has
     * already exited (a failed initiator printing its last line, a killed
     * node) must turn that write into EPIPE, never a SIGPIPE that kills the
     * whole test. */
    signal(SIGPIPE, SIG_IGN);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlive the test */
        signal(SIGPIPE, SIG_DFL);           /* the peer gets the default back */
        dup2(in[0], 0);
        dup2(out[1], 1);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->pid = pid;
    p->in_fd = in[1];
    p->out_fd = out[0];
    return 0;
}

int ft_peer_start(ft_peer *p, const ft_peer_opts *o)
{
    char size[32];
    snprintf(size, sizeof size, "%llu", (unsigned long long)(o->size ? o->size : 1 << 20));
    const char *argv[16] = {"--peer", "--size", size, "--mem", o->malloc_mem ? "malloc" : "memfd",
                            "--flags", o->flags ? o->flags : "rw"};
    int n = 7;
    if (o->listen) {
        argv[n++] = "--listen";
        argv[n++] = o->listen;
    }
    argv[n++] = "--token";
    argv[n++] = o->token ? o->token : ft_token();
    argv[n] = NULL;
    if (ft_spawn(p, o->netns, argv) < 0)
        return -1;
    char line[2048] = "";
    if (ft_read_line(p, line, sizeof line, FT_START_MS) < 0 || strncmp(line, "READY ", 6) != 0) {
        fprintf(stderr, "peer (pid %d) did not start: %s%.200s%s\n", (int)p->pid,
                line[0] ? "it printed \"" : "no READY line within the deadline or it exited",
                line, line[0] ? "\"" : "");
        ft_peer_stop(p);
        return -1;
    }
    char *sp = strchr(line + 6, ' ');
    if (!sp)
        return -1;
    p->desc_len = unhex(line + 6, p->desc, sizeof p->desc);
    p->ep_len = unhex(sp + 1, p->ep, sizeof p->ep);
    char *sp2 = strchr(sp + 1, ' ');
    p->region_addr = sp2 ? strtoull(sp2 + 1, NULL, 16) : 0;
    p->region_len = o->size ? o->size : 1 << 20;
    return 0;
}

static int vsend(ft_peer *p, const char *fmt, va_list ap)
{
    char cmd[512];
    int n = vsnprintf(cmd, sizeof cmd - 1, fmt, ap);
    if (n < 0 || n >= (int)sizeof cmd - 1)
        return -1;
    cmd[n++] = '\n';
    return write(p->in_fd, cmd, (size_t)n) == n ? 0 : -1;
}

int ft_peer_send(ft_peer *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vsend(p, fmt, ap);
    va_end(ap);
    return rc;
}

int ft_peer_reply(ft_peer *p, char *reply, size_t cap, int timeout_ms)
{
    char tmp[512];
    if (!reply) {
        reply = tmp;
        cap = sizeof tmp;
    }
    if (ft_read_line(p, reply, cap, timeout_ms) < 0)
        return -1;
    return strncmp(reply, "OK", 2) == 0 ? 0 : -1;
}

int ft_peer_cmd(ft_peer *p, char *reply, size_t cap, int timeout_ms, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vsend(p, fmt, ap);
    va_end(ap);
    return rc < 0 ? rc : ft_peer_reply(p, reply, cap, timeout_ms);
}

/* A generous deadline: hashing a 1 GiB region took over a minute with
 * two conformance runs, CPU hogs and other builds sharing two cores. */
uint64_t ft_peer_hash(ft_peer *p, uint64_t off, uint64_t len)
{
    char r[128];
    if (ft_peer_cmd(p, r, sizeof r, 300000, "hash %llu %llu", (unsigned long long)off, (unsigned long long)len) < 0)
        return 0;
    return strtoull(r + 3, NULL, 16);
}

/* The state letter of /proc/PID/stat ('T' when stopped), or 0. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');   /* the name may hold spaces */
    return rp && rp[1] == ' ' ? rp[2] : 0;
}

void ft_peer_signal(ft_peer *p, int sig)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, sig);
    /* A stop is delivered asynchronously: tests that rely on the peer being
     * stopped must not race with its last few instructions. */
    struct timespec ts = { 0, 1000 * 1000 };
    for (int i = 0; sig == SIGSTOP && i < 5000 && proc_state(p->pid) != 'T'; i++)
        nanosleep(&ts, NULL);
}

int ft_peer_wait_exit(ft_peer *p, int timeout_ms)
{
    if (p->pid <= 0)
        return 0;
    /* A pidfd becomes readable when the process exits: wait on that. */
    int pfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    if (pfd >= 0) {
        struct pollfd pf = {.fd = pfd, .events = POLLIN};
        int r = poll(&pf, 1, timeout_ms);
        close(pfd);
        if (r <= 0)
            return -1;
    }
    int st;
    if (waitpid(p->pid, &st, pfd >= 0 ? 0 : WNOHANG) != p->pid && pfd < 0)
        return -1;
    p->pid = -1;
    return 0;
}

void ft_peer_stop(ft_peer *p)
{
    if (p->pid > 0) {
        ft_peer_signal(p, SIGCONT);
        if (write(p->in_fd, "quit\n", 5) != 5 || ft_peer_wait_exit(p, 10000) < 0) {
            kill(p->pid, SIGKILL);
            ft_peer_wait_exit(p, 10000);
        }
    }
    if (p->in_fd > 0)
        close(p->in_fd);
    if (p->out_fd > 0)
        close(p->out_fd);
    p->in_fd = p->out_fd = -1;
    p->pid = -1;
}

int ft_run(char *out, size_t cap, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    out[0] = 0;
    if (len < 0 || (size_t)len >= sizeof cmd)
        return -1;
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- processes ------------------------------------------------------------------------ */

int ft_wait_status(pid_t pid, int timeout_ms, int *status)
{
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd >= 0) {
        struct pollfd pf = {.fd = pfd, .events = POLLIN};
        int r = poll(&pf, 1, timeout_ms);
        close(pfd);
        if (r <= 0)
            return -1;
        return waitpid(pid, status, 0) == pid ? 0 : -1;
    }
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (waitpid(pid, status, WNOHANG) == pid)
            return 0;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* Fields of /proc/PID/stat after the command name: [0] is field 3 (state). */
static int stat_fields(pid_t pid, char *state, long long *ppid, unsigned long long *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *q = strrchr(buf, ')');
    if (!q || sscanf(q + 1, " %c %lld", state, ppid) != 2)
        return -1;
    for (int field = 3; field < 22 && q; field++)
        q = strchr(q + 1, ' ');
    return q && sscanf(q, " %llu", start) == 1 ? 0 : -1;
}

size_t ft_children(pid_t parent, pid_t *out, size_t cap)
{
    DIR *d = opendir("/proc");
    size_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < cap) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        char st;
        long long pp;
        unsigned long long start;
        if (*end || pid <= 0 || stat_fields((pid_t)pid, &st, &pp, &start) < 0)
            continue;
        if (pp == parent)
            out[n++] = (pid_t)pid;
    }
    if (d)
        closedir(d);
    return n;
}

int ft_proc_cmdline(pid_t pid, char *out, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n <= 0)
        return -1;
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == 0)
            out[i] = ' ';
    while (n > 0 && out[n - 1] == ' ')
        n--;
    out[n] = 0;
    return 0;
}

unsigned long long ft_proc_start(pid_t pid)
{
    char st;
    long long pp;
    unsigned long long start;
    return stat_fields(pid, &st, &pp, &start) == 0 ? start : 0;
}

bool ft_proc_alive(pid_t pid, unsigned long long start)
{
    char st;
    long long pp;
    unsigned long long s;
    return stat_fields(pid, &st, &pp, &s) == 0 && s == start && st != 'Z' && st != 'X';
}

void ft_assert_says(const ferry_error *err, int code, const char *w1, const char *w2,
                    const char *w3)
{
    const char *w[] = {w1, w2, w3};
    if (err->code != code)
        fail_msg("code %d, expected %d: \"%s\"", err->code, code, err->msg);
    for (int i = 0; i < 3; i++)
        if (w[i] && !strstr(err->msg, w[i]))
            fail_msg("\"%s\" lacks \"%s\"", err->msg, w[i]);
}
