"""The pure part of gpu-check: results, the speedup and bandwidth maths, the table and the JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The paper's mean acceptance length on Qwen3-8B (its 4.86x speedup was measured at this tau).
PAPER_TAU = 6.49
# Nominal HBM bandwidth (GB/s) by device name; the measured copy bandwidth is reported beside it.
NOMINAL_BANDWIDTH_GBS = {"H200": 4800.0, "H100": 3350.0, "B200": 8000.0, "GB200": 8000.0, "A100": 2039.0}
STATUSES = ("pass", "fail", "error", "skipped")


@dataclass
class Section:
    name: str
    status: str = "pass"                 # pass | fail | error | skipped
    message: str = ""                    # one line: why it failed, errored or was skipped
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def implied_speedup(tau: float, t_ar: float, t_draft: float, t_verify: float) -> float:
    """Speedup over autoregressive decoding when each step commits tau tokens: tau x t_AR / (t_draft + t_verify)."""
    if min(t_ar, t_draft, t_verify) <= 0 or tau <= 0:
        raise ValueError("times and tau must be positive")
    return tau * t_ar / (t_draft + t_verify)


def attention_bytes(total_lens: list[int], new_rows: list[int], block: int, heads: int, kv_heads: int,
                    head_dim: int, element_bytes: int) -> int:
    """DRAM bytes one draft-attention call must move at least: the cache read (K and V of every cached row), the new
    rows written, the block's q, k, v in and out (the plugin README's byte model, one row tile)."""
    row = head_dim * element_bytes
    batch = len(total_lens)
    cache = 2 * sum(total_lens) * kv_heads * row
    appended = 4 * sum(new_rows) * kv_heads * row  # ctx k, v in; cache rows out
    block_io = batch * block * (2 * heads + 2 * kv_heads) * row
    return cache + appended + block_io


def floor_us(num_bytes: int, bandwidth_gbs: float) -> float:
    """Time to move num_bytes at bandwidth_gbs (GB/s = 1e9 B/s), in microseconds."""
    return num_bytes / (bandwidth_gbs * 1e3)


def nominal_bandwidth(device_name: str) -> float | None:
    for key, value in NOMINAL_BANDWIDTH_GBS.items():
        if key in device_name:
            return value
    return None


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows (dicts) as an aligned text table; columns in order of first appearance."""
    if not rows:
        return ""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def format_report(sections: list[Section]) -> str:
    out = []
    for s in sections:
        out.append(f"== {s.name}: {s.status.upper()} ({s.seconds:.0f} s){' - ' + s.message if s.message else ''}")
        table = format_table(s.rows)
        if table:
            out.append(table)
    return "\n".join(out)


def exit_code(sections: list[Section]) -> int:
    """0 when no section failed or errored (skipped sections say why in the report), else 1."""
    return 0 if all(s.status in ("pass", "skipped") for s in sections) else 1


def write_json(path: str | Path, sections: list[Section], meta: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "sections": [asdict(s) for s in sections], "ok": exit_code(sections) == 0}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def targets(sections: list[Section]) -> Section:
    """The issue's targets, judged from the timing sections' rows (not met is reported, not failed: these are
    performance goals, and the check's exit code is about correctness)."""
    section = Section("targets")
    by_name = {s.name: s for s in sections}
    kernel = next((s for n, s in by_name.items() if n.startswith("kernel time")), None)
    steps = next((s for n, s in by_name.items() if n.startswith("step times")), None)
    if kernel is not None:
        for row in kernel.rows:
            if row.get("batch") == 1 and row.get("context") in (8192, 32768):
                share = row.get("pct_of_nominal_hbm", 100.0 * row["floor_us_copy_bw"] / row["kernel_us"])
                section.rows.append({"target": f"kernel >= 50% of HBM, batch 1, {row['context']} keys",
                                     "value": share, "met": share >= 50.0})
                section.rows.append({"target": f"kernel not slower than SDPA, batch 1, {row['context']} keys",
                                     "value": row["sdpa_us"] / row["kernel_us"],
                                     "met": row["kernel_us"] <= row["sdpa_us"]})
    if steps is not None:
        for row in steps.rows:
            if row.get("batch") == 1:
                ratio = min(row["verify_over_AR"], row.get("verify_over_AR_graphed", float("inf")))
                section.rows.append({"target": "t_verify(16) / t_AR <= 1.3, batch 1", "value": ratio,
                                     "met": ratio <= 1.3})
                best = max(row["implied_speedup"], row.get("implied_speedup_graphed_draft", 0.0),
                           row.get("implied_speedup_graphed", 0.0))
                section.rows.append({"target": f"implied speedup >= 4.5x at tau {PAPER_TAU}, batch 1", "value": best,
                                     "met": best >= 4.5})
    if not section.rows:
        section.status, section.message = "skipped", "no timing section ran"
    else:
        section.message = f"{sum(r['met'] for r in section.rows)} of {len(section.rows)} met"
    return section
