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
// rejected by one comparison with the heap's least); more, and the ids above an estimated score
// (Ranking::keep_above_estimate; every id when the estimate falls short) are partitioned. The
// estimate's sample: about SAMPLE_SIZE scores, its cut SAMPLE_MARGIN ranks past the expected one.
constexpr int HEAP_RANK_MAX = 512;
constexpr int SAMPLE_SIZE = 4096, SAMPLE_MARGIN = 32;

// How many candidates a nucleus search ranks first, and the factor it grows by while the mass is
// short: a trained model's top-p set is mostly a few dozen tokens.
constexpr int NUCLEUS_FIRST = 64, NUCLEUS_GROWTH = 4;

// The top-p cut over ranked candidates: adds weight(i) / sum to mass for i = from .. to-1 and
// returns i + 1 at the first i where the mass reaches top_p; 0 if it does not (or top_p is 1).
template <class Weight>
int reach_top_p(const Weight &weight, int from, int to, double sum, float top_p, double &mass) {
    if (top_p >= 1.f) return 0;
    for (int i = from; i < to; ++i) {
        mass += weight(i) / sum;
        if (mass >= double(top_p)) return i + 1;
    }
    return 0;
}

// sum of w[0..n) in four double lanes (i mod 4), added in a fixed order: a serial sum in double
// is one dependent add per id.
double weight_sum(const float *w, int n) {
    double lane[4] = {0.0, 0.0, 0.0, 0.0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; ++j) lane[j] += w[i + j];
    double tail = 0.0;
    for (; i < n; ++i) tail += w[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + tail;
}

// The sampler's weights: w[i] = exp((x[i] - top) * inv_t) for i < n, every x[i] <= top; returns
// their sum. The exponential is ours, not libm's, for two reasons: it rounds the same on every
// platform (plain IEEE operations in a fixed order, no FMA contraction in this file), and the
// compiler vectorises it, where a call to expf per id cost ~0.6 ms a row of Qwen's 248320 tokens.
// exp(a), a <= 0: a = k ln2 + r by Cody-Waite (ln2 split so that k * ln2_hi is exact), exp(r) by
// Cephes' degree-5 polynomial for expf, times 2^k built in the exponent bits; within 1 ulp of
// glibc's expf for every float in [-87, 0]. Below -87 (a weight under e^-87 ~ 1.6e-38 of the
// top's) the weight is 0. Comparisons are on the bits, as integers: a float compare may trap, so
// the compiler would not turn it into a select, and the loop would not vectorise.
double exp_weights(const float *x, int n, float top, float inv_t, float *w) {
    constexpr float ROUND = 12582912.0f;                       // 1.5 * 2^23: t + ROUND rounds t
    constexpr uint32_t ROUND_BITS = 0x4B400000u, FLOOR_BITS = 0xC2AE0000u;  // ROUND, -87.0f
    for (int i = 0; i < n; ++i) {
        float a = (x[i] - top) * inv_t;
        uint32_t a_bits;
        std::memcpy(&a_bits, &a, sizeof a_bits);
        a_bits |= 0x80000000u;  // +0 -> -0; a <= 0, so now a < b exactly when a's bits are larger
        const uint32_t keep = ~uint32_t(int32_t(FLOOR_BITS - a_bits) >> 31);  // all ones unless a < -87
        a_bits = (a_bits & keep) | (FLOOR_BITS & ~keep);
        std::memcpy(&a, &a_bits, sizeof a);
        const float shifted = a * 1.44269504088896341f + ROUND;
        const float k = shifted - ROUND;
        uint32_t k_bits;
        std::memcpy(&k_bits, &shifted, sizeof k_bits);
        const uint32_t scale_bits = (k_bits - ROUND_BITS + 127u) << 23;  // 2^k
        float scale;
        std::memcpy(&scale, &scale_bits, sizeof scale);
        const float r = (a - k * 0.693359375f) - k * -2.12194440e-4f;
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        const uint32_t unit_bits = keep & 0x3F800000u;  // 1.0f, or 0.0f below -87
        float unit;
        std::memcpy(&unit, &unit_bits, sizeof unit);
        w[i] = ((p * r) * r + r + 1.0f) * scale * unit;
    }
    return weight_sum(w, n);
}

// exp_weights of a whole row, its max as the top.
double row_weights(const float *logits, int n, float inv_t, float *w) {
    return exp_weights(logits, n, *std::max_element(logits, logits + n), inv_t, w);
}

// The sampler's weights of k candidates already ranked (best first) with their logits into w,
// zero past the nucleus (the smallest prefix whose share of the weight reaches top_p). Returns
// how many are kept; kept_sum is their weight.
int candidate_weights(const float *values, int k, const SamplerParams &p, float *w, double &kept_sum) {
    const double sum = exp_weights(values, k, values[0], 1.0f / p.temperature, w);
    double mass = 0.0;
    const int keep = reach_top_p([&](int i) { return w[i]; }, 0, k, sum, p.top_p, mass);
    if (!keep) {
        kept_sum = sum;
        return k;
    }
    std::fill(w + keep, w + k, 0.f);
    kept_sum = weight_sum(w, keep);
    return keep;
}

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
    if (m <= HEAP_RANK_MAX) {
        keep_in_heap(m);
    } else if (!keep_above_estimate(m)) {
        keys_.resize(size_t(n_));
        for (int i = 0; i < n_; ++i) keys_[size_t(i)] = key(i);
    }
    if (int(keys_.size()) > m) std::nth_element(keys_.begin(), keys_.begin() + m, keys_.end(), greater);
    keys_.resize(size_t(m));
    std::sort(keys_.begin(), keys_.end(), greater);
    ids_.resize(size_t(m));
    for (int i = 0; i < m; ++i) ids_[size_t(i)] = int32_t(~uint32_t(keys_[size_t(i)]));
    ranked_ = m;
    return ids_.data();
}

