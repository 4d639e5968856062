// speculative.h — block-diffusion speculative decoding (speculative.cpp).
#pragma once

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

}  // namespace luce
