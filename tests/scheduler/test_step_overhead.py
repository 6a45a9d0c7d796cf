"""The time between two decoding steps outside them (the caller handling a step's outputs) reaches the policy as
the overhead every step carries; a prefill or a newcomer's first step in between is not overhead."""

import time

import pytest

from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import PLAIN, AdaptiveBlockSize, StepPlan
from dflash_trt.decoding.scheduler.scheduler import Scheduler
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

CALLER_S = 0.005  # what the caller spends between steps (a lower bound of every overhead observed)


class RecordingPolicy:
    """Plain steps, and `first_plan` for a newcomer group's first step; records what the scheduler reports, in order
    (a test double)."""

    max_block_size, tree_budgets = 4, []

    def __init__(self, first_plan: StepPlan = PLAIN):
        self.first_plan = first_plan
        self.events = []

    def choose(self, batch_size, observed=True, **_):
        return PLAIN if observed else self.first_plan

    def observe(self, batch_size, plan, seconds, accepted):
        self.events.append(("step", batch_size))

    def observe_catch_up(self, rows, seconds):
        pass

    def observe_overhead(self, batch_size, seconds):
        self.events.append(("overhead", batch_size, seconds))


def _busy(seconds: float) -> None:
    """The caller's own work between steps (streaming outputs, say)."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


@pytest.mark.parametrize("first_plan", [PLAIN, StepPlan(4)], ids=["plain-first-step", "drafted-first-step"])
def test_the_time_between_back_to_back_decoding_steps_is_observed_as_overhead(first_plan):
    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    policy = RecordingPolicy(first_plan)
    scheduler = Scheduler(target, drafter, 4, policy=policy)
    params = SamplingParams(max_new_tokens=40)
    scheduler.add_request([3, 4, 5, 6, 7], params)
    marks = []
    for index in range(60):
        if index == 8:
            scheduler.add_request([9, 10, 11], params)  # its prefill and first step come between decoding steps
            marks.append(len(policy.events))
        if not scheduler.has_unfinished:
            break
        if any(out.is_final for out in scheduler.step()):
            policy.events.append(("finished",))
        _busy(CALLER_S)
    events = policy.events
    overheads = [e for e in events if e[0] == "overhead"]
    assert overheads and all(seconds >= CALLER_S for _, _, seconds in overheads)
    # Each overhead is followed by the step it preceded, of the same batch.
    for i, event in enumerate(events):
        if event[0] == "overhead":
            assert events[i + 1] == ("step", event[1])
    # The first observed step follows the group's first step, and the step after the newcomer's prefill follows
    # that: neither is preceded by an overhead. A plain first step is the batch's step, of both rows; a drafted one
    # runs on the newcomer alone, unobserved, and the batch's step after it is not preceded by an overhead either.
    # The step after one in which a row finished is not either (test_the_time_after_a_step_in_which_rows_finished_
    # is_not_overhead). Every other step is.
    steps = [i for i, e in enumerate(events) if e[0] == "step"]
    unobserved = [i for i in steps if i == 0 or events[i - 1][0] != "overhead"]
    after_join = [i for i in steps if i >= marks[0]][:1 if first_plan == PLAIN else 2]
    after_finish = [i + 1 for i, e in enumerate(events[:-1]) if e[0] == "finished"]
    assert after_finish and unobserved == [steps[0], *after_join, *after_finish]
    assert events[after_join[0]] == ("step", 2 if first_plan == PLAIN else 1)
    assert ("step", 2) in events  # the newcomer joined the batch


def test_the_time_after_a_step_in_which_rows_finished_is_not_overhead():
    """Rows that finish cost their own work before the next step (the prefix cache stores their answers, the caller
    sends their last responses): per request, not per step. Counted as overhead it rated the steps of the batch they
    leave behind as dear and drafting as cheap there."""
    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    policy = RecordingPolicy()
    scheduler = Scheduler(target, drafter, 4, policy=policy)
    for max_new_tokens in (6, 12, 30):
        scheduler.add_request([3, 4, 5, 6, 7], SamplingParams(max_new_tokens=max_new_tokens))
    finished = 0
    while scheduler.has_unfinished:
        outputs = scheduler.step()
        if any(out.is_final for out in outputs):
            finished += 1
            policy.events.append(("finished",))
        _busy(CALLER_S)
    assert finished == 3
    events = policy.events
    after_finish = [i for i, e in enumerate(events) if e[0] == "finished"]
    assert len(after_finish) == 3 and after_finish[-1] == len(events) - 1
    for i in after_finish[:2]:  # the step after a finish is not preceded by an overhead
        assert events[i + 1][0] == "step", events[i - 2:i + 3]
    # while the steps between finishes are
    assert sum(e[0] == "overhead" for e in events) >= 20


def test_a_per_step_overhead_turns_a_chain_that_ties_with_plain_into_one_that_pays():
    """One row: a plain step of 3.6 ms against a chain of 4 at 6.4 ms for ~1.8 tokens: ~1.02x, below the margin.
    With 1.5 ms between steps outside them (served: a step's outputs streamed), plain costs 5.1 ms a token and the
    chain ~4.4 ms: ~1.16x."""
    policy = AdaptiveBlockSize(4, explore_every=10**9, sizes=(1, 4))
    for step in range(40):
        policy.observe(1, StepPlan(4), 0.0064, [(0, 0, 1, 1, 2)[step % 5]])
        policy.observe(1, PLAIN, 0.0036, [0])
    tokens = policy.tokens(StepPlan(4))
    assert 1.7 < tokens < 1.9
    assert policy.best(1) == PLAIN
    for _ in range(20):
        policy.observe_overhead(1, 0.0015)
    assert policy.cost(1, PLAIN) == pytest.approx(0.0051) and policy.cost(1, StepPlan(4)) == pytest.approx(0.0079)
    assert policy.best(1) == StepPlan(4)


class _FakeClock:
    """Stands in for the scheduler module's `time`: perf_counter() is `now`, moved by the test only."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        return self.now


def test_time_the_caller_excludes_is_not_overhead(monkeypatch):
    """Another scheduler's steps in the same thread (benchmarks/interleaved.py) are not this one's overhead."""
    from dflash_trt.decoding.scheduler import scheduler as scheduler_module

    clock = _FakeClock()
    monkeypatch.setattr(scheduler_module, "time", clock)
    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    policy = RecordingPolicy()
    scheduler = Scheduler(target, drafter, 4, policy=policy)
    scheduler.add_request([3, 4, 5, 6, 7], SamplingParams(max_new_tokens=30))
    for _ in range(12):
        scheduler.step()
        clock.now += 1.0  # the caller's own work between steps: overhead
        clock.now += 50.0  # another scheduler's steps
        scheduler.exclude_time(50.0)
    overheads = [seconds for event, *rest in policy.events if event == "overhead" for seconds in rest[1:]]
    assert len(overheads) >= 8 and all(seconds == pytest.approx(1.0) for seconds in overheads)
