"""Triton Python-backend model `dflash` (contract in the class docstring)."""

import triton_python_backend_utils as pb_utils

from dflash_trt.decoding.scheduler.scheduler import SchedulerLimits
from dflash_trt.serving import canary, dflash_service, triton_io
from dflash_trt.serving.cpus import default_num_threads
from dflash_trt.serving.metrics import DFlashMetrics
from dflash_trt.serving.runtime import open_runtime


class TritonPythonModel:
    """Triton model `dflash`: decoupled DFlash speculative generation.

    Inputs: input_ids INT32 [-1], max_tokens INT32 [1], optional stream BOOL, temperature FP32,
    top_k INT32, top_p FP32, seed UINT64, stop_words STRING [-1], end_id INT32,
    exclude_input_in_output BOOL, min_tokens INT32, bad_words STRING [-1] (tokenized with the target's
    tokenizer), repetition_penalty FP32, presence_penalty FP32, frequency_penalty FP32 (all [1] unless noted;
    dflash_trt/decoding/step/logits_processors.py).
    Outputs per response: output_ids INT32 [-1] (window for the postprocessing model),
    num_context_tokens INT32 [1], num_output_tokens INT32 [1], total_draft_tokens INT32 [1],
    total_accepted_draft_tokens INT32 [1], num_verify_steps INT32 [1], acceptance_rate FP32 [1],
    num_cached_tokens INT32 [1], finish_reason STRING [1],
    generation_id STRING [1] (names the generation on the cancel board).
    Responses: with stream=true one per decoding step that commits tokens, else one; the last one
    carries the final flag. Cancellation (the request's own, or marked on the cancel board by
    postprocessing for ensemble requests) is checked between steps.
    Parameters: engine_dir (its manifest names the runtime), max_tokens_limit, max_context_tokens,
    device ("cpu" or "cuda"), num_threads (torch CPU threads, 0 = the usable cores divided among the
    instances), block_size (0 = the engine's, 1 = plain decoding), block_policy ("adaptive" or "fixed"),
    tree_budget (draft nodes of a tree verify per sequence, 0 = the chain; dflash_trt/decoding/step/verify/tree.py),
    max_batch_sequences, max_kv_tokens, prefill_chunk_tokens (the in-flight batch of each instance;
    prefix_cache_bytes: its prompt-prefix cache, 0 = off;
    see dflash_trt/decoding/scheduler/scheduler.py), canary_tokens (length of the load-time canary generation whose acceptance
    is logged and exported, see dflash_trt/serving/canary.py; 0 = off). Every request Triton hands to one
    execute joins the batch.
    Metrics: dflash_* (see dflash_trt/serving/metrics.py), labelled with the model name.
    """

    def initialize(self, args):
        config = triton_io.parse_model_config(args)
        name = args["model_name"]
        triton_io.require_decoupled(config, name)
        triton_io.check_tensors(config, name, dflash_service.INPUTS, dflash_service.OUTPUTS)
        params = triton_io.model_parameters(config)
        limits = triton_io.request_limits(params, name)
        num_threads = triton_io.int_parameter(params, "num_threads", 0, name)
        if num_threads <= 0 and (params.get("device") or "cpu") == "cpu":
            num_threads = default_num_threads(triton_io.instance_count(config))
        scheduler_defaults = SchedulerLimits()
        scheduler_limits = SchedulerLimits(
            max_batch_size=triton_io.int_parameter(params, "max_batch_sequences", scheduler_defaults.max_batch_size,
                                                   name),
            max_kv_tokens=triton_io.int_parameter(params, "max_kv_tokens", scheduler_defaults.max_kv_tokens, name),
            prefill_chunk_tokens=triton_io.int_parameter(params, "prefill_chunk_tokens",
                                                         scheduler_defaults.prefill_chunk_tokens, name),
        )
        runtime = open_runtime(params["engine_dir"], device=params.get("device") or "cpu", num_threads=num_threads,
                               block_size=triton_io.int_parameter(params, "block_size", 0, name),
                               block_policy=params.get("block_policy") or "adaptive", limits=scheduler_limits,
                               tree_budget=triton_io.int_parameter(params, "tree_budget", 0, name),
                               prefix_cache_bytes=triton_io.int_parameter(params, "prefix_cache_bytes", 0, name))
        self.metrics = DFlashMetrics(pb_utils, name)  # kept on self: the families live as long as the model
        canary_tokens = triton_io.int_parameter(params, "canary_tokens", canary.DEFAULT_CANARY_TOKENS, name)
        canary.check_at_load(runtime, canary_tokens, self.metrics, pb_utils.Logger)
        self.service = dflash_service.DFlashService(pb_utils, runtime, limits, self.metrics, pb_utils.Logger)

    def execute(self, requests_):
        self.service.execute(requests_)
        return None

    def finalize(self):
        if not self.service.finalize():
            pb_utils.Logger.log_warn("dflash: requests still running at unload")
