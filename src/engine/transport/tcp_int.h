/* tcp transport internals shared by its files: tcp_addr.c (addresses),
 * tcp_server.c (the serving side), tcp.c (the initiator side and the ops
 * table). */
#ifndef FR_TCP_INT_H
#define FR_TCP_INT_H

#include <limits.h>
#include <sys/socket.h>

#include "engine/engine_int.h"

#define TAG "tcp"
#define MAX_STREAMS 64u        /* post() tracks streams in a 64-bit mask */
#define SEND_BATCH 16          /* chunks per writev */
#define BATCH_BYTES (1u << 20) /* stop adding payloads to a writev past this */
/* Entries in a sender's gather list: one writev is one sendmsg. */
#define SEND_IOV IOV_MAX
/* Rows in one strided chunk (fr_transport.max_rows): a WRITE of this many
 * rows and its header fit in one gather list with room to spare. */
#define ROWS_MAX (SEND_IOV / 2)
#define HDR_CAP 128            /* room for header + meta of WRITE/READ/NOTIFY and the _ROWS forms */
#define CHUNK_COST 64          /* per-chunk weight in the stream load */
#define PEER_NAME 64

/* Fill the engine's endpoint and address from the bound listener address. */
void fr_tcp_publish_endpoint(ferry_engine *e, const struct sockaddr_storage *ss);
/* The socket address of a peer's tcp endpoint. */
int fr_tcp_endpoint_sockaddr(const fr_endpoint *ep, struct sockaddr_storage *ss, socklen_t *sl,
                             char *name, size_t namelen);
void fr_tcp_set_nodelay(int fd);

/* Serving side (fr_transport start/stop). */
int fr_tcp_start(ferry_engine *e, void **state, ferry_error *err);
void fr_tcp_stop(void *state);

#endif
