// int8_units.cuh — one 32-element unit of quantized weights as int8, the fp32 formula that
// applies its scales to an exact integer dot product, and the order in which a row's units are
// summed: shared by the dp4a kernel (matmul_int8.cu) and the tensor-core kernel (matmul_mma.cu),
// so both apply the CPU fast path's contract with the same fp32 operations in the same order and
// differ only in how the integer dots are formed. Either kernel may serve any width T, and a
// verify row is bit-identical to the decode step of the same token whichever served each.
#pragma once

#include <type_traits>

#include "quant_blocks.cuh"

namespace luce::gpu::int8_units {

constexpr int SLOTS = 8;  // units summed side by side in a row (the summation order, below)

// The IQ4_NL codebook in the GPU's code order (quant_blocks.cuh, iq4_gpu_code), in registers:
// `__constant__` memory serialises a warp whose lanes read different entries, which is every
// lookup here.
struct Codebook {
    uint32_t w[4];  // four int8 entries per word, little-endian
};

// Kept in (never written) device memory and read once per thread by load_codebook: from a
// constant, ptxas re-creates the operand for every permute that needs it in a register (a tenth
// of the decode kernel's instructions); a loaded value stays in its register.
#if defined(LUCE_HIP)
// Entries 0..15 of the GPU order.
static __device__ Codebook iq4nl_codebook_words = {{0xBFAD9881u, 0x26190D01u, 0xF6EADDCFu, 0x71594535u}};
#else
// w0 w1 = entries 0..7; w2 w3 = entries 8..15 as lookup8 needs them: bits 0-6 of entry
// 8 + i XOR-ed with entry i's sign (spread over the byte), bit 7 clear.
static __device__ Codebook iq4nl_codebook_words = {{0xBFAD9881u, 0x26190D01u, 0x09152230u, 0x71594535u}};
#endif

__device__ __forceinline__ Codebook load_codebook() { return iq4nl_codebook_words; }

// The same words through an address ptxas cannot prove uniform (threadIdx.x / blockDim.x is 0):
// a value it can prove warp-uniform may live in a uniform register, which prmt does not take,
// and in the fragment kernel ptxas then copied two codebook words into ordinary registers before
// every permute (16 moves per unit, H200 SASS, 2026-12-04).
__device__ __forceinline__ Codebook load_codebook_lanes() { return (&iq4nl_codebook_words)[threadIdx.x / blockDim.x]; }

#if !defined(LUCE_HIP)
// PTX prmt in its default mode: result byte i = byte (sel nibble i & 7) of the pair (a, b), or
// that byte's sign bit repeated when the nibble's bit 3 is set.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(LUCE_GPU_EMU)
    return luce_emu::prmt(a, b, sel);
#else
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
#endif
}

// Four codes (selector nibbles 0-3) -> their four int8 values. With the codes as selectors, a
// code j < 8 picks entry j from (w0, w1) and a code j >= 8 the sign fill of entry j - 8, which
// is j's own sign (the GPU order's pairing); with the codes XOR 8, j >= 8 picks (w2, w3)'s
// byte j - 8 and j < 8 a sign fill of 0 (those bytes' bit 7 is clear). Bit 7 of the first
// permute and bits 0-6 of the XOR of the two are then j's value either way (one LOP3).
__device__ __forceinline__ uint32_t lookup4(const Codebook &cb, uint32_t codes, uint32_t flipped) {
    const uint32_t a = prmt(cb.w[0], cb.w[1], codes), b = prmt(cb.w[2], cb.w[3], flipped);
    return (a & 0x80808080u) | ((a ^ b) & 0x7F7F7F7Fu);
}
#endif

#if defined(LUCE_HIP)
// AMD's v_perm_b32: result byte i = byte (sel byte i) of the pair (a: bytes 4-7, b: bytes 0-3)
// for selectors 0-7, 0x00 for 12, 0xFF for 13 and up (LLVM folds perm(0x77665544, 0x33221100,
// 0x0C0D0400) to 0x00FF4400; the emulator runs luce_emu::perm_b32).
__device__ __forceinline__ uint32_t perm_bytes(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(LUCE_GPU_EMU)
    return luce_emu::perm_b32(a, b, sel);
#else
    return __builtin_amdgcn_perm(a, b, sel);
#endif
}

// Four codes, one per byte (0-15) -> their four int8 values.
__device__ __forceinline__ uint32_t lookup4_bytes(const Codebook &cb, uint32_t codes) {
    const uint32_t low3 = codes & 0x07070707u;
    const uint32_t first = perm_bytes(cb.w[1], cb.w[0], low3), second = perm_bytes(cb.w[3], cb.w[2], low3);
    const uint32_t from_second = ((codes >> 3) & 0x01010101u) * 0xFFu;  // 0xFF where the code is >= 8
    return (second & from_second) | (first & ~from_second);
}
#endif

