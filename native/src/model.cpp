// model.cpp — binds a validated GGUF to the qwen35 hyperparameters and weights.
//
// Order of checks: the container (gguf.cpp) is already sound; then the architecture, then the
// weight types (refused as a whole, with a per-type histogram), then every hyperparameter within
// bounds, then every tensor the forward touches against the shape the hyperparameters imply. Only
// after all of that is anything sized by the file allocated (per-layer vectors are sized by a
// block_count that has passed its bound).
#include "model.h"

#include <algorithm>
#include <map>

#include "backend_cpu.h"
#include "errors.h"
#include "gpu_loader.h"
#include "quants.h"

namespace luce {

namespace {

// GGUF keys (spec/qwen35.md §3.2): each spelled here once.
const char *KEY_ARCH = "general.architecture";
const char *ARCH = "qwen35";
const char *KEY_BLOCK_COUNT = "qwen35.block_count";
const char *KEY_NEXTN = "qwen35.nextn_predict_layers";
const char *KEY_CTX = "qwen35.context_length";
const char *KEY_EMBD = "qwen35.embedding_length";
const char *KEY_FF = "qwen35.feed_forward_length";
const char *KEY_HEAD = "qwen35.attention.head_count";
const char *KEY_HEAD_KV = "qwen35.attention.head_count_kv";
const char *KEY_KEY_LEN = "qwen35.attention.key_length";
const char *KEY_VALUE_LEN = "qwen35.attention.value_length";
const char *KEY_EPS = "qwen35.attention.layer_norm_rms_epsilon";
const char *KEY_RECURRENT = "qwen35.attention.recurrent_layers";
const char *KEY_INTERVAL = "qwen35.full_attention_interval";
const char *KEY_ROPE_DIM = "qwen35.rope.dimension_count";
const char *KEY_ROPE_SECTIONS = "qwen35.rope.dimension_sections";
const char *KEY_ROPE_BASE = "qwen35.rope.freq_base";
const char *KEY_SSM_CONV = "qwen35.ssm.conv_kernel";
const char *KEY_SSM_STATE = "qwen35.ssm.state_size";
const char *KEY_SSM_GROUPS = "qwen35.ssm.group_count";
const char *KEY_SSM_RANK = "qwen35.ssm.time_step_rank";
const char *KEY_SSM_INNER = "qwen35.ssm.inner_size";
const char *KEY_EOS = "tokenizer.ggml.eos_token_id";
const char *KEY_SPLIT_COUNT = "split.count";

constexpr int64_t DEFAULT_INTERVAL = 4;       // llama.cpp's default when the key is absent
constexpr double DEFAULT_ROPE_BASE = 10000.0;

// Bounds on hyperparameters: generous for any real model, small enough that nothing sized by
// them can be a huge allocation (llama.cpp caps layers at 512 too). converters/target_rules.py
// holds the same rules for `luce inspect` (same names, same messages, same order);
// tests/test_validator_parity.py keeps the two in step.
constexpr int64_t MAX_LAYERS = 512;
constexpr int64_t MAX_EMBD = 1 << 16;
constexpr int64_t MAX_HEADS = 1024;
constexpr int64_t MAX_HEAD_DIM = 1024;
constexpr int64_t MAX_FF = 1 << 20;
constexpr int64_t MAX_VOCAB = 1 << 22;
constexpr int64_t MAX_CTX = 1 << 24;
constexpr int64_t MAX_CONV = 64;
constexpr int64_t MAX_SSM_DIM = 1024;
constexpr int64_t MAX_ROPE_SECTIONS = 4;  // llama.cpp reads at most four M-RoPE sections

int64_t bounded(int64_t v, int64_t lo, int64_t hi, const char *what) {
    if (v < lo || v > hi)
        fail(LUCE_ERR_FORMAT, "%s = %lld is out of range [%lld, %lld]", what, (long long)v,
             (long long)lo, (long long)hi);
    return v;
}

std::string supported_type_list() {
    std::string s;
    for (int32_t t = 0; t < 64; ++t) {
        const TypeTraits *tt = type_traits(t);
        if (tt && tt->supported) s += (s.empty() ? "" : " ") + std::string(tt->name);
    }
    return s;
}

// Refuses the file if any tensor has a type we cannot compute with, naming every such type with
// its count and first tensor (so a user can tell an odd tensor from a whole unsupported recipe).
void check_weight_types(const GgufFile &f) {
    std::map<std::string, std::pair<int, std::string>> unsupported;  // type -> (count, first tensor)
    for (const GgufTensor &t : f.tensors())
        if (!is_supported_weight_type(t.type)) {
            auto &entry = unsupported[type_traits(t.type)->name];
            if (entry.first++ == 0) entry.second = t.name;
        }
    if (unsupported.empty()) return;
    std::string hist;
    for (auto &[name, seen] : unsupported)
        hist += (hist.empty() ? "" : ", ") + name + " x" + std::to_string(seen.first) + " (first " + seen.second + ")";
    fail(LUCE_ERR_UNSUPPORTED, "unsupported weight types: %s (supported: %s)", hist.c_str(),
         supported_type_list().c_str());
}

Hparams read_hparams(const GgufFile &f) {
    Hparams hp;
    hp.n_layer_total = int(bounded(f.get_int(KEY_BLOCK_COUNT), 1, MAX_LAYERS, KEY_BLOCK_COUNT));
    int64_t nextn = bounded(f.get_int(KEY_NEXTN, 0), 0, hp.n_layer_total - 1, KEY_NEXTN);
    hp.n_layer = hp.n_layer_total - int(nextn);  // MTP blocks sit after the main stack; never run
    hp.n_ctx_train = int(bounded(f.get_int(KEY_CTX), 1, MAX_CTX, KEY_CTX));
    hp.n_embd = int(bounded(f.get_int(KEY_EMBD), 1, MAX_EMBD, KEY_EMBD));
    hp.rms_eps = float(f.get_float(KEY_EPS));
    if (!(hp.rms_eps > 0.f && hp.rms_eps < 1.f))
        fail(LUCE_ERR_FORMAT, "%s = %g is not in (0, 1)", KEY_EPS, double(hp.rms_eps));

    // Layer kinds: the explicit per-layer array if present, else llama.cpp's interval rule.
    hp.recurrent.resize(size_t(hp.n_layer));
    if (f.has(KEY_RECURRENT)) {
        std::vector<bool> r = f.get_bool_array(KEY_RECURRENT, hp.n_layer_total);
        for (int i = 0; i < hp.n_layer; ++i) hp.recurrent[size_t(i)] = r[size_t(i)];
    } else {
        int64_t interval = bounded(f.get_int(KEY_INTERVAL, DEFAULT_INTERVAL), 1, MAX_LAYERS, KEY_INTERVAL);
        for (int i = 0; i < hp.n_layer; ++i) hp.recurrent[size_t(i)] = (i + 1) % interval != 0;
    }
    bool any_attention = false, any_recurrent = false;
    for (int i = 0; i < hp.n_layer; ++i) (hp.recurrent[size_t(i)] ? any_recurrent : any_attention) = true;

    std::vector<int64_t> ff = f.get_int_per_layer(KEY_FF, hp.n_layer_total);
    std::vector<int64_t> heads = f.get_int_per_layer(KEY_HEAD, hp.n_layer_total);
    std::vector<int64_t> heads_kv = f.get_int_per_layer(KEY_HEAD_KV, hp.n_layer_total);
    hp.n_ff.resize(size_t(hp.n_layer));
    hp.n_head.resize(size_t(hp.n_layer));
    hp.n_head_kv.resize(size_t(hp.n_layer));
    for (int i = 0; i < hp.n_layer; ++i) {
        hp.n_ff[size_t(i)] = int(bounded(ff[size_t(i)], 1, MAX_FF, KEY_FF));
        if (hp.recurrent[size_t(i)]) continue;  // per-layer arrays may hold 0 for DeltaNet layers
        int64_t h = bounded(heads[size_t(i)], 1, MAX_HEADS, KEY_HEAD);
        int64_t hkv = bounded(heads_kv[size_t(i)], 1, MAX_HEADS, KEY_HEAD_KV);
        if (h % hkv != 0)
            fail(LUCE_ERR_FORMAT, "layer %d: %lld query heads are not a multiple of %lld kv heads", i,
                 (long long)h, (long long)hkv);
        hp.n_head[size_t(i)] = int(h);
        hp.n_head_kv[size_t(i)] = int(hkv);
    }

    if (nextn == 1) {  // the MTP block's sizes, checked only if its tensors are there (bind_mtp)
        const size_t i = size_t(hp.n_layer);
        const auto clamp = [](int64_t v, int64_t hi) { return int(std::clamp<int64_t>(v, 0, hi + 1)); };
        hp.mtp_n_ff = clamp(ff[i], MAX_FF);
        hp.mtp_n_head = clamp(heads[i], MAX_HEADS);
        hp.mtp_n_head_kv = clamp(heads_kv[i], MAX_HEADS);
    }

    if (any_attention) {
        hp.head_dim = int(bounded(f.get_int(KEY_KEY_LEN), 1, MAX_HEAD_DIM, KEY_KEY_LEN));
        if (f.get_int(KEY_VALUE_LEN, hp.head_dim) != hp.head_dim)
            fail(LUCE_ERR_UNSUPPORTED, "%s differs from %s", KEY_VALUE_LEN, KEY_KEY_LEN);
        hp.n_rot = int(bounded(f.get_int(KEY_ROPE_DIM), 0, hp.head_dim, KEY_ROPE_DIM));
        if (hp.n_rot % 2 != 0) fail(LUCE_ERR_FORMAT, "%s = %d must be even", KEY_ROPE_DIM, hp.n_rot);
        // Text positions are equal on every axis, so the forward ropes them as plain NeoX and
        // never reads the sections; a file whose sections do not fit its head is another model.
        check_rope_sections(f, KEY_ROPE_SECTIONS, hp.n_rot, KEY_ROPE_DIM);
        hp.rope_theta = float(f.get_float(KEY_ROPE_BASE, DEFAULT_ROPE_BASE));
        if (!(hp.rope_theta > 1.f)) fail(LUCE_ERR_FORMAT, "%s must be > 1", KEY_ROPE_BASE);
    }
    if (any_recurrent) {
        hp.ssm_conv = int(bounded(f.get_int(KEY_SSM_CONV), 1, MAX_CONV, KEY_SSM_CONV));
        hp.ssm_dk = int(bounded(f.get_int(KEY_SSM_STATE), 1, MAX_SSM_DIM, KEY_SSM_STATE));
        hp.ssm_hk = int(bounded(f.get_int(KEY_SSM_GROUPS), 1, MAX_HEADS, KEY_SSM_GROUPS));
        hp.ssm_hv = int(bounded(f.get_int(KEY_SSM_RANK), 1, MAX_HEADS, KEY_SSM_RANK));
        int64_t inner = bounded(f.get_int(KEY_SSM_INNER), 1, MAX_HEADS * MAX_SSM_DIM, KEY_SSM_INNER);
        if (inner % hp.ssm_hv != 0)
            fail(LUCE_ERR_FORMAT, "%s = %lld is not a multiple of %s = %d", KEY_SSM_INNER,
                 (long long)inner, KEY_SSM_RANK, hp.ssm_hv);
        hp.ssm_dv = int(bounded(inner / hp.ssm_hv, 1, MAX_SSM_DIM, "ssm value head dim"));
        if (hp.ssm_hv % hp.ssm_hk != 0)
            fail(LUCE_ERR_FORMAT, "%s = %d is not a multiple of %s = %d", KEY_SSM_RANK, hp.ssm_hv,
                 KEY_SSM_GROUPS, hp.ssm_hk);
    }
    return hp;
}

// Binds tensors by name, checking type and shape, and counts what the model keeps.
struct Binder {
    const GgufFile &f;
    Model &m;

