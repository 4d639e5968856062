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
#include <vector>

#include "errors.h"
#include "quants.h"

namespace luce {

namespace {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with its default threshold: x > 20 returns x.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Rows of a matmul per scheduling unit: keeps each thread's slice a multiple of 16 rows
// (whole cache lines of y for small T) without starving threads on narrow matrices.
constexpr int64_t MATMUL_GRAIN = 16;

}  // namespace

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) {}

void *CpuBackend::alloc(size_t n_bytes) {
    size_t bytes = std::max<size_t>(64, (n_bytes + 63) / 64 * 64);
    void *p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
}

void CpuBackend::release(void *p) { std::free(p); }
void CpuBackend::upload(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }
void CpuBackend::download(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }

void CpuBackend::matmul(const Weight &w, const float *x, int T, float *y, int64_t ldy) {
    pool_.run(w.n_out, [&](int64_t r0, int64_t r1) {
        matmul_rows(w.type, w.data, w.n_in, r0, r1, x, T, y, ldy);
    }, MATMUL_GRAIN);
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
            float ss = 0.f;
            for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
            float scale = 1.0f / std::sqrt(ss / float(dim) + eps);
            for (int i = 0; i < dim; ++i) yr[i] = xr[i] * scale * w[i];
        }
    }, 8);
}

void CpuBackend::rmsnorm_gated(float *o, const float *w, const float *z, int n_rows, int dim,
                               float eps) {
    pool_.run(n_rows, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            float *orow = o + r * dim;
            const float *zr = z + r * dim;
            float ss = 0.f;
            for (int i = 0; i < dim; ++i) ss += orow[i] * orow[i];
            float scale = 1.0f / std::sqrt(ss / float(dim) + eps);
            for (int i = 0; i < dim; ++i) orow[i] = orow[i] * scale * w[i] * silu(zr[i]);
        }
    }, 8);
}

void CpuBackend::mul_sigmoid(float *o, const float *g, int64_t g_stride, int n_rows, int dim) {
    for (int r = 0; r < n_rows; ++r)
        for (int d = 0; d < dim; ++d) o[int64_t(r) * dim + d] *= sigmoid(g[r * g_stride + d]);
}

void CpuBackend::swiglu(float *gate, const float *up, int64_t n) {
    pool_.run(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) gate[i] = silu(gate[i]) * up[i];
    }, 4096);
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
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < n_head_kv; ++h) {
            int64_t dst = (int64_t(h) * kv.n_ctx + pos[t]) * head_dim;
            int64_t src = (int64_t(t) * n_head_kv + h) * head_dim;
            std::memcpy(kv.k + dst, k + src, sizeof(float) * size_t(head_dim));
            std::memcpy(kv.v + dst, v + src, sizeof(float) * size_t(head_dim));
        }
}

void CpuBackend::attention(const float *q, const KvLayer &kv, const int32_t *pos, const uint8_t *mask,
                           int T, int n_head, int n_head_kv, int head_dim, float *out) {
    const int group = n_head / n_head_kv;  // q head h reads kv head h / group (contiguous groups)
    const float scale = 1.0f / std::sqrt(float(head_dim));
    pool_.run(int64_t(T) * n_head, [&](int64_t u0, int64_t u1) {
        // Per-thread scratch that only grows: no allocation per decoded token.
        thread_local std::vector<float> scores;
        if (scores.size() < size_t(kv.n_ctx)) scores.resize(size_t(kv.n_ctx));
        for (int64_t u = u0; u < u1; ++u) {
            const int t = int(u / n_head), h = int(u % n_head);
            const float *qh = q + u * head_dim;
            const float *K = kv.k + int64_t(h / group) * kv.n_ctx * head_dim;
            const float *V = kv.v + int64_t(h / group) * kv.n_ctx * head_dim;
            const int n_keys = mask ? kv.n_ctx : pos[t] + 1;
            const uint8_t *m = mask ? mask + int64_t(t) * kv.n_ctx : nullptr;
            float max_s = -INFINITY;
            for (int j = 0; j < n_keys; ++j) {
                if (m && !m[j]) { scores[j] = -INFINITY; continue; }
                const float *kj = K + int64_t(j) * head_dim;
                float s = 0.f;
                for (int d = 0; d < head_dim; ++d) s += qh[d] * kj[d];
                scores[j] = s * scale;
                max_s = std::max(max_s, scores[j]);
            }
            float *oh = out + u * head_dim;
            std::fill(oh, oh + head_dim, 0.f);
            float sum = 0.f;
            for (int j = 0; j < n_keys; ++j) {
                if (scores[j] == -INFINITY) continue;
                float p = std::exp(scores[j] - max_s);
                sum += p;
                const float *vj = V + int64_t(j) * head_dim;
                for (int d = 0; d < head_dim; ++d) oh[d] += p * vj[d];
            }
            const float inv = sum > 0.f ? 1.0f / sum : 0.f;
            for (int d = 0; d < head_dim; ++d) oh[d] *= inv;
        }
    });
}

