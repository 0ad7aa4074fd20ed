/*
 * cuda_stubs.cpp: the CUDA runtime, cuBLAS and cuBLASLt calls gpu/ makes,
 * for the emulator (gift_emu.h): one "device" (host memory), synchronous
 * streams, events that order nothing (everything already ran), host
 * functions called at once, and plain column-major reference GEMMs with
 * cuBLAS's argument conventions (op, leading dimensions, alpha/beta; for
 * cuBLASLt, D = alpha op(A) op(B) + beta C with C and D apart). Linked
 * instead of libcudart/libcublas by the emulated tests, so the GPU tests'
 * own sources run on a machine without a GPU.
 */
#include "gift_emu.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>

thread_local gift_emu_idx threadIdx, blockIdx;
gift_emu_idx blockDim, gridDim;
gift_emu_block *gift_emu_cur;
gift_emu_pool gift_emu_threads;
std::atomic<unsigned long> gift_emu_launches;

extern "C" unsigned long gift_emu_launch_count(void)
{
    return gift_emu_launches.load();
}

static char dummy_obj[64];

extern "C" {

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "emulated error";
}
cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev)
{
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CPU emulator (tests/gpu/emu), device %d", dev);
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *dev)
{
    *dev = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev)
{
    return dev == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMallocHost(void **p, size_t n)
{
    return cudaMalloc(p, n);
}
cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p)
{
    return cudaFree(p);
}
cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    (void)s;
    return cudaMemset(p, v, n);
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    (void)k;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st)
{
    (void)st;
    return cudaMemcpy(d, s, n, k);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = (cudaStream_t)(dummy_obj + 1);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
/* Host functions (cudaLaunchHostFunc) run at once: the stream's work before
 * them is done already. With GIFT_EMU_DEFERRED_HOSTFN=1 in the environment
 * they run instead on a thread of their own, in launch order, each after a
 * pseudo-random 0-500 us, as a driver thread would run them: the caller goes
 * on and sees their reports arrive later (what libgiftclient's device path
 * must cope with). Every synchronisation waits for the deferred ones. The
 * thread starts at the first deferred call: fork before it. */
namespace {
struct hostfn_queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<cudaHostFn_t, void *>> q;
    bool running = false, started = false;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
};
/* Never destroyed: at exit the thread still waits on its condition. */
hostfn_queue &HQ = *new hostfn_queue;

bool hostfn_deferred(void)
{
    static const int on = [] {
        const char *v = getenv("GIFT_EMU_DEFERRED_HOSTFN");
        return v != nullptr && v[0] == '1';
    }();
    return on;
}

void hostfn_thread(void)
{
    std::unique_lock<std::mutex> lk(HQ.mu);
    for (;;) {
        HQ.cv.wait(lk, [] { return !HQ.q.empty(); });
        auto job = HQ.q.front();
        HQ.q.pop_front();
        HQ.running = true;
        HQ.rng = HQ.rng * 6364136223846793005ull + 1442695040888963407ull;
        unsigned us = (unsigned)(HQ.rng >> 33) % 500u;
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(us));
        job.first(job.second);
        lk.lock();
        HQ.running = false;
        HQ.cv.notify_all();
    }
}

void hostfn_drain(void)
{
    if (!hostfn_deferred())
        return;
    std::unique_lock<std::mutex> lk(HQ.mu);
    HQ.cv.wait(lk, [] { return HQ.q.empty() && !HQ.running; });
}
} // namespace

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    hostfn_drain();
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void)
{
    hostfn_drain();
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = (cudaEvent_t)(dummy_obj + 2);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    (void)e;
    hostfn_drain();
    return cudaSuccess;
}
/* Emulated time means nothing: every interval is 1 ms. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    (void)a, (void)b;
    *ms = 1.0f;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)e, (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)s, (void)e, (void)flags;
    return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg)
{
    (void)s;
    if (!hostfn_deferred()) {
        fn(arg);
        return cudaSuccess;
    }
    std::lock_guard<std::mutex> lk(HQ.mu);
    if (!HQ.started) {
        std::thread(hostfn_thread).detach();
        HQ.started = true;
    }
    HQ.q.emplace_back(fn, arg);
    HQ.cv.notify_all();
    return cudaSuccess;
}

/* cuBLAS: handles are dummies; only FP32 GEMM is emulated. */
cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = (cublasHandle_t)(dummy_obj + 3);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    (void)h, (void)s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    (void)h, (void)m;
    return CUBLAS_STATUS_SUCCESS;
}

