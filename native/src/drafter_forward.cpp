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
// Memory: every buffer is backend memory (DraftContext); the host uploads only the block's
// position and token ids; the attention masks (B x cap bytes a variant) are built on the backend
// (Backend::drafter_masks), so a long context costs no upload.
#include <algorithm>
#include <cstring>

#include "drafter.h"
#include "errors.h"

namespace luce {

void *DraftContext::take(size_t n_bytes) {
    owned_.push_back(be.alloc(n_bytes));
    return owned_.back();
}

DraftContext::DraftContext(const Drafter &d, int cap_) : be(*d.target->backend), cap(cap_) {
    const DrafterHparams &hp = d.hp;
    const size_t E = size_t(hp.n_embd), QW = size_t(hp.n_head) * hp.head_dim,
                 KW = size_t(hp.n_head_kv) * hp.head_dim, R = ROWS, F = sizeof(float);
    const size_t G = hp.conv_group ? size_t(hp.n_embd / hp.conv_group) : 0;
    try {
        for (int l = 0; l < hp.n_layer; ++l)
            kv.push_back(KvLayer{take(KW * size_t(cap) * F), take(KW * size_t(cap) * F), cap, KvFormat{}});
        for (float **b : {&x, &cur, &tmp, &mix}) *b = static_cast<float *>(take(R * E * F));
        q = static_cast<float *>(take(R * QW * F));
        attn = static_cast<float *>(take(R * QW * F));
        kr = static_cast<float *>(take(R * KW * F));
        vr = static_cast<float *>(take(R * KW * F));
        dyn = static_cast<float *>(take((R * 2 * size_t(hp.conv_kernel) * G + 1) * F));
        gate = static_cast<float *>(take(R * size_t(hp.n_ff) * F));
        up = static_cast<float *>(take(R * size_t(hp.n_ff) * F));
        masks = static_cast<uint8_t *>(take(4 * R * size_t(cap)));
        pos = static_cast<int32_t *>(take(R * sizeof(int32_t)));
        block = static_cast<int32_t *>(take(R * sizeof(int32_t)));
    } catch (...) {
        for (void *p : owned_) be.release(p);
        throw;
    }
    host_ids.assign(R, 0);
}

DraftContext::~DraftContext() {
    be.graph_clear();  // the block graphs point into the buffers going now
    for (void *p : owned_) be.release(p);
}

namespace {

// The four mask variants: (sliding, causal) -> index.
int mask_variant(const Drafter &d, int layer) {
    return (d.hp.sliding[size_t(layer)] ? 2 : 0) + (d.hp.causal[size_t(layer)] ? 1 : 0);
}

void upload_positions(DraftContext &ctx, int p0, int T) {
    for (int t = 0; t < T; ++t) ctx.host_ids[size_t(t)] = p0 + t;
    ctx.be.upload(ctx.pos, ctx.host_ids.data(), sizeof(int32_t) * size_t(T));
}

// rows <- dyn_conv(rows) for one side of a sublayer's conv (via ctx.tmp: the op is out-of-place).
void conv_sublayer(const Drafter &d, DraftContext &ctx, const DrafterConv &cv, int side, float *rows, int B) {
    const DrafterHparams &hp = d.hp;
    const int E = hp.n_embd, K = hp.conv_kernel, G = E / hp.conv_group;
    ctx.be.dyn_conv(cv.base.data() + int64_t(side) * K * E, ctx.dyn + int64_t(side) * K * G, 2 * int64_t(K) * G, rows,
                    B, E, K, hp.conv_group, ctx.tmp);
    ctx.be.copy(rows, ctx.tmp, sizeof(float) * size_t(B) * size_t(E));
}

}  // namespace

void draft_append_context(const Drafter &d, DraftContext &ctx, const float *taps, int n) {
    const DrafterHparams &hp = d.hp;
    Backend &be = ctx.be;
    const int E = hp.n_embd, D = hp.head_dim, Hkv = hp.n_head_kv;
    if (n < 0 || int64_t(ctx.n_ctx) + n > ctx.cap)
        fail(LUCE_ERR_CONTEXT_FULL, "drafter context holds %d positions; %d + %d do not fit", ctx.cap, ctx.n_ctx, n);
    const int64_t tap_width = int64_t(d.n_taps()) * E;
    for (int r0 = 0; r0 < n; r0 += DraftContext::ROWS) {
        const int T = std::min(DraftContext::ROWS, n - r0);
        upload_positions(ctx, ctx.n_ctx, T);
        float *fused = ctx.cur;
        be.matmul(d.fc, taps + r0 * tap_width, T, ctx.tmp, E);
        be.rmsnorm(ctx.tmp, E, d.hidden_norm.data(), T, E, hp.rms_eps, fused, E);
        for (int l = 0; l < hp.n_layer; ++l) {
            const DrafterLayer &L = d.layers[size_t(l)];
            const Backend::MatmulOut kv[] = {{&L.k, ctx.kr, int64_t(Hkv) * D}, {&L.v, ctx.vr, int64_t(Hkv) * D}};
            be.matmuls(fused, T, kv, 2);
            be.rmsnorm(ctx.kr, D, L.k_norm.data(), T * Hkv, D, hp.rms_eps, ctx.kr, D);
            be.rope_table(ctx.kr, ctx.pos, T, Hkv, D, d.rope_inv_freq.data(), d.rope_mscale);
            be.kv_store(ctx.kv[size_t(l)], ctx.kr, ctx.vr, ctx.pos, T, Hkv, D);
        }
        ctx.n_ctx += T;
    }
}

namespace {

// A block's launches from the embedding to the last layer's residual stream ctx.x: everything
// they read that varies between blocks (ids, positions, masks) is in backend memory, so one
// recording per B serves every block (run_graphed).
void draft_launches(const Drafter &d, DraftContext &ctx, int B) {
    const DrafterHparams &hp = d.hp;
    const Model &tm = *d.target;
    Backend &be = ctx.be;
    const int E = hp.n_embd, D = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
    unsigned variants = 0;  // the masks the layers read, built on the backend from ctx.pos
    for (int l = 0; l < hp.n_layer; ++l) variants |= 1u << mask_variant(d, l);
    be.drafter_masks(ctx.masks, DraftContext::ROWS, ctx.cap, ctx.pos, B, hp.sliding_window, variants);
    float *x = ctx.x, *cur = ctx.cur, *mix = ctx.mix;
    be.get_rows(tm.token_embd, ctx.block, B, x);
    const int64_t dyn_width = 2 * int64_t(hp.conv_kernel) * (hp.conv_group ? E / hp.conv_group : 0);
    const bool conv = hp.conv_kernel > 0;

    for (int l = 0; l < hp.n_layer; ++l) {
        const DrafterLayer &L = d.layers[size_t(l)];
        // Attention sublayer.
        be.rmsnorm(x, E, L.attn_norm.data(), B, E, hp.rms_eps, cur, E);
        if (conv) {
            be.matmul(L.attn_conv.proj, cur, B, ctx.dyn, dyn_width);
            conv_sublayer(d, ctx, L.attn_conv, 0, cur, B);
        }
        const Backend::MatmulOut qkv[] = {{&L.q, ctx.q, int64_t(H) * D}, {&L.k, ctx.kr, int64_t(Hkv) * D},
                                          {&L.v, ctx.vr, int64_t(Hkv) * D}};
        be.matmuls(cur, B, qkv, 3);
        be.rmsnorm(ctx.q, D, L.q_norm.data(), B * H, D, hp.rms_eps, ctx.q, D);
        be.rmsnorm(ctx.kr, D, L.k_norm.data(), B * Hkv, D, hp.rms_eps, ctx.kr, D);
        be.rope_table(ctx.q, ctx.pos, B, H, D, d.rope_inv_freq.data(), d.rope_mscale);
        be.rope_table(ctx.kr, ctx.pos, B, Hkv, D, d.rope_inv_freq.data(), d.rope_mscale);
        be.kv_store(ctx.kv[size_t(l)], ctx.kr, ctx.vr, ctx.pos, B, Hkv, D);  // transient block rows
        const uint8_t *mask = ctx.masks + int64_t(mask_variant(d, l)) * DraftContext::ROWS * ctx.cap;
        be.attention(ctx.q, ctx.kv[size_t(l)], ctx.pos, mask, B, H, Hkv, D, ctx.attn);
        be.matmul(L.o, ctx.attn, B, mix, E);
        if (conv) conv_sublayer(d, ctx, L.attn_conv, 1, mix, B);
        be.add(x, mix, int64_t(B) * E);
        // MLP sublayer.
        be.rmsnorm(x, E, L.ffn_norm.data(), B, E, hp.rms_eps, cur, E);
        if (conv) {
            be.matmul(L.ffn_conv.proj, cur, B, ctx.dyn, dyn_width);
            conv_sublayer(d, ctx, L.ffn_conv, 0, cur, B);
        }
        const Backend::MatmulOut gate_up[] = {{&L.gate, ctx.gate, F}, {&L.up, ctx.up, F}};
        be.matmuls(cur, B, gate_up, 2);
        be.swiglu(ctx.gate, ctx.up, B, F);
        be.matmul(L.down, ctx.gate, B, mix, E);
        if (conv) conv_sublayer(d, ctx, L.ffn_conv, 1, mix, B);
        be.add(x, mix, int64_t(B) * E);
    }
}

}  // namespace

void draft_forward(const Drafter &d, DraftContext &ctx, const int32_t *block, int B, float *out) {
    const DrafterHparams &hp = d.hp;
    const Model &tm = *d.target;
    const int p0 = ctx.n_ctx;
    if (B < 1 || B > DraftContext::ROWS) fail(LUCE_ERR_INVALID_ARGUMENT, "draft block of %d rows (1..%d)", B,
                                              DraftContext::ROWS);
    if (int64_t(p0) + B > ctx.cap)
        fail(LUCE_ERR_CONTEXT_FULL, "drafter context holds %d positions; a block of %d at %d does not fit", ctx.cap, B,
             p0);
    for (int j = 0; j < B; ++j)
        if (block[j] < 0 || block[j] >= tm.hp.n_vocab)
            fail(LUCE_ERR_INVALID_ARGUMENT, "block token %d at slot %d is out of range (vocabulary has %d tokens)",
                 block[j], j, tm.hp.n_vocab);
    ctx.be.upload(ctx.block, block, sizeof(int32_t) * size_t(B));
    upload_positions(ctx, p0, B);
    run_graphed(ctx.be, (ctx.graph_id << 17) | uint64_t(B), [&] { draft_launches(d, ctx, B); });
    // Outside the graph: out is the caller's, and may differ from one block to the next.
    ctx.be.rmsnorm(ctx.x, hp.n_embd, d.output_norm.data(), B, hp.n_embd, hp.rms_eps, out, hp.n_embd);
}

}  // namespace luce
