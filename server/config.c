/*
 * config.c: the option table of giftd and everything driven by it: defaults,
 * the INI file (libinih), GIFTD_* environment variables, flags, --help and
 * --check-config. See config.h for the rules.
 */
#define _POSIX_C_SOURCE 200809L

#include "config.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gift_error.h"

/* ------------------------------------------------------------------ */
/* The option table                                                     */
/* ------------------------------------------------------------------ */

static const char *const log_level_names[] = {"debug", "info", "warn", "error", NULL};
static const char *const aggregate_names[] = {"eager", "ordered", NULL};
/* In the order of GIFT_POLICY_* (codec/gift_policy.h). */
static const char *const policy_names[] = {"all", "none", "auto", "hits", NULL};

_Static_assert(sizeof(enum gift_log_level) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(enum gift_aggregate) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(enum gift_config_policy) == sizeof(int), "enum fields are stored as int");

#define KIB (INT64_C(1) << 10)
#define MIB (INT64_C(1) << 20)
#define GIB (INT64_C(1) << 30)
#define FIELD(f) .offset = offsetof(gift_config_t, f), .size = sizeof(((gift_config_t *)0)->f)

/* Every option, in the order --help and --check-config list them. The default
 * is written as a user would write it and goes through the same parser as any
 * other value, so --help cannot show a default that differs from the real one. */
