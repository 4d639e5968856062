// matmul_gemm.cu — y = W x for quantized W with int8 activations on the tensor cores, for the
// chunks of a prompt's prefill (Backend::set_prefill): 128-row x 64-token tiles, each warp owning
// 32 rows x 32 tokens over the whole row.
//
// Why: the other int8 kernels keep the summation contract of int8_units.cuh (one fp32 sum per
// slot of eight per output, in a fixed order) so a verify row is bit-identical to the decode step
// of its token; that puts eight partial sums of every output in registers, which keeps their
// tiles small (32 rows x 64 tokens at most, ~3% of the int8 tensor-core peak at prefill widths on
// an H200). Prefill rows are never compared bitwise with one-token steps (speculative decoding
// verifies after the prompt, with the contract kernels), only with the CPU within the fast
// path's tolerance, so here each 256-element group is summed in int32 first:
//   isum = sum over the group's sub-blocks j of sc_j * dot_j     (exact: |isum| < 2^31)
//   acc += (d * dx) * float(isum)                                (one rounding per group)
// which takes an integer multiply-add per sub-block and output instead of an fp32 scale step.
// IQ4_XS: eight 32-element sub-blocks (one m16n8k32 each); Q6_K: sixteen of 16 elements (two
// m16n8k16 per unit), its weights staged as q - 32 so no activation sums are needed; Q4_K and
// Q5_K: eight, plus their mins against the activations' unit sums in a second integer sum,
//   acc += (d * dx) * float(isum) - (dmin * dx) * float(sum_j m_j xsum_j);
// Q8_0 has an f16 scale per 32 values on both sides (its activations are quantized in blocks of
// 32), so each unit's product is scaled in fp32: acc += (d_j * dx_j) * float(dot_j); so do Q4_0,
// Q5_0 and IQ4_NL, whose weights are staged as signed values (Q4_0 / Q5_0: q - 8 / q - 16);
// Q4_1 / Q5_1 add their block's min against the activations' unit sum:
//   acc += (d_j * dx_j) * float(dot_j) + (m_j * dx_j) * float(xsum_j).
// Deterministic: a fixed order, no atomics; a token's outputs do not depend on its tile or on T.
//
// Split K: a tile's groups are cut into `splits` runs of whole groups (blockIdx.z), each written
// to a scratch slice, and a second kernel adds the slices in order (deterministic): the 27B's
// 5120-row matrices make 40 tiles, a third of an H200's SMs, and 17408 rows make 136 on its 132
// SMs, whose second round runs 4 tiles (ncu: 1.03 waves, busiest SM 48% above the mean).
//
// Pipeline: per group the block stages its 128 rows' eight units (decoded to int8 as the other
// kernels decode them, sub-scales as bytes, the block scale) and its 64 tokens' 256 activations
// and scale in shared memory; the next group's loads are in flight in registers meanwhile.
// IQ4_XS, Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL.
#include <algorithm>

#include "kernels.h"
#include "mma_int8.cuh"

