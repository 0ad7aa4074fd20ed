/*
 * test_config.c: server/config.c (options from defaults, INI file,
 * environment and flags; --help; --check-config) and server/log.c (line
 * format, level filtering).
 *
 * Nothing here reads the real environment: every load gets its own envp.
 * Files are written under $TMPDIR (or /tmp) and removed by the fixture.
 */
#define _POSIX_C_SOURCE 200809L

#include <check.h>
#include <errno.h>
#include <regex.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "gift_error.h"
#include "log.h"
#include "gift_test_check.h"

#ifndef GIFT_SOURCE_DIR
#error "compile with -DGIFT_SOURCE_DIR=\"path of the source tree\""
#endif

#define ERRLEN 512

/* ------------------------------------------------------------------ */
/* Helpers                                                              */
/* ------------------------------------------------------------------ */

/* The temporary file of the current test ("" when none). */
static char tmp_path[256];

static void tmp_setup(void)
{
    tmp_path[0] = '\0';
}

static void tmp_teardown(void)
{
    if (tmp_path[0] != '\0')
        unlink(tmp_path);
}

/* Writes `content` to a fresh temporary file, returns its path. */
static const char *write_tmp(const char *content)
{
    const char *dir = getenv("TMPDIR");
    FILE *f;
    int fd;

    if (tmp_path[0] != '\0')
        unlink(tmp_path);
    snprintf(tmp_path, sizeof tmp_path, "%s/giftd-test-XXXXXX",
             dir != NULL && dir[0] != '\0' ? dir : "/tmp");
    fd = mkstemp(tmp_path);
    ck_assert_msg(fd >= 0, "mkstemp(%s): %s", tmp_path, strerror(errno));
    f = fdopen(fd, "w");
    ck_assert_msg(f != NULL, "fdopen: %s", strerror(errno));
    ck_assert_msg(fputs(content, f) >= 0 && fclose(f) == 0, "writing %s failed", tmp_path);
    return tmp_path;
}

/* Loads from NULL-terminated lists of arguments (without argv[0]) and
 * environment entries; either list may be NULL. */
