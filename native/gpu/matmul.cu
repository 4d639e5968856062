// matmul.cu — y = W x over weights kept in their GGUF encoding, and the embedding gather.
//
// One warp per weight row (a block per row on matrices of few rows: matmul_split_kernel). Lane l dequantizes units u = l, l + LUCE_WARP, ... of the row (32
// elements each, quant_blocks.cuh) into registers and applies each unit to NT tokens at once,
// so a step of T tokens streams the weight row from memory once per NT-token tile; tiles after
// the first re-read the row from L1/L2, not from DRAM (a row is a few KB). NT = 1 is the decode
// GEMV; NT = 16 serves verify widths (one pass up to 16) and prefill chunks (T <= 64, 4 passes).
// Two widths x eight types x two kernels are all the instantiations there are, to keep the CUDA
// compile short.
#include "kernels.h"
#include "quant_blocks.cuh"

namespace luce::gpu {

namespace {

// ---- kernels -----------------------------------------------------------------------------------

// One 32-element unit of a row (wv, n_valid of its values) against a token's activations there.
__device__ __forceinline__ float unit_dot(const float (&wv)[32], const float *xt, int n_valid) {
    float s = 0.f;
    if (n_valid == 32 && (reinterpret_cast<uintptr_t>(xt) & 15) == 0) {
        // 16-byte loads of the activation chunk (the common case: n_in % 4 == 0).
        const float4 *x4 = reinterpret_cast<const float4 *>(xt);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float4 v = x4[i];
            s += wv[4 * i] * v.x + wv[4 * i + 1] * v.y + wv[4 * i + 2] * v.z + wv[4 * i + 3] * v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i)
            if (i < n_valid) s += wv[i] * xt[i];
    }
    return s;
}

// acc[t] += the row's units first, first + stride, ... against tokens t0 + t < t_end.
template <int TYPE, int NT>
__device__ __forceinline__ void row_units(const uint8_t *row, int n_in, int first, int stride, const float *x, int t0,
                                          int t_end, float (&acc)[NT]) {
    const int n_units = (n_in + 31) / 32;
    for (int u = first; u < n_units; u += stride) {
        const int n_valid = min(32, n_in - 32 * u);
        float wv[32];
        load_unit<TYPE>(row, u, n_valid, wv);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t0 + t >= t_end) break;
            acc[t] += unit_dot(wv, x + int64_t(t0 + t) * n_in + 32 * u, n_valid);
        }
    }
}

template <int TYPE, int NT>
__global__ void matmul_kernel(const uint8_t *w, int64_t row_bytes, int n_in, int64_t n_out,
                              const float *x, int T, float *y, int64_t ldy) {
    wait_for_inputs();
    const int lane = threadIdx.x % LUCE_WARP;
    const int64_t r = int64_t(blockIdx.x) * (blockDim.x / LUCE_WARP) + threadIdx.x / LUCE_WARP;
    if (r >= n_out) return;  // whole warps leave together: no block-level sync below
    const uint8_t *row = w + r * row_bytes;
    for (int t0 = 0; t0 < T; t0 += NT) {
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = 0.f;
        row_units<TYPE, NT>(row, n_in, lane, LUCE_WARP, x, t0, T, acc);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float s = warp_sum(acc[t]);
            if (lane == 0 && t0 + t < T) y[int64_t(t0 + t) * ldy + r] = s;
        }
    }
}

// Matrices of few rows (the DeltaNet's alpha/beta projections, 48 x 5120) left the device idle
// at one warp per row: 48 warps, each walking its row's units in turn, ~51 GB/s at decode (19 us
// a call on an H100) and 2.7 ms at 512 tokens. Here a block of SPLIT_WARPS warps owns one row and
// SPLIT_TOKENS tokens (grid: rows x token chunks): every thread takes one unit in flight, and a
// prompt's tokens spread over many blocks. Thread i sums units i, i + blockDim, ... for each
// token, the warps' sums meet in warp order: nothing depends on T or on a token's chunk, so a
// verify row has the bits of its one-token step. Which kernel runs depends on the matrix alone.
constexpr int SPLIT_WARPS = 4, SPLIT_TOKENS = 64;
constexpr int64_t SPLIT_MAX_ROWS = 1024;

