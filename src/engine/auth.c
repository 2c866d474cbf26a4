/* The engine's side of the connection handshake (wire/handshake.c): who
 * was refused and why goes to the log and the stats. */
#include <string.h>

#include "engine/engine_int.h"

int fr_auth_server(ferry_engine *e, int fd, uint16_t role, fr_msg_auth *auth)
{
    const char *why = "";
    int rc = fr_handshake_server(fd, e->auth_key, e->ep.instance, role, auth, &why);
    if (rc < 0) {
        char who[64];
        fr_sock_peername(fd, who, sizeof who);
        FR_WARN("auth", "refused connection from %s: %s", who, why);
        FR_STAT_ADD(e, auth_refused, 1);
        if (rc == FERRY_EPROTO)
            FR_STAT_ADD(e, frames_rejected, 1);
    }
    return rc;
}

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
