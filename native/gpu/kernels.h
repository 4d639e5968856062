// kernels.h — host-side launchers of the GPU kernels (one .cu per op family).
//
// Each launcher enqueues on `stream` and returns without synchronising; all pointers are device
// memory. Shapes and semantics are exactly those of the matching Backend op (native/src/backend.h),
// whose CPU implementation (backend_cpu.cpp) is the reference. `warp` is the device's warp size.
#pragma once

#include <cstdint>

#include "backend.h"
#include "act_quant.cuh"
#include "gpu_compat.h"

namespace luce::gpu {

// matmul.cu: fp32-activation kernels (float weights; every type under LUCE_GPU_KERNELS=exact).
void matmul(cudaStream_t stream, int warp, const Weight &w, const float *x, int T, float *y, int64_t ldy);

// matmul_int8.cu: quantized weights x int8 activations (the CPU fast path's contract). The
// activations are quantized (quantize_acts, blocks of act_block_of(w.type)) into an ActScratch of
// act_scratch_bytes(n_in, T, frag) device bytes first; one quantization may serve several
// matmuls. frag: the scratch also holds the fragment-order copy matmul_mma_frag reads (FragDst,
// act_quant.cuh), which every quantization into it then writes.
struct ActScratch {
    int8_t *q = nullptr;     // [T][n_in]
    float *d = nullptr;      // [T][n_in / act_block]
    int16_t *s16 = nullptr;  // [T][n_in / 16]: sum of q over each 16 values
    int8_t *qf = nullptr;    // the fragment-order copy, tokens padded to tiles of 8 (or null)
    float *df = nullptr;
    int16_t *sf = nullptr;
    int64_t n_in = 0;
};
// The output rows of one int8 matmul launch: up to MAX weights of one type and input width, side
// by side (the matmuls of one input: q/k, gate/up, the DeltaNet projections). Launch row r is row
// r - start(s) of segment s, written to y[s] with row stride ldy[s].
struct RowSegments {
    static constexpr int MAX = 4;
    const uint8_t *w[MAX] = {};
    float *y[MAX] = {};
    int64_t ldy[MAX] = {};
    int64_t end[MAX] = {};  // cumulative row counts
    int n = 0;

