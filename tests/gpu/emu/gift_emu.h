/*
 * gift_emu.h: a small CUDA emulator for the codec kernels of gpu/, so the
 * machines without a GPU still run them. Each CUDA thread is a std::thread;
 * the blocks of a grid run one after another; __syncthreads is a barrier of
 * the block, and warp shuffles and votes go through per-warp slots between
 * two barriers of the warp, so a kernel where some lanes of a warp skip a
 * shuffle deadlocks here as it would misbehave on a GPU. __shared__ is a
 * function-level static (one block at a time). Memory is host memory; the
 * stream and memset/copy calls are synchronous. The hardware FP8 conversion
 * is not emulated: __CUDA_ARCH__ is undefined, so the kernels take their
 * software path (the shared arithmetic of codec/gift_kernels.h).
 *
 * Included first by every emulated .cu (see tests/gpu/CMakeLists.txt, which
 * rewrites `k<<<grid, block, smem, stream>>>(args)` into
 * `gift_emu_launch(k, gift_emu_dims(grid, block, smem, stream), args)`).
 */
#ifndef GIFT_EMU_H
#define GIFT_EMU_H

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline

#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct gift_emu_idx {
    unsigned x, y, z;
};

extern thread_local gift_emu_idx threadIdx, blockIdx;
extern gift_emu_idx blockDim, gridDim;

/* The running block's barriers and warp slots. */
struct gift_emu_block {
    std::unique_ptr<std::barrier<>> block;
    std::vector<std::unique_ptr<std::barrier<>>> warp;
    std::vector<uint64_t> slot;
};
extern gift_emu_block *gift_emu_cur;
/* Kernels launched so far in this process (tests check that a path really
 * ran on the "device"); C callers see it as gift_emu_launch_count(). */
extern std::atomic<unsigned long> gift_emu_launches;
extern "C" unsigned long gift_emu_launch_count(void);

struct gift_emu_cfg {
    unsigned grid, block;
};

/* Every kernel of gpu/ loops grid-stride, so the emulator runs at most
 * GIFT_EMU_MAX_GRID blocks: the same results, far fewer block barriers, and
 * the loops' second turns are exercised too (rare on a real GPU). */
#define GIFT_EMU_MAX_GRID 4

static inline gift_emu_cfg gift_emu_dims(size_t grid, size_t block, size_t smem, cudaStream_t s)
{
    (void)smem, (void)s;
    return gift_emu_cfg{(unsigned)(grid < GIFT_EMU_MAX_GRID ? grid : GIFT_EMU_MAX_GRID),
                        (unsigned)block};
}

/* The CUDA threads of one block: persistent workers (creating 256 threads
 * per block would dominate the run), released for each block by `start`
 * and collected by `done`; the launching thread takes part in both. */
struct gift_emu_pool {
    unsigned n = 0;
    std::vector<std::thread> th;
    std::unique_ptr<std::barrier<>> start, done;
    void (*job)(unsigned t, void *arg) = nullptr;
    void *arg = nullptr;
    bool quit = false;

    void resize(unsigned want)
    {
        stop();
        n = want;
        start = std::make_unique<std::barrier<>>((std::ptrdiff_t)n + 1);
        done = std::make_unique<std::barrier<>>((std::ptrdiff_t)n + 1);
        quit = false;
        for (unsigned t = 0; t < n; t++)
            th.emplace_back([this, t]() {
                for (;;) {
                    start->arrive_and_wait();
                    if (quit)
                        return;
                    job(t, arg);
                    done->arrive_and_wait();
                }
            });
    }
    void run(void (*j)(unsigned, void *), void *a)
    {
        job = j, arg = a;
        start->arrive_and_wait();
        done->arrive_and_wait();
    }
    void stop()
    {
        if (n == 0)
            return;
        quit = true;
        start->arrive_and_wait();
        for (auto &x : th)
            x.join();
        th.clear();
        n = 0;
    }
    ~gift_emu_pool()
    {
        stop();
    }
};
extern gift_emu_pool gift_emu_threads;

template <class F> static void gift_emu_call(unsigned t, void *arg)
{
    (*(F *)arg)(t);
}

template <class... P, class... A>
static void gift_emu_launch(void (*k)(P...), gift_emu_cfg cfg, A... args)
{
    unsigned nw = (cfg.block + 31) / 32;
    gift_emu_launches.fetch_add(1, std::memory_order_relaxed);
    gift_emu_block blk;
    unsigned b = 0;
    auto body = [&](unsigned t) {
        threadIdx = {t, 0, 0};
        blockIdx = {b, 0, 0};
        k(args...);
    };
    gridDim = {cfg.grid, 1, 1};
    blockDim = {cfg.block, 1, 1};
    if (gift_emu_threads.n != cfg.block)
        gift_emu_threads.resize(cfg.block);
    blk.block = std::make_unique<std::barrier<>>((std::ptrdiff_t)cfg.block);
    for (unsigned w = 0; w < nw; w++)
        blk.warp.push_back(std::make_unique<std::barrier<>>(
            (std::ptrdiff_t)(cfg.block - 32 * w < 32 ? cfg.block - 32 * w : 32)));
    blk.slot.assign(cfg.block, 0);
    gift_emu_cur = &blk;
    for (b = 0; b < cfg.grid; b++)
        gift_emu_threads.run(gift_emu_call<decltype(body)>, &body);
    gift_emu_cur = nullptr;
}

static inline void __syncthreads(void)
{
    gift_emu_cur->block->arrive_and_wait();
}

/* Exchanges one 64-bit value through the warp's slots. */
static inline uint64_t gift_emu_xchg(uint64_t v, unsigned src_lane)
{
    unsigned w = threadIdx.x / 32, base = 32 * w;
    uint64_t r;
    gift_emu_cur->slot[threadIdx.x] = v;
    gift_emu_cur->warp[w]->arrive_and_wait();
    r = gift_emu_cur->slot[base + src_lane];
    gift_emu_cur->warp[w]->arrive_and_wait();
    return r;
}

template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int o)
{
    uint64_t u = 0, r;
    T out;
    (void)mask;
    static_assert(sizeof(T) <= 8, "shuffle of a large type");
    std::memcpy(&u, &v, sizeof v);
    r = gift_emu_xchg(u, (threadIdx.x % 32) ^ (unsigned)o);
    std::memcpy(&out, &r, sizeof out);
    return out;
}

static inline int __any_sync(unsigned mask, int pred)
{
    unsigned w = threadIdx.x / 32, base = 32 * w,
             n = blockDim.x - base < 32 ? blockDim.x - base : 32;
    int any = 0;
    (void)mask;
    gift_emu_cur->slot[threadIdx.x] = pred != 0;
    gift_emu_cur->warp[w]->arrive_and_wait();
    for (unsigned i = 0; i < n; i++)
        any |= (int)gift_emu_cur->slot[base + i];
    gift_emu_cur->warp[w]->arrive_and_wait();
    return any;
}

static inline int atomicCAS(int *p, int cmp, int val)
{
    std::atomic_ref<int> a(*p);
    a.compare_exchange_strong(cmp, val);
    return cmp;
}

static inline unsigned atomicMax(unsigned *p, unsigned v)
{
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v))
        ;
    return old;
}

static inline double atomicAdd(double *p, double v)
{
    std::atomic_ref<double> a(*p);
    return a.fetch_add(v);
}

static inline float __uint_as_float(unsigned u)
{
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

/* Round-to-nearest float operations: the host's, built without contraction. */
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fsub_rn(float a, float b)
{
    return a - b;
}

using std::max;

#endif
