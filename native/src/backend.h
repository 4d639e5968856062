// backend.h — the small set of operations the qwen35 forward is written against.
//
// The model code (model_forward.cpp, attention.cpp, deltanet.cpp) calls only these; a backend
// implements them over its own memory. `cpu` (backend_cpu.cpp) is the reference: plain loops,
// fp32 accumulation, a persistent thread pool. The GPU backend (native/gpu) implements the same
// interface in CUDA/HIP and captures a whole step as a graph, which is why:
//   - every buffer argument is backend memory obtained from alloc();
//   - per-step values that change between steps (positions) travel in buffers (`pos`), never
//     as host scalars baked into a launch; the only host scalar that varies is the token count T;
//   - attention derives each query's visible keys from pos (causal: key j visible iff j <= pos[t]),
//     and takes an optional mask so tree verification can pass ancestor-only visibility.
//
// Layout conventions: activations are row-major [T][features]; a weight is row-major [out][in]
// (GGUF ne = [in, out]) in any supported ggml encoding and is never dequantized wholesale.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "errors.h"
#include "kv_cache.h"  // KvLayer

namespace luce {

// A 2-D weight kept in its GGUF encoding: n_out rows of n_in elements.
struct Weight {
    int32_t type = -1;
    int64_t n_in = 0, n_out = 0;
    const void *data = nullptr;
    bool present() const { return data != nullptr; }
};


// Dimensions of one Gated DeltaNet layer (GGUF tiled head order: v head j reads k head j % HK).
struct DeltaNetDims {
    int hk, hv, dk, dv;
    float eps;  // L2-norm clamp (llama.cpp: x / max(||x||, eps)) and gated-RMSNorm eps
};

// One sequence's rows of a batched step in a recurrent layer: rows [row0, row0 + T) of the step's
// buffers, through this sequence's own conv window, delta-rule state and (speculative steps) its
// per-token state history.
struct RecurrentRows {
    int row0 = 0, T = 0;
    float *conv_state = nullptr, *ssm = nullptr, *ssm_history = nullptr;
};

// One sequence's rows [row0, row0 + T) of an attention step: k, v stored in kv at slot[t], keys
// visible by position (mask null) or by mask.
struct AttentionRows {
    int64_t row0;
    int T;
    KvLayer *kv;
    const int32_t *slot;
    const uint8_t *mask;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char *name() const = 0;

    // Memory -------------------------------------------------------------------------------
    virtual void *alloc(size_t n_bytes) = 0;  // zero-initialised, 64-byte aligned
    virtual void release(void *p) = 0;
    // Bytes held through alloc(), now and at most since the backend was made (luce_model_memory):
    // implementations report each allocation's size to count_alloc / count_release.
    struct MemoryUse {
        int64_t in_use = 0, peak = 0;
    };
    MemoryUse memory_use() const {
        std::lock_guard<std::mutex> lock(memory_mutex_);
        return memory_;
    }
    // The whole device's free and total bytes, every process's and context's use counted, where
    // the backend has a device of its own (false on the CPU).
    virtual bool device_memory(int64_t &free, int64_t &total) const {
        (void)free, (void)total;
        return false;
    }
    virtual void upload(void *dst, const void *src, size_t n_bytes) = 0;
    virtual void download(void *dst, const void *src, size_t n_bytes) = 0;
    // Backend memory to backend memory (rollback checkpoints of the speculative loop).
    virtual void copy(void *dst, const void *src, size_t n_bytes) = 0;
    // Many such copies at once, in no order (no destination may overlap another op's source or
    // destination): a rollback restores and snapshots every recurrent layer (~150 copies a
    // DFlash 2 step on the 27B), which a GPU does in one launch instead of one each.
    struct CopyOp {
        void *dst;
        const void *src;
        size_t n_bytes;
    };
    virtual void copy_batch(const CopyOp *ops, int n) {
        for (int i = 0; i < n; ++i) copy(ops[i].dst, ops[i].src, ops[i].n_bytes);
    }
    // A weight matrix's copy in backend memory, from its GGUF bytes (n_bytes): the encoding the
    // backend's kernels read, which may re-lay bytes within a block (the GPU's IQ4_XS and Q6_K
    // layouts: docs/gpu.md). Only device backends are asked; the CPU reads the mapping.
    virtual void *upload_weight(const Weight &w, size_t n_bytes) {
        void *dst = alloc(n_bytes);
        upload(dst, w.data, n_bytes);
        return dst;
    }

