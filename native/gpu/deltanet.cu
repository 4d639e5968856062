// deltanet.cu — the Gated DeltaNet causal conv and the delta-rule recurrence.
//
// conv_silu: one thread per channel; it reads the channel's Kc-1 state rows before overwriting
// them, so the state advances in place.
//
// gated_delta_net: all T tokens of a step in ONE launch. Block (j, c0) owns value head j and the
// state columns [c0, c0 + blockDim.x) of S_j [DK][DV]; thread c owns column c. Per token the
// block normalises q and k of k head j % HK (block reductions; every column block repeats this
// small work rather than synchronising with the others) into shared memory, then thread c does
//   pass 1: S[i][c] *= decay,  kv = sum_i S[i][c] k[i]
//           delta = beta (v[c] - kv)
//   pass 2: S[i][c] += k[i] delta,  o[c] = sum_i S[i][c] q[i]   (and the history copy)
// in the same order of fp32 sums as the CPU backend. State columns are independent, so no
// block ever waits on another and the state stays in fp32 device memory between steps.
// For DK in {32, 64, 128} gated_delta_net_reg_kernel keeps the column in registers across the T
// tokens; LUCE_GPU_DELTANET_REG=0 (read by GpuBackend) keeps this kernel.
#include <algorithm>

#include "kernels.h"