    const GgufTensor &find(const std::string &name) {
        const GgufTensor *t = f.tensor(name);
        if (!t) fail(LUCE_ERR_FORMAT, "missing tensor %s", name.c_str());
        return *t;
    }
    void count(const GgufTensor &t) {
        m.n_params += t.n_elements;
        m.weight_bytes += int64_t(t.n_bytes);
    }
    Weight matrix(const std::string &name, int64_t n_in, int64_t n_out) {
        const GgufTensor &t = find(name);
        if (t.ne[0] != n_in || t.ne[1] != n_out || t.ne[2] != 1 || t.ne[3] != 1)
            fail(LUCE_ERR_FORMAT, "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                 name.c_str(), (long long)t.ne[0], (long long)t.ne[1], (long long)t.ne[2],
                 (long long)t.ne[3], (long long)n_in, (long long)n_out);
        count(t);
        Weight w;
        w.type = t.type;
        w.n_in = n_in;
        w.n_out = n_out;
        w.data = t.data;
        return w;
    }
    // Small tensors (norms, ssm_a, dt bias, conv taps) are dequantized to fp32 once at load.
    std::vector<float> vector(const std::string &name, int64_t n_elements) {
        const GgufTensor &t = find(name);
        if (t.n_elements != n_elements)
            fail(LUCE_ERR_FORMAT, "tensor %s has %lld elements, expected %lld", name.c_str(),
                 (long long)t.n_elements, (long long)n_elements);
        count(t);
        std::vector<float> out(static_cast<size_t>(n_elements));
        dequantize_row(t.type, t.data, out.data(), n_elements);
        return out;
    }
};

std::string blk(int i, const char *suffix) { return "blk." + std::to_string(i) + "." + suffix; }

void bind_layer(Binder &b, const Hparams &hp, int i, LayerWeights &L) {
    const int64_t E = hp.n_embd, F = hp.n_ff[size_t(i)];
    L.attn_norm = b.vector(blk(i, "attn_norm.weight"), E);
    L.post_norm = b.vector(blk(i, "post_attention_norm.weight"), E);
    L.ffn_gate = b.matrix(blk(i, "ffn_gate.weight"), E, F);
    L.ffn_up = b.matrix(blk(i, "ffn_up.weight"), E, F);
    L.ffn_down = b.matrix(blk(i, "ffn_down.weight"), F, E);
    if (hp.recurrent[size_t(i)]) {
        const int64_t HV = hp.ssm_hv, inner = int64_t(hp.ssm_hv) * hp.ssm_dv, CD = hp.conv_channels();
        DeltaNetWeights &s = L.ssm;
        s.qkv = b.matrix(blk(i, "attn_qkv.weight"), E, CD);
        s.gate = b.matrix(blk(i, "attn_gate.weight"), E, inner);
        s.beta = b.matrix(blk(i, "ssm_beta.weight"), E, HV);
        s.alpha = b.matrix(blk(i, "ssm_alpha.weight"), E, HV);
        s.out = b.matrix(blk(i, "ssm_out.weight"), inner, E);
        s.conv = b.vector(blk(i, "ssm_conv1d.weight"), CD * hp.ssm_conv);
        s.dt_bias = b.vector(blk(i, "ssm_dt.bias"), HV);
        s.a = b.vector(blk(i, "ssm_a"), HV);
        s.norm = b.vector(blk(i, "ssm_norm.weight"), hp.ssm_dv);
    } else {
        const int64_t H = hp.n_head[size_t(i)], Hkv = hp.n_head_kv[size_t(i)], D = hp.head_dim;
        AttentionWeights &a = L.attn;
        a.q = b.matrix(blk(i, "attn_q.weight"), E, 2 * H * D);  // [q_h | gate_h] per head
        a.k = b.matrix(blk(i, "attn_k.weight"), E, Hkv * D);
        a.v = b.matrix(blk(i, "attn_v.weight"), E, Hkv * D);
        a.o = b.matrix(blk(i, "attn_output.weight"), H * D, E);
        a.q_norm = b.vector(blk(i, "attn_q_norm.weight"), D);
        a.k_norm = b.vector(blk(i, "attn_k_norm.weight"), D);
    }
}

// The MTP block blk.{n_layer} (nextn_predict_layers = 1 and nextn.eh_proj present): a full-attention
// layer's tensors plus the nextn.* ones; nextn.shared_head_norm, nextn.embed_tokens and
// nextn.shared_head_head fall back to output_norm, token_embd and output (llama.cpp does the same).
// Files with more MTP blocks, or without attention layers to size its heads, keep none.
void bind_mtp(Binder &b, Hparams &hp) {
    const int i = hp.n_layer;
    if (hp.n_layer_total != hp.n_layer + 1 || !b.f.tensor(blk(i, "nextn.eh_proj.weight")) || hp.head_dim == 0)
        return;
    if (hp.mtp_n_ff < 1 || hp.mtp_n_ff > MAX_FF)
        fail(LUCE_ERR_FORMAT, "MTP block %d: %s is not in 1..%lld", i, KEY_FF, (long long)MAX_FF);
    if (hp.mtp_n_head < 1 || hp.mtp_n_head > MAX_HEADS || hp.mtp_n_head_kv < 1 || hp.mtp_n_head_kv > MAX_HEADS ||
        hp.mtp_n_head % hp.mtp_n_head_kv != 0)
        fail(LUCE_ERR_FORMAT, "MTP block %d: the query heads are not a multiple of the kv heads (both in 1..%lld)",
             i, (long long)MAX_HEADS);
    // bind_layer reads the per-layer arrays at i: lend it the MTP block's entries for the call.
    Hparams view = hp;
    view.n_ff.push_back(hp.mtp_n_ff);
    view.n_head.push_back(hp.mtp_n_head);
    view.n_head_kv.push_back(hp.mtp_n_head_kv);
    view.recurrent.push_back(false);
    auto mtp = std::make_unique<MtpWeights>();
    bind_layer(b, view, i, mtp->block);
    const int64_t E = hp.n_embd;
    mtp->eh_proj = b.matrix(blk(i, "nextn.eh_proj.weight"), 2 * E, E);
    mtp->enorm = b.vector(blk(i, "nextn.enorm.weight"), E);
    mtp->hnorm = b.vector(blk(i, "nextn.hnorm.weight"), E);
    const auto optional = [&](const char *suffix) { return b.f.tensor(blk(i, suffix)) != nullptr; };
    mtp->head_norm = optional("nextn.shared_head_norm.weight") ? b.vector(blk(i, "nextn.shared_head_norm.weight"), E)
                                                               : b.m.output_norm;
    mtp->own_embed = optional("nextn.embed_tokens.weight");
    mtp->own_head = optional("nextn.shared_head_head.weight");
    mtp->embed = mtp->own_embed ? b.matrix(blk(i, "nextn.embed_tokens.weight"), E, hp.n_vocab) : b.m.token_embd;
    mtp->head = mtp->own_head ? b.matrix(blk(i, "nextn.shared_head_head.weight"), E, hp.n_vocab) : b.m.output;
    b.m.mtp = std::move(mtp);
}

// Copies every weight the forward reads into backend memory, once, in its GGUF encoding, and
// points the model at the copies (the tied head shares token_embd's copy). The mapped file stays
// open; the backend frees the copies when it is destroyed.
// Calls on_matrix / on_vector for every weight the backend keeps (the tied head once).
template <class OnMatrix, class OnVector>
void for_each_weight(Model &m, OnMatrix on_matrix, OnVector on_vector) {
    on_matrix(m.token_embd);
    if (!m.hp.tied_head) on_matrix(m.output);
    on_vector(m.output_norm);
    std::vector<LayerWeights *> layers;
    for (LayerWeights &L : m.layers) layers.push_back(&L);
    if (m.mtp) {
        layers.push_back(&m.mtp->block);
        on_matrix(m.mtp->eh_proj);
        for (Vector *v : {&m.mtp->enorm, &m.mtp->hnorm, &m.mtp->head_norm}) on_vector(*v);
        // embed and head are the target's unless the file has its own (shared ones are
        // re-pointed at the target's copies after the upload, upload_weights).
        if (m.mtp->own_embed) on_matrix(m.mtp->embed);
        if (m.mtp->own_head) on_matrix(m.mtp->head);
    }
    for (LayerWeights *layer : layers) {
        LayerWeights &L = *layer;
        on_vector(L.attn_norm);
        on_vector(L.post_norm);
        for (Weight *w : {&L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o,
                          &L.ssm.qkv, &L.ssm.gate, &L.ssm.beta, &L.ssm.alpha, &L.ssm.out})
            on_matrix(*w);
        for (Vector *v : {&L.attn.q_norm, &L.attn.k_norm, &L.ssm.conv, &L.ssm.dt_bias, &L.ssm.a, &L.ssm.norm})
            on_vector(*v);
    }
}

size_t matrix_bytes(const Weight &w) { return w.present() ? size_t(row_bytes(w.type, w.n_in)) * size_t(w.n_out) : 0; }
size_t vector_bytes(const Vector &v) { return v.host.size() * sizeof(float); }

void upload_weights(Model &m, const LoadProgress &progress) {
    Backend &be = *m.backend;
    int64_t total = 0, done = 0;
    for_each_weight(m, [&](Weight &w) { total += int64_t(matrix_bytes(w)); },
                    [&](Vector &v) { total += int64_t(vector_bytes(v)); });
    auto uploaded = [&](size_t bytes) {
        done += int64_t(bytes);
        if (progress && bytes) progress(done, total);
    };
    for_each_weight(
        m,
        [&](Weight &w) {
            const size_t bytes = matrix_bytes(w);
            if (!bytes) return;
            w.data = be.upload_weight(w, bytes);
            uploaded(bytes);
        },
        [&](Vector &v) {
            const size_t bytes = vector_bytes(v);
            if (!bytes) return;
            void *dst = be.alloc(bytes);
            be.upload(dst, v.host.data(), bytes);
            v.device = static_cast<const float *>(dst);
            uploaded(bytes);
        });
    if (m.hp.tied_head) m.output = m.token_embd;  // shares the embedding's device copy
    if (m.mtp && !m.mtp->own_embed) m.mtp->embed = m.token_embd;
    if (m.mtp && !m.mtp->own_head) m.mtp->head = m.output;
}

}  // namespace

void check_rope_sections(const GgufFile &f, const std::string &key, int n_rot, const std::string &n_rot_name) {
    const GgufValue *v = f.find(key);
    if (!v) return;
    if (v->type != GgufType::ARRAY || !(v->elem_type == GgufType::U8 || v->elem_type == GgufType::I8 ||
                                        v->elem_type == GgufType::U16 || v->elem_type == GgufType::I16 ||
                                        v->elem_type == GgufType::U32 || v->elem_type == GgufType::I32 ||
                                        v->elem_type == GgufType::U64 || v->elem_type == GgufType::I64))
        fail(LUCE_ERR_FORMAT, "key '%s' must be an integer array", key.c_str());
    if (v->count > uint64_t(MAX_ROPE_SECTIONS))
        fail(LUCE_ERR_FORMAT, "key '%s' has %llu entries, at most %lld", key.c_str(), (unsigned long long)v->count,
             (long long)MAX_ROPE_SECTIONS);
    std::vector<int64_t> s = f.get_int_per_layer(key, int64_t(v->count));
    int64_t sum = 0;
    bool negative = false;
    std::string list;
    for (int64_t x : s) {
        negative |= x < 0;
        if (x > 0) sum += std::min<int64_t>(x, n_rot + 1);  // clamped: a sum of four never overflows
        list += (list.empty() ? "" : ", ") + std::to_string(x);
    }
    if (negative || sum > n_rot / 2)
        fail(LUCE_ERR_FORMAT, "%s = [%s] does not fit %s = %d: sections must be >= 0 and sum to at most %d",
             key.c_str(), list.c_str(), n_rot_name.c_str(), n_rot, n_rot / 2);
}

int Hparams::max_n_ff() const { return *std::max_element(n_ff.begin(), n_ff.end()); }

int Hparams::max_q_width() const {
    int w = 0;
    for (int i = 0; i < n_layer; ++i)
        if (!recurrent[size_t(i)]) w = std::max(w, n_head[size_t(i)] * head_dim);
    return w;
}

int Hparams::max_kv_width() const {
    int w = 0;
    for (int i = 0; i < n_layer; ++i)
        if (!recurrent[size_t(i)]) w = std::max(w, n_head_kv[size_t(i)] * head_dim);
    return w;
}

std::unique_ptr<Model> load_model(const std::string &path, int n_threads, int device, int gpu_index,
                                  const LoadProgress &progress) {
    auto m = std::make_unique<Model>();
    m->file.reset(GgufFile::open(path));
    const GgufFile &f = *m->file;

    std::string arch = f.get_string(KEY_ARCH, "");
    if (arch.empty()) fail(LUCE_ERR_FORMAT, "%s has no %s", path.c_str(), KEY_ARCH);
    if (arch != ARCH)
        fail(LUCE_ERR_UNSUPPORTED, "unsupported architecture '%s' (luce runs '%s' targets)",
             arch.c_str(), ARCH);
    // Split files (e.g. a BF16 27B in two parts) keep tensor offsets per part; loading one part
    // alone would only fail later on a missing tensor, so say what is going on.
    if (f.get_int(KEY_SPLIT_COUNT, 1) > 1)
        fail(LUCE_ERR_UNSUPPORTED,
             "%s is part of a split GGUF (%lld parts); merge it first (llama-gguf-split --merge)",
             path.c_str(), (long long)f.get_int(KEY_SPLIT_COUNT));
    check_weight_types(f);
    m->hp = read_hparams(f);
    Hparams &hp = m->hp;

    Binder b{f, *m};
    const GgufTensor &embd = b.find("token_embd.weight");
    if (embd.n_dims != 2 || embd.ne[0] != hp.n_embd)
        fail(LUCE_ERR_FORMAT, "token_embd.weight rows have %lld elements, expected %s = %d",
             (long long)embd.ne[0], KEY_EMBD, hp.n_embd);
    hp.n_vocab = int(bounded(embd.ne[1], 1, MAX_VOCAB, "vocabulary size (token_embd rows)"));
    m->token_embd = b.matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
    m->output_norm = b.vector("output_norm.weight", hp.n_embd);
    hp.tied_head = f.tensor("output.weight") == nullptr;  // tied: the head reuses token_embd
    m->output = hp.tied_head ? m->token_embd : b.matrix("output.weight", hp.n_embd, hp.n_vocab);

    m->layers.resize(size_t(hp.n_layer));
    for (int i = 0; i < hp.n_layer; ++i) bind_layer(b, hp, i, m->layers[size_t(i)]);
    bind_mtp(b, hp);

    m->eos_token_id = -1;
    if (f.has(KEY_EOS)) {
        int64_t eos = f.get_int(KEY_EOS);
        if (eos >= 0 && eos < hp.n_vocab) m->eos_token_id = int32_t(eos);
    }
    if (device == LUCE_DEVICE_GPU) {
        m->backend = open_gpu_backend(gpu_index, m->weight_bytes);  // checks memory first
        upload_weights(*m, progress);
    } else {
        m->backend = std::make_unique<CpuBackend>(n_threads);
        if (progress) progress(m->weight_bytes, m->weight_bytes);  // mapped: nothing to move
    }
    return m;
}

}  // namespace luce
