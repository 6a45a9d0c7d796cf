"""GraphedDrafter's static draft steps (run eagerly here; on CUDA each replays a captured graph) under the in-flight
scheduler: requests joining a running batch (spare rows, or the next bucket), leaving (compaction in place) and
aborted, ragged lengths and block sizes. Every request gets the plain target's greedy tokens, and the drafter
drafts exactly what the plain PyTorch drafter drafts for it at every step; a wrong row after a leave or a join
changes those drafts. The static draft forward reads no tensor on the host when the attention is the kernels' op.

The drafter's own drafts are random (random weights), so the runs replace them, after recording them, with a
request's reference tokens partly corrupted (as scheduler_oracle does): acceptance, and with it how many context
rows each row brings to the next draft, is then long and ragged.
"""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads
from joining_run import ABORT, ORDER, budget, context_sensitive, run_joining

from dflash_trt.decoding.model.graphs.drafter import DraftStep, GraphedDrafter, StaticDraftCache
from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier
from dflash_trt.testing import make_tiny_drafter, tiny_target_config


@pytest.fixture(scope="module", params=["dflash", "dflash2", "sliding"])
def plain_run(pair, request):
    """The pair with a drafter of the family (sliding: DFlash with sliding-window layers, whose static cache keeps
    window - 1 rows), and the plain PyTorch drafter's run (the reference)."""
    target = pair[0]
    family, window = ("dflash", 6) if request.param == "sliding" else (request.param, None)
    drafter = make_tiny_drafter(target.config, block_size=8, family=family, sliding_window=window, seed=4)
    context_sensitive(drafter)
    with pytest.MonkeyPatch.context() as monkeypatch:
        run = run_joining(pair, target, drafter, monkeypatch)
    return drafter, run


def test_the_graphed_drafter_drafts_what_the_plain_drafter_drafts_as_requests_join_and_leave(pair, plain_run,
                                                                                           monkeypatch):
    target, _, _, references = pair
    drafter, plain = plain_run
    graphed = run_joining(pair, target, GraphedDrafter(drafter, graphs=False), monkeypatch)
    for i in ORDER:  # the plain target's greedy tokens (the aborted request: a prefix of them)
        assert graphed["tokens"][i] == references[i][:len(graphed["tokens"][i])], f"prompt {i}"
        assert len(graphed["tokens"][i]) == budget(i) or (i == ABORT[1] and graphed["finish"][i] == "cancelled")
    assert graphed["finish"][ABORT[1]] == "cancelled" and 1 < len(graphed["tokens"][ABORT[1]]) < budget(ABORT[1])
    assert graphed["tokens"] == plain["tokens"] and graphed["finish"] == plain["finish"]
    assert graphed["acceptance"] == plain["acceptance"]
    assert graphed["drafts"] == plain["drafts"]  # every request's drafts at every step
    accepted = [n for i in ORDER for n in graphed["acceptance"].get(i, [])]
    assert max(accepted) == 8 and len(set(accepted)) >= 5  # long and ragged acceptance

    caches = graphed["caches"]
    sizes = {size for size, *_ in caches}
    assert max(sizes) == 5 and 1 in sizes  # joined up to 5 rows, left down to 1
    keys = {key for _, _, steps, *_ in caches for key in steps}
    assert any(bucket > size for size, _, steps, *_ in caches for bucket, _ in steps)  # padded batches ran static
    assert {width for _, width in keys} > {8}  # and blocks narrower than the drafter's
    # the buffers stayed put through some joins and leaves, and moved for others (the bucket of 8, memory back)
    changes = [(a[0], b[0], a[3] == b[3]) for a, b in zip(caches, caches[1:]) if a[0] != b[0]]
    assert any(kept and new > old for old, new, kept in changes)  # a join into spare rows
    assert any(kept and new < old for old, new, kept in changes)  # a leave compacted in place
    assert any(not kept for _, _, kept in changes)


def test_a_leave_that_does_not_move_the_rows_changes_the_drafts(pair, plain_run, monkeypatch):
    target, _, _, _ = pair
    drafter, plain = plain_run

    @torch.inference_mode()
    def lens_only(self, indices):  # the lengths follow the rows, their keys and values stay where they were
        kept = self.all_lens[torch.as_tensor(indices)]
        self.all_lens.zero_()
        self.all_lens[:len(kept)] = kept
        self.size = len(kept)

    monkeypatch.setattr(StaticDraftCache, "select", lens_only)
    wrong = run_joining(pair, target, GraphedDrafter(drafter, graphs=False), monkeypatch)
    assert wrong["drafts"] != plain["drafts"]


def test_a_join_that_loses_the_newcomers_values_changes_the_drafts(pair, plain_run, monkeypatch):
    target, _, _, _ = pair
    drafter, plain = plain_run
    concat = StaticDraftCache.concat

    @torch.inference_mode()
    def without_values(self, other):  # the keys and lengths arrive, the values are zeros
        for buffer in other.v:
            buffer.zero_()
        concat(self, other)

    monkeypatch.setattr(StaticDraftCache, "concat", without_values)
    wrong = run_joining(pair, target, GraphedDrafter(drafter, graphs=False), monkeypatch)
    assert wrong["drafts"] != plain["drafts"]


def test_with_the_static_verify_too_the_tokens_and_drafts_are_the_same(pair, plain_run, monkeypatch):
    target, _, _, _ = pair
    drafter, plain = plain_run
    both = run_joining(pair, GraphedVerifier(target, graphs=False), GraphedDrafter(drafter, graphs=False),
                       monkeypatch)
    assert both["tokens"] == plain["tokens"] and both["drafts"] == plain["drafts"]


def test_a_static_draft_step_reads_no_tensor_on_the_host_with_the_kernels_op(monkeypatch):
    """What a CUDA graph captures: the drafter's forward over a DraftStep, with the attention the op the CUDA
    kernels implement (here its C++ CPU twin). PyTorch's reference attention does read lengths on the host."""
    from dflash_trt.decoding.kernels import attention
    from dflash_trt.decoding.kernels.plugin import torch_op
    from dflash_trt.decoding.kernels.plugin.library import load_library

    load_library()
    drafter = make_tiny_drafter(tiny_target_config("llama", hidden_size=256), block_size=8, num_layers=2, seed=4)
    config = drafter.config
    cache = StaticDraftCache(config, 3, 32, torch.float32, "cpu")
    cache.lens = torch.tensor([5, 0, 9])
    step = DraftStep(config, cache, 4, 8)
    features = torch.randn(3, 6, config.num_target_features * config.hidden_size)
    step.load(torch.randn(3, 8, config.hidden_size), features, torch.tensor([6, 2, 1]))

    def reads(backend) -> list[str]:
        monkeypatch.setattr(attention, "_cuda_backend", backend)
        with torch.inference_mode(), HostReads() as seen:
            step.run(drafter, cache)
        return seen.seen

    op = (torch_op.draft_attention_inplace, attention._fields(drafter.rope, 4, 2, config.head_dim))
    assert reads(lambda q, k, rope: op) == []
    assert {"__int__", "__index__"} & set(reads(lambda q, k, rope: None))  # PyTorch's reference attention
