// int8_units.cuh — one 32-element unit of quantized weights as int8, and the fp32 formula that
// applies its scales to an exact integer dot product: shared by the dp4a kernel (matmul_int8.cu)
// and the tensor-core kernel (matmul_mma.cu), so both apply the CPU fast path's contract with the
// same fp32 operations and differ only in how the integer dots are formed.
#pragma once

#include "quant_blocks.cuh"

namespace luce::gpu::int8_units {

// Four 4-bit codes (one per byte, 0..15) -> the four signed IQ4_NL codebook values, packed.
// The codebook lives in registers: `__constant__` memory serialises a warp whose lanes read
// different entries, which is every lookup here.
struct Codebook {
    uint32_t w[4];  // entries 0..15, four per word, little-endian
};

__device__ __forceinline__ Codebook iq4nl_codebook() {
    // kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113 (spec/qwen35.md §4)
    return Codebook{{0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u}};
}

__device__ __forceinline__ uint32_t lookup4(const Codebook &cb, uint32_t codes) {
#if defined(LUCE_HIP)
    uint32_t out = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t c = (codes >> (8 * i)) & 0xF;
        out |= ((cb.w[c >> 2] >> (8 * (c & 3))) & 0xFF) << (8 * i);
    }
    return out;
#else
    // __byte_perm picks bytes by 3-bit selectors: entries 0-7 from (w0, w1), 8-15 from (w2, w3),
    // then bit 3 of each code chooses between the two.
    const uint32_t sel = (codes & 0x7u) | ((codes >> 4) & 0x70u) | ((codes >> 8) & 0x700u) | ((codes >> 12) & 0x7000u);
    const uint32_t lo = __byte_perm(cb.w[0], cb.w[1], sel), hi = __byte_perm(cb.w[2], cb.w[3], sel);
    const uint32_t pick_hi = ((codes & 0x08080808u) >> 3) * 0xFFu;
    return (hi & pick_hi) | (lo & ~pick_hi);
#endif
}

__device__ __forceinline__ uint32_t u16_at(const uint8_t *p) {
    return *reinterpret_cast<const uint16_t *>(p);
}

