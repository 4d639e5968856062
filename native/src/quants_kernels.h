// quants_kernels.h — internals shared by the scalar and SIMD quant kernels (not part of the
// runtime's interface; the runtime includes quants.h only).
#pragma once

#include <cstdint>

namespace luce {

// IEEE binary16 -> binary32, exact for every bit pattern.
float f16_to_f32(uint16_t h);

// kvalues_iq4nl: the non-linear 4-bit codebook of IQ4_NL / IQ4_XS.
extern const int8_t kIq4nlValues[16];

// 6-bit scale and min of sub-block j (0..7) from the 12 packed scale bytes of Q4_K / Q5_K.
void k_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m);

// Activations as the quantized-weight kernels consume them (llama.cpp does the same): each
// block of act_block(type) values of a token row becomes d * q with
//   amax = max |x|,  d = amax / 127,  q = rint(x * (127 / amax))  in [-127, 127]
// (all in fp32, round-half-even; d = 0 and q = 0 for an all-zero block). sums16 holds the sum
// of q over each 16 consecutive values (the K types' min/offset terms need them).
// Layout: d [n_tok][n_cols / block]; q [n_tok][q_stride]; sums16 [n_tok][s_stride]. The row
// strides are padded past n_cols (n_cols / 16) by 64 bytes: rows 4 KiB apart would all fall in
// the same L1 sets and evict each other when a tile of tokens is read together.
struct QuantizedActs {
    int64_t n_cols = 0, n_tok = 0, block = 0, q_stride = 0, s_stride = 0;
    float *d = nullptr;
    int8_t *q = nullptr;
    int16_t *sums16 = nullptr;
};

// Activation block size used with weights of `type`: 32 for the 32-element types (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, IQ4_NL: one activation block per weight block, as llama.cpp's q8_0 / q8_1),
// 256 for the K and IQ types, 0 for float weights (which take fp32 activations as they are).
int64_t act_block(int32_t type);

// Quantizes one block of `block` values (a multiple of 32): q[0..block), *d. Each ISA has its
// own; all give identical results (the operations are exact or correctly rounded).
using QuantizeBlockFn = void (*)(const float *x, int64_t block, int8_t *q, float *d);
void quantize_block_scalar(const float *x, int64_t block, int8_t *q, float *d);

// Quantizes x [n_tok][n_cols] into a thread-local buffer reused across calls (no allocation
// per token once warm). n_cols must be a multiple of block.
QuantizedActs quantize_acts(const float *x, int64_t n_cols, int64_t n_tok, int64_t block,
                            QuantizeBlockFn quantize_block = quantize_block_scalar);

// Columns per pass of the SIMD matmuls: a multiple of 256 (every block size divides it) small
// enough that the activations of a tile of tile_tokens tokens for one pass (1 byte per value
// when quantized, 4 as fp32) stay in L1 while every weight row of the pass is applied to them;
// n_cols itself when that already fits, and for the 1-3-bit types. A row's fp32 sum restarts at
// each pass, so every token count runs the same passes (a lone token row by row: two passes
// over a 5120x17408 Q4_K matrix, each over all rows, measured 2.7x slower than one, the
// strided reads defeating the prefetchers).
int64_t column_chunk(int32_t type, int64_t n_cols, int64_t tile_tokens);

// Runs the fastest SIMD matmul the CPU supports for `type`; false if there is none (the
// caller then runs matmul_rows_reference). Same contract as matmul_rows.
bool matmul_rows_simd(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                      int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy, bool prefill);

}  // namespace luce
