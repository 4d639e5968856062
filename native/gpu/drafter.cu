// drafter.cu — the drafter ops of backend.h's last block (block-diffusion drafters on the GPU).
//
// Each kernel computes exactly what CpuBackend's twin in backend_cpu.cpp does (the reference), in
// fp32. Shapes as in backend.h:
//   rope_table      x [T][H][D], angle pos[t] * inv_freq[i], cos/sin scaled by mscale.
//   dyn_conv        DFlash 2 grouped dynamic conv of one block, out [B][E].
//   drafter_masks   the block's attention masks, one thread per (key, slot, variant).
//   softcap         DFlash 2 unary-logit transform.
//   argmax_rows     top 1 by the top-k passes (one block per row alone left most of the device
//                   idle: 385 us for 8 vocabulary rows on the H200), index to device memory (no
//                   host round trip in a chain).
//   topk_rows       two passes: every CHUNK of a row keeps its own top k (pass 1), one block per
//                   row merges the n_chunk * k survivors (pass 2). The global top k is inside
//                   the union of the chunks' top k, so the result is exact.
//   selector_pairs  one thread per (t, a, b) dot product over R.
//   confidence      one block, sum then sigmoid.
//   copy_rows       one block per row, 4-byte words.
// Selection never marks elements as taken: round r picks the best element ranked strictly
// after round r-1's pick in the order (value desc, id asc), so no scratch flags are needed.
#include <climits>

#include "kernels.h"

namespace luce::gpu {

namespace {

constexpr int ELEMENTWISE = 256;
constexpr int SELECT_THREADS = 256;  // power of two: the tree reductions halve it
constexpr int TOPK_CHUNK = 4096;

unsigned blocks(int64_t n) { return unsigned((n + ELEMENTWISE - 1) / ELEMENTWISE); }

// ---- kernels -----------------------------------------------------------------------------------

__global__ void rope_table_kernel(float *x, const int32_t *pos, int T, int n_head, int head_dim,
                                  const float *inv_freq, float mscale) {
    wait_for_inputs();
    const int half = head_dim / 2;
    const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (idx >= int64_t(T) * n_head * half) return;
    const int i = int(idx % half);
    const int64_t th = idx / half;  // t * n_head + h
    const int t = int(th / n_head);
    const float angle = float(pos[t]) * inv_freq[i];
    const float c = cosf(angle) * mscale, s = sinf(angle) * mscale;
    float *xh = x + th * head_dim;
    const float a = xh[i], b = xh[i + half];
    xh[i] = a * c - b * s;
    xh[i + half] = b * c + a * s;
}

__global__ void dyn_conv_kernel(const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B,
                                int E, int K, int group, float *out) {
    wait_for_inputs();
    const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (idx >= int64_t(B) * E) return;
    const int c = int(idx % E), t = int(idx / E), G = E / group;
    const float *dt = dyn + int64_t(t) * dyn_stride;
    float acc = 0.f;
    for (int tau = 0; tau < K && tau <= t; ++tau)
        acc += (base[int64_t(tau) * E + c] + dt[tau * G + c / group]) * in[int64_t(t - tau) * E + c];
    out[idx] = acc;
}

// One thread per (key i, slot j, variant v): the rule of Backend::drafter_masks.
__global__ void drafter_masks_kernel(uint8_t *masks, int rows, int cap, const int32_t *pos, int B, int window,
                                     unsigned variants) {
    wait_for_inputs();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y, v = blockIdx.z;
    if (i >= cap || !(variants >> v & 1)) return;
    const int p0 = pos[0];
    const bool sliding = v & 2, causal = v & 1;
    bool vis = false;
    if (i < p0) vis = !sliding || i > p0 + j - window;
    else if (i < p0 + B) vis = !causal || i - p0 <= j;
    masks[(int64_t(v) * rows + j) * cap + i] = vis;
}

__global__ void softcap_kernel(float *x, int64_t n, float mult, float cap) {
    wait_for_inputs();
    const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    if (mult != 1.f) v *= mult;
    if (cap > 0.f) v = tanhf(v / cap) * cap;
    x[i] = v;
}

// (v, i) ranks before (bv, bi): larger value, then smaller index. Invalid entries (i < 0) never do.
__device__ __forceinline__ bool ranks_before(float v, int64_t i, float bv, int64_t bi) {
    return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

// The whole block agrees on the best (value, index) of its threads' candidates.
__device__ void block_best(float &v, int64_t &i) {
    __shared__ float sv[SELECT_THREADS];
    __shared__ int64_t si[SELECT_THREADS];
    sv[threadIdx.x] = v;
    si[threadIdx.x] = i;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half &&
            ranks_before(sv[threadIdx.x + half], si[threadIdx.x + half], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + half];
            si[threadIdx.x] = si[threadIdx.x + half];
        }
        __syncthreads();
    }
    v = sv[0];
    i = si[0];
    __syncthreads();  // sv/si are reused by the next call
}

// k selection rounds over n candidates (values vals[j], ids ids[j] or base + j when ids is null);
// writes k (id, value) pairs, id -1 once the candidates run out.
__device__ void select_k(const float *vals, const int32_t *ids, int64_t base, int64_t n, int k, int32_t *out_ids,
                         float *out_vals) {
    float pv = INFINITY;
    int64_t pi = -1;  // the previous pick; (+inf, -1) ranks before everything
    for (int r = 0; r < k; ++r) {
        float bv = -INFINITY;
        int64_t bi = -1;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const float v = vals[j];
            const int64_t id = ids ? ids[j] : base + j;
            const bool after = pi < 0 || v < pv || (v == pv && id > pi);  // strictly after the last pick
            if (id >= 0 && after && ranks_before(v, id, bv, bi)) bv = v, bi = id;
        }
        block_best(bv, bi);
        if (threadIdx.x == 0) {
            out_ids[r] = int32_t(bi);
            out_vals[r] = bv;
        }
        if (bi < 0) pv = -INFINITY, pi = INT64_MAX;  // exhausted: nothing ranks after this
        else pv = bv, pi = bi;
    }
}

