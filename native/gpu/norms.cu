// norms.cu — RMSNorm (plain and gated) and the elementwise ops of the forward.
//
// One block per row for the norms: the sum of squares is a block reduction, then every thread
// scales the elements it read. A thread writes only elements it read itself, after the reduction's
// barrier, so y may alias x (the forward normalises k in place).
#include <algorithm>

#include "kernels.h"

namespace luce::gpu {

namespace {

// ---- kernels -----------------------------------------------------------------------------------

__global__ void rmsnorm_kernel(const float *x, int64_t x_stride, const float *w, int dim, float eps,
                               float *y, int64_t y_stride) {
    const float *xr = x + blockIdx.x * x_stride;
    float *yr = y + blockIdx.x * y_stride;
    float ss = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float scale = 1.0f / sqrtf(block_sum(ss) / float(dim) + eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// x += y, then out = rmsnorm(x) * w: the same per-thread order of operations as add_kernel then
// rmsnorm_kernel at the same block size, so the fused pass gives the same bits.
__global__ void add_rmsnorm_kernel(float *x, const float *y, const float *w, int dim, float eps, float *out) {
    float *xr = x + int64_t(blockIdx.x) * dim;
    const float *yr = y + int64_t(blockIdx.x) * dim;
    float *o = out + int64_t(blockIdx.x) * dim;
    float ss = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    const float scale = 1.0f / sqrtf(block_sum(ss) / float(dim) + eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

// o = rmsnorm(o) * w * silu(z), rows of `dim` (DeltaNet output norm).
__global__ void rmsnorm_gated_kernel(float *o, const float *w, const float *z, int dim, float eps) {
    float *orow = o + int64_t(blockIdx.x) * dim;
    const float *zr = z + int64_t(blockIdx.x) * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += orow[i] * orow[i];
    const float scale = 1.0f / sqrtf(block_sum(ss) / float(dim) + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = orow[i] * scale * w[i] * silu(zr[i]);
}

__global__ void mul_sigmoid_kernel(float *o, const float *g, int64_t g_stride, int dim, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        o[i] *= sigmoid(g[(i / dim) * g_stride + i % dim]);
}

__global__ void swiglu_kernel(float *gate, const float *up, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        gate[i] = silu(gate[i]) * up[i];
}

__global__ void add_kernel(float *x, const float *y, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] += y[i];
}

// ---- launchers ---------------------------------------------------------------------------------

constexpr int NORM_THREADS = 256;
// A hidden-state row (5120 on a 27B) is one block; 20 strided loads per thread of 256 were
// ~13 us per norm on an H200 (2026-12-03, mostly load latency), so wide rows get 1024 threads.
constexpr int WIDE_NORM_THREADS = 1024;
constexpr int WIDE_NORM_DIM = 2048;
constexpr int ELEMENTWISE_THREADS = 256;
constexpr int64_t MAX_ELEMENTWISE_BLOCKS = 4096;  // grid-stride beyond this

int norm_threads(int dim) { return dim >= WIDE_NORM_DIM ? WIDE_NORM_THREADS : NORM_THREADS; }

unsigned elementwise_blocks(int64_t n) {
    return unsigned(std::min<int64_t>((n + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS, MAX_ELEMENTWISE_BLOCKS));
}

}  // namespace

void rmsnorm(cudaStream_t stream, const float *x, int64_t x_stride, const float *w, int n_rows, int dim,
             float eps, float *y, int64_t y_stride) {
    if (n_rows < 1) return;
    rmsnorm_kernel<<<n_rows, norm_threads(dim), 0, stream>>>(x, x_stride, w, dim, eps, y, y_stride);
    LUCE_GPU_LAUNCHED();
}

void add_rmsnorm(cudaStream_t stream, float *x, const float *y, const float *w, int n_rows, int dim, float eps,
                 float *out) {
    if (n_rows < 1) return;
    add_rmsnorm_kernel<<<n_rows, norm_threads(dim), 0, stream>>>(x, y, w, dim, eps, out);
    LUCE_GPU_LAUNCHED();
}

void rmsnorm_gated(cudaStream_t stream, float *o, const float *w, const float *z, int n_rows, int dim,
                   float eps) {
    if (n_rows < 1) return;
    rmsnorm_gated_kernel<<<n_rows, NORM_THREADS, 0, stream>>>(o, w, z, dim, eps);
    LUCE_GPU_LAUNCHED();
}

void mul_sigmoid(cudaStream_t stream, float *o, const float *g, int64_t g_stride, int n_rows, int dim) {
    const int64_t n = int64_t(n_rows) * dim;
    if (n < 1) return;
    mul_sigmoid_kernel<<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(o, g, g_stride, dim, n);
    LUCE_GPU_LAUNCHED();
}

void swiglu(cudaStream_t stream, float *gate, const float *up, int64_t n) {
    if (n < 1) return;
    swiglu_kernel<<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(gate, up, n);
    LUCE_GPU_LAUNCHED();
}

void add(cudaStream_t stream, float *x, const float *y, int64_t n) {
    if (n < 1) return;
    add_kernel<<<elementwise_blocks(n), ELEMENTWISE_THREADS, 0, stream>>>(x, y, n);
    LUCE_GPU_LAUNCHED();
}

}  // namespace luce::gpu
