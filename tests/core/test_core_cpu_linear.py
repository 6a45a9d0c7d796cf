"""Prepacked CPU linear layers: same results as nn.Linear, safe under autograd and weight changes."""

import copy

import pytest
import torch
from torch import nn

from dflash_trt.decoding.kernels.cpu_linear import (BF16Head, PackedLinear, bf16_packing_available, pack_linear_layers,
                                                    packing_available)
from dflash_trt.testing import make_tiny_target

pytestmark = pytest.mark.skipif(not packing_available(), reason="this PyTorch build has no oneDNN packing")


def _linear(bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(96, 160, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (8, 96), (2, 8, 96), (3, 1, 5, 96)])
def test_packed_matches_linear(bias, shape):
    plain = _linear(bias)
    packed = PackedLinear.from_linear(plain)
    x = torch.randn(*shape)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    assert packed._packed is not None  # the packed path was available, so it is what ran


def test_parameters_are_shared_and_state_dict_unchanged():
    plain = _linear()
    packed = PackedLinear.from_linear(plain)
    assert packed.weight is plain.weight and packed.bias is plain.bias
    assert packed.state_dict().keys() == plain.state_dict().keys()


def test_in_place_weight_change_is_followed():
    plain = _linear()
    packed = PackedLinear.from_linear(plain)
    x = torch.randn(4, 96)
    with torch.no_grad():
        plain.weight.mul_(2.0)  # the packed copy is now stale: forward must notice
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    packed.repack()
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)


def test_autograd_takes_the_ordinary_path():
    packed = PackedLinear.from_linear(_linear())
    x = torch.randn(3, 96, requires_grad=True)
    packed(x).sum().backward()
    assert x.grad is not None and packed.weight.grad is not None
    torch.testing.assert_close(x.grad, packed.weight.sum(0).expand(3, -1).detach())


def test_deepcopy_and_dtype_change():
    packed = PackedLinear.from_linear(_linear())
    clone = copy.deepcopy(packed)
    assert clone.weight is not packed.weight
    x = torch.randn(2, 96)
    with torch.inference_mode():
        torch.testing.assert_close(clone(x), packed(x))
        half = clone.to(torch.bfloat16)  # not packable: falls back to F.linear in bf16
        assert half._packed is None
        assert half(x.bfloat16()).dtype == torch.bfloat16


def test_pack_linear_layers_replaces_every_linear_and_keeps_outputs():
    model = make_tiny_target("llama", seed=3)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    ids = torch.randint(0, 250, (2, 11))
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    assert pack_linear_layers(model) == linears
    assert all(isinstance(m, PackedLinear) for m in model.modules() if isinstance(m, nn.Linear))
    assert pack_linear_layers(model) == 0  # idempotent
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not bf16_packing_available(), reason="no native bf16 on this CPU")
def test_bf16_draft_head_picks_the_same_tokens_almost_always():
    torch.manual_seed(0)
    weight = torch.randn(4096, 96)
    hidden = torch.randn(64, 96)
    exact = (hidden @ weight.T).argmax(-1)
    drafted = BF16Head(weight)(hidden[None]).float().argmax(-1)[0]
    assert drafted.dtype == torch.long and (drafted == exact).float().mean() > 0.9


def test_bf16_draft_head_only_where_it_applies():
    from dflash_trt.decoding.model.target import TargetModel

    target = TargetModel(make_tiny_target("llama").to(torch.bfloat16))
    assert target.use_bf16_draft_head() is False  # already low precision: nothing to gain
    hidden = torch.randn(1, 3, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(target.draft_logits(hidden), target.lm_head(hidden))
