// speculative.h — block-diffusion speculative decoding (speculative.cpp).
#pragma once

#include <memory>
#include <vector>

#include "drafter.h"
#include "luce.h"
#include "session.h"

namespace luce {

// Prefill the prompt (capturing the drafter's target features), then draft/verify until
// max_tokens or an end-of-generation id. Greedy output equals generate()'s token for token;
// sampled output has the target's distribution. Same contract as generate() otherwise.
luce_status generate_speculative(Session &s, Drafter &d, const int32_t *prompt, int n_prompt,
                                 const luce_generate_params &p, luce_token_callback callback, void *user_data,
                                 int32_t *out_tokens, int out_capacity, luce_generate_stats *stats);

// Refuses speculative settings this target, drafter and backend cannot run, before any work.
void check_speculative_request(const Session &s, const Drafter &d, const luce_generate_params &p);

struct SpecLoop;

// Rollback history rows the sequences of a batch share, enough for one verify forward: per main
// layer, DeltaNet states [rows][HV*DK*DV] and raw qkv rows [rows][CD] (null for attention layers).
// A sequence's verify only needs them until its end of step, so one forward's worth serves every
// sequence of the batch instead of a block's worth for each.
struct CheckpointRows {
    std::vector<float *> ssm, qkv;
};

// One sequence's speculative decoding in steps its caller drives: generate_speculative's loop, cut
// at the target's verify forward so that a batch (batch.cpp) runs one forward over the blocks of
// many sequences. Chain steps only (no DDTree). Every call works on the session's current state:
// the batch swaps the sequence's KV layers, DeltaNet state and n_past in around each one.
class SpecSequence {
public:
    // batch_taps: the batch's taps buffer [s.prefill_step][n_taps][E] (backend memory), which the
    // prompt's prefill writes (the batch prefills one sequence at a time).
    SpecSequence(Session &s, Drafter &d, int n_prompt, const luce_generate_params &p, int32_t *out_tokens,
                 float *batch_taps);
    ~SpecSequence();
    SpecSequence(const SpecSequence &) = delete;
    SpecSequence &operator=(const SpecSequence &) = delete;

    // Prefills the prompt (features for the drafter captured) and emits the first token; false
    // when the sequence has already finished.
    bool start(const int32_t *prompt, int n_prompt);
    // Drafts the next step; returns its rows for the target, step_tokens() [rows]: the anchor,
    // then the proposals.
    int begin_step();
    const int32_t *step_tokens() const;
    // Before the verify forward: a chain's rollback checkpoints, rows [row0, row0 + rows) of the
    // shared history, attached to the session's DeltaNet state.
    void attach_checkpoints(const CheckpointRows &shared, int row0);
    // After the target ran those rows (n_past advanced past them): their logits [rows][V] and
    // taps [rows][n_taps][E] in backend memory, and for a greedy sequence optionally their argmax
    // ids on the host (a batch reduces all its rows at once). Accepts, rolls back, commits; false
    // when finished.
    bool end_step(const float *rows, const float *taps, const int32_t *greedy_ids = nullptr);
    bool greedy() const;
    // The sequence's stats (tau, acceptance and the policy's measurements included), at its end.
    const luce_generate_stats &finish();

private:
    std::unique_ptr<SpecLoop> loop_;
    int32_t anchor_ = -1;
    double decode_start_ = 0;
};

}  // namespace luce
