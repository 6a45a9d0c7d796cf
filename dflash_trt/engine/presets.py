"""Model-pair presets: build/presets/<name>.yaml, parsed strictly into a frozen Preset.

A preset names the two checkpoints and the build defaults (runtime, TP/EP, dtype, quantization, block
size, serving limits). Every default lives in the dataclasses below; a YAML key they do not know is an
error that names the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_trt.engine.artifacts.trtllm_schema import MOE_BACKENDS  # TensorRT-LLM's MoeConfig.backend values
from dflash_trt.engine.recipes import PROFILES  # NVIDIA's gpt-oss-120b recipe settings; "none" adds nothing
from dflash_trt.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
PRESET_DIR = REPO_ROOT / "build" / "presets"
# The published config.json of every preset's target and drafter (<org>/<name>/config.json): public facts,
# enough to plan a layout before downloading any weights.
SHIPPED_CONFIGS = PRESET_DIR / "configs"
DEFAULT_PRESET = "smollm2-135m"

RUNTIMES = ("torch", "onnx", "tensorrt", "trtllm")
QUANTS = ("none", "fp8", "nvfp4", "mxfp4")
DTYPES = ("float32", "bfloat16", "float16")
KV_DTYPES = ("bf16", "fp8")
GPUS = ("h100", "h200", "b200", "b300")
# TensorRT-LLM's DFlashDecodingConfig.attention_backend values (artifacts/trtllm_schema.py says from which
# version); which GPU runs which is checked by artifacts/trtllm.py.
DRAFT_ATTENTION_BACKENDS = ("VANILLA", "TRTLLM", "FA4")


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file shipped inside an installed Python package (found without importing the package)."""

    package: str
    file: str
    install: str = ""  # the pip command that provides the package, for the 'missing' message


@dataclass(frozen=True)
class CheckpointSpec:
    """Where a checkpoint comes from: a Hugging Face id, optionally a repository path or a GGUF file."""

    id: str
    path: str | None = None  # a directory relative to the repository root, tried first
    gguf: GgufSource | None = None


