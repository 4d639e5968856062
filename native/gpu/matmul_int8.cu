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
// Work split: one warp per output row; lane l takes the 32-element units u = l, l + warpSize, ...
// of the row (a Q8_0 block or one sub-block of a 256-element block), loads the unit's weights
// once as eight packed int8 words and applies them to NT tokens. Every (row, token) output is
// summed in the same order whatever T and wherever the token sits in its tile (lane-local units
// in increasing u, then one fixed warp reduction), so a verify row is bit-identical to the
// decode step of the same token: speculative decoding's exactness rests on that.
#include "kernels.h"
#include "quant_blocks.cuh"

namespace luce::gpu {

namespace {

// ---- int8 helpers ------------------------------------------------------------------------------

__device__ __forceinline__ int dot4(int a, int b, int c) {
#if defined(LUCE_HIP)
    const int8_t *pa = reinterpret_cast<const int8_t *>(&a), *pb = reinterpret_cast<const int8_t *>(&b);
    return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#else
    return __dp4a(a, b, c);
#endif
}

// Four 4-bit codes (one per byte, 0..15) -> the four signed IQ4_NL codebook values, packed.
// The codebook lives in registers: `__constant__` memory serialises a warp whose lanes read
// different entries, which is every lookup here.
struct Codebook {
    uint32_t w[4];  // entries 0..15, four per word, little-endian
};

__device__ __forceinline__ Codebook iq4nl_codebook() {
    // kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113 (spec/qwen35.md §4)
    return Codebook{{0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u}};
}

__device__ __forceinline__ uint32_t lookup4(const Codebook &cb, uint32_t codes) {
#if defined(LUCE_HIP)
    uint32_t out = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t c = (codes >> (8 * i)) & 0xF;
        out |= ((cb.w[c >> 2] >> (8 * (c & 3))) & 0xFF) << (8 * i);
    }
    return out;
#else
    // __byte_perm picks bytes by 3-bit selectors: entries 0-7 from (w0, w1), 8-15 from (w2, w3),
    // then bit 3 of each code chooses between the two.
    const uint32_t sel = (codes & 0x7u) | ((codes >> 4) & 0x70u) | ((codes >> 8) & 0x700u) | ((codes >> 12) & 0x7000u);
    const uint32_t lo = __byte_perm(cb.w[0], cb.w[1], sel), hi = __byte_perm(cb.w[2], cb.w[3], sel);
    const uint32_t pick_hi = ((codes & 0x08080808u) >> 3) * 0xFFu;
    return (hi & pick_hi) | (lo & ~pick_hi);
#endif
}

__device__ __forceinline__ uint32_t u16_at(const uint8_t *p) {
    return *reinterpret_cast<const uint16_t *>(p);
}

// 32 bytes at a 2-byte-aligned address (Q8_0 and Q6_K blocks are 34 and 210 bytes: their fields
// are only 2-byte aligned) as eight words.
__device__ __forceinline__ void load32_a2(const uint8_t *p, uint32_t (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = u16_at(p + 4 * i) | (u16_at(p + 4 * i + 2) << 16);
}

// 32 bytes at a 16-byte-aligned address as eight words, in two 16-byte loads.
__device__ __forceinline__ void load_words16(const uint8_t *p, uint32_t (&w)[8]) {
    const uint4 a = reinterpret_cast<const uint4 *>(p)[0], b = reinterpret_cast<const uint4 *>(p)[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

// ---- one unit of weights: eight packed int8 words and its scales --------------------------------

struct Unit {
    uint32_t q[8];   // 32 weights (int8), element order
    float d, dmin;   // block scale(s) (dmin: Q4_K / Q5_K only)
    int sc0, sc1;    // integer sub-scales: Q4_K/Q5_K scale and min; Q6_K scale of each 16-half; IQ4_XS ls - 32
};

template <int TYPE>
__device__ __forceinline__ void load_qunit(const uint8_t *row, int u, Unit &un) {
    if constexpr (TYPE == GGML_Q8_0) {
        const uint8_t *b = row + 34 * u;  // f16 d; i8 qs[32]
        un.d = f16_at(b);
        load32_a2(b + 2, un.q);
    } else if constexpr (TYPE == GGML_Q4_K || TYPE == GGML_Q5_K) {
        // f16 d; f16 dmin; u8 scales[12]; (Q5_K: u8 qh[32];) u8 qs[128]. Sub-block j = nibble
        // hi = j % 2 of qs[32c + l], c = j / 2; Q5_K's 5th bit is bit j of qh[l].
        constexpr int BB = TYPE == GGML_Q4_K ? 144 : 176;
        const uint8_t *b = row + BB * (u / 8);
        const int j = u % 8, c = j / 2, hi = j % 2;
        k_scale_min(b + 4, j, un.sc0, un.sc1);
        un.d = f16_at(b);
        un.dmin = f16_at(b + 2);
        uint32_t qs[8], qh[8];  // 16-byte aligned (144- and 176-byte blocks): two 16-byte loads each
        load_words16(b + (TYPE == GGML_Q4_K ? 16 : 48) + 32 * c, qs);
        if constexpr (TYPE == GGML_Q5_K) load_words16(b + 16, qh);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            uint32_t v = (hi ? qs[i] >> 4 : qs[i]) & 0x0F0F0F0Fu;
            if constexpr (TYPE == GGML_Q5_K) v |= ((qh[i] >> j) & 0x01010101u) << 4;
            un.q[i] = v;
        }
    } else if constexpr (TYPE == GGML_Q6_K) {
        // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Sub-block j (half h = j / 4, quarter
        // k = j % 4): 6-bit q = nibble k / 2 of ql[64h + 32(k % 2) + l] | bits 2k..2k+1 of
        // qh[32h + l] << 4, value d * scales[8h + 2k + l / 16] * (q - 32). The unit keeps q
        // (0..63); the -32 is applied through the activation sums.
        const uint8_t *b = row + 210 * (u / 8);
        const int j = u % 8, h = j / 4, k = j % 4;
        uint32_t ql[8], qh[8];
        load32_a2(b + 64 * h + 32 * (k % 2), ql);
        load32_a2(b + 128 + 32 * h, qh);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            un.q[i] = ((ql[i] >> (4 * (k / 2))) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * k)) & 0x03030303u) << 4);
        const int8_t *sc = reinterpret_cast<const int8_t *>(b + 192 + 8 * h + 2 * k);
        un.sc0 = sc[0];
        un.sc1 = sc[1];
        un.d = f16_at(b + 208);
    } else if constexpr (TYPE == GGML_IQ4_XS) {
        // f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. Sub-block ib: element l < 16 = low
        // nibble of qs[16ib + l], element l + 16 = its high nibble; scale d * (ls - 32).
        const uint8_t *b = row + 136 * (u / 8);  // 8-byte aligned: 8-byte loads
        const int ib = u % 8;
        const uint2 head = *reinterpret_cast<const uint2 *>(b);  // d | scales_h, scales_l[4]
        const uint32_t scales_h = head.x >> 16;
        un.sc0 = (((head.y >> (4 * ib)) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)) - 32;
        un.d = f16_bits(head.x & 0xFFFF);
        const uint2 *q2 = reinterpret_cast<const uint2 *>(b + 8 + 16 * ib);
        const uint2 lo = q2[0], hi = q2[1];
        const uint32_t qs[4] = {lo.x, lo.y, hi.x, hi.y};
        const Codebook cb = iq4nl_codebook();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            un.q[i] = lookup4(cb, qs[i] & 0x0F0F0F0Fu);
            un.q[i + 4] = lookup4(cb, (qs[i] >> 4) & 0x0F0F0F0Fu);
        }
    }
}

