"""What each decoding step verifies per sequence: plain decoding, a chain of S tokens, or a tree of B nodes.

Drafting pays when verifying several tokens per sequence costs little more than verifying one, which holds
for a small batch and stops holding once the target's forward is compute bound (a large batch on a
CPU, or a full GPU). `AdaptiveBlockSize` picks, before every step, the `StepPlan` among its candidates
(plain, chains of 2..max tokens, and trees of the budgets it was given) that maximizes expected committed
tokens per second for the current batch size B:

    value(plan) = tokens(plan) / cost(B, plan)

- tokens(chain of S): expected tokens committed per sequence = 1 + sum_{k<S} P(draft 1..k all accepted). The
  per-position acceptance rates are counted from the chain steps run so far (a position that a shorter block
  never verified is not counted as rejected), with a light prior so a fresh policy tries drafting, and older
  steps weigh less (the mix of requests changes).
- tokens(tree of B): the mean tokens committed per sequence by that budget's own past steps (older steps weigh
  less); before its first step, the chain's figure for its spine, which it never does worse than.
- cost(B, plan): the measured wall time of past steps (means of the first few, then moving averages, slower for
  plain steps, which come often and whose cost moves by tens of percent over a few steps; one slow step counting at
  most twice the average so far), kept separately for plain steps (no drafter call, per batch size, interpolated between
  measured sizes, and every figure, measured or not, at most the next smaller measured size's per row and at most
  the next larger one's, PlainStepCosts: one slow step at a batch size seen rarely must not make drafting look cheap
  there or around it), chain steps and tree steps (per batch size and tokens verified
  per sequence, BatchStepCosts: at an unmeasured batch size an upper bound from the nearest measured ones, so that
  drafting never looks cheaper at a batch size where it was not measured); a tree never measured is costed as a
  chain of as many tokens; a chain shorter than every chain measured at the batch size costs at most the line from
  a plain step to the shortest measured one (else a policy that measured only long chains would never try a short
  one). A drafted plan chosen while plain steps left a backlog of context rows pending carries the cost of taking
  them in (CatchUpCost, measured by the scheduler apart from the step), spread over as many drafted steps as
  followed a catch-up so far (DraftingRuns: a moving average, at most `catch_up_horizon`; that many before any).
  Every plan's cost also carries the time between two decoding steps outside them (the caller streaming a step's
  outputs, the scheduler's bookkeeping; measured by the scheduler between back-to-back decoding steps), which a
  step committing more tokens per row pays fewer times per token.
- a drafted plan is taken only if its value beats plain decoding's by `draft_margin` (drafting costs more than
  its steps show: newcomers' prompts, catch-ups when switching; near a tie, noise would decide).
- once plain decoding is the best plan at a batch size it stands there for `recheck_every` decisions, unless a
  drafted step or a catch-up is observed or the backlog shrinks (only plain decoding's own cost moves in between):
  a loaded server that stays plain does not pay for working the choice out on every step.
- exploration: the first step drafts a chain of max tokens, the second is plain, each tree budget then runs
  once (each mode measured once); a batch size whose plain cost is only extrapolated (no plain step measured
  within 25% of its token count, e.g. only at a much smaller batch) gets one plain step before drafting is
  preferred there, since extrapolating from a small batch overstates a plain step's cost; then at most every
  `explore_every`-th decision, and only while exploration's cost beyond the best plan's steps (the catch-ups it
  causes included) stays within `explore_share` of the recent measured time (a refusal stands for `recheck_every`
  decisions), it tries another plan: decoding plain, the best drafted plan (where no chain ran at that batch size,
  the shortest: the cheapest probe); drafting, in turn the next plan above the best (by tokens verified), the one
  below, and plain. "Recent": both sums decay with a half-life of `explore_window_s` seconds of steps, so that the
  headroom a long stretch of cheap exploration leaves (one request in flight: its neighbours cost little more than
  the best plan) is not spent in a burst when the load rises and every exploration means a catch-up of the whole batch.
  Decoding plain, each exploration in a row after which every drafted plan is still worth less than plain decoding
  at that batch size (margin aside) doubles the decisions until the next one there and at every larger batch size
  (up to 16x explore_every; more rows make drafting no cheaper): a loaded server that drafting does not pay for
  re-checks it ever more rarely, instead of spending explore_share on it for good.

The choice never changes what is generated (every plan's verification is lossless), only how fast.
`FixedBlockSize` pins the plan (the switch), e.g. 1 for the plain-decoding baseline.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Protocol, Sequence

from dflash_trt.decoding.step.tree_budget import check_tree_budget
from dflash_trt.errors import DFlashError


@dataclass(frozen=True)
class StepPlan:
    """What one step verifies per sequence: a block of `block_size` tokens (1: plain decoding, no draft), as
    the chain (tree_budget 0), as a tree of `tree_budget` draft nodes no deeper than block_size - 1, or with
    the scheduler's own verification method (tree_budget None: what a pinned policy leaves to the caller)."""

    block_size: int
    tree_budget: int | None = 0

    @property
    def verified_tokens(self) -> int:
        """New KV slots a sequence writes in the step (a tree: its nodes and the root)."""
        return self.tree_budget + 1 if self.tree_budget and self.block_size > 1 else self.block_size

    def with_block_size(self, block_size: int) -> "StepPlan":
        return StepPlan(block_size, self.tree_budget)


