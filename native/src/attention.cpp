// attention.cpp — the gated full-attention mixer (spec/qwen35.md §1.3, pitfalls 4, 5, 11).
//
//   qg = attn_q cur              [T][H][2D]: per head [q_h | gate_h] (interleaved, not two halves)
//   q  = rmsnorm(q_h) * q_norm   [T][H][D]   per head, before RoPE
//   k  = rmsnorm(attn_k cur) * k_norm, v = attn_v cur      [T][Hkv][D]
//   q, k: NeoX RoPE on the first R dims (pairs i, i+R/2), theta = rope.freq_base
//   o  = softmax(q k^T / sqrt(D)) v, q head h reads kv head h / (H/Hkv), causal over the cache
//   mix = attn_output (o * sigmoid(gate))
// The cache holds k after norm and RoPE, and v.
#include "session.h"

namespace luce {

void attention_layer(Backend &be, const Hparams &hp, const AttentionWeights &w, StepBuffers &b, int T, int H, int Hkv,
                     const AttentionRows *seqs, int n_seqs) {
    const int D = hp.head_dim;
    const int64_t E = hp.n_embd;
    const Backend::MatmulOut proj[] = {{&w.q, b.qg, 2 * int64_t(H) * D}, {&w.k, b.k, int64_t(Hkv) * D},
                                       {&w.v, b.v, int64_t(Hkv) * D}};
    be.matmuls(b.cur, T, proj, 3);
    // Each sequence of the step against its own cache; rows r.. of every buffer are its rows.
    be.attention_sequences(b.qg, w.q_norm.data(), b.q, b.k, w.k_norm.data(), b.v, b.pos, seqs, n_seqs, H, Hkv, D,
                           hp.n_rot, hp.rope_theta, hp.rms_eps, b.attn);
    be.mul_sigmoid(b.attn, b.qg + D, 2 * D, T * H, D);  // gate_h sits right after q_h
    be.matmul(w.o, b.attn, T, b.mix, E);
}

void attention_mixer(Session &s, int il, int T) {
    StepBuffers &b = s.buf;
    const SegmentSpan segs = step_segments(s, T);
    // A batch's steps hold at most MAX_STEP rows, so at most MAX_STEP sequences.
    if (segs.n > MAX_STEP) fail(LUCE_ERR_INTERNAL, "attention step of %d sequences", segs.n);
    AttentionRows seqs[MAX_STEP];
    for (int i = 0; i < segs.n; ++i) {
        const StepSegment &seg = segs.first[i];
        // Tree verify (one sequence): nodes are stored at their slots and see only their
        // ancestors (session.h).
        seqs[i] = {seg.row0, seg.T, &(*seg.kv)[size_t(il)], s.tree ? b.tree_slot : b.pos + seg.row0,
                   s.tree ? b.tree_mask : nullptr};
    }
    attention_layer(*s.model->backend, s.model->hp, s.model->layers[size_t(il)].attn, b, T,
                    s.model->hp.n_head[size_t(il)], s.model->hp.n_head_kv[size_t(il)], seqs, segs.n);
}

}  // namespace luce
