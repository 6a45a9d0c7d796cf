"""The block-size policy's decisions, driven by injected step costs and acceptance (no real timing)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from dflash_trt.decoding.scheduler.block_policy import (PLAIN, AcceptanceEstimate, AdaptiveBlockSize, BatchStepCosts,
                                                        FixedBlockSize, StepCosts, StepPlan, make_policy)
from dflash_trt.errors import DFlashError

MAX_BLOCK = 8


def _accepted(rate: float, block_size: int, rows: int, step: int) -> list[int]:
    """Accepted drafts per row: each draft position accepted with probability `rate` (seeded, iid)."""
    rng = random.Random(step)
    out = []
    for _row in range(rows):
        a = 0
        while a < block_size - 1 and rng.random() < rate:
            a += 1
        out.append(a)
    return out


def _run(policy, cost, batch_size: int, rate: float, steps: int = 400) -> list[int]:
    """The block sizes a policy chooses over `steps` chain steps with these costs and acceptance."""
    chosen = []
    for step in range(steps):
        plan = policy.choose(batch_size)
        size = plan.block_size
        _note_exploration(policy)
        policy.observe(batch_size, plan, cost(batch_size, size), _accepted(rate, size, batch_size, step))
        chosen.append(size)
    return chosen


def _note_exploration(policy) -> None:
    """Record, for _settled, whether the decision just taken was an exploration."""
    policy.explored_steps = getattr(policy, "explored_steps", []) + [policy.last_explored == policy.decisions]


def _settled(policy, chosen: list, start: int) -> list:
    """The choices from `start` on, exploration steps aside."""
    return [c for c, explored in zip(chosen[start:], policy.explored_steps[start:]) if not explored]


def gpu_like(batch_size, block_size):  # verification nearly free until many tokens: drafting pays
    n = batch_size * block_size
    return 0.010 + 0.00002 * n + (0.001 if block_size > 1 else 0.0)


def cpu_like(batch_size, block_size):  # every verified token costs: drafting stops paying as the batch grows
    n = batch_size * block_size
    return 0.002 + 0.0010 * n + (0.003 if block_size > 1 else 0.0)


def _true_value(cost, batch_size, block_size, rate):
    tokens = sum(rate ** k for k in range(block_size))
    return tokens / cost(batch_size, block_size)


@pytest.mark.parametrize("cost, batch_size, expected", [(gpu_like, 1, {8}), (gpu_like, 32, {8}),
                                                         (cpu_like, 1, None), (cpu_like, 32, {1})])
def test_policy_settles_on_the_fastest_block_size(cost, batch_size, expected):
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50)
    chosen = _run(policy, cost, batch_size, rate=0.8)
    settled = _settled(policy, chosen, 200)
    if expected is not None:  # (cpu_like at batch 1: plain and block 5 are within 1% of each other)
        assert set(settled) <= expected, sorted(set(settled))
    best = max(range(1, MAX_BLOCK + 1), key=lambda s: _true_value(cost, batch_size, s, 0.8))
    for size in set(settled):
        assert _true_value(cost, batch_size, size, 0.8) >= 0.97 * _true_value(cost, batch_size, best, 0.8)


def test_policy_goes_plain_when_drafts_are_never_accepted():
    chosen = _run(AdaptiveBlockSize(MAX_BLOCK), gpu_like, 1, rate=0.0)
    assert chosen[0] == MAX_BLOCK and chosen[-20:].count(1) >= 19  # one exploration step in 50


def saturating(batch_size, block_size):  # a GPU: flat until 32 tokens per step, then every token costs
    return 0.010 + 0.001 * max(0, batch_size * block_size - 32) + (0.002 if block_size > 1 else 0.0)


def test_policy_follows_the_batch_size_as_it_grows_and_shrinks():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=25)
    usual = lambda chosen: max(set(chosen[-20:]), key=chosen[-20:].count)  # noqa: E731
    small = _run(policy, saturating, 1, 0.8, steps=150)
    large = _run(policy, saturating, 32, 0.8, steps=150)
    small_again = _run(policy, saturating, 1, 0.8, steps=150)
    assert usual(small) == MAX_BLOCK and usual(large) == 1 and usual(small_again) == MAX_BLOCK


def test_plain_is_measured_at_a_new_batch_size_before_drafting_wins_there():
    """Served traffic: the first requests come alone (plain measured at batch 1 only), then the batch jumps to 32
    rows where plain decoding is the fastest. Extrapolated from batch 1, a plain step of 32 rows would look 32x
    dearer; the policy measures it within the first steps there and settles on plain."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50)
    _run(policy, cpu_like, 1, rate=0.8, steps=20)
    assert list(policy.plain.seconds) == [1]
    at_32 = _run(policy, cpu_like, 32, rate=0.8, steps=40)
    assert 1 in at_32[:3]
    assert at_32[-20:].count(1) >= 19  # one exploration step in 50
    # A batch size near one already measured needs no extra plain step.
    assert policy.plain.measured_near(30) and not policy.plain.measured_near(20)


