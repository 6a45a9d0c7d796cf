"""The decoding backends the dflash model drives, chosen by the engine manifest's `runtime`.

Each backend turns (prompt ids, request, end ids) into `Step`s. torch, onnx and tensorrt run the
project's own speculative loop (`stream_generate`) with the target in PyTorch and the drafter from
the engine's artifacts; trtllm drives TensorRT-LLM's LLM API (see trtllm_runtime.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from dflash_trt.errors import DFlashError
from dflash_trt.serving.generation import Step
from dflash_trt.serving.requests import GenerationRequest

LOCAL_RUNTIMES = ("torch", "onnx", "tensorrt")


@dataclass
class LocalRuntime:
    """Target and drafter in this process; one request at a time per model instance."""

    target: object  # dflash_trt.target.TargetModel
    drafter: object  # a DFlash drafter (PyTorch module, or the ONNX/TensorRT twin)
    block_size: int
    default_end_ids: tuple[int, ...] = ()
    max_concurrent_requests: int = 1

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def steps(self, prompt_ids: list[int], request: GenerationRequest, end_ids) -> Iterator[Step]:
        """Steps of one generation; closing the iterator stops it between two verify steps."""
        from dflash_trt.decoding import stream_generate

        for out in stream_generate(self.target, self.drafter, prompt_ids, sampling_params(request, end_ids),
                                   block_size=self.block_size):
            reason = out.result.finish_reason if out.is_final else ""
            yield Step(list(out.new_token_ids), out.acceptance_length, out.is_final, reason)

    def close(self) -> None:
        pass


def sampling_params(request: GenerationRequest, end_ids):
    from dflash_trt.sampling import SamplingParams

    return SamplingParams(max_new_tokens=request.max_tokens, temperature=request.temperature, top_k=request.top_k,
                          top_p=request.top_p, seed=request.seed, stop_token_ids=tuple(end_ids))


def open_runtime(engine_dir: str | Path, device: str = "cpu", num_threads: int = 0, block_size: int = 0):
    """Load the engine through its manifest and return the runtime it names.

    block_size 0 runs the engine's block size; a smaller one overrides it, and 1 is plain decoding
    (the baseline the serving benchmark compares with, served the same way).
    """
    from dflash_trt.engine import load_engine

    if num_threads > 0:
        import torch

        torch.set_num_threads(num_threads)
    engine = load_engine(engine_dir, device=device)
    if engine.runtime == "trtllm":
        from dflash_trt.serving.trtllm_runtime import TrtllmRuntime

        if block_size and block_size != engine.block_size:
            raise DFlashError(f"{engine_dir}: the trtllm runtime serves the engine's block_size only")
        return TrtllmRuntime.from_engine(engine)
    if engine.runtime not in LOCAL_RUNTIMES:
        raise DFlashError(f"{engine_dir}: unknown runtime {engine.runtime!r}")
    block_size = block_size or engine.block_size
    if block_size > engine.block_size:
        raise DFlashError(f"{engine_dir}: block_size {block_size} exceeds the engine's {engine.block_size}")
    drafter = _drafter(engine) if block_size > 1 else None
    return LocalRuntime(engine.target, drafter, block_size, default_end_ids(engine.target))


def _drafter(engine):
    if engine.drafter is not None:  # torch, onnx, and tensorrt on a CUDA device: load_engine loaded it
        return engine.drafter
    raise DFlashError(f"{engine.directory}: the {engine.runtime} runtime's drafter cannot run in this process "
                      "(it needs TensorRT on a GPU: serve with a CUDA device); serve the torch or onnx engine "
                      "of the same pair here")


def default_end_ids(target) -> tuple[int, ...]:
    """The target's EOS ids (generation config, else tokenizer), as `dflash-trt generate` uses."""
    from dflash_trt.commands._options import default_stop_ids

    return tuple(default_stop_ids(target))


def tokenizer_for(engine_dir: str | Path):
    """The target's tokenizer, without loading any weights (preprocessing, postprocessing, gateway).

    Text in and text out need the tokenizer files the target ships: without them this refuses
    rather than inventing a vocabulary."""
    from dflash_trt.engine import load_engine
    from dflash_trt.target import TOKENIZER_FILES, load_tokenizer

    # The dflash model verifies the file hashes; reading the manifest is enough here.
    engine = load_engine(engine_dir, verify=False, load_models=False)
    source = engine.target_path
    if engine.runtime == "trtllm":
        source = Path(engine.llm_options.get("tokenizer") or engine.llm_options["model"])
    tokenizer = load_tokenizer(source)
    if tokenizer is None:
        raise DFlashError(f"{engine_dir}: the target has no tokenizer (none of {', '.join(TOKENIZER_FILES)} in "
                          f"{source}), so text cannot be tokenized or detokenized; add the target's tokenizer "
                          "files, or send token ids to the dflash model")
    return tokenizer, engine


def vocabulary_size(runtime) -> int | None:
    """How many token ids a request may use: the tokenizer's vocabulary, else the target's embedding rows."""
    tokenizer = getattr(runtime, "tokenizer", None)
    if tokenizer is not None:
        return len(tokenizer)
    config = getattr(getattr(getattr(runtime, "target", None), "model", None), "config", None)
    return getattr(config, "vocab_size", None)
