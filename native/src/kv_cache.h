// kv_cache.h — the attention KV cache's element types (luce.h luce_kv_type) and the optional
// Walsh-Hadamard rotation of K and Q (luce.h LUCE_KV_ROTATE).
//
// q8_0 and q4_0 rows use llama.cpp's block math (32 values share an IEEE-half scale d; q8_0
// x = d q with q = round(x / d), d = max|x| / 127; q4_0 x = d (q - 8) with d = (the value of
// largest magnitude) / -8, q = min(15, trunc(x / d + 8.5))), so a cached row dequantizes to what
// gguf.quants gives for it. The bytes are laid out per cache row of its own: the row's quants
// first (q8_0 one byte a value; q4_0 a byte per pair, value 2i in the low nibble, 2i+1 in the
// high), then the row's block scales, padded to whole 4-byte words. A row of D values then starts
// at row * kv_row_bytes, and a reader of four consecutive values touches one aligned word of
// quants and one scale.
//
// Rotation: K rows are stored as H k and queries read as H q (both rotated in the attention
// prologue, Backend::qk_norm_rope_store), H the orthonormal Walsh-Hadamard
// matrix of size D (H^T H = I, so q.k is unchanged in exact arithmetic); it spreads a row's
// outliers over all its values, which is what a block scale shared by 32 values needs. V is not
// rotated: attention's output is a sum of V rows, read back as stored.
#pragma once

#include <cstddef>
#include <cstdint>

namespace luce {

enum class KvType : int32_t { F32 = 0, F16 = 1, Q8_0 = 2, Q4_0 = 3 };

constexpr int KV_BLOCK = 32;  // values per q8_0 / q4_0 block

inline bool kv_quantized(KvType t) { return t == KvType::Q8_0 || t == KvType::Q4_0; }

inline const char *kv_type_name(KvType t) {
    switch (t) {
        case KvType::F32: return "f32";
        case KvType::F16: return "f16";
        case KvType::Q8_0: return "q8_0";
        case KvType::Q4_0: return "q4_0";
    }
    return "?";
}

// Bytes of one cache row of `dim` values (dim a multiple of KV_BLOCK for the block types).
// Block rows are padded to a multiple of 4 bytes, so a row's quants load as aligned words.
inline size_t kv_row_bytes(KvType t, int dim) {
    const size_t n = size_t(dim), blocks = n / KV_BLOCK;
    auto words = [](size_t bytes) { return (bytes + 3) / 4 * 4; };
    switch (t) {
        case KvType::F32: return 4 * n;
        case KvType::F16: return 2 * n;
        case KvType::Q8_0: return words(n + 2 * blocks);
        case KvType::Q4_0: return words(n / 2 + 2 * blocks);
    }
    return 0;
}

// The cache's configuration: element types of K and V, and whether K (and Q) are rotated.
struct KvFormat {
    KvType k = KvType::F32, v = KvType::F32;
    bool rotate = false;

    // Refuses (LUCE_ERR_INVALID_ARGUMENT / LUCE_ERR_UNSUPPORTED) what the model's head dim cannot hold.
    void check(int head_dim) const;
};

// luce.h's packed kv_type argument (LUCE_KV_TYPES) as a KvFormat, refusing unknown values.
KvFormat kv_format_from_api(int32_t kv_type);

// Attention KV storage of one full-attention layer: k and v are [Hkv][n_ctx] rows of D values
// in their KvType's row layout (above).
struct KvLayer {
    void *k = nullptr;
    void *v = nullptr;
    int n_ctx = 0;
    KvFormat format;
    int window = 0;  // --fa-window: a query at position p sees keys p - window + 1 .. p (0: all)
};

// CPU row codecs (kv_cache.cpp). Writes x (dim floats) as one row of type t at dst.
void kv_encode_row(KvType t, const float *x, int dim, void *dst);
// Row `index` of a cache of type t as floats: f32 rows in place, others decoded into scratch.
const float *kv_decode_row(KvType t, const void *base, int64_t index, int dim, float *scratch);
// In place: x = H x, H the orthonormal Walsh-Hadamard matrix of size dim (a power of two).
void fwht(float *x, int dim);

}  // namespace luce
