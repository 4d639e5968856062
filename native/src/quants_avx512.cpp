// quants_avx512.cpp — AVX-512 (F, BW, VL, VNNI) matmul kernels; entered only after the run-time
// check in quants_dispatch.cpp. Same numbers as quants_avx2.cpp (exact integer block sums, one
// fp32 FMA per block), twice the width and fewer instructions:
//   - a zmm holds 64 weight codes = two 32-element sub-blocks (or four 16-element ones for Q6_K);
//   - _mm512_maddubs_epi16 (u8 codes x s8 activations -> s16 pairs) then _mm512_dpwssd_epi32
//     (VNNI: s16 pairs x s16 sub-block scales, accumulated in s32) per 64 codes;
//   - AVX-512 has no sign_epi8: signed weight codes (Q8_0, IQ4_XS) use |w| and negate the
//     activation under the mask of negative weights (_mm512_mask_sub_epi8).
// Tiles of up to 4 tokens; everything else as in quants_avx2.cpp.
// The whole file is x86-64 only (other targets build the scalar level alone).
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#include "quants.h"
#include "quants_kernels.h"

namespace luce {
namespace avx2 {
void quantize_block(const float *x, int64_t block, int8_t *q, float *d);  // quants_avx2.cpp
}
namespace avx512 {

namespace {

constexpr int kMaxTile = 4;  // measured: 6 and 8 spill registers and run slower per token

struct Tile {
    const uint8_t *w;
    int64_t row_bytes, n_cols, r;  // one weight row per call
    const QuantizedActs *a;
    const float *x;
    int64_t t0;
    int64_t c0, c1;   // column range [c0, c1): c0 a multiple of 256
    bool accumulate;  // add to y (a later column chunk) instead of storing
    float *y;
    int64_t ldy;
};

inline void put_row(const Tile &t, int k, int64_t r, float v) {
    float &out = t.y[(t.t0 + k) * t.ldy + r];
    out = t.accumulate ? out + v : v;
}

inline void put(const Tile &t, int k, float v) { put_row(t, k, t.r, v); }

inline __m512i load512(const void *p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }
inline uint16_t load_u16(const uint8_t *p) { return uint16_t(p[0] | (p[1] << 8)); }
inline float f16(const uint8_t *p) { return _cvtsh_ss(load_u16(p)); }

inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// zmm of 32 int16 = [v0 x16 | v1 x16] picked from the int16 lanes of `src` by index.
inline __m512i pick_pair(__m512i src, int i0, int i1) {
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16(int16_t(i0)), _mm256_set1_epi16(int16_t(i1)), 1);
    return _mm512_permutexvar_epi16(idx, src);
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q5_K (layout and formula: quants_avx2.cpp). z[c] = elements 64c .. 64c+63.

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

// Shift counts per int16 lane: lower 256 bits by a, upper by b.
inline __m512i halves16(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi16(int16_t(a)), _mm256_set1_epi16(int16_t(b)), 1);
}

template <int NT, bool Q5>
void q45_k_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 256;
    const __m512i low4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    const __m512i nib_shift = halves16(0, 4), bit_shift = halves16(0, 1);
    __m512 acc[NT];
    __m256 accm[NT];
    for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps(), accm[k] = _mm256_setzero_ps();
    const uint8_t *row = t.w + t.r * t.row_bytes;
    for (int64_t i = t.c0 / 256; i < t.c1 / 256; ++i) {
        const uint8_t *b = row + i * (Q5 ? 176 : 144);
        const float d = f16(b), dmin = f16(b + 2);
        uint8_t sc[8], m[8];
        unpack_k_scales(b + 4, sc, m);
        const uint8_t *qs = b + (Q5 ? 48 : 16);
        __m512i z[4], scv[4];
        // 5th bits: lower half of each zmm takes bit 2c of qh[l], upper half bit 2c+1.
        __m512i hb = Q5 ? _mm512_srlv_epi16(_mm512_broadcast_i64x4(load256(b + 16)), bit_shift) : _mm512_setzero_si512();
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(sc))));
        for (int c = 0; c < 4; ++c) {
            const __m512i raw = _mm512_broadcast_i64x4(load256(qs + 32 * c));
            z[c] = _mm512_and_si512(_mm512_srlv_epi16(raw, nib_shift), low4);
            if (Q5) {
                z[c] = _mm512_or_si512(z[c], _mm512_slli_epi16(_mm512_and_si512(hb, one), 4));
                hb = _mm512_srli_epi16(hb, 2);
            }
            scv[c] = pick_pair(sc16, 2 * c, 2 * c + 1);
        }
        const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(m)));
        const __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
        for (int k = 0; k < NT; ++k) {
            const int64_t tok = t.t0 + k;
            const int8_t *xq = t.a->q + tok * t.a->q_stride + i * 256;
            __m512i sumi = _mm512_setzero_si512();
            for (int c = 0; c < 4; ++c)
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(z[c], load512(xq + 64 * c)), scv[c]);
            const __m256i summ = _mm256_madd_epi16(load256(t.a->sums16 + tok * t.a->s_stride + i * 16), mins);
            const float dx = t.a->d[tok * nb + i];
            acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(d * dx), _mm512_cvtepi32_ps(sumi), acc[k]);
            accm[k] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(summ), accm[k]);
        }
    }
    for (int k = 0; k < NT; ++k)
        put(t, k, _mm512_reduce_add_ps(acc[k]) - hsum256(accm[k]));
}

