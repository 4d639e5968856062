// deltanet.cu — the Gated DeltaNet causal conv and the delta-rule recurrence.
//
// conv_silu: threads per (channel, token); the channel's Kc-1 state rows are read before they
// are overwritten, so the state advances in place. Both ops take a DDTree verify step's parent array
// (device memory): windows and states then follow each node's ancestors (backend_cpu.cpp is the
// reference).
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
#include <algorithm>

#include "kernels.h"
#include "session.h"  // MAX_STEP

namespace luce::gpu {

namespace {

// ---- kernels -----------------------------------------------------------------------------------

// Tap j of token t's window in tree mode: the ancestor Kc-1-j generations above t (t itself for
// the newest tap), or, past the tree's root level, the state rows newest first (backend_cpu.cpp).
__device__ __forceinline__ float tree_tap(const float *x, const float *state, const int32_t *parent, int t, int d,
                                          int S, int C, int c) {
    int node = t;
    for (int k = 0; k < d && node >= 0; ++k) node = parent[node];
    if (node >= 0) return x[int64_t(node) * C + c];
    int depth = 0;  // generations from t to a root-level node (inclusive)
    for (int n = t; n >= 0; n = parent[n]) ++depth;
    return state[int64_t(S - (d - depth + 1)) * C + c];
}

// parent != null (DDTree verify): windows follow each node's ancestors, and the state is left
// as it was (the caller restores the accepted path's). Block: CONV_CHANNELS channels (x) by up to
// CONV_TOKEN_LANES tokens (y), over CONV_BLOCK_TOKENS tokens of the step (grid y); the state
// advances after every thread of the first token block has read the old one.
constexpr int CONV_BLOCK_TOKENS = 32;

__device__ __forceinline__ void conv_silu_block(const float *x, float *state, const float *w, int T, int C, int Kc,
                                                float *out, const int32_t *parent) {
    const int S = Kc - 1, c = blockIdx.x * blockDim.x + threadIdx.x;
    const int t_end = min(T, int(blockIdx.y + 1) * CONV_BLOCK_TOKENS);
    if (c < C) {
        const float *wc = w + int64_t(c) * Kc;
        for (int t = int(blockIdx.y) * CONV_BLOCK_TOKENS + threadIdx.y; t < t_end; t += blockDim.y) {
            float acc = 0.f;
            for (int j = 0; j < Kc; ++j) {
                const int src = t - S + j;  // < 0: state row S + src
                const float v = parent ? tree_tap(x, state, parent, t, Kc - 1 - j, S, C, c)
                                       : src < 0 ? state[int64_t(S + src) * C + c] : x[int64_t(src) * C + c];
                acc += wc[j] * v;
            }
            out[int64_t(t) * C + c] = silu(acc);
        }
    }
    // Only the first token block reads the state in a chain (its tokens include the first S).
    if (parent || blockIdx.y != 0) return;
    __syncthreads();  // the old state rows are read
    if (c < C && threadIdx.y == 0) {
        for (int i = 0; i < S; ++i) {  // new state = last S raw inputs of (old state ++ x), in place
            const int src = T - S + i;
            state[int64_t(i) * C + c] = src < 0 ? state[int64_t(S + src) * C + c] : x[int64_t(src) * C + c];
        }
    }
}

__global__ void conv_silu_kernel(const float *x, float *state, const float *w, int T, int C, int Kc,
                                 float *out, const int32_t *parent) {
    wait_for_inputs();
    conv_silu_block(x, state, w, T, C, Kc, out, parent);
}

// The sequences of one batched launch (Backend::deltanet_sequences), by value in the kernel's
// parameters (2 KB, under the 4 KB limit): grid z = sequence.
struct SeqTable {
    int row0[MAX_STEP], T[MAX_STEP];
    float *conv_state[MAX_STEP], *ssm[MAX_STEP], *history[MAX_STEP];
};

__global__ void conv_silu_seqs_kernel(const float *x, const float *w, int C, int Kc, float *out, SeqTable seqs) {
    wait_for_inputs();
    const int z = blockIdx.z;
    const int64_t r0 = seqs.row0[z];
    conv_silu_block(x + r0 * C, seqs.conv_state[z], w, seqs.T[z], C, Kc, out + r0 * C, nullptr);
}

// Dynamic shared memory: q[DK] | k[DK].
// parent != null (DDTree verify): token t starts from its parent's state (the history row the
// same thread wrote for it, or the step's initial state for root-level nodes) and writes its own
// to the history; `state` is only read.
__global__ void gated_delta_net_kernel(const float *conv, const float *b, const float *a,
                                       const float *ssm_a, const float *dt_bias, int HK, int HV, int DK,
                                       int DV, float eps, int T, float *state, float *out,
                                       float *state_history, const int32_t *parent) {
    wait_for_inputs();
    LUCE_DYNAMIC_SHARED(float, smem);
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
        float norms[2] = {qn, kn};
        block_sums(norms);
        qn = norms[0], kn = norms[1];
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
            float *hist = state_history ? state_history + (int64_t(t) * HV + j) * DK * DV : nullptr;
            // Chain: the state advances in place. Tree: from the parent's state into the history.
            float *dst = parent ? hist : S;
            const float *src = !parent ? S : parent[t] < 0 ? S : state_history + (int64_t(parent[t]) * HV + j) * DK * DV;
            float kv = 0.f;
            for (int i = 0; i < DK; ++i) {
                const float s = src[int64_t(i) * DV + c] * decay;
                dst[int64_t(i) * DV + c] = s;
                kv += s * sk[i];
            }
            const float v = row[2 * int64_t(HK) * DK + int64_t(j) * DV + c];
            const float delta = beta * (v - kv);
            float o = 0.f;
            for (int i = 0; i < DK; ++i) {
                const float s = dst[int64_t(i) * DV + c] + sk[i] * delta;
                dst[int64_t(i) * DV + c] = s;
                o += s * sq[i];
                if (hist && !parent) hist[int64_t(i) * DV + c] = s;
            }
            out[(int64_t(t) * HV + j) * DV + c] = o;
        }
        __syncthreads();  // sq/sk are rewritten by the next token
    }
}

