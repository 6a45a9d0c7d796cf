"""Acceptance statistics from TensorRT-LLM's results (trtllm_stats.py), against stand-ins of its documented
RequestOutput fields: spec_dec_totals, request_perf_metrics.speculative_decoding, decoding_iter,
avg_decoded_tokens_per_iter. Streams are scripted per decoding iteration, then grouped by stream_interval."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dflash_trt.serving.generation import Stats, chunks
from dflash_trt.serving.requests import GenerationRequest
from dflash_trt.serving.trtllm_stats import ZERO_COUNTERS_NOTICE, AcceptanceReader, Cursor

MAX_DRAFT_LEN = 7
# Accepted drafts of each verify iteration (the prefill iteration comes first and commits one token).
ACCEPTED = [3, 0, 5, 2, 7, 1, 0, 4, 6, 2]


def stream(accepted=ACCEPTED, interval=1, totals=True, perf="exact", iterations=True, average=False):
    """RequestOutputs of one request: `interval` decoding iterations per response, like stream_interval.

    totals: attach spec_dec_totals; perf: "exact", "zero" (the PyTorch flow before PR #17082) or None;
    iterations: attach decoding_iter; average: attach avg_decoded_tokens_per_iter instead.
    """
    per_iteration = [[100]] + [[100 + i] * (a + 1) for i, a in enumerate(accepted, 1)]
    outputs, tokens, drafted, accepted_total = [], [], 0, 0
    groups = [per_iteration[i:i + interval] for i in range(0, len(per_iteration), interval)]
    done = 0
    for n, group in enumerate(groups):
        new = [t for ids in group for t in ids]
        tokens += new
        verify = [len(ids) - 1 for ids in group] if n else [len(ids) - 1 for ids in group[1:]]
        done += len(group)
        drafted += MAX_DRAFT_LEN * len(verify)
        accepted_total += sum(verify)
        finished = n == len(groups) - 1
        spec = SimpleNamespace(total_draft_tokens=drafted if perf == "exact" else 0,
                               total_accepted_draft_tokens=accepted_total if perf == "exact" else 0)
        completion = SimpleNamespace(token_ids_diff=new, finish_reason="length" if finished else None,
                                     request_perf_metrics=SimpleNamespace(speculative_decoding=spec) if perf else None)
        output = SimpleNamespace(outputs=[completion], finished=finished,
                                 spec_dec_totals=(accepted_total, drafted) if totals else None)
        if iterations:
            output.decoding_iter = done
        if average:
            output.avg_decoded_tokens_per_iter = len(tokens) / done
        outputs.append(output)
    return outputs


def run(outputs, reader=None):
    reader = reader or AcceptanceReader(MAX_DRAFT_LEN, warn=lambda message: None)
    cursor = Cursor()
    return [step for output in outputs for step in reader.steps(output, cursor)]


def stats_of(steps):
    stats = Stats(block_size=MAX_DRAFT_LEN + 1)
    list(chunks(GenerationRequest("x", 200, stream=True), [1], steps, None, stats))
    return stats


def expect_exact(stats):
    assert stats.num_spec_steps == len(ACCEPTED)
    assert stats.total_accepted_draft_tokens == sum(ACCEPTED)
    assert stats.total_draft_tokens == MAX_DRAFT_LEN * len(ACCEPTED)
    assert stats.tau == pytest.approx(1 + sum(ACCEPTED) / len(ACCEPTED))
    assert stats.num_output_tokens == 1 + sum(a + 1 for a in ACCEPTED)


def test_one_iteration_per_response_gives_every_verify_steps_acceptance():
    steps = run(stream())
    assert steps[0].acceptance_length is None and steps[0].new_token_ids == [100]
    assert [s.acceptance_length for s in steps[1:]] == [a + 1 for a in ACCEPTED]
    assert all(s.num_draft_tokens == MAX_DRAFT_LEN for s in steps[1:])
    assert steps[-1].is_final and steps[-1].finish_reason == "length" and not any(s.is_final for s in steps[:-1])
    expect_exact(stats_of(steps))


@pytest.mark.parametrize("interval", [2, 3, 4, 20])
def test_stream_interval_keeps_tau_and_the_counters_exact(interval):
    steps = run(stream(interval=interval))
    expect_exact(stats_of(steps))
    tokens = [t for s in steps for t in s.new_token_ids]
    assert len(tokens) == 1 + sum(a + 1 for a in ACCEPTED)  # every token once, in order
    lengths = [s.acceptance_length for s in steps if s.acceptance_length is not None]
    assert all(1 <= n <= MAX_DRAFT_LEN + 1 for n in lengths)


def test_spec_dec_totals_win_over_zeroed_perf_metrics_without_a_notice():
    notices = []
    steps = run(stream(perf="zero"), AcceptanceReader(MAX_DRAFT_LEN, warn=notices.append))
    expect_exact(stats_of(steps))
    assert notices == []


@pytest.mark.parametrize("interval", [1, 4])
def test_zeroed_counters_fall_back_to_tokens_per_iteration_and_say_so_once(interval):
    notices = []
    reader = AcceptanceReader(MAX_DRAFT_LEN, warn=notices.append)
    for _ in range(3):  # three requests, one notice
        expect_exact(stats_of(run(stream(interval=interval, totals=False, perf="zero"), reader)))
    assert notices == [ZERO_COUNTERS_NOTICE]


def test_average_tokens_per_iteration_stands_in_for_the_iteration_count():
    steps = run(stream(interval=3, totals=False, perf="zero", iterations=False, average=True))
    expect_exact(stats_of(steps))


def test_a_drafter_that_is_never_accepted_reads_as_tau_one_not_as_missing_data():
    stats = stats_of(run(stream(accepted=[0] * 6, totals=False, perf="zero")))
    assert (stats.num_spec_steps, stats.total_draft_tokens, stats.total_accepted_draft_tokens) == (6, 42, 0)
    assert stats.tau == 1.0 and stats.acceptance_rate == 0.0


def test_exact_counters_without_iterations_count_steps_from_the_drafts():
    steps = run(stream(interval=2, iterations=False))
    expect_exact(stats_of(steps))


def test_nothing_but_tokens_counts_one_step_per_response():
    steps = run(stream(totals=False, perf=None, iterations=False))
    assert [s.acceptance_length for s in steps[1:]] == [a + 1 for a in ACCEPTED]


def test_prefill_only_response_then_final_flag():
    prefill = stream(accepted=[])
    assert [(s.new_token_ids, s.acceptance_length, s.is_final) for s in run(prefill)] == [([100], None, True)]
