// attention.cu — NeoX RoPE, the KV-cache store and softmax attention over the cache.
//
// Positions are read from device memory (pos[t]), never passed as launch arguments, so a step's
// launches stay valid from one step to the next (graph capture, next increment).
//
// attention: one block per (query head h, token t) with W warps. Warp w visits keys
// j = w, w + W, ... with an online softmax (running max m, running sum l, and an unnormalised
// output row acc[w][D] in shared memory); the W partial results are merged at the end:
//   out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M),  M = max_w m_w.
// Scores are q.k / sqrt(D) in fp32, as the CPU backend computes them.
//
// With scratch, decode-sized steps take the split-KV path (attention_split_kernel + merge, see
// there); LUCE_GPU_ATTN_SPLIT=0 (read by GpuBackend) passes no scratch and keeps the one-pass kernel.
#include <algorithm>

#include "kernels.h"

namespace luce::gpu {

namespace {

// ---- kernels -----------------------------------------------------------------------------------

// One thread per (t, h, i < n_rot/2): rotates the pair (i, i + n_rot/2).
__global__ void rope_neox_kernel(float *x, const int32_t *pos, int T, int n_head, int head_dim, int n_rot,
                                 float theta) {
    wait_for_inputs();
    const int half = n_rot / 2;
    const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (idx >= int64_t(T) * n_head * half) return;
    const int i = int(idx % half);
    const int64_t th = idx / half;  // t * n_head + h
    const int t = int(th / n_head);
    // inv_freq = theta^(-2i/R) in fp32, angle in fp32 (spec §1.3), as the CPU backend.
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(n_rot));
    float s, c;
    sincosf(float(pos[t]) * inv_freq, &s, &c);
    float *xh = x + th * head_dim;
    const float a = xh[i], b = xh[i + half];
    xh[i] = a * c - b * s;
    xh[i + half] = b * c + a * s;
}

// One thread per (t, h, d): cache[h][pos[t]][d] = k[t][h][d] (and v).
__global__ void kv_store_kernel(float *kc, float *vc, int n_ctx, const float *k, const float *v,
                                const int32_t *pos, int T, int n_head_kv, int head_dim) {
    wait_for_inputs();
    const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (idx >= int64_t(T) * n_head_kv * head_dim) return;
    const int d = int(idx % head_dim);
    const int64_t th = idx / head_dim;
    const int t = int(th / n_head_kv), h = int(th % n_head_kv);
    const int64_t dst = (int64_t(h) * n_ctx + pos[t]) * head_dim + d;
    kc[dst] = k[idx];
    vc[dst] = v[idx];
}

// The block stages the query qh in shared memory (sq), then warp `warp` of W runs an online
// softmax over its share (j = j0 + warp, + W, ...) of the visible keys in [j0, j1) (mrow: the tree
// mask row, or null for causal), accumulating into my_acc[D] from zero, and leaves its running
// max and sum in sm[warp], sl[warp] for the block's merge. Shared by the one-pass and the
// split-KV kernels.
__device__ __forceinline__ void attend_keys(const float *qh, float *sq, const float *K, const float *V, int D,
                                            const uint8_t *mrow, int j0, int j1, int warp, int W, int lane,
                                            float scale, float *my_acc, float *sm, float *sl) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) sq[d] = qh[d];
    for (int d = lane; d < D; d += warpSize) my_acc[d] = 0.f;
    __syncthreads();
    float m = -INFINITY, l = 0.f;
    for (int j = j0 + warp; j < j1; j += W) {
        if (mrow && !mrow[j]) continue;  // uniform across the warp
        const float *kj = K + int64_t(j) * D, *vj = V + int64_t(j) * D;
        float s = 0.f;
        for (int d = lane; d < D; d += warpSize) s += sq[d] * kj[d];
        s = warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        for (int d = lane; d < D; d += warpSize) my_acc[d] = my_acc[d] * corr + p * vj[d];
        m = m_new;
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
}

