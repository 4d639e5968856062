// norms.cu — RMSNorm (plain and gated) and the elementwise ops of the forward.
//
// One block per row for the norms: the sum of squares is a block reduction, then every thread
// scales the elements it read. A thread writes only elements it read itself, after the reduction's
// barrier, so y may alias x (the forward normalises k in place).
#include <algorithm>

#include "kernels.h"
#include "row_math.cuh"

namespace luce::gpu {

namespace {

// ---- kernels -----------------------------------------------------------------------------------

constexpr int NORM_THREADS = 256;
// A hidden-state row (5120 on a 27B) is one block; 20 strided loads per thread of 256 were
// ~13 us per norm on an H200 (2026-12-03, mostly load latency), so wide rows get 1024 threads.
// (The norms are compiled for 1024-thread blocks: 64 registers at most, or the launch fails.)
constexpr int WIDE_NORM_THREADS = 1024;
constexpr int WIDE_NORM_DIM = 2048;

// The row's output, already written by the whole block, quantized for the next matmul: warp w
// takes the row's activation blocks w, w + n_warps, ... (rows are contiguous: y_stride == dim).
__device__ __forceinline__ void quantize_row(const FusedQuant &fq, const float *y, int dim) {
    if (!fq.q) return;
    __syncthreads();  // every thread's outputs are visible to the whole block
    const int n_blocks = dim / fq.block, warp = threadIdx.x / LUCE_WARP, n_warps = blockDim.x / LUCE_WARP;
    for (int b = warp; b < n_blocks; b += n_warps) fq.block_at(y, int64_t(blockIdx.x) * n_blocks + b);
}

__global__ void __launch_bounds__(WIDE_NORM_THREADS) rmsnorm_kernel(const float *x, int64_t x_stride, const float *w, int dim, float eps,
                               float *y, int64_t y_stride, FusedQuant fq) {
    wait_for_inputs();
    const float *xr = x + blockIdx.x * x_stride;
    float *yr = y + blockIdx.x * y_stride;
    const float scale = row_rms_scale(xr, dim, eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
    quantize_row(fq, y, dim);
}

// x += y, then out = rmsnorm(x) * w, quantized for the next matmul when fq asks. Warp w owns the
// row's chunks of NORM_CHUNK values w, w + n_warps, ..., lane l their values l + k * LUCE_WARP,
// held in registers from the add to the quantization: quantize_values_warp's lane mapping, so
// an activation block of NORM_CHUNK values is quantized straight from them (other block sizes
// read the output back). On an H200 (2026-12-03) a strided 1024-thread form, which read
// x back after the add and the output back for the quantization, took ~11 us per decode step's
// call: a chain of three round trips to L2 on one SM.
//
// Every load is issued before the first store: x, y, w and out may alias as far as the compiler
// knows, so a store between two loads would make each load wait for the one before (the add's
// stores of x sat between the loads of x and y, the output's between those of w). The weights
// are loaded before wait_for_inputs(): they do not depend on the previous kernel.
//
// A row is one block, on one SM, so its instructions are the kernel's time: rows of whole chunks
// (every hidden size; WHOLE) test a chunk once per warp instead of every value (with the values'
// tests and addresses, 1500 instructions per warp, 8 us a call; H200 ncu, 2026-12-04).
constexpr int NORM_CHUNK = 256;
// 768 threads at most, so the 32 values a lane holds stay in registers (1024 spilled).
constexpr int ADD_NORM_THREADS = 768;
constexpr int NORM_MAX_CHUNKS = 2;  // per warp: rows of up to 2 x 24 x 256 values (wave32)

// The calling lane's values in a row: value k of the warp's chunk c is at at(c, k), in the row
// when has(c, k).
template <bool WHOLE>
struct ChunkLanes {
    int dim, lane = threadIdx.x % LUCE_WARP, warp = threadIdx.x / LUCE_WARP, n_warps = blockDim.x / LUCE_WARP;

    __device__ int chunk(int c) const { return warp + c * n_warps; }
    __device__ int at(int c, int k) const { return chunk(c) * NORM_CHUNK + lane + k * LUCE_WARP; }
    __device__ bool has(int c, int k) const {
        return k * LUCE_WARP < NORM_CHUNK && (WHOLE ? chunk(c) * NORM_CHUNK < dim : at(c, k) < dim);
    }
};

template <bool WHOLE>
__global__ void __launch_bounds__(ADD_NORM_THREADS) add_rmsnorm_kernel(float *x, const float *y, const float *w,
                                                                        int dim, float eps, float *out,
                                                                        FusedQuant fq) {
    const ChunkLanes<WHOLE> lanes{dim};
    const int64_t row = int64_t(blockIdx.x) * dim;
    float v[NORM_MAX_CHUNKS][QUANT_MAX_PER_LANE], wv[NORM_MAX_CHUNKS][QUANT_MAX_PER_LANE];
#pragma unroll
    for (int c = 0; c < NORM_MAX_CHUNKS; ++c)
#pragma unroll
        for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) wv[c][k] = lanes.has(c, k) ? w[lanes.at(c, k)] : 0.f;
    wait_for_inputs();
#pragma unroll
    for (int c = 0; c < NORM_MAX_CHUNKS; ++c)
#pragma unroll
        for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
            const int64_t i = row + lanes.at(c, k);
            v[c][k] = lanes.has(c, k) ? x[i] + y[i] : 0.f;
        }
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < NORM_MAX_CHUNKS; ++c)
#pragma unroll
        for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
            if (lanes.has(c, k)) x[row + lanes.at(c, k)] = v[c][k];
            ss += v[c][k] * v[c][k];  // zero past the row
        }
    const float scale = 1.0f / sqrtf(block_sum(ss) / float(dim) + eps);
