"""Plain steps of a DFlash scheduler leave the drafter alone: the target features they record wait for the next
drafted step (or for the backlog bound), so a loaded server that decodes plain does not pay for the drafter."""

import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import StepPlan
from dflash_trt.decoding.step import step as step_module
from dflash_trt.decoding.step.batch import RunningBatch
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target


class ScriptedPolicy:
    """A BlockSizePolicy that runs the given plans in order, then the last one forever (a test double)."""

    def __init__(self, plans, max_block_size=4):
        self.plans, self.max_block_size, self.tree_budgets = iter(plans), max_block_size, []
        self.last = None

    def choose(self, batch_size):
        self.last = next(self.plans, self.last)
        return self.last

    def observe(self, batch_size, plan, seconds, accepted):
        pass


def _count_draft_calls(drafter):
    calls = []
    forward = drafter.forward

    def counted(*args, **kwargs):
        calls.append(int(kwargs.get("ctx_lens", args[2]).max()))  # the widest context it took in
        return forward(*args, **kwargs)

    drafter.forward = counted
    return calls


def test_plain_steps_defer_the_drafter_and_the_next_draft_catches_up():
    model = make_tiny_target("llama", seed=1)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    prompts = [list(range(3, 3 + n)) for n in (5, 9)]
    params = SamplingParams(max_new_tokens=24)
    plain = [r.token_ids for r in generate(target, None, prompts, params)]
    calls = _count_draft_calls(drafter)
    # Ten plain steps (the first step of the group included), then chains of 4.
    policy = ScriptedPolicy([StepPlan(1)] * 10 + [StepPlan(4)])
    results = generate(target, drafter, prompts, params, 4, policy=policy)
    assert [r.token_ids for r in results] == plain
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


def test_appending_features_in_place_equals_concatenating_rows():
    generator = torch.Generator().manual_seed(0)
    batch = RunningBatch.__new__(RunningBatch)
    batch.features, batch.ctx_lens = None, torch.zeros(3, dtype=torch.long)
    expected = [[] for _ in range(3)]
    for _ in range(12):
        new_lens = torch.randint(0, 3, (3,), generator=generator)
        new = torch.randn(3, int(new_lens.max()) or 1, 5, generator=generator)
        batch.append_features(new, new_lens)
        for row in range(3):
            expected[row] += list(new[row, :int(new_lens[row])])
    rows = batch.pending_feature_rows()
    assert rows.shape[1] == batch.pending_features == max(len(e) for e in expected)
    for row in range(3):
        assert int(batch.ctx_lens[row]) == len(expected[row])
        assert torch.equal(rows[row, :len(expected[row])], torch.stack(expected[row]))