// Sum over the SPLIT adjacent lanes of a state column. Every lane adds the same two values at each
// level (fp32 addition commutes), so all of them get the same bits.
template <int SPLIT>
__device__ __forceinline__ float column_sum(float x) {
#pragma unroll
    for (int m = 1; m < SPLIT; m <<= 1) x += shfl_xor(x, m);
    return x;
}

// Register-resident variant for DK in {16, 32, 64, 128} (Qwen3.5: 128): each thread keeps its
// part of a state column in registers for all T tokens, so the loads and stores happen once per
// launch instead of twice per token, and they are independent (the general kernel above walks
// the column through memory in two dependent chains per token: ~70 us per 27B layer on an H200,
// measured 2026-12-03). Columns of DK >= 32 are split over two adjacent lanes (DK/2 rows each;
// 128 rows plus the 128 k values would overflow the register file), whose two partial sums are
// added (column_sum), and a thread's two dot products over its rows (k . s and q . s) run in
// ACC_CHAINS partial sums (row i into sum i % ACC_CHAINS, then ((0 + 1) + (2 + 3))): one warp per
// scheduler has nothing else to issue, so a single 64-long chain of dependent FMAs (four cycles
// each) was each token's latency twice over (ncu, 2026-12-04: 84-87% of cycles without an
// eligible warp). Otherwise the fp32 operations are the general kernel's. The order does not
// depend on T, so a verify step reproduces the decode steps bit for bit.
// HIST: the per-token state copies for rollback / tree mode. parent != null (tree mode, HIST):
// where a token's parent is not the previous token, the thread reloads its part of the column
// from the parent's history row (which it wrote itself) or from `state` (the step's initial
// state, which a tree step never writes).
// EARLY: the state is loaded before wait_for_inputs(), overlapping the previous kernel's
// tail (at one token those loads are a DRAM round trip of the kernel's ~8 us). Allowed by
// gpu_compat.h's exception: the state's last writer is this layer's kernel of an earlier step or
// a rollback copy, never the kernel just before (the conv), and the loads go through L2.
// FIXED_DV: the value head size as a constant (0: the dv argument). A column's R state rows lie
// DV floats apart, so with DV known each of a token's R history stores (and the state's loads)
// is an offset from one address: with DV at run time, ptxas formed a 64-bit address per store,
// ~260 of the 1212 instructions of the 27B's token loop (sm_90 SASS, 2026-12-05). Same bits.
constexpr int ACC_CHAINS = 4;

// The sum of a thread's ACC_CHAINS partial sums, in the register kernel's order.
__device__ __forceinline__ float chains_sum(const float (&p)[ACC_CHAINS]) { return (p[0] + p[1]) + (p[2] + p[3]); }

