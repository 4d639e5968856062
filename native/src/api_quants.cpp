// api_quants.cpp — C ABI test hooks over the quant kernels (luce_dequantize, luce_matvec).
//
// These take caller-supplied buffers, so every size is checked before a byte is read:
// the type must be supported, n / n_cols a multiple of its block, and nbytes exactly what
// the element count needs (computed with overflow checks).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "errors.h"
#include "kv_cache.h"
#include "luce.h"
#include "quants.h"

#define LUCE_API extern "C" __attribute__((visibility("default")))

namespace {

const luce::TypeTraits &supported_traits(int32_t type) {
    const luce::TypeTraits *t = luce::type_traits(type);
    if (t == nullptr) luce::fail(LUCE_ERR_UNSUPPORTED, "unknown ggml type id %d", int(type));
    if (!t->supported)
        luce::fail(LUCE_ERR_UNSUPPORTED, "weights of type %s (id %d) are not supported", t->name, int(type));
    return *t;
}

// Bytes of `rows` rows of `cols` elements of type t, or a luce::Error naming what is wrong.
uint64_t expected_bytes(const luce::TypeTraits &t, int64_t rows, int64_t cols) {
    if (rows < 0 || cols <= 0)
        luce::fail(LUCE_ERR_INVALID_ARGUMENT, "bad shape %lld x %lld", (long long)rows, (long long)cols);
    if (cols % t.block_elems != 0)
        luce::fail(LUCE_ERR_INVALID_ARGUMENT, "%lld elements are not a multiple of the %s block (%lld)",
                   (long long)cols, t.name, (long long)t.block_elems);
    const uint64_t row = uint64_t(cols / t.block_elems) * uint64_t(t.block_bytes);
    uint64_t total = 0;
    if (__builtin_mul_overflow(row, uint64_t(rows), &total))
        luce::fail(LUCE_ERR_INVALID_ARGUMENT, "shape %lld x %lld overflows", (long long)rows, (long long)cols);
    return total;
}

void require_nbytes(const luce::TypeTraits &t, size_t nbytes, uint64_t need) {
    if (uint64_t(nbytes) != need)
        luce::fail(LUCE_ERR_INVALID_ARGUMENT, "%s data is %llu bytes, expected %llu", t.name,
                   (unsigned long long)nbytes, (unsigned long long)need);
}

}  // namespace

LUCE_API luce_status luce_kv_round_trip(int32_t kv_type, const float *x, int64_t n, int32_t n_dim, float *out) {
    return luce::guard([&] {
        if (x == nullptr || out == nullptr) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "null buffer");
        if (kv_type < LUCE_KV_F32 || kv_type > LUCE_KV_Q4_0) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "unknown KV cache type %d", kv_type);
        const luce::KvType t = luce::KvType(kv_type);
        if (n_dim < 1 || n < 0 || n % n_dim != 0 || (luce::kv_quantized(t) && n_dim % luce::KV_BLOCK != 0))
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "%lld values in rows of %d", (long long)n, n_dim);
        std::vector<uint8_t> row(luce::kv_row_bytes(t, n_dim));
        std::vector<float> scratch(static_cast<size_t>(n_dim));
        for (int64_t r = 0; r < n / n_dim; ++r) {
            luce::kv_encode_row(t, x + r * n_dim, n_dim, row.data());
            const float *back = luce::kv_decode_row(t, row.data(), 0, n_dim, scratch.data());
            std::copy(back, back + n_dim, out + r * n_dim);
        }
    });
}

LUCE_API luce_status luce_dequantize(int32_t type, const void *data, size_t nbytes, float *out, int64_t n) {
    return luce::guard([&] {
        const luce::TypeTraits &t = supported_traits(type);
        require_nbytes(t, nbytes, expected_bytes(t, 1, n));
        if (data == nullptr || out == nullptr) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "null buffer");
        luce::dequantize_row(type, data, out, n);
    });
}

LUCE_API luce_status luce_matvec(int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                                 int64_t n_cols, const float *x, float *y) {
    return luce::guard([&] {
        const luce::TypeTraits &t = supported_traits(type);
        require_nbytes(t, nbytes, expected_bytes(t, n_rows, n_cols));
        if (weights == nullptr || x == nullptr || y == nullptr)
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "null buffer");
        luce::matmul_rows(type, weights, n_cols, 0, n_rows, x, 1, y, 1);
    });
}

static luce_status checked_matmul(int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                                  int64_t n_cols, const float *x, int64_t n_tok, float *y, bool prefill) {
    return luce::guard([&] {
        const luce::TypeTraits &t = supported_traits(type);
        require_nbytes(t, nbytes, expected_bytes(t, n_rows, n_cols));
        if (n_tok <= 0) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "n_tok must be positive, got %lld", (long long)n_tok);
        if (weights == nullptr || x == nullptr || y == nullptr)
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "null buffer");
        luce::matmul_rows(type, weights, n_cols, 0, n_rows, x, n_tok, y, n_rows, prefill);
    });
}

LUCE_API luce_status luce_matmul(int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                                 int64_t n_cols, const float *x, int64_t n_tok, float *y) {
    return checked_matmul(type, weights, nbytes, n_rows, n_cols, x, n_tok, y, false);
}

LUCE_API luce_status luce_matmul_prefill(int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                                         int64_t n_cols, const float *x, int64_t n_tok, float *y) {
    return checked_matmul(type, weights, nbytes, n_rows, n_cols, x, n_tok, y, true);
}
