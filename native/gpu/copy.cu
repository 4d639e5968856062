// copy.cu — many device-to-device copies in one launch (Backend::copy_batch).
//
// Grid (chunks of the largest copy, copies): block (c, i) moves bytes [c CHUNK, (c + 1) CHUNK) of
// copy i, in 16-byte words where both ends and the span are 16-byte aligned (the rollback
// buffers are), else byte by byte; blocks past a shorter copy's end return at once.
#include "kernels.h"

namespace luce::gpu {

namespace {

constexpr int COPY_THREADS = 256;
constexpr size_t COPY_CHUNK = 64 * 1024;

__global__ void copy_batch_kernel(const Backend::CopyOp *ops) {
    wait_for_inputs();
    const Backend::CopyOp op = ops[blockIdx.y];
    const size_t begin = size_t(blockIdx.x) * COPY_CHUNK;
    if (begin >= op.n_bytes) return;
    const size_t end = min(begin + COPY_CHUNK, op.n_bytes);
    auto *d = static_cast<char *>(op.dst);
    const auto *s = static_cast<const char *>(op.src);
    if ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s) | begin | end) % 16 == 0) {
        for (size_t i = begin + 16 * threadIdx.x; i < end; i += 16 * blockDim.x)
            *reinterpret_cast<uint4 *>(d + i) = *reinterpret_cast<const uint4 *>(s + i);
    } else {
        for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) d[i] = s[i];
    }
}

}  // namespace

void copy_batch(cudaStream_t stream, const Backend::CopyOp *ops, int n, size_t most_bytes) {
    if (n < 1 || most_bytes == 0) return;
    if (n > 65535) fail(LUCE_ERR_INTERNAL, "copy_batch: %d copies in one launch (at most 65535)", n);
    const dim3 grid(unsigned((most_bytes + COPY_CHUNK - 1) / COPY_CHUNK), unsigned(n));
    launch_kernel(copy_batch_kernel, grid, COPY_THREADS, 0, stream, ops);
}

}  // namespace luce::gpu