template <int DK, bool HIST, bool EARLY, int FIXED_DV>
__device__ __forceinline__ void delta_rule_columns(const float *conv, const float *b, const float *a,
                                                   const float *ssm_a, const float *dt_bias, int HK, int HV, int dv,
                                                   float eps, int T, float *state, float *out, float *state_history,
                                                   const int32_t *parent) {
    const int DV = FIXED_DV ? FIXED_DV : dv;
    // DK = 32 splits too, so the small check models run the path the 27B runs.
    constexpr int SPLIT = DK >= 32 ? 2 : 1, R = DK / SPLIT;
    __shared__ float sq[DK], sk[DK];
    const int j = blockIdx.x, kh = j % HK;  // tiled GGUF order (spec §3.4 item 5)
    const int part = threadIdx.x % SPLIT;
    const int c = blockIdx.y * (blockDim.x / SPLIT) + threadIdx.x / SPLIT;
    const bool active = c < DV;
    const int64_t CD = 2 * int64_t(HK) * DK + int64_t(HV) * DV;
    const float q_scale = 1.0f / sqrtf(float(DK));
    float *S = state + int64_t(j) * DK * DV + int64_t(part) * R * DV + c;  // row part * R of column c
    float s[R];
    auto load_state = [&] {
        const float *p = S;  // a running pointer: R 64-bit addresses would crowd the registers
#pragma unroll
        for (int i = 0; i < R; ++i, p += DV) s[i] = EARLY ? load_l2(p) : *p;
    };
    if (EARLY && active) load_state();
    wait_for_inputs();
    if (!EARLY && active) load_state();
    // Token t + 1's inputs are loaded while token t is computed: each load is an L2 round trip
    // that nothing else hides (one warp per block, a few blocks per SM), three of them in a
    // chain per token before.
    constexpr int NQ = (DK + 31) / 32;  // q and k values per thread (blocks of >= 32 threads)
    struct Inputs {
        float q[NQ], k[NQ], b, a, v;
    };
    auto load_inputs = [&](int t, Inputs &in) {
        const float *row = conv + int64_t(t) * CD;
        const float *qs = row + int64_t(kh) * DK, *ks = row + int64_t(HK) * DK + int64_t(kh) * DK;
#pragma unroll
        for (int m = 0; m < NQ; ++m) {
            const int i = threadIdx.x + m * blockDim.x;
            in.q[m] = i < DK ? qs[i] : 0.f;
            in.k[m] = i < DK ? ks[i] : 0.f;
        }
        in.b = b[int64_t(t) * HV + j];
        in.a = a[int64_t(t) * HV + j];
        in.v = active ? row[2 * int64_t(HK) * DK + int64_t(j) * DV + c] : 0.f;
    };
    Inputs cur, next;
    load_inputs(0, cur);
    for (int t = 0; t < T; ++t) {
        if (t + 1 < T) load_inputs(t + 1, next);
        if constexpr (HIST) {
            if (parent && parent[t] != t - 1 && active) {
                const float *p = parent[t] < 0 ? S : state_history + (int64_t(parent[t]) * HV + j) * DK * DV +
                                                         int64_t(part) * R * DV + c;
#pragma unroll
                for (int i = 0; i < R; ++i, p += DV) s[i] = *p;
            }
        }
        float qn = 0.f, kn = 0.f;
#pragma unroll
        for (int m = 0; m < NQ; ++m) {  // the general kernel's order: i = threadIdx.x + m * blockDim.x
            qn += cur.q[m] * cur.q[m];
            kn += cur.k[m] * cur.k[m];
        }
        float norms[2] = {qn, kn};
        block_sums(norms);
        const float qf = q_scale / fmaxf(sqrtf(norms[0]), eps), kf = 1.0f / fmaxf(sqrtf(norms[1]), eps);
#pragma unroll
        for (int m = 0; m < NQ; ++m) {
            const int i = threadIdx.x + m * blockDim.x;
            if (i < DK) {
                sq[i] = cur.q[m] * qf;
                sk[i] = cur.k[m] * kf;
            }
        }
        __syncthreads();
        const float *kp = sk + part * R, *qp = sq + part * R;
        const float beta = sigmoid(cur.b);
        const float decay = expf(ssm_a[j] * softplus(cur.a + dt_bias[j]));
        static_assert(R % ACC_CHAINS == 0, "whole chains");
        float kvp[ACC_CHAINS] = {};
#pragma unroll
        for (int i = 0; i < R; ++i) {
            s[i] = s[i] * decay;
            kvp[i % ACC_CHAINS] += s[i] * kp[i];
        }
        const float kv = column_sum<SPLIT>(chains_sum(kvp));
        const float delta = beta * (cur.v - kv);
        float op[ACC_CHAINS] = {};
#pragma unroll
        for (int i = 0; i < R; ++i) {
            s[i] = s[i] + kp[i] * delta;
            op[i % ACC_CHAINS] += s[i] * qp[i];
        }
        const float o = column_sum<SPLIT>(chains_sum(op));
        if (active) {
            if constexpr (HIST) {
                float *hist = state_history + (int64_t(t) * HV + j) * DK * DV + int64_t(part) * R * DV + c;
#pragma unroll
                for (int i = 0; i < R; ++i, hist += DV) *hist = s[i];
            }
            if (part == 0) out[(int64_t(t) * HV + j) * DV + c] = o;
        }
        __syncthreads();  // sq/sk are rewritten by the next token
        cur = next;
    }
    if (active && !parent) {
        float *p = S;
#pragma unroll
        for (int i = 0; i < R; ++i, p += DV) *p = s[i];
    }
}