/* clang-format off */
static const gift_config_option_t options[] = {
    /* Actions: flags only, no value. */
    {.name = "help", .type = GIFT_CONFIG_ACTION, .where = GIFT_CONFIG_IN_FLAG, .short_flag = 'h',
     FIELD(help), .help = "Print this help and exit."},
    {.name = "version", .type = GIFT_CONFIG_ACTION, .where = GIFT_CONFIG_IN_FLAG, FIELD(version),
     .help = "Print the version and exit."},
    {.name = "check_config", .type = GIFT_CONFIG_ACTION, .where = GIFT_CONFIG_IN_FLAG,
     FIELD(check_config),
     .help = "Validate the configuration, print it as an INI file (noting where each\n"
             "value came from) and exit; an invalid one is reported with a non-zero exit."},
    {.name = "reset", .type = GIFT_CONFIG_ACTION, .where = GIFT_CONFIG_IN_FLAG, FIELD(reset),
     .help = "Move the state kept in data_dir (checkpoint and step logs) aside into\n"
             "data_dir/discarded-YYYYMMDDTHHMMSSZ/ before starting, so that the shard\n"
             "starts empty and adopts the next run; nothing is deleted."},
    {.name = "discard_state", .type = GIFT_CONFIG_ACTION, .where = GIFT_CONFIG_IN_FLAG,
     FIELD(discard_state),
     .help = "Move the state kept in data_dir (checkpoint, step logs and any file\n"
             "giftd does not know) aside into data_dir/discarded-YYYYMMDDTHHMMSSZ/\n"
             "before starting, so that the shard starts empty; nothing is deleted.\n"
             "Needed when giftd refuses a data_dir it cannot account for."},
    {.name = "config", .type = GIFT_CONFIG_STRING,
     .where = GIFT_CONFIG_IN_FLAG | GIFT_CONFIG_IN_ENV, FIELD(config), .defval = "",
     .metavar = "FILE",
     .help = "INI file to read; its keys, in section [giftd], are the option names\n"
             "below. Empty: no file."},

    /* Network. */
    {.name = "bind", .type = GIFT_CONFIG_STRING, .where = GIFT_CONFIG_IN_ALL,
     .flags = GIFT_CONFIG_NONEMPTY, FIELD(bind), .defval = "127.0.0.1", .metavar = "ADDR",
     .help = "Address to listen on: an IPv4 or IPv6 address (host names are not\n"
             "resolved); 0.0.0.0 or :: for all."},
    {.name = "port", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL, FIELD(port), .min = 0,
     .max = 65535, .defval = "7070", .metavar = "PORT",
     .help = "TCP port for workers. 0 picks a free port and prints it."},
    {.name = "http_port", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL, FIELD(http_port),
     .min = -1, .max = 65535, .off_word = "off", .off_value = -1, .defval = "7071",
     .metavar = "PORT",
     .help = "Port of /metrics, /livez and /readyz. 0 picks a free port;\n"
             "-1 or \"off\" disables HTTP."},

    /* Cluster. */
    {.name = "shard_id", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL, FIELD(shard_id),
     .min = 0, .max = 65535, .defval = "0", .metavar = "N",
     .help = "Index of this shard, 0 .. num_shards-1."},
    {.name = "num_shards", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL, FIELD(num_shards),
     .min = 1, .max = 65536, .defval = "1", .metavar = "N",
     .help = "Number of shards in the cluster."},
    {.name = "world_size", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL, FIELD(world_size),
     .flags = GIFT_CONFIG_REQUIRED, .min = 1, .max = 65536, .off_word = "auto", .off_value = 0,
     .defval = "auto", .metavar = "N|auto",
     .help = "Number of workers. Required: giftd does not start without it, so that\n"
             "no peer decides the cluster's shape. \"auto\" trusts the first Declare:\n"
             "the world size of the worker whose Declare first builds this shard's\n"
             "tensors (a Hello alone never sets it; with auth_key_file set, only a\n"
             "key holder can send that Declare). Use auto only where no other peer\n"
             "can reach giftd, or with auth_key_file."},

    /* Storage. */
    {.name = "data_dir", .type = GIFT_CONFIG_STRING, .where = GIFT_CONFIG_IN_ALL,
     .flags = GIFT_CONFIG_NONEMPTY, FIELD(data_dir), .defval = "./giftd-data", .metavar = "DIR",
     .help = "Directory for this shard's checkpoint and step log (relative paths\n"
             "start at the working directory; created when missing). Used only when\n"
             "checkpoint_steps > 0. One directory per shard and training run (a new\n"
             "run starts with an empty one): giftd refuses one that holds another\n"
             "shard's checkpoint, or a corrupt or truncated one."},

    /* Limits. */
    {.name = "max_connections", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_connections), .min = 1, .max = 1048576, .defval = "1024", .metavar = "N",
     .help = "Most connections held at once; further ones are refused."},
    {.name = "max_header_bytes", .type = GIFT_CONFIG_SIZE, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_header_bytes), .min = KIB, .max = GIB, .defval = "64k", .metavar = "SIZE",
     .help = "Largest frame header (protobuf message) accepted."},
    {.name = "max_frame_bytes", .type = GIFT_CONFIG_SIZE, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_frame_bytes), .min = 4 * KIB, .max = 16 * GIB, .defval = "64M", .metavar = "SIZE",
     .help = "Largest frame payload accepted; checked before anything is allocated."},
    {.name = "write_queue_bytes", .type = GIFT_CONFIG_SIZE, .where = GIFT_CONFIG_IN_ALL,
     FIELD(write_queue_bytes), .min = 64 * KIB, .max = 64 * GIB, .defval = "256M",
     .metavar = "SIZE",
     .help = "Bytes waiting to be sent on one connection past which the shard stops\n"
             "reading from that connection until they drain."},
    {.name = "chunk_bytes", .type = GIFT_CONFIG_SIZE, .where = GIFT_CONFIG_IN_ALL,
     FIELD(chunk_bytes), .min = KIB, .max = GIB, .defval = "4M", .metavar = "SIZE",
     .help = "The clients' chunk size in FP32 bytes (clients choose it). Not used by\n"
             "this version: a declared chunk is limited by max_frame_bytes. At most\n"
             "max_frame_bytes."},
    {.name = "max_parked", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_parked), .min = 1, .max = 16777216, .defval = "65536", .metavar = "N",
     .help = "Most pulls waiting for their step, per shard; further ones are refused."},
    {.name = "max_parked_per_peer", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_parked_per_peer), .min = 0, .max = 16777216, .defval = "0", .metavar = "N",
     .help = "Most pulls one connection may have waiting, so that one client cannot\n"
             "take every max_parked entry. 0: twice the chunks on this shard plus 64\n"
             "(what one worker can need)."},
    {.name = "max_memory", .type = GIFT_CONFIG_SIZE, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_memory), .min = 0, .max = INT64_MAX, .defval = "0", .metavar = "SIZE",
     .help = "Bytes the declared tensors may take on this shard (accumulators, reply\n"
             "buffers, kept pushes, residuals, geometry). A Declare that needs more\n"
             "is refused, naming the figure, before anything is allocated. 0: three\n"
             "quarters of the machine's physical memory."},
    {.name = "max_step_ahead", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_step_ahead), .min = 1, .max = INT_MAX, .defval = "1000000", .metavar = "N",
     .help = "How many steps past the newest step of this shard the first push of a\n"
             "chunk may be (it fixes the chunk's step window; later pushes may only be\n"
             "one step ahead). A run that resumes further out on a fresh shard needs\n"
             "more."},
    {.name = "max_buffer_bytes", .type = GIFT_CONFIG_SIZE, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_buffer_bytes), .min = MIB, .max = INT64_MAX, .defval = "1G", .metavar = "SIZE",
     .help = "Bytes held for all connections together in partial frames and in\n"
             "replies not yet sent. Past it, connections that are not a worker's are\n"
             "closed (a worker's holds at most one frame and write_queue_bytes)."},
    {.name = "handshake_timeout", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(handshake_timeout), .min = 1, .max = 3600, .defval = "10", .metavar = "SECONDS",
     .help = "A connection must complete its Hello (and authentication) this soon."},
    {.name = "read_timeout", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(read_timeout), .min = 1, .max = 86400, .defval = "60", .metavar = "SECONDS",
     .help = "A frame must arrive whole this soon after its first byte, or the\n"
             "connection is closed (a trickling writer cannot hold it)."},
    {.name = "idle_timeout", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(idle_timeout), .min = 1, .max = 604800, .defval = "300", .metavar = "SECONDS",
     .help = "A connection that is not a worker's (one that never declared, pushed or\n"
             "pulled) is closed after this long without a byte. A worker's is not:\n"
             "there is one per rank, and a new connection past max_connections closes\n"
             "the oldest connection that is not a worker's, so workers always get in."},
    {.name = "http_max_connections", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(http_max_connections), .min = 1, .max = 4096, .defval = "16", .metavar = "N",
     .help = "HTTP connections at once. Past it, the oldest one that has not sent its\n"
             "request is closed, so idle connections cannot make /livez fail."},
    {.name = "http_timeout", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(http_timeout), .min = 1, .max = 3600, .defval = "2", .metavar = "SECONDS",
     .help = "An HTTP connection must send its request this soon."},

    /* Operation. */
    {.name = "log_level", .type = GIFT_CONFIG_ENUM, .where = GIFT_CONFIG_IN_ALL,
     FIELD(log_level), .names = log_level_names, .defval = "info",
     .help = "Least severe level logged to stderr."},
    {.name = "stall_warn", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(stall_warn), .min = 0, .max = 604800, .defval = "30", .metavar = "SECONDS",
     .help = "Warn, naming the ranks that have not pushed, when a step has waited\n"
             "this many seconds. 0 = never."},
    {.name = "stall_timeout", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(stall_timeout), .min = 0, .max = 604800, .defval = "0", .metavar = "SECONDS",
     .help = "Fail the pulls of a step that has waited this many seconds. 0 = never."},
    {.name = "aggregate", .type = GIFT_CONFIG_ENUM, .where = GIFT_CONFIG_IN_ALL,
     FIELD(aggregate), .names = aggregate_names, .defval = "ordered",
     .help = "How pushes are summed. ordered: in rank order whatever the arrival\n"
             "order, so every step's mean is bit-reproducible (each rank's encoded\n"
             "push is kept until the step completes: 2 x world encoded chunks of\n"
             "memory per chunk; early arrivals are decoded once more). eager: each\n"
             "push is added as it arrives (less memory and work; with 3 or more\n"
             "workers the float sum depends on arrival order)."},
    {.name = "geometry_decay", .type = GIFT_CONFIG_REAL, .where = GIFT_CONFIG_IN_ALL,
     FIELD(geometry_decay), .min = 0, .max = 1, .defval = "0", .metavar = "BETA",
     .help = "GIFT geometry owners: build each epoch from a running average of the\n"
             "input covariance across refreshes, C = b C_previous + (1 - b) C_sketched,\n"
             "instead of the latest sketch round alone; b grows from BETA / (1 + BETA)\n"
             "at the second round to BETA (weights BETA^age over the rounds seen).\n"
             "0 <= BETA < 1; 0 = the latest round only. The first epoch is never\n"
             "averaged. Set the same value on every shard."},
    {.name = "policy", .type = GIFT_CONFIG_ENUM, .where = GIFT_CONFIG_IN_ALL, FIELD(policy),
     .names = policy_names, .defval = "all",
     .help = "GIFT geometry owners: how each tensor declared with geometry is treated,\n"
             "decided at every epoch and published with it, so every worker and shard\n"
             "apply the same. all: GIFT at the declared rank. none: Euclidean (T = I).\n"
             "auto: GIFT or Euclidean, the rank from {k/4, k/2, k} and, with\n"
             "budget_bits, the format, minimising the predicted whole-update error from\n"
             "the new geometry and the last averaged gradient. hits: GIFT where the\n"
             "fp8 boundary-hit rate is at least hits_threshold (the GIFT paper's rule).\n"
             "Run jointly over the tensors a shard owns; the decisions are kept in\n"
             "checkpoints and the step log."},
    {.name = "budget_bits", .type = GIFT_CONFIG_REAL, .where = GIFT_CONFIG_IN_ALL,
     FIELD(budget_bits), .min = 0, .max = 33, .defval = "0", .metavar = "BITS",
     .help = "Average wire bits per element over the tensors a shard owns (geometry\n"
             "bytes amortised over the refresh interval counted in): the owner may\n"
             "give a tensor a smaller format than declared (fp8 -> nvfp4) to meet it.\n"
             "Every shard holding it holds it for the whole model. 0 = unset: each\n"
             "tensor keeps the format its workers declared."},
    {.name = "max_transform_gflops", .type = GIFT_CONFIG_REAL, .where = GIFT_CONFIG_IN_ALL,
     FIELD(max_transform_gflops), .min = 0, .max = 1000000000, .defval = "0",
     .metavar = "GFLOP",
     .help = "Cap on the transform work per worker per step over the tensors a shard\n"
             "owns (T on push, T^-1 on pull: 8 rows din k flops, 4 rows din^2 for\n"
             "k >= din/2), for CPU workers: the owner lowers ranks or turns GIFT off to\n"
             "stay under it. 0 = no cap."},
    {.name = "hits_threshold", .type = GIFT_CONFIG_REAL, .where = GIFT_CONFIG_IN_ALL,
     FIELD(hits_threshold), .min = 0, .max = 1, .defval = "0", .metavar = "RATE",
     .help = "policy hits: GIFT for tensors whose fp8 boundary-hit rate (codes\n"
             "saturated or flushed per element) is at least RATE. 0 = the chooser's\n"
             "default (1e-3)."},
    {.name = "checkpoint_steps", .type = GIFT_CONFIG_INT, .where = GIFT_CONFIG_IN_ALL,
     FIELD(checkpoint_steps), .min = 0, .max = INT_MAX, .defval = "0", .metavar = "N",
     .help = "Persistence. N > 0: write a checkpoint to data_dir every N steps and on\n"
             "SIGTERM, append every finished step to a step log (fsynced before its\n"
             "pulls are answered) and restore both at start, so a shard killed and\n"
             "restarted loses nothing acknowledged. 0 = off: nothing is written or\n"
             "read, and a restarted shard starts empty."},
    {.name = "auth_key_file", .type = GIFT_CONFIG_STRING, .where = GIFT_CONFIG_IN_ALL,
     FIELD(auth_key_file), .defval = "", .metavar = "FILE",
     .help = "File holding the shared secret (16 to 4096 bytes, trailing whitespace\n"
             "ignored) for HMAC-SHA256 authentication at Hello; workers give the same\n"
             "file in GIFT_AUTH_KEY_FILE. It must not be readable by other users (chmod\n"
             "600). giftd refuses to start when it cannot load it. Empty: no\n"
             "authentication."},
};
/* clang-format on */

