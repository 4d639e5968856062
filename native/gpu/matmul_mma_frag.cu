// matmul_mma_frag.cu — y = W x for quantized W with int8 activations on the tensor cores at
// verify widths (up to 32 tokens), each warp turning its own units into mma fragments.
//
// Why: the staged kernel (matmul_mma.cu) decodes a column group of its rows into shared memory,
// waits for the whole block, multiplies, waits again, with one group in flight per block. Here
// each lane fetches and decodes whole units as the dp4a kernel does (16-byte loads, two to four
// units in flight per lane, so DRAM stays busy), writes them to its warp's own slice of shared
// memory and reads them back in the m16n8k32 fragment layout (one ldmatrix per unit): a warp
// waits only for itself until the block's final sum. (Loading each thread's fragment bytes
// straight from memory was tried first, 2026-12-04: four bytes per row and unit per thread kept
// too little in flight, ~0.9 TB/s at any width.)
//
// Exactness: warp (pair, part) holds slots 2 pair and 2 pair + 1 of part `part`: each sums its
// units 8 k + slot in increasing k with apply_dots' fp32 steps (apply_scaled_dots, d * dx formed
// once per group: the same product); the block then meets the slots in slot_tree's
// order and the parts left to right (int8_units.cuh), the dp4a and staged kernels' order, so all
// three give the same bits for every (row, token).
//
// Work split: a block of 4 * PARTS warps owns 16 rows x 8 * NTILES tokens; lane (r, h) of a warp
// fetches row r's unit of slot 2 pair + h, UNROLL groups ahead, and the activations two groups
// ahead (one at 32 tokens).
//
// Instruction budget (ncu SASS counts, IQ4_XS 17408x5120 at 8 tokens, 2026-12-04): 169 per lane
// per group, of which the unit's decode ~75 (32 permutes); it was 261 before the fragments came
// from ldmatrix, the group's shared d * dx was formed once per group, the activation addresses
// became cursors and the codebook left the uniform registers (35 us against 41).
#include <algorithm>

#include "bulk_copy.cuh"
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
// A row's two units of int8 weights plus 4 words (80 bytes): the eight row reads of each
// ldmatrix phase start on banks 20 g mod 32, so its 16-byte reads fall on 32 different banks.
constexpr int STAGE_ROW_WORDS = WARP_SLOTS * 8 + 4;

// One warp's staging area: the weights of its 16 rows x 2 units, read back with ldmatrix, and the
// units' scales.
struct WarpStage {
    uint32_t q[16][STAGE_ROW_WORDS];
    UnitScales s[WARP_SLOTS][16];  // unit-major: the 16 lanes storing one unit write 256 contiguous bytes
};

// The 256-element types: a group is one weight block and one activation block, so a group's
// units share d (and dmin) and dx, and every group of a row is whole.
__host__ __device__ constexpr bool group_is_block(int type) { return block_elems(type) == 256; }

// Whether unit `slot` of group k is in the row: always for the 256-element types; a row of a 32-element type may
// end mid-group (warp-uniform per (group, slot)).
template <int TYPE>
__device__ __forceinline__ bool unit_in_row(int k, int slot, int n_units) {
    return group_is_block(TYPE) || SLOTS * k + slot < n_units;
}

// a0..a3 = the m16n8k32 A fragment of the 16 x 32 int8 tile whose row i starts at row_addr of
// lane i % 16 (rows 0-7: matrices 0 and 2, rows 8-15: 1 and 3; lanes 16-31 give the second 16
// bytes of each row).
__device__ __forceinline__ void ldmatrix_x4(uint32_t row_addr, uint32_t &a0, uint32_t &a1, uint32_t &a2, uint32_t &a3) {
#if defined(LUCE_GPU_EMU)
    uint32_t r[4];
    luce_emu::ldmatrix_x4(row_addr, r);
    a0 = r[0], a1 = r[1], a2 = r[2], a3 = r[3];
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                 : "r"(row_addr));
#endif
}

// One group's activation operands for the warp's two units: the B fragments of each n-tile's
// token g, the C columns' (tokens 2 tq, 2 tq + 1) scales (one per group for the 256-element
// types, one per unit for the 32-element ones) and the units' 16-sums.
template <int TYPE, int NTILES>
struct ActLoads {
    static constexpr int DX_UNITS = group_is_block(TYPE) ? 1 : WARP_SLOTS;
    uint32_t x[WARP_SLOTS][NTILES][2];
    float dx[DX_UNITS][NTILES][2];
    uint32_t sums[uses_act_sums(TYPE) ? WARP_SLOTS : 1][NTILES][2];  // the unit's two 16-sums, int16 each
};

// Where this lane reads the fragment-order activations (act_quant.cuh, FragDst) of the warp's
// first unit in group k_begin, per n-tile (tiles past T clamped to the last: values nobody
// stores); each group advances them by its units.
template <int NTILES>
struct ActCursor {
    const int8_t *x[NTILES];  // token g's 8 bytes for lane tq: b0 | b1 (256 bytes per unit)
    const float *dx[NTILES];  // the scales of tokens 2 tq, 2 tq + 1 (8 floats per activation block)
    const int16_t *sums[NTILES];  // and their two 16-sums each (16 per unit)
};

// The cursor of a warp whose first unit is u0, for the n-tiles from token t0 (tiles past the
// last token repeat it: computed, not stored).
template <int TYPE, int NTILES>
__device__ __forceinline__ ActCursor<NTILES> act_cursor(const MmaArgs &p, int t0, int u0, int n_units, int n_blocks,
                                                        int g, int tq) {
    ActCursor<NTILES> cur;
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
        const int64_t tile = min(t0 / MMA_NTILE + j, (p.T - 1) / MMA_NTILE);
        cur.x[j] = p.xqf + ((tile * n_units + u0) * 8 + g) * 32 + 8 * tq;
        cur.dx[j] = p.xdf + (tile * n_blocks + u0 / (act_block_of(TYPE) / 32)) * 8 + 2 * tq;
        cur.sums[j] = p.xsf + ((tile * n_units + u0) * 8 + 2 * tq) * 2;
    }
    return cur;
}