def test_a_fresh_policy_drafts_first_then_measures_plain_once_batched():
    policy = AdaptiveBlockSize(MAX_BLOCK)
    assert policy.choose(4) == StepPlan(MAX_BLOCK)
    policy.observe(4, StepPlan(MAX_BLOCK), 0.05, [3, 3, 3, 3])
    assert policy.choose(4) == PLAIN  # plain never measured: try it
    policy.observe(4, PLAIN, 0.01, [0, 0, 0, 0])
    assert policy.value(4, PLAIN) == pytest.approx(1 / 0.01)


def test_acceptance_estimate_counts_positions_a_shorter_block_never_verified_as_unknown():
    estimate = AcceptanceEstimate(8, prior_weight=0.0 + 1e-9, decay=1.0)
    for _ in range(100):
        estimate.observe(2, [1])  # block 2: the one draft always accepted; positions 2.. never verified
    assert estimate.tokens(2) == pytest.approx(2.0)
    estimate.observe(8, [0])  # one full block rejected at position 1
    assert 1.9 < estimate.tokens(2) < 2.0


def test_step_costs_interpolate_and_extrapolate():
    costs = StepCosts(smoothing=1.0)
    costs.observe(10, 1.0)
    assert costs.estimate(20) == pytest.approx(2.0) and costs.estimate(5) == pytest.approx(1.0)
    costs.observe(30, 2.0)
    assert costs.estimate(20) == pytest.approx(1.5) and costs.estimate(50) == pytest.approx(3.0)


def test_fixed_policy_pins_the_block_size_and_names_are_checked():
    policy = make_policy("fixed", 4)
    assert isinstance(policy, FixedBlockSize) and {policy.choose(b) for b in (1, 16, 64)} == {StepPlan(4)}
    assert make_policy("fixed", 4, max_tree_budget=16).choose(1) == StepPlan(4, 16)
    assert isinstance(make_policy("adaptive", 4), AdaptiveBlockSize)
    with pytest.raises(DFlashError, match="block_policy"):
        make_policy("fastest", 4)


def test_policy_over_a_restricted_set_of_sizes_only_picks_those():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=10, sizes=[1, MAX_BLOCK])
    assert set(_run(policy, gpu_like, 4, 0.8, steps=100)) == {1, MAX_BLOCK}
    fresh = AdaptiveBlockSize(MAX_BLOCK, explore_every=1000, sizes=[1, MAX_BLOCK])
    assert set(_run(fresh, saturating, 32, 0.8, steps=50)[2:]) == {1}


# -- trees: the policy chooses plain, a chain or a tree of a budget per step -------------------------------------------
def _tree_tokens(plan: StepPlan, rate: float) -> float:
    """Tokens per sequence of a tree step in these tests: the chain's, plus what siblings recover (more nodes, more)."""
    chain = sum(rate ** k for k in range(plan.block_size))
    return chain + {8: 0.2, 16: 0.7, 32: 1.0}[plan.tree_budget]


def _run_plans(policy, cost, batch_size: int, rate: float, steps: int = 400) -> list[StepPlan]:
    chosen = []
    for step in range(steps):
        plan = policy.choose(batch_size)
        _note_exploration(policy)
        if plan.tree_budget:
            drafts, rng = _tree_tokens(plan, rate) - 1, random.Random(step)  # rows commit that on average
            accepted = [int(drafts) + (rng.random() < drafts % 1) for _ in range(batch_size)]
        else:
            accepted = _accepted(rate, plan.block_size, batch_size, step)
        policy.observe(batch_size, plan, cost(batch_size, plan.verified_tokens), accepted)
        chosen.append(plan)
    return chosen


def test_each_tree_budget_is_measured_once_after_chain_and_plain():
    policy = AdaptiveBlockSize(MAX_BLOCK, tree_budgets=[16, 32])
    first = _run_plans(policy, gpu_like, 1, rate=0.5, steps=4)
    assert first == [StepPlan(MAX_BLOCK), PLAIN, StepPlan(MAX_BLOCK, 16), StepPlan(MAX_BLOCK, 32)]
    assert set(policy.tree_tokens) == {16, 32}


def test_policy_takes_the_tree_where_verifying_is_nearly_free():
    """A GPU-like cost: a 33-token verify costs about a 9-token one, so the largest tree commits the most per
    second; the chain's acceptance is low (the drafter's near misses are what the tree recovers)."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50, tree_budgets=[8, 16, 32])
    chosen = _run_plans(policy, gpu_like, 1, rate=0.5)
    settled = _settled(policy, chosen, 100)
    assert set(settled) == {StepPlan(MAX_BLOCK, 32)}, set(settled)


def test_policy_leaves_trees_for_plain_decoding_when_every_token_costs():
    """A CPU-like cost at 32 rows: neither a tree nor a chain pays; the policy settles on plain decoding."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50, tree_budgets=[16, 32])
    chosen = _run_plans(policy, cpu_like, 32, rate=0.5)
    assert chosen[-20:].count(PLAIN) >= 19  # one exploration step in 50


