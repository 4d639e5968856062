// attention.cu — NeoX RoPE, the KV-cache store and softmax attention over the cache.
//
// Positions are read from device memory (pos[t]), never passed as launch arguments, so a step's
// launches stay valid from one step to the next (step graphs).
//
// attention, three kernels (scores are q.k / sqrt(D) in fp32, as the CPU backend computes them):
//   grouped decode (CUDA, steps of up to MAX_STEP tokens over caches other than f32, head dims
//     64 / 128 / 256): a block per (KV head, token) scores all the query heads sharing that KV
//     head against 32-key tiles staged once in shared memory (KeyTiles);
//   prefill (CUDA, longer causal steps): the same tiles, the rows 16 tokens of one query head;
//   one-query (HIP, f32 caches, other head dims, LUCE_GPU_ATTN_GROUPED=0): a block per (query head, token)
//     with W warps, each over its rounds of keys with an online softmax (attend_keys); the W
//     partial results merged at the end:
//       out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M),  M = max_w m_w.
//
// With scratch, decode-sized steps also split the keys (flash-decoding: the grouped or one-query
// split kernel + merge); LUCE_GPU_ATTN_SPLIT=0 (read by GpuBackend) passes no scratch.
#include <algorithm>
#include <type_traits>

#include "kernels.h"
#include "row_math.cuh"
#include "session.h"  // MAX_STEP

namespace luce::gpu {

namespace {

// ---- kernels -----------------------------------------------------------------------------------

// Attention blocks: four warps (two on wave64), and at most 128 registers a thread so that four
// blocks share an SM (the rounds of attend_keys are latency-bound: warps in flight are what
// hides it; uncapped, the split kernel took 162 registers, three blocks; capped, it spills 4 bytes).
constexpr int ATTENTION_THREADS = 128;
constexpr int ATTENTION_MIN_BLOCKS = 4;

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
    float *xh = x + th * head_dim;
    float a = xh[i], b = xh[i + half];
    rope_rotate(a, b, i, n_rot, theta, pos[t]);
    xh[i] = a;
    xh[i + half] = b;
}

// ---- cache rows (kv_cache.h: the row layouts, the block math) ----------------------------------

// A cache layer as the kernels address it: K and V rows of their own types and byte sizes.
struct KvRows {
    uint8_t *k, *v;
    KvType tk, tv;
    int k_row, v_row;  // bytes of one row
    int window;        // KvLayer::window (--fa-window; 0: every key)
};

KvRows kv_rows(const KvLayer &kv, int head_dim) {
    return {static_cast<uint8_t *>(kv.k), static_cast<uint8_t *>(kv.v), kv.format.k, kv.format.v,
            int(kv_row_bytes(kv.format.k, head_dim)), int(kv_row_bytes(kv.format.v, head_dim)), kv.window};
}

// Which cache a step's row t reads and writes: one sequence's step has one (OneCache); a batched
// step's rows belong to several sequences, each with its own cache of the same format, n_ctx and
// window (RowCaches: the K and V bases per row, by value in the launch's parameters, 1 KB). The
// kernels take either, so a batched step's row runs exactly the code its own sequence's launch
// would.
struct OneCache {
    KvRows kv;
    __device__ __forceinline__ KvRows at(int) const { return kv; }
};
struct RowCaches {
    KvRows kv;
    uint8_t *k[MAX_STEP], *v[MAX_STEP];
    __device__ __forceinline__ KvRows at(int t) const {
        KvRows r = kv;
        r.k = k[t], r.v = v[t];
        return r;
    }
};

__device__ __forceinline__ float f16_word(uint32_t bits) { return __half2float(__ushort_as_half(uint16_t(bits))); }

// Values 4c .. 4c+3 of a row of D values of type T: one aligned load of quants and, for the block
// types, one scale.
template <KvType T>
__device__ __forceinline__ float4 kv_load4_as(const uint8_t *row, int c, int D) {
    if constexpr (T == KvType::F16) {
        const uint2 w = reinterpret_cast<const uint2 *>(row)[c];
        return make_float4(f16_word(w.x & 0xffffu), f16_word(w.x >> 16), f16_word(w.y & 0xffffu), f16_word(w.y >> 16));
    } else if constexpr (T == KvType::Q8_0) {
        const uint32_t w = reinterpret_cast<const uint32_t *>(row)[c];
        const float d = f16_word(reinterpret_cast<const uint16_t *>(row + D)[c / 8]);
        return make_float4(d * float(int8_t(w)), d * float(int8_t(w >> 8)), d * float(int8_t(w >> 16)),
                           d * float(int8_t(w >> 24)));
    } else if constexpr (T == KvType::Q4_0) {
        const uint32_t w = reinterpret_cast<const uint16_t *>(row)[c];
        const float d = f16_word(reinterpret_cast<const uint16_t *>(row + D / 2)[c / 8]);
        return make_float4(d * float(int(w & 0xfu) - 8), d * float(int((w >> 4) & 0xfu) - 8),
                           d * float(int((w >> 8) & 0xfu) - 8), d * float(int((w >> 12) & 0xfu) - 8));
    } else {
        return reinterpret_cast<const float4 *>(row)[c];
    }
}

// As kv_load4_as, the type read at run time.
__device__ __forceinline__ float4 kv_load4(const uint8_t *row, KvType t, int c, int D) {
    switch (t) {
        case KvType::F16: return kv_load4_as<KvType::F16>(row, c, D);
        case KvType::Q8_0: return kv_load4_as<KvType::Q8_0>(row, c, D);
        case KvType::Q4_0: return kv_load4_as<KvType::Q4_0>(row, c, D);
        default: return kv_load4_as<KvType::F32>(row, c, D);
    }
}

// The K and V row types of a kernel instance. The pairs caches mostly have (both f32, f16 or
// q8_0) are compile-time types: a round's loads are then issued together, where a type switch at
// each load serialises them (f16 decode at 32K ran at half f32's speed with the switch, H100,
// 2026-12-07). Any other pair reads its types at run time.
template <KvType K, KvType V>
struct FixedTypes {
    __device__ static float4 key(const KvRows &, const uint8_t *row, int c, int D) { return kv_load4_as<K>(row, c, D); }
    __device__ static float4 value(const KvRows &, const uint8_t *row, int c, int D) { return kv_load4_as<V>(row, c, D); }
};
struct RuntimeTypes {
    __device__ static float4 key(const KvRows &kv, const uint8_t *row, int c, int D) { return kv_load4(row, kv.tk, c, D); }
    __device__ static float4 value(const KvRows &kv, const uint8_t *row, int c, int D) { return kv_load4(row, kv.tv, c, D); }
};

// x (D floats, visible to the whole block) as one cache row of type t at dst, by the block's
// threads together; the block types by llama.cpp's math, as kv_encode_row (kv_cache.cpp) does.
__device__ void kv_store_row(uint8_t *dst, KvType t, const float *x, int D) {
    if (t == KvType::F32) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) reinterpret_cast<float *>(dst)[i] = x[i];
        return;
    }
    if (t == KvType::F16) {
        for (int i = threadIdx.x; i < D; i += blockDim.x)
            reinterpret_cast<uint16_t *>(dst)[i] = __half_as_ushort(__float2half_rn(x[i]));
        return;
    }
    for (int b = threadIdx.x; b < D / KV_BLOCK; b += blockDim.x) {  // a thread a block of 32
        const float *xb = x + b * KV_BLOCK;
        float amax = 0.f, max = 0.f;
        for (int i = 0; i < KV_BLOCK; ++i)
            if (fabsf(xb[i]) > amax) amax = fabsf(xb[i]), max = xb[i];
        if (t == KvType::Q8_0) {
            const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
            for (int i = 0; i < KV_BLOCK; ++i) reinterpret_cast<int8_t *>(dst)[b * KV_BLOCK + i] = int8_t(roundf(xb[i] * id));
            reinterpret_cast<uint16_t *>(dst + D)[b] = __half_as_ushort(__float2half_rn(d));
        } else {
            const float d = max / -8.f, id = d != 0.f ? 1.f / d : 0.f;
            for (int i = 0; i < KV_BLOCK; i += 2) {
                const int lo = min(15, int(xb[i] * id + 8.5f)), hi = min(15, int(xb[i + 1] * id + 8.5f));
                dst[(b * KV_BLOCK + i) / 2] = uint8_t(lo | (hi << 4));
            }
            reinterpret_cast<uint16_t *>(dst + D / 2)[b] = __half_as_ushort(__float2half_rn(d));
        }
    }
}