// One 8-byte load per (unit, n-tile) for the B fragments, one per group (per unit for the 32-element types) for
// the C columns' scales, one per unit for their 16-sums: a warp's loads of one unit are 256
// contiguous bytes. Group `ahead` groups past the cursor, of whose units `left` are in the row
// (32-element types' rows may end mid-pair: nothing is read past them).
template <int TYPE, int NTILES>
__device__ __forceinline__ void fetch_acts(const ActCursor<NTILES> &c, int ahead, int left, ActLoads<TYPE, NTILES> &l) {
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
#pragma unroll
        for (int h = 0; h < WARP_SLOTS; ++h) {
            if (!group_is_block(TYPE) && h >= left) break;
            const uint2 x = *reinterpret_cast<const uint2 *>(c.x[j] + 256 * (SLOTS * ahead + h));
            l.x[h][j][0] = x.x, l.x[h][j][1] = x.y;
            if constexpr (uses_act_sums(TYPE)) {
                const uint2 s = *reinterpret_cast<const uint2 *>(c.sums[j] + 16 * (SLOTS * ahead + h));
                l.sums[h][j][0] = s.x, l.sums[h][j][1] = s.y;
            }
        }
#pragma unroll
        for (int h = 0; h < ActLoads<TYPE, NTILES>::DX_UNITS; ++h) {
            if (!group_is_block(TYPE) && h >= left) break;
            const int block = group_is_block(TYPE) ? ahead : SLOTS * ahead + h;  // 32-element types: a block per unit
            const float2 dx = *reinterpret_cast<const float2 *>(c.dx[j] + 8 * block);
            l.dx[h][j][0] = dx.x, l.dx[h][j][1] = dx.y;
        }
    }
}

// The cursors `groups` groups on.
template <int NTILES>
__device__ __forceinline__ void advance(ActCursor<NTILES> &c, int groups, int dx_per_group) {
#pragma unroll
    for (int j = 0; j < NTILES; ++j)
        c.x[j] += 256 * SLOTS * groups, c.dx[j] += 8 * dx_per_group * groups, c.sums[j] += 16 * SLOTS * groups;
}

// The products of the rows' block scales with the tokens' dx for C element c of n-tile j (rows g,
// g + 8 by c / 2; tokens 2 tq + c % 2): formed once per group where the group is one block.
template <int NTILES>
struct TokenScales {
    float d[NTILES][4], dmin[NTILES][4];
};

template <int TYPE, int NTILES>
__device__ __forceinline__ void token_scales(const UnitScales &a, const UnitScales &b, const float (&dx)[NTILES][2],
                                             TokenScales<NTILES> &ts) {
    constexpr bool with_min = has_min(TYPE);
#pragma unroll
    for (int j = 0; j < NTILES; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const UnitScales &s = c < 2 ? a : b;
            ts.d[j][c] = s.d * dx[j][c % 2];
            ts.dmin[j][c] = with_min ? s.dmin * dx[j][c % 2] : 0.f;
        }
}

// acc += the staged unit h of the pair for the tile's 16 rows and the tokens.
template <int TYPE, int NTILES>
__device__ __forceinline__ void multiply_staged(const WarpStage &st, uint32_t q_addr, const ActLoads<TYPE, NTILES> &l,
                                                const TokenScales<NTILES> &group_ts, int h, int g,
                                                float (&acc)[NTILES][4]) {
    uint32_t a0, a1, a2, a3;
    ldmatrix_x4(q_addr + 32 * h, a0, a1, a2, a3);
    const UnitScales sa = st.s[h][g], sb = st.s[h][g + 8];
    TokenScales<NTILES> ts = group_ts;
    if constexpr (!group_is_block(TYPE)) token_scales<TYPE, NTILES>(sa, sb, l.dx[h], ts);
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
        int lo[4], hi[4];
        mma_unit<TYPE>(a0, a1, a2, a3, l.x[h][j][0], l.x[h][j][1], lo, hi);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            int sum_lo = 0, sum_hi = 0;
            if constexpr (uses_act_sums(TYPE)) {
                const uint32_t s = l.sums[h][j][c % 2];
                sum_lo = int16_t(s & 0xFFFF), sum_hi = int16_t(s >> 16);
            }
            acc[j][c] = apply_scaled_dots<TYPE>(c < 2 ? sa : sb, ts.d[j][c], ts.dmin[j][c], lo[c], hi[c], sum_lo,
                                                sum_hi, acc[j][c]);
        }
    }
}