// acc += this unit . (token's quantized activations), in one fixed order of fp32 operations.
// Every int -> float conversion below is exact (|value| < 2^24 for every type's ranges).
template <int TYPE>
__device__ __forceinline__ float apply_unit(const Unit &un, const int4 (&x)[2], float dx, int sum_lo, int sum_hi,
                                            float acc) {
    const int xw[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
    if constexpr (TYPE == GGML_Q6_K) {
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) lo = dot4(int(un.q[i]), xw[i], lo);
#pragma unroll
        for (int i = 4; i < 8; ++i) hi = dot4(int(un.q[i]), xw[i], hi);
        const float s = un.d * dx;
        acc = fmaf(s, float(un.sc0 * (lo - 32 * sum_lo)), acc);
        return fmaf(s, float(un.sc1 * (hi - 32 * sum_hi)), acc);
    } else {
        int dot = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = dot4(int(un.q[i]), xw[i], dot);
        if constexpr (TYPE == GGML_Q8_0) {
            return fmaf(un.d * dx, float(dot), acc);
        } else if constexpr (TYPE == GGML_IQ4_XS) {
            return fmaf(un.d * dx, float(un.sc0 * dot), acc);
        } else {  // Q4_K / Q5_K: d sc (q . x) - dmin m (sum x)
            acc = fmaf(un.d * dx, float(un.sc0 * dot), acc);
            return fmaf(-(un.dmin * dx), float(un.sc1 * (sum_lo + sum_hi)), acc);
        }
    }
}