// The eight 4-bit codes of one qs word in the GPU's IQ4_XS layout (byte i: element 2i of the
// word's eight in its low nibble, element 2i + 1 in its high nibble; repack_weights, matmul.cu)
// -> the values of elements 0-3 (lo) and 4-7 (hi), packed as int8.
__device__ __forceinline__ void lookup8(const Codebook &cb, uint32_t codes, uint32_t &lo, uint32_t &hi) {
#if defined(LUCE_HIP)
    // AMD's byte permute (v_perm_b32, every GCN3+ and RDNA part) takes a byte per selector, not a
    // nibble: the codes are spread to bytes in element order (two permutes interleave the even and
    // the odd elements' nibbles), then looked up in entries 0-7 and 8-15 at once and each byte
    // taken from the half its code's bit 3 names. About 19 instructions per eight codes; the
    // byte-by-byte loop this replaces indexed the codebook with run-time shifts.
    const uint32_t even = codes & 0x0F0F0F0Fu, odd = (codes >> 4) & 0x0F0F0F0Fu;  // e0 e2 e4 e6; e1 e3 e5 e7
    lo = lookup4_bytes(cb, perm_bytes(odd, even, 0x05010400u));                   // e0 e1 e2 e3
    hi = lookup4_bytes(cb, perm_bytes(odd, even, 0x07030602u));                   // e4 e5 e6 e7
#else
    // prmt reads the low 16 bits of its selector: nibbles 0-3, or 4-7 once shifted down. (The
    // __byte_perm intrinsic masks every selector, which cost a fifth of the decode kernel's
    // instructions; GGUF's pairing, element i with i + 16 in one byte, cost two more permutes per
    // word to separate the halves: the reason for the GPU layout.)
    const uint32_t flipped = codes ^ 0x88888888u;
    lo = lookup4(cb, codes, flipped);
    hi = lookup4(cb, codes >> 16, flipped >> 16);
#endif
}

// ---- one unit of weights: eight packed int8 words and its scales --------------------------------

struct UnitScales {  // d and sc0 side by side: IQ4_XS and Q8_0 read only those (one 8-byte load)
    float d;     // block scale
    int sc0;     // integer sub-scale: Q4_K/Q5_K scale; Q6_K the first 16-half's; IQ4_XS ls - 32
    float dmin;  // Q4_K / Q5_K only
    int sc1;     // Q4_K/Q5_K min; Q6_K the second 16-half's scale
};

struct alignas(16) Unit {  // 16-aligned: copied to shared memory as three 16-byte words
    uint32_t q[8];  // 32 weights (int8), element order
    UnitScales s;
};

// A unit is read in two steps: fetch_unit issues the loads of its bytes into a RawUnit (nothing
// waits on them), decode_unit turns those into a Unit. Kernels fetch the next units before they
// decode and apply the current ones, so DRAM latency hides behind the arithmetic: a decode-step
// matmul is one pass over ~47 MB with little else to overlap (formats: spec/qwen35.md §4).
// The 32-element types' blocks (Q8_0: f16 d; i8 qs[32]; the legacy Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL: spec/qwen35.md §4) are fetched whole as the words around them. Q8_0 (34 bytes), Q4_0 /
// IQ4_NL (18) and Q5_0 (22) are only 2-byte aligned: the 4-byte-aligned words around the block,
// shifted into place by decode_unit (`shift` 0 or 16); Q4_1 (20) and Q5_1 (24) are word-aligned
// from an aligned tensor (`shift` 0). (Q6_K's 210-byte blocks are rearranged at upload so that its
// units are word-aligned: quant_blocks.cuh.)
template <int TYPE, bool LOWBIT = is_lowbit_type(TYPE)>
struct RawUnit {
    uint32_t w[(block_bytes(TYPE) + 3) / 4], shift;
};
template <int TYPE>
struct RawUnit<TYPE, true> {  // the 1-3-bit types: their block and the unit in it, read by decode_unit
    const uint8_t *block;
    int j;
};
// The 1-3-bit types of the published 2- and 3-bit recipes, whose units are fetched ahead as
// words like the types above (the others' decode_unit reads its block's bytes where it is).
__host__ __device__ constexpr bool lowbit_fetched(int type) {
    return type == GGML_Q2_K || type == GGML_IQ2_XXS || type == GGML_IQ3_XXS || type == GGML_IQ3_S;
}
template <>
struct RawUnit<GGML_Q2_K, true> {  // 84-byte blocks, word-aligned: the unit's 32 bytes of qs (four
    uint32_t qs[8], sc, dd;          // units' 2-bit fields), the word holding its two scale bytes, d|dmin
};
template <>
struct RawUnit<GGML_IQ2_XXS, true> {  // 66-byte blocks, 2-byte aligned: the unit's 8 bytes (grid | aux)
    uint32_t w[3], shift;
    uint16_t d;
};
template <>
struct RawUnit<GGML_IQ3_XXS, true> {  // 98-byte blocks: the unit's 8 grid bytes and its aux word
    uint32_t qs[3], aux[2], shift;
    uint16_t d;
};
template <>
struct RawUnit<GGML_IQ3_S, true> {  // 110-byte blocks: 8 grid bytes, 4 sign bytes, qh and scale bytes
    uint32_t qs[3], signs[2], shift;
    uint16_t d;
    uint8_t qh, scale;
};
template <>
struct RawUnit<GGML_Q4_K> {  // f16 d, f16 dmin, u8 scales[12]; the 32 bytes of nibbles holding the unit
    uint4 head, qs[2];
};
template <>
struct RawUnit<GGML_Q5_K> {  // as Q4_K, plus the block's 32 bytes of 5th bits
    uint4 head, qs[2], qh[2];
};
template <>
struct RawUnit<GGML_Q6_K> {  // the GPU layout's unit (quant_blocks.cuh); its two sub-scales, d
    uint32_t lw[4], hw[2];
    uint16_t sc, d;
};
template <>
struct RawUnit<GGML_IQ4_XS> {  // f16 d, u16 scales_h, u8 scales_l[4]; the unit's 16 bytes of codes
    uint2 head, lo, hi;
};

