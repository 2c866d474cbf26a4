/* Blocking socket I/O helpers for framed messages (see sockio.h).
 *
 * Every write uses MSG_NOSIGNAL so a peer that went away yields EPIPE (mapped
 * to FERRY_ECONNRESET) instead of killing the process with SIGPIPE. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/base.h"
#include "wire/sockio.h"

/* Largest fixed meta body of any message; fr_recv_msg refuses frames whose
 * type claims more (the wire layer would have to be changed to hit this). */
#define META_MAX 256
#define DRAIN_BUF (64u << 10)

static int map_errno(int err)
{
    switch (err) {
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
        return FERRY_ETIMEDOUT;   /* SO_RCVTIMEO / SO_SNDTIMEO expired */
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
    case ESHUTDOWN:
        return FERRY_ECONNRESET;
    default:
        return FERRY_EIO;
    }
}

int fr_read_full(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;

    while (n > 0) {
        /* MSG_WAITALL lets the kernel gather a large payload in one call
         * instead of waking us for every segment; short returns (signal,
         * timeout) are handled by the loop. */
        ssize_t r = recv(fd, p, n, MSG_WAITALL);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return FERRY_ECONNRESET;
        if (errno == EINTR)
            continue;
        return map_errno(errno);
    }
    return 0;
}

int fr_write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;

    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r >= 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (errno == EINTR)
            continue;
        return map_errno(errno);
    }
    return 0;
}

/* Skip `done` bytes of the vector in place; returns the new first index. */
static int iov_advance(struct iovec *iov, int iovcnt, int first, size_t done)
{
    while (first < iovcnt && done >= iov[first].iov_len) {
        done -= iov[first].iov_len;
        first++;
    }
    if (first < iovcnt) {
        iov[first].iov_base = (uint8_t *)iov[first].iov_base + done;
        iov[first].iov_len -= done;
    }
    return first;
}

int fr_writev_full(int fd, struct iovec *iov, int iovcnt)
{
    int first = iov_advance(iov, iovcnt, 0, 0);   /* skip leading empty entries */

    while (first < iovcnt) {
        int cnt = iovcnt - first;
        if (cnt > IOV_MAX)
            cnt = IOV_MAX;
        struct msghdr mh = { .msg_iov = iov + first, .msg_iovlen = (size_t)cnt };
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return map_errno(errno);
        }
        first = iov_advance(iov, iovcnt, first, (size_t)r);
    }
    return 0;
}

static int readv_full(int fd, struct iovec *iov, int iovcnt)
{
    int first = iov_advance(iov, iovcnt, 0, 0);

    while (first < iovcnt) {
        struct msghdr mh = { .msg_iov = iov + first, .msg_iovlen = (size_t)(iovcnt - first) };
        ssize_t r = recvmsg(fd, &mh, MSG_WAITALL);
        if (r > 0) {
            first = iov_advance(iov, iovcnt, first, (size_t)r);
            continue;
        }
        if (r == 0)
            return FERRY_ECONNRESET;
        if (errno == EINTR)
            continue;
        return map_errno(errno);
    }
    return 0;
}

/* Gather up to ROWS_IOV runs of rows [*row, rows) into iov starting at
 * iov[n]; rows that touch (stride == len) share one entry. Advances *row. */
#define ROWS_IOV 256
static int rows_iov(struct iovec *iov, int n, uint8_t *base, uint64_t *row, uint64_t rows,
                    uint64_t len, uint64_t stride)
{
    for (; *row < rows; (*row)++) {
        uint8_t *p = base + *row * stride;
        if (n > 0 && (uint8_t *)iov[n - 1].iov_base + iov[n - 1].iov_len == p &&
            iov[n - 1].iov_len <= SIZE_MAX - len) {
            iov[n - 1].iov_len += len;
            continue;
        }
        if (n == ROWS_IOV)
            break;
        iov[n++] = (struct iovec){ p, (size_t)len };
    }
    return n;
}

