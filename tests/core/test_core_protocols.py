"""Every runtime's classes implement the contracts the decoding step relies on (decoding/model/protocols.py)."""

from __future__ import annotations

import pytest
import torch

from dflash_trt.decoding.model.context_cache import ContextCache
from dflash_trt.decoding.model.exported.onnx import OnnxDrafter
from dflash_trt.decoding.model.exported.tensorrt import TensorRTDrafter
from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter, StaticDraftCache
from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier
from dflash_trt.decoding.model.protocols import DraftCache, Drafter, Target
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.testing import make_tiny_drafter, make_tiny_target


@pytest.fixture(scope="module")
def pair():
    model = make_tiny_target("qwen3", seed=2)
    return TargetModel(model), model.config


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_torch_drafters_and_their_caches_implement_the_protocols(pair, family):
    target, config = pair
    drafter = make_tiny_drafter(config, block_size=4, family=family)
    for runtime_drafter in (drafter, GraphedDrafter(drafter, graphs=False)):
        assert isinstance(runtime_drafter, Drafter)
        cache = runtime_drafter.new_cache(2, 16)
        assert isinstance(cache, DraftCache)
        assert runtime_drafter.static_block_size is None


def test_targets_implement_the_protocol(pair):
    target, _ = pair
    assert isinstance(target, Target)
    assert isinstance(GraphedVerifier(target, graphs=False), Target)


@pytest.mark.parametrize("cls", [OnnxDrafter, TensorRTDrafter])
def test_exported_drafters_offer_every_member_of_the_protocol(cls):
    # Building one needs an exported graph (tests/plugin run them); the members are the class's own.
    for name in ("config", "samples_drafts", "static_block_size", "new_cache", "propose"):
        assert hasattr(cls, name), name


def test_the_caches_are_draft_caches():
    config = make_tiny_drafter(make_tiny_target("llama").config, block_size=4).config
    assert isinstance(ContextCache(config, 2, 8, torch.float32), DraftCache)
    assert isinstance(StaticDraftCache(config, 2, 8, torch.float32, "cpu"), DraftCache)


def test_a_class_missing_a_member_is_not_a_drafter(pair):
    class NoCache:
        config, samples_drafts, static_block_size = None, False, None

        def propose(self, *args, **kwargs):
            return None

    assert not isinstance(NoCache(), Drafter)
