/* log.c: timestamped, one-line log events on stderr (see log.h). */
#define _POSIX_C_SOURCE 200809L

#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "gift_error.h"

atomic_int gift__log_level = GIFT_LOG_LEVEL_INFO;
static atomic_int log_shard = 0;

static const char *const level_names[] = {"debug", "info", "warn", "error"};
static const char *const level_tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
#define N_LEVELS (sizeof level_names / sizeof level_names[0])

void gift_log_set_level(enum gift_log_level level)
{
    if ((int)level >= 0 && (size_t)level < N_LEVELS)
        atomic_store_explicit(&gift__log_level, (int)level, memory_order_relaxed);
}

enum gift_log_level gift_log_get_level(void)
{
    return (enum gift_log_level)atomic_load_explicit(&gift__log_level, memory_order_relaxed);
}

void gift_log_set_shard(int shard)
{
    atomic_store_explicit(&log_shard, shard, memory_order_relaxed);
}

int gift_log_level_parse(const char *name)
{
    if (name == NULL)
        return GIFT_EINVAL;
    for (size_t i = 0; i < N_LEVELS; i++)
        if (strcasecmp(name, level_names[i]) == 0)
            return (int)i;
    return GIFT_EINVAL;
}

const char *gift_log_level_name(int level)
{
    if (level < 0 || (size_t)level >= N_LEVELS)
        return "unknown";
    return level_names[level];
}

/* Appends `msg` to line[*pos..cap-1) with control characters escaped. Stops
 * before a character whose escape would not fit; returns false then. */
static bool append_escaped(char *line, size_t *pos, size_t cap, const char *msg, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t p = *pos;
    bool fit = true;

    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)msg[i];
        char esc[4];
        size_t n;

        if (ch == '\n' || ch == '\r' || ch == '\t') {
            esc[0] = '\\';
            esc[1] = ch == '\n' ? 'n' : ch == '\r' ? 'r' : 't';
            n = 2;
        } else if (ch < 0x20 || ch == 0x7f) {
            esc[0] = '\\';
            esc[1] = 'x';
            esc[2] = hex[ch >> 4];
            esc[3] = hex[ch & 15];
            n = 4;
        } else {
            esc[0] = (char)ch;
            n = 1;
        }
        if (p + n > cap) {
            fit = false;
            break;
        }
        memcpy(line + p, esc, n);
        p += n;
    }
    *pos = p;
    return fit;
}

void gift_vlog(enum gift_log_level level, uint64_t conn, const char *fmt, va_list ap)
{
    char msg[GIFT_LOG_LINE_MAX];
    char line[GIFT_LOG_LINE_MAX];
    static const char cut[] = "...";
    int saved_errno = errno;
    struct timespec ts;
    struct tm tm;
    size_t pos, len, cap;
    int n;
    bool truncated;

    if ((int)level < 0 || (size_t)level >= N_LEVELS || !gift_log_enabled(level))
        goto out;

    n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0) {
        snprintf(msg, sizeof msg, "(bad log format: %s)", fmt);
        n = (int)strlen(msg);
    }
    truncated = (size_t)n >= sizeof msg;
    len = truncated ? sizeof msg - 1 : (size_t)n;
    if (!truncated && len > 0 && msg[len - 1] == '\n')
        len--;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    pos = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n = snprintf(line + pos, sizeof line - pos, ".%03ldZ %s shard=%d", ts.tv_nsec / 1000000L,
                 level_tags[level], atomic_load_explicit(&log_shard, memory_order_relaxed));
    pos += (size_t)n;
    if (conn != 0)
        pos +=
            (size_t)snprintf(line + pos, sizeof line - pos, " conn=%llu", (unsigned long long)conn);
    line[pos++] = ' ';

    /* Room for the message, keeping space for "..." and the newline. */
    cap = sizeof line - (sizeof cut - 1) - 1;
    if (!append_escaped(line, &pos, cap, msg, len))
        truncated = true;
    if (truncated) {
        memcpy(line + pos, cut, sizeof cut - 1);
        pos += sizeof cut - 1;
    }
    line[pos++] = '\n';
    fwrite(line, 1, pos, stderr);
out:
    errno = saved_errno;
}

void gift_log(enum gift_log_level level, uint64_t conn, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    gift_vlog(level, conn, fmt, ap);
    va_end(ap);
}
