// matmul_mma_frag.cu — y = W x for quantized W with int8 activations on the tensor cores at
// verify widths (up to 32 tokens), each warp turning its own units into mma fragments.
//
// Why: the staged kernel (matmul_mma.cu) decodes a column group of its rows into shared memory,
// waits for the whole block, multiplies, waits again, with one group in flight per block. Here
// each lane fetches and decodes whole units as the dp4a kernel does (16-byte loads, two to four
// units in flight per lane, so DRAM stays busy), writes them to its warp's own slice of shared
// memory and reads them back in the m16n8k32 fragment layout: a warp waits only for itself
// until the block's final sum. (Loading each thread's fragment bytes straight from memory was
// tried first, 2026-12-04: four bytes per row and unit per thread kept too little in flight,
// ~0.9 TB/s at any width.)
//
// Exactness: warp (pair, part) holds slots 2 pair and 2 pair + 1 of part `part`: each sums its
// units 8 k + slot in increasing k with apply_dots; the block then meets the slots in slot_tree's
// order and the parts left to right (int8_units.cuh), the dp4a and staged kernels' order, so all
// three give the same bits for every (row, token).
//
// Work split: a block of 4 * PARTS warps owns 16 rows x 8 * NTILES tokens; lane (r, h) of a warp
// fetches row r's unit of slot 2 pair + h, and each group's activations are loaded one group ahead.
#include "kernels.h"
#include "mma_int8.cuh"
#include "quant_blocks.cuh"