    // Linear algebra -----------------------------------------------------------------------
    // y[t][r] = sum_c W[r][c] * x[t][c] for t < T; each weight row is read once for all T tokens.
    // y has row stride ldy (>= W.n_out), so a caller can write the head straight into logits rows.
    virtual void matmul(const Weight &w, const float *x, int T, float *y, int64_t ldy) = 0;
    // Several matmuls of one input x: out[i].y = out[i].w x (row stride out[i].ldy). A GPU backend
    // runs those of one weight type and width in one launch; the default runs them in turn.
    struct MatmulOut {
        const Weight *w;
        float *y;
        int64_t ldy;
    };
    virtual void matmuls(const float *x, int T, const MatmulOut *out, int n) {
        for (int i = 0; i < n; ++i) matmul(*out[i].w, x, T, out[i].y, out[i].ldy);
    }
    // out[t][:] = dequantized row ids[t] of w (the embedding gather; any supported type).
    virtual void get_rows(const Weight &w, const int32_t *ids, int T, float *out) = 0;

    // Normalisation and elementwise ----------------------------------------------------------
    // y_r = x_r * rsqrt(mean(x_r^2) + eps) * w for n_rows rows of `dim`; strides in floats.
    virtual void rmsnorm(const float *x, int64_t x_stride, const float *w, int n_rows, int dim,
                         float eps, float *y, int64_t y_stride) = 0;
    // o_r = rmsnorm(o_r) * w * silu(z_r) per row of `dim` (DeltaNet output norm; plain weight),
    // for T tokens of n_heads rows each (a token's n_heads * dim values are the next matmul's
    // input row).
    virtual void rmsnorm_gated(float *o, const float *w, const float *z, int T, int n_heads, int dim,
                               float eps) = 0;
    // o[r][d] *= sigmoid(g[r * g_stride + d]) (attention output gate).
    virtual void mul_sigmoid(float *o, const float *g, int64_t g_stride, int n_rows, int dim) = 0;
    // gate[i] = silu(gate[i]) * up[i] (SwiGLU) over n_rows rows of dim values (contiguous; the
    // rows let a backend lay the output out for the matmul that reads it next).
    virtual void swiglu(float *gate, const float *up, int n_rows, int64_t dim) = 0;
    // x[i] += y[i] (residual).
    virtual void add(float *x, const float *y, int64_t n) = 0;
    // x += y, then out = rmsnorm(x) * w, over n_rows contiguous rows of `dim`: a residual add and
    // the next norm, which a GPU backend fuses into one pass (one launch fewer per use).
    virtual void add_rmsnorm(float *x, const float *y, const float *w, int n_rows, int dim, float eps, float *out) {
        add(x, y, int64_t(n_rows) * dim);
        rmsnorm(x, dim, w, n_rows, dim, eps, out, dim);
    }

    // Attention ------------------------------------------------------------------------------
    // NeoX RoPE on the first n_rot dims of each head: pairs (i, i + n_rot/2), angle pos * theta^(-2i/n_rot).
    // x is [T][n_head][head_dim]; pos is [T].
    virtual void rope_neox(float *x, const int32_t *pos, int T, int n_head, int head_dim, int n_rot,
                           float theta) = 0;
    // Writes k, v ([T][Hkv][D]) into the cache at positions pos[t], as rows of the cache's types.
    virtual void kv_store(KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
                          int n_head_kv, int head_dim) = 0;
    // x = H x for each of n_rows rows of dim (a power of two), H the orthonormal Walsh-Hadamard
    // matrix: the default prologue's rotation of q and k for a rotated cache (kv_cache.h).
    virtual void hadamard_rows(float *x, int n_rows, int dim) = 0;
    // An attention layer's prologue: q = rmsnorm(q_h) * q_norm for the query heads of qg
    // ([T][H][2D], q_h the first D of each head's row) into q [T][H][D]; k = rmsnorm(k) * k_norm
    // in place; NeoX RoPE on both at pos; for a rotated cache both rotated (so attention reads q
    // and the cache as they are); then k and v into the cache at slot[t] (pos, or a tree step's
    // slots). The default is those ops; a GPU backend runs them in one launch.
    virtual void qk_norm_rope_store(const float *qg, const float *q_norm, float *q, float *k, const float *k_norm,
                                    const float *v, KvLayer &kv, const int32_t *pos, const int32_t *slot, int T,
                                    int n_head, int n_head_kv, int head_dim, int n_rot, float theta, float eps) {
        rmsnorm(qg, 2 * int64_t(head_dim), q_norm, T * n_head, head_dim, eps, q, head_dim);
        rmsnorm(k, head_dim, k_norm, T * n_head_kv, head_dim, eps, k, head_dim);
        rope_neox(q, pos, T, n_head, head_dim, n_rot, theta);
        rope_neox(k, pos, T, n_head_kv, head_dim, n_rot, theta);
        if (kv.format.rotate) {
            hadamard_rows(q, T * n_head, head_dim);
            hadamard_rows(k, T * n_head_kv, head_dim);
        }
        kv_store(kv, k, v, slot, T, n_head_kv, head_dim);
    }
    // out[t][h] = softmax(q[t][h] . K[h/(H/Hkv)][j] / sqrt(D)) V over visible keys j. Visible:
    // j <= pos[t] when mask is null; otherwise mask[t * n_ctx + j] != 0 (tree verify).
    virtual void attention(const float *q, const KvLayer &kv, const int32_t *pos, const uint8_t *mask,
                           int T, int n_head, int n_head_kv, int head_dim, float *out) = 0;

