// Host program for tests/test_gpu_emu.py: the GPU emulator (native/gpu/emu) against hand-computed
// values, and its faults. Built with the host compiler as the emulated GPU library is
// (-x c++ -DLUCE_HIP -DLUCE_GPU_EMU). Usage: emu_faults CASE; prints what the case computed,
// or the launch's error, one line.
//   shuffles   lane l's xor-1, down-1 and broadcast-from-5 values, and the warp sum, of v = l * l
//   any        __any over a warp where only lane 17 holds true, and where none does
//   block_sum  a 96-thread block's sum of threadIdx.x + 1 through shared memory and two barriers
//   graph      a kernel captured into a graph and replayed twice after the input changed
//   stuck      even lanes at a shuffle, odd lanes at __syncthreads (must fail: stuck)
//   returned   a shuffle after lane 0 returned (must fail)
//   shared     a launch asking for 65 KiB of shared memory (must fail)
//   overrun    thread 64 of a block writes one float past a 64-float buffer (must stop the process)
#include <cstdio>
#include <cstring>
#include <string>

#include "gpu_compat.h"

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
    } else {
        if (c == "stuck") launch_kernel(stuck_kernel, 1, LUCE_WARP, 0, nullptr, f);
        else if (c == "returned") launch_kernel(returned_kernel, 1, LUCE_WARP, 0, nullptr, f);
        else if (c == "shared") launch_kernel(shared_kernel, 1, 32, 65 * 1024, nullptr, f);
        else if (c == "overrun") launch_kernel(overrun_kernel, 1, 65, 0, nullptr, device<float>(64));
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