PLAIN = StepPlan(1)


class BlockSizePolicy(Protocol):
    max_block_size: int
    tree_budgets: list[int]  # the tree budgets it may choose (none: chains only); the scheduler reserves KV for them

    def choose(self, batch_size: int, *, catch_up_rows: int = 0, observed: bool = True) -> StepPlan:
        """The plan of the next step of a batch of `batch_size` rows. catch_up_rows: context rows the drafter would
        first have to take in (rows x the longest backlog) if the step drafted; observed False: the step is not
        going to be observed (a newcomer group's first step, chosen for the batch it joins): no exploration."""

    def observe(self, batch_size: int, plan: StepPlan, seconds: float, accepted: Sequence[int]) -> None: ...

    def observe_catch_up(self, rows: int, seconds: float) -> None:
        """The drafter took in a backlog of `rows` context rows before a drafted step, in `seconds`."""

    def observe_overhead(self, batch_size: int, seconds: float) -> None:
        """Between two decoding steps of a batch of `batch_size` rows, `seconds` passed outside them (the caller
        handling a step's outputs, the scheduler's bookkeeping): paid once per step, whatever the plan."""


class FixedBlockSize:
    """Every step verifies the same block size, with the scheduler's method (or a pinned tree budget)."""

    def __init__(self, block_size: int, tree_budget: int | None = None):
        if block_size < 1:
            raise DFlashError(f"block_size must be >= 1, got {block_size}")
        check_tree_budget(tree_budget or 0)
        self.max_block_size = block_size
        self.tree_budgets = [tree_budget] if tree_budget else []
        self.plan = StepPlan(block_size, tree_budget)

    def choose(self, batch_size: int, *, catch_up_rows: int = 0, observed: bool = True) -> StepPlan:
        return self.plan

    def observe(self, batch_size: int, plan: StepPlan, seconds: float, accepted: Sequence[int]) -> None:
        pass

    def observe_catch_up(self, rows: int, seconds: float) -> None:
        pass

    def observe_overhead(self, batch_size: int, seconds: float) -> None:
        pass


def tree_budget_ladder(max_budget: int, block_size: int) -> list[int]:
    """The tree budgets an adaptive policy may choose under a cap of `max_budget` nodes: the powers of two
    above the chain's block - 1 drafts, and the cap itself (none for a cap of 0)."""
    if max_budget <= 0:
        return []
    ladder = {max_budget}
    budget = 1
    while budget < max_budget:
        if budget > block_size - 1:
            ladder.add(budget)
        budget *= 2
    return sorted(ladder)


class AcceptanceEstimate:
    """Per-position acceptance rates of the drafter, from (block size, accepted drafts) observations."""

    def __init__(self, max_block_size: int, prior_rate: float = 0.7, prior_weight: float = 2.0,
                 decay: float = 0.995):
        self.decay = decay
        self.trials = [prior_weight] * max_block_size  # index k: draft position k (1-based; 0 unused)
        self.hits = [prior_weight * prior_rate] * max_block_size

    def observe(self, block_size: int, accepted: Sequence[int]) -> None:
        self.trials = [t * self.decay for t in self.trials]
        self.hits = [h * self.decay for h in self.hits]
        for a in accepted:
            for k in range(1, min(a + 1, block_size - 1) + 1):  # positions 1..a accepted, a + 1 rejected
                self.trials[k] += 1
                self.hits[k] += 1 if k <= a else 0

    def tokens(self, block_size: int) -> float:
        """Expected tokens committed per sequence by one step of `block_size`."""
        expected, survive = 1.0, 1.0
        for k in range(1, block_size):
            survive *= self.hits[k] / self.trials[k]
            expected += survive
        return expected


