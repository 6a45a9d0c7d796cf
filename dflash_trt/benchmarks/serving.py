"""Serving load test: the same engine served twice through the real Triton ensemble, once with DFlash
(the engine's block size) and once with plain decoding (repository block_size 1), one server at a time,
with the same repository settings and the same requests.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from .config import BenchConfig
from .loadgen import run_level

# Mode -> the repository's block_size (0: the engine's).
MODES = {"dflash": 0, "plain": 1}
WARMUP_TOKENS = 8


def run_serving(config: BenchConfig, prompts: list[str], log: Callable[[str], None] = print) -> dict:
    """{"dflash": {level: summary}, "plain": {...}, "speedup": {level: tokens/s ratio}} for each concurrency."""
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as scratch:
        for mode, block_size in MODES.items():
            repo = _render(config, Path(scratch) / mode, block_size)
            results[mode] = _serve_and_load(config, repo, mode, prompts, log)
    results["speedup"] = {level: _ratio(results["dflash"][level], results["plain"][level])
                          for level in results["dflash"]}
    return results


def _render(config: BenchConfig, out: Path, block_size: int) -> Path:
    from ..serving.repo import RepoConfig, render_repository

    return render_repository(RepoConfig(
        engine_dir=config.engine, out=out, chat_template="model" if config.chat else "none",
        dflash_instances=config.instances, max_queue_size=max(64, 4 * max(config.concurrency)),
        num_threads=config.num_threads, block_size=block_size))


def _serve_and_load(config: BenchConfig, repo: Path, mode: str, prompts: list[str], log) -> dict:
    from ..serving.client import GrpcStream
    from ..serving.server import serve_on_free_ports

    log_path = Path(config.out) / "logs" / f"triton-{mode}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    log(f"serving {mode}: starting tritonserver (log: {log_path})")
    levels = {}
    with serve_on_free_ports(repo, ready_timeout_s=config.ready_timeout_s, log_path=log_path) as server:
        def open_stream():
            return GrpcStream(server.config.grpc_url)

        _warm_up(open_stream(), prompts[0], config.request_timeout_s)
        for level in config.concurrency:
            result = run_level(open_stream, prompts, level, config.duration_s, config.max_new_tokens,
                               config.request_timeout_s, temperature=0.0).summary()
            levels[str(level)] = result
            log(f"serving {mode} concurrency {level}: {result['output_tokens_per_s']:.1f} tok/s, "
                f"{result['num_requests']} requests, {result['num_errors']} errors")
    return levels


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
