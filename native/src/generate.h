// generate.h — evaluation of token sequences in a session and the plain decoding loop.
#pragma once

#include <vector>

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

// The top-k a sampled run ranks on the backend (Backend::topk_rows, where the logits are), so
// that only k candidates per row come back to the host sampler: p.top_k when 0 < top_k < V and
// top_k <= Backend::MAX_TOP_K, else 0 (the whole rows come back). Plain and speculative decoding.
int backend_top_k(const luce_generate_params &p, int64_t n_vocab);

// Each row's k best ranked where the logits are (Backend::topk_rows) and brought to the host in one
// copy: the call's ids [n_rows][k] and then its values [n_rows][k], adjacent in backend memory.
class TopKRows {
public:
    TopKRows(Backend &be, int max_rows, int k);  // k == 0: never fetched, nothing allocated
    void fetch(const float *rows, int n_rows, int64_t n_vocab);
    int k() const { return k_; }
    const int32_t *ids(int r) const { return reinterpret_cast<const int32_t *>(host_.data()) + size_t(r) * k_; }
    const float *values(int r) const {
        return reinterpret_cast<const float *>(host_.data() + size_t(n_rows_) * k_) + size_t(r) * k_;
    }

private:
    Backend &be_;
    BackendBuffers buffers_;
    int k_, n_rows_ = 0;
    uint32_t *dev_ = nullptr;      // ids, then values (4 bytes each)
    std::vector<uint32_t> host_;   // the same, as last fetched
};

// Prefill the prompt, then decode until max_tokens or an end-of-generation id.
luce_status generate(Session &s, const int32_t *prompt, int n_prompt, const luce_generate_params &p,
                     luce_token_callback callback, void *user_data, int32_t *out_tokens,
                     int out_capacity, luce_generate_stats *stats);

}  // namespace luce