namespace luce::gpu {

#if !defined(LUCE_HIP)

namespace {

using namespace int8_units;
using namespace mma_int8;

// Each lane fetches and decodes whole units, as the dp4a kernel does (16-byte loads, several
// units in flight per lane); the warp re-lays them out as fragments through its own slice of
// shared memory. A lane is (row r = lane % 16, unit h = lane / 16 of the warp's slot pair).
constexpr int WARP_SLOTS = 2;                    // slots per warp
constexpr int PAIR_WARPS = SLOTS / WARP_SLOTS;   // warps per part
// A row's two units plus 4 words: the fragment reads of a warp (row g, word tq) fall on bank
// 28 g + tq mod 32, all different.
constexpr int STAGE_ROW_WORDS = WARP_SLOTS * UNIT_WORDS + 4;
constexpr int STAGE_WORDS = 16 * STAGE_ROW_WORDS;

// Q6_K and the K-quants apply the activations' 16-sums (their zero points); Q8_0 and IQ4_XS do not.
__host__ __device__ constexpr bool uses_sums(int type) { return type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K; }

// One group's activation operands for the warp's two units: the B fragments of each n-tile's
// token g, and the C columns' (tokens 2 tq, 2 tq + 1) scales and 16-sums.
template <int NTILES>
struct ActLoads {
    uint32_t x[WARP_SLOTS][NTILES][2];
    float dx[WARP_SLOTS][NTILES][2];
    uint32_t sums[WARP_SLOTS][NTILES][2];  // the unit's two 16-sums, int16 each
};

// Per-thread offsets into the fragment-order activations (act_quant.cuh, FragDst) of each
// n-tile's first unit or block (tiles past T clamped to the last: values nobody stores).
template <int NTILES>
struct ActOffsets {
    int64_t x[NTILES];   // token g's 8 bytes for lane tq: b0 | b1
    int64_t dx[NTILES];  // the scales of tokens 2 tq, 2 tq + 1
    int64_t sums[NTILES];  // and their two 16-sums each
};

// One 8-byte load per (unit, n-tile) for the B fragments, one for the C columns' scales, one for
// their 16-sums: a warp's loads of one unit are 256 contiguous bytes.
template <int TYPE, int NTILES>
__device__ __forceinline__ void fetch_acts(const MmaArgs &p, const ActOffsets<NTILES> &o, int u0, ActLoads<NTILES> &l) {
    constexpr int units_per_block = act_block_of(TYPE) / 32;  // a compile-time divisor
#pragma unroll
    for (int h = 0; h < WARP_SLOTS; ++h) {
        const int u = u0 + h;
#pragma unroll
        for (int j = 0; j < NTILES; ++j) {
            const uint2 x = *reinterpret_cast<const uint2 *>(p.xqf + o.x[j] + 256 * int64_t(u));
            l.x[h][j][0] = x.x, l.x[h][j][1] = x.y;
            const float2 dx = *reinterpret_cast<const float2 *>(p.xdf + o.dx[j] + 8 * (u / units_per_block));
            l.dx[h][j][0] = dx.x, l.dx[h][j][1] = dx.y;
            if constexpr (uses_sums(TYPE)) {
                const uint2 s = *reinterpret_cast<const uint2 *>(p.xsf + o.sums[j] + 16 * int64_t(u));
                l.sums[h][j][0] = s.x, l.sums[h][j][1] = s.y;
            }
        }
    }
}

// acc[h] += the staged unit h of the pair for the tile's 16 rows and the tokens.
template <int TYPE, int NTILES>
__device__ __forceinline__ void multiply_staged(const uint32_t *stage, const ActLoads<NTILES> &l, int h, int g, int tq,
                                                float (&acc)[NTILES][4]) {
    const uint32_t *ra = stage + g * STAGE_ROW_WORDS + UNIT_WORDS * h, *rb = ra + 8 * STAGE_ROW_WORDS;
    const UnitScales sa = reinterpret_cast<const Unit *>(ra)->s, sb = reinterpret_cast<const Unit *>(rb)->s;
    const uint32_t a0 = ra[tq], a1 = rb[tq], a2 = ra[tq + 4], a3 = rb[tq + 4];
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
        int lo[4], hi[4];
        mma_unit<TYPE>(a0, a1, a2, a3, l.x[h][j][0], l.x[h][j][1], lo, hi);
        int sum_lo[2] = {0, 0}, sum_hi[2] = {0, 0};
        if constexpr (uses_sums(TYPE)) {
#pragma unroll
            for (int c = 0; c < 2; ++c) sum_lo[c] = int16_t(l.sums[h][j][c] & 0xFFFF), sum_hi[c] = int16_t(l.sums[h][j][c] >> 16);
        }
        apply_frag<TYPE>(lo, hi, sa, sb, l.dx[h][j], sum_lo, sum_hi, acc[j]);
    }
}

template <int TYPE, int NTILES, int UNROLL, int PARTS>
__global__ void __launch_bounds__(PAIR_WARPS * 32 * PARTS) matmul_mma_frag_kernel(MmaArgs p) {
    __shared__ __align__(16) uint32_t stages[PAIR_WARPS * PARTS][STAGE_WORDS];
    __shared__ float red[PARTS][SLOTS][4][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, pair = warp % PAIR_WARPS, part = warp / PAIR_WARPS;
    const int g = lane / 4, tq = lane % 4;  // fragment coordinates: groupID, thread in group
    const int r = lane % 16, h = lane / 16; // what this lane fetches: row r, unit h of the pair
    const int64_t r0 = int64_t(blockIdx.x) * 16;
    const int t0 = blockIdx.y * MMA_NTILE * NTILES;
    uint32_t *stage = stages[warp];

    const int64_t row = min(r0 + r, p.rows.n_out() - 1);  // rows past n_out: computed, not stored
    const int seg = p.rows.find(row);
    const uint8_t *wr = p.rows.w[seg] + (row - p.rows.start(seg)) * p.row_bytes;
    ActOffsets<NTILES> o;
    const int n_units = p.n_in / 32, n_blocks = p.n_in / act_block_of(TYPE);
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
        const int64_t tile = min(t0 / MMA_NTILE + j, (p.T - 1) / MMA_NTILE);
        o.x[j] = (tile * n_units * 8 + g) * 32 + 8 * tq;
        o.dx[j] = tile * n_blocks * 8 + 2 * tq;
        o.sums[j] = (tile * n_units * 8 + 2 * tq) * 2;
    }
    float acc[WARP_SLOTS][NTILES][4] = {};

    const int n_groups = (n_units + SLOTS - 1) / SLOTS;
    const int k_begin = part_begin(part, n_groups, PARTS), k_end = part_begin(part + 1, n_groups, PARTS);
    const int slot = WARP_SLOTS * pair + h;  // this lane's unit in each group
    const Codebook cb = load_codebook();
    RawUnit<TYPE> raw[UNROLL];
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) {
        const int k = k_begin + i;
        if (k < k_end && SLOTS * k + slot < n_units) fetch_group_unit<TYPE>(wr + int64_t(group_bytes(TYPE)) * k, slot, raw[i]);
    }
    wait_for_inputs();  // the first weights are on their way while the previous kernel finishes
    ActLoads<NTILES> acts;
    if (k_begin < k_end) fetch_acts<TYPE>(p, o, SLOTS * k_begin + WARP_SLOTS * pair, acts);
    for (int k0 = k_begin; k0 < k_end; k0 += UNROLL) {
#pragma unroll
        for (int i = 0; i < UNROLL; ++i) {
            const int k = k0 + i;
            if (k >= k_end) break;
            Unit un{};
            if (SLOTS * k + slot < n_units) decode_unit<TYPE>(raw[i], SLOTS * k + slot, cb, un);
            const int kn = k + UNROLL;
            if (kn < k_end && SLOTS * kn + slot < n_units)
                fetch_group_unit<TYPE>(wr + int64_t(group_bytes(TYPE)) * kn, slot, raw[i]);
            uint4 *dst = reinterpret_cast<uint4 *>(stage + r * STAGE_ROW_WORDS + UNIT_WORDS * h);
            const uint4 *src = reinterpret_cast<const uint4 *>(&un);
            dst[0] = src[0], dst[1] = src[1], dst[2] = src[2];
            const ActLoads<NTILES> cur = acts;
            if (k + 1 < k_end) fetch_acts<TYPE>(p, o, SLOTS * (k + 1) + WARP_SLOTS * pair, acts);
            __syncwarp();
#pragma unroll
            for (int s = 0; s < WARP_SLOTS; ++s)  // warp-uniform: a last group may end mid-pair
                if (SLOTS * k + WARP_SLOTS * pair + s < n_units) multiply_staged<TYPE>(stage, cur, s, g, tq, acc[s]);
            __syncwarp();  // the next store overwrites the stage
        }
    }

