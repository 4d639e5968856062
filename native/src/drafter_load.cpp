// drafter_load.cpp — opens a drafter GGUF (lucebox `qwen35-dflash-draft` or upstream `dflash`
// layout), validates it with the rules `luce inspect` applies (converters/validate.py, spec
// engine.md §3), binds it to a target and precomputes the RoPE table.
//
// Names: converters/schema.py is the source of truth; the table below spells each key and tensor
// name once for the native side (tests load files that schema.py wrote, in both layouts). Every
// tensor's type, dimensions and element count are checked before any pointer into it is used.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "drafter.h"
#include "errors.h"
#include "quants.h"

namespace luce {

namespace {

// ---- names (schema.py) -------------------------------------------------------------------------
const char *KEY_ARCH = "general.architecture";
const char *ARCHS[] = {"qwen35-dflash-draft", "dflash", "dflash-draft", "gemma4-dflash-draft"};

// Suffixes after "{arch}.". Where two are listed, the lucebox one is tried first.
const char *K_EMBD = "embedding_length", *K_LAYERS = "block_count", *K_FF = "feed_forward_length";
const char *K_HEAD = "attention.head_count", *K_HEAD_KV = "attention.head_count_kv";
const char *K_KEY_LEN = "attention.key_length", *K_EPS = "attention.layer_norm_rms_epsilon";
const char *K_VALUE_LEN = "attention.value_length", *K_VOCAB = "vocab_size";
const char *K_ROPE_SECTIONS = "rope.dimension_sections";
const char *K_ROPE_BASE = "rope.freq_base", *K_YARN_FACTOR = "rope.scaling.factor";
const char *K_YARN_ORIG = "rope.scaling.original_context_length";
const char *K_YARN_ATTN = "rope.scaling.attn_factor";
const char *K_YARN_BETA_FAST[] = {"rope.scaling.beta_fast", "rope.scaling.yarn_beta_fast"};
const char *K_YARN_BETA_SLOW[] = {"rope.scaling.beta_slow", "rope.scaling.yarn_beta_slow"};
const char *K_SWA = "attention.sliding_window", *K_SWA_PATTERN = "attention.sliding_window_pattern";
const char *K_CAUSAL = "attention.causal";
const char *K_BLOCK[] = {"dflash.block_size", "block_size"};
const char *K_MASK[] = {"dflash.mask_token_id", "mask_token_id"};
const char *K_MASK_UPSTREAM = "dflash.mask_token_id", *K_MASK_TOKENIZER = "tokenizer.ggml.mask_token_id";
const char *K_TARGET_IDS = "dflash.target_layer_ids", *K_TARGET_LAYERS_1BASED = "target_layers";
const char *K_N_TARGET = "dflash.n_target_layers";
const char *K_ANCHOR[] = {"dflash.sample_from_anchor", "sample_from_anchor"};
const char *K_CONV_K[] = {"dflash.dflash2.conv_kernel_size", "conv_kernel_size"};
const char *K_CONV_G[] = {"dflash.dflash2.conv_group_size", "conv_group_size"};
const char *K_SEL_RANK[] = {"dflash.dflash2.selector_rank", "selector_rank"};
const char *K_SEL_TOPK[] = {"dflash.dflash2.selector_top_k", "selector_top_k"};
const char *K_DSPARK_ENABLED = "dflash.dspark.enabled", *K_DSPARK_RANK = "dflash.dspark.markov_rank";
const char *K_DSPARK_VOCAB = "dflash.dspark.vocab_size", *K_DSPARK_CONF_DIM = "dflash.dspark.confidence_dim";
const char *UPSTREAM_ARCH = "dflash";
// DFlash 2 unary-logit scalars: lucebox's own keys, then llama.cpp's generic ones (same transform).
const char *K_OUTPUT_MULTIPLIER[] = {"dflash.dflash2.output_multiplier", "logit_scale"};
const char *K_SOFTCAP[] = {"dflash.dflash2.final_logit_softcapping", "final_logit_softcapping"};

struct TensorName {
    const char *lucebox, *upstream;  // {} = layer index
    const char *legacy = nullptr;    // luce's upstream spelling before it matched llama.cpp's
};
const TensorName T_FC{"dflash.fc.weight", "fc.weight"};
const TensorName T_HIDDEN_NORM{"dflash.hidden_norm.weight", "enc.output_norm.weight"};
const TensorName T_OUTPUT_NORM{"output_norm.weight", "output_norm.weight"};
const TensorName T_ATTN_NORM{"blk.{}.attn_norm.weight", "blk.{}.attn_norm.weight"};
const TensorName T_FFN_NORM{"blk.{}.ffn_norm.weight", "blk.{}.ffn_norm.weight"};
const TensorName T_Q{"blk.{}.attn_q.weight", "blk.{}.attn_q.weight"};
const TensorName T_K{"blk.{}.attn_k.weight", "blk.{}.attn_k.weight"};
const TensorName T_V{"blk.{}.attn_v.weight", "blk.{}.attn_v.weight"};
const TensorName T_O{"blk.{}.attn_output.weight", "blk.{}.attn_output.weight"};
const TensorName T_Q_NORM{"blk.{}.attn_q_norm.weight", "blk.{}.attn_q_norm.weight"};
const TensorName T_K_NORM{"blk.{}.attn_k_norm.weight", "blk.{}.attn_k_norm.weight"};
const TensorName T_GATE{"blk.{}.ffn_gate.weight", "blk.{}.ffn_gate.weight"};
const TensorName T_UP{"blk.{}.ffn_up.weight", "blk.{}.ffn_up.weight"};
const TensorName T_DOWN{"blk.{}.ffn_down.weight", "blk.{}.ffn_down.weight"};
const TensorName T_ATTN_CONV_BASE{"blk.{}.attn_conv.base", "blk.{}.attn_conv_base"};
const TensorName T_ATTN_CONV_PROJ{"blk.{}.attn_conv.proj.weight", "blk.{}.attn_conv_proj.weight",
                                  "blk.{}.attn_conv_proj"};
const TensorName T_FFN_CONV_BASE{"blk.{}.ffn_conv.base", "blk.{}.ffn_conv_base"};
const TensorName T_FFN_CONV_PROJ{"blk.{}.ffn_conv.proj.weight", "blk.{}.ffn_conv_proj.weight",
                                 "blk.{}.ffn_conv_proj"};
const TensorName T_SEL_HPROJ{"dflash.selector.hproj.weight", "selector_hidden.weight"};
const TensorName T_SEL_PRED{"dflash.selector.pred_cb", "selector_predecessor.weight"};
const TensorName T_SEL_SUCC{"dflash.selector.succ_cb", "selector_successor.weight"};
const TensorName T_MARKOV_W1{"dflash.dspark.markov.w1", "markov_w1.weight"};
const TensorName T_MARKOV_W2{"dflash.dspark.markov.w2", "markov_w2.weight"};
const TensorName T_CONF_W{"dflash.dspark.confidence.weight", "conf_proj.weight"};
const TensorName T_CONF_B{"dflash.dspark.confidence.bias", "conf_proj.bias"};

// Defaults and bounds: schema.py holds the same numbers for `luce inspect` under the same names
// (tests/test_validator_parity_drafter.py reads them out of this file and compares).
constexpr int DEFAULT_CONV_GROUP = 16, DEFAULT_TOP_K = 16, MAX_TOP_K = 256;
constexpr double DEFAULT_ROPE_THETA = 1e7;  // Qwen3.5-family drafters (spec drafters.md §1.4)
constexpr int64_t MAX_LAYERS = 1024, MAX_EMBD = 131072, MAX_FF = 524288, MAX_HEADS = 1024,
                  MAX_HEAD_DIM = 1024, MAX_TAPS = 64, MAX_BLOCK = 32, MAX_CONV_K = 16, MAX_RANK = 65536,
                  MAX_VOCAB = INT32_MAX, MAX_CTX = 1 << 24;

std::string layer_name(const char *tmpl, int layer) {
    std::string s(tmpl);
    size_t at = s.find("{}");
    if (at != std::string::npos) s.replace(at, 2, std::to_string(layer));
    return s;
}

int64_t bounded(int64_t v, int64_t lo, int64_t hi, const std::string &what) {
    if (v < lo || v > hi)
        fail(LUCE_ERR_FORMAT, "%s=%lld is outside %lld..%lld", what.c_str(), (long long)v, (long long)lo,
             (long long)hi);
    return v;
}

struct Reader {
    const GgufFile &f;
    std::string arch;