#define N_OPTIONS (sizeof options / sizeof options[0])
_Static_assert(N_OPTIONS <= GIFT_CONFIG_MAX_OPTIONS, "raise GIFT_CONFIG_MAX_OPTIONS");

const gift_config_option_t *gift_config_options(size_t *count)
{
    if (count != NULL)
        *count = N_OPTIONS;
    return options;
}

int gift_config_option_index(const char *name)
{
    if (name == NULL)
        return -1;
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strcmp(options[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ */
/* Names, errors, value parsing                                         */
/* ------------------------------------------------------------------ */

/* Longest "flag --x", "env GIFTD_X" or "FILE:LINE". */
#define SRC_MAX (GIFT_CONFIG_PATH_MAX + 32)
#define NAME_MAX_ 64

/* Writes "--max-connections" for max_connections. */
static void flag_name(const gift_config_option_t *o, char *buf, size_t len)
{
    size_t n = 0;

    buf[n++] = '-';
    buf[n++] = '-';
    for (const char *p = o->name; *p != '\0' && n + 1 < len; p++)
        buf[n++] = *p == '_' ? '-' : *p;
    buf[n] = '\0';
}

/* Writes "GIFTD_MAX_CONNECTIONS" for max_connections. */
static void env_name(const gift_config_option_t *o, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "GIFTD_");

    for (const char *p = o->name; *p != '\0' && n + 1 < len; p++)
        buf[n++] = (char)toupper((unsigned char)*p);
    buf[n] = '\0';
}

/* Formats into err (if any) and returns GIFT_ECONFIG. */
__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t errlen, const char *fmt,
                                                      ...)
{
    va_list ap;

    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return GIFT_ECONFIG;
}

/* Index of the option whose name equals s[0..len) when case is ignored and
 * '-' and '_' are taken as equal, or -1: the "did you mean" of typos like
 * --max_connections or max-connections. */
static int similar_option(const char *s, size_t len, unsigned where)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const char *n = options[i].name;
        size_t k;

        if (!(options[i].where & where) || strlen(n) != len)
            continue;
        for (k = 0; k < len; k++) {
            char a = (char)tolower((unsigned char)s[k]), b = n[k];
            if (a == '-')
                a = '_';
            if (a != b)
                break;
        }
        if (k == len)
            return (int)i;
    }
    return -1;
}

/* Writes "1G", "64M", "64k" or plain bytes: the shortest exact form. */
static void format_size(uint64_t v, char *buf, size_t len)
{
    if (v != 0 && v % (uint64_t)GIB == 0)
        snprintf(buf, len, "%lluG", (unsigned long long)(v / (uint64_t)GIB));
    else if (v != 0 && v % (uint64_t)MIB == 0)
        snprintf(buf, len, "%lluM", (unsigned long long)(v / (uint64_t)MIB));
    else if (v != 0 && v % (uint64_t)KIB == 0)
        snprintf(buf, len, "%lluk", (unsigned long long)(v / (uint64_t)KIB));
    else
        snprintf(buf, len, "%llu", (unsigned long long)v);
}

