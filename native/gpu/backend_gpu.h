// backend_gpu.h — the GPU backend (CUDA or HIP, one source) behind backend.h.
//
// Built into libluce_gpu.so, which libluce dlopens only when a GPU is asked for
// (native/src/gpu_loader.cpp); its one exported entry point is luce_gpu_open below.
// All work is enqueued on one stream and nothing synchronises inside a forward step except
// download() and argmax(): the shape a captured graph needs (run_graphed, backend.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend.h"
#include "act_quant.cuh"
#include "gpu_compat.h"
#include "kernels.h"  // gpu::DeltaKernel
#include "op_profile.h"

namespace luce {

class GpuBackend final : public Backend {
public:
    explicit GpuBackend(int device_index);
    ~GpuBackend() override;
    const char *name() const override { return name_.c_str(); }
    // Whether the int8 matmuls have tensor-core kernels here (CUDA sm_80+), whatever the switches.
    bool tensor_core_matmuls() const { return tensor_cores_; }

    void *alloc(size_t n_bytes) override;
    void release(void *p) override;
    bool device_memory(int64_t &free, int64_t &total) const override;
    void upload(void *dst, const void *src, size_t n_bytes) override;
    void download(void *dst, const void *src, size_t n_bytes) override;
    void copy(void *dst, const void *src, size_t n_bytes) override;
    void copy_batch(const CopyOp *ops, int n) override;
    void *upload_weight(const Weight &w, size_t n_bytes) override;

    void matmul(const Weight &w, const float *x, int T, float *y, int64_t ldy) override;
    void matmuls(const float *x, int T, const MatmulOut *out, int n) override;
    void get_rows(const Weight &w, const int32_t *ids, int T, float *out) override;
    void rmsnorm(const float *x, int64_t x_stride, const float *w, int n_rows, int dim, float eps,
                 float *y, int64_t y_stride) override;
    void rmsnorm_gated(float *o, const float *w, const float *z, int T, int n_heads, int dim, float eps) override;
    void mul_sigmoid(float *o, const float *g, int64_t g_stride, int n_rows, int dim) override;
    void swiglu(float *gate, const float *up, int n_rows, int64_t dim) override;
    void add(float *x, const float *y, int64_t n) override;
    void add_rmsnorm(float *x, const float *y, const float *w, int n_rows, int dim, float eps, float *out) override;
    void rope_neox(float *x, const int32_t *pos, int T, int n_head, int head_dim, int n_rot,
                   float theta) override;
    void hadamard_rows(float *x, int n_rows, int dim) override;
    void kv_store(KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
                  int n_head_kv, int head_dim) override;
    void qk_norm_rope_store(const float *qg, const float *q_norm, float *q, float *k, const float *k_norm,
                            const float *v, KvLayer &kv, const int32_t *pos, const int32_t *slot, int T, int n_head,
                            int n_head_kv, int head_dim, int n_rot, float theta, float eps) override;
    void attention(const float *q, const KvLayer &kv, const int32_t *pos, const uint8_t *mask, int T,
                   int n_head, int n_head_kv, int head_dim, float *out) override;
    void attention_sequences(const float *qg, const float *q_norm, float *q, float *k, const float *k_norm,
                             const float *v, const int32_t *pos, const AttentionRows *seqs, int n, int n_head,
                             int n_head_kv, int head_dim, int n_rot, float theta, float eps, float *out) override;
    void conv_silu(const float *x, float *state, const float *w, int T, int C, int Kc,
                   float *out, const int32_t *parent) override;
    void gated_delta_net(const float *conv, const float *b, const float *a, const float *ssm_a,
                         const float *dt_bias, const DeltaNetDims &dims, int T, float *state,
                         float *out, float *state_history, const int32_t *parent) override;
    void deltanet_sequences(const float *qkv, const float *conv_w, int C, int Kc, float *conv_out, const float *b,
                            const float *a, const float *ssm_a, const float *dt_bias, const DeltaNetDims &dims,
                            const RecurrentRows *seqs, int n, float *out) override;
    int32_t argmax(const float *x, int64_t n) override;