    // slot_tree over the block's eight slots of each part, then the parts left to right: one
    // n-tile at a time through shared memory (every thread takes part).
    for (int j = 0; j < NTILES; ++j) {
        __syncthreads();  // the previous n-tile's sums are read
#pragma unroll
        for (int s = 0; s < WARP_SLOTS; ++s)
#pragma unroll
            for (int c = 0; c < 4; ++c) red[part][WARP_SLOTS * pair + s][c][lane] = acc[s][j][c];
        __syncthreads();
        for (int e = threadIdx.x; e < 4 * 32; e += blockDim.x) {
            const int c = e / 32, l = e % 32;  // C fragment element c at lane l
            float total = 0.f;
#pragma unroll
            for (int q = 0; q < PARTS; ++q) {
                float v[SLOTS];
#pragma unroll
                for (int s = 0; s < SLOTS; ++s) v[s] = red[q][s][c][l];
                total = q == 0 ? slot_tree(v) : total + slot_tree(v);
            }
            store_output(p, r0 + l / 4 + (c < 2 ? 0 : 8), t0 + MMA_NTILE * j + 2 * (l % 4) + c % 2, total);
        }
    }
}

struct FragLaunch {
    cudaStream_t stream;
    int64_t n_in;
    const RowSegments &rows;
    const ActScratch &a;
    int T;

