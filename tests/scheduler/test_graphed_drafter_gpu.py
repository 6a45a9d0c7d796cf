"""GraphedDrafter on CUDA: a replayed draft step gives the eager static step's states and appends the same context,
and decoding through replayed draft and verify graphs, with requests joining, leaving and aborted, emits the plain
target's greedy tokens with the acceptance of the eager static drafter."""

from __future__ import annotations

import pytest
import torch
from conftest import MAX_NEW_TOKENS
from joining_run import ORDER, context_sensitive, run_joining

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter
from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_pair():
    """conftest's pair at head_dim 64 (a size the CUDA kernels cover), on CUDA: (target, drafter, prompts,
    the plain target's greedy tokens)."""
    model = make_tiny_target("llama", seed=1, hidden_size=256).to("cuda")
    target = TargetModel(model)
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in (1, 3, 40, 7, 2, 25, 11, 5, 33)]
    plain = SamplingParams(max_new_tokens=MAX_NEW_TOKENS)
    references = [generate(target, None, [p], plain, block_size=1)[0].token_ids for p in prompts]
    drafter = context_sensitive(make_tiny_drafter(model.config, block_size=8, seed=4)).to("cuda")
    return target, drafter, prompts, references


def test_a_replayed_draft_step_gives_the_eager_static_steps_states_and_cache(cuda_pair):
    target, drafter, _, _ = cuda_pair
    graphed, eager = GraphedDrafter(drafter), GraphedDrafter(drafter, graphs=False)
    assert graphed.use_graphs and graphed.blockers == []
    config = drafter.config
    cache = graphed.new_cache(3, 64)
    start = torch.tensor([5, 0, 9], device="cuda")
    embeds = torch.randn(3, 8, config.hidden_size, device="cuda")
    features = torch.randn(3, 6, config.num_target_features * config.hidden_size, device="cuda")
    ctx_lens = torch.tensor([6, 2, 1], device="cuda")
    outputs, caches = [], []
    for drafter_of_step in (eager, graphed, graphed, graphed):  # eager; then capture + replay; then replays
        cache.lens = start
        outputs.append(drafter_of_step(embeds, features, ctx_lens, cache))
        caches.append([t.clone() for t in cache.k + cache.v])
        assert cache.lens.tolist() == [11, 2, 10]
    assert [step.graph is not None for step in cache.steps.values()] == [True]
    for out, contents in zip(outputs[1:], caches[1:]):
        torch.testing.assert_close(out, outputs[0], rtol=1e-5, atol=1e-5)
        for ours, theirs in zip(contents, caches[0]):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    # a replay reads the inputs of its call: other context rows give other states
    cache.lens = start
    moved = graphed(embeds, features.flip(1), ctx_lens, cache)
    cache.lens = start
    expected = eager(embeds, features.flip(1), ctx_lens, cache)
    torch.testing.assert_close(moved, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(moved, outputs[0])


def test_decoding_through_replayed_draft_graphs_with_requests_joining_and_leaving(cuda_pair, monkeypatch):
    target, drafter, _, references = cuda_pair
    graphed = run_joining(cuda_pair, GraphedVerifier(target), GraphedDrafter(drafter), monkeypatch)
    static = run_joining(cuda_pair, GraphedVerifier(target), GraphedDrafter(drafter, graphs=False), monkeypatch)
    assert max(graphs for *_, graphs in graphed["caches"]) > 0  # draft steps replayed captured graphs
    assert max(graphs for *_, graphs in static["caches"]) == 0
    for i in ORDER:
        assert graphed["tokens"][i] == references[i][:len(graphed["tokens"][i])], f"prompt {i}"
    assert graphed["tokens"] == static["tokens"] and graphed["acceptance"] == static["acceptance"]
    # The drafts themselves: a captured matmul may run other kernels than the eager one (last-bit differences),
    # so an argmax may flip where two logits nearly tie; a wrong row would change most of a request's drafts.
    pairs = [(a, b) for i in graphed["drafts"] for x, y in zip(graphed["drafts"][i], static["drafts"][i])
             for a, b in zip(x, y)]
    assert len(pairs) > 100 and sum(a == b for a, b in pairs) >= 0.98 * len(pairs)
