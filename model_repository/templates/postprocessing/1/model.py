"""Triton model `postprocessing`: turns one chunk of the dflash model into text.

Inputs: output_ids INT32 [-1] (a window: num_context_tokens ids already sent, then the new ids),
num_context_tokens INT32 [1], and the statistics num_output_tokens, total_draft_tokens,
total_accepted_draft_tokens (INT32 [1]), acceptance_rate FP32 [1], finish_reason STRING [1]
(empty until the last chunk).
Outputs: text_output STRING [1] (the text the new ids add; spaces and multi-byte characters stay
intact across chunks) and the statistics, unchanged. One response per request.
Parameters: engine_dir (tokenizer source).
"""

import triton_python_backend_utils as pb_utils

from dflash_trt.serving import postprocess, requests, triton_io
from dflash_trt.serving.runtime import tokenizer_for


class TritonPythonModel:
    def initialize(self, args):
        config = triton_io.parse_model_config(args)
        triton_io.check_tensors(config, args["model_name"], postprocess.INPUTS, requests.OUTPUTS)
        self.tokenizer, _ = tokenizer_for(triton_io.model_parameters(config)["engine_dir"])

    def execute(self, requests_):
        responses = []
        for request in requests_:
            try:
                arrays = triton_io.read_inputs(pb_utils, request, postprocess.INPUTS)
                responses.append(triton_io.response(pb_utils, postprocess.postprocess(self.tokenizer, arrays)))
            except Exception as error:  # noqa: BLE001 - answer with the error, keep serving
                responses.append(triton_io.error_response(pb_utils, f"postprocessing failed: {error}"))
        return responses