enum size_status { SIZE_OK, SIZE_NOT_NUMBER, SIZE_BAD_SUFFIX, SIZE_TOO_LARGE };

static enum size_status parse_size(const char *s, uint64_t *out)
{
    unsigned long long v;
    uint64_t mult = 1;
    char *end;

    if (s == NULL || !isdigit((unsigned char)s[0]))
        return SIZE_NOT_NUMBER;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return SIZE_TOO_LARGE;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        mult = (uint64_t)KIB;
        end++;
        break;
    case 'm':
    case 'M':
        mult = (uint64_t)MIB;
        end++;
        break;
    case 'g':
    case 'G':
        mult = (uint64_t)GIB;
        end++;
        break;
    default:
        return SIZE_BAD_SUFFIX;
    }
    if (*end != '\0')
        return SIZE_BAD_SUFFIX;
    if (v > UINT64_MAX / mult)
        return SIZE_TOO_LARGE;
    *out = (uint64_t)v * mult;
    return SIZE_OK;
}

int gift_config_parse_size(const char *s, uint64_t *out)
{
    uint64_t v;

    if (out == NULL || parse_size(s, &v) != SIZE_OK)
        return GIFT_EINVAL;
    *out = v;
    return 0;
}

int gift_config_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "1"};
    static const char *const no[] = {"false", "no", "0"};

    if (s == NULL || out == NULL)
        return GIFT_EINVAL;
    for (size_t i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return GIFT_EINVAL;
}

/* Decimal integer with an optional '-'; false when malformed or beyond int64. */
static bool parse_int(const char *s, int64_t *out)
{
    const char *d = s[0] == '-' ? s + 1 : s;
    long long v;
    char *end;

    if (!isdigit((unsigned char)d[0]))
        return false;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end != '\0')
        return false;
    *out = v;
    return true;
}

/* Decimal number (strtod, no hex, no inf/nan); false when malformed. */
static bool parse_real(const char *s, double *out)
{
    double v;
    char *end;

    if (s == NULL || strpbrk(s, "xXiInN") != NULL ||
        !(isdigit((unsigned char)s[0]) || s[0] == '.' || s[0] == '-'))
        return false;
    errno = 0;
    v = strtod(s, &end);
    if (errno == ERANGE || end == s || *end != '\0')
        return false;
    *out = v;
    return true;
}

/* The shortest of %.15g..%.17g that reads back as v. */
static void format_real(double v, char *buf, size_t len)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* ", one of debug, info, warn, error" style list of enum names. */
static void enum_list(const gift_config_option_t *o, const char *sep, char *buf, size_t len)
{
    size_t n = 0;

    buf[0] = '\0';
    for (size_t i = 0; o->names[i] != NULL && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? sep : "", o->names[i]);
}

/* Why a string value cannot be used, or NULL when it can. Values must survive
 * a round trip through an INI file (see gift_config_dump). */
static const char *string_problem(const char *v)
{
    size_t len = strlen(v);

    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)v[i];
        if (ch < 0x20 || ch == 0x7f)
            return "it contains a control character";
        if (ch == ';' && i > 0 && isspace((unsigned char)v[i - 1]))
            return "it contains a ';' after white space, which starts an INI comment";
    }
    if (len > 0 && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[len - 1])))
        return "it begins or ends with white space";
    return NULL;
}

/* Sets field from value for option o: a string: at most size - 1 bytes, not empty where NONEMPTY,
 * no control characters. 0, or GIFT_ECONFIG with a sentence in err naming src, the option and the
 * value. */
static int set_string(const gift_config_option_t *o, char *field, const char *value,
                      const char *src, char *err, size_t errlen)
{
    const char *why;
    if (strlen(value) >= o->size)
        return fail(err, errlen, "%s: invalid value for %s: %zu bytes long, the most is %zu", src,
                    o->name, strlen(value), o->size - 1);
    if ((o->flags & GIFT_CONFIG_NONEMPTY) && value[0] == '\0')
        return fail(err, errlen, "%s: invalid value for %s: it may not be empty", src, o->name);
    if ((why = string_problem(value)) != NULL)
        return fail(err, errlen, "%s: invalid value for %s: %s", src, o->name, why);
    memset(field, 0, o->size);
    memcpy(field, value, strlen(value));
    return 0;
}

/* Sets field from value for option o: an int in [min, max], or the option's off word.
 * 0, or GIFT_ECONFIG with a sentence in err naming src, the option and
 * the value. */
static int set_int(const gift_config_option_t *o, char *field, const char *value, const char *src,
                   enum gift_config_source from, char *err, size_t errlen)
{
    int64_t iv;
    assert(o->size == sizeof(int) && o->min >= INT_MIN && o->max <= INT_MAX);
    if (o->off_word != NULL && strcasecmp(value, o->off_word) == 0) {
        iv = o->off_value;
    } else if (!parse_int(value, &iv)) {
        return fail(err, errlen, "%s: invalid value for %s: '%s' is not an integer%s", src, o->name,
                    value,
                    from == GIFT_CONFIG_FROM_ENV && strncmp(value, "tcp://", 6) == 0
                        ? " (a Kubernetes service link? set enableServiceLinks: false "
                          "in the pod spec or rename the Service)"
                        : "");
    } else if (iv < o->min || iv > o->max) {
        return fail(err, errlen, "%s: invalid value for %s: %s is out of range %lld..%lld%s%s", src,
                    o->name, value, (long long)o->min, (long long)o->max, o->off_word ? " or " : "",
                    o->off_word ? o->off_word : "");
    }
    {
        int v = (int)iv;
        memcpy(field, &v, sizeof v);
    }
    return 0;
}

/* Sets field from value for option o: a size with an optional k, M or G suffix (powers of 1024) in
 * [min, max]. 0, or GIFT_ECONFIG with a sentence in err naming src, the option and the value. */
