// gpu_compat.h — one source for CUDA and HIP.
//
// Kernels are written in the CUDA dialect. Under hipcc (CMake defines LUCE_HIP) the few runtime
// calls and intrinsics we use are mapped to their HIP names here, and nowhere else. Warp size:
// kernels use LUCE_WARP (below), host code reads it from the device properties
// (GpuBackend::warp_).
#pragma once

#include <cstdint>
#include <utility>

// The warp width in device code. On HIP the built-in `warpSize` (RDNA runs wave32, CDNA wave64).
// On CUDA it is 32 on every part, and saying so as a constant matters: nvcc reads `warpSize`
// from a register, so `threadIdx.x / warpSize` became a ~20-instruction division and every
// `k * warpSize` offset an address computed per load (the decode step's add_rmsnorm executed
// ~1500 instructions per warp for 8 values a lane; H200 ncu, 2026-12-04).
#if defined(LUCE_HIP)
#define LUCE_WARP warpSize
#else
#define LUCE_WARP 32
#endif

#if defined(LUCE_GPU_EMU)
#include "emu/gpu_emu.h"  // either dialect run by the host CPU (tests; docs/gpu.md)
#elif defined(LUCE_HIP)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#endif
// The emulator's runtime has the HIP names in either dialect.
#if defined(LUCE_HIP) || defined(LUCE_GPU_EMU)
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaStream_t hipStream_t
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaSetDevice hipSetDevice
#define cudaMemGetInfo hipMemGetInfo
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaFreeHost hipHostFree
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaEvent_t hipEvent_t
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaPointerAttributes hipPointerAttribute_t
#define cudaPointerGetAttributes hipPointerGetAttributes
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include "errors.h"

// Every runtime call goes through this: a failure becomes luce::Error(LUCE_ERR_DEVICE) naming the
// call's file:line and the runtime's own reason, which luce_last_error() then reports.
#define LUCE_GPU_CHECK(call)                                                                    \
    do {                                                                                        \
        cudaError_t luce_gpu_err_ = (call);                                                     \
        if (luce_gpu_err_ != cudaSuccess)                                                       \
            ::luce::fail(LUCE_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,            \
                         cudaGetErrorString(luce_gpu_err_));                                    \
    } while (0)

// After a kernel launch: reports bad launch configurations at the launch site (kernel faults
// surface at the next synchronisation, which is checked too).
#define LUCE_GPU_LAUNCHED() LUCE_GPU_CHECK(cudaGetLastError())

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(LUCE_GPU_EMU)

namespace luce::gpu {

// The warp shuffles, by their CUDA names: __shfl<op>_sync over the full warp, HIP's __shfl<op>.
#if defined(LUCE_HIP)
#define LUCE_SHFL(op, v, arg) __shfl##op(v, arg)
#else
#define LUCE_SHFL(op, v, arg) __shfl##op##_sync(0xffffffffu, v, arg)
#endif

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) { return LUCE_SHFL(_xor, v, lane_mask); }
// v of lane + delta (a lane past the warp's end gets its own v).
__device__ __forceinline__ float shfl_down(float v, int delta) { return LUCE_SHFL(_down, v, delta); }
// v of lane src (every lane of the warp takes part).
__device__ __forceinline__ float shfl_idx(float v, int src) { return LUCE_SHFL(, v, src); }

// Whether p holds on any lane of the warp (every lane takes part and gets the answer).
__device__ __forceinline__ bool warp_any(bool p) {
#if defined(LUCE_HIP)
    return __any(p);
#else
    return __any_sync(0xffffffffu, p);
#endif
}

// Sum over the lanes of one warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = LUCE_WARP / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = LUCE_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
    return v;
}

// A launch's dynamic shared memory as an array `type name[]`, aligned to `align` bytes (at most
// 128; the emulator's is 128-aligned).
#if defined(LUCE_GPU_EMU)
#define LUCE_DYNAMIC_SHARED_ALIGNED(type, name, align) type *name = static_cast<type *>(::luce_emu::dynamic_shared())
#else
#define LUCE_DYNAMIC_SHARED_ALIGNED(type, name, align) extern __shared__ __align__(align) type name[]
#endif
#define LUCE_DYNAMIC_SHARED(type, name) LUCE_DYNAMIC_SHARED_ALIGNED(type, name, 16)