// x = H x in place (D floats in shared memory, a power of two), by the block's threads: the
// butterflies of kv_cache.cpp's fwht, stage by stage, so the bits are the CPU's.
__device__ void hadamard_shared(float *x, int D) {
    for (int len = 1; len < D; len *= 2) {
        __syncthreads();
        for (int p = threadIdx.x; p < D / 2; p += blockDim.x) {
            const int i = (p / len) * 2 * len + p % len;
            const float a = x[i], b = x[i + len];
            x[i] = a + b;
            x[i + len] = a - b;
        }
    }
    __syncthreads();
    const float scale = 1.f / sqrtf(float(D));
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[i] *= scale;
    __syncthreads();
}

// One block per (t, h): cache[h][pos[t]] = k[t][h] (and v), as rows of the cache's types.
__global__ void kv_store_kernel(KvRows kv, int n_ctx, const float *k, const float *v, const int32_t *pos,
                                int n_head_kv, int head_dim) {
    LUCE_DYNAMIC_SHARED(float, row);  // the K row, then the V row
    wait_for_inputs();
    const int t = blockIdx.x / n_head_kv, h = blockIdx.x % n_head_kv, D = head_dim;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        row[i] = k[int64_t(blockIdx.x) * D + i];
        row[D + i] = v[int64_t(blockIdx.x) * D + i];
    }
    __syncthreads();
    const int64_t r = int64_t(h) * n_ctx + pos[t];
    kv_store_row(kv.k + r * kv.k_row, kv.tk, row, D);
    kv_store_row(kv.v + r * kv.v_row, kv.tv, row + D, D);
}

// One block per row: x = H x (Backend::hadamard_rows, the unfused prologue's rotation).
__global__ void hadamard_rows_kernel(float *x, int dim) {
    LUCE_DYNAMIC_SHARED(float, row);
    wait_for_inputs();
    float *xr = x + int64_t(blockIdx.x) * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) row[i] = xr[i];
    hadamard_shared(row, dim);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = row[i];
}

// An attention layer's prologue in one launch (the rmsnorm, rope_neox and kv_store kernels
// did it in five): one block per head row, norm_threads(D) threads as rmsnorm's launch has, so
// the norm's sum and every other step are theirs to the bit. Blocks [0, T H) take the query
// heads (q_h, the first D of each 2D row of qg), the rest the key heads, which also store the
// token's k and v rows in the cache at slot[t]. k is rewritten in place, as the five ops leave it.
// A rotated cache (kv_cache.h) has q and k rotated after RoPE, as Backend::qk_norm_rope_store does.
template <class Caches>
__global__ void __launch_bounds__(1024) qk_norm_rope_store_kernel(const float *qg, const float *q_norm, float *q,
                                                                  float *k, const float *k_norm, const float *v,
                                                                  Caches caches, bool rotate, int n_ctx,
                                                                  const int32_t *pos, const int32_t *slot, int T,
                                                                  int n_head, int n_head_kv, int D, int n_rot,
                                                                  float theta, float eps) {
    LUCE_DYNAMIC_SHARED(float, head);  // the normalised row, D floats; then the V row, D floats
    wait_for_inputs();
    const int q_rows = T * n_head;
    const bool is_q = int(blockIdx.x) < q_rows;
    const int r = is_q ? blockIdx.x : blockIdx.x - q_rows;  // t * heads + h
    const int t = r / (is_q ? n_head : n_head_kv);
    const float *x = is_q ? qg + int64_t(r) * 2 * D : k + int64_t(r) * D;
    const float *w = is_q ? q_norm : k_norm;
    const float scale = row_rms_scale(x, D, eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) head[i] = x[i] * scale * w[i];
    __syncthreads();
    const int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_rotate(head[i], head[i + half], i, n_rot, theta, pos[t]);
    __syncthreads();
    if (rotate) hadamard_shared(head, D);
    float *y = is_q ? q + int64_t(r) * D : k + int64_t(r) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) y[i] = head[i];
    if (is_q) return;
    float *vrow = head + D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) vrow[i] = v[int64_t(r) * D + i];
    __syncthreads();
    const int64_t dst = int64_t(r % n_head_kv) * n_ctx + slot[t];
    const KvRows kv = caches.at(t);
    kv_store_row(kv.k + dst * kv.k_row, kv.tk, head, D);
    kv_store_row(kv.v + dst * kv.v_row, kv.tv, vrow, D);
}