def test_a_tree_that_recovers_nothing_loses_to_the_chain():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50, tree_budgets=[32])
    chosen = []
    for step in range(300):
        plan = policy.choose(1)
        _note_exploration(policy)
        rows = _accepted(0.7, min(plan.block_size, MAX_BLOCK), 1, step)  # the tree accepts only the spine
        policy.observe(1, plan, cpu_like(1, plan.verified_tokens), rows)
        chosen.append(plan)
    assert StepPlan(MAX_BLOCK, 32) not in _settled(policy, chosen, 100)


def test_tree_budget_ladder_and_the_one_budget_check():
    from dflash_trt.decoding.scheduler.block_policy import tree_budget_ladder

    assert tree_budget_ladder(0, 8) == [] and tree_budget_ladder(32, 8) == [8, 16, 32]
    assert tree_budget_ladder(24, 8) == [8, 16, 24] and tree_budget_ladder(4, 8) == [4]
    for bad in (-1, 2.5, True):
        with pytest.raises(DFlashError, match="tree budget must be >= 0"):
            make_policy("adaptive", 8, max_tree_budget=bad)
    assert make_policy("adaptive", 8, max_tree_budget=32).tree_budgets == [8, 16, 32]


# -- under load: conservative costs, exploration within a budget, catch-ups charged --------------------------------
def test_drafted_costs_at_an_unmeasured_batch_size_are_upper_bounds_from_measured_ones():
    """A step of 16 rows x 2 tokens verifies as many tokens as one of 4 x 8, but costs more (per-row work: the
    drafter, acceptance); it is bounded by a larger batch's cost at the same tokens per row, or a smaller batch's
    scaled by the rows, never interpolated by token count."""
    costs = BatchStepCosts(smoothing=1.0)
    costs.observe(4, 8, 0.040)
    costs.observe(4, 2, 0.024)
    costs.observe(32, 2, 0.080)
    assert costs.estimate(4, 8) == pytest.approx(0.040)  # measured
    assert costs.estimate(16, 2) == pytest.approx(min(0.024 * 16 / 4, 0.080))
    assert costs.estimate(8, 8) == pytest.approx(0.040 * 8 / 4)  # the 32-row bound (0.080 * 8 / 2) is looser
    assert costs.estimate(2, 2) == pytest.approx(0.024)  # a smaller batch costs no more


def test_a_large_batch_does_not_draft_on_the_strength_of_a_small_batch_with_as_many_tokens():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=10**6)
    for _ in range(20):
        policy.observe(4, StepPlan(8), 0.040, [1, 1, 1, 1])  # the first draft accepted, the second never
        policy.observe(4, StepPlan(2), 0.024, [1, 1, 1, 1])
        policy.observe(16, PLAIN, 0.030, [0] * 16)
    # By token count (4 rows x 8), a chain of 2 at 16 rows would be worth ~2 / 0.040: more than plain's 1 / 0.030.
    assert policy.best(16) == PLAIN
    assert policy.cost(16, StepPlan(2)) >= 0.080


def test_a_drafted_plan_must_beat_plain_by_the_margin():
    def tied(margin):
        policy = AdaptiveBlockSize(2, explore_every=10**6, draft_margin=margin)
        for _ in range(50):
            policy.observe(1, StepPlan(2), 0.0195, [1])  # ~2 tokens in 19.5 ms: 2.5% better than plain
            policy.observe(1, PLAIN, 0.010, [0])
        policy.acceptance.observe(2, [1] * 200)
        return policy.best(1)

    assert tied(1.05) == PLAIN and tied(1.0) == StepPlan(2)


def _plain_regime(policy, steps: int, catch_up_seconds: float, batch_size: int = 16,
                  sizes: random.Random | None = None) -> list[StepPlan]:
    """A loaded server decoding plain: a plain step costs 30 ms, a drafted one 60 ms and pays a catch-up of every row
    left pending (catch_up_seconds), and drafting never pays (acceptance 0). sizes: each step's batch size drawn
    from batch_size - 3 .. batch_size (requests leaving and joining), else always batch_size."""
    chosen, pending, size = [], 0, batch_size
    for _ in range(steps):
        batch_size = size if sizes is None else sizes.randint(size - 3, size)
        pending += 1
        rows = batch_size * pending
        plan = policy.choose(batch_size, catch_up_rows=rows)
        if plan.block_size > 1:
            policy.observe_catch_up(rows, catch_up_seconds)
            policy.observe(batch_size, plan, 0.060, [0] * batch_size)
            pending = 0
        else:
            policy.observe(batch_size, plan, 0.030, [0] * batch_size)
        chosen.append(plan)
    return chosen