// Group k of the warp's pair: this lane's decoded unit `un` goes to the warp's stage `st` (read
// back from q_addr by ldmatrix), then both units are multiplied into acc for the tile's tokens.
template <int TYPE, int NTILES>
__device__ __forceinline__ void stage_and_multiply(const Unit &un, int k, int pair, int n_units, WarpStage &st,
                                                   uint32_t q_addr, const ActLoads<TYPE, NTILES> &now,
                                                   float (&acc)[WARP_SLOTS][NTILES][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, r = lane % 16, h = lane / 16;
    uint4 *dst = reinterpret_cast<uint4 *>(&st.q[r][8 * h]);
    const uint4 *src = reinterpret_cast<const uint4 *>(un.q);
    dst[0] = src[0], dst[1] = src[1];
    st.s[h][r] = un.s;
    __syncwarp();
    TokenScales<NTILES> ts;
    if constexpr (group_is_block(TYPE)) token_scales<TYPE, NTILES>(st.s[0][g], st.s[0][g + 8], now.dx[0], ts);
#pragma unroll
    for (int s = 0; s < WARP_SLOTS; ++s)  // warp-uniform: a last 32-element group may end mid-pair
        if (unit_in_row<TYPE>(k, WARP_SLOTS * pair + s, n_units))
            multiply_staged<TYPE>(st, q_addr, now, ts, s, g, acc[s]);
}

// The block's outputs: slot_tree over the eight slots of each part, then the parts left to
// right, one n-tile at a time through shared memory (every thread takes part).
template <int PARTS, int NTILES>
__device__ __forceinline__ void reduce_and_store(const MmaArgs &p, int64_t r0, int t0, int pair, int part,
                                                 const float (&acc)[WARP_SLOTS][NTILES][4],
                                                 float (&red)[PARTS][SLOTS][4][32]) {
    const int lane = threadIdx.x % 32;
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

template <int TYPE, int NTILES, int UNROLL, int PARTS>
__global__ void __launch_bounds__(PAIR_WARPS * 32 * PARTS) matmul_mma_frag_kernel(MmaArgs p) {
    // The activations of the next ACT_RING groups are in flight (their registers are refilled
    // once the group has been multiplied); at 32 tokens one, for registers.
    constexpr int ACT_RING = NTILES >= 4 ? 1 : 2;
    static_assert(UNROLL % ACT_RING == 0, "the activations' ring is indexed by i % ACT_RING");
    // Two stages per warp, alternating by group: a group's stores then cannot overwrite what the
    // warp still reads of the previous one, so one __syncwarp per group is enough (one stage where
    // two would pass the 48 KB of static shared memory: rows of four parts).
    constexpr int STAGES = PARTS == MAX_PARTS ? 1 : 2;
    static_assert(UNROLL % STAGES == 0, "the stage is indexed by i % STAGES");
    __shared__ __align__(16) WarpStage stages[STAGES][PAIR_WARPS * PARTS];
    __shared__ float red[PARTS][SLOTS][4][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, pair = warp % PAIR_WARPS, part = warp / PAIR_WARPS;
    const int g = lane / 4, tq = lane % 4;  // fragment coordinates: groupID, thread in group
    const int r = lane % 16, h = lane / 16; // what this lane fetches: row r, unit h of the pair
    const int64_t r0 = int64_t(blockIdx.x) * 16;
    const int t0 = blockIdx.y * MMA_NTILE * NTILES;
    // ldmatrix: lane i gives row i % 16 of the pair's first unit, its bytes 16 (i / 16)..
    const uint32_t q_addr = uint32_t(__cvta_generic_to_shared(&stages[0][warp].q[r][4 * h]));
    constexpr uint32_t STAGE_STRIDE = sizeof(WarpStage) * PAIR_WARPS * PARTS;  // stage 1's bytes past stage 0

    const int64_t row = min(r0 + r, p.rows.n_out() - 1);  // rows past n_out: computed, not stored
    const int seg = p.rows.find(row);
    const int n_units = p.n_in / 32, n_blocks = p.n_in / act_block_of(TYPE);
    const int n_groups = (n_units + SLOTS - 1) / SLOTS;
    const int k_begin = part_begin(part, n_groups, PARTS), k_end = part_begin(part + 1, n_groups, PARTS);
    const int slot = WARP_SLOTS * pair + h;  // this lane's unit in each group
    const uint8_t *wr = p.rows.w[seg] + (row - p.rows.start(seg)) * p.row_bytes + int64_t(group_bytes(TYPE)) * k_begin;

    const Codebook cb = load_codebook_lanes();
    RawUnit<TYPE> raw[UNROLL];
#pragma unroll
    for (int i = 0; i < UNROLL; ++i)
        if (k_begin + i < k_end && unit_in_row<TYPE>(k_begin + i, slot, n_units))
            fetch_group_unit<TYPE>(wr + int64_t(group_bytes(TYPE)) * i, slot, raw[i]);
    wait_for_inputs();  // the first weights are on their way while the previous kernel finishes

    const int u0 = SLOTS * k_begin + WARP_SLOTS * pair;  // the warp's first unit
    ActCursor<NTILES> cur = act_cursor<TYPE, NTILES>(p, t0, u0, n_units, n_blocks, g, tq);
    constexpr int dx_per_group = group_is_block(TYPE) ? 1 : SLOTS;
    ActLoads<TYPE, NTILES> acts[ACT_RING];  // groups k, k + 1, ... (32-element types: dx per unit, u0 its block)
#pragma unroll
    for (int i = 0; i < ACT_RING; ++i)
        if (k_begin + i < k_end) fetch_acts<TYPE, NTILES>(cur, i, n_units - (u0 + SLOTS * i), acts[i]);
    float acc[WARP_SLOTS][NTILES][4] = {};

    for (int k0 = k_begin; k0 < k_end; k0 += UNROLL) {
#pragma unroll
        for (int i = 0; i < UNROLL; ++i) {
            const int k = k0 + i;
            if (k >= k_end) break;
            Unit un;  // fields a type does not use stay unset: nothing reads them
            if (unit_in_row<TYPE>(k, slot, n_units)) decode_unit<TYPE>(raw[i], SLOTS * k + slot, cb, un);
            else un = Unit{};  // past a 32-element row's end: staged, never multiplied
            const int kn = k + UNROLL;
            if (kn < k_end && unit_in_row<TYPE>(kn, slot, n_units))
                fetch_group_unit<TYPE>(wr + group_bytes(TYPE) * (i + UNROLL), slot, raw[i]);
            ActLoads<TYPE, NTILES> &now = acts[i % ACT_RING];
            stage_and_multiply<TYPE>(un, k, pair, n_units, stages[i % STAGES][warp],
                                     q_addr + STAGE_STRIDE * (i % STAGES), now, acc);
            // Refilled only now: loading into registers still being read would make ptxas load
            // into others and copy, and the copy waits for the load (measured: a fifth of all stalls).
            if (k + ACT_RING < k_end)
                fetch_acts<TYPE, NTILES>(cur, i + ACT_RING, n_units - (SLOTS * (k + ACT_RING) + WARP_SLOTS * pair), now);
            if constexpr (STAGES == 1) __syncwarp();  // the next store overwrites the stage
        }
        // The pointers move once per UNROLL groups: inside, every offset is a constant.
        wr += group_bytes(TYPE) * UNROLL;
        advance(cur, UNROLL, dx_per_group);
    }

    reduce_and_store<PARTS>(p, r0, t0, pair, part, acc, red);
}

// ---- the same with the weights brought in by the copy engine (sm_90+) ---------------------------
//
// Why: in the kernel above each lane loads its row's unit from global memory itself, and a warp's
// 16 rows are 16 cache lines per load: ncu (H200, 2026-12-04, IQ4_XS 17408x5120 at 8 tokens) saw
// L1 throughput at 90% with 48 L1 tag lookups per warp and group (three 8-byte loads a unit,
// 4x the ideal sectors), DRAM at 19% and IMMA waiting on its operands. Here the copy engine
// brings the 16 rows' bytes of the next GROUPS groups (L1 untouched) into a ring of bulk_ring
// buffers in shared memory, and every warp reads its units from there: with one tensor-map
// request per buffer (tensor_serves, where the rows fit a 2D map) or one cp.async.bulk per row
// (bulk_serves). A buffer's barrier `full` completes when its bytes have landed; `empty` when the four
// warps have read it, after which it is refilled. Same units, same order, same bits.
//
// Rows of several parts give each part its own four warps and ring, as above; a row copy of any
// 2-byte alignment (Q6_K's 210-byte blocks) is the 16-byte-aligned window around the groups,
// which may reach 15 bytes past the tensor (upload_weight pads every weight by 16).
//
// Groups per copy. Four (two copies in flight) measured slower at 4 and 8 tokens (H200,
// 2026-12-04, IQ4_XS 34816x5120 at 8 tokens 68.5 against 51.4 us; 17408x5120 40.1 against 29.6).
constexpr int BULK_GROUPS = 2;

// Copies in flight per row and part: four where shared memory allows several blocks per SM (7 at
// one part, IQ4_XS; H200, 2026-12-04, IQ4_XS at 8 tokens, 34816x5120 with 4 / 3 / 2: 48.4 / 48.3
// / 49.1 us, 10240x5120 20.1 / 20.4 / 22.6), fewer for the larger rings of Q6_K and four parts.
template <int TYPE, int PARTS>
__host__ __device__ constexpr int bulk_ring() {
    return PARTS == 1 ? 4 : PARTS == 2 ? (TYPE == GGML_IQ4_XS ? 4 : 3) : 2;
}

// Bytes of one row's buffer: the window around GROUPS groups, plus 16 so that rows start 16
// bytes further round the banks (304 for IQ4_XS's two groups: lanes reading 8 bytes of rows r and
// r + 1 .. r + 7 hit different banks).
template <int TYPE, int GROUPS>
__host__ __device__ constexpr int bulk_row_bytes() {
    return bulk::max_window_bytes(group_bytes(TYPE) * GROUPS) + 16;
}

// Where the row copies serve: measured per shape against this file's first kernel (H200, 2026-12-04,
// gpu_check --only kernels with and without LUCE_GPU_BULK, us at 8 / 16 / 32 tokens): IQ4_XS
// 17408x5120 29.7 / 42.4 / 55.8 against 35.6 / 45.0 / 52.3, 34816x5120 51.1 / 74.9 / 105.3
// against 65.4 / 81.1 / 103.0, FFN down 5120x17408 (four parts) 37.0 / 55.8 / 70.2 against 43.1
// / 47.7 / 73.6; Q6_K ssm_out 5120x6144 (two parts) 14.9 / 25.1 / 44.2 against 19.2 / 30.8 /
// 43.9, attn_v 1024x5120 12.0 / 12.9 / 17.4 against 17.6 / 19.8 / 21.6. At 16 tokens the
// instances for four parts hold 111 registers a thread, one block of 512 per SM. Q5_K and Q8_0
// measured slower (32768x5120 Q5_K at 8 tokens 155.7 against 112.7) and keep the lanes' loads.
__host__ __device__ constexpr bool bulk_serves(int type, int parts, int ntiles) {
    if (type == GGML_IQ4_XS) return ntiles == 1 || (ntiles == 2 && parts < MAX_PARTS);
    return type == GGML_Q6_K && parts < MAX_PARTS;
}

// ALIGN: 128 where a tensor-map box lands in raw (the copy engine's rule for its destination).
template <int TYPE, int RING, int ALIGN>
struct alignas(ALIGN) BulkRing {
    uint8_t raw[RING][16][bulk_row_bytes<TYPE, BULK_GROUPS>()];
    uint64_t full[RING], empty[RING];
};

// The block's shared memory (dynamic: four parts need more than the 48 KB of static memory). One
// staging slice per warp (a __syncwarp before it is overwritten), not two as above: 31 KB a block
// at one part instead of 38, 7 blocks per SM instead of 5 (IQ4_XS 34816x5120 at 8 tokens 56.7 ->
// 48.4 us, 17408x5120 30.4 -> 28.4).
template <int TYPE, int PARTS, int ALIGN>
struct alignas(ALIGN) BulkShared {
    WarpStage stages[PAIR_WARPS * PARTS];
    BulkRing<TYPE, bulk_ring<TYPE, PARTS>(), ALIGN> ring[PARTS];
    float red[PARTS][SLOTS][4][32];
};

// Copy c of the part whose first group is at wp (groups GROUPS c .. of its n_groups, none past
// row_end): the 16-byte-aligned window's first byte and its length.
template <int TYPE, int GROUPS>
__device__ __forceinline__ uintptr_t bulk_window(const uint8_t *wp, const uint8_t *row_end, int c, int n_groups,
                                                 uint32_t &bytes) {
    const int k = GROUPS * c, n = min(GROUPS, n_groups - k);
    const uintptr_t a = reinterpret_cast<uintptr_t>(wp) + uintptr_t(group_bytes(TYPE)) * k;
    const uintptr_t end = min(a + uintptr_t(group_bytes(TYPE)) * n, reinterpret_cast<uintptr_t>(row_end));
    return bulk::aligned_window(a, end, bytes);
}

// Where one tensor-map request per buffer serves (H200, 2026-12-04, kernel bench, us):
// - IQ4_XS at every width and part count, where the row copies lost at 32 tokens and on four
//   parts at 16 (against the lanes' own loads: 34816x5120 at 32 tokens 83.1 / 102.5, 16480x5120
//   40.6 / 51.6, FFN down 5120x17408 at 16 41.6 / 47.6, at 32 53.1 / 73.2; verify 16 / 32 17.67
//   / 30.18 -> 16.71 / 26.08 ms);
// - Q5_K's rows of one part to 16 tokens (the lm head at a DFlash 2 step's 7-8 rows; 32768x5120
//   at 4 / 8 / 16 tokens 52.6 / 53.8 / 71.4 against the staged kernel's 94.1 / 95.9 / 141.9);
// - Q8_0 to 8 tokens, and to 16 on rows of four parts (a drafter's matmuls at its block's rows;
//   17408x5120 at 4 / 8 / 16 53.6 / 55.5 / 85.0 against the staged kernel's 68.6 / 71.4 / 75.5,
//   5120x17408 52.5 / 52.4 / 73.8 against 82.1 / 85.9 / 104.2).
__host__ __device__ constexpr bool tensor_serves(int type, int parts, int ntiles) {
    return type == GGML_IQ4_XS || (type == GGML_Q5_K && parts == 1 && ntiles <= 2) ||
           (type == GGML_Q8_0 && (ntiles == 1 || (ntiles == 2 && parts == MAX_PARTS)));
}

// Whether rows of n_in values of `type` suit a tensor map, whatever the launch's segments: whole
// 16-byte words (the map's stride) and whole groups (always for the 256-element types; the bulk
// kernel has no partial group, so Q8_0 rows that end mid-group keep the other kernels).
inline bool tensor_rows_fit(int type, int64_t n_in) {
    return quant_row_bytes(type, n_in) % 16 == 0 && n_in % (SLOTS * 32) == 0;
}

// How an instance brings its weights in: blocks per SM it is compiled for (0: no bound), and
// whether one tensor-map request fills a part's whole 16-row buffer (instead of 16 row copies).
template <int MIN_BLOCKS, bool TENSOR>
struct BulkPlan {
    static constexpr int min_blocks = MIN_BLOCKS, align = TENSOR ? 128 : 16;
    static constexpr bool tensor = TENSOR;
};
// IQ4_XS's 16-token instances on rows of one part are built for five blocks per SM: 96 registers
// instead of 110 and four blocks (H200, 2026-12-04, row copies, kernel bench at 16 tokens, us:
// 34816x5120 74.9 -> 70.7, 17408x5120 42.5 -> 38.5, 10240x5120 26.7 -> 22.7; verify 16 18.75 ->
// 18.21 ms). Six blocks (80 registers, one activation group in flight, 8 bytes spilled) measured
// no better: 68.4 / 38.8 / 24.7 us, verify 16 18.25 ms.
template <int TYPE, int NTILES, int PARTS>
constexpr int bulk_min_blocks() {
    return TYPE == GGML_IQ4_XS && NTILES == 2 && PARTS == 1 ? 5 : 0;
}

// The tensor maps of a launch's row segments (Plan::tensor): rows of row_bytes / 4 words.
struct SegmentMaps {
    bulk::TensorMap map[RowSegments::MAX];
    int box_bytes;  // a row's bytes in a box (tensor_box_bytes)
};

template <int TYPE, int NTILES, int PARTS, class Plan>
__global__ void __launch_bounds__(PAIR_WARPS * 32 * PARTS, Plan::min_blocks)
    matmul_mma_bulk_kernel(MmaArgs p, const __grid_constant__ SegmentMaps maps) {
    constexpr int GROUPS = BULK_GROUPS, RING = bulk_ring<TYPE, PARTS>();
    constexpr int ACT_RING = NTILES >= 4 ? 1 : 2;
    static_assert(GROUPS % ACT_RING == 0, "the activations' ring is indexed by the group in its copy");
    // Every unit of a group is in the row: the 256-element types, and Q8_0 rows of whole groups
    // (tensor_maps_fit).
    static_assert(group_is_block(TYPE) || (TYPE == GGML_Q8_0 && Plan::tensor), "whole groups only");
    static_assert(!Plan::tensor || group_bytes(TYPE) % 8 == 0, "a box's groups start 8-byte aligned (fetch_group_unit)");
    static_assert(!Plan::tensor || 16 * bulk_row_bytes<TYPE, GROUPS>() % 128 == 0, "every buffer 128-byte aligned");
    using Shared = BulkShared<TYPE, PARTS, Plan::align>;
    LUCE_DYNAMIC_SHARED_ALIGNED(uint8_t, bulk_shared, 128);  // no static shared memory: the window's start
    Shared &sh = *reinterpret_cast<Shared *>(bulk_shared);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, pair = warp % PAIR_WARPS, part = warp / PAIR_WARPS;
    const int g = lane / 4, tq = lane % 4, r = lane % 16, h = lane / 16;
    const int64_t r0 = int64_t(blockIdx.x) * 16;
    const int t0 = blockIdx.y * MMA_NTILE * NTILES;
    const uint32_t q_addr = uint32_t(__cvta_generic_to_shared(&sh.stages[warp].q[r][4 * h]));
    BulkRing<TYPE, RING, Plan::align> &ring = sh.ring[part];

    const int64_t row = min(r0 + r, p.rows.n_out() - 1);  // rows past n_out: computed, not stored
    const int seg = p.rows.find(row);
    const int n_units = p.n_in / 32, n_blocks = p.n_in / act_block_of(TYPE);
    const int n_groups = (n_units + SLOTS - 1) / SLOTS;
    const int k_begin = part_begin(part, n_groups, PARTS), k_end = part_begin(part + 1, n_groups, PARTS);
    const int part_groups = k_end - k_begin, n_copies = (part_groups + GROUPS - 1) / GROUPS;
    const int slot = WARP_SLOTS * pair + h;
    const uint8_t *wr = p.rows.w[seg] + (row - p.rows.start(seg)) * p.row_bytes;
    const uint8_t *wp = wr + int64_t(group_bytes(TYPE)) * k_begin, *row_end = wr + p.row_bytes;
    // With a tensor map lane 0 of the part's first warp copies all 16 rows; else lane r of warp
    // r / 4 copies row r. A warp issues copies one lane at a time (the copy takes uniform
    // operands: ~10 instructions a lane in SASS), so a warp issuing all 16 had ~160 more
    // instructions a copy than the three others, which waited for it (H200, 2026-12-04: verify
    // 8 / 16 12.86 / 18.21 -> 12.54 / 17.82 ms with the copies spread over the four warps).
    const bool producer = Plan::tensor ? pair == 0 && lane == 0 : lane < 16 && pair == lane / (16 / PAIR_WARPS);
    const int part_byte0 = group_bytes(TYPE) * k_begin;  // the part's first byte in a row

    if (threadIdx.x < PARTS) {
        for (int s = 0; s < RING; ++s) {
            bulk::barrier_init(&sh.ring[threadIdx.x].full[s], Plan::tensor ? 1 : 16);
            bulk::barrier_init(&sh.ring[threadIdx.x].empty[s], PAIR_WARPS);
        }
        bulk::barrier_init_fence();
    }
    __syncthreads();
    auto issue = [&](int c) {  // the weights are immutable: no wait for the previous kernel
        if constexpr (Plan::tensor) {  // rows r0.. of the block's segment (whole 16-row blocks: tensor_maps_fit)
            uint64_t *full = &ring.full[c % RING];
            bulk::arrive_expect_bytes(full, 16 * maps.box_bytes);
            const int box_x = ((part_byte0 + group_bytes(TYPE) * GROUPS * c) & ~15) / 4;  // in words
            bulk::copy_box_to_shared(ring.raw[c % RING], &maps.map[seg], box_x, int(r0 - p.rows.start(seg)), full);
        } else {
            uint32_t bytes;
            const uintptr_t src = bulk_window<TYPE, GROUPS>(wp, row_end, c, part_groups, bytes);
            uint64_t *full = &ring.full[c % RING];
            bulk::arrive_expect_bytes(full, bytes);
            bulk::copy_to_shared(ring.raw[c % RING][r], reinterpret_cast<const void *>(src), bytes, full);
        }
    };
    if (producer)
        for (int c = 0; c < RING && c < n_copies; ++c) issue(c);
    const Codebook cb = load_codebook_lanes();
    wait_for_inputs();

    const int u0 = SLOTS * k_begin + WARP_SLOTS * pair;  // the warp's first unit
    ActCursor<NTILES> cur = act_cursor<TYPE, NTILES>(p, t0, u0, n_units, n_blocks, g, tq);
    constexpr int dx_per_group = group_is_block(TYPE) ? 1 : SLOTS;
    ActLoads<TYPE, NTILES> acts[ACT_RING];
#pragma unroll
    for (int i = 0; i < ACT_RING; ++i)
        if (i < part_groups) fetch_acts<TYPE, NTILES>(cur, i, n_units - (u0 + SLOTS * i), acts[i]);
    float acc[WARP_SLOTS][NTILES][4] = {};

    for (int c = 0; c < n_copies; ++c) {
        const int b = c % RING;
        const uint32_t parity = (c / RING) & 1;
        bulk::wait(&ring.full[b], parity);
        const uint8_t *win;  // row r's first group of the copy
        if constexpr (Plan::tensor) {
            win = &ring.raw[b][0][0] + maps.box_bytes * r + ((part_byte0 + group_bytes(TYPE) * GROUPS * c) & 15);
        } else {
            uint32_t bytes;
            const uintptr_t first = reinterpret_cast<uintptr_t>(wp) + uintptr_t(group_bytes(TYPE)) * GROUPS * c;
            win = ring.raw[b][r] + (first - bulk_window<TYPE, GROUPS>(wp, row_end, c, part_groups, bytes));
        }
#pragma unroll
        for (int i = 0; i < GROUPS; ++i) {
            const int k = k_begin + GROUPS * c + i;
            if (k >= k_end) break;
            RawUnit<TYPE> raw;
            fetch_group_unit<TYPE>(win + group_bytes(TYPE) * i, slot, raw);
            Unit un;
            decode_unit<TYPE>(raw, SLOTS * k + slot, cb, un);
            ActLoads<TYPE, NTILES> &now = acts[i % ACT_RING];
            stage_and_multiply<TYPE>(un, k, pair, n_units, sh.stages[warp], q_addr, now, acc);
            if (k + ACT_RING < k_end)
                fetch_acts<TYPE, NTILES>(cur, i + ACT_RING, n_units - (SLOTS * (k + ACT_RING) + WARP_SLOTS * pair), now);
            __syncwarp();  // the next group's stores overwrite the stage
        }
        advance(cur, GROUPS, dx_per_group);
        if (lane == 0) bulk::arrive(&ring.empty[b]);
        if (producer && c + RING < n_copies) {
            bulk::wait(&ring.empty[b], parity);
            issue(c + RING);
        }
        __syncwarp();  // the producer's warp meets again before its next mma (.aligned)
    }
    reduce_and_store<PARTS>(p, r0, t0, pair, part, acc, sh.red);
}

// n-tiles of 8 tokens per block for a width of T tokens.
inline int frag_ntiles(int T) { return T <= 8 ? 1 : T <= 16 ? 2 : 4; }

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
        launch_kernel(matmul_mma_frag_kernel<TYPE, NTILES, UNROLL, PARTS>, grid, PAIR_WARPS * 32 * PARTS, 0, stream,
                      args<TYPE>());
    }

    // Whether one 2D box can take a block's 16 rows: rows of whole 16-byte words (the tensor
    // map's stride) and of whole groups (Q8_0: the bulk kernel has no partial group), segments
    // starting on 16-byte boundaries and on whole 16-row blocks.
    template <int TYPE>
    bool tensor_maps_fit() const {
        bool fit = tensor_rows_fit(TYPE, n_in);
        for (int s = 0; s < rows.n; ++s)
            fit = fit && rows.start(s) % 16 == 0 && reinterpret_cast<uintptr_t>(rows.w[s]) % 16 == 0;
        return fit;
    }

    // A row's bytes in the launch's tensor-map boxes (bulk::box_bytes). A part may start mid-word
    // (FFN down's four parts start at groups 17, 34, 51 of 136 bytes), and its boxes then start at
    // the word below. Widths of an odd number of 16-byte words: 272 bytes (17 words) measured 24.4
    // us on IQ4_XS 17408x5120 at 8 tokens, 288 (18) 29.2 (H200, 2026-12-04).
    template <int TYPE, int PARTS>
    int tensor_box_bytes() const {
        const int span = group_bytes(TYPE) * BULK_GROUPS, n_groups = int((n_in / 32 + SLOTS - 1) / SLOTS);
        int lead = 0;  // the most a copy's first byte lies past a 16-byte boundary
        for (int part = 1; part < PARTS; ++part) lead = std::max(lead, part_begin(part, n_groups, PARTS) * group_bytes(TYPE) % 16);
        return bulk::box_bytes(span, span % 16 ? 15 : lead);
    }

    template <int TYPE, int PARTS, class Plan>
    SegmentMaps segment_maps() const {
        SegmentMaps maps{};
        if constexpr (Plan::tensor) {
            const int64_t row_words = quant_row_bytes(TYPE, n_in) / 4;
            maps.box_bytes = tensor_box_bytes<TYPE, PARTS>();
            if (maps.box_bytes > bulk_row_bytes<TYPE, BULK_GROUPS>())
                fail(LUCE_ERR_INTERNAL, "matmul_mma_frag: a %d-byte box overflows its buffer", maps.box_bytes);
            for (int s = 0; s < rows.n; ++s)
                if (!bulk::encode_rows_map(maps.map[s], rows.w[s], uint64_t(row_words), uint64_t(rows.end[s] - rows.start(s)),
                                           uint32_t(maps.box_bytes / 4), 16))
                    fail(LUCE_ERR_DEVICE, "the driver refused a tensor map of %lld rows",
                         static_cast<long long>(rows.end[s] - rows.start(s)));
        }
        return maps;
    }

    template <int TYPE, int NTILES, int PARTS, class Plan>
    void launch_bulk_as() const {
        const auto kernel = matmul_mma_bulk_kernel<TYPE, NTILES, PARTS, Plan>;
        constexpr size_t shared = sizeof(BulkShared<TYPE, PARTS, Plan::align>);
        // Once per instance and process (luce drives one GPU), before any graph capture: a step
        // runs eagerly before it is captured.
        static bool attribute_set = false;
        if (!attribute_set) {
            LUCE_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
            attribute_set = true;
        }
        const int toks = MMA_NTILE * NTILES;
        const dim3 grid(unsigned((rows.n_out() + 15) / 16), unsigned((T + toks - 1) / toks));
        launch_kernel(kernel, grid, PAIR_WARPS * 32 * PARTS, shared, stream, args<TYPE>(), segment_maps<TYPE, PARTS, Plan>());
    }

    template <int TYPE>
    MmaArgs args() const {
        return MmaArgs{rows, quant_row_bytes(TYPE, n_in), int(n_in), a.q, a.d, a.s16, T, a.qf, a.df, a.sf};
    }

    // Units in flight per lane: four, two for the large raw units of the K-quants and Q6_K (for
    // IQ4_XS, six and eight measured against four: better on some shapes, worse on others, e.g.
    // at 16 tokens 17408x5120 42 / 42 us against 46 but 16480x5120 41 / 41 against 36: H200,
    // 2026-12-04). Rows of several parts put each part on its own four warps.
    template <int TYPE, int NTILES>
    void launch() const {
        constexpr int UNROLL = TYPE == GGML_IQ4_XS || TYPE == GGML_Q8_0 || legacy_4bit(TYPE) ? 4 : 2;
        with_row_parts(int(n_in), [&](auto parts) {
            constexpr int PARTS = decltype(parts)::value;
            constexpr int MIN_BLOCKS = bulk_min_blocks<TYPE, NTILES, PARTS>();
            if constexpr (tensor_serves(TYPE, PARTS, NTILES)) {
                if (frag_bulk_copies && frag_bulk_tensor && tensor_maps_fit<TYPE>())
                    return launch_bulk_as<TYPE, NTILES, PARTS, BulkPlan<MIN_BLOCKS, true>>();
            }
            if constexpr (bulk_serves(TYPE, PARTS, NTILES)) {
                if (frag_bulk_copies) return launch_bulk_as<TYPE, NTILES, PARTS, BulkPlan<MIN_BLOCKS, false>>();
            }
            launch_with<TYPE, NTILES, UNROLL, PARTS>();
        });
    }

    template <int TYPE>
    void operator()() const {
        if constexpr (act_block_of(TYPE) == 0) {
            fail(LUCE_ERR_INTERNAL, "mma matmul called for float type %d", TYPE);
        } else {
            switch (frag_ntiles(T)) {
            case 1: return launch<TYPE, 1>();
            case 2: return launch<TYPE, 2>();
            default: return launch<TYPE, 4>();
            }
        }
    }
};

}  // namespace

