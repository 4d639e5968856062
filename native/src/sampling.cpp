// sampling.cpp — see sampling.h.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

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

// ---- Ranking -------------------------------------------------------------------------------------

namespace {

// An unsigned key whose order is the float order: the sign bit flipped for positives, every bit for
// negatives. -0 is mapped to +0 first, as the float comparison has them equal (ties then go by id).
uint32_t order_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Up to this many, the best are kept in a heap during one pass over the row (most ids are
// rejected by one comparison with the heap's least); more, and every key is formed and
// partitioned.
constexpr int HEAP_RANK_MAX = 4096;

// How many candidates a nucleus search ranks first, and the factor it grows by while the mass is
// short: a trained model's top-p set is mostly a few dozen tokens.
constexpr int NUCLEUS_FIRST = 64, NUCLEUS_GROWTH = 8;

}  // namespace

void Ranking::reset(const float *scores, int n) {
    scores_ = scores;
    n_ = n;
    ranked_ = 0;
}

uint64_t Ranking::key(int i) const {
    // Among equal scores the lower id ranks first: its low word, ~id, is larger.
    return (uint64_t(order_bits(scores_[i])) << 32) | uint32_t(~uint32_t(i));
}

const int32_t *Ranking::best(int m) {
    m = std::min(m, n_);
    if (m <= ranked_) return ids_.data();
    const auto greater = std::greater<uint64_t>();
    keys_.clear();
    if (m <= HEAP_RANK_MAX) {
        // A min-heap of the m best keys so far. Its least one's score rejects most ids with one
        // float comparison; only scores at or above it form a key.
        for (int i = 0; i < m; ++i) keys_.push_back(key(i));
        std::make_heap(keys_.begin(), keys_.end(), greater);
        uint64_t least = keys_.front();
        float least_score = scores_[~uint32_t(least)];
        for (int i = m; i < n_; ++i) {
            if (scores_[i] < least_score) continue;
            const uint64_t k = key(i);
            if (k <= least) continue;
            std::pop_heap(keys_.begin(), keys_.end(), greater);
            keys_.back() = k;
            std::push_heap(keys_.begin(), keys_.end(), greater);
            least = keys_.front();
            least_score = scores_[~uint32_t(least)];
        }
    } else {
        keys_.resize(size_t(n_));
        for (int i = 0; i < n_; ++i) keys_[size_t(i)] = key(i);
        if (m < n_) std::nth_element(keys_.begin(), keys_.begin() + m, keys_.end(), greater);
        keys_.resize(size_t(m));
    }
    std::sort(keys_.begin(), keys_.end(), greater);
    ids_.resize(size_t(m));
    for (int i = 0; i < m; ++i) ids_[size_t(i)] = int32_t(~uint32_t(keys_[size_t(i)]));
    ranked_ = m;
    return ids_.data();
}

// ---- Sampler -------------------------------------------------------------------------------------

Sampler::Sampler(const SamplerParams &p, uint64_t seed, int n_vocab)
    : p_(p), rng_(seed), all_ids_(size_t(n_vocab)), probs_(size_t(n_vocab)), weights_(size_t(n_vocab)) {
    std::iota(all_ids_.begin(), all_ids_.end(), 0);
}

int32_t Sampler::sample(const float *logits) {
    const int n = int(all_ids_.size());
    const int k = (p_.top_k > 0 && p_.top_k < n) ? p_.top_k : n;
    // Softmax at temperature T over the candidates, max subtracted for range.
    const float inv_t = 1.0f / p_.temperature;
    if (k == n && p_.top_p < 1.f) return sample_nucleus(logits, inv_t);
    if (k == n) {  // nothing truncated: every id in id order (the order does not change the distribution)
        const float top = *std::max_element(logits, logits + n);
        for (int i = 0; i < n; ++i) probs_[size_t(i)] = std::exp((logits[i] - top) * inv_t);
        return draw(all_ids_.data(), probs_.data(), n);
    }
    ranking_.reset(logits, n);
    const int32_t *ids = ranking_.best(k);
    for (int i = 0; i < k; ++i) weights_[size_t(i)] = logits[ids[i]];
    return sample_ranked(ids, weights_.data(), k);
}

int32_t Sampler::sample_ranked(const int32_t *ids, const float *values, int k) {
    const float inv_t = 1.0f / p_.temperature;
    const float top = values[0];
    double sum = 0.0;
    for (int i = 0; i < k; ++i) {
        probs_[size_t(i)] = std::exp((values[i] - top) * inv_t);
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
    return draw(ids, probs_.data(), keep);
}

// top-p over the whole vocabulary: the weights of every id (their sum, in id order, normalises the
// mass), then candidates ranked a batch at a time until the prefix reaches top_p.
int32_t Sampler::sample_nucleus(const float *logits, float inv_t) {
    const int n = int(all_ids_.size());
    const float top = *std::max_element(logits, logits + n);
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += (probs_[size_t(i)] = std::exp((logits[i] - top) * inv_t));
    ranking_.reset(logits, n);
    const int32_t *ids = nullptr;
    double mass = 0.0;
    int keep = 0;
    for (int ranked = 0, m = std::min(n, NUCLEUS_FIRST); keep == 0; m = std::min(n, m * NUCLEUS_GROWTH)) {
        ids = ranking_.best(m);
        for (; ranked < m && keep == 0; ++ranked) {
            weights_[size_t(ranked)] = probs_[size_t(ids[ranked])];
            mass += weights_[size_t(ranked)] / sum;
            if (mass >= double(p_.top_p)) keep = ranked + 1;
        }
        if (keep == 0 && m == n) keep = n;  // the mass fell short of top_p by rounding: everything
    }
    return draw(ids, weights_.data(), keep);
}

int32_t Sampler::draw(const int32_t *ids, const float *w, int keep) {
    double kept = 0.0;
    for (int i = 0; i < keep; ++i) kept += w[i];
    double u = rng_.uniform() * kept;
    for (int i = 0; i < keep; ++i) {
        u -= w[i];
        if (u < 0.0) return ids[i];
    }
    return ids[keep - 1];  // u landed on the rounding edge
}

// ---- explicit probabilities ------------------------------------------------------------------------

namespace {

// target_probs over k candidates already ranked (best first), value(i) the logit of ids[i]:
// everything else is zero.
template <class Value>
void ranked_probs(const int32_t *ids, const Value &value, int k, int V, const SamplerParams &p, float *probs) {
    std::fill(probs, probs + V, 0.f);
    const float top = value(0);
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += (probs[ids[i]] = std::exp((value(i) - top) / p.temperature));
    int keep = k;
    double mass = 0.0, kept = 0.0;
    for (int i = 0; i < k; ++i) {
        mass += probs[ids[i]] / sum;
        kept += probs[ids[i]];
        if (p.top_p < 1.f && mass >= double(p.top_p)) {
            keep = i + 1;
            break;
        }
    }
    for (int i = keep; i < k; ++i) probs[ids[i]] = 0.f;
    for (int i = 0; i < keep; ++i) probs[ids[i]] = float(probs[ids[i]] / kept);
}

}  // namespace

void target_probs(const float *logits, int V, const SamplerParams &p, Ranking &ranking, float *probs) {
    if (p.top_k > 0 && p.top_k < V) {
        ranking.reset(logits, V);
        const int32_t *ids = ranking.best(p.top_k);
        return ranked_probs(ids, [&](int i) { return logits[ids[i]]; }, p.top_k, V, p, probs);
    }
    const float top = *std::max_element(logits, logits + V);
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += (probs[i] = std::exp((logits[i] - top) / p.temperature));
    if (p.top_p >= 1.f) {  // every id kept: no ranking needed
        for (int i = 0; i < V; ++i) probs[i] = float(probs[i] / sum);
        return;
    }
    // The nucleus, its candidates ranked a batch at a time.
    ranking.reset(logits, V);
    const int32_t *ids = nullptr;
    int keep = 0;
    double mass = 0.0, kept = 0.0;
    for (int ranked = 0, m = std::min(V, NUCLEUS_FIRST); keep == 0; m = std::min(V, m * NUCLEUS_GROWTH)) {
        ids = ranking.best(m);
        for (; ranked < m && keep == 0; ++ranked) {
            mass += probs[ids[ranked]] / sum;
            kept += probs[ids[ranked]];
            if (mass >= double(p.top_p)) keep = ranked + 1;
        }
        if (keep == 0 && m == V) keep = V;
    }
    // Every id ranked below the nucleus' last one drops out (ties: the higher ids); the kept
    // ones are renormalised.
    const int32_t last = ids[keep - 1];
    const float at = logits[last];
    for (int i = 0; i < V; ++i)
        if (logits[i] < at || (logits[i] == at && i > last)) probs[i] = 0.f;
    for (int i = 0; i < keep; ++i) probs[ids[i]] = float(probs[ids[i]] / kept);
}

void target_probs_ranked(const int32_t *ids, const float *values, int k, int V, const SamplerParams &p,
                         float *probs) {
    ranked_probs(ids, [&](int i) { return values[i]; }, k, V, p, probs);
}

int32_t draw_weighted(const float *w, int V, Rng &rng) {
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += w[i];
    double u = rng.uniform() * sum;
    int32_t last = 0;
    for (int i = 0; i < V; ++i) {
        if (w[i] <= 0.f) continue;
        last = i;
        u -= w[i];
        if (u < 0.0) return i;
    }
    return last;
}

}  // namespace luce
