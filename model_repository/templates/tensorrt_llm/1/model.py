"""Triton Python-backend model `tensorrt_llm` (contract in the class docstring)."""

import triton_python_backend_utils as pb_utils

from dflash_trt.serving import llmapi, triton_io
from dflash_trt.serving.llmapi_service import LlmApiService
from dflash_trt.serving.preprocess import Preprocessor
from dflash_trt.serving.tokenizers import tokenizer_for


class TritonPythonModel:
    """Triton model `tensorrt_llm`: NVIDIA's LLM-API contract, served by the `dflash` model.

    Inputs: text_input STRING [-1] (one prompt), optional streaming BOOL, sampling_param_best_of INT32 (1),
    sampling_param_temperature FP32, sampling_param_top_k INT32, sampling_param_top_p FP32,
    sampling_param_frequency_penalty FP32, sampling_param_presence_penalty FP32, sampling_param_max_tokens INT32
    (default 32), sampling_param_stop STRING [-1], sampling_param_seed UINT64,
    sampling_param_exclude_input_from_output BOOL, sampling_param_return_perf_metrics BOOL, return_finish_reason
    BOOL, return_stop_reason BOOL, return_cumulative_logprob BOOL (false), stop BOOL (all [1] unless noted).
    Outputs per response: text_output STRING [1]; finish_reason, stop_reason STRING [1] when asked for; with
    return_perf_metrics arrival_time_ns, first_scheduled_time_ns, first_token_time_ns, last_token_time_ns INT64
    [1] (monotonic clock), acceptance_rate FP32 [1], total_accepted_draft_tokens, total_draft_tokens INT32 [1].
    A request with stop = true cancels the running requests with its request id and gets a CANCELLED error;
    so does a request its client cancels. Semantics: dflash_trt/serving/llmapi.py.
    Parameters: engine_dir (tokenizer source), chat_template, max_tokens_limit, max_context_tokens (as the
    preprocessing model's), max_in_flight.
    """

    def initialize(self, args):
        config = triton_io.parse_model_config(args)
        name = args["model_name"]
        triton_io.check_tensors(config, name, llmapi.INPUTS, llmapi.OUTPUTS)
        params = triton_io.model_parameters(config)
        limits = triton_io.request_limits(params, name)
        tokenizer, _ = tokenizer_for(params["engine_dir"])
        preprocessor = Preprocessor(tokenizer, limits, params.get("chat_template") or "none")
        decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self.service = LlmApiService(pb_utils, preprocessor, tokenizer, limits, decoupled,
                                     max_in_flight=triton_io.int_parameter(params, "max_in_flight", 64, name),
                                     logger=pb_utils.Logger)

    def execute(self, requests_):
        self.service.execute(requests_)
        return None

    def finalize(self):
        self.service.close()
