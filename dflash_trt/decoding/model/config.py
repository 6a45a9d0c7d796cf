"""The drafter's config.json: parsing, validation and the default target layer ids.

Two families share one format: DFlash (`DFlashDraftModel`) and DFlash2 (`DFlash2DraftModel`, which adds
grouped dynamic convolutions and a candidate selector). As in the reference, a drafter setting is read from
`dflash_config` first and from the top level second, for both families.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_trt.decoding.model.config_fields import (MISSING, attention_layers, draft_value, non_negative_int,
                                                     optional_float, positive_float, positive_int, rope_settings)
from dflash_trt.errors import ConfigError

CONFIG_NAME = "config.json"

# Architecture string of config.json -> drafter family (the key of dflash_trt.decoding.model.drafters.FAMILIES).
ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
FAMILY_ARCHITECTURE = {family: arch for arch, family in ARCHITECTURES.items()}

# Decoder geometry, read from the top level.
_GEOMETRY_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
# Drafter settings, read from dflash_config first and then the top level.
_DRAFT_INT_FIELDS = ("block_size", "num_target_layers")
# Required by DFlash2 only (no default in the reference).
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


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
    """What the runtime needs from a DFlash or DFlash2 drafter's config.json."""

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
    family: str = "dflash"
    # Per draft layer: the attention window W (a key at p is seen from P iff |P - p| < W; None = all) and
    # whether the block is masked causally (the reference: `is_causal` if given, else layer is sliding).
    layer_windows: tuple[int | None, ...] = ()
    layer_causal: tuple[bool, ...] = ()
    # Draft logits: z * output_multiplier, then c * tanh(z / c) when final_logit_softcapping c is set.
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0
    # DFlash2 only (0 for DFlash).
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    # The whole config.json as read, so that saving writes back every key (architectures, auto_map, ...).
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        layers = self.num_hidden_layers
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (None,) * layers)
        if not self.layer_causal:
            object.__setattr__(self, "layer_causal", (False,) * layers)

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def architecture(self) -> str:
        return FAMILY_ARCHITECTURE[self.family]

    @property
    def is_sliding(self) -> bool:
        """Whether some draft layer attends only within a window (its context cache stays bounded)."""
        return any(w is not None for w in self.layer_windows)

    @property
    def is_plain_attention(self) -> bool:
        """Every layer attends to every context row without a mask (what the attention plugin computes)."""
        return not self.is_sliding and not any(self.layer_causal)

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
        data["architectures"] = [self.architecture]
        data.setdefault("model_type", "qwen3")
        for name in _GEOMETRY_FIELDS + _DRAFT_INT_FIELDS + ("head_dim", "rms_norm_eps", "rope_theta",
                                                            "attention_bias", "max_position_embeddings"):
            data[name] = getattr(self, name)
        data["rope_scaling"] = self.rope_scaling
        dflash = dict(data.get("dflash_config") or {})
        dflash["target_layer_ids"] = list(self.target_layer_ids)
        dflash["mask_token_id"] = self.mask_token_id
        extra = DFLASH2_FIELDS + ("block_size",) if self.family == "dflash2" else ()
        for name in extra + tuple(k for k in _DRAFT_INT_FIELDS if k in dflash):
            dflash[name] = getattr(self, name)
        for name, default in (("output_multiplier", 1.0), ("final_logit_softcapping", None),
                              ("input_embedding_scale", 1.0)):
            value = getattr(self, name)
            if value != default or name in dflash:
                dflash[name] = value
                data.pop(name, None)
        data["dflash_config"] = dflash
        return data


def _parse(data: dict[str, Any], source: str) -> DrafterConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object")
    dflash = data.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise ConfigError(f"{source}: dflash_config must be an object")
    values: dict[str, Any] = {"family": _family(data, source)}
    for name in _GEOMETRY_FIELDS:
        values[name] = positive_int(data.get(name, MISSING), name, source)
    for name in _DRAFT_INT_FIELDS:
        values[name] = positive_int(draft_value(data, name, MISSING), name, source)

    heads, kv_heads = values["num_attention_heads"], values["num_key_value_heads"]
    if heads % kv_heads:
        raise ConfigError(f"{source}: num_attention_heads ({heads}) is not a multiple of "
                          f"num_key_value_heads ({kv_heads})")
    values["head_dim"] = positive_int(data.get("head_dim") or values["hidden_size"] // heads, "head_dim", source)

    mask_token_id = draft_value(data, "mask_token_id")
    if mask_token_id is None:
        raise ConfigError(f"{source}: dflash_config.mask_token_id is missing")
    values["mask_token_id"] = non_negative_int(mask_token_id, "dflash_config.mask_token_id", source)

    layer_ids = draft_value(data, "target_layer_ids")
    if layer_ids is None:
        layer_ids = default_target_layer_ids(values["num_target_layers"], values["num_hidden_layers"])
    values["target_layer_ids"] = _layer_ids(layer_ids, values["num_target_layers"], source)

    values["layer_windows"], values["layer_causal"] = attention_layers(data, values["num_hidden_layers"], source)
    values["output_multiplier"] = positive_float(draft_value(data, "output_multiplier", 1.0),
                                                 "output_multiplier", source)
    values["final_logit_softcapping"] = optional_float(draft_value(data, "final_logit_softcapping"),
                                                       "final_logit_softcapping", source)
    values["input_embedding_scale"] = positive_float(draft_value(data, "input_embedding_scale", 1.0),
                                                     "input_embedding_scale", source)
    if values["family"] == "dflash2":
        values.update(_dflash2_fields(data, values, source))

    values["rms_norm_eps"] = float(data.get("rms_norm_eps", 1e-6))
    values["attention_bias"] = bool(data.get("attention_bias", False))
    values["max_position_embeddings"] = int(data.get("max_position_embeddings", 32768))
    values["rope_theta"], values["rope_scaling"] = rope_settings(data, source)
    return DrafterConfig(**values, raw=dict(data))


def _family(data: dict[str, Any], source: str) -> str:
    architectures = data.get("architectures")
    if architectures is None:
        return "dflash"  # older DFlash configs name no architecture
    if (not isinstance(architectures, list) or len(architectures) != 1
            or architectures[0] not in ARCHITECTURES):
        raise ConfigError(f"{source}: architectures {architectures!r} is not a DFlash drafter "
                          f"(expected [\"DFlashDraftModel\"] or [\"DFlash2DraftModel\"])")
    return ARCHITECTURES[architectures[0]]


def _dflash2_fields(data: dict[str, Any], values: dict[str, Any], source: str) -> dict[str, int]:
    fields = {}
    for name in DFLASH2_FIELDS:
        value = draft_value(data, name, MISSING)
        if value is MISSING:
            raise ConfigError(f"{source}: DFlash2DraftModel needs dflash_config.{name}, which is missing")
        fields[name] = positive_int(value, f"dflash_config.{name}", source)
    hidden = values["hidden_size"]
    if hidden % fields["conv_group_size"]:
        raise ConfigError(f"{source}: dflash_config.conv_group_size {fields['conv_group_size']} does not "
                          f"divide hidden_size {hidden}")
    if fields["selector_top_k"] > values["vocab_size"]:
        raise ConfigError(f"{source}: dflash_config.selector_top_k {fields['selector_top_k']} exceeds "
                          f"vocab_size {values['vocab_size']}")
    return fields


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
