/* A MOUNT is answered only after the master has reached the node's engine
 * at the address its segment descriptor names, with the instance the
 * descriptor carries and the cluster token: a descriptor that leads nowhere
 * never receives a placement. The probe runs on a short-lived thread (a
 * connect and a handshake, bounded by FR_MASTER_PROBE_MS) and hands its
 * result back to the loop through the handoff eventfd. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "store/master_int.h"
#include "wire/sockio.h"

static int endpoint_addr(const fr_endpoint *ep, struct sockaddr_storage *ss, socklen_t *sl,
                         char *text, size_t cap)
{
    memset(ss, 0, sizeof *ss);
    char host[INET6_ADDRSTRLEN] = "?";
    if (ep->transports & FR_TRANSPORT_TCP) {
        if (ep->family == 4) {
            struct sockaddr_in *a = (struct sockaddr_in *)ss;
            a->sin_family = AF_INET;
            a->sin_port = htons(ep->port);
            memcpy(&a->sin_addr, ep->addr, 4);
            *sl = sizeof *a;
            inet_ntop(AF_INET, ep->addr, host, sizeof host);
            snprintf(text, cap, "%s:%u", host, (unsigned)ep->port);
        } else {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
            a->sin6_family = AF_INET6;
            a->sin6_port = htons(ep->port);
            memcpy(&a->sin6_addr, ep->addr, 16);
            *sl = sizeof *a;
            inet_ntop(AF_INET6, ep->addr, host, sizeof host);
            snprintf(text, cap, "[%s]:%u", host, (unsigned)ep->port);
        }
        return SOCK_STREAM;
    }
    struct sockaddr_un *u = (struct sockaddr_un *)ss;   /* shm only: its abstract socket */
    size_t n = strnlen(ep->uds, sizeof ep->uds);
    if (n == 0 || n + 1 > sizeof u->sun_path)
        return -1;
    u->sun_family = AF_UNIX;
    memcpy(u->sun_path + 1, ep->uds, n);
    *sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    snprintf(text, cap, "unix socket @%s", ep->uds);
    return 0;
}

static void *probe_main(void *arg)
{
    fr_master_probe *p = arg;
    fr_master *m = p->m;
    fr_region_desc rd;
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char where[160] = "?";
    int fd = -1, rc = fr_region_desc_decode(p->desc, p->desc_len, &rd);
    bool tcp = rc == 0 && (rd.ep.transports & FR_TRANSPORT_TCP);
    if (rc == 0 && endpoint_addr(&rd.ep, &ss, &sl, where, sizeof where) < 0)
        rc = FERRY_EINVAL;
    if (rc == 0) {
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        rc = fd < 0 ? FERRY_EIO
                    : fr_sock_connect_deadline(fd, &ss, sl, fr_deadline_ns(FR_MASTER_PROBE_MS));
    }
    if (rc == 0)
        rc = fr_sock_timeouts(fd, FR_MASTER_PROBE_MS);
    if (rc == 0)
        rc = fr_handshake_client(fd, m->key, fr_random_u64() | 1, rd.ep.instance,
                                 tcp ? FR_ROLE_TCP_STREAM : FR_ROLE_SHM_CTRL, 0, NULL, NULL);
    if (fd >= 0)
        close(fd);
    p->rc = rc;
    if (rc < 0)
        snprintf(p->why, sizeof p->why, "the node's engine at %.96s did not answer a probe: %s",
                 where, rc == FERRY_ESTALE ? "another engine instance answers there"
                                           : ferry_strerror(rc));
    pthread_mutex_lock(&m->mu);
    p->next = m->probed;
    m->probed = p;
    m->nprobes--;
    uint64_t one = 1;
    ssize_t n = write(m->handoff_efd, &one, sizeof one);
    (void)n;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int fr_master_probe_start(fr_master_conn *c, uint64_t req_id, const fr_smsg *q)
{
    fr_master *m = c->m;
    fr_master_probe *p = fr_calloc(1, sizeof *p);
    if (p == NULL)
        return FERRY_ENOMEM;
    *p = (fr_master_probe){ .m = m, .conn_serial = c->serial, .req_id = req_id,
                            .segment = q->segment, .node = q->node, .size = q->size,
                            .granule = q->granule, .desc_len = (uint16_t)q->val.n };
    memcpy(p->desc, q->val.p, q->val.n);   /* a validated descriptor: n >= 1 */
    if (q->key.n)
        memcpy(p->name, q->key.p, q->key.n);
    if (m->mem) {   /* no sockets: taken as answered (fuzzing, unit tests) */
        p->next = m->probed;
        m->probed = p;
        fr_master_probes_done(m);
        return 0;
    }
    pthread_mutex_lock(&m->mu);
    int rc = m->closing ? FERRY_ECANCELED : m->nprobes >= FR_MASTER_PROBES_MAX ? FERRY_EAGAIN : 0;
    if (rc == 0) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 256 * 1024);
        pthread_t t;
        if (pthread_create(&t, &at, probe_main, p) != 0)
            rc = FERRY_ENOMEM;
        else
            m->nprobes++;
        pthread_attr_destroy(&at);
    }
    pthread_mutex_unlock(&m->mu);
    if (rc < 0)
        fr_free(p);
    return rc;
}
