// gpu_emu.h — the dialect and runtime calls that luce's GPU source uses, executed by the host
// CPU: luce's GPU emulator (docs/gpu.md, "The emulated GPU"), in either of the source's dialects.
//
// Why: CI has no GPU, and three device sessions in a row had no device at all; the HIP path (what
// AMD users run) had only ever been compiled, and the CUDA path's own kernels (tensor cores,
// bulk copies, the prefill GEMM) could be checked only on a lent H200. Built from the same .cu
// files as the GPU library, libluce_gpu_emu.so runs every kernel on the CPU, so gpu_check's
// correctness stages (kernels against float64 numpy, GPU against CPU logits, graphs against eager,
// speculative == plain) run on any machine:
// - `make gpu-emu` (g++ -x c++ -DLUCE_HIP -DLUCE_GPU_EMU): the HIP path, at RDNA's wave width;
// - `make gpu-emu-cuda` (g++ -x c++ -DLUCE_GPU_EMU -D__CUDA_ARCH__=900): the CUDA path as nvcc's
//   sm_90 device pass sees it, with the PTX that luce writes by hand (mma.sync, ldmatrix, prmt,
//   mbarrier, cp.async.bulk and its tensor-map form) emulated in luce_emu.
//
// Execution model (gpu_emu.cpp): a launch runs at once, block after block, on the calling thread.
// A block's threads are fibers, switched only at __syncthreads, at warp operations (shuffles,
// votes, __syncwarp, the warp-wide PTX) and while waiting on an mbarrier: every lane of a warp
// meets every other at each warp operation, as the hardware's lanes do. What it checks is the
// kernels' arithmetic, their indexing and their synchronisation: a warp operation that a lane of
// the warp never reaches, or reaches after it has returned, a block barrier that not every thread
// meets, an mbarrier phase that never completes, or a launch that asks for more shared memory than
// the device has (an AMD workgroup's 64 KiB; an sm_90 block's 48 KiB, or 227 KiB where the kernel
// opted in) stops the launch with a DEVICE error naming the kernel's block. It says nothing about
// speed, nor about memory ordering between blocks (blocks run one after another; a bulk copy lands
// when it is issued). Device memory is host memory filled with NaN bytes when allocated, so a
// kernel that reads what nothing wrote shows it in its numbers, and each buffer ends at an
// unreadable page, so an access past its end stops the process naming the thread.
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
#define __grid_constant__
// One copy per block: the emulator runs one block at a time, process-wide.
#define __shared__ static

// The wave width the emulated device reports: 32 (RDNA, which luce's AMD users run) unless the
// library is built with another; HIP's own warpSize is a compile-time constant too. CUDA's warp
// is 32 on every part.
#ifndef LUCE_EMU_WARP
#define LUCE_EMU_WARP 32
#endif
#if !defined(LUCE_HIP) && LUCE_EMU_WARP != 32
#error "the emulated CUDA dialect has warps of 32"
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
// The same, returning every lane's bits by lane: valid until the calling lane's next warp operation.
const uint64_t *warp_gather(uint64_t bits);
// Stops the launch unless `mask` names every lane of the warp (luce's CUDA source passes no other).
void full_warp(unsigned mask);

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

// ---- the PTX that luce's CUDA source writes by hand (gpu_emu.cpp) ----
// Shared memory's 32-bit addresses (__cvta_generic_to_shared), which the PTX below takes.
uint32_t shared_address(const void *p);
uint8_t *shared_pointer(uint32_t address, uint32_t bytes);  // stops the launch outside shared memory
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8i..8i+7 give the row addresses of matrix i;
// r[i] is word lane % 4 of its row lane / 4.
void ldmatrix_x4(uint32_t row_address, uint32_t (&r)[4]);
// mma.sync.aligned.m16n8k{16,32}.row.col.s32.s8.s8.s32 with a zero accumulator: a holds k / 8
// A-fragment registers, b k / 16 B-fragment registers (PTX ISA's fragment layouts).
void mma_s8(int k, const uint32_t *a, const uint32_t *b, int (&d)[4]);
// mbarrier.init / arrive (with expect_tx bytes) / try_wait.parity in a loop, on a barrier in
// shared memory: the barrier's state lives in the emulator, which stops the launch on a barrier
// used before its init or arrived at more often than it counts.
void mbarrier_init(uint32_t bar, int arrivals);
void mbarrier_arrive(uint32_t bar, uint32_t expect_bytes);
void mbarrier_wait(uint32_t bar, uint32_t parity);
// cp.async.bulk global -> shared, and its tensor-map form (2D tile, zeros past the array): the
// bytes land at once and complete their transaction count on `bar`.
void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar);
void tensor_copy(uint32_t dst, const void *map, int x, int y, uint32_t bar);

// PTX prmt.b32 in its default mode: result byte i = byte (nibble i of sel & 7) of the pair (a:
// bytes 0-3, b: bytes 4-7), or that byte's sign repeated where the nibble's bit 3 is set.
inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel, bool sign_mode = true) {
    const uint64_t pair = (uint64_t(b) << 32) | a;
    uint32_t out = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t nibble = (sel >> (4 * i)) & 0xF;
        uint32_t byte = uint32_t(pair >> (8 * (nibble & 7))) & 0xFF;
        if (sign_mode && (nibble & 8)) byte = byte & 0x80 ? 0xFF : 0x00;
        out |= byte << (8 * i);
    }
    return out;
}

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

