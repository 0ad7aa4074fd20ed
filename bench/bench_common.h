/*
 * bench_common.h: what the gift-bench subcommands share. Timing, medians,
 * argument parsing, a seeded random generator, host facts and a small
 * streaming JSON writer. Nothing here allocates behind the caller's back
 * except bench_alloc, which the caller frees with free().
 */
#ifndef GIFT_BENCH_COMMON_H
#define GIFT_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define BENCH_OUT_DIR "bench/out"

/* Subcommand entry points: argv[0] is the subcommand name. They return the
 * process exit status (0 ok, 1 failure, 2 usage error). */
int bench_codec_main(int argc, char **argv);
int bench_fidelity_main(int argc, char **argv);
void bench_codec_usage(FILE *f);
void bench_fidelity_usage(FILE *f);

/* Monotonic wall clock in seconds. */
double bench_now(void);
/* Median of v[0..n) (sorts v in place); NaN when n == 0. */
double bench_median(double *v, size_t n);
/* Nearest-rank percentile q in [0, 1] of v[0..n) (sorts v); NAN when n is 0. */
double bench_percentile(double *v, size_t n, double q);

/* 64-byte aligned, zero-filled allocation of n bytes, so every page is
 * touched before anything is timed. NULL on failure. Free with free(). */
void *bench_alloc(size_t n);

/* Parses a whole decimal integer in [lo, hi] for option opt. Prints a
 * message and returns -1 on failure, 0 on success. */
int bench_parse_long(const char *opt, const char *s, long lo, long hi, long *out);
int bench_parse_u64(const char *opt, const char *s, uint64_t *out);
/* Parses a finite double in [lo, hi]; like bench_parse_long. */
int bench_parse_double(const char *opt, const char *s, double lo, double hi, double *out);

/* Creates every folder above the file path (mkdir -p of its dirname).
 * Returns 0 or -1 with errno set. */
int bench_mkdir_for(const char *path);

/* Host facts for table headers and JSON. */
void bench_cpu_model(char *buf, size_t cap);
long bench_cpu_count(void);
void bench_date_utc(char *buf, size_t cap); /* ISO 8601 */

/* Pins BLAS to one thread (openblas_set_num_threads when the library has it;
 * otherwise main() re-executes with OPENBLAS_NUM_THREADS=1). */
void bench_blas_single_thread(void);

/* xoshiro256** seeded through splitmix64; reproducible for a seed. */
typedef struct bench_rng {
    uint64_t s[4];
    int have_spare;
    double spare;
} bench_rng_t;

void bench_rng_seed(bench_rng_t *r, uint64_t seed, uint64_t stream);
uint64_t bench_rng_u64(bench_rng_t *r);
double bench_rng_uniform(bench_rng_t *r); /* (0, 1) */
double bench_rng_normal(bench_rng_t *r);  /* N(0, 1) */
/* Student-t with nu degrees of freedom (integer nu >= 3), scaled to unit
 * variance. */
double bench_rng_student_unit(bench_rng_t *r, int nu);

/* One command-line option of a bench, for bench_opt_parse. */
typedef enum {
    BENCH_OPT_FLAG,   /* no value: *(int *)dst = 1 */
    BENCH_OPT_LONG,   /* *(long *)dst, an integer in [lo, hi] (bench_parse_long) */
    BENCH_OPT_U64,    /* *(uint64_t *)dst (bench_parse_u64) */
    BENCH_OPT_DOUBLE, /* *(double *)dst, in [dlo, dhi] (bench_parse_double) */
    BENCH_OPT_STR     /* *(const char **)dst = the argument itself */
} bench_opt_kind_t;

typedef struct bench_opt {
    const char *name; /* "--mib" */
    bench_opt_kind_t kind;
    void *dst;
    long lo, hi;      /* BENCH_OPT_LONG */
    double dlo, dhi;  /* BENCH_OPT_DOUBLE */
    const char *need; /* BENCH_OPT_STR: what a missing value needs ("a file name") */
    int nonempty;     /* BENCH_OPT_STR: an empty value is missing too */
    int *set;         /* when not NULL: set to 1 once the option is given */
} bench_opt_t;

/* Table entries. */
#define BENCH_FLAG(n, d)                                                                           \
    {                                                                                              \
        .name = (n), .kind = BENCH_OPT_FLAG, .dst = (d)                                            \
    }
#define BENCH_LONG(n, d, l, h)                                                                     \
    {                                                                                              \
        .name = (n), .kind = BENCH_OPT_LONG, .dst = (d), .lo = (l), .hi = (h)                      \
    }
#define BENCH_U64(n, d)                                                                            \
    {                                                                                              \
        .name = (n), .kind = BENCH_OPT_U64, .dst = (d)                                             \
    }
#define BENCH_DOUBLE(n, d, l, h)                                                                   \
    {                                                                                              \
        .name = (n), .kind = BENCH_OPT_DOUBLE, .dst = (d), .dlo = (l), .dhi = (h)                  \
    }
#define BENCH_LONG_SET(n, d, l, h, given)                                                          \
    {                                                                                              \
        .name = (n), .kind = BENCH_OPT_LONG, .dst = (d), .lo = (l), .hi = (h), .set = (given)      \
    }
#define BENCH_STR_SET(n, d, what, given)                                                           \
    {                                                                                              \
        .name = (n), .kind = BENCH_OPT_STR, .dst = (d), .need = (what), .set = (given)             \
    }
#define BENCH_STR(n, d, what, ne)                                                                  \
    {                                                                                              \
        .name = (n), .kind = BENCH_OPT_STR, .dst = (d), .need = (what), .nonempty = (ne)           \
    }

/* If argv[*i] names an option of the table t (n entries), stores its value
 * (argv[*i + 1], and *i moves past it) and returns 1; returns 0 when it names
 * none of them, or -1 when the value is missing or bad (said on stderr as the
 * bench_parse_* functions say it, or "gift-bench: OPT needs NEED"). */
int bench_opt_parse(const bench_opt_t *t, size_t n, int argc, char **argv, int *i);

/* Streaming JSON writer: keeps track of commas. key is NULL inside arrays. */
typedef struct bench_json {
    FILE *f;
    int depth;
    int count[32]; /* items written at each depth */
} bench_json_t;

void bench_json_open(bench_json_t *j, FILE *f); /* writes the opening '{' */
/* The preamble every bench's write_json shares: creates path's folder,
 * opens path and writes '{', then "benchmark", the version under
 * version_key and "date". Returns the file (the caller writes the rest,
 * closes the object and the file), or NULL with perror(path) said. */
FILE *bench_json_begin(bench_json_t *j, const char *path, const char *benchmark,
                       const char *version_key, const char *version, const char *date);
void bench_json_close(bench_json_t *j); /* writes the closing '}' and newline */
void bench_json_obj(bench_json_t *j, const char *key);
void bench_json_obj_end(bench_json_t *j);
void bench_json_arr(bench_json_t *j, const char *key);
void bench_json_arr_end(bench_json_t *j);
void bench_json_num(bench_json_t *j, const char *key, double v); /* NaN/Inf -> null */
void bench_json_int(bench_json_t *j, const char *key, long long v);
void bench_json_str(bench_json_t *j, const char *key, const char *v); /* NULL -> null */
void bench_json_bool(bench_json_t *j, const char *key, int v);
void bench_json_null(bench_json_t *j, const char *key);

#endif