@dataclass(frozen=True)
class Preset:
    """One supported target/drafter pair and how to build it."""

    name: str
    target: CheckpointSpec
    drafter: CheckpointSpec
    block_size: int
    description: str = ""
    runtime: str = "torch"
    tp: int = 1
    ep: int = 1
    dtype: str = "bfloat16"
    quant: str = "none"
    kv_dtype: str = "bf16"
    gpu: str = "h200"
    memory_fraction: float = 0.9
    max_batch_size: int = 64
    max_seq_len: int = 8192
    moe_backend: str = "AUTO"  # AUTO: chosen per GPU architecture (engine/moe.py states the rule)
    profile: str = "none"  # latency / throughput: NVIDIA's recipe settings (engine/recipes.py)
    draft_attention_backend: str = "VANILLA"
    # trtllm: KV-cache block (prefix) reuse. Off by default: a prefix-cache hit skips the target forward over
    # the reused tokens, so the drafter gets no hidden states for them (TensorRT-LLM's own DFlash tests run
    # with reuse off; in vLLM prefix reuse collapsed DFlash acceptance, vllm-project/vllm#47930).
    kv_block_reuse: bool = False
    cuda_graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    source: str = field(default="", compare=False)

    @property
    def max_draft_len(self) -> int:
        """Draft tokens per verify step: the block's first slot is the last committed token."""
        return self.block_size - 1

    def with_overrides(self, **overrides: Any) -> "Preset":
        """A copy with the given fields replaced (None means 'keep the preset's value'), validated again."""
        values = {k: v for k, v in overrides.items() if v is not None}
        preset = dataclasses.replace(self, **values)
        _validate(preset, f"{self.source} (with command-line overrides)")
        return preset


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name_or_path: str) -> Preset:
    """Load a preset by name (build/presets/<name>.yaml) or from a YAML file path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PRESET_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown preset '{name_or_path}' (known: {', '.join(preset_names())}; "
                              "or pass a preset .yaml file)")
    elif not path.is_file():
        raise ConfigError(f"{path}: preset file not found")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    return preset_from_dict(data, str(path))


def preset_from_dict(data: Any, source: str) -> Preset:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a preset is a mapping of keys to values")
    values = _fields(Preset, data, source)
    values["target"] = _checkpoint(values.get("target"), f"{source}: target", source)
    values["drafter"] = _checkpoint(values.get("drafter"), f"{source}: drafter", source)
    if "cuda_graph_batch_sizes" in values:
        sizes = values["cuda_graph_batch_sizes"]
        if not isinstance(sizes, list) or not sizes or not all(_is_int(s) and s > 0 for s in sizes):
            raise ConfigError(f"{source}: cuda_graph_batch_sizes must be a non-empty list of positive integers")
        values["cuda_graph_batch_sizes"] = tuple(sorted(set(sizes)))
    preset = Preset(**values, source=source)
    _validate(preset, source)
    return preset


def _fields(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    known = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
    unknown = [k for k in data if k not in known]
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}' (known keys: {', '.join(known)})")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data and k != "source"]
    if missing:
        raise ConfigError(f"{where}: required key '{missing[0]}' is missing")
    return dict(data)


def _checkpoint(data: Any, where: str, source: str) -> CheckpointSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping with at least 'id'")
    values = _fields(CheckpointSpec, data, where)
    if not isinstance(values["id"], str) or not values["id"]:
        raise ConfigError(f"{where}.id must be a non-empty string (a Hugging Face id such as org/name)")
    if values.get("gguf") is not None:
        gguf = values["gguf"]
        if not isinstance(gguf, dict):
            raise ConfigError(f"{where}.gguf must be a mapping with 'package' and 'file'")
        values["gguf"] = GgufSource(**_fields(GgufSource, gguf, f"{where}.gguf"))
    return CheckpointSpec(**values)


def _validate(p: Preset, source: str) -> None:
    _choice(p.runtime, RUNTIMES, "runtime", source)
    _choice(p.quant, QUANTS, "quant", source)
    _choice(p.dtype, DTYPES, "dtype", source)
    _choice(p.kv_dtype, KV_DTYPES, "kv_dtype", source)
    _choice(p.gpu, GPUS, "gpu", source)
    _choice(p.moe_backend, MOE_BACKENDS, "moe_backend", source)
    _choice(p.draft_attention_backend, DRAFT_ATTENTION_BACKENDS, "draft_attention_backend", source)
    _choice(p.profile, PROFILES, "profile", source)
    for name in ("tp", "ep", "max_batch_size", "max_seq_len"):
        value = getattr(p, name)
        if not _is_int(value) or value < 1:
            raise ConfigError(f"{source}: {name} must be a positive integer, got {value!r}")
    if not _is_int(p.block_size) or p.block_size < 2:
        raise ConfigError(f"{source}: block_size must be an integer >= 2 (1 is plain decoding), got {p.block_size!r}")
    if p.tp % p.ep:
        raise ConfigError(f"{source}: ep ({p.ep}) must divide tp ({p.tp}): the MoE layers split the tp GPUs "
                          "into ep expert groups")
    if not isinstance(p.kv_block_reuse, bool):
        raise ConfigError(f"{source}: kv_block_reuse must be true or false, got {p.kv_block_reuse!r}")
    if isinstance(p.memory_fraction, bool) or not isinstance(p.memory_fraction, (int, float)) \
            or not 0 < p.memory_fraction <= 1:
        raise ConfigError(f"{source}: memory_fraction must be in (0, 1], got {p.memory_fraction!r}")


def _choice(value: Any, allowed: tuple[str, ...], name: str, source: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{source}: {name} '{value}' is not one of {', '.join(allowed)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
