// quants_lowbit.h — the 1-, 2- and 3-bit weight types (Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), 32 elements at a time.
//
// All nine are 256-element blocks made of eight 32-element "units" (the GPU kernels' unit, see
// native/gpu/quant_blocks.cuh). lowbit_unit<TYPE>(block, j, w) writes elements [32j, 32j + 32)
// of one block. The same function is the CPU's scalar reference (quants.cpp) and the GPU's
// dequantization (compiled for the device by nvcc/hipcc), so the two cannot drift; each
// expression keeps gguf-py's float32 operation order, which makes the CPU result bit-identical
// to gguf.quants (tests/test_quants.py). Byte layouts: spec/qwen35.md §4 and ggml's block
// structs; the codebooks are native/src/iq_grids.h, generated from the format definition.
//
// `Half` converts IEEE binary16 bits to float (each side brings its exact conversion).
#pragma once

#include <cstdint>

#include "iq_grids.h"
#include "quants.h"

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(LUCE_GPU_EMU)
#define LUCE_HOST_DEVICE __host__ __device__
#else
#define LUCE_HOST_DEVICE
#endif

// One copy of each codebook per compilation pass: device memory in a device pass (read through
// the L1 like any weight byte), ordinary host constants otherwise.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define LUCE_GRID_STORAGE static __device__ const
#else
#define LUCE_GRID_STORAGE static const
#endif

namespace luce {

LUCE_GRID_STORAGE uint8_t kIq2Signs[128] = {LUCE_IQ2_SIGNS};
LUCE_GRID_STORAGE uint64_t kIq2xxsGrid[256] = {LUCE_IQ2XXS_GRID};
LUCE_GRID_STORAGE uint64_t kIq2xsGrid[512] = {LUCE_IQ2XS_GRID};
LUCE_GRID_STORAGE uint64_t kIq2sGrid[1024] = {LUCE_IQ2S_GRID};
LUCE_GRID_STORAGE uint32_t kIq3xxsGrid[256] = {LUCE_IQ3XXS_GRID};
LUCE_GRID_STORAGE uint32_t kIq3sGrid[512] = {LUCE_IQ3S_GRID};
LUCE_GRID_STORAGE uint64_t kIq1sGrid[2048] = {LUCE_IQ1S_GRID};

// Bytes of one 256-element block (0: not a low-bit type).
LUCE_HOST_DEVICE constexpr int lowbit_block_bytes(int type) {
    switch (type) {
        case GGML_Q2_K: return 84;
        case GGML_Q3_K: return 110;
        case GGML_IQ2_XXS: return 66;
        case GGML_IQ2_XS: return 74;
        case GGML_IQ2_S: return 82;
        case GGML_IQ3_XXS: return 98;
        case GGML_IQ3_S: return 110;
        case GGML_IQ1_S: return 50;
        case GGML_IQ1_M: return 56;
        default: return 0;
    }
}

LUCE_HOST_DEVICE constexpr bool is_lowbit_type(int type) { return lowbit_block_bytes(type) != 0; }

namespace lowbit {

LUCE_HOST_DEVICE inline uint32_t u16_at(const uint8_t *p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8; }
LUCE_HOST_DEVICE inline uint32_t u32_at(const uint8_t *p) { return u16_at(p) | u16_at(p + 2) << 16; }
LUCE_HOST_DEVICE inline int byte_k(uint64_t word, int k) { return int((word >> (8 * k)) & 0xFF); }
LUCE_HOST_DEVICE inline float sign_of(int signs, int bit) { return (signs >> bit) & 1 ? -1.0f : 1.0f; }
constexpr float kIq1Delta = 0.125f;

// Q2_K: u8 scales[16] (low nibble scale, high nibble min); u8 qs[64]; f16 d; f16 dmin.
// Element 128n + 32s + l is bits 2s..2s+1 of qs[32n + l]; = (d sc) q - dmin m per 16 elements.
template <class Half>
LUCE_HOST_DEVICE inline void q2_k(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b + 80)), dmin = Half::of(u16_at(b + 82));
    const uint8_t *qs = b + 16 + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int half = 0; half < 2; ++half) {
        const int sc = b[2 * j + half];
        const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
        for (int l = 16 * half; l < 16 * half + 16; ++l) w[l] = dl * float((qs[l] >> shift) & 3) - ml;
    }
}

