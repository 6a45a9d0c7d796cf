"""What the decoupled `dflash` Triton model does with each request (model.py only wires it up).

One response sender per request. With stream=true every decoding step that releases tokens sends
one response at once; otherwise a single response carries everything. The final flag always goes
out, so an exception or a cancellation never leaves a client waiting. Cancellation is checked
between decoding steps.

Local runtimes (`new_scheduler`) batch in flight: every request of the instance runs in one scheduler
driven by a BatchLoop thread (batch_loop.py); `execute` takes every request Triton hands it and
returns once the batch has room, so a full batch leaves further requests in Triton's queue. Other
runtimes (TensorRT-LLM, which batches itself) get a thread per request that drives `steps`.
"""

from __future__ import annotations

import threading
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dflash_trt.errors import DFlashError
from dflash_trt.serving.batch_loop import BatchLoop, Job
from dflash_trt.serving.cancellation import CancelBoard, StepGate
from dflash_trt.serving.generation import Cancelled, Chunk, ChunkStream, Stats, chunks, sampling_params, until_cancelled
from dflash_trt.serving.requests import RequestLimits, parse_token_request, request_end_ids
from dflash_trt.serving.tokenizers import vocabulary_size
from dflash_trt.serving.triton_io import error_response, read_inputs, response, string_array

INPUTS = {
    "input_ids": "TYPE_INT32",
    "max_tokens": "TYPE_INT32",
    "stream": "TYPE_BOOL",
    "temperature": "TYPE_FP32",
    "top_k": "TYPE_INT32",
    "top_p": "TYPE_FP32",
    "seed": "TYPE_UINT64",
    "stop_words": "TYPE_STRING",
    "end_id": "TYPE_INT32",
    "exclude_input_in_output": "TYPE_BOOL",
    "min_tokens": "TYPE_INT32",
    "bad_words": "TYPE_STRING",
    "repetition_penalty": "TYPE_FP32",
    "presence_penalty": "TYPE_FP32",
    "frequency_penalty": "TYPE_FP32",
}
OUTPUTS = {
    "output_ids": "TYPE_INT32",
    "num_context_tokens": "TYPE_INT32",
    "num_output_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "num_verify_steps": "TYPE_INT32",  # verify steps so far; the drafts per step vary under the budget policy
    "acceptance_rate": "TYPE_FP32",
    "num_cached_tokens": "TYPE_INT32",  # prompt tokens served from the prefix cache
    "finish_reason": "TYPE_STRING",
    "generation_id": "TYPE_STRING",
    "stop_reason": "TYPE_STRING",  # the stop word that ended the answer, or "" (read by tensorrt_llm)
}


def chunk_outputs(chunk: Chunk, generation_id: str) -> dict[str, np.ndarray]:
    stats = chunk.stats
    return {
        "output_ids": np.array(chunk.window_ids, dtype=np.int32),
        "num_context_tokens": np.array([chunk.num_context_tokens], dtype=np.int32),
        "num_output_tokens": np.array([stats.num_output_tokens], dtype=np.int32),
        "total_draft_tokens": np.array([stats.total_draft_tokens], dtype=np.int32),
        "total_accepted_draft_tokens": np.array([stats.total_accepted_draft_tokens], dtype=np.int32),
        "num_verify_steps": np.array([stats.num_spec_steps], dtype=np.int32),
        "acceptance_rate": np.array([stats.acceptance_rate], dtype=np.float32),
        "num_cached_tokens": np.array([stats.num_cached_tokens], dtype=np.int32),
        "finish_reason": string_array([chunk.finish_reason]),
        "generation_id": string_array([generation_id]),
        "stop_reason": string_array([chunk.stop_reason]),
    }