int fr_read_rows(int fd, uint8_t *base, uint64_t rows, uint64_t len, uint64_t stride)
{
    struct iovec iov[ROWS_IOV];
    uint64_t row = 0;

    while (row < rows) {
        int n = rows_iov(iov, 0, base, &row, rows, len, stride);
        int rc = readv_full(fd, iov, n);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int fr_write_rows(int fd, const void *head, size_t hlen, const uint8_t *base, uint64_t rows,
                  uint64_t len, uint64_t stride)
{
    struct iovec iov[ROWS_IOV];
    uint64_t row = 0;
    int n = 0;

    if (hlen > 0)
        iov[n++] = (struct iovec){ (void *)head, hlen };
    do {
        n = rows_iov(iov, n, (uint8_t *)base, &row, rows, len, stride);
        int rc = fr_writev_full(fd, iov, n);
        if (rc < 0)
            return rc;
        n = 0;
    } while (row < rows);
    return 0;
}

int fr_drain(int fd, uint64_t n)
{
    uint8_t buf[DRAIN_BUF];

    while (n > 0) {
        size_t step = n < sizeof buf ? (size_t)n : sizeof buf;
        int rc = fr_read_full(fd, buf, step);
        if (rc < 0)
            return rc;
        n -= step;
    }
    return 0;
}

int fr_read_full_by(int fd, void *buf, size_t n, uint64_t deadline_ns)
{
    uint8_t *p = buf;

    while (n > 0) {
        /* Wait only for the time left: a peer that sends a byte now and
         * then gets no more time than one that sends nothing. */
        int ms = -1;
        if (deadline_ns != UINT64_MAX) {
            uint64_t now = fr_now_ns();
            if (now >= deadline_ns)
                return FERRY_ETIMEDOUT;
            uint64_t left = (deadline_ns - now + 999999) / 1000000;
            ms = left > INT32_MAX ? INT32_MAX : (int)left;
        }
        struct pollfd pf = { .fd = fd, .events = POLLIN };
        int k = poll(&pf, 1, ms);
        if (k < 0 && errno != EINTR)
            return FERRY_EIO;
        if (k <= 0)
            continue;   /* the deadline is checked above */
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return FERRY_ECONNRESET;
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
            continue;
        return map_errno(errno);
    }
    return 0;
}

uint64_t fr_sock_rcv_deadline(int fd)
{
    struct timeval tv = { 0 };
    socklen_t len = sizeof tv;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) < 0 || (tv.tv_sec == 0 && tv.tv_usec == 0))
        return UINT64_MAX;
    return fr_now_ns() + (uint64_t)tv.tv_sec * 1000000000u + (uint64_t)tv.tv_usec * 1000u;
}

/* One frame header + meta; deadline NULL: plain blocking reads under the
 * socket's timeouts. */
static int recv_msg(int fd, const uint64_t *deadline, fr_frame_hdr *hdr, fr_msg *m)
{
    uint8_t raw[FR_WIRE_HDR_LEN];
    uint8_t body[META_MAX];

    int rc = deadline ? fr_read_full_by(fd, raw, sizeof raw, *deadline)
                      : fr_read_full(fd, raw, sizeof raw);
    if (rc < 0)
        return rc;
    rc = fr_wire_hdr_decode(raw, sizeof raw, hdr);
    if (rc < 0)
        return rc;
    size_t meta = fr_wire_meta_len(hdr->type);
    if (meta == 0)
        return FERRY_EPROTO;
    if (meta > sizeof body)
        return FERRY_EMSGSIZE;
    rc = deadline ? fr_read_full_by(fd, body, meta, *deadline) : fr_read_full(fd, body, meta);
    if (rc < 0)
        return rc;
    /* WRITE / READ_RESP data stays in the socket: the caller receives it
     * straight into its destination once it has validated the meta. */
    return fr_wire_decode(hdr, body, meta, m);
}

int fr_recv_msg(int fd, fr_frame_hdr *hdr, fr_msg *m)
{
    return recv_msg(fd, NULL, hdr, m);
}

int fr_recv_msg_by(int fd, uint64_t deadline_ns, fr_frame_hdr *hdr, fr_msg *m)
{
    return recv_msg(fd, &deadline_ns, hdr, m);
}

int fr_recv_msg_sized(int fd, size_t meta, fr_frame_hdr *hdr, fr_msg *m)
{
    uint8_t raw[FR_WIRE_HDR_LEN + META_MAX];
    if (meta > META_MAX)
        return FERRY_EINVAL;
    /* One read for header and meta: the caller knows every frame it may
     * receive here has this meta size, so this never reads into a payload. */
    int rc = fr_read_full(fd, raw, FR_WIRE_HDR_LEN + meta);
    if (rc < 0)
        return rc;
    rc = fr_wire_hdr_decode(raw, FR_WIRE_HDR_LEN, hdr);
    if (rc < 0)
        return rc;
    if (fr_wire_meta_len(hdr->type) != meta)
        return FERRY_EPROTO;
    return fr_wire_decode(hdr, raw + FR_WIRE_HDR_LEN, meta, m);
}