void Ranking::keep_in_heap(int m) {
    // A min-heap of the m best keys so far. Its least one's score rejects most ids with one float
    // comparison; only scores at or above it form a key.
    const auto greater = std::greater<uint64_t>();
    keys_.clear();
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
}

// keys_ = the keys of every id scoring at or above t, an estimate of the m-th best score from a
// strided sample of the row, aimed at about 2m ids; true when at least m qualify. Then the m best
// are among them: the m-th best scores at least t. (A heap of thousands costs a push per
// improvement, ~1.5 ms a broad 248k row at m = 4096; one pass and a partial sort of ~2m, ~0.3.)
bool Ranking::keep_above_estimate(int m) {
    const int stride = std::max(1, n_ / SAMPLE_SIZE);
    sample_.clear();
    for (int i = 0; i < n_; i += stride) sample_.push_back(scores_[i]);
    const int S = int(sample_.size());
    const int at = std::min(S - 1, int(2.0 * m * S / n_) + SAMPLE_MARGIN);
    std::nth_element(sample_.begin(), sample_.begin() + at, sample_.end(), std::greater<float>());
    const float t = sample_[size_t(at)];
    keys_.clear();
    for (int i = 0; i < n_; ++i)
        if (scores_[i] >= t) keys_.push_back(key(i));
    return int(keys_.size()) >= m;
}

namespace {

// The nucleus over a whole row whose weights w (by id) sum to sum: candidates are ranked a batch at
// a time until the prefix's mass reaches top_p. Returns its size (n when rounding keeps the mass
// short); ranking.best(size) then gives its ids without ranking again.
int nucleus(Ranking &ranking, int n, const float *w, double sum, float top_p) {
    double mass = 0.0;
    for (int ranked = 0, m = std::min(n, NUCLEUS_FIRST);; ranked = m, m = std::min(n, m * NUCLEUS_GROWTH)) {
        const int32_t *ids = ranking.best(m);
        if (const int keep = reach_top_p([&](int i) { return w[ids[i]]; }, ranked, m, sum, top_p, mass)) return keep;
        if (m == n) return n;
    }
}

}  // namespace

