"""One scheduler per dflash model instance, driven by its own thread: in-flight batching in Triton.

`execute` (any thread) parses each request and hands it over with `submit`; the loop thread adds it to
the scheduler, which runs every admitted request in one decoding batch. After each step the loop sends
each request the chunk it released, checks every request's cancellation (its own `is_cancelled` and the
cancel board), and aborts what was cancelled or stopped by a stop word, so it leaves the batch before
the next step. `execute` waits for room (`wait_for_room`) before it submits a request, so a request that finds the
scheduler full waits there and further ones in Triton's queue (whose size and timeout still apply). A failure of
one request's output (e.g. its stop words) ends that request only; a failure of a decoding step ends the requests
of that batch with an error and starts a fresh scheduler.
"""

from __future__ import annotations

import threading
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable

from dflash_trt.errors import DFlashError
from dflash_trt.serving.generation import ChunkStream, Stats


@dataclass
class Job:
    """One Triton request inside the loop. `send(chunk)` / `fail(message)` / `end()` answer the client
    (end: the final flag alone); is_cancelled() is polled between steps."""

    request_id: str
    prompt_ids: list[int]
    params: object  # dflash_trt.decoding.step.sampling.SamplingParams
    stream: ChunkStream
    stats: Stats
    send: Callable
    fail: Callable[[str], None]
    end: Callable[[], None]
    is_cancelled: Callable[[], bool]
    on_done: Callable[[], None]
    num_steps: int = 0  # decoding steps that released output for this request


class BatchLoop:
    def __init__(self, runtime, logger=None, metrics=None):
        """metrics: DFlashMetrics, which exports the scheduler's prefix cache after every step (None: not)."""
        self.runtime, self.logger, self.metrics = runtime, logger, metrics
        self.scheduler = runtime.new_scheduler()
        self.max_batch_size = self.scheduler.limits.max_batch_size
        self._inbox: deque[Job] = deque()
        self._jobs: dict[str, Job] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dflash-batch", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            self._inbox.append(job)
            self._cond.notify_all()

    def wait_for_room(self, timeout_s: float | None = None) -> bool:
        """Block while the batch (with what waits to join it) is full; True when there is room."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or self._load() < self.max_batch_size, timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _load(self) -> int:
        return len(self._inbox) + len(self._jobs)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._inbox or self._jobs)
                if self._closed and not self._inbox and not self._jobs:
                    return
                new = list(self._inbox)
                self._inbox.clear()
            for job in new:
                self._add(job)
            self._abort_cancelled()
            if self.scheduler.has_unfinished:
                self._step()
            with self._cond:
                self._cond.notify_all()  # room may have been made
            if self._closed:
                for job in list(self._jobs.values()):
                    self._finish(job, lambda j: j.fail("the model is unloading"))

    def _add(self, job: Job) -> None:
        try:
            self.scheduler.add_request(job.prompt_ids, job.params, request_id=job.request_id)
        except DFlashError as error:  # this request's fault (context too long, ...): only it fails
            job.fail(str(error))
            job.on_done()
            return
        self._jobs[job.request_id] = job

    def _abort_cancelled(self) -> None:
        for job in list(self._jobs.values()):
            try:
                cancelled = job.is_cancelled()
            except Exception:  # noqa: BLE001 - a sender that cannot tell is treated as gone
                cancelled = True
            if cancelled:
                self._log("info", "request cancelled by the client; generation stopped")
                self.scheduler.abort(job.request_id)
                self._finish(job, lambda j: j.end())

    def _step(self) -> None:
        from dflash_trt.serving.generation import step_of

        try:
            outputs = self.scheduler.step()
        except Exception as error:  # noqa: BLE001 - a failed step must still answer every client
            self._log("error", f"decoding step failed: {error}\n{traceback.format_exc()}")
            for job in list(self._jobs.values()):
                self._finish(job, lambda j: j.fail(f"generation failed: {error}"))
            self.scheduler = self.runtime.new_scheduler()
            return
        if self.metrics is not None and self.scheduler.prefix_cache is not None:
            self.metrics.prefix_cache(self.scheduler.prefix_cache)
        for out in outputs:
            job = self._jobs.get(out.index)
            if job is None:
                continue  # cancelled and answered already
            job.num_steps += 1
            try:
                chunk = job.stream.push(step_of(out))
                if chunk is not None:
                    job.send(chunk)
            except Exception as error:  # noqa: BLE001 - one request's failure ends that request only
                self._log("error", f"request failed: {error}\n{traceback.format_exc()}")
                self.scheduler.abort(job.request_id)
                self._finish(job, lambda j: j.fail(f"generation failed: {error}"))
                continue
            if job.stream.done:
                if not out.is_final:  # a stop word ended it: leave the batch now
                    self.scheduler.abort(job.request_id)
                self._finish(job, None)

    def _finish(self, job: Job, answer) -> None:
        self._jobs.pop(job.request_id, None)
        try:
            if answer is not None:
                answer(job)
        except Exception as error:  # noqa: BLE001 - a client that went away cannot take the answer
            self._log("verbose", f"answer not delivered: {error}")
        finally:
            job.on_done()

    def _log(self, level: str, message: str) -> None:
        if self.logger is not None:
            getattr(self.logger, f"log_{level}")(message)
