"""Translation between Triton's Python-backend objects and plain numpy / Python values.

`pb` is the `triton_python_backend_utils` module, passed in by the model.py files (and a fake in the
unit tests); it is never imported here, and its classes are looked up at call time because the stub
replaces them after import.
"""

from __future__ import annotations

import json
from typing import Iterable

import numpy as np

from dflash_trt.serving.requests import RequestLimits


def read_inputs(pb, request, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The inputs of `request` among `names` that the client sent, as numpy arrays."""
    arrays = {}
    for name in names:
        tensor = pb.get_input_tensor_by_name(request, name)
        if tensor is not None:
            arrays[name] = tensor.as_numpy()
    return arrays


def request_parameters(request) -> dict:
    """The request's parameters (Triton's /generate puts every JSON field that is not an input there)."""
    raw = request.parameters() if hasattr(request, "parameters") else "{}"
    parameters = json.loads(raw) if isinstance(raw, str) and raw else (raw or {})
    return dict(parameters)


def string_array(values: Iterable[str]) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=object)


def response(pb, outputs: dict[str, np.ndarray]):
    return pb.InferenceResponse(output_tensors=[pb.Tensor(name, value) for name, value in outputs.items()])


def error_response(pb, message: str):
    return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message))


def model_parameters(model_config: dict) -> dict[str, str]:
    """`parameters { key: ... value: { string_value: ... } }` of a model config, as a plain dict."""
    return {key: entry.get("string_value", "") for key, entry in model_config.get("parameters", {}).items()}


def parse_model_config(args: dict) -> dict:
    return json.loads(args["model_config"])


def int_parameter(params: dict[str, str], name: str, default: int, model: str) -> int:
    value = params.get(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"model '{model}': parameter {name}={value!r} is not an integer") from None


def request_limits(params: dict[str, str], model: str) -> RequestLimits:
    """The RequestLimits a model config's parameters set (max_tokens_limit, max_context_tokens,
    max_prompt_bytes); a parameter the config lacks keeps RequestLimits' default."""
    defaults = RequestLimits()
    return RequestLimits(
        max_tokens=int_parameter(params, "max_tokens_limit", defaults.max_tokens, model),
        max_context_tokens=int_parameter(params, "max_context_tokens", defaults.max_context_tokens, model),
        max_prompt_bytes=int_parameter(params, "max_prompt_bytes", defaults.max_prompt_bytes, model),
    )


def require_decoupled(model_config: dict, model: str) -> None:
    if not model_config.get("model_transaction_policy", {}).get("decoupled", False):
        raise ValueError(f"model '{model}' streams its answers: set model_transaction_policy {{ decoupled: true }}")


def check_tensors(model_config: dict, model: str, expected_inputs: dict, expected_outputs: dict) -> None:
    """Fail at load time when the config's tensors differ from what the model.py reads and writes.

    expected_*: name -> Triton data type (e.g. "TYPE_INT32"); inputs not listed are refused.
    """
    for kind, expected in (("input", expected_inputs), ("output", expected_outputs)):
        declared = {t["name"]: t["data_type"] for t in model_config.get(kind, [])}
        missing = sorted(set(expected) - set(declared))
        if missing:
            raise ValueError(f"model '{model}': config lacks {kind}(s) {', '.join(missing)}")
        for name, data_type in declared.items():
            if name not in expected:
                raise ValueError(f"model '{model}': unknown {kind} '{name}' in config")
            if data_type != expected[name]:
                raise ValueError(f"model '{model}': {kind} '{name}' is {data_type}, expected {expected[name]}")


def instance_count(model_config: dict) -> int:
    """Instances of the model in this server (the sum over its instance groups; 1 when none is given)."""
    groups = model_config.get("instance_group") or []
    return max(1, sum(int(group.get("count", 1)) for group in groups))
