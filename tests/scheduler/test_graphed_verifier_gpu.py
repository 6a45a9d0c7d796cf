"""GraphedVerifier on CUDA: the captured and replayed verify gives the eager static verify's logits, and decoding
with rows joining and leaving through replayed graphs emits Hugging Face's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model(arch: str):
    if arch == "qwen3-sliding":
        model = make_tiny_target("qwen3", seed=3, use_sliding_window=True, sliding_window=8,
                                 layer_types=["sliding_attention", "full_attention"] * 3)
    else:
        model = make_tiny_target(arch, seed=3)
    return model.to("cuda")


@pytest.mark.parametrize("arch", ["llama", "qwen3-sliding"])
def test_a_replayed_verify_gives_the_eager_static_verifys_logits(arch):
    target = TargetModel(_model(arch))
    graphed, eager = GraphedVerifier(target), GraphedVerifier(target, graphs=False)
    assert graphed.use_graphs
    lengths = torch.tensor([5, 12, 9], device="cuda")
    tokens = torch.randint(0, 250, (3, 12), device="cuda")
    mask = torch.arange(12, device="cuda")[None, :] >= (12 - lengths)[:, None]
    positions = (torch.cumsum(mask.long(), dim=1) - 1).clamp(min=0)
    prefill = target.new_cache()
    target.forward(tokens, positions, mask.long(), prefill, last_only=True)
    cache = graphed.batch_cache(prefill, lengths, 64)
    block = torch.randint(0, 250, (3, 4), device="cuda")
    block_positions = lengths[:, None] + torch.arange(4, device="cuda")[None, :]
    outputs = []
    for verifier in (eager, graphed, graphed, graphed):  # eager; then capture + replay; then replays
        cache.prepare(4)
        outputs.append(verifier.forward(block, block_positions, None, cache, (1, 4)))
    assert sum(f.graph is not None for f in cache.forwards.values()) == 1
    for out in outputs[1:]:
        torch.testing.assert_close(out.logits, outputs[0].logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.features, outputs[0].features, rtol=1e-5, atol=1e-5)
    # a replay reads the inputs of its call: another block at other positions gives other logits
    cache.set_lengths(lengths + 2)
    cache.prepare(4)
    moved = graphed.forward(block.flip(1), block_positions + 2, None, cache, (1, 4))
    cache.prepare(4)
    expected = eager.forward(block.flip(1), block_positions + 2, None, cache, (1, 4))
    torch.testing.assert_close(moved.logits, expected.logits, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(moved.logits, outputs[0].logits)


@pytest.mark.parametrize("arch", ["llama", "qwen3-sliding"])
def test_decoding_through_replayed_graphs_with_rows_joining_and_leaving_emits_greedy_tokens(arch, monkeypatch):
    monkeypatch.setenv("DFLASH_DRAFT_ATTENTION", "torch")  # the drafts only change acceptance, never the tokens
    model = _model(arch)
    verifier = GraphedVerifier(TargetModel(model))
    drafter = make_tiny_drafter(model.config, block_size=4).to("cuda")
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in (1, 13, 4, 21, 9)]
    budgets = [16 - 3 * (i % 3) for i in range(len(prompts))]
    with torch.no_grad():
        references = [model.generate(torch.tensor([p], device="cuda"), max_new_tokens=n, do_sample=False,
                                     min_new_tokens=n)[0, len(p):].tolist() for p, n in zip(prompts, budgets)]
    scheduler = Scheduler(verifier, drafter, 4, SchedulerLimits(max_batch_size=4, prefill_chunk_tokens=16),
                          FixedBlockSize(4))
    arrivals, tokens, replays, step = {0: [0, 1], 2: [2], 4: [3, 4]}, {}, 0, 0
    while step <= max(arrivals) or scheduler.has_unfinished:
        for i in arrivals.get(step, []):
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=budgets[i]), request_id=i)
        for out in scheduler.step():
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
        if scheduler.running is not None:
            replays = max(replays, sum(f.graph is not None for f in scheduler.running.cache.forwards.values()))
        step += 1
        assert step < 300
    assert replays > 0
    assert [tokens[i] for i in range(len(prompts))] == references


@pytest.mark.parametrize("arch", ["llama", "qwen3-sliding"])
def test_trees_through_replayed_graphs_give_plain_tokens(arch, monkeypatch):
    """Tree verifies captured per node bucket and replayed: plain greedy tokens, the eager static tree's steps."""
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.model.graphs.static_kv_cache import StaticTreeForward
    from dflash_trt.decoding.step.verify import TreeVerify

    model = _model(arch)
    target = TargetModel(model)
    drafter = make_tiny_drafter(model.config, block_size=8).to("cuda")
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in (3, 17, 9)]
    params = [SamplingParams(max_new_tokens=n) for n in (40, 33, 25)]
    plain = generate(target, None, prompts, params, block_size=1)
    forwards = []
    load_tree = StaticTreeForward.load_tree

    def recording(forward, *args):
        forwards.append(forward)
        load_tree(forward, *args)

    monkeypatch.setattr(StaticTreeForward, "load_tree", recording)
    graphed = generate(GraphedVerifier(target), drafter, prompts, params, method=TreeVerify(12, 4))
    eager = generate(GraphedVerifier(target, graphs=False), drafter, prompts, params, method=TreeVerify(12, 4))
    assert [r.token_ids for r in graphed] == [r.token_ids for r in plain] == [r.token_ids for r in eager]
    assert [r.acceptance_lengths for r in graphed] == [r.acceptance_lengths for r in eager]
    assert any(forward.graph is not None for forward in forwards), "no tree verify was captured"