__device__ __forceinline__ uint16_t u16_at(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }

// The N aligned words around the 2-byte-aligned 4N - 2 bytes at p (a block of Q8_0, Q4_0,
// IQ4_NL or Q5_0): [p & ~3, (p & ~3) + 4N). When p is 4-aligned the last word would reach 2 bytes
// past the run, so only its first half is read there (the run may end the tensor). Word i of the
// block (its bytes 4i .. 4i + 3) is then word_a2(w, shift, i).
template <int N>
__device__ __forceinline__ uint32_t fetch_words_a2(const uint8_t *p, uint32_t (&w)[N]) {
    const uint32_t shift = (reinterpret_cast<uintptr_t>(p) & 2) ? 16u : 0u;
    const uint32_t *a = reinterpret_cast<const uint32_t *>(p - shift / 8);
#pragma unroll
    for (int i = 0; i < N - 1; ++i) w[i] = a[i];
    w[N - 1] = !shift ? uint32_t(*reinterpret_cast<const uint16_t *>(a + N - 1)) : a[N - 1];
    return shift;
}

// The aligned words around the 2-byte-aligned 4N bytes at p: N words, and when p is not
// 4-aligned the first half of one more (a whole word would reach 2 bytes past the run).
template <int N>
__device__ __forceinline__ uint32_t fetch_run_a2(const uint8_t *p, uint32_t (&w)[N + 1]) {
    const uint32_t shift = (reinterpret_cast<uintptr_t>(p) & 2) ? 16u : 0u;
    const uint32_t *a = reinterpret_cast<const uint32_t *>(p - shift / 8);
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = a[i];
    w[N] = shift ? uint32_t(*reinterpret_cast<const uint16_t *>(a + N)) : 0u;
    return shift;
}

// Word i of a run fetch_words_a2 or fetch_run_a2 fetched.
template <int N>
__device__ __forceinline__ uint32_t word_a2(const uint32_t (&w)[N], uint32_t shift, int i) {
    return uint32_t(((uint64_t(w[i + 1]) << 32) | w[i]) >> shift);
}

// Four grid magnitudes (bytes of mag, each >= 1: every IQ2 / IQ3 grid entry is) with the signs of
// bits 0-3 of `bits` (set: negative): where a bit is set, (mag ^ 0xFF) + 1 = 256 - mag, the
// byte's negation, which cannot carry into the next byte since mag >= 1.
__device__ __forceinline__ uint32_t signed_grid4(uint32_t mag, uint32_t bits) {
    const uint32_t ones = ((bits & 0xFu) * 0x00204081u) & 0x01010101u;  // bit e -> byte e's bit 0
    return (mag ^ (ones * 0xFFu)) + ones;
}

// Byte i (0..11, run-time) of the three words w0 w1 w2, without indexing a register array.
__device__ __forceinline__ int byte_of3(uint32_t w0, uint32_t w1, uint32_t w2, int i) {
    const uint32_t w = i < 4 ? w0 : (i < 8 ? w1 : w2);
    return int((w >> (8 * (i % 4))) & 0xFF);
}

