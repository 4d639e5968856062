// hip_emu.h — the HIP dialect and runtime calls that luce's GPU source uses, executed by the host
// CPU: luce's GPU emulator (docs/gpu.md, "The emulated GPU").
//
// Why: CI has no GPU, and three device sessions in a row had no device at all; the HIP path (what
// AMD users run) had only ever been compiled. Built from the same .cu files as the GPU library
// (`make gpu-emu`: g++ -x c++ -DLUCE_HIP -DLUCE_GPU_EMU), libluce_gpu_emu.so runs every kernel
// of the HIP path on the CPU, so gpu_check's correctness stages (kernels against float64 numpy,
// GPU against CPU logits, graphs against eager, speculative == plain) run on any machine.
//
// Execution model (hip_emu.cpp): a launch runs at once, block after block, on the calling thread.
// A block's threads are fibers, switched only at __syncthreads and at warp operations (shuffles,
// votes, __syncwarp): every lane of a warp meets every other at each warp operation, as the
// hardware's lanes do. What it checks is the kernels' arithmetic, their indexing and their
// synchronisation: a warp operation that a lane of the warp never reaches, or reaches after it has
// returned, a block barrier that not every thread meets, or a launch that asks for more than
// 64 KiB of shared memory (an AMD workgroup's LDS) stops the launch with a DEVICE error naming
// the kernel's block. It says nothing about speed, nor about memory ordering between blocks
// (blocks run one after another). Device memory is host memory filled with NaN bytes when
// allocated, so a kernel that reads what nothing wrote shows it in its numbers, and each buffer
// ends at an unreadable page, so an access past its end stops the process naming the thread.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- the dialect's keywords ------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One copy per block: the emulator runs one block at a time, process-wide.
#define __shared__ static

// The wave width the emulated device reports: 32 (RDNA, which luce's AMD users run) unless the
// library is built with another; HIP's own warpSize is a compile-time constant too.
#ifndef LUCE_EMU_WARP
#define LUCE_EMU_WARP 32
#endif
static constexpr int warpSize = LUCE_EMU_WARP;

// ---- vector types --------------------------------------------------------------------------------
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace luce_emu {

// The running fiber's coordinates, set before the emulator switches to a fiber. Plain globals
// (thread-local ones cost a call per read from a shared library): launches are serialised.
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;
extern int lane;  // the running fiber's lane in its warp

void *dynamic_shared();          // this launch's dynamic shared memory (16-aligned)
void sync_block();               // __syncthreads
void sync_warp();                // __syncwarp
bool warp_any(bool p);           // __any over the warp
[[noreturn]] void trap(const char *why);  // stops the launch with a DEVICE error

// Posts `bits` for the calling lane, waits until every lane of its warp has posted, and returns
// the bits lane `src` posted (src is a lane of the same warp).
uint64_t warp_exchange(uint64_t bits, int src);

// AMD's byte permute, v_perm_b32 (int8_units.cuh perm_bytes): result byte i is selected by byte i
// of sel from the pair (a: bytes 4-7, b: bytes 0-3); 12 gives 0x00, 13 and up 0xFF. Selectors
// 8-11 (sign replication) are not used by luce and stop the launch.
inline uint32_t perm_b32(uint32_t a, uint32_t b, uint32_t sel) {
    const uint64_t pair = (uint64_t(a) << 32) | b;
    uint32_t out = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t s = (sel >> (8 * i)) & 0xFF;
        if (s >= 8 && s < 12) trap("v_perm_b32 sign selector");
        const uint32_t byte = s < 8 ? uint32_t(pair >> (8 * s)) & 0xFF : s == 12 ? 0x00 : 0xFF;
        out |= byte << (8 * i);
    }
    return out;
}
inline int lane_id() { return lane; }

template <class T>
T shuffle_from(T v, int src) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = warp_exchange(bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

}  // namespace luce_emu

#define threadIdx (::luce_emu::thread_idx)
#define blockIdx (::luce_emu::block_idx)
#define blockDim (::luce_emu::block_dim)
#define gridDim (::luce_emu::grid_dim)

inline void __syncthreads() { luce_emu::sync_block(); }
inline void __syncwarp() { luce_emu::sync_warp(); }
inline void __threadfence() {}
[[noreturn]] inline void __trap() { luce_emu::trap("__trap"); }
inline int __any(int p) { return luce_emu::warp_any(p != 0); }

