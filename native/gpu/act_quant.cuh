// act_quant.cuh — the int8 quantization of matmul activations, one block at a time by one warp:
// the CPU fast path's contract to the bit (native/src/quants_kernels.h, quantize_block_scalar):
// fp32 amax over the block, d = amax / 127, q = rint(x * (127 / amax)) (non-finite -> 0), plus
// the sum of q over each 16 values. Used by the standalone quantization before a matmul and by
// the ops that quantize their own output for the next matmul (norms, SwiGLU, the attention
// gate), so both give the same bytes.
//
// Layout (flat over tokens): block b of the activations at x[b * block ...] has q at
// q[b * block ...], d[b], and s16[b * block / 16 ...]; a [T][n_in] input quantized row by row is
// the same bytes as the flat [T * n_in] one.
#pragma once

#include "gpu_compat.h"

namespace luce::gpu {

// Every lane of the calling warp must call this with the same block (<= 256 values). Lane l
// handles the values l, l + warpSize, ...: the max and the 16-sums are exact whatever the order
// (the sums are integers < 2^11, exact in fp32), so this is the contract for any lane mapping.
// The lane's values are loaded together first: the fused ops read back outputs other threads
// just wrote, from L2, and one round trip costs what the rest of the block's work does.
constexpr int QUANT_MAX_PER_LANE = 8;  // 256 values / 32 lanes

// The same from values the lanes already hold: v[k] = value lane + k * warpSize of the block
// (0 past its end), as quantize_block_warp loads them.
__device__ __forceinline__ void quantize_values_warp(const float (&v)[QUANT_MAX_PER_LANE], int block, int8_t *qb,
                                                     float *db, int16_t *sb) {
    const int lane = threadIdx.x % warpSize;
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) amax = fmaxf(amax, fabsf(v[k]));
    amax = warp_max(amax);
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    if (lane == 0) *db = amax / 127.f;
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        const int i = lane + k * warpSize;
        if (k * warpSize >= block) break;  // warp-uniform: the shuffles need every lane
        float qf = 0.f;
        if (i < block) {
            const float r = rintf(v[k] * id);
            const int8_t q = r >= -127.f && r <= 127.f ? int8_t(r) : int8_t(0);
            qb[i] = q;
            qf = float(q);
        }
        // 16 consecutive values = 16 consecutive lanes (warpSize is a multiple of 16).
        qf += shfl_xor(qf, 8);
        qf += shfl_xor(qf, 4);
        qf += shfl_xor(qf, 2);
        qf += shfl_xor(qf, 1);
        if (i < block && i % 16 == 0) sb[i / 16] = int16_t(qf);
    }
}

__device__ __forceinline__ void quantize_block_warp(const float *xb, int block, int8_t *qb, float *db, int16_t *sb) {
    const int lane = threadIdx.x % warpSize;
    float v[QUANT_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        const int i = lane + k * warpSize;
        v[k] = i < block ? xb[i] : 0.f;
    }
    quantize_values_warp(v, block, qb, db, sb);
}

// Where fused ops write their quantized output; q == nullptr: they do not quantize.
struct FusedQuant {
    int8_t *q = nullptr;
    float *d = nullptr;
    int16_t *s16 = nullptr;
    int block = 0;  // 32 or 256

    // Block b (flat) of the output x, by the calling warp.
    __device__ __forceinline__ void block_at(const float *x, int64_t b) const {
        quantize_block_warp(x + b * block, block, q + b * block, d + b, s16 + b * (block / 16));
    }
    // Block b (flat), whose values the warp's lanes hold (quantize_values_warp).
    __device__ __forceinline__ void values_at(const float (&v)[QUANT_MAX_PER_LANE], int64_t b) const {
        quantize_values_warp(v, block, q + b * block, d + b, s16 + b * (block / 16));
    }
};

}  // namespace luce::gpu
