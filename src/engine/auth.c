/* The engine's client side of the connection handshake (wire/handshake.c);
 * the serving side runs in each listener's accept gate (wire/hsgate.h). */
#include <string.h>

#include "engine/engine_int.h"

int fr_auth_client(ferry_engine *e, int fd, const fr_peer *p, uint16_t role, uint16_t stream,
                   uint32_t *server_pid)
{
    uint64_t inst = 0;
    int rc = fr_handshake_client(fd, e->auth_key, e->ep.instance, p->ep.instance, role, stream,
                                 &inst, server_pid);
    if (rc == FERRY_ESTALE)
        FR_WARN("auth", "peer at %u answers as instance %016llx, descriptor names %016llx",
                p->id, (unsigned long long)inst, (unsigned long long)p->ep.instance);
    else if (rc == FERRY_EAUTH)
        FR_WARN("auth", "peer %u refused our token or failed to prove its own", p->id);
    return rc;
}
