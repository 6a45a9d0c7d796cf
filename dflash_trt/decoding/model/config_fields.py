"""Reading single fields of a drafter config.json: typed values, RoPE, and each layer's attention pattern."""

from __future__ import annotations

from typing import Any

from dflash_trt.errors import ConfigError

LAYER_TYPES = ("full_attention", "sliding_attention")
MISSING = object()  # a field absent from config.json (null is a value, and wrong for an integer field)


def draft_value(data: dict[str, Any], name: str, default: Any = None) -> Any:
    """`dflash_config[name]`, else the top-level `name`, else `default` (the reference's lookup order)."""
    dflash = data.get("dflash_config") or {}
    if name in dflash:
        return dflash[name]
    return data.get(name, default)


def positive_int(value: Any, name: str, source: str) -> int:
    if value is MISSING:
        raise ConfigError(f"{source}: field '{name}' is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{source}: field '{name}' must be a positive integer, got {value!r}")
    return value


def non_negative_int(value: Any, name: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{source}: {name} must be a non-negative integer, got {value!r}")
    return value


def positive_float(value: Any, name: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{source}: field '{name}' must be a positive number, got {value!r}")
    return float(value)


def optional_float(value: Any, name: str, source: str) -> float | None:
    """A cap that is off when absent, null or <= 0 (as in the reference)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: field '{name}' must be a number, got {value!r}")
    return float(value) if value > 0 else None


def attention_layers(data: dict[str, Any], num_layers: int, source: str
                     ) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
    """Per draft layer: (window or None, causal), as a Qwen3 config and the reference read them.

    The window exists only with use_sliding_window; layer_types defaults to sliding layers from
    max_window_layers on. A layer is causal when `is_causal` says so, or, without that key, when it is a
    sliding layer: published sliding drafters therefore write `is_causal: false`.
    """
    window = data.get("sliding_window") if data.get("use_sliding_window") else None
    if window is not None:
        window = positive_int(window, "sliding_window", source)
    layer_types = data.get("layer_types")
    if layer_types is None:
        first_sliding = data.get("max_window_layers", 28)
        layer_types = ["sliding_attention" if window is not None and i >= first_sliding else "full_attention"
                       for i in range(num_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ConfigError(f"{source}: layer_types must list one type per layer ({num_layers}), got {layer_types!r}")
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise ConfigError(f"{source}: layer_types {unknown} are not supported (full_attention or sliding_attention)")
    is_causal = data.get("is_causal")
    if is_causal is not None and not isinstance(is_causal, bool):
        raise ConfigError(f"{source}: is_causal must be true or false, got {is_causal!r}")
    windows = tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    causal = tuple(is_causal if is_causal is not None else kind == "sliding_attention" for kind in layer_types)
    return windows, causal


def rope_settings(data: dict[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
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
