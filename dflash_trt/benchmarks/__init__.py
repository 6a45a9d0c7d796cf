"""`make bench`: the in-process block-size sweep, the serving load test and the report they produce.

Modules: config (BenchConfig, the one place of every default), prompts (held-out prompt sets),
sweep (tau and decode-phase speedup against block size 1, interleaved), loadgen (gRPC streaming load
at a fixed concurrency), serving (Triton repositories for DFlash and plain decoding, one server each),
report (summary.json and the printed table), plots (matplotlib PNGs), run (all of it, in order).
`make bench-vllm`: vllm_compare (vLLM's CPU build and ours side by side), vllm_runner (its vLLM side, run
in vLLM's own venv), vllm_ours (our side, through the Scheduler), vllm_report (its table and ratios).
"""

from __future__ import annotations

__all__ = ["BenchConfig", "run_bench"]


def __getattr__(name: str):
    # Lazy: importing the package must not pull in torch, tritonclient or matplotlib.
    if name == "BenchConfig":
        from dflash_trt.benchmarks.config import BenchConfig

        return BenchConfig
    if name == "run_bench":
        from dflash_trt.benchmarks.run import run_bench

        return run_bench
    raise AttributeError(name)
