// matmul_int8.cu — y = W x for quantized W with int8 activations: the GPU twin of the CPU fast
// path (native/src/quants_kernels.h, QuantizedActs).
//
// Why int8 activations: a 4-bit weight dequantized to fp32 costs a multiply-add per weight and
// token; with the activations quantized once per matmul (blocks of 32 for Q8_0, 256 for the K and
// IQ types: d = amax / 127, q = rint(x * 127 / amax)), four weights meet four activations in one
// dp4a, and the per-block scales are applied once per 32 elements. The contract is the CPU's to
// the bit, so the integer part of every dot product is identical on both backends and GPU and
// CPU logits differ only by fp32 summation order.
//
// Work split: one warp per output row; lane l takes the 32-element units u = l, l + warpSize, ...
// of the row (a Q8_0 block or one sub-block of a 256-element block), loads the unit's weights
// once as eight packed int8 words and applies them to NT tokens. Every (row, token) output is
// summed in the same order whatever T and wherever the token sits in its tile (lane-local units
// in increasing u, then one fixed warp reduction), so a verify row is bit-identical to the
// decode step of the same token: speculative decoding's exactness rests on that.
#include "kernels.h"
#include "int8_units.cuh"
#include "quant_blocks.cuh"

namespace luce::gpu {

namespace {

using namespace int8_units;

// ---- int8 helpers ------------------------------------------------------------------------------

__device__ __forceinline__ int dot4(int a, int b, int c) {
#if defined(LUCE_HIP)
    const int8_t *pa = reinterpret_cast<const int8_t *>(&a), *pb = reinterpret_cast<const int8_t *>(&b);
    return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#else
    return __dp4a(a, b, c);
#endif
}

// acc += this unit . (token's quantized activations): dp4a dots of each 16-element half.
template <int TYPE>
__device__ __forceinline__ float apply_unit(const Unit &un, const int4 (&x)[2], float dx, int sum_lo, int sum_hi,
                                            float acc) {
    const int xw[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
    int lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) lo = dot4(int(un.q[i]), xw[i], lo);
#pragma unroll
    for (int i = 4; i < 8; ++i) hi = dot4(int(un.q[i]), xw[i], hi);
    return apply_dots<TYPE>(un.s, lo, hi, dx, sum_lo, sum_hi, acc);
}

// ---- kernels -----------------------------------------------------------------------------------

// One (activation block, token) per thread block of one warp: the CPU's quantize_block_scalar
// to the bit (fp32 amax, d = amax / 127, q = rint(x * (127 / amax)), non-finite -> 0), plus the
// sum of q over each 16 values.
__global__ void quantize_acts_kernel(const float *x, int n_in, int block, int8_t *q, float *d, int16_t *s16) {
    const int b = blockIdx.x, t = blockIdx.y;
    const float *xb = x + int64_t(t) * n_in + int64_t(b) * block;
    float amax = 0.f;
    for (int i = threadIdx.x; i < block; i += blockDim.x) amax = fmaxf(amax, fabsf(xb[i]));
    amax = warp_max(amax);
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    if (threadIdx.x == 0) d[int64_t(t) * (n_in / block) + b] = amax / 127.f;
    int8_t *qb = q + int64_t(t) * n_in + int64_t(b) * block;
    for (int i = threadIdx.x; i < block; i += blockDim.x) {
        const float r = rintf(xb[i] * id);
        qb[i] = r >= -127.f && r <= 127.f ? int8_t(r) : int8_t(0);
    }
    __syncthreads();  // the block is one warp; the sums read what other lanes wrote
    for (int g = threadIdx.x; g < block / 16; g += blockDim.x) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) s += qb[16 * g + i];
        s16[int64_t(t) * (n_in / 16) + int64_t(b) * (block / 16) + g] = int16_t(s);
    }
}

