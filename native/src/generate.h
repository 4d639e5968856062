// generate.h — evaluation of token sequences in a session and the plain decoding loop.
#pragma once

#include "luce.h"
#include "session.h"

namespace luce {

// Wall-clock seconds on a monotonic clock (step timings and stats).
double now_seconds();

// The length of the prefill chunk at c0 of n tokens whose logits are wanted from first_logit on:
// the session's prefill_step tokens, or fewer so that no chunk returns more than MAX_STEP logits rows.
int prefill_chunk(const Session &s, int c0, int n, int first_logit);

// Appends n tokens to the session in prefill chunks; writes the logits of the last n_logit_rows
// positions (host, row-major) when logits is not null. Validates ids and context first.
// capture (may be null) receives hidden states of every position: its `out` is the start of a
// host buffer [n][n_layers][E] for the whole call.
void session_eval(Session &s, const int32_t *tokens, int n, float *logits, int n_logit_rows,
                  const HiddenCapture *capture = nullptr);

// Refuses a bad request before any work: prompt, max_tokens vs the output buffer and the
// context, sampling parameters, stop ids (shared by plain and speculative decoding).
void check_generate_request(const Session &s, const int32_t *prompt, int n_prompt, const luce_generate_params &p,
                            const int32_t *out_tokens, int out_capacity);

// Prefill the prompt, then decode until max_tokens or an end-of-generation id.
luce_status generate(Session &s, const int32_t *prompt, int n_prompt, const luce_generate_params &p,
                     luce_token_callback callback, void *user_data, int32_t *out_tokens,
                     int out_capacity, luce_generate_stats *stats);

}  // namespace luce