template <int DK, bool HIST, bool EARLY, int FIXED_DV = 0>
__global__ void __launch_bounds__(64) gated_delta_net_reg_kernel(
        const float *conv, const float *b, const float *a, const float *ssm_a, const float *dt_bias, int HK, int HV,
        int dv, float eps, int T, float *state, float *out, float *state_history, const int32_t *parent) {
    delta_rule_columns<DK, HIST, EARLY, FIXED_DV>(conv, b, a, ssm_a, dt_bias, HK, HV, dv, eps, T, state, out,
                                                  state_history, parent);
}

// A batched step's sequences side by side (grid z), each block as the kernel above on its own
// sequence's rows and state: the same bits per sequence, one launch instead of one per sequence
// (a 5-9 us launch each, 48 layers x 32 sequences per decode step of a 27B).
template <int DK, bool HIST, bool EARLY, int FIXED_DV = 0>
__global__ void __launch_bounds__(64) gated_delta_net_seqs_kernel(
        const float *conv, const float *b, const float *a, const float *ssm_a, const float *dt_bias, int HK, int HV,
        int dv, float eps, float *out, SeqTable seqs) {
    const int z = blockIdx.z, DV = FIXED_DV ? FIXED_DV : dv;
    const int64_t r0 = seqs.row0[z], CD = 2 * int64_t(HK) * DK + int64_t(HV) * DV;
    delta_rule_columns<DK, HIST, EARLY, FIXED_DV>(conv + r0 * CD, b + r0 * HV, a + r0 * HV, ssm_a, dt_bias, HK, HV,
                                                  dv, eps, seqs.T[z], seqs.ssm[z], out + r0 * HV * DV,
                                                  seqs.history[z], nullptr);
}

// Prompt-prefill variant: steps wider than MAX_STEP (prompt chunks; never history or tree). The
// register kernel runs 384 one-warp blocks on a 27B, under one warp per SM scheduler, and each
// token is two 64-long chains of dependent fp32 operations fed by single-word shared-memory loads
// (ncu, 256 tokens: an instruction every 3.6 cycles, 38% of the stalls on fixed-latency
// dependencies; 310-341 us a layer). Here a state column is split over SPLIT lanes (8 for DK >=
// 32: 16 rows each), so a block of PREFILL_WARPS warps holds 16 columns and a 27B layer runs 1536
// warps; the chains are 16 long, in two accumulators, and q and k come four at a time. Tokens go
// in chunks of PREFILL_CHUNK: the warps share the normalisation of the chunk's q and k (warp w
// takes tokens w, w + PREFILL_WARPS), the next chunk's inputs are loaded while this one runs, and
// token u's output sum shares a pass over the column with token u + 1's kv sum (143.6 us per 256
// tokens, H200, 2026-12-04). A unified kernel of this design for every step, history and tree
// mode included, measured slower at decode and verify widths (H200, 2026-12-04): the
// history rows it writes are 16-byte pieces per lane group, not the register kernel's 64 bytes.
//
// The fp32 sums are ordered differently from the register kernel's (rows in 8 parts, two
// accumulators each): prompt prefill is not bit-identical to decode steps over the same tokens,
// as with any batched prefill, and gpu_check holds it to the float64 reference's tolerance. Steps
// of up to MAX_STEP tokens (decode, verify and tree steps, whose bits speculative exactness rests
// on, and the benches' stand-ins for them) never take it, as for the prefill attention.
constexpr int PREFILL_CHUNK = 8;
constexpr int PREFILL_WARPS = 4;
constexpr int PREFILL_TOKENS_PER_WARP = PREFILL_CHUNK / PREFILL_WARPS;

