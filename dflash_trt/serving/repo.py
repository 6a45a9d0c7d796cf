"""Render a Triton model repository for an engine from model_repository/templates/.

The templates are plain config.pbtxt files with ${name} placeholders and the model.py files, copied
as they are. Limits default to what the engine can do: the context is the smaller of the preset's
max_seq_len and the target's position range, minus one draft block.
"""

from __future__ import annotations

import json
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.decoding.step.tree_budget import check_tree_budget, verification_methods
from dflash_trt.errors import DFlashError
from dflash_trt.serving.canary import DEFAULT_CANARY_TOKENS
from dflash_trt.serving.preprocess import AUTO_TEMPLATE, MODEL_TEMPLATE, NO_TEMPLATE
from dflash_trt.serving.trtllm_inputs import pbtxt_input_map, pbtxt_inputs, pbtxt_step_inputs

TEMPLATES = Path(__file__).resolve().parents[2] / "model_repository" / "templates"
# "tensorrt_llm" is NVIDIA's current contract (its LLM-API model's tensors), served by the same dflash model.
MODELS = ("preprocessing", "dflash", "postprocessing", "tensorrt_llm", "ensemble")
# The ensemble template rendered twice: name -> (max_batch_size, text_output dims). "ensemble" has
# TensorRT-LLM's layout (a leading batch dimension, at most 1: the models serve one request each);
# "ensemble_unbatched" takes the same tensors without the batch dimension.
ENSEMBLES = {"ensemble": (1, "-1"), "ensemble_unbatched": (0, "1")}
DEFAULT_MAX_TOKENS = 4096
DEFAULT_MAX_KV_TOKENS = 32768  # or one full context, when that is larger
BLOCK_POLICIES = ("adaptive", "fixed")

DEFAULT_PREFIX_CACHE_BYTES = 256 * 2**20  # per dflash instance

@dataclass
class RepoConfig:
    """What `dflash-trt repo` renders. None means: derive from the engine."""

    engine_dir: Path
    out: Path
    engine_path: str | None = None  # the engine directory as the server sees it (container mount)
    # "auto" (the tokenizer's template when it has one), "none", "model", or a Jinja file. Library callers
    # (benchmarks, tests) send prompts they formatted themselves; `dflash-trt repo` defaults to "auto".
    chat_template: str = NO_TEMPLATE
    max_tokens_limit: int | None = None
    max_context_tokens: int | None = None
    max_prompt_bytes: int = 0  # largest text_input in bytes, refused before tokenizing; 0: context x 32
    dflash_instances: int = 1
    preprocessing_instances: int = 1
    postprocessing_instances: int = 1
    max_queue_size: int = 64  # requests waiting for a dflash instance; more are rejected
    queue_timeout_us: int = 0  # 0: a request waits as long as it takes
    device: str = "cpu"
    num_threads: int = 0  # torch CPU threads per dflash instance; 0: the cores divided among the instances
    block_size: int = 0  # 0: the engine's; smaller overrides it, 1 = plain decoding (benchmark baseline)
    block_policy: str = "adaptive"  # each step's block size from measured costs; "fixed": always block_size
    tree_budget: int = 0  # draft nodes of a tree verify per sequence (torch runtime); 0: the chain
    # In-flight batching of each dflash instance (dflash_trt/decoding/scheduler/scheduler.py).
    max_batch_sequences: int = 16  # sequences decoding together; more wait in Triton's queue
    max_kv_tokens: int = 0  # rows x longest (prompt + max_tokens + block) the batch may hold; 0: see below
    prefill_chunk_tokens: int = 512  # prompt tokens prefilled per step: the stall a newcomer adds
    # Prompt-prefix blocks (target KV + drafter features) each instance keeps for reuse (scheduler/prefix_cache.py);
    # on top of max_kv_tokens' KV; 0: off. The trtllm runtime ignores it (TensorRT-LLM reuses its own KV blocks).
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES
    canary_tokens: int = DEFAULT_CANARY_TOKENS  # the load-time canary generation (canary.py); 0: off
    # NVIDIA's model.yaml triton_config.decoupled for the tensorrt_llm model: False (NVIDIA's default) answers
    # gRPC ModelInfer and HTTP /infer, as NVIDIA's llmapi_client.py calls it; True streams.
    tensorrt_llm_decoupled: bool = False

    def validate(self) -> None:
        if self.block_policy not in BLOCK_POLICIES:
            raise DFlashError(f"block_policy must be one of {', '.join(BLOCK_POLICIES)}, got {self.block_policy!r}")
        for name in ("dflash_instances", "preprocessing_instances", "postprocessing_instances", "max_queue_size",
                     "max_batch_sequences", "prefill_chunk_tokens"):
            if getattr(self, name) < 1:
                raise DFlashError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_prompt_bytes", "queue_timeout_us", "num_threads", "block_size", "max_kv_tokens",
                     "canary_tokens", "prefix_cache_bytes"):
            if getattr(self, name) < 0:
                raise DFlashError(f"{name} must be >= 0, got {getattr(self, name)}")
        check_tree_budget(self.tree_budget)


