"""Creation fields of the DFlashAttention op (TensorRT plugin fields = ONNX node attributes).

The names equal the C++ constants of plugins/dflashAttention/dflashAttentionConfig.h; a test checks it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ROPE_DEFAULT = 0
ROPE_YARN = 1


@dataclass(frozen=True)
class AttentionFields:
    """Fields in the order of the C struct DflashAttentionFields. Zero in an optional YaRN float means unset."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_type: int = ROPE_DEFAULT
    rope_theta: float = 10000.0
    yarn_factor: float = 1.0
    yarn_original_max_position_embeddings: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_attention_factor: float = 0.0
    yarn_mscale: float = 0.0
    yarn_mscale_all_dim: float = 0.0
    yarn_truncate: int = 1

    @classmethod
    def from_rope(cls, num_heads: int, num_kv_heads: int, head_dim: int, rope_theta: float,
                  rope_scaling: dict[str, Any] | None = None) -> "AttentionFields":
        """Fields of a drafter's attention from its config values (rope_scaling as in config.json)."""
        base = cls(num_heads, num_kv_heads, head_dim, rope_theta=float(rope_theta))
        if not rope_scaling:
            return base
        kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
        if kind in (None, "default"):
            return base
        if kind != "yarn":
            from dflash_trt.errors import ConfigError
            raise ConfigError(f"DFlashAttention supports rope_type default or yarn, not {kind!r}")
        return dataclasses.replace(
            base,
            rope_type=ROPE_YARN,
            yarn_factor=float(rope_scaling["factor"]),
            yarn_original_max_position_embeddings=int(rope_scaling["original_max_position_embeddings"]),
            yarn_beta_fast=float(rope_scaling.get("beta_fast") or 32.0),
            yarn_beta_slow=float(rope_scaling.get("beta_slow") or 1.0),
            yarn_attention_factor=float(rope_scaling.get("attention_factor") or 0.0),
            yarn_mscale=float(rope_scaling.get("mscale") or 0.0),
            yarn_mscale_all_dim=float(rope_scaling.get("mscale_all_dim") or 0.0),
            yarn_truncate=int(bool(rope_scaling.get("truncate", True))),
        )

    def attributes(self) -> dict[str, int | float]:
        """Name -> value, the ONNX attributes / plugin fields of the node."""
        return dataclasses.asdict(self)


# Fields that are integers (the others are floats) in the op's float list and the ONNX node's attributes.
INT_FIELDS = frozenset({"num_heads", "num_kv_heads", "head_dim", "rope_type",
                        "yarn_original_max_position_embeddings", "yarn_truncate"})
FIELD_NAMES = tuple(f.name for f in dataclasses.fields(AttentionFields))


def fields_to_list(fields: AttentionFields) -> list[float]:
    """Fields as the op's float-list argument (order of FIELD_NAMES)."""
    return [float(getattr(fields, name)) for name in FIELD_NAMES]


def fields_from_list(values: list[float]) -> AttentionFields:
    return AttentionFields(**{name: int(v) if name in INT_FIELDS else float(v) for name, v in zip(FIELD_NAMES, values)})
