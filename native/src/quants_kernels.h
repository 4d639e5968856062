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
// block of kActBlock(type) values of a token row becomes d * q with
//   amax = max |x|,  d = amax / 127,  q = rint(x * (127 / amax))  in [-127, 127]
// (all in fp32, round-half-even; d = 0 and q = 0 for an all-zero block). sums16 holds the sum
// of q over each 16 consecutive values (the K types' min/offset terms need them).
// Layout: d [n_tok][n_cols / block], q [n_tok][n_cols], sums16 [n_tok][n_cols / 16].
struct QuantizedActs {
    int64_t n_cols = 0, n_tok = 0, block = 0;
    float *d = nullptr;
    int8_t *q = nullptr;
    int16_t *sums16 = nullptr;
};

// Activation block size used with weights of `type`: 32 for Q8_0, 256 for the K and IQ types,
// 0 for float weights (which take fp32 activations as they are).
int64_t act_block(int32_t type);

// Quantizes x [n_tok][n_cols] into a thread-local buffer reused across calls (no allocation
// per token once warm). n_cols must be a multiple of block.
QuantizedActs quantize_acts(const float *x, int64_t n_cols, int64_t n_tok, int64_t block);

// Runs the fastest SIMD matmul the CPU supports for `type`; false if there is none (the
// caller then runs matmul_rows_reference). Same contract as matmul_rows.
bool matmul_rows_simd(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                      int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy);

}  // namespace luce
