"""The benchmark summary as a Markdown page (docs/results.md is written this way, never by hand).

The page states what a reader needs to trust a figure: when and on which commit it was measured, the
machine (CPU model, cores, load average at start and end: a shared machine lowers every figure), and the
exact command that produced it, so refreshing the page is rerunning that command.
"""

from __future__ import annotations

import datetime
import shlex
import subprocess
import sys
from pathlib import Path

from dflash_trt.benchmarks.report import SERVED_MODES, served_runs, served_speedup
from dflash_trt.benchmarks.stats import ratio_interval

REPO_ROOT = Path(__file__).resolve().parents[2]


def current_commit(root: Path = REPO_ROOT) -> str:
    """The short commit of the checkout, with '+ local changes' when the tree differs from it."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{commit} + local changes" if dirty else commit


def invoked_command(argv: list[str] | None = None) -> str:
    """The command line as a user would type it: `dflash-trt <args>`."""
    args = sys.argv[1:] if argv is None else argv
    return "dflash-trt " + shlex.join(args)


def results_page(summary: dict, command: str, commit: str | None = None, refresh: str = "make results",
                 now: datetime.datetime | None = None) -> str:
    """The whole page: provenance, the in-process sweep, and the serving levels when they ran."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    commit = commit or current_commit()
    m, s = summary["machine"], summary["settings"]
    load_end = m.get("load_average_end")
    lines = [
        "# Results",
        "",
        f"Written by the benchmark command below, never by hand; `{refresh}` reruns it (see "
        "[benchmarks.md](benchmarks.md)). These are CPU figures of the demo pair, not GPU figures.",
        "",
        f"- Date: {now:%Y-%m-%d %H:%M} UTC; commit `{commit}`",
        f"- Machine: {m['cpu']}, {m['num_cpus']} cores; torch {m['torch']} with {m['torch_threads']} thread(s) in "
        f"process; load average (1/5/15 min) {_load(m.get('load_average_start'))} at the start"
        + (f", {_load(m['load_average_serving_start'])} when serving started" if "load_average_serving_start" in m
           else "")
        + (f", {_load(load_end)} at the end" if load_end else ""),
        f"- Engine: `{summary['engine']}`; {s['num_prompts']} held-out prompts per family, greedy, "
        f"{'chat template' if s.get('chat', True) else 'no chat template'}, up to {s['max_new_tokens']} new tokens",
        "- Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        "## In process",
        "",
        "tau = mean tokens per verify step (1.00 is plain decoding); speedup = decode-phase time per output token "
        "of plain decoding (block size 1) / DFlash, both run interleaved in the same process; identical = every "
        "output equals plain greedy decoding token for token.",
        "",
        "| family | block | tau | speedup | TPOT DFlash / plain (ms) | identical |",
        "|---|---:|---:|---:|---:|---|",
    ]
    rows = [(family, data["sweep"]) for family, data in summary["per_family"].items()]
    rows.append(("**all**", summary["sweep"]))
    for name, sweep in rows:
        for size, f in sweep.items():
            lines.append(f"| {name} | {size} | {f['tau']:.2f} | {f['speedup']:.2f}x | "
                         f"{f['tpot_ms']['dflash']:.1f} / {f['tpot_ms']['baseline']:.1f} | "
                         f"{'yes' if f['identical'] else 'NO'} |")
    histogram = ", ".join(f"{k}: {v}" for k, v in summary["acceptance_histogram"].items())
    lines += ["", f"Acceptance lengths at block {summary['block_size']} (verify steps, all families): {histogram}."]
    if summary.get("serving"):
        lines += ["", *_serving_section(summary["serving"], s)]
    if summary.get("multi_turn"):
        lines += ["", *_multi_turn_section(summary["multi_turn"])]
    return "\n".join(lines) + "\n"