static int set_size(const gift_config_option_t *o, char *field, const char *value, const char *src,
                    char *err, size_t errlen)
{
    char lo[32], hi[32];
    uint64_t sv;
    assert(o->size == sizeof(uint64_t));
    switch (parse_size(value, &sv)) {
    case SIZE_OK:
        break;
    case SIZE_NOT_NUMBER:
        return fail(err, errlen,
                    "%s: invalid value for %s: '%s' is not a size (digits with an optional "
                    "k, M or G suffix)",
                    src, o->name, value);
    case SIZE_BAD_SUFFIX:
        return fail(err, errlen,
                    "%s: invalid value for %s: '%s' has a bad size suffix (use k, M or G, "
                    "powers of 1024)",
                    src, o->name, value);
    case SIZE_TOO_LARGE:
        sv = UINT64_MAX;
        break;
    }
    if (sv < (uint64_t)o->min || sv > (uint64_t)o->max) {
        format_size((uint64_t)o->min, lo, sizeof lo);
        format_size((uint64_t)o->max, hi, sizeof hi);
        return fail(err, errlen, "%s: invalid value for %s: %s is out of range %s..%s", src,
                    o->name, value, lo, hi);
    }
    memcpy(field, &sv, sizeof sv);
    return 0;
}

/* Sets field from value for option o: a boolean (true/false, yes/no, 1/0).
 * 0, or GIFT_ECONFIG with a sentence in err naming src, the option and
 * the value. */
static int set_bool(const gift_config_option_t *o, char *field, const char *value, const char *src,
                    char *err, size_t errlen)
{
    bool bv;
    assert(o->size == sizeof(bool));
    if (gift_config_parse_bool(value, &bv) < 0)
        return fail(err, errlen,
                    "%s: invalid value for %s: '%s' is not a boolean (true/false, yes/no, "
                    "1/0)",
                    src, o->name, value);
    memcpy(field, &bv, sizeof bv);
    return 0;
}

/* Sets field from value for option o: one of the option's names, as its index.
 * 0, or GIFT_ECONFIG with a sentence in err naming src, the option and
 * the value. */
static int set_enum(const gift_config_option_t *o, char *field, const char *value, const char *src,
                    char *err, size_t errlen)
{
    char list[128];
    int ev = -1;
    assert(o->size == sizeof(int));
    for (int k = 0; o->names[k] != NULL; k++)
        if (strcasecmp(value, o->names[k]) == 0)
            ev = k;
    if (ev < 0) {
        enum_list(o, ", ", list, sizeof list);
        return fail(err, errlen, "%s: invalid value for %s: '%s' is not one of %s", src, o->name,
                    value, list);
    }
    memcpy(field, &ev, sizeof ev);
    return 0;
}

/* Sets field from value for option o: a decimal number in [min, max), -0 stored as 0.
 * 0, or GIFT_ECONFIG with a sentence in err naming src, the option and
 * the value. */
static int set_real(const gift_config_option_t *o, char *field, const char *value, const char *src,
                    char *err, size_t errlen)
{
    double dv;
    assert(o->size == sizeof(double));
    if (!parse_real(value, &dv))
        return fail(err, errlen, "%s: invalid value for %s: '%s' is not a decimal number", src,
                    o->name, value);
    if (!(dv >= (double)o->min && dv < (double)o->max))
        return fail(err, errlen, "%s: invalid value for %s: %s is out of range %lld <= v < %lld",
                    src, o->name, value, (long long)o->min, (long long)o->max);
    if (dv == 0.0)
        dv = 0.0; /* "-0" */
    memcpy(field, &dv, sizeof dv);
    return 0;
}

/*
 * Parses `value` for option i, checks it (set_string ... set_real, by type) and stores it in *c
 * with its origin. `src` names where it came from for the error message. Returns 0 or GIFT_ECONFIG
 * with err filled in; *c is unchanged on error.
 */
static int set_value(gift_config_t *c, size_t i, const char *value, const char *src,
                     enum gift_config_source from, int line, char *err, size_t errlen)
{
    const gift_config_option_t *o = &options[i];
    char *field = (char *)c + o->offset;
    bool bv;
    int rc;

    switch (o->type) {
    case GIFT_CONFIG_STRING:
        if ((rc = set_string(o, field, value, src, err, errlen)) < 0)
            return rc;
        break;

    case GIFT_CONFIG_INT:
        if ((rc = set_int(o, field, value, src, from, err, errlen)) < 0)
            return rc;
        break;

    case GIFT_CONFIG_SIZE:
        if ((rc = set_size(o, field, value, src, err, errlen)) < 0)
            return rc;
        break;

    case GIFT_CONFIG_BOOL:
        if ((rc = set_bool(o, field, value, src, err, errlen)) < 0)
            return rc;
        break;

    case GIFT_CONFIG_ENUM:
        if ((rc = set_enum(o, field, value, src, err, errlen)) < 0)
            return rc;
        break;

    case GIFT_CONFIG_ACTION:
        assert(o->size == sizeof(bool));
        bv = true;
        memcpy(field, &bv, sizeof bv);
        break;

    case GIFT_CONFIG_REAL:
        if ((rc = set_real(o, field, value, src, err, errlen)) < 0)
            return rc;
        break;
    }
    c->origin[i].source = from;
    c->origin[i].line = line;
    return 0;
}

/* Describes where option i got its value: "default", "flag --port", ... */
static void describe_origin(const gift_config_t *c, size_t i, char *buf, size_t len)
{
    char name[NAME_MAX_];

    switch (c->origin[i].source) {
    case GIFT_CONFIG_FROM_FILE:
        snprintf(buf, len, "%s:%d", c->config, c->origin[i].line);
        break;
    case GIFT_CONFIG_FROM_ENV:
        env_name(&options[i], name, sizeof name);
        snprintf(buf, len, "env %s", name);
        break;
    case GIFT_CONFIG_FROM_FLAG:
        flag_name(&options[i], name, sizeof name);
        snprintf(buf, len, "flag %s", name);
        break;
    default:
        snprintf(buf, len, "default");
        break;
    }
}

