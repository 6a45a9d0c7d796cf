"""The served comparison loads one server at a time, level by level, the order of the modes changing from one round
to the next (two modes: reversed), so that a drift of the machine's load falls on every mode alike; with several
rounds, a mode's runs at a level are reported together."""

from types import SimpleNamespace

import pytest

from dflash_trt.benchmarks import serving
from dflash_trt.benchmarks.config import BenchConfig
from dflash_trt.benchmarks.loadgen import LoadLevel, RequestRecord


def _load(monkeypatch, config, modes=("dflash", "plain")):
    """serving._load_interleaved over fake servers (one per mode) whose n-th run (1-based) is one request of 10 n
    tokens: (results, each mode's runs per level, [(mode, level, duration_s) of each run in order])."""
    calls = []

    def fake_level(open_stream, prompts, level, duration_s, max_tokens, timeout_s, **params):
        calls.append((open_stream(), level, duration_s))
        start = float(len(calls))
        return LoadLevel(level, duration_s + 1.0, [RequestRecord(start, start + 1.0, num_output_tokens=10 * len(calls),
                                                                 tokens_under_load=5 * len(calls))],
                         load_s=duration_s)

    monkeypatch.setattr(serving, "run_level", fake_level)
    monkeypatch.setattr("dflash_trt.serving.client.GrpcStream", lambda url: url)
    monkeypatch.setattr("dflash_trt.serving.metrics.scrape_totals", lambda url, names: {name: 0.0 for name in names})
    servers = {mode: SimpleNamespace(config=SimpleNamespace(grpc_url=mode, metrics_url=mode))
               for mode in modes}
    results, runs = serving._load_interleaved(config, servers, ["p"], lambda line: None)
    return results, runs, calls


def test_levels_load_the_servers_in_turn_in_alternating_order(monkeypatch, tmp_path):
    results, _runs, calls = _load(monkeypatch, BenchConfig(concurrency=(1, 4, 16), duration_s=20.0, out=tmp_path))

    assert [(mode, level) for mode, level, _ in calls] == [
        ("dflash", 1), ("plain", 1), ("plain", 4), ("dflash", 4), ("dflash", 16), ("plain", 16)]
    assert all(duration == 20.0 for _, _, duration in calls)
    # Each mode's level is its own run: dflash ran 1st at level 1 and 4th at level 4.
    assert results["dflash"]["1"]["output_tokens"] == 10 and results["dflash"]["4"]["output_tokens"] == 40
    assert results["plain"]["4"]["output_tokens"] == 30 and results["plain"]["16"]["num_requests"] == 1


def test_rounds_repeat_each_level_alternating_and_merge_each_modes_runs(monkeypatch, tmp_path):
    config = BenchConfig(concurrency=(4, 16), duration_s=15.0, serving_rounds=3, out=tmp_path)
    results, runs, calls = _load(monkeypatch, config)

    assert [mode for mode, _, _ in calls] == ["dflash", "plain", "plain", "dflash", "dflash", "plain",
                                              "plain", "dflash", "dflash", "plain", "plain", "dflash"]
    assert [level for _, level, _ in calls] == [4] * 6 + [16] * 6
    # dflash at 4 ran 1st, 4th and 5th: 10 + 40 + 50 tokens over 3 runs of 15 s under load and 1 s of drain each,
    # 5 + 20 + 25 of them under load.
    level = results["dflash"]["4"]
    assert level["output_tokens"] == 100 and level["duration_s"] == 48.0 and level["num_requests"] == 3
    assert level["output_tokens_per_s"] == pytest.approx(50 / 45)
    assert level["output_tokens_per_s_with_drain"] == pytest.approx(100 / 48)


def test_each_rounds_ratio_pairs_the_two_runs_it_took_back_to_back(monkeypatch, tmp_path):
    config = BenchConfig(concurrency=(4, 16), duration_s=15.0, serving_rounds=3, out=tmp_path)
    _results, runs, _calls = _load(monkeypatch, config)

    # Level 4: rounds (dflash 1st, plain 2nd), (plain 3rd, dflash 4th), (dflash 5th, plain 6th): 10 n tokens each.
    ratios = serving.round_ratios(runs)
    assert ratios["4"] == pytest.approx([10 / 20, 40 / 30, 50 / 60])
    assert ratios["16"] == pytest.approx([80 / 70, 90 / 100, 120 / 110])


def test_a_plain_control_server_takes_its_turn_and_its_rounds_pair_with_plains(monkeypatch, tmp_path):
    config = BenchConfig(concurrency=(4,), duration_s=15.0, serving_rounds=2, plain_control=True, out=tmp_path)
    _results, runs, calls = _load(monkeypatch, config, modes=("dflash", "plain", "plain-control"))

    assert [mode for mode, _, _ in calls] == ["dflash", "plain", "plain-control", "dflash", "plain-control", "plain"]
    # plain ran 2nd and 6th, plain-control 3rd and 5th.
    assert serving.round_ratios(runs, "plain", "plain-control")["4"] == pytest.approx([20 / 30, 60 / 50])


def test_with_a_control_server_every_mode_takes_every_place_in_six_rounds(monkeypatch, tmp_path):
    config = BenchConfig(concurrency=(4,), duration_s=15.0, serving_rounds=6, plain_control=True, out=tmp_path)
    _results, _runs, calls = _load(monkeypatch, config, modes=("dflash", "plain", "plain-control"))
    rounds = [tuple(mode for mode, _, _ in calls[i:i + 3]) for i in range(0, 18, 3)]
    assert len(set(rounds)) == 6
    for mode in ("dflash", "plain", "plain-control"):
        assert sorted(r.index(mode) for r in rounds) == [0, 0, 1, 1, 2, 2]


def test_the_plain_control_is_a_third_server_serving_plain_decoding(tmp_path):
    assert serving.served_modes(BenchConfig(out=tmp_path)) == {"dflash": (0, 0), "plain": (1, 0)}
    modes = serving.served_modes(BenchConfig(out=tmp_path, plain_control=True))
    assert modes == {"dflash": (0, 0), "plain": (1, 0), "plain-control": (1, 0)}