template <int DK>
__host__ __device__ constexpr int prefill_split() { return DK >= 32 ? 8 : DK / 4; }  // rows per lane: a multiple of 4

// acc0 / acc1 += s[i] * k[i] over the lane's rows, even / odd; s[i] first scaled by decay.
template <int R>
__device__ __forceinline__ float decay_dot(float (&s)[R], const float *k, float decay) {
    const float4 *k4 = reinterpret_cast<const float4 *>(k);
    float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
    for (int i = 0; i < R / 4; ++i) {
        const float4 kk = k4[i];
        s[4 * i] *= decay;
        acc0 += s[4 * i] * kk.x;
        s[4 * i + 1] *= decay;
        acc1 += s[4 * i + 1] * kk.y;
        s[4 * i + 2] *= decay;
        acc0 += s[4 * i + 2] * kk.z;
        s[4 * i + 3] *= decay;
        acc1 += s[4 * i + 3] * kk.w;
    }
    return acc0 + acc1;
}

// The chunk's raw inputs a lane loads: for warp w, q and k of tokens w + PREFILL_WARPS * m
// (values lane + LUCE_WARP * i), its column's v of every token, and (lanes below the chunk's
// length) b and a of token lane.
template <int DK>
struct PrefillInputs {
    static constexpr int NQ = (DK + 31) / 32;
    float q[PREFILL_TOKENS_PER_WARP][NQ], k[PREFILL_TOKENS_PER_WARP][NQ], v[PREFILL_CHUNK], b, a;
};