static int load(gift_config_t *c, const char *const *args, const char *const *env, char *err,
                size_t errlen)
{
    char *argv[64], *envp[64];
    int argc = 0, n = 0;

    argv[argc++] = (char *)"giftd";
    for (; args != NULL && *args != NULL; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    for (; env != NULL && *env != NULL; env++)
        envp[n++] = (char *)*env;
    envp[n] = NULL;
    return gift_config_load(c, argc, argv, envp, err, errlen);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Loads and requires success, reporting the error message otherwise. */
static void load_ok(gift_config_t *c, const char *const *args, const char *const *env)
{
    char err[ERRLEN];
    int rc = load(c, args, env, err, sizeof err);

    ck_assert_msg(rc == 0, "gift_config_load returned %d: %s", rc, err);
}

/* Reads a whole stream (from its start) into a malloc'ed string. */
static char *slurp(FILE *f)
{
    size_t cap = 4096, len = 0, n;
    char *buf = malloc(cap);

    ck_assert_ptr_nonnull(buf);
    rewind(f);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    buf[len] = '\0';
    return buf;
}

static const gift_config_option_t *opt(const char *name)
{
    int i = gift_config_option_index(name);

    ck_assert_msg(i >= 0, "no option %s", name);
    return &gift_config_options(NULL)[i];
}

static enum gift_config_source origin_of(const gift_config_t *c, const char *name)
{
    return c->origin[gift_config_option_index(name)].source;
}

/* True when option o holds the same value in a and b. */
static bool same_value(const gift_config_option_t *o, const gift_config_t *a,
                       const gift_config_t *b)
{
    const char *fa = (const char *)a + o->offset, *fb = (const char *)b + o->offset;

    if (o->type == GIFT_CONFIG_STRING)
        return strcmp(fa, fb) == 0;
    return memcmp(fa, fb, o->size) == 0;
}

/* ------------------------------------------------------------------ */
/* Defaults and the table                                               */
/* ------------------------------------------------------------------ */

START_TEST(test_defaults)
{
    gift_config_t c, d;
    char err[ERRLEN];
    size_t n;

    gift_config_defaults(&c);
    ck_assert_str_eq(c.bind, "127.0.0.1");
    ck_assert_int_eq(c.port, 7070);
    ck_assert_int_eq(c.http_port, 7071);
    ck_assert_int_eq(c.shard_id, 0);
    ck_assert_int_eq(c.num_shards, 1);
    ck_assert_int_eq(c.world_size, 0);
    ck_assert_str_eq(c.data_dir, "./giftd-data");
    ck_assert_int_eq(c.max_connections, 1024);
    ck_assert_uint_eq(c.max_header_bytes, 64u << 10);
    ck_assert_uint_eq(c.max_frame_bytes, 64u << 20);
    ck_assert_uint_eq(c.write_queue_bytes, 256u << 20);
    ck_assert_uint_eq(c.chunk_bytes, 4u << 20);
    ck_assert_int_eq(c.max_parked, 65536);
    ck_assert_int_eq(c.log_level, GIFT_LOG_LEVEL_INFO);
    ck_assert_int_eq(c.stall_warn, 30);
    ck_assert_int_eq(c.stall_timeout, 0);
    ck_assert_int_eq(c.aggregate, GIFT_AGGREGATE_ORDERED);
    ck_assert_int_eq(c.checkpoint_steps, 0);
    ck_assert_msg(c.geometry_decay == 0.0, "geometry_decay %.17g", c.geometry_decay);
    ck_assert_str_eq(c.auth_key_file, "");
    ck_assert_str_eq(c.config, "");
    ck_assert(!c.help && !c.version && !c.check_config);
    gift_config_options(&n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(c.origin[i].source == GIFT_CONFIG_FROM_DEFAULT, "origin of option %zu: %d", i,
                      c.origin[i].source);

    /* Loading nothing, even with no argv and no environment, gives the defaults. */
    memset(&d, 0xA5, sizeof d);
    ck_assert_int_eq(gift_config_load(&d, 0, NULL, NULL, err, sizeof err), 0);
    ck_assert_msg(memcmp(&c, &d, sizeof c) == 0, "load of nothing differs from the defaults");
    load_ok(&d, NULL, L("PATH=/bin", "HOME=/root"));
    ck_assert_msg(memcmp(&c, &d, sizeof c) == 0, "load with unrelated env differs");
}
END_TEST

START_TEST(test_table)
{
    size_t n;
    const gift_config_option_t *t = gift_config_options(&n);

    ck_assert_uint_gt(n, 20);
    ck_assert_uint_le(n, GIFT_CONFIG_MAX_OPTIONS);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(strspn(t[i].name, "abcdefghijklmnopqrstuvwxyz_") == strlen(t[i].name),
                      "option name '%s' is not lower-case snake case", t[i].name);
        ck_assert_msg(t[i].help != NULL && t[i].help[0] != '\0', "%s has no help", t[i].name);
        ck_assert_msg(t[i].where != 0, "%s cannot be set anywhere", t[i].name);
        ck_assert_msg(t[i].type == GIFT_CONFIG_ACTION || t[i].defval != NULL, "%s has no default",
                      t[i].name);
        ck_assert_msg(t[i].offset + t[i].size <= offsetof(gift_config_t, origin),
                      "%s lies outside the option fields", t[i].name);
        ck_assert_int_eq(gift_config_option_index(t[i].name), (int)i);
        for (size_t j = 0; j < i; j++) {
            ck_assert_msg(strcmp(t[i].name, t[j].name) != 0, "%s twice", t[i].name);
            ck_assert_msg(t[i].offset != t[j].offset, "%s and %s share a field", t[i].name,
                          t[j].name);
        }
    }
    ck_assert_int_eq(gift_config_option_index("no_such_option"), -1);
    ck_assert_int_eq(gift_config_option_index(NULL), -1);

    /* The log_level names are the log module's. */
    const gift_config_option_t *ll = opt("log_level");
    for (int k = 0; ll->names[k] != NULL; k++) {
        ck_assert_int_eq(gift_log_level_parse(ll->names[k]), k);
        ck_assert_str_eq(gift_log_level_name(k), ll->names[k]);
    }
    ck_assert_str_eq(opt("aggregate")->names[GIFT_AGGREGATE_EAGER], "eager");
    ck_assert_str_eq(opt("aggregate")->names[GIFT_AGGREGATE_ORDERED], "ordered");
}
END_TEST

START_TEST(test_parse_size)
{
    static const struct {
        const char *s;
        int rc;
        uint64_t v;
    } cases[] = {
        {"0", 0, 0},
        {"1", 0, 1},
        {"4096", 0, 4096},
        {"64k", 0, 64u << 10},
        {"64K", 0, 64u << 10},
        {"64M", 0, 64u << 20},
        {"64m", 0, 64u << 20},
        {"2G", 0, UINT64_C(2) << 30},
        {"2g", 0, UINT64_C(2) << 30},
        {"007k", 0, 7u << 10},
        {"17179869183G", 0, UINT64_C(17179869183) << 30},
        {"17179869184G", GIFT_EINVAL, 0},         /* 2^64: overflows */
        {"99999999999999999999", GIFT_EINVAL, 0}, /* beyond uint64 */
        {"", GIFT_EINVAL, 0},
        {"k", GIFT_EINVAL, 0},
        {"-1", GIFT_EINVAL, 0},
        {"+1", GIFT_EINVAL, 0},
        {" 1", GIFT_EINVAL, 0},
        {"1 ", GIFT_EINVAL, 0},
        {"1kk", GIFT_EINVAL, 0},
        {"1kB", GIFT_EINVAL, 0},
        {"1T", GIFT_EINVAL, 0},
        {"1.5M", GIFT_EINVAL, 0},
        {"0x10", GIFT_EINVAL, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 12345;
        int rc = gift_config_parse_size(cases[i].s, &v);
        ck_assert_msg(rc == cases[i].rc, "parse_size('%s') returned %d, want %d", cases[i].s, rc,
                      cases[i].rc);
        if (rc == 0)
            ck_assert_msg(v == cases[i].v, "parse_size('%s') = %llu, want %llu", cases[i].s,
                          (unsigned long long)v, (unsigned long long)cases[i].v);
        else
            ck_assert_msg(v == 12345, "parse_size('%s') wrote the output on error", cases[i].s);
    }
    ck_assert_int_eq(gift_config_parse_size(NULL, NULL), GIFT_EINVAL);
}
END_TEST

START_TEST(test_parse_bool)
{
    static const char *const yes[] = {"true", "TRUE", "True", "yes", "YES", "1"};
    static const char *const no[] = {"false", "FALSE", "no", "No", "0"};
    static const char *const bad[] = {"", "y", "n", "on", "off", "2", "truee", " true", "-1"};
    bool b;

    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        b = false;
        ck_assert_msg(gift_config_parse_bool(yes[i], &b) == 0 && b, "'%s' is not true", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        b = true;
        ck_assert_msg(gift_config_parse_bool(no[i], &b) == 0 && !b, "'%s' is not false", no[i]);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(gift_config_parse_bool(bad[i], &b) == GIFT_EINVAL, "'%s' was accepted",
                      bad[i]);
    ck_assert_int_eq(gift_config_parse_bool(NULL, &b), GIFT_EINVAL);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Sources                                                              */
/* ------------------------------------------------------------------ */

static const char full_file[] = "; a comment\n"
                                "# another comment\n"
                                "\n"
                                "[giftd]\n"
                                "bind = 0.0.0.0\n"
                                "port=9000\n"
                                "   http_port = off        ; an inline comment\n"
                                "shard_id = 2\n"
                                "num_shards = 4\n"
                                "world_size = 8\n"
                                "data_dir = /var/lib/giftd\n"
                                "max_connections = 64\n"
                                "max_header_bytes = 128k\n"
                                "max_frame_bytes = 1G\n"
                                "write_queue_bytes = 512M\n"
                                "chunk_bytes = 8M\n"
                                "max_parked = 100\n"
                                "log_level = DEBUG\n"
                                "stall_warn = 5\n"
                                "stall_timeout = 600\n"
                                "aggregate = ordered\n"
                                "checkpoint_steps = 1000\n"
                                "auth_key_file = /etc/giftd/key\n";

static void check_full_file(const gift_config_t *c, const char *path)
{
    ck_assert_str_eq(c->config, path);
    ck_assert_str_eq(c->bind, "0.0.0.0");
    ck_assert_int_eq(c->port, 9000);
    ck_assert_int_eq(c->http_port, -1);
    ck_assert_int_eq(c->shard_id, 2);
    ck_assert_int_eq(c->num_shards, 4);
    ck_assert_int_eq(c->world_size, 8);
    ck_assert_str_eq(c->data_dir, "/var/lib/giftd");
    ck_assert_int_eq(c->max_connections, 64);
    ck_assert_uint_eq(c->max_header_bytes, 128u << 10);
    ck_assert_uint_eq(c->max_frame_bytes, 1u << 30);
    ck_assert_uint_eq(c->write_queue_bytes, 512u << 20);
    ck_assert_uint_eq(c->chunk_bytes, 8u << 20);
    ck_assert_int_eq(c->max_parked, 100);
    ck_assert_int_eq(c->log_level, GIFT_LOG_LEVEL_DEBUG);
    ck_assert_int_eq(c->stall_warn, 5);
    ck_assert_int_eq(c->stall_timeout, 600);
    ck_assert_int_eq(c->aggregate, GIFT_AGGREGATE_ORDERED);
    ck_assert_int_eq(c->checkpoint_steps, 1000);
    ck_assert_str_eq(c->auth_key_file, "/etc/giftd/key");
    ck_assert_int_eq(origin_of(c, "port"), GIFT_CONFIG_FROM_FILE);
    ck_assert_int_eq(c->origin[gift_config_option_index("port")].line, 6);
    ck_assert_int_eq(c->origin[gift_config_option_index("http_port")].line, 7);
    ck_assert_int_eq(origin_of(c, "config"), GIFT_CONFIG_FROM_FLAG);
}

START_TEST(test_file)
{
    gift_config_t c;
    const char *path = write_tmp(full_file);

    load_ok(&c, L("--config", path), NULL);
    check_full_file(&c, path);
}
END_TEST

/* The same file with CRLF line ends and a UTF-8 byte order mark. */
START_TEST(test_file_crlf_bom)
{
    gift_config_t c;
    char buf[sizeof full_file * 2 + 4];
    size_t n = 0;

    memcpy(buf, "\xEF\xBB\xBF", 3);
    n = 3;
    for (const char *p = full_file; *p != '\0'; p++) {
        if (*p == '\n')
            buf[n++] = '\r';
        buf[n++] = *p;
    }
    buf[n] = '\0';
    const char *path = write_tmp(buf);
    load_ok(&c, L("--config", path), NULL);
    check_full_file(&c, path);

    /* A BOM before the section header still allows only [giftd]. */
    char err[ERRLEN];
    path = write_tmp("\xEF\xBB\xBF[other]\n");
    ck_assert_int_eq(load(&c, L("--config", path), NULL, err, sizeof err), GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "unknown section [other]") != NULL, "err: %s", err);
}
END_TEST

START_TEST(test_file_empty_and_sections)
{
    gift_config_t c, d;

    gift_config_defaults(&d);
    /* An empty file, a bare section, a repeated section: all defaults. */
    load_ok(&c, L("--config", write_tmp("")), NULL);
    ck_assert_int_eq(c.port, d.port);
    load_ok(&c, L("--config", write_tmp("[giftd]\n")), NULL);
    ck_assert_int_eq(c.port, d.port);
    load_ok(&c, L("--config", write_tmp("[giftd]\nport = 1\n[giftd]\nbind = ::\n")), NULL);
    ck_assert_int_eq(c.port, 1);
    ck_assert_str_eq(c.bind, "::");
    /* An empty string value; a file without a final newline. */
    load_ok(&c, L("--config", write_tmp("[giftd]\nauth_key_file =\nport = 2")), NULL);
    ck_assert_str_eq(c.auth_key_file, "");
    ck_assert_int_eq(c.port, 2);
    /* An indented key is a key, not a continuation of the previous value. */
    load_ok(&c, L("--config", write_tmp("[giftd]\nbind = ::1\n    port = 3\n")), NULL);
    ck_assert_str_eq(c.bind, "::1");
    ck_assert_int_eq(c.port, 3);
}
END_TEST

START_TEST(test_flags)
{
    gift_config_t c;

    load_ok(&c,
            L("--port", "9000", "--http-port=9001", "--bind", "::", "--data-dir=/srv/g",
              "--max-connections", "12", "--max-frame-bytes=1G", "--write-queue-bytes", "1M",
              "--log-level=warn", "--aggregate", "eager", "--shard-id", "1", "--num-shards=3",
              "--stall-timeout", "60", "--auth-key-file=/k", "--check-config", "--geometry-decay",
              "0.9"),
            NULL);
    ck_assert_msg(c.geometry_decay == 0.9, "geometry_decay %.17g", c.geometry_decay);
    ck_assert_msg(c.policy == GIFT_CONFIG_POLICY_ALL && c.budget_bits == 0.0 &&
                      c.max_transform_gflops == 0.0 && c.hits_threshold == 0.0,
                  "policy defaults %d %g %g %g", (int)c.policy, c.budget_bits,
                  c.max_transform_gflops, c.hits_threshold);
    load_ok(&c,
            L("--policy", "hits", "--budget-bits=6.5", "--max-transform-gflops", "2.5",
              "--hits-threshold=0.01"),
            NULL);
    ck_assert_msg(c.policy == GIFT_CONFIG_POLICY_HITS && c.budget_bits == 6.5 &&
                      c.max_transform_gflops == 2.5 && c.hits_threshold == 0.01,
                  "policy flags %d %g %g %g", (int)c.policy, c.budget_bits, c.max_transform_gflops,
                  c.hits_threshold);
    /* A policy with checkpoints: its decisions are persisted (issue 24). */
    load_ok(&c, L("--policy=auto", "--budget-bits", "6", "--checkpoint-steps", "10"), NULL);
    ck_assert_msg(c.policy == GIFT_CONFIG_POLICY_AUTO && c.budget_bits == 6.0 &&
                      c.checkpoint_steps == 10,
                  "policy %d budget %g checkpoint_steps %d with checkpoints", (int)c.policy,
                  c.budget_bits, c.checkpoint_steps);
    load_ok(&c,
            L("--port", "9000", "--http-port=9001", "--bind", "::", "--data-dir=/srv/g",
              "--max-connections", "12", "--max-frame-bytes=1G", "--write-queue-bytes", "1M",
              "--log-level=warn", "--aggregate", "eager", "--shard-id", "1", "--num-shards=3",
              "--stall-timeout", "60", "--auth-key-file=/k", "--check-config", "--geometry-decay",
              "0.9"),
            NULL);
    ck_assert_int_eq(c.port, 9000);
    ck_assert_int_eq(c.http_port, 9001);
    ck_assert_str_eq(c.bind, "::");
    ck_assert_str_eq(c.data_dir, "/srv/g");
    ck_assert_int_eq(c.max_connections, 12);
    ck_assert_uint_eq(c.max_frame_bytes, 1u << 30);
    ck_assert_uint_eq(c.write_queue_bytes, 1u << 20);
    ck_assert_int_eq(c.log_level, GIFT_LOG_LEVEL_WARN);
    ck_assert_int_eq(c.aggregate, GIFT_AGGREGATE_EAGER);
    ck_assert_int_eq(c.shard_id, 1);
    ck_assert_int_eq(c.num_shards, 3);
    ck_assert_int_eq(c.stall_timeout, 60);
    ck_assert_str_eq(c.auth_key_file, "/k");
    ck_assert(c.check_config && !c.help && !c.version);
    ck_assert_int_eq(origin_of(&c, "port"), GIFT_CONFIG_FROM_FLAG);
    ck_assert_int_eq(origin_of(&c, "stall_warn"), GIFT_CONFIG_FROM_DEFAULT);

    /* A negative value as the next argument; "off"; the last repeat wins. */
    load_ok(&c, L("--http-port", "-1"), NULL);
    ck_assert_int_eq(c.http_port, -1);
    load_ok(&c, L("--http-port", "OFF"), NULL);
    ck_assert_int_eq(c.http_port, -1);
    load_ok(&c, L("--http-port=0", "--port", "0"), NULL);
    ck_assert_int_eq(c.http_port, 0);
    ck_assert_int_eq(c.port, 0);
    load_ok(&c, L("--port", "1", "--port=2", "--port", "3"), NULL);
    ck_assert_int_eq(c.port, 3);
    /* "--name=" gives an empty value; "=" may appear inside a value. */
    load_ok(&c, L("--auth-key-file=", "--data-dir=/a=b"), NULL);
    ck_assert_str_eq(c.auth_key_file, "");
    ck_assert_str_eq(c.data_dir, "/a=b");
}
END_TEST

START_TEST(test_env)
{
    gift_config_t c;
    const char *path = write_tmp("[giftd]\nworld_size = 16\n");
    char cfg[300];

    snprintf(cfg, sizeof cfg, "GIFTD_CONFIG=%s", path);
    load_ok(&c, NULL,
            L("PATH=/usr/bin", "GIFTD_PORT=9100", "GIFTD_LOG_LEVEL=error", "GIFTD_DATA_DIR=/d",
              "GIFTD_MAX_HEADER_BYTES=1M", "GIFTD_HTTP_PORT=off", cfg,
              /* Unknown GIFTD_* variables (Kubernetes service links) are ignored. */
              "GIFTD_SERVICE_HOST=1.2.3.4", "GIFTD_PORTX=1", "giftd_port=2",
              /* The first of two entries counts, as with getenv. */
              "GIFTD_SHARD_ID=0", "GIFTD_SHARD_ID=5"));
    ck_assert_int_eq(c.port, 9100);
    ck_assert_int_eq(c.log_level, GIFT_LOG_LEVEL_ERROR);
    ck_assert_str_eq(c.data_dir, "/d");
    ck_assert_uint_eq(c.max_header_bytes, 1u << 20);
    ck_assert_int_eq(c.http_port, -1);
    ck_assert_int_eq(c.shard_id, 0);
    ck_assert_int_eq(c.world_size, 16);
    ck_assert_str_eq(c.config, path);
    ck_assert_int_eq(origin_of(&c, "port"), GIFT_CONFIG_FROM_ENV);
    ck_assert_int_eq(origin_of(&c, "config"), GIFT_CONFIG_FROM_ENV);
    ck_assert_int_eq(origin_of(&c, "world_size"), GIFT_CONFIG_FROM_FILE);
}
END_TEST

/* One option (port) set by each source in turn: flag > env > file > default. */
START_TEST(test_precedence)
{
    gift_config_t c;
    const char *path = write_tmp("[giftd]\nport = 1111\n");
    char cfg[300];

    snprintf(cfg, sizeof cfg, "GIFTD_CONFIG=%s", path);
    load_ok(&c, L("--port", "3333"), L(cfg, "GIFTD_PORT=2222"));
    ck_assert_int_eq(c.port, 3333);
    ck_assert_int_eq(origin_of(&c, "port"), GIFT_CONFIG_FROM_FLAG);
    load_ok(&c, NULL, L(cfg, "GIFTD_PORT=2222"));
    ck_assert_int_eq(c.port, 2222);
    ck_assert_int_eq(origin_of(&c, "port"), GIFT_CONFIG_FROM_ENV);
    load_ok(&c, NULL, L(cfg));
    ck_assert_int_eq(c.port, 1111);
    ck_assert_int_eq(origin_of(&c, "port"), GIFT_CONFIG_FROM_FILE);
    load_ok(&c, NULL, NULL);
    ck_assert_int_eq(c.port, 7070);
    ck_assert_int_eq(origin_of(&c, "port"), GIFT_CONFIG_FROM_DEFAULT);
    /* Flag beats file without env too, and --config beats GIFTD_CONFIG. */
    load_ok(&c, L("--config", path, "--port=3333"), L("GIFTD_CONFIG=/nonexistent"));
    ck_assert_int_eq(c.port, 3333);
    ck_assert_str_eq(c.config, path);
    /* The flag wins even when it comes before --config on the line. */
    load_ok(&c, L("--port=4444", "--config", path), NULL);
    ck_assert_int_eq(c.port, 4444);
    /* --config "" means no file, even when GIFTD_CONFIG names one. */
    load_ok(&c, L("--config="), L("GIFTD_CONFIG=/nonexistent"));
    ck_assert_str_eq(c.config, "");
}
END_TEST

/* ------------------------------------------------------------------ */
/* Errors                                                               */
/* ------------------------------------------------------------------ */

/* In `expect`, an '@' stands for the path of the case's file. */
/* clang-format off */
static const struct error_case {
    const char *name;
    const char *args[8];
    const char *env[4];
    const char *file; /* written and passed with --config when not NULL */
    const char *expect[4];
} error_cases[] = {
    {"bad int (flag)", {"--port", "abc"}, {0}, NULL,
     {"flag --port:", "invalid value for port", "'abc'", "not an integer"}},
    {"bad int (env)", {0}, {"GIFTD_MAX_CONNECTIONS=12x"}, NULL,
     {"env GIFTD_MAX_CONNECTIONS:", "max_connections", "'12x'", "not an integer"}},
    {"bad int (file)", {0}, {0}, "[giftd]\nworld_size = 1.5\n",
     {"@:2:", "world_size", "'1.5'", "not an integer"}},
    {"empty int (env)", {0}, {"GIFTD_PORT="}, NULL, {"env GIFTD_PORT:", "port", "not an integer"}},
    {"hex int", {"--max-parked=0x10"}, {0}, NULL, {"flag --max-parked:", "max_parked", "'0x10'"}},
    {"int beyond int64", {"--checkpoint-steps", "99999999999999999999"}, {0}, NULL,
     {"checkpoint_steps", "not an integer"}},
    {"port out of range", {"--port=65536"}, {0}, NULL,
     {"flag --port:", "port", "65536", "out of range 0..65535"}},
    {"negative shard (env)", {0}, {"GIFTD_SHARD_ID=-1"}, NULL,
     {"env GIFTD_SHARD_ID:", "shard_id", "-1 is out of range 0..65535"}},
    {"http_port out of range", {"--http-port", "-2"}, {0}, NULL,
     {"flag --http-port:", "http_port", "out of range -1..65535 or off"}},
    {"zero num_shards (file)", {0}, {0}, "[giftd]\nnum_shards = 0\n",
     {"@:2:", "num_shards", "out of range 1..65536"}},
    {"size too small", {"--max-frame-bytes", "1k"}, {0}, NULL,
     {"flag --max-frame-bytes:", "max_frame_bytes", "1k is out of range 4k..16G"}},
    {"size too large", {"--chunk-bytes=2G"}, {0}, NULL,
     {"chunk_bytes", "2G is out of range 1k..1G"}},
    {"size beyond uint64", {"--max-header-bytes", "99999999999999999999"}, {0}, NULL,
     {"max_header_bytes", "out of range"}},
    {"size overflow by suffix", {0}, {"GIFTD_WRITE_QUEUE_BYTES=17179869184G"}, NULL,
     {"env GIFTD_WRITE_QUEUE_BYTES:", "write_queue_bytes", "out of range"}},
    {"fraction at the open end", {"--geometry-decay", "1"}, {0}, NULL,
     {"flag --geometry-decay:", "geometry_decay", "1 is out of range 0 <= v < 1"}},
    {"negative fraction (env)", {0}, {"GIFTD_GEOMETRY_DECAY=-0.1"}, NULL,
     {"env GIFTD_GEOMETRY_DECAY:", "geometry_decay", "-0.1 is out of range"}},
    {"bad fraction (file)", {0}, {0}, "[giftd]\ngeometry_decay = 0.9x\n",
     {"@:2:", "geometry_decay", "'0.9x' is not a decimal number"}},
    {"nan fraction", {"--geometry-decay=nan"}, {0}, NULL,
     {"geometry_decay", "'nan' is not a decimal number"}},
    {"hex fraction", {"--geometry-decay=0x0.8"}, {0}, NULL,
     {"geometry_decay", "'0x0.8' is not a decimal number"}},
    {"bad size suffix (flag)", {"--max-frame-bytes", "64X"}, {0}, NULL,
     {"flag --max-frame-bytes:", "max_frame_bytes", "'64X'", "bad size suffix"}},
    {"bad size suffix (file)", {0}, {0}, "[giftd]\n\nmax_header_bytes = 64kB\n",
     {"@:3:", "max_header_bytes", "'64kB'", "bad size suffix"}},
    {"negative size", {0}, {"GIFTD_CHUNK_BYTES=-1k"}, NULL,
     {"env GIFTD_CHUNK_BYTES:", "chunk_bytes", "'-1k' is not a size"}},
    {"bad enum (flag)", {"--log-level", "verbose"}, {0}, NULL,
     {"flag --log-level:", "log_level", "'verbose'", "one of debug, info, warn, error"}},
    {"bad enum (env)", {0}, {"GIFTD_AGGREGATE=sum"}, NULL,
     {"env GIFTD_AGGREGATE:", "aggregate", "'sum'", "one of eager, ordered"}},
    {"bad enum (file)", {0}, {0}, "[giftd]\nlog_level = warning\n",
     {"@:2:", "log_level", "'warning'"}},
    {"empty bind", {"--bind="}, {0}, NULL, {"flag --bind:", "bind", "may not be empty"}},
    {"empty data_dir (file)", {0}, {0}, "[giftd]\ndata_dir =\n",
     {"@:2:", "data_dir", "may not be empty"}},
    {"control character", {"--data-dir", "a\nb"}, {0}, NULL,
     {"flag --data-dir:", "data_dir", "control character"}},
    {"comment in value", {0}, {"GIFTD_AUTH_KEY_FILE=/k ;x"}, NULL,
     {"env GIFTD_AUTH_KEY_FILE:", "auth_key_file", "INI comment"}},
    {"leading space", {"--bind", " 1.2.3.4"}, {0}, NULL, {"bind", "white space"}},
    {"host name as bind (file)", {0}, {0}, "[giftd]\nbind = localhost\n",
     {"bind 'localhost' (@:2)", "not an IPv4 or IPv6 address", "use 127.0.0.1"}},
    {"bad address as bind (flag)", {"--bind", "10.0.0.256"}, {0}, NULL,
     {"bind '10.0.0.256' (flag --bind)", "0.0.0.0 or ::"}},
    {"kubernetes service link", {0}, {"GIFTD_PORT=tcp://10.0.0.1:7070"}, NULL,
     {"env GIFTD_PORT:", "port", "not an integer", "enableServiceLinks"}},
    {"unknown key", {0}, {0}, "[giftd]\nport = 1\nprot = 2\n",
     {"@:3:", "unknown option 'prot'"}},
    {"unknown key, near miss", {0}, {0}, "[giftd]\nmax-connections = 4\n",
     {"@:2:", "'max-connections'", "did you mean max_connections?"}},
    {"unknown section", {0}, {0}, "[giftd]\nport=1\n[server]\n",
     {"@:3:", "unknown section [server]"}},
    {"key outside section", {0}, {0}, "port = 1\n[giftd]\n",
     {"@:1:", "'port'", "outside the [giftd] section"}},
    {"repeated key", {0}, {0}, "[giftd]\nport=1\n\nport = 2\n",
     {"@:4:", "port", "already set at line 2"}},
    {"syntax error", {0}, {0}, "[giftd]\nport = 1\nport 7070\n", {"@:3:", "syntax error"}},
    {"unclosed section", {0}, {0}, "[giftd\nport = 1\n", {"@:1:", "syntax error"}},
    {"config key in file", {0}, {0}, "[giftd]\nconfig = other.conf\n",
     {"@:2:", "'config'", "cannot be set in the file"}},
    {"action key in file", {0}, {0}, "[giftd]\nhelp = 1\n", {"@:2:", "'help'"}},
    {"missing file", {"--config", "/nonexistent/giftd.conf"}, {0}, NULL,
     {"cannot open config file", "/nonexistent/giftd.conf", "No such file"}},
    {"missing file (env)", {0}, {"GIFTD_CONFIG=/nonexistent/e.conf"}, NULL,
     {"cannot open config file", "/nonexistent/e.conf"}},
    {"config is a directory", {"--config", "/"}, {0}, NULL, {"/:", "read error"}},
    {"unknown flag", {"--prot", "1"}, {0}, NULL, {"unknown flag '--prot'"}},
    {"unknown flag with value", {"--prot=1"}, {0}, NULL, {"unknown flag '--prot'"}},
    {"unknown flag, near miss", {"--max_connections=3"}, {0}, NULL,
     {"unknown flag '--max_connections'", "did you mean --max-connections?"}},
    {"unknown short flag", {"-p", "1"}, {0}, NULL, {"unknown flag '-p'"}},
    {"missing value at the end", {"--port"}, {0}, NULL, {"flag --port", "needs a value"}},
    {"missing value before a flag", {"--data-dir", "--port", "1"}, {0}, NULL,
     {"flag --data-dir", "needs a value", "'--port'"}},
    {"missing config value", {"--config"}, {0}, NULL, {"flag --config", "needs a value"}},
    {"action with a value", {"--check-config=yes"}, {0}, NULL,
     {"flag --check-config", "takes no value"}},
    {"positional argument", {"serve"}, {0}, NULL, {"unexpected argument 'serve'"}},
    {"lone dash", {"-"}, {0}, NULL, {"unexpected argument '-'"}},
    {"bad policy", {"--policy", "best"}, {0}, NULL,
     {"flag --policy:", "policy", "'best'", "one of all, none, auto, hits"}},
    {"budget out of range (file)", {0}, {0}, "[giftd]\nbudget_bits = 40\n",
     {"@:2:", "budget_bits", "40 is out of range 0 <= v < 33"}},
    {"negative transform cap", {"--max-transform-gflops=-1"}, {0}, NULL,
     {"max_transform_gflops", "-1 is out of range"}},
    {"shard_id not below num_shards", {"--shard-id", "2", "--num-shards", "2"}, {0}, NULL,
     {"shard_id 2 (flag --shard-id)", "num_shards 2 (flag --num-shards)"}},
    {"shard_id against the file", {"--shard-id=3"}, {0}, "[giftd]\nnum_shards = 2\n",
     {"shard_id 3 (flag --shard-id)", "num_shards 2 (@:2)"}},
    {"same ports", {"--port", "8000"}, {"GIFTD_HTTP_PORT=8000"}, NULL,
     {"http_port 8000 (env GIFTD_HTTP_PORT)", "port (flag --port)"}},
    {"chunk above frame", {"--chunk-bytes", "128M"}, {0}, NULL,
     {"chunk_bytes 128M (flag --chunk-bytes)", "max_frame_bytes 64M (default)"}},
    {"first of several errors", {"--bogus", "--port", "1", "--prot"}, {0}, NULL,
     {"unknown flag '--bogus'"}},
    {"syntax before values", {"--port", "x", "--bogus"}, {0}, NULL, {"unknown flag '--bogus'"}},
};
/* clang-format on */

#define N_ERROR_CASES ((int)(sizeof error_cases / sizeof error_cases[0]))

START_TEST(test_errors)
{
    const struct error_case *ec = &error_cases[_i];
    const char *args[16], *path = "";
    char err[ERRLEN], want[ERRLEN];
    gift_config_t c;
    size_t n = 0;
    int rc;

    if (ec->file != NULL) {
        path = write_tmp(ec->file);
        args[n++] = "--config";
        args[n++] = path;
    }
    for (size_t k = 0; k < 8 && ec->args[k] != NULL; k++)
        args[n++] = ec->args[k];
    args[n] = NULL;
    memset(err, 'x', sizeof err);
    err[sizeof err - 1] = '\0';
    rc = load(&c, args, ec->env, err, sizeof err);
    ck_assert_msg(rc == GIFT_ECONFIG, "case '%s': returned %d (%s), want GIFT_ECONFIG", ec->name,
                  rc, gift_strerror(rc));
    ck_assert_msg(strchr(err, '\n') == NULL && strlen(err) > 10, "case '%s': err '%s'", ec->name,
                  err);
    for (size_t k = 0; k < 4 && ec->expect[k] != NULL; k++) {
        const char *at = strchr(ec->expect[k], '@');
        if (at != NULL)
            snprintf(want, sizeof want, "%.*s%s%s", (int)(at - ec->expect[k]), ec->expect[k], path,
                     at + 1);
        else
            snprintf(want, sizeof want, "%s", ec->expect[k]);
        ck_assert_msg(strstr(err, want) != NULL, "case '%s': err '%s' lacks '%s'", ec->name, err,
                      want);
    }
}
END_TEST

START_TEST(test_error_long_values)
{
    char big[5000], line[400], err[ERRLEN];
    gift_config_t c;
    int rc;

    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    rc = load(&c, L("--data-dir", big), NULL, err, sizeof err);
    ck_assert_int_eq(rc, GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "flag --data-dir: invalid value for data_dir: 4999 bytes long, "
                              "the most is 4095") != NULL,
                  "err: %s", err);
    big[300] = '\0';
    rc = load(&c, L("--bind", big), NULL, err, sizeof err);
    ck_assert_int_eq(rc, GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "bind") && strstr(err, "the most is 255"), "err: %s", err);

    /* A line longer than inih's buffer is refused, not split. */
    big[300] = 'x';
    snprintf(line, sizeof line, "[giftd]\ndata_dir = /%.300s\nport = 1\n", big);
    const char *path = write_tmp(line);
    rc = load(&c, L("--config", path), NULL, err, sizeof err);
    ck_assert_int_eq(rc, GIFT_ECONFIG);
    ck_assert_msg(strstr(err, ":2: line longer than") != NULL, "err: %s", err);
}
END_TEST

START_TEST(test_error_buffer)
{
    gift_config_t c;
    char err[16];

    memset(err, 'x', sizeof err);
    ck_assert_int_eq(load(&c, L("--port", "abc"), NULL, err, sizeof err), GIFT_ECONFIG);
    ck_assert_msg(memchr(err, '\0', sizeof err) != NULL, "err not terminated");
    ck_assert_str_eq(err, "flag --port: in");
    ck_assert_int_eq(load(&c, L("--port", "abc"), NULL, NULL, 0), GIFT_ECONFIG);
    ck_assert_int_eq(load(&c, L("--bogus"), NULL, NULL, 0), GIFT_ECONFIG);
    /* Success clears err. */
    ck_assert_int_eq(load(&c, NULL, NULL, err, sizeof err), 0);
    ck_assert_str_eq(err, "");
}
END_TEST

/* ------------------------------------------------------------------ */
/* Actions, --help, --check-config, the sample file                     */
/* ------------------------------------------------------------------ */

/* world_size is required: the defaults, or a file, variable or flag that
 * sets anything else, fail the check with a message naming the flag, auto
 * and the variable; auto or a number from any source passes; 0 (the old
 * "from the first Declare") is refused as out of range. */
START_TEST(test_world_size_required)
{
    gift_config_t c;
    char err[ERRLEN];
    const char *path;

    load_ok(&c, L("--port", "9"), NULL);
    ck_assert_int_eq(gift_config_check_required(&c, err, sizeof err), GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "world_size is not set") && strstr(err, "--world-size N") &&
                      strstr(err, "--world-size auto") && strstr(err, "GIFTD_WORLD_SIZE"),
                  "err '%s'", err);
    load_ok(&c, L("--world-size", "auto"), NULL);
    ck_assert_int_eq(gift_config_check_required(&c, err, sizeof err), 0);
    ck_assert_int_eq(c.world_size, 0);
    load_ok(&c, NULL, L("GIFTD_WORLD_SIZE=4"));
    ck_assert_int_eq(gift_config_check_required(&c, err, sizeof err), 0);
    ck_assert_int_eq(c.world_size, 4);
    path = write_tmp("[giftd]\nworld_size = 3\n");
    load_ok(&c, L("--config", path), NULL);
    ck_assert_int_eq(gift_config_check_required(&c, err, sizeof err), 0);
    ck_assert_int_eq(c.world_size, 3);
    unlink(path);
    ck_assert_int_eq(load(&c, L("--world-size", "0"), NULL, err, sizeof err), GIFT_ECONFIG);
    ck_assert_msg(strstr(err, "1..65536 or auto"), "err '%s'", err);
}
END_TEST

START_TEST(test_actions)
{
    gift_config_t c;
    char err[ERRLEN];

    /* --help and --version work whatever else is wrong, and load nothing. */
    ck_assert_int_eq(load(&c, L("--port", "9", "--config", "/nonexistent", "--bogus", "--help"),
                          L("GIFTD_PORT=abc"), err, sizeof err),
                     0);
    ck_assert(c.help && !c.version);
    ck_assert_int_eq(c.port, 7070);
    ck_assert_int_eq(load(&c, L("-h"), NULL, err, sizeof err), 0);
    ck_assert(c.help);
    ck_assert_int_eq(load(&c, L("--version", "extra"), NULL, err, sizeof err), 0);
    ck_assert(c.version && !c.help);
    /* --check-config loads everything and reports errors like any run. */
    load_ok(&c, L("--check-config", "--port", "9"), NULL);
    ck_assert(c.check_config);
    ck_assert_int_eq(c.port, 9);
    ck_assert_int_eq(load(&c, L("--check-config", "--port", "x"), NULL, err, sizeof err),
                     GIFT_ECONFIG);
}
END_TEST

START_TEST(test_usage)
{
    FILE *f = tmpfile();
    size_t n;
    const gift_config_option_t *t = gift_config_options(&n);
    char *text, want[256], flag[64];

    ck_assert_ptr_nonnull(f);
    gift_config_usage(f);
    ck_assert(!ferror(f));
    text = slurp(f);
    fclose(f);
    ck_assert_msg(strstr(text, "Usage: giftd") != NULL, "no usage line");
    ck_assert_msg(strstr(text, "-h, --help") != NULL, "no -h");
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;

        flag[k++] = '-';
        flag[k++] = '-';
        for (const char *p = t[i].name; *p; p++)
            flag[k++] = *p == '_' ? '-' : *p;
        flag[k] = '\0';
        ck_assert_msg(strstr(text, flag) != NULL, "--help lacks %s", flag);
        if (t[i].where & GIFT_CONFIG_IN_FILE) {
            snprintf(want, sizeof want, "key: %s ", t[i].name);
            ck_assert_msg(strstr(text, want) != NULL, "--help lacks '%s'", want);
        }
        if (t[i].where & GIFT_CONFIG_IN_ENV) {
            k = (size_t)snprintf(want, sizeof want, "env: GIFTD_");
            for (const char *p = t[i].name; *p; p++)
                want[k++] = (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
            want[k] = '\0';
            ck_assert_msg(strstr(text, want) != NULL, "--help lacks '%s'", want);
        }
        if (t[i].type != GIFT_CONFIG_ACTION && (t[i].flags & GIFT_CONFIG_REQUIRED)) {
            snprintf(want, sizeof want, "env: GIFTD_WORLD_SIZE   required\n");
            ck_assert_msg(strcmp(t[i].name, "world_size") != 0 || strstr(text, want) != NULL,
                          "--help lacks '%s' for %s", want, t[i].name);
        } else if (t[i].type != GIFT_CONFIG_ACTION) {
            snprintf(want, sizeof want, "default: %s\n", t[i].defval[0] ? t[i].defval : "\"\"");
            if (t[i].defval[0] == '\0')
                want[strlen(want) - 1] = '\0';
            ck_assert_msg(strstr(text, want) != NULL, "--help lacks '%s' for %s", want, t[i].name);
        }
        /* The first line of the help text is there too. */
        snprintf(want, sizeof want, "%.*s", (int)strcspn(t[i].help, "\n"), t[i].help);
        ck_assert_msg(strstr(text, want) != NULL, "--help lacks the help of %s", t[i].name);
    }
    free(text);
}
END_TEST

/* Dumps c, reads the dump back, and requires the same value for every option. */
static void check_round_trip(const gift_config_t *c)
{
    size_t n;
    const gift_config_option_t *t = gift_config_options(&n);
    FILE *f = tmpfile();
    gift_config_t d;
    char *text;

    ck_assert_ptr_nonnull(f);
    gift_config_dump(c, f);
    ck_assert(!ferror(f));
    text = slurp(f);
    fclose(f);
    const char *path = write_tmp(text);
    load_ok(&d, L("--config", path), NULL);
    for (size_t i = 0; i < n; i++) {
        if (!(t[i].where & GIFT_CONFIG_IN_FILE))
            continue;
        ck_assert_msg(same_value(&t[i], c, &d), "%s differs after the round trip; dump:\n%s",
                      t[i].name, text);
        ck_assert_msg(d.origin[i].source == GIFT_CONFIG_FROM_FILE, "%s not read from the dump",
                      t[i].name);
    }
    free(text);
}

START_TEST(test_dump_round_trip)
{
    gift_config_t c;
    FILE *f;
    char *text;

    gift_config_defaults(&c);
    check_round_trip(&c);

    /* Every option away from its default, from flags, env and a file. */
    const char *path = write_tmp("[giftd]\nworld_size = 7\nmax_parked = 3\n");
    char cfg[300];
    snprintf(cfg, sizeof cfg, "--config=%s", path);
    load_ok(&c,
            L(cfg, "--bind", "10.1.2.3", "--port=0", "--http-port", "off", "--shard-id", "5",
              "--num-shards", "9", "--data-dir", "/srv/giftd data", "--max-connections=3",
              "--max-header-bytes", "1025", "--max-frame-bytes=3G", "--write-queue-bytes",
              "100000k", "--chunk-bytes", "2047", "--log-level", "Error", "--stall-warn", "0",
              "--stall-timeout", "7", "--aggregate=ordered", "--checkpoint-steps", "12",
              "--geometry-decay", "0.3"),
            L("GIFTD_AUTH_KEY_FILE=/etc/k;ey"));
    f = tmpfile();
    gift_config_dump(&c, f);
    text = slurp(f);
    fclose(f);
    ck_assert_msg(strstr(text, "[giftd]\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "; from flag --port\nport = 0\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "http_port = off\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "max_frame_bytes = 3G\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "write_queue_bytes = 100000k\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "log_level = error\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "geometry_decay = 0.3\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "; from env GIFTD_AUTH_KEY_FILE\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, ":2\nworld_size = 7\n") != NULL, "dump:\n%s", text);
    ck_assert_msg(strstr(text, "config =") == NULL, "the dump sets config:\n%s", text);
    free(text);
    check_round_trip(&c);
}
END_TEST

START_TEST(test_sample_conf)
{
    static const char path[] = GIFT_SOURCE_DIR "/conf/giftd.conf";
    size_t n;
    const gift_config_option_t *t = gift_config_options(&n);
    gift_config_t c, d;
    char *text, want[256];
    FILE *f;

    load_ok(&c, L("--config", path), NULL);
    gift_config_defaults(&d);
    for (size_t i = 0; i < n; i++)
        if (t[i].where & GIFT_CONFIG_IN_FILE)
            ck_assert_msg(same_value(&t[i], &c, &d), "the sample sets %s away from its default",
                          t[i].name);

    /* Each option appears as "# name = default" (or uncommented), so the
     * sample cannot drift from the table. */
    f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    text = slurp(f);
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        size_t wl;

        if (!(t[i].where & GIFT_CONFIG_IN_FILE))
            continue;
        snprintf(want, sizeof want, "%s = %s", t[i].name, t[i].defval);
        wl = strlen(want);
        while (wl > 0 && want[wl - 1] == ' ')
            want[--wl] = '\0';
        for (char *p = text; *p != '\0' && !found;) {
            size_t len = strcspn(p, "\n");
            char *s = p;
            if (*s == '#' || *s == ';') {
                s++;
                if (*s == ' ')
                    s++;
            }
            found = (size_t)(p + len - s) == wl && strncmp(s, want, wl) == 0;
            p += len + (p[len] == '\n');
        }
        ck_assert_msg(found, "%s has no line '# %s'", path, want);
    }
    free(text);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Log                                                                  */
/* ------------------------------------------------------------------ */

static FILE *cap_file;
static int cap_saved = -1;

/* Sends fd 2 into a temporary file until capture_end(). */
static void capture_begin(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    ck_assert_ptr_nonnull(cap_file);
    cap_saved = dup(2);
    ck_assert_int_ge(cap_saved, 0);
    ck_assert_int_ge(dup2(fileno(cap_file), 2), 0);
}

/* Restores fd 2 and returns what was written (malloc'ed). */
static char *capture_end(void)
{
    char *text;

    fflush(stderr);
    dup2(cap_saved, 2);
    close(cap_saved);
    cap_saved = -1;
    text = slurp(cap_file);
    fclose(cap_file);
    return text;
}

static void log_setup(void)
{
    gift_log_set_level(GIFT_LOG_LEVEL_INFO);
    gift_log_set_shard(0);
}

static int count_lines(const char *s)
{
    int n = 0;

    for (; *s; s++)
        n += *s == '\n';
    return n;
}

START_TEST(test_log_format)
{
    char before[32], after[32], *text;
    regex_t re;
    time_t now;
    struct tm tm;

    gift_log_set_shard(3);
    now = time(NULL);
    gmtime_r(&now, &tm);
    strftime(before, sizeof before, "%Y-%m-%dT%H:%M:%S", &tm);
    capture_begin();
    gift_log(GIFT_LOG_LEVEL_INFO, 42, "hello %s %d", "world", 7);
    text = capture_end();
    now = time(NULL) + 1;
    gmtime_r(&now, &tm);
    strftime(after, sizeof after, "%Y-%m-%dT%H:%M:%S", &tm);

    ck_assert_int_eq(regcomp(&re,
                             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                             "INFO  shard=3 conn=42 hello world 7\n$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    ck_assert_msg(regexec(&re, text, 0, NULL, 0) == 0, "line: '%s'", text);
    regfree(&re);
    /* ISO 8601 sorts as text: the stamp lies between the two readings. */
    ck_assert_msg(strncmp(text, before, 19) >= 0 && strncmp(text, after, 19) <= 0,
                  "time %.23s outside [%s, %s]", text, before, after);
    free(text);

    /* conn 0 is left out; every level has its tag. */
    gift_log_set_level(GIFT_LOG_LEVEL_DEBUG);
    gift_log_set_shard(0);
    capture_begin();
    gift_log(GIFT_LOG_LEVEL_DEBUG, 0, "d");
    gift_log(GIFT_LOG_LEVEL_WARN, 0, "w");
    gift_log(GIFT_LOG_LEVEL_ERROR, UINT64_MAX, "e");
    text = capture_end();
    ck_assert_int_eq(count_lines(text), 3);
    ck_assert_msg(strstr(text, "Z DEBUG shard=0 d\n") != NULL, "log: %s", text);
    ck_assert_msg(strstr(text, "Z WARN  shard=0 w\n") != NULL, "log: %s", text);
    ck_assert_msg(strstr(text, "Z ERROR shard=0 conn=18446744073709551615 e\n") != NULL, "log: %s",
                  text);
    ck_assert_msg(strstr(text, "conn=0") == NULL, "log: %s", text);
    free(text);
}
END_TEST

START_TEST(test_log_levels)
{
    int evaluated = 0;
    char *text;

    gift_log_set_level(GIFT_LOG_LEVEL_WARN);
    ck_assert_int_eq(gift_log_get_level(), GIFT_LOG_LEVEL_WARN);
    ck_assert(!gift_log_enabled(GIFT_LOG_LEVEL_INFO) && gift_log_enabled(GIFT_LOG_LEVEL_WARN));
    capture_begin();
    gift_log(GIFT_LOG_LEVEL_DEBUG, 1, "debug-direct");
    gift_log(GIFT_LOG_LEVEL_INFO, 1, "info-direct");
    gift_log(GIFT_LOG_LEVEL_WARN, 1, "warn-direct");
    GIFT_LOG_DEBUG(1, "debug-macro %d", ++evaluated);
    GIFT_LOG_INFO(1, "info-macro %d", ++evaluated);
    GIFT_LOG_WARN(1, "warn-macro %d", ++evaluated);
    GIFT_LOG_ERROR(1, "error-macro %d", ++evaluated);
    text = capture_end();
    ck_assert_msg(evaluated == 2, "macros below the level evaluated their arguments (%d)",
                  evaluated);
    ck_assert_int_eq(count_lines(text), 3);
    ck_assert_msg(strstr(text, "debug") == NULL && strstr(text, "info") == NULL, "log: %s", text);
    ck_assert_msg(strstr(text, "warn-direct") && strstr(text, "warn-macro 1") &&
                      strstr(text, "error-macro 2"),
                  "log: %s", text);
    free(text);

    /* Out-of-range levels are ignored. */
    gift_log_set_level((enum gift_log_level)7);
    ck_assert_int_eq(gift_log_get_level(), GIFT_LOG_LEVEL_WARN);
    gift_log_set_level(GIFT_LOG_LEVEL_ERROR);
    capture_begin();
    GIFT_LOG_WARN(0, "w");
    gift_log((enum gift_log_level)9, 0, "bogus level");
    GIFT_LOG_ERROR(0, "e");
    text = capture_end();
    ck_assert_int_eq(count_lines(text), 1);
    free(text);
}
END_TEST

START_TEST(test_log_one_line)
{
    char big[3 * GIFT_LOG_LINE_MAX], *text;
    size_t len;

    capture_begin();
    gift_log(GIFT_LOG_LEVEL_INFO, 0, "a\nb\tc\r%c!\n", 1);
    text = capture_end();
    ck_assert_int_eq(count_lines(text), 1);
    ck_assert_msg(strstr(text, " shard=0 a\\nb\\tc\\r\\x01!\n") != NULL, "log: %s", text);
    free(text);

    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    capture_begin();
    gift_log(GIFT_LOG_LEVEL_ERROR, 5, "%s", big);
    gift_log(GIFT_LOG_LEVEL_ERROR, 5, "%s", "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n");
    text = capture_end();
    ck_assert_int_eq(count_lines(text), 2);
    len = strcspn(text, "\n") + 1;
    ck_assert_msg(len <= GIFT_LOG_LINE_MAX, "line of %zu bytes", len);
    ck_assert_msg(len > GIFT_LOG_LINE_MAX - 8, "line of %zu bytes", len);
    ck_assert_msg(strncmp(text + len - 6, "yy...\n", 6) == 0, "end: '%s'", text + len - 6);
    free(text);

    /* errno survives a log call. */
    errno = ERANGE;
    capture_begin();
    gift_log(GIFT_LOG_LEVEL_INFO, 0, "x");
    free(capture_end());
    ck_assert_int_eq(errno, ERANGE);
}
END_TEST

START_TEST(test_log_level_names)
{
    ck_assert_int_eq(gift_log_level_parse("debug"), GIFT_LOG_LEVEL_DEBUG);
    ck_assert_int_eq(gift_log_level_parse("info"), GIFT_LOG_LEVEL_INFO);
    ck_assert_int_eq(gift_log_level_parse("WARN"), GIFT_LOG_LEVEL_WARN);
    ck_assert_int_eq(gift_log_level_parse("Error"), GIFT_LOG_LEVEL_ERROR);
    ck_assert_int_eq(gift_log_level_parse("warning"), GIFT_EINVAL);
    ck_assert_int_eq(gift_log_level_parse(""), GIFT_EINVAL);
    ck_assert_int_eq(gift_log_level_parse(NULL), GIFT_EINVAL);
    ck_assert_str_eq(gift_log_level_name(GIFT_LOG_LEVEL_WARN), "warn");
    ck_assert_str_eq(gift_log_level_name(-1), "unknown");
    ck_assert_str_eq(gift_log_level_name(4), "unknown");
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("server_config");
    TCase *tc;

    tc = tcase_create("options");
    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_table);
    tcase_add_test(tc, test_parse_size);
    tcase_add_test(tc, test_parse_bool);
    tcase_add_test(tc, test_file);
    tcase_add_test(tc, test_file_crlf_bom);
    tcase_add_test(tc, test_file_empty_and_sections);
    tcase_add_test(tc, test_flags);
    tcase_add_test(tc, test_env);
    tcase_add_test(tc, test_precedence);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_add_loop_test(tc, test_errors, 0, N_ERROR_CASES);
    tcase_add_test(tc, test_error_long_values);
    tcase_add_test(tc, test_error_buffer);
    suite_add_tcase(s, tc);

    tc = tcase_create("actions");
    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_add_test(tc, test_actions);
    tcase_add_test(tc, test_world_size_required);
    tcase_add_test(tc, test_usage);
    tcase_add_test(tc, test_dump_round_trip);
    tcase_add_test(tc, test_sample_conf);
    suite_add_tcase(s, tc);

    tc = tcase_create("log");
    tcase_add_checked_fixture(tc, log_setup, NULL);
    tcase_add_test(tc, test_log_format);
    tcase_add_test(tc, test_log_levels);
    tcase_add_test(tc, test_log_one_line);
    tcase_add_test(tc, test_log_level_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gift_test_run(config_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
