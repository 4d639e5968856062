// attention.cu — NeoX RoPE, the KV-cache store and softmax attention over the cache.
//
// Positions are read from device memory (pos[t]), never passed as launch arguments, so a step's
// launches stay valid from one step to the next (graph capture, next increment).
//
// attention: one block per (query head h, token t) with W warps, each warp over its tiles of
// warpSize keys with an online softmax (attend_tiles); the W partial results are merged at the end:
//   out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M),  M = max_w m_w.
// Scores are q.k / sqrt(D) in fp32, as the CPU backend computes them.
//
// With scratch, decode-sized steps take the split-KV path (attention_split_kernel + merge, see
// there); LUCE_GPU_ATTN_SPLIT=0 (read by GpuBackend) passes no scratch and keeps the one-pass kernel.
#include <algorithm>
#include <type_traits>

#include "kernels.h"
#include "session.h"  // MAX_STEP

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

// A warp's share of the keys [j0, j1) visible to one query (mrow: the tree or drafter mask row,
// null for causal), taken a tile of warpSize keys at a time (key j0 + lane is this lane's):
//   scores  eight lanes form one key's q.k (each takes every eighth 16-byte chunk of the row, so
//           one load instruction reads whole 128-byte lines), warpSize / 8 keys per step, eight
//           steps; the score then moves to the lane that owns the key.
//   softmax each lane its key's probability, the tile's max over the warp (online softmax:
//           running max m, per-lane running sums l).
//   values  every lane on its own 16-byte chunks of each value row, p_j broadcast from lane j.
// A tile's loads do not wait on each other, so it costs a few memory latencies, not two per key
// (the kernel before took keys one at a time: 63 us for 8 tokens over ~100 keys on the H200).
// Tiles with no visible key are skipped on one byte per lane; a masked-out key inside a tile is
// never multiplied (p = 0 is skipped, not added: its cache row may never have been written).
// Leaves the warp's unnormalised output in acc[warp][D] and its m and l in sm, sl (shared).
template <int QC>  // 16-byte chunks of a row per score lane: ceil(D / 32)
__device__ __forceinline__ void attend_tiles(const float *qh, const float *K, const float *V, int D,
                                             const uint8_t *mrow, int j0, int j1, float scale, float *acc_s,
                                             float *sm, float *sl) {
    constexpr int KEY_LANES = 8, VC = (QC + 3) / 4;
    const int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize, W = blockDim.x / warpSize;
    const int nc = D / 4, sub = lane % KEY_LANES, kps = warpSize / KEY_LANES;
    float4 q[QC];
#pragma unroll
    for (int c = 0; c < QC; ++c) {
        const int ch = sub + KEY_LANES * c;
        q[c] = ch < nc ? reinterpret_cast<const float4 *>(qh)[ch] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float4 acc[VC];
#pragma unroll
    for (int c = 0; c < VC; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    float m = -INFINITY, l = 0.f;
    for (int t0 = j0 + warp * warpSize; t0 < j1; t0 += W * warpSize) {
        const bool vis = t0 + lane < j1 && (!mrow || mrow[t0 + lane]);
        if (!warp_any(vis)) continue;
        float s = -INFINITY;
#pragma unroll
        for (int st = 0; st < KEY_LANES; ++st) {
            const int key = min(t0 + st * kps + lane / KEY_LANES, j1 - 1);
            const auto *kr = reinterpret_cast<const float4 *>(K + int64_t(key) * D);
            float dot = 0.f;
#pragma unroll
            for (int c = 0; c < QC; ++c) {
                const int ch = sub + KEY_LANES * c;
                if (ch < nc) {
                    const float4 k = kr[ch];
                    dot += q[c].x * k.x + q[c].y * k.y + q[c].z * k.z + q[c].w * k.w;
                }
            }
            dot += shfl_xor(dot, 1);
            dot += shfl_xor(dot, 2);
            dot += shfl_xor(dot, 4);
            const float mine = shfl_idx(dot, (lane % kps) * KEY_LANES);  // key t0 + lane, at its step
            if (lane / kps == st) s = mine * scale;
        }
        if (!vis) s = -INFINITY;
        const float m_new = fmaxf(m, warp_max(s));  // finite: the tile has a visible key
        const float corr = expf(m - m_new), p = vis ? expf(s - m_new) : 0.f;
        l = l * corr + p;
#pragma unroll
        for (int c = 0; c < VC; ++c) acc[c].x *= corr, acc[c].y *= corr, acc[c].z *= corr, acc[c].w *= corr;
#pragma unroll 8
        for (int j = 0; j < warpSize; ++j) {
            const float pj = shfl_idx(p, j);
            const auto *vr = reinterpret_cast<const float4 *>(V + int64_t(min(t0 + j, j1 - 1)) * D);
#pragma unroll
            for (int c = 0; c < VC; ++c) {
                const int ch = lane + warpSize * c;
                if (ch < nc && pj != 0.f) {
                    const float4 v = vr[ch];
                    acc[c].x += pj * v.x, acc[c].y += pj * v.y, acc[c].z += pj * v.z, acc[c].w += pj * v.w;
                }
            }
        }
        m = m_new;
    }
    l = warp_sum(l);
    float *my_acc = acc_s + warp * D;
#pragma unroll
    for (int c = 0; c < VC; ++c)
        if (lane + warpSize * c < nc) reinterpret_cast<float4 *>(my_acc)[lane + warpSize * c] = acc[c];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
}

// The keys query t sees: its causal prefix, or the whole (masked) cache.
__device__ __forceinline__ int visible_keys(const int32_t *pos, const uint8_t *mask, int t, int n_ctx) {
    return mask ? n_ctx : min(pos[t] + 1, n_ctx);
}

// Dynamic shared memory: acc[W][D] | m[W] | l[W].
template <int QC>
__global__ void attention_kernel(const float *q, const float *kc, const float *vc, int n_ctx,
                                 const int32_t *pos, const uint8_t *mask, int n_head, int group,
                                 int head_dim, float scale, float *out) {
    wait_for_inputs();
    extern __shared__ float smem[];
    const int h = blockIdx.x, t = blockIdx.y, D = head_dim, W = blockDim.x / warpSize;
    float *acc = smem, *sm = acc + W * D, *sl = sm + W;
    const float *qh = q + (int64_t(t) * n_head + h) * D;
    const float *K = kc + int64_t(h / group) * n_ctx * D;
    const float *V = vc + int64_t(h / group) * n_ctx * D;
    const uint8_t *mrow = mask ? mask + int64_t(t) * n_ctx : nullptr;
    attend_tiles<QC>(qh, K, V, D, mrow, 0, visible_keys(pos, mask, t, n_ctx), scale, acc, sm, sl);

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

// Split-KV (flash-decoding) first pass: block (h, t, split) runs the same warps over its split of
// the keys query t sees (splits of whole tiles, at least one tile per warp, so a short context
// leaves the later splits empty), merges its warps, and writes the partial (m, l, acc[D]) of that
// split to part[((t * n_head + h) * n_split + split) * (D + 2)]. A few heads times one token
// cannot fill the device; the splits over the KV length can.
// Dynamic shared memory as attention_kernel.
template <int QC>
__global__ void attention_split_kernel(const float *q, const float *kc, const float *vc, int n_ctx,
                                       const int32_t *pos, const uint8_t *mask, int n_head, int group,
                                       int head_dim, float scale, float *part) {
    wait_for_inputs();
    extern __shared__ float smem[];
    const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z, n_split = gridDim.z, D = head_dim;
    const int W = blockDim.x / warpSize;
    float *acc = smem, *sm = acc + W * D, *sl = sm + W;
    const float *qh = q + (int64_t(t) * n_head + h) * D;
    const float *K = kc + int64_t(h / group) * n_ctx * D;
    const float *V = vc + int64_t(h / group) * n_ctx * D;

    const int n_keys = visible_keys(pos, mask, t, n_ctx);
    const int per_split = (n_keys + n_split - 1) / n_split;
    const int chunk = max((per_split + warpSize - 1) / warpSize * warpSize, int(blockDim.x));
    const int j0 = min(split * chunk, n_keys), j1 = min(j0 + chunk, n_keys);
    const uint8_t *mrow = mask ? mask + int64_t(t) * n_ctx : nullptr;
    attend_tiles<QC>(qh, K, V, D, mrow, j0, j1, scale, acc, sm, sl);

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
// blocks over all (head, token, split) of a one-token step. Every step of up to MAX_STEP tokens
// (decode, verify, a short prompt) splits as one token does: a row's keys then fall into the same
// splits whatever the width, so verify rows are the same bits as one-token decode rows (speculative
// == plain relies on it). Longer prefill chunks split by their own block count (not at all, mostly).
constexpr int SPLIT_MIN_KEYS = 256;
constexpr int SPLIT_TARGET_BLOCKS = 1024;
constexpr int SPLIT_MAX = 64;

int attention_splits(int T, int n_head, int n_ctx) {
    const int rows = T <= MAX_STEP ? 1 : T;
    const int by_len = (n_ctx + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS;
    const int by_blocks = std::max(1, SPLIT_TARGET_BLOCKS / std::max(1, n_head * rows));
    return std::max(1, std::min({by_len, by_blocks, SPLIT_MAX}));
}

int64_t attention_scratch_bytes(int T, int n_head, int head_dim, int n_ctx) {
    const int n_split = attention_splits(T, n_head, n_ctx);
    if (n_split < 2) return 0;
    return int64_t(sizeof(float)) * T * n_head * n_split * (head_dim + 2);
}

// Calls f(std::integral_constant<int, QC>) for the head dim's chunks per score lane.
template <typename F>
void with_head_chunks(int head_dim, F &&f) {
    if (head_dim % 4 != 0 || head_dim > 256)
        fail(LUCE_ERR_UNSUPPORTED, "GPU attention: head dim %d (a multiple of 4, at most 256)", head_dim);
    if (head_dim <= 32) f(std::integral_constant<int, 1>{});
    else if (head_dim <= 64) f(std::integral_constant<int, 2>{});
    else if (head_dim <= 128) f(std::integral_constant<int, 4>{});
    else f(std::integral_constant<int, 8>{});
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
    const size_t shared = sizeof(float) * (size_t(head_dim) * W + 2 * size_t(W));
    const auto *kc = static_cast<const float *>(kv.k);
    const auto *vc = static_cast<const float *>(kv.v);
    const int group = n_head / n_head_kv;
    const float scale = 1.0f / sqrtf(float(head_dim));
    const int n_split = scratch ? attention_splits(T, n_head, kv.n_ctx) : 1;
    const bool split = n_split > 1 && attention_scratch_bytes(T, n_head, head_dim, kv.n_ctx) <= scratch_bytes;
    with_head_chunks(head_dim, [&](auto qc) {
        constexpr int QC = decltype(qc)::value;
        if (split) {
            auto *part = static_cast<float *>(scratch);
            const dim3 grid{unsigned(n_head), unsigned(T), unsigned(n_split)};
            launch_kernel(attention_split_kernel<QC>, grid, ATTENTION_THREADS, shared, stream, q, kc, vc, kv.n_ctx,
                          pos, mask, n_head, group, head_dim, scale, part);
            launch_kernel(attention_merge_kernel, dim3{unsigned(n_head), unsigned(T)}, ATTENTION_THREADS, 0, stream,
                          part, n_split, n_head, head_dim, out);
            return;
        }
        launch_kernel(attention_kernel<QC>, dim3{unsigned(n_head), unsigned(T)}, ATTENTION_THREADS, shared, stream, q,
                      kc, vc, kv.n_ctx, pos, mask, n_head, group, head_dim, scale, out);
    });
}

}  // namespace luce::gpu
