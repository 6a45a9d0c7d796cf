"""The postprocessing model's work: token window -> text, statistics passed through unchanged.

Shapes are those of TensorRT-LLM's ensemble, whose clients index them (end_to_end_grpc_client.py reads
`text_output[0].decode()` and `batch_index[0][0]`): the model batches (max_batch_size 1) and returns
text_output as [1] (one string per batch row, as NVIDIA's postprocessing does) and every other output as
[1, 1]. Triton's ensemble passes a batching step's tensors on unchanged and drops the batch row of 1 for
`ensemble_unbatched`, whose outputs are all [1].
"""

from __future__ import annotations

import numpy as np

from dflash_trt.serving.detokenize import decode_chunk
from dflash_trt.serving.dflash_service import OUTPUTS as DFLASH_OUTPUTS
from dflash_trt.serving.requests import decode_text, scalar
from dflash_trt.serving.triton_io import error_response, read_inputs, response, string_array

# Postprocessing consumes what the dflash model emits (one definition of that contract), except the stop word,
# which only the tensorrt_llm contract returns.
INPUTS = {name: kind for name, kind in DFLASH_OUTPUTS.items() if name != "stop_reason"}
PASSED_THROUGH = ("num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens", "num_verify_steps",
                  "acceptance_rate", "num_cached_tokens", "finish_reason")


def postprocess(tokenizer, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of the ensemble for one chunk of the dflash model."""
    window = np.asarray(arrays["output_ids"]).reshape(-1).tolist()
    num_context = int(scalar(arrays, "num_context_tokens"))
    finish_reason = decode_text(scalar(arrays, "finish_reason"), "finish_reason")
    text = decode_chunk(tokenizer, window, num_context, is_final=bool(finish_reason))
    outputs = {"text_output": string_array([text])}
    outputs.update({name: np.asarray(arrays[name]).reshape(1, 1) for name in PASSED_THROUGH})
    outputs["batch_index"] = np.zeros((1, 1), dtype=np.int32)
    return outputs


def respond(pb, request, tokenizer, board):
    """The postprocessing model's answer to one request. A cancelled one marks its generation on the board (the
    dflash model then stops) and is answered as usual: Triton 2.51 keeps an ensemble request whose client cancelled
    in flight for good when one of its steps answers with an error (CANCELLED included), and a drain then waits out
    its whole timeout for it. The answer goes nowhere: the client is gone."""
    if request.is_cancelled():
        ids = read_inputs(pb, request, ("generation_id",)).get("generation_id")
        if ids is not None:
            board.mark(decode_text(scalar({"generation_id": ids}, "generation_id"), "generation_id"))
    try:
        return response(pb, postprocess(tokenizer, read_inputs(pb, request, INPUTS)))
    except Exception as error:  # noqa: BLE001 - answer with the error, keep serving
        return error_response(pb, f"postprocessing failed: {error}")