// A warp's share of the keys [j0, j1) visible to one query (mrow: the tree or drafter mask row,
// null for causal). The warp takes LUCE_WARP / 8 keys at a time, eight lanes per key, each lane
// every eighth 16-byte chunk of the key's K and V rows (so one load instruction reads whole
// 128-byte lines); all of a round's loads are issued before any is used, so a round costs one
// memory latency. The eight lanes form q.k, the round's max over the warp moves the running max
// m (online softmax), and each group keeps its own l and acc (all scaled by the same corrections)
// until the end, when the groups are added. Round r of warp w covers keys j0 + (r W + w) k ..,
// so a few keys spread over every warp of the block. A masked-out key is never multiplied (p = 0
// is skipped, not added: its cache row may never have been written), and a round with no visible
// key loads nothing (the mask bytes of the next round are fetched ahead).
// The kernel before took a warp-wide tile of 32 keys per warp (64 KB of K and V for D = 256) in
// twelve dependent rounds: 45 us for one token over 100 keys (ncu, H200).
// Leaves the warp's unnormalised output in acc_s[warp][D] and its m and l in sm, sl (shared).
// The query is staged in shared memory (sq, D floats; read back as broadcasts), which leaves the
// registers to the round's loads: 176 registers with it in registers, two blocks per SM.
// Cache rows are read four values at a time, as Types reads them.
template <int QC, class Types>  // QC: 16-byte chunks of a row per lane: ceil(D / 32)
__device__ __forceinline__ void attend_keys(const float *qh, float *sq, const KvRows &kv, int64_t row0, int D,
                                            const uint8_t *mrow, int j0, int j1, float scale, float *acc_s,
                                            float *sm, float *sl) {
    constexpr int KEY_LANES = 8;
    const int lane = threadIdx.x % LUCE_WARP, warp = threadIdx.x / LUCE_WARP, W = blockDim.x / LUCE_WARP;
    const int nc = D / 4, sub = lane % KEY_LANES, per_round = LUCE_WARP / KEY_LANES, stride = W * per_round;
    for (int d = threadIdx.x; d < D; d += blockDim.x) sq[d] = qh[d];
    __syncthreads();
    const auto *q4 = reinterpret_cast<const float4 *>(sq);
    float4 acc[QC];
#pragma unroll
    for (int c = 0; c < QC; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    float m = -INFINITY, l = 0.f;
    int key = j0 + warp * per_round + lane / KEY_LANES;
    bool vis = key < j1 && (!mrow || mrow[key]);
    for (; key - lane / KEY_LANES < j1; key += stride) {
        const bool vis_next = key + stride < j1 && (!mrow || mrow[key + stride]);
        if (warp_any(vis)) {
            const int64_t row = row0 + min(key, j1 - 1);
            const uint8_t *kr = kv.k + row * kv.k_row, *vr = kv.v + row * kv.v_row;
            float4 k[QC], v[QC];
#pragma unroll
            for (int c = 0; c < QC; ++c) {
                const int ch = sub + KEY_LANES * c;
                if (ch >= nc) continue;
                k[c] = Types::key(kv, kr, ch, D), v[c] = Types::value(kv, vr, ch, D);
            }
            float dot = 0.f;
#pragma unroll
            for (int c = 0; c < QC; ++c)
                if (sub + KEY_LANES * c < nc) {
                    const float4 q = q4[sub + KEY_LANES * c];
                    dot += q.x * k[c].x + q.y * k[c].y + q.z * k[c].z + q.w * k[c].w;
                }
            dot += shfl_xor(dot, 1);
            dot += shfl_xor(dot, 2);
            dot += shfl_xor(dot, 4);
            const float sc = vis ? dot * scale : -INFINITY;
            float mx = sc;
            for (int o = KEY_LANES; o < LUCE_WARP; o *= 2) mx = fmaxf(mx, shfl_xor(mx, o));
            const float m_new = fmaxf(m, mx);  // finite: the round has a visible key
            const float corr = expf(m - m_new), p = vis ? expf(sc - m_new) : 0.f;
            l = l * corr + p;
#pragma unroll
            for (int c = 0; c < QC; ++c) {
                acc[c].x *= corr, acc[c].y *= corr, acc[c].z *= corr, acc[c].w *= corr;
                if (p != 0.f && sub + KEY_LANES * c < nc)
                    acc[c].x += p * v[c].x, acc[c].y += p * v[c].y, acc[c].z += p * v[c].z, acc[c].w += p * v[c].w;
            }
            m = m_new;
        }
        vis = vis_next;
    }
    for (int o = KEY_LANES; o < LUCE_WARP; o *= 2) {  // the groups' sums, in a fixed order
        l += shfl_xor(l, o);
#pragma unroll
        for (int c = 0; c < QC; ++c) {
            acc[c].x += shfl_xor(acc[c].x, o), acc[c].y += shfl_xor(acc[c].y, o);
            acc[c].z += shfl_xor(acc[c].z, o), acc[c].w += shfl_xor(acc[c].w, o);
        }
    }
    auto *my_acc = reinterpret_cast<float4 *>(acc_s + warp * D);
    if (lane < KEY_LANES) {
#pragma unroll
        for (int c = 0; c < QC; ++c)
            if (sub + KEY_LANES * c < nc) my_acc[sub + KEY_LANES * c] = acc[c];
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
}

// The keys query t sees: its causal prefix, or the whole (masked) cache.
// The first key query t sees: the start of its --fa-window, else key 0.
__device__ __forceinline__ int first_key(const int32_t *pos, int t, int window) {
    return window > 0 ? max(0, pos[t] - window + 1) : 0;
}

__device__ __forceinline__ int visible_keys(const int32_t *pos, const uint8_t *mask, int t, int n_ctx) {
    return mask ? n_ctx : min(pos[t] + 1, n_ctx);
}

// Keys per split of a row that sees n_keys: whole rounds of a block's warps (attend_keys: eight
// lanes a key), so a short context fills the first splits and leaves the rest empty. The merge
// reads the splits that have keys, ceil(n_keys / chunk) of them.
__device__ __forceinline__ int split_chunk(int n_keys, int n_split) {
    constexpr int round_keys = ATTENTION_THREADS / 8;
    const int per_split = (n_keys + n_split - 1) / n_split;
    return max((per_split + round_keys - 1) / round_keys, 1) * round_keys;
}

// Partials i < n of online softmaxes (max m_i, sum l_i, unnormalised row acc_i), merged:
//   M = max_i m_i,  den = sum_i l_i e^(m_i - M),  num(d) = sum_i acc_i[d] e^(m_i - M),
// in increasing i (a partial with m_i = -inf saw no key and is skipped). The warps of a block and
// the splits of a row merge alike: m_i at m[i * ml_stride], l_i at l[i * ml_stride], acc_i[d] at
// acc[i * acc_stride + d].
struct Partials {
    const float *m, *l, *acc;
    int ml_stride, acc_stride, n;

    __device__ float max() const {
        float M = -INFINITY;
        for (int i = 0; i < n; ++i) M = fmaxf(M, m[i * ml_stride]);
        return M;
    }
    __device__ float den(float M) const {
        float den = 0.f;
        for (int i = 0; i < n; ++i) {
            const float mi = m[i * ml_stride];
            if (mi != -INFINITY) den += l[i * ml_stride] * expf(mi - M);
        }
        return den;
    }
    __device__ float num(float M, int d) const {
        float num = 0.f;
        for (int i = 0; i < n; ++i) {
            const float mi = m[i * ml_stride];
            if (mi != -INFINITY) num += acc[i * acc_stride + d] * expf(mi - M);
        }
        return num;
    }
};

// Dynamic shared memory: q[D] | acc[W][D] | m[W] | l[W].
template <int QC, class Types, class Caches>
__global__ void __launch_bounds__(ATTENTION_THREADS, ATTENTION_MIN_BLOCKS)
    attention_kernel(const float *q, Caches caches, int n_ctx, const int32_t *pos, const uint8_t *mask, int n_head,
                     int group, int head_dim, float scale, float *out) {
    wait_for_inputs();
    LUCE_DYNAMIC_SHARED(float, smem);
    const int h = blockIdx.x, t = blockIdx.y, D = head_dim, W = blockDim.x / LUCE_WARP;
    const KvRows kv = caches.at(t);
    float *sq = smem, *acc = sq + D, *sm = acc + W * D, *sl = sm + W;
    const float *qh = q + (int64_t(t) * n_head + h) * D;
    const uint8_t *mrow = mask ? mask + int64_t(t) * n_ctx : nullptr;
    attend_keys<QC, Types>(qh, sq, kv, int64_t(h / group) * n_ctx, D, mrow, first_key(pos, t, kv.window),
                         visible_keys(pos, mask, t, n_ctx), scale,
                         acc, sm, sl);

    const Partials warps{sm, sl, acc, 1, D, W};
    const float M = warps.max(), den = warps.den(M);
    float *oh = out + (int64_t(t) * n_head + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        oh[d] = den > 0.f ? warps.num(M, d) / den : 0.f;  // no visible key: zeros, as the CPU backend
}

// Split-KV (flash-decoding) first pass: block (h, t, split) runs the same warps over its split of
// the keys query t sees (whole rounds of the block's warps, so a short context leaves the later
// splits empty), merges its warps, and writes the partial (m, l, acc[D]) of that split to
// part[((t * n_head + h) * n_split + split) * (D + 2)]. A few heads times one token cannot fill
// the device; the splits over the KV length can.
// Dynamic shared memory as attention_kernel.
template <int QC, class Types, class Caches>
__global__ void __launch_bounds__(ATTENTION_THREADS, ATTENTION_MIN_BLOCKS)
    attention_split_kernel(const float *q, Caches caches, int n_ctx, const int32_t *pos, const uint8_t *mask,
                           int n_head, int group, int head_dim, float scale, float *part) {
    wait_for_inputs();
    LUCE_DYNAMIC_SHARED(float, smem);
    const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z, n_split = gridDim.z, D = head_dim;
    const KvRows kv = caches.at(t);
    const int W = blockDim.x / LUCE_WARP;
    float *sq = smem, *acc = sq + D, *sm = acc + W * D, *sl = sm + W;
    const float *qh = q + (int64_t(t) * n_head + h) * D;

    const int lo = first_key(pos, t, kv.window), n_keys = visible_keys(pos, mask, t, n_ctx);
    const int chunk = split_chunk(n_keys - lo, n_split);
    const int j0 = lo + split * chunk, j1 = min(j0 + chunk, n_keys);
    if (j0 >= n_keys) return;  // past a short context: the merge does not read this split
    const uint8_t *mrow = mask ? mask + int64_t(t) * n_ctx : nullptr;
    attend_keys<QC, Types>(qh, sq, kv, int64_t(h / group) * n_ctx, D, mrow, j0, j1, scale, acc, sm, sl);

    const Partials warps{sm, sl, acc, 1, D, W};
    const float M = warps.max();
    float *dst = part + ((int64_t(t) * n_head + h) * n_split + split) * (D + 2);
    if (threadIdx.x == 0) {
        dst[0] = M;  // -inf: no visible key in this split
        dst[1] = warps.den(M);
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[2 + d] = warps.num(M, d);
}

// Second pass: block (h, t) merges the partials of its splits that have keys, exactly as the
// warps were merged (at most MERGE_MAX_SPLITS: attention_splits caps the count at SPLIT_MAX).
constexpr int MERGE_MAX_SPLITS = 64;
__global__ void attention_merge_kernel(const float *part, const int32_t *pos, const uint8_t *mask, int n_ctx,
                                       int window, int n_split, int n_head, int head_dim, float *out) {
    wait_for_inputs();
    const int h = blockIdx.x, t = blockIdx.y, D = head_dim;
    const int n_keys = visible_keys(pos, mask, t, n_ctx) - first_key(pos, t, window);
    const int chunk = split_chunk(n_keys, n_split);
    const int n_used = min(n_split, (n_keys + chunk - 1) / chunk);
    const float *src = part + (int64_t(t) * n_head + h) * n_split * (D + 2);
    // The splits' maxima and sums, read once into shared memory: every thread walks them for
    // M, den and each of its outputs (three passes over global memory before; 10-25 us a call
    // under ncu with cold caches).
    __shared__ float hm[MERGE_MAX_SPLITS], hl[MERGE_MAX_SPLITS];
    for (int i = threadIdx.x; i < n_used; i += blockDim.x) hm[i] = src[i * (D + 2)], hl[i] = src[i * (D + 2) + 1];
    __syncthreads();
    const Partials splits{hm, hl, src + 2, 1, D + 2, n_used};
    const float M = splits.max(), den = splits.den(M);
    float *oh = out + (int64_t(t) * n_head + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        oh[d] = den > 0.f ? splits.num(M, d) / den : 0.f;  // no visible key: zeros, as the CPU backend
}

// ---- launchers ---------------------------------------------------------------------------------

constexpr int ELEMENT_THREADS = 256;

unsigned blocks_for(int64_t n) { return unsigned((n + ELEMENT_THREADS - 1) / ELEMENT_THREADS); }

#if !defined(LUCE_HIP)
// Tiled attention (CUDA: 32-lane warps): R query rows over one KV head walk the keys in tiles of
// TILE_KEYS staged in shared memory, each tile used by all R rows. Two kernels use it:
//   prefill (causal steps of more than MAX_STEP tokens): the rows are 16 tokens of one query head
//     (the one-query blocks read every key of a query's prefix from L2 once per query: at 256
//     tokens a chunk of a 512-token prompt took 269 us a layer, H200, 2026-12-04);
//   grouped decode (steps of up to MAX_STEP tokens): the rows are the query heads of one token
//     that share a KV head (GQA: six on the 27B), over one split of the keys (the one-query
//     blocks read each cache row once per query head).
// Per key tile:
//   stage:  the tile's K and V rows as floats (keys no row of the block sees: zeros, never read);
//   scores: warp w holds rows w R/4 .. (w + 1) R/4 - 1, lane j key j0 + j; the row's max and sum
//           over the warp move its online softmax (m, l), and p and the correction go to shared
//           memory;
//   values: thread (row group, 16-byte chunk c) scales its rows' accumulators by the correction
//           and adds p V[j][c] over the tile's keys.
// fp32 throughout, in an order of sums of the row's own (its keys, its tiles): the other rows of a
// block never change a row's bits, so a verify row is the bits of the same one-token decode row.
constexpr int TILE_KEYS = 32, TILE_WARPS = ATTENTION_THREADS / 32;  // CUDA: 32 lanes
constexpr int PREFILL_ROWS = 16;                                    // tokens of a prefill block
constexpr int GROUP_ROWS = 8;                                       // query heads of a decode block

template <int D, int R>
struct TileSmem {
    static constexpr int line = D + 4;  // padded rows: lane j's float4 of row j spreads over banks
    static constexpr int q = 0, k = q + R * line, v = k + TILE_KEYS * line;
    static constexpr int p = v + TILE_KEYS * D, corr = p + R * TILE_KEYS, m = corr + R, l = m + R;
    static constexpr size_t bytes = size_t(l + R) * sizeof(float);
};

// One thread's share of R rows' online softmaxes over key tiles.
template <int D, int R, class Types>
struct KeyTiles {
    using L = TileSmem<D, R>;
    static constexpr int NC = D / 4, ROW_GROUPS = ATTENTION_THREADS / NC, ROWS = R / ROW_GROUPS;
    static constexpr int WARP_ROWS = R / TILE_WARPS, STAGE_STEPS = TILE_KEYS * NC / ATTENTION_THREADS;
    static_assert(ROWS >= 1 && R % ROW_GROUPS == 0 && WARP_ROWS >= 1 && TILE_KEYS * NC % ATTENTION_THREADS == 0,
                  "tile shape");

    float *smem;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int rg = threadIdx.x / NC, c = threadIdx.x % NC;  // the value phase's rows and chunk
    float m[WARP_ROWS], l[WARP_ROWS];
    float4 acc[ROWS];

    __device__ explicit KeyTiles(float *shared) : smem(shared) {
#pragma unroll
        for (int i = 0; i < WARP_ROWS; ++i) m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    // query(r): row r's D floats, or null for a row the block does not have (zeros).
    template <class Query>
    __device__ void stage_queries(Query query) {
        for (int e = threadIdx.x; e < R * NC; e += ATTENTION_THREADS) {
            const int r = e / NC, ch = e % NC;
            const float *qr = query(r);
            *reinterpret_cast<float4 *>(smem + L::q + r * L::line + 4 * ch) =
                qr ? reinterpret_cast<const float4 *>(qr)[ch] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }

    // Keys [j_begin, j_end) of the cache rows from row0 on: staged(j) whether some row may see key
    // j (the others are not read), seen(i, j) whether warp row i does.
    template <class Staged, class Seen>
    __device__ void walk(const KvRows &kv, int64_t row0, int j_begin, int j_end, float scale, Staged staged, Seen seen) {
        for (int j0 = j_begin; j0 < j_end; j0 += TILE_KEYS) {
            __syncthreads();  // the last tile's keys, values and p are read
#pragma unroll
            for (int s = 0; s < STAGE_STEPS; ++s) {
                const int e = threadIdx.x + s * ATTENTION_THREADS, j = e / NC, ch = e % NC, key = j0 + j;
                const bool in = key < j_end && staged(key);
                const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
                *reinterpret_cast<float4 *>(smem + L::k + j * L::line + 4 * ch) =
                    in ? Types::key(kv, kv.k + (row0 + key) * kv.k_row, ch, D) : zero;
                *reinterpret_cast<float4 *>(smem + L::v + j * D + 4 * ch) =
                    in ? Types::value(kv, kv.v + (row0 + key) * kv.v_row, ch, D) : zero;
            }
            __syncthreads();
            scores(j0, j_end, scale, seen);
            __syncthreads();
            values(min(TILE_KEYS, j_end - j0));
        }
    }

    template <class Seen>
    __device__ void scores(int j0, int j_end, float scale, Seen seen) {
        const int key = j0 + lane;
        float dot[WARP_ROWS] = {};
        const auto *k4 = reinterpret_cast<const float4 *>(smem + L::k + lane * L::line);
#pragma unroll 4
        for (int ch = 0; ch < NC; ++ch) {
            const float4 kv = k4[ch];
#pragma unroll
            for (int i = 0; i < WARP_ROWS; ++i) {
                const float4 qv = reinterpret_cast<const float4 *>(smem + L::q + (warp * WARP_ROWS + i) * L::line)[ch];
                dot[i] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
            }
        }
#pragma unroll
        for (int i = 0; i < WARP_ROWS; ++i) {
            const int r = warp * WARP_ROWS + i;
            const float sc = key < j_end && seen(i, key) ? dot[i] * scale : -INFINITY;
            const float m_new = fmaxf(m[i], warp_max(sc));
            const float corr = m_new == -INFINITY ? 1.f : expf(m[i] - m_new);
            const float p = sc == -INFINITY ? 0.f : expf(sc - m_new);
            l[i] = l[i] * corr + warp_sum(p);
            m[i] = m_new;
            smem[L::p + r * TILE_KEYS + lane] = p;
            if (lane == 0) smem[L::corr + r] = corr;
        }
    }

    __device__ void values(int n_keys) {
        const auto *v4 = reinterpret_cast<const float4 *>(smem + L::v) + c;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const float corr = smem[L::corr + rg * ROWS + i];
            acc[i].x *= corr, acc[i].y *= corr, acc[i].z *= corr, acc[i].w *= corr;
        }
        for (int j = 0; j < n_keys; ++j) {
            const float4 vv = v4[j * NC];
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const float p = smem[L::p + (rg * ROWS + i) * TILE_KEYS + j];
                acc[i].x += p * vv.x, acc[i].y += p * vv.y, acc[i].z += p * vv.z, acc[i].w += p * vv.w;
            }
        }
    }

    // Each row's m and l into shared memory (L::m, L::l), where the value phase's threads read them.
    __device__ void publish() {
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < WARP_ROWS; ++i) smem[L::m + warp * WARP_ROWS + i] = m[i], smem[L::l + warp * WARP_ROWS + i] = l[i];
        }
        __syncthreads();
    }

    // Thread's row i (of ROWS), normalised, to out (D floats; no visible key: zeros, as the CPU backend).
    __device__ void store_row(int i, float *out) const {
        const float den = smem[L::l + rg * ROWS + i];
        reinterpret_cast<float4 *>(out)[c] = den > 0.f ? make_float4(acc[i].x / den, acc[i].y / den, acc[i].z / den,
                                                                     acc[i].w / den)
                                                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
};

// Prefill: block (query head h, tile of PREFILL_ROWS tokens).
template <int D, class Types>
__global__ void __launch_bounds__(ATTENTION_THREADS)
    attention_prefill_kernel(const float *q, KvRows kv, int n_ctx, const int32_t *pos, int T, int n_head, int group,
                             float scale, float *out) {
    wait_for_inputs();
    using Tiles = KeyTiles<D, PREFILL_ROWS, Types>;
    LUCE_DYNAMIC_SHARED(float, smem);
    Tiles tiles(smem);
    const int h = blockIdx.x, t0 = blockIdx.y * PREFILL_ROWS, n_rows = min(PREFILL_ROWS, T - t0);
    int n_keys = 0, row_pos[Tiles::WARP_ROWS];
    for (int r = 0; r < n_rows; ++r) n_keys = max(n_keys, min(pos[t0 + r] + 1, n_ctx));
#pragma unroll
    for (int i = 0; i < Tiles::WARP_ROWS; ++i) {
        const int r = tiles.warp * Tiles::WARP_ROWS + i;
        row_pos[i] = r < n_rows ? pos[t0 + r] : -1;
    }
    tiles.stage_queries([&](int r) { return r < n_rows ? q + (int64_t(t0 + r) * n_head + h) * D : nullptr; });
    // The tile's first row has its lowest position: keys before its window are no row's.
    const int j_first = kv.window > 0 ? max(0, pos[t0] - kv.window + 1) / TILE_KEYS * TILE_KEYS : 0;
    tiles.walk(kv, int64_t(h / group) * n_ctx, j_first, n_keys, scale, [](int) { return true; },
               [&](int i, int key) { return key <= row_pos[i] && (kv.window == 0 || key > row_pos[i] - kv.window); });
    tiles.publish();
#pragma unroll
    for (int i = 0; i < Tiles::ROWS; ++i) {
        const int r = tiles.rg * Tiles::ROWS + i;
        if (r < n_rows) tiles.store_row(i, out + (int64_t(t0 + r) * n_head + h) * D);
    }
}

// Grouped decode: block (KV head x chunk of GROUP_ROWS of its query heads, token t, split). With
// part, the rows' partials (m, l, acc[D]) of this split go where attention_merge_kernel reads them
// (as attention_split_kernel's); without, there is one split and the rows go to out normalised.
template <int D, class Types, class Caches>
__global__ void __launch_bounds__(ATTENTION_THREADS)
    attention_group_kernel(const float *q, Caches caches, int n_ctx, const int32_t *pos, const uint8_t *mask,
                           int n_head, int group, float scale, float *part, float *out) {
    wait_for_inputs();
    using Tiles = KeyTiles<D, GROUP_ROWS, Types>;
    LUCE_DYNAMIC_SHARED(float, smem);
    const int chunks = (group + GROUP_ROWS - 1) / GROUP_ROWS;
    const int hk = blockIdx.x / chunks, g0 = blockIdx.x % chunks * GROUP_ROWS, n_rows = min(GROUP_ROWS, group - g0);
    const int t = blockIdx.y, split = blockIdx.z, n_split = gridDim.z, h0 = hk * group + g0;
    const KvRows kv = caches.at(t);
    const int lo = first_key(pos, t, kv.window), n_keys = visible_keys(pos, mask, t, n_ctx);
    int j0 = lo, j1 = n_keys;
    if (part) {
        const int chunk = split_chunk(n_keys - lo, n_split);
        j0 = lo + split * chunk, j1 = min(j0 + chunk, n_keys);
        if (j0 >= n_keys) return;  // past a short context: the merge does not read this split
    }
    const uint8_t *mrow = mask ? mask + int64_t(t) * n_ctx : nullptr;
    const auto visible = [&](int key) { return !mrow || mrow[key]; };
    Tiles tiles(smem);
    tiles.stage_queries([&](int r) { return r < n_rows ? q + (int64_t(t) * n_head + h0 + r) * D : nullptr; });
    tiles.walk(kv, int64_t(hk) * n_ctx, j0, j1, scale, visible, [&](int, int key) { return visible(key); });
    tiles.publish();
#pragma unroll
    for (int i = 0; i < Tiles::ROWS; ++i) {
        const int r = tiles.rg * Tiles::ROWS + i;
        if (r >= n_rows) continue;
        const int64_t th = int64_t(t) * n_head + h0 + r;
        if (!part) {
            tiles.store_row(i, out + th * D);
            continue;
        }
        float *dst = part + (th * n_split + split) * (D + 2);
        if (tiles.c == 0) dst[0] = smem[Tiles::L::m + r], dst[1] = smem[Tiles::L::l + r];
        const float4 a = tiles.acc[i];
        dst[2 + 4 * tiles.c] = a.x, dst[3 + 4 * tiles.c] = a.y, dst[4 + 4 * tiles.c] = a.z, dst[5 + 4 * tiles.c] = a.w;
    }
}

// The kernel with its BYTES of dynamic shared memory opted in, once (more than 48 KB is an opt-in).
template <auto Kernel, size_t BYTES>
auto opted_in() {
    static const cudaError_t opt_in =
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(BYTES));
    LUCE_GPU_CHECK(opt_in);
    return Kernel;
}

// Calls f(Types) for a cache of K type k and V type v (FixedTypes where it has them).
template <class F>
void with_cache_types(KvType k, KvType v, F &&f) {
    if (k == KvType::F32 && v == KvType::F32) f(FixedTypes<KvType::F32, KvType::F32>{});
    else if (k == KvType::F16 && v == KvType::F16) f(FixedTypes<KvType::F16, KvType::F16>{});
    else if (k == KvType::Q8_0 && v == KvType::Q8_0) f(FixedTypes<KvType::Q8_0, KvType::Q8_0>{});
    else f(RuntimeTypes{});
}

// Launches the prefill kernel for a head dim it has (32, 64, 128, 256): false otherwise.
bool attention_prefill(cudaStream_t stream, const float *q, const KvRows &kv, int n_ctx, const int32_t *pos, int T,
                       int n_head, int group, int head_dim, float scale, float *out) {
    auto launch = [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        with_cache_types(kv.tk, kv.tv, [&](auto types) {
            constexpr size_t bytes = TileSmem<D, PREFILL_ROWS>::bytes;
            const auto kernel = opted_in<attention_prefill_kernel<D, decltype(types)>, bytes>();
            const dim3 grid(unsigned(n_head), unsigned((T + PREFILL_ROWS - 1) / PREFILL_ROWS));
            launch_kernel(kernel, grid, ATTENTION_THREADS, bytes, stream, q, kv, n_ctx, pos, T, n_head, group, scale,
                          out);
        });
        return true;
    };
    switch (head_dim) {
        case 32: return launch(std::integral_constant<int, 32>{});
        case 64: return launch(std::integral_constant<int, 64>{});
        case 128: return launch(std::integral_constant<int, 128>{});
        case 256: return launch(std::integral_constant<int, 256>{});
        default: return false;
    }
}

// Launches the grouped decode kernel for a head dim it has (64, 128, 256) over n_split splits
// (part: their partials; null: one split, the rows to out): false otherwise.
template <class Caches>
bool attention_grouped(cudaStream_t stream, const float *q, const KvRows &kv, const Caches &caches, int n_ctx,
                       const int32_t *pos, const uint8_t *mask, int T, int n_head, int group, int head_dim,
                       float scale, float *part, int n_split, float *out) {
    auto launch = [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        with_cache_types(kv.tk, kv.tv, [&](auto types) {
            constexpr size_t bytes = TileSmem<D, GROUP_ROWS>::bytes;
            const auto kernel = opted_in<attention_group_kernel<D, decltype(types), Caches>, bytes>();
            const int chunks = (group + GROUP_ROWS - 1) / GROUP_ROWS;
            const dim3 grid(unsigned(n_head / group * chunks), unsigned(T), unsigned(n_split));
            launch_kernel(kernel, grid, ATTENTION_THREADS, bytes, stream, q, caches, n_ctx, pos, mask, n_head, group,
                          scale, part, out);
        });
        return true;
    };
    switch (head_dim) {
        case 64: return launch(std::integral_constant<int, 64>{});
        case 128: return launch(std::integral_constant<int, 128>{});
        case 256: return launch(std::integral_constant<int, 256>{});
        default: return false;
    }
}
#endif

}  // namespace

void rope_neox(cudaStream_t stream, float *x, const int32_t *pos, int T, int n_head, int head_dim,
               int n_rot, float theta) {
    const int64_t n = int64_t(T) * n_head * (n_rot / 2);
    if (n < 1) return;
    launch_kernel(rope_neox_kernel, blocks_for(n), ELEMENT_THREADS, 0, stream, x, pos, T, n_head, head_dim, n_rot,
                  theta);
}

// Threads of a block that stores or rotates rows of D values: one a value, whole warps.
unsigned row_threads(int head_dim) { return unsigned(std::min(1024, (head_dim + 31) / 32 * 32)); }

void kv_store(cudaStream_t stream, KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
              int n_head_kv, int head_dim) {
    if (T < 1 || n_head_kv < 1) return;
    launch_kernel(kv_store_kernel, unsigned(T * n_head_kv), row_threads(head_dim), 2 * size_t(head_dim) * sizeof(float),
                  stream, kv_rows(kv, head_dim), kv.n_ctx, k, v, pos, n_head_kv, head_dim);
}

void hadamard_rows(cudaStream_t stream, float *x, int n_rows, int dim) {
    if (n_rows < 1) return;
    launch_kernel(hadamard_rows_kernel, unsigned(n_rows), row_threads(dim), size_t(dim) * sizeof(float), stream, x, dim);
}

template <class Caches>
void launch_prologue(cudaStream_t stream, const float *qg, const float *q_norm, float *q, float *k,
                     const float *k_norm, const float *v, const KvLayer &kv, const Caches &caches, const int32_t *pos,
                     const int32_t *slot, int T, int n_head, int n_head_kv, int head_dim, int n_rot, float theta,
                     float eps) {
    launch_kernel(qk_norm_rope_store_kernel<Caches>, unsigned(T * (n_head + n_head_kv)), norm_threads(head_dim),
                  2 * size_t(head_dim) * sizeof(float), stream, qg, q_norm, q, k, k_norm, v, caches, kv.format.rotate,
                  kv.n_ctx, pos, slot, T, n_head, n_head_kv, head_dim, n_rot, theta, eps);
}

void qk_norm_rope_store(cudaStream_t stream, const float *qg, const float *q_norm, float *q, float *k,
                        const float *k_norm, const float *v, KvLayer &kv, const int32_t *pos, const int32_t *slot,
                        int T, int n_head, int n_head_kv, int head_dim, int n_rot, float theta, float eps) {
    if (T < 1) return;
    launch_prologue(stream, qg, q_norm, q, k, k_norm, v, kv, OneCache{kv_rows(kv, head_dim)}, pos, slot, T, n_head,
                    n_head_kv, head_dim, n_rot, theta, eps);
}

// Splits over the KV length: chunks of at least SPLIT_MIN_KEYS keys, and about SPLIT_TARGET_BLOCKS
// blocks over all (head, token, split) of a one-token step. Every step of up to MAX_STEP tokens
// (decode, verify, a short prompt) splits as one token does: a row's keys then fall into the same
// splits whatever the width, so verify rows are the same bits as one-token decode rows (speculative
// == plain relies on it). Longer prefill chunks split by their own block count (not at all, mostly).
constexpr int SPLIT_MIN_KEYS = 128;
constexpr int SPLIT_TARGET_BLOCKS = 1024;
constexpr int SPLIT_MAX = MERGE_MAX_SPLITS;

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

// Steps of up to MAX_STEP rows: the grouped decode kernel where it serves the shape (CUDA, caches
// other than f32), else
// the one-query kernels; split-KV and merge where the scratch holds the splits. The one-query
// kernels have compile-time loads for f32 caches only (the others: HIP, and head dims the grouped
// kernel lacks, read their types at run time).
template <class Caches>
void launch_attention(cudaStream_t stream, int warp, const float *q, const KvLayer &kv, const Caches &caches,
                      const int32_t *pos, const uint8_t *mask, int T, int n_head, int n_head_kv, int head_dim,
                      float *out, void *scratch, int64_t scratch_bytes) {
    const int W = ATTENTION_THREADS / warp;
    const size_t shared = sizeof(float) * (size_t(head_dim) * (1 + W) + 2 * size_t(W));
    const bool f32 = kv.format.k == KvType::F32 && kv.format.v == KvType::F32;
    const int group = n_head / n_head_kv;
    const float scale = 1.0f / sqrtf(float(head_dim));
    const int n_split = scratch ? attention_splits(T, n_head, kv.n_ctx) : 1;
    const bool split = n_split > 1 && attention_scratch_bytes(T, n_head, head_dim, kv.n_ctx) <= scratch_bytes;
    auto *part = split ? static_cast<float *>(scratch) : nullptr;
    auto merge = [&] {
        launch_kernel(attention_merge_kernel, dim3{unsigned(n_head), unsigned(T)}, ATTENTION_THREADS, 0, stream, part,
                      pos, mask, kv.n_ctx, kv.window, n_split, n_head, head_dim, out);
    };
#if !defined(LUCE_HIP)
    // f32 caches keep the one-query kernels: deciding one token over 8K-128K keys the grouped
    // kernel ran 6-26 % slower there (H100, 2026-12-07; with the one-query kernels' split count it
    // has 4 blocks a split on the 27B where they have 24), where it ran f16 caches 3.3-4x and q8_0
    // 1.7-1.9x faster, and verify steps of 16 faster for every type.
    if (warp == 32 && grouped_attention && !f32 &&
        attention_grouped(stream, q, caches.kv, caches, kv.n_ctx, pos, mask, T, n_head, group, head_dim, scale, part,
                          split ? n_split : 1, out)) {
        if (split) merge();
        return;
    }
#endif
    with_head_chunks(head_dim, [&](auto qc) {
        constexpr int QC = decltype(qc)::value;
        using F32 = FixedTypes<KvType::F32, KvType::F32>;
        if (split) {
            const dim3 grid{unsigned(n_head), unsigned(T), unsigned(n_split)};
            launch_kernel(f32 ? attention_split_kernel<QC, F32, Caches> : attention_split_kernel<QC, RuntimeTypes, Caches>,
                          grid, ATTENTION_THREADS, shared, stream, q, caches, kv.n_ctx, pos, mask, n_head, group, head_dim,
                          scale, part);
            merge();
            return;
        }
        launch_kernel(f32 ? attention_kernel<QC, F32, Caches> : attention_kernel<QC, RuntimeTypes, Caches>,
                      dim3{unsigned(n_head), unsigned(T)}, ATTENTION_THREADS, shared, stream, q, caches, kv.n_ctx, pos,
                      mask, n_head, group, head_dim, scale, out);
    });
}

void attention(cudaStream_t stream, int warp, const float *q, const KvLayer &kv, const int32_t *pos,
               const uint8_t *mask, int T, int n_head, int n_head_kv, int head_dim, float *out, void *scratch,
               int64_t scratch_bytes) {
    if (T < 1) return;
    if (n_head_kv < 1 || n_head % n_head_kv != 0 || head_dim < 1 || kv.n_ctx < 1)
        fail(LUCE_ERR_INTERNAL, "GPU attention: bad shape (%d heads, %d kv heads, dim %d, ctx %d)", n_head, n_head_kv,
             head_dim, kv.n_ctx);
    const KvRows rows = kv_rows(kv, head_dim);
#if !defined(LUCE_HIP)
    if (!mask && T > MAX_STEP && warp == 32 &&
        attention_prefill(stream, q, rows, kv.n_ctx, pos, T, n_head, n_head / n_head_kv, head_dim,
                          1.0f / sqrtf(float(head_dim)), out))
        return;
#endif
    launch_attention(stream, warp, q, kv, OneCache{rows}, pos, mask, T, n_head, n_head_kv, head_dim, out, scratch,
                     scratch_bytes);
}

bool attention_sequences_batch(const AttentionRows *seqs, int n, const int32_t *pos) {
    if (n < 2 || n > MAX_STEP) return false;
    const KvLayer &kv0 = *seqs[0].kv;
    int rows = 0;
    for (int i = 0; i < n; ++i) {
        const AttentionRows &s = seqs[i];
        const KvLayer &kv = *s.kv;
        // Causal rows at their positions, in order, caches alike but for their memory.
        if (s.mask || s.slot != pos + s.row0 || s.row0 != rows || kv.n_ctx != kv0.n_ctx || kv.window != kv0.window ||
            kv.format.k != kv0.format.k || kv.format.v != kv0.format.v || kv.format.rotate != kv0.format.rotate)
            return false;
        rows += s.T;
    }
    return rows <= MAX_STEP;
}

void attention_sequences(cudaStream_t stream, int warp, const float *qg, const float *q_norm, float *q, float *k,
                         const float *k_norm, const float *v, const int32_t *pos, const AttentionRows *seqs, int n,
                         int n_head, int n_head_kv, int head_dim, int n_rot, float theta, float eps, float *out,
                         void *scratch, int64_t scratch_bytes) {
    if (!attention_sequences_batch(seqs, n, pos)) fail(LUCE_ERR_INTERNAL, "GPU attention: not a batch of %d", n);
    const KvLayer &kv0 = *seqs[0].kv;
    if (n_head_kv < 1 || n_head % n_head_kv != 0 || head_dim < 1 || kv0.n_ctx < 1)
        fail(LUCE_ERR_INTERNAL, "GPU attention: bad shape (%d heads, %d kv heads, dim %d, ctx %d)", n_head, n_head_kv,
             head_dim, kv0.n_ctx);
    RowCaches caches{kv_rows(kv0, head_dim), {}, {}};
    int T = 0;
    for (const AttentionRows *s = seqs; s < seqs + n; ++s)
        for (int t = 0; t < s->T; ++t, ++T) {
            caches.k[T] = static_cast<uint8_t *>(s->kv->k);
            caches.v[T] = static_cast<uint8_t *>(s->kv->v);
        }
    launch_prologue(stream, qg, q_norm, q, k, k_norm, v, kv0, caches, pos, pos, T, n_head, n_head_kv, head_dim, n_rot,
                    theta, eps);
    launch_attention(stream, warp, q, kv0, caches, pos, nullptr, T, n_head, n_head_kv, head_dim, out, scratch,
                     scratch_bytes);
}

}  // namespace luce::gpu
