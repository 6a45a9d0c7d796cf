"""The target's architecture, read from its config.json (or a GGUF file's metadata) without loading weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_trt.errors import ConfigError


@dataclass(frozen=True)
class TargetArch:
    """What the compatibility checks and the planner need to know about a target model."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    num_experts: int = 0  # 0 for a dense MLP
    experts_per_token: int = 0
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    quant_method: str | None = None  # e.g. "mxfp4" for gpt-oss as shipped

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_sliding_layers(self) -> int:
        return sum(1 for kind in self.layer_types if kind == "sliding_attention") if self.sliding_window else 0

    @property
    def num_full_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

    @classmethod
    def from_config(cls, data: dict[str, Any], source: str = "config.json") -> "TargetArch":
        data = data.get("text_config", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        hidden = _int(data, "hidden_size", source)
        heads = _int(data, "num_attention_heads", source)
        layers = _int(data, "num_hidden_layers", source)
        theta, scaling = _rope(data)
        layer_types = tuple(data.get("layer_types") or ())
        if layer_types and len(layer_types) != layers:
            raise ConfigError(f"{source}: layer_types has {len(layer_types)} entries for {layers} layers")
        quant = data.get("quantization_config") or {}
        return cls(
            model_type=str(data.get("model_type", "")),
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or hidden // heads),
            intermediate_size=_int(data, "intermediate_size", source),
            vocab_size=_int(data, "vocab_size", source),
            max_position_embeddings=int(data.get("max_position_embeddings") or 0),
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=bool(data.get("attention_bias", False)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            num_experts=int(data.get("num_local_experts") or data.get("num_experts") or 0),
            experts_per_token=int(data.get("num_experts_per_tok") or data.get("experts_per_token") or 0),
            layer_types=layer_types,
            sliding_window=data.get("sliding_window") or None,
            quant_method=quant.get("quant_method") if isinstance(quant, dict) else None,
        )


def read_target_config(path: Path) -> dict[str, Any]:
    """config.json of a model directory, or the config transformers derives from a GGUF file."""
    path = Path(path)
    if path.suffix == ".gguf":
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    config = path / "config.json"
    try:
        return json.loads(config.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{config}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config}: not valid JSON ({exc})") from None


def read_target_arch(path: Path) -> TargetArch:
    return TargetArch.from_config(read_target_config(path), str(path))


def _int(data: dict[str, Any], name: str, source: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{source}: field '{name}' must be a positive integer, got {value!r}")
    return value


def _rope(data: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers 5 writes rope_parameters; published configs carry rope_theta + rope_scaling.
    params = data.get("rope_parameters") or {}
    theta = float(data.get("rope_theta", params.get("rope_theta", 10000.0)))
    scaling = data.get("rope_scaling") or None
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return theta, scaling
