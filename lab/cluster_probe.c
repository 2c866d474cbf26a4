/* The lab's measurements (cluster.h): each shaped link checked with a TCP
 * stream, and the machine's CPU use from /proc/stat. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <linux/if_ether.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lab.h"
#include "cluster.h"

#define WARM_S 0.3            /* TBF's bucket and TCP's slow start, not counted */
#define CHUNK (64u << 10)
#define PROBE_DEADLINE_S 30.0 /* a child that has not answered by then failed */

double lab_cpu_sample(unsigned long long st[2])
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[10] = { 0 };
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                       &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9])
              : 0;
    if (f)
        fclose(f);
    if (n < 5)
        return 0;
    unsigned long long total = 0, idle = v[3] + v[4];   /* idle + iowait */
    for (int i = 0; i < 8; i++)   /* guest times are inside user and nice already */
        total += v[i];
    double share = 0;
    if (st[0] && total > st[0])
        share = 1.0 - (double)(idle - st[1]) / (double)(total - st[0]);
    st[0] = total;
    st[1] = idle;
    return share < 0 ? 0 : share > 1 ? 1 : share;
}

static unsigned long long tx_bytes(const char *dev)
{
    FILE *f = fopen("/proc/self/net/dev", "r");   /* this process's namespace's devices */
    char line[512];
    unsigned long long v[9] = { 0 };
    size_t len = strlen(dev);
    while (f && fgets(line, sizeof line, f)) {
        char *p = line + strspn(line, " ");
        if (!strncmp(p, dev, len) && p[len] == ':' &&
            sscanf(p + len + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) == 9)
            break;
    }
    if (f)
        fclose(f);
    return v[8];
}

/* In dst: take one stream on addr, answer "bytes seconds" of what came
 * after the warm-up. */
static void receiver(const char *ns, const char *addr, int out)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    inet_pton(AF_INET, addr, &sa.sin_addr);
    socklen_t sl = sizeof sa;
    int l = lab_enter(ns) == 0 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 1) < 0 ||
        getsockname(l, (struct sockaddr *)&sa, &sl) < 0)
        _exit(1);
    dprintf(out, "%u\n", ntohs(sa.sin_port));
    int c = accept(l, NULL, NULL);
    if (c < 0)
        _exit(1);
    int mss = 0, mtu = 0;
    socklen_t ol = sizeof mss;
    getsockopt(c, IPPROTO_TCP, TCP_MAXSEG, &mss, &ol);
    ol = sizeof mtu;
    getsockopt(c, IPPROTO_IP, IP_MTU, &mtu, &ol);
    static char buf[CHUNK];
    double t0 = 0, tw = 0, tl = 0;
    unsigned long long counted = 0;
    ssize_t n;
    while ((n = read(c, buf, sizeof buf)) > 0) {
        double t = cli_now();
        if (t0 == 0)
            t0 = t;
        if (t - t0 < WARM_S)
            continue;
        if (tw == 0)
            tw = t;
        else
            counted += (unsigned long long)n;
        tl = t;
    }
    /* TBF meters whole frames: a full segment carries mss bytes of payload
     * in an Ethernet frame of mtu + 14 bytes */
    double frame = mss > 0 && mtu > mss ? (double)(mtu + ETH_HLEN) / mss : 1.0;
    dprintf(out, "%llu %.6f %.6f\n", counted, tl - tw, frame);
    _exit(0);
}

/* In src: stream to addr:port for warm-up + seconds; answer "bytes seconds"
 * of dev's transmit counter over the measured part. */
static void sender(const char *ns, const char *dev, const char *addr, unsigned port, double seconds,
                   int out)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int s = lab_enter(ns) == 0 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) < 0)
        _exit(1);
    static char buf[CHUNK];
    memset(buf, 0x5a, sizeof buf);
    double t0 = cli_now(), tw = 0;
    unsigned long long b0 = 0;
    for (;;) {
        double t = cli_now();
        if (tw == 0 && t - t0 >= WARM_S) {
            tw = t;
            b0 = tx_bytes(dev);
        }
        if (t - t0 >= WARM_S + seconds)
            break;
        if (write(s, buf, sizeof buf) < 0)
            _exit(1);
    }
    unsigned long long b1 = tx_bytes(dev);
    double t1 = cli_now();
    close(s);
    dprintf(out, "%llu %.6f\n", b1 - b0, t1 - tw);
    _exit(0);
}

/* One line from fd (a child's pipe) within the deadline, or -1 on a signal,
 * EOF or timeout. */
static int read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    double end = cli_now() + PROBE_DEADLINE_S;
    while (n + 1 < cap) {
        struct pollfd pf[2] = { { .fd = fd, .events = POLLIN }, { .fd = lab_stop_fd(), .events = POLLIN } };
        int left = (int)((end - cli_now()) * 1000);
        if (left <= 0 || lab_stopping())
            return -1;
        int pr = poll(pf, 2, left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0 || pf[1].revents)
            return -1;
        if (!pf[0].revents)
            continue;
        ssize_t r = read(fd, buf + n, 1);
        if (r <= 0)
            return -1;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = 0;
    return 0;
}