#pragma unroll
    for (int c = 0; c < NORM_MAX_CHUNKS; ++c)
#pragma unroll
        for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
            v[c][k] = v[c][k] * scale * wv[c][k];
            if (lanes.has(c, k)) out[row + lanes.at(c, k)] = v[c][k];
        }
    if (!fq.q) return;
    if (fq.block != NORM_CHUNK) return quantize_row(fq, out, dim);
#pragma unroll
    for (int c = 0; c < NORM_MAX_CHUNKS; ++c) {
        if (lanes.chunk(c) * NORM_CHUNK < dim) fq.values_at(v[c], row / NORM_CHUNK + lanes.chunk(c));
    }
}

// o = rmsnorm(o) * w * silu(z), rows of `dim` (DeltaNet output norm): one block per row, for
// shapes rmsnorm_gated_blocks_kernel does not take.
__global__ void rmsnorm_gated_kernel(float *o, const float *w, const float *z, int dim, float eps) {
    wait_for_inputs();
    float *orow = o + int64_t(blockIdx.x) * dim;
    const float *zr = z + int64_t(blockIdx.x) * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += orow[i] * orow[i];
    const float scale = 1.0f / sqrtf(block_sum(ss) / float(dim) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = orow[i] * scale * w[i] * silu(zr[i]);
}

// The same by activation blocks: one warp per NORM_CHUNK values, which are whole rows of DIM (DIM
// divides NORM_CHUNK and is a multiple of the warp); lane l holds values l + k * LUCE_WARP, of
// row k * LUCE_WARP / DIM of the block, so each row's sum of squares is one warp sum and the
// output is quantized from the registers for the next matmul (ssm_out): a decode step's 48
// standalone quantizations go. The fp32 order depends on the shape alone, never on T.
template <int DIM>
__global__ void rmsnorm_gated_blocks_kernel(float *o, const float *w, const float *z, float eps, FusedQuant fq) {
    constexpr int ROWS = NORM_CHUNK / DIM;
    static_assert(ROWS * DIM == NORM_CHUNK && ROWS <= QUANT_MAX_PER_LANE, "whole rows per block");
    const int lane = threadIdx.x % LUCE_WARP;
    const int64_t first = int64_t(blockIdx.x) * NORM_CHUNK + lane;
    bool has[QUANT_MAX_PER_LANE];  // value k of the lane is in the block (fewer values per lane on wave64)
    float v[QUANT_MAX_PER_LANE], zv[QUANT_MAX_PER_LANE], wv[QUANT_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        has[k] = k * LUCE_WARP < NORM_CHUNK;
        wv[k] = has[k] ? w[(lane + k * LUCE_WARP) % DIM] : 0.f;
    }
    wait_for_inputs();
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        v[k] = has[k] ? o[first + k * LUCE_WARP] : 0.f;
        zv[k] = has[k] ? z[first + k * LUCE_WARP] : 0.f;
    }
    float ss[ROWS] = {};
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k)
        if (has[k]) ss[k * LUCE_WARP / DIM] += v[k] * v[k];
    float scale[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) scale[r] = 1.0f / sqrtf(warp_sum(ss[r]) / float(DIM) + eps);
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        v[k] = has[k] ? v[k] * scale[k * LUCE_WARP / DIM] * wv[k] * silu(zv[k]) : 0.f;
        if (has[k]) o[first + k * LUCE_WARP] = v[k];
    }
    if (!fq.q) return;
    if (fq.block == NORM_CHUNK) return fq.values_at(v, blockIdx.x);
    __syncthreads();  // smaller activation blocks (Q8_0's 32) are read back (the block is the one warp)
    for (int sb = 0; sb < NORM_CHUNK / fq.block; ++sb) fq.block_at(o, int64_t(blockIdx.x) * (NORM_CHUNK / fq.block) + sb);
}