void CpuBackend::conv_silu(const float *x, float *state, const float *w, int T, int C, int Kc,
                           float *out) {
    // Window for token t over taps j = 0..Kc-1: input at time t-(Kc-1)+j, taken from the state
    // (previous raw inputs, oldest first) when that time is before this step.
    const int S = Kc - 1;
    pool_.run(C, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            const float *wc = w + c * Kc;
            for (int t = 0; t < T; ++t) {
                float acc = 0.f;
                for (int j = 0; j < Kc; ++j) {
                    int src = t - S + j;  // < 0: state row S + src
                    float v = src < 0 ? state[int64_t(S + src) * C + c] : x[int64_t(src) * C + c];
                    acc += wc[j] * v;
                }
                out[int64_t(t) * C + c] = silu(acc);
            }
            // New state = last S raw inputs of (old state ++ x).
            for (int i = 0; i < S; ++i) {
                int src = T - S + i;
                state[int64_t(i) * C + c] =
                    src < 0 ? state[int64_t(S + src) * C + c] : x[int64_t(src) * C + c];
            }
        }
    }, 64);
}

void CpuBackend::gated_delta_net(const float *conv, const float *b, const float *a, const float *ssm_a,
                                 const float *dt_bias, const DeltaNetDims &dm, int T, float *state,
                                 float *out, float *state_history) {
    const int HK = dm.hk, HV = dm.hv, DK = dm.dk, DV = dm.dv;
    const int64_t CD = 2 * int64_t(HK) * DK + int64_t(HV) * DV;
    const float q_scale = 1.0f / std::sqrt(float(DK));
    pool_.run(HV, [&](int64_t j0, int64_t j1) {
        thread_local std::vector<float> q, k, kv;  // per-thread scratch, grows once
        q.resize(size_t(DK));
        k.resize(size_t(DK));
        kv.resize(size_t(DV));
        for (int64_t j = j0; j < j1; ++j) {
            const int kh = int(j % HK);  // tiled GGUF order (spec §3.4 item 5)
            float *S = state + j * DK * DV;  // [DK][DV]
            for (int t = 0; t < T; ++t) {
                const float *row = conv + int64_t(t) * CD;
                // L2 norm with llama.cpp's clamp: x / max(||x||, eps); q also scaled by 1/sqrt(DK).
                const float *qs = row + int64_t(kh) * DK, *ks = row + int64_t(HK) * DK + int64_t(kh) * DK;
                float qn = 0.f, kn = 0.f;
                for (int i = 0; i < DK; ++i) { qn += qs[i] * qs[i]; kn += ks[i] * ks[i]; }
                const float qf = q_scale / std::max(std::sqrt(qn), dm.eps);
                const float kf = 1.0f / std::max(std::sqrt(kn), dm.eps);
                for (int i = 0; i < DK; ++i) { q[i] = qs[i] * qf; k[i] = ks[i] * kf; }
                const float *v = row + 2 * int64_t(HK) * DK + j * DV;
                const float beta = sigmoid(b[int64_t(t) * HV + j]);
                const float decay = std::exp(ssm_a[j] * softplus(a[int64_t(t) * HV + j] + dt_bias[j]));
                // Pass 1: S <- decay * S and kv = S^T k.
                std::fill(kv.begin(), kv.end(), 0.f);
                for (int i = 0; i < DK; ++i) {
                    float *Si = S + int64_t(i) * DV;
                    for (int c = 0; c < DV; ++c) {
                        Si[c] *= decay;
                        kv[c] += Si[c] * k[i];
                    }
                }
                // delta = beta (v - kv);  Pass 2: S += k delta^T and o = S^T q.
                for (int c = 0; c < DV; ++c) kv[c] = beta * (v[c] - kv[c]);
                float *o = out + (int64_t(t) * HV + j) * DV;
                std::fill(o, o + DV, 0.f);
                for (int i = 0; i < DK; ++i) {
                    float *Si = S + int64_t(i) * DV;
                    for (int c = 0; c < DV; ++c) {
                        Si[c] += k[i] * kv[c];
                        o[c] += Si[c] * q[i];
                    }
                }
                if (state_history)
                    std::memcpy(state_history + (int64_t(t) * HV + j) * DK * DV, S,
                                sizeof(float) * size_t(DK) * size_t(DV));
            }
        }
    });
}

int32_t CpuBackend::argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return int32_t(best);
}

}  // namespace luce