static pid_t fork_child(int *rd)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        *rd = p[1];
        return 0;
    }
    close(p[1]);
    *rd = p[0];
    return pid;
}

static void reap(pid_t pid, int fd)
{
    if (fd >= 0)
        close(fd);
    if (pid > 0) {
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
}

/* One direction: a stream from src (whose dev is shaped) to dst_addr in
 * dst. The payload's rate as the receiver counted it and the link's (the
 * same in Ethernet frames, which is what TBF meters), in bits/s. The
 * sender's answer is dev's own transmit counter, a cross-check only: veth
 * counts a GSO packet's headers once, TBF once per segment. */
static int stream(const char *src, const char *dev, const char *dst, const char *dst_addr,
                  double seconds, double *link_bps, double *payload_bps)
{
    int rfd = -1, sfd = -1;
    pid_t r = fork_child(&rfd);
    if (r == 0)
        receiver(dst, dst_addr, rfd);
    char line[128];
    unsigned port = 0;
    if (r < 0 || read_line(rfd, line, sizeof line) < 0 || sscanf(line, "%u", &port) != 1) {
        reap(r, rfd);
        return -1;
    }
    pid_t s = fork_child(&sfd);
    if (s == 0)
        sender(src, dev, dst_addr, port, seconds, sfd);
    unsigned long long sb = 0, rb = 0;
    double ss = 0, rs = 0, frame = 1;
    int rc = s > 0 && read_line(sfd, line, sizeof line) == 0 && sscanf(line, "%llu %lf", &sb, &ss) == 2 &&
                     read_line(rfd, line, sizeof line) == 0 && sscanf(line, "%llu %lf %lf", &rb, &rs, &frame) == 3 &&
                     ss > 0 && rs > 0
                 ? 0
                 : -1;
    reap(s, sfd);
    reap(r, rfd);
    *payload_bps = rc == 0 ? (double)rb * 8 / rs : 0;
    *link_bps = *payload_bps * frame;
    (void)sb;
    return rc;
}

int lab_check_links(lab *L, double seconds, bool json, double *worst)
{
    char sw[64], sw_addr[32];
    snprintf(sw, sizeof sw, "%s-sw", L->prefix);
    snprintf(sw_addr, sizeof sw_addr, "%s.254", L->net);
    *worst = 0;
    const double mbit = 1e6;
    if (!json)
        printf("link check (%.1f s TCP stream each way, one at a time; link = the payload in "
               "Ethernet frames):\n", seconds);
    for (unsigned i = 0; i < L->hosts; i++) {
        char ns[64], addr[32], port[16];
        snprintf(ns, sizeof ns, "%s-h%u", L->prefix, i);
        snprintf(addr, sizeof addr, "%s.%u", L->net, i + 1);
        snprintf(port, sizeof port, "p%u", i);
        for (int dir = 0; dir < 2; dir++) {   /* 0: host -> switch (up), 1: switch -> host (down) */
            unsigned long long cpu[2] = { 0, 0 };
            lab_cpu_sample(cpu);
            double link = 0, pay = 0;
            int rc = dir == 0 ? stream(ns, "eth0", sw, sw_addr, seconds, &link, &pay)
                              : stream(sw, port, ns, addr, seconds, &link, &pay);
            double busy = lab_cpu_sample(cpu);
            L->cpu_max = busy > L->cpu_max ? busy : L->cpu_max;
            if (rc < 0) {
                if (!lab_stopping())
                    fprintf(stderr, "ferry-lab cluster: the link check of host %u (%s) failed: no "
                                    "stream\n", i, dir ? "down" : "up");
                return -1;
            }
            double ratio = link / (double)lab_host_rate(L, i);
            if (*worst == 0 || fabs(ratio - 1) > fabs(*worst - 1))
                *worst = ratio;   /* the one farthest from the configured rate */
            if (json)
                printf("{\"host\":%u,\"dir\":\"%s\",\"configured_bps\":%llu,\"link_bps\":%.0f,"
                       "\"payload_bps\":%.0f,\"ratio\":%.4f,\"cpu\":%.3f}\n", i, dir ? "down" : "up",
                       (unsigned long long)lab_host_rate(L, i), link, pay, ratio, busy);
            else
                printf("  host %u %-4s link %8.2f / %8.2f Mbit/s = %.3f (payload %8.2f Mbit/s), cpu "
                       "%.2f%s%s\n", i, dir ? "down" : "up", link / mbit, (double)lab_host_rate(L, i) / mbit,
                       ratio, pay / mbit, busy, ratio < 0.95 || ratio > 1.05 ? "  outside 5 %" : "",
                       busy > LAB_CPU_BOUND ? "  CPU-bound: lower the rate" : "");
            fflush(stdout);
        }
    }
    return 0;
}