def test_exploring_from_plain_is_rare_when_the_catch_up_it_causes_is_dear():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50, explore_window_s=10**9)  # (the budget's window: below)
    policy.observe(16, StepPlan(MAX_BLOCK), 0.060, [0] * 16)
    chosen = _plain_regime(policy, 3000, catch_up_seconds=0.300)
    explored = sum(plan.block_size > 1 for plan in chosen)
    # 3000 plain steps take 90 s, 1% of it is 0.9 s: three explorations that each cost 0.33 s beyond a plain step
    # (the catch-up included), not the 60 that one every 50 decisions would be.
    assert 1 <= explored <= 3, explored
    # Each exploration was charged its catch-up and what its step cost beyond a plain one.
    assert policy.explore_seconds == pytest.approx(explored * (0.300 + 0.060 - 0.030), rel=0.05)
    assert policy.explore_seconds <= policy.explore_share * policy.seconds + 0.33
    cheap = AdaptiveBlockSize(MAX_BLOCK, explore_every=50)
    cheap.observe(16, StepPlan(MAX_BLOCK), 0.060, [0] * 16)
    assert sum(plan.block_size > 1 for plan in _plain_regime(cheap, 3000, catch_up_seconds=0.0)) > 3 * explored


def test_the_exploration_budget_is_a_share_of_the_recent_time_not_of_all_time():
    """A server that drafted one request at a time for long, where exploring costs little beyond the best plan, then
    runs loaded and plain: the headroom left from the quiet hours must not be spent in a burst of dear explorations
    (each one a catch-up of the whole batch). Within the loaded stretch, exploration takes about explore_share of
    its time, as it would on a fresh server."""
    def quiet_then_loaded(window_s: float) -> int:
        policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50, explore_window_s=window_s)
        for _ in range(40000):  # 400 s at one request in flight: a chain of 4 pays (3 tokens in 10 ms)
            plan = policy.choose(1)
            policy.observe(1, plan, 0.005 + 0.0015 * plan.block_size, [min(plan.block_size - 1, 2)])
        return sum(plan.block_size > 1 for plan in _plain_regime(policy, 1000, catch_up_seconds=0.300))

    # 1000 plain steps take 30 s; 1% of it pays for one exploration of 0.33 s (and the acceptance learnt at one request
    # in flight makes the step after it draft once more, on its merits)
    assert quiet_then_loaded(window_s=30.0) <= 2
    assert quiet_then_loaded(window_s=10**9) >= 8  # all time: 1% of 400 s spent in the first loaded steps


def test_exploring_from_plain_backs_off_while_drafting_keeps_losing():
    """A loaded server where every exploration finds drafting still losing re-checks ever more rarely: the wait doubles
    from 50 decisions up to 800, instead of spending explore_share on it for good. (Near the margin it does not back
    off: test_a_policy_that_measured_only_long_chains_still_finds_the_short_one_that_pays.)"""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50)
    policy.observe(16, StepPlan(MAX_BLOCK), 0.060, [0] * 16)
    chosen = _plain_regime(policy, 6000, catch_up_seconds=0.0)  # cheap explorations: the budget alone allows ~40
    explored = [step for step, plan in enumerate(chosen) if plan.block_size > 1]
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert gaps == sorted(gaps) and gaps[-1] == 16 * 50, gaps
    assert len(explored) <= 10


