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

void attention_mixer(Session &s, int il, int T) {
    const Hparams &hp = s.model->hp;
    const AttentionWeights &w = s.model->layers[size_t(il)].attn;
    Backend &be = *s.model->backend;
    StepBuffers &b = s.buf;
    const int H = hp.n_head[size_t(il)], Hkv = hp.n_head_kv[size_t(il)], D = hp.head_dim;
    const int64_t E = hp.n_embd;

    const Backend::MatmulOut proj[] = {{&w.q, b.qg, 2 * int64_t(H) * D}, {&w.k, b.k, int64_t(Hkv) * D},
                                       {&w.v, b.v, int64_t(Hkv) * D}};
    be.matmuls(b.cur, T, proj, 3);
    // Each sequence of the step against its own cache; rows r.. of every buffer are its rows.
    const int64_t qg_w = 2 * int64_t(H) * D, q_w = int64_t(H) * D, kv_w = int64_t(Hkv) * D;
    for (const StepSegment &seg : step_segments(s, T)) {
        KvLayer &kv = (*seg.kv)[size_t(il)];
        const int64_t r = seg.row0;
        // Tree verify: nodes are stored at their slots and see only their ancestors (session.h).
        be.qk_norm_rope_store(b.qg + r * qg_w, w.q_norm.data(), b.q + r * q_w, b.k + r * kv_w, w.k_norm.data(),
                              b.v + r * kv_w, kv, b.pos + r, s.tree ? b.tree_slot : b.pos + r, seg.T, H, Hkv, D,
                              hp.n_rot, hp.rope_theta, hp.rms_eps);
        be.attention(b.q + r * q_w, kv, b.pos + r, s.tree ? b.tree_mask : nullptr, seg.T, H, Hkv, D,
                     b.attn + r * q_w);
    }
    be.mul_sigmoid(b.attn, b.qg + D, 2 * D, T * H, D);  // gate_h sits right after q_h
    be.matmul(w.o, b.attn, T, b.mix, E);
}

}  // namespace luce
