/*
 * gpu_test_util.h: what the GPU suites share. Every CUDA call is checked
 * (CUDA_OK), device buffers are poisoned before a kernel writes them, and
 * main() exits 77 when there is no device. Check runs without fork: a CUDA
 * context does not survive fork(), and the device is probed in main().
 */
#ifndef GIFT_GPU_TEST_UTIL_H
#define GIFT_GPU_TEST_UTIL_H

#include <check.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_gpu.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                 \
    } while (0)

/* A gift call on the GPU that must succeed; names the CUDA failure if any. */
#define GPU_OK(ctx, call)                                                                          \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == 0, "%s: %s (%s)", #call, gift_strerror(rc_),                          \
                      gift_gpu_last_error(ctx));                                                   \
    } while (0)

#define POISON_BYTE 0xA7

/* Device buffer of n bytes, poisoned. */
static inline void *dev_alloc(size_t n)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, n ? n : 1));
    CUDA_OK(cudaMemset(p, POISON_BYTE, n ? n : 1));
    return p;
}

static inline void *host_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    memset(p, POISON_BYTE, n ? n : 1);
    return p;
}

static inline void h2d(void *d, const void *h, size_t n)
{
    CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
}

static inline void d2h(void *h, const void *d, size_t n)
{
    CUDA_OK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

/* The suite's context on device 0: made by gpu_setup, freed by gpu_teardown
 * (the suite's checked fixture). */
static gift_gpu_ctx_t *ctx;

static inline void gpu_setup(void)
{
    int rc = gift_gpu_ctx_create(0, NULL, &ctx);
    ck_assert_msg(rc == 0, "gift_gpu_ctx_create: %s", gift_strerror(rc));
}

static inline void gpu_teardown(void)
{
    gift_gpu_ctx_free(ctx);
    ctx = NULL;
}

/* A test case of s named name, with gpu_setup and gpu_teardown as its
 * checked fixture and a timeout of timeout_s seconds; add its tests. */
static inline TCase *gpu_tcase(Suite *s, const char *name, double timeout_s)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, gpu_setup, gpu_teardown);
    tcase_set_timeout(tc, timeout_s);
    suite_add_tcase(s, tc);
    return tc;
}

/* Runs suite s without fork; exits 77 when there is no CUDA device. */
static inline int gpu_test_main(Suite *(*make)(void))
{
    char name[256];
    SRunner *sr;
    int failed;

    if (gift_gpu_device_count() == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    if (gift_gpu_device_name(0, name, sizeof name) == 0)
        printf("device 0: %s\n", name);
    sr = srunner_create(make());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

#endif
