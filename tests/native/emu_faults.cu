// Host program for tests/test_gpu_emu.py: the GPU emulator (native/gpu/emu) against hand-computed
// values, and its faults. Built with the host compiler as the emulated GPU library is, in either
// dialect (-x c++ -DLUCE_GPU_EMU, and -DLUCE_HIP or -D__CUDA_ARCH__=900). Usage: emu_faults CASE;
// prints what the case computed, or the launch's error, one line.
//   shuffles   lane l's xor-1, down-1 and broadcast-from-5 values, and the warp sum, of v = l * l
//   any        __any over a warp where only lane 17 holds true, and where none does
//   block_sum  a 96-thread block's sum of threadIdx.x + 1 through shared memory and two barriers
//   block_sums block_sums of (a, b) against block_sum(a), block_sum(b) (its N = 1) over five warps
//              whose partial sums round differently in another order: 1 where a thread got the
//              same bits
//   graph      a kernel captured into a graph and replayed twice after the input changed
//   stuck      even lanes at a shuffle, odd lanes at __syncthreads (must fail: stuck)
//   returned   a shuffle after lane 0 returned (must fail)
//   shared     a launch asking for 65 KiB of shared memory (must fail)
//   overrun    thread 64 of a block writes one float past a 64-float buffer (must stop the process)
// The CUDA dialect's own PTX:
//   mma        D = A B of m16n8k32 and of m16n8k16 (int8), fragments filled from A[r][k] =
//              (7r + 3k) % 17 - 8 and B[k][n] = (5k + 11n) % 13 - 6 per PTX's layouts: D row by row
//   ldmatrix   four 8x8 b16 matrices of a 128-word shared array (word i = i), row r of matrix m
//              at words 32 m + 4 ((3 r) % 8): the four words each lane got, lane by lane
//   copies     64 floats (i) by one bulk copy, then a 8-word x 4-row tensor-map box at row 8 of a
//              10-row array (rows past it: zeros), each waited for by another warp
//   phase      a wait on a barrier phase that nobody completes (must fail: stuck)
//   uninit     an arrival at a barrier never initialised (must fail)
//   box        a tensor-map box starting one word into a row (must fail)
//   partial    a shuffle over half the warp (must fail)
#include <cstdio>
#include <cstring>
#include <string>

#include "gpu_compat.h"
#if !defined(LUCE_HIP)
#include "bulk_copy.cuh"
#include "mma_int8.cuh"
#endif

using namespace luce::gpu;

