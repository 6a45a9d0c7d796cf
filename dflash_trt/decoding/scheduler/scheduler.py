"""In-flight batching: requests join and leave one running decoding batch between steps.

    scheduler = Scheduler(target, drafter)
    rid = scheduler.add_request(prompt_ids, SamplingParams(max_new_tokens=64))
    while scheduler.has_unfinished:
        for out in scheduler.step():      # StepOutput: out.index is the request id
            ...
    scheduler.abort(rid)                  # leaves the batch before the next step

One `step()`: finished and aborted rows leave the running batch (their memory is released); the running
batch takes one decoding step (step.decode_step) with the plan the policy picks for its size (plain, a chain
of S tokens or a tree of B nodes, block_policy.py);
then the prefill of waiting requests computes at most `prefill_chunk_tokens` tokens (a group that finishes
with budget left lets the next one start), so a long prompt stalls the running streams by a bounded amount per
step. A prefilled group's first tokens are returned by the step that finishes its prefill; the next step gives the
group its first decoding step: a plain one with the running batch, which the group joins first (the prompt stays
pending either way, and a step of its own would read every weight once more); a drafted one on the group alone (so
the drafter takes in its prompt without widening the whole batch), after which it joins. Plain steps leave the
drafter alone: the target features they record wait, by reference, for the next drafted step, which first catches
the drafter up (timed apart, for the policy); only past `max_pending_features` context rows does the drafter take
them in while the batch decodes plain, so rows that finish while a loaded server decodes plain never pay for the
drafter. Requests are admitted in arrival order while the
batch has fewer than `max_batch_size` rows and rows x longest reservation (prompt + max_new_tokens + block) stays
within `max_kv_tokens`, which bounds the KV cache of target and drafter under any load. With a prefix cache
(prefix_cache.py), a prompt that starts with cached blocks is prefilled alone from the end of its hit, and every
finished prefill stores its prompts' blocks.

Every request gets the tokens it gets alone: rows never see each other (masking, per-row positions), and
sampled requests draw from their own position-keyed stream (sampling.choose_keyed), so neither the batch
nor the block size changes what they emit. Not thread-safe: one thread drives a scheduler.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Hashable, Sequence

from dflash_trt.decoding.model.kv_cache import Room
from dflash_trt.decoding.model.protocols import Drafter, Target
from dflash_trt.decoding.scheduler.block_policy import (PLAIN, AdaptiveBlockSize, BlockSizePolicy, StepPlan,
                                                         tree_budget_ladder)
from dflash_trt.decoding.scheduler.prefill import PrefillJob, store_answer, store_prefixes
from dflash_trt.decoding.scheduler.prefix_cache import PrefixCache, PrefixHit
from dflash_trt.decoding.step.batch import Request, RunningBatch
from dflash_trt.decoding.step.results import StepOutput
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.step import absorb_context, decode_step, resolve_block_size
from dflash_trt.decoding.step.verify import ChainVerify, TreeVerify, VerifyMethod
from dflash_trt.errors import DFlashError


def allowed_block_sizes(drafter, max_block_size: int) -> list[int]:
    """Block sizes a step may verify: 1..max, or 1 and the one block size a drafter was exported for."""
    static = drafter.static_block_size if drafter is not None else None
    if static is None:
        return list(range(1, max_block_size + 1))
    if max_block_size not in (1, static):
        raise DFlashError(f"the drafter was exported for block size {static}; it cannot draft blocks of "
                          f"{max_block_size}")
    return sorted({1, max_block_size})


@dataclass(frozen=True)
class SchedulerLimits:
    """max_batch_size: rows decoding together; max_kv_tokens: bound on rows x longest reservation (None:
    unbounded); prefill_chunk_tokens: prompt tokens prefilled per step (None: a whole group at once);
    max_pending_features: bound on the target features a batch keeps for the drafter while it decodes plain, in
    context rows as a catch-up computes them (rows x the longest backlog; None: unbounded). Past it the drafter takes
    them in while decoding plain; below it they wait, and cost nothing if the rows finish first (module docstring)."""

    max_batch_size: int = 16
    max_kv_tokens: int | None = 65536
    prefill_chunk_tokens: int | None = 512
    max_pending_features: int | None = 16384

    def __post_init__(self):
        if self.max_batch_size < 1:
            raise DFlashError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        for name in ("max_kv_tokens", "prefill_chunk_tokens", "max_pending_features"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise DFlashError(f"{name} must be >= 1, got {value}")


class Scheduler:
    """A running batch that requests join and leave between decoding steps (module docstring)."""

    def __init__(self, target: Target, drafter: Drafter | None = None, block_size: int | None = None,
                 limits: SchedulerLimits | None = None, policy: BlockSizePolicy | None = None,
                 method: VerifyMethod | None = None, prefix_cache: PrefixCache | None = None):
        """method: how drafts are verified (step/verify; default the chain). A tree method's budget is the cap of
        the default (adaptive) policy, which chooses per step among plain, chains and trees up to it; a pinned
        policy (FixedBlockSize) runs `method` on every step unless it pins a tree budget of its own.
        prefix_cache: reuse the KV and drafter features of cached prompt prefixes (prefix_cache.py; None: every
        prompt is prefilled whole)."""
        self.target = target
        self.method = method or ChainVerify()
        self.max_block_size = resolve_block_size(drafter, block_size)
        self.drafter = drafter if self.max_block_size > 1 else None
        self.layer_ids = tuple(drafter.config.target_layer_ids) if self.drafter is not None else ()
        self.limits = limits or SchedulerLimits()
        self.block_sizes = allowed_block_sizes(self.drafter, self.max_block_size)
        self.policy = policy or AdaptiveBlockSize(self.max_block_size, sizes=self.block_sizes,
                                                  tree_budgets=tree_budget_ladder(_tree_cap(self.method),
                                                                                  self.max_block_size))
        if self.policy.max_block_size > self.max_block_size:
            raise DFlashError(f"policy block size {self.policy.max_block_size} exceeds {self.max_block_size}")
        self._methods: dict[int | None, VerifyMethod] = {None: self.method, 0: ChainVerify()}
        top_k = self.method.top_k if isinstance(self.method, TreeVerify) else None
        for budget in self.policy.tree_budgets:
            self._methods[budget] = TreeVerify(budget, top_k)
        if self.drafter is not None:
            target.check_drafter(drafter.config)
            for checked in self._methods.values():
                checked.check(target, self.drafter)
        # KV slots a row may write in one step: the largest verify any plan may run.
        self.verify_slots = max(m.verify_slots(self.max_block_size) for m in self._methods.values())
        self.prefix_cache = prefix_cache
        self.waiting: deque[Request] = deque()
        self.prefill: PrefillJob | None = None
        self.running: RunningBatch | None = None
        # A group whose prefill finished last step: its first tokens are out, its first decoding step is next.
        self.fresh: RunningBatch | None = None
        self._prefilled_last = False  # the last step prefilled (steps alternate while prompts wait)
        # When the last decoding step of the running batch ended, while no prefill or first step has run since: the
        # time from then to the next one is the overhead every step carries (policy.observe_overhead).
        self._decoded_at: float | None = None
        self._requests: dict[Hashable, Request] = {}
        self._aborted: list[StepOutput] = []
        self._ids = itertools.count()

    # -- the API --------------------------------------------------------------------------------------
    def add_request(self, prompt: Sequence[int], params: SamplingParams, request_id: Hashable | None = None
                    ) -> Hashable:
        """Queue a request; it joins the running batch within the next steps. Returns its id.

        Raises DFlashError (and queues nothing) for an empty prompt, a context the target cannot hold, or
        one that alone exceeds max_kv_tokens."""
        request_id = next(self._ids) if request_id is None else request_id
        if request_id in self._requests:
            raise DFlashError(f"request id {request_id!r} is already in use")
        request = Request(request_id, prompt, params, self.max_block_size,
                          self.verify_slots if self.drafter is not None else 1)
        limit = self.target.max_context
        if limit and request.reserved_tokens > limit:
            raise DFlashError(f"prompt {request_id}: {len(request.prompt)} prompt tokens + max_new_tokens "
                              f"{params.max_new_tokens} + block {request.verify_slots} exceed the target's context "
                              f"of {limit} tokens")
        if self.limits.max_kv_tokens is not None and request.reserved_tokens > self.limits.max_kv_tokens:
            raise DFlashError(f"prompt {request_id}: {request.reserved_tokens} KV slots needed exceed max_kv_tokens "
                              f"{self.limits.max_kv_tokens}")
        self._requests[request_id] = request
        self.waiting.append(request)
        return request_id

    def abort(self, request_id: Hashable) -> bool:
        """Stop a request: it leaves at the start of the next step, which reports it final ("cancelled")."""
        request = self._requests.get(request_id)
        if request is None or request.is_finished:
            return False
        request.finish("cancelled")
        if request in self.waiting:
            self.waiting.remove(request)
        self._aborted.append(request.step_output([], None))
        return True

    @property
    def num_running(self) -> int:
        return sum(len(b) for b in (self.running, self.fresh) if b is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + (len(self.prefill.requests) if self.prefill is not None else 0)

    @property
    def num_requests(self) -> int:
        """Requests not finished yet (running, being prefilled, or waiting)."""
        return len(self._requests)

    @property
    def has_unfinished(self) -> bool:
        return bool(self._requests) or bool(self._aborted)

    @property
    def is_full(self) -> bool:
        """No room for one more request in the batch (callers hold new requests back)."""
        return self.num_requests >= self.limits.max_batch_size

    def step(self) -> list[StepOutput]:
        """One scheduling iteration (module docstring); returns what every request committed."""
        outputs, self._aborted = self._aborted, []
        self._leave()
        self._admit()
        decoding = self.running is not None or self.fresh is not None
        if self.prefill is not None and not (decoding and self._prefilled_last):
            # A prefill step: while prompts wait, steps alternate between prefilling and decoding, so that a
            # newcomer's first token waits for at most one decoding step, not for one plus its own prefill.
            outputs += self._prefill_within_budget()
            self._prefilled_last, self._decoded_at = True, None
        else:
            first_plan = None
            if self.fresh is not None:
                self.fresh.drop_finished()  # aborted since its prefill
                first_plan = self._first_step_plan(self.fresh) if self.fresh.requests else PLAIN
                if self._first_step_with_the_batch(first_plan):
                    self._join(self.fresh)
                    self.fresh = None
            if self.running is not None:
                outputs += self._decode(self.running)
                self._leave()
            if self.fresh is not None:
                outputs += self._first_step(first_plan)
                self._decoded_at = None
            self._prefilled_last = False
        for out in outputs:
            if out.is_final:
                self._requests.pop(out.index, None)
        return outputs

    def exclude_time(self, seconds: float) -> None:
        """Leave out `seconds` that passed outside this scheduler's work and its caller's (another scheduler's steps
        in the same thread, benchmarks/interleaved.py) from the time between two decoding steps, which the policy
        counts as the overhead every step carries (policy.observe_overhead)."""
        if self._decoded_at is not None:
            self._decoded_at += seconds

    # -- the pieces of a step -------------------------------------------------------------------------
    def _decode(self, batch: RunningBatch, first_plan: StepPlan | None = None) -> list[StepOutput]:
        """A decoding step of `batch`; first_plan: the plan of a newcomer group's first step (_first_step_plan),
        which the policy does not learn from."""
        first = first_plan is not None
        if not first and self._decoded_at is not None and self.drafter is not None:
            self.policy.observe_overhead(len(batch), time.perf_counter() - self._decoded_at)
        if self.drafter is None:
            plan = PLAIN
        elif first:
            plan = first_plan
        else:
            plan = self.policy.choose(len(batch), catch_up_rows=self._backlog(batch))
        if len(self.block_sizes) == self.max_block_size:  # any size runs: never more than the longest row needs
            # (a block of L slots commits at most L tokens: remaining + 1 slots, acceptance.block_lengths)
            plan = plan.with_block_size(max(1, min(plan.block_size, max(r.remaining for r in batch.requests) + 1)))
        elif plan.block_size not in self.block_sizes:
            plan = plan.with_block_size(self.max_block_size)
        if not first and (self._over_feature_bound(batch.pending_context_rows) if plan.block_size == 1
                          else self._backlog(batch)):
            # The drafter first takes in what plain steps left pending, timed on its own: the policy charges it to
            # drafting after plain steps (and to the exploration that caused it), not to the drafted step. Decoding
            # plain, only a backlog past the bound is taken in.
            rows, start = batch.pending_context_rows, time.perf_counter()
            absorb_context(self.target, self.drafter, batch)
            self.policy.observe_catch_up(rows, time.perf_counter() - start)
        start = time.perf_counter()
        report = decode_step(self.target, self.drafter, batch, plan.block_size, self.layer_ids,
                             self._methods[plan.tree_budget])
        if not first:
            self.policy.observe(len(batch), plan, time.perf_counter() - start, report.accepted)
            self._decoded_at = time.perf_counter()
        return report.outputs

    def _backlog(self, batch: RunningBatch) -> int:
        """Context rows a drafted step would have to take in beyond a usual step's (rows x the longest backlog), when
        plain steps or a newcomer's prompt left more than two blocks pending; else 0."""
        if self.drafter is None or batch.pending_features <= 2 * self.max_block_size:
            return 0
        return batch.pending_context_rows

    def _over_feature_bound(self, context_rows: int) -> bool:
        """Whether `context_rows` pending (a catch-up's rows x longest backlog) exceed limits.max_pending_features."""
        bound = self.limits.max_pending_features
        return self.drafter is not None and bound is not None and context_rows > bound

    def _leave(self) -> None:
        if self.running is not None:
            if any(r.is_finished for r in self.running.requests):
                # What finished rows cost before the next step (the prefix cache storing their answers, the caller
                # sending their last responses) is paid per request, whatever the plans: the time to the next step
                # is not the overhead every step carries (counted as such, it made steps at the batch sizes that
                # finishes leave behind look dear, and drafting look cheap there: 5-11 ms against 2 ms at 4 in flight).
                self._decoded_at = None
            self._store_answers(self.running)
            self.running.drop_finished()
            if not self.running.requests:
                self.running = None

    def _store_answers(self, batch: RunningBatch) -> None:
        """Cache the prompt and answer of every request of `batch` that finished (not cancelled) this step."""
        if self.prefix_cache is None:
            return
        for row, request in enumerate(batch.requests):
            if request.is_finished and request.result.finish_reason != "cancelled" \
                    and request.history_features is not None:
                store_answer(batch, row, self.prefix_cache)
                request.history_features = None

    def _prefill_within_budget(self) -> list[StepOutput]:
        """Advance prefills by at most prefill_chunk_tokens computed tokens: a group that finishes with budget left
        lets the next one start in the same step (prefix hits are prefilled alone and compute only what follows
        their hit, so several of them fit in one step instead of taking a step each)."""
        outputs, budget = [], self.limits.prefill_chunk_tokens
        while True:
            self._admit()
            if self.prefill is None:
                return outputs
            job = self.prefill
            outputs += self._advance_prefill(budget)
            if budget is not None:
                budget -= job.last_chunk_tokens
            if self.prefill is not None or (budget is not None and budget <= 0):
                return outputs

    def _admit(self) -> None:
        """Form the next prefill group from the head of the queue, within the limits. A request whose prompt
        starts with cached prefix blocks is prefilled alone, from the end of its hit."""
        if self.prefill is not None or not self.waiting:
            return
        rows = [r for b in (self.running, self.fresh) if b is not None for r in b.requests]
        budget, group, hit = self.limits.prefill_chunk_tokens, [], None
        while self.waiting:
            head = self.waiting[0]
            size = len(rows) + len(group) + 1
            if size > self.limits.max_batch_size:
                break
            longest = max(r.reserved_tokens for r in rows + group + [head])
            if self.limits.max_kv_tokens is not None and size * longest > self.limits.max_kv_tokens:
                break
            width = max(len(r.prompt) for r in group + [head])
            if group and budget is not None and (len(group) + 1) * width > budget:
                break
            head_hit = self._usable_hit(head, alone=not group)
            if group and head_hit.blocks:
                break  # it starts its own group next time
            group.append(self.waiting.popleft())
            self._record_lookup(head, head_hit)
            if head_hit.blocks:
                hit = head_hit
                break
            if budget is not None and len(head.prompt) >= budget:
                break  # a long prompt is prefilled alone, a chunk per step
        if group:
            self.prefill = PrefillJob(self.target, self.drafter, group, self.layer_ids, hit)

    def _usable_hit(self, request: Request, alone: bool) -> PrefixHit:
        """The cached blocks `request`'s prompt starts with (looked up once per request), if its prefill should use
        them. A hit is prefilled alone, so while others wait to be prefilled with it, a hit of less than half its
        prompt is not worth a prefill step of its own: it joins the group and computes its whole prompt."""
        if self.prefix_cache is None:
            return PrefixHit([])
        if request.prefix_hit is None:
            request.prefix_hit = self.prefix_cache.match(request.prompt)
        hit = request.prefix_hit
        crowded = not alone or len(self.waiting) > 1
        return hit if not crowded or 2 * hit.num_tokens >= len(request.prompt) else PrefixHit([])

    def _record_lookup(self, request: Request, used: PrefixHit) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.record(len(request.prompt), used.num_tokens)
            request.result.num_cached_tokens = used.num_tokens

    def _advance_prefill(self, token_budget: int | None) -> list[StepOutput]:
        job = self.prefill
        if all(r.is_finished for r in job.requests):  # every request of the group was aborted
            self.prefill = None
            job.last_chunk_tokens = 0
            return []
        job.advance(token_budget)
        if not job.is_done:
            return []
        self.prefill = None
        if self.prefix_cache is not None:
            store_prefixes(job, self.prefix_cache)
        for request in job.requests:
            request.prefix_hit = None  # the blocks were copied; the cache may evict them
        batch, outputs = job.finish(max(r.reserved_tokens for r in job.requests))
        batch.drop_finished()
        # The first tokens go out now; the group's first decoding step waits for the next step(), so that a
        # request's time to first token is its prefill's, not its prefill's plus a draft and a verify. Groups
        # prefilled in the same step take that first step together.
        if batch.requests:
            self.fresh = _joined(self.fresh, batch)
        return outputs

    def _first_step(self, plan: StepPlan) -> list[StepOutput]:
        """The prefilled group's first decoding step on its own, then it joins the running batch (a plain first step
        with a batch to join is that batch's step instead, _first_step_with_the_batch). A drafted one takes in the
        whole prompt while the group is alone; a plain one leaves it pending, unless the joined batch's backlog
        would then pass the bound (a long prompt: a catch-up would pad every row to it), in which case the group
        takes it in now, alone. It is not a typical step, so the policy does not learn its cost. plan:
        _first_step_plan's."""
        batch, self.fresh = self.fresh, None
        outputs = []
        if batch.requests:
            outputs += self._decode(batch, first_plan=plan)
            if batch.pending_features and self._over_feature_bound(self._joined_backlog(batch)):
                absorb_context(self.target, self.drafter, batch)
            self._store_answers(batch)
            batch.drop_finished()
        if batch.requests:
            self._join(batch)
        return outputs

    def _first_step_plan(self, group: RunningBatch) -> StepPlan:
        """The plan of a prefilled group's first step: the plan of the batch it joins (drafting takes its prompt in
        while it is alone). Drafting there would first catch up what plain steps left pending in the running rows
        (the group's own prompt is taken in either way)."""
        if self.drafter is None:
            return PLAIN
        running = self.running
        rows = len(group) + (len(running) if running is not None else 0)
        backlog = self._backlog(running) if running is not None else 0
        return self.policy.choose(rows, catch_up_rows=backlog and rows * running.pending_features, observed=False)

    def _first_step_with_the_batch(self, plan: StepPlan) -> bool:
        """Whether the prefilled group joins the running batch before its first step and takes that step with it: a
        plain first step leaves the group's prompt pending either way, and on its own it would read every weight
        once more (at 4 requests in flight, requests that finish at different steps are prefilled one by one, and
        each paid a plain step alone). A drafted first step, or a plain one whose joined backlog would pass the
        bound (the group then takes its prompt in alone), runs on the group alone (_first_step)."""
        if plan.block_size != 1 or self.running is None or not self.fresh.requests:
            return False
        return not self._over_feature_bound(self._joined_backlog(self.fresh, ahead=1))  # + the step's own feature row

    def _joined_backlog(self, group: RunningBatch, ahead: int = 0) -> int:
        """Context rows a catch-up would compute once `group` joined the running batch (rows x the longest backlog),
        with `ahead` more feature rows per row than now."""
        running = self.running if self.running is not None and self.running.requests else None
        rows = len(group) + (len(running) if running else 0)
        return rows * (max(group.pending_features, running.pending_features if running else 0) + ahead)

    def _join(self, newcomers: RunningBatch) -> None:
        """`newcomers` join the running batch (they become it when there is none)."""
        self._plan_room(newcomers)
        self.running = _joined(self.running, newcomers)

    def _plan_room(self, newcomers: RunningBatch) -> None:
        """Before `newcomers` join: the KV cache, when it must grow, makes room for every request in sight (running,
        joining, being prefilled, waiting; the first max_batch_size of them), so that a burst of arrivals, joining
        group by group, reallocates it once (each growth copies the whole cache)."""
        running = self.running.requests if self.running is not None else []
        prefilling = self.prefill.requests if self.prefill is not None else []
        in_sight = list(itertools.islice(itertools.chain(running, newcomers.requests, prefilling, self.waiting),
                                         self.limits.max_batch_size))
        room = Room(len(in_sight), max(r.reserved_tokens for r in in_sight), self.limits.max_batch_size,
                    self.limits.max_kv_tokens)
        (self.running if self.running is not None else newcomers).plan_room(room)


def _joined(batch: RunningBatch | None, newcomers: RunningBatch) -> RunningBatch:
    """`batch` with the rows of `newcomers` appended (the newcomers alone when there is no batch)."""
    if batch is None:
        return newcomers
    batch.merge(newcomers)
    return batch


def _tree_cap(method: VerifyMethod) -> int:
    """The node budget of a tree method (0 for the chain)."""
    return method.budget if isinstance(method, TreeVerify) else 0
