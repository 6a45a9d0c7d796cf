"""The KV cache's seam for verification methods other than the chain: an explicit mask over the new tokens, their
own positions, and keeping arbitrary new slots at commit.

A small tree is verified in one forward: anchor a, its children x and y (siblings at the same depth), and z, the
child of y. Each node must see exactly what a chain forward along its own path sees (its ancestors, measured by
position on sliding layers), and after keeping the path a -> y -> z the cache must continue exactly as the chain's.
"""

from __future__ import annotations

import pytest
import torch

from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.verify import ChainVerify, verify_method
from dflash_trt.errors import DFlashError
from dflash_trt.testing import make_tiny_target

PROMPT = [5, 17, 3, 42, 8, 11, 29]
A, X, Y, Z, W, U, NEXT = 7, 19, 23, 31, 13, 37, 2
# Slots of the new tokens: 0 = a, 1 = x, 2 = y, 3 = z, 4 = w, 5 = u. Depths give positions; ancestors the mask.
TREE = [A, X, Y, Z, W, U]
DEPTHS = [0, 1, 1, 2, 3, 4]
ANCESTORS = [[0], [0, 1], [0, 2], [0, 2, 3], [0, 2, 3, 4], [0, 2, 3, 4, 5]]


def target_for(arch: str) -> TargetModel:
    if arch == "qwen3-sliding":  # window 3: by slot index, u would still see y (2 slots away, 3 positions)
        return TargetModel(make_tiny_target("qwen3", seed=3, use_sliding_window=True, sliding_window=3,
                                            layer_types=["sliding_attention", "full_attention"] * 3))
    return TargetModel(make_tiny_target(arch, seed=3))


@pytest.fixture(scope="module", params=["llama", "qwen3-sliding", "gpt_oss"])
def target(request):
    return target_for(request.param)


def prefilled(target: TargetModel, prompt: list[int]):
    cache = target.new_cache()
    tokens = torch.tensor([prompt])
    target.forward(tokens, torch.arange(len(prompt))[None], torch.ones_like(tokens), cache, last_only=True)
    return target.batch_cache(cache, torch.tensor([len(prompt)]), 64)


def chain_logits(target: TargetModel, path: list[int]) -> torch.Tensor:
    """Logits [len(path), V] of a chain forward of `path` after the prompt."""
    cache = prefilled(target, PROMPT)
    positions = len(PROMPT) + torch.arange(len(path))[None]
    return target.forward(torch.tensor([path]), positions, cache.prepare(len(path)), cache).logits[0]


def ancestor_mask(ancestors: list[list[int]]) -> torch.Tensor:
    mask = torch.zeros(1, len(ancestors), len(ancestors), dtype=torch.bool)
    for node, seen in enumerate(ancestors):
        mask[0, node, seen] = True
    return mask


def tree_forward(target: TargetModel, ancestors=ANCESTORS, depths=DEPTHS):
    cache = prefilled(target, PROMPT)
    positions = len(PROMPT) + torch.tensor([depths])
    masks = cache.prepare(len(TREE), positions, ancestor_mask(ancestors))
    return cache, target.forward(torch.tensor([TREE]), positions, masks, cache).logits[0]


def test_every_tree_node_sees_what_the_chain_along_its_path_sees(target):
    _, logits = tree_forward(target)
    along_y = chain_logits(target, [A, Y, Z, W, U])
    along_x = chain_logits(target, [A, X])
    torch.testing.assert_close(logits[[0, 2, 3, 4, 5]], along_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1], along_x[1], rtol=1e-5, atol=1e-5)


def test_keeping_a_path_continues_like_the_chain_that_took_it(target):
    cache, _ = tree_forward(target)
    cache.keep(torch.tensor([3]), torch.tensor([[0, 2, 3]]))
    assert cache.lengths.tolist() == [len(PROMPT) + 3]
    position = torch.tensor([[len(PROMPT) + 3]])
    after_tree = target.forward(torch.tensor([[NEXT]]), position, cache.prepare(1), cache).logits
    chain = prefilled(target, PROMPT)
    target.forward(torch.tensor([[A, Y, Z]]), len(PROMPT) + torch.arange(3)[None], chain.prepare(3), chain)
    chain.set_lengths(chain.lengths + 3)
    after_chain = target.forward(torch.tensor([[NEXT]]), position, chain.prepare(1), chain).logits
    torch.testing.assert_close(after_tree, after_chain, rtol=1e-5, atol=1e-5)


def test_an_explicit_causal_mask_equals_the_chain_masks():
    target = target_for("qwen3-sliding")
    cache = prefilled(target, PROMPT)
    chain = cache.prepare(4)
    explicit = cache.prepare(4, len(PROMPT) + torch.arange(4)[None], torch.ones(1, 4, 4, dtype=torch.bool).tril())
    assert chain.keys() == explicit.keys()
    for kind in chain:
        assert torch.equal(chain[kind], explicit[kind]), kind


# The checks above fail when the seam is broken: a sibling in the mask, positions by slot, a wrong compaction.
def test_a_node_that_sees_its_sibling_changes_its_logits():
    target = target_for("llama")
    _, logits = tree_forward(target, ancestors=[[0], [0, 1], [0, 1, 2]] + ANCESTORS[3:])
    assert not torch.allclose(logits[2], chain_logits(target, [A, Y])[1], atol=1e-4)


def test_positions_by_slot_change_a_deep_nodes_logits_on_a_sliding_target():
    target = target_for("qwen3-sliding")
    _, logits = tree_forward(target, depths=list(range(len(TREE))))
    assert not torch.allclose(logits[5], chain_logits(target, [A, Y, Z, W, U])[4], atol=1e-4)


def test_keeping_the_wrong_slots_changes_what_follows():
    target = target_for("llama")
    cache, _ = tree_forward(target)
    cache.keep(torch.tensor([3]), torch.tensor([[0, 1, 3]]))
    position = torch.tensor([[len(PROMPT) + 3]])
    wrong = target.forward(torch.tensor([[NEXT]]), position, cache.prepare(1), cache).logits
    right_cache, _ = tree_forward(target)
    right_cache.keep(torch.tensor([3]), torch.tensor([[0, 2, 3]]))
    right = target.forward(torch.tensor([[NEXT]]), position, right_cache.prepare(1), right_cache).logits
    assert not torch.allclose(wrong, right, atol=1e-4)


def test_methods_are_found_by_name_and_an_unknown_one_is_refused():
    assert isinstance(verify_method("chain"), ChainVerify)
    with pytest.raises(DFlashError, match="unknown verification method 'beam'"):
        verify_method("beam")
