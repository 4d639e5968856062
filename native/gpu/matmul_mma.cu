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
// (|dot| < 2^20), and each (row, token) output applies the unit's scales with apply_dots
// (int8_units.cuh, shared with the dp4a kernel) then sums units in an order fixed by the row
// alone: warp w of the block takes the unit pairs (2p, 2p + 1), p = w, w + MMA_WARPS, ..., in
// increasing p, and the warps' partial sums are added in warp order. Neither T, nor the pass, nor
// the token's column in the tile enters that order, so the result of token t does not depend on
// which other tokens share the step.
//
// Work split: a block of MMA_WARPS warps (4 or 8, by the weight's shape) owns MMA_ROWS (16) rows
// x up to 32 tokens. Per unit pair, lane l stages unit (2p + l / 16) of row (l % 16) (load_qunit: one lane per row, the two halves
// of the warp read the adjacent 16-byte halves of a 32-byte run for IQ4_XS) into shared memory,
// from where each lane picks its mma fragment words (PTX ISA, "Matrix Fragments for mma.m16n8k32").
#include "int8_units.cuh"
#include "kernels.h"
#include "quant_blocks.cuh"

namespace luce::gpu {

#if !defined(LUCE_HIP)

namespace {

using namespace int8_units;

constexpr int MMA_ROWS = 16;    // the mma's M
constexpr int MMA_NTILE = 8;    // the mma's N: tokens per n-tile
constexpr int MMA_MAX_NTILES = 4;  // tokens per pass: 32

// One row's staged unit: 12 words, so the fragment reads (row g, word tq) of a warp hit 32
// different banks (g * 12 + tq covers 0..31 for g < 8, tq < 4).
struct alignas(16) StagedRow {
    uint32_t q[8];
    UnitScales s;
};
static_assert(sizeof(StagedRow) == 48, "StagedRow must stay 12 words (bank layout)");

// D = A (16x32 s8, row) x B (32x8 s8, col), fresh accumulator.
__device__ __forceinline__ void mma_k32(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                        int (&d)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    __trap();  // the host never launches this below sm_80 (mma_matmul_supported)
#endif
}

// D = A (16x16 s8, row) x B (16x8 s8, col): Q6_K needs the dot of each 16-element half.
__device__ __forceinline__ void mma_k16(uint32_t a0, uint32_t a1, uint32_t b0, int (&d)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

// Unit u of one row as staged in shared memory; zeros for rows past n_out and a missing odd unit.
template <int TYPE>
__device__ __forceinline__ StagedRow stage_unit(const uint8_t *row, bool row_ok, int u, int n_units) {
    StagedRow st{};
    if (row_ok && u < n_units) {
        Unit un;
        load_qunit<TYPE>(row, u, un);
#pragma unroll
        for (int i = 0; i < 8; ++i) st.q[i] = un.q[i];
        st.s = un.s;
    }
    return st;
}

template <int TYPE, int NTILES, int MMA_WARPS>
__global__ void __launch_bounds__(MMA_WARPS * 32)
    matmul_mma_kernel(const uint8_t *w, int64_t row_bytes, int n_in, int64_t n_out, const int8_t *xq, const float *xd,
                      const int16_t *xs, int act_block, int T, float *y, int64_t ldy) {
    constexpr int TOKS = NTILES * MMA_NTILE;
    __shared__ StagedRow stage[MMA_WARPS][2][MMA_ROWS];
    __shared__ float partial[MMA_WARPS][TOKS][MMA_ROWS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, tq = lane % 4;  // fragment coordinates: groupID, thread in group
    const int64_t r0 = int64_t(blockIdx.x) * MMA_ROWS;
    const int t0 = blockIdx.y * TOKS;
    const int n_units = n_in / 32, n_blocks = n_in / act_block, units_per_block = act_block / 32;
    const int ld_half = lane / 16, ld_row = lane % 16;  // this lane's staging job
    const bool ld_row_ok = r0 + ld_row < n_out;
    const uint8_t *ld_ptr = w + (ld_row_ok ? r0 + ld_row : 0) * row_bytes;

    float acc[NTILES][4];
#pragma unroll
    for (int j = 0; j < NTILES; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

    // The lane's next unit is loaded while the current pair is multiplied (two pairs' weight
    // loads in flight per warp at decode, where nothing else hides DRAM latency).
    constexpr int PAIR_STRIDE = 2 * MMA_WARPS;
    StagedRow next = stage_unit<TYPE>(ld_ptr, ld_row_ok, 2 * warp + ld_half, n_units);
    for (int u0 = 2 * warp; u0 < n_units; u0 += PAIR_STRIDE) {
        stage[warp][ld_half][ld_row] = next;
        if (u0 + PAIR_STRIDE < n_units) next = stage_unit<TYPE>(ld_ptr, ld_row_ok, u0 + PAIR_STRIDE + ld_half, n_units);
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int u = u0 + h;
            if (u >= n_units) break;  // warp-uniform
            const StagedRow &ra = stage[warp][h][g], &rb = stage[warp][h][g + 8];
            const uint32_t a0 = ra.q[tq], a1 = rb.q[tq], a2 = ra.q[tq + 4], a3 = rb.q[tq + 4];
            const UnitScales sa = ra.s, sb = rb.s;
#pragma unroll
            for (int j = 0; j < NTILES; ++j) {
                const int tok_b = t0 + j * MMA_NTILE + g;  // B fragment column
                uint32_t b0 = 0, b1 = 0;
                if (tok_b < T) {
                    const uint32_t *xp = reinterpret_cast<const uint32_t *>(xq + int64_t(tok_b) * n_in + 32 * int64_t(u));
                    b0 = xp[tq];
                    b1 = xp[tq + 4];
                }
                int lo[4], hi[4];
                if constexpr (TYPE == GGML_Q6_K) {
                    mma_k16(a0, a1, b0, lo);
                    mma_k16(a2, a3, b1, hi);
                } else {
                    mma_k32(a0, a1, a2, a3, b0, b1, lo);
#pragma unroll
                    for (int c = 0; c < 4; ++c) hi[c] = 0;
                }
#pragma unroll
                for (int c = 0; c < 4; ++c) {  // C fragment: row g (c < 2) or g + 8, token 2 tq + c % 2
                    const int tok = t0 + j * MMA_NTILE + 2 * tq + c % 2;
                    if (tok >= T) continue;
                    const float dx = xd[int64_t(tok) * n_blocks + u / units_per_block];
                    const int16_t *sp = xs + int64_t(tok) * (n_in / 16) + 2 * u;
                    acc[j][c] = apply_dots<TYPE>(c < 2 ? sa : sb, lo[c], hi[c], dx, sp[0], sp[1], acc[j][c]);
                }
            }
        }
        __syncwarp();  // the next pair overwrites this warp's stage
    }

#pragma unroll
    for (int j = 0; j < NTILES; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) partial[warp][j * MMA_NTILE + 2 * tq + c % 2][c < 2 ? g : g + 8] = acc[j][c];
    __syncthreads();
    for (int i = threadIdx.x; i < TOKS * MMA_ROWS; i += blockDim.x) {
        const int col = i / MMA_ROWS, row = i % MMA_ROWS;  // consecutive threads: consecutive rows of y
        float s = partial[0][col][row];
#pragma unroll
        for (int k = 1; k < MMA_WARPS; ++k) s += partial[k][col][row];
        if (r0 + row < n_out && t0 + col < T) y[int64_t(t0 + col) * ldy + r0 + row] = s;
    }
}

struct MmaLaunch {
    cudaStream_t stream;
    const Weight &w;
    const ActScratch &a;
    int T;
    float *y;
    int64_t ldy;

    template <int TYPE, int NTILES, int MMA_WARPS>
    void launch_with() const {
        constexpr int toks = NTILES * MMA_NTILE;
        const dim3 grid(unsigned((w.n_out + MMA_ROWS - 1) / MMA_ROWS), unsigned((T + toks - 1) / toks));
        const int64_t row_bytes = w.n_in / block_elems(TYPE) * block_bytes(TYPE);
        matmul_mma_kernel<TYPE, NTILES, MMA_WARPS><<<grid, MMA_WARPS * 32, 0, stream>>>(
            static_cast<const uint8_t *>(w.data), row_bytes, int(w.n_in), w.n_out, a.q, a.d, a.s16,
            act_block_of(TYPE), T, y, ldy);
        LUCE_GPU_LAUNCHED();
    }

    // The warps per row tile set the summation order, so they depend on the weight's shape only,
    // never on T. Fewer row tiles than ~8 per SM leave decode latency-bound: split their units
    // over more warps. (A guess from occupancy arithmetic, to be tuned on the device.)
    template <int TYPE, int NTILES>
    void launch() const {
        if (w.n_out >= 12288) launch_with<TYPE, NTILES, 4>();
        else launch_with<TYPE, NTILES, 8>();
    }

    template <int TYPE>
    void operator()() const {
        if constexpr (act_block_of(TYPE) == 0) {
            fail(LUCE_ERR_INTERNAL, "mma matmul called for float type %d", TYPE);
        } else {
            // Fewer n-tiles only skip all-padding mmas: the per-(row, token) arithmetic is the same.
            if (T <= 8) launch<TYPE, 1>();
            else if (T <= 16) launch<TYPE, 2>();
            else if (T <= 24) launch<TYPE, 3>();
            else launch<TYPE, MMA_MAX_NTILES>();
        }
    }
};

}  // namespace

bool mma_matmul_supported(int cc_major) { return cc_major >= 8; }

void matmul_mma(cudaStream_t stream, const Weight &w, int T, float *y, int64_t ldy, const ActScratch &a) {
    const int block = act_block_of(w.type);
    if (block == 0 || w.n_in % block != 0 || w.n_in % 32 != 0 || w.n_in > INT32_MAX || T < 1 || T > 65535 * 32)
        fail(LUCE_ERR_INTERNAL, "matmul_mma: type %d, n_in %lld, T %d", w.type, (long long)w.n_in, T);
    MmaLaunch launch{stream, w, a, T, y, ldy};
    if (!dispatch_type(w.type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU matmul for ggml type %d", w.type);
}

#else  // HIP keeps the dp4a kernel (matmul_int8.cu)

bool mma_matmul_supported(int) { return false; }

void matmul_mma(cudaStream_t, const Weight &w, int, float *, int64_t, const ActScratch &) {
    fail(LUCE_ERR_UNSUPPORTED, "matmul_mma: no tensor-core int8 matmul on HIP (type %d)", w.type);
}

#endif

}  // namespace luce::gpu
