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
// m16n8k16 per unit), its weights staged as q - 32 so no activation sums are needed.
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
// IQ4_XS and Q6_K (the 27B's body and its ssm_out / attn_v); the staged kernel serves the others.
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

// Shared memory of one group, offsets in 32-bit words.
struct GemmSmem {
    static constexpr int w = 0;                           // [GEMM_ROWS][LINE_WORDS] int8 weights
    static constexpr int x = w + GEMM_ROWS * LINE_WORDS;  // [GEMM_TOKS][LINE_WORDS] int8 activations
    static constexpr int sc = x + GEMM_TOKS * LINE_WORDS; // [GEMM_ROWS][4]: up to 16 int8 sub-scales
    static constexpr int d = sc + GEMM_ROWS * 4;          // [GEMM_ROWS] the block scale
    static constexpr int dx = d + GEMM_ROWS;              // [GEMM_TOKS] the activation block's scale
    static constexpr int words = dx + GEMM_TOKS;
    static constexpr size_t bytes = size_t(words) * 4;
};

// One group's global loads, per thread: (row, unit) weight entries e = tid + i * GEMM_THREADS of
// the tile's rows x 8 units (eight consecutive threads read one row's block: coalesced), (token,
// 16-byte chunk) activation entries likewise, and token tid's scale.
template <int TYPE>
struct GemmLoads {
    static constexpr int w_entries = GEMM_ROWS * SLOTS / GEMM_THREADS;
    static constexpr int x_entries = GEMM_TOKS * (GROUP / 16) / GEMM_THREADS;
    RawUnit<TYPE> w[w_entries];
    int4 x[x_entries];
    float dx;
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

template <int TYPE>
__device__ __forceinline__ void fetch_acts(const MmaArgs &p, int t0, int k, GemmLoads<TYPE> &f) {
#pragma unroll
    for (int i = 0; i < f.x_entries; ++i) {
        const int e = threadIdx.x + i * GEMM_THREADS, tok = t0 + e / (GROUP / 16), chunk = e % (GROUP / 16);
        f.x[i] = tok < p.T ? *reinterpret_cast<const int4 *>(p.xq + int64_t(tok) * p.n_in + GROUP * k + 16 * chunk)
                           : int4{0, 0, 0, 0};
    }
    const int tok = t0 + int(threadIdx.x);
    f.dx = threadIdx.x < GEMM_TOKS && tok < p.T ? p.xd[int64_t(tok) * (p.n_in / GROUP) + k] : 0.f;
}

template <int TYPE>
__device__ __forceinline__ void stage_group(const GemmRows<TYPE> &wr, const GemmLoads<TYPE> &f, int k,
                                            const Codebook &cb, uint32_t *smem) {
#pragma unroll
    for (int i = 0; i < f.w_entries; ++i) {
        const int e = threadIdx.x + i * GEMM_THREADS, row = e / SLOTS, u = e % SLOTS;
        Unit un{};
        if (wr.row[i]) {
            decode_unit<TYPE>(f.w[i], SLOTS * k + u, cb, un);
            if constexpr (TYPE == GGML_Q6_K) {  // q 0..63 -> q - 32, bytewise
#pragma unroll
                for (int w = 0; w < 8; ++w) un.q[w] = __vsub4(un.q[w], 0x20202020u);
            }
        }
        uint4 *dst = reinterpret_cast<uint4 *>(smem + GemmSmem::w + row * LINE_WORDS + 8 * u);
        dst[0] = uint4{un.q[0], un.q[1], un.q[2], un.q[3]};
        dst[1] = uint4{un.q[4], un.q[5], un.q[6], un.q[7]};
        int8_t *sc = reinterpret_cast<int8_t *>(smem + GemmSmem::sc) + 16 * row;
        if constexpr (TYPE == GGML_Q6_K) {
            sc[2 * u] = int8_t(un.s.sc0), sc[2 * u + 1] = int8_t(un.s.sc1);
        } else {
            sc[u] = int8_t(un.s.sc0);
        }
        if (u == 0) smem[GemmSmem::d + row] = __float_as_uint(un.s.d);
    }
#pragma unroll
    for (int i = 0; i < f.x_entries; ++i) {
        const int e = threadIdx.x + i * GEMM_THREADS, tok = e / (GROUP / 16), chunk = e % (GROUP / 16);
        *reinterpret_cast<int4 *>(smem + GemmSmem::x + tok * LINE_WORDS + 4 * chunk) = f.x[i];
    }
    if (threadIdx.x < GEMM_TOKS) smem[GemmSmem::dx + threadIdx.x] = __float_as_uint(f.dx);
}

// The group's sub-scales of one row: 8 (IQ4_XS: one per unit) or 16 (Q6_K: one per half-unit).
template <int TYPE>
struct RowScales {
    static constexpr int words = TYPE == GGML_Q6_K ? 4 : 2;
    uint32_t w[words];
    __device__ __forceinline__ int operator[](int j) const { return int(int8_t(w[j / 4] >> (8 * (j % 4)))); }
};

// acc += the staged group for the warp's 32 rows (wm) x 32 tokens (wn).
template <int TYPE>
__device__ __forceinline__ void multiply_group(const uint32_t *smem, int wm, int wn, int g, int tq,
                                               float (&acc)[MT][NT][4]) {
    RowScales<TYPE> sc[MT][2];  // of the lane's rows g and g + 8 of each m-tile
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t *src = smem + GemmSmem::sc + 4 * (WARP_ROWS * wm + 16 * m + g + 8 * h);
#pragma unroll
            for (int w = 0; w < RowScales<TYPE>::words; ++w) sc[m][h].w[w] = src[w];
        }
    int isum[MT][NT][4] = {};
#pragma unroll
    for (int u = 0; u < SLOTS; ++u) {
        uint32_t a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const uint32_t *ra = smem + GemmSmem::w + (WARP_ROWS * wm + 16 * m + g) * LINE_WORDS + 8 * u;
            const uint32_t *rb = ra + 8 * LINE_WORDS;
            a[m][0] = ra[tq], a[m][1] = rb[tq], a[m][2] = ra[tq + 4], a[m][3] = rb[tq + 4];
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint32_t *xb = smem + GemmSmem::x + (WARP_TOKS * wn + MMA_NTILE * j + g) * LINE_WORDS + 8 * u;
            const uint32_t b0 = xb[tq], b1 = xb[tq + 4];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                int c[4];  // C fragment: rows g (c < 2) and g + 8
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
                    for (int e = 0; e < 4; ++e) isum[m][j][e] += sc[m][e / 2][u] * c[e];
                }
            }
        }
    }
    const float *d = reinterpret_cast<const float *>(smem + GemmSmem::d);
    const float *dx = reinterpret_cast<const float *>(smem + GemmSmem::dx);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float2 dt = *reinterpret_cast<const float2 *>(dx + WARP_TOKS * wn + MMA_NTILE * j + 2 * tq);