// The 1-3-bit types but Q3_K: small units whose decode (codebook lookups, signs) the staged
// kernel's block-wide waits leave exposed. Kernel bench of an H100 (cold weights; 2026-12-07),
// 17408x5120 unless said, fragment against staged at 8 / 16 / 32 / 64 tokens: IQ2_XXS 41.9 /
// 48.5 / 61.7 / 114.9 us against 64.8 / 67.7 / 117.4 / 223.1; IQ2_XS 69.7 / 80.1 / 89.2 / 162.4
// against 102.5 / 105.9 / 158.0 / 291.5; IQ3_XXS 44.8 / 50.9 / 64.0 / 124.5 against 66.8 / 67.9
// / 121.1 / 223.0; IQ3_S 5120x17408 54.7 / 56.6 / 80.6 / 133.7 against 97.5 / 123.0 / 125.9 /
// 304.1; Q2_K 48.1 / 56.9 / 108.5 / 188.0 against 60.4 / 93.7 / 143.6 / 328.4; IQ1_S, IQ1_M and
// IQ2_S likewise. Q3_K is slower here (181.4 / 183.2 / 189.9 / 350.3 against 136.2 / 151.7 /
// 187.8 / 347.0).
// Q4_K: faster on rows of one part at every width (10240x5120: 25.8 / 39.6 / 58.2 / 94.3 against
// 34.9 / 63.6 / 99.8 / 167.7), on rows of four parts up to 16 tokens only (5120x17408: 55.2 /
// 72.7 / 250.0 / 443.9 against 89.7 / 97.3 / 216.4 / 346.4: the four-part instances spill past
// 16 tokens). Q5_K on rows of one part past the tensor-map copies' widths too (17408x5120 at 32 /
// 64: 105.9 / 191.5 against 164.5 / 332.1).
static bool small_units(int type) {
    switch (type) {
        case GGML_IQ1_S: case GGML_IQ1_M: case GGML_IQ2_XXS: case GGML_IQ2_XS: case GGML_IQ2_S:
        case GGML_IQ3_XXS: case GGML_IQ3_S: case GGML_Q2_K: return true;
        default: return false;
    }
}