// HIP's shuffles: `width` splits the warp into segments of that many lanes.
template <class T>
T __shfl(T v, int src, int width = warpSize) {
    const int lane = luce_emu::lane_id();
    return luce_emu::shuffle_from(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T>
T __shfl_xor(T v, int mask, int width = warpSize) {
    const int lane = luce_emu::lane_id(), src = lane ^ mask;
    return luce_emu::shuffle_from(v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
template <class T>
T __shfl_down(T v, unsigned delta, int width = warpSize) {
    const int lane = luce_emu::lane_id(), src = lane + int(delta);
    return luce_emu::shuffle_from(v, src / width == lane / width ? src : lane);
}

// CUDA/HIP's min and max of two numbers, found unqualified in device code.
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    return b < a ? b : a;
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// binary16, as the device's loads and conversions see it.
struct __half {
    uint16_t bits;
};
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
float __half2float(__half h);

// ---- the runtime -----------------------------------------------------------------------------------
enum hipError_t {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorInvalidConfiguration = 9,
    hipErrorNoDevice = 100,
    hipErrorIllegalState = 401,
    hipErrorStreamCaptureUnsupported = 900,
};
enum hipMemcpyKind {
    hipMemcpyHostToHost,
    hipMemcpyHostToDevice,
    hipMemcpyDeviceToHost,
    hipMemcpyDeviceToDevice,
    hipMemcpyDefault,
};
enum hipStreamCaptureMode { hipStreamCaptureModeGlobal, hipStreamCaptureModeThreadLocal, hipStreamCaptureModeRelaxed };
enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize = 8 };
constexpr unsigned hipStreamNonBlocking = 1;
constexpr unsigned hipHostMallocDefault = 0;

struct hipDeviceProp_t {
    char name[256];
    size_t totalGlobalMem;
    int warpSize;
    int multiProcessorCount;
    int l2CacheSize;
    int major, minor;
    size_t sharedMemPerBlock;
    int maxThreadsPerBlock;
};

namespace luce_emu {
struct Stream;
struct Event;
struct Graph;
}  // namespace luce_emu
using hipStream_t = luce_emu::Stream *;
using hipEvent_t = luce_emu::Event *;
using hipGraph_t = luce_emu::Graph *;
using hipGraphExec_t = luce_emu::Graph *;

const char *hipGetErrorString(hipError_t e);
hipError_t hipGetLastError();
hipError_t hipGetDeviceCount(int *n);
hipError_t hipSetDevice(int device);
hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int device);
hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total_bytes);
hipError_t hipRuntimeGetVersion(int *version);
hipError_t hipMalloc(void **p, size_t bytes);
hipError_t hipFree(void *p);
hipError_t hipHostMalloc(void **p, size_t bytes, unsigned flags);
hipError_t hipHostFree(void *p);
hipError_t hipMemsetAsync(void *p, int value, size_t bytes, hipStream_t stream);
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t bytes, hipMemcpyKind kind, hipStream_t stream);
hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned flags);
hipError_t hipStreamDestroy(hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipEventCreate(hipEvent_t *event);
hipError_t hipEventDestroy(hipEvent_t event);
hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream);
hipError_t hipEventSynchronize(hipEvent_t event);
hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop);
hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode mode);
hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t *graph);
hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t *exec, hipGraph_t graph, unsigned long long flags);
hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream);
hipError_t hipGraphDestroy(hipGraph_t graph);
hipError_t hipGraphExecDestroy(hipGraphExec_t exec);

namespace luce_emu {

// One grid: `body` is run by every thread of every block.
struct Grid {
    dim3 grid, block;
    size_t shared;
    const char *kernel;  // for error messages
    std::function<void()> body;
};
void launch_grid(hipStream_t stream, Grid grid);
// The kernel's name where the library's symbols have it, else its parameter types, taken from
// `signature` (the launching template's __PRETTY_FUNCTION__): most kernels live in anonymous
// namespaces, whose names no dynamic symbol table keeps.
const char *kernel_name(const void *kernel, const char *signature);

// hipLaunchKernelGGL: the arguments are converted to the kernel's parameter types and copied
// once, at the launch (or at its capture into a graph), as a GPU launch copies them.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, hipStream_t stream, Args &&...args) {
    auto params = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
    launch_grid(stream, Grid{grid, block, shared, kernel_name(reinterpret_cast<const void *>(kernel), __PRETTY_FUNCTION__),
                             [kernel, params] { std::apply(kernel, *params); }});
}

}  // namespace luce_emu

#define hipLaunchKernelGGL(kernel, grid, block, shared, stream, ...) \
    ::luce_emu::launch(kernel, dim3(grid), dim3(block), shared, stream, __VA_ARGS__)