// ---- Sampler -------------------------------------------------------------------------------------

Sampler::Sampler(const SamplerParams &p, uint64_t seed, int n_vocab)
    : p_(p), rng_(seed), n_vocab_(n_vocab), probs_(size_t(n_vocab)), weights_(size_t(n_vocab)) {
}

int32_t Sampler::sample(const float *logits) {
    const int n = n_vocab_;
    const int k = (p_.top_k > 0 && p_.top_k < n) ? p_.top_k : n;
    // Softmax at temperature T over the candidates, max subtracted for range.
    const float inv_t = 1.0f / p_.temperature;
    if (k == n && p_.top_p < 1.f) return sample_nucleus(logits, inv_t);
    if (k == n) {  // nothing truncated: every id in id order (the order does not change the distribution)
        row_weights(logits, n, inv_t, probs_.data());
        return draw_weighted(probs_.data(), n, rng_);
    }
    ranking_.reset(logits, n);
    const int32_t *ids = ranking_.best(k);
    for (int i = 0; i < k; ++i) weights_[size_t(i)] = logits[ids[i]];
    return sample_ranked(ids, weights_.data(), k);
}

int32_t Sampler::sample_ranked(const int32_t *ids, const float *values, int k) {
    double kept_sum;
    const int keep = candidate_weights(values, k, p_, probs_.data(), kept_sum);
    return draw_weighted(ids, probs_.data(), keep, rng_);
}

// top-p over the whole vocabulary: the weights of every id (their sum, in id order, normalises the
// mass), then candidates ranked a batch at a time until the prefix reaches top_p.
int32_t Sampler::sample_nucleus(const float *logits, float inv_t) {
    const int n = n_vocab_;
    const double sum = row_weights(logits, n, inv_t, probs_.data());
    ranking_.reset(logits, n);
    const int keep = nucleus(ranking_, n, probs_.data(), sum, p_.top_p);
    const int32_t *ids = ranking_.best(keep);
    for (int i = 0; i < keep; ++i) weights_[size_t(i)] = probs_[size_t(ids[i])];
    return draw_weighted(ids, weights_.data(), keep, rng_);
}

// ---- explicit probabilities ------------------------------------------------------------------------

namespace {

// probs[ids[i]] /= their sum, i < keep (summed in rank order).
void renormalise(const int32_t *ids, int keep, float *probs) {
    double kept = 0.0;
    for (int i = 0; i < keep; ++i) kept += probs[ids[i]];
    for (int i = 0; i < keep; ++i) probs[ids[i]] = float(probs[ids[i]] / kept);
}

// candidate_weights normalised: w[i] the i-th candidate's probability. Returns how many are kept.
int candidate_probs(const float *values, int k, const SamplerParams &p, float *w) {
    double kept_sum;
    const int keep = candidate_weights(values, k, p, w, kept_sum);
    for (int i = 0; i < keep; ++i) w[i] = float(w[i] / kept_sum);
    return keep;
}

}  // namespace

void target_probs(const float *logits, int V, const SamplerParams &p, Ranking &ranking, float *probs) {
    if (p.top_k > 0 && p.top_k < V) {
        ranking.reset(logits, V);
        const int32_t *ids = ranking.best(p.top_k);
        std::fill(probs, probs + V, 0.f);
        thread_local std::vector<float> values, w;
        values.resize(size_t(p.top_k));
        w.resize(size_t(p.top_k));
        for (int i = 0; i < p.top_k; ++i) values[size_t(i)] = logits[ids[i]];
        const int keep = candidate_probs(values.data(), p.top_k, p, w.data());
        for (int i = 0; i < keep; ++i) probs[ids[i]] = w[size_t(i)];
        return;
    }
    const double sum = row_weights(logits, V, 1.0f / p.temperature, probs);
    if (p.top_p >= 1.f) {  // every id kept: no ranking needed
        const double inv_sum = 1.0 / sum;  // a multiply per id, not a division (the same float but ~2^-29 of the time)
        for (int i = 0; i < V; ++i) probs[i] = float(probs[i] * inv_sum);
        return;
    }
    ranking.reset(logits, V);
    const int keep = nucleus(ranking, V, probs, sum, p.top_p);
    const int32_t *ids = ranking.best(keep);
    // Every id ranked below the nucleus' last one drops out (ties: the higher ids); the kept
    // ones are renormalised.
    const int32_t last = ids[keep - 1];
    const float at = logits[last];
    for (int i = 0; i < V; ++i)
        if (logits[i] < at || (logits[i] == at && i > last)) probs[i] = 0.f;
    renormalise(ids, keep, probs);
}

