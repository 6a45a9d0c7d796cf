"""Custom Prometheus metrics of the dflash model, through the Python backend's metric API.

Triton publishes them on its metrics port next to its own nv_inference_* metrics. The
MetricFamily objects are kept on the instance: the backend deletes a family (and its metrics)
when the Python object goes away.
"""

from __future__ import annotations

import threading
import time

# Acceptance length is 1 .. block_size; buckets cover block sizes up to 16.
ACCEPTANCE_BUCKETS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]

COUNTERS = {
    "dflash_draft_tokens_total": "Draft tokens proposed by the DFlash drafter",
    "dflash_accepted_draft_tokens_total": "Draft tokens accepted by the target",
    "dflash_spec_steps_total": "Verify steps (one target forward each)",
    "dflash_plain_steps_total": "Verify steps that drafted nothing (block size 1: the policy chose plain decoding)",
    "dflash_generated_tokens_total": "Tokens sent to clients",
    "dflash_prefix_cache_queries_tokens_total": "Prompt tokens looked up in the prefix cache",
    "dflash_prefix_cache_hits_tokens_total": "Prompt tokens served from the prefix cache (not computed)",
}
PREFIX_CACHE_COUNTERS = {"queries_tokens": "dflash_prefix_cache_queries_tokens_total",
                         "hits_tokens": "dflash_prefix_cache_hits_tokens_total"}
# Seconds from a request's arrival at the dflash model to its first token, and between two token releases
# of one request (a release carries the 1 + accepted tokens of a verify step, or several steps' worth).
LATENCY_HISTOGRAMS = {
    "dflash_time_to_first_token_seconds": ("Seconds from request start to its first token",
                                           [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]),
    "dflash_inter_token_latency_seconds": ("Seconds between two token releases of one request",
                                           [0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5]),
}
# Triton's own per-model metrics (nv_inference_*) that the chart's PrometheusRule and dashboard read; the
# serving tests check that the real tritonserver exports each of them.
TRITON_METRICS = ("nv_inference_request_success", "nv_inference_request_failure",
                  "nv_inference_pending_request_count", "nv_inference_queue_duration_us")
# Set once per model instance by the canary generations at load (canary.py): greedy, and sampled (T > 0).
CANARY_GAUGES = {
    "dflash_canary_acceptance_rate": "Accepted share of draft tokens in the greedy load-time canary generation",
    "dflash_canary_acceptance_length": "Mean tokens per verify step (tau) in the greedy load-time canary generation",
    "dflash_canary_sampled_acceptance_rate": "Accepted share of draft tokens in the sampled (T > 0) load-time "
                                             "canary generation",
    "dflash_canary_sampled_acceptance_length": "Mean tokens per verify step (tau) in the sampled (T > 0) "
                                               "load-time canary generation",
}


