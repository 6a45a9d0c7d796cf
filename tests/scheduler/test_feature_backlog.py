"""Plain steps of a DFlash scheduler leave the drafter alone: the target features they record wait for the next
drafted step (or for the scheduler's bound on them, SchedulerLimits.max_pending_features), so a loaded server that
decodes plain does not pay for the drafter."""

import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import StepPlan
from dflash_trt.decoding.scheduler.scheduler import SchedulerLimits
from dflash_trt.decoding.step.batch import PendingFeatures
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target


class ScriptedPolicy:
    """A BlockSizePolicy that runs the given plans in order, then the last one forever (a test double)."""

    def __init__(self, plans, max_block_size=4):
        self.plans, self.max_block_size, self.tree_budgets = iter(plans), max_block_size, []
        self.last = None
        self.catch_ups = []

    def choose(self, batch_size, **_):
        self.last = next(self.plans, self.last)
        return self.last

    def observe(self, batch_size, plan, seconds, accepted):
        pass

    def observe_catch_up(self, rows, seconds):
        self.catch_ups.append(rows)

    def observe_overhead(self, batch_size, seconds):
        pass


def _count_draft_calls(drafter):
    calls = []
    forward = drafter.forward

    def counted(*args, **kwargs):
        calls.append(int(kwargs.get("ctx_lens", args[2]).max()))  # the widest context it took in
        return forward(*args, **kwargs)

    drafter.forward = counted
    return calls


def _ten_plain_steps_then_chains():
    """Two prompts (5 and 9 tokens) decoded with ten plain steps (the group's first step included), then chains
    of 4: (their tokens, plain decoding's, the draft calls' widths, the policy)."""
    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    prompts = [list(range(3, 3 + n)) for n in (5, 9)]
    params = SamplingParams(max_new_tokens=24)
    plain = [r.token_ids for r in generate(target, None, prompts, params)]
    calls = _count_draft_calls(drafter)
    policy = ScriptedPolicy([StepPlan(1)] * 10 + [StepPlan(4)])
    tokens = [r.token_ids for r in generate(target, drafter, prompts, params, 4, policy=policy)]
    return tokens, plain, calls, policy


def test_plain_steps_defer_the_drafter_and_the_next_draft_catches_up():
    tokens, plain, calls, _ = _ten_plain_steps_then_chains()
    assert tokens == plain
    # No draft call during the plain steps; the first draft takes in the prompt and ten steps' features at once.
    assert calls[0] >= 9 + 10 and len(calls) >= 2
    assert all(width <= 4 for width in calls[1:])  # then only each step's accepted tokens


def _plain_run(limits, prompts=([5, 6, 7],), max_new_tokens=30):
    """Prompts decoded with plain steps only by a DFlash scheduler under `limits`: (results, plain decoding's tokens,
    the draft calls' widths, the policy)."""
    from dflash_trt.decoding.scheduler.scheduler import Scheduler

    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    plain = [r.token_ids for r in generate(target, None, [list(p) for p in prompts], params)]
    calls, policy = _count_draft_calls(drafter), ScriptedPolicy([StepPlan(1)])
    scheduler = Scheduler(target, drafter, 4, limits, policy)
    for prompt in prompts:
        scheduler.add_request(list(prompt), params)
    results = {}
    while scheduler.has_unfinished:
        for out in scheduler.step():
            if out.is_final:
                results[out.index] = out.result
    return [results[i] for i in sorted(results)], plain, calls, policy


def test_a_backlog_beyond_the_bound_is_taken_in_while_decoding_plain():
    results, plain, calls, policy = _plain_run(SchedulerLimits(max_pending_features=8))
    assert [r.token_ids for r in results] == plain and results[0].tau == 1.0
    # Taken in each time the backlog passed the bound (one row: 9 context rows), reported to the policy as catch-ups.
    assert len(calls) >= 3 and max(calls) == 9
    assert policy.catch_ups and all(rows == 9 for rows in policy.catch_ups)


def test_below_the_bound_plain_decoding_never_calls_the_drafter():
    """A loaded server decodes plain: rows that finish before drafting resumes never pay for the drafter."""
    results, plain, calls, policy = _plain_run(SchedulerLimits(), prompts=([5, 6, 7], [8, 9, 10, 11, 12]))
    assert [r.token_ids for r in results] == plain
    assert calls == [] and policy.catch_ups == []


