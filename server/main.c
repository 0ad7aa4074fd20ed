/*
 * main.c: the giftd program. Reads the configuration (flags, GIFTD_*
 * variables, INI file), starts one shard on one event loop, prints the bound
 * ports on one line of stdout, and runs until SIGTERM/SIGINT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "config.h"
#include "gift_error.h"
#include "gift_auth.h"
#include "gift_codec.h"
#include "log.h"
#include "server.h"
#include "shard.h"

extern char **environ;

typedef struct reload_ctx {
    int argc;
    char **argv;
} reload_ctx_t;

/* SIGHUP: read the configuration again and apply its log level only. */
static void reload_log_level(void *arg)
{
    reload_ctx_t *r = arg;
    gift_config_t c;
    char err[512];
    if (gift_config_load(&c, r->argc, r->argv, environ, err, sizeof err) < 0) {
        GIFT_LOG_WARN(0, "SIGHUP: configuration not reloaded: %s", err);
        return;
    }
    gift_log_set_level(c.log_level);
    GIFT_LOG_INFO(0, "log level is now %s", gift_log_level_name(c.log_level));
}

/* The key of auth_key_file into *key, or 0 without one; 2 (the exit
 * status) when it cannot be used: running without the authentication a user
 * asked for would be worse than not running. */
static int load_key(const gift_config_t *c, gift_auth_key_t *key)
{
    char err[512], warn[512];
    if (!c->auth_key_file[0])
        return 0;
    if (gift_auth_key_load(c->auth_key_file, key, err, sizeof err, warn, sizeof warn) < 0) {
        GIFT_LOG_ERROR(0, "%s; refusing to start unauthenticated", err);
        return 2;
    }
    if (key->rank_bound) {
        GIFT_LOG_ERROR(0,
                       "auth key file %s holds rank %u's key; a shard needs the shared "
                       "secret it was derived from",
                       c->auth_key_file, key->rank);
        return 2;
    }
    if (warn[0])
        GIFT_LOG_WARN(0, "%s; chmod 600 it", warn);
    GIFT_LOG_INFO(0, "authentication on: workers must prove the key of %s at Hello",
                  c->auth_key_file);
    return 0;
}

/* data_dir is created, read and written only with checkpoint_steps > 0
 * (gift_server_new restores from it before listening). Before anything in
 * it is read or moved, this process takes its lock, held until exit (the
 * kernel drops it even on SIGKILL): two giftd on one data_dir would
 * overwrite each other's checkpoint and log. Then --reset / --discard-state
 * move the state aside, and a directory giftd cannot account for refuses the
 * start. Returns 0, or the exit status. */
static int prepare_data_dir(const gift_config_t *c)
{
    static int lock_fd = -1; /* never closed: the lock lives as long as the process */
    char err[512], where[4200], big[1024];
    const char *flag = c->discard_state ? "--discard-state" : "--reset";
    int rc;

    if (c->checkpoint_steps <= 0 || !c->data_dir[0]) {
        if (c->reset || c->discard_state)
            GIFT_LOG_INFO(0, "%s: no persistence (checkpoint_steps 0): nothing to discard", flag);
        return 0;
    }
    if (gift_ckpt_mkdir(c->data_dir, err, sizeof err) < 0) {
        GIFT_LOG_ERROR(0, "%s", err);
        return 1;
    }
    if ((rc = gift_ckpt_lock(c->data_dir, &lock_fd, err, sizeof err)) < 0) {
        GIFT_LOG_ERROR(0, "%s", err);
        return rc == GIFT_EBUSY ? 2 : 1;
    }
    if (c->reset || c->discard_state) {
        /* Moved aside, never deleted: a mistaken reset can be undone. */
        if ((rc = gift_ckpt_discard(c->data_dir, where, sizeof where, err, sizeof err)) < 0) {
            GIFT_LOG_ERROR(0, "%s: %s", flag, err);
            return 1;
        }
        if (rc > 0)
            GIFT_LOG_INFO(0,
                          "%s: moved the state of %s (%d entries) into %s; this shard "
                          "starts empty",
                          flag, c->data_dir, rc, where);
        else
            GIFT_LOG_INFO(0, "%s: %s holds no state; this shard starts empty", flag, c->data_dir);
    }
    /* Starting never deletes what giftd cannot account for: it refuses. */
    if (gift_shard_datadir_check(c->data_dir, big, sizeof big) < 0) {
        GIFT_LOG_ERROR(0, "%s", big);
        return 2;
    }
    return 0;
}

