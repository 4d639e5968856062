// deltanet.cpp — the Gated DeltaNet mixer (spec/qwen35.md §1.4, §3.5, pitfalls 2, 3, 7, 8, 9).
//
//   qkv = attn_qkv cur     [T][CD]  CD = [q (HK*DK) | k (HK*DK) | v (HV*DV)], v heads tiled
//   z   = attn_gate cur    [T][HV][DV];   b = ssm_beta cur, a = ssm_alpha cur   [T][HV]
//   c   = silu(causal_conv(qkv))          conv state = last Kc-1 RAW qkv rows (not conv outputs)
//   q, k = l2norm per head (x / max(||x||, eps)), q *= 1/sqrt(DK)
//   beta = sigmoid(b), g = ssm_a * softplus(a + dt_bias)  (ssm_a = -exp(A_log), so g <= 0)
//   per v head j (k head j % HK), state S [DK][DV] fp32:
//       S = e^g S;  delta = beta (v - S^T k);  S += k delta^T;  o = S^T q
//   o   = rmsnorm(o) * ssm_norm * silu(z)  per v head (plain weight, no +1)
//   mix = ssm_out o
// Prefill runs the same per-token recurrence over the chunk (the chunked form is only faster).
#include "session.h"

namespace luce {

void deltanet_mixer(Session &s, int il, int T) {
    const Hparams &hp = s.model->hp;
    const DeltaNetWeights &w = s.model->layers[size_t(il)].ssm;
    Backend &be = *s.model->backend;
    StepBuffers &b = s.buf;
    const int CD = hp.conv_channels(), HV = hp.ssm_hv;
    const int64_t inner = int64_t(HV) * hp.ssm_dv, E = hp.n_embd;

    const Backend::MatmulOut proj[] = {{&w.qkv, b.qkv, CD}, {&w.gate, b.z, inner}, {&w.beta, b.b, HV},
                                       {&w.alpha, b.a, HV}};
    be.matmuls(b.cur, T, proj, 4);
    const DeltaNetDims dims{hp.ssm_hk, hp.ssm_hv, hp.ssm_dk, hp.ssm_dv, hp.rms_eps};
    if (s.tree) {  // tree verify (one sequence): each token's window and state from its parent
        RecurrentState &st = s.recurrent[size_t(il)];
        if (st.qkv_history) be.copy(st.qkv_history, b.qkv, size_t(T) * size_t(CD) * sizeof(float));
        be.conv_silu(b.qkv, st.conv, w.conv.data(), T, CD, hp.ssm_conv, b.conv, b.tree_parent);
        be.gated_delta_net(b.conv, b.b, b.a, w.a.data(), w.dt_bias.data(), dims, T, st.ssm, b.attn,
                           st.ssm_history, b.tree_parent);
    } else {
        // Each sequence of the step through its own conv window and delta-rule state.
        const SegmentSpan segments = step_segments(s, T);
        RecurrentRows rows[MAX_STEP];
        for (int i = 0; i < segments.n; ++i) {
            const StepSegment &seg = segments.first[i];
            RecurrentState &st = (*seg.recurrent)[size_t(il)];
            if (st.qkv_history)
                be.copy(st.qkv_history, b.qkv + int64_t(seg.row0) * CD, size_t(seg.T) * size_t(CD) * sizeof(float));
            rows[i] = {seg.row0, seg.T, st.conv, st.ssm, st.ssm_history};
        }
        be.deltanet_sequences(b.qkv, w.conv.data(), CD, hp.ssm_conv, b.conv, b.b, b.a, w.a.data(), w.dt_bias.data(),
                              dims, rows, segments.n, b.attn);
    }
    be.rmsnorm_gated(b.attn, w.norm.data(), b.z, T, HV, hp.ssm_dv, hp.rms_eps);
    be.matmul(w.out, b.attn, T, b.mix, E);
}

}  // namespace luce