int fr_send_msg(int fd, const fr_msg *m, uint64_t req_id)
{
    uint8_t buf[FR_WIRE_HDR_LEN + META_MAX];

    int n = fr_wire_encode(m, req_id, 0, buf, sizeof buf);
    if (n < 0)
        return n;
    return fr_write_full(fd, buf, (size_t)n);
}

int fr_sock_timeouts(int fd, int ms)
{
    if (ms < 0)
        ms = 0;
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0)
        return FERRY_EIO;
    return 0;
}

void fr_sock_peername(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN];

    if (len == 0)
        return;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) {
        snprintf(buf, len, "?");
        return;
    }
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host);
        snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(sin->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof host);
        snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(sin6->sin6_port));
    } else if (ss.ss_family == AF_UNIX) {
        snprintf(buf, len, "unix");
    } else {
        snprintf(buf, len, "?");
    }
}

/* "A.B.C.D:PORT", "[v6]:PORT" or "localhost:PORT"; numeric only so that
 * opening an engine never waits on a resolver. */
int fr_sock_parse_hostport(const char *in, struct sockaddr_storage *ss, socklen_t *sl)
{
    char host[INET6_ADDRSTRLEN];
    const char *hs = in, *he, *port;
    bool v6 = in[0] == '[';

    if (v6) {
        hs = in + 1;
        he = strchr(hs, ']');
        if (!he || he[1] != ':')
            return FERRY_EINVAL;
        port = he + 2;
    } else {
        he = strrchr(in, ':');
        if (!he)
            return FERRY_EINVAL;
        port = he + 1;
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl >= sizeof host || *port == '\0' || strlen(port) > 5)
        return FERRY_EINVAL;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    unsigned long pn = 0;
    for (const char *q = port; *q; q++) {
        if (*q < '0' || *q > '9')
            return FERRY_EINVAL;
        pn = pn * 10 + (unsigned long)(*q - '0');
    }
    if (pn > 65535)
        return FERRY_EINVAL;

    memset(ss, 0, sizeof *ss);
    if (!v6 && strcmp(host, "localhost") == 0)
        strcpy(host, "127.0.0.1");
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)pn);
        *sl = sizeof *a;
        return inet_pton(AF_INET6, host, &a->sin6_addr) == 1 ? 0 : FERRY_EINVAL;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)pn);
    *sl = sizeof *a;
    return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : FERRY_EINVAL;
}

static int connect_errno(int err)
{
    if (err == ECONNREFUSED)
        return FERRY_ECONNREFUSED;
    if (err == ETIMEDOUT)
        return FERRY_ETIMEDOUT;
    return FERRY_EIO;
}

int fr_sock_connect_deadline(int fd, const struct sockaddr_storage *ss, socklen_t sl,
                             uint64_t deadline)
{
    if (connect(fd, (const struct sockaddr *)ss, sl) < 0) {
        if (errno != EINPROGRESS)
            return connect_errno(errno);
        for (;;) {
            struct pollfd pfd = { .fd = fd, .events = POLLOUT };
            int ms = fr_ms_left(deadline);
            if (ms == 0)
                return FERRY_ETIMEDOUT;
            int n = poll(&pfd, 1, ms);
            if (n > 0)
                break;
            if (n < 0 && errno != EINTR)
                return FERRY_EIO;
        }
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
            return FERRY_EIO;
        if (err != 0)
            return connect_errno(err);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
        return FERRY_EIO;
    return 0;
}

int fr_sock_connect(const char *addr, int timeout_ms, int *out)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = fr_sock_parse_hostport(addr, &ss, &sl);
    if (rc < 0)
        return rc;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return FERRY_EIO;
    rc = fr_sock_connect_deadline(fd, &ss, sl, fr_deadline_ns(timeout_ms));
    if (rc < 0) {
        close(fd);
        return rc;
    }
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *out = fd;
    return 0;
}
