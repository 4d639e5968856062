// mtp.cpp — the MTP block's forward, its committed context and its recursive drafts (mtp.h).
// Facts from llama.cpp 0c1e570 (src/models/qwen35.cpp graph_mtp, common/speculative.cpp
// draft-mtp): h is the target's hidden after output_norm; the concatenation is [embedding | hidden];
// the draft row at the anchor's position pairs the anchor with the hidden of the position before
// it, and each further draft pairs the drafted token with the previous draft row's normed output.
#include "mtp.h"

#include <algorithm>

#include "drafter.h"
#include "errors.h"

namespace luce {

MtpContext::MtpContext(const Model &m_, int cap_) : be(*m_.backend), m(m_), cap(cap_), dev_(*m_.backend) {
    if (!m.mtp) fail(LUCE_ERR_INTERNAL, "MTP context for a target without an MTP block");
    const Hparams &hp = m.hp;
    const size_t E = size_t(hp.n_embd), R = ROWS, QW = size_t(hp.mtp_n_head) * hp.head_dim,
                 KW = size_t(hp.mtp_n_head_kv) * hp.head_dim, F = size_t(hp.mtp_n_ff);
    kv = KvLayer{dev_.array<float>(KW * size_t(cap)), dev_.array<float>(KW * size_t(cap)), cap, KvFormat{}};
    b.tokens = dev_.array<int32_t>(R);
    b.pos = dev_.array<int32_t>(R);
    for (float **p : {&b.x, &b.cur, &b.mix}) *p = dev_.array<float>(R * E);
    b.qg = dev_.array<float>(R * 2 * QW);
    b.q = dev_.array<float>(R * QW);
    b.attn = dev_.array<float>(R * QW);
    b.k = dev_.array<float>(R * KW);
    b.v = dev_.array<float>(R * KW);
    b.ff_gate = dev_.array<float>(R * F);
    b.ff_up = dev_.array<float>(R * F);
    emb = dev_.array<float>(R * E);
    cat = dev_.array<float>(R * 2 * E);
    h_in = dev_.array<float>(R * E);
    h_norm = dev_.array<float>(R * E);
    out = dev_.array<float>(R * E);
    h_last = dev_.array<float>(E);  // zero-initialised: position 0 pairs with a zero hidden state
    logits = dev_.array<float>(size_t(hp.n_vocab));
    dev_id = dev_.array<int32_t>(1);
    host_ids.resize(R);
}

MtpContext::~MtpContext() = default;

namespace {

// T rows at positions p0 .. p0+T-1: tokens (host) with hidden inputs ctx.h_in (backend) ->
// normed outputs ctx.out [T][E]; K/V written at those positions.
void mtp_forward(MtpContext &ctx, const int32_t *tokens, int T, int p0) {
    const Hparams &hp = ctx.m.hp;
    const MtpWeights &w = *ctx.m.mtp;
    Backend &be = ctx.be;
    StepBuffers &b = ctx.b;
    const int64_t E = hp.n_embd, F = hp.mtp_n_ff;
    if (T < 1 || T > MtpContext::ROWS || p0 < 0 || p0 + T > ctx.cap)
        fail(LUCE_ERR_INTERNAL, "MTP forward of %d rows at %d (cache of %d)", T, p0, ctx.cap);
    for (int t = 0; t < T; ++t) ctx.host_ids[size_t(t)] = p0 + t;
    be.upload(b.pos, ctx.host_ids.data(), sizeof(int32_t) * size_t(T));
    be.upload(b.tokens, tokens, sizeof(int32_t) * size_t(T));
    be.get_rows(w.embed, b.tokens, T, ctx.emb);
    be.rmsnorm(ctx.emb, E, w.enorm.data(), T, int(E), hp.rms_eps, ctx.cat, 2 * E);
    be.rmsnorm(ctx.h_in, E, w.hnorm.data(), T, int(E), hp.rms_eps, ctx.cat + E, 2 * E);
    be.matmul(w.eh_proj, ctx.cat, T, b.x, E);
    be.rmsnorm(b.x, E, w.block.attn_norm.data(), T, int(E), hp.rms_eps, b.cur, E);
    const AttentionRows rows{0, T, &ctx.kv, b.pos, nullptr};
    attention_layer(be, hp, w.block.attn, b, T, hp.mtp_n_head, hp.mtp_n_head_kv, &rows, 1);
    be.add_rmsnorm(b.x, b.mix, w.block.post_norm.data(), T, int(E), hp.rms_eps, b.cur);
    const Backend::MatmulOut gate_up[] = {{&w.block.ffn_gate, b.ff_gate, F}, {&w.block.ffn_up, b.ff_up, F}};
    be.matmuls(b.cur, T, gate_up, 2);
    be.swiglu(b.ff_gate, b.ff_up, T, F);
    be.matmul(w.block.ffn_down, b.ff_gate, T, b.mix, E);
    be.add(b.x, b.mix, T * E);
    be.rmsnorm(b.x, E, w.head_norm.data(), T, int(E), hp.rms_eps, ctx.out, E);
}

}  // namespace

void mtp_append(MtpContext &ctx, const int32_t *tokens, const float *taps, int64_t tap_stride, int n) {
    const Hparams &hp = ctx.m.hp;
    Backend &be = ctx.be;
    const int64_t E = hp.n_embd;
    const size_t row = size_t(E) * sizeof(float);
    for (int c0 = 0; c0 < n; c0 += MtpContext::ROWS) {
        const int T = std::min(MtpContext::ROWS, n - c0);
        // The target's hidden states h_p = output_norm(tap_p); row t pairs token t with h_{t-1}.
        be.rmsnorm(taps + c0 * tap_stride, tap_stride, ctx.m.output_norm.data(), T, int(E), hp.rms_eps, ctx.h_norm, E);
        be.copy(ctx.h_in, ctx.h_last, row);
        if (T > 1) be.copy(ctx.h_in + E, ctx.h_norm, row * size_t(T - 1));
        be.copy(ctx.h_last, ctx.h_norm + (T - 1) * E, row);
        mtp_forward(ctx, tokens + c0, T, ctx.n_ctx);
        ctx.n_ctx += T;
    }
}

void mtp_draft(MtpContext &ctx, int32_t anchor, int k, int32_t *tokens, const ChainSampling *sampling) {
    const Hparams &hp = ctx.m.hp;
    Backend &be = ctx.be;
    const int64_t E = hp.n_embd, V = hp.n_vocab;
    const size_t row = size_t(E) * sizeof(float);
    if (k < 1 || ctx.n_ctx + k > ctx.cap) fail(LUCE_ERR_INTERNAL, "MTP draft of %d at %d (cache of %d)", k, ctx.n_ctx, ctx.cap);
    be.copy(ctx.h_in, ctx.h_last, row);
    int32_t prev = anchor;
    for (int i = 0; i < k; ++i) {
        mtp_forward(ctx, &prev, 1, ctx.n_ctx + i);
        be.matmul(ctx.m.mtp->head, ctx.out, 1, ctx.logits, V);
        if (sampling) {
            Distribution &q = sampling->q_out[i];
            if (sampling->top_k && sampling->top_k->k()) {
                sampling->top_k->fetch(ctx.logits, 1, V);
                target_probs_ranked(sampling->top_k->ids(0), sampling->top_k->values(0), sampling->top_k->k(),
                                    sampling->params, q);
            } else {
                ctx.logit_row.resize(size_t(V));
                be.download(ctx.logit_row.data(), ctx.logits, sizeof(float) * size_t(V));
                target_probs(ctx.logit_row.data(), int(V), sampling->params, ctx.ranking, q);
            }
            tokens[i] = draw(q, *sampling->rng);
        } else {
            tokens[i] = be.argmax(ctx.logits, V);
        }
        prev = tokens[i];
        be.copy(ctx.h_in, ctx.out, row);  // the next row's hidden input: this row's normed output
    }
}

std::unique_ptr<Drafter> mtp_drafter(Model *target) {
    if (!target->mtp)
        fail(LUCE_ERR_UNSUPPORTED, "%s has no MTP block (no blk.%d.nextn.* tensors): --draft mtp needs a target "
             "that keeps it", target->file->path().c_str(), target->hp.n_layer);
    auto d = std::make_unique<Drafter>();
    d->target = target;
    DrafterHparams &hp = d->hp;
    hp.kind = DRAFT_MTP;
    hp.n_embd = target->hp.n_embd;
    hp.block_size = MTP_HORIZON;
    hp.target_layer_ids = {target->hp.n_layer - 1};
    hp.sample_from_anchor = true;
    hp.rms_eps = target->hp.rms_eps;
    return d;
}

}  // namespace luce