namespace luce::gpu {

#if !defined(LUCE_HIP)

namespace {

using namespace int8_units;
using namespace mma_int8;

constexpr int GEMM_ROWS = 128, GEMM_TOKS = 64, GEMM_THREADS = 256;  // 8 warps: 4 (rows) x 2 (tokens)
constexpr int WARP_ROWS = 32, WARP_TOKS = 32;
constexpr int MT = WARP_ROWS / 16, NT = WARP_TOKS / MMA_NTILE;  // a warp's m16 and n8 tiles
constexpr int GROUP = SLOTS * 32;                               // values per group: one act block
// A row's (or a token's) 256 int8 values are 64 words; 4 words of padding put the fragment reads
// of a warp (row g, word tq) on banks 4 g + tq (+ 8 u): all different.
constexpr int LINE_WORDS = GROUP / 4 + 4;

// What a type needs beside its int8 weights, per group: the 32-element types have a scale per
// 32-value block on both sides (their activations are quantized in blocks of 32), the others one d per row and one
// activation scale per token; Q4_K / Q5_K also a min per sub-block, applied to the activations'
// sums (d sc (q . x) - dmin m (sum x)).
template <int TYPE>
struct GemmType {
    static constexpr bool per_unit_scales = is_block32_type(TYPE);
    // Unsigned codes staged less their zero point (bytewise), so no activation sums are needed.
    static constexpr uint32_t zero4 = TYPE == GGML_Q6_K ? 0x20202020u : TYPE == GGML_Q4_0 ? 0x08080808u
                                    : TYPE == GGML_Q5_0 ? 0x10101010u : 0u;
    static constexpr bool has_min = TYPE == GGML_Q4_K || TYPE == GGML_Q5_K;
    static constexpr bool unit_min = TYPE == GGML_Q4_1 || TYPE == GGML_Q5_1;  // m per 32-value block
    static constexpr bool unit_sums = has_min || unit_min;  // the activations' sum per unit staged
    static constexpr int mins = unit_min ? SLOTS : has_min ? 1 : 0;  // per row
    static constexpr int scales = per_unit_scales ? SLOTS : 1;  // d per row / dx per token
};

// Shared memory of one group, offsets in 32-bit words.
template <int TYPE>
struct GemmSmem {
    using G = GemmType<TYPE>;
    static constexpr int w = 0;                               // [GEMM_ROWS][LINE_WORDS] int8 weights
    static constexpr int x = w + GEMM_ROWS * LINE_WORDS;      // [GEMM_TOKS][LINE_WORDS] int8 activations
    static constexpr int sc = x + GEMM_TOKS * LINE_WORDS;     // [GEMM_ROWS][4]: up to 16 int8 sub-scales
    static constexpr int d = sc + GEMM_ROWS * 4;              // [GEMM_ROWS][scales] the block scale(s)
    static constexpr int dmin = d + GEMM_ROWS * G::scales;    // [GEMM_ROWS] Q4_K / Q5_K: the block's dmin
    static constexpr int dx = dmin + GEMM_ROWS * G::mins;  // [GEMM_TOKS][scales] activation scale(s)
    static constexpr int xs = dx + GEMM_TOKS * G::scales;     // [GEMM_TOKS][SLOTS] Q4_K / Q5_K: unit sums
    static constexpr int words = xs + (G::unit_sums ? GEMM_TOKS * SLOTS : 0);
    static constexpr size_t bytes = size_t(words) * 4;
};

// One group's global loads, per thread: (row, unit) weight entries e = tid + i * GEMM_THREADS of
// the tile's rows x 8 units (eight consecutive threads read one row's block: coalesced), (token,
// 16-byte chunk) activation entries likewise, the scales of token tid / DX_THREADS, and for the
// K types four 16-sums of token tid / 4.
template <int TYPE>
struct GemmLoads {
    static constexpr int w_entries = GEMM_ROWS * SLOTS / GEMM_THREADS;
    static constexpr int x_entries = GEMM_TOKS * (GROUP / 16) / GEMM_THREADS;
    static constexpr int dx_entries = (GEMM_TOKS * GemmType<TYPE>::scales + GEMM_THREADS - 1) / GEMM_THREADS;
    RawUnit<TYPE> w[w_entries];
    int4 x[x_entries];
    float dx[dx_entries];
    uint2 xs;
};

// Where this thread's weight entries live: the rows' bytes, or null past n_out (zero units).
template <int TYPE>
struct GemmRows {
    const uint8_t *row[GemmLoads<TYPE>::w_entries];
};

template <int TYPE>
__device__ __forceinline__ void fetch_weights(const GemmRows<TYPE> &wr, int k, GemmLoads<TYPE> &f) {
#pragma unroll
    for (int i = 0; i < f.w_entries; ++i)
        if (wr.row[i]) fetch_unit<TYPE>(wr.row[i], SLOTS * k + threadIdx.x % SLOTS, f.w[i]);
}

// Activation scale entry e of the tile: token e / scales, its block e % scales of group k.
template <int TYPE>
__device__ __forceinline__ float fetch_dx(const MmaArgs &p, int t0, int k, int e) {
    constexpr int S = GemmType<TYPE>::scales;
    const int tok = t0 + e / S;
    return e < GEMM_TOKS * S && tok < p.T ? p.xd[int64_t(tok) * (p.n_in / (GROUP / S)) + S * k + e % S] : 0.f;
}

template <int TYPE>
__device__ __forceinline__ void fetch_acts(const MmaArgs &p, int t0, int k, GemmLoads<TYPE> &f) {
#pragma unroll
    for (int i = 0; i < f.x_entries; ++i) {
        const int e = threadIdx.x + i * GEMM_THREADS, tok = t0 + e / (GROUP / 16), chunk = e % (GROUP / 16);
        f.x[i] = tok < p.T ? *reinterpret_cast<const int4 *>(p.xq + int64_t(tok) * p.n_in + GROUP * k + 16 * chunk)
                           : int4{0, 0, 0, 0};
    }
#pragma unroll
    for (int i = 0; i < f.dx_entries; ++i) f.dx[i] = fetch_dx<TYPE>(p, t0, k, threadIdx.x + i * GEMM_THREADS);
    if constexpr (GemmType<TYPE>::unit_sums) {  // 16-sums 4q .. 4q + 3 of token tid / 4, q = tid % 4
        const int tok = t0 + int(threadIdx.x) / 4;
        f.xs = tok < p.T ? *reinterpret_cast<const uint2 *>(p.xs + int64_t(tok) * (p.n_in / 16) + 16 * k +
                                                            4 * (threadIdx.x % 4))
                         : uint2{0, 0};
    }
}

template <int TYPE>
__device__ __forceinline__ void stage_group(const GemmRows<TYPE> &wr, const GemmLoads<TYPE> &f, int k,
                                            const Codebook &cb, uint32_t *smem) {
    using G = GemmType<TYPE>;
    using S = GemmSmem<TYPE>;
#pragma unroll
    for (int i = 0; i < f.w_entries; ++i) {
        const int e = threadIdx.x + i * GEMM_THREADS, row = e / SLOTS, u = e % SLOTS;
        Unit un{};
        if (wr.row[i]) {
            decode_unit<TYPE>(f.w[i], SLOTS * k + u, cb, un);
            if constexpr (G::zero4 != 0) {  // q -> q - zero, bytewise
#pragma unroll
                for (int w = 0; w < 8; ++w) un.q[w] = __vsub4(un.q[w], G::zero4);
            }
        }
        uint4 *dst = reinterpret_cast<uint4 *>(smem + S::w + row * LINE_WORDS + 8 * u);
        dst[0] = uint4{un.q[0], un.q[1], un.q[2], un.q[3]};
        dst[1] = uint4{un.q[4], un.q[5], un.q[6], un.q[7]};
        int8_t *sc = reinterpret_cast<int8_t *>(smem + S::sc) + 16 * row;
        if constexpr (TYPE == GGML_Q6_K) {
            sc[2 * u] = int8_t(un.s.sc0), sc[2 * u + 1] = int8_t(un.s.sc1);
        } else if constexpr (G::has_min) {  // scale and min: 0..63
            sc[u] = int8_t(un.s.sc0), sc[SLOTS + u] = int8_t(un.s.sc1);
        } else {
            sc[u] = int8_t(un.s.sc0);
        }
        if constexpr (G::per_unit_scales) smem[S::d + SLOTS * row + u] = __float_as_uint(un.s.d);
        else if (u == 0) smem[S::d + row] = __float_as_uint(un.s.d);
        if constexpr (G::has_min)
            if (u == 0) smem[S::dmin + row] = __float_as_uint(un.s.dmin);
        if constexpr (G::unit_min) smem[S::dmin + SLOTS * row + u] = __float_as_uint(un.s.dmin);
    }
#pragma unroll
    for (int i = 0; i < f.x_entries; ++i) {
        const int e = threadIdx.x + i * GEMM_THREADS, tok = e / (GROUP / 16), chunk = e % (GROUP / 16);
        *reinterpret_cast<int4 *>(smem + S::x + tok * LINE_WORDS + 4 * chunk) = f.x[i];
    }
#pragma unroll
    for (int i = 0; i < f.dx_entries; ++i) {
        const int e = threadIdx.x + i * GEMM_THREADS;
        if (e < GEMM_TOKS * G::scales) smem[S::dx + e] = __float_as_uint(f.dx[i]);
    }
    if constexpr (G::unit_sums) {  // unit j's sum = its two 16-sums
        const int tok = threadIdx.x / 4, q = threadIdx.x % 4;
        const auto half = [](uint32_t w, int h) { return int(int16_t(w >> (16 * h))); };
        smem[S::xs + SLOTS * tok + 2 * q] = uint32_t(half(f.xs.x, 0) + half(f.xs.x, 1));
        smem[S::xs + SLOTS * tok + 2 * q + 1] = uint32_t(half(f.xs.y, 0) + half(f.xs.y, 1));
    }
}

// The group's sub-scales of one row: 8 (IQ4_XS: one per unit), 16 (Q6_K: one per half-unit;
// Q4_K / Q5_K: the units' scales, then their mins).
template <int TYPE>
struct RowScales {
    static constexpr int words = TYPE == GGML_IQ4_XS ? 2 : (GemmType<TYPE>::per_unit_scales ? 0 : 4);
    uint32_t w[words > 0 ? words : 1];
    __device__ __forceinline__ int operator[](int j) const { return int(int8_t(w[j / 4] >> (8 * (j % 4)))); }
};

// The C fragment's coordinates in the warp's tile: row g (c < 2) or g + 8 of m-tile m, token
// 2 tq + c % 2 of n-tile j.
__device__ __forceinline__ int frag_row(int wm, int m, int g, int c) { return WARP_ROWS * wm + 16 * m + g + (c < 2 ? 0 : 8); }
__device__ __forceinline__ int frag_tok(int wn, int j, int tq, int c) { return WARP_TOKS * wn + MMA_NTILE * j + 2 * tq + c % 2; }

// acc += the staged group for the warp's 32 rows (wm) x 32 tokens (wn).
//   IQ4_XS, Q6_K:  acc += d dx isum,                    isum = sum_j sc_j dot_j
//   Q4_K, Q5_K:    acc += d dx isum - dmin dx msum,     msum = sum_j m_j (sum of x over unit j)
//   32-element:    acc += sum_j (d_j dx_j) dot_j        (each 32-value block its own scales)
// Each mma's C fragment is folded in at once (rows g (e < 2) and g + 8, tokens 2 tq + e % 2), so
// only one is live at a time.
template <int TYPE>
__device__ __forceinline__ void multiply_group(const uint32_t *smem, int wm, int wn, int g, int tq,
                                               float (&acc)[MT][NT][4]) {
    using G = GemmType<TYPE>;
    using S = GemmSmem<TYPE>;
    RowScales<TYPE> sc[MT][2];  // of the lane's rows g and g + 8 of each m-tile
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t *src = smem + S::sc + 4 * (WARP_ROWS * wm + 16 * m + g + 8 * h);
#pragma unroll
            for (int w = 0; w < RowScales<TYPE>::words; ++w) sc[m][h].w[w] = src[w];
        }
    const float *d = reinterpret_cast<const float *>(smem + S::d);
    const float *dx = reinterpret_cast<const float *>(smem + S::dx);
    int isum[MT][NT][4] = {};
#pragma unroll
    for (int u = 0; u < SLOTS; ++u) {
        uint32_t a[MT][4];
        float du[MT][2], mu[MT][2];  // 32-element types: this unit's scale (and min) of the lane's rows
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const uint32_t *ra = smem + S::w + (WARP_ROWS * wm + 16 * m + g) * LINE_WORDS + 8 * u;
            const uint32_t *rb = ra + 8 * LINE_WORDS;
            a[m][0] = ra[tq], a[m][1] = rb[tq], a[m][2] = ra[tq + 4], a[m][3] = rb[tq + 4];
            if constexpr (G::per_unit_scales)
                for (int h = 0; h < 2; ++h) du[m][h] = d[SLOTS * frag_row(wm, m, g, 2 * h) + u];
            if constexpr (G::unit_min)
                for (int h = 0; h < 2; ++h)
                    mu[m][h] = reinterpret_cast<const float *>(smem + S::dmin)[SLOTS * frag_row(wm, m, g, 2 * h) + u];
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint32_t *xb = smem + S::x + (WARP_TOKS * wn + MMA_NTILE * j + g) * LINE_WORDS + 8 * u;
            const uint32_t b0 = xb[tq], b1 = xb[tq + 4];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                int c[4];
                if constexpr (TYPE == GGML_Q6_K) {  // each 16-element half has its own scale
                    int hi[4];
                    mma_k16(a[m][0], a[m][1], b0, c);
                    mma_k16(a[m][2], a[m][3], b1, hi);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        isum[m][j][e] += sc[m][e / 2][2 * u] * c[e] + sc[m][e / 2][2 * u + 1] * hi[e];
                } else {
                    mma_k32(a[m][0], a[m][1], a[m][2], a[m][3], b0, b1, c);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if constexpr (G::per_unit_scales) {
                            const int tok = frag_tok(wn, j, tq, e);
                            const float s = du[m][e / 2] * dx[SLOTS * tok + u];
                            acc[m][j][e] = fmaf(s, float(c[e]), acc[m][j][e]);
                            if constexpr (G::unit_min) {
                                const int xsum = reinterpret_cast<const int *>(smem + S::xs)[SLOTS * tok + u];
                                acc[m][j][e] = fmaf(mu[m][e / 2] * dx[SLOTS * tok + u], float(xsum), acc[m][j][e]);
                            }
                        } else {
                            isum[m][j][e] += sc[m][e / 2][u] * c[e];
                        }
                    }
                }
            }
        }
    }
    if constexpr (!G::per_unit_scales) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = frag_row(wm, m, g, e), tok = frag_tok(wn, j, tq, e);
                    acc[m][j][e] = fmaf(d[row] * dx[tok], float(isum[m][j][e]), acc[m][j][e]);
                    if constexpr (G::has_min) {
                        const int *xs = reinterpret_cast<const int *>(smem + S::xs) + SLOTS * tok;
                        int msum = 0;
#pragma unroll
                        for (int v = 0; v < SLOTS; ++v) msum += sc[m][e / 2][SLOTS + v] * xs[v];
                        const float dmin = reinterpret_cast<const float *>(smem + S::dmin)[row];
                        acc[m][j][e] = fmaf(-dmin * dx[tok], float(msum), acc[m][j][e]);
                    }
                }
    }
}