// Pass 1: grid (n_chunk, n_rows); chunk c of row r -> cand [r][c][k].
__global__ void topk_chunks_kernel(const float *x, int64_t n, int k, int32_t *cand_ids, float *cand_vals) {
    wait_for_inputs();
    const int64_t c0 = int64_t(blockIdx.x) * TOPK_CHUNK;
    const int64_t len = n - c0 < TOPK_CHUNK ? n - c0 : TOPK_CHUNK;
    const int64_t slot = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * k;
    select_k(x + int64_t(blockIdx.y) * n + c0, nullptr, c0, len, k, cand_ids + slot, cand_vals + slot);
}

// argmax_rows pass 2 (pass 1: topk_chunks_kernel with k = 1): one block per row over its n_chunk
// candidates; a row with nothing to rank (all NaN) gives index 0, as the CPU backend.
__global__ void argmax_merge_kernel(const int32_t *cand_ids, const float *cand_vals, int64_t n_cand, int32_t *out) {
    wait_for_inputs();
    const int64_t r = blockIdx.x;
    float bv = -INFINITY;
    int64_t bi = -1;
    for (int64_t j = threadIdx.x; j < n_cand; j += blockDim.x)
        if (ranks_before(cand_vals[r * n_cand + j], cand_ids[r * n_cand + j], bv, bi))
            bv = cand_vals[r * n_cand + j], bi = cand_ids[r * n_cand + j];
    block_best(bv, bi);
    if (threadIdx.x == 0) out[r] = int32_t(bi < 0 ? 0 : bi);
}

// Pass 2: one block per row over its n_chunk * k candidates.
__global__ void topk_merge_kernel(const int32_t *cand_ids, const float *cand_vals, int64_t n_cand, int k,
                                  int32_t *ids, float *vals) {
    wait_for_inputs();
    const int64_t r = blockIdx.x;
    select_k(cand_vals + r * n_cand, cand_ids + r * n_cand, 0, n_cand, k, ids + r * k, vals + r * k);
}

__global__ void selector_pairs_kernel(const float *hproj, const float *pred, const float *succ, int n_rows, int k,
                                      int R, float *out) {
    wait_for_inputs();
    const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (idx >= int64_t(n_rows) * k * k) return;
    const int b = int(idx % k), a = int(idx / k % k), t = int(idx / (int64_t(k) * k));
    const float *p = pred + (int64_t(t) * k + a) * R, *h = hproj + int64_t(t) * R, *s = succ + (int64_t(t) * k + b) * R;
    float dot = 0.f;
    for (int r = 0; r < R; ++r) dot += (p[r] * h[r]) * s[r];
    out[idx] = dot;
}

__global__ void confidence_kernel(const float *h, const float *e, const float *w, float b, int E, int R,
                                  float *out) {
    wait_for_inputs();
    float z = 0.f;
    for (int i = threadIdx.x; i < E + R; i += blockDim.x) z += w[i] * (i < E ? h[i] : e[i - E]);
    z = block_sum(z);
    if (threadIdx.x == 0) *out = 1.0f / (1.0f + expf(-(b + z)));
}

