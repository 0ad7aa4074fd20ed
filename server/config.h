/*
 * config.h: the configuration of one giftd shard.
 *
 * Every option is described once, in the option table of config.c; the
 * parser, the defaults, --help (gift_config_usage) and --check-config
 * (gift_config_dump) are all driven by that table, so they cannot drift apart.
 * An option may be set, from strongest to weakest, by
 *
 *   - a long flag: --max-connections 64 or --max-connections=64
 *     (the option name with '_' written as '-');
 *   - an environment variable: GIFTD_MAX_CONNECTIONS=64 (GIFTD_ + upper case);
 *   - the INI file named by --config or GIFTD_CONFIG, key max_connections in
 *     section [giftd];
 *   - its default.
 *
 * Values are checked when they are read (integers and their ranges, sizes
 * with k/M/G suffixes, enum names) and once more as a whole (shard_id below
 * num_shards, ...). The INI file is strict: an unknown section, an unknown
 * key, a key outside [giftd], a repeated key or a malformed line is an error
 * naming the file and the line. Unknown GIFTD_* environment variables are
 * ignored, because Kubernetes injects GIFTD_SERVICE_HOST and the like into
 * every pod when a Service is called "giftd".
 *
 * To add an option: add its field to gift_config_t and one entry to the
 * table in config.c (name, type, field, range, default, help).
 */
#ifndef GIFT_CONFIG_H
#define GIFT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "log.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Capacity of the path options, terminating NUL included. */
#define GIFT_CONFIG_PATH_MAX 4096
/* Capacity of the bind address (a host name is at most 253 characters). */
#define GIFT_CONFIG_HOST_MAX 256
/* The most entries the option table may hold (origin[] is this long). */
#define GIFT_CONFIG_MAX_OPTIONS 64

/* How a shard adds up the pushes of one step. */
enum gift_aggregate {
    GIFT_AGGREGATE_EAGER = 0,  /* add each push to the accumulator as it arrives */
    GIFT_AGGREGATE_ORDERED = 1 /* add pushes in rank order: bit-reproducible sums */
};

/* The geometry owner's policy (the values of GIFT_POLICY_*, codec/gift_policy.h). */
enum gift_config_policy {
    GIFT_CONFIG_POLICY_ALL = 0,
    GIFT_CONFIG_POLICY_NONE = 1,
    GIFT_CONFIG_POLICY_AUTO = 2,
    GIFT_CONFIG_POLICY_HITS = 3
};

/* Where an option's value came from. */
enum gift_config_source {
    GIFT_CONFIG_FROM_DEFAULT = 0,
    GIFT_CONFIG_FROM_FILE,
    GIFT_CONFIG_FROM_ENV,
    GIFT_CONFIG_FROM_FLAG
};

typedef struct gift_config_origin {
    enum gift_config_source source;
    int line; /* for GIFT_CONFIG_FROM_FILE: the line in `config` */
} gift_config_origin_t;

/* The effective configuration. Plain data: copy it freely, nothing to free. */
typedef struct gift_config {
    /* Network. */
    char bind[GIFT_CONFIG_HOST_MAX]; /* address to listen on */
    int port;                        /* worker port; 0 = pick a free one */
    int http_port;                   /* metrics port; 0 = pick, -1 = HTTP disabled */
    /* Cluster. */
    int shard_id;   /* 0 .. num_shards-1 */
    int num_shards; /* shards in the cluster */
    int world_size; /* workers; 0 = from the first Declare's sender */
    /* Storage. */
    char data_dir[GIFT_CONFIG_PATH_MAX];
    /* Limits. */
    int max_connections;
    uint64_t max_header_bytes;  /* frame header (protobuf) limit */
    uint64_t max_frame_bytes;   /* frame payload limit */
    uint64_t write_queue_bytes; /* per connection; past it the shard stops reading it */
    uint64_t chunk_bytes;       /* the clients' chunk size, to validate declarations */
    int max_parked;             /* pulls waiting for their step, per shard */
    int max_parked_per_peer;    /* ... per connection; 0 = 2 x chunks + 64 */
    uint64_t max_memory;        /* bytes declared tensors may take; 0 = 3/4 of RAM */
    int max_step_ahead;         /* a chunk's first push: steps past the shard's newest */
    uint64_t max_buffer_bytes;  /* partial frames + queued output, all connections */
    int handshake_timeout;      /* seconds from accept to a completed Hello */
    int read_timeout;           /* seconds from a frame's first byte to its last */
    int idle_timeout;           /* seconds a connection that is not a rank's may be silent */
    int http_max_connections;   /* HTTP connections at once */
    int http_timeout;           /* seconds an HTTP connection may take to send its request */
    /* Operation. */
    enum gift_log_level log_level;
    int stall_warn;    /* seconds before a stalled step is logged; 0 = never */
    int stall_timeout; /* seconds before a stalled step fails; 0 = never */
    enum gift_aggregate aggregate;
    enum gift_config_policy policy;           /* the owner's per-tensor treatment */
    double budget_bits;                       /* bits per element; 0 = unset */
    double max_transform_gflops;              /* transform cap per worker step; 0 = none */
    double hits_threshold;                    /* policy hits; 0 = the chooser's default */
    int checkpoint_steps;                     /* checkpoint every N steps; 0 = off */
    double geometry_decay;                    /* covariance running average, [0, 1) */
    char auth_key_file[GIFT_CONFIG_PATH_MAX]; /* "" = no authentication */
    /* The file that was read ("" = none). */
    char config[GIFT_CONFIG_PATH_MAX];
    /* Actions requested on the command line; the caller acts on them. */
    bool help;          /* --help / -h: print gift_config_usage() and exit 0 */
    bool version;       /* --version: print the version and exit 0 */
    bool check_config;  /* --check-config: print gift_config_dump() and exit */
    bool reset;         /* --reset: discard data_dir's checkpoint and step logs, then start */
    bool discard_state; /* --discard-state: move data_dir's state aside, then start */
    /* Where each option's value came from, indexed like the option table. */
    gift_config_origin_t origin[GIFT_CONFIG_MAX_OPTIONS];
} gift_config_t;