def test_backing_off_at_a_batch_size_backs_off_at_the_larger_ones_too():
    """Served at 16 in flight the batch moves between 13 and 16 rows as requests leave and join. Drafting that loses at
    13 rows loses at more (each row costs a loaded target as much), so the wait there is at least 13's: the wait
    reaches its 16x within 1300 decisions and 13 explorations are made over the 6000 steps (19 when each size counted
    only its own explorations: 4 doublings of each size, every one an exploration; 10 at one batch size)."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50)
    for size in range(13, 17):
        policy.observe(size, StepPlan(MAX_BLOCK), 0.060, [0] * size)
    chosen = _plain_regime(policy, 6000, catch_up_seconds=0.0, sizes=random.Random(5))
    explored = [step for step, plan in enumerate(chosen) if plan.block_size > 1]
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert len(explored) <= 14 and gaps[-5:] == [16 * 50] * 5, gaps


def test_drafting_that_holds_its_own_at_a_batch_size_ends_the_backoff_there_and_below():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=1, explore_share=1.0)
    policy.observe(14, StepPlan(MAX_BLOCK), 0.060, [0] * 14)
    for size in range(13, 17):
        policy.observe(size, PLAIN, 0.030, [0] * size)
    policy._plain_confirmed.update({13: 3, 16: 4})  # explorations at 13 and at 16 found drafting losing
    assert policy._explore_interval(14, PLAIN) == 8
    while (plan := policy.choose(14)) == PLAIN:
        policy.observe(14, PLAIN, 0.030, [0] * 14)
    policy.observe(14, plan, 0.031, [plan.block_size - 1] * 14)  # every draft accepted, at a plain step's cost
    assert not policy._drafting_loses(14)
    assert policy._explore_interval(13, PLAIN) == policy._explore_interval(14, PLAIN) == 1
    assert policy._explore_interval(16, PLAIN) == 16  # (16 rows: nothing said)


def test_exploring_from_plain_tries_the_drafted_plan_drafting_would_resume_with():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=1, explore_share=1.0)
    for size in range(2, MAX_BLOCK + 1):
        policy.observe(4, StepPlan(size), 0.010 + 0.010 * size, [size - 1] * 4)  # always accepted
    policy.observe(4, PLAIN, 0.005, [0] * 4)
    best_drafted = max((StepPlan(s) for s in range(2, MAX_BLOCK + 1)), key=lambda plan: policy.value(4, plan))
    assert policy.best(4) == PLAIN and best_drafted != StepPlan(2)
    assert policy.choose(4) == best_drafted and policy._exploring == best_drafted


def test_exploring_from_plain_where_no_chain_ran_probes_the_shortest_chain():
    """At a batch size where no chain ran, every chain's cost is a bound from smaller batches, the same whatever its
    length, so the longest chain looks best; probing it is the dearest step there is (16 rows x 8 tokens). The probe
    is the shortest chain; once one ran there, explorations go by value again."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=1, explore_share=1.0)
    policy.observe(4, StepPlan(MAX_BLOCK), 0.030, [2] * 4)  # measured only at 4 rows
    policy.observe(16, PLAIN, 0.035, [0] * 16)
    values = policy._values(16)
    assert max((plan for plan in values if plan != PLAIN), key=values.get) == StepPlan(MAX_BLOCK)
    assert policy.choose(16) == StepPlan(2) and policy._exploring == StepPlan(2)
    policy.observe(16, StepPlan(2), 0.065, [1] * 16)
    assert policy.choose(16) == StepPlan(2)  # by value now: chain 2 is worth the most


def test_a_catch_up_is_charged_to_drafting_after_plain_steps():
    policy = AdaptiveBlockSize(2, explore_every=10**6)
    for _ in range(10):
        policy.observe(1, StepPlan(2), 0.015, [1])
        policy.observe(1, PLAIN, 0.010, [0])
    policy.acceptance.observe(2, [1] * 200)
    assert policy.best(1) == StepPlan(2)  # ~1.99 tokens in 15 ms against 1 in 10 ms
    policy.observe_catch_up(100, 0.400)  # taking in 100 rows cost 0.4 s
    assert policy.best(1, catch_up_rows=100) == PLAIN  # 25 ms more per step over the next 16: no longer pays
    assert policy.best(1, catch_up_rows=0) == StepPlan(2)


def _drafting_after_catch_ups(policy: AdaptiveBlockSize, runs: int, run_length: int) -> None:
    """`runs` times: a catch-up of 100 rows (40 ms), `run_length` drafted steps, then a plain step (the batch grew)."""
    for _ in range(runs):
        policy.observe_catch_up(100, 0.040)
        for _ in range(run_length):
            policy.observe(1, StepPlan(2), 0.015, [1])
        policy.observe(1, PLAIN, 0.010, [0])


def test_a_catch_up_is_spread_over_as_many_drafted_steps_as_catch_ups_bought_so_far():
    """Drafting that pays on its own steps (~1.99 tokens in 15 ms against 1 in 10 ms) resumes after a backlog while a
    catch-up has been followed by long drafting runs (its 40 ms spread over 16 steps), not while each catch-up bought
    one drafted step before the batch went plain again (40 ms on that one step)."""
    policy = AdaptiveBlockSize(2, explore_every=10**6)
    policy.observe(1, PLAIN, 0.010, [0])
    policy.acceptance.observe(2, [1] * 200)
    _drafting_after_catch_ups(policy, runs=1, run_length=16)
    assert policy.drafting_runs.steps() == 16
    assert policy.best(1, catch_up_rows=100) == StepPlan(2)
    _drafting_after_catch_ups(policy, runs=12, run_length=1)
    assert policy.drafting_runs.steps() < 1.5
    assert policy.best(1, catch_up_rows=100) == PLAIN
    assert policy.best(1, catch_up_rows=0) == StepPlan(2)  # without a backlog drafting still pays
    _drafting_after_catch_ups(policy, runs=12, run_length=40)  # longer runs again (counted as at most 16)
    assert policy.drafting_runs.steps() > 15
    assert policy.best(1, catch_up_rows=100) == StepPlan(2)


