// session.h — one sequence's state (KV cache, DeltaNet state) and the step buffers of the forward.
//
// Everything is allocated once at session creation with static shapes (T <= the session's
// prefill_step tokens per forward step), so prefill chunks and decode steps never allocate.
// Memory per session:
//   KV: n_attention_layers x 2 x Hkv x n_ctx x D values (f32, or f16 when asked for)
//   DeltaNet: n_recurrent_layers x ((Kc-1) x CD + HV x DK x DV) floats, constant in context length.
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"

namespace luce {

// Tokens per forward step outside a prompt's prefill: decode uses T = 1, verify T =
// block size, a DDTree step its nodes. It also bounds the logits rows one step returns, and graph
// keys (forward.cpp) hold T in 7 bits.
constexpr int MAX_STEP = 64;
// Tokens per prefill chunk (generate.cpp, speculative.cpp). Longer than MAX_STEP because every
// prefill matmul decodes its weights once per chunk and every op launches once per chunk: the
// GPU's prefill GEMM and small ops pay those costs an eighth as often as at 64 (llama.cpp's
// default micro-batch is 512 too; on an H200, 2026-12-04, 512 prefilled a 27B 5-7% faster than
// 256). Prefill rows are never compared bitwise with decode rows, so the chunk length is free to
// differ. The default; LUCE_PREFILL_STEP (MAX_STEP..MAX_PREFILL_STEP) sets a session's own
// (docs/cli.md).
constexpr int PREFILL_STEP = 512;
constexpr int MAX_PREFILL_STEP = 1024;
static_assert(PREFILL_STEP >= MAX_STEP && PREFILL_STEP <= MAX_PREFILL_STEP, "a prefill chunk holds any step");

// Per-layer recurrent state of a Gated DeltaNet layer.
struct RecurrentState {
    float *conv = nullptr;  // [Kc-1][CD] last raw qkv projections, oldest first
    float *ssm = nullptr;   // [HV][DK][DV] fp32
    // Rollback checkpoints (speculative verify, speculative.cpp), null in plain decoding: the
    // state after each token of a step [T][HV][DK][DV] and the step's raw qkv rows [T][CD].
    float *ssm_history = nullptr;
    float *qkv_history = nullptr;
};

// Step buffers, [T][...] with T <= the session's prefill_step; the logits and the tree arrays
// hold MAX_STEP rows.
struct StepBuffers {
    int32_t *tokens = nullptr, *pos = nullptr;  // [T]
    float *x = nullptr;        // [T][E] residual stream
    float *cur = nullptr;      // [T][E] normed input of a sub-block
    float *mix = nullptr;      // [T][E] sub-block output before the residual add
    float *qg = nullptr;       // [T][2*H*D] attention q|gate
    float *q = nullptr;        // [T][H*D]
    float *k = nullptr, *v = nullptr;  // [T][Hkv*D]
    float *attn = nullptr;     // [T][max(H*D, HV*DV)] mixer output before its out projection
    float *qkv = nullptr;      // [T][CD] DeltaNet raw projections
    float *conv = nullptr;     // [T][CD] after conv + SiLU
    float *z = nullptr;        // [T][HV*DV]
    float *b = nullptr, *a = nullptr;  // [T][HV]
    float *ff_gate = nullptr, *ff_up = nullptr;  // [T][F]
    float *logits = nullptr;   // [T][V]
    // A DDTree verify step's cache slots and parents [T] and ancestor mask [T][n_ctx], copied
    // from the host TreeStep into backend memory where the ops read them (the mask is allocated
    // at the first tree step).
    int32_t *tree_slot = nullptr, *tree_parent = nullptr;
    uint8_t *tree_mask = nullptr;
};

// Hidden-state capture for drafters: layer outputs (residual stream after layer il,
// before the final norm) for every position of a step, written as out[t][slot][E].
struct HiddenCapture {
    const int32_t *layer_ids = nullptr;  // ascending main-layer indices
    int n_layers = 0;
    float *out = nullptr;                // [T][n_layers][E], host memory or (in_backend) backend memory
    // The speculative loop's taps stay in backend memory, copied there device to device, so the
    // drafter reads them where they are; the C API's capture downloads to the caller's host buffer.
    bool in_backend = false;
};

// Tree verification (DDTree, speculative.cpp): node t of a step sits at RoPE position pos[t]
// (anchor position + its depth) but in cache slot n_past + t (= slot[t]); parent[t] is its parent
// node (-1: child of the state before the step) and mask [T][n_ctx] its ancestor-only visibility.
// Parents precede children. Null for ordinary causal steps.
// Host arrays of a tree-verify step; forward_step copies slot, parent and mask into the step
// buffers (StepBuffers::tree_*) before the ops that read them.
struct TreeStep {
    const int32_t *pos = nullptr, *slot = nullptr, *parent = nullptr;
    const uint8_t *mask = nullptr;
};

// One sequence's rows of a batched step (batch.cpp): rows [row0, row0 + T) of the step buffers
// hold that sequence's new tokens at positions n_past .. n_past+T-1, read and written against its
// own KV layers and recurrent state. The weight matmuls run over all rows at once; attention, conv
// and the delta rule run per segment.
struct StepSegment {
    std::vector<KvLayer> *kv = nullptr;
    std::vector<RecurrentState> *recurrent = nullptr;
    int n_past = 0, row0 = 0, T = 0;
};

struct Session {
    Model *model = nullptr;
    int n_ctx = 0;
    int n_past = 0;
    std::vector<KvLayer> kv;               // per main layer (unused for DeltaNet layers)
    std::vector<RecurrentState> recurrent; // per main layer (unused for attention layers)
    StepBuffers buf;
    const TreeStep *tree = nullptr;        // set only around a tree-verify forward_step
    // Set only around a batched forward_step (batch.cpp): the step's rows belong to these
    // sequences, not to this session's own state, and n_past is left alone.
    const std::vector<StepSegment> *segments = nullptr;
    StepSegment whole_step;  // step_segments' one segment when segments is null
    std::vector<void *> allocations;