// ---- Distribution ----------------------------------------------------------------------------------

float Distribution::at(int32_t id) const {
    if (whole_row()) return probs[size_t(id)];
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == id) return probs[i];
    return 0.f;
}

void target_probs(const float *logits, int V, const SamplerParams &p, Ranking &ranking, Distribution &out) {
    out.ids.clear();
    out.probs.resize(size_t(V));
    target_probs(logits, V, p, ranking, out.probs.data());
}

void target_probs_ranked(const int32_t *ids, const float *values, int k, const SamplerParams &p, Distribution &out) {
    if (p.top_k > 0) k = std::min(k, p.top_k);
    out.probs.resize(size_t(k));
    const int keep = candidate_probs(values, k, p, out.probs.data());
    out.probs.resize(size_t(keep));
    out.ids.assign(ids, ids + keep);
}

int32_t draw(const Distribution &d, Rng &rng) {
    if (d.whole_row()) return draw_weighted(d.probs.data(), int(d.probs.size()), rng);
    return draw_weighted(d.ids.data(), d.probs.data(), int(d.ids.size()), rng);
}

double subtract(Distribution &p, const Distribution &q) {
    if (!p.whole_row()) {  // the residual's support is p's: its candidates alone
        for (size_t i = 0; i < p.ids.size(); ++i) p.probs[i] = std::max(p.probs[i] - q.at(p.ids[i]), 0.f);
        return weight_sum(p.probs.data(), int(p.probs.size()));
    }
    if (q.whole_row()) {
        for (size_t v = 0; v < p.probs.size(); ++v) p.probs[v] = std::max(p.probs[v] - q.probs[v], 0.f);
    } else {
        for (size_t i = 0; i < q.ids.size(); ++i) {
            float &pv = p.probs[size_t(q.ids[i])];
            pv = std::max(pv - q.probs[i], 0.f);
        }
    }
    return weight_sum(p.probs.data(), int(p.probs.size()));
}

// ---- draws -------------------------------------------------------------------------------------------

namespace {

// The rounding edge of a walk (u never passed): the last id with weight, searched from the end.
int last_weighted(const float *w, int n) {
    int i = n - 1;
    while (i > 0 && !(w[i] > 0.f)) --i;
    return i;
}

}  // namespace

int32_t draw_weighted(const float *w, int V, Rng &rng) {
    double u = rng.uniform() * weight_sum(w, V);
    // The walk passes whole blocks that u outweighs in one step (their sum) and goes id by id only
    // in the block where u runs out: the same id as a walk id by id, short of rounding in the last
    // bits of u, and not one dependent add per id of the vocabulary.
    constexpr int BLOCK = 512;
    int i = 0;
    for (double b; i + BLOCK <= V && u - (b = weight_sum(w + i, BLOCK)) >= 0.0; i += BLOCK) u -= b;
    for (; i < V; ++i) {
        u -= w[i];
        if (u < 0.0 && w[i] > 0.f) return i;
    }
    return last_weighted(w, V);
}

int32_t draw_weighted(const int32_t *ids, const float *w, int k, Rng &rng) {
    double u = rng.uniform() * weight_sum(w, k);
    for (int i = 0; i < k; ++i) {
        u -= w[i];
        if (u < 0.0 && w[i] > 0.f) return ids[i];
    }
    return ids[last_weighted(w, k)];
}

}  // namespace luce
