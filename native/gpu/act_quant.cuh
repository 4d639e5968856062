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
// handles the values l, l + LUCE_WARP, ...: the max and the 16-sums are exact whatever the order
// (the sums are integers < 2^11, exact in fp32), so this is the contract for any lane mapping.
// The lane's values are loaded together first: the fused ops read back outputs other threads
// just wrote, from L2, and one round trip costs what the rest of the block's work does.
constexpr int QUANT_MAX_PER_LANE = 8;  // 256 values / 32 lanes

// The fragment-order copy of a block (for matmul_mma_frag.cu's verify widths): the activations
// of 8-token tiles laid out as the m16n8k32 B fragments are read, so a warp loads a unit's
// fragments for 8 tokens as 256 contiguous bytes (one 8-byte load per lane) instead of 8 rows'
// 4-byte pieces. Tile tile, unit u, token g of the tile: 32 bytes at ((tile * n_units + u) * 8 +
// g) * 32, the unit's words in the order 0 4 1 5 2 6 3 7 (lane tq's b0 and b1 side by side); the
// scale of activation block b at (tile * n_blocks + b) * 8 + g, the two 16-sums of unit u at
// ((tile * n_units + u) * 8 + g) * 2. FragDst points at the block's first unit, for its token.
struct FragDst {
    int8_t *q = nullptr;  // null: no copy
    float *d = nullptr;
    int16_t *s = nullptr;
};

// Byte e (0..31) of a unit in the fragment order: word e / 4 = 4 w + tq goes to word 2 tq + w.
__device__ __forceinline__ int frag_byte(int e) { return ((e % 16) / 4) * 8 + (e / 16) * 4 + e % 4; }

#if !defined(LUCE_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LUCE_WARP_REDUX 1  // redux.sync: a whole-warp integer sum or max in one instruction
#endif

// The warp's largest a (every a >= 0 and not NaN): on sm_80+ one redux over the bits, which such
// floats order as their values do; five shuffles elsewhere.
__device__ __forceinline__ float warp_max_nonneg(float a) {
#if defined(LUCE_WARP_REDUX)
    return __uint_as_float(__reduce_max_sync(0xFFFFFFFFu, __float_as_uint(a)));
#else
    return warp_max(a);
#endif
}

// The sum of q (-127..127) over the calling lane's 16 consecutive lanes: on sm_80+ one redux of
// q + 128 packed into its half-warp's 16 bits (16 x 255 < 2^16); four shuffles elsewhere (which
// stay inside each 16 lanes on wave64 too). Exact either way.
__device__ __forceinline__ int sum16_lanes(int q) {
#if defined(LUCE_WARP_REDUX)
    const int half = (threadIdx.x % LUCE_WARP) & 16;  // 0 or 16: where the half's sum sits
    const uint32_t total = __reduce_add_sync(0xFFFFFFFFu, uint32_t(q + 128) << half);
    return int((total >> half) & 0xFFFFu) - 16 * 128;
#else
    float s = float(q);
    for (int o = 8; o > 0; o >>= 1) s += shfl_xor(s, o);
    return int(s);
#endif
}

// The same from values the lanes already hold: v[k] = value lane + k * LUCE_WARP of the block
// (0 past its end), as quantize_block_warp loads them.
__device__ __forceinline__ void quantize_values_warp(const float (&v)[QUANT_MAX_PER_LANE], int block, int8_t *qb,
                                                     float *db, int16_t *sb, const FragDst &frag = {}) {
    const int lane = threadIdx.x % LUCE_WARP;
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) amax = fmaxf(amax, fabsf(v[k]));
    amax = warp_max_nonneg(amax);  // fmaxf drops NaNs: amax is never one
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    if (lane == 0) {
        *db = amax / 127.f;
        if (frag.q) *frag.d = amax / 127.f;
    }
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        const int i = lane + k * LUCE_WARP;
        if (k * LUCE_WARP >= block) break;  // warp-uniform: the shuffles need every lane
        int q = 0;
        if (i < block) {
            const float r = rintf(v[k] * id);
            q = r >= -127.f && r <= 127.f ? int(r) : 0;
            qb[i] = int8_t(q);
            if (frag.q) frag.q[(i / 32) * 256 + frag_byte(i % 32)] = int8_t(q);
        }
        // 16 consecutive values = 16 consecutive lanes (LUCE_WARP is a multiple of 16).
        const int sum = sum16_lanes(q);
        if (i < block && i % 16 == 0) {
            sb[i / 16] = int16_t(sum);
            if (frag.q) frag.s[(i / 32) * 16 + (i / 16) % 2] = int16_t(sum);
        }
    }
}

__device__ __forceinline__ void quantize_block_warp(const float *xb, int block, int8_t *qb, float *db, int16_t *sb,
                                                    const FragDst &frag = {}) {
    const int lane = threadIdx.x % LUCE_WARP;
    float v[QUANT_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        const int i = lane + k * LUCE_WARP;
        v[k] = i < block ? xb[i] : 0.f;
    }
    quantize_values_warp(v, block, qb, db, sb, frag);
}

// Where fused ops write their quantized output; q == nullptr: they do not quantize.
struct FusedQuant {
    int8_t *q = nullptr;
    float *d = nullptr;
    int16_t *s16 = nullptr;
    int block = 0;  // 32 or 256
    // The fragment-order copy (FragDst), or null; row_blocks: blocks per token.
    int8_t *qf = nullptr;
    float *df = nullptr;
    int16_t *sf = nullptr;
    int row_blocks = 0;

    // Block b (flat) of the output x, by the calling warp.
    __device__ __forceinline__ void block_at(const float *x, int64_t b) const {
        quantize_block_warp(x + b * block, block, q + b * block, d + b, s16 + b * (block / 16), frag_at(b));
    }
    // Block b (flat), whose values the warp's lanes hold (quantize_values_warp).
    __device__ __forceinline__ void values_at(const float (&v)[QUANT_MAX_PER_LANE], int64_t b) const {
        quantize_values_warp(v, block, q + b * block, d + b, s16 + b * (block / 16), frag_at(b));
    }
    __device__ __forceinline__ FragDst frag_at(int64_t b) const {
        if (!qf) return {};
        const int64_t t = b / row_blocks, bi = b % row_blocks, tile = t / 8, g = t % 8;
        const int64_t n_units = int64_t(row_blocks) * block / 32, u = bi * block / 32;
        return {qf + ((tile * n_units + u) * 8 + g) * 32, df + (tile * row_blocks + bi) * 8 + g,
                sf + ((tile * n_units + u) * 8 + g) * 2};
    }
};

}  // namespace luce::gpu
