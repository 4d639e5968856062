// quants_avx2.cpp — AVX2/FMA/F16C matmul kernels (compiled with -mavx2 -mfma -mf16c; entered
// only after the run-time check in quants_dispatch.cpp).
//
// y[t][r] = dot(W row r, x[t]) for a tile of NT <= 4 tokens at a time: each weight block is
// unpacked into registers once and applied to all NT tokens, so a verify/prefill batch reads
// the weights n_tok/4 times from cache instead of n_tok times.
//
// Quantized weights: x is quantized to int8 per block (quants_kernels.h), and each block's dot
// is an exact integer sum: _mm256_maddubs_epi16 (u8 weight codes x s8 activations, adjacent
// pairs summed to s16; the operands below are small enough that it never saturates) then
// _mm256_madd_epi16 with the sub-block scales (s16 x s16 pairs summed to s32). Per block one
// float FMA applies d_weight * d_act. Offsets (Q4_K/Q5_K mins, Q6_K's -32) come out of the
// per-16 activation sums, so the codes stay unsigned. Float weights: converted to fp32, FMA.
//
// Shapes: a row of n_cols elements is nb = n_cols/256 blocks (n_cols/32 for Q8_0); xq for token
// t is a.q + t*q_stride, its block scales a.d + t*nb, its per-16 sums a.sums16 + t*s_stride.
// The whole file is x86-64 only (other targets build the scalar level alone).
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "quants.h"
#include "quants_kernels.h"
#include "quants_lowbit.h"

namespace luce {
namespace avx2 {

namespace {

constexpr int kMaxTile = 4;

struct Tile {
    const uint8_t *w;  // row 0 of the weight matrix
    int64_t row_bytes, n_cols, r0, r1;
    const QuantizedActs *a;  // quantized activations (quantized weights)
    const float *x;          // fp32 activations (float weights), [n_tok][n_cols]
    int64_t t0;              // first token of the tile
    int64_t c0, c1;          // column range [c0, c1): c0 a multiple of 256
    bool accumulate;         // add to y (a later column chunk) instead of storing
    float *y;
    int64_t ldy;
};

inline void put(const Tile &t, int k, int64_t r, float v) {
    float &out = t.y[(t.t0 + k) * t.ldy + r];
    out = t.accumulate ? out + v : v;
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

inline uint16_t load_u16(const uint8_t *p) { return uint16_t(p[0] | (p[1] << 8)); }

inline float f16(const uint8_t *p) { return _cvtsh_ss(load_u16(p)); }

inline uint32_t u32_le(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// 16 x int16: lanes 0-7 = lo, lanes 8-15 = hi (maddubs lane i holds elements 2i, 2i+1, so this
// scales elements 0-15 by lo and 16-31 by hi).
inline __m256i scale_pair(int16_t lo, int16_t hi) {
    return _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
}

template <int NT>
inline void store_tile(const Tile &t, int64_t r, const __m256 *acc) {
    for (int k = 0; k < NT; ++k) put(t, k, r, hsum(acc[k]));
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q5_K: f16 d; f16 dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8 qs[128].
// value = d*sc_j*q - dmin*m_j with q in 0..15 (0..31 for Q5_K), j = sub-block of 32.

// The 12 packed bytes -> sc[0..7], m[0..7] (spec §4 unpack, four bytes at a time).
inline void unpack_k_scales(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    uint32_t u0, u1, u2;
    std::memcpy(&u0, q, 4);
    std::memcpy(&u1, q + 4, 4);
    std::memcpy(&u2, q + 8, 4);
    const uint32_t sc_lo = u0 & 0x3F3F3F3Fu, m_lo = u1 & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4);
    std::memcpy(sc, &sc_lo, 4);
    std::memcpy(sc + 4, &sc_hi, 4);
    std::memcpy(m, &m_lo, 4);
    std::memcpy(m + 4, &m_hi, 4);
}

template <int NT, bool Q5>
void q45_k_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    for (int64_t r = t.r0; r < t.r1; ++r) {
        __m256 acc[NT];
        for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        for (int64_t i = t.c0 / 256; i < t.c1 / 256; ++i) {
            const uint8_t *b = row + i * (Q5 ? 176 : 144);
            const float d = f16(b), dmin = f16(b + 2);
            uint8_t sc[8], m[8];
            unpack_k_scales(b + 4, sc, m);
            const uint8_t *qs = b + (Q5 ? 48 : 16);
            // q[2c] = elements 64c..64c+31 (low nibbles), q[2c+1] = 64c+32.. (high nibbles).
            __m256i q[8];
            __m256i hbits = Q5 ? load256(b + 16) : _mm256_setzero_si256();
            for (int c = 0; c < 4; ++c) {
                const __m256i raw = load256(qs + 32 * c);
                q[2 * c] = _mm256_and_si256(raw, low4);
                q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                if (Q5) {
                    // bit 2c of qh[l] is the 5th bit of element 64c+l, bit 2c+1 of 64c+32+l.
                    q[2 * c] = _mm256_or_si256(q[2 * c], _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
                    q[2 * c + 1] = _mm256_or_si256(
                        q[2 * c + 1], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4));
                    hbits = _mm256_srli_epi16(hbits, 2);
                }
            }
            // mins m_j against the per-16 activation sums: m duplicated per 16-value half.
            const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(m)));
            const __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
            __m256i scv[8];
            for (int j = 0; j < 8; ++j) scv[j] = _mm256_set1_epi16(sc[j]);
            for (int k = 0; k < NT; ++k) {
                const int64_t tok = t.t0 + k;
                const int8_t *xq = t.a->q + tok * t.a->q_stride + i * 256;
                __m256i sumi = _mm256_setzero_si256();
                for (int j = 0; j < 8; ++j) {
                    const __m256i p = _mm256_maddubs_epi16(q[j], load256(xq + 32 * j));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scv[j]));
                }
                const __m256i summ = _mm256_madd_epi16(load256(t.a->sums16 + tok * t.a->s_stride + i * 16), mins);
                const float dx = t.a->d[tok * nb + i];
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi), acc[k]);
                acc[k] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(summ), acc[k]);
            }
        }
        store_tile<NT>(t, r, acc);
    }
}