template <int TYPE, int NT>
__global__ void matmul_split_kernel(const uint8_t *w, int64_t row_bytes, int n_in, const float *x, int T, float *y,
                                    int64_t ldy) {
    __shared__ float part[SPLIT_WARPS][NT];
    wait_for_inputs();
    const int lane = threadIdx.x % LUCE_WARP, warp = threadIdx.x / LUCE_WARP;
    const int64_t r = blockIdx.x;
    const int t_begin = int(blockIdx.y) * SPLIT_TOKENS, t_end = min(T, t_begin + SPLIT_TOKENS);
    for (int t0 = t_begin; t0 < t_end; t0 += NT) {
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = 0.f;
        row_units<TYPE, NT>(w + r * row_bytes, n_in, int(threadIdx.x), int(blockDim.x), x, t0, t_end, acc);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float s = warp_sum(acc[t]);
            if (lane == 0) part[warp][t] = s;
        }
        __syncthreads();
        if (int(threadIdx.x) < NT && t0 + int(threadIdx.x) < t_end) {
            float s = part[0][threadIdx.x];
            for (int k = 1; k < SPLIT_WARPS; ++k) s += part[k][threadIdx.x];
            y[int64_t(t0 + threadIdx.x) * ldy + r] = s;
        }
        __syncthreads();  // part is rewritten by the next tile
    }
}

// out[t][:] = dequantized row ids[t]; one thread per (unit, token).
template <int TYPE>
__global__ void get_rows_kernel(const uint8_t *w, int64_t row_bytes, int n_in, const int32_t *ids,
                                float *out) {
    wait_for_inputs();
    const int t = blockIdx.y;
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (32 * u >= n_in) return;
    const int n_valid = min(32, n_in - 32 * u);
    float wv[32];
    load_unit<TYPE>(w + int64_t(ids[t]) * row_bytes, u, n_valid, wv);
    float *dst = out + int64_t(t) * n_in + 32 * u;
#pragma unroll
    for (int i = 0; i < 32; ++i)
        if (i < n_valid) dst[i] = wv[i];
}

// The GPU's IQ4_XS / IQ4_NL layout, in place: each 32-element unit's 16 code bytes re-paired so
// byte m holds elements 2m (low nibble) and 2m + 1 (high nibble), GGUF's holding m and m + 16,
// and every code renumbered (iq4_gpu_code, quant_blocks.cuh). A lookup of four bytes then yields
// eight consecutive values with no permute to separate the halves, two permutes per four codes
// (int8_units.cuh, lookup8). One thread per unit; d and the scales stay in place.
template <int TYPE>
__global__ void repack_iq4_kernel(uint8_t *w, int64_t n_units) {
    wait_for_inputs();
    const int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (u >= n_units) return;
    // IQ4_XS: f16 d, u16 scales_h, u8 scales_l[4], qs[128]; IQ4_NL: f16 d, qs[16].
    constexpr int BLOCK = block_bytes(TYPE), UNITS = block_elems(TYPE) / 32;
    uint8_t *qs = w + BLOCK * (u / UNITS) + (TYPE == GGML_IQ4_XS ? 8 + 16 * (u % UNITS) : 2);
    uint8_t in[16], out[16];
    for (int i = 0; i < 16; ++i) in[i] = qs[i];
    iq4_xs_codes_to_gpu(in, out);
    for (int i = 0; i < 16; ++i) qs[i] = out[i];
}

// The GPU's Q6_K layout (quant_blocks.cuh, q6k_word), in place: one thread per 210-byte block,
// which reads the whole block before it writes. Block b of the tensor is odd when b is: the
// tensor starts 4-aligned (checked by the launcher), so that is its address's bit 1.
__global__ void repack_q6_k_kernel(uint8_t *w, int64_t n_blocks) {
    wait_for_inputs();
    const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (b >= n_blocks) return;
    constexpr int BLOCK = block_bytes(GGML_Q6_K);
    uint8_t *blk = w + BLOCK * b;
    uint8_t in[BLOCK], out[BLOCK];
    for (int i = 0; i < BLOCK; ++i) in[i] = blk[i];
    q6_k_block_to_gpu(in, out, b % 2 != 0);
    for (int i = 0; i < BLOCK; ++i) blk[i] = out[i];
}

// ---- launchers ---------------------------------------------------------------------------------

constexpr int MATMUL_THREADS = 128;  // 4 rows per block on wave32 parts, 2 on wave64
constexpr int GET_ROWS_THREADS = 64;