class StepCosts:
    """Moving averages of step seconds per verified-token count n, for one mode (plain or drafted).

    An observation counts at most `outlier_ratio` times the average so far: a step that a garbage collection, a
    cache that grew inside it or another process on the core made several times slower would otherwise stand for
    that step size for many steps (a plain step's cost at 3-4x made drafting look cheap until plain was measured
    again, which the policy then rarely did). A real change of cost still moves the average, by at most
    smoothing * (outlier_ratio - 1) per step."""

    def __init__(self, smoothing: float = 0.3, outlier_ratio: float = 2.0):
        self.smoothing, self.outlier_ratio = smoothing, outlier_ratio
        self.seconds: dict[int, float] = {}
        self.counts: Counter[int] = Counter()

    def observe(self, n: int, seconds: float) -> None:
        """Fold in one step's seconds: the plain mean of the first 1 / smoothing observations (a first step that
        was slow for its own reasons weighs 1 / count, not for long), a moving average after them."""
        self.counts[n] += 1
        old = self.seconds.get(n)
        if old is None:
            self.seconds[n] = seconds
        else:
            weight = max(self.smoothing, 1.0 / self.counts[n])
            self.seconds[n] = old + weight * (min(seconds, self.outlier_ratio * old) - old)

    def __bool__(self) -> bool:
        return bool(self.seconds)

    def measured_near(self, n: int, tolerance: float = 0.25) -> bool:
        """Whether a step of about n tokens (within `tolerance` of n) was measured."""
        return any(abs(m - n) <= tolerance * n for m in self.seconds)

    def estimate(self, n: int) -> float:
        return _interpolated(self.seconds, n)


def _interpolated(seconds: dict[int, float], n: int) -> float:
    """Seconds of a step of n tokens from those measured at other counts: the line between the nearest measured
    counts around n; beyond them, the line through the nearest two (one point: proportional above it, flat below)."""
    if n in seconds:
        return seconds[n]
    below = sorted(m for m in seconds if m < n)
    above = sorted(m for m in seconds if m > n)

    def line(a: int, b: int) -> float:
        return seconds[a] + max((seconds[b] - seconds[a]) / (b - a), 0.0) * (n - a)

    if below and above:
        return line(below[-1], above[0])
    points = below[-2:] if below else above[:2]
    if len(points) == 1:
        m = points[0]
        return seconds[m] * n / m if n > m else seconds[m]
    return max(line(points[0], points[1]), min(seconds[m] for m in points) * 0.5)


class PlainStepCosts(StepCosts):
    """StepCosts of plain steps per batch size, read through two facts of a batched forward: a step of more rows
    costs no less, and no more per row. Each measured size's figure is bounded by its neighbours' (at most the next
    smaller size's per row, then at most the next larger size's), and so is an estimate between or beyond them. One
    slow step at a batch size seen rarely (a cache that grew inside it, another process on the core) would otherwise
    stand for that size and for the sizes around it: a step of 9 rows at 60 ms, where 8 rows took 9 ms and 16 rows 19
    ms, made plain steps of 10-15 rows look three times dearer than they were, and the policy drafted there at a loss.
    Both bounds can only lower plain decoding's estimate, which errs towards decoding plain.

    Its moving average is slower than a drafted plan's (smoothing 0.1, against 0.3): on a loaded server plain steps
    come every step, and a plain step's cost moves with the batch's context lengths and the machine's other work by
    tens of percent over a few steps. With 0.3 such a streak froze a high figure once the policy switched to drafting
    (plain is then measured again only when it explores): at 4 requests in flight in process, chains of 2 ran for up
    to 8% of the steps at 0.78x of a plain step's tokens per second."""

    def __init__(self, smoothing: float = 0.1, outlier_ratio: float = 2.0):
        super().__init__(smoothing, outlier_ratio)
        self._consistent: dict[int, float] | None = None  # the bounded figures, as of the last observation

    def observe(self, n: int, seconds: float) -> None:
        super().observe(n, seconds)
        self._consistent = None

    def consistent(self) -> dict[int, float]:
        """The measured figures per batch size, each bounded by its neighbours' (see the class docstring)."""
        if self._consistent is None:
            sizes = sorted(self.seconds)
            table = dict(self.seconds)
            for smaller, size in zip(sizes, sizes[1:]):
                table[size] = min(table[size], table[smaller] * size / smaller)
            for size, larger in reversed(list(zip(sizes, sizes[1:]))):
                table[size] = min(table[size], table[larger])
            self._consistent = table
        return self._consistent

    def estimate(self, n: int) -> float:
        table = self.consistent()
        below = [m for m in table if m < n]
        own = _interpolated(table, n)
        return min(own, table[max(below)] * n / max(below)) if below else own