template <int NT> void q4_k_tile(const Tile &t) { q45_k_tile<NT, false>(t); }
template <int NT> void q5_k_tile(const Tile &t) { q45_k_tile<NT, true>(t); }

// ---------------------------------------------------------------------------------------------
// Q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. value = d*sc[e/16]*(q - 32), q in 0..63.

template <int NT>
void q6_k_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03);
    for (int64_t r = t.r0; r < t.r1; ++r) {
        __m256 acc[NT];
        for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        for (int64_t i = t.c0 / 256; i < t.c1 / 256; ++i) {
            const uint8_t *b = row + i * 210;
            const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192);
            const float d = f16(b + 208);
            // q[4h + k] = elements 128h + 32k .. +31 (spec §4: q1..q4 of half h).
            __m256i q[8];
            for (int h = 0; h < 2; ++h) {
                const __m256i A = load256(b + 64 * h), B = load256(b + 64 * h + 32);
                const __m256i H = load256(b + 128 + 32 * h);
                q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(A, low4),
                                               _mm256_slli_epi16(_mm256_and_si256(H, low2), 4));
                q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(B, low4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), low2), 4));
                q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), low4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), low2), 4));
                q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), low4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), low2), 4));
            }
            __m256i scv[8];
            for (int j = 0; j < 8; ++j) scv[j] = scale_pair(sc[2 * j], sc[2 * j + 1]);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sc)));
            for (int k = 0; k < NT; ++k) {
                const int64_t tok = t.t0 + k;
                const int8_t *xq = t.a->q + tok * t.a->q_stride + i * 256;
                __m256i sumi = _mm256_setzero_si256();
                for (int j = 0; j < 8; ++j) {
                    const __m256i p = _mm256_maddubs_epi16(q[j], load256(xq + 32 * j));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scv[j]));
                }
                // the -32 offset: sum_j sc[j] * 32 * (sum of the 16 activations of sub-block j)
                const __m256i off = _mm256_madd_epi16(load256(t.a->sums16 + tok * t.a->s_stride + i * 16), sc16);
                sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * t.a->d[tok * nb + i]), _mm256_cvtepi32_ps(sumi), acc[k]);
            }
        }
        store_tile<NT>(t, r, acc);
    }
}

// ---------------------------------------------------------------------------------------------
// IQ4_XS: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. value = d*(ls-32)*K[code].
// Codes map to signed K values by a byte shuffle; maddubs needs an unsigned operand, so it
// gets |K| and the activation takes K's sign (_mm256_sign_epi8), |K| <= 127.

template <int NT>
void iq4_xs_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
    for (int64_t r = t.r0; r < t.r1; ++r) {
        __m256 acc[NT];
        for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        for (int64_t i = t.c0 / 256; i < t.c1 / 256; ++i) {
            const uint8_t *b = row + i * 136;
            const float d = f16(b);
            const uint16_t scales_h = load_u16(b + 2);
            // v[ib] = K values of sub-block ib: lane 0 = elements 0-15 (low nibbles of its 16
            // bytes), lane 1 = elements 16-31 (high nibbles).
            __m256i v[8], av[8], scv[8];
            for (int ib = 0; ib < 8; ++ib) {
                const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 8 + 16 * ib));
                const __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
                v[ib] = _mm256_shuffle_epi8(table, codes);
                av[ib] = _mm256_sign_epi8(v[ib], v[ib]);
                const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
                scv[ib] = _mm256_set1_epi16(int16_t(ls - 32));
            }
            for (int k = 0; k < NT; ++k) {
                const int64_t tok = t.t0 + k;
                const int8_t *xq = t.a->q + tok * t.a->q_stride + i * 256;
                __m256i sumi = _mm256_setzero_si256();
                for (int ib = 0; ib < 8; ++ib) {
                    const __m256i sx = _mm256_sign_epi8(load256(xq + 32 * ib), v[ib]);
                    const __m256i p = _mm256_maddubs_epi16(av[ib], sx);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scv[ib]));
                }
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * t.a->d[tok * nb + i]), _mm256_cvtepi32_ps(sumi), acc[k]);
            }
        }
        store_tile<NT>(t, r, acc);
    }
}

// ---------------------------------------------------------------------------------------------
// Q8_0: f16 d; i8 qs[32]. Activations in blocks of 32 too; |w| <= 128, |x| <= 127, so the
// maddubs pair sums stay below 2^15.

template <int NT>
void q8_0_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 32;
    const int64_t i_end = t.c1 / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t r = t.r0; r < t.r1; ++r) {
        __m256 acc[NT];
        for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        for (int64_t i = t.c0 / 32; i < i_end; ++i) {
            const uint8_t *b = row + i * 34;
            const float d = f16(b);
            const __m256i w = load256(b + 2);
            const __m256i aw = _mm256_sign_epi8(w, w);
            for (int k = 0; k < NT; ++k) {
                const int64_t tok = t.t0 + k;
                const __m256i sx = _mm256_sign_epi8(load256(t.a->q + tok * t.a->q_stride + i * 32), w);
                const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * t.a->d[tok * nb + i]), _mm256_cvtepi32_ps(s), acc[k]);
            }
        }
        store_tile<NT>(t, r, acc);
    }
}