def test_a_long_prompt_is_taken_in_alone_when_joining_would_pass_the_bound():
    """A newcomer whose prompt would pad every row of the joined batch past the bound is taken in by its own group
    (rows x its prompt), not by a catch-up of the joined batch (every row padded to its prompt)."""
    long_prompt = list(range(3, 3 + 20))
    results, plain, calls, policy = _plain_run(SchedulerLimits(max_pending_features=30),
                                               prompts=([5, 6, 7], long_prompt), max_new_tokens=6)
    assert [r.token_ids for r in results] == plain
    # Both prompts are prefilled as one group and take their first step together: 2 rows x 21 context rows > 30, so
    # the group takes them in at its first step (a draft call 21 wide), before it is the running batch.
    assert calls and calls[0] == len(long_prompt) + 1
    assert all(rows <= 30 for rows in policy.catch_ups)


def test_pending_features_equal_concatenated_rows_through_appends_reorders_and_merges():
    """Pending features are kept by reference (no copy per plain step, select or merge); what the drafter gets is
    each row's rows in order, as if they had been concatenated."""
    generator = torch.Generator().manual_seed(0)
    initial = torch.randn(3, 4, 5, generator=generator)
    pending = PendingFeatures(initial, torch.tensor([4, 2, 0]))
    expected = [list(initial[0, :4]), list(initial[1, :2]), []]
    for step in range(12):
        counts = torch.randint(0, 3, (len(expected),), generator=generator).tolist()
        new = torch.randn(len(expected), max(counts) or 1, 5, generator=generator)
        pending.append(new, counts)
        for row, count in enumerate(counts):
            expected[row] += list(new[row, :count])
        if step == 4:  # a row leaves, the last one takes its place
            pending.select([0, 2])
            expected = [expected[0], expected[2]]
        if step == 7:  # newcomers join with their prompts' features
            prompts = torch.randn(2, 6, 5, generator=generator)
            pending.merge(PendingFeatures(prompts, torch.tensor([6, 3])))
            expected += [list(prompts[0, :6]), list(prompts[1, :3])]
    rows = pending.rows()
    assert rows.shape[1] == pending.width == max(len(e) for e in expected)
    for row, rows_expected in enumerate(expected):
        assert int(pending.lens[row]) == pending.counts[row] == len(rows_expected)
        assert torch.equal(rows[row, :len(rows_expected)], torch.stack(rows_expected))
    pending.clear()
    assert pending.width == 0 and pending.rows().shape == (4, 0, 5) and not pending.lens.any()


def test_pending_features_of_one_step_are_handed_over_without_a_copy():
    features = torch.randn(3, 4, 5)
    pending = PendingFeatures(None, torch.zeros(3, dtype=torch.long))
    pending.append(features, [2, 4, 1])
    assert pending.rows().data_ptr() == features.data_ptr()


def test_a_drafted_step_after_plain_steps_first_catches_the_drafter_up_and_reports_it():
    """The backlog plain steps left is taken in by a draft call of its own, timed apart from the drafted step, and
    reported to the policy (which charges it to drafting after plain steps, not to the drafted step's cost)."""
    tokens, plain, calls, policy = _ten_plain_steps_then_chains()
    assert tokens == plain
    # Two rows x the longest backlog: the 9-token prompt and ten plain steps' tokens; one catch-up only, since
    # the drafted steps that follow leave at most a block pending.
    assert policy.catch_ups == [2 * (9 + 10)]
    assert calls[0] == 9 + 10 and all(width <= 4 for width in calls[1:])


class RecordingPolicy(ScriptedPolicy):
    def __init__(self, plans):
        super().__init__(plans)
        self.calls = []

    def choose(self, batch_size, **kwargs):
        self.calls.append((batch_size, kwargs.get("observed", True)))
        return super().choose(batch_size)


def test_a_newcomers_first_step_takes_the_plan_of_the_batch_it_joins():
    from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits

    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    policy = RecordingPolicy([StepPlan(1)])
    scheduler = Scheduler(target, drafter, 4, SchedulerLimits(max_batch_size=4), policy)
    scheduler.add_request([5, 6, 7], SamplingParams(max_new_tokens=20))
    while scheduler.num_running < 1 or scheduler.fresh is not None:  # prefilled, then its first step
        scheduler.step()
    scheduler.step()
    scheduler.add_request([8, 9, 10, 11], SamplingParams(max_new_tokens=20))
    while scheduler.num_running < 2 or scheduler.fresh is not None:
        scheduler.step()
    first_steps = [size for size, observed in policy.calls if not observed]
    assert first_steps == [1, 2]  # the first request alone, then the newcomer for the batch of two it joins