// From the kernel bench of an H200 (cold weights, each call on its own copy as in a model step;
// 2026-12-04, this kernel with ldmatrix and per-group scales, against dp4a / the staged kernel):
// IQ4_XS faster from 4 tokens (17408x5120 at 4 / 8 / 16 / 32 tokens: 35 / 35 / 46 / 54 us against
// dp4a's 53 at 4 and the staged kernel's 59 / 64 / 116 from 8; 34816x5120 at 8: 71 against 91);
// Q6_K faster on rows of one part (attn_v, 1024x5120: 23 / 25 / 29 at 8 / 16 / 32 tokens against
// 24 / 28 / 32) but on ssm_out's rows of two parts only past 16 tokens (5120x6144: 43 / 47 / 55
// against 37 / 45 / 90); Q5_K and Q8_0 slower (their raw units are large: two in flight per
// lane). The kernels give the same bits, so this only picks the faster. The backend asks from
// MMA_MIN_TOKENS up (backend_gpu.cu). With the bulk copies (sm_90+) Q6_K's rows of two parts
// are faster here at every width too (ssm_out at 8 tokens 14.9 us against the staged kernel's
// 35.1; bulk_serves), and so are Q5_K and Q8_0 where the tensor-map copies serve them
// (tensor_serves).
bool mma_frag_serves(int type, int64_t n_in, int T) {
    if (T > MMA_FRAG_MAX_TOKENS) return false;
    if (type == GGML_IQ4_XS || small_units(type)) return true;
    const int parts = int8_units::row_parts(int(n_in));
    // The legacy 32-element types: one n-tile, and rows of four parts to 16 tokens (H200 kernel
    // bench, 2026-12-07, fragment against staged, us: Q4_0 10240x5120 at 4 / 8 / 16 tokens 29.5 /
    // 29.4 / 59.8 against 38.9 / 39.7 / 39.2; 17408x5120 57.2 / 57.4 / 89.9 against 58.0 / 61.0 /
    // 74.4; 5120x17408 71.6 / 71.5 / 92.3 against 77.8 / 81.3 / 109.6; IQ4_NL 17408x5120 55.8 /
    // 55.9 / 94.9 against 59.1 / 60.9 / 64.3; Q5_0 and Q4_1 alike).
    if (int8_units::legacy_4bit(type)) return T <= 8 || (parts == int8_units::MAX_PARTS && T <= 16);
    if (type == GGML_Q4_K) return parts == 1 || T <= 16;
    if (type == GGML_Q5_K && parts == 1) return true;
    if (type == GGML_Q6_K && frag_bulk_copies && bulk_serves(type, parts, frag_ntiles(T))) return true;
    // Q5_K and Q8_0 where the tensor-map copies serve them (by the rule the launch applies, so
    // they never land on this file's slower first kernel; segments are whole 16-row blocks and
    // 16-byte aligned in every model).
    if ((type == GGML_Q5_K || type == GGML_Q8_0) && frag_bulk_copies && frag_bulk_tensor &&
        tensor_rows_fit(type, n_in) && tensor_serves(type, parts, frag_ntiles(T)))
        return true;
    return type == GGML_Q6_K && (parts == 1 || T > 16);
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