class DFlashService:
    """Serves generation requests of one model instance with a runtime from runtime.py."""

    def __init__(self, pb, runtime, limits: RequestLimits, metrics, logger=None, board: CancelBoard | None = None):
        self.pb, self.runtime, self.limits, self.metrics = pb, runtime, limits, metrics
        self.board = board or CancelBoard()
        self.gate = StepGate.from_env()  # None unless a test paces the steps
        self.logger = logger
        self._loop = BatchLoop(runtime, logger, metrics) if hasattr(runtime, "new_scheduler") else None
        workers = getattr(runtime, "max_concurrent_requests", 1)
        # TensorRT-LLM batches in flight itself: its requests each get a thread that waits on the LLM API.
        self._pool = (ThreadPoolExecutor(workers, thread_name_prefix="dflash")
                      if workers > 1 and self._loop is None else None)
        self._in_flight = 0
        self._idle = threading.Condition()
        self.vocab_size = vocabulary_size(runtime)

    def execute(self, requests) -> None:
        if self._loop is not None:
            for request in requests:
                # Room first, then the request: execute returns as soon as a request is in the batch. Blocking after
                # the submission instead held back the first tokens of the request that filled the batch until
                # another one left it (~0.5 s at 4 in flight): its responses reached the client only once execute
                # returned. A request that finds the batch full waits here, counted in flight; the next ones wait in
                # Triton's queue.
                self._enter()
                self._loop.wait_for_room()
                self.submit(request)
            return
        for request in requests:
            if self._pool is not None:
                self._pool.submit(self.handle, request)
            else:
                self.handle(request)

    def submit(self, request) -> None:
        """Hand one request to the batch loop (execute counted it in flight); a bad request is answered here with
        its error."""
        pb = self.pb
        sender = request.get_response_sender()
        generation_id = self.board.new_id()

        def done() -> None:
            self.board.clear(generation_id)
            self._leave()

        try:
            gen, prompt_ids = parse_token_request(read_inputs(pb, request, INPUTS), self.limits, self.vocab_size)
            end_ids = request_end_ids(gen, self.runtime.default_end_ids)
            params = sampling_params(gen, end_ids, self.runtime.tokenizer)
        except DFlashError as error:
            sender.send(error_response(pb, str(error)), flags=_final(pb))
            done()
            return
        stats = Stats(self.runtime.block_size)
        clock = self.metrics.clock()  # time to first token and between releases (metrics.py)
        on_step = lambda step, n: self.metrics.step(  # noqa: E731
            step.acceptance_length, _drafts(step, stats), n, clock)
        # Direct requests see their own cancellation; ensemble requests only through the board.
        is_cancelled = lambda: sender.is_cancelled() or self.board.is_marked(generation_id)  # noqa: E731
        job = Job(
            request_id=generation_id, prompt_ids=prompt_ids, params=params,
            stream=ChunkStream(gen, prompt_ids, self.runtime.tokenizer, stats, end_ids, on_step), stats=stats,
            send=lambda chunk: sender.send(response(pb, chunk_outputs(chunk, generation_id)),
                                           flags=_final(pb) if chunk.is_final else 0),
            fail=lambda message: sender.send(error_response(pb, message), flags=_final(pb)),
            end=lambda: self._send_final(sender),
            is_cancelled=is_cancelled,
            on_done=done)
        if self.gate is not None:  # a test paces the steps: every step after the request's first waits for a permit
            paced = self.gate.paced(is_cancelled)
            job.is_cancelled = lambda: paced() if job.num_steps else is_cancelled()
        self._loop.submit(job)

    def handle(self, request) -> None:
        pb = self.pb
        sender = request.get_response_sender()
        generation_id = self.board.new_id()
        # Direct requests see their own cancellation; ensemble requests only through the board.
        is_cancelled = lambda: sender.is_cancelled() or self.board.is_marked(generation_id)  # noqa: E731
        if self.gate is not None:
            is_cancelled = self.gate.paced(is_cancelled)
        self._enter()
        final_sent, steps = False, None
        try:
            gen, prompt_ids = parse_token_request(read_inputs(pb, request, INPUTS), self.limits, self.vocab_size)
            end_ids = request_end_ids(gen, self.runtime.default_end_ids)
            stats = Stats(self.runtime.block_size)
            steps = self.runtime.steps(prompt_ids, gen, end_ids)
            clock = self.metrics.clock()  # time to first token and between releases (metrics.py)
            on_step = lambda step, n: self.metrics.step(  # noqa: E731
                step.acceptance_length, _drafts(step, stats), n, clock)
            for chunk in chunks(gen, prompt_ids, until_cancelled(steps, is_cancelled), self.runtime.tokenizer,
                                stats, end_ids, on_step):
                outputs = chunk_outputs(chunk, generation_id)
                sender.send(response(pb, outputs), flags=_final(pb) if chunk.is_final else 0)
                final_sent = chunk.is_final
        except Cancelled:
            self._log("info", "request cancelled by the client; generation stopped")
        except DFlashError as error:  # the request's fault: InvalidRequest, context too long, ...
            sender.send(error_response(pb, str(error)), flags=_final(pb))
            final_sent = True
        except Exception as error:  # noqa: BLE001 - any failure must still answer the client
            self._log("error", f"generation failed: {error}\n{traceback.format_exc()}")
            sender.send(error_response(pb, f"generation failed: {error}"), flags=_final(pb))
            final_sent = True
        finally:
            if steps is not None:
                steps.close()  # stops the decoding loop (and aborts a TensorRT-LLM request)
            if not final_sent:
                self._send_final(sender)
            self.board.clear(generation_id)
            self._leave()

    def _send_final(self, sender) -> None:
        try:
            sender.send(flags=_final(self.pb))
        except Exception as error:  # noqa: BLE001 - a cancelled request may refuse further sends
            self._log("verbose", f"final flag not delivered: {error}")

    def _enter(self) -> None:
        with self._idle:
            self._in_flight += 1
        self.metrics.request_started()

    def _leave(self) -> None:
        self.metrics.request_finished()
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def finalize(self, timeout_s: float = 30.0) -> bool:
        """Wait for in-flight requests (True when all finished), then release the runtime."""
        with self._idle:
            drained = self._idle.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None:
            self._loop.close()
        self.runtime.close()
        self.board.remove_if_empty()
        return drained

    def _log(self, level: str, message: str) -> None:
        if self.logger is not None:
            getattr(self.logger, f"log_{level}")(message)


def _final(pb) -> int:
    return pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _drafts(step, stats: Stats) -> int:
    if step.acceptance_length is None:
        return 0
    return stats.block_size - 1 if step.num_draft_tokens is None else step.num_draft_tokens
