"""run_bench: the in-process sweep, then (optionally) the serving load test, then summary.json and plots."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from dflash_trt.benchmarks.config import BenchConfig, resolve_block_sizes
from dflash_trt.errors import DFlashError

LOCAL_RUNTIMES = ("torch", "onnx")


def run_bench(config: BenchConfig, log: Callable[[str], None] = print) -> dict:
    """Measure the engine as configured; writes config.out/summary.json and PNG plots, returns the summary."""
    from dflash_trt.benchmarks.plots import write_plots
    from dflash_trt.benchmarks.prompts import heldout_prompts
    from dflash_trt.benchmarks.report import build_summary, machine_info, write_summary

    config.validate()
    records = heldout_prompts(config.prompts_dir, config.families, config.num_prompts)
    _set_threads(config.num_threads)
    machine = machine_info()
    engine_name, block_sizes, sweep, multi_turn = _in_process(config, records, log)
    settings = {**asdict(config), "block_sizes": list(block_sizes), "families": sweep.family_names}
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    out = Path(config.out)
    # Written now as well, so a failure of the serving part keeps the in-process figures.
    write_summary(build_summary(engine_name, sweep, None, machine, settings, multi_turn), out)
    gc.collect()  # the served instances load their own copies of the models
    serving = None
    # The served models take text: multi-turn prompts (chat message lists) are measured in process only.
    texts = [r.prompt for r in records if isinstance(r.prompt, str)]
    if config.serving and not texts:
        log("serving: skipped (every selected prompt is multi-turn)")
    elif config.serving:
        from dflash_trt.benchmarks.serving import run_serving

        machine["load_average_serving_start"] = list(os.getloadavg())  # the load can change between the parts
        serving = run_serving(config, texts, log)
    machine["load_average_end"] = list(os.getloadavg())
    summary = build_summary(engine_name, sweep, serving, machine, settings, multi_turn)
    log(f"summary: {write_summary(summary, out)}")
    for path in write_plots(summary, out):
        log(f"plot: {path}")
    return summary


def _in_process(config: BenchConfig, records, log):
    from dflash_trt.benchmarks.sweep import run_sweep
    from dflash_trt.decoding.model.tokens import default_stop_ids, encode_prompt
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.engine import load_engine

    log(f"loading {config.engine}")
    engine = load_engine(config.engine)
    if engine.runtime not in LOCAL_RUNTIMES:
        raise DFlashError(f"{config.engine}: the in-process benchmark runs {' and '.join(LOCAL_RUNTIMES)} engines, "
                          f"not {engine.runtime}")
    block_sizes = resolve_block_sizes(config.block_sizes, engine.block_size)
    target, drafter = engine.target, engine.drafter  # the loader opens torch and onnx drafters alike
    if config.chat and not getattr(target.tokenizer, "chat_template", None):
        raise DFlashError(f"{config.engine}: the target's tokenizer has no chat template (use --no-chat)")
    prompts = [encode_prompt(target, r.prompt, config.chat) for r in records]
    params = SamplingParams(max_new_tokens=config.max_new_tokens, stop_token_ids=tuple(default_stop_ids(target)))
    log(f"in process: {len(prompts)} prompts x block sizes 1, {', '.join(map(str, block_sizes))} (interleaved)")

    def progress(done: int, total: int) -> None:
        print(f"\r[{done}/{total}]", end="" if done < total else "\n", file=sys.stderr, flush=True)

    sweep = run_sweep(target, drafter, prompts, [r.family for r in records], params, block_sizes, progress)
    multi_turn = _multi_turn(config, target, drafter, params, max(block_sizes), log) if config.multi_turn else None
    return Path(config.engine).name, block_sizes, sweep, multi_turn


def _multi_turn(config: BenchConfig, target, drafter, params, block_size: int, log) -> dict | None:
    from dflash_trt.benchmarks.multi_turn import MULTI_TURN_FAMILY, load_conversations, run_multi_turn

    if not config.chat:
        log("multi-turn: skipped (it replays conversations through the chat template; drop --no-chat)")
        return None
    if not (Path(config.prompts_dir) / MULTI_TURN_FAMILY / "heldout.jsonl").is_file():
        log(f"multi-turn: skipped (no {MULTI_TURN_FAMILY}/heldout.jsonl under {config.prompts_dir})")
        return None
    conversations = load_conversations(config.prompts_dir, config.multi_turn_conversations)
    return run_multi_turn(target, drafter, conversations, params, block_size, config.multi_turn_concurrency,
                          config.prefix_cache_bytes, log=log)


def _set_threads(num_threads: int) -> None:
    if num_threads > 0:
        import torch

        torch.set_num_threads(num_threads)
