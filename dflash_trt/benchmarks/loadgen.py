"""Closed-loop load generator: N workers, each with its own gRPC stream, send streaming requests
back to back for a fixed duration; requests started before the deadline are awaited.

Latency definitions (per request, then pooled over the requests of one level):
- time to first token (TTFT): from sending the request to the first response that carries tokens;
- inter-token latency (ITL): the gap between two responses divided over the tokens of the later one,
  one sample per token, so a DFlash chunk of 5 tokens after 50 ms counts as 5 tokens at 10 ms;
- time per output token (TPOT): (end - first token) / (tokens - 1), averaged over requests;
- output tokens/s: tokens of the successful requests that arrived while the level's load was applied (from its
  start to its deadline, `concurrency` requests in flight throughout) / that time. The requests still in flight
  at the deadline are awaited but their later tokens are not counted: after the deadline fewer and fewer requests
  are in flight (the level is over), and how long that drain lasts depends on where the requests of the last round
  stand at the deadline, not on the server: with 64 tokens a request and 32 in flight one round lasts 8 s on a 2-core
  CPU, so the drain of a 20 s level is up to a third of its time;
- output tokens/s with drain: every token of the successful requests / (last completion - start of the level);
- user tokens/s: one request's tokens / its own time from sending to the last token (what one user sees).
"""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from dflash_trt.benchmarks.workers import StreamSlot, run_workers


class Stream(Protocol):
    """What a worker needs from a client (dflash_trt.serving.client.GrpcStream)."""

    def chunks(self, text: str, max_tokens: int, timeout_s: float = ..., **params): ...

    def close(self) -> None: ...


@dataclass
class RequestRecord:
    start_s: float
    end_s: float
    num_output_tokens: int = 0
    ttft_s: float | None = None
    token_gaps_s: list[float] = field(default_factory=list)
    error: str = ""
    tokens_under_load: int | None = None  # tokens that arrived by the level's deadline (None: every token)

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def user_tokens_per_s(self) -> float | None:
        elapsed = self.end_s - self.start_s
        return self.num_output_tokens / elapsed if elapsed > 0 and self.num_output_tokens else None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.num_output_tokens < 2:
            return None
        return (self.end_s - self.start_s - self.ttft_s) / (self.num_output_tokens - 1)


@dataclass
class LoadLevel:
    """The requests of one concurrency level and the wall time they took."""

    concurrency: int
    duration_s: float  # from the start to the last completion
    records: list[RequestRecord]
    load_s: float | None = None  # from the start to the deadline (None: the whole duration)

    def summary(self) -> dict:
        ok = [r for r in self.records if r.ok]
        tokens = sum(r.num_output_tokens for r in ok)
        under_load = sum(r.num_output_tokens if r.tokens_under_load is None else r.tokens_under_load for r in ok)
        load_s = self.load_s or self.duration_s
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        gaps = [g for r in ok for g in r.token_gaps_s]
        tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
        errors = [r.error for r in self.records if not r.ok]
        users = [r.user_tokens_per_s for r in ok if r.user_tokens_per_s is not None]
        return {
            "concurrency": self.concurrency,
            "duration_s": self.duration_s,
            "num_requests": len(self.records),
            "num_errors": len(errors),
            "error_examples": sorted(set(errors))[:3],
            "output_tokens": tokens,
            "output_tokens_per_s": under_load / load_s if load_s > 0 else 0.0,
            "output_tokens_per_s_with_drain": tokens / self.duration_s if self.duration_s > 0 else 0.0,
            "requests_per_s": len(ok) / self.duration_s if self.duration_s > 0 else 0.0,
            "ttft_ms": _percentiles(ttft),
            "itl_ms": _percentiles(gaps),
            "tpot_ms": 1e3 * statistics.fmean(tpot) if tpot else None,
            "user_tokens_per_s": {"min": min(users), "p50": percentile(users, 50)} if users else None,
        }


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _percentiles(seconds: list[float]) -> dict:
    if not seconds:
        return {"p50": None, "p99": None, "mean": None}
    return {"p50": 1e3 * percentile(seconds, 50), "p99": 1e3 * percentile(seconds, 99),
            "mean": 1e3 * statistics.fmean(seconds)}