// Q3_K: u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 6-bit values); f16 d. Element 32j + l:
// 2 low bits as Q2_K's, minus 4 unless bit j of hmask[l] is set; = (d (scale - 32)) q.
template <class Half>
LUCE_HOST_DEVICE inline void q3_k(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b + 108));
    const uint8_t *hmask = b, *qs = b + 32 + 32 * (j / 4), *sc = b + 96;
    const int shift = 2 * (j % 4);
    for (int half = 0; half < 2; ++half) {
        const int i = 2 * j + half;
        const int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4, hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        const float dl = d * float(int(int8_t(uint8_t(lo | hi << 4))) - 32);
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int q = ((qs[l] >> shift) & 3) - ((hmask[l] >> j) & 1 ? 0 : 4);
            w[l] = dl * float(q);
        }
    }
}

// IQ2_XXS: f16 d; per unit u32 grid (4 entry bytes) and u32 aux (4 x 7 sign bits, 4-bit scale).
template <class Half>
LUCE_HOST_DEVICE inline void iq2_xxs(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b));
    const uint32_t grid = u32_at(b + 2 + 8 * j), aux = u32_at(b + 6 + 8 * j);
    const float db = d * (0.5f + float(aux >> 28)) * 0.25f;
    for (int k = 0; k < 4; ++k) {
        const uint64_t entry = kIq2xxsGrid[(grid >> (8 * k)) & 0xFF];
        const int signs = kIq2Signs[(aux >> (7 * k)) & 127];
        for (int e = 0; e < 8; ++e) w[8 * k + e] = db * float(byte_k(entry, e)) * sign_of(signs, e);
    }
}

// IQ2_XS: f16 d; u16 qs[32] (9-bit entry, 7 sign bits); u8 scales[8] (a nibble per 16 elements).
template <class Half>
LUCE_HOST_DEVICE inline void iq2_xs(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b));
    for (int k = 0; k < 4; ++k) {
        const uint32_t v = u16_at(b + 2 + 2 * (4 * j + k));
        const float db = d * (0.5f + float((b[66 + j] >> (4 * (k / 2))) & 0xF)) * 0.25f;
        const uint64_t entry = kIq2xsGrid[v & 511];
        const int signs = kIq2Signs[v >> 9];
        for (int e = 0; e < 8; ++e) w[8 * k + e] = db * float(byte_k(entry, e)) * sign_of(signs, e);
    }
}

// IQ2_S: f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8] (2 high entry bits each); u8 scales[8].
template <class Half>
LUCE_HOST_DEVICE inline void iq2_s(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b));
    for (int k = 0; k < 4; ++k) {
        const int idx = b[2 + 4 * j + k] | ((b[66 + j] >> (2 * k)) & 3) << 8;
        const float db = d * (0.5f + float((b[74 + j] >> (4 * (k / 2))) & 0xF)) * 0.25f;
        const uint64_t entry = kIq2sGrid[idx];
        const int signs = b[34 + 4 * j + k];
        for (int e = 0; e < 8; ++e) w[8 * k + e] = db * float(byte_k(entry, e)) * sign_of(signs, e);
    }
}

// IQ3_XXS: f16 d; u8 qs[64] (an entry of 4 per byte); per unit u32 aux (4 x 7 sign bits, scale).
template <class Half>
LUCE_HOST_DEVICE inline void iq3_xxs(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b));
    const uint32_t aux = u32_at(b + 66 + 4 * j);
    const float db = d * (0.5f + float(aux >> 28)) * 0.5f;
    for (int k = 0; k < 8; ++k) {
        const uint32_t entry = kIq3xxsGrid[b[2 + 8 * j + k]];
        const int signs = kIq2Signs[(aux >> (7 * (k / 2))) & 127];
        for (int e = 0; e < 4; ++e) w[4 * k + e] = db * float(byte_k(entry, e)) * sign_of(signs, 4 * (k % 2) + e);
    }
}

