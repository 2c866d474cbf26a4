/* The /metrics endpoint of `ferry master --metrics` and `ferry node
 * --metrics`: libmicrohttpd on its own thread (never the master's loop),
 * serving GET /metrics in Prometheus text format (docs/operations.md,
 * "Metrics"). It lives in the CLI because the HTTP server belongs to the
 * processes: the library renders the text (ferry_master_metrics,
 * ferry_node_metrics) and links no HTTP code. */
#ifndef FERRY_CLI_METRICS_HTTP_H
#define FERRY_CLI_METRICS_HTTP_H

typedef struct cli_metrics cli_metrics;
/* The page's text: 0 and *text (ferry_store_free), or a negative code. */
typedef int (*cli_metrics_fn)(void *arg, char **text);

/* Bind HOST:PORT (IPv4; port 0 picks one; host "" or "*": every address)
 * and serve. 0, or -1 after a line on stderr naming cmd and what failed. */
int cli_metrics_start(const char *cmd, const char *addr, cli_metrics_fn fn, void *arg,
                      cli_metrics **out);
/* "HOST:PORT" bound. */
const char *cli_metrics_address(const cli_metrics *h);
/* Stop serving (requests in progress finish) and free. NULL ok. */
void cli_metrics_stop(cli_metrics *h);
/* Write "http://HOST:PORT/metrics\n" to path atomically. 0 or -1. */
int cli_metrics_write_file(const cli_metrics *h, const char *path);

#endif
