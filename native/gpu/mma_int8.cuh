// mma_int8.cuh — what the two tensor-core int8 matmuls share (matmul_mma.cu stages 256-element
// column groups through shared memory, for prefill widths; matmul_mma_frag.cu loads each thread's
// fragment straight from memory, for verify widths): the mma instructions and int8_units.cuh's
// summation order across warps. CUDA sm_80+ only; HIP keeps the dp4a kernel.
#pragma once

#include "int8_units.cuh"
#include "kernels.h"

#if !defined(LUCE_HIP)  // HIP keeps the dp4a kernel: nothing here compiles for it

namespace luce::gpu::mma_int8 {

using namespace int8_units;

constexpr int MMA_NTILE = 8;  // the mma's N: tokens per n-tile
constexpr int UNIT_WORDS = 12;  // a Unit staged in shared memory, in 32-bit words
static_assert(UNIT_WORDS * 4 == sizeof(Unit), "a staged unit is a Unit");

// A matmul launch's operands: the weight rows and the quantized activations (kernels.h).
struct MmaArgs {
    RowSegments rows;
    int64_t row_bytes;
    int n_in;
    const int8_t *xq;
    const float *xd;
    const int16_t *xs;
    int T;
};

// D = A (16x32 s8, row) x B (32x8 s8, col), fresh accumulator.
__device__ __forceinline__ void mma_k32(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                        int (&d)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    __trap();  // the host never launches this below sm_80 (mma_matmul_supported)
#endif
}

// D = A (16x16 s8, row) x B (16x8 s8, col): Q6_K needs the dot of each 16-element half.
__device__ __forceinline__ void mma_k16(uint32_t a0, uint32_t a1, uint32_t b0, int (&d)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

// acc (C fragments: row g or g + 8 of the tile, tokens 2 tq, 2 tq + 1) += one unit's integer
// dots for the rows' scales a (row g) and b (row g + 8) and the two tokens' dx and 16-sums.
template <int TYPE>
__device__ __forceinline__ void apply_frag(const int (&lo)[4], const int (&hi)[4], const UnitScales &a,
                                           const UnitScales &b, const float (&dx)[2], const int (&sum_lo)[2],
                                           const int (&sum_hi)[2], float (&acc)[4]) {
#pragma unroll
    for (int c = 0; c < 4; ++c)
        acc[c] = apply_dots<TYPE>(c < 2 ? a : b, lo[c], hi[c], dx[c % 2], sum_lo[c % 2], sum_hi[c % 2], acc[c]);
}

// slot_tree across the eight warps of one part (warp slot s holds slot s's partials, same fragment
// positions in every warp): ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), each step adding
// the upper warps' partials into the lower ones through `red` (4 * F * 32 floats per part); slot
// 0's v holds the result. Every thread of the block must call it.
template <int F>
__device__ __forceinline__ void slot_tree_warps(float (&v)[F], float *red, int slot, int lane) {
#pragma unroll
    for (int width = 4; width >= 1; width /= 2) {
        if (slot >= width && slot < 2 * width) {
#pragma unroll
            for (int f = 0; f < F; ++f) red[((slot - width) * F + f) * 32 + lane] = v[f];
        }
        __syncthreads();
        if (slot < width) {
#pragma unroll
            for (int f = 0; f < F; ++f) v[f] += red[(slot * F + f) * 32 + lane];
        }
        __syncthreads();
    }
}

}  // namespace luce::gpu::mma_int8

#endif
