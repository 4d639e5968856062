// quant_blocks.cuh — device dequantization of ggml weight blocks, 32 elements at a time.
//
// Every supported type splits a row into "units" of 32 consecutive elements: a 32-element block
// (Q8_0, Q4_0, ...), one of the eight 32-element sub-blocks of a 256-element K-quant / IQ block,
// or 32 floats. A
// unit is what one lane of a matmul warp dequantizes into registers and applies to every token.
// Formulas and byte layouts: spec/qwen35.md §4 and the scalar reference in native/src/quants.cpp.
// Float rows may end in a partial unit (n_valid < 32); quantized rows never do.
#pragma once

#include "gpu_compat.h"
#include "quants.h"
#include "quants_lowbit.h"

namespace luce::gpu {

// The GPU's IQ4_XS and IQ4_NL codes (repack_weights, matmul.cu) are GGUF's with bits 2 and 3 swapped (its
// own inverse): GGUF code c is stored as iq4_gpu_code(c). The order pairs every code j < 8 with
// the code j + 8 of the same sign, which lets the CUDA codebook lookup take two byte permutes per
// four codes instead of three (int8_units.cuh, lookup4). The values are GGUF's.
__host__ __device__ constexpr int iq4_gpu_code(int c) { return (c & 3) | ((c & 4) << 1) | ((c & 8) >> 1); }

// kvalues_iq4nl (spec/qwen35.md §4: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113),
// indexed by the GPU's code: in constant memory for the device, in the function for the host
// (tests/native/gpu_layouts.cu runs the layouts on the host against gguf's dequantization).
#define LUCE_IQ4NL_GPU_ORDER -127, -104, -83, -65, 1, 13, 25, 38, -49, -35, -22, -10, 53, 69, 89, 113
static __constant__ int8_t kIq4nlGpu[16] = {LUCE_IQ4NL_GPU_ORDER};

__host__ __device__ inline int iq4_gpu_value(int code) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return kIq4nlGpu[code];
#else
    constexpr int8_t values[16] = {LUCE_IQ4NL_GPU_ORDER};
    return values[code];
#endif
}

// One IQ4_XS sub-block's (or IQ4_NL block's) 16 code bytes, GGUF's (byte m: elements m and m + 16) -> the GPU's (byte
// m: elements 2m in the low nibble and 2m + 1 in the high one, each code renumbered).
__host__ __device__ inline void iq4_xs_codes_to_gpu(const uint8_t *in, uint8_t *out) {
    for (int m = 0; m < 16; ++m) {
        const int e0 = 2 * m, e1 = 2 * m + 1;  // element e: nibble e / 16 of byte e % 16
        const int c0 = (in[e0 % 16] >> (4 * (e0 / 16))) & 0xF, c1 = (in[e1 % 16] >> (4 * (e1 / 16))) & 0xF;
        out[m] = uint8_t(iq4_gpu_code(c0) | (iq4_gpu_code(c1) << 4));
    }
}

// Block geometry of the supported types (the device-side twin of quants.cpp's table).
__host__ __device__ constexpr bool is_block32_type(int type) {
    return type == GGML_Q8_0 || type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q5_0 || type == GGML_Q5_1 ||
           type == GGML_IQ4_NL;
}

__host__ __device__ constexpr int block_elems(int type) {
    return is_block32_type(type) ? 32 : (type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K ||
                                         type == GGML_IQ4_XS || is_lowbit_type(type)) ? 256 : 1;
}

__host__ __device__ constexpr int block_bytes(int type) {
    switch (type) {
        case GGML_F32: return 4;
        case GGML_F16: case GGML_BF16: return 2;
        case GGML_Q8_0: return 34;
        case GGML_Q4_K: return 144;
        case GGML_Q5_K: return 176;
        case GGML_Q6_K: return 210;
        case GGML_IQ4_XS: return 136;
        case GGML_Q4_0: case GGML_IQ4_NL: return 18;
        case GGML_Q4_1: return 20;
        case GGML_Q5_0: return 22;
        case GGML_Q5_1: return 24;
        default: return lowbit_block_bytes(type);
    }
}

// Activation block of the int8 path for weights of `type` (quants.cpp's act_block): the weight
// block for the 32-element types, 256 for the K and IQ types, 0 for float weights (fp32
// activations and the exact kernel).
__host__ __device__ constexpr int act_block_of(int type) {
    return is_block32_type(type) ? 32 : (type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K ||
                                         type == GGML_IQ4_XS || is_lowbit_type(type)) ? 256 : 0;
}

// IEEE binary16 -> binary32: the hardware conversion, exact for every input (one instruction;
// a decode-step matmul converts a scale per 32 weights).
__host__ __device__ __forceinline__ float f16_bits(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h))); }

