"""A drafter's linear layers as Q8_0 blocks beside a GGUF-precision target (model/drafters/int8_weights.py): the
layers compute what the float ones do up to int8 rounding, and `--drafter-weights` applies where it should.

That decoding stays lossless with such a drafter is tested with the GGUF-precision target
(test_core_block_quant.py: the tiny pair at every block size, and the demo pair).
"""

import pytest
import torch

from dflash_trt.decoding.kernels.block_quant import BlockQuantLinear
from dflash_trt.decoding.model.drafters.int8_weights import apply_drafter_weights, quantize_linear_layers
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.errors import ConfigError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

# Q8_0 weights (|error| <= scale / 2 per block) times int8 activations: relative to the largest output.
TOLERANCE = 2 ** -5


def test_int8_layers_compute_the_float_layers():
    model = make_tiny_target("llama")
    drafter = make_tiny_drafter(model.config, block_size=4)
    floats = {name: module.weight.detach().clone() for name, module in drafter.named_modules()
              if isinstance(module, torch.nn.Linear)}
    assert quantize_linear_layers(drafter) == len(floats)
    generator = torch.Generator().manual_seed(0)
    for name, module in drafter.named_modules():
        if name in floats:
            assert isinstance(module, BlockQuantLinear)
            x = torch.randn(5, module.in_features, generator=generator)
            expected = x @ floats[name].T
            assert (module(x) - expected).abs().max() <= TOLERANCE * expected.abs().max(), name


def test_drafter_weights_follow_the_target():
    model = make_tiny_target("llama")
    target = TargetModel(model)
    drafter = make_tiny_drafter(model.config, block_size=4)
    assert not apply_drafter_weights("auto", target, drafter)  # a float target keeps a float drafter
    target.weights = "gguf"
    assert not apply_drafter_weights("float", target, drafter)
    assert not apply_drafter_weights("auto", target, None)
    assert apply_drafter_weights("auto", target, drafter)
    assert isinstance(drafter.layers[0].mlp.down_proj, BlockQuantLinear)
    assert drafter.native_layers is not None  # and its layers run as one native call (native_layers.py)
    with pytest.raises(ConfigError, match="one of"):
        apply_drafter_weights("int4", target, drafter)