// The elementwise ops: output value i is apply(load(i)), from loads only (the kernels store it).
// Loading and computing are apart so a kernel can issue all of a lane's loads before the first
// computation waits on one: with op(i) in one piece, the fused-quantization kernel below made one
// round trip to L2 per value (a decode step's SwiGLU took 9 us; H200 ncu, 2026-12-04).
struct MulSigmoid {
    const float *o;
    const float *g;
    int64_t g_stride;
    int dim;
    struct In {
        float o, g;
    };
    __device__ In load(int64_t i) const { return {o[i], g[(i / dim) * g_stride + i % dim]}; }
    __device__ static float apply(In in) { return in.o * sigmoid(in.g); }
};

struct Swiglu {
    const float *gate;
    const float *up;
    struct In {
        float gate, up;
    };
    __device__ In load(int64_t i) const { return {gate[i], up[i]}; }
    __device__ static float apply(In in) { return silu(in.gate) * in.up; }
};

// out[i] = op's value i for the n values (out may be one of op's inputs: each value is read
// before it is written, by the same thread).
template <class Op>
__global__ void elementwise_kernel(Op op, float *out, int64_t n) {
    wait_for_inputs();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = Op::apply(op.load(i));
}

// The same, one warp per activation block of `out`, which it then quantizes for the next matmul
// from the values its lanes hold (lane l: values l, l + LUCE_WARP, ...). Every input is loaded
// before the first value is computed and every value computed before the first store.
template <class Op>
__global__ void elementwise_quant_kernel(Op op, float *out, int64_t n_blocks, FusedQuant fq) {
    wait_for_inputs();
    const int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / LUCE_WARP;
    if (b >= n_blocks) return;  // whole warps
    const int lane = threadIdx.x % LUCE_WARP;
    const int64_t first = b * fq.block + lane;
    bool has[QUANT_MAX_PER_LANE];  // value k of the lane is in the block
    typename Op::In in[QUANT_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) {
        has[k] = lane + k * LUCE_WARP < fq.block;
        if (has[k]) in[k] = op.load(first + k * LUCE_WARP);
    }
    float v[QUANT_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k) v[k] = has[k] ? Op::apply(in[k]) : 0.f;
#pragma unroll
    for (int k = 0; k < QUANT_MAX_PER_LANE; ++k)
        if (has[k]) out[first + k * LUCE_WARP] = v[k];
    fq.values_at(v, b);
}

__global__ void add_kernel(float *x, const float *y, int64_t n) {
    wait_for_inputs();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] += y[i];
}

// ---- launchers ---------------------------------------------------------------------------------

constexpr int ELEMENTWISE_THREADS = 256;
constexpr int64_t MAX_ELEMENTWISE_BLOCKS = 4096;  // grid-stride beyond this

unsigned elementwise_blocks(int64_t n) {
    return unsigned(std::min<int64_t>((n + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS, MAX_ELEMENTWISE_BLOCKS));
}

}  // namespace

int norm_threads(int dim) { return dim >= WIDE_NORM_DIM ? WIDE_NORM_THREADS : NORM_THREADS; }

void rmsnorm(cudaStream_t stream, const float *x, int64_t x_stride, const float *w, int n_rows, int dim,
             float eps, float *y, int64_t y_stride, const FusedQuant &fq) {
    if (n_rows < 1) return;
    if (fq.q && (y_stride != dim || dim % fq.block != 0)) fail(LUCE_ERR_INTERNAL, "rmsnorm: cannot quantize this output");
    launch_kernel(rmsnorm_kernel, n_rows, norm_threads(dim), 0, stream, x, x_stride, w, dim, eps, y, y_stride, fq);
}