template <int NT> void q4_k_tile(const Tile &t) { q45_k_tile<NT, false>(t); }
template <int NT> void q5_k_tile(const Tile &t) { q45_k_tile<NT, true>(t); }

// ---------------------------------------------------------------------------------------------
// Q6_K: z[2h + j] = elements 128h + 64j .. +63; ql'[0..63] low nibbles give elements 0-63 of
// half h, high nibbles 64-127; the two qh bits come from shifting qh' by 0|2 resp. 4|6.

template <int NT>
void q6_k_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 256;
    const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
    const __m512i sh_lo = halves16(0, 2), sh_hi = halves16(4, 6);
    __m512i group_idx[4];  // int16 lanes 8g .. 8g+7 pick scale 4j + g
    for (int j = 0; j < 4; ++j) {
        const __m256i lo = _mm256_set_m128i(_mm_set1_epi16(int16_t(4 * j + 1)), _mm_set1_epi16(int16_t(4 * j)));
        const __m256i hi = _mm256_set_m128i(_mm_set1_epi16(int16_t(4 * j + 3)), _mm_set1_epi16(int16_t(4 * j + 2)));
        group_idx[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    __m512 acc[NT];
    for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
    const uint8_t *row = t.w + t.r * t.row_bytes;
    for (int64_t i = t.c0 / 256; i < t.c1 / 256; ++i) {
        const uint8_t *b = row + i * 210;
        const float d = f16(b + 208);
        const __m256i sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 192)));
        const __m512i sc16 = _mm512_castsi256_si512(sc16y);
        __m512i z[4], scv[4];
        for (int h = 0; h < 2; ++h) {
            const __m512i L = load512(b + 64 * h);
            const __m512i H = _mm512_broadcast_i64x4(load256(b + 128 + 32 * h));
            z[2 * h] = _mm512_or_si512(_mm512_and_si512(L, low4),
                                       _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, sh_lo), low2), 4));
            z[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), low4),
                                           _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, sh_hi), low2), 4));
        }
        // zmm j covers the 16-element scale groups 4j .. 4j+3, 8 int16 lanes each.
        for (int j = 0; j < 4; ++j) scv[j] = _mm512_permutexvar_epi16(group_idx[j], sc16);
        for (int k = 0; k < NT; ++k) {
            const int64_t tok = t.t0 + k;
            const int8_t *xq = t.a->q + tok * t.a->q_stride + i * 256;
            __m512i sumi = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j)
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(z[j], load512(xq + 64 * j)), scv[j]);
            // the -32 offset: 32 * sum_j sc[j] * (sum of sub-block j's 16 activations)
            const __m256i off = _mm256_madd_epi16(load256(t.a->sums16 + tok * t.a->s_stride + i * 16), sc16y);
            const __m512i off512 = _mm512_castsi256_si512(_mm256_slli_epi32(off, 5));
            sumi = _mm512_sub_epi32(sumi, _mm512_maskz_mov_epi32(0x00FF, off512));
            acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(d * t.a->d[tok * nb + i]), _mm512_cvtepi32_ps(sumi), acc[k]);
        }
    }
    for (int k = 0; k < NT; ++k) put(t, k, _mm512_reduce_add_ps(acc[k]));
}

