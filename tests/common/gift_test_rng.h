/*
 * gift_test_rng.h: the random inputs the tests share. splitmix64 and the
 * generators built on it, plus float bit helpers and builders. Every suite
 * that includes this draws the same sequences it drew from its own copy.
 */
#ifndef GIFT_TEST_RNG_H
#define GIFT_TEST_RNG_H

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: fast, good enough for test inputs. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1), 53 bits. */
static inline double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* Standard normal (Box-Muller, one value per two draws). */
static inline double rng_normal(uint64_t *s)
{
    double u1 = ((double)(rng_next(s) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = ((double)(rng_next(s) >> 11) + 0.5) * 0x1.0p-53;

    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* n standard normal floats from seed (malloc'd). */
static inline float *rand_floats(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof(float));
    size_t i;

    ck_assert_ptr_nonnull(x);
    for (i = 0; i < n; i++)
        x[i] = (float)rng_normal(&seed);
    return x;
}

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A float from sign, unbiased exponent (-126..127) and 23 mantissa bits. */
static inline float mkf(int neg, int e, uint32_t mant)
{
    return u2f((neg ? 0x80000000u : 0u) | ((uint32_t)(e + 127) << 23) | (mant & 0x7FFFFFu));
}

static inline float rand_sign(uint64_t *s, float v)
{
    return (rng_next(s) & 1) ? -v : v;
}

/* Inputs with varied magnitudes: runs of zeros, subnormals, huge values,
 * values near the inverse-scale overflow, outliers, mixed signs, constants,
 * values on a power-of-two grid (ties after scaling). */
static inline void fill_varied(float *x, size_t n, uint64_t *s)
{
    size_t i = 0;
    while (i < n) {
        size_t len = 1 + (size_t)(rng_next(s) % 300);
        int kind = (int)(rng_next(s) % 11);
        float c = mkf(0, (int)(rng_next(s) % 60) - 30, (uint32_t)rng_next(s));
        int ge = (int)(rng_next(s) % 41) - 20;
        for (size_t j = 0; j < len && i < n; j++, i++) {
            float v;
            switch (kind) {
            case 0:
                v = (rng_next(s) % 5 == 0) ? -0.0f : 0.0f;
                break;
            case 1:
                v = u2f((uint32_t)rng_next(s) & 0x807FFFFFu);
                break;
            case 2:
                v = mkf((int)(rng_next(s) & 1), 90 + (int)(rng_next(s) % 38),
                        (uint32_t)rng_next(s));
                break;
            case 3:
                v = (float)(rng_unit(s) * 2.0 - 1.0);
                break;
            case 4:
                v = mkf((int)(rng_next(s) & 1), (int)(rng_next(s) % 80) - 40,
                        (uint32_t)rng_next(s));
                break;
            case 5:
                v = rand_sign(s, (j % 37 == 0) ? c * 1000.0f : c * (float)rng_unit(s));
                break;
            case 6:
                v = rand_sign(s, (float)ldexp(1.0 + rng_unit(s), -130 + (int)(rng_next(s) % 26)));
                break;
            case 7: {
                uint32_t u;
                do
                    u = (uint32_t)rng_next(s);
                while ((u & 0x7F800000u) == 0x7F800000u);
                v = u2f(u);
                break;
            }
            case 8:
                v = c;
                break;
            case 9:
                v = ldexpf((float)((int)(rng_next(s) % 33) - 16), ge);
                break;
            default:
                v = rand_sign(s, c * (float)rng_unit(s));
                break;
            }
            x[i] = v;
        }
    }
}

#endif
