"""Prefill of newcomers, alone or as a small group, in chunks of at most a token budget per step.

A group's prompts are left-padded to a common width in a cache of their own (not the running batch's),
and its columns are fed to the target a chunk at a time; each chunk sees the cache of the previous ones.
When the last chunk is in, the group becomes a RunningBatch of its own (its cache realigned to the left,
target.batch_cache) with the first token of each request chosen, ready to take its first decoding step
and then to join the running batch.

On a target with the native decoder (a Llama at its GGUF precision, model/lean_llama.py), the prompts are
right-padded instead, into a decoding cache from the start, and that decoder computes them: the same logits,
keys, values and features, bit for bit, without transformers' per-layer Python (demo target, one thread: a
49-token prompt in 47 ms instead of 64 ms; four of ~48 tokens in 43 ms each instead of 55 ms). A row's padding
comes after its prompt, so no prompt token attends to it; the padding's slots are dropped when the last chunk
is in, and each row's first token comes from the logits of its own last prompt column.

With a prefix cache (prefix_cache.py), a request whose prompt starts with cached blocks is prefilled alone: its
cache and its drafter features start with the cached blocks' and only the rest of the prompt is computed. A
finished prefill stores its prompts' blocks (`store_prefixes`).
"""

from __future__ import annotations

import time

import torch

from dflash_trt.decoding.scheduler.prefix_cache import PrefixCache, PrefixHit
from dflash_trt.decoding.step import logits_processors
from dflash_trt.decoding.step.batch import Request, RunningBatch
from dflash_trt.decoding.step.results import StepOutput
from dflash_trt.decoding.step.sampling import choose_keyed


