/*
 * log.h: one line per event on stderr.
 *
 * Every line reads
 *
 *     2025-01-31T12:34:56.789Z INFO  shard=0 conn=12 accepted 10.0.0.7:51234
 *
 * that is: the UTC time (ISO 8601, milliseconds), the level padded to five
 * characters, the shard set with gift_log_set_shard(), "conn=N" when the event
 * concerns a connection (omitted for conn 0), then the message. Control
 * characters in the message are escaped (\n, \r, \t, \xHH) and one trailing
 * newline is dropped, so an event is always exactly one line; a message longer
 * than GIFT_LOG_LINE_MAX is cut and ends in "...".
 *
 * Each line is written with a single fwrite() on stderr, so lines from several
 * threads never interleave. The level and the shard may be changed from any
 * thread. gift_log() keeps errno as it found it.
 */
#ifndef GIFT_LOG_H
#define GIFT_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Levels, least severe first. The names are "debug", "info", "warn", "error". */
enum gift_log_level {
    GIFT_LOG_LEVEL_DEBUG = 0,
    GIFT_LOG_LEVEL_INFO = 1,
    GIFT_LOG_LEVEL_WARN = 2,
    GIFT_LOG_LEVEL_ERROR = 3
};

/* The longest line written, newline included. */
#define GIFT_LOG_LINE_MAX 2048

/* Writes one line for an event at `level` if `level` is at or above the
 * current level (see gift_log_set_level); otherwise does nothing. `conn` is the
 * connection id the event concerns, or 0 for none. `fmt` is printf-style. */
void gift_log(enum gift_log_level level, uint64_t conn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* gift_log() with a va_list, for wrappers. */
void gift_vlog(enum gift_log_level level, uint64_t conn, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Sets the least severe level that is written (default GIFT_LOG_LEVEL_INFO).
 * A value outside the enum is ignored. */
void gift_log_set_level(enum gift_log_level level);

/* Returns the current level. */
enum gift_log_level gift_log_get_level(void);

/* Sets the shard id printed as "shard=N" on every line (default 0). */
void gift_log_set_shard(int shard);

/* Parses a level name ("debug", "info", "warn", "error"; case-insensitive).
 * Returns the level (>= 0), or GIFT_EINVAL for NULL or an unknown name. */
int gift_log_level_parse(const char *name);

/* Returns the lower-case name of a level, or "unknown" outside the enum. */
const char *gift_log_level_name(int level);

/* The current level; read through gift_log_enabled(). */
extern atomic_int gift__log_level;

/* True when a line at `level` would be written. */
static inline bool gift_log_enabled(enum gift_log_level level)
{
    return (int)level >= atomic_load_explicit(&gift__log_level, memory_order_relaxed);
}

/* Logging macros: below the current level they neither format nor evaluate
 * their arguments. Use: GIFT_LOG_INFO(conn_id, "pushed %s", key). */
#define GIFT_LOG_AT_(level, conn, ...)                                                             \
    do {                                                                                           \
        if (gift_log_enabled(level))                                                               \
            gift_log((level), (conn), __VA_ARGS__);                                                \
    } while (0)
#define GIFT_LOG_DEBUG(conn, ...) GIFT_LOG_AT_(GIFT_LOG_LEVEL_DEBUG, conn, __VA_ARGS__)
#define GIFT_LOG_INFO(conn, ...) GIFT_LOG_AT_(GIFT_LOG_LEVEL_INFO, conn, __VA_ARGS__)
#define GIFT_LOG_WARN(conn, ...) GIFT_LOG_AT_(GIFT_LOG_LEVEL_WARN, conn, __VA_ARGS__)
#define GIFT_LOG_ERROR(conn, ...) GIFT_LOG_AT_(GIFT_LOG_LEVEL_ERROR, conn, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
