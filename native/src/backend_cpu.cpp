// backend_cpu.cpp — the reference backend: plain loops, fp32 accumulation, one thread pool.
//
// Work is split where it is cheap to split: matmul over weight rows (each thread streams its own
// slice of the weight once for all T tokens, through the quant kernels' matmul_rows), attention
// over (token, head) pairs, the DeltaNet recurrence over value heads, norms over rows.
#include "backend_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "errors.h"
#include "quants.h"
#include "quants_kernels.h"  // f16_to_f32
#include "sampling.h"  // Ranking

namespace luce {

namespace {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with its default threshold: x > 20 returns x.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Smallest share of work (in multiply-adds) worth waking another thread for: below it the
// wake-up costs more than the arithmetic, so small ops of a tiny model run on one thread.
constexpr int64_t MIN_WORK_PER_THREAD = 1 << 15;

// Items per scheduling unit given the cost of one item; at least `floor` items.
int64_t grain_for(int64_t work_per_item, int64_t floor = 1) {
    return std::max(floor, MIN_WORK_PER_THREAD / std::max<int64_t>(1, work_per_item));
}

// The inner loops below are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load
// time (GCC/Clang function multiversioning), so one binary runs anywhere and uses wide vectors
// where the CPU has them. Reductions keep 16 partial sums (a vector register's worth) so they
// vectorize without -ffast-math; the order of fp32 additions is therefore fixed per build.
#if defined(__x86_64__) && defined(__GNUC__)
#define LUCE_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LUCE_MULTIVERSION
#endif

constexpr int LANES = 16;

LUCE_MULTIVERSION float dot(const float *a, const float *b, int n) {
    float acc[LANES] = {};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; ++l) acc[l] += a[i + l] * b[i + l];
    float s = 0.f;
    for (; i < n; ++i) s += a[i] * b[i];
    for (int l = 0; l < LANES; ++l) s += acc[l];
    return s;
}

// y += a * x
LUCE_MULTIVERSION void axpy(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// One token of the delta rule for one value head (spec §1.4 step 7), S [DK][DV] row-major:
//   S = decay S;  kv = S^T k;  delta = beta (v - kv);  S += k delta^T;  o = S^T q
// Two passes over S, each streaming rows of DV contiguous floats.
LUCE_MULTIVERSION void delta_rule_token(float *S, const float *q, const float *k, const float *v,
                                        float beta, float decay, int DK, int DV, float *kv, float *o) {
    for (int c = 0; c < DV; ++c) kv[c] = 0.f;
    for (int i = 0; i < DK; ++i) {
        float *Si = S + int64_t(i) * DV;
        const float ki = k[i];
        for (int c = 0; c < DV; ++c) {
            Si[c] *= decay;
            kv[c] += Si[c] * ki;
        }
    }
    for (int c = 0; c < DV; ++c) kv[c] = beta * (v[c] - kv[c]);
    for (int c = 0; c < DV; ++c) o[c] = 0.f;
    for (int i = 0; i < DK; ++i) {
        float *Si = S + int64_t(i) * DV;
        const float ki = k[i], qi = q[i];
        for (int c = 0; c < DV; ++c) {
            Si[c] += ki * kv[c];
            o[c] += Si[c] * qi;
        }
    }
}

// out[c] = silu(sum_j w[c][j] * window_j[c]) for one token over C channels; window_j points at
// the raw input row of time t - (Kc-1) + j. Channel-inner so rows are read contiguously.
LUCE_MULTIVERSION void conv_token(const float *const *window, const float *w, int C, int Kc, float *out) {
    for (int c = 0; c < C; ++c) {
        float acc = 0.f;
        for (int j = 0; j < Kc; ++j) acc += w[int64_t(c) * Kc + j] * window[j][c];
        out[c] = silu(acc);
    }
}

}  // namespace

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) {}

// Each allocation carries its size in a 64-byte header (keeping the 64-byte alignment), so
// release() can count it without a table.
constexpr size_t ALLOC_HEADER = 64;