// ---- kernels -----------------------------------------------------------------------------------

// One (activation block, token) per thread block of one warp: the CPU's quantize_block_scalar
// to the bit (fp32 amax, d = amax / 127, q = rint(x * (127 / amax)), non-finite -> 0), plus the
// sum of q over each 16 values.
__global__ void quantize_acts_kernel(const float *x, int n_in, int block, int8_t *q, float *d, int16_t *s16) {
    const int b = blockIdx.x, t = blockIdx.y;
    const float *xb = x + int64_t(t) * n_in + int64_t(b) * block;
    float amax = 0.f;
    for (int i = threadIdx.x; i < block; i += blockDim.x) amax = fmaxf(amax, fabsf(xb[i]));
    amax = warp_max(amax);
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    if (threadIdx.x == 0) d[int64_t(t) * (n_in / block) + b] = amax / 127.f;
    int8_t *qb = q + int64_t(t) * n_in + int64_t(b) * block;
    for (int i = threadIdx.x; i < block; i += blockDim.x) {
        const float r = rintf(xb[i] * id);
        qb[i] = r >= -127.f && r <= 127.f ? int8_t(r) : int8_t(0);
    }
    __syncthreads();  // the block is one warp; the sums read what other lanes wrote
    for (int g = threadIdx.x; g < block / 16; g += blockDim.x) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 16; ++i) s += qb[16 * g + i];
        s16[int64_t(t) * (n_in / 16) + int64_t(b) * (block / 16) + g] = int16_t(s);
    }
}

// R rows per warp: each token's activations are loaded once for R rows (at T = 16 the activation
// loads, not the weights, bound a one-row warp: 175 us for a 17408x5120 IQ4_XS step on an H200,
// 2026-12-03). Decode keeps R = 1: more warps, more weight loads in flight.
template <int TYPE, int NT, int R>
__global__ void matmul_int8_kernel(const uint8_t *w, int64_t row_bytes, int n_in, int64_t n_out, const int8_t *xq,
                                   const float *xd, const int16_t *xs, int act_block, int T, float *y, int64_t ldy) {
    const int lane = threadIdx.x % warpSize;
    const int64_t r0 = (int64_t(blockIdx.x) * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R;
    if (r0 >= n_out) return;  // whole warps leave together
    const int n_rows = int(n_out - r0 < R ? n_out - r0 : R);  // warp-uniform
    const int t0 = blockIdx.y * NT;
    const int n_units = n_in / 32, n_blocks = n_in / act_block, units_per_block = act_block / 32;
    float acc[R][NT];
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[k][t] = 0.f;
    // Decode (NT = 1) unrolls two units so each lane has two units' loads in flight.
#pragma unroll(NT == 1 ? 2 : 1)
    for (int u = lane; u < n_units; u += warpSize) {
        Unit un[R];
#pragma unroll
        for (int k = 0; k < R; ++k)
            if (k < n_rows) load_qunit<TYPE>(w + (r0 + k) * row_bytes, u, un[k]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int tok = t0 + t;
            if (tok >= T) break;
            const int4 *xp = reinterpret_cast<const int4 *>(xq + int64_t(tok) * n_in + 32 * int64_t(u));
            const int4 x[2] = {xp[0], xp[1]};
            const float dx = xd[int64_t(tok) * n_blocks + u / units_per_block];
            const int16_t *sp = xs + int64_t(tok) * (n_in / 16) + 2 * u;
            const int s_lo = sp[0], s_hi = sp[1];
#pragma unroll
            for (int k = 0; k < R; ++k)
                if (k < n_rows) acc[k][t] = apply_unit<TYPE>(un[k], x, dx, s_lo, s_hi, acc[k][t]);
        }
    }
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float s = warp_sum(acc[k][t]);
            if (lane == 0 && k < n_rows && t0 + t < T) y[int64_t(t0 + t) * ldy + r0 + k] = s;
        }
}

