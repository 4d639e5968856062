// generate.cpp — prefill in chunks, then one token per step (plain decoding).
//
// Timing: prefill_seconds covers the prompt's forward steps and choosing the first token;
// decode_seconds covers the remaining n_generated - 1 steps. An end-of-generation id stops the
// loop and is not part of the output (nor passed to the callback).
#include "generate.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "errors.h"
#include "sampling.h"

namespace luce {

double now_seconds() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

namespace {

void check_tokens(const Session &s, const int32_t *tokens, int n) {
    const int n_vocab = s.model->hp.n_vocab;
    for (int i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            fail(LUCE_ERR_INVALID_ARGUMENT, "token id %d at position %d is out of range (vocabulary has %d tokens)",
                 tokens[i], i, n_vocab);
}

}  // namespace

int prefill_chunk(const Session &s, int c0, int n, int first_logit) {
    return std::min({n, c0 + s.prefill_step, std::max(first_logit, c0) + MAX_STEP}) - c0;
}

void session_eval(Session &s, const int32_t *tokens, int n, float *logits, int n_logit_rows,
                  const HiddenCapture *capture) {
    if (n < 0 || (n > 0 && !tokens)) fail(LUCE_ERR_INVALID_ARGUMENT, "no tokens to evaluate");
    if (n_logit_rows < 0 || n_logit_rows > n)
        fail(LUCE_ERR_INVALID_ARGUMENT, "n_logit_rows = %d must be in 0..%d", n_logit_rows, n);
    if (n_logit_rows > 0 && !logits) fail(LUCE_ERR_INVALID_ARGUMENT, "logits buffer is NULL");
    check_tokens(s, tokens, n);
    if (int64_t(s.n_past) + n > s.n_ctx)
        fail(LUCE_ERR_CONTEXT_FULL, "%d tokens do not fit the context: %d of %d positions are used",
             n, s.n_past, s.n_ctx);
    const Hparams &hp = s.model->hp;
    if (capture) {
        if (capture->n_layers < 1 || !capture->layer_ids || !capture->out)
            fail(LUCE_ERR_INVALID_ARGUMENT, "hidden capture needs layer ids and an output buffer");
        for (int i = 0; i < capture->n_layers; ++i) {
            const int id = capture->layer_ids[i];
            if (id < 0 || id >= hp.n_layer || (i > 0 && id <= capture->layer_ids[i - 1]))
                fail(LUCE_ERR_INVALID_ARGUMENT,
                     "capture layer ids must increase strictly within 0..%d (got %d at %d)",
                     hp.n_layer - 1, id, i);
        }
    }
    const int first_logit = n - n_logit_rows;  // global index of the first row wanted
    const int64_t V = hp.n_vocab;
    const PrefillScope prefill(*s.model->backend);
    for (int c0 = 0, T = 0; c0 < n; c0 += T) {
        T = prefill_chunk(s, c0, n, first_logit);
        const int row0 = std::max(0, first_logit - c0);
        float *dst = (row0 < T && logits) ? logits + int64_t(c0 + row0 - first_logit) * V : nullptr;
        HiddenCapture chunk_capture;
        if (capture) {
            chunk_capture = *capture;
            chunk_capture.out = capture->out + int64_t(c0) * capture->n_layers * hp.n_embd;
        }
        forward_step(s, tokens + c0, T, dst, row0, capture ? &chunk_capture : nullptr);
    }
}

void check_generate_request(const Session &s, const int32_t *prompt, int n_prompt, const luce_generate_params &p,
                            const int32_t *out_tokens, int out_capacity) {
    if (n_prompt < 1 || !prompt) fail(LUCE_ERR_INVALID_ARGUMENT, "the prompt is empty");
    if (p.max_tokens < 0) fail(LUCE_ERR_INVALID_ARGUMENT, "max_tokens must be >= 0");
    if (!out_tokens || out_capacity < p.max_tokens)
        fail(LUCE_ERR_INVALID_ARGUMENT, "output buffer holds %d tokens, max_tokens is %d", out_capacity,
             p.max_tokens);
    if (!(p.temperature >= 0.f)) fail(LUCE_ERR_INVALID_ARGUMENT, "temperature must be >= 0");
    if (p.top_k < 0) fail(LUCE_ERR_INVALID_ARGUMENT, "top_k must be >= 0");
    if (!(p.top_p > 0.f && p.top_p <= 1.f)) fail(LUCE_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1]");
    if (p.n_stop_ids < 0 || (p.n_stop_ids > 0 && !p.stop_ids))
        fail(LUCE_ERR_INVALID_ARGUMENT, "bad stop id list");
    check_tokens(s, prompt, n_prompt);
    if (int64_t(s.n_past) + n_prompt + p.max_tokens > s.n_ctx)
        fail(LUCE_ERR_CONTEXT_FULL,
             "prompt (%d tokens) + max_tokens (%d) exceed the context size %d (%d already used)",
             n_prompt, p.max_tokens, s.n_ctx, s.n_past);
}

TopKRows::TopKRows(Backend &be, int max_rows, int k) : be_(be), buffers_(be), k_(k) {
    if (k == 0) return;
    dev_ = buffers_.array<uint32_t>(2 * size_t(max_rows) * k);
    host_.resize(2 * size_t(max_rows) * k);
}

void TopKRows::fetch(const float *rows, int n_rows, int64_t n_vocab) {
    n_rows_ = n_rows;
    const size_t n = size_t(n_rows) * k_;
    be_.topk_rows(rows, n_rows, n_vocab, k_, reinterpret_cast<int32_t *>(dev_), reinterpret_cast<float *>(dev_ + n));
    be_.download(host_.data(), dev_, 2 * n * sizeof(uint32_t));
}

int backend_top_k(const luce_generate_params &p, int64_t n_vocab) {
    const bool ranked = p.temperature > 0.f && p.top_k > 0 && p.top_k < n_vocab && p.top_k <= Backend::MAX_TOP_K;
    return ranked ? p.top_k : 0;
}

luce_status generate(Session &s, const int32_t *prompt, int n_prompt, const luce_generate_params &p,
                     luce_token_callback callback, void *user_data, int32_t *out_tokens,
                     int out_capacity, luce_generate_stats *stats) {
    check_generate_request(s, prompt, n_prompt, p, out_tokens, out_capacity);
    const int64_t V = s.model->hp.n_vocab;
    Backend &be = *s.model->backend;
    std::vector<float> logits(static_cast<size_t>(V));  // one host row, reused every step
    Sampler sampler(SamplerParams{p.temperature, p.top_k, p.top_p}, p.seed, int(V));
    auto choose = [&]() -> int32_t {
        return p.temperature == 0.f ? be.argmax(logits.data(), V) : sampler.sample(logits.data());
    };
    // With a backend top-k only the k candidates come back each step: 8 bytes each instead of
    // the whole row (1 MB for a 248k vocabulary, a host copy per token on a GPU); the sampler
    // draws from them exactly as from the row.
    TopKRows top_k(be, 1, backend_top_k(p, V));
    // One decode step of a sampled run whose top-k the backend ranks.
    auto step_top_k = [&](int32_t token) -> int32_t {
        top_k.fetch(forward_step_rows(s, &token, 1, 0, nullptr), 1, V);
        return sampler.sample_ranked(top_k.ids(0), top_k.values(0), top_k.k());
    };
    auto is_stop = [&](int32_t id) {
        return !p.ignore_eos && std::find(p.stop_ids, p.stop_ids + p.n_stop_ids, id) != p.stop_ids + p.n_stop_ids;
    };

    luce_generate_stats st{};
    st.n_prompt = n_prompt;
    double t0 = now_seconds();
    luce_status status = LUCE_OK;
    int32_t next = -1;
    if (p.max_tokens > 0) {
        session_eval(s, prompt, n_prompt, logits.data(), 1);
        next = choose();
    } else {
        session_eval(s, prompt, n_prompt, nullptr, 0);
    }
    double t1 = now_seconds();
    st.prefill_seconds = t1 - t0;

    while (st.n_generated < p.max_tokens) {
        if (is_stop(next)) {
            st.stopped_by_eos = 1;
            break;
        }
        out_tokens[st.n_generated++] = next;
        if (callback && callback(user_data, &next, 1) != 0) {
            status = LUCE_ERR_CANCELLED;
            break;
        }
        if (st.n_generated == p.max_tokens) break;
        if (p.temperature == 0.f) {
            next = forward_step_greedy(s, next);
            continue;
        }
        if (top_k.k()) {
            next = step_top_k(next);
            continue;
        }
        forward_step(s, &next, 1, logits.data(), 0, nullptr);
        next = choose();
    }
    st.decode_seconds = now_seconds() - t1;
    if (stats) *stats = st;
    if (status == LUCE_ERR_CANCELLED) set_last_error("generation stopped by the token callback");
    return status;
}

}  // namespace luce
