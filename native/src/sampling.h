// sampling.h — choosing the next token from a row of logits.
//
// Greedy (temperature 0): argmax, ties to the lowest id. Otherwise: keep the top_k largest logits
// (0 = all), weigh each exp((logit - top) * (1 / temperature)) (0 where that exponent is below
// -87: a weight under 1.6e-38 of the top's), keep the smallest prefix (by weight, descending)
// whose share of the weight reaches top_p (1 = all), draw one id with the session's RNG: u = uniform x
// the kept weights' sum, then the candidates are walked best first (in id order when nothing is
// truncated) until the running weight passes u. Ranks break ties by the lower id.
//
// RNG: xoshiro256** (Blackman & Vigna) seeded through splitmix64(seed); a uniform double in [0, 1)
// is (next() >> 11) * 2^-53. The same seed gives the same tokens on every platform.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace luce {

class Rng {
public:
    explicit Rng(uint64_t seed);
    uint64_t next();
    double uniform();  // [0, 1)

private:
    uint64_t s_[4];
};

struct SamplerParams {
    float temperature = 0.f;
    int top_k = 0;
    float top_p = 1.f;
};

// A row of scores ranked in the samplers' order: score descending, ties to the lower id (a strict
// total order, so the ranking is unique). By selection, not by sorting the row: each id gets a
// 64-bit key (larger ranks first), the m best are kept in a heap over one pass (for larger m, the
// ids at or above an estimate of the m-th score, or failing that every key, partially sorted),
// and only they are sorted. std::partial_sort of the ids over the
// whole vocabulary, which top-p needed, took ~37 ms a row for Qwen3.5's 248k tokens on this
// repository's 2-core host.
class Ranking {
public:
    // The row is read, not copied: it must outlive the calls below.
    void reset(const float *scores, int n);
    // The ids of the m best (m <= n), best first. A call with a larger m ranks again.
    const int32_t *best(int m);

private:
    uint64_t key(int i) const;  // id i's key: a larger key ranks first
    void keep_in_heap(int m);   // keys_ = the m best keys, by one pass with a heap
    bool keep_above_estimate(int m);

    const float *scores_ = nullptr;
    std::vector<uint64_t> keys_;
    std::vector<int32_t> ids_;
    std::vector<float> sample_;
    int n_ = 0, ranked_ = 0;
};

class Sampler {
public:
    Sampler(const SamplerParams &p, uint64_t seed, int n_vocab);
    // Samples from a host row of n_vocab logits (temperature > 0 only; greedy uses the backend argmax).
    int32_t sample(const float *logits);
    // The same draw from a row's k best, already ranked (best first, ties to the lower id) with
    // their logits, as Backend::topk_rows gives them: for top_k == k, sample() of the whole row.
    int32_t sample_ranked(const int32_t *ids, const float *values, int k);

private:
    int32_t sample_nucleus(const float *logits, float inv_t);

    SamplerParams p_;
    Rng rng_;
    Ranking ranking_;
    int n_vocab_;
    std::vector<float> probs_;      // scratch, sized once
    std::vector<float> weights_;
};

// The distribution Sampler draws from, as explicit probabilities over the vocabulary (zero outside
// the top-k / nucleus set), for rejection sampling against a drafter's q. The same candidates and
// ranking as Sampler; the weights are formed as exp((logit - top) * (1 / temperature)).
void target_probs(const float *logits, int n_vocab, const SamplerParams &p, Ranking &ranking, float *probs);

// The same distribution held where it has mass. Formed from a row's best candidates, already
// ranked with their logits (Backend::topk_rows; target_probs_ranked): probs[i] is ids[i]'s
// probability, best first, and nothing costs a pass over the vocabulary. Formed from a whole row
// (target_probs): ids is empty and probs[id] covers every id.
struct Distribution {
    std::vector<int32_t> ids;
    std::vector<float> probs;
    bool whole_row() const { return ids.empty(); }
    float at(int32_t id) const;  // over candidates: a scan of the (at most a few hundred) ids
};
void target_probs(const float *logits, int n_vocab, const SamplerParams &p, Ranking &ranking, Distribution &out);
// From the k best of a row, ranked (best first, ties to the lower id) with their logits; the
// sampler's own top-k, if smaller than k, applies.
void target_probs_ranked(const int32_t *ids, const float *values, int k, const SamplerParams &p, Distribution &out);
// One draw: candidates walked best first, a whole row in id order (u = uniform * sum, then the walk).
int32_t draw(const Distribution &d, Rng &rng);
// p <- max(p - q, 0), unnormalised: the residual rejection sampling draws from after a rejection
// (zero wherever p is). Returns its mass.
double subtract(Distribution &p, const Distribution &q);

// One draw from unnormalised weights w[0..n) in id order (u = uniform * sum, then the walk).
int32_t draw_weighted(const float *w, int n, Rng &rng);
// One draw among the candidates ids[0..k), walked in that order, with weights w[0..k) (by rank).
int32_t draw_weighted(const int32_t *ids, const float *w, int k, Rng &rng);

}  // namespace luce