/* Element (i, j) of op(X), X column-major with leading dimension ld. */
static float at(const float *x, int ld, bool t, int i, int j)
{
    return t ? x[(size_t)j + (size_t)i * ld] : x[(size_t)i + (size_t)j * ld];
}

/* D (m x n, ldd) = alpha op(A) op(B) + beta C (ldc), k inner, in double. */
static void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, const float *C, int ldc, float *D, int ldd)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int l = 0; l < k; l++)
                s += (double)at(A, lda, ta, i, l) * at(B, ldb, tb, l, j);
            double c = beta != 0.0f ? (double)beta * C[(size_t)i + (size_t)j * ldc] : 0.0;
            D[(size_t)i + (size_t)j * ldd] = (float)(alpha * s + c);
        }
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float *alpha, const float *A, int lda,
                              const float *B, int ldb, const float *beta, float *C, int ldc)
{
    (void)h;
    if (m < 0 || n < 0 || k < 0 || lda < (ta == CUBLAS_OP_N ? m : k) ||
        ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    gemm(ta != CUBLAS_OP_N, tb != CUBLAS_OP_N, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc, C,
         ldc);
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLASLt: descriptors are small structs of ours. */
struct emu_desc {
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
struct emu_layout {
    uint64_t rows, cols;
    int64_t ld;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = (cublasLtHandle_t)(dummy_obj + 4);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct,
                                        cudaDataType_t st)
{
    if (ct != CUBLAS_COMPUTE_32F || st != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = (cublasLtMatmulDesc_t) new emu_desc;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete (emu_desc *)d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t size)
{
    emu_desc *e = (emu_desc *)d;
    if (size != sizeof(cublasOperation_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a == CUBLASLT_MATMUL_DESC_TRANSA)
        memcpy(&e->ta, buf, size);
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB)
        memcpy(&e->tb, buf, size);
    else
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (t != CUDA_R_32F || ld < (int64_t)rows)
        return CUBLAS_STATUS_INVALID_VALUE;
    *l = (cublasLtMatrixLayout_t) new emu_layout{rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(const cublasLtMatrixLayout_t l)
{
    delete (emu_layout *)l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Ad, const void *B,
                              cublasLtMatrixLayout_t Bd, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsb,
                              cudaStream_t s)
{
    const emu_desc *e = (const emu_desc *)desc;
    const emu_layout *a = (const emu_layout *)Ad, *b = (const emu_layout *)Bd;
    const emu_layout *c = (const emu_layout *)Cd, *d = (const emu_layout *)Dd;
    bool ta = e->ta != CUBLAS_OP_N, tb = e->tb != CUBLAS_OP_N;
    uint64_t m = ta ? a->cols : a->rows, k = ta ? a->rows : a->cols;
    uint64_t kb = tb ? b->cols : b->rows, n = tb ? b->rows : b->cols;
    (void)h, (void)algo, (void)ws, (void)wsb, (void)s;
    if (k != kb || c->rows != m || c->cols != n || d->rows != m || d->cols != n)
        return CUBLAS_STATUS_INVALID_VALUE;
    gemm(ta, tb, (int)m, (int)n, (int)k, *(const float *)alpha, (const float *)A, (int)a->ld,
         (const float *)B, (int)b->ld, *(const float *)beta, (const float *)C, (int)c->ld,
         (float *)D, (int)d->ld);
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
