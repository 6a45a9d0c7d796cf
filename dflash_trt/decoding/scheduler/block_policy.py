"""How many tokens each decoding step verifies per sequence: the block-size policy.

Drafting pays when verifying S tokens per sequence costs little more than verifying one, which holds
for a small batch and stops holding once the target's forward is compute bound (a large batch on a
CPU, or a full GPU). `AdaptiveBlockSize` picks, before every step, the block size S in 1..max that
maximizes expected committed tokens per second for the current batch size B:

    value(S) = tokens(S) / cost(B, S)

- tokens(S): expected tokens committed per sequence by a block of S = 1 + sum_{k<S} P(draft 1..k all
  accepted). The per-position acceptance rates are counted from the steps run so far (a position that a
  shorter block never verified is not counted as rejected), with a light prior so a fresh policy tries
  drafting, and older steps weigh less (the mix of requests changes).
- cost(B, S): the measured wall time of past steps, kept separately for plain steps (S = 1, no drafter
  call) and drafted steps, as a moving average per number of verified tokens n = B * S; a size not
  measured yet is interpolated between the nearest measured sizes (extrapolated linearly beyond them).
- exploration: the first step drafts, the second is plain (each mode measured once); a batch size whose
  plain cost is only extrapolated (no plain step measured within 25% of its token count, e.g. only at a
  much smaller batch) gets one plain step before drafting is preferred there, since extrapolating from a
  small batch overstates a plain step's cost; then every `explore_every`-th decision takes a neighbour of
  the best size, so estimates follow the load.

The choice never changes what is generated (verification is lossless at any block size), only how fast.
`FixedBlockSize` pins the block size (the switch), e.g. 1 for the plain-decoding baseline.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from dflash_trt.errors import DFlashError


class BlockSizePolicy(Protocol):
    max_block_size: int

    def choose(self, batch_size: int) -> int: ...

    def observe(self, batch_size: int, block_size: int, seconds: float, accepted: Sequence[int]) -> None: ...


class FixedBlockSize:
    """Every step verifies the same block size."""

    def __init__(self, block_size: int):
        if block_size < 1:
            raise DFlashError(f"block_size must be >= 1, got {block_size}")
        self.max_block_size = block_size

    def choose(self, batch_size: int) -> int:
        return self.max_block_size

    def observe(self, batch_size: int, block_size: int, seconds: float, accepted: Sequence[int]) -> None:
        pass


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


class AdaptiveBlockSize:
    """Block size per step from measured step costs and acceptance (see the module docstring)."""

    def __init__(self, max_block_size: int, explore_every: int = 50, sizes: Sequence[int] | None = None):
        """sizes: the block sizes a step may use (default 1..max_block_size; a drafter exported for one
        block size allows only 1 and that one)."""
        if max_block_size < 1:
            raise DFlashError(f"block_size must be >= 1, got {max_block_size}")
        self.max_block_size, self.explore_every = max_block_size, explore_every
        self.sizes = sorted(set(sizes)) if sizes else list(range(1, max_block_size + 1))
        self.acceptance = AcceptanceEstimate(max(max_block_size, 2))
        self.plain, self.drafted = StepCosts(), StepCosts()
        self.decisions = 0
        self._last_best = max_block_size

    def cost(self, batch_size: int, block_size: int) -> float | None:
        costs = self.plain if block_size == 1 else self.drafted
        return costs.estimate(batch_size * block_size) if costs else None

    def value(self, batch_size: int, block_size: int) -> float | None:
        """Expected committed tokens per second per sequence; None before any step of that mode ran."""
        cost = self.cost(batch_size, block_size)
        return None if cost is None else self.acceptance.tokens(block_size) / max(cost, 1e-9)

    def best(self, batch_size: int) -> int:
        values = {s: self.value(batch_size, s) for s in self.sizes}
        known = {s: v for s, v in values.items() if v is not None}
        return max(known, key=lambda s: (known[s], -s)) if known else self.max_block_size

    def choose(self, batch_size: int) -> int:
        if self.max_block_size == 1:
            return 1
        self.decisions += 1
        if not self.drafted:
            return self.max_block_size
        if not self.plain:
            return 1
        best = self.best(batch_size)
        if best > 1 and 1 in self.sizes and not self.plain.measured_near(batch_size):
            return 1  # plain decoding's cost at this batch size is a guess: measure it before drafting wins
        if self.decisions % self.explore_every == 0 and len(self.sizes) > 1:
            index, step = self.sizes.index(best), 1 if (self.decisions // self.explore_every) % 2 else -1
            neighbour = index + step if 0 <= index + step < len(self.sizes) else index - step
            return self.sizes[neighbour]
        return best

    def observe(self, batch_size: int, block_size: int, seconds: float, accepted: Sequence[int]) -> None:
        (self.plain if block_size == 1 else self.drafted).observe(batch_size * block_size, seconds)
        if block_size > 1:
            self.acceptance.observe(block_size, accepted)


def make_policy(name: str, max_block_size: int, sizes: Sequence[int] | None = None) -> BlockSizePolicy:
    """'adaptive' (the default of serving; over `sizes`) or 'fixed' (always max_block_size)."""
    if name == "adaptive":
        return AdaptiveBlockSize(max_block_size, sizes=sizes)
    if name == "fixed":
        return FixedBlockSize(max_block_size)
    raise DFlashError(f"block_policy must be 'adaptive' or 'fixed', got {name!r}")
