"""The load generator: latency bookkeeping per request, errors counted, streams replaced after a failure."""

from __future__ import annotations

import itertools
import time

import pytest

from dflash_trt.benchmarks.loadgen import percentile, run_level


class FakeStream:
    """Answers every request with chunks of 1, 3 and 2 tokens, 5 ms apart; `fail` makes it raise."""

    opened = 0

    def __init__(self, fail=False):
        FakeStream.opened += 1
        self.fail = fail

    def chunks(self, text, max_tokens, timeout_s=0.0, **params):
        if self.fail:
            raise RuntimeError("server said no")
        total = 0
        for size in (1, 3, 2):
            time.sleep(0.005)
            total += size
            yield {"text_output": "x" * size, "num_output_tokens": total}

    def close(self):
        pass


def test_records_ttft_and_one_gap_per_token_after_the_first_chunk():
    level = run_level(FakeStream, ["a", "b"], concurrency=2, duration_s=0.05, max_tokens=6)
    summary = level.summary()
    assert summary["num_requests"] >= 2 and summary["num_errors"] == 0
    assert all(r.num_output_tokens == 6 and len(r.token_gaps_s) == 5 for r in level.records)
    assert summary["output_tokens"] == 6 * summary["num_requests"]
    assert 0 < summary["ttft_ms"]["p50"] and summary["itl_ms"]["p50"] <= summary["itl_ms"]["p99"]
    assert summary["output_tokens_per_s"] > 0


class TickingStream:
    """Chunks of 1, 3 and 2 tokens, the shared clock one second later for each (no real waiting)."""

    def __init__(self, clock):
        self.clock = clock

    def chunks(self, text, max_tokens, timeout_s=0.0, **params):
        total = 0
        for size in (1, 3, 2):
            self.clock.now += 1.0
            total += size
            yield {"text_output": "x" * size, "num_output_tokens": total}

    def close(self):
        pass


def test_throughput_counts_the_tokens_that_arrived_while_the_load_was_applied():
    """The request in flight at the deadline is awaited, but its tokens after it count only in the figure with
    drain: tokens at t = 1, 2 (3 more) by the deadline 2.5, the last 2 at t = 3."""
    from types import SimpleNamespace

    clock = SimpleNamespace(now=0.0)
    level = run_level(lambda: TickingStream(clock), ["a"], concurrency=1, duration_s=2.5, max_tokens=6,
                      clock=lambda: clock.now)
    summary = level.summary()
    assert summary["num_requests"] == 1 and summary["output_tokens"] == 6
    assert level.records[0].tokens_under_load == 4
    assert summary["output_tokens_per_s"] == pytest.approx(4 / 2.5)
    assert summary["output_tokens_per_s_with_drain"] == pytest.approx(6 / 3.0)


def test_every_stream_measures_one_request_even_when_the_level_is_over_before_it_starts():
    """A loaded machine may start a worker thread after the level's duration: it still measures a request,
    so the counts do not depend on the machine's speed."""
    clock = itertools.count(0, 10).__next__  # every reading is 10 s later, past any deadline (thread-safe in C)
    level = run_level(FakeStream, ["a"], concurrency=3, duration_s=1.0, max_tokens=6, clock=clock)
    assert level.summary()["num_requests"] == 3 and all(r.ok for r in level.records)


def test_counts_errors_and_opens_a_new_stream_after_each():
    FakeStream.opened = 0
    level = run_level(lambda: FakeStream(fail=True), ["a"], concurrency=1, duration_s=0.02, max_tokens=6)
    summary = level.summary()
    assert summary["num_errors"] == summary["num_requests"] >= 1
    assert FakeStream.opened == summary["num_requests"]
    assert summary["error_examples"] == ["RuntimeError: server said no"] and summary["output_tokens"] == 0


def test_an_unreachable_server_is_an_error_not_a_crash():
    def refuse():
        raise ConnectionError("connection refused")

    summary = run_level(refuse, ["a"], concurrency=1, duration_s=0.01, max_tokens=6).summary()
    assert summary["num_errors"] >= 1 and "ConnectionError" in summary["error_examples"][0]


class RecordingStream:
    """Answers a request with one chunk of all its max tokens at once, recording what it was asked (no waiting)."""

    def __init__(self, clock, asked):
        self.clock, self.asked = clock, asked

    def chunks(self, text, max_tokens, timeout_s=0.0, **params):
        self.asked.append((text, max_tokens))
        self.clock.now += 1.0
        yield {"text_output": "x" * max_tokens, "num_output_tokens": max_tokens}

    def close(self):
        pass


def _asked(spread: int) -> list[tuple[str, int]]:
    from types import SimpleNamespace

    clock, asked = SimpleNamespace(now=0.0), []
    run_level(lambda: RecordingStream(clock, asked), ["a", "b", "c"], concurrency=1, duration_s=40, max_tokens=64,
              clock=lambda: clock.now, max_tokens_spread=spread)
    return asked


def test_request_lengths_spread_over_the_range_in_the_same_order_for_every_server():
    asked = _asked(16)
    lengths = [length for _, length in asked]
    assert len(asked) == 40 and [text for text, _ in asked[:4]] == ["a", "b", "c", "a"]
    assert all(48 <= length <= 80 for length in lengths) and len(set(lengths)) > 10
    assert min(lengths) < 56 and max(lengths) > 72  # the range is used, not a corner of it
    assert _asked(16) == asked  # a second server is sent the same requests
    assert {length for _, length in _asked(0)} == {64}


@pytest.mark.parametrize("spread", [-1, 64])
def test_a_spread_outside_the_request_length_is_refused(spread):
    from dflash_trt.benchmarks.loadgen import request_lengths

    with pytest.raises(ValueError, match="spread of request lengths"):
        next(request_lengths(64, spread))


@pytest.mark.parametrize("q, expected", [(0, 1.0), (50, 2.5), (100, 4.0)])
def test_percentile_interpolates(q, expected):
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == expected


def test_best_throughput_at_interactivity_keeps_levels_where_every_user_gets_the_floor():
    from dflash_trt.benchmarks.serving import best_at_interactivity

    def level(total, user_min, errors=0):
        return {"output_tokens_per_s": total, "num_errors": errors, "user_tokens_per_s": {"min": user_min, "p50": 0}}

    levels = {"1": level(50, 50), "4": level(150, 30), "16": level(300, 12), "32": level(320, 6)}
    assert best_at_interactivity(levels, 10) == {"level": 16, "output_tokens_per_s": 300}
    assert best_at_interactivity(levels, 40) == {"level": 1, "output_tokens_per_s": 50}
    assert best_at_interactivity(levels, 60) is None
    levels["16"]["num_errors"] = 1
    assert best_at_interactivity(levels, 10) == {"level": 4, "output_tokens_per_s": 150}


def test_user_tokens_per_s_is_each_requests_own_rate():
    from dflash_trt.benchmarks.loadgen import LoadLevel, RequestRecord

    records = [RequestRecord(0.0, 2.0, num_output_tokens=10, ttft_s=0.5), RequestRecord(1.0, 2.0, num_output_tokens=4,
                                                                                        ttft_s=0.2)]
    summary = LoadLevel(2, 2.0, records).summary()
    assert summary["user_tokens_per_s"] == {"min": 4.0, "p50": 4.5}