void add_rmsnorm(cudaStream_t stream, int warp, float *x, const float *y, const float *w, int n_rows, int dim,
                 float eps, float *out, const FusedQuant &fq) {
    if (n_rows < 1) return;
    if (fq.q && dim % fq.block != 0) fail(LUCE_ERR_INTERNAL, "add_rmsnorm: cannot quantize this output");
    const int chunks = (dim + NORM_CHUNK - 1) / NORM_CHUNK, max_warps = ADD_NORM_THREADS / warp;
    const int warps = std::min(chunks, max_warps);
    if (chunks > warps * NORM_MAX_CHUNKS) fail(LUCE_ERR_UNSUPPORTED, "add_rmsnorm: rows of %d values", dim);
    if (dim % NORM_CHUNK == 0)
        launch_kernel(add_rmsnorm_kernel<true>, n_rows, warps * warp, 0, stream, x, y, w, dim, eps, out, fq);
    else
        launch_kernel(add_rmsnorm_kernel<false>, n_rows, warps * warp, 0, stream, x, y, w, dim, eps, out, fq);
}

bool rmsnorm_gated_by_blocks(int warp, int n_heads, int dim) {
    const bool dims = dim == 32 || dim == 64 || dim == 128 || dim == 256;
    return dims && dim % warp == 0 && int64_t(n_heads) * dim % NORM_CHUNK == 0;
}

void rmsnorm_gated(cudaStream_t stream, int warp, float *o, const float *w, const float *z, int T, int n_heads,
                   int dim, float eps, const FusedQuant &fq) {
    const int64_t n_rows = int64_t(T) * n_heads;
    if (n_rows < 1) return;
    if (!rmsnorm_gated_by_blocks(warp, n_heads, dim)) {
        if (fq.q) fail(LUCE_ERR_INTERNAL, "rmsnorm_gated: rows of %d cannot quantize their output", dim);
        return launch_kernel(rmsnorm_gated_kernel, unsigned(n_rows), NORM_THREADS, 0, stream, o, w, z, dim, eps);
    }
    if (fq.q && NORM_CHUNK % fq.block != 0) fail(LUCE_ERR_INTERNAL, "rmsnorm_gated: activation blocks of %d", fq.block);
    const unsigned blocks = unsigned(n_rows * dim / NORM_CHUNK);
    switch (dim) {
    case 32: return launch_kernel(rmsnorm_gated_blocks_kernel<32>, blocks, warp, 0, stream, o, w, z, eps, fq);
    case 64: return launch_kernel(rmsnorm_gated_blocks_kernel<64>, blocks, warp, 0, stream, o, w, z, eps, fq);
    case 128: return launch_kernel(rmsnorm_gated_blocks_kernel<128>, blocks, warp, 0, stream, o, w, z, eps, fq);
    default: return launch_kernel(rmsnorm_gated_blocks_kernel<256>, blocks, warp, 0, stream, o, w, z, eps, fq);
    }
}

// op over n values of `out`, quantized afterwards when fq asks for it.
template <class Op>
void launch_elementwise(cudaStream_t stream, int warp, Op op, float *out, int64_t n, const FusedQuant &fq) {
    if (n < 1) return;
    if (!fq.q) {
        launch_kernel(elementwise_kernel<Op>, elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream, op, out, n);
    } else {
        // One warp per launch block, as quantize_acts: a decode step's SwiGLU is 68 activation
        // blocks, which in launch blocks of 8 warps sat on 9 SMs (9.8 us a call against
        // quantize_acts' 3.8 for 20 warps on 20; H200 ncu, 2026-12-04).
        if (n % fq.block != 0) fail(LUCE_ERR_INTERNAL, "elementwise op: %lld values in blocks of %d", (long long)n, fq.block);
        const int64_t n_blocks = n / fq.block;
        launch_kernel(elementwise_quant_kernel<Op>, unsigned(n_blocks), warp, 0, stream, op, out, n_blocks, fq);
    }
}

void mul_sigmoid(cudaStream_t stream, int warp, float *o, const float *g, int64_t g_stride, int n_rows, int dim,
                 const FusedQuant &fq) {
    launch_elementwise(stream, warp, MulSigmoid{o, g, g_stride, dim}, o, int64_t(n_rows) * dim, fq);
}

void swiglu(cudaStream_t stream, int warp, float *gate, const float *up, int64_t n, const FusedQuant &fq) {
    launch_elementwise(stream, warp, Swiglu{gate, up}, gate, n, fq);
}

void add(cudaStream_t stream, float *x, const float *y, int64_t n) {
    if (n < 1) return;
    launch_kernel(add_kernel, elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream, x, y, n);
}

}  // namespace luce::gpu
