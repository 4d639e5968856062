// drafter_forward.cpp — the DFlash backbone (spec drafters.md §1.3-§1.5, §2.1).
//
// Context ("KV injection"): the target's layer outputs at the tapped layers, for every committed
// position p, are fused once  ctx_p = hidden_norm(fc([h_L1; ...; h_LN]))  and projected by every
// drafter layer l into  K_l[p] = RoPE_p(k_norm(k_proj_l ctx_p)),  V_l[p] = v_proj_l ctx_p.
// Those rows are cached and never recomputed (draft_append_context).
//
// Block: rows [anchor, mask x (B-1)] at positions p0..p0+B-1 (p0 = n_ctx, the anchor's own
// position: its features are not in the context yet), embedded with the target's token_embd.
// Per layer (pre-norm Qwen3 block; RMSNorm is the plain x * rsqrt(mean x^2 + eps) * w form):
//   u  = rmsnorm(x) * attn_norm;          [DFlash 2: u = conv_prepare(u)]
//   q  = RoPE(q_norm(q_proj u)), queries from block rows only          [B][H][D]
//   K/V = [context rows 0..p0-1 | block rows]                           [Hkv][p0+B][D]
//   a  = o_proj softmax(q K^T / sqrt(D)) V;  [DFlash 2: a = conv_finish(a)];  x += a
//   the MLP the same way: x += down(silu(gate u) * up u) with ffn_norm and its own conv.
// Visibility for query slot j (position p0+j): context key i unless the layer is sliding and
// i <= p0+j-W; block key j' always (full layers: bidirectional) or j' <= j (causal layers).
// Output: rmsnorm(x) * output_norm, the rows the target head turns into proposals.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "drafter.h"
#include "errors.h"