class BatchStepCosts:
    """Moving averages of drafted step seconds per (batch size, tokens verified per sequence), for one mode (chains
    or trees).

    Drafted steps at a batch size are measured rarely when plain decoding wins there, so what an unmeasured batch
    size costs must not come out optimistic (the policy would draft where it does not pay). At a measured batch size,
    the estimate is StepCosts over the tokens per sequence. Elsewhere it is the tightest of two upper bounds from the
    nearest measured batch sizes at the same tokens per sequence: a larger batch B' costs no less, cost(B'); a
    smaller one B' at most scales, cost(B') * B / B' (no gain from batching assumed). Never interpolated across
    batch sizes by token count, which is what made a step of 16 rows x 2 tokens look as cheap as one of 4 x 8.
    (At a measured batch size but an unmeasured token count, the smallest of its own estimate and those bounds.)"""

    def __init__(self, smoothing: float = 0.3):
        self.smoothing = smoothing
        self.by_batch: dict[int, StepCosts] = {}

    def observe(self, batch_size: int, per_row: int, seconds: float) -> None:
        self.by_batch.setdefault(batch_size, StepCosts(self.smoothing)).observe(per_row, seconds)

    def __bool__(self) -> bool:
        return bool(self.by_batch)

    def estimate(self, batch_size: int, per_row: int) -> float:
        own = self.by_batch.get(batch_size)
        if own is not None and per_row in own.seconds:
            return own.seconds[per_row]
        below = [b for b in self.by_batch if b < batch_size]
        above = [b for b in self.by_batch if b > batch_size]
        bounds = [own.estimate(per_row)] if own is not None else []
        if below:
            nearest = max(below)
            bounds.append(self.by_batch[nearest].estimate(per_row) * batch_size / nearest)
        if above:
            bounds.append(self.by_batch[min(above)].estimate(per_row))
        return min(bounds)


class CatchUpCost:
    """Seconds of the drafter taking in a backlog of context rows: StepCosts over the row count (a draft call has a
    fixed part, so neither a per-row rate nor one size stands for all), rows bucketed by half octaves."""

    def __init__(self, smoothing: float = 0.5):
        self.costs = StepCosts(smoothing)

    @staticmethod
    def bucket(rows: int) -> int:
        return max(1, round(2 ** (round(2 * math.log2(rows)) / 2)))

    def observe(self, rows: int, seconds: float) -> None:
        if rows > 0:
            key = self.bucket(rows)
            self.costs.observe(key, seconds * key / rows)

    def estimate(self, rows: int) -> float:
        """Seconds to take in `rows` (0 before any catch-up was measured)."""
        return self.costs.estimate(rows) if self.costs and rows > 0 else 0.0


class DraftingRuns:
    """How many drafted steps in a row followed a catch-up (a moving average over the runs so far): what a catch-up
    is spread over. Served at 4 in flight the batch drops to 3 rows for a step or two whenever a request finishes,
    drafting pays a little at 3 rows, and the batch is back at 4 (plain) before a catch-up spread over 16 drafted
    steps has paid for itself: the whole catch-up is the price of those one or two steps."""

    def __init__(self, longest: int, smoothing: float = 0.25):
        self.longest, self.smoothing = longest, smoothing
        self.mean: float | None = None
        self._current: int | None = None  # drafted steps since the last catch-up, while drafting goes on

    def caught_up(self) -> None:
        """The drafter took in a backlog: a new run starts (the one under way, if any, ends)."""
        self.ended()
        self._current = 0

    def drafted(self) -> None:
        if self._current is not None:
            self._current += 1

    def ended(self) -> None:
        """A plain step: the run under way ends (a catch-up that only bounded the backlog started none)."""
        if self._current:
            length = min(self._current, self.longest)
            self.mean = length if self.mean is None else self.mean + self.smoothing * (length - self.mean)
        self._current = None

    def steps(self) -> float:
        """Drafted steps a catch-up is spread over: the mean run so far (1 to `longest`); `longest` before any."""
        return self.longest if self.mean is None else min(max(self.mean, 1.0), self.longest)


class TreeTokens:
    """Mean tokens committed per sequence by one tree budget's steps, older steps weighing less."""

    def __init__(self, decay: float = 0.98):
        self.decay, self.total, self.weight = decay, 0.0, 0.0

    def observe(self, accepted: Sequence[int]) -> None:
        self.total = self.total * self.decay + sum(a + 1 for a in accepted)
        self.weight = self.weight * self.decay + len(accepted)

    @property
    def mean(self) -> float:
        return self.total / self.weight if self.weight else 0.0


# (plan, expected tokens, measured step seconds or None, short-chain line or None): AdaptiveBlockSize's cached
# estimate of one drafted plan at one batch size.
DraftedEstimate = tuple[StepPlan, float, float | None, tuple[float, float] | None]


def _bounded(seconds: float, line: tuple[float, float] | None, plain: float | None) -> float:
    """A chain's measured seconds, at most the short-chain line from a plain step of `plain` seconds
    (AdaptiveBlockSize._short_chain_line)."""
    if line is None or plain is None:
        return seconds
    shortest_seconds, fraction = line
    return min(seconds, plain + max(shortest_seconds - plain, 0.0) * fraction)