int64_t weight_row_bytes(const Weight &w) {
    return w.n_in / block_elems(w.type) * block_bytes(w.type);
}

struct MatmulLaunch {
    cudaStream_t stream;
    int warp;
    const Weight &w;
    const float *x;
    int T;
    float *y;
    int64_t ldy;

    template <int TYPE>
    void operator()() const {
        const auto *wd = static_cast<const uint8_t *>(w.data);
        if (w.n_out <= SPLIT_MAX_ROWS) {
            const dim3 grid(unsigned(w.n_out), unsigned((T + SPLIT_TOKENS - 1) / SPLIT_TOKENS));
            if (T == 1)
                launch_kernel(matmul_split_kernel<TYPE, 1>, grid, SPLIT_WARPS * warp, 0, stream, wd,
                              weight_row_bytes(w), int(w.n_in), x, T, y, ldy);
            else
                launch_kernel(matmul_split_kernel<TYPE, 16>, grid, SPLIT_WARPS * warp, 0, stream, wd,
                              weight_row_bytes(w), int(w.n_in), x, T, y, ldy);
            return;
        }
        const int rows_per_block = MATMUL_THREADS / warp;
        const unsigned blocks = unsigned((w.n_out + rows_per_block - 1) / rows_per_block);
        if (T == 1)
            launch_kernel(matmul_kernel<TYPE, 1>, blocks, MATMUL_THREADS, 0, stream, wd, weight_row_bytes(w),
                          int(w.n_in), w.n_out, x, T, y, ldy);
        else
            launch_kernel(matmul_kernel<TYPE, 16>, blocks, MATMUL_THREADS, 0, stream, wd, weight_row_bytes(w),
                          int(w.n_in), w.n_out, x, T, y, ldy);
    }
};

struct GetRowsLaunch {
    cudaStream_t stream;
    const Weight &w;
    const int32_t *ids;
    int T;
    float *out;

    template <int TYPE>
    void operator()() const {
        const int n_units = int((w.n_in + 31) / 32);
        const dim3 grid(unsigned((n_units + GET_ROWS_THREADS - 1) / GET_ROWS_THREADS), unsigned(T));
        launch_kernel(get_rows_kernel<TYPE>, grid, GET_ROWS_THREADS, 0, stream, static_cast<const uint8_t *>(w.data),
                      weight_row_bytes(w), int(w.n_in), ids, out);
    }
};

}  // namespace

void matmul(cudaStream_t stream, int warp, const Weight &w, const float *x, int T, float *y, int64_t ldy) {
    if (T < 1 || w.n_out < 1) return;
    MatmulLaunch launch{stream, warp, w, x, T, y, ldy};
    if (!dispatch_type(w.type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU matmul for ggml type %d", w.type);
}

void repack_weights(cudaStream_t stream, int type, void *data, int64_t n_bytes) {
    if (type != GGML_IQ4_XS && type != GGML_IQ4_NL && type != GGML_Q6_K) return;  // the others keep GGUF's bytes
    const int block = block_bytes(type);
    if (n_bytes % block != 0 || reinterpret_cast<uintptr_t>(data) % 4 != 0)
        fail(LUCE_ERR_INTERNAL, "repack_weights: %lld bytes of type %d", (long long)n_bytes, type);
    constexpr int threads = 256;
    const auto blocks_for = [](int64_t n) { return unsigned((n + threads - 1) / threads); };
    auto *w = static_cast<uint8_t *>(data);
    if (type == GGML_IQ4_XS) {
        const int64_t n_units = n_bytes / block * 8;
        launch_kernel(repack_iq4_kernel<GGML_IQ4_XS>, blocks_for(n_units), threads, 0, stream, w, n_units);
    } else if (type == GGML_IQ4_NL) {
        const int64_t n_units = n_bytes / block;
        launch_kernel(repack_iq4_kernel<GGML_IQ4_NL>, blocks_for(n_units), threads, 0, stream, w, n_units);
    } else {
        launch_kernel(repack_q6_k_kernel, blocks_for(n_bytes / block), threads, 0, stream, w, n_bytes / block);
    }
}

void get_rows(cudaStream_t stream, const Weight &w, const int32_t *ids, int T, float *out) {
    if (T < 1) return;
    GetRowsLaunch launch{stream, w, ids, T, out};
    if (!dispatch_type(w.type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU get_rows for ggml type %d", w.type);
}

}  // namespace luce::gpu
