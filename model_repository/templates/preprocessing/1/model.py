"""Triton Python-backend model `preprocessing` (contract in the class docstring)."""

import numpy as np
import triton_python_backend_utils as pb_utils

from dflash_trt.errors import DFlashError
from dflash_trt.serving import requests, triton_io, trtllm_inputs
from dflash_trt.serving.preprocess import Preprocessor
from dflash_trt.serving.tokenizers import tokenizer_for


class TritonPythonModel:
    """Triton model `preprocessing`: validates a generation request and tokenizes its prompt.

    Inputs (dims [1] unless noted): text_input STRING, max_tokens INT32, optional stream BOOL,
    temperature FP32, top_k INT32, top_p FP32, seed UINT64, stop_words STRING [-1], end_id INT32,
    exclude_input_in_output BOOL, min_tokens INT32, bad_words STRING [-1], repetition_penalty FP32,
    presence_penalty FP32, frequency_penalty FP32; and TensorRT-LLM's other optional inputs (beam_width,
    return_log_probs, ...: dflash_trt/serving/trtllm_inputs.py), refused unless at their neutral values;
    TensorRT-LLM's own preprocessing inputs (QUERY, REQUEST_OUTPUT_LEN, ...) are refused, saying what to call.
    Output: input_ids INT32 [-1] (the prompt's token ids). One response per request; an invalid
    request gets an error response naming the bad input.
    text_input and max_tokens are declared optional so that this model runs and names a missing one (Triton 2.51
    skips the ensemble's own check when another optional input is sent, and answers 200 with nothing).
    A request parameter (Triton's /generate makes every JSON field that is no input one) is refused, as is a
    text_input longer than max_prompt_bytes (checked before tokenizing) and stop_words / bad_words beyond
    requests.MAX_WORDS entries or MAX_WORD_BYTES bytes an entry.
    Parameters: engine_dir (tokenizer source), chat_template ("none", "model" or a Jinja template),
    max_tokens_limit, max_context_tokens, max_prompt_bytes (0: max_context_tokens x 32).
    """

    def initialize(self, args):
        config = triton_io.parse_model_config(args)
        name = args["model_name"]
        triton_io.check_tensors(config, name, {**{k: v[1] for k, v in requests.TEXT_INPUTS.items()},
                                               **trtllm_inputs.TRTLLM_STEP_INPUTS}, {"input_ids": "TYPE_INT32"})
        params = triton_io.model_parameters(config)
        limits = triton_io.request_limits(params, name)
        tokenizer, _ = tokenizer_for(params["engine_dir"])
        self.preprocessor = Preprocessor(tokenizer, limits, params.get("chat_template") or "none")
        self.limits = limits

    def execute(self, requests_):
        responses = []
        for request in requests_:
            step_inputs = triton_io.read_inputs(pb_utils, request, trtllm_inputs.TRTLLM_STEP_INPUTS)
            if step_inputs:
                responses.append(triton_io.error_response(pb_utils, trtllm_inputs.step_refusal(step_inputs)))
                continue
            try:
                requests.check_parameters(triton_io.request_parameters(request))
                arrays = triton_io.read_inputs(pb_utils, request, requests.TEXT_INPUTS)
                request_ = requests.parse_request(arrays, self.limits)
                ids = self.preprocessor.prompt_ids(request_)
                responses.append(triton_io.response(pb_utils, {"input_ids": np.array(ids, dtype=np.int32)}))
            except DFlashError as error:
                responses.append(triton_io.error_response(pb_utils, str(error)))
            except Exception as error:  # noqa: BLE001 - one request's failure must not fail the others
                pb_utils.Logger.log_error(f"preprocessing failed: {error!r}")
                responses.append(triton_io.error_response(pb_utils, f"preprocessing failed: {error}"))
        return responses
