"""The served demo: repository, server, one streamed answer with tau, server stopped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dflash_trt.data.demo import DEMO_DRAFTER
from dflash_trt.serving.demo import served_answer, tau_from_totals


def test_tau_counts_the_bonus_token_of_every_verify_step():
    assert tau_from_totals(total_draft_tokens=70, total_accepted_draft_tokens=30, block_size=8) == pytest.approx(4.0)
    assert tau_from_totals(0, 0, 8) == 1.0 and tau_from_totals(10, 0, 1) == 1.0
    assert tau_from_totals(70, 30, 8, num_verify_steps=15) == pytest.approx(3.0)  # the server's own step count


@pytest.mark.slow
def test_streams_an_answer_and_prints_tau(tiny_engine, tmp_path, capsys):
    lines = []
    answer = served_answer(tiny_engine, tmp_path / "repo", "Hello there", 12, write=lines.append)
    printed = capsys.readouterr().out
    assert answer.text and printed.endswith(answer.text)  # echoed as the chunks arrived
    assert answer.num_chunks >= 2 and answer.tau >= 1.0
    assert any(line.startswith("Triton is ready") for line in lines)
    assert lines[-1].startswith("[served: ") and "tau " in lines[-1] and "stopping Triton" in lines[-2]


@pytest.mark.slow
@pytest.mark.skipif(not (DEMO_DRAFTER / "config.json").is_file(), reason="the demo drafter is not in the repository")
def test_make_demo_serves_the_demo_pair():
    result = subprocess.run([sys.executable, "-m", "dflash_trt.cli", "demo", "--max-new-tokens", "32"],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Triton is ready" in result.stdout and "tau " in result.stdout
    assert "tokens/s against plain decoding" in result.stdout and "the same tokens" in result.stdout


def test_the_demo_times_dflash_against_plain_decoding(tiny_engine):
    from dflash_trt.serving.demo import compare_with_plain

    comparison = compare_with_plain(tiny_engine, "Hello there", 12)
    assert comparison.identical and comparison.num_output_tokens >= 1 and comparison.tau >= 1.0
    assert comparison.dflash_tokens_per_s > 0 and comparison.plain_tokens_per_s > 0
    line = comparison.describe()
    assert "tokens/s against plain decoding" in line and "the same tokens" in line and "x), tau " in line


def test_the_demo_counts_draft_bytes_only_for_the_steps_that_drafted():
    """The adaptive policy decodes plain in some steps: a draft's bytes count in the steps that drafted only."""
    from dflash_trt.serving.demo import PlainComparison

    comparison = PlainComparison(100.0, 50.0, 32, 2.0, True, weight_bytes_per_step=int(100e6),
                                 draft_bytes_per_step=int(40e6), drafted_share=0.5)
    line = comparison.describe()
    assert "(adaptive block size, as served)" in line and "(2.00x)" in line
    assert "40.0 MB per draft (in 50% of the verify steps) over tau tokens = 60.0 MB/token = 6.00 GB/s" in line