    KvFormat kv_format;  // the attention cache's element types and rotation
    int prefill_step = PREFILL_STEP;  // tokens per prompt chunk; the step buffers' rows
    uint64_t graph_id = 0;  // distinguishes this session's step graphs from another's (forward.cpp)

    // own_state = false: step buffers only; the KV layers and recurrent state stay null, for a
    // batch (batch.cpp) whose sequences bring their own.
    Session(Model *m, int n_ctx, KvFormat kv_format, bool own_state = true);
    ~Session();
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    void reset();  // empty context, zero state
    void set_fa_window(int n_window);  // luce.h luce_session_set_fa_window

    // Rollback. Attention needs only n_past lowered (keys past it are never visible);
    // DeltaNet state cannot be trimmed, so it is restored: either from a snapshot taken before
    // the step (then the accepted tokens are replayed), or, later, from the per-position states
    // Backend::gated_delta_net(state_history) can write during verify.
    struct Snapshot {
        const Session *owner = nullptr;
        int n_past = 0;
        std::vector<float> state;  // conv then ssm state of each recurrent layer, in layer order
    };
    void snapshot(Snapshot &out) const;
    void restore(const Snapshot &in);
};

// Zeroes the conv and delta-rule state of every recurrent layer (a sequence starting afresh).
void clear_recurrent_state(const Model &m, std::vector<RecurrentState> &recurrent);
// Element counts of the two state buffers of a recurrent layer (conv window, delta-rule state).
void state_sizes(const Hparams &hp, size_t &n_conv, size_t &n_ssm);
// A session's state in a file (session_file.cpp; luce.h luce_session_state_save / _load).
void save_session_state(const Session &s, const char *path, const uint8_t *identity, int identity_len);
void load_session_state(Session &s, const char *path, const uint8_t *identity, int identity_len);
// The bytes save_session_state writes, into out (capacity bytes); returns their count (with out
// null: only the count).
uint64_t session_state_image(const Session &s, const uint8_t *identity, int identity_len, void *out,
                             uint64_t capacity);

// PREFILL_STEP, or LUCE_PREFILL_STEP when set (an integer in MAX_STEP..MAX_PREFILL_STEP).
int prefill_step_setting();

// One forward step over T tokens at positions n_past .. n_past+T-1; advances n_past. T <=
// s.prefill_step (a tree step: MAX_STEP); only prompt chunks go past MAX_STEP. If logits is not
// null, rows [logit_row0, T) (at most MAX_STEP of them) of the step's logits are written there
// (host, [T - logit_row0][V]). capture may be null.
void forward_step(Session &s, const int32_t *tokens, int T, float *logits, int logit_row0,
                  const HiddenCapture *capture);
// The same, leaving the logits rows [logit_row0, T) in backend memory (returned; valid until the
// next step): for callers that reduce them where they are.
const float *forward_step_rows(Session &s, const int32_t *tokens, int T, int logit_row0, const HiddenCapture *capture);
// One greedy decode step of `token`: returns the argmax of its logits (ties -> lowest id),
// computed by the backend so only the index leaves the device.
int32_t forward_step_greedy(Session &s, int32_t token);

// The segments of a step: s.segments, or the whole step on the session's own state. A view, no
// copy: every mixer asks for it once per layer and step.
struct SegmentSpan {
    const StepSegment *first;
    int n;
    const StepSegment *begin() const { return first; }
    const StepSegment *end() const { return first + n; }
};
SegmentSpan step_segments(Session &s, int T);

// The gated attention of one full-attention layer with H query and Hkv kv heads over b.cur [T][E]
// at positions b.pos into b.mix [T][E]: the projections over all T rows, then each sequence's rows
// against its own cache. The target's layers (attention_mixer: one range per sequence of a batch)
// and the MTP block (mtp.cpp: one range) both run it.
void attention_layer(Backend &be, const Hparams &hp, const AttentionWeights &w, StepBuffers &b, int T, int H, int Hkv,
                     const AttentionRows *seqs, int n_seqs);

// Layer mixers (attention.cpp, deltanet.cpp): read s.buf.cur [T][E], write s.buf.mix [T][E].
void attention_mixer(Session &s, int layer, int T);
void deltanet_mixer(Session &s, int layer, int T);

}  // namespace luce