    // qk_norm_rope_store then attention for each of n sequences of a step: qg, q, k, v and out
    // are the step's buffers and pos its positions, each sequence at its rows. The default runs
    // the two ops per sequence; a backend may launch every sequence at once where each keeps the
    // bits of its own ops.
    virtual void attention_sequences(const float *qg, const float *q_norm, float *q, float *k, const float *k_norm,
                                     const float *v, const int32_t *pos, const AttentionRows *seqs, int n, int n_head,
                                     int n_head_kv, int head_dim, int n_rot, float theta, float eps, float *out) {
        const int64_t qg_w = 2 * int64_t(n_head) * head_dim, q_w = int64_t(n_head) * head_dim,
                      kv_w = int64_t(n_head_kv) * head_dim;
        for (const AttentionRows *s = seqs; s < seqs + n; ++s) {
            const int64_t r = s->row0;
            qk_norm_rope_store(qg + r * qg_w, q_norm, q + r * q_w, k + r * kv_w, k_norm, v + r * kv_w, *s->kv, pos + r,
                               s->slot, s->T, n_head, n_head_kv, head_dim, n_rot, theta, eps);
            attention(q + r * q_w, *s->kv, pos + r, s->mask, s->T, n_head, n_head_kv, head_dim, out + r * q_w);
        }
    }

    // Gated DeltaNet -------------------------------------------------------------------------
    // Causal depthwise conv over time then SiLU. x [T][C] raw projections; state [Kc-1][C] holds
    // the previous Kc-1 raw inputs (oldest first) and is advanced by T; w [C][Kc], tap Kc-1 = now.
    // Tree mode (parent != null, DDTree verify): token t's window runs back through its ancestors
    // (parent[t], -1 = the state) instead of t-1, t-2, ...; the state is left as it was.
    virtual void conv_silu(const float *x, float *state, const float *w, int T, int C, int Kc,
                           float *out, const int32_t *parent = nullptr) = 0;
    // The delta rule over T tokens (spec §1.4 steps 3-7) from the conv output.
    //   conv [T][CD] = [q (HK*DK) | k (HK*DK) | v (HV*DV)], b/a [T][HV] raw projections,
    //   ssm_a [HV] (= -exp(A_log)), dt_bias [HV], state [HV][DK][DV] fp32, out [T][HV][DV].
    // state_history, when not null, receives the state after each token ([T][HV][DK][DV]) so a
    // verify step can roll back to any accepted prefix; null for plain decoding.
    // Tree mode (parent != null; needs state_history): token t starts from the state after
    // parent[t] (the state before the step when -1) instead of after t-1.
    virtual void gated_delta_net(const float *conv, const float *b, const float *a, const float *ssm_a,
                                 const float *dt_bias, const DeltaNetDims &dims, int T, float *state,
                                 float *out, float *state_history, const int32_t *parent = nullptr) = 0;
    // conv_silu then gated_delta_net for each of n sequences of a batched causal step: qkv, b, a
    // and out are the step's buffers, conv_out its conv scratch, each sequence at its rows. The
    // default runs the two ops per sequence; a backend may run every sequence in one launch per op
    // if each sequence's outputs and states keep the bits of the per-sequence ops.
    virtual void deltanet_sequences(const float *qkv, const float *conv_w, int C, int Kc, float *conv_out,
                                    const float *b, const float *a, const float *ssm_a, const float *dt_bias,
                                    const DeltaNetDims &dims, const RecurrentRows *seqs, int n, float *out) {
        const int64_t inner = int64_t(dims.hv) * dims.dv;
        for (const RecurrentRows *r = seqs; r < seqs + n; ++r) {
            const int64_t row0 = r->row0;
            conv_silu(qkv + row0 * C, r->conv_state, conv_w, r->T, C, Kc, conv_out + row0 * C);
            gated_delta_net(conv_out + row0 * C, b + row0 * dims.hv, a + row0 * dims.hv, ssm_a, dt_bias, dims, r->T,
                            r->ssm, out + row0 * inner, r->ssm_history);
        }
    }