void *CpuBackend::alloc(size_t n_bytes) {
    const size_t bytes = std::max<size_t>(64, (n_bytes + 63) / 64 * 64);
    auto *base = static_cast<uint8_t *>(std::aligned_alloc(64, ALLOC_HEADER + bytes));
    if (!base) throw std::bad_alloc();
    std::memcpy(base, &bytes, sizeof bytes);
    std::memset(base + ALLOC_HEADER, 0, bytes);
    count_alloc(bytes);
    return base + ALLOC_HEADER;
}

void CpuBackend::release(void *p) {
    if (!p) return;
    uint8_t *base = static_cast<uint8_t *>(p) - ALLOC_HEADER;
    size_t bytes;
    std::memcpy(&bytes, base, sizeof bytes);
    count_release(bytes);
    std::free(base);
}

void CpuBackend::upload(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }
void CpuBackend::download(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }
void CpuBackend::copy(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }

void CpuBackend::matmul(const Weight &w, const float *x, int T, float *y, int64_t ldy) {
    pool_.run(w.n_out, [&](int64_t r0, int64_t r1) {
        matmul_rows(w.type, w.data, w.n_in, r0, r1, x, T, y, ldy, prefill_);
    }, grain_for(w.n_in * T, 16));  // >= 16 rows: whole cache lines of y
}

void CpuBackend::get_rows(const Weight &w, const int32_t *ids, int T, float *out) {
    const int64_t rb = row_bytes(w.type, w.n_in);
    for (int t = 0; t < T; ++t) {
        const uint8_t *row = static_cast<const uint8_t *>(w.data) + int64_t(ids[t]) * rb;
        dequantize_row(w.type, row, out + int64_t(t) * w.n_in, w.n_in);
    }
}

void CpuBackend::rmsnorm(const float *x, int64_t x_stride, const float *w, int n_rows, int dim,
                         float eps, float *y, int64_t y_stride) {
    pool_.run(n_rows, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float *xr = x + r * x_stride;
            float *yr = y + r * y_stride;
            const float scale = 1.0f / std::sqrt(dot(xr, xr, dim) / float(dim) + eps);
            for (int i = 0; i < dim; ++i) yr[i] = xr[i] * scale * w[i];
        }
    }, grain_for(2 * dim));
}

void CpuBackend::rmsnorm_gated(float *o, const float *w, const float *z, int T, int n_heads, int dim,
                               float eps) {
    pool_.run(int64_t(T) * n_heads, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            float *orow = o + r * dim;
            const float *zr = z + r * dim;
            const float scale = 1.0f / std::sqrt(dot(orow, orow, dim) / float(dim) + eps);
            for (int i = 0; i < dim; ++i) orow[i] = orow[i] * scale * w[i] * silu(zr[i]);
        }
    }, grain_for(8 * dim));
}

void CpuBackend::mul_sigmoid(float *o, const float *g, int64_t g_stride, int n_rows, int dim) {
    for (int r = 0; r < n_rows; ++r)
        for (int d = 0; d < dim; ++d) o[int64_t(r) * dim + d] *= sigmoid(g[r * g_stride + d]);
}

void CpuBackend::swiglu(float *gate, const float *up, int n_rows, int64_t dim) {
    pool_.run(int64_t(n_rows) * dim, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) gate[i] = silu(gate[i]) * up[i];
    }, grain_for(8));
}

void CpuBackend::add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void CpuBackend::rope_neox(float *x, const int32_t *pos, int T, int n_head, int head_dim, int n_rot,
                           float theta) {
    // inv_freq[i] = theta^(-2i/R) in fp32 as HF computes it (spec §1.3, §5); angle in fp32.
    const int half = n_rot / 2;
    float inv_freq[512];
    for (int i = 0; i < half; ++i)
        inv_freq[i] = 1.0f / std::pow(theta, float(2 * i) / float(n_rot));
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < half; ++i) {
            float angle = float(pos[t]) * inv_freq[i];
            float c = std::cos(angle), s = std::sin(angle);
            for (int h = 0; h < n_head; ++h) {
                float *xh = x + (int64_t(t) * n_head + h) * head_dim;
                float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
    }
}