// R rows per warp: each token's activations are loaded once for R rows. Measured on an H200
// (2026-12-03, 27B): R = 2 at 9-32 tokens cut a 16-token verify step from 77.5 to 74.7 ms, but
// R = 4 at 2-8 tokens made those steps slower (width 2: 1.15x -> 1.51x width 1), so widths up
// to 8 keep R = 1 like decode: more warps, more weight loads in flight.
template <int TYPE, int NT, int R>
__global__ void matmul_int8_kernel(const uint8_t *w, int64_t row_bytes, int n_in, int64_t n_out, const int8_t *xq,
                                   const float *xd, const int16_t *xs, int act_block, int T, float *y, int64_t ldy) {
    const int lane = threadIdx.x % warpSize;
    const int64_t r0 = (int64_t(blockIdx.x) * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R;
    if (r0 >= n_out) return;  // whole warps leave together
    const int n_rows = int(n_out - r0 < R ? n_out - r0 : R);  // warp-uniform
    const int t0 = blockIdx.y * NT;
    const int n_units = n_in / 32, n_blocks = n_in / act_block, units_per_block = act_block / 32;
    float acc[R][NT];
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[k][t] = 0.f;
    // Decode (NT = 1) unrolls two units so each lane has two units' loads in flight.
#pragma unroll(NT == 1 ? 2 : 1)
    for (int u = lane; u < n_units; u += warpSize) {
        Unit un[R];
#pragma unroll
        for (int k = 0; k < R; ++k)
            if (k < n_rows) load_qunit<TYPE>(w + (r0 + k) * row_bytes, u, un[k]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int tok = t0 + t;
            if (tok >= T) break;
            const int4 *xp = reinterpret_cast<const int4 *>(xq + int64_t(tok) * n_in + 32 * int64_t(u));
            const int4 x[2] = {xp[0], xp[1]};
            const float dx = xd[int64_t(tok) * n_blocks + u / units_per_block];
            const int16_t *sp = xs + int64_t(tok) * (n_in / 16) + 2 * u;
            const int s_lo = sp[0], s_hi = sp[1];
#pragma unroll
            for (int k = 0; k < R; ++k)
                if (k < n_rows) acc[k][t] = apply_unit<TYPE>(un[k], x, dx, s_lo, s_hi, acc[k][t]);
        }
    }
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float s = warp_sum(acc[k][t]);
            if (lane == 0 && k < n_rows && t0 + t < T) y[int64_t(t0 + t) * ldy + r0 + k] = s;
        }
}

constexpr int MATMUL_THREADS = 128;

struct Int8Launch {
    cudaStream_t stream;
    int warp;
    const Weight &w;
    const ActScratch &a;
    int T;
    float *y;
    int64_t ldy;

    template <int TYPE, int NT, int R>
    void launch() const {
        const int rows_per_block = MATMUL_THREADS / warp * R;
        const dim3 grid(unsigned((w.n_out + rows_per_block - 1) / rows_per_block), unsigned((T + NT - 1) / NT));
        const int64_t row_bytes = w.n_in / block_elems(TYPE) * block_bytes(TYPE);
        matmul_int8_kernel<TYPE, NT, R><<<grid, MATMUL_THREADS, 0, stream>>>(
            static_cast<const uint8_t *>(w.data), row_bytes, int(w.n_in), w.n_out, a.q, a.d, a.s16,
            act_block_of(TYPE), T, y, ldy);
        LUCE_GPU_LAUNCHED();
    }

    template <int TYPE>
    void operator()() const {
        if constexpr (act_block_of(TYPE) == 0) {
            fail(LUCE_ERR_INTERNAL, "int8 matmul called for float type %d", TYPE);
        } else {
            if (T == 1) launch<TYPE, 1, 1>();
            else if (T <= 8) launch<TYPE, 8, 1>();
            else launch<TYPE, 32, 2>();
        }
    }
};

}  // namespace

int64_t act_scratch_bytes(int64_t n_in, int T) {
    const int64_t align = 256;
    auto up = [&](int64_t n) { return (n + align - 1) / align * align; };
    return up(T * n_in) + up(T * (n_in / 32) * int64_t(sizeof(float))) + up(T * (n_in / 16) * int64_t(sizeof(int16_t)));
}

ActScratch act_scratch_at(void *base, int64_t n_in, int T) {
    const int64_t align = 256;
    auto up = [&](int64_t n) { return (n + align - 1) / align * align; };
    auto *p = static_cast<uint8_t *>(base);
    ActScratch a;
    a.q = reinterpret_cast<int8_t *>(p);
    a.d = reinterpret_cast<float *>(p + up(T * n_in));
    a.s16 = reinterpret_cast<int16_t *>(p + up(T * n_in) + up(T * (n_in / 32) * int64_t(sizeof(float))));
    return a;
}

void quantize_acts(cudaStream_t stream, int warp, const float *x, int n_in, int T, int block, const ActScratch &a) {
    if (block <= 0 || n_in % block != 0) fail(LUCE_ERR_INTERNAL, "quantize_acts: block %d, n_in %d", block, n_in);
    quantize_acts_kernel<<<dim3(unsigned(n_in / block), unsigned(T)), warp, 0, stream>>>(x, n_in, block, a.q, a.d,
                                                                                         a.s16);
    LUCE_GPU_LAUNCHED();
}

void matmul_int8(cudaStream_t stream, int warp, const Weight &w, int T, float *y, int64_t ldy, const ActScratch &a) {
    const int block = act_block_of(w.type);
    if (block == 0 || w.n_in % block != 0) fail(LUCE_ERR_INTERNAL, "matmul_int8: type %d, n_in %lld", w.type,
                                                (long long)w.n_in);
    Int8Launch launch{stream, warp, w, a, T, y, ldy};
    if (!dispatch_type(w.type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU matmul for ggml type %d", w.type);
}

}  // namespace luce::gpu