// The scales of sub-block j of a Q4_K / Q5_K block from its first 16 bytes (f16 d, f16 dmin,
// u8 scales[12]): 6-bit scale and min (spec/qwen35.md §4, get_scale_min_k4).
__device__ __forceinline__ void k_quant_scales(const uint4 &head, int j, UnitScales &s) {
    const uint32_t s0 = head.y, s1 = head.z, s2 = head.w;  // scales[0..11]
    if (j < 4) {
        s.sc0 = byte_of3(s0, s1, s2, j) & 63;
        s.sc1 = byte_of3(s0, s1, s2, j + 4) & 63;
    } else {
        s.sc0 = (byte_of3(s0, s1, s2, j + 4) & 0xF) | ((byte_of3(s0, s1, s2, j - 4) >> 6) << 4);
        s.sc1 = (byte_of3(s0, s1, s2, j + 4) >> 4) | ((byte_of3(s0, s1, s2, j) >> 6) << 4);
    }
    s.d = f16_bits(head.x & 0xFFFF);
    s.dmin = f16_bits(head.x >> 16);
}

// The scale of sub-block ib of an IQ4_XS block from its first 8 bytes (f16 d, u16 scales_h,
// u8 scales_l[4]): d * (ls - 32), ls = 4 bits of scales_l | 2 bits of scales_h.
__device__ __forceinline__ void iq4_xs_scales(const uint2 &head, int ib, UnitScales &s) {
    const uint32_t scales_h = head.x >> 16;
    s.sc0 = int(((head.y >> (4 * ib)) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)) - 32;
    s.d = f16_bits(head.x & 0xFFFF);
}

// The bytes of one group of SLOTS units (256 values) in a row: one block of the K and IQ types,
// eight of Q8_0. Group k of a row starts at row + k * group_bytes.
__host__ __device__ constexpr int group_bytes(int type) { return block_bytes(type) * (SLOTS * 32 / block_elems(type)); }

// Unit j (0..SLOTS-1) of the group at g.
template <int TYPE>
__device__ __forceinline__ void fetch_group_unit(const uint8_t *g, int j, RawUnit<TYPE> &r) {
    if constexpr (TYPE == GGML_Q8_0 || TYPE == GGML_Q4_0 || TYPE == GGML_IQ4_NL || TYPE == GGML_Q5_0) {
        r.shift = fetch_words_a2(g + block_bytes(TYPE) * j, r.w);
    } else if constexpr (TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1) {
        const uint32_t *w = reinterpret_cast<const uint32_t *>(g + block_bytes(TYPE) * j);
#pragma unroll
        for (int i = 0; i < int(sizeof(r.w) / 4); ++i) r.w[i] = w[i];
        r.shift = 0;
    } else if constexpr (TYPE == GGML_Q4_K || TYPE == GGML_Q5_K) {
        // 144- and 176-byte blocks from an aligned base: every field below is 16-byte aligned.
        const int c = j / 2;
        r.head = *reinterpret_cast<const uint4 *>(g);
        const uint4 *qs = reinterpret_cast<const uint4 *>(g + (TYPE == GGML_Q4_K ? 16 : 48) + 32 * c);
        r.qs[0] = qs[0], r.qs[1] = qs[1];
        if constexpr (TYPE == GGML_Q5_K) {
            const uint4 *qh = reinterpret_cast<const uint4 *>(g + 16);
            r.qh[0] = qh[0], r.qh[1] = qh[1];
        }
    } else if constexpr (TYPE == GGML_Q6_K) {
        // The GPU layout (quant_blocks.cuh): the unit's 24 bytes are word-aligned; scales[2j],
        // scales[2j + 1] and d wherever the block's parity put them.
        const bool odd = q6k_odd(g);
        const uint32_t *w = reinterpret_cast<const uint32_t *>(g + q6k_units_at(odd) + Q6K_UNIT_BYTES * j);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.lw[i] = w[i];
        r.hw[0] = w[4], r.hw[1] = w[5];
        const uint8_t *sc = g + q6k_scales_at(odd);
        r.sc = u16_at(sc + 2 * j);
        r.d = u16_at(sc + 16);
    } else if constexpr (TYPE == GGML_IQ4_XS) {
        const uint2 *q2 = reinterpret_cast<const uint2 *>(g + 8 + 16 * j);  // 8-byte aligned: 8-byte loads
        r.head = *reinterpret_cast<const uint2 *>(g);
        r.lo = q2[0], r.hi = q2[1];
    } else if constexpr (TYPE == GGML_Q2_K) {
        const uint32_t *w = reinterpret_cast<const uint32_t *>(g);
#pragma unroll
        for (int i = 0; i < 8; ++i) r.qs[i] = w[4 + 8 * (j / 4) + i];  // qs at byte 16 + 32 (j / 4)
        r.sc = w[j / 2];                                               // scales[2j], scales[2j + 1]
        r.dd = w[20];                                                  // d, dmin at byte 80
    } else if constexpr (TYPE == GGML_IQ2_XXS) {
        r.d = u16_at(g);
        r.shift = fetch_run_a2<2>(g + 2 + 8 * j, r.w);
    } else if constexpr (TYPE == GGML_IQ3_XXS) {
        // qs at 2 + 8j and aux at 66 + 4j have the same parity: one shift serves both.
        r.d = u16_at(g);
        r.shift = fetch_run_a2<2>(g + 2 + 8 * j, r.qs);
        fetch_run_a2<1>(g + 66 + 4 * j, r.aux);
    } else if constexpr (TYPE == GGML_IQ3_S) {
        r.d = u16_at(g);
        r.shift = fetch_run_a2<2>(g + 2 + 8 * j, r.qs);
        fetch_run_a2<1>(g + 74 + 4 * j, r.signs);
        r.qh = g[66 + j];
        r.scale = g[106 + j / 2];
    } else if constexpr (is_lowbit_type(TYPE)) {
        // Blocks of 50-110 bytes, mostly only 2-byte aligned: decode_unit reads the bytes it needs
        // (quants_lowbit.h). No loads in flight ahead of the decode, unlike the types above.
        r.block = g, r.j = j;
    }
}