    // Sampling helpers ---------------------------------------------------------------------------
    // Index of the largest of n values (ties -> lowest index).
    virtual int32_t argmax(const float *x, int64_t n) = 0;

    // Drafter ops (block-diffusion drafters, drafter_forward.cpp / drafter_heads.cpp) ------------
    // Everything the drafter does per token runs through these on backend memory, so a drafter
    // bound to a GPU target runs on the GPU. CPU reference: backend_cpu.cpp, GPU: gpu/drafter.cu.

    // Rotate-half RoPE over the whole head with a precomputed table: pairs (i, i + D/2), angle
    // pos[t] * inv_freq[i] (fp32), cos and sin multiplied by mscale (YaRN attention factor).
    // x [T][n_head][D]; inv_freq [D/2] backend memory.
    virtual void rope_table(float *x, const int32_t *pos, int T, int n_head, int head_dim,
                            const float *inv_freq, float mscale) = 0;
    // The drafter's block attention masks (drafter_forward.cpp's header has the rule), built where
    // they are read: for each variant v in `variants` (bit v; v = 2 sliding + causal) and query slot
    // j < B, masks[(v * rows + j) * cap + i] = 1 when key i is visible: i < p0 (p0 = pos[0], read
    // from backend memory) and, for sliding variants, i > p0 + j - window; or p0 <= i < p0 + B and,
    // for causal variants, i - p0 <= j. Everything else 0.
    virtual void drafter_masks(uint8_t *masks, int rows, int cap, const int32_t *pos, int B, int window,
                               unsigned variants) = 0;
    // DFlash 2 grouped dynamic causal conv within a block (spec drafters.md §2.1), out != in:
    //   out[t][c] = sum_{tau < K, tau <= t} (base[tau][c] + dyn[t * dyn_stride + tau * G + c / group])
    //               * in[t - tau][c],   G = E / group;  base [K][E].
    virtual void dyn_conv(const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B,
                          int E, int K, int group, float *out) = 0;
    // x[i] = cap > 0 ? tanh(x[i] * mult / cap) * cap : x[i] * mult (DFlash 2 unary logits; fp32 in
    // z-lab's order: scale, divide, tanh, multiply).
    virtual void softcap(float *x, int64_t n, float mult, float cap) = 0;
    // out[r] = argmax of row r of x [n_rows][n] (ties -> lowest index), written to backend memory
    // so a chain can feed it to the next get_rows without a host round trip.
    virtual void argmax_rows(const float *x, int n_rows, int64_t n, int32_t *out) = 0;
    // The k largest of each row of x [n_rows][n], value descending, ties -> lower id:
    // ids, vals [n_rows][k]. k <= MAX_TOP_K.
    static constexpr int MAX_TOP_K = 256;
    virtual void topk_rows(const float *x, int n_rows, int64_t n, int k, int32_t *ids, float *vals) = 0;
    // DFlash 2 selector pair terms: out[t][a][b] = sum_r pred[t][a][r] * hproj[t][r] * succ[t][b][r]
    // for a, b < k; pred, succ [n_rows][k][R] gathered codebook rows, hproj [n_rows][R].
    virtual void selector_pairs(const float *hproj, const float *pred, const float *succ, int n_rows, int k,
                                int R, float *out) = 0;
    // DSpark confidence of one row: *out = sigmoid(b + w[0:E] . h + w[E:E+R] . e) (R = 0: no e).
    virtual void confidence(const float *h, const float *e, const float *w, float b, int E, int R,
                            float *out) = 0;
    // Strided byte copy in backend memory: n_rows rows of `width` bytes (feature capture).
    virtual void copy_rows(void *dst, int64_t dst_stride, const void *src, int64_t src_stride, int64_t width,
                           int n_rows) = 0;
    // Whether conv_silu / gated_delta_net implement tree mode (parent != null): DDTree needs it.
    virtual bool tree_mode() const = 0;

