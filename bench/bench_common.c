/* bench_common.c: helpers shared by the gift-bench subcommands. */
#define _POSIX_C_SOURCE 200809L

#include "bench_common.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef GIFT_HAVE_OPENBLAS_SET_NUM_THREADS
#include <cblas.h>
#endif

double bench_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

double bench_percentile(double *v, size_t n, double q)
{
    size_t i;

    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    i = (size_t)ceil(q * (double)n);
    return v[i > 0 ? i - 1 : 0];
}

double bench_median(double *v, size_t n)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void *bench_alloc(size_t n)
{
    void *p;
    size_t rounded = (n + 63) / 64 * 64;

    if (rounded == 0)
        rounded = 64;
    if (posix_memalign(&p, 64, rounded) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

int bench_parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    if (s == NULL) {
        fprintf(stderr, "gift-bench: %s needs a value\n", opt);
        return -1;
    }
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "gift-bench: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int bench_opt_parse(const bench_opt_t *t, size_t n, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    for (size_t k = 0; k < n; k++) {
        const bench_opt_t *o = &t[k];
        int rc = 0;
        if (strcmp(a, o->name) != 0)
            continue;
        switch (o->kind) {
        case BENCH_OPT_FLAG:
            *(int *)o->dst = 1;
            break;
        case BENCH_OPT_LONG:
            rc = bench_parse_long(a, v, o->lo, o->hi, o->dst);
            break;
        case BENCH_OPT_U64:
            rc = bench_parse_u64(a, v, o->dst);
            break;
        case BENCH_OPT_DOUBLE:
            rc = bench_parse_double(a, v, o->dlo, o->dhi, o->dst);
            break;
        case BENCH_OPT_STR:
            if (v == NULL || (o->nonempty && v[0] == '\0')) {
                fprintf(stderr, "gift-bench: %s needs %s\n", a, o->need);
                rc = -1;
            } else {
                *(const char **)o->dst = v;
            }
            break;
        }
        if (rc < 0)
            return -1;
        if (o->kind != BENCH_OPT_FLAG)
            (*i)++;
        if (o->set != NULL)
            *o->set = 1;
        return 1;
    }
    return 0;
}

int bench_parse_u64(const char *opt, const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (s == NULL) {
        fprintf(stderr, "gift-bench: %s needs a value\n", opt);
        return -1;
    }
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-') {
        fprintf(stderr, "gift-bench: %s: '%s' is not an unsigned 64-bit integer\n", opt, s);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int bench_parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v;

    if (s == NULL) {
        fprintf(stderr, "gift-bench: %s needs a value\n", opt);
        return -1;
    }
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "gift-bench: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int bench_mkdir_for(const char *path)
{
    char buf[PATH_MAX];
    size_t len = strlen(path);
    char *p;

    if (len >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, len + 1);
    p = strrchr(buf, '/');
    if (p == NULL || p == buf)
        return 0;
    *p = '\0';
    for (p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

void bench_cpu_model(char *buf, size_t cap)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];

    snprintf(buf, cap, "unknown");
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        char *colon;

        if (strncmp(line, "model name", 10) != 0 || (colon = strchr(line, ':')) == NULL)
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(buf, cap, "%s", colon);
        break;
    }
    fclose(f);
}

long bench_cpu_count(void)
{
    return sysconf(_SC_NPROCESSORS_ONLN);
}

void bench_date_utc(char *buf, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;

    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void bench_blas_single_thread(void)
{
#ifdef GIFT_HAVE_OPENBLAS_SET_NUM_THREADS
    openblas_set_num_threads(1);
#endif
}

/* ---------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void bench_rng_seed(bench_rng_t *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    int i;

    for (i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->have_spare = 0;
    r->spare = 0.0;
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t bench_rng_u64(bench_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double bench_rng_uniform(bench_rng_t *r)
{
    /* 53 random bits, shifted off zero. */
    return ((double)(bench_rng_u64(r) >> 11) + 0.5) * 0x1.0p-53;
}

