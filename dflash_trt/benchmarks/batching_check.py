"""Batching check: many greedy requests served at once through the real Triton ensemble, each compared
with the same request generated alone in process (`dflash-trt check-batching`).

In-flight batching promises every request exactly the tokens it gets alone. The check sends N greedy
requests (held-out prompts of every single-turn family, max_tokens drawn reproducibly from a range) over
gRPC streaming with `concurrency` in flight, so requests join and leave the running batch at every step.
Then, with the server stopped, it generates each request alone with the library's `generate` on the same
engine: DFlash at the engine's block size (block policy fixed), or plain decoding (`reference="plain"`);
both are lossless, so either is the output the request must get.

A request is identical when the served text equals the reference tokens decoded as the postprocessing
model decodes them, its num_output_tokens equals their count and its finish reason matches (the ensemble
returns text, not token ids). For a difference, the first differing token is the first reference token
whose text the served answer does not continue with.
"""

from __future__ import annotations

import itertools
import queue
import random
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dflash_trt.benchmarks.config import PROMPTS_DIR, BenchConfig
from dflash_trt.benchmarks.workers import StreamSlot, run_workers
from dflash_trt.errors import DFlashError

REFERENCES = ("dflash", "plain")
NO_LIMIT = 1 << 30  # the reference refuses nothing; the server applies its own limits


@dataclass
class CheckConfig:
    engine: Path = BenchConfig.engine
    url: str | None = None  # gRPC address of a running server; None: serve the engine here
    num_requests: int = 500
    concurrency: int = 16
    min_tokens: int = 1
    max_tokens: int = 128
    seed: int = 0
    prompts_dir: Path = PROMPTS_DIR
    families: tuple[str, ...] = ()
    chat: bool = True  # the served repository wraps text in the chat template ("model"), as make bench does
    reference: str = "dflash"
    instances: int = 1
    num_threads: int = 0
    block_policy: str = "adaptive"
    out: Path = BenchConfig.out.parent / "check-batching"  # the server's log
    request_timeout_s: float = 600.0
    ready_timeout_s: float = 600.0

    def validate(self) -> None:
        for name in ("num_requests", "concurrency", "min_tokens", "instances"):
            if getattr(self, name) < 1:
                raise DFlashError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens < self.min_tokens:
            raise DFlashError(f"max_tokens {self.max_tokens} is below min_tokens {self.min_tokens}")
        if self.reference not in REFERENCES:
            raise DFlashError(f"reference must be one of {', '.join(REFERENCES)}, got {self.reference!r}")


@dataclass(frozen=True)
class CheckRequest:
    index: int
    family: str
    text: str
    max_tokens: int


@dataclass
class Served:
    text: str = ""
    num_output_tokens: int = 0
    finish_reason: str = ""
    error: str = ""


@dataclass
class Expected:
    token_ids: list[int]
    text: str
    finish_reason: str


@dataclass
class Difference:
    request: CheckRequest
    served: Served
    expected: Expected
    position: int  # first differing output token of the reference (its length: the served answer goes on)


@dataclass
class CheckReport:
    requests: list[CheckRequest]
    served: list[Served]
    expected: list[Expected]
    differences: list[Difference] = field(default_factory=list)

    @property
    def num_identical(self) -> int:
        return len(self.requests) - len(self.differences)

    @property
    def num_errors(self) -> int:
        return sum(1 for s in self.served if s.error)

    def summary(self) -> dict:
        return {"requests": len(self.requests), "served_tokens": sum(s.num_output_tokens for s in self.served),
                "reference_tokens": sum(len(e.token_ids) for e in self.expected),
                "identical": self.num_identical, "different": len(self.differences), "errors": self.num_errors}