void CpuBackend::kv_store(KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
                          int n_head_kv, int head_dim) {
    const KvFormat &f = kv.format;
    const size_t k_row = kv_row_bytes(f.k, head_dim), v_row = kv_row_bytes(f.v, head_dim);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < n_head_kv; ++h) {
            const int64_t dst = int64_t(h) * kv.n_ctx + pos[t];
            const int64_t src = (int64_t(t) * n_head_kv + h) * head_dim;
            kv_encode_row(f.k, k + src, head_dim, static_cast<uint8_t *>(kv.k) + dst * int64_t(k_row));
            kv_encode_row(f.v, v + src, head_dim, static_cast<uint8_t *>(kv.v) + dst * int64_t(v_row));
        }
}

void CpuBackend::hadamard_rows(float *x, int n_rows, int dim) {
    pool_.run(n_rows, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) fwht(x + r * dim, dim);
    }, grain_for(int64_t(dim) * 8));
}

void CpuBackend::attention(const float *q, const KvLayer &kv, const int32_t *pos, const uint8_t *mask,
                           int T, int n_head, int n_head_kv, int head_dim, float *out) {
    const int group = n_head / n_head_kv;  // q head h reads kv head h / group (contiguous groups)
    const float scale = 1.0f / std::sqrt(float(head_dim));
    pool_.run(int64_t(T) * n_head, [&](int64_t u0, int64_t u1) {
        // Per-thread scratch that only grows: no allocation per decoded token.
        thread_local std::vector<float> scores, row;
        if (scores.size() < size_t(kv.n_ctx)) scores.resize(size_t(kv.n_ctx));
        if (row.size() < size_t(head_dim)) row.resize(size_t(head_dim));
        const KvFormat &f = kv.format;
        for (int64_t u = u0; u < u1; ++u) {
            const int t = int(u / n_head), h = int(u % n_head);
            const float *qh = q + u * head_dim;
            const int64_t kv_base = int64_t(h / group) * kv.n_ctx;  // row index of key 0 of this head
            const int n_keys = mask ? kv.n_ctx : pos[t] + 1;
            const int first = kv.window > 0 ? std::max(0, pos[t] - kv.window + 1) : 0;  // --fa-window
            const uint8_t *m = mask ? mask + int64_t(t) * kv.n_ctx : nullptr;
            float max_s = -INFINITY;
            for (int j = first; j < n_keys; ++j) {
                if (m && !m[j]) { scores[j] = -INFINITY; continue; }
                scores[j] = dot(qh, kv_decode_row(f.k, kv.k, kv_base + j, head_dim, row.data()), head_dim) * scale;
                max_s = std::max(max_s, scores[j]);
            }
            float *oh = out + u * head_dim;
            std::fill(oh, oh + head_dim, 0.f);
            float sum = 0.f;
            for (int j = first; j < n_keys; ++j) {
                if (scores[j] == -INFINITY) continue;
                float p = std::exp(scores[j] - max_s);
                sum += p;
                axpy(oh, p, kv_decode_row(f.v, kv.v, kv_base + j, head_dim, row.data()), head_dim);
            }
            const float inv = sum > 0.f ? 1.0f / sum : 0.f;
            for (int d = 0; d < head_dim; ++d) oh[d] *= inv;
        }
    }, grain_for(int64_t(mask ? kv.n_ctx : pos[T - 1] + 1) * head_dim * 2));
}

void CpuBackend::conv_silu(const float *x, float *state, const float *w, int T, int C, int Kc,
                           float *out, const int32_t *parent) {
    // Token t's window over taps j = 0..Kc-1 is the raw input at time t-(Kc-1)+j: a row of the
    // state (previous raw inputs, oldest first) when that time is before this step, else of x.
    // Split over channels so each thread owns a slice of every row (state update included).
    const int S = Kc - 1;
    auto row = [&](int time, int64_t c0) {
        return time < 0 ? state + int64_t(S + time) * C + c0 : x + int64_t(time) * C + c0;
    };
    pool_.run(C, [&](int64_t c0, int64_t c1) {
        const float *window[64];  // Kc <= 64 (model.cpp bounds ssm.conv_kernel)
        for (int t = 0; t < T; ++t) {
            if (parent) {  // tree: newest tap = t, then its ancestors, then state rows newest first
                int node = t, back = 0;
                for (int j = Kc - 1; j >= 0; --j) {
                    window[j] = node >= 0 ? x + int64_t(node) * C + c0 : row(-(++back), c0);
                    if (node >= 0) node = parent[node];
                }
            } else {
                for (int j = 0; j < Kc; ++j) window[j] = row(t - S + j, c0);
            }
            conv_token(window, w + c0 * Kc, int(c1 - c0), Kc, out + int64_t(t) * C + c0);
        }
        if (parent) return;  // a tree step leaves the state; the caller restores the chosen path
        // New state = the last S raw inputs of (old state ++ x). Rows are taken oldest first,
        // and a state row is only read from a later row index, so the update is in place.
        for (int i = 0; i < S; ++i) {
            const float *src = row(T - S + i, c0);
            float *dst = state + int64_t(i) * C + c0;
            if (src != dst) std::memmove(dst, src, sizeof(float) * size_t(c1 - c0));
        }
    }, grain_for(int64_t(T) * (Kc + 8), 16));
}

