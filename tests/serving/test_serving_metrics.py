"""Custom metrics: the project's names, the model label, histogram buckets, per-step counting."""

from __future__ import annotations

from dflash_trt.serving.metrics import ACCEPTANCE_BUCKETS, DRAFTING_COUNTERS, DFlashMetrics, drafting_figures

NAMES = {"dflash_requests_in_flight", "dflash_acceptance_length", "dflash_draft_tokens_total",
         "dflash_accepted_draft_tokens_total", "dflash_spec_steps_total", "dflash_generated_tokens_total",
         "dflash_plain_steps_total", "dflash_canary_acceptance_rate", "dflash_canary_acceptance_length",
         "dflash_canary_sampled_acceptance_rate", "dflash_canary_sampled_acceptance_length",
         "dflash_time_to_first_token_seconds", "dflash_inter_token_latency_seconds",
         "dflash_prefix_cache_queries_tokens_total", "dflash_prefix_cache_hits_tokens_total",
         "dflash_prefix_cache_bytes"}


def test_declares_the_metric_names_of_the_project_labelled_by_model(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    assert set(metrics.families) == NAMES
    assert all(m.labels == {"model": "dflash"} for f in metrics.families.values() for m in f.metrics)
    assert metrics.families["dflash_requests_in_flight"].kind == "gauge"
    assert metrics.families["dflash_acceptance_length"].kind == "histogram"
    assert metrics.acceptance.buckets == ACCEPTANCE_BUCKETS


def test_a_verify_step_updates_every_counter(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    metrics.step(acceptance_length=None, num_draft_tokens=0, num_sent_tokens=1)  # prefill token
    metrics.step(acceptance_length=4, num_draft_tokens=7, num_sent_tokens=4)
    values = {name: m.value for name, m in metrics.counters.items()}
    assert values == {"dflash_draft_tokens_total": 7, "dflash_accepted_draft_tokens_total": 3,
                      "dflash_spec_steps_total": 1, "dflash_generated_tokens_total": 5,
                      "dflash_plain_steps_total": 0, "dflash_prefix_cache_queries_tokens_total": 0,
                      "dflash_prefix_cache_hits_tokens_total": 0}
    assert metrics.acceptance.observations == [4]


def test_a_step_without_drafts_counts_as_plain(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    metrics.step(acceptance_length=1, num_draft_tokens=0, num_sent_tokens=1)  # the policy chose block size 1
    metrics.step(acceptance_length=2, num_draft_tokens=3, num_sent_tokens=2)
    assert metrics.counters["dflash_plain_steps_total"].value == 1
    assert metrics.counters["dflash_spec_steps_total"].value == 2


def test_drafting_figures_are_per_verify_step_between_two_scrapes():
    before = dict.fromkeys(DRAFTING_COUNTERS, 100.0)
    after = {"dflash_spec_steps_total": 110.0, "dflash_draft_tokens_total": 128.0,
             "dflash_plain_steps_total": 104.0, "dflash_accepted_draft_tokens_total": 112.0}
    figures = drafting_figures(before, after)
    assert figures == {"verify_steps": 10, "mean_block_size": 3.8, "plain_step_share": 0.4, "tau": 2.2}
    assert drafting_figures(before, before) is None  # no step in between


def test_in_flight_goes_up_and_down(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    metrics.request_started()
    metrics.request_started()
    metrics.request_finished()
    assert metrics.in_flight.value == 1


def test_the_canary_sets_its_gauges_greedy_and_sampled(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    metrics.canary(0.25, 2.75)
    assert metrics.families["dflash_canary_acceptance_rate"].kind == "gauge"
    assert metrics.canary_gauges["dflash_canary_acceptance_rate"].value == 0.25
    assert metrics.canary_gauges["dflash_canary_acceptance_length"].value == 2.75
    assert "dflash_canary_sampled_acceptance_rate" not in metrics.canary_gauges
    metrics.canary(0.125, 1.5, temperature=1.0)
    assert metrics.canary_gauges["dflash_canary_sampled_acceptance_rate"].value == 0.125
    assert metrics.canary_gauges["dflash_canary_sampled_acceptance_length"].value == 1.5
    assert metrics.canary_gauges["dflash_canary_acceptance_rate"].value == 0.25  # the greedy one is untouched


def test_a_request_clock_gives_time_to_first_token_then_inter_token_gaps(fake_pb):
    from dflash_trt.serving.metrics import RequestClock

    ticks = iter([10.0, 10.5, 10.75, 11.75])  # start, then the three releases (a step without one reads no time)
    clock = RequestClock(now=lambda: next(ticks))
    metrics = DFlashMetrics(fake_pb, "dflash")
    metrics.step(None, 0, 1, clock)
    metrics.step(3, 7, 0, clock)  # a step that released nothing (a stop word held back) is not a release
    metrics.step(3, 7, 3, clock)
    metrics.step(1, 7, 1, clock)
    assert metrics.latency["dflash_time_to_first_token_seconds"].observations == [0.5]
    assert metrics.latency["dflash_inter_token_latency_seconds"].observations == [0.25, 1.0]
    assert all(m.buckets for m in metrics.latency.values())


def test_the_prefix_cache_exports_its_token_counts_and_bytes(fake_pb):
    from types import SimpleNamespace

    metrics = DFlashMetrics(fake_pb, "dflash")
    cache = SimpleNamespace(queries_tokens=40, hits_tokens=32, bytes=1000)
    metrics.prefix_cache(cache)
    cache.queries_tokens, cache.hits_tokens, cache.bytes = 90, 48, 700
    metrics.prefix_cache(cache)
    counters = metrics.counters
    assert counters["dflash_prefix_cache_queries_tokens_total"].value == 90
    assert counters["dflash_prefix_cache_hits_tokens_total"].value == 48
    assert metrics.prefix_cache_bytes.value == 700
    metrics.prefix_cache(SimpleNamespace(queries_tokens=10, hits_tokens=0, bytes=0))  # a fresh scheduler's cache
    assert counters["dflash_prefix_cache_queries_tokens_total"].value == 100