def make_requests(records, num_requests: int, min_tokens: int, max_tokens: int, seed: int) -> list[CheckRequest]:
    """num_requests single-turn prompts (every one before any repeats, in a shuffled order), each with a
    max_tokens drawn uniformly from [min_tokens, max_tokens]; the same seed gives the same requests."""
    texts = [r for r in records if isinstance(r.prompt, str)]
    if not texts:
        raise DFlashError("no single-turn prompts to send (the served models take text)")
    rng = random.Random(seed)
    rng.shuffle(texts)
    return [CheckRequest(i, r.family, r.prompt, rng.randint(min_tokens, max_tokens))
            for i, r in zip(range(num_requests), itertools.cycle(texts))]


def serve_requests(open_stream: Callable, requests: list[CheckRequest], concurrency: int, timeout_s: float,
                   progress: Callable[[int, int], None] | None = None) -> list[Served]:
    """Send every request greedily over `concurrency` gRPC streams (dflash_trt.serving.client.GrpcStream),
    each stream sending its next request as soon as its last one finished."""
    todo: queue.Queue = queue.Queue()
    for request in requests:
        todo.put(request)
    served: list[Served | None] = [None] * len(requests)
    lock, done = threading.Lock(), [0]

    def work(slot: StreamSlot) -> None:
        while True:
            try:
                request = todo.get_nowait()
            except queue.Empty:
                return
            try:
                result = _one(slot.get(), request, timeout_s)
            except Exception as error:  # noqa: BLE001 - a failed request is counted, the check goes on
                result = Served(error=f"{type(error).__name__}: {error}".strip()[:300])
                slot.reset()
            with lock:
                served[request.index] = result
                done[0] += 1
                if progress is not None:
                    progress(done[0], len(requests))

    run_workers(concurrency, work, open_stream, "check")
    return served  # type: ignore[return-value]


def _one(stream, request: CheckRequest, timeout_s: float) -> Served:
    result = Served()
    for chunk in stream.chunks(request.text, request.max_tokens, timeout_s=timeout_s, temperature=0.0):
        result.text += chunk.get("text_output", "")
        result.num_output_tokens = int(chunk.get("num_output_tokens", result.num_output_tokens))
        result.finish_reason = chunk.get("finish_reason", "") or result.finish_reason
    return result


def reference_outputs(engine_dir: Path, requests: list[CheckRequest], chat: bool, reference: str = "dflash",
                      progress: Callable[[int, int], None] | None = None) -> list[Expected]:
    """Each request generated alone in process, tokenized and detokenized as the served models do."""
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.engine import load_engine
    from dflash_trt.serving.detokenize import decode
    from dflash_trt.serving.preprocess import MODEL_TEMPLATE, NO_TEMPLATE, Preprocessor
    from dflash_trt.serving.requests import GenerationRequest, RequestLimits
    from dflash_trt.serving.runtime import default_end_ids

    engine = load_engine(engine_dir)
    target, tokenizer = engine.target, engine.target.tokenizer
    drafter, block_size = (engine.drafter, engine.block_size) if reference == "dflash" else (None, 1)
    preprocessor = Preprocessor(tokenizer, RequestLimits(NO_LIMIT, NO_LIMIT), MODEL_TEMPLATE if chat else NO_TEMPLATE)
    end_ids = default_end_ids(target)
    expected = []
    for done, request in enumerate(requests, start=1):
        prompt = preprocessor.prompt_ids(GenerationRequest(request.text, request.max_tokens))
        params = SamplingParams(max_new_tokens=request.max_tokens, stop_token_ids=end_ids)
        result = generate(target, drafter, [prompt], params, block_size=block_size)[0]
        tokens = list(result.token_ids)
        if result.finish_reason == "stop" and tokens and tokens[-1] in end_ids:
            tokens.pop()  # the served answer leaves the end id out
        expected.append(Expected(tokens, decode(tokenizer, tokens), result.finish_reason))
        if progress is not None:
            progress(done, len(requests))
    return expected


