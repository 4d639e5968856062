// bulk_copy.cuh — the copy engine's global -> shared bulk copies (cp.async.bulk, sm_90+) and the
// shared-memory barriers (mbarrier) that say when they have landed and when a buffer is free again.
// CUDA only; a kernel that uses them is launched on sm_90+ devices only (bulk_copies_supported),
// and below sm_90 every function here traps.
#pragma once

#include <cstdint>

#if !defined(LUCE_HIP)

namespace luce::gpu::bulk {

// Whether a device of compute capability major.x has the bulk copies.
inline bool bulk_copies_supported(int major) { return major >= 9; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
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

__device__ __forceinline__ uint32_t shared_addr(const void *p) { return uint32_t(__cvta_generic_to_shared(p)); }

// A barrier whose phase completes after `arrivals` arrivals (and every byte it was told to expect).
// Every thread of the block may use it after the block's next __syncthreads.
__device__ __forceinline__ void barrier_init(uint64_t *bar, int arrivals) {
    LUCE_BULK_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_addr(bar)), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the copy engine (before the block's __syncthreads).
__device__ __forceinline__ void barrier_init_fence() {
    LUCE_BULK_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void arrive(uint64_t *bar) {
    LUCE_BULK_ASM("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(shared_addr(bar)) : "memory");
}

// One arrival that also tells the barrier to wait for `bytes` more bytes of copies.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t *bar, uint32_t bytes) {
    LUCE_BULK_ASM("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)),
                  "r"(bytes)
                  : "memory");
}

// Waits until the barrier's phase of parity `parity` (0 for its first phase, 1 for its second, ...)
// has completed.
__device__ __forceinline__ void wait(uint64_t *bar, uint32_t parity) {
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
    LUCE_BULK_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                      shared_addr(dst)),
                  "l"(src), "r"(bytes), "r"(shared_addr(bar))
                  : "memory");
}

#undef LUCE_BULK_ASM

}  // namespace luce::gpu::bulk

#endif
