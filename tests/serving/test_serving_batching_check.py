"""`dflash-trt check-batching`: requests served in one batch against each generated alone."""

from __future__ import annotations

import pytest

from dflash_trt.benchmarks.batching_check import (CheckRequest, Expected, Served, compare, first_difference,
                                                  make_requests)
from dflash_trt.benchmarks.in_process import PromptRecord
from dflash_trt.cli import main
from dflash_trt.serving.detokenize import decode

RECORDS = [PromptRecord(f"{family} prompt {i}", family) for family in ("math", "chat") for i in range(3)]
RECORDS.append(PromptRecord([{"role": "user", "content": "a multi-turn prompt"}], "multiturn"))


def test_requests_are_reproducible_mix_the_prompts_and_keep_max_tokens_in_range():
    requests = make_requests(RECORDS, 14, 2, 9, seed=3)
    assert requests == make_requests(RECORDS, 14, 2, 9, seed=3)
    assert requests != make_requests(RECORDS, 14, 2, 9, seed=4)
    assert [r.index for r in requests] == list(range(14))
    assert {r.text for r in requests[:6]} == {r.prompt for r in RECORDS[:6]}  # every prompt before a repeat
    assert {r.family for r in requests} == {"math", "chat"}  # the served models take text: no multi-turn
    assert all(2 <= r.max_tokens <= 9 for r in requests) and len({r.max_tokens for r in requests}) > 1


def test_the_first_different_token_is_found_in_the_served_text(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(" The sky is blue because of Rayleigh scattering.")
    text = decode(smollm2_tokenizer, ids)
    assert first_difference(smollm2_tokenizer, ids, text) == len(ids)
    assert first_difference(smollm2_tokenizer, ids, decode(smollm2_tokenizer, ids[:4]) + " green") == 4
    assert first_difference(smollm2_tokenizer, ids, "") == 0


def test_compare_flags_other_text_another_token_count_another_finish_reason_and_errors(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(" one two three four")
    want = Expected(ids, decode(smollm2_tokenizer, ids), "length")
    served = [Served(want.text, len(ids), "length"), Served(want.text[:-2] + "ix", len(ids), "length"),
              Served(want.text, len(ids) + 1, "length"), Served(want.text, len(ids), "stop"),
              Served(error="RequestFailed: boom")]
    requests = [CheckRequest(i, "chat", "p", len(ids)) for i in range(len(served))]
    differences = compare(smollm2_tokenizer, requests, served, [want] * len(served))
    assert [d.request.index for d in differences] == [1, 2, 3, 4]
    assert differences[0].position == len(ids) - 1 and differences[1].position == len(ids)


@pytest.mark.slow
def test_24_requests_at_concurrency_8_get_the_tokens_they_get_alone(tiny_engine, tmp_path, capsys):
    """The real tritonserver (adaptive block size, one batching instance) against generate() alone."""
    rc = main(["check-batching", "--engine", str(tiny_engine), "--requests", "24", "--concurrency", "8",
               "--min-tokens", "1", "--max-tokens", "24", "--families", "chat,math,code", "--num-threads", "1",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "identical 24, different 0 (errors 0)" in out, out
    assert rc == 0
    assert "served 24/24" in out and "alone 24/24" in out


def test_the_report_counts_requests_and_tokens_and_shows_where_an_output_first_differs():
    from dflash_trt.benchmarks.batching_check import CheckReport, Difference
    from dflash_trt.commands.check_batching import format_report

    requests = [CheckRequest(i, "chat", "p", 4) for i in range(3)]
    expected = [Expected([5, 6, 7, 8], "abcd", "length")] * 3
    served = [Served("abcd", 4, "length"), Served("abxy", 4, "length"), Served(error="RequestFailed: boom")]
    differences = [Difference(requests[1], served[1], expected[1], 2),
                   Difference(requests[2], served[2], expected[2], 0)]
    text = format_report(CheckReport(requests, served, expected, differences))
    assert text.splitlines()[0] == ("requests 3, tokens served 8, reference 12; identical 1, different 2 "
                                    "(errors 1)")
    assert "request 1 (chat, max_tokens 4): first different token at position 2, reference token 7" in text
    assert "request 2 (chat, max_tokens 4): error: RequestFailed: boom" in text
