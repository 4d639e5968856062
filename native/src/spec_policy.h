// spec_policy.h — when speculation pays (spec engine.md §4.8, in luce's cost-aware form).
//
// Upstream compares an EMA of accepted drafts against a fixed cost ratio (1.9 plain steps per spec
// step, measured once on one GPU). On a small model on the CPU a spec step costs 5-15 plain steps,
// so that rule kept speculating at a third of plain speed. This policy measures both step costs
// on the device it runs on and compares tokens per second directly:
//   speculate  iff  tokens_per_spec / spec_seconds  >  1 / plain_seconds
// i.e. gain = tokens_per_spec x plain_seconds / spec_seconds > 1, with tokens_per_spec the decayed
// mean of tokens one spec step commits (accepted + bonus).
//   - Calibration: CAL_PLAIN plain steps right after prefill, then CAL_SPEC spec steps.
//   - Hysteresis: speculation stops when gain < 1 and resumes only when a probe says gain > 1.05,
//     so a gain near 1 does not flip every step.
//   - While plain wins, one probe spec step runs every probe_interval() plain steps: enough that
//     a probe's loss against plain steps (spec_seconds - tokens x plain_seconds) is at most
//     PROBE_BUDGET of the time between probes. The probe's acceptance weighs 0.5: the estimate
//     before it is old.
//   - While speculation wins, one plain step every PLAIN_CHECK_EVERY spec steps keeps the plain
//     cost current: three calibration steps can be off (a busy CPU, a cold cache), and a plain
//     cost measured too high would otherwise keep speculation on for the whole run. Like a
//     probe's tokens, a check's time weighs 0.5.
// Output does not depend on the choices: a plain step commits what a spec step would have
// (speculative.cpp header), so the policy only moves speed.
#pragma once

namespace luce {

class SpecPolicy {
public:
    explicit SpecPolicy(bool adaptive) : adaptive_(adaptive) {}

    bool speculate_next() const;  // the choice for the next step
    void after_plain(double seconds);
    void after_spec(int committed, double seconds);

    // What the stats report (0 until measured).
    double plain_seconds() const { return plain_.value; }
    double spec_seconds() const { return spec_.value; }
    double ratio() const { return plain_.n && spec_.n ? spec_.value / plain_.value : 0.0; }
    double tokens_per_spec() const { return tokens_.value; }
    // Tokens per second of a spec step over a plain step's (0 until both are measured).
    double gain() const { return ratio() > 0 ? tokens_.value / ratio() : 0.0; }
    int probe_interval() const;

    static constexpr int CAL_PLAIN = 3, CAL_SPEC = 1;
    static constexpr double HYSTERESIS = 0.05, PROBE_BUDGET = 0.05;
    static constexpr int MIN_PROBE_INTERVAL = 8, MAX_PROBE_INTERVAL = 2048, PLAIN_CHECK_EVERY = 32;

private:
    // Mean of the first 1/alpha samples, then an EMA: early samples are not pulled towards 0.
    struct Decayed {
        double value = 0;
        int n = 0;
        void add(double x, double alpha);
    };
    static constexpr double TIME_ALPHA = 0.1, TOKENS_ALPHA = 0.1, PROBE_ALPHA = 0.5;

    bool calibrated() const { return plain_.n >= CAL_PLAIN && spec_.n >= CAL_SPEC; }

    const bool adaptive_;
    Decayed plain_, spec_, tokens_;
    bool speculating_ = true;
    int plain_left_ = 0;  // plain steps before the next probe (while plain wins)
    int spec_run_ = 0;    // spec steps since the last plain step (while speculation wins)
};

}  // namespace luce
