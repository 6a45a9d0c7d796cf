"""The decoding backends the dflash model drives, chosen by the engine manifest's `runtime`.

torch, onnx and tensorrt run the project's own speculative loop with the target in PyTorch and the
drafter from the engine's artifacts: `new_scheduler()` gives the in-flight batching scheduler that the
dflash model drives (batch_loop.py), and `steps()` one request's steps alone. trtllm drives
TensorRT-LLM's LLM API, which batches in flight itself (see trtllm_runtime.py).

This module runs when a model loads, not per request: request translation lives in generation.py, the CPU
count in cpus.py, tokenizers for text in and out in tokenizers.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from dflash_trt.errors import DFlashError
from dflash_trt.serving.generation import Step, sampling_params, step_of
from dflash_trt.serving.requests import GenerationRequest

LOCAL_RUNTIMES = ("torch", "onnx", "tensorrt")
CUDA_GRAPHS_ENV = "DFLASH_CUDA_GRAPHS"  # 1: the decoding steps (verify and draft) replay CUDA graphs (open_runtime)


def _default_limits():
    from dflash_trt.decoding.scheduler.scheduler import SchedulerLimits

    return SchedulerLimits()


@dataclass
class LocalRuntime:
    """Target and drafter in this process; requests batch in flight in one scheduler per model instance."""

    target: object  # dflash_trt.decoding.model.target.TargetModel
    drafter: object  # a DFlash drafter (PyTorch module, or the ONNX/TensorRT twin)
    block_size: int  # the largest block a step verifies (1: plain decoding)
    default_end_ids: tuple[int, ...] = ()
    max_concurrent_requests: int = 1
    limits: object = field(default_factory=_default_limits)  # dflash_trt.decoding.scheduler.scheduler.SchedulerLimits
    block_policy: str = "adaptive"  # or "fixed": every step verifies block_size (block_policy.py)
    tree_budget: int = 0  # draft nodes of a tree verify per row (step/verify/tree.py); 0: the chain
    prefix_cache_bytes: int = 0  # each scheduler's prompt-prefix cache (scheduler/prefix_cache.py); 0: none

    def verify_method(self):
        """How the drafts are verified: a tree of tree_budget nodes, or the chain."""
        from dflash_trt.decoding.step.verify import tree_or_chain

        return tree_or_chain(self.tree_budget)

    def new_scheduler(self):
        """A scheduler over this runtime's pair, with its limits, block-size policy and verification method."""
        from dflash_trt.decoding.scheduler.block_policy import make_policy
        from dflash_trt.decoding.scheduler.scheduler import Scheduler, allowed_block_sizes

        drafter = self.drafter if self.block_size > 1 else None
        policy = make_policy(self.block_policy, self.block_size, allowed_block_sizes(drafter, self.block_size),
                             self.tree_budget if drafter is not None else 0)
        from dflash_trt.decoding.scheduler.prefix_cache import PrefixCache

        cache = PrefixCache(self.prefix_cache_bytes) if self.prefix_cache_bytes > 0 else None
        return Scheduler(self.target, drafter, self.block_size, self.limits, policy, self.verify_method(), cache)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def steps(self, prompt_ids: list[int], request: GenerationRequest, end_ids) -> Iterator[Step]:
        """Steps of one generation; closing the iterator stops it between two verify steps."""
        from dflash_trt.decoding.api import stream_generate

        params = sampling_params(request, end_ids, self.tokenizer)
        for out in stream_generate(self.target, self.drafter, prompt_ids, params, block_size=self.block_size,
                                   method=self.verify_method()):
            yield step_of(out)

    def close(self) -> None:
        pass