def engine_verification(engine) -> list[str]:
    """The verification methods an engine runs: its manifest's list (engines built before it: by runtime)."""
    return engine.manifest.get("verification") or verification_methods(engine.runtime)


def engine_limits(engine) -> tuple[int, int]:
    """(max_context_tokens, default max_tokens_limit) of a loaded engine manifest."""
    context = int(engine.manifest.get("preset", {}).get("max_seq_len") or 0)
    config = engine.target_path / "config.json"
    if engine.runtime != "trtllm" and config.is_file():
        positions = json.loads(config.read_text()).get("max_position_embeddings")
        if positions:
            context = min(context, int(positions)) if context else int(positions)
    if not context:
        raise DFlashError(f"{engine.directory}: cannot tell the context length (no max_seq_len in the manifest)")
    context -= engine.block_size  # the last verify step may look one block beyond the output
    return context, min(DEFAULT_MAX_TOKENS, context - 1)


def render_repository(config: RepoConfig) -> Path:
    """Write the models of the repository (the four Python models, both ensembles) into config.out."""
    from dflash_trt.engine import load_engine

    config.validate()
    engine = load_engine(config.engine_dir, verify=False, load_models=False)
    if config.tree_budget and "tree" not in engine_verification(engine):
        raise DFlashError(f"tree_budget: a {engine.runtime} engine verifies a chain only (its manifest lists no "
                          "tree: rebuild it, or a trtllm engine never has one); set it to 0")
    context, max_tokens = engine_limits(engine)
    context -= max(0, config.tree_budget + 1 - engine.block_size)  # a tree verify writes budget + 1 slots
    context = config.max_context_tokens or context
    max_tokens = config.max_tokens_limit or min(max_tokens, context - 1)
    if not 1 <= max_tokens < context:
        raise DFlashError(f"max_tokens_limit {max_tokens} must be in [1, {context}) (the context)")
    max_kv_tokens = config.max_kv_tokens or max(DEFAULT_MAX_KV_TOKENS, context + engine.block_size)
    if max_kv_tokens < context + engine.block_size:
        raise DFlashError(f"max_kv_tokens {config.max_kv_tokens} must hold one full context "
                          f"({context} + block {engine.block_size})")
    values = {
        "engine_dir": pbtxt_string(config.engine_path or str(Path(config.engine_dir).resolve())),
        "chat_template": pbtxt_string(chat_template_value(config.chat_template)),
        "max_tokens_limit": max_tokens,
        "max_context_tokens": context,
        "max_prompt_bytes": config.max_prompt_bytes,
        "dflash_instances": 1 if engine.runtime == "trtllm" else config.dflash_instances,
        "preprocessing_instances": config.preprocessing_instances,
        "postprocessing_instances": config.postprocessing_instances,
        "max_queue_size": config.max_queue_size,
        "queue_timeout_us": config.queue_timeout_us,
        "device": "cuda" if engine.runtime == "trtllm" else config.device,
        "num_threads": config.num_threads,
        "block_size": config.block_size,
        "block_policy": config.block_policy,
        "tree_budget": config.tree_budget,
        "max_batch_sequences": config.max_batch_sequences,
        "max_kv_tokens": max_kv_tokens,
        "prefill_chunk_tokens": config.prefill_chunk_tokens,
        "prefix_cache_bytes": config.prefix_cache_bytes,
        "canary_tokens": config.canary_tokens,
        "tensorrt_llm_decoupled": "true" if config.tensorrt_llm_decoupled else "false",
        # Every request the dflash instances can batch or queue; beyond that the queue would refuse them anyway.
        "trtllm_inputs": pbtxt_inputs(),
        "trtllm_input_map": pbtxt_input_map(),
        "trtllm_step_inputs": pbtxt_step_inputs(),
    }
    values["tensorrt_llm_max_in_flight"] = values["dflash_instances"] * config.max_batch_sequences + config.max_queue_size
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    for model in MODELS[:-1]:
        _render_model(model, out / model, values)
    for name, (max_batch_size, text_output_dims) in ENSEMBLES.items():
        _render_model("ensemble", out / name, {**values, "ensemble_name": name,
                                               "ensemble_max_batch_size": max_batch_size,
                                               "text_output_dims": text_output_dims})
    return out


def _render_model(model: str, target: Path, values: dict) -> None:
    source = TEMPLATES / model
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "config.pbtxt"))
    (target / "1").mkdir(exist_ok=True)  # the ensemble has no files in its version directory
    text = string.Template((source / "config.pbtxt").read_text()).substitute(values)
    (target / "config.pbtxt").write_text(text)


def chat_template_value(option: str) -> str:
    if option in (AUTO_TEMPLATE, NO_TEMPLATE, MODEL_TEMPLATE):
        return option
    path = Path(option)
    if not path.is_file():
        raise DFlashError(f"chat template {option!r}: expected 'auto', 'none', 'model' or a Jinja file")
    return path.read_text()


def pbtxt_string(value: str) -> str:
    """Escape a value for a double-quoted protobuf text-format string."""
    return (value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
            .replace("\t", "\\t"))