namespace luce::gpu {

namespace {

// ---- kernels -----------------------------------------------------------------------------------

__global__ void conv_silu_kernel(const float *x, float *state, const float *w, int T, int C, int Kc,
                                 float *out) {
    const int S = Kc - 1;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        const float *wc = w + int64_t(c) * Kc;
        for (int t = 0; t < T; ++t) {
            float acc = 0.f;
            for (int j = 0; j < Kc; ++j) {
                const int src = t - S + j;  // < 0: state row S + src
                const float v = src < 0 ? state[int64_t(S + src) * C + c] : x[int64_t(src) * C + c];
                acc += wc[j] * v;
            }
            out[int64_t(t) * C + c] = silu(acc);
        }
        for (int i = 0; i < S; ++i) {  // new state = last S raw inputs of (old state ++ x)
            const int src = T - S + i;
            state[int64_t(i) * C + c] = src < 0 ? state[int64_t(S + src) * C + c] : x[int64_t(src) * C + c];
        }
    }
}

// Dynamic shared memory: q[DK] | k[DK].
__global__ void gated_delta_net_kernel(const float *conv, const float *b, const float *a,
                                       const float *ssm_a, const float *dt_bias, int HK, int HV, int DK,
                                       int DV, float eps, int T, float *state, float *out,
                                       float *state_history) {
    extern __shared__ float smem[];
    float *sq = smem, *sk = smem + DK;
    const int j = blockIdx.x, kh = j % HK;  // tiled GGUF order (spec §3.4 item 5)
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const int64_t CD = 2 * int64_t(HK) * DK + int64_t(HV) * DV;
    const float q_scale = 1.0f / sqrtf(float(DK));
    float *S = state + int64_t(j) * DK * DV;
    for (int t = 0; t < T; ++t) {
        const float *row = conv + int64_t(t) * CD;
        const float *qs = row + int64_t(kh) * DK, *ks = row + int64_t(HK) * DK + int64_t(kh) * DK;
        float qn = 0.f, kn = 0.f;
        for (int i = threadIdx.x; i < DK; i += blockDim.x) {
            qn += qs[i] * qs[i];
            kn += ks[i] * ks[i];
        }
        qn = block_sum(qn);
        kn = block_sum(kn);
        // L2 norm with llama.cpp's clamp x / max(||x||, eps); q also scaled by 1/sqrt(DK).
        const float qf = q_scale / fmaxf(sqrtf(qn), eps), kf = 1.0f / fmaxf(sqrtf(kn), eps);
        for (int i = threadIdx.x; i < DK; i += blockDim.x) {
            sq[i] = qs[i] * qf;
            sk[i] = ks[i] * kf;
        }
        __syncthreads();
        if (c < DV) {
            const float beta = sigmoid(b[int64_t(t) * HV + j]);
            const float decay = expf(ssm_a[j] * softplus(a[int64_t(t) * HV + j] + dt_bias[j]));
            float kv = 0.f;
            for (int i = 0; i < DK; ++i) {
                const float s = S[int64_t(i) * DV + c] * decay;
                S[int64_t(i) * DV + c] = s;
                kv += s * sk[i];
            }
            const float v = row[2 * int64_t(HK) * DK + int64_t(j) * DV + c];
            const float delta = beta * (v - kv);
            float o = 0.f;
            float *hist = state_history ? state_history + (int64_t(t) * HV + j) * DK * DV : nullptr;
            for (int i = 0; i < DK; ++i) {
                const float s = S[int64_t(i) * DV + c] + sk[i] * delta;
                S[int64_t(i) * DV + c] = s;
                o += s * sq[i];
                if (hist) hist[int64_t(i) * DV + c] = s;
            }
            out[(int64_t(t) * HV + j) * DV + c] = o;
        }
        __syncthreads();  // sq/sk are rewritten by the next token
    }
}

// The same recurrence with the state column in registers (DK a compile-time constant): thread
// (c, part) holds rows [part * R, (part + 1) * R) of S[:, c] (R = DK / SPLIT), loads them once,
// runs all T tokens on them and stores them once, instead of reading and writing the column twice
// per token in device memory. SPLIT = 2 for DK = 128 keeps the column out of local memory; its
// two partial dot products are added across the lane pair (xor 1), so that sum order differs from
// the CPU's within fp32 rounding; SPLIT = 1 does the CPU's operations in its order.
// Dynamic shared memory: q[DK] | k[DK].
template <int DK, int SPLIT>
__global__ void gated_delta_net_reg_kernel(const float *conv, const float *b, const float *a, const float *ssm_a,
                                           const float *dt_bias, int HK, int HV, int DV, float eps, int T,
                                           float *state, float *out, float *state_history) {
    constexpr int R = DK / SPLIT;
    extern __shared__ float smem[];
    float *sq = smem, *sk = smem + DK;
    const int j = blockIdx.x, kh = j % HK;
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) / SPLIT, part = threadIdx.x % SPLIT, i0 = part * R;
    const bool active = c < DV;
    const int64_t CD = 2 * int64_t(HK) * DK + int64_t(HV) * DV;
    const float q_scale = 1.0f / sqrtf(float(DK));
    float *S = state + int64_t(j) * DK * DV;
    float col[R];
#pragma unroll
    for (int r = 0; r < R; ++r) col[r] = active ? S[int64_t(i0 + r) * DV + c] : 0.f;
    for (int t = 0; t < T; ++t) {
        const float *row = conv + int64_t(t) * CD;
        const float *qs = row + int64_t(kh) * DK, *ks = row + int64_t(HK) * DK + int64_t(kh) * DK;
        float qn = 0.f, kn = 0.f;
        for (int i = threadIdx.x; i < DK; i += blockDim.x) {
            qn += qs[i] * qs[i];
            kn += ks[i] * ks[i];
        }
        qn = block_sum(qn);
        kn = block_sum(kn);
        const float qf = q_scale / fmaxf(sqrtf(qn), eps), kf = 1.0f / fmaxf(sqrtf(kn), eps);
        for (int i = threadIdx.x; i < DK; i += blockDim.x) {
            sq[i] = qs[i] * qf;
            sk[i] = ks[i] * kf;
        }
        __syncthreads();
        // Every lane runs the arithmetic (inactive ones on zeros) so the pair shuffles stay uniform.
        const float beta = active ? sigmoid(b[int64_t(t) * HV + j]) : 0.f;
        const float decay = active ? expf(ssm_a[j] * softplus(a[int64_t(t) * HV + j] + dt_bias[j])) : 0.f;
        float kv = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            col[r] = col[r] * decay;
            kv += col[r] * sk[i0 + r];
        }
        if (SPLIT == 2) kv += shfl_xor(kv, 1);
        const float v = active ? row[2 * int64_t(HK) * DK + int64_t(j) * DV + c] : 0.f;
        const float delta = beta * (v - kv);
        float o = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            col[r] = col[r] + sk[i0 + r] * delta;
            o += col[r] * sq[i0 + r];
        }
        if (SPLIT == 2) o += shfl_xor(o, 1);
        if (active) {
            if (state_history) {
                float *hist = state_history + (int64_t(t) * HV + j) * DK * DV;
#pragma unroll
                for (int r = 0; r < R; ++r) hist[int64_t(i0 + r) * DV + c] = col[r];
            }
            if (part == 0) out[(int64_t(t) * HV + j) * DV + c] = o;
        }
        __syncthreads();
    }
    if (active) {
#pragma unroll
        for (int r = 0; r < R; ++r) S[int64_t(i0 + r) * DV + c] = col[r];
    }
}

