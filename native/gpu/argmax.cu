// argmax.cu — index of the largest value on the device (ties -> lowest index, as the CPU).
//
// One block: each thread scans a strided slice keeping its best (value, index), then a tree
// reduction in shared memory. A vocabulary row (~250k floats) is one pass over 1 MB.
#include "kernels.h"

namespace luce::gpu {

namespace {

constexpr int ARGMAX_THREADS = 1024;

// ---- kernels -----------------------------------------------------------------------------------

__device__ __forceinline__ bool better(float v, int64_t i, float best_v, int64_t best_i) {
    return v > best_v || (v == best_v && i < best_i);
}

__global__ void argmax_kernel(const float *x, int64_t n, int32_t *result) {
    wait_for_inputs();
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int64_t si[ARGMAX_THREADS];
    float best_v = -INFINITY;
    int64_t best_i = n;  // sentinel: loses every tie
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        if (better(x[i], i, best_v, best_i)) best_v = x[i], best_i = i;
    sv[threadIdx.x] = best_v;
    si[threadIdx.x] = best_i;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half && better(sv[threadIdx.x + half], si[threadIdx.x + half], sv[threadIdx.x],
                                         si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + half];
            si[threadIdx.x] = si[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *result = int32_t(si[0] < n ? si[0] : 0);  // all -inf/NaN: index 0
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------------

void argmax(cudaStream_t stream, const float *x, int64_t n, int32_t *result) {
    launch_kernel(argmax_kernel, 1, ARGMAX_THREADS, 0, stream, x, n, result);
}

}  // namespace luce::gpu