// ---------------------------------------------------------------------------------------------
// IQ4_XS: z[j] = elements 64j .. +63 = sub-blocks 2j, 2j+1; 128-bit lanes hold
// [low nibbles of 2j's 16 bytes | high nibbles | low of 2j+1 | high of 2j+1], mapped through K.

template <int NT>
void iq4_xs_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 256;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
    // int16 shift per 128-bit lane: 0, 4, 0, 4
    const __m512i lane_shift = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                                0x0004000400040004LL, 0x0004000400040004LL, 0, 0);
    __m512 acc[NT];
    for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
    const uint8_t *row = t.w + t.r * t.row_bytes;
    for (int64_t i = t.c0 / 256; i < t.c1 / 256; ++i) {
        const uint8_t *b = row + i * 136;
        const float d = f16(b);
        // 6-bit scales of the 8 sub-blocks, one per byte: pdep drops nibble ib of scales_l into
        // byte ib's bits 0-3 and bit pair ib of scales_h into its bits 4-5 (spec §4's ls).
        uint32_t scales_l;
        std::memcpy(&scales_l, b + 4, 4);
        const uint64_t ls8 = _pdep_u64(scales_l, 0x0F0F0F0F0F0F0F0FULL) | _pdep_u64(load_u16(b + 2), 0x3030303030303030ULL);
        const __m512i ls16 = _mm512_castsi128_si512(
            _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(ls8))), _mm_set1_epi16(32)));
        __m512i az[4], scv[4];
        __mmask64 neg[4];
        for (int j = 0; j < 4; ++j) {
            const __m512i r2 = _mm512_castsi256_si512(load256(b + 8 + 32 * j));
            const __m512i raw = _mm512_shuffle_i64x2(r2, r2, 0x50);  // 128-bit lanes 0,0,1,1
            const __m512i v = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srlv_epi16(raw, lane_shift), low4));
            neg[j] = _mm512_movepi8_mask(v);
            az[j] = _mm512_abs_epi8(v);
            scv[j] = pick_pair(ls16, 2 * j, 2 * j + 1);
        }
        for (int k = 0; k < NT; ++k) {
            const int64_t tok = t.t0 + k;
            const int8_t *xq = t.a->q + tok * t.a->q_stride + i * 256;
            __m512i sumi = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j) {
                const __m512i xv = load512(xq + 64 * j);
                const __m512i sx = _mm512_mask_sub_epi8(xv, neg[j], _mm512_setzero_si512(), xv);
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(az[j], sx), scv[j]);
            }
            acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(d * t.a->d[tok * nb + i]), _mm512_cvtepi32_ps(sumi), acc[k]);
        }
    }
    for (int k = 0; k < NT; ++k) put(t, k, _mm512_reduce_add_ps(acc[k]));
}

// ---------------------------------------------------------------------------------------------
// Q8_0: two 34-byte blocks per zmm; |w| x (x negated where w < 0) with VNNI dpbusd gives 8 s32
// lanes per block (|w| <= 128 unsigned, no saturation in dpbusd). Odd last block: zero upper half.

template <int NT>
void q8_0_tile(const Tile &t) {
    const int64_t nb = t.n_cols / 32;
    const int64_t i_end = t.c1 / 32;
    __m512 acc[NT];
    for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
    const uint8_t *row = t.w + t.r * t.row_bytes;
    for (int64_t i = t.c0 / 32; i < i_end; i += 2) {
        const bool pair = i + 1 < i_end;
        const uint8_t *b0 = row + i * 34, *b1 = b0 + 34;
        const float d0 = f16(b0), d1 = pair ? f16(b1) : 0.0f;
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(load256(b0 + 2)),
                                             pair ? load256(b1 + 2) : _mm256_setzero_si256(), 1);
        const __mmask64 neg = _mm512_movepi8_mask(w);
        const __m512i aw = _mm512_abs_epi8(w);
        for (int k = 0; k < NT; ++k) {
            const int64_t tok = t.t0 + k;
            const int8_t *xq = t.a->q + tok * t.a->q_stride + i * 32;
            const __m512i xv = pair ? load512(xq) : _mm512_castsi256_si512(load256(xq));
            const __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
            const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx);
            const float *dx = t.a->d + tok * nb + i;
            const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(d0 * dx[0]), _mm256_set1_ps(pair ? d1 * dx[1] : 0.0f), 1);
            acc[k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[k]);
        }
    }
    for (int k = 0; k < NT; ++k) put(t, k, _mm512_reduce_add_ps(acc[k]));
}