template <int TYPE>
__device__ __forceinline__ void fetch_unit(const uint8_t *row, int u, RawUnit<TYPE> &r) {
    fetch_group_unit<TYPE>(row + int64_t(group_bytes(TYPE)) * (u / SLOTS), u % SLOTS, r);
}

// Unit j of a fetched low-bit block: the integers and scales lowbit_unit_int gives (the CPU's
// contract, quants_lowbit.h), from registers. sc0 / sc1 carry Q2_K's 4-bit min in bits 8-11.
template <int TYPE>
__device__ __forceinline__ void decode_fetched_lowbit(const RawUnit<TYPE> &r, int j, Unit &un) {
    if constexpr (TYPE == GGML_Q2_K) {
        const int shift = 2 * (j % 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) un.q[i] = (r.qs[i] >> shift) & 0x03030303u;
        const uint32_t sc = r.sc >> (16 * (j & 1));
        un.s.d = f16_bits(r.dd & 0xFFFF);
        un.s.dmin = f16_bits(r.dd >> 16);
        un.s.sc0 = int(sc & 0xF) + int((sc >> 4) & 0xF) * 256;
        un.s.sc1 = int((sc >> 8) & 0xF) + int((sc >> 12) & 0xF) * 256;
    } else if constexpr (TYPE == GGML_IQ2_XXS) {
        const uint32_t grid = word_a2(r.w, r.shift, 0), aux = word_a2(r.w, r.shift, 1);
        un.s.d = f16_bits(r.d) * 0.125f;
        un.s.sc0 = un.s.sc1 = 2 * int(aux >> 28) + 1;
        un.s.dmin = 0.f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint64_t entry = kIq2xxsGrid[(grid >> (8 * k)) & 0xFF];
            const uint32_t signs = kIq2Signs[(aux >> (7 * k)) & 127];
            un.q[2 * k] = signed_grid4(uint32_t(entry), signs);
            un.q[2 * k + 1] = signed_grid4(uint32_t(entry >> 32), signs >> 4);
        }
    } else if constexpr (TYPE == GGML_IQ3_XXS) {
        const uint32_t q0 = word_a2(r.qs, r.shift, 0), q1 = word_a2(r.qs, r.shift, 1);
        const uint32_t aux = word_a2(r.aux, r.shift, 0);
        un.s.d = f16_bits(r.d) * 0.25f;
        un.s.sc0 = un.s.sc1 = 2 * int(aux >> 28) + 1;
        un.s.dmin = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t code = ((k < 4 ? q0 : q1) >> (8 * (k % 4))) & 0xFF;
            const uint32_t signs = kIq2Signs[(aux >> (7 * (k / 2))) & 127] >> (4 * (k % 2));
            un.q[k] = signed_grid4(kIq3xxsGrid[code], signs);
        }
    } else if constexpr (TYPE == GGML_IQ3_S) {
        const uint32_t q0 = word_a2(r.qs, r.shift, 0), q1 = word_a2(r.qs, r.shift, 1);
        const uint32_t signs = word_a2(r.signs, r.shift, 0);
        un.s.d = f16_bits(r.d);
        un.s.sc0 = un.s.sc1 = 1 + 2 * int((r.scale >> (4 * (j % 2))) & 0xF);
        un.s.dmin = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t code = ((k < 4 ? q0 : q1) >> (8 * (k % 4))) & 0xFF;
            un.q[k] = signed_grid4(kIq3sGrid[code | ((uint32_t(r.qh) >> k) & 1) << 8], signs >> (4 * k));
        }
    }
}

// The words of a block fetched by fetch_words_a2, or word by word with shift 0 (v[i]: its bytes 4i .. 4i + 3).
template <int N>
__device__ __forceinline__ void block_words_a2(const uint32_t (&w)[N], uint32_t shift, uint32_t (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N - 1; ++i) v[i] = word_a2(w, shift, i);
    v[N - 1] = w[N - 1] >> shift;
}