// IQ3_S: f16 d; u8 qs[64]; u8 qh[8] (9th entry bit); u8 signs[32]; u8 scales[4] (nibbles).
template <class Half>
LUCE_HOST_DEVICE inline void iq3_s(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b));
    const float db = d * float(1 + 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 0xF));
    for (int k = 0; k < 8; ++k) {
        const int idx = b[2 + 8 * j + k] | ((b[66 + j] >> k) & 1) << 8;
        const uint32_t entry = kIq3sGrid[idx];
        const int signs = b[74 + 4 * j + k / 2];
        for (int e = 0; e < 4; ++e) w[4 * k + e] = db * float(byte_k(entry, e)) * sign_of(signs, 4 * (k % 2) + e);
    }
}

// IQ1_S: f16 d; u8 qs[32]; per unit u16 qh (4 x 3 high entry bits, 3-bit scale, delta sign).
template <class Half>
LUCE_HOST_DEVICE inline void iq1_s(const uint8_t *b, int j, float *w) {
    const float d = Half::of(u16_at(b));
    const uint32_t qh = u16_at(b + 34 + 2 * j);
    const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
    for (int k = 0; k < 4; ++k) {
        const uint64_t entry = kIq1sGrid[b[2 + 4 * j + k] | ((qh >> (3 * k)) & 7) << 8];
        for (int e = 0; e < 8; ++e) w[8 * k + e] = dl * (float(int8_t(byte_k(entry, e))) + delta);
    }
}

// IQ1_M: u8 qs[32]; u8 qh[16] (per entry 3 high bits + delta sign); u16 scales[4] (12 bits of
// 3-bit scales each; their top nibbles together are the f16 d).
template <class Half>
LUCE_HOST_DEVICE inline void iq1_m(const uint8_t *b, int j, float *w) {
    const uint8_t *qs = b, *qh = b + 32, *sc = b + 48;
    const uint32_t s0 = u16_at(sc), s1 = u16_at(sc + 2), s2 = u16_at(sc + 4), s3 = u16_at(sc + 6);
    const float d = Half::of((s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000));
    for (int k = 0; k < 4; ++k) {
        const int entry_no = 4 * j + k, g = entry_no / 2;  // a 3-bit scale per 16 elements
        const float dl = d * float(2 * ((u16_at(sc + 2 * (g / 4)) >> (3 * (g % 4))) & 7) + 1);
        const int h = qh[entry_no / 2] >> (4 * (entry_no % 2));
        const float delta = h & 8 ? -kIq1Delta : kIq1Delta;
        const uint64_t entry = kIq1sGrid[qs[entry_no] | (h & 7) << 8];
        for (int e = 0; e < 8; ++e) w[8 * k + e] = dl * (float(int8_t(byte_k(entry, e))) + delta);
    }
}

}  // namespace lowbit

// w[0..32) = elements [32j, 32j + 32) of one 256-element block of TYPE.
template <int TYPE, class Half>
LUCE_HOST_DEVICE inline void lowbit_unit(const uint8_t *block, int j, float *w) {
    if constexpr (TYPE == GGML_Q2_K) lowbit::q2_k<Half>(block, j, w);
    else if constexpr (TYPE == GGML_Q3_K) lowbit::q3_k<Half>(block, j, w);
    else if constexpr (TYPE == GGML_IQ2_XXS) lowbit::iq2_xxs<Half>(block, j, w);
    else if constexpr (TYPE == GGML_IQ2_XS) lowbit::iq2_xs<Half>(block, j, w);
    else if constexpr (TYPE == GGML_IQ2_S) lowbit::iq2_s<Half>(block, j, w);
    else if constexpr (TYPE == GGML_IQ3_XXS) lowbit::iq3_xxs<Half>(block, j, w);
    else if constexpr (TYPE == GGML_IQ3_S) lowbit::iq3_s<Half>(block, j, w);
    else if constexpr (TYPE == GGML_IQ1_S) lowbit::iq1_s<Half>(block, j, w);
    else if constexpr (TYPE == GGML_IQ1_M) lowbit::iq1_m<Half>(block, j, w);
}

