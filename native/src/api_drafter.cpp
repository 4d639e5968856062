// api_drafter.cpp — the drafter part of the C ABI (luce_drafter_*): load/bind, info, and the two
// stateless test hooks the parity tests drive (one forward, one candidate chain). The hooks take
// host arrays and copy them to and from backend memory, so they run on either backend. Last, the
// hook that runs the adaptive speculation policy over synthetic step costs (luce_spec_policy_trace).
#include <algorithm>
#include <cstring>

#include "api_handles.h"
#include "drafter.h"
#include "errors.h"
#include "luce.h"
#include "spec_policy.h"


using luce::fail;
using luce::guard;

using luce::require;

namespace {

// A backend buffer for the host arrays these test hooks take (the drafter reads backend memory).
struct DeviceCopy {
    luce::Backend &be;
    void *p;
    DeviceCopy(luce::Backend &b, size_t n) : be(b), p(b.alloc(n + 64)) {}
    ~DeviceCopy() { be.release(p); }
    DeviceCopy(const DeviceCopy &) = delete;
    DeviceCopy &operator=(const DeviceCopy &) = delete;
};

}  // namespace

LUCE_API luce_status luce_drafter_load(const char *path, luce_model *target, luce_drafter **out) {
    return guard([&] {
        require(out, "out");
        *out = nullptr;
        require(path, "path");
        require(target, "target");
        auto h = std::make_unique<luce_drafter>();
        h->d = luce::load_drafter(path, target->m.get());
        *out = h.release();
    });
}

LUCE_API luce_status luce_drafter_mtp(luce_model *target, luce_drafter **out) {
    return guard([&] {
        require(out, "out");
        *out = nullptr;
        require(target, "target");
        auto h = std::make_unique<luce_drafter>();
        h->d = luce::mtp_drafter(target->m.get());
        *out = h.release();
    });
}

LUCE_API void luce_drafter_free(luce_drafter *drafter) { delete drafter; }

LUCE_API luce_status luce_drafter_get_info(const luce_drafter *drafter, luce_drafter_info *out) {
    return guard([&] {
        require(drafter, "drafter");
        require(out, "out");
        const luce::DrafterHparams &hp = drafter->d->hp;
        luce_drafter_info info{};
        info.kind = hp.kind;
        info.n_layer = hp.n_layer;
        info.n_embd = hp.n_embd;
        info.n_head = hp.n_head;
        info.n_head_kv = hp.n_head_kv;
        info.head_dim = hp.head_dim;
        info.n_ff = hp.n_ff;
        info.block_size = hp.block_size;
        info.n_target_layers = int32_t(hp.target_layer_ids.size());
        for (size_t i = 0; i < hp.target_layer_ids.size() && i < 64; ++i) info.target_layer_ids[i] = hp.target_layer_ids[i];
        info.mask_token_id = hp.mask_token_id;
        info.sample_from_anchor = hp.sample_from_anchor;
        info.has_selector = hp.selector_rank > 0;
        info.selector_rank = hp.selector_rank;
        info.selector_top_k = hp.selector_top_k;
        info.has_conv = hp.conv_kernel > 0;
        info.conv_kernel_size = hp.conv_kernel;
        info.conv_group_size = hp.conv_group;
        info.has_markov = hp.markov_rank > 0;
        info.markov_rank = hp.markov_rank;
        info.has_confidence = hp.confidence_dim > 0;
        info.confidence_dim = hp.confidence_dim;
        *out = info;
    });
}

LUCE_API luce_status luce_drafter_forward(luce_drafter *drafter, const float *features, int32_t n_ctx,
                                          const int32_t *block, int32_t n_block, float *hidden_out) {
    return guard([&] {
        require(drafter, "drafter");
        if (drafter->d->hp.kind == luce::DRAFT_MTP) fail(LUCE_ERR_UNSUPPORTED, "the MTP drafter has no block forward");
        require(block, "block");
        require(hidden_out, "hidden_out");
        if (n_ctx < 0) fail(LUCE_ERR_INVALID_ARGUMENT, "n_ctx must be >= 0");
        if (n_ctx > 0) require(features, "features");
        if (n_block < 1 || n_block > luce::DraftContext::ROWS)
            fail(LUCE_ERR_INVALID_ARGUMENT, "n_block = %d must be in 1..%d", n_block, luce::DraftContext::ROWS);
        const luce::Drafter &d = *drafter->d;
        luce::Backend &be = *d.target->backend;
        luce::DraftContext ctx(d, n_ctx + n_block);
        const size_t feat_bytes = sizeof(float) * size_t(n_ctx) * size_t(d.n_taps()) * size_t(d.hp.n_embd);
        const size_t out_bytes = sizeof(float) * size_t(n_block) * size_t(d.hp.n_embd);
        DeviceCopy feats(be, feat_bytes), out(be, out_bytes);
        be.upload(feats.p, features, feat_bytes);
        luce::draft_append_context(d, ctx, static_cast<const float *>(feats.p), n_ctx);
        luce::draft_forward(d, ctx, block, n_block, static_cast<float *>(out.p));
        be.download(hidden_out, out.p, out_bytes);
    });
}

