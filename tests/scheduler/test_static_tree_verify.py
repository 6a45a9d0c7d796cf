"""Trees on the static (CUDA-graph) verify path, run eagerly (GraphedVerifier(graphs=False), as on CPU): a tree's
width is padded to a bucket of node counts, its ancestor mask and depth-based positions are inputs of the static
forward, and the accepted path's keys and values are moved into place. Greedy tokens equal plain decoding, and the
tokens and acceptance lengths equal the eager tree's (padding changes nothing), for every target family, with
requests joining and leaving; a pad mask that lets nodes see the padding, or keys written at the nodes' positions
instead of their slots, change the tokens.
"""

from __future__ import annotations

import pytest
import torch
from test_tree_verify import BLOCK, assert_plain_tokens, family_data, near_miss_oracle, run

from dflash_trt.decoding.model.drafters import load_drafter
from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter
from dflash_trt.decoding.model.graphs.static_kv_cache import StaticTreeForward, tree_nodes_bucket
from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier
from dflash_trt.decoding.step.verify import TreeVerify
from dflash_trt.testing import make_tiny_drafter


class Widths:
    """Records each static tree forward's width and whether some row of it was padded beyond its tree."""

    def __init__(self, monkeypatch):
        self.widths: set[int] = set()
        self.padded = False
        load_tree = StaticTreeForward.load_tree

        def recording(forward, token_ids, position_ids, lengths, block_mask):
            self.widths.add(token_ids.shape[1])
            # A node sees the root; a padding slot sees only itself.
            self.padded |= bool((~block_mask[:, 1:, 0]).any())
            load_tree(forward, token_ids, position_ids, lengths, block_mask)

        monkeypatch.setattr(StaticTreeForward, "load_tree", recording)


def test_node_buckets_are_powers_of_two_up_to_the_budget():
    assert [tree_nodes_bucket(n, 16) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    assert [tree_nodes_bucket(n, 12) for n in (5, 9, 12)] == [8, 12, 12]  # never beyond the budget
    assert tree_nodes_bucket(7, 64) == 8


@pytest.mark.parametrize("name", ["llama", "qwen3-sliding", "gpt_oss"])
@pytest.mark.parametrize("budget, top_k", [(12, None), (64, 1)])  # 64 / 1: 7 nodes padded to 8
def test_static_trees_give_plain_tokens_and_the_eager_trees_steps(name, budget, top_k, monkeypatch):
    name, target, prompts, references = family_data(name)
    eager = run(target, near_miss_oracle(target, prompts, references), prompts, TreeVerify(budget, top_k))
    widths = Widths(monkeypatch)
    static = run(GraphedVerifier(target, graphs=False), near_miss_oracle(target, prompts, references), prompts,
                 TreeVerify(budget, top_k))
    assert_plain_tokens(static, references)
    assert [r.acceptance_lengths for r in static] == [r.acceptance_lengths for r in eager]
    assert widths.padded, "the run should pad some tree beyond its nodes"
    assert {w - 1 for w in widths.widths} <= {1, 2, 4, 8, budget}


def test_graphed_drafters_give_plain_tokens_with_a_static_tree(tmp_path):
    """The real drafters' own top-K through GraphedDrafter (DFlash marginals; DFlash2's lattice)."""
    _, target, prompts, references = family_data("llama")
    for kind, settings in [("dflash", {}), ("dflash2", {"family": "dflash2"})]:
        make_tiny_drafter(target.config, directory=tmp_path / kind, block_size=BLOCK, **settings)
        drafter = GraphedDrafter(load_drafter(tmp_path / kind), graphs=False)
        results = run(GraphedVerifier(target, graphs=False), drafter, prompts, TreeVerify(16, 4))
        assert_plain_tokens(results, references)


# -- broken on purpose: each must change the tokens -----------------------------------------------------------------
def _padding_seen(forward, token_ids, position_ids, lengths, block_mask):
    """Every node also sees the padding slots (which hold the anchor at the root's position)."""
    _load_tree(forward, token_ids, position_ids, lengths, block_mask)
    n = token_ids.shape[0]
    padding = ~forward.block_mask[:n, :, 0]  # [n, q]: slots that do not see the root
    forward.block_mask[:n] |= padding[:, None, :]


def _written_at_positions(forward, cache):
    forward.refresh_masks()
    cache.begin_static_forward(forward.positions)  # siblings share a position: they overwrite each other's keys
    masks = forward.masks if forward.spec.as_mapping else forward.masks["full_attention"]
    return forward.target.run_model(forward.tokens, forward.positions, masks, cache, forward.layer_ids)


_load_tree = StaticTreeForward.load_tree


@pytest.mark.parametrize("attribute, broken, method", [
    ("load_tree", _padding_seen, TreeVerify(64, 1)),  # 7 nodes padded to 8 at every step
    ("run", _written_at_positions, TreeVerify(12))])  # siblings at every depth
def test_a_broken_static_tree_changes_the_tokens(attribute, broken, method, monkeypatch):
    _, target, prompts, references = family_data("llama")
    monkeypatch.setattr(StaticTreeForward, attribute, broken)
    results = run(GraphedVerifier(target, graphs=False), near_miss_oracle(target, prompts, references), prompts,
                  method)
    assert [r.token_ids for r in results] != references


def test_the_static_tree_verify_matches_the_eager_logits():
    """One tree verify of a two-row batch on both caches: the same logits at every real slot."""
    _, target, prompts, references = family_data("qwen3-sliding")
    from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
    from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
    from dflash_trt.decoding.step.sampling import SamplingParams

    logits = {}
    for name, verifier in [("eager", target), ("static", GraphedVerifier(target, graphs=False))]:
        oracle = near_miss_oracle(target, prompts, references)
        scheduler = Scheduler(verifier, oracle, BLOCK, SchedulerLimits(max_batch_size=2), FixedBlockSize(BLOCK),
                              TreeVerify(12))  # pinned: an adaptive policy's plans follow measured times
        captured = []
        forward = type(verifier).forward

        def spy(self, *args, **kwargs):
            out = forward(self, *args, **kwargs)
            captured.append(out.logits)
            return out

        for i in (1, 2):
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=12), request_id=i)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(verifier), "forward", spy)
            while scheduler.has_unfinished:
                scheduler.step()
        logits[name] = captured
    assert len(logits["eager"]) == len(logits["static"])
    for eager, static in zip(logits["eager"], logits["static"]):
        width = eager.shape[1]
        torch.testing.assert_close(static[:, :width], eager, rtol=1e-5, atol=1e-5)