/* Value types of the option table. */
enum gift_config_type {
    GIFT_CONFIG_STRING, /* char[] field; capacity is the field's size */
    GIFT_CONFIG_INT,    /* int field, decimal, range [min, max] */
    GIFT_CONFIG_SIZE,   /* uint64_t field, decimal with k/M/G (x1024), range [min, max] */
    GIFT_CONFIG_BOOL,   /* bool field: true/false, yes/no, 1/0 */
    GIFT_CONFIG_ENUM,   /* enum field: one of names[], stored as its index */
    GIFT_CONFIG_ACTION, /* bool field set by a flag that takes no value */
    GIFT_CONFIG_REAL    /* double field, decimal, min <= v < max (min, max integers) */
};

/* Where an option may be set (bit mask). */
#define GIFT_CONFIG_IN_FILE 1u
#define GIFT_CONFIG_IN_ENV 2u
#define GIFT_CONFIG_IN_FLAG 4u
#define GIFT_CONFIG_IN_ALL (GIFT_CONFIG_IN_FILE | GIFT_CONFIG_IN_ENV | GIFT_CONFIG_IN_FLAG)

/* Option flags. */
#define GIFT_CONFIG_NONEMPTY 1u /* a string that may not be empty */
#define GIFT_CONFIG_REQUIRED                                                                       \
    2u /* must be set (file, env or flag); its default is only a placeholder */

/* One entry of the option table. The flag is "--" + name with '_' -> '-';
 * the environment variable is "GIFTD_" + upper-case name. */
typedef struct gift_config_option {
    const char *name; /* INI key, e.g. "max_connections" */
    enum gift_config_type type;
    unsigned where;           /* GIFT_CONFIG_IN_* */
    unsigned flags;           /* GIFT_CONFIG_NONEMPTY, GIFT_CONFIG_REQUIRED */
    char short_flag;          /* e.g. 'h' for -h, or 0 */
    size_t offset;            /* of the field in gift_config_t */
    size_t size;              /* of the field */
    int64_t min, max;         /* INT and SIZE ranges; REAL: [min, max) */
    const char *const *names; /* ENUM: value names, NULL-terminated */
    const char *off_word;     /* INT: a word accepted for off_value ("off"), or NULL */
    int64_t off_value;
    const char *defval;  /* the default, as text a user would write */
    const char *metavar; /* placeholder in --help, e.g. "ADDR" */
    const char *help;    /* one or more sentences; '\n' breaks lines */
} gift_config_option_t;

/* Returns the option table and stores its length in *count. */
const gift_config_option_t *gift_config_options(size_t *count);

/* Returns the table index of the option called `name` (INI spelling), or -1. */
int gift_config_option_index(const char *name);

/* GIFT_ECONFIG with a message naming the first GIFT_CONFIG_REQUIRED option
 * that *c still holds at its default (no file, variable or flag set it), or
 * 0. giftd checks it after --help and --version, before anything else. */
int gift_config_check_required(const gift_config_t *c, char *err, size_t errlen);

/* Fills *c with the defaults of the option table; all origins are "default". */
void gift_config_defaults(gift_config_t *c);

/*
 * Builds the configuration from the defaults, the INI file, the environment
 * and the command line, in that order, so a flag beats an environment
 * variable, which beats the file, which beats the default.
 *
 * argv[0] is the program name and is skipped; argv may be NULL when argc is 0.
 * envp is a NULL-terminated "NAME=VALUE" array (main's third argument or
 * environ), or NULL for none. The file is named by --config, else by
 * GIFTD_CONFIG; an empty name means no file. Arguments are not modified.
 *
 * When --help, -h or --version is on the command line, returns 0 at once with
 * c->help or c->version set and the other fields at their defaults, whatever
 * else is wrong with the command line, the environment or the file.
 *
 * On error returns GIFT_ECONFIG and writes one line (no newline) into err
 * (truncated to errlen; err may be NULL when errlen is 0) naming where the
 * value came from ("flag --port", "env GIFTD_PORT", "FILE:LINE") and the
 * option; *c then holds a partly loaded configuration. Returns 0 on success.
 */
int gift_config_load(gift_config_t *c, int argc, char **argv, char **envp, char *err,
                     size_t errlen);

/* Prints --help: usage, precedence, then every option of the table with its
 * flag, INI key, environment variable, default and meaning. Check ferror(f)
 * for write errors. */
void gift_config_usage(FILE *f);

/* Prints the effective configuration as an INI file that gift_config_load
 * reads back to the same values: section [giftd], every option that the file
 * may hold, each non-default value preceded by a comment saying where it came
 * from. Check ferror(f) for write errors. */
void gift_config_dump(const gift_config_t *c, FILE *f);

/* Parses a byte size: decimal digits, optionally followed by one of k, M, G
 * (or lower-case m, g, upper-case K), meaning x1024, x1024^2, x1024^3.
 * Returns 0, or GIFT_EINVAL for an empty string, a sign, a bad suffix or an
 * overflow of uint64_t. */
int gift_config_parse_size(const char *s, uint64_t *out);

/* Parses a boolean: true/false, yes/no, 1/0 (case-insensitive).
 * Returns 0 or GIFT_EINVAL. */
int gift_config_parse_bool(const char *s, bool *out);

#ifdef __cplusplus
}
#endif
#endif
