// model.h — the qwen35 target: hyperparameters, weights (views into the mapped GGUF), forward.
//
// Shape legend (spec/qwen35.md notation; 27B values in brackets):
//   E  hidden [5120]          V  vocab [248320]        F  MLP width [17408] (per layer)
//   H  q heads [24]           Hkv kv heads [4]         D  attention head dim [256]   R rotary dims [64]
//   HK DeltaNet k heads [16]  HV v heads [48]          DK = DV state dims [128]      Kc conv taps [4]
//   CD conv channels = 2*HK*DK + HV*DV [10240]         T  tokens in one step (1 for decode)
// GGUF dims are [in, out]: a weight's row r (ne0 contiguous elements) produces output feature r.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "gguf.h"

namespace luce {

struct Hparams {
    int n_layer_total = 0;   // qwen35.block_count (includes MTP blocks)
    int n_layer = 0;         // main layers run by the forward = block_count - nextn_predict_layers
    int n_vocab = 0, n_embd = 0, n_ctx_train = 0;
    std::vector<int> n_ff, n_head, n_head_kv;  // per main layer
    std::vector<bool> recurrent;               // per main layer: Gated DeltaNet (true) or attention
    int head_dim = 0;        // D (key_length == value_length)
    int n_rot = 0;           // R
    float rope_theta = 0.f;
    float rms_eps = 0.f;
    int ssm_conv = 0, ssm_dk = 0, ssm_hk = 0, ssm_hv = 0, ssm_dv = 0;  // Kc, DK, HK, HV, DV
    bool tied_head = false;
    // The MTP block blk.{n_layer} (spec qwen35.md §1.7), when the file keeps one: its heads and MLP width.
    int mtp_n_head = 0, mtp_n_head_kv = 0, mtp_n_ff = 0;

    int conv_channels() const { return 2 * ssm_hk * ssm_dk + ssm_hv * ssm_dv; }
    int max_n_ff() const;
    int max_q_width() const;   // max over attention layers of H*D
    int max_kv_width() const;  // max over attention layers of Hkv*D
};

// A small fp32 tensor (norm weights, conv taps, dt bias, ssm_a), dequantized once at load.
// data() is where the backend reads it: the host copy, or the device copy once the weights are
// on a GPU (upload_weights in model.cpp).
struct Vector {
    std::vector<float> host;
    const float *device = nullptr;
    Vector() = default;
    Vector(std::vector<float> v) : host(std::move(v)) {}
    const float *data() const { return device ? device : host.data(); }
    size_t size() const { return host.size(); }
};

// A full-attention layer (spec §1.3). attn_q rows are [q_h | gate_h] per head (2D rows per head).
struct AttentionWeights {
    Weight q, k, v, o;                  // [E -> 2*H*D], [E -> Hkv*D] x2, [H*D -> E]
    Vector q_norm, k_norm;              // [D], stored +1 (plain multipliers)
};

// A Gated DeltaNet layer (spec §1.4, GGUF tiled v-head order).
struct DeltaNetWeights {
    Weight qkv, gate, beta, alpha, out;  // [E -> CD], [E -> HV*DV], [E -> HV] x2, [HV*DV -> E]
    Vector conv;                         // [CD][Kc], tap Kc-1 = current token
    Vector dt_bias, a;                   // [HV]; a = -exp(A_log)
    Vector norm;                         // [DV], plain weight (no +1)
};

struct LayerWeights {
    Vector attn_norm, post_norm;              // [E], stored +1
    Weight ffn_gate, ffn_up, ffn_down;        // [E -> F] x2, [F -> E]
    AttentionWeights attn;                    // full-attention layers only
    DeltaNetWeights ssm;                      // recurrent layers only
};

// The multi-token-prediction block (spec qwen35.md §1.7, llama.cpp graph_mtp): a full-attention
// decoder block over eh_proj([enorm(embed(token)) | hnorm(h)]), h the target's final-normed hidden
// state of the previous position; its logits are head(head_norm(block output)). The norms hold
// 1 + w like every qwen35 norm. embed and head are the target's token_embd and output unless the
// file has nextn.embed_tokens / nextn.shared_head_head.
struct MtpWeights {
    LayerWeights block;              // attention weights in block.attn; block.ssm unused
    Weight eh_proj;                  // [2E -> E]
    Vector enorm, hnorm, head_norm;  // [E]
    Weight embed, head;              // [E -> V]
    bool own_embed = false, own_head = false;  // the file's nextn ones, not the target's
};

struct Model {
    std::unique_ptr<GgufFile> file;  // owns the mapping every Weight points into
    Hparams hp;
    Weight token_embd;               // [E -> V] rows gathered by token id
    Weight output;                   // [E -> V]; token_embd when the head is tied
    Vector output_norm;              // [E]
    std::vector<LayerWeights> layers;
    std::unique_ptr<MtpWeights> mtp; // null when the file has no MTP block
    std::unique_ptr<Backend> backend;
    int64_t n_params = 0, weight_bytes = 0;
    int32_t eos_token_id = -1;       // tokenizer.ggml.eos_token_id, -1 if absent
};

// M-RoPE sections (`key`, optional): an integer array of at most 4 entries, each >= 0, summing to
// at most n_rot / 2 rotary pairs. Targets and llama.cpp-layout drafters carry them; both sides of
// the validator (converters/target_rules.py) apply this rule. Throws luce::Error (FORMAT).
void check_rope_sections(const GgufFile &f, const std::string &key, int n_rot, const std::string &n_rot_name);

// Opens, validates and binds a qwen35 GGUF. Throws luce::Error (FORMAT / UNSUPPORTED / IO).
// device is a luce_device: on LUCE_DEVICE_GPU the GPU backend is opened (gpu_loader.h) and every
// weight uploaded once, in its encoding (LUCE_ERR_DEVICE if that is not possible).
// Reports weight placement as (bytes done, total): per tensor upload on the GPU, once on the CPU.
using LoadProgress = std::function<void(int64_t done, int64_t total)>;
std::unique_ptr<Model> load_model(const std::string &path, int n_threads, int device = 0, int gpu_index = 0,
                                  const LoadProgress &progress = {});

}  // namespace luce