void CpuBackend::gated_delta_net(const float *conv, const float *b, const float *a, const float *ssm_a,
                                 const float *dt_bias, const DeltaNetDims &dm, int T, float *state,
                                 float *out, float *state_history, const int32_t *parent) {
    const int HK = dm.hk, HV = dm.hv, DK = dm.dk, DV = dm.dv;
    if (parent && !state_history) fail(LUCE_ERR_INTERNAL, "tree-mode delta rule needs the state history");
    const int64_t CD = 2 * int64_t(HK) * DK + int64_t(HV) * DV;
    const float q_scale = 1.0f / std::sqrt(float(DK));
    pool_.run(HV, [&](int64_t j0, int64_t j1) {
        thread_local std::vector<float> q, k, kv, start;  // per-thread scratch, grows once
        q.resize(size_t(DK));
        k.resize(size_t(DK));
        kv.resize(size_t(DV));
        const size_t SS = size_t(DK) * size_t(DV);
        for (int64_t j = j0; j < j1; ++j) {
            const int kh = int(j % HK);  // tiled GGUF order (spec §3.4 item 5)
            float *S = state + j * DK * DV;  // [DK][DV]
            if (parent) start.assign(S, S + SS);  // the state before the step, for root-level nodes
            for (int t = 0; t < T; ++t) {
                if (parent && parent[t] != t - 1)  // tree: continue from the parent's state
                    std::memcpy(S, parent[t] < 0 ? start.data() : state_history + (int64_t(parent[t]) * HV + j) * SS,
                                sizeof(float) * SS);
                const float *row = conv + int64_t(t) * CD;
                // L2 norm with llama.cpp's clamp: x / max(||x||, eps); q also scaled by 1/sqrt(DK).
                const float *qs = row + int64_t(kh) * DK, *ks = row + int64_t(HK) * DK + int64_t(kh) * DK;
                const float qf = q_scale / std::max(std::sqrt(dot(qs, qs, DK)), dm.eps);
                const float kf = 1.0f / std::max(std::sqrt(dot(ks, ks, DK)), dm.eps);
                for (int i = 0; i < DK; ++i) { q[i] = qs[i] * qf; k[i] = ks[i] * kf; }
                const float *v = row + 2 * int64_t(HK) * DK + j * DV;
                const float beta = sigmoid(b[int64_t(t) * HV + j]);
                const float decay = std::exp(ssm_a[j] * softplus(a[int64_t(t) * HV + j] + dt_bias[j]));
                float *o = out + (int64_t(t) * HV + j) * DV;
                delta_rule_token(S, q.data(), k.data(), v, beta, decay, DK, DV, kv.data(), o);
                if (state_history)
                    std::memcpy(state_history + (int64_t(t) * HV + j) * DK * DV, S,
                                sizeof(float) * size_t(DK) * size_t(DV));
            }
        }
    }, grain_for(int64_t(T) * DK * DV * 4));
}

int32_t CpuBackend::argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return int32_t(best);
}

// ---- Drafter ops (backend.h's last block; the reference for gpu/drafter.cu) -------------------