    template <int TYPE, int NTILES, int UNROLL, int PARTS>
    void launch_with() const {
        const int toks = MMA_NTILE * NTILES;
        const dim3 grid(unsigned((rows.n_out() + 15) / 16), unsigned((T + toks - 1) / toks));
        const MmaArgs p{rows, n_in / block_elems(TYPE) * block_bytes(TYPE), int(n_in), a.q, a.d, a.s16, T,
                        a.qf, a.df, a.sf};
        launch_kernel(matmul_mma_frag_kernel<TYPE, NTILES, UNROLL, PARTS>, grid, PAIR_WARPS * 32 * PARTS, 0, stream, p);
    }

    // Units in flight per lane: four, two for the large raw units of the K-quants and Q6_K (for
    // IQ4_XS, two and eight measured within 10% of four, neither better throughout: H200,
    // 2026-12-04). Rows of several parts put each part on its own four warps.
    template <int TYPE, int NTILES>
    void launch() const {
        constexpr int UNROLL = TYPE == GGML_IQ4_XS || TYPE == GGML_Q8_0 ? 4 : 2;
        with_row_parts(int(n_in), [&](auto parts) { launch_with<TYPE, NTILES, UNROLL, decltype(parts)::value>(); });
    }

    template <int TYPE>
    void operator()() const {
        if constexpr (act_block_of(TYPE) == 0) {
            fail(LUCE_ERR_INTERNAL, "mma matmul called for float type %d", TYPE);
        } else {
            if (T <= 8) launch<TYPE, 1>();
            else if (T <= 16) launch<TYPE, 2>();
            else launch<TYPE, 4>();
        }
    }
};

}  // namespace

// From the kernel bench of an H200 (2026-12-04, session 7: cold weights, each call on its own
// copy as in a model step; fragment vs staged kernel): IQ4_XS faster at every width 8-32
// (17408x5120 at 8 / 16 / 32 tokens: 41 / 56 / 75 us against 59 / 64 / 116; 5120x17408: 53 / 61 /
// 99 against 90 / 113 / 174); Q6_K faster on rows of one part (attn_v, 1024x5120: 23 / 25 / 29
// against 25 / 28 / 32) but on ssm_out's rows of two parts only past 16 tokens (5120x6144: 46 /
// 53 / 65 against 37 / 46 / 91); Q5_K and Q8_0 slower (their raw units are large: two in flight
// per lane). The kernels give the same bits, so this only picks the faster.
bool mma_frag_serves(int type, int64_t n_in, int T) {
    if (T > MMA_FRAG_MAX_TOKENS) return false;
    if (type == GGML_IQ4_XS) return true;
    return type == GGML_Q6_K && (int8_units::row_parts(int(n_in)) == 1 || T > 16);
}

void matmul_mma_frag(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a) {
    const int block = act_block_of(type);
    if (block == 0 || n_in % block != 0 || n_in > INT32_MAX || T < 1 || T > MMA_FRAG_MAX_TOKENS ||
        int64_t(T) * n_in > INT32_MAX || rows.n < 1 || !a.qf || a.n_in != n_in)
        fail(LUCE_ERR_INTERNAL, "matmul_mma_frag: type %d, n_in %lld, T %d", type, (long long)n_in, T);
    FragLaunch launch{stream, n_in, rows, a, T};
    if (!dispatch_type(type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU matmul for ggml type %d", type);
}

#else  // HIP keeps the dp4a kernel (matmul_int8.cu)

bool mma_frag_serves(int, int64_t, int) { return false; }

void matmul_mma_frag(cudaStream_t, int type, int64_t, const RowSegments &, int, const ActScratch &) {
    fail(LUCE_ERR_UNSUPPORTED, "matmul_mma_frag: no tensor-core int8 matmul on HIP (type %d)", type);
}

#endif

}  // namespace luce::gpu