/* The server's options from the configuration. */
static void server_opts(const gift_config_t *c, const gift_auth_key_t *key, gift_server_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->bind = c->bind;
    o->port = c->port;
    o->http_port = c->http_port;
    o->max_connections = (uint32_t)c->max_connections;
    o->max_header_bytes = (uint32_t)c->max_header_bytes;
    o->max_frame_bytes = c->max_frame_bytes;
    o->write_queue_bytes = c->write_queue_bytes;
    o->handshake_timeout_s = (uint32_t)c->handshake_timeout;
    o->read_timeout_s = (uint32_t)c->read_timeout;
    o->idle_timeout_s = (uint32_t)c->idle_timeout;
    o->max_buffer_bytes = c->max_buffer_bytes;
    o->http_max_connections = (uint32_t)c->http_max_connections;
    o->http_timeout_ms = (uint32_t)c->http_timeout * 1000;
    o->shard.shard_id = (uint32_t)c->shard_id;
    o->shard.num_shards = (uint32_t)c->num_shards;
    o->shard.world_size = (uint32_t)c->world_size;
    o->shard.max_frame_bytes = c->max_frame_bytes;
    o->shard.max_parked = (uint32_t)c->max_parked;
    o->shard.max_parked_per_peer = (uint32_t)c->max_parked_per_peer;
    o->shard.max_memory = c->max_memory ? c->max_memory : gift_shard_memory_default();
    o->shard.max_step_ahead = (uint64_t)c->max_step_ahead;
    o->shard.damping = GIFT_DAMPING_DEFAULT;
    o->shard.geometry_decay = c->geometry_decay;
    o->shard.policy = (int)c->policy;
    o->shard.budget_bits = c->budget_bits;
    o->shard.max_transform_gflops = c->max_transform_gflops;
    o->shard.hits_threshold = c->hits_threshold;
    o->shard.hits_every = 100; /* the boundary-hit measurement is a slow scalar pass */
    o->shard.stall_warn_s = (uint32_t)c->stall_warn;
    o->shard.stall_timeout_s = (uint32_t)c->stall_timeout;
    o->shard.aggregate =
        c->aggregate == GIFT_AGGREGATE_EAGER ? GIFT_SHARD_EAGER : GIFT_SHARD_ORDERED;
    o->shard.data_dir = c->data_dir;
    o->shard.checkpoint_steps = (uint32_t)c->checkpoint_steps;
    o->shard.auth = c->auth_key_file[0] ? key : NULL;
}

int main(int argc, char **argv)
{
    static gift_config_t c;
    static gift_auth_key_t auth_key; /* static: 4 KiB, and it must outlive the shard */
    gift_server_opts_t o;
    gift_server_t *srv = NULL;
    reload_ctx_t rctx = {argc, argv};
    char err[512];
    int rc;

    if (gift_config_load(&c, argc, argv, environ, err, sizeof err) < 0) {
        fprintf(stderr, "giftd: %s\n(try giftd --help)\n", err);
        return 2;
    }
    if (c.help) {
        gift_config_usage(stdout);
        return ferror(stdout) ? 1 : 0;
    }
    if (c.version) {
        printf("giftd %s (protocol %d)\n", GIFT_CODEC_VERSION, GIFT_PROTOCOL_VERSION);
        return 0;
    }
    /* world_size has no default: no peer may decide the cluster's shape. */
    if (gift_config_check_required(&c, err, sizeof err) < 0) {
        fprintf(stderr, "giftd: %s\n(try giftd --help)\n", err);
        return 2;
    }
    if (c.check_config) {
        gift_config_dump(&c, stdout);
        return ferror(stdout) ? 1 : 0;
    }
    gift_log_set_level(c.log_level);
    gift_log_set_shard(c.shard_id);
    if ((rc = load_key(&c, &auth_key)) != 0 || (rc = prepare_data_dir(&c)) != 0)
        return rc;
    server_opts(&c, &auth_key, &o);
    o.reload_cb = reload_log_level;
    o.reload_arg = &rctx;
    if ((rc = gift_server_new(&o, &srv, err, sizeof err)) < 0) {
        GIFT_LOG_ERROR(0, "%s", err);
        return 1;
    }
    GIFT_LOG_INFO(0, "giftd %s shard %d of %d, world size %s, listening on %s:%d, http %s:%d",
                  GIFT_CODEC_VERSION, c.shard_id, c.num_shards,
                  c.world_size ? "fixed" : "from the first Declare", c.bind, gift_server_port(srv),
                  c.bind, gift_server_http_port(srv));
    GIFT_LOG_INFO(0, "max_memory %.1f MiB for declared tensors%s",
                  (double)o.shard.max_memory / 1048576.0,
                  c.max_memory ? "" : " (3/4 of physical memory)");
    /* One machine-readable line for scripts and tests. */
    printf("giftd ready port=%d http_port=%d\n", gift_server_port(srv), gift_server_http_port(srv));
    fflush(stdout);
    rc = gift_server_run(srv);
    gift_server_free(srv);
    gift_auth_key_clear(&auth_key);
    return rc < 0 ? 1 : 0;
}
