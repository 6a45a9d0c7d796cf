"""The rules sampling values must follow, without torch: SamplingParams and the serving layer's request
validation (which runs in processes that never load torch) share them."""

from __future__ import annotations

import math


def sampling_problem(temperature: float, top_k: int, top_p: float, min_tokens: int = 0,
                     repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                     frequency_penalty: float = 0.0) -> str | None:
    """The first thing wrong with these sampling values, or None: the one home of the rules, which
    SamplingParams raises as a DFlashError and the serving layer as a 400 (serving/requests.py)."""
    if not (math.isfinite(temperature) and temperature >= 0):
        return f"temperature must be >= 0, got {temperature:g}"
    if top_k < 0:
        return f"top_k must be >= 0, got {top_k}"
    if not 0 < top_p <= 1:
        return f"top_p must be in (0, 1], got {top_p:g}"
    if min_tokens < 0:
        return f"min_tokens must be >= 0, got {min_tokens}"
    if not (math.isfinite(repetition_penalty) and repetition_penalty > 0):
        return f"repetition_penalty must be a finite number > 0, got {repetition_penalty:g}"
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not math.isfinite(value):
            return f"{name} must be a finite number, got {value:g}"
    return None