__host__ __device__ __forceinline__ float f16_at(const uint8_t *p) {
    return f16_bits(uint32_t(p[0]) | (uint32_t(p[1]) << 8));
}

__device__ __forceinline__ float bf16_at(const uint8_t *p) {
    return __uint_as_float((uint32_t(p[0]) | (uint32_t(p[1]) << 8)) << 16);
}

// 6-bit scale and min of sub-block j of Q4_K / Q5_K (12 packed bytes), as quants.cpp.
__device__ __forceinline__ void k_scale_min(const uint8_t *q, int j, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// N little-endian 32-bit words at p, which the caller guarantees to be 4-byte aligned (block
// sizes that are multiples of 8 or 16 bytes keep every field aligned from a cudaMalloc'd base):
// 4-byte loads instead of 1-byte ones, and byte b of the run is (w[b / 4] >> 8 (b % 4)) & 0xFF.
template <int N>
__host__ __device__ __forceinline__ void load_words(const uint8_t *p, uint32_t (&w)[N]) {
    const uint32_t *q = reinterpret_cast<const uint32_t *>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = q[i];
}

template <int N>
__host__ __device__ __forceinline__ int byte_of(const uint32_t (&w)[N], int b) {
    return int((w[b / 4] >> (8 * (b % 4))) & 0xFF);
}

// The GPU's Q6_K layout (repack_weights, matmul.cu). GGUF's blocks are 210 bytes, so every odd
// block of a tensor starts 2 bytes off a word, and a 32-element unit's bits lie in two 32-byte
// runs it shares with other units (18 word loads and ~60 instructions per unit to pick them
// out). On the device each block keeps its 210 bytes and its scales and d, rearranged so that
// every unit's 24 bytes are contiguous and word-aligned: a block at a 4-aligned address (an even
// block of its 4-aligned tensor) holds its eight units, then scales[16], then d; one at 2 mod 4
// holds scales[16], d, then its units. A unit: 4 words of low nibbles (word i, byte b: element
// 8i + b in the low nibble, 8i + 4 + b in the high one), then 2 words of 2-bit high parts (word
// w, byte b, bits 2s and 2s + 1: element 16w + 4s + b).
constexpr int Q6K_UNIT_BYTES = 24;
__host__ __device__ constexpr int q6k_units_at(bool odd) { return odd ? 18 : 0; }
__host__ __device__ constexpr int q6k_scales_at(bool odd) { return odd ? 0 : 8 * Q6K_UNIT_BYTES; }
__host__ __device__ __forceinline__ bool q6k_odd(const uint8_t *block) {
    return (reinterpret_cast<uintptr_t>(block) & 2) != 0;
}

// One GGUF Q6_K block -> the GPU's (`odd`: whether the block sits at 2 mod 4).
__host__ __device__ inline void q6_k_block_to_gpu(const uint8_t *in, uint8_t *out, bool odd) {
    for (int i = 0; i < 210; ++i) out[i] = 0;
    for (int j = 0; j < 8; ++j) {
        // Unit j = elements 128h + 32k + l: nibble k / 2 of ql[64h + 32(k % 2) + l], bits 2k..2k+1
        // of qh[32h + l] (spec/qwen35.md §4).
        const int h = j / 4, k = j % 4;
        uint8_t *unit = out + q6k_units_at(odd) + Q6K_UNIT_BYTES * j;
        for (int l = 0; l < 32; ++l) {
            const int lo = (in[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
            const int hi = (in[128 + 32 * h + l] >> (2 * k)) & 3;
            const int m = l / 4, byte = l % 4;  // element l is byte `byte` of q6k_word m
            unit[4 * (m / 2) + byte] |= uint8_t(lo << (4 * (m % 2)));
            unit[16 + 4 * (m / 4) + byte] |= uint8_t(hi << (2 * (m % 4)));
        }
    }
    for (int i = 0; i < 18; ++i) out[q6k_scales_at(odd) + i] = in[192 + i];  // scales[16], d
}

// q (0..63) of elements 4m..4m+3 of a unit, one per byte, from its low-nibble words lw and high
// words hw (m a compile-time constant once unrolled: the shifts are immediates).
__host__ __device__ __forceinline__ uint32_t q6k_word(const uint32_t (&lw)[4], const uint32_t (&hw)[2], int m) {
    const uint32_t lo = (m % 2 ? lw[m / 2] >> 4 : lw[m / 2]) & 0x0F0F0F0Fu;
    const int s = m % 4;
    const uint32_t hi = s < 2 ? hw[m / 4] << (4 - 2 * s) : hw[m / 4] >> (2 * s - 4);
    return lo | (hi & 0x30303030u);
}

// quants_lowbit.h's binary16 conversion on the device: the hardware's.
struct DeviceHalf {
    __host__ __device__ __forceinline__ static float of(uint32_t bits) { return f16_bits(bits); }
};

// w[0..32) = elements [32u, 32u + 32) of a row (zeros past n_valid for float rows).
template <int TYPE>
__host__ __device__ __forceinline__ void load_unit(const uint8_t *row, int64_t u, int n_valid, float w[32]) {
    if constexpr (TYPE == GGML_F32) {
        const float *src = reinterpret_cast<const float *>(row) + 32 * u;
#pragma unroll
        for (int i = 0; i < 32; ++i) w[i] = i < n_valid ? src[i] : 0.f;
    } else if constexpr (TYPE == GGML_F16 || TYPE == GGML_BF16) {
        const uint8_t *src = row + 64 * u;
#pragma unroll
        for (int i = 0; i < 32; ++i)
            w[i] = i < n_valid ? (TYPE == GGML_F16 ? f16_at(src + 2 * i) : bf16_at(src + 2 * i)) : 0.f;
    } else if constexpr (TYPE == GGML_Q8_0) {
        const uint8_t *b = row + 34 * u;  // f16 d; i8 qs[32]
        const float d = f16_at(b);
#pragma unroll
        for (int i = 0; i < 32; ++i) w[i] = float(int8_t(b[2 + i])) * d;
    } else if constexpr (TYPE == GGML_Q4_0 || TYPE == GGML_Q4_1 || TYPE == GGML_Q5_0 || TYPE == GGML_Q5_1 ||
                         TYPE == GGML_IQ4_NL) {
        // One block: f16 d; (Q4_1 / Q5_1: f16 m;) (Q5_0 / Q5_1: u32 qh;) u8 qs[16]. Element j:
        // nibble j / 16 of qs[j % 16]; Q5: bit j of qh is its 5th bit (spec/qwen35.md section 4).
        // IQ4_NL's codes are in the GPU layout (iq4_xs_codes_to_gpu): element j is nibble j % 2 of
        // qs[j / 2], its GPU code.
        constexpr bool has_m = TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1, five = TYPE == GGML_Q5_0 || TYPE == GGML_Q5_1;
        const uint8_t *b = row + int64_t(block_bytes(TYPE)) * u;
        const float d = f16_at(b), m = has_m ? f16_at(b + 2) : 0.f;
        const uint8_t *qh = b + (has_m ? 4 : 2), *qs = qh + (five ? 4 : 0);
        const uint32_t h = five ? uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24 : 0;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            int q = TYPE == GGML_IQ4_NL ? (qs[j / 2] >> (4 * (j % 2))) & 0xF : (qs[j % 16] >> (4 * (j / 16))) & 0xF;
            if constexpr (five) q |= int((h >> j) & 1) << 4;
            if constexpr (TYPE == GGML_IQ4_NL) w[j] = d * float(iq4_gpu_value(q));
            else if constexpr (has_m) w[j] = d * float(q) + m;
            else w[j] = d * float(q - (five ? 16 : 8));
        }
    } else if constexpr (TYPE == GGML_Q4_K || TYPE == GGML_Q5_K) {
        // f16 d; f16 dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8 qs[128]. Sub-block j holds
        // elements 64c + 32hi + l, c = j/2, hi = j%2: nibble hi of qs[32c + l], 5th bit qh[l] bit j.
        constexpr int BB = TYPE == GGML_Q4_K ? 144 : 176;
        const uint8_t *b = row + BB * (u / 8);
        const int j = int(u % 8), c = j / 2, hi = j % 2;
        int sc, m;
        k_scale_min(b + 4, j, sc, m);
        const float d0 = f16_at(b) * float(sc), dm = f16_at(b + 2) * float(m);
        uint32_t qs[8], qh[8];  // blocks of 144 / 176 bytes: qs and qh are 16-byte aligned
        load_words(b + (TYPE == GGML_Q4_K ? 16 : 48) + 32 * c, qs);
        if constexpr (TYPE == GGML_Q5_K) load_words(b + 16, qh);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const int byte = byte_of(qs, l);
            int q = hi ? (byte >> 4) : (byte & 0xF);
            if constexpr (TYPE == GGML_Q5_K) q |= ((byte_of(qh, l) >> j) & 1) << 4;
            w[l] = d0 * float(q) - dm;
        }
    } else if constexpr (TYPE == GGML_Q6_K) {
        // The GPU layout (q6k_word, above): unit j's 6-bit q, value d * scales[2j + l / 16] * (q - 32).
        const uint8_t *b = row + 210 * (u / 8);
        const int j = int(u % 8);
        const bool odd = q6k_odd(b);
        uint32_t lw[4], hw[2];
        load_words(b + q6k_units_at(odd) + Q6K_UNIT_BYTES * j, lw);
        load_words(b + q6k_units_at(odd) + Q6K_UNIT_BYTES * j + 16, hw);
        const uint8_t *sc = b + q6k_scales_at(odd);
        const float d = f16_at(sc + 16);
        const float d_lo = d * float(int8_t(sc[2 * j])), d_hi = d * float(int8_t(sc[2 * j + 1]));
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const int q = int((q6k_word(lw, hw, l / 4) >> (8 * (l % 4))) & 0xFF) - 32;
            w[l] = (l < 16 ? d_lo : d_hi) * float(q);
        }
    } else if constexpr (TYPE == GGML_IQ4_XS) {
        // f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. Sub-block ib: 6-bit scale ls, in the
        // GPU layout (repack_weights, matmul.cu) elements 32ib + 2m = (d (ls - 32)) K[low nibble
        // of qs[16ib + m]], + 1: its high nibble, K indexed by the GPU's code (iq4_gpu_value).
        const uint8_t *b = row + 136 * (u / 8);
        const int ib = int(u % 8);
        const int scales_h = int(b[2]) | (int(b[3]) << 8);
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
        const float dl = f16_at(b) * float(ls - 32);
        uint32_t qs[4];  // blocks of 136 bytes: qs is 8-byte aligned
        load_words(b + 8 + 16 * ib, qs);
#pragma unroll
        for (int m = 0; m < 16; ++m) {
            const int byte = byte_of(qs, m);
            w[2 * m] = dl * float(iq4_gpu_value(byte & 0xF));
            w[2 * m + 1] = dl * float(iq4_gpu_value(byte >> 4));
        }
    } else if constexpr (is_lowbit_type(TYPE)) {
        lowbit_unit<TYPE, DeviceHalf>(row + int64_t(lowbit_block_bytes(TYPE)) * (u / 8), int(u % 8), w);
    }
}