// Whether `type` is one of the legacy 32-element types with 4-bit codes (Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL): one weight block and one activation block per unit.
__host__ __device__ constexpr bool legacy_4bit(int type) {
    return type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q5_0 || type == GGML_Q5_1 || type == GGML_IQ4_NL;
}

// A legacy block's 32 codes in element order from its four qs words (GGUF order: byte m holds
// element m in its low nibble and m + 16 in its high one), each with its 5th bit from qh (bit e:
// element e) for Q5_0 / Q5_1: 0..15, or 0..31.
template <bool FIVE>
__device__ __forceinline__ void legacy_codes(const uint32_t (&qs)[4], uint32_t qh, uint32_t (&q)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = qs[i] & 0x0F0F0F0Fu, q[i + 4] = (qs[i] >> 4) & 0x0F0F0F0Fu;
    if constexpr (FIVE) {
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] |= ((((qh >> (4 * i)) & 0xFu) * 0x00204081u) & 0x01010101u) << 4;
    }
}

// Unit (= block) of a legacy type: the codes as integers (Q4_0 / Q5_0 keep q, their -8 / -16
// comes in through the activation sums as Q6_K's -32 does), d, and Q4_1 / Q5_1's m in dmin.
// IQ4_NL's codes are in the GPU layout (repack_weights, matmul.cu), looked up as IQ4_XS's.
template <int TYPE>
__device__ __forceinline__ void decode_legacy(const RawUnit<TYPE> &r, const Codebook &cb, Unit &un) {
    constexpr int N = sizeof(r.w) / 4;
    uint32_t v[N];
    block_words_a2(r.w, r.shift, v);  // Q4_1 / Q5_1: shift 0, the words as fetched
    un.s.d = f16_bits(v[0] & 0xFFFF);
    if constexpr (TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1) un.s.dmin = f16_bits(v[0] >> 16);
    uint32_t qs[4], qh = 0;
    if constexpr (TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1) {  // qs at byte 4 or 8: words 1..4 or 2..5
#pragma unroll
        for (int i = 0; i < 4; ++i) qs[i] = v[N - 4 + i];
        if constexpr (TYPE == GGML_Q5_1) qh = v[1];
    } else {  // qs at byte 2 (Q4_0, IQ4_NL) or 6 (Q5_0, after qh at 2)
        constexpr int k = TYPE == GGML_Q5_0 ? 1 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) qs[i] = (v[k + i] >> 16) | (v[k + i + 1] << 16);
        if constexpr (TYPE == GGML_Q5_0) qh = (v[0] >> 16) | (v[1] << 16);
    }
    if constexpr (TYPE == GGML_IQ4_NL) {
#pragma unroll
        for (int i = 0; i < 4; ++i) lookup8(cb, qs[i], un.q[2 * i], un.q[2 * i + 1]);
    } else {
        legacy_codes<TYPE == GGML_Q5_0 || TYPE == GGML_Q5_1>(qs, qh, un.q);
    }
}