    // Step graphs (GPU, docs/gpu.md) ------------------------------------------------------------
    // A backend may record the launches of a forward step once and replay them when a step of the
    // same key recurs; every value that varies between such steps is in backend memory written
    // before the replay. The defaults (CPU) record nothing, so the caller runs the step eagerly.
    // graph_replay: launch the graph recorded for key; false when there is none.
    virtual bool graph_replay(uint64_t /*key*/) { return false; }
    // graph_begin: start recording the ops that follow for key; false: run them eagerly instead.
    virtual bool graph_begin(uint64_t /*key*/) { return false; }
    // graph_end: stop recording and run the recorded step; false when recording failed and nothing
    // ran (the caller then runs the step eagerly). graph_abort: stop recording, keep nothing.
    virtual bool graph_end(uint64_t /*key*/) { return false; }
    virtual void graph_abort() {}
    // Forget every recorded graph (the buffers they point into are going away).
    virtual void graph_clear() {}

    // Prefill (docs/gpu.md, docs/architecture-quants.md) -------------------------------------
    // Between set_prefill(true) and set_prefill(false) the steps ingest a prompt: their rows need
    // not be bit-identical to one-token steps of the same tokens (verify steps, which must be,
    // never run inside), so a backend may use kernels with another summation order for them.
    // The default ignores it. PrefillScope below pairs the two calls.
    virtual void set_prefill(bool /*on*/) {}
    virtual bool prefill() const { return false; }

protected:
    // Called by alloc() and release() with each allocation's size.
    void count_alloc(size_t n_bytes) {
        std::lock_guard<std::mutex> lock(memory_mutex_);
        memory_.in_use += int64_t(n_bytes);
        if (memory_.in_use > memory_.peak) memory_.peak = memory_.in_use;
    }
    void count_release(size_t n_bytes) {
        std::lock_guard<std::mutex> lock(memory_mutex_);
        memory_.in_use -= int64_t(n_bytes);
    }

private:
    mutable std::mutex memory_mutex_;  // sessions of one model may run on several threads
    MemoryUse memory_;
};

// Step graph keys: each owner of graphs (a session's forward steps, a draft context's blocks) takes
// an id for the high bits of its keys (key = owner << 17 | the step's shape), so owners never meet.
inline uint64_t new_graph_owner() {
    static std::atomic<uint64_t> next{1};
    return next++;
}

// launches() as the step graph of key: replayed when one is recorded, recorded on the key's second
// occurrence (the first runs eagerly, so every scratch buffer has grown to the shape), and run
// eagerly where the backend records nothing or recording fails (graphs then go off for it, and a
// real error surfaces in the eager run as usual). Everything that varies between steps of one key
// must be read from backend memory written before the call.
template <class Launches>
void run_graphed(Backend &be, uint64_t key, Launches &&launches) {
    if (be.graph_replay(key)) return;
    bool ran = false;
    if (be.graph_begin(key)) {
        try {
            launches();
            ran = be.graph_end(key);
        } catch (const Error &) {
            be.graph_abort();
        }
    }
    if (!ran) launches();
}

// Backend memory owned for one generation, released in reverse order.
struct BackendBuffers {
    Backend &be;
    std::vector<void *> owned;
    explicit BackendBuffers(Backend &b) : be(b) {}
    ~BackendBuffers() {
        for (auto it = owned.rbegin(); it != owned.rend(); ++it) be.release(*it);
    }
    BackendBuffers(const BackendBuffers &) = delete;
    BackendBuffers &operator=(const BackendBuffers &) = delete;
    template <typename T>
    T *array(size_t n) {
        owned.push_back(be.alloc(n * sizeof(T) + 64));
        return static_cast<T *>(owned.back());
    }
};

// The steps of a prompt's prefill, for the scope's lifetime (Backend::set_prefill).
class PrefillScope {
public:
    explicit PrefillScope(Backend &be) : be_(be) { be_.set_prefill(true); }
    ~PrefillScope() { be_.set_prefill(false); }
    PrefillScope(const PrefillScope &) = delete;
    PrefillScope &operator=(const PrefillScope &) = delete;

private:
    Backend &be_;
};

}  // namespace luce
