"""The postprocessing model's work: token window -> text, statistics passed through unchanged."""

from __future__ import annotations

import numpy as np

from dflash_trt.serving.detokenize import decode_chunk
from dflash_trt.serving.requests import OUTPUTS, decode_text, scalar
from dflash_trt.serving.triton_io import string_array

INPUTS = {
    "output_ids": "TYPE_INT32",
    "num_context_tokens": "TYPE_INT32",
    "num_output_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "acceptance_rate": "TYPE_FP32",
    "finish_reason": "TYPE_STRING",
}
PASSED_THROUGH = ("num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate",
                  "finish_reason")


def postprocess(tokenizer, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of the ensemble for one chunk of the dflash model."""
    window = np.asarray(arrays["output_ids"]).reshape(-1).tolist()
    num_context = int(scalar(arrays, "num_context_tokens"))
    finish_reason = decode_text(scalar(arrays, "finish_reason"), "finish_reason")
    text = decode_chunk(tokenizer, window, num_context, is_final=bool(finish_reason))
    outputs = {"text_output": string_array([text])}
    outputs.update({name: np.asarray(arrays[name]).reshape(1) for name in PASSED_THROUGH})
    assert set(outputs) == set(OUTPUTS)  # internal invariant: the ensemble's output contract
    return outputs
