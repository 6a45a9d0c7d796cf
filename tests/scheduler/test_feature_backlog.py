"""Plain steps of a DFlash scheduler leave the drafter alone: the target features they record wait for the next
drafted step (or for the backlog bound), so a loaded server that decodes plain does not pay for the drafter."""

import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import StepPlan
from dflash_trt.decoding.step import step as step_module
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


def test_a_backlog_beyond_the_bound_is_taken_in_while_decoding_plain(monkeypatch):
    monkeypatch.setattr(step_module, "FEATURE_BACKLOG", 8)
    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    calls = _count_draft_calls(drafter)
    plain = generate(target, None, [[5, 6, 7]], SamplingParams(max_new_tokens=30))[0].token_ids
    result = generate(target, drafter, [[5, 6, 7]], SamplingParams(max_new_tokens=30), 4,
                      policy=ScriptedPolicy([StepPlan(1)]))[0]
    assert result.token_ids == plain and result.tau == 1.0
    assert calls and max(calls) <= 8 + 1  # absorbed each time the backlog reached the bound


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
            pending.select([0, 2], torch.tensor([0, 2]))
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