// cb: the IQ4_NL codebook (load_codebook), used by IQ4_XS and IQ4_NL only. u >= 0: `u & 7` is its unit in
// the block, which a kernel's units SLOTS k + slot make a loop-invariant `slot & 7` (`u % 8` of a
// signed u was five instructions a unit, in the loop).
template <int TYPE>
__device__ __forceinline__ void decode_unit(const RawUnit<TYPE> &r, int u, const Codebook &cb, Unit &un) {
    if constexpr (TYPE == GGML_Q8_0) {
        // Bytes 0-1: d; 2-33: qs. With the run's word j = word_a2(j), qs word i is the upper half
        // of word i and the lower half of word i + 1.
        uint32_t v[9];
        block_words_a2(r.w, r.shift, v);
        un.s.d = f16_bits(v[0] & 0xFFFF);
#pragma unroll
        for (int i = 0; i < 8; ++i) un.q[i] = (v[i] >> 16) | (v[i + 1] << 16);
    } else if constexpr (legacy_4bit(TYPE)) {
        decode_legacy<TYPE>(r, cb, un);
    } else if constexpr (TYPE == GGML_Q4_K || TYPE == GGML_Q5_K) {
        // Sub-block j = nibble hi = j % 2 of qs[32c + l], c = j / 2; Q5_K's 5th bit is bit j of
        // qh[l]; scale and min: 6-bit fields of scales[12] (spec/qwen35.md §4, get_scale_min_k4).
        const int j = u & 7, hi = j & 1;
        k_quant_scales(r.head, j, un.s);
        const uint32_t qs[8] = {r.qs[0].x, r.qs[0].y, r.qs[0].z, r.qs[0].w, r.qs[1].x, r.qs[1].y, r.qs[1].z, r.qs[1].w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            uint32_t v = (hi ? qs[i] >> 4 : qs[i]) & 0x0F0F0F0Fu;
            if constexpr (TYPE == GGML_Q5_K) {
                const uint32_t qh[8] = {r.qh[0].x, r.qh[0].y, r.qh[0].z, r.qh[0].w,
                                        r.qh[1].x, r.qh[1].y, r.qh[1].z, r.qh[1].w};
                v |= ((qh[i] >> j) & 0x01010101u) << 4;
            }
            un.q[i] = v;
        }
    } else if constexpr (TYPE == GGML_Q6_K) {
        // 6-bit q (q6k_word), value d * scales[2j + l / 16] * (q - 32). The unit keeps q
        // (0..63); the -32 is applied through the activation sums.
#pragma unroll
        for (int i = 0; i < 8; ++i) un.q[i] = q6k_word(r.lw, r.hw, i);
        un.s.sc0 = int8_t(r.sc & 0xFF);
        un.s.sc1 = int8_t(r.sc >> 8);
        un.s.d = f16_bits(r.d);
    } else if constexpr (lowbit_fetched(TYPE)) {
        decode_fetched_lowbit<TYPE>(r, u & 7, un);
    } else if constexpr (is_lowbit_type(TYPE)) {
        // Integer q and scales (quants_lowbit.h, lowbit_unit_int). sc0 / sc1: the halves' scales,
        // each with its min (Q2_K, 4 bits) in bits 8-11.
        LowbitIntUnit li;
        lowbit_unit_int<TYPE, DeviceHalf>(r.block, r.j, li);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            un.q[i] = uint32_t(uint8_t(li.q[4 * i])) | uint32_t(uint8_t(li.q[4 * i + 1])) << 8 |
                      uint32_t(uint8_t(li.q[4 * i + 2])) << 16 | uint32_t(uint8_t(li.q[4 * i + 3])) << 24;
        un.s.d = li.d;
        un.s.dmin = li.dmin;
        un.s.sc0 = li.scale[0] + li.min[0] * 256;
        un.s.sc1 = li.scale[1] + li.min[1] * 256;
    } else if constexpr (TYPE == GGML_IQ4_XS) {
        // Sub-block ib, GPU layout (repack_weights): element 2m = low nibble of qs[16ib + m],
        // element 2m + 1 = its high nibble; scale d * (ls - 32), ls = 4 bits of scales_l | 2 bits
        // of scales_h.
        iq4_xs_scales(r.head, u & 7, un.s);
        const uint32_t qs[4] = {r.lo.x, r.lo.y, r.hi.x, r.hi.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) lookup8(cb, qs[i], un.q[2 * i], un.q[2 * i + 1]);
    }
}

// The types whose units apply a min times the activations' sum: d sc q - dmin m (Q4_K, Q5_K,
// Q2_K), d q + m (Q4_1, Q5_1: m kept in dmin).
__host__ __device__ constexpr bool has_min(int type) {
    return type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q2_K || type == GGML_Q4_1 || type == GGML_Q5_1;
}

// The types whose units read the activations' 16-sums: those with a min, and those whose codes
// are kept unsigned with a zero point (Q6_K's 32, Q4_0's 8, Q5_0's 16).
__host__ __device__ constexpr bool uses_act_sums(int type) {
    return has_min(type) || type == GGML_Q6_K || type == GGML_Q4_0 || type == GGML_Q5_0;
}

// The types whose unit's two 16-element halves carry scales of their own: their integer dots are
// kept apart (mma_unit).
__host__ __device__ constexpr bool half_scales(int type) { return type == GGML_Q6_K || lowbit_half_scales(type); }

