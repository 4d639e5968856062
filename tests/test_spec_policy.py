"""The adaptive speculation policy (native/src/spec_policy.h) on synthetic step costs and
acceptance, through the luce_spec_policy_trace test hook: it calibrates (plain steps, then spec
steps), keeps speculating where a spec step's tokens per second beat a plain step's, decodes
plainly where they do not, and probes rarely enough that probes cost at most ~5% of the time.
No timing is measured here: the costs are inputs."""
from __future__ import annotations

import pytest

from luce.binding import check, ffi, lib
from luce.errors import LuceError

CAL_PLAIN, CAL_SPEC = 3, 1
PLAIN_CHECK_EVERY = 32
CHECK = CAL_PLAIN  # plain steps in one check (their median is the sample)
FIRST_CHECK_AFTER = 8  # spec steps before the first check after a switch to speculation


def trace(plain, spec, committed, n, adaptive=True):
    """The policy's choices (1 speculate, 0 plain) over n steps; scalars mean constant sequences."""
    def seq(x, ctype):
        values = x if isinstance(x, list) else [x] * n
        return ffi.new(f"{ctype}[]", values)
    out = ffi.new("int32_t[]", max(n, 1))
    check(lib().luce_spec_policy_trace(int(adaptive), seq(plain, "double"), seq(spec, "double"),
                                       seq(committed, "int32_t"), n, out))
    return [out[i] for i in range(n)]


def test_calibrates_with_plain_steps_then_spec_steps():
    choices = trace(1e-3, 2e-3, 4, 10)
    assert choices[:CAL_PLAIN] == [0] * CAL_PLAIN
    assert choices[CAL_PLAIN:CAL_PLAIN + CAL_SPEC] == [1] * CAL_SPEC


def test_speculates_when_it_pays():
    # A spec step costs 2 plain steps and commits 4 tokens: 2x plain's tokens/s.
    choices = trace(1e-3, 2e-3, 4, 500)
    after = choices[CAL_PLAIN:]
    # ... with a check of CHECK plain steps every PLAIN_CHECK_EVERY spec steps to keep the plain
    # cost current.
    assert after.count(0) <= CHECK * (len(after) // PLAIN_CHECK_EVERY + 2)
    assert after[:FIRST_CHECK_AFTER] == [1] * FIRST_CHECK_AFTER  # the calibration step counts


def test_decodes_plainly_when_speculation_cannot_pay():
    # The CPU reference pair's case: a spec step costs 14 plain steps and commits 5.3 tokens (0.38x).
    n = 5000
    choices = trace(0.5e-3, 7e-3, 5, n)
    spec_after = choices[CAL_PLAIN + CAL_SPEC:]
    assert spec_after.count(1) > 0  # it still probes
    # Probes cost at most ~5% of the time spent between them.
    plain_time = spec_after.count(0) * 0.5e-3
    probe_loss = spec_after.count(1) * (7e-3 - 5 * 0.5e-3)
    assert probe_loss <= 0.055 * plain_time


def test_random_drafter_falls_back():
    # One token per spec step (nothing accepted) can never pay, whatever the cost ratio.
    choices = trace(1e-3, 1.2e-3, 1, 400)
    assert choices[CAL_PLAIN + CAL_SPEC:].count(1) < 400 // 8


def test_probe_brings_speculation_back_when_acceptance_rises():
    # Acceptance 1 token per step for 300 steps, then 6 (spec step = 2 plain steps): the next
    # probe sees the gain and speculation resumes.
    n = 600
    committed = [1] * 300 + [6] * 300
    choices = trace(1e-3, 2e-3, committed, n)
    assert choices[200:300].count(1) < 20
    assert choices[-100:].count(0) <= CHECK * (100 // PLAIN_CHECK_EVERY + 1)


def test_hysteresis_between_break_even_and_five_percent():
    # Gain 1.02 (51 tokens per 50 plain steps' time): speculation that runs keeps running ...
    assert trace(1e-3, 50e-3, 51, 300)[CAL_PLAIN:].count(0) <= CHECK * (300 // PLAIN_CHECK_EVERY + 2)
    # ... but plain decoding, once chosen (gain 0.9), is not left for it: only probes speculate.
    choices = trace(1e-3, 50e-3, [45] * 100 + [51] * 900, 1000)
    assert choices[500:].count(1) <= 500 // 8


def test_plain_costs_that_change_are_tracked():
    # Plain steps get slower (a longer context): speculation that lost starts to pay.
    n = 3000
    plain = [1e-3] * 1000 + [4e-3] * 2000
    choices = trace(plain, 8e-3, 3, n)  # gain 3/8 -> 3/2
    assert choices[500:1000].count(1) < 50
    assert choices[-500:].count(0) <= CHECK * (500 // PLAIN_CHECK_EVERY + 1)


def test_a_plain_cost_calibrated_too_high_is_corrected():
    # The calibration's plain steps were slow (10 ms; a busy CPU), later ones take 1 ms: the policy
    # speculates at first (gain 1.5 x 10 / 2 = 7.5), its plain checks then find gain 0.75 and it
    # decodes plainly.
    n = 1000
    choices = trace([10e-3] * CAL_PLAIN + [1e-3] * (n - CAL_PLAIN), 2e-3, [1, 2] * (n // 2), n)
    assert choices[CAL_PLAIN:CAL_PLAIN + FIRST_CHECK_AFTER] == [1] * FIRST_CHECK_AFTER
    assert choices[-300:].count(1) < 300 // 8


def test_no_adaptive_always_speculates():
    assert trace(1e-3, 100e-3, 1, 50, adaptive=False) == [1] * 50


@pytest.mark.parametrize("plain,spec,committed", [(0.0, 1e-3, 1), (1e-3, -1.0, 1), (1e-3, 1e-3, 0)])
def test_bad_input_is_one_clear_error(plain, spec, committed):
    with pytest.raises(LuceError, match="times must be > 0 and committed >= 1"):
        trace(plain, spec, committed, 4)
