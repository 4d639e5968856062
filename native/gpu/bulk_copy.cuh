// bulk_copy.cuh — the copy engine's global -> shared bulk copies (cp.async.bulk, sm_90+) and the
// shared-memory barriers (mbarrier) that say when they have landed and when a buffer is free again.
// CUDA only; a kernel that uses them is launched on sm_90+ devices only (bulk_copies_supported),
// and below sm_90 every function here traps. The emulator (LUCE_GPU_EMU) runs each as luce_emu's.
#pragma once

#include <cstdint>

#include "gpu_compat.h"

#if !defined(LUCE_HIP)
#if !defined(LUCE_GPU_EMU)
#include <cudaTypedefs.h>  // the driver's tensor-map encoder, reached through the runtime (no -lcuda)
#endif

namespace luce::gpu::bulk {

// Whether a device of compute capability major.x has the bulk copies.
inline bool bulk_copies_supported(int major) { return major >= 9; }

#if defined(LUCE_GPU_EMU)
#define LUCE_BULK_ASM(...) static_cast<void>(0)  // each function below calls the emulator's instead
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LUCE_BULK_ASM(...) asm volatile(__VA_ARGS__)
#else
#define LUCE_BULK_ASM(...) __trap()
#endif

// The 16-byte-aligned window [first, first + bytes) around the bytes [a, end): a bulk copy needs a
// 16-byte-aligned source and length, so a run at any alignment is copied with up to 15 more bytes
// on either side (tests/test_gpu_layouts.py holds the bounds).
__host__ __device__ inline uintptr_t aligned_window(uintptr_t a, uintptr_t end, uint32_t &bytes) {
    const uintptr_t first = a & ~uintptr_t(15), last = (end + 15) & ~uintptr_t(15);
    bytes = uint32_t(last - first);
    return first;
}

// The longest window around `span` bytes at any alignment: the size of a buffer that takes them.
__host__ __device__ constexpr int max_window_bytes(int span) { return (span + 30) / 16 * 16; }

// The width of a tensor-map box whose rows take `span` bytes that start `lead` bytes (0..15) past
// the box's first byte (a box starts on a 16-byte boundary of its row: the copy engine faults
// otherwise): whole 16-byte words, an odd number of them, since a box's rows land back to back in
// shared memory and an odd word count puts eight consecutive rows' 16 bytes on different banks.
// At most max_window_bytes(span) + 16.
__host__ __device__ constexpr int box_bytes(int span, int lead) { return 16 * (((lead + span + 15) / 16) | 1); }

__device__ __forceinline__ uint32_t shared_addr(const void *p) { return uint32_t(__cvta_generic_to_shared(p)); }

// A barrier whose phase completes after `arrivals` arrivals (and every byte it was told to expect).
// Every thread of the block may use it after the block's next __syncthreads.
__device__ __forceinline__ void barrier_init(uint64_t *bar, int arrivals) {
#if defined(LUCE_GPU_EMU)
    luce_emu::mbarrier_init(shared_addr(bar), arrivals);
#endif
    LUCE_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_addr(bar)), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the copy engine (before the block's __syncthreads).
__device__ __forceinline__ void barrier_init_fence() {
    LUCE_BULK_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void arrive(uint64_t *bar) {
#if defined(LUCE_GPU_EMU)
    luce_emu::mbarrier_arrive(shared_addr(bar), 0);
#endif
    LUCE_BULK_ASM("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(shared_addr(bar)) : "memory");
}

// One arrival that also tells the barrier to wait for `bytes` more bytes of copies.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t *bar, uint32_t bytes) {
#if defined(LUCE_GPU_EMU)
    luce_emu::mbarrier_arrive(shared_addr(bar), bytes);
#endif
    LUCE_BULK_ASM("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)),
                  "r"(bytes)
                  : "memory");
}

// Waits until the barrier's phase of parity `parity` (0 for its first phase, 1 for its second, ...)
// has completed.
__device__ __forceinline__ void wait(uint64_t *bar, uint32_t parity) {
#if defined(LUCE_GPU_EMU)
    luce_emu::mbarrier_wait(shared_addr(bar), parity);
#endif
    LUCE_BULK_ASM(
        "{\n"
        ".reg .pred done;\n"
        "retry:\n"
        "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra retry;\n"
        "}\n" ::"r"(shared_addr(bar)),
        "r"(parity)
        : "memory");
}

// dst[0, bytes) = src[0, bytes) by the copy engine, counted on bar when it lands. dst and src
// 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void copy_to_shared(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#if defined(LUCE_GPU_EMU)
    luce_emu::bulk_copy(shared_addr(dst), src, bytes, shared_addr(bar));
#endif
    LUCE_BULK_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                      shared_addr(dst)),
                  "l"(src), "r"(bytes), "r"(shared_addr(bar))
                  : "memory");
}

// A tensor map: the copy engine's description of a 2D array in global memory (cuda.h's
// CUtensorMap), passed to a kernel as a __grid_constant__ parameter.
struct alignas(64) TensorMap {
    uint64_t opaque[16];
};
static_assert(sizeof(TensorMap) == sizeof(CUtensorMap), "CUtensorMap's size");

// dst = the box of the 2D tensor map at element (x, y) (its first dimension, then its rows), counted
// on bar; elements past the array are zeros. dst 128-byte aligned.
__device__ __forceinline__ void copy_box_to_shared(void *dst, const TensorMap *map, int x, int y, uint64_t *bar) {
#if defined(LUCE_GPU_EMU)
    luce_emu::tensor_copy(shared_addr(dst), map, x, y, shared_addr(bar));
#endif
    LUCE_BULK_ASM("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                  ::"r"(shared_addr(dst)), "l"(map), "r"(x), "r"(y), "r"(shared_addr(bar))
                  : "memory");
}

// The map of `rows` rows of `row_words` 32-bit words at `base` (a row every row_words * 4 bytes,
// which must be a multiple of 16; base 16-byte aligned), copied in boxes of box_words x box_rows.
// False where the driver refuses it.
inline bool encode_rows_map(TensorMap &map, const void *base, uint64_t row_words, uint64_t rows, uint32_t box_words,
                            uint32_t box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
                cudaSuccess || found != cudaDriverEntryPointSuccess)
            fn = nullptr, (void)cudaGetLastError();
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    }();
    if (!encode) return false;
    const cuuint64_t dims[2] = {row_words, rows}, strides[1] = {row_words * 4};
    const cuuint32_t box[2] = {box_words, box_rows}, element_strides[2] = {1, 1};
    return encode(reinterpret_cast<CUtensorMap *>(&map), CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, const_cast<void *>(base), dims,
                  strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#undef LUCE_BULK_ASM

}  // namespace luce::gpu::bulk

#endif