def test_a_catch_up_that_only_bounds_a_plain_backlog_starts_no_drafting_run():
    policy = AdaptiveBlockSize(2, explore_every=10**6)
    for _ in range(5):
        policy.observe_catch_up(100, 0.040)  # past max_pending_features while decoding plain
        policy.observe(1, PLAIN, 0.010, [0])
    assert policy.drafting_runs.mean is None and policy.drafting_runs.steps() == policy.catch_up_horizon
    policy.observe(1, StepPlan(2), 0.015, [1])  # drafting with nothing to catch up: no run either
    policy.observe(1, PLAIN, 0.010, [0])
    assert policy.drafting_runs.mean is None


def _best_from_values(policy: AdaptiveBlockSize, batch_size: int, catch_up_rows: int) -> StepPlan:
    """best() as the module docstring defines it, from value() of every plan (no cached estimates)."""
    known = {plan: policy.value(batch_size, plan, catch_up_rows) for plan in policy.plans}
    known = {plan: v for plan, v in known.items() if v is not None}
    best = max(known, key=lambda plan: (known[plan], -plan.verified_tokens))
    if best.block_size > 1 and PLAIN in known and known[best] < policy.draft_margin * known[PLAIN]:
        return PLAIN
    return best


def test_cached_drafted_estimates_follow_every_observation():
    """The policy keeps each batch size's drafted estimates between drafted steps (a loaded server decides plain at
    every step); whatever is observed, its choice equals the one computed afresh from value()."""
    rng = random.Random(3)
    policy = AdaptiveBlockSize(MAX_BLOCK, tree_budgets=[16], explore_every=10**9)
    for step in range(400):
        batch_size, plan = rng.randint(1, 8), rng.choice(policy.plans)
        seconds = 0.005 * batch_size * (1 + 0.1 * plan.verified_tokens) * rng.uniform(0.5, 1.5)
        policy.observe(batch_size, plan, seconds, [rng.randrange(plan.block_size) for _ in range(batch_size)])
        if step % 7 == 0:
            policy.observe_catch_up(rng.randint(1, 500), 0.002)
        for size in (1, 3, 8, 12):
            for rows in (0, 64):
                assert policy.best(size, rows) == _best_from_values(policy, size, rows), (step, size, rows)