// 32 bytes at a 2-byte-aligned address (Q8_0 and Q6_K blocks are 34 and 210 bytes: their fields
// are only 2-byte aligned) as eight words.
__device__ __forceinline__ void load32_a2(const uint8_t *p, uint32_t (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = u16_at(p + 4 * i) | (u16_at(p + 4 * i + 2) << 16);
}

// 32 bytes at a 16-byte-aligned address as eight words, in two 16-byte loads.
__device__ __forceinline__ void load_words16(const uint8_t *p, uint32_t (&w)[8]) {
    const uint4 a = reinterpret_cast<const uint4 *>(p)[0], b = reinterpret_cast<const uint4 *>(p)[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

// ---- one unit of weights: eight packed int8 words and its scales --------------------------------

struct UnitScales {
    float d, dmin;   // block scale(s) (dmin: Q4_K / Q5_K only)
    int sc0, sc1;    // integer sub-scales: Q4_K/Q5_K scale and min; Q6_K scale of each 16-half; IQ4_XS ls - 32
};

struct Unit {
    uint32_t q[8];  // 32 weights (int8), element order
    UnitScales s;
};

template <int TYPE>
__device__ __forceinline__ void load_qunit(const uint8_t *row, int u, Unit &un) {
    if constexpr (TYPE == GGML_Q8_0) {
        const uint8_t *b = row + 34 * u;  // f16 d; i8 qs[32]
        un.s.d = f16_at(b);
        load32_a2(b + 2, un.q);
    } else if constexpr (TYPE == GGML_Q4_K || TYPE == GGML_Q5_K) {
        // f16 d; f16 dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8 qs[128]. Sub-block j = nibble
        // hi = j % 2 of qs[32c + l], c = j / 2; Q5_K's 5th bit is bit j of qh[l].
        constexpr int BB = TYPE == GGML_Q4_K ? 144 : 176;
        const uint8_t *b = row + BB * (u / 8);
        const int j = u % 8, c = j / 2, hi = j % 2;
        k_scale_min(b + 4, j, un.s.sc0, un.s.sc1);
        un.s.d = f16_at(b);
        un.s.dmin = f16_at(b + 2);
        uint32_t qs[8], qh[8];  // 16-byte aligned (144- and 176-byte blocks): two 16-byte loads each
        load_words16(b + (TYPE == GGML_Q4_K ? 16 : 48) + 32 * c, qs);
        if constexpr (TYPE == GGML_Q5_K) load_words16(b + 16, qh);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            uint32_t v = (hi ? qs[i] >> 4 : qs[i]) & 0x0F0F0F0Fu;
            if constexpr (TYPE == GGML_Q5_K) v |= ((qh[i] >> j) & 0x01010101u) << 4;
            un.q[i] = v;
        }
    } else if constexpr (TYPE == GGML_Q6_K) {
        // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Sub-block j (half h = j / 4, quarter
        // k = j % 4): 6-bit q = nibble k / 2 of ql[64h + 32(k % 2) + l] | bits 2k..2k+1 of
        // qh[32h + l] << 4, value d * scales[8h + 2k + l / 16] * (q - 32). The unit keeps q
        // (0..63); the -32 is applied through the activation sums.
        const uint8_t *b = row + 210 * (u / 8);
        const int j = u % 8, h = j / 4, k = j % 4;
        uint32_t ql[8], qh[8];
        load32_a2(b + 64 * h + 32 * (k % 2), ql);
        load32_a2(b + 128 + 32 * h, qh);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            un.q[i] = ((ql[i] >> (4 * (k / 2))) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * k)) & 0x03030303u) << 4);
        const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h + 2 * k);
        un.s.sc0 = sc[0];
        un.s.sc1 = sc[1];
        un.s.d = f16_at(b + 208);
    } else if constexpr (TYPE == GGML_IQ4_XS) {
        // f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. Sub-block ib: element l < 16 = low
        // nibble of qs[16ib + l], element l + 16 = its high nibble; scale d * (ls - 32).
        const uint8_t *b = row + 136 * (u / 8);  // 8-byte aligned: 8-byte loads
        const int ib = u % 8;
        const uint2 head = *reinterpret_cast<const uint2 *>(b);  // d | scales_h, scales_l[4]
        const uint32_t scales_h = head.x >> 16;
        un.s.sc0 = (((head.y >> (4 * ib)) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)) - 32;
        un.s.d = f16_bits(head.x & 0xFFFF);
        const uint2 *q2 = reinterpret_cast<const uint2 *>(b + 8 + 16 * ib);
        const uint2 lo = q2[0], hi = q2[1];
        const uint32_t qs[4] = {lo.x, lo.y, hi.x, hi.y};
        const Codebook cb = iq4nl_codebook();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            un.q[i] = lookup4(cb, qs[i] & 0x0F0F0F0Fu);
            un.q[i + 4] = lookup4(cb, (qs[i] >> 4) & 0x0F0F0F0Fu);
        }
    }
}

// acc += (this unit . token's quantized activations) from the unit's exact integer dots over its
// two 16-element halves (lo, hi), in one fixed order of fp32 operations. Every int -> float
// conversion below is exact (|value| < 2^24 for every type's ranges).
template <int TYPE>
__device__ __forceinline__ float apply_dots(const UnitScales &us, int lo, int hi, float dx, int sum_lo, int sum_hi,
                                            float acc) {
    if constexpr (TYPE == GGML_Q6_K) {  // q kept 0..63: the -32 comes in through the sums
        const float s = us.d * dx;
        acc = fmaf(s, float(us.sc0 * (lo - 32 * sum_lo)), acc);
        return fmaf(s, float(us.sc1 * (hi - 32 * sum_hi)), acc);
    } else if constexpr (TYPE == GGML_Q8_0) {
        return fmaf(us.d * dx, float(lo + hi), acc);
    } else if constexpr (TYPE == GGML_IQ4_XS) {
        return fmaf(us.d * dx, float(us.sc0 * (lo + hi)), acc);
    } else {  // Q4_K / Q5_K: d sc (q . x) - dmin m (sum x)
        acc = fmaf(us.d * dx, float(us.sc0 * (lo + hi)), acc);
        return fmaf(-(us.dmin * dx), float(us.sc1 * (sum_lo + sum_hi)), acc);
    }
}

}  // namespace luce::gpu::int8_units