class PrefillJob:
    """The prefill of `requests` (one group), advanced by `advance` once per scheduler step."""

    def __init__(self, target, drafter, requests: list[Request], layer_ids, hit: PrefixHit | None = None):
        """hit: cached blocks the (single) request's prompt starts with."""
        self.target, self.drafter, self.requests, self.layer_ids = target, drafter, requests, layer_ids
        device = target.device
        self.lengths = torch.tensor([len(r.prompt) for r in requests], device=device)
        self.width = int(self.lengths.max())
        # Right-padded into a decoding cache for the native decoder (module docstring), else left-padded into
        # transformers' cache.
        self.direct = target.lean is not None
        self.pad = torch.zeros_like(self.lengths) if self.direct else self.width - self.lengths
        self.tokens = torch.zeros(len(requests), self.width, dtype=torch.long, device=device)
        for row, request in enumerate(requests):
            start = int(self.pad[row])
            self.tokens[row, start:start + len(request.prompt)] = torch.tensor(request.prompt, device=device)
        self.mask = torch.arange(self.width, device=device)[None, :] >= self.pad[:, None]
        self.positions = (torch.cumsum(self.mask.long(), dim=1) - 1).clamp(min=0)
        if self.direct:
            reserved = max(r.reserved_tokens for r in requests)
            capacity = min(max(reserved, self.width), 2 * self.width)
            self.cache = target.empty_batch_cache(len(requests), capacity, reserved)
        else:
            self.cache = target.new_cache()
        self.done_columns = 0
        self._features: list[torch.Tensor] = []
        self._gathered: torch.Tensor | None = None  # features(), once the last chunk is in
        self._last_logits: torch.Tensor | None = None
        self.elapsed_s = 0.0
        self.last_chunk_tokens = 0  # tokens (padding included) the last advance computed
        if hit is not None and hit.blocks:
            self._start_from(hit)

    def _start_from(self, hit: PrefixHit) -> None:
        """Fill the cache and the features with the hit's blocks, as if their columns had been computed."""
        if len(self.requests) != 1:
            raise RuntimeError("a prefix hit is prefilled alone")  # internal invariant (Scheduler._admit)
        for layer in range(len(hit.blocks[0].keys)):
            if self.direct:
                self.cache.keys[layer][:, :, :hit.num_tokens] = hit.keys(layer)
                self.cache.values[layer][:, :, :hit.num_tokens] = hit.values(layer)
            else:
                self.cache.update(hit.keys(layer), hit.values(layer), layer)
        if self.direct:
            self.cache.set_lengths(self.lengths.new_full((1,), hit.num_tokens))
        if self.layer_ids:
            self._features.append(hit.features())
        self.done_columns = hit.num_tokens

    @property
    def num_tokens(self) -> int:
        """Tokens (padding included) one forward over every column would compute."""
        return len(self.requests) * self.width

    @property
    def is_done(self) -> bool:
        return self.done_columns == self.width

    @torch.inference_mode()
    def advance(self, token_budget: int | None) -> None:
        """Feed the next chunk of columns: at most token_budget tokens over the group (None: all)."""
        start_time = time.perf_counter()
        step = self.width if token_budget is None else max(1, token_budget // len(self.requests))
        start, end = self.done_columns, min(self.width, self.done_columns + step)
        if self.direct:
            self._advance_direct(start, end)
        else:
            out = self.target.forward(self.tokens[:, start:end], self.positions[:, start:end],
                                      self.mask[:, :end].long(), self.cache, self.layer_ids, last_only=True)
            self._keep_features(out)
            if end == self.width:
                self._last_logits = out.logits[:, -1]
        self.last_chunk_tokens = (end - start) * len(self.requests)
        self.done_columns = end
        self.elapsed_s += time.perf_counter() - start_time

    def _advance_direct(self, start: int, end: int) -> None:
        """Columns start..end by the native decoder; each row's logits at its last prompt column, in this chunk or
        an earlier one."""
        masks = self.cache.prepare(end - start)
        last = self.lengths - 1
        out = self.target.forward(self.tokens[:, start:end], self.positions[:, start:end], masks, self.cache,
                                  self.layer_ids, logits_at=(last - start).clamp(0, end - start - 1))
        self.cache.set_lengths(self.cache.lengths + (end - start))
        self._keep_features(out)
        ends_here = (last >= start) & (last < end)
        if self._last_logits is None:
            self._last_logits = out.logits[:, -1].clone()
        self._last_logits[ends_here] = out.logits[ends_here, -1]
        if end == self.width:
            self.cache.set_lengths(self.lengths.clone())  # the padding's slots are free again

    def _keep_features(self, out) -> None:
        if out.features is not None:
            self._features.append(out.features)

    def features(self) -> torch.Tensor | None:
        """[B, width, F] the target features of every prompt position, left-aligned (row i of request b = prompt
        position i), or None without a drafter. Gathered once when the prefill is done (finish and the prefix
        cache both read them)."""
        if self._gathered is None and self.is_done:
            self._gathered = self._gather_features()
        return self._gathered

    def _gather_features(self) -> torch.Tensor | None:
        if not self._features:
            return None
        padded = torch.cat(self._features, dim=1)
        if self.direct:
            return padded  # right-padded: already left-aligned
        index = (torch.arange(self.width, device=self.pad.device)[None, :] + self.pad[:, None]).clamp(
            max=self.width - 1)
        return torch.gather(padded, 1, index[:, :, None].expand(-1, -1, padded.shape[2]))

    def finish(self, capacity: int) -> tuple[RunningBatch, list[StepOutput]]:
        """The prefilled group as a batch, with each request's first token committed; capacity: KV slots a row
        may need at most (the longest reservation), for the target's and the drafter's caches."""
        first_tokens = torch.zeros(len(self.requests), dtype=torch.long, device=self.mask.device)
        outputs = []
        for row, request in enumerate(self.requests):
            logits = self._last_logits[row:row + 1]
            if request.params.has_logits_processors:  # the first token follows the prompt alone
                logits = logits_processors.process(logits, request.params, request.prompt, 0)
            first = int(choose_keyed(logits, request.params, request.seed, 0)[0])
            first_tokens[row] = first
            request.result.prefill_s = self.elapsed_s
            if not request.is_finished:  # a request aborted during its prefill gets no token
                outputs.append(request.step_output(request.commit([first]), None))
        features = self.features()
        draft_cache = self.drafter.new_cache(len(self.requests), capacity) if self.drafter else None
        if self.direct:
            cache = self.cache
            cache.capacity_limit = capacity
        else:
            cache = self.target.batch_cache(self.cache, self.lengths, capacity)
        batch = RunningBatch(list(self.requests), cache, first_tokens, features, self.lengths.clone(), draft_cache)
        return batch, outputs

    def prompt_kv(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer, the keys and the values [H, prompt length, D] of row `row`'s prompt (views of the cache)."""
        length = len(self.requests[row].prompt)
        if self.direct:
            return ([k[row, :, :length] for k in self.cache.keys], [v[row, :, :length] for v in self.cache.values])
        start = int(self.pad[row])
        return ([layer.keys[row, :, start:start + length] for layer in self.cache.layers],
                [layer.values[row, :, start:start + length] for layer in self.cache.layers])


def store_prefixes(job: PrefillJob, cache: PrefixCache) -> None:
    """Put the full prompt blocks of a finished prefill into the prefix cache, and have its requests record their
    features from here on (store_answer)."""
    features = job.features()
    for row, request in enumerate(job.requests):
        keys, values = job.prompt_kv(row)
        prompt_features = None if features is None else features[row, :len(request.prompt)]
        cache.insert(request.prompt, keys, values, prompt_features)
        request.history_features = [] if prompt_features is None else [prompt_features]


def store_answer(batch, row: int, cache: PrefixCache) -> None:
    """Put the full blocks of a finished request's prompt and answer into the prefix cache: the next turn of a
    chat resends both. Every committed position but the last token's (whose KV no forward wrote) is cached, with
    the KV of the batch's row and the features the request recorded."""
    request = batch.requests[row]
    tokens = request.prompt + request.result.token_ids
    length = min(len(tokens) - 1, int(batch.cache.lengths[row]))
    keys = [k[row, :, :length] for k in batch.cache.keys]
    values = [v[row, :, :length] for v in batch.cache.values]
    features = torch.cat(request.history_features)[:length] if request.history_features else None
    if features is not None and features.shape[0] < length:
        return  # internal invariant: a position without its features is never cached
    cache.insert(tokens[:length], keys, values, features)