class AdaptiveBlockSize:
    """The plan of every step from measured step costs and acceptance (see the module docstring)."""

    def __init__(self, max_block_size: int, explore_every: int = 50, sizes: Sequence[int] | None = None,
                 tree_budgets: Sequence[int] = (), explore_share: float = 0.01, catch_up_horizon: int = 16,
                 draft_margin: float = 1.1, explore_window_s: float = 30.0, recheck_every: int = 8):
        """sizes: the block sizes a step may use (default 1..max_block_size; a drafter exported for one
        block size allows only 1 and that one); tree_budgets: the tree budgets it may choose besides chains
        (tree_budget_ladder; none: chains only); explore_share: the largest share of the measured time that
        exploration (its steps and the catch-ups they cause) may take of the recent time (explore_window_s: the
        half-life of "recent", in seconds of observed steps); catch_up_horizon: the most drafted steps a
        catch-up is spread over when drafting resumes on its merits (fewer where drafting after catch-ups lasted
        fewer, DraftingRuns); draft_margin: how much more a drafted plan's value
        must be than plain decoding's for it to be chosen (drafting costs more than its steps show: newcomers' prompts
        through the drafter, catch-ups when switching; and near a tie the noise of rarely measured steps would
        otherwise decide); recheck_every: while plain decoding is the best plan at a batch size, how many decisions
        it stands there before it is worked out again (_best_plan; 1: every decision)."""
        if max_block_size < 1:
            raise DFlashError(f"block_size must be >= 1, got {max_block_size}")
        self.max_block_size, self.explore_every = max_block_size, explore_every
        self.explore_share, self.catch_up_horizon, self.draft_margin = explore_share, catch_up_horizon, draft_margin
        self.explore_window_s, self.recheck_every = explore_window_s, recheck_every
        self.sizes = sorted(set(sizes)) if sizes else list(range(1, max_block_size + 1))
        self.tree_budgets = sorted({check_tree_budget(b) for b in tree_budgets} - {0}) if max_block_size > 1 else []
        # Every plan it may choose, ordered by tokens verified per sequence (exploration takes neighbours).
        chains = [StepPlan(size) for size in self.sizes]
        trees = [StepPlan(max_block_size, budget) for budget in self.tree_budgets]
        self.plans = sorted(chains + trees, key=lambda plan: (plan.verified_tokens, plan.tree_budget))
        self.acceptance = AcceptanceEstimate(max(max_block_size, 2))
        self.plain, self.drafted, self.trees = PlainStepCosts(), BatchStepCosts(), BatchStepCosts()
        self.catch_up = CatchUpCost()
        self.drafting_runs = DraftingRuns(catch_up_horizon)
        self.overhead = StepCosts(smoothing=0.1)  # seconds between two decoding steps outside them, per batch size
        self.tree_tokens: dict[int, TreeTokens] = {}
        self.decisions = 0
        self.explorations = 0
        self.last_explored = 0  # the decision that last explored
        self.seconds = 0.0  # every observed step and catch-up, decayed (_account)
        self.explore_seconds = 0.0  # what exploration steps and the catch-ups they caused cost beyond the best plan
        self._exploring: StepPlan | None = None  # the plan of the exploration step under way
        self._exploring_from_plain = False  # ... chosen while plain decoding was the best plan
        # Per batch size: explorations from plain in a row after which drafting still lost there (_confirmed_losing).
        self._plain_confirmed: Counter[int] = Counter()
        self._baseline = 0.0  # what the step it replaced (the best plan's) would have cost
        self.steps_run: Counter[StepPlan] = Counter()  # steps observed per plan (reports show the mix)
        # (expected tokens, step seconds before any catch-up and before the short-chain bound, that bound's line) of
        # every drafted plan, per batch size, as of the drafted steps observed so far: plain steps change none of
        # them (the bound's plain end is applied when values are taken), so a loaded server deciding to stay plain
        # does not re-estimate every drafted plan at every step.
        self._drafted_version = 0
        self._drafted_cache: dict[int, tuple[int, list[DraftedEstimate]]] = {}
        self._catch_ups = 0  # catch-ups observed (each changes what drafting after a backlog costs)
        # Per batch size where plain decoding was the best plan: (the drafted evidence it was worked out from, the
        # backlog then, the decision until which it stands), _best_plan.
        self._plain_held: dict[int, tuple[tuple[int, int], int, int]] = {}
        self._explore_refused_until = 0  # the decision before which an exploration is not considered again

    def cost(self, batch_size: int, plan: StepPlan, catch_up_rows: int = 0) -> float | None:
        """Seconds one step of `plan` adds to the batch's time: the step's own (_step_seconds) and the overhead
        every step carries outside it."""
        seconds = self._step_seconds(batch_size, plan, catch_up_rows)
        return None if seconds is None else seconds + self._overhead(batch_size)

    def _step_seconds(self, batch_size: int, plan: StepPlan, catch_up_rows: int = 0) -> float | None:
        """Seconds of the step itself; a drafted one after a backlog of catch_up_rows context rows carries its share
        of taking them in (the catch-up spread over the drafted steps a catch-up has bought so far, DraftingRuns)."""
        if plan.block_size == 1:
            return self._plain_cost(batch_size)
        seconds = self._drafted_seconds(batch_size, plan)
        if seconds is None:
            return None
        return seconds + self.catch_up.estimate(catch_up_rows) / self.drafting_runs.steps()

    def _overhead(self, batch_size: int) -> float:
        """Seconds between two decoding steps outside them (0 before any was measured): a step that commits more
        tokens per row pays it fewer times per token, which the step's own time leaves out. Served, the outputs of
        each step are streamed to their clients between steps (on the demo pair at one request in flight a served
        token takes ~5 ms, the plain step in it ~3.6 ms), and a policy blind to that rated a chain that pays there
        as a tie with plain decoding."""
        return self.overhead.estimate(batch_size) if self.overhead else 0.0

    def _drafted_seconds(self, batch_size: int, plan: StepPlan) -> float | None:
        """A drafted step's seconds before any catch-up (trees costed as chains until a tree ran); None before any
        drafted step ran."""
        seconds = self._measured_drafted_seconds(batch_size, plan)
        if seconds is None:
            return None
        return _bounded(seconds, self._short_chain_line(batch_size, plan), self._plain_cost(batch_size))

    def _measured_drafted_seconds(self, batch_size: int, plan: StepPlan) -> float | None:
        """The drafted step costs' estimate for `plan` (BatchStepCosts), before the short-chain bound."""
        costs = self.trees if plan.tree_budget and self.trees else self.drafted
        return costs.estimate(batch_size, plan.verified_tokens) if costs else None

    def _short_chain_line(self, batch_size: int, plan: StepPlan) -> tuple[float, float] | None:
        """A chain shorter than every chain measured at this batch size costs at most the line from a plain step
        (one token) to the shortest measured chain: (that chain's seconds, (S - 1) / (its length - 1)) for a chain
        of S, or None where the bound does not apply. Below its measured sizes StepCosts is flat, an upper bound: a
        policy that measured only long chains (its first step and explorations draft the longest) would rate every
        shorter chain as dear as those and never try one, even where a short chain pays and a long one does not.
        The line leaves out the draft call's fixed cost, so it errs low, and the steps it leads to measure the
        chain."""
        own = self.drafted.by_batch.get(batch_size)
        if plan.tree_budget or own is None or any(m <= plan.block_size for m in own.seconds):
            return None
        shortest = min(own.seconds)
        return own.seconds[shortest], (plan.block_size - 1) / (shortest - 1)

    def _plain_cost(self, batch_size: int) -> float | None:
        """Seconds of a plain step of `batch_size` rows (PlainStepCosts); None before any plain step ran."""
        return self.plain.estimate(batch_size) if self.plain else None

    def tokens(self, plan: StepPlan) -> float:
        """Expected tokens committed per sequence by one step of `plan`."""
        if plan.tree_budget and plan.block_size > 1:
            measured = self.tree_tokens.get(plan.tree_budget)
            spine = min(plan.block_size, plan.tree_budget + 1)
            return measured.mean if measured is not None else self.acceptance.tokens(spine)
        return self.acceptance.tokens(plan.block_size)

    def value(self, batch_size: int, plan: StepPlan, catch_up_rows: int = 0) -> float | None:
        """Expected committed tokens per second per sequence; None before any step of that mode ran."""
        cost = self.cost(batch_size, plan, catch_up_rows)
        return None if cost is None else self.tokens(plan) / max(cost, 1e-9)

    def _drafted_estimates(self, batch_size: int) -> list[DraftedEstimate]:
        """(plan, tokens, measured step seconds without catch-up or None, short-chain line or None) of every drafted
        plan at `batch_size`."""
        cached = self._drafted_cache.get(batch_size)
        if cached is None or cached[0] != self._drafted_version:
            estimates = [(plan, self.tokens(plan), self._measured_drafted_seconds(batch_size, plan),
                          self._short_chain_line(batch_size, plan)) for plan in self.plans if plan.block_size > 1]
            cached = self._drafted_cache[batch_size] = (self._drafted_version, estimates)
        return cached[1]

    def _values(self, batch_size: int, catch_up_rows: int = 0) -> dict[StepPlan, float]:
        """value() of every plan whose mode ran (the same figures, from the cached drafted estimates)."""
        values = {}
        plain, overhead = self._plain_cost(batch_size), self._overhead(batch_size)
        if 1 in self.sizes and plain is not None:
            values[PLAIN] = 1.0 / max(plain + overhead, 1e-9)
        catch_up = self.catch_up.estimate(catch_up_rows) / self.drafting_runs.steps()
        for plan, tokens, seconds, line in self._drafted_estimates(batch_size):
            if seconds is not None:
                values[plan] = tokens / max(_bounded(seconds, line, plain) + catch_up + overhead, 1e-9)
        return values

    def best(self, batch_size: int, catch_up_rows: int = 0) -> StepPlan:
        """The plan of the highest value; a drafted one only if it beats plain decoding by draft_margin."""
        known = self._values(batch_size, catch_up_rows)
        if not known:
            return StepPlan(self.max_block_size)
        best = max(known, key=lambda plan: (known[plan], -plan.verified_tokens))
        if best.block_size > 1 and PLAIN in known and known[best] < self.draft_margin * known[PLAIN]:
            return PLAIN
        return best

    def choose(self, batch_size: int, *, catch_up_rows: int = 0, observed: bool = True) -> StepPlan:
        if self.max_block_size == 1:
            return PLAIN
        if not observed:  # a newcomer group's first step: what the batch it joins would run next, nothing measured
            if not self.drafted:
                return StepPlan(self.max_block_size)
            return self.best(batch_size, catch_up_rows) if self.plain else PLAIN
        self.decisions += 1
        self._exploring = None
        if not self.drafted:
            return StepPlan(self.max_block_size)
        if not self.plain:
            return PLAIN
        for budget in self.tree_budgets:
            if budget not in self.tree_tokens:
                return StepPlan(self.max_block_size, budget)  # each tree budget's acceptance measured once
        best = self._best_plan(batch_size, catch_up_rows)
        if best.block_size > 1 and 1 in self.sizes and not self.plain.measured_near(batch_size):
            return PLAIN  # plain decoding's cost at this batch size is a guess: measure it before drafting wins
        if self.decisions - self.last_explored < self._explore_interval(batch_size, best):
            return best  # (checked first: choosing the plan to explore costs more than the choice itself)
        if self.decisions < self._explore_refused_until:
            return best
        neighbour = self._neighbour(best, batch_size, catch_up_rows)
        if neighbour is not None and self._may_explore(batch_size, neighbour, best, catch_up_rows):
            self.explorations += 1
            self.last_explored = self.decisions
            self._exploring, self._baseline = neighbour, self._step_seconds(batch_size, best) or 0.0
            self._exploring_from_plain = best.block_size == 1
            return neighbour
        # Refused (the budget is spent, or there is nothing to explore): asked again only after recheck_every
        # decisions. Once the interval has passed, a loaded server whose budget a long catch-up used up would
        # otherwise work out the neighbour and its cost at every step until the budget recovers.
        self._explore_refused_until = self.decisions + self.recheck_every
        return best

    def _best_plan(self, batch_size: int, catch_up_rows: int) -> StepPlan:
        """best(), except that plain decoding, once best at a batch size, stands there for recheck_every decisions
        unless a drafted step or a catch-up was observed since or the backlog shrank: only plain decoding's own cost
        moves in between, a few percent per step, and working the best plan out costs ~0.1 ms of Python, 0.5% of a
        plain step at 4 rows on the demo pair, on every step of a loaded server that stays plain."""
        evidence = (self._drafted_version, self._catch_ups)
        held = self._plain_held.get(batch_size)
        if held is not None and held[0] == evidence and catch_up_rows >= held[1] and self.decisions < held[2]:
            return PLAIN
        best = self.best(batch_size, catch_up_rows)
        if best == PLAIN:
            self._plain_held[batch_size] = (evidence, catch_up_rows, self.decisions + self.recheck_every)
        else:
            self._plain_held.pop(batch_size, None)
        return best

    def _explore_interval(self, batch_size: int, best: StepPlan) -> int:
        """Decisions between explorations: explore_every, doubled, decoding plain, for each exploration in a row at
        this batch size or a smaller one after which drafting still lost (_confirmed_losing; at most 16x): a batch
        whose size moves as requests leave and join would otherwise explore at each size in turn."""
        if best.block_size > 1:
            return self.explore_every
        return self.explore_every << min(self._confirmed_losing(batch_size), 4)

    def _neighbour(self, best: StepPlan, batch_size: int, catch_up_rows: int) -> StepPlan | None:
        """The plan to explore instead of `best`. Decoding plain: the best drafted plan (whether drafting pays again
        is the question, and the plan it would resume with is the one whose estimate matters), or the shortest chain
        where none ran at this batch size. Drafting: in turn the plan next above `best` by tokens verified, the one next
        below, and plain decoding."""
        if len(self.plans) < 2:
            return None
        if best.block_size == 1:
            drafted = [plan for plan in self.plans if plan.block_size > 1]
            if batch_size not in self.drafted.by_batch:
                # No chain ran at this batch size: every drafted cost is a bound from other sizes, the same for chains
                # of any length (BatchStepCosts), so the longest would look best, and probing it is the dearest step:
                # at 16 rows on the demo pair a chain of 8 took 237 ms, seven plain steps. The shortest chain is the
                # cheapest probe; once a chain ran there, explorations go by value again.
                return min(drafted, key=lambda plan: (plan.verified_tokens, plan.tree_budget))
            values = self._values(batch_size, catch_up_rows)
            return max(drafted, key=lambda plan: (values.get(plan, 0.0), -plan.verified_tokens))
        turn = self.explorations % 3
        if turn == 2 and PLAIN in self.plans:
            return PLAIN
        index, step = self.plans.index(best), 1 if turn == 0 else -1
        return self.plans[index + step if 0 <= index + step < len(self.plans) else index - step]

    def _may_explore(self, batch_size: int, plan: StepPlan, best: StepPlan, catch_up_rows: int) -> bool:
        """Whether exploring `plan` now keeps what exploring costs beyond the best plan's steps (the catch-ups that
        drafting after plain steps needs included) within explore_share of the recent measured time (_account). The
        wait between explorations (_explore_interval) is checked before, in choose()."""
        excess = max((self.cost(batch_size, plan) or 0.0) - (self.cost(batch_size, best) or 0.0), 0.0)
        if plan.block_size > 1:
            excess += self.catch_up.estimate(catch_up_rows)
        return self.explore_seconds + excess <= self.explore_share * (self.seconds + excess)

    def observe_overhead(self, batch_size: int, seconds: float) -> None:
        self.overhead.observe(batch_size, seconds)

    def _account(self, seconds: float, explored: float) -> None:
        """Add a step's (or a catch-up's) seconds to the recent time and what exploring cost of them to the recent
        exploration time (the budget of _may_explore); both decay with a half-life of explore_window_s."""
        keep = 0.5 ** (seconds / self.explore_window_s)
        self.seconds = self.seconds * keep + seconds
        self.explore_seconds = self.explore_seconds * keep + explored

    def observe_catch_up(self, rows: int, seconds: float) -> None:
        self.catch_up.observe(rows, seconds)
        self._catch_ups += 1
        self.drafting_runs.caught_up()
        self._account(seconds, seconds if self._exploring is not None else 0.0)

    def observe(self, batch_size: int, plan: StepPlan, seconds: float, accepted: Sequence[int]) -> None:
        self.steps_run[plan] += 1
        if plan.block_size > 1:
            self.drafting_runs.drafted()
        else:
            self.drafting_runs.ended()
        explored_from_plain = self._exploring is not None and self._exploring_from_plain
        self._account(seconds, max(seconds - self._baseline, 0.0) if self._exploring is not None else 0.0)
        self._exploring = None
        self._learn(batch_size, plan, seconds, accepted)
        if explored_from_plain:
            if self._drafting_loses(batch_size):
                self._plain_confirmed[batch_size] = self._confirmed_losing(batch_size) + 1
            else:  # drafting holds its own at this batch size, so at the smaller ones too
                for size in [size for size in self._plain_confirmed if size <= batch_size]:
                    del self._plain_confirmed[size]

    def _confirmed_losing(self, batch_size: int) -> int:
        """Explorations in a row after which drafting still lost, at this batch size or a smaller one (each row costs a
        loaded target's step as much, so drafting that loses at 13 rows loses at 16)."""
        return max((count for size, count in self._plain_confirmed.items() if size <= batch_size), default=0)

    def _drafting_loses(self, batch_size: int) -> bool:
        """Whether every drafted plan's value at `batch_size` is below plain decoding's, margin aside (near the margin
        a few steps' acceptance can tip it, and exploring keeps its pace)."""
        values = self._values(batch_size)
        plain = values.pop(PLAIN, None)
        return plain is not None and all(value < plain for value in values.values())

    def _learn(self, batch_size: int, plan: StepPlan, seconds: float, accepted: Sequence[int]) -> None:
        """Fold one step into the costs and acceptance of its mode."""
        if plan.block_size == 1:
            self.plain.observe(batch_size, seconds)
            return
        self._drafted_version += 1
        if plan.tree_budget:
            self.trees.observe(batch_size, plan.verified_tokens, seconds)
            self.tree_tokens.setdefault(plan.tree_budget, TreeTokens()).observe(accepted)
        else:
            self.drafted.observe(batch_size, plan.block_size, seconds)
            self.acceptance.observe(plan.block_size, accepted)


def make_policy(name: str, max_block_size: int, sizes: Sequence[int] | None = None, max_tree_budget: int = 0
                ) -> BlockSizePolicy:
    """'adaptive' (the default of serving; over `sizes`, and trees up to `max_tree_budget` nodes) or 'fixed'
    (always max_block_size, as a tree of max_tree_budget nodes when that is > 0)."""
    check_tree_budget(max_tree_budget)
    if name == "adaptive":
        return AdaptiveBlockSize(max_block_size, sizes=sizes,
                                 tree_budgets=tree_budget_ladder(max_tree_budget, max_block_size))
    if name == "fixed":
        return FixedBlockSize(max_block_size, max_tree_budget)
    raise DFlashError(f"block_policy must be 'adaptive' or 'fixed', got {name!r}")
