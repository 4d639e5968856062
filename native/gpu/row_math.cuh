// row_math.cuh — the per-row RMS scale and the NeoX RoPE rotation, shared by the kernels that
// run them alone (norms.cu, attention.cu) and the attention prologue that fuses them
// (qk_norm_rope_store): one definition each, so the fused and unfused paths give the same bits.
#pragma once

#include "gpu_compat.h"

namespace luce::gpu {

// 1 / sqrt(mean(x^2) + eps) over one row of dim, summed by the whole block: thread i takes
// elements i, i + blockDim.x, ..., and the block's warps meet in block_sum's fixed order.
__device__ __forceinline__ float row_rms_scale(const float *xr, int dim, float eps) {
    float ss = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    return 1.0f / sqrtf(block_sum(ss) / float(dim) + eps);
}

// Rotates the pair (a, b) = (x[i], x[i + n_rot/2]) of one head for position p: angle p * inv_freq,
// inv_freq = theta^(-2i/n_rot), both in fp32 (spec §1.3), as the CPU backend.
__device__ __forceinline__ void rope_rotate(float &a, float &b, int i, int n_rot, float theta, int p) {
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(n_rot));
    float s, c;
    sincosf(float(p) * inv_freq, &s, &c);
    const float a0 = a, b0 = b;
    // The contractions spelled out: left to nvcc, a * c - b * s may become either product's FMA,
    // and the choice differed between the rope kernel and the fused attention prologue (one ulp
    // apart on an H200, 2026-12-05), whose bits must agree.
    a = fmaf(a0, c, -(b0 * s));
    b = fmaf(b0, c, a0 * s);
}

}  // namespace luce::gpu