class DFlashMetrics:
    """The metric names of the project, labelled with `model`."""

    def __init__(self, pb, model_name: str):
        labels = {"model": model_name}
        kinds = pb.MetricFamily
        self.families = {
            name: kinds(name=name, description=text, kind=kinds.COUNTER) for name, text in COUNTERS.items()
        }
        self.families["dflash_requests_in_flight"] = kinds(
            name="dflash_requests_in_flight", description="Generation requests being served", kind=kinds.GAUGE
        )
        self.families["dflash_prefix_cache_bytes"] = kinds(
            name="dflash_prefix_cache_bytes", description="Bytes the prefix cache holds (target KV and drafter "
            "features of cached prompt blocks)", kind=kinds.GAUGE)
        for name, text in CANARY_GAUGES.items():
            self.families[name] = kinds(name=name, description=text, kind=kinds.GAUGE)
        for name, (text, _buckets) in LATENCY_HISTOGRAMS.items():
            self.families[name] = kinds(name=name, description=text, kind=kinds.HISTOGRAM)
        self.families["dflash_acceptance_length"] = kinds(
            name="dflash_acceptance_length",
            description="Tokens committed per verify step (accepted drafts + 1)",
            kind=kinds.HISTOGRAM,
        )
        self.counters = {name: self.families[name].Metric(labels=labels) for name in COUNTERS}
        self.in_flight = self.families["dflash_requests_in_flight"].Metric(labels=labels)
        self.prefix_cache_bytes = self.families["dflash_prefix_cache_bytes"].Metric(labels=labels)
        self._prefix_cache_seen: tuple[object, dict[str, int]] = (None, {})  # (cache, its totals exported so far)
        self.acceptance = self.families["dflash_acceptance_length"].Metric(labels=labels, buckets=ACCEPTANCE_BUCKETS)
        self._labels = labels
        self.canary_gauges = {}  # created by canary(): a model without a canary exports no canary value
        self.latency = {name: self.families[name].Metric(labels=labels, buckets=buckets)
                        for name, (_text, buckets) in LATENCY_HISTOGRAMS.items()}
        self._lock = threading.Lock()  # requests may run on several threads of one instance

    def request_started(self) -> None:
        with self._lock:
            self.in_flight.increment(1)

    def request_finished(self) -> None:
        with self._lock:
            self.in_flight.increment(-1)

    def clock(self) -> "RequestClock":
        """A request's clock for the latency histograms; pass it to every step() of that request."""
        return RequestClock()

    def step(self, acceptance_length: int | None, num_draft_tokens: int, num_sent_tokens: int,
             clock: "RequestClock | None" = None) -> None:
        """One decoding step; acceptance_length None for the prefill token (no verify step)."""
        if clock is not None and num_sent_tokens:
            name, seconds = clock.release()
            with self._lock:
                self.latency[name].observe(seconds)
        with self._lock:
            if acceptance_length is not None:
                self.acceptance.observe(acceptance_length)
                self.counters["dflash_spec_steps_total"].increment(1)
                self.counters["dflash_draft_tokens_total"].increment(num_draft_tokens)
                if num_draft_tokens == 0:
                    self.counters["dflash_plain_steps_total"].increment(1)
                self.counters["dflash_accepted_draft_tokens_total"].increment(acceptance_length - 1)
            if num_sent_tokens:
                self.counters["dflash_generated_tokens_total"].increment(num_sent_tokens)

    def prefix_cache(self, cache) -> None:
        """Export a scheduler's prefix cache (prefix_cache.PrefixCache): its cumulative token counts as counter
        increments since the last call, its bytes as the gauge. A new cache (a fresh scheduler) starts over."""
        with self._lock:
            owner, seen = self._prefix_cache_seen
            if owner is not cache:
                seen = {}
            for field, name in PREFIX_CACHE_COUNTERS.items():
                total = getattr(cache, field)
                self.counters[name].increment(total - seen.get(field, 0))
                seen[field] = total
            self._prefix_cache_seen = (cache, seen)
            self.prefix_cache_bytes.set(cache.bytes)

    def canary(self, acceptance_rate: float, tau: float, temperature: float = 0.0) -> None:
        """What a load-time canary generation measured (canary.py), greedy or sampled (temperature > 0)."""
        prefix = "dflash_canary_sampled_" if temperature > 0 else "dflash_canary_"
        with self._lock:
            for name, value in ((prefix + "acceptance_rate", acceptance_rate), (prefix + "acceptance_length", tau)):
                if name not in self.canary_gauges:
                    self.canary_gauges[name] = self.families[name].Metric(labels=self._labels)
                self.canary_gauges[name].set(value)


def scrape_totals(metrics_url: str, names, timeout_s: float = 10.0) -> dict[str, float]:
    """Each named metric summed over its labels, read from Triton's metrics port (0 when absent)."""
    import re
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        text = response.read().decode()
    return {name: sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE))
            for name in names}


def drafting_figures(before: dict[str, float], after: dict[str, float]) -> dict | None:
    """What the drafter did between two scrapes of DRAFTING_COUNTERS, per verify step of a sequence:
    mean_block_size (tokens verified: drafts + 1), plain_step_share (steps with no drafts), tau."""
    delta = {name: after[name] - before[name] for name in DRAFTING_COUNTERS}
    steps = delta["dflash_spec_steps_total"]
    if steps <= 0:
        return None
    return {"verify_steps": int(steps),
            "mean_block_size": 1 + delta["dflash_draft_tokens_total"] / steps,
            "plain_step_share": delta["dflash_plain_steps_total"] / steps,
            "tau": 1 + delta["dflash_accepted_draft_tokens_total"] / steps}


DRAFTING_COUNTERS = ("dflash_spec_steps_total", "dflash_draft_tokens_total", "dflash_plain_steps_total",
                     "dflash_accepted_draft_tokens_total")


class RequestClock:
    """When a request started and when it last released tokens (monotonic clock)."""

    def __init__(self, now=time.monotonic):
        self._now = now
        self._last = now()
        self._has_released = False

    def release(self) -> tuple[str, float]:
        """(histogram name, seconds) for a token release now: time to first token, then inter-token."""
        now = self._now()
        seconds, self._last = now - self._last, now
        name = "dflash_inter_token_latency_seconds" if self._has_released else "dflash_time_to_first_token_seconds"
        self._has_released = True
        return name, seconds


class NoMetrics:
    """Stand-in where no metric API exists (in-process use, benchmarks)."""

    def request_started(self) -> None:
        pass

    def request_finished(self) -> None:
        pass

    def clock(self) -> None:
        return None

    def step(self, acceptance_length, num_draft_tokens, num_sent_tokens, clock=None) -> None:
        pass

    def canary(self, acceptance_rate, tau, temperature=0.0) -> None:
        pass

    def prefix_cache(self, cache) -> None:
        pass