// ---------------------------------------------------------------------------------------------
// The legacy 32-element types: f16 d; (Q4_1 / Q5_1: f16 m;) (Q5_0 / Q5_1: u32 qh;) u8 qs[16];
// IQ4_NL: f16 d; u8 qs[16]. Element j: code = nibble j / 16 of qs[j % 16] (| bit j of qh << 4);
// value d (code - 8) for Q4_0, d (code - 16) for Q5_0, d code + m for Q4_1 / Q5_1, d K[code] for
// IQ4_NL. One activation block per weight block. Q4_0 / Q5_0 / IQ4_NL go through the signed
// weights of Q8_0's dot (|w| <= 127); Q4_1 / Q5_1 keep their unsigned codes (maddubs' unsigned
// operand) and add m times the block's activation sum (two 16-sums) once per block.

template <int TYPE>
constexpr int legacy_qs_at() {
    return TYPE == GGML_Q4_1 ? 4 : TYPE == GGML_Q5_0 ? 6 : TYPE == GGML_Q5_1 ? 8 : 2;
}

// The 32 codes of a block, elements 0-15 in lane 0 and 16-31 in lane 1, Q5's 5th bits included.
template <int TYPE>
inline __m256i legacy_codes(const uint8_t *b) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + legacy_qs_at<TYPE>()));
    __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
    if constexpr (TYPE == GGML_Q5_0 || TYPE == GGML_Q5_1) {
        const uint32_t qh = u32_le(b + (TYPE == GGML_Q5_0 ? 2 : 4));
        const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                                                  _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                                     0x0303030303030303));
        const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    return codes;
}

// The 32 weights of a block as maddubs takes them: signed values (Q8_0 as stored, Q4_0 / Q5_0
// less their zero point, IQ4_NL looked up), or Q4_1 / Q5_1's unsigned codes.
template <int TYPE>
inline __m256i block32_weights(const uint8_t *b, __m256i iq4nl_table) {
    constexpr bool with_m = TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1;
    if constexpr (TYPE == GGML_Q8_0) return load256(b + 2);
    const __m256i codes = legacy_codes<TYPE>(b);
    if constexpr (with_m) return codes;
    if constexpr (TYPE == GGML_IQ4_NL) return _mm256_shuffle_epi8(iq4nl_table, codes);
    return _mm256_sub_epi8(codes, _mm256_set1_epi8(TYPE == GGML_Q4_0 ? 8 : 16));
}

template <int TYPE, int NT>
void legacy32_tile(const Tile &t) {
    constexpr bool with_m = TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1;
    const int64_t nb = t.n_cols / 32, i_end = t.c1 / 32, bytes = type_traits(TYPE)->block_bytes;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
    for (int64_t r = t.r0; r < t.r1; ++r) {
        __m256 acc[NT];
        float offset[NT] = {};
        for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        for (int64_t i = t.c0 / 32; i < i_end; ++i) {
            const uint8_t *b = row + i * bytes;
            const float d = f16(b);
            const __m256i w = block32_weights<TYPE>(b, table);
            const __m256i aw = with_m ? w : _mm256_sign_epi8(w, w);  // Q4_1 / Q5_1: no signs to move
            for (int k = 0; k < NT; ++k) {
                const int64_t tok = t.t0 + k;
                const __m256i x = load256(t.a->q + tok * t.a->q_stride + i * 32);
                const __m256i sx = with_m ? x : _mm256_sign_epi8(x, w);
                const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                const float dx = t.a->d[tok * nb + i];
                acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(s), acc[k]);
                if constexpr (with_m) {
                    const int16_t *sums = t.a->sums16 + tok * t.a->s_stride + 2 * i;
                    offset[k] += f16(b + 2) * dx * float(sums[0] + sums[1]);
                }
            }
        }
        for (int k = 0; k < NT; ++k) put(t, k, r, hsum(acc[k]) + offset[k]);
    }
}

// Prompt prefill (matmul_rows' `prefill`): four rows at a time. With one scale per 32 weights,
// the float work per block and row (convert, scale, FMA) costs about as much as the integer dot;
// two hadd levels pack four rows' 8-lane dots into one vector, lanes 0-3 = the rows' elements
// 0-15 and lanes 4-7 = their elements 16-31, so a block takes one convert and one FMA for four
// rows, and each activation load serves four rows. Another summation order than the kernels
// above (prefill rows need not match one-token steps); a group short of four rows repeats its
// last row, so a row's bits do not depend on its neighbours. Not for decode: a lone token is
// memory-bound, and four row streams at once measured slower there.

// The f16 at byte `at` of four blocks as fp32, in both 128-bit lanes.
inline __m256 four_f16(const uint8_t *const b[4], int at) {
    const __m128i h = _mm_setr_epi16(short(load_u16(b[0] + at)), short(load_u16(b[1] + at)),
                                     short(load_u16(b[2] + at)), short(load_u16(b[3] + at)), 0, 0, 0, 0);
    const __m128 f = _mm_cvtph_ps(h);
    return _mm256_set_m128(f, f);
}

template <int TYPE, int NT>
void block32_rows4_tile(const Tile &t) {
    constexpr bool with_m = TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1;
    const int64_t nb = t.n_cols / 32, i_end = t.c1 / 32, bytes = type_traits(TYPE)->block_bytes;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
    for (int64_t r = t.r0; r < t.r1; r += 4) {
        const uint8_t *rows[4];
        for (int j = 0; j < 4; ++j) rows[j] = t.w + (r + j < t.r1 ? r + j : t.r1 - 1) * t.row_bytes;
        __m256 acc[NT];
        __m128 offset[NT];  // Q4_1 / Q5_1: the rows' sums of m dx xsum
        for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps(), offset[k] = _mm_setzero_ps();
        for (int64_t i = t.c0 / 32; i < i_end; ++i) {
            const uint8_t *b[4] = {rows[0] + i * bytes, rows[1] + i * bytes, rows[2] + i * bytes, rows[3] + i * bytes};
            __m256i w[4], aw[4];
            for (int j = 0; j < 4; ++j) {
                w[j] = block32_weights<TYPE>(b[j], table);
                aw[j] = with_m ? w[j] : _mm256_sign_epi8(w[j], w[j]);
            }
            const __m256 d = four_f16(b, 0);
            for (int k = 0; k < NT; ++k) {
                const int64_t tok = t.t0 + k;
                const __m256i x = load256(t.a->q + tok * t.a->q_stride + i * 32);
                __m256i s[4];
                for (int j = 0; j < 4; ++j)
                    s[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], with_m ? x : _mm256_sign_epi8(x, w[j])), ones);
                const __m256i dots = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
                const float dx = t.a->d[tok * nb + i];
                acc[k] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(dots), acc[k]);
                if constexpr (with_m) {
                    const int16_t *sums = t.a->sums16 + tok * t.a->s_stride + 2 * i;
                    const __m128 m = _mm256_castps256_ps128(four_f16(b, 2));
                    offset[k] = _mm_fmadd_ps(m, _mm_set1_ps(dx * float(sums[0] + sums[1])), offset[k]);
                }
            }
        }
        for (int k = 0; k < NT; ++k) {
            alignas(16) float out[4];
            _mm_store_ps(out, _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(acc[k]), _mm256_extractf128_ps(acc[k], 1)),
                                         offset[k]));
            for (int j = 0; j < 4 && r + j < t.r1; ++j) put(t, k, r + j, out[j]);
        }
    }
}