def test_one_slow_plain_step_at_a_new_batch_size_does_not_make_drafting_win_there():
    """Measured in a served run: 16 rows decode plain in 18.6 ms; the first plain step of 32 rows took 114 ms (the KV
    cache grew inside it); chains of 3 at 32 rows take ~110 ms. A plain step of 32 rows costs at most twice one of
    16, so plain decoding stays the choice at 32, not drafting on the strength of one slow step."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=10**9)
    for step in range(40):
        policy.observe(1, StepPlan(4), 0.008, _accepted(0.45, 4, 1, step))
        policy.observe(16, PLAIN, 0.0186, [0] * 16)
    policy.observe(32, PLAIN, 0.114, [0] * 32)
    for step in range(5):
        policy.observe(32, StepPlan(3), 0.110, _accepted(0.45, 3, 32, step))
    assert policy.cost(32, PLAIN) == pytest.approx(2 * 0.0186)
    assert policy.best(32) == PLAIN


def test_one_slow_plain_step_at_a_rarely_seen_batch_size_stands_for_neither_it_nor_the_sizes_around_it():
    """Measured in process at 16 requests in flight: plain steps of 8 rows at 9.3 ms and of 16 at 19.3 ms, and one of
    9 rows at 60 ms (9 rows came up once, at the start). Read as it was, it put plain steps of 10-15 rows at 60 ms,
    and the policy drafted chains of 2-3 at 15 rows (35-48 ms a step for ~1.6 tokens a row), at ~0.9x of plain."""
    policy = AdaptiveBlockSize(4, explore_every=10**9)
    for step in range(40):
        policy.observe(15, StepPlan(2), 0.0345, _accepted(0.52, 2, 15, step))
        policy.observe(15, StepPlan(3), 0.0477, _accepted(0.52, 3, 15, step))
        policy.observe(8, PLAIN, 0.00933, [0] * 8)
        policy.observe(16, PLAIN, 0.0193, [0] * 16)
    policy.observe(9, PLAIN, 0.0597, [0] * 9)
    assert policy.cost(9, PLAIN) == pytest.approx(0.00933 * 9 / 8)  # at most the next smaller size's per row
    for rows in range(10, 16):  # between 9 and 16: at most 16 rows' cost, and at most 8 rows' per row
        assert policy.cost(rows, PLAIN) <= min(0.0193, 0.00933 * rows / 8) + 1e-12
    at_16 = min(0.0193, 0.00933 * 16 / 8)  # measured sizes too: 16 rows at most 8 rows' per row
    assert policy.cost(16, PLAIN) == pytest.approx(at_16)
    assert policy.cost(32, PLAIN) == pytest.approx(at_16 * 2)  # beyond: at most the largest size's per row
    assert [policy.best(rows) for rows in (9, 12, 14, 15)] == [PLAIN] * 4
    # With no smaller size measured, the larger one bounds it: a step of fewer rows costs no more.
    policy = AdaptiveBlockSize(4, explore_every=10**9)
    policy.observe(16, PLAIN, 0.0193, [0] * 16)
    policy.observe(9, PLAIN, 0.0597, [0] * 9)
    assert policy.cost(9, PLAIN) == policy.cost(12, PLAIN) == pytest.approx(0.0193)


def cpu_short_chains(batch_size, block_size):
    """Like the demo pair on one core at batch 1: a plain step 3.5 ms; a chain of k a 1 ms draft call more and
    0.6 ms per extra token verified. At an acceptance rate of 0.6 chains of 3-5 beat plain decoding by more than the
    margin and one of 8 (the first step's) loses to it."""
    extra = 0.0 if block_size == 1 else 0.001 + 0.0006 * batch_size * (block_size - 1)
    return 0.0035 * batch_size + extra


def test_a_policy_that_measured_only_long_chains_still_finds_the_short_one_that_pays():
    """Its first step and its explorations from plain draft the longest chain, which loses; below the chains measured,
    costs are flat (an upper bound), so without the line from a plain step to the shortest measured chain every
    shorter chain looks as dear as the longest and is never tried."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=50)
    chosen = _run(policy, cpu_short_chains, 1, rate=0.6, steps=600)
    value = {size: _true_value(cpu_short_chains, 1, size, 0.6) for size in range(1, MAX_BLOCK + 1)}
    best = max(value, key=value.get)
    assert 3 <= best <= 5 and value[best] > 1.1 * value[1] > value[MAX_BLOCK]
    settled = _settled(policy, chosen, 300)
    assert sum(size > 1 for size in settled) >= 0.9 * len(settled), Counter(settled)
    for size in set(settled):
        assert value[size] >= 0.95 * value[best], Counter(settled)


def test_the_short_chain_bound_applies_only_below_the_chains_measured_at_the_batch_size():
    policy = AdaptiveBlockSize(MAX_BLOCK)
    policy.observe(1, PLAIN, 0.004, [0])
    policy.observe(1, StepPlan(8), 0.011, [1])
    assert policy.cost(1, StepPlan(4)) == pytest.approx(0.004 + 0.007 * 3 / 7)  # the line, below the flat 11 ms
    policy.observe(1, StepPlan(2), 0.007, [1])
    assert policy.cost(1, StepPlan(4)) == pytest.approx(0.007 + 0.004 * 2 / 6)  # measured on both sides: StepCosts
    assert policy.cost(4, StepPlan(4)) == pytest.approx(4 * policy.cost(1, StepPlan(4)))  # no chain measured at 4


def test_cached_values_follow_plain_steps_into_the_short_chain_bound():
    """The bound's plain end moves with every plain step, which does not invalidate the cached drafted estimates:
    the values best() compares still equal value()'s."""
    policy = AdaptiveBlockSize(MAX_BLOCK)
    policy.observe(1, PLAIN, 0.004, [0])
    policy.observe(1, StepPlan(8), 0.009, [1])
    policy.best(1)  # the drafted estimates at batch 1 are cached now
    for _step in range(5):
        policy.observe(1, PLAIN, 0.003, [0])
    values = policy._values(1)
    for plan in policy.plans:
        assert values[plan] == pytest.approx(policy.value(1, plan)), plan


def test_one_slow_step_moves_a_measured_cost_by_at_most_the_outlier_ratio():
    """A plain step of one row at 14 ms among ones of 3.5 ms (a garbage collection, say) must not make a chain of 4
    that does not beat plain by the margin look like it does; a real change still moves the average."""
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=10**9, sizes=(1, 4))
    for step in range(40):
        policy.observe(1, PLAIN, 0.0035, [0])
        policy.observe(1, StepPlan(4), 0.0075, _accepted(0.4, 4, 1, step))
    assert policy.best(1) == PLAIN
    policy.observe(1, PLAIN, 0.014, [0])
    assert policy.cost(1, PLAIN) == pytest.approx(0.0035 * (1 + policy.plain.smoothing))
    assert policy.best(1) == PLAIN
    costs = StepCosts()
    for seconds in (0.010, 0.040, 0.040, 0.040, 0.040):
        costs.observe(1, seconds)
    assert costs.seconds[1] > 0.025  # a lasting change is followed within a few steps


def test_a_streak_of_slow_plain_steps_does_not_switch_a_loaded_batch_to_drafting():
    """Measured in process at 4 in flight: plain steps of 4 rows take ~5.5 ms, with streaks of a few at 8-9 ms; a
    chain of 2 takes 10.8 ms for ~1.6 tokens a row (0.78x of plain). Plain costs average slowly, so a streak of four
    steps at 9 ms keeps the choice plain; at the drafted plans' smoothing (0.3) it switched to the chain."""
    policy = AdaptiveBlockSize(2, explore_every=10**9)
    for step in range(40):
        policy.observe(4, StepPlan(2), 0.0108, _accepted(0.6, 2, 4, step))
        policy.observe(4, PLAIN, 0.0055, [0] * 4)
    assert policy.best(4) == PLAIN
    for _ in range(4):
        policy.observe(4, PLAIN, 0.009, [0] * 4)
    assert policy.cost(4, PLAIN) < 0.0055 + 0.4 * (0.009 - 0.0055)
    assert policy.best(4) == PLAIN


