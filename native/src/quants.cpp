// quants.cpp — ggml type table, scalar (reference) dequantization and matmul, SIMD dispatch.
//
// The scalar code here is the reference every fast path is checked against: it dequantizes
// with exactly gguf-py's float32 operation order (bit-exact, see tests/test_quants.py) and
// accumulates in fp32. Block layouts: spec/qwen35.md §4. This file is compiled without
// FMA contraction (see CMakeLists.txt) so that `d * q - m` rounds twice, as numpy does.
//
// Legend: a "block" is the type's unit (32 or 256 elements, 1 for float types); QK_K = 256.
#include "quants.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "errors.h"
#include "quants_kernels.h"
#include "quants_lowbit.h"

namespace luce {

// ---------------------------------------------------------------------------------------------
// type table: every id ggml defines (removed ids 4, 5, 31-33, 36-38 are left out).

namespace {

struct TypeEntry {
    int32_t id;
    TypeTraits traits;
};

constexpr TypeEntry kTypes[] = {
    {0, {"f32", 1, 4, true}},          {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},       {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},       {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},       {9, {"q8_1", 32, 40, false}},
    {10, {"q2_K", 256, 84, true}},     {11, {"q3_K", 256, 110, true}},
    {12, {"q4_K", 256, 144, true}},    {13, {"q5_K", 256, 176, true}},
    {14, {"q6_K", 256, 210, true}},    {15, {"q8_K", 256, 292, false}},
    {16, {"iq2_xxs", 256, 66, true}},  {17, {"iq2_xs", 256, 74, true}},
    {18, {"iq3_xxs", 256, 98, true}},  {19, {"iq1_s", 256, 50, true}},
    {20, {"iq4_nl", 32, 18, true}},    {21, {"iq3_s", 256, 110, true}},
    {22, {"iq2_s", 256, 82, true}},    {23, {"iq4_xs", 256, 136, true}},
    {24, {"i8", 1, 1, false}},         {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},        {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},        {29, {"iq1_m", 256, 56, true}},
    {30, {"bf16", 1, 2, true}},        {34, {"tq1_0", 256, 54, false}},
    {35, {"tq2_0", 256, 66, false}},   {39, {"mxfp4", 32, 17, false}},
    {40, {"nvfp4", 64, 36, false}},    {41, {"q1_0", 128, 18, false}},
};

}  // namespace

const TypeTraits *type_traits(int32_t type) {
    for (const TypeEntry &e : kTypes)
        if (e.id == type) return &e.traits;
    return nullptr;
}

bool is_supported_weight_type(int32_t type) {
    const TypeTraits *t = type_traits(type);
    return t != nullptr && t->supported;
}

int64_t row_bytes(int32_t type, int64_t n) {
    const TypeTraits *t = type_traits(type);
    if (t == nullptr) fail(LUCE_ERR_FORMAT, "unknown ggml type id %d", int(type));
    if (n < 0 || n % t->block_elems != 0)
        fail(LUCE_ERR_FORMAT, "row of %lld elements is not a multiple of the %s block (%lld)",
             (long long)n, t->name, (long long)t->block_elems);
    // n / block_elems * block_bytes cannot overflow for n < 2^62 / 8; refuse anything larger.
    if (n > (int64_t(1) << 48))
        fail(LUCE_ERR_FORMAT, "row of %lld elements is implausibly long", (long long)n);
    return n / t->block_elems * t->block_bytes;
}

// ---------------------------------------------------------------------------------------------
// scalar helpers

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, nan included).
float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        // subnormal half: value = mant * 2^-24; renormalise into an f32 exponent.
        int e = -1;
        do {
            mant <<= 1;
            ++e;
        } while ((mant & 0x400) == 0);
        bits = sign | uint32_t(112 - e) << 23 | ((mant & 0x3FF) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

static uint16_t load_u16(const uint8_t *p) { return uint16_t(p[0] | (p[1] << 8)); }

const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K.
void k_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// ---------------------------------------------------------------------------------------------
// scalar dequantization of one block (the formulas of spec §4, float32 op order of gguf-py)

static void dequant_q8_0(const uint8_t *b, float *y) {
    const float d = f16_to_f32(load_u16(b));
    const int8_t *qs = reinterpret_cast<const int8_t *>(b + 2);
    for (int i = 0; i < 32; ++i) y[i] = float(qs[i]) * d;
}

// Q4_K / Q5_K: element 64c + l = (d*sc)*q - (dmin*m); qh == nullptr for Q4_K.
static void dequant_q45_k(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
    const float d = f16_to_f32(load_u16(b));
    const float dmin = f16_to_f32(load_u16(b + 2));
    const uint8_t *scales = b + 4;
    for (int c = 0; c < 4; ++c) {
        uint8_t sc0, m0, sc1, m1;
        k_scale_min(scales, 2 * c, &sc0, &m0);
        k_scale_min(scales, 2 * c + 1, &sc1, &m1);
        const float d0 = d * float(sc0), dm0 = dmin * float(m0);
        const float d1 = d * float(sc1), dm1 = dmin * float(m1);
        for (int l = 0; l < 32; ++l) {
            int lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
            if (qh) {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            y[64 * c + l] = d0 * float(lo) - dm0;
            y[64 * c + 32 + l] = d1 * float(hi) - dm1;
        }
    }
}

static void dequant_q4_k(const uint8_t *b, float *y) { dequant_q45_k(b, nullptr, b + 16, y); }
static void dequant_q5_k(const uint8_t *b, float *y) { dequant_q45_k(b, b + 16, b + 48, y); }

// Q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Element = (d*sc[i/16]) * (q - 32).
static void dequant_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192);
    const float d = f16_to_f32(load_u16(b + 208));
    for (int h = 0; h < 2; ++h) {
        const uint8_t *l_ = ql + 64 * h, *h_ = qh + 32 * h;
        const int8_t *s_ = sc + 8 * h;
        float *o = y + 128 * h;
        for (int l = 0; l < 32; ++l) {
            const int i = l / 16;
            const int q1 = ((l_[l] & 0xF) | (((h_[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((l_[l + 32] & 0xF) | (((h_[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((l_[l] >> 4) | (((h_[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((l_[l + 32] >> 4) | (((h_[l] >> 6) & 3) << 4)) - 32;
            o[l] = (d * float(s_[i])) * float(q1);
            o[l + 32] = (d * float(s_[i + 2])) * float(q2);
            o[l + 64] = (d * float(s_[i + 4])) * float(q3);
            o[l + 96] = (d * float(s_[i + 6])) * float(q4);
        }
    }
}

// IQ4_XS: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. Element = (d*(ls-32)) * K[nibble].
static void dequant_iq4_xs(const uint8_t *b, float *y) {
    const float d = f16_to_f32(load_u16(b));
    const uint16_t scales_h = load_u16(b + 2);
    const uint8_t *scales_l = b + 4, *qs = b + 8;
    for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
        const float dl = d * float(ls - 32);
        for (int j = 0; j < 16; ++j) {
            y[32 * ib + j] = dl * float(kIq4nlValues[qs[16 * ib + j] & 0xF]);
            y[32 * ib + 16 + j] = dl * float(kIq4nlValues[qs[16 * ib + j] >> 4]);
        }
    }
}

// The 32-element types: element j of a block is the low nibble of qs[j % 16] for j < 16, the high
// one for j >= 16; Q5_0 / Q5_1 take their 5th bit from bit j of the little-endian u32 qh.
// Q4_0: f16 d; u8 qs[16]. Element = d * (q - 8).
static void dequant_q4_0(const uint8_t *b, float *y) {
    const float d = f16_to_f32(load_u16(b));
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float((b[2 + j] & 0xF) - 8);
        y[j + 16] = d * float((b[2 + j] >> 4) - 8);
    }
}

// Q4_1: f16 d; f16 m; u8 qs[16]. Element = d * q + m.
static void dequant_q4_1(const uint8_t *b, float *y) {
    const float d = f16_to_f32(load_u16(b)), m = f16_to_f32(load_u16(b + 2));
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float(b[4 + j] & 0xF) + m;
        y[j + 16] = d * float(b[4 + j] >> 4) + m;
    }
}

static uint32_t load_u32(const uint8_t *p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// Q5_0: f16 d; u8 qh[4]; u8 qs[16]. Element = d * (q - 16), q = nibble | 5th bit << 4.
static void dequant_q5_0(const uint8_t *b, float *y) {
    const float d = f16_to_f32(load_u16(b));
    const uint32_t qh = load_u32(b + 2);
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float(int((b[6 + j] & 0xF) | ((qh >> j) & 1) << 4) - 16);
        y[j + 16] = d * float(int((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
}

// Q5_1: f16 d; f16 m; u8 qh[4]; u8 qs[16]. Element = d * q + m.
static void dequant_q5_1(const uint8_t *b, float *y) {
    const float d = f16_to_f32(load_u16(b)), m = f16_to_f32(load_u16(b + 2));
    const uint32_t qh = load_u32(b + 4);
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float((b[8 + j] & 0xF) | ((qh >> j) & 1) << 4) + m;
        y[j + 16] = d * float((b[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) + m;
    }
}

// IQ4_NL: f16 d; u8 qs[16]. Element = d * K[nibble] (IQ4_XS's codebook, one scale per block).
static void dequant_iq4_nl(const uint8_t *b, float *y) {
    const float d = f16_to_f32(load_u16(b));
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float(kIq4nlValues[b[2 + j] & 0xF]);
        y[j + 16] = d * float(kIq4nlValues[b[2 + j] >> 4]);
    }
}

// The 1-3-bit types: quants_lowbit.h's units, eight per block (shared with the GPU).
struct HostHalf {
    static float of(uint32_t bits) { return f16_to_f32(uint16_t(bits)); }
};

template <int TYPE>
static void dequant_lowbit(const uint8_t *b, float *y) {
    for (int j = 0; j < 8; ++j) lowbit_unit<TYPE, HostHalf>(b, j, y + 32 * j);
}

// Dequantizes `nblocks` consecutive blocks of `type`.
static void dequant_blocks(int32_t type, const uint8_t *src, float *dst, int64_t nblocks) {
    switch (type) {
        case GGML_F32: std::memcpy(dst, src, size_t(nblocks) * 4); return;
        case GGML_F16:
            for (int64_t i = 0; i < nblocks; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
            return;
        case GGML_BF16:
            for (int64_t i = 0; i < nblocks; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
            return;
        default: break;
    }
    void (*one)(const uint8_t *, float *) = nullptr;
    switch (type) {
        case GGML_Q8_0: one = dequant_q8_0; break;
        case GGML_Q4_K: one = dequant_q4_k; break;
        case GGML_Q5_K: one = dequant_q5_k; break;
        case GGML_Q6_K: one = dequant_q6_k; break;
        case GGML_IQ4_XS: one = dequant_iq4_xs; break;
        case GGML_Q4_0: one = dequant_q4_0; break;
        case GGML_Q4_1: one = dequant_q4_1; break;
        case GGML_Q5_0: one = dequant_q5_0; break;
        case GGML_Q5_1: one = dequant_q5_1; break;
        case GGML_IQ4_NL: one = dequant_iq4_nl; break;
        case GGML_Q2_K: one = dequant_lowbit<GGML_Q2_K>; break;
        case GGML_Q3_K: one = dequant_lowbit<GGML_Q3_K>; break;
        case GGML_IQ2_XXS: one = dequant_lowbit<GGML_IQ2_XXS>; break;
        case GGML_IQ2_XS: one = dequant_lowbit<GGML_IQ2_XS>; break;
        case GGML_IQ2_S: one = dequant_lowbit<GGML_IQ2_S>; break;
        case GGML_IQ3_XXS: one = dequant_lowbit<GGML_IQ3_XXS>; break;
        case GGML_IQ3_S: one = dequant_lowbit<GGML_IQ3_S>; break;
        case GGML_IQ1_S: one = dequant_lowbit<GGML_IQ1_S>; break;
        case GGML_IQ1_M: one = dequant_lowbit<GGML_IQ1_M>; break;
        default: fail(LUCE_ERR_UNSUPPORTED, "no kernel for ggml type id %d", int(type));
    }
    const TypeTraits *t = type_traits(type);
    for (int64_t i = 0; i < nblocks; ++i)
        one(src + i * t->block_bytes, dst + i * t->block_elems);
}

void dequantize_row(int32_t type, const void *src, float *dst, int64_t n) {
    const TypeTraits *t = type_traits(type);
    if (t == nullptr || !t->supported) fail(LUCE_ERR_UNSUPPORTED, "no kernel for ggml type id %d", int(type));
    dequant_blocks(type, static_cast<const uint8_t *>(src), dst, n / t->block_elems);
}

// ---------------------------------------------------------------------------------------------
// scalar matmul: dequantize a chunk of the weight row once, apply it to every token.

void matmul_rows_reference(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                           int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy) {
    const TypeTraits *t = type_traits(type);
    if (t == nullptr || !t->supported) fail(LUCE_ERR_UNSUPPORTED, "no kernel for ggml type id %d", int(type));
    // Chunks of 256 elements: a multiple of every supported block size (row lengths of float
    // types need not be, hence the tail).
    constexpr int64_t kChunk = 256;
    float wbuf[kChunk];
    const int64_t rb = row_bytes(type, n_cols);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t *row = static_cast<const uint8_t *>(w) + r * rb;
        for (int64_t tk = 0; tk < n_tok; ++tk) y[tk * ldy + r] = 0.0f;
        for (int64_t c0 = 0; c0 < n_cols; c0 += kChunk) {
            const int64_t len = n_cols - c0 < kChunk ? n_cols - c0 : kChunk;
            dequant_blocks(type, row + c0 / t->block_elems * t->block_bytes, wbuf, len / t->block_elems);
            for (int64_t tk = 0; tk < n_tok; ++tk) {
                const float *xt = x + tk * n_cols + c0;
                float s = 0.0f;
                for (int64_t i = 0; i < len; ++i) s += wbuf[i] * xt[i];
                y[tk * ldy + r] += s;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// activation quantization (the contract is in quants_kernels.h)

int64_t act_block(int32_t type) {
    switch (type) {
        case GGML_Q8_0: case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_IQ4_NL: return 32;
        case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: case GGML_IQ4_XS: return 256;
        default: return is_lowbit_type(type) ? 256 : 0;
    }
}

void quantize_block_scalar(const float *x, int64_t block, int8_t *q, float *d) {
    float amax = 0.0f;
    for (int64_t i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    for (int64_t i = 0; i < block; ++i) {
        // A NaN/Inf activation must not reach a float->int8 conversion (undefined behaviour);
        // its block's result is garbage either way (d is Inf or the sum NaN).
        const float r = std::nearbyint(x[i] * id);
        q[i] = r >= -127.0f && r <= 127.0f ? int8_t(r) : 0;
    }
}

QuantizedActs quantize_acts(const float *x, int64_t n_cols, int64_t n_tok, int64_t block,
                            QuantizeBlockFn quantize_block) {
    static thread_local std::vector<float> d_buf;
    static thread_local std::vector<int8_t> q_buf;
    static thread_local std::vector<int16_t> s_buf;
    QuantizedActs a;
    a.n_cols = n_cols;
    a.n_tok = n_tok;
    a.block = block;
    a.q_stride = n_cols + 64;
    a.s_stride = n_cols / 16 + 32;
    const int64_t nb = n_cols / block;
    if (q_buf.size() < size_t(n_tok * a.q_stride)) q_buf.resize(size_t(n_tok * a.q_stride));
    if (d_buf.size() < size_t(n_tok * nb)) d_buf.resize(size_t(n_tok * nb));
    if (s_buf.size() < size_t(n_tok * a.s_stride)) s_buf.resize(size_t(n_tok * a.s_stride));
    a.d = d_buf.data();
    a.q = q_buf.data();
    a.sums16 = s_buf.data();
    for (int64_t t = 0; t < n_tok; ++t) {
        int8_t *qt = a.q + t * a.q_stride;
        for (int64_t b = 0; b < nb; ++b)
            quantize_block(x + t * n_cols + b * block, block, qt + b * block, a.d + t * nb + b);
        int16_t *st = a.sums16 + t * a.s_stride;
        for (int64_t g = 0; g < n_cols / 16; ++g) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += qt[16 * g + i];
            st[g] = int16_t(s);
        }
    }
    return a;
}

int64_t column_chunk(int32_t type, int64_t n_cols, int64_t tile_tokens) {
    // The 1-3-bit types take every token count in one pass (their many-token kernel has none).
    if (is_lowbit_type(type)) return n_cols;
    constexpr int64_t kL1Budget = 32 * 1024;  // of the 48 KiB L1d; the rest for weights and y
    const int64_t x_bytes = act_block(type) != 0 ? 1 : 4;
    int64_t chunk = kL1Budget / (tile_tokens * x_bytes) / 256 * 256;
    if (chunk < 256) chunk = 256;
    return chunk >= n_cols ? n_cols : chunk;
}

// Portable path for quantized weights: the same numbers as the SIMD kernels (weights times
// the quantized activations d*q, fp32 sums), computed by dequantizing both sides.
static void matmul_rows_q8_acts(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                                int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t block = act_block(type);
    const QuantizedActs a = quantize_acts(x, n_cols, n_tok, block);
    static thread_local std::vector<float> xq;
    if (xq.size() < size_t(n_cols * n_tok)) xq.resize(size_t(n_cols * n_tok));
    for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t i = 0; i < n_cols; ++i)
            xq[t * n_cols + i] = a.d[(t * n_cols + i) / block] * float(a.q[t * a.q_stride + i]);
    matmul_rows_reference(type, w, n_cols, row_begin, row_end, xq.data(), n_tok, y, ldy);
}

// The 1-3-bit types over int8 activations, one unit at a time (scalar): the unit as integers
// (quants_lowbit.h, lowbit_unit_int), exact integer dots per 16-element half, then one fp32
// formula, the same as the GPU's int8 kernels apply (native/gpu/int8_units.cuh).
template <int TYPE>
static void matmul_rows_lowbit(const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end, const float *x,
                               int64_t n_tok, float *y, int64_t ldy) {
    const QuantizedActs a = quantize_acts(x, n_cols, n_tok, 256);
    const int64_t n_blocks = n_cols / 256, rb = row_bytes(TYPE, n_cols);
    for (int64_t r = row_begin; r < row_end; ++r) {
        const uint8_t *row = static_cast<const uint8_t *>(w) + r * rb;
        for (int64_t t = 0; t < n_tok; ++t) y[t * ldy + r] = 0.0f;
        for (int64_t b = 0; b < n_blocks; ++b)
            for (int j = 0; j < 8; ++j) {
                LowbitIntUnit u;
                lowbit_unit_int<TYPE, HostHalf>(row + b * lowbit_block_bytes(TYPE), j, u);
                const int64_t c0 = 256 * b + 32 * j;
                for (int64_t t = 0; t < n_tok; ++t) {
                    const int8_t *xq = a.q + t * a.q_stride + c0;
                    const int16_t *sums = a.sums16 + t * a.s_stride + c0 / 16;
                    int lo = 0, hi = 0;
                    for (int i = 0; i < 16; ++i) lo += u.q[i] * xq[i], hi += u.q[16 + i] * xq[16 + i];
                    const float dx = a.d[t * n_blocks + b];
                    float acc = y[t * ldy + r];
                    acc = std::fma(u.d * dx, float(u.scale[0] * lo + u.scale[1] * hi), acc);
                    y[t * ldy + r] = std::fma(-(u.dmin * dx), float(u.min[0] * sums[0] + u.min[1] * sums[1]), acc);
                }
            }
    }
}

static bool matmul_rows_lowbit_any(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                                   const float *x, int64_t n_tok, float *y, int64_t ldy) {
    switch (type) {
#define LUCE_LOWBIT_CASE(T) case T: matmul_rows_lowbit<T>(w, n_cols, row_begin, row_end, x, n_tok, y, ldy); return true;
        LUCE_LOWBIT_CASE(GGML_Q2_K) LUCE_LOWBIT_CASE(GGML_Q3_K) LUCE_LOWBIT_CASE(GGML_IQ2_XXS)
        LUCE_LOWBIT_CASE(GGML_IQ2_XS) LUCE_LOWBIT_CASE(GGML_IQ2_S) LUCE_LOWBIT_CASE(GGML_IQ3_XXS)
        LUCE_LOWBIT_CASE(GGML_IQ3_S) LUCE_LOWBIT_CASE(GGML_IQ1_S) LUCE_LOWBIT_CASE(GGML_IQ1_M)
#undef LUCE_LOWBIT_CASE
        default: return false;
    }
}

// LUCE_CPU_KERNELS=exact: fp32 activations for every type (no int8 rounding of the activations):
// the reference another backend is compared against when a difference must be attributed.
// Slow; for checks, not for use.
static bool exact_requested() {
    const char *k = std::getenv("LUCE_CPU_KERNELS");
    return k && std::strcmp(k, "exact") == 0;
}

void matmul_rows(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                 const float *x, int64_t n_tok, float *y, int64_t ldy, bool prefill) {
    if (exact_requested()) return matmul_rows_reference(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy);
    if (matmul_rows_simd(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy, prefill)) return;
    if (matmul_rows_lowbit_any(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy)) return;
    if (act_block(type) != 0)
        matmul_rows_q8_acts(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy);
    else
        matmul_rows_reference(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy);
}

}  // namespace luce
