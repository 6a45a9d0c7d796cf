"""The trtllm runtime: TensorRT-LLM's LLM API with its native DFlash speculative decoding.

Written against TensorRT-LLM 1.4.0rc4 (the version the engine builder targets):
`LLM(**options)` with the engine's speculative_config (decoding_type DFlash) and parallelism (nested
sections converted by `llmapi.llm_utils.update_llm_args_with_extra_dict`, engine/artifacts/trtllm_load.py),
`LLM.generate_async(inputs, sampling_params, streaming=True)` returning a RequestOutput that is
async-iterable and has `abort()`, `SamplingParams(max_tokens, temperature, top_k, top_p, seed,
end_id, stop_token_ids, detokenize, return_perf_metrics, min_tokens, bad, add_special_tokens,
repetition_penalty, presence_penalty, frequency_penalty)`, and per response
`outputs[0].token_ids_diff` and `.finish_reason`; the acceptance statistics are read by
trtllm_stats.py (spec_dec_totals, perf-metrics counters, or tokens per iteration). A request option the
engine cannot honour under speculative decoding (min_tokens, bad words; penalties without
speculative_config.enable_penalty) is refused before it reaches TensorRT-LLM (trtllm_admission.py).

TensorRT-LLM batches requests in flight, so the model instance serves many requests at once: each
runs on a worker thread that waits on a queue fed by one asyncio loop owning the LLM.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from typing import Iterator

from dflash_trt.engine.artifacts.trtllm_load import llm_kwargs, speculative_fields
from dflash_trt.serving.generation import Step
from dflash_trt.serving.requests import GenerationRequest, InvalidRequest
from dflash_trt.serving.trtllm_admission import Admission
from dflash_trt.serving.trtllm_stats import AcceptanceReader, Cursor

__all__ = ["TrtllmRuntime", "llm_kwargs", "logits_control_kwargs", "sampling_kwargs"]

MAX_CONCURRENT_REQUESTS = 256
_DONE = object()


def sampling_kwargs(request: GenerationRequest, end_ids) -> dict:
    """SamplingParams keyword arguments for one request (detokenization stays in postprocessing)."""
    end_ids = list(end_ids)
    kwargs = {
        "max_tokens": request.max_tokens,
        "end_id": end_ids[0] if end_ids else None,
        "stop_token_ids": end_ids[1:] or None,
        "detokenize": False,
        "return_perf_metrics": True,  # carries the DFlash acceptance statistics
    }
    if not end_ids:
        kwargs["ignore_eos"] = True  # else TensorRT-LLM falls back to the tokenizer's EOS
    if request.temperature == 0:
        kwargs["temperature"] = 0.0  # greedy
    else:
        kwargs.update(temperature=request.temperature, top_k=request.top_k or None,
                      top_p=request.top_p if request.top_p < 1.0 else None)
    if request.seed is not None:
        kwargs["seed"] = request.seed
    kwargs.update(logits_control_kwargs(request))
    return kwargs


def logits_control_kwargs(request: GenerationRequest) -> dict:
    """min_tokens, bad words and penalties as TensorRT-LLM's SamplingParams fields, only those a request set.

    Only options the engine honours get here (Admission refuses the others first): under DFlash that is the
    penalties, with speculative_config.enable_penalty; min_tokens and `bad` only without speculation.
    TensorRT-LLM's semantics are those logits_processors.py follows; it tokenizes `bad` with the LLM's
    tokenizer, without special tokens here (as its Triton preprocessing does)."""
    kwargs = {}
    if request.min_tokens > 0:
        kwargs["min_tokens"] = request.min_tokens
    if request.bad_words:
        kwargs.update(bad=list(request.bad_words), add_special_tokens=False)
    for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        if getattr(request, name) != neutral:
            kwargs[name] = getattr(request, name)
    return kwargs


class TrtllmRuntime:
    """Serves requests through one TensorRT-LLM LLM object owned by a background asyncio loop."""

    def __init__(self, llm_options: dict, tokenizer, block_size: int, default_end_ids=(),
                 max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS):
        from dflash_trt.serving.launcher import clear_inherited_mpi_env

        # Under `mpirun -n 1 tritonserver` this stub inherits the server rank's MPI job identity; NVIDIA's
        # llmapi Triton model clears it too, so that the LLM starts its own MPI world for the TP workers.
        clear_inherited_mpi_env(os.environ)
        for name, value in (llm_options.get("env_overrides") or {}).items():
            os.environ.setdefault(name, str(value))  # e.g. TRTLLM_ENABLE_PDL, before the workers start
        import tensorrt_llm

        self.tokenizer, self.block_size = tokenizer, block_size
        self.reader = AcceptanceReader(max(block_size - 1, 0))
        self.default_end_ids = tuple(default_end_ids)
        self.max_concurrent_requests = max_concurrent_requests
        self._sampling_params = tensorrt_llm.SamplingParams
        self.admission = Admission.for_engine(llm_options, speculative_fields(),
                                              getattr(tensorrt_llm, "__version__", ""))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtllm-loop", daemon=True)
        self._thread.start()
        kwargs = llm_kwargs(llm_options)  # the same conversion as the build-time check
        self.llm = self._call(lambda: tensorrt_llm.LLM(**kwargs))

    @classmethod
    def from_engine(cls, engine) -> "TrtllmRuntime":
        from transformers import AutoTokenizer, GenerationConfig

        options = dict(engine.llm_options)
        source = options.get("tokenizer") or options["model"]
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        try:
            eos = GenerationConfig.from_pretrained(str(options["model"])).eos_token_id
        except OSError:
            eos = None
        eos = tokenizer.eos_token_id if eos is None else eos
        end_ids = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
        return cls(options, tokenizer, engine.block_size, end_ids)

    def _call(self, function):
        """Run a blocking call on the loop's default executor and wait for it."""
        return asyncio.run_coroutine_threadsafe(self._to_thread(function), self._loop).result()

    async def _to_thread(self, function):
        return await asyncio.get_running_loop().run_in_executor(None, function)

    def steps(self, prompt_ids: list[int], request: GenerationRequest, end_ids) -> Iterator[Step]:
        """Steps of one request; closing the iterator aborts it inside TensorRT-LLM.

        Raises InvalidRequest at once (not on the first step) for an option the engine cannot honour."""
        refusal = self.admission.refusal(request)
        if refusal:
            raise InvalidRequest(refusal)
        return self._steps(prompt_ids, self._sampling_params(**sampling_kwargs(request, end_ids)))

    def _steps(self, prompt_ids: list[int], params) -> Iterator[Step]:
        results: queue.Queue = queue.Queue()
        handle: dict = {}
        future = asyncio.run_coroutine_threadsafe(self._generate(prompt_ids, params, results, handle), self._loop)
        try:
            while True:
                item = results.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not future.done():
                self._loop.call_soon_threadsafe(self._abort, handle)

    async def _generate(self, prompt_ids, params, results: queue.Queue, handle: dict) -> None:
        try:
            output = self.llm.generate_async({"prompt_token_ids": list(prompt_ids)}, params, streaming=True)
            handle["output"] = output
            cursor = Cursor()
            async for item in output:
                for step in self.reader.steps(item, cursor):
                    results.put(step)
        except Exception as error:  # noqa: BLE001 - handed to the request's thread
            results.put(error)
        finally:
            results.put(_DONE)

    @staticmethod
    def _abort(handle: dict) -> None:
        output = handle.get("output")
        if output is not None:
            output.abort()

    def close(self) -> None:
        try:
            self._call(self.llm.shutdown)
        finally:
            asyncio.run_coroutine_threadsafe(self._cancel_requests(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    @staticmethod
    async def _cancel_requests() -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