double bench_rng_normal(bench_rng_t *r)
{
    double u, v, s;

    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    do { /* Marsaglia polar method */
        u = 2.0 * bench_rng_uniform(r) - 1.0;
        v = 2.0 * bench_rng_uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    s = sqrt(-2.0 * log(s) / s);
    r->spare = v * s;
    r->have_spare = 1;
    return u * s;
}

double bench_rng_student_unit(bench_rng_t *r, int nu)
{
    double chi2 = 0.0, z = bench_rng_normal(r);
    int i;

    for (i = 0; i < nu; i++) {
        double g = bench_rng_normal(r);
        chi2 += g * g;
    }
    /* t = z / sqrt(chi2 / nu) has variance nu / (nu - 2). */
    return z / sqrt(chi2 / nu) * sqrt((double)(nu - 2) / nu);
}

/* --------------------------------------------------------------- json */

static void json_sep(bench_json_t *j, const char *key)
{
    if (j->count[j->depth]++ > 0)
        fputc(',', j->f);
    fputc('\n', j->f);
    for (int i = 0; i < j->depth; i++)
        fputs("  ", j->f);
    if (key != NULL)
        fprintf(j->f, "\"%s\": ", key);
}

static void json_push(bench_json_t *j, int c)
{
    fputc(c, j->f);
    if (j->depth < 31)
        j->depth++;
    j->count[j->depth] = 0;
}

static void json_pop(bench_json_t *j, int c)
{
    int had = j->count[j->depth];

    if (j->depth > 0)
        j->depth--;
    if (had) {
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    fputc(c, j->f);
}

void bench_json_open(bench_json_t *j, FILE *f)
{
    j->f = f;
    j->depth = 0;
    j->count[0] = 0;
    json_push(j, '{');
}

FILE *bench_json_begin(bench_json_t *j, const char *path, const char *benchmark,
                       const char *version_key, const char *version, const char *date)
{
    FILE *f;
    if (bench_mkdir_for(path) < 0 || (f = fopen(path, "w")) == NULL) {
        perror(path);
        return NULL;
    }
    bench_json_open(j, f);
    bench_json_str(j, "benchmark", benchmark);
    bench_json_str(j, version_key, version);
    bench_json_str(j, "date", date);
    return f;
}

void bench_json_close(bench_json_t *j)
{
    json_pop(j, '}');
    fputc('\n', j->f);
}

void bench_json_obj(bench_json_t *j, const char *key)
{
    json_sep(j, key);
    json_push(j, '{');
}

void bench_json_obj_end(bench_json_t *j)
{
    json_pop(j, '}');
}

void bench_json_arr(bench_json_t *j, const char *key)
{
    json_sep(j, key);
    json_push(j, '[');
}

void bench_json_arr_end(bench_json_t *j)
{
    json_pop(j, ']');
}

void bench_json_num(bench_json_t *j, const char *key, double v)
{
    json_sep(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.9g", v);
    else
        fputs("null", j->f);
}

void bench_json_int(bench_json_t *j, const char *key, long long v)
{
    json_sep(j, key);
    fprintf(j->f, "%lld", v);
}

void bench_json_str(bench_json_t *j, const char *key, const char *v)
{
    json_sep(j, key);
    if (v == NULL) {
        fputs("null", j->f);
        return;
    }
    fputc('"', j->f);
    for (; *v; v++) {
        unsigned char c = (unsigned char)*v;

        if (c == '"' || c == '\\')
            fprintf(j->f, "\\%c", c);
        else if (c < 0x20)
            fprintf(j->f, "\\u%04x", c);
        else
            fputc(c, j->f);
    }
    fputc('"', j->f);
}

void bench_json_bool(bench_json_t *j, const char *key, int v)
{
    json_sep(j, key);
    fputs(v ? "true" : "false", j->f);
}

void bench_json_null(bench_json_t *j, const char *key)
{
    json_sep(j, key);
    fputs("null", j->f);
}
