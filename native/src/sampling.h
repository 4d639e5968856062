// sampling.h — choosing the next token from a row of logits.
//
// Greedy (temperature 0): argmax, ties to the lowest id. Otherwise: logits / temperature, keep the
// top_k largest (0 = all), softmax, keep the smallest prefix (by probability, descending) whose
// mass reaches top_p (1 = all), renormalise, draw one id with the session's RNG.
//
// RNG: xoshiro256** (Blackman & Vigna) seeded through splitmix64(seed); a uniform double in [0, 1)
// is (next() >> 11) * 2^-53. The same seed gives the same tokens on every platform.
#pragma once

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

class Sampler {
public:
    Sampler(const SamplerParams &p, uint64_t seed, int n_vocab);
    // Samples from a host row of n_vocab logits (temperature > 0 only; greedy uses the backend argmax).
    int32_t sample(const float *logits);

private:
    SamplerParams p_;
    Rng rng_;
    std::vector<int32_t> ids_;   // scratch, sized once
    std::vector<float> probs_;
};

}  // namespace luce