// Dynamic shared memory: q[D] | acc[W][D] | m[W] | l[W].
__global__ void attention_kernel(const float *q, const float *kc, const float *vc, int n_ctx,
                                 const int32_t *pos, const uint8_t *mask, int n_head, int group,
                                 int head_dim, float scale, float *out) {
    wait_for_inputs();
    extern __shared__ float smem[];
    const int h = blockIdx.x, t = blockIdx.y, D = head_dim;
    const int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize, W = blockDim.x / warpSize;
    float *sq = smem, *acc = smem + D, *sm = acc + W * D, *sl = sm + W;
    const float *qh = q + (int64_t(t) * n_head + h) * D;
    const float *K = kc + int64_t(h / group) * n_ctx * D;
    const float *V = vc + int64_t(h / group) * n_ctx * D;
    float *my_acc = acc + warp * D;

    const int n_keys = mask ? n_ctx : pos[t] + 1;
    const uint8_t *mrow = mask ? mask + int64_t(t) * n_ctx : nullptr;
    attend_keys(qh, sq, K, V, D, mrow, 0, n_keys, warp, W, lane, scale, my_acc, sm, sl);

    float M = -INFINITY;
    for (int w = 0; w < W; ++w) M = fmaxf(M, sm[w]);
    float den = 0.f;
    for (int w = 0; w < W; ++w)
        if (sm[w] != -INFINITY) den += sl[w] * expf(sm[w] - M);
    float *oh = out + (int64_t(t) * n_head + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float num = 0.f;
        for (int w = 0; w < W; ++w)
            if (sm[w] != -INFINITY) num += acc[w * D + d] * expf(sm[w] - M);
        oh[d] = den > 0.f ? num / den : 0.f;  // no visible key: zeros, as the CPU backend
    }
}

// Split-KV (flash-decoding) first pass: block (h, t, split) runs the same per-warp online softmax
// over keys [split * chunk, (split + 1) * chunk) only, merges its warps, and writes the partial
// (m, l, acc[D]) of that split to part[((t * n_head + h) * n_split + split) * (D + 2)]. A few
// heads times one token cannot fill the device; the splits over the KV length can.
// Dynamic shared memory as attention_kernel.
__global__ void attention_split_kernel(const float *q, const float *kc, const float *vc, int n_ctx,
                                       const int32_t *pos, const uint8_t *mask, int n_head, int group,
                                       int head_dim, float scale, int chunk, float *part) {
    wait_for_inputs();
    extern __shared__ float smem[];
    const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z, n_split = gridDim.z, D = head_dim;
    const int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize, W = blockDim.x / warpSize;
    float *sq = smem, *acc = smem + D, *sm = acc + W * D, *sl = sm + W;
    const float *qh = q + (int64_t(t) * n_head + h) * D;
    const float *K = kc + int64_t(h / group) * n_ctx * D;
    const float *V = vc + int64_t(h / group) * n_ctx * D;
    float *my_acc = acc + warp * D;

    const int n_keys = mask ? n_ctx : min(pos[t] + 1, n_ctx);
    const int j0 = split * chunk, j1 = min(j0 + chunk, n_keys);
    const uint8_t *mrow = mask ? mask + int64_t(t) * n_ctx : nullptr;
    attend_keys(qh, sq, K, V, D, mrow, j0, j1, warp, W, lane, scale, my_acc, sm, sl);

    float M = -INFINITY;
    for (int w = 0; w < W; ++w) M = fmaxf(M, sm[w]);
    float *dst = part + ((int64_t(t) * n_head + h) * n_split + split) * (D + 2);
    if (threadIdx.x == 0) {
        float den = 0.f;
        for (int w = 0; w < W; ++w)
            if (sm[w] != -INFINITY) den += sl[w] * expf(sm[w] - M);
        dst[0] = M;  // -inf: no visible key in this split
        dst[1] = den;
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float num = 0.f;
        for (int w = 0; w < W; ++w)
            if (sm[w] != -INFINITY) num += acc[w * D + d] * expf(sm[w] - M);
        dst[2 + d] = num;
    }
}

// Second pass: block (h, t) merges its n_split partials exactly as the warps were merged.
__global__ void attention_merge_kernel(const float *part, int n_split, int n_head, int head_dim, float *out) {
    wait_for_inputs();
    const int h = blockIdx.x, t = blockIdx.y, D = head_dim;
    const float *src = part + (int64_t(t) * n_head + h) * n_split * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; ++s) M = fmaxf(M, src[s * (D + 2)]);
    float den = 0.f;
    for (int s = 0; s < n_split; ++s) {
        const float ms = src[s * (D + 2)];
        if (ms != -INFINITY) den += src[s * (D + 2) + 1] * expf(ms - M);
    }
    float *oh = out + (int64_t(t) * n_head + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float num = 0.f;
        for (int s = 0; s < n_split; ++s) {
            const float ms = src[s * (D + 2)];
            if (ms != -INFINITY) num += src[s * (D + 2) + 2 + d] * expf(ms - M);
        }
        oh[d] = den > 0.f ? num / den : 0.f;  // no visible key: zeros, as the CPU backend
    }
}

// ---- launchers ---------------------------------------------------------------------------------

constexpr int ELEMENT_THREADS = 256;
constexpr int ATTENTION_THREADS = 128;

unsigned blocks_for(int64_t n) { return unsigned((n + ELEMENT_THREADS - 1) / ELEMENT_THREADS); }

}  // namespace

