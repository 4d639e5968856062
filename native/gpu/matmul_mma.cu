// matmul_mma.cu — y = W x for quantized W with int8 activations on the tensor cores (CUDA sm_80+,
// mma.sync m16n8k32 / m16n8k16 .s8.s8.s32): the same contract as matmul_int8.cu (the CPU fast
// path's), used for every T on CUDA so a verify step's rows stay bit-identical to decode steps.
//
// Why: the dp4a kernel applies each loaded weight unit to the tokens one after another, so a
// 16-token verify step costs ~3x a decode step. One mma multiplies a 16-row x 32-element weight
// tile by 8 tokens at once; the weights of a tile are dequantized to int8 once and serve up to
// 32 tokens (four n-tiles of 8) per pass, so each weight leaves DRAM once per step for T <= 32.
//
// Exactness and batch invariance: a 32-element unit's integer dot is exact however it is formed
// (|dot| < 2^20), and each (row, token) output applies the unit's scales with apply_dots and sums
// the units in int8_units.cuh's SLOTS order: warp s of the block is slot s (units u = s, s + 8,
// ... in increasing u), and the eight warps' partials meet in slot_tree's order. Neither T, nor
// the tiling, nor the token's column enters that order, so this kernel and the dp4a one give the
// same bits for every (row, token), and the backend may pick either by width.
//
// Work split: a block of eight warps owns 16 * MT rows x 8 * NTILES tokens. Per pass it stages
// one 256-element column group (eight units: one per warp) of its rows and tokens in shared
// memory, the weights dequantized to int8 by decode_unit (eight consecutive threads read one row's
// eight units: coalesced), and each warp multiplies its unit with m16n8k32 (m16n8k16 twice for
// Q6_K, whose halves have their own scales). The next group's loads are in flight meanwhile.
#include "kernels.h"
#include "mma_int8.cuh"
#include "quant_blocks.cuh"

