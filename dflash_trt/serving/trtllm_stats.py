"""Acceptance statistics of TensorRT-LLM's streamed results, turned into the project's verify `Step`s.

TensorRT-LLM reports a request's speculative counters in three ways, read here best first (field names of
NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py and tensorrt_llm/llmapi/llm.py):
1. `RequestOutput.spec_dec_totals`: cumulative (accepted, drafted), exact; present since PR #17082, None
   where the executor attached none ("missing is not zero").
2. `outputs[0].request_perf_metrics.speculative_decoding.{total_accepted_draft_tokens, total_draft_tokens}`
   (with return_perf_metrics): in the PyTorch flow these stayed zero until PR #17082 backfilled them, so
   zero counters after verify iterations are not believed.
3. Tokens per iteration: `RequestOutput.decoding_iter` (decoding iterations so far, the prefill one
   included) or `avg_decoded_tokens_per_iter`. Every iteration commits 1 + accepted tokens, so
   accepted = tokens - iterations and drafted = (iterations - 1) * max_draft_len. Tokens dropped after an
   end id are not counted, so this can read a little low on the last step.

With `stream_interval` > 1 one streamed response covers several iterations: the response's acceptance
is then split over that many verify steps (integers that add up exactly), so tau and the counters stay
exact and the per-step histogram holds the mean of the interval. Iterations come from decoding_iter,
else from the drafted count (DFlash drafts max_draft_len per step), else one per response.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dflash_trt.serving.generation import Step

ZERO_COUNTERS_NOTICE = ("TensorRT-LLM reports zero draft tokens for requests that ran verify steps (its "
                        "request_perf_metrics.speculative_decoding counters stay zero before PR #17082); "
                        "acceptance is counted from tokens per iteration instead")


@dataclass
class Cursor:
    """What one request's previous responses already reported (cumulative)."""

    is_first: bool = True
    num_iterations: int = 0
    num_tokens: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass
class Counters:
    """Cumulative counters of one response: iterations (None when unknown), drafted and accepted."""

    num_iterations: int | None
    num_draft_tokens: int
    num_accepted_tokens: int
    source: str  # spec_dec_totals, perf_metrics, tokens_per_iteration or responses


class AcceptanceReader:
    """Reads the counters of TensorRT-LLM's results; says once per runtime when they are all zero."""

    def __init__(self, max_draft_len: int, warn=None):
        self.max_draft_len = max_draft_len
        self.warn = warn or logging.getLogger("dflash_trt.trtllm").warning
        self.has_warned = False

    def counters(self, output, num_tokens: int) -> Counters:
        """The best cumulative counters `output` (a RequestOutput with num_tokens generated) carries."""
        iterations = _iterations(output, num_tokens)
        exact = _exact_counters(output)
        if exact is not None:
            accepted, drafted, source = exact
            if drafted > 0 or iterations is None or iterations < 2 or self.max_draft_len == 0:
                return Counters(iterations, drafted, accepted, source)
            self._notice()  # verify iterations ran, yet nothing was drafted: the counters are not filled
        if iterations is None:
            return Counters(None, 0, 0, "responses")
        verify_steps = max(iterations - 1, 0)
        return Counters(iterations, verify_steps * self.max_draft_len, max(num_tokens - iterations, 0),
                        "tokens_per_iteration")

    def steps(self, output, cursor: Cursor) -> list[Step]:
        """The verify steps one streamed response stands for (the first also holds the prefill token)."""
        completion = output.outputs[0]
        new_ids = [int(t) for t in completion.token_ids_diff]
        finished = bool(output.finished)
        reason = (completion.finish_reason or "length") if finished else ""
        num_tokens = cursor.num_tokens + len(new_ids)
        counters = self.counters(output, num_tokens)
        steps = []
        if cursor.is_first and new_ids:
            steps.append(Step(new_ids[:1], None, False))  # the prefill token: no verify step
            new_ids = new_ids[1:]
        num_steps = self._num_verify_steps(counters, cursor, len(new_ids))
        drafted = counters.num_draft_tokens - cursor.num_draft_tokens
        accepted = max(counters.num_accepted_tokens - cursor.num_accepted_tokens, 0)
        if counters.source == "responses":
            lengths, drafts = ([len(new_ids)], [None]) if num_steps else ([], [])
        else:
            lengths, drafts = _split(accepted + num_steps, num_steps), _split(drafted, num_steps)
        for i, (length, num_draft) in enumerate(zip(lengths, drafts)):
            last = i == num_steps - 1
            steps.append(Step(new_ids if last else [], length, False, "", num_draft))
        if num_steps == 0 and (new_ids or not steps):
            steps.append(Step(new_ids, None, False))  # tokens without a verify step (or the bare final flag)
        steps[-1].is_final, steps[-1].finish_reason = finished, reason
        _advance(cursor, counters, num_tokens)
        return steps

    def _num_verify_steps(self, counters: Counters, cursor: Cursor, num_new_tokens: int) -> int:
        if counters.num_iterations is not None:
            previous = cursor.num_iterations if not cursor.is_first else 1  # the first iteration is the prefill
            return max(counters.num_iterations - previous, 0)
        drafted = counters.num_draft_tokens - cursor.num_draft_tokens
        if counters.source != "responses" and self.max_draft_len and drafted > 0:
            return max(1, round(drafted / self.max_draft_len))
        return 1 if num_new_tokens else 0

    def _notice(self) -> None:
        if not self.has_warned:
            self.has_warned = True
            self.warn(ZERO_COUNTERS_NOTICE)


def _exact_counters(output) -> tuple[int, int, str] | None:
    totals = getattr(output, "spec_dec_totals", None)
    if totals is not None:
        accepted, drafted = totals
        return int(accepted), int(drafted), "spec_dec_totals"
    completion = output.outputs[0]
    spec = getattr(getattr(completion, "request_perf_metrics", None), "speculative_decoding", None)
    if spec is None:
        return None
    return int(spec.total_accepted_draft_tokens), int(spec.total_draft_tokens), "perf_metrics"


def _iterations(output, num_tokens: int) -> int | None:
    iterations = getattr(output, "decoding_iter", None)
    if isinstance(iterations, int) and iterations > 0:
        return iterations
    average = getattr(output, "avg_decoded_tokens_per_iter", None)
    if average is None:
        average = getattr(output.outputs[0], "avg_decoded_tokens_per_iter", None)
    if isinstance(average, (int, float)) and average > 0 and num_tokens:
        return max(1, round(num_tokens / average))
    return None


def _split(total: int, parts: int) -> list[int]:
    """`parts` integers that differ by at most one and add up to `total`."""
    if parts <= 0:
        return []
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _advance(cursor: Cursor, counters: Counters, num_tokens: int) -> None:
    if counters.num_iterations is not None:
        cursor.num_iterations = counters.num_iterations
    cursor.num_tokens = num_tokens
    cursor.num_draft_tokens, cursor.num_accepted_tokens = counters.num_draft_tokens, counters.num_accepted_tokens
    cursor.is_first = False