template <int DK>
__global__ void __launch_bounds__(PREFILL_WARPS * 64) gated_delta_net_prefill_kernel(
        const float *conv, const float *b, const float *a, const float *ssm_a, const float *dt_bias, int HK, int HV,
        int DV, float eps, int T, float *state, float *out) {
    wait_for_inputs();
    constexpr int SPLIT = prefill_split<DK>(), R = DK / SPLIT, NQ = PrefillInputs<DK>::NQ;
    // Part p's rows at p * (R + 4): a quarter-warp's eight parts hit eight distinct groups of banks.
    constexpr int LINE = DK + 4 * SPLIT;
    __shared__ __align__(16) float sq[PREFILL_CHUNK][LINE], sk[PREFILL_CHUNK][LINE];
    __shared__ float sdecay[PREFILL_CHUNK], sbeta[PREFILL_CHUNK];
    const int lane = threadIdx.x % LUCE_WARP, warp = threadIdx.x / LUCE_WARP;
    const int j = blockIdx.x, kh = j % HK;  // tiled GGUF order (spec §3.4 item 5)
    const int part = threadIdx.x % SPLIT;
    const int c = blockIdx.y * (blockDim.x / SPLIT) + threadIdx.x / SPLIT;
    const bool active = c < DV;
    const int64_t CD = 2 * int64_t(HK) * DK + int64_t(HV) * DV;
    const float q_scale = 1.0f / sqrtf(float(DK)), ssa = ssm_a[j], dtb = dt_bias[j];
    float *S = state + int64_t(j) * DK * DV + int64_t(part) * R * DV + c;
    float s[R];
    if (active) {
        const float *p = S;
#pragma unroll
        for (int i = 0; i < R; ++i, p += DV) s[i] = *p;
    }
    auto load = [&](int t0, PrefillInputs<DK> &in) {
        const int n = min(PREFILL_CHUNK, T - t0);
#pragma unroll
        for (int m = 0; m < PREFILL_TOKENS_PER_WARP; ++m) {
            const int u = warp + PREFILL_WARPS * m;
            const float *row = conv + int64_t(t0 + u) * CD;
#pragma unroll
            for (int i = 0; i < NQ; ++i) {
                const int d = lane + i * LUCE_WARP;
                in.q[m][i] = u < n && d < DK ? row[int64_t(kh) * DK + d] : 0.f;
                in.k[m][i] = u < n && d < DK ? row[int64_t(HK + kh) * DK + d] : 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < PREFILL_CHUNK; ++u)
            in.v[u] = u < n && active ? conv[int64_t(t0 + u) * CD + 2 * int64_t(HK) * DK + int64_t(j) * DV + c] : 0.f;
        in.b = threadIdx.x < n ? b[int64_t(t0 + threadIdx.x) * HV + j] : 0.f;
        in.a = threadIdx.x < n ? a[int64_t(t0 + threadIdx.x) * HV + j] : 0.f;
    };
    PrefillInputs<DK> in;
    load(0, in);
    for (int t0 = 0; t0 < T; t0 += PREFILL_CHUNK) {
        const int n = min(PREFILL_CHUNK, T - t0);
#pragma unroll
        for (int m = 0; m < PREFILL_TOKENS_PER_WARP; ++m) {
            const int u = warp + PREFILL_WARPS * m;
            float qn = 0.f, kn = 0.f;
#pragma unroll
            for (int i = 0; i < NQ; ++i) {
                qn += in.q[m][i] * in.q[m][i];
                kn += in.k[m][i] * in.k[m][i];
            }
            qn = warp_sum(qn);
            kn = warp_sum(kn);
            // L2 norm with llama.cpp's clamp x / max(||x||, eps); q also scaled by 1/sqrt(DK).
            const float qf = q_scale / fmaxf(sqrtf(qn), eps), kf = 1.0f / fmaxf(sqrtf(kn), eps);
#pragma unroll
            for (int i = 0; i < NQ; ++i) {
                const int d = lane + i * LUCE_WARP;
                if (d < DK) {
                    sq[u][d + d / R * 4] = in.q[m][i] * qf;
                    sk[u][d + d / R * 4] = in.k[m][i] * kf;
                }
            }
        }
        if (threadIdx.x < n) {
            sbeta[threadIdx.x] = sigmoid(in.b);
            sdecay[threadIdx.x] = expf(ssa * softplus(in.a + dtb));
        }
        float v[PREFILL_CHUNK];
#pragma unroll
        for (int u = 0; u < PREFILL_CHUNK; ++u) v[u] = in.v[u];
        __syncthreads();
        if (t0 + PREFILL_CHUNK < T) load(t0 + PREFILL_CHUNK, in);  // in flight during the recurrence
        const int row0 = part * (R + 4);
        float kv = decay_dot<R>(s, sk[0] + row0, sdecay[0]);
#pragma unroll
        for (int u = 0; u < PREFILL_CHUNK; ++u) {
            if (u >= n) break;
            const float delta = sbeta[u] * (v[u] - column_sum<SPLIT>(kv));
            const float4 *k4 = reinterpret_cast<const float4 *>(sk[u] + row0);
            const float4 *q4 = reinterpret_cast<const float4 *>(sq[u] + row0);
            float o0 = 0.f, o1 = 0.f;
#pragma unroll
            for (int i = 0; i < R / 4; ++i) {
                const float4 kk = k4[i], qq = q4[i];
                s[4 * i] += kk.x * delta;
                o0 += s[4 * i] * qq.x;
                s[4 * i + 1] += kk.y * delta;
                o1 += s[4 * i + 1] * qq.y;
                s[4 * i + 2] += kk.z * delta;
                o0 += s[4 * i + 2] * qq.z;
                s[4 * i + 3] += kk.w * delta;
                o1 += s[4 * i + 3] * qq.w;
            }
            // Token u + 1's decay and kv sum: independent of o's sum, which the lanes finish meanwhile.
            if (u + 1 < n) kv = decay_dot<R>(s, sk[u + 1] + row0, sdecay[u + 1]);
            const float o = column_sum<SPLIT>(o0 + o1);
            if (active && part == 0) out[(int64_t(t0 + u) * HV + j) * DV + c] = o;
        }
        __syncthreads();  // the next chunk rewrites sq, sk, sdecay, sbeta
    }
    if (active) {
        float *p = S;
#pragma unroll
        for (int i = 0; i < R; ++i, p += DV) *p = s[i];
    }
}

template <int DK>
void launch_reg(cudaStream_t stream, int warp, const float *conv, const float *b, const float *a,
                const float *ssm_a, const float *dt_bias, const DeltaNetDims &dm, int T, float *state, float *out,
                float *state_history, const int32_t *parent, bool early_state) {
    // One warp per block: 48 heads x 128 columns (two lanes each) make 384 blocks on a 27B.
    const int threads = std::min(warp, 64), columns = threads / (DK >= 32 ? 2 : 1);
    const dim3 grid(unsigned(dm.hv), unsigned((dm.dv + columns - 1) / columns));
    if (!state_history && !parent && T > MAX_STEP) {
        const int block = PREFILL_WARPS * warp, block_columns = block / prefill_split<DK>();
        const dim3 prefill_grid(unsigned(dm.hv), unsigned((dm.dv + block_columns - 1) / block_columns));
        launch_kernel(gated_delta_net_prefill_kernel<DK>, prefill_grid, block, 0, stream, conv, b, a, ssm_a, dt_bias,
                      dm.hk, dm.hv, dm.dv, dm.eps, T, state, out);
    } else {
        auto run = [&](auto kernel, const int32_t *tree_parent) {
            launch_kernel(kernel, grid, threads, 0, stream, conv, b, a, ssm_a, dt_bias, dm.hk, dm.hv, dm.dv, dm.eps, T,
                          state, out, state_history, tree_parent);
        };
        // The value head size as a constant where it is the 27B's (and every Qwen3.5's): 128.
        auto with_dv = [&](auto fixed_dv) {
            constexpr int FIXED_DV = decltype(fixed_dv)::value;
            if (state_history)
                early_state ? run(gated_delta_net_reg_kernel<DK, true, true, FIXED_DV>, parent)
                            : run(gated_delta_net_reg_kernel<DK, true, false, FIXED_DV>, parent);
            else
                early_state ? run(gated_delta_net_reg_kernel<DK, false, true, FIXED_DV>, nullptr)
                            : run(gated_delta_net_reg_kernel<DK, false, false, FIXED_DV>, nullptr);
        };
        if (DK == 128 && dm.dv == 128) with_dv(std::integral_constant<int, 128>{});
        else with_dv(std::integral_constant<int, 0>{});
    }
}

// The register kernel over the sequences of one table (all with a history or none), as
// launch_reg launches it for one.
template <int DK>
void launch_reg_seqs(cudaStream_t stream, int warp, const float *conv, const float *b, const float *a,
                     const float *ssm_a, const float *dt_bias, const DeltaNetDims &dm, const SeqTable &seqs, int n,
                     bool history, float *out, bool early_state) {
    const int threads = std::min(warp, 64), columns = threads / (DK >= 32 ? 2 : 1);
    const dim3 grid(unsigned(dm.hv), unsigned((dm.dv + columns - 1) / columns), unsigned(n));
    auto run = [&](auto kernel) {
        launch_kernel(kernel, grid, threads, 0, stream, conv, b, a, ssm_a, dt_bias, dm.hk, dm.hv, dm.dv, dm.eps, out,
                      seqs);
    };
    auto with_dv = [&](auto fixed_dv) {
        constexpr int FIXED_DV = decltype(fixed_dv)::value;
        if (history)
            early_state ? run(gated_delta_net_seqs_kernel<DK, true, true, FIXED_DV>)
                        : run(gated_delta_net_seqs_kernel<DK, true, false, FIXED_DV>);
        else
            early_state ? run(gated_delta_net_seqs_kernel<DK, false, true, FIXED_DV>)
                        : run(gated_delta_net_seqs_kernel<DK, false, false, FIXED_DV>);
    };
    if (DK == 128 && dm.dv == 128) with_dv(std::integral_constant<int, 128>{});
    else with_dv(std::integral_constant<int, 0>{});
}

// ---- launchers ---------------------------------------------------------------------------------

// conv_silu: a verify step's tokens side by side (one thread per channel walked them in turn:
// ~22 us for 16 tokens of a 27B layer on an H200, 2026-12-03), and a prompt chunk's in blocks of
// CONV_BLOCK_TOKENS (one block per 32 channels walked 256 tokens in 31.5 us, 2026-12-04).
constexpr int CONV_CHANNELS = 32, CONV_TOKEN_LANES = 8;
constexpr int DELTA_COLUMNS = 64;  // state columns per block: a multiple of both warp sizes

}  // namespace

