// matmul_int8.cu — y = W x for quantized W with int8 activations: the GPU twin of the CPU fast
// path (native/src/quants_kernels.h, QuantizedActs).
//
// Why int8 activations: a 4-bit weight dequantized to fp32 costs a multiply-add per weight and
// token; with the activations quantized once per matmul (blocks of 32 for Q8_0, 256 for the K and
// IQ types: d = amax / 127, q = rint(x * 127 / amax)), four weights meet four activations in one
// dp4a, and the per-block scales are applied once per 32 elements. The contract is the CPU's to
// the bit, so the integer part of every dot product is identical on both backends and GPU and
// CPU logits differ only by fp32 summation order.
//
// Work split: eight lanes per output row, lane slot s = lane % 8 taking the units u = s, s + 8, ...
// (int8_units.cuh's SLOTS contract), so the eight lanes of a row read one 256-element block's
// eight units side by side. Each loaded unit serves NT tokens. Every (row, token) output is summed
// in the contract's order whatever T and wherever the token sits in its tile, so a verify row is
// bit-identical to the decode step of the same token: speculative decoding's exactness rests on
// that, and the tensor-core kernel (matmul_mma.cu) keeps the same order.
#include "kernels.h"
#include "act_quant.cuh"
#include "int8_units.cuh"
#include "quant_blocks.cuh"

