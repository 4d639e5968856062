// mtp.h — the target's own MTP block as a drafter (spec qwen35.md §1.7; mtp.cpp).
//
// Row at position p: x_p = eh_proj([enorm(embed(token_p)) | hnorm(h_{p-1})]) through one
// full-attention decoder block with its own K/V cache; its output o_p = head_norm(block(x_p)) gives
// logits head(o_p) for token p+1. h_{p-1} is the target's final-normed hidden state at p-1
// (zeros at p = 0) for committed positions, and the previous draft row's o for drafted ones, so k
// drafts take k one-row forwards. Cache slots hold K/V by position: committed rows are written
// from the target's hidden states, drafted rows only transiently, and the next append rewrites
// every position past the committed prefix (rejected drafts included) before a row can see it.
#pragma once

#include <cstdint>
#include <vector>

#include "backend.h"
#include "drafter.h"
#include "generate.h"
#include "model.h"
#include "sampling.h"
#include "session.h"

namespace luce {

struct MtpContext {
    static constexpr int ROWS = 64;  // rows one MTP forward runs (longer appends go in chunks)
    Backend &be;
    const Model &m;
    int cap = 0;    // positions the cache holds
    int n_ctx = 0;  // committed positions: their K/V come from the target's hidden states
    KvLayer kv;
    StepBuffers b;  // ROWS rows: tokens, pos, x, cur, mix, qg, q, k, v, attn, ff_gate, ff_up
    float *emb, *cat, *h_in, *h_norm, *out;  // [ROWS][E], [ROWS][2E], [ROWS][E] x 3
    float *h_last;   // [E]: the target's final-normed hidden at n_ctx - 1 (zeros before any)
    float *logits;   // [V]: the last draft row's logits
    int32_t *dev_id;
    std::vector<int32_t> host_ids;
    std::vector<float> logit_row;  // sampled drafts without a backend top-k: one logits row on the host
    Ranking ranking;
    MtpContext(const Model &m, int cap);
    ~MtpContext();
    MtpContext(const MtpContext &) = delete;
    MtpContext &operator=(const MtpContext &) = delete;

private:
    BackendBuffers dev_;
};

// Commits n positions n_ctx .. n_ctx+n-1: tokens [n] (host) are the tokens the target ran there,
// taps [n][tap_stride] (backend memory) the target's last-layer outputs there, before the output
// norm. Runs the block over them (K/V of those positions) and keeps the last hidden state.
void mtp_append(MtpContext &ctx, const int32_t *tokens, const float *taps, int64_t tap_stride, int n);

// Drafts k tokens after `anchor` (the token at position n_ctx, not yet committed) into tokens[k].
// Greedy: each the argmax of its row's logits (ties to the lowest id). Sampled (sampling != null,
// drafter.h ChainSampling): each drawn from the run's sampler over the row's logits (over the row's
// backend top-k where sampling->top_k has a k, as the block drafters do), and that distribution
// goes to sampling->q_out[i] for the rejection test.
void mtp_draft(MtpContext &ctx, int32_t anchor, int k, int32_t *tokens, const ChainSampling *sampling = nullptr);

}  // namespace luce
