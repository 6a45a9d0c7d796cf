"""The optional inputs of TensorRT-LLM's ensemble that DFlash serving accepts only at their neutral values.

Clients written for TensorRT-LLM's triton_backend ensemble send these tensors, often with their default
values (`bad_words: ""`, `beam_width: 1`, `return_log_probs: false`). The ensemble declares them with
TensorRT-LLM's names, types and dims so such clients work unchanged. A value that asks for something this
server does not do (beam search, log probs, an embedding bias) is refused with an error naming the
tensor, never ignored: a client must not silently get a different behaviour.

TensorRT-LLM's logits controls (min_tokens, bad_words, repetition_penalty, presence_penalty,
frequency_penalty) are not here: the local runtimes serve them (requests.INPUTS, dflash_trt/decoding/step/logits_processors.py);
the trtllm runtime serves what TensorRT-LLM applies under DFlash and refuses the rest (trtllm_admission.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class CompatInput:
    triton_type: str  # e.g. "TYPE_INT32"
    dims: str  # as in TensorRT-LLM's config.pbtxt: "1" or "-1"
    accepts: Callable[[np.ndarray], bool]  # whether the value leaves the behaviour unchanged
    neutral: str  # what a client may send, for the error message


def _all_empty_strings(array: np.ndarray) -> bool:
    return all(not (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)).strip()
               for v in array.reshape(-1))


def _all(value) -> Callable[[np.ndarray], bool]:
    return lambda array: bool(np.all(array.reshape(-1) == value))


def _any_finite(array: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(array.astype(np.float64))))


# Kinds of numpy dtype accepted per Triton type (Triton converts JSON numbers; gRPC sends the exact type).
KINDS = {"TYPE_STRING": "OSU", "TYPE_INT32": "iu", "TYPE_FP32": "f", "TYPE_BOOL": "b"}

COMPAT_INPUTS = {
    "decoder_text_input": CompatInput("TYPE_STRING", "1", _all_empty_strings,
                                      "empty (encoder-decoder models are not served)"),
    "num_return_sequences": CompatInput("TYPE_INT32", "1", _all(1), "1 (one sequence per request)"),
    # pad_id only pads the outputs of a batch of beams; there is one sequence per request.
    "pad_id": CompatInput("TYPE_INT32", "1", lambda array: True, "any"),
    # TensorRT-LLM applies length_penalty only to beam search, which beam_width 1 rules out.
    "length_penalty": CompatInput("TYPE_FP32", "1", _any_finite, "any finite value (beam search only)"),
    "return_log_probs": CompatInput("TYPE_BOOL", "1", _all(False), "false (log probs are not returned)"),
    "return_context_logits": CompatInput("TYPE_BOOL", "1", _all(False), "false (logits are not returned)"),
    "return_generation_logits": CompatInput("TYPE_BOOL", "1", _all(False), "false (logits are not returned)"),
    "return_perf_metrics": CompatInput("TYPE_BOOL", "1", _all(False),
                                       "false (see the Prometheus metrics instead)"),
    "return_num_input_tokens": CompatInput("TYPE_BOOL", "1", _all(False), "false (num_input_tokens is not returned)"),
    "return_num_output_tokens": CompatInput("TYPE_BOOL", "1", lambda array: True,
                                            "any (num_output_tokens is always returned)"),
    "beam_width": CompatInput("TYPE_INT32", "1", _all(1), "1 (beam search is not supported)"),
    "embedding_bias_words": CompatInput("TYPE_STRING", "-1", _all_empty_strings,
                                        "empty (an embedding bias is not supported)"),
    "embedding_bias_weights": CompatInput("TYPE_FP32", "-1", _all(0.0), "empty or zeros (an embedding bias is "
                                                                         "not supported)"),
}


def unsupported_value(name: str, array) -> str | None:
    """The one-line error for a compatibility input whose value changes the behaviour, or None."""
    spec = COMPAT_INPUTS[name]
    array = np.asarray(array)
    if spec.accepts(array):
        return None
    values = [_shown(v) for v in array.reshape(-1).tolist()]
    shown = values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"
    return f"input '{name}' = {shown} is not supported by DFlash serving; send {spec.neutral} or leave it out"


def _shown(value) -> str:
    if isinstance(value, bytes):
        return repr(value.decode("utf-8", "replace"))
    if isinstance(value, float):
        return f"{value:.6g}"  # fp32 inputs: 1.2, not 1.2000000476837158
    return repr(value)


def pbtxt_inputs() -> str:
    """The compatibility inputs as config.pbtxt input entries (one a line, comma-separated)."""
    return ",\n".join(f'  {{ name: "{name}" data_type: {spec.triton_type} dims: [ {spec.dims} ] optional: true }}'
                      for name, spec in COMPAT_INPUTS.items())


def pbtxt_input_map() -> str:
    """input_map entries passing every compatibility input to the preprocessing model, which validates them."""
    return "\n".join(f'      input_map {{ key: "{name}" value: "{name}" }}' for name in COMPAT_INPUTS)


# The inputs of TensorRT-LLM's own `preprocessing` step model, which NVIDIA's step-by-step test
# (tools/inflight_batcher_llm/end_to_end_test.py without --test-llmapi) calls directly. Ours is a different
# step behind the same name: the preprocessing model declares these (any shape) only to refuse them with
# what to call instead, where Triton would refuse them with "unexpected inference input".
TRTLLM_STEP_INPUTS = {
    "QUERY": "TYPE_STRING", "DECODER_QUERY": "TYPE_STRING", "REQUEST_OUTPUT_LEN": "TYPE_INT32",
    "BAD_WORDS_DICT": "TYPE_STRING", "STOP_WORDS_DICT": "TYPE_STRING", "EMBEDDING_BIAS_WORDS": "TYPE_STRING",
    "EMBEDDING_BIAS_WEIGHTS": "TYPE_FP32", "END_ID": "TYPE_INT32", "PAD_ID": "TYPE_INT32",
}
STEP_REFUSAL = ("model 'preprocessing' is an internal step of this server's ensemble, not TensorRT-LLM's "
                "preprocessing model (it got {names}); its step models are not served: send the request to "
                "'ensemble' (TensorRT-LLM's ensemble inputs) or 'tensorrt_llm' (its LLM-API inputs; "
                "end_to_end_test.py --test-llmapi)")


def step_refusal(names) -> str:
    return STEP_REFUSAL.format(names=", ".join(sorted(names)))


def pbtxt_step_inputs() -> str:
    """TRTLLM_STEP_INPUTS as config.pbtxt input entries: optional, any rank-2 shape ([1, 1], [1, N])."""
    return ",\n".join(f'  {{ name: "{name}" data_type: {kind} dims: [ -1, -1 ] optional: true }}'
                       for name, kind in TRTLLM_STEP_INPUTS.items())