/* Writes option i's value as it would be written in the INI file. */
static void format_value(const gift_config_t *c, size_t i, char *buf, size_t len)
{
    const gift_config_option_t *o = &options[i];
    const char *field = (const char *)c + o->offset;
    int iv;
    uint64_t sv;
    double dv;
    bool bv;

    switch (o->type) {
    case GIFT_CONFIG_STRING:
        snprintf(buf, len, "%s", field);
        break;
    case GIFT_CONFIG_INT:
        memcpy(&iv, field, sizeof iv);
        if (o->off_word != NULL && iv == o->off_value)
            snprintf(buf, len, "%s", o->off_word);
        else
            snprintf(buf, len, "%d", iv);
        break;
    case GIFT_CONFIG_SIZE:
        memcpy(&sv, field, sizeof sv);
        format_size(sv, buf, len);
        break;
    case GIFT_CONFIG_BOOL:
    case GIFT_CONFIG_ACTION:
        memcpy(&bv, field, sizeof bv);
        snprintf(buf, len, "%s", bv ? "true" : "false");
        break;
    case GIFT_CONFIG_ENUM:
        memcpy(&iv, field, sizeof iv);
        for (int k = 0; o->names[k] != NULL; k++)
            if (k == iv) {
                snprintf(buf, len, "%s", o->names[k]);
                return;
            }
        snprintf(buf, len, "%d", iv);
        break;
    case GIFT_CONFIG_REAL:
        memcpy(&dv, field, sizeof dv);
        format_real(dv, buf, len);
        break;
    }
}

void gift_config_defaults(gift_config_t *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        int rc;

        if (options[i].type == GIFT_CONFIG_ACTION)
            continue;
        rc = set_value(c, i, options[i].defval, "default", GIFT_CONFIG_FROM_DEFAULT, 0, NULL, 0);
        assert(rc == 0 && "a default in the option table does not parse");
        (void)rc;
    }
}

/* ------------------------------------------------------------------ */
/* The INI file                                                         */
/* ------------------------------------------------------------------ */

struct file_ctx {
    gift_config_t *c;
    FILE *f;
    int line;     /* lines read so far: the line inih is working on */
    int err_line; /* line of the first error we reported, 0 = none */
    char *err;
    size_t errlen;
    int set_line[N_OPTIONS]; /* where each key was set, to refuse repeats */
};

/*
 * The ini_reader: reads one line and counts it, so the handler knows its line
 * number (Debian's libinih is built without INI_HANDLER_LINENO). It refuses
 * lines longer than inih's buffer (inih would split them) and sections other
 * than [giftd] (inih reports no section that holds no key). It strips leading
 * white space, which turns off inih's continuation lines: an indented
 * "key = value" is read as a key, not as more of the previous value.
 * Returning NULL ends the parse.
 */
static char *file_reader(char *str, int num, void *stream)
{
    struct file_ctx *x = stream;
    const char *path = x->c->config;
    size_t len, skip;
    char *close;
    int ch;

    if (x->err_line != 0)
        return NULL;
    if (fgets(str, num, x->f) == NULL) {
        if (ferror(x->f)) {
            x->err_line = x->line + 1;
            fail(x->err, x->errlen, "%s:%d: read error: %s", path, x->err_line, strerror(errno));
        }
        return NULL;
    }
    x->line++;
    len = strlen(str);
    if (len > 0 && str[len - 1] != '\n' && (ch = getc(x->f)) != EOF && ch != '\n') {
        x->err_line = x->line;
        fail(x->err, x->errlen, "%s:%d: line longer than %d characters", path, x->line, num - 3);
        return NULL;
    }
    skip = x->line == 1 && strncmp(str, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0; /* UTF-8 BOM */
    for (; skip < len && (str[skip] == ' ' || str[skip] == '\t'); skip++)
        ;
    memmove(str, str + skip, len - skip + 1);
    if (str[0] == '[' && (close = strchr(str, ']')) != NULL) {
        size_t n = (size_t)(close - str - 1);
        if (n != strlen("giftd") || strncmp(str + 1, "giftd", n) != 0) {
            x->err_line = x->line;
            fail(x->err, x->errlen, "%s:%d: unknown section [%.*s] (giftd reads only [giftd])",
                 path, x->line, (int)n, str + 1);
            return NULL;
        }
    }
    return str;
}

/* The ini_handler: one "name = value" of the file. Returns 1 to go on, 0 on
 * error (after which the reader stops the parse). */
static int file_handler(void *user, const char *section, const char *name, const char *value)
{
    struct file_ctx *x = user;
    const char *path = x->c->config;
    char src[SRC_MAX];
    int i, rc;

    if (x->err_line != 0)
        return 0;
    snprintf(src, sizeof src, "%s:%d", path, x->line);
    i = gift_config_option_index(name);
    if (strcmp(section, "giftd") != 0) {
        rc = fail(x->err, x->errlen, "%s: option '%s' is outside the [giftd] section", src, name);
    } else if (i < 0 || !(options[i].where & GIFT_CONFIG_IN_FILE)) {
        int s = similar_option(name, strlen(name), GIFT_CONFIG_IN_FILE);
        if (i >= 0)
            rc = fail(x->err, x->errlen,
                      "%s: option '%s' cannot be set in the file (use the flag or the "
                      "environment)",
                      src, name);
        else if (s >= 0)
            rc = fail(x->err, x->errlen, "%s: unknown option '%s' (did you mean %s?)", src, name,
                      options[s].name);
        else
            rc = fail(x->err, x->errlen, "%s: unknown option '%s' in [giftd]", src, name);
    } else if (x->set_line[i] != 0) {
        rc = fail(x->err, x->errlen, "%s: option %s is already set at line %d", src, name,
                  x->set_line[i]);
    } else {
        rc = set_value(x->c, (size_t)i, value, src, GIFT_CONFIG_FROM_FILE, x->line, x->err,
                       x->errlen);
        x->set_line[i] = x->line;
    }
    if (rc < 0) {
        x->err_line = x->line;
        return 0;
    }
    return 1;
}

/* Reads the file named in c->config into *c. Returns 0 or GIFT_ECONFIG. */
static int load_file(gift_config_t *c, char *err, size_t errlen)
{
    struct file_ctx x = {.c = c, .err = err, .errlen = errlen};
    int rc;

    if ((x.f = fopen(c->config, "r")) == NULL) {
        rc = fail(err, errlen, "cannot open config file '%s': %s", c->config, strerror(errno));
        goto out;
    }
    rc = ini_parse_stream(file_reader, &x, file_handler, &x);
    if (rc > 0 && (x.err_line == 0 || rc < x.err_line)) {
        rc = fail(err, errlen,
                  "%s:%d: syntax error (expected 'name = value', '[giftd]' or a comment)",
                  c->config, rc);
    } else if (x.err_line != 0) {
        rc = GIFT_ECONFIG;
    } else if (rc != 0) {
        rc = fail(err, errlen, "%s: cannot parse (inih error %d)", c->config, rc);
    }
    fclose(x.f);
out:
    return rc;
}

/* ------------------------------------------------------------------ */
/* Environment and command line                                         */
/* ------------------------------------------------------------------ */

/* The value of `name` in envp (the first match), or NULL. */
static const char *env_lookup(char **envp, const char *name)
{
    size_t len = strlen(name);

    for (char **e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
            return *e + len + 1;
    return NULL;
}

/* Sets every option found in the environment, except `config`. */
static int load_env(gift_config_t *c, char **envp, char *err, size_t errlen)
{
    char name[NAME_MAX_], src[NAME_MAX_ + 8];
    const char *v;
    int rc;

    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (!(options[i].where & GIFT_CONFIG_IN_ENV) || strcmp(options[i].name, "config") == 0)
            continue;
        env_name(&options[i], name, sizeof name);
        if ((v = env_lookup(envp, name)) == NULL)
            continue;
        snprintf(src, sizeof src, "env %s", name);
        if ((rc = set_value(c, i, v, src, GIFT_CONFIG_FROM_ENV, 0, err, errlen)) < 0)
            return rc;
    }
    return 0;
}

/* Index of the flag-settable option whose flag is s[0..len) ("max-connections"). */
static int find_flag(const char *s, size_t len)
{
    char name[NAME_MAX_];

    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (!(options[i].where & GIFT_CONFIG_IN_FLAG))
            continue;
        flag_name(&options[i], name, sizeof name);
        if (strlen(name + 2) == len && strncmp(name + 2, s, len) == 0)
            return (int)i;
    }
    return -1;
}