    __host__ __device__ int64_t n_out() const { return n ? end[n - 1] : 0; }
    __host__ __device__ int64_t start(int s) const { return s ? end[s - 1] : 0; }
    __device__ int find(int64_t row) const {
        int s = 0;
        while (s + 1 < n && row >= end[s]) ++s;
        return s;
    }
};

// The scratch as the destination of an op that quantizes its own output in blocks of `block`.
inline FusedQuant fused_quant(const ActScratch &a, int block) {
    return FusedQuant{a.q, a.d, a.s16, block, a.qf, a.df, a.sf, int(a.n_in / block)};
}
int64_t act_scratch_bytes(int64_t n_in, int T, bool frag);
ActScratch act_scratch_at(void *base, int64_t n_in, int T, bool frag);
void quantize_acts(cudaStream_t stream, int warp, const float *x, int n_in, int T, int block, const ActScratch &a);
void matmul_int8(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a);
// matmul_mma.cu: the same contract on the tensor cores (CUDA sm_80+; mma_matmul_supported(major)
// of the device's compute capability), bit-identical to matmul_int8 per (row, token) whatever T.
// HIP: unsupported.
bool mma_matmul_supported(int cc_major);
void matmul_mma(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a);
// matmul_mma_frag.cu: the same on the tensor cores for T <= MMA_FRAG_MAX_TOKENS, each warp
// staging its own units as fragments (no block-wide waits); matmul_mma stages column groups per
// block. Same bits as both others; mma_frag_serves: where it measured faster on an H200.
constexpr int MMA_FRAG_MAX_TOKENS = 64;  // past 32 tokens: 32-token slices (grid.y), weights decoded per slice
// Whether matmul_mma_frag may bring weights in with bulk copies (sm_90+): set once by the GPU
// backend from the device and LUCE_GPU_BULK (docs/gpu.md).
inline bool frag_bulk_copies = false;
// Whether IQ4_XS's bulk copies fill each 16-row buffer with one tensor-map request (default; 16
// row copies, where those serve, under LUCE_GPU_BULK=rows; docs/gpu.md).
inline bool frag_bulk_tensor = true;
bool mma_frag_serves(int type, int64_t n_in, int T);
void matmul_mma_frag(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a);
// matmul_gemm.cu: prefill only (Backend::set_prefill): the tensor cores on 128-row x 64-token
// tiles, each 256-element group summed in int32 before one fp32 step, so NOT the bits of the three
// kernels above (within the fast path's tolerance of them). CUDA sm_80+; gemm_serves: the types
// and shapes it has (IQ4_XS, Q4_K, Q5_K, Q6_K, Q8_0; rows of whole 256-value groups).
// Tiles may be split along the row (gemm_splits picks how many for n_sm SMs, or takes `forced`
// within the valid range): the splits write [splits][T][n_out] floats of `partial` and a second
// kernel adds them in order.
bool gemm_serves(int type, int64_t n_in);
int gemm_splits(int64_t n_out, int64_t n_in, int T, int n_sm, int forced = 0);
void matmul_gemm(cudaStream_t stream, int type, int64_t n_in, const RowSegments &rows, int T, const ActScratch &a,
                 int splits, float *partial);
void get_rows(cudaStream_t stream, const Weight &w, const int32_t *ids, int T, float *out);
// matmul.cu: a weight's GGUF bytes in device memory -> the layout the kernels read, in place
// (IQ4_XS: codes re-paired within each sub-block and renumbered; Q6_K: each unit's bits made
// contiguous and word-aligned, quant_blocks.cuh; other types unchanged).
void repack_weights(cudaStream_t stream, int type, void *data, int64_t n_bytes);

// norms.cu. The ops that feed a matmul can quantize their output for it (act_quant.cuh) when
// fq.q is set: rmsnorm needs y_stride == dim; every output length a multiple of fq.block.
// The block size of the norms of rows of dim (the fused attention prologue launches the same).
int norm_threads(int dim);
void rmsnorm(cudaStream_t stream, const float *x, int64_t x_stride, const float *w, int n_rows, int dim,
             float eps, float *y, int64_t y_stride, const FusedQuant &fq = {});
void add_rmsnorm(cudaStream_t stream, int warp, float *x, const float *y, const float *w, int n_rows, int dim,
                 float eps, float *out, const FusedQuant &fq = {});
// rmsnorm_gated: T tokens of n_heads rows of dim. Where rmsnorm_gated_by_blocks (a property of
// the model's shape, never of T) it runs by activation blocks and can quantize its output.
bool rmsnorm_gated_by_blocks(int warp, int n_heads, int dim);
void rmsnorm_gated(cudaStream_t stream, int warp, float *o, const float *w, const float *z, int T, int n_heads,
                   int dim, float eps, const FusedQuant &fq = {});
void mul_sigmoid(cudaStream_t stream, int warp, float *o, const float *g, int64_t g_stride, int n_rows, int dim,
                 const FusedQuant &fq = {});
void swiglu(cudaStream_t stream, int warp, float *gate, const float *up, int64_t n, const FusedQuant &fq = {});
void add(cudaStream_t stream, float *x, const float *y, int64_t n);

// attention.cu
void rope_neox(cudaStream_t stream, float *x, const int32_t *pos, int T, int n_head, int head_dim,
               int n_rot, float theta);
// x = H x for each of n_rows rows (Backend::hadamard_rows).
void hadamard_rows(cudaStream_t stream, float *x, int n_rows, int dim);
void kv_store(cudaStream_t stream, KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
              int n_head_kv, int head_dim);
// rmsnorm x2, rope_neox x2 and kv_store in one launch (Backend::qk_norm_rope_store).
void qk_norm_rope_store(cudaStream_t stream, const float *qg, const float *q_norm, float *q, float *k,
                        const float *k_norm, const float *v, KvLayer &kv, const int32_t *pos, const int32_t *slot,
                        int T, int n_head, int n_head_kv, int head_dim, int n_rot, float theta, float eps);
// Whether decode-sized steps over f16 / q8_0 / q4_0 caches take the grouped kernel (one block reads
// a cache row for all the query heads that share it) where it serves the shape; off:
// LUCE_GPU_ATTN_GROUPED=0, for A/B runs.
inline bool grouped_attention = true;
// Split-KV scratch the attention of this shape uses (0: it runs in one pass). Without enough
// scratch (null / smaller) attention runs the one-pass kernel.
int64_t attention_scratch_bytes(int T, int n_head, int head_dim, int n_ctx);
void attention(cudaStream_t stream, int warp, const float *q, const KvLayer &kv, const int32_t *pos,
               const uint8_t *mask, int T, int n_head, int n_head_kv, int head_dim, float *out, void *scratch,
               int64_t scratch_bytes);
// Backend::attention_sequences: the prologue and the attention of every sequence of a batched
// causal step in one launch each (two with the split-KV merge), row t against its own sequence's
// cache, with the bits of the per-sequence launches. attention_sequences_batch: whether the
// sequences are such a batch (2..MAX_STEP of them, causal, in row order, slots at their positions,
// caches of one format, n_ctx and window); the other steps go one sequence at a time.
bool attention_sequences_batch(const AttentionRows *seqs, int n, const int32_t *pos);
void attention_sequences(cudaStream_t stream, int warp, const float *qg, const float *q_norm, float *q, float *k,
                         const float *k_norm, const float *v, const int32_t *pos, const AttentionRows *seqs, int n,
                         int n_head, int n_head_kv, int head_dim, int n_rot, float theta, float eps, float *out,
                         void *scratch, int64_t scratch_bytes);

// deltanet.cu
void conv_silu(cudaStream_t stream, const float *x, float *state, const float *w, int T, int C, int Kc,
               float *out, const int32_t *parent = nullptr);
// The kernel for steps of up to MAX_STEP tokens (longer prompt chunks without history take the
// prefill kernel unless `memory`): the state walked through device memory (LUCE_GPU_DELTANET_REG=0),
// held in registers, or held in registers and loaded before the previous kernel has finished
// (the default, off with LUCE_GPU_DELTANET_EARLY=0; gpu_compat.h says when that is safe). The
// last two give the same bits.
enum class DeltaKernel { memory = 0, registers = 1, registers_early = 2 };
void gated_delta_net(cudaStream_t stream, int warp, const float *conv, const float *b, const float *a,
                     const float *ssm_a, const float *dt_bias, const DeltaNetDims &dims, int T,
                     float *state, float *out, float *state_history, DeltaKernel kernel,
                     const int32_t *parent = nullptr);
// Backend::deltanet_sequences: both ops for every sequence of a batched step, one launch each (the
// per-sequence launches' bits). deltanet_sequences_batch: whether the batched kernels take the
// step (not the memory kernel, nor state dims the register kernel lacks, nor more than MAX_STEP
// sequences or tokens); else the backend runs the sequences one by one.
bool deltanet_sequences_batch(int Kc, const DeltaNetDims &dims, const RecurrentRows *seqs, int n, DeltaKernel kernel);
void deltanet_sequences(cudaStream_t stream, int warp, const float *qkv, const float *conv_w, int C, int Kc,
                        float *conv_out, const float *b, const float *a, const float *ssm_a, const float *dt_bias,
                        const DeltaNetDims &dims, const RecurrentRows *seqs, int n, float *out, DeltaKernel kernel);

// copy.cu: ops (device memory) has n copies, the largest most_bytes long.
void copy_batch(cudaStream_t stream, const Backend::CopyOp *ops, int n, size_t most_bytes);

// drafter.cu (backend.h's drafter block). topk_rows needs topk_scratch_bytes(n_rows, n, k) of device
// scratch, argmax_rows topk_scratch_bytes(n_rows, n, 1).
void rope_table(cudaStream_t stream, float *x, const int32_t *pos, int T, int n_head, int head_dim,
                const float *inv_freq, float mscale);
void dyn_conv(cudaStream_t stream, const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B,
              int E, int K, int group, float *out);
void drafter_masks(cudaStream_t stream, uint8_t *masks, int rows, int cap, const int32_t *pos, int B, int window,
                   unsigned variants);
void softcap(cudaStream_t stream, float *x, int64_t n, float mult, float cap);
void argmax_rows(cudaStream_t stream, const float *x, int n_rows, int64_t n, int32_t *out, void *scratch);
int64_t topk_scratch_bytes(int n_rows, int64_t n, int k);
void topk_rows(cudaStream_t stream, const float *x, int n_rows, int64_t n, int k, int32_t *ids, float *vals,
               void *scratch);
void selector_pairs(cudaStream_t stream, const float *hproj, const float *pred, const float *succ, int n_rows,
                    int k, int R, float *out);
void confidence(cudaStream_t stream, const float *h, const float *e, const float *w, float b, int E, int R,
                float *out);
void copy_rows(cudaStream_t stream, void *dst, int64_t dst_stride, const void *src, int64_t src_stride,
               int64_t width, int n_rows);

}  // namespace luce::gpu
