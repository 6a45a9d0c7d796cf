"""The rules of tree verification that need no torch: the verification methods, the policy, the CLI and the
repository renderer (which never loads torch) check a budget here, with one message, and read here which
runtimes can verify a tree."""

from __future__ import annotations

from dflash_trt.errors import DFlashError


def check_tree_budget(budget) -> int:
    """An integer >= 0, 0 meaning the chain; returns it, or raises a one-line DFlashError."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise DFlashError(f"tree budget must be >= 0 (0 means the chain), got {budget!r}")
    return budget


def verification_methods(runtime: str) -> list[str]:
    """The verification methods (step/verify) an engine of `runtime` runs: every runtime verifies the chain; a
    tree needs each slot's top-K candidates and an ancestor mask in the target's verify, which the torch target
    runs for every drafter runtime (torch, onnx, tensorrt: the exported drafters rank their candidates on the
    host); TensorRT-LLM's DFlash verifies a chain only."""
    return ["chain"] if runtime == "trtllm" else ["chain", "tree"]
