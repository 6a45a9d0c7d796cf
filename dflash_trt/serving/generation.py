"""From decoding steps to the chunks the dflash model sends (pure Python, no Triton).

A runtime yields the tokens committed at every verify step. `chunks` applies the request's stop
words and end id, keeps the speculative statistics, and yields one `Chunk` per step that released
tokens (streaming) or a single chunk at the end. Each chunk carries the window of token ids that
the postprocessing model detokenizes (see detokenize.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

from dflash_trt.serving.detokenize import ChunkWindow
from dflash_trt.serving.requests import GenerationRequest
from dflash_trt.serving.stops import StopMatcher


@dataclass
class Step:
    """Tokens committed by one decoding step; acceptance_length is None for the prefill token."""

    new_token_ids: list[int]
    acceptance_length: int | None
    is_final: bool
    finish_reason: str = ""  # on the final step: "stop" (end id) or "length"
    num_draft_tokens: int | None = None  # drafts verified in this step; None: block_size - 1
    num_accepted_drafts: int | None = None  # drafts accepted and committed; None: acceptance_length - 1
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


@dataclass
class Stats:
    """Cumulative speculative statistics of one request."""

    block_size: int
    num_output_tokens: int = 0
    num_spec_steps: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (not computed)

    def add_step(self, acceptance_length: int | None, num_draft_tokens: int | None = None,
                 num_accepted_drafts: int | None = None) -> None:
        if acceptance_length is None:
            return
        self.num_spec_steps += 1
        self.acceptance_lengths.append(acceptance_length)
        self.total_draft_tokens += self.block_size - 1 if num_draft_tokens is None else num_draft_tokens
        self.total_accepted_draft_tokens += acceptance_length - 1 if num_accepted_drafts is None else num_accepted_drafts

    @property
    def acceptance_rate(self) -> float:
        return self.total_accepted_draft_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0

    @property
    def tau(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0


@dataclass
class Chunk:
    """What one response of the dflash model carries."""

    window_ids: list[int]
    num_context_tokens: int
    new_token_ids: list[int]
    is_final: bool
    finish_reason: str
    stats: Stats
    stop_reason: str = ""  # on the final chunk: the stop word that ended the answer ("" for end ids, length)


class Cancelled(Exception):
    """The client cancelled the request (or went away); generation stopped between two steps."""


def until_cancelled(steps: Iterable[Step], is_cancelled) -> Iterator[Step]:
    """Pass steps through, checking `is_cancelled()` before every further step is computed."""
    for step in steps:
        yield step
        if not step.is_final and is_cancelled():
            raise Cancelled()


class ChunkStream:
    """The chunks of one request, fed one step at a time: `push(step)` returns the chunk it releases
    (or None); `done` once the final chunk went out (after an end id, a stop word, or the final step).

    end_ids: the ids that end generation (kept out of the output). on_step(step, num_released) is
    called after every decoding step (metrics).
    """

    def __init__(self, request: GenerationRequest, prompt_ids: list[int], tokenizer, stats: Stats,
                 end_ids: Iterable[int] = (), on_step=None):
        self.request, self.prompt_ids, self.stats, self.on_step = request, prompt_ids, stats, on_step
        self.end_ids = set(end_ids)
        self.matcher = StopMatcher(tokenizer, request.stop_words)
        self.window = ChunkWindow()
        self.released_all: list[int] = []
        self.done = False

    def push(self, step: Step) -> Chunk | None:
        request, stats, matcher = self.request, self.stats, self.matcher
        stats.add_step(step.acceptance_length, step.num_draft_tokens, step.num_accepted_drafts)
        stats.num_cached_tokens = step.num_cached_tokens
        released = []
        for token in step.new_token_ids:
            if step.is_final and step.finish_reason == "stop" and token in self.end_ids:
                continue
            released += matcher.push(token)
            if matcher.stopped:
                break
        finish_reason = ""
        if matcher.stopped:
            finish_reason = "stop"
        elif step.is_final:
            finish_reason = step.finish_reason or "length"
            released += matcher.flush()
        stats.num_output_tokens += len(released)
        if self.on_step is not None:
            self.on_step(step, len(released))
        self.released_all += released
        if finish_reason:
            self.done = True
            chunk = _final_chunk(request, self.window, released, self.released_all, self.prompt_ids, finish_reason,
                                 stats)
            chunk.stop_reason = matcher.stop_word
            return chunk
        if request.stream and released:
            ids, num_context = self.window.add(released)
            return Chunk(ids, num_context, released, False, "", stats)
        return None


def chunks(request: GenerationRequest, prompt_ids: list[int], steps: Iterable[Step], tokenizer,
           stats: Stats, end_ids: Iterable[int] = (), on_step=None) -> Iterator[Chunk]:
    """Chunks of one request pulled from its steps (ChunkStream); the last one has is_final=True."""
    stream = ChunkStream(request, prompt_ids, tokenizer, stats, end_ids, on_step)
    for step in steps:
        chunk = stream.push(step)
        if chunk is not None:
            yield chunk
        if stream.done:
            return


def _final_chunk(request, window, released, released_all, prompt_ids, finish_reason, stats) -> Chunk:
    if request.stream:
        ids, num_context = window.add(released)
        return Chunk(ids, num_context, released, True, finish_reason, stats)
    # Without exclude_input_in_output the single response decodes prompt + answer, as TensorRT-LLM does.
    prefix = [] if request.exclude_input_in_output else list(prompt_ids)
    return Chunk(prefix + released_all, 0, released_all, True, finish_reason, stats)


def step_of(out) -> Step:
    """A decoding StepOutput as the Step the dflash model turns into chunks."""
    reason = out.result.finish_reason if out.is_final else ""
    return Step(list(out.new_token_ids), out.acceptance_length, out.is_final, reason, out.num_draft_tokens,
                out.num_accepted_drafts, out.num_cached_tokens)


def sampling_params(request: GenerationRequest, end_ids, tokenizer=None):
    """The decoding loop's SamplingParams of a request; its bad_words are tokenized with `tokenizer`."""
    from dflash_trt.decoding.step.sampling import SamplingParams, bad_words_ids

    return SamplingParams(max_new_tokens=request.max_tokens, temperature=request.temperature, top_k=request.top_k,
                          top_p=request.top_p, seed=request.seed, stop_token_ids=tuple(end_ids),
                          min_tokens=request.min_tokens, bad_words_ids=bad_words_ids(request.bad_words, tokenizer),
                          repetition_penalty=request.repetition_penalty, presence_penalty=request.presence_penalty,
                          frequency_penalty=request.frequency_penalty)