template <int NT> void q4_0_tile(const Tile &t) { legacy32_tile<GGML_Q4_0, NT>(t); }
template <int NT> void q4_1_tile(const Tile &t) { legacy32_tile<GGML_Q4_1, NT>(t); }
template <int NT> void q5_0_tile(const Tile &t) { legacy32_tile<GGML_Q5_0, NT>(t); }
template <int NT> void q5_1_tile(const Tile &t) { legacy32_tile<GGML_Q5_1, NT>(t); }
template <int NT> void iq4_nl_tile(const Tile &t) { legacy32_tile<GGML_IQ4_NL, NT>(t); }
template <int NT> void q8_0_rows4(const Tile &t) { block32_rows4_tile<GGML_Q8_0, NT>(t); }
template <int NT> void q4_0_rows4(const Tile &t) { block32_rows4_tile<GGML_Q4_0, NT>(t); }
template <int NT> void q4_1_rows4(const Tile &t) { block32_rows4_tile<GGML_Q4_1, NT>(t); }
template <int NT> void q5_0_rows4(const Tile &t) { block32_rows4_tile<GGML_Q5_0, NT>(t); }
template <int NT> void q5_1_rows4(const Tile &t) { block32_rows4_tile<GGML_Q5_1, NT>(t); }
template <int NT> void iq4_nl_rows4(const Tile &t) { block32_rows4_tile<GGML_IQ4_NL, NT>(t); }

// ---------------------------------------------------------------------------------------------
// The 1-3-bit types (quants_lowbit.h): each 32-element unit decoded to int8 codes q with a small
// integer scale per 16-element half (lowbit_unit_int, the decoder the scalar path and the GPU
// share), then the same integer dot as IQ4_XS: |q| <= 62 and scales <= 32 in magnitude keep
// maddubs below 2^15 and a block's sum far below 2^31. One FMA per block applies d * d_act; Q2_K's
// mins come off the per-16 activation sums, as Q4_K's do.

struct F16cHalf {
    static float of(uint32_t h) { return _cvtsh_ss(uint16_t(h)); }
};

// 32 magnitudes with their signs: element i negated where bit i of `signs` is set.
inline __m256i apply_signs(__m256i magnitudes, uint32_t signs) {
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(signs)),
                                              _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                                 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    const __m256i negative = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_sign_epi8(magnitudes, _mm256_or_si256(negative, _mm256_set1_epi8(1)));
}

inline uint32_t iq2_sign_word(uint32_t aux) {  // four 7-bit indices of kIq2Signs -> 32 sign bits
    return uint32_t(kIq2Signs[aux & 127]) | uint32_t(kIq2Signs[(aux >> 7) & 127]) << 8 |
           uint32_t(kIq2Signs[(aux >> 14) & 127]) << 16 | uint32_t(kIq2Signs[(aux >> 21) & 127]) << 24;
}

// IQ1: 8 g + 1, or 8 g - 1 where the entry's delta is negative (g = -1, 0, 1).
inline __m256i iq1_codes(__m256i g, __m256i minus) {
    const __m256i g2 = _mm256_add_epi8(g, g), g4 = _mm256_add_epi8(g2, g2);
    return _mm256_add_epi8(_mm256_add_epi8(g4, g4), _mm256_or_si256(minus, _mm256_set1_epi8(1)));
}