constexpr int MATMUL_THREADS = 128;

struct Int8Launch {
    cudaStream_t stream;
    int warp;
    const Weight &w;
    const ActScratch &a;
    int T;
    float *y;
    int64_t ldy;

    template <int TYPE, int NT, int R>
    void launch() const {
        const int rows_per_block = MATMUL_THREADS / warp * R;
        const dim3 grid(unsigned((w.n_out + rows_per_block - 1) / rows_per_block), unsigned((T + NT - 1) / NT));
        const int64_t row_bytes = w.n_in / block_elems(TYPE) * block_bytes(TYPE);
        matmul_int8_kernel<TYPE, NT, R><<<grid, MATMUL_THREADS, 0, stream>>>(
            static_cast<const uint8_t *>(w.data), row_bytes, int(w.n_in), w.n_out, a.q, a.d, a.s16,
            act_block_of(TYPE), T, y, ldy);
        LUCE_GPU_LAUNCHED();
    }

    template <int TYPE>
    void operator()() const {
        if constexpr (act_block_of(TYPE) == 0) {
            fail(LUCE_ERR_INTERNAL, "int8 matmul called for float type %d", TYPE);
        } else {
            if (T == 1) launch<TYPE, 1, 1>();
            else if (T <= 8) launch<TYPE, 8, 4>();
            else launch<TYPE, 32, 2>();
        }
    }
};

}  // namespace

int64_t act_scratch_bytes(int64_t n_in, int T) {
    const int64_t align = 256;
    auto up = [&](int64_t n) { return (n + align - 1) / align * align; };
    return up(T * n_in) + up(T * (n_in / 32) * int64_t(sizeof(float))) + up(T * (n_in / 16) * int64_t(sizeof(int16_t)));
}

ActScratch act_scratch_at(void *base, int64_t n_in, int T) {
    const int64_t align = 256;
    auto up = [&](int64_t n) { return (n + align - 1) / align * align; };
    auto *p = static_cast<uint8_t *>(base);
    ActScratch a;
    a.q = reinterpret_cast<int8_t *>(p);
    a.d = reinterpret_cast<float *>(p + up(T * n_in));
    a.s16 = reinterpret_cast<int16_t *>(p + up(T * n_in) + up(T * (n_in / 32) * int64_t(sizeof(float))));
    return a;
}

void quantize_acts(cudaStream_t stream, int warp, const float *x, int n_in, int T, int block, const ActScratch &a) {
    if (block <= 0 || n_in % block != 0) fail(LUCE_ERR_INTERNAL, "quantize_acts: block %d, n_in %d", block, n_in);
    quantize_acts_kernel<<<dim3(unsigned(n_in / block), unsigned(T)), warp, 0, stream>>>(x, n_in, block, a.q, a.d,
                                                                                         a.s16);
    LUCE_GPU_LAUNCHED();
}

void matmul_int8(cudaStream_t stream, int warp, const Weight &w, int T, float *y, int64_t ldy, const ActScratch &a) {
    const int block = act_block_of(w.type);
    if (block == 0 || w.n_in % block != 0) fail(LUCE_ERR_INTERNAL, "matmul_int8: type %d, n_in %lld", w.type,
                                                (long long)w.n_in);
    Int8Launch launch{stream, warp, w, a, T, y, ldy};
    if (!dispatch_type(w.type, launch)) fail(LUCE_ERR_UNSUPPORTED, "no GPU matmul for ggml type %d", w.type);
}

}  // namespace luce::gpu
