"""What the `tensorrt_llm` Triton model does with each request (model.py only wires it up).

Each request gets a thread that tokenizes its prompt (the ensemble's Preprocessor), asks the `dflash`
model for the generation through a BLS request (so one engine, its in-flight batch, canary and metrics
serve both contracts, and the tokens are the ensemble's), and answers with llmapi.Answer.

Cancellation, both of NVIDIA's ways: a request with `stop` = true cancels the running requests that carry
its request id, and a request whose client cancels it (gRPC cancel, closed stream) is found by a watcher
thread. The cancelled request gets NVIDIA's answer at once (a CANCELLED error); its generation is marked
on the cancel board, which the dflash model checks between decoding steps, so it stops within one step.
A running request sends exactly one final response, whichever of the answer and the cancellation comes
first.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass, field

from dflash_trt.errors import DFlashError
from dflash_trt.serving import llmapi
from dflash_trt.serving.cancellation import CancelBoard
from dflash_trt.serving.dflash_service import OUTPUTS as DFLASH_OUTPUTS
from dflash_trt.serving.requests import decode_text, scalar
from dflash_trt.serving.triton_io import read_inputs, response

WATCH_PERIOD_S = 0.02  # how often client cancellations are looked for


@dataclass
class Running:
    """One request being answered."""

    sender: object  # the request's response sender (taken once)
    user_id: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation_id: str = ""
    cancelled: bool = False
    answered: bool = False  # its final response went out


class LlmApiService:
    def __init__(self, pb, preprocessor, tokenizer, limits, decoupled: bool, max_in_flight: int,
                 dflash_model: str = "dflash", logger=None, board: CancelBoard | None = None):
        self.pb, self.preprocessor, self.tokenizer, self.limits = pb, preprocessor, tokenizer, limits
        self.decoupled, self.max_in_flight, self.dflash_model, self.logger = decoupled, max_in_flight, dflash_model, logger
        self.board = board or CancelBoard()
        self._running: dict[int, Running] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="tensorrt_llm-cancel", daemon=True)
        self._watcher.start()

    def execute(self, requests) -> None:
        for request in requests:
            arrays = read_inputs(self.pb, request, llmapi.INPUTS)
            if llmapi.is_stop_request(arrays):
                self._stop(request)
                continue
            running = Running(request.get_response_sender(), request.request_id() or "")
            with self._lock:
                full = len(self._running) >= self.max_in_flight
                if not full:
                    self._running[id(running)] = running
            if full:
                self._final(running, self._error(f"tensorrt_llm: {self.max_in_flight} requests are in flight; "
                                                 "the queue is full, retry later"))
                continue
            threading.Thread(target=self._serve, args=(running, arrays), name="tensorrt_llm", daemon=True).start()

    def _serve(self, running: Running, arrays) -> None:
        pb = self.pb
        try:
            request = llmapi.parse_llmapi_request(arrays, self.limits, self.decoupled)
            prompt_ids = self.preprocessor.prompt_ids(request.generation)
            answer = llmapi.Answer(request, self.tokenizer, prompt_ids)
            bls = pb.InferenceRequest(
                model_name=self.dflash_model, requested_output_names=list(DFLASH_OUTPUTS),
                inputs=[pb.Tensor(name, value) for name, value in llmapi.dflash_inputs(request, prompt_ids).items()])
            if running.cancelled:  # stopped while it was being tokenized: nothing to generate
                return
            answer.scheduled()
            for reply in bls.exec(decoupled=True):
                if reply.has_error():
                    self._final(running, self._error(reply.error().message()))
                    continue  # the dflash model ends the stream after an error
                if not reply.output_tensors():
                    continue  # the final flag alone
                chunk = {name: pb.get_output_tensor_by_name(reply, name).as_numpy() for name in DFLASH_OUTPUTS}
                self._note_generation(running, decode_text(scalar(chunk, "generation_id"), "generation_id"))
                if running.cancelled or running.answered:
                    continue  # let the dflash model stop (it checks the board between steps)
                outputs = answer.push(chunk)
                if outputs is not None:
                    self._send(running, response(pb, outputs), final=answer.finished)
        except DFlashError as error:  # the request's fault: named in the message
            self._final(running, self._error(str(error)))
        except Exception as error:  # noqa: BLE001 - any failure must still answer the client
            self._log("error", f"tensorrt_llm: request failed: {error}\n{traceback.format_exc()}")
            self._final(running, self._error(f"generation failed: {error}"))
        finally:
            # A generation that ended without its final answer (cannot happen unless the dflash model broke
            # its stream) still releases its client.
            self._final(running, self._error("generation ended without an answer"))
            with self._lock:
                self._running.pop(id(running), None)

    def _note_generation(self, running: Running, generation_id: str) -> None:
        with running.lock:
            first = not running.generation_id
            running.generation_id = generation_id
            cancelled = running.cancelled
        if first and cancelled:  # cancelled before its first step: stop it now that it has a name
            self.board.mark(generation_id)

    def _stop(self, request) -> None:
        """NVIDIA's `stop`: cancel the requests with this request id; the stop request itself is answered
        with a CANCELLED error, whether or not such a request was running."""
        user_id = request.request_id() or ""
        sender = request.get_response_sender()
        if not user_id:
            sender.send(self._error("a stop request must carry the request id of the request to cancel"),
                        flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        with self._lock:
            targets = [r for r in self._running.values() if r.user_id == user_id]
        for running in targets:
            self._cancel(running, "stopped by a stop request")
        sender.send(self._cancelled_response("Request cancelled by client"),
                    flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _cancel(self, running: Running, why: str) -> None:
        with running.lock:
            if running.cancelled:
                return
            running.cancelled = True
            generation_id = running.generation_id
        if generation_id:
            self.board.mark(generation_id)
        self._log("info", f"tensorrt_llm: request cancelled ({why}); generation stopped")
        self._final(running, self._cancelled_response("Request cancelled by client"))

    def _watch(self) -> None:
        while not self._closed.wait(WATCH_PERIOD_S):
            with self._lock:
                running = [r for r in self._running.values() if not r.cancelled and not r.answered]
            for entry in running:
                try:
                    gone = entry.sender.is_cancelled()
                except Exception:  # noqa: BLE001 - a sender that cannot tell is treated as gone
                    gone = True
                if gone:
                    self._cancel(entry, "by the client")

    def _send(self, running: Running, reply, final: bool) -> None:
        with running.lock:
            if running.answered:
                return
            running.answered = final
            try:
                running.sender.send(
                    reply, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
            except Exception as error:  # noqa: BLE001 - a client that went away cannot take the answer
                running.answered = True
                self._log("verbose", f"tensorrt_llm: response not delivered: {error}")

    def _final(self, running: Running, reply) -> None:
        self._send(running, reply, final=True)

    def _error(self, message: str):
        return self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(message))

    def _cancelled_response(self, message: str):
        return self.pb.InferenceResponse(output_tensors=[],
                                         error=self.pb.TritonError(message, self.pb.TritonError.CANCELLED))

    def close(self) -> None:
        self._closed.set()
        self._watcher.join(timeout=5)
        for running in list(self._running.values()):
            self._cancel(running, "the model is unloading")

    def _log(self, level: str, message: str) -> None:
        if self.logger is not None:
            getattr(self.logger, f"log_{level}")(message)
