// spec_policy.cpp — the cost-aware speculate-or-plain and block-width choice (rules in spec_policy.h).
#include "spec_policy.h"

#include <algorithm>
#include <cmath>

namespace luce {

void SpecPolicy::Decayed::add(double x, double alpha) {
    ++n;
    value += std::max(alpha, 1.0 / n) * (x - value);
}


SpecPolicy::SpecPolicy(bool adaptive, int min_width, int max_width, int start_width, bool anchor_slot)
    : adaptive_(adaptive), anchor_slot_(anchor_slot), min_w_(min_width), max_w_(std::max(min_width, max_width)),
      width_(std::clamp(start_width, min_w_, max_w_)), explore_(width_), cost_(size_t(max_w_) + 1),
      accept_(size_t(std::max(proposals(max_w_), 1))) {}

void SpecPolicy::seed(double plain_seconds, const double *width_seconds, int n_widths, const double *acceptance,
                      int n_acceptance) {
    if (!(plain_seconds > 0) || !width_seconds) return;
    bool any = false;
    for (int w = 2; w < n_widths && w <= max_w_; ++w)
        if (width_seconds[w] > 0) cost_[size_t(w)] = {width_seconds[w], 1}, any = true;
    if (!any) return;
    // Kept as multiples of the plain step until this run has measured its own (after_plain).
    for (Decayed &c : cost_) c.value /= plain_seconds;
    for (int i = 0; acceptance && i < n_acceptance && i < int(accept_.size()); ++i)
        if (acceptance[i] >= 0 && acceptance[i] <= 1) accept_[size_t(i)] = {acceptance[i], 1};
    seeded_ = true;
}

bool SpecPolicy::calibrated() const {
    return plain_.n > 0 && (seeded_ || spec_measured_ >= CAL_SPEC);
}

int SpecPolicy::next_width() const {
    if (!adaptive_) return width_;
    if (plain_.n == 0 || burst_n_ > 0) return 0;  // the calibration's plain steps, or a check's
    if (!calibrated()) return width_;
    if (speculating_) {
        if (spec_run_ >= check_every_) return 0;  // a check re-measures the plain cost
        const bool explore = explore_ != width_ && spec_run_ % EXPLORE_EVERY == EXPLORE_EVERY - 1;
        return explore ? explore_ : width_;
    }
    if (plain_left_ > 0) return 0;  // plain wins: only probes speculate
    return explore_ != width_ && probes_ % EXPLORE_EVERY == EXPLORE_EVERY - 1 ? explore_ : width_;
}

void SpecPolicy::after_plain(double seconds) {
    if (plain_left_ > 0) --plain_left_;
    // While plain decoding wins, every plain step is a sample. Otherwise plain steps come in
    // bursts (calibration, checks), and a burst's median is one sample: the first steps after
    // prefill run cold, and on a shared machine one step may stall, and a plain cost set too
    // high by one stalled step would keep speculation on until the next check.
    if (plain_.n > 0 && !(calibrated() && speculating_) && burst_n_ == 0) {
        plain_.add(seconds, TIME_ALPHA);
        return;
    }
    burst_[size_t(burst_n_++)] = seconds;
    if (burst_n_ < CAL_PLAIN) return;
    std::sort(burst_.begin(), burst_.end());
    const bool first = plain_.n == 0;
    plain_.add(burst_[CAL_PLAIN / 2], PROBE_ALPHA);  // a check weighs 0.5: the estimate before it is old
    burst_n_ = 0;
    spec_run_ = 0;
    if (!first) check_every_ = std::min(2 * check_every_, PLAIN_CHECK_EVERY);  // one that held: the next later
    if (first && seeded_) {
        // The cached costs in this run's terms: a busy or idle machine scales both steps alike,
        // so the cached ratio to the plain step is what carries over, not the seconds.
        for (Decayed &c : cost_) c.value *= plain_.value;
    }
    decide();
}

void SpecPolicy::after_spec(int proposals, int accepted, double seconds) {
    const bool probe = calibrated() && !speculating_;
    const double alpha = probe ? PROBE_ALPHA : ACCEPT_ALPHA;
    probes_ += probe;
    const int w = anchor_slot_ ? proposals : proposals + 1;
    if (w >= 1 && w <= max_w_) cost_[size_t(w)].add(seconds, TIME_ALPHA);
    // Proposals 1..accepted were accepted, given those before them; the next one was rejected.
    // Those after it say nothing about their own rate.
    for (int i = 0; i < accepted && i < int(accept_.size()); ++i) accept_[size_t(i)].add(1.0, alpha);
    if (accepted < proposals && accepted < int(accept_.size())) accept_[size_t(accepted)].add(0.0, alpha);
    ++spec_measured_;
    ++spec_run_;
    decide();
}

// Choose the widths, and plain or speculative by the hysteresis rule; plan the next probe.
// Speculation and probes run at the best width whose cost was measured; the best width by the
// model, which may be an interpolated one, is only explored (every EXPLORE_EVERY-th spec step or
// probe). The
// maximum of many estimates is biased upwards (the width whose noise flattered it most wins),
// so a modelled gain must be measured before a run commits to it.
void SpecPolicy::decide() {
    if (!calibrated()) return;
    explore_ = best_width(false);
    const int exploit = best_width(true);
    if (!adaptive_) {
        width_ = exploit ? exploit : explore_;
        return;
    }
    const double g = exploit ? gain(exploit) : 0.0;
    if (speculating_ && g < 1.0) speculating_ = false;
    else if (!speculating_ && g > 1.0 + HYSTERESIS) speculating_ = true, check_every_ = FIRST_CHECK_AFTER;
    width_ = exploit ? exploit : explore_;
    plain_left_ = speculating_ ? 0 : probe_interval();
}

// The width with the most expected tokens per second (ties: the narrower), among those measured
// or all; 0 when none qualifies.
int SpecPolicy::best_width(bool measured_only) const {
    int best = 0;
    double best_gain = 0;
    for (int w = min_w_; w <= max_w_; ++w) {
        if (measured_only && measured_seconds(w) <= 0) continue;
        const double g = gain(w);
        if (g > best_gain * (1 + 1e-9)) best = w, best_gain = g;
    }
    return best ? best : (measured_only ? 0 : width_);
}

double SpecPolicy::measured_seconds(int w) const {
    return w >= 1 && w <= max_w_ && cost_[size_t(w)].n ? cost_[size_t(w)].value : 0.0;
}

// Measured where a step of w rows ran; between two measured widths, on the line through them; past
// the widest, along the slope of the last two (never falling). A plain step counts as width 1: one
// verify row, no drafter. The cost of a block grows with its rows (drafter rows, verify rows, the
// rollback's checkpoints), about linearly over the few rows drafts have.
double SpecPolicy::step_seconds(int w) const {
    if (w < 1 || w > max_w_) return 0.0;
    if (const double m = measured_seconds(w); m > 0) return m;
    int lo = 0, lo2 = 0, hi = 0;  // measured widths: the two below w, the one above
    auto cost = [&](int x) { return x == 1 ? plain_.value : cost_[size_t(x)].value; };
    auto known = [&](int x) { return x == 1 ? plain_.n > 0 : cost_[size_t(x)].n > 0; };
    for (int x = 1; x < w; ++x)
        if (known(x)) lo2 = lo, lo = x;
    for (int x = max_w_; x > w; --x)
        if (known(x)) hi = x;
    if (lo && hi) return cost(lo) + (cost(hi) - cost(lo)) * (w - lo) / double(hi - lo);
    if (lo && lo2) return cost(lo) + std::max(0.0, (cost(lo) - cost(lo2)) / (lo - lo2)) * (w - lo);
    return 0.0;
}

double SpecPolicy::acceptance(int position) const {
    double a = PRIOR_ACCEPT;
    for (int i = 0; i < position && i < int(accept_.size()); ++i)
        if (accept_[size_t(i)].n) a = accept_[size_t(i)].value;
    return a;
}

int SpecPolicy::observed_positions() const {
    int n = 0;
    for (int i = 0; i < int(accept_.size()); ++i)
        if (accept_[size_t(i)].n) n = i + 1;
    return n;
}

double SpecPolicy::expected_tokens(int w) const {
    double e = 1.0, run = 1.0, a = PRIOR_ACCEPT;
    for (int k = 1; k <= proposals(w); ++k) {
        if (k <= int(accept_.size()) && accept_[size_t(k - 1)].n) a = accept_[size_t(k - 1)].value;
        e += (run *= a);  // as acceptance(k), in one pass
    }
    return e;
}

double SpecPolicy::gain(int w) const {
    const double c = step_seconds(w);
    return c > 0 && plain_.value > 0 ? expected_tokens(w) * plain_.value / c : 0.0;
}

// A probe loses (c - E x plain) seconds against plain steps; N plain steps take N x plain. Keep
// the loss within PROBE_BUDGET of that: N >= (c / plain - E) / PROBE_BUDGET.
int SpecPolicy::probe_interval() const {
    const double loss = std::max(ratio() - expected_tokens(width_), 0.0);
    const double n = std::ceil(loss / PROBE_BUDGET);
    return int(std::clamp(n, double(MIN_PROBE_INTERVAL), double(MAX_PROBE_INTERVAL)));
}

}  // namespace luce