/*
 * Walks the command line. With apply false (first pass) it checks the syntax,
 * sets the actions (help, version, check_config) and reports the last
 * --config value in *config_arg; it keeps going after an error, so that a
 * --help further on is still seen, and returns the first error. With apply
 * true (last pass) it sets every option except config, in order, so the last
 * of repeated flags wins.
 */
static int scan_argv(gift_config_t *c, int argc, char **argv, bool apply, const char **config_arg,
                     char *err, size_t errlen)
{
    int first = 0;

    for (int k = 1; k < argc; k++) {
        const char *a = argv[k], *eq, *value;
        char flag[NAME_MAX_], src[NAME_MAX_ + 8];
        int i = -1, rc = 0;
        size_t len;

        if (a[0] != '-' || a[1] == '\0') {
            rc = fail(err, errlen, "unexpected argument '%s' (giftd takes only flags; see --help)",
                      a);
            goto next;
        }
        if (a[1] != '-') {
            for (size_t j = 0; j < N_OPTIONS && a[2] == '\0'; j++)
                if (options[j].short_flag != 0 && options[j].short_flag == a[1])
                    i = (int)j;
            if (i < 0) {
                rc = fail(err, errlen, "unknown flag '%s' (see --help)", a);
                goto next;
            }
            eq = NULL;
        } else {
            eq = strchr(a + 2, '=');
            len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if ((i = find_flag(a + 2, len)) < 0) {
                int s = similar_option(a + 2, len, GIFT_CONFIG_IN_FLAG);
                if (s >= 0) {
                    flag_name(&options[s], flag, sizeof flag);
                    rc = fail(err, errlen, "unknown flag '%.*s' (did you mean %s?)", (int)len + 2,
                              a, flag);
                } else {
                    rc = fail(err, errlen, "unknown flag '%.*s' (see --help)", (int)len + 2, a);
                }
                goto next;
            }
        }
        flag_name(&options[i], flag, sizeof flag);
        snprintf(src, sizeof src, "flag %s", flag);

        if (options[i].type == GIFT_CONFIG_ACTION) {
            if (eq != NULL)
                rc = fail(err, errlen, "flag %s takes no value", flag);
            else if (!apply)
                rc = set_value(c, (size_t)i, "", src, GIFT_CONFIG_FROM_FLAG, 0, err, errlen);
            goto next;
        }
        if (eq != NULL) {
            value = eq + 1;
        } else if (k + 1 >= argc) {
            rc = fail(err, errlen, "flag %s needs a value", flag);
            goto next;
        } else if (strncmp(argv[k + 1], "--", 2) == 0) {
            rc = fail(err, errlen,
                      "flag %s needs a value, got the flag '%s' (write %s=VALUE "
                      "for a value that starts with --)",
                      flag, argv[k + 1], flag);
            goto next;
        } else {
            value = argv[++k];
        }
        if (strcmp(options[i].name, "config") == 0) {
            if (!apply)
                *config_arg = value;
        } else if (apply) {
            rc = set_value(c, (size_t)i, value, src, GIFT_CONFIG_FROM_FLAG, 0, err, errlen);
        }
    next:
        if (rc < 0 && apply)
            return rc;
        if (rc < 0 && first == 0) {
            first = rc;
            /* Keep the first message: later errors write into a scratch buffer. */
            err = NULL;
            errlen = 0;
        }
    }
    return first;
}

/* Checks that hold between options. */
static int check_whole(const gift_config_t *c, char *err, size_t errlen)
{
    char a[SRC_MAX], b[SRC_MAX], x[32], y[32];
    int shard = gift_config_option_index("shard_id"),
        nshards = gift_config_option_index("num_shards");
    int port = gift_config_option_index("port"), http = gift_config_option_index("http_port");
    int chunk = gift_config_option_index("chunk_bytes");
    int frame = gift_config_option_index("max_frame_bytes");
    int bind = gift_config_option_index("bind");
    unsigned char addr[16];

    if (inet_pton(AF_INET, c->bind, addr) != 1 && inet_pton(AF_INET6, c->bind, addr) != 1) {
        describe_origin(c, (size_t)bind, a, sizeof a);
        return fail(err, errlen,
                    "bind '%s' (%s) is not an IPv4 or IPv6 address (host names are not "
                    "resolved); use 127.0.0.1 for this host only, 0.0.0.0 or :: for all",
                    c->bind, a);
    }
    if (c->shard_id >= c->num_shards) {
        describe_origin(c, (size_t)shard, a, sizeof a);
        describe_origin(c, (size_t)nshards, b, sizeof b);
        return fail(err, errlen, "shard_id %d (%s) must be below num_shards %d (%s)", c->shard_id,
                    a, c->num_shards, b);
    }
    if (c->http_port > 0 && c->http_port == c->port) {
        describe_origin(c, (size_t)http, a, sizeof a);
        describe_origin(c, (size_t)port, b, sizeof b);
        return fail(err, errlen,
                    "http_port %d (%s) is the same as port (%s); use another port, 0 to pick "
                    "one, or off",
                    c->http_port, a, b);
    }
    if (c->chunk_bytes > c->max_frame_bytes) {
        describe_origin(c, (size_t)chunk, a, sizeof a);
        describe_origin(c, (size_t)frame, b, sizeof b);
        format_size(c->chunk_bytes, x, sizeof x);
        format_size(c->max_frame_bytes, y, sizeof y);
        return fail(err, errlen,
                    "chunk_bytes %s (%s) is above max_frame_bytes %s (%s): an f32 chunk could "
                    "not be pushed",
                    x, a, y, b);
    }
    return 0;
}