// ---- the same units as integers, for the int8-activation kernels ------------------------------
//
// Element i of the unit = d * scale[i / 16] * q[i] - dmin * min[i / 16], with q int8 and the
// scales small integers, so a kernel forms exact integer dots of q with int8 activations per
// 16-element half and applies the float factors once. Every type fits: the IQ scales
// d (0.5 + s) / 4 and d (0.5 + s) / 2 are d / 8 and d / 4 times the odd integer 2s + 1 (exact:
// d is an f16 and the factors powers of two); IQ1's grid value g plus delta +-1/8 is (8g +- 1)/8.
// The products differ from gguf-py's float order only by fp32 rounding (the fast path's
// contract: its results are held to float64 oracles, not to the scalar reference's bits).
struct LowbitIntUnit {
    int8_t q[32];
    float d, dmin;   // dmin: Q2_K only (0 elsewhere)
    int scale[2];    // per 16-element half
    int min[2];      // Q2_K only
};

namespace lowbit {

template <class Half>
LUCE_HOST_DEVICE inline void q2_k_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b + 80)), u.dmin = Half::of(u16_at(b + 82));
    const uint8_t *qs = b + 16 + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int h = 0; h < 2; ++h) u.scale[h] = b[2 * j + h] & 0xF, u.min[h] = b[2 * j + h] >> 4;
    for (int l = 0; l < 32; ++l) u.q[l] = int8_t((qs[l] >> shift) & 3);
}

template <class Half>
LUCE_HOST_DEVICE inline void q3_k_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b + 108));
    const uint8_t *hmask = b, *qs = b + 32 + 32 * (j / 4), *sc = b + 96;
    const int shift = 2 * (j % 4);
    for (int h = 0; h < 2; ++h) {
        const int i = 2 * j + h;
        const int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4, hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        u.scale[h] = (lo | hi << 4) - 32;
    }
    for (int l = 0; l < 32; ++l) u.q[l] = int8_t(((qs[l] >> shift) & 3) - ((hmask[l] >> j) & 1 ? 0 : 4));
}

// Eight grid magnitudes (bytes of `entry`) with their signs (bit e of `signs` set: negative).
LUCE_HOST_DEVICE inline void signed_bytes8(uint64_t entry, int signs, int8_t *q) {
    for (int e = 0; e < 8; ++e) q[e] = int8_t((signs >> e) & 1 ? -byte_k(entry, e) : byte_k(entry, e));
}

template <class Half>
LUCE_HOST_DEVICE inline void iq2_xxs_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b)) * 0.125f;
    const uint32_t grid = u32_at(b + 2 + 8 * j), aux = u32_at(b + 6 + 8 * j);
    u.scale[0] = u.scale[1] = 2 * int(aux >> 28) + 1;
    for (int k = 0; k < 4; ++k)
        signed_bytes8(kIq2xxsGrid[(grid >> (8 * k)) & 0xFF], kIq2Signs[(aux >> (7 * k)) & 127], u.q + 8 * k);
}

template <class Half>
LUCE_HOST_DEVICE inline void iq2_xs_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b)) * 0.125f;
    for (int h = 0; h < 2; ++h) u.scale[h] = 2 * ((b[66 + j] >> (4 * h)) & 0xF) + 1;
    for (int k = 0; k < 4; ++k) {
        const uint32_t v = u16_at(b + 2 + 2 * (4 * j + k));
        signed_bytes8(kIq2xsGrid[v & 511], kIq2Signs[v >> 9], u.q + 8 * k);
    }
}

template <class Half>
LUCE_HOST_DEVICE inline void iq2_s_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b)) * 0.125f;
    for (int h = 0; h < 2; ++h) u.scale[h] = 2 * ((b[74 + j] >> (4 * h)) & 0xF) + 1;
    for (int k = 0; k < 4; ++k) {
        const int idx = b[2 + 4 * j + k] | ((b[66 + j] >> (2 * k)) & 3) << 8;
        signed_bytes8(kIq2sGrid[idx], b[34 + 4 * j + k], u.q + 8 * k);
    }
}

template <class Half>
LUCE_HOST_DEVICE inline void iq3_xxs_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b)) * 0.25f;
    const uint32_t aux = u32_at(b + 66 + 4 * j);
    u.scale[0] = u.scale[1] = 2 * int(aux >> 28) + 1;
    for (int k = 0; k < 8; ++k) {
        const uint32_t entry = kIq3xxsGrid[b[2 + 8 * j + k]];
        const int signs = kIq2Signs[(aux >> (7 * (k / 2))) & 127] >> (4 * (k % 2));
        for (int e = 0; e < 4; ++e) u.q[4 * k + e] = int8_t((signs >> e) & 1 ? -byte_k(entry, e) : byte_k(entry, e));
    }
}

