"""--draft-block-size auto: the policy's width choice on synthetic costs and acceptance (the
luce_spec_policy_trace_auto hook; no timing measured), greedy output equal to plain decoding
whatever widths it picks, the cost cache (round trip, a corrupt file ignored, an unwritable
folder), and the CLI's refusals of bad values."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fixtures.spec_pair import build_pair
from luce import Engine, LuceError, cost_cache
from luce.binding import check, ffi, lib

CAL_PLAIN = 3


def trace_auto(max_width, plain, cost, runs, prior=None):
    """Widths chosen before each step (0 = plain): blocks of 2..max_width rows cost cost(w)
    seconds, a plain step `plain`; at step i the first runs[i] proposals are right."""
    widths = ffi.new("double[]", [0.0, 0.0] + [cost(w) for w in range(2, max_width + 1)])
    out = ffi.new("int32_t[]", max(len(runs), 1))
    prior_buf = ffi.new("double[]", prior) if prior is not None else ffi.NULL
    check(lib().luce_spec_policy_trace_auto(max_width, plain, widths, ffi.new("int32_t[]", runs or [0]),
                                            prior_buf, len(prior or []), len(runs), out))
    return [out[i] for i in range(len(runs))]


def expected_tokens(acceptance, w):
    """E(w) = 1 + sum over the w - 1 proposals of the product of the acceptance rates up to it."""
    return 1 + sum(np.prod(acceptance[:k]) for k in range(1, w))


# ---- the width choice on synthetic sequences -------------------------------------------------

def test_auto_picks_the_hand_computed_width_from_cached_costs():
    # Plain 2 ms (500 tok/s); a block of w rows 3 ms + 0.4 ms per row; acceptance falls along
    # the block.
    acceptance = [0.95, 0.9, 0.9, 0.85, 0.8, 0.6, 0.5, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    cost = lambda w: 3e-3 + 0.4e-3 * w  # noqa: E731
    speed = {w: expected_tokens(acceptance, w) / cost(w) for w in range(2, 17)}
    best = max(speed, key=speed.get)
    # By hand: E(6) = 1 + .95 + .855 + .7695 + .6541 + .5233 = 4.752 over 5.4 ms = 880 tok/s;
    # E(5) = 4.229 / 5.0 ms = 846, E(7) = 5.066 / 5.8 ms = 873.
    assert best == 6 and speed[6] == pytest.approx(880, abs=1)
    widths = trace_auto(16, 2e-3, cost, [0] * (CAL_PLAIN + 1), prior=acceptance)
    assert widths == [0] * CAL_PLAIN + [6]  # plain steps measure this run's plain cost, then the cache decides


def test_auto_settles_on_the_width_the_drafter_fills():
    # The drafter's first 5 proposals are always right, the 6th never: a block of 6 rows commits 6
    # tokens, a wider one the same 6 for more cost, a narrower one fewer.
    widths = trace_auto(16, 1e-3, lambda w: 1e-3 + 0.5e-3 * w, [5] * 80)
    assert widths[:CAL_PLAIN] == [0] * CAL_PLAIN and widths[CAL_PLAIN] == 4  # calibration
    # It speculates at the measured width 4 and explores the model's best (16: every proposal
    # seen so far was accepted) one step in 8; 16 shows the 6th proposal failing, the model
    # then puts the best at 6, exploring it measures it, and the run stays there.
    assert 16 in widths[:20] and set(widths[30:]) <= {6, 0} and widths[30:].count(6) > 40


def test_auto_goes_wide_for_a_drafter_that_fills_every_block():
    widths = trace_auto(16, 1e-3, lambda w: 1e-3 + 0.5e-3 * w, [99] * 80)
    assert set(widths[20:]) <= {16, 0} and widths[20:].count(16) > 50


def test_auto_decodes_plainly_when_no_width_pays():
    # The CPU reference pair's case: a spec step costs 10 plain steps and more per row.
    widths = trace_auto(16, 1e-3, lambda w: 10e-3 + 1e-3 * w, [5] * 2000)
    after = widths[CAL_PLAIN + 1:]
    assert 0 < sum(w > 0 for w in after) < len(after) // 50  # rare probes only


def test_cached_costs_that_cannot_pay_skip_calibration():
    widths = trace_auto(16, 1e-3, lambda w: 10e-3 + 1e-3 * w, [5] * 200, prior=[0.9] * 15)
    assert widths[:100] == [0] * 100  # no calibration spec step: the first probe comes much later


# ---- spec == plain under auto -------------------------------------------------------------------

PROMPT = [1, 2, 3, 4, 5, 6, 7]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("auto"))


@pytest.fixture(scope="module")
def plain(pair):
    with Engine(pair.target, threads=1) as eng:
        return eng.generate(prompt_ids=PROMPT, max_tokens=160, ignore_eos=True).tokens


def _corrupt(tokens, every, offset):
    out = list(tokens)
    for i in range(offset, len(out), every):
        out[i] = (out[i] + 1) % 500
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCE_COST_CACHE", "1")
    monkeypatch.setenv("LUCE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _seed_cache(pair, name, per_row):
    """A cache entry that makes speculation pay at every width: a spec step costs 1 + per_row x rows
    plain steps."""
    key = cost_cache.cache_key(pair.target, pair.drafters[name], cost_cache.device_identity("cpu", 1))
    plain_s = 1e-3
    cost_cache.save(key, {"version": cost_cache.VERSION, "plain_seconds": plain_s,
                          "width_seconds": {str(w): plain_s * (1 + per_row * w) for w in range(2, 17)},
                          "acceptance": [0.9] * 8})
    return key


@pytest.mark.parametrize("name", ["dflash", "dflash2", "dspark"])
def test_auto_output_equals_plain_whatever_widths_it_picks(pair, plain, cache, name):
    _seed_cache(pair, name, 0.05)
    with Engine(pair.target, threads=1, draft=pair.drafters[name]) as eng:
        for every, offset in ((7, 3), (3, 1), (40, 20)):  # oracle proposals right except at places
            g = eng.generate(prompt_ids=PROMPT, max_tokens=160, ignore_eos=True, draft_block_size="auto",
                             oracle_tokens=_corrupt(plain, every, offset))
            assert g.tokens == plain, (name, every)
            assert g.stats["block_auto"] and g.stats["costs_from_cache"] and g.stats["spec_steps"] > 0
        # The random drafter alone (nothing accepted): auto still decodes exactly.
        g = eng.generate(prompt_ids=PROMPT, max_tokens=160, ignore_eos=True)
        assert g.tokens == plain
    ran = [w for w, s in enumerate(g.stats["width_seconds"]) if s > 0]
    assert len(ran) >= 2, ran  # the runs spread over several widths


def test_a_number_is_exactly_that_width(pair, plain):
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        g = eng.generate(prompt_ids=PROMPT, max_tokens=60, ignore_eos=True, draft_block_size=5, adaptive=False)
    assert g.tokens == plain[:60] and g.stats["block_size"] == 5 and not g.stats["block_auto"]
    assert g.stats["width_seconds"][5] > 0 and not any(g.stats["width_seconds"][6:])


# ---- the cost cache ----------------------------------------------------------------------------------

def test_cache_round_trip(pair, plain, cache):
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash2"]) as eng:
        first = eng.generate(prompt_ids=PROMPT, max_tokens=40, ignore_eos=True)
        files = list(cache.glob("costs-*.json"))
        assert len(files) == 1 and not first.stats["costs_from_cache"]
        entry = json.loads(files[0].read_text())
        assert entry["plain_seconds"] == pytest.approx(first.stats["plain_step_seconds"])
        assert entry["width_seconds"] and all(2 <= int(w) <= 8 for w in entry["width_seconds"])
        second = eng.generate(prompt_ids=PROMPT, max_tokens=40, ignore_eos=True)
        assert second.stats["costs_from_cache"] and second.tokens == plain[:40]
    assert not list(cache.glob(".costs-*"))  # no temporary file left behind


def test_the_key_follows_file_identity_and_device(pair, tmp_path):
    a = cost_cache.cache_key(pair.target, pair.drafters["dflash"], "cpu:x:threads=2")
    assert a == cost_cache.cache_key(pair.target, pair.drafters["dflash"], "cpu:x:threads=2")
    assert a != cost_cache.cache_key(pair.target, pair.drafters["dflash"], "cpu:x:threads=1")
    assert a != cost_cache.cache_key(pair.target, pair.drafters["dspark"], "cpu:x:threads=2")


@pytest.mark.parametrize("content", [b"{not json", b"", b'{"version": 1}', b"\xff\xfe\x00",
                                     b'{"version": 1, "plain_seconds": -1, "width_seconds": {"4": 1}, "acceptance": []}',
                                     b'{"version": 1, "plain_seconds": 1, "width_seconds": {"x": 1}, "acceptance": []}',
                                     b'[1, 2, 3]'])
def test_a_corrupt_cache_file_is_ignored_and_replaced(pair, plain, cache, content):
    key = cost_cache.cache_key(pair.target, pair.drafters["dspark"], cost_cache.device_identity("cpu", 1))
    cache.mkdir(parents=True, exist_ok=True)
    cost_cache.cache_path(key).write_bytes(content)
    assert cost_cache.load(key) is None
    with Engine(pair.target, threads=1, draft=pair.drafters["dspark"]) as eng:
        g = eng.generate(prompt_ids=PROMPT, max_tokens=30, ignore_eos=True)
    assert g.tokens == plain[:30] and not g.stats["costs_from_cache"]
    assert cost_cache.load(key) is not None  # the run wrote a good entry over it


def test_an_unwritable_cache_folder_is_not_an_error(pair, plain, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LUCE_COST_CACHE", "1")
    monkeypatch.setenv("LUCE_CACHE_DIR", str(blocker / "cache"))  # below a file: mkdir fails
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        assert eng.generate(prompt_ids=PROMPT, max_tokens=20, ignore_eos=True).tokens == plain[:20]


def test_the_cache_can_be_turned_off(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCE_COST_CACHE", "0")
    monkeypatch.setenv("LUCE_CACHE_DIR", str(tmp_path / "cache"))
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        eng.generate(prompt_ids=PROMPT, max_tokens=20, ignore_eos=True)
    assert not (tmp_path / "cache").exists()


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("LUCE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cost_cache.cache_dir() == tmp_path / "luce"


# ---- refusals ----------------------------------------------------------------------------------

def test_api_refuses_a_block_size_that_is_neither_auto_nor_a_number(pair):
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        with pytest.raises(LuceError, match="draft_block_size must be 'auto' or a number"):
            eng.generate(prompt_ids=[1, 2], max_tokens=4, draft_block_size="abc")


@pytest.mark.parametrize("value,message", [("abc", "'abc' is not 'auto' or a number of block rows"),
                                           ("-3", "-3 is not 'auto' or a number of block rows"),
                                           ("4.5", "'4.5' is not 'auto' or a number of block rows")])
def test_cli_refuses_bad_block_sizes_in_one_line(pair, luce_cmd, value, message):
    r = luce_cmd("generate", "-m", pair.target, "--draft", pair.drafters["dflash"], "--prompt-ids", "1,2",
                 "-n", 4, "--draft-block-size", value)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert message in r.stderr


def test_cli_auto_names_the_width_it_chose(pair, luce_cmd):
    r = luce_cmd("generate", "-m", pair.target, "--draft", pair.drafters["dflash"], "--prompt-ids", "1,2,3",
                 "-n", 30, "--ignore-eos", "-t", 1, "--draft-block-size", "AUTO")
    assert r.returncode == 0, r.stderr
    assert "(auto)" in r.stderr


def test_cli_auto_prints_what_plain_decoding_prints(pair, luce_cmd):
    args = ["generate", "-m", pair.target, "--prompt-ids", "1,2,3", "-n", 40, "--ignore-eos", "-t", 1, "--json"]
    plain = luce_cmd(*args)
    for name in ("dflash2", "dspark"):
        spec = luce_cmd(*args, "--draft", pair.drafters[name])  # --draft-block-size auto by default
        assert plain.returncode == spec.returncode == 0, spec.stderr
        assert json.loads(spec.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
        assert json.loads(spec.stdout)["stats"]["block_auto"]


def test_bench_draft_prints_the_cost_curve_and_the_chosen_width(pair):
    from click.testing import CliRunner

    from luce.cli.main import cli

    result = CliRunner().invoke(cli, ["bench", "-m", str(pair.target), "--draft", str(pair.drafters["dflash2"]),
                                      "-p", "8", "-n", "40", "--draft-block-size", "4,auto", "-r", "1", "-t", "1"])
    assert result.exit_code == 0, result.output
    assert "| auto (" in result.output  # the auto row names the width it ended at
    curve = result.output.split("cost model after the last run (per block width):")[1]
    assert "| block | step ms | tokens/step | expected tok/s | vs plain |" in curve
    assert "chosen: " in curve and ("speculate with block" in curve or "plain decoding" in curve)


def test_bench_refuses_a_bad_block_list(pair):
    from click.testing import CliRunner

    from luce.cli.main import cli

    result = CliRunner().invoke(cli, ["bench", "-m", str(pair.target), "--draft", str(pair.drafters["dflash2"]),
                                      "--draft-block-size", "4,abc"])
    assert result.exit_code == 2 and "is not a list of integers" in result.output