namespace luce::gpu {

namespace {

using namespace int8_units;

// ---- int8 helpers ------------------------------------------------------------------------------

// c + the dot of a's and b's four signed bytes: one instruction where the device has it. AMD's
// compiler does not find it in the byte-by-byte form (gfx1030 ISA from hipcc 5.2: byte extracts
// and 24-bit multiply-adds, no dot instruction), so RDNA's are asked for by name: v_dot4_i32_iu8
// (signed x signed) on RDNA3/3.5/4, v_dot4c_i32_i8 on RDNA2 (both seen in hipcc's ISA for gfx1100
// and gfx1030). The byte-by-byte form stays for other AMD parts and the emulator.
__device__ __forceinline__ int dot4(int a, int b, int c) {
#if defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) || \
    defined(__gfx1150__) || defined(__gfx1151__) || defined(__gfx1152__) || defined(__gfx1200__) || defined(__gfx1201__)
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#elif defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) || defined(__gfx1034__) || \
    defined(__gfx1035__) || defined(__gfx1036__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#elif defined(LUCE_HIP)
    const int8_t *pa = reinterpret_cast<const int8_t *>(&a), *pb = reinterpret_cast<const int8_t *>(&b);
    return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#else
    return __dp4a(a, b, c);
#endif
}

// acc += this unit . (token's quantized activations): dp4a dots of each 16-element half.
template <int TYPE>
__device__ __forceinline__ float apply_unit(const Unit &un, const int4 (&x)[2], float dx, int sum_lo, int sum_hi,
                                            float acc) {
    const int xw[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
    int lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) lo = dot4(int(un.q[i]), xw[i], lo);
#pragma unroll
    for (int i = 4; i < 8; ++i) hi = dot4(int(un.q[i]), xw[i], hi);
    return apply_dots<TYPE>(un.s, lo, hi, dx, sum_lo, sum_hi, acc);
}

// ---- kernels -----------------------------------------------------------------------------------

// One activation block per thread block of one warp (act_quant.cuh).
__global__ void quantize_acts_kernel(const float *x, int block, FusedQuant out) {
    wait_for_inputs();
    out.block_at(x, blockIdx.x);
}

// acc[t] += unit u of the row . token t0 + t's activations, for the tile's tokens below T.
template <int TYPE, int NT>
__device__ __forceinline__ void apply_tokens(const Unit &un, int u, int t0, int T, int n_in, const int8_t *xq,
                                             const float *xd, const int16_t *xs, float (&acc)[NT]) {
    constexpr int units_per_block = act_block_of(TYPE) / 32;  // a compile-time divisor
    const int n_blocks = n_in / act_block_of(TYPE);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const int tok = t0 + t;
        if (NT > 1 && tok >= T) break;  // one-token tiles: grid.y == T
        const int4 *xp = reinterpret_cast<const int4 *>(xq + int64_t(tok) * n_in + 32 * u);
        const int4 x[2] = {xp[0], xp[1]};
        const float dx = xd[int64_t(tok) * n_blocks + u / units_per_block];
        const int16_t *sp = xs + int64_t(tok) * (n_in / 16) + 2 * u;
        acc[t] = apply_unit<TYPE>(un, x, dx, sp[0], sp[1], acc[t]);
    }
}

constexpr int MATMUL_THREADS = 128;
// Decode launches blocks of 8 rows: on an H200 (2026-12-03, 17408x5120 IQ4_XS) 16-row blocks left
// a second, partial wave (1088 blocks, 7 resident per SM) and 32% achieved occupancy of 44%.
constexpr int DECODE_THREADS = 64;

// One-token launches of Q6_K rows in two parts (the 27B's ssm_out, 5120 x 6144: 1280 blocks)
// are held to 96 registers, 10 blocks of DECODE_THREADS per SM (the bound counts blocks of
// MATMUL_THREADS): at 127 registers 8 fit, 1.21 waves on a 132-SM H200 (2026-12-04: 16.0 ->
// 14.8 us). Tried on IQ4_XS's 17408 x 5120 (2176 blocks, 1.03 waves at 16 per SM): 17 per SM
// needed 56 registers, and the spills cost more (19.5 -> 23.7 us). 0: no bound (an explicit 1
// changes ptxas's register choices).
// Q6_K rows of one part (at most 23 units a lane; the 27B's attn_v, 1024 x 5120, is 20: 128
// launch blocks) fetch 20 units at once, 216 registers and no spills: its few lanes cannot hide
// DRAM latency over rounds (H200, 2026-12-04, kernel bench: 15.7 us at 4, 11.7 at 8, 11.1 at
// 10, 10.2 at 12, 6.8 at 20).
constexpr int ONE_PART_Q6_UNROLL = 20;

template <int TYPE, int NT, int PARTS>
constexpr int min_blocks_per_sm() {
    return NT == 1 && TYPE == GGML_Q6_K && PARTS == 2 ? 10 * DECODE_THREADS / MATMUL_THREADS : 0;
}

// Each lane keeps UNROLL units in flight: it decodes one fetched unit, fetches its successor
// (UNROLL * SLOTS units on) into the freed registers, then applies it, so DRAM always has the
// next round's loads while the current one is computed. A row takes SLOTS * PARTS lanes: lane
// slot + SLOTS * part sums slot `slot` of part `part` (int8_units.cuh).
template <int TYPE, int NT, int UNROLL, int PARTS>
__global__ void __launch_bounds__(MATMUL_THREADS, (min_blocks_per_sm<TYPE, NT, PARTS>()))
    matmul_int8_kernel(RowSegments rows, int64_t row_bytes, int n_in, const int8_t *xq, const float *xd,
                       const int16_t *xs, int T) {
    constexpr int ROW_LANES = SLOTS * PARTS;
    const int slot = threadIdx.x % SLOTS, part = threadIdx.x / SLOTS % PARTS;
    const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / ROW_LANES;
    // Rows past the end (the last block's) compute row 0 and store nothing: the whole group of
    // lanes stays in the shuffles.
    const bool row_ok = row < rows.n_out();
    const int seg = rows.find(row_ok ? row : 0);
    const int64_t local = (row_ok ? row : 0) - rows.start(seg);
    const uint8_t *wr = rows.w[seg] + local * row_bytes;
    const int t0 = blockIdx.y * NT;
    const int n_units = n_in / 32, n_groups = (n_units + SLOTS - 1) / SLOTS;
    const int u_begin = SLOTS * part_begin(part, n_groups, PARTS) + slot;
    const int u_end = min(n_units, SLOTS * part_begin(part + 1, n_groups, PARTS));
    constexpr int STRIDE = SLOTS * UNROLL;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    const Codebook cb = load_codebook();
    RawUnit<TYPE> raw[UNROLL];
#pragma unroll
    for (int i = 0; i < UNROLL; ++i)
        if (u_begin + SLOTS * i < u_end) fetch_unit<TYPE>(wr, u_begin + SLOTS * i, raw[i]);
    wait_for_inputs();  // the first weights are on their way while the previous kernel finishes
    for (int u0 = u_begin; u0 < u_end; u0 += STRIDE) {
#pragma unroll
        for (int i = 0; i < UNROLL; ++i) {
            const int u = u0 + SLOTS * i;
            if (u >= u_end) break;
            Unit un;
            decode_unit<TYPE>(raw[i], u, cb, un);
            if (u + STRIDE < u_end) fetch_unit<TYPE>(wr, u + STRIDE, raw[i]);
            apply_tokens<TYPE, NT>(un, u, t0, T, n_in, xq, xd, xs, acc);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float s = fold_parts_lanes<PARTS>(slot_tree_lanes(acc[t]));
        if (slot == 0 && part == 0 && row_ok && t0 + t < T) rows.y[seg][int64_t(t0 + t) * rows.ldy[seg] + local] = s;
    }
}

struct Int8Launch {
    cudaStream_t stream;
    int64_t n_in;
    const RowSegments &rows;
    const ActScratch &a;
    int T;

    template <int TYPE, int NT, int UNROLL, int PARTS>
    void launch_parts() const {
        const int threads = NT == 1 ? DECODE_THREADS : MATMUL_THREADS, rows_per_block = threads / (SLOTS * PARTS);
        const dim3 grid(unsigned((rows.n_out() + rows_per_block - 1) / rows_per_block), unsigned((T + NT - 1) / NT));
        const int64_t row_bytes = quant_row_bytes(TYPE, n_in);
        launch_kernel(matmul_int8_kernel<TYPE, NT, UNROLL, PARTS>, grid, threads, 0, stream, rows, row_bytes, int(n_in),
                      a.q, a.d, a.s16, T);
    }

    template <int TYPE, int NT, int UNROLL>
    void launch() const {
        with_row_parts(int(n_in), [&](auto parts) { launch_parts<TYPE, NT, UNROLL, decltype(parts)::value>(); });
    }

    // Decode keeps four units per lane in flight (eight on long rows, whose matrices have few
    // rows: fewer lanes to spread the loads over; two for Q4_K / Q5_K, whose raw units are
    // large, and for the 1-3-bit types that decode_unit reads in place (int8_units.cuh); for Q6_K a whole row's worth on rows of one part, four on longer ones, which spill
    // at eight under min_blocks_per_sm's bound);
    // wider steps keep two and apply each to a tile of up to 32 tokens: 2, 4, 8, 16 or 32, the
    // smallest that holds the step, so every verify width reads each weight once (HIP, which has
    // no tensor-core kernel here, runs this kernel at every width; tiles of eight re-read the
    // weights two to four times at 16-32 tokens). Prompt chunks wider than 32 take tiles of 32.
    // On CUDA the tensor-core kernels serve from MMA_MIN_TOKENS up, and this path only under
    // LUCE_GPU_MATMUL=dp4a.
    template <int TYPE>
    void operator()() const {
        if constexpr (act_block_of(TYPE) == 0) {
            fail(LUCE_ERR_INTERNAL, "int8 matmul called for float type %d", TYPE);
        } else {
            constexpr bool light = TYPE == GGML_IQ4_XS || TYPE == GGML_Q8_0 || legacy_4bit(TYPE) || lowbit_fetched(TYPE);
            if (T == 1) {
                if constexpr (light) {
                    // FFN down's rows (17 units a lane) in two rounds of 9 + 8 instead of 8 + 8 + 1
                    // measured slower: 19.9 -> 20.5 us on 5120x17408 (H200, 2026-12-05).
                    if (n_in >= 8192) launch<TYPE, 1, 8>();
                    else launch<TYPE, 1, 4>();
                } else if constexpr (TYPE == GGML_Q6_K) {
                    if (row_parts(int(n_in)) == 1) launch_parts<TYPE, 1, ONE_PART_Q6_UNROLL, 1>();
                    else launch<TYPE, 1, 4>();
                } else {
                    launch<TYPE, 1, 2>();
                }
            } else if (T == 2) launch<TYPE, 2, 2>();
            else if (T <= 4) launch<TYPE, 4, 2>();
            else if (T <= 8) launch<TYPE, 8, 2>();
            else if (T <= 16) launch<TYPE, 16, 2>();
            else launch<TYPE, 32, 2>();
        }
    }
};

}  // namespace

namespace {

// One copy's regions for T tokens: q [T][n_in], d [T][n_in / 32] (Q8_0's blocks, the most), s16
// [T][n_in / 16]; each 256-byte aligned.
int64_t up256(int64_t n) { return (n + 255) / 256 * 256; }
int64_t q_bytes(int64_t n_in, int64_t T) { return up256(T * n_in); }
int64_t d_bytes(int64_t n_in, int64_t T) { return up256(T * (n_in / 32) * int64_t(sizeof(float))); }
int64_t s_bytes(int64_t n_in, int64_t T) { return up256(T * (n_in / 16) * int64_t(sizeof(int16_t))); }
int64_t copy_bytes(int64_t n_in, int64_t T) { return q_bytes(n_in, T) + d_bytes(n_in, T) + s_bytes(n_in, T); }
int64_t frag_tokens(int T) { return (int64_t(T) + 7) / 8 * 8; }  // whole tiles of 8

}  // namespace

int64_t act_scratch_bytes(int64_t n_in, int T, bool frag) {
    return copy_bytes(n_in, T) + (frag ? copy_bytes(n_in, frag_tokens(T)) : 0);
}

ActScratch act_scratch_at(void *base, int64_t n_in, int T, bool frag) {
    auto *p = static_cast<uint8_t *>(base);
    ActScratch a;
    a.n_in = n_in;
    a.q = reinterpret_cast<int8_t *>(p);
    a.d = reinterpret_cast<float *>(p + q_bytes(n_in, T));
    a.s16 = reinterpret_cast<int16_t *>(p + q_bytes(n_in, T) + d_bytes(n_in, T));
    if (frag) {
        const int64_t T8 = frag_tokens(T);
        uint8_t *f = p + copy_bytes(n_in, T);
        a.qf = reinterpret_cast<int8_t *>(f);
        a.df = reinterpret_cast<float *>(f + q_bytes(n_in, T8));
        a.sf = reinterpret_cast<int16_t *>(f + q_bytes(n_in, T8) + d_bytes(n_in, T8));
    }
    return a;
}

void quantize_acts(cudaStream_t stream, int warp, const float *x, int n_in, int T, int block, const ActScratch &a) {
    if (block <= 0 || n_in % block != 0) fail(LUCE_ERR_INTERNAL, "quantize_acts: block %d, n_in %d", block, n_in);
    launch_kernel(quantize_acts_kernel, unsigned(int64_t(T) * (n_in / block)), warp, 0, stream, x, block,
                  fused_quant(a, block));
}

void matmul_int8(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a) {
    const int block = act_block_of(type);
    if (block == 0 || n_in % block != 0 || n_in > INT32_MAX || rows.n < 1)
        fail(LUCE_ERR_INTERNAL, "matmul_int8: type %d, n_in %lld", type, (long long)n_in);
    Int8Launch launch{stream, n_in, rows, a, T};
    if (!dispatch_type(type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU matmul for ggml type %d", type);
}

}  // namespace luce::gpu