def test_a_first_slow_plain_step_weighs_as_one_of_the_first_steps_not_longer():
    """The first plain step at a batch size (a cache that grew inside it) is averaged as one of the first 1 /
    smoothing steps, not carried by the slow moving average."""
    costs = AdaptiveBlockSize(4).plain
    costs.observe(4, 0.050)
    for _ in range(9):
        costs.observe(4, 0.005)
    assert costs.seconds[4] == pytest.approx((0.050 + 9 * 0.005) / 10)


def _count_best(policy) -> list[int]:
    """Wrap policy.best to count how often the best plan is worked out (one entry per call: the decision number)."""
    calls, best = [], policy.best

    def counted(batch_size, catch_up_rows=0):
        calls.append(policy.decisions)
        return best(batch_size, catch_up_rows)

    policy.best = counted
    return calls


def test_plain_decoding_stands_for_recheck_every_decisions_unless_drafting_evidence_changes():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=10**6, recheck_every=8)
    for _ in range(20):  # drafting never pays at 4 rows: a 40 ms chain of 8 commits 1 token, a plain step 10 ms
        policy.observe(4, StepPlan(8), 0.040, [0] * 4)
        policy.observe(4, PLAIN, 0.010, [0] * 4)
    calls = _count_best(policy)
    for _ in range(32):
        assert policy.choose(4) == PLAIN
        policy.observe(4, PLAIN, 0.010, [0] * 4)
    assert len(calls) == 4  # worked out at the 1st, 9th, 17th and 25th decision
    policy.observe(4, StepPlan(8), 0.040, [0] * 4)  # a drafted step: the next decision works it out again
    policy.choose(4)
    assert len(calls) == 5
    policy.observe_catch_up(64, 0.01)  # so does a catch-up
    policy.choose(4, catch_up_rows=40)
    assert len(calls) == 6
    policy.choose(4, catch_up_rows=40)
    policy.choose(4, catch_up_rows=64)  # a larger backlog makes drafting no cheaper: plain stands
    assert len(calls) == 6
    policy.choose(4, catch_up_rows=16)  # a smaller one may: worked out again
    assert len(calls) == 7


def test_a_rise_in_plain_cost_makes_drafting_win_within_recheck_every_decisions():
    policy = AdaptiveBlockSize(2, explore_every=10**6, recheck_every=8)
    for _ in range(50):
        policy.observe(1, StepPlan(2), 0.030, [1])  # 2 tokens in 30 ms
        policy.observe(1, PLAIN, 0.010, [0])  # 1 token in 10 ms: plain is best
    policy.acceptance.observe(2, [1] * 200)
    assert policy.choose(1) == PLAIN
    chosen = []
    for _ in range(40):  # plain steps become dear (40 ms): drafting wins
        policy.observe(1, PLAIN, 0.040, [0])
        chosen.append(policy.choose(1))
    assert StepPlan(2) in chosen[:30]
    # A policy working the best plan out at every decision switches at the same step as soon as
    # its estimate crosses; the hold adds at most recheck_every - 1 decisions to that.
    every = AdaptiveBlockSize(2, explore_every=10**6, recheck_every=1)
    for _ in range(50):
        every.observe(1, StepPlan(2), 0.030, [1])
        every.observe(1, PLAIN, 0.010, [0])
    every.acceptance.observe(2, [1] * 200)
    every.choose(1)
    switched = []
    for _ in range(40):
        every.observe(1, PLAIN, 0.040, [0])
        switched.append(every.choose(1))
    assert 0 <= chosen.index(StepPlan(2)) - switched.index(StepPlan(2)) < 8


def test_an_exploration_the_budget_refuses_is_not_reconsidered_for_recheck_every_decisions():
    policy = AdaptiveBlockSize(MAX_BLOCK, explore_every=10, explore_share=0.0, recheck_every=8)  # no budget at all
    for _ in range(20):
        policy.observe(4, StepPlan(8), 0.040, [0] * 4)
        policy.observe(4, PLAIN, 0.010, [0] * 4)
    asked, may_explore = [], policy._may_explore

    def counted(*args):
        asked.append(policy.decisions)
        return may_explore(*args)

    policy._may_explore = counted
    for _ in range(80):
        assert policy.choose(4) == PLAIN
        policy.observe(4, PLAIN, 0.010, [0] * 4)
    assert policy.explorations == 0
    assert 8 <= len(asked) <= 11  # every 8th decision once the interval has passed, not at every one
    assert all(b - a >= 8 for a, b in zip(asked, asked[1:]))