#pragma unroll
            for (int c = 0; c < 4; ++c) {  // C fragment: row g (c < 2) or g + 8, token 2 tq + c % 2
                const float dr = d[WARP_ROWS * wm + 16 * m + g + (c < 2 ? 0 : 8)];
                acc[m][j][c] = fmaf(dr * (c % 2 ? dt.y : dt.x), float(isum[m][j][c]), acc[m][j][c]);
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
                const int64_t row = r0 + WARP_ROWS * wm + 16 * m + g + (c < 2 ? 0 : 8);
                const int tok = t0 + WARP_TOKS * wn + MMA_NTILE * j + 2 * tq + c % 2;
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
        matmul_gemm_kernel<TYPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(GemmSmem::bytes));
    LUCE_GPU_CHECK(opt_in);
    const dim3 grid(unsigned((rows.n_out() + GEMM_ROWS - 1) / GEMM_ROWS), unsigned((T + GEMM_TOKS - 1) / GEMM_TOKS),
                    unsigned(splits));
    const MmaArgs p{rows, quant_row_bytes(TYPE, n_in), int(n_in), a.q, a.d, a.s16, T};
    launch_kernel(matmul_gemm_kernel<TYPE>, grid, GEMM_THREADS, GemmSmem::bytes, stream, p, splits > 1 ? partial : nullptr);
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

bool gemm_serves(int type, int64_t n_in) { return (type == GGML_IQ4_XS || type == GGML_Q6_K) && n_in % GROUP == 0; }

void matmul_gemm(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a,
                 int splits, float *partial) {
    if (!gemm_serves(type, n_in) || n_in > INT32_MAX || T < 1 || int64_t(T) * n_in > INT32_MAX || rows.n < 1 ||
        splits < 1 || splits > GEMM_MAX_SPLITS || (splits > 1 && !partial))
        fail(LUCE_ERR_INTERNAL, "matmul_gemm: type %d, n_in %lld, T %d, %d splits", type, (long long)n_in, T, splits);
    if (type == GGML_Q6_K) launch_gemm<GGML_Q6_K>(stream, n_in, rows, T, a, splits, partial);
    else launch_gemm<GGML_IQ4_XS>(stream, n_in, rows, T, a, splits, partial);
}

#else  // HIP keeps the dp4a kernel (matmul_int8.cu)

bool gemm_serves(int, int64_t) { return false; }

int gemm_splits(int64_t, int64_t, int, int, int) { return 1; }

void matmul_gemm(cudaStream_t, int type, int64_t, const RowSegments &, int, const ActScratch &, int, float *) {
    fail(LUCE_ERR_UNSUPPORTED, "matmul_gemm: no tensor-core int8 matmul on HIP (type %d)", type);
}

#endif

}  // namespace luce::gpu
