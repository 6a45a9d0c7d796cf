"""Logits processors: min_tokens, bad words and the repetition / presence / frequency penalties.

They change the target's logits before a token is chosen (greedy, a keyed sample, or rejection sampling
against a drafter's q), with TensorRT-LLM's semantics (its `penaltyKernels` and `banBadWords`), which are
also Hugging Face's for min_new_tokens, bad_words_ids and repetition_penalty:

- min_tokens N: the request's stop token ids (its end_id / stop_token_ids) get -inf while fewer than N
  tokens were generated (TensorRT-LLM's minLength, HF's min_new_tokens). N <= 0 changes nothing.
- bad_words_ids: a one-token word is never emitted; for a longer word, its last token gets -inf when the
  sequence so far (prompt included, as in TensorRT-LLM and HF's NoBadWordsLogitsProcessor) ends with the
  word's other tokens.
- repetition_penalty p: every token present in prompt + output has its logit divided by p when positive,
  multiplied by p when negative (HF, TensorRT-LLM).
- presence_penalty a and frequency_penalty f: a token that occurs c > 0 times in prompt + output loses
  a + f * c (TensorRT-LLM counts the prompt too: its prompt_ignore_length defaults to 0). TensorRT-LLM
  subtracts them from the temperature-scaled logits, so at temperature T > 0 they are subtracted here in
  units of T (the choice divides by T afterwards); greedy requests subtract them as they are.

Speculative verification stays lossless: slot j of a verified block holds the target's logits after the
committed tokens plus the block's drafts 1..j, and a draft is accepted only when it equals the target's
choice there, so slot j is processed with exactly that prefix (its generated length, its last tokens for the
bad words, its token counts for the penalties): what plain decoding would see at that position.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dflash_trt.decoding.step.sampling import SamplingParams


def process_requests(logits: torch.Tensor, block: torch.Tensor, requests) -> torch.Tensor:
    """Verify logits [B, S, V] of a batch with each row processed for its request (batch.Request: params,
    prompt, result.token_ids); block [B, S]: the last committed token and the drafts. Returns new float
    logits; rows of requests without processors are unchanged."""
    logits = logits.float().clone()
    drafts = block[:, 1:].tolist()
    for row, request in enumerate(requests):
        if request.params.has_logits_processors:
            history = request.prompt + request.result.token_ids
            logits[row] = process(logits[row], request.params, history, len(request.result.token_ids), drafts[row])
    return logits


def process(logits: torch.Tensor, params: SamplingParams, history: Sequence[int], num_generated: int,
            drafts: Sequence[int] = ()) -> torch.Tensor:
    """Processed logits [S, V]: row j is the target's distribution after history + drafts[:j], where history
    is prompt + the tokens generated so far (num_generated of them). Returns a new float tensor."""
    rows, vocab = logits.shape
    out = logits.float().clone()
    drafts = [int(t) for t in drafts[:rows - 1]]
    if params.has_penalties:
        out = _penalize(out, _token_counts(history, drafts, rows, vocab, out.device), params)
    if params.min_tokens > num_generated and params.stop_token_ids:
        masked_rows = min(rows, params.min_tokens - num_generated)  # row j has num_generated + j tokens
        stops = [t for t in params.stop_token_ids if 0 <= t < vocab]
        out[:masked_rows, stops] = float("-inf")
    if params.bad_words_ids:
        _ban_bad_words(out, params.bad_words_ids, history, drafts)
    return out


def _token_counts(history: Sequence[int], drafts: list[int], rows: int, vocab: int,
                  device: torch.device) -> torch.Tensor:
    """[S, V] occurrences of each token in history + drafts[:j], for every row j."""
    known = torch.tensor([t for t in history if 0 <= t < vocab], dtype=torch.long, device=device)
    base = torch.bincount(known, minlength=vocab).float()
    added = torch.zeros(rows, vocab, device=device)
    # Row j adds drafts[:j]: a one at (j + 1, drafts[j]), summed down the rows; drafts past the vocabulary
    # (padding slots) count for nothing.
    slots = [(j, token) for j, token in enumerate(drafts, start=1) if 0 <= token < vocab]
    if slots:
        added[[j for j, _ in slots], [token for _, token in slots]] = 1.0
    return base[None, :] + added.cumsum(dim=0)


def _penalize(logits: torch.Tensor, counts: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    present = counts > 0
    if params.repetition_penalty != 1.0:
        penalty = params.repetition_penalty
        logits = torch.where(present, torch.where(logits < 0, logits * penalty, logits / penalty), logits)
    unit = params.temperature if params.temperature > 0 else 1.0  # TensorRT-LLM: after temperature scaling
    if params.presence_penalty != 0.0:
        logits = logits - (unit * params.presence_penalty) * present.float()
    if params.frequency_penalty != 0.0:
        logits = logits - (unit * params.frequency_penalty) * counts
    return logits


def _ban_bad_words(logits: torch.Tensor, words: tuple[tuple[int, ...], ...], history: Sequence[int],
                   drafts: list[int]) -> None:
    rows, vocab = logits.shape
    singles = [word[0] for word in words if len(word) == 1 and word[0] < vocab]
    if singles:
        logits[:, singles] = float("-inf")
    longer = [word for word in words if len(word) > 1 and word[-1] < vocab]
    if not longer:
        return
    context = max(len(word) for word in longer) - 1
    tail = list(history[-context:])  # the last tokens the longest prefix can match
    banned_rows, banned_tokens = [], []
    for j in range(rows):
        sequence = tail + drafts[:j]
        for word in longer:
            prefix = list(word[:-1])
            if len(sequence) >= len(prefix) and sequence[len(sequence) - len(prefix):] == prefix:
                banned_rows.append(j)
                banned_tokens.append(word[-1])
    if banned_rows:  # one write (one launch on a GPU)
        logits[banned_rows, banned_tokens] = float("-inf")