LUCE_API luce_status luce_drafter_chain(luce_drafter *drafter, const float *hidden, int32_t n_rows, int32_t anchor,
                                        int32_t *tokens_out, float *confidence_out) {
    return guard([&] {
        require(drafter, "drafter");
        if (drafter->d->hp.kind == luce::DRAFT_MTP) fail(LUCE_ERR_UNSUPPORTED, "the MTP drafter has no candidate heads");
        if (n_rows < 0 || n_rows > 4096) fail(LUCE_ERR_INVALID_ARGUMENT, "n_rows = %d must be in 0..4096", n_rows);
        if (n_rows > 0) {
            require(hidden, "hidden");
            require(tokens_out, "tokens_out");
        }
        const luce::Drafter &d = *drafter->d;
        luce::Backend &be = *d.target->backend;
        const size_t bytes = sizeof(float) * size_t(n_rows) * size_t(d.hp.n_embd);
        DeviceCopy rows(be, bytes);
        be.upload(rows.p, hidden, bytes);
        luce::DraftHeads heads(d, std::max(n_rows, 1));
        luce::draft_chain(d, heads, static_cast<const float *>(rows.p), n_rows, anchor, tokens_out, confidence_out);
    });
}

LUCE_API luce_status luce_spec_policy_trace(int32_t adaptive, const double *plain_seconds,
                                            const double *spec_seconds, const int32_t *committed,
                                            int32_t n_steps, int32_t *choices_out) {
    return guard([&] {
        if (n_steps < 0) fail(LUCE_ERR_INVALID_ARGUMENT, "n_steps must be >= 0, got %d", int(n_steps));
        if (n_steps == 0) return;
        require(plain_seconds, "plain_seconds");
        require(spec_seconds, "spec_seconds");
        require(committed, "committed");
        require(choices_out, "choices_out");
        // One fixed width wide enough for any committed count the tests give.
        constexpr int WIDTH = 64;
        luce::SpecPolicy policy(adaptive != 0, WIDTH, WIDTH, WIDTH, false);
        for (int32_t i = 0; i < n_steps; ++i) {
            if (!(plain_seconds[i] > 0) || !(spec_seconds[i] > 0) || committed[i] < 1 || committed[i] > WIDTH)
                fail(LUCE_ERR_INVALID_ARGUMENT, "step %d: times must be > 0 and committed >= 1", int(i));
            choices_out[i] = policy.next_width() > 0;
            if (choices_out[i]) policy.after_spec(WIDTH - 1, committed[i] - 1, spec_seconds[i]);
            else policy.after_plain(plain_seconds[i]);
        }
    });
}

LUCE_API luce_status luce_spec_policy_trace_auto(int32_t max_width, double plain_seconds, const double *width_seconds,
                                                 const int32_t *accept_run, const double *prior_acceptance,
                                                 int32_t n_prior, int32_t n_steps, int32_t *widths_out) {
    return guard([&] {
        if (max_width < 2 || max_width > 64) fail(LUCE_ERR_INVALID_ARGUMENT, "max_width must be in 2..64");
        if (n_steps < 0 || n_prior < 0) fail(LUCE_ERR_INVALID_ARGUMENT, "n_steps and n_prior must be >= 0");
        require(width_seconds, "width_seconds");
        if (n_steps > 0) {
            require(accept_run, "accept_run");
            require(widths_out, "widths_out");
        }
        if (!(plain_seconds > 0)) fail(LUCE_ERR_INVALID_ARGUMENT, "times must be > 0");
        for (int w = 2; w <= max_width; ++w)
            if (!(width_seconds[w] > 0)) fail(LUCE_ERR_INVALID_ARGUMENT, "times must be > 0");
        luce::SpecPolicy policy(true, 2, max_width, std::min(4, int(max_width)), false);
        if (prior_acceptance) policy.seed(plain_seconds, width_seconds, max_width + 1, prior_acceptance, n_prior);
        for (int32_t i = 0; i < n_steps; ++i) {
            const int w = widths_out[i] = policy.next_width();
            if (w == 0) policy.after_plain(plain_seconds);
            else policy.after_spec(w - 1, std::clamp(int(accept_run[i]), 0, w - 1), width_seconds[w]);
        }
    });
}