void conv_silu(cudaStream_t stream, const float *x, float *state, const float *w, int T, int C, int Kc,
               float *out, const int32_t *parent) {
    if (T < 1 || C < 1) return;
    if (Kc - 1 > CONV_BLOCK_TOKENS) fail(LUCE_ERR_UNSUPPORTED, "GPU conv: kernel size %d", Kc);
    const dim3 block(CONV_CHANNELS, unsigned(std::min(T, CONV_TOKEN_LANES)));
    const dim3 grid(unsigned((C + CONV_CHANNELS - 1) / CONV_CHANNELS),
                    unsigned((T + CONV_BLOCK_TOKENS - 1) / CONV_BLOCK_TOKENS));
    launch_kernel(conv_silu_kernel, grid, block, 0, stream, x, state, w, T, C, Kc, out, parent);
}

void gated_delta_net(cudaStream_t stream, int warp, const float *conv, const float *b, const float *a,
                     const float *ssm_a, const float *dt_bias, const DeltaNetDims &dm, int T,
                     float *state, float *out, float *state_history, DeltaKernel kernel, const int32_t *parent) {
    if (T < 1) return;
    if (parent && !state_history) fail(LUCE_ERR_INTERNAL, "tree-mode delta rule needs the state history");
    const size_t shared = 2 * sizeof(float) * size_t(dm.dk);
    if (shared > 48 * 1024) fail(LUCE_ERR_UNSUPPORTED, "GPU DeltaNet: state dim %d is too large", dm.dk);
    if (kernel != DeltaKernel::memory && (dm.dk == 16 || dm.dk == 32 || dm.dk == 64 || dm.dk == 128)) {
        auto launch = dm.dk == 16 ? launch_reg<16> : dm.dk == 32 ? launch_reg<32> : dm.dk == 64 ? launch_reg<64>
                                                                                                 : launch_reg<128>;
        launch(stream, warp, conv, b, a, ssm_a, dt_bias, dm, T, state, out, state_history, parent,
               kernel == DeltaKernel::registers_early);
    } else {
        const int threads = std::max(DELTA_COLUMNS, warp);
        const dim3 grid(unsigned(dm.hv), unsigned((dm.dv + threads - 1) / threads));
        launch_kernel(gated_delta_net_kernel, grid, threads, shared, stream, conv, b, a, ssm_a, dt_bias, dm.hk, dm.hv,
                      dm.dk, dm.dv, dm.eps, T, state, out, state_history, parent);
    }
}

