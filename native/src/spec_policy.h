// spec_policy.h — when speculation pays, and at which block width (spec engine.md §4.8, in luce's
// cost-aware form).
//
// Upstream compares an EMA of accepted drafts against a fixed cost ratio (1.9 plain steps per spec
// step, measured once on one GPU). On a small model on the CPU a spec step costs 5-15 plain steps,
// so that rule kept speculating at a third of plain speed. This policy measures the step costs on
// the device it runs on and compares tokens per second directly. For a block of w rows:
//   E(w)    = 1 + sum_{k=1..q(w)} a_1 x .. x a_k   expected tokens one spec step commits (the
//             bonus, plus each proposal accepted only if all before it were), with a_i the decayed
//             rate at which proposal i is accepted given that 1..i-1 were, and q(w) the proposals
//             of a block of w rows (w - 1, or w for DSpark next-token slots);
//   c(w)    = the cost of a spec step of w rows (drafter + verify + rollback), measured at the
//             widths that ran and modelled between them (step_seconds);
//   gain(w) = E(w) x plain_seconds / c(w)         a spec step's tokens/s over a plain step's.
// Auto width picks w* = argmax gain(w) over [min_width, max_width] among the widths whose cost
// was measured, and speculates at w* iff gain(w*) > 1, with hysteresis; the best width by the
// model (measured or interpolated) is explored by one spec step (or probe) in EXPLORE_EVERY.
// A fixed width has one candidate.
//   - Calibration: CAL_PLAIN plain steps (their median is the plain cost: the first steps after
//     prefill run cold, and a shared machine stalls single steps), then CAL_SPEC spec steps at the
//     start width. Costs and acceptance from an earlier run on this device (seed(): the cost
//     cache, luce/cost_cache.py) replace the spec steps, the costly part: after its plain steps
//     such a run decides at once, taking the cached spec costs as multiples of the cached plain
//     step (the load of a shared machine moves both alike), and only refines the estimates.
//   - Hysteresis: speculation stops when gain < 1 and resumes only when a probe says gain > 1.05,
//     so a gain near 1 does not flip every step.
//   - While plain wins, one probe spec step runs every probe_interval() plain steps: enough that
//     a probe's loss against plain steps (c - E x plain_seconds) is at most PROBE_BUDGET of the
//     time between probes. A probe's acceptance weighs 0.5: the estimate before it is old.
//   - While speculation wins, CAL_PLAIN plain steps every PLAIN_CHECK_EVERY spec steps (8, 16,
//     then 32 after a switch to speculation) keep the plain cost current: calibration steps can be
//     off (a busy CPU, a cold cache), and a plain cost measured too high would otherwise keep
//     speculation on for the whole run. Like a probe's acceptance, a check (its median) weighs 0.5.
// Output does not depend on the choices: a plain step commits what a spec step of any width would
// have (speculative.cpp header), so the policy only moves speed.
#pragma once

#include <array>
#include <vector>

namespace luce {

class SpecPolicy {
public:
    // Widths in [min_width, max_width] (equal: a fixed width); the first spec step runs start_width.
    // anchor_slot: DSpark next-token slots, where w rows give w proposals (else w - 1).
    SpecPolicy(bool adaptive, int min_width, int max_width, int start_width, bool anchor_slot);

    // Costs and acceptance an earlier run measured on this device: plain_seconds, spec step
    // seconds by width (index = rows, <= 0 where not measured), acceptance by proposal position
    // (index 0 = proposal 1). Ignored unless it holds a plain cost and one width's cost.
    void seed(double plain_seconds, const double *width_seconds, int n_widths, const double *acceptance,
              int n_acceptance);

    int next_width() const;  // the next step: 0 plain, else a spec step of this many rows
    void after_plain(double seconds);
    // A spec step that verified `proposals` drafts and accepted `accepted` of them. Its cost counts
    // for the width whose full block has that many proposals (a step cut short near the end of the
    // budget or by the long-context cap costs what that narrower block does).
    void after_spec(int proposals, int accepted, double seconds);

    // The model (0 where unknown).
    double step_seconds(int w) const;     // c(w): measured, else modelled
    double measured_seconds(int w) const;  // c(w) where a step of w rows ran, else 0
    double expected_tokens(int w) const;  // E(w)
    double gain(int w) const;
    double acceptance(int position) const;  // a_position, 1-based; unobserved: the one before it
    int observed_positions() const;         // proposals observed so far (or seeded)
    int width() const { return width_; }    // the width the policy speculates at now
    int min_width() const { return min_w_; }
    int max_width() const { return max_w_; }

    // What the stats report, at the current width (0 until measured).
    double plain_seconds() const { return plain_.value; }
    double spec_seconds() const { return step_seconds(width_); }
    double ratio() const { return plain_.value > 0 ? spec_seconds() / plain_.value : 0.0; }
    double gain() const { return gain(width_); }
    int probe_interval() const;

    static constexpr int CAL_PLAIN = 3, CAL_SPEC = 1;
    static constexpr double HYSTERESIS = 0.05, PROBE_BUDGET = 0.05;
    // Probes come at least MIN_PROBE_INTERVAL plain steps apart: near break-even the loss a probe is
    // expected to cost is small, and least reliable (the width probed is the one whose estimate
    // looks best), so probing every few steps lost more than the budget on a busy CPU.
    static constexpr int MIN_PROBE_INTERVAL = 32, MAX_PROBE_INTERVAL = 2048, PLAIN_CHECK_EVERY = 32;
    // A decision to speculate rests on a few noisy samples: the first check comes after
    // FIRST_CHECK_AFTER spec steps, each check that holds doubles the distance to PLAIN_CHECK_EVERY.
    static constexpr int FIRST_CHECK_AFTER = 8;
    static constexpr int EXPLORE_EVERY = 8;  // one spec step (or probe) in 8 at the model's best width
    // Acceptance assumed for proposal 1 before any is observed (only the model's curve before the
    // first spec step reads it).
    static constexpr double PRIOR_ACCEPT = 0.5;

private:
    // Mean of the first 1/alpha samples, then an EMA: early samples are not pulled towards 0.
    struct Decayed {
        double value = 0;
        int n = 0;
        void add(double x, double alpha);
    };
    static constexpr double TIME_ALPHA = 0.1, ACCEPT_ALPHA = 0.1, PROBE_ALPHA = 0.5;

    int proposals(int w) const { return anchor_slot_ ? w : w - 1; }
    bool calibrated() const;
    int best_width(bool measured_only) const;
    void decide();

    const bool adaptive_, anchor_slot_;
    const int min_w_, max_w_;
    int width_;    // speculation's and probes' width: the best measured one
    int explore_;  // the best by the model, measured or not
    bool seeded_ = false;
    Decayed plain_;
    std::vector<Decayed> cost_;    // by rows, [0, max_w]
    std::vector<Decayed> accept_;  // by proposal position, [0] = proposal 1
    int spec_measured_ = 0;        // spec steps seen
    bool speculating_ = true;
    int plain_left_ = 0;  // plain steps before the next probe (while plain wins)
    int spec_run_ = 0;    // spec steps since the last plain check (while speculation wins)
    int probes_ = 0;      // probes so far
    int check_every_ = FIRST_CHECK_AFTER;  // spec steps between plain checks now
    std::array<double, CAL_PLAIN> burst_{};  // the plain step times of a calibration or check
    int burst_n_ = 0;
};

}  // namespace luce
