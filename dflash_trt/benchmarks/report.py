"""summary.json and the printed table.

summary.json keys: engine, block_size (the headline size: the largest swept), machine, settings,
tau, speedup, identical, acceptance_histogram (all at the headline size, over every prompt),
sweep {block size: figures}, per_family {family: the same figures plus its own sweep}, and serving
({"dflash"|"plain"[|"dflash-sequential"][|"plain-control"]: {concurrency: load figures, with "drafting": the
mean block size and plain-step share of the level from the dflash counters}, "speedup": {concurrency: tokens/s
ratio}, "speedup_runs": {concurrency: that ratio per round}, ["control", "control_runs": plain / plain-control,]
"goodput": best throughput at fixed interactivity per mode}, or null when the serving part was
skipped), and multi_turn (multi_turn.py: {"levels": {concurrency: {"no_cache", "cache": figures, and the
differences and TTFT ratios between them}}}, or null when the scenario was skipped).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from dflash_trt.benchmarks.config import spread_tokens
from dflash_trt.benchmarks.multi_turn import format_multi_turn
from dflash_trt.benchmarks.stats import ratio_interval
from dflash_trt.benchmarks.sweep import SweepResult

# The served modes in the order the tables list them (benchmarks/serving.py; the last two only when asked for).
SERVED_MODES = ("dflash", "plain", "dflash-sequential", "plain-control")

SUMMARY_NAME = "summary.json"


def machine_info() -> dict:
    """What the figures were measured on; the load average tells whether the machine was shared."""
    import torch

    return {
        "cpu": _cpu_model(),
        "num_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": list(os.getloadavg()),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def figures(sweep: SweepResult, block_size: int, family: str | None = None) -> dict:
    return sweep.report(block_size, family).to_dict()


def build_summary(engine: str, sweep: SweepResult, serving: dict | None, machine: dict, settings: dict,
                  multi_turn: dict | None = None) -> dict:
    headline = max(sweep.block_sizes)
    overall = figures(sweep, headline)
    per_family = {}
    for family in sweep.family_names:
        own = figures(sweep, headline, family)
        own["sweep"] = {str(size): figures(sweep, size, family) for size in sweep.block_sizes}
        per_family[family] = own
    return {
        "engine": engine,
        "block_size": headline,
        "machine": machine,
        "settings": settings,
        "tau": overall["tau"],
        "speedup": overall["speedup"],
        "identical": all(sweep.report(size).identical for size in sweep.block_sizes),
        "acceptance_histogram": overall["acceptance_histogram"],
        "sweep": {str(size): figures(sweep, size) for size in sweep.block_sizes},
        "per_family": per_family,
        "serving": serving,
        "multi_turn": multi_turn,
    }


def write_summary(summary: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / SUMMARY_NAME
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def format_table(summary: dict) -> str:
    """The report as fixed-width text: the in-process sweep per family, then the serving levels."""
    s = summary["settings"]
    lines = [f"In process: {summary['engine']}, greedy, {s['num_prompts']} prompts per family, "
             f"{s['max_new_tokens']} new tokens; speedup = decode-phase TPOT of block size 1 / DFlash",
             f"{'family':<20}{'block':>6}{'tau':>7}{'speedup':>9}{'TPOT ms':>17}{'identical':>11}"]
    rows = [(family, data["sweep"]) for family, data in summary["per_family"].items()]
    rows.append(("all", summary["sweep"]))
    for name, sweep in rows:
        for size, f in sweep.items():
            tpot = f"{f['tpot_ms']['dflash']:.1f} / {f['tpot_ms']['baseline']:.1f}"
            lines.append(f"{name:<20}{size:>6}{f['tau']:>7.2f}{f['speedup']:>8.2f}x{tpot:>17}"
                         f"{'yes' if f['identical'] else 'NO':>11}")
    histogram = " ".join(f"{k}:{v}" for k, v in summary["acceptance_histogram"].items())
    lines.append(f"acceptance length histogram (block {summary['block_size']}, all families): {histogram}")
    if summary.get("multi_turn"):
        lines += [""] + format_multi_turn(summary["multi_turn"])
    if summary["serving"]:
        lines += [""] + _serving_lines(summary["serving"], s)
    return "\n".join(lines)


def _serving_lines(serving: dict, settings: dict) -> list[str]:
    lines = [f"Serving: Triton ensemble, gRPC streaming, {served_runs(settings)}, "
             f"{settings['instances']} dflash instance(s) batching in flight; DFlash vs plain decoding (block size 1)",
             f"{'mode':<18}{'conc':>5}{'tok/s':>9}{'TTFT p50/p99 ms':>19}{'ITL p50/p99 ms':>18}{'TPOT ms':>9}"
             f"{'user tok/s min':>15}{'block':>7}{'plain':>7}{'requests':>10}{'errors':>8}"]
    modes = [mode for mode in SERVED_MODES if mode in serving]
    for mode in modes:
        for level, r in serving[mode].items():
            user = r.get("user_tokens_per_s")
            user_min = "-" if not user else f"{user['min']:.1f}"
            drafting = r.get("drafting")
            block = "-" if not drafting else f"{drafting['mean_block_size']:.2f}"
            plain = "-" if not drafting else f"{100 * drafting['plain_step_share']:.0f}%"
            lines.append(f"{mode:<18}{level:>5}{r['output_tokens_per_s']:>9.1f}{_pair(r['ttft_ms']):>19}"
                         f"{_pair(r['itl_ms']):>18}{_ms(r['tpot_ms']):>9}{user_min:>15}{block:>7}{plain:>7}"
                         f"{r['num_requests']:>10}{r['num_errors']:>8}")
    lines.append("block: tokens verified per sequence and step (drafts + 1; the adaptive policy's choice, shortened "
                 "last blocks included); plain: share of those steps that drafted nothing")
    ratios = " ".join(f"c={level}: {served_speedup(serving, level)}" for level in serving["speedup"])
    lines.append(f"throughput speedup (DFlash / plain): {ratios}")
    if "control" in serving:
        ratios = " ".join(f"c={level}: {served_speedup(serving, level, 'control')}" for level in serving["control"])
        lines.append(f"two plain servers (plain / plain-control, the comparison's resolution): {ratios}")
    goodput = serving.get("goodput")
    if goodput:
        floor = goodput["min_user_tokens_per_s"]
        parts = []
        for mode in modes:
            best = goodput.get(mode)
            parts.append(f"{mode} {best['output_tokens_per_s']:.1f} tok/s (c={best['level']})" if best
                         else f"{mode} -")
        lines.append(f"best throughput with every user >= {floor:g} tok/s: {', '.join(parts)}; "
                     f"DFlash / plain {_times(goodput.get('ratio'))}")
    return lines


def _pair(values: dict) -> str:
    return f"{_ms(values['p50'])} / {_ms(values['p99'])}"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def served_runs(settings: dict) -> str:
    """How long each served level ran and what its requests asked for: '20 s per level', or '3 runs of 20 s per mode
    and level, requests of 48-80 tokens'."""
    rounds = settings.get("serving_rounds", 1)
    duration = f"{settings['duration_s']:g} s"
    runs = f"{rounds} runs of {duration} per mode and level" if rounds > 1 else f"{duration} per level"
    share = settings.get("served_length_spread", 0)  # (settings written before the spread existed: none)
    spread = spread_tokens(share, settings["max_new_tokens"]) if share else 0
    if spread:
        runs += f", requests of {settings['max_new_tokens'] - spread}-{settings['max_new_tokens'] + spread} tokens"
    return runs


def served_speedup(serving: dict, level: str, key: str = "speedup") -> str:
    """A served level's DFlash / plain throughput (key "control": plain / plain-control), with the range of its
    rounds' ratios when it ran several (benchmarks/serving.py), and from three rounds on the 95% confidence interval
    of their mean (benchmarks/stats.py): '1.02x (runs 0.96-1.08x, 95% CI 0.94-1.10x)'."""
    text = _times(serving[key][level])
    runs = [r for r in serving.get(f"{key}_runs", {}).get(level, []) if r is not None]
    if len(runs) < 2:
        return text
    interval = ratio_interval(runs)
    confidence = f", 95% CI {interval[0]:.2f}-{interval[1]:.2f}x" if interval else ""
    return f"{text} (runs {min(runs):.2f}-{max(runs):.2f}x{confidence})"
