// backend_cpu.h — the CPU backend (reference implementation of backend.h).
#pragma once

#include "backend.h"
#include "threadpool.h"

namespace luce {

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int n_threads);  // 0 = one thread per core
    const char *name() const override { return "cpu"; }
    int n_threads() const { return pool_.size(); }

    void *alloc(size_t n_bytes) override;
    void release(void *p) override;
    void upload(void *dst, const void *src, size_t n_bytes) override;
    void download(void *dst, const void *src, size_t n_bytes) override;
    void copy(void *dst, const void *src, size_t n_bytes) override;

    void matmul(const Weight &w, const float *x, int T, float *y, int64_t ldy) override;
    // Prompt prefill may run the matmul kernels of another summation order (matmul_rows'
    // `prefill`: the 32-element types' four-row kernels).
    void set_prefill(bool on) override { prefill_ = on; }
    bool prefill() const override { return prefill_; }
    void get_rows(const Weight &w, const int32_t *ids, int T, float *out) override;
    void rmsnorm(const float *x, int64_t x_stride, const float *w, int n_rows, int dim, float eps,
                 float *y, int64_t y_stride) override;
    void rmsnorm_gated(float *o, const float *w, const float *z, int T, int n_heads, int dim, float eps) override;
    void mul_sigmoid(float *o, const float *g, int64_t g_stride, int n_rows, int dim) override;
    void swiglu(float *gate, const float *up, int n_rows, int64_t dim) override;
    void add(float *x, const float *y, int64_t n) override;
    void rope_neox(float *x, const int32_t *pos, int T, int n_head, int head_dim, int n_rot,
                   float theta) override;
    void hadamard_rows(float *x, int n_rows, int dim) override;
    void kv_store(KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
                  int n_head_kv, int head_dim) override;
    void attention(const float *q, const KvLayer &kv, const int32_t *pos, const uint8_t *mask, int T,
                   int n_head, int n_head_kv, int head_dim, float *out) override;
    void conv_silu(const float *x, float *state, const float *w, int T, int C, int Kc,
                   float *out, const int32_t *parent = nullptr) override;
    void gated_delta_net(const float *conv, const float *b, const float *a, const float *ssm_a,
                         const float *dt_bias, const DeltaNetDims &dims, int T, float *state,
                         float *out, float *state_history, const int32_t *parent = nullptr) override;
    int32_t argmax(const float *x, int64_t n) override;

    // Drafter ops (backend.h's last block).
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
    bool tree_mode() const override { return true; }

private:
    ThreadPool pool_;
    bool prefill_ = false;
};

}  // namespace luce
