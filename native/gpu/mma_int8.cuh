// mma_int8.cuh — what the two tensor-core int8 matmuls share (matmul_mma.cu stages 256-element
// column groups per block, for prefill widths; matmul_mma_frag.cu stages each warp's own units,
// for verify widths): the launch arguments, the mma of one staged unit, the scales applied to its
// C fragments, and the output store. CUDA sm_80+ only; HIP keeps the dp4a kernel.
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
    // The fragment-order copy (act_quant.cuh, FragDst): matmul_mma_frag reads only these.
    const int8_t *xqf = nullptr;
    const float *xdf = nullptr;
    const int16_t *xsf = nullptr;
};

// D = A (16x32 s8, row) x B (32x8 s8, col), fresh accumulator.
__device__ __forceinline__ void mma_k32(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                        int (&d)[4]) {
#if defined(LUCE_GPU_EMU)
    const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    luce_emu::mma_s8(32, a, b, d);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
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
#if defined(LUCE_GPU_EMU)
    const uint32_t a[2] = {a0, a1}, b[1] = {b0};
    luce_emu::mma_s8(16, a, b, d);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

// The integer dots of one unit for 16 rows x 8 tokens: A = the rows' fragment words (a0, a1:
// elements 4 tq.. of rows g, g + 8; a2, a3: elements 16 + 4 tq..), B = the token's (b0, b1).
// Q6_K and the 1-3-bit types with a scale per half (half_scales) keep each 16-element half's dot
// apart (lo, hi); the other types leave hi at zero.
template <int TYPE>
__device__ __forceinline__ void mma_unit(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                         int (&lo)[4], int (&hi)[4]) {
    if constexpr (int8_units::half_scales(TYPE)) {
        mma_k16(a0, a1, b0, lo);
        mma_k16(a2, a3, b1, hi);
    } else {
        mma_k32(a0, a1, a2, a3, b0, b1, lo);
#pragma unroll
        for (int c = 0; c < 4; ++c) hi[c] = 0;
    }
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


// y[token][row] = v for an output inside the launch (rows past n_out, tokens past T: padding).
__device__ __forceinline__ void store_output(const MmaArgs &p, int64_t row, int tok, float v) {
    if (row < p.rows.n_out() && tok < p.T) {
        const int seg = p.rows.find(row);
        p.rows.y[seg][int64_t(tok) * p.rows.ldy[seg] + row - p.rows.start(seg)] = v;
    }
}

}  // namespace luce::gpu::mma_int8

#endif