def _multi_turn_section(multi_turn: dict) -> list[str]:
    """The multi-turn scenario (multi_turn.py): every level with the prefix cache and without, same run."""
    lines = [
        "## Multi-turn conversations and the prefix cache",
        "",
        f"{multi_turn['num_conversations']} held-out ShareGPT conversations replayed turn by turn (each turn's prompt: "
        f"the earlier turns with the model's own answers), in process on one scheduler, block "
        f"{multi_turn['block_size']}, with a prefix cache of {multi_turn['prefix_cache_bytes'] / 2**20:.0f} MiB of "
        "target KV (the drafter's features of the same positions come on top) and without, each pass starting cold "
        "([prefix-cache.md](prefix-cache.md)).",
        "",
        "| conversations in flight | cache | TTFT turn 1 p50 / p99 (ms) | TTFT turns 2+ p50 / p99 (ms) | output tok/s "
        "| tau | hit rate | peak cache MiB (all / KV) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for level, data in multi_turn["levels"].items():
        for name in ("no_cache", "cache"):
            r = data[name]
            lines.append(f"| {level} | {'on' if name == 'cache' else 'off'} | {_pair(r['ttft_ms_first_turn'])} | "
                         f"{_pair(r['ttft_ms_later_turns'])} | {r['output_tokens_per_s']:.1f} | {r['tau']:.2f} | "
                         f"{100 * r['hit_rate']:.0f}% | {r['peak_cache_bytes'] / 2**20:.1f} / "
                         f"{r.get('peak_cache_kv_bytes', 0) / 2**20:.1f} |")
        speedup = data["ttft_p50_speedup_later_turns"]
        notes.append(f"- {level} in flight: turns 2+ reach their first token {_times(speedup)} sooner with the cache "
                     f"(p50); output differences {data['output_differences']}, acceptance differences "
                     f"{data['acceptance_differences']}, cache within its budget: "
                     f"{'yes' if data['cache']['within_budget'] else 'NO'}.")
    return lines + [""] + notes


def _serving_section(serving: dict, settings: dict) -> list[str]:
    lines = [
        "## Served through Triton",
        "",
        f"The ensemble over gRPC streaming, {served_runs(settings)}, "
        f"{settings['instances']} dflash instance(s) batching in flight; DFlash (adaptive block size) against "
        "the same repository serving plain decoding (block size 1), both servers up, loaded in turn level by level "
        "(the order of the modes changing from one round to the next). block = tokens verified per sequence and step "
        "(drafts + 1); plain = share of steps that drafted nothing.",
        "",
        "| mode | concurrency | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | slowest user tok/s "
        "| block | plain | requests | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in (m for m in SERVED_MODES if m in serving):
        for level, r in serving[mode].items():
            user = r.get("user_tokens_per_s")
            drafting = r.get("drafting")
            lines.append(
                f"| {mode} | {level} | {r['output_tokens_per_s']:.1f} | {_pair(r['ttft_ms'])} | {_pair(r['itl_ms'])} "
                f"| {'-' if not user else format(user['min'], '.1f')} "
                f"| {'-' if not drafting else format(drafting['mean_block_size'], '.2f')} "
                f"| {'-' if not drafting else format(100 * drafting['plain_step_share'], '.0f') + '%'} "
                f"| {r['num_requests']} | {r['num_errors']} |")
    ratios = ", ".join(f"{served_speedup(serving, level)} at concurrency {level}" for level in serving["speedup"])
    lines += ["", f"Output tokens/s, DFlash / plain: {ratios}. {UNDER_LOAD}"]
    drained = _with_drain_ratios(serving)
    if drained:
        lines += ["", f"Counting the drain too (every token, to the last completion), DFlash / plain: {drained}."]
    if "control" in serving:
        ratios = ", ".join(f"{served_speedup(serving, level, 'control')} at concurrency {level}"
                           for level in serving["control"])
        lines += ["", f"Two plain servers, plain / plain-control (what the comparison resolves here): {ratios}."]
    if any(ratio_interval(runs) for runs in serving.get("speedup_runs", {}).values()):  # a CI was printed
        lines += ["", "runs: the range of the rounds' ratios, each of two runs back to back; 95% CI: the interval of "
                  "their mean (Student's t over their logarithms). The rounds of one run share the machine's state "
                  "of those minutes, so another run may fall outside it."]
    return lines


# What a served level's output tokens/s counts (benchmarks/loadgen.py).
UNDER_LOAD = ("Output tokens/s counts the tokens streamed while the level's load was applied (its duration), over that "
              "time: the requests still in flight at its end are awaited, their later tokens not counted "
              "(docs/benchmarks.md).")


def _with_drain_ratios(serving: dict) -> str:
    """'0.97x at concurrency 16, ...': DFlash / plain over whole runs, drain included ('' for older summaries)."""
    parts = []
    for level, r in serving["dflash"].items():
        dflash, plain = r.get("output_tokens_per_s_with_drain"), serving["plain"][level].get(
            "output_tokens_per_s_with_drain")
        if dflash is None or not plain:
            return ""
        parts.append(f"{dflash / plain:.2f}x at concurrency {level}")
    return ", ".join(parts)


def _load(values) -> str:
    return " / ".join(f"{v:.1f}" for v in values) if values else "unknown"


def _pair(values: dict) -> str:
    return " / ".join("-" if values[k] is None else f"{values[k]:.0f}" for k in ("p50", "p99"))


def _times(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


# README.md carries the headline table between these markers; `--readme` rewrites what lies between them.
README_START = "<!-- results: written by `make results`, do not edit -->"
README_END = "<!-- end of results -->"


def headline_table(summary: dict, command: str, commit: str, now: datetime.datetime | None = None) -> str:
    """One table: DFlash against plain decoding in process (all families, per block size) and served (per
    concurrency), with when, where and how it was measured."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    m = summary["machine"]
    rows = ["| where | setting | tau | DFlash tok/s | plain tok/s | DFlash / plain | identical to plain |",
            "|---|---|---:|---:|---:|---:|---|"]
    for size, f in summary["sweep"].items():
        t = f["tpot_ms"]
        rows.append(f"| in process, decode phase | block {size}, all families | {f['tau']:.2f} | "
                    f"{1000 / t['dflash']:.1f} | {1000 / t['baseline']:.1f} | {f['speedup']:.2f}x | "
                    f"{'yes' if f['identical'] else 'NO'} |")
    serving = summary.get("serving")
    if serving:
        for level, r in serving["dflash"].items():
            drafting = r.get("drafting") or {}
            rows.append(f"| served (Triton, batched) | concurrency {level}, mean block "
                        f"{drafting.get('mean_block_size', 0):.2f} | - | {r['output_tokens_per_s']:.1f} | "
                        f"{serving['plain'][level]['output_tokens_per_s']:.1f} | {served_speedup(serving, level)} "
                        "| - |")
    loads = [_load(m.get(key)) for key in ("load_average_start", "load_average_serving_start", "load_average_end")
             if m.get(key)]
    return "\n".join(rows) + (
        f"\n\nMeasured {now:%Y-%m-%d} on commit `{commit}`, {m['cpu']} ({m['num_cpus']} cores), load average "
        f"{' then '.join(loads)} (1/5/15 min; a shared machine lowers every figure). Produced by `make results`:\n"
        f"`{command}`.\n" + (f"Served: {UNDER_LOAD[0].lower()}{UNDER_LOAD[1:]}\n" if serving else "")
        + "Every figure, per prompt family: [docs/results.md](docs/results.md).")


def update_readme(path: Path, table: str) -> Path:
    """Replace what lies between README_START and README_END with `table`."""
    text = path.read_text()
    if README_START not in text or README_END not in text:
        raise ValueError(f"{path} has no results markers; add the lines {README_START!r} and {README_END!r}")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    path.write_text(f"{head}{README_START}\n{table}\n{README_END}{tail}")
    return path


def write_results_page(summary: dict, path: Path, commit: str, command: str | None = None) -> Path:
    """commit: current_commit() taken before the measurement started (the code that was measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(results_page(summary, command or invoked_command(), commit))
    return path