    // Drafter ops (backend.h's last block; implemented at the end of backend_gpu.cu).
    void rope_table(float *x, const int32_t *pos, int T, int n_head, int head_dim, const float *inv_freq,
                    float mscale) override;
    void drafter_masks(uint8_t *masks, int rows, int cap, const int32_t *pos, int B, int window,
                       unsigned variants) override;
    void dyn_conv(const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B, int E, int K,
                  int group, float *out) override;
    void softcap(float *x, int64_t n, float mult, float cap) override;
    void argmax_rows(const float *x, int n_rows, int64_t n, int32_t *out) override;
    void topk_rows(const float *x, int n_rows, int64_t n, int k, int32_t *ids, float *vals) override;
    void selector_pairs(const float *hproj, const float *pred, const float *succ, int n_rows, int k, int R,
                        float *out) override;
    void confidence(const float *h, const float *e, const float *w, float b, int E, int R, float *out) override;
    void copy_rows(void *dst, int64_t dst_stride, const void *src, int64_t src_stride, int64_t width,
                   int n_rows) override;
    bool tree_mode() const override { return true; }  // parent arrays in device memory (forward.cpp uploads them)
    bool graph_replay(uint64_t key) override;
    bool graph_begin(uint64_t key) override;
    bool graph_end(uint64_t key) override;
    void graph_abort() override;
    void graph_clear() override;
    void set_prefill(bool on) override { prefill_ = on; }
    bool prefill() const override { return prefill_; }

    // Mean device time of `reps` back-to-back matmuls, microseconds (the test hook's timing; each
    // call on its own copy of the w_bytes of weights, so they come from DRAM as in a model step).
    float time_matmul(const Weight &w, size_t w_bytes, const float *x, int T, float *y, int reps);
    // The one stream every op is enqueued on (the profiler records its events there).
    cudaStream_t stream() const { return stream_; }
    int warp_size() const { return warp_; }

private:
    void read_switches(const cudaDeviceProp &prop);          // the LUCE_GPU_* environment (docs/gpu.md)
    void choose_matmul_kernels(const cudaDeviceProp &prop);  // which int8 kernel serves which width
    bool owns(const void *p) const;  // p lies inside one of our allocations
    void matmul_launch(const float *x, int T, const MatmulOut *out, int n);  // one type and width
    void grow(void *&buf, size_t &bytes, size_t need);  // scratch of at least `need` bytes

    int device_ = 0;
    int warp_ = 32;  // the device's warp size: 32 on NVIDIA and RDNA, 64 on CDNA
    std::string name_;
    cudaStream_t stream_ = nullptr;
    int32_t *argmax_result_ = nullptr;       // device scratch for argmax
    std::map<uintptr_t, size_t> allocations_;
    std::unique_ptr<gpu::OpProfile> profile_;  // LUCE_GPU_PROFILE=FILE (op_profile.h)
    static constexpr int NO_MMA = 1 << 30;
    bool tensor_cores_ = false;              // the device has the tensor-core int8 matmul (sm_80+)
    int mma_min_tokens_ = NO_MMA;            // widths served by the tensor-core int8 matmul (sm_80+)
    enum class MmaKernel { by_shape, frag, staged, gemm };
    MmaKernel mma_kernel_ = MmaKernel::by_shape;  // which tensor-core kernel serves a width
    bool prefill_ = false;                   // set_prefill: matmul_gemm may serve (gemm_min_tokens_ up)
    int gemm_min_tokens_ = NO_MMA;
    int gemm_splits_ = 0;                    // LUCE_GPU_GEMM_SPLITS (A/B runs): forced splits, 0 = by cost
    bool exact_kernels_ = false;             // LUCE_GPU_KERNELS=exact: fp32 activations for every type
    void *act_scratch_ = nullptr;            // int8 activations of the quantized matmuls, grown on demand
    size_t act_scratch_bytes_ = 0;
    struct QuantizedFrom {                   // what act_scratch_ holds now (x == nullptr: nothing)
        const float *x = nullptr;
        int64_t n = 0;                       // values quantized from x (flat: T x n_in of a matmul)
        int block = 0;
        int64_t frag_n_in = 0;               // row length of the fragment-order copy (0: none)
    } acts_;
    // Whether quantizations for T tokens also write the fragment-order copy (the per-warp fragment
    // kernel reads it; it may serve T whenever the tensor cores do, up to MMA_FRAG_MAX_TOKENS).
    bool frag_acts(int64_t T) const;
    int fused_block_ = 0;                    // block size ops quantize their output in: the last int8 matmul's
    // Where an op quantizes its n outputs at y (recorded as the scratch's content), or nothing.
    gpu::FusedQuant quantize_output(const float *y, int64_t n, int64_t row);
    void forget_acts() { acts_ = {}; }
    // Pinned ring the small per-step uploads (positions, token ids, masks) are staged through, so
    // the copy is a true async DMA instead of a pageable copy; wraps with one stream sync per lap.
    char *staging_ = nullptr;
    size_t staging_used_ = 0;
    // Split-KV attention partials, grown on demand (LUCE_GPU_ATTN_SPLIT=0: one-pass kernel only).
    // Step graphs (off with LUCE_GPU_GRAPHS=0): key -> instantiated graph; a key is recorded on its
    // second occurrence, after one eager run has grown every scratch buffer the step needs.
    bool graphs_ = false;
    bool capturing_ = false;
    std::map<uint64_t, cudaGraphExec_t> graph_execs_;
    std::map<uint64_t, int> graph_seen_;
    bool attn_split_ = true;
    // The attention prologue in one launch (the five ops in turn under LUCE_GPU_FUSED_ATTN=0;
    // the same bits, which gpu_check's graphs check compares).
    bool fused_attn_ = true;
    // The DeltaNet state in registers, loaded ahead of the previous kernel's end;
    // LUCE_GPU_DELTANET_EARLY=0: loaded after it; LUCE_GPU_DELTANET_REG=0: kept in device memory.
    gpu::DeltaKernel delta_kernel_ = gpu::DeltaKernel::registers_early;
    void *gemm_scratch_ = nullptr;           // the prefill GEMM's split partials, grown on demand
    size_t gemm_scratch_bytes_ = 0;
    int n_sm_ = 1;                           // the device's SMs (CUs): the prefill GEMM's splits
    size_t l2_bytes_ = 0;                    // the device's L2 cache (time_matmul sizes its weight copies by it)
    void *attn_scratch_ = nullptr;
    size_t attn_scratch_bytes_ = 0;
    void *topk_scratch_ = nullptr;           // top-k / argmax candidates, grown on demand
    size_t topk_scratch_bytes_ = 0;  // base -> bytes; freed in the destructor
    void *copy_ops_ = nullptr;               // copy_batch's table, grown on demand
    size_t copy_ops_bytes_ = 0;
};

}  // namespace luce