// partial == null: y itself; else slice z of the split partials, [splits][T][n_out].
template <int TYPE>
__global__ void __launch_bounds__(GEMM_THREADS) matmul_gemm_kernel(MmaArgs p, float *partial) {
    LUCE_DYNAMIC_SHARED(uint32_t, smem);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp % 4, wn = warp / 4;
    const int g = lane / 4, tq = lane % 4;  // fragment coordinates: groupID, thread in group
    const int64_t r0 = int64_t(blockIdx.x) * GEMM_ROWS;
    const int t0 = blockIdx.y * GEMM_TOKS;
    const int n_all = p.n_in / GROUP, splits = gridDim.z;
    const int k_begin = int(blockIdx.z) * n_all / splits, k_end = (int(blockIdx.z) + 1) * n_all / splits;

    GemmRows<TYPE> wr;
#pragma unroll
    for (int i = 0; i < GemmLoads<TYPE>::w_entries; ++i) {
        const int64_t row = r0 + (threadIdx.x + i * GEMM_THREADS) / SLOTS;
        const int seg = p.rows.find(row);
        wr.row[i] = row < p.rows.n_out() ? p.rows.w[seg] + (row - p.rows.start(seg)) * p.row_bytes : nullptr;
    }
    const Codebook cb = load_codebook();
    GemmLoads<TYPE> f;
    fetch_weights<TYPE>(wr, k_begin, f);
    wait_for_inputs();  // the first weights are on their way while the previous kernel finishes
    fetch_acts<TYPE>(p, t0, k_begin, f);

    float acc[MT][NT][4] = {};
    for (int k = k_begin; k < k_end; ++k) {
        stage_group<TYPE>(wr, f, k, cb, smem);
        __syncthreads();
        if (k + 1 < k_end) {
            fetch_weights<TYPE>(wr, k + 1, f);
            fetch_acts<TYPE>(p, t0, k + 1, f);
        }
        multiply_group<TYPE>(smem, wm, wn, g, tq, acc);
        __syncthreads();  // the next stage overwrites this one
    }
    const int64_t n_out = p.rows.n_out();
    float *slice = partial ? partial + int64_t(blockIdx.z) * p.T * n_out : nullptr;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int64_t row = r0 + frag_row(wm, m, g, c);
                const int tok = t0 + frag_tok(wn, j, tq, c);
                if (!slice) store_output(p, row, tok, acc[m][j][c]);
                else if (row < n_out && tok < p.T) slice[int64_t(tok) * n_out + row] = acc[m][j][c];
            }
}