// ---- launchers ---------------------------------------------------------------------------------

constexpr int CONV_THREADS = 256;
constexpr int DELTA_COLUMNS = 64;  // state columns per block: a multiple of both warp sizes

}  // namespace

void conv_silu(cudaStream_t stream, const float *x, float *state, const float *w, int T, int C, int Kc,
               float *out) {
    if (T < 1 || C < 1) return;
    conv_silu_kernel<<<unsigned((C + CONV_THREADS - 1) / CONV_THREADS), CONV_THREADS, 0, stream>>>(
        x, state, w, T, C, Kc, out);
    LUCE_GPU_LAUNCHED();
}

void gated_delta_net(cudaStream_t stream, int warp, const float *conv, const float *b, const float *a,
                     const float *ssm_a, const float *dt_bias, const DeltaNetDims &dm, int T,
                     float *state, float *out, float *state_history, bool registers) {
    if (T < 1) return;
    if (dm.hk < 1 || dm.hv < 1 || dm.dk < 1 || dm.dv < 1 || dm.hv % dm.hk != 0)
        fail(LUCE_ERR_INTERNAL, "GPU DeltaNet: bad dims (hk %d, hv %d, dk %d, dv %d)", dm.hk, dm.hv, dm.dk, dm.dv);
    const int threads = std::max(DELTA_COLUMNS, warp);
    const dim3 grid(unsigned(dm.hv), unsigned((dm.dv + threads - 1) / threads));
    const size_t shared = 2 * sizeof(float) * size_t(dm.dk);
    if (shared > 48 * 1024) fail(LUCE_ERR_UNSUPPORTED, "GPU DeltaNet: state dim %d is too large", dm.dk);
    if (registers && (dm.dk == 32 || dm.dk == 64 || dm.dk == 128)) {
        const int split = dm.dk == 128 ? 2 : 1;  // threads per state column
        const dim3 rgrid(unsigned(dm.hv), unsigned((int64_t(dm.dv) * split + threads - 1) / threads));
#define LUCE_DELTA_REG(DKC, SPLITC)                                                                               \
    gated_delta_net_reg_kernel<DKC, SPLITC><<<rgrid, threads, shared, stream>>>(                                  \
        conv, b, a, ssm_a, dt_bias, dm.hk, dm.hv, dm.dv, dm.eps, T, state, out, state_history)
        if (dm.dk == 32) LUCE_DELTA_REG(32, 1);
        else if (dm.dk == 64) LUCE_DELTA_REG(64, 1);
        else LUCE_DELTA_REG(128, 2);
#undef LUCE_DELTA_REG
        LUCE_GPU_LAUNCHED();
        return;
    }
    gated_delta_net_kernel<<<grid, threads, shared, stream>>>(conv, b, a, ssm_a, dt_bias, dm.hk, dm.hv, dm.dk,
                                                              dm.dv, dm.eps, T, state, out, state_history);
    LUCE_GPU_LAUNCHED();
}

}  // namespace luce::gpu
