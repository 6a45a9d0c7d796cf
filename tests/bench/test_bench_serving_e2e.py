"""A short full run, serving included: DFlash and plain decoding through the real tritonserver."""

from __future__ import annotations

import json

import pytest

from dflash_trt.benchmarks.config import BenchConfig
from dflash_trt.benchmarks.run import run_bench

LEVEL_KEYS = {"concurrency", "duration_s", "num_requests", "num_errors", "error_examples", "output_tokens",
              "output_tokens_per_s", "output_tokens_per_s_with_drain", "requests_per_s", "ttft_ms", "itl_ms", "tpot_ms",
              "user_tokens_per_s", "drafting"}


@pytest.fixture(scope="module")
def served_run(bench_engine, bench_prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-served")
    config = BenchConfig(engine=bench_engine, out=out, prompts_dir=bench_prompts, num_prompts=1, max_new_tokens=8,
                         block_sizes=(4,), num_threads=1, concurrency=(1, 2), duration_s=2.0, serving_rounds=2,
                         instances=1, min_user_tokens_per_s=0.5)
    run_bench(config, log=lambda _line: None)
    return out


@pytest.mark.slow
def test_serving_section_has_both_modes_at_every_level(served_run):
    serving = json.loads((served_run / "summary.json").read_text())["serving"]
    assert set(serving) == {"dflash", "plain", "speedup", "speedup_runs", "goodput"}
    for mode in ("dflash", "plain"):
        assert set(serving[mode]) == {"1", "2"}
        for level, figures in serving[mode].items():
            assert set(figures) == LEVEL_KEYS, (mode, level)
            assert figures["num_errors"] == 0, figures["error_examples"]
            assert figures["num_requests"] >= 1 and figures["output_tokens"] > 0
    for figures in serving["plain"].values():  # block size 1: every verify step is a plain one
        assert figures["drafting"]["mean_block_size"] == 1.0 and figures["drafting"]["plain_step_share"] == 1.0
    for figures in serving["dflash"].values():  # the adaptive policy chooses within 1 .. the engine's 4
        drafting = figures["drafting"]
        assert 0.0 <= drafting["plain_step_share"] <= 1.0
        assert 1.0 <= drafting["mean_block_size"] <= 1.0 + 3 * (1.0 - drafting["plain_step_share"]) + 1e-9
    assert set(serving["speedup"]) == {"1", "2"}
    for level, runs in serving["speedup_runs"].items():  # one ratio per round, of its two runs back to back
        assert len(runs) == 2 and all(ratio > 0 for ratio in runs), (level, runs)
    goodput = serving["goodput"]
    assert goodput["min_user_tokens_per_s"] == 0.5
    for mode in ("dflash", "plain"):
        assert goodput[mode]["level"] in (1, 2)
        assert goodput[mode]["output_tokens_per_s"] == serving[mode][str(goodput[mode]["level"])]["output_tokens_per_s"]


@pytest.mark.slow
def test_serving_plot_and_server_logs_are_written(served_run):
    assert (served_run / "serving.png").read_bytes()[:4] == b"\x89PNG"
    assert {p.name for p in (served_run / "logs").iterdir()} == {"triton-dflash.log", "triton-plain.log"}