// Unit j of a block as int8 codes, the two half scales and (Q2_K) the two half mins: the numbers
// lowbit_unit_int gives (tests hold every SIMD level to gguf.quants), with the grid lookups,
// signs and bit fields vectorized.
template <int TYPE>
inline __m256i unit_codes(const uint8_t *b, int j, int &s0, int &s1, int *mins) {
    using namespace lowbit;
    if constexpr (TYPE == GGML_IQ2_XXS) {
        const uint32_t grid = u32_le(b + 2 + 8 * j), aux = u32_le(b + 6 + 8 * j);
        s0 = s1 = 2 * int(aux >> 28) + 1;
        const __m256i mag = _mm256_setr_epi64x(int64_t(kIq2xxsGrid[grid & 0xFF]), int64_t(kIq2xxsGrid[(grid >> 8) & 0xFF]),
                                               int64_t(kIq2xxsGrid[(grid >> 16) & 0xFF]), int64_t(kIq2xxsGrid[grid >> 24]));
        return apply_signs(mag, iq2_sign_word(aux));
    } else if constexpr (TYPE == GGML_IQ2_XS) {
        uint32_t v[4];
        for (int k = 0; k < 4; ++k) v[k] = u16_at(b + 2 + 2 * (4 * j + k));
        s0 = 2 * (b[66 + j] & 0xF) + 1, s1 = 2 * (b[66 + j] >> 4) + 1;
        const __m256i mag = _mm256_setr_epi64x(int64_t(kIq2xsGrid[v[0] & 511]), int64_t(kIq2xsGrid[v[1] & 511]),
                                               int64_t(kIq2xsGrid[v[2] & 511]), int64_t(kIq2xsGrid[v[3] & 511]));
        const uint32_t signs = uint32_t(kIq2Signs[v[0] >> 9]) | uint32_t(kIq2Signs[v[1] >> 9]) << 8 |
                               uint32_t(kIq2Signs[v[2] >> 9]) << 16 | uint32_t(kIq2Signs[v[3] >> 9]) << 24;
        return apply_signs(mag, signs);
    } else if constexpr (TYPE == GGML_IQ2_S) {
        const int qh = b[66 + j];
        s0 = 2 * (b[74 + j] & 0xF) + 1, s1 = 2 * (b[74 + j] >> 4) + 1;
        const uint8_t *qs = b + 2 + 4 * j;
        const __m256i mag = _mm256_setr_epi64x(
            int64_t(kIq2sGrid[qs[0] | (qh & 3) << 8]), int64_t(kIq2sGrid[qs[1] | ((qh >> 2) & 3) << 8]),
            int64_t(kIq2sGrid[qs[2] | ((qh >> 4) & 3) << 8]), int64_t(kIq2sGrid[qs[3] | ((qh >> 6) & 3) << 8]));
        return apply_signs(mag, u32_le(b + 34 + 4 * j));
    } else if constexpr (TYPE == GGML_IQ3_XXS) {
        const uint32_t aux = u32_le(b + 66 + 4 * j);
        s0 = s1 = 2 * int(aux >> 28) + 1;
        const uint8_t *qs = b + 2 + 8 * j;
        const __m256i mag = _mm256_setr_epi32(int(kIq3xxsGrid[qs[0]]), int(kIq3xxsGrid[qs[1]]), int(kIq3xxsGrid[qs[2]]),
                                              int(kIq3xxsGrid[qs[3]]), int(kIq3xxsGrid[qs[4]]), int(kIq3xxsGrid[qs[5]]),
                                              int(kIq3xxsGrid[qs[6]]), int(kIq3xxsGrid[qs[7]]));
        return apply_signs(mag, iq2_sign_word(aux));
    } else if constexpr (TYPE == GGML_IQ3_S) {
        s0 = s1 = 1 + 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 0xF);
        const uint8_t *qs = b + 2 + 8 * j;
        const int qh = b[66 + j];
        int idx[8];
        for (int k = 0; k < 8; ++k) idx[k] = qs[k] | ((qh >> k) & 1) << 8;
        const __m256i mag = _mm256_setr_epi32(int(kIq3sGrid[idx[0]]), int(kIq3sGrid[idx[1]]), int(kIq3sGrid[idx[2]]),
                                              int(kIq3sGrid[idx[3]]), int(kIq3sGrid[idx[4]]), int(kIq3sGrid[idx[5]]),
                                              int(kIq3sGrid[idx[6]]), int(kIq3sGrid[idx[7]]));
        return apply_signs(mag, u32_le(b + 74 + 4 * j));
    } else if constexpr (TYPE == GGML_IQ1_S) {
        const uint32_t qh = u16_at(b + 34 + 2 * j);
        s0 = s1 = 2 * int((qh >> 12) & 7) + 1;
        const uint8_t *qs = b + 2 + 4 * j;
        const __m256i g = _mm256_setr_epi64x(
            int64_t(kIq1sGrid[qs[0] | (qh & 7) << 8]), int64_t(kIq1sGrid[qs[1] | ((qh >> 3) & 7) << 8]),
            int64_t(kIq1sGrid[qs[2] | ((qh >> 6) & 7) << 8]), int64_t(kIq1sGrid[qs[3] | ((qh >> 9) & 7) << 8]));
        return iq1_codes(g, _mm256_set1_epi8(qh & 0x8000 ? -1 : 0));
    } else if constexpr (TYPE == GGML_IQ1_M) {
        const uint8_t *qs = b + 4 * j, *sc = b + 48;
        const uint32_t qh = u16_at(b + 32 + 2 * j);  // four nibbles: 3 high index bits + delta sign
        const uint32_t scales = u16_at(sc + 2 * (j / 2)) >> (6 * (j % 2));
        s0 = 2 * int(scales & 7) + 1, s1 = 2 * int((scales >> 3) & 7) + 1;
        const __m256i g = _mm256_setr_epi64x(
            int64_t(kIq1sGrid[qs[0] | (qh & 7) << 8]), int64_t(kIq1sGrid[qs[1] | ((qh >> 4) & 7) << 8]),
            int64_t(kIq1sGrid[qs[2] | ((qh >> 8) & 7) << 8]), int64_t(kIq1sGrid[qs[3] | ((qh >> 12) & 7) << 8]));
        const __m256i minus = _mm256_setr_epi64x(qh & 0x8 ? -1 : 0, qh & 0x80 ? -1 : 0, qh & 0x800 ? -1 : 0,
                                                 qh & 0x8000 ? -1 : 0);
        return iq1_codes(g, minus);
    } else if constexpr (TYPE == GGML_Q2_K) {
        s0 = b[2 * j] & 0xF, s1 = b[2 * j + 1] & 0xF;
        mins[0] = b[2 * j] >> 4, mins[1] = b[2 * j + 1] >> 4;
        const __m256i qs = load256(b + 16 + 32 * (j / 4));
        return _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * (j % 4))), _mm256_set1_epi8(3));
    } else {
        static_assert(TYPE == GGML_Q3_K, "every 1-3-bit type has a decoder");
        const uint8_t *sc = b + 96;
        int half[2];
        for (int h = 0; h < 2; ++h) {
            const int i = 2 * j + h;
            const int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4, hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
            half[h] = (lo | hi << 4) - 32;
        }
        s0 = half[0], s1 = half[1];
        const __m256i qs = load256(b + 32 + 32 * (j / 4)), hmask = load256(b);
        const __m256i low = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * (j % 4))), _mm256_set1_epi8(3));
        const __m256i bit = _mm256_set1_epi8(char(1 << j));
        const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), _mm256_setzero_si256());
        return _mm256_sub_epi8(low, _mm256_and_si256(clear, _mm256_set1_epi8(4)));  // -4 where bit j is clear
    }
}

