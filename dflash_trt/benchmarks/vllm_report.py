"""The table of `make bench-vllm`: output tok/s of vLLM and ours, DFlash and plain, per batch size, with ratios.

`results[system][mode]["runs"][batch]` holds {"seconds", "token_ids"}, system "vllm" or "ours", mode
"dflash" or "plain", batch the batch size as a string ("1": one request at a time).
"""

from __future__ import annotations

SYSTEMS = ("vllm", "ours")
MODES = ("dflash", "plain")


def tokens_per_s(run: dict) -> float:
    tokens = sum(len(ids) for ids in run["token_ids"])
    return tokens / run["seconds"] if run["seconds"] > 0 else 0.0


def identical_count(a: dict, b: dict) -> int:
    """Prompts whose new tokens are the same in both runs."""
    return sum(x == y for x, y in zip(a["token_ids"], b["token_ids"]))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def rows(results: dict) -> list[dict]:
    """One row per batch size present in every system and mode."""
    batches = None
    for system in SYSTEMS:
        for mode in MODES:
            keys = set(results[system][mode]["runs"])
            batches = keys if batches is None else batches & keys
    table = []
    for batch in sorted(batches or (), key=int):
        run = {(s, m): results[s][m]["runs"][batch] for s in SYSTEMS for m in MODES}
        tps = {key: tokens_per_s(value) for key, value in run.items()}
        table.append({
            "batch": int(batch),
            "num_prompts": len(run["ours", "dflash"]["token_ids"]),
            "tokens_per_s": {f"{s}_{m}": tps[s, m] for s, m in tps},
            "ours_over_vllm": {m: _ratio(tps["ours", m], tps["vllm", m]) for m in MODES},
            "dflash_over_plain": {s: _ratio(tps[s, "dflash"], tps[s, "plain"]) for s in SYSTEMS},
            "identical_to_vllm": {m: identical_count(run["ours", m], run["vllm", m]) for m in MODES},
            "ours_dflash_identical_to_plain": identical_count(run["ours", "dflash"], run["ours", "plain"]),
        })
    return table


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def format_table(table: list[dict]) -> str:
    """Markdown: tok/s of the four runs, ours / vLLM and DFlash / plain ratios, identical outputs."""
    lines = ["| batch | prompts | vLLM DFlash | vLLM plain | ours DFlash | ours plain | ours/vLLM DFlash | "
             "ours/vLLM plain | DFlash/plain vLLM | DFlash/plain ours | identical to vLLM (DFlash, plain) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in table:
        tps, n = row["tokens_per_s"], row["num_prompts"]
        same = row["identical_to_vllm"]
        lines.append(
            f"| {row['batch']} | {n} | {tps['vllm_dflash']:.1f} | {tps['vllm_plain']:.1f} | "
            f"{tps['ours_dflash']:.1f} | {tps['ours_plain']:.1f} | {_fmt(row['ours_over_vllm']['dflash'])} | "
            f"{_fmt(row['ours_over_vllm']['plain'])} | {_fmt(row['dflash_over_plain']['vllm'])} | "
            f"{_fmt(row['dflash_over_plain']['ours'])} | {same['dflash']}/{n}, {same['plain']}/{n} |")
    return "\n".join(lines)


def format_report(summary: dict) -> str:
    """The Markdown file: settings line, table, tau of both DFlash runs, load average."""
    s = summary["settings"]
    tau = summary.get("tau", {})
    head = (f"{s['num_prompts']} prompts ({', '.join(s['families'])}, chat template), greedy, "
            f"{s['max_new_tokens']} new tokens, {s['threads']} thread(s) each, {summary.get('vllm_version', 'vLLM')} "
            f"(float32) vs dflash-trt (float32, in-process Scheduler)")
    load = summary.get("load_average", {})
    lines = [head, "", format_table(summary["table"]), "",
             f"tau (mean tokens per verify step): vLLM {_fmt(tau.get('vllm'), '.2f', '')}, "
             f"ours {_fmt(tau.get('ours'), '.2f', '')}",
             f"load average (1, 5, 15 min) at start {load.get('start')}, at end {load.get('end')}"]
    return "\n".join(lines) + "\n"


def vllm_tau(counters: dict) -> float | None:
    """Mean tokens per verify step from vLLM's counters: 1 + accepted tokens / drafts."""
    drafts = counters.get("vllm:spec_decode_num_drafts")
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens")
    if not drafts or accepted is None:
        return None
    return 1 + accepted / drafts