// y = the split partials added in slice order, one thread per output.
__global__ void gemm_reduce_kernel(MmaArgs p, const float *partial, int splits) {
    wait_for_inputs();
    const int64_t n_out = p.rows.n_out(), i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_out * p.T) return;
    float v = partial[i];
    for (int z = 1; z < splits; ++z) v += partial[int64_t(z) * p.T * n_out + i];
    store_output(p, i % n_out, int(i / n_out), v);
}

template <int TYPE>
void launch_gemm(cudaStream_t stream, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a, int splits,
                 float *partial) {
    // More than 48 KB of shared memory is an opt-in, once per kernel (thread-safe static init).
    static const cudaError_t opt_in = cudaFuncSetAttribute(
        matmul_gemm_kernel<TYPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(GemmSmem<TYPE>::bytes));
    LUCE_GPU_CHECK(opt_in);
    const dim3 grid(unsigned((rows.n_out() + GEMM_ROWS - 1) / GEMM_ROWS), unsigned((T + GEMM_TOKS - 1) / GEMM_TOKS),
                    unsigned(splits));
    const MmaArgs p{rows, quant_row_bytes(TYPE, n_in), int(n_in), a.q, a.d, a.s16, T};
    launch_kernel(matmul_gemm_kernel<TYPE>, grid, GEMM_THREADS, GemmSmem<TYPE>::bytes, stream, p, splits > 1 ? partial : nullptr);
    if (splits > 1) {
        const int64_t n = rows.n_out() * T;
        launch_kernel(gemm_reduce_kernel, unsigned((n + 255) / 256), 256, 0, stream, p, partial, splits);
    }
}