__global__ void copy_rows_kernel(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                                 int64_t width) {
    wait_for_inputs();
    float *d = dst + blockIdx.x * dst_stride;
    const float *s = src + blockIdx.x * src_stride;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------------

void rope_table(cudaStream_t stream, float *x, const int32_t *pos, int T, int n_head, int head_dim,
                const float *inv_freq, float mscale) {
    const int64_t n = int64_t(T) * n_head * (head_dim / 2);
    if (n < 1) return;
    launch_kernel(rope_table_kernel, blocks(n), ELEMENTWISE, 0, stream, x, pos, T, n_head, head_dim, inv_freq, mscale);
}

void dyn_conv(cudaStream_t stream, const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B,
              int E, int K, int group, float *out) {
    const int64_t n = int64_t(B) * E;
    if (n < 1) return;
    if (group < 1 || E % group) fail(LUCE_ERR_INTERNAL, "dyn_conv: group %d does not divide %d", group, E);
    launch_kernel(dyn_conv_kernel, blocks(n), ELEMENTWISE, 0, stream, base, dyn, dyn_stride, in, B, E, K, group, out);
}

void drafter_masks(cudaStream_t stream, uint8_t *masks, int rows, int cap, const int32_t *pos, int B, int window,
                   unsigned variants) {
    if (cap < 1 || B < 1 || !variants) return;
    if (B > rows) fail(LUCE_ERR_INTERNAL, "drafter_masks: %d slots in %d rows", B, rows);
    launch_kernel(drafter_masks_kernel, dim3(blocks(cap), unsigned(B), 4u), ELEMENTWISE, 0, stream, masks, rows, cap,
                  pos, B, window, variants);
}

void softcap(cudaStream_t stream, float *x, int64_t n, float mult, float cap) {
    if (n < 1 || (mult == 1.f && cap <= 0.f)) return;
    launch_kernel(softcap_kernel, blocks(n), ELEMENTWISE, 0, stream, x, n, mult, cap);
}

int64_t topk_scratch_bytes(int n_rows, int64_t n, int k) {
    const int64_t n_chunk = (n + TOPK_CHUNK - 1) / TOPK_CHUNK;
    return int64_t(n_rows) * n_chunk * k * int64_t(sizeof(int32_t) + sizeof(float));
}

void topk_rows(cudaStream_t stream, const float *x, int n_rows, int64_t n, int k, int32_t *ids, float *vals,
               void *scratch) {
    if (n_rows < 1) return;
    if (k < 1 || k > Backend::MAX_TOP_K || k > n) fail(LUCE_ERR_INTERNAL, "topk_rows: k = %d of %lld values", k, (long long)n);
    const int64_t n_chunk = (n + TOPK_CHUNK - 1) / TOPK_CHUNK, n_cand = n_chunk * k;
    auto *cand_ids = static_cast<int32_t *>(scratch);
    auto *cand_vals = reinterpret_cast<float *>(cand_ids + int64_t(n_rows) * n_cand);
    launch_kernel(topk_chunks_kernel, dim3(unsigned(n_chunk), unsigned(n_rows)), SELECT_THREADS, 0, stream, x, n, k,
                  cand_ids, cand_vals);
    launch_kernel(topk_merge_kernel, unsigned(n_rows), SELECT_THREADS, 0, stream, cand_ids, cand_vals, n_cand, k, ids,
                  vals);
}

void argmax_rows(cudaStream_t stream, const float *x, int n_rows, int64_t n, int32_t *out, void *scratch) {
    if (n_rows < 1 || n < 1) return;
    const int64_t n_chunk = (n + TOPK_CHUNK - 1) / TOPK_CHUNK;
    auto *cand_ids = static_cast<int32_t *>(scratch);
    auto *cand_vals = reinterpret_cast<float *>(cand_ids + int64_t(n_rows) * n_chunk);
    launch_kernel(topk_chunks_kernel, dim3(unsigned(n_chunk), unsigned(n_rows)), SELECT_THREADS, 0, stream, x, n, 1,
                  cand_ids, cand_vals);
    launch_kernel(argmax_merge_kernel, unsigned(n_rows), SELECT_THREADS, 0, stream, cand_ids, cand_vals, n_chunk, out);
}

void selector_pairs(cudaStream_t stream, const float *hproj, const float *pred, const float *succ, int n_rows,
                    int k, int R, float *out) {
    const int64_t n = int64_t(n_rows) * k * k;
    if (n < 1) return;
    launch_kernel(selector_pairs_kernel, blocks(n), ELEMENTWISE, 0, stream, hproj, pred, succ, n_rows, k, R, out);
}

void confidence(cudaStream_t stream, const float *h, const float *e, const float *w, float b, int E, int R,
                float *out) {
    launch_kernel(confidence_kernel, 1, SELECT_THREADS, 0, stream, h, e, w, b, E, R, out);
}

void copy_rows(cudaStream_t stream, void *dst, int64_t dst_stride, const void *src, int64_t src_stride,
               int64_t width, int n_rows) {
    if (n_rows < 1 || width < 1) return;
    if (width % 4 || dst_stride % 4 || src_stride % 4)
        fail(LUCE_ERR_INTERNAL, "copy_rows: widths and strides must be multiples of 4 bytes");
    launch_kernel(copy_rows_kernel, unsigned(n_rows), ELEMENTWISE, 0, stream, static_cast<float *>(dst), dst_stride / 4,
                  static_cast<const float *>(src), src_stride / 4, width / 4);
}

}  // namespace luce::gpu
