"""The scheduler verifies through the method it is given (step/verify): a method is a seam, not a flag."""

from __future__ import annotations

from conftest import oracle_for

from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.verify import Accepted, ChainVerify

ORDER = [0, 1, 2, 3]


class RejectEverything(ChainVerify):
    """The chain's layout, but no draft is ever accepted: the target's own token after the anchor is committed."""

    name = "reject-everything"

    def accept(self, logits, verify, proposal, batch) -> Accepted:
        decided = super().accept(logits, verify, proposal, batch)
        first = logits[:, 0].argmax(-1)
        return Accepted(decided.num_accepted * 0, first, [[] for _ in decided.drafts])


def run(pair, method=None):
    target, _, prompts, references = pair
    oracle = oracle_for(pair, 8, ORDER)  # drafts the reference continuation: the chain accepts whole blocks
    scheduler = Scheduler(target, oracle, 8, SchedulerLimits(max_batch_size=4), FixedBlockSize(8), method)
    for index in ORDER:
        scheduler.add_request(prompts[index], SamplingParams(max_new_tokens=12), request_id=index)
    results = {}
    while scheduler.has_unfinished:
        for out in scheduler.step():
            if out.is_final:
                results[out.index] = out.result
    return results, [references[i][:12] for i in ORDER]


def test_the_default_method_is_the_chain(pair):
    results, references = run(pair)
    assert [results[i].token_ids for i in ORDER] == references
    assert max(max(results[i].acceptance_lengths) for i in ORDER) > 1


def test_a_method_given_to_the_scheduler_decides_what_is_accepted(pair):
    results, references = run(pair, RejectEverything())
    assert [results[i].token_ids for i in ORDER] == references  # still the target's tokens, one a step
    assert all(set(results[i].acceptance_lengths) == {1} for i in ORDER)