static int max_tokens(const RecurrentRows *seqs, int n) {
    int max_T = 0;
    for (int i = 0; i < n; ++i) max_T = std::max(max_T, seqs[i].T);
    return max_T;
}

bool deltanet_sequences_batch(int Kc, const DeltaNetDims &dm, const RecurrentRows *seqs, int n, DeltaKernel kernel) {
    return n > 1 && n <= MAX_STEP && kernel != DeltaKernel::memory && Kc - 1 <= CONV_BLOCK_TOKENS &&
           (dm.dk == 16 || dm.dk == 32 || dm.dk == 64 || dm.dk == 128) && max_tokens(seqs, n) <= MAX_STEP;
}

void deltanet_sequences(cudaStream_t stream, int warp, const float *qkv, const float *conv_w, int C, int Kc,
                        float *conv_out, const float *b, const float *a, const float *ssm_a, const float *dt_bias,
                        const DeltaNetDims &dm, const RecurrentRows *seqs, int n, float *out, DeltaKernel kernel) {
    if (!deltanet_sequences_batch(Kc, dm, seqs, n, kernel))
        fail(LUCE_ERR_INTERNAL, "deltanet_sequences: %d sequences the batched kernels do not take", n);
    const int max_T = max_tokens(seqs, n);
    // Two tables: the sequences with a state history (speculative steps) and those without.
    SeqTable tables[2];
    int counts[2] = {0, 0};
    for (int i = 0; i < n; ++i) {
        const int h = seqs[i].ssm_history != nullptr, k = counts[h]++;
        tables[h].row0[k] = seqs[i].row0, tables[h].T[k] = seqs[i].T;
        tables[h].conv_state[k] = seqs[i].conv_state, tables[h].ssm[k] = seqs[i].ssm;
        tables[h].history[k] = seqs[i].ssm_history;
    }
    for (int h = 0; h < 2; ++h) {
        if (counts[h] == 0) continue;
        const dim3 block(CONV_CHANNELS, unsigned(std::min(max_T, CONV_TOKEN_LANES)));
        const dim3 grid(unsigned((C + CONV_CHANNELS - 1) / CONV_CHANNELS),
                        unsigned((max_T + CONV_BLOCK_TOKENS - 1) / CONV_BLOCK_TOKENS), unsigned(counts[h]));
        launch_kernel(conv_silu_seqs_kernel, grid, block, 0, stream, qkv, conv_w, C, Kc, conv_out, tables[h]);
        auto launch = dm.dk == 16   ? launch_reg_seqs<16>
                      : dm.dk == 32 ? launch_reg_seqs<32>
                      : dm.dk == 64 ? launch_reg_seqs<64>
                                    : launch_reg_seqs<128>;
        launch(stream, warp, conv_out, b, a, ssm_a, dt_bias, dm, tables[h], counts[h], h == 1, out,
               kernel == DeltaKernel::registers_early);
    }
}

}  // namespace luce::gpu
