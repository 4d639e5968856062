// sampling.cpp — see sampling.h.
#include "sampling.h"

#include <algorithm>
#include <cmath>

namespace luce {

namespace {
uint64_t splitmix64(uint64_t &x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
    for (uint64_t &s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

Sampler::Sampler(const SamplerParams &p, uint64_t seed, int n_vocab)
    : p_(p), rng_(seed), ids_(size_t(n_vocab)), probs_(size_t(n_vocab)) {}

int32_t Sampler::sample(const float *logits) {
    const int n = int(ids_.size());
    for (int i = 0; i < n; ++i) ids_[size_t(i)] = i;
    // Descending by logit, ties to the lower id, so the candidate order is deterministic.
    auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    int k = (p_.top_k > 0 && p_.top_k < n) ? p_.top_k : n;
    const bool truncate = k < n || p_.top_p < 1.f;
    if (truncate) std::partial_sort(ids_.begin(), ids_.begin() + k, ids_.end(), better);
    // (Without truncation the order of candidates does not change the distribution: skip the sort.)

    // Softmax over the k candidates at temperature T (max subtracted for range).
    const float inv_t = 1.0f / p_.temperature;
    const float top = truncate ? logits[ids_[0]] : *std::max_element(logits, logits + n);
    double sum = 0.0;
    for (int i = 0; i < k; ++i) {
        probs_[size_t(i)] = std::exp((logits[ids_[size_t(i)]] - top) * inv_t);
        sum += probs_[size_t(i)];
    }
    // Nucleus: the smallest prefix whose probability mass reaches top_p.
    int keep = k;
    if (p_.top_p < 1.f) {
        double mass = 0.0;
        for (int i = 0; i < k; ++i) {
            mass += probs_[size_t(i)] / sum;
            if (mass >= double(p_.top_p)) {
                keep = i + 1;
                break;
            }
        }
    }
    double kept = 0.0;
    for (int i = 0; i < keep; ++i) kept += probs_[size_t(i)];
    double u = rng_.uniform() * kept;
    for (int i = 0; i < keep; ++i) {
        u -= probs_[size_t(i)];
        if (u < 0.0) return ids_[size_t(i)];
    }
    return ids_[size_t(keep - 1)];  // u landed on the rounding edge
}

}  // namespace luce