// acc += (this unit . token's quantized activations) from the unit's exact integer dots over its
// two 16-element halves (lo, hi), in one fixed order of fp32 operations, given the products of
// the unit's block scales with the token's activation scale: sd = d * dx, smin = dmin * dx
// (apply_dots forms them; a kernel whose unit shares d with its neighbours may form them once).
// Every int -> float conversion below is exact (|value| < 2^24 for every type's ranges).
template <int TYPE>
__device__ __forceinline__ float apply_scaled_dots(const UnitScales &us, float sd, float smin, int lo, int hi,
                                                   int sum_lo, int sum_hi, float acc) {
    if constexpr (TYPE == GGML_Q6_K) {  // q kept 0..63: the -32 comes in through the sums
        acc = fmaf(sd, float(us.sc0 * (lo - 32 * sum_lo)), acc);
        return fmaf(sd, float(us.sc1 * (hi - 32 * sum_hi)), acc);
    } else if constexpr (TYPE == GGML_Q8_0 || TYPE == GGML_IQ4_NL) {
        return fmaf(sd, float(lo + hi), acc);
    } else if constexpr (TYPE == GGML_Q4_0 || TYPE == GGML_Q5_0) {  // d (q - z) . x, z = 8 or 16
        constexpr int zero = TYPE == GGML_Q4_0 ? 8 : 16;
        return fmaf(sd, float(lo + hi - zero * (sum_lo + sum_hi)), acc);
    } else if constexpr (TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1) {  // d (q . x) + m (sum x)
        acc = fmaf(sd, float(lo + hi), acc);
        return fmaf(smin, float(sum_lo + sum_hi), acc);
    } else if constexpr (TYPE == GGML_IQ4_XS) {
        return fmaf(sd, float(us.sc0 * (lo + hi)), acc);
    } else if constexpr (TYPE == GGML_Q2_K) {  // d (sc q . x) - dmin (m sum x), per half
        acc = fmaf(sd, float((us.sc0 & 0xFF) * lo + (us.sc1 & 0xFF) * hi), acc);
        return fmaf(-smin, float((us.sc0 >> 8) * sum_lo + (us.sc1 >> 8) * sum_hi), acc);
    } else if constexpr (is_lowbit_type(TYPE)) {  // d (scale q . x), per half (lowbit_unit_int)
        return fmaf(sd, float(us.sc0 * lo + us.sc1 * hi), acc);
    } else {  // Q4_K / Q5_K: d sc (q . x) - dmin m (sum x)
        acc = fmaf(sd, float(us.sc0 * (lo + hi)), acc);
        return fmaf(-smin, float(us.sc1 * (sum_lo + sum_hi)), acc);
    }
}

// The contract for one unit and one token: the products of its scales with dx, then the dots.
template <int TYPE>
__device__ __forceinline__ float apply_dots(const UnitScales &us, int lo, int hi, float dx, int sum_lo, int sum_hi,
                                            float acc) {
    return apply_scaled_dots<TYPE>(us, us.d * dx, has_min(TYPE) ? us.dmin * dx : 0.f, lo, hi, sum_lo, sum_hi, acc);
}

// The summation order of one (row, token) output, fixed by the row's length alone. The row's
// units form groups of SLOTS (group k: units SLOTS k .. SLOTS k + SLOTS - 1) and the groups
// PARTS runs of whole groups (row_parts, part_begin). In a part, unit u goes to slot u % SLOTS,
// each slot sums its units in increasing u with apply_dots from 0, and the slots meet in the
// tree of slot_tree; the parts' sums are then added left to right, ((p0 + p1) + p2) + p3.
// Eight slots: the dp4a kernel gives each (part, slot) a lane (eight lanes read a 256-element
// block's eight units side by side, coalesced), the tensor-core kernel each slot a warp, which
// walks the parts in turn. Parts exist for the matrices of long rows and few of them (the 27B's
// FFN down, ssm_out, attention output: 5120 rows): eight lanes per row were too few threads to
// keep DRAM busy at one token.
constexpr int MAX_PARTS = 4;

// 1 part below 24 groups (6144 values), 2 below 64 (16384), 4 from there.
__host__ __device__ constexpr int row_parts(int n_in) {
    const int n_groups = (n_in / 32 + SLOTS - 1) / SLOTS;
    return n_groups >= 64 ? 4 : n_groups >= 24 ? 2 : 1;
}

// f(std::integral_constant<int, P>{}) for the row's part count P: kernels take it as a template
// parameter (the dp4a and fragment kernels' launchers).
template <class F>
void with_row_parts(int n_in, const F &f) {
    switch (row_parts(n_in)) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, MAX_PARTS>{});
    }
}

// The first group of part p (p == parts: the end).
__host__ __device__ constexpr int part_begin(int p, int n_groups, int parts) { return p * n_groups / parts; }

__device__ __forceinline__ float slot_tree(const float (&v)[SLOTS]) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// slot_tree over the SLOTS consecutive lanes that hold one output's slots (lane % SLOTS = slot),
// every lane of the group gets it: butterfly steps 4, 2, 1 form the same sums, since fp32
// addition is commutative (a lane adds its partner's partial to its own).
__device__ __forceinline__ float slot_tree_lanes(float v) {
    v += shfl_xor(v, 4);
    v += shfl_xor(v, 2);
    return v + shfl_xor(v, 1);
}

// The left-to-right sum of PARTS part sums held by the lanes SLOTS apart (part p at lane
// + SLOTS p), complete on the lanes of part 0. Every lane of the warp must call it.
template <int PARTS>
__device__ __forceinline__ float fold_parts_lanes(float v) {
    float r = v;
#pragma unroll
    for (int p = 1; p < PARTS; ++p) r += shfl_down(v, SLOTS * p);
    return r;
}

}  // namespace luce::gpu::int8_units