// Creates the backend on GPU `device_index` after checking that `bytes_needed` (weights plus the
// runtime's reserve) fit its free memory. On failure returns a luce_status and writes a one-line
// reason into err (err_len bytes). The caller owns *out (delete through Backend's virtual dtor).
extern "C" __attribute__((visibility("default"))) luce_status
luce_gpu_open(int32_t device_index, int64_t bytes_needed, luce::Backend **out, char *err, size_t err_len);

// Test hook (tools/gpu_check.py): one matmul on GPU `device_index`, host buffers in and out;
// timing_reps > 0 also times that many more (*us_per_call, microseconds each).
extern "C" __attribute__((visibility("default"))) luce_status
luce_gpu_matmul(int32_t device_index, int32_t type, const void *weights, size_t nbytes, int64_t n_rows,
                int64_t n_cols, const float *x, int64_t n_tok, float *y, int32_t timing_reps, float *us_per_call,
                char *err, size_t err_len);

// Test hook (tools/gpu_check.py): one attention call on GPU `device_index`, host buffers in and out,
// over a cache of K type k_type and V type v_type (KvType); split selects the split-KV path (where
// the shape has one) or the one-pass kernel; timing_reps > 0 also times that many more calls
// (*us_per_call, microseconds each).
extern "C" __attribute__((visibility("default"))) luce_status
luce_gpu_attention(int32_t device_index, const float *q, const float *k, const float *v, const int32_t *pos,
                   const uint8_t *mask, int32_t T, int32_t n_head, int32_t n_head_kv, int32_t head_dim, int32_t n_ctx,
                   int32_t split, int32_t k_type, int32_t v_type, int32_t timing_reps, float *us_per_call, float *out,
                   char *err, size_t err_len);

// Test hook (tools/gpu_check.py): argmax_rows (k == 0) or topk_rows (k >= 1) on GPU `device_index`,
// host buffers in and out.
extern "C" __attribute__((visibility("default"))) luce_status
luce_gpu_select(int32_t device_index, const float *x, int32_t n_rows, int64_t n, int32_t k, int32_t *ids, float *vals,
                char *err, size_t err_len);

// Test hook (tools/gpu_check.py): one gated_delta_net over T tokens on GPU `device_index`, host
// buffers; registers selects the register-resident kernel (DK 16/32/64/128) or the device-memory
// one; parent (may be null) runs tree mode.
extern "C" __attribute__((visibility("default"))) luce_status
luce_gpu_deltanet(int32_t device_index, const float *conv, const float *b, const float *a, const float *ssm_a,
                  const float *dt_bias, int32_t hk, int32_t hv, int32_t dk, int32_t dv, float eps, int32_t T,
                  float *state, float *out, float *history, int32_t registers, const int32_t *parent, char *err,
                  size_t err_len);