namespace luce {

DraftContext::DraftContext(const Drafter &d, int cap_) : cap(cap_) {
    const DrafterHparams &hp = d.hp;
    const size_t E = size_t(hp.n_embd), QW = size_t(hp.n_head) * hp.head_dim,
                 KW = size_t(hp.n_head_kv) * hp.head_dim, R = ROWS;
    k.resize(size_t(hp.n_layer));
    v.resize(size_t(hp.n_layer));
    for (int l = 0; l < hp.n_layer; ++l) {
        k[size_t(l)].assign(KW * size_t(cap), 0.f);
        v[size_t(l)].assign(KW * size_t(cap), 0.f);
    }
    for (auto *b : {&x, &cur, &tmp, &mix}) b->assign(R * E, 0.f);
    q.assign(R * QW, 0.f);
    attn.assign(R * QW, 0.f);
    kr.assign(R * KW, 0.f);
    vr.assign(R * KW, 0.f);
    const size_t G = hp.conv_group ? size_t(hp.n_embd / hp.conv_group) : 0;
    dyn.assign(R * 2 * size_t(hp.conv_kernel) * G + 1, 0.f);
    gate.assign(R * size_t(hp.n_ff), 0.f);
    up.assign(R * size_t(hp.n_ff), 0.f);
    mask.assign(R * size_t(cap), 0);
    pos.assign(R, 0);
}

namespace {

// NeoX rotate-half RoPE over the full head: pairs (i, i + D/2), angle pos * inv_freq[i] in fp32,
// cos and sin scaled by the YaRN attention factor (HF multiplies it into both).
void rope(const Drafter &d, float *x, const int32_t *pos, int T, int n_head) {
    const int D = d.hp.head_dim, half = D / 2;
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < half; ++i) {
            const float angle = float(pos[t]) * d.rope_inv_freq[size_t(i)];
            const float c = std::cos(angle) * d.rope_mscale, s = std::sin(angle) * d.rope_mscale;
            for (int h = 0; h < n_head; ++h) {
                float *xh = x + (int64_t(t) * n_head + h) * D;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
}

// Writes rows [T][Hkv*D] at positions pos[t] of a [Hkv][cap][D] cache.
void store_kv(const DraftContext &ctx, std::vector<float> &cache, const float *rows, const int32_t *pos, int T,
              int Hkv, int D) {
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < Hkv; ++h)
            std::memcpy(cache.data() + (int64_t(h) * ctx.cap + pos[t]) * D, rows + (int64_t(t) * Hkv + h) * D,
                        sizeof(float) * size_t(D));
}

// DFlash 2 grouped dynamic causal conv, block-local (spec drafters.md §2.1):
//   out[t][c] = sum_{tau<K, t-tau>=0} (base[side][tau][c] + dyn[t][side][tau][c / group]) * in[t-tau][c]
// dyn rows are [2][K][G] (projection order side, tap, group) from the sublayer's normed input.
void dyn_conv(const DrafterConv &cv, int side, const float *dyn, const float *in, int B, int E, int K, int group,
              float *out) {
    const int G = E / group;
    for (int t = 0; t < B; ++t) {
        const float *dt = dyn + int64_t(t) * 2 * K * G + int64_t(side) * K * G;
        float *o = out + int64_t(t) * E;
        std::fill(o, o + E, 0.f);
        for (int tau = 0; tau < K && tau <= t; ++tau) {
            const float *base = cv.base.data() + (int64_t(side) * K + tau) * E;
            const float *src = in + int64_t(t - tau) * E;
            for (int c = 0; c < E; ++c) o[c] += (base[c] + dt[tau * G + c / group]) * src[c];
        }
    }
}

// mask[j][key] for query slot j of a block at p0 (see the header comment).
void build_mask(const Drafter &d, DraftContext &ctx, int layer, int p0, int B) {
    const bool sliding = d.hp.sliding[size_t(layer)], causal = d.hp.causal[size_t(layer)];
    const int W = d.hp.sliding_window;
    for (int j = 0; j < B; ++j) {
        uint8_t *m = ctx.mask.data() + int64_t(j) * ctx.cap;
        std::fill(m, m + ctx.cap, 0);
        const int q_pos = p0 + j;
        for (int i = sliding ? std::max(0, q_pos - W + 1) : 0; i < p0; ++i) m[i] = 1;
        for (int jj = 0; jj < B; ++jj) m[p0 + jj] = (!causal || jj <= j) ? 1 : 0;
    }
}

void conv_sublayer(const Drafter &d, DraftContext &ctx, const DrafterConv &cv, int side, float *rows, int B) {
    const DrafterHparams &hp = d.hp;
    dyn_conv(cv, side, ctx.dyn.data(), rows, B, hp.n_embd, hp.conv_kernel, hp.conv_group, ctx.tmp.data());
    std::memcpy(rows, ctx.tmp.data(), sizeof(float) * size_t(B) * size_t(hp.n_embd));
}

}  // namespace

void draft_append_context(const Drafter &d, DraftContext &ctx, const float *taps, int n) {
    const DrafterHparams &hp = d.hp;
    Backend &be = *d.target->backend;
    const int E = hp.n_embd, D = hp.head_dim, Hkv = hp.n_head_kv;
    if (n < 0 || int64_t(ctx.n_ctx) + n > ctx.cap)
        fail(LUCE_ERR_CONTEXT_FULL, "drafter context holds %d positions; %d + %d do not fit", ctx.cap, ctx.n_ctx, n);
    const int64_t tap_width = int64_t(d.n_taps()) * E;
    for (int r0 = 0; r0 < n; r0 += DraftContext::ROWS) {
        const int T = std::min(DraftContext::ROWS, n - r0);
        for (int t = 0; t < T; ++t) ctx.pos[size_t(t)] = ctx.n_ctx + t;
        float *fused = ctx.cur.data();
        be.matmul(d.fc, taps + r0 * tap_width, T, ctx.tmp.data(), E);
        be.rmsnorm(ctx.tmp.data(), E, d.hidden_norm.data(), T, E, hp.rms_eps, fused, E);
        for (int l = 0; l < hp.n_layer; ++l) {
            const DrafterLayer &L = d.layers[size_t(l)];
            be.matmul(L.k, fused, T, ctx.kr.data(), int64_t(Hkv) * D);
            be.matmul(L.v, fused, T, ctx.vr.data(), int64_t(Hkv) * D);
            be.rmsnorm(ctx.kr.data(), D, L.k_norm.data(), T * Hkv, D, hp.rms_eps, ctx.kr.data(), D);
            rope(d, ctx.kr.data(), ctx.pos.data(), T, Hkv);
            store_kv(ctx, ctx.k[size_t(l)], ctx.kr.data(), ctx.pos.data(), T, Hkv, D);
            store_kv(ctx, ctx.v[size_t(l)], ctx.vr.data(), ctx.pos.data(), T, Hkv, D);
        }
        ctx.n_ctx += T;
    }
}

void draft_forward(const Drafter &d, DraftContext &ctx, const int32_t *block, int B, float *out) {
    const DrafterHparams &hp = d.hp;
    const Model &tm = *d.target;
    Backend &be = *tm.backend;
    const int E = hp.n_embd, D = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
    const int p0 = ctx.n_ctx;
    if (B < 1 || B > DraftContext::ROWS) fail(LUCE_ERR_INVALID_ARGUMENT, "draft block of %d rows (1..%d)", B,
                                              DraftContext::ROWS);
    if (int64_t(p0) + B > ctx.cap)
        fail(LUCE_ERR_CONTEXT_FULL, "drafter context holds %d positions; a block of %d at %d does not fit", ctx.cap, B,
             p0);
    for (int j = 0; j < B; ++j) {
        if (block[j] < 0 || block[j] >= tm.hp.n_vocab)
            fail(LUCE_ERR_INVALID_ARGUMENT, "block token %d at slot %d is out of range (vocabulary has %d tokens)",
                 block[j], j, tm.hp.n_vocab);
        ctx.pos[size_t(j)] = p0 + j;
    }
    float *x = ctx.x.data(), *cur = ctx.cur.data(), *mix = ctx.mix.data();
    be.get_rows(tm.token_embd, block, B, x);
    const int64_t dyn_width = 2 * int64_t(hp.conv_kernel) * (hp.conv_group ? E / hp.conv_group : 0);
    const bool conv = hp.conv_kernel > 0;

    for (int l = 0; l < hp.n_layer; ++l) {
        const DrafterLayer &L = d.layers[size_t(l)];
        // Attention sublayer.
        be.rmsnorm(x, E, L.attn_norm.data(), B, E, hp.rms_eps, cur, E);
        if (conv) {
            be.matmul(L.attn_conv.proj, cur, B, ctx.dyn.data(), dyn_width);
            conv_sublayer(d, ctx, L.attn_conv, 0, cur, B);
        }
        be.matmul(L.q, cur, B, ctx.q.data(), int64_t(H) * D);
        be.matmul(L.k, cur, B, ctx.kr.data(), int64_t(Hkv) * D);
        be.matmul(L.v, cur, B, ctx.vr.data(), int64_t(Hkv) * D);
        be.rmsnorm(ctx.q.data(), D, L.q_norm.data(), B * H, D, hp.rms_eps, ctx.q.data(), D);
        be.rmsnorm(ctx.kr.data(), D, L.k_norm.data(), B * Hkv, D, hp.rms_eps, ctx.kr.data(), D);
        rope(d, ctx.q.data(), ctx.pos.data(), B, H);
        rope(d, ctx.kr.data(), ctx.pos.data(), B, Hkv);
        store_kv(ctx, ctx.k[size_t(l)], ctx.kr.data(), ctx.pos.data(), B, Hkv, D);  // transient block rows
        store_kv(ctx, ctx.v[size_t(l)], ctx.vr.data(), ctx.pos.data(), B, Hkv, D);
        build_mask(d, ctx, l, p0, B);
        KvLayer kv{ctx.k[size_t(l)].data(), ctx.v[size_t(l)].data(), ctx.cap};
        be.attention(ctx.q.data(), kv, ctx.pos.data(), ctx.mask.data(), B, H, Hkv, D, ctx.attn.data());
        be.matmul(L.o, ctx.attn.data(), B, mix, E);
        if (conv) conv_sublayer(d, ctx, L.attn_conv, 1, mix, B);
        be.add(x, mix, int64_t(B) * E);
        // MLP sublayer.
        be.rmsnorm(x, E, L.ffn_norm.data(), B, E, hp.rms_eps, cur, E);
        if (conv) {
            be.matmul(L.ffn_conv.proj, cur, B, ctx.dyn.data(), dyn_width);
            conv_sublayer(d, ctx, L.ffn_conv, 0, cur, B);
        }
        be.matmul(L.gate, cur, B, ctx.gate.data(), F);
        be.matmul(L.up, cur, B, ctx.up.data(), F);
        be.swiglu(ctx.gate.data(), ctx.up.data(), int64_t(B) * F);
        be.matmul(L.down, ctx.gate.data(), B, mix, E);
        if (conv) conv_sublayer(d, ctx, L.ffn_conv, 1, mix, B);
        be.add(x, mix, int64_t(B) * E);
    }
    be.rmsnorm(x, E, d.output_norm.data(), B, E, hp.rms_eps, out, E);
}

}  // namespace luce