template <class Half>
LUCE_HOST_DEVICE inline void iq3_s_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b));
    u.scale[0] = u.scale[1] = 1 + 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 0xF);
    for (int k = 0; k < 8; ++k) {
        const uint32_t entry = kIq3sGrid[b[2 + 8 * j + k] | ((b[66 + j] >> k) & 1) << 8];
        const int signs = b[74 + 4 * j + k / 2] >> (4 * (k % 2));
        for (int e = 0; e < 4; ++e) u.q[4 * k + e] = int8_t((signs >> e) & 1 ? -byte_k(entry, e) : byte_k(entry, e));
    }
}

// IQ1: 8 g + 1 for delta +1/8, 8 g - 1 for -1/8 (g = -1, 0, 1: |q| <= 9).
LUCE_HOST_DEVICE inline void iq1_bytes8(uint64_t entry, bool negative_delta, int8_t *q) {
    for (int e = 0; e < 8; ++e) q[e] = int8_t(8 * int(int8_t(byte_k(entry, e))) + (negative_delta ? -1 : 1));
}

template <class Half>
LUCE_HOST_DEVICE inline void iq1_s_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    u.d = Half::of(u16_at(b)) * 0.125f;
    const uint32_t qh = u16_at(b + 34 + 2 * j);
    u.scale[0] = u.scale[1] = 2 * int((qh >> 12) & 7) + 1;
    for (int k = 0; k < 4; ++k)
        iq1_bytes8(kIq1sGrid[b[2 + 4 * j + k] | ((qh >> (3 * k)) & 7) << 8], qh & 0x8000, u.q + 8 * k);
}

template <class Half>
LUCE_HOST_DEVICE inline void iq1_m_int(const uint8_t *b, int j, LowbitIntUnit &u) {
    const uint8_t *qs = b, *qh = b + 32, *sc = b + 48;
    const uint32_t s0 = u16_at(sc), s1 = u16_at(sc + 2), s2 = u16_at(sc + 4), s3 = u16_at(sc + 6);
    u.d = Half::of((s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000)) * 0.125f;
    for (int h = 0; h < 2; ++h) {
        const int g = 2 * j + h;
        u.scale[h] = 2 * int((u16_at(sc + 2 * (g / 4)) >> (3 * (g % 4))) & 7) + 1;
    }
    for (int k = 0; k < 4; ++k) {
        const int entry_no = 4 * j + k, h = qh[entry_no / 2] >> (4 * (entry_no % 2));
        iq1_bytes8(kIq1sGrid[qs[entry_no] | (h & 7) << 8], h & 8, u.q + 8 * k);
    }
}

}  // namespace lowbit

// Unit j (0..7) of one 256-element block of TYPE, as integers (LowbitIntUnit).
template <int TYPE, class Half>
LUCE_HOST_DEVICE inline void lowbit_unit_int(const uint8_t *block, int j, LowbitIntUnit &u) {
    u.dmin = 0.0f;
    u.min[0] = u.min[1] = 0;
    if constexpr (TYPE == GGML_Q2_K) lowbit::q2_k_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_Q3_K) lowbit::q3_k_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_IQ2_XXS) lowbit::iq2_xxs_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_IQ2_XS) lowbit::iq2_xs_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_IQ2_S) lowbit::iq2_s_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_IQ3_XXS) lowbit::iq3_xxs_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_IQ3_S) lowbit::iq3_s_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_IQ1_S) lowbit::iq1_s_int<Half>(block, j, u);
    else if constexpr (TYPE == GGML_IQ1_M) lowbit::iq1_m_int<Half>(block, j, u);
}

// The types whose two 16-element halves of a unit have scales of their own, and those with a
// min (whose kernels need the activations' 16-sums).
LUCE_HOST_DEVICE constexpr bool lowbit_half_scales(int type) {
    return type == GGML_Q2_K || type == GGML_Q3_K || type == GGML_IQ2_XS || type == GGML_IQ2_S || type == GGML_IQ1_M;
}

}  // namespace luce
