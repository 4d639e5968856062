// spec_policy.cpp — the cost-aware speculate-or-plain choice (rules in spec_policy.h).
#include "spec_policy.h"

#include <algorithm>
#include <cmath>

namespace luce {

void SpecPolicy::Decayed::add(double x, double alpha) {
    ++n;
    value += std::max(alpha, 1.0 / n) * (x - value);
}

bool SpecPolicy::speculate_next() const {
    if (!adaptive_) return true;
    if (plain_.n < CAL_PLAIN) return false;
    if (spec_.n < CAL_SPEC) return true;
    if (speculating_) return spec_run_ < PLAIN_CHECK_EVERY;  // else a plain step re-measures its cost
    return plain_left_ == 0;                                 // plain wins: only probes speculate
}

void SpecPolicy::after_plain(double seconds) {
    const bool check = calibrated() && speculating_;  // a rare sample of an old estimate: weigh it
    plain_.add(seconds, check ? PROBE_ALPHA : TIME_ALPHA);
    spec_run_ = 0;
    if (plain_left_ > 0) --plain_left_;
}

void SpecPolicy::after_spec(int committed, double seconds) {
    const bool probe = calibrated() && !speculating_;
    spec_.add(seconds, TIME_ALPHA);
    tokens_.add(committed, probe ? PROBE_ALPHA : TOKENS_ALPHA);
    ++spec_run_;
    if (!adaptive_ || !calibrated()) return;
    const double g = gain();
    if (speculating_ && g < 1.0) speculating_ = false;
    else if (!speculating_ && g > 1.0 + HYSTERESIS) speculating_ = true;
    plain_left_ = speculating_ ? 0 : probe_interval();
}

// A probe loses (spec - tokens x plain) seconds against plain steps; N plain steps take
// N x plain. Keep the loss within PROBE_BUDGET of that: N >= (ratio - tokens) / PROBE_BUDGET.
int SpecPolicy::probe_interval() const {
    const double loss = std::max(ratio() - tokens_.value, 0.0);
    const double n = std::ceil(loss / PROBE_BUDGET);
    return int(std::clamp(n, double(MIN_PROBE_INTERVAL), double(MAX_PROBE_INTERVAL)));
}

}  // namespace luce