void rope_neox(cudaStream_t stream, float *x, const int32_t *pos, int T, int n_head, int head_dim,
               int n_rot, float theta) {
    const int64_t n = int64_t(T) * n_head * (n_rot / 2);
    if (n < 1) return;
    launch_kernel(rope_neox_kernel, blocks_for(n), ELEMENT_THREADS, 0, stream, x, pos, T, n_head, head_dim, n_rot,
                  theta);
}

// The GPU kernels read an f32 cache only so far; the f16 cache is a CPU-backend option.
static void require_f32_cache(const KvLayer &kv) {
    if (kv.f16) fail(LUCE_ERR_UNSUPPORTED, "the GPU backend has no f16 KV cache yet; use the f32 cache");
}

void kv_store(cudaStream_t stream, KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
              int n_head_kv, int head_dim) {
    const int64_t n = int64_t(T) * n_head_kv * head_dim;
    if (n < 1) return;
    require_f32_cache(kv);
    launch_kernel(kv_store_kernel, blocks_for(n), ELEMENT_THREADS, 0, stream, static_cast<float *>(kv.k),
                  static_cast<float *>(kv.v), kv.n_ctx, k, v, pos, T, n_head_kv, head_dim);
}

// Splits over the KV length: chunks of at least SPLIT_MIN_KEYS keys, and about SPLIT_TARGET_BLOCKS
// blocks over all (head, token, split), so decode (T = 1) splits most and a prefill not at all.
constexpr int SPLIT_MIN_KEYS = 256;
constexpr int SPLIT_TARGET_BLOCKS = 1024;
constexpr int SPLIT_MAX = 64;

int attention_splits(int T, int n_head, int n_ctx) {
    const int by_len = (n_ctx + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS;
    const int by_blocks = std::max(1, SPLIT_TARGET_BLOCKS / std::max(1, n_head * T));
    return std::max(1, std::min({by_len, by_blocks, SPLIT_MAX}));
}

int64_t attention_scratch_bytes(int T, int n_head, int head_dim, int n_ctx) {
    const int n_split = attention_splits(T, n_head, n_ctx);
    if (n_split < 2) return 0;
    return int64_t(sizeof(float)) * T * n_head * n_split * (head_dim + 2);
}

void attention(cudaStream_t stream, int warp, const float *q, const KvLayer &kv, const int32_t *pos,
               const uint8_t *mask, int T, int n_head, int n_head_kv, int head_dim, float *out, void *scratch,
               int64_t scratch_bytes) {
    if (T < 1) return;
    require_f32_cache(kv);
    if (n_head_kv < 1 || n_head % n_head_kv != 0 || head_dim < 1 || kv.n_ctx < 1)
        fail(LUCE_ERR_INTERNAL, "GPU attention: bad shape (%d heads, %d kv heads, dim %d, ctx %d)", n_head, n_head_kv,
             head_dim, kv.n_ctx);
    const int W = ATTENTION_THREADS / warp;
    const size_t shared = sizeof(float) * (size_t(head_dim) * (1 + W) + 2 * size_t(W));
    if (shared > 48 * 1024)
        fail(LUCE_ERR_UNSUPPORTED, "GPU attention: head dim %d needs %zu bytes of shared memory", head_dim, shared);
    const auto *kc = static_cast<const float *>(kv.k);
    const auto *vc = static_cast<const float *>(kv.v);
    const int group = n_head / n_head_kv;
    const float scale = 1.0f / sqrtf(float(head_dim));
    const int n_split = scratch ? attention_splits(T, n_head, kv.n_ctx) : 1;
    if (n_split > 1 && attention_scratch_bytes(T, n_head, head_dim, kv.n_ctx) <= scratch_bytes) {
        const int chunk = (kv.n_ctx + n_split - 1) / n_split;
        auto *part = static_cast<float *>(scratch);
        const dim3 grid{unsigned(n_head), unsigned(T), unsigned(n_split)};
        launch_kernel(attention_split_kernel, grid, ATTENTION_THREADS, shared, stream, q, kc, vc, kv.n_ctx, pos, mask,
                      n_head, group, head_dim, scale, chunk, part);
        launch_kernel(attention_merge_kernel, dim3{unsigned(n_head), unsigned(T)}, ATTENTION_THREADS, 0, stream, part,
                      n_split, n_head, head_dim, out);
        return;
    }
    const dim3 grid{unsigned(n_head), unsigned(T)};
    launch_kernel(attention_kernel, grid, ATTENTION_THREADS, shared, stream, q, kc, vc, kv.n_ctx, pos, mask, n_head,
                  group, head_dim, scale, out);
}

}  // namespace luce::gpu