// The tiles one SM runs at a time (registers and shared memory: one block of 8 warps).
constexpr int GEMM_BLOCKS_PER_SM = 1;
constexpr int GEMM_MAX_SPLITS = 8, GEMM_MIN_SPLIT_GROUPS = 4;
constexpr int GEMM_BLOCK_FIXED_GROUPS = 2;  // gemm_splits' price of a block beyond its groups

}  // namespace

// The time of a split count, in group-times: rounds of blocks on the SMs x (groups per block + a
// block's fixed cost of about two groups: its first loads and its output tile). That fits every
// 27B shape at 64 and 256 tokens within ~3% (H200, 2026-12-04: 5120x17408 at 256 tokens, splits
// 1/2/3/4 measured 318.7/245.1/223.1/213.6 us against 140/108/98.7/95; 17408x5120 248.2/248.3/
// 256.7/269.0 against 110/108/112.7/119); the partials' traffic is inside that spread. The
// smallest wins, fewer splits on a tie.
int gemm_splits(int64_t n_out, int64_t n_in, int T, int n_sm, int forced) {
    const int64_t groups = n_in / GROUP;
    if (forced > 0) return int(std::clamp<int64_t>(std::min<int64_t>(forced, groups), 1, GEMM_MAX_SPLITS));
    const int64_t tiles = (n_out + GEMM_ROWS - 1) / GEMM_ROWS * ((T + GEMM_TOKS - 1) / GEMM_TOKS);
    const int64_t slots = int64_t(std::max(1, n_sm)) * GEMM_BLOCKS_PER_SM;
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int s = 1; s <= GEMM_MAX_SPLITS && groups / s >= GEMM_MIN_SPLIT_GROUPS; ++s) {
        const int64_t rounds = (tiles * s + slots - 1) / slots, per_block = (groups + s - 1) / s;
        const int64_t cost = rounds * (per_block + GEMM_BLOCK_FIXED_GROUPS);
        if (cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

bool gemm_serves(int type, int64_t n_in) {
    const bool typed = type == GGML_IQ4_XS || type == GGML_Q6_K || type == GGML_Q4_K || type == GGML_Q5_K ||
                       type == GGML_Q8_0 || is_block32_type(type);
    return typed && n_in % GROUP == 0;
}

void matmul_gemm(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a,
                 int splits, float *partial) {
    if (!gemm_serves(type, n_in) || n_in > INT32_MAX || T < 1 || int64_t(T) * n_in > INT32_MAX || rows.n < 1 ||
        splits < 1 || splits > GEMM_MAX_SPLITS || (splits > 1 && !partial))
        fail(LUCE_ERR_INTERNAL, "matmul_gemm: type %d, n_in %lld, T %d, %d splits", type, (long long)n_in, T, splits);
    switch (type) {
    case GGML_Q6_K: launch_gemm<GGML_Q6_K>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_Q4_K: launch_gemm<GGML_Q4_K>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_Q5_K: launch_gemm<GGML_Q5_K>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_Q8_0: launch_gemm<GGML_Q8_0>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_Q4_0: launch_gemm<GGML_Q4_0>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_Q5_0: launch_gemm<GGML_Q5_0>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_Q4_1: launch_gemm<GGML_Q4_1>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_Q5_1: launch_gemm<GGML_Q5_1>(stream, n_in, rows, T, a, splits, partial); break;
    case GGML_IQ4_NL: launch_gemm<GGML_IQ4_NL>(stream, n_in, rows, T, a, splits, partial); break;
    default: launch_gemm<GGML_IQ4_XS>(stream, n_in, rows, T, a, splits, partial);
    }
}

#else  // HIP keeps the dp4a kernel (matmul_int8.cu)

bool gemm_serves(int, int64_t) { return false; }

int gemm_splits(int64_t, int64_t, int, int, int) { return 1; }

void matmul_gemm(cudaStream_t, int type, int64_t, const RowSegments &, int, const ActScratch &, int, float *) {
    fail(LUCE_ERR_UNSUPPORTED, "matmul_gemm: no tensor-core int8 matmul on HIP (type %d)", type);
}

#endif

}  // namespace luce::gpu