// The per-block factors: d in the units' integer form (lowbit_unit_int's u.d) and Q2_K's dmin.
template <int TYPE>
inline void block_factors(const uint8_t *b, float &d, float &dmin) {
    if constexpr (TYPE == GGML_IQ2_XXS || TYPE == GGML_IQ2_XS || TYPE == GGML_IQ2_S || TYPE == GGML_IQ1_S) {
        d = f16(b) * 0.125f, dmin = 0.0f;
    } else if constexpr (TYPE == GGML_IQ3_XXS) {
        d = f16(b) * 0.25f, dmin = 0.0f;
    } else if constexpr (TYPE == GGML_IQ3_S) {
        d = f16(b), dmin = 0.0f;
    } else if constexpr (TYPE == GGML_IQ1_M) {
        LowbitIntUnit u;  // d is spread over the four scale words
        lowbit::iq1_m_int<F16cHalf>(b, 0, u);
        d = u.d, dmin = 0.0f;
    } else if constexpr (TYPE == GGML_Q2_K) {
        d = f16(b + 80), dmin = f16(b + 82);
    } else {
        d = f16(b + 108), dmin = 0.0f;
    }
}

// One block unpacked for the integer dots: codes q, |q| for maddubs, the half scales, and the
// per-block factors.
struct LowbitBlock {
    __m256i q[8], aq[8], scv[8];
    __m256i mins;  // Q2_K: the 16 half mins as int16
    float d, dmin;
};

template <int TYPE>
inline void decode_block(const uint8_t *b, LowbitBlock &blk) {
    block_factors<TYPE>(b, blk.d, blk.dmin);
    int mins[16] = {};
    for (int j = 0; j < 8; ++j) {
        int s0, s1;
        blk.q[j] = unit_codes<TYPE>(b, j, s0, s1, mins + 2 * j);
        blk.aq[j] = _mm256_sign_epi8(blk.q[j], blk.q[j]);
        blk.scv[j] = scale_pair(int16_t(s0), int16_t(s1));
    }
    if constexpr (TYPE == GGML_Q2_K)
        blk.mins = _mm256_setr_epi16(mins[0], mins[1], mins[2], mins[3], mins[4], mins[5], mins[6], mins[7], mins[8],
                                     mins[9], mins[10], mins[11], mins[12], mins[13], mins[14], mins[15]);
}

// acc + this block's contribution to token tok's dot (block i of nb in the row).
template <int TYPE>
inline __m256 block_dot(const LowbitBlock &blk, const QuantizedActs &a, int64_t tok, int64_t i, int64_t nb, __m256 acc) {
    const int8_t *xq = a.q + tok * a.q_stride + i * 256;
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
        const __m256i p = _mm256_maddubs_epi16(blk.aq[j], _mm256_sign_epi8(load256(xq + 32 * j), blk.q[j]));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, blk.scv[j]));
    }
    const float dx = a.d[tok * nb + i];
    acc = _mm256_fmadd_ps(_mm256_set1_ps(blk.d * dx), _mm256_cvtepi32_ps(sumi), acc);
    if constexpr (TYPE == GGML_Q2_K) {  // the mins against the per-16 activation sums, as Q4_K's
        const __m256i summ = _mm256_madd_epi16(load256(a.sums16 + tok * a.s_stride + i * 16), blk.mins);
        acc = _mm256_fnmadd_ps(_mm256_set1_ps(blk.dmin * dx), _mm256_cvtepi32_ps(summ), acc);
    }
    return acc;
}

template <int TYPE, int NT>
void lowbit_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 256;
    for (int64_t r = t.r0; r < t.r1; ++r) {
        __m256 acc[NT];
        for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        for (int64_t i = t.c0 / 256; i < t.c1 / 256; ++i) {
            LowbitBlock blk;
            decode_block<TYPE>(row + i * lowbit_block_bytes(TYPE), blk);
            for (int k = 0; k < NT; ++k) acc[k] = block_dot<TYPE>(blk, *t.a, t.t0 + k, i, nb, acc[k]);
        }
        store_tile<NT>(t, r, acc);
    }
}

// More tokens than a tile (prefill, verify): the unpacking costs as much as several tokens' dots,
// so each block is unpacked once and applied to every token (their activations for one block,
// n_tok x 256 bytes, stay in L2), instead of once per tile of 4.
template <int TYPE>
void lowbit_all_tokens(const Tile &t, int64_t n_tok) {
    struct Lanes {
        __m256 v;
    };
    const int64_t nb = t.n_cols / 256;
    static thread_local std::vector<Lanes> acc;
    if (acc.size() < size_t(n_tok)) acc.resize(size_t(n_tok));
    for (int64_t r = t.r0; r < t.r1; ++r) {
        for (int64_t tok = 0; tok < n_tok; ++tok) acc[tok].v = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        for (int64_t i = 0; i < nb; ++i) {
            LowbitBlock blk;
            decode_block<TYPE>(row + i * lowbit_block_bytes(TYPE), blk);
            for (int64_t tok = 0; tok < n_tok; ++tok) acc[tok].v = block_dot<TYPE>(blk, *t.a, tok, i, nb, acc[tok].v);
        }
        for (int64_t tok = 0; tok < n_tok; ++tok) t.y[tok * t.ldy + r] = hsum(acc[tok].v);
    }
}

using AllTokensFn = void (*)(const Tile &, int64_t);

