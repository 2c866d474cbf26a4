/* The UCX functions the ucx transport calls, reached through a table that
 * fr_ucx_load fills from libucp.so.0 (dlopen) the first time an engine
 * starts the transport: libferry does not link UCX, so a process that never
 * runs a ucx engine never maps UCX nor pays for its start-up.
 *
 * The transport's files call the UCX names as usual: each name below is a
 * macro for its slot in the table. Included by ucx_int.h after UCX's
 * headers; a UCX function the transport starts to use is added to
 * FR_UCX_FUNCS, or the link of anything using libferry.a fails. */
#ifndef FR_UCX_SYM_H
#define FR_UCX_SYM_H

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include "ferry/common.h"

/* What fr_ucx_load opens; FERRY_UCX_LIBRARY (a file name the dynamic loader
 * resolves, or a path) names another. */
#define FR_UCX_LIBRARY "libucp.so.0"

#define FR_UCX_FUNCS(X) \
    X(ucp_cleanup) X(ucp_config_modify) X(ucp_config_read) X(ucp_config_release) \
    X(ucp_ep_close_nbx) X(ucp_ep_create) X(ucp_ep_flush_nbx) X(ucp_ep_rkey_unpack) \
    X(ucp_get_nbx) X(ucp_init_version) X(ucp_mem_map) X(ucp_mem_query) X(ucp_mem_unmap) \
    X(ucp_put_nbx) X(ucp_request_check_status) X(ucp_request_free) X(ucp_rkey_buffer_release) \
    X(ucp_rkey_destroy) X(ucp_rkey_pack) X(ucp_worker_arm) X(ucp_worker_create) \
    X(ucp_worker_destroy) X(ucp_worker_get_address) X(ucp_worker_get_efd) \
    X(ucp_worker_progress) X(ucp_worker_release_address) X(ucs_log_push_handler) \
    X(ucs_status_string)

typedef struct fr_ucx_api {
#define FR_UCX_SLOT(f) __typeof__(f) *f;
    FR_UCX_FUNCS(FR_UCX_SLOT)
#undef FR_UCX_SLOT
} fr_ucx_api;

/* Filled once by fr_ucx_load; read-only after. */
extern fr_ucx_api fr_ucx;

/* Load UCX (once per process; later calls return the first call's result).
 * 0, or FERRY_ENOTSUP with err naming the library or the missing function.
 * UCX is never unloaded. */
int fr_ucx_load(ferry_error *err);

#ifndef FR_UCX_SYM_IMPL
#define ucp_cleanup (fr_ucx.ucp_cleanup)
#define ucp_config_modify (fr_ucx.ucp_config_modify)
#define ucp_config_read (fr_ucx.ucp_config_read)
#define ucp_config_release (fr_ucx.ucp_config_release)
#define ucp_ep_close_nbx (fr_ucx.ucp_ep_close_nbx)
#define ucp_ep_create (fr_ucx.ucp_ep_create)
#define ucp_ep_flush_nbx (fr_ucx.ucp_ep_flush_nbx)
#define ucp_ep_rkey_unpack (fr_ucx.ucp_ep_rkey_unpack)
#define ucp_get_nbx (fr_ucx.ucp_get_nbx)
/* ucp_init is an inline wrapper in ucp.h over ucp_init_version. */
#define ucp_init(params, cfg, ctx) \
    (fr_ucx.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, (params), (cfg), (ctx)))
#define ucp_mem_map (fr_ucx.ucp_mem_map)
#define ucp_mem_query (fr_ucx.ucp_mem_query)
#define ucp_mem_unmap (fr_ucx.ucp_mem_unmap)
#define ucp_put_nbx (fr_ucx.ucp_put_nbx)
#define ucp_request_check_status (fr_ucx.ucp_request_check_status)
#define ucp_request_free (fr_ucx.ucp_request_free)
#define ucp_rkey_buffer_release (fr_ucx.ucp_rkey_buffer_release)
#define ucp_rkey_destroy (fr_ucx.ucp_rkey_destroy)
#define ucp_rkey_pack (fr_ucx.ucp_rkey_pack)
#define ucp_worker_arm (fr_ucx.ucp_worker_arm)
#define ucp_worker_create (fr_ucx.ucp_worker_create)
#define ucp_worker_destroy (fr_ucx.ucp_worker_destroy)
#define ucp_worker_get_address (fr_ucx.ucp_worker_get_address)
#define ucp_worker_get_efd (fr_ucx.ucp_worker_get_efd)
#define ucp_worker_progress (fr_ucx.ucp_worker_progress)
#define ucp_worker_release_address (fr_ucx.ucp_worker_release_address)
#define ucs_log_push_handler (fr_ucx.ucs_log_push_handler)
#define ucs_status_string (fr_ucx.ucs_status_string)
#endif

#endif
