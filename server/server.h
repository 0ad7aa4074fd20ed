/*
 * server.h: the giftd process around one shard: the libuv event loop, the
 * protocol listener, the HTTP listener, signals. server/net.c is the only
 * file of giftd that includes <uv.h>.
 */
#ifndef GIFT_SERVER_H
#define GIFT_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gift_server_opts {
    const char *bind;         /* address for both listeners */
    int port;                 /* 0: pick a free port */
    int http_port;            /* 0: pick; < 0: no HTTP listener */
    uint32_t max_connections; /* protocol connections; one past it gets EBUSY */
    uint32_t max_header_bytes;
    uint64_t max_frame_bytes;
    uint64_t write_queue_bytes; /* per connection; past it the shard stops reading it */
    /* Time limits, in seconds (0: the default in brackets). handshake: from
     * accept to a completed Hello [10]. read: from the first byte of a frame
     * to its last, while the shard reads [60]. idle: a connection that is
     * not a rank's (gift_shard_peer_claimed) and sends nothing [300]. */
    uint32_t handshake_timeout_s, read_timeout_s, idle_timeout_s;
    /* Bytes held for all connections together in partial frames and in
     * queued output [0: 1 GiB]. Past it connections that are not a rank's
     * are closed (the one adding to it, or the one with the most queued). */
    uint64_t max_buffer_bytes;
    /* The HTTP listener: connections at once [16] (past it the oldest one
     * still waiting for its request is closed) and the time a connection
     * may take to send its request [2 s]. */
    uint32_t http_max_connections, http_timeout_ms;
    gift_shard_opts_t shard;
    /* Called on SIGHUP (reload the log level); may be NULL. */
    void (*reload_cb)(void *arg);
    void *reload_arg;
} gift_server_opts_t;

typedef struct gift_server gift_server_t;

/* Creates the loop, the shard and both listeners (bound, listening). The
 * chosen ports are available from gift_server_port / _http_port. Returns 0
 * and *out, or a negative code with a sentence in err. */
int gift_server_new(const gift_server_opts_t *o, gift_server_t **out, char *err, size_t errlen);

/* Runs until a SIGTERM/SIGINT drain completes (returns 0) or the loop fails.
 * A second signal during the drain exits the process at once (status 1). */
int gift_server_run(gift_server_t *s);

/* Frees everything; the loop must have stopped. */
void gift_server_free(gift_server_t *s);

int gift_server_port(const gift_server_t *s);
int gift_server_http_port(const gift_server_t *s);

/* ------------------------------------------------------------------ */
/* HTTP and metrics (server/metrics.c, no libuv)                         */
/* ------------------------------------------------------------------ */

/* A growable string, reused between requests. */
typedef struct gift_str {
    char *p;
    size_t len, cap;
} gift_str_t;

int gift_str_printf(gift_str_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gift_str_free(gift_str_t *s);

/* Process facts the metrics need that the shard does not know. */
typedef struct gift_proc_info {
    uint32_t open_connections;
    uint64_t started_unix;
    int draining;
} gift_proc_info_t;

/* Renders the Prometheus text exposition of the shard's counters into out
 * (cleared first). Returns 0 or GIFT_ENOMEM. */
int gift_metrics_render(const gift_shard_t *s, const gift_proc_info_t *pi, gift_str_t *out);

/* Parses one HTTP/1.x request head (req, len bytes, ending with an empty
 * line) and writes a complete response with Connection: close into out:
 * GET /metrics, /livez, /readyz; 404 for other paths, 405 for other methods,
 * 400 for a malformed request line. Returns the HTTP status. */
int gift_http_respond(const char *req, size_t len, const gift_shard_t *s,
                      const gift_proc_info_t *pi, gift_str_t *out);

#ifdef __cplusplus
}
#endif
#endif