AllTokensFn lowbit_all_tokens_for(int32_t type) {
    switch (type) {
        case GGML_Q2_K: return lowbit_all_tokens<GGML_Q2_K>;
        case GGML_Q3_K: return lowbit_all_tokens<GGML_Q3_K>;
        case GGML_IQ2_XXS: return lowbit_all_tokens<GGML_IQ2_XXS>;
        case GGML_IQ2_XS: return lowbit_all_tokens<GGML_IQ2_XS>;
        case GGML_IQ2_S: return lowbit_all_tokens<GGML_IQ2_S>;
        case GGML_IQ3_XXS: return lowbit_all_tokens<GGML_IQ3_XXS>;
        case GGML_IQ3_S: return lowbit_all_tokens<GGML_IQ3_S>;
        case GGML_IQ1_S: return lowbit_all_tokens<GGML_IQ1_S>;
        case GGML_IQ1_M: return lowbit_all_tokens<GGML_IQ1_M>;
        default: return nullptr;
    }
}

template <int NT> void q2_k_tile(const Tile &t) { lowbit_tile<GGML_Q2_K, NT>(t); }
template <int NT> void q3_k_tile(const Tile &t) { lowbit_tile<GGML_Q3_K, NT>(t); }
template <int NT> void iq2_xxs_tile(const Tile &t) { lowbit_tile<GGML_IQ2_XXS, NT>(t); }
template <int NT> void iq2_xs_tile(const Tile &t) { lowbit_tile<GGML_IQ2_XS, NT>(t); }
template <int NT> void iq2_s_tile(const Tile &t) { lowbit_tile<GGML_IQ2_S, NT>(t); }
template <int NT> void iq3_xxs_tile(const Tile &t) { lowbit_tile<GGML_IQ3_XXS, NT>(t); }
template <int NT> void iq3_s_tile(const Tile &t) { lowbit_tile<GGML_IQ3_S, NT>(t); }
template <int NT> void iq1_s_tile(const Tile &t) { lowbit_tile<GGML_IQ1_S, NT>(t); }
template <int NT> void iq1_m_tile(const Tile &t) { lowbit_tile<GGML_IQ1_M, NT>(t); }

// ---------------------------------------------------------------------------------------------
// F32 / F16 / BF16: 8 weights -> fp32 lanes, FMA with fp32 activations. Tail (< 8) scalar.

template <int32_t Type>
inline __m256 load_w8(const uint8_t *p) {
    if (Type == GGML_F32) return _mm256_loadu_ps(reinterpret_cast<const float *>(p));
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
    if (Type == GGML_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
}

template <int32_t Type>
inline float load_w1(const uint8_t *p) {
    if (Type == GGML_F32) {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    if (Type == GGML_F16) return f16(p);
    const uint32_t bits = uint32_t(load_u16(p)) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

template <int32_t Type, int NT>
void float_tile(const Tile &t) {
    constexpr int64_t es = Type == GGML_F32 ? 4 : 2;  // bytes per element
    const int64_t n8 = t.c0 + (t.c1 - t.c0) / 8 * 8;
    for (int64_t r = t.r0; r < t.r1; ++r) {
        // two accumulators per token so a lone token is not bound by FMA latency
        __m256 acc[NT][2];
        for (int k = 0; k < NT; ++k) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
        const uint8_t *row = t.w + r * t.row_bytes;
        int64_t c = t.c0;
        for (; c + 16 <= n8; c += 16) {
            const __m256 w0 = load_w8<Type>(row + c * es), w1 = load_w8<Type>(row + (c + 8) * es);
            for (int k = 0; k < NT; ++k) {
                const float *xt = t.x + (t.t0 + k) * t.n_cols + c;
                acc[k][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), acc[k][0]);
                acc[k][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), acc[k][1]);
            }
        }
        for (; c < n8; c += 8) {
            const __m256 w0 = load_w8<Type>(row + c * es);
            for (int k = 0; k < NT; ++k)
                acc[k][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t.x + (t.t0 + k) * t.n_cols + c), acc[k][0]);
        }
        for (int k = 0; k < NT; ++k) {
            const float *xt = t.x + (t.t0 + k) * t.n_cols;
            float s = hsum(_mm256_add_ps(acc[k][0], acc[k][1]));
            for (int64_t e = n8; e < t.c1; ++e) s += load_w1<Type>(row + e * es) * xt[e];
            put(t, k, r, s);
        }
    }
}

template <int NT> void f32_tile(const Tile &t) { float_tile<GGML_F32, NT>(t); }
template <int NT> void f16_tile(const Tile &t) { float_tile<GGML_F16, NT>(t); }
template <int NT> void bf16_tile(const Tile &t) { float_tile<GGML_BF16, NT>(t); }

// ---------------------------------------------------------------------------------------------

using TileFn = void (*)(const Tile &);

#define LUCE_TILES(fn) {fn<1>, fn<2>, fn<3>, fn<4>}

