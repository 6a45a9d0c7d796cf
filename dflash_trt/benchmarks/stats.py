"""How sure a served ratio is: a confidence interval over the ratios of a level's rounds.

Each round of the serving benchmark runs DFlash and plain decoding back to back, so a round's ratio is one paired
measurement, and a shared machine's drift falls on both halves alike. What is left varies from round to round like
independent noise on the ratio's logarithm (a run 5% slower is as likely as one 5% faster), so the interval is
Student's t over the logarithms of the rounds' ratios, turned back into a ratio: the geometric mean's 95% interval.
Two identical plain servers (`--plain-control`) give the interval that the comparison cannot resolve.
"""

from __future__ import annotations

import math
import statistics

# Student's t quantile at 0.975 (a two-sided 95% interval) for 1..30 degrees of freedom.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# The normal quantile at 0.975; beyond the table, t's expansion in 1 / degrees of freedom (Cornish-Fisher), within
# 0.001 of the exact quantile there.
Z_975 = 1.959964


def t_quantile_975(degrees: int) -> float:
    """Student's t 0.975 quantile for `degrees` >= 1 degrees of freedom."""
    if degrees < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {degrees}")
    if degrees <= len(T_975):
        return T_975[degrees - 1]
    z = Z_975
    return z + (z ** 3 + z) / (4 * degrees) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * degrees ** 2)


def ratio_interval(ratios: list[float]) -> tuple[float, float] | None:
    """The 95% confidence interval of the rounds' (geometric) mean ratio; None for fewer than 3 positive ratios
    (with two rounds the interval reaches 12.7 standard errors either side of the mean, which says nothing)."""
    logs = [math.log(r) for r in ratios if r is not None and r > 0]
    if len(logs) < 3:
        return None
    mean, spread = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    half = t_quantile_975(len(logs) - 1) * spread
    return math.exp(mean - half), math.exp(mean + half)
