/*
 * metrics.c: the Prometheus text exposition and the tiny HTTP responder for
 * /metrics, /livez and /readyz. No sockets: net.c feeds it request bytes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gift_codec.h"
#include "server.h"

int gift_str_printf(gift_str_t *s, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        size_t room = s->cap - s->len;
        int n;
        va_start(ap, fmt);
        n = vsnprintf(s->p ? s->p + s->len : NULL, s->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return GIFT_EINVAL;
        if (s->p && (size_t)n < room) {
            s->len += (size_t)n;
            return 0;
        }
        size_t ncap = s->cap ? s->cap * 2 : 4096;
        while (ncap < s->len + (size_t)n + 1)
            ncap *= 2;
        char *np = realloc(s->p, ncap);
        if (np == NULL)
            return GIFT_ENOMEM;
        s->p = np;
        s->cap = ncap;
    }
}

void gift_str_free(gift_str_t *s)
{
    free(s->p);
    memset(s, 0, sizeof *s);
}

/* Resident set size in bytes from /proc/self/statm, 0 if unknown. */
static uint64_t rss_bytes(void)
{
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Escapes a label value (backslash, quote, newline). */
static void label_escape(const char *in, char *out, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; in[i] && j + 2 < cap; i++) {
        char c = in[i];
        if (c == '\\' || c == '"') {
            out[j++] = '\\';
            out[j++] = c;
        } else if (c == '\n') {
            out[j++] = '\\';
            out[j++] = 'n';
        } else {
            out[j++] = c;
        }
    }
    out[j] = '\0';
}

#define P(...)                                                                                     \
    do {                                                                                           \
        if ((rc = gift_str_printf(out, __VA_ARGS__)) < 0)                                          \
            return rc;                                                                             \
    } while (0)