def run_level(open_stream: Callable[[], Stream], prompts: list[str], concurrency: int, duration_s: float,
              max_tokens: int, request_timeout_s: float = 600.0, clock=time.perf_counter, max_tokens_spread: int = 0,
              **params) -> LoadLevel:
    """Keep `concurrency` requests in flight for duration_s (at least one each); returns every request's record,
    with the tokens that arrived by the deadline counted apart (module docstring: output tokens/s). Requests ask
    for max_tokens +- max_tokens_spread tokens (request_lengths)."""
    requests = zip(itertools.cycle(prompts), request_lengths(max_tokens, max_tokens_spread))
    lock = threading.Lock()
    records: list[RequestRecord] = []
    start = clock()
    deadline = start + duration_s

    def next_request() -> tuple[str, int]:
        with lock:
            return next(requests)

    def work(slot: StreamSlot) -> None:
        while True:  # every stream measures at least one request, however late a loaded machine starts it
            record = _open(slot, clock)
            if record is None:
                prompt, length = next_request()
                record = _one_request(slot.get(), prompt, length, request_timeout_s, clock, params, deadline)
            with lock:
                records.append(record)
            if not record.ok:
                slot.reset()
            if clock() >= deadline:
                break

    run_workers(concurrency, work, open_stream, "load")
    end = max((r.end_s for r in records), default=clock())
    return LoadLevel(concurrency, end - start, sorted(records, key=lambda r: r.start_s), load_s=duration_s)


def request_lengths(max_tokens: int, spread: int, seed: int = 0) -> Iterator[int]:
    """The max tokens of the requests in the order they are sent: max_tokens, or with a spread, uniform in
    max_tokens +- spread from a seeded stream (every server of a comparison is sent the same lengths in the same
    order). Real requests differ in length, and with one length a server that never drafts keeps its requests in
    step: they finish at the same step and their successors are prefilled in one group, while a server whose steps
    commit different tokens per row sees them finish one by one, each successor prefilled alone."""
    if spread < 0 or spread >= max_tokens:
        raise ValueError(f"the spread of request lengths must be in [0, {max_tokens}), got {spread}")
    rng = random.Random(seed)
    while True:
        yield max_tokens + rng.randint(-spread, spread) if spread else max_tokens


def _one_request(stream: Stream, text: str, max_tokens: int, timeout_s: float, clock, params: dict,
                 deadline: float) -> RequestRecord:
    record = RequestRecord(start_s=clock(), end_s=0.0, tokens_under_load=0)
    last = record.start_s
    try:
        for chunk in stream.chunks(text, max_tokens, timeout_s=timeout_s, **params):
            now = clock()
            total = int(chunk.get("num_output_tokens", record.num_output_tokens))
            new = total - record.num_output_tokens
            if new <= 0:
                continue
            if record.ttft_s is None:
                record.ttft_s = now - record.start_s
            else:
                record.token_gaps_s += [(now - last) / new] * new
            record.num_output_tokens, last = total, now
            if now <= deadline:
                record.tokens_under_load = total
    except Exception as error:  # noqa: BLE001 - every failure is a counted error, not a crash of the run
        record.error = f"{type(error).__name__}: {error}".strip()[:300]
    record.end_s = clock()
    return record


def _open(slot: StreamSlot, clock) -> RequestRecord | None:
    """None when the slot has a stream (opened now if needed), else an error record: the server cannot be reached."""
    start = clock()
    try:
        slot.get()
        return None
    except Exception as error:  # noqa: BLE001 - counted like a failed request
        time.sleep(0.5)  # do not spin on a server that is down
        return RequestRecord(start, clock(), error=f"{type(error).__name__}: {error}"[:300])