// N sums over the whole block at once, each v[j] replaced by its sum (blockDim.x a multiple of
// LUCE_WARP, at most 1024 threads); every thread gets them. Partials are added in warp order, so
// the results are deterministic, and each is the same whatever N: one pair of barriers serves
// all N (the DeltaNet kernels' q and k norms share one).
template <int N>
__device__ __forceinline__ void block_sums(float (&v)[N]) {
    __shared__ __align__(16) float partial[32][N];  // 1024 threads / 32 lanes at most
    const int lane = threadIdx.x % LUCE_WARP, warp = threadIdx.x / LUCE_WARP;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = warp_sum(v[j]);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < N; ++j) partial[warp][j] = v[j];
    __syncthreads();
    const int n_warps = blockDim.x / LUCE_WARP;
    float s[N] = {};
    for (int i = 0; i < n_warps; ++i)  // a warp's N partials side by side: one load where N is 2 or 4
#pragma unroll
        for (int j = 0; j < N; ++j) s[j] += partial[i][j];
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = s[j];
    __syncthreads();  // partial[] may be reused by the caller's next block_sums
}

__device__ __forceinline__ float block_sum(float v) {
    float s[1] = {v};
    block_sums(s);
    return s[0];
}

// ---- Programmatic dependent launch ---------------------------------------------------------------
// Why: a decode step is ~700 kernels, most of them a few microseconds long; between two of them
// the GPU drains one grid and only then schedules the next. With programmatic dependent launch
// (CUDA, sm_90+) each kernel is launched with a programmatic edge to the one before it: its
// blocks are scheduled while that one still runs, and do what does not depend on it (the matmuls
// fetch their first weights) before they wait for it.
//
// The contract every kernel keeps: wait_for_inputs() is called by every thread, before any read
// of memory an earlier kernel wrote and before any write (an earlier kernel may still read what
// would be overwritten), and before any early return (a grid that exits without waiting would
// let its successors run ahead of its own predecessor). Only immutable data (weights, constants)
// is read before it, with one documented exception: data whose last writer is at least two
// launches back (or a copy before them) may be read early, through L2 (load_l2). A grid starts
// only when every block of the one before it has passed its own wait, that is, when the grid two
// back has completed and its writes are in memory (the DeltaNet state, unless
// LUCE_GPU_DELTANET_EARLY=0). tests/test_gpu_build.py checks that every kernel calls it.
//
// It waits for the previous grid to complete and its writes to be visible, then lets the next
// grid launch: one grid ahead at most, so waiting blocks never hold a whole GPU. No-op on HIP,
// below sm_90, and for kernels launched without the attribute.
__device__ __forceinline__ void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LUCE_HIP) && !defined(LUCE_GPU_EMU)
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A load that bypasses L1 (HIP: a plain load; the wait above is a no-op there).
__device__ __forceinline__ float load_l2(const float *p) {
#if defined(LUCE_HIP)
    return *p;
#else
    return __ldcg(p);
#endif
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch.nn.functional.softplus with its default threshold (as the CPU backend).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Whether launch_kernel asks for programmatic dependent launch: set once by the GPU backend from
// the device (compute capability >= 9) and LUCE_GPU_PDL (docs/gpu.md).
inline bool dependent_launch = false;

// kernel<<<grid, block, shared, stream>>>(args...), with a programmatic edge to the stream's
// previous kernel where dependent_launch is on; the launch configuration is checked at once.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                   Args &&...args) {
#if defined(LUCE_HIP)
    hipLaunchKernelGGL(kernel, grid, block, shared, stream, std::forward<Args>(args)...);
#else
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = dependent_launch ? 1 : 0;
    LUCE_GPU_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
#endif
    LUCE_GPU_LAUNCHED();
}

}  // namespace luce::gpu

#endif