def open_runtime(engine_dir: str | Path, device: str = "cpu", num_threads: int = 0, block_size: int = 0,
                 block_policy: str = "adaptive", limits=None, cuda_graphs: bool | None = None, tree_budget: int = 0,
                 prefix_cache_bytes: int = 0):
    """Load the engine through its manifest and return the runtime it names.

    block_size 0 runs the engine's block size; a smaller one overrides it, and 1 is plain decoding
    (the baseline the serving benchmark compares with, served the same way). block_policy: "adaptive"
    picks each step's block size up to that one, "fixed" pins it. limits: SchedulerLimits of the batch.
    cuda_graphs: the target's decoding steps through GraphedVerifier and a PyTorch drafter's through GraphedDrafter
    (static shapes, one CUDA graph per batch bucket and block size), on a CUDA device only; None reads the
    environment (CUDA_GRAPHS_ENV=1: on). tree_budget B > 0 verifies a tree of B draft nodes per row instead of the
    chain (torch drafters on the eager path; refused at load elsewhere, in one line). prefix_cache_bytes > 0
    gives each scheduler a prompt-prefix cache of that many bytes (local runtimes; trtllm keeps its own).
    """
    from dflash_trt.decoding.step.tree_budget import check_tree_budget
    from dflash_trt.engine import load_engine

    check_tree_budget(tree_budget)
    if num_threads > 0:
        import torch

        torch.set_num_threads(num_threads)
    engine = load_engine(engine_dir, device=device)
    if engine.runtime == "trtllm":
        from dflash_trt.serving.trtllm_runtime import TrtllmRuntime

        if block_size and block_size != engine.block_size:
            raise DFlashError(f"{engine_dir}: the trtllm runtime serves the engine's block_size only")
        if tree_budget:
            raise DFlashError(f"{engine_dir}: the trtllm runtime cannot verify a tree (TensorRT-LLM's DFlash verifies "
                              "a chain); set tree_budget 0 or use the torch runtime")
        return TrtllmRuntime.from_engine(engine)
    if engine.runtime not in LOCAL_RUNTIMES:
        raise DFlashError(f"{engine_dir}: unknown runtime {engine.runtime!r}")
    block_size = block_size or engine.block_size
    if block_size > engine.block_size:
        raise DFlashError(f"{engine_dir}: block_size {block_size} exceeds the engine's {engine.block_size}")
    drafter = _drafter(engine) if block_size > 1 else None
    from dflash_trt.decoding.scheduler.block_policy import make_policy

    make_policy(block_policy, block_size)  # a bad name fails at load, not at the first request
    target = engine.target
    if cuda_graphs is None:
        cuda_graphs = os.environ.get(CUDA_GRAPHS_ENV, "0") == "1"
    if cuda_graphs:
        target, drafter = graphed_pair(target, drafter, device)
    runtime = LocalRuntime(target, drafter, block_size, default_end_ids(engine.target),
                           limits=limits if limits is not None else _default_limits(), block_policy=block_policy,
                           tree_budget=tree_budget, prefix_cache_bytes=max(0, prefix_cache_bytes))
    if drafter is not None:
        try:  # a runtime that cannot run a tree fails at load, not at the first request
            runtime.verify_method().check(target, drafter)
        except DFlashError as error:
            raise DFlashError(f"{engine_dir}: {error}") from None
    return runtime


def graphed_pair(target, drafter, device: str):
    """The target and the drafter with their decoding steps captured in CUDA graphs (decoding/model/graphs:
    verifier.py, drafter.py); refused off CUDA, or where a part cannot be captured. The ONNX and TensorRT drafters
    are not PyTorch modules and stay as they are (a TensorRT engine is one launch already)."""
    if not str(device).startswith("cuda"):
        raise DFlashError(f"CUDA graphs ({CUDA_GRAPHS_ENV}=1) need a CUDA device, not {device!r}")
    from dflash_trt.decoding.model.drafters import DrafterBase
    from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter
    from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier

    if isinstance(drafter, DrafterBase):
        drafter = GraphedDrafter(drafter, graphs=True)
    return GraphedVerifier(target, graphs=True), drafter


def _drafter(engine):
    if engine.drafter is not None:  # torch, onnx, and tensorrt on a CUDA device: load_engine loaded it
        return engine.drafter
    raise DFlashError(f"{engine.directory}: the {engine.runtime} runtime's drafter cannot run in this process "
                      "(it needs TensorRT on a GPU: serve with a CUDA device); serve the torch or onnx engine "
                      "of the same pair here")


def default_end_ids(target) -> tuple[int, ...]:
    """The target's EOS ids (generation config, else tokenizer), as `dflash-trt generate` uses."""
    from dflash_trt.decoding.model.tokens import default_stop_ids

    return tuple(default_stop_ids(target))


