"""Custom metrics: the project's names, the model label, histogram buckets, per-step counting."""

from __future__ import annotations

from dflash_trt.serving.metrics import ACCEPTANCE_BUCKETS, DFlashMetrics

NAMES = {"dflash_requests_in_flight", "dflash_acceptance_length", "dflash_draft_tokens_total",
         "dflash_accepted_draft_tokens_total", "dflash_spec_steps_total", "dflash_generated_tokens_total",
         "dflash_canary_acceptance_rate", "dflash_canary_acceptance_length"}


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
                      "dflash_spec_steps_total": 1, "dflash_generated_tokens_total": 5}
    assert metrics.acceptance.observations == [4]


def test_in_flight_goes_up_and_down(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    metrics.request_started()
    metrics.request_started()
    metrics.request_finished()
    assert metrics.in_flight.value == 1


def test_the_canary_sets_its_two_gauges(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    metrics.canary(0.25, 2.75)
    assert metrics.families["dflash_canary_acceptance_rate"].kind == "gauge"
    assert metrics.canary_gauges["dflash_canary_acceptance_rate"].value == 0.25
    assert metrics.canary_gauges["dflash_canary_acceptance_length"].value == 2.75