// ---------------------------------------------------------------------------------------------
// F32 / F16 / BF16: 16 weights -> fp32 lanes, FMA with fp32 activations; tail (< 16) scalar.

template <int32_t Type>
inline __m512 load_w16(const uint8_t *p) {
    if (Type == GGML_F32) return _mm512_loadu_ps(p);
    const __m256i h = load256(p);
    if (Type == GGML_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int32_t Type>
inline float load_w1(const uint8_t *p) {
    float f;
    if (Type == GGML_F32) {
        std::memcpy(&f, p, 4);
    } else if (Type == GGML_F16) {
        f = f16(p);
    } else {
        const uint32_t bits = uint32_t(load_u16(p)) << 16;
        std::memcpy(&f, &bits, 4);
    }
    return f;
}

// RM weight rows (1 or 2) x NT tokens per call, two accumulators each: with RM = 2 every
// activation load feeds two FMAs (loads, not FMAs, bound the 1-row version at 4 tokens).
template <int32_t Type, int NT, int RM>
void float_tile(const Tile &t) {
    constexpr int64_t es = Type == GGML_F32 ? 4 : 2;
    // A accumulators per (row, token), 16*A columns per step; a lone token gets 4 so more
    // cache lines are in flight while it streams from memory.
    constexpr int A = NT == 1 && RM == 1 ? 4 : 2;
    const int64_t n16 = t.c0 + (t.c1 - t.c0) / 16 * 16;
    __m512 acc[RM][NT][A];
    for (int m = 0; m < RM; ++m)
        for (int k = 0; k < NT; ++k)
            for (int a = 0; a < A; ++a) acc[m][k][a] = _mm512_setzero_ps();
    const uint8_t *rows[RM];
    for (int m = 0; m < RM; ++m) rows[m] = t.w + (t.r + m) * t.row_bytes;
    int64_t c = t.c0;
    for (; c + 16 * A <= n16; c += 16 * A) {
        __m512 w[RM][A];
        for (int m = 0; m < RM; ++m)
            for (int a = 0; a < A; ++a) w[m][a] = load_w16<Type>(rows[m] + (c + 16 * a) * es);
        for (int k = 0; k < NT; ++k) {
            const float *xt = t.x + (t.t0 + k) * t.n_cols + c;
            for (int a = 0; a < A; ++a) {
                const __m512 xv = _mm512_loadu_ps(xt + 16 * a);
                for (int m = 0; m < RM; ++m) acc[m][k][a] = _mm512_fmadd_ps(w[m][a], xv, acc[m][k][a]);
            }
        }
    }
    for (; c < n16; c += 16) {
        for (int k = 0; k < NT; ++k) {
            const __m512 x0 = _mm512_loadu_ps(t.x + (t.t0 + k) * t.n_cols + c);
            for (int m = 0; m < RM; ++m)
                acc[m][k][0] = _mm512_fmadd_ps(load_w16<Type>(rows[m] + c * es), x0, acc[m][k][0]);
        }
    }
    for (int m = 0; m < RM; ++m) {
        for (int k = 0; k < NT; ++k) {
            const float *xt = t.x + (t.t0 + k) * t.n_cols;
            __m512 sum = acc[m][k][0];
            for (int a = 1; a < A; ++a) sum = _mm512_add_ps(sum, acc[m][k][a]);
            float s = _mm512_reduce_add_ps(sum);
            for (int64_t e = n16; e < t.c1; ++e) s += load_w1<Type>(rows[m] + e * es) * xt[e];
            put_row(t, k, t.r + m, s);
        }
    }
}

template <int NT> void f32_tile(const Tile &t) { float_tile<GGML_F32, NT, 1>(t); }
template <int NT> void f16_tile(const Tile &t) { float_tile<GGML_F16, NT, 1>(t); }
template <int NT> void bf16_tile(const Tile &t) { float_tile<GGML_BF16, NT, 1>(t); }
template <int NT> void f32_tile2(const Tile &t) { float_tile<GGML_F32, NT, 2>(t); }
template <int NT> void f16_tile2(const Tile &t) { float_tile<GGML_F16, NT, 2>(t); }
template <int NT> void bf16_tile2(const Tile &t) { float_tile<GGML_BF16, NT, 2>(t); }

// ---------------------------------------------------------------------------------------------

using TileFn = void (*)(const Tile &);

#define LUCE_TILES(fn) {fn<1>, fn<2>, fn<3>, fn<4>}

const TileFn *tiles_for(int32_t type) {
    static const TileFn f32[] = LUCE_TILES(f32_tile), f16_[] = LUCE_TILES(f16_tile),
                        bf16[] = LUCE_TILES(bf16_tile), q8_0[] = LUCE_TILES(q8_0_tile),
                        q4_k[] = LUCE_TILES(q4_k_tile), q5_k[] = LUCE_TILES(q5_k_tile),
                        q6_k[] = LUCE_TILES(q6_k_tile), iq4_xs[] = LUCE_TILES(iq4_xs_tile);
    switch (type) {
        case GGML_F32: return f32;
        case GGML_F16: return f16_;
        case GGML_BF16: return bf16;
        case GGML_Q8_0: return q8_0;
        case GGML_Q4_K: return q4_k;
        case GGML_Q5_K: return q5_k;
        case GGML_Q6_K: return q6_k;
        case GGML_IQ4_XS: return iq4_xs;
        default: return nullptr;
    }
}

// Two-row versions (float types only; nullptr otherwise).
const TileFn *row_pair_tiles_for(int32_t type) {
    static const TileFn f32[] = LUCE_TILES(f32_tile2), f16_[] = LUCE_TILES(f16_tile2),
                        bf16[] = LUCE_TILES(bf16_tile2);
    switch (type) {
        case GGML_F32: return f32;
        case GGML_F16: return f16_;
        case GGML_BF16: return bf16;
        default: return nullptr;
    }
}

}  // namespace

bool matmul_rows(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                 const float *x, int64_t n_tok, float *y, int64_t ldy) {
    const TileFn *fns = tiles_for(type), *pairs = row_pair_tiles_for(type);
    if (fns == nullptr) return false;
    QuantizedActs a;
    const int64_t block = act_block(type);
    if (block != 0) a = quantize_acts(x, n_cols, n_tok, block, avx2::quantize_block);
    Tile t{static_cast<const uint8_t *>(w), row_bytes(type, n_cols), n_cols, 0, &a, x, 0, 0, 0, false, y, ldy};
    // Column passes, row blocks, token tiles, rows. The activations of one tile and pass stay in
    // L1 while the rows of a block go by; a block's weight slice (<= 1 MiB) stays in L2 while
    // every tile uses it. (Tiles inside rows would read each weight row once, but the tiles'
    // activations then no longer fit L1 together: ~2x slower at 8 tokens.)
    // The passes are those of a full tile whatever n_tok (column_chunk): a lone token runs them
    // row by row.
    const int64_t chunk = column_chunk(type, n_cols, kMaxTile);
    if (n_tok == 1 && chunk < n_cols) {
        for (t.r = row_begin; t.r < row_end; ++t.r)
            for (t.c0 = 0; t.c0 < n_cols; t.c0 += chunk) {
                t.c1 = t.c0 + chunk < n_cols ? t.c0 + chunk : n_cols;
                t.accumulate = t.c0 > 0;
                fns[0](t);
            }
        return true;
    }
    const int64_t slice_bytes = row_bytes(type, chunk) > 0 ? row_bytes(type, chunk) : 1;
    int64_t row_block = n_tok <= kMaxTile ? row_end - row_begin : ((int64_t(1) << 20) / slice_bytes) / 2 * 2;
    if (row_block < 2) row_block = 2;
    for (t.c0 = 0; t.c0 < n_cols; t.c0 += chunk) {
        t.c1 = t.c0 + chunk < n_cols ? t.c0 + chunk : n_cols;
        t.accumulate = t.c0 > 0;
        for (int64_t rb0 = row_begin; rb0 < row_end; rb0 += row_block) {
            const int64_t rb1 = rb0 + row_block < row_end ? rb0 + row_block : row_end;
            for (t.t0 = 0; t.t0 < n_tok; t.t0 += kMaxTile) {
                const int64_t nt = n_tok - t.t0 < kMaxTile ? n_tok - t.t0 : kMaxTile;
                t.r = rb0;
                // Row pairs only with several tokens: a lone token is memory-bound and measured
                // 1.8x slower reading two rows at once (two streams instead of one).
                if (pairs != nullptr && nt >= 2)
                    for (; t.r + 2 <= rb1; t.r += 2) pairs[nt - 1](t);
                for (; t.r < rb1; ++t.r) fns[nt - 1](t);
            }
        }
    }
    return true;
}

}  // namespace avx512
}  // namespace luce

#endif  // __x86_64__
