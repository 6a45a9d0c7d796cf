"""Triton Python-backend model `postprocessing` (contract in the class docstring)."""

import triton_python_backend_utils as pb_utils

from dflash_trt.serving import postprocess, requests, triton_io
from dflash_trt.serving.cancellation import CancelBoard
from dflash_trt.serving.tokenizers import tokenizer_for


class TritonPythonModel:
    """Triton model `postprocessing`: turns one chunk of the dflash model into text.

    Inputs: output_ids INT32 [-1] (a window: num_context_tokens ids already sent, then the new ids),
    num_context_tokens INT32 [1], and the statistics num_output_tokens, total_draft_tokens,
    total_accepted_draft_tokens, num_verify_steps, num_cached_tokens (INT32 [1]), acceptance_rate FP32 [1],
    finish_reason STRING [1]
    (empty until the last chunk), generation_id STRING [1].
    Outputs: text_output STRING [1] (the text the new ids add; spaces and multi-byte characters stay
    intact across chunks) and the statistics, unchanged. One response per request. A cancelled
    request (Triton cancels the ensemble's later steps when the client goes away) marks its
    generation_id on the cancel board, which the dflash model checks between decoding steps.
    Parameters: engine_dir (tokenizer source).
    """

    def initialize(self, args):
        config = triton_io.parse_model_config(args)
        triton_io.check_tensors(config, args["model_name"], postprocess.INPUTS, requests.OUTPUTS)
        self.tokenizer, _ = tokenizer_for(triton_io.model_parameters(config)["engine_dir"])
        self.board = CancelBoard()

    def execute(self, requests_):
        return [postprocess.respond(pb_utils, request, self.tokenizer, self.board) for request in requests_]
