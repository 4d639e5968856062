// api_sampling.cpp — C ABI hooks over the host sampler (luce_sample, luce_sample_probs), so the
// sampling rules (sampling.h) can be pinned against an independent numpy implementation on
// crafted rows (ties, signed zeros, flat and peaked distributions) and used by callers that run
// their own loop. Every argument is checked before a logit is read.
#include <cmath>
#include <cstdint>

#include "errors.h"
#include "luce.h"
#include "sampling.h"

#define LUCE_API extern "C" __attribute__((visibility("default")))

namespace {

luce::SamplerParams checked_params(const float *logits, int32_t n, float temperature, int32_t top_k, float top_p) {
    if (logits == nullptr) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "null logits");
    if (n < 1) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "n must be positive, got %d", int(n));
    if (!(temperature > 0.f) || !std::isfinite(temperature))
        luce::fail(LUCE_ERR_INVALID_ARGUMENT, "temperature must be > 0, got %g", double(temperature));
    if (top_k < 0) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "top_k must be >= 0, got %d", int(top_k));
    if (!(top_p > 0.f && top_p <= 1.f)) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1], got %g", double(top_p));
    return {temperature, top_k, top_p};
}

}  // namespace

LUCE_API luce_status luce_sample(const float *logits, int32_t n, float temperature, int32_t top_k, float top_p,
                                 uint64_t seed, int32_t *out) {
    return luce::guard([&] {
        const luce::SamplerParams p = checked_params(logits, n, temperature, top_k, top_p);
        if (out == nullptr) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "null output");
        luce::Sampler sampler(p, seed, n);
        *out = sampler.sample(logits);
    });
}

LUCE_API luce_status luce_sample_probs(const float *logits, int32_t n, float temperature, int32_t top_k, float top_p,
                                       float *probs) {
    return luce::guard([&] {
        const luce::SamplerParams p = checked_params(logits, n, temperature, top_k, top_p);
        if (probs == nullptr) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "null output");
        luce::Ranking ranking;
        luce::target_probs(logits, n, p, ranking, probs);
    });
}
