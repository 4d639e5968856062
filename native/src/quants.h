// quants.h — ggml weight encodings: block layouts, dequantization and dot products.
//
// The types real Qwen3.5-family GGUFs use are kept in their GGUF encoding and consumed here
// directly; no whole-model dequantization. Every supported type has an AVX2 kernel (quantized
// types over int8 activations); F32/F16/BF16, Q8_0, Q4_K/Q5_K/Q6_K and IQ4_XS also an AVX-512
// one (the others run their AVX2 kernel there); without AVX2 a scalar path of the same contract.
// Layouts follow ggml exactly (spec/qwen35.md §4).
// Every function accumulates in fp32. Callers validate sizes; these kernels trust n/rows/cols.
#pragma once

#include <cstddef>
#include <cstdint>

namespace luce {

// ggml type ids as stored in GGUF tensor infos.
enum GgmlType : int32_t {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q2_K = 10,
    GGML_Q3_K = 11,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_IQ2_XXS = 16,
    GGML_IQ2_XS = 17,
    GGML_IQ3_XXS = 18,
    GGML_IQ1_S = 19,
    GGML_IQ4_NL = 20,
    GGML_IQ3_S = 21,
    GGML_IQ2_S = 22,
    GGML_IQ4_XS = 23,
    GGML_IQ1_M = 29,
    GGML_BF16 = 30,
};

struct TypeTraits {
    const char *name;     // ggml's name: "q4_K", "iq4_xs", ...
    int64_t block_elems;  // elements per block (1 for float types)
    int64_t block_bytes;  // bytes per block
    bool supported;       // weights of this type can be computed with
};

// Traits for any ggml type id known to the format (also unsupported ones, so that a
// per-type histogram can name them); nullptr for ids ggml does not define.
const TypeTraits *type_traits(int32_t type);
bool is_supported_weight_type(int32_t type);

// Bytes of a row of n elements; throws luce::Error(LUCE_ERR_FORMAT) if n is not a multiple
// of the block size or the type is unknown.
int64_t row_bytes(int32_t type, int64_t n);

// dst[0..n) = dequantized src (n a multiple of the block size).
void dequantize_row(int32_t type, const void *src, float *dst, int64_t n);

// y[t * ldy + r] = dot(W row r, x[t * n_cols ..]) for r in [row_begin, row_end), t in [0, n_tok).
// W is row-major with rows of n_cols elements in `type`; each weight row is read once for all
// n_tok activations (the decode/verify/prefill matmul). Thread-safe; callers split rows.
// Quantized weights multiply int8-quantized activations, as llama.cpp does: each block of 32
// (the 32-element types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) or 256 values of x becomes d*q, d = max|x|/127 (contract and error
// bound: quants_kernels.h, docs/architecture-quants.md); float weights use x as it is.
// Every y[t][r] depends on x[t] and row r alone, bit for bit, whatever n_tok and the row range
// (verify steps reproduce one-token steps). With `prefill` (prompt prefill, Backend::set_prefill)
// a type may take kernels of another fp32 summation order, the same bound; rows still do not
// depend on each other or on n_tok.
void matmul_rows(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                 const float *x, int64_t n_tok, float *y, int64_t ldy, bool prefill = false);

// Same contract as matmul_rows, computed the plain way: each weight chunk dequantized exactly
// (as dequantize_row) and dotted with the fp32 activations in fp32. matmul_rows uses this when
// no SIMD kernel applies; it is also the reference the fast kernels are tested against, and the
// path to use when results must not depend on activation rounding (docs/architecture-quants.md).
void matmul_rows_reference(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                           int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy);

}  // namespace luce