int gift_config_load(gift_config_t *c, int argc, char **argv, char **envp, char *err, size_t errlen)
{
    const char *config_arg = NULL, *v;
    int ci = gift_config_option_index("config");
    int rc;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    gift_config_defaults(c);

    rc = scan_argv(c, argc, argv, false, &config_arg, err, errlen);
    if (c->help || c->version)
        return 0;
    if (rc < 0)
        return rc;

    if (config_arg != NULL)
        rc = set_value(c, (size_t)ci, config_arg, "flag --config", GIFT_CONFIG_FROM_FLAG, 0, err,
                       errlen);
    else if ((v = env_lookup(envp, "GIFTD_CONFIG")) != NULL)
        rc = set_value(c, (size_t)ci, v, "env GIFTD_CONFIG", GIFT_CONFIG_FROM_ENV, 0, err, errlen);
    if (rc < 0)
        return rc;
    if (c->config[0] != '\0' && (rc = load_file(c, err, errlen)) < 0)
        return rc;
    if ((rc = load_env(c, envp, err, errlen)) < 0)
        return rc;
    if ((rc = scan_argv(c, argc, argv, true, NULL, err, errlen)) < 0)
        return rc;
    return check_whole(c, err, errlen);
}

int gift_config_check_required(const gift_config_t *c, char *err, size_t errlen)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if ((options[i].flags & GIFT_CONFIG_REQUIRED) &&
            c->origin[i].source == GIFT_CONFIG_FROM_DEFAULT) {
            char flag[64], env[64];
            flag_name(&options[i], flag, sizeof flag);
            env_name(&options[i], env, sizeof env);
            return fail(err, errlen,
                        "%s is not set: pass %s N (the number of workers), or %s auto to "
                        "trust the first Declare (key %s, env %s)",
                        options[i].name, flag, flag, options[i].name, env);
        }
    return 0;
}

/* ------------------------------------------------------------------ */
/* --help and --check-config                                            */
/* ------------------------------------------------------------------ */

/* Prints text indented by `indent`, breaking at each '\n'. */
static void print_indented(FILE *f, const char *text, int indent)
{
    while (*text != '\0') {
        size_t n = strcspn(text, "\n");
        fprintf(f, "%*s%.*s\n", indent, "", (int)n, text);
        text += n;
        if (*text == '\n')
            text++;
    }
}

void gift_config_usage(FILE *f)
{
    fputs("Usage: giftd [--config FILE] [OPTION...]\n"
          "\n"
          "Runs one shard of the giftd parameter server in the foreground, logging to\n"
          "stderr. Each option below can be set, from strongest to weakest, by its flag\n"
          "(--name VALUE or --name=VALUE), by its environment variable, by its key in\n"
          "section [giftd] of the configuration file, or by its default. Sizes take the\n"
          "suffixes k, M and G (powers of 1024).",
          f);
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].type == GIFT_CONFIG_BOOL) {
            fputs(" Booleans are true/false, yes/no or 1/0.", f);
            break;
        }
    fputs("\n\nOptions:\n", f);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const gift_config_option_t *o = &options[i];
        char flag[NAME_MAX_], env[NAME_MAX_], meta[128];
        bool sep = false;

        flag_name(o, flag, sizeof flag);
        if (o->type == GIFT_CONFIG_ENUM)
            enum_list(o, "|", meta, sizeof meta);
        else
            snprintf(meta, sizeof meta, "%s",
                     o->metavar                    ? o->metavar
                     : o->type == GIFT_CONFIG_BOOL ? "BOOL"
                                                   : "VALUE");
        fputs("  ", f);
        if (o->short_flag != 0)
            fprintf(f, "-%c, ", o->short_flag);
        if (o->type == GIFT_CONFIG_ACTION)
            fprintf(f, "%s\n", flag);
        else
            fprintf(f, "%s %s\n", flag, meta);
        print_indented(f, o->help, 6);
        if (o->type != GIFT_CONFIG_ACTION) {
            fputs("      ", f);
            if (o->where & GIFT_CONFIG_IN_FILE) {
                fprintf(f, "key: %s", o->name);
                sep = true;
            }
            if (o->where & GIFT_CONFIG_IN_ENV) {
                env_name(o, env, sizeof env);
                fprintf(f, "%senv: %s", sep ? "   " : "", env);
                sep = true;
            }
            if (o->flags & GIFT_CONFIG_REQUIRED)
                fprintf(f, "%srequired\n", sep ? "   " : "");
            else
                fprintf(f, "%sdefault: %s\n", sep ? "   " : "",
                        o->defval[0] != '\0' ? o->defval : "\"\" (none)");
        }
        fputc('\n', f);
    }
}

void gift_config_dump(const gift_config_t *c, FILE *f)
{
    char value[GIFT_CONFIG_PATH_MAX], origin[SRC_MAX];

    fputs("; giftd effective configuration (giftd --check-config).\n", f);
    if (c->config[0] != '\0')
        fprintf(f, "; Configuration file: %s\n", c->config);
    else
        fputs("; Configuration file: none\n", f);
    fputs("; A value not taken from the defaults is preceded by where it came from.\n", f);
    fputs("[giftd]\n", f);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (!(options[i].where & GIFT_CONFIG_IN_FILE))
            continue;
        if (c->origin[i].source != GIFT_CONFIG_FROM_DEFAULT) {
            describe_origin(c, i, origin, sizeof origin);
            fprintf(f, "; from %s\n", origin);
        }
        format_value(c, i, value, sizeof value);
        fprintf(f, "%s = %s\n", options[i].name, value);
    }
}