namespace {

__global__ void shuffles_kernel(float *out) {
    const int l = threadIdx.x;
    const float v = float(l * l);
    out[4 * l + 0] = shfl_xor(v, 1);
    out[4 * l + 1] = shfl_down(v, 1);
    out[4 * l + 2] = shfl_idx(v, 5);
    out[4 * l + 3] = warp_sum(v);
}

__global__ void any_kernel(int *out) {
    out[2 * threadIdx.x] = warp_any(threadIdx.x == 17);
    out[2 * threadIdx.x + 1] = warp_any(false);
}

__global__ void block_sum_kernel(float *out) { out[threadIdx.x] = block_sum(float(threadIdx.x + 1)); }

__global__ void block_sums_kernel(int *out) {
    // One warp's sum is 1e7 (an ulp of 1) and the others' 0.3 each: added after it, each 0.3 is
    // lost; added before it, they make 1.2 and move it. So another order of the warps' partial
    // sums gives other bits.
    const int warp = threadIdx.x / 32;
    const float a = warp == 0 ? 312500.0f : 0.3f / 32, b = warp == 4 ? 312500.0f : 0.3f / 32;
    const float sa = block_sum(a), sb = block_sum(b);
    float both[2] = {a, b};
    block_sums(both);
    out[threadIdx.x] = __float_as_uint(both[0]) == __float_as_uint(sa) && __float_as_uint(both[1]) == __float_as_uint(sb);
}

__global__ void scale_kernel(const float *x, float *y) { y[threadIdx.x] = 2.f * x[threadIdx.x]; }

__global__ void stuck_kernel(float *out) {
    if (threadIdx.x % 2 == 0) out[threadIdx.x] = shfl_xor(1.f, 2);
    else __syncthreads();
}

__global__ void returned_kernel(float *out) {
    if (threadIdx.x == 0) return;
    out[threadIdx.x] = shfl_xor(1.f, 1);
}

__global__ void shared_kernel(float *out) {
    LUCE_DYNAMIC_SHARED(float, s);
    s[threadIdx.x] = 1.f;
    out[threadIdx.x] = s[threadIdx.x];
}

__global__ void overrun_kernel(float *out) { out[threadIdx.x] = 1.f; }

#if !defined(LUCE_HIP)
int a_at(int r, int k) { return (7 * r + 3 * k) % 17 - 8; }
int b_at(int k, int n) { return (5 * k + 11 * n) % 13 - 6; }
// Four int8 values packed little-endian, value i from f(i).
template <class F>
uint32_t pack4(F f) {
    uint32_t w = 0;
    for (int i = 0; i < 4; ++i) w |= uint32_t(uint8_t(int8_t(f(i)))) << (8 * i);
    return w;
}

__global__ void mma_kernel(int *out) {
    const int lane = threadIdx.x, g = lane / 4, tq = lane % 4;
    // PTX ISA, mma.m16n8k32 .s8: a0 / a1 rows g / g + 8 at k = 4 tq..; a2 / a3 the same at k + 16;
    // b0 / b1 column g at k = 4 tq.. / 16 + 4 tq..; d[c] row g + 8 (c / 2), column 2 tq + c % 2.
    const uint32_t a0 = pack4([&](int i) { return a_at(g, 4 * tq + i); });
    const uint32_t a1 = pack4([&](int i) { return a_at(g + 8, 4 * tq + i); });
    const uint32_t a2 = pack4([&](int i) { return a_at(g, 16 + 4 * tq + i); });
    const uint32_t a3 = pack4([&](int i) { return a_at(g + 8, 16 + 4 * tq + i); });
    const uint32_t b0 = pack4([&](int i) { return b_at(4 * tq + i, g); });
    const uint32_t b1 = pack4([&](int i) { return b_at(16 + 4 * tq + i, g); });
    int d32[4], d16[4];
    mma_int8::mma_k32(a0, a1, a2, a3, b0, b1, d32);
    mma_int8::mma_k16(a0, a1, b0, d16);  // the first 16 of k
    for (int c = 0; c < 4; ++c) {
        const int row = g + 8 * (c / 2), col = 2 * tq + c % 2;
        out[row * 8 + col] = d32[c];
        out[128 + row * 8 + col] = d16[c];
    }
}

__global__ void ldmatrix_kernel(uint32_t *out) {
    __shared__ __align__(16) uint32_t words[128];
    for (int j = 0; j < 4; ++j) words[4 * threadIdx.x + j] = 4 * threadIdx.x + j;
    __syncwarp();
    // Lane l gives row l % 8 of matrix l / 8, which is stored at row (3 l) % 8 of the matrix's
    // 32 words: every row address differs from the plain order's.
    const int matrix = threadIdx.x / 8, row = threadIdx.x % 8;
    const uint32_t address = uint32_t(__cvta_generic_to_shared(&words[32 * matrix + 4 * ((3 * row) % 8)]));
    uint32_t r[4];
    luce_emu::ldmatrix_x4(address, r);
    for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = r[i];
}

__global__ void copies_kernel(const float *src, const __grid_constant__ bulk::TensorMap map, float *out) {
    __shared__ __align__(128) float buf[64];
    __shared__ __align__(128) float box[32];
    __shared__ __align__(8) uint64_t bars[2];
    if (threadIdx.x == 0) bulk::barrier_init(&bars[0], 1), bulk::barrier_init(&bars[1], 1);
    __syncthreads();
    if (threadIdx.x < 32) {  // warp 0 waits first: the copies are issued by warp 1, after it
        bulk::wait(&bars[0], 0);
        out[threadIdx.x] = buf[threadIdx.x], out[32 + threadIdx.x] = buf[32 + threadIdx.x];
        bulk::wait(&bars[1], 0);
        out[64 + threadIdx.x] = box[threadIdx.x];
    } else if (threadIdx.x == 32) {
        bulk::arrive_expect_bytes(&bars[0], sizeof buf);
        bulk::copy_to_shared(buf, src, sizeof buf, &bars[0]);
        bulk::arrive_expect_bytes(&bars[1], sizeof box);
        bulk::copy_box_to_shared(box, &map, 0, 8, &bars[1]);
    }
}

__global__ void phase_kernel(float *out) {
    __shared__ __align__(8) uint64_t bar;
    if (threadIdx.x == 0) bulk::barrier_init(&bar, 2);
    __syncthreads();
    if (threadIdx.x == 0) bulk::arrive(&bar);  // one arrival of two
    bulk::wait(&bar, 0);
    out[threadIdx.x] = 1.f;
}

__global__ void uninit_kernel(float *out) {
    __shared__ __align__(8) uint64_t bar;
    bulk::arrive(&bar);
    out[threadIdx.x] = 1.f;
}

__global__ void box_kernel(const __grid_constant__ bulk::TensorMap map, float *out) {
    __shared__ __align__(128) float box[32];
    __shared__ __align__(8) uint64_t bar;
    bulk::barrier_init(&bar, 1);
    bulk::arrive_expect_bytes(&bar, sizeof box);
    bulk::copy_box_to_shared(box, &map, 1, 0, &bar);
    bulk::wait(&bar, 0);
    out[threadIdx.x] = box[0];
}

__global__ void partial_kernel(float *out) { out[threadIdx.x] = __shfl_xor_sync(0x0000FFFFu, 1.f, 1); }
#endif

template <class T>
T *device(size_t n) {
    void *p = nullptr;
    LUCE_GPU_CHECK(cudaMalloc(&p, n * sizeof(T)));
    return static_cast<T *>(p);
}

// The launch's outcome: "" or the runtime's error text.
std::string outcome() {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

int run(const std::string &c) {
    float *f = device<float>(4096);
    if (c == "shuffles") {
        launch_kernel(shuffles_kernel, 1, LUCE_WARP, 0, nullptr, f);
        for (int i = 0; i < 4 * LUCE_WARP; ++i) std::printf("%g ", f[i]);
    } else if (c == "any") {
        int *n = device<int>(2 * LUCE_WARP);
        launch_kernel(any_kernel, 1, LUCE_WARP, 0, nullptr, n);
        for (int i = 0; i < 2 * LUCE_WARP; ++i) std::printf("%d ", n[i]);
    } else if (c == "block_sum") {
        launch_kernel(block_sum_kernel, 1, 96, 0, nullptr, f);
        for (int i = 0; i < 96; ++i) std::printf("%g ", f[i]);
    } else if (c == "block_sums") {
        int *n = device<int>(160);
        launch_kernel(block_sums_kernel, 1, 160, 0, nullptr, n);
        for (int i = 0; i < 160; ++i) std::printf("%d ", n[i]);
    } else if (c == "graph") {
        float *y = device<float>(64);
        cudaStream_t s;
        LUCE_GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        for (int i = 0; i < 64; ++i) f[i] = float(i);
        cudaGraph_t g;
        cudaGraphExec_t exec;
        LUCE_GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        launch_kernel(scale_kernel, 1, 64, 0, s, f, y);
        std::printf("%g ", y[3]);  // nothing ran during the capture: still NaN
        LUCE_GPU_CHECK(cudaStreamEndCapture(s, &g));
        LUCE_GPU_CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
        LUCE_GPU_CHECK(cudaGraphLaunch(exec, s));
        std::printf("%g ", y[3]);
        f[3] = 10.f;
        LUCE_GPU_CHECK(cudaGraphLaunch(exec, s));
        std::printf("%g", y[3]);
#if !defined(LUCE_HIP)
    } else if (c == "mma") {
        int *d = device<int>(256);
        launch_kernel(mma_kernel, 1, 32, 0, nullptr, d);
        for (int i = 0; i < 256; ++i) std::printf("%d ", d[i]);
    } else if (c == "ldmatrix") {
        uint32_t *w = device<uint32_t>(128);
        launch_kernel(ldmatrix_kernel, 1, 32, 0, nullptr, w);
        for (int i = 0; i < 128; ++i) std::printf("%u ", w[i]);
    } else if (c == "copies" || c == "box") {
        float *src = device<float>(80);
        for (int i = 0; i < 80; ++i) src[i] = float(i);
        bulk::TensorMap map;
        if (!bulk::encode_rows_map(map, src, 8, 10, 8, 4)) return 3;  // rows of 8 words, boxes of 8 x 4
        if (c == "box") launch_kernel(box_kernel, 1, 32, 0, nullptr, map, f);
        else launch_kernel(copies_kernel, 1, 64, 0, nullptr, src, map, f);
        for (int i = 0; i < 96; ++i) std::printf("%g ", f[i]);
#endif
    } else {
        if (c == "stuck") launch_kernel(stuck_kernel, 1, LUCE_WARP, 0, nullptr, f);
        else if (c == "returned") launch_kernel(returned_kernel, 1, LUCE_WARP, 0, nullptr, f);
        else if (c == "shared") launch_kernel(shared_kernel, 1, 32, 65 * 1024, nullptr, f);
        else if (c == "overrun") launch_kernel(overrun_kernel, 1, 65, 0, nullptr, device<float>(64));
#if !defined(LUCE_HIP)
        else if (c == "phase") launch_kernel(phase_kernel, 1, 32, 0, nullptr, f);
        else if (c == "uninit") launch_kernel(uninit_kernel, 1, 32, 0, nullptr, f);
        else if (c == "partial") launch_kernel(partial_kernel, 1, 32, 0, nullptr, f);
#endif
        else return 2;
    }
    std::printf("\n");
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    try {
        return run(argv[1]);
    } catch (const luce::Error &e) {  // launch_kernel checks the launch (LUCE_GPU_LAUNCHED)
        std::printf("error: %s\n", e.what());
        return 1;
    }
}