const TileFn *tiles_for(int32_t type) {
    static const TileFn f32[] = LUCE_TILES(f32_tile), f16_[] = LUCE_TILES(f16_tile),
                        bf16[] = LUCE_TILES(bf16_tile), q8_0[] = LUCE_TILES(q8_0_tile),
                        q4_k[] = LUCE_TILES(q4_k_tile), q5_k[] = LUCE_TILES(q5_k_tile),
                        q6_k[] = LUCE_TILES(q6_k_tile), iq4_xs[] = LUCE_TILES(iq4_xs_tile),
                        q2_k[] = LUCE_TILES(q2_k_tile), q3_k[] = LUCE_TILES(q3_k_tile),
                        iq2_xxs[] = LUCE_TILES(iq2_xxs_tile), iq2_xs[] = LUCE_TILES(iq2_xs_tile),
                        iq2_s[] = LUCE_TILES(iq2_s_tile), iq3_xxs[] = LUCE_TILES(iq3_xxs_tile),
                        iq3_s[] = LUCE_TILES(iq3_s_tile), iq1_s[] = LUCE_TILES(iq1_s_tile),
                        iq1_m[] = LUCE_TILES(iq1_m_tile), q4_0[] = LUCE_TILES(q4_0_tile),
                        q4_1[] = LUCE_TILES(q4_1_tile), q5_0[] = LUCE_TILES(q5_0_tile),
                        q5_1[] = LUCE_TILES(q5_1_tile), iq4_nl[] = LUCE_TILES(iq4_nl_tile);
    switch (type) {
        case GGML_F32: return f32;
        case GGML_F16: return f16_;
        case GGML_BF16: return bf16;
        case GGML_Q8_0: return q8_0;
        case GGML_Q4_K: return q4_k;
        case GGML_Q5_K: return q5_k;
        case GGML_Q6_K: return q6_k;
        case GGML_IQ4_XS: return iq4_xs;
        case GGML_Q2_K: return q2_k;
        case GGML_Q3_K: return q3_k;
        case GGML_IQ2_XXS: return iq2_xxs;
        case GGML_IQ2_XS: return iq2_xs;
        case GGML_IQ2_S: return iq2_s;
        case GGML_IQ3_XXS: return iq3_xxs;
        case GGML_IQ3_S: return iq3_s;
        case GGML_IQ1_S: return iq1_s;
        case GGML_IQ1_M: return iq1_m;
        case GGML_Q4_0: return q4_0;
        case GGML_Q4_1: return q4_1;
        case GGML_Q5_0: return q5_0;
        case GGML_Q5_1: return q5_1;
        case GGML_IQ4_NL: return iq4_nl;
        default: return nullptr;
    }
}

// Prompt prefill's kernels where they differ from tiles_for's (the 32-element types' four-row
// kernels); null otherwise.
const TileFn *prefill_tiles_for(int32_t type) {
    static const TileFn q8_0[] = LUCE_TILES(q8_0_rows4), q4_0[] = LUCE_TILES(q4_0_rows4),
                        q4_1[] = LUCE_TILES(q4_1_rows4), q5_0[] = LUCE_TILES(q5_0_rows4),
                        q5_1[] = LUCE_TILES(q5_1_rows4), iq4_nl[] = LUCE_TILES(iq4_nl_rows4);
    switch (type) {
        case GGML_Q8_0: return q8_0;
        case GGML_Q4_0: return q4_0;
        case GGML_Q4_1: return q4_1;
        case GGML_Q5_0: return q5_0;
        case GGML_Q5_1: return q5_1;
        case GGML_IQ4_NL: return iq4_nl;
        default: return nullptr;
    }
}

}  // namespace

// The activation quantizer of quants_kernels.h, 32 values per step; bit-identical to
// quantize_block_scalar (max, the product and round-half-even are exact/correctly rounded).
void quantize_block(const float *x, int64_t block, int8_t *q, float *d) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 vmax = _mm256_setzero_ps();
    for (int64_t i = 0; i < block; i += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(abs_mask, _mm256_loadu_ps(x + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the lane-wise packs
    for (int64_t i = 0; i < block; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; ++k)
            v[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), vid),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(q + i), _mm256_permutevar8x32_epi32(packed, order));
    }
}

bool matmul_rows(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                 const float *x, int64_t n_tok, float *y, int64_t ldy, bool prefill) {
    const TileFn *fns = tiles_for(type);
    if (fns == nullptr) return false;
    if (prefill && prefill_tiles_for(type) != nullptr) fns = prefill_tiles_for(type);
    QuantizedActs a;
    const int64_t block = act_block(type);
    if (block != 0) a = quantize_acts(x, n_cols, n_tok, block, quantize_block);
    Tile t{static_cast<const uint8_t *>(w), row_bytes(type, n_cols), n_cols, 0, 0, &a, x, 0, 0, 0, false, y, ldy};
    if (n_tok > kMaxTile && is_lowbit_type(type)) {
        t.r0 = row_begin, t.r1 = row_end;
        lowbit_all_tokens_for(type)(t, n_tok);
        return true;
    }
    // Column passes, row blocks, token tiles, rows (reasons: quants_avx512.cpp). The passes are
    // those of a full tile whatever n_tok, so every row sums in the same order for every token
    // count; a lone token runs them row by row (each row still read front to back).
    const int64_t chunk = column_chunk(type, n_cols, kMaxTile);
    if (n_tok == 1 && chunk < n_cols) {
        for (t.r0 = row_begin; t.r0 < row_end; ++t.r0) {
            t.r1 = t.r0 + 1;
            for (t.c0 = 0; t.c0 < n_cols; t.c0 += chunk) {
                t.c1 = t.c0 + chunk < n_cols ? t.c0 + chunk : n_cols;
                t.accumulate = t.c0 > 0;
                fns[0](t);
            }
        }
        return true;
    }
    const int64_t slice_bytes = row_bytes(type, chunk) > 0 ? row_bytes(type, chunk) : 1;
    int64_t row_block = n_tok <= kMaxTile ? row_end - row_begin : (int64_t(1) << 20) / slice_bytes;
    if (row_block < 1) row_block = 1;
    for (t.c0 = 0; t.c0 < n_cols; t.c0 += chunk) {
        t.c1 = t.c0 + chunk < n_cols ? t.c0 + chunk : n_cols;
        t.accumulate = t.c0 > 0;
        for (int64_t rb0 = row_begin; rb0 < row_end; rb0 += row_block) {
            t.r0 = rb0;
            t.r1 = rb0 + row_block < row_end ? rb0 + row_block : row_end;
            for (t.t0 = 0; t.t0 < n_tok; t.t0 += kMaxTile) {
                const int64_t nt = n_tok - t.t0 < kMaxTile ? n_tok - t.t0 : kMaxTile;
                fns[nt - 1](t);
            }
        }
    }
    return true;
}

}  // namespace avx2
}  // namespace luce

#endif  // __x86_64__