// References, not macros: CUDA's launch configuration has members named gridDim and blockDim.
static uint3 &threadIdx = ::luce_emu::thread_idx;
static uint3 &blockIdx = ::luce_emu::block_idx;
static dim3 &blockDim = ::luce_emu::block_dim;
static dim3 &gridDim = ::luce_emu::grid_dim;

inline void __syncthreads() { luce_emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
    luce_emu::full_warp(mask);
    luce_emu::sync_warp();
}
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

#if !defined(LUCE_HIP)
// ---- the CUDA dialect's warp intrinsics (full warps only) ----
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
    luce_emu::full_warp(mask);
    return __shfl(v, src, width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    luce_emu::full_warp(mask);
    return __shfl_xor(v, lane_mask, width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    luce_emu::full_warp(mask);
    return __shfl_down(v, delta, width);
}
inline int __any_sync(unsigned mask, int p) {
    luce_emu::full_warp(mask);
    return __any(p);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
    luce_emu::full_warp(mask);
    const uint64_t *all = luce_emu::warp_gather(v);
    unsigned sum = 0;
    for (int l = 0; l < warpSize; ++l) sum += unsigned(all[l]);
    return sum;
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
    luce_emu::full_warp(mask);
    const uint64_t *all = luce_emu::warp_gather(v);
    unsigned m = 0;
    for (int l = 0; l < warpSize; ++l) m = unsigned(all[l]) > m ? unsigned(all[l]) : m;
    return m;
}

// ---- the CUDA dialect's other intrinsics ----
template <class T>
T __ldcg(const T *p) {
    return *p;
}
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += int(int8_t(a >> (8 * i))) * int(int8_t(b >> (8 * i)));
    return c;
}
inline unsigned __vsub4(unsigned a, unsigned b) {  // per byte, wrapping
    unsigned out = 0;
    for (int i = 0; i < 4; ++i) out |= ((((a >> (8 * i)) & 0xFF) - ((b >> (8 * i)) & 0xFF)) & 0xFF) << (8 * i);
    return out;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) { return luce_emu::prmt(x, y, s, false); }
inline size_t __cvta_generic_to_shared(const void *p) { return luce_emu::shared_address(p); }
#endif

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
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
float __half2float(__half h);
__half __float2half_rn(float f);

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
    const void *fn = nullptr;  // the kernel, whose shared-memory opt-in the launch checks
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
                             [kernel, params] { std::apply(kernel, *params); }, reinterpret_cast<const void *>(kernel)});
}

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
hipError_t set_max_dynamic_shared(const void *kernel, int bytes);

}  // namespace luce_emu

#define hipLaunchKernelGGL(kernel, grid, block, shared, stream, ...) \
    ::luce_emu::launch(kernel, dim3(grid), dim3(block), shared, stream, __VA_ARGS__)

#if !defined(LUCE_HIP)
// ---- the CUDA runtime calls without a HIP twin (gpu_compat.h maps the others to the HIP names) ----
enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization = 5 };
struct cudaLaunchAttributeValue {
    int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    hipStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
};
// Launches run one after another, so a programmatic edge changes nothing here.
template <typename... Params, typename... Args>
hipError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config, void (*kernel)(Params...), Args &&...args) {
    luce_emu::launch(kernel, config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream,
                     std::forward<Args>(args)...);
    return hipSuccess;
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class F>
hipError_t cudaFuncSetAttribute(F *kernel, cudaFuncAttribute, int bytes) {
    return luce_emu::set_max_dynamic_shared(reinterpret_cast<const void *>(kernel), bytes);
}

// The driver's tensor-map encoder (cudaTypedefs.h), reached through cudaGetDriverEntryPointByVersion.
using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;
enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
struct alignas(64) CUtensorMap {
    uint64_t opaque[16];
};
enum CUtensorMapDataType { CU_TENSOR_MAP_DATA_TYPE_UINT8, CU_TENSOR_MAP_DATA_TYPE_UINT16, CU_TENSOR_MAP_DATA_TYPE_UINT32 };
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE };
enum CUtensorMapSwizzle { CU_TENSOR_MAP_SWIZZLE_NONE };
enum CUtensorMapL2promotion {
    CU_TENSOR_MAP_L2_PROMOTION_NONE,
    CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B
};
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE };
using PFN_cuTensorMapEncodeTiled_v12000 = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t rank, void *base,
                                                       const cuuint64_t *dims, const cuuint64_t *strides,
                                                       const cuuint32_t *box, const cuuint32_t *element_strides,
                                                       CUtensorMapInterleave, CUtensorMapSwizzle,
                                                       CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess, cudaDriverEntryPointSymbolNotFound };
constexpr unsigned long long cudaEnableDefault = 0;
hipError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version, unsigned long long flags,
                                            cudaDriverEntryPointQueryResult *status);
#endif