void CpuBackend::drafter_masks(uint8_t *masks, int rows, int cap, const int32_t *pos, int B, int window,
                               unsigned variants) {
    const int p0 = pos[0];
    for (int v = 0; v < 4; ++v) {
        if (!(variants >> v & 1)) continue;
        const bool sliding = v & 2, causal = v & 1;
        for (int j = 0; j < B; ++j) {
            uint8_t *m = masks + (int64_t(v) * rows + j) * cap;
            std::fill(m, m + cap, uint8_t(0));
            for (int i = sliding ? std::max(0, p0 + j - window + 1) : 0; i < p0; ++i) m[i] = 1;
            for (int jj = 0; jj < B; ++jj) m[p0 + jj] = (!causal || jj <= j) ? 1 : 0;
        }
    }
}

void CpuBackend::rope_table(float *x, const int32_t *pos, int T, int n_head, int head_dim, const float *inv_freq,
                            float mscale) {
    const int half = head_dim / 2;
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < half; ++i) {
            const float angle = float(pos[t]) * inv_freq[i];
            const float c = std::cos(angle) * mscale, s = std::sin(angle) * mscale;
            for (int h = 0; h < n_head; ++h) {
                float *xh = x + (int64_t(t) * n_head + h) * head_dim;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
}

void CpuBackend::dyn_conv(const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B, int E,
                          int K, int group, float *out) {
    const int G = E / group;
    for (int t = 0; t < B; ++t) {
        const float *dt = dyn + int64_t(t) * dyn_stride;
        float *o = out + int64_t(t) * E;
        std::fill(o, o + E, 0.f);
        for (int tau = 0; tau < K && tau <= t; ++tau) {
            const float *bs = base + int64_t(tau) * E, *src = in + int64_t(t - tau) * E;
            for (int c = 0; c < E; ++c) o[c] += (bs[c] + dt[tau * G + c / group]) * src[c];
        }
    }
}

void CpuBackend::softcap(float *x, int64_t n, float mult, float cap) {
    if (mult != 1.f)
        for (int64_t i = 0; i < n; ++i) x[i] *= mult;
    if (cap > 0.f)
        for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] / cap) * cap;
}

void CpuBackend::argmax_rows(const float *x, int n_rows, int64_t n, int32_t *out) {
    for (int r = 0; r < n_rows; ++r) out[r] = argmax(x + int64_t(r) * n, n);
}

void CpuBackend::topk_rows(const float *x, int n_rows, int64_t n, int k, int32_t *ids, float *vals) {
    Ranking ranking;  // the samplers' order: value descending, ties to the lower id
    for (int r = 0; r < n_rows; ++r) {
        const float *row = x + int64_t(r) * n;
        ranking.reset(row, int(n));
        const int32_t *best = ranking.best(k);
        for (int i = 0; i < k; ++i) {
            ids[int64_t(r) * k + i] = best[i];
            vals[int64_t(r) * k + i] = row[best[i]];
        }
    }
}

void CpuBackend::selector_pairs(const float *hproj, const float *pred, const float *succ, int n_rows, int k, int R,
                                float *out) {
    for (int t = 0; t < n_rows; ++t)
        for (int a = 0; a < k; ++a) {
            const float *p = pred + (int64_t(t) * k + a) * R, *h = hproj + int64_t(t) * R;
            for (int b = 0; b < k; ++b) {
                const float *s = succ + (int64_t(t) * k + b) * R;
                float dot = 0.f;
                for (int r = 0; r < R; ++r) dot += (p[r] * h[r]) * s[r];
                out[(int64_t(t) * k + a) * k + b] = dot;
            }
        }
}

void CpuBackend::confidence(const float *h, const float *e, const float *w, float b, int E, int R, float *out) {
    float z = b;
    for (int i = 0; i < E; ++i) z += w[i] * h[i];
    for (int r = 0; r < R; ++r) z += w[E + r] * e[r];
    *out = 1.0f / (1.0f + std::exp(-z));
}

void CpuBackend::copy_rows(void *dst, int64_t dst_stride, const void *src, int64_t src_stride, int64_t width,
                           int n_rows) {
    for (int r = 0; r < n_rows; ++r)
        std::memcpy(static_cast<char *>(dst) + r * dst_stride, static_cast<const char *>(src) + r * src_stride,
                    size_t(width));
}

}  // namespace luce