namespace luce::gpu {

#if !defined(LUCE_HIP)

namespace {

using namespace int8_units;
using namespace mma_int8;

constexpr int MMA_THREADS = SLOTS * 32;  // warp s: slot s
constexpr int MMA_MAX_NTILES = 4;        // tokens per pass up to 32 (verify widths)
constexpr int PREFILL_NTILES = 8;        // past 32 tokens: 64 per pass

// Shared-memory layout of one pass, in 32-bit words. A staged unit is 12 words (8 of int8
// weights, 4 of scales); a row's eight units plus 4 words of padding put the fragment reads of a
// warp (row g, word tq: bank 4g + 12s + tq) on 32 different banks. A token's 256 int8 activations
// are 64 words plus 4 of padding for the same reason (bank 4g + 8s + tq).
constexpr int ROW_WORDS = SLOTS * UNIT_WORDS + 4;
constexpr int TOK_WORDS = SLOTS * 8 + 4;

template <int MT, int NTILES>
struct MmaSmem {
    static constexpr int rows = 16 * MT, toks = MMA_NTILE * NTILES;
    static constexpr int w_words = rows * ROW_WORDS;           // weights
    static constexpr int x_words = toks * TOK_WORDS;           // activations
    static constexpr int s_words = toks * SLOTS * 2;           // per (token, unit): dx, the two 16-sums
    static constexpr int frag_words = MT * NTILES * 4 * 32;    // one warp's accumulators
    static constexpr int reduce_words = 4 * frag_words;        // the tree's first step: four warps
    static constexpr int words = w_words + x_words + s_words > reduce_words ? w_words + x_words + s_words
                                                                           : reduce_words;
};

// What one thread carries from global memory to the stage: (row, unit) weight entries e = tid,
// tid + 256, ... of rows x 8 units (raw: decoded when stored), and (token, 16-byte chunk)
// activation entries and (token, unit) scale entries likewise.
template <int TYPE, int MT, int NTILES>
struct Prefetch {
    static constexpr int w_entries = (16 * MT * SLOTS + MMA_THREADS - 1) / MMA_THREADS;
    static constexpr int x_entries = (MMA_NTILE * NTILES * 16 + MMA_THREADS - 1) / MMA_THREADS;
    RawUnit<TYPE> w[w_entries];
    int w_unit[w_entries];  // the entry's unit index, or -1: a zero unit (past the row or n_out)
    static constexpr int s_entries = (MMA_NTILE * NTILES * SLOTS + MMA_THREADS - 1) / MMA_THREADS;
    int4 x[x_entries];
    float dx[s_entries];
    uint32_t sums[s_entries];  // the two 16-sums of the unit, int16 each
};

// Loads group k (units 8k .. 8k + 7) of the block's rows r0.. and tokens t0.. into registers;
// units past the row's end, rows past n_out and tokens past T load as zeros.
template <int TYPE, int MT, int NTILES>
__device__ __forceinline__ void prefetch_group(const MmaArgs &p, int64_t r0, int t0, int k,
                                               Prefetch<TYPE, MT, NTILES> &f) {
    constexpr int rows = 16 * MT, toks = MMA_NTILE * NTILES;
    const int n_units = p.n_in / 32;
#pragma unroll
    for (int i = 0; i < f.w_entries; ++i) {
        const int e = threadIdx.x + i * MMA_THREADS, row = e / SLOTS, u = SLOTS * k + e % SLOTS;
        const bool ok = e < rows * SLOTS && r0 + row < p.rows.n_out() && u < n_units;
        f.w_unit[i] = ok ? u : -1;
        if (ok) {
            const int seg = p.rows.find(r0 + row);
            fetch_unit<TYPE>(p.rows.w[seg] + (r0 + row - p.rows.start(seg)) * p.row_bytes, u, f.w[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < f.x_entries; ++i) {
        const int e = threadIdx.x + i * MMA_THREADS, tok = e / 16, chunk = e % 16;
        const int64_t col = 256 * int64_t(k) + 16 * chunk;
        f.x[i] = int4{0, 0, 0, 0};
        if (e < toks * 16 && t0 + tok < p.T && col < p.n_in)
            f.x[i] = *reinterpret_cast<const int4 *>(p.xq + int64_t(t0 + tok) * p.n_in + col);
    }
    constexpr int units_per_block = act_block_of(TYPE) / 32;
    const int n_blocks = p.n_in / act_block_of(TYPE);
#pragma unroll
    for (int i = 0; i < f.s_entries; ++i) {
        const int e = threadIdx.x + i * MMA_THREADS, tok = e / SLOTS, u = SLOTS * k + e % SLOTS;
        f.dx[i] = 0.f;
        f.sums[i] = 0;
        if (e < toks * SLOTS && t0 + tok < p.T && u < n_units) {
            f.dx[i] = p.xd[int64_t(t0 + tok) * n_blocks + u / units_per_block];
            const int16_t *sp = p.xs + int64_t(t0 + tok) * (p.n_in / 16) + 2 * u;
            f.sums[i] = uint32_t(uint16_t(sp[0])) | uint32_t(uint16_t(sp[1])) << 16;
        }
    }
}

template <int TYPE, int MT, int NTILES>
__device__ __forceinline__ void store_group(const Prefetch<TYPE, MT, NTILES> &f, const Codebook &cb, uint32_t *smem) {
    using L = MmaSmem<MT, NTILES>;
#pragma unroll
    for (int i = 0; i < f.w_entries; ++i) {
        const int e = threadIdx.x + i * MMA_THREADS;
        if (e < L::rows * SLOTS) {
            Unit un{};
            if (f.w_unit[i] >= 0) decode_unit<TYPE>(f.w[i], f.w_unit[i], cb, un);
            uint4 *dst = reinterpret_cast<uint4 *>(smem + (e / SLOTS) * ROW_WORDS + (e % SLOTS) * UNIT_WORDS);
            const uint4 *src = reinterpret_cast<const uint4 *>(&un);
            dst[0] = src[0], dst[1] = src[1], dst[2] = src[2];
        }
    }
#pragma unroll
    for (int i = 0; i < f.x_entries; ++i) {
        const int e = threadIdx.x + i * MMA_THREADS;
        if (e < L::toks * 16)
            *reinterpret_cast<int4 *>(smem + L::w_words + (e / 16) * TOK_WORDS + (e % 16) * 4) = f.x[i];
    }
#pragma unroll
    for (int i = 0; i < f.s_entries; ++i) {
        const int e = threadIdx.x + i * MMA_THREADS;  // (token, unit) = (e / 8, e % 8)
        if (e < L::toks * SLOTS) {
            uint32_t *s = smem + L::w_words + L::x_words + 2 * e;
            s[0] = __float_as_uint(f.dx[i]);
            s[1] = f.sums[i];
        }
    }
}

// acc += warp `slot`'s unit u (staged) for the block's rows and tokens.
template <int TYPE, int MT, int NTILES>
__device__ __forceinline__ void mma_group(const uint32_t *smem, int u, int slot, int g, int tq,
                                          float (&acc)[MT][NTILES][4]) {
    using L = MmaSmem<MT, NTILES>;
    const uint32_t *xs = smem + L::w_words, *ss = smem + L::w_words + L::x_words;
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
        const uint32_t *xr = xs + (MMA_NTILE * j + g) * TOK_WORDS + 8 * slot;  // B column: token g
        const uint32_t b0 = xr[tq], b1 = xr[tq + 4];
        float dx[2];
        int sum_lo[2], sum_hi[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // C columns: tokens 2 tq + h
            const uint32_t *st = ss + 2 * ((MMA_NTILE * j + 2 * tq + h) * SLOTS + slot);
            dx[h] = __uint_as_float(st[0]);
            sum_lo[h] = int16_t(st[1] & 0xFFFF);
            sum_hi[h] = int16_t(st[1] >> 16);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const uint32_t *ra = smem + (16 * m + g) * ROW_WORDS + UNIT_WORDS * slot;
            const uint32_t *rb = ra + 8 * ROW_WORDS;
            int lo[4], hi[4];
            mma_unit<TYPE>(ra[tq], rb[tq], ra[tq + 4], rb[tq + 4], b0, b1, lo, hi);
            apply_frag<TYPE>(lo, hi, reinterpret_cast<const Unit *>(ra)->s, reinterpret_cast<const Unit *>(rb)->s, dx,
                             sum_lo, sum_hi, acc[m][j]);
        }
    }
}

// slot_tree across the block's eight warps (warp slot s holds slot s's partials, same fragment
// positions in every warp): ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), each step adding
// the upper warps' partials into the lower ones through `red` (4 * F * 32 floats per part); slot
// 0's v holds the result. Every thread of the block must call it.
template <int F>
__device__ __forceinline__ void slot_tree_warps(float (&v)[F], float *red, int slot, int lane) {
#pragma unroll
    for (int width = 4; width >= 1; width /= 2) {
        if (slot >= width && slot < 2 * width) {
#pragma unroll
            for (int f = 0; f < F; ++f) red[((slot - width) * F + f) * 32 + lane] = v[f];
        }
        __syncthreads();
        if (slot < width) {
#pragma unroll
            for (int f = 0; f < F; ++f) v[f] += red[(slot * F + f) * 32 + lane];
        }
        __syncthreads();
    }
}

// A part of the row (int8_units.cuh) other than the last is complete: its sum goes into warp 0's
// running sum of the parts before it (`total`, `first`: there are none), the slots start over.
template <int MT, int NTILES>
__device__ __forceinline__ void close_part(float (&acc)[MT][NTILES][4], uint32_t *smem, float *total, bool first,
                                           int slot, int lane) {
    constexpr int F = MT * NTILES * 4;
    float(&flat)[F] = reinterpret_cast<float(&)[F]>(acc);
    slot_tree_warps(flat, reinterpret_cast<float *>(smem), slot, lane);
    if (slot == 0) {
#pragma unroll
        for (int f = 0; f < F; ++f) total[f * 32 + lane] = first ? flat[f] : total[f * 32 + lane] + flat[f];
    }
#pragma unroll
    for (int f = 0; f < F; ++f) flat[f] = 0.f;
}

// PARTED: rows of more than one part (row_parts): kernels for the others carry none of the
// part bookkeeping, whose registers cost tiles of 32 x 16 a block per SM (80 -> 96 registers).
template <int TYPE, int MT, int NTILES, bool PARTED>
__global__ void __launch_bounds__(MMA_THREADS) matmul_mma_kernel(MmaArgs p) {
    using L = MmaSmem<MT, NTILES>;
    __shared__ __align__(16) uint32_t smem[L::words];
    __shared__ float total[PARTED ? L::frag_words : 1];  // warp 0's sum of the finished parts
    const int lane = threadIdx.x % 32, slot = threadIdx.x / 32;
    const int g = lane / 4, tq = lane % 4;  // fragment coordinates: groupID, thread in group
    const int64_t r0 = int64_t(blockIdx.x) * L::rows;
    const int t0 = blockIdx.y * L::toks;
    const int n_units = p.n_in / 32, n_groups = (n_units + SLOTS - 1) / SLOTS;
    const int parts = PARTED ? row_parts(p.n_in) : 1;

    float acc[MT][NTILES][4] = {};
    wait_for_inputs();  // each group's loads take activations with the weights

    // One group's loads in flight while the previous one is multiplied, in one register set: on
    // an H200 (2026-12-03) keeping two or four groups in flight cost registers (95 / 126 against
    // 73 for 32 rows x 16 tokens) and made that matmul slower (90 / 77 against 68 us, 17408x5120).
    const Codebook cb = load_codebook();
    // A part's first group is fetched after the previous part is closed: no loads live across
    // close_part, whose registers the 64-token tile could not spare.
    Prefetch<TYPE, MT, NTILES> next;
    for (int part = 0, k = 0; part < parts; ++part) {
        if (part > 0) close_part(acc, smem, total, part == 1, slot, lane);
        const int k_end = part_begin(part + 1, n_groups, parts);
        prefetch_group<TYPE>(p, r0, t0, k, next);
        for (; k < k_end; ++k) {
            store_group(next, cb, smem);
            __syncthreads();
            if (k + 1 < k_end) prefetch_group<TYPE>(p, r0, t0, k + 1, next);
            if (SLOTS * k + slot < n_units) mma_group<TYPE, MT, NTILES>(smem, SLOTS * k + slot, slot, g, tq, acc);
            __syncthreads();  // the next store overwrites the stage
        }
    }
    constexpr int F = MT * NTILES * 4;
    float(&flat)[F] = reinterpret_cast<float(&)[F]>(acc);
    slot_tree_warps(flat, reinterpret_cast<float *>(smem), slot, lane);
    if (slot != 0) return;
    if (PARTED) {
#pragma unroll
        for (int f = 0; f < F; ++f) flat[f] = total[f * 32 + lane] + flat[f];
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NTILES; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c)  // C fragment: row g (c < 2) or g + 8, token 2 tq + c % 2
                store_output(p, r0 + 16 * m + g + (c < 2 ? 0 : 8), t0 + MMA_NTILE * j + 2 * tq + c % 2, acc[m][j][c]);
}

struct MmaLaunch {
    cudaStream_t stream;
    int64_t n_in;
    const RowSegments &rows;
    const ActScratch &a;
    int T;

    template <int TYPE, int MT, int NTILES>
    void launch_with() const {
        using L = MmaSmem<MT, NTILES>;
        const dim3 grid(unsigned((rows.n_out() + L::rows - 1) / L::rows), unsigned((T + L::toks - 1) / L::toks));
        const MmaArgs p{rows, quant_row_bytes(TYPE, n_in), int(n_in), a.q, a.d, a.s16, T};
        if (row_parts(int(n_in)) > 1) launch_kernel(matmul_mma_kernel<TYPE, MT, NTILES, true>, grid, MMA_THREADS, 0,
                                                    stream, p);
        else launch_kernel(matmul_mma_kernel<TYPE, MT, NTILES, false>, grid, MMA_THREADS, 0, stream, p);
    }

    // Row tiles of 32 rows, 16 for matrices of fewer than 8192 rows so that those still spread
    // over every SM (a guess from occupancy arithmetic; any tiling gives the same bits).
    template <int TYPE, int NTILES>
    void launch() const {
        if (rows.n_out() >= 8192) launch_with<TYPE, 2, NTILES>();
        else launch_with<TYPE, 1, NTILES>();
    }

    template <int TYPE>
    void operator()() const {
        if constexpr (act_block_of(TYPE) == 0) {
            fail(LUCE_ERR_INTERNAL, "mma matmul called for float type %d", TYPE);
        } else {
            // Fewer n-tiles only skip all-padding mmas.
            if (T <= 8) launch<TYPE, 1>();
            else if (T <= 16) launch<TYPE, 2>();
            else if (T <= 24) launch<TYPE, 3>();
            else if (T <= 32) launch<TYPE, MMA_MAX_NTILES>();
            else launch_with<TYPE, 1, PREFILL_NTILES>();  // 16 rows x 64 tokens: each weight serves 64
        }
    }
};

}  // namespace

bool mma_matmul_supported(int cc_major) { return cc_major >= 8; }

void matmul_mma(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a) {
    const int block = act_block_of(type);
    if (block == 0 || n_in % block != 0 || n_in > INT32_MAX || T < 1 || T > 65535 * 32 || rows.n < 1)
        fail(LUCE_ERR_INTERNAL, "matmul_mma: type %d, n_in %lld, T %d", type, (long long)n_in, T);
    MmaLaunch launch{stream, n_in, rows, a, T};
    if (!dispatch_type(type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU matmul for ggml type %d", type);
}

#else  // HIP keeps the dp4a kernel (matmul_int8.cu)

bool mma_matmul_supported(int) { return false; }

void matmul_mma(cudaStream_t, int type, int64_t, const RowSegments &, int, const ActScratch &) {
    fail(LUCE_ERR_UNSUPPORTED, "matmul_mma: no tensor-core int8 matmul on HIP (type %d)", type);
}

#endif

}  // namespace luce::gpu