// Bytes of a row of n_in values of a quantized `type` (whole blocks; quants.h's row_bytes on the
// device side).
__host__ __device__ constexpr int64_t quant_row_bytes(int type, int64_t n_in) {
    return n_in / block_elems(type) * block_bytes(type);
}

// Calls f.operator()<TYPE>() for a run-time type id (f: a struct with a member template); false
// if the type has no kernel. This is the only place a type id becomes a template argument.
template <class F>
bool dispatch_type(int32_t type, F &f) {
    switch (type) {
        case GGML_F32: f.template operator()<GGML_F32>(); return true;
        case GGML_F16: f.template operator()<GGML_F16>(); return true;
        case GGML_BF16: f.template operator()<GGML_BF16>(); return true;
        case GGML_Q8_0: f.template operator()<GGML_Q8_0>(); return true;
        case GGML_Q4_K: f.template operator()<GGML_Q4_K>(); return true;
        case GGML_Q5_K: f.template operator()<GGML_Q5_K>(); return true;
        case GGML_Q6_K: f.template operator()<GGML_Q6_K>(); return true;
        case GGML_IQ4_XS: f.template operator()<GGML_IQ4_XS>(); return true;
        case GGML_Q4_0: f.template operator()<GGML_Q4_0>(); return true;
        case GGML_Q4_1: f.template operator()<GGML_Q4_1>(); return true;
        case GGML_Q5_0: f.template operator()<GGML_Q5_0>(); return true;
        case GGML_Q5_1: f.template operator()<GGML_Q5_1>(); return true;
        case GGML_IQ4_NL: f.template operator()<GGML_IQ4_NL>(); return true;
        case GGML_Q2_K: f.template operator()<GGML_Q2_K>(); return true;
        case GGML_Q3_K: f.template operator()<GGML_Q3_K>(); return true;
        case GGML_IQ2_XXS: f.template operator()<GGML_IQ2_XXS>(); return true;
        case GGML_IQ2_XS: f.template operator()<GGML_IQ2_XS>(); return true;
        case GGML_IQ2_S: f.template operator()<GGML_IQ2_S>(); return true;
        case GGML_IQ3_XXS: f.template operator()<GGML_IQ3_XXS>(); return true;
        case GGML_IQ3_S: f.template operator()<GGML_IQ3_S>(); return true;
        case GGML_IQ1_S: f.template operator()<GGML_IQ1_S>(); return true;
        case GGML_IQ1_M: f.template operator()<GGML_IQ1_M>(); return true;
        default: return false;
    }
}

}  // namespace luce::gpu