/* Frames and bytes in and out, and payloads by codec. */
static int render_traffic(const gift_shard_counters_t *c, gift_str_t *out)
{
    int rc;

    P("# HELP giftd_frames_total Frames received (in) and sent (out).\n"
      "# TYPE giftd_frames_total counter\n"
      "giftd_frames_total{direction=\"in\"} %llu\n"
      "giftd_frames_total{direction=\"out\"} %llu\n",
      (unsigned long long)c->frames_in, (unsigned long long)c->frames_out);
    P("# HELP giftd_bytes_total Bytes received (in) and sent (out), preamble, headers and "
      "payloads.\n"
      "# TYPE giftd_bytes_total counter\n"
      "giftd_bytes_total{direction=\"in\"} %llu\n"
      "giftd_bytes_total{direction=\"out\"} %llu\n",
      (unsigned long long)c->bytes_in, (unsigned long long)c->bytes_out);
    P("# HELP giftd_payload_bytes_total Push payload bytes in and pull payload bytes out, by "
      "codec.\n"
      "# TYPE giftd_payload_bytes_total counter\n");
    for (int f = 0; f < 5; f++)
        P("giftd_payload_bytes_total{direction=\"in\",codec=\"%s\"} %llu\n"
          "giftd_payload_bytes_total{direction=\"out\",codec=\"%s\"} %llu\n",
          gift_format_name((gift_format_t)f), (unsigned long long)c->push_bytes_in[f],
          gift_format_name((gift_format_t)f), (unsigned long long)c->pull_bytes_out[f]);
    P("# HELP giftd_payload_frames_total Pushes counted (in) and pull replies sent (out), by "
      "codec.\n"
      "# TYPE giftd_payload_frames_total counter\n");
    for (int f = 0; f < 5; f++)
        P("giftd_payload_frames_total{direction=\"in\",codec=\"%s\"} %llu\n"
          "giftd_payload_frames_total{direction=\"out\",codec=\"%s\"} %llu\n",
          gift_format_name((gift_format_t)f), (unsigned long long)c->push_frames_in[f],
          gift_format_name((gift_format_t)f), (unsigned long long)c->pull_frames_out[f]);
    P("# HELP giftd_pass_bytes_total Walks of the shard's code over chunk elements, 4 bytes per "
      "element per walk, by kind: divided by the FP32 bytes pushed, the passes the data took.\n"
      "# TYPE giftd_pass_bytes_total counter\n");
    for (int k = 0; k < GIFT_SPASS_KINDS; k++)
        P("giftd_pass_bytes_total{pass=\"%s\"} %llu\n", gift_shard_pass_name(k),
          (unsigned long long)c->pass_bytes[k]);
    {
        struct timespec ts;
        double cpu = clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0
                         ? (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec
                         : 0.0;
        P("# HELP process_cpu_seconds_total User and system CPU time of giftd, all threads.\n"
          "# TYPE process_cpu_seconds_total counter\n"
          "process_cpu_seconds_total %.6f\n",
          cpu);
    }
    return 0;
}

static const char *const spass_names[GIFT_SPASS_KINDS] = {
    [GIFT_SPASS_DECODE] = "decode",     [GIFT_SPASS_ACCUMULATE] = "accumulate",
    [GIFT_SPASS_FUSED] = "fused",       [GIFT_SPASS_ENCODE] = "encode",
    [GIFT_SPASS_COPY] = "copy",         [GIFT_SPASS_CHECK] = "check",
    [GIFT_SPASS_RESIDUAL] = "residual", [GIFT_SPASS_SCALE] = "scale",
};

const char *gift_shard_pass_name(int kind)
{
    return kind >= 0 && kind < GIFT_SPASS_KINDS ? spass_names[kind] : NULL;
}

/* Pushes, pulls, sketches, steps, stalls, epochs and the step latency histogram. */
static int render_work(const gift_shard_counters_t *c, gift_str_t *out)
{
    uint64_t cum = 0;
    int rc;

    P("# HELP giftd_pushes_total Pushes counted into an accumulator.\n"
      "# TYPE giftd_pushes_total counter\n"
      "giftd_pushes_total %llu\n"
      "# HELP giftd_duplicate_pushes_total Repeated pushes acknowledged and ignored.\n"
      "# TYPE giftd_duplicate_pushes_total counter\n"
      "giftd_duplicate_pushes_total %llu\n"
      "# HELP giftd_pulls_total Pull requests received.\n"
      "# TYPE giftd_pulls_total counter\n"
      "giftd_pulls_total %llu\n"
      "# HELP giftd_sketches_total Sketches summed by the geometry owner.\n"
      "# TYPE giftd_sketches_total counter\n"
      "giftd_sketches_total %llu\n"
      "# HELP giftd_steps_finished_total Chunk steps finished (all ranks pushed).\n"
      "# TYPE giftd_steps_finished_total counter\n"
      "giftd_steps_finished_total %llu\n"
      "# HELP giftd_stalls_total Chunk steps that waited longer than stall_warn for ranks.\n"
      "# TYPE giftd_stalls_total counter\n"
      "giftd_stalls_total %llu\n"
      "# HELP giftd_epochs_published_total Geometry epochs published.\n"
      "# TYPE giftd_epochs_published_total counter\n"
      "giftd_epochs_published_total %llu\n"
      "# HELP giftd_window_moves_total Chunk windows placed by a first push far ahead of the\n"
      "# members and moved down to a member's first step (its pushes dropped).\n"
      "# TYPE giftd_window_moves_total counter\n"
      "giftd_window_moves_total %llu\n",
      (unsigned long long)c->pushes, (unsigned long long)c->duplicates,
      (unsigned long long)c->pulls, (unsigned long long)c->sketches,
      (unsigned long long)c->steps_finished, (unsigned long long)c->stalls,
      (unsigned long long)c->epochs_published, (unsigned long long)c->window_moves);
    P("# HELP giftd_step_latency_seconds Time from a chunk step's first push to its last.\n"
      "# TYPE giftd_step_latency_seconds histogram\n");
    for (int b = 0; b < GIFT_LAT_BUCKETS; b++) {
        cum += c->lat_bucket[b];
        if (b == GIFT_LAT_BUCKETS - 1)
            P("giftd_step_latency_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
        else
            P("giftd_step_latency_seconds_bucket{le=\"%g\"} %llu\n", gift_lat_bounds[b],
              (unsigned long long)cum);
    }
    P("giftd_step_latency_seconds_sum %.9f\n"
      "giftd_step_latency_seconds_count %llu\n",
      c->lat_sum, (unsigned long long)cum);
    return 0;
}

/* Open connections (the glue's count when it gives one) and error replies by code. */
static int render_errors(const gift_shard_counters_t *c, const gift_proc_info_t *pi,
                         gift_str_t *out)
{
    int rc;

    P("# HELP giftd_connections Open protocol connections.\n"
      "# TYPE giftd_connections gauge\n"
      "giftd_connections %u\n",
      pi ? pi->open_connections : c->peers);
    P("# HELP giftd_errors_total Error replies sent, by code.\n"
      "# TYPE giftd_errors_total counter\n");
    for (int i = 1; i < 32; i++) {
        char name[256];
        if (!c->errors[i])
            continue;
        /* Some sentences quote things (bad frame magic (expected "GIF1")). */
        label_escape(gift_strerror(-i), name, sizeof name);
        P("giftd_errors_total{code=\"%d\",name=\"%s\"} %llu\n", -i, name,
          (unsigned long long)c->errors[i]);
    }
    return 0;
}

/* Which number of the geometry owner's decision owner_gauge prints. */
enum { OWNER_RANK, OWNER_PRED_RATIO, OWNER_BITS };

/* One gauge per tensor whose geometry this shard owns: a number of the
 * newest epoch's decision. */
static int owner_gauge(const gift_shard_t *s, gift_str_t *out, const char *metric, const char *help,
                       int which)
{
    int rc;

    P("# HELP %s %s\n# TYPE %s gauge\n", metric, help, metric);
    for (size_t i = 0; i < gift_shard_tensor_count(s); i++) {
        gift_tensor_status_t ts;
        char name[256];
        double v;
        if (gift_shard_tensor_status(s, i, &ts, NULL, 0) < 0 || !ts.owner)
            continue;
        label_escape(ts.name, name, sizeof name);
        v = which == OWNER_RANK         ? (double)ts.rank
            : which == OWNER_PRED_RATIO ? ts.pred_ratio
                                        : ts.bits;
        P("%s{key=\"%u\",tensor=\"%s\"} %g\n", metric, ts.key, name, v);
    }
    return 0;
}

/* Per tensor: boundary-hit ratio, missing ranks and the oldest unfinished step, and the ranks a
 * partly pushed step waits for. */
static int render_tensors(const gift_shard_t *s, gift_str_t *out)
{
    int rc;

    P("# HELP giftd_boundary_hit_ratio Pull-codec codes that saturated or flushed to zero, last "
      "measured step, per tensor.\n"
      "# TYPE giftd_boundary_hit_ratio gauge\n");
    for (size_t i = 0; i < gift_shard_tensor_count(s); i++) {
        gift_tensor_status_t ts;
        char name[256];
        if (gift_shard_tensor_status(s, i, &ts, NULL, 0) < 0)
            continue;
        label_escape(ts.name, name, sizeof name);
        P("giftd_boundary_hit_ratio{key=\"%u\",tensor=\"%s\",codec=\"%s\"} %g\n", ts.key, name,
          ts.pull_codec, ts.hit_rate);
    }
    /* The geometry owner's decision for the newest epoch. */
    P("# HELP giftd_tensor_policy 1, labelled with the treatment the geometry owner chose for "
      "the newest epoch of a tensor (mode gift or euclidean, its push and pull codecs).\n"
      "# TYPE giftd_tensor_policy gauge\n");
    for (size_t i = 0; i < gift_shard_tensor_count(s); i++) {
        gift_tensor_status_t ts;
        char name[256];
        if (gift_shard_tensor_status(s, i, &ts, NULL, 0) < 0 || !ts.owner)
            continue;
        label_escape(ts.name, name, sizeof name);
        P("giftd_tensor_policy{key=\"%u\",tensor=\"%s\",mode=\"%s\",push_codec=\"%s\","
          "pull_codec=\"%s\"} 1\n",
          ts.key, name, ts.mode, ts.epoch_push_codec, ts.epoch_pull_codec);
    }
    if ((rc = owner_gauge(s, out, "giftd_tensor_transform_rank",
                          "Transform rank k of the newest epoch of a tensor.", OWNER_RANK)) < 0 ||
        (rc = owner_gauge(s, out, "giftd_tensor_predicted_error_ratio",
                          "The chooser's predicted error of the newest epoch's treatment over "
                          "Euclidean at the declared format (1: unknown, 0: not run).",
                          OWNER_PRED_RATIO)) < 0 ||
        (rc = owner_gauge(s, out, "giftd_tensor_element_cost",
                          "Wire bits per element of the newest epoch's treatment, geometry "
                          "amortised (0: the chooser did not run).",
                          OWNER_BITS)) < 0)
        return rc;
    P("# HELP giftd_tensor_missing_ranks Ranks that have not pushed the oldest unfinished step "
      "of a tensor.\n"
      "# TYPE giftd_tensor_missing_ranks gauge\n");
    for (size_t i = 0; i < gift_shard_tensor_count(s); i++) {
        gift_tensor_status_t ts;
        char name[256];
        if (gift_shard_tensor_status(s, i, &ts, NULL, 0) < 0 || !ts.has_step)
            continue;
        label_escape(ts.name, name, sizeof name);
        P("giftd_tensor_missing_ranks{key=\"%u\",tensor=\"%s\"} %u\n", ts.key, name, ts.missing);
    }
    P("# HELP giftd_tensor_step Oldest unfinished step of a tensor on this shard.\n"
      "# TYPE giftd_tensor_step gauge\n");
    for (size_t i = 0; i < gift_shard_tensor_count(s); i++) {
        gift_tensor_status_t ts;
        char name[256];
        if (gift_shard_tensor_status(s, i, &ts, NULL, 0) < 0 || !ts.has_step)
            continue;
        label_escape(ts.name, name, sizeof name);
        P("giftd_tensor_step{key=\"%u\",tensor=\"%s\"} %llu\n", ts.key, name,
          (unsigned long long)ts.step);
    }
    /* Which ranks a partly pushed step waits for (the first 32 per tensor):
     * the stall diagnosis, also logged after stall_warn. */
    P("# HELP giftd_tensor_missing_rank 1 for each rank that has not pushed a partly pushed "
      "oldest step (first 32 ranks per tensor).\n"
      "# TYPE giftd_tensor_missing_rank gauge\n");
    {
        uint32_t w = gift_shard_world_size(s);
        size_t words = (w + 63) / 64;
        uint64_t *bm = words ? calloc(words, sizeof *bm) : NULL;
        for (size_t i = 0; bm != NULL && i < gift_shard_tensor_count(s); i++) {
            gift_tensor_status_t ts;
            char name[256];
            uint32_t shown = 0;
            if (gift_shard_tensor_status(s, i, &ts, bm, words) < 0 || !ts.has_step ||
                ts.missing == 0 || ts.missing >= w)
                continue;
            label_escape(ts.name, name, sizeof name);
            for (uint32_t r = 0; r < w && shown < 32; r++)
                if ((bm[r >> 6] >> (r & 63)) & 1u) {
                    P("giftd_tensor_missing_rank{key=\"%u\",tensor=\"%s\",step=\"%llu\","
                      "rank=\"%u\"} 1\n",
                      ts.key, name, (unsigned long long)ts.step, r);
                    shown++;
                }
        }
        free(bm);
    }
    return 0;
}

/* Checkpoints, the step log and the restored step. */
static int render_persistence(const gift_shard_counters_t *c, gift_str_t *out)
{
    int rc;

    P("# HELP giftd_checkpoints_total Checkpoints written to data_dir.\n"
      "# TYPE giftd_checkpoints_total counter\n"
      "giftd_checkpoints_total %llu\n"
      "# HELP giftd_checkpoint_failures_total Checkpoints that could not be written.\n"
      "# TYPE giftd_checkpoint_failures_total counter\n"
      "giftd_checkpoint_failures_total %llu\n"
      "# HELP giftd_step_log_records_total Records appended (and fsynced) to the step log.\n"
      "# TYPE giftd_step_log_records_total counter\n"
      "giftd_step_log_records_total %llu\n"
      "# HELP giftd_step_log_bytes_total Bytes appended to the step log.\n"
      "# TYPE giftd_step_log_bytes_total counter\n"
      "giftd_step_log_bytes_total %llu\n"
      "# HELP giftd_step_log_failures_total Step-log appends that failed (their pulls fail).\n"
      "# TYPE giftd_step_log_failures_total counter\n"
      "giftd_step_log_failures_total %llu\n"
      "# HELP giftd_restored_step Oldest unfinished step restored at start (0: none).\n"
      "# TYPE giftd_restored_step gauge\n"
      "giftd_restored_step %llu\n",
      (unsigned long long)c->checkpoints, (unsigned long long)c->checkpoint_failures,
      (unsigned long long)c->log_records, (unsigned long long)c->log_bytes,
      (unsigned long long)c->log_failures, (unsigned long long)c->restored_step);
    return 0;
}

/* World size, declared tensors, resident memory and the start time. */
static int render_process(const gift_shard_t *s, const gift_proc_info_t *pi, gift_str_t *out)
{
    int rc;

    P("# HELP giftd_world_size Ranks in the cluster (0 until the first Declare).\n"
      "# TYPE giftd_world_size gauge\n"
      "giftd_world_size %u\n"
      "# HELP giftd_tensors Declared tensors.\n"
      "# TYPE giftd_tensors gauge\n"
      "giftd_tensors %zu\n"
      "# HELP giftd_resident_memory_bytes Resident set size.\n"
      "# TYPE giftd_resident_memory_bytes gauge\n"
      "giftd_resident_memory_bytes %llu\n",
      gift_shard_world_size(s), gift_shard_tensor_count(s), (unsigned long long)rss_bytes());
    {
        gift_shard_policy_t po;
        gift_shard_policy(s, &po);
        P("# HELP giftd_policy 1, labelled with the geometry owner's policy (giftd --policy).\n"
          "# TYPE giftd_policy gauge\n"
          "giftd_policy{policy=\"%s\"} 1\n"
          "# HELP giftd_policy_budget The policy's budget in wire bits per element (0: unset).\n"
          "# TYPE giftd_policy_budget gauge\n"
          "giftd_policy_budget %g\n"
          "# HELP giftd_policy_max_transform_gflops The policy's transform cap (0: none).\n"
          "# TYPE giftd_policy_max_transform_gflops gauge\n"
          "giftd_policy_max_transform_gflops %g\n",
          po.name, po.budget_bits, po.max_transform_gflops);
    }
    if (pi)
        P("# HELP giftd_start_time_seconds Start time of the process since the epoch.\n"
          "# TYPE giftd_start_time_seconds gauge\n"
          "giftd_start_time_seconds %llu\n",
          (unsigned long long)pi->started_unix);
    return 0;
}

/* The /metrics page (server.h): the sections above, in this order. */
int gift_metrics_render(const gift_shard_t *s, const gift_proc_info_t *pi, gift_str_t *out)
{
    const gift_shard_counters_t *c = gift_shard_counters(s);
    int rc;

    out->len = 0;
    if ((rc = render_traffic(c, out)) < 0 || (rc = render_work(c, out)) < 0 ||
        (rc = render_errors(c, pi, out)) < 0 || (rc = render_tensors(s, out)) < 0 ||
        (rc = render_persistence(c, out)) < 0 || (rc = render_process(s, pi, out)) < 0)
        return rc;
    return 0;
}

#undef P

static int respond(gift_str_t *out, int status, const char *reason, const char *ctype,
                   const char *body, size_t blen)
{
    gift_str_t hdr = {0};
    int rc = gift_str_printf(&hdr,
                             "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                             "Connection: close\r\n\r\n",
                             status, reason, ctype, blen);
    if (rc < 0)
        return rc;
    out->len = 0;
    if ((rc = gift_str_printf(out, "%s%.*s", hdr.p, (int)blen, body ? body : "")) < 0) {
        gift_str_free(&hdr);
        return rc;
    }
    gift_str_free(&hdr);
    return status;
}

static int gift_http_respond_get(const char *path, const gift_shard_t *s,
                                 const gift_proc_info_t *pi, gift_str_t *out);

int gift_http_respond(const char *req, size_t len, const gift_shard_t *s,
                      const gift_proc_info_t *pi, gift_str_t *out)
{
    char method[16], path[256];
    const char *sp1, *sp2, *eol;
    int status;

    eol = memchr(req, '\r', len);
    sp1 = memchr(req, ' ', len);
    if (eol == NULL || sp1 == NULL || sp1 > eol)
        return respond(out, 400, "Bad Request", "text/plain", "bad request\n", 12);
    sp2 = memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1));
    if (sp2 == NULL || (size_t)(sp1 - req) >= sizeof method ||
        (size_t)(sp2 - sp1 - 1) >= sizeof path || strncmp(sp2 + 1, "HTTP/1.", 7) != 0)
        return respond(out, 400, "Bad Request", "text/plain", "bad request\n", 12);
    memcpy(method, req, (size_t)(sp1 - req));
    method[sp1 - req] = '\0';
    memcpy(path, sp1 + 1, (size_t)(sp2 - sp1 - 1));
    path[sp2 - sp1 - 1] = '\0';
    if (strchr(path, '?'))
        *strchr(path, '?') = '\0';
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return respond(out, 405, "Method Not Allowed", "text/plain", "GET only\n", 9);
    if (strcmp(method, "HEAD") == 0) {
        /* The same head as GET, without the body. */
        status = gift_http_respond_get(path, s, pi, out);
        char *end = out->p ? strstr(out->p, "\r\n\r\n") : NULL;
        if (end != NULL)
            out->len = (size_t)(end + 4 - out->p);
        return status;
    }
    return gift_http_respond_get(path, s, pi, out);
}

/* The response to GET path. */
static int gift_http_respond_get(const char *path, const gift_shard_t *s,
                                 const gift_proc_info_t *pi, gift_str_t *out)
{
    gift_str_t body = {0};
    int status;

    if (strcmp(path, "/livez") == 0)
        return respond(out, 200, "OK", "text/plain", "ok\n", 3);
    if (strcmp(path, "/readyz") == 0) {
        if (gift_shard_ready(s) && !(pi && pi->draining))
            return respond(out, 200, "OK", "text/plain", "ready\n", 6);
        return respond(out, 503, "Service Unavailable", "text/plain", "draining\n", 9);
    }
    if (strcmp(path, "/metrics") == 0) {
        if (gift_metrics_render(s, pi, &body) < 0) {
            gift_str_free(&body);
            return respond(out, 500, "Internal Server Error", "text/plain", "no memory\n", 10);
        }
        status =
            respond(out, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body.p, body.len);
        gift_str_free(&body);
        return status;
    }
    return respond(out, 404, "Not Found", "text/plain", "not found\n", 10);
}
