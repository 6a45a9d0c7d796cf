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
- cost(B, plan): the measured wall time of past steps, kept separately for plain steps (no drafter call),
  chain steps and tree steps, as a moving average per number of verified tokens n = B * (tokens verified per
  sequence: S for a chain, budget + 1 for a tree); a size not measured yet is interpolated between the nearest
  measured sizes (extrapolated linearly beyond them); a tree never measured is costed as a chain of as many
  tokens.
- exploration: the first step drafts a chain of max tokens, the second is plain, each tree budget then runs
  once (each mode measured once); a batch size whose plain cost is only extrapolated (no plain step measured
  within 25% of its token count, e.g. only at a much smaller batch) gets one plain step before drafting is
  preferred there, since extrapolating from a small batch overstates a plain step's cost; then every
  `explore_every`-th decision takes a neighbour of the best plan (by tokens verified), so estimates follow
  the load.

The choice never changes what is generated (every plan's verification is lossless), only how fast.
`FixedBlockSize` pins the plan (the switch), e.g. 1 for the plain-decoding baseline.
"""

from __future__ import annotations

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

    def choose(self, batch_size: int) -> StepPlan: ...

    def observe(self, batch_size: int, plan: StepPlan, seconds: float, accepted: Sequence[int]) -> None: ...


class FixedBlockSize:
    """Every step verifies the same block size, with the scheduler's method (or a pinned tree budget)."""

    def __init__(self, block_size: int, tree_budget: int | None = None):
        if block_size < 1:
            raise DFlashError(f"block_size must be >= 1, got {block_size}")
        check_tree_budget(tree_budget or 0)
        self.max_block_size = block_size
        self.tree_budgets = [tree_budget] if tree_budget else []
        self.plan = StepPlan(block_size, tree_budget)

    def choose(self, batch_size: int) -> StepPlan:
        return self.plan

    def observe(self, batch_size: int, plan: StepPlan, seconds: float, accepted: Sequence[int]) -> None:
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
    """Moving averages of step seconds per verified-token count n, for one mode (plain or drafted)."""

    def __init__(self, smoothing: float = 0.3):
        self.smoothing = smoothing
        self.seconds: dict[int, float] = {}

    def observe(self, n: int, seconds: float) -> None:
        old = self.seconds.get(n)
        self.seconds[n] = seconds if old is None else old + self.smoothing * (seconds - old)

    def __bool__(self) -> bool:
        return bool(self.seconds)

    def measured_near(self, n: int, tolerance: float = 0.25) -> bool:
        """Whether a step of about n tokens (within `tolerance` of n) was measured."""
        return any(abs(m - n) <= tolerance * n for m in self.seconds)

    def estimate(self, n: int) -> float:
        if n in self.seconds:
            return self.seconds[n]
        below = sorted(m for m in self.seconds if m < n)
        above = sorted(m for m in self.seconds if m > n)
        if below and above:
            return self._line(below[-1], above[0], n)
        points = below[-2:] if below else above[:2]
        if len(points) == 1:
            m = points[0]  # one point: cost proportional to tokens above it, flat below it
            return self.seconds[m] * n / m if n > m else self.seconds[m]
        return max(self._line(points[0], points[1], n), min(self.seconds[m] for m in points) * 0.5)

    def _line(self, a: int, b: int, n: int) -> float:
        slope = max((self.seconds[b] - self.seconds[a]) / (b - a), 0.0)
        return self.seconds[a] + slope * (n - a)


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


class AdaptiveBlockSize:
    """The plan of every step from measured step costs and acceptance (see the module docstring)."""

    def __init__(self, max_block_size: int, explore_every: int = 50, sizes: Sequence[int] | None = None,
                 tree_budgets: Sequence[int] = ()):
        """sizes: the block sizes a step may use (default 1..max_block_size; a drafter exported for one
        block size allows only 1 and that one); tree_budgets: the tree budgets it may choose besides chains
        (tree_budget_ladder; none: chains only)."""
        if max_block_size < 1:
            raise DFlashError(f"block_size must be >= 1, got {max_block_size}")
        self.max_block_size, self.explore_every = max_block_size, explore_every
        self.sizes = sorted(set(sizes)) if sizes else list(range(1, max_block_size + 1))
        self.tree_budgets = sorted({check_tree_budget(b) for b in tree_budgets} - {0}) if max_block_size > 1 else []
        # Every plan it may choose, ordered by tokens verified per sequence (exploration takes neighbours).
        chains = [StepPlan(size) for size in self.sizes]
        trees = [StepPlan(max_block_size, budget) for budget in self.tree_budgets]
        self.plans = sorted(chains + trees, key=lambda plan: (plan.verified_tokens, plan.tree_budget))
        self.acceptance = AcceptanceEstimate(max(max_block_size, 2))
        self.plain, self.drafted, self.trees = StepCosts(), StepCosts(), StepCosts()
        self.tree_tokens: dict[int, TreeTokens] = {}
        self.decisions = 0
        self.steps_run: Counter[StepPlan] = Counter()  # steps observed per plan (reports show the mix)

    def cost(self, batch_size: int, plan: StepPlan) -> float | None:
        if plan.block_size == 1:
            costs = self.plain
        else:
            costs = self.trees if plan.tree_budget and self.trees else self.drafted
        return costs.estimate(batch_size * plan.verified_tokens) if costs else None

    def tokens(self, plan: StepPlan) -> float:
        """Expected tokens committed per sequence by one step of `plan`."""
        if plan.tree_budget and plan.block_size > 1:
            measured = self.tree_tokens.get(plan.tree_budget)
            spine = min(plan.block_size, plan.tree_budget + 1)
            return measured.mean if measured is not None else self.acceptance.tokens(spine)
        return self.acceptance.tokens(plan.block_size)

    def value(self, batch_size: int, plan: StepPlan) -> float | None:
        """Expected committed tokens per second per sequence; None before any step of that mode ran."""
        cost = self.cost(batch_size, plan)
        return None if cost is None else self.tokens(plan) / max(cost, 1e-9)

    def best(self, batch_size: int) -> StepPlan:
        values = {plan: self.value(batch_size, plan) for plan in self.plans}
        known = {plan: v for plan, v in values.items() if v is not None}
        if not known:
            return StepPlan(self.max_block_size)
        return max(known, key=lambda plan: (known[plan], -plan.verified_tokens))

    def choose(self, batch_size: int) -> StepPlan:
        if self.max_block_size == 1:
            return PLAIN
        self.decisions += 1
        if not self.drafted:
            return StepPlan(self.max_block_size)
        if not self.plain:
            return PLAIN
        for budget in self.tree_budgets:
            if budget not in self.tree_tokens:
                return StepPlan(self.max_block_size, budget)  # each tree budget's acceptance measured once
        best = self.best(batch_size)
        if best.block_size > 1 and 1 in self.sizes and not self.plain.measured_near(batch_size):
            return PLAIN  # plain decoding's cost at this batch size is a guess: measure it before drafting wins
        if self.decisions % self.explore_every == 0 and len(self.plans) > 1:
            index, step = self.plans.index(best), 1 if (self.decisions // self.explore_every) % 2 else -1
            neighbour = index + step if 0 <= index + step < len(self.plans) else index - step
            return self.plans[neighbour]
        return best

    def observe(self, batch_size: int, plan: StepPlan, seconds: float, accepted: Sequence[int]) -> None:
        self.steps_run[plan] += 1
        if plan.block_size == 1:
            self.plain.observe(batch_size, seconds)
        elif plan.tree_budget:
            self.trees.observe(batch_size * plan.verified_tokens, seconds)
            self.tree_tokens.setdefault(plan.tree_budget, TreeTokens()).observe(accepted)
        else:
            self.drafted.observe(batch_size * plan.block_size, seconds)
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