def compare(tokenizer, requests: list[CheckRequest], served: list[Served], expected: list[Expected]
            ) -> list[Difference]:
    differences = []
    for request, got, want in zip(requests, served, expected):
        if (not got.error and got.text == want.text and got.num_output_tokens == len(want.token_ids)
                and got.finish_reason == want.finish_reason):
            continue
        differences.append(Difference(request, got, want, first_difference(tokenizer, want.token_ids, got.text)))
    return differences


def first_difference(tokenizer, token_ids: list[int], text: str) -> int:
    """The first position whose token the text does not continue with (len(token_ids): it continues them all)."""
    from dflash_trt.serving.detokenize import decode, settled

    for k in range(1, len(token_ids) + 1):
        if not text.startswith(settled(decode(tokenizer, token_ids[:k]))):
            return k - 1
    return len(token_ids)


def run_check(config: CheckConfig, log: Callable[[str], None] = print) -> CheckReport:
    """Serve (or send to config.url), then generate alone in process, then compare."""
    from dflash_trt.benchmarks.prompts import heldout_prompts
    from dflash_trt.serving.tokenizers import tokenizer_for

    config.validate()
    _require_local_engine(config.engine)  # before serving: the reference runs in this process
    records = heldout_prompts(config.prompts_dir, config.families, NO_LIMIT)
    requests = make_requests(records, config.num_requests, config.min_tokens, config.max_tokens, config.seed)
    families = sorted({r.family for r in requests})
    log(f"{len(requests)} greedy requests at concurrency {config.concurrency}, max_tokens {config.min_tokens}.."
        f"{config.max_tokens} (seed {config.seed}), families: {', '.join(families)}")
    served = _serve(config, requests, log)
    if config.num_threads > 0:
        import torch

        torch.set_num_threads(config.num_threads)
    log(f"reference: each request alone in process, {_reference_name(config.reference)}")
    expected = reference_outputs(config.engine, requests, config.chat, config.reference, _progress("alone", log))
    tokenizer, _engine = tokenizer_for(config.engine)
    return CheckReport(requests, served, expected, compare(tokenizer, requests, served, expected))


def _require_local_engine(engine_dir: Path) -> None:
    from dflash_trt.benchmarks.run import LOCAL_RUNTIMES
    from dflash_trt.engine import load_engine

    runtime = load_engine(engine_dir, verify=False, load_models=False).runtime
    if runtime not in LOCAL_RUNTIMES:
        raise DFlashError(f"{engine_dir}: the reference generation runs {' and '.join(LOCAL_RUNTIMES)} engines in "
                          f"process, not {runtime}; check the torch engine of the same pair")


def _serve(config: CheckConfig, requests: list[CheckRequest], log) -> list[Served]:
    from dflash_trt.serving.client import GrpcStream

    progress = _progress("served", log)
    if config.url:
        return serve_requests(lambda: GrpcStream(config.url), requests, config.concurrency,
                              config.request_timeout_s, progress)
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    log_path = Path(config.out) / "triton.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dflash-check-") as scratch:
        repo = render_repository(RepoConfig(
            engine_dir=config.engine, out=Path(scratch) / "repo", chat_template="model" if config.chat else "none",
            dflash_instances=config.instances, num_threads=config.num_threads, block_policy=config.block_policy,
            max_batch_sequences=config.concurrency, max_queue_size=max(64, 4 * config.concurrency)))
        log(f"serving: starting tritonserver (log: {log_path})")
        with serve_on_free_ports(repo, ready_timeout_s=config.ready_timeout_s, log_path=log_path) as server:
            return serve_requests(lambda: GrpcStream(server.config.grpc_url), requests, config.concurrency,
                                  config.request_timeout_s, progress)


def _reference_name(reference: str) -> str:
    return "DFlash at the engine's block size" if reference == "dflash" else "plain decoding (block size 1)"


class _progress:
    """A progress line about every tenth of the work (and at the end)."""

    def __init__(self, what: str, log):
        self.what, self.log = what, log

    def __call__(self, done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            self.log(f"  {self.what} {done}/{total}")