    std::string key(const char *suffix) const { return arch + "." + suffix; }
    const char *first(std::initializer_list<const char *> suffixes) const {
        for (const char *s : suffixes)
            if (f.has(key(s))) return s;
        return nullptr;
    }
    int64_t req_int(const char *suffix, int64_t lo, int64_t hi) const {
        if (!f.has(key(suffix))) fail(LUCE_ERR_FORMAT, "%s is missing", key(suffix).c_str());
        return bounded(f.get_int(key(suffix)), lo, hi, key(suffix));
    }
    bool get_bool(const std::string &k, bool fallback) const {
        const GgufValue *v = f.find(k);
        if (!v) return fallback;
        if (v->type == GgufType::BOOL) return v->b;
        fail(LUCE_ERR_FORMAT, "%s must be a bool", k.c_str());
    }
    // A tensor by either layout's name, or null.
    const GgufTensor *find(const TensorName &n, int layer = -1) const {
        const GgufTensor *t = f.tensor(layer_name(n.lucebox, layer));
        if (!t) t = f.tensor(layer_name(n.upstream, layer));
        if (!t && n.legacy) t = f.tensor(layer_name(n.legacy, layer));
        return t;
    }
    const GgufTensor &need(const TensorName &n, int layer = -1) const {
        const GgufTensor *t = find(n, layer);
        if (!t) fail(LUCE_ERR_FORMAT, "missing tensor %s", layer_name(n.lucebox, layer).c_str());
        return *t;
    }
};

void check_shape(const GgufTensor &t, std::initializer_list<int64_t> ne) {
    int i = 0;
    bool ok = true;
    for (int64_t d : ne) ok = ok && t.ne[i++] == d;
    for (; i < 4; ++i) ok = ok && t.ne[i] == 1;
    if (!ok) {
        std::string want;
        for (int64_t d : ne) want += (want.empty() ? "" : ", ") + std::to_string(d);
        fail(LUCE_ERR_FORMAT, "%s has shape [%lld, %lld, %lld, %lld], expected [%s]", t.name.c_str(),
             (long long)t.ne[0], (long long)t.ne[1], (long long)t.ne[2], (long long)t.ne[3], want.c_str());
    }
    if (!is_supported_weight_type(t.type))
        fail(LUCE_ERR_UNSUPPORTED, "%s has an unsupported weight type (%s)", t.name.c_str(),
             type_traits(t.type) ? type_traits(t.type)->name : "unknown");
}

Weight matrix(const GgufTensor &t, int64_t n_in, int64_t n_out) {
    check_shape(t, {n_in, n_out});
    return Weight{t.type, n_in, n_out, t.data};
}

std::vector<float> vec(const GgufTensor &t, std::initializer_list<int64_t> ne) {
    check_shape(t, ne);
    std::vector<float> out(static_cast<size_t>(t.n_elements));
    dequantize_row(t.type, t.data, out.data(), t.n_elements);
    return out;
}

void read_hparams(const Reader &r, DrafterHparams &hp) {
    hp.n_embd = int(r.req_int(K_EMBD, 1, MAX_EMBD));
    hp.n_layer = int(r.req_int(K_LAYERS, 1, MAX_LAYERS));
    hp.n_ff = int(r.req_int(K_FF, 1, MAX_FF));
    hp.n_head = int(r.req_int(K_HEAD, 1, MAX_HEADS));
    hp.n_head_kv = int(r.req_int(K_HEAD_KV, 1, MAX_HEADS));
    hp.head_dim = int(r.req_int(K_KEY_LEN, 2, MAX_HEAD_DIM));
    if (hp.n_head % hp.n_head_kv)
        fail(LUCE_ERR_FORMAT, "head_count %d is not divisible by head_count_kv %d", hp.n_head, hp.n_head_kv);
    if (hp.head_dim % 2) fail(LUCE_ERR_FORMAT, "%s=%d must be even (RoPE pairs)", r.key(K_KEY_LEN).c_str(), hp.head_dim);
    // The drafter ropes the whole head (partial rotary is refused), so its sections count head_dim / 2 pairs.
    check_rope_sections(r.f, r.key(K_ROPE_SECTIONS), hp.head_dim, r.key(K_KEY_LEN));
    if (r.f.has(r.key(K_VALUE_LEN))) r.f.get_int(r.key(K_VALUE_LEN));  // an integer (inspect warns if != key_length)
    // The lucebox layout states its vocabulary (Lucebox's loader requires it); llama.cpp's takes the
    // target's. Drafting always uses the target's, so this only has to be sane.
    const int64_t vocab = r.arch != UPSTREAM_ARCH || r.f.has(r.key(K_VOCAB)) ? r.req_int(K_VOCAB, 1, MAX_VOCAB) : 0;
    if (!r.f.has(r.key(K_EPS))) fail(LUCE_ERR_FORMAT, "%s is missing", r.key(K_EPS).c_str());
    hp.rms_eps = float(r.f.get_float(r.key(K_EPS)));
    if (!(hp.rms_eps > 0.f && hp.rms_eps < 1.f))
        fail(LUCE_ERR_FORMAT, "%s=%g is outside (0, 1)", r.key(K_EPS).c_str(), double(hp.rms_eps));

    const char *block = r.first({K_BLOCK[0], K_BLOCK[1]});
    if (!block) fail(LUCE_ERR_FORMAT, "no %s (or %s)", r.key(K_BLOCK[0]).c_str(), r.key(K_BLOCK[1]).c_str());
    const int64_t block_size = r.f.get_int(r.key(block));
    if (block_size < 2) fail(LUCE_ERR_FORMAT, "block_size=%lld must be at least 2", (long long)block_size);
    hp.block_size = int(bounded(block_size, 2, MAX_BLOCK, r.key(block)));  // the block buffers' size

    // Mask id: the first present of these wins (the order converters/validate.py uses).
    std::vector<std::string> mask_keys = {r.key(K_MASK[0]), r.key(K_MASK[1]), K_MASK_UPSTREAM, K_MASK_TOKENIZER};
    bool have_mask = false;
    for (const std::string &k : mask_keys)
        if (r.f.has(k)) {
            hp.mask_token_id = int(bounded(r.f.get_int(k), 0, INT32_MAX, k));
            have_mask = true;
            break;
        }
    if (!have_mask) fail(LUCE_ERR_FORMAT, "no mask token id (%s)", r.key(K_MASK[0]).c_str());
    if (vocab && hp.mask_token_id >= vocab)
        fail(LUCE_ERR_FORMAT, "mask_token_id=%d is outside vocab_size %lld", hp.mask_token_id, (long long)vocab);

    hp.rope_theta = float(r.f.get_float(r.key(K_ROPE_BASE), DEFAULT_ROPE_THETA));
    if (!(hp.rope_theta > 1.f)) fail(LUCE_ERR_FORMAT, "%s must be > 1", r.key(K_ROPE_BASE).c_str());
    hp.yarn.factor = float(r.f.get_float(r.key(K_YARN_FACTOR), 1.0));
    if (hp.yarn.factor > 1.f) {
        const int64_t orig = r.f.get_int(r.key(K_YARN_ORIG), 0);
        if (orig <= 0)
            fail(LUCE_ERR_FORMAT, "YaRN factor %g without original_context_length: the engine ignores YaRN and "
                 "runs plain RoPE", double(hp.yarn.factor));
        hp.yarn.orig_ctx = int(bounded(orig, 1, MAX_CTX, r.key(K_YARN_ORIG)));
        const char *fast = r.first({K_YARN_BETA_FAST[0], K_YARN_BETA_FAST[1]});
        const char *slow = r.first({K_YARN_BETA_SLOW[0], K_YARN_BETA_SLOW[1]});
        hp.yarn.beta_fast = fast ? float(r.f.get_float(r.key(fast))) : 32.f;
        hp.yarn.beta_slow = slow ? float(r.f.get_float(r.key(slow))) : 1.f;
        hp.yarn.attn_factor = float(r.f.get_float(r.key(K_YARN_ATTN), 0.0));
    }
    const char *anchor = r.first({K_ANCHOR[0], K_ANCHOR[1]});
    hp.sample_from_anchor = anchor && r.get_bool(r.key(anchor), false);

    // A layer's window and its in-block direction are separate facts (spec drafters.md §1.5):
    // sliding layers keep only the last W context keys whatever their direction. Files without
    // attention.causal read a pattern as "sliding = causal" (Lucebox's meaning).
    hp.sliding.assign(size_t(hp.n_layer), false);
    if (r.f.has(r.key(K_SWA_PATTERN))) {
        hp.sliding = r.f.get_bool_array(r.key(K_SWA_PATTERN), hp.n_layer);
        bool any = std::find(hp.sliding.begin(), hp.sliding.end(), true) != hp.sliding.end();
        const int64_t window = r.f.get_int(r.key(K_SWA), 0);
        if (any && window <= 0)
            fail(LUCE_ERR_FORMAT, "sliding_window_pattern marks sliding layers but sliding_window is missing");
        if (any) hp.sliding_window = int(bounded(window, 1, MAX_CTX, r.key(K_SWA)));
    }
    // Upstream's attention.causal: with a pattern it says whether the sliding layers are causal
    // (full layers stay bidirectional, as in the checkpoint); without one it applies to all layers.
    const bool has_pattern = r.f.has(r.key(K_SWA_PATTERN)), has_causal = r.f.has(r.key(K_CAUSAL));
    const bool causal = r.get_bool(r.key(K_CAUSAL), false);
    hp.causal.resize(size_t(hp.n_layer));
    for (int i = 0; i < hp.n_layer; ++i)
        hp.causal[size_t(i)] = has_causal ? causal && (!has_pattern || hp.sliding[size_t(i)]) : hp.sliding[size_t(i)];
}

// Target layer ids: the 0-based list, else upstream's 1-based list minus one, else the ZL
// default spacing (spec drafters.md §1.2) for n_target_layers taps.
void read_target_ids(const Reader &r, DrafterHparams &hp, int target_layers) {
    auto read_array = [&](const std::string &k) {
        const GgufValue *v = r.f.find(k);
        if (v->type != GgufType::ARRAY) fail(LUCE_ERR_FORMAT, "%s must be an integer array", k.c_str());
        bounded(int64_t(v->count), 1, MAX_TAPS, k + " length");
        std::vector<int64_t> ids = r.f.get_int_per_layer(k, int64_t(v->count));
        return std::vector<int>(ids.begin(), ids.end());
    };
    if (r.f.has(r.key(K_TARGET_IDS))) {
        hp.target_layer_ids = read_array(r.key(K_TARGET_IDS));
    } else if (r.f.has(r.key(K_TARGET_LAYERS_1BASED))) {
        hp.target_layer_ids = read_array(r.key(K_TARGET_LAYERS_1BASED));
        for (int &id : hp.target_layer_ids) id -= 1;
    }
    int n = hp.target_layer_ids.empty() ? 0 : int(hp.target_layer_ids.size());
    if (r.f.has(r.key(K_N_TARGET))) {
        int declared = int(bounded(r.f.get_int(r.key(K_N_TARGET)), 1, MAX_TAPS, r.key(K_N_TARGET)));
        if (n && declared != n)
            fail(LUCE_ERR_FORMAT, "%d target layer ids but n_target_layers is %d", n, declared);
        n = declared;
    }
    if (!n) {
        const GgufTensor *fc = r.find(T_FC);
        if (!fc || fc->ne[0] % hp.n_embd) fail(LUCE_ERR_FORMAT, "cannot tell how many target layers the drafter taps");
        n = int(bounded(fc->ne[0] / hp.n_embd, 1, MAX_TAPS, "fc width / hidden"));
    }
    if (hp.target_layer_ids.empty()) {
        for (int i = 0; i < n; ++i)
            hp.target_layer_ids.push_back(n == 1 ? target_layers / 2
                                                 : int(std::lround(1 + i * double(target_layers - 4) / (n - 1))));
    }
    for (int id : hp.target_layer_ids)
        if (id < 0 || id >= target_layers - 1)
            fail(LUCE_ERR_INVALID_ARGUMENT, "target layer ids must be in 0..%d (the target has %d layers and its "
                 "last layer is never tapped); got %d", target_layers - 2, target_layers, id);
}

void bind_trunk(const Reader &r, Drafter &d) {
    const DrafterHparams &hp = d.hp;
    const int64_t E = hp.n_embd, F = hp.n_ff, QW = int64_t(hp.n_head) * hp.head_dim,
                  KW = int64_t(hp.n_head_kv) * hp.head_dim, D = hp.head_dim;
    d.fc = matrix(r.need(T_FC), int64_t(d.n_taps()) * E, E);
    d.hidden_norm = vec(r.need(T_HIDDEN_NORM), {E});
    d.output_norm = vec(r.need(T_OUTPUT_NORM), {E});
    d.layers.resize(size_t(hp.n_layer));
    for (int i = 0; i < hp.n_layer; ++i) {
        DrafterLayer &L = d.layers[size_t(i)];
        L.attn_norm = vec(r.need(T_ATTN_NORM, i), {E});
        L.ffn_norm = vec(r.need(T_FFN_NORM, i), {E});
        L.q = matrix(r.need(T_Q, i), E, QW);
        L.k = matrix(r.need(T_K, i), E, KW);
        L.v = matrix(r.need(T_V, i), E, KW);
        L.o = matrix(r.need(T_O, i), QW, E);
        L.q_norm = vec(r.need(T_Q_NORM, i), {D});
        L.k_norm = vec(r.need(T_K_NORM, i), {D});
        L.gate = matrix(r.need(T_GATE, i), E, F);
        L.up = matrix(r.need(T_UP, i), E, F);
        L.down = matrix(r.need(T_DOWN, i), F, E);
    }
}

// DFlash 2 conv: all four tensors on every layer and the kernel size, or none of them.
void bind_conv(const Reader &r, Drafter &d) {
    DrafterHparams &hp = d.hp;
    const char *kk = r.first({K_CONV_K[0], K_CONV_K[1]});
    const int64_t kernel64 = kk ? r.f.get_int(r.key(kk)) : 0;
    const int kernel = int(std::clamp<int64_t>(kernel64, -1, MAX_CONV_K + 1));  // bounded below
    bool any = false;
    for (int i = 0; i < hp.n_layer && !any; ++i)
        any = r.find(T_ATTN_CONV_BASE, i) || r.find(T_ATTN_CONV_PROJ, i) || r.find(T_FFN_CONV_BASE, i) ||
              r.find(T_FFN_CONV_PROJ, i);
    if (!any && kernel <= 0) return;
    if (kernel <= 0) fail(LUCE_ERR_FORMAT, "DFlash 2 conv tensors/metadata incomplete: conv_kernel_size is not set");
    bounded(kernel64, 1, MAX_CONV_K, "conv_kernel_size");
    const char *kg = r.first({K_CONV_G[0], K_CONV_G[1]});
    const int64_t group = kg ? r.f.get_int(r.key(kg)) : DEFAULT_CONV_GROUP;
    if (group <= 0 || hp.n_embd % group)
        fail(LUCE_ERR_FORMAT, "conv_group_size=%lld must be positive and divide embedding_length %d", (long long)group,
             hp.n_embd);
    hp.conv_kernel = kernel;
    hp.conv_group = int(group);
    const int64_t E = hp.n_embd, G = E / group;
    for (int i = 0; i < hp.n_layer; ++i) {
        DrafterLayer &L = d.layers[size_t(i)];
        const TensorName *names[4] = {&T_ATTN_CONV_BASE, &T_ATTN_CONV_PROJ, &T_FFN_CONV_BASE, &T_FFN_CONV_PROJ};
        for (const TensorName *n : names)
            if (!r.find(*n, i))
                fail(LUCE_ERR_FORMAT, "DFlash 2 conv tensors/metadata incomplete: missing %s",
                     layer_name(n->lucebox, i).c_str());
        L.attn_conv.base = vec(r.need(T_ATTN_CONV_BASE, i), {E, kernel, 2});
        L.attn_conv.proj = matrix(r.need(T_ATTN_CONV_PROJ, i), E, 2 * kernel * G);
        L.ffn_conv.base = vec(r.need(T_FFN_CONV_BASE, i), {E, kernel, 2});
        L.ffn_conv.proj = matrix(r.need(T_FFN_CONV_PROJ, i), E, 2 * kernel * G);
    }
}

// DFlash 2 unary-logit scalars (optional: multiplier 1, cap off). A cap of 0 would divide by zero
// and a multiplier <= 0 reverses or flattens the candidate order, so both must be finite and > 0.
void read_logit_transform(const Reader &r, DrafterHparams &hp) {
    auto positive = [&](const char *suffix) {
        const std::string k = r.key(suffix);
        const double v = r.f.get_float(k, 0.0);
        if (!(std::isfinite(v) && v > 0.0 && v <= double(FLT_MAX)))
            fail(LUCE_ERR_FORMAT, "%s=%g must be finite and > 0", k.c_str(), v);
        return float(v);
    };
    const char *mult = r.first({K_OUTPUT_MULTIPLIER[0], K_OUTPUT_MULTIPLIER[1]});
    const char *cap = r.first({K_SOFTCAP[0], K_SOFTCAP[1]});
    hp.output_multiplier = mult ? positive(mult) : 1.f;
    hp.final_logit_softcapping = cap ? positive(cap) : 0.f;
}

void bind_selector(const Reader &r, Drafter &d, int target_vocab) {
    DrafterHparams &hp = d.hp;
    const GgufTensor *h = r.find(T_SEL_HPROJ), *p = r.find(T_SEL_PRED), *s = r.find(T_SEL_SUCC);
    const char *rk = r.first({K_SEL_RANK[0], K_SEL_RANK[1]});
    if (!h && !p && !s && !rk) return;
    if (!h || !p || !s) fail(LUCE_ERR_FORMAT, "DFlash 2 selector needs all three tensors (hproj, pred_cb, succ_cb)");
    const int64_t R = h->ne[1];
    bounded(R, 1, MAX_RANK, "selector rank");
    if (rk && r.f.get_int(r.key(rk)) != R)
        fail(LUCE_ERR_FORMAT, "selector ranks differ: hproj %lld, selector_rank %lld", (long long)R,
             (long long)r.f.get_int(r.key(rk)));
    const int64_t Vcb = p->ne[1];
    if (p->ne[0] != R || s->ne[0] != R)
        fail(LUCE_ERR_FORMAT, "selector ranks differ: hproj %lld, pred_cb %lld, succ_cb %lld", (long long)R,
             (long long)p->ne[0], (long long)s->ne[0]);
    if (s->ne[1] != Vcb)
        fail(LUCE_ERR_FORMAT, "codebook vocabularies differ: %lld vs %lld", (long long)Vcb, (long long)s->ne[1]);
    if (Vcb < target_vocab)
        fail(LUCE_ERR_INVALID_ARGUMENT, "selector codebook vocab %lld < target vocab %d", (long long)Vcb, target_vocab);
    const char *tk = r.first({K_SEL_TOPK[0], K_SEL_TOPK[1]});
    const int64_t top_k = tk ? r.f.get_int(r.key(tk)) : DEFAULT_TOP_K;
    if (top_k < 1 || top_k > MAX_TOP_K || top_k > Vcb || top_k > target_vocab)
        fail(LUCE_ERR_FORMAT, "selector_top_k=%lld must be in 1..%d and <= codebook vocab %lld", (long long)top_k,
             MAX_TOP_K, (long long)Vcb);
    d.sel_hproj = matrix(*h, hp.n_embd, R);
    d.sel_pred = matrix(*p, R, Vcb);
    d.sel_succ = matrix(*s, R, Vcb);
    hp.selector_rank = int(R);
    hp.selector_top_k = int(top_k);
}

void bind_dspark(const Reader &r, Drafter &d, int target_vocab) {
    DrafterHparams &hp = d.hp;
    const GgufTensor *w1 = r.find(T_MARKOV_W1), *w2 = r.find(T_MARKOV_W2);
    const GgufTensor *cw = r.find(T_CONF_W), *cb = r.find(T_CONF_B);
    const bool enabled = r.f.get_int(r.key(K_DSPARK_ENABLED), 0) != 0;
    if (!enabled && !w1 && !w2 && !cw && !cb) return;
    if (!w1 || !w2) fail(LUCE_ERR_FORMAT, "incomplete DSpark Markov tensors: need both markov w1 and w2");
    const int64_t R = w1->ne[0], V = w1->ne[1];
    bounded(R, 1, MAX_RANK, "Markov rank");
    // The metadata, when present, must describe these tensors (inspect's dspark-metadata rule).
    auto agrees = [&](const char *suffix, int64_t expected, const char *what) {
        const std::string k = r.key(suffix);
        if (!r.f.has(k)) return;
        const int64_t declared = r.f.get_int(k);
        if (declared != expected)
            fail(LUCE_ERR_FORMAT, "%s=%lld but the %s %lld", k.c_str(), (long long)declared, what,
                 (long long)expected);
    };
    agrees(K_DSPARK_RANK, R, "Markov tensors say");
    agrees(K_DSPARK_VOCAB, V, "Markov tensors say");
    if (V != target_vocab)
        fail(LUCE_ERR_INVALID_ARGUMENT, "Markov head vocab %lld != target vocab %d", (long long)V, target_vocab);
    d.markov_w1 = matrix(*w1, R, V);
    d.markov_w2 = matrix(*w2, R, V);
    hp.markov_rank = int(R);
    if ((cw == nullptr) != (cb == nullptr))
        fail(LUCE_ERR_FORMAT, "DSpark confidence weight and bias must come together");
    if (cw) {
        const int64_t C = cw->ne[0];
        if (C != hp.n_embd && C != hp.n_embd + R)
            fail(LUCE_ERR_FORMAT, "confidence weight [%lld, %lld] must be [C, 1] with C in {%d, %lld}", (long long)C,
                 (long long)cw->ne[1], hp.n_embd, (long long)(hp.n_embd + R));
        d.conf_w = vec(*cw, {C, 1});
        d.conf_b = vec(*cb, {1})[0];
        hp.confidence_dim = int(C);
        agrees(K_DSPARK_CONF_DIM, C, "confidence weight says");
    }
}

// HF `_compute_yarn_parameters` (transformers 5): inv_freq blends extrapolated (theta^-2i/D) and
// interpolated (/factor) frequencies with a linear ramp between the correction dims of
// beta_fast and beta_slow rotations over the original context; attention_factor
// (default 0.1 ln(factor) + 1) scales cos and sin. All in fp32 like torch, ramp bounds in double.
void rope_table(Drafter &d) {
    const DrafterHparams &hp = d.hp;
    const int dim = hp.head_dim, half = dim / 2;
    const double base = hp.rope_theta;
    std::vector<float> inv(static_cast<size_t>(half));
    std::vector<float> pos_freq(static_cast<size_t>(half)), extra(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
        pos_freq[size_t(i)] = std::pow(float(base), float(2 * i) / float(dim));
        extra[size_t(i)] = 1.0f / pos_freq[size_t(i)];
    }
    d.rope_mscale = 1.f;
    if (!(hp.yarn.factor > 1.f)) {
        d.rope_inv_freq = extra;
        return;
    }
    const double factor = hp.yarn.factor, orig = hp.yarn.orig_ctx;
    auto correction_dim = [&](double rotations) {
        return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    double low = std::max(std::floor(correction_dim(hp.yarn.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(hp.yarn.beta_slow)), double(dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
        float ramp = (float(i) - float(low)) / float(high - low);
        ramp = std::min(1.f, std::max(0.f, ramp));
        float extrapolation_factor = 1.f - ramp;
        float interp = 1.0f / (float(factor) * pos_freq[size_t(i)]);
        inv[size_t(i)] = interp * (1.f - extrapolation_factor) + extra[size_t(i)] * extrapolation_factor;
    }
    d.rope_inv_freq = inv;
    d.rope_mscale = hp.yarn.attn_factor > 0.f ? hp.yarn.attn_factor : float(0.1 * std::log(factor) + 1.0);
}

// A drafter bound to a device target keeps its weights in the target backend's memory: every
// matrix in its GGUF encoding, every small vector in fp32 (as upload_weights in model.cpp does
// for the target). On the CPU the weights stay views into the mapped file.
void upload_drafter(Drafter &d) {
    Backend &be = *d.target->backend;
    if (std::strcmp(be.name(), "cpu") == 0) return;
    auto matrix = [&](Weight &w) {
        if (!w.present()) return;
        w.data = be.upload_weight(w, size_t(row_bytes(w.type, w.n_in)) * size_t(w.n_out));
    };
    auto vector = [&](Vector &v) {
        if (v.host.empty()) return;
        void *dst = be.alloc(v.host.size() * sizeof(float));
        be.upload(dst, v.host.data(), v.host.size() * sizeof(float));
        v.device = static_cast<const float *>(dst);
    };
    for (Weight *w : {&d.fc, &d.sel_hproj, &d.sel_pred, &d.sel_succ, &d.markov_w1, &d.markov_w2}) matrix(*w);
    for (Vector *v : {&d.hidden_norm, &d.output_norm, &d.conf_w, &d.rope_inv_freq}) vector(*v);
    for (DrafterLayer &L : d.layers) {
        for (Weight *w : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down, &L.attn_conv.proj, &L.ffn_conv.proj})
            matrix(*w);
        for (Vector *v : {&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.k_norm, &L.attn_conv.base, &L.ffn_conv.base})
            vector(*v);
    }
}

}  // namespace

std::unique_ptr<Drafter> load_drafter(const std::string &path, Model *target) {
    auto d = std::make_unique<Drafter>();
    d->file.reset(GgufFile::open(path));
    d->target = target;
    const GgufFile &f = *d->file;
    std::string arch = f.get_string(KEY_ARCH, "");
    if (std::none_of(std::begin(ARCHS), std::end(ARCHS), [&](const char *a) { return arch == a; }))
        fail(LUCE_ERR_FORMAT, "unexpected architecture '%s'; expected a drafter (qwen35-dflash-draft, dflash, "
             "dflash-draft, gemma4-dflash-draft)", arch.c_str());
    Reader r{f, arch};
    DrafterHparams &hp = d->hp;
    read_hparams(r, hp);
    const Hparams &thp = target->hp;
    if (hp.n_embd != thp.n_embd)
        fail(LUCE_ERR_INVALID_ARGUMENT, "drafter hidden %d != target hidden %d (the drafter uses the target's "
             "embeddings and head)", hp.n_embd, thp.n_embd);
    if (hp.mask_token_id >= thp.n_vocab)
        fail(LUCE_ERR_INVALID_ARGUMENT, "mask_token_id=%d is outside the target vocab %d", hp.mask_token_id,
             thp.n_vocab);
    read_target_ids(r, hp, thp.n_layer);
    bind_trunk(r, *d);
    bind_conv(r, *d);
    bind_selector(r, *d, thp.n_vocab);
    read_logit_transform(r, hp);
    bind_dspark(r, *d, thp.n_vocab);
    hp.kind = hp.markov_rank ? DRAFT_DSPARK : (hp.conv_kernel || hp.selector_rank) ? DRAFT_DFLASH2 : DRAFT_DFLASH;
    rope_table(*d);
    upload_drafter(*d);
    return d;
}

}  // namespace luce
