/* The engine's client side of the connection handshake (wire/handshake.c);
 * the serving side runs in each listener's accept gate (wire/hsgate.h). */
#include <string.h>

#include "engine/engine_int.h"

int fr_auth_client(ferry_engine *e, int fd, const fr_peer *p, uint16_t role, uint16_t stream,
                   uint32_t *server_pid, ferry_error *err)
{
    uint64_t inst = 0;
    int rc = fr_handshake_client(fd, e->auth_key, e->ep.instance, p->ep.instance, role, stream,
                                 &inst, server_pid);
    if (rc == FERRY_ESTALE)
        return fr_fail(err, rc, "it answers as instance %016llx, the descriptor names %016llx (the peer "
                       "restarted: take its new descriptor)", (unsigned long long)inst,
                       (unsigned long long)p->ep.instance);
    if (rc == FERRY_EAUTH)
        return fr_fail(err, rc, "the handshake failed: the peer refused our token or failed to prove its "
                       "own (do both sides use the same cluster token?)");
    if (rc < 0)
        return fr_fail(err, rc, "the handshake failed: %s", ferry_strerror(rc));
    return rc;
}
