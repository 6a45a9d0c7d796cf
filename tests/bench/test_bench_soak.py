"""The soak benchmark's pieces that need no server: its seeded request mix and how it reads the RSS curve."""

from __future__ import annotations

from dflash_trt.benchmarks.soak import KINDS, Sample, SoakConfig, SoakResult, growth_per_1000, request_plan, summary


def test_the_request_mix_is_seeded_and_mixed():
    config = SoakConfig(requests=300, max_new_tokens=16, seed=3)
    plan = request_plan(config)
    assert plan == request_plan(config) and plan != request_plan(SoakConfig(requests=300, seed=4))
    assert {kind for kind, _, _ in plan} == set(KINDS)
    assert all(1 <= max_tokens <= 16 for _, _, max_tokens in plan)
    assert len({len(prompt.split()) for _, prompt, _ in plan}) > 3  # several prompt lengths


def curve(values: list[float]) -> SoakResult:
    return SoakResult(samples=[Sample(i * 100, i * 10.0, {"dflash_0_0": v}) for i, v in enumerate(values)])


def test_growth_is_the_second_halfs_slope_per_1000_requests():
    levelled = curve([1600, 1900, 1950, 1960, 1955, 1958, 1957, 1956])
    leaking = curve([1600, 1700, 1800, 1900, 2000, 2100, 2200, 2300])
    assert abs(growth_per_1000(levelled.samples, "dflash_0_0")) < 10
    assert growth_per_1000(leaking.samples, "dflash_0_0") == 1000.0  # +100 MiB per 100 requests
    report = summary(leaking)
    assert report["processes"]["dflash_0_0"]["after_warmup_mib"] == 1700
    assert report["processes"]["dflash_0_0"]["peak_mib"] == 2300 and len(report["curve"]) == 8
