"""The drafter's config.json: parsing, validation and the default target layer ids."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

CONFIG_NAME = "config.json"

# Fields the drafter needs; every other key of config.json is kept verbatim for round-trips.
_REQUIRED_INT_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "block_size",
    "num_target_layers",
)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers a drafter reads when its config names none (the reference formula).

    K draft layers spread evenly over layers 1 .. N-3 of an N-layer target, rounded half to even.
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DrafterConfig:
    """What the runtime needs from a DFlash drafter's config.json."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    # The whole config.json as read, so that saving writes back every key (architectures, auto_map, ...).
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = CONFIG_NAME) -> "DrafterConfig":
        return _parse(data, source)

    @classmethod
    def from_file(cls, path: str | Path) -> "DrafterConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: file not found")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        return _parse(data, str(path))

    def to_dict(self) -> dict[str, Any]:
        """config.json content in the published format (unknown keys of the source kept)."""
        data = dict(self.raw)
        for name in _REQUIRED_INT_FIELDS + ("head_dim", "rms_norm_eps", "rope_theta", "attention_bias",
                                            "max_position_embeddings"):
            data[name] = getattr(self, name)
        data["rope_scaling"] = self.rope_scaling
        dflash = dict(data.get("dflash_config") or {})
        dflash["target_layer_ids"] = list(self.target_layer_ids)
        dflash["mask_token_id"] = self.mask_token_id
        data["dflash_config"] = dflash
        return data


def _parse(data: dict[str, Any], source: str) -> DrafterConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object")
    values: dict[str, Any] = {}
    for name in _REQUIRED_INT_FIELDS:
        values[name] = _positive_int(data, name, source)

    heads, kv_heads = values["num_attention_heads"], values["num_key_value_heads"]
    if heads % kv_heads:
        raise ConfigError(f"{source}: num_attention_heads ({heads}) is not a multiple of "
                          f"num_key_value_heads ({kv_heads})")
    head_dim = data.get("head_dim") or values["hidden_size"] // heads
    values["head_dim"] = _positive_int({"head_dim": head_dim}, "head_dim", source)

    _reject_sliding_window(data, source)

    dflash = data.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise ConfigError(f"{source}: dflash_config must be an object")
    if "mask_token_id" not in dflash:
        raise ConfigError(f"{source}: dflash_config.mask_token_id is missing")
    mask_token_id = dflash["mask_token_id"]
    if not isinstance(mask_token_id, int) or mask_token_id < 0:
        raise ConfigError(f"{source}: dflash_config.mask_token_id must be a non-negative integer")
    values["mask_token_id"] = mask_token_id

    layer_ids = dflash.get("target_layer_ids")
    if layer_ids is None:
        layer_ids = default_target_layer_ids(values["num_target_layers"], values["num_hidden_layers"])
    values["target_layer_ids"] = _layer_ids(layer_ids, values["num_target_layers"], source)

    values["rms_norm_eps"] = float(data.get("rms_norm_eps", 1e-6))
    values["attention_bias"] = bool(data.get("attention_bias", False))
    values["max_position_embeddings"] = int(data.get("max_position_embeddings", 32768))
    values["rope_theta"], values["rope_scaling"] = _rope(data, source)
    return DrafterConfig(**values, raw=dict(data))


def _positive_int(data: dict[str, Any], name: str, source: str) -> int:
    if name not in data:
        raise ConfigError(f"{source}: field '{name}' is missing")
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{source}: field '{name}' must be a positive integer, got {value!r}")
    return value


def _layer_ids(layer_ids: Any, num_target_layers: int, source: str) -> tuple[int, ...]:
    if not isinstance(layer_ids, list) or not layer_ids or not all(isinstance(i, int) for i in layer_ids):
        raise ConfigError(f"{source}: dflash_config.target_layer_ids must be a non-empty list of integers")
    if list(layer_ids) != sorted(set(layer_ids)):
        raise ConfigError(f"{source}: dflash_config.target_layer_ids must be strictly ascending, got {layer_ids}")
    bad = [i for i in layer_ids if not 0 <= i < num_target_layers]
    if bad:
        raise ConfigError(f"{source}: dflash_config.target_layer_ids {bad} outside the target's "
                          f"{num_target_layers} layers (num_target_layers)")
    return tuple(layer_ids)


def _rope(data: dict[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    # Older configs carry rope_theta and rope_scaling; transformers 5 writes rope_parameters instead.
    params = data.get("rope_parameters") or {}
    scaling = data.get("rope_scaling") or None
    theta = data.get("rope_theta", params.get("rope_theta", 10000.0))
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "yarn"):
            raise ConfigError(f"{source}: rope_scaling type '{kind}' is not supported (default or yarn)")
        if kind == "default":
            scaling = None
        else:
            for key in ("factor", "original_max_position_embeddings"):
                if key not in scaling:
                    raise ConfigError(f"{source}: rope_scaling.{key} is missing for YaRN")
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError(f"{source}: rope_theta must be positive, got {theta!r}")
    return float(theta), scaling


def _reject_sliding_window(data: dict[str, Any], source: str) -> None:
    layer_types = data.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        raise ConfigError(f"{source}: layer_types {sorted(set(layer_types))}: sliding-window drafters are "
                          "not supported yet (only full_attention layers)")
    if data.get("use_sliding_window"):
        raise ConfigError(f"{source}: use_sliding_window is set: sliding-window drafters are not supported yet")
