"""Serving load test: the same engine served twice through the real Triton ensemble, once with DFlash
(the engine's block size, adaptive per step: plain, a chain, or a tree up to config.tree_budget nodes) and once with
plain decoding (repository block_size 1), both batched in flight, with the same repository settings and the same
requests. Optionally a third time with DFlash one request at a time (max_batch_sequences 1), the unbatched baseline.

The servers are up together and only one is loaded at a time: each level runs every mode in turn, the order
going through every permutation of the modes from one round to the next (DFlash then plain, then plain then DFlash,
...; with a control server all six orders, so that none is always in the middle), so that a drift of a shared
machine's load falls on every mode alike instead of on whichever ran last. With config.serving_rounds R > 1 each
level does that R times, and a mode's figures at a level are its R runs together; each run lasts the full
duration (splitting a duration into shorter runs would multiply the ramp-up and drain, which at 32 requests in
flight and 64 tokens each are much of a 10-second run). An idle server waits on a condition and takes no CPU.
The ratio of each round's two runs, taken back to back, is kept too ("speedup_runs"): their spread is what one
run's ratio is worth on the machine at hand (on a shared 2-core machine one 20-second run's ratio moves by 5-10%).
With config.plain_control a third server serves plain decoding as well, loaded in turn with the others: what
"plain" and "plain-control" differ by ("control", with its rounds' "control_runs") is what two identical servers
differ by on that machine, the resolution of the DFlash / plain ratio (on the 2-core Xeon of README's table, rounds
from 0.91x to 1.10x at one request in flight).

Per mode the "goodput" is the throughput at fixed interactivity: the best total output tok/s of a
level at which every request still got at least min_user_tokens_per_s tok/s of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from pathlib import Path
from typing import Callable

from dflash_trt.benchmarks.config import BenchConfig
from dflash_trt.benchmarks.loadgen import LoadLevel, run_level

# Mode -> the repository's (block_size (0: the engine's), max_batch_sequences (0: the default)).
MODES = {"dflash": (0, 0), "plain": (1, 0)}
SEQUENTIAL = {"dflash-sequential": (0, 1)}
CONTROL = {"plain-control": (1, 0)}
WARMUP_TOKENS = 8


def run_serving(config: BenchConfig, prompts: list[str], log: Callable[[str], None] = print) -> dict:
    """{"dflash": {level: summary}, "plain": {...}, "speedup": {level: tokens/s ratio of the rounds together},
    "speedup_runs": {level: [that ratio of each round's two runs]},
    "goodput": {"min_user_tokens_per_s": X, mode: {"level", "output_tokens_per_s"} or None, "ratio"}}; with
    config.plain_control also "plain-control" and "control", "control_runs": plain / plain-control, as the speedup."""
    modes = served_modes(config)
    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as scratch, contextlib.ExitStack() as servers:
        served = {mode: servers.enter_context(_serve(config, _render(config, Path(scratch) / mode, block_size,
                                                                     max_batch), mode, prompts, log))
                  for mode, (block_size, max_batch) in modes.items()}
        results, runs = _load_interleaved(config, served, prompts, log)
    results["speedup"], results["speedup_runs"] = level_ratios(results), round_ratios(runs)
    if config.plain_control:
        results["control"] = level_ratios(results, "plain", "plain-control")
        results["control_runs"] = round_ratios(runs, "plain", "plain-control")
    goodput = {mode: best_at_interactivity(results[mode], config.min_user_tokens_per_s) for mode in modes}
    both = goodput["dflash"] and goodput["plain"]
    goodput["ratio"] = (goodput["dflash"]["output_tokens_per_s"] / goodput["plain"]["output_tokens_per_s"]
                        if both and goodput["plain"]["output_tokens_per_s"] else None)
    results["goodput"] = {"min_user_tokens_per_s": config.min_user_tokens_per_s, **goodput}
    return results


def served_modes(config: BenchConfig) -> dict[str, tuple[int, int]]:
    """The servers a run starts: {mode: (repository block_size, max_batch_sequences)} (MODES and those asked for)."""
    return {**MODES, **(SEQUENTIAL if config.sequential_baseline else {}), **(CONTROL if config.plain_control else {})}


def best_at_interactivity(levels: dict, min_user_tokens_per_s: float) -> dict | None:
    """The level with the most output tok/s among those where every request got >= the floor."""
    fine = [(level, r) for level, r in levels.items()
            if r["num_errors"] == 0 and r.get("user_tokens_per_s")
            and r["user_tokens_per_s"]["min"] >= min_user_tokens_per_s]
    if not fine:
        return None
    level, best = max(fine, key=lambda item: item[1]["output_tokens_per_s"])
    return {"level": int(level), "output_tokens_per_s": best["output_tokens_per_s"]}


def _render(config: BenchConfig, out: Path, block_size: int, max_batch: int) -> Path:
    from dflash_trt.serving.repo import RepoConfig, render_repository

    batch = {"max_batch_sequences": max_batch} if max_batch else {"max_batch_sequences": max(config.concurrency)}
    return render_repository(RepoConfig(
        engine_dir=config.engine, out=out, chat_template="model" if config.chat else "none",
        dflash_instances=config.instances, max_queue_size=max(64, 4 * max(config.concurrency)),
        num_threads=config.num_threads, block_size=block_size,
        tree_budget=config.tree_budget if block_size != 1 else 0, **batch))


@contextlib.contextmanager
def _serve(config: BenchConfig, repo: Path, mode: str, prompts: list[str], log):
    """A ready, warmed-up tritonserver for `repo` (log: <out>/logs/triton-<mode>.log)."""
    from dflash_trt.serving.client import GrpcStream
    from dflash_trt.serving.server import serve_on_free_ports

    log_path = Path(config.out) / "logs" / f"triton-{mode}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    log(f"serving {mode}: starting tritonserver (log: {log_path})")
    with serve_on_free_ports(repo, ready_timeout_s=config.ready_timeout_s, log_path=log_path) as server:
        _warm_up(GrpcStream(server.config.grpc_url), prompts[0], config.request_timeout_s)
        yield server


def _load_interleaved(config: BenchConfig, servers: dict, prompts: list[str], log
                      ) -> tuple[dict, dict[str, dict[str, list[LoadLevel]]]]:
    """({mode: {level: summary}}, {mode: {level: [run of each round]}}): level by level, config.serving_rounds runs
    per mode, the modes in turn and their order changing from one round to the next (module docstring)."""
    from dflash_trt.serving.client import GrpcStream
    from dflash_trt.serving.metrics import DRAFTING_COUNTERS, drafting_figures, scrape_totals

    results: dict = {mode: {} for mode in servers}
    all_runs: dict[str, dict[str, list[LoadLevel]]] = {mode: {} for mode in servers}
    turn, orders = 0, list(itertools.permutations(servers))
    for level in config.concurrency:
        runs: dict[str, list[LoadLevel]] = {mode: [] for mode in servers}
        before = {mode: scrape_totals(s.config.metrics_url, DRAFTING_COUNTERS) for mode, s in servers.items()}
        for _round in range(config.serving_rounds):
            for mode in orders[turn % len(orders)]:
                url = servers[mode].config.grpc_url
                runs[mode].append(run_level(lambda: GrpcStream(url), prompts, level, config.duration_s,
                                            config.max_new_tokens, config.request_timeout_s,
                                            max_tokens_spread=config.served_length_spread_tokens, temperature=0.0))
            turn += 1
        for mode, server in servers.items():
            result = merged(runs[mode]).summary()
            # What the block-size policy chose under this load, from the dflash model's counters (only this mode's
            # server served in between).
            result["drafting"] = drafting_figures(before[mode], scrape_totals(server.config.metrics_url,
                                                                             DRAFTING_COUNTERS))
            results[mode][str(level)] = result
            all_runs[mode][str(level)] = runs[mode]
            log(f"serving {mode} concurrency {level}: {result['output_tokens_per_s']:.1f} tok/s, "
                f"{result['num_requests']} requests, {result['num_errors']} errors")
    return results, all_runs


def level_ratios(results: dict, mode: str = "dflash", baseline: str = "plain") -> dict[str, float | None]:
    """{level: mode / baseline output tok/s of the level's rounds together}."""
    return {level: _ratio(results[mode][level], results[baseline][level]) for level in results[mode]}


def round_ratios(runs: dict[str, dict[str, list[LoadLevel]]], mode: str = "dflash", baseline: str = "plain"
                 ) -> dict[str, list[float | None]]:
    """{level: mode / baseline output tok/s of each round}: a round's runs ran one after the other
    (_load_interleaved)."""
    return {level: [_ratio(run.summary(), base.summary())
                    for run, base in zip(runs[mode][level], runs[baseline][level])]
            for level in runs[mode]}


def merged(runs: list[LoadLevel]) -> LoadLevel:
    """Runs of one concurrency level as one: their requests, over the sum of their times."""
    records = sorted((r for run in runs for r in run.records), key=lambda r: r.start_s)
    loads = [run.load_s for run in runs]
    return LoadLevel(runs[0].concurrency, sum(run.duration_s for run in runs), records,
                     load_s=sum(loads) if all(loads) else None)


def _warm_up(stream, prompt: str, timeout_s: float) -> None:
    """One short request before timing: the first one pays for lazy initialisation in the models.
    It fails loudly (RequestFailed), since a server that cannot answer it would only produce errors."""
    try:
        for _chunk in stream.chunks(prompt, WARMUP_TOKENS, timeout_s=timeout_s):
            pass
    finally:
        stream.close()


def _ratio(dflash: dict, plain: dict) -> float | None:
    if not plain["output_tokens_per_s"]:
        return None
    return dflash["output_tokens_per_s"] / plain["output_tokens_per_s"]
