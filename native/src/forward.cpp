// forward.cpp — one qwen35 forward step (spec/qwen35.md §1.2, §1.5).
//
// Per main layer il (pre-norm, two residuals):
//   cur = rmsnorm(x) * attn_norm            (GGUF norms already hold 1 + w: plain multipliers)
//   x  += mixer(cur)                         full attention (attention.cpp) or Gated DeltaNet (deltanet.cpp)
//   cur = rmsnorm(x) * post_attention_norm
//   x  += ffn_down(silu(ffn_gate cur) * ffn_up cur)
// then logits = output(rmsnorm(x) * output_norm) for the rows the caller asked for.
#include <cstring>

#include "errors.h"
#include "session.h"

namespace luce {

SegmentSpan step_segments(Session &s, int T) {
    if (s.segments) return {s.segments->data(), int(s.segments->size())};
    s.whole_step = StepSegment{&s.kv, &s.recurrent, s.n_past, 0, T};
    return {&s.whole_step, 1};
}

namespace {

void mlp(Session &s, const LayerWeights &L, int T) {
    Backend &be = *s.model->backend;
    StepBuffers &b = s.buf;
    const int64_t F = L.ffn_gate.n_out, E = s.model->hp.n_embd;
    const Backend::MatmulOut gate_up[] = {{&L.ffn_gate, b.ff_gate, F}, {&L.ffn_up, b.ff_up, F}};
    be.matmuls(b.cur, T, gate_up, 2);
    be.swiglu(b.ff_gate, b.ff_up, T, F);
    be.matmul(L.ffn_down, b.ff_gate, T, b.mix, E);
}

// One strided copy per tapped layer: rows x[t] [E] -> out[t][slot] (row stride n_layers * E).
void capture_layer(Session &s, const HiddenCapture *cap, int layer, int T) {
    if (!cap) return;
    Backend &be = *s.model->backend;
    const int64_t E = s.model->hp.n_embd, row = E * int64_t(sizeof(float));
    for (int slot = 0; slot < cap->n_layers; ++slot) {
        if (cap->layer_ids[slot] != layer) continue;
        float *dst = cap->out + int64_t(slot) * E;
        if (cap->in_backend) {
            be.copy_rows(dst, row * cap->n_layers, s.buf.x, row, row, T);
            continue;
        }
        for (int t = 0; t < T; ++t)
            be.download(dst + int64_t(t) * cap->n_layers * E, s.buf.x + int64_t(t) * E, size_t(row));
    }
}

// Everything a step enqueues after its uploads: reads token ids and positions from b.tokens /
// b.pos, so the same launches serve any step of the same shape (what a graph replays).
void step_launches(Session &s, int T, bool want_logits, int logit_row0, const HiddenCapture *capture) {
    Model &m = *s.model;
    const Hparams &hp = m.hp;
    Backend &be = *m.backend;
    StepBuffers &b = s.buf;
    const int64_t E = hp.n_embd;
    be.get_rows(m.token_embd, b.tokens, T, b.x);
    be.rmsnorm(b.x, E, m.layers[0].attn_norm.data(), T, int(E), hp.rms_eps, b.cur, E);
    for (int il = 0; il < hp.n_layer; ++il) {
        const LayerWeights &L = m.layers[size_t(il)];
        if (hp.recurrent[size_t(il)]) deltanet_mixer(s, il, T);
        else attention_mixer(s, il, T);
        be.add_rmsnorm(b.x, b.mix, L.post_norm.data(), T, int(E), hp.rms_eps, b.cur);
        mlp(s, L, T);
        // The residual add with the next layer's input norm (the output norm runs below, on the
        // logit rows only).
        if (il + 1 < hp.n_layer)
            be.add_rmsnorm(b.x, b.mix, m.layers[size_t(il) + 1].attn_norm.data(), T, int(E), hp.rms_eps, b.cur);
        else be.add(b.x, b.mix, T * E);
        capture_layer(s, capture, il, T);
    }
    if (!want_logits || logit_row0 >= T) return;
    const int n_rows = T - logit_row0;
    be.rmsnorm(b.x + int64_t(logit_row0) * E, E, m.output_norm.data(), n_rows, int(E), hp.rms_eps, b.cur, E);
    be.matmul(m.output, b.cur, n_rows, b.logits, hp.n_vocab);
}

// The tree step's slots, parents and mask rows into backend memory, where kv_store, attention,
// conv_silu and gated_delta_net read them.
void upload_tree(Session &s, int T) {
    Backend &be = *s.model->backend;
    StepBuffers &b = s.buf;
    if (!b.tree_mask) {
        b.tree_mask = static_cast<uint8_t *>(be.alloc(size_t(MAX_STEP) * size_t(s.n_ctx)));
        s.allocations.push_back(b.tree_mask);
    }
    be.upload(b.tree_slot, s.tree->slot, sizeof(int32_t) * size_t(T));
    be.upload(b.tree_parent, s.tree->parent, sizeof(int32_t) * size_t(T));
    be.upload(b.tree_mask, s.tree->mask, size_t(T) * size_t(s.n_ctx));
}

// Steps a graph may stand for: causal steps outside a prompt's prefill (one-token decode, and
// the speculative loop's plain and chain-verify steps), whose taps, if captured, are copied device
// to device. Every pointer such a step reads or writes is then fixed for the session, or for the
// speculative run that owns the taps and the rollback history (SpecLoop forgets the graphs when
// its buffers go); positions and token ids are read from device memory. Not recorded: tree steps
// (a mask and parents uploaded per step), prefill chunks (another kernel family, prefill rows
// not bit-identical to verify rows) and taps downloaded to the host. Key: session, history
// attached, taps captured, T, and the logits rows asked for.
bool graph_key(const Session &s, int T, bool want_logits, int logit_row0, const HiddenCapture *capture,
               uint64_t &key) {
    // Batched steps (s.segments) run eagerly: their state pointers change with the sequences in them.
    if (s.tree || s.segments || s.model->backend->prefill() || T > MAX_STEP || (capture && !capture->in_backend))
        return false;
    bool history = false;  // Checkpoints attach every recurrent layer's or none
    for (const RecurrentState &st : s.recurrent) history = history || st.ssm_history || st.qkv_history;
    static_assert(MAX_STEP < 128, "T and logit_row0 take 7 bits each");
    key = (s.graph_id << 17) | (uint64_t(history) << 16) | (uint64_t(capture != nullptr) << 15) |
          (uint64_t(T) << 8) | (uint64_t(want_logits) << 7) | uint64_t(logit_row0);
    return true;
}

// The step itself; returns the logits rows [logit_row0, T) in backend memory (null when none
// were asked for), so the caller chooses between downloading them and reducing them in place.
const float *forward_rows(Session &s, const int32_t *tokens, int T, bool want_logits, int logit_row0,
                          const HiddenCapture *capture) {
    Backend &be = *s.model->backend;
    StepBuffers &b = s.buf;
    // Step buffers hold prefill_step rows; the logits and the tree arrays MAX_STEP.
    if (T < 1 || T > (s.tree ? MAX_STEP : s.prefill_step) || (want_logits && T - logit_row0 > MAX_STEP))
        fail(LUCE_ERR_INTERNAL, "forward step of %d tokens (logits from row %d)", T, logit_row0);

    int32_t pos[MAX_PREFILL_STEP];
    for (int t = 0; t < T; ++t) pos[t] = s.tree ? s.tree->pos[t] : s.n_past + t;
    if (s.segments) {
        if (s.tree) fail(LUCE_ERR_INTERNAL, "a batched step is causal");
        for (const StepSegment &seg : *s.segments)
            for (int t = 0; t < seg.T; ++t) pos[seg.row0 + t] = seg.n_past + t;
    }
    be.upload(b.pos, pos, sizeof(int32_t) * size_t(T));
    be.upload(b.tokens, tokens, sizeof(int32_t) * size_t(T));
    if (s.tree) upload_tree(s, T);

    uint64_t key = 0;
    const auto launches = [&] { step_launches(s, T, want_logits, logit_row0, capture); };
    if (graph_key(s, T, want_logits, logit_row0, capture, key)) run_graphed(be, key, launches);
    else launches();
    if (!s.segments) s.n_past += T;
    return want_logits && logit_row0 < T ? b.logits : nullptr;
}

}  // namespace

void forward_step(Session &s, const int32_t *tokens, int T, float *logits, int logit_row0,
                  const HiddenCapture *capture) {
    const float *rows = forward_rows(s, tokens, T, logits != nullptr, logit_row0, capture);
    if (!rows) return;
    const int64_t V = s.model->hp.n_vocab;
    s.model->backend->download(logits, rows, size_t(T - logit_row0) * size_t(V) * sizeof(float));
}

const float *forward_step_rows(Session &s, const int32_t *tokens, int T, int logit_row0, const HiddenCapture *capture) {
    return forward_rows(s, tokens, T, true, logit_row0, capture);
}

// Greedy decode only needs the index: the argmax runs where the logits are, so a GPU step
// downloads 4 bytes instead of the vocabulary row.
int32_t forward_step_greedy(Session &s, int32_t token) {
    return s.model->backend->argmax(forward_step_rows(s, &token, 1, 0, nullptr), s.model->hp.n_vocab);
}

}  // namespace luce
