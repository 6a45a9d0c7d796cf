"""End to end: the dflash_* metrics are published on the metrics port and agree with the responses."""

from __future__ import annotations

import re
import urllib.request

import pytest
from triton_waits import metric_total, wait_for

from dflash_trt.serving.client import generate, generate_stream

pytestmark = pytest.mark.slow

BLOCK_SIZE = 8
LABEL = '{model="dflash"}'


def scrape(triton) -> dict[str, float]:
    with urllib.request.urlopen(triton.config.metrics_url, timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        match = re.match(r'^(dflash_\w+)\{model="dflash"(?:,le="([^"]+)")?\} (\S+)$', line)
        if match:
            name, le, value = match.groups()
            values[name + (f"[le={le}]" if le else "")] = float(value)
    return values


def test_metrics_are_published_with_the_model_label(triton):
    generate(triton.config.http_url, "hello", 4)
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")
    values = scrape(triton)
    for name in ("dflash_requests_in_flight", "dflash_draft_tokens_total", "dflash_accepted_draft_tokens_total",
                 "dflash_spec_steps_total", "dflash_generated_tokens_total", "dflash_acceptance_length_count",
                 "dflash_acceptance_length_sum", "dflash_plain_steps_total"):
        assert name in values, name
    assert values["dflash_requests_in_flight"] == 0


def test_metrics_agree_with_the_responses(triton):
    before = scrape(triton)
    answers = [generate(triton.config.http_url, f"count {i}", 5 + 3 * i, exclude_input_in_output=True)
               for i in range(3)]
    answers.append(list(generate_stream(triton.config.http_url, "streamed", 12))[-1])
    # The dflash model leaves the in-flight gauge just after its final response: wait for that, not a time.
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")
    after = scrape(triton)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    drafted = sum(a["total_draft_tokens"] for a in answers)
    steps = delta["dflash_spec_steps_total"]
    # A verify step drafts BLOCK_SIZE - 1 tokens at most (fewer when fewer tokens are left) and commits >= 1.
    assert drafted / (BLOCK_SIZE - 1) <= steps <= sum(a["num_output_tokens"] for a in answers)
    assert delta["dflash_generated_tokens_total"] == sum(a["num_output_tokens"] for a in answers)
    assert delta["dflash_draft_tokens_total"] == drafted
    assert delta["dflash_accepted_draft_tokens_total"] == sum(a["total_accepted_draft_tokens"] for a in answers)
    assert delta["dflash_acceptance_length_count"] == steps
    assert delta["dflash_acceptance_length_sum"] == steps + delta["dflash_accepted_draft_tokens_total"]
    assert after["dflash_requests_in_flight"] == 0


def test_the_load_time_canary_is_logged_and_exported(triton):
    values = scrape(triton)
    rate, tau = values["dflash_canary_acceptance_rate"], values["dflash_canary_acceptance_length"]
    assert 0.0 <= rate <= 1.0 and 1.0 <= tau <= BLOCK_SIZE
    sampled_rate = values["dflash_canary_sampled_acceptance_rate"]
    assert 0.0 <= sampled_rate <= 1.0 and 1.0 <= values["dflash_canary_sampled_acceptance_length"] <= BLOCK_SIZE
    lines = [line for line in triton.log.splitlines() if "dflash canary:" in line]
    assert len(lines) == 4  # greedy and sampled, per dflash instance of the served repository
    assert all(f"block_size {BLOCK_SIZE}" in line for line in lines)
    assert sum("sampled at temperature 1:" in line for line in lines) == 2


def test_time_to_first_token_is_observed_once_per_request_and_gaps_per_later_release(triton):
    before = scrape(triton)
    streamed = list(generate_stream(triton.config.http_url, "latency", 12))
    generate(triton.config.http_url, "latency too", 6)
    # Metrics are updated before the final response goes out; wait for the requests to leave, not a time.
    wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")
    after = scrape(triton)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    assert delta["dflash_time_to_first_token_seconds_count"] == 2
    releases = len([chunk for chunk in streamed if chunk["text_output"]])
    assert delta["dflash_inter_token_latency_seconds_count"] >= releases - 1
    assert delta["dflash_time_to_first_token_seconds_sum"] > 0


def test_triton_exports_the_metrics_the_chart_alerts_on(triton):
    from dflash_trt.serving.metrics import TRITON_METRICS

    generate(triton.config.http_url, "hello", 2)
    with urllib.request.urlopen(triton.config.metrics_url, timeout=10) as response:
        page = response.read().decode()
    for name in TRITON_METRICS:
        assert re.search(rf'^{name}\{{[^}}]*model="(ensemble|dflash)"', page, re.M), name


def test_a_repeated_prompt_is_served_from_the_prefix_cache_and_counted(triton):
    """The repository's default prefix cache: a request repeating a long prompt reuses its blocks (each of the two
    dflash instances has its own cache, so it is sent until both have seen it); each response says how many prompt
    tokens it reused, the counters agree with them, the gauge holds the blocks, and every answer is the same."""
    prompt = "A long system prompt shared by every request of this test. " * 6 + "First question?"
    before = scrape(triton)
    answers = []
    for _ in range(4):
        answers.append(generate(triton.config.http_url, prompt, 6, exclude_input_in_output=True))
        wait_for(lambda: metric_total(triton, "dflash_requests_in_flight") == 0, "no request in flight")
    after = scrape(triton)
    assert len({a["text_output"] for a in answers}) == 1
    cached = [a["num_cached_tokens"] for a in answers]
    assert cached[0] == 0 and max(cached) >= 32 and all(c % 16 == 0 for c in cached), cached
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    assert delta["dflash_prefix_cache_hits_tokens_total"] == sum(cached)
    assert delta["dflash_prefix_cache_queries_tokens_total"] > sum(cached)
    assert after["dflash_prefix_cache_bytes"] > 0
